// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type harness struct {
	t    *testing.T
	s    *Supervisor
	stop func()

	mu     sync.Mutex
	events []Event
}

// runSupervisor runs a supervisor on cfg until stop, which waits for Run to return
// (at most 10 s) and may be called more than once.
func runSupervisor(t *testing.T, cfg Config) (s *Supervisor, stop func()) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	return s, func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("supervisor did not stop")
		}
	}
}

// fastConfig is a supervisor over the fake control program that notices and
// recovers within a test's patience.
func fastConfig(t *testing.T, root string, gpus ...string) Config {
	return Config{Control: self, Root: root, GPUs: gpus, Env: []string{fakeEnv + "=1"},
		Interval: 50 * time.Millisecond, Timeout: 2 * time.Second,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Log: testr.New(t)}
}

func start(t *testing.T, gpus ...string) *harness {
	t.Helper()
	return startWith(t, fastConfig(t, shortDir(t), gpus...))
}

// startWith runs a supervisor on cfg, recording its events.
func startWith(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t}
	cfg.OnEvent = func(e Event) {
		h.mu.Lock()
		h.events = append(h.events, e)
		h.mu.Unlock()
	}
	h.s, h.stop = runSupervisor(t, cfg)
	t.Cleanup(h.stop)
	return h
}

func (h *harness) status(gpu string) Status {
	for _, st := range h.s.Status() {
		if st.GPU == gpu {
			return st
		}
	}
	h.t.Fatalf("no status for %s", gpu)
	return Status{}
}

func (h *harness) eventsOf(kind EventKind) []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Event
	for _, e := range h.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// running is alive, not counting a zombie that no one has reaped yet.
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func (h *harness) touch(gpu, name, content string) {
	if err := os.WriteFile(filepath.Join(h.s.PipeDir(gpu), name), []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func TestStartsOneDaemonPerGPUAndQuitsOnStop(t *testing.T) {
	h := start(t, "GPU-a", "GPU-b")
	var pids []int
	for _, g := range []string{"GPU-a", "GPU-b"} {
		waitFor(t, g+" up", func() bool { return h.status(g).Up })
		st := h.status(g)
		if st.Adopted || !alive(st.PID) {
			t.Fatalf("%s: %+v", g, st)
		}
		if fi, err := os.Stat(st.PipeDir); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("pipe directory %s: %v %v", st.PipeDir, fi, err)
		}
		pids = append(pids, st.PID)
	}
	if pids[0] == pids[1] {
		t.Fatal("both GPUs share one daemon")
	}
	if !h.s.Serves("GPU-a") || h.s.Serves("GPU-c") {
		t.Error("Serves")
	}
	h.stop()
	for i, p := range pids {
		if alive(p) {
			t.Errorf("daemon %d still runs after stop", p)
		}
		g := []string{"GPU-a", "GPU-b"}[i]
		if _, err := os.Stat(filepath.Join(h.s.PipeDir(g), PidFile)); !os.IsNotExist(err) {
			t.Errorf("%s: the daemon did not quit cleanly (pid file left): %v", g, err)
		}
		if log, _ := os.ReadFile(filepath.Join(h.s.LogDir(g), "control.log")); !strings.Contains(string(log), "quit") {
			t.Errorf("%s: daemon was not sent quit: %q", g, log)
		}
	}
	if n := len(h.eventsOf(DaemonFailed)); n != 0 {
		t.Errorf("%d failure events for a clean run", n)
	}
}

func TestServerLostWithClientsIsReportedAndRecovered(t *testing.T) {
	h := start(t, "GPU-a")
	waitFor(t, "up", func() bool { return h.status("GPU-a").Up })
	h.touch("GPU-a", "fake-clients", "4242\n4343\n")
	var server int
	waitFor(t, "a server with clients", func() bool {
		for p, c := range h.status("GPU-a").Servers {
			if len(c) == 2 {
				server = p
				return true
			}
		}
		return false
	})
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ServerLost", func() bool { return len(h.eventsOf(ServerLost)) == 1 })
	e := h.eventsOf(ServerLost)[0]
	if e.ServerPID != server || len(e.Clients) != 2 || e.Clients[0] != 4242 || !strings.Contains(e.Message, "lost their CUDA contexts") {
		t.Errorf("event %+v", e)
	}
	// The daemon starts a new server for the waiting clients; the daemon itself was
	// never restarted.
	pid := h.status("GPU-a").PID
	waitFor(t, "a new server", func() bool {
		for p := range h.status("GPU-a").Servers {
			if p != server {
				return true
			}
		}
		return false
	})
	if st := h.status("GPU-a"); st.PID != pid || st.Restarts != 0 || st.ServerFailures != 1 {
		t.Errorf("status %+v", st)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.s)
	if n, err := testutil.GatherAndCount(reg, "tessera_mps_server_failures_total"); err != nil || n != 1 {
		t.Errorf("metric: %d %v", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP tessera_mps_server_failures_total MPS servers on the GPU that exited while they had clients.
# TYPE tessera_mps_server_failures_total counter
tessera_mps_server_failures_total{UUID="GPU-a"} 1
`), "tessera_mps_server_failures_total"); err != nil {
		t.Error(err)
	}
}

func TestIdleServerExitIsNoFailure(t *testing.T) {
	h := start(t, "GPU-a")
	waitFor(t, "up", func() bool { return h.status("GPU-a").Up })
	// A server with no clients (say, shut down by the daemon to switch users) going
	// away is normal.
	h.touch("GPU-a", "fake-clients", "\n \n")
	h.touch("GPU-a", "fake-clients", "1\n")
	var server int
	waitFor(t, "a server", func() bool {
		for p := range h.status("GPU-a").Servers {
			server = p
			return true
		}
		return false
	})
	h.touch("GPU-a", "fake-clients", "")
	waitFor(t, "no clients seen", func() bool { c, ok := h.status("GPU-a").Servers[server]; return ok && len(c) == 0 })
	_ = syscall.Kill(server, syscall.SIGKILL)
	waitFor(t, "server gone", func() bool { return len(h.status("GPU-a").Servers) == 0 })
	time.Sleep(100 * time.Millisecond)
	if n := len(h.eventsOf(ServerLost)); n != 0 {
		t.Errorf("%d ServerLost events for a server without clients", n)
	}
}

func TestCrashedDaemonIsRestarted(t *testing.T) {
	h := start(t, "GPU-a")
	waitFor(t, "up", func() bool { return h.status("GPU-a").Up })
	first := h.status("GPU-a").PID
	h.touch("GPU-a", "fake-clients", "4242\n")
	var server int
	waitFor(t, "a server", func() bool {
		for p := range h.status("GPU-a").Servers {
			server = p
			return true
		}
		return false
	})
	h.touch("GPU-a", "fake-crash", "")
	waitFor(t, "failure event", func() bool { return len(h.eventsOf(DaemonFailed)) >= 1 })
	if e := h.eventsOf(DaemonFailed)[0]; !strings.Contains(e.Message, "exit status 3") && !strings.Contains(e.Message, "is gone") {
		t.Errorf("failure event: %+v", e)
	}
	// The restart clears the dead daemon's files (its stale pid file and the crash
	// marker with them) before starting a new one.
	waitFor(t, "recovered", func() bool { return len(h.eventsOf(Recovered)) == 1 && h.status("GPU-a").Up })
	if st := h.status("GPU-a"); st.PID == first || !alive(st.PID) || st.Adopted {
		t.Errorf("status after restart: %+v (first pid %d)", st, first)
	}
	// The dead daemon's server was not left holding the GPU, and its loss was told
	// by the daemon's failure alone.
	waitFor(t, "the orphaned server gone", func() bool { return !running(server) })
	if n := len(h.eventsOf(ServerLost)); n != 0 {
		t.Errorf("%d ServerLost events beside the daemon's failure", n)
	}
}

func TestUnresponsiveDaemonIsKilledAndRestarted(t *testing.T) {
	h := start(t, "GPU-a")
	waitFor(t, "up", func() bool { return h.status("GPU-a").Up })
	first := h.status("GPU-a").PID
	h.touch("GPU-a", "fake-hang", "")
	waitFor(t, "failure event", func() bool { return len(h.eventsOf(DaemonFailed)) >= 1 })
	if e := h.eventsOf(DaemonFailed)[0]; !strings.Contains(e.Message, "stopped answering") {
		t.Errorf("failure event: %+v", e)
	}
	waitFor(t, "old daemon killed", func() bool { return !alive(first) })
	os.Remove(filepath.Join(h.s.PipeDir("GPU-a"), "fake-hang"))
	waitFor(t, "recovered", func() bool { return h.status("GPU-a").Up && len(h.eventsOf(Recovered)) == 1 })
}

// leftDaemon starts a fake control daemon for gpu under root, as an earlier agent
// process would have left it, and waits for its pid file. exited is closed when it
// ends.
func leftDaemon(t *testing.T, root, gpu string) (cmd *exec.Cmd, exited chan struct{}) {
	t.Helper()
	pipe, logDir := filepath.Join(root, gpu, "pipe"), filepath.Join(root, gpu, "log")
	for _, d := range []string{pipe, logDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd = exec.Command(os.Args[0], "-f")
	cmd.Env = append(os.Environ(), fakeEnv+"=1", "CUDA_VISIBLE_DEVICES="+gpu, "CUDA_MPS_PIPE_DIRECTORY="+pipe, "CUDA_MPS_LOG_DIRECTORY="+logDir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitFor(t, "pid file", func() bool { _, err := os.Stat(filepath.Join(pipe, PidFile)); return err == nil })
	return cmd, exited
}

func TestAdoptsARunningDaemon(t *testing.T) {
	root := shortDir(t)
	// A daemon left by an earlier agent process.
	cmd, exited := leftDaemon(t, root, "GPU-a")

	s, stop := runSupervisor(t, fastConfig(t, root, "GPU-a"))
	waitFor(t, "adopted", func() bool { st := s.Status()[0]; return st.Up && st.Adopted })
	if st := s.Status()[0]; st.PID != cmd.Process.Pid {
		t.Errorf("adopted pid %d, the running daemon is %d", st.PID, cmd.Process.Pid)
	}
	stop()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Error("the adopted daemon was not stopped")
	}
}

// The restart waits double from the least to the most, each up to 10% longer.
func TestRestartBackoff(t *testing.T) {
	b := restartBackoff(time.Second, time.Minute)
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60}
	jittered := false
	for i, w := range want {
		w *= time.Second
		got := b.Step()
		if got < w || got > w+w/10 {
			t.Errorf("wait %d: %v, want %v to %v", i+1, got, w, w+w/10)
		}
		jittered = jittered || got != w
	}
	if !jittered {
		t.Error("no wait was jittered")
	}
}

func TestMissingControlProgram(t *testing.T) {
	var mu sync.Mutex
	var events []Event
	s, err := New(Config{Control: "/nonexistent/nvidia-cuda-mps-control", Root: shortDir(t), GPUs: []string{"GPU-a"},
		Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Log: testr.New(t), OnEvent: func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_ = s.Run(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(events) < 2 || events[0].Kind != DaemonFailed || !strings.Contains(events[0].Message, "could not start") {
		t.Errorf("events %+v", events)
	}
	if st := s.Status()[0]; st.Up || st.Restarts < 2 {
		t.Errorf("status %+v", st)
	}
}

// shortDir is a temporary directory with a short path: a GPU's pipe directory under it
// must fit api.MaxMPSPipeDirBytes, which t.TempDir's paths (named after the test) may
// not.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func TestNewRejects(t *testing.T) {
	for _, c := range []Config{
		{Root: "/" + strings.Repeat("r", 60), GPUs: []string{"GPU-6a3c1f2e-8d7b-4c1a-9e5f-2b3c4d5e6f70"}},
		{Control: "relative/control", GPUs: []string{"GPU-a"}},
		{Root: "relative", GPUs: []string{"GPU-a"}},
		{GPUs: []string{"GPU-a", "GPU-a"}},
		{GPUs: []string{"../x"}},
		{GPUs: []string{""}},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

func TestPids(t *testing.T) {
	if p, err := pids("12\n 34 \n\n"); err != nil || len(p) != 2 || p[1] != 34 {
		t.Errorf("pids = %v, %v", p, err)
	}
	for _, bad := range []string{"Server 12 not found\n", "-3\n", "0\n"} {
		if _, err := pids(bad); err == nil {
			t.Errorf("pids(%q) accepted", bad)
		}
	}
}

func TestHelperGivesTheDaemonTheGPUsShm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a mount namespace needs root")
	}
	root := shortDir(t)
	cfg := fastConfig(t, root, "GPU-a")
	cfg.Helper = self
	cfg.Env = append(cfg.Env, "TESSERA_FAKE_MPS_SHM_MARK=1")
	s, stop := runSupervisor(t, cfg)
	defer stop()
	waitFor(t, "up", func() bool { return s.Status()[0].Up })
	pid := s.Status()[0].PID
	mark := "tessera-fake-mps-" + strconv.Itoa(pid)
	if _, err := os.Stat(filepath.Join(s.ShmDir("GPU-a"), mark)); err != nil {
		t.Errorf("the daemon's /dev/shm is not the GPU's shm directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", mark)); err == nil {
		t.Error("the daemon wrote into the host's /dev/shm")
	}
	if fi, err := os.Stat(s.ShmDir("GPU-a")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("shm directory mode: %v %v", fi.Mode(), err)
	}
}

// An agent restart with detached daemons: the daemon and its server (with its
// clients) outlive the first supervisor, which sends no quit; the next one adopts the
// daemon, sees the same server and its clients, and reports nothing lost.
func TestDetachedDaemonOutlivesTheSupervisorAndIsAdopted(t *testing.T) {
	root := shortDir(t)
	cfg := fastConfig(t, root, "GPU-a")
	cfg.Detach = true
	var mu sync.Mutex
	var events []Event
	cfg.OnEvent = func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
	first, stopFirst := runSupervisor(t, cfg)
	waitFor(t, "up", func() bool { return first.Status()[0].Up })
	daemon := first.Status()[0].PID
	t.Cleanup(func() { _ = syscall.Kill(-daemon, syscall.SIGKILL) })
	if pg, err := syscall.Getpgid(daemon); err != nil || pg != daemon {
		t.Errorf("detached daemon %d leads process group %d (%v), want its own", daemon, pg, err)
	}
	if sid, _, _ := syscall.RawSyscall(syscall.SYS_GETSID, uintptr(daemon), 0, 0); int(sid) != daemon {
		t.Errorf("detached daemon %d is in session %d, want its own", daemon, sid)
	}
	if err := os.WriteFile(filepath.Join(first.PipeDir("GPU-a"), "fake-clients"), []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var server int
	waitFor(t, "a server with a client", func() bool {
		for p, c := range first.Status()[0].Servers {
			if len(c) == 1 {
				server = p
				return true
			}
		}
		return false
	})
	stopFirst()
	if !running(daemon) || !running(server) {
		t.Fatalf("after the supervisor stopped: daemon running %v, server running %v", running(daemon), running(server))
	}
	if log, _ := os.ReadFile(filepath.Join(first.LogDir("GPU-a"), "control.log")); strings.Contains(string(log), "quit") {
		t.Errorf("a detached daemon was sent quit: %q", log)
	}

	cfg.Detach = false // the next supervisor stops what it adopted, for the test's cleanup
	second, stopSecond := runSupervisor(t, cfg)
	waitFor(t, "adopted with its server", func() bool {
		st := second.Status()[0]
		return st.Up && st.Adopted && len(st.Servers[server]) == 1
	})
	if st := second.Status()[0]; st.PID != daemon || st.Restarts != 0 {
		t.Errorf("adopted %+v, want daemon %d and no restart", st, daemon)
	}
	mu.Lock()
	if len(events) != 0 {
		t.Errorf("events across the restart: %+v", events)
	}
	mu.Unlock()
	stopSecond()
	waitFor(t, "the adopted daemon quit", func() bool { return !running(daemon) })
}

// An adopted daemon that fails goes with its process group: the servers it leaves
// behind do not hold the GPU beside the next daemon's.
func TestFailedAdoptedDaemonTakesItsServers(t *testing.T) {
	root := shortDir(t)
	cfg := fastConfig(t, root, "GPU-a")
	cfg.Detach = true
	s1, stop1 := runSupervisor(t, cfg)
	waitFor(t, "up", func() bool { return s1.Status()[0].Up })
	daemon := s1.Status()[0].PID
	t.Cleanup(func() { _ = syscall.Kill(-daemon, syscall.SIGKILL) })
	if err := os.WriteFile(filepath.Join(s1.PipeDir("GPU-a"), "fake-clients"), []byte("4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var server int
	waitFor(t, "a server", func() bool {
		for p := range s1.Status()[0].Servers {
			server = p
			return true
		}
		return false
	})
	stop1()

	cfg.Detach = false
	h := startWith(t, cfg)
	waitFor(t, "adopted", func() bool { st := h.status("GPU-a"); return st.Up && st.Adopted })
	h.touch("GPU-a", "fake-crash", "")
	waitFor(t, "failure", func() bool { return len(h.eventsOf(DaemonFailed)) == 1 })
	waitFor(t, "the old server gone", func() bool { return !running(server) })
	_ = os.Remove(filepath.Join(h.s.PipeDir("GPU-a"), "fake-crash"))
	waitFor(t, "a new daemon", func() bool { st := h.status("GPU-a"); return st.Up && !st.Adopted && st.PID != daemon })
}

// A daemon left for a GPU that is no longer served in mps mode is sent quit.
func TestOrphanDaemonIsSentQuit(t *testing.T) {
	root := shortDir(t)
	_, exited := leftDaemon(t, root, "GPU-old")
	s, stop := runSupervisor(t, fastConfig(t, root, "GPU-a"))
	defer stop()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the orphan daemon was not sent quit")
	}
	if log, _ := os.ReadFile(filepath.Join(root, "GPU-old", "log", "control.log")); !strings.Contains(string(log), "quit") {
		t.Errorf("orphan daemon's log %q", log)
	}
	waitFor(t, "GPU-a up", func() bool { return s.Status()[0].Up })
}

// The helper moves a detached daemon into its cgroup below the host's cgroup root,
// out of the agent's cgroup, whose processes the container runtime kills when the
// agent's container ends. It makes cgroups on the machine it runs on, so it runs only
// where TESSERA_MPS_CGROUP_TEST is set (the GPU machine's run).
func TestHelperMovesTheDaemonIntoItsCgroup(t *testing.T) {
	if os.Getenv("TESSERA_MPS_CGROUP_TEST") == "" {
		t.Skip("TESSERA_MPS_CGROUP_TEST is not set")
	}
	cg := "/tessera-mps-test-" + strconv.Itoa(os.Getpid())
	cfg := fastConfig(t, shortDir(t), "GPU-a")
	cfg.Helper, cfg.Detach, cfg.Cgroup = self, true, cg
	s, stop := runSupervisor(t, cfg)
	waitFor(t, "up", func() bool { return s.Status()[0].Up })
	pid := s.Status()[0].PID
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if want := "0::" + cg + "/GPU-a\n"; err != nil || string(b) != want {
		t.Errorf("the daemon's cgroup: %q %v, want %q", b, err, want)
	}
	stop()
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	waitFor(t, "daemon gone", func() bool { return !running(pid) })
	_ = os.Remove("/sys/fs/cgroup" + cg + "/GPU-a")
	_ = os.Remove("/sys/fs/cgroup" + cg)
}

// SPDX-License-Identifier: Apache-2.0

//go:build gpu

package mps

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
)

// The real nvidia-cuda-mps-control driven by the supervisor, with clients that see
// the GPU the way a bound container does: in their own mount namespace, the GPU's
// shm directory at /dev/shm and its pipe directory mounted read-only at another path.
// TESSERA_MPS_CLIENT is the B7 tenant program (cuda-hook/gpu/b7.cu); the figures
// go to the test log and, when set, $OUT/mps-gpu.txt.

func gpuEnv(t *testing.T) (control, client, uuid string) {
	client = os.Getenv("TESSERA_MPS_CLIENT")
	if client == "" {
		t.Skip("TESSERA_MPS_CLIENT (the b7 program) is not set")
	}
	control = os.Getenv("TESSERA_MPS_CONTROL")
	if control == "" {
		control = DefaultControl
	}
	if _, err := os.Stat(control); err != nil {
		t.Skipf("no MPS control program: %v", err)
	}
	out, err := exec.Command("nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0").Output()
	if err != nil {
		t.Skipf("nvidia-smi: %v", err)
	}
	return control, client, strings.TrimSpace(string(out))
}

type report struct {
	t    *testing.T
	name string // the file under $OUT; mps-gpu.txt when empty
	mu   sync.Mutex
	b    bytes.Buffer
}

func (r *report) say(format string, a ...any) {
	r.t.Helper()
	r.t.Logf(format, a...)
	r.mu.Lock()
	fmt.Fprintf(&r.b, format+"\n", a...)
	r.mu.Unlock()
}

func (r *report) save() {
	if out := os.Getenv("OUT"); out != "" {
		name := r.name
		if name == "" {
			name = "mps-gpu.txt"
		}
		_ = os.WriteFile(filepath.Join(out, name), r.b.Bytes(), 0o644)
	}
}

func rateOf(out string) float64 {
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "rate="); ok {
			r, _ := strconv.ParseFloat(v, 64)
			return r
		}
	}
	return 0
}

func TestRealMPSDaemon(t *testing.T) {
	control, client, uuid := gpuEnv(t)
	rep := &report{t: t}
	defer rep.save()
	root := shortDir(t)
	var mu sync.Mutex
	var events []Event
	s, err := New(Config{Control: control, Helper: self, Root: root, GPUs: []string{uuid},
		Env: []string{"PATH=" + filepath.Dir(control) + ":" + os.Getenv("PATH")}, Interval: 200 * time.Millisecond,
		Timeout: 5 * time.Second, MinBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second, Log: testr.New(t),
		OnEvent: func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	count := func(k EventKind) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, e := range events {
			if e.Kind == k {
				n++
			}
		}
		return n
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t0 := time.Now()
	waitFor(t, "daemon up", func() bool { return s.Status()[0].Up })
	first := s.Status()[0].PID
	rep.say("MPS daemon up in %s, pid %d", time.Since(t0).Round(time.Millisecond), first)

	ctrPipe := filepath.Join(root, "container-view", "pipe")
	if err := os.MkdirAll(ctrPipe, 0o755); err != nil {
		t.Fatal(err)
	}
	// clientCmd runs the client as a bound container would: /dev/shm is the GPU's
	// shm directory and the pipe directory is mounted read-only at a path of its own.
	// Should MPS refuse that, the probe below says so and tries the host's path, then
	// a writable mount, so that the rest of the test still runs.
	view, ro := ctrPipe, true
	clientCmd := func(pct int, args ...string) *exec.Cmd {
		script := fmt.Sprintf("mount --bind %s /dev/shm && mount --bind %s %s", s.ShmDir(uuid), s.PipeDir(uuid), view)
		if ro {
			script += fmt.Sprintf(" && mount -o remount,bind,ro %s", view)
		}
		cmd := exec.Command("unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script + ` && exec "$@"`, "sh", client}, args...)...)
		cmd.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+view)
		if pct > 0 {
			cmd.Env = append(cmd.Env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(pct))
		}
		return cmd
	}
	for _, v := range []struct {
		path string
		ro   bool
	}{{ctrPipe, true}, {s.PipeDir(uuid), true}, {s.PipeDir(uuid), false}} {
		view, ro = v.path, v.ro
		out, err := clientCmd(0, "launch", "0.5", "0").CombinedOutput()
		rep.say("probe: pipe directory at %s (read-only %v), own /dev/shm: %v %s", view, ro, err, strings.TrimSpace(lastLine(string(out))))
		if err == nil {
			break
		}
	}

	solo, err := exec.Command(client, "mm", "2", "0").CombinedOutput()
	if err != nil {
		t.Fatalf("solo run without MPS: %v\n%s", err, solo)
	}
	base := rateOf(string(solo))
	rep.say("solo (no MPS): %s", strings.TrimSpace(string(solo)))

	// Two clients at 30 and 70 percent of the SMs, measuring one window together.
	start := fmt.Sprintf("%.3f", float64(time.Now().Add(2*time.Second).UnixNano())/1e9)
	a, b := clientCmd(30, "mm", "2", start), clientCmd(70, "mm", "2", start)
	var outA, outB bytes.Buffer
	a.Stdout, a.Stderr, b.Stdout, b.Stderr = &outA, &outA, &outB, &outB
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	var clientsSeen int
	go func() {
		for i := 0; i < 30; i++ {
			time.Sleep(200 * time.Millisecond)
			n := 0
			for _, c := range s.Status()[0].Servers {
				n += len(c)
			}
			mu.Lock()
			clientsSeen = max(clientsSeen, n)
			mu.Unlock()
		}
	}()
	errA, errB := a.Wait(), b.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("MPS clients failed: %v %v\n%s\n%s", errA, errB, outA.String(), outB.String())
	}
	ra, rb := rateOf(outA.String()), rateOf(outB.String())
	mu.Lock()
	rep.say("MPS clients at 30/70%% of the SMs: shares %.1f / %.1f %% of solo (sum %.1f); clients seen by the supervisor: %d",
		100*ra/base, 100*rb/base, 100*(ra+rb)/base, clientsSeen)
	mu.Unlock()

	// Server failure: kill the server under a running client.
	long := clientCmd(50, "mm", "30", "0")
	var outL bytes.Buffer
	long.Stdout, long.Stderr = &outL, &outL
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	var server int
	waitFor(t, "a server with a client", func() bool {
		for p, c := range s.Status()[0].Servers {
			if len(c) > 0 {
				server = p
				return true
			}
		}
		return false
	})
	killed := time.Now()
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ServerLost", func() bool { return count(ServerLost) >= 1 })
	rep.say("server %d killed under a client: ServerLost reported after %s", server, time.Since(killed).Round(time.Millisecond))
	errL := long.Wait()
	rep.say("the client of the killed server: %v (%s)", errL, strings.TrimSpace(lastLine(outL.String())))
	t1 := time.Now()
	again, err := clientCmd(50, "mm", "1", "0").CombinedOutput()
	if err != nil {
		t.Fatalf("a client after the server failure: %v\n%s", err, again)
	}
	rep.say("a new client after the failure ran (%s after): %s; daemon pid %d (unchanged: %v)", time.Since(t1).Round(time.Millisecond),
		strings.TrimSpace(string(again)), s.Status()[0].PID, s.Status()[0].PID == first)

	// Daemon failure: kill the control daemon itself. Its servers go with its process
	// group before the next daemon starts, and are not reported lost a second time.
	var left []int
	for p := range s.Status()[0].Servers {
		left = append(left, p)
	}
	lostBefore := count(ServerLost)
	killed = time.Now()
	_ = syscall.Kill(first, syscall.SIGKILL)
	waitFor(t, "restart", func() bool { st := s.Status()[0]; return st.Up && st.PID != first && st.PID != 0 })
	rep.say("control daemon killed: restarted (pid %d, restarts %d) and answering after %s", s.Status()[0].PID, s.Status()[0].Restarts,
		time.Since(killed).Round(time.Millisecond))
	for _, p := range left {
		if running(p) {
			t.Errorf("server %d of the killed daemon still runs beside the new daemon", p)
		}
	}
	rep.say("servers of the killed daemon %v gone: %v; ServerLost events from the daemon's failure: %d (want 0)", left,
		!anyAlive(left), count(ServerLost)-lostBefore)
	if count(ServerLost) != lostBefore {
		t.Errorf("the daemon's failure was also reported as %d lost server(s)", count(ServerLost)-lostBefore)
	}
	again, err = clientCmd(50, "mm", "1", "0").CombinedOutput()
	if err != nil {
		t.Fatalf("a client after the daemon restart: %v\n%s", err, again)
	}
	rep.say("a client after the daemon restart: %s", strings.TrimSpace(string(again)))
	if count(DaemonFailed) < 1 || count(Recovered) < 1 {
		t.Errorf("events: %+v", events)
	}

	pid := s.Status()[0].PID
	cancel()
	<-done
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("daemon %d still runs after stop", pid)
	}
	rep.say("stopped: daemon quit, pid file gone: %v", !exists(filepath.Join(s.PipeDir(uuid), PidFile)))
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func anyAlive(pids []int) bool {
	for _, p := range pids {
		if running(p) {
			return true
		}
	}
	return false
}

func init() { agentMain = testAgent }

// testAgent is an agent with kept daemons (in TESSERA_MPS_TEST_CGROUP, if set) under
// the root $TESSERA_MPS_TEST_AGENT, until it is killed.
func testAgent() int {
	control := os.Getenv("TESSERA_MPS_CONTROL")
	s, err := New(Config{Control: control, Helper: self, Root: os.Getenv(agentEnv), GPUs: []string{os.Getenv("TESSERA_MPS_TEST_UUID")},
		Env: []string{"PATH=" + filepath.Dir(control) + ":" + os.Getenv("PATH")}, Detach: true, Cgroup: os.Getenv("TESSERA_MPS_TEST_CGROUP"),
		Interval: 200 * time.Millisecond,
		Log:      funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, "test agent:", prefix, args) }, funcr.Options{})})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	_ = s.Run(context.Background())
	return 0
}

// An agent restart as the container runtime does it: every process in the agent's
// cgroup is killed (cgroup.kill). The kept daemon, in its own cgroup, survives with its
// server and a running client; the next agent adopts it; the client finishes. Without
// the cgroup the daemon dies with the agent.
func TestRealMPSDaemonOutlivesAnAgentRestart(t *testing.T) {
	control, client, uuid := gpuEnv(t)
	if os.Getenv("TESSERA_MPS_CGROUP_TEST") == "" {
		t.Skip("TESSERA_MPS_CGROUP_TEST is not set (the test makes cgroups)")
	}
	rep := &report{t: t, name: "mps-restart.txt"}
	defer rep.save()
	agentCg := "/sys/fs/cgroup/tessera-test-agent"
	if err := os.MkdirAll(agentCg, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(agentCg)
	startAgent := func(root, cg string) *exec.Cmd {
		cmd := exec.Command("sh", "-c", `echo $$ >`+agentCg+`/cgroup.procs && exec "$0"`, self)
		cmd.Env = append(os.Environ(), agentEnv+"="+root, "TESSERA_MPS_TEST_UUID="+uuid, "TESSERA_MPS_CONTROL="+control,
			"TESSERA_MPS_TEST_CGROUP="+cg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	killAgent := func(cmd *exec.Cmd) {
		if err := os.WriteFile(agentCg+"/cgroup.kill", []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
	}
	env := []string{"PATH=" + filepath.Dir(control) + ":" + os.Getenv("PATH")}
	daemonOf := func(obs *Supervisor) int {
		var pid int
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, err := obs.Command(context.Background(), uuid, "get_server_list"); err != nil {
				continue
			}
			if pid, _ = readPid(filepath.Join(obs.PipeDir(uuid), PidFile)); pid > 0 {
				return pid
			}
		}
		logs, _ := filepath.Glob(filepath.Join(obs.LogDir(uuid), "*"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			rep.say("%s:\n%s", l, b)
		}
		t.Fatal("the agent's daemon did not answer within 20s")
		return 0
	}

	root := shortDir(t)
	obs, _ := New(Config{Control: control, Root: root, GPUs: []string{uuid}, Env: env})
	agent := startAgent(root, "/tessera-test-mps")
	defer func() {
		_ = os.Remove("/sys/fs/cgroup/tessera-test-mps/" + uuid)
		_ = os.Remove("/sys/fs/cgroup/tessera-test-mps")
	}()
	d := daemonOf(obs)
	cg, _ := os.ReadFile("/proc/" + strconv.Itoa(d) + "/cgroup")
	rep.say("kept daemon %d of the first agent in cgroup %s", d, strings.TrimSpace(string(cg)))
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		fmt.Sprintf(`mount --bind %s /dev/shm && exec "$@"`, obs.ShmDir(uuid)), "sh", client, "mm", "6", "0")
	cmd.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+obs.PipeDir(uuid), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var server int
	waitFor(t, "the client connected", func() bool {
		o, err := obs.Command(context.Background(), uuid, "get_server_list")
		ps, _ := pids(o)
		if err != nil || len(ps) == 0 {
			return false
		}
		c, err := obs.Command(context.Background(), uuid, "get_client_list "+strconv.Itoa(ps[0]))
		cs, _ := pids(c)
		server = ps[0]
		return err == nil && len(cs) > 0
	})
	time.Sleep(time.Second)
	restarted := time.Now()
	killAgent(agent)
	rep.say("agent's cgroup killed with a client running: daemon %d running %v, server %d running %v", d, running(d), server, running(server))
	if !running(d) || !running(server) {
		t.Fatal("the kept daemon or its server died with the agent")
	}
	var mu sync.Mutex
	var events []Event
	next, err := New(Config{Control: control, Helper: self, Root: root, GPUs: []string{uuid}, Env: env, Detach: true,
		Cgroup: "/tessera-test-mps", Interval: 200 * time.Millisecond, MinBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second,
		Log: testr.New(t), OnEvent: func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = next.Run(ctx); close(done) }()
	waitFor(t, "adopted with its client", func() bool {
		st := next.Status()[0]
		return st.Up && st.Adopted && len(st.Servers[server]) > 0
	})
	rep.say("next agent adopted daemon %d (pid %d) %s after the kill, sees server %d with clients %v", d, next.Status()[0].PID,
		time.Since(restarted).Round(time.Millisecond), server, next.Status()[0].Servers[server])
	errC := cmd.Wait()
	rep.say("the client through the restart: %v %s", errC, strings.TrimSpace(lastLine(out.String())))
	if errC != nil {
		t.Errorf("the client did not survive the agent restart: %v\n%s", errC, out.String())
	}
	// The adopted daemon fails: its server goes with its process group, and a new
	// daemon serves the next client.
	_ = syscall.Kill(d, syscall.SIGKILL)
	waitFor(t, "a new daemon", func() bool { st := next.Status()[0]; return st.Up && st.PID != d && st.PID != 0 })
	rep.say("adopted daemon killed: new daemon %d, old server %d running: %v", next.Status()[0].PID, server, running(server))
	if running(server) {
		t.Errorf("the adopted daemon's server %d outlived it", server)
	}
	mu.Lock()
	rep.say("events of the next agent: %d", len(events))
	for _, e := range events {
		rep.say("  %s: %s", e.Kind, e.Message)
	}
	mu.Unlock()
	cancel()
	<-done
	last := next.Status()[0]
	_ = syscall.Kill(-last.PID, syscall.SIGKILL)
	if p, err := readPid(filepath.Join(next.PipeDir(uuid), PidFile)); err == nil {
		_ = syscall.Kill(-p, syscall.SIGKILL)
	}

	// Without a cgroup of its own the kept daemon dies with the agent's cgroup.
	rootC := shortDir(t)
	obsC, _ := New(Config{Control: control, Root: rootC, GPUs: []string{uuid}, Env: env})
	agent = startAgent(rootC, "")
	d = daemonOf(obsC)
	killAgent(agent)
	time.Sleep(300 * time.Millisecond)
	rep.say("kept daemon in the agent's cgroup: agent's cgroup killed, daemon %d running: %v", d, running(d))
	if running(d) {
		_ = syscall.Kill(-d, syscall.SIGKILL)
	}
}

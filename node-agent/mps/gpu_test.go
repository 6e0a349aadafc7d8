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
	t  *testing.T
	mu sync.Mutex
	b  bytes.Buffer
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
		_ = os.WriteFile(filepath.Join(out, "mps-gpu.txt"), r.b.Bytes(), 0o644)
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
	root := t.TempDir()
	var mu sync.Mutex
	var events []Event
	s, err := New(Config{Control: control, Helper: os.Args[0], Root: root, GPUs: []string{uuid},
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

	// Daemon failure: kill the control daemon itself.
	killed = time.Now()
	_ = syscall.Kill(first, syscall.SIGKILL)
	waitFor(t, "restart", func() bool { st := s.Status()[0]; return st.Up && st.PID != first && st.PID != 0 })
	rep.say("control daemon killed: restarted (pid %d, restarts %d) and answering after %s", s.Status()[0].PID, s.Status()[0].Restarts,
		time.Since(killed).Round(time.Millisecond))
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

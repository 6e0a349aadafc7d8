// SPDX-License-Identifier: Apache-2.0

// Package mps runs and supervises one NVIDIA MPS control daemon
// (nvidia-cuda-mps-control) per GPU that the node agent serves in mps sharing mode.
//
// Each GPU gets its own pipe and log directory under the supervisor's root
// (<root>/<uuid>/pipe, <root>/<uuid>/log), and its daemon sees only that GPU
// (CUDA_VISIBLE_DEVICES=<uuid>), so a container bound to the GPU reaches its MPS
// server through the pipe directory alone. The daemon runs in the foreground (-f) as
// the supervisor's child; its health is read through the control program's own
// command interface (get_server_list, get_client_list), the way an administrator
// reads it. A daemon that exits or stops answering is restarted with exponential
// backoff; an MPS server that disappears while it had clients is reported as a
// failure (its clients lost their CUDA contexts), and the daemon starts a fresh server
// for the next client by itself. Stopping sends the daemon "quit", unless the
// supervisor detaches its daemons (Config.Detach): they then outlive it, with their
// clients, and the next supervisor adopts them through their pipe directories.
package mps

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-dev/tessera/api"
)

// DefaultControl is where the NVIDIA driver installs the control program.
const DefaultControl = "/usr/bin/nvidia-cuda-mps-control"

// DefaultRoot is the host directory under which each GPU's pipe and log directories
// live. Like the limits root it is on tmpfs: MPS state does not outlive a reboot.
const DefaultRoot = "/run/tessera/mps"

// PidFile is the file in the pipe directory where the control daemon writes its PID.
const PidFile = "nvidia-cuda-mps-control.pid"

// Config configures a Supervisor.
type Config struct {
	// Control is the nvidia-cuda-mps-control binary (DefaultControl when empty). The
	// daemon starts nvidia-cuda-mps-server from its PATH.
	Control string
	// Root holds <uuid>/pipe and <uuid>/log for every GPU (DefaultRoot when empty).
	Root string
	// GPUs are the UUIDs of the GPUs to serve in mps mode.
	GPUs []string
	// Helper is the exec helper (see RunExecHelper), normally the node agent's own
	// binary: the daemon then runs in its own mount namespace with the GPU's shm
	// directory as /dev/shm. Empty: the daemon shares the agent's /dev/shm (tests).
	Helper string
	// Env is added to the agent's environment for the daemon and the control
	// commands (e.g. PATH or LD_LIBRARY_PATH for the driver's files).
	Env []string
	// Detach leaves the daemons running when Run returns (an agent restart or
	// upgrade): each daemon starts in a session of its own, so no signal to the
	// agent's process group reaches it, and the next supervisor adopts it (its health
	// answers through the same pipe directory). Without Cgroup a daemon still dies
	// with the agent's container, whose runtime kills every process in the
	// container's cgroup.
	Detach bool
	// Cgroup is a cgroup v2 directory of the host, relative to its cgroup root
	// (e.g. /tessera-mps), under which each daemon runs in <Cgroup>/<uuid>, outside
	// the agent's cgroup, so that the runtime's cleanup of the agent's container
	// spares it. The exec helper moves the daemon there through the cgroup namespace
	// of the host's PID 1 (the agent needs the host's PID namespace and
	// CAP_SYS_ADMIN). Needs Helper and Detach.
	Cgroup string
	// Interval is how often each daemon's health is read (5s when zero).
	Interval time.Duration
	// Timeout bounds one control command (5s when zero).
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a restart (1s and 1m when zero);
	// the wait doubles with each failure in a row, each wait up to 10% longer at
	// random, and resets once a daemon has been healthy for MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	Log                    logr.Logger
	// OnEvent, when set, is called for every failure and recovery, from the GPU's
	// supervision goroutine.
	OnEvent func(Event)
}

// EventKind is what happened to a GPU's MPS service.
type EventKind string

const (
	// DaemonFailed: the control daemon could not start, exited, or stopped answering;
	// it is restarted. Clients on the GPU lose their MPS server with it.
	DaemonFailed EventKind = "DaemonFailed"
	// ServerLost: an MPS server that had clients is gone (crashed or killed). Its
	// clients lost their CUDA contexts; the daemon starts a new server for the next
	// client.
	ServerLost EventKind = "ServerLost"
	// Recovered: after a failure the daemon answers again.
	Recovered EventKind = "Recovered"
)

// Event is a failure or recovery of one GPU's MPS service.
type Event struct {
	GPU  string
	Kind EventKind
	// ServerPID and Clients are set for ServerLost: the server and the client PIDs
	// it had at the last health check.
	ServerPID int
	Clients   []int
	Message   string
}

// Status is the state of one GPU's MPS service.
type Status struct {
	GPU     string
	PipeDir string
	LogDir  string
	// Up is true while the daemon answers its health checks.
	Up bool
	// PID is the daemon's PID (0 when none runs).
	PID int
	// Adopted is true when the daemon was already running when the supervisor
	// started (a daemon left by an earlier agent process) and is watched, not owned.
	Adopted bool
	// Restarts counts daemon failures; ServerFailures counts ServerLost events.
	Restarts, ServerFailures int
	// Servers maps each MPS server's PID to its clients' PIDs, as last read.
	Servers   map[int][]int
	LastError string
}

// Supervisor supervises the daemons. Run it once.
type Supervisor struct {
	cfg Config

	mu    sync.Mutex
	state map[string]*Status
}

// New checks cfg. It starts nothing.
func New(cfg Config) (*Supervisor, error) {
	if cfg.Control == "" {
		cfg.Control = DefaultControl
	}
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	if !filepath.IsAbs(cfg.Control) || !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("mps: the control program %q and the root %q must be absolute paths", cfg.Control, cfg.Root)
	}
	if cfg.Cgroup != "" {
		if !filepath.IsAbs(cfg.Cgroup) || filepath.Clean(cfg.Cgroup) != cfg.Cgroup || cfg.Cgroup == "/" {
			return nil, fmt.Errorf("mps: the cgroup %q must be a clean absolute path below the cgroup root", cfg.Cgroup)
		}
		if cfg.Helper == "" || !cfg.Detach {
			return nil, fmt.Errorf("mps: a cgroup for the daemons (%s) needs the exec helper and detached daemons", cfg.Cgroup)
		}
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(time.Minute, cfg.MinBackoff)
	}
	s := &Supervisor{cfg: cfg, state: map[string]*Status{}}
	for _, u := range cfg.GPUs {
		if err := checkUUID(u); err != nil {
			return nil, err
		}
		if _, dup := s.state[u]; dup {
			return nil, fmt.Errorf("mps: GPU %s listed twice", u)
		}
		// The daemon's and servers' Unix sockets live in the pipe directory, and a
		// socket's path must fit sockaddr_un (108 bytes) with the socket's name.
		if p := s.PipeDir(u); len(p) > api.MaxMPSPipeDirBytes {
			return nil, fmt.Errorf("mps: the pipe directory %s is %d bytes, more than %d: MPS's sockets in it would not fit a socket address; choose a shorter root",
				p, len(p), api.MaxMPSPipeDirBytes)
		}
		s.state[u] = &Status{GPU: u, PipeDir: s.PipeDir(u), LogDir: s.LogDir(u), Servers: map[int][]int{}}
	}
	return s, nil
}

// PipeDir is the GPU's CUDA_MPS_PIPE_DIRECTORY on the host.
func (s *Supervisor) PipeDir(uuid string) string { return filepath.Join(s.cfg.Root, uuid, "pipe") }

// ShmDir is the directory the GPU's daemon and clients see as /dev/shm.
func (s *Supervisor) ShmDir(uuid string) string { return filepath.Join(s.cfg.Root, uuid, "shm") }

// LogDir is the GPU's CUDA_MPS_LOG_DIRECTORY on the host.
func (s *Supervisor) LogDir(uuid string) string { return filepath.Join(s.cfg.Root, uuid, "log") }

// Serves reports whether the supervisor serves this GPU.
func (s *Supervisor) Serves(uuid string) bool {
	_, ok := s.state[uuid]
	return ok
}

// GPUs returns the UUIDs served, in configuration order.
func (s *Supervisor) GPUs() []string { return slices.Clone(s.cfg.GPUs) }

// Status returns a copy of every GPU's state, in configuration order.
func (s *Supervisor) Status() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, 0, len(s.cfg.GPUs))
	for _, u := range s.cfg.GPUs {
		st := *s.state[u]
		st.Servers = make(map[int][]int, len(s.state[u].Servers))
		for k, v := range s.state[u].Servers {
			st.Servers[k] = slices.Clone(v)
		}
		out = append(out, st)
	}
	return out
}

func (s *Supervisor) update(uuid string, f func(*Status)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.state[uuid])
}

func (s *Supervisor) emit(e Event) {
	s.cfg.Log.Info("MPS event", "gpu", e.GPU, "kind", e.Kind, "serverPID", e.ServerPID, "clients", e.Clients, "message", e.Message)
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(e)
	}
}

// Run supervises every GPU's daemon until ctx is done, then stops the daemons (or,
// with Detach, leaves them to the next supervisor) and returns. First it sends quit
// to any daemon left under the root for a GPU it no longer serves.
func (s *Supervisor) Run(ctx context.Context) error {
	if s.cfg.Cgroup != "" {
		if err := HostCgroupReachable(); err != nil {
			s.cfg.Log.Error(err, "the MPS control daemons cannot be moved out of the node agent's cgroup: they serve their GPUs, but an agent restart ends them and their clients' contexts (drain MPS GPUs before restarting or upgrading the agent)",
				"cgroup", s.cfg.Cgroup)
		}
	}
	s.quitOrphans(ctx)
	var wg sync.WaitGroup
	for _, u := range s.cfg.GPUs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.superviseGPU(ctx, u)
		}()
	}
	wg.Wait()
	return nil
}

func (s *Supervisor) env(uuid string) []string {
	env := append(os.Environ(), s.cfg.Env...)
	return append(env,
		"CUDA_VISIBLE_DEVICES="+uuid,
		"CUDA_MPS_PIPE_DIRECTORY="+s.PipeDir(uuid),
		"CUDA_MPS_LOG_DIRECTORY="+s.LogDir(uuid))
}

// Command sends one command to the GPU's daemon through the control program and
// returns its output.
func (s *Supervisor) Command(ctx context.Context, uuid, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.cfg.Control)
	cmd.Env = s.env(uuid)
	cmd.Stdin = strings.NewReader(command + "\n")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		return "", fmt.Errorf("%q got no answer within %s", command, s.cfg.Timeout)
	}
	if err != nil {
		msg := strings.TrimSpace(errOut.String() + " " + out.String())
		return "", fmt.Errorf("%q: %v: %s", command, err, msg)
	}
	return out.String(), nil
}

// pids parses one PID per line; anything else is an error (the daemon answered with
// a message rather than a list).
func pids(out string) ([]int, error) {
	var ps []int
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		p, err := strconv.Atoi(line)
		if err != nil || p <= 0 {
			return nil, fmt.Errorf("unexpected answer %q", line)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// check reads the daemon's servers and their clients. It reports a server that had
// clients at the previous check and is gone now.
func (s *Supervisor) check(ctx context.Context, uuid string) error {
	out, err := s.Command(ctx, uuid, "get_server_list")
	if err != nil {
		return err
	}
	servers, err := pids(out)
	if err != nil {
		return fmt.Errorf("get_server_list: %w", err)
	}
	now := map[int][]int{}
	for _, p := range servers {
		out, err := s.Command(ctx, uuid, "get_client_list "+strconv.Itoa(p))
		if err != nil {
			return err
		}
		clients, err := pids(out)
		if err != nil {
			// A server that exited between the two commands is answered with a
			// message; it is seen as gone at the next check.
			continue
		}
		now[p] = clients
	}
	var lost []Event
	s.update(uuid, func(st *Status) {
		for p, clients := range st.Servers {
			if _, ok := now[p]; !ok && len(clients) > 0 {
				st.ServerFailures++
				lost = append(lost, Event{GPU: uuid, Kind: ServerLost, ServerPID: p, Clients: clients,
					Message: fmt.Sprintf("MPS server %d on GPU %s exited while it served %d client process(es); they lost their CUDA contexts. "+
						"The control daemon starts a new server for the next client", p, uuid, len(clients))})
			}
		}
		st.Servers = now
	})
	for _, e := range lost {
		s.emit(e)
	}
	return nil
}

// daemon is one run of a control daemon: a child the supervisor started, or an
// adopted daemon it only watches.
type daemon struct {
	pid     int
	adopted bool
	cmd     *exec.Cmd
	exited  chan struct{} // closed when a started child exits; waitErr is then set
	waitErr error
}

func (d *daemon) alive() bool {
	if d.cmd != nil {
		select {
		case <-d.exited:
			return false
		default:
			return true
		}
	}
	return d.pid > 0 && syscall.Kill(d.pid, 0) == nil
}

func (s *Supervisor) superviseGPU(ctx context.Context, uuid string) {
	log := s.cfg.Log.WithValues("gpu", uuid)
	initial := restartBackoff(s.cfg.MinBackoff, s.cfg.MaxBackoff)
	backoff := initial
	failed := false
	for ctx.Err() == nil {
		var delay time.Duration
		d, err := s.start(ctx, uuid)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.update(uuid, func(st *Status) { st.Up, st.PID, st.LastError = false, 0, err.Error(); st.Restarts++ })
			delay = backoff.Step()
			s.emit(Event{GPU: uuid, Kind: DaemonFailed, Message: fmt.Sprintf("MPS control daemon for GPU %s could not start: %v; retrying in %s", uuid, err, delay.Round(time.Millisecond))})
			failed = true
		} else {
			healthySince, why := s.watch(ctx, uuid, d, &failed)
			if ctx.Err() != nil {
				if s.cfg.Detach {
					log.Info("leaving the MPS control daemon running for the next node agent", "pid", d.pid)
					return
				}
				s.stop(uuid, d)
				return
			}
			if !healthySince.IsZero() && time.Since(healthySince) >= s.cfg.MaxBackoff {
				backoff = initial
			}
			s.stop(uuid, d)
			// The failure event speaks for the servers that went with the daemon; the
			// new daemon's servers are compared afresh.
			s.update(uuid, func(st *Status) {
				st.Up, st.PID, st.Adopted, st.LastError, st.Servers = false, 0, false, why, map[int][]int{}
				st.Restarts++
			})
			delay = backoff.Step()
			s.emit(Event{GPU: uuid, Kind: DaemonFailed, Message: fmt.Sprintf("MPS control daemon for GPU %s failed: %s; its clients lost their MPS server. Restarting in %s", uuid, why, delay.Round(time.Millisecond))})
			failed = true
		}
		log.V(1).Info("waiting before restarting the MPS control daemon", "backoff", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// restartBackoff waits from lo, doubling to hi, each wait up to 10% longer at random
// so that the daemons of several GPUs that failed together (a driver reset) are not
// restarted in step.
func restartBackoff(lo, hi time.Duration) wait.Backoff {
	return wait.Backoff{Duration: lo, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: hi}
}

// start adopts a daemon that already answers on the GPU's pipe directory, or starts
// one and waits until it answers.
func (s *Supervisor) start(ctx context.Context, uuid string) (*daemon, error) {
	pipe, logDir := s.PipeDir(uuid), s.LogDir(uuid)
	for _, d := range []string{pipe, logDir, s.ShmDir(uuid)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		// The pipe and shm directories are mounted into containers whose processes
		// may run as any user; /dev/shm is world-writable and sticky everywhere.
		mode := os.FileMode(0o755)
		if d == s.ShmDir(uuid) {
			mode = 0o777 | os.ModeSticky
		}
		if err := os.Chmod(d, mode); err != nil {
			return nil, err
		}
	}
	if _, err := s.Command(ctx, uuid, "get_server_list"); err == nil {
		pid, _ := readPid(filepath.Join(pipe, PidFile))
		s.cfg.Log.Info("adopting the MPS control daemon already serving the GPU", "gpu", uuid, "pid", pid)
		s.update(uuid, func(st *Status) { st.Adopted, st.PID = true, pid })
		return &daemon{pid: pid, adopted: true}, nil
	}
	// Nothing answers: what is left in the pipe directory is a dead daemon's.
	entries, err := os.ReadDir(pipe)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(pipe, e.Name())); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(s.cfg.Control, "-f")
	cmd.Env = s.env(uuid)
	// Its own process group, so that stopping it reaches the servers it started and
	// a signal meant for the agent's terminal does not reach it; detached, its own
	// session too (which also makes it a process group of its own).
	attr := &syscall.SysProcAttr{Setpgid: !s.cfg.Detach, Setsid: s.cfg.Detach}
	cmd.SysProcAttr = attr
	if s.cfg.Helper != "" {
		cmd = exec.Command(s.cfg.Helper, s.cfg.Control, "-f")
		cmd.Env = append(s.env(uuid), execEnv+"="+s.ShmDir(uuid))
		if s.cfg.Cgroup != "" {
			cmd.Env = append(cmd.Env, execCgroupEnv+"="+path.Join(s.cfg.Cgroup, uuid))
		}
		attr.Unshareflags = syscall.CLONE_NEWNS
		cmd.SysProcAttr = attr
	}
	lf, err := os.OpenFile(filepath.Join(logDir, "tessera-daemon.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &daemon{pid: cmd.Process.Pid, cmd: cmd, exited: make(chan struct{})}
	go func() { d.waitErr = cmd.Wait(); close(d.exited) }()
	s.update(uuid, func(st *Status) { st.PID, st.Adopted = d.pid, false })
	// Wait until it answers, as long as a few health checks.
	deadline := time.Now().Add(3 * s.cfg.Timeout)
	for {
		if _, err = s.Command(ctx, uuid, "get_server_list"); err == nil {
			s.cfg.Log.Info("MPS control daemon started", "gpu", uuid, "pid", d.pid)
			return d, nil
		}
		if !d.alive() {
			return nil, fmt.Errorf("it exited (%s) before answering; see %s", exitText(d.waitErr), lf.Name())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop(uuid, d)
			return nil, fmt.Errorf("it did not answer within %s: %v", 3*s.cfg.Timeout, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// watch checks the daemon every interval until it fails or ctx is done. It returns
// when the daemon became healthy and why it failed.
func (s *Supervisor) watch(ctx context.Context, uuid string, d *daemon, failed *bool) (time.Time, string) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	var exited <-chan struct{}
	if d.cmd != nil {
		exited = d.exited
	}
	healthySince := time.Time{}
	misses := 0
	for {
		err := s.check(ctx, uuid)
		if ctx.Err() != nil {
			return healthySince, ""
		}
		switch {
		case err == nil:
			misses = 0
			if healthySince.IsZero() {
				healthySince = time.Now()
			}
			s.update(uuid, func(st *Status) { st.Up, st.LastError = true, "" })
			if *failed {
				*failed = false
				s.emit(Event{GPU: uuid, Kind: Recovered, Message: fmt.Sprintf("MPS control daemon for GPU %s is serving again", uuid)})
			}
		case !d.alive():
			return healthySince, fmt.Sprintf("the daemon (pid %d) is gone", d.pid)
		default:
			misses++
			s.update(uuid, func(st *Status) { st.Up, st.LastError = false, err.Error() })
			// One miss can be a slow answer under load; two in a row is a daemon
			// that no longer serves its clients.
			if misses >= 2 {
				return healthySince, fmt.Sprintf("it stopped answering: %v", err)
			}
		}
		select {
		case <-ctx.Done():
			return healthySince, ""
		case <-exited:
			return healthySince, fmt.Sprintf("the daemon (pid %d) exited: %v", d.pid, exitText(d.waitErr))
		case <-t.C:
		}
	}
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// stop asks the daemon to quit and kills it (with its process group, or by its PID
// when adopted) if it has not gone after the timeout.
func (s *Supervisor) stop(uuid string, d *daemon) {
	defer func() {
		// Servers the daemon started are in its process group; one left behind by a
		// daemon that died would hold its GPU context beside the next daemon's. An
		// adopted daemon that an earlier supervisor started leads a process group of
		// its own too (the group outlives its leader while its servers live).
		if d.cmd != nil {
			_ = syscall.Kill(-d.pid, syscall.SIGKILL)
		} else if d.pid > 0 {
			if pg, err := syscall.Getpgid(d.pid); err != nil || pg == d.pid {
				_ = syscall.Kill(-d.pid, syscall.SIGKILL)
			}
		}
	}()
	if !d.alive() {
		return
	}
	if _, err := s.Command(context.Background(), uuid, "quit"); err != nil {
		s.cfg.Log.V(1).Info("MPS control daemon did not take quit", "gpu", uuid, "err", err.Error())
	}
	deadline := time.Now().Add(2 * s.cfg.Timeout)
	for d.alive() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if d.alive() {
		if d.cmd != nil {
			_ = syscall.Kill(-d.pid, syscall.SIGKILL)
			<-d.exited
		} else if d.pid > 0 {
			_ = syscall.Kill(d.pid, syscall.SIGKILL)
		}
	}
	s.update(uuid, func(st *Status) { st.Up, st.PID = false, 0 })
}

// quitOrphans sends quit to a daemon that answers under the root for a GPU the
// supervisor does not serve (one a detached daemon of an earlier configuration was
// left for): its GPU is time-sliced now.
func (s *Supervisor) quitOrphans(ctx context.Context) {
	entries, err := os.ReadDir(s.cfg.Root)
	if err != nil {
		return
	}
	for _, e := range entries {
		u := e.Name()
		if !e.IsDir() || s.Serves(u) || checkUUID(u) != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(s.PipeDir(u), PidFile)); err != nil {
			continue
		}
		if _, err := s.Command(ctx, u, "get_server_list"); err != nil {
			continue
		}
		s.cfg.Log.Info("sending quit to the MPS control daemon of a GPU no longer served in mps mode", "gpu", u)
		if _, err := s.Command(ctx, u, "quit"); err != nil {
			s.cfg.Log.Error(err, "the MPS control daemon of a GPU no longer served did not take quit", "gpu", u)
		}
	}
}

func checkUUID(u string) error {
	if u == "" || strings.ContainsAny(u, "/\x00") || u == "." || u == ".." {
		return fmt.Errorf("mps: GPU UUID %q cannot name a directory", u)
	}
	return nil
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	p, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || p <= 0 {
		return 0, errors.New("malformed pid file")
	}
	return p, nil
}

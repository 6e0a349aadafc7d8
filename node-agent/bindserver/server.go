// SPDX-License-Identifier: Apache-2.0

// Package bindserver is the node agent's binding for nodes without NRI: the CUDA hook
// in a GPU container connects to a unix socket of the agent at its first CUDA call,
// and the agent answers with that container's limits.
//
// The agent identifies the caller from facts the kernel gives it, never from what the
// caller says: the peer's PID from SO_PEERCRED (a pidfd from SO_PEERPIDFD where the
// kernel has it, so that a PID reused meanwhile is noticed), its cgroup from
// /proc/<pid>/cgroup, the pod UID and container id from the cgroup path, the pod
// among the pods of this node by UID, the container's name from the pod's status by
// container id, and the container's grant from the pod's assignment annotation. The
// limits go back in a sealed memfd (passed with SCM_RIGHTS), which neither the tenant
// nor anyone else can change once it is sealed.
//
// The protocol, on a SOCK_SEQPACKET socket, one packet each way:
//
//	hook  -> agent: "tessera-bind 1\n"
//	agent -> hook:  "ok <bytes>\n" with the memfd attached, or
//	                "error <reason>\n" (the hook refuses CUDA with the reason)
//
// One container cannot starve the others: the caller's container is known as soon as
// its connection is accepted, each container may hold a bounded number of
// connections open (more are refused at once), a bounded number of its callers are
// served at once, and the node-wide slots go to the containers with callers waiting
// in turn. Waiting for a request holds no slot.
package bindserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
)

// DefaultSocket is the agent's socket on the host. Its directory holds nothing else:
// the device plugin mounts the directory read-only at api.ContainerLimitsDir in every
// GPU container, so the hook finds the socket at ContainerSocket.
const DefaultSocket = "/run/tessera/bind/bind.sock"

// ContainerSocket is where the hook looks for the socket inside a container. The
// directory is the read-only mount the limits file would otherwise come in, so a
// tenant can neither put a limits file beside the socket nor a socket of its own
// where the agent's is expected. The hook's TESSERA_BIND_SOCKET is the same path.
const ContainerSocket = api.ContainerLimitsDir + "/bind.sock"

// Request is the hook's only message.
const Request = "tessera-bind 1\n"

// Pods finds pods of this node by UID.
type Pods interface {
	// PodByUID returns the pod with this UID among the pods bound to this node, or
	// nil. The pod must not be modified.
	PodByUID(uid string) *corev1.Pod
}

// Config configures a Server.
type Config struct {
	// Socket is the socket's host path; DefaultSocket when empty.
	Socket string
	// ProcRoot is the host's /proc.
	ProcRoot string
	Pods     Pods
	Binder   *binding.Binder
	// StatusWait bounds how long a caller waits for its container to appear in its
	// pod's status (kubelet writes it shortly after the container starts, and a
	// CUDA program may call cuInit sooner). Default 10s.
	StatusWait time.Duration
	// StatusPoll is how often the pod is looked at again meanwhile. Default 200ms.
	StatusPoll time.Duration
	// MaxConcurrent bounds the callers served at once, node-wide; a freed slot goes
	// to the next container in turn with a caller waiting. Default 64.
	MaxConcurrent int
	// MaxPerContainer bounds the callers of one container served at once; its other
	// callers wait while other containers' are served. Default 4.
	MaxPerContainer int
	// MaxOpenPerContainer bounds the connections one container holds open to the
	// agent (sending their request, waiting for a slot, being served); more are
	// refused at once, so that one container cannot use up the agent's file
	// descriptors. Callers the agent cannot place in a container count as one.
	// Default 64.
	MaxOpenPerContainer int
	// RequestTimeout bounds the wait for a caller's request, so that connections
	// that say nothing are dropped. Default 2s.
	RequestTimeout time.Duration
	// OnRefused is told of every refusal with the reason the hook prints; pod is nil
	// when no pod is known (the event then has nowhere to go).
	OnRefused func(pod *corev1.Pod, container, reason string)
	Log       logr.Logger
}

// Server serves the socket.
type Server struct {
	cfg   Config
	slots *fairSlots
	// refusers bounds the connections being refused at once (over their
	// container's bound), each given a moment to send its request so that the hook
	// reads the reason rather than a broken pipe.
	refusers chan struct{}
	// peer reads the caller's credentials; tests replace it only where the kernel
	// lacks what it needs.
	peer func(*net.UnixConn) (pid int, pidfd int, err error)

	mu     sync.Mutex
	l      *net.UnixListener
	closed bool
}

// New checks cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Pods == nil || cfg.Binder == nil {
		return nil, errors.New("bindserver: pods and binder are required")
	}
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket
	}
	if !filepath.IsAbs(cfg.Socket) {
		return nil, fmt.Errorf("bindserver: socket %q must be an absolute path", cfg.Socket)
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.StatusWait <= 0 {
		cfg.StatusWait = 10 * time.Second
	}
	if cfg.StatusPoll <= 0 {
		cfg.StatusPoll = 200 * time.Millisecond
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 64
	}
	if cfg.MaxPerContainer <= 0 {
		cfg.MaxPerContainer = min(4, cfg.MaxConcurrent)
	}
	if cfg.MaxOpenPerContainer <= 0 {
		cfg.MaxOpenPerContainer = 64
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 2 * time.Second
	}
	return &Server{cfg: cfg, slots: newFairSlots(cfg.MaxConcurrent, cfg.MaxPerContainer), refusers: make(chan struct{}, 64),
		peer: peerCredentials}, nil
}

// Listen creates the socket. Its directory is created if needed and must hold nothing
// but the socket, since it is mounted into every GPU container.
func (s *Server) Listen() error {
	dir := filepath.Dir(s.cfg.Socket)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bindserver: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("bindserver: %w", err)
	}
	for _, e := range entries {
		if e.Name() != filepath.Base(s.cfg.Socket) {
			return fmt.Errorf("bindserver: %s must hold only the socket (it is mounted into GPU containers), but it holds %q", dir, e.Name())
		}
	}
	if err := os.Remove(s.cfg.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("bindserver: removing the old socket: %w", err)
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: s.cfg.Socket, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("bindserver: %w", err)
	}
	// Every process of a GPU container must reach it, whatever its user: who the
	// caller is comes from the kernel, not from the file's permissions.
	if err := os.Chmod(s.cfg.Socket, 0o666); err != nil {
		l.Close()
		return fmt.Errorf("bindserver: %w", err)
	}
	s.mu.Lock()
	s.l = l
	s.mu.Unlock()
	return nil
}

// Serving reports whether the socket is listening.
func (s *Server) Serving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.l != nil && !s.closed
}

// Run serves until ctx is done, calling Listen first if it was not called.
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	l := s.l
	s.mu.Unlock()
	if l == nil {
		if err := s.Listen(); err != nil {
			return err
		}
		l = s.l
	}
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		l.Close()
	}()
	s.cfg.Log.Info("serving the fallback binding", "socket", s.cfg.Socket)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				_ = os.Remove(s.cfg.Socket)
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				s.cfg.Log.Error(err, "accepting a caller; retrying")
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return fmt.Errorf("bindserver: accept: %w", err)
		}
		// Who the caller is decides whose bound the connection counts against; the
		// accept loop itself never waits for a slot.
		who := s.identify(c)
		key := who.id.Cgroup
		if !s.slots.enter(key, s.cfg.MaxOpenPerContainer) {
			s.refuseOpen(c, who)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.slots.leave(key)
			s.serve(ctx, c, who)
		}()
	}
}

// caller is what the kernel says about a connection's peer.
type caller struct {
	pid int
	id  Identity
	// err says why the caller cannot be placed in a container; it is the reply to
	// its request.
	err error
}

// identify reads the connection's peer: its PID, its cgroup and the container that
// names.
func (s *Server) identify(c *net.UnixConn) caller {
	pid, pidfd, err := s.peer(c)
	if err != nil {
		return caller{err: fmt.Errorf("reading the caller's credentials: %w", err)}
	}
	if pidfd >= 0 {
		defer unix.Close(pidfd)
	}
	if pid <= 0 {
		return caller{err: &refusal{reason: "the caller's process is not visible to the node agent (run the agent in the host's PID namespace)"}}
	}
	raw, err := os.ReadFile(filepath.Join(s.cfg.ProcRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return caller{pid: pid, err: &refusal{reason: fmt.Sprintf("cannot read the cgroup of the calling process %d: %v", pid, err)}}
	}
	// The PID named a live process when the cgroup was read only if the process the
	// connection came from is still alive now: a reused PID is caught here.
	if pidfd >= 0 {
		if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
			return caller{pid: pid, err: &refusal{reason: fmt.Sprintf("the calling process %d exited before it could be identified", pid)}}
		}
	}
	id, err := IdentifyProcess(string(raw))
	if err != nil {
		return caller{pid: pid, err: &refusal{reason: "unknown cgroup: " + err.Error()}}
	}
	return caller{pid: pid, id: id}
}

// refuseOpen answers a connection over its container's bound on open connections.
// No event: a container that floods the socket would flood its pod's events too.
func (s *Server) refuseOpen(c *net.UnixConn, who caller) {
	reason := fmt.Sprintf("container %s already holds %d connections to the node agent", shortID(who.id.ContainerID), s.cfg.MaxOpenPerContainer)
	if who.err != nil {
		reason = fmt.Sprintf("%d connections from processes in no known container are open already", s.cfg.MaxOpenPerContainer)
	}
	s.cfg.Log.V(1).Info("fallback binding refused", "reason", reason, "pid", who.pid)
	answer := func() {
		defer c.Close()
		// Let the caller's request arrive first: replying and closing before it is
		// sent would make the hook report a broken pipe instead of the reason.
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		buf := make([]byte, 64)
		_, _ = c.Read(buf)
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = c.Write([]byte("error " + oneLine(reason) + "\n"))
	}
	select {
	case s.refusers <- struct{}{}:
		go func() {
			defer func() { <-s.refusers }()
			answer()
		}()
	default:
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
		_, _ = c.Write([]byte("error " + oneLine(reason) + "\n"))
		c.Close()
	}
}

// refusal is a reason the hook prints and the pod's event repeats.
type refusal struct {
	pod       *corev1.Pod
	container string
	reason    string
}

func (r *refusal) Error() string { return r.reason }

func (s *Server) serve(ctx context.Context, c *net.UnixConn, who caller) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(s.cfg.RequestTimeout))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != Request {
		if err != nil {
			s.cfg.Log.V(1).Info("a caller sent no request", "error", err.Error())
			return
		}
		s.reply(c, nil, &refusal{reason: fmt.Sprintf("the agent expected %q", strings.TrimSpace(Request))})
		return
	}
	if who.err != nil {
		s.reply(c, nil, who.err)
		return
	}
	wait := s.cfg.StatusWait + 10*time.Second
	_ = c.SetDeadline(time.Now().Add(wait))
	slotCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if !s.slots.acquire(slotCtx, who.id.Cgroup) {
		if ctx.Err() != nil {
			return
		}
		s.reply(c, nil, fmt.Errorf("the node agent is busy: no free slot after %s", wait))
		return
	}
	defer s.slots.release(who.id.Cgroup)
	limits, err := s.bind(ctx, who)
	s.reply(c, limits, err)
}

func (s *Server) reply(c *net.UnixConn, limits []byte, err error) {
	if err != nil {
		var r *refusal
		reason := err.Error()
		if errors.As(err, &r) {
			s.cfg.Log.Info("fallback binding refused", "reason", r.reason)
			if s.cfg.OnRefused != nil {
				s.cfg.OnRefused(r.pod, r.container, r.reason)
			}
		} else {
			s.cfg.Log.Error(err, "fallback binding failed")
		}
		_, _ = c.Write([]byte("error " + oneLine(reason) + "\n"))
		return
	}
	fd, err := sealedMemfd(limits)
	if err != nil {
		s.cfg.Log.Error(err, "fallback binding: sealing the limits")
		_, _ = c.Write([]byte("error the node agent could not pass the limits: " + oneLine(err.Error()) + "\n"))
		return
	}
	defer unix.Close(fd)
	if _, _, err := c.WriteMsgUnix([]byte(fmt.Sprintf("ok %d\n", len(limits))), unix.UnixRights(fd), nil); err != nil {
		s.cfg.Log.Error(err, "fallback binding: replying")
	}
}

// oneLine keeps a reason to one printable line of bounded length.
func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = ' '
		}
	}
	if len(b) > 900 {
		b = append(b[:897], "..."...)
	}
	return string(b)
}

// bind identifies the caller and returns its container's limits file.
func (s *Server) bind(ctx context.Context, who caller) ([]byte, error) {
	id, pid := who.id, who.pid
	pod := s.cfg.Pods.PodByUID(id.PodUID)
	if pod == nil {
		return nil, &refusal{reason: fmt.Sprintf("pod %s (from the caller's cgroup %s) is not a pod of this node", id.PodUID, id.Cgroup)}
	}
	name, pod, err := s.containerName(ctx, id)
	if err != nil {
		return nil, err
	}
	s.forgetDeletedPods()
	e, err := s.cfg.Binder.Bind(binding.Request{
		PodUID: id.PodUID, Namespace: pod.Namespace, Pod: pod.Name, PodAnnotations: pod.Annotations,
		Container: name, ContainerID: id.ContainerID, CgroupsPath: id.Cgroup,
		// The socket reaches only containers the device plugin's Allocate gave it,
		// that is containers that asked for GPUs: one without a grant is refused.
		Env:     []string{deviceplugin.EnvRequested + "=1"},
		Started: true,
	})
	var refused *binding.RefusedError
	if errors.As(err, &refused) {
		return nil, &refusal{pod: pod, container: name, reason: refused.Reason}
	}
	if err != nil {
		return nil, err
	}
	if e == nil || len(e.Limits) == 0 {
		return nil, &refusal{pod: pod, container: name, reason: fmt.Sprintf("container %q of pod %s/%s has no GPU assignment", name, pod.Namespace, pod.Name)}
	}
	s.cfg.Log.Info("container bound at its first CUDA call", "namespace", pod.Namespace, "pod", pod.Name, "container", name,
		"id", id.ContainerID, "pid", pid)
	return e.Limits, nil
}

// containerName finds the container's name in its pod's status, waiting (bounded) for
// kubelet to report a container that has just started.
func (s *Server) containerName(ctx context.Context, id Identity) (string, *corev1.Pod, error) {
	deadline := time.Now().Add(s.cfg.StatusWait)
	for {
		pod := s.cfg.Pods.PodByUID(id.PodUID)
		if pod == nil {
			return "", nil, &refusal{reason: fmt.Sprintf("pod %s is no longer on this node", id.PodUID)}
		}
		if name := ContainerByID(pod, id.ContainerID); name != "" {
			return name, pod, nil
		}
		if time.Now().After(deadline) {
			return "", nil, &refusal{pod: pod, reason: fmt.Sprintf("container %s of pod %s/%s does not appear in the pod's status after %s; "+
				"kubelet has not reported it yet or it is not this pod's", shortID(id.ContainerID), pod.Namespace, pod.Name, s.cfg.StatusWait)}
		}
		select {
		case <-ctx.Done():
			return "", nil, errors.New("the node agent is stopping")
		case <-time.After(s.cfg.StatusPoll):
		}
	}
}

// ContainerByID returns the name of the pod's container (init, regular or ephemeral)
// whose current instance has this runtime id, or "".
func ContainerByID(pod *corev1.Pod, id string) string {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, cs := range list {
			if _, cid, ok := strings.Cut(cs.ContainerID, "://"); ok && cid == id {
				return cs.Name
			}
		}
	}
	return ""
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// Reconcile forgets the bound containers that are gone: their pod left this node, or
// the pod's status no longer has their id (the container was restarted as a new
// one). Call it only with a synchronised pod cache.
func (s *Server) Reconcile() []error {
	var errs []error
	for _, r := range s.cfg.Binder.Records() {
		pod := s.cfg.Pods.PodByUID(r.PodUID)
		if pod != nil && ContainerByID(pod, r.ContainerID) != "" {
			continue
		}
		if err := s.cfg.Binder.Unbind(r.ContainerID); err != nil {
			errs = append(errs, err)
			continue
		}
		s.cfg.Log.V(1).Info("forgot a container that is gone", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container, "id", r.ContainerID)
	}
	return errs
}

// forgetDeletedPods forgets the bound containers of pods that are no longer on this
// node, before a container is bound: until the periodic Reconcile they would still
// hold their compute windows, and the new container's window would be placed around
// them (in the worst case over a running container's, when they leave no room). Only
// deleted pods: a container of a pod that is still there may just not be in the
// cache's status yet, which Reconcile's later pass judges.
func (s *Server) forgetDeletedPods() {
	for _, r := range s.cfg.Binder.Records() {
		if s.cfg.Pods.PodByUID(r.PodUID) != nil {
			continue
		}
		if err := s.cfg.Binder.Unbind(r.ContainerID); err != nil {
			s.cfg.Log.Error(err, "forgetting a container of a deleted pod", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container)
			continue
		}
		s.cfg.Log.V(1).Info("forgot a container of a deleted pod", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container, "id", r.ContainerID)
	}
}

// peerCredentials returns the peer's PID and, where the kernel has SO_PEERPIDFD
// (Linux 6.5), a pidfd of the very process that connected; otherwise a pidfd opened
// now (a small window for PID reuse remains), or -1 without pidfd support.
func peerCredentials(c *net.UnixConn) (int, int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, -1, err
	}
	pid, pidfd := 0, -1
	var opErr error
	err = rc.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			opErr = err
			return
		}
		pid = int(cred.Pid)
		if p, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
			pidfd = p
		}
	})
	if err != nil {
		return 0, -1, err
	}
	if opErr != nil {
		return 0, -1, opErr
	}
	if pidfd < 0 && pid > 0 {
		if p, err := unix.PidfdOpen(pid, 0); err == nil {
			pidfd = p
		}
	}
	return pid, pidfd, nil
}

// sealedMemfd returns a memfd holding data that can no longer be written, grown,
// shrunk or unsealed.
func sealedMemfd(data []byte) (int, error) {
	fd, err := unix.MemfdCreate("tessera-limits", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	for off := 0; off < len(data); {
		n, err := unix.Write(fd, data[off:])
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("writing the memfd: %w", err)
		}
		off += n
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sealing the memfd: %w", err)
	}
	return fd, nil
}

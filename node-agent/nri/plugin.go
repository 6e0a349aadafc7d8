// Package nri is the node agent's NRI plugin: the runtime (containerd or CRI-O) calls
// it at every container creation, and it applies the binding package's decision to
// the container's spec (device nodes and device cgroup, environment, read-only mounts)
// or fails the creation with the binding's reason.
package nri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	nriapi "github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr"

	"github.com/tessera-dev/tessera/node-agent/binding"
)

// DefaultSocket is where containerd and CRI-O serve NRI.
const DefaultSocket = "/var/run/nri/nri.sock"

// Plugin is the NRI plugin.
type Plugin struct {
	binder *binding.Binder
	log    logr.Logger
	socket string
	// Name and Index order the plugin among the runtime's plugins. Tessera runs late
	// (a high index) so that its device list is what the container ends with.
	Name, Index string
	// OnRefused is told of every refused container (for events and metrics).
	OnRefused func(namespace, pod, container, reason string)
	// dial, when set, replaces the stub's dialer (tests use it to drop the
	// connection as a dying runtime would).
	dial func(string) (net.Conn, error)
	// connected is signalled after each synchronisation with the runtime, for tests.
	connected chan struct{}

	// stateMu guards the connection state the health probes read.
	stateMu  sync.Mutex
	isUp     bool
	upChange time.Time // when isUp last changed (or Run started)
	lastErr  error
}

func (p *Plugin) setConnected(up bool, err error) {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	if up != p.isUp || p.upChange.IsZero() {
		p.upChange = time.Now()
	}
	p.isUp = up
	if err != nil || up {
		p.lastErr = err
	}
}

// Connected says whether the plugin is connected to the runtime (synchronised), since
// when that state holds (the start of Run before the first connection), and the last
// connection error. A zero time means Run has not started.
func (p *Plugin) Connected() (bool, time.Time, error) {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	return p.isUp, p.upChange, p.lastErr
}

// New returns a plugin that will connect to socket.
func New(b *binding.Binder, socket string, log logr.Logger) *Plugin {
	if socket == "" {
		socket = DefaultSocket
	}
	return &Plugin{binder: b, log: log, socket: socket, Name: "tessera", Index: "90", connected: make(chan struct{}, 8)}
}

// Run connects to the runtime and serves it until ctx is done, reconnecting when the
// runtime restarts (the connection drops).
func (p *Plugin) Run(ctx context.Context) error {
	backoff := time.Second
	p.setConnected(false, nil)
	for ctx.Err() == nil {
		opts := []stub.Option{stub.WithPluginName(p.Name), stub.WithPluginIdx(p.Index), stub.WithSocketPath(p.socket),
			stub.WithOnClose(func() {
				p.setConnected(false, errors.New("connection closed by the runtime"))
				p.log.Info("NRI connection closed")
			}), stub.WithLogger(nriLogger{p.log.WithName("nri-lib")})}
		if p.dial != nil {
			opts = append(opts, stub.WithDialer(p.dial))
		}
		s, err := stub.New(p, opts...)
		if err != nil {
			return fmt.Errorf("NRI plugin: %w", err)
		}
		start := time.Now()
		err = s.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("connection closed")
		}
		p.setConnected(false, err)
		if time.Since(start) > time.Minute {
			backoff = time.Second
		}
		p.log.Info("NRI runtime not reachable or went away; reconnecting", "socket", p.socket, "error", fmt.Sprint(err), "retryIn", backoff.String())
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		if backoff < 30*time.Second {
			backoff *= 2
		}
	}
	return nil
}

func request(pod *nriapi.PodSandbox, ctr *nriapi.Container) binding.Request {
	r := binding.Request{ContainerID: ctr.GetId(), Container: ctr.GetName(), Env: ctr.GetEnv()}
	if pod != nil {
		r.PodUID, r.Namespace, r.Pod, r.PodAnnotations = pod.GetUid(), pod.GetNamespace(), pod.GetName(), pod.GetAnnotations()
	}
	if l := ctr.GetLinux(); l != nil {
		r.CgroupsPath = l.GetCgroupsPath()
	}
	return r
}

// Synchronize receives every pod and container the runtime has when the plugin
// connects: the moment to forget containers that went away while the agent was down
// and to rebuild records a lost checkpoint no longer has.
func (p *Plugin) Synchronize(_ context.Context, pods []*nriapi.PodSandbox, ctrs []*nriapi.Container) ([]*nriapi.ContainerUpdate, error) {
	byID := make(map[string]*nriapi.PodSandbox, len(pods))
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	var live []binding.Request
	for _, c := range ctrs {
		switch c.GetState() {
		case nriapi.ContainerState_CONTAINER_STOPPED:
			continue
		}
		live = append(live, request(byID[c.GetPodSandboxId()], c))
	}
	for _, err := range p.binder.Reconcile(live) {
		p.log.Error(err, "reconciling a running container")
	}
	p.setConnected(true, nil)
	p.log.Info("synchronised with the runtime", "pods", len(pods), "containers", len(ctrs), "bound", len(p.binder.Records()))
	select {
	case p.connected <- struct{}{}:
	default:
	}
	return nil, nil
}

// CreateContainer binds a Tessera container or refuses it; others pass untouched.
func (p *Plugin) CreateContainer(_ context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container) (*nriapi.ContainerAdjustment, []*nriapi.ContainerUpdate, error) {
	start := time.Now()
	r := request(pod, ctr)
	e, err := p.binder.Bind(r)
	if err != nil {
		var refused *binding.RefusedError
		if errors.As(err, &refused) {
			p.log.Info("container refused", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container, "reason", refused.Reason)
			if p.OnRefused != nil {
				p.OnRefused(r.Namespace, r.Pod, r.Container, refused.Reason)
			}
		} else {
			p.log.Error(err, "binding failed", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container)
		}
		// The error fails the creation; kubelet reports it on the pod.
		return nil, nil, err
	}
	if e == nil {
		return nil, nil, nil
	}
	adj := &nriapi.ContainerAdjustment{}
	for _, d := range e.Devices {
		mode := d.FileMode
		adj.AddDevice(&nriapi.LinuxDevice{
			Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor,
			FileMode: &nriapi.OptionalFileMode{Value: mode}, Uid: &nriapi.OptionalUInt32{Value: d.UID}, Gid: &nriapi.OptionalUInt32{Value: d.GID},
		})
	}
	for _, kv := range e.Env {
		adj.AddEnv(kv[0], kv[1])
	}
	for _, m := range e.Mounts {
		opts := []string{"bind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		adj.AddMount(&nriapi.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: opts})
	}
	p.log.Info("container bound", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container, "id", r.ContainerID, "devices", len(e.Devices),
		"took", time.Since(start).String())
	return adj, nil, nil
}

// RemoveContainer forgets a container and its limits.
func (p *Plugin) RemoveContainer(_ context.Context, _ *nriapi.PodSandbox, ctr *nriapi.Container) error {
	if err := p.binder.Unbind(ctr.GetId()); err != nil {
		p.log.Error(err, "forgetting a removed container", "id", ctr.GetId())
	}
	return nil
}

// nriLogger sends the NRI library's log lines to the agent's logger, so that the agent
// has one log format (the library logs through logrus otherwise).
type nriLogger struct{ log logr.Logger }

func (l nriLogger) Debugf(_ context.Context, f string, a ...any) {
	l.log.V(2).Info(fmt.Sprintf(f, a...))
}
func (l nriLogger) Infof(_ context.Context, f string, a ...any) {
	l.log.V(1).Info(fmt.Sprintf(f, a...))
}
func (l nriLogger) Warnf(_ context.Context, f string, a ...any) {
	l.log.Info(fmt.Sprintf(f, a...), "level", "warning")
}
func (l nriLogger) Errorf(_ context.Context, f string, a ...any) {
	l.log.Error(nil, fmt.Sprintf(f, a...))
}

// SPDX-License-Identifier: Apache-2.0

// Package nri is the node agent's NRI plugin: the runtime (containerd or CRI-O) calls
// it at every container creation, and it applies the binding package's decision to
// the container's spec (CDI devices or device nodes and device cgroup, environment,
// bind mounts and the container's own region tmpfs) or fails the creation with the
// binding's reason.
package nri

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	nriapi "github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/util/wait"

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
	// Backoff paces reconnection after the runtime goes away or cannot be reached
	// (DefaultBackoff from New); it starts again from its first step after a
	// connection that lasted a minute.
	Backoff wait.Backoff
	// dial, when set, replaces the stub's dialer (tests use it to drop the
	// connection as a dying runtime would).
	dial func(string) (net.Conn, error)
	// connected is signalled after each synchronisation with the runtime, for tests.
	connected chan struct{}
	// ResolveCDI, when set, turns CDI device names into the edits a runtime makes
	// for them (package cdi's Generator.Resolve). It is used for runtimes that do
	// not apply the CDI devices an NRI plugin names (see cdiNative).
	ResolveCDI func(names []string) (*rspec.Spec, error)

	// CDIKind, when set, is the kind of Tessera's CDI devices (tessera.dev/gpu).
	// Runtimes also inject the CDI devices that "cdi.k8s.io/" annotations name; a
	// container whose pod or own annotations ask for a device of this kind is
	// refused: only the binding gives them, with limits.
	CDIKind string

	// runtimeMu guards what the runtime said of itself at the last connection.
	runtimeMu               sync.Mutex
	runtimeName, runtimeVer string

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

// DefaultBackoff waits 1s before reconnecting, doubling to 30s, each wait up to 10%
// longer at random so that reconnections do not fall in step with the runtime's other
// plugins.
var DefaultBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}

// New returns a plugin that will connect to socket.
func New(b *binding.Binder, socket string, log logr.Logger) *Plugin {
	if socket == "" {
		socket = DefaultSocket
	}
	return &Plugin{binder: b, log: log, socket: socket, Name: "tessera", Index: "90", Backoff: DefaultBackoff, connected: make(chan struct{}, 8)}
}

// Run connects to the runtime and serves it until ctx is done, reconnecting when the
// runtime restarts (the connection drops).
func (p *Plugin) Run(ctx context.Context) error {
	backoff := p.Backoff
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
			backoff = p.Backoff
		}
		delay := backoff.Step()
		p.log.Info("NRI runtime not reachable or went away; reconnecting", "socket", p.socket, "error", fmt.Sprint(err), "retryIn", delay.String())
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
	return nil
}

// Configure learns which runtime the plugin talks to; the events are the default ones
// (those the plugin implements).
func (p *Plugin) Configure(_ context.Context, _, runtime, version string) (nriapi.EventMask, error) {
	p.runtimeMu.Lock()
	p.runtimeName, p.runtimeVer = runtime, version
	p.runtimeMu.Unlock()
	mode := "runtime resolves CDI devices"
	if !cdiNative(runtime, version) {
		mode = "the agent resolves CDI devices into device nodes, mounts, environment and hooks"
	}
	p.log.Info("connected to the runtime", "runtime", runtime, "version", version, "cdi", mode)
	return 0, nil
}

// cdiNative says whether the runtime applies the CDI devices an NRI adjustment names:
// containerd 2.1 and later do; containerd 2.0 and 1.7 (before the fix of containerd
// PR 12650) drop them without an error, and other runtimes are not relied on for it.
func cdiNative(runtime, version string) bool {
	if runtime != "containerd" {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(version, "v"), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 2 || major == 2 && minor >= 1
}

// addCDI puts the container's CDI devices into the adjustment: by name where the
// runtime applies them, otherwise as the edits they stand for.
func (p *Plugin) addCDI(adj *nriapi.ContainerAdjustment, names []string) error {
	p.runtimeMu.Lock()
	native := cdiNative(p.runtimeName, p.runtimeVer)
	p.runtimeMu.Unlock()
	if native || p.ResolveCDI == nil {
		for _, name := range names {
			adj.AddCDIDevice(&nriapi.CDIDevice{Name: name})
		}
		return nil
	}
	spec, err := p.ResolveCDI(names)
	if err != nil {
		return err
	}
	if spec.Linux != nil {
		for _, d := range nriapi.FromOCILinuxDevices(spec.Linux.Devices) {
			adj.AddDevice(d)
		}
	}
	for _, m := range nriapi.FromOCIMounts(spec.Mounts) {
		if m.Type == "" {
			m.Type = "bind"
		}
		adj.AddMount(m)
	}
	if spec.Process != nil {
		for _, kv := range nriapi.FromOCIEnv(spec.Process.Env) {
			adj.AddEnv(kv.Key, kv.Value)
		}
	}
	if h := nriapi.FromOCIHooks(spec.Hooks); h != nil {
		adj.AddHooks(h)
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

// fence sets the driver's memory fence of a bound container (its record) or of a
// container that uses DRA claims (its mounts).
func (p *Plugin) fence(r binding.Request, ms [][2]string) error {
	if err := p.binder.FenceContainer(r.ContainerID); err != nil {
		return err
	}
	return p.binder.FenceClaimContainer(r, ms)
}

// mounts are the container's mounts as source, destination pairs.
func mounts(ctr *nriapi.Container) [][2]string {
	var ms [][2]string
	for _, m := range ctr.GetMounts() {
		ms = append(ms, [2]string{m.GetSource(), m.GetDestination()})
	}
	return ms
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
	var liveMounts [][][2]string
	for _, c := range ctrs {
		switch c.GetState() {
		case nriapi.ContainerState_CONTAINER_STOPPED:
			continue
		}
		r := request(byID[c.GetPodSandboxId()], c)
		r.Running = true
		ms := mounts(c)
		for _, m := range ms {
			r.Mounts = append(r.Mounts, m[1])
		}
		live = append(live, r)
		liveMounts = append(liveMounts, ms)
	}
	for _, err := range p.binder.Reconcile(live) {
		p.log.Error(err, "reconciling a running container")
	}
	// Containers that started while the agent was away (or under an agent that set
	// no fence) get the driver's fence now; a running container cannot be refused.
	for i, r := range live {
		if err := p.fence(r, liveMounts[i]); err != nil {
			p.log.Error(err, "setting the memory fence of a running container", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container)
		}
	}
	p.setConnected(true, nil)
	p.log.Info("synchronised with the runtime", "pods", len(pods), "containers", len(ctrs), "bound", len(p.binder.Records()))
	select {
	case p.connected <- struct{}{}:
	default:
	}
	return nil, nil
}

// CDIAnnotationPrefix is the annotation prefix through which containerd and CRI-O
// inject CDI devices (the form before the CRI's CDIDevices field).
const CDIAnnotationPrefix = "cdi.k8s.io/"

// annotatedCDI returns why a container asks the runtime for one of Tessera's CDI
// devices through an annotation, or "".
func (p *Plugin) annotatedCDI(pod *nriapi.PodSandbox, ctr *nriapi.Container) string {
	if p.CDIKind == "" {
		return ""
	}
	for _, anns := range []map[string]string{pod.GetAnnotations(), ctr.GetAnnotations()} {
		for k, v := range anns {
			if strings.HasPrefix(k, CDIAnnotationPrefix) && strings.Contains(v, p.CDIKind+"=") {
				return fmt.Sprintf("its annotation %s asks the runtime for %s devices (%s); only Tessera's binding gives those, "+
					"with the limits of the pod's GPU assignment. Ask for %s in the container's resources instead", k, p.CDIKind, v, p.CDIKind)
			}
		}
	}
	return ""
}

// CreateContainer binds a Tessera container or refuses it; others pass untouched.
func (p *Plugin) CreateContainer(_ context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container) (*nriapi.ContainerAdjustment, []*nriapi.ContainerUpdate, error) {
	start := time.Now()
	r := request(pod, ctr)
	var e *binding.Edits
	var err error
	if why := p.annotatedCDI(pod, ctr); why != "" {
		err = &binding.RefusedError{Reason: fmt.Sprintf("container %q of pod %s/%s: %s", r.Container, r.Namespace, r.Pod, why)}
	} else {
		e, err = p.binder.Bind(r)
	}
	if err != nil {
		p.report(r, err, "container refused", "binding failed")
		// The error fails the creation; kubelet reports it on the pod.
		return nil, nil, err
	}
	if e == nil {
		return nil, nil, nil
	}
	adj := &nriapi.ContainerAdjustment{}
	if len(e.CDIDevices) > 0 {
		if err := p.addCDI(adj, e.CDIDevices); err != nil {
			p.log.Error(err, "resolving CDI devices", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container)
			// The container must not start without its GPUs and driver.
			return nil, nil, fmt.Errorf("Tessera could not resolve the container's CDI devices: %w", err)
		}
	}
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
		if m.Type != "" {
			// A file system of the container's own (its region directory).
			adj.AddMount(&nriapi.Mount{Source: m.Source, Destination: m.Destination, Type: m.Type, Options: append([]string(nil), m.Options...)})
			continue
		}
		// rw, the default of a bind mount, said outright: the GPU turns directory is
		// mounted so on purpose.
		opts := []string{"bind", "nosuid", "nodev", "rw"}
		if m.ReadOnly {
			opts[3] = "ro"
		}
		adj.AddMount(&nriapi.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: opts})
	}
	p.log.Info("container bound", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container, "id", r.ContainerID, "devices", len(e.Devices),
		"cdiDevices", e.CDIDevices, "took", time.Since(start).String())
	return adj, nil, nil
}

// StartContainer sets the driver's memory fence on the cgroup of a bound container,
// or of a container that uses DRA claims (found by the claims' limits mounts). The
// runtime calls it after it has created the container (runc create: the cgroup
// exists, the container's process waits to exec) and before it starts it; an error
// fails the start, so a container whose fence cannot be set never runs. (At
// CreateContainer and PostCreateContainer the cgroup does not exist yet.)
func (p *Plugin) StartContainer(_ context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container) error {
	r := request(pod, ctr)
	err := p.fence(r, mounts(ctr))
	if err == nil {
		return nil
	}
	p.report(r, err, "container refused at start", "setting the memory fence failed")
	return err
}

// report logs why a container was not let through: a refusal (the agent's decision,
// also handed to OnRefused for the pod's event) or a failure of the agent itself.
func (p *Plugin) report(r binding.Request, err error, refusedMsg, failedMsg string) {
	var refused *binding.RefusedError
	if errors.As(err, &refused) {
		p.log.Info(refusedMsg, "namespace", r.Namespace, "pod", r.Pod, "container", r.Container, "reason", refused.Reason)
		if p.OnRefused != nil {
			p.OnRefused(r.Namespace, r.Pod, r.Container, refused.Reason)
		}
		return
	}
	p.log.Error(err, failedMsg, "namespace", r.Namespace, "pod", r.Pod, "container", r.Container)
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

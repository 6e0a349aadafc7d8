// SPDX-License-Identifier: Apache-2.0

// Package deviceplugin is the node agent's kubelet device plugin (API v1beta1). It
// advertises the GPU-count resource (tessera.dev/gpu by default) so that kubelet's
// accounting holds, reports health through ListAndWatch, and re-registers when kubelet
// restarts.
//
// Every schedulable GPU (a whole GPU, or a MIG instance of a GPU in MIG mode) is
// advertised as Replicas devices, because many containers share one GPU and each asks
// for tessera.dev/gpu: 1. Which devices kubelet hands a container therefore says
// nothing about which GPU it gets: Allocate never decides or guesses that. The
// scheduler's assignment annotation does, and the NRI binding enforces it.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-dev/tessera/api"
)

// EnvRequested is set by Allocate in every container that asked for the GPU resource.
// The NRI binding reads it from the container's environment to refuse a container that
// asked for GPUs but has no assignment. A tenant who sets it by hand only gets their
// own container refused.
const EnvRequested = "TESSERA_GPU_REQUESTED"

// Config configures the plugin.
type Config struct {
	// ResourceName is the extended resource advertised, e.g. tessera.dev/gpu.
	ResourceName string
	// Dir is kubelet's device-plugin directory, holding kubelet.sock.
	Dir string
	// Socket is this plugin's socket file name inside Dir.
	Socket string
	// Replicas is how many containers may share one GPU, as kubelet counts them.
	Replicas int
	// Allocate, when set, adds to each container's response (the fallback binding
	// mounts the hook and the agent socket there). It must not depend on which device
	// ids kubelet picked. An error fails the allocation (kubelet retries the pod).
	Allocate func(*pluginapi.ContainerAllocateResponse) error
	// CheckInterval is how often kubelet's restart is checked for when the
	// device-plugin directory cannot be watched.
	CheckInterval time.Duration
	// Backoff paces the attempts to register after a failure; it starts again from
	// its first step after each registration. Zero: DefaultBackoff.
	Backoff wait.Backoff
	Log     logr.Logger
}

// DefaultBackoff waits 1s after a failed registration, doubling to 30s, each wait up
// to 10% longer at random so that retries do not fall in step with other clients of
// the same kubelet.
var DefaultBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}

// Plugin is the device plugin.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	cfg Config

	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{} // closed and replaced when devices change

	registered chan struct{} // signalled after each successful registration, for tests

	// newWatcher starts the watch of kubelet's directory (fsnotify.NewWatcher; tests
	// make it fail to exercise the polling).
	newWatcher func() (*fsnotify.Watcher, error)

	// regMu guards the registration state the readiness probe reads.
	regMu     sync.Mutex
	regOK     bool
	regErr    error
	regChange time.Time
}

func (p *Plugin) setRegistered(ok bool, err error) {
	p.regMu.Lock()
	defer p.regMu.Unlock()
	if ok != p.regOK || p.regChange.IsZero() {
		p.regChange = time.Now()
	}
	p.regOK, p.regErr = ok, err
}

// Registered says whether the plugin is registered with the current kubelet, since
// when that state holds, and the last registration error.
func (p *Plugin) Registered() (bool, time.Time, error) {
	p.regMu.Lock()
	defer p.regMu.Unlock()
	return p.regOK, p.regChange, p.regErr
}

// New checks cfg and returns a plugin with no devices until Update is called.
func New(cfg Config) (*Plugin, error) {
	if cfg.ResourceName == "" || !strings.Contains(cfg.ResourceName, "/") {
		return nil, fmt.Errorf("device plugin: resource name %q must be domain-qualified", cfg.ResourceName)
	}
	if cfg.Replicas < 1 || cfg.Replicas > 1024 {
		return nil, fmt.Errorf("device plugin: replicas %d out of range 1..1024", cfg.Replicas)
	}
	if cfg.Dir == "" {
		cfg.Dir = pluginapi.DevicePluginPath
	}
	if cfg.Socket == "" {
		cfg.Socket = "tessera-gpu.sock"
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = time.Second
	}
	if cfg.Backoff.Duration <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	return &Plugin{cfg: cfg, changed: make(chan struct{}), registered: make(chan struct{}, 16), newWatcher: fsnotify.NewWatcher}, nil
}

// DeviceID names replica k of a GPU or MIG instance.
func DeviceID(uuid string, k int) string { return fmt.Sprintf("%s::%d", uuid, k) }

// Devices turns an inventory into the advertised device list: Replicas devices per
// whole GPU and per MIG instance, unhealthy when their GPU is.
func Devices(inv *api.NodeInventory, replicas int) []*pluginapi.Device {
	var out []*pluginapi.Device
	add := func(uuid string, g *api.GPU) {
		health := pluginapi.Healthy
		if !g.Healthy {
			health = pluginapi.Unhealthy
		}
		var topo *pluginapi.TopologyInfo
		if g.NUMANode >= 0 {
			topo = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMANode)}}}
		}
		for k := 0; k < replicas; k++ {
			out = append(out, &pluginapi.Device{ID: DeviceID(uuid, k), Health: health, Topology: topo})
		}
	}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		if g.MIG != nil {
			for _, m := range g.MIG.Instances {
				add(m.UUID, g)
			}
			continue
		}
		add(g.UUID, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Update replaces the advertised devices; open ListAndWatch streams send the new list.
func (p *Plugin) Update(inv *api.NodeInventory) {
	devs := Devices(inv, p.cfg.Replicas)
	p.mu.Lock()
	defer p.mu.Unlock()
	if sameDevices(p.devices, devs) {
		return
	}
	p.devices = devs
	close(p.changed)
	p.changed = make(chan struct{})
}

func sameDevices(a, b []*pluginapi.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Health != b[i].Health {
			return false
		}
	}
	return true
}

func (p *Plugin) snapshot() ([]*pluginapi.Device, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devices, p.changed
}

// GetDevicePluginOptions says that no PreStart and no preferred allocation is needed:
// which replica kubelet picks does not matter.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list now and after every change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devs, changed := p.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// Allocate marks each container as having asked for GPUs. It binds nothing: which
// GPUs a container gets is the scheduler's assignment, applied at container creation.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	devs, _ := p.snapshot()
	known := make(map[string]string, len(devs))
	for _, d := range devs {
		known[d.ID] = d.Health
	}
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		for _, id := range c.DevicesIds {
			if _, ok := known[id]; !ok {
				return nil, fmt.Errorf("allocate: unknown device %q", id)
			}
		}
		r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{EnvRequested: fmt.Sprint(len(c.DevicesIds))}}
		if p.cfg.Allocate != nil {
			if err := p.cfg.Allocate(r); err != nil {
				return nil, fmt.Errorf("allocate: %w", err)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	return resp, nil
}

// PreStartContainer is not requested (see GetDevicePluginOptions).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Run serves the plugin and keeps it registered with kubelet until ctx is done. When
// kubelet restarts it removes every plugin socket and re-creates kubelet.sock; either
// sign makes the plugin start a fresh server and register again.
func (p *Plugin) Run(ctx context.Context) error {
	log := p.cfg.Log
	backoff := p.cfg.Backoff
	for ctx.Err() == nil {
		srv, err := p.serve()
		if err != nil {
			return err // cannot listen at all: a configuration problem
		}
		kubelet := filepath.Join(p.cfg.Dir, filepath.Base(pluginapi.KubeletSocket))
		kubeletID, err := p.register(ctx, kubelet)
		if err != nil {
			p.setRegistered(false, err)
			delay := backoff.Step()
			log.Info("registration with kubelet failed; retrying", "error", err.Error(), "retryIn", delay.String())
			srv.Stop()
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
			continue
		}
		backoff = p.cfg.Backoff
		p.setRegistered(true, nil)
		log.Info("registered with kubelet", "resource", p.cfg.ResourceName, "socket", p.socketPath())
		select {
		case p.registered <- struct{}{}:
		default:
		}
		p.waitForKubeletRestart(ctx, kubelet, kubeletID)
		p.setRegistered(false, errors.New("kubelet restarted"))
		srv.Stop()
		if ctx.Err() == nil {
			log.Info("kubelet restarted; registering again")
		}
	}
	_ = os.Remove(p.socketPath())
	return nil
}

func (p *Plugin) socketPath() string { return filepath.Join(p.cfg.Dir, p.cfg.Socket) }

func (p *Plugin) serve() (*grpc.Server, error) {
	path := p.socketPath()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("device plugin: removing stale socket: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("device plugin: %w", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() {
		if err := srv.Serve(l); err != nil {
			p.cfg.Log.Error(err, "device plugin server stopped")
		}
	}()
	return srv, nil
}

// register registers the plugin with the kubelet listening on kubelet and returns the
// identity (fileID) of the socket file it reached that kubelet through, "" where that
// file was replaced while it connected.
//
// The identity is taken around the connect itself. Read before the registration,
// kubelet.sock may be a stopped kubelet's, or absent while a restarting kubelet
// cleans its directory; read after, it may be a newer kubelet's. Either way the
// plugin would mistake the kubelet it registered with (for a restart, and register
// twice with it; or for the newer one, and never register with that). Registering
// twice at one endpoint is not harmless: when the first registration's stream ends,
// kubelet drops every client of the endpoint, the new one included, and marks the
// resource's devices unhealthy, so its pods are refused until the next kubelet
// restart.
func (p *Plugin) register(ctx context.Context, kubelet string) (string, error) {
	var mu sync.Mutex
	var id string
	dial := func(ctx context.Context, _ string) (net.Conn, error) {
		before, _ := fileID(kubelet)
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", kubelet)
		if err == nil {
			after, _ := fileID(kubelet)
			mu.Lock()
			id = ""
			if before == after {
				id = after
			}
			mu.Unlock()
		}
		return c, err
	}
	// A restarting kubelet removes the plugin's socket just before it listens on
	// kubelet.sock, so the first dial usually finds no kubelet. gRPC's default
	// reconnect waits 1 s after it, and kubelet refuses every pod it admits meanwhile
	// ("no healthy devices"); 50 ms steps reach it as soon as it listens.
	conn, err := grpc.NewClient("passthrough:///kubelet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: grpcbackoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.cfg.Socket,
		ResourceName: p.cfg.ResourceName,
		Options:      &pluginapi.DevicePluginOptions{},
	}, grpc.WaitForReady(true))
	mu.Lock()
	defer mu.Unlock()
	return id, err
}

// waitForKubeletRestart returns when the plugin's socket is gone or kubelet.sock is
// another file than kubeletID, as NVIDIA's device plugin does: it watches the
// device-plugin directory through inotify (fsnotify) and checks both at every event
// there. Where the watch cannot be set up or fails (no inotify instance left, an
// event queue overflow, the directory itself removed), it checks every
// CheckInterval instead.
func (p *Plugin) waitForKubeletRestart(ctx context.Context, kubelet string, kubeletID string) {
	restarted := func() bool {
		if _, err := os.Stat(p.socketPath()); err != nil {
			return true
		}
		id, err := fileID(kubelet)
		return err == nil && id != kubeletID
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	var tick <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	poll := func(why error) {
		events, errs = nil, nil
		if ticker == nil {
			p.cfg.Log.Info("cannot watch kubelet's device-plugin directory; polling it", "dir", p.cfg.Dir, "interval", p.cfg.CheckInterval.String(), "error", why.Error())
			ticker = time.NewTicker(p.cfg.CheckInterval)
			tick = ticker.C
		}
	}
	w, err := p.newWatcher()
	if err == nil {
		defer w.Close()
		if err = w.Add(p.cfg.Dir); err == nil {
			events, errs = w.Events, w.Errors
		}
	}
	if err != nil {
		poll(err)
	}
	// A restart between the registration and the watch raised no event.
	if restarted() {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			switch {
			case !ok:
				poll(errors.New("the watch ended"))
			case ev.Name == p.cfg.Dir && ev.Has(fsnotify.Remove|fsnotify.Rename):
				poll(errors.New("the directory was removed"))
			}
		case err, ok := <-errs:
			if !ok {
				err = errors.New("the watch ended")
			}
			poll(err)
		case <-tick:
		}
		if restarted() {
			return
		}
	}
}

// fileID identifies one incarnation of a file. The inode alone is not enough: a file
// system may hand a re-created socket the inode number just freed.
func fileID(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%d/%d.%d", st.Ino, st.Ctim.Sec, st.Ctim.Nsec), nil
	}
	return fi.ModTime().String(), nil
}

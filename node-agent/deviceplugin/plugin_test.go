// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-dev/tessera/api"
)

// fakeKubelet is kubelet's registration service on a real unix socket.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	srv  *grpc.Server
	reqs chan *pluginapi.RegisterRequest
	// refuse is how many registrations to refuse before accepting; refused counts them.
	refuse, refused atomic.Int32
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if k.refused.Load() < k.refuse.Load() {
		k.refused.Add(1)
		return nil, errors.New("refused for the test")
	}
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	path := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{srv: grpc.NewServer(), reqs: make(chan *pluginapi.RegisterRequest, 4)}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	return k
}

func (k *fakeKubelet) await(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.reqs:
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("plugin did not register")
		return nil
	}
}

func inv(healthy ...bool) *api.NodeInventory {
	in := &api.NodeInventory{Version: 1}
	for i, h := range healthy {
		g := api.GPU{Index: i, UUID: "GPU-" + string(rune('a'+i)), Model: "T4", MemoryMiB: 15360, NUMANode: i, Healthy: h}
		in.GPUs = append(in.GPUs, g)
	}
	return in
}

func dialPlugin(t *testing.T, dir, endpoint string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func recvHealth(t *testing.T, s grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse]) map[string]string {
	t.Helper()
	r, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, d := range r.Devices {
		m[d.ID] = d.Health
	}
	return m
}

func TestRegisterListAllocateAndKubeletRestart(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	k := startKubelet(t, dir)
	// No polling within the test: the restarts are seen through the directory watch.
	p, err := New(Config{ResourceName: "tessera.dev/gpu", Dir: dir, Replicas: 3, CheckInterval: time.Hour, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	p.Update(inv(true, true))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()

	r := k.await(t)
	if r.Version != pluginapi.Version || r.ResourceName != "tessera.dev/gpu" || r.Endpoint != "tessera-gpu.sock" {
		t.Fatalf("register request %+v", r)
	}
	c := dialPlugin(t, dir, r.Endpoint)
	opts, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || opts.PreStartRequired || opts.GetPreferredAllocationAvailable {
		t.Fatalf("options %+v, %v", opts, err)
	}
	lw, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	h := recvHealth(t, lw)
	if len(h) != 6 || h["GPU-b::2"] != pluginapi.Healthy {
		t.Fatalf("devices %v", h)
	}
	// GPU b fails: its replicas turn unhealthy on the open stream.
	p.Update(inv(true, false))
	h = recvHealth(t, lw)
	if h["GPU-b::0"] != pluginapi.Unhealthy || h["GPU-a::0"] != pluginapi.Healthy {
		t.Fatalf("after failure: %v", h)
	}

	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-a::0", "GPU-a::1"}}, {DevicesIds: []string{"GPU-b::0"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 2 || resp.ContainerResponses[0].Envs[EnvRequested] != "2" ||
		len(resp.ContainerResponses[0].Devices) != 0 || len(resp.ContainerResponses[0].Mounts) != 0 {
		t.Fatalf("allocate: %+v", resp)
	}
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-z::0"}}}}); err == nil || !strings.Contains(err.Error(), "unknown device") {
		t.Fatalf("unknown device: %v", err)
	}

	// Kubelet restarts: it stops, wipes the plugin sockets, and comes back with a new
	// kubelet.sock. The plugin must notice and register again.
	k.srv.Stop()
	_ = os.Remove(filepath.Join(dir, "kubelet.sock"))
	_ = os.Remove(filepath.Join(dir, r.Endpoint))
	k2 := startKubelet(t, dir)
	r2 := k2.await(t)
	if r2.ResourceName != "tessera.dev/gpu" {
		t.Fatalf("re-register %+v", r2)
	}
	c2 := dialPlugin(t, dir, r2.Endpoint)
	lw2, err := c2.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if h := recvHealth(t, lw2); len(h) != 6 || h["GPU-b::1"] != pluginapi.Unhealthy {
		t.Fatalf("after restart: %v", h)
	}

	// Kubelet.sock replaced without the plugin socket being removed is a restart too.
	k2.srv.Stop()
	_ = os.Remove(filepath.Join(dir, "kubelet.sock"))
	k3 := startKubelet(t, dir)
	k3.await(t)

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, r.Endpoint)); !os.IsNotExist(err) {
		t.Error("plugin socket left behind")
	}
	k3.srv.Stop()
}

// Without a watch of kubelet's directory the plugin polls it, and still sees kubelet
// restart.
func TestKubeletRestartPolledWithoutWatch(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	p, _ := New(Config{ResourceName: "tessera.dev/gpu", Dir: dir, Replicas: 1, CheckInterval: 20 * time.Millisecond, Log: logr.Discard()})
	p.newWatcher = func() (*fsnotify.Watcher, error) { return nil, errors.New("too many open files") }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	k.await(t)
	k.srv.Stop()
	_ = os.Remove(filepath.Join(dir, "kubelet.sock"))
	k2 := startKubelet(t, dir)
	defer k2.srv.Stop()
	k2.await(t)
}

// Kubelet not up yet: the plugin keeps trying and registers once it appears.
func TestRegisterWhenKubeletAppearsLater(t *testing.T) {
	dir, _ := os.MkdirTemp("", "dp")
	defer os.RemoveAll(dir)
	p, _ := New(Config{ResourceName: "tessera.dev/gpu", Dir: dir, Replicas: 1, Log: logr.Discard()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	if ok, _, _ := p.Registered(); ok {
		t.Error("registered before kubelet is up")
	}
	k := startKubelet(t, dir)
	defer k.srv.Stop()
	k.await(t)
	select {
	case <-p.registered:
	case <-time.After(10 * time.Second):
		t.Fatal("no registration")
	}
	if ok, since, err := p.Registered(); !ok || since.IsZero() || err != nil {
		t.Errorf("Registered() after registration: %v %v %v", ok, since, err)
	}
}

// A kubelet.sock left by a stopped kubelet is not taken for the kubelet the plugin
// registers with: the plugin registers once with the kubelet that replaces it. (Taken
// for it, the plugin saw a restart at once and registered twice with one kubelet,
// which then drops both registrations when the first one's stream ends.)
func TestRegistersOnceWhenStaleKubeletSocketReplaced(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // a socket file nobody listens on
	p, _ := New(Config{ResourceName: "tessera.dev/gpu", Dir: dir, Replicas: 1, Log: logr.Discard()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	k := startKubelet(t, dir)
	defer k.srv.Stop()
	k.await(t)
	select {
	case <-k.reqs:
		t.Error("registered twice with one kubelet")
	case <-time.After(time.Second):
	}
	if ok, _, err := p.Registered(); !ok {
		t.Errorf("Registered() %v %v", ok, err)
	}
}

// A refused registration is retried after the configured backoff, and a success
// starts the backoff again from its first step.
func TestRegistrationRetriedWithBackoff(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	defer k.srv.Stop()
	k.refuse.Store(3)
	p, _ := New(Config{ResourceName: "tessera.dev/gpu", Dir: dir, Replicas: 1, Log: logr.Discard(),
		Backoff: wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 10, Cap: 80 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	go func() { _ = p.Run(ctx) }()
	k.await(t)
	// Three refusals wait 20, 40 and 80 ms (each up to 10% more) before the fourth try.
	if took, least := time.Since(start), 140*time.Millisecond; took < least {
		t.Errorf("registered %v after start, before the backoff's %v", took, least)
	}
	if n := k.refused.Load(); n != 3 {
		t.Errorf("kubelet refused %d registrations, want 3", n)
	}
	if p.cfg.Backoff.Duration != 20*time.Millisecond {
		t.Errorf("the configured backoff was consumed: %+v", p.cfg.Backoff)
	}
}

func TestDevicesMIGAndConfig(t *testing.T) {
	in := inv(true, true)
	in.GPUs[0].MIG = &api.MIG{Instances: []api.MIGInstance{{UUID: "MIG-1", MemoryMiB: 5000}, {UUID: "MIG-2", MemoryMiB: 5000}}}
	d := Devices(in, 2)
	var ids []string
	for _, x := range d {
		ids = append(ids, x.ID)
	}
	if got := strings.Join(ids, ","); got != "GPU-b::0,GPU-b::1,MIG-1::0,MIG-1::1,MIG-2::0,MIG-2::1" {
		t.Errorf("ids %s", got)
	}
	if d[0].Topology.Nodes[0].ID != 1 {
		t.Errorf("NUMA %v", d[0].Topology)
	}
	for _, c := range []Config{{ResourceName: "gpu", Replicas: 1}, {ResourceName: "a/b", Replicas: 0}} {
		if _, err := New(c); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// Allocate over kubelet's gRPC API carries what the agent adds to each container (the
// CDI devices on a node without NRI), and fails the allocation with the agent's
// reason when it refuses (a node that lacks a requirement), so kubelet never starts
// the container.
func TestAllocateCDIDevicesAndRefusal(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	k := startKubelet(t, dir)
	refuse := make(chan string, 1)
	p, err := New(Config{ResourceName: "tessera.dev/gpu", Dir: dir, Replicas: 2, CheckInterval: 20 * time.Millisecond, Log: logr.Discard(),
		Allocate: func(r *pluginapi.ContainerAllocateResponse) error {
			select {
			case why := <-refuse:
				return errors.New(why)
			default:
			}
			r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: "tessera.dev/gpu=GPU-a"}, &pluginapi.CDIDevice{Name: "tessera.dev/gpu=GPU-b"})
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	p.Update(inv(true, true))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	c := dialPlugin(t, dir, k.await(t).Endpoint)
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a::0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range resp.ContainerResponses[0].CdiDevices {
		names = append(names, d.Name)
	}
	if strings.Join(names, ",") != "tessera.dev/gpu=GPU-a,tessera.dev/gpu=GPU-b" || resp.ContainerResponses[0].Envs[EnvRequested] != "1" {
		t.Fatalf("allocate: %+v", resp)
	}
	refuse <- "the node does not meet Tessera's requirements"
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a::1"}}}}); err == nil ||
		!strings.Contains(err.Error(), "does not meet Tessera's requirements") {
		t.Fatalf("refused allocation: %v", err)
	}
}

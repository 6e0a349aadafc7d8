// SPDX-License-Identifier: Apache-2.0

package nri

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	nriapi "github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/binding/bindingtest"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// runtime is the runtime side of NRI (what containerd embeds), serving the real socket
// protocol; Tessera's plugin connects to it like it would to containerd.
type runtime struct {
	r    *adaptation.Adaptation
	mu   sync.Mutex
	pods []*nriapi.PodSandbox
	ctrs []*nriapi.Container
}

func startRuntime(t *testing.T, dir string, pods []*nriapi.PodSandbox, ctrs []*nriapi.Container) *runtime {
	t.Helper()
	return startRuntimeVersion(t, dir, "v2.2.0", pods, ctrs)
}

// startRuntimeVersion is startRuntime as containerd of that version.
func startRuntimeVersion(t *testing.T, dir, version string, pods []*nriapi.PodSandbox, ctrs []*nriapi.Container) *runtime {
	t.Helper()
	rt := &runtime{pods: pods, ctrs: ctrs}
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		rt.mu.Lock()
		p, c := rt.pods, rt.ctrs
		rt.mu.Unlock()
		_, err := cb(ctx, p, c)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	r, err := adaptation.New("containerd", version, sync, update,
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		adaptation.WithSocketPath(filepath.Join(dir, "nri.sock")))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	rt.r = r
	return rt
}

func (rt *runtime) create(t *testing.T, pod *nriapi.PodSandbox, ctr *nriapi.Container) (*nriapi.ContainerAdjustment, error) {
	t.Helper()
	b := rt.r.BlockPluginSync()
	defer b.Unblock()
	resp, err := rt.r.CreateContainer(context.Background(), &adaptation.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return nil, err
	}
	return resp.GetAdjust(), nil
}

func fakeDev(path string) (binding.DeviceNode, error) {
	switch filepath.Base(path) {
	case "nvidia0":
		return binding.DeviceNode{Type: "c", Major: 195, Minor: 0, FileMode: 0o666}, nil
	case "nvidia1":
		return binding.DeviceNode{Type: "c", Major: 195, Minor: 1, FileMode: 0o666}, nil
	case "nvidiactl":
		return binding.DeviceNode{Type: "c", Major: 195, Minor: 255, FileMode: 0o666}, nil
	case "nvidia-uvm":
		return binding.DeviceNode{Type: "c", Major: 510, Minor: 0, FileMode: 0o666}, nil
	}
	return binding.DeviceNode{}, os.ErrNotExist
}

func newPlugin(t *testing.T, dir string) (*Plugin, *binding.Binder) {
	t.Helper()
	return newPluginWith(t, dir, nil)
}

// newPluginWith is newPlugin with the binder given the node's CDI spec.
func newPluginWith(t *testing.T, dir string, spec binding.CDI, opts ...func(*binding.Config)) (*Plugin, *binding.Binder) {
	t.Helper()
	store, err := checkpoint.Open(filepath.Join(dir, "state", "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := binding.Config{
		NodeName: "node-1", Names: api.DefaultResourceNames(), Store: store,
		Devices: func() ([]gpu.Device, error) {
			return []gpu.Device{{UUID: "GPU-0", Index: 0, Minor: 0}, {UUID: "GPU-1", Index: 1, Minor: 1}}, nil
		},
		LimitsRoot: filepath.Join(dir, "limits"), TurnsDir: filepath.Join(dir, "state", "turns"), StatDevice: fakeDev, CDI: spec,
		Pods: apiPods.Get, SchedulerNames: []string{bindingtest.Scheduler},
		Inventory: func() (*api.NodeInventory, error) { return bindingtest.Inventory(81920, "GPU-0", "GPU-1"), nil },
	}
	for _, o := range opts {
		o(&cfg)
	}
	b, err := binding.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return New(b, filepath.Join(dir, "nri.sock"), logr.Discard()), b
}

// apiPods are the pods the binder checks assignments against: pod puts each GPU pod
// there as Tessera's scheduler placed it.
var apiPods = &bindingtest.Pods{}

func pod(t *testing.T, uid string, cs ...api.ContainerAssignment) *nriapi.PodSandbox {
	p := &nriapi.PodSandbox{Id: "sandbox-" + uid, Uid: uid, Name: "pod-" + uid, Namespace: "team", Annotations: map[string]string{}}
	if len(cs) > 0 {
		a := &api.PodAssignment{Version: 1, Node: "node-1", Containers: cs}
		s, err := api.EncodeAssignment(a)
		if err != nil {
			t.Fatal(err)
		}
		p.Annotations[api.AnnotationAssignment] = s
		apiPods.Put(bindingtest.Placed(p.Namespace, p.Name, uid, a))
	}
	return p
}

func ctr(p *nriapi.PodSandbox, id, name string, env ...string) *nriapi.Container {
	return &nriapi.Container{Id: id, PodSandboxId: p.Id, Name: name, Env: env, State: nriapi.ContainerState_CONTAINER_RUNNING,
		Linux: &nriapi.LinuxContainer{CgroupsPath: "kubepods-pod" + p.Uid + ".slice:cri-containerd:" + id}}
}

func waitConnected(t *testing.T, p *Plugin) {
	t.Helper()
	select {
	case <-p.connected:
	case <-time.After(20 * time.Second):
		t.Fatal("plugin did not synchronise with the runtime")
	}
}

func TestPluginOverNRISocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "nri") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	rt := startRuntime(t, dir, nil, nil)
	p, b := newPlugin(t, dir)
	// Reconnect after 10 ms rather than DefaultBackoff's 1 s once the runtime dies.
	p.Backoff = wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 5, Cap: 100 * time.Millisecond}
	var connMu sync.Mutex
	var conn net.Conn
	p.dial = func(path string) (net.Conn, error) {
		c, err := net.Dial("unix", path)
		connMu.Lock()
		conn = c
		connMu.Unlock()
		return c, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	waitConnected(t, p)
	if up, since, _ := p.Connected(); !up || since.IsZero() {
		t.Errorf("Connected() after synchronisation: %v %v", up, since)
	}

	gpuPod := pod(t, "u1", api.ContainerAssignment{Name: "train", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 8192, Cores: 40}}})
	adj, err := rt.create(t, gpuPod, ctr(gpuPod, "c1", "train", deviceplugin.EnvRequested+"=1", "NVIDIA_VISIBLE_DEVICES=all"))
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, d := range adj.GetLinux().GetDevices() {
		devs = append(devs, d.Path)
	}
	if got := strings.Join(devs, ","); got != "/dev/nvidia1,/dev/nvidiactl,/dev/nvidia-uvm" {
		t.Errorf("devices %s", got)
	}
	var env []string
	for _, e := range adj.GetEnv() {
		env = append(env, e.Key+"="+e.Value)
	}
	if got := strings.Join(env, ","); got != "NVIDIA_VISIBLE_DEVICES=GPU-1" {
		t.Errorf("env %s", got)
	}
	mounts := adj.GetMounts()
	if len(mounts) != 3 || mounts[0].Destination != api.ContainerLimitsDir || !contains(mounts[0].Options, "ro") || contains(mounts[0].Options, "rw") {
		t.Fatalf("mounts %+v", mounts)
	}
	// The container's own region directory: a tmpfs, with the binding's options, not a
	// bind mount of anything of the host's.
	if m := mounts[1]; m.Destination != api.ContainerRegionDir || m.Type != "tmpfs" || m.Source != "tmpfs" ||
		strings.Join(m.Options, ",") != strings.Join(binding.RegionMount().Options, ",") || contains(m.Options, "bind") {
		t.Errorf("region mount %+v, want a tmpfs with options %v", m, binding.RegionMount().Options)
	}
	// Paced at 40 %: GPU-1's turn file, on its own, read-write.
	turns := filepath.Join(dir, "state", "turns")
	if m := mounts[2]; m.Destination != api.ContainerTurnsDir+"/GPU-1" || m.Source != filepath.Join(turns, "GPU-1") || m.Type != "bind" || !contains(m.Options, "rw") || contains(m.Options, "ro") {
		t.Errorf("turns mount %+v, want %s/GPU-1 read-write at %s/GPU-1", m, turns, api.ContainerTurnsDir)
	}
	if fi, err := os.Stat(filepath.Join(turns, "GPU-1")); err != nil || fi.Size() != api.TurnFileBytes {
		t.Errorf("GPU-1's turn file: %v %v", fi, err)
	}
	data, err := os.ReadFile(filepath.Join(mounts[0].Source, api.LimitsFileName))
	if err != nil {
		t.Fatal(err)
	}
	l, err := api.DecodeLimits(data)
	if err != nil || l.GPUs[0] != (api.GPULimit{UUID: "GPU-1", MemoryMiB: 8192, Cores: 40}) || l.Cgroup != "/kubepods.slice/kubepods-podu1.slice/cri-containerd-c1.scope" ||
		l.RegionDir != api.ContainerRegionDir {
		t.Fatalf("limits %+v %v", l, err)
	}

	// A container without GPUs passes untouched.
	plain := pod(t, "u2")
	adj, err = rt.create(t, plain, ctr(plain, "c2", "web"))
	if err != nil {
		t.Fatal(err)
	}
	if len(adj.GetLinux().GetDevices()) != 0 || len(adj.GetEnv()) != 0 || len(adj.GetMounts()) != 0 {
		t.Errorf("plain container adjusted: %+v", adj)
	}

	// A container that asked for GPUs but has no assignment is refused, with the reason.
	var refused []string
	p.OnRefused = func(ns, pod, c, reason string) { refused = append(refused, ns+"/"+pod+"/"+c) }
	_, err = rt.create(t, plain, ctr(plain, "c3", "sneaky", deviceplugin.EnvRequested+"=1"))
	if err == nil || !strings.Contains(err.Error(), "no tessera.dev/gpu-assignment annotation") {
		t.Fatalf("unassigned GPU container: %v", err)
	}
	if len(refused) != 1 || refused[0] != "team/pod-u2/sneaky" {
		t.Errorf("refusals %v", refused)
	}

	// Runtime restart: the plugin reconnects and reconciles. c1 still runs; c9 was
	// bound before and is gone now.
	_, _ = b.Bind(binding.Request{PodUID: "u9", Namespace: "team", Pod: "old", Container: "train", ContainerID: "c9",
		PodAnnotations: gpuPod.Annotations, CgroupsPath: "/kubepods/podu9/c9"})
	// The runtime dies: its end of the connection goes away with it.
	rt.r.Stop()
	connMu.Lock()
	conn.Close()
	connMu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); ; {
		up, _, err := p.Connected()
		if !up && err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still connected after the runtime died: %v %v", up, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rt2 := startRuntime(t, dir, []*nriapi.PodSandbox{gpuPod}, []*nriapi.Container{ctr(gpuPod, "c1", "train")})
	waitConnected(t, p)
	if up, _, _ := p.Connected(); !up {
		t.Error("not connected after the runtime came back")
	}
	recs := b.Records()
	if len(recs) != 1 || recs[0].ContainerID != "c1" {
		t.Fatalf("records after runtime restart: %+v", recs)
	}

	// Removal forgets the container and its limits.
	b2 := rt2.r.BlockPluginSync()
	err = rt2.r.RemoveContainer(ctx, &adaptation.RemoveContainerRequest{Pod: gpuPod, Container: ctr(gpuPod, "c1", "train")})
	b2.Unblock()
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Records()) != 0 {
		t.Errorf("records after removal: %+v", b.Records())
	}
	if _, err := os.Stat(mounts[0].Source); !os.IsNotExist(err) {
		t.Error("limits dir left after removal")
	}
	cancel()
	rt2.r.Stop()
	<-done
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Containers the runtime reports running at synchronisation, with no record (a lost
// checkpoint), are bound again with the region they were created with: the private
// directory where their mounts have it, their /dev/shm where they were created
// without it (by an agent that mounted none), so that their next process still finds
// its region.
func TestSynchronizeKeepsTheRegionContainersWereCreatedWith(t *testing.T) {
	dir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	grant := func(name string) api.ContainerAssignment {
		return api.ContainerAssignment{Name: name, Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 4096, Cores: 20}}}
	}
	p1, p2 := pod(t, "s1", grant("new")), pod(t, "s2", grant("old"))
	withRegion := ctr(p1, "r1", "new")
	withRegion.Mounts = []*nriapi.Mount{{Destination: api.ContainerLimitsDir, Type: "bind"}, {Destination: api.ContainerRegionDir, Type: "tmpfs", Source: "tmpfs"}}
	without := ctr(p2, "r2", "old")
	without.Mounts = []*nriapi.Mount{{Destination: api.ContainerLimitsDir, Type: "bind"}, {Destination: "/dev/shm", Type: "bind"}}
	rt := startRuntime(t, dir, []*nriapi.PodSandbox{p1, p2}, []*nriapi.Container{withRegion, without})
	defer rt.r.Stop()
	p, b := newPlugin(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitConnected(t, p)

	want := map[string]string{"r1": api.ContainerRegionDir, "r2": ""}
	if len(b.Records()) != len(want) {
		t.Fatalf("records %+v", b.Records())
	}
	for _, rec := range b.Records() {
		data, err := os.ReadFile(filepath.Join(rec.LimitsDir, api.LimitsFileName))
		if err != nil {
			t.Fatal(err)
		}
		l, err := api.DecodeLimits(data)
		if err != nil {
			t.Fatal(err)
		}
		if l.RegionDir != want[rec.ContainerID] || rec.RegionDir != want[rec.ContainerID] {
			t.Errorf("%s: region %q (record %q), want %q", rec.ContainerID, l.RegionDir, rec.RegionDir, want[rec.ContainerID])
		}
	}
}

// SPDX-License-Identifier: Apache-2.0

package nri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/cdi"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
)

// nodeSpec stands in for the node's CDI spec (package cdi writes the real one).
type nodeSpec struct {
	mu   sync.Mutex
	have map[string]bool
}

func (s *nodeSpec) DeviceNames(uuids []string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, u := range uuids {
		if !s.have[u] {
			return nil, fmt.Errorf("the node's CDI spec has no device %s", u)
		}
		out = append(out, "tessera.dev/gpu="+u)
	}
	return out, nil
}

func (*nodeSpec) LibraryDir() string { return "/usr/local/nvidia/lib64" }

// Through the real NRI protocol, the adjustment names the granted GPU's CDI device
// (the runtime resolves it from the spec), adds no device nodes of its own and never
// names the other GPU.
func TestPluginAddsCDIDevices(t *testing.T) {
	dir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	rt := startRuntime(t, dir, nil, nil)
	spec := &nodeSpec{have: map[string]bool{"GPU-0": true, "GPU-1": true}}
	p, _ := newPluginWith(t, dir, spec)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	waitConnected(t, p)

	for _, tc := range []struct{ uuid, other string }{{"GPU-0", "GPU-1"}, {"GPU-1", "GPU-0"}} {
		uid := "cdi-" + tc.uuid
		gpuPod := pod(t, uid, api.ContainerAssignment{Name: "train", Devices: []api.DeviceGrant{{UUID: tc.uuid, Index: 0, MemoryMiB: 4096, Cores: 20}}})
		adj, err := rt.create(t, gpuPod, ctr(gpuPod, "c-"+uid, "train", deviceplugin.EnvRequested+"=1", "LD_LIBRARY_PATH=/opt/lib"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, d := range adj.GetCDIDevices() {
			names = append(names, d.GetName())
		}
		if !slices.Equal(names, []string{"tessera.dev/gpu=" + tc.uuid}) || slices.Contains(names, "tessera.dev/gpu="+tc.other) {
			t.Errorf("container on %s got CDI devices %v", tc.uuid, names)
		}
		if n := len(adj.GetLinux().GetDevices()); n != 0 {
			t.Errorf("container on %s got %d device nodes besides its CDI device", tc.uuid, n)
		}
		var env []string
		for _, e := range adj.GetEnv() {
			env = append(env, e.Key+"="+e.Value)
		}
		if !slices.Equal(env, []string{"LD_LIBRARY_PATH=/opt/lib:/usr/local/nvidia/lib64"}) {
			t.Errorf("env %v", env)
		}
	}

	// A grant the spec cannot serve (GPU-0 gone from it) fails the creation.
	spec.mu.Lock()
	delete(spec.have, "GPU-0")
	spec.mu.Unlock()
	missing := pod(t, "cdi-missing", api.ContainerAssignment{Name: "train", Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 4096}}})
	if _, err := rt.create(t, missing, ctr(missing, "c-missing", "train", deviceplugin.EnvRequested+"=1")); err == nil {
		t.Fatal("a container whose GPU the CDI spec lacks was created")
	}
}

// specYAML is a node's CDI spec as package cdi writes it, cut down: two GPUs, the
// shared control node, a library, the environment and the toolkit's hook.
const specYAML = `cdiVersion: 0.6.0
kind: tessera.dev/gpu
devices:
  - name: GPU-0
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0, permissions: rwm}]
  - name: GPU-1
    containerEdits:
      deviceNodes: [{path: /dev/nvidia1, type: c, major: 195, minor: 1, permissions: rwm}]
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  deviceNodes: [{path: /dev/nvidiactl, type: c, major: 195, minor: 255, permissions: rwm}]
  mounts:
    - {hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.1, containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.1, options: [ro, nosuid, nodev, rbind, rprivate]}
  hooks:
    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]}
`

// containerd 2.0 (and 1.7 before its fix) drops the CDI devices an NRI plugin names
// without an error: for it the plugin resolves them itself, with the CDI library, into
// the device nodes (with their cgroup rules), mounts, environment and hooks the runtime
// would have added: still only the granted GPU's node.
func TestPluginResolvesCDIForOlderRuntimes(t *testing.T) {
	if cdiNative("containerd", "v2.0.5") || cdiNative("containerd", "1.7.27") || cdiNative("cri-o", "1.33.0") || cdiNative("containerd", "bogus") ||
		!cdiNative("containerd", "v2.1.0") || !cdiNative("containerd", "2.2.0") || !cdiNative("containerd", "v3.0.0-rc.1") {
		t.Fatal("cdiNative")
	}
	dir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	specDir := filepath.Join(dir, "cdi")
	os.MkdirAll(specDir, 0o755)
	if err := os.WriteFile(filepath.Join(specDir, "tessera.dev-gpu.yaml"), []byte(specYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	gen, err := cdi.New(cdi.Config{SpecDir: specDir})
	if err != nil {
		t.Fatal(err)
	}
	rt := startRuntimeVersion(t, dir, "v2.0.5", nil, nil)
	spec := &nodeSpec{have: map[string]bool{"GPU-0": true, "GPU-1": true}}
	p, _ := newPluginWith(t, dir, spec)
	p.ResolveCDI = gen.Resolve
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	waitConnected(t, p)

	gpuPod := pod(t, "old-rt", api.ContainerAssignment{Name: "train", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096}}})
	adj, err := rt.create(t, gpuPod, ctr(gpuPod, "c-old", "train", deviceplugin.EnvRequested+"=1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(adj.GetCDIDevices()) != 0 {
		t.Errorf("CDI devices named to a runtime that drops them: %v", adj.GetCDIDevices())
	}
	var devs []string
	for _, d := range adj.GetLinux().GetDevices() {
		devs = append(devs, fmt.Sprintf("%s=%s%d:%d", d.Path, d.Type, d.Major, d.Minor))
	}
	slices.Sort(devs)
	if !slices.Equal(devs, []string{"/dev/nvidia1=c195:1", "/dev/nvidiactl=c195:255"}) {
		t.Errorf("device nodes %v", devs)
	}
	var mounts []string
	for _, m := range adj.GetMounts() {
		mounts = append(mounts, m.Destination)
	}
	if !slices.Contains(mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1") {
		t.Errorf("mounts %v", mounts)
	}
	var env []string
	for _, e := range adj.GetEnv() {
		env = append(env, e.Key+"="+e.Value)
	}
	if !slices.Contains(env, "NVIDIA_VISIBLE_DEVICES=void") {
		t.Errorf("env %v", env)
	}
	if h := adj.GetHooks().GetCreateContainer(); len(h) != 1 || h[0].Path != "/usr/bin/nvidia-cdi-hook" {
		t.Errorf("hooks %v", adj.GetHooks())
	}

	// A name the spec files lack fails the creation.
	spec.mu.Lock()
	spec.have["GPU-9"] = true
	spec.mu.Unlock()
	os.WriteFile(filepath.Join(specDir, "tessera.dev-gpu.yaml"), []byte(strings.Replace(specYAML, "name: GPU-1", "name: GPU-7", 1)), 0o644)
	if _, err := rt.create(t, gpuPod, ctr(gpuPod, "c-old2", "train", deviceplugin.EnvRequested+"=1")); err == nil {
		t.Fatal("created with a CDI device the spec files do not hold")
	}
}

// Runtimes inject the CDI devices that "cdi.k8s.io/" annotations name: a pod (or
// container) that asks for a Tessera device that way is refused, whatever else it
// asks for; other kinds and other annotations pass.
func TestPluginRefusesAnnotatedCDIDevices(t *testing.T) {
	dir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	rt := startRuntime(t, dir, nil, nil)
	p, _ := newPluginWith(t, dir, &nodeSpec{have: map[string]bool{"GPU-0": true, "GPU-1": true}})
	p.CDIKind = "tessera.dev/gpu"
	var refused []string
	p.OnRefused = func(ns, pod, c, reason string) { refused = append(refused, reason) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	waitConnected(t, p)

	sneaky := pod(t, "sneaky")
	sneaky.Annotations["cdi.k8s.io/gpu"] = "tessera.dev/gpu=GPU-1"
	if _, err := rt.create(t, sneaky, ctr(sneaky, "c-sneaky", "app")); err == nil || !strings.Contains(err.Error(), "cdi.k8s.io/gpu asks the runtime for tessera.dev/gpu") {
		t.Fatalf("pod annotation: %v", err)
	}
	if len(refused) != 1 {
		t.Errorf("refusals %v", refused)
	}
	// On the container too, beside a granted GPU.
	granted := pod(t, "granted", api.ContainerAssignment{Name: "train", Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 4096}}})
	c := ctr(granted, "c-granted", "train", deviceplugin.EnvRequested+"=1")
	c.Annotations = map[string]string{"cdi.k8s.io/more": "tessera.dev/gpu=GPU-1"}
	if _, err := rt.create(t, granted, c); err == nil {
		t.Fatal("container annotation asking for a second GPU was created")
	}
	// Another vendor's device and unrelated annotations pass.
	other := pod(t, "other")
	other.Annotations["cdi.k8s.io/nic"] = "vendor.example/nic=0"
	other.Annotations["note"] = "tessera.dev/gpu=GPU-1"
	if adj, err := rt.create(t, other, ctr(other, "c-other", "app")); err != nil || len(adj.GetCDIDevices()) != 0 {
		t.Fatalf("unrelated annotations: %v %v", adj, err)
	}
}

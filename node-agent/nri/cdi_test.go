package nri

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/tessera-dev/tessera/api"
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

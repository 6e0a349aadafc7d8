// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
)

// specDevices stands in for the node's CDI spec (package cdi writes the real one):
// the devices it holds, and the library directory it asks the loader to search.
type specDevices struct {
	have   map[string]bool
	libDir string
}

func (s *specDevices) DeviceNames(uuids []string) ([]string, error) {
	var out []string
	for _, u := range uuids {
		if !s.have[u] {
			return nil, fmt.Errorf("the node's CDI spec has no device %s", u)
		}
		out = append(out, "tessera.dev/gpu="+u)
	}
	return out, nil
}

func (s *specDevices) LibraryDir() string { return s.libDir }

func TestBindThroughCDI(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	spec := &specDevices{have: map[string]bool{"GPU-0": true, "GPU-1": true, "MIG-1": true}, libDir: "/usr/local/nvidia/lib64"}
	b.cfg.CDI = spec
	ann := assignment(t, "node-1",
		api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 4096, Cores: 30}}},
		api.ContainerAssignment{Name: "two", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 1024}, {UUID: "GPU-0", Index: 0, MemoryMiB: 1024}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 30)), ctr("two", gpuLimits(2, 1024, 0)))

	// A container bound to GPU 0 gets GPU 0's CDI device and nothing else: no
	// device nodes of its own (the spec has them), no GPU 1.
	e, err := b.Bind(req("c1", "main", ann, deviceplugin.EnvRequested+"=1", "LD_LIBRARY_PATH=/opt/app/lib"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(e.CDIDevices, []string{"tessera.dev/gpu=GPU-0"}) || len(e.Devices) != 0 {
		t.Fatalf("CDI devices %v, device nodes %v", e.CDIDevices, e.Devices)
	}
	// The image's search path is kept, the driver's directory appended; the spec
	// itself sets NVIDIA_VISIBLE_DEVICES.
	if len(e.Env) != 1 || e.Env[0] != [2]string{EnvLibraryPath, "/opt/app/lib:/usr/local/nvidia/lib64"} {
		t.Fatalf("env %v", e.Env)
	}
	// The limits, the region directory and the hook come as before.
	if len(e.Mounts) != 4 || e.Mounts[0].Destination != api.ContainerLimitsDir || e.Mounts[1].Destination != api.ContainerRegionDir ||
		e.Mounts[3].Destination != PreloadPath {
		t.Fatalf("mounts %v", e.Mounts)
	}

	// Two GPUs: both names, in the grant's order; a path already there is not added twice.
	e, err = b.Bind(req("c2", "two", ann, "LD_LIBRARY_PATH=/usr/local/nvidia/lib64"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(e.CDIDevices, []string{"tessera.dev/gpu=GPU-1", "tessera.dev/gpu=GPU-0"}) {
		t.Fatalf("CDI devices %v", e.CDIDevices)
	}
	if e.Env[0][1] != "/usr/local/nvidia/lib64" {
		t.Fatalf("env %v", e.Env)
	}

	// Rebinding from the checkpoint names the frozen grant's device again.
	e, err = b.Bind(req("c1", "main", ann))
	if err != nil || !slices.Equal(e.CDIDevices, []string{"tessera.dev/gpu=GPU-0"}) {
		t.Fatalf("rebind: %v %v", e, err)
	}

	// With the toolkit's hook the spec needs no search path: no env at all.
	spec.libDir = ""
	e, err = b.Bind(req("c1", "main", ann))
	if err != nil || len(e.Env) != 0 {
		t.Fatalf("env with the toolkit's hook: %v %v", e, err)
	}
}

// A granted device the spec does not hold (the spec is not written yet, or is older
// than the device) refuses the container before anything is recorded: it would
// otherwise start without the GPU it was granted.
func TestBindThroughCDIMissingDevice(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	b.cfg.CDI = &specDevices{have: map[string]bool{"GPU-0": true}}
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 0)))
	_, err := b.Bind(req("c1", "main", ann))
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("bound without the device in the spec: %v", err)
	}
	if _, ok := b.cfg.Store.Get("c1"); ok {
		t.Fatal("a refused container was recorded")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "limits", "*")); len(m) != 0 {
		t.Fatalf("limits written for a refused container: %v", m)
	}
}

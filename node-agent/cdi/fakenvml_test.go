// SPDX-License-Identifier: Apache-2.0

package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-dev/tessera/node-agent/cdi/cditest"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// Without an NVML of its own (Config.NVML nil) the generator loads libnvidia-ml.so.1
// from the driver root, as on a node. Here that is the project's fake NVML
// (cuda-hook/fake), which the real-node suite (test/node) gives the agent as the
// node's driver: NVIDIA's discovery must get from it what it asks a real driver (the
// driver version, every GPU's index, minor number, name, PCI information, MIG mode).
func TestSpecFromFakeNVML(t *testing.T) {
	const libDir = "usr/local/nvidia/lib64"
	root := cditest.DriverRoot(t, libDir)
	lib := filepath.Join(root, libDir)
	// The soname links a driver install has (ldconfig makes them): the discovery
	// looks libnvidia-ml.so.1 up by that name.
	for _, l := range []string{"libcuda", "libnvidia-ml"} {
		must(t, os.Symlink(l+".so."+cditest.DriverVersion, filepath.Join(lib, l+".so.1")))
	}
	t.Setenv("FAKE_CUDA_DEVICES", "8")
	t.Setenv("FAKE_NVML_DRIVER_VERSION", cditest.DriverVersion)
	g := newGen(t, Config{DriverRoot: root, LibrarySearchPaths: []string{lib}, Hook: HookNone})
	var devs []gpu.Device
	for i := range 8 {
		devs = append(devs, gpu.Device{UUID: "GPU-fa4e0000-0000-0000-0000-00000000000" + string(rune('1'+i)), Index: i, Minor: i})
	}
	s, err := g.Generate(devs)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Missing) > 0 || len(s.Devices) != 8 {
		t.Fatalf("devices %v, missing %v: want the fake driver's 8 GPUs", s.Devices, s.Missing)
	}
	for _, want := range []string{"libcuda.so.1", "libnvidia-ml.so.1"} {
		if !slices.Contains(s.Libraries, filepath.Join(ContainerLibraryDir, want)) {
			t.Errorf("library %s missing: %v", want, s.Libraries)
		}
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(filepath.Dir(s.Path)), cdiapi.WithAutoRefresh(false))
	must(t, err)
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("the written spec does not load: %v", errs)
	}
	for i, d := range devs {
		dev := cache.GetDevice(g.QualifiedName(d.UUID))
		if dev == nil {
			t.Fatalf("%s not in the spec: %v", d.UUID, cache.ListDevices())
		}
		var nodes []string
		for _, n := range dev.ContainerEdits.DeviceNodes {
			nodes = append(nodes, n.Path)
		}
		if want := "/dev/nvidia" + string(rune('0'+i)); !slices.Equal(nodes, []string{want}) {
			t.Errorf("%s: device nodes %v, want [%s]", d.UUID, nodes, want)
		}
	}
}

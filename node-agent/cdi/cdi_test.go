// SPDX-License-Identifier: Apache-2.0

package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/go-logr/logr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-dev/tessera/node-agent/cdi/cditest"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

func newGen(t *testing.T, cfg Config) *Generator {
	t.Helper()
	if cfg.SpecDir == "" {
		cfg.SpecDir = filepath.Join(t.TempDir(), "cdi")
	}
	cfg.Log = logr.Discard()
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestSpecWithoutToolkit(t *testing.T) {
	root := cditest.DriverRoot(t, "usr/lib/x86_64-linux-gnu")
	lib := cditest.H100()
	g := newGen(t, Config{DriverRoot: root, HostDriverRoot: "/", NVML: lib, Hook: HookAuto})
	devs := cditest.Devices(lib)
	s, err := g.Generate(devs)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(s.Path); err == nil {
		t.Logf("%s:\n%s", s.Path, b)
	}
	if s.Hook != "" || s.LibraryDir != ContainerLibraryDir {
		t.Fatalf("no nvidia-cdi-hook in the driver root, yet hook %q, library dir %q", s.Hook, s.LibraryDir)
	}
	if len(s.Devices) != 8 {
		t.Fatalf("devices %v, want the 8 GPUs", s.Devices)
	}
	for _, d := range devs {
		if !slices.Contains(s.Devices, d.UUID) {
			t.Errorf("device %s missing from %v", d.UUID, s.Devices)
		}
	}
	// Each library under its versioned name and its soname, in one directory.
	for _, want := range []string{"libcuda.so.1", "libcuda.so", "libcuda.so." + cditest.DriverVersion, "libnvidia-ml.so.1", "libnvidia-ml.so", "libnvidia-ml.so." + cditest.DriverVersion} {
		if !slices.Contains(s.Libraries, filepath.Join(ContainerLibraryDir, want)) {
			t.Errorf("library %s missing: %v", want, s.Libraries)
		}
	}
	for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia7"} {
		if !slices.Contains(s.DeviceNodes, want) {
			t.Errorf("device node %s missing: %v", want, s.DeviceNodes)
		}
	}

	// The CDI library reads the written file back, and resolves each device to its
	// own node only, with host paths under the host's driver root ("/"), not the
	// agent's view of it.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(filepath.Dir(s.Path)), cdiapi.WithAutoRefresh(false))
	must(t, err)
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("the written spec does not load: %v", errs)
	}
	d0 := cache.GetDevice(g.QualifiedName(devs[0].UUID))
	if d0 == nil {
		t.Fatalf("%s not in the cache: %v", g.QualifiedName(devs[0].UUID), cache.ListDevices())
	}
	var paths []string
	for _, n := range d0.ContainerEdits.DeviceNodes {
		paths = append(paths, n.Path)
	}
	if !slices.Contains(paths, "/dev/nvidia0") || slices.Contains(paths, "/dev/nvidia1") {
		t.Fatalf("GPU 0's device nodes are %v", paths)
	}
	for _, n := range d0.ContainerEdits.DeviceNodes {
		if n.Type != "c" || n.Major != 195 {
			t.Errorf("device node %+v is not a fully specified character device", n)
		}
	}
	// Resolved as a runtime would, GPU 0 alone: its node and the shared ones.
	resolved, err := g.Resolve([]string{g.QualifiedName(devs[0].UUID)})
	must(t, err)
	var rdevs []string
	for _, d := range resolved.Linux.Devices {
		rdevs = append(rdevs, d.Path)
	}
	slices.Sort(rdevs)
	if !slices.Equal(rdevs, []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"}) {
		t.Errorf("resolved device nodes %v", rdevs)
	}
	if _, err := g.Resolve([]string{"tessera.dev/gpu=GPU-not-here"}); err == nil {
		t.Error("resolved a device the spec does not hold")
	}
	spec := cache.GetDevice(g.QualifiedName(devs[0].UUID)).GetSpec()
	for _, m := range spec.ContainerEdits.Mounts {
		if strings.HasPrefix(m.HostPath, root) {
			t.Errorf("mount %s keeps the agent's view of the driver root", m.HostPath)
		}
	}
	for _, h := range spec.ContainerEdits.Hooks {
		t.Errorf("hook %s in a spec for a node without the toolkit", h.Path)
	}

	// Names: exactly the granted devices; an unknown UUID fails.
	names, err := g.DeviceNames([]string{devs[1].UUID})
	must(t, err)
	if len(names) != 1 || names[0] != "tessera.dev/gpu="+devs[1].UUID {
		t.Fatalf("names %v", names)
	}
	if _, err := g.DeviceNames([]string{"GPU-not-here"}); err == nil {
		t.Fatal("a UUID the spec does not hold was named")
	}

	// Unchanged devices: nothing rewritten; one device gone: rewritten.
	if wrote, _, err := g.Sync(devs); err != nil || wrote {
		t.Fatalf("sync with the same devices wrote %v, %v", wrote, err)
	}
	if wrote, _, err := g.Sync(devs[:7]); err != nil || !wrote {
		t.Fatalf("sync after a change wrote %v, %v", wrote, err)
	}
}

func TestSpecWithToolkitHook(t *testing.T) {
	root := cditest.DriverRoot(t, "usr/lib/x86_64-linux-gnu")
	must(t, os.WriteFile(filepath.Join(root, "usr/bin/nvidia-cdi-hook"), []byte("#!/bin/sh\n"), 0o755))
	lib := cditest.H100()
	g := newGen(t, Config{DriverRoot: root, NVML: lib})
	s, err := g.Generate(cditest.Devices(lib))
	if err != nil {
		t.Fatal(err)
	}
	if s.Hook != "/usr/bin/nvidia-cdi-hook" || s.LibraryDir != "" {
		t.Fatalf("hook %q, library dir %q", s.Hook, s.LibraryDir)
	}
	// The toolkit's layout: libraries at their host paths, the hook makes the links
	// and updates the loader's cache.
	if !slices.Contains(s.Libraries, "/usr/lib/x86_64-linux-gnu/libcuda.so."+cditest.DriverVersion) {
		t.Fatalf("libraries %v", s.Libraries)
	}
	raw, err := os.ReadFile(s.Path)
	must(t, err)
	for _, want := range []string{"update-ldcache", "/usr/bin/nvidia-cdi-hook"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("spec lacks %q:\n%s", want, raw)
		}
	}
}

// A driver outside the loader's default directories (the GKE-style
// /usr/local/nvidia/lib64 layout) is found through the library search paths.
func TestSpecLibrarySearchPaths(t *testing.T) {
	root := cditest.DriverRoot(t, "usr/local/nvidia/lib64")
	lib := cditest.H100()
	g := newGen(t, Config{DriverRoot: root, NVML: lib, Hook: HookNone})
	if _, err := g.Generate(cditest.Devices(lib)); err == nil {
		t.Fatal("found a driver outside the default directories without being told where")
	}
	g = newGen(t, Config{DriverRoot: root, NVML: lib, Hook: HookNone, LibrarySearchPaths: []string{filepath.Join(root, "usr/local/nvidia/lib64")}})
	s, err := g.Generate(cditest.Devices(lib))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Libraries, ContainerLibraryDir+"/libcuda.so.1") {
		t.Fatalf("libraries %v", s.Libraries)
	}
}

// A device the agent lists but NVIDIA's discovery does not know is reported and
// refused on its own; the other GPUs keep their devices. The parent of a MIG instance
// (a GPU in MIG mode, which the discovery does not name as a whole) is not missing.
func TestSpecMissingDevice(t *testing.T) {
	root := cditest.DriverRoot(t, "usr/lib/x86_64-linux-gnu")
	lib := cditest.H100()
	g := newGen(t, Config{DriverRoot: root, NVML: lib})
	if _, err := g.DeviceNames([]string{"GPU-anything"}); err == nil || !strings.Contains(err.Error(), "no CDI spec") {
		t.Fatalf("names given before any spec was written: %v", err)
	}
	devs := append(cditest.Devices(lib),
		gpu.Device{UUID: "GPU-agent-sees-more", Minor: 9},
		gpu.Device{UUID: "GPU-in-mig-mode", Minor: 10}, gpu.Device{UUID: "MIG-without-ids", ParentUUID: "GPU-in-mig-mode", Minor: 10})
	s, err := g.Generate(devs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Missing, []string{"GPU-agent-sees-more"}) {
		t.Fatalf("missing %v", s.Missing)
	}
	if _, err := g.DeviceNames([]string{devs[0].UUID, "GPU-agent-sees-more"}); err == nil || !strings.Contains(err.Error(), "no device GPU-agent-sees-more") {
		t.Fatalf("a device the spec lacks was named: %v", err)
	}
	if n, err := g.DeviceNames([]string{devs[0].UUID}); err != nil || len(n) != 1 {
		t.Fatalf("the others: %v %v", n, err)
	}
}

func TestConfigRejected(t *testing.T) {
	for name, c := range map[string]Config{
		"relative dir":      {SpecDir: "var/run/cdi"},
		"no dir":            {},
		"bad vendor":        {SpecDir: "/x", Kind: "-bad/gpu"},
		"bad class":         {SpecDir: "/x", Kind: "tessera.dev/g p u"},
		"relative root":     {SpecDir: "/x", DriverRoot: "host"},
		"relative search":   {SpecDir: "/x", LibrarySearchPaths: []string{"lib64"}},
		"hook not absolute": {SpecDir: "/x", Hook: "nvidia-cdi-hook"},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// NVIDIA's discovery failing on one device (here a MIG instance the fake NVML cannot
// fully describe; its panic is the library's) writes no spec, names nothing and does
// not take the agent down. (The content of a MIG instance's device, its capability
// nodes from /proc/driver/nvidia-caps, is NVIDIA's code and needs a MIG host.)
func TestSpecDiscoveryFails(t *testing.T) {
	root := cditest.DriverRoot(t, "usr/lib/x86_64-linux-gnu")
	lib := cditest.H100()
	parent := lib.Devices[2].(*server.Device)
	parent.GetMigModeFunc = func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS }
	parent.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	mig := &mock.Device{
		GetUUIDFunc:              func() (string, nvml.Return) { return "MIG-0", nvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return 1, nvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
		IsMigDeviceHandleFunc:    func() (bool, nvml.Return) { return true, nvml.SUCCESS },
		GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{MultiprocessorCount: 16, GpuInstanceSliceCount: 1, ComputeInstanceSliceCount: 1, MemorySizeMB: 10240}, nvml.SUCCESS
		},
		GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS },
	}
	parent.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j == 0 {
			return mig, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	byUUID := lib.DeviceGetHandleByUUIDFunc
	lib.DeviceGetHandleByUUIDFunc = func(u string) (nvml.Device, nvml.Return) {
		if u == "MIG-0" {
			return mig, nvml.SUCCESS
		}
		return byUUID(u)
	}
	g := newGen(t, Config{DriverRoot: root, NVML: lib})
	devs := cditest.Devices(lib)
	devs = append(devs, gpu.Device{UUID: "MIG-0", Index: 2, Minor: 2, ParentUUID: devs[2].UUID, MIG: &gpu.MIGIDs{GPUInstance: 1}})
	_, err := g.Generate(devs)
	if err == nil {
		t.Fatal("a spec was written for a MIG instance without its capability devices")
	}
	if _, serr := os.Stat(filepath.Join(g.cfg.SpecDir, g.SpecName()+".yaml")); !os.IsNotExist(serr) {
		t.Fatalf("a spec was written after %v", err)
	}
	if _, err := g.DeviceNames([]string{devs[0].UUID}); err == nil {
		t.Fatal("names given without a spec")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

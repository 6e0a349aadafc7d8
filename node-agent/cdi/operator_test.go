// SPDX-License-Identifier: Apache-2.0

package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/node-agent/cdi/cditest"
)

// The NVIDIA GPU Operator's layout, as the chart's values-gpu-operator.yaml mounts it
// into the agent: the driver container's root filesystem is the host's
// /run/nvidia/driver, seen by the agent at /host/driver; the host's /dev, where the
// device nodes are, at /host/dev (so the agent's dev root is /host, the host's /);
// the operator's toolkit is installed on the host at /usr/local/nvidia/toolkit, which
// is outside the driver root. operatorHost returns the agent's /host.
func operatorHost(t *testing.T) string {
	host := t.TempDir()
	cditest.Driver(t, filepath.Join(host, "driver"), "usr/lib/x86_64-linux-gnu")
	cditest.DeviceNodes(t, filepath.Join(host, "dev"))
	// The host's toolkit, not under the driver root: the agent does not see it.
	hook := filepath.Join(host, "usr/local/nvidia/toolkit/nvidia-cdi-hook")
	must(t, os.MkdirAll(filepath.Dir(hook), 0o755))
	must(t, os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755))
	return host
}

const operatorDriverRoot = "/run/nvidia/driver"

func operatorConfig(host, hook string) Config {
	return Config{
		DriverRoot: filepath.Join(host, "driver"), HostDriverRoot: operatorDriverRoot,
		DevRoot: host, HostDevRoot: "/",
		Hook: hook, NVML: cditest.H100(),
	}
}

// writtenDevice reads the written spec back with the CDI library, as the runtime
// does, and returns the common edits merged with those of the GPU uuid.
func writtenDevice(t *testing.T, g *Generator, s *Spec, uuid string) (mounts []*specs.Mount, nodes []*specs.DeviceNode, hooks []*specs.Hook) {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(filepath.Dir(s.Path)), cdiapi.WithAutoRefresh(false))
	must(t, err)
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("the written spec does not load: %v", errs)
	}
	d := cache.GetDevice(g.QualifiedName(uuid))
	if d == nil {
		t.Fatalf("%s not in the spec", uuid)
	}
	common := d.GetSpec().ContainerEdits
	return append(common.Mounts, d.ContainerEdits.Mounts...), append(common.DeviceNodes, d.ContainerEdits.DeviceNodes...),
		append(common.Hooks, d.ContainerEdits.Hooks...)
}

// TestSpecOperatorDriverRoot: under the operator's driver container the spec names
// the driver's libraries and binaries by their host paths under /run/nvidia/driver
// and the device nodes by the host's /dev, with nothing of the agent's own view left;
// without the toolkit's hook (the values file's hook: none, and also auto, since the
// operator's toolkit is not under the driver root) the libraries are mounted into
// /usr/local/nvidia/lib64 under their sonames.
func TestSpecOperatorDriverRoot(t *testing.T) {
	host := operatorHost(t)
	for _, hook := range []string{HookNone, HookAuto} {
		t.Run(hook, func(t *testing.T) {
			g := newGen(t, operatorConfig(host, hook))
			devs := cditest.Devices(g.cfg.NVML)
			s, err := g.Generate(devs)
			if err != nil {
				t.Fatal(err)
			}
			if s.Hook != "" || s.LibraryDir != ContainerLibraryDir || len(s.Devices) != 8 || len(s.Missing) != 0 {
				t.Fatalf("hook %q, library dir %q, devices %v, missing %v", s.Hook, s.LibraryDir, s.Devices, s.Missing)
			}
			for _, want := range []string{"libcuda.so.1", "libcuda.so." + cditest.DriverVersion, "libnvidia-ml.so.1"} {
				if !slices.Contains(s.Libraries, filepath.Join(ContainerLibraryDir, want)) {
					t.Errorf("library %s missing: %v", want, s.Libraries)
				}
			}
			// GPU 0: its own node and the shared ones.
			mounts, nodes, hooks := writtenDevice(t, g, s, devs[0].UUID)
			var libs, smi int
			for _, m := range mounts {
				if strings.Contains(m.HostPath, host) {
					t.Errorf("mount %s keeps the agent's view of the driver root", m.HostPath)
				}
				if isLibrary(m.ContainerPath) {
					libs++
					if !strings.HasPrefix(m.HostPath, operatorDriverRoot+"/usr/lib/x86_64-linux-gnu/") || !strings.HasPrefix(m.ContainerPath, ContainerLibraryDir+"/") {
						t.Errorf("library mount %s -> %s, want from %s into %s", m.HostPath, m.ContainerPath, operatorDriverRoot, ContainerLibraryDir)
					}
				}
				if m.ContainerPath == "/usr/bin/nvidia-smi" {
					smi++
					if m.HostPath != operatorDriverRoot+"/usr/bin/nvidia-smi" {
						t.Errorf("nvidia-smi from %s", m.HostPath)
					}
				}
			}
			if libs == 0 || smi != 1 {
				t.Errorf("%d library mounts, %d nvidia-smi mounts: %v", libs, smi, mounts)
			}
			var paths []string
			for _, n := range nodes {
				paths = append(paths, n.Path)
				// The device nodes are the host's, not the driver container's.
				if n.HostPath != n.Path {
					t.Errorf("device node %s from %q, want the host's %s", n.Path, n.HostPath, n.Path)
				}
			}
			for _, want := range []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} {
				if !slices.Contains(paths, want) {
					t.Errorf("device node %s missing: %v", want, paths)
				}
			}
			for _, h := range hooks {
				t.Errorf("hook %s %v in a spec without the toolkit's hook", h.Path, h.Args)
			}
		})
	}
}

// TestSpecOperatorToolkitHook: naming the operator's nvidia-cdi-hook by its host path
// gives the toolkit's layout, the hook called by that host path (not moved under the
// driver root), the libraries at their container paths with host paths under
// /run/nvidia/driver.
func TestSpecOperatorToolkitHook(t *testing.T) {
	host := operatorHost(t)
	const hook = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
	g := newGen(t, operatorConfig(host, hook))
	devs := cditest.Devices(g.cfg.NVML)
	s, err := g.Generate(devs)
	if err != nil {
		t.Fatal(err)
	}
	if s.Hook != hook || s.LibraryDir != "" {
		t.Fatalf("hook %q, library dir %q", s.Hook, s.LibraryDir)
	}
	if !slices.Contains(s.Libraries, "/usr/lib/x86_64-linux-gnu/libcuda.so."+cditest.DriverVersion) {
		t.Fatalf("libraries %v", s.Libraries)
	}
	mounts, _, hooks := writtenDevice(t, g, s, devs[0].UUID)
	for _, m := range mounts {
		if isLibrary(m.ContainerPath) && m.HostPath != operatorDriverRoot+m.ContainerPath {
			t.Errorf("library mount %s -> %s, want the host path under %s", m.HostPath, m.ContainerPath, operatorDriverRoot)
		}
	}
	var ldcache bool
	for _, h := range hooks {
		if h.Path != hook {
			t.Errorf("hook %s, want %s", h.Path, hook)
		}
		if slices.Contains(h.Args, "update-ldcache") {
			ldcache = true
		}
	}
	if !ldcache {
		t.Errorf("no update-ldcache hook: %v", hooks)
	}
}

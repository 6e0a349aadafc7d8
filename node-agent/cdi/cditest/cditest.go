// SPDX-License-Identifier: Apache-2.0

// Package cditest builds what tests of the CDI spec need on a machine without a GPU:
// a driver root laid out as an NVIDIA driver install (the project's fake libcuda and
// libnvidia-ml from cuda-hook/fake, nvidia-smi, character device nodes) and go-nvml's
// fake DGX H100 that describes its GPUs.
package cditest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"golang.org/x/sys/unix"

	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// DriverVersion is the fake NVML server's driver version; the driver's libraries
// carry it as their suffix.
const DriverVersion = "550.54.15"

func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", "..")
}

// DriverRoot builds a driver root with the libraries in libDir (relative to it):
// libcuda.so.<version> and libnvidia-ml.so.<version> with their real sonames,
// usr/bin/nvidia-smi, and character device nodes dev/nvidia0..7, nvidiactl,
// nvidia-uvm and nvidia-uvm-tools. Device nodes need CAP_MKNOD (root, as the agent
// runs); the test is skipped without it, or without gcc.
func DriverRoot(t testing.TB, libDir string) string {
	t.Helper()
	root := t.TempDir()
	Driver(t, root, libDir)
	DeviceNodes(t, filepath.Join(root, "dev"))
	return root
}

// Driver writes the driver's user-space files into root (created if missing): the
// libraries in libDir (relative to root) and usr/bin/nvidia-smi, as DriverRoot does,
// without device nodes. The test is skipped without gcc.
func Driver(t testing.TB, root, libDir string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is needed to build the fake driver")
	}
	lib := filepath.Join(root, libDir)
	must(t, os.MkdirAll(lib, 0o755))
	fake := filepath.Join(repoRoot(), "cuda-hook")
	for _, l := range []struct{ src, soname, extra string }{
		{"fake/fake_cuda.c", "libcuda.so.1", "-Wl,--version-script=" + filepath.Join(fake, "fake/libcuda.map")},
		{"fake/fake_nvml.c", "libnvidia-ml.so.1", ""},
	} {
		out := filepath.Join(lib, strings.TrimSuffix(l.soname, ".1")+"."+DriverVersion)
		args := []string{"-std=gnu11", "-O1", "-fPIC", "-shared", "-I" + filepath.Join(fake, "include"), "-Wl,-soname," + l.soname,
			"-o", out, filepath.Join(fake, l.src), "-ldl", "-pthread"}
		if l.extra != "" {
			args = append(args, l.extra)
		}
		if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", l.src, err, b)
		}
	}
	bin := filepath.Join(root, "usr/bin")
	must(t, os.MkdirAll(bin, 0o755))
	must(t, os.WriteFile(filepath.Join(bin, "nvidia-smi"), []byte("#!/bin/sh\n"), 0o755))
}

// DeviceNodes creates the character device nodes nvidia0..7, nvidiactl, nvidia-uvm
// and nvidia-uvm-tools in dir. The test is skipped without CAP_MKNOD.
func DeviceNodes(t testing.TB, dir string) {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o755))
	nodes := map[string][2]uint32{"nvidiactl": {195, 255}, "nvidia-uvm": {510, 0}, "nvidia-uvm-tools": {510, 1}}
	for i := 0; i < 8; i++ {
		nodes[fmt.Sprintf("nvidia%d", i)] = [2]uint32{195, uint32(i)}
	}
	for name, mm := range nodes {
		if err := unix.Mknod(filepath.Join(dir, name), unix.S_IFCHR|0o666, int(unix.Mkdev(mm[0], mm[1]))); err != nil {
			t.Skipf("cannot create device nodes (needs CAP_MKNOD): %v", err)
		}
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// H100 is go-nvml's fake DGX H100 with MIG off on every GPU (the fake does not say).
func H100() *server.Server {
	s := dgxh100.New()
	for _, d := range s.Devices {
		d := d.(*server.Device)
		d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	}
	return s
}

// Devices is the agent's view of a fake server's GPUs.
func Devices(lib nvml.Interface) []gpu.Device {
	n, _ := lib.DeviceGetCount()
	var out []gpu.Device
	for i := 0; i < n; i++ {
		d, _ := lib.DeviceGetHandleByIndex(i)
		u, _ := d.GetUUID()
		m, _ := d.GetMinorNumber()
		out = append(out, gpu.Device{UUID: u, Index: i, Minor: m})
	}
	return out
}

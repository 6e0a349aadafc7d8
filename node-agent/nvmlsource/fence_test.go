// SPDX-License-Identifier: Apache-2.0

package nvmlsource

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/go-logr/logr"

	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// withDriverFence gives the mock's GPUs the driver's per-cgroup memory limit, backed
// by gpu.CgroupMemory, answering as NVML does: NOT_FOUND for a cgroup without a
// limit, INVALID_ARGUMENT for limits the driver refuses, OPERATING_SYSTEM for a
// cgroup it cannot open.
func withDriverFence(devs []*server.Device, mem *gpu.CgroupMemory) {
	for _, d := range devs {
		d := d
		d.SetMemoryLimits_v1Func = func(ns string, soft, hard uint64) nvml.Return {
			if ns == "/gone" {
				return nvml.ERROR_OPERATING_SYSTEM
			}
			if err := mem.SetMemoryLimit(d.UUID, ns, soft, hard); err != nil {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.SUCCESS
		}
		d.GetMemoryLimits_v1Func = func(ns string) (nvml.MemoryLimits_v1, nvml.Return) {
			if ns == "/gone" {
				return nvml.MemoryLimits_v1{}, nvml.ERROR_OPERATING_SYSTEM
			}
			l, err := mem.MemoryLimit(d.UUID, ns)
			if err != nil {
				return nvml.MemoryLimits_v1{}, nvml.ERROR_INVALID_ARGUMENT
			}
			if !l.Set {
				return nvml.MemoryLimits_v1{}, nvml.ERROR_NOT_FOUND
			}
			return nvml.MemoryLimits_v1{NameSpace: ns, SoftLimit: l.Soft, HardLimit: l.Hard, CurrentUsed: l.Used}, nvml.SUCCESS
		}
	}
}

func TestFenceOnDriverWithLimits(t *testing.T) {
	s, devs := h100(t)
	total := map[string]uint64{}
	for _, d := range devs {
		total[d.UUID] = 80 << 30
	}
	mem := gpu.NewCgroupMemory(total, nil)
	withDriverFence(devs, mem)
	devs[3].GetMigModeFunc = func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS }
	src, err := New(s, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	sup, err := src.FenceSupport("/sys/fs/cgroup/kubepods.slice")
	if err != nil {
		t.Fatal(err)
	}
	if len(sup) != len(devs) {
		t.Fatalf("support for %d GPUs, want %d", len(sup), len(devs))
	}
	for i, fs := range sup {
		if want := i != 3; fs.Supported != want || fs.UUID != devs[i].UUID {
			t.Errorf("GPU %d: %+v, want supported=%v", i, fs, want)
		}
	}
	if sup[3].Reason == "" {
		t.Error("the MIG-mode GPU has no reason")
	}

	cg := "/sys/fs/cgroup/kubepods.slice/c1.scope"
	u := devs[0].UUID
	if l, err := src.MemoryLimit(u, cg); err != nil || l.Set {
		t.Fatalf("limit before any is set: %+v, %v", l, err)
	}
	if err := src.SetMemoryLimit(u, cg, 4<<30, 4<<30); err != nil {
		t.Fatal(err)
	}
	l, err := src.MemoryLimit(u, cg)
	if err != nil || !l.Set || l.Hard != 4<<30 || l.Soft != 4<<30 {
		t.Fatalf("limit after set: %+v, %v", l, err)
	}
	if err := mem.Alloc(u, cg+"/child", 5<<30); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("allocating 5 GiB under a 4 GiB limit from a child cgroup: %v, want out of memory", err)
	}
	if err := src.SetMemoryLimit(u, cg, 0, gpu.NoMemoryLimit); err != nil {
		t.Fatal(err)
	}
	if l, err := src.MemoryLimit(u, cg); err != nil || l.Set {
		t.Errorf("limit after clearing: %+v, %v", l, err)
	}
	if err := src.SetMemoryLimit(devs[3].UUID, cg, 1, 1); !errors.Is(err, gpu.ErrFenceUnsupported) {
		t.Errorf("limit on a MIG-mode GPU: %v, want unsupported", err)
	}
	if err := src.SetMemoryLimit("MIG-1", cg, 1, 1); !errors.Is(err, gpu.ErrFenceUnsupported) {
		t.Errorf("limit on a MIG instance: %v, want unsupported", err)
	}
	if err := src.SetMemoryLimit(u, "/gone", 1, 1); err == nil || errors.Is(err, gpu.ErrFenceUnsupported) {
		t.Errorf("limit on a cgroup the driver cannot open: %v, want an error other than unsupported", err)
	}
}

func TestFenceOnDriverWithout(t *testing.T) {
	t.Run("not supported", func(t *testing.T) {
		s, devs := h100(t)
		for _, d := range devs {
			d.GetMemoryLimits_v1Func = func(string) (nvml.MemoryLimits_v1, nvml.Return) {
				return nvml.MemoryLimits_v1{}, nvml.ERROR_NOT_SUPPORTED
			}
			d.SetMemoryLimits_v1Func = func(string, uint64, uint64) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		}
		src, err := New(s, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		sup, err := src.FenceSupport("/sys/fs/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		for _, fs := range sup {
			if fs.Supported || fs.Reason == "" {
				t.Errorf("%+v: want unsupported with a reason", fs)
			}
		}
		if err := src.SetMemoryLimit(devs[0].UUID, "/sys/fs/cgroup/x", 1, 1); !errors.Is(err, gpu.ErrFenceUnsupported) {
			t.Errorf("set: %v, want unsupported", err)
		}
	})
	t.Run("symbol missing", func(t *testing.T) {
		s, devs := h100(t)
		s.LookupSymbolFunc = func(sym string) error {
			if sym == "nvmlDeviceSetMemoryLimits_v1" {
				return errors.New("undefined symbol")
			}
			return nil
		}
		called := false
		for _, d := range devs {
			// A driver without the symbol ends the process when it is called.
			d.GetMemoryLimits_v1Func = func(string) (nvml.MemoryLimits_v1, nvml.Return) {
				called = true
				return nvml.MemoryLimits_v1{}, nvml.SUCCESS
			}
			d.SetMemoryLimits_v1Func = func(string, uint64, uint64) nvml.Return { called = true; return nvml.SUCCESS }
		}
		src, err := New(s, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		sup, err := src.FenceSupport("/sys/fs/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		for _, fs := range sup {
			if fs.Supported {
				t.Errorf("%+v: want unsupported", fs)
			}
		}
		if err := src.SetMemoryLimit(devs[0].UUID, "/sys/fs/cgroup/x", 1, 1); !errors.Is(err, gpu.ErrFenceUnsupported) {
			t.Errorf("set: %v, want unsupported", err)
		}
		if _, err := src.MemoryLimit(devs[0].UUID, "/sys/fs/cgroup/x"); !errors.Is(err, gpu.ErrFenceUnsupported) {
			t.Errorf("get: %v, want unsupported", err)
		}
		if called {
			t.Error("a memory-limit call was made although the library lacks it")
		}
	})
}

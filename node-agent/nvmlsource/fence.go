// SPDX-License-Identifier: Apache-2.0

package nvmlsource

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/node-agent/gpu"
)

var _ gpu.MemoryFence = (*Source)(nil)

// fenceSymbols are the driver's per-cgroup memory-limit calls. go-nvml calls NVML's
// functions through symbols resolved when first called, so calling one that a driver
// predates ends the process: they are looked up before any call.
var fenceSymbols = []string{"nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1"}

// fenceCall says whether the driver's library has the memory-limit calls; the
// answer is read once.
func (s *Source) fenceCall() error {
	s.fenceOnce.Do(func() {
		for _, sym := range fenceSymbols {
			if err := s.lib.Extensions().LookupSymbol(sym); err != nil {
				s.fenceErr = fmt.Errorf("NVML %s: %s: %w", sym, nvml.ErrorString(nvml.ERROR_FUNCTION_NOT_FOUND), gpu.ErrFenceUnsupported)
				return
			}
		}
	})
	return s.fenceErr
}

// fenceError converts a memory-limit call's result, NOT_SUPPORTED (a driver or GPU
// without the limit) wrapping gpu.ErrFenceUnsupported.
func fenceError(op string, ret nvml.Return) error {
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return fmt.Errorf("%w: %w", &Error{Op: op, Ret: ret}, gpu.ErrFenceUnsupported)
	}
	return &Error{Op: op, Ret: ret}
}

// fenceDevice returns the whole GPU of this UUID; a MIG instance has no memory fence.
func (s *Source) fenceDevice(uuid string) (nvml.Device, error) {
	if strings.HasPrefix(uuid, "MIG-") {
		return nil, fmt.Errorf("%s is a MIG instance: %w", uuid, gpu.ErrFenceUnsupported)
	}
	d, ret := s.lib.DeviceGetHandleByUUID(uuid)
	if err := check("DeviceGetHandleByUUID", ret); err != nil {
		return nil, err
	}
	if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
		return nil, fmt.Errorf("GPU %s is in MIG mode: %w", uuid, gpu.ErrFenceUnsupported)
	}
	return d, nil
}

// FenceSupport asks the driver, for every whole GPU, for probeDir's limit: an answer
// (a limit, or none set) means the driver holds cgroups' memory on that GPU;
// NOT_SUPPORTED, a library without the call and MIG mode mean it does not. Any other
// error is reported as no support, with the error, so that a fence that cannot be
// confirmed is never counted on.
func (s *Source) FenceSupport(probeDir string) ([]gpu.FenceSupport, error) {
	missing := s.fenceCall()
	var out []gpu.FenceSupport
	err := s.eachGPU(func(_ int, d nvml.Device, uuid string) {
		fs := gpu.FenceSupport{UUID: uuid}
		switch cur, _, ret := d.GetMigMode(); {
		case missing != nil:
			fs.Reason = "the driver's NVML has no nvmlDeviceSetMemoryLimits_v1 (drivers before r615)"
		case ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE:
			fs.Reason = "MIG mode (the driver's limit takes no MIG instance; MIG partitions memory itself)"
		default:
			_, ret := d.GetMemoryLimits_v1(probeDir)
			switch ret {
			case nvml.SUCCESS, nvml.ERROR_NOT_FOUND:
				fs.Supported = true
			case nvml.ERROR_NOT_SUPPORTED:
				fs.Reason = "the driver reports the per-cgroup memory limit as not supported on this GPU"
			default:
				fs.Reason = fmt.Sprintf("probing the per-cgroup memory limit on %s failed: %s", probeDir, nvml.ErrorString(ret))
			}
		}
		out = append(out, fs)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SetMemoryLimit sets a cgroup's limit on a whole GPU.
func (s *Source) SetMemoryLimit(uuid, cgroupDir string, soft, hard uint64) error {
	if err := s.fenceCall(); err != nil {
		return err
	}
	d, err := s.fenceDevice(uuid)
	if err != nil {
		return err
	}
	return fenceError("DeviceSetMemoryLimits_v1("+cgroupDir+")", d.SetMemoryLimits_v1(cgroupDir, soft, hard))
}

// MemoryLimit reads a cgroup's limit on a whole GPU.
func (s *Source) MemoryLimit(uuid, cgroupDir string) (gpu.MemoryLimit, error) {
	if err := s.fenceCall(); err != nil {
		return gpu.MemoryLimit{}, err
	}
	d, err := s.fenceDevice(uuid)
	if err != nil {
		return gpu.MemoryLimit{}, err
	}
	l, ret := d.GetMemoryLimits_v1(cgroupDir)
	if ret == nvml.ERROR_NOT_FOUND {
		return gpu.MemoryLimit{}, nil
	}
	if err := fenceError("DeviceGetMemoryLimits_v1("+cgroupDir+")", ret); err != nil {
		return gpu.MemoryLimit{}, err
	}
	set := !(l.SoftLimit == 0 && l.HardLimit == gpu.NoMemoryLimit)
	return gpu.MemoryLimit{Set: set, Soft: l.SoftLimit, Hard: l.HardLimit, Used: l.CurrentUsed}, nil
}

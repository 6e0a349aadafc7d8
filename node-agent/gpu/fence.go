// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
)

// MemoryFence is the NVIDIA driver's per-cgroup device-memory limit (NVML's
// nvmlDeviceSetMemoryLimits_v1): every allocation a process of the cgroup makes on the
// GPU is held to the cgroup's hard limit by the driver itself, whether or not the
// process loaded the CUDA hook. A Source whose driver may have one implements it.
//
// Cgroups are named by their directory in the host's cgroup v2 hierarchy as the agent
// sees it ("/sys/fs/cgroup/kubepods.slice/…/cri-containerd-<id>.scope"); limits are
// in bytes and apply to whole GPUs only (never to MIG instances).
type MemoryFence interface {
	// FenceSupport says for every whole GPU of the node whether the driver holds a
	// cgroup's memory on it, probing with probeDir (an existing cgroup v2 directory).
	// An error means support cannot be read at all.
	FenceSupport(probeDir string) ([]FenceSupport, error)
	// SetMemoryLimit sets the cgroup's soft and hard limit on a GPU. An error wraps
	// ErrFenceUnsupported when the driver or the GPU has no such limit.
	SetMemoryLimit(uuid, cgroupDir string, soft, hard uint64) error
	// MemoryLimit reads the cgroup's limit on a GPU; Set is false when none is set.
	MemoryLimit(uuid, cgroupDir string) (MemoryLimit, error)
}

// FenceSupport is whether one GPU has the driver's memory fence.
type FenceSupport struct {
	UUID      string
	Supported bool
	// Reason says why a GPU has none (the driver's answer, MIG mode).
	Reason string
}

// MemoryLimit is a cgroup's limit on one GPU.
type MemoryLimit struct {
	// Set is false when the cgroup has no limit on the GPU.
	Set        bool
	Soft, Hard uint64
	// Used is what the cgroup's processes hold on the GPU.
	Used uint64
}

// NoMemoryLimit is the hard limit that means none (NVML_DEVICE_MEMORY_LIMIT_MAX); a
// limit is cleared by setting soft 0 and hard NoMemoryLimit.
const NoMemoryLimit = ^uint64(0)

// ErrFenceUnsupported is a driver or GPU without the per-cgroup memory limit.
var ErrFenceUnsupported = errors.New("the driver has no per-cgroup memory limit on this GPU")

// ErrOutOfMemory is an allocation refused by CgroupMemory.
var ErrOutOfMemory = errors.New("out of memory")

// CgroupMemory is a model of the driver's per-cgroup memory limits, for simulated
// nodes and tests: limits are kept per GPU and cgroup directory, and an allocation
// made from a cgroup is refused when it would take the cgroup, or any cgroup above
// it, past its hard limit (a process cannot escape its container's limit by moving
// into a cgroup of its own below it). The rules of nvmlDeviceSetMemoryLimits_v1 hold:
// soft at most hard, hard at most the GPU's memory unless it is NoMemoryLimit, soft 0
// with hard NoMemoryLimit clears the limit, and the cgroup directory must exist.
type CgroupMemory struct {
	mu sync.Mutex
	// total is each GPU's memory in bytes; only these GPUs support limits.
	total  map[string]uint64
	limits map[string]map[string]MemoryLimit // uuid -> cgroup dir -> limit
	used   map[string]map[string]uint64      // uuid -> cgroup dir -> bytes
	// exists says whether a cgroup directory exists; nil: every one does.
	exists func(dir string) bool
}

// NewCgroupMemory models GPUs of these total bytes. exists, when set, is asked
// whether a cgroup directory exists before a limit is set or read on it.
func NewCgroupMemory(total map[string]uint64, exists func(dir string) bool) *CgroupMemory {
	t := make(map[string]uint64, len(total))
	for k, v := range total {
		t[k] = v
	}
	return &CgroupMemory{total: t, limits: map[string]map[string]MemoryLimit{}, used: map[string]map[string]uint64{}, exists: exists}
}

func (m *CgroupMemory) check(uuid, dir string) error {
	if _, ok := m.total[uuid]; !ok {
		return fmt.Errorf("GPU %s: %w", uuid, ErrFenceUnsupported)
	}
	if !path.IsAbs(dir) || path.Clean(dir) != dir {
		return fmt.Errorf("cgroup %q is not a clean absolute path", dir)
	}
	if m.exists != nil && !m.exists(dir) {
		return fmt.Errorf("cgroup %s cannot be opened: it does not exist", dir)
	}
	return nil
}

// SetMemoryLimit sets or clears a cgroup's limit.
func (m *CgroupMemory) SetMemoryLimit(uuid, dir string, soft, hard uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(uuid, dir); err != nil {
		return err
	}
	if soft > hard || hard != NoMemoryLimit && hard > m.total[uuid] {
		return fmt.Errorf("invalid limits soft %d, hard %d on a GPU of %d bytes", soft, hard, m.total[uuid])
	}
	if m.limits[uuid] == nil {
		m.limits[uuid] = map[string]MemoryLimit{}
	}
	if soft == 0 && hard == NoMemoryLimit {
		delete(m.limits[uuid], dir)
		return nil
	}
	m.limits[uuid][dir] = MemoryLimit{Set: true, Soft: soft, Hard: hard}
	return nil
}

// MemoryLimit reads a cgroup's limit and its usage (its own and its descendants').
func (m *CgroupMemory) MemoryLimit(uuid, dir string) (MemoryLimit, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(uuid, dir); err != nil {
		return MemoryLimit{}, err
	}
	l := m.limits[uuid][dir]
	l.Used = m.usedBelow(uuid, dir)
	return l, nil
}

// FenceSupport reports every modelled GPU as supported.
func (m *CgroupMemory) FenceSupport(string) ([]FenceSupport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]FenceSupport, 0, len(m.total))
	for u := range m.total {
		out = append(out, FenceSupport{UUID: u, Supported: true})
	}
	return out, nil
}

func within(dir, parent string) bool {
	return dir == parent || parent == "/" || strings.HasPrefix(dir, parent+"/")
}

func (m *CgroupMemory) usedBelow(uuid, dir string) uint64 {
	var n uint64
	for cg, b := range m.used[uuid] {
		if within(cg, dir) {
			n += b
		}
	}
	return n
}

// Alloc takes bytes on a GPU for a process of cgroup dir, as the driver does for any
// allocation (through the CUDA hook or not): refused with ErrOutOfMemory when the
// cgroup or a cgroup above it would pass its hard limit, or the GPU its memory.
func (m *CgroupMemory) Alloc(uuid, dir string, bytes uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	total, ok := m.total[uuid]
	if !ok {
		return fmt.Errorf("no GPU %s", uuid)
	}
	if m.usedBelow(uuid, "/")+bytes > total {
		return fmt.Errorf("GPU %s: %w", uuid, ErrOutOfMemory)
	}
	for cg, l := range m.limits[uuid] {
		if within(dir, cg) && m.usedBelow(uuid, cg)+bytes > l.Hard {
			return fmt.Errorf("GPU %s: cgroup %s holds its hard limit of %d bytes: %w", uuid, cg, l.Hard, ErrOutOfMemory)
		}
	}
	if m.used[uuid] == nil {
		m.used[uuid] = map[string]uint64{}
	}
	m.used[uuid][dir] += bytes
	return nil
}

// Free gives back bytes a process of cgroup dir took on a GPU.
func (m *CgroupMemory) Free(uuid, dir string, bytes uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used[uuid][dir] <= bytes {
		delete(m.used[uuid], dir)
		return
	}
	m.used[uuid][dir] -= bytes
}

// RemoveCgroup forgets a removed cgroup: the driver drops its limits with it.
func (m *CgroupMemory) RemoveCgroup(dir string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.limits {
		delete(l, dir)
	}
	for _, u := range m.used {
		delete(u, dir)
	}
}

var _ MemoryFence = (*CgroupMemory)(nil)

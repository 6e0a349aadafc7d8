// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// Fence is the driver's per-cgroup memory limit, set on every bound container's
// cgroup on the GPUs where the node agent found it at start. It holds a process that
// never loads the CUDA hook (a static binary, raw ioctls, a driver found through
// dl_iterate_phdr) to its grant, in the driver.
//
// Each GPU's limit is the grant's memory, hard and soft alike: the hard limit is the
// grant; the soft limit, what the driver guarantees the cgroup before allocations may
// fail under memory pressure, is the grant too, as the scheduler promises the whole
// grant (it keeps the grants on a GPU within its memory, so the guarantees fit too).
type Fence struct {
	// Driver sets and reads the limits.
	Driver gpu.MemoryFence
	// Supported says whether the driver holds cgroups' memory on a GPU or MIG
	// instance (never on a MIG instance).
	Supported func(uuid string) bool
	// CgroupRoot is the host's cgroup v2 hierarchy as the agent sees it
	// ("/sys/fs/cgroup"): a container's cgroup directory is CgroupRoot joined with
	// its cgroup path.
	CgroupRoot string
}

// fence sets the driver's limit of the container's cgroup on each granted GPU that
// has it, before any process of the container can use the GPU. A limit is never
// raised: a cgroup whose limit on a GPU is already at or below the grant keeps it (a
// second bind, a retry, an agent restart). The caller holds b.mu, or is about to
// start a container no other call binds.
func (b *Binder) fence(cgroup string, grants []api.DeviceGrant) error {
	f := b.cfg.Fence
	if f == nil || f.Driver == nil {
		return nil
	}
	dir := filepath.Join(f.CgroupRoot, cgroup)
	checked := false
	for _, g := range grants {
		if !f.Supported(g.UUID) {
			continue
		}
		if b.cfg.MPS != nil {
			if _, mps := b.cfg.MPS(g.UUID); mps {
				// An MPS client's memory is allocated by its GPU's MPS server, in the
				// server's cgroup: MPS's pinned-memory limit holds it instead.
				continue
			}
		}
		if !checked {
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				return fmt.Errorf("the driver's memory limit cannot be set: the container's cgroup %s does not exist (%v)", dir, err)
			}
			checked = true
		}
		want := uint64(g.MemoryMiB) << 20
		cur, err := f.Driver.MemoryLimit(g.UUID, dir)
		if err != nil {
			return fmt.Errorf("reading the driver's memory limit of cgroup %s on GPU %s: %w", dir, g.UUID, err)
		}
		if cur.Set && cur.Hard <= want {
			continue
		}
		if err := f.Driver.SetMemoryLimit(g.UUID, dir, want, want); err != nil {
			return fmt.Errorf("setting the driver's memory limit of cgroup %s on GPU %s to %d MiB: %w", dir, g.UUID, g.MemoryMiB, err)
		}
	}
	return nil
}

// FenceContainer sets the driver's memory limit of a bound container (the NRI
// plugin calls it when the runtime has created the container's cgroup and not yet
// started its process). A container without a record is not Tessera's: nil. A
// failure is a RefusedError: the container must not start without the fence the
// node has.
func (b *Binder) FenceContainer(containerID string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	rec, ok := b.cfg.Store.Get(containerID)
	if !ok {
		return nil
	}
	if err := b.fence(rec.Cgroup, rec.Devices); err != nil {
		return &RefusedError{Reason: fmt.Sprintf("container %q of pod %s/%s: %v. It is not started", rec.Container, rec.Namespace, rec.Pod, err)}
	}
	return nil
}

// FenceClaimContainer sets the driver's memory limit of a container that uses DRA
// claims (the NRI plugin calls it where it calls FenceContainer). A claim is bound
// before its containers exist, so its record names no cgroup; a container uses the
// claims whose limits directory is the source of its mount at api.ContainerLimitsDir
// (the claim's CDI device put it in the runtime's spec; mounts are given as
// source, destination pairs). On each GPU the container's cgroup is held to the memory
// its claims consumed there. A claim's containers are each held to the claim's
// memory: together, past the hook, they may hold up to that many times it (the hook's
// shared accounting and the watchdog count them together). A container that uses no
// claim, or a node without the fence: nil. A failure is a RefusedError.
func (b *Binder) FenceClaimContainer(r Request, mounts [][2]string) error {
	if b.cfg.Fence == nil || b.cfg.Fence.Driver == nil || b.cfg.ClaimStore == nil {
		return nil
	}
	var sources []string
	for _, m := range mounts {
		if filepath.Clean(m[1]) == api.ContainerLimitsDir {
			sources = append(sources, filepath.Clean(m[0]))
		}
	}
	if len(sources) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var grants []api.DeviceGrant
	var names []string
	for _, rec := range b.claimRecords() {
		if rec.LimitsDir == "" || !slices.Contains(sources, filepath.Clean(rec.LimitsDir)) {
			continue
		}
		names = append(names, rec.Namespace+"/"+rec.Pod)
		for _, g := range rec.Devices {
			i := slices.IndexFunc(grants, func(h api.DeviceGrant) bool { return h.UUID == g.UUID })
			if i < 0 {
				grants = append(grants, api.DeviceGrant{UUID: g.UUID, MemoryMiB: g.MemoryMiB})
				continue
			}
			grants[i].MemoryMiB += g.MemoryMiB
		}
	}
	if len(grants) == 0 {
		return nil
	}
	who := fmt.Sprintf("container %q of pod %s/%s (claims %s)", r.Container, r.Namespace, r.Pod, strings.Join(names, ", "))
	cgroup, err := ResolveCgroup(r.CgroupsPath)
	if err != nil {
		return &RefusedError{Reason: fmt.Sprintf("%s: %v. It is not started", who, err)}
	}
	if err := b.fence(cgroup, grants); err != nil {
		return &RefusedError{Reason: fmt.Sprintf("%s: %v. It is not started", who, err)}
	}
	return nil
}

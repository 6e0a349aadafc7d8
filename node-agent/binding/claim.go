// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
)

// A DRA ResourceClaim (package dra) is bound once, when kubelet prepares it, before any
// of its containers exists: the binder then knows the claim's devices and the share of
// each that its allocation consumed, but no container, cgroup or environment. So a
// claim is bound like one container that every container using the claim becomes:
//
//   - one limits file for the claim, keyed by ClaimCgroup(uid) instead of a cgroup
//     (the hook uses the field only to name the accounting region and its turn id), so
//     that the claim's containers share one memory and one compute limit;
//   - its accounting region in a host directory of the claim's own, beside the limits
//     file, mounted read-write at api.ContainerRegionDir into each of its containers
//     (a tmpfs of the runtime's would give each container a region, and a limit, of its
//     own);
//   - the edits are what the runtime applies from the claim's CDI device: mounts and
//     environment only. LD_LIBRARY_PATH is left alone (a CDI edit would replace the
//     image's value), so a node without the toolkit's hook needs the pod to name the
//     driver's library directory itself.
//
// The record goes to Config.ClaimStore, keyed by the claim's UID, since kubelet
// unprepares a claim by UID alone.

// claimRegionSubdir is the claim's region directory inside its limits directory.
const claimRegionSubdir = "region"

// Claim is a DRA ResourceClaim allocated on this node.
type Claim struct {
	UID, Namespace, Name string
	// Devices are the claim's GPUs or MIG instances, in allocation order, each with
	// the memory and cores the allocation consumed of it.
	Devices []api.DeviceGrant
	// WorkConserving is the claim's configuration's workConserving (api.GPUConfig),
	// what AnnotationWorkConserving is for a pod.
	WorkConserving bool
}

// ClaimCgroup is the key the limits file of claim uid is written under, in place of a
// container's cgroup.
func ClaimCgroup(uid string) string { return "/tessera.dev/claims/" + uid }

// BindClaim binds a prepared claim: it checks its grants against the node's inventory
// and everything already bound on its devices, writes its limits file and returns the
// edits every container of the claim gets. It is idempotent: a claim bound before is
// bound again with its recorded grant (and the same compute phases); the same UID with
// other devices is refused. Refusals are RefusedErrors.
func (b *Binder) BindClaim(c Claim) (*Edits, error) {
	who := fmt.Sprintf("claim %s/%s (%s)", c.Namespace, c.Name, c.UID)
	refuse := func(format string, args ...any) (*Edits, error) {
		return nil, &RefusedError{Reason: who + ": " + fmt.Sprintf(format, args...)}
	}
	if b.cfg.ClaimStore == nil {
		return nil, errors.New("binding: no claim checkpoint configured")
	}
	if c.UID == "" || path.Base(c.UID) != c.UID || c.UID == "." || c.UID == ".." {
		return refuse("the claim has no usable UID")
	}
	key := ClaimCgroup(c.UID)
	if err := api.CheckCgroupPath(key); err != nil {
		return refuse("its UID cannot key a limits file: %v", err)
	}
	r := Request{Namespace: c.Namespace, Pod: c.Name, ContainerID: c.UID, claimWorkConserving: c.WorkConserving}
	b.mu.Lock()
	defer b.mu.Unlock()
	if rec, ok := b.cfg.ClaimStore.Get(c.UID); ok {
		if !slices.Equal(rec.Devices, c.Devices) {
			return refuse("it was prepared with %s and is now allocated %s; a claim's allocation does not change while it is prepared",
				grantsString(rec.Devices), grantsString(c.Devices))
		}
		return b.apply(r, who, key, rec.Devices, &rec, true)
	}
	if len(c.Devices) == 0 {
		return refuse("it is allocated no device of this driver")
	}
	if b.cfg.Unmet != nil {
		if why := b.cfg.Unmet(); why != "" {
			return refuse("%s", why)
		}
	}
	inv, err := b.cfg.Inventory()
	if err != nil {
		return refuse("the node's GPU inventory is not available to check the allocation against: %v", err)
	}
	if why := b.checkClaim(&r, c.Devices, inv); why != "" {
		return refuse("%s. Its containers are not started", why)
	}
	return b.apply(r, who, key, c.Devices, nil, true)
}

// checkClaim checks a claim's grants as the device-plugin path checks an assignment:
// each device a schedulable GPU or MIG instance of the inventory, healthy, named once,
// with memory between what a CUDA context takes and the device's, cores 1..100, at
// most one device on an MPS GPU, room under its MPS server's client limit, and room
// beside everything already bound there. It returns "" or what is wrong. The caller
// holds b.mu.
func (b *Binder) checkClaim(r *Request, grants []api.DeviceGrant, inv *api.NodeInventory) string {
	if len(grants) > api.MaxGPUsPerContainer {
		return fmt.Sprintf("it holds %d devices, more than the %d a container may have", len(grants), api.MaxGPUsPerContainer)
	}
	gpus := map[string]*api.GPU{}
	healthy := map[string]bool{}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		gpus[g.UUID] = g
		healthy[g.UUID] = g.Healthy
		if g.MIG != nil {
			for _, m := range g.MIG.Instances {
				healthy[m.UUID] = g.Healthy
			}
		}
	}
	seen := map[string]bool{}
	for _, d := range grants {
		total, ok := inv.SchedulableMemoryMiB(d.UUID)
		if !ok {
			return fmt.Sprintf("device %s is not a schedulable GPU or MIG instance of this node", d.UUID)
		}
		if seen[d.UUID] {
			return fmt.Sprintf("it holds device %s twice (two of its requests were given the same device); ask for one share of it with "+
				"the sum of the capacities, or keep the requests on distinct devices with the constraint distinctAttribute: %s/uuid", d.UUID, api.DRADriverName)
		}
		seen[d.UUID] = true
		if !healthy[d.UUID] {
			return fmt.Sprintf("device %s is unhealthy", d.UUID)
		}
		sharing := api.SharingTimeSliced
		if g := gpus[d.UUID]; g != nil {
			sharing = g.Mode()
			if _, served := b.mpsDirs(d.UUID); served != (sharing == api.SharingMPS) {
				return fmt.Sprintf("GPU %s is in %s mode in the node's inventory, but the node agent does not serve it so", d.UUID, sharing)
			}
		}
		if d.Cores < 1 || d.Cores > 100 {
			return fmt.Sprintf("it consumes %d%% cores of %s; cores must be 1..100", d.Cores, d.UUID)
		}
		if least := api.ContextCharge(b.cfg.ContextMiB, sharing, d.Cores); d.MemoryMiB < least || d.MemoryMiB > total {
			return fmt.Sprintf("it consumes %d MiB of %s, which has %d MiB; a share needs at least %d MiB there (the CUDA hook on this node charges that for %s, --context-mib %d)",
				d.MemoryMiB, d.UUID, total, least, api.ContextChargeWords(sharing, d.Cores), b.cfg.ContextMiB)
		}
		if sharing == api.SharingMPS {
			if len(grants) != 1 {
				return fmt.Sprintf("GPU %s is served by MPS, which takes one GPU per container, and the claim holds %d devices", d.UUID, len(grants))
			}
			if n := b.mpsClients(d.UUID, r); n+1 > gpus[d.UUID].MPSClients {
				return fmt.Sprintf("GPU %s's MPS server takes %d clients and %d are bound to it already", d.UUID, gpus[d.UUID].MPSClients, n)
			}
		}
	}
	return b.checkRoomFor("", "", r.ContainerID, grants, inv)
}

// UnbindClaim forgets a claim, rewrites the share files of its devices and removes its
// limits directory (its region with it). A claim not bound is no error.
func (b *Binder) UnbindClaim(uid string) error {
	if b.cfg.ClaimStore == nil {
		return errors.New("binding: no claim checkpoint configured")
	}
	return b.unbind(b.cfg.ClaimStore, uid)
}

// Claims returns the bound claims' records.
func (b *Binder) Claims() []checkpoint.Record { return b.claimRecords() }

func (b *Binder) claimRecords() []checkpoint.Record {
	if b.cfg.ClaimStore == nil {
		return nil
	}
	return b.cfg.ClaimStore.List()
}

// allRecords returns the records of bound containers and of bound claims.
func (b *Binder) allRecords() []checkpoint.Record {
	return append(b.cfg.Store.List(), b.claimRecords()...)
}

// claimRegionMount makes the claim's region directory under its limits directory
// (mode 1777, as /dev/shm: the tenant may run as any user), a file system of its own
// where fs is set, and returns its read-write bind mount at api.ContainerRegionDir.
// Anything but a directory in its place is an error.
func claimRegionMount(limitsDir string, fs ClaimRegionFS) (Mount, error) {
	dir := filepath.Join(limitsDir, claimRegionSubdir)
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return Mount{}, fmt.Errorf("claim region directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return Mount{}, fmt.Errorf("claim region directory: %w", err)
	}
	if !fi.IsDir() {
		return Mount{}, fmt.Errorf("claim region directory %s is %s, not a directory", dir, fileKind(fi.Mode()))
	}
	if fs != nil {
		if err := fs.Mount(dir); err != nil {
			return Mount{}, err
		}
	}
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
		return Mount{}, fmt.Errorf("claim region directory: %w", err)
	}
	return Mount{Source: dir, Destination: api.ContainerRegionDir}, nil
}

func grantsString(gs []api.DeviceGrant) string {
	s := ""
	for i, g := range gs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s (%d MiB, %d%% cores)", g.UUID, g.MemoryMiB, g.Cores)
	}
	if s == "" {
		return "no device"
	}
	return s
}

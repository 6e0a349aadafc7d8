// SPDX-License-Identifier: Apache-2.0

package api

import "fmt"

// SchedulableMemoryMiB returns the memory of the schedulable device with this UUID on
// the node: a GPU not in MIG mode, or a MIG instance. A GPU in MIG mode is not
// schedulable as a whole (its instances are), so its UUID is not found.
func (inv *NodeInventory) SchedulableMemoryMiB(uuid string) (int64, bool) {
	if inv == nil {
		return 0, false
	}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		if g.MIG == nil {
			if g.UUID == uuid {
				return g.MemoryMiB, true
			}
			continue
		}
		for _, m := range g.MIG.Instances {
			if m.UUID == uuid {
				return m.MemoryMiB, true
			}
		}
	}
	return 0, false
}

// CheckGrant reports whether ca is what the scheduler grants for req: the same kind
// of container (init or not), as many devices as GPUs asked for, and on each device
// the memory the request takes there (memoryOf gives a schedulable device's memory,
// false for a device the node does not schedule) and exactly the cores asked for.
// The node agent applies it to every assignment before it enforces one, so that an
// assignment written by anyone but the scheduler grants no more than the container's
// own request. The error says what differs.
func CheckGrant(req ContainerRequest, ca *ContainerAssignment, memoryOf func(uuid string) (int64, bool)) error {
	if ca.Init != req.Init {
		return fmt.Errorf("the assignment says init=%t for container %q, whose spec says init=%t", ca.Init, req.Name, req.Init)
	}
	if len(ca.Devices) != req.GPUs {
		return fmt.Errorf("the assignment grants %d devices, the container asks for %d", len(ca.Devices), req.GPUs)
	}
	for _, d := range ca.Devices {
		total, ok := memoryOf(d.UUID)
		if !ok {
			return fmt.Errorf("the assignment grants %s, which is not a schedulable GPU or MIG instance of this node", d.UUID)
		}
		if want := req.MemoryOn(total); d.MemoryMiB != want {
			return fmt.Errorf("the assignment grants %d MiB on %s, the container's request (%s) takes %d MiB there", d.MemoryMiB, d.UUID, req, want)
		}
		if d.Cores != req.Cores {
			return fmt.Errorf("the assignment grants %d%% cores on %s, the container asks for %d%%", d.Cores, d.UUID, req.Cores)
		}
	}
	return nil
}

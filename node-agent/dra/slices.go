// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api"
)

// DriverName is the DRA driver's name: the ResourceSlices' spec.driver, the
// DeviceClasses' selector and the domain of the devices' attributes and capacities.
const DriverName = api.DRADriverName

// The capacities of every device. A claim consumes part of each (consumable capacity,
// KEP-5075): memoryCapacity in bytes, always a whole number of MiB (the step), at
// least what the CUDA hook charges for one context; coresCapacity in percent of the
// device's compute, 1..100.
const (
	CapacityMemory resourceapi.QualifiedName = "memory"
	CapacityCores  resourceapi.QualifiedName = "cores"
)

// The attributes of every device, in the driver's domain (attributes["gpu.tessera.dev"]
// in CEL), besides the standard resource.kubernetes.io/pciBusID and numaNode.
const (
	AttrType         resourceapi.QualifiedName = "type"         // "gpu" or "mig"
	AttrUUID         resourceapi.QualifiedName = "uuid"         // the GPU's or MIG instance's UUID
	AttrIndex        resourceapi.QualifiedName = "index"        // NVML index (the parent's for MIG)
	AttrModel        resourceapi.QualifiedName = "model"        // NVML name
	AttrMemoryMiB    resourceapi.QualifiedName = "memoryMiB"    // the device's memory
	AttrSMCount      resourceapi.QualifiedName = "smCount"      // when known
	AttrSharing      resourceapi.QualifiedName = "sharing"      // "time-sliced" or "mps"
	AttrMemoryFence  resourceapi.QualifiedName = "memoryFence"  // "driver" or "hook"
	AttrNVLinkIsland resourceapi.QualifiedName = "nvlinkIsland" // lowest index of the GPUs joined to it by NVLink
	AttrMIGProfile   resourceapi.QualifiedName = "migProfile"   // MIG instances
	AttrParentUUID   resourceapi.QualifiedName = "parentUUID"   // MIG instances
	AttrDriver       resourceapi.QualifiedName = "driverVersion"
)

// TaintUnhealthy marks a device the node's inventory reports unhealthy: claims that do
// not tolerate it are not allocated it (NoSchedule).
const TaintUnhealthy = DriverName + "/unhealthy"

// NUMANodeAttribute is the standard attribute of the device's host NUMA node.
const NUMANodeAttribute = resourceapi.QualifiedName(deviceattribute.StandardDeviceAttributePrefix + "numaNode")

// maxDevicesPerSlice is the API's limit for slices that use device taints.
const maxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// DeviceName is the device name of a GPU or MIG instance in the ResourceSlice: its
// UUID in lower case ("gpu-0f3c…", "mig-…"), a DNS label that stays with the device
// whatever NVML's index order, so that an allocation names the same device at prepare.
func DeviceName(uuid string) string { return strings.ToLower(uuid) }

// Devices returns the ResourceSlice devices of an inventory: each GPU not in MIG mode,
// and each MIG instance of a GPU in MIG mode, in index order.
func Devices(inv *api.NodeInventory) []resourceapi.Device {
	islands := nvlinkIslands(inv)
	var out []resourceapi.Device
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		if g.MIG == nil {
			d := device(inv, g, g.UUID, g.MemoryMiB, g.SMCount, islands)
			d.Attributes[AttrType] = str("gpu")
			out = append(out, d)
			continue
		}
		for _, m := range g.MIG.Instances {
			d := device(inv, g, m.UUID, m.MemoryMiB, m.SMCount, islands)
			d.Attributes[AttrType] = str("mig")
			d.Attributes[AttrMIGProfile] = str(m.Profile)
			d.Attributes[AttrParentUUID] = str(g.UUID)
			out = append(out, d)
		}
	}
	return out
}

// device is one device on GPU g with this UUID, memory and SMs.
func device(inv *api.NodeInventory, g *api.GPU, uuid string, memMiB int64, sms int, islands map[int]int) resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrUUID:      str(uuid),
		AttrIndex:     integer(int64(g.Index)),
		AttrModel:     str(g.Model),
		AttrMemoryMiB: integer(memMiB),
		AttrSharing:   str(string(g.Mode())),
		AttrMemoryFence: str(func() string {
			if g.MemoryFence == api.MemoryFenceDriver && g.MIG == nil {
				return string(api.MemoryFenceDriver)
			}
			return "hook"
		}()),
	}
	if sms > 0 {
		attrs[AttrSMCount] = integer(int64(sms))
	}
	if g.NUMANode >= 0 {
		attrs[NUMANodeAttribute] = integer(int64(g.NUMANode))
	}
	if g.PCIBusID != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIBusID] = str(g.PCIBusID)
	}
	if is, ok := islands[g.Index]; ok {
		attrs[AttrNVLinkIsland] = integer(int64(is))
	}
	if inv.Driver != "" {
		attrs[AttrDriver] = str(inv.Driver)
	}
	d := resourceapi.Device{
		Name:                     DeviceName(uuid),
		Attributes:               attrs,
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapacityMemory: memoryCapacity(api.ContextCharge(inv.ContextCharge(), g.Mode(), 1), memMiB),
			CapacityCores:  coresCapacity(),
		},
	}
	if !g.Healthy {
		d.Taints = []resourceapi.DeviceTaint{{Key: TaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return d
}

// memoryCapacity is a device's memory: by default a claim takes all of it; a claim
// asking for less gets a whole number of MiB, at least least, what the node's hook
// charges for a CUDA context (the node's --context-mib; an MPS client's context is
// smaller the fewer SMs it has: the least of those, and prepare checks the share's
// own).
func memoryCapacity(least, memMiB int64) resourceapi.DeviceCapacity {
	if least > memMiB {
		least = memMiB
	}
	return resourceapi.DeviceCapacity{
		Value: mib(memMiB),
		RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default: ptr.To(mib(memMiB)),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{
				Min: ptr.To(mib(least)), Max: ptr.To(mib(memMiB)), Step: ptr.To(mib(1)),
			},
		},
	}
}

// coresCapacity is a device's compute in percent: by default a claim takes all of it.
func coresCapacity() resourceapi.DeviceCapacity {
	q := func(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.DecimalSI) }
	return resourceapi.DeviceCapacity{
		Value: *q(100),
		RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default:    q(100),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q(1), Max: q(100), Step: q(1)},
		},
	}
}

// Resources is what the node publishes: one pool named after the node, its devices in
// slices of at most maxDevicesPerSlice. A node without GPUs publishes one empty slice,
// so that the pool shows the driver is running.
func Resources(nodeName string, inv *api.NodeInventory) resourceslice.DriverResources {
	devs := Devices(inv)
	var slices []resourceslice.Slice
	for len(devs) > maxDevicesPerSlice {
		slices = append(slices, resourceslice.Slice{Devices: devs[:maxDevicesPerSlice]})
		devs = devs[maxDevicesPerSlice:]
	}
	slices = append(slices, resourceslice.Slice{Devices: devs})
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: {Slices: slices}}}
}

// nvlinkIslands maps the index of every GPU joined to another by NVLink to its island:
// the lowest index among the GPUs it reaches over NVLink (directly or through others).
// GPUs without NVLink are in no island.
func nvlinkIslands(inv *api.NodeInventory) map[int]int {
	parent := map[int]int{}
	var find func(int) int
	find = func(i int) int {
		if parent[i] == i {
			return i
		}
		parent[i] = find(parent[i])
		return parent[i]
	}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		for _, l := range g.Links {
			if l.NVLinks <= 0 {
				continue
			}
			for _, x := range []int{g.Index, l.Peer} {
				if _, ok := parent[x]; !ok {
					parent[x] = x
				}
			}
			// The lower root stays root, so an island is named by its lowest index.
			if a, b := find(g.Index), find(l.Peer); a < b {
				parent[b] = a
			} else if b < a {
				parent[a] = b
			}
		}
	}
	out := make(map[int]int, len(parent))
	for i := range parent {
		out[i] = find(i)
	}
	return out
}

func mib(n int64) resource.Quantity { return *resource.NewQuantity(n<<20, resource.BinarySI) }

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func integer(v int64) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{IntValue: &v} }

// quantityMiB converts a consumed memory capacity to MiB; it must be a whole number.
func quantityMiB(q resource.Quantity) (int64, error) {
	v, ok := q.AsInt64()
	if !ok || v < 0 || v%(1<<20) != 0 {
		return 0, fmt.Errorf("memory %s is not a whole number of MiB", q.String())
	}
	return v >> 20, nil
}

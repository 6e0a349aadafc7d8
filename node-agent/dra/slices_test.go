// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/test/fixtures"
)

func TestDevices(t *testing.T) {
	inv := fixtures.NVLinkNode("n", 4, 2, "NVIDIA H100 80GB HBM3", 81559)
	inv.Driver = "580.65.06"
	inv.GPUs[1].Healthy, inv.GPUs[1].HealthReason = false, "XID 79"
	inv.GPUs[2].Sharing, inv.GPUs[2].MPSClients = api.SharingMPS, 8
	inv.GPUs[3].MIG = &api.MIG{Instances: []api.MIGInstance{
		{UUID: "MIG-a", Profile: "1g.10gb", MemoryMiB: 9984, SMCount: 16},
		{UUID: "MIG-b", Profile: "3g.40gb", MemoryMiB: 40192, SMCount: 60},
	}}
	devs := Devices(inv)
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if want := []string{"gpu-n-0", "gpu-n-1", "gpu-n-2", "mig-a", "mig-b"}; !equal(names, want) {
		t.Fatalf("devices %v, want %v (the MIG-mode GPU only through its instances)", names, want)
	}
	for _, d := range devs {
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("%s: not shareable", d.Name)
		}
		c := d.Capacity[CapacityCores]
		if c.Value.Value() != 100 || c.RequestPolicy.Default.Value() != 100 || c.RequestPolicy.ValidRange.Min.Value() != 1 ||
			c.RequestPolicy.ValidRange.Max.Value() != 100 || c.RequestPolicy.ValidRange.Step.Value() != 1 {
			t.Errorf("%s: cores %+v", d.Name, c)
		}
	}
	gpu0 := devs[0]
	mem := gpu0.Capacity[CapacityMemory]
	// 81559 MiB; a claim takes all of it by default, at least one context's charge
	// (576 MiB) in whole MiB.
	if mem.Value.Value() != 81559<<20 || mem.RequestPolicy.Default.Value() != 81559<<20 ||
		mem.RequestPolicy.ValidRange.Min.Value() != 576<<20 || mem.RequestPolicy.ValidRange.Max.Value() != 81559<<20 ||
		mem.RequestPolicy.ValidRange.Step.Value() != 1<<20 {
		t.Errorf("memory %+v", mem)
	}
	attr := func(d resourceapi.Device, n resourceapi.QualifiedName) any {
		a, ok := d.Attributes[n]
		switch {
		case !ok:
			return nil
		case a.StringValue != nil:
			return *a.StringValue
		case a.IntValue != nil:
			return *a.IntValue
		}
		return a
	}
	for _, c := range []struct {
		dev  int
		name resourceapi.QualifiedName
		want any
	}{
		{0, AttrUUID, "GPU-n-0"}, {0, AttrType, "gpu"}, {0, AttrModel, "NVIDIA H100 80GB HBM3"}, {0, AttrMemoryMiB, int64(81559)},
		{0, AttrIndex, int64(0)}, {0, AttrSharing, "time-sliced"}, {0, AttrMemoryFence, "hook"}, {0, AttrDriver, "580.65.06"},
		{0, NUMANodeAttribute, int64(inv.GPUs[0].NUMANode)},
		// Islands of two: 0-1 and 2-3, named by their lowest index.
		{0, AttrNVLinkIsland, int64(0)}, {1, AttrNVLinkIsland, int64(0)}, {2, AttrNVLinkIsland, int64(2)}, {3, AttrNVLinkIsland, int64(2)},
		{2, AttrSharing, "mps"},
		{3, AttrType, "mig"}, {3, AttrUUID, "MIG-a"}, {3, AttrMIGProfile, "1g.10gb"}, {3, AttrParentUUID, "GPU-n-3"}, {3, AttrIndex, int64(3)},
		{3, AttrMemoryMiB, int64(9984)}, {3, AttrSMCount, int64(16)},
	} {
		if got := attr(devs[c.dev], c.name); got != c.want {
			t.Errorf("%s: %s = %v, want %v", devs[c.dev].Name, c.name, got, c.want)
		}
	}
	// An MPS GPU's least share is the smallest MPS client context's charge.
	if min := devs[2].Capacity[CapacityMemory].RequestPolicy.ValidRange.Min.Value(); min != api.MPSContextMiB(api.DefaultContextMiB, 1)<<20 {
		t.Errorf("MPS memory min %d", min)
	}
	for i, d := range devs {
		tainted := len(d.Taints) == 1 && d.Taints[0].Key == TaintUnhealthy && d.Taints[0].Effect == resourceapi.DeviceTaintEffectNoSchedule
		if tainted != (i == 1) {
			t.Errorf("%s: taints %+v", d.Name, d.Taints)
		}
	}
}

// A node whose hook charges another context size (--context-mib, published as the
// inventory's contextMiB) offers no share below it.
func TestDevicesFollowTheNodesContextCharge(t *testing.T) {
	inv := fixtures.NVLinkNode("n", 2, 2, "NVIDIA H100 80GB HBM3", 81559)
	inv.ContextMiB = 1024
	inv.GPUs[1].Sharing, inv.GPUs[1].MPSClients = api.SharingMPS, 8
	devs := Devices(inv)
	if min := devs[0].Capacity[CapacityMemory].RequestPolicy.ValidRange.Min.Value(); min != 1024<<20 {
		t.Errorf("memory min %d MiB, want 1024 (the node's charge)", min>>20)
	}
	if min, want := devs[1].Capacity[CapacityMemory].RequestPolicy.ValidRange.Min.Value(), api.MPSContextMiB(1024, 1)<<20; min != want {
		t.Errorf("MPS memory min %d MiB, want %d", min>>20, want>>20)
	}
}

func TestResourcesSplitsSlices(t *testing.T) {
	inv := fixtures.PCIeNode("big", 8, "A100", 40960)
	for i := range inv.GPUs {
		inv.GPUs[i].MIG = &api.MIG{}
		for k := 0; k < 9; k++ {
			inv.GPUs[i].MIG.Instances = append(inv.GPUs[i].MIG.Instances, api.MIGInstance{UUID: fixtures.UUID("mig", i*10+k), Profile: "1g.5gb", MemoryMiB: 4864})
		}
	}
	r := Resources("big", inv)
	pool, ok := r.Pools["big"]
	if !ok || len(r.Pools) != 1 {
		t.Fatalf("pools %v", r.Pools)
	}
	if len(pool.Slices) != 2 || len(pool.Slices[0].Devices) != 64 || len(pool.Slices[1].Devices) != 8 {
		t.Errorf("slices of %d devices: %d", 72, len(pool.Slices))
	}
	empty := Resources("none", &api.NodeInventory{Version: api.InventoryVersion})
	if s := empty.Pools["none"].Slices; len(s) != 1 || len(s[0].Devices) != 0 {
		t.Errorf("a node without GPUs: %+v", s)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

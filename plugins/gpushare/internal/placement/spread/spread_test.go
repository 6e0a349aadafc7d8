// SPDX-License-Identifier: Apache-2.0

package spread

import (
	"math"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// h100 is eight H100s (81559 MiB) in two NVLink islands, devices 0-3 and 4-7.
func h100() *nodemodel.Model {
	return nodemodel.Build(fixtures.NVLinkNode("h", 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB))
}

// t4 is n T4s (15360 MiB) on PCIe, without NVLink: pairs (0,1), (2,3) on one switch;
// the GPUs listed in unhealthy are unhealthy.
func t4(n int, unhealthy ...int) *nodemodel.Model {
	inv := fixtures.PCIeNode("t", n, "Tesla T4", fixtures.T4MiB)
	for _, i := range unhealthy {
		inv.GPUs[i].Healthy, inv.GPUs[i].HealthReason = false, "XID 79"
	}
	return nodemodel.Build(inv)
}

var weights = placement.Weights{Memory: 1, Cores: 1, Policy: 1, Topology: 2, Island: 1, MaxTenants: 10}

// usage is a node's usage with the devices of at set, the others free.
func usage(n int, at map[int]placement.Usage) []placement.Usage {
	u := make([]placement.Usage, n)
	for i, x := range at {
		u[i] = x
	}
	return u
}

// info is the placement request of one container placed by Spread.
func info(c api.ContainerRequest, topology api.Topology) *placement.PodInfo {
	if topology == "" {
		topology = api.TopologyPreferred
	}
	return &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{c}}, Order: []int{0}, Topology: topology, Device: Placer{}}
}

// The device score is the device's weighted room after placing the container:
// 1 − (memory·w_mem + cores·w_cores)/(w_mem + w_cores). NVLink islands do not enter it.
func TestDeviceScore(t *testing.T) {
	c := api.ContainerRequest{GPUs: 1, MemoryMiB: 1536, Cores: 20} // 10% of a T4
	used := usage(4, map[int]placement.Usage{1: {MemMiB: 7680, Cores: 30, Tenants: 1}})
	tests := []struct {
		name string
		m    *nodemodel.Model
		used []placement.Usage
		i    int
		w    placement.Weights
		want float64
	}{
		{"empty GPU", t4(4), used, 0, weights, 0.85},                                        // 1 − (0.1 + 0.2)/2
		{"used GPU", t4(4), used, 1, weights, 0.45},                                         // 1 − (0.6 + 0.5)/2
		{"memory alone", t4(4), used, 1, placement.Weights{Memory: 1, MaxTenants: 10}, 0.4}, // 1 − 0.6
		{"cores weighed three times", t4(4), used, 1, placement.Weights{Memory: 1, Cores: 3, MaxTenants: 10}, 0.475},
		{"empty GPU in a whole island", h100(), usage(8, nil), 2, weights, 1 - (1536.0/81559+0.2)/2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (Placer{}).DeviceScore(tt.m, tt.used, &c, tt.i, &tt.w); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("score %.6f, want %.6f", got, tt.want)
			}
		})
	}
}

// A one-GPU container goes to the emptiest GPU that fits it (memory and cores by their
// weights), the first of equals, whatever its NVLink island; an unhealthy or full GPU
// is never chosen, however empty.
func TestPickDevice(t *testing.T) {
	c := api.ContainerRequest{GPUs: 1, MemoryMiB: 8192, Cores: 10}
	tests := []struct {
		name string
		m    *nodemodel.Model
		used []placement.Usage
		w    placement.Weights
		want int // -1: no GPU fits
	}{
		{"all free: the first", t4(4), usage(4, nil), weights, 0},
		{"the emptiest", t4(4), usage(4, map[int]placement.Usage{0: {MemMiB: 4000, Cores: 20, Tenants: 1}, 1: {MemMiB: 2000, Cores: 10, Tenants: 1},
			2: {MemMiB: 1000, Cores: 50, Tenants: 1}, 3: {MemMiB: 3000, Cores: 30, Tenants: 1}}), weights, 1},
		{"equally empty: the first", t4(4), usage(4, map[int]placement.Usage{0: {MemMiB: 4000, Cores: 20, Tenants: 1}, 2: {MemMiB: 4000, Cores: 20, Tenants: 1}}), weights, 1},
		// Device 2 after the pod: memory (6144+8192)/15360 = 0.933, cores 0.1: room
		// 0.483; device 3: memory 0.533, cores 0.8: room 0.333. By memory alone 0.067
		// and 0.467.
		{"cores count as much as memory", t4(4), usage(4, map[int]placement.Usage{0: {MemMiB: 15000, Tenants: 1}, 1: {MemMiB: 15000, Tenants: 1},
			2: {MemMiB: 6144, Tenants: 1}, 3: {Cores: 70, Tenants: 1}}), weights, 2},
		{"memory alone", t4(4), usage(4, map[int]placement.Usage{0: {MemMiB: 15000, Tenants: 1}, 1: {MemMiB: 15000, Tenants: 1},
			2: {MemMiB: 6144, Tenants: 1}, 3: {Cores: 70, Tenants: 1}}), placement.Weights{Memory: 1, MaxTenants: 10}, 3},
		{"the emptiest is unhealthy: the next", t4(4, 0), usage(4, map[int]placement.Usage{1: {MemMiB: 1000, Tenants: 1}, 2: {MemMiB: 2000, Tenants: 1},
			3: {MemMiB: 3000, Tenants: 1}}), weights, 1},
		{"the emptiest by memory has its cores reserved: the next", t4(4), usage(4, map[int]placement.Usage{0: {Cores: 95, Tenants: 1},
			1: {MemMiB: 2000, Tenants: 1}, 2: {MemMiB: 3000, Tenants: 1}, 3: {MemMiB: 4000, Tenants: 1}}), placement.Weights{Memory: 1, MaxTenants: 10}, 1},
		{"the emptiest is at the tenant limit: the next", t4(2), usage(2, map[int]placement.Usage{0: {MemMiB: 100, Tenants: 10}, 1: {MemMiB: 2000, Tenants: 1}}), weights, 1},
		{"islands do not matter: the first empty GPU, in a broken island", h100(), usage(8, map[int]placement.Usage{0: {MemMiB: 1000, Cores: 10, Tenants: 1}}), weights, 1},
		{"nothing fits", t4(2), usage(2, map[int]placement.Usage{0: {MemMiB: 10000, Tenants: 1}, 1: {MemMiB: 8000, Tenants: 1}}), weights, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, fail := placement.Allocate(tt.m, tt.used, info(c, ""), &tt.w)
			if tt.want < 0 {
				if fail == nil {
					t.Fatalf("placed on %v, want no fit", a.Placements[0].Devices)
				}
				return
			}
			if fail != nil {
				t.Fatalf("refused: %s", fail.Status().Message())
			}
			if got := a.Placements[0].Devices; len(got) != 1 || got[0] != tt.want {
				t.Errorf("placed on %v, want [%d]", got, tt.want)
			}
		})
	}
}

// A multi-GPU container gets the set with the best links, and among sets as well
// linked the emptiest GPUs (Binpack would take the fullest); a required locality
// takes only sets that meet it.
func TestPickSet(t *testing.T) {
	two := api.ContainerRequest{GPUs: 2, MemoryMiB: 8192, Cores: 10}
	full := placement.Usage{MemMiB: fixtures.H100MiB, Cores: 100, Tenants: 1}
	tests := []struct {
		name     string
		m        *nodemodel.Model
		used     []placement.Usage
		topology api.Topology
		want     []int // nil: no set
	}{
		{"empty: the first island's first pair", h100(), usage(8, nil), "", []int{0, 1}},
		{"the emptiest pair of an island", h100(), usage(8, map[int]placement.Usage{0: {MemMiB: 8192, Cores: 10, Tenants: 1},
			4: {MemMiB: 60000, Cores: 50, Tenants: 1}}), "", []int{1, 2}},
		{"NVLink over emptier GPUs across sockets", h100(), usage(8, map[int]placement.Usage{
			0: {MemMiB: 40000, Cores: 40, Tenants: 1}, 1: {MemMiB: 40000, Cores: 40, Tenants: 1}, 2: full, 3: full, 4: full, 5: full, 6: full}), "", []int{0, 1}},
		{"one PCIe switch over emptier GPUs on another", t4(4), usage(4, map[int]placement.Usage{0: {MemMiB: 4000, Cores: 20, Tenants: 1},
			3: {MemMiB: 2000, Cores: 10, Tenants: 1}}), "", []int{2, 3}},
		{"nvlink-required, one free GPU per island: none", h100(), usage(8, map[int]placement.Usage{0: full, 1: full, 2: full, 4: full, 5: full, 6: full}),
			api.TopologyNVLinkRequired, nil},
		{"numa-required: the NUMA node with room", h100(), usage(8, map[int]placement.Usage{0: full, 1: full, 2: full}), api.TopologyNUMARequired, []int{4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, fail := placement.Allocate(tt.m, tt.used, info(two, tt.topology), &weights)
			if tt.want == nil {
				if fail == nil {
					t.Fatalf("placed on %v, want no set", a.Placements[0].Devices)
				}
				return
			}
			if fail != nil {
				t.Fatalf("refused: %s", fail.Status().Message())
			}
			got := a.Placements[0].Devices
			if len(got) != len(tt.want) || got[0] != tt.want[0] || got[1] != tt.want[1] {
				t.Errorf("placed on %v, want %v", got, tt.want)
			}
		})
	}
}

// nodeUtilisation is the weighted share of the healthy GPUs' memory and cores
// granted, and the share of them with a tenant; unhealthy GPUs count in neither.
func TestNodeUtilisation(t *testing.T) {
	tests := []struct {
		name           string
		m              *nodemodel.Model
		used           []placement.Usage
		w              placement.Weights
		util, occupied float64
	}{
		{"empty", t4(4), usage(4, nil), weights, 0, 0},
		// memory 7680/61440 = 0.125, cores 100/400 = 0.25
		{"one GPU: half its memory, all its cores", t4(4), usage(4, map[int]placement.Usage{0: {MemMiB: 7680, Cores: 100, Tenants: 2}}), weights, 0.1875, 0.25},
		{"memory alone", t4(4), usage(4, map[int]placement.Usage{0: {MemMiB: 7680, Cores: 100, Tenants: 2}}), placement.Weights{Memory: 1, MaxTenants: 10}, 0.125, 0.25},
		// A tenant without memory or cores still occupies its GPU.
		{"a tenant that asks nothing", t4(4), usage(4, map[int]placement.Usage{3: {Tenants: 1}}), weights, 0, 0.25},
		// Of the three healthy GPUs: memory 15360/46080, cores 100/300.
		{"an unhealthy GPU counts in neither", t4(4, 0), usage(4, map[int]placement.Usage{0: {MemMiB: 15360, Cores: 100, Tenants: 1},
			1: {MemMiB: 15360, Cores: 100, Tenants: 1}}), weights, 1.0 / 3, 1.0 / 3},
		{"no healthy GPU", t4(2, 0, 1), usage(2, nil), weights, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			util, occupied := nodeUtilisation(tt.m, tt.used, &tt.w)
			if math.Abs(util-tt.util) > 1e-12 || math.Abs(occupied-tt.occupied) > 1e-12 {
				t.Errorf("util %.6f, occupied %.6f; want %.6f, %.6f", util, occupied, tt.util, tt.occupied)
			}
		})
	}
}

// The node score is 100 × (1 − (util + occupied)/2) after placement, so the emptiest
// node wins, and a node whose GPUs are occupied loses to one with the same use on
// fewer GPUs; a multi-GPU pod's score weighs in its GPUs' locality.
func TestScoreNode(t *testing.T) {
	half := api.ContainerRequest{GPUs: 1, MemoryMiB: 7680, Cores: 50} // half a T4
	tests := []struct {
		name string
		m    *nodemodel.Model
		used []placement.Usage
		c    api.ContainerRequest
		w    placement.Weights
		want int64
	}{
		// util (7680/61440 + 50/400)/2 = 0.125, occupied 1/4: 100·(1 − 0.1875) = 81.25.
		{"empty node", t4(4), usage(4, nil), half, weights, 81},
		// The pod takes GPU 1: util 0.25, occupied 2/4: 62.5, rounded 63.
		{"one GPU half used", t4(4), usage(4, map[int]placement.Usage{0: {MemMiB: 7680, Cores: 50, Tenants: 1}}), half, weights, 63},
		// Three GPUs hold a tenant that asks nothing: the same use as the empty node
		// after the pod, but every GPU occupied: 100·(1 − (0.125 + 1)/2) = 43.75.
		{"GPUs occupied by tenants that ask nothing", t4(4), usage(4, map[int]placement.Usage{1: {Tenants: 1}, 2: {Tenants: 1}, 3: {Tenants: 1}}),
			half, weights, 44},
		// Two whole T4s on one PCIe switch (0.8): util (2/4 + 200/400)/2 = 0.5,
		// occupied 2/4: term 0.5; (0.5 + 2·0.8)/3 = 0.7: 70.
		{"two GPUs on one PCIe switch", t4(4), usage(4, nil), api.ContainerRequest{GPUs: 2, Cores: 100}, weights, 70},
		// Two H100s joined by NVLink: util (2·8192/(8·81559) + 20/800)/2 = 0.0250566,
		// occupied 2/8: term 0.8624717; (0.8624717 + 2)/3 = 0.9541572: 95.
		{"two GPUs on NVLink", h100(), usage(8, nil), api.ContainerRequest{GPUs: 2, MemoryMiB: 8192, Cores: 10}, weights, 95},
		{"every weight that applies 0", t4(4), usage(4, nil), half, placement.Weights{Memory: 1, Cores: 1, Topology: 2, MaxTenants: 10}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := info(tt.c, "")
			a, fail := placement.Allocate(tt.m, tt.used, p, &tt.w)
			if fail != nil {
				t.Fatalf("refused: %s", fail.Status().Message())
			}
			if got := (Placer{}).ScoreNode(p, a, framework.NewNodeInfo(), nil, &tt.w); got != tt.want {
				t.Errorf("score %d, want %d", got, tt.want)
			}
		})
	}
}

// Spread leaves pods without GPUs alone: PreScore skips them, and it needs no
// cycle-wide scale.
func TestHostOnly(t *testing.T) {
	pl := Placer{}
	if pl.HostOnlyPod(&v1.Pod{}) != nil || pl.NeedsFit() || pl.ScoreExtensions() != nil || pl.Policy() != "Spread" {
		t.Fatal("Spread scores no pod without GPUs and needs no fit scale")
	}
}

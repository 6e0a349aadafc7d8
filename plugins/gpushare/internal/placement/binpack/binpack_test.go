// SPDX-License-Identifier: Apache-2.0

package binpack

import (
	"math"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
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

// t4 is n T4s (15360 MiB) on PCIe, without NVLink: pairs (0,1), (2,3) on one switch.
func t4(n int) *nodemodel.Model {
	return nodemodel.Build(fixtures.PCIeNode("t", n, "Tesla T4", fixtures.T4MiB))
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

// info is the placement request of one container placed by Binpack.
func info(c api.ContainerRequest, topology api.Topology) *placement.PodInfo {
	if topology == "" {
		topology = api.TopologyPreferred
	}
	return &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{c}}, Order: []int{0}, Topology: topology, Device: Placer{}}
}

// The device score is the device's weighted use after placing the container,
// (memory·w_mem + cores·w_cores)/(w_mem + w_cores), less 1e-3 for an unused GPU in an
// NVLink island nobody uses yet.
func TestDeviceScore(t *testing.T) {
	c := api.ContainerRequest{GPUs: 1, MemoryMiB: 1536, Cores: 20} // 10% of a T4
	tests := []struct {
		name string
		m    *nodemodel.Model
		used []placement.Usage
		i    int
		w    placement.Weights
		want float64
	}{
		// (0.1 + 0.2)/2
		{"empty GPU without NVLink", t4(4), usage(4, nil), 0, weights, 0.15},
		// ((7680+1536)/15360 + (30+20)/100)/2 = (0.6 + 0.5)/2
		{"used GPU", t4(4), usage(4, map[int]placement.Usage{1: {MemMiB: 7680, Cores: 30, Tenants: 1}}), 1, weights, 0.55},
		// memory alone: 0.6
		{"memory weight only", t4(4), usage(4, map[int]placement.Usage{1: {MemMiB: 7680, Cores: 30, Tenants: 1}}), 1,
			placement.Weights{Memory: 1, MaxTenants: 10}, 0.6},
		// (1·0.6 + 3·0.5)/4
		{"cores weighed three times", t4(4), usage(4, map[int]placement.Usage{1: {MemMiB: 7680, Cores: 30, Tenants: 1}}), 1,
			placement.Weights{Memory: 1, Cores: 3, MaxTenants: 10}, 0.525},
		// (1536/81559 + 0.2)/2 - 1e-3: island 0 is whole
		{"empty GPU in a free island", h100(), usage(8, nil), 2, weights, (1536.0/81559+0.2)/2 - 1e-3},
		// island 1 is broken by device 4
		{"empty GPU in a broken island", h100(), usage(8, map[int]placement.Usage{4: {MemMiB: 1, Tenants: 1}}), 5, weights, (1536.0/81559 + 0.2) / 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (Placer{}).DeviceScore(tt.m, tt.used, &c, tt.i, &tt.w); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("score %.6f, want %.6f", got, tt.want)
			}
		})
	}
}

// A one-GPU container goes to the fullest GPU that fits it (best fit); among equally
// full ones, to a GPU in an NVLink island already broken rather than break a whole
// one; then to the first. A GPU without room is never chosen.
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
		{"the fullest", t4(4), usage(4, map[int]placement.Usage{1: {MemMiB: 2000, Cores: 10, Tenants: 1}, 2: {MemMiB: 4000, Cores: 20, Tenants: 1}}), weights, 2},
		{"equally full: the first", t4(4), usage(4, map[int]placement.Usage{1: {MemMiB: 4000, Cores: 20, Tenants: 1}, 3: {MemMiB: 4000, Cores: 20, Tenants: 1}}), weights, 1},
		{"the fullest has no room left: the next", t4(4), usage(4, map[int]placement.Usage{1: {MemMiB: 2000, Tenants: 1}, 2: {MemMiB: 8000, Tenants: 1}}), weights, 1},
		{"the fullest has no cores left: the next", t4(4), usage(4, map[int]placement.Usage{1: {MemMiB: 2000, Tenants: 1}, 2: {MemMiB: 4000, Cores: 95, Tenants: 1}}), weights, 1},
		{"the fullest is at the tenant limit: the next", t4(4), usage(4, map[int]placement.Usage{1: {MemMiB: 2000, Tenants: 1}, 2: {MemMiB: 4000, Tenants: 10}}), weights, 1},
		// Device 2 after the pod: memory (6144+8192)/15360 = 0.933, cores 0.1: 0.517;
		// device 3: memory 0.533, cores 0.8: 0.667. By memory alone 0.933 and 0.533.
		{"cores count as much as memory", t4(4), usage(4, map[int]placement.Usage{2: {MemMiB: 6144, Tenants: 1}, 3: {Cores: 70, Tenants: 1}}), weights, 3},
		{"memory alone", t4(4), usage(4, map[int]placement.Usage{2: {MemMiB: 6144, Tenants: 1}, 3: {Cores: 70, Tenants: 1}}),
			placement.Weights{Memory: 1, MaxTenants: 10}, 2},
		{"an empty GPU in a broken island before one in a whole island", h100(), usage(8, map[int]placement.Usage{4: {MemMiB: 80000, Cores: 100, Tenants: 1}}), weights, 5},
		{"all islands whole: the first", h100(), usage(8, nil), weights, 0},
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

// A multi-GPU container gets the set with the best links (NVLink over PCIe, one PCIe
// switch over the NUMA node), and among sets as well linked the fullest GPUs; a
// required locality takes only sets that meet it.
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
		{"the island a used GPU broke, with it", h100(), usage(8, map[int]placement.Usage{6: {MemMiB: 20000, Cores: 20, Tenants: 1}}), "", []int{4, 6}},
		{"NVLink over a fuller GPU across sockets", h100(), usage(8, map[int]placement.Usage{
			0: {MemMiB: 40000, Cores: 40, Tenants: 1}, 1: full, 2: full, 3: full}), "", []int{4, 5}},
		{"one PCIe switch, with the used GPU", t4(4), usage(4, map[int]placement.Usage{3: {MemMiB: 4000, Cores: 20, Tenants: 1}}), "", []int{2, 3}},
		{"nvlink-required: the island with room", h100(), usage(8, map[int]placement.Usage{0: full, 1: full, 2: full, 4: {MemMiB: 1000, Tenants: 1}}), api.TopologyNVLinkRequired, []int{4, 5}},
		{"nvlink-required, one free GPU per island: none", h100(), usage(8, map[int]placement.Usage{0: full, 1: full, 2: full, 4: full, 5: full, 6: full}),
			api.TopologyNVLinkRequired, nil},
		{"preferred, one free GPU per island: across sockets", h100(), usage(8, map[int]placement.Usage{0: full, 1: full, 2: full, 4: full, 5: full, 6: full}),
			"", []int{3, 7}},
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

// nodeInfo is a node of cpu millicores allocatable, with requested millicores
// requested by the pods already there, publishing inv (none when nil).
func nodeInfo(t *testing.T, name string, cpu, requested int64, inv *api.NodeInventory) fwk.NodeInfo {
	t.Helper()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{v1.ResourceCPU: *resource.NewMilliQuantity(cpu, resource.DecimalSI)}}}
	if inv != nil {
		raw, err := api.EncodeInventory(inv)
		if err != nil {
			t.Fatal(err)
		}
		node.Annotations[api.AnnotationInventory] = raw
	}
	var pods []fwk.PodInfo
	if requested > 0 {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "there", UID: types.UID(name + "-there")}, Spec: v1.PodSpec{NodeName: name,
			Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
				v1.ResourceCPU: *resource.NewMilliQuantity(requested, resource.DecimalSI)}}}}}}
		pi, err := framework.NewPodInfo(p)
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pi)
	}
	ni := framework.NewNodeInfo()
	for _, p := range pods {
		ni.AddPodInfo(p)
	}
	ni.SetNode(node)
	return ni
}

// The node score is best fit: 100 × (1 − leftover), the leftover being ½ the free CPU
// after the pod against the cycle's largest node plus ½ the free GPU capacity against
// its GPU count, so the node left with the least scores highest; a one-GPU pod loses
// islandWeight points per whole NVLink island it breaks; a multi-GPU pod's score
// weighs in the locality of its GPUs (weight topologyWeight) instead.
func TestScoreNode(t *testing.T) {
	half := api.ContainerRequest{GPUs: 1, MemoryMiB: 7680, Cores: 50} // half a T4
	h := api.ContainerRequest{GPUs: 1, MemoryMiB: 8192, Cores: 10}
	fullT4 := placement.Usage{MemMiB: fixtures.T4MiB, Cores: 100, Tenants: 1}
	tests := []struct {
		name           string
		m              *nodemodel.Model
		used           []placement.Usage
		c              api.ContainerRequest
		cpu, requested int64
		fit            placement.FitScale
		w              placement.Weights
		want           int64
	}{
		// Leftover ½·28000/32000 + ½·3.5/4 = 0.875: 12.5, rounded 13.
		{"empty node", t4(4), usage(4, nil), half, 32000, 0, placement.FitScale{CPUMilli: 32000, GPUs: 4, PodCPUMilli: 4000}, weights, 13},
		// Leftover ½·12000/32000 + ½·0.5/4 = 0.25: 75.
		{"fuller node", t4(4), usage(4, map[int]placement.Usage{0: fullT4, 1: fullT4, 2: fullT4}), half, 32000, 16000,
			placement.FitScale{CPUMilli: 32000, GPUs: 4, PodCPUMilli: 4000}, weights, 75},
		// The same empty node against a cycle whose largest node has twice its GPUs
		// and CPU: ½·28000/64000 + ½·3.5/8 = 0.4375: 56.25, rounded 56. Small nodes fill first.
		{"small node against a large one", t4(4), usage(4, nil), half, 32000, 0, placement.FitScale{CPUMilli: 64000, GPUs: 8, PodCPUMilli: 4000}, weights, 56},
		// GPU use after the pod u = (8192/81559 + 0.1)/2 = 0.1002216; leftover
		// ½·16000/64000 + ½·(8 − u)/8 = 0.6187361: 38.126 less 1 island: 37.
		{"breaks a whole island", h100(), usage(8, nil), h, 64000, 48000, placement.FitScale{CPUMilli: 64000, GPUs: 8}, weights, 37},
		{"breaks a whole island, weight 5", h100(), usage(8, nil), h, 64000, 48000, placement.FitScale{CPUMilli: 64000, GPUs: 8},
			placement.Weights{Memory: 1, Cores: 1, Policy: 1, Topology: 2, Island: 5, MaxTenants: 10}, 33},
		{"breaks a whole island, weight 0", h100(), usage(8, nil), h, 64000, 48000, placement.FitScale{CPUMilli: 64000, GPUs: 8},
			placement.Weights{Memory: 1, Cores: 1, Policy: 1, Topology: 2, MaxTenants: 10}, 38},
		// Onto device 0, which holds the same already: its use 0.2004432, leftover
		// 0.125 + ½·7.7995568/8 = 0.6124723: 38.75, rounded 39; no island broken.
		{"joins a used GPU", h100(), usage(8, map[int]placement.Usage{0: {MemMiB: 8192, Cores: 10, Tenants: 1}}), h, 64000, 48000,
			placement.FitScale{CPUMilli: 64000, GPUs: 8}, weights, 39},
		// Two GPUs joined by NVLink (locality 1): GPU use 2·u, leftover 0.125 +
		// ½·(8 − 0.2004432)/8 = 0.6122473; (1·0.3877527 + 2·1)/3 = 0.7959176: 80, no island penalty.
		{"two GPUs on NVLink", h100(), usage(8, nil), api.ContainerRequest{GPUs: 2, MemoryMiB: 8192, Cores: 10}, 64000, 48000,
			placement.FitScale{CPUMilli: 64000, GPUs: 8}, weights, 80},
		// Two whole T4s on one PCIe switch (0.8), no CPU asked: leftover ½·1 + ½·2/4
		// = 0.75; (0.25 + 2·0.8)/3 = 0.6166667: 61.67, rounded 62.
		{"two GPUs on one PCIe switch", t4(4), usage(4, nil), api.ContainerRequest{GPUs: 2, Cores: 100}, 32000, 0,
			placement.FitScale{CPUMilli: 32000, GPUs: 4}, weights, 62},
		{"every weight that applies 0", t4(4), usage(4, nil), half, 32000, 0, placement.FitScale{CPUMilli: 32000, GPUs: 4},
			placement.Weights{Memory: 1, Cores: 1, Topology: 2, MaxTenants: 10}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := info(tt.c, "")
			a, fail := placement.Allocate(tt.m, tt.used, p, &tt.w)
			if fail != nil {
				t.Fatalf("refused: %s", fail.Status().Message())
			}
			ni := nodeInfo(t, "n", tt.cpu, tt.requested, nil)
			if got := (Placer{}).ScoreNode(p, a, ni, &tt.fit, &tt.w); got != tt.want {
				t.Errorf("score %d, want %d", got, tt.want)
			}
		})
	}
}

// Pods without GPUs are scored by best fit too: a CPU pod belongs on a node whose
// GPUs are taken, not on one whose free GPUs its CPU would strand; a node without
// GPUs (or without an inventory) has none to strand.
func TestScoreHostOnly(t *testing.T) {
	pl := Placer{}
	if pl.HostOnlyPod(&v1.Pod{}) == nil || !pl.NeedsFit() || pl.ScoreExtensions() != nil || pl.Policy() != "Binpack" {
		t.Fatal("Binpack scores pods without GPUs by best fit, over the cycle's largest node, in the framework's range")
	}
	c := placement.NewCache()
	free := fixtures.PCIeNode("free", 4, "Tesla T4", fixtures.T4MiB)
	taken := fixtures.PCIeNode("taken", 4, "Tesla T4", fixtures.T4MiB)
	nodes := map[string]fwk.NodeInfo{
		"free":  nodeInfo(t, "free", 32000, 0, free),
		"taken": nodeInfo(t, "taken", 32000, 0, taken),
		"cpu":   nodeInfo(t, "cpu", 32000, 0, nil),
	}
	for _, ni := range nodes {
		c.View(ni.Node(), nil) // the cache reads the node's inventory
	}
	var grants []placement.Grant
	for _, g := range taken.GPUs {
		grants = append(grants, placement.Grant{UUID: g.UUID, MemMiB: g.MemoryMiB, Cores: 100})
	}
	if err := c.Assume(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpu", UID: "gpu"}}, "taken", grants, 10); err != nil {
		t.Fatal(err)
	}
	f := &placement.FitScale{CPUMilli: 32000, GPUs: 4, PodCPUMilli: 4000}
	h := pl.HostOnlyPod(&v1.Pod{})
	for name, want := range map[string]int64{
		"free":  6,  // leftover ½·28000/32000 + ½·4/4 = 0.9375: 6.25
		"taken": 56, // ½·28000/32000 + 0 = 0.4375: 56.25
		"cpu":   56, // no GPUs to strand
	} {
		e, v, used := c.EntryView(nodes[name].Node(), nil)
		if got := pl.ScoreHostOnly(e, v, used, h, nodes[name], f, &weights); got != want {
			t.Errorf("node %s: score %d, want %d", name, got, want)
		}
	}
}

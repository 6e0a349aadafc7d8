// SPDX-License-Identifier: Apache-2.0

package nodemodel

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/test/fixtures"
)

const (
	h100 = "NVIDIA H100 80GB HBM3"
	t4   = "Tesla T4"
)

// gpu is a healthy time-sliced GPU of index i without links.
func gpu(i int, model string, mem int64, numa int) api.GPU {
	return api.GPU{Index: i, UUID: fixtures.UUID("n", i), Model: model, MemoryMiB: mem, NUMANode: numa, Healthy: true}
}

// inventory is a validated inventory of gpus: Build takes only those.
func inventory(t *testing.T, gpus ...api.GPU) *api.NodeInventory {
	t.Helper()
	inv := &api.NodeInventory{Version: api.InventoryVersion, GPUs: gpus}
	if err := inv.Validate(); err != nil {
		t.Fatalf("test inventory: %v", err)
	}
	return inv
}

// uuids lists the models' device UUIDs in order.
func uuids(m *Model) []string {
	var out []string
	for _, d := range m.Devices {
		out = append(out, d.UUID)
	}
	return out
}

// checkConsistent checks what every model holds whatever its inventory: Hot mirrors
// Devices, ByUUID finds every device, Healthy counts the healthy ones, Islands lists
// each device of an island once, and the pair tables are square and symmetric.
func checkConsistent(t *testing.T, m *Model) {
	t.Helper()
	n := len(m.Devices)
	if len(m.Hot) != n || len(m.Affinity) != n || len(m.NVLinked) != n || len(m.ByUUID) != n {
		t.Fatalf("%d devices, %d hot, %d affinity rows, %d nvlinked rows, %d UUIDs", n, len(m.Hot), len(m.Affinity), len(m.NVLinked), len(m.ByUUID))
	}
	healthy, mps := 0, false
	inIsland := map[int]int{}
	for k, isl := range m.Islands {
		for _, i := range isl {
			if _, dup := inIsland[i]; dup {
				t.Errorf("device %d in two islands", i)
			}
			inIsland[i] = k
		}
	}
	for i := range m.Devices {
		d, h := &m.Devices[i], &m.Hot[i]
		if h.MemoryMiB != d.MemoryMiB || int(h.Island) != d.Island || h.Healthy != d.Healthy || h.MIG != d.MIG {
			t.Errorf("device %d: hot %+v does not mirror %+v", i, *h, *d)
		}
		if int(h.Kind) > i {
			t.Errorf("device %d: kind %d is a later device", i, h.Kind)
		}
		if k, ok := inIsland[i]; d.Island != k && (ok || d.Island != -1) {
			t.Errorf("device %d: island %d, listed in island %d (%v)", i, d.Island, k, ok)
		}
		if m.ByUUID[d.UUID] != i {
			t.Errorf("ByUUID[%s] = %d, want %d", d.UUID, m.ByUUID[d.UUID], i)
		}
		if d.Healthy {
			healthy++
		}
		mps = mps || d.MPS
		if len(m.Affinity[i]) != n || len(m.NVLinked[i]) != n {
			t.Fatalf("row %d: %d affinities, %d nvlinked", i, len(m.Affinity[i]), len(m.NVLinked[i]))
		}
		for j := range m.Devices {
			if m.Affinity[i][j] != m.Affinity[j][i] || m.NVLinked[i][j] != m.NVLinked[j][i] {
				t.Errorf("devices %d, %d: affinity %v/%v, nvlinked %v/%v", i, j, m.Affinity[i][j], m.Affinity[j][i], m.NVLinked[i][j], m.NVLinked[j][i])
			}
		}
	}
	if m.Healthy != healthy || m.HasMPS != mps {
		t.Errorf("Healthy %d, HasMPS %v; the devices say %d, %v", m.Healthy, m.HasMPS, healthy, mps)
	}
}

func TestBuildNVLinkIslands(t *testing.T) {
	// Two islands of four, cross-socket between them (fixtures.NVLinkNode).
	m := Build(fixtures.NVLinkNode("n", 8, 4, h100, fixtures.H100MiB))
	checkConsistent(t, m)
	if want := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}; !reflect.DeepEqual(m.Islands, want) {
		t.Fatalf("islands %v, want %v", m.Islands, want)
	}
	for i := range m.Devices {
		d := &m.Devices[i]
		if d.Index != i || d.UUID != fixtures.UUID("n", i) || d.Island != i/4 || d.NUMA != i/4 || d.MIG || d.MPS {
			t.Errorf("device %d: %+v", i, *d)
		}
		if m.Hot[i].Kind != 0 {
			t.Errorf("device %d: kind %d, want 0 (all alike)", i, m.Hot[i].Kind)
		}
		for j := range m.Devices {
			if j == i {
				continue // a set never holds a device twice
			}
			same := i/4 == j/4
			want := 0.2 // cross-socket
			if same {
				want = affinityNVLink
			}
			if m.Affinity[i][j] != want || m.NVLinked[i][j] != same {
				t.Errorf("devices %d, %d: affinity %v nvlinked %v, want %v %v", i, j, m.Affinity[i][j], m.NVLinked[i][j], want, same)
			}
		}
	}
	if got := m.SetAffinity([]int{0, 1, 2}); got != 1 {
		t.Errorf("SetAffinity in one island = %v, want 1", got)
	}
	// Pairs 0-1 and 0-4, 1-4: (1 + 0.2 + 0.2) / 3.
	if got, want := m.SetAffinity([]int{0, 1, 4}), (1+0.2+0.2)/3; math.Abs(got-want) > 1e-12 {
		t.Errorf("SetAffinity across islands = %v, want %v", got, want)
	}
	if got := m.SetAffinity([]int{5}); got != 1 {
		t.Errorf("SetAffinity of one device = %v, want 1", got)
	}
}

func TestBuildPCIeLevels(t *testing.T) {
	// GPU 0's links name every level; GPU 4 has no NVLink and no link published at
	// all, so the cross-socket default applies. 0-1 is published from both sides,
	// at different levels: the nearer one counts both ways.
	gs := []api.GPU{gpu(0, h100, fixtures.H100MiB, 0), gpu(1, h100, fixtures.H100MiB, 0), gpu(2, h100, fixtures.H100MiB, 0),
		gpu(3, h100, fixtures.H100MiB, 1), gpu(4, h100, fixtures.H100MiB, 1), gpu(5, h100, fixtures.H100MiB, 1)}
	gs[0].Links = []api.Link{{Peer: 1, PCIe: api.PCIeMultiple}, {Peer: 2, PCIe: api.PCIeHostBridge},
		{Peer: 3, PCIe: api.PCIeNUMA}, {Peer: 5, PCIe: api.PCIeCrossSocket}}
	gs[1].Links = []api.Link{{Peer: 0, PCIe: api.PCIeSingle}, {Peer: 2, PCIe: api.PCIeInternal}}
	gs[3].Links = []api.Link{{Peer: 5, NVLinks: 4, PCIe: api.PCIeCrossSocket}}
	m := Build(inventory(t, gs...))
	checkConsistent(t, m)
	for _, tc := range []struct {
		i, j int
		want float64
		nv   bool
	}{
		{0, 1, 0.8, false}, // single switch beats the other side's multiple
		{0, 2, 0.6, false},
		{0, 3, 0.5, false},
		{0, 4, 0.2, false}, // nothing published
		{0, 5, 0.2, false},
		{1, 2, 0.85, false},
		{3, 5, affinityNVLink, true},
		{4, 5, 0.2, false},
	} {
		if got := m.Affinity[tc.i][tc.j]; got != tc.want || m.NVLinked[tc.i][tc.j] != tc.nv {
			t.Errorf("devices %d, %d: affinity %v nvlinked %v, want %v %v", tc.i, tc.j, got, m.NVLinked[tc.i][tc.j], tc.want, tc.nv)
		}
	}
	// Only 3 and 5 have an NVLink peer: one island, the rest in none.
	if want := [][]int{{3, 5}}; !reflect.DeepEqual(m.Islands, want) {
		t.Errorf("islands %v, want %v", m.Islands, want)
	}
	for i, want := range []int{-1, -1, -1, 0, -1, 0} {
		if m.Devices[i].Island != want {
			t.Errorf("device %d: island %d, want %d", i, m.Devices[i].Island, want)
		}
	}
	for _, tc := range []struct {
		topo api.Topology
		set  []int
		i    int
		want bool
	}{
		{api.TopologyNVLinkRequired, []int{3}, 5, true},
		{api.TopologyNVLinkRequired, []int{3}, 4, false},
		{api.TopologyNVLinkRequired, []int{0}, 1, false}, // a PCIe switch is not NVLink
		{api.TopologyNUMARequired, []int{0, 1}, 2, true},
		{api.TopologyNUMARequired, []int{0}, 3, false},
		{api.TopologyPreferred, []int{0}, 4, true},
		{api.TopologyNone, []int{0}, 5, true},
	} {
		if got := m.Joinable(tc.topo, tc.set, tc.i); got != tc.want {
			t.Errorf("Joinable(%s, %v, %d) = %v, want %v", tc.topo, tc.set, tc.i, got, tc.want)
		}
	}
}

func TestBuildUnknownNUMA(t *testing.T) {
	m := Build(inventory(t, gpu(0, t4, fixtures.T4MiB, -1), gpu(1, t4, fixtures.T4MiB, -1), gpu(2, t4, fixtures.T4MiB, 0)))
	checkConsistent(t, m)
	// A device of unknown NUMA node joins no set under numa-required, nor seeds one.
	for _, tc := range []struct {
		set  []int
		i    int
		want bool
	}{{[]int{0}, 1, false}, {[]int{2}, 0, false}, {[]int{2}, 2, true}} {
		if got := m.Joinable(api.TopologyNUMARequired, tc.set, tc.i); got != tc.want {
			t.Errorf("Joinable(numa-required, %v, %d) = %v, want %v", tc.set, tc.i, got, tc.want)
		}
	}
}

func TestBuildMIG(t *testing.T) {
	// GPU 0 whole, GPU 1 in MIG mode with two instances, GPU 2 in MIG mode with none,
	// GPU 3 whole; NVLink between 0 and 1.
	gs := []api.GPU{gpu(0, h100, fixtures.H100MiB, 0), gpu(1, h100, fixtures.H100MiB, 0), gpu(2, h100, fixtures.H100MiB, 0), gpu(3, h100, fixtures.H100MiB, 1)}
	gs[0].Links = []api.Link{{Peer: 1, NVLinks: 18, PCIe: api.PCIeNUMA}}
	gs[1].MIG = &api.MIG{Instances: []api.MIGInstance{
		{UUID: "MIG-a", Profile: "3g.40gb", MemoryMiB: 40192},
		{UUID: "MIG-b", Profile: "1g.10gb", MemoryMiB: 9856},
	}}
	gs[2].MIG = &api.MIG{}
	m := Build(inventory(t, gs...))
	checkConsistent(t, m)
	if got, want := uuids(m), []string{fixtures.UUID("n", 0), "MIG-a", "MIG-b", fixtures.UUID("n", 3)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("devices %v, want %v", got, want)
	}
	for i, want := range []Device{
		{UUID: fixtures.UUID("n", 0), Index: 0, Model: h100, ModelLower: strings.ToLower(h100), MemoryMiB: fixtures.H100MiB, NUMA: 0, Healthy: true, Island: 0},
		{UUID: "MIG-a", Index: 1, Model: h100 + " MIG 3g.40gb", ModelLower: strings.ToLower(h100 + " MIG 3g.40gb"), MemoryMiB: 40192, NUMA: 0, Healthy: true, MIG: true, Island: 0},
		{UUID: "MIG-b", Index: 1, Model: h100 + " MIG 1g.10gb", ModelLower: strings.ToLower(h100 + " MIG 1g.10gb"), MemoryMiB: 9856, NUMA: 0, Healthy: true, MIG: true, Island: 0},
		{UUID: fixtures.UUID("n", 3), Index: 3, Model: h100, ModelLower: strings.ToLower(h100), MemoryMiB: fixtures.H100MiB, NUMA: 1, Healthy: true, Island: -1},
	} {
		if m.Devices[i] != want {
			t.Errorf("device %d: %+v, want %+v", i, m.Devices[i], want)
		}
	}
	// The instances of one GPU share its memory system: the internal level, and no
	// NVLink between them; each has its GPU's NVLink to GPU 0.
	if m.Affinity[1][2] != 0.85 || m.NVLinked[1][2] {
		t.Errorf("MIG-a, MIG-b: affinity %v, nvlinked %v", m.Affinity[1][2], m.NVLinked[1][2])
	}
	if m.Affinity[0][2] != affinityNVLink || !m.NVLinked[0][2] {
		t.Errorf("GPU 0, MIG-b: affinity %v, nvlinked %v", m.Affinity[0][2], m.NVLinked[0][2])
	}
	if want := [][]int{{0, 1, 2}}; !reflect.DeepEqual(m.Islands, want) {
		t.Errorf("islands %v, want %v", m.Islands, want)
	}
	// Kinds: the instances differ from the whole GPUs and from each other.
	if got, want := kinds(m), []uint16{0, 1, 2, 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("kinds %v, want %v", got, want)
	}
	if got, want := m.Summary(), "2 × "+h100+", 1 × "+h100+" MIG 3g.40gb, 1 × "+h100+" MIG 1g.10gb"; got != want {
		t.Errorf("Summary() = %q, want %q", got, want)
	}
}

func kinds(m *Model) []uint16 {
	out := make([]uint16, len(m.Hot))
	for i := range m.Hot {
		out[i] = m.Hot[i].Kind
	}
	return out
}

func TestBuildHealthSharingAndKinds(t *testing.T) {
	gs := []api.GPU{
		gpu(0, t4, fixtures.T4MiB, 0),
		gpu(1, t4, fixtures.T4MiB, 0),
		gpu(2, t4, fixtures.T4MiB, 0),   // unhealthy
		gpu(3, t4, fixtures.T4MiB, 0),   // mps, 8 clients
		gpu(4, t4, fixtures.T4MiB, 0),   // mps, 4 clients
		gpu(5, t4, fixtures.T4MiB, 0),   // mps, 8 clients
		gpu(6, t4, 16384, 0),            // more memory
		gpu(7, h100, fixtures.T4MiB, 0), // another model
		gpu(8, t4, fixtures.T4MiB, 0),   // unhealthy
	}
	gs[2].Healthy, gs[2].HealthReason = false, "XID 79"
	gs[8].Healthy, gs[8].HealthReason = false, "lost"
	gs[3].Sharing, gs[3].MPSClients = api.SharingMPS, 8
	gs[4].Sharing, gs[4].MPSClients = api.SharingMPS, 4
	gs[5].Sharing, gs[5].MPSClients = api.SharingMPS, 8
	m := Build(inventory(t, gs...))
	checkConsistent(t, m)
	if m.Healthy != 7 || !m.HasMPS {
		t.Errorf("Healthy %d, HasMPS %v; want 7, true", m.Healthy, m.HasMPS)
	}
	if d := m.Devices[2]; d.Healthy || d.HealthReason != "XID 79" || m.Hot[2].Healthy {
		t.Errorf("device 2: %+v, hot %+v", d, m.Hot[2])
	}
	if d := m.Devices[3]; !d.MPS || d.MPSClients != 8 || m.Devices[0].MPS || m.Devices[0].MPSClients != 0 {
		t.Errorf("device 3: %+v; device 0: %+v", d, m.Devices[0])
	}
	if got, want := kinds(m), []uint16{0, 0, 2, 3, 4, 3, 6, 7, 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("kinds %v, want %v", got, want)
	}
	if got, want := m.Summary(), "8 × "+t4+", 1 × "+h100; got != want {
		t.Errorf("Summary() = %q, want %q", got, want)
	}

	// Without an MPS GPU, HasMPS stays off (the hot loops then never read
	// Devices[i].MPS).
	if m := Build(inventory(t, gpu(0, t4, fixtures.T4MiB, 0))); m.HasMPS {
		t.Error("HasMPS set on a node without MPS GPUs")
	}
}

func TestBuildEmpty(t *testing.T) {
	m := Build(inventory(t))
	checkConsistent(t, m)
	if len(m.Devices) != 0 || m.Healthy != 0 || len(m.Islands) != 0 {
		t.Errorf("empty inventory: %+v", m)
	}
	if got := m.Summary(); got != "no GPUs" {
		t.Errorf("Summary() = %q", got)
	}
}

// DeviceHot is what Filter and Score read of every device: four to a 64-byte line.
func TestDeviceHotPacked(t *testing.T) {
	if s := unsafe.Sizeof(DeviceHot{}); s != 16 {
		t.Errorf("DeviceHot is %d bytes, want 16", s)
	}
}

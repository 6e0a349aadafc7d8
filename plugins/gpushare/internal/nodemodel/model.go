// SPDX-License-Identifier: Apache-2.0

package nodemodel

import (
	"fmt"
	"strings"

	"github.com/tessera-dev/tessera/api"
)

// Device is one schedulable unit of a node: a whole GPU, or a MIG instance of a GPU
// in MIG mode. Devices are immutable once a Model is built.
type Device struct {
	UUID  string
	Index int // NVML index of the physical GPU
	// Model is the GPU's product name; a MIG instance's is the GPU's followed by
	// " MIG " and the instance's profile (e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb").
	Model string
	// ModelLower is Model in lower case, which model selections are matched against
	// (Build sets it; a Device made elsewhere may leave it empty).
	ModelLower   string
	MemoryMiB    int64
	NUMA         int // NUMA node of the GPU, -1 when unknown
	Healthy      bool
	HealthReason string // why the GPU is unhealthy, as its inventory says
	MIG          bool   // a MIG instance
	// MPS is set for a GPU in mps sharing mode, whose MPS server takes MPSClients
	// containers.
	MPS        bool
	MPSClients int
	// Island is the NVLink island (connected component over NVLink) of the physical
	// GPU, or -1 when the GPU has no NVLink peer.
	Island int
}

// DeviceHot is what Filter and Score read of every device of every node they see,
// packed apart from Device's strings: a node's eight devices fill two cache lines
// here against twelve in Devices, and on a busy scheduler each line is a miss.
type DeviceHot struct {
	MemoryMiB int64
	Island    int32
	Healthy   bool
	MIG       bool
	// Kind is the position of the node's first device of the same model, memory,
	// health, MIG flag and sharing mode (capped at MaxDeviceKind): devices of one kind
	// with the same usage are interchangeable to Fragmentation, which compared the
	// model strings for it on every candidate.
	Kind uint16
}

// MaxDeviceKind caps DeviceHot.Kind: a device is compared for its kind only with the
// first MaxDeviceKind devices before it.
const MaxDeviceKind = 1<<16 - 1

// Model is a node's decoded inventory in the form Filter, Score and Reserve use.
// It is immutable once built, and shared by every reader without a lock.
type Model struct {
	Devices []Device
	// Hot[i] holds device i's memory, island, health, MIG flag and kind, as Devices[i].
	Hot    []DeviceHot
	ByUUID map[string]int // device UUID -> position in Devices
	// Affinity[i][j] in [0,1]: how well devices i and j work together (1 = NVLink).
	Affinity [][]float64
	// Islands[k] lists the devices of NVLink island k.
	Islands [][]int
	// NVLinked[i][j] reports an NVLink between the physical GPUs of i and j.
	NVLinked [][]bool
	// Healthy counts the healthy devices (PreScore reads it for every feasible node).
	Healthy int
	// HasMPS is set when a device is in mps sharing mode; the hot loops read
	// Devices[i].MPS only then.
	HasMPS bool
	// ContextMiB is what the node's CUDA hook charges against a container's memory on
	// a GPU for each plain CUDA context (api.NodeInventory.ContextCharge); 0 in
	// models made by hand charges nothing.
	ContextMiB int64
	// DRA is set for a node whose agent serves its GPUs through DRA
	// (api.NodeInventory.DRA): TesseraGPUShare places nothing there, the claim
	// placement (draplacement) uses the model.
	DRA bool
}

// Pair affinities, from the strongest connection to the weakest. NVLink beats any PCIe
// path; PCIe levels follow nvmlGpuTopologyLevel_t.
func pcieAffinity(l api.PCIeLevel) float64 {
	switch l {
	case api.PCIeInternal:
		return 0.85
	case api.PCIeSingle:
		return 0.8
	case api.PCIeMultiple:
		return 0.7
	case api.PCIeHostBridge:
		return 0.6
	case api.PCIeNUMA:
		return 0.5
	default:
		return 0.2
	}
}

const affinityNVLink = 1.0

// Build turns a validated inventory (api.NodeInventory.Validate) into devices, pair
// affinities and NVLink islands. A GPU in MIG mode contributes its instances instead
// of itself, and nothing when it has none.
func Build(inv *api.NodeInventory) *Model {
	m := &Model{ByUUID: make(map[string]int), ContextMiB: inv.ContextCharge(), DRA: inv.DRA}
	pos := make(map[int]int, len(inv.GPUs)) // GPU index -> position in inv.GPUs
	for i := range inv.GPUs {
		pos[inv.GPUs[i].Index] = i
	}

	// NVLink islands over physical GPUs (union-find).
	parent := make([]int, len(inv.GPUs))
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(x int) int {
		for parent[x] != x {
			parent[x] = parent[parent[x]]
			x = parent[x]
		}
		return x
	}
	hasNV := make([]bool, len(inv.GPUs))
	for i := range inv.GPUs {
		for _, l := range inv.GPUs[i].Links {
			if l.NVLinks > 0 {
				j := pos[l.Peer]
				hasNV[i], hasNV[j] = true, true
				parent[find(i)] = find(j)
			}
		}
	}
	islandOf := make([]int, len(inv.GPUs))
	roots := map[int]int{}
	for i := range inv.GPUs {
		islandOf[i] = -1
		if !hasNV[i] {
			continue
		}
		r := find(i)
		id, ok := roots[r]
		if !ok {
			id = len(roots)
			roots[r] = id
		}
		islandOf[i] = id
	}

	gpuOf := []int{} // device -> position of its physical GPU
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		if g.MIG != nil && len(g.MIG.Instances) > 0 {
			for _, mi := range g.MIG.Instances {
				m.Devices = append(m.Devices, Device{
					UUID: mi.UUID, Index: g.Index, Model: g.Model + " MIG " + mi.Profile,
					ModelLower: strings.ToLower(g.Model + " MIG " + mi.Profile),
					MemoryMiB:  mi.MemoryMiB, NUMA: g.NUMANode, Healthy: g.Healthy, HealthReason: g.HealthReason,
					MIG: true, Island: islandOf[i],
				})
				gpuOf = append(gpuOf, i)
			}
			continue
		}
		if g.MIG != nil {
			// MIG mode with no instances: nothing on this GPU can be scheduled.
			continue
		}
		m.Devices = append(m.Devices, Device{
			UUID: g.UUID, Index: g.Index, Model: g.Model, ModelLower: strings.ToLower(g.Model), MemoryMiB: g.MemoryMiB,
			NUMA: g.NUMANode, Healthy: g.Healthy, HealthReason: g.HealthReason, Island: islandOf[i],
			MPS: g.Mode() == api.SharingMPS, MPSClients: g.MPSClients,
		})
		m.HasMPS = m.HasMPS || g.Mode() == api.SharingMPS
		gpuOf = append(gpuOf, i)
	}
	m.Hot = make([]DeviceHot, len(m.Devices))
	for i := range m.Devices {
		d := &m.Devices[i]
		m.ByUUID[d.UUID] = i
		if d.Healthy {
			m.Healthy++
		}
		m.Hot[i] = DeviceHot{MemoryMiB: d.MemoryMiB, Island: int32(d.Island), Healthy: d.Healthy, MIG: d.MIG, Kind: uint16(min(i, MaxDeviceKind))}
		for j := 0; j < min(i, MaxDeviceKind); j++ {
			if o := &m.Devices[j]; o.Model == d.Model && o.MemoryMiB == d.MemoryMiB && o.Healthy == d.Healthy && o.MIG == d.MIG && o.MPS == d.MPS && o.MPSClients == d.MPSClients {
				m.Hot[i].Kind = uint16(j)
				break
			}
		}
	}

	// Link table between physical GPUs.
	n := len(inv.GPUs)
	linkAff := make([][]float64, n)
	nv := make([][]bool, n)
	for i := range linkAff {
		linkAff[i] = make([]float64, n)
		nv[i] = make([]bool, n)
		for j := range linkAff[i] {
			linkAff[i][j] = pcieAffinity(api.PCIeCrossSocket)
			if i == j {
				linkAff[i][j] = 1
			}
		}
	}
	for i := range inv.GPUs {
		for _, l := range inv.GPUs[i].Links {
			j := pos[l.Peer]
			a := pcieAffinity(l.PCIe)
			if l.NVLinks > 0 {
				a = affinityNVLink
				nv[i][j], nv[j][i] = true, true
			}
			// Links may be published from one side or both; keep the best seen.
			if a > linkAff[i][j] {
				linkAff[i][j], linkAff[j][i] = a, a
			}
		}
	}

	d := len(m.Devices)
	m.Affinity = make([][]float64, d)
	m.NVLinked = make([][]bool, d)
	for i := 0; i < d; i++ {
		m.Affinity[i] = make([]float64, d)
		m.NVLinked[i] = make([]bool, d)
		for j := 0; j < d; j++ {
			gi, gj := gpuOf[i], gpuOf[j]
			if gi == gj {
				// MIG instances of one GPU share its memory system.
				m.Affinity[i][j] = pcieAffinity(api.PCIeInternal)
				m.NVLinked[i][j] = i == j
				continue
			}
			m.Affinity[i][j] = linkAff[gi][gj]
			m.NVLinked[i][j] = nv[gi][gj]
		}
	}
	m.Islands = make([][]int, len(roots))
	for i := range m.Devices {
		if k := m.Devices[i].Island; k >= 0 {
			m.Islands[k] = append(m.Islands[k], i)
		}
	}
	return m
}

// ContextCharge is what the node's CUDA hook charges, on device i, for each CUDA
// context of a container reserving cores percent of compute: the plain charge, or on
// a GPU in mps mode (whose tenants are all MPS clients) an MPS client's at its share
// (api.ContextCharge). A container whose memory on the device is below it could not
// create a context there.
func (m *Model) ContextCharge(i, cores int) int64 {
	if m.HasMPS && m.Devices[i].MPS {
		return api.ContextCharge(m.ContextMiB, api.SharingMPS, cores)
	}
	return m.ContextMiB
}

// SetAffinity is the mean pair affinity of a device set (1 for fewer than two).
func (m *Model) SetAffinity(devs []int) float64 {
	if len(devs) < 2 {
		return 1
	}
	sum, n := 0.0, 0
	for x := 0; x < len(devs); x++ {
		for y := x + 1; y < len(devs); y++ {
			sum += m.Affinity[devs[x]][devs[y]]
			n++
		}
	}
	return sum / float64(n)
}

// Joinable reports whether device i may join the devices of set (not empty) under
// the locality requirement t: NVLink to every device of the set for
// nvlink-required, the set's known NUMA node for numa-required, anything otherwise.
func (m *Model) Joinable(t api.Topology, set []int, i int) bool {
	switch t {
	case api.TopologyNVLinkRequired:
		for _, j := range set {
			if !m.NVLinked[i][j] {
				return false
			}
		}
	case api.TopologyNUMARequired:
		numa := m.Devices[set[0]].NUMA
		return numa >= 0 && m.Devices[i].NUMA == numa
	}
	return true
}

// Summary names the node's devices by model in the order first seen, e.g.
// "4 × NVIDIA T4, 2 × NVIDIA A100"; "no GPUs" for none.
func (m *Model) Summary() string {
	counts := map[string]int{}
	var names []string
	for _, d := range m.Devices {
		if counts[d.Model] == 0 {
			names = append(names, d.Model)
		}
		counts[d.Model]++
	}
	if len(names) == 0 {
		return "no GPUs"
	}
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%d × %s", counts[n], n)
	}
	return strings.Join(parts, ", ")
}

package placement

import (
	"github.com/tessera-dev/tessera/api"
)

// Device is one schedulable unit of a node: a whole GPU, or a MIG instance of a GPU
// in MIG mode. Devices are immutable once a NodeModel is built.
type device struct {
	UUID      string
	Index     int // NVML index of the physical GPU
	model     string
	memoryMiB int64
	NUMA      int
	healthy   bool
	health    string
	mig       bool
	// mps is set for a GPU in mps sharing mode, whose MPS server takes mpsClients
	// containers (sharing.go).
	mps        bool
	mpsClients int
	// island is the NVLink island (connected component over NVLink) of the physical
	// GPU, or -1 when the GPU has no NVLink peer.
	island int
}

// deviceHot is what Filter and Score read of every device of every node they see,
// packed apart from device's strings: a node's eight devices fill two cache lines
// here against twelve in devices, and on a busy scheduler each line is a miss.
type deviceHot struct {
	MemoryMiB int64
	island    int32
	Healthy   bool
	MIG       bool
	// kind is the position of the node's first device of the same model, memory,
	// health, MIG flag and sharing mode (capped at maxDeviceKind): devices of one kind with the
	// same usage are interchangeable to Fragmentation (alikeDevices), which compared
	// the model strings for it on every candidate.
	kind uint16
}

// maxDeviceKind caps deviceHot.kind; the devices it is compared for are the first 64.
const maxDeviceKind = 1<<16 - 1

// NodeModel is a node's decoded inventory in the form Filter, Score and Reserve use.
type NodeModel struct {
	Devices []device
	// Hot[i] holds device i's memory, island, health and MIG flag, as devices[i].
	Hot    []deviceHot
	ByUUID map[string]int
	// affinity[i][j] in [0,1]: how well devices i and j work together (1 = NVLink).
	affinity [][]float64
	// islands[k] lists the devices of NVLink island k.
	islands [][]int
	// nvlinked[i][j] reports an NVLink between the physical GPUs of i and j.
	nvlinked [][]bool
	// Healthy counts the healthy devices (PreScore reads it for every feasible node).
	Healthy int
	// hasMPS is set when a device is in mps sharing mode (sharing.go); the hot loops
	// read devices[i].mps only then.
	hasMPS bool
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

// buildNodeModel turns a validated inventory into devices, pair affinities and
// NVLink islands. A GPU in MIG mode contributes its instances instead of itself.
func buildNodeModel(inv *api.NodeInventory) *NodeModel {
	m := &NodeModel{ByUUID: make(map[string]int)}
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
				m.Devices = append(m.Devices, device{
					UUID: mi.UUID, Index: g.Index, model: g.Model + " MIG " + mi.Profile,
					memoryMiB: mi.MemoryMiB, NUMA: g.NUMANode, healthy: g.Healthy, health: g.HealthReason,
					mig: true, island: islandOf[i],
				})
				gpuOf = append(gpuOf, i)
			}
			continue
		}
		if g.MIG != nil {
			// MIG mode with no instances: nothing on this GPU can be scheduled.
			continue
		}
		m.Devices = append(m.Devices, device{
			UUID: g.UUID, Index: g.Index, model: g.Model, memoryMiB: g.MemoryMiB,
			NUMA: g.NUMANode, healthy: g.Healthy, health: g.HealthReason, island: islandOf[i],
			mps: g.Mode() == api.SharingMPS, mpsClients: g.MPSClients,
		})
		m.hasMPS = m.hasMPS || g.Mode() == api.SharingMPS
		gpuOf = append(gpuOf, i)
	}
	m.Hot = make([]deviceHot, len(m.Devices))
	for i := range m.Devices {
		d := &m.Devices[i]
		m.ByUUID[d.UUID] = i
		if d.healthy {
			m.Healthy++
		}
		m.Hot[i] = deviceHot{MemoryMiB: d.memoryMiB, island: int32(d.island), Healthy: d.healthy, MIG: d.mig, kind: uint16(min(i, maxDeviceKind))}
		for j := 0; j < min(i, maxDeviceKind); j++ {
			if o := &m.Devices[j]; o.model == d.model && o.memoryMiB == d.memoryMiB && o.healthy == d.healthy && o.mig == d.mig && o.mps == d.mps && o.mpsClients == d.mpsClients {
				m.Hot[i].kind = uint16(j)
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
	m.affinity = make([][]float64, d)
	m.nvlinked = make([][]bool, d)
	for i := 0; i < d; i++ {
		m.affinity[i] = make([]float64, d)
		m.nvlinked[i] = make([]bool, d)
		for j := 0; j < d; j++ {
			gi, gj := gpuOf[i], gpuOf[j]
			if gi == gj {
				// MIG instances of one GPU share its memory system.
				m.affinity[i][j] = pcieAffinity(api.PCIeInternal)
				m.nvlinked[i][j] = i == j
				continue
			}
			m.affinity[i][j] = linkAff[gi][gj]
			m.nvlinked[i][j] = nv[gi][gj]
		}
	}
	m.islands = make([][]int, len(roots))
	for i := range m.Devices {
		if k := m.Devices[i].island; k >= 0 {
			m.islands[k] = append(m.islands[k], i)
		}
	}
	return m
}

// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"math"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Scoring helpers the policies share: how used a device is, best fit's leftover,
// the Binpack device score (which Fragmentation breaks its ties with), and the
// weighting and clamping of node scores.

// DeviceUtil is the weighted use of device i after placing container c on it (0..1
// for a container that fits), the measure of the GPU-level policies' device scores.
func DeviceUtil(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, w *Weights) float64 {
	d := &m.Hot[i]
	u := &used[i]
	memFrac := float64(u.MemMiB+c.MemoryOn(d.MemoryMiB)) / float64(d.MemoryMiB)
	coreFrac := float64(u.Cores+c.Cores) / 100
	return (w.Memory*memFrac + w.Cores*coreFrac) / (w.Memory + w.Cores)
}

// islandFree reports whether no device of NVLink island k is used (by the devices'
// island numbers, as freeIslands).
func islandFree(m *nodemodel.Model, used []Usage, k int32) bool {
	for i := range m.Hot {
		if m.Hot[i].Island == k && used[i].Tenants > 0 {
			return false
		}
	}
	return true
}

// PackScore is the Binpack device score: the device's weighted use after placing c.
// Among equally full choices, it keeps whole NVLink islands free by preferring a GPU
// that is already used or whose island is already broken.
func PackScore(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, w *Weights) float64 {
	s := DeviceUtil(m, used, c, i, w)
	d := &m.Hot[i]
	if used[i].Tenants == 0 && d.Island >= 0 && islandFree(m, used, d.Island) {
		s -= 1e-3
	}
	return s
}

// DeviceFree is the free share of device i under used, by the plugin's weights.
func DeviceFree(m *nodemodel.Model, used []Usage, i int, w *Weights) float64 {
	d := &m.Hot[i]
	if !d.Healthy {
		return 0
	}
	u := &used[i]
	util := (w.Memory*float64(u.MemMiB)/float64(d.MemoryMiB) + w.Cores*float64(u.Cores)/100) / (w.Memory + w.Cores)
	return math.Max(0, 1-util)
}

// PickBest is the device of cand that score rates highest (the first of equals).
func PickBest(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, w *Weights, cand []int,
	score func(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, w *Weights) float64) int {
	best, bestScore := -1, 0.0
	for _, i := range cand {
		s := score(m, used, c, i, w)
		if best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// WeightedScore is the weighted mean, in the framework's range, of the node-level
// policy's term and, for pods with a multi-GPU container, GPU locality:
//
//	score = 100 × Σ weight·term / Σ weight
//
// ok is false when every weight that applies is 0.
func WeightedScore(w *Weights, term float64, a *Allocation) (score float64, ok bool) {
	sum, total := w.Policy*term, w.Policy
	if a.multiGPU {
		sum += w.Topology * a.topology
		total += w.Topology
	}
	if total == 0 {
		return 0, false
	}
	return sum / total * float64(fwk.MaxNodeScore), true
}

// FitScale is the largest node among the cycle's feasible nodes (CPU millicores and
// healthy GPUs, the yardsticks of leftover) and the pod's CPU request.
type FitScale struct {
	CPUMilli, GPUs float64
	PodCPUMilli    int64
}

// Leftover is what best fit minimises: the node's free GPU and CPU capacity after
// placement, each measured against the largest node of the cycle and weighted ½
// (0 nothing left .. 1 an empty largest node). Without a scale (PreScore
// did not run) the node is its own yardstick and the pod's CPU is not counted.
func Leftover(m *nodemodel.Model, used []Usage, ni fwk.NodeInfo, f *FitScale, w *Weights) float64 {
	var gpuFree, gpus float64
	for i := range m.Hot {
		if m.Hot[i].Healthy {
			gpuFree += DeviceFree(m, used, i, w)
			gpus++
		}
	}
	alloc := ni.GetAllocatable().GetMilliCPU()
	cpuFree := float64(alloc - ni.GetRequested().GetMilliCPU())
	cpuMax, gpuMax := float64(alloc), gpus
	if f != nil {
		cpuFree -= float64(f.PodCPUMilli)
		cpuMax, gpuMax = f.CPUMilli, f.GPUs
	}
	var left float64
	if cpuMax > 0 {
		left += 0.5 * math.Max(0, cpuFree) / cpuMax
	}
	if gpuMax > 0 {
		left += 0.5 * gpuFree / gpuMax
	}
	return math.Min(1, left)
}

// ClampScore clamps s to the framework's range of node scores.
func ClampScore(s int64) int64 {
	if s < fwk.MinNodeScore {
		return fwk.MinNodeScore
	}
	if s > fwk.MaxNodeScore {
		return fwk.MaxNodeScore
	}
	return s
}

// PodHostRequests is the pod's CPU (millicores) and host memory (bytes) request, as
// NodeResourcesFit counts it.
func PodHostRequests(pod *v1.Pod) (cpuMilli, memBytes int64) {
	r := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	return r.Cpu().MilliValue(), r.Memory().Value()
}

// HostFree is the node's unrequested CPU (millicores) and memory (bytes).
func HostFree(ni fwk.NodeInfo) (cpuMilli, memBytes int64) {
	a, r := ni.GetAllocatable(), ni.GetRequested()
	return a.GetMilliCPU() - r.GetMilliCPU(), a.GetMemory() - r.GetMemory()
}

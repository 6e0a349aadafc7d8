package placement

import (
	"math"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
)

// Policy is a placement strategy, used independently at the node level (which node)
// and at the GPU level (which GPUs of the chosen node).
type Policy string

const (
	// Binpack fills the most-used node (or GPU) that still fits, keeping whole GPUs
	// and whole nodes free for large requests.
	Binpack Policy = "Binpack"
	// Spread places on the least-used node (or GPU), minimising contention.
	Spread Policy = "Spread"
	// Fragmentation places where the pod makes the least GPU capacity unusable for the
	// recent mix of GPU pods (fragmentation gradient descent; see fragmentation.go).
	Fragmentation Policy = "Fragmentation"
)

// Placer is a placement policy: Binpack (binpack.go), Spread (spread.go) or
// Fragmentation (fragmentation.go). A profile uses one placer at the node level
// (which node: Score) and one, possibly another, at the GPU level (which GPUs of a
// node: Filter, Reserve and preemption's AddPod, through Allocate); a pod may pick
// its GPU-level placer by annotation. The extension points call placers and never
// ask which policy they hold.
//
// Placers are called for every node of every cycle, in parallel: they keep no
// per-cycle state of their own, and the slices they are given may live on a caller's
// stack only where noted.
type Placer interface {
	// Policy is the placer's name in args, annotations and metrics.
	Policy() Policy

	// PreparePod records in info what the placer needs of a GPU pod for the cycle
	// (PreFilter; called for the node-level and then, if another, the GPU-level placer).
	PreparePod(pod *v1.Pod, info *PodInfo)

	// deviceScore rates placing container c on device i of m, in [0,1], higher is
	// better: how multi-GPU sets are grown and compared (pickSet).
	deviceScore(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, w *Weights) float64
	// pickDevice chooses, for a one-GPU container, one device of cand (devices that
	// fit it, never empty). measured, when not nil, receives what the placer
	// measured of the node, if anything: the per-node state it keeps with the
	// allocation for its node-level score (nodeMeasure); its base on entry is the
	// cache's measure of the node under used, or nil.
	pickDevice(m *nodemodel.Model, used []Usage, p *PodInfo, c *api.ContainerRequest, w *Weights, cand []int, measured *nodeMeasure) int

	// HostOnlyPod is what the node-level placer scores a pod without GPUs by
	// (PreFilter), or nil when it does not score such pods (PreScore then skips).
	HostOnlyPod(pod *v1.Pod) *PodInfo
	// NeedsFit reports whether the node-level score uses the cycle's largest
	// feasible node (FitScale), which PreScore then measures.
	NeedsFit() bool
	// ScoreNode is the node-level score of allocation a of the cycle's pod (info) on ni.
	ScoreNode(info *PodInfo, a *Allocation, ni fwk.NodeInfo, f *FitScale, w *Weights) int64
	// ScoreHostOnly is the node-level score of a pod without GPUs on ni, for the h
	// that HostOnlyPod returned.
	ScoreHostOnly(c *Cache, h *PodInfo, ni fwk.NodeInfo, f *FitScale, w *Weights) int64
	// ScoreExtensions normalises the node-level scores of a cycle, or is nil when
	// ScoreNode is already in the framework's range.
	ScoreExtensions() fwk.ScoreExtensions
}

// nodeMeasure is what a GPU-level placer measured of a node while picking a device,
// kept with the allocation so that its node-level score need not measure the node
// again: Fragmentation's; zero for the others.
type nodeMeasure struct {
	// base is the node's statistics before the pod (FragStats), or nil.
	base *FragStats
	// Picked is set when the placer measured the container on the device it picked:
	// the node's fragmentation before and after, and its free GPU capacity after,
	// with no shape held back by host resources (FragStats.Value(wl, nil)): what the
	// node-level score computes when the node's CPU and memory hold back none.
	Picked                    bool
	before, after, afterTotal float64
}

// Policies lists the placement policies in the order messages name them.
var Policies = []Policy{Binpack, Spread, Fragmentation}

// PlacerFactories maps a policy to the constructor of its placer. A plugin builds one
// placer per policy (NewPlacers), so that a pod's GPU-level choice and the profile's
// node-level one share what the policy learns.
var PlacerFactories = map[Policy]func(workload *WorkloadModel) Placer{
	Binpack:       func(*WorkloadModel) Placer { return binpack{} },
	Spread:        func(*WorkloadModel) Placer { return spread{} },
	Fragmentation: func(wl *WorkloadModel) Placer { return &fragmentation{workload: wl} },
}

// NewPlacers builds every policy's placer over the plugin's workload model.
func NewPlacers(workload *WorkloadModel) map[Policy]Placer {
	out := make(map[Policy]Placer, len(PlacerFactories))
	for p, f := range PlacerFactories {
		out[p] = f(workload)
	}
	return out
}

// pickBest is the device of cand that score rates highest (the first of equals).
func pickBest(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, w *Weights, cand []int,
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

// weightedScore is the weighted mean, in the framework's range, of the node-level
// policy's term and, for pods with a multi-GPU container, GPU locality:
//
//	score = 100 × Σ weight·term / Σ weight
//
// ok is false when every weight that applies is 0.
func weightedScore(w *Weights, term float64, a *Allocation) (score float64, ok bool) {
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

// leftover is what best fit minimises: the node's free GPU and CPU capacity after
// placement, each measured against the largest node of the cycle and weighted ½
// (0 nothing left .. 1 an empty largest node). Without a scale (PreScore
// did not run) the node is its own yardstick and the pod's CPU is not counted.
func leftover(m *nodemodel.Model, used []Usage, ni fwk.NodeInfo, f *FitScale, w *Weights) float64 {
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

// clampScore clamps s to the framework's range of node scores.
func clampScore(s int64) int64 {
	if s < fwk.MinNodeScore {
		return fwk.MinNodeScore
	}
	if s > fwk.MaxNodeScore {
		return fwk.MaxNodeScore
	}
	return s
}

package gpushare

import (
	"math"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
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

// placer is a placement policy: Binpack (binpack.go), Spread (spread.go) or
// Fragmentation (fragmentation.go). A profile uses one placer at the node level
// (which node: Score) and one, possibly another, at the GPU level (which GPUs of a
// node: Filter, Reserve and preemption's AddPod, through allocate); a pod may pick
// its GPU-level placer by annotation. The extension points call placers and never
// ask which policy they hold.
//
// Placers are called for every node of every cycle, in parallel: they keep no
// per-cycle state of their own, and the slices they are given may live on a caller's
// stack only where noted.
type placer interface {
	// policy is the placer's name in args, annotations and metrics.
	policy() Policy

	// preparePod records in info what the placer needs of a GPU pod for the cycle
	// (PreFilter; called for the node-level and then, if another, the GPU-level placer).
	preparePod(pod *v1.Pod, info *podInfo)

	// deviceScore rates placing container c on device i of m, in [0,1], higher is
	// better: how multi-GPU sets are grown and compared (pickSet).
	deviceScore(m *nodeModel, used []usage, c *api.ContainerRequest, i int, w *weights) float64
	// pickDevice chooses, for a one-GPU container, one device of cand (devices that
	// fit it, never empty). measured, when not nil, receives what the placer
	// measured of the node, if anything: the per-node state it keeps with the
	// allocation for its node-level score (nodeMeasure); its base on entry is the
	// cache's measure of the node under used, or nil.
	pickDevice(m *nodeModel, used []usage, p *podInfo, c *api.ContainerRequest, w *weights, cand []int, measured *nodeMeasure) int

	// hostOnlyPod is what the node-level placer scores a pod without GPUs by
	// (PreFilter), or nil when it does not score such pods (PreScore then skips).
	hostOnlyPod(pod *v1.Pod) *podInfo
	// needsFit reports whether the node-level score uses the cycle's largest
	// feasible node (fitScale), which PreScore then measures.
	needsFit() bool
	// scoreNode is the node-level score of allocation a of the cycle's pod (info) on ni.
	scoreNode(info *podInfo, a *allocation, ni fwk.NodeInfo, f *fitScale, w *weights) int64
	// scoreHostOnly is the node-level score of a pod without GPUs on ni, for the h
	// that hostOnlyPod returned.
	scoreHostOnly(c *Cache, h *podInfo, ni fwk.NodeInfo, f *fitScale, w *weights) int64
	// scoreExtensions normalises the node-level scores of a cycle, or is nil when
	// scoreNode is already in the framework's range.
	scoreExtensions() fwk.ScoreExtensions
}

// nodeMeasure is what a GPU-level placer measured of a node while picking a device,
// kept with the allocation so that its node-level score need not measure the node
// again: Fragmentation's; zero for the others.
type nodeMeasure struct {
	// base is the node's statistics before the pod (fragStats), or nil.
	base *fragStats
	// picked is set when the placer measured the container on the device it picked:
	// the node's fragmentation before and after, and its free GPU capacity after,
	// with no shape held back by host resources (fragStats.value(wl, nil)): what the
	// node-level score computes when the node's CPU and memory hold back none.
	picked                    bool
	before, after, afterTotal float64
}

// policies lists the placement policies in the order messages name them.
var policies = []Policy{Binpack, Spread, Fragmentation}

// placerFactories maps a policy to the constructor of its placer. A plugin builds one
// placer per policy (newPlacers), so that a pod's GPU-level choice and the profile's
// node-level one share what the policy learns.
var placerFactories = map[Policy]func(workload *workloadModel) placer{
	Binpack:       func(*workloadModel) placer { return binpack{} },
	Spread:        func(*workloadModel) placer { return spread{} },
	Fragmentation: func(wl *workloadModel) placer { return &fragmentation{workload: wl} },
}

// newPlacers builds every policy's placer over the plugin's workload model.
func newPlacers(workload *workloadModel) map[Policy]placer {
	out := make(map[Policy]placer, len(placerFactories))
	for p, f := range placerFactories {
		out[p] = f(workload)
	}
	return out
}

// pickBest is the device of cand that score rates highest (the first of equals).
func pickBest(m *nodeModel, used []usage, c *api.ContainerRequest, w *weights, cand []int,
	score func(m *nodeModel, used []usage, c *api.ContainerRequest, i int, w *weights) float64) int {
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
func weightedScore(w *weights, term float64, a *allocation) (score float64, ok bool) {
	sum, total := w.policy*term, w.policy
	if a.multiGPU {
		sum += w.topology * a.topology
		total += w.topology
	}
	if total == 0 {
		return 0, false
	}
	return sum / total * float64(fwk.MaxNodeScore), true
}

// fitScale is the largest node among the cycle's feasible nodes (CPU millicores and
// healthy GPUs, the yardsticks of leftover) and the pod's CPU request.
type fitScale struct {
	cpuMilli, gpus float64
	podCPUMilli    int64
}

// leftover is what best fit minimises: the node's free GPU and CPU capacity after
// placement, each measured against the largest node of the cycle and weighted ½
// (0 nothing left .. 1 an empty largest node). Without a scale (PreScore
// did not run) the node is its own yardstick and the pod's CPU is not counted.
func leftover(m *nodeModel, used []usage, ni fwk.NodeInfo, f *fitScale, w *weights) float64 {
	var gpuFree, gpus float64
	for i := range m.hot {
		if m.hot[i].healthy {
			gpuFree += deviceFree(m, used, i, w)
			gpus++
		}
	}
	alloc := ni.GetAllocatable().GetMilliCPU()
	cpuFree := float64(alloc - ni.GetRequested().GetMilliCPU())
	cpuMax, gpuMax := float64(alloc), gpus
	if f != nil {
		cpuFree -= float64(f.podCPUMilli)
		cpuMax, gpuMax = f.cpuMilli, f.gpus
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

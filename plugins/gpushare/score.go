package gpushare

import (
	"context"
	"math"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// nodeState is what a node-level policy sees of a node after placement.
type nodeState struct {
	// util is the weighted GPU memory and cores granted (0 empty .. 1 full), occupied
	// the share of the node's GPUs that have at least one tenant.
	util, occupied float64
	// left is the node's free GPU and CPU capacity, each measured against the largest
	// node of the cycle and weighted ½ (0 nothing left .. 1 an empty largest node).
	left float64
}

// nodePolicies maps a node-level policy to its term in [0,1]. The state is passed by
// value: a pointer passed through a function value escapes, one allocation per Score.
var nodePolicies = map[Policy]func(n nodeState) float64{
	// Binpack is best fit: the node with the least GPU and CPU capacity left after
	// placement. Absolute leftovers (not utilisation) fill small nodes before large
	// ones, keeping large nodes whole for the pods only they can take; counting CPU
	// keeps CPU-heavy pods from stranding the GPUs of a node with CPU to spare.
	Binpack: func(n nodeState) float64 { return 1 - n.left },
	// Spread also counts occupied GPUs: a small fraction moves util by less than one
	// score point on a large node, but always occupies a GPU, so nodes stay apart.
	Spread: func(n nodeState) float64 { return 1 - (n.util+n.occupied)/2 },
}

// fitScale is the largest node among the cycle's feasible nodes (CPU millicores and
// healthy GPUs, the yardsticks of nodeState.left) and the pod's CPU request.
type fitScale struct {
	cpuMilli, gpus float64
	podCPUMilli    int64
}

// largestNodeChunk is how many feasible nodes one worker of largestNode measures. Below
// two chunks the nodes are measured in the calling goroutine.
const largestNodeChunk = 128

// largestNode measures the feasible nodes for the best-fit term. PreScore runs once per
// pod between the parallel Filter and Score, so its time adds straight to the cycle:
// with 500 feasible nodes (5,000 nodes at the default percentage to score) a scan that
// looks up every node's cache entry took 0.15 ms of a 1.3 ms cycle. The first chunk is
// measured here; usually it holds a node of the largest size, and the rest only need
// their allocatable CPU read (largestOf). Otherwise the rest are measured in parallel
// chunks: the maximum does not depend on the order. Starting workers for the cheap case
// cost more than it saved on a busy machine.
func (pl *Plugin) largestNode(ctx context.Context, s *cycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fitScale {
	f := &fitScale{}
	f.podCPUMilli, _ = podHostRequests(pod)
	first := min(len(nodes), largestNodeChunk)
	f.cpuMilli, f.gpus = pl.largestOf(s, nodes[:first], 0)
	rest := nodes[first:]
	chunks := (len(rest) + largestNodeChunk - 1) / largestNodeChunk
	bound := float64(pl.cache.mostHealthy.Load())
	if chunks < 2 || (bound > 0 && f.gpus >= bound) || pl.handle == nil || pl.handle.Parallelizer() == nil {
		cpu, gpus := pl.largestOf(s, rest, f.gpus)
		f.cpuMilli, f.gpus = max(f.cpuMilli, cpu), max(f.gpus, gpus)
		return f
	}
	cpu, gpus := make([]float64, chunks), make([]float64, chunks)
	pl.handle.Parallelizer().Until(ctx, chunks, func(i int) {
		cpu[i], gpus[i] = pl.largestOf(s, rest[i*largestNodeChunk:min(len(rest), (i+1)*largestNodeChunk)], 0)
	}, Name)
	for i := range cpu {
		f.cpuMilli, f.gpus = max(f.cpuMilli, cpu[i]), max(f.gpus, gpus[i])
	}
	return f
}

// largestOf is the largest allocatable CPU and healthy GPU count among nodes and
// gpusSoFar (what other nodes already showed). Once a
// node has as many healthy GPUs as any node has had, no other can have more, and the
// rest are not looked up in the cache (each lookup is a memory miss or two): in a
// cluster of one node size, only the first is.
func (pl *Plugin) largestOf(s *cycleState, nodes []fwk.NodeInfo, gpusSoFar float64) (cpuMilli, gpus float64) {
	bound := float64(pl.cache.mostHealthy.Load())
	gpus = gpusSoFar
	for _, ni := range nodes {
		node := ni.Node()
		if node == nil {
			continue
		}
		cpuMilli = max(cpuMilli, float64(ni.GetAllocatable().GetMilliCPU()))
		if bound > 0 && gpus >= bound {
			continue
		}
		var m *nodeModel
		if !pl.cache.existing(node.Name).withKept(s.id, func(a *allocation) { m = a.model }) {
			var buf [16]usage
			v, _ := pl.cache.view(node, buf[:0])
			m = v.model
		}
		if m == nil {
			continue
		}
		gpus = max(gpus, float64(m.healthy))
	}
	return cpuMilli, gpus
}

// leftover is nodeState.left for allocation a on node ni. Without a scale (PreScore
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

// hostFitScore is the Binpack score of a pod without GPUs: best fit over the node's
// free GPUs (unchanged by the pod) and its CPU after placement. A node without GPUs
// has none to strand and scores by CPU alone.
func (pl *Plugin) hostFitScore(ni fwk.NodeInfo, f *fitScale) int64 {
	var buf [16]usage
	v, used := pl.cache.view(ni.Node(), buf[:0])
	m := v.model
	if m == nil {
		m = &nodeModel{}
	}
	return clampScore(int64((1-leftover(m, used, ni, f, &pl.w))*float64(fwk.MaxNodeScore) + 0.5))
}

// PreScore skips scoring for pods without GPU requests under Spread. Binpack scores
// them by best fit too (see hostFitScore): a CPU-only pod belongs on a node whose
// GPUs are taken, not on one whose free GPUs its CPU request would strand.
// Fragmentation scores them by the capacity they strand (see hostOnlyScore).
//
// Binpack and Fragmentation measure the cycle's feasible nodes for best fit.
func (pl *Plugin) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	s, err := getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.skip && pl.args.NodePolicy != Binpack && (s.hostOnly == nil || len(s.hostOnly.fragShapes) == 0) {
		return fwk.NewStatus(fwk.Skip)
	}
	if pl.args.NodePolicy != Spread {
		s.fit = pl.largestNode(ctx, s, pod, nodes)
	}
	return nil
}

// Score rates a node that passed Filter as a weighted mean, in the framework's range,
// of the terms that apply to the pod:
//
//	policy   always: the node-level policy over the node's state after placement
//	         (Binpack: best fit over free GPU and CPU; Spread: 1-util).
//	topology pods with a multi-GPU container: the mean pair affinity of its GPUs
//	         (1 all NVLink, 0.8 one PCIe switch, … 0.2 across sockets).
//
//	score = 100 × Σ weight·term / Σ weight − island
//
// island (Binpack, pods without a multi-GPU container) is islandWeight points for
// every fully free NVLink island the placement breaks up: a tie breaker that keeps
// islands whole for the pods that need them. As a weighted term
// it fought best fit (fractions went to nodes whose islands were already broken,
// whatever they left free).
//
// The Fragmentation node policy scores differently: see fragmentationScore.
func (pl *Plugin) Score(_ context.Context, cs fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s, err := getState(cs)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	node := nodeInfo.Node()
	if node == nil {
		return 0, nil
	}
	if s.skip {
		if pl.args.NodePolicy == Binpack {
			return pl.hostFitScore(nodeInfo, s.fit), nil
		}
		return pl.hostOnlyScore(s.hostOnly, nodeInfo, s.fit), nil
	}
	f := s.fit
	var score int64
	if pl.cache.existing(node.Name).withKept(s.id, func(a *allocation) { score = pl.scoreOf(s, a, nodeInfo, f) }) {
		return score, nil
	}
	// Filter did not run for this node in this cycle (batching): compute now.
	var buf [16]usage
	v, used := pl.cache.view(node, buf[:0])
	if v.model == nil {
		return 0, nil
	}
	a, fail := allocate(v.model, used, s.info, &pl.w)
	if fail != nil {
		return 0, nil
	}
	return pl.scoreOf(s, a, nodeInfo, f), nil
}

// scoreOf is Score for allocation a.
func (pl *Plugin) scoreOf(s *cycleState, a *allocation, ni fwk.NodeInfo, f *fitScale) int64 {
	if pl.args.NodePolicy == Fragmentation {
		return pl.fragmentationScore(s, a, ni, f)
	}
	return pl.scoreAllocation(a, ni, f)
}

func (pl *Plugin) scoreAllocation(a *allocation, ni fwk.NodeInfo, f *fitScale) int64 {
	w := &pl.w
	var n nodeState
	if pl.args.NodePolicy == Binpack {
		n.left = leftover(a.model, a.used, ni, f, w)
	} else {
		n.util, n.occupied = nodeUtilisation(a.model, a.used, w)
	}
	sum, total := w.policy*nodePolicies[pl.args.NodePolicy](n), w.policy
	if a.multiGPU {
		sum += w.topology * a.topology
		total += w.topology
	}
	if total == 0 {
		return 0
	}
	score := sum / total * float64(fwk.MaxNodeScore)
	if !a.multiGPU && pl.args.NodePolicy == Binpack {
		score -= w.island * float64(a.brokenIslands)
	}
	return clampScore(int64(score + 0.5))
}

// nodeUtilisation returns the weighted GPU memory and cores share granted on the
// node's healthy devices, and the share of them that have a tenant.
func nodeUtilisation(m *nodeModel, used []usage, w *weights) (util, occupied float64) {
	var mem, memTotal, cores, n, busy float64
	for i := range m.devices {
		d := &m.devices[i]
		if !d.healthy {
			continue
		}
		mem += float64(used[i].memMiB)
		memTotal += float64(d.memoryMiB)
		cores += float64(used[i].cores)
		n++
		if used[i].tenants > 0 {
			busy++
		}
	}
	if n == 0 || memTotal == 0 {
		return 0, 0
	}
	return (w.memory*mem/memTotal + w.cores*cores/(100*n)) / (w.memory + w.cores), busy / n
}

func clampScore(s int64) int64 {
	if s < fwk.MinNodeScore {
		return fwk.MinNodeScore
	}
	if s > fwk.MaxNodeScore {
		return fwk.MaxNodeScore
	}
	return s
}

// ScoreExtensions returns nil for Binpack and Spread, whose scores are already in the
// framework's range; Fragmentation scores are raw and normalised per cycle.
func (pl *Plugin) ScoreExtensions() fwk.ScoreExtensions {
	if pl.args.NodePolicy == Fragmentation {
		return pl
	}
	return nil
}

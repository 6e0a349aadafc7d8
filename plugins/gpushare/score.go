// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

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
func (pl *Plugin) largestNode(ctx context.Context, s *cycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *placement.FitScale {
	f := &placement.FitScale{}
	f.PodCPUMilli, _ = placement.PodHostRequests(pod)
	first := min(len(nodes), largestNodeChunk)
	f.CPUMilli, f.GPUs = pl.largestOf(s, nodes[:first], 0)
	rest := nodes[first:]
	chunks := (len(rest) + largestNodeChunk - 1) / largestNodeChunk
	bound := float64(pl.cache.MostHealthy.Load())
	par := fwk.ParallelizerOf(pl.handle)
	if chunks < 2 || (bound > 0 && f.GPUs >= bound) || par == nil {
		cpu, gpus := pl.largestOf(s, rest, f.GPUs)
		f.CPUMilli, f.GPUs = max(f.CPUMilli, cpu), max(f.GPUs, gpus)
		return f
	}
	cpu, gpus := make([]float64, chunks), make([]float64, chunks)
	par.Until(ctx, chunks, func(i int) {
		cpu[i], gpus[i] = pl.largestOf(s, rest[i*largestNodeChunk:min(len(rest), (i+1)*largestNodeChunk)], 0)
	}, Name)
	for i := range cpu {
		f.CPUMilli, f.GPUs = max(f.CPUMilli, cpu[i]), max(f.GPUs, gpus[i])
	}
	return f
}

// largestOf is the largest allocatable CPU and healthy GPU count among nodes and
// gpusSoFar (what other nodes already showed). Once a
// node has as many healthy GPUs as any node has had, no other can have more, and the
// rest are not looked up in the cache (each lookup is a memory miss or two): in a
// cluster of one node size, only the first is.
func (pl *Plugin) largestOf(s *cycleState, nodes []fwk.NodeInfo, gpusSoFar float64) (cpuMilli, gpus float64) {
	bound := float64(pl.cache.MostHealthy.Load())
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
		var m *nodemodel.Model
		if !pl.cache.ExistingFor(node).WithKept(s.id, func(a *placement.Allocation) { m = a.Model }) {
			var buf [16]placement.Usage
			v, _ := pl.cache.View(node, buf[:0])
			m = v.Model
		}
		if m == nil {
			continue
		}
		gpus = max(gpus, float64(m.Healthy))
	}
	return cpuMilli, gpus
}

// PreScore skips pods without GPU requests whose node-level placer does not score
// them (placer.HostOnlyPod), and measures the cycle's feasible nodes for best fit
// when the placer uses it (placer.NeedsFit).
func (pl *Plugin) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	s, err := getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.skip && s.hostOnly == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	if pl.node.NeedsFit() {
		s.fit = pl.largestNode(ctx, s, pod, nodes)
	}
	return nil
}

// Score is the node-level placer's score of the node for the pod: for a GPU pod, of
// the allocation Filter kept on the node in this cycle (placer.ScoreNode); for a pod
// without GPUs, of the GPU capacity its CPU and memory would leave behind
// (placer.ScoreHostOnly).
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
		var buf [16]placement.Usage
		e, v, used := pl.cache.EntryView(node, buf[:0])
		if v.Model != nil && v.Model.DRA {
			// A DRA node's GPUs are used through claims, which this cache does not
			// see: TesseraDynamicResources scores the pod there.
			return 0, nil
		}
		return pl.node.ScoreHostOnly(e, v, used, s.hostOnly, nodeInfo, s.fit, &pl.w), nil
	}
	f := s.fit
	var score int64
	if pl.cache.ExistingFor(node).WithKept(s.id, func(a *placement.Allocation) { score = pl.node.ScoreNode(s.info, a, nodeInfo, f, &pl.w) }) {
		return score, nil
	}
	return pl.scoreUnfiltered(s, nodeInfo), nil
}

// scoreUnfiltered scores a node Filter did not run on in this cycle (batching): it
// allocates now. Apart from Score, whose frame then stays small: Score runs in the
// framework's worker goroutines, which start on small stacks and grow them by copying.
//
//go:noinline
func (pl *Plugin) scoreUnfiltered(s *cycleState, nodeInfo fwk.NodeInfo) int64 {
	var buf [16]placement.Usage
	v, used := pl.cache.View(nodeInfo.Node(), buf[:0])
	if v.Model == nil || s.toDRA(&v) {
		return 0
	}
	a, fail := placement.Allocate(v.Model, used, s.info, &pl.w)
	if fail != nil {
		return 0
	}
	return pl.node.ScoreNode(s.info, a, nodeInfo, s.fit, &pl.w)
}

// ScoreExtensions is the node-level placer's: nil where its scores are already in the
// framework's range.
func (pl *Plugin) ScoreExtensions() fwk.ScoreExtensions {
	return pl.node.ScoreExtensions()
}

package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// nodePolicies maps a node-level policy to its term in [0,1] given the node's state
// after placement: util is the weighted GPU memory and cores granted (0 empty .. 1
// full), occupied the share of its GPUs that have at least one tenant.
var nodePolicies = map[Policy]func(util, occupied float64) float64{
	Binpack: func(util, _ float64) float64 { return util },
	// Spread also counts occupied GPUs: a small fraction moves util by less than one
	// score point on a large node, but always occupies a GPU, so nodes stay apart.
	Spread: func(util, occupied float64) float64 { return 1 - (util+occupied)/2 },
}

// PreScore skips scoring for pods without GPU requests, except under the
// Fragmentation node policy (see hostOnlyScore).
func (pl *Plugin) PreScore(_ context.Context, cs fwk.CycleState, _ *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	s, err := getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.skip && (s.hostOnly == nil || len(s.hostOnly.fragShapes) == 0) {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score rates a node that passed Filter as a weighted mean, in the framework's range,
// of the terms that apply to the pod:
//
//	policy   always: the node-level policy over the node's GPU utilisation after
//	         placement (Binpack: util, Spread: 1-util).
//	topology pods with a multi-GPU container: the mean pair affinity of its GPUs
//	         (1 all NVLink, 0.8 one PCIe switch, … 0.2 across sockets).
//	island   Binpack, pods without a multi-GPU container: the share of the node's
//	         fully free NVLink islands the placement leaves whole, so that small
//	         pods do not break up the islands whole-GPU pods will need.
//
//	score = 100 × Σ weight·term / Σ weight
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
		return pl.hostOnlyScore(s.hostOnly, nodeInfo), nil
	}
	a := s.result(node.Name)
	if a == nil {
		// Filter did not run for this node in this cycle (batching): compute now.
		var buf [16]usage
		v := pl.cache.view(node, buf[:0])
		if v.model == nil {
			return 0, nil
		}
		var fail *allocFailure
		if a, fail = allocate(v.model, v.used, s.info, &pl.w); fail != nil {
			return 0, nil
		}
	}
	if pl.args.NodePolicy == Fragmentation {
		return pl.fragmentationScore(s, a, nodeInfo), nil
	}
	return pl.scoreAllocation(a), nil
}

func (pl *Plugin) scoreAllocation(a *allocation) int64 {
	w := &pl.w
	util, occupied := nodeUtilisation(a.model, a.used, w)
	sum, total := w.policy*nodePolicies[pl.args.NodePolicy](util, occupied), w.policy
	if a.multiGPU {
		sum += w.topology * a.topology
		total += w.topology
	} else if pl.args.NodePolicy == Binpack {
		island := 1.0
		if a.freeIslands > 0 {
			island = 1 - float64(a.brokenIslands)/float64(a.freeIslands)
		}
		sum += w.island * island
		total += w.island
	}
	if total == 0 {
		return 0
	}
	return clampScore(int64(sum/total*float64(fwk.MaxNodeScore) + 0.5))
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

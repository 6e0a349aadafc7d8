// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"math"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
)

// The comparison policies of the FGD paper that the replay reproduces to validate
// itself. They are Score plugins of this tool only, never of the Tessera scheduler:
// Filter and Reserve stay the production plugin's.

const (
	bestFitName = "TraceBestFit"
	randomName  = "TraceRandom"
)

// Normalisers of the paper's BestFit: the largest node of the trace has 128 CPUs and
// 8 GPUs.
const (
	bestFitMaxCPU = 128000.0
	bestFitMaxGPU = 8000.0
)

// bestFit is the paper's BestFit: the node whose free CPU and GPU after placement are
// smallest, each normalised by the largest node and weighted 1/2. Like the paper's
// plugin it truncates to an integer score in 0..100 and normalises min-max over the
// feasible nodes; ties are broken at random by the caller.
type bestFit struct {
	handle fwk.Handle
	ledger *ledger
}

var (
	_ fwk.ScorePlugin     = &bestFit{}
	_ fwk.ScoreExtensions = &bestFit{}
	_ fwk.ScorePlugin     = randomScore{}
)

func (b *bestFit) Name() string { return bestFitName }

func (b *bestFit) Score(_ context.Context, _ fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	cpuReq, gpuReq := podCPUAndGPU(pod)
	cpuFree := float64(ni.GetAllocatable().GetMilliCPU() - ni.GetRequested().GetMilliCPU())
	gpuFree := float64(b.ledger.nodeFree(ni.Node().Name))
	left := 0.5*(cpuFree-cpuReq)/bestFitMaxCPU + 0.5*(gpuFree-gpuReq)/bestFitMaxGPU
	return int64((1 - left) * float64(fwk.MaxNodeScore)), nil
}

func (b *bestFit) ScoreExtensions() fwk.ScoreExtensions { return b }

// NormalizeScore maps the lowest score to 0 and the highest to 100.
func (b *bestFit) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for _, s := range scores {
		lo, hi = min(lo, s.Score), max(hi, s.Score)
	}
	for i := range scores {
		if hi == lo {
			scores[i].Score = fwk.MinNodeScore
		} else {
			scores[i].Score = (scores[i].Score - lo) * (fwk.MaxNodeScore - fwk.MinNodeScore) / (hi - lo)
		}
	}
	return nil
}

// podCPUAndGPU is a replay pod's CPU request (milli) and GPU demand (milli-GPU).
func podCPUAndGPU(pod *v1.Pod) (cpu, gpu float64) {
	names := api.DefaultResourceNames()
	for _, c := range pod.Spec.Containers {
		cpu += float64(c.Resources.Requests.Cpu().MilliValue())
		n, ok := c.Resources.Limits[names.GPU]
		if !ok {
			continue
		}
		share := int64(100)
		if pct, ok := c.Resources.Limits[names.GPUMemoryPercent]; ok {
			share = pct.Value()
		}
		gpu += float64(n.Value() * share * 10)
	}
	return cpu, gpu
}

// randomScore gives every node the same score, so the caller's random tie-break
// picks a uniformly random feasible node: the paper's Random.
type randomScore struct{}

func (randomScore) Name() string { return randomName }
func (randomScore) Score(context.Context, fwk.CycleState, *v1.Pod, fwk.NodeInfo) (int64, *fwk.Status) {
	return 0, nil
}
func (randomScore) ScoreExtensions() fwk.ScoreExtensions { return nil }

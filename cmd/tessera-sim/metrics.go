// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"sort"

	backendcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
)

// shape is a GPU pod shape of the workload and how often it occurs: the "target
// workload" of the FGD paper's fragmentation measure.
type shape struct {
	cpuMilli int64
	numGPU   int
	milli    int64 // per GPU
	weight   float64
}

// workloadShapes is the frequency of every GPU pod shape in the pod list. CPU-only
// pods are left out, as in the paper (they cannot use GPU capacity).
func workloadShapes(pods []tracePod) []shape {
	type key struct {
		cpu   int64
		n     int
		milli int64
	}
	count := map[key]int{}
	total := 0
	for _, p := range pods {
		if p.numGPU == 0 {
			continue
		}
		count[key{p.cpuMilli, p.numGPU, p.gpuMilli}]++
		total++
	}
	out := make([]shape, 0, len(count))
	for k, c := range count {
		out = append(out, shape{cpuMilli: k.cpu, numGPU: k.n, milli: k.milli, weight: float64(c) / float64(total)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].weight != out[j].weight {
			return out[i].weight > out[j].weight
		}
		a, b := out[i], out[j]
		if a.numGPU != b.numGPU {
			return a.numGPU < b.numGPU
		}
		if a.milli != b.milli {
			return a.milli < b.milli
		}
		return a.cpuMilli < b.cpuMilli
	})
	return out
}

// nodeFragmentation is the paper's fragmentation of one node for the target workload:
// for each shape, the free GPU capacity it cannot use (all of it when the shape does
// not fit the node at all, else the GPUs whose free share is below its per-GPU
// request), weighted by the shape's frequency. In milli-GPUs.
func nodeFragmentation(free []int64, cpuFree int64, shapes []shape) float64 {
	var total int64
	for _, f := range free {
		total += f
	}
	if total == 0 {
		return 0
	}
	var frag float64
	for _, s := range shapes {
		fits := 0
		var small int64
		for _, f := range free {
			if f >= s.milli {
				fits++
			} else {
				small += f
			}
		}
		if cpuFree < s.cpuMilli || fits < s.numGPU {
			frag += s.weight * float64(total)
		} else {
			frag += s.weight * float64(small)
		}
	}
	return frag
}

// fragmentationRatio is the cluster's fragmentation as a percentage of its free GPU
// capacity.
func fragmentationRatio(cl *cluster, snapshot *backendcache.Snapshot, led *ledger) float64 {
	var frag, free float64
	for _, n := range cl.nodes {
		g := led.free[n.Name]
		if len(g) == 0 {
			continue
		}
		ni, err := snapshot.Get(n.Name)
		if err != nil {
			continue
		}
		cpuFree := ni.GetAllocatable().GetMilliCPU() - ni.GetRequested().GetMilliCPU()
		frag += nodeFragmentation(g, cpuFree, cl.shapes)
		for _, f := range g {
			free += float64(f)
		}
	}
	if free == 0 {
		return 0
	}
	return 100 * frag / free
}

// curve is A(x) (allocated GPU capacity, %) for arrived load x = 0..maxX % of capacity,
// as the paper's analysis computes it: the mean over the cluster states whose arrived
// load rounds to x (or, if none, to x±1). NaN where the run has no such state.
func curve(points []point, totalMilli int64, maxX int) []float64 {
	sum := make([]float64, maxX+1)
	n := make([]int, maxX+1)
	for _, p := range points {
		x := int(math.Round(100 * float64(p.arrivedMilli) / float64(totalMilli)))
		if x < 0 || x > maxX {
			continue
		}
		sum[x] += 100 * float64(p.allocMilli) / float64(totalMilli)
		n[x]++
	}
	out := make([]float64, maxX+1)
	for x := range out {
		switch {
		case n[x] > 0:
			out[x] = sum[x] / float64(n[x])
		default:
			var s float64
			var k int
			for _, y := range []int{x - 1, x + 1} {
				if y >= 0 && y <= maxX && n[y] > 0 {
					s += sum[y]
					k += n[y]
				}
			}
			if k > 0 {
				out[x] = s / float64(k)
			} else {
				out[x] = math.NaN()
			}
		}
	}
	return out
}

func meanSD(v []float64) (mean, sd float64) {
	if len(v) == 0 {
		return math.NaN(), math.NaN()
	}
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	if len(v) < 2 {
		return mean, 0
	}
	for _, x := range v {
		sd += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(sd / float64(len(v)-1))
}

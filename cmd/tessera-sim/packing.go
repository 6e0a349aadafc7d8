// SPDX-License-Identifier: Apache-2.0

package main

import "fmt"

// packing is what the GPU fractions of one run's workload cost by themselves: the
// fractions that arrived by 100% of capacity, each GPU taken as a bin of 1000 milli,
// CPU, memory and node boundaries ignored. A GPU that holds a fraction takes no
// whole-GPU pod, so whatever a packing leaves free in such GPUs is capacity only other
// fractions can use. It puts U(100) in context; it is not a bound on it (a policy
// whose fractions fail leaves their demand unallocated instead).
type packing struct {
	fractions   int
	demandMilli int64
	lowerBins   int // no packing of these fractions uses fewer GPUs
	ffdBins     int // first fit decreasing: every fraction known in advance
	onlineBins  int // best fit in arrival order, over all GPUs at once
}

// packFractions packs the fractions among order's pods up to the one with which the
// arrived demand would pass capacityMilli.
func packFractions(order []*tracePod, capacityMilli int64) packing {
	var sizes []int
	var arrived int64
	for _, p := range order {
		if arrived+p.demandMilli() > capacityMilli {
			break
		}
		arrived += p.demandMilli()
		if p.numGPU == 1 && p.gpuMilli > 0 && p.gpuMilli < 1000 {
			sizes = append(sizes, int(p.gpuMilli))
		}
	}
	pk := packing{fractions: len(sizes)}
	for _, s := range sizes {
		pk.demandMilli += int64(s)
	}
	pk.lowerBins = lowerBoundBins(sizes)
	pk.ffdBins = firstFitDecreasing(sizes)
	pk.onlineBins = bestFitOnline(sizes)
	return pk
}

// wastePct is the capacity a packing into bins GPUs leaves in them, in % of capacity.
func (pk packing) wastePct(bins int, capacityMilli int64) float64 {
	return 100 * float64(int64(bins)*1000-pk.demandMilli) / float64(capacityMilli)
}

// lowerBoundBins is Martello and Toth's L2 lower bound on the bins of 1000 that sizes
// (1..999) need: for every k up to 500, the items above 1000-k each need a bin of
// their own, the items above 500 too, and the items from k to 500 need bins for what
// the second group's bins cannot hold.
func lowerBoundBins(sizes []int) int {
	const c = 1000
	var count [c + 1]int
	var sum int
	for _, s := range sizes {
		count[s]++
		sum += s
	}
	best := (sum + c - 1) / c
	for k := 0; k <= c/2; k++ {
		var n1, n2, sum2, sum3 int
		for s := 1; s < c; s++ {
			switch {
			case s > c-k:
				n1 += count[s]
			case s > c/2:
				n2 += count[s]
				sum2 += s * count[s]
			case s >= k:
				sum3 += s * count[s]
			}
		}
		l := n1 + n2
		if extra := sum3 - (n2*c - sum2); extra > 0 {
			l += (extra + c - 1) / c
		}
		best = max(best, l)
	}
	return best
}

// firstFitDecreasing packs sizes, largest first, each into the first bin it fits.
func firstFitDecreasing(sizes []int) int {
	var bySize [1000]int
	for _, s := range sizes {
		bySize[s]++
	}
	var free []int
	for s := 999; s >= 1; s-- {
		for n := 0; n < bySize[s]; n++ {
			placed := false
			for i, f := range free {
				if f >= s {
					free[i] -= s
					placed = true
					break
				}
			}
			if !placed {
				free = append(free, 1000-s)
			}
		}
	}
	return len(free)
}

// bestFitOnline packs sizes in their order, each into the bin it leaves the least
// room in (a new bin when none has room).
func bestFitOnline(sizes []int) int {
	var binsWithFree [1001]int // binsWithFree[f]: bins with f milli free
	bins := 0
	for _, s := range sizes {
		f := s
		for f <= 1000 && binsWithFree[f] == 0 {
			f++
		}
		if f > 1000 {
			bins++
			f = 1000
			binsWithFree[f]++
		}
		binsWithFree[f]--
		binsWithFree[f-s]++
	}
	return bins
}

// packingReport is the summary's paragraph on the fraction packing of the seeds' runs.
func packingReport(seeds []int64, pks []packing, capacityMilli int64) string {
	var lo, ffd, online []float64
	for _, pk := range pks {
		lo = append(lo, pk.wastePct(pk.lowerBins, capacityMilli))
		ffd = append(ffd, pk.wastePct(pk.ffdBins, capacityMilli))
		online = append(online, pk.wastePct(pk.onlineBins, capacityMilli))
	}
	ml, _ := meanSD(lo)
	mf, _ := meanSD(ffd)
	mo, sdo := meanSD(online)
	return fmt.Sprintf("Fractions alone (%d seeds; those arrived by 100%%, each GPU a bin, CPU, memory and nodes ignored), "+
		"capacity left in GPUs that hold fractions, %% of all capacity: at least %.2f (lower bound on any packing), "+
		"%.2f packed first fit decreasing (every pod known in advance), %.2f ± %.2f packed best fit in arrival order. "+
		"Context for U(100), not a bound on it.\n", len(seeds), ml, mf, mo, sdo)
}

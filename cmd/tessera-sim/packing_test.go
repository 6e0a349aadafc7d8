// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math/rand"
	"strings"
	"testing"
)

func TestPackingByHand(t *testing.T) {
	for _, tc := range []struct {
		sizes              []int
		lower, ffd, online int
	}{
		{sizes: nil},
		{sizes: []int{500, 500}, lower: 1, ffd: 1, online: 1},
		{sizes: []int{600, 600, 600}, lower: 3, ffd: 3, online: 3},
		{sizes: []int{400, 400, 400}, lower: 2, ffd: 2, online: 2},
		{sizes: []int{810, 190}, lower: 1, ffd: 1, online: 1},
		// 810 shares only with at most 190: the two 200s share a GPU of their own.
		{sizes: []int{810, 810, 200, 200}, lower: 3, ffd: 3, online: 3},
		// Best fit: the 300 goes into the 600's GPU (least room left), the 100 fills it.
		{sizes: []int{600, 300, 400, 100}, lower: 2, ffd: 2, online: 2},
		// Arrival order costs a GPU: the two 300s share, then each 700 needs its own.
		{sizes: []int{300, 300, 700, 700}, lower: 2, ffd: 2, online: 3},
	} {
		if got := lowerBoundBins(tc.sizes); got != tc.lower {
			t.Errorf("%v: lower bound %d, want %d", tc.sizes, got, tc.lower)
		}
		if got := firstFitDecreasing(tc.sizes); got != tc.ffd {
			t.Errorf("%v: first fit decreasing %d, want %d", tc.sizes, got, tc.ffd)
		}
		if got := bestFitOnline(tc.sizes); got != tc.online {
			t.Errorf("%v: best fit online %d, want %d", tc.sizes, got, tc.online)
		}
	}
}

// On small random instances the bound never exceeds the optimum (found by trying
// every packing), and the heuristics never beat it.
func TestPackingAgainstOptimum(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for trial := 0; trial < 300; trial++ {
		sizes := make([]int, 1+rng.Intn(8))
		for i := range sizes {
			sizes[i] = 1 + rng.Intn(999)
		}
		opt := optimumBins(sizes)
		lo, ffd, online := lowerBoundBins(sizes), firstFitDecreasing(sizes), bestFitOnline(sizes)
		if lo > opt || ffd < opt || online < opt {
			t.Fatalf("%v: optimum %d, lower bound %d, first fit decreasing %d, best fit online %d", sizes, opt, lo, ffd, online)
		}
	}
}

func optimumBins(sizes []int) int {
	best := len(sizes)
	var free []int
	var place func(i int)
	place = func(i int) {
		if len(free) >= best {
			return
		}
		if i == len(sizes) {
			best = len(free)
			return
		}
		for b := range free {
			if free[b] >= sizes[i] {
				free[b] -= sizes[i]
				place(i + 1)
				free[b] += sizes[i]
			}
		}
		free = append(free, 1000-sizes[i])
		place(i + 1)
		free = free[:len(free)-1]
	}
	place(0)
	return best
}

// packFractions takes the fractions among the pods that arrive before the demand
// would pass capacity; whole and multi-GPU pods count toward the demand only.
func TestPackFractionsPrefix(t *testing.T) {
	pods := []*tracePod{
		{numGPU: 1, gpuMilli: 600},
		{numGPU: 2, gpuMilli: 1000},
		{numGPU: 0, gpuMilli: 0},
		{numGPU: 1, gpuMilli: 1000},
		{numGPU: 1, gpuMilli: 300},
		{numGPU: 1, gpuMilli: 500}, // 600+2000+1000+300+500 > 4000: stops here
		{numGPU: 1, gpuMilli: 100},
	}
	pk := packFractions(pods, 4000)
	if pk.fractions != 2 || pk.demandMilli != 900 || pk.lowerBins != 1 || pk.ffdBins != 1 || pk.onlineBins != 1 {
		t.Fatalf("got %+v, want the 600 and the 300 in one GPU", pk)
	}
	if w := pk.wastePct(pk.onlineBins, 4000); w != 2.5 {
		t.Errorf("waste %.2f%% of capacity, want 2.50 (100 of 4000 milli)", w)
	}
	if r := packingReport([]int64{42}, []packing{pk}, 4000); !strings.Contains(r, "at least 2.50") {
		t.Errorf("report %q", r)
	}
}

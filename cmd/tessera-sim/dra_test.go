// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/dra"
)

// replayAll replays pods on nodes with each named policy in mode, seed 42, no
// inflation beyond the list, and returns the runs by policy.
func replayAll(t *testing.T, mode string, nodes []traceNode, pods []tracePod, pols ...string) map[string]*runResult {
	t.Helper()
	cfg, err := loadConfig("../../config/scheduler/tessera-scheduler.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := newCluster(nodes, pods, mode)
	if err != nil {
		t.Fatal(err)
	}
	var demand int64
	for _, p := range pods {
		demand += p.demandMilli()
	}
	out := map[string]*runResult{}
	for _, name := range pols {
		pol, err := findPolicy(name)
		if err != nil {
			t.Fatal(err)
		}
		ctx := klog.NewContext(context.Background(), klog.Background())
		// Inflated to the list's demand and cut at its length: the list itself, shuffled.
		res, err := replayOnce(ctx, cl, pol, cfg, 42, float64(demand)/float64(cl.totalGPU), 1, len(pods), nil)
		if err != nil {
			t.Fatalf("%s, %s: %v", mode, name, err)
		}
		if res.podsTotal != len(pods) {
			t.Fatalf("%s, %s: %d pods replayed, want the list's %d", mode, name, res.podsTotal, len(pods))
		}
		out[name] = res
	}
	return out
}

func sortedFree(led *ledger, node string) []int64 {
	f := slices.Clone(led.free[node])
	slices.Sort(f)
	return f
}

// In DRA mode the claims are placed on GPUs by the profile's device policy
// (TesseraDynamicResources), and by the in-tree allocator's first fit with
// first-fit: two 30 % claims on a node of two GPUs share one GPU under binpack and
// first fit, and take one each under spread, as the device-plugin mode places them.
func TestReplayDRADevicePolicy(t *testing.T) {
	nodes := []traceNode{{name: "n0", cpuMilli: 64000, memoryMiB: 262144, gpus: 2, model: "T4"}}
	pods := []tracePod{
		{name: "a", cpuMilli: 1000, memoryMiB: 1024, numGPU: 1, gpuMilli: 300},
		{name: "b", cpuMilli: 1000, memoryMiB: 1024, numGPU: 1, gpuMilli: 300},
	}
	want := map[string][]int64{"binpack": {400, 1000}, "first-fit": {400, 1000}, "spread": {700, 700}}
	dra := replayAll(t, modeDRA, nodes, pods, "binpack", "spread", "first-fit")
	dp := replayAll(t, modeDevicePlugin, nodes, pods, "binpack", "spread")
	for name, w := range want {
		r := dra[name]
		if r.scheduled != 2 || !slices.Equal(sortedFree(r.ledger, "n0"), w) {
			t.Errorf("DRA %s: %d scheduled, GPUs free %v, want 2 and %v", name, r.scheduled, r.ledger.free["n0"], w)
		}
		if r := dp[name]; r != nil && !slices.Equal(sortedFree(r.ledger, "n0"), w) {
			t.Errorf("device plugin %s: GPUs free %v, want %v", name, r.ledger.free["n0"], w)
		}
	}
}

// A claim holds exactly what its trace pod asks (the replay checks each allocation's
// consumed cores and the claims' total against the bound pods), whole GPUs and
// several of them included; gpu_spec becomes a model selector; what fits nowhere is
// refused, not bound. The same pods fit in both modes (which GPUs they take may
// differ: a claim asks memory in bytes, a share of the smallest GPU it accepts, so the
// policies weigh memory differently on larger GPUs; B1 measures what that costs).
func TestReplayDRAShapes(t *testing.T) {
	nodes := []traceNode{
		{name: "t4", cpuMilli: 64000, memoryMiB: 262144, gpus: 2, model: "T4"},
		{name: "v100", cpuMilli: 96000, memoryMiB: 786432, gpus: 8, model: "V100M32"},
		{name: "a10", cpuMilli: 32000, memoryMiB: 131072, gpus: 1, model: "A10"},
	}
	pods := []tracePod{
		{name: "frac-a10", cpuMilli: 1000, memoryMiB: 1024, numGPU: 1, gpuMilli: 400, gpuSpec: []string{"A10"}},
		{name: "whole-4", cpuMilli: 8000, memoryMiB: 65536, numGPU: 4, gpuMilli: 1000},
		{name: "whole-1", cpuMilli: 4000, memoryMiB: 16384, numGPU: 1, gpuMilli: 1000},
		{name: "frac-50", cpuMilli: 1000, memoryMiB: 1024, numGPU: 1, gpuMilli: 500},
		{name: "frac-50b", cpuMilli: 1000, memoryMiB: 1024, numGPU: 1, gpuMilli: 500},
		{name: "frac-5", cpuMilli: 500, memoryMiB: 512, numGPU: 1, gpuMilli: 50},
		{name: "cpu", cpuMilli: 2000, memoryMiB: 2048},
		// A10 alone has 1 GPU, 40 % of it taken: 70 % fits nowhere.
		{name: "frac-a10-big", cpuMilli: 1000, memoryMiB: 1024, numGPU: 1, gpuMilli: 700, gpuSpec: []string{"A10"}},
	}
	for _, mode := range []string{modeDRA, modeDevicePlugin} {
		pols := []string{"binpack", "spread", "fragmentation"}
		if mode == modeDRA {
			pols = append(pols, "first-fit")
		}
		for name, r := range replayAll(t, mode, nodes, pods, pols...) {
			if r.scheduled != len(pods)-1 || r.failed != 1 {
				t.Errorf("%s %s: %d scheduled, %d failed; want %d and 1", mode, name, r.scheduled, r.failed, len(pods)-1)
			}
			unplaced := 0
			for _, pl := range r.placements {
				if strings.HasSuffix(pl, " -") {
					unplaced++
				}
			}
			if len(r.placements) != len(pods) || unplaced != 1 {
				t.Errorf("%s %s: placements %q, want one line per pod, one of them unplaced", mode, name, r.placements)
			}
			if a10 := r.ledger.free["a10"]; a10[0] > 600 {
				t.Errorf("%s %s: the A10 has %d milli free, want at most 600 (the gpu_spec pod on it)", mode, name, a10[0])
			}
		}
	}
}

func TestReplayDRAPolicies(t *testing.T) {
	for _, p := range policies {
		if p.appliesTo(modeDRA) != (p.score == "") {
			t.Errorf("policy %s: applies to DRA mode %v; only policies that score with the profile's plugins do", p.name, p.appliesTo(modeDRA))
		}
	}
	err := run("", "", "", "bestfit", "42", 1.3, t.TempDir(), "", 1, 0, progressOptions{}, workloadOptions{mode: modeDRA})
	if err == nil || !strings.Contains(err.Error(), "policy bestfit does not apply in dra mode") {
		t.Errorf("bestfit in DRA mode: %v", err)
	}
}

// -gpu-memory mib: a device-plugin share asks gpu-memory in MiB exactly what the
// ResourceClaim of the same trace pod asks, so the two modes can be compared with the
// same requests.
func TestMemoryMiBAsksAsClaims(t *testing.T) {
	nodes := []traceNode{
		{name: "t4", cpuMilli: 64000, memoryMiB: 262144, gpus: 2, model: "T4"},
		{name: "v100", cpuMilli: 96000, memoryMiB: 786432, gpus: 8, model: "V100M32"},
	}
	pods := []tracePod{
		{name: "any-50", numGPU: 1, gpuMilli: 500},
		{name: "v100-30", numGPU: 1, gpuMilli: 300, gpuSpec: []string{"V100M32"}},
		{name: "whole", numGPU: 2, gpuMilli: 1000},
	}
	cl, err := newCluster(nodes, pods, modeDevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	table, err := newMemoryTable(cl.nodes)
	if err != nil {
		t.Fatal(err)
	}
	w, err := newDRAWorld(context.Background(), cl.nodes)
	if err != nil {
		t.Fatal(err)
	}
	names := api.DefaultResourceNames()
	for i := range pods {
		tp := &pods[i]
		pod := podObject(tp, tp.name, i)
		askMemoryMiB(pod, tp, &table)
		limits := pod.Spec.Containers[0].Resources.Limits
		if _, ok := limits[names.GPUMemoryPercent]; ok {
			t.Errorf("%s still asks gpu-memory-percent", tp.name)
		}
		got, asked := limits[names.GPUMemory]
		req := w.draClaim(tp, tp.name).Spec.Devices.Requests[0].Exactly
		if req.Capacity == nil {
			if asked {
				t.Errorf("%s (whole GPUs) asks gpu-memory %s", tp.name, got.String())
			}
			continue
		}
		want := req.Capacity.Requests[dra.CapacityMemory]
		if got.Value()<<20 != want.Value() {
			t.Errorf("%s asks gpu-memory %d MiB, its claim %d bytes", tp.name, got.Value(), want.Value())
		}
	}
	// The T4's memory bounds a share that may land on it; one that names the V100
	// asks its share of a V100.
	if got := table.shareMiB(&pods[0], 50); got != modelMemoryMiB["T4"]/2 {
		t.Errorf("a 50 %% share of any GPU asks %d MiB, want half the T4's %d", got, modelMemoryMiB["T4"])
	}
	if got := table.shareMiB(&pods[1], 30); got != modelMemoryMiB["V100M32"]*30/100 {
		t.Errorf("a 30 %% share of a V100M32 asks %d MiB, want 30 %% of %d", got, modelMemoryMiB["V100M32"])
	}
}

// With the same requests (device-plugin shares asking gpu-memory in MiB, as claims
// do), the DRA path places every pod on the node the device-plugin path places it
// on, under binpack and spread: TesseraDynamicResources scores nodes with
// TesseraGPUShare's measure, weights and topology terms. (Its NVLink-island term was
// missing once: one-GPU pods went to empty 8-GPU V100 nodes that the device-plugin
// path scores a point lower, and the full replays parted at the 90th pod.)
func TestDRAPlacesAsDevicePlugin(t *testing.T) {
	var nodes []traceNode
	add := func(n int, model string, gpus int, cpu int64) {
		for i := 0; i < n; i++ {
			nodes = append(nodes, traceNode{name: fmt.Sprintf("%s-%d-%d", strings.ToLower(model), gpus, i), cpuMilli: cpu, memoryMiB: 393216, gpus: gpus, model: model})
		}
	}
	add(3, "V100M16", 8, 64000) // two NVLink islands of four
	add(2, "V100M32", 4, 48000) // one NVLink island
	add(4, "P100", 2, 64000)
	add(3, "T4", 2, 104000)
	// A mix of the trace's shapes, in an order the seeded shuffle changes: fractions of
	// one GPU (some bound to a model), whole GPUs 1-8, and CPU-only pods.
	var pods []tracePod
	for i := 0; i < 150; i++ {
		p := tracePod{name: fmt.Sprintf("p%03d", i), cpuMilli: int64(2000 + (i*3700)%30000), memoryMiB: 8192}
		switch i % 10 {
		case 0, 1, 2, 3:
			p.numGPU, p.gpuMilli = 1, int64(100+(i*170)%800)
		case 4:
			p.numGPU, p.gpuMilli, p.gpuSpec = 1, 500, []string{"V100M16", "V100M32"}
		case 5, 6:
			p.numGPU, p.gpuMilli = 1, 1000
		case 7:
			p.numGPU, p.gpuMilli = []int{2, 4, 8}[(i/10)%3], 1000
		case 8:
			p.numGPU, p.gpuMilli, p.gpuSpec = 1, 250, []string{"T4"}
		}
		pods = append(pods, p)
	}
	cfg, err := loadConfig("../../config/scheduler/tessera-scheduler.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var demand, gpus int64
	for _, p := range pods {
		demand += p.demandMilli()
	}
	for _, n := range nodes {
		gpus += int64(n.gpus) * 1000
	}
	for _, name := range []string{"binpack", "spread"} {
		pol, err := findPolicy(name)
		if err != nil {
			t.Fatal(err)
		}
		var runs [2][]string
		for i, mode := range []string{modeDevicePlugin, modeDRA} {
			cl, err := newCluster(nodes, pods, mode)
			if err != nil {
				t.Fatal(err)
			}
			if mode == modeDevicePlugin {
				table, err := newMemoryTable(cl.nodes)
				if err != nil {
					t.Fatal(err)
				}
				cl.memoryMiB = &table
			}
			ctx := klog.NewContext(context.Background(), klog.Background())
			res, err := replayOnce(ctx, cl, pol, cfg, 42, float64(demand)/float64(gpus), 1, len(pods), nil)
			if err != nil {
				t.Fatalf("%s, %s: %v", mode, name, err)
			}
			runs[i] = res.placements
		}
		placed := 0
		for i := range runs[0] {
			if !strings.HasSuffix(runs[0][i], " -") {
				placed++
			}
			if i >= len(runs[1]) || runs[0][i] != runs[1][i] {
				got := "nothing"
				if i < len(runs[1]) {
					got = runs[1][i]
				}
				t.Fatalf("%s: pod %d placed %q in device-plugin mode, %q in DRA mode", name, i, runs[0][i], got)
			}
		}
		if placed < 40 {
			t.Errorf("%s: %d of %d pods placed: the comparison says little", name, placed, len(pods))
		}
	}
}

// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// traceDir holds the openb node and pod lists; the tests that need them skip without.
const traceDir = "../../../shared/data/alibaba-gpu-v2023"

// syntheticList is a small pod list with every class and a node list for it.
func syntheticList() ([]map[string]string, []traceNode) {
	var rows []map[string]string
	add := func(n int, cpu, gpus, milli int) {
		for i := 0; i < n; i++ {
			rows = append(rows, map[string]string{
				"name": fmt.Sprintf("p-%04d", len(rows)), "cpu_milli": fmt.Sprint(cpu), "memory_mib": "1024",
				"num_gpu": fmt.Sprint(gpus), "gpu_milli": fmt.Sprint(milli), "gpu_spec": "", "qos": "LS",
				"pod_phase": "Running", "creation_time": fmt.Sprint(i), "deletion_time": "", "scheduled_time": "",
			})
		}
	}
	add(150, 4000, 0, 0)
	add(300, 2000, 1, 470)
	add(100, 2000, 1, 810)
	add(600, 8000, 1, 1000)
	add(20, 16000, 2, 1000)
	add(10, 32000, 4, 1000)
	add(10, 64000, 8, 1000)
	nodes := []traceNode{
		{name: "a", cpuMilli: 96000, memoryMiB: 1 << 20, gpus: 8, model: "G2"},
		{name: "b", cpuMilli: 96000, memoryMiB: 1 << 20, gpus: 8, model: "V100M32"},
		{name: "c", cpuMilli: 96000, memoryMiB: 1 << 20, gpus: 8, model: "V100M16"},
		{name: "d", cpuMilli: 96000, memoryMiB: 1 << 20, gpus: 4, model: "T4"},
		{name: "e", cpuMilli: 64000, memoryMiB: 1 << 20, gpus: 2, model: "P100"},
		{name: "f", cpuMilli: 64000, memoryMiB: 1 << 20, gpus: 8, model: "G3"},
	}
	return rows, nodes
}

// lists are the pod lists the variety tests run on: the synthetic one always, the
// openb default list when it is there.
func lists(t *testing.T) map[string]func() ([]map[string]string, []traceNode) {
	t.Helper()
	out := map[string]func() ([]map[string]string, []traceNode){"synthetic": syntheticList}
	podsPath := filepath.Join(traceDir, "openb_pod_list_default.csv")
	nodesPath := filepath.Join(traceDir, "openb_node_list_gpu_node.csv")
	if _, err := os.Stat(podsPath); err != nil {
		t.Logf("openb trace not found (%v): synthetic list only", err)
		return out
	}
	out["openb-default"] = func() ([]map[string]string, []traceNode) {
		rows, err := readCSV(podsPath)
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := readNodes(nodesPath)
		if err != nil {
			t.Fatal(err)
		}
		return rows, nodes
	}
	return out
}

// mix is what a pod list is made of, in the terms the varieties are defined in.
type mix struct {
	pods, gpuPods, cpuPods, specPods int
	demand, shareDemand, multiDemand int64
}

func mixOf(pods []tracePod) mix {
	var m mix
	m.pods = len(pods)
	for i := range pods {
		p := &pods[i]
		if p.numGPU == 0 {
			m.cpuPods++
			continue
		}
		m.gpuPods++
		m.demand += p.demandMilli()
		if p.numGPU > 1 {
			m.multiDemand += p.demandMilli()
		} else if p.gpuMilli < 1000 {
			m.shareDemand += p.demandMilli()
		}
		if len(p.gpuSpec) > 0 {
			m.specPods++
		}
	}
	return m
}

func pct(a, b int64) float64 { return 100 * float64(a) / float64(b) }

// Each variety has the proportion its name says (within one point), keeps the openb
// columns and parses with the reader; the ones that only add a constraint or draw one
// class keep the rest of the list as it was.
func TestVarietyProportions(t *testing.T) {
	for listName, load := range lists(t) {
		rows, nodes := load()
		base, err := parsePods(rows, listName)
		if err != nil {
			t.Fatal(err)
		}
		b := mixOf(base)
		for _, name := range []string{"gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
			"multigpu20", "multigpu30", "multigpu40", "multigpu50",
			"gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100",
			"cpu050", "cpu100", "cpu200", "cpu250"} {
			t.Run(listName+"/"+name, func(t *testing.T) {
				v, err := parseVariety(name)
				if err != nil {
					t.Fatal(err)
				}
				out, err := applyVariety(rows, nodes, v, 1)
				if err != nil {
					t.Fatal(err)
				}
				// Written and read back, the list is the one replayed.
				path := filepath.Join(t.TempDir(), name+".csv")
				if err := writePodCSV(path, out); err != nil {
					t.Fatal(err)
				}
				head, _ := os.ReadFile(path)
				if !strings.HasPrefix(string(head), strings.Join(openbPodColumns, ",")+"\n") {
					t.Fatalf("header %q", strings.SplitN(string(head), "\n", 2)[0])
				}
				pods, err := readPods(path)
				if err != nil {
					t.Fatal(err)
				}
				direct, err := parsePods(out, name)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(pods, direct) {
					t.Fatal("the written list reads back differently")
				}
				m := mixOf(pods)
				var got float64
				switch v.kind {
				case "gpuspec":
					got = pct(int64(m.specPods), int64(m.gpuPods))
					if m.pods != b.pods || m.demand != b.demand {
						t.Errorf("gpuspec changed the pods: %d pods, %d milli-GPU; the list has %d, %d", m.pods, m.demand, b.pods, b.demand)
					}
					checkSpecs(t, pods, nodes)
				case "multigpu":
					got = pct(m.multiDemand, m.demand)
					if m.cpuPods != b.cpuPods || m.gpuPods != b.gpuPods {
						t.Errorf("%d CPU-only and %d GPU pods; the list has %d and %d", m.cpuPods, m.gpuPods, b.cpuPods, b.gpuPods)
					}
				case "gpushare":
					got = pct(m.shareDemand, m.demand)
					if m.cpuPods != b.cpuPods || m.gpuPods != b.gpuPods {
						t.Errorf("%d CPU-only and %d GPU pods; the list has %d and %d", m.cpuPods, m.gpuPods, b.cpuPods, b.gpuPods)
					}
				case "cpu":
					got = pct(int64(m.cpuPods), int64(m.pods))
					if m.gpuPods != b.gpuPods || m.demand != b.demand {
						t.Errorf("cpu changed the GPU pods: %d pods, %d milli-GPU; the list has %d, %d", m.gpuPods, m.demand, b.gpuPods, b.demand)
					}
				}
				if math.Abs(got-v.percent) > 1 {
					t.Errorf("%s: proportion %.2f%%, want %.0f%% ± 1", name, got, v.percent)
				}
				if v.kind != "gpuspec" {
					seen := map[string]bool{}
					for _, p := range pods {
						if seen[p.name] {
							t.Fatalf("pod name %s twice", p.name)
						}
						seen[p.name] = true
					}
				}
			})
		}
	}
}

// checkSpecs: every required model set names models of the cluster, and a node of one
// of them has the GPUs the pod asks.
func checkSpecs(t *testing.T, pods []tracePod, nodes []traceNode) {
	t.Helper()
	maxGPUs := map[string]int{}
	for _, n := range nodes {
		maxGPUs[n.model] = max(maxGPUs[n.model], n.gpus)
	}
	for _, p := range pods {
		if len(p.gpuSpec) == 0 {
			continue
		}
		served := false
		for _, m := range p.gpuSpec {
			g, ok := maxGPUs[m]
			if !ok {
				t.Fatalf("%s requires %s, which the cluster does not have", p.name, m)
			}
			served = served || g >= p.numGPU
		}
		if !served {
			t.Fatalf("%s asks %d GPUs of %v: no such node", p.name, p.numGPU, p.gpuSpec)
		}
	}
}

// The model sets of a gpuspec variety follow specChoices' weights: on gpuspec33 of
// the openb default list (about 2,300 constrained pods, nearly all of one GPU, which
// every set serves), each set's share of the constrained pods is within 3 points of
// its weight's share.
func TestGPUSpecFollowsWeights(t *testing.T) {
	load, ok := lists(t)["openb-default"]
	if !ok {
		t.Skip("openb trace not found")
	}
	rows, nodes := load()
	v, _ := parseVariety("gpuspec33")
	out, err := applyVariety(rows, nodes, v, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	n := 0
	for _, r := range out {
		if r["gpu_spec"] != "" && r["num_gpu"] == "1" {
			got[r["gpu_spec"]]++
			n++
		}
	}
	total := 0
	for _, c := range specChoices {
		total += c.weight
	}
	for _, c := range specChoices {
		want := 100 * float64(c.weight) / float64(total)
		share := 100 * float64(got[strings.Join(c.models, "|")]) / float64(n)
		if math.Abs(share-want) > 3 {
			t.Errorf("%v: %.1f%% of %d one-GPU constrained pods, weight share %.1f%%", c.models, share, n, want)
		}
	}
}

// The same seed gives the same list; another seed another one; the default variety is
// the list itself.
func TestVarietyDeterministic(t *testing.T) {
	rows, nodes := syntheticList()
	for _, name := range []string{"gpuspec33", "multigpu50", "gpushare40", "cpu200"} {
		v, _ := parseVariety(name)
		a, err := applyVariety(rows, nodes, v, 7)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := applyVariety(rows, nodes, v, 7)
		c, _ := applyVariety(rows, nodes, v, 8)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: two lists for seed 7", name)
		}
		if reflect.DeepEqual(a, c) {
			t.Errorf("%s: seeds 7 and 8 give the same list", name)
		}
	}
	snapshot := fmt.Sprint(rows)
	for _, name := range []string{"", "default"} {
		v, err := parseVariety(name)
		if err != nil {
			t.Fatal(err)
		}
		out, err := applyVariety(rows, nodes, v, 7)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(out, rows) {
			t.Errorf("%q: the default variety changed the list", name)
		}
	}
	if fmt.Sprint(rows) != snapshot {
		t.Error("a variety modified the rows it was built from")
	}
}

// On the openb default list, the default variety replays exactly the pods readPods
// reads, and written out it is the file byte for byte.
func TestVarietyDefaultIsTheTrace(t *testing.T) {
	podsPath := filepath.Join(traceDir, "openb_pod_list_default.csv")
	want, err := os.ReadFile(podsPath)
	if err != nil {
		t.Skipf("openb trace not found: %v", err)
	}
	nodes, err := readNodes(filepath.Join(traceDir, "openb_node_list_gpu_node.csv"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "default.csv")
	got, err := loadWorkload(podsPath, nodes, workloadOptions{variety: variety{kind: "default", name: "default"}, seed: 1, out: out})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := readPods(podsPath)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, direct) {
		t.Error("the default variety's pods differ from the trace's")
	}
	written, _ := os.ReadFile(out)
	if string(written) != string(want) {
		t.Error("the default variety written out differs from the trace file")
	}
}

func TestParseVariety(t *testing.T) {
	for s, want := range map[string]variety{
		"":            {kind: "default", name: "default"},
		"default":     {kind: "default", name: "default"},
		"gpuspec33":   {kind: "gpuspec", name: "gpuspec33", percent: 33},
		"multigpu50":  {kind: "multigpu", name: "multigpu50", percent: 50},
		"gpushare100": {kind: "gpushare", name: "gpushare100", percent: 100},
		"cpu050":      {kind: "cpu", name: "cpu050", percent: 5},
		"cpu250":      {kind: "cpu", name: "cpu250", percent: 25},
	} {
		got, err := parseVariety(s)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", s, got, err, want)
		}
	}
	for _, s := range []string{"gpuspec", "gpuspec101", "cpu50", "cpu1000", "multigpu-5", "spread", "gpushareX"} {
		if _, err := parseVariety(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}

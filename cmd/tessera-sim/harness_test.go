// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeCSV(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "list.csv")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const podHeader = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"

func TestReadPods(t *testing.T) {
	pods, err := readPods(writeCSV(t, podHeader+
		"a,12000,16384,1,1000,,LS,Running,0,1,0\n"+
		"b,6000,12288,1,460,V100M16|V100M32,LS,Running,0,1,0\n"+
		",8000,0,0,0,,BE,Running,0,1,0\n"+
		"d,4000,1024,8,1000,,LS,Running,0,1,0\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []tracePod{
		{name: "a", cpuMilli: 12000, memoryMiB: 16384, numGPU: 1, gpuMilli: 1000},
		{name: "b", cpuMilli: 6000, memoryMiB: 12288, numGPU: 1, gpuMilli: 460, gpuSpec: []string{"V100M16", "V100M32"}},
		{name: "pod-00002", cpuMilli: 8000},
		{name: "d", cpuMilli: 4000, memoryMiB: 1024, numGPU: 8, gpuMilli: 1000},
	}
	if !reflect.DeepEqual(pods, want) {
		t.Fatalf("got %+v\nwant %+v", pods, want)
	}
	if k := []string{pods[0].kind(), pods[1].kind(), pods[2].kind(), pods[3].kind()}; !reflect.DeepEqual(k, []string{"1gpu", "fraction", "cpu", "8gpu"}) {
		t.Errorf("kinds %v", k)
	}
}

// A bad row is an error naming the file, the line and what to change; nothing panics.
func TestReadPodsRejectsBadRows(t *testing.T) {
	for _, tc := range []struct{ row, want string }{
		{"a,12000,16384,1,0,,LS,Running,0,1,0", ":2: gpu_milli 0 out of range 1..1000"},
		{"a,12000,16384,1,1200,,LS,Running,0,1,0", ":2: gpu_milli 1200 out of range"},
		{"a,12000,16384,2,500,,LS,Running,0,1,0", ":2: 2 GPUs of 500 milli each"},
		{"a,twelve,16384,1,500,,LS,Running,0,1,0", ":2: column cpu_milli"},
		{`a,"12000,16384`, ":2:"},
	} {
		_, err := readPods(writeCSV(t, podHeader+tc.row+"\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.row, err, tc.want)
		}
	}
	if _, err := readPods(writeCSV(t, "name,cpu_milli,memory_mib,num_gpu\na,1,1,1\n")); err == nil || !strings.Contains(err.Error(), `no column "gpu_milli"`) {
		t.Errorf("missing column: %v", err)
	}
	if _, err := readPods(writeCSV(t, "")); err == nil || !strings.Contains(err.Error(), "reading header") {
		t.Errorf("empty file: %v", err)
	}
}

func TestReadNodes(t *testing.T) {
	const header = "sn,cpu_milli,memory_mib,gpu,model\n"
	nodes, err := readNodes(writeCSV(t, header+"n0,64000,262144,2,P100\nn1,96000,786432,0,\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[0].gpus != 2 || nodes[0].model != "P100" || nodes[1].gpus != 0 {
		t.Fatalf("got %+v", nodes)
	}
	if _, err := readNodes(writeCSV(t, header+"n0,64000,262144,2,H800\n")); err == nil || !strings.Contains(err.Error(), `GPU model "H800" has no memory size`) {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := readNodes(writeCSV(t, header+",64000,262144,2,P100\n")); err == nil || !strings.Contains(err.Error(), ":2: empty sn") {
		t.Errorf("no name: %v", err)
	}
}

// The FGD protocol: the list shuffled (by seed), then pods drawn with replacement
// while the demand stays within inflation × capacity.
func TestWorkloadFollowsFGDProtocol(t *testing.T) {
	var pods []tracePod
	for i := 0; i < 50; i++ {
		pods = append(pods, tracePod{name: string(rune('a'+i%26)) + string(rune('a'+i/26)), numGPU: 1 + i%2, gpuMilli: 1000})
		if i%5 == 0 {
			pods[i].numGPU, pods[i].gpuMilli = 1, int64(100+10*i)
		}
	}
	const capacity = 100_000
	order := func(seed int64) []*tracePod { return workload(pods, rand.New(rand.NewSource(seed)), 1.3, capacity) }
	a, b, c := order(42), order(42), order(43)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two orders")
	}
	if reflect.DeepEqual(a[:len(pods)], c[:len(pods)]) {
		t.Error("two seeds gave the same shuffle")
	}
	seen := map[*tracePod]bool{}
	for _, p := range a[:len(pods)] {
		seen[p] = true
	}
	if len(seen) != len(pods) {
		t.Errorf("the first %d pods are not the whole list once: %d distinct", len(pods), len(seen))
	}
	var demand int64
	for _, p := range a {
		demand += p.demandMilli()
	}
	if demand > 130_000 || demand < 128_000 {
		t.Errorf("demand %d milli, want just under 130%% of %d", demand, capacity)
	}
}

func TestNodeFragmentation(t *testing.T) {
	shapes := []shape{
		{cpuMilli: 1000, numGPU: 1, milli: 500, weight: 0.5},
		{cpuMilli: 1000, numGPU: 2, milli: 1000, weight: 0.25},
		{cpuMilli: 64000, numGPU: 1, milli: 100, weight: 0.25},
	}
	// Free 1000 and 300 milli, 8 CPUs: the half-GPU shape cannot use the 300 (150),
	// the two-GPU shape nothing (325), the CPU-hungry shape nothing (325).
	if got := nodeFragmentation([]int64{1000, 300}, 8000, shapes); got != 800 {
		t.Errorf("fragmentation %.1f, want 800", got)
	}
	if got := nodeFragmentation([]int64{0, 0}, 8000, shapes); got != 0 {
		t.Errorf("a full node: %.1f, want 0", got)
	}
}

func TestCurve(t *testing.T) {
	const total = 1000
	pts := []point{{arrivedMilli: 100, allocMilli: 100}, {arrivedMilli: 104, allocMilli: 90}, {arrivedMilli: 300, allocMilli: 250}}
	a := curve(pts, total, 40)
	if a[10] != 9.5 {
		t.Errorf("A(10) = %v, want the mean of the two states at 10%%: 9.5", a[10])
	}
	if a[11] != 9.5 || a[29] != 25 {
		t.Errorf("A(11) = %v, A(29) = %v: want the neighbours' 9.5 and 25", a[11], a[29])
	}
	if !math.IsNaN(a[20]) {
		t.Errorf("A(20) = %v, want NaN (no state near 20%%)", a[20])
	}
}

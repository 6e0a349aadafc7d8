// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
)

// withCPU gives a test node allocatable CPU (millicores).
func withCPU(n *v1.Node, milli int64) *v1.Node {
	n.Status.Allocatable = v1.ResourceList{v1.ResourceCPU: *resource.NewMilliQuantity(milli, resource.DecimalSI)}
	return n
}

// Binpack is best fit over free GPUs and CPU, measured against the largest feasible
// node: score = 100 × (1 − ½·cpuLeft/cpuMax − ½·gpuLeft/gpuMax).
func TestBestFit(t *testing.T) {
	// A fraction on an empty 4-GPU node leaves 3.9 GPUs; on an empty 8-GPU node 7.9.
	// Both have 64 cores: 100 × (1 − ½ − ½·3.9/8) = 25.6 → 26; 100 × (1 − ½ − ½·7.9/8) = 0.6 → 1.
	small := withCPU(makeNode(t, "small", pcieInventory("small", 4, "Tesla T4", t4Mem)), 64000)
	big := withCPU(makeNode(t, "big", pcieInventory("big", 8, "Tesla T4", t4Mem)), 64000)
	r := newEnv(t, &TesseraGPUShareArgs{NodePolicy: Binpack}, []*v1.Node{small, big}).
		cycle(makePod("p", nil, ctr{Name: "c", GPU: "1", Pct: "10", Cores: "10"}))
	if r.scores["small"] != 26 || r.scores["big"] != 1 || r.best != "small" {
		t.Errorf("scores %v, want small 26, big 1", r.scores)
	}

	// CPU counts as much as GPUs: with equal GPUs the node with less CPU left wins.
	lean := withCPU(makeNode(t, "lean", pcieInventory("lean", 4, "Tesla T4", t4Mem)), 16000)
	fat := withCPU(makeNode(t, "fat", pcieInventory("fat", 4, "Tesla T4", t4Mem)), 128000)
	r = newEnv(t, &TesseraGPUShareArgs{NodePolicy: Binpack}, []*v1.Node{lean, fat}).
		cycle(makePod("p", nil, ctr{Name: "c", GPU: "1", Pct: "10", Cores: "10"}))
	if r.best != "lean" {
		t.Errorf("scores %v, want lean first", r.scores)
	}

	// A pod without GPUs goes where the GPUs are taken: there it strands none.
	full := withCPU(makeNode(t, "full", pcieInventory("full", 2, "Tesla T4", t4Mem)), 64000)
	free := withCPU(makeNode(t, "free", pcieInventory("free", 2, "Tesla T4", t4Mem)), 64000)
	e := newEnv(t, &TesseraGPUShareArgs{NodePolicy: Binpack}, []*v1.Node{full, free},
		bindPod(t, makePod("w", nil, ctr{Name: "c", GPU: "2"}), "full", oneGrant("full", t4Mem, 100, 0, 1)))
	cpu := makePod("cpu", nil)
	cpu.Spec.Containers = []v1.Container{{Name: "c", Image: "x"}}
	scores := e.scoreCPUPod(cpu)
	// full: 100 × (1 − ½·1 − 0) = 50; free: 100 × (1 − ½ − ½·2/2) = 0.
	if scores["full"] != 50 || scores["free"] != 0 {
		t.Errorf("CPU-only pod scores %v, want full 50, free 0", scores)
	}
}

// PreScore measures the largest feasible node in parallel chunks when there are many;
// the result must be the maximum over all of them, wherever it lies.
func TestLargestNodeOverManyNodes(t *testing.T) {
	const n = 3*largestNodeChunk + 7
	for _, big := range []int{0, largestNodeChunk - 1, largestNodeChunk, n - 1} {
		nodes := make([]*v1.Node, n)
		for i := range nodes {
			gpus, cpu := 2, "64"
			if i == big {
				gpus = 8
			}
			if i == (big+largestNodeChunk+1)%n {
				cpu = "256"
			}
			name := fmt.Sprintf("n%03d", i)
			nodes[i] = makeNode(t, name, nvlinkInventory(name, gpus, 2, "NVIDIA H100 80GB HBM3", 81559))
			nodes[i].Status.Allocatable = v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu)}
		}
		e := newEnv(t, nil, nodes)
		pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Pct: "20", Cores: "20"})
		pod.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}
		f, cs := preScored(t, e, pod)
		if f == nil || f.GPUs != 8 || f.CPUMilli != 256000 || f.PodCPUMilli != 2000 {
			t.Errorf("largest node with the 8-GPU node at %d: %+v, want 8 GPUs, 256000 mCPU, pod 2000 mCPU", big, f)
		}
		s, _ := getState(cs)
		cpu, gpus := e.pl.largestOf(s, e.infos, 0)
		if cpu != f.CPUMilli || gpus != f.GPUs {
			t.Errorf("parallel %v/%v, serial %v/%v", f.CPUMilli, f.GPUs, cpu, gpus)
		}
	}
}

// The largest node is found where it is even when a larger one has left: the bound
// PreScore stops at only ever grows, so it then looks at every node.
func TestLargestNodeAfterTheLargestShrank(t *testing.T) {
	var nodes []*v1.Node
	for i := 0; i < 2*largestNodeChunk+3; i++ {
		name := fmt.Sprintf("n%03d", i)
		gpus := 2
		if i == 5 {
			gpus = 8
		}
		if i == 2*largestNodeChunk+1 {
			gpus = 4
		}
		nodes = append(nodes, makeNode(t, name, nvlinkInventory(name, gpus, 2, "NVIDIA H100 80GB HBM3", 81559)))
	}
	e := newEnv(t, nil, nodes)
	// n005 loses six GPUs: the largest is now n257's four.
	shrunk := makeNode(t, "n005", nvlinkInventory("n005", 2, 2, "NVIDIA H100 80GB HBM3", 81559))
	e.pl.cache.SetInventory("n005", shrunk.Annotations[api.AnnotationInventory])
	e.infos[5].SetNode(shrunk)
	pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Pct: "20", Cores: "20"})
	if f, _ := preScored(t, e, pod); f == nil || f.GPUs != 4 {
		t.Errorf("largest node %+v, want 4 GPUs", f)
	}
}

// preScored runs PreFilter and PreScore for pod over every node of e and returns the
// largest-node measure PreScore wrote, with the cycle state.
func preScored(t *testing.T, e *env, pod *v1.Pod) (*placement.FitScale, fwk.CycleState) {
	t.Helper()
	ctx := context.Background()
	cs := framework.NewCycleState()
	if _, st := e.pl.PreFilter(ctx, cs, pod, e.infos); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	if st := e.pl.PreScore(ctx, cs, pod, e.infos); !st.IsSuccess() {
		t.Fatalf("PreScore: %v", st)
	}
	s, err := getState(cs)
	if err != nil {
		t.Fatal(err)
	}
	return s.fit, cs
}

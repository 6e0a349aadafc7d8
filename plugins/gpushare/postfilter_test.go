// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-dev/tessera/api"
)

// postFilter runs PostFilter after r's Filter, with the statuses as the framework
// hands them over (each naming the plugin that gave it).
func (e *env) postFilter(r *cycleResult, pod *v1.Pod) *fwk.Status {
	e.t.Helper()
	m := framework.NewDefaultNodeToStatus()
	for name, st := range r.filter {
		if !st.IsSuccess() {
			st.SetPlugin(Name)
			m.Set(name, st)
		}
	}
	res, st := e.pl.PostFilter(context.Background(), r.state, pod, m)
	if res != nil {
		e.t.Errorf("PostFilter result %v: it never nominates", res)
	}
	if st.Code() != fwk.Unschedulable {
		e.t.Fatalf("PostFilter code %v (%q), want Unschedulable", st.Code(), st.Message())
	}
	return st
}

func TestPostFilterNamesTheClosestGPU(t *testing.T) {
	nodes := []*v1.Node{h100(t, "a"), h100(t, "b"), t4(t, "c")}
	var pods []*v1.Pod
	busy := func(node string, g int, mem int64, cores int) {
		pods = append(pods, bindPod(t, makePod(fmt.Sprintf("%s-%d", node, g), nil, ctr{Name: "c", GPU: "1"}), node, oneGrant(node, mem, cores, g)))
	}
	for g := 0; g < 8; g++ {
		busy("a", g, h100Mem-1000, 90) // 1000 MiB, 10% free
		busy("b", g, h100Mem-2500, 99) // 2500 MiB, 1% free
	}
	for g := 0; g < 4; g++ {
		busy("c", g, t4Mem-500, 40) // 500 MiB, 60% free
	}
	e := newEnv(t, nil, nodes, pods...)

	pod := makePod("p", nil, ctr{Name: "train", GPU: "1", Mem: "4096", Cores: "20"})
	r := e.cycle(pod)
	if len(r.feasible) != 0 {
		t.Fatalf("feasible %v", r.feasible)
	}
	want := `closest for container "train": 2500 MiB free on one GPU (node b), 60% of a GPU's cores (node c)`
	if got := e.postFilter(r, pod).Message(); got != want {
		t.Errorf("PostFilter %q, want %q", got, want)
	}

	// Without cores asked, only memory is named; a model selection narrows the GPUs.
	pod = makePod("q", map[string]string{api.AnnotationModelInclude: "T4"}, ctr{Name: "infer", GPU: "1", Mem: "4096"})
	r = e.cycle(pod)
	want = `closest for container "infer": 500 MiB free on one GPU (node c)`
	if got := e.postFilter(r, pod).Message(); got != want {
		t.Errorf("PostFilter %q, want %q", got, want)
	}

	// Several GPUs in one container: how many have room for it on one node.
	pod = makePod("w", nil, ctr{Name: "c", GPU: "2", Mem: "4096"})
	r = e.cycle(pod)
	want = `closest for container "c": no node has a GPU with room for it, it asks 2`
	if got := e.postFilter(r, pod).Message(); got != want {
		t.Errorf("PostFilter %q, want %q", got, want)
	}
	pods = nil
	for g := 0; g < 5; g++ {
		busy("x", g, h100Mem, 100)
	}
	busy("y", 0, h100Mem, 100)
	busy("y", 1, 1000, 100) // memory left, no cores
	e = newEnv(t, nil, []*v1.Node{h100(t, "x"), h100(t, "y")}, pods...)
	pod = makePod("w", nil, ctr{Name: "c", GPU: "8", Mem: "4096", Cores: "10"})
	r = e.cycle(pod)
	want = `closest for container "c": 6 GPUs with room for it on one node (node y), it asks 8`
	if got := e.postFilter(r, pod).Message(); got != want {
		t.Errorf("PostFilter %q, want %q", got, want)
	}

	// Required locality: GPUs with room count within one NVLink island (h100: two
	// islands of four) or NUMA node.
	e = newEnv(t, nil, []*v1.Node{h100(t, "z")})
	for topo, want := range map[string]string{
		"nvlink-required": `closest for container "c": 4 GPUs with room for it all joined by NVLink (node z), it asks 8`,
		"numa-required":   `closest for container "c": 4 GPUs with room for it on one NUMA node (node z), it asks 8`,
		"none":            ``,
	} {
		pod = makePod("l", map[string]string{api.AnnotationTopology: topo}, ctr{Name: "c", GPU: "8", Mem: "4096"})
		r = e.cycle(pod)
		if want == "" {
			if len(r.feasible) != 1 {
				t.Errorf("%s: feasible %v", topo, r.feasible)
			}
			continue
		}
		if got := e.postFilter(r, pod).Message(); got != want {
			t.Errorf("%s: PostFilter %q, want %q", topo, got, want)
		}
	}
}

// Nodes refused for something freed capacity cannot fix, or by another plugin, are
// not named; a pod without GPUs or rejected in PreFilter gets nothing.
func TestPostFilterSkips(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{t4(t, "c"), makeNode(t, "plain", nil)})
	pod := makePod("p", nil, ctr{Name: "big", GPU: "1", Mem: "40000"})
	r := e.cycle(pod)
	if got := e.postFilter(r, pod).Message(); got != "" {
		t.Errorf("PostFilter %q when no node could ever fit", got)
	}

	pod = makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "1000"})
	r = e.cycle(pod)
	r.filter = map[string]*fwk.Status{}
	m := framework.NewDefaultNodeToStatus()
	m.Set("c", fwk.NewStatus(fwk.Unschedulable, "Insufficient cpu").WithPlugin("NodeResourcesFit"))
	if _, st := e.pl.PostFilter(context.Background(), r.state, pod, m); st.Message() != "" {
		t.Errorf("PostFilter %q for a node another plugin refused", st.Message())
	}

	for _, pod := range []*v1.Pod{makePod("cpu", nil, ctr{Name: "c"}), makePod("bad", nil, ctr{Name: "c", GPU: "0"})} {
		r := e.cycle(pod)
		if _, st := e.pl.PostFilter(context.Background(), r.state, pod, framework.NewDefaultNodeToStatus()); st.Code() != fwk.Unschedulable || st.Message() != "" {
			t.Errorf("%s: PostFilter %v %q", pod.Name, st.Code(), st.Message())
		}
	}
}

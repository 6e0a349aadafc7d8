// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// A miss that freeing capacity could fix reads the same on every node, whatever each
// has free and whatever its GPUs' size: the scheduler's FailedScheduling summary
// counts nodes per distinct reason, and a per-node figure made one line per node.
func TestMissReasonsGroupAcrossNodes(t *testing.T) {
	// Every GPU of node i is used by one pod holding mem[i] MiB and cores[i] %.
	fill := func(nodes []*v1.Node, mem []int64, cores []int, count []int) []*v1.Pod {
		var pods []*v1.Pod
		for i, n := range nodes {
			for g := 0; g < count[i]; g++ {
				pods = append(pods, bindPod(t, makePod(fmt.Sprintf("%s-%d", n.Name, g), nil, ctr{Name: "c", GPU: "1"}), n.Name, oneGrant(n.Name, mem[i], cores[i], g)))
			}
		}
		return pods
	}
	nodes := []*v1.Node{h100(t, "a"), h100(t, "b"), t4(t, "c"), t4(t, "d")}
	count := []int{8, 8, 4, 4}
	for _, tc := range []struct {
		name  string
		mem   []int64
		cores []int
		pod   *v1.Pod
		want  string
	}{
		{"memory in MiB", []int64{h100Mem - 3000, h100Mem - 100, t4Mem - 2000, t4Mem - 10}, []int{0, 0, 0, 0},
			makePod("p", nil, ctr{Name: "m", GPU: "1", Mem: "4096"}), `node(s) had no GPU with 4096 MiB free for container "m"`},
		{"memory in percent on GPUs of different sizes", []int64{h100Mem * 7 / 10, h100Mem * 9 / 10, t4Mem * 8 / 10, t4Mem},
			[]int{0, 0, 0, 0}, makePod("p", nil, ctr{Name: "m", GPU: "1", Pct: "40"}), `node(s) had no GPU with 40% of its memory free for container "m"`},
		{"cores", []int64{1000, 2000, 1000, 500}, []int{80, 95, 71, 100},
			makePod("p", nil, ctr{Name: "m", GPU: "2", Mem: "1000", Cores: "30"}), `node(s) had fewer than 2 GPUs with 30% of their cores free for container "m"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil, nodes, fill(nodes, tc.mem, tc.cores, count)...)
			r := e.cycle(tc.pod)
			if !r.pre.IsSuccess() {
				t.Fatalf("PreFilter: %v", r.pre)
			}
			for _, n := range nodes {
				if got := r.filter[n.Name].Message(); got != tc.want {
					t.Errorf("node %s: %q, want %q", n.Name, got, tc.want)
				}
			}
		})
	}
}

// A request below a CUDA context's charge is judged per node against the charge the
// node's agent publishes (the default where it publishes none): PreFilter takes it,
// Filter refuses it as unresolvable where the charge is larger, with a reason that
// names the charge, and places it where the agent charges less.
func TestFilterUsesTheNodesContextCharge(t *testing.T) {
	small := pcieInventory("small", 4, "Tesla T4", t4Mem)
	small.ContextMiB = 300
	large := pcieInventory("large", 4, "Tesla T4", t4Mem)
	large.ContextMiB = 2048
	nodes := []*v1.Node{t4(t, "default"), makeNode(t, "small", small), makeNode(t, "large", large)}
	e := newEnv(t, nil, nodes)
	for _, tc := range []struct {
		pod      *v1.Pod
		feasible string
		refused  map[string]string
	}{
		{makePod("mib", nil, ctr{Name: "infer", GPU: "1", Mem: "512"}), "small", map[string]string{
			"default": `container "infer" asks 512 MiB per GPU, less than the 576 MiB the node's CUDA hook charges`,
			"large":   `container "infer" asks 512 MiB per GPU, less than the 2048 MiB the node's CUDA hook charges`}},
		// 10% of a T4 is 1536 MiB.
		{makePod("pct", nil, ctr{Name: "infer", GPU: "1", Pct: "10"}), "default,small", map[string]string{
			"large": `container "infer" asks 10% of each GPU's memory, 1536 MiB on the node's largest GPU (15360 MiB), less than the 2048 MiB`}},
	} {
		t.Run(tc.pod.Name, func(t *testing.T) {
			r := e.cycle(tc.pod)
			if !r.pre.IsSuccess() {
				t.Fatalf("PreFilter: %v", r.pre)
			}
			if got := strings.Join(r.feasible, ","); got != tc.feasible {
				t.Errorf("feasible %q, want %q", got, tc.feasible)
			}
			for node, want := range tc.refused {
				st := r.filter[node]
				if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), want) {
					t.Errorf("node %s: %v %q, want UnschedulableAndUnresolvable with %q", node, st.Code(), st.Message(), want)
				}
			}
		})
	}
}

// A node whose agent serves its GPUs through DRA takes no pod of tessera.dev/*
// resources (kubelet there has none), unresolvably and saying what to do instead;
// the device-plugin node beside it does.
func TestFilterRefusesDRANodes(t *testing.T) {
	dra := pcieInventory("dra", 4, "Tesla T4", t4Mem)
	dra.DRA = true
	e := newEnv(t, nil, []*v1.Node{t4(t, "plugin"), makeNode(t, "dra", dra)})
	r := e.cycle(makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "4096"}))
	if !r.pre.IsSuccess() {
		t.Fatalf("PreFilter: %v", r.pre)
	}
	if got := strings.Join(r.feasible, ","); got != "plugin" {
		t.Errorf("feasible %q, want plugin", got)
	}
	if st := r.filter["dra"]; st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "ResourceClaim") {
		t.Errorf("DRA node: %v %q", st.Code(), st.Message())
	}
}

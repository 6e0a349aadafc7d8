// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
)

func TestPreFilterRejectsBadRequests(t *testing.T) {
	tests := []struct {
		name string
		pod  *v1.Pod
		want string
	}{
		{"zero GPUs", makePod("p", nil, ctr{Name: "train", GPU: "0"}), `container "train": tessera.dev/gpu: must be a whole number of GPUs >= 1, got 0`},
		{"negative GPUs", makePod("p", nil, ctr{Name: "train", GPU: "-1"}), `tessera.dev/gpu: must be a whole number`},
		{"fractional GPUs", makePod("p", nil, ctr{Name: "train", GPU: "500m"}), `got 500m`},
		{"too many GPUs", makePod("p", nil, ctr{Name: "train", GPU: "1000"}), `asks for 1000 GPUs`},
		{"memory without gpu", makePod("p", nil, ctr{Name: "infer", Mem: "4096"}), `container "infer": tessera.dev/gpu-memory: is set without tessera.dev/gpu`},
		{"cores without gpu", makePod("p", nil, ctr{Name: "infer", Cores: "30"}), `tessera.dev/gpu-cores: is set without tessera.dev/gpu`},
		{"percent over 100", makePod("p", nil, ctr{Name: "infer", GPU: "1", Pct: "101"}), `tessera.dev/gpu-memory-percent: must be a whole percent between 1 and 100, got 101`},
		{"cores over 100", makePod("p", nil, ctr{Name: "infer", GPU: "1", Cores: "150"}), `tessera.dev/gpu-cores: must be a whole percent between 1 and 100, got 150`},
		{"zero memory", makePod("p", nil, ctr{Name: "infer", GPU: "1", Mem: "0"}), `tessera.dev/gpu-memory: must be a whole number of MiB >= 1`},
		{"memory and percent", makePod("p", nil, ctr{Name: "infer", GPU: "1", Mem: "100", Pct: "10"}), `set either tessera.dev/gpu-memory or tessera.dev/gpu-memory-percent`},
		{"absurd memory", makePod("p", nil, ctr{Name: "infer", GPU: "1", Mem: "4Gi"}), `more than any GPU has; the value is in MiB`},
		{"bad topology", makePod("p", map[string]string{api.AnnotationTopology: "close"}, ctr{Name: "c", GPU: "2"}), `annotation tessera.dev/gpu-topology: "close" is not one of`},
		{"bad policy", makePod("p", map[string]string{api.AnnotationDevicePolicy: "pack"}, ctr{Name: "c", GPU: "1"}), `annotation tessera.dev/gpu-policy: "pack" is not a policy`},
		{"bad init container", makePod("p", nil, ctr{Name: "warmup", GPU: "1", Cores: "0", Init: true}), `container "warmup": tessera.dev/gpu-cores`},
	}
	e := newEnv(t, nil, []*v1.Node{h100(t, "n1")})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, st := e.pl.PreFilter(context.Background(), framework.NewCycleState(), tc.pod, e.infos)
			if st.Code() != fwk.UnschedulableAndUnresolvable {
				t.Fatalf("code = %v (%v), want UnschedulableAndUnresolvable", st.Code(), st.Message())
			}
			if !strings.Contains(st.Message(), tc.want) {
				t.Errorf("message %q does not contain %q", st.Message(), tc.want)
			}
		})
	}
}

func TestPodWithoutGPUIsSkippedEverywhere(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{h100(t, "n1")})
	pod := makePod("cpu", nil)
	pod.Spec.Containers = []v1.Container{{Name: "c", Image: "x"}}
	ctx := context.Background()
	cs := framework.NewCycleState()
	if _, st := e.pl.PreFilter(ctx, cs, pod, e.infos); !st.IsSkip() {
		t.Fatalf("PreFilter = %v, want Skip", st)
	}
	// Binpack (the default) still scores it, by best fit (TestBestFit); Spread skips.
	if st := e.pl.PreScore(ctx, cs, pod, e.infos); !st.IsSuccess() {
		t.Errorf("Binpack PreScore = %v, want Success", st)
	}
	sp := newEnv(t, &TesseraGPUShareArgs{NodePolicy: Spread}, []*v1.Node{h100(t, "n1")})
	scs := framework.NewCycleState()
	sp.pl.PreFilter(ctx, scs, pod, sp.infos)
	if st := sp.pl.PreScore(ctx, scs, pod, sp.infos); !st.IsSkip() {
		t.Errorf("Spread PreScore = %v, want Skip", st)
	}
	if _, st := e.pl.PreBindPreFlight(ctx, cs, pod, "n1"); !st.IsSkip() {
		t.Errorf("PreBindPreFlight = %v, want Skip", st)
	}
	if st := e.pl.Reserve(ctx, cs, pod, "n1"); !st.IsSuccess() {
		t.Errorf("Reserve = %v", st)
	}
	if frags, st := e.pl.SignPod(ctx, pod); !st.IsSuccess() || len(frags) != 0 {
		t.Errorf("SignPod = %v, %v; want no fragments", frags, st)
	}
}

func TestFilterReasons(t *testing.T) {
	full := func(node string, mem int64, cores int, idx ...int) []*v1.Pod {
		var pods []*v1.Pod
		for _, i := range idx {
			pods = append(pods, bindPod(t, makePod(fmt.Sprintf("%s-busy-%d", node, i), nil, ctr{Name: "c", GPU: "1"}), node, oneGrant(node, mem, cores, i)))
		}
		return pods
	}
	unhealthy := nvlinkInventory("sick", 2, 2, "NVIDIA H100", h100Mem)
	for i := range unhealthy.GPUs {
		unhealthy.GPUs[i].Healthy, unhealthy.GPUs[i].HealthReason = false, "XID 79"
	}
	staleInv := nvlinkInventory("old", 2, 2, "NVIDIA H100", h100Mem)
	staleInv.UpdatedAt = time.Now().Add(-time.Hour)
	malformed := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bad", Annotations: map[string]string{api.AnnotationInventory: `{"version":1,"gpus":[{"index":0}]}`}}}
	future := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "future", Annotations: map[string]string{api.AnnotationInventory: `{"version":9}`}}}
	withRequirements := func(n *v1.Node, raw string) *v1.Node {
		n.Annotations[api.AnnotationRequirements] = raw
		return n
	}

	tests := []struct {
		name string
		node *v1.Node
		pods []*v1.Pod
		args *TesseraGPUShareArgs
		pod  *v1.Pod
		code fwk.Code
		want string
	}{
		{name: "fits", node: h100(t, "n"), pod: makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "4096"}), code: fwk.Success},
		{name: "closest memory miss", node: h100(t, "n"), pods: full("n", 78487, 0, 0, 1, 2, 3, 4, 5, 6, 7),
			pod: makePod("p", nil, ctr{Name: "train", GPU: "1", Mem: "4096"}), code: fwk.Unschedulable,
			want: `node(s) had no GPU with 4096 MiB free for container "train"`},
		{name: "multi-GPU memory miss", node: h100(t, "n"), pods: full("n", 78487, 0, 0, 1, 2, 3, 4, 5),
			pod: makePod("p", nil, ctr{Name: "train", GPU: "4", Mem: "4096"}), code: fwk.Unschedulable,
			want: `node(s) had fewer than 4 GPUs with 4096 MiB free for container "train"`},
		{name: "larger than any GPU", node: t4(t, "n"), pod: makePod("p", nil, ctr{Name: "big", GPU: "1", Mem: "40000"}),
			code: fwk.UnschedulableAndUnresolvable, want: `container "big" asks 40000 MiB per GPU; the largest GPU on the node has 15360 MiB`},
		{name: "more GPUs than the node has", node: t4(t, "n"), pod: makePod("p", nil, ctr{Name: "c", GPU: "8"}),
			code: fwk.UnschedulableAndUnresolvable, want: `container "c" asks 8 GPUs; the node has 4 that match`},
		{name: "cores miss", node: t4(t, "n"), pods: full("n", 100, 80, 0, 1, 2, 3),
			pod: makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "1000", Cores: "30"}), code: fwk.Unschedulable,
			want: `node(s) had no GPU with 30% of its cores free for container "c"`},
		{name: "best effort needs unreserved compute", node: t4(t, "n"), pods: full("n", 100, 100, 0, 1, 2, 3),
			pod: makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "1000"}), code: fwk.Unschedulable, want: `node(s) had no GPU with cores not reserved by others for container "c", which reserves no cores`},
		{name: "tenant limit", node: t4(t, "n"), args: &TesseraGPUShareArgs{MaxTenantsPerGPU: 1}, pods: full("n", 100, 0, 0, 1, 2, 3),
			pod: makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "1000"}), code: fwk.Unschedulable, want: `node(s) had no GPU under the limit of 1 containers per GPU for container "c"`},
		{name: "model include", node: t4(t, "n"), pod: makePod("p", map[string]string{api.AnnotationModelInclude: "H100, A100"}, ctr{Name: "c", GPU: "1"}),
			code: fwk.UnschedulableAndUnresolvable, want: `no GPU on the node matches the pod's GPU selection (node has 4 × Tesla T4)`},
		{name: "model exclude", node: t4(t, "n"), pod: makePod("p", map[string]string{api.AnnotationModelExclude: "t4"}, ctr{Name: "c", GPU: "1"}),
			code: fwk.UnschedulableAndUnresolvable, want: `no GPU on the node matches`},
		{name: "model include matches case-insensitively", node: t4(t, "n"), pod: makePod("p", map[string]string{api.AnnotationModelInclude: "tesla t4"}, ctr{Name: "c", GPU: "1"}), code: fwk.Success},
		{name: "uuid include too few", node: t4(t, "n"), pod: makePod("p", map[string]string{api.AnnotationUUIDInclude: "GPU-n-1"}, ctr{Name: "c", GPU: "2"}),
			code: fwk.UnschedulableAndUnresolvable, want: `asks 2 GPUs; the node has 1 that match`},
		{name: "uuid exclude", node: t4(t, "n"), pod: makePod("p", map[string]string{api.AnnotationUUIDExclude: "GPU-n-0,GPU-n-1,GPU-n-2"}, ctr{Name: "c", GPU: "2"}),
			code: fwk.UnschedulableAndUnresolvable, want: `the node has 1 that match`},
		{name: "unhealthy", node: makeNode(t, "sick", unhealthy), pod: makePod("p", nil, ctr{Name: "c", GPU: "1"}),
			code: fwk.UnschedulableAndUnresolvable, want: `only 0 of the node's 2 matching GPUs are healthy`},
		{name: "nvlink required across islands", node: h100(t, "n"), pod: makePod("p", map[string]string{api.AnnotationTopology: "nvlink-required"}, ctr{Name: "c", GPU: "5"}),
			code: fwk.Unschedulable, want: `node(s) had no 5 GPUs with room for container "c" all joined by NVLink (topology nvlink-required)`},
		{name: "nvlink required on PCIe node", node: t4(t, "n"), pod: makePod("p", map[string]string{api.AnnotationTopology: "nvlink-required"}, ctr{Name: "c", GPU: "2"}),
			code: fwk.Unschedulable, want: `all joined by NVLink`},
		{name: "numa required fits on PCIe node", node: t4(t, "n"), pod: makePod("p", map[string]string{api.AnnotationTopology: "numa-required"}, ctr{Name: "c", GPU: "2"}), code: fwk.Success},
		{name: "numa required too many", node: t4(t, "n"), pod: makePod("p", map[string]string{api.AnnotationTopology: "numa-required"}, ctr{Name: "c", GPU: "3"}),
			code: fwk.Unschedulable, want: `on one NUMA node`},
		{name: "no inventory", node: makeNode(t, "plain", nil), pod: makePod("p", nil, ctr{Name: "c", GPU: "1"}),
			code: fwk.UnschedulableAndUnresolvable, want: `node has no tessera.dev/gpu-inventory annotation`},
		{name: "malformed inventory", node: malformed, pod: makePod("p", nil, ctr{Name: "c", GPU: "1"}),
			code: fwk.UnschedulableAndUnresolvable, want: `node's tessera.dev/gpu-inventory annotation is invalid: GPU inventory: gpus[0]: uuid is empty`},
		{name: "unsupported inventory version", node: future, pod: makePod("p", nil, ctr{Name: "c", GPU: "1"}),
			code: fwk.UnschedulableAndUnresolvable, want: `version 9 is not supported`},
		{name: "stale inventory", node: makeNode(t, "old", staleInv), pod: makePod("p", nil, ctr{Name: "c", GPU: "1"}),
			code: fwk.UnschedulableAndUnresolvable, want: `node's GPU inventory is stale: last heartbeat 1h0m`},
		{name: "node requirement not met", node: withRequirements(h100(t, "nonri"), "nri: no NRI socket at /var/run/nri/nri.sock"),
			pod: makePod("p", nil, ctr{Name: "c", GPU: "1"}), code: fwk.UnschedulableAndUnresolvable,
			want: `node does not meet Tessera's requirements, and its node agent refuses GPU containers until it does: nri: no NRI socket at /var/run/nri/nri.sock`},
		{name: "node requirements met", node: withRequirements(h100(t, "ok"), api.RequirementsMet),
			pod: makePod("p", nil, ctr{Name: "c", GPU: "1"}), code: fwk.Success},
		{name: "stale check disabled", node: makeNode(t, "old", staleInv), args: &TesseraGPUShareArgs{InventoryStaleness: &metav1.Duration{}},
			pod: makePod("p", nil, ctr{Name: "c", GPU: "1"}), code: fwk.Success},
		{name: "two containers share one GPU", node: makeNode(t, "one", pcieInventory("one", 1, "Tesla T4", t4Mem)),
			pod: makePod("p", nil, ctr{Name: "a", GPU: "1", Mem: "7000"}, ctr{Name: "b", GPU: "1", Mem: "7000"}), code: fwk.Success},
		{name: "two containers overflow one GPU", node: makeNode(t, "one", pcieInventory("one", 1, "Tesla T4", t4Mem)),
			pod: makePod("p", nil, ctr{Name: "a", GPU: "1", Mem: "8000"}, ctr{Name: "b", GPU: "1", Mem: "8000"}), code: fwk.Unschedulable,
			want: `node(s) had no GPU with 8000 MiB free for container "b" beside the pod's other containers`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.args, []*v1.Node{tc.node}, tc.pods...)
			r := e.cycle(tc.pod)
			if !r.pre.IsSuccess() {
				t.Fatalf("PreFilter: %v", r.pre)
			}
			st := r.filter[tc.node.Name]
			if st.Code() != tc.code {
				t.Fatalf("Filter code = %v (%q), want %v", st.Code(), st.Message(), tc.code)
			}
			if tc.want != "" && !strings.Contains(st.Message(), tc.want) {
				t.Errorf("Filter message %q does not contain %q", st.Message(), tc.want)
			}
		})
	}
}

// placed decodes an assignment annotation and returns the GPU indexes per container.
func placed(t *testing.T, raw string) map[string][]int {
	t.Helper()
	a, err := api.DecodeAssignment(raw)
	if err != nil {
		t.Fatalf("assignment: %v", err)
	}
	out := map[string][]int{}
	for _, c := range a.Containers {
		for _, d := range c.Devices {
			out[c.Name] = append(out[c.Name], d.Index)
		}
	}
	return out
}

func within(idx []int, allowed ...int) bool {
	for _, i := range idx {
		if !slices.Contains(allowed, i) {
			return false
		}
	}
	return true
}

func TestDevicePlacement(t *testing.T) {
	busy := func(node string, mem int64, idx int) *v1.Pod {
		return bindPod(t, makePod(fmt.Sprintf("busy-%d", idx), nil, ctr{Name: "c", GPU: "1"}), node, oneGrant(node, mem, 0, idx))
	}
	tests := []struct {
		name  string
		node  *v1.Node
		pods  []*v1.Pod
		args  *TesseraGPUShareArgs
		pod   *v1.Pod
		check func(map[string][]int) bool
		want  string
	}{
		{name: "binpack joins the used GPU", node: h100(t, "n"), pods: []*v1.Pod{busy("n", 40000, 3)},
			pod: makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "10000"}), check: func(m map[string][]int) bool { return within(m["c"], 3) }, want: "GPU 3"},
		{name: "spread avoids the used GPU", node: h100(t, "n"), pods: []*v1.Pod{busy("n", 40000, 3)}, args: &TesseraGPUShareArgs{DevicePolicy: Spread},
			pod: makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "10000"}), check: func(m map[string][]int) bool { return !within(m["c"], 3) }, want: "not GPU 3"},
		{name: "pod annotation overrides the GPU policy", node: h100(t, "n"), pods: []*v1.Pod{busy("n", 40000, 3)},
			pod:   makePod("p", map[string]string{api.AnnotationDevicePolicy: "spread"}, ctr{Name: "c", GPU: "1", Mem: "10000"}),
			check: func(m map[string][]int) bool { return !within(m["c"], 3) }, want: "not GPU 3"},
		{name: "binpack keeps the whole NVLink island free", node: h100(t, "n"), pods: []*v1.Pod{busy("n", 80000, 5)},
			pod: makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "4096"}), check: func(m map[string][]int) bool { return within(m["c"], 4, 6, 7) }, want: "GPU in the broken island 4-7"},
		{name: "four GPUs take one whole island", node: h100(t, "n"),
			pod:   makePod("p", nil, ctr{Name: "c", GPU: "4"}),
			check: func(m map[string][]int) bool { return within(m["c"], 0, 1, 2, 3) || within(m["c"], 4, 5, 6, 7) }, want: "one NVLink island"},
		{name: "two whole GPUs stay in the broken island", node: h100(t, "n"), pods: []*v1.Pod{busy("n", 1000, 0)},
			pod:   makePod("p", nil, ctr{Name: "c", GPU: "2"}),
			check: func(m map[string][]int) bool { return within(m["c"], 1, 2, 3) }, want: "two of GPUs 1-3"},
		{name: "PCIe pair on one switch", node: t4(t, "n"),
			pod:   makePod("p", nil, ctr{Name: "c", GPU: "2"}),
			check: func(m map[string][]int) bool { return within(m["c"], 0, 1) || within(m["c"], 2, 3) }, want: "a pair on one PCIe switch"},
		{name: "containers share a GPU under binpack", node: t4(t, "n"),
			pod:   makePod("p", nil, ctr{Name: "a", GPU: "1", Mem: "4000"}, ctr{Name: "b", GPU: "1", Mem: "4000"}),
			check: func(m map[string][]int) bool { return len(m["a"]) == 1 && len(m["b"]) == 1 && m["a"][0] == m["b"][0] }, want: "a and b on one GPU"},
		{name: "containers apart under spread", node: t4(t, "n"), args: &TesseraGPUShareArgs{DevicePolicy: Spread},
			pod:   makePod("p", nil, ctr{Name: "a", GPU: "1", Mem: "4000"}, ctr{Name: "b", GPU: "1", Mem: "4000"}),
			check: func(m map[string][]int) bool { return m["a"][0] != m["b"][0] }, want: "a and b on different GPUs"},
		{name: "init container is granted too", node: t4(t, "n"),
			pod:   makePod("p", nil, ctr{Name: "warm", GPU: "1", Mem: "1000", Init: true}, ctr{Name: "main", GPU: "1", Mem: "1000"}),
			check: func(m map[string][]int) bool { return len(m["warm"]) == 1 && len(m["main"]) == 1 }, want: "both containers granted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.args, []*v1.Node{tc.node}, tc.pods...)
			r, raw := e.schedule(tc.pod)
			if raw == "" {
				t.Fatalf("not scheduled: %v", r.filter)
			}
			got := placed(t, raw)
			if !tc.check(got) {
				t.Errorf("placement %v, want %s", got, tc.want)
			}
		})
	}
}

func migNode(t *testing.T) *v1.Node {
	inv := pcieInventory("mig", 2, "NVIDIA A100-SXM4-80GB", 81920)
	inv.GPUs[0].MIG = &api.MIG{Instances: []api.MIGInstance{
		{UUID: "MIG-a", Profile: "1g.10gb", MemoryMiB: 9728}, {UUID: "MIG-b", Profile: "3g.40gb", MemoryMiB: 40192}}}
	return makeNode(t, "mig", inv)
}

func TestMIGInstancesOnlyWhenAsked(t *testing.T) {
	tests := []struct {
		name string
		pod  *v1.Pod
		want string // UUID granted, or "" when unschedulable
	}{
		{"a whole GPU is not a MIG slice", makePod("p", nil, ctr{Name: "c", GPU: "1", Cores: "100"}), "GPU-mig-1"},
		{"a fraction stays off MIG too", makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "2000"}), "GPU-mig-1"},
		{"a MIG profile by model", makePod("p", map[string]string{api.AnnotationModelInclude: "MIG 1g.10gb"}, ctr{Name: "c", GPU: "1"}), "MIG-a"},
		{"a MIG instance by UUID", makePod("p", map[string]string{api.AnnotationUUIDInclude: "MIG-b"}, ctr{Name: "c", GPU: "1", Mem: "1000"}), "MIG-b"},
		{"multi-GPU never mixes in MIG", makePod("p", map[string]string{api.AnnotationModelInclude: "A100"}, ctr{Name: "c", GPU: "2"}), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil, []*v1.Node{migNode(t)})
			r, raw := e.schedule(tc.pod)
			if tc.want == "" {
				if raw != "" {
					t.Fatalf("scheduled: %s", raw)
				}
				return
			}
			if raw == "" {
				t.Fatalf("not scheduled: %v", r.filter)
			}
			a, _ := api.DecodeAssignment(raw)
			if got := a.Containers[0].Devices[0].UUID; got != tc.want {
				t.Errorf("granted %s, want %s", got, tc.want)
			}
		})
	}
}

func TestAssignmentContents(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{t4(t, "n")})
	_, raw := e.schedule(makePod("p", nil, ctr{Name: "a", GPU: "2", Pct: "50", Cores: "30"}, ctr{Name: "b", GPU: "1"}))
	a, err := api.DecodeAssignment(raw)
	if err != nil {
		t.Fatal(err)
	}
	if a.Node != "n" || len(a.Containers) != 2 || a.Containers[0].Name != "a" || a.Containers[1].Name != "b" {
		t.Fatalf("assignment %+v", a)
	}
	for _, d := range a.Containers[0].Devices {
		if d.MemoryMiB != t4Mem/2 || d.Cores != 30 {
			t.Errorf("container a device %+v, want %d MiB and 30%% cores", d, t4Mem/2)
		}
	}
	if d := a.Containers[1].Devices[0]; d.MemoryMiB != t4Mem || d.Cores != 0 {
		t.Errorf("container b device %+v, want the whole memory", d)
	}
	// The whole-GPU container must not share with container a.
	for _, d := range a.Containers[0].Devices {
		if d.UUID == a.Containers[1].Devices[0].UUID {
			t.Errorf("whole-GPU container shares %s", d.UUID)
		}
	}
}

func TestNodeScoring(t *testing.T) {
	busyPods := []*v1.Pod{bindPod(t, makePod("busy", nil, ctr{Name: "c", GPU: "1"}), "busy", oneGrant("busy", 60000, 50, 0))}
	nodes := []*v1.Node{h100(t, "empty"), h100(t, "busy")}
	pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "8000", Cores: "10"})

	bin := newEnv(t, &TesseraGPUShareArgs{NodePolicy: Binpack}, nodes, busyPods...).cycle(pod)
	if bin.best != "busy" || bin.scores["busy"] <= bin.scores["empty"] {
		t.Errorf("binpack scores %v, want busy > empty", bin.scores)
	}
	spread := newEnv(t, &TesseraGPUShareArgs{NodePolicy: Spread}, nodes, busyPods...).cycle(pod)
	if spread.best != "empty" || spread.scores["empty"] <= spread.scores["busy"] {
		t.Errorf("spread scores %v, want empty > busy", spread.scores)
	}
	for _, s := range []map[string]int64{bin.scores, spread.scores} {
		for n, v := range s {
			if v < fwk.MinNodeScore || v > fwk.MaxNodeScore {
				t.Errorf("score of %s = %d out of range", n, v)
			}
		}
	}

	// Topology: with equal utilisation a 2-GPU container scores higher where its
	// GPUs share NVLink.
	topo := newEnv(t, nil, []*v1.Node{h100(t, "nv"), makeNode(t, "pcie", pcieInventory("pcie", 8, "NVIDIA H100 PCIe", h100Mem))}).
		cycle(makePod("p", nil, ctr{Name: "c", GPU: "2"}))
	if topo.scores["nv"] <= topo.scores["pcie"] {
		t.Errorf("topology scores %v, want nv > pcie", topo.scores)
	}

	// Islands: under binpack a fraction prefers a node where it breaks no free NVLink
	// island, keeping the island for pods that need it whole.
	isl := newEnv(t, &TesseraGPUShareArgs{NodePolicy: Binpack}, []*v1.Node{h100(t, "nvlink"), makeNode(t, "pcie", pcieInventory("pcie", 8, "NVIDIA H100 PCIe", h100Mem))}).
		cycle(makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "1000"}))
	if isl.scores["pcie"] <= isl.scores["nvlink"] {
		t.Errorf("island scores %v, want pcie > nvlink", isl.scores)
	}
}

func TestReserveUnreserve(t *testing.T) {
	node := makeNode(t, "one", pcieInventory("one", 1, "Tesla T4", t4Mem))
	e := newEnv(t, nil, []*v1.Node{node})
	ctx := context.Background()
	p1 := makePod("p1", nil, ctr{Name: "c", GPU: "1", Mem: "10000"})
	p2 := makePod("p2", nil, ctr{Name: "c", GPU: "1", Mem: "10000"})
	r1, r2 := e.cycle(p1), e.cycle(p2)
	if r1.best != "one" || r2.best != "one" {
		t.Fatalf("both pods should pass Filter alone: %v %v", r1.filter, r2.filter)
	}
	if st := e.pl.Reserve(ctx, r1.state, p1, "one"); !st.IsSuccess() {
		t.Fatalf("Reserve p1: %v", st)
	}
	// p2 passed Filter before p1 was reserved; Reserve must see the capacity is gone.
	if st := e.pl.Reserve(ctx, r2.state, p2, "one"); st.Code() != fwk.Unschedulable {
		t.Fatalf("Reserve p2 = %v, want Unschedulable", st)
	}
	used := func() int64 {
		u, err := e.pl.cache.NodeUsage("one")
		if err != nil {
			t.Fatal(err)
		}
		return u[0].UsedMiB
	}
	if got := used(); got != 10000 {
		t.Fatalf("used %d MiB after Reserve, want 10000", got)
	}
	e.pl.Unreserve(ctx, r1.state, p1, "one")
	e.pl.Unreserve(ctx, r1.state, p1, "one")
	if got := used(); got != 0 {
		t.Fatalf("used %d MiB after two Unreserves, want 0", got)
	}
	// A pod the informer already shows bound keeps its grants through Unreserve.
	_, raw := e.schedule(p2)
	if raw == "" {
		t.Fatal("p2 not scheduled")
	}
	e.pl.Unreserve(ctx, framework.NewCycleState(), p2, "one")
	if got := used(); got != 10000 {
		t.Fatalf("used %d MiB after Unreserve of a bound pod, want 10000", got)
	}
}

func TestPreBindWritesAnnotation(t *testing.T) {
	e := newEnv(t, &TesseraGPUShareArgs{AssignmentWrite: WritePreBind}, []*v1.Node{t4(t, "n")})
	pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "2048", Cores: "25"})
	_, raw := e.schedule(pod)
	got := placed(t, raw)
	if len(got["c"]) != 1 {
		t.Fatalf("assignment %v", got)
	}
	// PreBind without a reservation is an error, never a silent success.
	cs := framework.NewCycleState()
	cs.Write(stateKey, &cycleState{info: &placement.PodInfo{}})
	if st := e.pl.PreBind(context.Background(), cs, pod, "n"); st.IsSuccess() {
		t.Error("PreBind without Reserve succeeded")
	}
}

// victim is a bound pod with a grant on one GPU of node.
func victim(t *testing.T, name, node string, mem int64, idx int) *v1.Pod {
	return bindPod(t, makePod(name, nil, ctr{Name: "c", GPU: "1", Mem: fmt.Sprint(mem)}), node, oneGrant(node, mem, 0, idx))
}

func TestPreemptionSimulation(t *testing.T) {
	// Two GPUs: A on GPU 0; B and C on GPU 1. A whole-GPU pod fits only once A
	// (the right GPU) or both B and C are removed.
	node := makeNode(t, "n", pcieInventory("n", 2, "Tesla T4", t4Mem))
	a, b, c := victim(t, "a", "n", 6000, 0), victim(t, "b", "n", 6000, 1), victim(t, "c", "n", 6000, 1)
	e := newEnv(t, nil, []*v1.Node{node}, a, b, c)
	ctx := context.Background()
	pod := makePod("big", nil, ctr{Name: "c", GPU: "1"})
	r := e.cycle(pod)
	if r.filter["n"].Code() != fwk.Unschedulable {
		t.Fatalf("Filter = %v, want Unschedulable (preemption candidate)", r.filter["n"])
	}
	info := func(p *v1.Pod) fwk.PodInfo {
		pi, err := framework.NewPodInfo(p)
		if err != nil {
			t.Fatal(err)
		}
		return pi
	}
	ni := e.infos[0]
	filter := func(cs fwk.CycleState) bool { return e.pl.Filter(ctx, cs, pod, ni).IsSuccess() }

	onlyB := r.state.Clone()
	if st := e.pl.RemovePod(ctx, onlyB, pod, info(b), ni); !st.IsSuccess() {
		t.Fatal(st)
	}
	if filter(onlyB) {
		t.Error("fits after removing only B, but C still holds GPU 1 and A holds GPU 0")
	}
	onlyA := r.state.Clone()
	e.pl.RemovePod(ctx, onlyA, pod, info(a), ni)
	if !filter(onlyA) {
		t.Error("does not fit after removing A from GPU 0")
	}
	// Adding A back (preemption's reprieve) makes it not fit again.
	e.pl.AddPod(ctx, onlyA, pod, info(a), ni)
	if filter(onlyA) {
		t.Error("fits after A was added back")
	}
	bc := r.state.Clone()
	e.pl.RemovePod(ctx, bc, pod, info(b), ni)
	e.pl.RemovePod(ctx, bc, pod, info(c), ni)
	if !filter(bc) {
		t.Error("does not fit after removing B and C from GPU 1")
	}
	// The original state is untouched by the clones.
	if filter(r.state) {
		t.Error("original cycle state changed by what-if clones")
	}
	// A nominated pod without grants is simulated: it takes GPU 0's room once A is gone.
	nominated := makePod("nominated", nil, ctr{Name: "c", GPU: "1", Mem: "12000"})
	withNom := r.state.Clone()
	e.pl.RemovePod(ctx, withNom, pod, info(a), ni)
	e.pl.AddPod(ctx, withNom, pod, info(nominated), ni)
	if filter(withNom) {
		t.Error("fits although the nominated pod takes the freed GPU")
	}
}

func TestQueueingHints(t *testing.T) {
	e := newEnv(t, nil, nil)
	logger := klog.Background()
	pod := makePod("p", nil, ctr{Name: "c", GPU: "1"})
	gpuPod := bindPod(t, makePod("g", nil, ctr{Name: "c", GPU: "1"}), "n", oneGrant("n", 100, 0, 0))
	cpuPod := makePod("cpu", nil)
	cpuPod.Spec.NodeName = "n"
	tests := []struct {
		name     string
		fn       func(klog.Logger, *v1.Pod, any, any) (fwk.QueueingHint, error)
		old, new any
		want     fwk.QueueingHint
	}{
		{"GPU pod deleted", e.pl.hintPodDeleted, gpuPod, nil, fwk.Queue},
		{"CPU pod deleted", e.pl.hintPodDeleted, cpuPod, nil, fwk.QueueSkip},
		{"node added with inventory", e.pl.hintNodeChanged, nil, h100(t, "n"), fwk.Queue},
		{"node added without inventory", e.pl.hintNodeChanged, nil, makeNode(t, "n", nil), fwk.QueueSkip},
		{"inventory changed", e.pl.hintNodeChanged, t4(t, "n"), h100(t, "n"), fwk.Queue},
		{"inventory unchanged", e.pl.hintNodeChanged, h100(t, "n"), h100(t, "n"), fwk.QueueSkip},
		{"requirements became met", e.pl.hintNodeChanged, nil, nil, fwk.Queue},
		{"requirements no longer met", e.pl.hintNodeChanged, nil, nil, fwk.QueueSkip},
	}
	// Two h100() calls give different heartbeats; make "unchanged" really unchanged.
	same := h100(t, "n")
	tests[5].old, tests[5].new = same, same.DeepCopy()
	unmet, met := same.DeepCopy(), same.DeepCopy()
	unmet.Annotations[api.AnnotationRequirements] = "cdi: the node's CDI spec could not be written"
	met.Annotations[api.AnnotationRequirements] = api.RequirementsMet
	tests[6].old, tests[6].new = unmet, met
	tests[7].old, tests[7].new = met, unmet
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.fn(logger, pod, tc.old, tc.new)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("hint = %v, want %v", got, tc.want)
			}
		})
	}
	events, err := e.pl.EventsToRegister(context.Background())
	if err != nil || len(events) != 2 {
		t.Fatalf("EventsToRegister = %v, %v", events, err)
	}
}

func TestSignPodGroupsIdenticalRequests(t *testing.T) {
	e := newEnv(t, nil, nil)
	sig := func(p *v1.Pod) any {
		f, st := e.pl.SignPod(context.Background(), p)
		if !st.IsSuccess() || len(f) != 1 {
			t.Fatalf("SignPod = %v, %v", f, st)
		}
		return fmt.Sprintf("%+v", f[0].Value)
	}
	a := sig(makePod("a", nil, ctr{Name: "c", GPU: "1", Mem: "1000"}))
	b := sig(makePod("b", nil, ctr{Name: "c", GPU: "1", Mem: "1000"}))
	c := sig(makePod("c", map[string]string{api.AnnotationModelInclude: "T4"}, ctr{Name: "c", GPU: "1", Mem: "1000"}))
	if a != b || a == c {
		t.Errorf("signatures a=%v b=%v c=%v: want a==b!=c", a, b, c)
	}
	if _, st := e.pl.SignPod(context.Background(), makePod("bad", nil, ctr{Name: "c", GPU: "0"})); st.IsSuccess() {
		t.Error("invalid pod signed")
	}
}

// Reserve takes Filter's allocation on the chosen node while the node's usage is the
// one Filter saw, and allocates again once it changed: here another pod took the GPU
// Filter had picked between the pod's Filter and its Reserve.
func TestReserveReusesFilterAllocationOnlyWhileUnchanged(t *testing.T) {
	node := makeNode(t, "two", pcieInventory("two", 2, "Tesla T4", t4Mem))
	e := newEnv(t, nil, []*v1.Node{node})
	ctx := context.Background()
	p := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "10000"})
	r := e.cycle(p)
	if r.best != "two" {
		t.Fatalf("Filter: %v", r.filter)
	}
	s, err := getState(r.state)
	if err != nil {
		t.Fatal(err)
	}
	entry, v, used := e.pl.cache.EntryView(node, nil)
	want, fail := placement.Allocate(v.Model, used, s.info, &e.pl.w)
	if fail != nil {
		t.Fatal(fail.Status())
	}
	var kept []placement.Grant
	if !entry.KeptAt(s.id, v.UsageGen, v.Model, func(a *placement.Allocation) { kept = grantsOf(v.Model, s.info, a) }) {
		t.Fatal("the node is unchanged since Filter, but its allocation is not offered to Reserve")
	}
	if !slices.Equal(kept, grantsOf(v.Model, s.info, want)) {
		t.Fatalf("Filter kept %v, allocate gives %v", kept, grantsOf(v.Model, s.info, want))
	}
	// Another pod takes the GPU Filter picked: 10,000 MiB of the T4's 15 GB, no room
	// for this pod's 10,000 MiB beside it.
	other := makePod("other", nil, ctr{Name: "c", GPU: "1", Mem: "10000"})
	if err := e.pl.cache.Assume(other, "two", kept, e.pl.w.MaxTenants); err != nil {
		t.Fatal(err)
	}
	if _, v2, _ := e.pl.cache.EntryView(node, nil); entry.KeptAt(s.id, v2.UsageGen, v2.Model, func(*placement.Allocation) {}) {
		t.Fatal("the node changed since Filter, but its allocation is still offered")
	}
	if st := e.pl.Reserve(ctx, r.state, p, "two"); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	got := e.pl.cache.PodGrants(p.UID, "two")
	if len(got) != 1 || got[0].UUID == kept[0].UUID {
		t.Fatalf("Reserve granted %v, beside the other pod's %v: it must take the other GPU", got, kept)
	}
}

// factoryHandle is a framework handle that only has an informer factory.
type factoryHandle struct {
	fwk.Handle
	f informers.SharedInformerFactory
}

func (h factoryHandle) SharedInformerFactory() informers.SharedInformerFactory { return h.f }

func (h factoryHandle) ProfileName() string { return "test-profile" }

func (h factoryHandle) SharedDRAManager() fwk.SharedDRAManager { return nil }

// Profiles of one scheduler share one cache; when the scheduler stops, the cache is
// forgotten.
func TestSharedCacheLifetime(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	h := factoryHandle{f: informers.NewSharedInformerFactory(fake.NewClientset(), 0)}
	a, _ := sharedCache(ctx, h)
	b, _ := sharedCache(ctx, h)
	if a != b {
		t.Fatal("two profiles of one scheduler got different caches")
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		sharedMu.Lock()
		_, kept := sharedCaches[h.f]
		sharedMu.Unlock()
		if !kept {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the cache of a stopped scheduler is still kept")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-dev/tessera/api"
)

// sharingNodes are "mixed", whose GPU 0 is in mps mode (room for two MPS clients)
// and GPU 1 time-sliced, and "ts", two time-sliced GPUs.
func sharingNodes(t *testing.T) []*v1.Node {
	inv := pcieInventory("mixed", 2, "NVIDIA H100 80GB HBM3", h100Mem)
	inv.GPUs[0].Sharing, inv.GPUs[0].MPSClients = api.SharingMPS, 2
	return []*v1.Node{makeNode(t, "mixed", inv), makeNode(t, "ts", pcieInventory("ts", 2, "NVIDIA H100 80GB HBM3", h100Mem))}
}

var mpsAnn = map[string]string{api.AnnotationSharing: "mps"}

// filterAll runs PreFilter and Filter on every node and returns each node's status
// ("" when it passes), or PreFilter's status under "PreFilter".
func filterAll(e *fwEnv, pod *v1.Pod) map[string]string {
	ctx := context.Background()
	state := framework.NewCycleState()
	if _, st, _ := e.f.RunPreFilterPlugins(ctx, state, pod); !st.IsSuccess() {
		return map[string]string{"PreFilter": st.Code().String() + ": " + st.Message()}
	}
	all, _ := e.snap.NodeInfos().List()
	out := map[string]string{}
	for _, ni := range all {
		st := e.f.RunFilterPlugins(ctx, state, pod, ni)
		if st.IsSuccess() {
			out[ni.Node().Name] = ""
		} else {
			out[ni.Node().Name] = st.Code().String() + ": " + st.Message()
		}
	}
	return out
}

func reservedOn(t *testing.T, e *fwEnv, node, pod string) []int {
	t.Helper()
	usage, err := e.pl.Cache().NodeUsage(node)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, d := range usage {
		for _, p := range d.Pods {
			if p == "default/"+pod {
				got = append(got, d.Index)
			}
		}
	}
	return got
}

// Under every policy an MPS pod lands on the MPS GPU and a time-sliced one never
// does, however attractive the policy finds it.
func TestSharingModeFilter(t *testing.T) {
	for _, p := range []Policy{Binpack, Spread, Fragmentation} {
		t.Run(string(p), func(t *testing.T) {
			e := newFwEnv(t, &TesseraGPUShareArgs{NodePolicy: p, DevicePolicy: p}, sharingNodes(t))
			if node, _ := e.schedule(makePod("m", mpsAnn, ctr{Name: "c", GPU: "1", Mem: "8000", Cores: "30"})); node != "mixed" {
				t.Fatalf("MPS pod on %s", node)
			}
			if got := reservedOn(t, e, "mixed", "m"); len(got) != 1 || got[0] != 0 {
				t.Errorf("MPS pod on GPUs %v, want [0]", got)
			}
			for i := 0; i < 3; i++ {
				name := "t" + string(rune('0'+i))
				node, _ := e.schedule(makePod(name, map[string]string{api.AnnotationSharing: "time-sliced"}, ctr{Name: "c", GPU: "1", Mem: "8000"}))
				if got := reservedOn(t, e, node, name); node == "mixed" && (len(got) != 1 || got[0] != 1) {
					t.Errorf("time-sliced pod %s on GPUs %v of mixed, want [1]", name, got)
				}
			}
		})
	}
}

func TestSharingModeReasons(t *testing.T) {
	e := newFwEnv(t, &TesseraGPUShareArgs{NodePolicy: Binpack, DevicePolicy: Binpack}, sharingNodes(t))
	got := filterAll(e, makePod("m", mpsAnn, ctr{Name: "c", GPU: "1", Mem: "8000"}))
	if got["mixed"] != "" || !strings.Contains(got["ts"], "UnschedulableAndUnresolvable: node has no GPU in mps sharing mode") {
		t.Errorf("MPS pod: %v", got)
	}
	// A time-sliced pod that needs both GPUs of a node fits only "ts".
	got = filterAll(e, makePod("two", nil, ctr{Name: "c", GPU: "2", Mem: "8000"}))
	if got["ts"] != "" || !strings.Contains(got["mixed"], "container \"c\" asks 2 GPUs; the node has 1 that match") {
		t.Errorf("two-GPU time-sliced pod: %v", got)
	}
	// A time-sliced pod that may use only the MPS GPU.
	got = filterAll(e, makePod("pin", map[string]string{api.AnnotationUUIDInclude: "GPU-mixed-0"}, ctr{Name: "c", GPU: "1"}))
	if !strings.Contains(got["mixed"], "node's GPUs are in mps sharing mode; only pods with tessera.dev/gpu-sharing: mps") {
		t.Errorf("time-sliced pod pinned to the MPS GPU: %v", got)
	}
	for ann, want := range map[string]string{"mps ": "", "exclusive": `"exclusive" is not one of time-sliced, mps`} {
		got = filterAll(e, makePod("a", map[string]string{api.AnnotationSharing: ann}, ctr{Name: "c", GPU: "1"}))
		if (want == "" && got["PreFilter"] != "") || (want != "" && !strings.Contains(got["PreFilter"], want)) {
			t.Errorf("annotation %q: %v", ann, got)
		}
	}
	// The work-conserving annotation moves no placement; a bad value, or one on an MPS
	// pod, keeps the pod pending with the reason.
	for _, tc := range []struct{ sharing, wc, want string }{
		{"", "true", ""}, {"", "false", ""}, {"", "yes", `tessera.dev/gpu-work-conserving: "yes" is not true or false`},
		{"mps", "true", "work-conserving pacing is for time-sliced GPUs"}, {"mps", "false", ""},
	} {
		ann := map[string]string{api.AnnotationWorkConserving: tc.wc}
		if tc.sharing != "" {
			ann[api.AnnotationSharing] = tc.sharing
		}
		got = filterAll(e, makePod("w", ann, ctr{Name: "c", GPU: "1"}))
		if (tc.want == "" && got["PreFilter"] != "") || (tc.want != "" && !strings.Contains(got["PreFilter"], tc.want)) {
			t.Errorf("sharing %q, work-conserving %q: %v", tc.sharing, tc.wc, got)
		}
	}
	got = filterAll(e, makePod("m2", mpsAnn, ctr{Name: "c", GPU: "2"}))
	if !strings.Contains(got["PreFilter"], "UnschedulableAndUnresolvable") || !strings.Contains(got["PreFilter"], "may take only one GPU per container") {
		t.Errorf("two-GPU MPS pod: %v", got)
	}
}

func TestMPSClientLimit(t *testing.T) {
	var pods []*v1.Pod
	for _, n := range []string{"a", "b"} {
		p := makePod(n, mpsAnn, ctr{Name: "c", GPU: "1", Mem: "1000"})
		pods = append(pods, bindPod(t, p, "mixed", oneGrant("mixed", 1000, 0, 0)))
	}
	e := newFwEnv(t, &TesseraGPUShareArgs{NodePolicy: Binpack, DevicePolicy: Binpack}, sharingNodes(t), pods...)
	got := filterAll(e, makePod("m", mpsAnn, ctr{Name: "c", GPU: "1", Mem: "1000"}))
	if got["mixed"] != fwk.Unschedulable.String()+`: node(s) had no MPS GPU with a client slot left for container "c"` {
		t.Errorf("third MPS client: %v", got)
	}
	// Time-sliced pods still use the node's other GPU.
	if got := filterAll(e, makePod("t", nil, ctr{Name: "c", GPU: "1", Mem: "1000"})); got["mixed"] != "" {
		t.Errorf("time-sliced pod beside full MPS GPU: %v", got)
	}
}

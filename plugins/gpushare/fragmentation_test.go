// SPDX-License-Identifier: Apache-2.0

package gpushare

// The fragmentation policy as the plugin runs it: profiles and args, PreFilter teaching
// the workload, Filter and Score choosing GPUs and nodes, the assignment written. The
// policy's own tests (its measure, pressure and fit index) are beside it, in
// internal/placement/fragmentation.

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/fragmentation"
)

func fragArgs() *TesseraGPUShareArgs {
	return &TesseraGPUShareArgs{NodePolicy: Fragmentation, DevicePolicy: Fragmentation}
}

// teach runs PreFilter for n pods of one shape so that the plugin learns the workload.
func teach(t testing.TB, e *env, n int, c ctr) {
	t.Helper()
	for i := 0; i < n; i++ {
		p := makePod(fmt.Sprintf("seen-%s-%d", c.Pct+c.GPU, i), nil, c)
		if _, st := e.pl.PreFilter(context.Background(), framework.NewCycleState(), p, nil); !st.IsSuccess() {
			t.Fatalf("PreFilter: %v", st)
		}
	}
}

func assignedIndexes(t *testing.T, raw string) []int {
	t.Helper()
	a, err := api.DecodeAssignment(raw)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, d := range a.Containers[0].Devices {
		out = append(out, d.Index)
	}
	return out
}

// The GPU chosen for a fraction keeps room for the shapes that come most often:
//
//	GPU  used  free   a 20% pod there leaves  usable by the 50% pods?
//	0    50%   0.5    0.3                     no: 0.3 of a GPU becomes fragment
//	1    30%   0.7    0.5                     yes
//	2,3   0%   1.0    0.8                     yes
//
// Fragmentation takes GPU 1 (no new fragment; the fuller of the tied GPUs), Binpack
// takes GPU 0 (the fullest that fits).
func TestFragmentationDevicePlacement(t *testing.T) {
	for _, tc := range []struct {
		args *TesseraGPUShareArgs
		want int
	}{
		{fragArgs(), 1},
		{&TesseraGPUShareArgs{NodePolicy: Fragmentation, DevicePolicy: Binpack}, 0},
	} {
		t.Run(string(tc.args.DevicePolicy), func(t *testing.T) {
			node := makeNode(t, "t4", pcieInventory("t4", 4, "NVIDIA T4", t4Mem))
			e := newEnv(t, tc.args, []*v1.Node{node},
				bindPod(t, makePod("half", nil, ctr{Name: "c", GPU: "1", Pct: "50", Cores: "50"}), "t4", oneGrant("t4", t4Mem/2, 50, 0)),
				bindPod(t, makePod("third", nil, ctr{Name: "c", GPU: "1", Pct: "30", Cores: "30"}), "t4", oneGrant("t4", t4Mem*30/100, 30, 1)))
			teach(t, e, 50, ctr{Name: "c", GPU: "1", Pct: "50", Cores: "50"})
			_, raw := e.schedule(makePod("small", nil, ctr{Name: "c", GPU: "1", Pct: "20", Cores: "20"}))
			if got := assignedIndexes(t, raw); len(got) != 1 || got[0] != tc.want {
				t.Errorf("placed on GPU %v, want %d", got, tc.want)
			}
		})
	}
}

// Node choice: the workload is whole GPUs. A half-used GPU on node "holey" is already
// a fragment; putting the 50% pod there removes it (−0.5 GPU), while the empty node
// would gain one (+0.5 GPU).
func TestFragmentationNodeScoring(t *testing.T) {
	holey := makeNode(t, "holey", pcieInventory("holey", 2, "NVIDIA T4", t4Mem))
	empty := makeNode(t, "empty", pcieInventory("empty", 2, "NVIDIA T4", t4Mem))
	e := newEnv(t, fragArgs(), []*v1.Node{holey, empty},
		bindPod(t, makePod("half", nil, ctr{Name: "c", GPU: "1", Pct: "50", Cores: "50"}), "holey", oneGrant("holey", t4Mem/2, 50, 0)))
	teach(t, e, 20, ctr{Name: "c", GPU: "1", Cores: "100"})
	r := e.cycle(makePod("p", nil, ctr{Name: "c", GPU: "1", Pct: "50", Cores: "50"}))
	if r.scores["holey"] <= r.scores["empty"] {
		t.Fatalf("raw scores %v: the node whose fragment the pod fills must win", r.scores)
	}
	// Raw scores are minus the fragmentation increase in 1/1000 GPU: the learned
	// workload is 20 whole-GPU pods and this one 50% pod (weights 20/21 and 1/21);
	// the best-fit term charges what is left: one GPU of the largest node's two,
	// weighted ½ (the test nodes publish no CPU).
	wantHoley := int64(math.Round(fragmentation.Scale * (0.5*20/21 - fragmentation.FitWeight*0.5*1/2)))
	if r.scores["holey"] != wantHoley {
		t.Errorf("holey raw score %d, want %d", r.scores["holey"], wantHoley)
	}
	list := fwk.NodeScoreList{{Name: "holey", Score: r.scores["holey"]}, {Name: "empty", Score: r.scores["empty"]}}
	if st := e.pl.ScoreExtensions().NormalizeScore(context.Background(), r.state, nil, list); !st.IsSuccess() || list[0].Score != 100 || list[1].Score != max(0, 100-(r.scores["holey"]-r.scores["empty"])/fragmentation.Step) {
		t.Errorf("normalised %v, %v", list, st)
	}
	if e.pl.ScoreExtensions() == nil {
		t.Error("Fragmentation needs NormalizeScore")
	}
	if b := newEnv(t, nil, []*v1.Node{holey}); b.pl.ScoreExtensions() != nil {
		t.Error("Binpack scores must stay unnormalised")
	}
}

// Multi-GPU pods still get NVLinked GPUs, and the fragmentation score does not break
// the topology preference.
func TestFragmentationMultiGPU(t *testing.T) {
	nv := makeNode(t, "nv", nvlinkInventory("nv", 8, 4, "NVIDIA H100", h100Mem))
	e := newEnv(t, fragArgs(), []*v1.Node{nv},
		bindPod(t, makePod("w", nil, ctr{Name: "c", GPU: "1"}), "nv", oneGrant("nv", h100Mem, 100, 0)))
	teach(t, e, 10, ctr{Name: "c", GPU: "1", Pct: "50", Cores: "50"})
	_, raw := e.schedule(makePod("pair", nil, ctr{Name: "c", GPU: "2", Cores: "100"}))
	got := assignedIndexes(t, raw)
	if len(got) != 2 || got[0]/4 != got[1]/4 {
		t.Errorf("2-GPU pod got GPUs %v, want two of one NVLink island", got)
	}
	_, raw = e.schedule(makePod("quad", nil, ctr{Name: "c", GPU: "4", Cores: "100"}))
	got = assignedIndexes(t, raw)
	if len(got) != 4 || got[0]/4 != got[3]/4 {
		t.Errorf("4-GPU pod got GPUs %v, want a whole island", got)
	}
}

func TestFragmentationArgs(t *testing.T) {
	a, err := DecodeArgs(fragArgs(), Defaults{})
	if err != nil || a.FragmentationWindow != fragmentation.DefaultWindow {
		t.Fatalf("%+v %v", a, err)
	}
	if p, err := ParsePolicy("fragmentation"); err != nil || p != Fragmentation {
		t.Errorf("ParsePolicy: %v %v", p, err)
	}
	bad := fragArgs()
	bad.FragmentationWindow = -1
	if _, err := DecodeArgs(bad, Defaults{}); err == nil {
		t.Error("negative window accepted")
	}
}

// A CPU-only pod goes where CPU is to spare beyond what the node's GPUs need. On
// "tight" (2 GPUs, 24 cores) its 12 cores leave exactly one learned GPU pod's CPU: the
// per-pod check still passes, but the second GPU can no longer be fed. "roomy" (2 GPUs,
// 104 cores) loses nothing.
func TestFragmentationKeepsCPUForGPUs(t *testing.T) {
	e := newEnv(t, fragArgs(), []*v1.Node{hostNode(t, "tight", 2, "24"), hostNode(t, "roomy", 2, "104")})
	for i := 0; i < 20; i++ {
		p := makePod(fmt.Sprintf("seen-%d", i), nil, ctr{Name: "c", GPU: "1", Cores: "100"})
		p.Spec.Containers[0].Resources.Requests = withHost("12", "48Gi")
		if _, st := e.pl.PreFilter(context.Background(), framework.NewCycleState(), p, nil); !st.IsSuccess() {
			t.Fatal(st)
		}
	}
	cpuPod := makePod("cpu", nil, ctr{Name: "c"})
	cpuPod.Spec.Containers[0].Resources.Requests = withHost("12", "1Gi")
	if scores := e.scoreCPUPod(cpuPod); scores["roomy"] <= scores["tight"] {
		t.Errorf("CPU-only pod scored %v: want roomy first", scores)
	}
	// A pod with ResourceClaims is not scored as one without GPUs (its GPUs may be
	// claims, TesseraDynamicResources' to score): PreScore skips it.
	claimPod := cpuPod.DeepCopy()
	claimPod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: new("share")}}
	cs := framework.NewCycleState()
	e.pl.PreFilter(context.Background(), cs, claimPod, e.infos)
	if st := e.pl.PreScore(context.Background(), cs, claimPod, e.infos); !st.IsSkip() {
		t.Errorf("PreScore of a claim pod: %v, want Skip", st)
	}
	// The same for a GPU pod heavy on CPU (24 cores for one GPU): on tight it would
	// leave the other GPU without CPU.
	heavy := makePod("heavy", nil, ctr{Name: "c", GPU: "1", Cores: "100"})
	heavy.Spec.Containers[0].Resources.Requests = withHost("24", "1Gi")
	if r := e.cycle(heavy); r.best != "roomy" {
		t.Errorf("CPU-heavy GPU pod scored %v: want roomy", r.scores)
	}
}

// Score takes the device pick's measure when the node's CPU and memory hold back no
// learned shape; the score must be the one measuring the node again gives, on nodes
// where that shortcut applies and where it does not.
func TestFragScorePickedMatchesMeasured(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	var nodes []*v1.Node
	var pods []*v1.Pod
	for n := 0; n < 12; n++ {
		name := fmt.Sprintf("n%d", n)
		node := h100(t, name)
		if n%3 == 0 {
			node = hostNode(t, name, 4, fmt.Sprint(8+4*rng.Intn(8)))
		}
		nodes = append(nodes, node)
		for i := 0; i < 3; i++ {
			pct := 10 + 10*rng.Intn(8)
			pods = append(pods, bindPod(t, makePod(fmt.Sprintf("%s-b%d", name, i), nil, ctr{Name: "c", GPU: "1"}), name, oneGrant(name, int64(pct)*150, pct, rng.Intn(4))))
		}
	}
	e := newEnv(t, fragArgs(), nodes, pods...)
	// The learned workload's largest host requests: every pod asks 1Gi, and the
	// window holds every pod PreFilter has seen.
	maxCPU, maxMem := int64(0), int64(1<<30)
	for k := 0; k < 30; k++ {
		pct := fmt.Sprint(5 + 5*rng.Intn(19))
		p := makePod(fmt.Sprintf("seen-%d", k), nil, ctr{Name: "c", GPU: "1", Pct: pct, Cores: pct})
		cores := 1 + rng.Intn(6)
		maxCPU = max(maxCPU, int64(cores)*1000)
		p.Spec.Containers[0].Resources.Requests = withHost(fmt.Sprint(cores), "1Gi")
		if _, st := e.pl.PreFilter(context.Background(), framework.NewCycleState(), p, nil); !st.IsSuccess() {
			t.Fatal(st)
		}
	}
	fast, slow := 0, 0
	for k := 0; k < 20; k++ {
		pct := fmt.Sprint(5 + 5*rng.Intn(19))
		pod := makePod(fmt.Sprintf("p%d", k), nil, ctr{Name: "c", GPU: "1", Pct: pct, Cores: pct})
		cores := 1 + rng.Intn(4)
		maxCPU = max(maxCPU, int64(cores)*1000)
		pod.Spec.Containers[0].Resources.Requests = withHost(fmt.Sprint(cores), "1Gi")
		ctx, cs := context.Background(), framework.NewCycleState()
		if _, st := e.pl.PreFilter(ctx, cs, pod, e.infos); !st.IsSuccess() {
			t.Fatal(st)
		}
		var feasible []fwk.NodeInfo
		for _, ni := range e.infos {
			if e.pl.Filter(ctx, cs, pod, ni).IsSuccess() {
				feasible = append(feasible, ni)
			}
		}
		if st := e.pl.PreScore(ctx, cs, pod, feasible); !st.IsSuccess() {
			t.Fatal(st)
		}
		s, err := getState(cs)
		if err != nil {
			t.Fatal(err)
		}
		for _, ni := range feasible {
			e.pl.cache.ExistingFor(ni.Node()).WithKept(s.id, func(a *placement.Allocation) {
				kept := a.Measured
				got := e.pl.node.ScoreNode(s.info, a, ni, s.fit, &e.pl.w)
				a.Measured = nil
				want := e.pl.node.ScoreNode(s.info, a, ni, s.fit, &e.pl.w)
				a.Measured = kept
				if got != want {
					t.Errorf("pod %d, node %s: score %d from the pick's measure, %d measured", k, ni.Node().Name, got, want)
				}
				cpu, mem := placement.HostFree(ni)
				if kept != nil && maxCPU <= cpu-s.info.CPUMilli && maxMem <= mem-s.info.MemBytes {
					fast++
				} else {
					slow++
				}
			})
		}
	}
	if fast == 0 || slow == 0 {
		t.Errorf("%d scores took the pick's measure and %d measured: the test wants both", fast, slow)
	}
}

// Keeping scarce models free: the window holds as many pods that require a T4 as pods
// that run anywhere, and the cluster has two T4s and two A10s. An unconstrained
// whole-GPU pod fragments either node alike, so the T4 node scores lower by its
// pressure (the pod is the window's 22nd: 11/22 of the demand needs the 2 T4s of 4
// GPUs, 11/22·4/2 = 1) times the one GPU taken: 1 GPU = 1000 raw points. Without
// constrained pods the pressure is nil.
func TestFragmentationKeepsScarceModelFree(t *testing.T) {
	t4 := makeNode(t, "t4", pcieInventory("t4", 2, "NVIDIA T4", t4Mem))
	a10 := makeNode(t, "a10", pcieInventory("a10", 2, "NVIDIA A10", t4Mem))
	e := newEnv(t, fragArgs(), []*v1.Node{t4, a10})
	teach(t, e, 10, ctr{Name: "c", GPU: "1", Cores: "100"})
	if p := e.pl.workload.PressureNow(); p != nil {
		t.Fatalf("pressure %+v without constrained pods", p)
	}
	for i := 0; i < 11; i++ {
		p := makePod(fmt.Sprintf("needs-t4-%d", i), map[string]string{api.AnnotationModelInclude: "T4"}, ctr{Name: "c", GPU: "1", Cores: "100"})
		if _, st := e.pl.PreFilter(context.Background(), framework.NewCycleState(), p, nil); !st.IsSuccess() {
			t.Fatalf("PreFilter: %v", st)
		}
	}
	r := e.cycle(makePod("anywhere", nil, ctr{Name: "c", GPU: "1", Cores: "100"}))
	if d := r.scores["a10"] - r.scores["t4"]; d < 999 || d > 1001 {
		t.Errorf("raw scores %v: the A10 node must win by 1000 (one GPU at pressure 1)", r.scores)
	}
	if r.best != "a10" {
		t.Errorf("placed on %q, want a10", r.best)
	}
}

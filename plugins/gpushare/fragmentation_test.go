package gpushare

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"sort"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
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
	wantHoley := int64(math.Round(placement.FragScale * (0.5*20/21 - placement.FragFitWeight*0.5*1/2)))
	if r.scores["holey"] != wantHoley {
		t.Errorf("holey raw score %d, want %d", r.scores["holey"], wantHoley)
	}
	list := fwk.NodeScoreList{{Name: "holey", Score: r.scores["holey"]}, {Name: "empty", Score: r.scores["empty"]}}
	if st := e.pl.ScoreExtensions().NormalizeScore(context.Background(), r.state, nil, list); !st.IsSuccess() || list[0].Score != 100 || list[1].Score != max(0, 100-(r.scores["holey"]-r.scores["empty"])/placement.FragStep) {
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

func TestWorkloadModelWindow(t *testing.T) {
	w := placement.NewWorkloadModel(3)
	s := func(pct int) placement.FragShape {
		info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: 1, MemoryPercent: pct, Cores: pct}}}, Order: []int{0}}
		return placement.ShapeOf(info)
	}
	w.Observe("a", s(10))
	w.Observe("a", s(10)) // a retry is not counted twice
	w.Observe("b", s(20))
	w.Observe("c", s(20))
	wl := w.Snapshot()
	got := wl.Shapes
	if len(got) != 2 || got[0].C.MemoryPercent != 20 || math.Abs(wl.Terms[0].Weight-2.0/3) > 1e-9 {
		t.Fatalf("snapshot %+v, terms %+v", got, wl.Terms)
	}
	w.Observe("d", s(30)) // evicts "a"
	wl = w.Snapshot()
	got = wl.Shapes
	total := 0.0
	for k, x := range got {
		total += wl.Terms[k].Weight
		if x.C.MemoryPercent == 10 {
			t.Errorf("evicted shape still present: %+v", got)
		}
	}
	if math.Abs(total-1) > 1e-9 || len(got) != 2 {
		t.Errorf("weights %v", got)
	}
	w.Observe("a", s(10)) // "a" left the window, so it counts again
	if len(w.Snapshot().Shapes) != 3 {
		t.Errorf("re-observed pod not counted: %+v", w.Snapshot().Shapes)
	}
	// 100 shapes that differ only in CPU: the top ones are kept.
	many := placement.NewWorkloadModel(1000)
	for i := 0; i < 100; i++ {
		info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: 1, MemoryPercent: 10, Cores: 10}}}, Order: []int{0}, CPUMilli: int64(1000 * (i + 1))}
		many.Observe(types.UID(fmt.Sprint(i)), placement.ShapeOf(info))
	}
	if n := len(many.Snapshot().Shapes); n != placement.MaxFragShapes {
		t.Errorf("%d shapes kept, want %d", n, placement.MaxFragShapes)
	}
	// A rare GPU request beyond the top shapes is still represented.
	many.Observe("big", placement.ShapeOf(&placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: 8, Cores: 100}}}, Order: []int{0}}))
	found := false
	for _, x := range many.Snapshot().Shapes {
		found = found || x.C.GPUs == 8
	}
	if !found {
		t.Error("the 8-GPU shape was dropped")
	}
}

func TestFragmentationArgs(t *testing.T) {
	a, err := DecodeArgs(fragArgs(), Defaults{})
	if err != nil || a.FragmentationWindow != placement.DefaultFragmentationWindow {
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

// Score measures a node's fragmentation after a placement by re-measuring only the
// devices placed on; that must equal measuring the whole node again.
func TestFragStatsPlacedMatchesFullMeasure(t *testing.T) {
	e := newEnv(t, fragArgs(), []*v1.Node{h100(t, "n")})
	m := e.pl.cache.Existing("n").Model
	w := &e.pl.w
	rng := rand.New(rand.NewSource(7))
	var shapes []placement.FragShape
	var weights []float64
	for k := 0; k < 12; k++ {
		g := 1
		if k%5 == 4 {
			g = 2 + rng.Intn(3)
		}
		pct := int64(5 + rng.Intn(95))
		shapes = append(shapes, placement.FragShape{FragClass: placement.FragClass{C: api.ContainerRequest{GPUs: g, MemoryPercent: int(pct), Cores: int(pct)}}})
		weights = append(weights, 1.0/12)
	}
	wl := placement.NewFragWorkload(shapes, weights)
	for trial := 0; trial < 500; trial++ {
		used := make([]placement.Usage, len(m.Devices))
		for i := range used {
			if rng.Intn(3) > 0 {
				pct := int64(rng.Intn(90))
				used[i] = placement.Usage{MemMiB: m.Devices[i].MemoryMiB * pct / 100, Cores: int(pct), Tenants: 1}
			}
		}
		g := 1 + rng.Intn(3)
		pct := int64(5 + rng.Intn(40))
		p := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{Name: "c", GPUs: g, MemoryPercent: int(pct), Cores: int(pct)}}}, Order: []int{0}, Device: placement.PlacerFactories[Binpack](nil)}
		a, fail := placement.Allocate(m, used, p, w)
		if fail != nil {
			continue
		}
		got := placement.NewFragStats(m, used, wl, w).Placed(m, a, wl, w)
		want := placement.NewFragStats(m, a.Used, wl, w)
		if math.Abs(got.Value(wl, nil)-want.Value(wl, nil)) > 1e-9 || math.Abs(got.Total-want.Total) > 1e-9 {
			t.Fatalf("trial %d: placed %v (total %v), measured again %v (total %v)", trial, got.Value(wl, nil), got.Total, want.Value(wl, nil), want.Total)
		}
		for k := range wl.Classes {
			if got.Fits[k] != want.Fits[k] || got.Mask[k] != want.Mask[k] {
				t.Fatalf("trial %d class %d: fits %d/%b, measured again %d/%b", trial, k, got.Fits[k], got.Mask[k], want.Fits[k], want.Mask[k])
			}
		}
	}
}

func TestWorkloadFeed(t *testing.T) {
	m := &placement.NodeModel{Hot: []placement.DeviceHot{{MemoryMiB: 16000, Healthy: true}}}
	w := &placement.Weights{Memory: 1, Cores: 1}
	shapes := []placement.FragShape{
		{FragClass: placement.FragClass{C: api.ContainerRequest{GPUs: 1, Cores: 100}}, CPUMilli: 12000, MemBytes: 48 << 30},                // a whole GPU
		{FragClass: placement.FragClass{C: api.ContainerRequest{GPUs: 1, MemoryMiB: 8000, Cores: 50}}, CPUMilli: 6000, MemBytes: 24 << 30}, // half of one
	}
	r := placement.WorkloadFeed(placement.NewFragWorkload(shapes, []float64{0.5, 0.5}), m, w)
	// 0.5·12000 + 0.5·6000 millicores for 0.5·1 + 0.5·0.5 GPUs.
	if math.Abs(r.CPUMilli-12000) > 1e-6 || math.Abs(r.MemBytes-float64(48<<30)) > 1 {
		t.Fatalf("feed %+v, want 12000 millicores and 48 GiB per GPU", r)
	}
	for _, tc := range []struct {
		free     float64
		cpu, mem int64
		want     float64
		what     string
	}{
		{8, 96000, 400 << 30, 0, "CPU and memory for every free GPU"},
		{8, 48000, 400 << 30, 4, "CPU for half of them"},
		{8, 96000, 96 << 30, 6, "memory for two"},
		{2, -5000, 400 << 30, 2, "CPU overcommitted"},
		{0, 0, 0, 0, "no free GPU"},
	} {
		if got := r.Unfed(tc.free, tc.cpu, tc.mem); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: unfed = %v, want %v", tc.what, got, tc.want)
		}
	}
	if got := placement.WorkloadFeed(nil, m, w).Unfed(8, 0, 0); got != 0 {
		t.Errorf("no workload learned: unfed = %v, want 0", got)
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
	// The same for a GPU pod heavy on CPU (24 cores for one GPU): on tight it would
	// leave the other GPU without CPU.
	heavy := makePod("heavy", nil, ctr{Name: "c", GPU: "1", Cores: "100"})
	heavy.Spec.Containers[0].Resources.Requests = withHost("24", "1Gi")
	if r := e.cycle(heavy); r.best != "roomy" {
		t.Errorf("CPU-heavy GPU pod scored %v: want roomy", r.scores)
	}
}

// A class's eligibility (with its fast path for classes without a model selection)
// agrees with the pod selection it was learned from, on MIG and whole devices.
func TestFragShapeEligibleMatchesPod(t *testing.T) {
	m := &placement.NodeModel{
		Devices: []placement.Device{{Model: "NVIDIA H100 80GB HBM3"}, {Model: "NVIDIA H100 80GB HBM3 MIG 1g.10gb", MIG: true}, {Model: "Tesla T4"}},
		Hot:     []placement.DeviceHot{{}, {MIG: true}, {}},
	}
	for _, sel := range []struct{ include, exclude []string }{
		{}, {include: []string{"h100"}}, {include: []string{"mig 1g"}}, {exclude: []string{"t4"}}, {include: []string{"h100"}, exclude: []string{"mig"}},
	} {
		p := placement.PodInfo{ModelInclude: sel.include, ModelExclude: sel.exclude}
		s := placement.FragClass{ModelInclude: sel.include, ModelExclude: sel.exclude}
		for i := range m.Devices {
			if got, want := s.EligibleAt(m, i), p.Eligible(&m.Devices[i]); got != want {
				t.Errorf("selection %+v, device %q: shape %v, pod %v", sel, m.Devices[i].Model, got, want)
			}
		}
	}
}

// TestFragBaseKeptAndInvalidated checks the measure the cache keeps per node: it is
// reused while neither the node's usage nor the learned GPU requests change (the
// shapes' order, weights and host requests may), and after every kind of change it is
// exactly what measuring the node again gives.
func TestFragBaseKeptAndInvalidated(t *testing.T) {
	e := newEnv(t, fragArgs(), []*v1.Node{h100(t, "n")})
	c, w := e.pl.cache, &e.pl.w
	learn := func(prefix string, n int, ct ctr) {
		for i := 0; i < n; i++ {
			p := makePod(fmt.Sprintf("%s-%d", prefix, i), nil, ct)
			if _, st := e.pl.PreFilter(context.Background(), framework.NewCycleState(), p, nil); !st.IsSuccess() {
				t.Fatalf("PreFilter: %v", st)
			}
		}
	}
	check := func(step string) *placement.FragStats {
		t.Helper()
		wl := e.pl.workload.Snapshot()
		ent, v, used := c.EntryView(e.nodes[0], nil)
		got := ent.FragBase(&v, used, &placement.PodInfo{Frag: wl}, w)
		want := placement.NewFragStats(v.Model, used, wl, w)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: kept measure %+v, measured again %+v", step, got, want)
		}
		return got
	}
	learn("a", 3, ctr{Name: "c", GPU: "1", Pct: "20", Cores: "20"})
	learn("b", 2, ctr{Name: "c", GPU: "1", Pct: "60", Cores: "60"})
	learn("c", 1, ctr{Name: "c", GPU: "2", Cores: "100"})
	first := check("first measure")
	if again := check("unchanged"); again != first {
		t.Error("the node was measured again though nothing changed")
	}

	pod := makePod("placed", nil, ctr{Name: "c", GPU: "1", Pct: "60", Cores: "60"})
	if err := c.Assume(pod, "n", placement.RecordFromAssignment(pod, oneGrant("n", h100Mem/2, 60, 0)).Grants, 10); err != nil {
		t.Fatal(err)
	}
	if check("after Assume") == first {
		t.Error("the measure of the node before Assume was kept")
	}
	c.Forget(pod.UID)
	check("after Forget")
	if err := c.OnPod(bindPod(t, makePod("bound", nil, ctr{Name: "c", GPU: "1"}), "n", oneGrant("n", h100Mem, 100, 3))); err != nil {
		t.Fatal(err)
	}
	check("after an informer pod event")
	c.SetInventory("n", mustEncode(t, pcieInventory("n", 4, "NVIDIA H100", h100Mem)))
	check("after an inventory change")
	c.OnPodDelete(types.UID("uid-bound"))
	check("after an informer pod delete")

	// The same shapes in another order, then a new shape of a known GPU request (other
	// host requests): the kept measure serves both.
	kept := check("before the shapes change")
	before := e.pl.workload.Snapshot()
	learn("c2", 4, ctr{Name: "c", GPU: "2", Cores: "100"})
	after := e.pl.workload.Snapshot()
	if after.Gen != before.Gen || after.Shapes[0].Key == before.Shapes[0].Key {
		t.Fatalf("shapes %v (generation %d) then %v (%d): want the same classes, another order", before.Shapes, before.Gen, after.Shapes, after.Gen)
	}
	if check("after the shapes' order changed") != kept {
		t.Error("the node was measured again for the same GPU requests in another order")
	}
	host := makePod("host", nil, ctr{Name: "c", GPU: "2", Cores: "100"})
	host.Spec.Containers[0].Resources.Requests = withHost("8", "16Gi")
	if _, st := e.pl.PreFilter(context.Background(), framework.NewCycleState(), host, nil); !st.IsSuccess() {
		t.Fatal(st)
	}
	if wl := e.pl.workload.Snapshot(); wl.Gen != after.Gen || len(wl.Shapes) != len(after.Shapes)+1 {
		t.Fatalf("a shape of a known GPU request: %d shapes, generation %d; want %d shapes, generation %d", len(wl.Shapes), wl.Gen, len(after.Shapes)+1, after.Gen)
	}
	if check("after a new shape of a known GPU request") != kept {
		t.Error("the node was measured again for a shape of a known GPU request")
	}
	learn("d", 1, ctr{Name: "c", GPU: "1", Pct: "5", Cores: "5"})
	if wl := e.pl.workload.Snapshot(); wl.Gen == after.Gen {
		t.Fatalf("a new GPU request kept the class generation %d", wl.Gen)
	}
	if check("after a new GPU request") == kept {
		t.Error("the measure of the old GPU requests was kept for a new one")
	}
}

// TestFragBaseConcurrent measures one node from many goroutines, as the parallel
// Filter does across cycles, while pods are assumed and forgotten on it: the measure
// kept at the end is the node's as it is then (run with -race for the lock-free
// reads and stores).
func TestFragBaseConcurrent(t *testing.T) {
	e := newEnv(t, fragArgs(), []*v1.Node{h100(t, "n")})
	c, w := e.pl.cache, &e.pl.w
	teach(t, e, 3, ctr{Name: "c", GPU: "1", Pct: "20", Cores: "20"})
	teach(t, e, 2, ctr{Name: "c", GPU: "2", Cores: "100"})
	wl := e.pl.workload.Snapshot()
	p := &placement.PodInfo{Frag: wl}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if g == 0 {
					pod := makePod(fmt.Sprintf("p%d", i), nil, ctr{Name: "c", GPU: "1"})
					if c.Assume(pod, "n", placement.RecordFromAssignment(pod, oneGrant("n", 1000, 5, i%8)).Grants, 10) == nil && i%2 == 0 {
						c.Forget(pod.UID)
					}
					continue
				}
				ent, v, used := c.EntryView(e.nodes[0], nil)
				if st := ent.FragBase(&v, used, p, w); !reflect.DeepEqual(st, placement.NewFragStats(v.Model, used, wl, w)) {
					t.Errorf("measure of usage generation %d differs from the node's", v.UsageGen)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	ent, v, used := c.EntryView(e.nodes[0], nil)
	if st := ent.FragBase(&v, used, p, w); !reflect.DeepEqual(st, placement.NewFragStats(v.Model, used, wl, w)) {
		t.Error("the kept measure is not the node's")
	}
}

// The statistics kept per class give the fragmentation measured shape by shape (the
// definition), before and after a container is placed on any device, for shapes that
// share GPU requests and differ in host requests: the same up to rounding, since the
// shapes of a class are summed as one term (the last bits of the sum may differ); and
// the device pick's measure after placing is bit for bit the node-level score's.
func TestFragClassesMatchPerShapeMeasure(t *testing.T) {
	e := newEnv(t, fragArgs(), []*v1.Node{h100(t, "n")})
	m := e.pl.cache.Existing("n").Model
	w := &e.pl.w
	rng := rand.New(rand.NewSource(11))
	var shapes []placement.FragShape
	var weights []float64
	for k := 0; k < 20; k++ {
		g, pct := 1, 5+5*rng.Intn(19)
		if k%7 == 6 {
			g, pct = 2+rng.Intn(3), 100
		}
		shapes = append(shapes, placement.FragShape{FragClass: placement.FragClass{C: api.ContainerRequest{GPUs: g, MemoryPercent: pct, Cores: pct}},
			CPUMilli: int64(1000 * (1 + rng.Intn(4)))})
		weights = append(weights, float64(1+rng.Intn(5))/60)
	}
	wl := placement.NewFragWorkload(shapes, weights)
	if len(wl.Classes) >= len(shapes) {
		t.Fatalf("%d classes for %d shapes: the test wants shapes that share GPU requests", len(wl.Classes), len(shapes))
	}
	// perShape is the fragmentation of the node under used, shape by shape.
	perShape := func(used []placement.Usage) float64 {
		var total, f float64
		for i := range m.Devices {
			total += placement.DeviceFree(m, used, i, w)
		}
		for k := range shapes {
			fit, small := 0, 0.0
			for i := range m.Devices {
				if placement.ShapeFits(m, used, &shapes[k].FragClass, i, w) {
					fit++
				} else {
					small += placement.DeviceFree(m, used, i, w)
				}
			}
			if fit < shapes[k].C.GPUs {
				f += weights[k] * total
			} else {
				f += weights[k] * small
			}
		}
		return f
	}
	c := &api.ContainerRequest{GPUs: 1, MemoryPercent: 10, Cores: 10}
	for trial := 0; trial < 300; trial++ {
		used := make([]placement.Usage, len(m.Devices))
		for i := range used {
			if rng.Intn(3) > 0 {
				pct := int64(rng.Intn(95))
				used[i] = placement.Usage{MemMiB: m.Devices[i].MemoryMiB * pct / 100, Cores: int(pct), Tenants: 1}
			}
		}
		st := placement.NewFragStats(m, used, wl, w)
		if got, want := st.Value(wl, nil), perShape(used); math.Abs(got-want) > 1e-12 {
			t.Fatalf("trial %d: per class %v, per shape %v", trial, got, want)
		}
		for i := range m.Devices {
			if !placement.Fits(m, used, c, i, w.MaxTenants) {
				continue
			}
			after := append([]placement.Usage(nil), used...)
			after[i].MemMiB += c.MemoryOn(m.Devices[i].MemoryMiB)
			after[i].Cores += c.Cores
			after[i].Tenants++
			got, total := placement.FragAfter(m, used, st, wl, c, i, w)
			if want := perShape(after); math.Abs(got-want) > 1e-12 {
				t.Fatalf("trial %d, device %d: after placing, per class %v, per shape %v", trial, i, got, want)
			}
			// Score takes the pick's figures for what placedInto and value give: they
			// must be the same bits.
			placed := st.Placed(m, &placement.Allocation{Placements: []placement.Placement{{Devices: []int{i}}}, Used: after}, wl, w)
			if v := placed.Value(wl, nil); got != v || total != placed.Total {
				t.Fatalf("trial %d, device %d: the pick measured %v (total %v), placedInto %v (total %v)", trial, i, got, total, v, placed.Total)
			}
		}
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
	for k := 0; k < 30; k++ {
		pct := fmt.Sprint(5 + 5*rng.Intn(19))
		p := makePod(fmt.Sprintf("seen-%d", k), nil, ctr{Name: "c", GPU: "1", Pct: pct, Cores: pct})
		p.Spec.Containers[0].Resources.Requests = withHost(fmt.Sprint(1+rng.Intn(6)), "1Gi")
		if _, st := e.pl.PreFilter(context.Background(), framework.NewCycleState(), p, nil); !st.IsSuccess() {
			t.Fatal(st)
		}
	}
	fast, slow := 0, 0
	for k := 0; k < 20; k++ {
		pct := fmt.Sprint(5 + 5*rng.Intn(19))
		pod := makePod(fmt.Sprintf("p%d", k), nil, ctr{Name: "c", GPU: "1", Pct: pct, Cores: pct})
		pod.Spec.Containers[0].Resources.Requests = withHost(fmt.Sprint(1+rng.Intn(4)), "1Gi")
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
			e.pl.cache.Existing(ni.Node().Name).WithKept(s.id, func(a *placement.Allocation) {
				kept := a.Measured
				got := e.pl.node.ScoreNode(s.info, a, ni, s.fit, &e.pl.w)
				a.Measured.Picked = false
				want := e.pl.node.ScoreNode(s.info, a, ni, s.fit, &e.pl.w)
				a.Measured = kept
				if got != want {
					t.Errorf("pod %d, node %s: score %d from the pick's measure, %d measured", k, ni.Node().Name, got, want)
				}
				cpu, mem := placement.HostFree(ni)
				if kept.Picked && s.info.Frag.MaxCPUMilli <= cpu-s.info.CPUMilli && s.info.Frag.MaxMemBytes <= mem-s.info.MemBytes {
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

// The workload model keeps its shapes ordered as pods come and leave the window; every
// snapshot must be the one sorting all counts gives (most frequent first, then by
// key; the top shapes and the most frequent of each GPU request they miss), with the
// same weights, and the classes and their generation must follow the shapes.
func TestWorkloadSnapshotMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewSource(9))
	w := placement.NewWorkloadModel(300)
	reference := func() ([]placement.FragShape, []float64) {
		var all []*placement.ShapeCount
		for _, c := range w.Counts {
			all = append(all, c)
		}
		sort.Slice(all, func(i, j int) bool {
			if all[i].N != all[j].N {
				return all[i].N > all[j].N
			}
			return all[i].Shape.Key < all[j].Shape.Key
		})
		if len(all) > placement.MaxFragShapes {
			seen := map[string]bool{}
			var kept []*placement.ShapeCount
			for i, c := range all {
				if g := c.Shape.GPUKey(); i < placement.MaxFragShapes || (!seen[g] && len(kept) < placement.MaxSnapshotShapes) {
					kept, seen[g] = append(kept, c), true
				}
			}
			all = kept
		}
		total := 0
		for _, c := range all {
			total += c.N
		}
		out, weights := make([]placement.FragShape, len(all)), make([]float64, len(all))
		for i, c := range all {
			out[i] = c.Shape
			weights[i] = float64(c.N) / float64(total)
		}
		return out, weights
	}
	var prev *placement.FragWorkload
	for i := 0; i < 5000; i++ {
		g, pct := 1, 5*(1+rng.Intn(20))
		if rng.Intn(40) == 0 {
			g, pct = 2+rng.Intn(7), 100
		}
		info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: g, MemoryPercent: pct, Cores: pct}}}, Order: []int{0},
			CPUMilli: int64(1000 * rng.Intn(20)), MemBytes: int64(rng.Intn(8)) << 30}
		uid := types.UID(fmt.Sprint(rng.Intn(6000))) // some pods come again
		w.Observe(uid, placement.ShapeOf(info))
		if rng.Intn(3) == 0 {
			continue // several pods between snapshots
		}
		got := w.Snapshot()
		want, wantWeights := reference()
		if len(got.Shapes) != len(want) {
			t.Fatalf("pod %d: %d shapes, sorting gives %d", i, len(got.Shapes), len(want))
		}
		for k := range want {
			s := &got.Shapes[k]
			if s.Key != want[k].Key || got.Terms[k].Weight != wantWeights[k] ||
				got.Classes[s.Class].GPU != s.GPU || int(got.Terms[k].Class) != s.Class {
				t.Fatalf("pod %d, shape %d: %s (weight %v, class %d), sorting gives %s (weight %v)", i, k, s.Key, got.Terms[k].Weight, s.Class, want[k].Key, wantWeights[k])
			}
		}
		if ref := placement.NewFragWorkload(want, wantWeights); !placement.SameClasses(ref, got) {
			t.Fatalf("pod %d: classes differ from the shapes'", i)
		}
		if prev != nil && (got.Gen == prev.Gen) != placement.SameClasses(prev, got) {
			t.Fatalf("pod %d: generation %d after %d, same classes %v", i, got.Gen, prev.Gen, placement.SameClasses(prev, got))
		}
		prev = got
	}
}

// The device pick skips devices it would rate exactly as one already rated; it must
// choose what rating every candidate gives (the least added fragmentation, ties to
// the fullest GPU, then the first), on nodes with repeated usages in both NVLink
// islands.
func TestPickByFragmentationMatchesRatingEveryDevice(t *testing.T) {
	e := newEnv(t, fragArgs(), []*v1.Node{h100(t, "n")})
	m := e.pl.cache.Existing("n").Model
	w := &e.pl.w
	rng := rand.New(rand.NewSource(5))
	var shapes []placement.FragShape
	var weights []float64
	for k := 0; k < 10; k++ {
		pct := 5 + 10*rng.Intn(10)
		shapes = append(shapes, placement.FragShape{FragClass: placement.FragClass{C: api.ContainerRequest{GPUs: 1 + k%3, MemoryPercent: pct, Cores: pct}}})
		weights = append(weights, 0.1)
	}
	wl := placement.NewFragWorkload(shapes, weights)
	levels := []int{0, 0, 0, 25, 50} // few levels: many devices alike
	picked := map[int]bool{}
	for trial := 0; trial < 2000; trial++ {
		used := make([]placement.Usage, len(m.Devices))
		for i := range used {
			if pct := levels[rng.Intn(len(levels))]; pct > 0 {
				used[i] = placement.Usage{MemMiB: m.Devices[i].MemoryMiB * int64(pct) / 100, Cores: pct, Tenants: 1}
			}
		}
		pct := 5 + 5*rng.Intn(8)
		c := &api.ContainerRequest{Name: "c", GPUs: 1, MemoryPercent: pct, Cores: pct}
		var cand []int
		for i := range m.Devices {
			if placement.Fits(m, used, c, i, w.MaxTenants) {
				cand = append(cand, i)
			}
		}
		if len(cand) == 0 {
			continue
		}
		p := &placement.PodInfo{Frag: wl}
		got, _ := placement.PickByFragmentation(m, used, p, c, w, cand, nil)
		st := placement.NewFragStats(m, used, wl, w)
		before := st.Value(wl, nil)
		want, wantDelta, wantPack := -1, 0.0, 0.0
		for _, i := range cand {
			after, _ := placement.FragAfter(m, used, st, wl, c, i, w)
			delta, pack := after-before, placement.PackScore(m, used, c, i, w)
			if want < 0 || delta < wantDelta-1e-9 || (math.Abs(delta-wantDelta) <= 1e-9 && pack > wantPack) {
				want, wantDelta, wantPack = i, delta, pack
			}
		}
		if got != want {
			t.Fatalf("trial %d (usage %v, %d%%): picked %d, rating every device gives %d", trial, used, pct, got, want)
		}
		picked[got] = true
	}
	if len(picked) < 4 {
		t.Fatalf("picks cover devices %v only: the trials do not exercise the choice", picked)
	}
}

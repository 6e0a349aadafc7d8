// SPDX-License-Identifier: Apache-2.0

package fragmentation

import (
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"sort"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/binpack"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placementtest"
	"github.com/tessera-dev/tessera/test/fixtures"
)

func TestWorkloadModelWindow(t *testing.T) {
	w := NewWorkloadModel(3)
	s := func(pct int) fragShape {
		info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: 1, MemoryPercent: pct, Cores: pct}}}, Order: []int{0}}
		return shapeOf(info)
	}
	w.observe("a", s(10))
	w.observe("a", s(10)) // a retry is not counted twice
	w.observe("b", s(20))
	w.observe("c", s(20))
	wl := w.Snapshot()
	got := wl.shapes
	if len(got) != 2 || got[0].C.MemoryPercent != 20 || math.Abs(wl.terms[0].weight-2.0/3) > 1e-9 {
		t.Fatalf("snapshot %+v, terms %+v", got, wl.terms)
	}
	w.observe("d", s(30)) // evicts "a"
	wl = w.Snapshot()
	got = wl.shapes
	total := 0.0
	for k, x := range got {
		total += wl.terms[k].weight
		if x.C.MemoryPercent == 10 {
			t.Errorf("evicted shape still present: %+v", got)
		}
	}
	if math.Abs(total-1) > 1e-9 || len(got) != 2 {
		t.Errorf("weights %v", got)
	}
	w.observe("a", s(10)) // "a" left the window, so it counts again
	if len(w.Snapshot().shapes) != 3 {
		t.Errorf("re-observed pod not counted: %+v", w.Snapshot().shapes)
	}
	// 100 shapes that differ only in CPU: the top ones are kept.
	many := NewWorkloadModel(1000)
	for i := 0; i < 100; i++ {
		info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: 1, MemoryPercent: 10, Cores: 10}}}, Order: []int{0}, CPUMilli: int64(1000 * (i + 1))}
		many.observe(types.UID(fmt.Sprint(i)), shapeOf(info))
	}
	if n := len(many.Snapshot().shapes); n != maxFragShapes {
		t.Errorf("%d shapes kept, want %d", n, maxFragShapes)
	}
	// A rare GPU request beyond the top shapes is still represented.
	many.observe("big", shapeOf(&placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: 8, Cores: 100}}}, Order: []int{0}}))
	found := false
	for _, x := range many.Snapshot().shapes {
		found = found || x.C.GPUs == 8
	}
	if !found {
		t.Error("the 8-GPU shape was dropped")
	}
}

// Score measures a node's fragmentation after a placement by re-measuring only the
// devices placed on; that must equal measuring the whole node again.
func TestFragStatsPlacedMatchesFullMeasure(t *testing.T) {
	m := modelOf(cacheOf(placementtest.H100(t, "n")), "n")
	w := testWeights()
	rng := rand.New(rand.NewSource(7))
	var shapes []fragShape
	var weights []float64
	for k := 0; k < 12; k++ {
		g := 1
		if k%5 == 4 {
			g = 2 + rng.Intn(3)
		}
		pct := int64(5 + rng.Intn(95))
		shapes = append(shapes, fragShape{Class: Class{C: api.ContainerRequest{GPUs: g, MemoryPercent: int(pct), Cores: int(pct)}}})
		weights = append(weights, 1.0/12)
	}
	wl := newFragWorkload(shapes, weights)
	for trial := 0; trial < 500; trial++ {
		used := randomUsage(rng, m, 90)
		g := 1 + rng.Intn(3)
		pct := int64(5 + rng.Intn(40))
		p := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{Name: "c", GPUs: g, MemoryPercent: int(pct), Cores: int(pct)}}}, Order: []int{0}, Device: binpack.Placer{}}
		a, fail := placement.Allocate(m, used, p, w)
		if fail != nil {
			continue
		}
		before := newFragStats(m, used, wl, w)
		got := before.placed(m, a.Placements, a.Used(), wl, w)
		want := newFragStats(m, a.Used(), wl, w)
		if math.Abs(got.Value(wl, nil)-want.Value(wl, nil)) > 1e-9 || math.Abs(got.total-want.total) > 1e-9 {
			t.Fatalf("trial %d: placed %v (total %v), measured again %v (total %v)", trial, got.Value(wl, nil), got.total, want.Value(wl, nil), want.total)
		}
		for k := range wl.classes {
			if got.cls[k].fits != want.cls[k].fits || got.mask[k] != want.mask[k] || got.term[k] != want.term[k] && math.Abs(got.term[k]-want.term[k]) > 1e-9 {
				t.Fatalf("trial %d class %d: fits %d/%b term %v, measured again %d/%b term %v", trial, k, got.cls[k].fits, got.mask[k], got.term[k], want.cls[k].fits, want.mask[k], want.term[k])
			}
		}
		if got.low != want.low {
			t.Fatalf("trial %d: low classes %b, measured again %b", trial, got.low, want.low)
		}
		// Score takes placedValue's figures for placedInto's and Value's: the same bits.
		v, total, ok := before.placedValue(m, a, wl, w)
		if !ok {
			t.Fatalf("trial %d: placedValue declined a placement on %d devices", trial, g)
		}
		if v != got.Value(wl, nil) || total != got.total {
			t.Fatalf("trial %d: placedValue %v (total %v), placedInto %v (total %v)", trial, v, total, got.Value(wl, nil), got.total)
		}
	}
}

func TestWorkloadFeed(t *testing.T) {
	m := &nodemodel.Model{Hot: []nodemodel.DeviceHot{{MemoryMiB: 16000, Healthy: true}}}
	w := &placement.Weights{Memory: 1, Cores: 1}
	shapes := []fragShape{
		{Class: Class{C: api.ContainerRequest{GPUs: 1, Cores: 100}}, cpuMilli: 12000, memBytes: 48 << 30},                // a whole GPU
		{Class: Class{C: api.ContainerRequest{GPUs: 1, MemoryMiB: 8000, Cores: 50}}, cpuMilli: 6000, memBytes: 24 << 30}, // half of one
	}
	r := workloadFeed(newFragWorkload(shapes, []float64{0.5, 0.5}), m, w)
	// 0.5·12000 + 0.5·6000 millicores for 0.5·1 + 0.5·0.5 GPUs.
	if math.Abs(r.cpuMilli-12000) > 1e-6 || math.Abs(r.memBytes-float64(48<<30)) > 1 {
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
		if got := r.unfed(tc.free, tc.cpu, tc.mem); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: unfed = %v, want %v", tc.what, got, tc.want)
		}
	}
	if got := workloadFeed(nil, m, w).unfed(8, 0, 0); got != 0 {
		t.Errorf("no workload learned: unfed = %v, want 0", got)
	}
}

// A class's eligibility (with its fast path for classes without a model selection)
// agrees with the pod selection it was learned from, on MIG and whole devices.
func TestFragShapeEligibleMatchesPod(t *testing.T) {
	m := &nodemodel.Model{
		Devices: []nodemodel.Device{{Model: "NVIDIA H100 80GB HBM3"}, {Model: "NVIDIA H100 80GB HBM3 MIG 1g.10gb", MIG: true}, {Model: "Tesla T4"}},
		Hot:     []nodemodel.DeviceHot{{}, {MIG: true}, {}},
	}
	for _, sel := range []struct{ include, exclude []string }{
		{}, {include: []string{"h100"}}, {include: []string{"mig 1g"}}, {exclude: []string{"t4"}}, {include: []string{"h100"}, exclude: []string{"mig"}},
	} {
		p := placement.PodInfo{ModelInclude: sel.include, ModelExclude: sel.exclude}
		s := Class{modelInclude: sel.include, modelExclude: sel.exclude}
		for i := range m.Devices {
			if got, want := s.EligibleAt(m, i), p.Eligible(&m.Devices[i]); got != want {
				t.Errorf("selection %+v, device %q: shape %v, pod %v", sel, m.Devices[i].Model, got, want)
			}
		}
	}
}

// TestKeptMeasureKeptAndInvalidated checks the measure the cache keeps per node: it is
// reused while neither the node's usage nor the learned GPU requests change (the
// shapes' order, weights and host requests may), and after every kind of change it is
// exactly what measuring the node again gives.
func TestKeptMeasureKeptAndInvalidated(t *testing.T) {
	node := placementtest.H100(t, "n")
	c, w := cacheOf(node), testWeights()
	l := newLearner(c, w)
	learn := func(prefix string, n int, ct placementtest.Ctr) {
		for i := 0; i < n; i++ {
			l.learn(t, placementtest.Pod(fmt.Sprintf("%s-%d", prefix, i), nil, ct))
		}
	}
	check := func(step string) *Stats {
		t.Helper()
		wl := l.workload.Snapshot()
		ent, v, used := c.EntryView(node, nil)
		got := (&podState{wl: wl}).kept(ent, v.UsageGen, v.Model, used, w)
		want := newFragStats(v.Model, used, wl, w)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: kept measure %+v, measured again %+v", step, got, want)
		}
		return got
	}
	learn("a", 3, placementtest.Ctr{Name: "c", GPU: "1", Pct: "20", Cores: "20"})
	learn("b", 2, placementtest.Ctr{Name: "c", GPU: "1", Pct: "60", Cores: "60"})
	learn("c", 1, placementtest.Ctr{Name: "c", GPU: "2", Cores: "100"})
	first := check("first measure")
	if again := check("unchanged"); again != first {
		t.Error("the node was measured again though nothing changed")
	}

	pod := placementtest.Pod("placed", nil, placementtest.Ctr{Name: "c", GPU: "1", Pct: "60", Cores: "60"})
	if err := c.Assume(pod, "n", grantsOf(placementtest.OneGrant("n", fixtures.H100MiB/2, 60, 0)), 10); err != nil {
		t.Fatal(err)
	}
	if check("after Assume") == first {
		t.Error("the measure of the node before Assume was kept")
	}
	c.Forget(pod.UID)
	check("after Forget")
	if err := c.OnPod(placementtest.Bound(t, placementtest.Pod("bound", nil, placementtest.Ctr{Name: "c", GPU: "1"}), "n", placementtest.OneGrant("n", fixtures.H100MiB, 100, 3))); err != nil {
		t.Fatal(err)
	}
	check("after an informer pod event")
	c.SetInventory("n", placementtest.MustEncode(t, fixtures.PCIeNode("n", 4, "NVIDIA H100", fixtures.H100MiB)))
	check("after an inventory change")
	c.OnPodDelete(types.UID("uid-bound"))
	check("after an informer pod delete")

	// The same shapes in another order, then a new shape of a known GPU request (other
	// host requests): the kept measure serves both.
	kept := check("before the shapes change")
	before := l.workload.Snapshot()
	learn("c2", 4, placementtest.Ctr{Name: "c", GPU: "2", Cores: "100"})
	after := l.workload.Snapshot()
	if after.gen != before.gen || after.shapes[0].key == before.shapes[0].key {
		t.Fatalf("shapes %v (generation %d) then %v (%d): want the same classes, another order", before.shapes, before.gen, after.shapes, after.gen)
	}
	if check("after the shapes' order changed") != kept {
		t.Error("the node was measured again for the same GPU requests in another order")
	}
	host := placementtest.Pod("host", nil, placementtest.Ctr{Name: "c", GPU: "2", Cores: "100"})
	host.Spec.Containers[0].Resources.Requests = placementtest.WithHost("8", "16Gi")
	l.learn(t, host)
	if wl := l.workload.Snapshot(); wl.gen != after.gen || len(wl.shapes) != len(after.shapes)+1 {
		t.Fatalf("a shape of a known GPU request: %d shapes, generation %d; want %d shapes, generation %d", len(wl.shapes), wl.gen, len(after.shapes)+1, after.gen)
	}
	if check("after a new shape of a known GPU request") != kept {
		t.Error("the node was measured again for a shape of a known GPU request")
	}
	learn("d", 1, placementtest.Ctr{Name: "c", GPU: "1", Pct: "5", Cores: "5"})
	if wl := l.workload.Snapshot(); wl.gen == after.gen {
		t.Fatalf("a new GPU request kept the class generation %d", wl.gen)
	}
	if check("after a new GPU request") == kept {
		t.Error("the measure of the old GPU requests was kept for a new one")
	}
}

// TestKeptMeasureConcurrent measures one node from many goroutines, as the parallel
// Filter does across cycles, while pods are assumed and forgotten on it: the measure
// kept at the end is the node's as it is then (run with -race for the lock-free
// reads and stores).
func TestKeptMeasureConcurrent(t *testing.T) {
	node := placementtest.H100(t, "n")
	c, w := cacheOf(node), testWeights()
	l := newLearner(c, w)
	l.teach(t, 3, placementtest.Ctr{Name: "c", GPU: "1", Pct: "20", Cores: "20"})
	l.teach(t, 2, placementtest.Ctr{Name: "c", GPU: "2", Cores: "100"})
	wl := l.workload.Snapshot()
	p := &podState{wl: wl}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if g == 0 {
					pod := placementtest.Pod(fmt.Sprintf("p%d", i), nil, placementtest.Ctr{Name: "c", GPU: "1"})
					if c.Assume(pod, "n", grantsOf(placementtest.OneGrant("n", 1000, 5, i%8)), 10) == nil && i%2 == 0 {
						c.Forget(pod.UID)
					}
					continue
				}
				ent, v, used := c.EntryView(node, nil)
				if st := p.kept(ent, v.UsageGen, v.Model, used, w); !reflect.DeepEqual(st, newFragStats(v.Model, used, wl, w)) {
					t.Errorf("measure of usage generation %d differs from the node's", v.UsageGen)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	ent, v, used := c.EntryView(node, nil)
	if st := p.kept(ent, v.UsageGen, v.Model, used, w); !reflect.DeepEqual(st, newFragStats(v.Model, used, wl, w)) {
		t.Error("the kept measure is not the node's")
	}
}

// The statistics kept per class give the fragmentation measured shape by shape (the
// definition), before and after a container is placed on any device, for shapes that
// share GPU requests and differ in host requests: the same up to rounding, since the
// shapes of a class are summed as one term (the last bits of the sum may differ); and
// the device pick's measure after placing is bit for bit the node-level score's.
func TestFragClassesMatchPerShapeMeasure(t *testing.T) {
	m := modelOf(cacheOf(placementtest.H100(t, "n")), "n")
	w := testWeights()
	rng := rand.New(rand.NewSource(11))
	var shapes []fragShape
	var weights []float64
	for k := 0; k < 20; k++ {
		g, pct := 1, 5+5*rng.Intn(19)
		if k%7 == 6 {
			g, pct = 2+rng.Intn(3), 100
		}
		shapes = append(shapes, fragShape{Class: Class{C: api.ContainerRequest{GPUs: g, MemoryPercent: pct, Cores: pct}},
			cpuMilli: int64(1000 * (1 + rng.Intn(4)))})
		weights = append(weights, float64(1+rng.Intn(5))/60)
	}
	wl := newFragWorkload(shapes, weights)
	if len(wl.classes) >= len(shapes) {
		t.Fatalf("%d classes for %d shapes: the test wants shapes that share GPU requests", len(wl.classes), len(shapes))
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
				if ShapeFits(m, used, &shapes[k].Class, i, w) {
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
		used := randomUsage(rng, m, 95)
		st := newFragStats(m, used, wl, w)
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
			got, total := fragAfter(m, used, st, wl, c, i, w)
			if want := perShape(after); math.Abs(got-want) > 1e-12 {
				t.Fatalf("trial %d, device %d: after placing, per class %v, per shape %v", trial, i, got, want)
			}
			// Score takes the pick's figures for what placedInto and Value give: they
			// must be the same bits.
			placed := st.placed(m, []placement.Placement{{Devices: []int{i}}}, after, wl, w)
			if v := placed.Value(wl, nil); got != v || total != placed.total {
				t.Fatalf("trial %d, device %d: the pick measured %v (total %v), placedInto %v (total %v)", trial, i, got, total, v, placed.total)
			}
		}
	}
}

// The workload model keeps its shapes ordered as pods come and leave the window; every
// snapshot must be the one sorting all counts gives (most frequent first, then by
// key; the top shapes and the most frequent of each GPU request they miss), with the
// same weights, and the classes and their generation must follow the shapes.
func TestWorkloadSnapshotMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewSource(9))
	w := NewWorkloadModel(300)
	reference := func() ([]fragShape, []float64) {
		var all []*shapeCount
		for _, c := range w.counts {
			all = append(all, c)
		}
		sort.Slice(all, func(i, j int) bool {
			if all[i].n != all[j].n {
				return all[i].n > all[j].n
			}
			return all[i].shape.key < all[j].shape.key
		})
		if len(all) > maxFragShapes {
			seen := map[string]bool{}
			var kept []*shapeCount
			for i, c := range all {
				if g := c.shape.gpuKey(); i < maxFragShapes || (!seen[g] && len(kept) < maxSnapshotShapes) {
					kept, seen[g] = append(kept, c), true
				}
			}
			all = kept
		}
		total := 0
		for _, c := range all {
			total += c.n
		}
		out, weights := make([]fragShape, len(all)), make([]float64, len(all))
		for i, c := range all {
			out[i] = c.shape
			weights[i] = float64(c.n) / float64(total)
		}
		return out, weights
	}
	var prev *fragWorkload
	for i := 0; i < 5000; i++ {
		g, pct := 1, 5*(1+rng.Intn(20))
		if rng.Intn(40) == 0 {
			g, pct = 2+rng.Intn(7), 100
		}
		info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: g, MemoryPercent: pct, Cores: pct}}}, Order: []int{0},
			CPUMilli: int64(1000 * rng.Intn(20)), MemBytes: int64(rng.Intn(8)) << 30}
		uid := types.UID(fmt.Sprint(rng.Intn(6000))) // some pods come again
		w.observe(uid, shapeOf(info))
		if rng.Intn(3) == 0 {
			continue // several pods between snapshots
		}
		got := w.Snapshot()
		want, wantWeights := reference()
		if len(got.shapes) != len(want) {
			t.Fatalf("pod %d: %d shapes, sorting gives %d", i, len(got.shapes), len(want))
		}
		for k := range want {
			s := &got.shapes[k]
			if s.key != want[k].key || got.terms[k].weight != wantWeights[k] ||
				got.classes[s.class].gpu != s.gpu || int(got.terms[k].class) != s.class {
				t.Fatalf("pod %d, shape %d: %s (weight %v, class %d), sorting gives %s (weight %v)", i, k, s.key, got.terms[k].weight, s.class, want[k].key, wantWeights[k])
			}
		}
		if ref := newFragWorkload(want, wantWeights); !sameClasses(ref, got) {
			t.Fatalf("pod %d: classes differ from the shapes'", i)
		}
		if prev != nil && (got.gen == prev.gen) != sameClasses(prev, got) {
			t.Fatalf("pod %d: generation %d after %d, same classes %v", i, got.gen, prev.gen, sameClasses(prev, got))
		}
		prev = got
	}
}

// The device pick skips devices it would rate exactly as one already rated; it must
// choose what rating every candidate gives (the least added fragmentation, ties to
// the fullest GPU, then the first), on nodes with repeated usages in both NVLink
// islands.
func TestPickByFragmentationMatchesRatingEveryDevice(t *testing.T) {
	m := modelOf(cacheOf(placementtest.H100(t, "n")), "n")
	w := testWeights()
	rng := rand.New(rand.NewSource(5))
	var shapes []fragShape
	var weights []float64
	for k := 0; k < 10; k++ {
		pct := 5 + 10*rng.Intn(10)
		shapes = append(shapes, fragShape{Class: Class{C: api.ContainerRequest{GPUs: 1 + k%3, MemoryPercent: pct, Cores: pct}}})
		weights = append(weights, 0.1)
	}
	wl := newFragWorkload(shapes, weights)
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
		got, _ := pickByFragmentation(m, used, wl, c, w, cand, nil)
		st := newFragStats(m, used, wl, w)
		before := st.Value(wl, nil)
		want, wantDelta, wantPack := -1, 0.0, 0.0
		for _, i := range cand {
			after, _ := fragAfter(m, used, st, wl, c, i, w)
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

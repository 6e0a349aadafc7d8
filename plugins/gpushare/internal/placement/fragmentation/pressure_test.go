// SPDX-License-Identifier: Apache-2.0

package fragmentation

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/binpack"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placementtest"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// mixedNode is a node of two T4s and two A10s (PCIe pairs), for shapes with model
// selections.
func mixedNode(t testing.TB, name string) *v1.Node {
	inv := fixtures.PCIeNode(name, 4, "NVIDIA T4", fixtures.T4MiB)
	inv.GPUs[2].Model, inv.GPUs[3].Model = "NVIDIA A10", "NVIDIA A10"
	return placementtest.Node(t, name, inv)
}

// A shape counts only on the devices its model selection admits:
//
//	device  model  used  free
//	0       T4     60%   0.4
//	1       T4      0%   1.0
//	2       A10    60%   0.4
//	3       A10     0%   1.0
//
// "t4 whole" (weight ½) fits device 1; device 0's 0.4 is its fragment, the A10s are
// none of its business: ½·0.4. "any 50%" (weight ½) fits 1 and 3, not 0 and 2:
// ½·0.8. The node's fragmentation is 0.6. A node of A10s alone is nothing to the T4
// shape, whatever is free there.
func TestFragStatsCountsEligibleDevicesOnly(t *testing.T) {
	c := cacheOf(mixedNode(t, "mixed"), placementtest.Node(t, "a10", fixtures.PCIeNode("a10", 2, "NVIDIA A10", fixtures.T4MiB)))
	w := testWeights()
	wl := newFragWorkload([]fragShape{
		{Class: Class{C: api.ContainerRequest{GPUs: 1, Cores: 100}, modelInclude: []string{"t4"}}},
		{Class: Class{C: api.ContainerRequest{GPUs: 1, MemoryPercent: 50, Cores: 50}}},
	}, []float64{0.5, 0.5})
	t4 := wl.shapes[0].class // the other shape's class is 1-t4
	m := modelOf(c, "mixed")
	used := make([]placement.Usage, 4)
	used[0] = placement.Usage{MemMiB: fixtures.T4MiB * 60 / 100, Cores: 60, Tenants: 1}
	used[2] = used[0]
	st := newFragStats(m, used, wl, w)
	if got := st.Value(wl, nil); math.Abs(got-0.6) > 1e-9 {
		t.Errorf("mixed node: fragmentation %v, want 0.6 (classes %+v)", got, st.cls)
	}
	if st.cls[t4].eligible != 2 || st.emask[t4] != 0b0011 || st.cls[1-t4].eligible != 4 {
		t.Errorf("classes %+v, masks %b", st.cls, st.emask)
	}
	a10 := modelOf(c, "a10")
	t4only := newFragWorkload(wl.shapes[t4:t4+1:t4+1], []float64{0.5})
	st = newFragStats(a10, make([]placement.Usage, 2), t4only, w)
	if got := st.Value(t4only, nil); got != 0 {
		t.Errorf("A10 node: the T4 shape counts %v of fragmentation, want 0", got)
	}
}

// On a node of mixed models with model-selective shapes, the measure after a
// placement computed from the devices placed on (placed, fragAfter) equals measuring
// the node again.
func TestFragStatsSelectiveShapesPlacedMatchesFullMeasure(t *testing.T) {
	m := modelOf(cacheOf(mixedNode(t, "n")), "n")
	w := testWeights()
	rng := rand.New(rand.NewSource(11))
	sels := [][]string{nil, {"t4"}, {"a10"}, {"t4", "a10"}, {"h100"}}
	var shapes []fragShape
	var weights []float64
	for k := 0; k < 10; k++ {
		pct := 5 + rng.Intn(95)
		shapes = append(shapes, fragShape{Class: Class{C: api.ContainerRequest{GPUs: 1 + k%2, MemoryPercent: pct, Cores: pct}, modelInclude: sels[k%len(sels)]}})
		weights = append(weights, 0.1)
	}
	wl := newFragWorkload(shapes, weights)
	for trial := 0; trial < 300; trial++ {
		used := randomUsage(rng, m, 90)
		pct := 5 + rng.Intn(40)
		c := api.ContainerRequest{Name: "c", GPUs: 1, MemoryPercent: pct, Cores: pct}
		p := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{c}}, Order: []int{0}, Device: binpack.Placer{}}
		a, fail := placement.Allocate(m, used, p, w)
		if fail != nil {
			continue
		}
		before := newFragStats(m, used, wl, w)
		got := before.placed(m, a.Placements, a.Used(), wl, w)
		want := newFragStats(m, a.Used(), wl, w)
		if math.Abs(got.Value(wl, nil)-want.Value(wl, nil)) > 1e-9 {
			t.Fatalf("trial %d: placed %v, measured again %v", trial, got.Value(wl, nil), want.Value(wl, nil))
		}
		for k := range wl.classes {
			if got.cls[k].fits != want.cls[k].fits || got.mask[k] != want.mask[k] || math.Abs(got.cls[k].elig-want.cls[k].elig) > 1e-9 || math.Abs(got.cls[k].small-want.cls[k].small) > 1e-9 {
				t.Fatalf("trial %d class %d: placed %d/%b/%v/%v, measured again %d/%b/%v/%v", trial, k,
					got.cls[k].fits, got.mask[k], got.cls[k].elig, got.cls[k].small, want.cls[k].fits, want.mask[k], want.cls[k].elig, want.cls[k].small)
			}
		}
		i := a.Placements[0].Devices[0]
		after, total := fragAfter(m, used, before, wl, &c, i, w)
		if math.Abs(after-want.Value(wl, nil)) > 1e-9 {
			t.Fatalf("trial %d: fragAfter %v, measured again %v", trial, after, want.Value(wl, nil))
		}
		// Score takes the pick's figures for placedInto's and Value's: the same bits.
		if v := got.Value(wl, nil); after != v || total != got.total {
			t.Fatalf("trial %d: the pick measured %v (total %v), placedInto %v (total %v)", trial, after, total, v, got.total)
		}
	}
}

// Model pressure by hand: 4 T4s and 8 A10s (12 GPUs); of ten whole-GPU pods one
// requires a T4 (a tenth of the demand: 0.1·12 GPUs over the 4 T4s, 0.3 per T4) and
// two take a T4 or an A10 (0.2·12 over all 12, 0.2 per GPU); the rest run anywhere and
// put no pressure on any model. T4: 0.5, A10: 0.2. Demand beyond a model's capacity
// is pressure 1.
func TestComputePressure(t *testing.T) {
	c := placement.NewCache()
	c.SetInventory("t4", placementtest.MustEncode(t, fixtures.PCIeNode("t4", 4, "NVIDIA T4", fixtures.T4MiB)))
	c.SetInventory("a10", placementtest.MustEncode(t, fixtures.PCIeNode("a10", 8, "NVIDIA A10", fixtures.T4MiB)))
	w := &placement.Weights{Memory: 1, Cores: 1}
	wl := NewWorkloadModel(100)
	wl.Bind(c, w)
	shape := func(sel ...string) fragShape {
		info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: 1, Cores: 100}}}, Order: []int{0}, ModelInclude: sel}
		return shapeOf(info)
	}
	n := 0
	add := func(count int, s fragShape) {
		for i := 0; i < count; i++ {
			wl.observe(typesUID(n), s)
			n++
		}
	}
	add(7, shape())
	if p := wl.PressureNow(); p != nil {
		t.Fatalf("pressure %+v without constrained pods", p)
	}
	add(1, shape("t4"))
	add(2, shape("t4", "a10"))
	p := wl.PressureNow()
	if p == nil || math.Abs(p.of("NVIDIA T4")-0.5) > 1e-9 || math.Abs(p.of("NVIDIA A10")-0.2) > 1e-9 || p.of("NVIDIA H100") != 0 {
		t.Fatalf("pressure %+v, want T4 0.5, A10 0.2", p)
	}
	// Not computed again before as many pods again as the window then held (10),
	// at most pressureEvery: then with the new mix.
	add(5, shape("t4"))
	if q := wl.PressureNow(); q != p {
		t.Errorf("pressure recomputed after 5 pods")
	}
	add(pressureEvery, shape("t4"))
	if q := wl.PressureNow(); q == p || q.of("NVIDIA T4") != 1 {
		t.Errorf("after %d more T4 pods: %+v, want T4 at 1", pressureEvery, q)
	}
}

func typesUID(n int) types.UID { return types.UID(fmt.Sprintf("pod-%d", n)) }

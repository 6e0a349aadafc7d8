// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"
	"math"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
)

// decisionCount reads one series of decisions_total (the counters are process-wide:
// tests compare before and after).
func decisionCount(t *testing.T, pol Policy, result, reason string) float64 {
	t.Helper()
	v, err := testutil.GetCounterMetricValue(decisions.WithLabelValues("test-profile", string(Binpack), string(pol), result, reason))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func conflictCount(t *testing.T) float64 {
	t.Helper()
	v, err := testutil.GetCounterMetricValue(reserveConflicts.WithLabelValues("test-profile"))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Each decision is counted once, at the extension point that makes it.
func TestDecisionMetrics(t *testing.T) {
	ctx := context.Background()
	node := makeNode(t, "one", pcieInventory("one", 1, "Tesla T4", t4Mem))
	e := newEnv(t, nil, []*v1.Node{node})

	type delta struct {
		pol            Policy
		result, reason string
	}
	count := func(d delta) float64 { return decisionCount(t, d.pol, d.result, d.reason) }
	expect := func(what string, run func(), want ...delta) {
		t.Helper()
		before := map[delta]float64{}
		all := []delta{{Binpack, resultPlaced, ""}, {Spread, resultPlaced, ""},
			{Binpack, resultUnschedulable, reasonInvalidRequest}, {Binpack, resultUnschedulable, reasonCapacity},
			{Binpack, resultUnschedulable, reasonSelection}, {Binpack, resultUnschedulable, reasonReserveConflict}}
		for _, d := range all {
			before[d] = count(d)
		}
		run()
		for _, d := range all {
			w := 0.0
			for _, x := range want {
				if x == d {
					w++
				}
			}
			if got := count(d) - before[d]; got != w {
				t.Errorf("%s: %+v counted %v times, want %v", what, d, got, w)
			}
		}
	}

	p1 := makePod("p1", nil, ctr{Name: "c", GPU: "1", Mem: "10000"})
	p2 := makePod("p2", nil, ctr{Name: "c", GPU: "1", Mem: "10000"})
	var r1, r2 *cycleResult
	expect("Filter on two pods", func() { r1, r2 = e.cycle(p1), e.cycle(p2) })
	expect("Reserve", func() {
		if st := e.pl.Reserve(ctx, r1.state, p1, "one"); !st.IsSuccess() {
			t.Fatal(st)
		}
	}, delta{Binpack, resultPlaced, ""})
	conflicts := conflictCount(t)
	expect("Reserve of a placement taken meanwhile", func() {
		if st := e.pl.Reserve(ctx, r2.state, p2, "one"); st.Code() != fwk.Unschedulable {
			t.Fatal(st)
		}
	}, delta{Binpack, resultUnschedulable, reasonReserveConflict})
	if got := conflictCount(t) - conflicts; got != 1 {
		t.Errorf("reserve conflicts +%v, want +1", got)
	}

	// The pod's own GPU policy labels its decision.
	spread := makePod("s", map[string]string{"tessera.dev/gpu-policy": "spread"}, ctr{Name: "c", GPU: "1", Mem: "1000"})
	expect("Reserve under a pod's own policy", func() {
		r := e.cycle(spread)
		if st := e.pl.Reserve(ctx, r.state, spread, "one"); !st.IsSuccess() {
			t.Fatal(st)
		}
	}, delta{Spread, resultPlaced, ""})

	bad := makePod("bad", map[string]string{"tessera.dev/gpu-policy": "nonsense"}, ctr{Name: "c", GPU: "1"})
	expect("an invalid request", func() { e.cycle(bad) }, delta{Binpack, resultUnschedulable, reasonInvalidRequest})

	full := makePod("full", nil, ctr{Name: "c", GPU: "1", Mem: "10000"})
	expect("no room", func() { e.postFilter(e.cycle(full), full) }, delta{Binpack, resultUnschedulable, reasonCapacity})

	a100 := makePod("a100", map[string]string{"tessera.dev/gpu-model-include": "A100"}, ctr{Name: "c", GPU: "1"})
	expect("no matching GPU", func() { e.postFilter(e.cycle(a100), a100) }, delta{Binpack, resultUnschedulable, reasonSelection})
}

// The collector reports the cache and the fragmentation measure at scrape time.
func TestCacheCollector(t *testing.T) {
	nodes := []*v1.Node{makeNode(t, "a", pcieInventory("a", 2, "Tesla T4", t4Mem)), makeNode(t, "none", nil)}
	pods := []*v1.Pod{
		bindPod(t, makePod("x", nil, ctr{Name: "c", GPU: "1"}), "a", oneGrant("a", 4000, 30, 0)),
	}
	e := newEnv(t, &TesseraGPUShareArgs{NodePolicy: Fragmentation, DevicePolicy: Fragmentation}, nodes, pods...)
	// An assumed pod, y.
	y := makePod("y", nil, ctr{Name: "c", GPU: "1", Mem: "1000", Cores: "10"})
	r := e.cycle(y)
	if st := e.pl.Reserve(context.Background(), r.state, y, "a"); !st.IsSuccess() {
		t.Fatal(st)
	}

	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(newCacheCollector(func() []*Plugin { return []*Plugin{e.pl, e.pl} })) // two profiles named alike, one cache
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			k := mf.GetName()
			for _, l := range m.GetLabel() {
				k += "," + l.GetName() + "=" + l.GetValue()
			}
			got[k] = m.GetGauge().GetValue()
		}
	}
	// y goes to the fuller GPU 0, so GPU 1 stays idle: a whole-GPU pod fits there
	// and only GPU 0's free share is fragmented for it; y's own shape fits both.
	// Free shares weigh memory and cores 1:1 (the defaults).
	gpu0 := 1 - (5000.0/t4Mem+0.40)/2
	want := map[string]float64{
		"tessera_scheduler_cache_nodes":                                             1,
		"tessera_scheduler_cache_gpus,health=healthy":                               2,
		"tessera_scheduler_cache_gpus,health=unhealthy":                             0,
		"tessera_scheduler_cache_grants,state=assumed":                              1,
		"tessera_scheduler_cache_grants,state=bound":                                1,
		"tessera_scheduler_cache_gpu_memory_bytes":                                  2 * t4Mem * mib,
		"tessera_scheduler_cache_granted_gpu_memory_bytes":                          5000 * mib,
		"tessera_scheduler_cache_granted_gpu_cores":                                 0.4,
		"tessera_scheduler_free_gpus,profile=test-profile":                          2 * (gpu0 + 1),
		"tessera_scheduler_fragmented_gpus,profile=test-profile,workload=whole_gpu": 2 * gpu0,
		"tessera_scheduler_fragmented_gpus,profile=test-profile,workload=learned":   0,
	}
	for k, w := range want {
		v, ok := got[k]
		if !ok {
			t.Errorf("%s missing; gathered %v", k, got)
			continue
		}
		if math.Abs(v-w) > 1e-9 {
			t.Errorf("%s = %v, want %v", k, v, w)
		}
	}
}

// BenchmarkCacheCollector is the cost of one scrape of the cache and fragmentation
// gauges on 4,096 half-full 8-GPU nodes, for a Fragmentation profile that has learned
// 25 shapes (the learned measure dominates: shapes × GPUs fits checks per node).
func BenchmarkCacheCollector(b *testing.B) {
	var ns []*v1.Node
	e := newEnv(b, &TesseraGPUShareArgs{NodePolicy: Fragmentation, DevicePolicy: Fragmentation}, nil)
	for n := 0; n < 4096; n++ {
		name := fmt.Sprintf("n%d", n)
		node := h100(b, name)
		ns = append(ns, node)
		e.pl.cache.SetInventory(name, node.Annotations[api.AnnotationInventory])
		for i := 0; i < 4; i++ {
			if err := e.pl.cache.OnPod(bindPod(b, makePod(fmt.Sprintf("%s-f%d", name, i), nil, ctr{Name: "c", GPU: "1"}), name, oneGrant(name, 40000, 50, i))); err != nil {
				b.Fatal(err)
			}
		}
	}
	e.nodes = ns
	for k := 0; k < 24; k++ {
		pct := fmt.Sprint(5 + 4*k)
		teach(b, e, 1+k%5, ctr{Name: "c", GPU: "1", Pct: pct, Cores: pct})
	}
	teach(b, e, 3, ctr{Name: "c", GPU: "8", Cores: "100"})
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(newCacheCollector(func() []*Plugin { return []*Plugin{e.pl} }))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}

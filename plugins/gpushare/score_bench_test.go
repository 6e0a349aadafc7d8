package gpushare

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// BenchmarkScorePerPod measures what scoring one fractional pod costs under each node
// policy: PreScore, then Score on every one of 256 feasible 8-GPU nodes (half full, as
// in BenchmarkFilterScore), then NormalizeScore where the policy has one. Filter runs
// once before the timer, as in a cycle, so Score reuses its allocation. Fragmentation
// has a learned workload of 25 shapes, as BenchmarkFilterScore. Report: ns/op is per
// pod; ns/node divides it by the nodes scored.
func BenchmarkScorePerPod(b *testing.B) {
	for _, pol := range []Policy{Binpack, Fragmentation} {
		b.Run(string(pol), func(b *testing.B) {
			const nodes = 256
			var ns []*v1.Node
			var pods []*v1.Pod
			for n := 0; n < nodes; n++ {
				name := fmt.Sprintf("n%d", n)
				ns = append(ns, h100(b, name))
				for i := 0; i < 4; i++ {
					pods = append(pods, bindPod(b, makePod(fmt.Sprintf("%s-f%d", name, i), nil, ctr{Name: "c", GPU: "1"}), name, oneGrant(name, 40000, 50, i)))
				}
				pods = append(pods, bindPod(b, makePod(name+"-w", nil, ctr{Name: "c", GPU: "1"}), name, oneGrant(name, h100Mem, 100, 4)))
			}
			e := newEnv(b, &TesseraGPUShareArgs{NodePolicy: pol, DevicePolicy: pol}, ns, pods...)
			if pol == Fragmentation {
				for k := 0; k < 24; k++ {
					pct := fmt.Sprint(5 + 4*k)
					teach(b, e, 1+k%5, ctr{Name: "c", GPU: "1", Pct: pct, Cores: pct})
				}
				teach(b, e, 3, ctr{Name: "c", GPU: "8", Cores: "100"})
			}
			pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "8192", Cores: "20"})
			ctx := context.Background()
			cs := framework.NewCycleState()
			if _, st := e.pl.PreFilter(ctx, cs, pod, e.infos); !st.IsSuccess() {
				b.Fatal(st)
			}
			for _, ni := range e.infos {
				if st := e.pl.Filter(ctx, cs, pod, ni); !st.IsSuccess() {
					b.Fatal(st)
				}
			}
			scores := make(fwk.NodeScoreList, nodes)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if st := e.pl.PreScore(ctx, cs, pod, e.infos); !st.IsSuccess() {
					b.Fatal(st)
				}
				for k, ni := range e.infos {
					s, st := e.pl.Score(ctx, cs, pod, ni)
					if !st.IsSuccess() {
						b.Fatal(st)
					}
					scores[k] = fwk.NodeScore{Name: ni.Node().Name, Score: s}
				}
				if ext := e.pl.ScoreExtensions(); ext != nil {
					if st := ext.NormalizeScore(ctx, cs, pod, scores); !st.IsSuccess() {
						b.Fatal(st)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/nodes, "ns/node")
		})
	}
}

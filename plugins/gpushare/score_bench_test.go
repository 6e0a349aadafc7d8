// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"testing"

	fwk "k8s.io/kube-scheduler/framework"
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
			pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "8192", Cores: "20"})
			fs := newFilterScoreBench(b, pol, pod, nodes)
			e, ctx, cs := fs.e, fs.ctx, fs.cs
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

package gpushare

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// BenchmarkFilterScore measures the per-node cost of Filter followed by Score for a
// fractional pod on an 8-GPU node (two NVLink islands) that is half full, the shape
// BRIEF §5 B2 asks for. Report: ns/op and allocs/op per node.
func BenchmarkFilterScore(b *testing.B) {
	for _, bc := range []struct {
		name string
		pod  *v1.Pod
	}{
		{"fraction", makePod("p", nil, ctr{name: "c", gpu: "1", mem: "8192", cores: "20"})},
		{"whole-2gpu", makePod("p", nil, ctr{name: "c", gpu: "2"})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const nodes = 64
			var ns []*v1.Node
			var pods []*v1.Pod
			for n := 0; n < nodes; n++ {
				name := fmt.Sprintf("n%d", n)
				ns = append(ns, h100(b, name))
				// Half full: GPUs 0-3 carry fractions, GPU 4 a whole-GPU pod.
				for i := 0; i < 4; i++ {
					pods = append(pods, bindPod(b, makePod(fmt.Sprintf("%s-f%d", name, i), nil, ctr{name: "c", gpu: "1"}), name, oneGrant(name, 40000, 50, i)))
				}
				pods = append(pods, bindPod(b, makePod(name+"-w", nil, ctr{name: "c", gpu: "1"}), name, oneGrant(name, h100Mem, 100, 4)))
			}
			e := newEnv(b, nil, ns, pods...)
			ctx := context.Background()
			cs := framework.NewCycleState()
			if _, st := e.pl.PreFilter(ctx, cs, bc.pod, e.infos); !st.IsSuccess() {
				b.Fatal(st)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ni := e.infos[i%nodes]
				if st := e.pl.Filter(ctx, cs, bc.pod, ni); !st.IsSuccess() {
					b.Fatal(st)
				}
				if _, st := e.pl.Score(ctx, cs, bc.pod, ni); !st.IsSuccess() {
					b.Fatal(st)
				}
			}
		})
	}
}

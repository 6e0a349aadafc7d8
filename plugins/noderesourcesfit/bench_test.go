// SPDX-License-Identifier: Apache-2.0

package noderesourcesfit

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
)

// BenchmarkFilter is one node's Filter for a Tessera fraction (CPU, memory and three
// tessera.dev/* resources) under the binpack profile's args, NodeResourcesFit against
// the wrapper in the same run, with the scheduler's default feature gates.
// docs/benchmarks.md (B2) reports the ratio.
func BenchmarkFilter(b *testing.B) {
	const nodes = 64
	var infos []fwk.NodeInfo
	for n := 0; n < nodes; n++ {
		var pods []*v1.Pod
		for i := 0; i < 5; i++ {
			pods = append(pods, fraction(fmt.Sprintf("n%d-p%d", n, i)).Node(fmt.Sprintf("n%d", n)).Obj())
		}
		ni := framework.NewNodeInfo(pods...)
		ni.SetNode(st.MakeNode().Name(fmt.Sprintf("n%d", n)).Capacity(map[v1.ResourceName]string{
			v1.ResourceCPU: "128", v1.ResourceMemory: "1Ti", v1.ResourcePods: "110"}).Obj())
		infos = append(infos, ni)
	}
	args := testArgs()["group, MostAllocated"]
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	up, w := newPair(b, args, fts)
	pod := fraction("bench").Obj()
	ctx := context.Background()
	for _, pl := range []fwk.FilterPlugin{up, w} {
		b.Run(pl.Name(), func(b *testing.B) {
			cs := framework.NewCycleState()
			if _, st := pl.(fwk.PreFilterPlugin).PreFilter(ctx, cs, pod, infos); !st.IsSuccess() {
				b.Fatal(st)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if st := pl.Filter(ctx, cs, pod, infos[i%nodes]); !st.IsSuccess() {
					b.Fatal(st)
				}
			}
		})
	}
	// The wrapper's price: PreFilter once per pod, the copy included.
	for _, pl := range []fwk.PreFilterPlugin{up, w} {
		b.Run(pl.Name()+"/PreFilter", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, st := pl.PreFilter(ctx, framework.NewCycleState(), pod, infos); !st.IsSuccess() {
					b.Fatal(st)
				}
			}
		})
	}
}

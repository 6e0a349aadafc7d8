// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
)

// BenchmarkBaselineNodeResourcesFit is the yardstick for BenchmarkFilterScore: the
// in-tree NodeResourcesFit plugin's Filter followed by Score for a CPU pod on nodes
// carrying the same number of pods. docs/benchmarks.md reports the ratio of the two.
func BenchmarkBaselineNodeResourcesFit(b *testing.B) {
	const nodes = 64
	var infos []fwk.NodeInfo
	for n := 0; n < nodes; n++ {
		node := h100(b, fmt.Sprintf("n%d", n))
		alloc := v1.ResourceList{v1.ResourceCPU: resource.MustParse("128"), v1.ResourceMemory: resource.MustParse("1Ti"), v1.ResourcePods: resource.MustParse("110")}
		node.Status.Allocatable, node.Status.Capacity = alloc, alloc
		var pods []*v1.Pod
		for i := 0; i < 5; i++ {
			p := makePod(fmt.Sprintf("%s-p%d", node.Name, i), nil)
			p.Spec.NodeName = node.Name
			p.Spec.Containers = []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
				v1.ResourceCPU: resource.MustParse("8"), v1.ResourceMemory: resource.MustParse("64Gi")}}}}
			pods = append(pods, p)
		}
		ni := framework.NewNodeInfo(pods...)
		ni.SetNode(node)
		infos = append(infos, ni)
	}
	args := &config.NodeResourcesFitArgs{ScoringStrategy: &config.ScoringStrategy{
		Type:      config.LeastAllocated,
		Resources: []config.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}},
	}}
	p, err := noderesources.NewFit(context.Background(), args, &fakeHandle{}, feature.Features{})
	if err != nil {
		b.Fatal(err)
	}
	fit := p.(*noderesources.Fit)
	pod := makePod("cpu", nil)
	pod.Spec.Containers = []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("16Gi")}}}}
	ctx := context.Background()
	cs := framework.NewCycleState()
	if _, st := fit.PreFilter(ctx, cs, pod, infos); !st.IsSuccess() {
		b.Fatal(st)
	}
	if st := fit.PreScore(ctx, cs, pod, infos); !st.IsSuccess() {
		b.Fatal(st)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ni := infos[i%nodes]
		if st := fit.Filter(ctx, cs, pod, ni); !st.IsSuccess() {
			b.Fatal(st)
		}
		if _, st := fit.Score(ctx, cs, pod, ni); !st.IsSuccess() {
			b.Fatal(st)
		}
	}
}

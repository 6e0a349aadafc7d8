// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// TestAssignmentArrivesWithBinding watches every change of every pod while the sample
// config's binpack profile schedules them: a GPU pod changes once, in one update
// that sets both its node and its assignment annotation (no state where it is bound
// without its GPUs or annotated but unbound, no nominatedNodeName patch); a pod
// without GPUs is bound by DefaultBinder and carries no assignment.
func TestAssignmentArrivesWithBinding(t *testing.T) {
	c := startCluster(t)
	c.createNode("h100", fixtures.NVLinkNode("h100", 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB))
	w, err := c.client.CoreV1().Pods(c.ns).Watch(c.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	c.startScheduler("tessera-scheduler.yaml")

	const gpuPods = 20
	for i := 0; i < gpuPods; i++ {
		c.createPod(newPod(c.ns, fmt.Sprintf("gpu-%d", i), binpack, nil, gpuLimits{name: "c", gpu: "1", mem: "4000", cores: "10"}))
	}
	cpu := newPod(c.ns, "cpu", binpack, nil)
	cpu.Spec.Containers = []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}
	c.createPod(cpu)

	updates := map[string]int{}
	bound := map[string]bool{}
	deadline := time.After(time.Minute)
	for len(bound) < gpuPods+1 {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-deadline:
			t.Fatalf("%d of %d pods bound after a minute", len(bound), gpuPods+1)
		}
		p, ok := ev.Object.(*v1.Pod)
		if !ok {
			t.Fatalf("watch event %s: %T", ev.Type, ev.Object)
		}
		if ev.Type != watch.Modified {
			continue
		}
		updates[p.Name]++
		_, annotated := p.Annotations[api.AnnotationAssignment]
		if p.Status.NominatedNodeName != "" {
			t.Errorf("pod %s got nominatedNodeName %q: the scheduler wrote a status patch", p.Name, p.Status.NominatedNodeName)
		}
		if p.Name == "cpu" {
			if annotated {
				t.Errorf("pod without GPUs got an assignment")
			}
		} else if annotated != (p.Spec.NodeName != "") {
			t.Errorf("pod %s seen with node %q and assignment %v: the two must arrive together", p.Name, p.Spec.NodeName, annotated)
		} else if annotated {
			if a := assignment(t, p); a.Node != p.Spec.NodeName {
				t.Errorf("pod %s on %s, assignment for %s", p.Name, p.Spec.NodeName, a.Node)
			}
		}
		if p.Spec.NodeName != "" {
			bound[p.Name] = true
		}
	}
	for name, n := range updates {
		if n != 1 {
			t.Errorf("pod %s changed %d times before it was bound, want 1 (the binding)", name, n)
		}
	}
	if got := c.checkGrants(10); got != gpuPods {
		t.Errorf("checked %d GPU pods, want %d", got, gpuPods)
	}
}

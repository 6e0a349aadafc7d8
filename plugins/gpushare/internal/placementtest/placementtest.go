// SPDX-License-Identifier: Apache-2.0

// Package placementtest builds the nodes, pods and assignments that the tests of
// TesseraGPUShare (the adapter) and of internal/placement are written against. It is
// imported by tests only.
package placementtest

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// MustEncode is the inventory annotation of inv.
func MustEncode(t testing.TB, inv *api.NodeInventory) string {
	t.Helper()
	s, err := api.EncodeInventory(inv)
	if err != nil {
		t.Fatalf("encoding inventory: %v", err)
	}
	return s
}

// Node is a node named name publishing inv (none when nil).
func Node(t testing.TB, name string, inv *api.NodeInventory) *v1.Node {
	t.Helper()
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
	if inv != nil {
		n.Annotations[api.AnnotationInventory] = MustEncode(t, inv)
	}
	return n
}

// H100 is a node of eight H100s in two NVLink islands of four.
func H100(t testing.TB, name string) *v1.Node {
	return Node(t, name, fixtures.NVLinkNode(name, 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB))
}

// T4 is a node of four T4s on PCIe.
func T4(t testing.TB, name string) *v1.Node {
	return Node(t, name, fixtures.PCIeNode(name, 4, "Tesla T4", fixtures.T4MiB))
}

// Ctr describes one container's GPU limits; empty fields are left out.
type Ctr struct {
	Name                 string
	GPU, Mem, Pct, Cores string
	Init                 bool
}

// Pod is a pending pod of the tessera scheduler in namespace default, UID "uid-"+name,
// with the given annotations and containers.
func Pod(name string, ann map[string]string, cs ...Ctr) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Annotations: ann},
		Spec: v1.PodSpec{SchedulerName: "tessera"}}
	names := api.DefaultResourceNames()
	for _, c := range cs {
		lim := v1.ResourceList{}
		for rn, v := range map[v1.ResourceName]string{names.GPU: c.GPU, names.GPUMemory: c.Mem, names.GPUMemoryPercent: c.Pct, names.GPUCores: c.Cores} {
			if v != "" {
				lim[rn] = resource.MustParse(v)
			}
		}
		container := v1.Container{Name: c.Name, Image: "busybox", Resources: v1.ResourceRequirements{Limits: lim}}
		if c.Init {
			p.Spec.InitContainers = append(p.Spec.InitContainers, container)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, container)
		}
	}
	return p
}

// Bound is a copy of pod bound to node with the assignment annotation of a.
func Bound(t testing.TB, pod *v1.Pod, node string, a *api.PodAssignment) *v1.Pod {
	t.Helper()
	p := pod.DeepCopy()
	p.Spec.NodeName = node
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	s, err := api.EncodeAssignment(a)
	if err != nil {
		t.Fatalf("encoding assignment: %v", err)
	}
	p.Annotations[api.AnnotationAssignment] = s
	return p
}

// OneGrant is an assignment of one container "c" to the given GPUs of node, each
// with mem MiB and cores % (the GPUs' UUIDs are fixtures.UUID's).
func OneGrant(node string, mem int64, cores int, idx ...int) *api.PodAssignment {
	ca := api.ContainerAssignment{Name: "c"}
	for _, i := range idx {
		ca.Devices = append(ca.Devices, api.DeviceGrant{UUID: fixtures.UUID(node, i), Index: i, MemoryMiB: mem, Cores: cores})
	}
	return &api.PodAssignment{Version: api.AssignmentVersion, Node: node, Containers: []api.ContainerAssignment{ca}}
}

// WithHost is a resource list of CPU and memory: a container's requests or a node's
// allocatable.
func WithHost(cpu, mem string) v1.ResourceList {
	return v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(mem)}
}

// HostNode is a node of gpus T4s on PCIe with cpu cores and 512 GiB allocatable.
func HostNode(t testing.TB, name string, gpus int, cpu string) *v1.Node {
	n := Node(t, name, fixtures.PCIeNode(name, gpus, "NVIDIA T4", fixtures.T4MiB))
	n.Status.Allocatable = WithHost(cpu, "512Gi")
	return n
}

package gpushare

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/test/fixtures"
)

const (
	h100Mem = fixtures.H100MiB
	t4Mem   = fixtures.T4MiB
)

func nvlinkInventory(node string, n, islandSize int, model string, mem int64) *api.NodeInventory {
	return fixtures.NVLinkNode(node, n, islandSize, model, mem)
}

func pcieInventory(node string, n int, model string, mem int64) *api.NodeInventory {
	return fixtures.PCIeNode(node, n, model, mem)
}

func makeNode(t testing.TB, name string, inv *api.NodeInventory) *v1.Node {
	t.Helper()
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
	if inv != nil {
		s, err := api.EncodeInventory(inv)
		if err != nil {
			t.Fatalf("encoding inventory: %v", err)
		}
		n.Annotations[api.AnnotationInventory] = s
	}
	return n
}

// ctr describes one container's GPU limits in tests; zero fields are left out.
type ctr struct {
	name                 string
	gpu, mem, pct, cores string
	init                 bool
}

func makePod(name string, ann map[string]string, cs ...ctr) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Annotations: ann},
		Spec: v1.PodSpec{SchedulerName: "tessera"}}
	names := api.DefaultResourceNames()
	for _, c := range cs {
		lim := v1.ResourceList{}
		for rn, v := range map[v1.ResourceName]string{names.GPU: c.gpu, names.GPUMemory: c.mem, names.GPUMemoryPercent: c.pct, names.GPUCores: c.cores} {
			if v != "" {
				lim[rn] = resource.MustParse(v)
			}
		}
		container := v1.Container{Name: c.name, Image: "busybox", Resources: v1.ResourceRequirements{Limits: lim}}
		if c.init {
			p.Spec.InitContainers = append(p.Spec.InitContainers, container)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, container)
		}
	}
	return p
}

// bindPod returns a copy of pod bound to node with the given assignment annotation.
func bindPod(t testing.TB, pod *v1.Pod, node string, a *api.PodAssignment) *v1.Pod {
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

// oneGrant is an assignment of one container "c" to the given GPUs of node.
func oneGrant(node string, mem int64, cores int, idx ...int) *api.PodAssignment {
	ca := api.ContainerAssignment{Name: "c"}
	for _, i := range idx {
		ca.Devices = append(ca.Devices, api.DeviceGrant{UUID: fmt.Sprintf("GPU-%s-%d", node, i), Index: i, MemoryMiB: mem, Cores: cores})
	}
	return &api.PodAssignment{Version: api.AssignmentVersion, Node: node, Containers: []api.ContainerAssignment{ca}}
}

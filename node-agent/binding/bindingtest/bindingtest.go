// SPDX-License-Identifier: Apache-2.0

// Package bindingtest gives tests of the packages built on binding what a Binder reads
// besides the runtime's request: the pods of the API server and the node's inventory.
package bindingtest

import (
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
)

// Scheduler is the scheduler name Placed pods carry; pass it in
// binding.Config.SchedulerNames.
const Scheduler = "tessera-binpack"

// Pods stands in for the API server's pods (binding.Config.Pods is its Get). It is
// safe for concurrent use.
type Pods struct {
	mu    sync.Mutex
	byUID map[string]*corev1.Pod
}

// Put adds or replaces a pod (by UID).
func (p *Pods) Put(pod *corev1.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byUID == nil {
		p.byUID = map[string]*corev1.Pod{}
	}
	p.byUID[string(pod.UID)] = pod
}

// Delete removes the pod with this UID.
func (p *Pods) Delete(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byUID, uid)
}

// Get returns the pod with this namespace, name and UID, or nil.
func (p *Pods) Get(namespace, name, uid string, _ bool) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod := p.byUID[uid]
	if pod == nil || pod.Namespace != namespace || pod.Name != name {
		return nil, nil
	}
	return pod, nil
}

// Placed returns the pod Tessera's scheduler placed with assignment a: on a.Node,
// naming Scheduler, carrying a as its annotation, and with one container per
// assigned container asking for exactly what it was granted (as many GPUs as
// devices, the first device's memory and cores on each), then the plain containers.
func Placed(namespace, name, uid string, a *api.PodAssignment, plain ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid), Annotations: map[string]string{}},
		Spec:       corev1.PodSpec{NodeName: a.Node, SchedulerName: Scheduler},
	}
	if s, err := api.EncodeAssignment(a); err == nil {
		p.Annotations[api.AnnotationAssignment] = s
	}
	names := api.DefaultResourceNames()
	for _, ca := range a.Containers {
		d := ca.Devices[0]
		limits := corev1.ResourceList{
			names.GPU:       resource.MustParse(strconv.Itoa(len(ca.Devices))),
			names.GPUMemory: resource.MustParse(strconv.FormatInt(d.MemoryMiB, 10)),
		}
		if d.Cores > 0 {
			limits[names.GPUCores] = resource.MustParse(strconv.Itoa(d.Cores))
		}
		c := corev1.Container{Name: ca.Name, Resources: corev1.ResourceRequirements{Limits: limits}}
		if ca.Init {
			p.Spec.InitContainers = append(p.Spec.InitContainers, c)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, c)
		}
	}
	for _, n := range plain {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: n})
	}
	return p
}

// Inventory is a node's inventory of whole GPUs with these UUIDs, memMiB each.
func Inventory(memMiB int64, uuids ...string) *api.NodeInventory {
	inv := &api.NodeInventory{Version: api.InventoryVersion}
	for i, u := range uuids {
		inv.GPUs = append(inv.GPUs, api.GPU{Index: i, UUID: u, MemoryMiB: memMiB, Healthy: true, NUMANode: -1})
	}
	return inv
}

// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	resourceslicetracker "k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	backendcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/dra"
)

// Modes of the replay: the device plugin's extended resources (tessera.dev/gpu,
// gpu-cores, gpu-memory-percent on the pod), or DRA (each GPU pod asks through a
// ResourceClaim of the gpu.tessera.dev DeviceClass, the nodes publish ResourceSlices as
// a node agent with --dra does).
const (
	modeDevicePlugin = "device-plugin"
	modeDRA          = "dra"
)

// draNamespace is where the replay's pods and claims live.
const draNamespace = "default"

// draWorld is one DRA-mode run's API objects and the scheduler's view of them: a fake
// clientset that the in-tree plugin writes allocations to, the informers and the
// claims' assume cache the scheduler builds, and the DRA manager over them.
type draWorld struct {
	client  *fake.Clientset
	factory informers.SharedInformerFactory
	claims  *assumecache.AssumeCache
	manager fwk.SharedDRAManager
	// device maps node -> device name -> GPU index, for the ledger.
	device map[string]map[string]int
	memoryTable
}

// memoryTable is the least memory of a GPU of each model in the cluster, and of any
// GPU: what a share asks in MiB (shareMiB).
type memoryTable struct {
	modelMem map[string]int64
	minMem   int64
}

// add counts the GPUs of a node's inventory.
func (t *memoryTable) add(inv *api.NodeInventory) {
	if t.modelMem == nil {
		t.modelMem = map[string]int64{}
	}
	for _, g := range inv.GPUs {
		if m, ok := t.modelMem[g.Model]; !ok || g.MemoryMiB < m {
			t.modelMem[g.Model] = g.MemoryMiB
		}
		if t.minMem == 0 || g.MemoryMiB < t.minMem {
			t.minMem = g.MemoryMiB
		}
	}
}

// newMemoryTable is the memory table of the nodes' inventories.
func newMemoryTable(nodes []*v1.Node) (memoryTable, error) {
	var t memoryTable
	err := eachInventory(nodes, func(_ *v1.Node, inv *api.NodeInventory) error {
		t.add(inv)
		return nil
	})
	return t, err
}

// eachInventory calls f with each GPU node and its decoded inventory.
func eachInventory(nodes []*v1.Node, f func(*v1.Node, *api.NodeInventory) error) error {
	for _, n := range nodes {
		raw, ok := n.Annotations[api.AnnotationInventory]
		if !ok {
			continue
		}
		inv, err := api.DecodeInventory(raw)
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := f(n, inv); err != nil {
			return err
		}
	}
	return nil
}

// shareMiB is the memory a share of pct percent of one GPU asks in MiB: pct of the
// smallest GPU among the models the pod accepts (every model when it names none), the
// most a user can ask that fits pct of every GPU it may land on.
func (t *memoryTable) shareMiB(tp *tracePod, pct int64) int64 {
	mem := t.minMem
	if len(tp.gpuSpec) > 0 {
		mem = 0
		for _, m := range tp.gpuSpec {
			if v, ok := t.modelMem[m]; ok && (mem == 0 || v < mem) {
				mem = v
			}
		}
		if mem == 0 { // no node has the model: the pod fits nowhere anyway
			mem = t.minMem
		}
	}
	return mem * pct / 100
}

// newDRAWorld builds the API objects of a DRA-mode cluster: the DeviceClass, and one
// ResourceSlice pool per GPU node with the devices the node agent would publish for
// the node's inventory. The scheduler's side (informers, assume cache, slice tracker,
// DRA manager) is built as kube-scheduler builds it.
func newDRAWorld(ctx context.Context, nodes []*v1.Node) (*draWorld, error) {
	objs := []runtime.Object{&resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: dra.DriverName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", dra.DriverName)},
		}}},
	}}
	w := &draWorld{device: map[string]map[string]int{}}
	err := eachInventory(nodes, func(n *v1.Node, inv *api.NodeInventory) error {
		idx := map[string]int{}
		for _, g := range inv.GPUs {
			idx[dra.DeviceName(g.UUID)] = g.Index
		}
		w.add(inv)
		w.device[n.Name] = idx
		pool := dra.Resources(n.Name, inv).Pools[n.Name]
		for i, s := range pool.Slices {
			objs = append(objs, &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", n.Name, strings.ReplaceAll(dra.DriverName, ".", "-"), i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:   dra.DriverName,
					Pool:     resourceapi.ResourcePool{Name: n.Name, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
					NodeName: &n.Name,
					Devices:  s.Devices,
				},
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	w.client = fake.NewClientset()
	versions(w.client)
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *resourceapi.DeviceClass:
			_, err = w.client.ResourceV1().DeviceClasses().Create(ctx, o, metav1.CreateOptions{})
		case *resourceapi.ResourceSlice:
			_, err = w.client.ResourceV1().ResourceSlices().Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			return nil, err
		}
	}
	w.factory = informers.NewSharedInformerFactory(w.client, 0)
	logger := klog.FromContext(ctx)
	w.claims = assumecache.NewAssumeCache(logger, w.factory.Resource().V1().ResourceClaims().Informer(), "ResourceClaim", "", nil)
	tracker, err := resourceslicetracker.StartTracker(ctx, resourceslicetracker.Options{
		EnableConsumableCapacity: utilfeature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity),
		SliceInformer:            w.factory.Resource().V1().ResourceSlices(),
		KubeClient:               w.client,
	})
	if err != nil {
		return nil, err
	}
	w.manager = dynamicresources.NewDRAManager(ctx, w.claims, tracker, w.factory)
	return w, nil
}

// versions makes the fake clientset keep resourceVersions as an API server does (the
// scheduler's assume cache orders a claim's versions by them): every create and
// update gets the next number.
func versions(c *fake.Clientset) {
	var rv atomic.Int64
	c.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		var obj runtime.Object
		switch a := a.(type) {
		case clienttesting.CreateAction:
			obj = a.GetObject()
		case clienttesting.UpdateAction:
			obj = a.GetObject()
		default:
			return false, nil, nil
		}
		if m, ok := obj.(metav1.Object); ok {
			m.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
		}
		return false, nil, nil
	})
}

// claimName is the ResourceClaim of a trace pod's GPUs.
func claimName(pod string) string { return pod + "-gpu" }

// draClaim is the ResourceClaim a user would write for a trace pod. A share s of one
// GPU asks cores = 100·s (as podObject's gpu-cores) and memory = s of the smallest
// GPU among the models the pod accepts: a claim names memory in bytes, not a
// percentage, so this is the most a user can ask that fits s of every GPU it may
// land on. Memory then never binds before cores, as gpu-memory-percent = gpu-cores
// never does in device-plugin mode, so the same pods fit the same GPUs. A whole GPU
// (and num_gpu > 1) asks that many devices at their default capacities: all of each.
// gpu_spec becomes a CEL selector on the model attribute.
func (w *draWorld) draClaim(tp *tracePod, pod string) *resourceapi.ResourceClaim {
	req := &resourceapi.ExactDeviceRequest{
		DeviceClassName: dra.DriverName,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           int64(tp.numGPU),
	}
	if len(tp.gpuSpec) > 0 {
		quoted := make([]string, len(tp.gpuSpec))
		for i, m := range tp.gpuSpec {
			quoted[i] = strconv.Quote(m)
		}
		req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.attributes[%q].%s in [%s]", dra.DriverName, dra.AttrModel, strings.Join(quoted, ", ")),
		}}}
	}
	if tp.gpuMilli < 1000 {
		pct := sharePercent(tp.gpuMilli)
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			dra.CapacityCores:  *resource.NewQuantity(pct, resource.DecimalSI),
			dra.CapacityMemory: *resource.NewQuantity(w.shareMiB(tp, pct)<<20, resource.BinarySI),
		}}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claimName(pod), Namespace: draNamespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}},
		}},
	}
}

// claimPod is the pod of a trace pod in DRA mode: podObject's CPU and memory, and its
// GPUs through the claim instead of extended resources.
func claimPod(tp *tracePod, name string, uid int) *v1.Pod {
	cpuOnly := *tp
	cpuOnly.numGPU, cpuOnly.gpuMilli, cpuOnly.gpuSpec = 0, 0, nil
	pod := podObject(&cpuOnly, name, uid)
	pod.Namespace = draNamespace
	if tp.numGPU == 0 {
		return pod
	}
	cn := claimName(name)
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &cn}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	return pod
}

// submit creates a trace pod's claim and waits until the scheduler's claim cache has
// it, as the informer delivers a user's claim before its pod is scheduled.
func (w *draWorld) submit(ctx context.Context, c *resourceapi.ResourceClaim) error {
	if _, err := w.client.ResourceV1().ResourceClaims(c.Namespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
		return err
	}
	return w.await(ctx, c.Namespace+"/"+c.Name, func(*resourceapi.ResourceClaim) bool { return true })
}

// await waits until the claim cache holds the claim in a state done accepts.
func (w *draWorld) await(ctx context.Context, key string, done func(*resourceapi.ResourceClaim) bool) error {
	for start := time.Now(); ; {
		if obj, err := w.claims.Get(key); err == nil {
			if c, ok := obj.(*resourceapi.ResourceClaim); ok && done(c) {
				return nil
			}
		}
		if time.Since(start) > 30*time.Second {
			return fmt.Errorf("claim %s: not seen by the scheduler's cache in 30 s", key)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Microsecond):
		}
	}
}

// allocated is the claim of a bound pod as the scheduler's cache holds it, with its
// allocation.
func (w *draWorld) allocated(pod *v1.Pod) (*resourceapi.ResourceClaim, error) {
	key := cache.NewObjectName(pod.Namespace, claimName(pod.Name)).String()
	obj, err := w.claims.Get(key)
	if err != nil {
		return nil, err
	}
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok || c.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s: bound but not allocated", key)
	}
	return c, nil
}

// take charges a bound pod's allocation to the ledger: each device's consumed cores
// (a whole device, allocated without consumed capacity, is all of it). It returns the
// milli-GPUs the allocation holds.
func (w *draWorld) take(led *ledger, node string, c *resourceapi.ResourceClaim) (int64, error) {
	var milli int64
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != dra.DriverName {
			continue
		}
		if r.Pool != node {
			return 0, fmt.Errorf("claim %s: device %s of pool %s on node %s", c.Name, r.Device, r.Pool, node)
		}
		i, ok := w.device[node][r.Device]
		if !ok {
			return 0, fmt.Errorf("claim %s: no device %s on node %s", c.Name, r.Device, node)
		}
		m := int64(1000)
		if q, ok := r.ConsumedCapacity[dra.CapacityCores]; ok {
			m = q.Value() * 10
		}
		led.free[node][i] -= m
		if led.free[node][i] < 0 {
			return 0, fmt.Errorf("node %s GPU %d: allocated over its cores (claim %s)", node, i, c.Name)
		}
		milli += m
	}
	return milli, nil
}

// sharePercent is a share of gpu_milli in percent, as podObject asks it.
func sharePercent(milli int64) int64 {
	pct := (milli + 5) / 10
	if pct < 1 {
		pct = 1
	}
	return pct
}

// markDRA sets each GPU node's inventory to DRA mode, as an agent with --dra publishes
// it.
func markDRA(nodes []*v1.Node) ([]*v1.Node, error) {
	out := make([]*v1.Node, len(nodes))
	for i, n := range nodes {
		raw, ok := n.Annotations[api.AnnotationInventory]
		if !ok {
			out[i] = n
			continue
		}
		inv, err := api.DecodeInventory(raw)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		inv.DRA = true
		if raw, err = api.EncodeInventory(inv); err != nil {
			return nil, err
		}
		n = n.DeepCopy()
		n.Annotations[api.AnnotationInventory] = raw
		n.UID = types.UID("node-" + n.Name)
		out[i] = n
	}
	return out, nil
}

// bind makes a DRA-mode pod count on its node: the snapshot's NodeInfo and, from its
// claim's allocation, the ledger. The allocation must hold what the trace pod asked.
func (w *draWorld) bind(snapshot *backendcache.Snapshot, pod *v1.Pod, node string, tp *tracePod, led *ledger) error {
	if err := addToNode(snapshot, pod, node); err != nil || tp.numGPU == 0 {
		return err
	}
	c, err := w.allocated(pod)
	if err != nil {
		return err
	}
	milli, err := w.take(led, node, c)
	if err != nil {
		return err
	}
	if want := int64(tp.numGPU) * sharePercent(tp.gpuMilli) * 10; milli != want {
		return fmt.Errorf("claim %s: allocated %d milli-GPUs, the pod asked %d", c.Name, milli, want)
	}
	return nil
}

// allocatedMilli is the GPU capacity the allocated claims in the scheduler's cache
// hold, in milli-GPUs.
func (w *draWorld) allocatedMilli() (int64, error) {
	var s int64
	for _, obj := range w.claims.List(nil) {
		c, ok := obj.(*resourceapi.ResourceClaim)
		if !ok || c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if q, ok := r.ConsumedCapacity[dra.CapacityCores]; ok {
				s += q.Value() * 10
			} else {
				s += 1000
			}
		}
	}
	return s, nil
}

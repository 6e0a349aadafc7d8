// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
	"github.com/tessera-dev/tessera/test/fixtures"
)

func unknown(s string) runtime.Object {
	return &runtime.Unknown{Raw: []byte(s), ContentType: runtime.ContentTypeJSON}
}

func TestDecodeArgs(t *testing.T) {
	args, dra, err := decodeArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if args.DevicePolicy != "Binpack" || *args.MemoryWeight != 1 || *args.CoresWeight != 1 || len(args.DeviceClassNames) != 1 || args.DeviceClassNames[0] != DriverName {
		t.Errorf("defaults: %+v", args)
	}
	if dra == nil {
		t.Fatal("no DynamicResources args")
	}
	args, dra, err = decodeArgs(unknown(`{"devicePolicy": "Spread", "coresWeight": 3, "dynamicResources": {"filterTimeout": "3s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if args.DevicePolicy != "Spread" || *args.CoresWeight != 3 || dra.FilterTimeout == nil || dra.FilterTimeout.Duration != 3*time.Second {
		t.Errorf("args %+v, DynamicResources args %+v", args, dra)
	}
	for in, want := range map[string]string{
		`{"devicePolicy": "FirstFit"}`:                    `"FirstFit" is not one of Binpack, Spread, Fragmentation`,
		`{"devicePolicie": "Spread"}`:                     `unknown field "devicePolicie"`,
		`{"memoryWeight": 0, "coresWeight": 0}`:           "cannot both be 0",
		`{"memoryWeight": -1}`:                            "out of range",
		`{"fragmentationWindow": -5}`:                     "out of range",
		`{"dynamicResources": {"filterTimeout": "soon"}}`: "dynamicResources",
	} {
		if _, _, err := decodeArgs(unknown(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", in, err, want)
		}
	}
}

// t4 is a model of four T4s and the devices the node agent publishes for them.
func t4(t *testing.T) (*nodemodel.Model, []resourceapi.Device) {
	return modelAndDevices(fixtures.PCIeNode("n", 4, "Tesla T4", fixtures.T4MiB))
}

// modelAndDevices is the model of inv and the devices the node agent publishes for it.
func modelAndDevices(inv *api.NodeInventory) (*nodemodel.Model, []resourceapi.Device) {
	var devs []resourceapi.Device
	for i := range inv.GPUs {
		uuid := inv.GPUs[i].UUID
		devs = append(devs, resourceapi.Device{Name: strings.ToLower(uuid),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{attrUUID: {StringValue: ptr.To(uuid)}}})
	}
	return nodemodel.Build(inv), devs
}

func slice(name string, count int64, devs ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: ptr.To("n"),
			Pool: resourceapi.ResourcePool{Name: "n", Generation: 1, ResourceSliceCount: count}, Devices: devs}}
}

func mib(v int64) *resource.Quantity { return resource.NewQuantity(v<<20, resource.BinarySI) }

// state is the allocated state of shares on the devices: memory MiB and cores each.
func state(devs []resourceapi.Device, shares map[int][2]int64) *structured.AllocatedState {
	s := &structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}
	for i, v := range shares {
		id := structured.MakeDeviceID(DriverName, "n", devs[i].Name)
		uid := types.UID("share-" + devs[i].Name)
		s.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, &uid))
		s.AggregatedCapacity[id] = structured.ConsumedCapacity{capacityMemory: mib(v[0]), capacityCores: resource.NewQuantity(v[1], resource.DecimalSI)}
	}
	return s
}

func testOrderer(t *testing.T, policy placement.Policy, m *nodemodel.Model) *orderer {
	args, _, err := decodeArgs(unknown(`{"devicePolicy": "` + string(policy) + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	o := newOrderer(args, nil, true)
	o.modelOf = func(string) *nodemodel.Model { return m }
	return o
}

func forDemand(o *orderer, memMiB int64, cores int) *demand {
	info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: 1, MemoryMiB: memMiB, Cores: cores}}}, Order: []int{0}, Device: o.placer}
	o.placer.PreparePod(&v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "p"}}, info)
	return &demand{info: info, c: &info.Req.Containers[0]}
}

func names(s *resourceapi.ResourceSlice) []string {
	var out []string
	for _, d := range s.Spec.Devices {
		out = append(out, d.Name)
	}
	return out
}

// TestOrderPool: a node's devices are offered in the policy's order, the devices a
// share does not fit last, and the slices the scheduler lists are never changed.
func TestOrderPool(t *testing.T) {
	m, devs := t4(t)
	// GPU 2 holds 8 GiB and 40 % of the cores; GPU 1 is full.
	usage := &deviceUsage{state: state(devs, map[int][2]int64{2: {8192, 40}, 1: {fixtures.T4MiB, 100}})}
	usage.tenants = map[structured.DeviceID]int{}
	for id := range usage.state.AllocatedSharedDeviceIDs {
		usage.tenants[structured.DeviceID{Driver: id.Driver, Pool: id.Pool, Device: id.Device}]++
	}
	for _, tc := range []struct {
		policy placement.Policy
		want   []int
	}{
		{"Binpack", []int{2, 0, 3, 1}},
		{"Spread", []int{0, 3, 2, 1}},
		{"Fragmentation", nil}, // any fitting order; GPU 1 last
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			o := testOrderer(t, tc.policy, m)
			in := []*resourceapi.ResourceSlice{slice("b", 2, devs[2:]...), slice("a", 2, devs[:2]...)}
			before := []string{in[0].Spec.Devices[0].Name, in[1].Spec.Devices[0].Name}
			out := slicesCopy(in)
			o.orderPool(out, "n", []int{0, 1}, usage, forDemand(o, 2048, 10))
			if in[0].Spec.Devices[0].Name != before[0] || in[1].Spec.Devices[0].Name != before[1] || len(in[0].Spec.Devices) != 2 {
				t.Fatal("the listed slices were changed in place")
			}
			// The pool's devices all go to its first slice by name ("a"), the other holds none.
			if len(out[0].Spec.Devices) != 0 || len(out[1].Spec.Devices) != 4 {
				t.Fatalf("slices hold %d and %d devices", len(out[0].Spec.Devices), len(out[1].Spec.Devices))
			}
			got := names(out[1])
			if got[3] != devs[1].Name {
				t.Errorf("the full GPU is not last: %v", got)
			}
			for i, w := range tc.want {
				if got[i] != devs[w].Name {
					t.Errorf("order %v, want GPUs %v", got, tc.want)
					break
				}
			}
		})
	}
}

// TestOrderPoolTogether: a request of two whole GPUs is offered the two the policy's
// topology search picks first, two GPUs of one NVLink island; the single-device order
// would offer the free GPU of the full island and one of the other, and first fit
// would take those two.
func TestOrderPoolTogether(t *testing.T) {
	m, devs := modelAndDevices(fixtures.NVLinkNode("n", 8, 4, "NVIDIA H100 80GB HBM3", 81559))
	// Island 0-3 has GPU 0 free and three GPUs full; island 4-7 is free.
	usage := &deviceUsage{state: state(devs, map[int][2]int64{1: {81559, 100}, 2: {81559, 100}, 3: {81559, 100}}), tenants: map[structured.DeviceID]int{}}
	island := func(name string) int {
		for i := range devs {
			if devs[i].Name == name {
				return i / 4
			}
		}
		return -1
	}
	for _, policy := range []placement.Policy{"Binpack", "Spread", "Fragmentation"} {
		t.Run(string(policy), func(t *testing.T) {
			o := testOrderer(t, policy, m)
			d := forDemand(o, 0, 100)
			d.c.GPUs = 2
			out := []*resourceapi.ResourceSlice{slice("a", 1, devs...)}
			o.orderPool(out, "n", []int{0}, usage, d)
			got := names(out[0])
			if island(got[0]) != 1 || island(got[1]) != 1 {
				t.Errorf("the first two devices %v are not of one free island (GPUs 4-7)", got[:2])
			}
		})
	}
}

// TestOrderPoolIndex: a pool's index (its devices and the GPU each is) is reused while
// its slices and the node's model are the objects it was built from, and built again
// from a slice that replaced one (another device list) or a new model; a pool already
// in the policy's order is passed on as published.
func TestOrderPoolIndex(t *testing.T) {
	m, devs := t4(t)
	usage := &deviceUsage{state: state(devs, map[int][2]int64{2: {8192, 40}}), tenants: map[structured.DeviceID]int{}}
	o := testOrderer(t, "Binpack", m)
	in := []*resourceapi.ResourceSlice{slice("a", 1, devs...)}
	first := func(in []*resourceapi.ResourceSlice) string {
		out := slicesCopy(in)
		o.orderPool(out, "n", []int{0}, usage, forDemand(o, 2048, 10))
		return names(out[0])[0]
	}
	if got := first(in); got != devs[2].Name {
		t.Fatalf("Binpack offers %s first, want the used GPU %s", got, devs[2].Name)
	}
	px := o.pools.byPool["n"]
	if first(in); o.pools.byPool["n"] != px {
		t.Error("the index was built again for the same slices")
	}
	// The agent publishes the pool again without the used GPU: the order follows.
	again := slice("a", 1, devs[0], devs[1], devs[3])
	again.Spec.Pool.Generation = 2
	if got := first([]*resourceapi.ResourceSlice{again}); got == devs[2].Name || o.pools.byPool["n"] == px {
		t.Errorf("after the slice was replaced: %s first, index rebuilt %v", got, o.pools.byPool["n"] != px)
	}
	// A new model (the node's inventory changed) builds it again too.
	px = o.pools.byPool["n"]
	m2, _ := t4(t)
	o.modelOf = func(string) *nodemodel.Model { return m2 }
	if first([]*resourceapi.ResourceSlice{again}); o.pools.byPool["n"] == px {
		t.Error("the index was kept for another model")
	}
	// Used GPU first in the published order already: the slice is passed on as it is.
	o.modelOf = func(string) *nodemodel.Model { return m }
	ordered := []*resourceapi.ResourceSlice{slice("a", 1, devs[2], devs[0], devs[1], devs[3])}
	out := slicesCopy(ordered)
	o.orderPool(out, "n", []int{0}, usage, forDemand(o, 2048, 10))
	if out[0] != ordered[0] {
		t.Errorf("a pool in the policy's order was copied: %v", names(out[0]))
	}
}

func slicesCopy(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	return append([]*resourceapi.ResourceSlice(nil), in...)
}

// TestOrderPoolLeavesIncompletePools: a pool whose slices the allocator would not use
// (one missing, or of two generations) is passed on as published.
func TestOrderPoolLeavesIncompletePools(t *testing.T) {
	m, devs := t4(t)
	usage := &deviceUsage{state: state(devs, map[int][2]int64{2: {8192, 40}}), tenants: map[structured.DeviceID]int{}}
	o := testOrderer(t, "Binpack", m)
	for name, in := range map[string][]*resourceapi.ResourceSlice{
		"missing": {slice("a", 2, devs...)},
		"generations": {slice("a", 2, devs[:2]...), func() *resourceapi.ResourceSlice {
			s := slice("b", 2, devs[2:]...)
			s.Spec.Pool.Generation = 2
			return s
		}()},
	} {
		out := slicesCopy(in)
		idx := make([]int, len(in))
		for i := range idx {
			idx[i] = i
		}
		o.orderPool(out, "n", idx, usage, forDemand(o, 1024, 10))
		for i := range out {
			if out[i] != in[i] {
				t.Errorf("%s: slice %d replaced", name, i)
			}
		}
	}
}

// TestDeviceUsage: consumed capacity in whole MiB and percent, shares counted, a
// device allocated whole all used.
func TestDeviceUsage(t *testing.T) {
	_, devs := t4(t)
	st := state(devs, map[int][2]int64{0: {3000, 30}})
	st.AllocatedDevices.Insert(structured.MakeDeviceID(DriverName, "n", devs[3].Name))
	u := &deviceUsage{state: st, tenants: map[structured.DeviceID]int{structured.MakeDeviceID(DriverName, "n", devs[0].Name): 2}}
	if got := u.of("n", devs[0].Name, fixtures.T4MiB); got != (placement.Usage{MemMiB: 3000, Cores: 30, Tenants: 2}) {
		t.Errorf("share: %+v", got)
	}
	if got := u.of("n", devs[1].Name, fixtures.T4MiB); got != (placement.Usage{}) {
		t.Errorf("free: %+v", got)
	}
	if got := u.of("n", devs[3].Name, fixtures.T4MiB); got != (placement.Usage{MemMiB: fixtures.T4MiB, Cores: 100, Tenants: 1}) {
		t.Errorf("whole: %+v", got)
	}
}

// emptyUsage is the claims' use of no device.
func emptyUsage() *deviceUsage {
	return &deviceUsage{state: &structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()},
		tenants: map[structured.DeviceID]int{}}
}

// TestScoreNode: a pod with a Tessera claim is scored by the node policy over what
// claims consume: Binpack prefers the node whose GPU is already used, Spread the
// empty one, and a node without a model or room scores 0.
func TestScoreNode(t *testing.T) {
	models := map[string]*nodemodel.Model{}
	usage := emptyUsage()
	infos := map[string]fwk.NodeInfo{}
	for _, name := range []string{"used", "empty", "full"} {
		inv := fixtures.PCIeNode(name, 1, "Tesla T4", fixtures.T4MiB)
		models[name] = nodemodel.Build(inv)
		id := structured.MakeDeviceID(DriverName, name, strings.ToLower(inv.GPUs[0].UUID))
		switch name {
		case "used":
			usage.state.AggregatedCapacity[id] = structured.ConsumedCapacity{capacityMemory: mib(8192), capacityCores: resource.NewQuantity(40, resource.DecimalSI)}
			usage.tenants[id] = 1
		case "full":
			usage.state.AllocatedDevices.Insert(id)
		}
		ni := framework.NewNodeInfo()
		ni.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("32"), v1.ResourceMemory: resource.MustParse("128Gi")}}})
		infos[name] = ni
	}
	for _, policy := range []placement.Policy{"Binpack", "Spread"} {
		o := testOrderer(t, policy, nil)
		o.modelOf = func(n string) *nodemodel.Model { return models[n] }
		d := forDemand(o, 2048, 10)
		d.usage = usage
		used, empty, full := o.scoreNode(d, infos["used"]), o.scoreNode(d, infos["empty"]), o.scoreNode(d, infos["full"])
		if full != 0 {
			t.Errorf("%s: a node without room scored %d", policy, full)
		}
		if (policy == "Binpack") != (used > empty) || used == empty {
			t.Errorf("%s: used node %d, empty node %d", policy, used, empty)
		}
		if got := o.scoreNode(&demand{info: d.info, c: d.c}, infos["used"]); got != 0 {
			t.Errorf("%s: scored %d without the claims' usage", policy, got)
		}
		// PreScore measures the cycle's largest node for a policy with a best-fit
		// term (Binpack), as TesseraGPUShare's PreScore does.
		cs := framework.NewCycleState()
		cs.Write(stateKey, &cycleState{d: d})
		pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("4")}}}}}}
		pl := &Plugin{order: o}
		if st := pl.PreScore(context.Background(), cs, pod, []fwk.NodeInfo{infos["used"], infos["empty"]}); !st.IsSuccess() {
			t.Fatalf("%s: PreScore %v", policy, st)
		}
		if want := o.nodePlacer.NeedsFit(); (d.fit != nil) != want {
			t.Errorf("%s: fit measured %v, want %v", policy, d.fit != nil, want)
		} else if want && (d.fit.CPUMilli != 32000 || d.fit.GPUs != 1 || d.fit.PodCPUMilli != 4000) {
			t.Errorf("%s: fit %+v, want 32 CPUs, 1 GPU, the pod's 4 CPUs", policy, *d.fit)
		}
	}
}

// TestScoreNodeTopology: a claim is scored with TesseraGPUShare's topology terms and
// weights. A one-GPU share on an empty NVLink node loses islandWeight points to an
// empty PCIe node of the same size (it breaks up a free island); a request of two
// devices prefers the node whose free GPUs are joined by NVLink (topologyWeight).
// With both weights 0 the nodes tie.
func TestScoreNodeTopology(t *testing.T) {
	models := map[string]*nodemodel.Model{}
	usage := emptyUsage()
	infos := map[string]fwk.NodeInfo{}
	take := func(node string, gpus ...int) {
		for _, i := range gpus {
			usage.state.AllocatedDevices.Insert(structured.MakeDeviceID(DriverName, node, strings.ToLower(fixtures.UUID(node, i))))
		}
	}
	for name, inv := range map[string]*api.NodeInventory{
		"nvlink": fixtures.NVLinkNode("nvlink", 4, 2, "NVIDIA H100", fixtures.H100MiB),
		"pcie":   fixtures.PCIeNode("pcie", 4, "NVIDIA H100", fixtures.H100MiB),
		"split":  fixtures.NVLinkNode("split", 4, 2, "NVIDIA H100", fixtures.H100MiB),
		"whole":  fixtures.NVLinkNode("whole", 4, 2, "NVIDIA H100", fixtures.H100MiB),
	} {
		models[name] = nodemodel.Build(inv)
		ni := framework.NewNodeInfo()
		ni.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi")}}})
		infos[name] = ni
	}
	take("split", 0, 2) // GPUs 1 and 3 free, in two islands
	take("whole", 0, 1) // GPUs 2 and 3 free, one island
	fit := &placement.FitScale{CPUMilli: 64000, GPUs: 4}
	for _, tc := range []struct {
		args     string
		islands  int64 // points the island term is worth
		topology bool  // whether locality counts
	}{{`{}`, placement.DefaultIslandWeight, true}, {`{"islandWeight": 0, "topologyWeight": 0}`, 0, false}} {
		args, _, err := decodeArgs(unknown(tc.args))
		if err != nil {
			t.Fatal(err)
		}
		o := newOrderer(args, nil, true)
		o.modelOf = func(n string) *nodemodel.Model { return models[n] }
		one := o.newDemand(&v1.Pod{}, api.ContainerRequest{GPUs: 1, MemoryMiB: 4096, Cores: 20})
		one.usage, one.fit = usage, fit
		if nv, pc := o.scoreNode(one, infos["nvlink"]), o.scoreNode(one, infos["pcie"]); pc-nv != tc.islands {
			t.Errorf("%s: one GPU: NVLink node %d, PCIe node %d; want the PCIe node %d points ahead", tc.args, nv, pc, tc.islands)
		}
		two := o.newDemand(&v1.Pod{}, api.ContainerRequest{GPUs: 2, Cores: 100})
		two.usage, two.fit = usage, fit
		split, whole := o.scoreNode(two, infos["split"]), o.scoreNode(two, infos["whole"])
		if split == 0 || tc.topology != (whole > split) || !tc.topology && whole != split {
			t.Errorf("%s: two GPUs: across islands %d, in one island %d", tc.args, split, whole)
		}
	}
}

// TestScoreHostOnly: a pod without GPUs is scored on DRA nodes by the node policy over
// what claims consume (TesseraGPUShare sees neither the claim pods nor their use):
// Binpack and Fragmentation prefer the node whose GPU a claim holds to the one whose
// free GPU the pod's CPU would strand; a node in device-plugin mode scores 0 here
// (TesseraGPUShare scores it). Pods with claims or extended resources are not host-only,
// nor is any pod for Fragmentation before it has seen a GPU pod.
func TestScoreHostOnly(t *testing.T) {
	models := map[string]*nodemodel.Model{}
	usage := emptyUsage()
	infos := map[string]fwk.NodeInfo{}
	for _, name := range []string{"taken", "free", "device-plugin"} {
		inv := fixtures.PCIeNode(name, 1, "Tesla T4", fixtures.T4MiB)
		inv.DRA = name != "device-plugin"
		models[name] = nodemodel.Build(inv)
		if name == "taken" {
			usage.state.AllocatedDevices.Insert(structured.MakeDeviceID(DriverName, name, strings.ToLower(inv.GPUs[0].UUID)))
		}
		ni := framework.NewNodeInfo()
		ni.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("8"), v1.ResourceMemory: resource.MustParse("64Gi")}}})
		infos[name] = ni
	}
	cpu := func(c string) v1.ResourceList { return v1.ResourceList{v1.ResourceCPU: resource.MustParse(c)} }
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "cpu"}, Spec: v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{Requests: cpu("6")}}}}}
	for _, policy := range []placement.Policy{"Binpack", "Fragmentation"} {
		o := testOrderer(t, policy, nil)
		o.modelOf = func(n string) *nodemodel.Model { return models[n] }
		if policy == "Fragmentation" {
			if o.hostOnlyPod(pod) != nil {
				t.Errorf("%s: a pod without GPUs scored before any GPU pod was seen", policy)
			}
			// A GPU pod of a claim: a share that needs 4 CPUs beside its GPU.
			info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{{GPUs: 1, MemoryMiB: 4096, Cores: 50}}}, Order: []int{0}, Device: o.placer}
			o.nodePlacer.PreparePod(&v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "gpu"}, Spec: v1.PodSpec{Containers: []v1.Container{{Resources: v1.ResourceRequirements{Requests: cpu("4")}}}}}, info)
		}
		h := &hostOnly{info: o.nodePlacer.HostOnlyPod(pod), usage: usage}
		if h.info == nil {
			t.Fatalf("%s: no host-only view of a pod without GPUs", policy)
		}
		if o.nodePlacer.NeedsFit() {
			h.fit = o.largest(pod, []fwk.NodeInfo{infos["taken"], infos["free"]})
		}
		taken, free := o.scoreHostOnly(h, infos["taken"]), o.scoreHostOnly(h, infos["free"])
		if taken <= free {
			t.Errorf("%s: node with its GPU taken %d, node with a free GPU %d: want the taken one", policy, taken, free)
		}
		if got := o.scoreHostOnly(h, infos["device-plugin"]); got != 0 {
			t.Errorf("%s: a device-plugin node scored %d", policy, got)
		}
		withClaim := pod.DeepCopy()
		withClaim.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "c", ResourceClaimName: ptr.To("c")}}
		extended := pod.DeepCopy()
		extended.Spec.Containers[0].Resources.Limits = v1.ResourceList{"tessera.dev/gpu": resource.MustParse("1")}
		if o.hostOnlyPod(withClaim) != nil || o.hostOnlyPod(extended) != nil {
			t.Errorf("%s: a pod with a claim or an extended resource taken for a pod without GPUs", policy)
		}
	}
}

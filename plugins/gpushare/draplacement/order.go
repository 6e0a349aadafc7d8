// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Capacities and attributes of Tessera's devices, as the node agent publishes them.
const (
	capacityMemory resourceapi.QualifiedName = "memory"
	capacityCores  resourceapi.QualifiedName = "cores"
	attrUUID       resourceapi.QualifiedName = "uuid"
)

// orderer orders a node's Tessera devices for the pod in PreFilter.
type orderer struct {
	h           fwk.Handle
	placer      placement.Placer // the device policy's
	nodePlacer  placement.Placer // the node policy's (Score)
	placers     map[placement.Policy]placement.Placer
	allowPolicy bool // a pod may choose its device policy (api.AnnotationDevicePolicy)
	w           placement.Weights
	classes     map[string]bool
	consumable  bool // DRAConsumableCapacity: claims consume part of a device
	nodeModels  *placement.Cache
	mu          sync.Mutex             // held from forPod to its release: one pod's order at a time
	cur         atomic.Pointer[demand] // the pod in PreFilter, nil otherwise
	classCache  sync.Map               // class name -> bool (a Tessera class), by the class object seen
	classObject sync.Map               // class name -> *resourceapi.DeviceClass last classified
	// modelOf is a node's Tessera model (model; tests replace it).
	modelOf func(node string) *nodemodel.Model
	pools   poolIndexes
}

// demand is what the pod in PreFilter asks of one Tessera device: the first
// unallocated Tessera request of its claims.
type demand struct {
	info *placement.PodInfo
	c    *api.ContainerRequest
	// usage is what the claims consumed when the pod's slices were listed (nil when
	// they were not, or held no Tessera device); Score reads it.
	usage *deviceUsage
	// fit is the cycle's largest feasible node, for a node policy whose score has a
	// best-fit term (PreScore; nil: not measured).
	fit *placement.FitScale
	// problem is why the pod cannot run for its annotations (annotations.go), or "".
	problem string
}

func newOrderer(args *Args, h fwk.Handle, consumable bool) *orderer {
	// Tenants per device are the allocator's to bound (the device's capacities), not
	// the placers'.
	w := placement.Weights{Memory: float64(*args.MemoryWeight), Cores: float64(*args.CoresWeight),
		Policy: float64(*args.PolicyWeight), Topology: float64(*args.TopologyWeight), Island: float64(*args.IslandWeight), MaxTenants: math.MaxInt32}
	o := &orderer{h: h, w: w, consumable: consumable, classes: map[string]bool{}, nodeModels: placement.NewCache(),
		allowPolicy: args.AllowPodPolicyOverride == nil || *args.AllowPodPolicyOverride}
	for _, c := range args.DeviceClassNames {
		o.classes[c] = true
	}
	o.modelOf = o.model
	o.placers = policies.Build(&placement.Env{Cache: o.nodeModels, Weights: &o.w, Window: args.FragmentationWindow})
	o.placer, o.nodePlacer = o.placers[args.DevicePolicy], o.placers[args.NodePolicy]
	return o
}

// forPod makes pod's demand (nil without one) the one ResourceSlices are ordered for
// until the returned release is called.
func (o *orderer) forPod(ctx context.Context, pod *v1.Pod) (d *demand, release func()) {
	o.mu.Lock()
	if d = o.demandOf(klog.FromContext(ctx), pod); d != nil {
		o.cur.Store(d)
	}
	return d, func() {
		o.cur.Store(nil)
		o.mu.Unlock()
	}
}

// demandOf is the pod's first unallocated request of a Tessera class, or nil.
func (o *orderer) demandOf(logger klog.Logger, pod *v1.Pod) *demand {
	for _, claim := range o.claimsOf(pod) {
		if claim.Status.Allocation != nil {
			continue
		}
		name := claim.Name
		for i := range claim.Spec.Devices.Requests {
			r := &claim.Spec.Devices.Requests[i]
			var class string
			var capacity *resourceapi.CapacityRequirements
			count := int64(1)
			switch {
			case r.Exactly != nil:
				class, capacity = r.Exactly.DeviceClassName, r.Exactly.Capacity
				if r.Exactly.AllocationMode == resourceapi.DeviceAllocationModeExactCount {
					count = r.Exactly.Count
				}
			case len(r.FirstAvailable) > 0:
				class, capacity = r.FirstAvailable[0].DeviceClassName, r.FirstAvailable[0].Capacity
				if r.FirstAvailable[0].AllocationMode == resourceapi.DeviceAllocationModeExactCount {
					count = r.FirstAvailable[0].Count
				}
			default:
				continue
			}
			if !o.isTessera(class) {
				continue
			}
			// A request of several devices is placed as a container of that many GPUs:
			// the policy's topology search picks them together (NVLink, NUMA).
			c := api.ContainerRequest{Name: r.Name, GPUs: int(max(1, min(count, api.MaxGPUsPerContainer))), Cores: 100}
			if capacity != nil {
				if q, ok := capacity.Requests[capacityMemory]; ok && q.Sign() > 0 {
					c.MemoryMiB = (q.Value() + 1<<20 - 1) >> 20
				}
				if q, ok := capacity.Requests[capacityCores]; ok && q.Sign() > 0 {
					c.Cores = int(min(q.Value(), 100))
				}
			}
			logger.V(5).Info("Tessera device order", "pod", klog.KObj(pod), "claim", name, "request", r.Name, "memoryMiB", c.MemoryMiB, "cores", c.Cores)
			d := o.newDemand(pod, c)
			if d.problem == "" {
				d.problem = claimAnnotationProblem(pod, o.requestConfig(claim, r).IsWorkConserving())
			}
			return d
		}
	}
	return o.extendedDemand(logger, pod)
}

// extendedDemand is the demand of a pod that asks whole GPUs by an extended resource a
// Tessera DeviceClass serves on DRA nodes (tessera.dev/gpu through
// whole-gpu.tessera.dev): the in-tree plugin allocates them from a claim it makes
// itself, so the first container asking for it is placed as a container of that many
// whole GPUs, as a claim's request of count N is. Nil for any other pod, and once the
// pod's claim for them exists (it is allocated).
func (o *orderer) extendedDemand(logger klog.Logger, pod *v1.Pod) *demand {
	if pod.Status.ExtendedResourceClaimStatus != nil {
		return nil
	}
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			rl := cs[i].Resources.Requests
			if len(rl) == 0 {
				rl = cs[i].Resources.Limits
			}
			for n, q := range rl {
				if q.Sign() <= 0 || !strings.Contains(string(n), "/") {
					continue
				}
				class := o.extendedClass(n)
				if class == "" {
					continue
				}
				c := api.ContainerRequest{Name: cs[i].Name, GPUs: int(max(1, min(q.Value(), api.MaxGPUsPerContainer))), Cores: 100}
				logger.V(5).Info("Tessera device order", "pod", klog.KObj(pod), "extendedResource", n, "class", class, "gpus", c.GPUs)
				return o.newDemand(pod, c)
			}
		}
	}
	return nil
}

// newDemand is the demand of pod placed as one container of request c, prepared by
// the device and node policies.
func (o *orderer) newDemand(pod *v1.Pod, c api.ContainerRequest) *demand {
	placer, problem := o.devicePlacer(pod)
	info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{c}}, Order: []int{0}, Device: placer}
	o.nodePlacer.PreparePod(pod, info)
	if placer != o.nodePlacer {
		placer.PreparePod(pod, info)
	}
	return &demand{info: info, c: &info.Req.Containers[0], problem: problem}
}

// claimsOf yields each of pod's claim entries with its ResourceClaim, for those whose
// claim exists (a template's may not be made yet).
func (o *orderer) claimsOf(pod *v1.Pod) iter.Seq2[*v1.PodResourceClaim, *resourceapi.ResourceClaim] {
	return func(yield func(*v1.PodResourceClaim, *resourceapi.ResourceClaim) bool) {
		for i := range pod.Spec.ResourceClaims {
			prc := &pod.Spec.ResourceClaims[i]
			name := claimName(pod, prc)
			if name == "" {
				continue
			}
			claim, err := o.h.SharedDRAManager().ResourceClaims().Get(pod.Namespace, name)
			if err != nil || claim == nil {
				continue
			}
			if !yield(prc, claim) {
				return
			}
		}
	}
}

// claimName is the name of the ResourceClaim a pod's claim entry refers to, or "" when
// the claim of a template is not generated yet.
func claimName(pod *v1.Pod, prc *v1.PodResourceClaim) string {
	if prc.ResourceClaimName != nil {
		return *prc.ResourceClaimName
	}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == prc.Name && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}

// isTessera reports whether a DeviceClass's requests are Tessera shares: the class is
// named in the args, or one of its selectors names the driver.
func (o *orderer) isTessera(name string) bool {
	if o.classes[name] {
		return true
	}
	class, err := o.h.SharedDRAManager().DeviceClasses().Get(name)
	if err != nil || class == nil {
		return false
	}
	if seen, ok := o.classObject.Load(name); ok && seen == class {
		v, _ := o.classCache.Load(name)
		return v.(bool)
	}
	tessera := false
	for _, s := range class.Spec.Selectors {
		if s.CEL != nil && strings.Contains(s.CEL.Expression, "device.driver") && strings.Contains(s.CEL.Expression, `"`+DriverName+`"`) {
			tessera = true
		}
	}
	o.classCache.Store(name, tessera)
	o.classObject.Store(name, class)
	return tessera
}

// reorder returns slices with each node's Tessera devices in the current pod's order,
// or slices itself when no pod with a Tessera request is in PreFilter. Slices are
// never changed in place: an ordered pool is a copy of its first slice holding all
// the pool's devices and copies of the others holding none.
func (o *orderer) reorder(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	d := o.cur.Load()
	if d == nil {
		return in
	}
	pools := map[string][]int{}
	for i, s := range in {
		if s.Spec.Driver == DriverName && s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
			pools[s.Spec.Pool.Name] = append(pools[s.Spec.Pool.Name], i)
		}
	}
	if len(pools) == 0 {
		return in
	}
	usage, err := o.usage()
	if err != nil {
		klog.V(4).Info("Tessera device order skipped: the claims' allocated state is not available", "err", err)
		return in
	}
	d.usage = usage
	out := slices.Clone(in)
	for pool, idx := range pools {
		o.orderPool(out, pool, idx, usage, d)
	}
	return out
}

// orderPool orders one pool's devices (the slices of out at idx) for d.
func (o *orderer) orderPool(out []*resourceapi.ResourceSlice, pool string, idx []int, usage *deviceUsage, d *demand) {
	// The allocator reads a pool's slices in name order; all of the newest generation
	// or none (an incomplete pool is not allocated from, and is left as it is).
	slices.SortFunc(idx, func(a, b int) int { return strings.Compare(out[a].Name, out[b].Name) })
	gen := out[idx[0]].Spec.Pool.Generation
	for _, i := range idx {
		if out[i].Spec.Pool.Generation != gen || *out[i].Spec.NodeName != *out[idx[0]].Spec.NodeName {
			return
		}
	}
	if int64(len(idx)) != out[idx[0]].Spec.Pool.ResourceSliceCount {
		return
	}
	m := o.modelOf(*out[idx[0]].Spec.NodeName)
	if m == nil {
		return
	}
	px := o.pools.index(out, pool, idx, m)
	devs, at := px.devs, px.at
	used := make([]placement.Usage, len(m.Devices))
	for i, k := range at {
		if k >= 0 {
			used[i] = usage.of(pool, devs[k].Name, m.Devices[i].MemoryMiB)
		}
	}
	order := o.rank(m, used, at, d)
	if order == nil || published(order) {
		return // the published order is the policy's: the pool is offered as it is
	}
	ordered := make([]resourceapi.Device, 0, len(devs))
	taken := make([]bool, len(devs))
	for _, k := range order {
		ordered = append(ordered, devs[k])
		taken[k] = true
	}
	for k := range devs {
		if !taken[k] {
			ordered = append(ordered, devs[k])
		}
	}
	for n, i := range idx {
		s := *out[i]
		s.Spec.Devices = nil
		if n == 0 {
			s.Spec.Devices = ordered
		}
		out[i] = &s
	}
}

// published reports whether the devices in order, followed by the others in their
// published order, are the published order.
func published(order []int) bool {
	for j, k := range order {
		if k != j {
			return false
		}
	}
	return true
}

// poolIndexes keeps, for each pool, what its published devices say that does not
// change from one pod to the next: its devices in the allocator's order and the device
// of each GPU of the node's model. Built again when the pool's slices or the node's
// model are other objects than those it was built from (the informers replace an
// object when it changes, and never change one in place). Building it for every pool
// and pod (each device's UUID read from its attribute map) took a third of the device
// order's time in a DRA replay of the B1 trace.
type poolIndexes struct {
	mu      sync.Mutex
	byPool  map[string]*poolIndex
	lookups int // since the last sweep of pools no longer listed
}

type poolIndex struct {
	slices []*resourceapi.ResourceSlice // the pool's slices, in name order
	model  *nodemodel.Model
	devs   []resourceapi.Device // the slices' devices, in order; never written
	at     []int                // model position -> position in devs, -1 for none
	seen   bool                 // looked up since the last sweep
}

// index is the index of the pool whose slices are out at idx (in name order) on the
// node of model m.
func (x *poolIndexes) index(out []*resourceapi.ResourceSlice, pool string, idx []int, m *nodemodel.Model) *poolIndex {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byPool == nil {
		x.byPool = map[string]*poolIndex{}
	}
	// Pools that leave the cluster are swept once every pool could have been looked
	// up twice since the last sweep.
	if x.lookups++; x.lookups > 2*len(x.byPool)+64 {
		for name, px := range x.byPool {
			if !px.seen {
				delete(x.byPool, name)
			}
			px.seen = false
		}
		x.lookups = 0
	}
	if px := x.byPool[pool]; px != nil && px.model == m && len(px.slices) == len(idx) {
		same := true
		for j, i := range idx {
			if px.slices[j] != out[i] {
				same = false
				break
			}
		}
		if same {
			px.seen = true
			return px
		}
	}
	px := &poolIndex{model: m, at: make([]int, len(m.Devices)), seen: true}
	for _, i := range idx {
		px.slices = append(px.slices, out[i])
	}
	if len(idx) == 1 {
		px.devs = out[idx[0]].Spec.Devices
	} else {
		for _, i := range idx {
			px.devs = append(px.devs, out[i].Spec.Devices...)
		}
	}
	for i := range px.at {
		px.at[i] = -1
	}
	for k := range px.devs {
		a, ok := px.devs[k].Attributes[attrUUID]
		if !ok || a.StringValue == nil {
			continue
		}
		if i, ok := m.ByUUID[*a.StringValue]; ok {
			px.at[i] = k
		}
	}
	x.byPool[pool] = px
	return px
}

// rank is the positions in devs of the devices that fit d, the policy's pick first and
// the others by its device score; nil when none fits.
func (o *orderer) rank(m *nodemodel.Model, used []placement.Usage, at []int, d *demand) []int {
	var cand []int
	for i := range m.Devices {
		if at[i] < 0 || !m.Hot[i].Healthy {
			continue
		}
		total := m.Hot[i].MemoryMiB
		if used[i].MemMiB+d.c.MemoryOn(total) > total || used[i].Cores+d.c.Cores > 100 {
			continue
		}
		cand = append(cand, i)
	}
	if len(cand) == 0 {
		return nil
	}
	if d.c.GPUs > 1 {
		if set := o.together(m, used, cand, d); set != nil {
			return o.byScore(m, used, at, cand, d, set)
		}
	}
	first := d.info.Device.PickDevice(&placement.Allocation{}, m, used, d.info, d.c, &o.w, cand)
	return o.byScore(m, used, at, cand, d, []int{first})
}

// byScore is the positions in devs of cand: those of lead first, in its order, then
// the others by the policy's device score.
func (o *orderer) byScore(m *nodemodel.Model, used []placement.Usage, at, cand []int, d *demand, lead []int) []int {
	rank := make(map[int]int, len(lead))
	for n, i := range lead {
		rank[i] = n + 1
	}
	score := make(map[int]float64, len(cand))
	for _, i := range cand {
		score[i] = d.info.Device.DeviceScore(m, used, d.c, i, &o.w)
	}
	slices.SortStableFunc(cand, func(a, b int) int {
		ra, rb := rank[a], rank[b]
		switch {
		case ra > 0 && rb > 0:
			return ra - rb
		case ra > 0:
			return -1
		case rb > 0:
			return 1
		case score[a] > score[b]:
			return -1
		case score[a] < score[b]:
			return 1
		}
		return 0
	})
	order := make([]int, len(cand))
	for n, i := range cand {
		order[n] = at[i]
	}
	return order
}

// together is the devices the policy places a request of several devices on (the
// topology search of a multi-GPU container: one NVLink island, one NUMA node where it
// can), all of them candidates; nil when it finds none. The allocator, first fit,
// then takes them as the first that fit.
func (o *orderer) together(m *nodemodel.Model, used []placement.Usage, cand []int, d *demand) []int {
	a, fail := placement.Allocate(m, used, d.info, &o.w)
	if fail != nil || len(a.Placements) != 1 || len(a.Placements[0].Devices) != d.c.GPUs {
		return nil
	}
	set := a.Placements[0].Devices
	for _, i := range set {
		if !slices.Contains(cand, i) {
			return nil
		}
	}
	return set
}

// model is node's Tessera model from its inventory annotation, nil when the node is
// unknown or has none.
func (o *orderer) model(node string) *nodemodel.Model {
	ni, err := o.h.SnapshotSharedLister().NodeInfos().Get(node)
	if err != nil || ni == nil || ni.Node() == nil {
		return nil
	}
	v, _ := o.nodeModels.View(ni.Node(), nil)
	return v.Model
}

// deviceUsage is what allocated and in-flight claims consume of each device.
type deviceUsage struct {
	state *structured.AllocatedState
	// tenants counts the shares of each device.
	tenants map[structured.DeviceID]int

	// byPool is state and tenants for Tessera's devices, by pool and device name,
	// built once at the first lookup: a lookup by DeviceID interns three strings
	// (unique.Make), which for every device of every node took 11 % of a DRA replay's
	// time.
	once   sync.Once
	byPool map[string]map[string]deviceUse
}

// deviceUse is what claims hold of one device.
type deviceUse struct {
	whole    bool  // allocated without consumable capacity: all of it
	memBytes int64 // consumed memory
	cores    int
	tenants  int
}

// index builds byPool from state and tenants.
func (u *deviceUsage) index() {
	u.byPool = map[string]map[string]deviceUse{}
	at := func(id structured.DeviceID) *deviceUse {
		if id.Driver.String() != DriverName {
			return nil
		}
		p := u.byPool[id.Pool.String()]
		if p == nil {
			p = map[string]deviceUse{}
			u.byPool[id.Pool.String()] = p
		}
		d := p[id.Device.String()]
		return &d
	}
	put := func(id structured.DeviceID, d *deviceUse) { u.byPool[id.Pool.String()][id.Device.String()] = *d }
	for id := range u.state.AllocatedDevices {
		if d := at(id); d != nil {
			d.whole = true
			put(id, d)
		}
	}
	for id, c := range u.state.AggregatedCapacity {
		if d := at(id); d != nil {
			if q := c[capacityMemory]; q != nil {
				d.memBytes = q.Value()
			}
			if q := c[capacityCores]; q != nil {
				d.cores = int(q.Value())
			}
			put(id, d)
		}
	}
	for id, n := range u.tenants {
		if d := at(id); d != nil {
			d.tenants = n
			put(id, d)
		}
	}
}

// usage gathers the claims' allocated state, retrying the tracker's concurrent
// modification as the in-tree plugin does.
func (o *orderer) usage() (*deviceUsage, error) {
	tracker := o.h.SharedDRAManager().ResourceClaims()
	var err error
	for try := 0; try < 10; try++ {
		u := &deviceUsage{tenants: map[structured.DeviceID]int{}}
		if o.consumable {
			u.state, err = tracker.GatherAllocatedState()
			if err == nil && u.state == nil {
				err = errors.New("nil allocated state")
			}
			if err == nil {
				for id := range u.state.AllocatedSharedDeviceIDs {
					u.tenants[structured.DeviceID{Driver: id.Driver, Pool: id.Pool, Device: id.Device}]++
				}
			}
		} else {
			set, lerr := tracker.ListAllAllocatedDevices()
			err = lerr
			if err == nil {
				u.state = &structured.AllocatedState{AllocatedDevices: set}
				for id := range set {
					u.tenants[id] = 1
				}
			}
		}
		if err == nil {
			return u, nil
		}
	}
	return nil, err
}

// of is the usage of device name of pool: its consumed memory (MiB) and cores and
// its number of shares; a device allocated whole is all used.
func (u *deviceUsage) of(pool, name string, memMiB int64) placement.Usage {
	u.once.Do(u.index)
	d, ok := u.byPool[pool][name]
	if !ok {
		return placement.Usage{}
	}
	if d.whole {
		return placement.Usage{MemMiB: memMiB, Cores: 100, Tenants: max(1, d.tenants)}
	}
	return placement.Usage{MemMiB: (d.memBytes + 1<<20 - 1) >> 20, Cores: d.cores, Tenants: d.tenants}
}

// onNode is the usage of each of m's devices on node (its pool is named after the
// node, as the node agent publishes it).
func (u *deviceUsage) onNode(node string, m *nodemodel.Model) []placement.Usage {
	used := make([]placement.Usage, len(m.Devices))
	for i := range m.Devices {
		used[i] = u.of(node, strings.ToLower(m.Devices[i].UUID), m.Devices[i].MemoryMiB)
	}
	return used
}

// scoreNode is the node policy's score of placing d on node ni, by the node's Tessera
// model and what claims consume of its devices (its pool is named after the node, as
// the node agent publishes it); 0 when the node has no Tessera model or the policy
// finds no device for d (the allocator may still: an MPS GPU, which the model keeps
// for MPS pods of the device-plugin path).
func (o *orderer) scoreNode(d *demand, ni fwk.NodeInfo) int64 {
	node := ni.Node()
	if node == nil || d.usage == nil {
		return 0
	}
	m := o.modelOf(node.Name)
	if m == nil {
		return 0
	}
	a, fail := placement.Allocate(m, d.usage.onNode(node.Name, m), d.info, &o.w)
	if fail != nil {
		return 0
	}
	return o.nodePlacer.ScoreNode(d.info, a, ni, d.fit, &o.w)
}

// hostOnly is what the node policy scores a pod without GPUs by on DRA nodes: the
// policy's view of it (its HostOnlyPod, with the workload this plugin's placers
// learned from claim pods) and the claims' use of the devices. TesseraGPUShare scores
// such a pod on device-plugin nodes; on DRA nodes it has seen none of the GPU pods and
// none of the claims' use, and left the pod unscored (a DRA replay of the B1 trace
// under Fragmentation: 5.24 against 4.22 in device-plugin mode).
type hostOnly struct {
	info  *placement.PodInfo
	usage *deviceUsage
	fit   *placement.FitScale
}

// hostOnlyPod is the hostOnly of a pod without claims and without extended resources
// (TesseraGPUShare's names and the DRA extended resources go through their own
// paths), nil for any other or where the policy does not score such pods.
func (o *orderer) hostOnlyPod(pod *v1.Pod) *hostOnly {
	if len(pod.Spec.ResourceClaims) > 0 || asksExtended(pod) {
		return nil
	}
	info := o.nodePlacer.HostOnlyPod(pod)
	if info == nil {
		return nil
	}
	u, err := o.usage()
	if err != nil {
		return nil
	}
	return &hostOnly{info: info, usage: u}
}

// asksExtended reports whether a container of pod asks for an extended resource: a
// name with a domain other than Kubernetes' own (without the regular expressions of
// the full qualified-name check, which cost microseconds a name).
func asksExtended(pod *v1.Pod) bool {
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			for _, rl := range []v1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for n := range rl {
					if slash := strings.IndexByte(string(n), '/'); slash > 0 && !strings.HasSuffix(string(n[:slash]), "kubernetes.io") {
						return true
					}
				}
			}
		}
	}
	return false
}

// scoreHostOnly is the node policy's score of a pod without GPUs on ni, a DRA node,
// by its model and the claims' use of its devices; 0 on any other node.
func (o *orderer) scoreHostOnly(h *hostOnly, ni fwk.NodeInfo) int64 {
	node := ni.Node()
	if node == nil {
		return 0
	}
	m := o.modelOf(node.Name)
	if m == nil || !m.DRA {
		return 0
	}
	return o.nodePlacer.ScoreHostOnly(nil, placement.NodeView{Model: m}, h.usage.onNode(node.Name, m), h.info, ni, h.fit, &o.w)
}

// largest is the cycle's largest feasible node for the node policy's best-fit term:
// the most allocatable CPU and the most healthy GPUs among nodes (TesseraGPUShare's
// PreScore measures the same for pods of tessera.dev/* resources).
func (o *orderer) largest(pod *v1.Pod, nodes []fwk.NodeInfo) *placement.FitScale {
	f := &placement.FitScale{}
	f.PodCPUMilli, _ = placement.PodHostRequests(pod)
	for _, ni := range nodes {
		node := ni.Node()
		if node == nil {
			continue
		}
		f.CPUMilli = max(f.CPUMilli, float64(ni.GetAllocatable().GetMilliCPU()))
		if m := o.modelOf(node.Name); m != nil {
			f.GPUs = max(f.GPUs, float64(m.Healthy))
		}
	}
	return f
}

// twoClaimsInOneContainer is why pod cannot run when one of its containers uses two
// claims with Tessera requests, or "": each prepared claim mounts its limits and its
// accounting region at the same paths in the container (the CUDA hook reads one
// limits file), so the second would hide the first. A container that needs several
// GPUs asks for them in one claim (count: N, or several requests of one claim).
func (o *orderer) twoClaimsInOneContainer(pod *v1.Pod) string {
	if len(pod.Spec.ResourceClaims) < 2 {
		return ""
	}
	tessera := map[string]bool{} // the pod's claim entries whose claim has a Tessera request
	for prc, claim := range o.claimsOf(pod) {
		for j := range claim.Spec.Devices.Requests {
			r := &claim.Spec.Devices.Requests[j]
			if r.Exactly != nil && o.isTessera(r.Exactly.DeviceClassName) {
				tessera[prc.Name] = true
			}
			for k := range r.FirstAvailable {
				if o.isTessera(r.FirstAvailable[k].DeviceClassName) {
					tessera[prc.Name] = true
				}
			}
		}
	}
	if len(tessera) < 2 {
		return ""
	}
	check := func(c *v1.Container) string {
		var used []string
		for _, rc := range c.Resources.Claims {
			if tessera[rc.Name] && !slices.Contains(used, rc.Name) {
				used = append(used, rc.Name)
			}
		}
		if len(used) < 2 {
			return ""
		}
		return fmt.Sprintf("container %q uses %d claims of Tessera GPUs (%s): a container may use one, whose limits the CUDA hook enforces; ask for all its GPUs in one claim (count: N)",
			c.Name, len(used), strings.Join(used, ", "))
	}
	for i := range pod.Spec.InitContainers {
		if why := check(&pod.Spec.InitContainers[i]); why != "" {
			return why
		}
	}
	for i := range pod.Spec.Containers {
		if why := check(&pod.Spec.Containers[i]); why != "" {
			return why
		}
	}
	return ""
}

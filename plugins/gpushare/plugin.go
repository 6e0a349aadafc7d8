// SPDX-License-Identifier: Apache-2.0

// Package gpushare is Tessera's scheduler plugin: it places GPU fractions on specific
// GPUs of specific nodes. PreFilter parses a pod's request, Filter finds GPUs for every
// container on a node, Score applies the node-level policy and topology, Reserve picks
// the exact GPUs by the GPU-level policy and assumes them in the plugin's cache, and
// Bind binds the pod with the assignment annotation that the node agent enforces
// (or, with assignmentWrite: PreBind, PreBind patches it on before another binder).
package gpushare

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/fragmentation"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Name is the plugin's name in scheduler profiles.
const Name = "TesseraGPUShare"

// Plugin implements the scheduler framework extension points for GPU sharing.
type Plugin struct {
	handle    fwk.Handle
	args      *TesseraGPUShareArgs
	names     api.ResourceNames
	w         placement.Weights
	staleness time.Duration
	cache     *placement.Cache
	synced    func() bool
	now       func() time.Time
	// workload is the recent mix of GPU pods the Fragmentation placer learns, for
	// the metrics.
	workload *fragmentation.WorkloadModel
	// placers holds one placer per policy; node is the profile's node-level one.
	placers map[Policy]placement.Placer
	node    placement.Placer
	// bind records whether this profile binds GPU pods itself (see bindsPods).
	bind bindMode
	// profile is the scheduler profile's name, for the metrics.
	profile string
}

var (
	_ fwk.PreFilterPlugin     = &Plugin{}
	_ fwk.PreFilterExtensions = &Plugin{}
	_ fwk.FilterPlugin        = &Plugin{}
	_ fwk.PreScorePlugin      = &Plugin{}
	_ fwk.ScorePlugin         = &Plugin{}
	_ fwk.ReservePlugin       = &Plugin{}
	_ fwk.PreBindPlugin       = &Plugin{}
	_ fwk.BindPlugin          = &Plugin{}
	_ fwk.EnqueueExtensions   = &Plugin{}
)

// Name returns the plugin name.
func (pl *Plugin) Name() string { return Name }

// New is the plugin factory with built-in defaults.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	return NewWithDefaults(&Defaults{})(ctx, obj, h)
}

// NewWithDefaults returns a factory whose profiles fall back to *d for fields their
// args leave empty. d is read when a profile is built, after flags are parsed.
func NewWithDefaults(d *Defaults) frameworkruntime.PluginFactory {
	return func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		args, err := DecodeArgs(obj, *d)
		if err != nil {
			return nil, err
		}
		RegisterMetrics()
		c, synced := sharedCache(ctx, h)
		pl := newPlugin(args, h, c, synced)
		pl.profile = fwk.ProfileName(h)
		// Zero series from the start, so that rates and alerts see the first event.
		decisions.WithLabelValues(pl.profile, string(args.NodePolicy), string(args.DevicePolicy), resultPlaced, "")
		reserveConflicts.WithLabelValues(pl.profile)
		// Only plugins of a scheduler with informers are reported by the collector:
		// they stop with ctx, and so does their reporting.
		if h != nil && h.SharedInformerFactory() != nil {
			untrack := trackPlugin(pl)
			go func() {
				<-ctx.Done()
				untrack()
			}()
		}
		return pl, nil
	}
}

func newPlugin(args *TesseraGPUShareArgs, h fwk.Handle, c *placement.Cache, synced func() bool) *Plugin {
	pl := &Plugin{
		handle: h,
		args:   args,
		names:  *args.ResourceNames,
		w: placement.Weights{
			Memory: float64(*args.MemoryWeight), Cores: float64(*args.CoresWeight),
			Policy: float64(*args.PolicyWeight), Topology: float64(*args.TopologyWeight), Island: float64(*args.IslandWeight),
			MaxTenants: args.MaxTenantsPerGPU,
		},
		staleness: args.InventoryStaleness.Duration,
		cache:     c,
		synced:    synced,
		now:       time.Now,
	}
	pl.placers = policies.Build(&placement.Env{Cache: c, Weights: &pl.w, Window: args.FragmentationWindow})
	pl.node = pl.placers[args.NodePolicy]
	pl.workload = fragmentation.WorkloadOf(pl.placers[Fragmentation])
	return pl
}

// The profiles of one scheduler share one informer factory; they must share one
// cache too, or a binpack and a spread profile would grant the same GPU twice.
var (
	sharedMu     sync.Mutex
	sharedCaches = map[informers.SharedInformerFactory]*sharedEntry{}
)

type sharedEntry struct {
	cache  *placement.Cache
	synced func() bool
}

func sharedCache(ctx context.Context, h fwk.Handle) (*placement.Cache, func() bool) {
	f := h.SharedInformerFactory()
	if f == nil {
		return placement.NewCache(), func() bool { return true }
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if e := sharedCaches[f]; e != nil {
		return e.cache, e.synced
	}
	c := placement.NewCache()
	logger := klog.FromContext(ctx).WithValues("plugin", Name)
	// Node events are applied by the feed's goroutines (decoding inventories in
	// parallel), each node's in order.
	feed := newNodeFeed()
	feed.run(ctx, c)
	pushNode := func(obj any) {
		if n, ok := obj.(*v1.Node); ok {
			feed.push(nodeEvent{name: n.Name, inventory: n.Annotations[api.AnnotationInventory], requirements: n.Annotations[api.AnnotationRequirements]})
		}
	}
	nodeReg, _ := f.Core().V1().Nodes().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    pushNode,
		UpdateFunc: func(_, obj any) { pushNode(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*v1.Node); ok {
				feed.push(nodeEvent{name: n.Name, deleted: true})
			}
		},
	})
	onPod := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok {
			return
		}
		if err := c.OnPod(p); err != nil {
			logger.Error(err, "Ignoring the GPU assignment of a pod", "pod", klog.KObj(p))
		}
	}
	podReg, _ := f.Core().V1().Pods().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    onPod,
		UpdateFunc: func(_, obj any) { onPod(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*v1.Pod); ok {
				c.OnPodDelete(p.UID)
			}
		},
	})
	// Synced once both registrations have seen the initial lists and the feed has
	// applied every node event they brought.
	synced := func() bool {
		if !(nodeReg == nil || nodeReg.HasSynced()) || !(podReg == nil || podReg.HasSynced()) {
			return false
		}
		feed.mark()
		return feed.caughtUp()
	}
	sharedCaches[f] = &sharedEntry{cache: c, synced: synced}
	// The scheduler's informers stop with ctx; so does the cache's use. Forgetting it
	// then keeps a process that starts schedulers one after another (tests, a
	// restarted scheduler in one process) from holding every old cache.
	go func() {
		<-ctx.Done()
		sharedMu.Lock()
		if sharedCaches[f] != nil && sharedCaches[f].cache == c {
			delete(sharedCaches, f)
		}
		sharedMu.Unlock()
	}()
	return c, synced
}

// Cache returns the plugin's cache (for tools that report allocation).
func (pl *Plugin) Cache() *placement.Cache { return pl.cache }

// EventsToRegister lists the events that can make a GPU-unschedulable pod schedulable.
func (pl *Plugin) EventsToRegister(_ context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: boundPodResource, ActionType: fwk.Delete}, QueueingHintFn: pl.hintPodDeleted},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAnnotation}, QueueingHintFn: pl.hintNodeChanged},
	}, nil
}

// hintPodDeleted queues only when the deleted pod held GPUs.
func (pl *Plugin) hintPodDeleted(logger klog.Logger, pod *v1.Pod, oldObj, _ any) (fwk.QueueingHint, error) {
	deleted, ok := oldObj.(*v1.Pod)
	if !ok {
		if t, isTomb := oldObj.(toolscache.DeletedFinalStateUnknown); isTomb {
			deleted, ok = t.Obj.(*v1.Pod)
		}
	}
	if !ok {
		return fwk.Queue, fmt.Errorf("unexpected object %T in pod delete event", oldObj)
	}
	if _, has := deleted.Annotations[api.AnnotationAssignment]; has && deleted.Spec.NodeName != "" {
		// The cache's own informer handler may run after the scheduler's; release the
		// grants now so that the retry this hint triggers sees the freed capacity.
		pl.cache.OnPodDelete(deleted.UID)
		logger.V(5).Info("A pod holding GPUs was deleted", "pod", klog.KObj(pod), "deleted", klog.KObj(deleted))
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// hintNodeChanged queues when a node appears with an inventory, its inventory
// changes, or its agent's requirements become met.
func (pl *Plugin) hintNodeChanged(logger klog.Logger, pod *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	n, ok := newObj.(*v1.Node)
	if !ok {
		return fwk.Queue, fmt.Errorf("unexpected object %T in node event", newObj)
	}
	raw, has := n.Annotations[api.AnnotationInventory]
	if !has {
		return fwk.QueueSkip, nil
	}
	req := n.Annotations[api.AnnotationRequirements]
	old, _ := oldObj.(*v1.Node)
	if old != nil && old.Annotations[api.AnnotationInventory] == raw {
		if old.Annotations[api.AnnotationRequirements] == req || api.RequirementsError(req) != nil {
			return fwk.QueueSkip, nil
		}
		pl.cache.SetRequirements(n.Name, req)
		logger.V(5).Info("A node now meets Tessera's requirements", "pod", klog.KObj(pod), "node", klog.KObj(n))
		return fwk.Queue, nil
	}
	pl.cache.SetInventory(n.Name, raw)
	pl.cache.SetRequirements(n.Name, req)
	logger.V(5).Info("A node's GPU inventory appeared or changed", "pod", klog.KObj(pod), "node", klog.KObj(n))
	return fwk.Queue, nil
}

// PreFilter parses and validates the pod's GPU request. Pods without one are skipped.
func (pl *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if !api.HasGPURequest(pod, pl.names) {
		// A pod with ResourceClaims is not scored as a pod without GPUs: its GPUs may
		// be claims, which TesseraDynamicResources scores by the same policy.
		var hostOnly *placement.PodInfo
		if len(pod.Spec.ResourceClaims) == 0 {
			hostOnly = pl.node.HostOnlyPod(pod)
		}
		cs.Write(stateKey, &cycleState{skip: true, hostOnly: hostOnly})
		return nil, fwk.NewStatus(fwk.Skip)
	}
	info, err := pl.parsePod(pod)
	if err != nil {
		pl.decide(pl.args.DevicePolicy, resultUnschedulable, reasonInvalidRequest)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	if !pl.synced() {
		pl.decide(info.Device.Policy(), resultError, reasonNotSynced)
		return nil, fwk.AsStatus(fmt.Errorf("the GPU cache has not synced with the API server yet"))
	}
	pl.node.PreparePod(pod, info)
	if info.Device != pl.node {
		info.Device.PreparePod(pod, info)
	}
	cs.Write(stateKey, &cycleState{id: nextCycleID(), info: info, now: pl.now(),
		dra: info.WholeGPUsOnly() && draBacked(pl.handle, pl.names.GPU)})
	return nil, nil
}

// parsePod builds PodInfo from the pod's resources and annotations.
func (pl *Plugin) parsePod(pod *v1.Pod) (*placement.PodInfo, error) {
	req, err := api.ParsePodRequest(pod, pl.names)
	if err != nil {
		return nil, err
	}
	info := &placement.PodInfo{Req: req, Device: pl.placers[pl.args.DevicePolicy]}
	ann := pod.Annotations
	info.ModelInclude = splitList(ann[api.AnnotationModelInclude], true)
	info.ModelExclude = splitList(ann[api.AnnotationModelExclude], true)
	info.UUIDInclude = splitList(ann[api.AnnotationUUIDInclude], false)
	info.UUIDExclude = splitList(ann[api.AnnotationUUIDExclude], false)
	if info.Topology, err = api.ParseTopology(ann[api.AnnotationTopology]); err != nil {
		return nil, err
	}
	if err := placement.ParseSharing(pod, info); err != nil {
		return nil, err
	}
	if v, ok := ann[api.AnnotationDevicePolicy]; ok {
		if !*pl.args.AllowPodPolicyOverride {
			return nil, fmt.Errorf("annotation %s: this scheduler profile does not allow pods to choose the GPU policy; remove the annotation or use another profile", api.AnnotationDevicePolicy)
		}
		p, err := ParsePolicy(v)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: %w", api.AnnotationDevicePolicy, err)
		}
		info.Device = pl.placers[p]
	}
	info.Order = make([]int, len(req.Containers))
	for i := range info.Order {
		info.Order[i] = i
	}
	sort.SliceStable(info.Order, func(x, y int) bool {
		a, b := &req.Containers[info.Order[x]], &req.Containers[info.Order[y]]
		if a.GPUs != b.GPUs {
			return a.GPUs > b.GPUs
		}
		// Whole-memory requests first: they have the fewest candidate GPUs.
		if a.WholeMemory() != b.WholeMemory() {
			return a.WholeMemory()
		}
		return a.MemoryMiB > b.MemoryMiB
	})
	return info, nil
}

func splitList(s string, lower bool) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			if lower {
				f = strings.ToLower(f)
			}
			out = append(out, f)
		}
	}
	return out
}

// PreFilterExtensions lets preemption see GPU usage change as pods are removed or added.
func (pl *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return pl }

// AddPod simulates podToAdd on the node: its recorded grants if it has any, otherwise
// (a nominated pod) the GPUs the plugin would give it now.
func (pl *Plugin) AddPod(_ context.Context, cs fwk.CycleState, _ *v1.Pod, podToAdd fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	s, err := getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.skip {
		return nil
	}
	p := podToAdd.GetPod()
	node := nodeInfo.Node()
	if node == nil {
		return nil
	}
	d := s.delta(node.Name)
	if d.removed[p.UID] {
		delete(d.removed, p.UID)
		return nil
	}
	if g := pl.cache.PodGrants(p.UID, node.Name); g != nil {
		d.added = append(d.added, g)
		return nil
	}
	if !api.HasGPURequest(p, pl.names) {
		return nil
	}
	info, err := pl.parsePod(p)
	if err != nil {
		return nil
	}
	v, used := pl.cache.View(node, nil)
	if v.Model == nil {
		return nil
	}
	applyDelta(v.Model, used, d, pl.cache, node.Name)
	a, fail := placement.Allocate(v.Model, used, info, &pl.w)
	if fail != nil {
		return nil
	}
	d.added = append(d.added, grantsOf(v.Model, info, a))
	return nil
}

// RemovePod simulates evicting podToRemove from the node.
func (pl *Plugin) RemovePod(_ context.Context, cs fwk.CycleState, _ *v1.Pod, podToRemove fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	s, err := getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.skip || nodeInfo.Node() == nil {
		return nil
	}
	s.delta(nodeInfo.Node().Name).removed[podToRemove.GetPod().UID] = true
	return nil
}

// applyDelta applies a preemption overlay to a copy of a node's usage.
func applyDelta(m *nodemodel.Model, used []placement.Usage, d *nodeDelta, c *placement.Cache, node string) {
	if d == nil {
		return
	}
	apply := func(gs []placement.Grant, sign int) {
		for _, g := range gs {
			if i, ok := m.ByUUID[g.UUID]; ok {
				used[i].MemMiB += int64(sign) * g.MemMiB
				used[i].Cores += sign * g.Cores
				used[i].Tenants += sign
			}
		}
	}
	c.Mu.RLock()
	for uid := range d.removed {
		if r := c.Pods[uid]; r != nil && r.Node == node {
			apply(r.Grants, -1)
		}
	}
	c.Mu.RUnlock()
	for _, gs := range d.added {
		apply(gs, 1)
	}
}

// grantsOf lists the grants of an allocation.
func grantsOf(m *nodemodel.Model, info *placement.PodInfo, a *placement.Allocation) []placement.Grant {
	var gs []placement.Grant
	for _, pl := range a.Placements {
		for k, i := range pl.Devices {
			gs = append(gs, placement.Grant{UUID: m.Devices[i].UUID, MemMiB: pl.MemMiB[k], Cores: pl.Cores})
		}
	}
	return gs
}

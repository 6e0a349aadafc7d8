// SPDX-License-Identifier: Apache-2.0

// Package draplacement is TesseraDynamicResources: the in-tree DynamicResources plugin,
// unchanged, allocating every ResourceClaim as it does, with one difference: the
// Tessera devices it chooses among (driver gpu.tessera.dev) are offered to it in the
// order of a Tessera placement policy for the pod being scheduled.
//
// The in-tree allocator is first fit: for each node it walks the node's devices in the
// order of its ResourceSlices and takes the first that satisfies the claim's request,
// selectors, constraints and remaining capacity. Ordering the devices is therefore
// enough to make its choice the policy's, while everything the allocator checks and
// writes (the claim's allocation, consumed capacity, share IDs, device taints, binding
// conditions, other drivers' claims) stays upstream's. docs/scheduler.md says why this
// was chosen over allocating Tessera's claims in the plugin.
//
// The order is computed in PreFilter, once per pod, from the node's Tessera inventory
// (the node agent publishes it on the Node in DRA mode too) and what claims already
// consume of each device (the scheduler's claim tracker, in-flight allocations
// included): the policy's own pick (PickDevice) first, then the other devices that fit
// the request by the policy's device score, then the rest as published.
package draplacement

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/binpack"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/fragmentation"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/spread"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Name is the plugin's name in scheduler profiles. A profile that enables it disables
// DynamicResources.
const Name = "TesseraDynamicResources"

// policies are the device policies the plugin offers, TesseraGPUShare's.
var policies = placement.Registry{binpack.Registration, spread.Registration, fragmentation.Registration}

// Plugin is DynamicResources with Tessera's device order. Every method it does not
// define is DynamicResources' own.
type Plugin struct {
	*dynamicresources.DynamicResources
	order   *orderer
	requeue *requeue // nil without DRA
}

var (
	_ fwk.PreFilterPlugin   = &Plugin{}
	_ fwk.FilterPlugin      = &Plugin{}
	_ fwk.PreScorePlugin    = &Plugin{}
	_ fwk.ScorePlugin       = &Plugin{}
	_ fwk.ReservePlugin     = &Plugin{}
	_ fwk.PreBindPlugin     = &Plugin{}
	_ fwk.EnqueueExtensions = &Plugin{}
)

// Name returns the plugin name.
func (pl *Plugin) Name() string { return Name }

// New builds the plugin with the feature gates the in-tree registry gives
// DynamicResources.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	return NewWithFeatures(ctx, obj, h, feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
}

// NewWithFeatures is New with explicit feature gates, for tests.
func NewWithFeatures(ctx context.Context, obj runtime.Object, h fwk.Handle, fts feature.Features) (fwk.Plugin, error) {
	args, draArgs, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	inner := h
	var o *orderer
	if h != nil && h.SharedDRAManager() != nil && fts.EnableDynamicResourceAllocation {
		o = newOrderer(args, h, utilfeature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity))
		inner = &handle{Handle: h, mgr: &manager{SharedDRAManager: h.SharedDRAManager(), o: o}}
	}
	p, err := dynamicresources.New(ctx, draArgs, inner, fts)
	if err != nil {
		return nil, fmt.Errorf("pluginConfig[%s].args.dynamicResources: %w", Name, err)
	}
	dr, ok := p.(*dynamicresources.DynamicResources)
	if !ok {
		return nil, fmt.Errorf("%s: DynamicResources is a %T", Name, p)
	}
	pl := &Plugin{DynamicResources: dr, order: o}
	if o != nil {
		pl.requeue = requeueFor(ctx, h)
	}
	return pl, nil
}

// stateKey is where PreFilter keeps the pod's demand for Score.
const stateKey fwk.StateKey = Name

// cycleState is the pod's demand for a Tessera device, or, for a pod without GPUs,
// what the node policy scores it by on DRA nodes (host).
type cycleState struct {
	d    *demand
	host *hostOnly
}

func (s *cycleState) Clone() fwk.StateData { return s }

// PreFilter refuses a pod with a container that uses two Tessera claims, with a
// Tessera configuration that does not decode, with a claim whose shares could meet on
// one device (distinct.go), or with a Tessera annotation its claims cannot follow
// (annotations.go), computes the
// pod's device order, which the in-tree PreFilter then lists the ResourceSlices
// through, and runs the in-tree PreFilter.
func (pl *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if pl.order == nil {
		return pl.DynamicResources.PreFilter(ctx, cs, pod, nodes)
	}
	if why := pl.order.twoClaimsInOneContainer(pod); why != "" {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, why)
	}
	if why := pl.order.configProblem(pod); why != "" {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, why)
	}
	if why := pl.order.sameDeviceTwice(pod); why != "" {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, why)
	}
	d, release := pl.order.forPod(ctx, pod)
	defer release()
	if d != nil && d.problem != "" {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, d.problem)
	}
	if d != nil || len(pod.Spec.ResourceClaims) > 0 {
		pl.requeue.preFilter(pod)
	}
	res, st := pl.DynamicResources.PreFilter(ctx, cs, pod, nodes)
	if d != nil && st.IsSuccess() {
		cs.Write(stateKey, &cycleState{d: d})
	}
	if d == nil {
		if h := pl.order.hostOnlyPod(pod); h != nil {
			cs.Write(stateKey, &cycleState{host: h})
		}
	}
	return res, st
}

// Reserve is the in-tree Reserve; a pod with claims it reserved is in flight until
// its PreBind succeeds or Unreserve runs (requeue.go).
func (pl *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	st := pl.DynamicResources.Reserve(ctx, cs, pod, nodeName)
	if st.IsSuccess() && pl.requeue != nil && (demandOf(cs) != nil || len(pod.Spec.ResourceClaims) > 0) {
		pl.requeue.reserved(pod)
	}
	return st
}

// Unreserve is the in-tree Unreserve, after which the pod's allocations are no longer
// in flight.
func (pl *Plugin) Unreserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) {
	pl.DynamicResources.Unreserve(ctx, cs, pod, nodeName)
	if pl.requeue != nil {
		pl.requeue.left(klog.FromContext(ctx), pod)
	}
}

// PreBind is the in-tree PreBind; when it succeeds the pod's allocations are written
// and no longer in flight (on failure Unreserve drops them).
func (pl *Plugin) PreBind(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	st := pl.DynamicResources.PreBind(ctx, cs, pod, nodeName)
	if st.IsSuccess() && pl.requeue != nil {
		pl.requeue.left(klog.FromContext(ctx), pod)
	}
	return st
}

// demandOf is the demand PreFilter kept for the cycle, or nil.
func demandOf(cs fwk.CycleState) *demand {
	if s := stateOf(cs); s != nil {
		return s.d
	}
	return nil
}

// hostOf is what PreFilter kept of a pod without GPUs, or nil.
func hostOf(cs fwk.CycleState) *hostOnly {
	if s := stateOf(cs); s != nil {
		return s.host
	}
	return nil
}

func stateOf(cs fwk.CycleState) *cycleState {
	v, err := cs.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := v.(*cycleState)
	return s
}

// PreScore measures the cycle's feasible nodes for the node policy's best-fit term,
// for a pod with a Tessera claim: without it Binpack's node score took each node as
// its own yardstick and left the pod's CPU out (a DRA replay of the B1 trace: 7.48
// against 6.90 in device-plugin mode). Other pods get the in-tree PreScore, where
// the minor has one.
func (pl *Plugin) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	if d := demandOf(cs); d != nil {
		if pl.order.nodePlacer.NeedsFit() {
			d.fit = pl.order.largest(pod, nodes)
		}
		return nil
	}
	if h := hostOf(cs); h != nil {
		if pl.order.nodePlacer.NeedsFit() {
			h.fit = pl.order.largest(pod, nodes)
		}
		return nil
	}
	if inner, ok := any(pl.DynamicResources).(fwk.PreScorePlugin); ok {
		return inner.PreScore(ctx, cs, pod, nodes)
	}
	return nil
}

// Score is the node policy's score for a pod with a Tessera claim, and the in-tree
// plugin's (where it has one: prioritized lists, from Kubernetes 1.35) for any other.
func (pl *Plugin) Score(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	if d := demandOf(cs); d != nil {
		return pl.order.scoreNode(d, ni), nil
	}
	if h := hostOf(cs); h != nil {
		return pl.order.scoreHostOnly(h, ni), nil
	}
	if inner, ok := any(pl.DynamicResources).(fwk.ScorePlugin); ok {
		return inner.Score(ctx, cs, pod, ni)
	}
	return 0, nil
}

// ScoreExtensions normalises the cycle's scores as the node policy does for a pod with
// a Tessera claim, and as the in-tree plugin does otherwise.
func (pl *Plugin) ScoreExtensions() fwk.ScoreExtensions { return pl }

// NormalizeScore: see ScoreExtensions.
func (pl *Plugin) NormalizeScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if demandOf(cs) != nil || hostOf(cs) != nil {
		if ext := pl.order.nodePlacer.ScoreExtensions(); ext != nil {
			return ext.NormalizeScore(ctx, cs, pod, scores)
		}
		return nil
	}
	if inner, ok := any(pl.DynamicResources).(fwk.ScorePlugin); ok {
		if ext := inner.ScoreExtensions(); ext != nil {
			return ext.NormalizeScore(ctx, cs, pod, scores)
		}
	}
	return nil
}

// handle is the scheduler's handle with the DRA manager replaced by one whose
// ResourceSlices are listed in the pod's device order.
type handle struct {
	fwk.Handle
	mgr fwk.SharedDRAManager
}

func (h *handle) SharedDRAManager() fwk.SharedDRAManager { return h.mgr }

// manager is the scheduler's DRA manager with ordered ResourceSlices.
type manager struct {
	fwk.SharedDRAManager
	o *orderer
}

func (m *manager) ResourceSlices() fwk.ResourceSliceLister {
	return &lister{inner: m.SharedDRAManager.ResourceSlices(), o: m.o}
}

type lister struct {
	inner fwk.ResourceSliceLister
	o     *orderer
}

func (l *lister) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) {
	slices, err := l.inner.ListWithDeviceTaintRules()
	if err != nil {
		return nil, err
	}
	return l.o.reorder(slices), nil
}

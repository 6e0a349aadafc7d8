// SPDX-License-Identifier: Apache-2.0

package placement

import (
	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Policy is a placement strategy, used independently at the node level (which node)
// and at the GPU level (which GPUs of the chosen node). Each policy's placer lives in
// a package of its own under this one; the core knows them only through Placer and
// the Registry the plugin builds.
type Policy string

// Placer is a placement policy. A profile uses one placer at the node level (which
// node: Score) and one, possibly another, at the GPU level (which GPUs of a node:
// Filter, Reserve and preemption's AddPod, through Allocate); a pod may pick its
// GPU-level placer by annotation. The extension points call placers and never ask
// which policy they hold.
//
// Placers are called for every node of every cycle, in parallel: they keep no
// per-cycle state of their own, and the slices they are given may live on a caller's
// stack only where noted. What a placer keeps of a pod for the cycle goes in the
// pod's slot (PodInfo.State); of a node across cycles, in the node's slot in the
// cache (NodeEntry.LoadMemo); of one placement, in the allocation's (Allocation.Base,
// Measured, Scratch).
type Placer interface {
	// Policy is the placer's name in args, annotations and metrics.
	Policy() Policy

	// PreparePod records in info what the placer needs of a GPU pod for the cycle
	// (PreFilter; called for the node-level and then, if another, the GPU-level placer).
	PreparePod(pod *v1.Pod, info *PodInfo)

	// DeviceScore rates placing container c on device i of m, in [0,1], higher is
	// better: how multi-GPU sets are grown and compared (pickSet).
	DeviceScore(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, w *Weights) float64
	// PickDevice chooses, for a one-GPU container, one device of cand (devices that
	// fit it, never empty), for allocation a under way (used is a's usage so far).
	// Placing a pod of one GPU container, it may leave what it measured of the node
	// in a.Measured for its node-level score; a.Base is then the node's kept
	// measure under used, when the caller had one.
	PickDevice(a *Allocation, m *nodemodel.Model, used []Usage, p *PodInfo, c *api.ContainerRequest, w *Weights, cand []int) int

	// HostOnlyPod is what the node-level placer scores a pod without GPUs by
	// (PreFilter), or nil when it does not score such pods (PreScore then skips).
	HostOnlyPod(pod *v1.Pod) *PodInfo
	// NeedsFit reports whether the node-level score uses the cycle's largest
	// feasible node (FitScale), which PreScore then measures.
	NeedsFit() bool
	// ScoreNode is the node-level score of allocation a of the cycle's pod (info) on ni.
	ScoreNode(info *PodInfo, a *Allocation, ni fwk.NodeInfo, f *FitScale, w *Weights) int64
	// ScoreHostOnly is the node-level score of a pod without GPUs on ni, for the h
	// that HostOnlyPod returned, with the node's model (v) and usage: its cache
	// entry's (e, which keeps what the placer measured of it), or, with e nil, what a
	// caller without an entry knows (the claims' use of a DRA node's devices).
	ScoreHostOnly(e *NodeEntry, v NodeView, used []Usage, h *PodInfo, ni fwk.NodeInfo, f *FitScale, w *Weights) int64
	// ScoreExtensions normalises the node-level scores of a cycle, or is nil when
	// ScoreNode is already in the framework's range.
	ScoreExtensions() fwk.ScoreExtensions
}

// PodState is what a placer keeps of a pod for the cycle (PodInfo.State), opaque to
// the core but for one question.
type PodState interface {
	// KeptMeasure is the placer's measure of the node of entry e (model m, usage
	// used at usage generation gen) for the pod, kept in e across cycles
	// (NodeEntry.LoadMemo) and taken now when it is not; nil when the placer keeps
	// none. Filter's allocation of a pod of one GPU container starts from it
	// (NodeEntry.Keep, Allocation.Base). used must not be kept.
	KeptMeasure(e *NodeEntry, gen uint64, m *nodemodel.Model, used []Usage, w *Weights) any
}

// Env is what a plugin builds its placers with: the cache and the weights they place
// against, and the size of the window of recent GPU pods a placer that learns the
// workload learns from (the fragmentationWindow arg).
type Env struct {
	Cache   *Cache
	Weights *Weights
	Window  int
}

// Registration is one policy: its name and the constructor of its placer.
type Registration struct {
	Policy Policy
	New    func(env *Env) Placer
}

// Registry is the policies a plugin offers, in the order messages name them.
type Registry []Registration

// Names lists the registry's policies in order.
func (r Registry) Names() []Policy {
	out := make([]Policy, len(r))
	for i := range r {
		out[i] = r[i].Policy
	}
	return out
}

// Has reports whether the registry offers policy p.
func (r Registry) Has(p Policy) bool {
	for i := range r {
		if r[i].Policy == p {
			return true
		}
	}
	return false
}

// Build builds one placer per policy, so that a pod's GPU-level choice and the
// profile's node-level one share what a policy learns.
func (r Registry) Build(env *Env) map[Policy]Placer {
	out := make(map[Policy]Placer, len(r))
	for i := range r {
		out[r[i].Policy] = r[i].New(env)
	}
	return out
}

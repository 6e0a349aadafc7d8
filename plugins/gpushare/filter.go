// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"
	"time"

	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
	v1 "k8s.io/api/core/v1"
)

// Filter reports whether every GPU container of the pod gets GPUs on the node, and
// keeps the allocation for Score. Called in parallel for many nodes.
func (pl *Plugin) Filter(_ context.Context, cs fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	s, err := getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.skip {
		return nil
	}
	node := nodeInfo.Node()
	if node == nil {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node not found")
	}
	var buf [16]placement.Usage
	e, v, used := pl.cache.EntryView(node, buf[:0])
	if s.toDRA(&v) {
		return nil
	}
	if st := pl.usable(&v, s.now); st != nil {
		return st
	}
	// What the allocation is made against: the cache's usage at v.UsageGen, or 0
	// for a what-if (then no measure a placer keeps of the node serves it).
	gen := v.UsageGen
	if d := s.overlay[node.Name]; d != nil {
		applyDelta(v.Model, used, d, pl.cache, node.Name)
		gen = 0
	}
	if fail := e.Keep(s.id, gen, v.Model, used, s.info, &pl.w); fail != nil {
		return fail.Status()
	}
	return nil
}

// errDRANode is why a GPU pod of tessera.dev/* resources does not go to a node in DRA
// mode.
const errDRANode = "node serves its GPUs through DRA (ResourceClaims of the DeviceClass gpu.tessera.dev), not as tessera.dev/* resources; ask for a ResourceClaim, or run the pod on a node whose Tessera agent runs the device plugin " +
	"(a pod that asks only whole GPUs, without a model, UUID, locality or MPS annotation, runs here when a DeviceClass names the GPU resource in extendedResourceName)"

// usable rejects nodes whose inventory is missing, malformed or stale at now, nodes
// whose agent refuses GPU containers for want of a requirement, and nodes in DRA mode.
func (pl *Plugin) usable(v *placement.NodeView, now time.Time) *fwk.Status {
	if v.Model == nil {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, v.InvErr.Error())
	}
	if v.ReqErr != nil {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, v.ReqErr.Error())
	}
	if v.Model.DRA {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, errDRANode)
	}
	if age, old := placement.Stale(v.Heartbeat, pl.staleness, now); old {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf(
			"node's GPU inventory is stale: last heartbeat %s ago, limit %s; check the Tessera node agent on this node",
			age.Round(1e9), pl.staleness))
	}
	return nil
}

// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Reserve chooses the exact GPUs on the chosen node against the cache's current
// state and assumes them. It touches memory only; Bind (or PreBind) does the API write.
func (pl *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s, err := getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.skip {
		return nil
	}
	ni, err := pl.handle.SnapshotSharedLister().NodeInfos().Get(nodeName)
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("getting node %q from snapshot: %w", nodeName, err))
	}
	node := ni.Node()
	if node == nil {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("node %q not found", nodeName))
	}
	e, v, used := pl.cache.EntryView(node, nil)
	if s.toDRA(&v) {
		// The in-tree DRA plugin allocates the pod's GPUs on this node (a claim of
		// the DeviceClass that serves the GPU resource).
		s.delegated = nodeName
		pl.decide(s.info.Device.Policy(), resultPlaced, "")
		klog.FromContext(ctx).V(4).Info("GPUs left to DRA", "pod", klog.KObj(pod), "node", nodeName)
		return nil
	}
	if st := pl.usable(&v, pl.now()); st != nil {
		pl.decide(s.info.Device.Policy(), resultUnschedulable, reasonInventory)
		return st
	}
	// Filter's allocation on this node, when the node's usage has not changed since:
	// Allocate would make the same one (a pure function of the model and usage), and
	// this is the serial part of the cycle.
	var assignment *api.PodAssignment
	var grants []placement.Grant
	if !e.KeptAt(s.id, v.UsageGen, v.Model, func(a *placement.Allocation) {
		assignment, grants = buildAssignment(v.Model, s.info, a, nodeName), grantsOf(v.Model, s.info, a)
	}) {
		a, fail := placement.Allocate(v.Model, used, s.info, &pl.w)
		if fail != nil {
			// Filter found room on this node in this cycle; it is gone now.
			reserveConflicts.WithLabelValues(pl.profile).Inc()
			pl.decide(s.info.Device.Policy(), resultUnschedulable, reasonReserveConflict)
			return fail.Status()
		}
		assignment, grants = buildAssignment(v.Model, s.info, a, nodeName), grantsOf(v.Model, s.info, a)
	}
	if err := pl.cache.Assume(pod, nodeName, grants, pl.w.MaxTenants); err != nil {
		// The node's usage changed between the view above and the check under the
		// cache's lock (another writer took the capacity in that instant). That is
		// transient: an error sends the pod to the backoff queue and it is retried in
		// seconds. Unschedulable would park it until a GPU pod is deleted or an
		// inventory changes, which on a cluster that only grows can be minutes.
		reserveConflicts.WithLabelValues(pl.profile).Inc()
		pl.decide(s.info.Device.Policy(), resultError, reasonReserveConflict)
		return fwk.AsStatus(fmt.Errorf("GPUs on node %s changed while reserving them, retrying: %w", nodeName, err))
	}
	s.assignment = assignment
	pl.decide(s.info.Device.Policy(), resultPlaced, "")
	klog.FromContext(ctx).V(4).Info("Reserved GPUs", "pod", klog.KObj(pod), "node", nodeName, "assignment", assignment)
	return nil
}

// Unreserve rolls back Reserve. It is idempotent and never drops grants the informer
// has already confirmed.
func (pl *Plugin) Unreserve(_ context.Context, cs fwk.CycleState, pod *v1.Pod, _ string) {
	s, err := getState(cs)
	if err != nil || s.skip {
		return
	}
	if s.delegated != "" {
		s.delegated = ""
		return
	}
	pl.cache.Forget(pod.UID)
	s.assignment = nil
}

// buildAssignment turns an allocation into the wire format, containers in spec order.
func buildAssignment(m *nodemodel.Model, info *placement.PodInfo, a *placement.Allocation, node string) *api.PodAssignment {
	out := &api.PodAssignment{Version: api.AssignmentVersion, Node: node}
	byContainer := make(map[int]*placement.Placement, len(a.Placements))
	for i := range a.Placements {
		byContainer[a.Placements[i].Container] = &a.Placements[i]
	}
	for ci := range info.Req.Containers {
		pl := byContainer[ci]
		if pl == nil {
			continue
		}
		c := &info.Req.Containers[ci]
		ca := api.ContainerAssignment{Name: c.Name, Init: c.Init}
		for k, i := range pl.Devices {
			d := &m.Devices[i]
			ca.Devices = append(ca.Devices, api.DeviceGrant{UUID: d.UUID, Index: d.Index, MemoryMiB: pl.MemMiB[k], Cores: pl.Cores})
		}
		out.Containers = append(out.Containers, ca)
	}
	return out
}

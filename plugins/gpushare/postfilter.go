// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

var _ fwk.PostFilterPlugin = &Plugin{}

// PostFilter runs when no node passed Filter. It never makes room (DefaultPreemption
// does that, and when it succeeds this does not run); it adds one line to the pod's
// FailedScheduling message about the pod's container placed first, among the nodes
// this plugin turned down for room. Filter's reasons name only the request, so that
// nodes group under one reason (see explain); this says how far the cluster is from
// it. For a one-GPU container, the most any GPU has free:
//
//	closest for container "train": 3072 MiB free on one GPU (node gpu-7), 40% of a GPU's cores (node gpu-2)
//
// for a multi-GPU container, the most GPUs with room for it on one node:
//
//	closest for container "train": 6 GPUs with room for it on one node (node gpu-3), it asks 8
//
// (with required locality, the most that meet it together). Pods
// no node refused for room (only for their selection, their CPU, a stale
// inventory) get no line.
func (pl *Plugin) PostFilter(_ context.Context, cs fwk.CycleState, _ *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	s, err := getState(cs)
	if err != nil || s.skip || s.info == nil || len(s.info.Order) == 0 || pl.handle == nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	p := s.info
	c := &p.Req.Containers[p.Order[0]]
	lister := pl.handle.SnapshotSharedLister().NodeInfos()
	nodes, err := statuses.NodesForStatusCode(lister, fwk.Unschedulable)
	if err != nil {
		pl.decide(p.Device.Policy(), resultUnschedulable, reasonOther)
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	var best closest
	best.mem, best.cores, best.gpus = -1, -1, -1
	for _, ni := range nodes {
		node := ni.Node()
		if node == nil || statuses.Get(node.Name).Plugin() != Name {
			continue
		}
		var buf [16]placement.Usage
		v, used := pl.cache.View(node, buf[:0])
		if v.Model == nil {
			continue
		}
		if d := s.overlay[node.Name]; d != nil {
			applyDelta(v.Model, used, d, pl.cache, node.Name)
		}
		best.add(v.Model, used, p, c, pl.w.MaxTenants, node.Name)
	}
	if best.mem < 0 {
		pl.decide(p.Device.Policy(), resultUnschedulable, pl.unresolvableClass(s, lister, statuses))
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	pl.decide(p.Device.Policy(), resultUnschedulable, reasonCapacity)
	return nil, fwk.NewStatus(fwk.Unschedulable, best.reason(c, p))
}

// unresolvableClass is the reason class of a pod that no node turned down for room
// (see decisions_total): among the nodes this plugin rejected as unresolvable, any
// with a usable inventory rejected the pod's selection; otherwise the inventories
// were missing or stale; and with no such node, other plugins rejected them all.
func (pl *Plugin) unresolvableClass(s *cycleState, lister fwk.NodeInfoLister, statuses fwk.NodeToStatusReader) string {
	nodes, err := statuses.NodesForStatusCode(lister, fwk.UnschedulableAndUnresolvable)
	if err != nil {
		return reasonOther
	}
	class := reasonOther
	for _, ni := range nodes {
		node := ni.Node()
		if node == nil || statuses.Get(node.Name).Plugin() != Name {
			continue
		}
		v, _ := pl.cache.View(node, nil)
		if pl.usable(&v, s.now) == nil {
			return reasonSelection
		}
		class = reasonInventory
	}
	return class
}

// closest is the most free memory and the most free cores on one GPU, and the most
// GPUs with room for the container on one node, with the nodes that have them.
type closest struct {
	mem                          int64
	cores, gpus                  int
	memNode, coresNode, gpusNode string
}

// add takes the healthy GPUs of a node that the pod may use into account.
func (b *closest) add(m *nodemodel.Model, used []placement.Usage, p *placement.PodInfo, c *api.ContainerRequest, maxTenants int, node string) {
	var roomBuf [16]int
	room := roomBuf[:0]
	for i := range m.Hot {
		d := &m.Hot[i]
		if !d.Healthy || !p.EligibleAt(m, i) {
			continue
		}
		if free := d.MemoryMiB - used[i].MemMiB; free > b.mem {
			b.mem, b.memNode = free, node
		}
		if free := 100 - used[i].Cores; free > b.cores {
			b.cores, b.coresNode = free, node
		}
		if (!d.MIG || c.GPUs == 1) && placement.Fits(m, used, c, i, maxTenants) {
			room = append(room, i)
		}
	}
	if n := largestGroup(m, p.Topology, room); n > b.gpus {
		b.gpus, b.gpusNode = n, node
	}
}

// largestGroup is how many of the devices in room the container could take together
// under its required locality: all of them without one; otherwise the largest set
// grown greedily from each device by the same rule Filter's placement uses (nodemodel.Model.Joinable).
func largestGroup(m *nodemodel.Model, t api.Topology, room []int) int {
	if t != api.TopologyNVLinkRequired && t != api.TopologyNUMARequired {
		return len(room)
	}
	most := 0
	var setBuf [16]int
	for _, i := range room {
		if t == api.TopologyNUMARequired && m.Devices[i].NUMA < 0 {
			continue
		}
		set := append(setBuf[:0], i)
		for _, j := range room {
			if j != i && m.Joinable(t, set, j) {
				set = append(set, j)
			}
		}
		most = max(most, len(set))
	}
	return most
}

// reason is the closest-GPU line for container c (built only for pods no node took).
func (b *closest) reason(c *api.ContainerRequest, p *placement.PodInfo) string {
	head := fmt.Sprintf("closest for container %q: ", c.Name)
	switch {
	case c.GPUs > 1 && b.gpus == 0:
		return head + fmt.Sprintf("no node has a GPU with room for it, it asks %d", c.GPUs)
	case c.GPUs > 1:
		where := "on one node"
		if t := p.Topology; t == api.TopologyNVLinkRequired || t == api.TopologyNUMARequired {
			where = placement.LocalityWords(t)
		}
		return head + fmt.Sprintf("%s with room for it %s (node %s), it asks %d", placement.GPUs(b.gpus), where, b.gpusNode, c.GPUs)
	}
	line := head + fmt.Sprintf("%d MiB free on one GPU (node %s)", b.mem, b.memNode)
	if c.Cores > 0 {
		line += fmt.Sprintf(", %d%% of a GPU's cores (node %s)", b.cores, b.coresNode)
	}
	return line
}

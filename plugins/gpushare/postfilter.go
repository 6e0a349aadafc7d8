package gpushare

import (
	"context"
	"strconv"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
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
// (with required locality, the most in one NVLink island or on one NUMA node). Pods
// no node refused for room (only for their selection, their CPU, a stale
// inventory) get no line.
func (pl *Plugin) PostFilter(_ context.Context, cs fwk.CycleState, _ *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	s, err := getState(cs)
	if err != nil || s.skip || s.info == nil || len(s.info.order) == 0 || pl.handle == nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	p := s.info
	c := &p.req.Containers[p.order[0]]
	nodes, err := statuses.NodesForStatusCode(pl.handle.SnapshotSharedLister().NodeInfos(), fwk.Unschedulable)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	var best closest
	best.mem, best.cores, best.gpus = -1, -1, -1
	for _, ni := range nodes {
		node := ni.Node()
		if node == nil || statuses.Get(node.Name).Plugin() != Name {
			continue
		}
		var buf [16]usage
		v, used := pl.cache.view(node, buf[:0])
		if v.model == nil {
			continue
		}
		if d := s.overlay[node.Name]; d != nil {
			applyDelta(v.model, used, d, pl.cache, node.Name)
		}
		best.add(v.model, used, p, c, pl.w.maxTenants, node.Name)
	}
	if best.mem < 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	return nil, fwk.NewStatus(fwk.Unschedulable, best.reason(c, p))
}

// closest is the most free memory and the most free cores on one GPU, and the most
// GPUs with room for the container on one node, with the nodes that have them.
type closest struct {
	mem                          int64
	cores, gpus                  int
	memNode, coresNode, gpusNode string
}

// add takes the healthy GPUs of a node that the pod may use into account.
func (b *closest) add(m *nodeModel, used []usage, p *podInfo, c *api.ContainerRequest, maxTenants int, node string) {
	var roomBuf [16]int
	room := roomBuf[:0]
	for i := range m.hot {
		d := &m.hot[i]
		if !d.healthy || !p.eligibleAt(m, i) {
			continue
		}
		if free := d.memoryMiB - used[i].memMiB; free > b.mem {
			b.mem, b.memNode = free, node
		}
		if free := 100 - used[i].cores; free > b.cores {
			b.cores, b.coresNode = free, node
		}
		if (!d.mig || c.GPUs == 1) && fits(m, used, c, i, maxTenants) {
			room = append(room, i)
		}
	}
	if n := largestGroup(m, p.topology, room); n > b.gpus {
		b.gpus, b.gpusNode = n, node
	}
}

// largestGroup is how many of the devices in room the container could take together
// under its required locality: all of them without one; the most in one NVLink island
// or on one NUMA node with one (an island is connected over NVLink, not always
// joined pair by pair, so this can overstate nvlink-required by a little).
func largestGroup(m *nodeModel, t api.Topology, room []int) int {
	if t != api.TopologyNVLinkRequired && t != api.TopologyNUMARequired {
		return len(room)
	}
	most := 0
	for _, i := range room {
		n := 0
		for _, j := range room {
			if i == j || sameGroup(m, t, i, j) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

func sameGroup(m *nodeModel, t api.Topology, i, j int) bool {
	if t == api.TopologyNUMARequired {
		return m.devices[i].numa >= 0 && m.devices[i].numa == m.devices[j].numa
	}
	return m.hot[i].island >= 0 && m.hot[i].island == m.hot[j].island
}

func (b *closest) reason(c *api.ContainerRequest, p *podInfo) string {
	r := make([]byte, 0, 128)
	r = append(r, "closest for container "...)
	r = strconv.AppendQuote(r, c.Name)
	r = append(r, ": "...)
	if c.GPUs > 1 && b.gpus == 0 {
		r = append(r, "no node has a GPU with room for it, it asks "...)
		r = strconv.AppendInt(r, int64(c.GPUs), 10)
		return string(r)
	}
	if c.GPUs > 1 {
		r = strconv.AppendInt(r, int64(b.gpus), 10)
		if b.gpus == 1 {
			r = append(r, " GPU"...)
		} else {
			r = append(r, " GPUs"...)
		}
		r = append(r, " with room for it "...)
		if t := p.topology; t == api.TopologyNVLinkRequired || t == api.TopologyNUMARequired {
			r = append(r, localityWords(t)...)
		} else {
			r = append(r, "on one node"...)
		}
		r = append(r, " (node "...)
		r = append(r, b.gpusNode...)
		r = append(r, "), it asks "...)
		r = strconv.AppendInt(r, int64(c.GPUs), 10)
		return string(r)
	}
	r = strconv.AppendInt(r, b.mem, 10)
	r = append(r, " MiB free on one GPU (node "...)
	r = append(r, b.memNode...)
	r = append(r, ')')
	if c.Cores > 0 {
		r = append(r, ", "...)
		r = strconv.AppendInt(r, int64(b.cores), 10)
		r = append(r, "% of a GPU's cores (node "...)
		r = append(r, b.coresNode...)
		r = append(r, ')')
	}
	return string(r)
}

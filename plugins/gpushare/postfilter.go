package gpushare

import (
	"context"
	"strconv"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

var _ fwk.PostFilterPlugin = &Plugin{}

// PostFilter runs when no node passed Filter. It never makes room (DefaultPreemption
// does that, and when it succeeds this does not run); it adds one line to the pod's
// FailedScheduling message: the most any GPU has free, among the nodes this plugin
// turned down for room, for the pod's one-GPU container placed first. Filter's reasons
// name only the request, so that nodes group under one reason (see explain); this says
// how far the cluster is from it, e.g.
//
//	closest for container "train": 3072 MiB free on one GPU (node gpu-7), 40% of a GPU's cores (node gpu-2)
//
// Pods whose first container asks several GPUs, and pods no node refused for room
// (only for their selection, their CPU, a stale inventory), get no line.
func (pl *Plugin) PostFilter(_ context.Context, cs fwk.CycleState, _ *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	s, err := getState(cs)
	if err != nil || s.skip || s.info == nil || len(s.info.order) == 0 || pl.handle == nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	p := s.info
	c := &p.req.Containers[p.order[0]]
	if c.GPUs != 1 {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	nodes, err := statuses.NodesForStatusCode(pl.handle.SnapshotSharedLister().NodeInfos(), fwk.Unschedulable)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	var best closest
	best.mem, best.cores = -1, -1
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
		best.add(v.model, used, p, node.Name)
	}
	if best.mem < 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	return nil, fwk.NewStatus(fwk.Unschedulable, best.reason(c.Name, c.Cores > 0))
}

// closest is the most free memory and the most free cores on one GPU, with the
// nodes that have them.
type closest struct {
	mem                int64
	cores              int
	memNode, coresNode string
}

// add takes the healthy GPUs of a node that the pod may use into account.
func (b *closest) add(m *nodeModel, used []usage, p *podInfo, node string) {
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
	}
}

func (b *closest) reason(container string, cores bool) string {
	r := make([]byte, 0, 128)
	r = append(r, "closest for container "...)
	r = strconv.AppendQuote(r, container)
	r = append(r, ": "...)
	r = strconv.AppendInt(r, b.mem, 10)
	r = append(r, " MiB free on one GPU (node "...)
	r = append(r, b.memNode...)
	r = append(r, ')')
	if cores {
		r = append(r, ", "...)
		r = strconv.AppendInt(r, int64(b.cores), 10)
		r = append(r, "% of a GPU's cores (node "...)
		r = append(r, b.coresNode...)
		r = append(r, ')')
	}
	return string(r)
}

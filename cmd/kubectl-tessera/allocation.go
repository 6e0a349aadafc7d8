// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api"
	allocationv1alpha1 "github.com/tessera-dev/tessera/api/allocation/v1alpha1"
)

var (
	allocationLong = longDesc(`
		Show how Tessera has placed GPU shares: per node and per GPU (per MIG instance
		for GPUs in MIG mode), the memory and compute granted and to which pods; the
		NVLink islands; the age of each node's inventory, flagged STALE past
		--stale-after; GPU pods bound without an assignment; then every pending GPU pod
		with its request and the scheduler's reason.

		The view counts a pod exactly as the scheduler does: bound, not finished, with an
		assignment naming the node it is bound to. It reads only the API.

		Without --namespace the view covers every namespace, as a node-level view must;
		with it, only that namespace's pods are read and counted, and only the nodes
		where they hold GPUs are shown. Nodes named as arguments (or with --nodes) are
		shown whatever they hold.

		-o json and -o yaml print an AllocationList (apiVersion
		allocation.tessera.dev/v1alpha1), the same data as the table, for scripts.`)

	allocationExample = examples(`
		# The whole cluster
		kubectl tessera allocation

		# Two nodes, with GPU models and UUIDs
		kubectl tessera allocation gpu-node-0 gpu-node-1 -o wide

		# Where the pods of one namespace hold GPUs, for a script
		kubectl tessera allocation -n team-a -o json

		# Free memory of every GPU
		kubectl tessera allocation -o jsonpath='{range .items[*]}{range .gpus[*]}{.uuid}{" "}{.memoryMiB}{" "}{.memoryGrantedMiB}{"\n"}{end}{end}'`)
)

type allocationOptions struct {
	*rootOptions
	nodes         []string
	staleAfter    time.Duration
	allNamespaces bool
	print         *printFlags
}

func newAllocationCommand(root *rootOptions) *cobra.Command {
	o := &allocationOptions{rootOptions: root, staleAfter: 5 * time.Minute, print: newPrintFlags()}
	cmd := &cobra.Command{
		Use:               "allocation [NODE...]",
		Aliases:           []string{"alloc"},
		Short:             "Show the GPUs of each node, what is granted on each and to which pods, and the pending GPU pods",
		Long:              allocationLong,
		Example:           allocationExample,
		ValidArgsFunction: root.completeNodes,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.nodes = append(o.nodes, args...)
			return o.run(cmd.Context())
		},
	}
	cmd.Flags().StringSliceVar(&o.nodes, "nodes", nil, "Nodes to show, comma-separated (default: every node with a GPU inventory); the same as naming them as arguments")
	cmd.Flags().DurationVar(&o.staleAfter, "stale-after", o.staleAfter, "Flag inventories older than this as stale (the scheduler's inventoryStaleness)")
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "Count the pods of every namespace (the default; overrides --namespace)")
	o.print.addFlags(cmd)
	_ = cmd.RegisterFlagCompletionFunc("nodes", root.completeNodes)
	return cmd
}

func (o *allocationOptions) run(ctx context.Context) error {
	printer, err := o.print.toPrinter()
	if err != nil {
		return err
	}
	c, err := o.clients()
	if err != nil {
		return err
	}
	ns := o.namespace(o.allNamespaces)
	st, err := fetch(ctx, c, ns)
	if err != nil {
		return err
	}
	now := time.Now()
	list := buildView(st, c.names, now, o.staleAfter, splitNames(o.nodes), ns)
	return printer.print(list, now, o.streams.Out)
}

// state is what the view is computed from: three lists, read from the API.
type state struct {
	nodes  []v1.Node
	pods   []v1.Pod
	events []v1.Event
}

// fetch lists the nodes, and the pods and scheduling events of namespace ns (every
// namespace when ns is empty).
func fetch(ctx context.Context, c *clients, ns string) (*state, error) {
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	pods, err := c.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	// Only the scheduler's verdicts matter; the field selector keeps the list small.
	events, err := c.kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod,reason=FailedScheduling"})
	if err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	return &state{nodes: nodes.Items, pods: pods.Items, events: events.Items}, nil
}

// splitNames turns node names (each possibly a comma-separated list) into a set; nil
// when there are none.
func splitNames(names []string) map[string]bool {
	var m map[string]bool
	for _, s := range names {
		for _, n := range strings.Split(s, ",") {
			if n = strings.TrimSpace(n); n != "" {
				if m == nil {
					m = map[string]bool{}
				}
				m[n] = true
			}
		}
	}
	return m
}

// buildView matches the pods' assignments to the nodes' inventories the way the
// scheduler's cache does: a pod counts when it is bound, not finished, and its
// assignment names the node it is bound to. only, when set, limits the nodes; ns, when
// set, is the namespace the pods were read from.
func buildView(st *state, names api.ResourceNames, now time.Time, staleAfter time.Duration, only map[string]bool, ns string) *allocationv1alpha1.AllocationList {
	list := allocationv1alpha1.NewAllocationList()
	list.Namespace = ns
	list.Items = []allocationv1alpha1.NodeAllocation{}
	list.PendingPods = []allocationv1alpha1.PendingPod{}
	sort.Slice(st.nodes, func(i, j int) bool { return st.nodes[i].Name < st.nodes[j].Name })
	for i := range st.nodes {
		n := &st.nodes[i]
		if only != nil && !only[n.Name] {
			continue
		}
		na := allocationv1alpha1.NodeAllocation{Name: n.Name, Ready: nodeReady(n), GPUs: []allocationv1alpha1.GPUAllocation{}}
		raw, ok := n.Annotations[api.AnnotationInventory]
		if !ok {
			na.Inventory.Error = errNoInventory.Error()
		} else if inv, err := api.DecodeInventory(raw); err != nil {
			na.Inventory.Error = err.Error()
		} else {
			at := metav1.NewTime(inv.UpdatedAt)
			na.Inventory.UpdatedAt = &at
			na.Inventory.Stale = staleAfter > 0 && inv.Age(now) > staleAfter
			na.NVLinkIslands = nvlinkIslands(inv)
			na.GPUs = unitsOf(inv)
		}
		list.Items = append(list.Items, na)
	}
	// Indexes into list.Items, built once it no longer grows.
	byNode := map[string]*allocationv1alpha1.NodeAllocation{}
	units := map[string]map[string]*allocationv1alpha1.GPUAllocation{} // node -> uuid -> unit
	for i := range list.Items {
		na := &list.Items[i]
		byNode[na.Name] = na
		m := map[string]*allocationv1alpha1.GPUAllocation{}
		for j := range na.GPUs {
			m[na.GPUs[j].UUID] = &na.GPUs[j]
		}
		units[na.Name] = m
	}
	hasGPUPods := map[string]bool{}
	sort.Slice(st.pods, func(i, j int) bool {
		return st.pods[i].Namespace+"/"+st.pods[i].Name < st.pods[j].Namespace+"/"+st.pods[j].Name
	})
	events := latestFailedScheduling(st.events)
	for i := range st.pods {
		p := &st.pods[i]
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		raw, assigned := p.Annotations[api.AnnotationAssignment]
		if p.Spec.NodeName == "" {
			if api.HasGPURequest(p, names) {
				list.PendingPods = append(list.PendingPods, pendingOf(p, names, events))
			}
			continue
		}
		if !assigned {
			if api.HasGPURequest(p, names) && (only == nil || only[p.Spec.NodeName]) {
				list.Problems = append(list.Problems, fmt.Sprintf("%s asks for GPUs and is bound to %s without a Tessera assignment (scheduler %q): nothing limits its GPU use",
					podName(p), p.Spec.NodeName, p.Spec.SchedulerName))
			}
			continue
		}
		na := byNode[p.Spec.NodeName]
		if na == nil {
			continue
		}
		hasGPUPods[na.Name] = true
		a, err := api.DecodeAssignment(raw)
		if err != nil {
			list.Problems = append(list.Problems, fmt.Sprintf("%s: %v", podName(p), err))
			continue
		}
		if a.Node != p.Spec.NodeName {
			list.Problems = append(list.Problems, fmt.Sprintf("%s: assignment names node %s but the pod is bound to %s; not counted", podName(p), a.Node, p.Spec.NodeName))
			continue
		}
		for _, ca := range a.Containers {
			ids := make([]string, len(ca.Devices))
			for k, d := range ca.Devices {
				// The ID names MIG instances too ("0/1g.10gb#2"), where the index
				// would only name their GPU.
				if u := units[na.Name][d.UUID]; u != nil {
					ids[k] = u.ID
				} else {
					ids[k] = strconv.Itoa(d.Index)
				}
			}
			for _, d := range ca.Devices {
				u := units[na.Name][d.UUID]
				if u == nil {
					na.Warnings = append(na.Warnings, fmt.Sprintf("%s holds %s, which the node's inventory does not list", podName(p), d.UUID))
					continue
				}
				u.MemoryGrantedMiB += d.MemoryMiB
				u.CoresGranted += d.Cores
				u.Grants = append(u.Grants, allocationv1alpha1.Grant{Namespace: p.Namespace, Pod: p.Name, Container: ca.Name,
					MemoryMiB: d.MemoryMiB, Cores: d.Cores, GPUs: ids, Terminating: p.DeletionTimestamp != nil})
			}
		}
	}
	// Nodes without an inventory say nothing per GPU; they are listed by name unless
	// pods claim GPUs there, which is worth a full entry. A namespace's view keeps only
	// the nodes where its pods hold GPUs, unless nodes were asked for by name.
	kept := list.Items[:0]
	for _, na := range list.Items {
		switch {
		case only != nil:
		case ns != "" && !hasGPUPods[na.Name]:
			continue
		case na.Inventory.UpdatedAt == nil && !hasGPUPods[na.Name] && na.Inventory.Error == errNoInventory.Error():
			list.NodesWithoutInventory = append(list.NodesWithoutInventory, na.Name)
			continue
		}
		kept = append(kept, na)
	}
	list.Items = kept
	for _, na := range list.Items {
		for _, u := range na.GPUs {
			s := &list.Summary
			s.GPUs++
			s.MemoryMiB += u.MemoryMiB
			s.MemoryGrantedMiB += u.MemoryGrantedMiB
			s.CoresGranted += u.CoresGranted
			if len(u.Grants) > 0 {
				s.GPUsHoldingPods++
			}
			s.MIG = s.MIG || u.MIGProfile != ""
		}
	}
	return list
}

var errNoInventory = errors.New("no GPU inventory: the Tessera node agent is not running here or has not published yet")

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func podName(p *v1.Pod) string { return displayName(p.Namespace, p.Name) }

// displayName leaves out the default namespace, which most pods of small clusters use.
func displayName(namespace, name string) string {
	if namespace == metav1.NamespaceDefault {
		return name
	}
	return namespace + "/" + name
}

// unitsOf lists the schedulable units of an inventory: whole GPUs, and the instances
// of GPUs in MIG mode.
func unitsOf(inv *api.NodeInventory) []allocationv1alpha1.GPUAllocation {
	us := []allocationv1alpha1.GPUAllocation{}
	for _, g := range inv.GPUs {
		if g.MIG != nil {
			for k, m := range g.MIG.Instances {
				us = append(us, allocationv1alpha1.GPUAllocation{ID: fmt.Sprintf("%d/%s#%d", g.Index, m.Profile, k), Index: g.Index, MIGProfile: m.Profile,
					UUID: m.UUID, Model: g.Model, MemoryMiB: m.MemoryMiB, Healthy: g.Healthy, HealthReason: g.HealthReason,
					Grants: []allocationv1alpha1.Grant{}})
			}
			continue
		}
		us = append(us, allocationv1alpha1.GPUAllocation{ID: strconv.Itoa(g.Index), Index: g.Index, UUID: g.UUID, Model: g.Model,
			MemoryMiB: g.MemoryMiB, Healthy: g.Healthy, HealthReason: g.HealthReason, Grants: []allocationv1alpha1.Grant{}})
	}
	return us
}

// nvlinkIslands groups GPUs joined (directly or through each other) by NVLink; GPUs
// without NVLink are left out.
func nvlinkIslands(inv *api.NodeInventory) []string {
	parent := map[int]int{}
	var find func(int) int
	find = func(i int) int {
		if p, ok := parent[i]; ok && p != i {
			r := find(p)
			parent[i] = r
			return r
		}
		return i
	}
	linked := map[int]bool{}
	for _, g := range inv.GPUs {
		for _, l := range g.Links {
			if l.NVLinks > 0 {
				linked[g.Index], linked[l.Peer] = true, true
				a, b := find(g.Index), find(l.Peer)
				if a != b {
					parent[max(a, b)] = min(a, b)
				}
			}
		}
	}
	groups := map[int][]int{}
	for i := range linked {
		r := find(i)
		groups[r] = append(groups[r], i)
	}
	var roots []int
	for r := range groups {
		roots = append(roots, r)
	}
	sort.Ints(roots)
	var out []string
	for _, r := range roots {
		g := groups[r]
		sort.Ints(g)
		out = append(out, ranges(g))
	}
	return out
}

// ranges writes sorted ints compactly: 0,1,2,3,6 -> "0-3,6".
func ranges(xs []int) string {
	var parts []string
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", xs[i], xs[j]))
		} else {
			parts = append(parts, strconv.Itoa(xs[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// latestFailedScheduling maps pod UID to the newest FailedScheduling message.
func latestFailedScheduling(events []v1.Event) map[string]string {
	type seen struct {
		at  time.Time
		msg string
	}
	m := map[string]seen{}
	for i := range events {
		e := &events[i]
		if e.Reason != "FailedScheduling" || e.InvolvedObject.Kind != "Pod" {
			continue
		}
		at := e.LastTimestamp.Time
		if !e.EventTime.IsZero() && e.EventTime.After(at) {
			at = e.EventTime.Time
		}
		if e.Series != nil && e.Series.LastObservedTime.After(at) {
			at = e.Series.LastObservedTime.Time
		}
		uid := string(e.InvolvedObject.UID)
		if s, ok := m[uid]; !ok || at.After(s.at) {
			m[uid] = seen{at: at, msg: e.Message}
		}
	}
	out := make(map[string]string, len(m))
	for k, s := range m {
		out[k] = s.msg
	}
	return out
}

// pendingOf says what a pod asked for and why it is not placed: the PodScheduled
// condition the scheduler wrote (what kubectl describe shows), else the newest
// FailedScheduling event.
func pendingOf(p *v1.Pod, names api.ResourceNames, events map[string]string) allocationv1alpha1.PendingPod {
	pp := allocationv1alpha1.PendingPod{Namespace: p.Namespace, Name: p.Name, SchedulerName: p.Spec.SchedulerName}
	if req, err := api.ParsePodRequest(p, names); err != nil {
		pp.Request = "invalid request"
	} else {
		var parts []string
		for _, c := range req.Containers {
			parts = append(parts, c.String())
		}
		pp.Request = strings.Join(parts, " + ")
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Message != "" {
			pp.Reason = c.Message
		}
	}
	if pp.Reason == "" {
		pp.Reason = events[string(p.UID)]
	}
	if pp.Reason == "" {
		pp.Reason = fmt.Sprintf("not seen by a scheduler yet: is a scheduler with the name %q running?", p.Spec.SchedulerName)
	}
	return pp
}

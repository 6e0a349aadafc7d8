package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api"
)

type allocationOptions struct {
	nodes      string
	staleAfter time.Duration
}

func (o *allocationOptions) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.nodes, "nodes", "", "comma-separated node names to show (default: every node with a GPU inventory)")
	fs.DurationVar(&o.staleAfter, "stale-after", 5*time.Minute, "flag inventories older than this as stale (the scheduler's inventoryStaleness)")
}

func runAllocation(ctx context.Context, c *clients, o *allocationOptions, out io.Writer) error {
	st, err := fetch(ctx, c)
	if err != nil {
		return err
	}
	v := buildView(st, c.names, time.Now(), o.staleAfter, splitNames(o.nodes))
	v.render(out)
	return nil
}

// state is what the view is computed from: three lists, read from the API.
type state struct {
	nodes  []v1.Node
	pods   []v1.Pod
	events []v1.Event
}

func fetch(ctx context.Context, c *clients) (*state, error) {
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	pods, err := c.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	// Only the scheduler's verdicts matter; the field selector keeps the list small.
	events, err := c.kube.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod,reason=FailedScheduling"})
	if err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	return &state{nodes: nodes.Items, pods: pods.Items, events: events.Items}, nil
}

func splitNames(s string) map[string]bool {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	m := map[string]bool{}
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			m[n] = true
		}
	}
	return m
}

// view is the cluster's GPU allocation, ready to print.
type view struct {
	nodes       []nodeView
	noInventory []string // nodes without an inventory annotation and without GPU pods
	pending     []pendingPod
	problems    []string
}

type nodeView struct {
	name    string
	ready   bool
	inv     *api.NodeInventory
	invErr  error
	age     time.Duration
	stale   bool
	islands []string // NVLink islands as index ranges, e.g. "0-3"
	units   []unitView
	// orphans are grants of pods bound here that name no GPU of the inventory.
	orphans []string
}

// unitView is one schedulable unit: a whole GPU, or one MIG instance.
type unitView struct {
	label     string // "0", or "0/1g.10gb#0" for the first 1g.10gb instance of GPU 0
	mig       bool
	uuid      string
	model     string
	memoryMiB int64
	healthy   bool
	health    string
	usedMiB   int64
	cores     int
	grants    []grantView
}

type grantView struct {
	pod         string
	container   string
	memMiB      int64
	cores       int
	gpus        int    // how many GPUs the container holds in all
	siblings    string // the labels of those GPUs, e.g. "0,1,2,3"
	terminating bool
}

type pendingPod struct {
	name      string
	scheduler string
	request   string
	reason    string
}

// buildView matches the pods' assignments to the nodes' inventories the way the
// scheduler's cache does: a pod counts when it is bound, not finished, and its
// assignment names the node it is bound to.
func buildView(st *state, names api.ResourceNames, now time.Time, staleAfter time.Duration, only map[string]bool) *view {
	v := &view{}
	byNode := map[string]*nodeView{}
	units := map[string]map[string]*unitView{} // node -> uuid -> unit
	sort.Slice(st.nodes, func(i, j int) bool { return st.nodes[i].Name < st.nodes[j].Name })
	for i := range st.nodes {
		n := &st.nodes[i]
		if only != nil && !only[n.Name] {
			continue
		}
		nv := nodeView{name: n.Name, ready: nodeReady(n)}
		raw, ok := n.Annotations[api.AnnotationInventory]
		if !ok {
			nv.invErr = errNoInventory
		} else if inv, err := api.DecodeInventory(raw); err != nil {
			nv.invErr = err
		} else {
			nv.inv = inv
			nv.age = inv.Age(now)
			nv.stale = staleAfter > 0 && nv.age > staleAfter
			nv.islands = nvlinkIslands(inv)
			nv.units = unitsOf(inv)
		}
		v.nodes = append(v.nodes, nv)
	}
	for i := range v.nodes {
		nv := &v.nodes[i]
		byNode[nv.name] = nv
		m := map[string]*unitView{}
		for j := range nv.units {
			m[nv.units[j].uuid] = &nv.units[j]
		}
		units[nv.name] = m
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
				v.pending = append(v.pending, pendingOf(p, names, events))
			}
			continue
		}
		if !assigned {
			if api.HasGPURequest(p, names) && (only == nil || only[p.Spec.NodeName]) {
				v.problems = append(v.problems, fmt.Sprintf("%s asks for GPUs and is bound to %s without a Tessera assignment (scheduler %q): nothing limits its GPU use",
					podName(p), p.Spec.NodeName, p.Spec.SchedulerName))
			}
			continue
		}
		nv := byNode[p.Spec.NodeName]
		if nv == nil {
			continue
		}
		hasGPUPods[nv.name] = true
		a, err := api.DecodeAssignment(raw)
		if err != nil {
			v.problems = append(v.problems, fmt.Sprintf("%s: %v", podName(p), err))
			continue
		}
		if a.Node != p.Spec.NodeName {
			v.problems = append(v.problems, fmt.Sprintf("%s: assignment names node %s but the pod is bound to %s; not counted", podName(p), a.Node, p.Spec.NodeName))
			continue
		}
		for _, ca := range a.Containers {
			idx := make([]string, len(ca.Devices))
			for k, d := range ca.Devices {
				// The label names MIG instances too ("0/1g.10gb#2"), where the index
				// would only name their GPU.
				if u := units[nv.name][d.UUID]; u != nil {
					idx[k] = u.label
				} else {
					idx[k] = strconv.Itoa(d.Index)
				}
			}
			for _, d := range ca.Devices {
				g := grantView{pod: podName(p), container: ca.Name, memMiB: d.MemoryMiB, cores: d.Cores,
					gpus: len(ca.Devices), siblings: strings.Join(idx, ","), terminating: p.DeletionTimestamp != nil}
				u := units[nv.name][d.UUID]
				if u == nil {
					nv.orphans = append(nv.orphans, fmt.Sprintf("%s holds %s, which the node's inventory does not list", g.pod, d.UUID))
					continue
				}
				u.usedMiB += d.MemoryMiB
				u.cores += d.Cores
				u.grants = append(u.grants, g)
			}
		}
	}
	// Nodes without an inventory say nothing per GPU; they are listed by name unless
	// pods claim GPUs there, which is worth a full entry.
	kept := v.nodes[:0]
	for _, nv := range v.nodes {
		if nv.inv == nil && !hasGPUPods[nv.name] && only == nil && errors.Is(nv.invErr, errNoInventory) {
			v.noInventory = append(v.noInventory, nv.name)
			continue
		}
		kept = append(kept, nv)
	}
	v.nodes = kept
	return v
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

func podName(p *v1.Pod) string {
	if p.Namespace == metav1.NamespaceDefault {
		return p.Name
	}
	return p.Namespace + "/" + p.Name
}

// unitsOf lists the schedulable units of an inventory: whole GPUs, and the instances
// of GPUs in MIG mode.
func unitsOf(inv *api.NodeInventory) []unitView {
	var us []unitView
	for _, g := range inv.GPUs {
		health := g.HealthReason
		if g.MIG != nil {
			for k, m := range g.MIG.Instances {
				us = append(us, unitView{label: fmt.Sprintf("%d/%s#%d", g.Index, m.Profile, k), mig: true, uuid: m.UUID, model: g.Model,
					memoryMiB: m.MemoryMiB, healthy: g.Healthy, health: health})
			}
			continue
		}
		us = append(us, unitView{label: strconv.Itoa(g.Index), uuid: g.UUID, model: g.Model, memoryMiB: g.MemoryMiB,
			healthy: g.Healthy, health: health})
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
func pendingOf(p *v1.Pod, names api.ResourceNames, events map[string]string) pendingPod {
	pp := pendingPod{name: podName(p), scheduler: p.Spec.SchedulerName}
	if req, err := api.ParsePodRequest(p, names); err != nil {
		pp.request = "invalid request"
	} else {
		var parts []string
		for _, c := range req.Containers {
			parts = append(parts, c.String())
		}
		pp.request = strings.Join(parts, " + ")
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Message != "" {
			pp.reason = c.Message
		}
	}
	if pp.reason == "" {
		pp.reason = events[string(p.UID)]
	}
	if pp.reason == "" {
		pp.reason = fmt.Sprintf("not seen by a scheduler yet: is a scheduler with the name %q running?", p.Spec.SchedulerName)
	}
	return pp
}

func (v *view) render(w io.Writer) {
	var gpus, used int
	var memTotal, memUsed int64
	var coresUsed int
	var mig bool
	for i := range v.nodes {
		nv := &v.nodes[i]
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "NODE %s  %s\n", nv.name, nv.headline())
		if nv.inv == nil {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  GPU\tMEMORY MiB\tMEMORY GRANTED\tCORES GRANTED\tPODS")
		for _, u := range nv.units {
			gpus++
			memTotal += u.memoryMiB
			memUsed += u.usedMiB
			coresUsed += u.cores
			if len(u.grants) > 0 {
				used++
			}
			mig = mig || u.mig
			pods := "-"
			if len(u.grants) > 0 {
				ps := make([]string, len(u.grants))
				for k, g := range u.grants {
					ps[k] = g.String()
				}
				pods = strings.Join(ps, ", ")
			}
			if !u.healthy {
				pods = "UNHEALTHY (" + u.health + ") " + pods
			}
			pct := 0
			if u.memoryMiB > 0 {
				pct = int(u.usedMiB * 100 / u.memoryMiB)
			}
			fmt.Fprintf(tw, "  %s\t%d/%d\t%s %3d%%\t%d%%\t%s\n", u.label, u.usedMiB, u.memoryMiB, bar(pct), pct, u.cores, pods)
		}
		tw.Flush()
		for _, o := range nv.orphans {
			fmt.Fprintf(w, "  warning: %s\n", o)
		}
	}
	if len(v.noInventory) > 0 {
		fmt.Fprintf(w, "\nNodes without a GPU inventory (%d): %s\n", len(v.noInventory), abbreviate(v.noInventory, 10))
	}
	if gpus > 0 {
		pct := memUsed * 100 / max(memTotal, 1)
		what := "GPUs"
		if mig {
			what = "GPUs and MIG instances"
		}
		fmt.Fprintf(w, "\n%s holding pods: %d of %d; memory granted: %d of %d MiB (%d%%); cores granted: %d%% of %d%%\n",
			what, used, gpus, memUsed, memTotal, pct, coresUsed, 100*gpus)
	}
	if len(v.problems) > 0 {
		fmt.Fprintf(w, "\nProblems:\n")
		for _, p := range v.problems {
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
	if len(v.pending) == 0 {
		fmt.Fprintf(w, "\nPending GPU pods: none\n")
		return
	}
	fmt.Fprintf(w, "\nPending GPU pods (%d):\n", len(v.pending))
	for _, p := range v.pending {
		fmt.Fprintf(w, "  %s  [%s, scheduler %s]\n      %s\n", p.name, p.request, p.scheduler, p.reason)
	}
}

func (nv *nodeView) headline() string {
	var parts []string
	if nv.inv != nil {
		models := map[string]int{}
		var order []string
		for _, g := range nv.inv.GPUs {
			if models[g.Model] == 0 {
				order = append(order, g.Model)
			}
			models[g.Model]++
		}
		for _, m := range order {
			parts = append(parts, fmt.Sprintf("%d x %s", models[m], m))
		}
		if len(nv.islands) > 0 {
			parts = append(parts, "NVLink islands "+strings.Join(nv.islands, " | "))
		} else {
			parts = append(parts, "no NVLink")
		}
	}
	if nv.ready {
		parts = append(parts, "Ready")
	} else {
		parts = append(parts, "NotReady")
	}
	switch {
	case nv.invErr != nil:
		parts = append(parts, nv.invErr.Error())
	case nv.stale:
		parts = append(parts, fmt.Sprintf("STALE inventory (%s old): the scheduler places no new GPU pods here", nv.age.Round(time.Second)))
	default:
		parts = append(parts, fmt.Sprintf("inventory %s old", nv.age.Round(time.Second)))
	}
	return strings.Join(parts, ", ")
}

func (g grantView) String() string {
	var b strings.Builder
	b.WriteString(g.pod)
	fmt.Fprintf(&b, " (%d MiB", g.memMiB)
	if g.cores > 0 {
		fmt.Fprintf(&b, ", %d%%", g.cores)
	}
	if g.gpus > 1 {
		fmt.Fprintf(&b, ", GPUs %s", g.siblings)
	}
	if g.terminating {
		b.WriteString(", terminating")
	}
	b.WriteString(")")
	return b.String()
}

// bar is a ten-cell gauge.
func bar(pct int) string {
	n := min(max((pct+5)/10, 0), 10)
	if pct > 0 && n == 0 {
		n = 1
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", 10-n) + "]"
}

func abbreviate(xs []string, n int) string {
	if len(xs) <= n {
		return strings.Join(xs, ", ")
	}
	return strings.Join(xs[:n], ", ") + fmt.Sprintf(", and %d more", len(xs)-n)
}

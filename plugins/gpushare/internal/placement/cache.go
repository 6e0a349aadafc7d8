// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
)

// Usage is what is granted on one device.
type Usage struct {
	MemMiB  int64
	Cores   int
	Tenants int
}

// Grant is one container's share of one device.
type Grant struct {
	UUID   string
	MemMiB int64
	Cores  int
}

// podRecord is the GPU usage of one pod on one node.
type podRecord struct {
	uid       types.UID
	namespace string
	name      string
	Node      string
	Grants    []Grant
	// assumed is true from Reserve until the informer shows the pod bound with its
	// assignment annotation; only assumed records are dropped by Unreserve.
	assumed bool
}

// NodeEntry is the cache's view of one node. mu guards every field.
//
// The fields Filter reads on every node come first and together (mu, name, seen,
// model, used, heartbeat, invErr, usageGen, memo, then keptMu and kept): Filter's
// cost on a large cluster is mostly cache misses, one per line of the entry it
// touches.
type NodeEntry struct {
	mu   sync.RWMutex
	name string // compared by every lookup (nodeTable)
	// seen is a node object whose annotations are raw and reqRaw, or nil. Informer objects are
	// never changed in place, so view can skip the annotation lookup for it: on a
	// busy scheduler that lookup, a cache miss on every node, was a quarter of
	// Filter's time. Stored under mu's read lock (hence atomic), cleared with raw.
	seen  atomic.Pointer[v1.Node]
	model *nodemodel.Model
	used  []Usage // per device of model
	// heartbeat is the inventory's updatedAt (zero without one), kept here rather
	// than read from the decoded inventory: Filter checks it on every node, and the
	// inventory object is one more cache miss per node.
	heartbeat time.Time
	invErr    error
	// reqErr is why the node's agent refuses GPU containers (its
	// api.AnnotationRequirements), or nil; reqRaw is that annotation.
	reqErr error
	// usageGen changes whenever model or used does: it tells a placer's measure
	// kept in memo whether it still describes the node.
	usageGen uint64
	// memo is the node's slot for a placer's measure of the node as it is
	// (LoadMemo): kept across cycles, because only the node a pod goes to and the
	// nodes informer events touch change from one cycle to the next. Read and
	// replaced without a lock by Filter and Score (it is immutable once stored).
	// Beside the fields Filter reads on every node: one cache line fewer.
	memo atomic.Pointer[Memo]

	// kept is the allocation Filter made on this node in the scheduling cycle
	// numbered keptCycle (0: none), for Score. It lives here, reused from cycle to
	// cycle, so that Filter allocates nothing per node and keeps its result without
	// a lock shared by all nodes. keptMu, not mu, guards both.
	keptMu    sync.Mutex
	keptCycle uint64
	// keptGen is the usage generation (usageGen) kept was made at, or 0 when it was
	// made under preemption's what-if changes: Reserve takes kept as it is while the
	// node's usage is still that generation (Allocate is a pure function of it).
	keptGen uint64
	kept    Allocation

	// raw is the inventory annotation the model was decoded from.
	raw       string
	reqRaw    string
	pods      map[types.UID]*podRecord
	unmatched int // grants naming a UUID the inventory does not have
}

// Cache is the GPU state shared by every profile of one scheduler: node inventories
// and the grants of every pod that holds GPUs. Informer events keep it current;
// Reserve assumes, Unreserve forgets.
//
// Locking: mu guards pods and every write to nodes, and is taken before any
// NodeEntry.mu. Pod changes hold mu for their whole update so that a pod's grants move
// atomically between nodes. Filter, Score and PreScore find a node's entry in nodes
// without mu, then take the node's read lock and its keptMu.
type Cache struct {
	Mu   sync.RWMutex
	Pods map[types.UID]*podRecord
	// nodes maps a node's name to its *NodeEntry. Written only under mu, read
	// without it: Filter, Score and PreScore look up every node on every core at
	// once, and a read lock shared by all of them made every lookup write the same
	// cache line (3.5 s of CPU in B2 at 5,000 nodes on 16 cores). See nodeTable.
	nodes nodeTable
	// MostHealthy is at least the largest healthy-GPU count any node's inventory has
	// had (it never goes down): PreScore stops looking up nodes for the largest one
	// once it has found a node with that many.
	MostHealthy atomic.Int64
	// hints find an entry from the node object Filter and Score are given, without
	// hashing its name (objectHints).
	hints objectHints
}

// noteModel raises MostHealthy to m's healthy GPUs.
func (c *Cache) noteModel(m *nodemodel.Model) {
	if m == nil {
		return
	}
	h := int64(m.Healthy)
	for {
		old := c.MostHealthy.Load()
		if h <= old || c.MostHealthy.CompareAndSwap(old, h) {
			return
		}
	}
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{Pods: map[types.UID]*podRecord{}}
}

// node returns the entry for name, creating it.
func (c *Cache) node(name string) *NodeEntry {
	if e := c.existing(name); e != nil {
		return e
	}
	c.Mu.Lock()
	defer c.Mu.Unlock()
	return c.nodeLocked(name)
}

func (c *Cache) nodeLocked(name string) *NodeEntry {
	e := c.existing(name)
	if e == nil {
		e = &NodeEntry{name: name, pods: map[types.UID]*podRecord{}, invErr: errNoInventory}
		c.nodes.store(e)
		c.hints.resize(c.nodes.live)
	}
	return e
}

var errNoInventory = fmt.Errorf("node has no %s annotation: the Tessera node agent is not running there or has not published yet", api.AnnotationInventory)

// SetInventory records the node's inventory annotation (raw may be empty). Decoding
// happens only when the value changed.
func (c *Cache) SetInventory(nodeName, raw string) {
	e := c.node(nodeName)
	e.mu.RLock()
	same := e.raw == raw
	e.mu.RUnlock()
	if same {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.raw != raw {
		e.setInventoryLocked(raw)
		c.noteModel(e.model)
	}
}

// SetRequirements records the node's requirements annotation (raw may be empty).
func (c *Cache) SetRequirements(nodeName, raw string) {
	e := c.node(nodeName)
	e.mu.RLock()
	same := e.reqRaw == raw
	e.mu.RUnlock()
	if same {
		return
	}
	e.mu.Lock()
	e.setRequirementsLocked(raw)
	e.mu.Unlock()
}

func (e *NodeEntry) setRequirementsLocked(raw string) {
	e.reqRaw, e.reqErr = raw, api.RequirementsError(raw)
	e.seen.Store(nil)
}

func (e *NodeEntry) setInventoryLocked(raw string) {
	e.raw = raw
	e.seen.Store(nil)
	e.heartbeat, e.model, e.invErr = time.Time{}, nil, nil
	if raw == "" {
		e.invErr = errNoInventory
	} else if inv, err := api.DecodeInventory(raw); err != nil {
		e.invErr = fmt.Errorf("node's %s annotation is invalid: %w", api.AnnotationInventory, err)
	} else {
		e.heartbeat, e.model = inv.UpdatedAt, nodemodel.Build(inv)
	}
	e.recomputeLocked()
}

// recomputeLocked rebuilds per-device usage from the node's pod records.
func (e *NodeEntry) recomputeLocked() {
	e.usageGen++
	e.unmatched = 0
	if e.model == nil {
		e.used = nil
		return
	}
	e.used = make([]Usage, len(e.model.Devices))
	for _, r := range e.pods {
		e.applyLocked(r, 1)
	}
}

func (e *NodeEntry) applyLocked(r *podRecord, sign int) {
	if e.model == nil {
		return
	}
	e.usageGen++
	for _, g := range r.Grants {
		i, ok := e.model.ByUUID[g.UUID]
		if !ok {
			e.unmatched += sign
			continue
		}
		u := &e.used[i]
		u.MemMiB += int64(sign) * g.MemMiB
		u.Cores += sign * g.Cores
		u.Tenants += sign
	}
}

// RemoveNode forgets a deleted node's inventory. Its pods stay recorded until their
// own delete events arrive.
func (c *Cache) RemoveNode(nodeName string) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	e := c.existing(nodeName)
	if e == nil {
		return
	}
	if len(e.pods) == 0 {
		c.nodes.remove(nodeName)
		// A hint naming the entry no longer matches any object.
		e.seen.Store(nil)
		return
	}
	e.mu.Lock()
	e.setInventoryLocked("")
	e.mu.Unlock()
}

// NodeView is a consistent copy of what Filter needs from one node; View returns the
// node's usage beside it.
type NodeView struct {
	Model     *nodemodel.Model
	Heartbeat time.Time
	InvErr    error
	ReqErr    error
	// UsageGen is the entry's usage generation when the view was taken.
	UsageGen uint64
}

// View returns the node's model and a copy of its usage (in into's storage when it
// has room, nil without a model), refreshing the inventory first when the node object
// carries a different annotation than the cache saw (the scheduler's snapshot may be
// ahead of this cache's informer handler). The usage is a separate result so that a
// caller's stack buffer stays on the stack when the view's error escapes.
func (c *Cache) View(node *v1.Node, into []Usage) (NodeView, []Usage) {
	_, v, used := c.EntryView(node, into)
	return v, used
}

// EntryView is View that also returns the node's entry.
func (c *Cache) EntryView(node *v1.Node, into []Usage) (*NodeEntry, NodeView, []Usage) {
	e := c.hints.load(node)
	if e == nil {
		e = c.node(node.Name)
	}
	e.mu.RLock()
	if e.seen.Load() != node {
		raw, req := node.Annotations[api.AnnotationInventory], node.Annotations[api.AnnotationRequirements]
		if e.raw != raw || e.reqRaw != req {
			e.mu.RUnlock()
			e.mu.Lock()
			if e.raw != raw {
				e.setInventoryLocked(raw)
				c.noteModel(e.model)
			}
			if e.reqRaw != req {
				e.setRequirementsLocked(req)
			}
			e.mu.Unlock()
			e.mu.RLock()
		}
		// raw and reqRaw cannot change while the read lock is held.
		if e.raw == raw && e.reqRaw == req {
			e.seen.Store(node)
			c.hints.store(node, e)
		}
	}
	v := NodeView{Model: e.model, Heartbeat: e.heartbeat, InvErr: e.invErr, ReqErr: e.reqErr, UsageGen: e.usageGen}
	var used []Usage
	if e.model != nil {
		used = append(into[:0], e.used...)
	}
	e.mu.RUnlock()
	return e, v, used
}

// existing returns the entry for name, or nil.
func (c *Cache) existing(name string) *NodeEntry {
	return c.nodes.load(name)
}

// ExistingFor is existing for node's name, found from the object when it can be
// (objectHints).
func (c *Cache) ExistingFor(node *v1.Node) *NodeEntry {
	if e := c.hints.load(node); e != nil {
		return e
	}
	return c.nodes.load(node.Name)
}

// Memo is the handle a node's cache entry keeps a placer's measure of the node by
// (NodeEntry.StoreMemo): Of is the placer's own value, which embeds the Memo so that
// reaching it from the entry costs no further memory access (Of points back to it).
// A placer tells its own values from another's by Of's type, and their currency by
// the usage generation it keeps in them (NodeView.UsageGen).
type Memo struct {
	Of any
}

// LoadMemo returns the value of the memo the node's entry keeps, or nil.
func (e *NodeEntry) LoadMemo() any {
	if m := e.memo.Load(); m != nil {
		return m.Of
	}
	return nil
}

// StoreMemo replaces the node's memo. m and what it points to must not change once
// stored: Filter and Score read it without a lock.
func (e *NodeEntry) StoreMemo(m *Memo) { e.memo.Store(m) }

// Keep runs allocateInto on the node's kept allocation and, when it succeeds,
// marks the allocation as the one of cycle, made at usage generation gen (0: not
// the cache's usage as it is). A one-container pod's placement starts from the
// measure of the node its placer keeps in e, when gen is not 0 (see place).
func (e *NodeEntry) Keep(cycle, gen uint64, m *nodemodel.Model, used []Usage, p *PodInfo, w *Weights) *allocFailure {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	e.keptCycle = 0
	fail := allocateInto(&e.kept, m, used, p, w, e, gen)
	if fail == nil {
		e.keptCycle, e.keptGen = cycle, gen
	}
	return fail
}

// KeptAt calls f with the allocation Filter kept on the node in cycle, when it was
// made on model m at usage generation gen (the node as a view shows it now), and
// returns true; otherwise it returns false. The allocation is valid only during f.
func (e *NodeEntry) KeptAt(cycle, gen uint64, m *nodemodel.Model, f func(a *Allocation)) bool {
	if e == nil || cycle == 0 || gen == 0 {
		return false
	}
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	if e.keptCycle != cycle || e.keptGen != gen || e.kept.Model != m {
		return false
	}
	f(&e.kept)
	return true
}

// WithKept calls f with the allocation Filter kept on the node in cycle and returns
// true, or returns false when there is none. The allocation is valid only during f.
func (e *NodeEntry) WithKept(cycle uint64, f func(a *Allocation)) bool {
	if e == nil || cycle == 0 {
		return false
	}
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	if e.keptCycle != cycle {
		return false
	}
	f(&e.kept)
	return true
}

// PodGrants returns the grants of a recorded pod on node, or nil.
func (c *Cache) PodGrants(uid types.UID, node string) []Grant {
	c.Mu.RLock()
	defer c.Mu.RUnlock()
	if r := c.Pods[uid]; r != nil && r.Node == node {
		return r.Grants
	}
	return nil
}

// putLocked replaces the record of r.uid (if any) with r. Filter and Reserve read a
// node's usage under its lock alone, so a replacement on the same node (the informer
// confirming what Reserve assumed) happens in one critical section: released and
// retaken in between, it showed the pod's GPUs free for a moment, and a pod placed on
// them in that moment failed Reserve. A record moving between nodes is added to the
// new node before it leaves the old one: counted twice for a moment, never missing.
func (c *Cache) putLocked(r *podRecord) {
	old := c.Pods[r.uid]
	c.Pods[r.uid] = r
	e := c.nodeLocked(r.Node)
	e.mu.Lock()
	if old != nil && old.Node == r.Node && e.pods[r.uid] == old {
		e.applyLocked(old, -1)
	}
	e.pods[r.uid] = r
	e.applyLocked(r, 1)
	e.mu.Unlock()
	if old != nil && old.Node != r.Node {
		c.dropFromNodeLocked(old)
	}
}

// dropFromNodeLocked removes record r from its node's entry, if it is still there.
func (c *Cache) dropFromNodeLocked(r *podRecord) {
	if e := c.existing(r.Node); e != nil {
		e.mu.Lock()
		if e.pods[r.uid] == r {
			delete(e.pods, r.uid)
			e.applyLocked(r, -1)
		}
		e.mu.Unlock()
	}
}

func (c *Cache) deleteLocked(uid types.UID) *podRecord {
	old := c.Pods[uid]
	if old == nil {
		return nil
	}
	delete(c.Pods, uid)
	c.dropFromNodeLocked(old)
	return old
}

// OnPod reconciles a pod seen by the informer. A pod counts once it is bound to a node
// and carries a valid assignment for that node; an unbound pod keeps only the record
// this scheduler assumed for it.
func (c *Cache) OnPod(pod *v1.Pod) error {
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		c.OnPodDelete(pod.UID)
		return nil
	}
	if pod.Spec.NodeName == "" {
		return nil
	}
	raw, ok := pod.Annotations[api.AnnotationAssignment]
	if !ok {
		return nil
	}
	a, err := api.DecodeAssignment(raw)
	if err != nil {
		return err
	}
	if a.Node != pod.Spec.NodeName {
		return fmt.Errorf("GPU assignment names node %q but the pod is bound to %q; ignored", a.Node, pod.Spec.NodeName)
	}
	r := recordFromAssignment(pod, a)
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if old := c.Pods[pod.UID]; old != nil && !old.assumed && old.Node == r.Node && sameGrants(old.Grants, r.Grants) {
		return nil
	}
	c.putLocked(r)
	return nil
}

// OnPodDelete forgets a pod.
func (c *Cache) OnPodDelete(uid types.UID) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.deleteLocked(uid)
}

func recordFromAssignment(pod *v1.Pod, a *api.PodAssignment) *podRecord {
	r := &podRecord{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, Node: a.Node}
	for _, ca := range a.Containers {
		for _, d := range ca.Devices {
			r.Grants = append(r.Grants, Grant{UUID: d.UUID, MemMiB: d.MemoryMiB, Cores: d.Cores})
		}
	}
	return r
}

func sameGrants(a, b []Grant) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Assume records grants for pod on node after checking, under the node's lock, that
// they still fit. It is the only way capacity is taken, so two pods can never be
// granted the same capacity.
func (c *Cache) Assume(pod *v1.Pod, node string, grants []Grant, maxTenants int) error {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	e := c.nodeLocked(node)
	e.mu.RLock()
	err := e.fitsLocked(grants, maxTenants, c.Pods[pod.UID])
	e.mu.RUnlock()
	if err != nil {
		return err
	}
	c.putLocked(&podRecord{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, Node: node, Grants: grants, assumed: true})
	return nil
}

func (e *NodeEntry) fitsLocked(grants []Grant, maxTenants int, replacing *podRecord) error {
	if e.model == nil {
		return fmt.Errorf("node %s: %v", e.name, e.invErr)
	}
	add := make([]Usage, len(e.used))
	copy(add, e.used)
	if replacing != nil && replacing.Node == e.name {
		for _, g := range replacing.Grants {
			if i, ok := e.model.ByUUID[g.UUID]; ok {
				add[i].MemMiB -= g.MemMiB
				add[i].Cores -= g.Cores
				add[i].Tenants--
			}
		}
	}
	for _, g := range grants {
		i, ok := e.model.ByUUID[g.UUID]
		if !ok {
			return fmt.Errorf("node %s has no GPU %s", e.name, g.UUID)
		}
		d := &e.model.Devices[i]
		u := &add[i]
		u.MemMiB += g.MemMiB
		u.Cores += g.Cores
		u.Tenants++
		switch {
		case !d.Healthy:
			return fmt.Errorf("GPU %s on node %s is unhealthy", g.UUID, e.name)
		case u.MemMiB > d.MemoryMiB:
			return fmt.Errorf("GPU %s on node %s: %d MiB granted of %d", g.UUID, e.name, u.MemMiB, d.MemoryMiB)
		case u.Cores > 100:
			return fmt.Errorf("GPU %s on node %s: %d%% cores granted", g.UUID, e.name, u.Cores)
		case u.Tenants > maxTenants:
			return fmt.Errorf("GPU %s on node %s: %d tenants, limit %d", g.UUID, e.name, u.Tenants, maxTenants)
		}
	}
	return nil
}

// Forget drops the record of pod if it is still only assumed (Unreserve). A record
// the informer has confirmed stays: the pod really holds those GPUs.
func (c *Cache) Forget(uid types.UID) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if r := c.Pods[uid]; r != nil && r.assumed {
		c.deleteLocked(uid)
	}
}

// DeviceUsage is the granted share of one device, for tools and tests.
type DeviceUsage struct {
	UUID      string
	Index     int
	Model     string
	MemoryMiB int64
	UsedMiB   int64
	Cores     int
	Tenants   int
	Pods      []string // namespace/name
}

// NodeUsage reports the grants on every device of node, and the node's inventory
// error if it is unusable.
func (c *Cache) NodeUsage(node string) ([]DeviceUsage, error) {
	e := c.existing(node)
	if e == nil {
		return nil, errNoInventory
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.model == nil {
		return nil, e.invErr
	}
	out := make([]DeviceUsage, len(e.model.Devices))
	for i, d := range e.model.Devices {
		u := e.used[i]
		out[i] = DeviceUsage{UUID: d.UUID, Index: d.Index, Model: d.Model, MemoryMiB: d.MemoryMiB, UsedMiB: u.MemMiB, Cores: u.Cores, Tenants: u.Tenants}
	}
	for _, r := range e.pods {
		for _, g := range r.Grants {
			if i, ok := e.model.ByUUID[g.UUID]; ok {
				out[i].Pods = append(out[i].Pods, r.namespace+"/"+r.name)
			}
		}
	}
	return out, nil
}

// Stale reports whether an inventory heartbeat is older than limit (0 disables). An
// inventory without one (zero) is as old as can be.
func Stale(heartbeat time.Time, limit time.Duration, now time.Time) (time.Duration, bool) {
	if limit <= 0 {
		return 0, false
	}
	age := now.Sub(heartbeat)
	return age, age > limit
}

// CacheStats is what the cache holds, for the metrics.
type CacheStats struct {
	Nodes, GPUs, Healthy int
	MemMiB, GrantedMiB   int64
	GrantedCores         int
	Assumed, Bound       int
}

// Stats adds the cache's figures to s. It takes each node's read lock in turn.
func (c *Cache) Stats(s *CacheStats) {
	c.EachModel(func(m *nodemodel.Model, used []Usage) {
		s.Nodes++
		s.GPUs += len(m.Devices)
		s.Healthy += m.Healthy
		for i := range m.Devices {
			s.MemMiB += m.Devices[i].MemoryMiB
			s.GrantedMiB += used[i].MemMiB
			s.GrantedCores += used[i].Cores
		}
	})
	c.Mu.RLock()
	for _, r := range c.Pods {
		if r.assumed {
			s.Assumed += len(r.Grants)
		} else {
			s.Bound += len(r.Grants)
		}
	}
	c.Mu.RUnlock()
}

// EachModel calls f with the model and usage of every node that has an inventory,
// under the node's read lock: f must not keep used.
func (c *Cache) EachModel(f func(m *nodemodel.Model, used []Usage)) {
	c.EachView(func(_ *NodeEntry, v *NodeView, used []Usage) { f(v.Model, used) })
}

// EachView is EachModel with the node's entry and view (valid only during f).
func (c *Cache) EachView(f func(e *NodeEntry, v *NodeView, used []Usage)) {
	// One view for all nodes: f is not known here, so a view per node would be a heap
	// object per node (the metrics collector reads every node at each scrape).
	v := new(NodeView)
	c.nodes.each(func(e *NodeEntry) {
		e.mu.RLock()
		if e.model != nil {
			*v = NodeView{Model: e.model, Heartbeat: e.heartbeat, InvErr: e.invErr, ReqErr: e.reqErr, UsageGen: e.usageGen}
			f(e, v, e.used)
		}
		e.mu.RUnlock()
	})
}

package gpushare

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
)

// usage is what is granted on one device.
type usage struct {
	memMiB  int64
	cores   int
	tenants int
}

// grant is one container's share of one device.
type grant struct {
	uuid   string
	memMiB int64
	cores  int
}

// podRecord is the GPU usage of one pod on one node.
type podRecord struct {
	uid       types.UID
	namespace string
	name      string
	node      string
	grants    []grant
	// assumed is true from Reserve until the informer shows the pod bound with its
	// assignment annotation; only assumed records are dropped by Unreserve.
	assumed bool
}

// nodeEntry is the cache's view of one node. mu guards every field.
//
// The fields Filter reads on every node come first and together (mu, name, seen,
// model, used, heartbeat, invErr, usageGen, frag, then keptMu and kept): Filter's
// cost on a large cluster is mostly cache misses, one per line of the entry it
// touches.
type nodeEntry struct {
	mu   sync.RWMutex
	name string // compared by every lookup (nodeTable)
	// seen is a node object whose annotations are raw and reqRaw, or nil. Informer objects are
	// never changed in place, so view can skip the annotation lookup for it: on a
	// busy scheduler that lookup, a cache miss on every node, was a quarter of
	// Filter's time. Stored under mu's read lock (hence atomic), cleared with raw.
	seen  atomic.Pointer[v1.Node]
	model *nodeModel
	used  []usage // per device of model
	// heartbeat is the inventory's updatedAt (zero without one), kept here rather
	// than read from the decoded inventory: Filter checks it on every node, and the
	// inventory object is one more cache miss per node.
	heartbeat time.Time
	invErr    error
	// reqErr is why the node's agent refuses GPU containers (its
	// api.AnnotationRequirements), or nil; reqRaw is that annotation.
	reqErr error
	// usageGen changes whenever model or used does: it tells the fragmentation
	// measure kept in frag whether it still describes the node.
	usageGen uint64
	// frag is the Fragmentation policy's measure of the node as it is, against the
	// learned workload (fragMemo): kept across cycles, because only the node a pod
	// goes to and the nodes informer events touch change from one cycle to the next.
	// Read and replaced without a lock by Filter and Score (it is immutable once
	// stored). Beside the fields Filter reads on every node: one cache line fewer.
	frag atomic.Pointer[fragMemo]

	// kept is the allocation Filter made on this node in the scheduling cycle
	// numbered keptCycle (0: none), for Score. It lives here, reused from cycle to
	// cycle, so that Filter allocates nothing per node and keeps its result without
	// a lock shared by all nodes. keptMu, not mu, guards both.
	keptMu    sync.Mutex
	keptCycle uint64
	kept      allocation

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
// nodeEntry.mu. Pod changes hold mu for their whole update so that a pod's grants move
// atomically between nodes. Filter, Score and PreScore find a node's entry in nodes
// without mu, then take the node's read lock and its keptMu.
type Cache struct {
	mu   sync.RWMutex
	pods map[types.UID]*podRecord
	// nodes maps a node's name to its *nodeEntry. Written only under mu, read
	// without it: Filter, Score and PreScore look up every node on every core at
	// once, and a read lock shared by all of them made every lookup write the same
	// cache line (3.5 s of CPU in B2 at 5,000 nodes on 16 cores). See nodeTable.
	nodes nodeTable
	// mostHealthy is at least the largest healthy-GPU count any node's inventory has
	// had (it never goes down): PreScore stops looking up nodes for the largest one
	// once it has found a node with that many.
	mostHealthy atomic.Int64
}

// noteModel raises mostHealthy to m's healthy GPUs.
func (c *Cache) noteModel(m *nodeModel) {
	if m == nil {
		return
	}
	h := int64(m.healthy)
	for {
		old := c.mostHealthy.Load()
		if h <= old || c.mostHealthy.CompareAndSwap(old, h) {
			return
		}
	}
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{pods: map[types.UID]*podRecord{}}
}

// node returns the entry for name, creating it.
func (c *Cache) node(name string) *nodeEntry {
	if e := c.existing(name); e != nil {
		return e
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodeLocked(name)
}

func (c *Cache) nodeLocked(name string) *nodeEntry {
	e := c.existing(name)
	if e == nil {
		e = &nodeEntry{name: name, pods: map[types.UID]*podRecord{}, invErr: errNoInventory}
		c.nodes.store(e)
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

func (e *nodeEntry) setRequirementsLocked(raw string) {
	e.reqRaw, e.reqErr = raw, api.RequirementsError(raw)
	e.seen.Store(nil)
}

func (e *nodeEntry) setInventoryLocked(raw string) {
	e.raw = raw
	e.seen.Store(nil)
	e.heartbeat, e.model, e.invErr = time.Time{}, nil, nil
	if raw == "" {
		e.invErr = errNoInventory
	} else if inv, err := api.DecodeInventory(raw); err != nil {
		e.invErr = fmt.Errorf("node's %s annotation is invalid: %w", api.AnnotationInventory, err)
	} else {
		e.heartbeat, e.model = inv.UpdatedAt, buildNodeModel(inv)
	}
	e.recomputeLocked()
}

// recomputeLocked rebuilds per-device usage from the node's pod records.
func (e *nodeEntry) recomputeLocked() {
	e.usageGen++
	e.unmatched = 0
	if e.model == nil {
		e.used = nil
		return
	}
	e.used = make([]usage, len(e.model.devices))
	for _, r := range e.pods {
		e.applyLocked(r, 1)
	}
}

func (e *nodeEntry) applyLocked(r *podRecord, sign int) {
	if e.model == nil {
		return
	}
	e.usageGen++
	for _, g := range r.grants {
		i, ok := e.model.byUUID[g.uuid]
		if !ok {
			e.unmatched += sign
			continue
		}
		u := &e.used[i]
		u.memMiB += int64(sign) * g.memMiB
		u.cores += sign * g.cores
		u.tenants += sign
	}
}

// RemoveNode forgets a deleted node's inventory. Its pods stay recorded until their
// own delete events arrive.
func (c *Cache) RemoveNode(nodeName string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.existing(nodeName)
	if e == nil {
		return
	}
	if len(e.pods) == 0 {
		c.nodes.remove(nodeName)
		return
	}
	e.mu.Lock()
	e.setInventoryLocked("")
	e.mu.Unlock()
}

// nodeView is a consistent copy of what Filter needs from one node; view returns the
// node's usage beside it.
type nodeView struct {
	model     *nodeModel
	heartbeat time.Time
	invErr    error
	reqErr    error
	// usageGen is the entry's usage generation when the view was taken.
	usageGen uint64
}

// view returns the node's model and a copy of its usage (in into's storage when it
// has room, nil without a model), refreshing the inventory first when the node object
// carries a different annotation than the cache saw (the scheduler's snapshot may be
// ahead of this cache's informer handler). The usage is a separate result so that a
// caller's stack buffer stays on the stack when the view's error escapes.
func (c *Cache) view(node *v1.Node, into []usage) (nodeView, []usage) {
	_, v, used := c.entryView(node, into)
	return v, used
}

// entryView is view that also returns the node's entry.
func (c *Cache) entryView(node *v1.Node, into []usage) (*nodeEntry, nodeView, []usage) {
	e := c.node(node.Name)
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
		}
	}
	v := nodeView{model: e.model, heartbeat: e.heartbeat, invErr: e.invErr, reqErr: e.reqErr, usageGen: e.usageGen}
	var used []usage
	if e.model != nil {
		used = append(into[:0], e.used...)
	}
	e.mu.RUnlock()
	return e, v, used
}

// existing returns the entry for name, or nil.
func (c *Cache) existing(name string) *nodeEntry {
	return c.nodes.load(name)
}

// keep runs allocateInto on the node's kept allocation and, when it succeeds,
// marks the allocation as the one of cycle. base is the node's measure before the
// pod, or nil (see place).
func (e *nodeEntry) keep(cycle uint64, m *nodeModel, used []usage, p *podInfo, w *weights, base *fragStats) *allocFailure {
	e.keptMu.Lock()
	defer e.keptMu.Unlock()
	e.keptCycle = 0
	fail := allocateInto(&e.kept, m, used, p, w, base)
	if fail == nil {
		e.keptCycle = cycle
	}
	return fail
}

// withKept calls f with the allocation Filter kept on the node in cycle and returns
// true, or returns false when there is none. The allocation is valid only during f.
func (e *nodeEntry) withKept(cycle uint64, f func(a *allocation)) bool {
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

// podGrants returns the grants of a recorded pod on node, or nil.
func (c *Cache) podGrants(uid types.UID, node string) []grant {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if r := c.pods[uid]; r != nil && r.node == node {
		return r.grants
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
	old := c.pods[r.uid]
	c.pods[r.uid] = r
	e := c.nodeLocked(r.node)
	e.mu.Lock()
	if old != nil && old.node == r.node && e.pods[r.uid] == old {
		e.applyLocked(old, -1)
	}
	e.pods[r.uid] = r
	e.applyLocked(r, 1)
	e.mu.Unlock()
	if old != nil && old.node != r.node {
		c.dropFromNodeLocked(old)
	}
}

// dropFromNodeLocked removes record r from its node's entry, if it is still there.
func (c *Cache) dropFromNodeLocked(r *podRecord) {
	if e := c.existing(r.node); e != nil {
		e.mu.Lock()
		if e.pods[r.uid] == r {
			delete(e.pods, r.uid)
			e.applyLocked(r, -1)
		}
		e.mu.Unlock()
	}
}

func (c *Cache) deleteLocked(uid types.UID) *podRecord {
	old := c.pods[uid]
	if old == nil {
		return nil
	}
	delete(c.pods, uid)
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
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.pods[pod.UID]; old != nil && !old.assumed && old.node == r.node && sameGrants(old.grants, r.grants) {
		return nil
	}
	c.putLocked(r)
	return nil
}

// OnPodDelete forgets a pod.
func (c *Cache) OnPodDelete(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleteLocked(uid)
}

func recordFromAssignment(pod *v1.Pod, a *api.PodAssignment) *podRecord {
	r := &podRecord{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, node: a.Node}
	for _, ca := range a.Containers {
		for _, d := range ca.Devices {
			r.grants = append(r.grants, grant{uuid: d.UUID, memMiB: d.MemoryMiB, cores: d.Cores})
		}
	}
	return r
}

func sameGrants(a, b []grant) bool {
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
func (c *Cache) Assume(pod *v1.Pod, node string, grants []grant, maxTenants int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.nodeLocked(node)
	e.mu.RLock()
	err := e.fitsLocked(grants, maxTenants, c.pods[pod.UID])
	e.mu.RUnlock()
	if err != nil {
		return err
	}
	c.putLocked(&podRecord{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, node: node, grants: grants, assumed: true})
	return nil
}

func (e *nodeEntry) fitsLocked(grants []grant, maxTenants int, replacing *podRecord) error {
	if e.model == nil {
		return fmt.Errorf("node %s: %v", e.name, e.invErr)
	}
	add := make([]usage, len(e.used))
	copy(add, e.used)
	if replacing != nil && replacing.node == e.name {
		for _, g := range replacing.grants {
			if i, ok := e.model.byUUID[g.uuid]; ok {
				add[i].memMiB -= g.memMiB
				add[i].cores -= g.cores
				add[i].tenants--
			}
		}
	}
	for _, g := range grants {
		i, ok := e.model.byUUID[g.uuid]
		if !ok {
			return fmt.Errorf("node %s has no GPU %s", e.name, g.uuid)
		}
		d := &e.model.devices[i]
		u := &add[i]
		u.memMiB += g.memMiB
		u.cores += g.cores
		u.tenants++
		switch {
		case !d.healthy:
			return fmt.Errorf("GPU %s on node %s is unhealthy", g.uuid, e.name)
		case u.memMiB > d.memoryMiB:
			return fmt.Errorf("GPU %s on node %s: %d MiB granted of %d", g.uuid, e.name, u.memMiB, d.memoryMiB)
		case u.cores > 100:
			return fmt.Errorf("GPU %s on node %s: %d%% cores granted", g.uuid, e.name, u.cores)
		case u.tenants > maxTenants:
			return fmt.Errorf("GPU %s on node %s: %d tenants, limit %d", g.uuid, e.name, u.tenants, maxTenants)
		}
	}
	return nil
}

// Forget drops the record of pod if it is still only assumed (Unreserve). A record
// the informer has confirmed stays: the pod really holds those GPUs.
func (c *Cache) Forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.pods[uid]; r != nil && r.assumed {
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
	out := make([]DeviceUsage, len(e.model.devices))
	for i, d := range e.model.devices {
		u := e.used[i]
		out[i] = DeviceUsage{UUID: d.uuid, Index: d.index, Model: d.model, MemoryMiB: d.memoryMiB, UsedMiB: u.memMiB, Cores: u.cores, Tenants: u.tenants}
	}
	for _, r := range e.pods {
		for _, g := range r.grants {
			if i, ok := e.model.byUUID[g.uuid]; ok {
				out[i].Pods = append(out[i].Pods, r.namespace+"/"+r.name)
			}
		}
	}
	return out, nil
}

// stale reports whether an inventory heartbeat is older than limit (0 disables). An
// inventory without one (zero) is as old as can be.
func stale(heartbeat time.Time, limit time.Duration, now time.Time) (time.Duration, bool) {
	if limit <= 0 {
		return 0, false
	}
	age := now.Sub(heartbeat)
	return age, age > limit
}

// cacheStats is what the cache holds, for the metrics.
type cacheStats struct {
	nodes, gpus, healthy int
	memMiB, grantedMiB   int64
	grantedCores         int
	assumed, bound       int
}

// stats adds the cache's figures to s. It takes each node's read lock in turn.
func (c *Cache) stats(s *cacheStats) {
	c.eachModel(func(m *nodeModel, used []usage) {
		s.nodes++
		s.gpus += len(m.devices)
		s.healthy += m.healthy
		for i := range m.devices {
			s.memMiB += m.devices[i].memoryMiB
			s.grantedMiB += used[i].memMiB
			s.grantedCores += used[i].cores
		}
	})
	c.mu.RLock()
	for _, r := range c.pods {
		if r.assumed {
			s.assumed += len(r.grants)
		} else {
			s.bound += len(r.grants)
		}
	}
	c.mu.RUnlock()
}

// eachModel calls f with the model and usage of every node that has an inventory,
// under the node's read lock: f must not keep used.
func (c *Cache) eachModel(f func(m *nodeModel, used []usage)) {
	c.eachView(func(_ *nodeEntry, v *nodeView, used []usage) { f(v.model, used) })
}

// eachView is eachModel with the node's entry and view.
func (c *Cache) eachView(f func(e *nodeEntry, v *nodeView, used []usage)) {
	c.nodes.each(func(e *nodeEntry) {
		e.mu.RLock()
		if e.model != nil {
			v := nodeView{model: e.model, heartbeat: e.heartbeat, invErr: e.invErr, reqErr: e.reqErr, usageGen: e.usageGen}
			f(e, &v, e.used)
		}
		e.mu.RUnlock()
	})
}

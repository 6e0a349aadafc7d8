// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// PodInfo is a pod's parsed GPU request and selection, computed once in PreFilter.
type PodInfo struct {
	Req api.PodRequest
	// Order is the placement order of req.Containers: most GPUs first, then most
	// memory, so that the hardest container gets first pick.
	Order        []int
	ModelInclude []string // lower-case substrings
	ModelExclude []string
	UUIDInclude  []string
	UUIDExclude  []string
	Topology     api.Topology
	// mps is set for a pod asking for MPS sharing: it may use only GPUs in mps mode,
	// and any other pod only GPUs in time-sliced mode (sharing.go).
	mps bool
	// Device is the GPU-level placer: the profile's, or the pod's by annotation.
	Device Placer
	// CPUMilli and MemBytes are the pod's host requests, when a placer of the pod
	// needs them (its PreparePod sets them: PodHostRequests).
	CPUMilli, MemBytes int64
	// State is the per-pod slot of the pod's placers: what one of them keeps of the
	// pod for the cycle (its PreparePod or HostOnlyPod sets it), opaque to the core.
	// Only one placer of a profile may keep state in it.
	State PodState
}

// Eligible reports whether device d passes the pod's static selection (model, UUID).
// Health is checked separately so that reasons can tell the two apart.
//
// MIG instances are used only by pods that ask for them, by a model include naming
// "MIG" (e.g. "MIG 1g.10gb") or by UUID: a request for "a GPU" must not silently
// get a slice of one.
func (p *PodInfo) Eligible(d *nodemodel.Device) bool {
	if d.MPS != p.mps {
		return false
	}
	if d.MIG && !p.wantsMIG() {
		return false
	}
	if len(p.ModelInclude) > 0 || len(p.ModelExclude) > 0 {
		// Matched against the model in lower case, kept by the node model: lowering
		// it here, for every device of every node a pod with a selection is checked
		// against, was a fifth of a replay's time on a variety with GPU models.
		m := d.ModelLower
		if m == "" {
			m = strings.ToLower(d.Model)
		}
		if len(p.ModelInclude) > 0 && !containsSubstring(m, p.ModelInclude) {
			return false
		}
		if containsSubstring(m, p.ModelExclude) {
			return false
		}
	}
	if len(p.UUIDInclude) > 0 && !containsString(p.UUIDInclude, d.UUID) {
		return false
	}
	if len(p.UUIDExclude) > 0 && containsString(p.UUIDExclude, d.UUID) {
		return false
	}
	return true
}

// EligibleAt is eligible for device i of m. A pod without selection reads only the
// device's MIG flag, from m.Hot.
func (p *PodInfo) EligibleAt(m *nodemodel.Model, i int) bool {
	if !p.hasSelection() {
		return !m.Hot[i].MIG && modeMatches(m, p, i)
	}
	return p.Eligible(&m.Devices[i])
}

// wantsMIG reports whether the pod selects MIG instances explicitly.
func (p *PodInfo) wantsMIG() bool {
	if len(p.UUIDInclude) > 0 {
		return true
	}
	for _, s := range p.ModelInclude {
		if strings.Contains(s, "mig") {
			return true
		}
	}
	return false
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Weights are the scoring knobs taken from the args of TesseraGPUShare and of
// TesseraDynamicResources (the same fields, defaults and ranges in both).
type Weights struct {
	Memory, Cores            float64
	Policy, Topology, Island float64
	MaxTenants               int
}

// The weights' defaults and their upper bound (0 is the lower) in both plugins' args.
const (
	DefaultMemoryWeight   = 1
	DefaultCoresWeight    = 1
	DefaultPolicyWeight   = 1
	DefaultTopologyWeight = 2
	DefaultIslandWeight   = 1
	MaxWeight             = 100
)

// Placement is where one container goes.
type Placement struct {
	Container int   // index into PodInfo.Req.Containers
	Devices   []int // device positions in nodemodel.Model.Devices
	MemMiB    []int64
	Cores     int
}

// Allocation is the outcome of placing a whole pod on a node.
type Allocation struct {
	Placements []Placement
	// topology is the mean pair affinity over multi-GPU containers (1 when none).
	topology float64
	// multiGPU is set when some container got more than one GPU.
	multiGPU bool
	// brokenIslands counts NVLink islands that were entirely free and no longer are.
	brokenIslands, freeIslands int
	// used is the node's usage after the pod is placed.
	used []Usage
	// Model is the node the allocation was made on.
	Model *nodemodel.Model
	// Base is a placer's measure of the node under the usage the pod is placed
	// from, kept across cycles (PodState.KeptMeasure), when there is one: only
	// for pods of one GPU container. Measured is what the GPU-level placer measured
	// of the node while placing such a pod (Placer.PickDevice), for the node-level
	// score to reuse instead of measuring the node again; nil otherwise. Both are
	// opaque to the core and reset with every placement.
	Base, Measured any
	// Scratch is a placer's storage kept with the allocation from placement to
	// placement, never reset by the core: the allocation a node's cache entry keeps
	// is reused every cycle, so a placer that keeps its work space here allocates
	// nothing per placement. A placer finding another's value here replaces it.
	Scratch any

	// Backing storage for the slices above on nodes of up to inlineDevices devices and
	// pods of one GPU container: Filter allocates nothing on such nodes.
	placeBuf [1]Placement
	devBuf   [inlineDevices]int
	memBuf   [inlineDevices]int64
	usedBuf  [inlineDevices]Usage

	// candBuf holds pickDevices' candidates on nodes of up to 16 devices. It lives here
	// rather than on pickDevices' stack because the candidates are passed to a placer,
	// an interface call, through which the compiler cannot see that they do not escape.
	candBuf [16]int // last: the fields above are what Score reads
}

// Used is the node's usage after the pod is placed (the allocation's storage: not
// to be changed).
func (a *Allocation) Used() []Usage { return a.used }

// MultiGPU reports whether some container got more than one GPU.
func (a *Allocation) MultiGPU() bool { return a.multiGPU }

// Locality is the mean pair affinity of the GPUs of multi-GPU containers (1 when
// there are none).
func (a *Allocation) Locality() float64 { return a.topology }

// BrokenIslands is how many NVLink islands were entirely free before the pod and are
// no longer.
func (a *Allocation) BrokenIslands() int { return a.brokenIslands }

// inlineDevices is how many devices an allocation holds without further allocation.
const inlineDevices = 8

// reset makes a an empty allocation holding a copy of used, reusing its storage.
func (a *Allocation) reset(used []Usage) {
	a.Placements = a.placeBuf[:0]
	a.topology, a.multiGPU = 1, false
	a.brokenIslands, a.freeIslands = 0, 0
	a.Model, a.Base, a.Measured = nil, nil, nil
	if len(used) <= inlineDevices {
		a.used = a.usedBuf[:len(used)]
		copy(a.used, used)
	} else {
		a.used = append(a.used[:0:0], used...)
	}
}

// take returns n ints and n int64s from the allocation's inline storage, or new
// slices once it is used up.
func (a *Allocation) take(n int, dev *int) ([]int, []int64) {
	if *dev+n <= inlineDevices {
		d, m := a.devBuf[*dev:*dev+n:*dev+n], a.memBuf[*dev:*dev+n:*dev+n]
		*dev += n
		return d, m
	}
	return make([]int, n), make([]int64, n)
}

// allocFailure explains why a pod does not fit a node.
type allocFailure struct {
	code fwk.Code
	msg  string
}

func (f *allocFailure) Status() *fwk.Status { return fwk.NewStatus(f.code, f.msg) }

// Allocate places every GPU container of p on the node described by m, starting from
// used. It is a pure function of its inputs (used is copied, not modified): Filter,
// Reserve and preemption's AddPod all use it, so they always agree.
func Allocate(m *nodemodel.Model, used []Usage, p *PodInfo, w *Weights) (*Allocation, *allocFailure) {
	a := &Allocation{}
	if fail := allocateInto(a, m, used, p, w, nil, 0); fail != nil {
		return nil, fail
	}
	return a, nil
}

// allocateInto is Allocate writing into a, whose previous contents it replaces; on
// failure a holds no allocation. kept, when not nil, is the cache entry of the node,
// whose usage used is at generation gen (see place).
func allocateInto(a *Allocation, m *nodemodel.Model, used []Usage, p *PodInfo, w *Weights, kept *NodeEntry, gen uint64) *allocFailure {
	ci, fail := place(a, m, used, p, w, kept, gen)
	if fail == tooFew {
		// Explained here rather than where the miss was found, so that the reason's
		// frames do not stack on the placement's (see explain).
		return explain(m, a.used, p, &p.Req.Containers[ci], w, ci != p.Order[0])
	}
	return fail
}

// tooFew is pickDevices' and place's failure when fewer devices than the container
// asks fit it; allocateInto replaces it with explain's reason.
var tooFew = &allocFailure{code: fwk.Unschedulable, msg: "too few GPUs fit the container"}

// place is allocateInto without the reason for a miss: on failure it returns the
// container that did not fit and a.used as that container found it.
//
// kept, when not nil, is the node's cache entry, with before the node's usage at
// generation gen (0: not the cache's usage, a what-if). A one-container pod then
// starts from the measure of the node its placer keeps there (PodState.KeptMeasure,
// in Allocation.Base): the GPU-level placer need not measure the node, nor the
// node-level score. It is asked for with the allocation's copy of before: a stack
// buffer of the caller's passed through the interface would move to the heap.
func place(a *Allocation, m *nodemodel.Model, before []Usage, p *PodInfo, w *Weights, kept *NodeEntry, gen uint64) (int, *allocFailure) {
	// before may live on the caller's stack; placers only ever see the copy in a, so
	// that passing it through an interface does not move before to the heap.
	a.reset(before)
	if len(p.Order) == 1 && kept != nil && gen != 0 && p.State != nil {
		a.Base = p.State.KeptMeasure(kept, gen, m, a.used, w)
	}
	used := a.used
	free := freeIslands(m, used)
	// An island free before placement is broken by it exactly when one of its devices
	// is placed on (placing adds a tenant), so one pass over the islands is enough.
	var touched islandSet
	multi, topoSum, taken := 0, 0.0, 0
	for _, ci := range p.Order {
		c := &p.Req.Containers[ci]
		devs, mem := a.take(c.GPUs, &taken)
		picked, fail := pickDevices(a, m, used, p, c, w, devs)
		if fail != nil {
			return ci, fail
		}
		copy(devs, picked)
		pl := Placement{Container: ci, Devices: devs, Cores: c.Cores, MemMiB: mem}
		for k, i := range devs {
			need := c.MemoryOn(m.Hot[i].MemoryMiB)
			pl.MemMiB[k] = need
			used[i].MemMiB += need
			used[i].Cores += c.Cores
			used[i].Tenants++
			if isl := int(m.Hot[i].Island); isl >= 0 {
				touched.add(isl, len(m.Islands))
			}
		}
		if len(devs) > 1 {
			multi++
			topoSum += m.SetAffinity(devs)
		}
		a.Placements = append(a.Placements, pl)
	}
	if multi > 0 {
		a.topology = topoSum / float64(multi)
		a.multiGPU = true
	}
	a.freeIslands = free.count()
	a.brokenIslands = free.countBoth(&touched)
	a.Model = m
	return -1, nil
}

// islandSet is a set of NVLink islands by position in nodemodel.Model.Islands: a bit mask
// for the first 64, a slice beyond.
type islandSet struct {
	mask uint64
	more []bool
}

// add puts island k of n into the set.
func (s *islandSet) add(k, n int) {
	if k < 64 {
		s.mask |= 1 << uint(k)
		return
	}
	if s.more == nil {
		s.more = make([]bool, n-64)
	}
	s.more[k-64] = true
}

// count is the number of islands in the set.
func (s *islandSet) count() int {
	n := bits.OnesCount64(s.mask)
	for _, in := range s.more {
		if in {
			n++
		}
	}
	return n
}

// countBoth is the number of islands in both s and t.
func (s *islandSet) countBoth(t *islandSet) int {
	n := bits.OnesCount64(s.mask & t.mask)
	for k, in := range s.more {
		if in && k < len(t.more) && t.more[k] {
			n++
		}
	}
	return n
}

// freeIslands reports the NVLink islands whose devices are all unused. It reads the
// devices' island numbers rather than m.Islands: Filter reads the devices anyway, and
// on a busy scheduler each further line of a node's model is a cache miss.
func freeIslands(m *nodemodel.Model, used []Usage) islandSet {
	var s islandSet
	n := len(m.Islands)
	if n > 64 {
		s.more = make([]bool, n-64)
		for k := 64; k < n; k++ {
			s.more[k-64] = true
		}
	}
	// 1<<64 is 0 for a uint64, so 64 islands give all 64 bits.
	s.mask = uint64(1)<<uint(min(n, 64)) - 1
	for i := range m.Hot {
		k := int(m.Hot[i].Island)
		switch {
		case k < 0 || used[i].Tenants == 0:
		case k < 64:
			s.mask &^= 1 << uint(k)
		default:
			s.more[k-64] = false
		}
	}
	return s
}

// Fits reports whether container c fits device i given used. Memory on the device
// below the node's charge for one CUDA context (nodemodel.Model.ContextCharge) never
// fits: none of the container's processes could create a context there.
func Fits(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, maxTenants int) bool {
	d := &m.Hot[i]
	u := &used[i]
	if u.Tenants >= maxTenants || (m.HasMPS && !mpsRoom(m, u, i)) {
		return false
	}
	need := c.MemoryOn(d.MemoryMiB)
	if d.MemoryMiB-u.MemMiB < need || need < m.ContextCharge(i, c.Cores) {
		return false
	}
	if c.Cores > 0 {
		return u.Cores+c.Cores <= 100
	}
	// A container that reserves no compute may only join a GPU whose compute is not
	// all reserved: it would otherwise take time from tenants promised all of it.
	return u.Cores < 100
}

// pickDevices chooses c.GPUs distinct devices for container c, or fails: with tooFew
// when fewer than c.GPUs fit it (allocateInto explains why), or with pickSet's reason.
// The devices are returned in dst's storage when it has room. A one-GPU container's
// device is the GPU-level placer's pick, which may leave what it measured of the node
// in a (Placer.PickDevice).
func pickDevices(a *Allocation, m *nodemodel.Model, used []Usage, p *PodInfo, c *api.ContainerRequest, w *Weights, dst []int) ([]int, *allocFailure) {
	// Candidates live in the allocation for nodes of up to 16 devices: Filter runs
	// this for every node of every GPU pod.
	cand := a.candBuf[:0]
	for i := range m.Hot {
		d := &m.Hot[i]
		// A CUDA process sees at most one MIG device, so MIG instances only serve
		// single-GPU containers.
		if d.MIG && c.GPUs > 1 {
			continue
		}
		if d.Healthy && p.EligibleAt(m, i) && Fits(m, used, c, i, w.MaxTenants) {
			cand = append(cand, i)
		}
	}
	if len(cand) < c.GPUs {
		return nil, tooFew
	}
	if c.GPUs == 1 {
		return append(dst[:0], p.Device.PickDevice(a, m, used, p, c, w, cand)), nil
	}
	return pickSet(m, used, p, c, w, cand, dst)
}

// pickSet chooses a multi-GPU set: every candidate seeds a greedy set that grows by
// the candidate with the best link to the set (then the best policy score); the best
// complete set wins. Required locality restricts which candidates may join.
func pickSet(m *nodemodel.Model, used []Usage, p *PodInfo, c *api.ContainerRequest, w *Weights, cand []int, dst []int) ([]int, *allocFailure) {
	n := c.GPUs
	var setBuf [16]int
	set := setBuf[:0]
	if n > len(setBuf) {
		set = make([]int, 0, n)
	}
	best := dst[:0]
	found := false
	bestScore := -1.0
	for _, seed := range cand {
		if p.Topology == api.TopologyNUMARequired && m.Devices[seed].NUMA < 0 {
			continue
		}
		set = append(set[:0], seed)
		for len(set) < n {
			next, nextScore := -1, -1.0
			for _, i := range cand {
				if containsInt(set, i) || !m.Joinable(p.Topology, set, i) {
					continue
				}
				link := 0.0
				for _, j := range set {
					link += m.Affinity[i][j]
				}
				link /= float64(len(set))
				s := p.Device.DeviceScore(m, used, c, i, w)
				if p.Topology != api.TopologyNone {
					// Link quality dominates; the policy breaks ties.
					s = link*4 + s
				}
				if s > nextScore {
					next, nextScore = i, s
				}
			}
			if next < 0 {
				break
			}
			set = append(set, next)
		}
		if len(set) < n {
			continue
		}
		score := 0.0
		for _, i := range set {
			score += p.Device.DeviceScore(m, used, c, i, w)
		}
		score /= float64(n)
		if p.Topology != api.TopologyNone {
			score += 4 * m.SetAffinity(set)
		}
		if score > bestScore {
			bestScore = score
			best = append(best[:0], set...)
			found = true
		}
	}
	if !found {
		return nil, &allocFailure{code: fwk.Unschedulable, msg: fmt.Sprintf(
			"node(s) had no %d GPUs with room for container %q %s (topology %s)",
			n, c.Name, LocalityWords(p.Topology), p.Topology)}
	}
	sort.Ints(best)
	return best, nil
}

func LocalityWords(t api.Topology) string {
	if t == api.TopologyNUMARequired {
		return "on one NUMA node"
	}
	return "all joined by NVLink"
}

func containsInt(list []int, x int) bool {
	for _, y := range list {
		if y == x {
			return true
		}
	}
	return false
}

// explain builds the closest-miss reason for container c on this node. Misses that
// no eviction could fix are UnschedulableAndUnresolvable so that preemption does not
// consider the node.
//
// A reason a free node's state could change (memory, cores, tenants, locality) names
// only what the container asks, never the node's figures: kube-scheduler's
// FailedScheduling summary counts nodes per distinct reason and the event keeps 1 KiB
// of it, so on a large cluster a figure per node turned the summary into one line per
// free amount, cut off before the reasons that most nodes gave. Reasons about what a
// node is (its models, its largest GPU, its healthy count) group by node kind.
//
// On a busy cluster a quarter of Filter's calls end here, each on a worker goroutine
// the framework started for this pod, whose stack grows (and is copied) when a call
// path is deeper than the stacks goroutines usually need. So explain keeps a small
// frame: it counts, builds the two reasons a full node gives without fmt, and leaves
// the rest to explainRare. allocateInto calls it after the placement's frames are
// gone. later is true when other containers of the pod were placed on the node first.
func explain(m *nodemodel.Model, used []Usage, p *PodInfo, c *api.ContainerRequest, w *Weights, later bool) *allocFailure {
	var k missCounts
	for i := range m.Hot {
		d := &m.Hot[i]
		if !p.EligibleAt(m, i) {
			continue
		}
		k.matching++
		if !d.Healthy {
			continue
		}
		k.healthy++
		need := c.MemoryOn(d.MemoryMiB)
		if d.MemoryMiB > k.largest {
			k.largest = d.MemoryMiB
		}
		if need <= d.MemoryMiB {
			k.bigEnough++
		}
		if need < m.ContextCharge(i, c.Cores) {
			// No room on the device makes up for it: the room below is counted on
			// the devices whose share covers a context only.
			continue
		}
		k.charged++
		u := &used[i]
		if d.MemoryMiB-u.MemMiB >= need {
			k.roomMem++
		}
		if (c.Cores > 0 && u.Cores+c.Cores <= 100) || (c.Cores == 0 && u.Cores < 100) {
			k.roomCores++
		}
		if u.Tenants < w.MaxTenants && (!m.HasMPS || mpsRoom(m, u, i)) {
			k.roomTenants++
		}
	}
	n := c.GPUs
	if k.healthy >= n && k.bigEnough >= n && k.charged >= n {
		switch {
		case k.roomMem < n:
			return &allocFailure{code: fwk.Unschedulable, msg: missReason(c, missMemory, 0, later)}
		case k.roomCores < n && c.Cores > 0:
			return &allocFailure{code: fwk.Unschedulable, msg: missReason(c, missCores, 0, later)}
		}
	}
	return explainRare(&k, m, p, c, w, later)
}

// missCounts is what explain counts over the devices that match the pod's selection.
type missCounts struct {
	matching, healthy, bigEnough    int
	roomMem, roomCores, roomTenants int
	largest                         int64
	// charged counts the healthy matching devices on which the container's memory
	// covers the node's charge for a CUDA context; the room counts are of those.
	charged int
}

// explainRare is explain's reason for every miss but the two common ones, memory and
// cores, which explain has already ruled out when the node has enough healthy GPUs
// large enough.
//
//go:noinline
func explainRare(k *missCounts, m *nodemodel.Model, p *PodInfo, c *api.ContainerRequest, w *Weights, later bool) *allocFailure {
	unresolvable := func(format string, a ...any) *allocFailure {
		return &allocFailure{code: fwk.UnschedulableAndUnresolvable, msg: fmt.Sprintf(format, a...)}
	}
	unschedulable := func(kind missKind, tenants int) *allocFailure {
		return &allocFailure{code: fwk.Unschedulable, msg: missReason(c, kind, tenants, later)}
	}
	n := c.GPUs
	if k.matching == 0 {
		if why := sharingMiss(m, p); why != "" {
			return unresolvable("%s", why)
		}
	}
	switch {
	case k.matching == 0 && p.hasSelection():
		return unresolvable("no GPU on the node matches the pod's GPU selection (node has %s)", m.Summary())
	case k.matching == 0:
		return unresolvable("node has no schedulable GPUs")
	case k.healthy < n && k.matching >= n:
		return unresolvable("container %q asks %s; only %d of the node's %d matching GPUs are healthy", c.Name, GPUs(n), k.healthy, k.matching)
	case k.healthy < n:
		return unresolvable("container %q asks %s; the node has %d that match", c.Name, GPUs(n), k.healthy)
	case k.bigEnough < n:
		return unresolvable("container %q asks %d MiB per GPU; the largest GPU on the node has %d MiB", c.Name, c.MemoryOn(k.largest), k.largest)
	case k.charged < n:
		return &allocFailure{code: fwk.UnschedulableAndUnresolvable, msg: contextChargeReason(k, m, p, c)}
	case k.roomCores < n:
		return unschedulable(missUnreserved, 0)
	case k.roomTenants < n && p.mps:
		return &allocFailure{code: fwk.Unschedulable, msg: mpsTenantsReason(c)}
	case k.roomTenants < n:
		return unschedulable(missTenants, w.MaxTenants)
	default:
		return unschedulable(missTogether, 0)
	}
}

// contextChargeReason is the reason fewer devices than container c asks have its
// memory at or above the node's charge for one CUDA context. It names the charge,
// the node agent's flag that sets it, and the least request that would cover it,
// e.g.
//
//	container "infer" asks 512 MiB per GPU, less than the 576 MiB the node's CUDA
//	hook charges for each process's CUDA context (its node agent's --context-mib),
//	so no process of the container could create one; ask for at least 576 MiB
//
// A percent (or whole-memory) request is judged on the node's largest matching
// GPU, the one that gives it the most MiB.
func contextChargeReason(k *missCounts, m *nodemodel.Model, p *PodInfo, c *api.ContainerRequest) string {
	sharing := api.SharingTimeSliced
	if p.mps {
		sharing = api.SharingMPS
	}
	charge := api.ContextCharge(m.ContextMiB, sharing, c.Cores)
	const tail = "less than the %d MiB the node's CUDA hook charges for %s (its node agent's --context-mib, %d MiB per plain context), " +
		"so no process of the container could create one"
	why := fmt.Sprintf(tail, charge, api.ContextChargeWords(sharing, c.Cores), m.ContextMiB)
	if c.MemoryMiB > 0 {
		return fmt.Sprintf("container %q asks %d MiB per GPU, %s; ask for at least %d MiB (the charge plus what the container allocates)",
			c.Name, c.MemoryMiB, why, charge)
	}
	asks := "all of each GPU's memory"
	if c.MemoryPercent > 0 {
		asks = fmt.Sprintf("%d%% of each GPU's memory", c.MemoryPercent)
	}
	var fewer string
	if k.charged > 0 {
		fewer = fmt.Sprintf("; only %d of the node's GPUs give it enough, it asks %d", k.charged, c.GPUs)
	}
	var fix string
	switch {
	case charge > k.largest:
		fix = "no GPU of the node can hold one context: ask for other GPUs, or check the node agent's --context-mib"
	case k.charged == 0 && c.MemoryPercent > 0:
		// The least percent whose share of the largest GPU (rounded down, as
		// MemoryOn does) covers the charge.
		pct := (charge*100 + k.largest - 1) / k.largest
		fix = fmt.Sprintf("ask for at least %d%% of this GPU's memory, or a gpu-memory of at least %d MiB", pct, charge)
	default:
		fix = fmt.Sprintf("ask for a gpu-memory of at least %d MiB", charge)
	}
	return fmt.Sprintf("container %q asks %s, %d MiB on the node's largest GPU (%d MiB), %s%s; %s",
		c.Name, asks, c.MemoryOn(k.largest), k.largest, why, fewer, fix)
}

// missKind is what a node lacks for a container, in missReason's words.
type missKind uint8

const (
	missMemory     missKind = iota // free memory
	missCores                      // free reserved cores
	missUnreserved                 // compute not reserved by others (for a container reserving none)
	missTenants                    // a tenant slot under maxTenantsPerGPU
	missTogether                   // memory, cores and a tenant slot on one GPU at once
)

// missReason is the reason a node has fewer GPUs than container c asks with room of
// kind for it, in the words of the request, e.g.
//
//	node(s) had no GPU with 4096 MiB free for container "train"
//	node(s) had fewer than 4 GPUs with 30% of their cores free for container "c"
//
// It is built without fmt: on a busy cluster most nodes Filter rejects are full, and
// fmt's boxing of the arguments made the memory reason a fifth of Filter's time.
func missReason(c *api.ContainerRequest, kind missKind, tenants int, later bool) string {
	b := make([]byte, 0, 112)
	b = append(b, "node(s) had "...)
	one := c.GPUs == 1
	if one {
		b = append(b, "no GPU"...)
	} else {
		b = append(b, "fewer than "...)
		b = strconv.AppendInt(b, int64(c.GPUs), 10)
		b = append(b, " GPUs"...)
	}
	its := " of their "
	if one {
		its = " of its "
	}
	switch kind {
	case missMemory:
		b = append(b, " with "...)
		switch {
		case c.WholeMemory():
			b = append(b, "all"...)
			b = append(b, its[3:]...)
			b = append(b, "memory"...)
		case c.MemoryPercent > 0:
			b = strconv.AppendInt(b, int64(c.MemoryPercent), 10)
			b = append(b, '%')
			b = append(b, its...)
			b = append(b, "memory"...)
		default:
			b = strconv.AppendInt(b, c.MemoryMiB, 10)
			b = append(b, " MiB"...)
		}
		b = append(b, " free"...)
	case missCores:
		b = append(b, " with "...)
		b = strconv.AppendInt(b, int64(c.Cores), 10)
		b = append(b, '%')
		b = append(b, its...)
		b = append(b, "cores free"...)
	case missUnreserved:
		b = append(b, " with cores not reserved by others"...)
	case missTenants:
		b = append(b, " under the limit of "...)
		b = strconv.AppendInt(b, int64(tenants), 10)
		b = append(b, " containers per GPU"...)
	case missTogether:
		b = append(b, " with room for all it asks at once ("...)
		b = append(b, c.String()...)
		b = append(b, ')')
	}
	b = append(b, " for container "...)
	b = strconv.AppendQuote(b, c.Name)
	if kind == missUnreserved {
		b = append(b, ", which reserves no cores"...)
	}
	if later {
		b = append(b, " beside the pod's other containers"...)
	}
	return string(b)
}

// gpus is "1 GPU" or "n GPUs".
func GPUs(n int) string {
	if n == 1 {
		return "1 GPU"
	}
	return fmt.Sprintf("%d GPUs", n)
}

// WholeGPUsOnly reports whether the pod asks only for whole GPUs (all of each one's
// memory and compute), without a model or UUID selection, a required locality or MPS:
// a request a DeviceClass's extended resource can serve on a node in DRA mode, where
// the in-tree DRA plugin allocates it devices of that class (KEP-5004).
func (p *PodInfo) WholeGPUsOnly() bool {
	if p.mps || p.hasSelection() || p.Topology == api.TopologyNVLinkRequired || p.Topology == api.TopologyNUMARequired {
		return false
	}
	for _, c := range p.Req.Containers {
		if !c.WholeMemory() || (c.Cores != 0 && c.Cores != 100) {
			return false
		}
	}
	return true
}

func (p *PodInfo) hasSelection() bool {
	return len(p.ModelInclude)+len(p.ModelExclude)+len(p.UUIDInclude)+len(p.UUIDExclude) > 0
}

// containsSubstring reports whether s contains any of subs.
func containsSubstring(s string, subs []string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

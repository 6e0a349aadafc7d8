// SPDX-License-Identifier: Apache-2.0

// Package fragmentation is the Fragmentation placement policy. It places a pod where it makes the least GPU capacity unusable
// for the pods that are likely to come next: fragmentation gradient descent (Weng et
// al., "Beware of Fragmentation", USENIX ATC'23), measured on Tessera's GPU model
// (memory and cores per GPU, model selection, CPU and host memory of the node).
//
// The fragmentation of a node for one pod shape is the free GPU capacity that shape
// cannot use: all of it when the shape does not fit the node at all (too few GPUs with
// room, too little CPU or host memory), otherwise the free capacity of the GPUs it does
// not fit on. The node's fragmentation is the mean over the expected workload, and a
// placement is scored by how much it increases that (less is better), plus how much it
// increases the GPU capacity the node's free CPU and memory can no longer feed at the
// workload's ratio (see feedRatio.unfed).
//
// The expected workload is learned: the shapes of the last fragmentationWindow GPU pods
// this plugin saw in PreFilter, most frequent first. Nothing needs to be configured, and
// the policy follows the cluster's mix as it changes.
//
// The package holds the workload model and its snapshots (fragmentation.go), the
// per-class statistics of a node and their updates (fragmentation.go), the index of
// which classes fit a GPU (fitindex.go) and model pressure (pressure.go). What it keeps
// lives in the core's opaque slots (package placement): per pod its podState, per
// node across cycles its fragMemo, per placement its nodeMeasure and scratch.
package fragmentation

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// maxFragShapes bounds the shapes a placement is evaluated against: the cost of scoring
// a node grows with it, and the long tail of rare shapes hardly moves the mean (up to
// as many again are added so that every GPU request size is represented).
const maxFragShapes = 32

// maxSnapshotShapes bounds a snapshot's shapes, and so its classes: the most frequent
// maxFragShapes and as many again for the GPU requests they miss.
const maxSnapshotShapes = 2 * maxFragShapes

// DefaultWindow is how many recent GPU pods make up the expected workload.
const DefaultWindow = 2000

// placer is the Fragmentation policy's placer. Its workload model is the
// plugin's: the node-level and the GPU-level use of the policy learn from, and place
// for, the same pods.
type placer struct {
	workload *WorkloadModel
}

var _ placement.Placer = &placer{}

// Name is the policy's name in args, annotations and metrics.
const Name placement.Policy = "Fragmentation"

// Registration registers the policy: its placer learns from the last env.Window GPU
// pods, and measures model pressure on env.Cache.
var Registration = placement.Registration{Policy: Name, New: func(env *placement.Env) placement.Placer {
	wl := NewWorkloadModel(env.Window)
	wl.Bind(env.Cache, env.Weights)
	return &placer{workload: wl}
}}

func (*placer) Policy() placement.Policy { return Name }

// podState is what the policy keeps of a pod for the cycle (PodInfo.State).
type podState struct {
	// wl is the expected workload when the pod was prepared.
	wl *fragWorkload
	// feed is wl's workloadFeed for the GPU size last asked for: the same for every
	// node with GPUs of that size, so Score computes it once per cycle on a cluster
	// of one GPU size (podState.workloadFeed). Read and replaced by the parallel
	// Score without a lock.
	feed atomic.Pointer[feedMemo]
	// pressure is the workload's model pressure when the pod was prepared (nil:
	// none), which placements are charged with (pressure.go).
	pressure *modelPressure
}

// stateOf is the policy's state of the pod, or nil when the policy did not prepare it.
func stateOf(p *placement.PodInfo) *podState {
	if p == nil {
		return nil
	}
	s, _ := p.State.(*podState)
	return s
}

// workloadOf is the expected workload the pod was prepared with (nil: none).
func workloadOf(p *placement.PodInfo) *fragWorkload {
	if s := stateOf(p); s != nil {
		return s.wl
	}
	return nil
}

// PreparePod counts the pod's shape into the workload and gives the cycle the
// workload as it is now. The node-level and GPU-level placers are one value when
// both are Fragmentation, and then PreFilter calls this once.
func (f *placer) PreparePod(pod *v1.Pod, info *placement.PodInfo) {
	info.CPUMilli, info.MemBytes = placement.PodHostRequests(pod)
	f.workload.observe(pod.UID, shapeOf(info))
	info.State = &podState{wl: f.workload.Snapshot(), pressure: f.workload.PressureNow()}
}

// DeviceScore is Binpack's: the policy only differs for one-GPU containers
// (PickDevice).
func (*placer) DeviceScore(m *nodemodel.Model, used []placement.Usage, c *api.ContainerRequest, i int, w *placement.Weights) float64 {
	return placement.PackScore(m, used, c, i, w)
}

// scratch is what the policy keeps with an allocation (Allocation.Scratch): the
// pick's measure of the node (Allocation.Measured points to it) and the node-level
// score's measure of the node after the pod (Stats.placedInto), whose slices are
// reused from cycle to cycle with the allocation a node's cache entry keeps.
type scratch struct {
	measured nodeMeasure
	after    Stats
}

// scratchOf is the policy's scratch in a, made when a has none.
func scratchOf(a *placement.Allocation) *scratch {
	s, ok := a.Scratch.(*scratch)
	if !ok {
		s = &scratch{}
		a.Scratch = s
	}
	return s
}

// nodeMeasure is what PickDevice measured of a node while picking a device, kept
// with the allocation (Allocation.Measured) so that the node-level score need not
// measure the node again.
type nodeMeasure struct {
	// base is the node's statistics before the pod.
	base *Stats
	// before and after are the node's fragmentation before and after the pick, and
	// afterTotal its free GPU capacity after, with no shape held back by host
	// resources (Stats.Value(wl, nil)): what the node-level score computes when
	// the node's CPU and memory hold back none.
	before, after, afterTotal float64
}

// PickDevice takes the device whose use adds the least fragmentation
// (pickByFragmentation), and for a pod of one GPU container leaves its measure of the
// node in a.Measured for the node-level score. A measure already in a.Base (the
// cache's, see KeptMeasure) is the node under used and is not taken again. Without a
// learned workload it places as Binpack.
func (*placer) PickDevice(a *placement.Allocation, m *nodemodel.Model, used []placement.Usage, p *placement.PodInfo, c *api.ContainerRequest, w *placement.Weights, cand []int) int {
	wl := workloadOf(p)
	if wl.Empty() {
		return placement.PickBest(m, used, c, w, cand, placement.PackScore)
	}
	base, _ := a.Base.(*Stats)
	i, ms := pickByFragmentation(m, used, wl, c, w, cand, base)
	if len(p.Order) == 1 && ms.base != nil {
		sc := scratchOf(a)
		sc.measured = ms
		a.Measured = &sc.measured
	}
	return i
}

// HostOnlyPod is the workload a pod without GPUs is scored against (see
// ScoreHostOnly), or nil while no GPU pod has been seen: then nothing can be stranded.
func (f *placer) HostOnlyPod(pod *v1.Pod) *placement.PodInfo {
	wl := f.workload.Snapshot()
	if wl.Empty() {
		return nil
	}
	h := &placement.PodInfo{State: &podState{wl: wl}}
	h.CPUMilli, h.MemBytes = placement.PodHostRequests(pod)
	return h
}

// NeedsFit: best fit breaks ties between placements that fragment alike.
func (*placer) NeedsFit() bool { return true }

// ScoreExtensions: Fragmentation's scores are raw and normalised per cycle.
func (f *placer) ScoreExtensions() fwk.ScoreExtensions { return f }

// fragShape is one kind of pod of the expected workload: a GPU request (its class)
// with host requests. Its weight in a workload is the workload's (fragWorkload.terms):
// shapes are shared by the snapshots of a model while only their weights change.
type fragShape struct {
	Class
	cpuMilli int64
	memBytes int64
	key      string
	// class is the position of the shape's GPU request in its workload's classes.
	class int
}

// Class is a GPU request of the expected workload: the pod's most demanding GPU
// container and its model selection, all that decides which GPUs a shape fits. Shapes
// that differ only in CPU and memory share one class, and a node's fit statistics are
// kept per class: the openb trace's ~43 learned shapes are ~21 classes, and the set of
// classes changes far less often than the set of shapes (a new host request size is a
// new shape; a new GPU request size is rare).
type Class struct {
	C            api.ContainerRequest
	modelInclude []string
	modelExclude []string
	// gpu is the class's key (GPUKey).
	gpu string
}

// EligibleAt reports whether device i of m passes the class's model selection. A class
// without one reads only the device's MIG flag (as PodInfo.EligibleAt): this check
// runs classes × devices times per node, and building the selection for it was half
// of Fragmentation's Filter+Score.
func (s *Class) EligibleAt(m *nodemodel.Model, i int) bool {
	if len(s.modelInclude) == 0 && len(s.modelExclude) == 0 {
		return !m.Hot[i].MIG
	}
	p := placement.PodInfo{ModelInclude: s.modelInclude, ModelExclude: s.modelExclude}
	return p.Eligible(&m.Devices[i])
}

// shapeOf is the fragmentation shape of a parsed pod.
func shapeOf(info *placement.PodInfo) fragShape {
	c := info.Req.Containers[info.Order[0]]
	c.Name, c.Init = "", false
	s := fragShape{Class: Class{C: c, modelInclude: info.ModelInclude, modelExclude: info.ModelExclude},
		cpuMilli: info.CPUMilli, memBytes: info.MemBytes}
	// Rounding keeps near-identical pods in one bucket: 100 millicores, 256 MiB.
	cpu := (s.cpuMilli + 50) / 100 * 100
	mem := (s.memBytes + 128<<20) >> 28 << 28
	s.gpu = s.classKey()
	s.key = fmt.Sprintf("%s|%d|%d", s.gpu, cpu, mem)
	return s
}

// classKey is the key of the class's GPU request and model selection.
func (s *Class) classKey() string {
	c := &s.C
	return fmt.Sprintf("%d/%d/%d/%d|%s|%s", c.GPUs, c.MemoryMiB, c.MemoryPercent, c.Cores,
		strings.Join(s.modelInclude, ","), strings.Join(s.modelExclude, ","))
}

// GPUKey identifies the shape's GPU request, whatever its CPU and memory: its class.
func (s *fragShape) gpuKey() string { return s.gpu }

// fragWorkload is a snapshot of the expected workload: the shapes, most frequent
// first, with weights summing to 1 (terms), and their GPU requests. Never modified
// once built, so cycles may keep it; snapshots of a model may share shapes.
type fragWorkload struct {
	shapes []fragShape
	// classes are the shapes' distinct GPU requests, ordered by key: the same list
	// for the same requests, whatever the shapes' order and weights.
	classes []Class
	// gen identifies classes for the measures the cache keeps per node (fragMemo):
	// it changes only when a GPU request joins or leaves the workload. The numbers come
	// from one counter for every workload model, so that the measures of two profiles
	// sharing the cache never pass for each other's. 0 for a workload not from a
	// model (tests): never kept.
	gen uint64
	// fit indexes classes by what they need of a GPU (nil beyond 64 classes).
	fit *fitIndexes
	// MaxCPUMilli and MaxMemBytes are the largest host requests of the shapes: a
	// node with that much CPU and memory free holds back none of them.
	MaxCPUMilli, MaxMemBytes int64
	// terms are each shape's weight and what the fragmentation sums read of it, in
	// the shapes' order, packed (a fragShape spans three cache lines; these, four to
	// one).
	terms []fragTerm
	// classTerms are terms summed per class, in the classes' order: a shape's term
	// depends on its class alone unless host resources hold it back, so the sums
	// that see no host limit (Value with nil, fragAfter) run over the classes, about
	// half as many as the shapes on the openb trace.
	classTerms []fragTerm
}

// setTerms fills wl.terms and wl.classTerms from wl.shapes, their weights (in the
// shapes' order) and wl.classes.
func (wl *fragWorkload) setTerms(weights []float64) {
	wl.terms, wl.classTerms = make([]fragTerm, len(wl.shapes)), make([]fragTerm, len(wl.classes))
	for k := range wl.classes {
		wl.classTerms[k] = fragTerm{class: int32(k), gpus: int32(wl.classes[k].C.GPUs)}
	}
	for k := range wl.shapes {
		s := &wl.shapes[k]
		wl.terms[k] = fragTerm{weight: weights[k], class: int32(s.class), gpus: int32(s.C.GPUs)}
		wl.classTerms[s.class].weight += weights[k]
	}
}

// fragTerm is a shape's term of the node's fragmentation: its weight, its class, and
// the GPUs the class must fit.
type fragTerm struct {
	weight float64
	class  int32
	gpus   int32
}

// fitsAt reports whether class k fits device i of m under used; mask is the fit
// index's answer for the device (fitMask), read when there is an index.
func (wl *fragWorkload) fitsAt(mask uint64, m *nodemodel.Model, used []placement.Usage, k, i int, w *placement.Weights) bool {
	if wl.fit != nil {
		return mask>>uint(k)&1 != 0
	}
	return ShapeFits(m, used, &wl.classes[k], i, w)
}

// EligibleAt reports whether class k's model selection admits device i of m; mask is
// the fit index's answer for the device (eligibleMask), read when there is an index.
func (wl *fragWorkload) eligibleAt(mask uint64, m *nodemodel.Model, k, i int) bool {
	if wl.fit != nil {
		return mask>>uint(k)&1 != 0
	}
	return wl.classes[k].EligibleAt(m, i)
}

// eligibleMask is the fit index's set of classes that device i admits (0 without
// an index).
func (wl *fragWorkload) eligibleMask(m *nodemodel.Model, i int) uint64 {
	if wl.fit == nil {
		return 0
	}
	return wl.fit.eligibleMask(m, i)
}

// fitMask is the fit index's set of classes that fit device i (0 without an index).
func (wl *fragWorkload) fitMask(m *nodemodel.Model, used []placement.Usage, i int, w *placement.Weights) uint64 {
	if wl.fit == nil {
		return 0
	}
	return wl.fit.fitMask(m, used, i, w)
}

// noWorkload is the workload of nothing learned.
var noWorkload = &fragWorkload{}

// Empty reports whether no workload has been learned (wl may be nil).
func (wl *fragWorkload) Empty() bool { return wl == nil || len(wl.shapes) == 0 }

// newFragWorkload builds the workload of shapes with weights (in the shapes' order),
// numbering their classes (and keying those not yet keyed), with generation 0.
func newFragWorkload(shapes []fragShape, weights []float64) *fragWorkload {
	wl := buildFragWorkload(shapes, weights)
	wl.fit = newFitIndexes(wl.classes)
	return wl
}

// buildFragWorkload is newFragWorkload without the fit index.
func buildFragWorkload(shapes []fragShape, weights []float64) *fragWorkload {
	wl := &fragWorkload{shapes: shapes}
	keys := make([]string, 0, len(shapes))
	for k := range shapes {
		wl.MaxCPUMilli, wl.MaxMemBytes = max(wl.MaxCPUMilli, shapes[k].cpuMilli), max(wl.MaxMemBytes, shapes[k].memBytes)
		if shapes[k].gpu == "" {
			shapes[k].gpu = shapes[k].classKey()
		}
		keys = append(keys, shapes[k].gpu)
	}
	sort.Strings(keys)
	keys = slices.Compact(keys)
	wl.classes = make([]Class, len(keys))
	for k := range shapes {
		x, _ := slices.BinarySearch(keys, shapes[k].gpu)
		shapes[k].class = x
		wl.classes[x] = shapes[k].Class
	}
	wl.setTerms(weights)
	return wl
}

// sameClasses reports whether a and b have the same classes.
func sameClasses(a, b *fragWorkload) bool {
	return slices.EqualFunc(a.classes, b.classes, func(x, y Class) bool { return x.gpu == y.gpu })
}

// WorkloadModel is the recent mix of GPU pod shapes, shared by the plugin's cycles.
type WorkloadModel struct {
	mu     sync.Mutex
	window int
	ring   []ringEntry
	next   int
	byUID  map[types.UID]bool
	counts map[string]*shapeCount
	// order holds counts' entries, most frequent first (then by key), kept sorted as
	// counts change by one: a snapshot per cycle sorted them all (hundreds of shapes
	// on the openb trace; 50 us a pod in B2's profile at 1,000 nodes).
	order []*shapeCount
	// gpus numbers the GPU requests (GPUKey) of counts' entries, so that a snapshot
	// tells them apart by index; gpuFree lists numbers no longer in use.
	gpus    map[string]*gpuCount
	gpuFree []int
	last    *fragWorkload // cached result of snapshot; rebuilt when dirty
	// lastKept are the entries last's shapes were taken from, in its order.
	lastKept []*shapeCount
	seen     []bool    // snapshot's scratch, by GPU request number
	shares   []float64 // snapshot's scratch, the kept shapes' weights
	dirty    bool

	// Model pressure (pressure.go): the cluster and weights it is measured with
	// (bind), how many pods of the window have a model selection, and the pressure
	// last computed with how many pods were observed since and how many the window
	// held then.
	cluster     *placement.Cache
	weights     *placement.Weights
	selective   int
	pressure    *modelPressure
	pressureAge int
	pressureLen int
}

// gpuCount is a GPU request's number and how many of counts' entries have it.
type gpuCount struct {
	id, shapes int
}

// fragGens numbers the workloads' sets of classes (fragWorkload.gen).
var fragGens atomic.Uint64

type ringEntry struct {
	uid       types.UID
	key       string
	selective bool
}

type shapeCount struct {
	shape fragShape
	n     int
	pos   int // in WorkloadModel.order
	gpu   int // the number of its GPU request (WorkloadModel.gpus)
}

// before reports whether a comes before b in WorkloadModel.order.
func (a *shapeCount) before(b *shapeCount) bool {
	if a.n != b.n {
		return a.n > b.n
	}
	return a.shape.key < b.shape.key
}

// reorder moves c to its place in w.order after its count changed by one: found by
// binary search among the entries it may pass (the rest of the order is sorted),
// those shifted by one.
func (w *WorkloadModel) reorder(c *shapeCount) {
	o, from := w.order, c.pos
	to := from
	if from > 0 && c.before(o[from-1]) {
		to = sort.Search(from, func(j int) bool { return c.before(o[j]) })
		copy(o[to+1:from+1], o[to:from])
	} else if from < len(o)-1 && o[from+1].before(c) {
		to = from + 1 + sort.Search(len(o)-from-1, func(j int) bool { return !o[from+1+j].before(c) }) - 1
		copy(o[from:to], o[from+1:to+1])
	}
	o[to] = c
	for j := min(from, to); j <= max(from, to); j++ {
		o[j].pos = j
	}
}

// gpuOf numbers the GPU request of a new entry of counts.
func (w *WorkloadModel) gpuOf(key string) int {
	g := w.gpus[key]
	if g == nil {
		g = &gpuCount{id: len(w.gpus)}
		if n := len(w.gpuFree); n > 0 {
			g.id, w.gpuFree = w.gpuFree[n-1], w.gpuFree[:n-1]
		}
		w.gpus[key] = g
	}
	g.shapes++
	return g.id
}

// dropGPU forgets an entry of counts with the GPU request key.
func (w *WorkloadModel) dropGPU(key string) {
	if g := w.gpus[key]; g != nil {
		if g.shapes--; g.shapes == 0 {
			delete(w.gpus, key)
			w.gpuFree = append(w.gpuFree, g.id)
		}
	}
}

func NewWorkloadModel(window int) *WorkloadModel {
	return &WorkloadModel{window: window, byUID: map[types.UID]bool{}, counts: map[string]*shapeCount{}, gpus: map[string]*gpuCount{},
		pressureAge: pressureEvery}
}

// observe records a pod's shape once (a retried pod is not counted again while it is
// in the window).
func (w *WorkloadModel) observe(uid types.UID, s fragShape) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byUID[uid] {
		return
	}
	if len(w.ring) < w.window {
		w.ring = append(w.ring, ringEntry{})
	} else {
		old := w.ring[w.next]
		delete(w.byUID, old.uid)
		if old.selective {
			w.selective--
		}
		if c := w.counts[old.key]; c != nil {
			c.n--
			w.reorder(c)
			if c.n == 0 {
				// The only entry without pods, so the last.
				delete(w.counts, old.key)
				w.order = w.order[:len(w.order)-1]
				w.dropGPU(c.shape.gpu)
			}
		}
	}
	w.ring[w.next] = ringEntry{uid: uid, key: s.key, selective: s.hasSelection()}
	if s.hasSelection() {
		w.selective++
	}
	w.pressureAge++
	w.next = (w.next + 1) % w.window
	w.byUID[uid] = true
	c := w.counts[s.key]
	if c != nil {
		c.n++
	} else {
		c = &shapeCount{shape: s, n: 1, pos: len(w.order), gpu: w.gpuOf(s.gpu)}
		w.counts[s.key] = c
		w.order = append(w.order, c)
	}
	w.reorder(c)
	w.dirty = true
}

// Snapshot returns the most frequent shapes with weights summing to 1, and their
// classes (never nil).
func (w *WorkloadModel) Snapshot() *fragWorkload {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.dirty && w.last != nil {
		return w.last
	}
	// The most frequent shapes, plus the most frequent of every GPU request the top
	// ones miss: rare big pods (a whole 8-GPU node) must still be kept room for.
	all := make([]*shapeCount, 0, min(len(w.order), maxSnapshotShapes))
	if len(w.order) <= maxFragShapes {
		all = append(all, w.order...)
	} else {
		w.seen = append(w.seen[:0], make([]bool, len(w.gpus)+len(w.gpuFree))...)
		for i, c := range w.order {
			if i < maxFragShapes || (!w.seen[c.gpu] && len(all) < maxSnapshotShapes) {
				all = append(all, c)
				w.seen[c.gpu] = true
			}
		}
	}
	total := 0
	for _, c := range all {
		total += c.n
	}
	weights := w.shares[:0]
	for _, c := range all {
		weights = append(weights, float64(c.n)/float64(total))
	}
	w.shares = weights
	var wl *fragWorkload
	if w.last != nil && w.last.gen != 0 && slices.Equal(all, w.lastKept) {
		// The same shapes in the same order, other weights: the shapes, their
		// classes and indexes carry over (shared, not copied: most pods change
		// only the weights), and only the terms are new.
		prev := *w.last
		wl = &prev
		wl.setTerms(weights)
	} else {
		out := make([]fragShape, len(all))
		for i, c := range all {
			out[i] = c.shape
		}
		wl = buildFragWorkload(out, weights)
		if w.last != nil && w.last.gen != 0 && sameClasses(w.last, wl) {
			// The same classes in the same order (by key): their indexes carry over.
			wl.gen, wl.fit = w.last.gen, w.last.fit
		} else {
			wl.gen, wl.fit = fragGens.Add(1), newFitIndexes(wl.classes)
		}
	}
	w.last, w.lastKept, w.dirty = wl, all, false
	return wl
}

// Stats is a node's fragmentation statistics per class of the expected workload
// (Class), kept in parts so that the effect of changing one device can be
// computed without rescanning the node. A shape's fragmentation is its class's.
//
// A class is measured on the devices its model selection admits (eligible): a pod
// that requires a T4 strands nothing on a node of other GPUs, whatever is free there,
// and that node's fragmentation does not count it. Where no device of the node is
// eligible the class adds nothing to the node's fragmentation; keeping the GPU models
// that constrained pods need free for them is the separate model pressure term
// (modelPressure).
type Stats struct {
	// The fields come in the order the fragmentation sums read them (Value,
	// fragAfter), mask and emask last: a node's kept measure is a memory miss per
	// cache line on a large cluster.
	total float64
	// term is per class what it strands on the node, the sum Value weighs: 0 where
	// no device is eligible, elig where it fits on fewer devices than it needs,
	// else small.
	term []float64
	// low marks the classes (bit k, classes < 64) that fit on fewer devices than
	// they need: their term is elig, which changes with any eligible device's use.
	low uint64
	// classFits and classElig are per device the classes that fit it and that it
	// admits (bit k for class k), when the workload has a fit index (at most 64
	// classes).
	classFits, classElig []uint64
	free                 []float64 // per device, free share of the GPU (0..1), 0 if unhealthy
	// cls is per class its statistics (classStat), together: a placement that changes
	// a class's term reads them all.
	cls   []classStat
	mask  []uint64 // per class, bit i set when it fits device i (devices < 64)
	emask []uint64 // per class, its eligible devices (bit i, devices < 64)
}

// classStat is a class's statistics on a node: on how many devices it fits, the free
// share of the eligible devices it does not fit on (small) and of all its eligible
// devices (elig), and how many devices are eligible: eligibility depends on the
// node's devices only, never on their usage.
type classStat struct {
	small, elig    float64
	fits, eligible int32
}

func ShapeFits(m *nodemodel.Model, used []placement.Usage, s *Class, i int, w *placement.Weights) bool {
	return m.Hot[i].Healthy && s.EligibleAt(m, i) && placement.Fits(m, used, &s.C, i, w.MaxTenants)
}

func newFragStats(m *nodemodel.Model, used []placement.Usage, wl *fragWorkload, w *placement.Weights) *Stats {
	st := &Stats{}
	st.measure(m, used, wl, w)
	return st
}

// measure sets st to the statistics of the node under used. All its figures share
// one array, in the order the fragmentation sums read them: the terms (all of them,
// for every node), the device's class masks and free share (for each device rated),
// each class's statistics together (for the classes a placement changes), then mask
// and emask (placedInto, and nodes without a fit index). A node's measure is read for
// every node of every cycle, and on a large cluster each separate object, and each
// further cache line, is one more memory miss.
func (st *Stats) measure(m *nodemodel.Model, used []placement.Usage, wl *fragWorkload, w *placement.Weights) {
	n, classes := len(m.Devices), wl.classes
	k := len(classes)
	words := make([]uint64, 3*n+6*k)
	*st = Stats{term: float64s(words[:k:k]), free: float64s(words[k+2*n : k+3*n : k+3*n]),
		cls: classStats(words[k+3*n : 4*k+3*n : 4*k+3*n]), mask: words[4*k+3*n : 5*k+3*n : 5*k+3*n], emask: words[5*k+3*n:]}
	if wl.fit != nil {
		st.classFits, st.classElig = words[k:k+n:k+n], words[k+n:k+2*n:k+2*n]
	}
	for i := 0; i < n; i++ {
		st.free[i] = placement.DeviceFree(m, used, i, w)
		st.total += st.free[i]
	}
	// Device by device: each class's sums still run in device order.
	for i := 0; i < n; i++ {
		em, fm := wl.eligibleMask(m, i), wl.fitMask(m, used, i, w)
		if st.classFits != nil {
			st.classFits[i], st.classElig[i] = fm, em
		}
		for k := range classes {
			if !wl.eligibleAt(em, m, k, i) {
				continue
			}
			st.cls[k].eligible++
			st.cls[k].elig += st.free[i]
			if i < 64 {
				st.emask[k] |= 1 << uint(i)
			}
			if wl.fitsAt(fm, m, used, k, i, w) {
				st.cls[k].fits++
				if i < 64 {
					st.mask[k] |= 1 << uint(i)
				}
			} else {
				st.cls[k].small += st.free[i]
			}
		}
	}
	for k := range classes {
		st.setTerm(wl, k)
	}
}

// setTerm sets class k's term and low bit from its statistics.
func (st *Stats) setTerm(wl *fragWorkload, k int) {
	lowBit := uint64(0)
	if k < 64 {
		lowBit = 1 << uint(k)
	}
	switch {
	case st.cls[k].eligible == 0:
		st.term[k], st.low = 0, st.low&^lowBit
	case st.cls[k].fits < int32(wl.classes[k].C.GPUs):
		st.term[k], st.low = st.cls[k].elig, st.low|lowBit
	default:
		st.term[k], st.low = st.cls[k].small, st.low&^lowBit
	}
}

// placed returns the stats after placements ps (whose usage after is used), for st
// measured before them: only the devices ps place on change, so only they are measured again (a node's stats cost
// classes × devices fits checks; Score needs them before and after every placement).
// Nodes of more than 64 devices are measured in full.
func (st *Stats) placed(m *nodemodel.Model, ps []placement.Placement, used []placement.Usage, wl *fragWorkload, w *placement.Weights) *Stats {
	return st.placedInto(&Stats{}, m, ps, used, wl, w)
}

// placedInto is placed writing into out, whose slices it reuses: Score keeps one in
// each node's allocation (scratch.after), so that it allocates nothing per node.
func (st *Stats) placedInto(out *Stats, m *nodemodel.Model, ps []placement.Placement, used []placement.Usage, wl *fragWorkload, w *placement.Weights) *Stats {
	if len(m.Devices) > 64 {
		return newFragStats(m, used, wl, w)
	}
	classes := wl.classes
	out.free, out.total = append(out.free[:0], st.free...), st.total
	out.cls = append(out.cls[:0], st.cls...)
	out.mask = append(out.mask[:0], st.mask...)
	out.term, out.low = append(out.term[:0], st.term...), st.low
	out.classFits = append(out.classFits[:0], st.classFits...)
	if st.classFits == nil {
		out.classFits = nil
	}
	// Eligibility does not depend on usage: out shares st's, which neither changes.
	out.emask, out.classElig = st.emask, st.classElig
	var done uint64
	for _, p := range ps {
		for _, i := range p.Devices {
			bit := uint64(1) << uint(i)
			if done&bit != 0 {
				continue
			}
			done |= bit
			was, now := st.free[i], placement.DeviceFree(m, used, i, w)
			out.free[i] = now
			out.total += now - was
			fm := wl.fitMask(m, used, i, w)
			if out.classFits != nil {
				out.classFits[i] = fm
			}
			for k := range classes {
				if st.emask[k]&bit == 0 {
					continue // the class cannot use device i, before or after
				}
				out.cls[k].elig += now - was
				if st.mask[k]&bit != 0 {
					out.cls[k].fits--
				} else {
					out.cls[k].small -= was
				}
				if wl.fitsAt(fm, m, used, k, i, w) {
					out.cls[k].fits++
					out.mask[k] |= bit
				} else {
					out.cls[k].small += now
					out.mask[k] &^= bit
				}
				out.setTerm(wl, k)
			}
		}
	}
	return out
}

// Value is the node's fragmentation in GPUs: per shape that may use the node's GPUs,
// weighted by its share of the workload, the free capacity of its eligible devices it
// cannot use. hostFits[k] reports whether shape k fits the node's free CPU and host
// memory (nil: all do).
//
// Without hostFits it is the weighted sum of the classes' terms, in the classes' order:
// fragAfter and placedValue sum the same terms in the same order, so that what they
// give for a placement is what measuring it again gives, to the bit.
func (st *Stats) Value(wl *fragWorkload, hostFits []bool) float64 {
	var f float64
	if hostFits == nil {
		for k, t := range wl.classTerms {
			f += t.weight * st.term[k]
		}
		return f
	}
	for k, t := range wl.terms {
		switch {
		case st.cls[t.class].eligible == 0:
		case !hostFits[k] || st.cls[t.class].fits < t.gpus:
			f += t.weight * st.cls[t.class].elig
		default:
			f += t.weight * st.cls[t.class].small
		}
	}
	return f
}

// pickByFragmentation chooses, for a one-GPU container, the candidate device whose use
// adds the least fragmentation; ties go to the fullest device (Binpack). It also
// returns what it measured (zero on nodes of over 64 devices): the node's statistics
// before the container (st when not nil: the node under used, measured already; else
// measured here) and the fragmentation before and after the pick.
func pickByFragmentation(m *nodemodel.Model, used []placement.Usage, wl *fragWorkload, c *api.ContainerRequest, w *placement.Weights, cand []int, st *Stats) (int, nodeMeasure) {
	if len(m.Devices) > 64 {
		return placement.PickBest(m, used, c, w, cand, placement.PackScore), nodeMeasure{}
	}
	if st == nil {
		st = newFragStats(m, used, wl, w)
	}
	before := st.Value(wl, nil)
	best, bestDelta, bestPack, bestAfter, bestTotal := -1, 0.0, 0.0, 0.0, 0.0
	// Alike devices (alikeDevices: often a node's empty GPUs) leave the node
	// equally fragmented: each kind is measured once, for its first candidate (the
	// first eight kinds; others are measured each time, with the same result). Kept
	// small: this frame is the deepest of Filter's, in worker goroutines that start on
	// small stacks and grow them by copying.
	var measuredDev [8]int8
	var measuredAfter, measuredTotal [8]float64
	nMeasured, prev := 0, -1
	for _, i := range cand {
		// A device that would be rated exactly as the best so far, or as the last one
		// rated (which did not beat the best, or is it), cannot win: alike (the same
		// measure), and as full with the same island term (placement.PackScore: an unused
		// device in the same island, or a used one).
		if (best >= 0 && sameRating(m, used, i, best)) || (prev >= 0 && sameRating(m, used, i, prev)) {
			continue
		}
		prev = i
		after, total, known := 0.0, 0.0, false
		for x := 0; x < nMeasured && !known; x++ {
			if alikeDevices(m, used, i, int(measuredDev[x])) {
				after, total, known = measuredAfter[x], measuredTotal[x], true
			}
		}
		if !known {
			after, total = fragAfter(m, used, st, wl, c, i, w)
			if nMeasured < len(measuredDev) {
				measuredDev[nMeasured], measuredAfter[nMeasured], measuredTotal[nMeasured] = int8(i), after, total
				nMeasured++
			}
		}
		delta := after - before
		pack := placement.PackScore(m, used, c, i, w)
		if best < 0 || delta < bestDelta-1e-9 || (math.Abs(delta-bestDelta) <= 1e-9 && pack > bestPack) {
			best, bestDelta, bestPack, bestAfter, bestTotal = i, delta, pack, after, total
		}
	}
	return best, nodeMeasure{base: st, before: before, after: bestAfter, afterTotal: bestTotal}
}

// sameRating reports whether pickByFragmentation rates devices i and j of m alike:
// the same measure (alikeDevices) and the same PackScore, whose island term reads
// only an unused device's island.
func sameRating(m *nodemodel.Model, used []placement.Usage, i, j int) bool {
	return alikeDevices(m, used, i, j) && (used[i].Tenants > 0 || m.Hot[i].Island == m.Hot[j].Island)
}

// alikeDevices reports whether devices i and j of m (i, j < 64) are interchangeable
// for every shape's fit and free share: same usage, memory, health, MIG flag and
// model (nodemodel.DeviceHot.Kind).
func alikeDevices(m *nodemodel.Model, used []placement.Usage, i, j int) bool {
	return used[i] == used[j] && m.Hot[i].Kind == m.Hot[j].Kind
}

// fragAfter is the node's fragmentation after container c is placed on device i
// (i < 64), for st measured under used, and its free GPU capacity then: exactly
// what placedInto and Value (nil) give for that placement, which the node-level score
// relies on (Allocation.Measured). used is restored before it returns.
//
// With the fit index, only the terms of the classes the placement can change are
// worked out again (changedClasses); the others are st's.
func fragAfter(m *nodemodel.Model, used []placement.Usage, st *Stats, wl *fragWorkload, c *api.ContainerRequest, i int, w *placement.Weights) (after, total float64) {
	u := used[i]
	was := st.free[i]
	used[i].MemMiB += c.MemoryOn(m.Hot[i].MemoryMiB)
	used[i].Cores += c.Cores
	used[i].Tenants++
	fi := placement.DeviceFree(m, used, i, w)
	total = st.total + (fi - was)
	if wl.fit != nil && st.classFits != nil {
		now := wl.fit.fitMask(m, used, i, w)
		used[i] = u
		d := []placedDevice{{i: i, was: was, now: fi, fits: now}}
		return st.valueAfter(wl, st.changedClasses(&d[0]), d), total
	}
	bit := uint64(1) << uint(i)
	for _, t := range wl.classTerms {
		x := t.class
		if st.cls[x].eligible == 0 {
			continue
		}
		n, small, elig := st.cls[x].fits, st.cls[x].small, st.cls[x].elig
		if onDevice := st.emask[x]&bit != 0; onDevice {
			// As placedInto: the free share changes by (fi - was).
			elig += fi - was
			if st.mask[x]&bit != 0 {
				n--
			} else {
				small -= was
			}
			if ShapeFits(m, used, &wl.classes[x], i, w) {
				n++
			} else {
				small += fi
			}
		}
		if n < t.gpus {
			after += t.weight * elig
		} else {
			after += t.weight * small
		}
	}
	used[i] = u
	return after, total
}

// placedDevice is one device a placement changes: its free share before and after,
// and the classes that fit it after (the fit index's mask).
type placedDevice struct {
	i        int
	was, now float64
	fits     uint64
}

// changedClasses is the set of classes (bit k) whose term a placement on device d
// may change, for st with a fit index: those d admits that do not fit it both before
// and after (their fits or small change), and those fitting on fewer devices than they
// need (their term is elig, which changes with d's free share).
func (st *Stats) changedClasses(d *placedDevice) uint64 {
	i := d.i
	return st.classElig[i] & (^(st.classFits[i] & d.fits) | st.low)
}

// termAfter is class x's term once devs are placed on, in their order: the same
// arithmetic as placedInto's, so the same bits.
func (st *Stats) termAfter(wl *fragWorkload, x int, devs []placedDevice) float64 {
	n, small, elig := st.cls[x].fits, st.cls[x].small, st.cls[x].elig
	for k := range devs {
		d := &devs[k]
		if st.classElig[d.i]>>uint(x)&1 == 0 {
			continue
		}
		elig += d.now - d.was
		if st.classFits[d.i]>>uint(x)&1 != 0 {
			n--
		} else {
			small -= d.was
		}
		if d.fits>>uint(x)&1 != 0 {
			n++
		} else {
			small += d.now
		}
	}
	if n < int32(wl.classes[x].C.GPUs) {
		return elig
	}
	return small
}

// maxPlacedValue bounds the devices placedValue measures a placement on; beyond it
// the node is measured with placedInto.
const maxPlacedValue = 8

// placedValue is the node's fragmentation (Value with nil) and free GPU capacity after
// allocation a, for st measured before it, without building the statistics after
// (placedInto): only the terms of the classes the placed devices can change are
// worked out again. ok is false where it cannot (no fit index, a node of over 64
// devices, more than maxPlacedValue devices placed on).
func (st *Stats) placedValue(m *nodemodel.Model, a *placement.Allocation, wl *fragWorkload, w *placement.Weights) (after, total float64, ok bool) {
	if wl.fit == nil || st.classFits == nil || len(m.Devices) > 64 {
		return 0, 0, false
	}
	var buf [maxPlacedValue]placedDevice
	devs := buf[:0]
	var done, changed uint64
	total = st.total
	for _, p := range a.Placements {
		for _, i := range p.Devices {
			bit := uint64(1) << uint(i)
			if done&bit != 0 {
				continue
			}
			if len(devs) == maxPlacedValue {
				return 0, 0, false
			}
			done |= bit
			d := placedDevice{i: i, was: st.free[i], now: placement.DeviceFree(m, a.Used(), i, w), fits: wl.fit.fitMask(m, a.Used(), i, w)}
			total += d.now - d.was
			changed |= st.changedClasses(&d)
			devs = append(devs, d)
		}
	}
	return st.valueAfter(wl, changed, devs), total, true
}

// valueAfter is Value (nil) once devs are placed on: the classes' terms summed in
// Value's order, those in changed worked out again (termAfter).
func (st *Stats) valueAfter(wl *fragWorkload, changed uint64, devs []placedDevice) float64 {
	var f float64
	for x, t := range wl.classTerms {
		v := st.term[x]
		if changed>>uint(x)&1 != 0 {
			v = st.termAfter(wl, x, devs)
		}
		f += t.weight * v
	}
	return f
}

// FitWeight is how much best fit (placement.Leftover, 0..1: free GPU and CPU against
// the cycle's largest node) weighs against fragmentation, in GPUs. At 0.16 a free GPU
// of an 8-GPU node costs 0.01 GPU of fragmentation, as much CPU again: best fit
// decides between placements that fragment alike, and it keeps CPU-heavy pods off
// nodes whose GPUs are still free.
const FitWeight = 0.16

// Scale turns a fragmentation change in GPUs into the raw score's integer units
// (1/1000 GPU), fine enough that NormalizeScore sees every real difference.
const Scale = 1000

// ScoreNode is the raw node score of allocation a: minus the increase of the node's
// fragmentation (GPUs × Scale), with GPU locality counted for multi-GPU pods.
// NormalizeScore maps it to the framework's range over the nodes of the cycle.
func (*placer) ScoreNode(info *placement.PodInfo, a *placement.Allocation, ni fwk.NodeInfo, f *placement.FitScale, w *placement.Weights) int64 {
	m := a.Model
	ps := stateOf(info)
	wl := noWorkload
	if ps != nil && ps.wl != nil {
		wl = ps.wl
	}
	cpuFree, memFree := placement.HostFree(ni)
	cpuAfter, memAfter := cpuFree-info.CPUMilli, memFree-info.MemBytes
	// The node before the pod: as the pick measured it, else as the cache kept it.
	st, _ := a.Base.(*Stats)
	ms, _ := a.Measured.(*nodeMeasure)
	if ms != nil {
		st = ms.base
	}
	// hostHolds is false when the node's CPU and memory hold back no shape, before or
	// after the pod.
	hostHolds := wl.MaxCPUMilli > min(cpuFree, cpuAfter) || wl.MaxMemBytes > min(memFree, memAfter)
	var delta, totalAfter, totalBefore float64
	if st != nil && ms != nil && len(a.Placements) == 1 && !hostHolds {
		// Filter measured this placement: placementDelta would give exactly this.
		delta, totalAfter, totalBefore = ms.after-ms.before, ms.afterTotal, st.total
	} else {
		delta, totalAfter, totalBefore = placementDelta(a, st, wl, w, hostHolds, cpuFree, memFree, cpuAfter, memAfter)
	}
	if ps != nil {
		feed := ps.workloadFeed(m, w)
		delta += feed.unfed(totalAfter, cpuAfter, memAfter) - feed.unfed(totalBefore, cpuFree, memFree)
		if p := ps.pressure; p != nil {
			delta += p.cost(m, a, w)
		}
	}
	// Among placements that fragment alike, the fuller node wins (best fit over GPUs
	// and CPU): spreading ties at random would use up the empty nodes that the largest
	// pods need.
	raw := w.Policy * -(delta + FitWeight*placement.Leftover(m, a.Used(), ni, f, w))
	if a.MultiGPU() {
		raw += w.Topology * (a.Locality() - 1)
	}
	return int64(math.Round(raw * Scale))
}

// placementDelta measures the node of allocation a before and after it (st: the node
// before it, when known): the change
// of its fragmentation (shapes held back by the node's CPU and memory, before and
// after the pod, count all their eligible capacity when hostHolds), and its free GPU
// capacity after and before. Apart from ScoreNode, whose common case (Filter measured
// the placement) runs in the framework's worker goroutines on small stacks: its
// frame stays small.
//
//go:noinline
func placementDelta(a *placement.Allocation, st *Stats, wl *fragWorkload, w *placement.Weights, hostHolds bool, cpuFree, memFree, cpuAfter, memAfter int64) (delta, totalAfter, totalBefore float64) {
	m := a.Model
	if st == nil || len(a.Placements) != 1 {
		st = newFragStats(m, usageBefore(a), wl, w)
	}
	if !hostHolds {
		if v, total, ok := st.placedValue(m, a, wl, w); ok {
			return v - st.Value(wl, nil), total, st.total
		}
	}
	after := st.placedInto(&scratchOf(a).after, m, a.Placements, a.Used(), wl, w)
	if !hostHolds {
		return after.Value(wl, nil) - st.Value(wl, nil), after.total, st.total
	}
	shapes := wl.shapes
	var beforeBuf, afterBuf [maxSnapshotShapes]bool
	hostBefore, hostAfter := beforeBuf[:0], afterBuf[:0]
	if len(shapes) > maxSnapshotShapes {
		hostBefore, hostAfter = make([]bool, 0, len(shapes)), make([]bool, 0, len(shapes))
	}
	hostBefore, hostAfter = hostBefore[:len(shapes)], hostAfter[:len(shapes)]
	for k := range shapes {
		hostBefore[k] = shapes[k].cpuMilli <= cpuFree && shapes[k].memBytes <= memFree
		hostAfter[k] = shapes[k].cpuMilli <= cpuAfter && shapes[k].memBytes <= memAfter
	}
	return after.Value(wl, hostAfter) - st.Value(wl, hostBefore), after.total, st.total
}

// usageBefore is the node's usage before allocation a.
func usageBefore(a *placement.Allocation) []placement.Usage {
	before := make([]placement.Usage, len(a.Used()))
	copy(before, a.Used())
	for _, p := range a.Placements {
		for k, i := range p.Devices {
			before[i].MemMiB -= p.MemMiB[k]
			before[i].Cores -= p.Cores
			before[i].Tenants--
		}
	}
	return before
}

// ScoreHostOnly is the raw score of a pod without GPUs: its CPU and memory can leave
// a node's free GPUs without the host capacity GPU pods need, which is as much
// fragmentation as a badly placed fraction; best fit then prefers the node with the
// least GPU and CPU left. Nodes without GPUs score 0 (nothing to strand), so such pods
// prefer them.
func (*placer) ScoreHostOnly(e *placement.NodeEntry, v placement.NodeView, used []placement.Usage, info *placement.PodInfo, ni fwk.NodeInfo, f *placement.FitScale, w *placement.Weights) int64 {
	ps := stateOf(info)
	if ps == nil {
		return 0
	}
	if v.Model == nil || len(v.Model.Devices) == 0 {
		return 0
	}
	shapes := ps.wl.shapes
	cpuFree, memFree := placement.HostFree(ni)
	st := ps.kept(e, v.UsageGen, v.Model, used, w)
	var delta float64
	for k := range shapes {
		s := &shapes[k]
		before := s.cpuMilli <= cpuFree && s.memBytes <= memFree
		after := s.cpuMilli <= cpuFree-info.CPUMilli && s.memBytes <= memFree-info.MemBytes
		if before && !after && int(st.cls[s.class].fits) >= s.C.GPUs {
			delta += ps.wl.terms[k].weight * (st.cls[s.class].elig - st.cls[s.class].small)
		}
	}
	feed := ps.workloadFeed(v.Model, w)
	delta += feed.unfed(st.total, cpuFree-info.CPUMilli, memFree-info.MemBytes) - feed.unfed(st.total, cpuFree, memFree)
	delta += FitWeight * placement.Leftover(v.Model, used, ni, f, w)
	return int64(math.Round(-w.Policy * delta * Scale))
}

// feedRatio is what the expected workload asks of the host per GPU of capacity it
// takes: CPU in millicores and memory in bytes (0: nothing, or no GPU pods seen).
type feedRatio struct {
	cpuMilli, memBytes float64
}

// feedMemo is a workloadFeed result and the GPU memory it was computed for.
type feedMemo struct {
	memMiB int64
	r      feedRatio
}

// workloadFeed is workloadFeed of the pod's shapes on m, computed again only when m's
// first GPU differs in memory from the one it was last computed for.
func (p *podState) workloadFeed(m *nodemodel.Model, w *placement.Weights) feedRatio {
	var memMiB int64
	if len(m.Hot) > 0 {
		memMiB = m.Hot[0].MemoryMiB
	}
	if f := p.feed.Load(); f != nil && f.memMiB == memMiB {
		return f.r
	}
	r := workloadFeed(p.wl, m, w)
	p.feed.Store(&feedMemo{memMiB: memMiB, r: r})
	return r
}

// workloadFeed is the expected workload's host request per GPU, for GPUs like the
// node's first (its memory converts MiB requests to a share of a GPU): all it reads of
// the node is that GPU's memory.
func workloadFeed(wl *fragWorkload, m *nodemodel.Model, w *placement.Weights) feedRatio {
	if wl == nil {
		return feedRatio{}
	}
	shapes := wl.shapes
	var memMiB int64
	if len(m.Hot) > 0 {
		memMiB = m.Hot[0].MemoryMiB
	}
	var cpu, mem, gpu float64
	for k := range shapes {
		sh := &shapes[k]
		memFrac := 1.0
		if memMiB > 0 {
			memFrac = math.Min(1, float64(sh.C.MemoryOn(memMiB))/float64(memMiB))
		}
		share := float64(sh.C.GPUs) * (w.Memory*memFrac + w.Cores*float64(sh.C.Cores)/100) / (w.Memory + w.Cores)
		weight := wl.terms[k].weight
		cpu += weight * float64(sh.cpuMilli)
		mem += weight * float64(sh.memBytes)
		gpu += weight * share
	}
	if gpu <= 0 {
		return feedRatio{}
	}
	return feedRatio{cpuMilli: cpu / gpu, memBytes: mem / gpu}
}

// unfed is the part of freeGPU (GPUs) that the node's free CPU and memory cannot
// serve at the workload's ratio: GPU capacity on its way to being stranded by host
// resources. Fragmentation's per-shape check sees a node's GPUs stranded only once
// its CPU falls below a whole pod's request; on the Alibaba trace CPU, not GPU
// packing, decided most of the difference to a cluster without CPU limits
// (docs/benchmarks.md, B1), and counting the capacity the host can no longer feed,
// as it drains, is what closed it. Placements are charged the change of this, in
// GPUs like fragmentation: a pod heavy on CPU for its GPUs goes where CPU is to
// spare, a CPU-only pod to a node with CPU beyond what its GPUs need.
func (r feedRatio) unfed(freeGPU float64, cpuFree, memFree int64) float64 {
	fed := freeGPU
	if r.cpuMilli > 0 {
		fed = math.Min(fed, math.Max(0, float64(cpuFree))/r.cpuMilli)
	}
	if r.memBytes > 0 {
		fed = math.Min(fed, math.Max(0, float64(memFree))/r.memBytes)
	}
	return freeGPU - fed
}

// Step is the fragmentation difference (in raw units, 1/1000 GPU) that one point
// of the framework's score stands for after NormalizeScore: 0.01 GPU.
const Step = 10

// NormalizeScore maps the raw Fragmentation scores of a cycle onto the framework's
// range by their distance from the best node: the best gets MaxNodeScore and every
// 0.01 GPU of extra fragmentation costs one point, down to MinNodeScore. A min-max
// scale would let the worst node of the cycle (often one whose CPU a pod would use
// up, stranding all its GPUs) set the resolution, and erase the differences of a few
// hundredths of a GPU that decide between the good nodes.
func (*placer) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if len(scores) == 0 {
		return nil
	}
	hi := scores[0].Score
	for _, s := range scores[1:] {
		hi = max(hi, s.Score)
	}
	for i := range scores {
		scores[i].Score = max(fwk.MinNodeScore, fwk.MaxNodeScore-(hi-scores[i].Score)/Step)
	}
	return nil
}

// fragMemo is a node's fragmentation statistics as the cache keeps them
// (NodeEntry.LoadMemo): the node's usage generation and the workload's class generation
// they were measured at, and the statistics, indexed by that workload's classes. Only
// the GPU state matters: CPU and host memory, which Score reads from the scheduler's
// NodeInfo, are not part of them.
type fragMemo struct {
	// Memo is the cache's handle on the memo (Of points back to it): first, so
	// that the entry reaches the statistics in the same cache line.
	placement.Memo
	usageGen uint64
	gen      uint64
	// st is kept in the memo rather than beside it: one object fewer to reach.
	st Stats
}

// KeptMeasure is the node's fragmentation statistics (*Stats) under used (its
// usage at generation gen) for the pod's workload, or nil (kept, below).
func (p *podState) KeptMeasure(e *placement.NodeEntry, gen uint64, m *nodemodel.Model, used []placement.Usage, w *placement.Weights) any {
	if st := p.kept(e, gen, m, used, w); st != nil {
		return st
	}
	return nil
}

// kept is the node's fragmentation statistics under used (model m's usage at usage
// generation gen, NodeView.UsageGen) for the pod's workload: kept from an earlier cycle when neither the node's usage
// nor the workload's classes have changed since, else measured now and kept. It is
// nil for a pod without a learned workload from a model.
//
// Measuring a node costs classes × devices fit checks and was most of Fragmentation's
// Filter+Score; between two cycles only the node the last pod went to, and those
// informer events touched, change (NodeEntry.usageGen), and the learned GPU
// requests change for a few cycles in a thousand (fragWorkload.gen; the shapes, with
// their host requests, changed on a few in a hundred and their order on a quarter,
// which is why statistics are kept per class). The statistics are exactly those
// newFragStats would compute, so no score moves.
func (p *podState) kept(e *placement.NodeEntry, gen uint64, m *nodemodel.Model, used []placement.Usage, w *placement.Weights) *Stats {
	if p == nil || p.wl.Empty() || p.wl.gen == 0 {
		return nil
	}
	if e == nil {
		// No entry to keep it in (a DRA node's use is the claims'): measured now.
		st := &Stats{}
		st.measure(m, used, p.wl, w)
		return st
	}
	if old, ok := e.LoadMemo().(*fragMemo); ok && old.usageGen == gen && old.gen == p.wl.gen {
		return &old.st
	}
	memo := &fragMemo{usageGen: gen, gen: p.wl.gen}
	memo.Of = memo
	memo.st.measure(m, used, p.wl, w)
	// A measure of a newer generation may be replaced by this older one when two
	// cycles race: it is then measured again, never used for the wrong usage.
	e.StoreMemo(&memo.Memo)
	return &memo.st
}

// float64s views words as float64s (the same size, no pointers): measure keeps a
// node's floats and integers in one allocation.
func float64s(words []uint64) []float64 {
	if len(words) == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(&words[0])), len(words))
}

// classStats views words as a third as many classStats (three words each, no
// pointers).
func classStats(words []uint64) []classStat {
	if len(words) == 0 {
		return nil
	}
	return unsafe.Slice((*classStat)(unsafe.Pointer(&words[0])), len(words)/3)
}

// WorkloadOf is the workload model a Fragmentation placer learns, or nil for another
// placer.
func WorkloadOf(p placement.Placer) *WorkloadModel {
	if f, ok := p.(*placer); ok {
		return f.workload
	}
	return nil
}

// Learned is the expected workload as a model has learned it, for the plugin's
// gauges of fragmented GPU capacity.
type Learned struct {
	ps podState
}

// Learned is the workload as it is now, or nil while nothing is learned.
func (w *WorkloadModel) Learned() *Learned {
	wl := w.Snapshot()
	if wl.Empty() {
		return nil
	}
	return &Learned{ps: podState{wl: wl}}
}

// Fragmented is the learned workload's fragmentation of the node of entry e as view
// v shows it (usage used), in GPUs: with the node's kept measure where Filter has it,
// measured and kept here otherwise.
func (l *Learned) Fragmented(e *placement.NodeEntry, v *placement.NodeView, used []placement.Usage, w *placement.Weights) float64 {
	return l.ps.kept(e, v.UsageGen, v.Model, used, w).Value(l.ps.wl, nil)
}

// wholeGPU is the class of pods of one whole GPU, the workload-independent measure.
var wholeGPU = Class{C: api.ContainerRequest{GPUs: 1, Cores: 100}}

// WholeGPUFragmentation is a node's free GPU capacity and the part of it pods of one
// whole GPU cannot use (what newFragStats and Stats.Value give for that one
// class, without allocating: the plugin's metrics collector measures every node on
// every scrape). MIG instances are not eligible for such pods.
func WholeGPUFragmentation(m *nodemodel.Model, used []placement.Usage, w *placement.Weights) (free, frag float64) {
	fit, eligible, small, elig := 0, 0, 0.0, 0.0
	for i := range m.Devices {
		f := placement.DeviceFree(m, used, i, w)
		free += f
		if !wholeGPU.EligibleAt(m, i) {
			continue
		}
		eligible++
		elig += f
		if ShapeFits(m, used, &wholeGPU, i, w) {
			fit++
		} else {
			small += f
		}
	}
	switch {
	case eligible == 0:
		return free, 0
	case fit < wholeGPU.C.GPUs:
		return free, elig
	}
	return free, small
}

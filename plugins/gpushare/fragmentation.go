package gpushare

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
)

// The Fragmentation policy places a pod where it makes the least GPU capacity unusable
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

// maxFragShapes bounds the shapes a placement is evaluated against: the cost of scoring
// a node grows with it, and the long tail of rare shapes hardly moves the mean (up to
// as many again are added so that every GPU request size is represented).
const maxFragShapes = 32

// defaultFragmentationWindow is how many recent GPU pods make up the expected workload.
const defaultFragmentationWindow = 2000

// fragmentation is the Fragmentation policy's placer. Its workload model is the
// plugin's: the node-level and the GPU-level use of the policy learn from, and place
// for, the same pods.
type fragmentation struct {
	workload *workloadModel
}

var _ placer = &fragmentation{}

func (*fragmentation) policy() Policy { return Fragmentation }

// preparePod counts the pod's shape into the workload and gives the cycle the
// workload as it is now. The node-level and GPU-level placers are one value when
// both are Fragmentation, and then PreFilter calls this once.
func (f *fragmentation) preparePod(pod *v1.Pod, info *podInfo) {
	info.cpuMilli, info.memBytes = podHostRequests(pod)
	f.workload.observe(pod.UID, shapeOf(info))
	info.fragShapes, info.fragGen = f.workload.snapshotGen()
	info.pressure = f.workload.pressureNow()
}

// deviceScore is Binpack's: the policy only differs for one-GPU containers
// (pickDevice).
func (*fragmentation) deviceScore(m *nodeModel, used []usage, c *api.ContainerRequest, i int, w *weights) float64 {
	return packScore(m, used, c, i, w)
}

// pickDevice takes the device whose use adds the least fragmentation
// (pickByFragmentation), and leaves its measure of the node in *measured for the
// node-level score. A measure already in *measured (the cache's, see place) is the
// node under used and is not taken again. Without a learned workload it places as
// Binpack.
func (*fragmentation) pickDevice(m *nodeModel, used []usage, p *podInfo, c *api.ContainerRequest, w *weights, cand []int, measured *nodeMeasure) int {
	if len(p.fragShapes) == 0 {
		return pickBest(m, used, c, w, cand, packScore)
	}
	var base *fragStats
	if measured != nil {
		base = *measured
	}
	i, st := pickByFragmentation(m, used, p, c, w, cand, base)
	if measured != nil && st != nil {
		*measured = st
	}
	return i
}

// hostOnlyPod is the workload a pod without GPUs is scored against (see
// scoreHostOnly), or nil while no GPU pod has been seen: then nothing can be stranded.
func (f *fragmentation) hostOnlyPod(pod *v1.Pod) *podInfo {
	shapes, gen := f.workload.snapshotGen()
	if len(shapes) == 0 {
		return nil
	}
	h := &podInfo{fragShapes: shapes, fragGen: gen}
	h.cpuMilli, h.memBytes = podHostRequests(pod)
	return h
}

// needsFit: best fit breaks ties between placements that fragment alike.
func (*fragmentation) needsFit() bool { return true }

// scoreExtensions: Fragmentation's scores are raw and normalised per cycle.
func (f *fragmentation) scoreExtensions() fwk.ScoreExtensions { return f }

// fragShape is one kind of pod of the expected workload.
type fragShape struct {
	// c is the pod's most demanding GPU container (what decides where it fits).
	c            api.ContainerRequest
	modelInclude []string
	modelExclude []string
	cpuMilli     int64
	memBytes     int64
	weight       float64
	key          string
	// slot is the shape's place in its snapshot's shapes ordered by key: the same
	// for the same set of shapes in any order (fragMemo.permuted).
	slot int
}

// eligibleAt reports whether device i of m passes the shape's model selection. A shape
// without one reads only the device's MIG flag (as podInfo.eligibleAt): this check
// runs shapes × devices times per node, and building the selection for it was half
// of Fragmentation's Filter+Score.
func (s *fragShape) eligibleAt(m *nodeModel, i int) bool {
	if len(s.modelInclude) == 0 && len(s.modelExclude) == 0 {
		return !m.hot[i].mig
	}
	p := podInfo{modelInclude: s.modelInclude, modelExclude: s.modelExclude}
	return p.eligible(&m.devices[i])
}

// shapeOf is the fragmentation shape of a parsed pod.
func shapeOf(info *podInfo) fragShape {
	c := info.req.Containers[info.order[0]]
	c.Name, c.Init = "", false
	s := fragShape{c: c, modelInclude: info.modelInclude, modelExclude: info.modelExclude,
		cpuMilli: info.cpuMilli, memBytes: info.memBytes}
	// Rounding keeps near-identical pods in one bucket: 100 millicores, 256 MiB.
	cpu := (s.cpuMilli + 50) / 100 * 100
	mem := (s.memBytes + 128<<20) >> 28 << 28
	s.key = fmt.Sprintf("%d/%d/%d/%d|%s|%s|%d|%d", c.GPUs, c.MemoryMiB, c.MemoryPercent, c.Cores,
		strings.Join(s.modelInclude, ","), strings.Join(s.modelExclude, ","), cpu, mem)
	return s
}

// gpuKey identifies the shape's GPU request, whatever its CPU and memory.
func (s *fragShape) gpuKey() string {
	k, _, _ := strings.Cut(s.key, "|")
	return k + "|" + strings.Join(s.modelInclude, ",") + "|" + strings.Join(s.modelExclude, ",")
}

// workloadModel is the recent mix of GPU pod shapes, shared by the plugin's cycles.
type workloadModel struct {
	mu     sync.Mutex
	window int
	ring   []ringEntry
	next   int
	byUID  map[types.UID]bool
	counts map[string]*shapeCount
	shapes []fragShape // cached result of snapshot; rebuilt when dirty
	dirty  bool
	// gen identifies shapes for the measures the cache keeps per node (fragMemo).
	gen fragGen

	// Model pressure (pressure.go): the cluster and weights it is measured with
	// (bind), how many pods of the window have a model selection, and the pressure
	// last computed with how many pods were observed since and how many the window
	// held then.
	cluster     *Cache
	weights     *weights
	selective   int
	pressure    *modelPressure
	pressureAge int
	pressureLen int
}

// fragGen identifies a snapshot's shapes for a node's kept measure: set changes when
// shapes join or leave the snapshot, order when they change places. Weights are not
// part of it: a node's statistics do not depend on them. The numbers come from one
// counter for every workload model, so that the measures of two profiles sharing the
// cache never pass for each other's.
type fragGen struct {
	set, order uint64
}

var fragGens atomic.Uint64

type ringEntry struct {
	uid       types.UID
	key       string
	selective bool
}

type shapeCount struct {
	shape fragShape
	n     int
}

func newWorkloadModel(window int) *workloadModel {
	return &workloadModel{window: window, byUID: map[types.UID]bool{}, counts: map[string]*shapeCount{}, pressureAge: pressureEvery}
}

// observe records a pod's shape once (a retried pod is not counted again while it is
// in the window).
func (w *workloadModel) observe(uid types.UID, s fragShape) {
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
			if c.n--; c.n == 0 {
				delete(w.counts, old.key)
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
	if c := w.counts[s.key]; c != nil {
		c.n++
	} else {
		w.counts[s.key] = &shapeCount{shape: s, n: 1}
	}
	w.dirty = true
}

// snapshot returns the most frequent shapes with weights summing to 1. The slice is
// never modified afterwards, so cycles may keep it.
func (w *workloadModel) snapshot() []fragShape {
	s, _ := w.snapshotGen()
	return s
}

// snapshotGen is snapshot with the shapes' generation.
func (w *workloadModel) snapshotGen() ([]fragShape, fragGen) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.dirty {
		return w.shapes, w.gen
	}
	all := make([]*shapeCount, 0, len(w.counts))
	for _, c := range w.counts {
		all = append(all, c)
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].n != all[j].n {
			return all[i].n > all[j].n
		}
		return all[i].shape.key < all[j].shape.key
	})
	// The most frequent shapes, plus the most frequent of every GPU request the top
	// ones miss: rare big pods (a whole 8-GPU node) must still be kept room for.
	if len(all) > maxFragShapes {
		seen := map[string]bool{}
		kept := all[:0:0]
		for i, c := range all {
			g := c.shape.gpuKey()
			if i < maxFragShapes || (!seen[g] && len(kept) < 2*maxFragShapes) {
				kept = append(kept, c)
				seen[g] = true
			}
		}
		all = kept
	}
	total := 0
	for _, c := range all {
		total += c.n
	}
	out := make([]fragShape, len(all))
	for i, c := range all {
		out[i] = c.shape
		out[i].weight = float64(c.n) / float64(total)
	}
	w.gen = nextFragGen(w.gen, w.shapes, out)
	w.shapes, w.dirty = out, false
	return out, w.gen
}

// nextFragGen numbers the slots of out and returns its generation, which keeps
// prev's set and order numbers where out has prev's shapes and their order.
func nextFragGen(gen fragGen, prev, out []fragShape) fragGen {
	byKey := make([]int, len(out))
	for i := range byKey {
		byKey[i] = i
	}
	sort.Slice(byKey, func(i, j int) bool { return out[byKey[i]].key < out[byKey[j]].key })
	for slot, k := range byKey {
		out[k].slot = slot
	}
	sameSet, sameOrder := len(prev) == len(out) && gen.set != 0, true
	if sameSet {
		// Slots number a set by key: two sets are equal when their slots hold
		// the same keys.
		prevAt := make([]int, len(prev))
		for k := range prev {
			prevAt[prev[k].slot] = k
		}
		for slot, k := range byKey {
			if out[k].key != prev[prevAt[slot]].key {
				sameSet = false
				break
			}
		}
	}
	for k := 0; sameSet && sameOrder && k < len(out); k++ {
		sameOrder = out[k].key == prev[k].key
	}
	switch {
	case !sameSet:
		gen = fragGen{set: fragGens.Add(1), order: fragGens.Add(1)}
	case !sameOrder:
		gen.order = fragGens.Add(1)
	}
	return gen
}

// podHostRequests is the pod's CPU (millicores) and host memory (bytes) request, as
// NodeResourcesFit counts it.
func podHostRequests(pod *v1.Pod) (cpuMilli, memBytes int64) {
	r := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	return r.Cpu().MilliValue(), r.Memory().Value()
}

// fragStats is a node's fragmentation for every shape, kept in parts so that the
// effect of changing one device can be computed without rescanning the node.
//
// A shape is measured on the devices its model selection admits (eligible): a pod
// that requires a T4 strands nothing on a node of other GPUs, whatever is free there,
// and that node's fragmentation does not count it. Where no device of the node is
// eligible the shape adds nothing to the node's fragmentation; keeping the GPU models
// that constrained pods need free for them is the separate model pressure term
// (modelPressure).
type fragStats struct {
	free  []float64 // per device, free share of the GPU (0..1), 0 if unhealthy
	total float64
	fits  []int     // per shape, devices it fits on
	small []float64 // per shape, free share of the eligible devices it does not fit on
	mask  []uint64  // per shape, bit i set when it fits device i (devices < 64)
	// elig is per shape the free share of its eligible devices, emask the eligible
	// devices (bit i, devices < 64) and eligible how many there are: eligibility
	// depends on the node's devices only, never on their usage.
	elig     []float64
	emask    []uint64
	eligible []int
}

// deviceFree is the free share of device i under used, by the plugin's weights.
func deviceFree(m *nodeModel, used []usage, i int, w *weights) float64 {
	d := &m.hot[i]
	if !d.healthy {
		return 0
	}
	u := &used[i]
	util := (w.memory*float64(u.memMiB)/float64(d.memoryMiB) + w.cores*float64(u.cores)/100) / (w.memory + w.cores)
	return math.Max(0, 1-util)
}

func shapeFits(m *nodeModel, used []usage, s *fragShape, i int, w *weights) bool {
	return m.hot[i].healthy && s.eligibleAt(m, i) && fits(m, used, &s.c, i, w.maxTenants)
}

func newFragStats(m *nodeModel, used []usage, shapes []fragShape, w *weights) *fragStats {
	n, ns := len(m.devices), len(shapes)
	st := &fragStats{free: make([]float64, n), fits: make([]int, ns), small: make([]float64, ns), mask: make([]uint64, ns),
		elig: make([]float64, ns), emask: make([]uint64, ns), eligible: make([]int, ns)}
	for i := 0; i < n; i++ {
		st.free[i] = deviceFree(m, used, i, w)
		st.total += st.free[i]
	}
	for k := range shapes {
		s := &shapes[k]
		for i := 0; i < n; i++ {
			if !s.eligibleAt(m, i) {
				continue
			}
			st.eligible[k]++
			st.elig[k] += st.free[i]
			if i < 64 {
				st.emask[k] |= 1 << uint(i)
			}
			if m.hot[i].healthy && fits(m, used, &s.c, i, w.maxTenants) {
				st.fits[k]++
				if i < 64 {
					st.mask[k] |= 1 << uint(i)
				}
			} else {
				st.small[k] += st.free[i]
			}
		}
	}
	return st
}

// placed returns the stats after allocation a, for st measured before it: only the
// devices a places on change, so only they are measured again (a node's stats cost
// shapes × devices fits checks; Score needs them before and after every placement).
// Nodes of more than 64 devices are measured in full.
func (st *fragStats) placed(m *nodeModel, a *allocation, shapes []fragShape, w *weights) *fragStats {
	return st.placedInto(&fragStats{}, m, a, shapes, w)
}

// placedInto is placed writing into out, whose slices it reuses: Score keeps one in
// each node's allocation (allocation.after), so that it allocates nothing per node.
func (st *fragStats) placedInto(out *fragStats, m *nodeModel, a *allocation, shapes []fragShape, w *weights) *fragStats {
	if len(m.devices) > 64 {
		return newFragStats(m, a.used, shapes, w)
	}
	out.free, out.total = append(out.free[:0], st.free...), st.total
	out.fits = append(out.fits[:0], st.fits...)
	out.small = append(out.small[:0], st.small...)
	out.mask = append(out.mask[:0], st.mask...)
	out.elig = append(out.elig[:0], st.elig...)
	// Eligibility does not depend on usage: out shares st's, which neither changes.
	out.emask, out.eligible = st.emask, st.eligible
	var done uint64
	for _, p := range a.placements {
		for _, i := range p.devices {
			bit := uint64(1) << uint(i)
			if done&bit != 0 {
				continue
			}
			done |= bit
			was, now := st.free[i], deviceFree(m, a.used, i, w)
			out.free[i] = now
			out.total += now - was
			for k := range shapes {
				if st.emask[k]&bit == 0 {
					continue // the shape cannot use device i, before or after
				}
				out.elig[k] += now - was
				if st.mask[k]&bit != 0 {
					out.fits[k]--
				} else {
					out.small[k] -= was
				}
				if shapeFits(m, a.used, &shapes[k], i, w) {
					out.fits[k]++
					out.mask[k] |= bit
				} else {
					out.small[k] += now
					out.mask[k] &^= bit
				}
			}
		}
	}
	return out
}

// value is the node's fragmentation in GPUs: per shape that may use the node's GPUs,
// weighted by its share of the workload, the free capacity of its eligible devices it
// cannot use. hostFits[k] reports whether shape k fits the node's free CPU and host
// memory (nil: all do).
func (st *fragStats) value(shapes []fragShape, hostFits []bool) float64 {
	var f float64
	for k := range shapes {
		switch {
		case st.eligible[k] == 0:
		case (hostFits != nil && !hostFits[k]) || st.fits[k] < shapes[k].c.GPUs:
			f += shapes[k].weight * st.elig[k]
		default:
			f += shapes[k].weight * st.small[k]
		}
	}
	return f
}

// pickByFragmentation chooses, for a one-GPU container, the candidate device whose use
// adds the least fragmentation; ties go to the fullest device (Binpack). It also
// returns the node's measure before the container (nil on nodes of over 64 devices):
// st when not nil (the node under used, measured already), else measured here.
func pickByFragmentation(m *nodeModel, used []usage, p *podInfo, c *api.ContainerRequest, w *weights, cand []int, st *fragStats) (int, *fragStats) {
	if len(m.devices) > 64 {
		return pickBest(m, used, c, w, cand, packScore), nil
	}
	if st == nil {
		st = newFragStats(m, used, p.fragShapes, w)
	}
	before := st.value(p.fragShapes, nil)
	best, bestDelta, bestPack := -1, 0.0, 0.0
	// Alike devices (alikeDevices: often a node's empty GPUs) leave the node
	// equally fragmented: each kind is measured once, for its first candidate.
	var measuredDev [16]int
	var measuredAfter [16]float64
	nMeasured := 0
	for _, i := range cand {
		after, known := 0.0, false
		for x := 0; x < nMeasured && !known; x++ {
			if alikeDevices(m, used, i, measuredDev[x]) {
				after, known = measuredAfter[x], true
			}
		}
		if !known {
			after = fragAfter(m, used, st, p.fragShapes, c, i, w)
			if nMeasured < len(measuredDev) {
				measuredDev[nMeasured], measuredAfter[nMeasured] = i, after
				nMeasured++
			}
		}
		delta := after - before
		pack := packScore(m, used, c, i, w)
		if best < 0 || delta < bestDelta-1e-9 || (math.Abs(delta-bestDelta) <= 1e-9 && pack > bestPack) {
			best, bestDelta, bestPack = i, delta, pack
		}
	}
	return best, st
}

// alikeDevices reports whether devices i and j of m are interchangeable for every
// shape's fit and free share: same usage, memory, health, MIG flag and model.
func alikeDevices(m *nodeModel, used []usage, i, j int) bool {
	return used[i] == used[j] && m.hot[i].memoryMiB == m.hot[j].memoryMiB && m.hot[i].healthy == m.hot[j].healthy &&
		m.hot[i].mig == m.hot[j].mig && m.devices[i].model == m.devices[j].model
}

// fragAfter is the node's fragmentation after container c is placed on device i
// (i < 64), for st measured under used. used is restored before it returns.
func fragAfter(m *nodeModel, used []usage, st *fragStats, shapes []fragShape, c *api.ContainerRequest, i int, w *weights) float64 {
	u := used[i]
	used[i].memMiB += c.MemoryOn(m.devices[i].memoryMiB)
	used[i].cores += c.Cores
	used[i].tenants++
	fi := deviceFree(m, used, i, w)
	bit := uint64(1) << uint(i)
	var after float64
	for k := range shapes {
		s := &shapes[k]
		if st.eligible[k] == 0 {
			continue
		}
		nfits, small, elig := st.fits[k], st.small[k], st.elig[k]
		if st.emask[k]&bit != 0 {
			elig = elig - st.free[i] + fi
			if st.mask[k]&bit != 0 {
				nfits--
			} else {
				small -= st.free[i]
			}
			if shapeFits(m, used, s, i, w) {
				nfits++
			} else {
				small += fi
			}
		}
		if nfits < s.c.GPUs {
			after += s.weight * elig
		} else {
			after += s.weight * small
		}
	}
	used[i] = u
	return after
}

// fragFitWeight is how much best fit (leftover, 0..1: free GPU and CPU against
// the cycle's largest node) weighs against fragmentation, in GPUs. At 0.16 a free GPU
// of an 8-GPU node costs 0.01 GPU of fragmentation, as much CPU again: best fit
// decides between placements that fragment alike, and it keeps CPU-heavy pods off
// nodes whose GPUs are still free.
const fragFitWeight = 0.16

// fragScale turns a fragmentation change in GPUs into the raw score's integer units
// (1/1000 GPU), fine enough that NormalizeScore sees every real difference.
const fragScale = 1000

// scoreNode is the raw node score of allocation a: minus the increase of the node's
// fragmentation (GPUs × fragScale), with GPU locality counted for multi-GPU pods.
// NormalizeScore maps it to the framework's range over the nodes of the cycle.
func (*fragmentation) scoreNode(s *cycleState, a *allocation, ni fwk.NodeInfo, f *fitScale, w *weights) int64 {
	m := a.model
	shapes := s.info.fragShapes
	cpuFree, memFree := hostFree(ni)
	hostBefore := make([]bool, len(shapes))
	hostAfter := make([]bool, len(shapes))
	for k := range shapes {
		hostBefore[k] = shapes[k].cpuMilli <= cpuFree && shapes[k].memBytes <= memFree
		hostAfter[k] = shapes[k].cpuMilli <= cpuFree-s.info.cpuMilli && shapes[k].memBytes <= memFree-s.info.memBytes
	}
	st := a.measured
	if st == nil || len(a.placements) != 1 {
		before := make([]usage, len(a.used))
		copy(before, a.used)
		for _, p := range a.placements {
			for k, i := range p.devices {
				before[i].memMiB -= p.memMiB[k]
				before[i].cores -= p.cores
				before[i].tenants--
			}
		}
		st = newFragStats(m, before, shapes, w)
	}
	after := st.placedInto(&a.after, m, a, shapes, w)
	delta := after.value(shapes, hostAfter) - st.value(shapes, hostBefore)
	feed := s.info.workloadFeed(m, w)
	delta += feed.unfed(after.total, cpuFree-s.info.cpuMilli, memFree-s.info.memBytes) - feed.unfed(st.total, cpuFree, memFree)
	delta += s.info.pressure.cost(m, a, w)
	// Among placements that fragment alike, the fuller node wins (best fit over GPUs
	// and CPU): spreading ties at random would use up the empty nodes that the largest
	// pods need.
	raw := w.policy * -(delta + fragFitWeight*leftover(m, a.used, ni, f, w))
	if a.multiGPU {
		raw += w.topology * (a.topology - 1)
	}
	return int64(math.Round(raw * fragScale))
}

// scoreHostOnly is the raw score of a pod without GPUs: its CPU and memory can leave
// a node's free GPUs without the host capacity GPU pods need, which is as much
// fragmentation as a badly placed fraction; best fit then prefers the node with the
// least GPU and CPU left. Nodes without GPUs score 0 (nothing to strand), so such pods
// prefer them.
func (*fragmentation) scoreHostOnly(c *Cache, info *podInfo, ni fwk.NodeInfo, f *fitScale, w *weights) int64 {
	if info == nil {
		return 0
	}
	var buf [16]usage
	e, v, used := c.entryView(ni.Node(), buf[:0])
	if v.model == nil || len(v.model.devices) == 0 {
		return 0
	}
	shapes := info.fragShapes
	cpuFree, memFree := hostFree(ni)
	st := e.fragBase(&v, used, info, w)
	var delta float64
	for k := range shapes {
		s := &shapes[k]
		before := s.cpuMilli <= cpuFree && s.memBytes <= memFree
		after := s.cpuMilli <= cpuFree-info.cpuMilli && s.memBytes <= memFree-info.memBytes
		if before && !after && st.fits[k] >= s.c.GPUs {
			delta += s.weight * (st.elig[k] - st.small[k])
		}
	}
	feed := info.workloadFeed(v.model, w)
	delta += feed.unfed(st.total, cpuFree-info.cpuMilli, memFree-info.memBytes) - feed.unfed(st.total, cpuFree, memFree)
	delta += fragFitWeight * leftover(v.model, used, ni, f, w)
	return int64(math.Round(-w.policy * delta * fragScale))
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
func (p *podInfo) workloadFeed(m *nodeModel, w *weights) feedRatio {
	var memMiB int64
	if len(m.hot) > 0 {
		memMiB = m.hot[0].memoryMiB
	}
	if f := p.feed.Load(); f != nil && f.memMiB == memMiB {
		return f.r
	}
	r := workloadFeed(p.fragShapes, m, w)
	p.feed.Store(&feedMemo{memMiB: memMiB, r: r})
	return r
}

// workloadFeed is the expected workload's host request per GPU, for GPUs like the
// node's first (its memory converts MiB requests to a share of a GPU): all it reads of
// the node is that GPU's memory.
func workloadFeed(shapes []fragShape, m *nodeModel, w *weights) feedRatio {
	var memMiB int64
	if len(m.hot) > 0 {
		memMiB = m.hot[0].memoryMiB
	}
	var cpu, mem, gpu float64
	for k := range shapes {
		sh := &shapes[k]
		memFrac := 1.0
		if memMiB > 0 {
			memFrac = math.Min(1, float64(sh.c.MemoryOn(memMiB))/float64(memMiB))
		}
		share := float64(sh.c.GPUs) * (w.memory*memFrac + w.cores*float64(sh.c.Cores)/100) / (w.memory + w.cores)
		cpu += sh.weight * float64(sh.cpuMilli)
		mem += sh.weight * float64(sh.memBytes)
		gpu += sh.weight * share
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

func hostFree(ni fwk.NodeInfo) (cpuMilli, memBytes int64) {
	a, r := ni.GetAllocatable(), ni.GetRequested()
	return a.GetMilliCPU() - r.GetMilliCPU(), a.GetMemory() - r.GetMemory()
}

// fragStep is the fragmentation difference (in raw units, 1/1000 GPU) that one point
// of the framework's score stands for after NormalizeScore: 0.01 GPU.
const fragStep = 10

// NormalizeScore maps the raw Fragmentation scores of a cycle onto the framework's
// range by their distance from the best node: the best gets MaxNodeScore and every
// 0.01 GPU of extra fragmentation costs one point, down to MinNodeScore. A min-max
// scale would let the worst node of the cycle (often one whose CPU a pod would use
// up, stranding all its GPUs) set the resolution, and erase the differences of a few
// hundredths of a GPU that decide between the good nodes.
func (*fragmentation) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if len(scores) == 0 {
		return nil
	}
	hi := scores[0].Score
	for _, s := range scores[1:] {
		hi = max(hi, s.Score)
	}
	for i := range scores {
		scores[i].Score = max(fwk.MinNodeScore, fwk.MaxNodeScore-(hi-scores[i].Score)/fragStep)
	}
	return nil
}

// fragMemo is a node's fragmentation statistics as the cache keeps them
// (nodeEntry.frag): the node's usage generation and the shapes' generation they were
// measured at, and the statistics, indexed by the shapes of that snapshot. Only the
// GPU state matters: CPU and host memory, which Score reads from the scheduler's
// NodeInfo, are not part of them.
type fragMemo struct {
	usageGen uint64
	gen      fragGen
	// at[slot] is the index in st of the shape in slot.
	at []int
	st *fragStats
}

// fragBase is the node's fragmentation statistics under used (the usage of view v)
// for the pod's shapes: kept from an earlier cycle when neither the node's usage nor
// the set of shapes has changed since (reordered when the shapes' order has), else
// measured now and kept. It is nil for a pod without learned shapes.
//
// Measuring a node costs shapes × devices fit checks and was most of Fragmentation's
// Filter+Score; between two cycles only the node the last pod went to, and those
// informer events touched, change (nodeEntry.usageGen), and the learned set of
// shapes changes for a few cycles in a hundred (fragGen). The statistics are
// exactly those newFragStats would compute, so no score moves.
func (e *nodeEntry) fragBase(v *nodeView, used []usage, p *podInfo, w *weights) *fragStats {
	if p == nil || len(p.fragShapes) == 0 || p.fragGen.set == 0 {
		return nil
	}
	shapes := p.fragShapes
	old := e.frag.Load()
	if old != nil && old.usageGen == v.usageGen && old.gen == p.fragGen {
		return old.st
	}
	memo := &fragMemo{usageGen: v.usageGen, gen: p.fragGen, at: make([]int, len(shapes))}
	if old != nil && old.usageGen == v.usageGen && old.gen.set == p.fragGen.set {
		memo.st = old.permuted(shapes)
	} else {
		memo.st = newFragStats(v.model, used, shapes, w)
	}
	for k := range shapes {
		memo.at[shapes[k].slot] = k
	}
	// A measure of a newer generation may be replaced by this older one when two
	// cycles race: it is then measured again, never used for the wrong usage.
	e.frag.Store(memo)
	return memo.st
}

// permuted is the memo's statistics for shapes, the memo's set in another order.
func (memo *fragMemo) permuted(shapes []fragShape) *fragStats {
	old := memo.st
	n := len(shapes)
	st := &fragStats{free: old.free, total: old.total, fits: make([]int, n), small: make([]float64, n), mask: make([]uint64, n),
		elig: make([]float64, n), emask: make([]uint64, n), eligible: make([]int, n)}
	for k := range shapes {
		j := memo.at[shapes[k].slot]
		st.fits[k], st.small[k], st.mask[k] = old.fits[j], old.small[j], old.mask[j]
		st.elig[k], st.emask[k], st.eligible[k] = old.elig[j], old.emask[j], old.eligible[j]
	}
	return st
}

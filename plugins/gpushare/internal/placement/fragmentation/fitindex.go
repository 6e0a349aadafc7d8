// SPDX-License-Identifier: Apache-2.0

package fragmentation

import (
	"sort"
	"sync"
	"sync/atomic"

	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
)

// fitIndex answers which classes of a workload fit a device with one comparison per
// resource instead of one fits check per class: the classes ordered by the memory
// they need on a GPU of one size, and by the compute they need. The classes that fit
// a device are those among the first j by memory and the first k by compute, j and k
// counted by the device's free memory and compute: Fragmentation asks this for every
// candidate GPU of every node it scores, and per-class checks were most of its
// Filter+Score.
type fitIndex struct {
	memoryMiB int64
	// memNeed is the classes' memory needs on a GPU of memoryMiB, ascending;
	// memPrefix[j] the classes of the first j of them (len(memNeed)+1 entries).
	memNeed   []int64
	memPrefix []uint64
	// coreNeed and corePrefix are the same for compute, in percent of a GPU; a class
	// that reserves none needs 1 (a GPU whose compute is all reserved takes no one).
	coreNeed   []int64
	corePrefix []uint64
}

// fitIndexes are a workload's fit indexes per GPU memory size, built as sizes are
// met and shared by the snapshots of one set of classes (fragWorkload.gen).
type fitIndexes struct {
	classes []Class
	// plain are the classes without a model selection (they fit any non-MIG
	// device); selective lists the others, checked one by one.
	plain     uint64
	selective []int
	mu        sync.Mutex
	// bySize is an immutable list, replaced under mu when a size is added.
	bySize atomic.Pointer[[]*fitIndex]
}

// maxFitSizes bounds the GPU memory sizes indexed; sizes beyond are indexed on each
// use (a cluster has a handful).
const maxFitSizes = 64

// newFitIndexes indexes classes, or returns nil when there are more than 64 (fit
// masks are 64 bits; snapshots never have more, see maxSnapshotShapes).
func newFitIndexes(classes []Class) *fitIndexes {
	if len(classes) > 64 {
		return nil
	}
	x := &fitIndexes{classes: classes}
	for k := range classes {
		if len(classes[k].modelInclude) == 0 && len(classes[k].modelExclude) == 0 {
			x.plain |= 1 << uint(k)
		} else {
			x.selective = append(x.selective, k)
		}
	}
	return x
}

// forMemory is the index for GPUs of memoryMiB.
func (x *fitIndexes) forMemory(memoryMiB int64) *fitIndex {
	if l := x.bySize.Load(); l != nil {
		for _, ix := range *l {
			if ix.memoryMiB == memoryMiB {
				return ix
			}
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	var list []*fitIndex
	if l := x.bySize.Load(); l != nil {
		list = *l
		for _, ix := range list {
			if ix.memoryMiB == memoryMiB {
				return ix
			}
		}
	}
	ix := buildFitIndex(x.classes, memoryMiB)
	if len(list) < maxFitSizes {
		next := append(list[:len(list):len(list)], ix)
		x.bySize.Store(&next)
	}
	return ix
}

func buildFitIndex(classes []Class, memoryMiB int64) *fitIndex {
	n := len(classes)
	ix := &fitIndex{memoryMiB: memoryMiB}
	mem, cores := make([]int64, n), make([]int64, n)
	for k := range classes {
		mem[k] = classes[k].C.MemoryOn(memoryMiB)
		cores[k] = int64(max(classes[k].C.Cores, 1))
	}
	ix.memNeed, ix.memPrefix = prefixes(mem)
	ix.coreNeed, ix.corePrefix = prefixes(cores)
	return ix
}

// prefixes orders need ascending and returns it with the masks of its first j
// classes, j = 0..len(need).
func prefixes(need []int64) ([]int64, []uint64) {
	order := make([]int, len(need))
	for k := range order {
		order[k] = k
	}
	sort.SliceStable(order, func(a, b int) bool { return need[order[a]] < need[order[b]] })
	sorted, masks := make([]int64, len(need)), make([]uint64, len(need)+1)
	for j, k := range order {
		sorted[j] = need[k]
		masks[j+1] = masks[j] | 1<<uint(k)
	}
	return sorted, masks
}

// atMost is how many of the ascending needs are at most v.
func atMost(needs []int64, v int64) int {
	lo, hi := 0, len(needs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if needs[mid] <= v {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// fitMask is the set of classes (bit k for class k) that fit device i of m under
// used: ShapeFits for each class at once.
func (x *fitIndexes) fitMask(m *nodemodel.Model, used []placement.Usage, i int, w *placement.Weights) uint64 {
	d := &m.Hot[i]
	u := &used[i]
	// As placement.Fits: the tenant limit, and an MPS GPU's client limit.
	if !d.Healthy || u.Tenants >= w.MaxTenants || (m.HasMPS && !placement.MPSRoom(m, u, i)) {
		return 0
	}
	ix := x.forMemory(d.MemoryMiB)
	fit := ix.memPrefix[atMost(ix.memNeed, d.MemoryMiB-u.MemMiB)] & ix.corePrefix[atMost(ix.coreNeed, int64(100-u.Cores))]
	// Classes whose memory on the device is below the node's charge for a CUDA
	// context never fit it (placement.Fits). An MPS client's charge is at most the
	// plain one, so a smallest need at or above that rules them all out at once.
	if len(ix.memNeed) > 0 && ix.memNeed[0] < m.ContextMiB {
		fit &^= x.belowCharge(m, ix, i)
	}
	return fit & x.eligibleMask(m, i)
}

// belowCharge is the set of classes whose memory on device i of m, of ix's size, is
// below the node's charge for one of their CUDA contexts.
func (x *fitIndexes) belowCharge(m *nodemodel.Model, ix *fitIndex, i int) uint64 {
	if !m.HasMPS || !m.Devices[i].MPS {
		return ix.memPrefix[atMost(ix.memNeed, m.ContextMiB-1)]
	}
	// An MPS client's charge follows its cores, so it is one per class.
	var below uint64
	for k := range x.classes {
		if c := &x.classes[k].C; c.MemoryOn(ix.memoryMiB) < m.ContextCharge(i, c.Cores) {
			below |= 1 << uint(k)
		}
	}
	return below
}

// eligibleMask is the set of classes whose model selection admits device i of m,
// whatever its health and usage.
func (x *fitIndexes) eligibleMask(m *nodemodel.Model, i int) uint64 {
	var eligible uint64
	if !m.Hot[i].MIG {
		eligible = x.plain
	}
	for _, k := range x.selective {
		if x.classes[k].EligibleAt(m, i) {
			eligible |= 1 << uint(k)
		}
	}
	return eligible
}

// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"hash/maphash"
	"sync/atomic"
	"unsafe"

	v1 "k8s.io/api/core/v1"
)

// nodeTable maps node names to cache entries for readers that take no lock: Filter,
// Score and PreScore look up a node on every core at once, for every node of every
// GPU pod. Writers (node added or removed) are serialised by the cache's lock.
//
// It is an open-addressing table with linear probing over one array of (hash, entry)
// slots. On a large cluster a lookup is a cache miss wherever it goes: here it reads
// one slot (usually) and the entry it finds, which the caller reads anyway; a
// sync.Map walks a trie of several nodes and compares boxed keys (in B2 its lookups
// were more than half of the plugin's CPU).
//
// A slot is filled once (hash, then entry, both atomic, so a reader that sees the
// entry sees its hash) and emptied only by marking it removed, so probe chains stay
// intact. The table is rebuilt, twice as large as its live entries need, when half
// its slots have been used, and readers switch to the new array atomically.
type nodeTable struct {
	cur  atomic.Pointer[tableArray]
	live int // entries not removed; writers only
	used int // slots ever filled in cur; writers only
}

type tableArray struct {
	mask  uint64
	slots []tableSlot
}

type tableSlot struct {
	hash  atomic.Uint64
	entry atomic.Pointer[NodeEntry]
}

// removed marks a slot whose entry was deleted.
var removed = &NodeEntry{}

var nodeHashSeed = maphash.MakeSeed()

func HashNodeName(name string) uint64 { return maphash.String(nodeHashSeed, name) }

// load returns the entry for name, or nil. Safe with concurrent writers.
func (t *nodeTable) load(name string) *NodeEntry {
	a := t.cur.Load()
	if a == nil {
		return nil
	}
	h := HashNodeName(name)
	for i := h & a.mask; ; i = (i + 1) & a.mask {
		s := &a.slots[i]
		e := s.entry.Load()
		if e == nil {
			return nil
		}
		if e != removed && s.hash.Load() == h && e.name == name {
			return e
		}
	}
}

// store adds e under its name, which the table must not hold. Writers only.
func (t *nodeTable) store(e *NodeEntry) {
	a := t.cur.Load()
	if a == nil || 2*(t.used+1) > len(a.slots) {
		a = t.rebuild(t.live + 1)
	}
	put(a, HashNodeName(e.name), e)
	t.used++
	t.live++
}

// remove deletes name's entry, if any. Writers only.
func (t *nodeTable) remove(name string) {
	a := t.cur.Load()
	if a == nil {
		return
	}
	h := HashNodeName(name)
	for i := h & a.mask; ; i = (i + 1) & a.mask {
		s := &a.slots[i]
		e := s.entry.Load()
		if e == nil {
			return
		}
		if e != removed && s.hash.Load() == h && e.name == name {
			s.entry.Store(removed)
			t.live--
			return
		}
	}
}

// rebuild publishes a new array for at least n live entries, holding the current
// live ones, and returns it. Writers only.
func (t *nodeTable) rebuild(n int) *tableArray {
	size := 16
	for size < 4*n {
		size *= 2
	}
	na := &tableArray{mask: uint64(size - 1), slots: make([]tableSlot, size)}
	used := 0
	if old := t.cur.Load(); old != nil {
		for i := range old.slots {
			if e := old.slots[i].entry.Load(); e != nil && e != removed {
				put(na, old.slots[i].hash.Load(), e)
				used++
			}
		}
	}
	t.cur.Store(na)
	t.used, t.live = used, used
	return na
}

// put fills the first empty slot of h's probe chain.
func put(a *tableArray, h uint64, e *NodeEntry) {
	for i := h & a.mask; ; i = (i + 1) & a.mask {
		s := &a.slots[i]
		if s.entry.Load() == nil {
			s.hash.Store(h)
			s.entry.Store(e)
			return
		}
	}
}

// each calls f for every entry. Safe with concurrent writers: an entry added or
// removed meanwhile may or may not be seen.
func (t *nodeTable) each(f func(*NodeEntry)) {
	a := t.cur.Load()
	if a == nil {
		return
	}
	for i := range a.slots {
		if e := a.slots[i].entry.Load(); e != nil && e != removed {
			f(e)
		}
	}
}

// objectHints finds a node's cache entry from the node object itself, without reading
// its name: Filter and Score look up every node of every GPU pod, and hashing the
// name meant a memory miss on the name's bytes (the node object's first line is read
// by the framework's own Filter plugins; the name's bytes are elsewhere) and often a
// second one comparing the entry's name. A slot is picked by the object's address and
// holds an entry, a hint that the lookup confirms by the entry's seen object (which
// EntryView sets once the entry matches that object's annotations, and every change
// of the entry clears): an object the entry's seen still references cannot be freed,
// so its address names no other object meanwhile. Slots are overwritten freely by
// concurrent readers (any entry stored is only a hint); the array grows with the
// node table.
type objectHints struct {
	cur atomic.Pointer[hintArray]
}

type hintArray struct {
	shift uint
	slots []atomic.Pointer[NodeEntry]
}

// slot is the slot of node's address in a.
func (a *hintArray) slot(node *v1.Node) *atomic.Pointer[NodeEntry] {
	// Fibonacci hashing of the address; objects are at least 8-byte aligned.
	h := uint64(uintptr(unsafe.Pointer(node))) * 0x9E3779B97F4A7C15
	return &a.slots[h>>a.shift]
}

// load returns the entry whose seen object is node, when the hint for node's
// address names it; else nil.
func (t *objectHints) load(node *v1.Node) *NodeEntry {
	a := t.cur.Load()
	if a == nil {
		return nil
	}
	if e := a.slot(node).Load(); e != nil && e.seen.Load() == node {
		return e
	}
	return nil
}

// store records e as the hint for node (e.seen is node).
func (t *objectHints) store(node *v1.Node, e *NodeEntry) {
	if a := t.cur.Load(); a != nil {
		a.slot(node).Store(e)
	}
}

// resize makes room for n nodes (four slots each, so that few objects share a slot)
// when the array has less. Writers only (the cache's lock); the new array starts
// empty and fills as lookups miss.
func (t *objectHints) resize(n int) {
	size, shift := 16, uint(60)
	for size < 4*n {
		size *= 2
		shift--
	}
	if a := t.cur.Load(); a != nil && len(a.slots) >= size {
		return
	}
	t.cur.Store(&hintArray{shift: shift, slots: make([]atomic.Pointer[NodeEntry], size)})
}

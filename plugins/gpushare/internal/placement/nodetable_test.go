// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placementtest"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// Readers without a lock always find every node that was added and not removed,
// never one that was removed, while a writer adds, removes and grows the table.
func TestNodeTable(t *testing.T) {
	var tab nodeTable
	if tab.load("none") != nil {
		t.Fatal("an empty table found a node")
	}
	const n = 3000
	entries := make([]*NodeEntry, n)
	for i := range entries {
		entries[i] = &NodeEntry{name: fmt.Sprintf("node-%d", i)}
	}
	// The first half is stored before the readers start and never removed.
	for _, e := range entries[:n/2] {
		tab.store(e)
	}
	var stop atomic.Bool
	var wrong atomic.Int64
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for k := 0; !stop.Load(); k++ {
				e := entries[(k*7+r)%(n/2)]
				if tab.load(e.name) != e {
					wrong.Add(1)
				}
				if got := tab.load(fmt.Sprintf("absent-%d", k%50)); got != nil {
					wrong.Add(1)
				}
			}
		}(r)
	}
	// The writer adds the second half, removes every other of it, and adds those again.
	for _, e := range entries[n/2:] {
		tab.store(e)
	}
	for i := n / 2; i < n; i += 2 {
		tab.remove(entries[i].name)
	}
	for i := n / 2; i < n; i += 2 {
		if tab.load(entries[i].name) != nil {
			t.Fatalf("%s found after its removal", entries[i].name)
		}
		tab.store(entries[i])
	}
	stop.Store(true)
	wg.Wait()
	if w := wrong.Load(); w > 0 {
		t.Fatalf("%d lookups without a lock gave a wrong answer", w)
	}
	for _, e := range entries {
		if tab.load(e.name) != e {
			t.Fatalf("%s not found", e.name)
		}
	}
	if tab.live != n {
		t.Fatalf("live %d, want %d", tab.live, n)
	}
	tab.remove("never-added")
	if a := tab.cur.Load(); 2*tab.used > len(a.slots) {
		t.Fatalf("%d of %d slots used: the table must keep half free", tab.used, len(a.slots))
	}
}

// A node object finds its entry through the hints once the cache has matched the
// entry to it, and a hint never names an entry for an object it no longer matches: a
// newer object of the node (another annotation), or one whose node was removed.
func TestObjectHints(t *testing.T) {
	c := NewCache()
	const n = 200
	nodes := make([]*v1.Node, n)
	for i := range nodes {
		nodes[i] = placementtest.H100(t, fmt.Sprintf("n%d", i))
		c.SetInventory(nodes[i].Name, nodes[i].Annotations[api.AnnotationInventory])
	}
	for _, node := range nodes {
		if c.hints.load(node) != nil {
			t.Fatalf("%s: a hint before any view", node.Name)
		}
		e, _, _ := c.EntryView(node, nil)
		if e != c.existing(node.Name) || c.ExistingFor(node) != e {
			t.Fatalf("%s: entryView and existingFor disagree with the name's entry", node.Name)
		}
	}
	hits := 0
	for _, node := range nodes {
		if e := c.hints.load(node); e != nil {
			if e.name != node.Name {
				t.Fatalf("%s: hint names %s", node.Name, e.name)
			}
			hits++
		}
	}
	// Objects sharing a slot evict each other's hints; with four slots a node, few do.
	if hits < n*3/4 {
		t.Fatalf("%d of %d nodes found through their hint", hits, n)
	}
	// A newer object with another inventory: the old object's hint no longer matches.
	old := nodes[0]
	newer := old.DeepCopy()
	newer.Annotations[api.AnnotationInventory] = placementtest.Node(t, old.Name, fixtures.PCIeNode(old.Name, 2, "NVIDIA A10", fixtures.T4MiB)).Annotations[api.AnnotationInventory]
	e, v, _ := c.EntryView(newer, nil)
	if len(v.Model.Devices) != 2 || c.ExistingFor(newer) != e {
		t.Fatalf("newer object: %d devices", len(v.Model.Devices))
	}
	if c.hints.load(old) != nil {
		t.Fatal("the old object still finds the entry through its hint")
	}
	// A removed node: its object's hint no longer matches, and a lookup by that object
	// finds what a lookup by name does.
	gone := nodes[1]
	c.RemoveNode(gone.Name)
	if c.hints.load(gone) != nil || c.ExistingFor(gone) != nil {
		t.Fatal("a removed node is still found through its object")
	}
}

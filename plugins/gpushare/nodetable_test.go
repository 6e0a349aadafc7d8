package gpushare

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// Readers without a lock always find every node that was added and not removed,
// never one that was removed, while a writer adds, removes and grows the table.
func TestNodeTable(t *testing.T) {
	var tab nodeTable
	if tab.load("none") != nil {
		t.Fatal("an empty table found a node")
	}
	const n = 3000
	entries := make([]*nodeEntry, n)
	for i := range entries {
		entries[i] = &nodeEntry{name: fmt.Sprintf("node-%d", i)}
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

// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
)

// The feed applies each node's events in order, whatever shard they land on, and
// caughtUp answers true only once every event pushed before mark has been applied.
func TestNodeFeedAppliesEachNodesEventsInOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := placement.NewCache()
	f := newNodeFeed()
	const n = 300
	inv := func(i, gpus int) string {
		return makeNode(t, fmt.Sprintf("n%d", i), pcieInventory(fmt.Sprintf("n%d", i), gpus, "Tesla T4", t4Mem)).Annotations[api.AnnotationInventory]
	}
	// Every node is added with one GPU and updated to two; every third is then
	// deleted, every sixth added again with three.
	for i := 0; i < n; i++ {
		f.push(nodeEvent{name: fmt.Sprintf("n%d", i), inventory: inv(i, 1)})
	}
	for i := 0; i < n; i++ {
		f.push(nodeEvent{name: fmt.Sprintf("n%d", i), inventory: inv(i, 2)})
		if i%3 == 0 {
			f.push(nodeEvent{name: fmt.Sprintf("n%d", i), deleted: true})
		}
		if i%6 == 0 {
			f.push(nodeEvent{name: fmt.Sprintf("n%d", i), inventory: inv(i, 3)})
		}
	}
	f.mark()
	if f.caughtUp() {
		t.Fatal("caught up before the feed ran")
	}
	f.run(ctx, c)
	deadline := time.Now().Add(10 * time.Second)
	for !f.caughtUp() {
		if time.Now().After(deadline) {
			t.Fatal("the feed did not catch up")
		}
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("n%d", i)
		u, err := c.NodeUsage(name)
		switch {
		case i%6 == 0:
			if err != nil || len(u) != 3 {
				t.Fatalf("%s: %d GPUs (%v), want 3 (added again)", name, len(u), err)
			}
		case i%3 == 0:
			if err == nil {
				t.Fatalf("%s: %d GPUs, want none (deleted)", name, len(u))
			}
		default:
			if err != nil || len(u) != 2 {
				t.Fatalf("%s: %d GPUs (%v), want 2 (updated)", name, len(u), err)
			}
		}
	}
	// Events after mark do not hold caughtUp back.
	f.push(nodeEvent{name: "late", inventory: inv(n, 1)})
	if !f.caughtUp() {
		t.Fatal("an event pushed after mark held caughtUp back")
	}
}

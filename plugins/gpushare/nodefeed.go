// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"runtime"
	"sync"
	"sync/atomic"
)

// nodeFeed applies the node informer's events to the cache on several goroutines.
// Decoding an inventory annotation costs ~0.1 ms; the informer delivers a
// registration's events on one goroutine, so a scheduler starting on 5,000 nodes spent
// 0.7 s decoding them one after the other, and GPU pods failed PreFilter ("the GPU
// cache has not synced") until it was done. Events are spread over shards by node
// name, so that one node's events still apply in order, and each shard applies its
// own in order on its goroutine.
//
// caughtUp reports whether every event pushed before the moment it first answered
// true for (see mark) has been applied: the node registration's "synced" then means
// what it meant when the handler applied events itself.
type nodeFeed struct {
	shards []feedShard
}

type feedShard struct {
	mu     sync.Mutex
	queue  []nodeEvent
	wake   chan struct{}
	pushed atomic.Int64
	done   atomic.Int64
	// target is pushed at the moment the feed was marked (0 before): the shard is
	// caught up once done reaches it.
	target atomic.Int64
}

// nodeEvent is a node's annotations as an event carried them, or its deletion.
type nodeEvent struct {
	name, inventory, requirements string
	deleted                       bool
}

func newNodeFeed() *nodeFeed {
	n := min(runtime.GOMAXPROCS(0), 16)
	f := &nodeFeed{shards: make([]feedShard, n)}
	for i := range f.shards {
		f.shards[i].wake = make(chan struct{}, 1)
	}
	return f
}

// push queues ev on its node's shard.
func (f *nodeFeed) push(ev nodeEvent) {
	s := &f.shards[placement.HashNodeName(ev.name)%uint64(len(f.shards))]
	s.mu.Lock()
	s.queue = append(s.queue, ev)
	s.pushed.Add(1)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run applies the shards' events to c until ctx is done.
func (f *nodeFeed) run(ctx context.Context, c *placement.Cache) {
	for i := range f.shards {
		go f.shards[i].run(ctx, c)
	}
}

func (s *feedShard) run(ctx context.Context, c *placement.Cache) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			batch := s.queue
			s.queue = nil
			s.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			for _, ev := range batch {
				if ev.deleted {
					c.RemoveNode(ev.name)
				} else {
					c.SetInventory(ev.name, ev.inventory)
					c.SetRequirements(ev.name, ev.requirements)
				}
				s.done.Add(1)
			}
		}
	}
}

// mark records, once per shard, how many events it has been given: caughtUp waits
// for those. sharedCache's synced calls it once the informer's registrations report
// synced, so that the initial list's events are all counted.
func (f *nodeFeed) mark() {
	for i := range f.shards {
		s := &f.shards[i]
		s.mu.Lock()
		if s.target.Load() == 0 {
			t := s.pushed.Load()
			if t == 0 {
				t = -1 // nothing to wait for
			}
			s.target.Store(t)
		}
		s.mu.Unlock()
	}
}

// caughtUp reports whether every shard has applied the events it had when marked.
func (f *nodeFeed) caughtUp() bool {
	for i := range f.shards {
		s := &f.shards[i]
		t := s.target.Load()
		if t == 0 || (t > 0 && s.done.Load() < t) {
			return false
		}
	}
	return true
}

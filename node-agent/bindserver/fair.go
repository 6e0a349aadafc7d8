// SPDX-License-Identifier: Apache-2.0

package bindserver

import (
	"context"
	"slices"
	"sync"
)

// fairSlots shares the server's slots (callers being served at once) among
// containers: at most perMax for any one container, and a freed slot goes to the
// next container in turn that has a caller waiting, so a container with many callers
// waits behind its own, not in front of the others. It also counts each container's
// open connections, which the server bounds.
type fairSlots struct {
	mu     sync.Mutex
	free   int
	perMax int
	groups map[string]*slotGroup
	// turn holds the containers with callers waiting, in the order they are served;
	// a container goes to the back each time it is given a slot.
	turn []string
}

type slotGroup struct {
	open    int
	active  int
	waiting []chan struct{}
}

func newFairSlots(total, perMax int) *fairSlots {
	return &fairSlots{free: total, perMax: perMax, groups: map[string]*slotGroup{}}
}

// enter counts a new connection of a container; it returns false, counting nothing,
// when the container already holds maxOpen.
func (f *fairSlots) enter(key string, maxOpen int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.groups[key]
	if g == nil {
		g = &slotGroup{}
		f.groups[key] = g
	}
	if g.open >= maxOpen {
		return false
	}
	g.open++
	return true
}

// leave uncounts a connection that enter counted.
func (f *fairSlots) leave(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.groups[key]
	if g == nil {
		return
	}
	g.open--
	if g.open <= 0 && g.active == 0 && len(g.waiting) == 0 {
		delete(f.groups, key)
	}
}

// acquire waits for a slot for the container until ctx is done; true when it got
// one, which release gives back.
func (f *fairSlots) acquire(ctx context.Context, key string) bool {
	ch := make(chan struct{})
	f.mu.Lock()
	g := f.groups[key]
	if g == nil {
		g = &slotGroup{}
		f.groups[key] = g
	}
	g.waiting = append(g.waiting, ch)
	if len(g.waiting) == 1 {
		f.turn = append(f.turn, key)
	}
	f.dispatch()
	f.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-ch:
		// Given a slot while ctx ended: hand it on.
		f.releaseLocked(key)
		return false
	default:
	}
	if i := slices.Index(g.waiting, ch); i >= 0 {
		g.waiting = slices.Delete(g.waiting, i, i+1)
		if len(g.waiting) == 0 {
			f.dropTurn(key)
		}
	}
	return false
}

// release gives back a slot acquire returned.
func (f *fairSlots) release(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releaseLocked(key)
}

func (f *fairSlots) releaseLocked(key string) {
	if g := f.groups[key]; g != nil && g.active > 0 {
		g.active--
		f.free++
	}
	f.dispatch()
}

// dispatch gives free slots to waiting callers, one container at a time in turn.
// Called with mu held.
func (f *fairSlots) dispatch() {
	for f.free > 0 {
		i := slices.IndexFunc(f.turn, func(k string) bool { return f.groups[k].active < f.perMax })
		if i < 0 {
			return
		}
		key := f.turn[i]
		g := f.groups[key]
		ch := g.waiting[0]
		g.waiting = g.waiting[1:]
		g.active++
		f.free--
		close(ch)
		f.turn = slices.Delete(f.turn, i, i+1)
		if len(g.waiting) > 0 {
			f.turn = append(f.turn, key)
		}
	}
}

func (f *fairSlots) dropTurn(key string) {
	if i := slices.Index(f.turn, key); i >= 0 {
		f.turn = slices.Delete(f.turn, i, i+1)
	}
}

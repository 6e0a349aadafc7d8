// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"context"
	"reflect"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// The in-tree plugin counts a claim's consumed capacity twice while the claim is both
// in flight (allocated in Reserve, its pending allocation not yet dropped at the end of
// PreBind) and observed allocated (PreBind has written it and the claim tracker has seen
// it): GatherAllocatedState adds the in-flight claims' capacities to the observed ones
// without asking whether a claim is among both. Shares that fill a device together (30
// and 70 cores) then refuse the second pod for as long as the first one's PreBind runs
// (a short window, or minutes while it waits for binding conditions), and nothing wakes
// the refused pod when the window closes: dropping a pending allocation is no cluster
// event, and the claim update it saw before ("allocation added", another pod's claim)
// is one its queueing hint skips. It waited for the queue's periodic flush (5 minutes).
//
// The tracker's state cannot be corrected from outside without racing its informer
// (a claim seen in the cache is not yet in the tracker's sums), so the plugin wakes
// the pods instead: a pod with claims whose PreFilter runs while another pod's claims
// are in flight is remembered, and when an in-flight pod leaves (its PreBind succeeded,
// or Unreserve gave its allocation back) the remembered pods are activated. A pod still
// in its scheduling cycle then is requeued when the cycle fails (the queue records the
// activation); one that was placed is not in the queue and is ignored. A remembered pod
// that failed for another reason (no GPU has room) retries after pods leave flight while
// it waits, so a burst of binds would retry it once per bind: a pod is activated at most
// once per activateEvery (the scheduler's first backoff), the later ones by a timer.

// activateEvery is the least time between two activations of one pod.
const activateEvery = time.Second

// inFlightHorizon bounds how long a pod is counted in flight: longer than the in-tree
// plugin's longest binding-condition wait (10 minutes by default), so only a pod whose
// PreBind and Unreserve were both never called (no claim for the in-tree plugin to
// bind) is dropped by it.
const inFlightHorizon = 15 * time.Minute

// activator is the scheduling queue's activation, the framework handle's Activate.
type activator interface {
	Activate(logger klog.Logger, pods map[string]*v1.Pod)
}

// requeue remembers the pods that met another pod's in-flight claims and wakes them
// when that pod leaves flight.
type requeue struct {
	act   activator
	now   func() time.Time
	after func(time.Duration, func()) // time.AfterFunc; tests replace it

	mu        sync.Mutex
	inFlight  map[types.UID]time.Time // pods between Reserve and PreBind's success or Unreserve
	waiting   map[types.UID]*v1.Pod   // pods whose PreFilter ran while another was in flight
	due       map[types.UID]*v1.Pod   // pods to activate once activateEvery has passed
	activated map[types.UID]time.Time // when each pod of due or waiting was last activated
	timer     bool                    // a timer for due is set
	logger    klog.Logger             // the last caller's, for the timer
}

// requeues holds one requeue per scheduler, keyed by its DRA manager, which every
// profile of a scheduler shares: the in-tree claim tracker, and so the double count,
// spans the profiles, and a pod of one profile may meet the claims of another's pod
// in flight. Every profile's handle activates in the same scheduling queue.
var requeues sync.Map

// requeueFor is the requeue of h's scheduler, forgotten once ctx (the scheduler's,
// which every profile's plugin is built with) ends: a process that runs schedulers one
// after another (tests, an embedding program) keeps none of the ended ones.
func requeueFor(ctx context.Context, h fwk.Handle) *requeue {
	mgr := h.SharedDRAManager()
	if t := reflect.TypeOf(mgr); t == nil || !t.Comparable() {
		return newRequeue(h)
	}
	r, loaded := requeues.LoadOrStore(mgr, newRequeue(h))
	if !loaded {
		context.AfterFunc(ctx, func() { requeues.CompareAndDelete(mgr, r) })
	}
	return r.(*requeue)
}

func newRequeue(act activator) *requeue {
	return &requeue{act: act, now: time.Now, after: func(d time.Duration, f func()) { time.AfterFunc(d, f) },
		inFlight: map[types.UID]time.Time{}, waiting: map[types.UID]*v1.Pod{}, due: map[types.UID]*v1.Pod{},
		activated: map[types.UID]time.Time{}}
}

// preFilter remembers pod when another pod is in flight.
func (r *requeue) preFilter(pod *v1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	for uid, since := range r.inFlight {
		if now.Sub(since) > inFlightHorizon {
			delete(r.inFlight, uid)
		}
	}
	for uid := range r.inFlight {
		if uid != pod.UID {
			r.waiting[pod.UID] = pod
			return
		}
	}
}

// reserved counts pod in flight: its claims were allocated in memory.
func (r *requeue) reserved(pod *v1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiting, pod.UID)
	delete(r.due, pod.UID)
	delete(r.activated, pod.UID)
	r.inFlight[pod.UID] = r.now()
}

// left ends pod's flight (idempotent) and activates the pods that waited, each at most
// once per activateEvery.
func (r *requeue) left(logger klog.Logger, pod *v1.Pod) {
	r.mu.Lock()
	if _, ok := r.inFlight[pod.UID]; !ok {
		r.mu.Unlock()
		return
	}
	delete(r.inFlight, pod.UID)
	for uid, p := range r.waiting {
		r.due[uid] = p
		delete(r.waiting, uid)
	}
	r.logger = logger
	wake, wait := r.takeDue()
	r.mu.Unlock()
	r.activate(logger, pod, wake)
	if wait > 0 {
		r.after(wait, r.flush)
	}
}

// flush activates the due pods whose time has come (the timer left set).
func (r *requeue) flush() {
	r.mu.Lock()
	r.timer = false
	logger := r.logger
	wake, wait := r.takeDue()
	r.mu.Unlock()
	r.activate(logger, nil, wake)
	if wait > 0 {
		r.after(wait, r.flush)
	}
}

// takeDue takes the due pods last activated at least activateEvery ago, and says how
// long until the next of the others where no timer is set for them yet (caller holds
// r.mu).
func (r *requeue) takeDue() (map[string]*v1.Pod, time.Duration) {
	now := r.now()
	var wake map[string]*v1.Pod
	var next time.Duration
	for uid, p := range r.due {
		if last, ok := r.activated[uid]; ok && now.Sub(last) < activateEvery {
			if d := activateEvery - now.Sub(last); next == 0 || d < next {
				next = d
			}
			continue
		}
		if wake == nil {
			wake = map[string]*v1.Pod{}
		}
		wake[p.Namespace+"/"+p.Name] = p
		r.activated[uid] = now
		delete(r.due, uid)
	}
	// A pod activated long ago that no longer waits is forgotten.
	for uid, last := range r.activated {
		if _, ok := r.due[uid]; !ok && now.Sub(last) >= activateEvery {
			if _, ok := r.waiting[uid]; !ok {
				delete(r.activated, uid)
			}
		}
	}
	if next > 0 && !r.timer {
		r.timer = true
		return wake, next
	}
	return wake, 0
}

func (r *requeue) activate(logger klog.Logger, left *v1.Pod, wake map[string]*v1.Pod) {
	if len(wake) == 0 || r.act == nil {
		return
	}
	logger.V(4).Info("Claims no longer in flight: activating the pods that met them", "pod", klog.KObj(left), "activated", len(wake))
	r.act.Activate(logger, wake)
}

// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
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
// that failed for another reason retries once per in-flight pod that leaves after its
// attempt, and is remembered again only if another pod is in flight at its retry.

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
	act activator
	now func() time.Time

	mu       sync.Mutex
	inFlight map[types.UID]time.Time // pods between Reserve and PreBind's success or Unreserve
	waiting  map[types.UID]*v1.Pod   // pods whose PreFilter ran while another was in flight
}

func newRequeue(act activator) *requeue {
	return &requeue{act: act, now: time.Now, inFlight: map[types.UID]time.Time{}, waiting: map[types.UID]*v1.Pod{}}
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
	r.inFlight[pod.UID] = r.now()
}

// left ends pod's flight (idempotent) and activates the pods that waited.
func (r *requeue) left(logger klog.Logger, pod *v1.Pod) {
	r.mu.Lock()
	if _, ok := r.inFlight[pod.UID]; !ok {
		r.mu.Unlock()
		return
	}
	delete(r.inFlight, pod.UID)
	var wake map[string]*v1.Pod
	if len(r.waiting) > 0 {
		wake = make(map[string]*v1.Pod, len(r.waiting))
		for uid, p := range r.waiting {
			wake[p.Namespace+"/"+p.Name] = p
			delete(r.waiting, uid)
		}
	}
	r.mu.Unlock()
	if len(wake) > 0 && r.act != nil {
		logger.V(4).Info("Claims no longer in flight: activating the pods that met them", "pod", klog.KObj(pod), "activated", len(wake))
		r.act.Activate(logger, wake)
	}
}

// SPDX-License-Identifier: Apache-2.0

package watchdog

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tessera-dev/tessera/node-agent/checkpoint"
)

// Escalation, with the kill action only. The first time a container is acted on for
// memory, its processes on that GPU are ended. That does not end a supervisor that
// respawns its worker, nor the next container the kubelet starts in its place, so
// the pod is remembered for EscalationWindow after each action:
//
//   - a container of that pod seen over its limit again (a single pass: no grace) is
//     stopped: every process of its cgroup is ended, on the GPU or not;
//   - once EvictAfter stops of the pod's containers fall within EscalationWindow, the
//     pod is evicted through the Eviction API. An eviction that is refused (a
//     PodDisruptionBudget, the API server unreachable) is retried with a backoff
//     doubling from EvictRetry to MaxEvictRetry, and meanwhile every container of the
//     pod is stopped again whenever a pass finds it over.

// Escalation defaults, shared with the agent's flags.
const (
	// DefaultEscalationWindow is how long a pod is remembered after a memory kill or
	// stop. It is longer than the kubelet's restart backoff reaches within a few
	// restarts (10 s, 20 s, 40 s, …), so a container that comes back over its grant is
	// still remembered when it does.
	DefaultEscalationWindow = 10 * time.Minute
	// DefaultEvictAfter is the number of container stops within the escalation window
	// after which the pod is evicted.
	DefaultEvictAfter = 3
	// EvictRetry and MaxEvictRetry bound the backoff between refused evictions.
	EvictRetry    = 10 * time.Second
	MaxEvictRetry = 5 * time.Minute
)

// podEscalation is what the watchdog remembers of one pod.
type podEscalation struct {
	rec checkpoint.Record
	// acted holds the times of the memory kills and stops within the window; stops
	// the stops alone.
	acted, stops []time.Time
	// evict is set once the eviction rule is met; evicted once the API server took
	// the eviction. next and backoff pace the retries of a refused one.
	evict, evicted bool
	next           time.Time
	backoff        time.Duration
}

func podKey(r checkpoint.Record) string {
	if r.PodUID != "" {
		return r.PodUID
	}
	return r.Namespace + "/" + r.Pod
}

// prune forgets actions older than the window and reports whether nothing is left to
// remember.
func (p *podEscalation) prune(now time.Time, window time.Duration) bool {
	cut := now.Add(-window)
	keep := func(ts []time.Time) []time.Time {
		i := 0
		for i < len(ts) && !ts[i].After(cut) {
			i++
		}
		return ts[i:]
	}
	p.acted, p.stops = keep(p.acted), keep(p.stops)
	return len(p.acted) == 0 && (!p.evict || p.evicted)
}

// escalation returns the pod's record of recent actions, nil when it has none.
func (w *Watchdog) escalation(r checkpoint.Record) *podEscalation {
	if w.cfg.Action != ActionKill {
		return nil
	}
	return w.pods[podKey(r)]
}

// struck records a memory action against the pod of r.
func (w *Watchdog) struck(r checkpoint.Record, now time.Time) *podEscalation {
	k := podKey(r)
	p := w.pods[k]
	if p == nil {
		p = &podEscalation{rec: r}
		w.pods[k] = p
	}
	p.acted = append(p.acted, now)
	return p
}

// stop ends every process of the container of cu, which is over its memory limit
// again after an earlier action against its pod, and counts the stop toward the
// pod's eviction.
func (w *Watchdog) stop(cu *Usage, p *podEscalation, now time.Time) {
	r := cu.Record
	last := p.acted[len(p.acted)-1]
	var killed []string
	// A process forked while the container is being ended escapes one scan: scan
	// again until a scan finds nothing left (the container's init usually takes the
	// rest of its PID namespace with it at once). Never the agent itself: a record
	// whose cgroup is the root, or the agent's own, is not a container to stop. A
	// claim's record stops each container of the claim that has a process on the GPU.
	self, _ := CgroupOf(w.cfg.ProcRoot, os.Getpid())
	for _, cg := range w.containerCgroups(cu, self) {
		for round := 0; round < 3; round++ {
			pids := cgroupProcs(w.cfg.ProcRoot, cg)
			if len(pids) == 0 {
				break
			}
			for _, pid := range pids {
				if pid == os.Getpid() {
					continue
				}
				if err := w.cfg.Kill(pid); err != nil {
					w.cfg.Log.Error(err, "stopping a container over its limit", "pid", pid)
					continue
				}
				killed = append(killed, strconv.Itoa(pid))
			}
		}
	}
	what := fmt.Sprintf("holds %d MiB on GPU %s", cu.UsedMiB, cu.GPU)
	if cu.LimitMiB >= 0 {
		what = fmt.Sprintf("holds %d MiB on GPU %s, above its limit of %d MiB", cu.UsedMiB, cu.GPU, cu.LimitMiB)
	}
	msg := fmt.Sprintf("%s %s again, %s after its pod was last acted on for GPU memory (within the escalation window of %s): "+
		"the container is stopped, without a new grace", subject(r), what, now.Sub(last).Round(time.Second), w.cfg.EscalationWindow)
	if len(killed) > 0 {
		msg += "; ended every process of the container: " + strings.Join(killed, ",")
	} else {
		msg += "; no process was left to end"
	}
	msg += " (the CUDA hook was bypassed or failed)"
	p.acted = append(p.acted, now)
	p.stops = append(p.stops, now)
	w.cfg.Log.Info("watchdog action", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container, "gpu", cu.GPU,
		"resource", "memory", "action", "stop", "usedMiB", cu.UsedMiB, "limitMiB", cu.LimitMiB, "killed", killed, "stops", len(p.stops))
	if w.cfg.Event != nil {
		w.cfg.Event(r, "GPUMemoryOverLimitContainerStopped", msg)
	}
	if w.cfg.Metrics != nil {
		w.cfg.Metrics.WatchdogAction("stop", r.Namespace, r.Pod, r.Container)
	}
	if w.cfg.EvictAfter > 0 && !p.evict && len(p.stops) >= w.cfg.EvictAfter {
		p.evict, p.next, p.backoff = true, now, 0
	}
}

// evictions asks for the evictions that are due. The API call runs in the pass: it
// is rare, and the agent bounds it with a timeout.
func (w *Watchdog) evictions(now time.Time) {
	for k, p := range w.pods {
		if p.evict && !p.evicted && !now.Before(p.next) {
			w.evictPod(p, now)
		}
		if p.prune(now, w.cfg.EscalationWindow) {
			delete(w.pods, k)
		}
	}
}

func (w *Watchdog) evictPod(p *podEscalation, now time.Time) {
	r := p.rec
	rule := fmt.Sprintf("its containers were stopped %d times within %s for holding more GPU memory than granted "+
		"(the watchdog's rule: %d stops within the escalation window evict the pod)", len(p.stops), w.cfg.EscalationWindow, w.cfg.EvictAfter)
	if w.cfg.Evict == nil {
		p.evicted = true
		return
	}
	err := w.cfg.Evict(r)
	if err == nil {
		p.evicted = true
		w.cfg.Log.Info("watchdog action", "namespace", r.Namespace, "pod", r.Pod, "resource", "memory", "action", "evict", "stops", len(p.stops))
		if w.cfg.Event != nil {
			w.cfg.Event(r, "GPUPodEvicted", "pod evicted: "+rule)
		}
		if w.cfg.Metrics != nil {
			w.cfg.Metrics.WatchdogAction("evict", r.Namespace, r.Pod, "")
		}
		return
	}
	p.backoff = min(max(2*p.backoff, w.cfg.EvictRetry), w.cfg.MaxEvictRetry)
	p.next = now.Add(p.backoff)
	w.cfg.Log.Error(err, "evicting a pod over its GPU memory grant", "namespace", r.Namespace, "pod", r.Pod, "retryIn", p.backoff)
	if w.cfg.Event != nil {
		w.cfg.Event(r, "GPUPodEvictionRefused", fmt.Sprintf("the pod is to be evicted (%s), but the eviction failed: %v; "+
			"retrying in %s, and until then each of its containers is stopped whenever it is seen over its grant", rule, err, p.backoff))
	}
}

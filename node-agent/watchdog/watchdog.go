// SPDX-License-Identifier: Apache-2.0

// Package watchdog is the backstop behind the CUDA hook: it samples NVML's per-process
// memory and utilisation, maps each process to its container through the process's
// cgroup, sums per container and GPU, and acts on a container that holds more memory
// than its grant, or uses more of a GPU's SMs than its gpu-cores grant, as a process
// that bypassed the hook (static driver calls, raw ioctls) would.
//
// Memory: a container is acted on once the passes that found it over its grant (plus
// a tolerance) add up to Grace within the last Window, each such pass counting the
// time since the previous pass. A dip under the limit between passes does not reset
// that count: only a whole Window without being over does. A container that stays
// over is acted on within Grace + Interval of going over; one that is over a fraction
// f of the time is acted on once f × Window reaches Grace.
//
// Compute: the container's per-process SM utilisation, summed per GPU, is averaged
// over ComputeWindow (weighted by the time each pass covers); a container with a
// gpu-cores grant whose average stays above the grant plus ComputeTolerance points
// for a whole window is acted on. A container without a cores grant is never acted on
// for compute (its share is not enforced, as with time-slicing).
//
// With the kill action, memory escalates (escalate.go): a pod whose container was
// acted on has its containers stopped as a whole when they are over again, without a
// new grace, and is evicted after repeated stops. Memory NVML lists for a process
// that is gone, in another PID namespace or in no bound container is attributed by
// who holds the GPU's device files (devfiles.go); what cannot be attributed raises a
// Warning event on the Node.
//
// Every action is a Warning event on the pod and a metric; a kill also ends the
// container's processes on that GPU.
package watchdog

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/gpu"
	"github.com/tessera-dev/tessera/node-agent/health"
	"github.com/tessera-dev/tessera/node-agent/metrics"
)

// Action is what the watchdog does about a container over its limit.
type Action string

const (
	// ActionOff takes no action (compute only: memory is always acted on).
	ActionOff Action = "off"
	// ActionEvent records an event on the pod and counts it in a metric.
	ActionEvent Action = "event"
	// ActionKill also ends the container's processes on that GPU.
	ActionKill Action = "kill"
)

// Defaults, shared with the agent's flags.
const (
	DefaultInterval = 5 * time.Second
	// DefaultGrace is short: a process that bypasses the hook can take memory other
	// tenants were granted, and they fail while it holds it.
	DefaultGrace  = 15 * time.Second
	DefaultWindow = time.Minute
	// DefaultAction kills: an event alone leaves the other tenants of the GPU without
	// the memory they were granted.
	DefaultAction = ActionKill
	// DefaultComputeWindow is long enough that the hook's pacing (bursts at full
	// speed, then waits) and NVML's coarse per-process samples average out.
	DefaultComputeWindow = 2 * time.Minute
	// DefaultComputeTolerance is in percentage points of the GPU.
	DefaultComputeTolerance = 10
	// DefaultComputeAction records an event: compute overuse slows the other tenants
	// but takes nothing from them that they cannot get back, and NVML's per-process
	// utilisation is an estimate; operators who want it can choose kill.
	DefaultComputeAction = ActionEvent
)

// ParseAction parses the --watchdog-action flag (memory).
func ParseAction(s string) (Action, error) {
	switch a := Action(s); a {
	case ActionEvent, ActionKill:
		return a, nil
	}
	return "", fmt.Errorf("watchdog action %q is not event or kill", s)
}

// ParseComputeAction parses the --watchdog-compute-action flag.
func ParseComputeAction(s string) (Action, error) {
	switch a := Action(s); a {
	case ActionOff, ActionEvent, ActionKill:
		return a, nil
	}
	return "", fmt.Errorf("watchdog compute action %q is not off, event or kill", s)
}

// Config configures the watchdog.
type Config struct {
	Source  gpu.Source
	Records func() []checkpoint.Record
	// ProcRoot is the host's /proc (the agent runs in the host PID namespace, where
	// NVML's PIDs live).
	ProcRoot string
	Interval time.Duration
	// Grace is how much time over its memory limit, within Window, a container may
	// accumulate before the action.
	Grace time.Duration
	// Window is how far back time over the memory limit is remembered; at least
	// Grace. Default: DefaultWindow, or Grace when that is longer.
	Window time.Duration
	// ToleranceMiB is allowed above the grant before a container counts as over: NVML
	// counts some driver-internal memory that the hook cannot see.
	ToleranceMiB int64
	// Action is taken on memory over the limit: event or kill.
	Action Action
	// ComputeAction is taken on sustained compute overuse: off, event or kill.
	// Default DefaultComputeAction.
	ComputeAction Action
	// ComputeWindow is the span the SM utilisation is averaged over. Default
	// DefaultComputeWindow.
	ComputeWindow time.Duration
	// ComputeTolerance is allowed above the cores grant, in percentage points.
	ComputeTolerance int
	// MPSGPU reports whether the agent serves a GPU in mps sharing mode. There MPS
	// holds each client to its share of the SMs, so the SM average is not checked;
	// instead ComputeAction is taken on a container process that uses the GPU with a
	// CUDA context of its own, outside the MPS server (mps.go). Nil: no MPS GPU.
	MPSGPU func(uuid string) bool
	// Event records an event on the container's pod (kind "Warning").
	Event func(rec checkpoint.Record, reason, message string)
	// NodeEvent records a Warning event on the Node: memory the watchdog cannot
	// attribute to any container.
	NodeEvent func(reason, message string)
	// EscalationWindow is how long a pod is remembered after a memory kill or stop
	// (escalate.go). Default DefaultEscalationWindow.
	EscalationWindow time.Duration
	// EvictAfter is the number of container stops within EscalationWindow that evict
	// the pod; 0 never evicts.
	EvictAfter int
	// Evict evicts the pod of rec through the Eviction API; nil error also when the
	// pod is gone. Nil: pods are never evicted.
	Evict func(rec checkpoint.Record) error
	// EvictRetry and MaxEvictRetry bound the backoff between refused evictions.
	// Defaults EvictRetry and MaxEvictRetry.
	EvictRetry, MaxEvictRetry time.Duration
	// Devices lists the GPUs with their device minor numbers, for attribution by
	// device files. Default Source.Devices.
	Devices func() ([]gpu.Device, error)
	Kill    func(pid int) error
	Metrics *metrics.Metrics
	Log     logr.Logger
	Now     func() time.Time
}

// Usage is one container's use of one GPU in a sample.
type Usage struct {
	Record    checkpoint.Record
	GPU       string
	UsedMiB   int64
	LimitMiB  int64
	SMPercent int
	// CoresLimit is the container's gpu-cores grant on this GPU; 0 when it has none.
	CoresLimit int
	PIDs       []int
	// OwnContext lists the PIDs that use the GPU with a CUDA context of their own,
	// not as MPS clients.
	OwnContext []int
}

// Sample is the outcome of one pass.
type Sample struct {
	Containers []Usage
	// Unattributed is memory per GPU that could be attributed to no container, by PID
	// or by device files.
	Unattributed map[string]int64
	// ByDeviceFiles is memory per GPU attributed by who holds its device files.
	ByDeviceFiles map[string]int64
	// Acted lists "namespace/pod/container gpu resource" for each action taken in
	// this pass (resource is memory or compute).
	Acted []string
}

// span is one pass's finding for a container and GPU: when, how long it stands for
// (the time since the previous pass) and what it saw.
type span struct {
	at  time.Time
	dur time.Duration
	sm  int
}

// track is the watchdog's memory of one container on one GPU.
type track struct {
	container string
	// over holds the passes within Window that found the container over its memory
	// limit.
	over []span
	// memActed marks a memory episode already acted on with an event: one event until
	// the container has stayed under its limit for a whole Window.
	memActed bool
	// util holds every pass within ComputeWindow, and since is when the current
	// compute window began (first seen, or the last kill).
	util  []span
	since time.Time
	// cpuActed marks a compute episode already acted on with an event: one event
	// until the average falls to the grant plus tolerance again.
	cpuActed bool
	// ownContext is the last pass's OwnContext on an MPS GPU, and mpsActed marks an
	// event already given for the processes in it (mps.go).
	ownContext []int
	mpsActed   bool
}

// Watchdog is the usage watchdog.
type Watchdog struct {
	cfg Config

	mu       sync.Mutex
	tracks   map[string]*track
	lastPass time.Time
	// pods holds the escalation state of pods acted on for memory.
	pods map[string]*podEscalation
	// unattributed tracks, per GPU, the passes that found memory no container could
	// be charged with, for the Node event.
	unattributed map[string]*track
	// devOf reads the device numbers behind a /proc/<pid>/fd link (tests replace it).
	devOf func(string) (uint32, uint32, bool)

	// progress records every completed pass, for the liveness probe.
	progress health.Progress
}

// Progress reports the watchdog loop's passes.
func (w *Watchdog) Progress() *health.Progress { return &w.progress }

// New checks cfg.
func New(cfg Config) (*Watchdog, error) {
	if cfg.Source == nil || cfg.Records == nil {
		return nil, errors.New("watchdog: source and records are required")
	}
	if _, err := ParseAction(string(cfg.Action)); err != nil {
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	if cfg.ComputeAction == "" {
		cfg.ComputeAction = DefaultComputeAction
	}
	if _, err := ParseComputeAction(string(cfg.ComputeAction)); err != nil {
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	if cfg.Grace < 0 || cfg.Window < 0 || cfg.ComputeWindow < 0 || cfg.ComputeTolerance < 0 || cfg.ToleranceMiB < 0 ||
		cfg.EscalationWindow < 0 || cfg.EvictAfter < 0 || cfg.EvictRetry < 0 || cfg.MaxEvictRetry < 0 {
		return nil, errors.New("watchdog: grace, windows, tolerances, evict-after and retries must not be negative")
	}
	if cfg.EscalationWindow == 0 {
		cfg.EscalationWindow = DefaultEscalationWindow
	}
	if cfg.EvictRetry == 0 {
		cfg.EvictRetry = EvictRetry
	}
	if cfg.MaxEvictRetry == 0 {
		cfg.MaxEvictRetry = max(MaxEvictRetry, cfg.EvictRetry)
	}
	if cfg.MaxEvictRetry < cfg.EvictRetry {
		return nil, fmt.Errorf("watchdog: the longest eviction retry %s is shorter than the first %s", cfg.MaxEvictRetry, cfg.EvictRetry)
	}
	if cfg.Devices == nil {
		cfg.Devices = cfg.Source.Devices
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Window == 0 {
		cfg.Window = max(DefaultWindow, cfg.Grace)
	}
	if cfg.Window < cfg.Grace {
		return nil, fmt.Errorf("watchdog: window %s is shorter than the grace %s", cfg.Window, cfg.Grace)
	}
	if cfg.ComputeWindow == 0 {
		cfg.ComputeWindow = DefaultComputeWindow
	}
	if cfg.Kill == nil {
		cfg.Kill = func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Watchdog{cfg: cfg, tracks: map[string]*track{}, pods: map[string]*podEscalation{},
		unattributed: map[string]*track{}, devOf: charDev}, nil
}

// Run samples every Interval until ctx is done.
func (w *Watchdog) Run(ctx context.Context) error {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	w.progress.Start(time.Now())
	for {
		_, err := w.Check()
		w.progress.Pass(time.Now(), err)
		if err != nil {
			w.cfg.Log.Error(err, "watchdog pass failed")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// CgroupOf returns the cgroup of a process as the agent's cgroup namespace shows it
// (the host hierarchy, or paths relative to the agent's own cgroup: see holds): the unified (v2)
// entry when the process has one below the root, otherwise the v1 memory controller's.
func CgroupOf(procRoot string, pid int) (string, error) {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	var unified, memory string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			unified = parts[2]
		case containsController(parts[1], "memory"):
			memory = parts[2]
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if unified != "" && unified != "/" {
		return unified, nil
	}
	if memory != "" {
		return memory, nil
	}
	if unified != "" {
		return unified, nil
	}
	return "", fmt.Errorf("process %d: no cgroup found", pid)
}

func containsController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// holds reports whether the container cgroup rec (a host path, as bound) holds a
// process whose cgroup reads cg: rec itself or a cgroup below it, as some runtimes
// nest the processes. When the agent runs in a cgroup namespace of its own (the
// default for containers on cgroup v2), /proc/<pid>/cgroup gives other containers'
// cgroups relative to the agent's, "/../../kubepods-burstable.slice/…": the part after
// the ".." steps is then a path below some ancestor of the agent's cgroup, and it
// must begin with a tail of rec that includes rec's last component (the container's
// own cgroup, whose name holds the container id).
func holds(rec, cg string) bool {
	if cg == rec || strings.HasPrefix(cg, rec+"/") {
		return true
	}
	if !strings.HasPrefix(cg, "/../") {
		return false
	}
	rest := strings.Split(strings.Trim(cg, "/"), "/")
	for len(rest) > 0 && rest[0] == ".." {
		rest = rest[1:]
	}
	recs := strings.Split(strings.Trim(rec, "/"), "/")
	for j := range recs {
		tail := recs[j:]
		if len(rest) >= len(tail) && slices.Equal(rest[:len(tail)], tail) {
			return true
		}
	}
	return false
}

// owner finds the record whose cgroup holds cg, the deepest when several do.
func owner(recs []checkpoint.Record, cg string) (checkpoint.Record, bool) {
	best := -1
	for i, r := range recs {
		if r.Cgroup == "" {
			continue
		}
		if holds(r.Cgroup, cg) {
			if best < 0 || len(r.Cgroup) > len(recs[best].Cgroup) {
				best = i
			}
		}
	}
	if best < 0 {
		return checkpoint.Record{}, false
	}
	return recs[best], true
}

// Check runs one pass.
func (w *Watchdog) Check() (*Sample, error) {
	u, err := w.cfg.Source.Usage()
	if err != nil {
		return nil, err
	}
	recs := w.cfg.Records()
	claims, containers := claimRecords(recs)
	now := w.cfg.Now()
	type key struct{ container, gpu string }
	acc := map[key]*Usage{}
	s := &Sample{Unattributed: map[string]int64{}, ByDeviceFiles: map[string]int64{}}
	grant := func(cu *Usage, r checkpoint.Record) {
		for _, d := range r.Devices {
			if d.UUID == cu.GPU {
				cu.LimitMiB, cu.CoresLimit = d.MemoryMiB, d.Cores
			}
		}
	}
	usage := func(rec checkpoint.Record, gpuID string) *Usage {
		k := key{rec.ContainerID, gpuID}
		cu := acc[k]
		if cu == nil {
			cu = &Usage{Record: rec, GPU: gpuID, LimitMiB: -1}
			grant(cu, rec)
			acc[k] = cu
		}
		return cu
	}
	add := func(rec checkpoint.Record, p gpu.ProcessUsage) {
		cu := usage(rec, p.GPUUUID)
		cu.UsedMiB += p.UsedMemoryMiB
		if p.SMPercent > 0 {
			cu.SMPercent += p.SMPercent
		}
		cu.PIDs = append(cu.PIDs, p.PID)
		if !p.MPSClient {
			cu.OwnContext = append(cu.OwnContext, p.PID)
		}
	}
	// The agent's own processes (the MPS servers it runs) are Tessera's: neither a
	// tenant's nor unattributed.
	self, _ := CgroupOf(w.cfg.ProcRoot, os.Getpid())
	var pending []gpu.ProcessUsage
	for _, p := range u.Processes {
		cg, err := CgroupOf(w.cfg.ProcRoot, p.PID)
		if err == nil {
			if rec, ok := owner(containers, cg); ok {
				add(rec, p)
				continue
			}
			if self != "" && cg == self {
				continue
			}
		}
		if rec, ok := claimOf(w.cfg.ProcRoot, p.PID, claims); ok {
			add(rec, p)
			continue
		}
		pending = append(pending, p)
	}
	why := map[string][]string{}
	if len(pending) > 0 {
		for _, c := range w.byDeviceFiles(u.Processes, pending, containers, claims, self, s, why) {
			if c.process != nil {
				add(c.rec, *c.process)
				continue
			}
			cu := usage(c.rec, c.gpu)
			cu.UsedMiB += c.mib
			for _, pid := range c.pids {
				if !slices.Contains(cu.PIDs, pid) {
					cu.PIDs = append(cu.PIDs, pid)
				}
			}
		}
	}
	// Containers with no process on a granted GPU still appear, at zero, so that the
	// metrics show their limits and their windows see them under their limits.
	live := map[string]bool{}
	for _, r := range recs {
		live[r.ContainerID] = true
		for _, d := range r.Devices {
			k := key{r.ContainerID, d.UUID}
			if acc[k] == nil {
				cu := &Usage{Record: r, GPU: d.UUID}
				grant(cu, r)
				acc[k] = cu
			}
		}
	}
	keys := make([]key, 0, len(acc))
	for k := range acc {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].container != keys[j].container {
			return keys[i].container < keys[j].container
		}
		return keys[i].gpu < keys[j].gpu
	})

	w.mu.Lock()
	defer w.mu.Unlock()
	// Each pass stands for the time since the previous one, at most two intervals so
	// that a pass delayed by a wedged NVML call does not count as a long stretch.
	dur := w.cfg.Interval
	if !w.lastPass.IsZero() {
		dur = min(max(now.Sub(w.lastPass), 0), 2*w.cfg.Interval)
	}
	w.lastPass = now
	seen := map[string]bool{}
	for _, k := range keys {
		cu := acc[k]
		s.Containers = append(s.Containers, *cu)
		ek := k.container + "/" + k.gpu
		seen[ek] = true
		tr := w.tracks[ek]
		if tr == nil {
			tr = &track{container: k.container, since: now}
			w.tracks[ek] = tr
		}
		who := fmt.Sprintf("%s/%s/%s %s", cu.Record.Namespace, cu.Record.Pod, cu.Record.Container, cu.GPU)
		if w.memory(tr, cu, now, dur) {
			s.Acted = append(s.Acted, who+" memory")
		}
		if w.compute(tr, cu, now, dur) {
			s.Acted = append(s.Acted, who+" compute")
		}
	}
	for ek, tr := range w.tracks {
		if seen[ek] {
			continue
		}
		// A container no longer bound is forgotten; one that left a GPU it was not
		// granted, or a container without a grant that held memory, is remembered
		// until its time over the limit leaves the window, so that leaving and coming
		// back does not start a new grace.
		if w.pruneMemory(tr, now); !live[tr.container] && !strings.HasPrefix(tr.container, "cgroup:") || len(tr.over) == 0 {
			delete(w.tracks, ek)
		}
	}
	w.unattributedEvents(s, why, now, dur)
	w.evictions(now)
	w.export(u, s, recs)
	return s, nil
}

// memory records one pass's memory finding and acts when the time over the limit
// within the window reaches the grace.
func (w *Watchdog) memory(tr *track, cu *Usage, now time.Time, dur time.Duration) bool {
	over := cu.LimitMiB < 0 && cu.UsedMiB > 0 || cu.LimitMiB >= 0 && cu.UsedMiB > cu.LimitMiB+w.cfg.ToleranceMiB
	if over {
		tr.over = append(tr.over, span{at: now, dur: dur})
	}
	w.pruneMemory(tr, now)
	if p := w.escalation(cu.Record); over && p != nil && len(p.acted) > 0 && now.Sub(p.acted[len(p.acted)-1]) <= w.cfg.EscalationWindow {
		w.stop(cu, p, now)
		tr.over = nil
		return true
	}
	if !over || tr.memActed {
		return false
	}
	var total time.Duration
	for _, sp := range tr.over {
		total += sp.dur
	}
	if total < w.cfg.Grace {
		return false
	}
	what := fmt.Sprintf("held more than its limit of %d MiB on GPU %s for %s of the last %s (%d MiB at the last sample)",
		cu.LimitMiB, cu.GPU, total.Round(time.Second), w.cfg.Window, cu.UsedMiB)
	if cu.LimitMiB < 0 {
		what = fmt.Sprintf("holds %d MiB on GPU %s, which was not assigned to it, and did for %s of the last %s",
			cu.UsedMiB, cu.GPU, total.Round(time.Second), w.cfg.Window)
	}
	w.act(cu, w.cfg.Action, "memory", "GPUMemoryOverLimit", what)
	if w.cfg.Action == ActionKill {
		// Whatever the pod runs next over its grant is stopped on sight (escalate.go).
		tr.over = nil
		w.struck(cu.Record, now)
	} else {
		tr.memActed = true
	}
	return true
}

// pruneMemory forgets passes older than the window; a window without any pass over
// the limit ends the episode.
func (w *Watchdog) pruneMemory(tr *track, now time.Time) {
	cut := now.Add(-w.cfg.Window)
	i := 0
	for i < len(tr.over) && !tr.over[i].at.After(cut) {
		i++
	}
	tr.over = tr.over[i:]
	if len(tr.over) == 0 {
		tr.memActed = false
	}
}

// compute records one pass's SM utilisation and acts when the average over a whole
// compute window is above the cores grant plus the tolerance.
func (w *Watchdog) compute(tr *track, cu *Usage, now time.Time, dur time.Duration) bool {
	if w.cfg.MPSGPU != nil && w.cfg.MPSGPU(cu.GPU) {
		tr.util, tr.since, tr.cpuActed = nil, now, false
		return w.mpsBypass(tr, cu)
	}
	if w.cfg.ComputeAction == ActionOff || cu.CoresLimit <= 0 {
		tr.util, tr.since, tr.cpuActed = nil, now, false
		return false
	}
	tr.util = append(tr.util, span{at: now, dur: dur, sm: cu.SMPercent})
	cut := now.Add(-w.cfg.ComputeWindow)
	i := 0
	for i < len(tr.util) && !tr.util[i].at.After(cut) {
		i++
	}
	tr.util = tr.util[i:]
	if now.Sub(tr.since) < w.cfg.ComputeWindow {
		return false
	}
	var weighted, total float64
	for _, sp := range tr.util {
		weighted += float64(sp.sm) * sp.dur.Seconds()
		total += sp.dur.Seconds()
	}
	if total <= 0 {
		return false
	}
	mean := weighted / total
	if mean <= float64(cu.CoresLimit+w.cfg.ComputeTolerance) {
		tr.cpuActed = false
		return false
	}
	if tr.cpuActed {
		return false
	}
	what := fmt.Sprintf("used %.0f%% of GPU %s's SMs on average over the last %s, above its gpu-cores grant of %d%%",
		mean, cu.GPU, w.cfg.ComputeWindow, cu.CoresLimit)
	w.act(cu, w.cfg.ComputeAction, "compute", "GPUComputeOverLimit", what)
	if w.cfg.ComputeAction == ActionKill {
		tr.util, tr.since = nil, now
	} else {
		tr.cpuActed = true
	}
	return true
}

// act records an event and a metric and, for a kill, ends the container's processes
// on the GPU.
func (w *Watchdog) act(cu *Usage, action Action, resource, reason, what string) {
	r := cu.Record
	msg := fmt.Sprintf("%s %s", subject(r), what)
	if resource != "mps" {
		msg += " (the CUDA hook was bypassed or failed)"
	}
	var killed []string
	if action == ActionKill {
		for _, pid := range cu.PIDs {
			// Check the owner again right before the kill: the PID may have been
			// reused by another process since the sample.
			if !w.owns(r, pid) {
				continue
			}
			if err := w.cfg.Kill(pid); err != nil {
				w.cfg.Log.Error(err, "ending a process over its container's limit", "pid", pid, "resource", resource)
				continue
			}
			killed = append(killed, strconv.Itoa(pid))
		}
		if len(killed) > 0 {
			msg += "; ended processes " + strings.Join(killed, ",")
		} else {
			msg += "; no process was left to end"
		}
		reason += "Killed"
	}
	w.cfg.Log.Info("watchdog action", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container, "gpu", cu.GPU,
		"resource", resource, "action", string(action), "usedMiB", cu.UsedMiB, "limitMiB", cu.LimitMiB,
		"smPercent", cu.SMPercent, "coresLimit", cu.CoresLimit, "killed", killed)
	if w.cfg.Event != nil {
		w.cfg.Event(r, reason, msg)
	}
	if w.cfg.Metrics != nil {
		w.cfg.Metrics.WatchdogAction(string(action), r.Namespace, r.Pod, r.Container)
	}
}

// export refreshes the usage metrics from one sample.
func (w *Watchdog) export(u *gpu.Usage, s *Sample, recs []checkpoint.Record) {
	m := w.cfg.Metrics
	if m == nil {
		return
	}
	gpus := make([]metrics.GPUSample, 0, len(u.GPUs))
	at := map[string]int{} // UUID -> position in gpus
	for _, g := range u.GPUs {
		at[g.UUID] = len(gpus)
		gpus = append(gpus, metrics.GPUSample{UUID: g.UUID, Index: g.Index, Polled: true, UsedMiB: g.UsedMemoryMiB,
			UtilPercent: g.UtilPercent, UnattributedMiB: s.Unattributed[g.UUID]})
	}
	for _, r := range recs {
		for _, d := range r.Devices {
			i, ok := at[d.UUID]
			if !ok {
				i = len(gpus)
				at[d.UUID] = i
				gpus = append(gpus, metrics.GPUSample{UUID: d.UUID, Index: -1})
			}
			gpus[i].AllocatedMiB += d.MemoryMiB
			gpus[i].AllocatedCores += d.Cores
		}
	}
	containers := make([]metrics.ContainerSample, 0, len(s.Containers))
	for _, c := range s.Containers {
		cs := metrics.ContainerSample{Namespace: c.Record.Namespace, Pod: c.Record.Pod, Container: c.Record.Container,
			UUID: c.GPU, Index: -1, UsedMiB: c.UsedMiB, LimitMiB: c.LimitMiB, SMPercent: c.SMPercent}
		if i, ok := at[c.GPU]; ok {
			cs.Index = gpus[i].Index
		}
		for _, d := range c.Record.Devices {
			if d.UUID == c.GPU {
				cs.CoresLimit = d.Cores
			}
		}
		containers = append(containers, cs)
	}
	m.SetUsage(gpus, containers)
}

// Package watchdog is the backstop behind the CUDA hook: it samples NVML's per-process
// memory and utilisation, maps each process to its container through the process's
// cgroup, sums per container and GPU, and acts on a container that stays above its
// memory grant for longer than a grace period, as a process that bypassed the hook
// (static driver calls, raw ioctls) would. Every action is an event on the pod.
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
	// ActionEvent records an event on the pod and counts it in a metric.
	ActionEvent Action = "event"
	// ActionKill also ends the container's processes on that GPU.
	ActionKill Action = "kill"
)

// ParseAction parses the --watchdog-action flag.
func ParseAction(s string) (Action, error) {
	switch a := Action(s); a {
	case ActionEvent, ActionKill:
		return a, nil
	}
	return "", fmt.Errorf("watchdog action %q is not event or kill", s)
}

// Config configures the watchdog.
type Config struct {
	Source  gpu.Source
	Records func() []checkpoint.Record
	// ProcRoot is the host's /proc (the agent runs in the host PID namespace, where
	// NVML's PIDs live).
	ProcRoot string
	Interval time.Duration
	// Grace is how long a container may stay over its limit before the action.
	Grace time.Duration
	// ToleranceMiB is allowed above the grant before a container counts as over: NVML
	// counts some driver-internal memory that the hook cannot see.
	ToleranceMiB int64
	Action       Action
	// Event records an event on the container's pod (kind "Warning").
	Event   func(rec checkpoint.Record, reason, message string)
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
	PIDs      []int
}

// Sample is the outcome of one pass.
type Sample struct {
	Containers []Usage
	// Unattributed is memory per GPU held by processes of no bound container.
	Unattributed map[string]int64
	// Acted lists "namespace/pod/container gpu" for each action taken in this pass.
	Acted []string
}

// Watchdog is the usage watchdog.
type Watchdog struct {
	cfg Config

	mu sync.Mutex
	// overSince is when each container/GPU pair first went over its limit in the
	// current episode; acted marks episodes already acted on, so one episode gets one
	// action (and one event) until usage drops below the limit again.
	overSince map[string]time.Time
	acted     map[string]bool

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
	if cfg.Action != ActionEvent && cfg.Action != ActionKill {
		return nil, fmt.Errorf("watchdog: action %q is not event or kill", cfg.Action)
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Kill == nil {
		cfg.Kill = func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Watchdog{cfg: cfg, overSince: map[string]time.Time{}, acted: map[string]bool{}}, nil
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
	now := w.cfg.Now()
	type key struct{ container, gpu string }
	acc := map[key]*Usage{}
	s := &Sample{Unattributed: map[string]int64{}}
	for _, p := range u.Processes {
		cg, err := CgroupOf(w.cfg.ProcRoot, p.PID)
		var rec checkpoint.Record
		ok := false
		if err == nil {
			rec, ok = owner(recs, cg)
		}
		if !ok {
			s.Unattributed[p.GPUUUID] += p.UsedMemoryMiB
			continue
		}
		k := key{rec.ContainerID, p.GPUUUID}
		cu := acc[k]
		if cu == nil {
			cu = &Usage{Record: rec, GPU: p.GPUUUID, LimitMiB: -1}
			for _, d := range rec.Devices {
				if d.UUID == p.GPUUUID {
					cu.LimitMiB = d.MemoryMiB
				}
			}
			acc[k] = cu
		}
		cu.UsedMiB += p.UsedMemoryMiB
		if p.SMPercent > 0 {
			cu.SMPercent += p.SMPercent
		}
		cu.PIDs = append(cu.PIDs, p.PID)
	}
	// Containers with no process on a granted GPU still appear, at zero, so that the
	// metrics show their limits.
	for _, r := range recs {
		for _, d := range r.Devices {
			k := key{r.ContainerID, d.UUID}
			if acc[k] == nil {
				acc[k] = &Usage{Record: r, GPU: d.UUID, LimitMiB: d.MemoryMiB}
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
	seen := map[string]bool{}
	for _, k := range keys {
		cu := acc[k]
		s.Containers = append(s.Containers, *cu)
		ek := k.container + "/" + k.gpu
		seen[ek] = true
		over := cu.LimitMiB < 0 && cu.UsedMiB > 0 || cu.LimitMiB >= 0 && cu.UsedMiB > cu.LimitMiB+w.cfg.ToleranceMiB
		if !over {
			delete(w.overSince, ek)
			delete(w.acted, ek)
			continue
		}
		since, was := w.overSince[ek]
		if !was {
			w.overSince[ek] = now
			since = now
		}
		if now.Sub(since) < w.cfg.Grace || w.acted[ek] {
			continue
		}
		w.acted[ek] = true
		w.act(cu, now.Sub(since))
		s.Acted = append(s.Acted, fmt.Sprintf("%s/%s/%s %s", cu.Record.Namespace, cu.Record.Pod, cu.Record.Container, cu.GPU))
	}
	for ek := range w.overSince {
		if !seen[ek] {
			delete(w.overSince, ek)
			delete(w.acted, ek)
		}
	}
	w.export(u, s, recs)
	return s, nil
}

func (w *Watchdog) act(cu *Usage, over time.Duration) {
	r := cu.Record
	what := fmt.Sprintf("holds %d MiB on GPU %s, above its limit of %d MiB, for %s", cu.UsedMiB, cu.GPU, cu.LimitMiB, over.Round(time.Second))
	if cu.LimitMiB < 0 {
		what = fmt.Sprintf("holds %d MiB on GPU %s, which was not assigned to it", cu.UsedMiB, cu.GPU)
	}
	msg := fmt.Sprintf("container %s %s (the CUDA hook was bypassed or failed)", r.Container, what)
	reason := "GPUMemoryOverLimit"
	if w.cfg.Action == ActionKill {
		var killed []string
		for _, pid := range cu.PIDs {
			// Check the cgroup again right before the kill: the PID may have been
			// reused by another process since the sample.
			cg, err := CgroupOf(w.cfg.ProcRoot, pid)
			if err != nil || !holds(r.Cgroup, cg) {
				continue
			}
			if err := w.cfg.Kill(pid); err != nil {
				w.cfg.Log.Error(err, "ending an over-limit process", "pid", pid)
				continue
			}
			killed = append(killed, strconv.Itoa(pid))
		}
		msg += "; ended processes " + strings.Join(killed, ",")
		reason = "GPUMemoryOverLimitKilled"
	}
	w.cfg.Log.Info("watchdog action", "namespace", r.Namespace, "pod", r.Pod, "container", r.Container, "gpu", cu.GPU,
		"usedMiB", cu.UsedMiB, "limitMiB", cu.LimitMiB, "action", string(w.cfg.Action))
	if w.cfg.Event != nil {
		w.cfg.Event(r, reason, msg)
	}
	if w.cfg.Metrics != nil {
		w.cfg.Metrics.WatchdogActions.WithLabelValues(string(w.cfg.Action), r.Namespace, r.Pod, r.Container).Inc()
	}
}

// export refreshes the usage metrics from one sample.
func (w *Watchdog) export(u *gpu.Usage, s *Sample, recs []checkpoint.Record) {
	m := w.cfg.Metrics
	if m == nil {
		return
	}
	idx := map[string]string{}
	for _, g := range u.GPUs {
		idx[g.UUID] = strconv.Itoa(g.Index)
	}
	label := func(uuid string) string {
		if i, ok := idx[uuid]; ok {
			return i
		}
		return ""
	}
	m.GPUMemoryUsed.Reset()
	m.GPUUtilization.Reset()
	m.GPUUnattributed.Reset()
	for _, g := range u.GPUs {
		m.GPUMemoryUsed.WithLabelValues(g.UUID, idx[g.UUID]).Set(float64(g.UsedMemoryMiB))
		if g.UtilPercent >= 0 {
			m.GPUUtilization.WithLabelValues(g.UUID, idx[g.UUID]).Set(float64(g.UtilPercent))
		}
		m.GPUUnattributed.WithLabelValues(g.UUID, idx[g.UUID]).Set(float64(s.Unattributed[g.UUID]))
	}
	m.GPUMemoryAllocated.Reset()
	m.GPUCoresAllocated.Reset()
	allocMem, allocCores := map[string]int64{}, map[string]int{}
	for _, r := range recs {
		for _, d := range r.Devices {
			allocMem[d.UUID] += d.MemoryMiB
			allocCores[d.UUID] += d.Cores
		}
	}
	for uuid, v := range allocMem {
		m.GPUMemoryAllocated.WithLabelValues(uuid, label(uuid)).Set(float64(v))
		m.GPUCoresAllocated.WithLabelValues(uuid, label(uuid)).Set(float64(allocCores[uuid]))
	}
	m.ContainerMemoryUsed.Reset()
	m.ContainerMemoryLimit.Reset()
	m.ContainerSM.Reset()
	m.ContainerCoresLimit.Reset()
	for _, c := range s.Containers {
		l := []string{c.Record.Namespace, c.Record.Pod, c.Record.Container, c.GPU}
		m.ContainerMemoryUsed.WithLabelValues(l...).Set(float64(c.UsedMiB))
		m.ContainerMemoryLimit.WithLabelValues(l...).Set(float64(c.LimitMiB))
		m.ContainerSM.WithLabelValues(l...).Set(float64(c.SMPercent))
		for _, d := range c.Record.Devices {
			if d.UUID == c.GPU {
				m.ContainerCoresLimit.WithLabelValues(l...).Set(float64(d.Cores))
			}
		}
	}
}

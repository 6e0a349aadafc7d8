// SPDX-License-Identifier: Apache-2.0

package watchdog

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/gpu"
	"github.com/tessera-dev/tessera/node-agent/metrics"
)

type fakeSource struct {
	gpu.Source
	mu sync.Mutex
	u  gpu.Usage
}

func (f *fakeSource) Usage() (*gpu.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.u
	c.Processes = append([]gpu.ProcessUsage(nil), f.u.Processes...)
	return &c, nil
}

// Devices gives GPU-N the minor number N.
func (f *fakeSource) Devices() ([]gpu.Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []gpu.Device
	for _, g := range f.u.GPUs {
		out = append(out, gpu.Device{UUID: g.UUID, Index: g.Index, Minor: g.Index})
	}
	return out, nil
}

func (f *fakeSource) set(p ...gpu.ProcessUsage) {
	f.mu.Lock()
	f.u.Processes = p
	f.mu.Unlock()
}

// proc writes a fake /proc/<pid>/cgroup.
func proc(t *testing.T, root string, pid int, content string) {
	t.Helper()
	d := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "cgroup"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

const cgA = "/kubepods.slice/kubepods-pod1.slice/cri-containerd-a.scope"
const cgB = "/kubepods.slice/kubepods-pod2.slice/cri-containerd-b.scope"

func records() []checkpoint.Record {
	return []checkpoint.Record{
		{ContainerID: "a", Namespace: "ns", Pod: "p1", Container: "train", Cgroup: cgA,
			Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1000, Cores: 30}}},
		{ContainerID: "b", Namespace: "ns", Pod: "p2", Container: "infer", Cgroup: cgB,
			Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 2000}, {UUID: "GPU-1", MemoryMiB: 500}}},
	}
}

type clock struct{ t time.Time }

func setup(t *testing.T, action Action, opts ...func(*Config)) (*Watchdog, *fakeSource, *clock, *[]string, *[]int, *metrics.Metrics, string) {
	root := t.TempDir()
	proc(t, root, 10, "0::"+cgA+"\n")
	proc(t, root, 11, "0::"+cgA+"/sub\n")                              // nested below the container's cgroup
	proc(t, root, 20, "12:memory:"+cgB+"\n11:devices:"+cgB+"\n0::/\n") // cgroup v1 host
	proc(t, root, 99, "0::/system.slice/rogue.service\n")
	src := &fakeSource{u: gpu.Usage{GPUs: []gpu.GPUUsage{{UUID: "GPU-0", Index: 0, UsedMemoryMiB: 0, UtilPercent: 10}, {UUID: "GPU-1", Index: 1, UtilPercent: -1}}}}
	clk := &clock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	var events []string
	var killed []int
	m := metrics.New(nil)
	cfg := Config{
		Source: src, Records: records, ProcRoot: root, Grace: 30 * time.Second, ToleranceMiB: 10, Action: action,
		Event:   func(r checkpoint.Record, reason, msg string) { events = append(events, r.Pod+" "+reason+" "+msg) },
		Kill:    func(pid int) error { killed = append(killed, pid); return nil },
		Metrics: m, Log: logr.Discard(), Now: func() time.Time { return clk.t },
		ComputeTolerance: 10,
	}
	for _, o := range opts {
		o(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w, src, clk, &events, &killed, m, root
}

func TestAttributionAndMetrics(t *testing.T) {
	w, src, _, events, _, m, _ := setup(t, ActionEvent)
	src.set(
		gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 400, SMPercent: 20},
		gpu.ProcessUsage{PID: 11, GPUUUID: "GPU-0", UsedMemoryMiB: 500, SMPercent: 5},
		gpu.ProcessUsage{PID: 20, GPUUUID: "GPU-1", UsedMemoryMiB: 300, SMPercent: -1},
		gpu.ProcessUsage{PID: 99, GPUUUID: "GPU-0", UsedMemoryMiB: 77},
		gpu.ProcessUsage{PID: 12345, GPUUUID: "GPU-1", UsedMemoryMiB: 5}, // exited already
	)
	s, err := w.Check()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, c := range s.Containers {
		got[c.Record.ContainerID+" "+c.GPU] = c.UsedMiB
	}
	want := map[string]int64{"a GPU-0": 900, "b GPU-0": 0, "b GPU-1": 300}
	if len(got) != len(want) {
		t.Fatalf("containers %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d MiB, want %d", k, got[k], v)
		}
	}
	if s.Unattributed["GPU-0"] != 77 || s.Unattributed["GPU-1"] != 5 {
		t.Errorf("unattributed %v", s.Unattributed)
	}
	if len(*events) != 0 {
		t.Errorf("events under the limit: %v", *events)
	}
	if v := metricValue(t, m, "tessera_container_gpu_memory_used_bytes", "pod", "p1", "container", "train", "gpu", "0", "UUID", "GPU-0"); v != 900<<20 {
		t.Errorf("container used metric %v", v)
	}
	if v := metricValue(t, m, "tessera_container_gpu_sm_ratio", "pod", "p1", "container", "train", "gpu", "0", "UUID", "GPU-0"); v != 0.25 {
		t.Errorf("container SM metric %v", v)
	}
	if v := metricValue(t, m, "tessera_gpu_memory_allocated_bytes", "gpu", "0", "UUID", "GPU-0"); v != 3000<<20 {
		t.Errorf("allocated metric %v", v)
	}
	if v := metricValue(t, m, "tessera_gpu_cores_allocated_ratio", "gpu", "0", "UUID", "GPU-0"); v != 0.30 {
		t.Errorf("cores metric %v", v)
	}
	if v := metricValue(t, m, "tessera_gpu_unattributed_memory_bytes", "gpu", "0", "UUID", "GPU-0"); v != 77<<20 {
		t.Errorf("unattributed metric %v", v)
	}
}

func TestGraceAndOneActionPerEpisode(t *testing.T) {
	w, src, clk, events, killed, m, _ := setup(t, ActionEvent)
	over := func() { src.set(gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 1011}) }
	under := func() { src.set(gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 1010}) }
	over() // 1011 > 1000 + 10 tolerance
	// Passes every 5 s (the interval): the first over pass counts 5 s, the sixth
	// brings the time over the limit to the 30 s grace.
	for i := 0; i < 5; i++ {
		s, _ := w.Check()
		if len(s.Acted) != 0 {
			t.Fatalf("acted within the grace period at pass %d", i)
		}
		clk.t = clk.t.Add(5 * time.Second)
	}
	s, _ := w.Check()
	if len(s.Acted) != 1 || len(*events) != 1 || !strings.Contains((*events)[0],
		"GPUMemoryOverLimit container train held more than its limit of 1000 MiB on GPU GPU-0 for 30s of the last 1m0s (1011 MiB at the last sample)") {
		t.Fatalf("acted %v events %v", s.Acted, *events)
	}
	for i := 0; i < 30; i++ {
		clk.t = clk.t.Add(5 * time.Second)
		if s, _ := w.Check(); len(s.Acted) != 0 {
			t.Fatal("acted twice in one episode")
		}
	}
	// Under the limit for less than a window: still the same episode.
	under()
	for i := 0; i < 6; i++ {
		clk.t = clk.t.Add(5 * time.Second)
		_, _ = w.Check()
	}
	over()
	clk.t = clk.t.Add(5 * time.Second)
	if s, _ := w.Check(); len(s.Acted) != 0 {
		t.Fatal("a dip shorter than the window started a new episode")
	}
	// Under for a whole window ends the episode; a new one waits for the grace again.
	under()
	for i := 0; i < 13; i++ {
		clk.t = clk.t.Add(5 * time.Second)
		_, _ = w.Check()
	}
	over()
	for i := 0; i < 5; i++ {
		clk.t = clk.t.Add(5 * time.Second)
		if s, _ := w.Check(); len(s.Acted) != 0 {
			t.Fatalf("a new episode skipped the grace period (pass %d)", i)
		}
	}
	clk.t = clk.t.Add(5 * time.Second)
	if s, _ := w.Check(); len(s.Acted) != 1 {
		t.Fatal("second episode not acted on")
	}
	if len(*killed) != 0 {
		t.Errorf("event action killed %v", *killed)
	}
	if v := metricValue(t, m, "tessera_watchdog_actions_total", "action", "event", "namespace", "ns", "pod", "p1", "container", "train"); v != 2 {
		t.Errorf("actions metric %v", v)
	}
}

// A tenant that drops under its limit now and then is still acted on: the dips do
// not reset the time it has spent over its limit within the window.
func TestDipsDoNotResetTheGrace(t *testing.T) {
	for _, tc := range []struct {
		name          string
		grace, window time.Duration
		// The tenant's pattern, in 5 s passes: overPasses over, then underPasses under.
		overPasses, underPasses int
	}{
		// The old rule (30 s continuously over) never acted on this one.
		{"dips every 25s, grace 30s", 30 * time.Second, time.Minute, 4, 1},
		{"defaults, over 10s then under 5s", DefaultGrace, DefaultWindow, 2, 1},
		{"defaults, over a third of the time", DefaultGrace, DefaultWindow, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, src, clk, events, killed, _, _ := setup(t, ActionKill, func(c *Config) { c.Grace, c.Window = tc.grace, tc.window })
			start := clk.t
			// The documented bound: a tenant over a fraction f of the time is acted on
			// once f × window reaches the grace, that is within grace / f (plus one
			// interval for the pass that sees it).
			f := float64(tc.overPasses) / float64(tc.overPasses+tc.underPasses)
			bound := time.Duration(float64(tc.grace)/f) + DefaultInterval
			for pass := 0; clk.t.Sub(start) <= bound; pass++ {
				used := int64(1500)
				if pass%(tc.overPasses+tc.underPasses) >= tc.overPasses {
					used = 900
				}
				src.set(gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: used})
				s, _ := w.Check()
				if len(s.Acted) > 0 {
					t.Logf("killed %v after %s over the limit %.0f%% of the time (bound %s): %v", *killed, clk.t.Sub(start), 100*f, bound, *events)
					if len(*killed) != 1 || (*killed)[0] != 10 || !strings.Contains((*events)[0], "GPUMemoryOverLimitKilled") {
						t.Errorf("killed %v events %v", *killed, *events)
					}
					return
				}
				clk.t = clk.t.Add(DefaultInterval)
			}
			t.Fatalf("not acted on within %s", bound)
		})
	}
}

// A spike shorter than the grace is not acted on, and neither are spikes that never
// add up to the grace within one window.
func TestBriefSpikesAreNotActedOn(t *testing.T) {
	w, src, clk, events, killed, _, _ := setup(t, ActionKill, func(c *Config) { c.Grace, c.Window = DefaultGrace, DefaultWindow })
	for i := 0; i < 10; i++ {
		// Two passes (10 s) over, then 65 s under.
		for j := 0; j < 15; j++ {
			used := int64(900)
			if j < 2 {
				used = 4000
			}
			src.set(gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: used})
			if s, _ := w.Check(); len(s.Acted) != 0 {
				t.Fatalf("acted on a spike: %v %v", *killed, *events)
			}
			clk.t = clk.t.Add(5 * time.Second)
		}
	}
}

// Sustained use of more SMs than the cores grant is acted on after a whole compute
// window; use within the tolerance, or by a container without a cores grant, never.
func TestComputeOveruse(t *testing.T) {
	run := func(t *testing.T, action Action, sm map[int]int, passes int) ([]string, []int, []string) {
		w, src, clk, events, killed, _, _ := setup(t, ActionKill, func(c *Config) { c.ComputeAction = action })
		var acted []string
		for i := 0; i < passes; i++ {
			var ps []gpu.ProcessUsage
			for pid, pct := range sm {
				ps = append(ps, gpu.ProcessUsage{PID: pid, GPUUUID: "GPU-0", UsedMemoryMiB: 100, SMPercent: pct})
			}
			src.set(ps...)
			s, _ := w.Check()
			for _, a := range s.Acted {
				acted = append(acted, fmt.Sprintf("%s at %s", a, time.Duration(i)*DefaultInterval))
			}
			clk.t = clk.t.Add(DefaultInterval)
		}
		return acted, *killed, *events
	}
	// Container a (PIDs 10 and 11) holds a 30 % grant: 35 % + 25 % is 60 %.
	t.Run("event by default, after a whole window", func(t *testing.T) {
		acted, killed, events := run(t, "", map[int]int{10: 35, 11: 25}, 60)
		if len(acted) != 1 || acted[0] != "ns/p1/train GPU-0 compute at 2m0s" || len(killed) != 0 {
			t.Fatalf("acted %v killed %v", acted, killed)
		}
		if !strings.Contains(events[0], "GPUComputeOverLimit container train used 60% of GPU GPU-0's SMs on average over the last 2m0s, above its gpu-cores grant of 30%") {
			t.Errorf("events %v", events)
		}
	})
	t.Run("kill", func(t *testing.T) {
		acted, killed, events := run(t, ActionKill, map[int]int{10: 35, 11: 25}, 25)
		sort.Ints(killed)
		if len(acted) != 1 || len(killed) != 2 || killed[0] != 10 || killed[1] != 11 || !strings.Contains(events[0], "GPUComputeOverLimitKilled") {
			t.Fatalf("acted %v killed %v events %v", acted, killed, events)
		}
	})
	t.Run("within the tolerance", func(t *testing.T) {
		if acted, _, _ := run(t, ActionKill, map[int]int{10: 40}, 60); len(acted) != 0 {
			t.Fatalf("acted %v", acted)
		}
	})
	t.Run("bursts that average under the grant", func(t *testing.T) {
		// Pacing shows as full-speed samples between idle ones.
		w, src, clk, _, _, _, _ := setup(t, ActionKill, func(c *Config) { c.ComputeAction = ActionKill })
		for i := 0; i < 100; i++ {
			pct := 0
			if i%4 == 0 {
				pct = 100
			}
			src.set(gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 100, SMPercent: pct})
			if s, _ := w.Check(); len(s.Acted) != 0 {
				t.Fatalf("acted at pass %d: %v", i, s.Acted)
			}
			clk.t = clk.t.Add(DefaultInterval)
		}
	})
	t.Run("off", func(t *testing.T) {
		if acted, _, _ := run(t, ActionOff, map[int]int{10: 100}, 60); len(acted) != 0 {
			t.Fatalf("acted %v", acted)
		}
	})
	t.Run("no cores grant", func(t *testing.T) {
		// Container b (PID 20) has no cores grant on GPU-0: full use for ten minutes.
		w, src, clk, _, killed, _, _ := setup(t, ActionKill, func(c *Config) { c.ComputeAction = ActionKill })
		for i := 0; i < 120; i++ {
			src.set(gpu.ProcessUsage{PID: 20, GPUUUID: "GPU-0", UsedMemoryMiB: 100, SMPercent: 100})
			if s, _ := w.Check(); len(s.Acted) != 0 {
				t.Fatalf("acted at pass %d: %v %v", i, s.Acted, *killed)
			}
			clk.t = clk.t.Add(DefaultInterval)
		}
	})
}

func TestConfigChecks(t *testing.T) {
	src := &fakeSource{}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Source: src, Records: records, Action: "nuke"}, "not event or kill"},
		{Config{Source: src, Records: records, Action: ActionOff}, "not event or kill"},
		{Config{Source: src, Records: records, Action: ActionKill, ComputeAction: "nuke"}, "not off, event or kill"},
		{Config{Source: src, Records: records, Action: ActionKill, Grace: time.Minute, Window: 30 * time.Second}, "shorter than the grace"},
		{Config{Source: src, Records: records, Action: ActionKill, ComputeTolerance: -1}, "must not be negative"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	w, err := New(Config{Source: src, Records: records, Action: ActionKill, Grace: 2 * time.Minute})
	if err != nil || w.cfg.Window != 2*time.Minute || w.cfg.ComputeAction != ActionEvent || w.cfg.ComputeWindow != DefaultComputeWindow {
		t.Errorf("defaults %+v, %v", w, err)
	}
}

func TestKillAndUnassignedGPU(t *testing.T) {
	w, src, clk, events, killed, _, root := setup(t, ActionKill)
	// Container b uses GPU-2, which it was never granted: over from the first MiB.
	src.set(
		gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 600},
		gpu.ProcessUsage{PID: 11, GPUUUID: "GPU-0", UsedMemoryMiB: 600},
		gpu.ProcessUsage{PID: 20, GPUUUID: "GPU-2", UsedMemoryMiB: 1},
	)
	for i := 0; i < 5; i++ {
		if s, _ := w.Check(); len(s.Acted) != 0 {
			t.Fatalf("acted within the grace: %v", s.Acted)
		}
		clk.t = clk.t.Add(5 * time.Second)
	}
	// While the first process is being ended, PID 11 exits and its number goes to an
	// unrelated process: the watchdog must not kill that one.
	w.cfg.Kill = func(pid int) error {
		*killed = append(*killed, pid)
		proc(t, root, 11, "0::/system.slice/other.service\n")
		return nil
	}
	s, _ := w.Check()
	sort.Ints(*killed)
	if len(s.Acted) != 2 || len(*killed) != 2 || (*killed)[0] != 10 || (*killed)[1] != 20 {
		t.Fatalf("acted %v killed %v", s.Acted, *killed)
	}
	joined := strings.Join(*events, "\n")
	if !strings.Contains(joined, "GPUMemoryOverLimitKilled") || !strings.Contains(joined, "GPU GPU-2, which was not assigned to it") {
		t.Errorf("events %v", *events)
	}
}

func TestCgroupOfSelf(t *testing.T) {
	cg, err := CgroupOf("/proc", os.Getpid())
	if err != nil || !strings.HasPrefix(cg, "/") {
		t.Fatalf("CgroupOf(self) = %q, %v", cg, err)
	}
	if _, err := CgroupOf(t.TempDir(), 1); err == nil {
		t.Error("missing process gave no error")
	}
	if _, err := ParseAction("nuke"); err == nil {
		t.Error("bad action accepted")
	}
}

func TestHoldsAcrossCgroupNamespaces(t *testing.T) {
	const rec = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb48e2dad_ddaf.slice/cri-containerd-2fdf.scope"
	for _, tc := range []struct {
		cg   string
		want bool
	}{
		{rec, true},
		{rec + "/nested", true},
		{rec + "x", false},
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb48e2dad_ddaf.slice", false},
		// The agent in its own cgroup namespace, in another pod of the node.
		{"/../../../kubepods-burstable.slice/kubepods-burstable-podb48e2dad_ddaf.slice/cri-containerd-2fdf.scope", true},
		{"/../../kubepods-burstable-podb48e2dad_ddaf.slice/cri-containerd-2fdf.scope/sub", true},
		{"/../../../../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb48e2dad_ddaf.slice/cri-containerd-2fdf.scope", true},
		{"/../../../kubepods-burstable.slice/kubepods-burstable-podb48e2dad_ddaf.slice/cri-containerd-9999.scope", false},
		{"/../../../kubepods-burstable.slice/kubepods-burstable-podb48e2dad_ddaf.slice", false},
		{"/../..", false},
		// Inside the agent's own cgroup: never a tenant container.
		{"/cri-containerd-2fdf.scope", false},
	} {
		if got := holds(rec, tc.cg); got != tc.want {
			t.Errorf("holds(%q) = %v, want %v", tc.cg, got, tc.want)
		}
	}
}

// metricValue is the value of the series of name whose labels include the given
// name/value pairs (the first match; -1 when none).
func metricValue(t *testing.T, m *metrics.Metrics, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range s.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			if s.GetCounter() != nil {
				return s.GetCounter().GetValue()
			}
			return s.GetGauge().GetValue()
		}
	}
	return -1
}

package watchdog

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"

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

func setup(t *testing.T, action Action) (*Watchdog, *fakeSource, *clock, *[]string, *[]int, *metrics.Metrics, string) {
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
	w, err := New(Config{
		Source: src, Records: records, ProcRoot: root, Grace: 30 * time.Second, ToleranceMiB: 10, Action: action,
		Event:   func(r checkpoint.Record, reason, msg string) { events = append(events, r.Pod+" "+reason+" "+msg) },
		Kill:    func(pid int) error { killed = append(killed, pid); return nil },
		Metrics: m, Log: logr.Discard(), Now: func() time.Time { return clk.t },
	})
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
	if v := testutil.ToFloat64(m.ContainerMemoryUsed.WithLabelValues("ns", "p1", "train", "GPU-0")); v != 900 {
		t.Errorf("container used metric %v", v)
	}
	if v := testutil.ToFloat64(m.ContainerSM.WithLabelValues("ns", "p1", "train", "GPU-0")); v != 25 {
		t.Errorf("container SM metric %v", v)
	}
	if v := testutil.ToFloat64(m.GPUMemoryAllocated.WithLabelValues("GPU-0", "0")); v != 3000 {
		t.Errorf("allocated metric %v", v)
	}
	if v := testutil.ToFloat64(m.GPUCoresAllocated.WithLabelValues("GPU-0", "0")); v != 30 {
		t.Errorf("cores metric %v", v)
	}
	if v := testutil.ToFloat64(m.GPUUnattributed.WithLabelValues("GPU-0", "0")); v != 77 {
		t.Errorf("unattributed metric %v", v)
	}
}

func TestGraceAndOneActionPerEpisode(t *testing.T) {
	w, src, clk, events, killed, m, _ := setup(t, ActionEvent)
	over := func() { src.set(gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 1011}) }
	over() // 1011 > 1000 + 10 tolerance
	for i := 0; i < 3; i++ {
		s, _ := w.Check()
		if len(s.Acted) != 0 {
			t.Fatalf("acted within the grace period at step %d", i)
		}
		clk.t = clk.t.Add(10 * time.Second)
	}
	s, _ := w.Check() // 30 s over
	if len(s.Acted) != 1 || len(*events) != 1 || !strings.Contains((*events)[0], "GPUMemoryOverLimit container train holds 1011 MiB on GPU GPU-0, above its limit of 1000 MiB, for 30s") {
		t.Fatalf("acted %v events %v", s.Acted, *events)
	}
	clk.t = clk.t.Add(time.Minute)
	if s, _ := w.Check(); len(s.Acted) != 0 {
		t.Fatal("acted twice in one episode")
	}
	// Back under the limit ends the episode; a new one waits for the grace again.
	src.set(gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 1010})
	_, _ = w.Check()
	over()
	_, _ = w.Check()
	clk.t = clk.t.Add(29 * time.Second)
	if s, _ := w.Check(); len(s.Acted) != 0 {
		t.Fatal("a new episode skipped the grace period")
	}
	clk.t = clk.t.Add(time.Second)
	if s, _ := w.Check(); len(s.Acted) != 1 {
		t.Fatal("second episode not acted on")
	}
	if len(*killed) != 0 {
		t.Errorf("event action killed %v", *killed)
	}
	if v := testutil.ToFloat64(m.WatchdogActions.WithLabelValues("event", "ns", "p1", "train")); v != 2 {
		t.Errorf("actions metric %v", v)
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
	_, _ = w.Check()
	// While the first process is being ended, PID 11 exits and its number goes to an
	// unrelated process: the watchdog must not kill that one.
	w.cfg.Kill = func(pid int) error {
		*killed = append(*killed, pid)
		proc(t, root, 11, "0::/system.slice/other.service\n")
		return nil
	}
	clk.t = clk.t.Add(30 * time.Second)
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

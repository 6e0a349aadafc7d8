// SPDX-License-Identifier: Apache-2.0

package watchdog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/gpu"
	"github.com/tessera-dev/tessera/node-agent/metrics"
)

// world simulates, second by second, the processes of a node as the watchdog sees
// them: a /proc with each process's cgroup and open NVIDIA device files, and the
// GPU memory the driver keeps alive while some process holds the descriptors it was
// allocated through (NVML listing it under the PID that allocated it, gone or not).
type world struct {
	t     *testing.T
	root  string
	procs map[int]*wproc
	mems  []*wmem
	next  int
	now   time.Time
	src   *fakeSource
	recs  []checkpoint.Record
	w     *Watchdog
	// events and evictions the watchdog asked for; refuse makes evictions fail.
	events    []string
	nodeEv    []string
	evictions []time.Time
	refuse    func() error
	m         *metrics.Metrics
}

type wproc struct {
	cgroup string
	files  []string // device paths its descriptors lead to
}

// wmem is memory on GPU-0 allocated by pid, alive while one of keepers lives.
type wmem struct {
	pid     int
	mib     int64
	keepers []int
	attack  bool
}

const cgNeighbour = "/kubepods.slice/kubepods-pod2.slice/cri-containerd-b.scope"

func newWorld(t *testing.T, opts ...func(*Config)) *world {
	wd := &world{t: t, root: t.TempDir(), procs: map[int]*wproc{}, next: 1000,
		now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	wd.src = &fakeSource{u: gpu.Usage{GPUs: []gpu.GPUUsage{{UUID: "GPU-0", Index: 0}}}}
	wd.m = metrics.New(nil)
	// The neighbour: a bound container of another pod with 500 MiB under its 2000 MiB
	// grant, and a forked worker that inherited its descriptors but has no context.
	wd.recs = []checkpoint.Record{{ContainerID: "b", PodUID: "uid-2", Namespace: "ns", Pod: "p2", Container: "infer", Cgroup: cgNeighbour,
		Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 2000}}}}
	n := wd.spawn(cgNeighbour, "/dev/nvidia0", "/dev/nvidiactl")
	wd.spawn(cgNeighbour, "/dev/nvidia0", "/dev/nvidiactl")
	wd.alloc(n, 500, false)
	cfg := Config{
		Source: wd.src, Records: func() []checkpoint.Record { return wd.recs }, ProcRoot: wd.root, Action: DefaultAction,
		Interval: DefaultInterval, Grace: DefaultGrace, Window: DefaultWindow, ToleranceMiB: 64,
		EvictAfter: DefaultEvictAfter, EscalationWindow: DefaultEscalationWindow,
		Event:     func(r checkpoint.Record, reason, msg string) { wd.events = append(wd.events, r.Pod+" "+reason+" "+msg) },
		NodeEvent: func(reason, msg string) { wd.nodeEv = append(wd.nodeEv, reason+" "+msg) },
		Evict: func(r checkpoint.Record) error {
			wd.evictions = append(wd.evictions, wd.now)
			if wd.refuse != nil {
				return wd.refuse()
			}
			return nil
		},
		Kill:    wd.kill,
		Metrics: wd.m, Log: logr.Discard(), Now: func() time.Time { return wd.now },
	}
	for _, o := range opts {
		o(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The fake /proc's descriptors are dangling links: their text names the device.
	w.devOf = func(p string) (uint32, uint32, bool) {
		target, err := os.Readlink(p)
		if err != nil {
			return 0, 0, false
		}
		switch name := strings.TrimPrefix(target, "/dev/"); {
		case name == "nvidiactl":
			return nvidiaMajor, nvidiactlMinor, true
		case strings.HasPrefix(name, "nvidia"):
			n, err := strconv.Atoi(strings.TrimPrefix(name, "nvidia"))
			return nvidiaMajor, uint32(n), err == nil
		}
		return 0, 0, false
	}
	wd.w = w
	return wd
}

func (wd *world) spawn(cgroup string, files ...string) int {
	wd.next++
	pid := wd.next
	wd.procs[pid] = &wproc{cgroup: cgroup}
	proc(wd.t, wd.root, pid, "0::"+cgroup+"\n")
	if err := os.MkdirAll(filepath.Join(wd.root, strconv.Itoa(pid), "fd"), 0o755); err != nil {
		wd.t.Fatal(err)
	}
	wd.give(pid, files...)
	return pid
}

// give opens (or receives over a Unix socket) descriptors of files in pid.
func (wd *world) give(pid int, files ...string) {
	p := wd.procs[pid]
	for _, f := range files {
		fd := filepath.Join(wd.root, strconv.Itoa(pid), "fd", strconv.Itoa(3+len(p.files)))
		if err := os.Symlink(f, fd); err != nil {
			wd.t.Fatal(err)
		}
		p.files = append(p.files, f)
	}
}

func (wd *world) alloc(pid int, mib int64, attack bool) *wmem {
	m := &wmem{pid: pid, mib: mib, keepers: []int{pid}, attack: attack}
	wd.mems = append(wd.mems, m)
	return m
}

func (wd *world) kill(pid int) error {
	if wd.procs[pid] == nil {
		return errors.New("no such process")
	}
	delete(wd.procs, pid)
	return os.RemoveAll(filepath.Join(wd.root, strconv.Itoa(pid)))
}

// exit ends pid the way a process ends by itself.
func (wd *world) exit(pid int) { _ = wd.kill(pid) }

func (wd *world) alive(cgroup string) []int {
	var out []int
	for pid, p := range wd.procs {
		if p.cgroup == cgroup {
			out = append(out, pid)
		}
	}
	return out
}

// sync frees the memory nobody keeps and shows NVML the rest.
func (wd *world) sync() {
	var ps []gpu.ProcessUsage
	live := wd.mems[:0]
	for _, m := range wd.mems {
		if slices.ContainsFunc(m.keepers, func(k int) bool { return wd.procs[k] != nil }) {
			live = append(live, m)
			ps = append(ps, gpu.ProcessUsage{PID: m.pid, GPUUUID: "GPU-0", UsedMemoryMiB: m.mib})
		}
	}
	wd.mems = live
	wd.src.set(ps...)
}

// attackMiB is the memory the attacker's allocations hold now.
func (wd *world) attackMiB() int64 {
	var n int64
	for _, m := range wd.mems {
		if m.attack {
			n += m.mib
		}
	}
	return n
}

// run steps the world one second at a time for d, calling step before each second
// and the watchdog every interval, and returns the MiB × s the attacker held above
// grant.
func (wd *world) run(d time.Duration, grant int64, step func(sec int)) (mibSeconds float64) {
	for sec := 0; time.Duration(sec)*time.Second < d; sec++ {
		step(sec)
		wd.sync()
		if time.Duration(sec)*time.Second%DefaultInterval == 0 {
			if _, err := wd.w.Check(); err != nil {
				wd.t.Fatal(err)
			}
			wd.sync()
		}
		mibSeconds += float64(max(wd.attackMiB()-grant, 0))
		wd.now = wd.now.Add(time.Second)
	}
	return mibSeconds
}

func (wd *world) count(reason string) int {
	n := 0
	for _, e := range wd.events {
		if strings.Contains(e, " "+reason+" ") {
			n++
		}
	}
	return n
}

// attackerPod binds container number n of the attacker's pod p1 (a new container id
// and cgroup each time the kubelet restarts it) with a 1000 MiB grant on GPU-0.
func (wd *world) attackerPod(n int) string {
	cg := fmt.Sprintf("/kubepods.slice/kubepods-pod1.slice/cri-containerd-a%d.scope", n)
	wd.recs = append(slices.DeleteFunc(wd.recs, func(r checkpoint.Record) bool { return r.Pod == "p1" && r.Container == "train" }),
		checkpoint.Record{ContainerID: fmt.Sprintf("a%d", n), PodUID: "uid-1", Namespace: "ns", Pod: "p1", Container: "train", Cgroup: cg,
			Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1000}}})
	return cg
}

const (
	attackGrant = 1000
	attackOver  = 2000 // MiB above the grant the attacker holds
)

// TestRespawningSupervisor: a supervisor process that respawns its worker, which
// allocates 2000 MiB above the container's grant without the hook, each time it
// ends; the kubelet restarts the container (10 s, 20 s, 40 s backoff) whenever all of
// its processes have ended. The first kill ends the worker; the respawned worker gets
// no new grace: the container is stopped as a whole (the supervisor included), and
// after DefaultEvictAfter stops the pod is evicted. With the defaults the attacker
// holds its excess for at most grace + interval + EvictAfter × interval (35 s): at
// most 2000 MiB × 35 s = 70,000 MiB·s.
func TestRespawningSupervisor(t *testing.T) {
	for _, tc := range []struct {
		name string
		// refusals is how many evictions a PodDisruptionBudget refuses.
		refusals int
		// bound is the documented worst case in seconds over the grant.
		bound time.Duration
	}{
		{"evicted", 0, DefaultGrace + DefaultInterval + DefaultEvictAfter*DefaultInterval},
		// Each refused eviction is retried after 10 s, 20 s, 40 s, …; meanwhile every
		// restart of the container is stopped within an interval of going over.
		{"PodDisruptionBudget refuses 4 evictions", 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wd := newWorld(t)
			refused := 0
			wd.refuse = func() error {
				if refused < tc.refusals {
					refused++
					return errors.New("Cannot evict pod as it would violate the pod's disruption budget")
				}
				return nil
			}
			restarts, backoff, downSince := 0, 10, -1
			cg := wd.attackerPod(0)
			super := wd.spawn(cg)
			worker, respawnAt := -1, 0
			evictedAt := -1
			episodes := 0 // times the attacker went over its grant
			mibs := wd.run(20*time.Minute, attackGrant, func(sec int) {
				if evictedAt < 0 && len(wd.evictions) > refused {
					evictedAt = sec // the pod terminates: nothing is restarted
				}
				if wd.procs[super] == nil && evictedAt < 0 {
					// The container has ended (its supervisor is gone): the kubelet
					// restarts it after its backoff, in a new cgroup.
					if len(wd.alive(cg)) > 0 {
						for _, p := range wd.alive(cg) {
							wd.exit(p)
						}
					}
					if downSince < 0 {
						downSince = sec
					}
					if sec-downSince >= backoff {
						restarts++
						backoff = min(2*backoff, 300)
						downSince = -1
						cg = wd.attackerPod(restarts)
						super, worker, respawnAt = wd.spawn(cg), -1, sec
					}
				}
				if wd.procs[super] != nil && (worker < 0 || wd.procs[worker] == nil) && sec >= respawnAt {
					if worker >= 0 {
						respawnAt, worker = sec+1, -1 // the supervisor notices a second later
						return
					}
					worker = wd.spawn(cg, "/dev/nvidia0", "/dev/nvidiactl")
					wd.alloc(worker, attackGrant+attackOver, true)
					episodes++
				}
			})
			t.Logf("%s: held %.0f MiB·s above the grant (%.1f s at %d MiB over) in %d episodes; %d kills, %d container stops, %d eviction requests (%d refused), %d restarts",
				tc.name, mibs, mibs/attackOver, attackOver, episodes, wd.count("GPUMemoryOverLimitKilled"), wd.count("GPUMemoryOverLimitContainerStopped"),
				len(wd.evictions), refused, restarts)
			if wd.count("GPUMemoryOverLimitKilled") != 1 {
				t.Errorf("kills %d, want 1: every later episode is a stop; events:\n%s", wd.count("GPUMemoryOverLimitKilled"), strings.Join(wd.events, "\n"))
			}
			if wd.count("GPUPodEvicted") != 1 || len(wd.evictions) != tc.refusals+1 {
				t.Fatalf("evictions %v (want %d), events:\n%s", wd.evictions, tc.refusals+1, strings.Join(wd.events, "\n"))
			}
			if !strings.Contains(strings.Join(wd.events, "\n"), "3 stops within the escalation window evict the pod") {
				t.Errorf("the eviction event does not name the rule: %v", wd.events)
			}
			if wd.procs[super] != nil || wd.attackMiB() != 0 {
				t.Errorf("the attacker still runs after its eviction: %v", wd.procs)
			}
			// Every stop ends the supervisor too, which is on no GPU.
			stops := wd.count("GPUMemoryOverLimitContainerStopped")
			if stops < DefaultEvictAfter {
				t.Errorf("%d stops, want at least %d", stops, DefaultEvictAfter)
			}
			// The bound: grace + interval for the first episode, an interval for each
			// later one (each is a stop on sight).
			bound := float64(attackOver) * (DefaultGrace + DefaultInterval + time.Duration(episodes-1)*DefaultInterval).Seconds()
			if tc.bound > 0 {
				bound = min(bound, float64(attackOver)*tc.bound.Seconds())
			}
			if mibs > bound {
				t.Errorf("held %.0f MiB·s above the grant, above the bound %.0f", mibs, bound)
			}
			t.Logf("measured %.0f MiB·s, bound %.0f MiB·s", mibs, bound)
			// The neighbour was never touched.
			if len(wd.alive(cgNeighbour)) != 2 || strings.Contains(strings.Join(wd.events, "\n"), "p2 ") {
				t.Errorf("the neighbour was acted on: %v", wd.events)
			}
			// Refused evictions were retried with a growing backoff, not every pass.
			for i := 2; i < len(wd.evictions); i++ {
				if wd.evictions[i].Sub(wd.evictions[i-1]) < wd.evictions[i-1].Sub(wd.evictions[i-2]) {
					t.Errorf("eviction retries not backing off: %v", wd.evictions)
				}
			}
			if tc.refusals > 0 && wd.count("GPUPodEvictionRefused") != tc.refusals {
				t.Errorf("%d refusal events, want %d", wd.count("GPUPodEvictionRefused"), tc.refusals)
			}
		})
	}
}

// TestSidecarWithPassedDescriptors: a container of the GPU pod that asked for no GPU
// (a sidecar) receives the GPU container's descriptors over a Unix socket. Either it
// allocates 2000 MiB through them with a context of its own (NVML lists the sidecar's
// PID, in no bound container), or the GPU container allocates and exits, leaving the
// sidecar holding the memory alive (NVML lists a PID that is gone). Both are charged
// to the sidecar, whose grant is 0: killed after the grace, stopped on sight after.
// The neighbour's forked worker, which holds the GPU's files too, is never charged.
func TestSidecarWithPassedDescriptors(t *testing.T) {
	for _, ownContext := range []bool{true, false} {
		name := "the sidecar allocates"
		if !ownContext {
			name = "the memory's owner exits, the sidecar keeps it alive"
		}
		t.Run(name, func(t *testing.T) {
			wd := newWorld(t)
			cg := wd.attackerPod(0)
			sideCg := "/kubepods.slice/kubepods-pod1.slice/cri-containerd-side.scope"
			main := wd.spawn(cg, "/dev/nvidia0", "/dev/nvidiactl")
			// The sidecar receives the descriptors under a device node of its own
			// making: matched by device number, not by name.
			side := wd.spawn(sideCg)
			wd.give(side, "/dev/nvidia0", "/dev/nvidiactl")
			if ownContext {
				wd.alloc(side, attackOver, true)
			} else {
				m := wd.alloc(main, attackOver, true)
				m.keepers = append(m.keepers, side)
				wd.exit(main)
			}
			var ended int
			mibs := wd.run(2*time.Minute, 0, func(sec int) {
				if ended == 0 && wd.procs[side] == nil {
					ended = sec
				}
			})
			t.Logf("%s: held %.0f MiB·s without a grant (%.1f s at %d MiB); sidecar ended after %d s; events:\n%s",
				name, mibs, mibs/attackOver, attackOver, ended, strings.Join(wd.events, "\n"))
			if wd.procs[side] != nil || wd.attackMiB() != 0 {
				t.Fatalf("the sidecar still holds %d MiB", wd.attackMiB())
			}
			joined := strings.Join(wd.events, "\n")
			if !strings.Contains(joined, "p1 GPUMemoryOverLimitKilled container (no GPU grant) cri-containerd-side.scope holds 2000 MiB on GPU GPU-0, which was not assigned to it") {
				t.Errorf("events:\n%s", joined)
			}
			if bound := float64(attackOver) * (DefaultGrace + DefaultInterval).Seconds(); mibs > bound {
				t.Errorf("held %.0f MiB·s, above the bound %.0f", mibs, bound)
			}
			if len(wd.alive(cgNeighbour)) != 2 || strings.Contains(joined, "p2 ") {
				t.Errorf("the neighbour was acted on: %v", wd.events)
			}
		})
	}
}

// TestMemoryHeldByNoLiveProcess: NVML lists memory under a PID that is gone (or of
// another PID namespace). Held through the files by a single container with a grant,
// it is charged to that container; held by processes of several granted containers
// (ambiguous) or by none of the pods the agent bound, it stays unattributed: a metric
// and one Warning event on the Node per episode, and nobody is killed.
func TestMemoryHeldByNoLiveProcess(t *testing.T) {
	t.Run("one granted container keeps it", func(t *testing.T) {
		wd := newWorld(t)
		cg := wd.attackerPod(0)
		parent := wd.spawn(cg, "/dev/nvidia0", "/dev/nvidiactl")
		child := wd.spawn(cg, "/dev/nvidia0", "/dev/nvidiactl") // forked, inherits the descriptors
		m := wd.alloc(parent, attackGrant+attackOver, true)
		m.keepers = append(m.keepers, child)
		wd.exit(parent)
		// The neighbour's forked worker holds the GPU's files without being listed
		// too: two containers with grants hold them, and the memory is ambiguous.
		mibs := wd.run(time.Minute, attackGrant, func(int) {})
		if wd.procs[child] == nil || len(wd.nodeEv) != 1 || !strings.Contains(wd.nodeEv[0], "held by more than one container or process, with GPU grants or outside the bound pods: ns/p1/train, ns/p2/infer") {
			t.Fatalf("ambiguous holders: node events %v, events %v", wd.nodeEv, wd.events)
		}
		if v := metricValue(t, wd.m, "tessera_gpu_unattributed_memory_bytes", "UUID", "GPU-0"); v != float64((attackGrant+attackOver)<<20) {
			t.Errorf("unattributed metric %v", v)
		}
		t.Logf("ambiguous: %.0f MiB·s held, not acted on (residual risk); node event: %s", mibs, wd.nodeEv[0])
		// Without the neighbour's silent worker, the attacker's container is the only
		// holder: charged, killed within grace + interval.
		for _, pid := range wd.alive(cgNeighbour) {
			if !slices.ContainsFunc(wd.mems, func(m *wmem) bool { return m.pid == pid }) {
				wd.exit(pid)
			}
		}
		mibs = wd.run(time.Minute, attackGrant, func(int) {})
		if wd.procs[child] != nil || wd.count("GPUMemoryOverLimitKilled") != 1 {
			t.Fatalf("the keeper was not ended: %v", wd.events)
		}
		if bound := float64(attackOver) * (DefaultGrace + DefaultInterval).Seconds(); mibs > bound {
			t.Errorf("held %.0f MiB·s, above the bound %.0f", mibs, bound)
		}
		t.Logf("one holder: %.0f MiB·s above the grant before the kill; %v", mibs, wd.events)
	})
	t.Run("held outside the bound pods", func(t *testing.T) {
		wd := newWorld(t)
		host := wd.spawn("/system.slice/some-tool.service", "/dev/nvidia0")
		gone := 4242
		m := wd.alloc(gone, 300, false)
		m.keepers = append(m.keepers, host)
		wd.run(2*time.Minute, 0, func(int) {})
		if wd.procs[host] == nil || len(wd.events) != 0 {
			t.Fatalf("acted outside the bound pods: %v", wd.events)
		}
		if len(wd.nodeEv) != 1 || !strings.Contains(wd.nodeEv[0], "GPUMemoryUnattributed 300 MiB on GPU GPU-0 cannot be attributed to any container") ||
			!strings.Contains(wd.nodeEv[0], "PIDs 4242 (gone, or of another PID namespace) hold 300 MiB") {
			t.Errorf("node events %v", wd.nodeEv)
		}
	})
}

func TestCharDev(t *testing.T) {
	if major, minor, ok := charDev("/dev/null"); !ok || major != 1 || minor != 3 {
		t.Errorf("charDev(/dev/null) = %d:%d %v", major, minor, ok)
	}
	if _, _, ok := charDev(t.TempDir()); ok {
		t.Error("a directory read as a character device")
	}
}

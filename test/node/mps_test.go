// SPDX-License-Identifier: Apache-2.0

//go:build linux

package node

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api"
)

// The MPS pipe directory as an MPS container sees it (the binding's mount).
const containerMPSPipeDir = "/run/tessera-mps"

// Pods in MPS sharing mode on a GPU the agent serves with an MPS control daemon. The
// agent is restarted with the node's first GPU in mps mode (--mps-gpus, node.sh's
// MPS_GPUS; the real nvidia-cuda-mps-control on a GPU, the suite's fake control
// program on the fake driver), as an administrator changes a drained GPU's mode, and
// restarted without it when the case ends. Then:
//
//   - the inventory publishes the GPU in mps mode and the daemon listens in its pipe
//     directory;
//   - an MPS pod without gpu-cores, then two at 30 and 70 gpu-cores computing together
//     (the probe of CoresShares, from a common start), all run bound through NRI; each
//     container was started with CUDA_MPS_PIPE_DIRECTORY at the GPU's pipe directory,
//     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at its cores (none without) and
//     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT at its memory, has them after cuInit too (the
//     hook sets them from the limits file, whose mps line carries the share and whose
//     cores are 0: no pacing), sees its gpu-memory, and its context is an MPS client:
//     the driver reports MPS enabled, and the device's SM count and the primary
//     context's execution-affinity SM count are the cores' share of the GPU's SMs;
//   - on a GPU, each pod's share of the solo pod's work rate (kernels per second
//     times the SMs each kernel fills: an MPS client launches one block per SM of its
//     share) is logged and checked loosely: the 30 % pod well below the 70 % pod;
//   - a time-sliced pod asking for the MPS GPU stays pending with the scheduler's
//     reason;
//   - no pod gets a warning event of the agent's MPS supervision or watchdog
//     (GPUMPS*: a daemon or server failure, a process outside the MPS server).
func testMPSShares(n *node) {
	if n.mode != "nri" {
		n.t.Skip("MPS containers are bound through NRI only (--mps-gpus needs --nri; the fallback binding refuses them)")
	}
	ctx := context.Background()
	uuid, g := n.mpsOnFirstGPU(ctx)
	if g.MPSClients != api.DefaultMPSClientLimit {
		n.t.Errorf("GPU %s published with mpsClients %d, want %d", uuid, g.MPSClients, api.DefaultMPSClientLimit)
	}
	pipe := filepath.Join(n.dir, "m", uuid, "pipe")
	if _, err := os.Stat(filepath.Join(pipe, "control")); err != nil {
		n.t.Fatalf("the MPS control daemon does not listen in %s: %v", pipe, err)
	}

	computeMS, startDelay := 1000, 6*time.Second
	if n.gpu {
		computeMS, startDelay = 3000, 5*time.Second
	}
	mpsPod := func(name string, cores int, memMiB int64, args ...string) *v1.Pod {
		p := n.pod(podSpec{name: name, gpus: 1, memMiB: memMiB, cores: cores, args: append([]string{"-mps"}, args...)})
		p.Annotations = map[string]string{api.AnnotationSharing: string(api.SharingMPS), api.AnnotationUUIDInclude: uuid}
		return p
	}
	solo := n.create(ctx, mpsPod("mps-solo", 0, 2048, "-compute", strconv.Itoa(computeMS)))
	solo = n.waitPhase(ctx, solo.Name, 2*time.Minute, v1.PodSucceeded, v1.PodFailed)
	soloLine := n.checkMPSClient(solo, uuid, g.SMCount, 0, 2048)
	soloRate, _ := n.rate(solo)
	soloWork := soloRate * float64(soloLine.int(n.t, "sms"))

	// The scheduler has seen the GPU in mps mode (it placed the solo pod there): a
	// time-sliced pod asking for that GPU finds none of its mode.
	ts := n.pod(podSpec{name: "mps-timesliced", gpus: 1, memMiB: 1024, args: []string{"-fill", "-chunk", "256"}})
	ts.Annotations = map[string]string{api.AnnotationUUIDInclude: uuid}
	ts = n.create(ctx, ts)

	at := time.Now().Add(startDelay)
	pods := map[int]*v1.Pod{}
	mem := map[int]int64{30: 2048, 70: 4096}
	for _, c := range []int{30, 70} {
		pods[c] = n.create(ctx, mpsPod(fmt.Sprintf("mps-%d", c), c, mem[c], "-compute", strconv.Itoa(computeMS),
			"-start-at", strconv.FormatInt(at.UnixMilli(), 10)))
	}
	ev := n.waitEvent(ctx, ts.Name, "FailedScheduling")
	if !strings.Contains(ev.Message, "mps sharing mode") {
		n.t.Errorf("pod %s (time-sliced) asking for the MPS GPU: FailedScheduling %q does not name the GPU's sharing mode", ts.Name, ev.Message)
	}
	share := map[int]float64{}
	sms := map[int]int64{}
	for _, c := range []int{30, 70} {
		p := n.waitPhase(ctx, pods[c].Name, 2*time.Minute, v1.PodSucceeded, v1.PodFailed)
		m := n.checkMPSClient(p, uuid, g.SMCount, c, mem[c])
		r, late := n.rate(p)
		sms[c] = m.int(n.t, "sms")
		share[c] = 100 * r * float64(sms[c]) / soloWork
		n.checkStartedTogether(p, late)
	}
	if p := n.get(ctx, ts.Name); p.Spec.NodeName != "" {
		n.t.Errorf("time-sliced pod %s was placed on node %s beside MPS clients", ts.Name, p.Spec.NodeName)
	}
	n.t.Logf("MPS GPU %s (%d SMs): solo %.1f kernels/s on %d SMs; 30%% pod %d SMs, %.1f%% of the solo work rate; 70%% pod %d SMs, %.1f%%; time-sliced pod pending: %s",
		uuid, g.SMCount, soloRate, soloLine.int(n.t, "sms"), sms[30], share[30], sms[70], share[70], ev.Message)
	if n.gpu {
		// Loose: MPS's share of a kernel's rate is not exactly its share of SMs
		// (34.7 % of a matmul's rate at 30 % in cuda-hook/gpu/run-mps.sh).
		if share[30] < 15 || share[30] > 45 || share[70] < 50 || share[70] > 95 || share[30]+20 > share[70] {
			n.t.Errorf("MPS shares %.1f%% and %.1f%% at 30 and 70 gpu-cores: want the 30%% pod within 15..45, the 70%% pod within 50..95, and 20 points apart at least",
				share[30], share[70])
		}
	}
	n.noDoubleGrant(ctx)
}

// checkMPSClient checks a finished MPS pod's binding and what its probe saw (the
// -mps line): granted cores (0: none) and memMiB on the GPU, it ran bound, was
// started with the MPS variables of its grant and had them after cuInit, and its
// context is an MPS client holding its share of the GPU's smCount SMs (unchecked
// where the inventory has no SM count). It returns the probe's mps line.
func (n *node) checkMPSClient(p *v1.Pod, uuid string, smCount, cores int, memMiB int64) probeLine {
	n.t.Helper()
	lines := n.probeLines(p)
	if p.Status.Phase != v1.PodSucceeded {
		n.t.Fatalf("pod %s: %s; probe printed %v", p.Name, p.Status.Phase, lines)
	}
	n.requireBound(p)
	if g := grant(n.t, p); g == nil || len(g.Devices) != 1 || g.Devices[0].UUID != uuid || g.Devices[0].Cores != cores || g.Devices[0].MemoryMiB != memMiB {
		n.t.Fatalf("pod %s: assignment %+v, want %d%% cores and %d MiB of %s", p.Name, g, cores, memMiB, uuid)
	}
	l := n.containerLimits(p)
	percent := cores
	if cores == 0 {
		percent = 100
	}
	if l.GPUs[0].Cores != 0 || l.MPS == nil || l.MPS.ThreadPercent != percent || l.MPS.PipeDir != containerMPSPipeDir {
		n.t.Errorf("pod %s: limits file has cores %d and mps %+v, want cores 0 (no pacing) and mps %d %s", p.Name, l.GPUs[0].Cores, l.MPS, percent, containerMPSPipeDir)
	}
	// Its accounting region is in a tmpfs of its own, not in the /dev/shm it shares with
	// the GPU's other clients.
	if l.RegionDir != api.ContainerRegionDir {
		n.t.Errorf("pod %s: limits file's region directory %q, want %s", p.Name, l.RegionDir, api.ContainerRegionDir)
	}
	// The agent's MPS events: the watchdog's GPUMPSBypassed (a process with a CUDA
	// context of its own), GPUMPSDaemonFailed, GPUMPSServerFailed.
	evs, err := n.podEvents(context.Background(), p.Name)
	if err != nil {
		n.t.Fatal(err)
	}
	for _, e := range evs {
		if strings.HasPrefix(e.Reason, "GPUMPS") && e.Type == v1.EventTypeWarning {
			n.t.Errorf("pod %s: event %s: %s", p.Name, e.Reason, e.Message)
		}
	}
	m, ok := find(lines, "mps")
	if !ok {
		n.t.Fatalf("pod %s: no mps line; probe printed %v", p.Name, lines)
	}
	want := map[string]string{
		"env_pipe": containerMPSPipeDir, "env_percent": strconv.Itoa(cores), "env_pinned": fmt.Sprintf("0=%dM", memMiB),
		"pipe": containerMPSPipeDir, "percent": strconv.Itoa(percent), "pinned": fmt.Sprintf("0=%dM", memMiB),
		"enabled": "1",
	}
	if cores == 0 {
		// No gpu-cores: the container gets no percentage; the hook sets the limits
		// file's 100 for the driver.
		want["env_percent"] = "-"
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if m.fields[k] != want[k] {
			n.t.Errorf("pod %s: probe's %s=%q, want %q (env_*: the container's environment; the others: after cuInit)", p.Name, k, m.fields[k], want[k])
		}
	}
	if mem, ok := find(lines, "memory"); !ok || mem.int(n.t, "total_mib") != memMiB {
		n.t.Errorf("pod %s: want %d MiB, probe printed %v", p.Name, memMiB, lines)
	}
	if smCount > 0 {
		// MPS gives a client its percentage of the SMs in whole TPCs (2 SMs): 38 of
		// 132 at 30 % on an H200; the fake driver does the same.
		exact := float64(smCount) * float64(percent) / 100
		tol := max(2, float64(smCount)/20)
		for _, k := range []string{"sms", "ctx_sms"} {
			if got := float64(m.int(n.t, k)); got < exact-tol || got > exact+tol {
				n.t.Errorf("pod %s at %d%% of %d SMs: probe's %s=%.0f, want about %.1f", p.Name, percent, smCount, k, got, exact)
			}
		}
	}
	return m
}

// mpsOnFirstGPU restarts the agent with the node's first GPU served through MPS, waits
// until the inventory says so and returns the GPU; when the test ends, the GPU is
// drained and given back to time-slicing for the cases that follow.
func (n *node) mpsOnFirstGPU(ctx context.Context) (string, api.GPU) {
	n.t.Helper()
	uuid := n.firstGPU(ctx)
	n.t.Cleanup(func() {
		n.deleteAll(ctx)
		n.restartAgent()
		n.waitSharing(ctx, uuid, api.SharingTimeSliced)
	})
	n.restartAgent("MPS_GPUS=" + uuid)
	return uuid, n.waitSharing(ctx, uuid, api.SharingMPS)
}

// restartAgent stops the node agent and starts it again with env added to the
// node's settings (node.sh reads MPS_GPUS when the agent starts).
func (n *node) restartAgent(env ...string) {
	n.t.Helper()
	m := *n
	m.env = append(slices.Clone(n.env), env...)
	if err := m.sh("stop", "agent"); err != nil {
		n.t.Fatalf("stopping the agent: %v", err)
	}
	if err := m.sh("start", "agent"); err != nil {
		n.t.Fatalf("starting the agent with %v: %v", env, err)
	}
}

// waitSharing waits until the node's inventory publishes the GPU in the sharing mode
// and returns it.
func (n *node) waitSharing(ctx context.Context, uuid string, mode api.Sharing) api.GPU {
	n.t.Helper()
	var got api.GPU
	waitFor(n.t, 60*time.Second, fmt.Sprintf("GPU %s published in %s mode", uuid, mode), func() (bool, error) {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		inv, err := api.DecodeInventory(node.Annotations[api.AnnotationInventory])
		if err != nil {
			return false, nil
		}
		for _, g := range inv.GPUs {
			if g.UUID == uuid {
				got = g
				return g.Mode() == mode, nil
			}
		}
		return false, nil
	})
	return got
}

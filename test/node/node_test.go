// SPDX-License-Identifier: Apache-2.0

//go:build linux

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
)

// modes are the binding passes: NRI at container creation, then the fallback binding
// at the first CUDA call (TESSERA_NODE_MODES=nri runs one).
func modes() []string {
	if m := os.Getenv("TESSERA_NODE_MODES"); m != "" {
		return strings.Split(m, ",")
	}
	return []string{"nri", "fallback"}
}

// hostDriverSetup makes a pod mount the node's driver libraries from dir itself and,
// with onPath, put them first on the loader's path (the test image has no driver).
func hostDriverSetup(p *v1.Pod, dir string, onPath bool) {
	p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "driver", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: dir}}})
	c := &p.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: "driver", MountPath: "/opt/host-driver", ReadOnly: true})
	if onPath {
		c.Env = append(c.Env, v1.EnvVar{Name: "LD_LIBRARY_PATH", Value: "/opt/host-driver"})
	}
}

func (n *node) with(t *testing.T) *node {
	c := *n
	c.t = t
	return &c
}

func TestNode(t *testing.T) {
	enabled(t)
	for _, mode := range modes() {
		t.Run(mode, func(t *testing.T) {
			n := startNode(t, mode)
			for _, tc := range []struct {
				name string
				run  func(*node)
			}{
				{"MemoryLimit", testMemoryLimit},
				{"CDIDevices", testCDIDevices},
				{"OtherGPUsClosed", testOtherGPUsClosed},
				{"PlainPodUntouched", testPlainPodUntouched},
				{"DefaultSchedulerRefused", testDefaultSchedulerRefused},
				{"DeleteFreesGrant", testDeleteFreesGrant},
				{"FiftyPodsAtOnce", testFiftyPods},
				{"CoresShares", testCoresShares},
				{"MPSShares", testMPSShares},
				{"TorchLimit", testTorchLimit},
				{"AgentDownRefused", testAgentDownRefused},
				{"RestartAgent", func(n *node) { testRestart(n, "agent") }},
				{"RestartKubelet", func(n *node) { testRestart(n, "kubelet") }},
				{"RestartContainerd", func(n *node) { testRestart(n, "containerd") }},
			} {
				t.Run(tc.name, func(t *testing.T) {
					tn := n.with(t)
					tc.run(tn)
					tn.deleteAll(context.Background())
				})
			}
		})
	}
}

// A pod granted 4096 MiB sees 4096 MiB in total and is refused past it.
func testMemoryLimit(n *node) {
	ctx := context.Background()
	p := n.create(ctx, n.pod(podSpec{name: "mem-4096", gpus: 1, memMiB: 4096, args: []string{"-fill", "-chunk", "256"}}))
	p = n.waitPhase(ctx, p.Name, 90*time.Second, v1.PodSucceeded, v1.PodFailed)
	lines := n.probeLines(p)
	if p.Status.Phase != v1.PodSucceeded {
		n.t.Fatalf("pod %s: %s; probe said %v", p.Name, p.Status.Phase, lines)
	}
	if g := grant(n.t, p); g == nil || len(g.Devices) != 1 || g.Devices[0].MemoryMiB != 4096 {
		n.t.Fatalf("pod %s: assignment %+v, want one GPU with 4096 MiB", p.Name, g)
	}
	ctxLine, _ := find(lines, "context")
	mem, ok := find(lines, "memory")
	fill, ok2 := find(lines, "fill")
	if !ok || !ok2 {
		n.t.Fatalf("pod %s: probe printed %v", p.Name, lines)
	}
	if n.mode == "nri" && ctxLine.fields["limits"] != "yes" {
		n.t.Errorf("the limits file is not mounted: %v", ctxLine.fields)
	}
	if got := mem.int(n.t, "total_mib"); got != 4096 {
		n.t.Errorf("cuMemGetInfo total: %d MiB, want 4096", got)
	}
	if got := mem.int(n.t, "device_total_mib"); got != 4096 {
		n.t.Errorf("cuDeviceTotalMem: %d MiB, want 4096", got)
	}
	free, filled := mem.int(n.t, "free_mib"), fill.int(n.t, "filled_mib")
	if fill.fields["err"] != "2" {
		n.t.Errorf("allocation past the limit returned %s, want 2 (CUDA_ERROR_OUT_OF_MEMORY)", fill.fields["err"])
	}
	if filled > free || free-filled >= 256 {
		n.t.Errorf("filled %d MiB of %d free: want within one 256 MiB chunk of the limit, never past it", filled, free)
	}
	n.t.Logf("4096 MiB pod: total %d, free after context %d, filled %d MiB, then err %s", mem.int(n.t, "total_mib"), free, filled, fill.fields["err"])
}

// A GPU container gets its GPUs and the driver through the node agent's CDI spec: the
// spec the agent wrote into the node's CDI directory (containerd's cdi_spec_dirs) loads
// through the CDI library, which validates it, with one device per GPU of the node's
// inventory. A pod granted one GPU then has exactly that device's node with NRI (the
// agent names the container's CDI device; containerd resolves it) and every GPU's
// with the fallback binding (the device plugin names them all; the hook shows the
// container its own), and loads libcuda.so.1 from the spec's mounts: the image has
// no driver.
func testCDIDevices(n *node) {
	ctx := context.Background()
	gpuNodes, all, ours := n.cdiGPUNodes(ctx)

	p := n.create(ctx, n.pod(podSpec{name: "cdi-1024", gpus: 1, memMiB: 1024, args: []string{"-fill", "-chunk", "256"}}))
	p = n.waitPhase(ctx, p.Name, 90*time.Second, v1.PodSucceeded, v1.PodFailed)
	lines := n.probeLines(p)
	if p.Status.Phase != v1.PodSucceeded {
		n.t.Fatalf("pod %s: %s; probe printed %v", p.Name, p.Status.Phase, lines)
	}
	n.requireBound(p)
	g := grant(n.t, p)
	if g == nil || len(g.Devices) != 1 {
		n.t.Fatalf("pod %s: assignment %+v, want one GPU", p.Name, g)
	}
	want := gpuNodes[g.Devices[0].UUID]
	if n.mode == "fallback" {
		want = all
	}
	want = slices.Clone(want)
	slices.Sort(want)
	c, _ := find(lines, "context")
	got := strings.Split(c.fields["nodes"], ",")
	slices.Sort(got)
	if !slices.Equal(got, want) {
		n.t.Errorf("pod %s granted %s has GPU device nodes %v, want %v (%s binding)", p.Name, g.Devices[0].UUID, got, want, n.mode)
	}
	d, _ := find(lines, "driver")
	if d.fields["path"] != cdiLibraryDir+"/libcuda.so.1" {
		n.t.Errorf("pod %s loaded the driver from %q, want the CDI spec's %s/libcuda.so.1", p.Name, d.fields["path"], cdiLibraryDir)
	}
	if mem, ok := find(lines, "memory"); !ok || mem.int(n.t, "total_mib") != 1024 {
		n.t.Errorf("pod %s: want 1024 MiB, probe printed %v", p.Name, lines)
	}
	n.t.Logf("pod %s granted %s: GPU device nodes %v, driver %s; CDI spec devices %d", p.Name, g.Devices[0].UUID, got, d.fields["path"], len(ours))
}

// cdiGPUNodes reads the node's CDI spec, checks that it validates and has one device
// per GPU of the inventory, each with one GPU device node (/dev/nvidia<N>), and returns
// those nodes by GPU UUID, all of them, and the spec's device names.
func (n *node) cdiGPUNodes(ctx context.Context) (map[string][]string, []string, []string) {
	dir := filepath.Join(n.dir, "cdi")
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		n.t.Fatalf("CDI cache of %s: %v", dir, err)
	}
	for path, errs := range cache.GetErrors() {
		n.t.Errorf("CDI spec %s does not validate: %v", path, errs)
	}
	kind := api.DefaultDomain + "/gpu"
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	inv, err := api.DecodeInventory(node.Annotations[api.AnnotationInventory])
	if err != nil {
		n.t.Fatalf("node inventory: %v", err)
	}
	gpuNodes := map[string][]string{}
	var all []string
	for _, g := range inv.GPUs {
		d := cache.GetDevice(kind + "=" + g.UUID)
		if d == nil {
			n.t.Fatalf("the CDI spec in %s has no device %s=%s: %v", dir, kind, g.UUID, cache.ListDevices())
		}
		for _, dn := range d.ContainerEdits.DeviceNodes {
			if strings.HasPrefix(dn.Path, "/dev/nvidia") && strings.Trim(strings.TrimPrefix(dn.Path, "/dev/nvidia"), "0123456789") == "" {
				gpuNodes[g.UUID] = append(gpuNodes[g.UUID], dn.Path)
				all = append(all, dn.Path)
			}
		}
		if len(gpuNodes[g.UUID]) != 1 {
			n.t.Errorf("CDI device %s=%s has GPU device nodes %v, want one", kind, g.UUID, gpuNodes[g.UUID])
		}
	}
	var ours []string
	for _, name := range cache.ListDevices() {
		if strings.HasPrefix(name, kind+"=") {
			ours = append(ours, name)
		}
	}
	if len(ours) != len(inv.GPUs) {
		n.t.Errorf("the CDI spec has devices %v, the node's inventory %d GPUs", ours, len(inv.GPUs))
	}
	return gpuNodes, all, ours
}

// On a node with two or more GPUs, a pod granted one can open no other: the probe
// tries each GPU's device node (character 195:N) before using CUDA, the one the
// container has and, for the others, nodes it makes itself with mknod (a root
// container has CAP_MKNOD), so that only the container's device cgroup stands between
// it and them; then CUDA shows it one GPU. Through NRI the container holds its GPU's
// node only and the cgroup refuses the others (EPERM). The fallback binding gives
// every GPU container every GPU's node (docs/install.md, "Runtimes without NRI"):
// there the others open, which is logged, and the hook's single visible GPU is
// checked. On the fake driver the nodes have no driver behind them: the allowed ones
// give ENXIO, the refused ones EPERM.
func testOtherGPUsClosed(n *node) {
	ctx := context.Background()
	gpuNodes, _, _ := n.cdiGPUNodes(ctx)
	if len(gpuNodes) < 2 {
		n.t.Skipf("the node has %d GPU(s); this case needs two or more", len(gpuNodes))
	}
	minorOf := map[string]int{}
	var minors []string
	for uuid, paths := range gpuNodes {
		m, err := strconv.Atoi(strings.TrimPrefix(paths[0], "/dev/nvidia"))
		if err != nil {
			n.t.Fatalf("GPU %s: device node %s", uuid, paths[0])
		}
		minorOf[uuid] = m
		minors = append(minors, strconv.Itoa(m))
	}
	slices.Sort(minors)
	p := n.create(ctx, n.pod(podSpec{name: "other-gpus", gpus: 1, memMiB: 1024, args: []string{"-try-gpus", strings.Join(minors, ",")}}))
	p = n.waitPhase(ctx, p.Name, 90*time.Second, v1.PodSucceeded, v1.PodFailed)
	lines := n.probeLines(p)
	if p.Status.Phase != v1.PodSucceeded {
		n.t.Fatalf("pod %s: %s; probe printed %v", p.Name, p.Status.Phase, lines)
	}
	g := grant(n.t, p)
	if g == nil || len(g.Devices) != 1 {
		n.t.Fatalf("pod %s: assignment %+v, want one GPU", p.Name, g)
	}
	own := minorOf[g.Devices[0].UUID]
	allowed := "opened"
	if !n.gpu {
		allowed = "ENXIO"
	}
	tried := 0
	var opened []int
	for _, l := range lines {
		if l.event != "gpu-open" {
			continue
		}
		tried++
		m, how, result := int(l.int(n.t, "minor")), l.fields["how"], l.fields["result"]
		switch {
		case m == own:
			if how != "present" || result != allowed {
				n.t.Errorf("pod %s, its own GPU (minor %d): %s, %s; want present, %s", p.Name, m, how, result, allowed)
			}
		case n.mode == "fallback":
			if result == allowed {
				opened = append(opened, m)
			}
		default:
			if how == "present" || (how == "made" && result != "EPERM") {
				n.t.Errorf("pod %s granted minor %d reached GPU minor %d: %s, %s; want it absent and refused (EPERM)", p.Name, own, m, how, result)
			}
		}
	}
	if tried != len(minors) {
		n.t.Errorf("pod %s tried %d GPU device nodes, want %d: %v", p.Name, tried, len(minors), lines)
	}
	if d, ok := find(lines, "devices"); !ok || d.int(n.t, "count") != 1 {
		n.t.Errorf("pod %s: CUDA shows it %v GPUs, want 1", p.Name, d.fields["count"])
	}
	if n.mode == "fallback" {
		n.t.Logf("pod %s granted GPU minor %d (fallback binding): the device nodes of GPUs %v open in it; CUDA shows it one GPU", p.Name, own, opened)
	} else {
		n.t.Logf("pod %s granted GPU minor %d: the other %d GPUs' nodes absent and refused by its device cgroup; CUDA shows it one GPU", p.Name, own, len(minors)-1)
	}
}

// A pod without GPU requests gets nothing from Tessera: no hook, no limits, no GPUs
// named, no device node and no driver (the image has none; only the CDI spec of a GPU
// container brings it), so it cannot run CUDA.
func testPlainPodUntouched(n *node) {
	ctx := context.Background()
	p := n.create(ctx, n.pod(podSpec{name: "plain", args: []string{"-fill", "-chunk", "4096"}}))
	p = n.waitPhase(ctx, p.Name, 90*time.Second, v1.PodSucceeded, v1.PodFailed)
	lines := n.probeLines(p)
	c, ok := find(lines, "context")
	if !ok {
		n.t.Fatalf("pod %s: %s; probe printed %v", p.Name, p.Status.Phase, lines)
	}
	if c.fields["preload"] != "no" || c.fields["limits"] != "no" || c.fields["visible"] != "-" || c.fields["gpu_nodes"] != "0" {
		n.t.Errorf("a pod without GPU requests was changed: %v", c.fields)
	}
	if _, has := p.Annotations["tessera.dev/gpu-assignment"]; has {
		n.t.Errorf("a pod without GPU requests has an assignment")
	}
	if d, loaded := find(lines, "driver"); loaded {
		n.t.Errorf("a pod without GPU requests has a driver: %v", d.fields)
	}
	if _, ran := find(lines, "first-cuda"); ran {
		n.t.Errorf("a pod without GPU requests used a GPU: %v", lines)
	}
	if e, _ := find(lines, "error"); e.fields["call"] != "dlopen" {
		n.t.Errorf("a pod without GPU requests: want the driver not found (dlopen), probe printed %v", lines)
	}
}

// A pod asking for tessera.dev/gpu through the default scheduler is refused with an
// event and never runs CUDA, with or without limits. Asking for gpu alone, the default
// scheduler places it (the device plugin advertises tessera.dev/gpu) and the node agent
// refuses its container; asking for gpu-memory too, the default scheduler finds no
// node advertising that resource and it stays pending.
func testDefaultSchedulerRefused(n *node) {
	ctx := context.Background()
	p := n.create(ctx, n.pod(podSpec{name: "default-sched-gpu", gpus: 1, scheduler: v1.DefaultSchedulerName,
		args: []string{"-fill", "-chunk", "256"}}))
	pm := n.create(ctx, n.pod(podSpec{name: "default-sched-gpu-mem", gpus: 1, memMiB: 4096, scheduler: v1.DefaultSchedulerName,
		args: []string{"-fill", "-chunk", "256"}}))
	ev := n.waitEvent(ctx, p.Name, "GPUContainerRefused")
	n.t.Logf("pod %s: event %s: %s", p.Name, ev.Reason, ev.Message)
	if !strings.Contains(ev.Message, "schedulerName") {
		n.t.Errorf("the refusal does not tell the user to use Tessera's scheduler: %q", ev.Message)
	}
	evm := n.waitEvent(ctx, pm.Name, "FailedScheduling")
	n.t.Logf("pod %s: event %s: %s", pm.Name, evm.Reason, evm.Message)
	time.Sleep(3 * time.Second)
	p = n.get(ctx, p.Name)
	lines := n.probeLines(p)
	if _, ran := find(lines, "first-cuda"); ran {
		n.t.Errorf("the refused container ran CUDA: %v", lines)
	}
	if n.mode == "nri" {
		// NRI refuses the container's creation: it never starts.
		if _, started := find(lines, "start"); started || p.Status.Phase == v1.PodRunning || p.Status.Phase == v1.PodSucceeded {
			n.t.Errorf("the refused container started: phase %s, probe printed %v", p.Status.Phase, lines)
		}
	}
	if pm = n.get(ctx, pm.Name); pm.Spec.NodeName != "" {
		n.t.Errorf("pod %s asking for gpu-memory was placed by the default scheduler", pm.Name)
	}
}

// podEvents are the events about the pod.
func (n *node) podEvents(ctx context.Context, pod string) ([]v1.Event, error) {
	evs, err := n.client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", pod).String()})
	if err != nil {
		return nil, err
	}
	return evs.Items, nil
}

// waitEvent waits for an event with this reason about the pod.
func (n *node) waitEvent(ctx context.Context, pod, reason string) v1.Event {
	n.t.Helper()
	var ev v1.Event
	waitFor(n.t, 90*time.Second, fmt.Sprintf("a %s event for pod %s", reason, pod), func() (bool, error) {
		evs, err := n.podEvents(ctx, pod)
		if err != nil {
			return false, err
		}
		for _, e := range evs {
			if e.Reason == reason {
				ev = e
				return true, nil
			}
		}
		return false, nil
	})
	return ev
}

// Deleting a pod frees its grant: a pod that does not fit beside it starts once it is
// gone, and its limits directory is removed.
func testDeleteFreesGrant(n *node) {
	ctx := context.Background()
	whole := n.create(ctx, n.pod(podSpec{name: "whole-node", gpus: n.gpuCount(ctx), cores: 100, args: []string{"-hold", "-interval", "1000"}}))
	n.waitLine(ctx, n.waitPhase(ctx, whole.Name, 90*time.Second, v1.PodRunning), "check", 60*time.Second)
	dirs := n.boundDirs(whole.UID)
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "limits")); err != nil {
			n.t.Errorf("limits of the bound pod %s: %v", whole.Name, err)
		}
	}
	if len(dirs) != 1 {
		n.t.Fatalf("the agent's checkpoint holds %d records of pod %s, want 1", len(dirs), whole.Name)
	}
	next := n.create(ctx, n.pod(podSpec{name: "after-delete", gpus: 1, memMiB: 1024, args: []string{"-fill", "-chunk", "256"}}))
	time.Sleep(3 * time.Second)
	if p := n.get(ctx, next.Name); p.Spec.NodeName != "" {
		n.t.Fatalf("pod %s was placed beside a pod holding every GPU", next.Name)
	}
	n.deletePods(ctx, whole.Name)
	p := n.waitPhase(ctx, next.Name, 90*time.Second, v1.PodSucceeded, v1.PodFailed)
	mem, ok := find(n.probeLines(p), "memory")
	if p.Status.Phase != v1.PodSucceeded || !ok || mem.int(n.t, "total_mib") != 1024 {
		n.t.Errorf("pod %s after the delete: %s, probe printed %v", p.Name, p.Status.Phase, n.probeLines(p))
	}
	waitFor(n.t, 60*time.Second, "the deleted pod's record and limits directory removed", func() (bool, error) {
		_, err := os.Stat(dirs[0])
		return len(n.boundDirs(whole.UID)) == 0 && os.IsNotExist(err), nil
	})
}

// boundDirs returns the limits directories of the pod's containers that the agent's
// checkpoint records.
func (n *node) boundDirs(uid types.UID) []string {
	n.t.Helper()
	data, err := os.ReadFile(filepath.Join(n.dir, "agent", "checkpoint.json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		n.t.Fatal(err)
	}
	var file struct {
		Records json.RawMessage `json:"records"`
	}
	var recs []checkpoint.Record
	if err := json.Unmarshal(data, &file); err != nil {
		n.t.Fatalf("agent checkpoint: %v", err)
	}
	if err := json.Unmarshal(file.Records, &recs); err != nil {
		var byID map[string]checkpoint.Record
		if err2 := json.Unmarshal(file.Records, &byID); err2 != nil {
			n.t.Fatalf("agent checkpoint records: %v", err)
		}
		for _, r := range byID {
			recs = append(recs, r)
		}
	}
	var dirs []string
	for _, r := range recs {
		if r.PodUID == string(uid) {
			dirs = append(dirs, r.LimitsDir)
		}
	}
	return dirs
}

// 50 pods (10 per GPU on smaller nodes) created at once all start with the limits their assignment says, and no GPU
// is granted twice.
func testFiftyPods(n *node) {
	ctx := context.Background()
	// Tessera's profiles put at most 10 containers on a GPU (maxTenantsPerGPU).
	count := min(50, 10*n.gpuCount(ctx))
	names := make([]string, count)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range count {
		names[i] = fmt.Sprintf("burst-%02d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.create(ctx, n.pod(podSpec{name: names[i], gpus: 1, memMiB: int64(1024 * (1 + i%4)), cores: 5 * (i % 3),
				args: []string{"-hold", "-chunk", "256", "-interval", "2000"}}))
		}()
	}
	wg.Wait()
	for _, name := range names {
		p := n.waitPhase(ctx, name, 4*time.Minute, v1.PodRunning, v1.PodFailed, v1.PodSucceeded)
		if p.Status.Phase != v1.PodRunning {
			n.t.Errorf("pod %s: %s", name, p.Status.Phase)
			continue
		}
		mem := n.waitLine(ctx, p, "memory", 2*time.Minute)
		g := grant(n.t, p)
		if g == nil || len(g.Devices) != 1 {
			n.t.Errorf("pod %s: assignment %+v", name, g)
			continue
		}
		if got := mem.int(n.t, "total_mib"); got != g.Devices[0].MemoryMiB {
			n.t.Errorf("pod %s sees %d MiB, its assignment grants %d", name, got, g.Devices[0].MemoryMiB)
		}
	}
	n.t.Logf("%d pods created at once: all running with their limits %.1fs after the first create", count, time.Since(start).Seconds())
	n.noDoubleGrant(ctx)
}

// testRestart restarts a component while pods run and while pods are being created:
// running containers keep their limits (same container, the hook still refuses past
// the limit), pods created around the restart either run with their limits or do not
// run at all, pods created afterwards bind, and no GPU is granted twice.
func testRestart(n *node, component string) {
	ctx := context.Background()
	var running []*v1.Pod
	for i := range 2 {
		p := n.create(ctx, n.pod(podSpec{name: fmt.Sprintf("%s-running-%d", component, i), gpus: 1, memMiB: 2048, cores: 20,
			args: []string{"-fill", "-chunk", "256", "-hold", "-interval", "500"}}))
		p = n.waitPhase(ctx, p.Name, 90*time.Second, v1.PodRunning)
		n.waitLine(ctx, p, "check", 60*time.Second)
		n.requireBound(p)
		running = append(running, n.get(ctx, p.Name))
	}
	var during []string
	for i := range 4 {
		name := fmt.Sprintf("%s-during-%d", component, i)
		during = append(during, name)
		n.create(ctx, n.pod(podSpec{name: name, gpus: 1, memMiB: 1024, cores: 10, args: []string{"-hold", "-interval", "1000"}}))
	}
	n.restart(component, 2*time.Second)
	restarted := time.Now()

	for _, before := range running {
		p := n.get(ctx, before.Name)
		if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) != 1 ||
			p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.ContainerStatuses[0].ContainerID != before.Status.ContainerStatuses[0].ContainerID {
			n.t.Errorf("pod %s was disturbed by the %s restart: %s %+v", p.Name, component, p.Status.Phase, p.Status.ContainerStatuses)
			continue
		}
		waitFor(n.t, 60*time.Second, fmt.Sprintf("pod %s checking its limit after the restart", p.Name), func() (bool, error) {
			for _, l := range n.probeLines(p) {
				if l.event == "check" && l.logged.After(restarted) {
					if l.fields["total_mib"] != "2048" || l.fields["over"] != "refused" {
						return false, fmt.Errorf("after the %s restart the container sees %v", component, l.fields)
					}
					return true, nil
				}
			}
			return false, nil
		})
	}

	ran, failed, refused := 0, 0, 0
	for _, name := range during {
		p := n.waitPhase(ctx, name, 3*time.Minute, v1.PodRunning, v1.PodFailed, v1.PodSucceeded)
		if p.Status.Phase == v1.PodRunning {
			// Running: it gets past its CUDA start, or fails there.
			waitFor(n.t, 60*time.Second, fmt.Sprintf("pod %s past its CUDA start", name), func() (bool, error) {
				lines := n.probeLines(p)
				_, m := find(lines, "memory")
				_, e := find(lines, "error")
				return m || e, nil
			})
		}
		lines := n.probeLines(p)
		c, started := find(lines, "context")
		mem, ok := find(lines, "memory")
		if r := n.validatorRefusals(ctx, name); r > 0 {
			refused++
			n.t.Logf("pod %s: containerd's NRI validator refused its container %d time(s) (the agent's plugin not connected); then %s", name, r, p.Status.Phase)
		}
		switch {
		case ok && mem.fields["total_mib"] == "1024":
			ran++
		case ok:
			n.t.Errorf("pod %s created during the %s restart runs without its limit: %v %v", name, component, c.fields, mem.fields)
		case c.fields["limits"] == "no" && c.fields["gpu_nodes"] != "" && c.fields["gpu_nodes"] != "0" && n.mode == "nri":
			n.t.Errorf("pod %s created during the %s restart has GPU device nodes but no limits: %v", name, component, c.fields)
		case started && c.fields["limits"] == "no" && n.mode == "nri":
			// With the validator on, containerd refuses a GPU container while the
			// agent's NRI plugin is not connected: none starts unbound.
			n.t.Errorf("pod %s created during the %s restart started without its binding: %v", name, component, c.fields)
		default:
			failed++
			e, _ := find(lines, "error")
			n.t.Logf("pod %s created during the %s restart did not run CUDA: %s %s %s context %v error %v",
				name, component, p.Status.Phase, p.Status.Reason, p.Status.Message, c.fields, e.fields)
		}
	}
	n.t.Logf("%s restart: of %d pods created around it, %d ran with their limits, %d did not run CUDA; containerd refused the container of %d until the agent was back",
		component, len(during), ran, failed, refused)

	after := n.create(ctx, n.pod(podSpec{name: component + "-after", gpus: 1, memMiB: 3072, args: []string{"-fill", "-chunk", "256"}}))
	p := n.waitPhase(ctx, after.Name, 3*time.Minute, v1.PodSucceeded, v1.PodFailed)
	mem, ok := find(n.probeLines(p), "memory")
	if p.Status.Phase != v1.PodSucceeded || !ok || mem.fields["total_mib"] != "3072" {
		n.t.Errorf("pod %s created after the %s restart: %s, probe printed %v", p.Name, component, p.Status.Phase, n.probeLines(p))
	}
	n.noDoubleGrant(ctx)
}

// validatorRefusals counts the pod's events in which the runtime refused to create its
// container because a required NRI plugin was not present (NRI's default validator).
func (n *node) validatorRefusals(ctx context.Context, pod string) int {
	n.t.Helper()
	evs, err := n.podEvents(ctx, pod)
	if err != nil {
		n.t.Fatal(err)
	}
	count := 0
	for _, e := range evs {
		if strings.Contains(e.Message, "required plugin") {
			count += int(max(e.Count, 1))
		}
	}
	return count
}

// gpuCount is the number of GPUs in the node's published inventory.
func (n *node) gpuCount(ctx context.Context) int {
	n.t.Helper()
	return len(n.inventory(ctx).GPUs)
}

// requireBound fails the test when a GPU container of the NRI pass started without its
// binding (no limits file, no hook), naming how long the agent took to bind it: NRI
// runtimes drop a plugin that answers CreateContainer later than their request timeout
// (containerd's plugin_request_timeout, 2 s by default) and create the container
// without its adjustment.
func (n *node) requireBound(p *v1.Pod) {
	n.t.Helper()
	if n.mode != "nri" {
		return
	}
	c, _ := find(n.probeLines(p), "context")
	if c.fields["limits"] == "yes" && c.fields["preload"] == "yes" {
		return
	}
	took := "no binding logged"
	if d := n.agentBindTimes([]string{p.Name}, "nri"); len(d) == 1 {
		took = "the agent's binding took " + d[0].String()
	}
	n.t.Fatalf("pod %s started without its binding (%v): %s; containerd gives NRI plugins 2 s (plugin_request_timeout) and creates the container without a late plugin's adjustment",
		p.Name, c.fields, took)
}

// With containerd's NRI default validator on and the chart's require-nri-plugin
// policy, a GPU container created while the agent is down is refused by the runtime
// (its pod requires the agent's NRI plugin, which is not connected), retried by
// kubelet, and created with its binding once the agent is back. The GPU container
// follows an init container that sleeps, so that its creation falls while the agent
// is stopped: its devices were allocated at the pod's admission, before.
func testAgentDownRefused(n *node) {
	if n.mode != "nri" {
		n.t.Skip("the fallback binding does not use NRI (its containerd has no validator)")
	}
	ctx := context.Background()
	p := n.pod(podSpec{name: "agent-down", gpus: 1, memMiB: 1024, args: []string{"-fill", "-chunk", "256"}})
	p.Spec.InitContainers = []v1.Container{{Name: "wait", Image: testImage, ImagePullPolicy: v1.PullNever, Args: []string{"-sleep", "3000"}}}
	p = n.create(ctx, p)
	if p.Annotations[requiredPluginsKey+"probe"] != `["tessera"]` || p.Annotations[requiredPluginsKey+"wait"] != "" {
		n.t.Fatalf("pod %s: want the require-nri-plugin annotation on its GPU container only: %v", p.Name, p.Annotations)
	}
	waitFor(n.t, 90*time.Second, fmt.Sprintf("pod %s's init container running", p.Name), func() (bool, error) {
		p = n.get(ctx, p.Name)
		s := p.Status.InitContainerStatuses
		if len(s) == 1 && s[0].State.Terminated != nil {
			return false, fmt.Errorf("the init container ended before the agent was stopped: %+v", s[0].State.Terminated)
		}
		return len(s) == 1 && s[0].State.Running != nil, nil
	})
	if err := n.sh("stop", "agent"); err != nil {
		n.t.Fatalf("stopping the agent: %v", err)
	}
	stopped := time.Now()
	waitFor(n.t, 60*time.Second, fmt.Sprintf("containerd refusing pod %s's GPU container", p.Name), func() (bool, error) {
		return n.validatorRefusals(ctx, p.Name) > 0, nil
	})
	refusedAt := time.Since(stopped)
	if _, started := find(n.probeLines(p), "start"); started {
		n.t.Errorf("pod %s's GPU container started while the agent was down", p.Name)
	}
	if err := n.sh("start", "agent"); err != nil {
		n.t.Fatalf("starting the agent: %v", err)
	}
	back := time.Now()
	p = n.waitPhase(ctx, p.Name, 3*time.Minute, v1.PodSucceeded, v1.PodFailed)
	lines := n.probeLines(p)
	mem, ok := find(lines, "memory")
	if p.Status.Phase != v1.PodSucceeded || !ok || mem.fields["total_mib"] != "1024" {
		n.t.Fatalf("pod %s after the agent came back: %s, probe printed %v", p.Name, p.Status.Phase, lines)
	}
	n.requireBound(p)
	first, _ := find(lines, "start")
	n.t.Logf("pod %s: its GPU container refused %d time(s) while the agent was down (first %.1fs after the stop), then bound and ran with 1024 MiB %.1fs after the agent's start",
		p.Name, n.validatorRefusals(ctx, p.Name), refusedAt.Seconds(), first.logged.Sub(back).Seconds())
}

// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api"
	allocationv1alpha1 "github.com/tessera-dev/tessera/api/allocation/v1alpha1"
)

// TestSampleWorkload runs what `make run` runs, node list and workload included, and
// checks each kind of pod of the sample landed as its request and profile say, and
// that the two pods that must not schedule are refused with reasons a user can act on.
func TestSampleWorkload(t *testing.T) {
	c := startCluster(t, clusterOptions{workload: true})
	running := c.waitRunning(append(append(append(append(names("llm-infer", 4), names("notebook", 4)...),
		names("train-4gpu", 2)...), names("finetune", 2)...), names("t4-embed", 3)...)...)

	// Binpack stacks the four 16 GiB / 20% inference replicas on one H100.
	assertOneGPU(t, running, names("llm-infer", 4))
	// The embedding services ask for T4s by model and binpack onto one of them.
	assertOneGPU(t, running, names("t4-embed", 3))
	for _, n := range names("t4-embed", 3) {
		if inv := c.inventory(running[n].Spec.NodeName); !strings.Contains(inv.GPUs[0].Model, "T4") {
			t.Errorf("%s asked for a T4 and is on %s (%s)", n, running[n].Spec.NodeName, inv.GPUs[0].Model)
		}
		// 30% of a T4's 15360 MiB.
		if d := assignment(t, running[n]).Containers[0].Devices[0]; d.MemoryMiB != 4608 || d.Cores != 30 {
			t.Errorf("%s asked for 30%% memory and 30%% cores of a T4 and was granted %d MiB, %d%%", n, d.MemoryMiB, d.Cores)
		}
	}
	// Spread gives every notebook a GPU of its own.
	assertDistinctGPUs(t, running, names("notebook", 4))
	// Each four-GPU training pod gets GPUs that are all joined by NVLink.
	for _, n := range names("train-4gpu", 2) {
		c.assertNVLinkLocal(running[n])
	}
	// A whole-GPU pod holds all of its GPU's memory and cores, and shares it with no one.
	shared := gpuHolders(t, running)
	for _, n := range names("finetune", 2) {
		d := assignment(t, running[n]).Containers[0].Devices[0]
		inv := c.inventory(running[n].Spec.NodeName)
		if d.MemoryMiB != inv.GPUs[d.Index].MemoryMiB || d.Cores != 100 {
			t.Errorf("%s: granted %d MiB, %d%% cores on GPU %d; want the whole GPU (%d MiB, 100%%)", n, d.MemoryMiB, d.Cores, d.Index, inv.GPUs[d.Index].MemoryMiB)
		}
		if h := shared[d.UUID]; len(h) != 1 {
			t.Errorf("%s's GPU %s is shared by %v", n, d.UUID, h)
		}
	}

	if msg := c.waitUnschedulable("train-8gpu-nvlink"); !strings.Contains(msg, "NVLink") {
		t.Errorf("train-8gpu-nvlink: the reason does not mention NVLink: %s", msg)
	}
	if msg := c.waitUnschedulable("bad-request"); !strings.Contains(msg, "tessera.dev/gpu-cores") || !strings.Contains(msg, "150") {
		t.Errorf("bad-request: the reason does not name the invalid gpu-cores value: %s", msg)
	}

	table := c.kubectlTessera("allocation")
	t.Logf("kubectl tessera allocation:\n%s", table)
	for _, want := range []string{"NODE h100-0", "NODE t4-1", "llm-infer-0 (16384 MiB, 20%)", "Pending GPU pods (2)", "bad-request", "train-8gpu-nvlink"} {
		if !strings.Contains(table, want) {
			t.Errorf("the allocation table does not show %q", want)
		}
	}
	c.checkAllocationJSON(running, "bad-request", "train-8gpu-nvlink")
	c.checkNoOvercommit()
}

// checkAllocationJSON reads `kubectl tessera allocation -n default -o json` and checks
// that it holds exactly what the pods' assignments say: each running pod's grants on
// the GPUs its assignment names, and the pending pods (by name, as the view sorts them).
func (c *cluster) checkAllocationJSON(running map[string]*v1.Pod, pending ...string) {
	c.t.Helper()
	out := c.kubectlTessera("allocation", "-n", "default", "-o", "json")
	var list allocationv1alpha1.AllocationList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		c.t.Fatalf("kubectl tessera allocation -o json: %v\n%s", err, out)
	}
	if list.APIVersion != "allocation.tessera.dev/v1alpha1" || list.Kind != "AllocationList" || list.Namespace != "default" {
		c.t.Errorf("kubectl tessera allocation -o json: %+v", list.TypeMeta)
	}
	got := map[string][]string{} // pod -> node/UUID of each grant
	for _, n := range list.Items {
		for _, g := range n.GPUs {
			for _, gr := range g.Grants {
				got[gr.Pod] = append(got[gr.Pod], n.Name+"/"+g.UUID)
			}
		}
	}
	for name, p := range running {
		var want []string
		for _, u := range uuids(c.t, p) {
			want = append(want, p.Spec.NodeName+"/"+u)
		}
		slices.Sort(want)
		slices.Sort(got[name])
		if !slices.Equal(got[name], want) {
			c.t.Errorf("-o json: %s holds %v, its assignment says %v", name, got[name], want)
		}
	}
	var pendingGot []string
	for _, p := range list.PendingPods {
		pendingGot = append(pendingGot, p.Name)
	}
	if strings.Join(pendingGot, " ") != strings.Join(pending, " ") {
		c.t.Errorf("-o json: pending pods %v, want %v", pendingGot, pending)
	}
}

// TestBinpackAndSpreadSideBySide schedules the same fractional request through both
// profiles of one scheduler: binpack stacks its pods on one GPU, spread gives each pod
// its own GPU, and the two never grant the same capacity twice.
func TestBinpackAndSpreadSideBySide(t *testing.T) {
	c := startCluster(t, clusterOptions{nodes: []node{{"gpu-a", t4Node}, {"gpu-b", t4Node}, {"gpu-c", t4Node}}})
	for _, n := range names("packed", 4) {
		c.create(gpuPod{name: n, scheduler: "tessera-binpack", gpus: 1, memMiB: 2048, cores: 10})
	}
	packed := c.waitRunning(names("packed", 4)...)
	assertOneGPU(t, packed, names("packed", 4))

	for _, n := range names("spread", 4) {
		c.create(gpuPod{name: n, scheduler: "tessera-spread", gpus: 1, memMiB: 2048, cores: 10})
	}
	spread := c.waitRunning(names("spread", 4)...)
	assertDistinctGPUs(t, spread, names("spread", 4))
	if ns := nodesOf(spread); len(ns) < 2 {
		t.Errorf("spread pods all landed on %v; the spread profile must use several nodes", ns)
	}
	packedGPU := uuids(t, packed["packed-0"])[0]
	for n, p := range spread {
		if uuids(t, p)[0] == packedGPU {
			t.Errorf("%s shares the binpacked GPU %s although other GPUs are free", n, packedGPU)
		}
	}
	c.checkNoOvercommit()
}

// TestPodPolicyOverride checks the per-pod GPU policy annotation against each
// profile's own policy on one node: a spread-profile pod that asks for binpack joins a
// used GPU, a binpack-profile pod that asks for spread takes an unused one.
func TestPodPolicyOverride(t *testing.T) {
	c := startCluster(t, clusterOptions{nodes: []node{{"gpu-a", t4Node}}})
	frac := gpuPod{gpus: 1, memMiB: 2048, cores: 10}
	c.create(with(frac, "spread-0", "tessera-spread", nil))
	c.waitRunning("spread-0")
	c.create(with(frac, "spread-1", "tessera-spread", nil))
	used := c.waitRunning("spread-0", "spread-1")
	assertDistinctGPUs(t, used, []string{"spread-0", "spread-1"})
	inUse := map[string]bool{uuids(t, used["spread-0"])[0]: true, uuids(t, used["spread-1"])[0]: true}

	c.create(with(frac, "spread-asks-binpack", "tessera-spread", map[string]string{api.AnnotationDevicePolicy: "Binpack"}))
	if g := uuids(t, c.waitRunning("spread-asks-binpack")["spread-asks-binpack"])[0]; !inUse[g] {
		t.Errorf("spread-asks-binpack took the unused GPU %s; binpack must join a used one %v", g, inUse)
	}
	c.create(with(frac, "binpack-asks-spread", "tessera-binpack", map[string]string{api.AnnotationDevicePolicy: "Spread"}))
	if g := uuids(t, c.waitRunning("binpack-asks-spread")["binpack-asks-spread"])[0]; inUse[g] {
		t.Errorf("binpack-asks-spread joined the used GPU %s; spread must take an unused one", g)
	}
	c.checkNoOvercommit()
}

func with(p gpuPod, name, scheduler string, ann map[string]string) gpuPod {
	p.name, p.scheduler, p.ann = name, scheduler, ann
	return p
}

// TestMultiGPUNVLinkLocal places multi-GPU pods that require NVLink on an 8-GPU node
// with two NVLink islands of four: a pod asking for five such GPUs is refused, and pods
// of 2, 4 and 2 GPUs each get GPUs of one island.
func TestMultiGPUNVLinkLocal(t *testing.T) {
	c := startCluster(t, clusterOptions{nodes: []node{{"gpu-a", h100Node}}})
	nvlink := map[string]string{api.AnnotationTopology: string(api.TopologyNVLinkRequired)}
	c.create(gpuPod{name: "five", gpus: 5, memMiB: 1024, ann: nvlink})
	if msg := c.waitUnschedulable("five"); !strings.Contains(msg, "NVLink") {
		t.Errorf("five: the reason does not mention NVLink: %s", msg)
	}
	c.create(gpuPod{name: "two-a", gpus: 2, cores: 100, ann: nvlink})
	c.create(gpuPod{name: "four", gpus: 4, cores: 100, ann: nvlink})
	c.create(gpuPod{name: "two-b", gpus: 2, cores: 100, ann: nvlink})
	running := c.waitRunning("two-a", "four", "two-b")
	for _, p := range running {
		c.assertNVLinkLocal(p)
	}
	held := gpuHolders(t, running)
	if len(held) != 8 {
		t.Errorf("the three pods hold %d distinct GPUs, want all 8: %v", len(held), held)
	}
	c.checkNoOvercommit()
}

// TestPreemption fills a node with low-priority whole-GPU pods; a high-priority pod
// evicts exactly one of them and takes the GPU it held.
func TestPreemption(t *testing.T) {
	c := startCluster(t, clusterOptions{nodes: []node{{"gpu-a", t4Node}}})
	for name, value := range map[string]int32{"low": 100, "high": 1000} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := c.client.SchedulingV1().PriorityClasses().Create(c.ctx, pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names("low", 4) {
		c.create(gpuPod{name: n, gpus: 1, cores: 100, priority: "low"})
	}
	low := c.waitRunning(names("low", 4)...)
	gpuOf := map[string]string{}
	for n, p := range low {
		gpuOf[n] = uuids(t, p)[0]
	}

	c.create(gpuPod{name: "urgent", gpus: 1, cores: 100, priority: "high"})
	urgent := c.waitRunning("urgent")["urgent"]
	pods, err := c.client.CoreV1().Pods("default").List(c.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, "low-") && p.DeletionTimestamp == nil {
			left = append(left, p.Name)
		}
	}
	if len(left) != 3 {
		t.Fatalf("after preemption %d low-priority pods are left (%v), want 3", len(left), left)
	}
	victim := ""
	for n := range gpuOf {
		if !contains(left, n) {
			victim = n
		}
	}
	if got := uuids(t, urgent)[0]; got != gpuOf[victim] {
		t.Errorf("urgent got GPU %s; the evicted %s held %s", got, victim, gpuOf[victim])
	}
	c.checkNoOvercommit()
}

// TestRestartsLoseNothing fills every GPU, restarts the scheduler and every node
// agent, and checks that nothing moved, the agents republished the same GPUs, and the
// restarted scheduler, rebuilt from the assignment annotations alone, grants nothing
// twice.
func TestRestartsLoseNothing(t *testing.T) {
	nodes := []node{{"gpu-a", t4Node}, {"gpu-b", t4Node}}
	c := startCluster(t, clusterOptions{nodes: nodes})
	// Two halves of every T4: 2 nodes x 4 GPUs x 2 pods.
	half := t4MiB / 2
	for _, n := range names("half", 16) {
		c.create(gpuPod{name: n, gpus: 1, memMiB: half, cores: 50})
	}
	before := c.waitRunning(names("half", 16)...)
	invBefore := map[string][]string{}
	for _, n := range nodes {
		invBefore[n.name] = gpuUUIDs(c.inventory(n.name))
	}

	c.stopComponent("scheduler")
	for _, n := range nodes {
		c.stopComponent("agent-" + n.name)
	}
	for _, n := range nodes {
		c.startComponent("agent-" + n.name)
	}
	c.startComponent("scheduler")

	c.create(gpuPod{name: "one-more", gpus: 1, memMiB: half, cores: 50})
	msg := c.waitUnschedulable("one-more")
	t.Logf("one-more refused: %s", msg)
	for n, p := range before {
		if got := c.pod(n); got.Spec.NodeName != p.Spec.NodeName || got.Annotations[api.AnnotationAssignment] != p.Annotations[api.AnnotationAssignment] {
			t.Errorf("%s moved: was %s %s, now %s %s", n, p.Spec.NodeName, p.Annotations[api.AnnotationAssignment],
				got.Spec.NodeName, got.Annotations[api.AnnotationAssignment])
		}
	}
	for _, n := range nodes {
		if got := gpuUUIDs(c.inventory(n.name)); strings.Join(got, ",") != strings.Join(invBefore[n.name], ",") {
			t.Errorf("node %s: the restarted agent published GPUs %v, before %v", n.name, got, invBefore[n.name])
		}
	}

	// The restarted scheduler still places pods: freeing one half makes room.
	c.deletePod("half-0")
	again := c.waitRunning("one-more")["one-more"]
	if uuids(t, again)[0] != uuids(t, before["half-0"])[0] {
		t.Errorf("one-more went to GPU %s; the only free half is on %s", uuids(t, again)[0], uuids(t, before["half-0"])[0])
	}
	c.checkNoOvercommit()
}

// TestStaleInventoryStopsGPUPods stops one node's agent: once its inventory is older
// than the scheduler's limit the node takes no new GPU pods, and the refusal says why;
// when the agent comes back the waiting pod lands there.
func TestStaleInventoryStopsGPUPods(t *testing.T) {
	const staleness = 8 * time.Second
	c := startCluster(t, clusterOptions{nodes: []node{{"gpu-a", t4Node}, {"gpu-b", t4Node}},
		staleness: staleness.String(), heartbeat: "1s"})
	c.stopComponent("agent-gpu-a")
	c.waitFor("gpu-a's inventory to go stale", func() (bool, string) {
		age := c.inventory("gpu-a").Age(time.Now())
		// A second of margin: the inventory's time has one-second resolution.
		return age > staleness+time.Second, fmt.Sprintf("inventory %s old", age.Round(time.Second))
	})
	for _, n := range names("whole", 4) {
		c.create(gpuPod{name: n, gpus: 1, cores: 100})
	}
	for n, p := range c.waitRunning(names("whole", 4)...) {
		if p.Spec.NodeName != "gpu-b" {
			t.Errorf("%s was placed on %s, whose inventory is stale", n, p.Spec.NodeName)
		}
	}
	c.create(gpuPod{name: "waiting", gpus: 1, cores: 100})
	if msg := c.waitUnschedulable("waiting"); !strings.Contains(msg, "stale") {
		t.Errorf("waiting: the reason does not say the inventory is stale: %s", msg)
	}

	c.startComponent("agent-gpu-a")
	if p := c.waitRunning("waiting")["waiting"]; p.Spec.NodeName != "gpu-a" {
		t.Errorf("waiting landed on %s, want gpu-a once its agent is back", p.Spec.NodeName)
	}
	c.checkNoOvercommit()
}

// TestDeletingPodsFreesCapacity fills a node, queues two more pods, and deletes two of
// the running ones: the queued pods are placed on exactly the freed GPUs.
func TestDeletingPodsFreesCapacity(t *testing.T) {
	c := startCluster(t, clusterOptions{nodes: []node{{"gpu-a", t4Node}}})
	for _, n := range names("first", 4) {
		c.create(gpuPod{name: n, gpus: 1, cores: 100})
	}
	first := c.waitRunning(names("first", 4)...)
	for _, n := range names("queued", 2) {
		c.create(gpuPod{name: n, gpus: 1, cores: 100})
		c.waitUnschedulable(n)
	}
	freed := map[string]bool{}
	for _, n := range []string{"first-1", "first-3"} {
		freed[uuids(t, first[n])[0]] = true
		c.deletePod(n)
	}
	for n, p := range c.waitRunning(names("queued", 2)...) {
		if g := uuids(t, p)[0]; !freed[g] {
			t.Errorf("%s got GPU %s, which was not freed", n, g)
		}
	}
	c.checkNoOvercommit()
}

// --- assertions -----------------------------------------------------------------------

func assertOneGPU(t *testing.T, pods map[string]*v1.Pod, which []string) {
	t.Helper()
	seen := map[string][]string{}
	for _, n := range which {
		for _, u := range uuids(t, pods[n]) {
			seen[pods[n].Spec.NodeName+"/"+u] = append(seen[pods[n].Spec.NodeName+"/"+u], n)
		}
	}
	if len(seen) != 1 {
		t.Errorf("binpacked pods %v are spread over %d GPUs: %v", which, len(seen), seen)
	}
}

func assertDistinctGPUs(t *testing.T, pods map[string]*v1.Pod, which []string) {
	t.Helper()
	seen := map[string]string{}
	for _, n := range which {
		for _, u := range uuids(t, pods[n]) {
			if other, dup := seen[u]; dup {
				t.Errorf("%s and %s share GPU %s although free GPUs remain", other, n, u)
			}
			seen[u] = n
		}
	}
}

// assertNVLinkLocal checks that every pair of the pod's GPUs is joined by NVLink, as
// the node's published inventory says.
func (c *cluster) assertNVLinkLocal(p *v1.Pod) {
	c.t.Helper()
	inv := c.inventory(p.Spec.NodeName)
	for _, ca := range assignment(c.t, p).Containers {
		for i, a := range ca.Devices {
			for _, b := range ca.Devices[i+1:] {
				if !nvlinked(inv, a.Index, b.Index) {
					c.t.Errorf("%s: GPUs %d and %d of %s are not joined by NVLink", p.Name, a.Index, b.Index, p.Spec.NodeName)
				}
			}
		}
	}
}

func nvlinked(inv *api.NodeInventory, a, b int) bool {
	for _, g := range inv.GPUs {
		if g.Index != a {
			continue
		}
		for _, l := range g.Links {
			if l.Peer == b {
				return l.NVLinks > 0
			}
		}
	}
	return false
}

// gpuHolders maps each granted GPU to the pods holding it.
func gpuHolders(t *testing.T, pods map[string]*v1.Pod) map[string][]string {
	out := map[string][]string{}
	for n, p := range pods {
		for _, u := range uuids(t, p) {
			out[u] = append(out[u], n)
		}
	}
	return out
}

func gpuUUIDs(inv *api.NodeInventory) []string {
	out := make([]string, len(inv.GPUs))
	for i, g := range inv.GPUs {
		out[i] = g.UUID
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// TestInterruptStopsEverything runs hack/local-up.sh in the foreground, as make run
// does, and sends the interrupt a terminal's Ctrl-C sends to its whole process group:
// the script stops every process it started and exits.
func TestInterruptStopsEverything(t *testing.T) {
	c, args := newCluster(t, clusterOptions{nodes: []node{{"gpu-a", t4Node}}})
	cmd := exec.Command(filepath.Join(c.root, "hack", "local-up.sh"), append(args, "--no-workload")...)
	cmd.Env = c.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	up := false
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "Press Ctrl-C") {
			up = true
			break
		}
	}
	if !up {
		_ = cmd.Wait()
		t.Fatalf("hack/local-up.sh ended before the cluster was up:\n%s", out.String())
	}
	pids := c.pids()
	for _, want := range []string{"etcd", "kube-apiserver", "scheduler", "kwok", "agent-gpu-a"} {
		if pids[want] == 0 || !alive(pids[want]) {
			t.Fatalf("%s is not running before the interrupt (pids %v)", want, pids)
		}
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stdout)
	out.Write(rest)
	if err := cmd.Wait(); err != nil {
		t.Errorf("hack/local-up.sh exited with %v after the interrupt", err)
	}
	t.Logf("hack/local-up.sh:\n%s", out.String())
	c.checkStopped(pids)
}

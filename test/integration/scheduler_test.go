// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"math/rand"

	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"context"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare"
	"github.com/tessera-dev/tessera/plugins/noderesourcesfit"
	"github.com/tessera-dev/tessera/test/fixtures"
)

const (
	binpack = "tessera-binpack"
	spread  = "tessera-spread"
)

// TestSampleConfigsLoad loads every sample in config/scheduler through kube-scheduler's
// real option handling and Setup, and checks that each profile runs the plugin and
// TesseraNodeResourcesFit (not NodeResourcesFit), which ignores the plugin's resource
// group.
func TestSampleConfigsLoad(t *testing.T) {
	c := startCluster(t)
	samples, err := filepath.Glob(filepath.Join(repoRoot(t), "config", "scheduler", "*.yaml"))
	if err != nil || len(samples) == 0 {
		t.Fatalf("no samples: %v", err)
	}
	for _, path := range samples {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			cc, sched := setupScheduler(t, klog.NewContext(c.ctx, klog.Background()), sampleConfig(t, name, c.kubeconfig))
			// The scheduler is built but never run: stop its event broadcaster, or its
			// goroutines outlive the test.
			t.Cleanup(cc.EventBroadcaster.Shutdown)
			if len(sched.Profiles) == 0 {
				t.Fatal("no profiles")
			}
			for _, p := range cc.ComponentConfig.Profiles {
				if _, ok := sched.Profiles[p.SchedulerName]; !ok {
					t.Errorf("profile %s not built", p.SchedulerName)
				}
				found := false
				for _, pl := range p.Plugins.MultiPoint.Enabled {
					found = found || pl.Name == gpushare.Name
				}
				if !found {
					t.Errorf("profile %s does not enable %s", p.SchedulerName, gpushare.Name)
				}
				// The plugin binds GPU pods with their assignment: it must bind first.
				if b := sched.Profiles[p.SchedulerName].ListPlugins().Bind.Enabled; len(b) != 2 || b[0].Name != gpushare.Name || b[1].Name != "DefaultBinder" {
					t.Errorf("profile %s binds with %v, want %s then DefaultBinder", p.SchedulerName, b, gpushare.Name)
				}
				// TesseraNodeResourcesFit filters in place of NodeResourcesFit.
				plugins := sched.Profiles[p.SchedulerName].ListPlugins()
				for ep, set := range map[string][]config.Plugin{"PreFilter": plugins.PreFilter.Enabled, "Filter": plugins.Filter.Enabled} {
					var names []string
					for _, pl := range set {
						names = append(names, pl.Name)
					}
					if contains(names, "NodeResourcesFit") || !contains(names, noderesourcesfit.Name) {
						t.Errorf("profile %s: %s runs %v, want %s and not NodeResourcesFit", p.SchedulerName, ep, names, noderesourcesfit.Name)
					}
				}
				var gpuArgs *gpushare.TesseraGPUShareArgs
				var fit *config.NodeResourcesFitArgs
				for _, pc := range p.PluginConfig {
					switch pc.Name {
					case noderesourcesfit.Name:
						if fit, err = noderesourcesfit.DecodeArgs(pc.Args); err != nil {
							t.Errorf("profile %s: %v", p.SchedulerName, err)
						}
					case gpushare.Name:
						if gpuArgs, err = gpushare.DecodeArgs(pc.Args, gpushare.Defaults{}); err != nil {
							t.Errorf("profile %s: %v", p.SchedulerName, err)
						}
					}
				}
				if fit == nil || gpuArgs == nil {
					t.Errorf("profile %s: no args for %s or %s", p.SchedulerName, noderesourcesfit.Name, gpushare.Name)
					continue
				}
				if !contains(fit.IgnoredResourceGroups, gpuArgs.ResourceNames.Group()) {
					t.Errorf("profile %s: %s ignores %v, not the plugin's group %q", p.SchedulerName, noderesourcesfit.Name, fit.IgnoredResourceGroups, gpuArgs.ResourceNames.Group())
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestPlacementFollowsPolicy checks where pods land under each profile and what the
// assignment annotation says.
func TestPlacementFollowsPolicy(t *testing.T) {
	c := startCluster(t)
	c.createNode("h100-a", fixtures.NVLinkNode("h100-a", 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB))
	c.createNode("h100-b", fixtures.NVLinkNode("h100-b", 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB))
	c.createNode("t4", fixtures.PCIeNode("t4", 4, "Tesla T4", fixtures.T4MiB))
	c.startScheduler("tessera-scheduler.yaml")

	// Binpack: three fractions share one GPU.
	var gpus []string
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("bin-%d", i)
		c.createPod(newPod(c.ns, name, binpack, nil, gpuLimits{name: "c", gpu: "1", mem: "4000", cores: "20"}))
		a := assignment(t, c.waitBound(name, 30*time.Second))
		d := a.Containers[0].Devices[0]
		if d.MemoryMiB != 4000 || d.Cores != 20 {
			t.Errorf("%s granted %+v", name, d)
		}
		gpus = append(gpus, d.UUID)
	}
	if gpus[0] != gpus[1] || gpus[1] != gpus[2] {
		t.Errorf("binpack spread fractions over %v", gpus)
	}

	// Spread: fractions go to the two empty H100 nodes, one each (the T4 node already
	// holds the binpacked pods, so it is the most used).
	used := map[string]bool{}
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("spread-%d", i)
		c.createPod(newPod(c.ns, name, spread, nil, gpuLimits{name: "c", gpu: "1", mem: "2000"}))
		p := c.waitBound(name, 30*time.Second)
		a := assignment(t, p)
		key := p.Spec.NodeName
		if used[key] || !strings.HasPrefix(key, "h100") {
			t.Errorf("spread put %s on %s (already used: %v)", name, key, used)
		}
		used[key] = true
		if a.Containers[0].Devices[0].UUID == gpus[0] {
			t.Errorf("spread joined the binpacked GPU")
		}
	}

	// A 4-GPU NVLink-required pod gets one whole island of an H100 node.
	c.createPod(newPod(c.ns, "island", binpack, map[string]string{api.AnnotationTopology: "nvlink-required"}, gpuLimits{name: "train", gpu: "4"}))
	p := c.waitBound("island", 30*time.Second)
	a := assignment(t, p)
	var idx []int
	for _, d := range a.Containers[0].Devices {
		idx = append(idx, d.Index)
	}
	if !strings.HasPrefix(p.Spec.NodeName, "h100") || len(idx) != 4 || (idx[0] < 4) != (idx[3] < 4) {
		t.Errorf("NVLink pod on %s GPUs %v, want one island of an H100 node", p.Spec.NodeName, idx)
	}

	// Model selection: a pod for T4 lands on the T4 node.
	c.createPod(newPod(c.ns, "want-t4", spread, map[string]string{api.AnnotationModelInclude: "T4"}, gpuLimits{name: "c", gpu: "1", pct: "50"}))
	if p := c.waitBound("want-t4", 30*time.Second); p.Spec.NodeName != "t4" {
		t.Errorf("T4 pod on %s", p.Spec.NodeName)
	} else if d := assignment(t, p).Containers[0].Devices[0]; d.MemoryMiB != fixtures.T4MiB/2 {
		t.Errorf("50%% of a T4 granted as %d MiB", d.MemoryMiB)
	}

	// A pod that fits nowhere says why, per node.
	c.createPod(newPod(c.ns, "too-big", binpack, nil, gpuLimits{name: "huge", gpu: "1", mem: "100000"}))
	msg := c.waitUnschedulable("too-big", 30*time.Second)
	if !strings.Contains(msg, `container "huge" asks 100000 MiB per GPU; the largest GPU on the node has`) {
		t.Errorf("unschedulable message: %s", msg)
	}
	c.checkGrants(10)
}

// TestBadRequestGetsEvent: invalid requests are rejected with an event naming the
// container and the field.
func TestBadRequestGetsEvent(t *testing.T) {
	c := startCluster(t)
	c.createNode("t4", fixtures.PCIeNode("t4", 4, "Tesla T4", fixtures.T4MiB))
	c.startScheduler("tessera-scheduler.yaml")
	c.createPod(newPod(c.ns, "zero", binpack, nil, gpuLimits{name: "main", gpu: "0"}))
	c.createPod(newPod(c.ns, "orphan-cores", binpack, nil, gpuLimits{name: "side", cores: "50"}))
	want := map[string]string{
		"zero":         `container "main": tessera.dev/gpu: must be a whole number of GPUs >= 1, got 0`,
		"orphan-cores": `container "side": tessera.dev/gpu-cores: is set without tessera.dev/gpu`,
	}
	for pod, text := range want {
		var got string
		err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			evs, err := c.client.EventsV1().Events(c.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			for _, e := range evs.Items {
				if e.Regarding.Name == pod && e.Reason == "FailedScheduling" {
					got = e.Note
					return strings.Contains(e.Note, text), nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Errorf("pod %s: no FailedScheduling event containing %q (last: %q)", pod, text, got)
		}
	}
}

// mixedPod draws a pod from a mix of fractions, whole GPUs and multi-GPU pods.
func mixedPod(rng *rand.Rand, ns, name string) *v1.Pod {
	sched := binpack
	if rng.Intn(2) == 0 {
		sched = spread
	}
	switch r := rng.Intn(10); {
	case r < 6:
		return newPod(ns, name, sched, nil, gpuLimits{name: "c", gpu: "1", mem: fmt.Sprint(1024 * (1 + rng.Intn(12))), cores: fmt.Sprint(5 * (1 + rng.Intn(6)))})
	case r < 7:
		return newPod(ns, name, sched, nil, gpuLimits{name: "a", gpu: "1", pct: "25"}, gpuLimits{name: "b", gpu: "1", pct: "25", cores: "10"})
	case r < 9:
		return newPod(ns, name, sched, nil, gpuLimits{name: "c", gpu: "1"})
	default:
		return newPod(ns, name, sched, map[string]string{api.AnnotationTopology: "preferred"}, gpuLimits{name: "c", gpu: fmt.Sprint(2 + 2*rng.Intn(2))})
	}
}

// burst creates n mixed pods from several goroutines at once.
func (c *cluster) burst(prefix string, n int, seed int64) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(w)))
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				p := mixedPod(rng, c.ns, fmt.Sprintf("%s-%04d", prefix, i))
				if _, err := c.client.CoreV1().Pods(c.ns).Create(c.ctx, p, metav1.CreateOptions{}); err != nil {
					c.t.Errorf("creating %s: %v", p.Name, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
}

// settle waits until every pod is bound or marked unschedulable and the count of
// bound pods has stopped changing.
func (c *cluster) settle(timeout time.Duration) (bound, pending int) {
	c.t.Helper()
	last, stableSince := -1, time.Now()
	err := wait.PollUntilContextTimeout(c.ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := c.client.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		bound, pending = 0, 0
		undecided := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				bound++
				continue
			}
			pending++
			decided := false
			for _, cond := range p.Status.Conditions {
				decided = decided || (cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse)
			}
			if !decided {
				undecided++
			}
		}
		if bound != last {
			last, stableSince = bound, time.Now()
		}
		return undecided == 0 && time.Since(stableSince) > 2*time.Second, nil
	})
	if err != nil {
		c.t.Fatalf("pods did not settle within %s: %d bound, %d pending", timeout, bound, pending)
	}
	return bound, pending
}

func (c *cluster) createMixedNodes(n int) (gpus int) {
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("node-%02d", i)
		if i%4 == 3 {
			c.createNode(name, fixtures.PCIeNode(name, 4, "Tesla T4", fixtures.T4MiB))
			gpus += 4
		} else {
			c.createNode(name, fixtures.NVLinkNode(name, 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB))
			gpus += 8
		}
	}
	return gpus
}

// TestBurstNeverOverGrants schedules 500 mixed pods on 20 nodes through both profiles
// at once and checks that no GPU is ever granted more than it has.
func TestBurstNeverOverGrants(t *testing.T) {
	c := startCluster(t)
	c.createMixedNodes(20)
	c.startScheduler("tessera-scheduler.yaml")
	start := time.Now()
	c.burst("burst", 500, 1)
	bound, pending := c.settle(3 * time.Minute)
	t.Logf("500 pods: %d bound, %d unschedulable, settled in %s", bound, pending, time.Since(start).Round(time.Millisecond))
	if bound < 200 {
		t.Errorf("only %d pods bound; the cluster has room for far more", bound)
	}
	if got := c.checkGrants(10); got != bound {
		t.Errorf("checked %d GPU pods, %d bound", got, bound)
	}
}

// TestSchedulerRestartMidBurst stops the scheduler while a burst is being scheduled
// and starts a new one: the new scheduler rebuilds its cache from the assignment
// annotations and never grants the same capacity twice.
func TestSchedulerRestartMidBurst(t *testing.T) {
	c := startCluster(t)
	c.createMixedNodes(10)
	stop := c.startScheduler("tessera-scheduler.yaml")
	c.burst("before", 300, 7)
	// Stop once some but not all pods are bound.
	_ = wait.PollUntilContextTimeout(c.ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := c.client.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		n := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				n++
			}
		}
		return n >= 60, nil
	})
	stop()
	boundAtStop := c.checkGrants(10)
	t.Logf("scheduler stopped with %d pods bound", boundAtStop)
	c.startScheduler("tessera-scheduler.yaml")
	c.burst("after", 100, 11)
	bound, pending := c.settle(3 * time.Minute)
	t.Logf("after restart: %d bound, %d unschedulable", bound, pending)
	if bound <= boundAtStop {
		t.Errorf("the restarted scheduler bound nothing (%d before, %d after)", boundAtStop, bound)
	}
	c.checkGrants(10)
}

// TestPreemptionFreesTheRightGPU: a high-priority whole-GPU pod evicts only pods on
// the GPU it gets, and kube-scheduler's reprieve keeps the more important ones.
func TestPreemptionFreesTheRightGPU(t *testing.T) {
	c := startCluster(t)
	c.createNode("t4", fixtures.PCIeNode("t4", 2, "Tesla T4", fixtures.T4MiB))
	c.createNode("busy", fixtures.PCIeNode("busy", 1, "Tesla T4", fixtures.T4MiB))
	c.startScheduler("tessera-scheduler.yaml")
	// GPU 0 of t4: one pod of priority 1; GPU 1: two pods of priority 5; the single
	// GPU of "busy": a pod of priority 2000 that may not be preempted. UUID selection
	// pins each pod to its GPU.
	place := []struct {
		name     string
		uuid     string
		priority int32
	}{{"low-a", fixtures.UUID("t4", 0), 1}, {"mid-b", fixtures.UUID("t4", 1), 5}, {"mid-c", fixtures.UUID("t4", 1), 5}, {"top", fixtures.UUID("busy", 0), 2000}}
	for _, pl := range place {
		p := newPod(c.ns, pl.name, binpack, map[string]string{api.AnnotationUUIDInclude: pl.uuid}, gpuLimits{name: "c", gpu: "1", mem: "6000"})
		prio := pl.priority
		p.Spec.Priority = &prio
		c.createPod(p)
		c.waitBound(pl.name, 30*time.Second)
	}
	vip := newPod(c.ns, "vip", binpack, nil, gpuLimits{name: "c", gpu: "1"})
	high := int32(1000)
	vip.Spec.Priority = &high
	c.createPod(vip)
	p := c.waitBound("vip", time.Minute)
	if d := assignment(t, p).Containers[0].Devices[0]; d.UUID != fixtures.UUID("t4", 0) {
		t.Errorf("vip got %s, want GPU 0 of t4, freed by evicting the least important pod", d.UUID)
	}
	for name, wantGone := range map[string]bool{"low-a": true, "mid-b": false, "mid-c": false, "top": false} {
		_, err := c.client.CoreV1().Pods(c.ns).Get(c.ctx, name, metav1.GetOptions{})
		if gone := isNotFound(err); gone != wantGone {
			t.Errorf("%s deleted=%v, want %v", name, gone, wantGone)
		}
	}
	c.checkGrants(10)
}

// TestStaleInventory: a node whose agent stopped heartbeating takes no new GPU pods.
func TestStaleInventory(t *testing.T) {
	c := startCluster(t)
	old := fixtures.PCIeNode("old", 4, "Tesla T4", fixtures.T4MiB)
	old.UpdatedAt = time.Now().Add(-time.Hour)
	c.createNode("old", old)
	c.startScheduler("tessera-scheduler.yaml")
	c.createPod(newPod(c.ns, "p", binpack, nil, gpuLimits{name: "c", gpu: "1", mem: "1000"}))
	msg := c.waitUnschedulable("p", 30*time.Second)
	if !strings.Contains(msg, "GPU inventory is stale") {
		t.Errorf("message %q", msg)
	}
	// The agent comes back: the inventory update requeues the pod and it binds.
	fresh := fixtures.PCIeNode("old", 4, "Tesla T4", fixtures.T4MiB)
	s, _ := api.EncodeInventory(fresh)
	n, err := c.client.CoreV1().Nodes().Get(c.ctx, "old", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Annotations[api.AnnotationInventory] = s
	if _, err := c.client.CoreV1().Nodes().Update(c.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitBound("p", 30*time.Second)
}

// TestDeletionFreesCapacity: deleting a GPU pod lets a pending one in.
func TestDeletionFreesCapacity(t *testing.T) {
	c := startCluster(t)
	c.createNode("t4", fixtures.PCIeNode("t4", 1, "Tesla T4", fixtures.T4MiB))
	c.startScheduler("tessera-scheduler.yaml")
	c.createPod(newPod(c.ns, "first", binpack, nil, gpuLimits{name: "c", gpu: "1"}))
	c.waitBound("first", 30*time.Second)
	c.createPod(newPod(c.ns, "second", binpack, nil, gpuLimits{name: "c", gpu: "1", mem: "1024"}))
	msg := c.waitUnschedulable("second", 30*time.Second)
	if !strings.Contains(msg, `1 node(s) had no GPU with 1024 MiB free for container "c"`) {
		t.Errorf("message %q", msg)
	}
	zero := int64(0)
	if err := c.client.CoreV1().Pods(c.ns).Delete(c.ctx, "first", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	c.waitBound("second", 30*time.Second)
}

// TestMissReasonGroupsNodes: nodes that each have a different amount free, all too
// little, are counted under one reason in the pod's FailedScheduling summary (the
// scheduler counts nodes per distinct reason; a per-node figure gave a line per node).
func TestMissReasonGroupsNodes(t *testing.T) {
	c := startCluster(t)
	const nodes = 6
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("t4-%d", i)
		c.createNode(name, fixtures.PCIeNode(name, 1, "Tesla T4", fixtures.T4MiB))
	}
	c.startScheduler("tessera-scheduler.yaml")
	// No two of these fit one T4 (15360 MiB), so each takes a node of its own and
	// leaves it 360 to 5360 MiB free.
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("big-%d", i)
		c.createPod(newPod(c.ns, name, binpack, nil, gpuLimits{name: "c", gpu: "1", mem: fmt.Sprint(10000 + 1000*i)}))
		c.waitBound(name, 30*time.Second)
	}
	c.createPod(newPod(c.ns, "late", binpack, nil, gpuLimits{name: "main", gpu: "1", mem: "6000"}))
	msg := c.waitUnschedulable("late", 30*time.Second)
	want := fmt.Sprintf(`0/%d nodes are available: %d node(s) had no GPU with 6000 MiB free for container "main".`, nodes, nodes)
	if !strings.HasPrefix(msg, want) {
		t.Errorf("message %q, want it to start %q", msg, want)
	}
	// TesseraGPUShare's PostFilter adds how close the cluster is: big-0's node (any of
	// the six: they tie for it) has the most left.
	big0, err := c.client.CoreV1().Pods(c.ns).Get(c.ctx, "big-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if closest := fmt.Sprintf(`closest for container "main": 5360 MiB free on one GPU (node %s)`, big0.Spec.NodeName); !strings.Contains(msg, closest) {
		t.Errorf("message %q, want it to contain %q", msg, closest)
	}
	t.Logf("FailedScheduling message: %s", msg)
}

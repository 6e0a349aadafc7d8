// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placementtest"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// TestConcurrentAssumeNeverOverGrants races many Assume, Forget and informer updates
// on one node and checks the invariant that matters: grants on a GPU never exceed it.
func TestConcurrentAssumeNeverOverGrants(t *testing.T) {
	c := NewCache()
	inv := fixtures.PCIeNode("n", 4, "Tesla T4", fixtures.T4MiB)
	c.SetInventory("n", placementtest.MustEncode(t, inv))
	const workers, perWorker = 8, 200
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < perWorker; i++ {
				pod := placementtest.Pod(fmt.Sprintf("w%d-%d", w, i), nil, placementtest.Ctr{Name: "c", GPU: "1"})
				g := []Grant{{UUID: fmt.Sprintf("GPU-n-%d", rng.Intn(4)), MemMiB: int64(1000 + rng.Intn(6000)), Cores: rng.Intn(40)}}
				if err := c.Assume(pod, "n", g, 10); err != nil {
					continue
				}
				switch rng.Intn(3) {
				case 0:
					c.Forget(pod.UID)
				case 1:
					c.OnPodDelete(pod.UID)
				}
			}
		}(w)
	}
	wg.Wait()
	u, err := c.NodeUsage("n")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range u {
		if d.UsedMiB > d.MemoryMiB || d.Cores > 100 || d.Tenants > 10 || d.UsedMiB < 0 {
			t.Errorf("GPU %s over-granted: %+v", d.UUID, d)
		}
	}
	// Recomputing from the records gives the same figures: the incremental
	// accounting never drifted.
	e := c.existing("n")
	before := append([]Usage(nil), e.used...)
	e.mu.Lock()
	e.recomputeLocked()
	e.mu.Unlock()
	for i := range before {
		if before[i] != e.used[i] {
			t.Errorf("device %d: incremental %+v, recomputed %+v", i, before[i], e.used[i])
		}
	}
}

// An inventory's heartbeat is judged from the copy in the cache entry: one without a
// heartbeat is as old as can be, and a limit of 0 turns the check off.
func TestStaleHeartbeat(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		heartbeat time.Time
		limit     time.Duration
		old       bool
	}{
		{now.Add(-time.Minute), 5 * time.Minute, false},
		{now.Add(-6 * time.Minute), 5 * time.Minute, true},
		{time.Time{}, 5 * time.Minute, true},
		{time.Time{}, 0, false},
		{now.Add(time.Minute), 5 * time.Minute, false}, // the agent's clock ahead of ours
	} {
		if _, old := Stale(c.heartbeat, c.limit, now); old != c.old {
			t.Errorf("stale(%v, %v) = %v, want %v", c.heartbeat, c.limit, old, c.old)
		}
	}
}

// The informer confirming an assumed pod replaces its record; a reader of the node's
// usage (Filter, Reserve) must never see the pod's GPU free in between. It did, and a
// pod placed on that GPU then failed Reserve and waited minutes for a retry (B2).
func TestConfirmingAPodNeverShowsItsGPUFree(t *testing.T) {
	c := NewCache()
	c.SetInventory("n", placementtest.MustEncode(t, fixtures.PCIeNode("n", 1, "Tesla T4", fixtures.T4MiB)))
	pod := placementtest.Pod("p", nil, placementtest.Ctr{Name: "c", GPU: "1"})
	g := []Grant{{UUID: "GPU-n-0", MemMiB: fixtures.T4MiB, Cores: 100}}
	bound := placementtest.Bound(t, placementtest.Pod("p", nil, placementtest.Ctr{Name: "c", GPU: "1"}), "n", placementtest.OneGrant("n", fixtures.T4MiB, 100, 0))
	bound.UID = pod.UID
	if err := c.Assume(pod, "n", g, 10); err != nil {
		t.Fatal(err)
	}
	node := placementtest.Node(t, "n", fixtures.PCIeNode("n", 1, "Tesla T4", fixtures.T4MiB))
	stop := make(chan struct{})
	var freeSeen, reads int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, used := c.View(node, nil)
			reads++
			if used[0].MemMiB != fixtures.T4MiB {
				freeSeen++
			}
		}
	}()
	for i := 0; i < 20000; i++ {
		// Assumed again (a retried Reserve replaces its record), then confirmed.
		if err := c.Assume(pod, "n", g, 10); err != nil {
			t.Fatal(err)
		}
		if err := c.OnPod(bound); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if freeSeen > 0 {
		t.Fatalf("the pod's GPU looked free in %d of %d reads while its record was replaced", freeSeen, reads)
	}
}

func TestCacheFromInformerObjects(t *testing.T) {
	c := NewCache()
	c.SetInventory("n", placementtest.MustEncode(t, fixtures.PCIeNode("n", 2, "Tesla T4", fixtures.T4MiB)))
	bound := placementtest.Bound(t, placementtest.Pod("bound", nil, placementtest.Ctr{Name: "c", GPU: "1"}), "n", placementtest.OneGrant("n", 5000, 20, 0))
	unbound := placementtest.Pod("unbound", nil, placementtest.Ctr{Name: "c", GPU: "1"})
	unbound.Annotations = bound.DeepCopy().Annotations // written by PreBind, bind never happened
	wrongNode := placementtest.Bound(t, placementtest.Pod("wrong", nil, placementtest.Ctr{Name: "c", GPU: "1"}), "n", placementtest.OneGrant("other", 5000, 0, 0))
	wrongNode.Spec.NodeName = "n"
	garbage := bound.DeepCopy()
	garbage.UID, garbage.Name = "garbage", "garbage"
	garbage.Annotations[api.AnnotationAssignment] = "{not json"

	for _, p := range []*v1.Pod{bound, unbound} {
		if err := c.OnPod(p); err != nil {
			t.Fatalf("OnPod(%s): %v", p.Name, err)
		}
	}
	if err := c.OnPod(wrongNode); err == nil {
		t.Error("assignment for another node accepted")
	}
	if err := c.OnPod(garbage); err == nil {
		t.Error("malformed assignment accepted")
	}
	u, _ := c.NodeUsage("n")
	if u[0].UsedMiB != 5000 || u[0].Cores != 20 || u[0].Tenants != 1 || u[1].Tenants != 0 {
		t.Fatalf("usage %+v, want only the bound pod on GPU 0", u)
	}
	// The pod completes: its grants are released.
	done := bound.DeepCopy()
	done.Status.Phase = v1.PodSucceeded
	_ = c.OnPod(done)
	if u, _ := c.NodeUsage("n"); u[0].Tenants != 0 {
		t.Fatalf("usage %+v after the pod succeeded", u)
	}
	// Inventory arrives after the pods: usage is rebuilt when it does.
	c2 := NewCache()
	_ = c2.OnPod(bound)
	if _, err := c2.NodeUsage("n"); err == nil {
		t.Fatal("usage without inventory should be an error")
	}
	c2.SetInventory("n", placementtest.MustEncode(t, fixtures.PCIeNode("n", 2, "Tesla T4", fixtures.T4MiB)))
	if u, _ := c2.NodeUsage("n"); u[0].UsedMiB != 5000 {
		t.Fatalf("usage %+v after late inventory", u)
	}
	c2.RemoveNode("n")
	if _, err := c2.NodeUsage("n"); err == nil {
		t.Fatal("usage of a removed node should be an error")
	}
	c2.OnPodDelete(bound.UID)
	c2.OnPodDelete(types.UID("never-seen"))
}

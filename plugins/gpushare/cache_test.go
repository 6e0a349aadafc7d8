package gpushare

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
)

// TestConcurrentAssumeNeverOverGrants races many Assume, Forget and informer updates
// on one node and checks the invariant that matters: grants on a GPU never exceed it.
func TestConcurrentAssumeNeverOverGrants(t *testing.T) {
	c := placement.NewCache()
	inv := pcieInventory("n", 4, "Tesla T4", t4Mem)
	c.SetInventory("n", mustEncode(t, inv))
	const workers, perWorker = 8, 200
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < perWorker; i++ {
				pod := makePod(fmt.Sprintf("w%d-%d", w, i), nil, ctr{Name: "c", GPU: "1"})
				g := []placement.Grant{{UUID: fmt.Sprintf("GPU-n-%d", rng.Intn(4)), MemMiB: int64(1000 + rng.Intn(6000)), Cores: rng.Intn(40)}}
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
	e := c.Existing("n")
	before := append([]placement.Usage(nil), e.Used...)
	e.Mu.Lock()
	e.RecomputeLocked()
	e.Mu.Unlock()
	for i := range before {
		if before[i] != e.Used[i] {
			t.Errorf("device %d: incremental %+v, recomputed %+v", i, before[i], e.Used[i])
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
		if _, old := placement.Stale(c.heartbeat, c.limit, now); old != c.old {
			t.Errorf("stale(%v, %v) = %v, want %v", c.heartbeat, c.limit, old, c.old)
		}
	}
}

// The informer confirming an assumed pod replaces its record; a reader of the node's
// usage (Filter, Reserve) must never see the pod's GPU free in between. It did, and a
// pod placed on that GPU then failed Reserve and waited minutes for a retry (B2).
func TestConfirmingAPodNeverShowsItsGPUFree(t *testing.T) {
	c := placement.NewCache()
	c.SetInventory("n", mustEncode(t, pcieInventory("n", 1, "Tesla T4", t4Mem)))
	pod := makePod("p", nil, ctr{Name: "c", GPU: "1"})
	g := []placement.Grant{{UUID: "GPU-n-0", MemMiB: t4Mem, Cores: 100}}
	bound := bindPod(t, makePod("p", nil, ctr{Name: "c", GPU: "1"}), "n", oneGrant("n", t4Mem, 100, 0))
	bound.UID = pod.UID
	if err := c.Assume(pod, "n", g, 10); err != nil {
		t.Fatal(err)
	}
	node := makeNode(t, "n", pcieInventory("n", 1, "Tesla T4", t4Mem))
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
			if used[0].MemMiB != t4Mem {
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

// factoryHandle is a framework handle that only has an informer factory.
type factoryHandle struct {
	fwk.Handle
	f informers.SharedInformerFactory
}

func (h factoryHandle) SharedInformerFactory() informers.SharedInformerFactory { return h.f }
func (h factoryHandle) ProfileName() string                                    { return "test-profile" }

// Profiles of one scheduler share one cache; when the scheduler stops, the cache is
// forgotten.
func TestSharedCacheLifetime(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	h := factoryHandle{f: informers.NewSharedInformerFactory(fake.NewClientset(), 0)}
	a, _ := sharedCache(ctx, h)
	b, _ := sharedCache(ctx, h)
	if a != b {
		t.Fatal("two profiles of one scheduler got different caches")
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		sharedMu.Lock()
		_, kept := sharedCaches[h.f]
		sharedMu.Unlock()
		if !kept {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the cache of a stopped scheduler is still kept")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

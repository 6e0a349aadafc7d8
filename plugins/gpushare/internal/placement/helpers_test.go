package placement

import (
	"fmt"
	"math/rand"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placementtest"
)

// testWeights are TesseraGPUShare's default weights.
func testWeights() *Weights {
	return &Weights{Memory: 1, Cores: 1, Policy: 1, Topology: 2, Island: 1, MaxTenants: 10}
}

// cacheOf is a cache that has seen the inventories of nodes.
func cacheOf(nodes ...*v1.Node) *Cache {
	c := NewCache()
	for _, n := range nodes {
		c.SetInventory(n.Name, n.Annotations[api.AnnotationInventory])
	}
	return c
}

// learner is what Fragmentation learns in a profile of TesseraGPUShare whose node-
// and GPU-level policies are both Fragmentation: the workload model, bound to the
// cache and the weights as the plugin binds it, and the placer over it.
type learner struct {
	workload *WorkloadModel
	frag     Placer
}

func newLearner(c *Cache, w *Weights) *learner {
	wl := NewWorkloadModel(DefaultFragmentationWindow)
	wl.Bind(c, w)
	return &learner{workload: wl, frag: &fragmentation{workload: wl}}
}

// learn counts pod, a pod of one container, into the workload as PreFilter does.
func (l *learner) learn(t testing.TB, pod *v1.Pod) {
	t.Helper()
	req, err := api.ParsePodRequest(pod, api.DefaultResourceNames())
	if err != nil {
		t.Fatalf("%s: %v", pod.Name, err)
	}
	if len(req.Containers) != 1 {
		t.Fatalf("%s: %d containers; learn takes pods of one", pod.Name, len(req.Containers))
	}
	l.frag.PreparePod(pod, &PodInfo{Req: req, Order: []int{0}})
}

// teach counts n pods of one shape into the workload.
func (l *learner) teach(t testing.TB, n int, c placementtest.Ctr) {
	t.Helper()
	for i := 0; i < n; i++ {
		l.learn(t, placementtest.Pod(fmt.Sprintf("seen-%s-%d", c.Pct+c.GPU, i), nil, c))
	}
}

// randomUsage is a random usage of m's devices: two in three in use, each by one
// tenant holding the same random percentage (under maxPct) of memory and cores.
func randomUsage(rng *rand.Rand, m *nodemodel.Model, maxPct int) []Usage {
	used := make([]Usage, len(m.Devices))
	for i := range used {
		if rng.Intn(3) > 0 {
			pct := int64(rng.Intn(maxPct))
			used[i] = Usage{MemMiB: m.Devices[i].MemoryMiB * pct / 100, Cores: int(pct), Tenants: 1}
		}
	}
	return used
}

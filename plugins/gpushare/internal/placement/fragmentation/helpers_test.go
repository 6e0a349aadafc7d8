// SPDX-License-Identifier: Apache-2.0

package fragmentation

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placementtest"
)

// testWeights are TesseraGPUShare's default weights.
func testWeights() *placement.Weights {
	return &placement.Weights{Memory: 1, Cores: 1, Policy: 1, Topology: 2, Island: 1, MaxTenants: 10}
}

// cacheOf is a cache that has seen the inventories of nodes.
func cacheOf(nodes ...*v1.Node) *placement.Cache {
	c := placement.NewCache()
	byName := map[string]*v1.Node{}
	for _, n := range nodes {
		c.SetInventory(n.Name, n.Annotations[api.AnnotationInventory])
		byName[n.Name] = n
	}
	cacheNodes.Store(c, byName)
	return c
}

// cacheNodes keeps the nodes each cacheOf cache was given, for modelOf.
var cacheNodes sync.Map

// modelOf is the model of the node named name in c, a cache from cacheOf.
func modelOf(c *placement.Cache, name string) *nodemodel.Model {
	nodes, _ := cacheNodes.Load(c)
	v, _ := c.View(nodes.(map[string]*v1.Node)[name], nil)
	return v.Model
}

// grantsOf is the grants of an assignment, as the cache records them.
func grantsOf(a *api.PodAssignment) []placement.Grant {
	var out []placement.Grant
	for _, ca := range a.Containers {
		for _, d := range ca.Devices {
			out = append(out, placement.Grant{UUID: d.UUID, MemMiB: d.MemoryMiB, Cores: d.Cores})
		}
	}
	return out
}

// learner is what Fragmentation learns in a profile of TesseraGPUShare whose node-
// and GPU-level policies are both Fragmentation: the workload model, bound to the
// cache and the weights as the plugin binds it, and the placer over it.
type learner struct {
	workload *WorkloadModel
	frag     placement.Placer
}

func newLearner(c *placement.Cache, w *placement.Weights) *learner {
	wl := NewWorkloadModel(DefaultWindow)
	wl.Bind(c, w)
	return &learner{workload: wl, frag: &placer{workload: wl}}
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
	l.frag.PreparePod(pod, &placement.PodInfo{Req: req, Order: []int{0}})
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
func randomUsage(rng *rand.Rand, m *nodemodel.Model, maxPct int) []placement.Usage {
	used := make([]placement.Usage, len(m.Devices))
	for i := range used {
		if rng.Intn(3) > 0 {
			pct := int64(rng.Intn(maxPct))
			used[i] = placement.Usage{MemMiB: m.Devices[i].MemoryMiB * pct / 100, Cores: int(pct), Tenants: 1}
		}
	}
	return used
}

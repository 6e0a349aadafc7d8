// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"math"
	"sort"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
	backendcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultbinder"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/queuesort"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	tf "k8s.io/kubernetes/pkg/scheduler/testing/framework"
)

// fwEnv is a scheduler framework built as kube-scheduler builds a profile: the
// plugin registered at PreFilter, Filter, PreScore, Score and Reserve with its args
// in the profile's pluginConfig, over a snapshot of the nodes and bound pods, its
// cache fed by informers.
type fwEnv struct {
	t    *testing.T
	f    framework.Framework
	snap *backendcache.Snapshot
	pl   *Plugin
}

func newFwEnv(t *testing.T, args *TesseraGPUShareArgs, nodes []*v1.Node, pods ...*v1.Pod) *fwEnv {
	t.Helper()
	metrics.Register()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, n)
	}
	for _, p := range pods {
		objs = append(objs, p)
	}
	client := fake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	e := &fwEnv{t: t, snap: backendcache.NewSnapshot(pods, nodes)}
	capture := func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		p, err := New(ctx, obj, h)
		if err == nil {
			e.pl = p.(*Plugin)
		}
		return p, err
	}
	ext := tf.RegisterPluginAsExtensions(Name, capture, "PreFilter", "Filter", "PreScore", "Score", "Reserve")
	withArgs := func(reg *frameworkruntime.Registry, profile *schedulerapi.KubeSchedulerProfile) {
		ext(reg, profile)
		profile.PluginConfig = append(profile.PluginConfig, schedulerapi.PluginConfig{Name: Name, Args: args})
	}
	f, err := tf.NewFramework(ctx, []tf.RegisterPluginFunc{
		tf.RegisterQueueSortPlugin(queuesort.Name, queuesort.New),
		tf.RegisterBindPlugin(defaultbinder.Name, defaultbinder.New),
		withArgs,
	}, "tessera-test",
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithSnapshotSharedLister(e.snap),
	)
	if err != nil {
		t.Fatalf("NewFramework: %v", err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	// The plugin's handlers have seen every object a moment after the informers have.
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return e.pl.synced(), nil
	}); err != nil {
		t.Fatalf("the plugin's cache did not sync: %v", err)
	}
	e.f = f
	return e
}

// schedule runs one scheduling cycle for pod through the framework, PreFilter to
// Reserve, and returns the chosen node and the framework's total score per node.
func (e *fwEnv) schedule(pod *v1.Pod) (string, map[string]int64) {
	e.t.Helper()
	ctx := context.Background()
	state := framework.NewCycleState()
	if _, st, _ := e.f.RunPreFilterPlugins(ctx, state, pod); !st.IsSuccess() {
		e.t.Fatalf("PreFilter: %v", st)
	}
	all, err := e.snap.NodeInfos().List()
	if err != nil {
		e.t.Fatal(err)
	}
	var feasible []fwk.NodeInfo
	for _, ni := range all {
		if st := e.f.RunFilterPlugins(ctx, state, pod, ni); st.IsSuccess() {
			feasible = append(feasible, ni)
		}
	}
	if len(feasible) == 0 {
		e.t.Fatal("no node passed Filter")
	}
	if st := e.f.RunPreScorePlugins(ctx, state, pod, feasible); !st.IsSuccess() {
		e.t.Fatalf("PreScore: %v", st)
	}
	scores, st := e.f.RunScorePlugins(ctx, state, pod, feasible)
	if !st.IsSuccess() {
		e.t.Fatalf("Score: %v", st)
	}
	// The highest total wins; a tie goes to the first node by name (kube-scheduler
	// would pick one of them at random), so that the test is deterministic.
	sort.Slice(scores, func(i, j int) bool { return scores[i].Name < scores[j].Name })
	best, bestScore, total := "", int64(math.MinInt64), map[string]int64{}
	for _, s := range scores {
		total[s.Name] = s.TotalScore
		if s.TotalScore > bestScore {
			best, bestScore = s.Name, s.TotalScore
		}
	}
	if st := e.f.RunReservePluginsReserve(ctx, state, pod, best); !st.IsSuccess() {
		e.t.Fatalf("Reserve(%s): %v", best, st)
	}
	return best, total
}

// Every policy through a framework: Filter finds the GPUs, Score (with
// NormalizeScore where the policy has one) picks the node, Reserve assumes the GPU the
// GPU-level policy picks in the plugin's cache.
//
// Two H100 nodes; GPU 0 of "busy" has 60000 MiB and 50% of its cores granted. The pod
// asks one GPU with 8000 MiB and 10% of its cores.
//
//	Binpack        busy: least left after placement; GPU 0, the fullest that fits.
//	Spread         empty: 1-(util+occupied)/2 is highest there; GPU 0 (all alike, the
//	               first).
//	Fragmentation  the learned workload is the pod's own shape, which still fits GPU 0
//	               of busy afterwards: no node fragments, and both nodes score the
//	               maximum once normalised (the tie goes to busy, first by name);
//	               GPU 0, the best fit.
func TestFrameworkCyclePerPolicy(t *testing.T) {
	busy := bindPod(t, makePod("busy", nil, ctr{Name: "c", GPU: "1"}), "busy", oneGrant("busy", 60000, 50, 0))
	for _, tc := range []struct {
		policy     Policy
		node       string
		normalised bool
	}{
		{Binpack, "busy", false},
		{Spread, "empty", false},
		{Fragmentation, "busy", true},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			e := newFwEnv(t, &TesseraGPUShareArgs{NodePolicy: tc.policy, DevicePolicy: tc.policy}, []*v1.Node{h100(t, "empty"), h100(t, "busy")}, busy)
			if got := e.pl.ScoreExtensions() != nil; got != tc.normalised {
				t.Errorf("ScoreExtensions set: %v, want %v", got, tc.normalised)
			}
			pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "8000", Cores: "10"})
			node, scores := e.schedule(pod)
			if node != tc.node {
				t.Fatalf("placed on %s (scores %v), want %s", node, scores, tc.node)
			}
			if tc.policy == Fragmentation && scores["busy"] != scores["empty"] {
				t.Errorf("scores %v, want a tie (no node fragments)", scores)
			}
			for n, s := range scores {
				if s < fwk.MinNodeScore || s > fwk.MaxNodeScore {
					t.Errorf("score of %s = %d, out of the framework's range", n, s)
				}
			}
			usage, err := e.pl.Cache().NodeUsage(node)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, d := range usage {
				for _, p := range d.Pods {
					if p == "default/p" {
						got = append(got, d.Index)
						if want := int64(8000); d.UsedMiB-usedBefore(node, d.Index) != want {
							t.Errorf("GPU %d: %d MiB used, want %d more than before", d.Index, d.UsedMiB, want)
						}
					}
				}
			}
			if len(got) != 1 || got[0] != 0 {
				t.Errorf("reserved GPUs %v on %s, want [0]", got, node)
			}
		})
	}
}

// usedBefore is the memory granted on GPU i of node before the test's pod.
func usedBefore(node string, i int) int64 {
	if node == "busy" && i == 0 {
		return 60000
	}
	return 0
}

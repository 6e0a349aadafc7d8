// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"
	"math"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	backendcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/parallelize"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

// fakeHandle gives the plugin the things it uses from the framework: the snapshot
// (Reserve reads the node), the client (Bind or PreBind writes the pod) and, when
// binders is set, the profile's Bind plugins.
type fakeHandle struct {
	fwk.Handle
	lister fwk.SharedLister
	client clientset.Interface
	dra    fwk.SharedDRAManager
}

func (h *fakeHandle) SharedDRAManager() fwk.SharedDRAManager { return h.dra }

func (h *fakeHandle) SnapshotSharedLister() fwk.SharedLister                 { return h.lister }
func (h *fakeHandle) ClientSet() clientset.Interface                         { return h.client }
func (h *fakeHandle) SharedInformerFactory() informers.SharedInformerFactory { return nil }
func (h *fakeHandle) APICacher() fwk.APICacher                               { return nil }
func (h *fakeHandle) ProfileName() string                                    { return "test-profile" }

// Parallelizer is the framework's; its goroutine gauge needs the scheduler's metrics.
func (h *fakeHandle) Parallelizer() fwk.Parallelizer {
	metrics.Register()
	return parallelize.NewParallelizer(4)
}

// listingHandle is a fakeHandle that also lists the profile's plugins, as the
// framework does.
type listingHandle struct {
	*fakeHandle
	binders []string
}

func (h *listingHandle) ListPlugins() *config.Plugins {
	ps := &config.Plugins{}
	for _, b := range h.binders {
		ps.Bind.Enabled = append(ps.Bind.Enabled, config.Plugin{Name: b})
	}
	return ps
}

// bindLikeAPIServer makes the fake clientset handle pods/binding as the API server
// does: the binding's UID must match, the pod must be unbound, and the binding's
// annotations are merged onto the pod in the same update that sets its node.
func bindLikeAPIServer(client *fake.Clientset) {
	gvr := v1.SchemeGroupVersion.WithResource("pods")
	client.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := action.(k8stesting.CreateAction).GetObject().(*v1.Binding)
		obj, err := client.Tracker().Get(gvr, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*v1.Pod).DeepCopy()
		if b.UID != "" && b.UID != pod.UID {
			return true, nil, apierrors.NewConflict(v1.Resource("pods/binding"), b.Name, fmt.Errorf("precondition failed: UID in precondition: %s, UID in object meta: %s", b.UID, pod.UID))
		}
		if pod.Spec.NodeName != "" {
			return true, nil, apierrors.NewConflict(v1.Resource("pods/binding"), b.Name, fmt.Errorf("pod %v is already assigned to node %q", pod.Name, pod.Spec.NodeName))
		}
		pod.Spec.NodeName = b.Target.Name
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		for k, v := range b.Annotations {
			pod.Annotations[k] = v
		}
		return true, b, client.Tracker().Update(gvr, pod, b.Namespace)
	})
}

type env struct {
	t      testing.TB
	pl     *Plugin
	client *fake.Clientset
	nodes  []*v1.Node
	infos  []fwk.NodeInfo
}

// newEnv builds the plugin over nodes and already-bound pods, as the informers
// would have seen them.
func newEnv(t testing.TB, args *TesseraGPUShareArgs, nodes []*v1.Node, pods ...*v1.Pod) *env {
	t.Helper()
	if args == nil {
		args = &TesseraGPUShareArgs{}
	}
	client := fake.NewClientset()
	bindLikeAPIServer(client)
	for _, p := range pods {
		if _, err := client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1CreateOpts); err != nil {
			t.Fatal(err)
		}
	}
	snap := backendcache.NewSnapshot(pods, nodes)
	h := &fakeHandle{lister: snap, client: client}
	p, err := NewWithDefaults(&Defaults{})(context.Background(), args, h)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	pl := p.(*Plugin)
	for _, n := range nodes {
		pl.cache.SetInventory(n.Name, n.Annotations["tessera.dev/gpu-inventory"])
	}
	for _, pod := range pods {
		if err := pl.cache.OnPod(pod); err != nil {
			t.Fatalf("OnPod(%s): %v", pod.Name, err)
		}
	}
	e := &env{t: t, pl: pl, client: client, nodes: nodes}
	for _, n := range nodes {
		ni := framework.NewNodeInfo()
		ni.SetNode(n)
		e.infos = append(e.infos, ni)
	}
	return e
}

// addPendingPod creates pod in the fake API so that PreBind can patch it.
func (e *env) addPendingPod(p *v1.Pod) {
	e.t.Helper()
	if _, err := e.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1CreateOpts); err != nil {
		e.t.Fatal(err)
	}
}

// cycle runs PreFilter and Filter on every node and Score on the feasible ones.
type cycleResult struct {
	state    fwk.CycleState
	pre      *fwk.Status
	filter   map[string]*fwk.Status
	scores   map[string]int64
	best     string
	feasible []string
}

func (e *env) cycle(pod *v1.Pod) *cycleResult {
	e.t.Helper()
	ctx := context.Background()
	r := &cycleResult{state: framework.NewCycleState(), filter: map[string]*fwk.Status{}, scores: map[string]int64{}}
	_, r.pre = e.pl.PreFilter(ctx, r.state, pod, e.infos)
	if !r.pre.IsSuccess() {
		return r
	}
	for _, ni := range e.infos {
		st := e.pl.Filter(ctx, r.state, pod, ni)
		r.filter[ni.Node().Name] = st
		if st.IsSuccess() {
			r.feasible = append(r.feasible, ni.Node().Name)
		}
	}
	if st := e.pl.PreScore(ctx, r.state, pod, e.infos); !st.IsSuccess() {
		e.t.Fatalf("PreScore: %v", st)
	}
	// Raw scores (before NormalizeScore) may be negative.
	var bestScore int64 = math.MinInt64
	for _, ni := range e.infos {
		name := ni.Node().Name
		if !r.filter[name].IsSuccess() {
			continue
		}
		s, st := e.pl.Score(ctx, r.state, pod, ni)
		if !st.IsSuccess() {
			e.t.Fatalf("Score(%s): %v", name, st)
		}
		r.scores[name] = s
		if s > bestScore {
			bestScore, r.best = s, name
		}
	}
	return r
}

// scoreCPUPod runs the cycle of a pod without GPUs by hand (PreFilter skips such a pod,
// so cycle would stop there): PreScore, then Score on every node. Raw scores by node.
func (e *env) scoreCPUPod(pod *v1.Pod) map[string]int64 {
	e.t.Helper()
	ctx := context.Background()
	cs := framework.NewCycleState()
	e.pl.PreFilter(ctx, cs, pod, e.infos)
	if st := e.pl.PreScore(ctx, cs, pod, e.infos); !st.IsSuccess() {
		e.t.Fatalf("PreScore: %v", st)
	}
	scores := map[string]int64{}
	for _, ni := range e.infos {
		s, st := e.pl.Score(ctx, cs, pod, ni)
		if !st.IsSuccess() {
			e.t.Fatalf("Score: %v", st)
		}
		scores[ni.Node().Name] = s
	}
	return scores
}

// schedule runs a whole cycle plus Reserve, PreBind and Bind on the best node, as the
// framework does, and returns the assignment written to the API.
func (e *env) schedule(pod *v1.Pod) (*cycleResult, string) {
	e.t.Helper()
	e.addPendingPod(pod)
	r := e.cycle(pod)
	if r.best == "" {
		return r, ""
	}
	ctx := context.Background()
	if st := e.pl.Reserve(ctx, r.state, pod, r.best); !st.IsSuccess() {
		e.t.Fatalf("Reserve(%s): %v", r.best, st)
	}
	if st := e.pl.PreBind(ctx, r.state, pod, r.best); !st.IsSuccess() {
		e.t.Fatalf("PreBind(%s): %v", r.best, st)
	}
	if st := e.pl.Bind(ctx, r.state, pod, r.best); !st.IsSuccess() && !st.IsSkip() {
		e.t.Fatalf("Bind(%s): %v", r.best, st)
	}
	got, err := e.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1GetOpts)
	if err != nil {
		e.t.Fatal(err)
	}
	// The informer would now see the pod bound with its annotation.
	got.Spec.NodeName = r.best
	if err := e.pl.cache.OnPod(got); err != nil {
		e.t.Fatalf("OnPod after bind: %v", err)
	}
	return r, got.Annotations["tessera.dev/gpu-assignment"]
}

var (
	metav1CreateOpts = metav1.CreateOptions{}
	metav1GetOpts    = metav1.GetOptions{}
	metav1UpdateOpts = metav1.UpdateOptions{}
	metav1DeleteOpts = metav1.DeleteOptions{}
)

// SPDX-License-Identifier: Apache-2.0

package noderesourcesfit

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
)

const (
	gpu        v1.ResourceName = "tessera.dev/gpu"
	gpuMemory  v1.ResourceName = "tessera.dev/gpu-memory"
	gpuPercent v1.ResourceName = "tessera.dev/gpu-memory-percent"
	gpuCores   v1.ResourceName = "tessera.dev/gpu-cores"
	nvidiaGPU  v1.ResourceName = "nvidia.com/gpu"
	fooDevice  v1.ResourceName = "example.com/foo"
)

// handle is the part of the framework handle NodeResourcesFit reads without a cluster:
// a DRA manager that knows no device classes, so no resource is delegated to DRA.
type handle struct{ fwk.Handle }

func (handle) SharedDRAManager() fwk.SharedDRAManager { return draManager{} }

type draManager struct{ fwk.SharedDRAManager }

func (draManager) DeviceClassResolver() fwk.DeviceClassResolver { return noClasses{} }

type noClasses struct{}

func (noClasses) GetDeviceClass(v1.ResourceName) *resourceapi.DeviceClass { return nil }

func fraction(name string) *st.PodWrapper {
	return st.MakePod().Name(name).UID(name).Res(map[v1.ResourceName]string{
		v1.ResourceCPU: "1", v1.ResourceMemory: "2Gi", gpu: "1", gpuMemory: "8192", gpuCores: "20"})
}

// testPods cover Tessera's request shapes and the resources NodeResourcesFit must still
// check beside them.
func testPods() map[string]*v1.Pod {
	return map[string]*v1.Pod{
		"fraction": fraction("fraction").Obj(),
		"whole GPU by percent": st.MakePod().Name("whole").UID("whole").Res(map[v1.ResourceName]string{
			v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi", gpu: "1", gpuPercent: "100"}).Obj(),
		"multi-GPU, two containers and an init container": st.MakePod().Name("multi").UID("multi").
			InitReq(map[v1.ResourceName]string{v1.ResourceCPU: "6", gpu: "1", gpuPercent: "100"}).
			Res(map[v1.ResourceName]string{v1.ResourceCPU: "2", v1.ResourceMemory: "8Gi", gpu: "2", gpuPercent: "100"}).
			Res(map[v1.ResourceName]string{v1.ResourceCPU: "1", gpu: "2", gpuPercent: "100"}).Obj(),
		"GPU limits only": st.MakePod().Name("limits").UID("limits").Lim(map[v1.ResourceName]string{gpu: "1", gpuCores: "50"}).
			Req(map[v1.ResourceName]string{v1.ResourceCPU: "500m"}).Obj(),
		"fraction and an NVIDIA GPU that fits":     fraction("nvidia").Res(map[v1.ResourceName]string{nvidiaGPU: "1"}).Obj(),
		"fraction and NVIDIA GPUs that do not fit": fraction("nvidia3").Res(map[v1.ResourceName]string{nvidiaGPU: "3"}).Obj(),
		"fraction and a device no node has":        fraction("foo").Res(map[v1.ResourceName]string{fooDevice: "1"}).Obj(),
		"fraction, too much CPU":                   fraction("cpu").Res(map[v1.ResourceName]string{v1.ResourceCPU: "7"}).Obj(),
		"fraction, more CPU than any node":         fraction("cpu64").Res(map[v1.ResourceName]string{v1.ResourceCPU: "64"}).Obj(),
		"fraction, too much memory":                fraction("mem").Res(map[v1.ResourceName]string{v1.ResourceMemory: "28Gi"}).Obj(),
		"fraction with overhead": fraction("overhead").Overhead(v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("250m"), gpu: resource.MustParse("1")}).Obj(),
		"pod-level resources": st.MakePod().Name("podlevel").UID("podlevel").
			PodLevelResourceRequests(map[v1.ResourceName]string{v1.ResourceCPU: "3", v1.ResourceMemory: "4Gi", gpu: "1", gpuMemory: "4096"}).
			Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", gpu: "1"}).Obj(),
		"CPU pod":         st.MakePod().Name("cpupod").UID("cpupod").Req(map[v1.ResourceName]string{v1.ResourceCPU: "1", v1.ResourceMemory: "1Gi"}).Obj(),
		"best-effort pod": st.MakePod().Name("be").UID("be").Container("c").Obj(),
	}
}

// testNodes: a roomy node, one nearly full, one at its pod limit, one that advertises
// Tessera's resources itself and one without NVIDIA GPUs.
func testNodes() map[string]fwk.NodeInfo {
	used := func(name string, cpu, mem string) *v1.Pod {
		return st.MakePod().Name(name).UID(name).Req(map[v1.ResourceName]string{
			v1.ResourceCPU: cpu, v1.ResourceMemory: mem, gpu: "1", gpuMemory: "4096", nvidiaGPU: "1"}).Obj()
	}
	mk := func(name string, capacity map[v1.ResourceName]string, pods ...*v1.Pod) fwk.NodeInfo {
		ni := framework.NewNodeInfo(pods...)
		ni.SetNode(st.MakeNode().Name(name).Capacity(capacity).Obj())
		return ni
	}
	base := map[v1.ResourceName]string{v1.ResourceCPU: "16", v1.ResourceMemory: "64Gi", nvidiaGPU: "2"}
	withPods := func(n string) map[v1.ResourceName]string {
		c := map[v1.ResourceName]string{v1.ResourcePods: n}
		for k, v := range base {
			c[k] = v
		}
		return c
	}
	tessera := withPods("32")
	tessera[gpu] = "8"
	return map[string]fwk.NodeInfo{
		"roomy":                      mk("roomy", base, used("r1", "2", "4Gi")),
		"nearly full":                mk("full", base, used("f1", "8", "30Gi"), used("f2", "4", "10Gi")),
		"pod limit":                  mk("limit", withPods("2"), used("l1", "1", "1Gi"), used("l2", "1", "1Gi")),
		"advertises tessera.dev/gpu": mk("tessera", tessera, used("t1", "1", "1Gi")),
		"no NVIDIA GPUs":             mk("plain", map[v1.ResourceName]string{v1.ResourceCPU: "16", v1.ResourceMemory: "64Gi"}),
	}
}

func testArgs() map[string]*config.NodeResourcesFitArgs {
	cpuMem := []config.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}
	return map[string]*config.NodeResourcesFitArgs{
		"group, MostAllocated": {IgnoredResourceGroups: []string{"tessera.dev"},
			ScoringStrategy: &config.ScoringStrategy{Type: config.MostAllocated, Resources: cpuMem}},
		"group, LeastAllocated": {IgnoredResourceGroups: []string{"tessera.dev"},
			ScoringStrategy: &config.ScoringStrategy{Type: config.LeastAllocated, Resources: cpuMem}},
		"exact names": {IgnoredResources: []string{string(gpu), string(gpuMemory), string(fooDevice)},
			ScoringStrategy: &config.ScoringStrategy{Type: config.LeastAllocated, Resources: cpuMem}},
		"group and an ignored scoring resource": {IgnoredResourceGroups: []string{"tessera.dev", "example.com"},
			ScoringStrategy: &config.ScoringStrategy{Type: config.MostAllocated, Resources: []config.ResourceSpec{
				{Name: "cpu", Weight: 1}, {Name: string(gpu), Weight: 2}, {Name: string(nvidiaGPU), Weight: 1}}}},
		"nothing ignored": {ScoringStrategy: &config.ScoringStrategy{Type: config.LeastAllocated, Resources: cpuMem}},
	}
}

func testFeatures() map[string]feature.Features {
	return map[string]feature.Features{
		"no gates":      {},
		"default gates": feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate),
		"pod-level resources and in-place scaling": {EnablePodLevelResources: true, EnableInPlacePodVerticalScaling: true,
			EnableInPlacePodVerticalScalingSchedulerPreemption: true},
	}
}

func newPair(t testing.TB, args *config.NodeResourcesFitArgs, fts feature.Features) (*noderesources.Fit, *Plugin) {
	t.Helper()
	ctx := context.Background()
	up, err := noderesources.NewFit(ctx, args, handle{}, fts)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWithFeatures(ctx, args, handle{}, fts)
	if err != nil {
		t.Fatal(err)
	}
	return up.(*noderesources.Fit), w.(*Plugin)
}

// cycle is what one plugin reports for one pod on one node.
type cycle struct {
	preFilter, filter, preScore, score string
	scoreValue                         int64
}

func run(ctx context.Context, pl interface {
	fwk.PreFilterPlugin
	fwk.FilterPlugin
	fwk.PreScorePlugin
	fwk.ScorePlugin
}, pod *v1.Pod, nodes []fwk.NodeInfo, ni fwk.NodeInfo) cycle {
	var c cycle
	cs := framework.NewCycleState()
	_, s := pl.PreFilter(ctx, cs, pod, nodes)
	c.preFilter = statusString(s)
	c.filter = statusString(pl.Filter(ctx, cs, pod, ni))
	c.preScore = statusString(pl.PreScore(ctx, cs, pod, nodes))
	var ss *fwk.Status
	c.scoreValue, ss = pl.Score(ctx, cs, pod, ni)
	c.score = statusString(ss)
	return c
}

// statusString is a status's code and reasons, sorted: NodeResourcesFit reports extended
// resources in map order, so two runs of NodeResourcesFit itself differ in order.
func statusString(s *fwk.Status) string {
	if s.IsSuccess() {
		return "Success"
	}
	reasons := slices.Sorted(slices.Values(s.Reasons()))
	return fmt.Sprintf("%s: %s", s.Code(), strings.Join(reasons, "; "))
}

// TestSameAsNodeResourcesFit runs NodeResourcesFit and the wrapper side by side on every
// pod, node, args and feature-gate combination and wants the same statuses, reasons
// and scores.
func TestSameAsNodeResourcesFit(t *testing.T) {
	ctx := context.Background()
	nodes := testNodes()
	var all []fwk.NodeInfo
	for _, ni := range nodes {
		all = append(all, ni)
	}
	reasons := map[string]bool{}
	for an, args := range testArgs() {
		for fn, fts := range testFeatures() {
			up, w := newPair(t, args, fts)
			for pn, pod := range testPods() {
				before := pod.DeepCopy()
				for nn, ni := range nodes {
					want := run(ctx, up, pod, all, ni)
					got := run(ctx, w, pod, all, ni)
					if got != want {
						t.Errorf("%s, %s, %s on %s:\n got %+v\nwant %+v", an, fn, pn, nn, got, want)
					}
					reasons[want.filter] = true
				}
				if !apiequality.Semantic.DeepEqual(before, pod) {
					t.Errorf("%s, %s: the wrapper changed the pod", an, pn)
				}
			}
		}
	}
	// The cases must reach every kind of outcome, or the comparison proves little.
	for _, want := range []string{"Success", "Unschedulable: Too many pods", "Unschedulable: Insufficient cpu",
		"Unschedulable: Insufficient memory", "Unschedulable: Insufficient nvidia.com/gpu",
		"UnschedulableAndUnresolvable: Insufficient cpu", "UnschedulableAndUnresolvable: Insufficient example.com/foo",
		"UnschedulableAndUnresolvable: Insufficient tessera.dev/gpu"} {
		if !reasons[want] {
			t.Errorf("no case gave %q; outcomes: %v", want, reasons)
		}
	}
}

// TestUpstreamInterfaces: the wrapper implements every framework interface
// NodeResourcesFit does, and what it does not override answers as NodeResourcesFit.
func TestUpstreamInterfaces(t *testing.T) {
	ifaces := []reflect.Type{
		reflect.TypeFor[fwk.PreEnqueuePlugin](), reflect.TypeFor[fwk.QueueSortPlugin](),
		reflect.TypeFor[fwk.EnqueueExtensions](), reflect.TypeFor[fwk.PreFilterPlugin](),
		reflect.TypeFor[fwk.FilterPlugin](), reflect.TypeFor[fwk.PostFilterPlugin](),
		reflect.TypeFor[fwk.PodGroupPostFilterPlugin](), reflect.TypeFor[fwk.PreScorePlugin](),
		reflect.TypeFor[fwk.ScorePlugin](), reflect.TypeFor[fwk.ReservePlugin](),
		reflect.TypeFor[fwk.PreBindPlugin](), reflect.TypeFor[fwk.PostBindPlugin](),
		reflect.TypeFor[fwk.PermitPlugin](), reflect.TypeFor[fwk.BindPlugin](),
		reflect.TypeFor[fwk.SignPlugin](), reflect.TypeFor[fwk.PlacementGeneratePlugin](),
		reflect.TypeFor[fwk.PlacementScorePlugin](),
	}
	args := testArgs()["group, MostAllocated"]
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	fts.EnableInPlacePodVerticalScaling = true
	up, w := newPair(t, args, fts)
	for _, it := range ifaces {
		if reflect.TypeOf(up).Implements(it) != reflect.TypeOf(w).Implements(it) {
			t.Errorf("%s: NodeResourcesFit implements it: %v, the wrapper: %v", it, reflect.TypeOf(up).Implements(it), reflect.TypeOf(w).Implements(it))
		}
	}
	if w.ScoreExtensions() != up.ScoreExtensions() {
		t.Errorf("ScoreExtensions differ")
	}
	if (w.PreFilterExtensions() == nil) != (up.PreFilterExtensions() == nil) {
		t.Errorf("PreFilterExtensions: wrapper nil %v, NodeResourcesFit nil %v", w.PreFilterExtensions() == nil, up.PreFilterExtensions() == nil)
	}
	ctx := context.Background()
	we, err := w.EventsToRegister(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ue, _ := up.EventsToRegister(ctx)
	if len(we) != len(ue) {
		t.Fatalf("events: %d, NodeResourcesFit %d", len(we), len(ue))
	}
	for i := range we {
		if we[i].Event != ue[i].Event {
			t.Errorf("event %d: %v, NodeResourcesFit %v", i, we[i].Event, ue[i].Event)
		}
	}
	for pn, pod := range testPods() {
		wf, ws := w.SignPod(ctx, pod)
		uf, us := up.SignPod(ctx, pod)
		if !reflect.DeepEqual(wf, uf) || statusString(ws) != statusString(us) {
			t.Errorf("%s: SignPod %v %v, NodeResourcesFit %v %v", pn, wf, ws, uf, us)
		}
	}
}

// recorder is a PreFilterExtensions that records the pods it is given.
type recorder struct{ toSchedule, other []*v1.Pod }

func (r *recorder) AddPod(_ context.Context, _ fwk.CycleState, p *v1.Pod, pi fwk.PodInfo, _ fwk.NodeInfo) *fwk.Status {
	r.toSchedule, r.other = append(r.toSchedule, p), append(r.other, pi.GetPod())
	return nil
}

func (r *recorder) RemovePod(_ context.Context, _ fwk.CycleState, p *v1.Pod, pi fwk.PodInfo, _ fwk.NodeInfo) *fwk.Status {
	return r.AddPod(context.Background(), nil, p, pi, nil)
}

// TestPreemption: during preemption the framework filters the pod against node infos
// with victims removed; the wrapper must decide as NodeResourcesFit does there too.
// Should NodeResourcesFit gain AddPod/RemovePod, they get the stripped pod to schedule
// and the added or removed pods as the node info holds them.
func TestPreemption(t *testing.T) {
	ctx := context.Background()
	args := testArgs()["group, MostAllocated"]
	up, w := newPair(t, args, feature.Features{})
	ni := testNodes()["nearly full"]
	pod := fraction("preemptor").Res(map[v1.ResourceName]string{v1.ResourceCPU: "6"}).Obj()
	ucs, wcs := framework.NewCycleState(), framework.NewCycleState()
	up.PreFilter(ctx, ucs, pod, nil)
	w.PreFilter(ctx, wcs, pod, nil)
	if got, want := statusString(w.Filter(ctx, wcs, pod, ni)), statusString(up.Filter(ctx, ucs, pod, ni)); got != want || got == "Success" {
		t.Fatalf("before removing the victim: %s, NodeResourcesFit %s (want both unschedulable)", got, want)
	}
	victim := ni.GetPods()[0]
	trial := ni.Snapshot()
	if err := trial.RemovePod(klog.Background(), victim.GetPod()); err != nil {
		t.Fatal(err)
	}
	ucs2, wcs2 := ucs.Clone(), wcs.Clone()
	if got, want := statusString(w.Filter(ctx, wcs2, pod, trial)), statusString(up.Filter(ctx, ucs2, pod, trial)); got != want || got != "Success" {
		t.Errorf("victim removed: %s, NodeResourcesFit %s (want both Success)", got, want)
	}

	rec := &recorder{}
	ext := &extensions{ext: rec, pl: w}
	ext.AddPod(ctx, wcs, pod, victim, ni)
	ext.RemovePod(ctx, wcs, pod, victim, ni)
	for i, p := range rec.toSchedule {
		if _, ok := p.Spec.Containers[0].Resources.Requests[gpu]; ok {
			t.Errorf("call %d: pod to schedule still requests %s", i, gpu)
		}
		if p.Name != pod.Name || p.UID != pod.UID {
			t.Errorf("call %d: pod to schedule is %s/%s", i, p.Name, p.UID)
		}
		if rec.other[i] != victim.GetPod() {
			t.Errorf("call %d: the victim was not passed as it is", i)
		}
	}
	if len(rec.toSchedule) != 2 {
		t.Errorf("%d calls, want 2", len(rec.toSchedule))
	}
}

func TestStrip(t *testing.T) {
	l := newIgnoreList(&config.NodeResourcesFitArgs{IgnoredResourceGroups: []string{"tessera.dev"}, IgnoredResources: []string{"example.com/foo"}})
	pod := fraction("p").InitReq(map[v1.ResourceName]string{gpu: "1", v1.ResourceCPU: "1"}).
		Res(map[v1.ResourceName]string{fooDevice: "1", nvidiaGPU: "1"}).Obj()
	got := l.strip(pod)
	for _, c := range append(append([]v1.Container{}, got.Spec.Containers...), got.Spec.InitContainers...) {
		for _, rl := range []v1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name := range rl {
				if strings.HasPrefix(string(name), "tessera.dev/") || name == fooDevice {
					t.Errorf("container %s keeps %s", c.Name, name)
				}
			}
		}
	}
	if q := got.Spec.Containers[1].Resources.Requests[nvidiaGPU]; q.Value() != 1 {
		t.Errorf("nvidia.com/gpu request %v, want 1", q)
	}
	if q := got.Spec.Containers[0].Resources.Requests[v1.ResourceCPU]; q.Value() != 1 {
		t.Errorf("cpu request %v, want 1", q)
	}
	if _, ok := pod.Spec.Containers[0].Resources.Requests[gpu]; !ok {
		t.Errorf("the original pod lost its request")
	}
	cpuPod := st.MakePod().Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj()
	if l.strip(cpuPod) != cpuPod {
		t.Errorf("a pod with nothing to strip was copied")
	}
	// NodeResourcesFit ignores only extended resources: a group that is a native
	// domain or names without a domain are never stripped.
	native := newIgnoreList(&config.NodeResourcesFitArgs{IgnoredResourceGroups: []string{"kubernetes.io"}, IgnoredResources: []string{"cpu"}})
	for _, name := range []v1.ResourceName{"cpu", "kubernetes.io/foo", "hugepages-2Mi"} {
		if native.has(name) {
			t.Errorf("%s stripped", name)
		}
	}
}

// has memoizes whether a name is an extended resource; its answers must stay
// NodeResourcesFit's rule for every name, asked once or again, and beyond the memo's
// bound.
func TestIgnoreListRuleIsUpstreams(t *testing.T) {
	args := &config.NodeResourcesFitArgs{IgnoredResourceGroups: []string{"tessera.dev", "kubernetes.io", "cpu"}, IgnoredResources: []string{"example.com/foo", "memory", "example.com/Bad Name"}}
	l := newIgnoreList(args)
	want := func(name v1.ResourceName) bool {
		if !v1helper.IsExtendedResourceName(name) {
			return false
		}
		group, _, _ := strings.Cut(string(name), "/")
		return slices.Contains(args.IgnoredResources, string(name)) || slices.Contains(args.IgnoredResourceGroups, group)
	}
	names := []v1.ResourceName{"cpu", "memory", "hugepages-2Mi", "tessera.dev/gpu", "tessera.dev/gpu-memory",
		"tessera.dev/", "tessera.dev/bad name", "tessera.dev/a/b", "kubernetes.io/foo", "example.com/foo",
		"example.com/bar", "example.com/Bad Name", "requests.tessera.dev/gpu", "nvidia.com/gpu", ""}
	for i := 0; i < 2*maxExtendedNames; i++ {
		names = append(names, v1.ResourceName(fmt.Sprintf("tessera.dev/r%d", i)))
		if i%7 == 0 {
			names = append(names, v1.ResourceName(fmt.Sprintf("tessera.dev/r%d?", i)))
		}
	}
	for pass := 0; pass < 2; pass++ {
		for _, name := range names {
			if got := l.has(name); got != want(name) {
				t.Fatalf("pass %d: has(%q) = %v, NodeResourcesFit's rule says %v", pass, name, got, want(name))
			}
		}
	}
	if n := l.extended.n.Load(); n > maxExtendedNames {
		t.Errorf("%d names memoized, bound %d", n, maxExtendedNames)
	}
}

func TestDecodeArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		obj     runtime.Object
		want    *config.NodeResourcesFitArgs
		wantErr string
	}{{
		name: "none: the scheduler's defaults",
		want: &config.NodeResourcesFitArgs{ScoringStrategy: &config.ScoringStrategy{Type: config.LeastAllocated,
			Resources: []config.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}}},
	}, {
		name: "YAML, strategy without resources",
		obj: &runtime.Unknown{ContentType: runtime.ContentTypeYAML, Raw: []byte(
			"ignoredResourceGroups: [tessera.dev]\nscoringStrategy:\n  type: MostAllocated\n")},
		want: &config.NodeResourcesFitArgs{IgnoredResourceGroups: []string{"tessera.dev"},
			ScoringStrategy: &config.ScoringStrategy{Type: config.MostAllocated,
				Resources: []config.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}}},
	}, {
		name: "JSON",
		obj:  &runtime.Unknown{Raw: []byte(`{"ignoredResources":["example.com/foo"],"scoringStrategy":{"type":"MostAllocated","resources":[{"name":"cpu","weight":3}]}}`)},
		want: &config.NodeResourcesFitArgs{IgnoredResources: []string{"example.com/foo"},
			ScoringStrategy: &config.ScoringStrategy{Type: config.MostAllocated, Resources: []config.ResourceSpec{{Name: "cpu", Weight: 3}}}},
	}, {
		name: "typed v1 args, defaulted",
		obj:  &configv1.NodeResourcesFitArgs{IgnoredResourceGroups: []string{"tessera.dev"}},
		want: &config.NodeResourcesFitArgs{IgnoredResourceGroups: []string{"tessera.dev"},
			ScoringStrategy: &config.ScoringStrategy{Type: config.LeastAllocated,
				Resources: []config.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}}},
	}, {
		name:    "duplicate field",
		obj:     &runtime.Unknown{Raw: []byte(`{"ignoredResources":["a.io/b"],"ignoredResources":["c.io/d"]}`)},
		wantErr: `duplicate field "ignoredResources"`,
	}, {
		name:    "unknown field",
		obj:     &runtime.Unknown{Raw: []byte(`{"ignoredResourceGroup":["tessera.dev"]}`)},
		wantErr: `unknown field "ignoredResourceGroup"`,
	}, {
		name:    "invalid strategy, rejected by NodeResourcesFit's validation",
		obj:     &runtime.Unknown{Raw: []byte(`{"scoringStrategy":{"type":"Nearest"}}`)},
		wantErr: "scoringStrategy.type",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewWithFeatures(context.Background(), tc.obj, handle{}, feature.Features{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := DecodeArgs(tc.obj)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("args %+v, want %+v", got, tc.want)
			}
			if p.Name() != Name {
				t.Errorf("name %s", p.Name())
			}
		})
	}
}

// TestQueueingHintsSeeTheStrippedPod: NodeResourcesFit's node hint checks the pod
// against the new node without its ignore lists, so a new node with room for a GPU pod's
// CPU and memory (and, as every node, no tessera.dev resources) would not requeue it.
// The wrapper's hint sees the stripped pod and requeues it; for other pods, and for
// nodes too small, it answers as NodeResourcesFit does.
func TestQueueingHintsSeeTheStrippedPod(t *testing.T) {
	up, w := newPair(t, testArgs()["group, MostAllocated"], feature.Features{})
	big := st.MakeNode().Name("big").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "64", v1.ResourceMemory: "256Gi"}).Obj()
	small := st.MakeNode().Name("small").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "1m", v1.ResourceMemory: "1Ki"}).Obj()
	nodeHint := func(pl fwk.EnqueueExtensions, pod *v1.Pod, node *v1.Node) fwk.QueueingHint {
		events, err := pl.EventsToRegister(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events {
			if e.Event.Resource == fwk.Node {
				h, err := e.QueueingHintFn(klog.Background(), pod, nil, node)
				if err != nil {
					t.Fatal(err)
				}
				return h
			}
		}
		t.Fatal("no node event")
		return fwk.Queue
	}
	gpuPod := fraction("gpu").Obj()
	if h := nodeHint(up, gpuPod, big); h != fwk.QueueSkip {
		t.Errorf("NodeResourcesFit's node hint for a GPU pod: %v; this test assumes its upstream behaviour, QueueSkip", h)
	}
	for _, tc := range []struct {
		pod  *v1.Pod
		node *v1.Node
		want fwk.QueueingHint
	}{
		{gpuPod, big, fwk.Queue},
		{gpuPod, small, fwk.QueueSkip},
		{testPods()["CPU pod"], big, nodeHint(up, testPods()["CPU pod"], big)},
		{testPods()["CPU pod"], small, nodeHint(up, testPods()["CPU pod"], small)},
	} {
		if h := nodeHint(w, tc.pod, tc.node); h != tc.want {
			t.Errorf("%s on node %s: hint %v, want %v", tc.pod.Name, tc.node.Name, h, tc.want)
		}
	}
	if _, ok := gpuPod.Spec.Containers[0].Resources.Limits[gpu]; !ok {
		t.Error("the hint changed the pod")
	}
}

// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34

package gpushare

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// draClasses is a DRA manager whose DeviceClass resolver maps extended resource names
// to classes (the rest of the manager is not used by TesseraGPUShare).
type draClasses struct {
	fwk.SharedDRAManager
	byName map[v1.ResourceName]*resourceapi.DeviceClass
}

func (d draClasses) DeviceClassResolver() fwk.DeviceClassResolver { return d }

func (d draClasses) GetDeviceClass(name v1.ResourceName) *resourceapi.DeviceClass {
	return d.byName[name]
}

// wholeGPUClass is a DeviceClass that serves tessera.dev/gpu through DRA.
var wholeGPUClass = &resourceapi.DeviceClass{
	ObjectMeta: metav1.ObjectMeta{Name: "whole-gpu.tessera.dev"},
	Spec:       resourceapi.DeviceClassSpec{ExtendedResourceName: new("tessera.dev/gpu")},
}

// A pod that asks only whole GPUs passes a node in DRA mode when a DeviceClass serves
// tessera.dev/gpu there (the in-tree DRA plugin allocates it devices of the class);
// Reserve leaves it to DRA (no grant in the cache), PreBind and Bind have nothing to
// do, Unreserve forgets it. A share, a selection or a missing class keep the node
// refused, with the reason saying what to do.
func TestWholeGPUsDelegatedToDRA(t *testing.T) {
	inv := pcieInventory("dra", 4, "Tesla T4", t4Mem)
	inv.DRA = true
	nodes := []*v1.Node{t4(t, "plugin"), makeNode(t, "dra", inv)}
	classes := draClasses{byName: map[v1.ResourceName]*resourceapi.DeviceClass{"tessera.dev/gpu": wholeGPUClass}}
	whole := func(name string, ann map[string]string) *v1.Pod { return makePod(name, ann, ctr{Name: "c", GPU: "2"}) }

	e := newEnv(t, nil, nodes)
	e.pl.handle.(*fakeHandle).dra = classes
	pod := whole("whole", nil)
	r := e.cycle(pod)
	if got := strings.Join(r.feasible, ","); got != "plugin,dra" {
		t.Fatalf("feasible %q, want plugin,dra (filter: %v)", got, r.filter)
	}
	if r.scores["dra"] != 0 {
		t.Errorf("score on the DRA node %d, want 0 (its GPUs are DRA's to score)", r.scores["dra"])
	}
	ctx := context.Background()
	if st := e.pl.Reserve(ctx, r.state, pod, "dra"); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	if got := e.pl.cache.PodGrants(pod.UID, "dra"); len(got) != 0 {
		t.Errorf("the cache holds %v for the pod on the DRA node, want nothing", got)
	}
	if skip, st := e.pl.preBindSkips(ctx, r.state); !skip || !st.IsSuccess() {
		t.Errorf("PreBind skips %v (%v), want true", skip, st)
	}
	if st := e.pl.PreBind(ctx, r.state, pod, "dra"); !st.IsSuccess() {
		t.Errorf("PreBind: %v", st)
	}
	if st := e.pl.Bind(ctx, r.state, pod, "dra"); !st.IsSkip() {
		t.Errorf("Bind: %v, want Skip (the default binder binds it)", st)
	}
	e.pl.Unreserve(ctx, r.state, pod, "dra")
	if s, _ := getState(r.state); s.delegated != "" {
		t.Errorf("Unreserve left delegated=%q", s.delegated)
	}

	for _, tc := range []struct {
		name    string
		pod     *v1.Pod
		classes fwk.SharedDRAManager
	}{
		{"share", makePod("share", nil, ctr{Name: "c", GPU: "1", Mem: "4096"}), classes},
		{"cores", makePod("cores", nil, ctr{Name: "c", GPU: "1", Cores: "50"}), classes},
		{"model", whole("model", map[string]string{"tessera.dev/gpu-model-include": "T4"}), classes},
		{"no class", whole("noclass", nil), draClasses{}},
		{"no DRA manager", whole("nomanager", nil), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil, nodes)
			e.pl.handle.(*fakeHandle).dra = tc.classes
			r := e.cycle(tc.pod)
			if !r.pre.IsSuccess() {
				t.Fatalf("PreFilter: %v", r.pre)
			}
			st := r.filter["dra"]
			if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "extendedResourceName") {
				t.Errorf("DRA node: %v %q, want refused, naming extendedResourceName", st.Code(), st.Message())
			}
		})
	}
}

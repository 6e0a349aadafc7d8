// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
)

// reserveOn runs a scheduling cycle for pod (created in the fake API) and Reserve on
// the best node; it returns the cycle state and the node.
func (e *env) reserveOn(pod *v1.Pod) (fwk.CycleState, string) {
	e.t.Helper()
	e.addPendingPod(pod)
	r := e.cycle(pod)
	if r.best == "" {
		e.t.Fatalf("no feasible node for %s: %v", pod.Name, r.filter)
	}
	if st := e.pl.Reserve(context.Background(), r.state, pod, r.best); !st.IsSuccess() {
		e.t.Fatalf("Reserve: %v", st)
	}
	return r.state, r.best
}

// writes lists the fake API's writes since the last ClearActions, as verb/subresource.
func (e *env) writes() []string {
	var out []string
	for _, a := range e.client.Actions() {
		if a.GetVerb() == "get" || a.GetVerb() == "list" || a.GetVerb() == "watch" {
			continue
		}
		out = append(out, a.GetVerb()+" "+a.GetResource().Resource+"/"+a.GetSubresource())
	}
	return out
}

func (e *env) pod(name string) *v1.Pod {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods("default").Get(context.Background(), name, metav1GetOpts)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func TestBindWritesOneBindingWithTheAssignment(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{t4(t, "n")})
	pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "2048", Cores: "25"})
	cs, node := e.reserveOn(pod)
	ctx := context.Background()
	e.client.ClearActions()
	// Nothing for PreBind to do, so the scheduler writes no nominatedNodeName either.
	if _, st := e.pl.PreBindPreFlight(ctx, cs, pod, node); !st.IsSkip() {
		t.Fatalf("PreBindPreFlight = %v, want Skip", st)
	}
	if st := e.pl.PreBind(ctx, cs, pod, node); !st.IsSuccess() {
		t.Fatalf("PreBind = %v", st)
	}
	if st := e.pl.Bind(ctx, cs, pod, node); !st.IsSuccess() {
		t.Fatalf("Bind = %v", st)
	}
	if w := e.writes(); len(w) != 1 || w[0] != "create pods/binding" {
		t.Fatalf("API writes %v, want one binding", w)
	}
	got := e.pod("p")
	if got.Spec.NodeName != node {
		t.Errorf("pod bound to %q, want %q", got.Spec.NodeName, node)
	}
	if idx := placed(t, got.Annotations[api.AnnotationAssignment]); len(idx["c"]) != 1 {
		t.Errorf("assignment %v", idx)
	}
	// The binding names the pod's UID: the API server refuses it for a namesake.
	b := e.client.Actions()[0]
	if !strings.Contains(b.GetSubresource(), "binding") {
		t.Fatalf("action %v", b)
	}
}

func TestBindSkipsPodsWithoutGPUs(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{t4(t, "n")})
	pod := makePod("cpu", nil)
	pod.Spec.Containers = []v1.Container{{Name: "c", Image: "x"}}
	e.addPendingPod(pod)
	cs := e.cycle(pod).state
	e.client.ClearActions()
	if st := e.pl.Bind(context.Background(), cs, pod, "n"); !st.IsSkip() {
		t.Fatalf("Bind = %v, want Skip so that DefaultBinder binds", st)
	}
	if w := e.writes(); len(w) != 0 {
		t.Fatalf("API writes %v for a pod without GPUs", w)
	}
}

func TestBindErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("no reservation", func(t *testing.T) {
		e := newEnv(t, nil, []*v1.Node{t4(t, "n")})
		pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "2048"})
		e.addPendingPod(pod)
		cs := e.cycle(pod).state
		if st := e.pl.Bind(ctx, cs, pod, "n"); st.IsSuccess() || st.IsSkip() {
			t.Fatalf("Bind without Reserve = %v, want an error", st)
		}
		if e.pod("p").Spec.NodeName != "" {
			t.Fatal("pod bound without an assignment")
		}
	})
	t.Run("another node", func(t *testing.T) {
		e := newEnv(t, nil, []*v1.Node{t4(t, "n")})
		pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "2048"})
		cs, _ := e.reserveOn(pod)
		if st := e.pl.Bind(ctx, cs, pod, "elsewhere"); st.IsSuccess() || st.IsSkip() {
			t.Fatalf("Bind to a node other than the reserved one = %v", st)
		}
	})
	t.Run("already bound", func(t *testing.T) {
		e := newEnv(t, nil, []*v1.Node{t4(t, "n")})
		pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "2048"})
		cs, node := e.reserveOn(pod)
		// Someone else bound the pod meanwhile: the API server answers Conflict.
		other := e.pod("p")
		other.Spec.NodeName = "m"
		if _, err := e.client.CoreV1().Pods("default").Update(ctx, other, metav1UpdateOpts); err != nil {
			t.Fatal(err)
		}
		st := e.pl.Bind(ctx, cs, pod, node)
		if st.IsSuccess() || st.IsSkip() || !strings.Contains(st.Message(), "already assigned") {
			t.Fatalf("Bind of a bound pod = %v", st)
		}
		if _, has := e.pod("p").Annotations[api.AnnotationAssignment]; has {
			t.Fatal("a failed binding left an assignment on the pod")
		}
		// The framework then unreserves: the GPUs are free again.
		e.pl.Unreserve(ctx, cs, pod, node)
		if u, _ := e.pl.cache.NodeUsage(node); u[0].Tenants+u[1].Tenants != 0 {
			t.Fatalf("usage %+v after Unreserve", u)
		}
	})
	t.Run("re-created pod", func(t *testing.T) {
		e := newEnv(t, nil, []*v1.Node{t4(t, "n")})
		pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "2048"})
		cs, node := e.reserveOn(pod)
		if err := e.client.CoreV1().Pods("default").Delete(ctx, "p", metav1DeleteOpts); err != nil {
			t.Fatal(err)
		}
		again := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "2048"})
		again.UID = "uid-p-2"
		e.addPendingPod(again)
		if st := e.pl.Bind(ctx, cs, pod, node); st.IsSuccess() || st.IsSkip() {
			t.Fatalf("Bind onto a namesake = %v, want a conflict", st)
		}
		if got := e.pod("p"); got.Spec.NodeName != "" || got.Annotations[api.AnnotationAssignment] != "" {
			t.Fatal("the namesake got the assignment")
		}
	})
}

func TestAssignmentWriteModes(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		args    *TesseraGPUShareArgs
		binders []string // nil: the handle does not list plugins
		binds   bool
	}{
		{"Binding, first binder", nil, []string{Name, "DefaultBinder"}, true},
		{"Binding, unlisted", nil, nil, true},
		{"Binding, after DefaultBinder", nil, []string{"DefaultBinder", Name}, false},
		{"PreBind", &TesseraGPUShareArgs{AssignmentWrite: WritePreBind}, []string{Name, "DefaultBinder"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.args, []*v1.Node{t4(t, "n")})
			if tc.binders != nil {
				e.pl.handle = &listingHandle{fakeHandle: e.pl.handle.(*fakeHandle), binders: tc.binders}
			}
			pod := makePod("p", nil, ctr{Name: "c", GPU: "1", Mem: "2048"})
			cs, node := e.reserveOn(pod)
			e.client.ClearActions()
			_, pre := e.pl.PreBindPreFlight(ctx, cs, pod, node)
			if pre.IsSkip() != tc.binds {
				t.Errorf("PreBindPreFlight = %v", pre)
			}
			if st := e.pl.PreBind(ctx, cs, pod, node); !st.IsSuccess() {
				t.Fatalf("PreBind = %v", st)
			}
			st := e.pl.Bind(ctx, cs, pod, node)
			want := []string{"create pods/binding"}
			if tc.binds && !st.IsSuccess() || !tc.binds && !st.IsSkip() {
				t.Fatalf("Bind = %v", st)
			}
			if !tc.binds {
				want = []string{"patch pods/"}
			}
			if w := e.writes(); strings.Join(w, ",") != strings.Join(want, ",") {
				t.Fatalf("API writes %v, want %v", w, want)
			}
			if _, has := e.pod("p").Annotations[api.AnnotationAssignment]; !has {
				t.Fatal("no assignment annotation on the pod")
			}
		})
	}
}

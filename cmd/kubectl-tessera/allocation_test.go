// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	allocationv1alpha1 "github.com/tessera-dev/tessera/api/allocation/v1alpha1"
	"github.com/tessera-dev/tessera/test/fixtures"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func gpuNode(t *testing.T, name string, inv *api.NodeInventory, ready bool) v1.Node {
	t.Helper()
	inv.UpdatedAt = now.Add(-3 * time.Second)
	raw, err := api.EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	st := v1.ConditionFalse
	if ready {
		st = v1.ConditionTrue
	}
	return v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{api.AnnotationInventory: raw}},
		Status:     v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: st}}},
	}
}

// boundPod is a pod bound to node holding memMiB and cores on each of the GPUs.
func boundPod(t *testing.T, name, node string, memMiB int64, cores int, gpus ...int) v1.Pod {
	t.Helper()
	a := &api.PodAssignment{Version: api.AssignmentVersion, Node: node, Containers: []api.ContainerAssignment{{Name: "main"}}}
	for _, i := range gpus {
		a.Containers[0].Devices = append(a.Containers[0].Devices, api.DeviceGrant{UUID: fixtures.UUID(node, i), Index: i, MemoryMiB: memMiB, Cores: cores})
	}
	raw, err := api.EncodeAssignment(a)
	if err != nil {
		t.Fatal(err)
	}
	p := gpuRequest(name, len(gpus), memMiB, cores)
	p.Spec.NodeName = node
	p.Annotations = map[string]string{api.AnnotationAssignment: raw}
	p.Status.Phase = v1.PodRunning
	return p
}

func gpuRequest(name string, gpus int, memMiB int64, cores int) v1.Pod {
	limits := v1.ResourceList{"tessera.dev/gpu": *resource.NewQuantity(int64(gpus), resource.DecimalSI)}
	if memMiB > 0 {
		limits["tessera.dev/gpu-memory"] = *resource.NewQuantity(memMiB, resource.DecimalSI)
	}
	if cores > 0 {
		limits["tessera.dev/gpu-cores"] = *resource.NewQuantity(int64(cores), resource.DecimalSI)
	}
	return v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{SchedulerName: "tessera-binpack", Containers: []v1.Container{{Name: "main",
			Resources: v1.ResourceRequirements{Limits: limits}}}},
		Status: v1.PodStatus{Phase: v1.PodPending},
	}
}

func unschedulable(p v1.Pod, msg string) v1.Pod {
	p.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: "Unschedulable", Message: msg}}
	return p
}

// fixtureState is a cluster of an H100 node, a T4 node and a node without GPUs, with
// pods in every state the view distinguishes.
func fixtureState(t *testing.T) *state {
	t.Helper()
	finished := boundPod(t, "finished", "h100", 1000, 0, 3)
	finished.Status.Phase = v1.PodSucceeded
	wrongNode := boundPod(t, "wrong-node", "t4", 1000, 0, 0)
	wrongNode.Spec.NodeName = "h100"
	invalid := gpuRequest("bad", 1, 0, 150)
	eventOnly := gpuRequest("event-only", 1, 1024, 0)
	st := &state{
		nodes: []v1.Node{
			gpuNode(t, "t4", fixtures.PCIeNode("t4", 4, "Tesla T4", fixtures.T4MiB), true),
			gpuNode(t, "h100", fixtures.NVLinkNode("h100", 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB), true),
			{ObjectMeta: metav1.ObjectMeta{Name: "cpu-only"}},
		},
		pods: []v1.Pod{
			boundPod(t, "infer-a", "h100", 16384, 20, 0),
			boundPod(t, "infer-b", "h100", 16384, 30, 0),
			boundPod(t, "train", "h100", fixtures.H100MiB, 100, 4, 5, 6, 7),
			finished,
			wrongNode,
			unschedulable(gpuRequest("too-big", 8, 0, 100), "0/2 nodes are available: no NVLink"),
			unschedulable(invalid, `container "main": tessera.dev/gpu-cores: must be a whole percent`),
			eventOnly,
			gpuRequest("unseen", 1, 1024, 0),
		},
		events: []v1.Event{
			{InvolvedObject: v1.ObjectReference{Kind: "Pod", UID: "uid-event-only"}, Reason: "FailedScheduling", Message: "older", LastTimestamp: metav1.NewTime(now.Add(-time.Minute))},
			{InvolvedObject: v1.ObjectReference{Kind: "Pod", UID: "uid-event-only"}, Reason: "FailedScheduling", Message: "newest", LastTimestamp: metav1.NewTime(now)},
		},
	}
	return st
}

var update = flag.Bool("update", false, "rewrite testdata/ from the output")

func TestBuildView(t *testing.T) {
	list := buildView(fixtureState(t), api.DefaultResourceNames(), now, time.Minute, nil, "")

	if list.APIVersion != "allocation.tessera.dev/v1alpha1" || list.Kind != "AllocationList" {
		t.Errorf("type: %+v", list.TypeMeta)
	}
	if len(list.Items) != 2 || list.Items[0].Name != "h100" || list.Items[1].Name != "t4" {
		t.Fatalf("nodes: %+v", list.Items)
	}
	if strings.Join(list.NodesWithoutInventory, ",") != "cpu-only" {
		t.Errorf("nodes without inventory: %v", list.NodesWithoutInventory)
	}
	h := list.Items[0]
	if strings.Join(h.NVLinkIslands, " ") != "0-3 4-7" {
		t.Errorf("islands: %v", h.NVLinkIslands)
	}
	if !h.Inventory.UpdatedAt.Time.Equal(now.Add(-3*time.Second)) || h.Inventory.Stale {
		t.Errorf("inventory: %+v", h.Inventory)
	}
	// GPU 0: two fractions add up; GPU 3: the finished pod holds nothing.
	if u := h.GPUs[0]; u.MemoryGrantedMiB != 32768 || u.CoresGranted != 50 || len(u.Grants) != 2 {
		t.Errorf("GPU 0: %+v", u)
	}
	if g := h.GPUs[0].Grants[0]; g.Namespace != "default" || g.Pod != "infer-a" || g.Container != "main" || g.MemoryMiB != 16384 || g.Cores != 20 {
		t.Errorf("GPU 0's first grant: %+v", g)
	}
	if u := h.GPUs[3]; u.MemoryGrantedMiB != 0 || len(u.Grants) != 0 {
		t.Errorf("GPU 3 holds a finished pod: %+v", u)
	}
	for i := 4; i < 8; i++ {
		if u := h.GPUs[i]; u.MemoryGrantedMiB != fixtures.H100MiB || u.CoresGranted != 100 || strings.Join(u.Grants[0].GPUs, ",") != "4,5,6,7" {
			t.Errorf("GPU %d: %+v", i, u)
		}
	}
	// 5 of 12 GPUs; 2×16384 + 4×81559 MiB of 8×81559 + 4×15360; 20+30+4×100 percent.
	want := allocationv1alpha1.Summary{GPUs: 12, GPUsHoldingPods: 5, MemoryMiB: 713912, MemoryGrantedMiB: 359004, CoresGranted: 450}
	if list.Summary != want {
		t.Errorf("summary: got %+v, want %+v", list.Summary, want)
	}
	if len(list.Problems) != 1 || !strings.Contains(list.Problems[0], "wrong-node") {
		t.Errorf("problems: %v", list.Problems)
	}
	reasons := map[string]allocationv1alpha1.PendingPod{}
	for _, p := range list.PendingPods {
		reasons[p.Name] = p
	}
	if len(reasons) != 4 {
		t.Fatalf("pending: %+v", list.PendingPods)
	}
	if p := reasons["too-big"]; p.Reason != "0/2 nodes are available: no NVLink" || p.Request != "8 GPU × all memory, 100% cores" || p.SchedulerName != "tessera-binpack" {
		t.Errorf("too-big: %+v", p)
	}
	if p := reasons["bad"]; p.Request != "invalid request" || !strings.Contains(p.Reason, "gpu-cores") {
		t.Errorf("bad: %+v", p)
	}
	if p := reasons["event-only"]; p.Reason != "newest" {
		t.Errorf("event-only: want the newest FailedScheduling event, got %+v", p)
	}
	if p := reasons["unseen"]; !strings.Contains(p.Reason, `"tessera-binpack"`) {
		t.Errorf("unseen: %+v", p)
	}
}

// TestTableUnchanged holds the default table to testdata/allocation.txt, which the
// table printed before the view became an AllocationList; -update rewrites it.
func TestTableUnchanged(t *testing.T) {
	list := buildView(fixtureState(t), api.DefaultResourceNames(), now, time.Minute, nil, "")
	var out bytes.Buffer
	renderTable(list, now, false, &out)
	golden := filepath.Join("testdata", "allocation.txt")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Errorf("table differs from %s:\n%s", golden, out.String())
	}
}

func TestStaleAndUnhealthy(t *testing.T) {
	inv := fixtures.PCIeNode("t4", 2, "Tesla T4", fixtures.T4MiB)
	inv.GPUs[1].Healthy, inv.GPUs[1].HealthReason = false, "XID 79"
	n := gpuNode(t, "t4", inv, false)
	later := now.Add(10 * time.Minute)
	list := buildView(&state{nodes: []v1.Node{n}}, api.DefaultResourceNames(), later, 5*time.Minute, nil, "")
	if !list.Items[0].Inventory.Stale || list.Items[0].GPUs[1].Healthy || list.Items[0].GPUs[1].HealthReason != "XID 79" {
		t.Errorf("node: %+v", list.Items[0])
	}
	var out bytes.Buffer
	renderTable(list, later, false, &out)
	for _, want := range []string{"NotReady", "STALE inventory (10m3s old)", "UNHEALTHY (XID 79)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestUnsettled(t *testing.T) {
	names := api.DefaultResourceNames()
	ready := gpuNode(t, "a", fixtures.PCIeNode("a", 1, "Tesla T4", fixtures.T4MiB), true)
	bare := v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: ready.Status}
	placed := boundPod(t, "placed", "a", 100, 0, 0)
	refused := unschedulable(gpuRequest("refused", 1, 100, 0), "no")
	cpu := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "default"}}
	for _, tc := range []struct {
		name  string
		nodes []v1.Node
		pods  []v1.Pod
		want  map[string]bool
		say   string
	}{
		{"settled", []v1.Node{ready, bare}, []v1.Pod{placed, refused, cpu}, map[string]bool{"a": true}, ""},
		{"node without inventory", []v1.Node{ready, bare}, nil, map[string]bool{"a": true, "b": true}, "nodes without a GPU inventory (1): b"},
		{"missing node", []v1.Node{ready}, nil, map[string]bool{"c": true}, "nodes that do not exist (1): c"},
		{"pod not yet seen", []v1.Node{ready}, []v1.Pod{gpuRequest("new", 1, 100, 0)}, nil, "GPU pods not yet placed or refused (1): new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := unsettled(tc.nodes, tc.pods, tc.want, names); got != tc.say {
				t.Errorf("got %q, want %q", got, tc.say)
			}
		})
	}
}

func TestMIGUnits(t *testing.T) {
	inv := fixtures.NVLinkNode("a100", 2, 2, "NVIDIA A100-SXM4-80GB", fixtures.A100MiB)
	inv.GPUs[0].MIG = &api.MIG{Instances: []api.MIGInstance{
		{UUID: "MIG-a", Profile: "1g.10gb", MemoryMiB: 9728},
		{UUID: "MIG-b", Profile: "1g.10gb", MemoryMiB: 9728},
	}}
	a := &api.PodAssignment{Version: api.AssignmentVersion, Node: "a100", Containers: []api.ContainerAssignment{{Name: "main", Devices: []api.DeviceGrant{
		{UUID: "MIG-b", Index: 0, MemoryMiB: 9728}, {UUID: fixtures.UUID("a100", 1), Index: 1, MemoryMiB: 9728},
	}}}}
	raw, err := api.EncodeAssignment(a)
	if err != nil {
		t.Fatal(err)
	}
	p := gpuRequest("two", 2, 9728, 0)
	p.Spec.NodeName, p.Status.Phase = "a100", v1.PodRunning
	p.Annotations = map[string]string{api.AnnotationAssignment: raw}
	list := buildView(&state{nodes: []v1.Node{gpuNode(t, "a100", inv, true)}, pods: []v1.Pod{p}}, api.DefaultResourceNames(), now, time.Minute, nil, "")
	if u := list.Items[0].GPUs[1]; u.ID != "0/1g.10gb#1" || u.Index != 0 || u.MIGProfile != "1g.10gb" || u.UUID != "MIG-b" {
		t.Errorf("MIG instance: %+v", u)
	}
	var out bytes.Buffer
	renderTable(list, now, false, &out)
	for _, want := range []string{
		"NODE a100  2 x NVIDIA A100-SXM4-80GB",
		"0/1g.10gb#0  0/9728",
		"0/1g.10gb#1  9728/9728",
		"two (9728 MiB, GPUs 0/1g.10gb#1,1)",
		"GPUs and MIG instances holding pods: 2 of 3",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

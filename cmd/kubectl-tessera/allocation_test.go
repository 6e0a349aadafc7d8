package main

import (
	"bytes"
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

func TestBuildView(t *testing.T) {
	finished := boundPod(t, "finished", "h100", 1000, 0, 3)
	finished.Status.Phase = v1.PodSucceeded
	wrongNode := boundPod(t, "wrong-node", "t4", 1000, 0, 0)
	wrongNode.Spec.NodeName = "h100"
	invalid := gpuRequest("bad", 1, 0, 150)
	eventOnly := gpuRequest("event-only", 1, 100, 0)
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
			gpuRequest("unseen", 1, 100, 0),
		},
		events: []v1.Event{
			{InvolvedObject: v1.ObjectReference{Kind: "Pod", UID: "uid-event-only"}, Reason: "FailedScheduling", Message: "older", LastTimestamp: metav1.NewTime(now.Add(-time.Minute))},
			{InvolvedObject: v1.ObjectReference{Kind: "Pod", UID: "uid-event-only"}, Reason: "FailedScheduling", Message: "newest", LastTimestamp: metav1.NewTime(now)},
		},
	}
	v := buildView(st, api.DefaultResourceNames(), now, time.Minute, nil)

	if len(v.nodes) != 2 || v.nodes[0].name != "h100" || v.nodes[1].name != "t4" {
		t.Fatalf("nodes: %+v", v.nodes)
	}
	if strings.Join(v.noInventory, ",") != "cpu-only" {
		t.Errorf("nodes without inventory: %v", v.noInventory)
	}
	h := v.nodes[0]
	if strings.Join(h.islands, " ") != "0-3 4-7" {
		t.Errorf("islands: %v", h.islands)
	}
	// GPU 0: two fractions add up; GPU 3: the finished pod holds nothing.
	if u := h.units[0]; u.usedMiB != 32768 || u.cores != 50 || len(u.grants) != 2 {
		t.Errorf("GPU 0: %+v", u)
	}
	if u := h.units[3]; u.usedMiB != 0 || len(u.grants) != 0 {
		t.Errorf("GPU 3 holds a finished pod: %+v", u)
	}
	for i := 4; i < 8; i++ {
		if u := h.units[i]; u.usedMiB != fixtures.H100MiB || u.cores != 100 || u.grants[0].siblings != "4,5,6,7" {
			t.Errorf("GPU %d: %+v", i, u)
		}
	}
	if len(v.problems) != 1 || !strings.Contains(v.problems[0], "wrong-node") {
		t.Errorf("problems: %v", v.problems)
	}
	reasons := map[string]pendingPod{}
	for _, p := range v.pending {
		reasons[p.name] = p
	}
	if len(reasons) != 4 {
		t.Fatalf("pending: %+v", v.pending)
	}
	if p := reasons["too-big"]; p.reason != "0/2 nodes are available: no NVLink" || p.request != "8 GPU × all memory, 100% cores" {
		t.Errorf("too-big: %+v", p)
	}
	if p := reasons["bad"]; p.request != "invalid request" || !strings.Contains(p.reason, "gpu-cores") {
		t.Errorf("bad: %+v", p)
	}
	if p := reasons["event-only"]; p.reason != "newest" {
		t.Errorf("event-only: want the newest FailedScheduling event, got %+v", p)
	}
	if p := reasons["unseen"]; !strings.Contains(p.reason, `"tessera-binpack"`) {
		t.Errorf("unseen: %+v", p)
	}

	var out bytes.Buffer
	v.render(&out)
	for _, want := range []string{
		"NODE h100  8 x NVIDIA H100 80GB HBM3, NVLink islands 0-3 | 4-7, Ready, inventory 3s old",
		"infer-a (16384 MiB, 20%), infer-b (16384 MiB, 30%)",
		"train (81559 MiB, 100%, GPUs 4,5,6,7)",
		"NODE t4  4 x Tesla T4, no NVLink, Ready",
		"Nodes without a GPU inventory (1): cpu-only",
		"GPUs holding pods: 5 of 12",
		"Pending GPU pods (4):",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestStaleAndUnhealthy(t *testing.T) {
	inv := fixtures.PCIeNode("t4", 2, "Tesla T4", fixtures.T4MiB)
	inv.GPUs[1].Healthy, inv.GPUs[1].HealthReason = false, "XID 79"
	n := gpuNode(t, "t4", inv, false)
	v := buildView(&state{nodes: []v1.Node{n}}, api.DefaultResourceNames(), now.Add(10*time.Minute), 5*time.Minute, nil)
	var out bytes.Buffer
	v.render(&out)
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

func TestReadObjects(t *testing.T) {
	f := filepath.Join(t.TempDir(), "objs.yaml")
	doc := `# comment
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: n1}}
- {apiVersion: v1, kind: Node, metadata: {name: n2}}
---
---
apiVersion: v1
kind: Pod
metadata: {name: p}
`
	if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := readObjects(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+"/"+o.GetName())
	}
	if strings.Join(got, " ") != "Node/n1 Node/n2 Pod/p" {
		t.Errorf("objects: %v", got)
	}
	if _, err := readObjects("-", strings.NewReader("metadata: {name: x}\n")); err == nil || !strings.Contains(err.Error(), "apiVersion and kind") {
		t.Errorf("a document without kind: err = %v", err)
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
	v := buildView(&state{nodes: []v1.Node{gpuNode(t, "a100", inv, true)}, pods: []v1.Pod{p}}, api.DefaultResourceNames(), now, time.Minute, nil)
	var out bytes.Buffer
	v.render(&out)
	for _, want := range []string{
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

func TestCommonFlagsBeforeCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	missing := filepath.Join(t.TempDir(), "no-such-kubeconfig")
	code := run(t.Context(), []string{"--kubeconfig", missing, "allocation"}, &stdout, &stderr)
	// The flag reached the command: it fails on that file, not on an unknown command.
	if code != 1 || !strings.Contains(stderr.String(), "no-such-kubeconfig") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

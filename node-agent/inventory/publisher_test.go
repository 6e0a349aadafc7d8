// SPDX-License-Identifier: Apache-2.0

package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
	"github.com/tessera-dev/tessera/node-agent/simsource"
)

type fakeSource struct {
	gpu.Source
	mu  sync.Mutex
	inv *api.NodeInventory
	err error
}

func (f *fakeSource) Inventory() (*api.NodeInventory, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	b, _ := json.Marshal(f.inv)
	var c api.NodeInventory
	_ = json.Unmarshal(b, &c)
	return &c, nil
}

func t4(t *testing.T, n int) *api.NodeInventory {
	t.Helper()
	inv, _, _, err := simsource.Parse([]byte("version: 1\ndriver: '580'\ngpus: [{model: Tesla T4, memoryMiB: 15360, smCount: 40, count: "+string(rune('0'+n))+"}]"), "n")
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func setup(t *testing.T, src gpu.Source) (*Publisher, *fake.Clientset, *clock, *record.FakeRecorder) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"keep": "me"}, Annotations: map[string]string{"other": "x"}}}
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}
	c := fake.NewClientset(node, other)
	clk := &clock{t: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)}
	rec := record.NewFakeRecorder(10)
	p := &Publisher{Client: c, NodeName: "n1", Source: src, Log: logr.Discard(), Heartbeat: 30 * time.Second, Now: clk.now, Recorder: rec}
	return p, c, clk, rec
}

func patches(c *fake.Clientset) []k8stesting.PatchAction {
	var out []k8stesting.PatchAction
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, p)
		}
	}
	return out
}

func TestPublishChangeAndHeartbeat(t *testing.T) {
	src := &fakeSource{inv: t4(t, 4)}
	p, c, clk, _ := setup(t, src)
	ctx := context.Background()
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	n, _ := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	inv, err := api.DecodeInventory(n.Annotations[api.AnnotationInventory])
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 4 || !inv.UpdatedAt.Equal(clk.t) {
		t.Errorf("published %d GPUs at %v", len(inv.GPUs), inv.UpdatedAt)
	}
	want := map[string]string{"keep": "me", api.LabelModel: "Tesla-T4", api.LabelCount: "4", api.LabelMemory: "15360"}
	for k, v := range want {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	if n.Annotations["other"] != "x" {
		t.Error("an unrelated annotation was lost")
	}

	// Nothing changed and the heartbeat is not due: no API call.
	clk.t = clk.t.Add(10 * time.Second)
	_ = p.Refresh(ctx)
	if len(patches(c)) != 1 {
		t.Fatalf("%d patches, want 1", len(patches(c)))
	}
	// A GPU turns unhealthy: published at once.
	src.mu.Lock()
	src.inv.GPUs[2].Healthy, src.inv.GPUs[2].HealthReason = false, "XID 79"
	src.mu.Unlock()
	_ = p.Refresh(ctx)
	if len(patches(c)) != 2 {
		t.Fatalf("%d patches after a change, want 2", len(patches(c)))
	}
	// Heartbeat due.
	clk.t = clk.t.Add(31 * time.Second)
	_ = p.Refresh(ctx)
	if len(patches(c)) != 3 {
		t.Fatalf("%d patches after the heartbeat, want 3", len(patches(c)))
	}
	n, _ = c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	inv, _ = api.DecodeInventory(n.Annotations[api.AnnotationInventory])
	if !inv.UpdatedAt.Equal(clk.t) || inv.GPUs[2].Healthy {
		t.Errorf("heartbeat inventory: %v %v", inv.UpdatedAt, inv.GPUs[2].Healthy)
	}
	// Only its own node was ever written.
	for _, a := range patches(c) {
		if a.GetName() != "n1" {
			t.Errorf("patched node %s", a.GetName())
		}
	}
	if n2, _ := c.CoreV1().Nodes().Get(ctx, "n2", metav1.GetOptions{}); len(n2.Annotations) != 0 {
		t.Error("another node was changed")
	}
}

// When the GPUs cannot be read the annotation is left to go stale (the scheduler then
// stops placing GPU pods there), with one event on the Node rather than one a tick.
func TestSourceErrorLeavesStale(t *testing.T) {
	src := &fakeSource{inv: t4(t, 2)}
	p, c, clk, rec := setup(t, src)
	ctx := context.Background()
	_ = p.Refresh(ctx)
	src.mu.Lock()
	src.err = errors.New("NVML GetUUID: ERROR_GPU_IS_LOST")
	src.mu.Unlock()
	for i := 0; i < 3; i++ {
		clk.t = clk.t.Add(time.Minute)
		if err := p.Refresh(ctx); err == nil {
			t.Fatal("no error")
		}
	}
	if len(patches(c)) != 1 {
		t.Errorf("%d patches, want only the first", len(patches(c)))
	}
	if len(rec.Events) != 1 {
		t.Fatalf("%d events, want 1", len(rec.Events))
	}
	if e := <-rec.Events; !strings.Contains(e, "GPUInventoryUnavailable") || !strings.Contains(e, "GPU_IS_LOST") {
		t.Errorf("event %q", e)
	}
}

func TestPublishFailureIsReported(t *testing.T) {
	p, c, _, rec := setup(t, &fakeSource{inv: t4(t, 1)})
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden")
	})
	if err := p.Refresh(context.Background()); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("error %v", err)
	}
	if e := <-rec.Events; !strings.Contains(e, "GPUInventoryPublishFailed") {
		t.Errorf("event %q", e)
	}
	if inv, _ := p.Last(); inv != nil {
		t.Error("a failed publication was recorded as published")
	}
}

func TestLabels(t *testing.T) {
	inv := t4(t, 2)
	inv.GPUs[1].Model = "NVIDIA A100-SXM4-80GB"
	inv.GPUs[1].MemoryMiB = 81920
	l := Labels(inv)
	if l[api.LabelModel] != "mixed" || l[api.LabelMemory] != "15360" || l[api.LabelCount] != "2" {
		t.Errorf("labels %v", l)
	}
	if got := LabelValue("  NVIDIA H100 80GB HBM3 (rev/2) "); got != "NVIDIA-H100-80GB-HBM3-rev-2" {
		t.Errorf("LabelValue = %q", got)
	}
	if got := LabelValue(strings.Repeat("x", 100)); len(got) != 63 {
		t.Errorf("LabelValue length %d", len(got))
	}
	empty := Labels(&api.NodeInventory{Version: 1})
	b, _ := Patch("{}", empty)
	if !strings.Contains(string(b), `"tessera.dev/gpu.count":null`) {
		t.Errorf("a node without GPUs keeps its labels: %s", b)
	}
}

func TestRunTrigger(t *testing.T) {
	src := &fakeSource{inv: t4(t, 1)}
	p, c, _, _ := setup(t, src)
	p.Now = nil
	p.Poll = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	waitFor(t, func() bool { return len(patches(c)) == 1 })
	src.mu.Lock()
	src.inv.GPUs[0].Healthy, src.inv.GPUs[0].HealthReason = false, "XID 48"
	src.mu.Unlock()
	p.Trigger()
	waitFor(t, func() bool { return len(patches(c)) == 2 })
	cancel()
	<-done
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// SPDX-License-Identifier: Apache-2.0

// Package inventory publishes the node's GPU inventory on its Node object: the
// inventory annotation and the model/count/memory labels of the wire contract. It
// patches only the Node named at start, and only those keys.
package inventory

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
	"github.com/tessera-dev/tessera/node-agent/health"
)

// Publisher keeps the Node's inventory annotation current.
type Publisher struct {
	Client   kubernetes.Interface
	NodeName string
	Source   gpu.Source
	Log      logr.Logger
	// Heartbeat is how often the inventory is re-confirmed when nothing changed; it
	// must be well under the scheduler's staleness limit.
	Heartbeat time.Duration
	// Poll is how often the source is read to detect changes.
	Poll time.Duration
	// Recorder, when set, gets an event on the Node when the inventory cannot be read
	// or published.
	Recorder record.EventRecorder
	// OnPublish is called after every successful publication.
	OnPublish func(inv *api.NodeInventory)
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	trigger chan struct{}
	once    sync.Once
	// progress records every completed poll, published or not, for the liveness probe.
	progress health.Progress

	mu          sync.Mutex
	published   *api.NodeInventory // last published, UpdatedAt included
	lastErr     string
	publishedAt time.Time
}

func (p *Publisher) init() {
	p.once.Do(func() { p.trigger = make(chan struct{}, 1) })
}

func (p *Publisher) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Trigger asks for a refresh now, e.g. after a health event.
func (p *Publisher) Trigger() {
	p.init()
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// Last returns the last published inventory and when it was published.
func (p *Publisher) Last() (*api.NodeInventory, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.published, p.publishedAt
}

// Progress reports the poll loop's passes: a pass that read the source and, when due,
// published counts with a nil error; one that failed counts with its error.
func (p *Publisher) Progress() *health.Progress { return &p.progress }

// Run refreshes on every poll tick and trigger until ctx is done.
func (p *Publisher) Run(ctx context.Context) {
	p.init()
	poll := p.Poll
	if poll <= 0 {
		poll = 10 * time.Second
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	// A failure that repeats every poll (say, the Node object does not exist yet) is
	// logged as an error once, then at V(1) until it changes or clears.
	lastErr := ""
	p.progress.Start(p.now())
	for {
		err := p.Refresh(ctx)
		p.progress.Pass(p.now(), err)
		if err != nil {
			if msg := err.Error(); msg != lastErr {
				p.Log.Error(err, "GPU inventory not published; the node's inventory will go stale")
				lastErr = msg
			} else {
				p.Log.V(1).Info("GPU inventory still not published", "err", msg)
			}
		} else if lastErr != "" {
			p.Log.Info("GPU inventory published again after failures")
			lastErr = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.trigger:
		}
	}
}

// Refresh reads the source and publishes when the inventory changed or the heartbeat
// is due.
func (p *Publisher) Refresh(ctx context.Context) error {
	inv, err := p.Source.Inventory()
	if err != nil {
		p.event(corev1.EventTypeWarning, "GPUInventoryUnavailable", "cannot read the node's GPUs: %v", err)
		return fmt.Errorf("reading GPUs: %w", err)
	}
	now := p.now()
	p.mu.Lock()
	prev, prevAt := p.published, p.publishedAt
	p.mu.Unlock()
	hb := p.Heartbeat
	if hb <= 0 {
		hb = 30 * time.Second
	}
	if prev != nil && sameGPUs(prev, inv) && now.Sub(prevAt) < hb {
		return nil
	}
	inv.UpdatedAt = metav1.NewTime(now).Rfc3339Copy().Time.UTC()
	if err := p.publish(ctx, inv); err != nil {
		p.event(corev1.EventTypeWarning, "GPUInventoryPublishFailed", "cannot publish the GPU inventory: %v", err)
		return err
	}
	if prev == nil || !sameGPUs(prev, inv) {
		p.Log.Info("GPU inventory published", "gpus", len(inv.GPUs), "healthy", healthy(inv), "driver", inv.Driver)
	} else {
		p.Log.V(1).Info("GPU inventory heartbeat", "gpus", len(inv.GPUs))
	}
	p.mu.Lock()
	p.published, p.publishedAt, p.lastErr = inv, now, ""
	p.mu.Unlock()
	if p.OnPublish != nil {
		p.OnPublish(inv)
	}
	return nil
}

func (p *Publisher) publish(ctx context.Context, inv *api.NodeInventory) error {
	value, err := api.EncodeInventory(inv)
	if err != nil {
		return err
	}
	patch, err := Patch(value, Labels(inv))
	if err != nil {
		return err
	}
	// A JSON merge patch touches only the keys named: other annotations and labels,
	// whoever owns them, are left alone, and no read-modify-write race exists.
	_, err = p.Client.CoreV1().Nodes().Patch(ctx, p.NodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "tessera-node-agent"})
	if err != nil {
		return fmt.Errorf("patching node %s: %w", p.NodeName, err)
	}
	return nil
}

// Patch builds the merge patch that sets the annotation and the labels; a label with
// an empty value is removed.
func Patch(annotation string, labels map[string]string) ([]byte, error) {
	l := map[string]any{}
	for k, v := range labels {
		if v == "" {
			l[k] = nil
		} else {
			l[k] = v
		}
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]any{api.AnnotationInventory: annotation},
		"labels":      l,
	}})
}

func (p *Publisher) event(kind, reason, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.mu.Lock()
	repeat := p.lastErr == msg
	p.lastErr = msg
	p.mu.Unlock()
	if p.Recorder == nil || repeat {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Node", Name: p.NodeName, UID: types.UID(p.NodeName)}
	p.Recorder.Event(ref, kind, reason, msg)
}

func sameGPUs(a, b *api.NodeInventory) bool {
	return a.Driver == b.Driver && reflect.DeepEqual(a.GPUs, b.GPUs)
}

func healthy(inv *api.NodeInventory) int {
	n := 0
	for _, g := range inv.GPUs {
		if g.Healthy {
			n++
		}
	}
	return n
}

var labelUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// LabelValue turns a GPU model name into a label value: "NVIDIA H100 80GB HBM3" becomes
// "NVIDIA-H100-80GB-HBM3".
func LabelValue(s string) string {
	v := labelUnsafe.ReplaceAllString(strings.TrimSpace(s), "-")
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.Trim(v, "-_.")
}

// Labels returns the model, count and memory labels. A node with GPUs of several
// models is labelled "mixed"; the memory label is the smallest GPU's, so that an
// affinity on it holds for every GPU. A node without GPUs loses the labels.
func Labels(inv *api.NodeInventory) map[string]string {
	l := map[string]string{api.LabelModel: "", api.LabelCount: "", api.LabelMemory: ""}
	if len(inv.GPUs) == 0 {
		return l
	}
	model := inv.GPUs[0].Model
	mem := inv.GPUs[0].MemoryMiB
	for _, g := range inv.GPUs[1:] {
		if g.Model != model {
			model = "mixed"
		}
		if g.MemoryMiB < mem {
			mem = g.MemoryMiB
		}
	}
	l[api.LabelModel] = LabelValue(model)
	l[api.LabelCount] = strconv.Itoa(len(inv.GPUs))
	l[api.LabelMemory] = strconv.FormatInt(mem, 10)
	return l
}

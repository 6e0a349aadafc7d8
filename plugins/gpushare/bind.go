// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// bindMode decides, once per profile, whether this plugin binds GPU pods itself.
type bindMode struct {
	once  sync.Once
	binds bool
}

// bindsPods reports whether the assignment travels in the binding: the profile asks
// for it (assignmentWrite: Binding) and the plugin is the profile's first Bind plugin.
// Otherwise another binder would bind the pod without its assignment, so the plugin
// falls back to the PreBind patch and says so once in the log.
func (pl *Plugin) bindsPods(ctx context.Context) bool {
	pl.bind.once.Do(func() {
		if pl.args.AssignmentWrite != WriteBinding {
			return
		}
		first, known := pl.firstBinder()
		pl.bind.binds = !known || first == Name
		if !pl.bind.binds {
			klog.FromContext(ctx).Info("TesseraGPUShare is not the profile's first Bind plugin; writing GPU assignments in PreBind instead of the binding (list TesseraGPUShare before DefaultBinder under plugins.bind.enabled, or set assignmentWrite: PreBind)",
				"plugin", Name, "firstBindPlugin", first)
		}
	})
	return pl.bind.binds
}

// firstBinder names the profile's first Bind plugin; known is false when the
// framework does not say (a bare handle in tools and tests).
func (pl *Plugin) firstBinder() (name string, known bool) {
	l, ok := pl.handle.(interface{ ListPlugins() *config.Plugins })
	if !ok {
		return "", false
	}
	ps := l.ListPlugins()
	if ps == nil || len(ps.Bind.Enabled) == 0 {
		return "", true
	}
	return ps.Bind.Enabled[0].Name, true
}

// Bind binds a GPU pod with its assignment annotation in the binding: the API server
// sets the pod's node and merges the annotation in one update, so no one ever sees the
// pod bound without its GPUs or annotated but unbound. Pods without GPU requests, and
// every pod when the assignment is written in PreBind, are left to the next binder.
func (pl *Plugin) Bind(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s, err := getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.skip || s.delegated == nodeName || !pl.bindsPods(ctx) {
		return fwk.NewStatus(fwk.Skip)
	}
	binding, err := assignmentBinding(pod, s.assignment, nodeName)
	if err != nil {
		return fwk.AsStatus(err)
	}
	// A failed binding is not retried here: the framework unreserves the GPUs and
	// the pod goes back to the queue. The binding's UID is a precondition, so a pod
	// deleted and re-created under the same name is never given this assignment.
	if c := pl.handle.APICacher(); c != nil {
		onFinish, err := c.BindPod(binding)
		if err == nil {
			err = c.WaitOnFinish(ctx, onFinish)
		}
		if err != nil {
			return fwk.AsStatus(fmt.Errorf("binding pod %s/%s with its GPU assignment: %w", pod.Namespace, pod.Name, err))
		}
	} else if err := pl.handle.ClientSet().CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fwk.AsStatus(fmt.Errorf("binding pod %s/%s with its GPU assignment: %w", pod.Namespace, pod.Name, err))
	}
	klog.FromContext(ctx).V(3).Info("Bound pod with its GPU assignment", "pod", klog.KObj(pod), "node", klog.KRef("", nodeName))
	return nil
}

// assignmentBinding is the binding of pod to nodeName carrying the assignment.
func assignmentBinding(pod *v1.Pod, a *api.PodAssignment, nodeName string) (*v1.Binding, error) {
	if a == nil || a.Node != nodeName {
		return nil, fmt.Errorf("no GPU assignment reserved for node %q", nodeName)
	}
	value, err := api.EncodeAssignment(a)
	if err != nil {
		return nil, err
	}
	return &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   pod.Namespace,
			Name:        pod.Name,
			UID:         pod.UID,
			Annotations: map[string]string{api.AnnotationAssignment: value},
		},
		Target: v1.ObjectReference{Kind: "Node", Name: nodeName},
	}, nil
}

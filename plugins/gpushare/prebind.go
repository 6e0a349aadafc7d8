// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// preBindSkips reports whether PreBind has nothing to do for the pod: it requests no
// GPU, or the assignment travels in the binding (Bind). PreBindPreFlight (in
// preflight*.go, whose signature differs between Kubernetes minors) then returns Skip,
// so that the pod binds without waiting on this plugin and the scheduler, having no
// PreBind work to announce, writes no nominatedNodeName.
func (pl *Plugin) preBindSkips(ctx context.Context, cs fwk.CycleState) (bool, *fwk.Status) {
	s, err := getState(cs)
	if err != nil {
		return false, fwk.AsStatus(err)
	}
	return s.skip || s.delegated != "" || pl.bindsPods(ctx), nil
}

// PreBind merge-patches the assignment annotation onto the pod when the profile writes
// it in PreBind (assignmentWrite: PreBind, or the plugin is not the first binder);
// otherwise Bind carries it and PreBind has nothing to do. A failure makes the
// framework call Unreserve.
func (pl *Plugin) PreBind(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s, err := getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if s.skip || s.delegated == nodeName || pl.bindsPods(ctx) {
		return nil
	}
	if s.assignment == nil || s.assignment.Node != nodeName {
		return fwk.AsStatus(fmt.Errorf("no GPU assignment reserved for node %q", nodeName))
	}
	value, err := api.EncodeAssignment(s.assignment)
	if err != nil {
		return fwk.AsStatus(err)
	}
	// The UID in the patch is a precondition: a pod deleted and re-created under the
	// same name is never given another pod's assignment.
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"uid":         pod.UID,
			"annotations": map[string]string{api.AnnotationAssignment: value},
		},
	})
	if err != nil {
		return fwk.AsStatus(err)
	}
	err = retry.OnError(retry.DefaultBackoff, retriable, func() error {
		_, err := pl.handle.ClientSet().CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("writing GPU assignment to pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	klog.FromContext(ctx).V(4).Info("Wrote GPU assignment", "pod", klog.KObj(pod), "node", nodeName)
	return nil
}

func retriable(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

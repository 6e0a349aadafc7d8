// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34

package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Pod signatures exist from Kubernetes 1.35; a 1.34 scheduler does not batch pods and
// asks for none.
var _ fwk.SignPlugin = &Plugin{}

// signature is what makes two pods interchangeable to this plugin.
type signature struct {
	Containers  []api.ContainerRequest `json:"c"`
	Annotations map[string]string      `json:"a,omitempty"`
}

var podAnnotations = []string{api.AnnotationModelInclude, api.AnnotationModelExclude, api.AnnotationUUIDInclude, api.AnnotationUUIDExclude, api.AnnotationDevicePolicy, api.AnnotationTopology, api.AnnotationSharing, api.AnnotationWorkConserving}

// SignPod lets the scheduler batch pods with identical GPU requests and selection.
func (pl *Plugin) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if !api.HasGPURequest(pod, pl.names) {
		return nil, nil
	}
	req, err := api.ParsePodRequest(pod, pl.names)
	if err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, err.Error())
	}
	sig := signature{Containers: req.Containers}
	for _, k := range podAnnotations {
		if v, ok := pod.Annotations[k]; ok {
			if sig.Annotations == nil {
				sig.Annotations = map[string]string{}
			}
			sig.Annotations[k] = v
		}
	}
	return []fwk.SignFragment{{Key: Name + ".GPURequest()", Value: sig}}, nil
}

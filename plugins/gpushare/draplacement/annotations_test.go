// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
)

// A claim pod's tessera.dev/gpu-policy picks the policy its devices are ordered by
// (where the profile allows it); an annotation its claims cannot follow makes it
// unschedulable with what to write in the claim; work-conserving is accepted where the
// claim's configuration says it too.
func TestClaimPodAnnotations(t *testing.T) {
	const wcOn = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true}`
	tessera := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.tessera.dev"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.tessera.dev"`}}}}}
	wcClass := tessera.DeepCopy()
	wcClass.Name = "wc.tessera.dev"
	wcClass.Spec.Config = []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: opaque(DriverName, wcOn)}}
	claim := func(class string, config ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "c"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
				{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}, Config: config}}}
	}
	plain := claim("gpu.tessera.dev")
	configured := claim("gpu.tessera.dev", resourceapi.DeviceClaimConfiguration{Requests: []string{"gpu"}, DeviceConfiguration: opaque(DriverName, wcOn)})
	otherRequest := claim("gpu.tessera.dev", resourceapi.DeviceClaimConfiguration{Requests: []string{"nic"}, DeviceConfiguration: opaque(DriverName, wcOn)})
	for _, tc := range []struct {
		name   string
		args   string
		ann    map[string]string
		claim  *resourceapi.ResourceClaim
		policy string // the device policy the pod is ordered by
		want   string // in the problem; "" for none
	}{
		{"none", `{}`, nil, plain, "Binpack", ""},
		{"the pod's policy", `{}`, map[string]string{api.AnnotationDevicePolicy: "spread"}, plain, "Spread", ""},
		{"the pod's policy, not allowed", `{"allowPodPolicyOverride": false}`, map[string]string{api.AnnotationDevicePolicy: "Spread"}, plain, "Binpack",
			"does not allow pods to choose the GPU policy"},
		{"not a policy", `{}`, map[string]string{api.AnnotationDevicePolicy: "tightest"}, plain, "Binpack",
			`"tightest" is not a policy; use Binpack, Spread, Fragmentation`},
		{"a model", `{}`, map[string]string{api.AnnotationModelInclude: "H100"}, plain, "Binpack",
			`annotation tessera.dev/gpu-model-include: "H100" is for pods that ask GPUs by request names and does not reach a ResourceClaim; ` +
				`the pod's GPUs are claims: use a CEL selector on device.attributes["gpu.tessera.dev"].model in the claim's request, and remove the annotation`},
		{"a UUID", `{}`, map[string]string{api.AnnotationUUIDExclude: "GPU-1"}, plain, "Binpack", `.uuid in the claim's request`},
		{"MPS", `{}`, map[string]string{api.AnnotationSharing: "mps"}, plain, "Binpack", `.sharing ("mps" or "time-sliced")`},
		{"NVLink required", `{}`, map[string]string{api.AnnotationTopology: "nvlink-required"}, plain, "Binpack", "matchAttribute: gpu.tessera.dev/nvlinkIsland"},
		{"NUMA required", `{}`, map[string]string{api.AnnotationTopology: "numa-required"}, plain, "Binpack", "matchAttribute: resource.kubernetes.io/numaNode"},
		{"locality preferred", `{}`, map[string]string{api.AnnotationTopology: "preferred"}, plain, "Binpack", ""},
		{"work-conserving, claim not configured", `{}`, map[string]string{api.AnnotationWorkConserving: "true"}, plain, "Binpack",
			"workConserving: true in the claim's gpu.tessera.dev configuration"},
		{"work-conserving, another request configured", `{}`, map[string]string{api.AnnotationWorkConserving: "true"}, otherRequest, "Binpack", "workConserving: true"},
		{"work-conserving, claim configured", `{}`, map[string]string{api.AnnotationWorkConserving: "true"}, configured, "Binpack", ""},
		{"work-conserving, class configured", `{}`, map[string]string{api.AnnotationWorkConserving: "true"}, claim("wc.tessera.dev"), "Binpack", ""},
		{"not work-conserving", `{}`, map[string]string{api.AnnotationWorkConserving: "false"}, plain, "Binpack", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, pod := claimOrderer(t, tc.args, tc.claim, tc.ann, tessera, wcClass)
			d := o.demandOf(klog.Background(), pod)
			if d == nil {
				t.Fatal("no demand")
			}
			if tc.want == "" && d.problem != "" || tc.want != "" && !strings.Contains(d.problem, tc.want) {
				t.Errorf("problem %q\nwant %q", d.problem, tc.want)
			}
			if d.info.Device != o.placers[placement.Policy(tc.policy)] {
				t.Errorf("ordered by %v, want %s", d.info.Device, tc.policy)
			}
		})
	}
}

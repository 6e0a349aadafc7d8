// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// A claim of Tessera shares in several requests must keep them on distinct devices;
// one request (of any count), whole devices, other drivers' requests and allocated
// claims need nothing.
func TestSameDeviceTwice(t *testing.T) {
	tessera := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.tessera.dev"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.tessera.dev"`}}}}}
	share := &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("20Gi")}}
	req := func(name, class string, count int64, capacity *resourceapi.CapacityRequirements) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class,
			AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count, Capacity: capacity}}
	}
	distinct := func(requests ...string) resourceapi.DeviceConstraint {
		return resourceapi.DeviceConstraint{Requests: requests, DistinctAttribute: ptr.To(attrDistinctUUID)}
	}
	island := resourceapi.DeviceConstraint{Requests: []string{"gpus"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.tessera.dev/nvlinkIsland"))}
	claim := func(requests []resourceapi.DeviceRequest, constraints ...resourceapi.DeviceConstraint) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "c"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests, Constraints: constraints}}}
	}
	allocated := claim([]resourceapi.DeviceRequest{req("a", "gpu.tessera.dev", 1, share), req("b", "gpu.tessera.dev", 1, share)})
	allocated.Status.Allocation = &resourceapi.AllocationResult{}
	prioritized := claim([]resourceapi.DeviceRequest{{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "two", DeviceClassName: "gpu.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2, Capacity: share},
		{Name: "one", DeviceClassName: "gpu.tessera.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}},
		req("more", "gpu.tessera.dev", 1, share)})
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"one share", claim([]resourceapi.DeviceRequest{req("gpu", "gpu.tessera.dev", 1, share)}), ""},
		// The allocator moves past the devices one request took.
		{"two shares of one request", claim([]resourceapi.DeviceRequest{req("gpus", "gpu.tessera.dev", 2, share)}, island), ""},
		{"two whole devices", claim([]resourceapi.DeviceRequest{req("a", "gpu.tessera.dev", 1, nil), req("b", "gpu.tessera.dev", 1, nil)}), ""},
		{"two requests of a share each", claim([]resourceapi.DeviceRequest{req("a", "gpu.tessera.dev", 1, share), req("b", "gpu.tessera.dev", 2, share)}),
			`ResourceClaim team/c asks for shares of Tessera devices in 2 requests ("a", "b") and nothing keeps them on distinct devices: ` +
				`the allocator may give it one device twice, which the node agent refuses. Add the constraint {requests: ["a", "b"], distinctAttribute: gpu.tessera.dev/uuid}`},
		{"a constraint of one of them", claim([]resourceapi.DeviceRequest{req("a", "gpu.tessera.dev", 1, share), req("b", "gpu.tessera.dev", 1, share)}, distinct("a")),
			`in 2 requests ("a", "b")`},
		{"kept apart", claim([]resourceapi.DeviceRequest{req("a", "gpu.tessera.dev", 1, share), req("b", "gpu.tessera.dev", 1, share)}, distinct("a", "b")), ""},
		{"kept apart by a constraint of all requests", claim([]resourceapi.DeviceRequest{req("a", "gpu.tessera.dev", 1, share), req("b", "gpu.tessera.dev", 1, share)}, distinct()), ""},
		{"a share and a whole device", claim([]resourceapi.DeviceRequest{req("a", "gpu.tessera.dev", 1, share), req("b", "gpu.tessera.dev", 1, nil)}), ""},
		{"another driver's", claim([]resourceapi.DeviceRequest{req("a", "gpu.tessera.dev", 1, share), req("nics", "nic", 2, share)}), ""},
		{"a prioritized list's share beside a share", prioritized, `in 2 requests ("gpus", "more")`},
		{"allocated", allocated, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, pod := claimOrderer(t, `{}`, tc.claim, nil, tessera)
			got := o.sameDeviceTwice(pod)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

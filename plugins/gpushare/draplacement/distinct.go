// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/api"
)

// attrDistinctUUID is the attribute a claim's shares are kept on distinct devices by.
const attrDistinctUUID resourceapi.FullyQualifiedName = DriverName + "/uuid"

// sameDeviceTwice is why pod cannot run when one of its claims not yet allocated asks
// for shares of Tessera devices (capacity requests) in two or more requests with no
// distinctAttribute constraint on gpu.tessera.dev/uuid over them, or "". A device that
// allows several allocations may be given to one claim twice: the in-tree allocator
// starts each request's search at the first device (within one request of count: N it
// moves past the devices it took), and the device policy's order offers the same best
// device to every request. The node agent refuses a claim that holds a device twice
// (the claim has one limit per device), so the pod would be bound and never start;
// here it stays pending with the constraint to add. Requests without capacity requests
// take a whole device each and cannot meet another on it.
func (o *orderer) sameDeviceTwice(pod *v1.Pod) string {
	for _, claim := range o.claimsOf(pod) {
		if claim.Status.Allocation != nil {
			continue
		}
		var names []string
		for i := range claim.Spec.Devices.Requests {
			r := &claim.Spec.Devices.Requests[i]
			share := r.Exactly != nil && o.isTessera(r.Exactly.DeviceClassName) && asksCapacity(r.Exactly.Capacity)
			for j := range r.FirstAvailable {
				s := &r.FirstAvailable[j]
				share = share || o.isTessera(s.DeviceClassName) && asksCapacity(s.Capacity)
			}
			if share {
				names = append(names, r.Name)
			}
		}
		if len(names) < 2 || keptDistinct(claim.Spec.Devices.Constraints, names) {
			continue
		}
		quoted := make([]string, len(names))
		for i, n := range names {
			quoted[i] = fmt.Sprintf("%q", n)
		}
		return fmt.Sprintf("ResourceClaim %s/%s asks for shares of Tessera devices in %d requests (%s) and nothing keeps them on distinct devices: "+
			"the allocator may give it one device twice, which the node agent refuses. Add the constraint "+
			"{requests: [%s], distinctAttribute: %s} to spec.devices.constraints (two shares of one GPU are one request with their sum)",
			claim.Namespace, claim.Name, len(names), strings.Join(quoted, ", "), strings.Join(quoted, ", "), attrDistinctUUID)
	}
	return ""
}

// asksCapacity reports whether a request asks part of a device's capacities (a share)
// rather than all of it by the defaults.
func asksCapacity(c *resourceapi.CapacityRequirements) bool {
	return c != nil && len(c.Requests) > 0
}

// keptDistinct reports whether a distinctAttribute constraint on the device UUID
// covers every one of requests (a constraint without requests covers all).
func keptDistinct(constraints []resourceapi.DeviceConstraint, requests []string) bool {
	for _, c := range constraints {
		if c.DistinctAttribute == nil || *c.DistinctAttribute != attrDistinctUUID {
			continue
		}
		if !slices.ContainsFunc(requests, func(r string) bool { return !api.NamesRequest(c.Requests, r) }) {
			return true
		}
	}
	return false
}

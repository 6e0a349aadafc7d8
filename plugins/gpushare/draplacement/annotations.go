// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
)

// Tessera's pod annotations were made for pods that ask GPUs by request names. A pod
// whose GPUs are ResourceClaims keeps the one that only says how to place it (the
// device policy, tessera.dev/gpu-policy, honoured as TesseraGPUShare honours it); the
// others ask what a claim says itself (its selectors, constraints and configuration),
// and the scheduler cannot make the in-tree allocator honour them, so such a pod is
// unschedulable with what to write in the claim instead of being placed as if the
// annotation were not there.

// devicePlacer is the device policy pod's claims are ordered by: the pod's
// tessera.dev/gpu-policy where the profile allows it, else the profile's; and why the
// pod cannot run for that annotation, or "".
func (o *orderer) devicePlacer(pod *v1.Pod) (placement.Placer, string) {
	v, ok := pod.Annotations[api.AnnotationDevicePolicy]
	if !ok {
		return o.placer, ""
	}
	if !o.allowPolicy {
		return o.placer, fmt.Sprintf("annotation %s: this scheduler profile does not allow pods to choose the GPU policy; remove the annotation or use another profile", api.AnnotationDevicePolicy)
	}
	for _, p := range policies.Names() {
		if strings.EqualFold(strings.TrimSpace(v), string(p)) {
			return o.placers[p], ""
		}
	}
	return o.placer, fmt.Sprintf("annotation %s: %q is not a policy; use %s", api.AnnotationDevicePolicy, v, policyList())
}

// claimAnnotationProblem is why pod, whose GPUs are Tessera claims, cannot run for an
// annotation the claims do not follow, or "". workConserving is whether the claim's
// configuration asks for work-conserving pacing (which the annotation's "true" then
// only repeats: the claims-from-requests policy leaves it on the pods it converts).
func claimAnnotationProblem(pod *v1.Pod, workConserving bool) string {
	ann := pod.Annotations
	attr := func(a string) string { return fmt.Sprintf(`device.attributes["%s"].%s`, DriverName, a) }
	for _, a := range []struct{ key, instead string }{
		{api.AnnotationModelInclude, "a CEL selector on " + attr("model") + " in the claim's request"},
		{api.AnnotationModelExclude, "a CEL selector on " + attr("model") + " in the claim's request"},
		{api.AnnotationUUIDInclude, "a CEL selector on " + attr("uuid") + " in the claim's request"},
		{api.AnnotationUUIDExclude, "a CEL selector on " + attr("uuid") + " in the claim's request"},
		{api.AnnotationSharing, "a CEL selector on " + attr("sharing") + ` ("mps" or "time-sliced") in the claim's request`},
	} {
		if strings.TrimSpace(ann[a.key]) != "" {
			return unfollowed(a.key, ann[a.key], a.instead)
		}
	}
	switch t, _ := api.ParseTopology(ann[api.AnnotationTopology]); t {
	case api.TopologyNVLinkRequired:
		return unfollowed(api.AnnotationTopology, ann[api.AnnotationTopology],
			"a count: N request with the constraint matchAttribute: "+DriverName+"/nvlinkIsland (Tessera's device order already keeps a request's devices together where it can)")
	case api.TopologyNUMARequired:
		return unfollowed(api.AnnotationTopology, ann[api.AnnotationTopology],
			"a count: N request with the constraint matchAttribute: "+string(numaNodeAttribute))
	case api.TopologyNone, api.TopologyPreferred:
	default:
		return unfollowed(api.AnnotationTopology, ann[api.AnnotationTopology], "the claim's constraints")
	}
	if wc, err := api.ParseWorkConserving(ann[api.AnnotationWorkConserving]); (err != nil || wc) && !workConserving {
		return unfollowed(api.AnnotationWorkConserving, ann[api.AnnotationWorkConserving],
			"workConserving: true in the claim's "+DriverName+" configuration (apiVersion "+api.GPUConfigAPIVersion+", kind "+api.GPUConfigKind+"; docs/dra.md)")
	}
	return ""
}

func unfollowed(key, value, instead string) string {
	return fmt.Sprintf("annotation %s: %q is for pods that ask GPUs by request names and does not reach a ResourceClaim; "+
		"the pod's GPUs are claims: use %s, and remove the annotation", key, value, instead)
}

// numaNodeAttribute is the standard attribute of a device's host NUMA node.
const numaNodeAttribute resourceapi.FullyQualifiedName = "resource.kubernetes.io/numaNode"

// requestConfig is the Tessera configuration that applies to request r of claim: the
// Tessera DeviceClass's entries, then the claim's, as the node agent reads them from
// the allocation (api.ResolveGPUConfig). A configuration that does not decode reads as
// none here: configProblem has refused the pod before.
func (o *orderer) requestConfig(claim *resourceapi.ResourceClaim, r *resourceapi.DeviceRequest) api.GPUConfig {
	var entries []api.GPUConfigEntry
	add := func(requests []string, oc *resourceapi.OpaqueDeviceConfiguration) {
		if oc != nil && oc.Driver == DriverName {
			entries = append(entries, api.GPUConfigEntry{Requests: requests, Parameters: oc.Parameters.Raw})
		}
	}
	class := ""
	switch {
	case r.Exactly != nil:
		class = r.Exactly.DeviceClassName
	case len(r.FirstAvailable) > 0:
		class = r.FirstAvailable[0].DeviceClassName
	}
	if dc, err := o.h.SharedDRAManager().DeviceClasses().Get(class); err == nil && dc != nil {
		for i := range dc.Spec.Config {
			add(nil, dc.Spec.Config[i].Opaque)
		}
	}
	for i := range claim.Spec.Devices.Config {
		add(claim.Spec.Devices.Config[i].Requests, claim.Spec.Devices.Config[i].Opaque)
	}
	cfg, _ := api.ResolveGPUConfig(entries, r.Name)
	return cfg
}

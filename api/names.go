// SPDX-License-Identifier: Apache-2.0

package api

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// DefaultDomain is the prefix of Tessera's resource names, annotations and labels.
const DefaultDomain = "tessera.dev"

// Annotations and labels. They always use DefaultDomain: only resource names are
// configurable, because those are what a cluster migrating from another system has
// baked into its workloads.
const (
	// AnnotationInventory is set on a Node by the node agent (NodeInventory, JSON).
	AnnotationInventory = DefaultDomain + "/gpu-inventory"
	// AnnotationRequirements is set on a Node by the node agent: "met", or one
	// "<requirement>: <what is wrong>" per line while the node lacks something Tessera
	// needs (the agent then refuses GPU containers; the scheduler places none there).
	AnnotationRequirements = DefaultDomain + "/node-requirements"
	// AnnotationAssignment is set on a Pod by the scheduler when it binds the pod, in
	// the binding or in PreBind (PodAssignment, JSON).
	AnnotationAssignment = DefaultDomain + "/gpu-assignment"

	// Pod annotations a user may set.

	// AnnotationModelInclude is a comma-separated list of GPU model substrings; a GPU
	// must match one of them (case-insensitive), e.g. "H100,A100".
	AnnotationModelInclude = DefaultDomain + "/gpu-model-include"
	// AnnotationModelExclude is a comma-separated list of GPU model substrings no GPU may match.
	AnnotationModelExclude = DefaultDomain + "/gpu-model-exclude"
	// AnnotationUUIDInclude is a comma-separated list of GPU UUIDs; only these may be used.
	AnnotationUUIDInclude = DefaultDomain + "/gpu-uuid-include"
	// AnnotationUUIDExclude is a comma-separated list of GPU UUIDs that may not be used.
	AnnotationUUIDExclude = DefaultDomain + "/gpu-uuid-exclude"
	// AnnotationDevicePolicy overrides the scheduler's GPU-level policy for this pod
	// ("Binpack" or "Spread").
	AnnotationDevicePolicy = DefaultDomain + "/gpu-policy"
	// AnnotationTopology is the locality requirement for containers asking for more
	// than one GPU: see Topology.
	AnnotationTopology = DefaultDomain + "/gpu-topology"

	// Node labels the node agent publishes so that ordinary node affinity works.
	LabelModel  = DefaultDomain + "/gpu.model"
	LabelCount  = DefaultDomain + "/gpu.count"
	LabelMemory = DefaultDomain + "/gpu.memory-mib"
)

// Topology is the locality a multi-GPU container asks for (pod annotation AnnotationTopology).
type Topology string

const (
	// TopologyNone ignores locality.
	TopologyNone Topology = "none"
	// TopologyPreferred (the default) prefers GPUs joined by NVLink, then by the same
	// PCIe switch, then on the same NUMA node, but accepts any set.
	TopologyPreferred Topology = "preferred"
	// TopologyNVLinkRequired requires every pair of a container's GPUs to be joined by NVLink.
	TopologyNVLinkRequired Topology = "nvlink-required"
	// TopologyNUMARequired requires all of a container's GPUs to be on one NUMA node.
	TopologyNUMARequired Topology = "numa-required"
)

// ParseTopology parses the value of AnnotationTopology; empty means TopologyPreferred.
func ParseTopology(s string) (Topology, error) {
	switch t := Topology(strings.TrimSpace(s)); t {
	case "":
		return TopologyPreferred, nil
	case TopologyNone, TopologyPreferred, TopologyNVLinkRequired, TopologyNUMARequired:
		return t, nil
	default:
		return "", fmt.Errorf("annotation %s: %q is not one of none, preferred, nvlink-required, numa-required", AnnotationTopology, s)
	}
}

// ResourceNames are the extended resource names a container uses to ask for GPUs.
type ResourceNames struct {
	// GPU is the number of physical GPUs (integer >= 1), e.g. tessera.dev/gpu.
	GPU corev1.ResourceName `json:"gpu"`
	// GPUMemory is MiB of device memory on each GPU, e.g. tessera.dev/gpu-memory.
	GPUMemory corev1.ResourceName `json:"gpuMemory"`
	// GPUMemoryPercent is percent (1-100) of each GPU's memory, e.g. tessera.dev/gpu-memory-percent.
	GPUMemoryPercent corev1.ResourceName `json:"gpuMemoryPercent"`
	// GPUCores is percent (1-100) of each GPU's compute, e.g. tessera.dev/gpu-cores.
	GPUCores corev1.ResourceName `json:"gpuCores"`
}

// DefaultResourceNames returns the names under DefaultDomain.
func DefaultResourceNames() ResourceNames { return ResourceNamesForDomain(DefaultDomain) }

// ResourceNamesForDomain returns <domain>/gpu, <domain>/gpu-memory,
// <domain>/gpu-memory-percent and <domain>/gpu-cores.
func ResourceNamesForDomain(domain string) ResourceNames {
	return ResourceNames{
		GPU:              corev1.ResourceName(domain + "/gpu"),
		GPUMemory:        corev1.ResourceName(domain + "/gpu-memory"),
		GPUMemoryPercent: corev1.ResourceName(domain + "/gpu-memory-percent"),
		GPUCores:         corev1.ResourceName(domain + "/gpu-cores"),
	}
}

// Validate checks that every name is a valid, distinct, domain-qualified extended
// resource name, and returns every name that is not, each under its field of path
// (e.g. pluginConfig[TesseraGPUShare].args.resourceNames.gpu).
func (n ResourceNames) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[corev1.ResourceName]*field.Path{}
	for _, f := range []struct {
		field string
		name  corev1.ResourceName
	}{{"gpu", n.GPU}, {"gpuMemory", n.GPUMemory}, {"gpuMemoryPercent", n.GPUMemoryPercent}, {"gpuCores", n.GPUCores}} {
		p := path.Child(f.field)
		s := string(f.name)
		if s == "" {
			errs = append(errs, field.Required(p, "must be set"))
			continue
		}
		domain, name, ok := strings.Cut(s, "/")
		switch {
		case !ok || domain == "" || name == "":
			errs = append(errs, field.Invalid(p, s, "must be domain-qualified, like tessera.dev/gpu"))
			continue
		case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || domain == "requests":
			errs = append(errs, field.Invalid(p, s, "uses a reserved domain"))
			continue
		}
		if msgs := validation.IsQualifiedName(s); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p, s, "is not a valid resource name: "+strings.Join(msgs, "; ")))
			continue
		}
		if other, dup := seen[f.name]; dup {
			errs = append(errs, field.Invalid(p, s, "is already used by "+other.String()))
			continue
		}
		seen[f.name] = p
	}
	return errs
}

// Group returns the resource group (the domain of the names) if all four share one,
// the form NodeResourcesFit's ignoredResourceGroups takes; "" otherwise.
func (n ResourceNames) Group() string {
	d, _, _ := strings.Cut(string(n.GPU), "/")
	for _, r := range []corev1.ResourceName{n.GPUMemory, n.GPUMemoryPercent, n.GPUCores} {
		if od, _, _ := strings.Cut(string(r), "/"); od != d {
			return ""
		}
	}
	return d
}

package api

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultDomain is the prefix of Tessera's resource names, annotations and labels.
const DefaultDomain = "tessera.dev"

// Annotations and labels. They always use DefaultDomain: only resource names are
// configurable, because those are what a cluster migrating from another system has
// baked into its workloads.
const (
	// AnnotationInventory is set on a Node by the node agent (NodeInventory, JSON).
	AnnotationInventory = DefaultDomain + "/gpu-inventory"
	// AnnotationAssignment is set on a Pod by the scheduler in PreBind (PodAssignment, JSON).
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
// resource name. The field names in errors are relative to path (e.g. "resourceNames").
func (n ResourceNames) Validate(path string) error {
	seen := map[corev1.ResourceName]string{}
	for _, f := range []struct {
		field string
		name  corev1.ResourceName
	}{{"gpu", n.GPU}, {"gpuMemory", n.GPUMemory}, {"gpuMemoryPercent", n.GPUMemoryPercent}, {"gpuCores", n.GPUCores}} {
		p := path + "." + f.field
		s := string(f.name)
		if s == "" {
			return fmt.Errorf("%s: must be set", p)
		}
		domain, name, ok := strings.Cut(s, "/")
		if !ok || domain == "" || name == "" {
			return fmt.Errorf("%s: %q must be domain-qualified, like tessera.dev/gpu", p, s)
		}
		if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || domain == "requests" {
			return fmt.Errorf("%s: %q uses a reserved domain", p, s)
		}
		if errs := validation.IsQualifiedName(s); len(errs) > 0 {
			return fmt.Errorf("%s: %q is not a valid resource name: %s", p, s, strings.Join(errs, "; "))
		}
		if other, dup := seen[f.name]; dup {
			return fmt.Errorf("%s: %q is already used by %s.%s", p, s, path, other)
		}
		seen[f.name] = f.field
	}
	return nil
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

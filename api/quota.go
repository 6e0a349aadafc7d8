// SPDX-License-Identifier: Apache-2.0

package api

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Quota resources: what a container holds across all of its GPUs, in names a
// ResourceQuota (requests.<name>) and Kueue can count. The request names are per GPU
// (gpu: 2 with gpu-memory: 8192 holds 16384 MiB) and a memory request may be in MiB,
// in percent or whole GPUs, so no request name alone counts what a pod holds. The
// chart's admission policy writes these into every GPU container's requests and
// limits at creation, computed as QuotaTotals does, and refuses values that differ
// (docs/quotas.md). Like the annotations they always use DefaultDomain; the scheduler
// and the node agent never read them.
const (
	// ResourceTotalGPUMemory is MiB of GPU memory: gpu × gpu-memory, for containers
	// that ask for memory in MiB.
	ResourceTotalGPUMemory corev1.ResourceName = DefaultDomain + "/total-gpu-memory"
	// ResourceTotalGPUMemoryPercent is GPU memory in percent-GPUs (100 is one GPU's
	// memory): gpu × gpu-memory-percent, for containers that ask for 1-99 percent.
	ResourceTotalGPUMemoryPercent corev1.ResourceName = DefaultDomain + "/total-gpu-memory-percent"
	// ResourceTotalWholeGPUs is GPUs whose whole memory the container takes: gpu, for
	// containers that ask for no memory or for 100 percent of it.
	ResourceTotalWholeGPUs corev1.ResourceName = DefaultDomain + "/total-whole-gpus"
	// ResourceTotalGPUCores is compute in percent-GPUs: gpu × gpu-cores, for
	// containers that reserve cores.
	ResourceTotalGPUCores corev1.ResourceName = DefaultDomain + "/total-gpu-cores"
)

// QuotaResourceNames returns the four quota resource names.
func QuotaResourceNames() []corev1.ResourceName {
	return []corev1.ResourceName{ResourceTotalGPUMemory, ResourceTotalGPUMemoryPercent, ResourceTotalWholeGPUs, ResourceTotalGPUCores}
}

// IsQuotaResource reports whether name is one of QuotaResourceNames.
func IsQuotaResource(name corev1.ResourceName) bool {
	switch name {
	case ResourceTotalGPUMemory, ResourceTotalGPUMemoryPercent, ResourceTotalWholeGPUs, ResourceTotalGPUCores:
		return true
	}
	return false
}

// QuotaTotals returns the quota resources the container holds, its non-zero totals
// only. Each GPU's memory is counted under exactly one name: MiB, percent-GPUs or
// whole GPUs. Cores count only when reserved (a container without gpu-cores reserves
// none, docs/scheduler.md).
func (r ContainerRequest) QuotaTotals() corev1.ResourceList {
	out := corev1.ResourceList{}
	n := int64(r.GPUs)
	set := func(name corev1.ResourceName, v int64) {
		if v > 0 {
			out[name] = *resource.NewQuantity(v, resource.DecimalSI)
		}
	}
	switch {
	case r.MemoryMiB > 0:
		set(ResourceTotalGPUMemory, n*r.MemoryMiB)
	case r.WholeMemory():
		set(ResourceTotalWholeGPUs, n)
	default:
		set(ResourceTotalGPUMemoryPercent, n*int64(r.MemoryPercent))
	}
	set(ResourceTotalGPUCores, n*int64(r.Cores))
	return out
}

// SPDX-License-Identifier: Apache-2.0

package api

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ContainerRequest is what one container asks for, per GPU.
type ContainerRequest struct {
	// Name is the container's name.
	Name string
	// Init is true for init containers (including restartable sidecars).
	Init bool
	// GPUs is the number of distinct physical GPUs (>= 1).
	GPUs int
	// MemoryMiB is the memory asked for on each GPU; 0 when MemoryPercent is used or
	// when the whole memory of each GPU is asked for.
	MemoryMiB int64
	// MemoryPercent is the percent (1-100) of each GPU's memory; 0 when unused.
	MemoryPercent int
	// Cores is the percent (1-100) of each GPU's compute; 0 reserves and enforces none.
	Cores int
}

// WholeMemory reports whether the container asks for the whole memory of each GPU.
func (r ContainerRequest) WholeMemory() bool {
	return r.MemoryMiB == 0 && (r.MemoryPercent == 0 || r.MemoryPercent == 100)
}

// MemoryOn returns the MiB this request takes on a GPU with totalMiB of memory.
func (r ContainerRequest) MemoryOn(totalMiB int64) int64 {
	switch {
	case r.MemoryMiB > 0:
		return r.MemoryMiB
	case r.MemoryPercent > 0:
		// Round down so that 4 × 25% always fits one GPU.
		return totalMiB * int64(r.MemoryPercent) / 100
	default:
		return totalMiB
	}
}

// String is a short human description, e.g. "2 GPU × 4096 MiB, 30% cores".
func (r ContainerRequest) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d GPU", r.GPUs)
	switch {
	case r.MemoryMiB > 0:
		fmt.Fprintf(&b, " × %d MiB", r.MemoryMiB)
	case r.MemoryPercent > 0:
		fmt.Fprintf(&b, " × %d%% memory", r.MemoryPercent)
	default:
		b.WriteString(" × all memory")
	}
	if r.Cores > 0 {
		fmt.Fprintf(&b, ", %d%% cores", r.Cores)
	}
	return b.String()
}

// PodRequest is the GPU request of a whole pod: one entry per GPU-requesting container,
// init containers first, in spec order.
type PodRequest struct {
	Containers []ContainerRequest
}

// Empty reports whether no container asks for a GPU.
func (p PodRequest) Empty() bool { return len(p.Containers) == 0 }

// RequestError is an invalid GPU request. Its message names the container and the
// field, and says what to change.
type RequestError struct {
	Container string
	Field     string
	Reason    string
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("container %q: %s: %s", e.Container, e.Field, e.Reason)
}

// HasGPURequest reports cheaply whether any container of pod names any of the GPU
// resources. It does no validation; use ParsePodRequest for that.
func HasGPURequest(pod *corev1.Pod, names ResourceNames) bool {
	check := func(cs []corev1.Container) bool {
		for i := range cs {
			for _, rl := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				if len(rl) == 0 {
					continue
				}
				for _, n := range []corev1.ResourceName{names.GPU, names.GPUMemory, names.GPUMemoryPercent, names.GPUCores} {
					if _, ok := rl[n]; ok {
						return true
					}
				}
			}
		}
		return false
	}
	return check(pod.Spec.Containers) || check(pod.Spec.InitContainers)
}

// ParsePodRequest reads and validates the GPU request of every container of pod.
// A pod with no GPU request gives an empty PodRequest and no error. Whether the
// memory covers a CUDA context's charge depends on the node and the GPU
// (ContextCharge), so it is not checked here.
func ParsePodRequest(pod *corev1.Pod, names ResourceNames) (PodRequest, error) {
	var req PodRequest
	for i := range pod.Spec.InitContainers {
		c, ok, err := parseContainer(&pod.Spec.InitContainers[i], true, names)
		if err != nil {
			return PodRequest{}, err
		}
		if ok {
			req.Containers = append(req.Containers, c)
		}
	}
	for i := range pod.Spec.Containers {
		c, ok, err := parseContainer(&pod.Spec.Containers[i], false, names)
		if err != nil {
			return PodRequest{}, err
		}
		if ok {
			req.Containers = append(req.Containers, c)
		}
	}
	return req, nil
}

// quantity returns the limit of name (or the request when no limit is set) and
// whether either was present. Limits win because extended resources must have
// equal requests and limits when both are given.
func quantity(c *corev1.Container, name corev1.ResourceName) (resource.Quantity, bool) {
	if q, ok := c.Resources.Limits[name]; ok {
		return q, true
	}
	if q, ok := c.Resources.Requests[name]; ok {
		return q, true
	}
	return resource.Quantity{}, false
}

// integer returns q as an int64 when it is a whole number that fits.
func integer(q resource.Quantity) (int64, bool) {
	if v, ok := q.AsInt64(); ok {
		return v, true
	}
	// Forms like "4Ki" or "2e3" have no int64 fast path but may still be whole.
	c := q.DeepCopy()
	if exact := c.RoundUp(0); !exact {
		return 0, false
	}
	return c.AsInt64()
}

// MaxGPUsPerContainer bounds the GPU count so that arithmetic never overflows and a
// typo like 1000 gets a clear answer.
const MaxGPUsPerContainer = 64

// MaxMemoryMiB bounds per-GPU memory requests (16 TiB), far above any GPU made.
const MaxMemoryMiB = 16 << 20

// ContextCharge is what the CUDA hook charges against a container's memory on each
// GPU for each process's CUDA context, on a node whose agent charges contextMiB for a
// plain context (NodeInventory.ContextCharge): contextMiB for a time-sliced pod, an
// MPS client's smaller charge at its gpu-cores share (all SMs without one) for an
// MPS pod. A container whose memory on a GPU is below it could not create a context
// there, so the scheduler does not place it on that GPU and the node agent refuses
// such a grant. The request alone does not decide it: the charge is the node's, and
// a gpu-memory-percent request's MiB are the GPU's.
func ContextCharge(contextMiB int64, sharing Sharing, cores int) int64 {
	if sharing == SharingMPS {
		// MPSContextMiB charges a percentage outside 1..100 (no gpu-cores) as 100.
		return MPSContextMiB(contextMiB, cores)
	}
	return contextMiB
}

// ContextChargeWords names what ContextCharge charges for, e.g. "each process's CUDA
// context" or "each MPS client's CUDA context at 30% of the SMs".
func ContextChargeWords(sharing Sharing, cores int) string {
	switch {
	case sharing != SharingMPS:
		return "each process's CUDA context"
	case cores == 0:
		return "each MPS client's CUDA context using all SMs (no gpu-cores)"
	default:
		return fmt.Sprintf("each MPS client's CUDA context at %d%% of the SMs", cores)
	}
}

func parseContainer(c *corev1.Container, init bool, names ResourceNames) (ContainerRequest, bool, error) {
	gpuQ, hasGPU := quantity(c, names.GPU)
	memQ, hasMem := quantity(c, names.GPUMemory)
	pctQ, hasPct := quantity(c, names.GPUMemoryPercent)
	coreQ, hasCores := quantity(c, names.GPUCores)
	if !hasGPU && !hasMem && !hasPct && !hasCores {
		return ContainerRequest{}, false, nil
	}
	bad := func(field corev1.ResourceName, format string, a ...any) (ContainerRequest, bool, error) {
		return ContainerRequest{}, false, &RequestError{Container: c.Name, Field: string(field), Reason: fmt.Sprintf(format, a...)}
	}
	if !hasGPU {
		present := names.GPUMemory
		switch {
		case hasPct:
			present = names.GPUMemoryPercent
		case hasCores && !hasMem:
			present = names.GPUCores
		}
		return bad(present, "is set without %s; add %s: 1 (or more) to the container's limits", names.GPU, names.GPU)
	}
	r := ContainerRequest{Name: c.Name, Init: init}
	n, ok := integer(gpuQ)
	if !ok || n < 1 {
		return bad(names.GPU, "must be a whole number of GPUs >= 1, got %s", gpuQ.String())
	}
	if n > MaxGPUsPerContainer {
		return bad(names.GPU, "asks for %d GPUs; at most %d per container are supported", n, MaxGPUsPerContainer)
	}
	r.GPUs = int(n)
	if hasMem && hasPct {
		return bad(names.GPUMemory, "set either %s or %s, not both", names.GPUMemory, names.GPUMemoryPercent)
	}
	if hasMem {
		m, ok := integer(memQ)
		if !ok || m < 1 {
			return bad(names.GPUMemory, "must be a whole number of MiB >= 1, got %s", memQ.String())
		}
		if m > MaxMemoryMiB {
			return bad(names.GPUMemory, "asks for %d MiB per GPU, more than any GPU has; the value is in MiB (4096 means 4 GiB)", m)
		}
		r.MemoryMiB = m
	}
	if hasPct {
		p, ok := integer(pctQ)
		if !ok || p < 1 || p > 100 {
			return bad(names.GPUMemoryPercent, "must be a whole percent between 1 and 100, got %s", pctQ.String())
		}
		r.MemoryPercent = int(p)
	}
	if hasCores {
		p, ok := integer(coreQ)
		if !ok || p < 1 || p > 100 {
			return bad(names.GPUCores, "must be a whole percent between 1 and 100, got %s", coreQ.String())
		}
		r.Cores = int(p)
	}
	return r, true, nil
}

// SPDX-License-Identifier: Apache-2.0

package api

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Sharing is how the containers placed on one GPU share its compute.
//
// A GPU's mode is decided by the node agent that serves it (its --mps-gpus flag,
// usually set per node pool) and published in the inventory; a pod's mode is its
// AnnotationSharing annotation. The scheduler places a pod only on GPUs of its own
// mode, so the two kinds of tenant never share a GPU, and the node agent refuses a
// container whose mode differs from its GPU's.
type Sharing string

const (
	// SharingTimeSliced (the default) runs each container in its own CUDA context;
	// the GPU time-slices between contexts and the CUDA hook paces each container's
	// launches to its gpu-cores share.
	SharingTimeSliced Sharing = "time-sliced"
	// SharingMPS runs the containers of a GPU as clients of one NVIDIA MPS server,
	// whose kernels run concurrently; gpu-cores becomes the client's
	// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the share of the GPU's SMs it may use) and
	// the CUDA hook enforces memory only.
	SharingMPS Sharing = "mps"
)

// AnnotationSharing is the pod annotation that asks for a sharing mode: "mps" or
// "time-sliced" (the default when it is absent or empty).
const AnnotationSharing = DefaultDomain + "/gpu-sharing"

// AnnotationWorkConserving is the pod annotation that lets the pod's time-sliced
// containers use their GPU's idle time beyond their gpu-cores while no other
// container on the GPU has work: "true", or "false" (the default when it is absent or
// empty). Each container is held to its gpu-cores again as soon as another one has
// work (docs/cuda-hook.md, "Work-conserving"). Not with mps sharing, where MPS divides
// the SMs and nothing is paced.
const AnnotationWorkConserving = DefaultDomain + "/gpu-work-conserving"

// ParseWorkConserving parses the value of AnnotationWorkConserving; empty means false.
func ParseWorkConserving(s string) (bool, error) {
	switch strings.TrimSpace(s) {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, fmt.Errorf("annotation %s: %q is not true or false", AnnotationWorkConserving, s)
	}
}

// DefaultMPSClientLimit is how many client CUDA contexts one MPS server accepts on
// Volta and later GPUs. The scheduler counts one client per container: a container
// that runs several CUDA processes takes more, which is why a node agent may
// publish a lower limit.
const DefaultMPSClientLimit = 48

// MaxMPSClientLimit bounds the published client limit.
const MaxMPSClientLimit = 48

// ParseSharing parses the value of AnnotationSharing; empty means SharingTimeSliced.
func ParseSharing(s string) (Sharing, error) {
	switch m := Sharing(strings.TrimSpace(s)); m {
	case "":
		return SharingTimeSliced, nil
	case SharingTimeSliced, SharingMPS:
		return m, nil
	default:
		return "", fmt.Errorf("annotation %s: %q is not one of time-sliced, mps", AnnotationSharing, s)
	}
}

// PodSharing returns the sharing mode pod asks for.
func PodSharing(pod *corev1.Pod) (Sharing, error) {
	return ParseSharing(pod.Annotations[AnnotationSharing])
}

// Mode returns the GPU's sharing mode; an inventory without the field (an older
// agent) means time-sliced.
func (g *GPU) Mode() Sharing {
	if g.Sharing == "" {
		return SharingTimeSliced
	}
	return g.Sharing
}

// CheckMPSRequest checks what MPS cannot serve: one MPS client process talks to one
// MPS server, and Tessera runs one server per GPU, so each container of an MPS pod
// takes exactly one GPU.
func CheckMPSRequest(req PodRequest) error {
	for _, c := range req.Containers {
		if c.GPUs != 1 {
			return fmt.Errorf("container %q asks for %d GPUs, but a pod with %s: mps may take only one GPU per container "+
				"(each GPU has its own MPS server and a process can reach only one); use time-sliced sharing for multi-GPU containers",
				c.Name, c.GPUs, AnnotationSharing)
		}
	}
	return nil
}

func (g *GPU) validateSharing(p string) error {
	switch g.Sharing {
	case "", SharingTimeSliced:
		if g.MPSClients != 0 {
			return fmt.Errorf("%s: mpsClients %d is set on a GPU that is not in mps mode", p, g.MPSClients)
		}
	case SharingMPS:
		if g.MPSClients < 1 || g.MPSClients > MaxMPSClientLimit {
			return fmt.Errorf("%s: mpsClients %d out of range 1..%d", p, g.MPSClients, MaxMPSClientLimit)
		}
		if g.MIG != nil {
			return fmt.Errorf("%s: a GPU in MIG mode cannot be served in mps mode", p)
		}
	default:
		return fmt.Errorf("%s: sharing %q is not one of time-sliced, mps", p, g.Sharing)
	}
	return nil
}

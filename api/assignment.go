// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/json"
	"errors"
	"fmt"
)

// AssignmentVersion is the version of PodAssignment this package writes and reads.
const AssignmentVersion = 1

// PodAssignment is the scheduler's decision for one pod, written to the
// AnnotationAssignment annotation when the pod is bound (carried in the binding by
// default; merge-patched in PreBind under assignmentWrite: PreBind). It is the single source of truth that the
// scheduler rebuilds its cache from and that the node agent enforces.
type PodAssignment struct {
	// Version is AssignmentVersion.
	Version int `json:"version"`
	// Node is the node the pod was placed on; a consumer ignores an assignment whose
	// node differs from the pod's spec.nodeName.
	Node string `json:"node"`
	// Containers has one entry per GPU-requesting container.
	Containers []ContainerAssignment `json:"containers"`
}

// ContainerAssignment is what one container was granted.
type ContainerAssignment struct {
	// Name is the container's name.
	Name string `json:"name"`
	// Init is true for init containers.
	Init bool `json:"init,omitempty"`
	// Devices are the granted GPUs (or MIG instances), in the order the container sees them.
	Devices []DeviceGrant `json:"devices"`
}

// DeviceGrant is one GPU and the share of it granted.
type DeviceGrant struct {
	// UUID is the GPU's (or MIG instance's) UUID.
	UUID string `json:"uuid"`
	// Index is the GPU's NVML index on the node (the parent's for MIG instances).
	Index int `json:"index"`
	// MemoryMiB is the memory limit on this GPU.
	MemoryMiB int64 `json:"memoryMiB"`
	// Cores is the compute share in percent; 0 means none reserved and none enforced.
	Cores int `json:"cores,omitempty"`
}

// EncodeAssignment validates a and returns its annotation value.
func EncodeAssignment(a *PodAssignment) (string, error) {
	if err := a.Validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(a)
	if err != nil {
		return "", fmt.Errorf("encoding GPU assignment: %w", err)
	}
	return string(b), nil
}

// DecodeAssignment parses and validates an AnnotationAssignment value.
func DecodeAssignment(s string) (*PodAssignment, error) {
	if err := checkVersion(s, AssignmentVersion, "GPU assignment"); err != nil {
		return nil, err
	}
	var a PodAssignment
	if err := decodeStrict(s, &a); err != nil {
		return nil, fmt.Errorf("GPU assignment: %w", err)
	}
	if err := a.Validate(); err != nil {
		return nil, err
	}
	return &a, nil
}

// Validate checks: a supported version, a node, unique container names, at least one
// device per container, distinct devices within a container, sane shares.
func (a *PodAssignment) Validate() error {
	if a == nil {
		return errors.New("GPU assignment: missing")
	}
	if a.Version != AssignmentVersion {
		return fmt.Errorf("GPU assignment: version %d is not supported (want %d)", a.Version, AssignmentVersion)
	}
	if a.Node == "" {
		return errors.New("GPU assignment: node is empty")
	}
	if len(a.Containers) == 0 {
		return errors.New("GPU assignment: no containers")
	}
	names := map[string]bool{}
	for i, c := range a.Containers {
		p := fmt.Sprintf("GPU assignment: containers[%d]", i)
		if c.Name == "" {
			return fmt.Errorf("%s: name is empty", p)
		}
		if names[c.Name] {
			return fmt.Errorf("%s: container %q appears twice", p, c.Name)
		}
		names[c.Name] = true
		if len(c.Devices) == 0 || len(c.Devices) > MaxGPUsPerContainer {
			return fmt.Errorf("%s: %d devices, want 1..%d", p, len(c.Devices), MaxGPUsPerContainer)
		}
		uuids := map[string]bool{}
		for j, d := range c.Devices {
			dp := fmt.Sprintf("%s.devices[%d]", p, j)
			if err := checkUUID(d.UUID); err != nil {
				return fmt.Errorf("%s: %w", dp, err)
			}
			if uuids[d.UUID] {
				return fmt.Errorf("%s: uuid %q appears twice", dp, d.UUID)
			}
			uuids[d.UUID] = true
			if d.Index < 0 || d.Index >= MaxGPUsPerNode {
				return fmt.Errorf("%s: index %d out of range", dp, d.Index)
			}
			if d.MemoryMiB <= 0 || d.MemoryMiB > MaxMemoryMiB {
				return fmt.Errorf("%s: memoryMiB %d out of range", dp, d.MemoryMiB)
			}
			if d.Cores < 0 || d.Cores > 100 {
				return fmt.Errorf("%s: cores %d out of range 0..100", dp, d.Cores)
			}
		}
	}
	return nil
}

// Container returns the assignment of the named container, or nil.
func (a *PodAssignment) Container(name string) *ContainerAssignment {
	for i := range a.Containers {
		if a.Containers[i].Name == name {
			return &a.Containers[i]
		}
	}
	return nil
}

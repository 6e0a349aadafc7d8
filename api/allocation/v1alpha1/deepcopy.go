// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import "k8s.io/apimachinery/pkg/runtime"

// The copies are written out: the types are few and small, and a generator would be
// the package's only reason to need one.

// DeepCopyObject implements runtime.Object.
func (in *AllocationList) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopy returns a copy sharing no memory with in.
func (in *AllocationList) DeepCopy() *AllocationList {
	if in == nil {
		return nil
	}
	out := *in
	out.Items = copyEach(in.Items, (*NodeAllocation).DeepCopy)
	out.NodesWithoutInventory = copySlice(in.NodesWithoutInventory)
	out.PendingPods = copySlice(in.PendingPods)
	out.Problems = copySlice(in.Problems)
	return &out
}

// DeepCopy returns a copy sharing no memory with in.
func (in *NodeAllocation) DeepCopy() NodeAllocation {
	out := *in
	if in.Inventory.UpdatedAt != nil {
		out.Inventory.UpdatedAt = in.Inventory.UpdatedAt.DeepCopy()
	}
	out.NVLinkIslands = copySlice(in.NVLinkIslands)
	out.GPUs = copyEach(in.GPUs, (*GPUAllocation).DeepCopy)
	out.Warnings = copySlice(in.Warnings)
	return out
}

// DeepCopy returns a copy sharing no memory with in.
func (in *GPUAllocation) DeepCopy() GPUAllocation {
	out := *in
	out.Grants = copyEach(in.Grants, func(g *Grant) Grant { c := *g; c.GPUs = copySlice(g.GPUs); return c })
	return out
}

func copySlice[T any](in []T) []T {
	if in == nil {
		return nil
	}
	return append(make([]T, 0, len(in)), in...)
}

func copyEach[T any](in []T, deepCopy func(*T) T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i := range in {
		out[i] = deepCopy(&in[i])
	}
	return out
}

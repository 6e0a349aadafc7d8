// SPDX-License-Identifier: Apache-2.0

// Package v1alpha1 is the machine-readable form of `kubectl tessera allocation`
// (-o json, yaml, jsonpath, go-template): Tessera's GPU allocation as the API shows it,
// computed by the client from the nodes' inventory and the pods' assignment annotations.
// It is an output format, not a resource any API server serves.
//
// Within v1alpha1 fields may be added; none is renamed, removed or changes meaning.
// Quantities carry their unit in the name (MiB, percent of one GPU's compute).
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the group of the apiVersion printed with the view.
const GroupName = "allocation.tessera.dev"

// SchemeGroupVersion is the apiVersion printed with the view.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Kind of the view.
const KindAllocationList = "AllocationList"

// AllocationList is the GPU allocation of a cluster, or of one namespace's pods.
type AllocationList struct {
	metav1.TypeMeta `json:",inline"`

	// Namespace is the namespace whose pods are counted; empty when every namespace's
	// are. With a namespace, grants and sums cover that namespace's pods only, and
	// Items lists only the nodes where they hold GPUs (or the nodes asked for).
	Namespace string `json:"namespace,omitempty"`

	// Items are the nodes with a GPU inventory (or with GPU pods bound to them), by name.
	Items []NodeAllocation `json:"items"`

	// NodesWithoutInventory are the nodes that publish no GPU inventory and hold no GPU
	// pods: nodes without GPUs, or without a running Tessera node agent.
	NodesWithoutInventory []string `json:"nodesWithoutInventory,omitempty"`

	// PendingPods are the GPU pods not bound to a node, by namespace and name.
	PendingPods []PendingPod `json:"pendingPods"`

	// Problems are pods whose GPU use the view cannot account for: bound without an
	// assignment (nothing limits them), or with an assignment that does not decode or
	// names another node.
	Problems []string `json:"problems,omitempty"`

	// Summary adds up Items.
	Summary Summary `json:"summary"`
}

// NodeAllocation is one node's GPUs and what is granted on each.
type NodeAllocation struct {
	Name string `json:"name"`
	// Ready is the node's Ready condition.
	Ready bool `json:"ready"`
	// Inventory is the state of the node's tessera.dev/gpu-inventory annotation.
	Inventory InventoryStatus `json:"inventory"`
	// NVLinkIslands are the groups of GPUs joined by NVLink, as index ranges ("0-3");
	// empty when no GPU has NVLink.
	NVLinkIslands []string `json:"nvlinkIslands,omitempty"`
	// GPUs are the schedulable units: whole GPUs, and the instances of GPUs in MIG mode.
	GPUs []GPUAllocation `json:"gpus"`
	// Warnings are grants to pods bound here that name a device the inventory lacks.
	Warnings []string `json:"warnings,omitempty"`
}

// InventoryStatus says whether the scheduler can place pods on the node's GPUs.
type InventoryStatus struct {
	// UpdatedAt is the agent's last confirmation of the inventory; absent when there
	// is no valid inventory.
	UpdatedAt *metav1.Time `json:"updatedAt,omitempty"`
	// Stale is true when UpdatedAt is older than the staleness limit the view was
	// computed with (--stale-after): the scheduler places no new GPU pods here.
	Stale bool `json:"stale"`
	// Error says why there is no valid inventory (missing or undecodable).
	Error string `json:"error,omitempty"`
}

// GPUAllocation is one whole GPU, or one MIG instance.
type GPUAllocation struct {
	// ID names the unit on its node: the GPU index ("3"), or for a MIG instance the
	// GPU index, profile and instance number ("0/1g.10gb#1").
	ID string `json:"id"`
	// Index is the NVML index of the GPU (of the instance's GPU for MIG).
	Index int `json:"index"`
	// MIGProfile is set for MIG instances.
	MIGProfile string `json:"migProfile,omitempty"`
	UUID       string `json:"uuid"`
	Model      string `json:"model"`
	MemoryMiB  int64  `json:"memoryMiB"`
	// MemoryGrantedMiB and CoresGranted (percent of the unit's compute) add up Grants.
	MemoryGrantedMiB int64  `json:"memoryGrantedMiB"`
	CoresGranted     int    `json:"coresGranted"`
	Healthy          bool   `json:"healthy"`
	HealthReason     string `json:"healthReason,omitempty"`
	// Grants are the containers holding a share of the unit.
	Grants []Grant `json:"grants"`
}

// Grant is one container's share of one GPU.
type Grant struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	MemoryMiB int64  `json:"memoryMiB"`
	// Cores is the percent of the GPU's compute; 0 when the container has no compute limit.
	Cores int `json:"cores"`
	// GPUs are the IDs of every unit the container holds on the node, this one included.
	GPUs []string `json:"gpus"`
	// Terminating is true while the pod is being deleted: the grant is still held.
	Terminating bool `json:"terminating,omitempty"`
}

// PendingPod is a GPU pod that no scheduler has bound.
type PendingPod struct {
	Namespace     string `json:"namespace"`
	Name          string `json:"name"`
	SchedulerName string `json:"schedulerName"`
	// Request is the pod's GPU request as the scheduler reads it, e.g.
	// "1 GPU × 8192 MiB, 30% cores", or "invalid request".
	Request string `json:"request"`
	// Reason is the scheduler's PodScheduled message, else its newest FailedScheduling
	// event, else a note that no scheduler has seen the pod.
	Reason string `json:"reason"`
}

// Summary adds up the units of Items.
type Summary struct {
	// GPUs counts units: whole GPUs and MIG instances.
	GPUs             int   `json:"gpus"`
	GPUsHoldingPods  int   `json:"gpusHoldingPods"`
	MemoryMiB        int64 `json:"memoryMiB"`
	MemoryGrantedMiB int64 `json:"memoryGrantedMiB"`
	// CoresGranted is the sum of the units' CoresGranted, out of 100 per unit.
	CoresGranted int `json:"coresGranted"`
	// MIG is true when some unit is a MIG instance.
	MIG bool `json:"mig,omitempty"`
}

// NewAllocationList returns an empty list with its apiVersion and kind set.
func NewAllocationList() *AllocationList {
	return &AllocationList{TypeMeta: metav1.TypeMeta{APIVersion: SchemeGroupVersion.String(), Kind: KindAllocationList}}
}

var _ runtime.Object = &AllocationList{}

// SPDX-License-Identifier: Apache-2.0

// Package gpu is the node agent's view of the GPUs of its node: a small interface that
// the agent owns, implemented by NVML (package nvmlsource) and by a simulated topology
// read from a file (package simsource). Everything else in the agent depends only on
// this package, so tests can use go-nvml's mocks or a simulated node.
package gpu

import (
	"context"
	"errors"

	"github.com/tessera-dev/tessera/api"
)

// Source reads the GPUs of one node.
type Source interface {
	// Inventory returns every GPU of the node as the wire contract describes it. Its
	// UpdatedAt is left zero: the publisher stamps it. An error means no inventory
	// can be produced at all (the driver is gone); a single failed GPU is reported as
	// unhealthy instead.
	Inventory() (*api.NodeInventory, error)
	// Devices returns the host device facts the container binding needs.
	Devices() ([]Device, error)
	// Usage returns device-wide and per-process usage of every GPU.
	Usage() (*Usage, error)
	// WatchHealth reports health changes until ctx is done. Sources that cannot
	// observe health events return nil at once.
	WatchHealth(ctx context.Context, report func(HealthEvent)) error
	// Close releases the source.
	Close() error
}

// Device is a GPU (or MIG instance) as the host sees it.
type Device struct {
	// UUID is the GPU's or MIG instance's UUID.
	UUID string
	// Index is the NVML index (the parent's for a MIG instance).
	Index int
	// Minor is the minor number of /dev/nvidia<Minor>; -1 when unknown.
	Minor int
	// ParentUUID is set for a MIG instance.
	ParentUUID string
	// MIG holds a MIG instance's GPU and compute instance IDs, which name its
	// capability device nodes; nil for a whole GPU, and for a MIG instance whose IDs
	// could not be read (such an instance cannot be bound).
	MIG *MIGIDs
}

// MIGIDs identify a MIG instance on its parent GPU.
type MIGIDs struct {
	GPUInstance, ComputeInstance int
}

// Usage is a sample of what is running on the GPUs.
type Usage struct {
	GPUs      []GPUUsage
	Processes []ProcessUsage
}

// GPUUsage is device-wide usage of one GPU.
type GPUUsage struct {
	UUID          string
	Index         int
	UsedMemoryMiB int64
	// UtilPercent is the GPU's core utilisation over NVML's last sample period; -1
	// when NVML cannot say.
	UtilPercent int
}

// ProcessUsage is one process's use of one GPU.
type ProcessUsage struct {
	// PID is the process id in the host PID namespace.
	PID int
	// GPUUUID is the GPU (or MIG instance) the process uses.
	GPUUUID string
	// UsedMemoryMiB is device memory the process holds on that GPU.
	UsedMemoryMiB int64
	// SMPercent is the process's share of the GPU's SMs; -1 when unknown.
	SMPercent int
	// MPSClient is set for a process whose CUDA work runs in the GPU's MPS server
	// (NVML lists it among the MPS compute processes).
	MPSClient bool
}

// HealthEvent changes the health of one GPU.
type HealthEvent struct {
	UUID    string
	Healthy bool
	Reason  string
}

// ErrUnavailable is returned when the GPU library or the device cannot be reached.
var ErrUnavailable = errors.New("GPU source unavailable")

// MiB converts bytes to MiB, rounding down.
func MiB(bytes uint64) int64 { return int64(bytes >> 20) }

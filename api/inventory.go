// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// InventoryVersion is the version of NodeInventory this package writes and reads.
const InventoryVersion = 1

// MaxAnnotationBytes bounds any annotation this package decodes. Kubernetes caps all
// annotations of an object at 256 KiB together.
const MaxAnnotationBytes = 256 << 10

// NodeInventory is the GPU inventory of one node, published by the node agent in
// the AnnotationInventory annotation of its Node.
type NodeInventory struct {
	// Version is InventoryVersion.
	Version int `json:"version"`
	// UpdatedAt is when the agent last confirmed the inventory (its heartbeat). The
	// scheduler treats an inventory older than its staleness limit as unusable.
	UpdatedAt time.Time `json:"updatedAt"`
	// Driver is the NVIDIA driver version, informational.
	Driver string `json:"driver,omitempty"`
	// GPUs is every GPU of the node, healthy or not, ordered by Index.
	GPUs []GPU `json:"gpus"`
	// ContextMiB is what the node's CUDA hook charges against a container's memory
	// on a GPU for each process's CUDA context (the node agent's --context-mib), set
	// only when it is not DefaultContextMiB: absent, the charge is the default (see
	// ContextCharge). The scheduler places no container whose memory on a GPU is
	// below the charge there, since none of its processes could create a context.
	ContextMiB int64 `json:"contextMiB,omitempty"`
	// DRA is set when the node's agent serves its GPUs through DRA (ResourceClaims of
	// the driver gpu.tessera.dev) rather than the device plugin: kubelet there has no
	// tessera.dev/* resources, so the scheduler places no pod that asks for them on
	// the node; the inventory still describes the GPUs for claim placement.
	DRA bool `json:"dra,omitempty"`
}

// ContextCharge is the node's charge per plain CUDA context: ContextMiB, or
// DefaultContextMiB when the inventory does not say.
func (inv *NodeInventory) ContextCharge() int64 {
	if inv.ContextMiB == 0 {
		return DefaultContextMiB
	}
	return inv.ContextMiB
}

// GPU is one physical GPU.
type GPU struct {
	// Index is the NVML index, 0-based, unique on the node.
	Index int `json:"index"`
	// UUID is the NVML UUID ("GPU-…"), unique on the node.
	UUID string `json:"uuid"`
	// Model is the NVML name, e.g. "NVIDIA H100 80GB HBM3".
	Model string `json:"model"`
	// MemoryMiB is the total device memory.
	MemoryMiB int64 `json:"memoryMiB"`
	// SMCount is the number of streaming multiprocessors (0 when unknown).
	SMCount int `json:"smCount,omitempty"`
	// NUMANode is the host NUMA node the GPU is attached to; -1 when unknown.
	NUMANode int `json:"numaNode"`
	// PCIBusID is the PCI address, e.g. "0000:18:00.0".
	PCIBusID string `json:"pciBusID,omitempty"`
	// Healthy is false after critical XID errors or when the device is lost.
	Healthy bool `json:"healthy"`
	// HealthReason says why a GPU is unhealthy.
	HealthReason string `json:"healthReason,omitempty"`
	// MIG is set when the GPU is in MIG mode; its instances are then the schedulable
	// units instead of the whole GPU.
	MIG *MIG `json:"mig,omitempty"`
	// Links is the connection to every other GPU of the node, as NVML reports it.
	Links []Link `json:"links,omitempty"`
	// Sharing is the GPU's sharing mode; empty means SharingTimeSliced (see Mode).
	Sharing Sharing `json:"sharing,omitempty"`
	// MPSClients is how many MPS clients (containers) the GPU's MPS server takes;
	// set only in mps mode.
	MPSClients int `json:"mpsClients,omitempty"`
	// MemoryFence is the fence below the process that holds a container's memory on
	// this GPU: MemoryFenceDriver where the driver limits each container's cgroup,
	// empty where only the CUDA hook and the node agent's watchdog do.
	MemoryFence MemoryFence `json:"memoryFence,omitempty"`
}

// MemoryFence names the fence below the process that holds a GPU's memory grants.
type MemoryFence string

// MemoryFenceDriver is the NVIDIA driver's per-cgroup memory limit
// (nvmlDeviceSetMemoryLimits_v1; drivers r615 and later, cgroup v2, whole GPUs): the
// node agent sets each GPU container's grant as its cgroup's hard limit before the
// container's first process runs, so an allocation past the grant fails in the driver
// whether or not the process loaded the CUDA hook.
const MemoryFenceDriver MemoryFence = "driver"

// MIG describes a GPU in MIG mode.
type MIG struct {
	// Instances are the GPU instances that exist on the GPU.
	Instances []MIGInstance `json:"instances"`
}

// MIGInstance is one MIG GPU instance, schedulable like a small GPU.
type MIGInstance struct {
	// UUID is the MIG device UUID ("MIG-…").
	UUID string `json:"uuid"`
	// Profile is the MIG profile name, e.g. "1g.10gb".
	Profile string `json:"profile"`
	// MemoryMiB is the instance's memory.
	MemoryMiB int64 `json:"memoryMiB"`
	// SMCount is the instance's SM count.
	SMCount int `json:"smCount,omitempty"`
}

// PCIeLevel is how two GPUs are joined over PCIe, from nearest to farthest; it
// mirrors nvmlGpuTopologyLevel_t.
type PCIeLevel string

const (
	PCIeInternal    PCIeLevel = "internal"     // same board (multi-GPU card)
	PCIeSingle      PCIeLevel = "single"       // one PCIe switch between them
	PCIeMultiple    PCIeLevel = "multiple"     // several PCIe switches, no host bridge
	PCIeHostBridge  PCIeLevel = "host-bridge"  // the same host bridge
	PCIeNUMA        PCIeLevel = "numa"         // host bridges on the same NUMA node
	PCIeCrossSocket PCIeLevel = "cross-socket" // across the CPU interconnect
)

// Rank orders levels from nearest (0) to farthest; unknown levels rank farthest.
func (l PCIeLevel) Rank() int {
	switch l {
	case PCIeInternal:
		return 0
	case PCIeSingle:
		return 1
	case PCIeMultiple:
		return 2
	case PCIeHostBridge:
		return 3
	case PCIeNUMA:
		return 4
	default:
		return 5
	}
}

func (l PCIeLevel) valid() bool {
	switch l {
	case PCIeInternal, PCIeSingle, PCIeMultiple, PCIeHostBridge, PCIeNUMA, PCIeCrossSocket:
		return true
	}
	return false
}

// Link is the connection from a GPU to one peer GPU.
type Link struct {
	// Peer is the peer's Index.
	Peer int `json:"peer"`
	// NVLinks is the number of active NVLinks joining the two (0: none).
	NVLinks int `json:"nvlinks,omitempty"`
	// PCIe is their common PCIe ancestor.
	PCIe PCIeLevel `json:"pcie"`
}

// EncodeInventory validates inv and returns its annotation value.
func EncodeInventory(inv *NodeInventory) (string, error) {
	if err := inv.Validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(inv)
	if err != nil {
		return "", fmt.Errorf("encoding GPU inventory: %w", err)
	}
	return string(b), nil
}

// DecodeInventory parses and validates an AnnotationInventory value.
func DecodeInventory(s string) (*NodeInventory, error) {
	if err := checkVersion(s, InventoryVersion, "GPU inventory"); err != nil {
		return nil, err
	}
	var inv NodeInventory
	if err := decodeStrict(s, &inv); err != nil {
		return nil, fmt.Errorf("GPU inventory: %w", err)
	}
	if err := inv.Validate(); err != nil {
		return nil, err
	}
	return &inv, nil
}

// MaxGPUsPerNode bounds the inventory size; no server has more GPUs than this.
const MaxGPUsPerNode = 256

// Validate checks the invariants consumers rely on: a supported version, unique
// indexes and UUIDs, positive memory, links that name real peers, MIG instances that
// fit their GPU.
func (inv *NodeInventory) Validate() error {
	if inv == nil {
		return errors.New("GPU inventory: missing")
	}
	if inv.Version != InventoryVersion {
		return fmt.Errorf("GPU inventory: version %d is not supported (want %d)", inv.Version, InventoryVersion)
	}
	if inv.ContextMiB < 0 || inv.ContextMiB > MaxContextMiB {
		return fmt.Errorf("GPU inventory: contextMiB %d out of range 0..%d", inv.ContextMiB, MaxContextMiB)
	}
	if len(inv.GPUs) > MaxGPUsPerNode {
		return fmt.Errorf("GPU inventory: %d GPUs, more than the supported %d", len(inv.GPUs), MaxGPUsPerNode)
	}
	indexes := make(map[int]bool, len(inv.GPUs))
	uuids := make(map[string]bool, len(inv.GPUs))
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		p := fmt.Sprintf("GPU inventory: gpus[%d]", i)
		if g.Index < 0 || g.Index >= MaxGPUsPerNode {
			return fmt.Errorf("%s: index %d out of range", p, g.Index)
		}
		if indexes[g.Index] {
			return fmt.Errorf("%s: index %d appears twice", p, g.Index)
		}
		indexes[g.Index] = true
		if err := checkUUID(g.UUID); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if uuids[g.UUID] {
			return fmt.Errorf("%s: uuid %q appears twice", p, g.UUID)
		}
		uuids[g.UUID] = true
		if g.MemoryMiB <= 0 || g.MemoryMiB > MaxMemoryMiB {
			return fmt.Errorf("%s: memoryMiB %d out of range", p, g.MemoryMiB)
		}
		if g.SMCount < 0 {
			return fmt.Errorf("%s: smCount %d is negative", p, g.SMCount)
		}
		if g.NUMANode < -1 {
			return fmt.Errorf("%s: numaNode %d out of range (-1 means unknown)", p, g.NUMANode)
		}
		if err := g.validateSharing(p); err != nil {
			return err
		}
		switch {
		case g.MemoryFence != "" && g.MemoryFence != MemoryFenceDriver:
			return fmt.Errorf("%s: memoryFence %q is not %q (or absent)", p, g.MemoryFence, MemoryFenceDriver)
		case g.MemoryFence != "" && g.MIG != nil:
			return fmt.Errorf("%s: memoryFence %q on a MIG-mode GPU: the driver's limit takes no MIG instance", p, g.MemoryFence)
		}
		if g.MIG != nil {
			var total int64
			for j, m := range g.MIG.Instances {
				mp := fmt.Sprintf("%s.mig.instances[%d]", p, j)
				if err := checkUUID(m.UUID); err != nil {
					return fmt.Errorf("%s: %w", mp, err)
				}
				if uuids[m.UUID] {
					return fmt.Errorf("%s: uuid %q appears twice", mp, m.UUID)
				}
				uuids[m.UUID] = true
				if m.MemoryMiB <= 0 {
					return fmt.Errorf("%s: memoryMiB %d must be positive", mp, m.MemoryMiB)
				}
				total += m.MemoryMiB
				if total > g.MemoryMiB {
					return fmt.Errorf("%s: instances hold more memory than the GPU's %d MiB", mp, g.MemoryMiB)
				}
			}
		}
	}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		peers := map[int]bool{}
		for j, l := range g.Links {
			p := fmt.Sprintf("GPU inventory: gpus[%d].links[%d]", i, j)
			if !indexes[l.Peer] || l.Peer == g.Index {
				return fmt.Errorf("%s: peer %d is not another GPU of the node", p, l.Peer)
			}
			if peers[l.Peer] {
				return fmt.Errorf("%s: peer %d appears twice", p, l.Peer)
			}
			peers[l.Peer] = true
			if l.NVLinks < 0 || l.NVLinks > 64 {
				return fmt.Errorf("%s: nvlinks %d out of range", p, l.NVLinks)
			}
			if !l.PCIe.valid() {
				return fmt.Errorf("%s: pcie %q is not one of internal, single, multiple, host-bridge, numa, cross-socket", p, l.PCIe)
			}
		}
	}
	return nil
}

// Age returns how long ago the inventory was confirmed.
func (inv *NodeInventory) Age(now time.Time) time.Duration { return now.Sub(inv.UpdatedAt) }

func checkUUID(u string) error {
	if u == "" {
		return errors.New("uuid is empty")
	}
	if len(u) > 128 || strings.ContainsAny(u, ", \t\n\"") {
		return fmt.Errorf("uuid %q is malformed", u)
	}
	return nil
}

// checkVersion reads only the "version" field first so that a newer format gets a
// clear "unsupported version" error rather than a confusing field error.
func checkVersion(s string, want int, what string) error {
	if len(s) == 0 {
		return fmt.Errorf("%s: empty annotation", what)
	}
	if len(s) > MaxAnnotationBytes {
		return fmt.Errorf("%s: annotation is %d bytes, more than %d", what, len(s), MaxAnnotationBytes)
	}
	var v struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return fmt.Errorf("%s: not valid JSON: %w", what, err)
	}
	if v.Version == nil {
		return fmt.Errorf("%s: no version field", what)
	}
	if *v.Version != want {
		return fmt.Errorf("%s: version %d is not supported (want %d)", what, *v.Version, want)
	}
	return nil
}

func decodeStrict(s string, into any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// SPDX-License-Identifier: Apache-2.0

// Package simsource implements gpu.Source from a YAML description of a node's GPUs, so
// that agents for simulated nodes run on any machine: CI, a laptop, a local cluster of
// simulated nodes. The file is re-read on every call, so editing it (marking a GPU
// unhealthy, adding MIG instances) is seen at the next refresh. A file that stops
// parsing is an error, as NVML failing would be: the agent stops confirming the
// inventory and the scheduler sees it go stale, rather than trusting old data.
package simsource

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"sort"

	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// FileVersion is the version of the simulated topology format.
const FileVersion = 1

// Topology is the file format.
//
//	version: 1
//	driver: "580.65.06"
//	gpus:
//	- model: NVIDIA H100 80GB HBM3
//	  count: 4              # this entry stands for 4 identical GPUs
//	  memoryMiB: 81559
//	  smCount: 132
//	  numaNode: 0
//	  nvlinkDomain: a       # GPUs of one domain are all NVLink-joined
//	  nvlinks: 18           # links between each pair in the domain
//	  pcieSwitch: sw0       # GPUs behind one switch are PCIe "single"
//	memoryFence: true       # the driver limits cgroups' memory (r615 and later)
type Topology struct {
	Version int    `json:"version"`
	Driver  string `json:"driver,omitempty"`
	// MemoryFence gives the simulated driver the per-cgroup memory limit
	// (nvmlDeviceSetMemoryLimits_v1) on its whole GPUs, kept in a gpu.CgroupMemory.
	MemoryFence bool `json:"memoryFence,omitempty"`
	// Processes are simulated GPU processes, for exercising the usage watchdog.
	Processes []Process `json:"processes,omitempty"`
	GPUs      []GPUSpec `json:"gpus"`
}

// GPUSpec describes Count identical GPUs.
type GPUSpec struct {
	Count     int    `json:"count,omitempty"`
	Model     string `json:"model"`
	MemoryMiB int64  `json:"memoryMiB"`
	SMCount   int    `json:"smCount,omitempty"`
	// NUMANode defaults to 0; -1 means unknown.
	NUMANode *int `json:"numaNode,omitempty"`
	// NVLinkDomain groups GPUs joined all-to-all by NVLinks links each; empty: none.
	NVLinkDomain string `json:"nvlinkDomain,omitempty"`
	NVLinks      int    `json:"nvlinks,omitempty"`
	// PCIeSwitch groups GPUs behind one PCIe switch; empty: a switch of their own.
	PCIeSwitch string `json:"pcieSwitch,omitempty"`
	// UUIDs overrides the generated UUIDs (one per GPU of the entry).
	UUIDs []string `json:"uuids,omitempty"`
	// Unhealthy marks the entry's GPUs unhealthy with this reason.
	Unhealthy string `json:"unhealthy,omitempty"`
	// MIG lists MIG instances created on each GPU of the entry; set: MIG mode.
	MIG []MIGSpec `json:"mig,omitempty"`
}

// MIGSpec is Count MIG instances of one profile.
type MIGSpec struct {
	Profile   string `json:"profile"`
	Count     int    `json:"count,omitempty"`
	MemoryMiB int64  `json:"memoryMiB"`
	SMCount   int    `json:"smCount,omitempty"`
}

// Process is a simulated process using a GPU.
type Process struct {
	PID           int    `json:"pid"`
	GPU           int    `json:"gpu"`
	UsedMemoryMiB int64  `json:"usedMemoryMiB"`
	SMPercent     int    `json:"smPercent,omitempty"`
	MIGInstance   string `json:"migUUID,omitempty"`
}

// Source is a simulated node.
type Source struct {
	path string
	// seed makes generated UUIDs stable per node and distinct across nodes that share
	// one file: the scheduler's assignments name UUIDs and must stay valid across
	// agent restarts.
	seed string
	// mem holds the cgroups' memory limits of the GPUs the file had at start.
	mem *gpu.CgroupMemory
}

type built struct {
	inv     *api.NodeInventory
	devices []gpu.Device
	usage   *gpu.Usage
	fence   bool
}

var (
	_ gpu.Source      = (*Source)(nil)
	_ gpu.MemoryFence = (*Source)(nil)
)

// New reads path once, failing on any error so that a wrong file is caught at start.
func New(path, seed string) (*Source, error) {
	s := &Source{path: path, seed: seed}
	b, err := s.load()
	if err != nil {
		return nil, err
	}
	total := map[string]uint64{}
	for _, g := range b.inv.GPUs {
		if g.MIG == nil {
			total[g.UUID] = uint64(g.MemoryMiB) << 20
		}
	}
	s.mem = gpu.NewCgroupMemory(total, func(dir string) bool {
		st, err := os.Stat(dir)
		return err == nil && st.IsDir()
	})
	return s, nil
}

// Parse parses and checks a topology description and builds the node it describes.
func Parse(data []byte, seed string) (*api.NodeInventory, []gpu.Device, *gpu.Usage, error) {
	var t Topology
	if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return nil, nil, nil, fmt.Errorf("simulated topology: %w", err)
	}
	b, err := build(&t, seed)
	if err != nil {
		return nil, nil, nil, err
	}
	return b.inv, b.devices, b.usage, nil
}

func (s *Source) load() (*built, error) {
	data, err := os.ReadFile(s.path)
	if err != nil {
		return nil, err
	}
	inv, devs, usage, err := Parse(data, s.seed)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.path, err)
	}
	var t struct {
		MemoryFence bool `json:"memoryFence"`
	}
	_ = yaml.Unmarshal(data, &t) // Parse has checked the file
	return &built{inv: inv, devices: devs, usage: usage, fence: t.MemoryFence}, nil
}

type gpuEntry struct {
	spec *GPUSpec
	uuid string
}

func build(t *Topology, seed string) (*built, error) {
	if t.Version != FileVersion {
		return nil, fmt.Errorf("simulated topology: version %d is not supported (want %d)", t.Version, FileVersion)
	}
	if len(t.GPUs) == 0 {
		return nil, errors.New("simulated topology: no gpus")
	}
	var entries []gpuEntry
	for i := range t.GPUs {
		g := &t.GPUs[i]
		p := fmt.Sprintf("simulated topology: gpus[%d]", i)
		n := g.Count
		if n == 0 {
			n = 1
		}
		if n < 0 || len(entries)+n > api.MaxGPUsPerNode {
			return nil, fmt.Errorf("%s: count %d out of range", p, g.Count)
		}
		if g.Model == "" {
			return nil, fmt.Errorf("%s: model is empty", p)
		}
		if g.NVLinkDomain != "" && g.NVLinks <= 0 {
			return nil, fmt.Errorf("%s: nvlinkDomain %q needs nvlinks > 0", p, g.NVLinkDomain)
		}
		if g.NVLinkDomain == "" && g.NVLinks != 0 {
			return nil, fmt.Errorf("%s: nvlinks set without nvlinkDomain", p)
		}
		if len(g.UUIDs) != 0 && len(g.UUIDs) != n {
			return nil, fmt.Errorf("%s: %d uuids for %d GPUs", p, len(g.UUIDs), n)
		}
		for k := 0; k < n; k++ {
			idx := len(entries)
			uuid := genUUID("GPU", seed, idx, "")
			if len(g.UUIDs) != 0 {
				uuid = g.UUIDs[k]
			}
			entries = append(entries, gpuEntry{spec: g, uuid: uuid})
		}
	}
	b := &built{inv: &api.NodeInventory{Version: api.InventoryVersion, Driver: t.Driver}, usage: &gpu.Usage{}}
	for idx, e := range entries {
		g := e.spec
		numa := 0
		if g.NUMANode != nil {
			numa = *g.NUMANode
		}
		out := api.GPU{
			Index: idx, UUID: e.uuid, Model: g.Model, MemoryMiB: g.MemoryMiB, SMCount: g.SMCount,
			NUMANode: numa, PCIBusID: fmt.Sprintf("%04x:%02x:00.0", idx/8, 0x18+(idx%8)*0x10), Healthy: g.Unhealthy == "",
			HealthReason: g.Unhealthy,
		}
		if len(g.MIG) > 0 {
			out.MIG = &api.MIG{Instances: []api.MIGInstance{}}
			for _, m := range g.MIG {
				c := m.Count
				if c == 0 {
					c = 1
				}
				if m.Profile == "" || c < 0 || c > 8 {
					return nil, fmt.Errorf("simulated topology: GPU %d: MIG profile %q count %d invalid", idx, m.Profile, m.Count)
				}
				for k := 0; k < c; k++ {
					mu := genUUID("MIG", seed, idx, fmt.Sprintf("%s/%d", m.Profile, len(out.MIG.Instances)))
					out.MIG.Instances = append(out.MIG.Instances, api.MIGInstance{UUID: mu, Profile: m.Profile, MemoryMiB: m.MemoryMiB, SMCount: m.SMCount})
					b.devices = append(b.devices, gpu.Device{UUID: mu, Index: idx, Minor: idx, ParentUUID: e.uuid})
				}
			}
		}
		for p, pe := range entries {
			if p == idx {
				continue
			}
			out.Links = append(out.Links, link(g, pe.spec, p, numa))
		}
		b.inv.GPUs = append(b.inv.GPUs, out)
		b.devices = append(b.devices, gpu.Device{UUID: e.uuid, Index: idx, Minor: idx})
		b.usage.GPUs = append(b.usage.GPUs, gpu.GPUUsage{UUID: e.uuid, Index: idx, UtilPercent: 0})
	}
	sort.SliceStable(b.devices, func(i, j int) bool { return b.devices[i].Index < b.devices[j].Index })
	if err := b.inv.Validate(); err != nil {
		return nil, fmt.Errorf("simulated topology: %w", err)
	}
	for i, p := range t.Processes {
		if p.GPU < 0 || p.GPU >= len(entries) || p.PID <= 0 || p.UsedMemoryMiB < 0 {
			return nil, fmt.Errorf("simulated topology: processes[%d]: pid %d on gpu %d is invalid", i, p.PID, p.GPU)
		}
		uuid := entries[p.GPU].uuid
		if p.MIGInstance != "" {
			uuid = p.MIGInstance
		}
		b.usage.Processes = append(b.usage.Processes, gpu.ProcessUsage{PID: p.PID, GPUUUID: uuid, UsedMemoryMiB: p.UsedMemoryMiB, SMPercent: p.SMPercent})
		b.usage.GPUs[p.GPU].UsedMemoryMiB += p.UsedMemoryMiB
		b.usage.GPUs[p.GPU].UtilPercent += p.SMPercent
	}
	return b, nil
}

func link(a, b *GPUSpec, peer, numaA int) api.Link {
	l := api.Link{Peer: peer, PCIe: api.PCIeCrossSocket}
	if a.NVLinkDomain != "" && a.NVLinkDomain == b.NVLinkDomain {
		l.NVLinks = a.NVLinks
		if b.NVLinks < l.NVLinks {
			l.NVLinks = b.NVLinks
		}
	}
	numaB := 0
	if b.NUMANode != nil {
		numaB = *b.NUMANode
	}
	switch {
	case a.PCIeSwitch != "" && a.PCIeSwitch == b.PCIeSwitch:
		l.PCIe = api.PCIeSingle
	case numaA == numaB && numaA >= 0:
		l.PCIe = api.PCIeNUMA
	}
	return l
}

// genUUID derives a UUID-shaped id from the node seed and the GPU's position.
func genUUID(prefix, seed string, idx int, extra string) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("tessera-sim/%s/%d/%s", seed, idx, extra)))
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", prefix, h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// Inventory re-reads the file.
func (s *Source) Inventory() (*api.NodeInventory, error) {
	b, err := s.load()
	if err != nil {
		return nil, err
	}
	return b.inv, nil
}

// Devices returns the simulated GPUs; their minor numbers equal their indexes.
func (s *Source) Devices() ([]gpu.Device, error) {
	b, err := s.load()
	if err != nil {
		return nil, err
	}
	return b.devices, nil
}

// Usage returns the simulated processes.
func (s *Source) Usage() (*gpu.Usage, error) {
	b, err := s.load()
	if err != nil {
		return nil, err
	}
	return b.usage, nil
}

// WatchHealth returns at once: health changes of a simulated node come from edits of
// its file, which Inventory reads.
func (s *Source) WatchHealth(ctx context.Context, report func(gpu.HealthEvent)) error { return nil }

// Close does nothing.
func (s *Source) Close() error { return nil }

// Memory is the simulated driver's memory per cgroup, for tests: allocations made
// through it are held to the limits the agent sets.
func (s *Source) Memory() *gpu.CgroupMemory { return s.mem }

// fenceGPU says why the simulated driver has no memory limit on a GPU, or "".
func fenceGPU(b *built, uuid string) string {
	if !b.fence {
		return "the simulated driver has no per-cgroup memory limit (memoryFence is not set in its topology)"
	}
	for _, g := range b.inv.GPUs {
		if g.UUID == uuid {
			if g.MIG != nil {
				return "MIG mode (the driver's limit takes no MIG instance; MIG partitions memory itself)"
			}
			return ""
		}
	}
	return "no such whole GPU"
}

// FenceSupport reports the file's whole GPUs as supported when it sets memoryFence.
func (s *Source) FenceSupport(string) ([]gpu.FenceSupport, error) {
	b, err := s.load()
	if err != nil {
		return nil, err
	}
	out := make([]gpu.FenceSupport, 0, len(b.inv.GPUs))
	for _, g := range b.inv.GPUs {
		why := fenceGPU(b, g.UUID)
		out = append(out, gpu.FenceSupport{UUID: g.UUID, Supported: why == "", Reason: why})
	}
	return out, nil
}

// SetMemoryLimit sets a cgroup's limit in the simulated driver.
func (s *Source) SetMemoryLimit(uuid, dir string, soft, hard uint64) error {
	b, err := s.load()
	if err != nil {
		return err
	}
	if why := fenceGPU(b, uuid); why != "" {
		return fmt.Errorf("GPU %s: %s: %w", uuid, why, gpu.ErrFenceUnsupported)
	}
	return s.mem.SetMemoryLimit(uuid, dir, soft, hard)
}

// MemoryLimit reads a cgroup's limit in the simulated driver.
func (s *Source) MemoryLimit(uuid, dir string) (gpu.MemoryLimit, error) {
	b, err := s.load()
	if err != nil {
		return gpu.MemoryLimit{}, err
	}
	if why := fenceGPU(b, uuid); why != "" {
		return gpu.MemoryLimit{}, fmt.Errorf("GPU %s: %s: %w", uuid, why, gpu.ErrFenceUnsupported)
	}
	return s.mem.MemoryLimit(uuid, dir)
}

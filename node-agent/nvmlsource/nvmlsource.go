// SPDX-License-Identifier: Apache-2.0

// Package nvmlsource implements gpu.Source with NVML through go-nvml. NVML is reached
// only through nvml.Interface, injected by the caller, so unit tests run on go-nvml's
// mock servers; the conversion from nvml.Return to Go errors happens here and nowhere
// else.
package nvmlsource

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// Error is a failed NVML call.
type Error struct {
	Op  string
	Ret nvml.Return
}

func (e *Error) Error() string { return fmt.Sprintf("NVML %s: %s", e.Op, nvml.ErrorString(e.Ret)) }

// Is lets callers test for gpu.ErrUnavailable when the library or device is gone.
func (e *Error) Is(target error) bool {
	return target == gpu.ErrUnavailable &&
		(e.Ret == nvml.ERROR_LIBRARY_NOT_FOUND || e.Ret == nvml.ERROR_DRIVER_NOT_LOADED ||
			e.Ret == nvml.ERROR_GPU_IS_LOST || e.Ret == nvml.ERROR_UNINITIALIZED)
}

func check(op string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &Error{Op: op, Ret: ret}
}

// Source reads GPUs through NVML.
type Source struct {
	lib nvml.Interface
	log logr.Logger

	mu sync.Mutex
	// unhealthy holds the reason for GPUs that reported a critical event; health is
	// sticky until the agent restarts, as a GPU that hit a fatal XID needs a reset.
	unhealthy map[string]string
	// last is the previous inventory by index, so that a GPU that disappears from NVML
	// (lost from the bus) is still published, marked unhealthy, instead of vanishing.
	last map[int]api.GPU
	// utilStamp is the last process-utilisation timestamp per GPU UUID, so each
	// sample covers only the time since the previous one.
	utilStamp map[string]uint64

	// fenceOnce reads once whether NVML has the per-cgroup memory-limit calls.
	fenceOnce sync.Once
	fenceErr  error
}

var _ gpu.Source = (*Source)(nil)

// New initialises NVML. It fails with an error that wraps gpu.ErrUnavailable on a
// machine without the NVIDIA driver.
func New(lib nvml.Interface, log logr.Logger) (*Source, error) {
	if err := check("Init", lib.Init()); err != nil {
		return nil, err
	}
	return &Source{lib: lib, log: log, unhealthy: map[string]string{}, last: map[int]api.GPU{}, utilStamp: map[string]uint64{}}, nil
}

// Close shuts NVML down.
func (s *Source) Close() error { return check("Shutdown", s.lib.Shutdown()) }

// MarkUnhealthy records a health problem found outside NVML's event stream.
func (s *Source) MarkUnhealthy(uuid, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unhealthy[uuid] = reason
}

type devInfo struct {
	dev nvml.Device
	gpu api.GPU
	bus string // normalised PCI bus id
}

func (s *Source) devices() ([]devInfo, error) {
	n, ret := s.lib.DeviceGetCount()
	if err := check("DeviceGetCount", ret); err != nil {
		return nil, err
	}
	if n > api.MaxGPUsPerNode {
		return nil, fmt.Errorf("NVML reports %d GPUs, more than the supported %d", n, api.MaxGPUsPerNode)
	}
	out := make([]devInfo, 0, n)
	for i := 0; i < n; i++ {
		d, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			out = append(out, s.lost(i, &Error{Op: fmt.Sprintf("DeviceGetHandleByIndex(%d)", i), Ret: ret}))
			continue
		}
		info, err := s.describe(i, d)
		if err != nil {
			out = append(out, s.lost(i, err))
			continue
		}
		out = append(out, info)
	}
	return out, nil
}

// lost returns the last known description of GPU i, marked unhealthy. A GPU never
// seen before cannot be described (no UUID) and is left out, with a log line.
func (s *Source) lost(i int, err error) devInfo {
	s.mu.Lock()
	g, ok := s.last[i]
	s.mu.Unlock()
	if !ok {
		s.log.Error(err, "GPU cannot be read and was never seen healthy; leaving it out of the inventory", "index", i)
		return devInfo{gpu: api.GPU{Index: -1}}
	}
	g.Healthy = false
	g.HealthReason = "NVML cannot read the GPU: " + err.Error()
	g.MIG = nil
	return devInfo{gpu: g, bus: g.PCIBusID}
}

func (s *Source) describe(i int, d nvml.Device) (devInfo, error) {
	uuid, ret := d.GetUUID()
	if err := check("GetUUID", ret); err != nil {
		return devInfo{}, err
	}
	name, ret := d.GetName()
	if err := check("GetName", ret); err != nil {
		return devInfo{}, err
	}
	mem, ret := d.GetMemoryInfo()
	if err := check("GetMemoryInfo", ret); err != nil {
		return devInfo{}, err
	}
	g := api.GPU{Index: i, UUID: uuid, Model: name, MemoryMiB: gpu.MiB(mem.Total), NUMANode: -1, Healthy: true}
	if idx, ret := d.GetIndex(); ret == nvml.SUCCESS {
		g.Index = idx
	}
	g.SMCount = smCount(d)
	if numa, ret := d.GetNumaNodeId(); ret == nvml.SUCCESS && numa >= 0 {
		g.NUMANode = numa
	}
	var bus string
	if pci, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
		bus = NormalizeBusID(busIDString(pci))
		g.PCIBusID = bus
	}
	if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
		mig, err := s.migInstances(d)
		if err != nil {
			g.Healthy = false
			g.HealthReason = "MIG instances cannot be read: " + err.Error()
		}
		g.MIG = mig
	}
	s.mu.Lock()
	if r, bad := s.unhealthy[uuid]; bad {
		g.Healthy = false
		g.HealthReason = r
	}
	s.mu.Unlock()
	return devInfo{dev: d, gpu: g, bus: bus}, nil
}

func (s *Source) migInstances(d nvml.Device) (*api.MIG, error) {
	max, ret := d.GetMaxMigDeviceCount()
	if err := check("GetMaxMigDeviceCount", ret); err != nil {
		return &api.MIG{}, err
	}
	mig := &api.MIG{Instances: []api.MIGInstance{}}
	for j := 0; j < max; j++ {
		m, ret := d.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // no instance in this slot
		}
		if err := check(fmt.Sprintf("GetMigDeviceHandleByIndex(%d)", j), ret); err != nil {
			return mig, err
		}
		uuid, ret := m.GetUUID()
		if err := check("MIG GetUUID", ret); err != nil {
			return mig, err
		}
		inst := api.MIGInstance{UUID: uuid}
		attr, ret := m.GetAttributes()
		if ret == nvml.SUCCESS {
			inst.SMCount = int(attr.MultiprocessorCount)
			inst.MemoryMiB = int64(attr.MemorySizeMB)
		}
		if mem, ret := m.GetMemoryInfo(); ret == nvml.SUCCESS && mem.Total > 0 {
			inst.MemoryMiB = gpu.MiB(mem.Total)
		}
		name, _ := m.GetName()
		inst.Profile = migProfile(name, attr)
		mig.Instances = append(mig.Instances, inst)
	}
	return mig, nil
}

// smCount reads the SM count. NVML's attributes carry it only for MIG devices; for a
// whole GPU it is derived from the CUDA core count and the cores per SM of its compute
// capability. 0 (unknown) when neither works.
func smCount(d nvml.Device) int {
	if a, ret := d.GetAttributes(); ret == nvml.SUCCESS && a.MultiprocessorCount > 0 {
		return int(a.MultiprocessorCount)
	}
	cores, ret := d.GetNumGpuCores()
	if ret != nvml.SUCCESS || cores <= 0 {
		return 0
	}
	major, minor, ret := d.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return 0
	}
	per := coresPerSM(major, minor)
	if per == 0 || cores%per != 0 {
		return 0
	}
	return cores / per
}

// coresPerSM is the number of FP32 cores per SM by compute capability (CUDA
// programming guide, "Arithmetic Instructions"); 0 when unknown.
func coresPerSM(major, minor int) int {
	switch {
	case major == 7, major == 8 && minor == 0:
		return 64
	case major == 8, major == 9, major >= 10:
		return 128
	}
	return 0
}

// migProfile takes the profile from the MIG device name ("NVIDIA H100 80GB HBM3 MIG
// 1g.10gb"), which is how nvidia-smi names it, and otherwise builds it from the slice
// count and memory.
func migProfile(name string, a nvml.DeviceAttributes) string {
	if _, p, ok := strings.Cut(name, "MIG "); ok && p != "" {
		return strings.TrimSpace(p)
	}
	return fmt.Sprintf("%dg.%dgb", a.GpuInstanceSliceCount, (a.MemorySizeMB+1023)/1024)
}

// Inventory reads every GPU, its MIG instances and its links to the other GPUs.
func (s *Source) Inventory() (*api.NodeInventory, error) {
	devs, err := s.devices()
	if err != nil {
		return nil, err
	}
	inv := &api.NodeInventory{Version: api.InventoryVersion, GPUs: []api.GPU{}}
	if v, ret := s.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		inv.Driver = v
	}
	byBus := map[string]int{}
	for _, d := range devs {
		if d.bus != "" && d.gpu.Index >= 0 {
			byBus[d.bus] = d.gpu.Index
		}
	}
	for i := range devs {
		if devs[i].gpu.Index < 0 {
			continue
		}
		if devs[i].dev != nil {
			devs[i].gpu.Links = s.links(devs[i], devs, byBus)
		} else {
			devs[i].gpu.Links = nil // peers cannot be asked about a lost GPU
		}
		inv.GPUs = append(inv.GPUs, devs[i].gpu)
	}
	s.mu.Lock()
	for _, d := range devs {
		if d.dev != nil { // read from NVML just now, not a remembered lost GPU
			s.last[d.gpu.Index] = d.gpu
		}
	}
	s.mu.Unlock()
	return inv, nil
}

func (s *Source) links(d devInfo, all []devInfo, byBus map[string]int) []api.Link {
	nvlinks := map[int]int{}
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		state, ret := d.dev.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED && l == 0 {
			break // no NVLink on this GPU
		}
		if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		pci, ret := d.dev.GetNvLinkRemotePciInfo(l)
		if ret != nvml.SUCCESS {
			continue
		}
		if peer, ok := byBus[NormalizeBusID(busIDString(pci))]; ok && peer != d.gpu.Index {
			nvlinks[peer]++
		}
		// A link to an NVSwitch reports the switch's bus id; such GPUs are joined
		// through the fabric, which NVML's P2P status below reveals.
	}
	var links []api.Link
	for _, p := range all {
		if p.gpu.Index < 0 || p.gpu.Index == d.gpu.Index || p.dev == nil {
			continue
		}
		l := api.Link{Peer: p.gpu.Index, PCIe: api.PCIeCrossSocket, NVLinks: nvlinks[p.gpu.Index]}
		if lvl, ret := d.dev.GetTopologyCommonAncestor(p.dev); ret == nvml.SUCCESS {
			l.PCIe = PCIeLevel(lvl)
		}
		if l.NVLinks == 0 && s.nvswitchPeers(d.dev, p.dev) {
			// Behind NVSwitches every GPU pair is NVLink-joined; count the GPU's
			// active links, the bandwidth either side can use.
			l.NVLinks = activeLinks(d.dev)
		}
		links = append(links, l)
	}
	return links
}

// nvswitchPeers reports whether NVML says the pair can talk peer-to-peer over NVLink.
func (s *Source) nvswitchPeers(a, b nvml.Device) bool {
	st, ret := a.GetP2PStatus(b, nvml.P2P_CAPS_INDEX_NVLINK)
	return ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK
}

func activeLinks(d nvml.Device) int {
	n := 0
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		st, ret := d.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED && l == 0 {
			return 0
		}
		if ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
			n++
		}
	}
	return n
}

// PCIeLevel maps NVML's topology level to the wire contract's.
func PCIeLevel(l nvml.GpuTopologyLevel) api.PCIeLevel {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return api.PCIeInternal
	case nvml.TOPOLOGY_SINGLE:
		return api.PCIeSingle
	case nvml.TOPOLOGY_MULTIPLE:
		return api.PCIeMultiple
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return api.PCIeHostBridge
	case nvml.TOPOLOGY_NODE:
		return api.PCIeNUMA
	default:
		return api.PCIeCrossSocket
	}
}

func busIDString(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// NormalizeBusID turns NVML's "00000000:18:00.0" into the kernel's "0000:18:00.0", lower
// case, so that ids from different NVML calls and from sysfs compare equal.
func NormalizeBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	dom, rest, ok := strings.Cut(id, ":")
	if !ok {
		return id
	}
	if len(dom) > 4 {
		dom = dom[len(dom)-4:]
	}
	return dom + ":" + rest
}

// eachGPU calls fn with the index, handle and UUID of every GPU whose handle and UUID
// NVML answers (a GPU it does not answer for is skipped: Snapshot reports it lost).
func (s *Source) eachGPU(fn func(i int, d nvml.Device, uuid string)) error {
	n, ret := s.lib.DeviceGetCount()
	if err := check("DeviceGetCount", ret); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		d, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		fn(i, d, uuid)
	}
	return nil
}

// Devices returns UUID, index and minor number of each GPU and MIG instance.
func (s *Source) Devices() ([]gpu.Device, error) {
	var out []gpu.Device
	err := s.eachGPU(func(i int, d nvml.Device, uuid string) {
		minor, ret := d.GetMinorNumber()
		if ret != nvml.SUCCESS {
			minor = -1
		}
		out = append(out, gpu.Device{UUID: uuid, Index: i, Minor: minor})
		if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
			max, _ := d.GetMaxMigDeviceCount()
			for j := 0; j < max; j++ {
				m, ret := d.GetMigDeviceHandleByIndex(j)
				if ret != nvml.SUCCESS {
					continue
				}
				if mu, ret := m.GetUUID(); ret == nvml.SUCCESS {
					md := gpu.Device{UUID: mu, Index: i, Minor: minor, ParentUUID: uuid}
					gi, ret1 := m.GetGpuInstanceId()
					ci, ret2 := m.GetComputeInstanceId()
					if ret1 == nvml.SUCCESS && ret2 == nvml.SUCCESS {
						md.MIG = &gpu.MIGIDs{GPUInstance: gi, ComputeInstance: ci}
					}
					out = append(out, md)
				}
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Usage samples memory and utilisation of every GPU and of every process on it.
func (s *Source) Usage() (*gpu.Usage, error) {
	devs, err := s.devices()
	if err != nil {
		return nil, err
	}
	u := &gpu.Usage{}
	for _, d := range devs {
		if d.dev == nil {
			continue
		}
		gu := gpu.GPUUsage{UUID: d.gpu.UUID, Index: d.gpu.Index, UtilPercent: -1}
		if mem, ret := d.dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			gu.UsedMemoryMiB = gpu.MiB(mem.Used)
		}
		if r, ret := d.dev.GetUtilizationRates(); ret == nvml.SUCCESS {
			gu.UtilPercent = int(r.Gpu)
		}
		u.GPUs = append(u.GPUs, gu)
		u.Processes = append(u.Processes, s.processes(d)...)
	}
	return u, nil
}

func (s *Source) processes(d devInfo) []gpu.ProcessUsage {
	// MIG instances are looked up by GPU instance id: on a MIG GPU the parent's process
	// list carries the instance each process runs in.
	migByGI := map[uint32]string{}
	if d.gpu.MIG != nil {
		max, _ := d.dev.GetMaxMigDeviceCount()
		for j := 0; j < max; j++ {
			m, ret := d.dev.GetMigDeviceHandleByIndex(j)
			if ret != nvml.SUCCESS {
				continue
			}
			gi, ret1 := m.GetGpuInstanceId()
			uuid, ret2 := m.GetUUID()
			if ret1 == nvml.SUCCESS && ret2 == nvml.SUCCESS {
				migByGI[uint32(gi)] = uuid
			}
		}
	}
	byPID := map[uint32]*gpu.ProcessUsage{}
	var order []uint32
	add := func(list []nvml.ProcessInfo, mps bool) {
		for _, p := range list {
			uuid := d.gpu.UUID
			if m, ok := migByGI[p.GpuInstanceId]; ok {
				uuid = m
			}
			mib := gpu.MiB(p.UsedGpuMemory)
			// NVML reports NVML_VALUE_NOT_AVAILABLE (all ones) when it cannot see a
			// process's memory (e.g. without the right PID namespace).
			if p.UsedGpuMemory == ^uint64(0) {
				mib = 0
			}
			if prev, ok := byPID[p.Pid]; ok {
				// A process with compute and graphics contexts appears in both
				// lists with the same memory: keep the larger figure.
				if mib > prev.UsedMemoryMiB {
					prev.UsedMemoryMiB = mib
				}
				prev.MPSClient = prev.MPSClient || mps
				continue
			}
			byPID[p.Pid] = &gpu.ProcessUsage{PID: int(p.Pid), GPUUUID: uuid, UsedMemoryMiB: mib, SMPercent: -1, MPSClient: mps}
			order = append(order, p.Pid)
		}
	}
	if list, ret := d.dev.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
		add(list, false)
	}
	if list, ret := d.dev.GetGraphicsRunningProcesses(); ret == nvml.SUCCESS {
		add(list, false)
	}
	// MPS clients (Volta and later) are listed apart from the processes with a
	// context of their own; their memory is theirs, not their server's.
	if list, ret := d.dev.GetMPSComputeRunningProcesses(); ret == nvml.SUCCESS {
		add(list, true)
	}
	s.mu.Lock()
	since := s.utilStamp[d.gpu.UUID]
	s.mu.Unlock()
	if samples, ret := d.dev.GetProcessUtilization(since); ret == nvml.SUCCESS {
		var newest uint64
		for _, sm := range samples {
			if p, ok := byPID[sm.Pid]; ok && int(sm.SmUtil) > p.SMPercent {
				p.SMPercent = int(sm.SmUtil)
			}
			if sm.TimeStamp > newest {
				newest = sm.TimeStamp
			}
		}
		if newest > 0 {
			s.mu.Lock()
			s.utilStamp[d.gpu.UUID] = newest
			s.mu.Unlock()
		}
	}
	out := make([]gpu.ProcessUsage, 0, len(order))
	for _, pid := range order {
		out = append(out, *byPID[pid])
	}
	return out
}

// XIDs that an application causes (bad memory access, its own context reset, a
// graphics engine exception from its kernel) and that do not mean the GPU is broken;
// the same list NVIDIA's device plugin ignores.
var applicationXIDs = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

// WatchHealth waits for critical XID and double-bit ECC events and marks the GPU
// unhealthy. It returns when ctx is done, or at once when NVML has no event support.
func (s *Source) WatchHealth(ctx context.Context, report func(gpu.HealthEvent)) error {
	set, ret := s.lib.EventSetCreate()
	if err := check("EventSetCreate", ret); err != nil {
		return err
	}
	defer set.Free()
	n, ret := s.lib.DeviceGetCount()
	if err := check("DeviceGetCount", ret); err != nil {
		return err
	}
	registered := 0
	for i := 0; i < n; i++ {
		d, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		want := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
		if sup, ret := d.GetSupportedEventTypes(); ret == nvml.SUCCESS {
			want &= sup
		}
		if want == 0 {
			continue
		}
		if ret := d.RegisterEvents(want, set); ret != nvml.SUCCESS {
			s.log.Info("GPU does not support health events; its health is read by polling only", "index", i, "error", nvml.ErrorString(ret))
			continue
		}
		registered++
	}
	if registered == 0 {
		return nil
	}
	for ctx.Err() == nil {
		e, ret := set.Wait(2000)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		case nvml.ERROR_GPU_IS_LOST:
			s.markAll(report, "GPU lost from the bus")
			continue
		default:
			return check("EventSetWait", ret)
		}
		if e.EventType == nvml.EventTypeXidCriticalError && applicationXIDs[e.EventData] {
			continue
		}
		reason := fmt.Sprintf("critical XID %d", e.EventData)
		if e.EventType == nvml.EventTypeDoubleBitEccError {
			reason = "double-bit ECC error"
		}
		if e.Device == nil {
			s.markAll(report, reason)
			continue
		}
		uuid, ret := e.Device.GetUUID()
		if ret != nvml.SUCCESS {
			s.markAll(report, reason)
			continue
		}
		s.MarkUnhealthy(uuid, reason)
		report(gpu.HealthEvent{UUID: uuid, Healthy: false, Reason: reason})
	}
	return nil
}

// markAll is used when NVML cannot say which GPU failed: every GPU is suspect.
func (s *Source) markAll(report func(gpu.HealthEvent), reason string) {
	devs, err := s.Devices()
	if err != nil && !errors.Is(err, gpu.ErrUnavailable) {
		s.log.Error(err, "listing GPUs after a health event")
	}
	for _, d := range devs {
		if d.ParentUUID != "" {
			continue
		}
		s.MarkUnhealthy(d.UUID, reason)
		report(gpu.HealthEvent{UUID: d.UUID, Healthy: false, Reason: reason})
	}
}

// SPDX-License-Identifier: Apache-2.0

package nvmlsource

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/go-logr/logr"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

func pciInfo(bus string) nvml.PciInfo {
	var p nvml.PciInfo
	// NVML writes an 8-digit domain; the source must normalise it.
	for i, c := range "0000" + strings.ToUpper(bus) {
		p.BusId[i] = int8(c)
	}
	return p
}

// h100 is go-nvml's DGX H100 mock with the calls it leaves unset filled in: two NVLink
// islands of four GPUs (6 links to each island peer), two NUMA nodes, pairs of GPUs
// behind one PCIe switch.
func h100(t *testing.T) (*server.Server, []*server.Device) {
	t.Helper()
	s := dgxh100.New()
	devs := make([]*server.Device, len(s.Devices))
	for i := range s.Devices {
		devs[i] = s.Devices[i].(*server.Device)
	}
	for i, d := range devs {
		i, d := i, d
		d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return i / 4, nvml.SUCCESS }
		// As on real drivers, attributes exist only for MIG devices; the SM count
		// comes from the core count and compute capability 9.0.
		d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED
		}
		d.GetNumGpuCoresFunc = func() (int, nvml.Return) { return 16896, nvml.SUCCESS }
		var peers []int
		for p := i / 4 * 4; p < i/4*4+4; p++ {
			if p != i {
				peers = append(peers, p)
			}
		}
		d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if l >= 18 {
				return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
			return pciInfo(devs[peers[l/6]].PciBusID), nvml.SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(o nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			p := o.(*server.Device).Index
			switch {
			case p/2 == i/2:
				return nvml.TOPOLOGY_SINGLE, nvml.SUCCESS
			case p/4 == i/4:
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
		d.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
		}
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo(d.PciBusID), nvml.SUCCESS }
	}
	return s, devs
}

func TestInventoryDGXH100(t *testing.T) {
	s, devs := h100(t)
	src, err := New(s, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	inv, err := src.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.EncodeInventory(inv); err != nil {
		t.Fatalf("inventory does not encode: %v", err)
	}
	if len(inv.GPUs) != 8 || inv.Driver != "550.54.15" {
		t.Fatalf("got %d GPUs, driver %q", len(inv.GPUs), inv.Driver)
	}
	for i, g := range inv.GPUs {
		if g.UUID != devs[i].UUID || g.Model != "NVIDIA H100 80GB HBM3" || g.MemoryMiB != 81920 || g.SMCount != 132 || g.NUMANode != i/4 || !g.Healthy {
			t.Errorf("GPU %d: %+v", i, g)
		}
		if g.PCIBusID != devs[i].PciBusID {
			t.Errorf("GPU %d: bus id %q, want %q", i, g.PCIBusID, devs[i].PciBusID)
		}
		if len(g.Links) != 7 {
			t.Fatalf("GPU %d: %d links", i, len(g.Links))
		}
		for _, l := range g.Links {
			wantNV := 0
			if l.Peer/4 == i/4 {
				wantNV = 6
			}
			wantPCIe := api.PCIeCrossSocket
			if l.Peer/2 == i/2 {
				wantPCIe = api.PCIeSingle
			} else if l.Peer/4 == i/4 {
				wantPCIe = api.PCIeNUMA
			}
			if l.NVLinks != wantNV || l.PCIe != wantPCIe {
				t.Errorf("GPU %d -> %d: %+v, want nvlinks %d pcie %s", i, l.Peer, l, wantNV, wantPCIe)
			}
		}
	}
}

// Behind NVSwitches NVLink's remote end is the switch, not a GPU; NVML's P2P status
// then tells that the pair is NVLink-joined.
func TestInventoryNVSwitch(t *testing.T) {
	s, devs := h100(t)
	for _, d := range devs {
		d.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) { return pciInfo("00:ff:00.0"), nvml.SUCCESS }
		d.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
	}
	src, _ := New(s, logr.Discard())
	inv, err := src.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range inv.GPUs[0].Links {
		if l.NVLinks != 18 {
			t.Errorf("0 -> %d: nvlinks %d, want 18", l.Peer, l.NVLinks)
		}
	}
}

func TestNoDriver(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	_, err := New(lib, logr.Discard())
	if !errors.Is(err, gpu.ErrUnavailable) {
		t.Fatalf("error %v does not wrap ErrUnavailable", err)
	}
}

// A GPU that falls off the bus stays in the inventory, unhealthy, with its links
// dropped, and the inventory still validates.
func TestLostGPU(t *testing.T) {
	s, _ := h100(t)
	src, _ := New(s, logr.Discard())
	if _, err := src.Inventory(); err != nil {
		t.Fatal(err)
	}
	orig := s.DeviceGetHandleByIndexFunc
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 5 {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return orig(i)
	}
	inv, err := src.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if err := inv.Validate(); err != nil {
		t.Fatal(err)
	}
	g := inv.GPUs[5]
	if g.Healthy || !strings.Contains(g.HealthReason, "GPU_IS_LOST") || len(g.Links) != 0 {
		t.Errorf("lost GPU: %+v", g)
	}
	if len(inv.GPUs[0].Links) != 6 {
		t.Errorf("peers still link to the lost GPU: %d links", len(inv.GPUs[0].Links))
	}
}

func TestMIGInstances(t *testing.T) {
	s, devs := h100(t)
	parent := devs[2]
	parent.GetMigModeFunc = func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS }
	parent.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	var migs []*mock.Device
	for j := 0; j < 3; j++ {
		j := j
		migs = append(migs, &mock.Device{
			GetUUIDFunc: func() (string, nvml.Return) { return fmt.Sprintf("MIG-%d", j), nvml.SUCCESS },
			GetNameFunc: func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3 MIG 2g.20gb", nvml.SUCCESS },
			GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
				return nvml.DeviceAttributes{MultiprocessorCount: 32, GpuInstanceSliceCount: 2, MemorySizeMB: 20096}, nvml.SUCCESS
			},
			GetMemoryInfoFunc:    func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 20096 << 20}, nvml.SUCCESS },
			GetGpuInstanceIdFunc: func() (int, nvml.Return) { return 10 + j, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) {
				if j == 2 {
					return 0, nvml.ERROR_NOT_SUPPORTED
				}
				return 0, nvml.SUCCESS
			},
		})
	}
	parent.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j < len(migs) {
			return migs[j], nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	src, _ := New(s, logr.Discard())
	inv, err := src.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	m := inv.GPUs[2].MIG
	if m == nil || len(m.Instances) != 3 {
		t.Fatalf("MIG: %+v", m)
	}
	if m.Instances[1] != (api.MIGInstance{UUID: "MIG-1", Profile: "2g.20gb", MemoryMiB: 20096, SMCount: 32}) {
		t.Errorf("instance: %+v", m.Instances[1])
	}
	if err := inv.Validate(); err != nil {
		t.Fatal(err)
	}
	devices, err := src.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) != 11 || devices[3].ParentUUID != parent.UUID || devices[3].UUID != "MIG-0" {
		t.Errorf("devices: %+v", devices)
	}
	// The instance IDs name the capability device nodes; unreadable IDs leave MIG nil
	// (the binding refuses such an instance).
	if m := devices[4].MIG; m == nil || *m != (gpu.MIGIDs{GPUInstance: 11, ComputeInstance: 0}) {
		t.Errorf("MIG-1 ids: %+v", m)
	}
	if devices[5].MIG != nil || devices[2].MIG != nil {
		t.Errorf("MIG ids where none can be read: %+v %+v", devices[5].MIG, devices[2].MIG)
	}
	// Processes on a MIG GPU are attributed to their instance.
	setIdleUsage(devs)
	parent.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: 1 << 30, GpuInstanceId: 11}}, nvml.SUCCESS
	}
	u, err := src.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Processes) != 1 || u.Processes[0].GPUUUID != "MIG-1" || u.Processes[0].UsedMemoryMiB != 1024 {
		t.Errorf("processes: %+v", u.Processes)
	}
}

func setIdleUsage(devs []*server.Device) {
	for _, d := range devs {
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 0}, nvml.SUCCESS }
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
		d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		d.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return nil, nvml.ERROR_NOT_FOUND
		}
	}
}

func TestUsage(t *testing.T) {
	s, devs := h100(t)
	setIdleUsage(devs)
	d := devs[1]
	d.MemoryInfo.Used = 3 << 30
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 55}, nvml.SUCCESS }
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 2 << 30}, {Pid: 200, UsedGpuMemory: ^uint64(0)}}, nvml.SUCCESS
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 2 << 30}}, nvml.SUCCESS
	}
	// An MPS client: listed among the MPS compute processes only.
	d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 300, UsedGpuMemory: 1 << 30}}, nvml.SUCCESS
	}
	var since []uint64
	d.GetProcessUtilizationFunc = func(ts uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		since = append(since, ts)
		return []nvml.ProcessUtilizationSample{{Pid: 100, SmUtil: 40, TimeStamp: 1000}, {Pid: 100, SmUtil: 50, TimeStamp: 2000}}, nvml.SUCCESS
	}
	src, _ := New(s, logr.Discard())
	for range 2 {
		u, err := src.Usage()
		if err != nil {
			t.Fatal(err)
		}
		if len(u.GPUs) != 8 || u.GPUs[1].UsedMemoryMiB != 3072 || u.GPUs[1].UtilPercent != 55 {
			t.Fatalf("GPU usage: %+v", u.GPUs[1])
		}
		want := []gpu.ProcessUsage{
			{PID: 100, GPUUUID: d.UUID, UsedMemoryMiB: 2048, SMPercent: 50},
			{PID: 200, GPUUUID: d.UUID, UsedMemoryMiB: 0, SMPercent: -1},
			{PID: 300, GPUUUID: d.UUID, UsedMemoryMiB: 1024, SMPercent: -1, MPSClient: true},
		}
		if fmt.Sprint(u.Processes) != fmt.Sprint(want) {
			t.Fatalf("processes %+v, want %+v", u.Processes, want)
		}
	}
	if fmt.Sprint(since) != "[0 2000]" {
		t.Errorf("utilisation asked since %v, want [0 2000]", since)
	}
}

// A critical XID marks the GPU unhealthy (sticky, in the next inventory too); an
// application XID does not.
func TestWatchHealth(t *testing.T) {
	s, devs := h100(t)
	events := make(chan nvml.EventData, 4)
	set := &mock.EventSet{
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			select {
			case e := <-events:
				return e, nvml.SUCCESS
			case <-time.After(10 * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	for _, d := range devs {
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeAll, nvml.SUCCESS }
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	src, _ := New(s, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan gpu.HealthEvent, 4)
	go func() { _ = src.WatchHealth(ctx, func(e gpu.HealthEvent) { got <- e }) }()
	events <- nvml.EventData{Device: devs[3], EventType: nvml.EventTypeXidCriticalError, EventData: 43}
	events <- nvml.EventData{Device: devs[4], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	select {
	case e := <-got:
		if e.UUID != devs[4].UUID || e.Healthy || e.Reason != "critical XID 79" {
			t.Fatalf("event %+v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no health event")
	}
	inv, _ := src.Inventory()
	if inv.GPUs[4].Healthy || inv.GPUs[4].HealthReason != "critical XID 79" || !inv.GPUs[3].Healthy {
		t.Errorf("health not in inventory: 3=%v 4=%v %q", inv.GPUs[3].Healthy, inv.GPUs[4].Healthy, inv.GPUs[4].HealthReason)
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:18:00.0": "0000:18:00.0",
		"0000:AB:00.0":     "0000:ab:00.0",
		"00000001:18:00.0": "0001:18:00.0",
		"garbage":          "garbage",
	} {
		if got := NormalizeBusID(in); got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

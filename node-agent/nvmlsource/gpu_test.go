// SPDX-License-Identifier: Apache-2.0

//go:build gpu

package nvmlsource

import (
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"

	"github.com/tessera-dev/tessera/api"
)

// TestRealNVMLMatchesNvidiaSmi runs on a machine with NVIDIA GPUs (go test -tags gpu):
// the inventory read through NVML must say what nvidia-smi says.
func TestRealNVMLMatchesNvidiaSmi(t *testing.T) {
	src, err := New(nvml.New(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	inv, err := src.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.EncodeInventory(inv); err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(inv, "", "  ")
	t.Logf("inventory:\n%s", b)
	out, err := exec.Command("nvidia-smi", "--query-gpu=index,uuid,name,memory.total,pci.bus_id,driver_version", "--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nvidia-smi:\n%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(inv.GPUs) {
		t.Fatalf("nvidia-smi lists %d GPUs, the inventory %d", len(lines), len(inv.GPUs))
	}
	for i, line := range lines {
		f := strings.Split(line, ", ")
		if len(f) != 6 {
			t.Fatalf("unexpected nvidia-smi line %q", line)
		}
		g := inv.GPUs[i]
		idx, _ := strconv.Atoi(f[0])
		mem, _ := strconv.ParseInt(f[3], 10, 64)
		if g.Index != idx || g.UUID != f[1] || g.Model != f[2] || g.MemoryMiB != mem || g.PCIBusID != NormalizeBusID(f[4]) || inv.Driver != f[5] {
			t.Errorf("GPU %d: inventory %+v (driver %s) vs nvidia-smi %q", i, g, inv.Driver, line)
		}
		if !g.Healthy || g.SMCount <= 0 {
			t.Errorf("GPU %d: healthy %v, SMs %d", i, g.Healthy, g.SMCount)
		}
	}
	devs, err := src.Devices()
	if err != nil || len(devs) < len(inv.GPUs) || devs[0].Minor < 0 {
		t.Errorf("devices %+v %v", devs, err)
	}
	t.Logf("devices: %+v", devs)
}

// topoLevel maps nvidia-smi topo -m's PCIe codes to the inventory's levels.
var topoLevel = map[string]api.PCIeLevel{
	"PIX": api.PCIeSingle, "PXB": api.PCIeMultiple, "PHB": api.PCIeHostBridge,
	"NODE": api.PCIeNUMA, "SYS": api.PCIeCrossSocket,
}

// TestRealNVMLTwoGPUs (two or more GPUs): every GPU, and the link between every pair
// as the inventory publishes it, against nvidia-smi topo -m (NV<n>: n NVLinks; else
// the PCIe level).
func TestRealNVMLTwoGPUs(t *testing.T) {
	src, err := New(nvml.New(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	inv, err := src.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) < 2 {
		t.Skipf("needs two GPUs, found %d", len(inv.GPUs))
	}
	topo, err := exec.Command("nvidia-smi", "topo", "-m").Output()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nvidia-smi topo -m:\n%s", topo)
	// Rows "GPU<i>\t<cell GPU0>\t<cell GPU1>...".
	matrix := map[int][]string{}
	for _, line := range strings.Split(string(topo), "\n") {
		f := strings.Fields(line)
		if len(f) > len(inv.GPUs) && strings.HasPrefix(f[0], "GPU") {
			if i, err := strconv.Atoi(strings.TrimPrefix(f[0], "GPU")); err == nil {
				matrix[i] = f[1 : 1+len(inv.GPUs)]
			}
		}
	}
	for _, g := range inv.GPUs {
		t.Logf("GPU %d %s %s %d MiB, %d SMs, NUMA %d, bus %s, links %+v", g.Index, g.UUID, g.Model, g.MemoryMiB, g.SMCount, g.NUMANode, g.PCIBusID, g.Links)
		row, ok := matrix[g.Index]
		if !ok {
			t.Errorf("nvidia-smi topo -m has no row for GPU%d", g.Index)
			continue
		}
		if len(g.Links) != len(inv.GPUs)-1 {
			t.Errorf("GPU %d has %d links, want one to each of the %d others", g.Index, len(g.Links), len(inv.GPUs)-1)
		}
		for _, l := range g.Links {
			cell := row[l.Peer]
			if strings.HasPrefix(cell, "NV") {
				want, _ := strconv.Atoi(strings.TrimPrefix(cell, "NV"))
				if l.NVLinks != want {
					t.Errorf("GPU %d -> %d: %d NVLinks, nvidia-smi says %s", g.Index, l.Peer, l.NVLinks, cell)
				}
				continue
			}
			if l.NVLinks != 0 {
				t.Errorf("GPU %d -> %d: %d NVLinks, nvidia-smi says %s", g.Index, l.Peer, l.NVLinks, cell)
			}
			if want, ok := topoLevel[cell]; !ok || l.PCIe != want {
				t.Errorf("GPU %d -> %d: PCIe %q, nvidia-smi says %s", g.Index, l.Peer, l.PCIe, cell)
			}
		}
	}
}

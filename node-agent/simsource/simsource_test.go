// SPDX-License-Identifier: Apache-2.0

package simsource

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
)

func repoFile(t *testing.T, rel string) string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..", rel)
}

// Every sample file in config/simulated must load; the local cluster starts agents
// from them.
func TestSampleFilesLoad(t *testing.T) {
	files, err := filepath.Glob(repoFile(t, "config/simulated/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no sample files found: %v", err)
	}
	for _, f := range files {
		s, err := New(f, "node-a")
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		inv, err := s.Inventory()
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if _, err := api.EncodeInventory(inv); err != nil {
			t.Errorf("%s: inventory does not encode: %v", f, err)
		}
	}
}

func TestH100TwoIslands(t *testing.T) {
	s, err := New(repoFile(t, "config/simulated/h100-8x-two-nvlink-islands.yaml"), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := s.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(inv.GPUs))
	}
	for _, g := range inv.GPUs {
		if len(g.Links) != 7 {
			t.Fatalf("GPU %d has %d links, want 7", g.Index, len(g.Links))
		}
		for _, l := range g.Links {
			sameIsland := g.Index/4 == l.Peer/4
			if sameIsland != (l.NVLinks == 6) {
				t.Errorf("GPU %d -> %d: nvlinks %d, same island %v", g.Index, l.Peer, l.NVLinks, sameIsland)
			}
			want := api.PCIeCrossSocket
			switch {
			case g.Index/2 == l.Peer/2:
				want = api.PCIeSingle
			case sameIsland:
				want = api.PCIeNUMA
			}
			if l.PCIe != want {
				t.Errorf("GPU %d -> %d: pcie %s, want %s", g.Index, l.Peer, l.PCIe, want)
			}
		}
		if wantNUMA := g.Index / 4; g.NUMANode != wantNUMA {
			t.Errorf("GPU %d: numa %d, want %d", g.Index, g.NUMANode, wantNUMA)
		}
	}
	// UUIDs are stable per node name and differ between nodes.
	s2, _ := New(repoFile(t, "config/simulated/h100-8x-two-nvlink-islands.yaml"), "node-a")
	inv2, _ := s2.Inventory()
	s3, _ := New(repoFile(t, "config/simulated/h100-8x-two-nvlink-islands.yaml"), "node-b")
	inv3, _ := s3.Inventory()
	if inv.GPUs[3].UUID != inv2.GPUs[3].UUID {
		t.Errorf("UUID changed across loads: %s vs %s", inv.GPUs[3].UUID, inv2.GPUs[3].UUID)
	}
	if inv.GPUs[3].UUID == inv3.GPUs[3].UUID {
		t.Errorf("two nodes got the same UUID %s", inv.GPUs[3].UUID)
	}
}

func TestMIG(t *testing.T) {
	s, err := New(repoFile(t, "config/simulated/a100-2x-mig.yaml"), "n")
	if err != nil {
		t.Fatal(err)
	}
	inv, _ := s.Inventory()
	if inv.GPUs[0].MIG == nil || len(inv.GPUs[0].MIG.Instances) != 7 || inv.GPUs[1].MIG != nil {
		t.Fatalf("MIG: %+v / %+v", inv.GPUs[0].MIG, inv.GPUs[1].MIG)
	}
	devs, _ := s.Devices()
	var mig int
	for _, d := range devs {
		if d.ParentUUID == inv.GPUs[0].UUID {
			mig++
		}
	}
	if mig != 7 || len(devs) != 9 {
		t.Errorf("devices: %d MIG of %d, want 7 of 9", mig, len(devs))
	}
}

func TestInvalidFiles(t *testing.T) {
	for name, tc := range map[string]struct{ yaml, want string }{
		"no version":      {"gpus: [{model: x, memoryMiB: 1}]", "version 0 is not supported"},
		"unknown field":   {"version: 1\ngpus: [{model: x, memoryMiB: 1, colour: red}]", "unknown field"},
		"no gpus":         {"version: 1\ngpus: []", "no gpus"},
		"zero memory":     {"version: 1\ngpus: [{model: x}]", "memoryMiB 0 out of range"},
		"negative count":  {"version: 1\ngpus: [{model: x, memoryMiB: 1, count: -1}]", "count -1 out of range"},
		"huge count":      {"version: 1\ngpus: [{model: x, memoryMiB: 1, count: 100000}]", "out of range"},
		"nvlink no count": {"version: 1\ngpus: [{model: x, memoryMiB: 1, nvlinkDomain: a}]", "needs nvlinks"},
		"mig too big":     {"version: 1\ngpus: [{model: x, memoryMiB: 10, mig: [{profile: p, memoryMiB: 20}]}]", "more memory"},
		"bad process":     {"version: 1\ngpus: [{model: x, memoryMiB: 10}]\nprocesses: [{pid: 1, gpu: 3}]", "processes[0]"},
		"not yaml":        {"{{{", "simulated topology"},
		"dup uuid":        {"version: 1\ngpus: [{model: x, memoryMiB: 10, count: 2, uuids: [GPU-a, GPU-a]}]", "appears twice"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, _, err := Parse([]byte(tc.yaml), "n")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// Editing the file is seen at the next read; breaking it is an error, not stale data.
func TestReRead(t *testing.T) {
	f := filepath.Join(t.TempDir(), "node.yaml")
	write := func(s string) {
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("version: 1\ngpus: [{model: T4, memoryMiB: 15360, count: 2}]")
	s, err := New(f, "n")
	if err != nil {
		t.Fatal(err)
	}
	write("version: 1\ngpus: [{model: T4, memoryMiB: 15360}, {model: T4, memoryMiB: 15360, unhealthy: XID 79}]\nprocesses: [{pid: 42, gpu: 1, usedMemoryMiB: 100}]")
	inv, err := s.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if inv.GPUs[1].Healthy || inv.GPUs[1].HealthReason != "XID 79" || !inv.GPUs[0].Healthy {
		t.Errorf("health not re-read: %+v", inv.GPUs)
	}
	u, _ := s.Usage()
	if len(u.Processes) != 1 || u.Processes[0].GPUUUID != inv.GPUs[1].UUID || u.GPUs[1].UsedMemoryMiB != 100 {
		t.Errorf("usage: %+v", u)
	}
	write("version: 1\ngpus: nonsense")
	if _, err := s.Inventory(); err == nil {
		t.Error("a broken file gave no error")
	}
	if _, err := New(filepath.Join(t.TempDir(), "missing.yaml"), "n"); err == nil {
		t.Error("a missing file gave no error")
	}
}

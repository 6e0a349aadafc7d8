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

// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// The agent finds at start which GPUs have the driver's memory fence and says so in
// the inventory (memoryFence: driver) and on the node-requirements annotation's
// memory-fence line; a hybrid host and a MIG-mode GPU have none, and the line is
// never an unmet requirement.
func TestDetectFence(t *testing.T) {
	dir := t.TempDir()
	topo := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(topo, []byte("version: 1\ndriver: \"615.10\"\nmemoryFence: true\ngpus:\n"+
		"- model: NVIDIA H100\n  count: 2\n  memoryMiB: 81559\n  uuids: [GPU-a, GPU-b]\n"+
		"- model: NVIDIA A100\n  memoryMiB: 81920\n  uuids: [GPU-m]\n  mig:\n  - profile: 3g.40gb\n    memoryMiB: 40192\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(dir, "cgroup")
	for _, tc := range []struct {
		mode     int64 // the cgroup root's filesystem
		unified  bool
		line     string
		inv      []api.MemoryFence
		bindable bool
	}{
		{cgroup2Magic, false, "memory-fence: driver on GPU-a, GPU-b; hook and watchdog only on GPU-m (MIG mode", []api.MemoryFence{api.MemoryFenceDriver, api.MemoryFenceDriver, ""}, true},
		{tmpfsMagic, true, "memory-fence: hook and watchdog only (the driver's per-cgroup memory limit needs cgroup v2; the host's cgroups are hybrid)", []api.MemoryFence{"", "", ""}, false},
	} {
		a, client, _, _ := unmetAgent(t, "--simulate", topo, "--cgroup-root", cg)
		types := map[string]int64{cg: tc.mode}
		if tc.unified {
			types[filepath.Join(cg, "unified")] = cgroup2Magic
		}
		a.statfs = fakeStatfs(types)
		a.detectFence()
		a.markNode()
		v := nodeAnnotation(t, client)
		lines := strings.Split(v, "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[1], tc.line) {
			t.Errorf("annotation %q, want its last line to start %q", v, tc.line)
		}
		if err := api.RequirementsError(lines[1]); err != nil {
			t.Errorf("the fence line reads as an unmet requirement: %v", err)
		}
		inv, err := a.source.Inventory()
		if err != nil {
			t.Fatal(err)
		}
		for i, g := range inv.GPUs {
			if g.MemoryFence != tc.inv[i] {
				t.Errorf("%s: memoryFence %q, want %q", g.UUID, g.MemoryFence, tc.inv[i])
			}
		}
		if _, err := api.EncodeInventory(inv); err != nil {
			t.Errorf("inventory: %v", err)
		}
		if got := a.fence.has("GPU-a"); got != tc.bindable {
			t.Errorf("the binding's fence on GPU-a: %v, want %v", got, tc.bindable)
		}
	}
}

func TestFenceLine(t *testing.T) {
	for _, tc := range []struct {
		sup  []gpu.FenceSupport
		want string
	}{
		{[]gpu.FenceSupport{{UUID: "GPU-a", Supported: true}}, "driver on every GPU"},
		{[]gpu.FenceSupport{{UUID: "GPU-a", Reason: "not supported"}, {UUID: "GPU-b", Reason: "not supported"}},
			"hook and watchdog only on every GPU (not supported; driver 580.65.06)"},
		{nil, "hook and watchdog only (no GPU)"},
	} {
		if got := fenceLine(tc.sup, "580.65.06"); got != tc.want {
			t.Errorf("fenceLine(%+v) = %q, want %q", tc.sup, got, tc.want)
		}
	}
}

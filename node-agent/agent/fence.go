// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// fenceState is what the agent found at start of the driver's per-cgroup memory
// limit: the GPUs that have it, and the line the node-requirements annotation
// carries for operators.
type fenceState struct {
	mu        sync.Mutex
	supported map[string]bool
	line      string
}

func (f *fenceState) has(uuid string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.supported[uuid]
}

func (f *fenceState) info() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.line
}

// fenceProbeDir is the cgroup the driver is asked about at start: kubelet's pods
// cgroup (systemd or cgroupfs driver) where it exists, the root otherwise.
func fenceProbeDir(root string) string {
	for _, d := range []string{"kubepods.slice", "kubepods"} {
		if st, err := os.Stat(filepath.Join(root, d)); err == nil && st.IsDir() {
			return filepath.Join(root, d)
		}
	}
	return root
}

// detectFence finds which GPUs have the driver's memory fence: a driver with the
// per-cgroup limit (gpu.MemoryFence, r615 and later), a host with cgroup v2 (the
// driver's limit applies to v2 cgroups; v1 and hybrid hosts have none) and a whole
// GPU out of MIG mode. It is run once, at start.
func (a *Agent) detectFence() {
	root := a.cgroupRoot()
	supported := map[string]bool{}
	var line string
	mode, err := cgroupMode(root, a.statfs)
	switch {
	case a.fenceDriver == nil:
		line = "hook and watchdog only (the GPU source has no driver memory limit)"
	case err != nil:
		line = "hook and watchdog only (" + err.Error() + ")"
	case mode != "v2":
		line = fmt.Sprintf("hook and watchdog only (the driver's per-cgroup memory limit needs cgroup v2; the host's cgroups are %s)", mode)
	default:
		sup, err := a.fenceDriver.FenceSupport(fenceProbeDir(root))
		if err != nil {
			line = "hook and watchdog only (the driver's support cannot be read: " + err.Error() + ")"
			break
		}
		line = fenceLine(sup, a.fenceDriverVersion())
		for _, s := range sup {
			supported[s.UUID] = s.Supported
		}
	}
	a.fence.mu.Lock()
	a.fence.supported, a.fence.line = supported, line
	a.fence.mu.Unlock()
	a.log.Info("GPU memory fence below the process", "fence", line)
}

// fenceLine says which fence the node's GPUs have, grouping those without the
// driver's by reason.
func fenceLine(sup []gpu.FenceSupport, driver string) string {
	var with []string
	without := map[string][]string{}
	for _, s := range sup {
		if s.Supported {
			with = append(with, s.UUID)
		} else {
			without[s.Reason] = append(without[s.Reason], s.UUID)
		}
	}
	if len(sup) == 0 {
		return "hook and watchdog only (no GPU)"
	}
	if len(with) == len(sup) {
		return "driver on every GPU"
	}
	var parts []string
	if len(with) > 0 {
		parts = append(parts, "driver on "+strings.Join(with, ", "))
	}
	reasons := make([]string, 0, len(without))
	for r := range without {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		who := strings.Join(without[r], ", ")
		if len(with) == 0 && len(reasons) == 1 {
			who = "every GPU"
		}
		if driver != "" && len(with) == 0 {
			r += "; driver " + driver
		}
		parts = append(parts, fmt.Sprintf("hook and watchdog only on %s (%s)", who, r))
	}
	return strings.Join(parts, "; ")
}

// fenceDriverVersion is the driver version the inventory names, for the line.
func (a *Agent) fenceDriverVersion() string {
	inv, err := a.source.Inventory()
	if err != nil {
		return ""
	}
	return inv.Driver
}

func (a *Agent) cgroupRoot() string {
	if a.cfg.CgroupRoot != "" {
		return a.cfg.CgroupRoot
	}
	return "/sys/fs/cgroup"
}

// fenceSource publishes memoryFence: driver on the GPUs that have it (never on a GPU
// served by MPS, whose clients' memory the MPS server allocates).
type fenceSource struct {
	gpu.Source
	fence *fenceState
}

func (s *fenceSource) Inventory() (*api.NodeInventory, error) {
	inv, err := s.Source.Inventory()
	if err != nil {
		return nil, err
	}
	for i := range inv.GPUs {
		if g := &inv.GPUs[i]; g.MIG == nil && g.Mode() != api.SharingMPS && s.fence.has(g.UUID) {
			g.MemoryFence = api.MemoryFenceDriver
		}
	}
	return inv, nil
}

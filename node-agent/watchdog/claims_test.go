// SPDX-License-Identifier: Apache-2.0

package watchdog

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// mounts writes a fake /proc/<pid>/mountinfo with one bind mount per source (the
// fourth field), each at /run/tessera.
func mounts(t *testing.T, root string, pid int, sources ...string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("53 1 0:30 / / rw,relatime - overlay overlay rw\n")
	for i, s := range sources {
		b.WriteString(strconv.Itoa(60+i) + " 53 254:0 " + s + " /run/tessera ro,nosuid,nodev,relatime - ext4 /dev/vda rw\n")
	}
	if err := os.WriteFile(filepath.Join(root, strconv.Itoa(pid), "mountinfo"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

const (
	claimDir = "/var/lib/tessera/limits/6f1c2a"
	cgC1     = "/kubepods.slice/kubepods-pod3.slice/cri-containerd-c1.scope"
	cgC2     = "/kubepods.slice/kubepods-pod3.slice/cri-containerd-c2.scope"
)

func claimRecord() checkpoint.Record {
	return checkpoint.Record{ContainerID: "claim-uid", Namespace: "team", Pod: "train-gpu-0", Cgroup: "/tessera.dev/claims/claim-uid",
		LimitsDir: claimDir, Claim: true, Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1000, Cores: 50}}}
}

// The processes of a claim's two containers are found by the claim's limits mount,
// summed under the claim's one limit, and, once over it past the grace, ended; a
// process whose mount only resembles the claim's is not the claim's; the pod's second
// memory episode within the escalation window stops both containers whole.
func TestClaimContainersWatched(t *testing.T) {
	w, src, clk, events, killed, _, root := setup(t, ActionKill, func(c *Config) {
		c.Records = func() []checkpoint.Record { return append(records(), claimRecord()) }
	})
	// A killed process is gone from /proc.
	w.cfg.Kill = func(pid int) error {
		*killed = append(*killed, pid)
		return os.RemoveAll(filepath.Join(root, strconv.Itoa(pid)))
	}
	start := func() {
		proc(t, root, 30, "0::"+cgC1+"\n")
		mounts(t, root, 30, claimDir) // the limits root on the root file system
		proc(t, root, 31, "0::"+cgC2+"\n")
		mounts(t, root, 31, "/limits/6f1c2a") // the limits root's file system mounted at /var/lib/tessera
	}
	start()
	proc(t, root, 32, "0::"+cgC2+"\n") // a second process of the claim's container, no GPU memory
	mounts(t, root, 32, claimDir)
	proc(t, root, 40, "0::/kubepods.slice/kubepods-pod4.slice/cri-containerd-d.scope\n")
	mounts(t, root, 40, "/var/lib/tessera/limits/6f1c2a0", "/6f1c2", "/") // resembles it, is not it
	src.set(
		gpu.ProcessUsage{PID: 30, GPUUUID: "GPU-0", UsedMemoryMiB: 600},
		gpu.ProcessUsage{PID: 31, GPUUUID: "GPU-0", UsedMemoryMiB: 500},
		gpu.ProcessUsage{PID: 40, GPUUUID: "GPU-0", UsedMemoryMiB: 50},
	)
	for i := 0; i < 6; i++ {
		s, err := w.Check()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			var used int64 = -1
			for _, c := range s.Containers {
				if c.Record.ContainerID == "claim-uid" && c.GPU == "GPU-0" {
					used = c.UsedMiB
				}
			}
			if used != 1100 || s.Unattributed["GPU-0"] != 50 {
				t.Fatalf("claim uses %d MiB (want 1100), unattributed %v (want 50)", used, s.Unattributed)
			}
		}
		if i < 5 && len(s.Acted) != 0 {
			t.Fatalf("acted within the grace: %v", s.Acted)
		}
		clk.t = clk.t.Add(5 * time.Second)
	}
	sort.Ints(*killed)
	if len(*killed) != 2 || (*killed)[0] != 30 || (*killed)[1] != 31 {
		t.Fatalf("killed %v, want the claim's processes 30 and 31", *killed)
	}
	if joined := strings.Join(*events, "\n"); !strings.Contains(joined,
		"train-gpu-0 GPUMemoryOverLimitKilled the containers of ResourceClaim team/train-gpu-0 held more than its limit of 1000 MiB") {
		t.Fatalf("events %v", *events)
	}
	// Back over the limit within the escalation window (the containers start their
	// processes again): both containers of the claim are stopped whole, without a new
	// grace.
	*killed = nil
	start()
	clk.t = clk.t.Add(20 * time.Second)
	if _, err := w.Check(); err != nil {
		t.Fatal(err)
	}
	sort.Ints(*killed)
	if len(*killed) != 3 || (*killed)[0] != 30 || (*killed)[1] != 31 || (*killed)[2] != 32 {
		t.Fatalf("stopped %v, want every process of the claim's two containers (30, 31, 32)", *killed)
	}
	if last := (*events)[len(*events)-1]; !strings.Contains(last, "GPUMemoryOverLimitContainerStopped the containers of ResourceClaim team/train-gpu-0") {
		t.Fatalf("last event %q", last)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	if got := unescapeMountinfo(`/var/lib/my\040dir/a\134b`); got != `/var/lib/my dir/a\b` {
		t.Errorf("got %q", got)
	}
}

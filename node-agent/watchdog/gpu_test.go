//go:build gpu

package watchdog

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/nvmlsource"
)

// cgroupRoot is the cgroup v2 hierarchy: /sys/fs/cgroup on a pure v2 host, its
// unified mount on a hybrid one.
func cgroupRoot(t *testing.T) string {
	for _, r := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if _, err := os.Stat(filepath.Join(r, "cgroup.procs")); err == nil {
			if _, err := os.Stat(filepath.Join(r, "cgroup.controllers")); err == nil {
				return r
			}
		}
	}
	t.Skip("no cgroup v2 hierarchy")
	return ""
}

// TestWatchdogRealProcess (go test -tags gpu, as root): a PyTorch process in a cgroup
// of its own allocates 1 GiB; the watchdog must attribute its NVML memory to the
// record of that cgroup, leave it alone under a large limit, and end it under a
// small one.
func TestWatchdogRealProcess(t *testing.T) {
	root := cgroupRoot(t)
	name := fmt.Sprintf("tessera-verify-%d", os.Getpid())
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(dir)
	script := "import torch,time\n" +
		"x=torch.empty(1<<30,dtype=torch.uint8,device='cuda'); x.fill_(1); torch.cuda.synchronize()\n" +
		"print('ready',flush=True); time.sleep(120)\n"
	cmd := exec.Command("sh", "-c", "echo $$ > "+filepath.Join(dir, "cgroup.procs")+" && exec python3 -c \"$0\"", script)
	cmd.Stderr = os.Stderr
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() }()
	ready := make(chan bool)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- true
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("the PyTorch process exited before allocating")
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the PyTorch process did not allocate in time")
	}
	cg, err := CgroupOf("/proc", cmd.Process.Pid)
	if err != nil || cg != "/"+name {
		t.Fatalf("process cgroup %q (%v), want /%s", cg, err, name)
	}
	src, err := nvmlsource.New(nvml.New(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	inv, err := src.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	grant := func(mib int64) []checkpoint.Record {
		return []checkpoint.Record{{ContainerID: "verify", Namespace: "ns", Pod: "torch", Container: "main", Cgroup: "/" + name,
			Devices: []api.DeviceGrant{{UUID: inv.GPUs[0].UUID, MemoryMiB: mib}}}}
	}
	limit := int64(8192)
	var events []string
	var killed []int
	w, err := New(Config{Source: src, Records: func() []checkpoint.Record { return grant(limit) }, Action: ActionKill,
		Log:   funcr.New(func(p, a string) { t.Log(p, a) }, funcr.Options{}),
		Event: func(r checkpoint.Record, reason, msg string) { events = append(events, reason+": "+msg) },
		Kill: func(pid int) error {
			killed = append(killed, pid)
			return syscall.Kill(pid, syscall.SIGKILL)
		}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := w.Check()
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	for _, c := range s.Containers {
		t.Logf("container %s on %s: used %d MiB, limit %d MiB, SM %d%%, pids %v", c.Record.Container, c.GPU, c.UsedMiB, c.LimitMiB, c.SMPercent, c.PIDs)
		if c.Record.ContainerID == "verify" && c.GPU == inv.GPUs[0].UUID {
			used = c.UsedMiB
			if len(c.PIDs) != 1 || c.PIDs[0] != cmd.Process.Pid {
				t.Errorf("pids %v, want [%d]", c.PIDs, cmd.Process.Pid)
			}
		}
	}
	t.Logf("unattributed: %v", s.Unattributed)
	if used < 1024 {
		t.Fatalf("attributed %d MiB to the container, want at least 1024", used)
	}
	if len(s.Acted) != 0 {
		t.Fatalf("acted under the limit: %v", s.Acted)
	}
	limit = 512
	s, err = w.Check()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Acted) != 1 || len(killed) != 1 || killed[0] != cmd.Process.Pid {
		t.Fatalf("acted %v killed %v", s.Acted, killed)
	}
	t.Logf("events: %s", strings.Join(events, "\n"))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Logf("process ended: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the process survived the kill")
	}
}

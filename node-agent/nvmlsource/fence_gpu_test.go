// SPDX-License-Identifier: Apache-2.0

//go:build gpu

package nvmlsource

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// allocProgram creates a context on the first visible GPU and allocates argv[1] bytes
// with the driver API, without the CUDA hook: exit 0 when the allocation succeeds, 2
// when the driver refuses it, 3 when no context can be made.
const allocProgram = `
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
def need(r, what):
    if r != 0:
        print(what, "failed:", r); sys.exit(3)
need(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
need(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
need(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
p = ctypes.c_uint64()
r = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(sys.argv[1])))
print("cuMemAlloc", sys.argv[1], "->", r)
sys.exit(0 if r == 0 else 2)
`

// TestRealDriverMemoryFence (go test -tags gpu, as root) asks the machine's driver
// whether it holds a cgroup's GPU memory (nvmlDeviceSetMemoryLimits_v1, r615 and
// later, cgroup v2) and says so. Where it does, it makes a fresh cgroup, checks that a
// process in it (without the hook) allocates 4 GiB, sets a 2 GiB limit and checks that
// the same allocation now fails in the driver. Where it does not (r580 and older
// drivers), the test passes: the node has the hook's and the watchdog's fences only.
func TestRealDriverMemoryFence(t *testing.T) {
	src, err := New(nvml.New(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	driver, _ := src.lib.SystemGetDriverVersion()
	const root = "/sys/fs/cgroup"
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Logf("driver %s: no driver memory fence on this host: %s is not a cgroup v2 hierarchy (the hook and the watchdog are its fences)", driver, root)
		return
	}
	sup, err := src.FenceSupport(root)
	if err != nil {
		t.Fatal(err)
	}
	var uuid string
	for _, s := range sup {
		if s.Supported {
			t.Logf("driver %s: GPU %s: driver memory fence supported", driver, s.UUID)
			if uuid == "" {
				uuid = s.UUID
			}
		} else {
			t.Logf("driver %s: GPU %s: no driver memory fence (%s): the hook and the watchdog are its fences", driver, s.UUID, s.Reason)
		}
	}
	if uuid == "" {
		t.Logf("driver %s: no driver memory fence on this driver", driver)
		// What the agent then does: it never calls the driver's limit.
		if err := src.SetMemoryLimit(sup[0].UUID, root, 1<<30, 1<<30); err == nil {
			t.Errorf("setting a limit succeeded on a driver reported without the fence")
		}
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("the driver has the memory fence, but making a cgroup and setting its limit needs root")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is needed to allocate through the driver API without the hook")
	}
	cg := filepath.Join(root, fmt.Sprintf("tessera-fence-test-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(cg)
	run := func(bytes uint64) int {
		t.Helper()
		fd, err := unix.Open(cg, unix.O_DIRECTORY|unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		cmd := exec.Command("python3", "-c", allocProgram, fmt.Sprint(bytes))
		cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+uuid)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		out, err := cmd.CombinedOutput()
		t.Logf("allocation of %d MiB in %s: %s", bytes>>20, cg, out)
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	}
	if code := run(4 << 30); code != 0 {
		t.Fatalf("4 GiB without a limit: exit %d, want the allocation to succeed", code)
	}
	if err := src.SetMemoryLimit(uuid, cg, 2<<30, 2<<30); err != nil {
		t.Fatal(err)
	}
	l, err := src.MemoryLimit(uuid, cg)
	if err != nil || !l.Set || l.Hard != 2<<30 {
		t.Fatalf("limit read back: %+v, %v", l, err)
	}
	if code := run(4 << 30); code != 2 {
		t.Errorf("4 GiB under a 2 GiB driver limit: exit %d, want the driver to refuse the allocation (2)", code)
	}
	if err := src.SetMemoryLimit(uuid, cg, 0, ^uint64(0)); err != nil {
		t.Errorf("clearing the limit: %v", err)
	}
}

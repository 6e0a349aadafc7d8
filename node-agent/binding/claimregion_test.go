// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tessera-dev/tessera/api"
)

// A claim's region directory gets a tmpfs of its own while the claim is bound: what
// its tenants write there stops at the tmpfs's size instead of filling the limits
// root's file system, and the tmpfs goes with the claim. Mounting needs root (CI runs
// as root).
func TestClaimRegionTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe")
	if err := os.Mkdir(probe, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := (TmpfsRegions{}).Mount(probe); errors.Is(err, unix.EPERM) {
		t.Skipf("mounting a tmpfs is not permitted here (no CAP_SYS_ADMIN): %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	if err := (TmpfsRegions{}).Unmount(probe); err != nil {
		t.Fatal(err)
	}
	b, _ := newClaimBinder(t, dir)
	b.cfg.ClaimRegions = TmpfsRegions{}
	c := Claim{UID: "tmpfs-uid", Namespace: "team", Name: "infer-gpu", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096, Cores: 20}}}
	if _, err := b.BindClaim(c); err != nil {
		t.Fatal(err)
	}
	limitsDir := api.HostLimitsDir(filepath.Join(dir, "limits"), ClaimCgroup(c.UID))
	region := filepath.Join(limitsDir, claimRegionSubdir)
	t.Cleanup(func() { _ = unix.Unmount(region, unix.MNT_DETACH) })
	var fs unix.Statfs_t
	if err := unix.Statfs(region, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC || uint64(fs.Blocks)*uint64(fs.Bsize) > uint64(api.RegionDirBytes) {
		t.Fatalf("region directory: file system %#x of %d bytes, want a tmpfs of at most %d", fs.Type, uint64(fs.Blocks)*uint64(fs.Bsize), api.RegionDirBytes)
	}
	if fi, err := os.Stat(region); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("region directory: %v %v, want mode 1777", fi, err)
	}
	// A tenant filling it stops at its size.
	err := os.WriteFile(filepath.Join(region, "fill"), make([]byte, 2*api.RegionDirBytes), 0o644)
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing twice the tmpfs's size: %v, want ENOSPC", err)
	}
	// Bound again (an agent restart): the same tmpfs, not a second one on top.
	if _, err := b.BindClaim(c); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, region); n != 1 {
		t.Errorf("%d mounts at the region directory after a second bind, want 1", n)
	}
	if err := b.UnbindClaim(c.UID); err != nil {
		t.Fatalf("unbind: %v", err)
	}
	if _, err := os.Stat(limitsDir); !os.IsNotExist(err) {
		t.Errorf("the claim's limits directory after unbind: %v", err)
	}
	if n := mountsAt(t, region); n != 0 {
		t.Errorf("%d mounts left at the region directory after unbind", n)
	}
}

// mountsAt counts the mounts of this process's namespace at dir.
func mountsAt(t *testing.T, dir string) int {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}

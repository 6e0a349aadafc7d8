// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/tessera-dev/tessera/api"
)

// ClaimRegionFS gives a DRA claim's region directory a file system of its own. The
// containers of a claim share its accounting region, so the directory is a host
// directory under the claim's limits directory, mounted into each of them, and not a
// tmpfs the runtime makes per container (RegionMount). Without a file system of its
// own, what the claim's tenants write there is bounded only by the file system of the
// limits root (the host's /run by default, which kubelet's and the runtime's sockets
// share).
type ClaimRegionFS interface {
	// Mount makes dir the root of a file system of its own; one it already is the root
	// of is kept (a claim bound again after an agent restart).
	Mount(dir string) error
	// Unmount takes it away again; a directory that is not one is no error.
	Unmount(dir string) error
}

// TmpfsRegions mounts at a claim's region directory a tmpfs of the size and inodes a
// container's own region directory has (api.RegionDirBytes, regionInodes), nosuid,
// nodev, noexec, mode 1777. The node agent needs CAP_SYS_ADMIN in the mount namespace
// of the host's limits root (the chart mounts it with Bidirectional propagation), so
// that the runtime, which bind-mounts the directory into the claim's containers, sees
// the tmpfs.
type TmpfsRegions struct{}

// Mount mounts the tmpfs at dir unless dir already is a mount of its own.
func (TmpfsRegions) Mount(dir string) error {
	own, err := ownMount(dir)
	if err != nil {
		return err
	}
	if own {
		return nil
	}
	opts := "size=" + strconv.Itoa(api.RegionDirBytes) + ",nr_inodes=" + strconv.Itoa(regionInodes) + ",mode=1777"
	if err := unix.Mount("tessera-claim-region", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mounting a tmpfs of %d bytes at the claim's region directory %s: %w (the node agent needs CAP_SYS_ADMIN "+
			"and its limits root shared with the host; --dra-claim-region-tmpfs=false keeps the directory on the limits root's file system)", api.RegionDirBytes, dir, err)
	}
	return nil
}

// Unmount detaches the tmpfs at dir, if dir is a mount of its own.
func (TmpfsRegions) Unmount(dir string) error {
	own, err := ownMount(dir)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if !own {
		return nil
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting the claim's region directory %s: %w", dir, err)
	}
	return nil
}

// ownMount reports whether dir is on another file system than its parent: the root
// of a mount of its own.
func ownMount(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, fmt.Errorf("claim region directory %s: %w", dir, err)
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("claim region directory %s: %w", dir, err)
	}
	return st.Dev != parent.Dev, nil
}

// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"

	"github.com/tessera-dev/tessera/api"
)

// A container granted no cores on a time-sliced GPU is paced by its hook to what the
// reservations there leave (api/shares.go; docs/cuda-hook.md, "Unreserved
// containers"). The binder keeps each GPU's share file, under
// <limits root>/api.SharesSubdir/<uuid>/, in step with the containers bound on the GPU:
// it rewrites it (atomically, by renaming a new file over it) whenever a container
// is bound to the GPU or forgotten, and after a reconcile. The GPU's directory, not the
// file, is bind-mounted read-only at api.ContainerSharesDir/<uuid>, so that the
// container sees each new file and cannot write any.

// shareDirMode: containers run as any user and must be able to read the file.
const shareDirMode = 0o755

// ShareDirMounts makes sure the share directory of each GPU in uuids exists under
// limitsRoot and returns its read-only bind mount at api.ContainerSharesDir/<uuid>, in
// the order of uuids, once per GPU. A symbolic link or anything else in a directory's
// place is an error.
func ShareDirMounts(limitsRoot string, uuids []string) ([]Mount, error) {
	var mounts []Mount
	for _, uuid := range uuids {
		dir, err := api.HostSharesDir(limitsRoot, uuid)
		if err != nil {
			return nil, err
		}
		dst := path.Join(api.ContainerSharesDir, uuid)
		if slices.ContainsFunc(mounts, func(m Mount) bool { return m.Destination == dst }) {
			continue
		}
		if err := ensureShareDir(dir); err != nil {
			return nil, err
		}
		mounts = append(mounts, Mount{Source: dir, Destination: dst, ReadOnly: true})
	}
	return mounts, nil
}

func ensureShareDir(dir string) error {
	if err := os.MkdirAll(dir, shareDirMode); err != nil {
		return fmt.Errorf("GPU share directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("GPU share directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("GPU share directory %s is %s, not a directory: remove it; the node agent creates it again", dir, fileKind(fi.Mode()))
	}
	return os.Chmod(dir, shareDirMode)
}

// shareMounts returns the read-only mounts of the share directories of the GPUs the
// container has without cores; nothing for an MPS client (MPS divides the SMs, the
// hook paces nothing).
func (b *Binder) shareMounts(limits *api.ContainerLimits) ([]Mount, error) {
	if limits.MPS != nil {
		return nil, nil
	}
	var unreserved []string
	for _, g := range limits.GPUs {
		if g.Cores == 0 {
			unreserved = append(unreserved, g.UUID)
		}
	}
	if len(unreserved) == 0 {
		return nil, nil
	}
	return ShareDirMounts(b.cfg.LimitsRoot, unreserved)
}

// UnreservedShare computes a GPU's share file from the bound containers that may still
// compute there: the compute windows granted on it, and how many containers have it
// without cores. The caller holds b.mu (or no bind can run).
func (b *Binder) UnreservedShare(uuid string) api.UnreservedShare {
	var reserved []api.PhaseSpan
	n := 0
	for _, r := range b.allRecords() {
		if b.windowFree(r) {
			continue
		}
		for _, d := range r.Devices {
			switch {
			case d.UUID != uuid:
			case d.Cores > 0:
				reserved = append(reserved, api.PhaseSpan{Phase: r.Phases[uuid], Cores: d.Cores})
			default:
				n++
			}
		}
	}
	return api.ComputeUnreservedShare(reserved, n)
}

// writeShares rewrites the share file of each GPU in uuids. The caller holds b.mu.
func (b *Binder) writeShares(uuids []string) error {
	for _, uuid := range uuids {
		dir, err := api.HostSharesDir(b.cfg.LimitsRoot, uuid)
		if err != nil {
			return err
		}
		if err := ensureShareDir(dir); err != nil {
			return err
		}
		data, err := api.EncodeShare(b.UnreservedShare(uuid))
		if err != nil {
			return fmt.Errorf("GPU share file of %s: %w", uuid, err)
		}
		if err := writeAtomic(filepath.Join(dir, api.ShareFileName), data, 0o644); err != nil {
			return fmt.Errorf("GPU share file of %s: %w", uuid, err)
		}
	}
	return nil
}

// RefreshShares rewrites the share file of every GPU that a bound container has or
// that has a share directory: after a reconcile, and on the agent's start, so that
// files follow containers that left while the agent was down and pods that finished.
func (b *Binder) RefreshShares() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var uuids []string
	for _, r := range b.allRecords() {
		for _, d := range r.Devices {
			if !slices.Contains(uuids, d.UUID) {
				uuids = append(uuids, d.UUID)
			}
		}
	}
	entries, err := os.ReadDir(filepath.Join(b.cfg.LimitsRoot, api.SharesSubdir))
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("GPU share directories: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() && !slices.Contains(uuids, e.Name()) {
			uuids = append(uuids, e.Name())
		}
	}
	return b.writeShares(uuids)
}

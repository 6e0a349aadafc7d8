// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/tessera-dev/tessera/api"
)

// The CUDA hooks of the containers paced on one time-sliced GPU take turns on it
// through that GPU's turn file (api.TurnFileName; its layout is the hook's,
// docs/cuda-hook.md, "GPU turns"). The binder creates the file when it binds a
// container paced on the GPU and bind-mounts it, read-write, at
// api.ContainerTurnsDir/<name>: each file on its own, never the directory, so that a
// tenant (even root in its container) can neither remove nor replace a turn file
// (a mount point cannot be unlinked) nor reach the files of GPUs it is not on. A file
// is never removed or replaced: the containers running on its GPU have it mapped and
// must keep sharing one inode, so a file of another size is resized in place and a
// new file appears only where none was.

// turnsDirMode and turnFileMode are set explicitly, whatever the agent's umask:
// containers run as any user and must be able to map the files read-write.
const (
	turnsDirMode = 0o755
	turnFileMode = 0o666
)

// turnsRecovery is what to do about something else in a turn file's place that the
// agent could not remove.
const turnsRecovery = "remove it; the node agent creates the file again when it next binds a container paced on that GPU"

// EnsureTurnsDir makes sure the GPU turns directory dir exists, with mode 0755. A
// symbolic link or anything else in its place is an error.
func EnsureTurnsDir(dir string) error {
	if err := os.MkdirAll(dir, turnsDirMode); err != nil {
		return fmt.Errorf("GPU turns directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("GPU turns directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("GPU turns directory %s is %s, not a directory: remove it; the node agent creates the directory", dir, fileKind(fi.Mode()))
	}
	if err := os.Chmod(dir, turnsDirMode); err != nil {
		return fmt.Errorf("GPU turns directory: %w", err)
	}
	return nil
}

// TurnFileMounts makes sure the turns directory dir and the turn file of each GPU in
// uuids exist, and returns the read-write bind mount of each file at
// api.ContainerTurnsDir/<name>, in the order of uuids, once per file.
func TurnFileMounts(dir string, uuids []string) ([]Mount, error) {
	if err := EnsureTurnsDir(dir); err != nil {
		return nil, err
	}
	var mounts []Mount
	for _, uuid := range uuids {
		name, err := api.TurnFileName(uuid)
		if err != nil {
			return nil, err
		}
		dst := path.Join(api.ContainerTurnsDir, name)
		if slices.ContainsFunc(mounts, func(m Mount) bool { return m.Destination == dst }) {
			continue
		}
		if err := ensureTurnPath(filepath.Join(dir, name), true); err != nil {
			return nil, err
		}
		mounts = append(mounts, Mount{Source: filepath.Join(dir, name), Destination: dst})
	}
	return mounts, nil
}

// ensureTurnPath makes sure p is a turn file: a regular file of api.TurnFileBytes
// bytes with mode 0666. A new file is all zeroes, which the hook reads as no turns
// taken. With replace, anything else in its place (something on the host, or left by
// a container that had the whole directory mounted before the files were mounted one
// by one) is removed, without following it, and a new file made, once: what takes
// its place again is refused. The containers that had a removed file mapped keep
// coordinating among themselves, and with the new ones only through their own pacing.
func ensureTurnPath(p string, replace bool) error {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, turnFileMode)
	if errors.Is(err, fs.ErrExist) {
		fi, lerr := os.Lstat(p)
		if lerr != nil {
			return fmt.Errorf("GPU turn file: %w", lerr)
		}
		if !fi.Mode().IsRegular() {
			if !replace {
				return fmt.Errorf("GPU turn file %s is %s, not a regular file: %s", p, fileKind(fi.Mode()), turnsRecovery)
			}
			// os.RemoveAll unlinks a symbolic link itself and never follows one.
			if rerr := os.RemoveAll(p); rerr != nil {
				return fmt.Errorf("GPU turn file %s is %s, not a regular file, and removing it failed (%v): %s", p, fileKind(fi.Mode()), rerr, turnsRecovery)
			}
			return ensureTurnPath(p, false)
		}
		// O_NONBLOCK: should a named pipe take the file's place after the check, the
		// open does not wait for a writer; the check below refuses it.
		f, err = os.OpenFile(p, os.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	}
	if err != nil {
		return fmt.Errorf("GPU turn file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("GPU turn file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("GPU turn file %s is %s, not a regular file: %s", p, fileKind(fi.Mode()), turnsRecovery)
	}
	if fi.Size() != api.TurnFileBytes {
		// In place: the containers that have the file mapped keep sharing it.
		if err := f.Truncate(api.TurnFileBytes); err != nil {
			return fmt.Errorf("GPU turn file: resizing %s to %d bytes: %w", p, api.TurnFileBytes, err)
		}
	}
	if err := f.Chmod(turnFileMode); err != nil {
		return fmt.Errorf("GPU turn file: %w", err)
	}
	return f.Close()
}

// turnMounts makes sure the turn file of every GPU the hook paces the container on
// exists, and returns the read-write mount of each; nothing when the node agent
// provides no turns, the container is an MPS client (MPS divides the SMs, the hook
// paces nothing) or it is paced on no GPU (cores 0: not paced; 100: the whole GPU's
// time).
func (b *Binder) turnMounts(limits *api.ContainerLimits) ([]Mount, error) {
	if b.cfg.TurnsDir == "" || limits.MPS != nil {
		return nil, nil
	}
	var paced []string
	for _, g := range limits.GPUs {
		if g.Cores > 0 && g.Cores < 100 {
			paced = append(paced, g.UUID)
		}
	}
	if len(paced) == 0 {
		return nil, nil
	}
	return TurnFileMounts(b.cfg.TurnsDir, paced)
}

// fileKind names what a file that should be a regular file or directory is instead.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device node"
	}
	return "a special file"
}

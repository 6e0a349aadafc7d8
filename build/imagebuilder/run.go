// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// errNoChroot says that this machine lets the builder neither chroot as root nor
// create a user namespace to chroot in.
var errNoChroot = errors.New("cannot chroot: not root, and user namespaces are not available")

// loadImage reads the image of one architecture from an image index of an OCI layout
// written by WriteLayout.
func loadImage(layoutDir, image, arch string) (v1.Image, *v1.ConfigFile, error) {
	images, err := readLayout(layoutDir)
	if err != nil {
		return nil, nil, err
	}
	li := images[image]
	if li == nil {
		return nil, nil, fmt.Errorf("reading %s: no image %s in it", layoutDir, image)
	}
	img, err := platformImage(li.Index, arch)
	if err != nil {
		return nil, nil, fmt.Errorf("%s in %s: %w", image, layoutDir, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", image, err)
	}
	return img, cf, nil
}

// platformImage is the index's image for linux/arch.
func platformImage(idx v1.ImageIndex, arch string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == arch {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("no linux/%s image", arch)
}

// unpack writes the image's root filesystem (its layers applied in order) into dir,
// which must exist. Nothing in the image can write outside dir: paths are resolved
// inside it, symbolic links included.
func unpack(img v1.Image, dir string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	return unpackTar(rc, dir)
}

// unpackTar writes a flattened root filesystem tar into dir.
func unpackTar(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	type dirMode struct {
		name string
		mode fs.FileMode
	}
	var dirs []dirMode
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "/"))
		if name == "." {
			continue
		}
		if name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("layer entry %q climbs out of the root", h.Name)
		}
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		mode := fs.FileMode(h.Mode).Perm()
		if h.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			dirs = append(dirs, dirMode{name, mode})
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = root.Chmod(name, mode)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		case tar.TypeSymlink:
			_ = root.Remove(name)
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		case tar.TypeLink:
			if err := root.Link(path.Clean(strings.TrimPrefix(h.Linkname, "/")), name); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		default:
			return fmt.Errorf("%s: unsupported entry type %q", name, h.Typeflag)
		}
	}
	// Directories last: one without write permission must not stop its own content.
	for _, d := range dirs {
		if err := root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
	}
	return nil
}

// chrootCommand returns a command that runs argv inside the root filesystem dir, with
// the image's environment. As root it runs as the image's user; otherwise in a new
// user namespace where the caller is root (what unshare --map-root-user does).
func chrootCommand(dir string, cf *v1.ConfigFile, argv []string) (*exec.Cmd, error) {
	if len(argv) == 0 || !path.IsAbs(argv[0]) {
		return nil, fmt.Errorf("command %q: want an absolute path inside the image", argv)
	}
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Dir: "/", Env: cf.Config.Env}
	attr := &syscall.SysProcAttr{Chroot: dir}
	if os.Geteuid() == 0 {
		uid, gid, err := parseUser(cf.Config.User)
		if err != nil {
			return nil, err
		}
		attr.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	} else {
		attr.Cloneflags = syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
	cmd.SysProcAttr = attr
	return cmd, nil
}

// runChrooted runs the command and returns its combined output; errNoChroot when the
// machine allows no chroot at all.
func runChrooted(dir string, cf *v1.ConfigFile, argv []string) ([]byte, error) {
	cmd, err := chrootCommand(dir, cf, argv)
	if err != nil {
		return nil, err
	}
	out, err := cmd.CombinedOutput()
	var errno syscall.Errno
	if err != nil && errors.As(err, &errno) && (errno == syscall.EPERM || errno == syscall.EINVAL || errno == syscall.ENOSPC) && cmd.Process == nil {
		return out, fmt.Errorf("%w (%v)", errNoChroot, err)
	}
	return out, err
}

func parseUser(u string) (uint32, uint32, error) {
	if u == "" {
		return 0, 0, nil
	}
	us, gs, hasGroup := strings.Cut(u, ":")
	uid, err := strconv.ParseUint(us, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("image user %q: not numeric", u)
	}
	gid := uid
	if hasGroup {
		if gid, err = strconv.ParseUint(gs, 10, 32); err != nil {
			return 0, 0, fmt.Errorf("image user %q: not numeric", u)
		}
	}
	return uint32(uid), uint32(gid), nil
}

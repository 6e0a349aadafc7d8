// SPDX-License-Identifier: Apache-2.0

// Package hookinstall installs the CUDA hook library from the node agent's image onto
// the host: "tessera-node-agent install-hook", run by the DaemonSet's init container,
// so that the image needs no shell or coreutils.
//
// The library is written under a temporary name in the destination directory, checked
// against the checksum recorded when the image was built, and renamed over the old one:
// processes that have the old library mapped keep it, and no container ever loads a
// half-written file.
package hookinstall

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tessera-dev/tessera/internal/filehash"
)

// DefaultSource is where the node agent's image carries the hook.
const DefaultSource = "/opt/tessera/lib/libtessera-cuda.so"

// Options say what to install where.
type Options struct {
	Source string // the library in the image
	// Checksum is a sha256sum-format file for Source; empty: none is checked (the
	// copy is still verified against the source).
	Checksum string
	Dir      string // destination directory on the host
}

// Result reports an installation.
type Result struct {
	Path   string
	SHA256 string
	// Unchanged: the same library was already installed and was left in place.
	Unchanged bool
}

// Install copies the library into Dir under its own name, atomically.
func Install(o Options) (*Result, error) {
	if o.Dir == "" || !filepath.IsAbs(o.Dir) {
		return nil, fmt.Errorf("destination directory %q: want an absolute path", o.Dir)
	}
	st, err := os.Stat(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("destination directory: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("destination %s is not a directory", o.Dir)
	}
	var want string
	if o.Checksum != "" {
		if want, err = readChecksum(o.Checksum, filepath.Base(o.Source)); err != nil {
			return nil, err
		}
	}
	src, err := os.Open(o.Source)
	if err != nil {
		return nil, fmt.Errorf("hook library: %w", err)
	}
	defer src.Close()
	if sst, err := src.Stat(); err != nil || !sst.Mode().IsRegular() {
		return nil, fmt.Errorf("hook library %s is not a regular file", o.Source)
	}
	dst := filepath.Join(o.Dir, filepath.Base(o.Source))

	tmp, err := os.CreateTemp(o.Dir, "."+filepath.Base(o.Source)+".new-*")
	if err != nil {
		return nil, fmt.Errorf("writing to %s: %w", o.Dir, err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), src); err != nil {
		return nil, fmt.Errorf("copying %s: %w", o.Source, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if want != "" && got != want {
		return nil, fmt.Errorf("%s does not match its checksum (%s): sha256 %s, recorded %s; the image is damaged", o.Source, o.Checksum, got, want)
	}
	if err := tmp.Chmod(0o755); err != nil {
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		return nil, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	// What reached the disk, read back.
	written, err := filehash.SHA256(tmp.Name())
	if err != nil {
		return nil, err
	}
	if written != got {
		return nil, fmt.Errorf("%s reads back with sha256 %s, not %s as written", tmp.Name(), written, got)
	}
	if old, err := filehash.SHA256(dst); err == nil && old == got {
		return &Result{Path: dst, SHA256: got, Unchanged: true}, nil
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return nil, fmt.Errorf("installing %s: %w", dst, err)
	}
	committed = true
	if d, err := os.Open(o.Dir); err == nil {
		_ = d.Sync() // the rename itself durable; best effort on filesystems without it
		d.Close()
	}
	return &Result{Path: dst, SHA256: got}, nil
}

// readChecksum reads the sha256sum-format line for name.
func readChecksum(file, name string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("checksum: %w", err)
	}
	for _, line := range strings.Split(string(bytes.TrimSpace(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || strings.TrimPrefix(f[1], "*") != name {
			continue
		}
		if len(f[0]) != sha256.Size*2 {
			break
		}
		if _, err := hex.DecodeString(f[0]); err != nil {
			break
		}
		return strings.ToLower(f[0]), nil
	}
	return "", fmt.Errorf("checksum file %s has no sha256 line for %s", file, name)
}

// Main is the install-hook command line; it returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tessera-node-agent install-hook", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o Options
	fs.StringVar(&o.Dir, "to", "", "host directory to install the hook into (required)")
	fs.StringVar(&o.Source, "from", DefaultSource, "the hook library to install")
	fs.StringVar(&o.Checksum, "checksum", "", `sha256sum-format file to verify the library against (default "<from>.sha256"; "none" skips it)`)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || o.Dir == "" {
		fmt.Fprintln(stderr, "usage: tessera-node-agent install-hook --to DIR [--from FILE] [--checksum FILE]")
		return 2
	}
	switch o.Checksum {
	case "":
		o.Checksum = o.Source + ".sha256"
	case "none":
		o.Checksum = ""
	}
	res, err := Install(o)
	if err != nil {
		fmt.Fprintln(stderr, "install-hook:", err)
		return 1
	}
	if res.Unchanged {
		fmt.Fprintf(stdout, "the CUDA hook at %s is current (sha256 %s)\n", res.Path, res.SHA256)
	} else {
		fmt.Fprintf(stdout, "installed the CUDA hook at %s (sha256 %s)\n", res.Path, res.SHA256)
	}
	return 0
}

// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// tree is the content of one layer, built up in memory and written as a tar whose
// bytes depend on nothing but the content: entries sorted by path, owned by the
// numbers given (never the build machine's users), every time the same timestamp.
type tree struct {
	entries map[string]*entry // key: clean path without the leading slash
}

type entry struct {
	typ      byte // tar.TypeDir, tar.TypeReg, tar.TypeSymlink
	mode     int64
	uid, gid int
	data     []byte // regular files held in memory
	src      string // or read from here when the layer is written
	size     int64
	link     string
}

func newTree() *tree { return &tree{entries: map[string]*entry{}} }

func key(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// dir adds a directory and any missing parents.
func (t *tree) dir(p string, mode int64, uid, gid int) error {
	k := key(p)
	if k == "" {
		return nil
	}
	if err := t.parents(k); err != nil {
		return err
	}
	if e, ok := t.entries[k]; ok {
		if e.typ != tar.TypeDir {
			return fmt.Errorf("/%s: a directory and a file at the same path", k)
		}
		return nil
	}
	t.entries[k] = &entry{typ: tar.TypeDir, mode: mode, uid: uid, gid: gid}
	return nil
}

func (t *tree) parents(k string) error {
	if d := path.Dir(k); d != "." {
		return t.dir(d, 0o755, 0, 0)
	}
	return nil
}

func (t *tree) add(k string, e *entry) error {
	if err := t.parents(k); err != nil {
		return err
	}
	if old, ok := t.entries[k]; ok {
		if old.typ == tar.TypeDir || !sameContent(old, e) {
			return fmt.Errorf("/%s: added twice with different content", k)
		}
		return nil
	}
	t.entries[k] = e
	return nil
}

func sameContent(a, b *entry) bool {
	return a.typ == b.typ && a.mode == b.mode && a.link == b.link && a.src == b.src &&
		bytes.Equal(a.data, b.data) && a.uid == b.uid && a.gid == b.gid
}

// bytes adds a regular file with the given content.
func (t *tree) bytes(p string, data []byte, mode int64) error {
	return t.add(key(p), &entry{typ: tar.TypeReg, mode: mode, data: data, size: int64(len(data))})
}

// file adds a regular file read from src on the build machine when the layer is
// written; only its content is taken, not its owner, mode or time.
func (t *tree) file(p, src string, mode int64) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", src)
	}
	return t.add(key(p), &entry{typ: tar.TypeReg, mode: mode, src: src, size: st.Size()})
}

func (t *tree) symlink(p, target string) error {
	return t.add(key(p), &entry{typ: tar.TypeSymlink, mode: 0o777, link: target})
}

// addDir copies a directory of the build machine (an unpacked package) into the tree
// under /, keeping modes and symlinks; every entry is owned by root. skip is asked
// for each path (absolute, as in the image) and drops it, and below it, when true.
func (t *tree) addDir(root string, skip func(p string, isDir bool) bool) error {
	return filepath.WalkDir(root, func(file string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, file)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		p := "/" + filepath.ToSlash(rel)
		if skip != nil && skip(p, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		perm := int64(info.Mode().Perm())
		if info.Mode()&fs.ModeSetuid != 0 {
			perm |= 0o4000
		}
		if info.Mode()&fs.ModeSetgid != 0 {
			perm |= 0o2000
		}
		if info.Mode()&fs.ModeSticky != 0 {
			perm |= 0o1000
		}
		switch {
		case d.IsDir():
			k := key(p)
			if e, ok := t.entries[k]; ok && e.typ == tar.TypeDir {
				return nil // shared by several packages
			}
			if err := t.parents(k); err != nil {
				return err
			}
			if e, ok := t.entries[k]; ok && e.typ != tar.TypeDir {
				return fmt.Errorf("%s: a directory and a file at the same path", p)
			}
			t.entries[k] = &entry{typ: tar.TypeDir, mode: perm}
			return nil
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(file)
			if err != nil {
				return err
			}
			return t.symlink(p, target)
		case info.Mode().IsRegular():
			return t.add(key(p), &entry{typ: tar.TypeReg, mode: perm, src: file, size: info.Size()})
		default:
			return fmt.Errorf("%s: unsupported file type %s", p, info.Mode().Type())
		}
	})
}

// paths returns the entries' keys in the order they are written.
func (t *tree) paths() []string {
	keys := make([]string, 0, len(t.entries))
	for k := range t.entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// writeTar writes the layer. mtime is every entry's modification time.
func (t *tree) writeTar(w io.Writer, mtime time.Time) error {
	tw := tar.NewWriter(w)
	for _, k := range t.paths() {
		e := t.entries[k]
		h := &tar.Header{
			Typeflag: e.typ,
			Name:     k,
			Mode:     e.mode,
			Uid:      e.uid,
			Gid:      e.gid,
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		switch e.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = e.link
		case tar.TypeReg:
			h.Size = e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("/%s: %w", k, err)
		}
		if e.typ != tar.TypeReg {
			continue
		}
		if e.src == "" {
			if _, err := tw.Write(e.data); err != nil {
				return err
			}
			continue
		}
		if err := copyFile(tw, e.src, e.size); err != nil {
			return fmt.Errorf("/%s: %w", k, err)
		}
	}
	return tw.Close()
}

func copyFile(w io.Writer, src string, size int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size+1))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%s changed size while the image was built (%d, now %d bytes)", src, size, n)
	}
	return nil
}

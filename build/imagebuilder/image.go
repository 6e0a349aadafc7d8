package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BuildOptions are the inputs of a build besides the spec.
type BuildOptions struct {
	Root     string    // the repository root: files' src are relative to it
	Out      string    // the image tarball is written here as <name>.tar
	Registry string    // e.g. ghcr.io/tessera-dev
	Tag      string    // e.g. 0.1.0
	Version  string    // org.opencontainers.image.version
	Revision string    // org.opencontainers.image.revision (the commit)
	Source   string    // org.opencontainers.image.source
	Created  time.Time // every timestamp in the image (SOURCE_DATE_EPOCH)
	Arch     string    // GOARCH naming: amd64, arm64
	DebsDir  string    // .debs fetched before; empty: apt-get download
}

// Result describes a built image.
type Result struct {
	Ref      name.Tag
	Digest   v1.Hash
	Path     string
	Packages []*debPackage
}

const nonrootUID = 65532

// Build assembles the image of spec and writes it as a docker save tarball (loadable by
// docker load, podman load and ctr import) to o.Out/<name>.tar. Two builds of the same
// spec from the same files give the same digest.
func Build(ctx context.Context, spec *Spec, o BuildOptions) (*Result, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	ref, err := name.NewTag(o.Registry+"/"+spec.Name+":"+o.Tag, name.WeakValidation)
	if err != nil {
		return nil, fmt.Errorf("image reference: %w", err)
	}
	if o.Arch == "" {
		return nil, fmt.Errorf("no target architecture")
	}
	created := o.Created.UTC().Truncate(time.Second)
	tmp, err := os.MkdirTemp("", "imagebuilder-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	// Layer 1: the base. Users, /tmp, and the Debian packages if any.
	base := newTree()
	if err := baseFiles(base); err != nil {
		return nil, err
	}
	baseBy := "tessera imagebuilder: /etc/passwd, /etc/group, /tmp"
	var pkgs []*debPackage
	if spec.Debian != nil {
		debs, err := fetchDebs(ctx, spec.Debian.Packages, o.DebsDir, tmp)
		if err != nil {
			return nil, err
		}
		if pkgs, err = debianLayer(ctx, base, debs, spec.Debian.Drop, tmp); err != nil {
			return nil, err
		}
		for _, p := range pkgs {
			if p.Arch != "all" && p.Arch != debArch(o.Arch) {
				return nil, fmt.Errorf("debian package %s is for %s, the image for %s", p.Name, p.Arch, o.Arch)
			}
		}
		// Debian's ldconfig reads this; the NVIDIA container toolkit runs ldconfig in
		// the container after it mounts the driver's libraries.
		if err := base.bytes("/etc/ld.so.conf", []byte("include /etc/ld.so.conf.d/*.conf\n"), 0o644); err != nil {
			return nil, err
		}
		baseBy += ", Debian packages " + packageList(pkgs)
	}

	// Layer 2: the files the repository's make targets built.
	app := newTree()
	for _, f := range spec.Files {
		src := f.Src
		if !filepath.IsAbs(src) {
			src = filepath.Join(o.Root, src)
		}
		mode, _ := f.mode()
		if err := app.file(f.Dst, src, mode); err != nil {
			return nil, fmt.Errorf("file %s (for %s): %w", f.Src, f.Dst, err)
		}
		if f.Static {
			if err := checkStatic(src); err != nil {
				return nil, err
			}
		}
		if f.MaxGLIBC != "" {
			if err := checkGLIBC(ctx, src, f.MaxGLIBC); err != nil {
				return nil, err
			}
		}
		if f.Checksum {
			sum, err := sha256File(src)
			if err != nil {
				return nil, err
			}
			line := fmt.Sprintf("%s  %s\n", sum, path.Base(f.Dst))
			if err := app.bytes(f.Dst+".sha256", []byte(line), 0o644); err != nil {
				return nil, err
			}
		}
	}

	// Docker's schema 2 media types: what a docker save tarball records, so the image
	// read back from the tarball (docker load, push) has the digest built here.
	img := mutate.MediaType(empty.Image, types.DockerManifestSchema2)
	img = mutate.ConfigMediaType(img, types.DockerConfigJSON)
	for _, l := range []struct {
		t  *tree
		by string
	}{{base, baseBy}, {app, "tessera imagebuilder: " + spec.Name + " files from make"}} {
		layer, err := l.t.layer(created)
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			MediaType: types.DockerLayer,
			History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: l.by},
		})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = o.Arch
	cf.OS = "linux"
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		User:       spec.User,
		Entrypoint: spec.Entrypoint,
		Cmd:        spec.Cmd,
		Env:        spec.Env,
		WorkingDir: "/",
		Labels:     labels(spec, o, created, pkgs),
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}

	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	out := filepath.Join(o.Out, spec.Name+".tar")
	part := out + ".part"
	if err := tarball.WriteToFile(part, ref, img); err != nil {
		os.Remove(part)
		return nil, fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Rename(part, out); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Out, spec.Name+".digest"), []byte(digest.String()+"\n"), 0o644); err != nil {
		return nil, err
	}
	return &Result{Ref: ref, Digest: digest, Path: out, Packages: pkgs}, nil
}

// layer writes the tree to memory and makes a gzip-compressed layer of it.
func (t *tree) layer(mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	if err := t.writeTar(&buf, mtime); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.DockerLayer))
}

// baseFiles are in every image: root and the nonroot user (65532, as in the distroless
// images), their groups, and /tmp.
func baseFiles(t *tree) error {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		fmt.Sprintf("nonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonrootUID, nonrootUID)
	group := "root:x:0:\n" + fmt.Sprintf("nonroot:x:%d:\n", nonrootUID)
	if err := t.bytes("/etc/passwd", []byte(passwd), 0o644); err != nil {
		return err
	}
	if err := t.bytes("/etc/group", []byte(group), 0o644); err != nil {
		return err
	}
	if err := t.dir("/root", 0o700, 0, 0); err != nil {
		return err
	}
	if err := t.dir("/home/nonroot", 0o700, nonrootUID, nonrootUID); err != nil {
		return err
	}
	return t.dir("/tmp", 0o1777, 0, 0)
}

func labels(spec *Spec, o BuildOptions, created time.Time, pkgs []*debPackage) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       spec.Name,
		"org.opencontainers.image.description": spec.Description,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Revision,
		"org.opencontainers.image.source":      o.Source,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
	if len(pkgs) > 0 {
		l["dev.tessera.image.debian-packages"] = packageList(pkgs)
	}
	for k, v := range spec.Labels {
		l[k] = v
	}
	for k, v := range l {
		if v == "" {
			delete(l, k)
		}
	}
	return l
}

func packageList(pkgs []*debPackage) string {
	s := make([]string, len(pkgs))
	for i, p := range pkgs {
		s[i] = p.Name + "=" + p.Version
	}
	return strings.Join(s, " ")
}

// debArch is Debian's name for a Go architecture.
func debArch(goarch string) string {
	switch goarch {
	case "386":
		return "i386"
	case "arm":
		return "armhf"
	case "ppc64le":
		return "ppc64el"
	}
	return goarch
}

func sha256File(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

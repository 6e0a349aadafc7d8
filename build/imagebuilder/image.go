// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
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

	"github.com/tessera-dev/tessera/internal/filehash"
)

// BuildOptions are the inputs of a build besides the spec.
type BuildOptions struct {
	Root     string    // the repository root: files' src are relative to it
	Out      string    // <name>.digest and <name>.spdx.json are written here
	Registry string    // e.g. ghcr.io/tessera-dev
	Tag      string    // e.g. 0.1.0
	Version  string    // org.opencontainers.image.version
	Revision string    // org.opencontainers.image.revision (the commit)
	Source   string    // org.opencontainers.image.source
	Created  time.Time // every timestamp in the image (SOURCE_DATE_EPOCH)
	// Archs are the image's architectures (GOARCH naming: amd64, arm64), one image
	// manifest each in the image index, in this order.
	Archs   []string
	DebsDir string // .debs fetched before; empty: apt-get download
	// AptDir keeps the package index apt-get downloads from, one per architecture;
	// empty: a temporary one, fetched again at every build.
	AptDir string
}

// Result describes a built image: an OCI image index of one image per architecture,
// and the SBOM that refers to the index.
type Result struct {
	Name     string
	Ref      name.Tag
	Index    v1.ImageIndex
	Digest   v1.Hash // the index's
	Archs    []*ArchImage
	SBOM     v1.Image // an OCI artifact (artifactType application/spdx+json) whose subject is Index
	SBOMJSON []byte
}

// ArchImage is the image of one architecture, and what went into it.
type ArchImage struct {
	Arch     string
	Image    v1.Image
	Digest   v1.Hash
	Packages []*debPackage
	Files    []builtFile
}

// builtFile is a file of the spec as put into one architecture's image.
type builtFile struct {
	Src, Dst string
	SHA256   string
}

const nonrootUID = 65532

// Build assembles the image of spec for each architecture of o.Archs and the image
// index that lists them, with OCI media types, and the index's SBOM. Nothing is
// written; WriteLayout does that. Two builds of the same spec from the same files give
// the same digests.
func Build(ctx context.Context, spec *Spec, o BuildOptions) (*Result, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	ref, err := name.NewTag(o.Registry+"/"+spec.Name+":"+o.Tag, name.WeakValidation)
	if err != nil {
		return nil, fmt.Errorf("image reference: %w", err)
	}
	if len(o.Archs) == 0 {
		return nil, fmt.Errorf("no target architecture")
	}
	res := &Result{Name: spec.Name, Ref: ref}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, arch := range o.Archs {
		if seen[arch] {
			return nil, fmt.Errorf("architecture %s listed twice", arch)
		}
		seen[arch] = true
		ai, err := buildArch(ctx, spec, o, arch)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", arch, err)
		}
		res.Archs = append(res.Archs, ai)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        ai.Image,
			Descriptor: v1.Descriptor{Platform: platform(arch)},
		})
	}
	created := o.Created.UTC().Truncate(time.Second)
	ann := map[string]string{
		"org.opencontainers.image.title":    spec.Name,
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.revision": o.Revision,
		"org.opencontainers.image.source":   o.Source,
		"org.opencontainers.image.created":  created.Format(time.RFC3339),
	}
	for k, v := range ann {
		if v == "" {
			delete(ann, k)
		}
	}
	res.Index = mutate.Annotations(idx, ann).(v1.ImageIndex)
	if res.Digest, err = res.Index.Digest(); err != nil {
		return nil, err
	}
	if res.SBOMJSON, err = spdxDocument(spec, o, res); err != nil {
		return nil, fmt.Errorf("SBOM: %w", err)
	}
	if res.SBOM, err = sbomArtifact(res.Index, res.SBOMJSON, created); err != nil {
		return nil, fmt.Errorf("SBOM: %w", err)
	}
	return res, nil
}

// platform is the index entry's platform of a Go architecture.
func platform(arch string) *v1.Platform {
	p := &v1.Platform{OS: "linux", Architecture: arch}
	if arch == "arm64" {
		p.Variant = "v8"
	}
	return p
}

// srcFor is a file's source for one architecture: {arch} in it is replaced.
func srcFor(root, src, arch string) string {
	src = strings.ReplaceAll(src, "{arch}", arch)
	if !filepath.IsAbs(src) {
		src = filepath.Join(root, src)
	}
	return src
}

// buildArch assembles the image of one architecture.
func buildArch(ctx context.Context, spec *Spec, o BuildOptions, arch string) (*ArchImage, error) {
	created := o.Created.UTC().Truncate(time.Second)
	tmp, err := os.MkdirTemp("", "imagebuilder-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	ai := &ArchImage{Arch: arch}

	// Layer 1: the base. Users, /tmp, and the Debian packages if any.
	base := newTree()
	if err := baseFiles(base); err != nil {
		return nil, err
	}
	baseBy := "tessera imagebuilder: /etc/passwd, /etc/group, /tmp"
	if spec.Debian != nil {
		debs, err := fetchDebs(ctx, spec.Debian.Packages, debArch(arch), o.DebsDir, o.AptDir, tmp)
		if err != nil {
			return nil, err
		}
		if ai.Packages, err = debianLayer(ctx, base, debs, spec.Debian.Drop, tmp); err != nil {
			return nil, err
		}
		for _, p := range ai.Packages {
			if p.Arch != "all" && p.Arch != debArch(arch) {
				return nil, fmt.Errorf("debian package %s is for %s, the image for %s", p.Name, p.Arch, arch)
			}
		}
		// Debian's ldconfig reads this; the NVIDIA container toolkit runs ldconfig in
		// the container after it mounts the driver's libraries.
		if err := base.bytes("/etc/ld.so.conf", []byte("include /etc/ld.so.conf.d/*.conf\n"), 0o644); err != nil {
			return nil, err
		}
		baseBy += ", Debian packages " + packageList(ai.Packages)
	}

	// Layer 2: the files the repository's make targets built.
	app := newTree()
	for _, f := range spec.Files {
		src := srcFor(o.Root, f.Src, arch)
		mode, _ := f.mode()
		if err := app.file(f.Dst, src, mode); err != nil {
			return nil, fmt.Errorf("file %s (for %s): %w", f.Src, f.Dst, err)
		}
		if err := checkELFArch(src, arch); err != nil {
			return nil, err
		}
		if f.Static {
			if err := checkStatic(src); err != nil {
				return nil, err
			}
		}
		if f.MaxGLIBC != "" {
			if err := checkGLIBC(src, f.MaxGLIBC); err != nil {
				return nil, err
			}
		}
		sum, err := filehash.SHA256(src)
		if err != nil {
			return nil, err
		}
		ai.Files = append(ai.Files, builtFile{Src: src, Dst: f.Dst, SHA256: sum})
		if f.Checksum {
			line := fmt.Sprintf("%s  %s\n", sum, path.Base(f.Dst))
			if err := app.bytes(f.Dst+".sha256", []byte(line), 0o644); err != nil {
				return nil, err
			}
		}
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
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
			MediaType: types.OCILayer,
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
	cf.Architecture = arch
	cf.OS = "linux"
	cf.Variant = platform(arch).Variant
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		User:       spec.User,
		Entrypoint: spec.Entrypoint,
		Cmd:        spec.Cmd,
		Env:        spec.Env,
		WorkingDir: "/",
		Labels:     labels(spec, o, created, ai.Packages),
	}
	if ai.Image, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	if ai.Digest, err = ai.Image.Digest(); err != nil {
		return nil, err
	}
	return ai, nil
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
	}, tarball.WithMediaType(types.OCILayer))
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

// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// CheckLayout checks every image of an OCI layout written by WriteLayout without
// running anything, so for every architecture: the index lists one image per
// architecture of archs, each image's config says the same architecture, every ELF
// file in its root filesystem is for that architecture's machine, and one SBOM refers
// to the index. It returns a line per image and architecture.
func CheckLayout(dir string, archs []string) ([]string, error) {
	images, err := readLayout(dir)
	if err != nil {
		return nil, err
	}
	if len(images) == 0 {
		return nil, fmt.Errorf("%s holds no image", dir)
	}
	names := make([]string, 0, len(images))
	for n := range images {
		names = append(names, n)
	}
	sort.Strings(names)
	var report []string
	for _, n := range names {
		li := images[n]
		im, err := li.Index.IndexManifest()
		if err != nil {
			return nil, err
		}
		if im.MediaType != types.OCIImageIndex || len(im.Manifests) != len(archs) {
			return nil, fmt.Errorf("%s: a %s of %d manifests, want an OCI image index of %d (%s)", n, im.MediaType, len(im.Manifests), len(archs), strings.Join(archs, ", "))
		}
		for _, arch := range archs {
			img, err := platformImage(li.Index, arch)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", n, err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				return nil, err
			}
			if cf.Architecture != arch || cf.OS != "linux" {
				return nil, fmt.Errorf("%s: the linux/%s entry's config says %s/%s", n, arch, cf.OS, cf.Architecture)
			}
			elfs, err := checkRootfsELF(img, arch)
			if err != nil {
				return nil, fmt.Errorf("%s linux/%s: %w", n, arch, err)
			}
			d, _ := img.Digest()
			report = append(report, fmt.Sprintf("%s linux/%s %s: %d ELF files, all %s", n, arch, d, elfs, elfMachines[arch]))
		}
		sboms := 0
		for _, a := range li.Referrers {
			m, err := a.Manifest()
			if err != nil {
				return nil, err
			}
			if m.ArtifactType != string(spdxMediaType) || len(m.Layers) != 1 {
				continue
			}
			rc, err := a.LayerByDigest(m.Layers[0].Digest)
			if err != nil {
				return nil, err
			}
			r, err := rc.Compressed()
			if err != nil {
				return nil, err
			}
			var doc spdxDoc
			err = json.NewDecoder(r).Decode(&doc)
			r.Close()
			if err != nil || doc.SPDXVersion != "SPDX-2.3" {
				return nil, fmt.Errorf("%s: SBOM is not an SPDX 2.3 document (%v)", n, err)
			}
			sboms++
			report = append(report, fmt.Sprintf("%s SBOM: %d packages", n, len(doc.Packages)))
		}
		if sboms != 1 {
			return nil, fmt.Errorf("%s: %d SPDX SBOMs refer to the index, want 1", n, sboms)
		}
	}
	return report, nil
}

// checkRootfsELF reads the image's root filesystem and checks the machine of each
// ELF file in it; it returns how many there are.
func checkRootfsELF(img v1.Image, arch string) (int, error) {
	want := elfMachines[arch]
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if h.Typeflag != tar.TypeReg || h.Size < 64 {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return n, err
		}
		if !bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
			continue
		}
		f, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return n, fmt.Errorf("/%s: %w", h.Name, err)
		}
		if f.Machine != want {
			return n, fmt.Errorf("/%s is for %s, not %s", h.Name, f.Machine, want)
		}
		n++
	}
}

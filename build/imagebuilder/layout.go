// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of the OCI image layout's index.json that name an image index: the
// OCI one (skopeo, podman: oci:DIR:REF) and containerd's (ctr image import).
const (
	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerdRef = "io.containerd.image.name"
)

// WriteLayout writes the images and their SBOMs as one OCI image layout in dir, which
// it replaces: index.json lists each image index under its full reference, followed
// by its SBOM artifact. Beside dir, in its parent, <name>.digest holds each index's
// digest and <name>.spdx.json its SBOM.
func WriteLayout(dir string, results []*Result) error {
	part := dir + ".part"
	if err := os.RemoveAll(part); err != nil {
		return err
	}
	p, err := layout.Write(part, empty.Index)
	if err != nil {
		return err
	}
	for _, r := range results {
		ref := r.Ref.String()
		if err := p.AppendIndex(r.Index, layout.WithAnnotations(map[string]string{
			annotationRefName: ref, annotationContainerdRef: ref,
		})); err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
		if err := p.AppendImage(r.SBOM); err != nil {
			return fmt.Errorf("%s SBOM: %w", r.Name, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Rename(part, dir); err != nil {
		return err
	}
	parent := filepath.Dir(dir)
	for _, r := range results {
		if err := os.WriteFile(filepath.Join(parent, r.Name+".digest"), []byte(r.Digest.String()+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(parent, r.Name+".spdx.json"), r.SBOMJSON, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// layoutImage is one image index of a layout, with its referrers there.
type layoutImage struct {
	Ref       name.Tag
	Index     v1.ImageIndex
	Digest    v1.Hash
	Referrers []v1.Image
}

// readLayout returns the image indexes of a layout written by WriteLayout, by image
// name (the reference's last path element).
func readLayout(dir string) (map[string]*layoutImage, error) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the OCI layout %s: %w", dir, err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	images := map[string]*layoutImage{}
	byDigest := map[v1.Hash]*layoutImage{}
	var artifacts []v1.Image
	for _, d := range im.Manifests {
		switch {
		case d.MediaType == types.OCIImageIndex && d.Annotations[annotationRefName] != "":
			ref, err := name.NewTag(d.Annotations[annotationRefName], name.WeakValidation)
			if err != nil {
				return nil, fmt.Errorf("%s: index %s: %w", dir, d.Digest, err)
			}
			idx, err := top.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			li := &layoutImage{Ref: ref, Index: idx, Digest: d.Digest}
			n := filepath.Base(ref.RepositoryStr())
			if images[n] != nil {
				return nil, fmt.Errorf("%s: two images named %s", dir, n)
			}
			images[n], byDigest[d.Digest] = li, li
		case d.MediaType == types.OCIManifestSchema1:
			img, err := top.Image(d.Digest)
			if err != nil {
				return nil, err
			}
			artifacts = append(artifacts, img)
		}
	}
	for _, a := range artifacts {
		m, err := a.Manifest()
		if err != nil {
			return nil, err
		}
		if m.Subject == nil || byDigest[m.Subject.Digest] == nil {
			continue
		}
		li := byDigest[m.Subject.Digest]
		li.Referrers = append(li.Referrers, a)
	}
	return images, nil
}

// OCI 1.1's empty descriptor: the config of an artifact that has none.
const emptyJSONMediaType types.MediaType = "application/vnd.oci.empty.v1+json"

// artifact is an OCI image manifest that is not a container image (an SBOM, a Helm
// chart): its config and layers are given as they are, with their own media types.
// go-containerregistry's mutate package makes only container-image configs.
type artifact struct {
	manifest []byte
	config   []byte
	layers   map[v1.Hash]v1.Layer
}

var _ partial.CompressedImageCore = (*artifact)(nil)

// newArtifact returns the artifact of artifactType (empty: the config's media type
// stands for it) with the given config, layers, manifest annotations and subject.
func newArtifact(artifactType string, configType types.MediaType, config []byte, layers []artifactLayer, annotations map[string]string, subject *v1.Descriptor) (v1.Image, error) {
	a := &artifact{config: config, layers: map[v1.Hash]v1.Layer{}}
	cd, cs, err := v1.SHA256(bytes.NewReader(config))
	if err != nil {
		return nil, err
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  artifactType,
		Config:        v1.Descriptor{MediaType: configType, Size: cs, Digest: cd},
		Annotations:   annotations,
		Subject:       subject,
	}
	if configType == emptyJSONMediaType {
		m.Config.Data = config
	}
	for _, l := range layers {
		d, err := partial.Descriptor(l.Layer)
		if err != nil {
			return nil, err
		}
		d.Annotations = l.Annotations
		m.Layers = append(m.Layers, *d)
		a.layers[d.Digest] = l.Layer
	}
	if a.manifest, err = json.Marshal(m); err != nil {
		return nil, err
	}
	return partial.CompressedToImage(a)
}

func (a *artifact) RawConfigFile() ([]byte, error)      { return a.config, nil }
func (a *artifact) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (a *artifact) RawManifest() ([]byte, error)        { return a.manifest, nil }

func (a *artifact) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if l, ok := a.layers[h]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("artifact has no blob %s", h)
}

// artifactLayer is a blob of an artifact, stored as it is, and the annotations of its
// descriptor (org.opencontainers.image.title names the file it unpacks to).
type artifactLayer struct {
	v1.Layer
	Annotations map[string]string
}

func blobLayer(data []byte, mt types.MediaType, title string) artifactLayer {
	return artifactLayer{static.NewLayer(data, mt), map[string]string{"org.opencontainers.image.title": title}}
}

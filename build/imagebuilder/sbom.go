// SPDX-License-Identifier: Apache-2.0

package main

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The SBOM's media type, which is also the artifactType of the manifest that carries it.
const spdxMediaType types.MediaType = "application/spdx+json"

// SPDX 2.3 (https://spdx.github.io/spdx-spec/v2.3/), the fields this builder fills in.
type spdxDoc struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	DocumentDescribes []string           `json:"documentDescribes"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name                  string         `json:"name"`
	SPDXID                string         `json:"SPDXID"`
	VersionInfo           string         `json:"versionInfo,omitempty"`
	Supplier              string         `json:"supplier,omitempty"`
	DownloadLocation      string         `json:"downloadLocation"`
	FilesAnalyzed         bool           `json:"filesAnalyzed"`
	Checksums             []spdxChecksum `json:"checksums,omitempty"`
	PrimaryPackagePurpose string         `json:"primaryPackagePurpose,omitempty"`
	Comment               string         `json:"comment,omitempty"`
	ExternalRefs          []spdxExtRef   `json:"externalRefs,omitempty"`
}

type spdxChecksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type spdxExtRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

var spdxIDUnsafe = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(parts ...string) string {
	return "SPDXRef-" + spdxIDUnsafe.ReplaceAllString(strings.Join(parts, "-"), "-")
}

func purlRef(purl string) []spdxExtRef {
	return []spdxExtRef{{ReferenceCategory: "PACKAGE-MANAGER", ReferenceType: "purl", ReferenceLocator: purl}}
}

// spdxDocument is the SBOM of a built image index: the image, and for each
// architecture its files (a Go binary's modules, from its build information; any
// other file with its checksum) and the Debian packages of its base. Everything in it
// comes from the build, so the same build gives the same document.
func spdxDocument(spec *Spec, o BuildOptions, r *Result) ([]byte, error) {
	doc := spdxDoc{
		SPDXVersion: "SPDX-2.3",
		DataLicense: "CC0-1.0",
		SPDXID:      "SPDXRef-DOCUMENT",
		Name:        r.Ref.String(),
		// Unique per image index, as SPDX asks, and the same for the same build.
		DocumentNamespace: strings.TrimSuffix(o.Source, "/") + "/spdx/" + spec.Name + "/" + r.Digest.String(),
		CreationInfo: spdxCreationInfo{
			Created:  o.Created.UTC().Format(time.RFC3339),
			Creators: []string{"Organization: Tessera", "Tool: tessera-imagebuilder"},
		},
	}
	imageID := spdxID("image", spec.Name)
	doc.DocumentDescribes = []string{imageID}
	doc.Packages = append(doc.Packages, spdxPackage{
		Name:                  spec.Name,
		SPDXID:                imageID,
		VersionInfo:           o.Version,
		DownloadLocation:      "NOASSERTION",
		PrimaryPackagePurpose: "CONTAINER",
		Checksums:             []spdxChecksum{{"SHA256", r.Digest.Hex}},
		ExternalRefs: purlRef(fmt.Sprintf("pkg:oci/%s@%s?repository_url=%s&tag=%s", spec.Name,
			url.QueryEscape(r.Digest.String()), url.QueryEscape(r.Ref.Context().Name()), url.QueryEscape(o.Tag))),
	})
	rel := func(a, typ, b string) {
		doc.Relationships = append(doc.Relationships, spdxRelationship{a, typ, b})
	}
	rel("SPDXRef-DOCUMENT", "DESCRIBES", imageID)
	modules := map[string]spdxPackage{} // by SPDXID: shared by the architectures
	for _, ai := range r.Archs {
		for _, f := range ai.Files {
			fileID := spdxID(ai.Arch, "file", strings.TrimPrefix(f.Dst, "/"))
			p := spdxPackage{
				Name:             path.Base(f.Dst),
				SPDXID:           fileID,
				VersionInfo:      o.Version,
				DownloadLocation: "NOASSERTION",
				Checksums:        []spdxChecksum{{"SHA256", f.SHA256}},
				Comment:          fmt.Sprintf("%s in the linux/%s image, built from %s at revision %s", f.Dst, ai.Arch, o.Source, o.Revision),
			}
			bi, err := buildinfo.ReadFile(f.Src)
			if err != nil {
				p.PrimaryPackagePurpose = "FILE"
				if strings.Contains(path.Base(f.Dst), ".so") {
					p.PrimaryPackagePurpose = "LIBRARY"
				}
				doc.Packages = append(doc.Packages, p)
				rel(imageID, "CONTAINS", fileID)
				continue
			}
			// A Go binary: its main module and every module linked into it.
			p.PrimaryPackagePurpose = "APPLICATION"
			p.Comment += ", Go main module " + bi.Main.Path
			doc.Packages = append(doc.Packages, p)
			rel(imageID, "CONTAINS", fileID)
			deps := []*debugModule{{Path: "stdlib", Version: bi.GoVersion}}
			for _, d := range bi.Deps {
				if d.Replace != nil {
					d = d.Replace
				}
				deps = append(deps, &debugModule{Path: d.Path, Version: d.Version, Sum: d.Sum})
			}
			for _, d := range deps {
				id := spdxID("go", d.Path, d.Version)
				if _, ok := modules[id]; !ok {
					mp := spdxPackage{
						Name:                  d.Path,
						SPDXID:                id,
						VersionInfo:           d.Version,
						DownloadLocation:      "NOASSERTION",
						PrimaryPackagePurpose: "LIBRARY",
						ExternalRefs:          purlRef("pkg:golang/" + d.Path + "@" + url.PathEscape(d.Version)),
					}
					if d.Path != "stdlib" {
						mp.DownloadLocation = "https://proxy.golang.org/" + d.Path + "/@v/" + d.Version + ".zip"
					}
					if h, ok := strings.CutPrefix(d.Sum, "h1:"); ok {
						mp.Comment = "go.sum hash h1:" + h
					}
					modules[id] = mp
				}
				rel(fileID, "DEPENDS_ON", id)
			}
		}
		for _, p := range ai.Packages {
			id := spdxID(ai.Arch, "deb", p.Name)
			doc.Packages = append(doc.Packages, spdxPackage{
				Name:                  p.Name,
				SPDXID:                id,
				VersionInfo:           p.Version,
				Supplier:              "Organization: Debian",
				DownloadLocation:      "NOASSERTION",
				PrimaryPackagePurpose: "OPERATING-SYSTEM",
				Comment:               "Debian package in the base layer of the linux/" + ai.Arch + " image",
				ExternalRefs:          purlRef(fmt.Sprintf("pkg:deb/debian/%s@%s?arch=%s", p.Name, url.PathEscape(p.Version), p.Arch)),
			})
			rel(imageID, "CONTAINS", id)
		}
	}
	ids := make([]string, 0, len(modules))
	for id := range modules {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		doc.Packages = append(doc.Packages, modules[id])
	}
	return json.MarshalIndent(doc, "", "  ")
}

type debugModule struct{ Path, Version, Sum string }

// sbomArtifact is the OCI artifact that carries the SBOM and refers to the index.
func sbomArtifact(idx v1.ImageIndex, doc []byte, created time.Time) (v1.Image, error) {
	subject, err := partial.Descriptor(idx)
	if err != nil {
		return nil, err
	}
	subject = &v1.Descriptor{MediaType: subject.MediaType, Size: subject.Size, Digest: subject.Digest}
	return newArtifact(string(spdxMediaType), emptyJSONMediaType, []byte("{}"),
		[]artifactLayer{blobLayer(doc, spdxMediaType, "sbom.spdx.json")},
		map[string]string{"org.opencontainers.image.created": created.UTC().Format(time.RFC3339)}, subject)
}

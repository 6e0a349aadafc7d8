// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/tessera-dev/tessera/internal/filehash"
)

// multiArchRoot has each file of testSpec once per architecture, under out/<arch>/.
func multiArchRoot(t *testing.T) (string, *Spec) {
	root := t.TempDir()
	for _, a := range []string{"amd64", "arm64"} {
		write(t, filepath.Join(root, "out", a, "tool"), "#!tool "+a+"\n", 0o755)
		write(t, filepath.Join(root, "out", a, "lib.so"), "library "+a, 0o644)
	}
	s := testSpec()
	s.Files[0].Src = "out/{arch}/tool"
	s.Files[1].Src = "out/{arch}/lib.so"
	return root, s
}

func multiArchOpts(root, out string) BuildOptions {
	o := opts(root, out)
	o.Archs = []string{"amd64", "arm64"}
	return o
}

func TestMultiArch(t *testing.T) {
	root, s := multiArchRoot(t)
	res, dir := buildLayout(t, s, multiArchOpts(root, t.TempDir()))
	im, err := res.Index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != "application/vnd.oci.image.index.v1+json" || len(im.Manifests) != 2 {
		t.Fatalf("index %+v", im)
	}
	for i, want := range []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64", Variant: "v8"}} {
		if d := im.Manifests[i]; d.Platform == nil || !d.Platform.Equals(want) || d.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("manifest %d: %+v, want %+v", i, d, want)
		}
		img, cf, err := loadImage(dir, "tessera-test", want.Architecture)
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != want.Architecture || cf.Variant != want.Variant {
			t.Errorf("%s config says %s %s", want.Architecture, cf.Architecture, cf.Variant)
		}
		_, layers := layerEntries(t, img)
		if got := layers[1]["usr/local/bin/tool"].body; got != "#!tool "+want.Architecture+"\n" {
			t.Errorf("%s image's tool: %q", want.Architecture, got)
		}
	}
	report, err := CheckLayout(dir, []string{"amd64", "arm64"})
	if err != nil {
		t.Fatalf("%v\n%s", err, strings.Join(report, "\n"))
	}
	if _, err := CheckLayout(dir, []string{"amd64"}); err == nil {
		t.Error("check for amd64 only accepted an index of two")
	}

	// An ELF file of the wrong machine is refused, at build time and by check.
	tool := staticProgram(t) // this machine's
	data, _ := os.ReadFile(tool)
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	write(t, filepath.Join(root, "out", other, "tool"), string(data), 0o755)
	if _, err := Build(context.Background(), s, multiArchOpts(root, t.TempDir())); err == nil || !strings.Contains(err.Error(), "the image for "+other) {
		t.Errorf("%s ELF in the %s image: %v", runtime.GOARCH, other, err)
	}
	if err := checkELFArch(tool, runtime.GOARCH); err != nil {
		t.Error(err)
	}
}

// goNvmlVersion is go-nvml's version in the repository's go.mod.
func goNvmlVersion(t *testing.T) string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/NVIDIA/go-nvml: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func sbomPackages(t *testing.T, doc []byte) (spdxDoc, map[string]spdxPackage) {
	t.Helper()
	var d spdxDoc
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	byName := map[string]spdxPackage{}
	for _, p := range d.Packages {
		byName[p.Name+" "+p.SPDXID] = p
	}
	return d, byName
}

func findPackage(pkgs map[string]spdxPackage, name string) (spdxPackage, bool) {
	for k, p := range pkgs {
		if strings.HasPrefix(k, name+" ") {
			return p, true
		}
	}
	return spdxPackage{}, false
}

// The SBOM lists a Go binary's modules at the versions go.mod gives, the Debian
// packages of the base, and the other files with their checksums.
func TestSBOM(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb not installed")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: go-nvml needs cgo")
	}
	root := testRoot(t)
	probe := filepath.Join(root, "out/tool")
	os.Remove(probe)
	if out, err := exec.Command("go", "build", "-trimpath", "-o", probe, "./testdata/nvmlprobe").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	debs := t.TempDir()
	fakeDeb(t, debs, "libc6", "", map[string]string{"usr/share/doc/libc6/copyright": "licence"})
	s := testSpec()
	s.Debian = &DebianBase{Packages: []string{"libc6"}}
	o := opts(root, t.TempDir())
	o.DebsDir = debs
	res, dir := buildLayout(t, s, o)

	doc, pkgs := sbomPackages(t, res.SBOMJSON)
	if doc.SPDXVersion != "SPDX-2.3" || doc.CreationInfo.Created != "2023-11-14T22:13:20Z" || !strings.HasSuffix(doc.DocumentNamespace, res.Digest.String()) {
		t.Errorf("document %+v", doc)
	}
	nvml, ok := findPackage(pkgs, "github.com/NVIDIA/go-nvml")
	if want := goNvmlVersion(t); !ok || nvml.VersionInfo != want || nvml.ExternalRefs[0].ReferenceLocator != "pkg:golang/github.com/NVIDIA/go-nvml@"+want {
		t.Errorf("go-nvml: %+v, want version %s", nvml, want)
	}
	if std, ok := findPackage(pkgs, "stdlib"); !ok || std.VersionInfo != runtime.Version() {
		t.Errorf("stdlib: %+v", std)
	}
	if libc, ok := findPackage(pkgs, "libc6"); !ok || libc.VersionInfo != "1.0-1" || libc.ExternalRefs[0].ReferenceLocator != "pkg:deb/debian/libc6@1.0-1?arch=all" {
		t.Errorf("libc6: %+v", libc)
	}
	sum := filehash.SHA256
	libSum, _ := sum(filepath.Join(root, "out/lib.so"))
	if lib, ok := findPackage(pkgs, "lib.so"); !ok || lib.Checksums[0].ChecksumValue != libSum || lib.PrimaryPackagePurpose != "LIBRARY" {
		t.Errorf("lib.so: %+v", lib)
	}
	ids := map[string]bool{}
	for _, p := range doc.Packages {
		if ids[p.SPDXID] {
			t.Errorf("SPDXID %s twice", p.SPDXID)
		}
		ids[p.SPDXID] = true
	}
	for _, r := range doc.Relationships {
		if (!ids[r.Element] && r.Element != "SPDXRef-DOCUMENT") || !ids[r.Related] {
			t.Errorf("relationship %+v names an unknown element", r)
		}
	}

	// In the layout, the SBOM is an artifact whose subject is the index; beside it, a file.
	images, err := readLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	refs := images["tessera-test"].Referrers
	if len(refs) != 1 {
		t.Fatalf("%d referrers", len(refs))
	}
	m, _ := refs[0].Manifest()
	if m.ArtifactType != "application/spdx+json" || m.Subject == nil || m.Subject.Digest != res.Digest ||
		m.Config.MediaType != "application/vnd.oci.empty.v1+json" || m.Layers[0].MediaType != "application/spdx+json" {
		t.Errorf("SBOM manifest %+v", m)
	}
	if f, _ := os.ReadFile(filepath.Join(o.Out, "tessera-test.spdx.json")); !bytes.Equal(f, res.SBOMJSON) {
		t.Error("tessera-test.spdx.json is not the SBOM")
	}
}

func testRegistry(t *testing.T) string {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u.Host
}

func TestPush(t *testing.T) {
	host := testRegistry(t)
	root, s := multiArchRoot(t)
	res, dir := buildLayout(t, s, multiArchOpts(root, t.TempDir()))
	dest := host + "/tessera/tessera-test:1.2.3"
	d, err := Push(context.Background(), dir, "tessera-test", dest, true)
	if err != nil {
		t.Fatal(err)
	}
	if d != res.Digest {
		t.Errorf("pushed %s, built %s", d, res.Digest)
	}
	ref, _ := name.ParseReference(dest, name.Insecure)
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	if gd, _ := idx.Digest(); gd != res.Digest {
		t.Errorf("registry serves %s, built %s", gd, res.Digest)
	}
	for _, ai := range res.Archs {
		img, err := platformImage(idx, ai.Arch)
		if err != nil {
			t.Fatal(err)
		}
		if gd, _ := img.Digest(); gd != ai.Digest {
			t.Errorf("linux/%s: registry serves %s, built %s", ai.Arch, gd, ai.Digest)
		}
		if _, err := img.Layers(); err != nil {
			t.Error(err)
		}
	}
	referrers, err := remote.Referrers(ref.Context().Digest(res.Digest.String()))
	if err != nil {
		t.Fatal(err)
	}
	rm, _ := referrers.IndexManifest()
	if len(rm.Manifests) != 1 || rm.Manifests[0].ArtifactType != "application/spdx+json" {
		t.Fatalf("referrers %+v", rm.Manifests)
	}
	sbom, err := remote.Image(ref.Context().Digest(rm.Manifests[0].Digest.String()))
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := sbom.Layers()
	rc, _ := layers[0].Compressed()
	got, _ := io.ReadAll(rc)
	if !bytes.Equal(got, res.SBOMJSON) {
		t.Error("the registry's SBOM is not the one built")
	}

	if _, err := Push(context.Background(), dir, "tessera-test", "not a reference", true); err == nil || !strings.Contains(err.Error(), "destination") {
		t.Errorf("bad destination: %v", err)
	}
	if _, err := Push(context.Background(), dir, "tessera-other", dest, true); err == nil || !strings.Contains(err.Error(), "no image tessera-other") {
		t.Errorf("missing image: %v", err)
	}
}

// The repository's chart goes to an OCI registry as Helm stores charts, and Helm's
// loader reads back the archive pulled from there.
func TestPushChart(t *testing.T) {
	host := testRegistry(t)
	chartDir := "../../config/deploy/tessera"
	out := t.TempDir()
	ref, d, err := PushChart(context.Background(), chartDir, host+"/charts", out, true, epoch)
	if err != nil {
		t.Fatal(err)
	}
	want, err := loader.LoadDir(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if ref.String() != host+"/charts/tessera:"+want.Metadata.Version {
		t.Errorf("pushed to %s", ref)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	if gd, _ := img.Digest(); gd != d {
		t.Errorf("registry serves %s, pushed %s", gd, d)
	}
	m, _ := img.Manifest()
	if m.MediaType != "application/vnd.oci.image.manifest.v1+json" || m.Config.MediaType != "application/vnd.cncf.helm.config.v1+json" ||
		len(m.Layers) != 1 || m.Layers[0].MediaType != "application/vnd.cncf.helm.chart.content.v1.tar+gzip" {
		t.Fatalf("manifest %+v", m)
	}
	var cfg struct{ Name, Version, AppVersion string }
	raw, _ := img.RawConfigFile()
	if err := json.Unmarshal(raw, &cfg); err != nil || cfg.Name != "tessera" || cfg.Version != want.Metadata.Version || cfg.AppVersion != want.Metadata.AppVersion {
		t.Errorf("config %s: %v", raw, err)
	}
	layers, _ := img.Layers()
	rc, _ := layers[0].Compressed()
	archive, _ := io.ReadAll(rc)
	ch, err := loader.LoadArchive(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Name != "tessera" || ch.Metadata.Version != want.Metadata.Version || len(ch.Templates) != len(want.Templates) || ch.Values == nil {
		t.Errorf("pulled chart %s %s, %d templates", ch.Metadata.Name, ch.Metadata.Version, len(ch.Templates))
	}
	// Chart.yaml in the archive is the repository's.
	zr, _ := gzip.NewReader(bytes.NewReader(archive))
	tr := tar.NewReader(zr)
	orig, _ := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	found := false
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Name == "tessera/Chart.yaml" {
			b, _ := io.ReadAll(tr)
			found = bytes.Equal(b, orig) && h.ModTime.Equal(epoch)
		}
	}
	if !found {
		t.Error("tessera/Chart.yaml missing from the archive, or not the repository's")
	}
	if f, _ := os.ReadFile(filepath.Join(out, "tessera-"+want.Metadata.Version+".tgz")); !bytes.Equal(f, archive) {
		t.Error("the archive written is not the one pushed")
	}
	again, _, err := PackageChart(chartDir, epoch)
	if err != nil || !bytes.Equal(again, archive) {
		t.Errorf("packaging twice gives other bytes (%v)", err)
	}
}

// TestBuiltImages checks the layout make images wrote, when TESSERA_IMAGES_DIR names
// its directory (make test-images): each image's SBOM lists go-nvml at go.mod's
// version (the agent) and libc6, for every architecture.
func TestBuiltImages(t *testing.T) {
	dir := os.Getenv("TESSERA_IMAGES_DIR")
	if dir == "" {
		t.Skip("TESSERA_IMAGES_DIR not set: make test-images runs this after make images")
	}
	archs := splitArchs(os.Getenv("TESSERA_IMAGES_ARCHS"))
	doc, err := os.ReadFile(filepath.Join(dir, "tessera-node-agent.spdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	_, pkgs := sbomPackages(t, doc)
	nvml := goNvmlVersion(t)
	for _, a := range archs {
		if _, ok := pkgs["libc6 "+spdxID(a, "deb", "libc6")]; !ok {
			t.Errorf("agent SBOM: no libc6 for %s", a)
		}
		if _, ok := pkgs["tessera-node-agent "+spdxID(a, "file", "usr/local/bin/tessera-node-agent")]; !ok {
			t.Errorf("agent SBOM: no agent binary for %s", a)
		}
	}
	if _, ok := pkgs["github.com/NVIDIA/go-nvml "+spdxID("go", "github.com/NVIDIA/go-nvml", nvml)]; !ok {
		t.Errorf("agent SBOM: no go-nvml %s", nvml)
	}
	report, err := CheckLayout(filepath.Join(dir, "oci"), archs)
	for _, l := range report {
		t.Log(l)
	}
	if err != nil {
		t.Error(err)
	}
}

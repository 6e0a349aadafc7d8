// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

var epoch = time.Unix(1700000000, 0).UTC()

func write(t *testing.T, file, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// testSpec is a small image of two files, the second with a checksum.
func testSpec() *Spec {
	return &Spec{
		Name:        "tessera-test",
		Description: "test image",
		User:        "65532:65532",
		Entrypoint:  []string{"/usr/local/bin/tool"},
		Env:         []string{"PATH=/usr/local/bin"},
		Labels:      map[string]string{"org.opencontainers.image.vendor": "Tessera"},
		Files: []File{
			{Src: "out/tool", Dst: "/usr/local/bin/tool", Mode: "0755"},
			{Src: "out/lib.so", Dst: "/opt/tessera/lib/lib.so", Mode: "0755", Checksum: true},
		},
	}
}

func testRoot(t *testing.T) string {
	root := t.TempDir()
	write(t, filepath.Join(root, "out/tool"), "#!tool\n", 0o600)
	write(t, filepath.Join(root, "out/lib.so"), "library", 0o644)
	return root
}

func opts(root, out string) BuildOptions {
	return BuildOptions{Root: root, Out: out, Registry: "registry.example/tessera", Tag: "1.2.3", Version: "1.2.3",
		Revision: "abc123", Source: "https://github.com/tessera-dev/tessera", Created: epoch, Archs: []string{"amd64"}}
}

// buildLayout builds the spec and writes it as the OCI layout o.Out/oci.
func buildLayout(t *testing.T, s *Spec, o BuildOptions) (*Result, string) {
	t.Helper()
	res, err := Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(o.Out, "oci")
	if err := WriteLayout(dir, []*Result{res}); err != nil {
		t.Fatal(err)
	}
	return res, dir
}

// dirContent maps each file under dir to its content.
func dirContent(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		m[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type tarEntry struct {
	typ      byte
	mode     int64
	uid, gid int
	mtime    time.Time
	body     string
	link     string
}

// layerEntries lists each layer's entries in tar order.
func layerEntries(t *testing.T, img v1.Image) ([][]string, []map[string]tarEntry) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var orders [][]string
	var contents []map[string]tarEntry
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		var order []string
		m := map[string]tarEntry{}
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr)
			order = append(order, h.Name)
			m[h.Name] = tarEntry{h.Typeflag, h.Mode, h.Uid, h.Gid, h.ModTime.UTC(), string(b), h.Linkname}
		}
		rc.Close()
		orders = append(orders, order)
		contents = append(contents, m)
	}
	return orders, contents
}

func TestBuildLayersAndConfig(t *testing.T) {
	root := testRoot(t)
	out := t.TempDir()
	res, dir := buildLayout(t, testSpec(), opts(root, out))
	if res.Ref.String() != "registry.example/tessera/tessera-test:1.2.3" {
		t.Errorf("result %v", res.Ref)
	}
	d, _ := os.ReadFile(filepath.Join(out, "tessera-test.digest"))
	if strings.TrimSpace(string(d)) != res.Digest.String() {
		t.Errorf("digest file %q, built %s", d, res.Digest)
	}
	img, cf, err := loadImage(dir, "tessera-test", "amd64")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := img.Digest(); got != res.Archs[0].Digest {
		t.Errorf("layout holds %s, built %s", got, res.Archs[0].Digest)
	}
	orders, layers := layerEntries(t, img)
	if len(layers) != 2 {
		t.Fatalf("%d layers, want base and files", len(layers))
	}
	for i, o := range orders {
		if !sort.StringsAreSorted(o) {
			t.Errorf("layer %d entries not sorted: %v", i, o)
		}
		for name, e := range layers[i] {
			if !e.mtime.Equal(epoch) {
				t.Errorf("layer %d %s: mtime %v, want %v", i, name, e.mtime, epoch)
			}
		}
	}
	base, files := layers[0], layers[1]
	for name, want := range map[string]tarEntry{
		"etc/passwd":     {typ: tar.TypeReg, mode: 0o644},
		"tmp/":           {typ: tar.TypeDir, mode: 0o1777},
		"home/nonroot/":  {typ: tar.TypeDir, mode: 0o700, uid: nonrootUID, gid: nonrootUID},
		"root/":          {typ: tar.TypeDir, mode: 0o700},
		"etc/group":      {typ: tar.TypeReg, mode: 0o644},
		"etc/ld.so.conf": {}, // only with a Debian base
	} {
		got, ok := base[name]
		if want.typ == 0 {
			if ok {
				t.Errorf("base layer has %s", name)
			}
			continue
		}
		if !ok || got.typ != want.typ || got.mode != want.mode || got.uid != want.uid || got.gid != want.gid {
			t.Errorf("base %s: %+v (present %v), want %+v", name, got, ok, want)
		}
	}
	if !strings.Contains(base["etc/passwd"].body, "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd: %q", base["etc/passwd"].body)
	}
	sum := sha256.Sum256([]byte("library"))
	for name, want := range map[string]tarEntry{
		"usr/local/bin/tool":            {typ: tar.TypeReg, mode: 0o755, body: "#!tool\n"},
		"opt/tessera/lib/lib.so":        {typ: tar.TypeReg, mode: 0o755, body: "library"},
		"opt/tessera/lib/lib.so.sha256": {typ: tar.TypeReg, mode: 0o644, body: hex.EncodeToString(sum[:]) + "  lib.so\n"},
		"opt/tessera/":                  {typ: tar.TypeDir, mode: 0o755},
	} {
		got := files[name]
		got.mtime = time.Time{}
		if got != want {
			t.Errorf("files layer %s: %+v, want %+v", name, got, want)
		}
	}

	if cf.Architecture != "amd64" || cf.OS != "linux" || !cf.Created.Time.Equal(epoch) {
		t.Errorf("config platform/created: %s/%s %v", cf.OS, cf.Architecture, cf.Created)
	}
	c := cf.Config
	if !reflect.DeepEqual(c.Entrypoint, []string{"/usr/local/bin/tool"}) || c.User != "65532:65532" ||
		!reflect.DeepEqual(c.Env, []string{"PATH=/usr/local/bin"}) || c.WorkingDir != "/" {
		t.Errorf("config %+v", c)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":       "tessera-test",
		"org.opencontainers.image.description": "test image",
		"org.opencontainers.image.version":     "1.2.3",
		"org.opencontainers.image.revision":    "abc123",
		"org.opencontainers.image.source":      "https://github.com/tessera-dev/tessera",
		"org.opencontainers.image.created":     "2023-11-14T22:13:20Z",
		"org.opencontainers.image.vendor":      "Tessera",
	}
	if !reflect.DeepEqual(c.Labels, wantLabels) {
		t.Errorf("labels %v\nwant %v", c.Labels, wantLabels)
	}
	if len(cf.History) != 2 || !cf.History[0].Created.Time.Equal(epoch) {
		t.Errorf("history %+v", cf.History)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != "application/vnd.oci.image.manifest.v1+json" || m.Config.MediaType != "application/vnd.oci.image.config.v1+json" ||
		m.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Errorf("media types %s %s %s", m.MediaType, m.Config.MediaType, m.Layers[0].MediaType)
	}
	// The layout's index.json names the image index by its reference.
	var top v1.IndexManifest
	raw, _ := os.ReadFile(filepath.Join(dir, "index.json"))
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 2 || top.Manifests[0].MediaType != "application/vnd.oci.image.index.v1+json" ||
		top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != res.Ref.String() || top.Manifests[0].Digest != res.Digest {
		t.Errorf("index.json %s", raw)
	}
}

func TestBuildReproducible(t *testing.T) {
	root := testRoot(t)
	a, adir := buildLayout(t, testSpec(), opts(root, t.TempDir()))
	// The build machine's file times, modes and owners do not reach the image.
	old := time.Unix(1, 0)
	os.Chtimes(filepath.Join(root, "out/tool"), old, old)
	os.Chmod(filepath.Join(root, "out/lib.so"), 0o600)
	b, bdir := buildLayout(t, testSpec(), opts(root, t.TempDir()))
	if a.Digest != b.Digest {
		t.Fatalf("two builds: %s and %s", a.Digest, b.Digest)
	}
	if !reflect.DeepEqual(dirContent(t, adir), dirContent(t, bdir)) {
		t.Error("same digest but the layouts differ")
	}

	o := opts(root, t.TempDir())
	o.Created = epoch.Add(time.Second)
	if c, err := Build(context.Background(), testSpec(), o); err != nil || c.Digest == a.Digest {
		t.Errorf("another source date gives %v, %v: want another digest", c, err)
	}
	write(t, filepath.Join(root, "out/lib.so"), "library v2", 0o644)
	if c, err := Build(context.Background(), testSpec(), opts(root, t.TempDir())); err != nil || c.Digest == a.Digest {
		t.Errorf("another library gives %v, %v: want another digest", c, err)
	}
}

func TestSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(s *Spec)
		want   string
	}{
		{"bad name", func(s *Spec) { s.Name = "Tessera Scheduler" }, "name"},
		{"named user", func(s *Spec) { s.User = "nonroot" }, "numeric uid"},
		{"relative entrypoint", func(s *Spec) { s.Entrypoint = []string{"tool"} }, "absolute path"},
		{"entrypoint not installed", func(s *Spec) { s.Entrypoint = []string{"/bin/sh"} }, "no file in files"},
		{"env", func(s *Spec) { s.Env = []string{"PATH"} }, "NAME=value"},
		{"no files", func(s *Spec) { s.Files = nil }, "files: empty"},
		{"relative dst", func(s *Spec) { s.Files[1].Dst = "opt/lib.so" }, "absolute path"},
		{"dst climbs", func(s *Spec) { s.Files[1].Dst = "/opt/../../lib.so" }, "inside the image"},
		{"dst twice", func(s *Spec) { s.Files[1].Dst = "/usr/local/bin/tool" }, "listed twice"},
		{"mode", func(s *Spec) { s.Files[0].Mode = "rwx" }, "octal"},
		{"glibc", func(s *Spec) { s.Files[1].MaxGLIBC = "latest" }, "maxGLIBC"},
		{"no packages", func(s *Spec) { s.Debian = &DebianBase{} }, "debian.packages"},
		{"package name", func(s *Spec) { s.Debian = &DebianBase{Packages: []string{"libc6; rm"}} }, "not a Debian package name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec()
			tc.modify(s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
			// Build refuses it the same way, before touching anything.
			if _, err := Build(context.Background(), s, opts(t.TempDir(), t.TempDir())); err == nil {
				t.Error("Build accepted an invalid spec")
			}
		})
	}
	f := filepath.Join(t.TempDir(), "spec.yaml")
	write(t, f, "name: x\nuser: \"0\"\nentrypoint: [/x]\nfiles: [{src: x, dst: /x, mode: \"0755\"}]\nentrypiont: [/y]\n", 0o644)
	if _, err := LoadSpec(f); err == nil || !strings.Contains(err.Error(), "entrypiont") {
		t.Errorf("unknown field: %v", err)
	}
}

// The repository's own specs load, and say what the images promise.
func TestRepositorySpecs(t *testing.T) {
	s, err := LoadSpec("../tessera-scheduler.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.User != "65532:65532" || s.Debian != nil || !s.Files[0].Static {
		t.Errorf("scheduler: user %q, debian %v, static %v: want a static binary, nonroot on an empty base", s.User, s.Debian, s.Files[0].Static)
	}
	a, err := LoadSpec("../tessera-node-agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var hook *File
	for i := range a.Files {
		if a.Files[i].Dst == "/opt/tessera/lib/libtessera-cuda.so" {
			hook = &a.Files[i]
		}
	}
	if hook == nil || !hook.Checksum || hook.MaxGLIBC != "2.28" {
		t.Errorf("agent: hook %+v: want it at /opt/tessera/lib with a checksum and a glibc 2.28 floor", hook)
	}
	if a.Debian == nil || a.Debian.Packages[0] != "libc6" {
		t.Errorf("agent: debian %+v: want a libc6 base", a.Debian)
	}
}

func TestBuildBadInput(t *testing.T) {
	root := testRoot(t)
	os.Remove(filepath.Join(root, "out/lib.so"))
	_, err := Build(context.Background(), testSpec(), opts(root, t.TempDir()))
	if err == nil || !strings.Contains(err.Error(), "file out/lib.so (for /opt/tessera/lib/lib.so)") {
		t.Errorf("missing file: %v", err)
	}
	os.MkdirAll(filepath.Join(root, "out/lib.so"), 0o755)
	if _, err := Build(context.Background(), testSpec(), opts(root, t.TempDir())); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory as a file: %v", err)
	}
	root = testRoot(t)
	s := testSpec()
	s.Debian = &DebianBase{Packages: []string{"libc6"}}
	o := opts(root, t.TempDir())
	o.DebsDir = t.TempDir()
	if _, err := Build(context.Background(), s, o); err == nil || !strings.Contains(err.Error(), "no libc6_*_amd64.deb") {
		t.Errorf("missing package: %v", err)
	}
	o = opts(root, t.TempDir())
	o.Registry = "Not A Registry"
	if _, err := Build(context.Background(), testSpec(), o); err == nil || !strings.Contains(err.Error(), "image reference") {
		t.Errorf("bad registry: %v", err)
	}
}

// fakeDeb builds a Debian package with dpkg-deb.
func fakeDeb(t *testing.T, dir, name, depends string, files map[string]string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), name)
	control := fmt.Sprintf("Package: %s\nVersion: 1.0-1\nArchitecture: all\nMaintainer: Tessera <t@example.invalid>\nDescription: test package\n long description\n", name)
	if depends != "" {
		control += "Depends: " + depends + "\n"
	}
	write(t, filepath.Join(src, "DEBIAN/control"), control, 0o644)
	for p, c := range files {
		write(t, filepath.Join(src, p), c, 0o644)
	}
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", src, filepath.Join(dir, name+"_1.0-1_all.deb")).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
}

func TestDebianBase(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb not installed: the Debian base needs it")
	}
	debs := t.TempDir()
	fakeDeb(t, debs, "tessera-test-libc", "tessera-test-gcc (>= 1.0), tessera-test-missing | tessera-test-gcc", map[string]string{
		"lib/x86_64-linux-gnu/libfake.so.1":             "elf",
		"usr/share/doc/tessera-test-libc/copyright":     "the licence",
		"usr/share/doc/tessera-test-libc/changelog.gz":  "history",
		"usr/share/lintian/overrides/tessera-test-libc": "lint",
	})
	fakeDeb(t, debs, "tessera-test-gcc", "", map[string]string{"usr/share/doc/tessera-test-gcc/copyright": "gcc licence"})

	root := testRoot(t)
	s := testSpec()
	s.Debian = &DebianBase{Packages: []string{"tessera-test-libc", "tessera-test-gcc"}, Drop: []string{"/usr/share/lintian"}}
	o := opts(root, t.TempDir())
	o.DebsDir = debs
	_, dir := buildLayout(t, s, o)
	img, cf, err := loadImage(dir, "tessera-test", "amd64")
	if err != nil {
		t.Fatal(err)
	}
	_, layers := layerEntries(t, img)
	base := layers[0]
	for _, p := range []string{"lib/x86_64-linux-gnu/libfake.so.1", "usr/share/doc/tessera-test-libc/copyright",
		"usr/share/doc/tessera-test-gcc/copyright", "etc/ld.so.conf", "etc/passwd"} {
		if e, ok := base[p]; !ok || e.uid != 0 || e.gid != 0 {
			t.Errorf("base layer lacks %s (or not root's: %+v)", p, e)
		}
	}
	for _, p := range []string{"usr/share/doc/tessera-test-libc/changelog.gz", "usr/share/lintian/overrides/tessera-test-libc", "DEBIAN/control"} {
		if _, ok := base[p]; ok {
			t.Errorf("base layer has %s", p)
		}
	}
	st := base["var/lib/dpkg/status.d/tessera-test-libc"].body
	if !strings.HasPrefix(st, "Package: tessera-test-libc\nStatus: install ok installed\n") || !strings.Contains(st, "Version: 1.0-1\n") {
		t.Errorf("status entry %q", st)
	}
	if got := cf.Config.Labels["dev.tessera.image.debian-packages"]; got != "tessera-test-gcc=1.0-1 tessera-test-libc=1.0-1" {
		t.Errorf("packages label %q", got)
	}

	// A package whose dependency is not listed is refused.
	s.Debian.Packages = []string{"tessera-test-libc"}
	if _, err := Build(context.Background(), s, o); err == nil || !strings.Contains(err.Error(), "depends on tessera-test-gcc") {
		t.Errorf("unlisted dependency: %v", err)
	}
}

func TestGLIBCTooNew(t *testing.T) {
	syms := []elf.ImportedSymbol{
		{Name: "free", Version: "GLIBC_2.2.5", Library: "libc.so.6"},
		{Name: "dlopen", Version: "GLIBC_2.34", Library: "libc.so.6"},
		{Name: "fstat", Version: "GLIBC_2.33", Library: "libc.so.6"},
		{Name: "fcntl64", Version: "GLIBC_2.28", Library: "libc.so.6"},
		{Name: "_dl_x", Version: "GLIBC_PRIVATE", Library: "ld-linux-x86-64.so.2"},
		{Name: "cuInit"},
	}
	bad, err := glibcTooNew(syms, "2.28")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"_dl_x@GLIBC_PRIVATE", "dlopen@GLIBC_2.34", "fstat@GLIBC_2.33"}
	if !reflect.DeepEqual(bad, want) {
		t.Errorf("got %v, want %v", bad, want)
	}
	if _, err := glibcTooNew([]elf.ImportedSymbol{{Name: "cuInit"}}, "2.28"); err == nil {
		t.Error("symbols without glibc versions accepted")
	}
}

// TestGLIBCFloorOfTheHookFlags compiles a library with the CUDA hook's compat header and
// link flags, and checks that its ELF needs nothing newer than 2.28, while the same
// source built plainly on this machine's glibc (2.34 or later) does need more; for
// x86-64 with gcc, and for aarch64 with aarch64-linux-gnu-gcc where it is installed.
func TestGLIBCFloorOfTheHookFlags(t *testing.T) {
	for arch, cc := range map[string]string{"amd64": "gcc", "arm64": "aarch64-linux-gnu-gcc"} {
		if arch != "amd64" && runtime.GOARCH == arch {
			cc = "gcc"
		} else if arch == "amd64" && runtime.GOARCH != "amd64" {
			cc = "x86_64-linux-gnu-gcc"
		}
		t.Run(arch, func(t *testing.T) { testGLIBCFloor(t, cc, arch) })
	}
}

func testGLIBCFloor(t *testing.T, cc, arch string) {
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("%s not installed", cc)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "lib.c")
	write(t, src, `#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sys/stat.h>
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init(void) {}
int probe(int fd) {
	struct stat st;
	pthread_once(&once, init);
	void *h = dlopen("libm.so.6", RTLD_NOW);
	if (h) dlclose(h);
	return fstat(fd, &st);
}
`, 0o644)
	header, _ := filepath.Abs("../../cuda-hook/compat/glibc-2.28.h")
	build := func(out string, extra ...string) string {
		args := append([]string{"-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", filepath.Join(dir, out), src}, extra...)
		if o, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", cc, args, err, o)
		}
		return filepath.Join(dir, out)
	}
	pinned := build("pinned.so", "-include", header, "-Wl,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0", "-ldl", "-pthread")
	if err := checkELFArch(pinned, arch); err != nil {
		t.Error(err)
	}
	if err := checkGLIBC(pinned, "2.28"); err != nil {
		t.Errorf("with the compat header: %v", err)
	}
	plain := build("plain.so", "-ldl", "-pthread")
	err := checkGLIBC(plain, "2.28")
	if err == nil {
		t.Skip("this machine's glibc is older than 2.33: the plain build needs nothing newer either")
	}
	if !strings.Contains(err.Error(), "needs a glibc newer than 2.28") {
		t.Errorf("plain build: %v", err)
	}
}

// staticProgram compiles a static C program that prints its uid and a file.
func staticProgram(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "tool.c")
	write(t, src, `#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
	char buf[64] = {0};
	FILE *f = fopen("/opt/tessera/lib/lib.so", "r");
	if (f) { fread(buf, 1, sizeof buf - 1, f); fclose(f); }
	printf("uid=%d arg=%s lib=%s\n", (int)getuid(), argc > 1 ? argv[1] : "", buf);
	return 0;
}
`, 0o644)
	out := filepath.Join(dir, "tool")
	if o, err := exec.Command("gcc", "-static", "-O2", "-o", out, src).CombinedOutput(); err != nil {
		t.Skipf("cannot link a static program here (%v): %s", err, o)
	}
	return out
}

func TestStatic(t *testing.T) {
	root := testRoot(t)
	s := testSpec()
	s.Files[0].Static = true
	if _, err := Build(context.Background(), s, opts(root, t.TempDir())); err == nil || !strings.Contains(err.Error(), "want a static ELF") {
		t.Errorf("a script as a static binary: %v", err)
	}
	tool := staticProgram(t)
	if err := checkStatic(tool); err != nil {
		t.Errorf("static program: %v", err)
	}
	dyn := filepath.Join(t.TempDir(), "dyn")
	c := exec.Command("gcc", "-O2", "-o", dyn, "-x", "c", "-")
	c.Stdin = strings.NewReader("int main(void) { return 0; }\n")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	if err := checkStatic(dyn); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("dynamic program: %v", err)
	}
}

func TestRunInChroot(t *testing.T) {
	tool := staticProgram(t)
	root := testRoot(t)
	data, _ := os.ReadFile(tool)
	write(t, filepath.Join(root, "out/tool"), string(data), 0o755)
	_, ldir := buildLayout(t, testSpec(), opts(root, t.TempDir()))
	img, cf, err := loadImage(ldir, "tessera-test", "amd64")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if err := unpack(img, dir); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "tmp")); err != nil || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("/tmp unpacked as %v, %v", st.Mode(), err)
	}
	out, err := runChrooted(dir, cf, []string{"/usr/local/bin/tool", "hello"})
	if errors.Is(err, errNoChroot) {
		t.Skipf("%v", err)
	}
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	wantUID := "uid=0" // in a user namespace, as its root
	if os.Geteuid() == 0 {
		wantUID = "uid=65532" // as the image's user
	}
	if got := string(out); got != wantUID+" arg=hello lib=library\n" {
		t.Errorf("output %q, want %s and the image's own file", got, wantUID)
	}
	if _, err := runChrooted(dir, cf, []string{"tool"}); err == nil {
		t.Error("a relative command was accepted")
	}
}

// A layer cannot write outside the directory it is unpacked into, through a symbolic
// link or a ../ path.
func TestUnpackStaysInside(t *testing.T) {
	outside := t.TempDir()
	for name, entries := range map[string][]*tar.Header{
		"symlink": {
			{Typeflag: tar.TypeSymlink, Name: "escape", Linkname: outside},
			{Typeflag: tar.TypeReg, Name: "escape/pwned", Mode: 0o644},
		},
		"dotdot": {
			{Typeflag: tar.TypeReg, Name: "../pwned", Mode: 0o644},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range entries {
				tw.WriteHeader(h)
			}
			tw.Close()
			dir := filepath.Join(t.TempDir(), "rootfs")
			os.Mkdir(dir, 0o755)
			// The tar as it is, not as mutate.Extract (which drops some of these) passes it on.
			if err := unpackTar(bytes.NewReader(buf.Bytes()), dir); err == nil {
				t.Error("unpack accepted a layer that writes outside its root")
			}
			for _, p := range []string{filepath.Join(outside, "pwned"), filepath.Join(filepath.Dir(dir), "pwned")} {
				if _, err := os.Stat(p); err == nil {
					t.Errorf("%s was written", p)
				}
			}
		})
	}
}

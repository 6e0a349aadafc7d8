// SPDX-License-Identifier: Apache-2.0

package hookinstall

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// image makes a library and its checksum file as the image carries them.
func image(t *testing.T, content string) (lib, sum string) {
	t.Helper()
	dir := t.TempDir()
	lib = filepath.Join(dir, "libtessera-cuda.so")
	if err := os.WriteFile(lib, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte(content))
	sum = lib + ".sha256"
	if err := os.WriteFile(sum, []byte(hex.EncodeToString(h[:])+"  libtessera-cuda.so\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return lib, sum
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestInstallReplacesAtomicallyAndVerifies(t *testing.T) {
	host := t.TempDir()
	old := filepath.Join(host, "libtessera-cuda.so")
	if err := os.WriteFile(old, []byte("old library"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A process that has the old library open keeps its content after the update.
	held, err := os.Open(old)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()

	lib, sum := image(t, "new library")
	res, err := Install(Options{Source: lib, Checksum: sum, Dir: host})
	if err != nil {
		t.Fatal(err)
	}
	if res.Unchanged || res.Path != old {
		t.Fatalf("result %+v", res)
	}
	got, err := os.ReadFile(old)
	if err != nil || string(got) != "new library" {
		t.Fatalf("installed %q, %v", got, err)
	}
	st, _ := os.Stat(old)
	if st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", st.Mode().Perm())
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(held); err != nil || buf.String() != "old library" {
		t.Errorf("the open old library reads %q, %v", buf.String(), err)
	}
	if names := entries(t, host); len(names) != 1 {
		t.Errorf("host directory holds %v, want only the library", names)
	}

	// Again: nothing to do, and the file (inode) stays.
	before, _ := os.Stat(old)
	res, err = Install(Options{Source: lib, Checksum: sum, Dir: host})
	if err != nil || !res.Unchanged {
		t.Fatalf("second install: %+v, %v", res, err)
	}
	after, _ := os.Stat(old)
	if !os.SameFile(before, after) {
		t.Error("an unchanged library was replaced")
	}
	if names := entries(t, host); len(names) != 1 {
		t.Errorf("host directory holds %v after a no-op install", names)
	}
}

func TestInstallRefusesDamagedLibrary(t *testing.T) {
	host := t.TempDir()
	lib, sum := image(t, "the library")
	if err := os.WriteFile(lib, []byte("the library, changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Install(Options{Source: lib, Checksum: sum, Dir: host})
	if err == nil || !strings.Contains(err.Error(), "does not match its checksum") {
		t.Fatalf("err = %v, want a checksum mismatch", err)
	}
	if names := entries(t, host); len(names) != 0 {
		t.Errorf("a refused install left %v", names)
	}
}

func TestInstallBadInput(t *testing.T) {
	lib, sum := image(t, "x")
	host := t.TempDir()
	badSum := filepath.Join(t.TempDir(), "bad.sha256")
	os.WriteFile(badSum, []byte("not-a-sum  libtessera-cuda.so\n"), 0o644)
	otherSum := filepath.Join(t.TempDir(), "other.sha256")
	os.WriteFile(otherSum, []byte(strings.Repeat("a", 64)+"  other.so\n"), 0o644)
	notDir := filepath.Join(host, "file")
	os.WriteFile(notDir, nil, 0o644)
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"relative dir", Options{Source: lib, Checksum: sum, Dir: "lib"}, "absolute path"},
		{"missing dir", Options{Source: lib, Checksum: sum, Dir: filepath.Join(host, "nope")}, "destination directory"},
		{"dir is a file", Options{Source: lib, Checksum: sum, Dir: notDir}, "not a directory"},
		{"missing library", Options{Source: lib + ".gone", Dir: host}, "hook library"},
		{"missing checksum", Options{Source: lib, Checksum: sum + ".gone", Dir: host}, "checksum"},
		{"malformed checksum", Options{Source: lib, Checksum: badSum, Dir: host}, "no sha256 line"},
		{"checksum of another file", Options{Source: lib, Checksum: otherSum, Dir: host}, "no sha256 line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Install(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestMain_CommandLine(t *testing.T) {
	lib, _ := image(t, "library")
	host := t.TempDir()
	var out, errb bytes.Buffer
	if code := Main([]string{"--to", host, "--from", lib}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "installed the CUDA hook at "+filepath.Join(host, "libtessera-cuda.so")) {
		t.Errorf("output %q", out.String())
	}
	out.Reset()
	if code := Main([]string{"--to", host, "--from", lib}, &out, &errb); code != 0 || !strings.Contains(out.String(), "is current") {
		t.Errorf("second run: exit %d, %q", code, out.String())
	}
	if code := Main([]string{"--from", lib}, &out, &errb); code != 2 {
		t.Errorf("no --to: exit %d, want 2", code)
	}
	// The default checksum file is required unless "none".
	os.Remove(lib + ".sha256")
	errb.Reset()
	if code := Main([]string{"--to", host, "--from", lib}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "checksum") {
		t.Errorf("without a checksum file: exit %d, %q", code, errb.String())
	}
	if code := Main([]string{"--to", host, "--from", lib, "--checksum", "none"}, &out, &errb); code != 0 {
		t.Errorf("--checksum none: exit %d, %q", code, errb.String())
	}
}

// SPDX-License-Identifier: Apache-2.0

package filehash

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSHA256(t *testing.T) {
	dir := t.TempDir()
	for content, want := range map[string]string{
		// sha256sum of an empty file and of "abc".
		"":    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		"abc": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
	} {
		file := filepath.Join(dir, "f")
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := SHA256(file); err != nil || got != want {
			t.Errorf("SHA256(%q) = %q, %v; want %q", content, got, err, want)
		}
	}
	if _, err := SHA256(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("missing file: %v", err)
	}
}

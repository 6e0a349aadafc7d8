// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Spec describes one image: what goes into its root filesystem and how it runs. The
// images' specs are build/<image>.yaml; they are the images' only definition.
type Spec struct {
	// Name is the image's repository name under the registry, e.g. tessera-scheduler.
	Name        string `json:"name"`
	Description string `json:"description"`
	// User is "uid" or "uid:gid", numeric: the image has no user database to look
	// names up in beyond the /etc/passwd this builder writes.
	User       string            `json:"user"`
	Entrypoint []string          `json:"entrypoint"`
	Cmd        []string          `json:"cmd,omitempty"`
	Env        []string          `json:"env,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// Debian, when set, puts the listed Debian packages (fetched with apt-get download,
	// unpacked with dpkg-deb -x) in the base layer. Without it the base is empty but
	// for /etc/passwd, /etc/group and /tmp.
	Debian *DebianBase `json:"debian,omitempty"`
	Files  []File      `json:"files"`
}

// DebianBase is the base layer made of Debian packages.
type DebianBase struct {
	Packages []string `json:"packages"`
	// Drop lists path prefixes (absolute, as in the package) left out of the layer.
	// Copyright files are always kept.
	Drop []string `json:"drop,omitempty"`
}

// File is one file the repository's make targets built, put into the image.
type File struct {
	// Src is relative to the repository root (the builder's -root); {arch} in it is
	// the architecture being built (GOARCH naming: amd64, arm64).
	Src  string `json:"src"`
	Dst  string `json:"dst"`
	Mode string `json:"mode"`
	// Checksum also writes Dst.sha256 (sha256sum format) next to the file.
	Checksum bool `json:"checksum,omitempty"`
	// MaxGLIBC, e.g. "2.28", fails the build if the file's ELF dynamic symbols need a
	// newer glibc symbol version.
	MaxGLIBC string `json:"maxGLIBC,omitempty"`
	// Static fails the build unless the file is a statically linked ELF executable
	// (no program interpreter): what an image without a C library needs.
	Static bool `json:"static,omitempty"`
}

var (
	nameRE = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*$`)
	userRE = regexp.MustCompile(`^[0-9]+(:[0-9]+)?$`)
	pkgRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	envRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	glibRE = regexp.MustCompile(`^2\.[0-9]+$`)
)

// LoadSpec reads and validates a spec file.
func LoadSpec(file string) (*Spec, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var s Spec
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &s, nil
}

// Validate reports the first thing wrong with the spec, naming the field.
func (s *Spec) Validate() error {
	if !nameRE.MatchString(s.Name) {
		return fmt.Errorf("name %q: want a lower-case repository name such as tessera-scheduler", s.Name)
	}
	if !userRE.MatchString(s.User) {
		return fmt.Errorf("user %q: want a numeric uid or uid:gid", s.User)
	}
	if len(s.Entrypoint) == 0 || !path.IsAbs(s.Entrypoint[0]) {
		return fmt.Errorf("entrypoint %q: want an absolute path first (the image has no shell and no PATH lookup)", s.Entrypoint)
	}
	for i, e := range s.Env {
		if !envRE.MatchString(e) {
			return fmt.Errorf("env[%d] %q: want NAME=value", i, e)
		}
	}
	if s.Debian != nil {
		if len(s.Debian.Packages) == 0 {
			return fmt.Errorf("debian.packages: empty (drop the debian section for an empty base)")
		}
		for i, p := range s.Debian.Packages {
			if !pkgRE.MatchString(p) {
				return fmt.Errorf("debian.packages[%d] %q: not a Debian package name", i, p)
			}
		}
		for i, d := range s.Debian.Drop {
			if _, err := cleanAbs(d); err != nil {
				return fmt.Errorf("debian.drop[%d]: %w", i, err)
			}
		}
	}
	if len(s.Files) == 0 {
		return fmt.Errorf("files: empty")
	}
	seen := map[string]bool{}
	for i, f := range s.Files {
		if f.Src == "" {
			return fmt.Errorf("files[%d].src: empty", i)
		}
		dst, err := cleanAbs(f.Dst)
		if err != nil {
			return fmt.Errorf("files[%d].dst: %w", i, err)
		}
		if seen[dst] {
			return fmt.Errorf("files[%d].dst %q: listed twice", i, f.Dst)
		}
		seen[dst] = true
		if _, err := f.mode(); err != nil {
			return fmt.Errorf("files[%d].mode: %w", i, err)
		}
		if f.MaxGLIBC != "" && !glibRE.MatchString(f.MaxGLIBC) {
			return fmt.Errorf("files[%d].maxGLIBC %q: want a version such as 2.28", i, f.MaxGLIBC)
		}
	}
	if !seen[path.Clean(s.Entrypoint[0])] {
		return fmt.Errorf("entrypoint %q: no file in files is installed there", s.Entrypoint[0])
	}
	return nil
}

func (f File) mode() (int64, error) {
	m, err := strconv.ParseInt(f.Mode, 8, 32)
	if err != nil || m <= 0 || m > 0o7777 {
		return 0, fmt.Errorf("%q: want octal permissions such as 0755", f.Mode)
	}
	return m, nil
}

// cleanAbs returns an absolute, clean path, or an error for a relative one or one
// that climbs out of the root.
func cleanAbs(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("%q: want an absolute path", p)
	}
	c := path.Clean(p)
	if c == "/" || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
		return "", fmt.Errorf("%q: not a file path inside the image", p)
	}
	return c, nil
}

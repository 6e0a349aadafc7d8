// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// debPackage is one unpacked Debian package of a base layer.
type debPackage struct {
	Name, Version, Arch string
	Deb                 string // the .deb file
	Control             []byte // its control file, for /var/lib/dpkg/status.d
	Depends             [][]string
	Provides            []string
}

// fetchDebs returns the .deb of each package for the Debian architecture arch: from
// dir when it is given (an offline build with packages fetched before; file names as
// Debian's, name_version_arch.deb), otherwise downloaded with apt-get download into a
// new directory under tmp. apt verifies each download against the signed archive
// index, so the packages are Debian's own.
//
// apt-get runs with a package index of its own for arch, kept in aptDir/<arch> (under
// tmp when aptDir is empty) and brought up to date first from the machine's apt
// sources: any architecture's packages can be fetched without dpkg --add-architecture
// or any other change to the machine's apt configuration.
func fetchDebs(ctx context.Context, pkgs []string, arch, dir, aptDir, tmp string) ([]string, error) {
	if dir == "" {
		dir = filepath.Join(tmp, "debs")
		if aptDir == "" {
			aptDir = filepath.Join(tmp, "apt")
		}
		state, err := filepath.Abs(filepath.Join(aptDir, arch))
		if err != nil {
			return nil, err
		}
		for _, d := range []string{dir, filepath.Join(state, "lists", "partial"), filepath.Join(state, "cache", "archives", "partial")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, err
			}
		}
		aptOpts := []string{"-q",
			"-o", "APT::Architecture=" + arch, "-o", "APT::Architectures::=" + arch,
			"-o", "Dir::State::Lists=" + filepath.Join(state, "lists"),
			"-o", "Dir::Cache=" + filepath.Join(state, "cache"),
			"-o", "Dir::State::status=/dev/null",
		}
		for _, args := range [][]string{
			append([]string{"update"}, aptOpts...),
			append(append([]string{"download"}, aptOpts...), pkgs...),
		} {
			cmd := exec.CommandContext(ctx, "apt-get", args...)
			cmd.Dir = dir
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				return nil, fmt.Errorf("apt-get %s (%s packages): %w\n%s", args[0], arch, err, out.String())
			}
		}
	}
	files := make([]string, 0, len(pkgs))
	for _, p := range pkgs {
		var m []string
		for _, a := range []string{arch, "all"} {
			g, err := filepath.Glob(filepath.Join(dir, p+"_*_"+a+".deb"))
			if err != nil {
				return nil, err
			}
			m = append(m, g...)
		}
		switch len(m) {
		case 0:
			return nil, fmt.Errorf("debian package %s: no %s_*_%s.deb in %s", p, p, arch, dir)
		case 1:
			files = append(files, m[0])
		default:
			return nil, fmt.Errorf("debian package %s: %d versions in %s (%s); keep one", p, len(m), dir, strings.Join(m, ", "))
		}
	}
	return files, nil
}

// readDeb reads a package's control file with dpkg-deb.
func readDeb(ctx context.Context, deb string) (*debPackage, error) {
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb).Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-deb -f %s: %w%s", deb, err, stderrOf(err))
	}
	f := parseControl(out)
	p := &debPackage{Name: f["Package"], Version: f["Version"], Arch: f["Architecture"], Deb: deb, Control: out}
	if p.Name == "" || p.Version == "" {
		return nil, fmt.Errorf("%s: no Package or Version in its control file", deb)
	}
	for _, field := range []string{"Pre-Depends", "Depends"} {
		for _, group := range splitList(f[field], ",") {
			var alts []string
			for _, a := range splitList(group, "|") {
				alts = append(alts, depName(a))
			}
			p.Depends = append(p.Depends, alts)
		}
	}
	for _, pr := range splitList(f["Provides"], ",") {
		p.Provides = append(p.Provides, depName(pr))
	}
	return p, nil
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		return ": " + strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}

// parseControl reads the fields of a Debian control paragraph; continuation lines are
// joined to their field.
func parseControl(b []byte) map[string]string {
	f := map[string]string{}
	var last string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
			if last != "" {
				f[last] += "\n" + line
			}
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		last = strings.TrimSpace(k)
		f[last] = strings.TrimSpace(v)
	}
	return f
}

func splitList(s, sep string) []string {
	var out []string
	for _, x := range strings.Split(s, sep) {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// depName strips the version constraint and architecture qualifier: "libc6:any (>= 2.34)"
// is libc6.
func depName(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, " ("); i >= 0 {
		s = s[:i]
	}
	s, _, _ = strings.Cut(s, ":")
	return s
}

// checkClosed fails when a package depends on one the list leaves out: the base must
// hold everything its packages need, and the list is where that is decided.
func checkClosed(pkgs []*debPackage) error {
	have := map[string]bool{}
	for _, p := range pkgs {
		have[p.Name] = true
		for _, pr := range p.Provides {
			have[pr] = true
		}
	}
	for _, p := range pkgs {
	groups:
		for _, alts := range p.Depends {
			for _, a := range alts {
				if have[a] {
					continue groups
				}
			}
			return fmt.Errorf("debian package %s depends on %s, which debian.packages does not list", p.Name, strings.Join(alts, " | "))
		}
	}
	return nil
}

// debianLayer unpacks the packages with dpkg-deb -x and adds them to t, with their
// copyright files and their dpkg status entries (which image scanners read), and
// without the rest of their documentation or the prefixes in drop.
func debianLayer(ctx context.Context, t *tree, debs []string, drop []string, tmp string) ([]*debPackage, error) {
	var pkgs []*debPackage
	for i, deb := range debs {
		p, err := readDeb(ctx, deb)
		if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
		dir := filepath.Join(tmp, fmt.Sprintf("unpack-%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, dir).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("dpkg-deb -x %s: %w: %s", deb, err, bytes.TrimSpace(out))
		}
		skip := func(p string, isDir bool) bool {
			for _, d := range drop {
				if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
					return true
				}
			}
			// /usr/share/doc/<pkg>/...: only the copyright file stays.
			if rest, ok := strings.CutPrefix(p, "/usr/share/doc/"); ok && strings.Contains(rest, "/") {
				return !(path.Base(rest) == "copyright" && strings.Count(rest, "/") == 1 && !isDir)
			}
			return false
		}
		if err := t.addDir(dir, skip); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Base(deb), err)
		}
		if err := t.bytes("/var/lib/dpkg/status.d/"+p.Name, statusEntry(p.Control), 0o644); err != nil {
			return nil, err
		}
	}
	if err := checkClosed(pkgs); err != nil {
		return nil, err
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
	return pkgs, nil
}

// statusEntry is the package's control paragraph as dpkg's status database keeps it.
func statusEntry(control []byte) []byte {
	lines := strings.SplitAfter(strings.TrimRight(string(control), "\n")+"\n", "\n")
	var b strings.Builder
	for i, l := range lines {
		b.WriteString(l)
		if i == 0 {
			b.WriteString("Status: install ok installed\n")
		}
	}
	return []byte(b.String())
}

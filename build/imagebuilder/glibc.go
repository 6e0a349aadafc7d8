// SPDX-License-Identifier: Apache-2.0

package main

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// checkGLIBC fails when the shared object needs a glibc symbol version newer than max
// (or a GLIBC_PRIVATE one), as its ELF dynamic symbol table records them. It reads the
// ELF itself, so it checks a library of any architecture.
func checkGLIBC(file, max string) error {
	f, err := elf.Open(file)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	defer f.Close()
	syms, err := f.ImportedSymbols()
	if err != nil {
		return fmt.Errorf("%s: reading its dynamic symbols: %w", file, err)
	}
	bad, err := glibcTooNew(syms, max)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s needs a glibc newer than %s, so it would not load in every container it is meant for: %s",
			file, max, strings.Join(bad, ", "))
	}
	return nil
}

// glibcTooNew returns "symbol@GLIBC_x.y" for each imported symbol whose glibc version
// is newer than max.
func glibcTooNew(syms []elf.ImportedSymbol, max string) ([]string, error) {
	limit, err := parseVersion(max)
	if err != nil {
		return nil, fmt.Errorf("maximum glibc version %q: %w", max, err)
	}
	var bad []string
	seen := 0
	for _, s := range syms {
		v, ok := strings.CutPrefix(s.Version, "GLIBC_")
		if !ok {
			continue
		}
		seen++
		if v == "PRIVATE" {
			bad = append(bad, s.Name+"@GLIBC_PRIVATE")
			continue
		}
		pv, err := parseVersion(v)
		if err != nil {
			return nil, err
		}
		if compareVersion(pv, limit) > 0 {
			bad = append(bad, s.Name+"@"+s.Version)
		}
	}
	if seen == 0 {
		return nil, fmt.Errorf("no glibc symbol versions: not a dynamically linked object built against glibc")
	}
	sort.Strings(bad)
	return bad, nil
}

func parseVersion(s string) ([]int, error) {
	var v []int
	for _, p := range strings.Split(s, ".") {
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("%q is not a version", s)
		}
		v = append(v, n)
	}
	return v, nil
}

func compareVersion(a, b []int) int {
	for i := 0; i < len(a) || i < len(b); i++ {
		var x, y int
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

// checkStatic fails unless file is an ELF executable without a program interpreter.
func checkStatic(file string) error {
	f, err := elf.Open(file)
	if err != nil {
		return fmt.Errorf("%s: want a static ELF executable: %w", file, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked, and the image has no C library to run it (build it with CGO_ENABLED=0)", file)
		}
	}
	return nil
}

// elfMachines are the ELF machines of the architectures images are built for.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

// checkELFArch fails when file is an ELF object for another machine than arch; any
// other file passes.
func checkELFArch(file, arch string) error {
	isELF, err := hasELFMagic(file)
	if err != nil || !isELF {
		return err
	}
	f, err := elf.Open(file)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	defer f.Close()
	want, ok := elfMachines[arch]
	if !ok {
		return fmt.Errorf("%s: no ELF machine known for architecture %s", file, arch)
	}
	if f.Machine != want {
		return fmt.Errorf("%s is built for %s, the image for %s (%s)", file, f.Machine, arch, want)
	}
	return nil
}

func hasELFMagic(file string) (bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return false, err
	}
	defer f.Close()
	magic := make([]byte, len(elf.ELFMAG))
	if _, err := io.ReadFull(f, magic); err != nil {
		return false, nil // shorter than the magic: not ELF
	}
	return string(magic) == elf.ELFMAG, nil
}

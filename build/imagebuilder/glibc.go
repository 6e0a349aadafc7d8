package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

var glibcVerRE = regexp.MustCompile(`\bGLIBC_([0-9]+(?:\.[0-9]+)*|PRIVATE)\b`)

// checkGLIBC fails when the shared object needs a glibc symbol version newer than max
// (or a GLIBC_PRIVATE one), as objdump -T reports its dynamic symbols.
func checkGLIBC(ctx context.Context, file, max string) error {
	out, err := exec.CommandContext(ctx, "objdump", "-T", file).Output()
	if err != nil {
		return fmt.Errorf("objdump -T %s: %w%s", file, err, stderrOf(err))
	}
	bad, err := glibcTooNew(out, max)
	if err != nil {
		return err
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s needs a glibc newer than %s, so it would not load in every container it is meant for: %s",
			file, max, strings.Join(bad, ", "))
	}
	return nil
}

// glibcTooNew returns "symbol@GLIBC_x.y" for each dynamic symbol whose glibc version is
// newer than max, from objdump -T output.
func glibcTooNew(objdump []byte, max string) ([]string, error) {
	limit, err := parseVersion(max)
	if err != nil {
		return nil, fmt.Errorf("maximum glibc version %q: %w", max, err)
	}
	var bad []string
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(objdump))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, f := range fields {
			m := glibcVerRE.FindStringSubmatch(f)
			if m == nil {
				continue
			}
			seen++
			sym := ""
			if i+1 < len(fields) {
				sym = fields[len(fields)-1]
			}
			if m[1] == "PRIVATE" {
				bad = append(bad, sym+"@GLIBC_PRIVATE")
				break
			}
			v, err := parseVersion(m[1])
			if err != nil {
				return nil, err
			}
			if compareVersion(v, limit) > 0 {
				bad = append(bad, sym+"@GLIBC_"+m[1])
			}
			break
		}
	}
	if seen == 0 {
		return nil, fmt.Errorf("objdump -T shows no glibc symbol versions: not a dynamically linked object built against glibc")
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

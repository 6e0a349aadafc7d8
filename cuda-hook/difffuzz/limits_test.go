// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package difffuzz

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tessera-dev/tessera/api"
)

// guardedCopy copies data into fresh pages so that its last byte is the last byte
// before an inaccessible page: a C read past the end faults at once instead of
// reading whatever follows. release unmaps it.
func guardedCopy(t testing.TB, data []byte) (p unsafe.Pointer, release func()) {
	page := os.Getpagesize()
	size := (len(data)+page-1)/page*page + page
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	guard := size - page
	if err := unix.Mprotect(mem[guard:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	start := guard - len(data)
	copy(mem[start:guard], data)
	if guard > 0 {
		if err := unix.Mprotect(mem[:guard], unix.PROT_READ); err != nil {
			t.Fatal(err)
		}
	}
	return unsafe.Pointer(&mem[start:size][0]), func() { _ = unix.Munmap(mem) }
}

// compare runs both readers over data and fails on any difference: one accepts what
// the other rejects, the values differ, or the canonical forms they write differ.
func compare(t *testing.T, data []byte) {
	p, release := guardedCopy(t, data)
	defer release()
	cl, cerr := ParseLimits(p, len(data))
	gl, gerr := api.DecodeLimits(data)
	switch {
	case cerr != nil && gerr != nil:
		return
	case cerr != nil:
		t.Fatalf("C rejects what Go accepts:\nC:  %v\nGo: %+v\ninput %q", cerr, gl, data)
	case gerr != nil:
		t.Fatalf("Go rejects what C accepts:\nGo: %v\nC:  %+v\ninput %q", gerr, cl, data)
	}
	if !reflect.DeepEqual(cl, gl) {
		t.Fatalf("the readers parse different limits:\nC:  %+v\nGo: %+v\ninput %q", cl, gl, data)
	}
	cf, err := FormatLimits(cl)
	if err != nil {
		t.Fatalf("C cannot write what it parsed: %v", err)
	}
	gf, err := api.EncodeLimits(gl)
	if err != nil {
		t.Fatalf("Go cannot write what it parsed: %v", err)
	}
	if !bytes.Equal(cf, gf) {
		t.Fatalf("the canonical forms differ:\nC:  %q\nGo: %q", cf, gf)
	}
}

// vectors reads the shared test files of one format:
// api/testdata/<dir>/{valid,invalid}/*.<ext>.
func vectors(t testing.TB, dir, ext string) [][]byte {
	var out [][]byte
	for _, kind := range []string{"valid", "invalid"} {
		files, err := filepath.Glob(filepath.Join("..", "..", "api", "testdata", dir, kind, "*."+ext))
		if err != nil || len(files) == 0 {
			t.Fatalf("no %s vectors in %s: %v", ext, kind, err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
		}
	}
	return out
}

// TestLimitsVectors runs the comparison over the shared vectors, so that a plain test
// run checks what the fuzzer starts from.
func TestLimitsVectors(t *testing.T) {
	for _, v := range vectors(t, "limits", "limits") {
		compare(t, v)
	}
}

// FuzzLimits checks that the C limits reader of the CUDA hook and api.DecodeLimits
// make the same decision on every input and, where both accept it, read the same
// values and write the same canonical form; and that the C reader never reads past
// the end of its input.
func FuzzLimits(f *testing.F) {
	for _, v := range vectors(f, "limits", "limits") {
		f.Add(v)
	}
	f.Fuzz(compare)
}

// FuzzLimitsFields builds a well-formed file around arbitrary field values, so that
// the mutator works on the numbers, the uuid and the cgroup directly instead of
// first having to keep the file's shape intact. The low 7 bits of gpus are how many
// gpu lines there are (each uuid made unique by a suffix, to reach the GPU-count
// bound); the high bit repeats the first uuid on the last line.
func FuzzLimitsFields(f *testing.F) {
	f.Add("1", "/kubepods/pod1/c1", "576", "GPU-1", "4096", "30", "0", uint8(1))
	f.Add("1", "/a", "0", "MIG-x", "16777216", "100", "0", uint8(64))
	f.Add("01", "/a", "65537", "", "0", "0", "1", uint8(65|0x80))
	f.Fuzz(func(t *testing.T, version, cgroup, ctx, uuid, mem, cores, phase string, gpus uint8) {
		var b bytes.Buffer
		b.WriteString("version " + version + "\ncgroup " + cgroup + "\ncontext-mib " + ctx + "\n")
		n := int(gpus & 0x7f)
		for i := 0; i < n; i++ {
			u := uuid
			if i > 0 && !(i == n-1 && gpus&0x80 != 0) {
				u += fmt.Sprintf("-%d", i)
			}
			b.WriteString("gpu " + u + " " + mem + " " + cores + " " + phase + "\n")
		}
		compare(t, b.Bytes())
	})
}

// FuzzLimitsMPS builds a well-formed file with an mps line around arbitrary values of
// the gpu line's cores, the mps line's fields and what follows it.
func FuzzLimitsMPS(f *testing.F) {
	f.Add("0", "30", "/run/tessera-mps", "")
	f.Add("30", "100", "/p", "")
	f.Add("0", "0", "run/tessera-mps", "# after\n")
	f.Add("0", "101", "/"+strings.Repeat("p", 80), "gpu GPU-2 1 0 0\n")
	f.Add("0", "30", "/p q", "mps 30 /p\n")
	f.Add("0", "30", "/p", "work-conserving\n")
	f.Fuzz(func(t *testing.T, cores, percent, pipe, tail string) {
		b := "version 1\ncgroup /a\ncontext-mib 576\ngpu GPU-1 4096 " + cores + " 0\nmps " + percent + " " + pipe + "\n" + tail
		compare(t, []byte(b))
	})
}

// The node agent mounts a tmpfs of api.RegionDirBytes at the region directory; a
// region that outgrew it would be a SIGBUS at the first write past the file system's
// end. Half of it at most, so that a layout change has room.
func TestRegionFitsTheRegionDirectory(t *testing.T) {
	if n := RegionBytes(); n <= 0 || n > api.RegionDirBytes/2 {
		t.Errorf("the accounting region is %d bytes; the region directory's tmpfs holds %d (api.RegionDirBytes): keep the region within half of it",
			n, api.RegionDirBytes)
	}
}

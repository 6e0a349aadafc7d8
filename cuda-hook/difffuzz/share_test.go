// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package difffuzz

import (
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
)

// compareShare runs the hook's share reader and api.DecodeShare over data and fails
// where one accepts what the other rejects, or where both accept it and read a
// different share or phase (the two fields the hook paces by).
func compareShare(t *testing.T, data []byte) {
	p, release := guardedCopy(t, data)
	defer release()
	cshare, cphase, cok := ParseShare(p, len(data))
	g, gerr := api.DecodeShare(data)
	switch {
	case !cok && gerr != nil:
		return
	case !cok:
		t.Fatalf("C rejects what Go accepts: %+v\ninput %q", g, data)
	case gerr != nil:
		t.Fatalf("Go rejects what C accepts (share %d, phase %d): %v\ninput %q", cshare, cphase, gerr, data)
	}
	if cshare != g.Share || cphase != g.Phase {
		t.Fatalf("the readers differ: C share %d phase %d, Go share %d phase %d\ninput %q",
			cshare, cphase, g.Share, g.Phase, data)
	}
}

// TestShareVectors runs the comparison over the shared vectors, and over the
// boundaries of every field's range, so that a plain test run checks what the
// fuzzer starts from.
func TestShareVectors(t *testing.T) {
	for _, v := range vectors(t, "shares", "share") {
		compareShare(t, v)
	}
	for _, f := range [][5]string{
		{"1", "10000", "100000", "100", "99"},
		{"1", "10001", "0", "1", "0"},
		{"1", "0", "100001", "1", "0"},
		{"1", "0", "0", "0", "0"},
		{"1", "0", "0", "101", "0"},
		{"1", "0", "0", "1", "100"},
		{"1", "999999", "0", "1", "0"},
		{"1", "1000000", "0", "1", "0"},
		{"0", "0", "0", "1", "0"},
		{"1", "0", "0", "-1", "0"},
		{"1", "0", "0", "1", ""},
	} {
		compareShare(t, shareFile(f[0], f[1], f[2], f[3], f[4], ""))
	}
}

func shareFile(version, reserved, containers, share, phase, tail string) []byte {
	return []byte("version " + version + "\nreserved " + reserved + "\ncontainers " + containers +
		"\nshare " + share + "\nphase " + phase + "\n" + tail)
}

// FuzzShare checks that the C share reader of the CUDA hook and api.DecodeShare make
// the same decision on every input and, where both accept it, read the same share and
// phase; and that the C reader never reads past the end of its input.
func FuzzShare(f *testing.F) {
	for _, v := range vectors(f, "shares", "share") {
		f.Add(v)
	}
	f.Fuzz(compareShare)
}

// FuzzShareFields builds a well-formed file around arbitrary field values and what
// follows the last line, so that the mutator works on the numbers directly instead of
// first having to keep the file's shape intact.
func FuzzShareFields(f *testing.F) {
	f.Add("1", "70", "1", "30", "70", "")
	f.Add("1", "10000", "100000", "1", "99", "")
	f.Add("01", "0", "0", "100", "0", "phase 0\n")
	f.Add("1", "+70", "-0", "030", "1000000", strings.Repeat("x", 200))
	f.Fuzz(func(t *testing.T, version, reserved, containers, share, phase, tail string) {
		compareShare(t, shareFile(version, reserved, containers, share, phase, tail))
	})
}

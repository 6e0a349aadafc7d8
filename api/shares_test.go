// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The vectors in testdata/shares are shared with the CUDA hook's C reader
// (cuda-hook/difffuzz, share_test.go): every valid/*.share must decode and encode back to itself
// (the format has one spelling), and every invalid/*.share must be rejected, by both.

// shareVectors returns the files of testdata/shares/<dir>, by name.
func shareVectors(t testing.TB, dir string) map[string][]byte {
	files, err := filepath.Glob(filepath.Join("testdata/shares", dir, "*.share"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no %s share vectors: %v", dir, err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = b
	}
	return out
}

func TestShareVectors(t *testing.T) {
	for name, in := range shareVectors(t, "valid") {
		s, err := DecodeShare(in)
		if err != nil {
			t.Errorf("valid/%s: DecodeShare: %v", name, err)
			continue
		}
		if got, err := EncodeShare(s); err != nil || !bytes.Equal(got, in) {
			t.Errorf("valid/%s: EncodeShare(%+v) = %q, %v; want the file back", name, s, got, err)
		}
	}
	for name, in := range shareVectors(t, "invalid") {
		if s, err := DecodeShare(in); err == nil {
			t.Errorf("invalid/%s: DecodeShare accepted it: %+v", name, s)
		}
	}
}

func TestComputeUnreservedShare(t *testing.T) {
	for _, tc := range []struct {
		name       string
		reserved   []PhaseSpan
		containers int
		want       UnreservedShare
	}{
		{"nothing reserved: not paced", nil, 2, UnreservedShare{Containers: 2, Share: 100}},
		{"no cores only", []PhaseSpan{{Phase: 0, Cores: 0}}, 1, UnreservedShare{Containers: 1, Share: 100}},
		// 100 - 70 = 30, refilled where the 70 % window ends.
		{"one beside 70", []PhaseSpan{{Phase: 0, Cores: 70}}, 1, UnreservedShare{Reserved: 70, Containers: 1, Share: 30, Phase: 70}},
		// 30 / 2 = 15 each: together no more than the remainder.
		{"two beside 70", []PhaseSpan{{Phase: 0, Cores: 70}}, 2, UnreservedShare{Reserved: 70, Containers: 2, Share: 15, Phase: 70}},
		// 100 - 20 - 30 = 50, in gaps of 10 and 40: no gap holds it, so where it
		// overlaps the reservations least (50..100 overlaps 50..60).
		{"split gaps", []PhaseSpan{{Phase: 0, Cores: 20}, {Phase: 30, Cores: 30}}, 1, UnreservedShare{Reserved: 50, Containers: 1, Share: 50, Phase: 50}},
		{"all reserved: the minimum", []PhaseSpan{{Phase: 0, Cores: 100}}, 1, UnreservedShare{Reserved: 100, Containers: 1, Share: MinUnreservedShare, Phase: 0}},
		{"many: the minimum", []PhaseSpan{{Phase: 0, Cores: 90}}, 30, UnreservedShare{Reserved: 90, Containers: 30, Share: MinUnreservedShare, Phase: 90}},
		{"none yet: the remainder", []PhaseSpan{{Phase: 10, Cores: 40}}, 0, UnreservedShare{Reserved: 40, Share: 60, Phase: 40}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ComputeUnreservedShare(tc.reserved, tc.containers)
			if got != tc.want {
				t.Fatalf("ComputeUnreservedShare = %+v, want %+v", got, tc.want)
			}
			b, err := EncodeShare(got)
			if err != nil {
				t.Fatal(err)
			}
			back, err := DecodeShare(b)
			if err != nil || back != got {
				t.Fatalf("DecodeShare(%q) = %+v, %v; want %+v", b, back, err, got)
			}
		})
	}
}

func TestDecodeShareRejects(t *testing.T) {
	good := "version 1\nreserved 70\ncontainers 1\nshare 30\nphase 70\n"
	if _, err := DecodeShare([]byte(good)); err != nil {
		t.Fatalf("DecodeShare(%q): %v", good, err)
	}
	for _, bad := range []string{
		"",
		strings.TrimSuffix(good, "\n"),
		"version 2\nreserved 70\ncontainers 1\nshare 30\nphase 70\n",
		"version 1\nreserved 70\ncontainers 1\nshare 0\nphase 70\n",
		"version 1\nreserved 70\ncontainers 1\nshare 101\nphase 70\n",
		"version 1\nreserved 70\ncontainers 1\nshare 30\nphase 100\n",
		"version 1\nreserved 70\ncontainers 1\nshare +30\nphase 70\n",
		"version 1\nreserved 70\ncontainers 1\nshare 030\nphase 70\n",
		"version 1\nreserved -1\ncontainers 1\nshare 30\nphase 70\n",
		"version 1\ncontainers 1\nreserved 70\nshare 30\nphase 70\n",
		"version 1\nreserved 70\ncontainers 1\nshare 30\nphase 70\nshare 100\n",
		"version 1\nreserved 70\ncontainers 1\nshare  30\nphase 70\n",
		good + strings.Repeat("x", MaxShareFileBytes),
	} {
		if s, err := DecodeShare([]byte(bad)); err == nil {
			t.Errorf("DecodeShare(%q) = %+v, want an error", bad, s)
		}
	}
}

func TestHostSharesDir(t *testing.T) {
	if got, err := HostSharesDir("/run/tessera/containers", "GPU-0"); err != nil || got != "/run/tessera/containers/gpus/GPU-0" {
		t.Errorf("HostSharesDir = %q, %v", got, err)
	}
	for _, bad := range []string{"", "..", "GPU-0/../x"} {
		if _, err := HostSharesDir("/r", bad); err == nil {
			t.Errorf("HostSharesDir(%q): want an error", bad)
		}
	}
}

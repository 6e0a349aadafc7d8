// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The vectors in testdata/limits are shared with the CUDA hook's C reader
// (cuda-hook/test/limits_vectors.c): every valid/*.limits must decode to what its
// .canonical file encodes, and every invalid/*.limits must be rejected, by both.

func TestLimitsVectorsValid(t *testing.T) {
	files, err := filepath.Glob("testdata/limits/valid/*.limits")
	if err != nil || len(files) == 0 {
		t.Fatalf("no valid vectors: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			in, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(strings.TrimSuffix(f, ".limits") + ".canonical")
			if err != nil {
				t.Fatal(err)
			}
			l, err := DecodeLimits(in)
			if err != nil {
				t.Fatalf("DecodeLimits: %v", err)
			}
			got, err := EncodeLimits(l)
			if err != nil {
				t.Fatalf("EncodeLimits: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("canonical form differs:\n got: %q\nwant: %q", got, want)
			}
		})
	}
}

func TestLimitsVectorsInvalid(t *testing.T) {
	files, err := filepath.Glob("testdata/limits/invalid/*.limits")
	if err != nil || len(files) == 0 {
		t.Fatalf("no invalid vectors: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			in, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if l, err := DecodeLimits(in); err == nil {
				t.Errorf("DecodeLimits accepted it: %+v", l)
			}
		})
	}
}

func TestDecodeLimitsErrorsNameTheProblem(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"version 2\ncgroup /a\ncontext-mib 0\ngpu G 1 0 0\n", "version 2 is not supported"},
		{"version 1\ncgroup /a\ncontext-mib 0\ngpu G 1 60 41\n", "cores 60 + phase 41"},
		{"version 1\ncgroup /a\ncontext-mib 0\ngpu G 01 0 0\n", "line 4: memory-mib: \"01\" has a leading zero"},
		{"version 1\ncgroup a\ncontext-mib 0\ngpu G 1 0 0\n", "line 2: cgroup \"a\" must be an absolute path"},
		{"version 1\ncgroup /a\ncontext-mib 0\n", "incomplete"},
		{"version 1\ncgroup /a\ncontext-mib 0\ngpu G 1 30 0\nmps 30 /p\n", "cores 30 with an mps line"},
		{"version 1\ncgroup /a\ncontext-mib 0\ngpu G 1 0 0\nmps 30 /p\ngpu H 1 0 0\n", "line 6: nothing may follow the mps or work-conserving line"},
		{"version 1\ncgroup /a\ncontext-mib 0\ngpu G 1 30 0\nwork-conserving\ngpu H 1 0 0\n", "line 6: nothing may follow the mps or work-conserving line"},
		{"version 1\ncgroup /a\ncontext-mib 0\ngpu G 1 30 0\nwork-conserving 1\n", "line 5: want \"work-conserving\" alone"},
		{"version 1\ncgroup /a\ncontext-mib 0\ngpu G 1 0 0\nmps 0 /p\n", "line 5: mps percent 0"},
		{"version 1\ncgroup /a\ncontext-mib 0\ncharge class\ngpu G 1 0 0\n", "line 4: want \"charge kernel\""},
		{"version 1\ncgroup /a\ncontext-mib 0\ncharge kernel\nregion /r\ngpu G 1 0 0\n", "line 5: the region line must come before the charge line"},
	} {
		_, err := DecodeLimits([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeLimits(%q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

// roundTripEndsWith checks that l encodes to text ending with tail (its optional
// lines, after the gpu lines) and decodes back to l.
func roundTripEndsWith(t *testing.T, l *ContainerLimits, tail string) {
	t.Helper()
	b, err := EncodeLimits(l)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), tail) {
		t.Errorf("encoded %q, want it to end with %q", b, tail)
	}
	got, err := DecodeLimits(b)
	if err != nil || !reflect.DeepEqual(got, l) {
		t.Errorf("DecodeLimits(EncodeLimits(l)) = %+v, %v; want %+v", got, err, l)
	}
}

func TestMPSLimitsRoundTrip(t *testing.T) {
	l := &ContainerLimits{Cgroup: "/a", ContextMiB: 576, GPUs: []GPULimit{{UUID: "GPU-1", MemoryMiB: 20480}},
		MPS: &MPSLimit{ThreadPercent: 30, PipeDir: "/run/tessera-mps"}}
	roundTripEndsWith(t, l, "gpu GPU-1 20480 0 0\nmps 30 /run/tessera-mps\n")
	for _, bad := range []MPSLimit{{0, "/p"}, {101, "/p"}, {30, "p"}, {30, "/" + strings.Repeat("p", MaxMPSPipeDirBytes)}} {
		l.MPS = &bad
		if _, err := EncodeLimits(l); err == nil {
			t.Errorf("EncodeLimits with mps %+v: no error", bad)
		}
	}
}

func TestWorkConservingLimitsRoundTrip(t *testing.T) {
	l := &ContainerLimits{Cgroup: "/a", ContextMiB: 576, GPUs: []GPULimit{{UUID: "GPU-1", MemoryMiB: 20480, Cores: 30}},
		WorkConserving: true}
	roundTripEndsWith(t, l, "gpu GPU-1 20480 30 0\nwork-conserving\n")
	// MPS divides the SMs and the hook does not pace an MPS client: nothing to conserve.
	l.GPUs[0].Cores = 0
	l.MPS = &MPSLimit{ThreadPercent: 30, PipeDir: "/run/tessera-mps"}
	if _, err := EncodeLimits(l); err == nil || !strings.Contains(err.Error(), "work-conserving with an mps line") {
		t.Errorf("EncodeLimits work-conserving with mps: %v", err)
	}
}

func TestChargeKernelLimitsRoundTrip(t *testing.T) {
	l := &ContainerLimits{Cgroup: "/a", ContextMiB: 576, RegionDir: "/run/tessera-region", ChargeKernel: true,
		GPUs: []GPULimit{{UUID: "GPU-1", MemoryMiB: 20480, Cores: 30}}}
	roundTripEndsWith(t, l, "region /run/tessera-region\ncharge kernel\ngpu GPU-1 20480 30 0\n")
	// The class estimator is the absence of the line: a file any hook reads.
	l.ChargeKernel = false
	b, err := EncodeLimits(l)
	if err != nil || strings.Contains(string(b), "charge") {
		t.Errorf("EncodeLimits without ChargeKernel = %q, %v; want no charge line", b, err)
	}
}

func TestNewContainerLimits(t *testing.T) {
	c := ContainerAssignment{Name: "train", Devices: []DeviceGrant{
		{UUID: "GPU-1111", Index: 3, MemoryMiB: 4096, Cores: 30},
		{UUID: "GPU-2222", Index: 1, MemoryMiB: 8192},
	}}
	l, err := NewContainerLimits(c, "/kubepods/pod1/ctr")
	if err != nil {
		t.Fatal(err)
	}
	want := &ContainerLimits{Cgroup: "/kubepods/pod1/ctr", ContextMiB: DefaultContextMiB, GPUs: []GPULimit{
		{UUID: "GPU-1111", MemoryMiB: 4096, Cores: 30},
		{UUID: "GPU-2222", MemoryMiB: 8192},
	}}
	if !reflect.DeepEqual(l, want) {
		t.Errorf("got %+v, want %+v", l, want)
	}
	if _, err := NewContainerLimits(c, "relative"); err == nil || !strings.Contains(err.Error(), `container "train"`) {
		t.Errorf("relative cgroup: got %v, want an error naming the container", err)
	}
	bad := ContainerAssignment{Name: "x", Devices: []DeviceGrant{{UUID: "GPU 1", MemoryMiB: 1}}}
	if _, err := NewContainerLimits(bad, "/a"); err == nil {
		t.Error("uuid with a space was accepted")
	}
}

func TestHostLimitsDir(t *testing.T) {
	a := HostLimitsDir(DefaultHostLimitsRoot, "/kubepods/pod1/ctr")
	b := HostLimitsDir(DefaultHostLimitsRoot, "/kubepods/pod1/ctr2")
	if a == b {
		t.Fatal("two cgroups share a directory")
	}
	if !strings.HasPrefix(a, DefaultHostLimitsRoot+"/") || len(filepath.Base(a)) != 32 {
		t.Errorf("HostLimitsDir = %q, want %s/<32 hex digits>", a, DefaultHostLimitsRoot)
	}
	if a != HostLimitsDir(DefaultHostLimitsRoot, "/kubepods/pod1/ctr") {
		t.Error("HostLimitsDir is not deterministic")
	}
}

func TestPlacePhase(t *testing.T) {
	for _, tc := range []struct {
		name   string
		taken  []PhaseSpan
		cores  int
		want   int
		wantOK bool
	}{
		{"empty GPU", nil, 30, 0, true},
		{"after one", []PhaseSpan{{0, 30}}, 70, 30, true},
		{"gap in the middle", []PhaseSpan{{0, 20}, {50, 50}}, 30, 20, true},
		{"gap too small: the least overlap", []PhaseSpan{{0, 20}, {40, 60}}, 30, 10, false},
		{"pieces of free time: the least overlap", []PhaseSpan{{0, 30}, {40, 20}, {70, 25}}, 20, 20, false},
		{"the least overlap is not the first gap", []PhaseSpan{{0, 10}, {15, 40}, {70, 30}}, 20, 50, false},
		{"unpaced neighbours ignored", []PhaseSpan{{0, 0}}, 100, 0, true},
		{"full", []PhaseSpan{{0, 100}}, 1, 0, false},
		{"no cores needs no window", []PhaseSpan{{0, 100}}, 0, 0, true},
	} {
		got, ok := PlacePhase(tc.taken, tc.cores)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("%s: PlacePhase = %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.wantOK)
		}
	}
}

// FuzzDecodeLimits checks that decoding never panics, that whatever decodes also
// encodes, and that the encoding is a fixed point (decode(encode(x)) == x).
func FuzzDecodeLimits(f *testing.F) {
	for _, dir := range []string{"valid", "invalid"} {
		files, _ := filepath.Glob(filepath.Join("testdata/limits", dir, "*.limits"))
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := DecodeLimits(data)
		if err != nil {
			return
		}
		enc, err := EncodeLimits(l)
		if err != nil {
			t.Fatalf("decoded limits do not encode: %v", err)
		}
		l2, err := DecodeLimits(enc)
		if err != nil {
			t.Fatalf("encoding does not decode: %v\n%q", err, enc)
		}
		if !reflect.DeepEqual(l, l2) {
			t.Fatalf("round trip changed the limits: %+v != %+v", l, l2)
		}
	})
}

// An MPS client's context charge covers what its context took on an H200 (driver 580,
// docs/node-agent.md, MPS "Context charge") at every share measured, falls with the share, and
// is the plain charge at 100 %.
func TestMPSContextMiB(t *testing.T) {
	measured := map[int]int64{5: 58, 10: 72, 20: 122, 30: 166, 50: 274, 75: 390, 100: 516}
	for pct, took := range measured {
		if got := MPSContextMiB(DefaultContextMiB, pct); got < took || got > DefaultContextMiB {
			t.Errorf("MPSContextMiB(%d, %d) = %d, want between the %d MiB measured and %d", DefaultContextMiB, pct, got, took, DefaultContextMiB)
		}
	}
	prev := int64(0)
	for pct := 1; pct <= 100; pct++ {
		got := MPSContextMiB(DefaultContextMiB, pct)
		if got < prev {
			t.Errorf("MPSContextMiB at %d%% = %d, below %d at %d%%", pct, got, prev, pct-1)
		}
		prev = got
	}
	for _, pct := range []int{0, -5, 101} {
		if got := MPSContextMiB(DefaultContextMiB, pct); got != DefaultContextMiB {
			t.Errorf("MPSContextMiB at %d%% = %d, want the plain charge %d", pct, got, DefaultContextMiB)
		}
	}
	if got := MPSContextMiB(0, 30); got != 0 {
		t.Errorf("no plain charge: MPS charge %d, want 0", got)
	}
}

// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
)

func TestLimitsFor(t *testing.T) {
	lookup := func(i string) (string, error) { return "GPU-index-" + i, nil }
	for _, tc := range []struct {
		name    string
		args    []string
		want    []api.GPULimit
		wantErr string
	}{
		{"index and Gi", []string{"--gpu", "0", "--memory", "4Gi", "--cores", "30", "--", "python", "train.py"},
			[]api.GPULimit{{UUID: "GPU-index-0", MemoryMiB: 4096, Cores: 30}}, ""},
		{"uuids in order", []string{"--gpu", "GPU-b,GPU-a", "--memory", "512", "--", "x"},
			[]api.GPULimit{{UUID: "GPU-b", MemoryMiB: 512}, {UUID: "GPU-a", MemoryMiB: 512}}, ""},
		{"phase", []string{"--memory", "1Mi", "--cores", "70", "--phase", "30", "--", "x"},
			[]api.GPULimit{{UUID: "GPU-index-0", MemoryMiB: 1, Cores: 70, Phase: 30}}, ""},
		{"bad memory", []string{"--memory", "4GB", "--", "x"}, nil, "--memory"},
		{"window past the period", []string{"--memory", "1", "--cores", "80", "--phase", "30", "--", "x"}, nil, "exceed"},
	} {
		o, err := parse(tc.args)
		if err != nil {
			t.Fatalf("%s: parse: %v", tc.name, err)
		}
		l, err := limitsFor(o, lookup)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(l.GPUs) != len(tc.want) {
			t.Fatalf("%s: got %+v", tc.name, l.GPUs)
		}
		for i := range tc.want {
			if l.GPUs[i] != tc.want[i] {
				t.Errorf("%s: gpu %d = %+v, want %+v", tc.name, i, l.GPUs[i], tc.want[i])
			}
		}
		if !strings.HasPrefix(l.Cgroup, "/tessera-run/") {
			t.Errorf("%s: cgroup %q", tc.name, l.Cgroup)
		}
	}
}

func TestParseNeedsCommandAndMemory(t *testing.T) {
	if _, err := parse([]string{"--memory", "1"}); err == nil {
		t.Error("no command accepted")
	}
	if _, err := parse([]string{"--", "x"}); err == nil {
		t.Error("no --memory accepted")
	}
}

// The limits file gets the charge line under the kernel model, the default as on a
// node; --pacing-charge=class leaves it out; anything else is refused with the choices.
func TestPacingCharge(t *testing.T) {
	lookup := func(i string) (string, error) { return "GPU-index-" + i, nil }
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--memory", "1", "--", "x"}, true},
		{[]string{"--memory", "1", "--pacing-charge", "kernel", "--", "x"}, true},
		{[]string{"--memory", "1", "--pacing-charge", "class", "--", "x"}, false},
	} {
		o, err := parse(tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		l, err := limitsFor(o, lookup)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		b, err := api.EncodeLimits(l)
		if err != nil {
			t.Fatal(err)
		}
		if l.ChargeKernel != tc.want || strings.Contains(string(b), "\ncharge kernel\n") != tc.want {
			t.Errorf("%v: ChargeKernel %v, file %q; want the kernel model %v", tc.args, l.ChargeKernel, b, tc.want)
		}
	}
	if _, err := parse([]string{"--memory", "1", "--pacing-charge", "graph", "--", "x"}); err == nil ||
		!strings.Contains(err.Error(), `--pacing-charge "graph": want class`) || !strings.Contains(err.Error(), "or kernel") {
		t.Errorf("--pacing-charge graph: %v, want the choices", err)
	}
}

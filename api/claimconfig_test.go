// SPDX-License-Identifier: Apache-2.0

package api

import (
	"strings"
	"testing"
)

func TestDecodeGPUConfig(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		wc        *bool // nil: unset
		err       string
	}{
		{"work-conserving", `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true}`, ptrTo(true), ""},
		{"explicitly off", `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":false}`, ptrTo(false), ""},
		{"nothing set", `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig"}`, nil, ""},
		{"a typo", `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workconserving":true}`, nil, `unknown field "workconserving" (GPUConfig's fields: apiVersion, kind, workConserving)`},
		{"a string for a boolean", `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":"true"}`, nil, "cannot unmarshal string into Go struct field GPUConfig.workConserving of type bool"},
		{"no apiVersion", `{"kind":"GPUConfig","workConserving":true}`, nil, `apiVersion "", kind "GPUConfig"; Tessera reads apiVersion gpu.tessera.dev/v1alpha1`},
		{"another version", `{"apiVersion":"gpu.tessera.dev/v2","kind":"GPUConfig"}`, nil, `apiVersion "gpu.tessera.dev/v2"`},
		{"another kind", `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig"}`, nil, `kind "GpuConfig"`},
		{"not an object", `[1]`, nil, "cannot unmarshal array"},
		{"a key twice", `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true,"workConserving":false}`, nil, `duplicate field "workConserving"`},
		{"not JSON", `apiVersion: x`, nil, "not a JSON object"},
		{"empty", ``, nil, "not a JSON object"},
		{"two objects", `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig"}{}`, nil, "after top-level value"},
		{"too large", `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","x":"` + strings.Repeat("a", MaxGPUConfigBytes) + `"}`, nil, "more than the 10240"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := DecodeGPUConfig([]byte(tc.raw))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error with %q", c, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (c.WorkConserving == nil) != (tc.wc == nil) || (c.WorkConserving != nil && *c.WorkConserving != *tc.wc) {
				t.Errorf("workConserving %v, want %v", c.WorkConserving, tc.wc)
			}
		})
	}
}

// A later configuration replaces only what it sets.
func TestGPUConfigOver(t *testing.T) {
	on := GPUConfig{APIVersion: GPUConfigAPIVersion, Kind: GPUConfigKind, WorkConserving: ptrTo(true)}
	unset := GPUConfig{APIVersion: GPUConfigAPIVersion, Kind: GPUConfigKind}
	off := GPUConfig{APIVersion: GPUConfigAPIVersion, Kind: GPUConfigKind, WorkConserving: ptrTo(false)}
	if !unset.Over(on).IsWorkConserving() {
		t.Error("an entry that sets nothing turned workConserving off")
	}
	if off.Over(on).IsWorkConserving() {
		t.Error("workConserving: false did not override true")
	}
	if !on.Over(off).IsWorkConserving() || (GPUConfig{}).IsWorkConserving() {
		t.Error("override or default wrong")
	}
}

func ptrTo[T any](v T) *T { return &v }

// A configuration or constraint names a request by its name, a prioritized list's
// choice by its request's name or its own, and a subrequest its request before the
// choice; none names all.
func TestNamesRequest(t *testing.T) {
	for _, tc := range []struct {
		names   []string
		request string
		want    bool
	}{
		{nil, "gpu", true},
		{[]string{"gpu"}, "gpu", true},
		{[]string{"nic"}, "gpu", false},
		{[]string{"gpu"}, "gpu/large", true},
		{[]string{"gpu/large"}, "gpu/large", true},
		{[]string{"gpu/small"}, "gpu/large", false},
		{[]string{"gpu/small"}, "gpu", true},
		{[]string{"gpus"}, "gpu", false},
	} {
		if got := NamesRequest(tc.names, tc.request); got != tc.want {
			t.Errorf("NamesRequest(%q, %q) = %v, want %v", tc.names, tc.request, got, tc.want)
		}
	}
}

// Entries apply in order to the requests they name; any entry that does not decode is
// an error naming its origin.
func TestResolveGPUConfig(t *testing.T) {
	const on = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true}`
	const off = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":false}`
	entries := []GPUConfigEntry{{Parameters: []byte(on)}, {Requests: []string{"b"}, Parameters: []byte(off)}}
	if c, err := ResolveGPUConfig(entries, "a"); err != nil || !c.IsWorkConserving() {
		t.Errorf("a: %+v %v", c, err)
	}
	if c, err := ResolveGPUConfig(entries, "b"); err != nil || c.IsWorkConserving() {
		t.Errorf("b: %+v %v", c, err)
	}
	bad := append(entries, GPUConfigEntry{Requests: []string{"c"}, Parameters: []byte(`{}`), Origin: "from the claim for requests c"})
	if _, err := ResolveGPUConfig(bad, "a"); err == nil || !strings.Contains(err.Error(), "configuration from the claim for requests c: gpu.tessera.dev parameters") {
		t.Errorf("an entry that does not decode, for another request: %v", err)
	}
}

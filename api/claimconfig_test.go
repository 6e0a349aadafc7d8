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

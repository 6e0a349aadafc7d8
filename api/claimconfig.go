// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"fmt"
	"strings"

	kjson "sigs.k8s.io/json"
)

// A DRA ResourceClaim has no pod annotations: what a pod annotation asks on the
// device-plugin path (today: work-conserving pacing) a claim asks in opaque device
// configuration of the driver DRADriverName, in the claim's spec.devices.config or its
// DeviceClass's spec.config:
//
//	config:
//	- requests: [gpu]            # optional; all of the claim's requests when absent
//	  opaque:
//	    driver: gpu.tessera.dev
//	    parameters:
//	      apiVersion: gpu.tessera.dev/v1alpha1
//	      kind: GPUConfig
//	      workConserving: true
//
// The node agent reads it from the claim's allocation when it prepares the claim; the
// scheduler checks it before it allocates the claim, so a malformed one leaves the pod
// unschedulable with the reason instead of failing on the node.

// DRADriverName is Tessera's DRA driver: the ResourceSlices' driver, the DeviceClasses'
// selector, the domain of the devices' attributes and the driver of its opaque
// configuration.
const DRADriverName = "gpu.tessera.dev"

// GPUConfigAPIVersion and GPUConfigKind identify GPUConfig in opaque parameters.
const (
	GPUConfigAPIVersion = DRADriverName + "/v1alpha1"
	GPUConfigKind       = "GPUConfig"
)

// MaxGPUConfigBytes is the API's bound on opaque parameters.
const MaxGPUConfigBytes = 10 * 1024

// GPUConfig is the opaque device configuration of DRADriverName. Fields left out do
// not change what an earlier configuration of the same request set (a claim's
// configuration overrides its class's; within each, later entries override earlier).
type GPUConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// WorkConserving lets the claim's time-sliced shares use their GPU's idle time
	// beyond their cores while no other container on the GPU has work, as
	// AnnotationWorkConserving does for a pod (false when no configuration sets it).
	// Not on MPS GPUs, where MPS divides the SMs and nothing is paced.
	WorkConserving *bool `json:"workConserving,omitempty"`
}

// DecodeGPUConfig decodes opaque parameters strictly: apiVersion and kind must be
// GPUConfig's, and a field GPUConfig does not have is an error that names it (a typo
// would otherwise pass unnoticed and leave the share as it was).
func DecodeGPUConfig(raw []byte) (GPUConfig, error) {
	var c GPUConfig
	if len(raw) > MaxGPUConfigBytes {
		return c, fmt.Errorf("%s parameters: %d bytes, more than the %d the API allows", DRADriverName, len(raw), MaxGPUConfigBytes)
	}
	// Kubernetes' strict decoding: keys match case-sensitively (encoding/json would
	// take "workconserving" for workConserving), and unknown or repeated keys are
	// errors.
	strict, err := kjson.UnmarshalStrict(raw, &c)
	if err != nil {
		if ok, _ := kjson.SyntaxErrorOffset(err); ok || len(bytes.TrimSpace(raw)) == 0 {
			return GPUConfig{}, fmt.Errorf("%s parameters are not a JSON object: %v", DRADriverName, err)
		}
		return GPUConfig{}, fmt.Errorf("%s parameters: %s", DRADriverName, strings.TrimPrefix(err.Error(), "json: "))
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return GPUConfig{}, fmt.Errorf("%s parameters: %s (%s's fields: apiVersion, kind, workConserving)", DRADriverName, strings.Join(msgs, "; "), GPUConfigKind)
	}
	if c.APIVersion != GPUConfigAPIVersion || c.Kind != GPUConfigKind {
		return GPUConfig{}, fmt.Errorf("%s parameters are apiVersion %q, kind %q; Tessera reads apiVersion %s, kind %s",
			DRADriverName, c.APIVersion, c.Kind, GPUConfigAPIVersion, GPUConfigKind)
	}
	return c, nil
}

// Over is c applied over base: each field c sets replaces base's.
func (c GPUConfig) Over(base GPUConfig) GPUConfig {
	out := base
	out.APIVersion, out.Kind = c.APIVersion, c.Kind
	if c.WorkConserving != nil {
		out.WorkConserving = c.WorkConserving
	}
	return out
}

// GPUConfigEntry is one opaque configuration entry of DRADriverName: the requests it
// names (none: all of the claim's), its parameters, and where it comes from (for
// messages).
type GPUConfigEntry struct {
	Requests   []string
	Parameters []byte
	Origin     string
}

// ResolveGPUConfig is the configuration that applies to request, from entries in the
// order they apply (a DeviceClass's before the claim's): each entry that names the
// request is applied over the ones before it. Every entry must decode, whichever
// request it names; the error names the first that does not by its origin.
func ResolveGPUConfig(entries []GPUConfigEntry, request string) (GPUConfig, error) {
	var cfg GPUConfig
	for _, e := range entries {
		c, err := DecodeGPUConfig(e.Parameters)
		if err != nil {
			return GPUConfig{}, fmt.Errorf("configuration %s: %w", e.Origin, err)
		}
		if NamesRequest(e.Requests, request) {
			cfg = c.Over(cfg)
		}
	}
	return cfg, nil
}

// NamesRequest reports whether names, the requests a claim's configuration entry or
// constraint lists ("<request>" or "<request>/<subrequest>"; none names all), name
// request: a claim's request, or a prioritized list's choice of it
// ("<request>/<subrequest>"), which a name of its request covers. A name of one
// subrequest names its request while the choice is not made (in the scheduler).
func NamesRequest(names []string, request string) bool {
	if len(names) == 0 {
		return true
	}
	main, _, _ := strings.Cut(request, "/")
	for _, n := range names {
		if nm, _, _ := strings.Cut(n, "/"); n == request || n == main || nm == request {
			return true
		}
	}
	return false
}

// IsWorkConserving is WorkConserving, false when unset.
func (c GPUConfig) IsWorkConserving() bool { return c.WorkConserving != nil && *c.WorkConserving }

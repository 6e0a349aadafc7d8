// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The fuzz targets show that malformed annotations and requests give errors, never
// panics, and that whatever decodes also validates and re-encodes.

func FuzzDecodeInventory(f *testing.F) {
	s, _ := EncodeInventory(sampleInventory())
	for _, seed := range []string{s, "", "{}", `{"version":1,"gpus":null}`, `{"version":1,"gpus":[{"index":0,"uuid":"GPU-x","memoryMiB":1,"links":[{"peer":0}]}]}`, `{"version":1e400}`,
		`{"version":1,"gpus":[{"index":0,"uuid":"GPU-x","memoryMiB":1,"numaNode":0,"healthy":true,"sharing":"mps","mpsClients":48}]}`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		inv, err := DecodeInventory(s)
		if err != nil {
			return
		}
		if err := inv.Validate(); err != nil {
			t.Fatalf("decoded inventory does not validate: %v", err)
		}
		enc, err := EncodeInventory(inv)
		if err != nil {
			t.Fatalf("decoded inventory does not encode: %v", err)
		}
		// Compared by encoding: an empty list and a missing one decode apart but mean the same.
		if again, err := DecodeInventory(enc); err != nil {
			t.Fatalf("encoding does not decode: %v\n%s", err, enc)
		} else if enc2, _ := EncodeInventory(again); enc2 != enc {
			t.Fatalf("round trip changed the inventory:\n%s\n%s", enc, enc2)
		}
	})
}

func FuzzDecodeAssignment(f *testing.F) {
	s, _ := EncodeAssignment(sampleAssignment())
	for _, seed := range []string{s, "", "[]", `{"version":1,"node":"n","containers":[{"name":"c","devices":[{"uuid":"u","index":0,"memoryMiB":1}]}]}`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := DecodeAssignment(s)
		if err != nil {
			return
		}
		if err := a.Validate(); err != nil {
			t.Fatalf("decoded assignment does not validate: %v", err)
		}
		enc, err := EncodeAssignment(a)
		if err != nil {
			t.Fatalf("decoded assignment does not encode: %v", err)
		}
		// Compared by encoding: an empty list and a missing one decode apart but mean the same.
		if again, err := DecodeAssignment(enc); err != nil {
			t.Fatalf("encoding does not decode: %v\n%s", err, enc)
		} else if enc2, _ := EncodeAssignment(again); enc2 != enc {
			t.Fatalf("round trip changed the assignment:\n%s\n%s", enc, enc2)
		}
	})
}

// where puts the quantities in the limits (bit 0 clear) or the requests (set), of an
// init container (bit 1) or not, so that every path of the parser is reached.
func FuzzParsePodRequest(f *testing.F) {
	for _, seed := range [][4]string{{"1", "", "", ""}, {"0", "4096", "", "30"}, {"", "", "50", ""}, {"1e3", "-1", "101", "1.5"}, {"8", "1Ti", "", "100"}, {"1", "1Mi", "", "1"}} {
		f.Add(seed[0], seed[1], seed[2], seed[3], uint8(0))
		f.Add(seed[0], seed[1], seed[2], seed[3], uint8(3))
	}
	n := DefaultResourceNames()
	f.Fuzz(func(t *testing.T, gpu, mem, pct, cores string, where uint8) {
		limits := corev1.ResourceList{}
		for name, v := range map[corev1.ResourceName]string{n.GPU: gpu, n.GPUMemory: mem, n.GPUMemoryPercent: pct, n.GPUCores: cores} {
			if v == "" {
				continue
			}
			q, err := resource.ParseQuantity(v)
			if err != nil {
				return
			}
			limits[name] = q
		}
		c := corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Limits: limits}}
		if where&1 != 0 {
			c.Resources = corev1.ResourceRequirements{Requests: limits}
		}
		pod := &corev1.Pod{}
		if where&2 != 0 {
			pod.Spec.InitContainers = []corev1.Container{c}
		} else {
			pod.Spec.Containers = []corev1.Container{c}
		}
		req, err := ParsePodRequest(pod, n)
		if err != nil {
			return
		}
		if len(limits) == 0 {
			if !req.Empty() {
				t.Fatalf("no GPU resources read as %+v", req)
			}
			return
		}
		if len(req.Containers) != 1 || req.Containers[0].Init != (where&2 != 0) {
			t.Fatalf("request of %v read as %+v", limits, req)
		}
		for _, c := range req.Containers {
			if c.GPUs < 1 || c.GPUs > MaxGPUsPerContainer || c.MemoryMiB < 0 || c.MemoryMiB > MaxMemoryMiB ||
				c.MemoryPercent < 0 || c.MemoryPercent > 100 || c.Cores < 0 || c.Cores > 100 {
				t.Fatalf("accepted out-of-range request %+v", c)
			}
			// A grant below the node's context charge is refused by Filter, which knows the
			// node; the parser takes any whole MiB.
		}
	})
}

// FuzzDecodeShare checks that decoding a share file never panics, and that whatever
// decodes validates and encodes back to exactly the bytes it was read from: the
// format has one spelling, so an input accepted in any other would be a reader that
// takes more than the agent writes (and more than the hook's C reader may take).
func FuzzDecodeShare(f *testing.F) {
	for _, dir := range []string{"valid", "invalid"} {
		for _, b := range shareVectors(f, dir) {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeShare(data)
		if err != nil {
			if s != (UnreservedShare{}) {
				t.Fatalf("rejected input decoded as %+v: %v", s, err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("decoded share does not validate: %v", err)
		}
		enc, err := EncodeShare(s)
		if err != nil {
			t.Fatalf("decoded share does not encode: %v", err)
		}
		if !bytes.Equal(enc, data) {
			t.Fatalf("accepted a spelling the agent does not write:\nread  %q\nwrite %q", data, enc)
		}
	})
}

// FuzzDecodeGPUConfig: any parameters a claim carries are decoded or refused with an
// error, never a panic, and what decodes is GPUConfig's own version and kind.
func FuzzDecodeGPUConfig(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true}`))
	f.Add([]byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":null}`))
	f.Add([]byte(`{"kind":1}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := DecodeGPUConfig(raw)
		if err == nil && (c.APIVersion != GPUConfigAPIVersion || c.Kind != GPUConfigKind) {
			t.Fatalf("decoded %+v from %q", c, raw)
		}
	})
}

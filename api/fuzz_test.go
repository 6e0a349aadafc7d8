package api

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The fuzz targets show that malformed annotations and requests give errors, never
// panics, and that whatever decodes also validates and re-encodes.

func FuzzDecodeInventory(f *testing.F) {
	s, _ := EncodeInventory(sampleInventory())
	for _, seed := range []string{s, "", "{}", `{"version":1,"gpus":null}`, `{"version":1,"gpus":[{"index":0,"uuid":"GPU-x","memoryMiB":1,"links":[{"peer":0}]}]}`, `{"version":1e400}`} {
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
		if _, err := EncodeInventory(inv); err != nil {
			t.Fatalf("decoded inventory does not encode: %v", err)
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
		if _, err := EncodeAssignment(a); err != nil {
			t.Fatalf("decoded assignment does not encode: %v", err)
		}
	})
}

func FuzzParsePodRequest(f *testing.F) {
	for _, seed := range [][4]string{{"1", "", "", ""}, {"0", "4096", "", "30"}, {"", "", "50", ""}, {"1e3", "-1", "101", "1.5"}, {"8", "1Ti", "", "100"}} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	n := DefaultResourceNames()
	f.Fuzz(func(t *testing.T, gpu, mem, pct, cores string) {
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
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: limits}}}}}
		req, err := ParsePodRequest(pod, n)
		if err != nil {
			return
		}
		for _, c := range req.Containers {
			if c.GPUs < 1 || c.GPUs > MaxGPUsPerContainer || c.MemoryMiB < 0 || c.MemoryMiB > MaxMemoryMiB ||
				c.MemoryPercent < 0 || c.MemoryPercent > 100 || c.Cores < 0 || c.Cores > 100 {
				t.Fatalf("accepted out-of-range request %+v", c)
			}
		}
	})
}

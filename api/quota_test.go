// SPDX-License-Identifier: Apache-2.0

package api

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestQuotaTotals(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  ContainerRequest
		want map[corev1.ResourceName]int64
	}{
		{"2 GPUs × 8192 MiB: 16 GiB", ContainerRequest{GPUs: 2, MemoryMiB: 8192}, map[corev1.ResourceName]int64{ResourceTotalGPUMemory: 16384}},
		{"MiB and cores", ContainerRequest{GPUs: 4, MemoryMiB: 1000, Cores: 30}, map[corev1.ResourceName]int64{ResourceTotalGPUMemory: 4000, ResourceTotalGPUCores: 120}},
		{"percent: percent-GPUs", ContainerRequest{GPUs: 3, MemoryPercent: 25}, map[corev1.ResourceName]int64{ResourceTotalGPUMemoryPercent: 75}},
		{"100 percent is a whole GPU", ContainerRequest{GPUs: 2, MemoryPercent: 100, Cores: 50}, map[corev1.ResourceName]int64{ResourceTotalWholeGPUs: 2, ResourceTotalGPUCores: 100}},
		{"no memory: whole GPUs", ContainerRequest{GPUs: 8}, map[corev1.ResourceName]int64{ResourceTotalWholeGPUs: 8}},
		{"one GPU, 1 MiB", ContainerRequest{GPUs: 1, MemoryMiB: 1}, map[corev1.ResourceName]int64{ResourceTotalGPUMemory: 1}},
		{"largest request", ContainerRequest{GPUs: MaxGPUsPerContainer, MemoryMiB: MaxMemoryMiB, Cores: 100},
			map[corev1.ResourceName]int64{ResourceTotalGPUMemory: MaxGPUsPerContainer * MaxMemoryMiB, ResourceTotalGPUCores: MaxGPUsPerContainer * 100}},
	} {
		got := tc.req.QuotaTotals()
		if len(got) != len(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
			continue
		}
		for name, v := range tc.want {
			if q, ok := got[name]; !ok || q.Cmp(*resource.NewQuantity(v, resource.DecimalSI)) != 0 {
				t.Errorf("%s: %s = %v, want %d (all: %v)", tc.name, name, got[name], v, got)
			}
		}
	}
}

func TestQuotaResourceNames(t *testing.T) {
	names := QuotaResourceNames()
	seen := map[corev1.ResourceName]bool{}
	for _, n := range names {
		if !IsQuotaResource(n) {
			t.Errorf("IsQuotaResource(%s) = false", n)
		}
		if seen[n] {
			t.Errorf("%s listed twice", n)
		}
		seen[n] = true
		// A quota resource may never be a request name: the scheduler would parse it.
		for _, r := range []corev1.ResourceName{DefaultResourceNames().GPU, DefaultResourceNames().GPUMemory, DefaultResourceNames().GPUMemoryPercent, DefaultResourceNames().GPUCores} {
			if n == r {
				t.Errorf("%s is also a request name", n)
			}
		}
	}
	if errs := (ResourceNames{GPU: names[0], GPUMemory: names[1], GPUMemoryPercent: names[2], GPUCores: names[3]}).Validate(nil); len(errs) > 0 {
		t.Errorf("quota resource names are not valid extended resource names: %v", errs)
	}
	if IsQuotaResource(DefaultResourceNames().GPU) {
		t.Error("IsQuotaResource(tessera.dev/gpu) = true")
	}
}

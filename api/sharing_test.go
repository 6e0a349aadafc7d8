// SPDX-License-Identifier: Apache-2.0

package api

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseSharing(t *testing.T) {
	for in, want := range map[string]Sharing{"": SharingTimeSliced, " ": SharingTimeSliced, "mps": SharingMPS, "time-sliced": SharingTimeSliced, " mps ": SharingMPS} {
		if got, err := ParseSharing(in); err != nil || got != want {
			t.Errorf("ParseSharing(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"MPS", "mig", "timeslice", "mps,time-sliced"} {
		if _, err := ParseSharing(in); err == nil || !strings.Contains(err.Error(), AnnotationSharing) {
			t.Errorf("ParseSharing(%q) error %v, want one naming the annotation", in, err)
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationSharing: "mps"}}}
	if m, err := PodSharing(pod); err != nil || m != SharingMPS {
		t.Errorf("PodSharing = %q, %v", m, err)
	}
	if m, err := PodSharing(&corev1.Pod{}); err != nil || m != SharingTimeSliced {
		t.Errorf("PodSharing without annotation = %q, %v", m, err)
	}
}

func TestInventorySharing(t *testing.T) {
	inv := sampleInventory()
	inv.GPUs[0].Sharing, inv.GPUs[0].MPSClients = SharingMPS, DefaultMPSClientLimit
	s, err := EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeInventory(s)
	if err != nil {
		t.Fatal(err)
	}
	if out.GPUs[0].Mode() != SharingMPS || out.GPUs[0].MPSClients != 48 || out.GPUs[1].Mode() != SharingTimeSliced {
		t.Errorf("modes after round trip: %+v", out.GPUs)
	}
	if strings.Contains(s[strings.Index(s, `"GPU-b"`):], "sharing") {
		t.Errorf("a time-sliced GPU should carry no sharing field (older readers): %s", s)
	}
	tests := []struct {
		name   string
		mutate func(*NodeInventory)
		want   string
	}{
		{"unknown mode", func(i *NodeInventory) { i.GPUs[0].Sharing = "mig" }, `sharing "mig" is not one of`},
		{"mps without clients", func(i *NodeInventory) { i.GPUs[0].Sharing = SharingMPS }, "mpsClients 0 out of range"},
		{"mps too many clients", func(i *NodeInventory) { i.GPUs[0].Sharing, i.GPUs[0].MPSClients = SharingMPS, 49 }, "mpsClients 49 out of range"},
		{"clients without mps", func(i *NodeInventory) { i.GPUs[0].MPSClients = 4 }, "not in mps mode"},
		{"mps on MIG", func(i *NodeInventory) { i.GPUs[1].Sharing, i.GPUs[1].MPSClients = SharingMPS, 4 }, "MIG mode cannot be served in mps"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := sampleInventory()
			tc.mutate(inv)
			if _, err := EncodeInventory(inv); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestCheckMPSRequest(t *testing.T) {
	if err := CheckMPSRequest(PodRequest{Containers: []ContainerRequest{{Name: "a", GPUs: 1}, {Name: "b", GPUs: 1, Cores: 30}}}); err != nil {
		t.Errorf("one GPU per container is fine: %v", err)
	}
	err := CheckMPSRequest(PodRequest{Containers: []ContainerRequest{{Name: "a", GPUs: 1}, {Name: "b", GPUs: 2}}})
	if err == nil || !strings.Contains(err.Error(), `container "b" asks for 2 GPUs`) {
		t.Errorf("error %v", err)
	}
}

func TestParseWorkConserving(t *testing.T) {
	for in, want := range map[string]bool{"": false, "false": false, "true": true, " true ": true} {
		if got, err := ParseWorkConserving(in); err != nil || got != want {
			t.Errorf("ParseWorkConserving(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"yes", "1", "True", "on"} {
		if _, err := ParseWorkConserving(in); err == nil || !strings.Contains(err.Error(), AnnotationWorkConserving) {
			t.Errorf("ParseWorkConserving(%q): %v, want an error naming the annotation", in, err)
		}
	}
}

func TestInventoryMemoryFence(t *testing.T) {
	inv := sampleInventory()
	inv.GPUs[0].MemoryFence = MemoryFenceDriver
	s, err := EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeInventory(s)
	if err != nil {
		t.Fatal(err)
	}
	if out.GPUs[0].MemoryFence != MemoryFenceDriver || out.GPUs[1].MemoryFence != "" {
		t.Errorf("fences after round trip: %+v", out.GPUs)
	}
	if strings.Contains(s[strings.Index(s, `"GPU-b"`):], "memoryFence") {
		t.Errorf("a GPU without the driver's fence should carry no memoryFence field (older readers): %s", s)
	}
	for name, mutate := range map[string]func(*NodeInventory){
		"unknown fence": func(i *NodeInventory) { i.GPUs[0].MemoryFence = "cgroup" },
		"fence on MIG":  func(i *NodeInventory) { i.GPUs[1].MemoryFence = MemoryFenceDriver },
	} {
		inv := sampleInventory()
		mutate(inv)
		if _, err := EncodeInventory(inv); err == nil || !strings.Contains(err.Error(), "memoryFence") {
			t.Errorf("%s: error %v, want one naming memoryFence", name, err)
		}
	}
}

// SPDX-License-Identifier: Apache-2.0

package api

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func sampleInventory() *NodeInventory {
	return &NodeInventory{
		Version:   InventoryVersion,
		UpdatedAt: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		Driver:    "580.65",
		GPUs: []GPU{
			{Index: 0, UUID: "GPU-a", Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, SMCount: 132, NUMANode: 0, PCIBusID: "0000:18:00.0", Healthy: true,
				Links: []Link{{Peer: 1, NVLinks: 18, PCIe: PCIeNUMA}}},
			{Index: 1, UUID: "GPU-b", Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, SMCount: 132, NUMANode: 0, Healthy: false, HealthReason: "XID 79",
				MIG:   &MIG{Instances: []MIGInstance{{UUID: "MIG-1", Profile: "3g.40gb", MemoryMiB: 40000, SMCount: 60}}},
				Links: []Link{{Peer: 0, NVLinks: 18, PCIe: PCIeNUMA}}},
		},
	}
}

func TestInventoryRoundTrip(t *testing.T) {
	in := sampleInventory()
	s, err := EncodeInventory(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeInventory(s)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := EncodeInventory(out)
	if again != s {
		t.Errorf("round trip changed the annotation:\n%s\n%s", s, again)
	}
}

func TestInventoryValidation(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*NodeInventory)
		want   string
	}{
		{"version", func(i *NodeInventory) { i.Version = 2 }, "version 2 is not supported"},
		{"duplicate index", func(i *NodeInventory) { i.GPUs[1].Index = 0 }, "index 0 appears twice"},
		{"duplicate uuid", func(i *NodeInventory) { i.GPUs[1].UUID = "GPU-a" }, `uuid "GPU-a" appears twice`},
		{"empty uuid", func(i *NodeInventory) { i.GPUs[0].UUID = "" }, "uuid is empty"},
		{"uuid with comma", func(i *NodeInventory) { i.GPUs[0].UUID = "GPU-a,b" }, "malformed"},
		{"zero memory", func(i *NodeInventory) { i.GPUs[0].MemoryMiB = 0 }, "memoryMiB 0 out of range"},
		{"negative index", func(i *NodeInventory) { i.GPUs[0].Index = -1 }, "index -1 out of range"},
		{"numa", func(i *NodeInventory) { i.GPUs[0].NUMANode = -2 }, "numaNode -2"},
		{"link to self", func(i *NodeInventory) { i.GPUs[0].Links[0].Peer = 0 }, "peer 0 is not another GPU"},
		{"link to nobody", func(i *NodeInventory) { i.GPUs[0].Links[0].Peer = 7 }, "peer 7 is not another GPU"},
		{"bad pcie", func(i *NodeInventory) { i.GPUs[0].Links[0].PCIe = "warp" }, `pcie "warp" is not one of`},
		{"mig too big", func(i *NodeInventory) { i.GPUs[1].MIG.Instances[0].MemoryMiB = 90000 }, "more memory than the GPU"},
		{"mig uuid clash", func(i *NodeInventory) { i.GPUs[1].MIG.Instances[0].UUID = "GPU-a" }, "appears twice"},
		{"negative context charge", func(i *NodeInventory) { i.ContextMiB = -1 }, "contextMiB -1 out of range 0..65536"},
		{"context charge too large", func(i *NodeInventory) { i.ContextMiB = MaxContextMiB + 1 }, "contextMiB 65537 out of range"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := sampleInventory()
			tc.mutate(inv)
			_, err := EncodeInventory(inv)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestDecodeInventoryRejects(t *testing.T) {
	for _, s := range []string{"", "null", "[]", "{}", `{"version":"1"}`, `{"version":1,"gpus":[],"extra":1}`, `{"version":1} {}`, `{"version":3,"gpus":[]}`, strings.Repeat(" ", MaxAnnotationBytes+1)} {
		if _, err := DecodeInventory(s); err == nil {
			t.Errorf("DecodeInventory(%.40q) accepted", s)
		}
	}
	if inv, err := DecodeInventory(`{"version":1,"updatedAt":"2026-11-29T00:00:00Z","gpus":[]}`); err != nil || len(inv.GPUs) != 0 {
		t.Errorf("an empty GPU list is a valid inventory (a node whose GPUs are gone): %v", err)
	}
}

func sampleAssignment() *PodAssignment {
	return &PodAssignment{Version: AssignmentVersion, Node: "n1", Containers: []ContainerAssignment{
		{Name: "train", Devices: []DeviceGrant{{UUID: "GPU-a", Index: 0, MemoryMiB: 4096, Cores: 30}, {UUID: "GPU-b", Index: 1, MemoryMiB: 4096, Cores: 30}}},
		{Name: "warmup", Init: true, Devices: []DeviceGrant{{UUID: "GPU-a", Index: 0, MemoryMiB: 1024}}},
	}}
}

func TestAssignmentRoundTripAndValidation(t *testing.T) {
	s, err := EncodeAssignment(sampleAssignment())
	if err != nil {
		t.Fatal(err)
	}
	a, err := DecodeAssignment(s)
	if err != nil {
		t.Fatal(err)
	}
	if c := a.Container("train"); c == nil || len(c.Devices) != 2 || c.Devices[1].UUID != "GPU-b" {
		t.Fatalf("decoded %+v", a)
	}
	if a.Container("nope") != nil {
		t.Error("Container(nope) should be nil")
	}
	tests := []struct {
		name   string
		mutate func(*PodAssignment)
		want   string
	}{
		{"version", func(a *PodAssignment) { a.Version = 0 }, "version 0 is not supported"},
		{"node", func(a *PodAssignment) { a.Node = "" }, "node is empty"},
		{"no containers", func(a *PodAssignment) { a.Containers = nil }, "no containers"},
		{"duplicate container", func(a *PodAssignment) { a.Containers[1].Name = "train" }, `container "train" appears twice`},
		{"no devices", func(a *PodAssignment) { a.Containers[0].Devices = nil }, "0 devices"},
		{"duplicate device", func(a *PodAssignment) { a.Containers[0].Devices[1].UUID = "GPU-a" }, `uuid "GPU-a" appears twice`},
		{"cores", func(a *PodAssignment) { a.Containers[0].Devices[0].Cores = 101 }, "cores 101 out of range"},
		{"memory", func(a *PodAssignment) { a.Containers[0].Devices[0].MemoryMiB = 0 }, "memoryMiB 0 out of range"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := sampleAssignment()
			tc.mutate(a)
			if _, err := EncodeAssignment(a); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestResourceNames(t *testing.T) {
	if err := DefaultResourceNames().Validate(field.NewPath("r")).ToAggregate(); err != nil {
		t.Fatal(err)
	}
	hami := ResourceNames{GPU: "nvidia.com/gpu", GPUMemory: "nvidia.com/gpumem", GPUMemoryPercent: "nvidia.com/gpumem-percentage", GPUCores: "nvidia.com/gpucores"}
	if err := hami.Validate(field.NewPath("r")).ToAggregate(); err != nil {
		t.Errorf("HAMi-style names rejected: %v", err)
	}
	if g := hami.Group(); g != "nvidia.com" {
		t.Errorf("group %q", g)
	}
	for _, tc := range []struct {
		n    ResourceNames
		want string
	}{
		{ResourceNames{GPU: "gpu", GPUMemory: "a/b", GPUMemoryPercent: "a/c", GPUCores: "a/d"}, "r.gpu: Invalid value: \"gpu\": must be domain-qualified"},
		{ResourceNames{GPU: "a/b", GPUMemory: "a/b", GPUMemoryPercent: "a/c", GPUCores: "a/d"}, "already used by r.gpu"},
		{ResourceNames{GPU: "kubernetes.io/gpu", GPUMemory: "a/b", GPUMemoryPercent: "a/c", GPUCores: "a/d"}, "reserved domain"},
		{ResourceNames{GPU: "a/b"}, "r.gpuMemory: Required value: must be set"},
		// Every error, not just the first.
		{ResourceNames{GPU: "a/b"}, "r.gpuCores: Required value: must be set"},
	} {
		if err := tc.n.Validate(field.NewPath("r")).ToAggregate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%v) = %v, want %q", tc.n, err, tc.want)
		}
	}
}

func podWith(limits map[string]string) *corev1.Pod {
	l := corev1.ResourceList{}
	for k, v := range limits {
		l[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: l}}}}}
}

func TestParsePodRequest(t *testing.T) {
	n := DefaultResourceNames()
	req, err := ParsePodRequest(podWith(map[string]string{"tessera.dev/gpu": "2", "tessera.dev/gpu-memory": "4Ki", "tessera.dev/gpu-cores": "30"}), n)
	if err != nil {
		t.Fatal(err)
	}
	c := req.Containers[0]
	if c.GPUs != 2 || c.MemoryMiB != 4096 || c.Cores != 30 || c.WholeMemory() {
		t.Errorf("parsed %+v", c)
	}
	if got := c.String(); got != "2 GPU × 4096 MiB, 30% cores" {
		t.Errorf("String() = %q", got)
	}
	pct, _ := ParsePodRequest(podWith(map[string]string{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory-percent": "25"}), n)
	if m := pct.Containers[0].MemoryOn(15360); m != 3840 {
		t.Errorf("25%% of 15360 = %d", m)
	}
	whole, _ := ParsePodRequest(podWith(map[string]string{"tessera.dev/gpu": "1"}), n)
	if !whole.Containers[0].WholeMemory() || whole.Containers[0].MemoryOn(100) != 100 {
		t.Errorf("whole-memory request parsed as %+v", whole.Containers[0])
	}
	none, err := ParsePodRequest(podWith(map[string]string{"cpu": "1"}), n)
	if err != nil || !none.Empty() || HasGPURequest(podWith(map[string]string{"cpu": "1"}), n) {
		t.Errorf("CPU pod: %+v %v", none, err)
	}
	// Requests without limits count as well (extended resources need equal values).
	p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{"tessera.dev/gpu": resource.MustParse("1")}}}}}}
	if r, err := ParsePodRequest(p, n); err != nil || len(r.Containers) != 1 {
		t.Errorf("request-only container: %+v %v", r, err)
	}
	var re *RequestError
	_, err = ParsePodRequest(podWith(map[string]string{"tessera.dev/gpu": "1.5"}), n)
	if err == nil || !asRequestError(err, &re) || re.Container != "c" || re.Field != "tessera.dev/gpu" {
		t.Errorf("1.5 GPUs: %v", err)
	}
}

// The context charge is the node's, so the request alone is not refused for it:
// ParsePodRequest accepts memory below the default charge, which the scheduler
// judges per node and GPU (ContextCharge).
func TestParsePodRequestLeavesTheContextChargeToTheNode(t *testing.T) {
	n := DefaultResourceNames()
	for _, limits := range []map[string]string{
		{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "512"},
		{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "1"},
		{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory-percent": "1"},
	} {
		req, err := ParsePodRequest(podWith(limits), n)
		if err != nil || len(req.Containers) != 1 {
			t.Errorf("%v: %+v, %v", limits, req, err)
		}
	}
}

// ContextCharge is the node's plain charge for a time-sliced pod and MPSContextMiB
// of it for an MPS pod (30% gives 214 of 576, 5% gives 84, no gpu-cores all of it);
// an inventory without contextMiB charges DefaultContextMiB.
func TestContextCharge(t *testing.T) {
	tests := []struct {
		node    int64 // inventory's contextMiB
		sharing Sharing
		cores   int
		want    int64
		words   string
	}{
		{0, SharingTimeSliced, 0, 576, "each process's CUDA context"},
		{0, SharingTimeSliced, 30, 576, "each process's CUDA context"},
		{1024, SharingTimeSliced, 0, 1024, "each process's CUDA context"},
		{300, SharingTimeSliced, 50, 300, "each process's CUDA context"},
		{0, SharingMPS, 30, 214, "each MPS client's CUDA context at 30% of the SMs"},
		{0, SharingMPS, 5, 84, "each MPS client's CUDA context at 5% of the SMs"},
		{0, SharingMPS, 0, 576, "each MPS client's CUDA context using all SMs (no gpu-cores)"},
		{1000, SharingMPS, 50, 550, "each MPS client's CUDA context at 50% of the SMs"},
	}
	for _, tt := range tests {
		inv := &NodeInventory{ContextMiB: tt.node}
		if got := ContextCharge(inv.ContextCharge(), tt.sharing, tt.cores); got != tt.want {
			t.Errorf("node %d, %s, %d%% cores: charge %d, want %d", tt.node, tt.sharing, tt.cores, got, tt.want)
		}
		if got := ContextChargeWords(tt.sharing, tt.cores); got != tt.words {
			t.Errorf("%s, %d%% cores: words %q, want %q", tt.sharing, tt.cores, got, tt.words)
		}
	}
}

// An agent with the default charge publishes no contextMiB, so its inventory reads
// as before; another charge round-trips.
func TestInventoryContextMiB(t *testing.T) {
	in := sampleInventory()
	s, err := EncodeInventory(in)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s, "contextMiB") {
		t.Errorf("default charge published: %s", s)
	}
	in.ContextMiB = 1024
	if s, err = EncodeInventory(in); err != nil || !strings.Contains(s, `"contextMiB":1024`) {
		t.Fatalf("%s, %v", s, err)
	}
	out, err := DecodeInventory(s)
	if err != nil || out.ContextCharge() != 1024 {
		t.Fatalf("decoded %+v, %v", out, err)
	}
}

func asRequestError(err error, out **RequestError) bool {
	re, ok := err.(*RequestError)
	if ok {
		*out = re
	}
	return ok
}

func TestParseTopology(t *testing.T) {
	for in, want := range map[string]Topology{"": TopologyPreferred, "none": TopologyNone, " nvlink-required ": TopologyNVLinkRequired, "numa-required": TopologyNUMARequired} {
		if got, err := ParseTopology(in); err != nil || got != want {
			t.Errorf("ParseTopology(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseTopology("NVLink"); err == nil {
		t.Error("unknown topology accepted")
	}
}

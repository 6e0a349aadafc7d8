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

// A container whose gpu-memory is below the CUDA hook's context charge could never
// create a context: 576 MiB time-sliced; an MPS client's charge at its share
// (MPSContextMiB: 30% gives 214, 5% gives 84, no gpu-cores 576).
func TestParsePodRequestContextCharge(t *testing.T) {
	n := DefaultResourceNames()
	tests := []struct {
		name    string
		sharing string
		limits  map[string]string
		want    string // "" when accepted
	}{
		{"time-sliced below", "", map[string]string{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "512"},
			"asks for 512 MiB per GPU, less than the 576 MiB the CUDA hook charges for each process's CUDA context"},
		{"time-sliced one below", "time-sliced", map[string]string{"tessera.dev/gpu": "2", "tessera.dev/gpu-memory": "575", "tessera.dev/gpu-cores": "10"},
			"ask for at least 576 MiB"},
		{"time-sliced at the charge", "", map[string]string{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "576"}, ""},
		{"mps 30% below", "mps", map[string]string{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "213", "tessera.dev/gpu-cores": "30"},
			"less than the 214 MiB the CUDA hook charges for each MPS client's CUDA context at 30% of the SMs"},
		{"mps 30% at the charge", "mps", map[string]string{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "214", "tessera.dev/gpu-cores": "30"}, ""},
		{"mps 5%", "mps", map[string]string{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "84", "tessera.dev/gpu-cores": "5"}, ""},
		{"mps without cores below", "mps", map[string]string{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "512"},
			"576 MiB the CUDA hook charges for each MPS client's CUDA context using all SMs"},
		{"percent is checked on the GPU, not here", "", map[string]string{"tessera.dev/gpu": "1", "tessera.dev/gpu-memory-percent": "1"}, ""},
		{"whole memory", "", map[string]string{"tessera.dev/gpu": "1"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := podWith(tt.limits)
			if tt.sharing != "" {
				pod.Annotations = map[string]string{AnnotationSharing: tt.sharing}
			}
			_, err := ParsePodRequest(pod, n)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var re *RequestError
			if err == nil || !asRequestError(err, &re) || re.Field != "tessera.dev/gpu-memory" || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a tessera.dev/gpu-memory error containing %q", err, tt.want)
			}
		})
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

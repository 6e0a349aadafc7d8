// SPDX-License-Identifier: Apache-2.0

package placement_test

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/binpack"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// withCharge is inv published by an agent that charges contextMiB per CUDA context
// (0: the default, which the agent leaves out of the inventory).
func withCharge(inv *api.NodeInventory, contextMiB int64) *api.NodeInventory {
	inv.ContextMiB = contextMiB
	if err := inv.Validate(); err != nil {
		panic(err)
	}
	return inv
}

// mixedNode is one H100 (81559 MiB) and one T4 (15360 MiB), on PCIe.
func mixedNode() *api.NodeInventory {
	inv := fixtures.PCIeNode("mixed", 2, "Tesla T4", fixtures.T4MiB)
	inv.GPUs[0].Model, inv.GPUs[0].MemoryMiB = "NVIDIA H100 80GB HBM3", fixtures.H100MiB
	return inv
}

// migNode is an A100 in MIG mode with a 1g.5gb (4864 MiB) and a 3g.20gb (19968 MiB)
// instance, beside a whole A100.
func migNode() *api.NodeInventory {
	inv := fixtures.PCIeNode("mig", 2, "NVIDIA A100-SXM4-40GB", 40960)
	inv.GPUs[0].MIG = &api.MIG{Instances: []api.MIGInstance{
		{UUID: "MIG-small", Profile: "1g.5gb", MemoryMiB: 4864},
		{UUID: "MIG-large", Profile: "3g.20gb", MemoryMiB: 19968},
	}}
	return inv
}

// mpsNode is four T4s served by MPS, four clients each.
func mpsNode() *api.NodeInventory {
	inv := fixtures.PCIeNode("mps", 4, "Tesla T4", fixtures.T4MiB)
	for i := range inv.GPUs {
		inv.GPUs[i].Sharing, inv.GPUs[i].MPSClients = api.SharingMPS, 4
	}
	return inv
}

// podInfo is the placement request of one container c (a pod annotated ann), as
// PreFilter builds it, placed by Binpack.
func podInfo(t *testing.T, c api.ContainerRequest, ann map[string]string) *placement.PodInfo {
	t.Helper()
	if c.Name == "" {
		c.Name = "infer"
	}
	info := &placement.PodInfo{Req: api.PodRequest{Containers: []api.ContainerRequest{c}}, Order: []int{0}, Device: binpack.Placer{}}
	if include := ann[api.AnnotationModelInclude]; include != "" {
		info.ModelInclude = []string{strings.ToLower(include)}
	}
	if err := placement.ParseSharing(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: ann}}, info); err != nil {
		t.Fatal(err)
	}
	return info
}

// A container's memory on a GPU below the node's charge for one CUDA context never
// fits that GPU: the node's published contextMiB where it publishes one, the default
// 576 MiB otherwise; an MPS client's charge at its share on MPS GPUs. MiB requests
// are judged alike on every GPU, percent and whole-memory requests per GPU size
// (model, MIG instance). The miss is unresolvable (no eviction helps) and its reason
// names the charge, the agent's flag and the least request that would do.
func TestContextCharge(t *testing.T) {
	mps := map[string]string{api.AnnotationSharing: "mps"}
	tests := []struct {
		name string
		inv  *api.NodeInventory
		c    api.ContainerRequest
		ann  map[string]string
		// placed are the devices' UUIDs the container gets; empty when refused
		// with a reason containing every string of want.
		placed []string
		want   []string
	}{
		{name: "MiB below the default charge", inv: fixtures.PCIeNode("t4", 4, "Tesla T4", fixtures.T4MiB),
			c: api.ContainerRequest{GPUs: 1, MemoryMiB: 512},
			want: []string{`container "infer" asks 512 MiB per GPU, less than the 576 MiB the node's CUDA hook charges for each process's CUDA context`,
				"--context-mib, 576 MiB per plain context", "ask for at least 576 MiB"}},
		{name: "MiB at the default charge", inv: fixtures.PCIeNode("t4", 4, "Tesla T4", fixtures.T4MiB),
			c: api.ContainerRequest{GPUs: 1, MemoryMiB: 576}, placed: []string{"GPU-t4-0"}},
		{name: "MiB above the default, below the node's larger charge", inv: withCharge(fixtures.PCIeNode("t4", 4, "Tesla T4", fixtures.T4MiB), 1024),
			c:    api.ContainerRequest{GPUs: 1, MemoryMiB: 1000},
			want: []string{"asks 1000 MiB per GPU, less than the 1024 MiB", "--context-mib, 1024 MiB per plain context", "ask for at least 1024 MiB"}},
		{name: "MiB below the default, above the node's smaller charge", inv: withCharge(fixtures.PCIeNode("t4", 4, "Tesla T4", fixtures.T4MiB), 300),
			c: api.ContainerRequest{GPUs: 1, MemoryMiB: 400}, placed: []string{"GPU-t4-0"}},
		{name: "multi-GPU MiB below the charge", inv: fixtures.NVLinkNode("h100", 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB),
			c:    api.ContainerRequest{GPUs: 4, MemoryMiB: 100},
			want: []string{"asks 100 MiB per GPU, less than the 576 MiB"}},
		// 3% of a T4 is 460 MiB, of an H100 2446.
		{name: "percent below the charge on a T4", inv: fixtures.PCIeNode("t4", 4, "Tesla T4", fixtures.T4MiB),
			c: api.ContainerRequest{GPUs: 1, MemoryPercent: 3},
			want: []string{`container "infer" asks 3% of each GPU's memory, 460 MiB on the node's largest GPU (15360 MiB), less than the 576 MiB`,
				"ask for at least 4% of this GPU's memory, or a gpu-memory of at least 576 MiB"}},
		{name: "the same percent on an H100", inv: fixtures.NVLinkNode("h100", 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB),
			c: api.ContainerRequest{GPUs: 1, MemoryPercent: 3}, placed: []string{"GPU-h100-0"}},
		// 4% of a T4 is 614 MiB: above the default, below 1024 (7% is 1075).
		{name: "percent above the default, below the node's charge", inv: withCharge(fixtures.PCIeNode("t4", 4, "Tesla T4", fixtures.T4MiB), 1024),
			c:    api.ContainerRequest{GPUs: 1, MemoryPercent: 4},
			want: []string{"614 MiB on the node's largest GPU (15360 MiB), less than the 1024 MiB", "ask for at least 7%"}},
		{name: "percent on a node of two sizes takes the GPU it covers", inv: mixedNode(),
			c: api.ContainerRequest{GPUs: 1, MemoryPercent: 1}, placed: []string{"GPU-mixed-0"}},
		{name: "multi-GPU percent covered on one GPU of two", inv: mixedNode(),
			c:    api.ContainerRequest{GPUs: 2, MemoryPercent: 1},
			want: []string{"asks 1% of each GPU's memory, 815 MiB on the node's largest GPU (81559 MiB)", "only 1 of the node's GPUs give it enough, it asks 2", "ask for a gpu-memory of at least 576 MiB"}},
		{name: "multi-GPU percent covered on both", inv: mixedNode(),
			c: api.ContainerRequest{GPUs: 2, MemoryPercent: 4}, placed: []string{"GPU-mixed-0", "GPU-mixed-1"}},
		// 10% of a 1g.5gb instance is 486 MiB, of a 3g.20gb 1996.
		{name: "MIG percent skips the instance it does not cover", inv: migNode(), ann: map[string]string{api.AnnotationModelInclude: "MIG"},
			c: api.ContainerRequest{GPUs: 1, MemoryPercent: 10}, placed: []string{"MIG-large"}},
		{name: "MIG percent on the small instance only", inv: migNode(), ann: map[string]string{api.AnnotationModelInclude: "MIG 1g.5gb"},
			c:    api.ContainerRequest{GPUs: 1, MemoryPercent: 10},
			want: []string{"486 MiB on the node's largest GPU (4864 MiB)", "ask for at least 12% of this GPU's memory"}},
		{name: "MIG instance too small for a large charge, whole memory", inv: withCharge(migNode(), 8192), ann: map[string]string{api.AnnotationModelInclude: "MIG 1g.5gb"},
			c:    api.ContainerRequest{GPUs: 1},
			want: []string{"asks all of each GPU's memory, 4864 MiB", "less than the 8192 MiB", "no GPU of the node can hold one context"}},
		// An MPS client at 30% of the SMs is charged 214 of 576 MiB (api.MPSContextMiB).
		{name: "MPS client above its share's charge", inv: mpsNode(), ann: mps,
			c: api.ContainerRequest{GPUs: 1, MemoryMiB: 300, Cores: 30}, placed: []string{"GPU-mps-0"}},
		{name: "MPS client below its share's charge", inv: mpsNode(), ann: mps,
			c:    api.ContainerRequest{GPUs: 1, MemoryMiB: 200, Cores: 30},
			want: []string{"less than the 214 MiB the node's CUDA hook charges for each MPS client's CUDA context at 30% of the SMs", "ask for at least 214 MiB"}},
		{name: "MPS client without cores is charged all SMs", inv: mpsNode(), ann: mps,
			c:    api.ContainerRequest{GPUs: 1, MemoryMiB: 300},
			want: []string{"less than the 576 MiB", "using all SMs (no gpu-cores)"}},
		{name: "MPS percent, charge at its share", inv: withCharge(mpsNode(), 1000), ann: mps,
			c:    api.ContainerRequest{GPUs: 1, MemoryPercent: 3, Cores: 50},
			want: []string{"460 MiB on the node's largest GPU (15360 MiB), less than the 550 MiB", "ask for at least 4%"}},
	}
	w := &placement.Weights{Memory: 1, Cores: 1, Policy: 1, Topology: 2, Island: 1, MaxTenants: 10}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := nodemodel.Build(tt.inv)
			p := podInfo(t, tt.c, tt.ann)
			a, fail := placement.Allocate(m, make([]placement.Usage, len(m.Devices)), p, w)
			if len(tt.placed) > 0 {
				if fail != nil {
					t.Fatalf("refused: %s", fail.Status().Message())
				}
				var got []string
				for _, i := range a.Placements[0].Devices {
					got = append(got, m.Devices[i].UUID)
				}
				if strings.Join(got, ",") != strings.Join(tt.placed, ",") {
					t.Fatalf("placed on %v, want %v", got, tt.placed)
				}
				return
			}
			if fail == nil {
				t.Fatalf("placed on %v, want a refusal", a.Placements[0].Devices)
			}
			st := fail.Status()
			if st.Code() != fwk.UnschedulableAndUnresolvable {
				t.Errorf("code %v, want UnschedulableAndUnresolvable (no eviction covers a context charge)", st.Code())
			}
			for _, w := range tt.want {
				if !strings.Contains(st.Message(), w) {
					t.Errorf("reason %q\nlacks %q", st.Message(), w)
				}
			}
		})
	}
}

// A GPU whose free memory would take the request but whose share is below the charge
// is not counted as room: on a full node of T4s a 3% request is refused for the
// charge, not reported as waiting for free memory (which no eviction would fix).
func TestContextChargeBeforeRoom(t *testing.T) {
	m := nodemodel.Build(fixtures.PCIeNode("t4", 2, "Tesla T4", fixtures.T4MiB))
	used := []placement.Usage{{MemMiB: fixtures.T4MiB, Cores: 100, Tenants: 1}, {MemMiB: fixtures.T4MiB, Cores: 100, Tenants: 1}}
	w := &placement.Weights{Memory: 1, Cores: 1, Policy: 1, MaxTenants: 10}
	_, fail := placement.Allocate(m, used, podInfo(t, api.ContainerRequest{GPUs: 1, MemoryPercent: 3}, nil), w)
	if fail == nil || fail.Status().Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(fail.Status().Message(), "less than the 576 MiB") {
		t.Fatalf("got %v, want the context charge's reason", fail)
	}
	// At 4% (614 MiB) the same full node is a matter of room.
	_, fail = placement.Allocate(m, used, podInfo(t, api.ContainerRequest{GPUs: 1, MemoryPercent: 4}, nil), w)
	if fail == nil || fail.Status().Code() != fwk.Unschedulable || !strings.Contains(fail.Status().Message(), "no GPU with 4% of its memory free") {
		t.Fatalf("got %v, want the memory miss", fail)
	}
}

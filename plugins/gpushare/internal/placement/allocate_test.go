// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
)

func TestMissReasonWords(t *testing.T) {
	one := func(mib int64, pct, cores int) *api.ContainerRequest {
		return &api.ContainerRequest{Name: "train", GPUs: 1, MemoryMiB: mib, MemoryPercent: pct, Cores: cores}
	}
	four := &api.ContainerRequest{Name: "c", GPUs: 4, MemoryPercent: 50, Cores: 30}
	for _, tc := range []struct {
		c       *api.ContainerRequest
		kind    missKind
		tenants int
		later   bool
		want    string
	}{
		{one(4096, 0, 0), missMemory, 0, false, `node(s) had no GPU with 4096 MiB free for container "train"`},
		{one(0, 25, 0), missMemory, 0, false, `node(s) had no GPU with 25% of its memory free for container "train"`},
		{one(0, 0, 0), missMemory, 0, false, `node(s) had no GPU with all its memory free for container "train"`},
		{one(0, 100, 0), missMemory, 0, true, `node(s) had no GPU with all its memory free for container "train" beside the pod's other containers`},
		{four, missMemory, 0, false, `node(s) had fewer than 4 GPUs with 50% of their memory free for container "c"`},
		{&api.ContainerRequest{Name: "c", GPUs: 2}, missMemory, 0, false, `node(s) had fewer than 2 GPUs with all their memory free for container "c"`},
		{one(1000, 0, 30), missCores, 0, false, `node(s) had no GPU with 30% of its cores free for container "train"`},
		{four, missCores, 0, false, `node(s) had fewer than 4 GPUs with 30% of their cores free for container "c"`},
		{one(1000, 0, 0), missUnreserved, 0, false, `node(s) had no GPU with cores not reserved by others for container "train", which reserves no cores`},
		{four, missTenants, 3, false, `node(s) had fewer than 4 GPUs under the limit of 3 containers per GPU for container "c"`},
		{one(1000, 0, 30), missTogether, 0, false, `node(s) had no GPU with room for all it asks at once (1 GPU × 1000 MiB, 30% cores) for container "train"`},
		{&api.ContainerRequest{Name: `we"ird`, GPUs: 1, MemoryMiB: 1}, missMemory, 0, false, `node(s) had no GPU with 1 MiB free for container "we\"ird"`},
	} {
		if got := missReason(tc.c, tc.kind, tc.tenants, tc.later); got != tc.want {
			t.Errorf("missReason(%s, %d) = %q, want %q", tc.c, tc.kind, got, tc.want)
		}
	}
}

// A device's model selection reads the model in lower case that the node model keeps,
// and lowers the model itself where a Device was made without it: both decide alike.
func TestEligibleModelCase(t *testing.T) {
	models := []string{"NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "tesla v100-sxm2-32gb", ""}
	sels := []struct{ include, exclude []string }{
		{[]string{"h100"}, nil},
		{nil, []string{"t4"}},
		{[]string{"a100", "v100"}, []string{"mig"}},
		{[]string{"mig 1g.5gb"}, nil},
		{[]string{"T4"}, nil}, // selections are lower case; an upper-case one matches nothing
	}
	for _, model := range models {
		for _, sel := range sels {
			p := PodInfo{ModelInclude: sel.include, ModelExclude: sel.exclude}
			kept := nodemodel.Device{Model: model, ModelLower: strings.ToLower(model), MIG: strings.Contains(model, "MIG")}
			bare := kept
			bare.ModelLower = ""
			if a, b := p.Eligible(&kept), p.Eligible(&bare); a != b {
				t.Errorf("model %q, selection %+v: eligible %v with the lower-case model kept, %v without", model, sel, a, b)
			}
		}
	}
	h100 := nodemodel.Device{Model: "NVIDIA H100 80GB HBM3", ModelLower: "nvidia h100 80gb hbm3"}
	if !(&PodInfo{ModelInclude: []string{"h100"}}).Eligible(&h100) || (&PodInfo{ModelExclude: []string{"hbm3"}}).Eligible(&h100) {
		t.Errorf("an H100 against include h100 / exclude hbm3: want admitted / refused")
	}
}

package placement

import (
	"testing"

	"github.com/tessera-dev/tessera/api"
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

// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
)

// mpsBinder is newBinderWithPods on a node whose GPU-0 is served in mps mode with
// room for clients containers; GPU-1 stays time-sliced.
func mpsBinder(t *testing.T, clients int) (*Binder, *pods, MPSDirs) {
	t.Helper()
	b, ps := newBinderWithPods(t, t.TempDir())
	inv := *inventory
	inv.GPUs = append([]api.GPU(nil), inventory.GPUs...)
	inv.GPUs[0].Sharing, inv.GPUs[0].MPSClients = api.SharingMPS, clients
	if err := inv.Validate(); err != nil {
		t.Fatal(err)
	}
	b.cfg.Inventory = func() (*api.NodeInventory, error) { return &inv, nil }
	dirs := MPSDirs{Pipe: "/run/tessera/mps/GPU-0/pipe", Shm: "/run/tessera/mps/GPU-0/shm"}
	b.cfg.MPS = func(uuid string) (MPSDirs, bool) { return dirs, uuid == "GPU-0" }
	return b, ps, dirs
}

// mpsPod adds pod team/<name> (UID uid) whose container c asks for n GPUs with 4096
// MiB and 30% cores, granted on uuids, with the sharing annotation when mode is set.
func mpsPod(t *testing.T, ps *pods, uid, name, mode string, n int64, uuids ...string) map[string]string {
	t.Helper()
	var grants []api.DeviceGrant
	for i, u := range uuids {
		grants = append(grants, api.DeviceGrant{UUID: u, Index: i, MemoryMiB: 4096, Cores: 30})
	}
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "c", Devices: grants})
	if mode != "" {
		ann[api.AnnotationSharing] = mode
	}
	ps.byUID[uid] = pod(uid, name, ann, ctr("c", gpuLimits(n, 4096, 30)))
	return ann
}

func mpsReq(uid, name, id string, ann map[string]string) Request {
	r := req(id, "c", ann, deviceplugin.EnvRequested+"=1")
	r.PodUID, r.Pod = uid, name
	r.CgroupsPath = "kubepods-burstable-pod" + uid + ".slice:cri-containerd:" + id
	return r
}

func refusedWith(t *testing.T, err error, want string) {
	t.Helper()
	var r *RefusedError
	if !errors.As(err, &r) || !strings.Contains(r.Reason, want) {
		t.Errorf("error %v, want a refusal containing %q", err, want)
	}
}

func TestBindMPSContainer(t *testing.T) {
	b, ps, dirs := mpsBinder(t, 48)
	ann := mpsPod(t, ps, "u1", "infer", "mps", 1, "GPU-0")
	e, err := b.Bind(mpsReq("u1", "infer", "c1", ann))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(e.Env); got != fmt.Sprint([][2]string{
		{EnvVisibleDevices, "GPU-0"}, {EnvMPSPipeDirectory, ContainerMPSPipeDir},
		{EnvMPSThreadPercentage, "30"}, {EnvMPSPinnedMemoryLimit, "0=4096M"},
	}) {
		t.Errorf("env %s", got)
	}
	mounts := fmt.Sprint(e.Mounts)
	for _, m := range []Mount{{Source: dirs.Pipe, Destination: ContainerMPSPipeDir, ReadOnly: true}, {Source: dirs.Shm, Destination: "/dev/shm"}} {
		if !strings.Contains(mounts, fmt.Sprint(m)) {
			t.Errorf("mounts %s lack %v", mounts, m)
		}
	}
	// The hook enforces the memory grant but does not pace: MPS divides the SMs.
	l, err := api.DecodeLimits(e.Limits)
	if err != nil {
		t.Fatal(err)
	}
	if l.GPUs[0] != (api.GPULimit{UUID: "GPU-0", MemoryMiB: 4096}) {
		t.Errorf("limits %+v", l.GPUs[0])
	}
	// The SM share and the pipe directory are in the read-only limits file too, where
	// the hook takes them from: the environment is the tenant's.
	if l.MPS == nil || *l.MPS != (api.MPSLimit{ThreadPercent: 30, PipeDir: ContainerMPSPipeDir}) {
		t.Errorf("limits' mps line %+v, want 30%% and %s", l.MPS, ContainerMPSPipeDir)
	}
	// Each process's context is charged an MPS client's at 30 %, not a plain one's.
	if want := api.MPSContextMiB(b.cfg.ContextMiB, 30); l.ContextMiB != want || want >= b.cfg.ContextMiB {
		t.Errorf("context-mib %d, want %d (below the plain %d)", l.ContextMiB, want, b.cfg.ContextMiB)
	}
	// The record keeps the grant (cores included) for accounting.
	if rec, _ := b.cfg.Store.Get("c1"); rec.Devices[0].Cores != 30 {
		t.Errorf("record %+v", rec)
	}
	// Bound again (runtime retry, agent restart): the same edits.
	again, err := b.Bind(mpsReq("u1", "infer", "c1", ann))
	if err != nil || fmt.Sprint(again.Env, again.Mounts) != fmt.Sprint(e.Env, e.Mounts) {
		t.Errorf("rebind: %v\n%v %v\n%v %v", err, again.Env, again.Mounts, e.Env, e.Mounts)
	}
}

func TestBindSharingMismatchRefused(t *testing.T) {
	b, ps, _ := mpsBinder(t, 48)
	ann := mpsPod(t, ps, "u1", "ts", "", 1, "GPU-0")
	_, err := b.Bind(mpsReq("u1", "ts", "c1", ann))
	refusedWith(t, err, "asks for time-sliced sharing (annotation tessera.dev/gpu-sharing) but GPU GPU-0 is in mps mode")

	ann = mpsPod(t, ps, "u2", "m", "mps", 1, "GPU-1")
	_, err = b.Bind(mpsReq("u2", "m", "c2", ann))
	refusedWith(t, err, "asks for mps sharing (annotation tessera.dev/gpu-sharing) but GPU GPU-1 is in time-sliced mode")

	ann = mpsPod(t, ps, "u3", "two", "mps", 2, "GPU-0", "GPU-1")
	_, err = b.Bind(mpsReq("u3", "two", "c3", ann))
	refusedWith(t, err, "may take only one GPU per container")

	ann = mpsPod(t, ps, "u4", "bad", "MPS", 1, "GPU-0")
	_, err = b.Bind(mpsReq("u4", "bad", "c4", ann))
	refusedWith(t, err, `"MPS" is not one of time-sliced, mps`)

	ann = mpsPod(t, ps, "u5", "mig", "mps", 1, "MIG-1")
	_, err = b.Bind(mpsReq("u5", "mig", "c5", ann))
	refusedWith(t, err, "MIG instance MIG-1, which is not served by MPS")
	if n := len(b.Records()); n != 0 {
		t.Errorf("%d records after refusals", n)
	}
}

func TestBindMPSClientLimit(t *testing.T) {
	b, ps, _ := mpsBinder(t, 2)
	for i := 1; i <= 3; i++ {
		uid, name, id := fmt.Sprint("u", i), fmt.Sprint("p", i), fmt.Sprint("c", i)
		ann := mpsPod(t, ps, uid, name, "mps", 1, "GPU-0")
		_, err := b.Bind(mpsReq(uid, name, id, ann))
		if i <= 2 && err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		if i == 3 {
			refusedWith(t, err, "GPU GPU-0's MPS server takes 2 clients and 2 containers are bound to it already")
		}
	}
	// A client whose pod is gone frees its place.
	delete(ps.byUID, "u1")
	if _, err := b.Bind(mpsReq("u3", "p3", "c3", ps.byUID["u3"].Annotations)); err != nil {
		t.Errorf("after a client's pod is gone: %v", err)
	}
}

func TestBindMPSNeedsNRIAndAServedGPU(t *testing.T) {
	b, ps, _ := mpsBinder(t, 48)
	ann := mpsPod(t, ps, "u1", "late", "mps", 1, "GPU-0")
	r := mpsReq("u1", "late", "c1", ann)
	r.Started = true
	_, err := b.Bind(r)
	refusedWith(t, err, "MPS pods need NRI")

	// The inventory says mps, but this agent serves no GPU so.
	b.cfg.MPS = nil
	_, err = b.Bind(mpsReq("u1", "late", "c1", ann))
	refusedWith(t, err, "GPU GPU-0 is in mps mode in the node's inventory, but the node agent does not serve it so")
}

// Work-conserving pacing is for time-sliced GPUs: an MPS pod asking for it is refused
// with both annotations named.
func TestBindMPSWorkConservingRefused(t *testing.T) {
	b, ps, _ := mpsBinder(t, 48)
	ann := mpsPod(t, ps, "u1", "infer", "mps", 1, "GPU-0")
	ann[api.AnnotationWorkConserving] = "true"
	_, err := b.Bind(mpsReq("u1", "infer", "c1", ann))
	refusedWith(t, err, api.AnnotationWorkConserving+": true), which is for time-sliced GPUs")
}

func TestBindMPSContainerWithoutCores(t *testing.T) {
	b, ps, _ := mpsBinder(t, 48)
	grants := []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 4096}}
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "c", Devices: grants})
	ann[api.AnnotationSharing] = "mps"
	ps.byUID["u1"] = pod("u1", "all", ann, ctr("c", gpuLimits(1, 4096, 0)))
	e, err := b.Bind(mpsReq("u1", "all", "c1", ann))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range e.Env {
		if kv[0] == EnvMPSThreadPercentage {
			t.Errorf("no gpu-cores grant, yet %v", kv)
		}
	}
	l, err := api.DecodeLimits(e.Limits)
	if err != nil {
		t.Fatal(err)
	}
	if l.MPS == nil || l.MPS.ThreadPercent != 100 {
		t.Errorf("limits' mps line %+v, want every SM (100)", l.MPS)
	}
}

func TestTimeSlicedBindingUnchangedByMPS(t *testing.T) {
	b, ps, _ := mpsBinder(t, 48)
	ann := mpsPod(t, ps, "u1", "ts", "time-sliced", 1, "GPU-1")
	e, err := b.Bind(mpsReq("u1", "ts", "c1", ann))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range e.Env {
		if strings.HasPrefix(kv[0], "CUDA_MPS") {
			t.Errorf("time-sliced container got %v", kv)
		}
	}
	if l, _ := api.DecodeLimits(e.Limits); l.GPUs[0].Cores != 30 || l.MPS != nil {
		t.Errorf("a time-sliced container is paced by the hook and has no mps line: %+v %+v", l.GPUs[0], l.MPS)
	}
}

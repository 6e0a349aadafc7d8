// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// withFence gives the binder a driver fence on GPU-0 and GPU-1 (80 GiB each), with
// the host's cgroup hierarchy at dir/cgroup.
func withFence(t *testing.T, b *Binder, dir string) (*gpu.CgroupMemory, string) {
	t.Helper()
	root := filepath.Join(dir, "cgroup")
	mem := gpu.NewCgroupMemory(map[string]uint64{"GPU-0": 80 << 30, "GPU-1": 80 << 30}, func(d string) bool {
		st, err := os.Stat(d)
		return err == nil && st.IsDir()
	})
	b.cfg.Fence = &Fence{Driver: mem, CgroupRoot: root, Supported: func(u string) bool { return u == "GPU-0" || u == "GPU-1" }}
	return mem, root
}

const c1Cgroup = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poduid_1.slice/cri-containerd-c1.scope"

func mkdir(t *testing.T, d string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
}

// Through NRI the fence is set at StartContainer, when the runtime has created the
// container's cgroup and not yet run its process; it then holds a process that never
// loads the hook to the grant.
func TestFenceAtStart(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	mem, root := withFence(t, b, dir)
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{
		{UUID: "GPU-1", Index: 1, MemoryMiB: 4096, Cores: 30}, {UUID: "GPU-0", Index: 0, MemoryMiB: 4096, Cores: 30}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(2, 4096, 30)))
	if _, err := b.Bind(req("c1", "main", ann)); err != nil {
		t.Fatal(err) // the cgroup does not exist at creation: nothing is set yet
	}
	cg := filepath.Join(root, c1Cgroup)
	var refused *RefusedError
	if err := b.FenceContainer("c1"); !errors.As(err, &refused) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("fence without the cgroup: %v, want a refusal", err)
	}
	mkdir(t, cg)
	if err := b.FenceContainer("c1"); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"GPU-0", "GPU-1"} {
		l, err := mem.MemoryLimit(u, cg)
		if err != nil || !l.Set || l.Hard != 4096<<20 || l.Soft != 4096<<20 {
			t.Errorf("%s: limit %+v, %v; want 4096 MiB hard and soft", u, l, err)
		}
	}
	if err := b.FenceContainer("not-tessera"); err != nil {
		t.Errorf("a container without a record: %v", err)
	}
	// A process of the container without the hook, or in a cgroup it made below the
	// container's, is held to the grant by the driver.
	if err := mem.Alloc("GPU-1", cg, 4000<<20); err != nil {
		t.Fatalf("within the grant: %v", err)
	}
	if err := mem.Alloc("GPU-1", cg+"/escape", 200<<20); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("past the grant from a child cgroup: %v, want out of memory", err)
	}
}

// A limit is never raised: not by a second bind of the container (the grant is
// frozen at the first), nor when the cgroup already has a lower limit.
func TestFenceNeverRaised(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	mem, root := withFence(t, b, dir)
	cg := filepath.Join(root, c1Cgroup)
	mkdir(t, cg)
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 4096}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 0)))
	if _, err := b.Bind(req("c1", "main", ann)); err != nil {
		t.Fatal(err)
	}
	if err := b.FenceContainer("c1"); err != nil {
		t.Fatal(err)
	}
	// The annotation is edited to a bigger grant and the container bound again.
	bigger := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 16384}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", bigger, ctr("main", gpuLimits(1, 16384, 0)))
	r := req("c1", "main", bigger)
	r.Started = true
	if _, err := b.Bind(r); err != nil {
		t.Fatal(err)
	}
	if err := b.FenceContainer("c1"); err != nil {
		t.Fatal(err)
	}
	if l, _ := mem.MemoryLimit("GPU-0", cg); l.Hard != 4096<<20 {
		t.Errorf("limit after a bigger second bind: %d MiB, want 4096", l.Hard>>20)
	}
	// A lower limit already on the cgroup stays.
	if err := mem.SetMemoryLimit("GPU-0", cg, 1024<<20, 1024<<20); err != nil {
		t.Fatal(err)
	}
	if err := b.FenceContainer("c1"); err != nil {
		t.Fatal(err)
	}
	if l, _ := mem.MemoryLimit("GPU-0", cg); l.Hard != 1024<<20 {
		t.Errorf("a lower limit was raised to %d MiB", l.Hard>>20)
	}
}

// The fallback binding sets the fence before it answers the container's first CUDA
// call, and refuses the call when it cannot.
func TestFenceAtFallbackBind(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	mem, root := withFence(t, b, dir)
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 2048}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 2048, 0)))
	r := req("c1", "main", ann)
	r.Started = true
	var refused *RefusedError
	if _, err := b.Bind(r); !errors.As(err, &refused) {
		t.Fatalf("fallback bind without the container's cgroup: %v, want a refusal", err)
	}
	if _, ok := b.cfg.Store.Get("c1"); ok {
		t.Error("a container refused for its fence was recorded")
	}
	cg := filepath.Join(root, c1Cgroup)
	mkdir(t, cg)
	if _, err := b.Bind(r); err != nil {
		t.Fatal(err)
	}
	if l, _ := mem.MemoryLimit("GPU-0", cg); l.Hard != 2048<<20 {
		t.Errorf("limit %d MiB, want 2048", l.Hard>>20)
	}
}

// failingFence is a driver that claims support and fails every call.
type failingFence struct{ err error }

func (f failingFence) FenceSupport(string) ([]gpu.FenceSupport, error) { return nil, f.err }
func (f failingFence) SetMemoryLimit(string, string, uint64, uint64) error {
	return f.err
}
func (f failingFence) MemoryLimit(string, string) (gpu.MemoryLimit, error) {
	return gpu.MemoryLimit{}, nil
}

// Where the node found the fence, failing to set it refuses the container (fail
// closed); GPUs without it are bound with the hook's and the watchdog's fences only.
func TestFenceFailureRefuses(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	_, root := withFence(t, b, dir)
	b.cfg.Fence.Driver = failingFence{errors.New("NVML DeviceSetMemoryLimits_v1: Unknown Error")}
	mkdir(t, filepath.Join(root, c1Cgroup))
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 2048}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 2048, 0)))
	if _, err := b.Bind(req("c1", "main", ann)); err != nil {
		t.Fatal(err)
	}
	var refused *RefusedError
	if err := b.FenceContainer("c1"); !errors.As(err, &refused) || !strings.Contains(refused.Reason, "Unknown Error") {
		t.Errorf("fence failure: %v, want a refusal with the driver's error", err)
	}

	b.cfg.Fence.Supported = func(u string) bool { return u == "GPU-0" }
	ann = assignment(t, "node-1", api.ContainerAssignment{Name: "other", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 2048}}})
	ps.byUID["uid-2"] = pod("uid-2", "infer", ann, ctr("other", gpuLimits(1, 2048, 0)))
	r := Request{PodUID: "uid-2", Namespace: "team", Pod: "infer", PodAnnotations: ann, Container: "other", ContainerID: "c2",
		CgroupsPath: "kubepods-burstable-poduid_2.slice:cri-containerd:c2"}
	if _, err := b.Bind(r); err != nil {
		t.Fatal(err)
	}
	if err := b.FenceContainer("c2"); err != nil {
		t.Errorf("a container on a GPU without the fence: %v", err)
	}
}

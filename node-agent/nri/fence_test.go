// SPDX-License-Identifier: Apache-2.0

package nri

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/adaptation"
	nriapi "github.com/containerd/nri/pkg/api"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// The attack: a process in a GPU container that never loads the CUDA hook (a static
// binary, raw ioctls, the driver found through dl_iterate_phdr) allocates past its
// grant. On a node whose driver has the per-cgroup memory limit, the agent sets the
// grant on the container's cgroup at NRI's StartContainer, before the container's
// first process runs, and the driver refuses the allocation; a container whose
// fence cannot be set is not started.
func TestDriverFenceHoldsProcessWithoutHook(t *testing.T) {
	f := startFenced(t)
	root, mem, rt := f.root, f.mem, f.rt

	gpuPod := pod(t, "f1", api.ContainerAssignment{Name: "train", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 8192}}})
	c := ctr(gpuPod, "fc1", "train", deviceplugin.EnvRequested+"=1")
	if _, err := rt.create(t, gpuPod, c); err != nil {
		t.Fatal(err)
	}
	// runc create makes the container's cgroup; then the runtime calls StartContainer.
	cg := filepath.Join(root, "/kubepods.slice/kubepods-podf1.slice/cri-containerd-fc1.scope")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := rt.r.StartContainer(context.Background(), &adaptation.StartContainerRequest{Pod: gpuPod, Container: c}); err != nil {
		t.Fatalf("start: %v", err)
	}
	if l, err := mem.MemoryLimit("GPU-1", cg); err != nil || l.Hard != 8192<<20 {
		t.Fatalf("the container's driver limit: %+v, %v; want 8192 MiB", l, err)
	}
	// The process without the hook: what the hook would have refused, the driver does.
	if err := mem.Alloc("GPU-1", cg, 8000<<20); err != nil {
		t.Fatalf("within the grant: %v", err)
	}
	if err := mem.Alloc("GPU-1", cg, 1<<30); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("allocation past the grant by a process without the hook: %v, want out of memory", err)
	}

	// A container whose cgroup the driver cannot be given a limit on does not start.
	other := pod(t, "f2", api.ContainerAssignment{Name: "train", Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 4096}}})
	c2 := ctr(other, "fc2", "train", deviceplugin.EnvRequested+"=1")
	if _, err := rt.create(t, other, c2); err != nil {
		t.Fatal(err)
	}
	err := rt.r.StartContainer(context.Background(), &adaptation.StartContainerRequest{Pod: other, Container: c2})
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("start without a fence: %v, want the start to fail", err)
	}
	if refusals := f.refusals(); len(refusals) != 1 || !strings.Contains(refusals[0], "memory limit") {
		t.Errorf("refusals %q, want one for the fence", refusals)
	}
	// A container that is not Tessera's starts untouched.
	plain := pod(t, "f3")
	if err := rt.r.StartContainer(context.Background(), &adaptation.StartContainerRequest{Pod: plain, Container: ctr(plain, "fc3", "web")}); err != nil {
		t.Errorf("start of a container without GPUs: %v", err)
	}
}

// The same attack from a container that gets its GPU through a DRA claim: the claim is
// bound when kubelet prepares it, before its containers exist, so the agent finds a
// claim's containers at StartContainer by the claim's limits mount in the runtime's
// spec, and holds each one's cgroup to the memory of the claims it mounts, per GPU.
func TestDriverFenceHoldsClaimContainers(t *testing.T) {
	f := startFenced(t, func(dir string, c *binding.Config) {
		claims, err := checkpoint.Open(filepath.Join(dir, "state", "claims.json"))
		if err != nil {
			t.Fatal(err)
		}
		c.ClaimStore = claims
	})
	dir, root, mem, rt, b := f.dir, f.root, f.mem, f.rt, f.b

	// claimMounts binds a claim as kubelet's prepare does and returns the mounts its
	// CDI device gives each container.
	claimMounts := func(uid string, grants ...api.DeviceGrant) []*nriapi.Mount {
		t.Helper()
		e, err := b.BindClaim(binding.Claim{UID: uid, Namespace: "team", Name: "claim-" + uid, Devices: grants})
		if err != nil {
			t.Fatalf("binding claim %s: %v", uid, err)
		}
		var ms []*nriapi.Mount
		for _, m := range e.Mounts {
			ms = append(ms, &nriapi.Mount{Source: m.Source, Destination: m.Destination, Type: "bind"})
		}
		return ms
	}
	start := func(uid, id string, ms []*nriapi.Mount, mkCgroup bool) (string, error) {
		t.Helper()
		pd := pod(t, uid)
		c := ctr(pd, id, "train")
		c.Mounts = ms
		if _, err := rt.create(t, pd, c); err != nil {
			t.Fatal(err)
		}
		cg := filepath.Join(root, "/kubepods.slice/kubepods-pod"+uid+".slice/cri-containerd-"+id+".scope")
		if mkCgroup {
			if err := os.MkdirAll(cg, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return cg, rt.r.StartContainer(context.Background(), &adaptation.StartContainerRequest{Pod: pd, Container: c})
	}

	a := claimMounts("ca", api.DeviceGrant{UUID: "GPU-1", Index: 1, MemoryMiB: 6144, Cores: 30})
	cg, err := start("d1", "dc1", a, true)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if l, err := mem.MemoryLimit("GPU-1", cg); err != nil || l.Hard != 6144<<20 {
		t.Fatalf("the claim container's driver limit: %+v, %v; want the claim's 6144 MiB", l, err)
	}
	if l, _ := mem.MemoryLimit("GPU-0", cg); l.Set {
		t.Errorf("a limit on GPU-0, which the claim does not use: %+v", l)
	}
	if err := mem.Alloc("GPU-1", cg, 6000<<20); err != nil {
		t.Fatalf("within the claim: %v", err)
	}
	if err := mem.Alloc("GPU-1", cg, 1<<30); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("allocation past the claim by a process without the hook: %v, want out of memory", err)
	}

	// Two claims on one GPU in one container: held to their sum there.
	bm := claimMounts("cb", api.DeviceGrant{UUID: "GPU-1", Index: 1, MemoryMiB: 2048, Cores: 10})
	cg2, err := start("d2", "dc2", append(append([]*nriapi.Mount(nil), a...), bm...), true)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if l, err := mem.MemoryLimit("GPU-1", cg2); err != nil || l.Hard != 8192<<20 {
		t.Errorf("the two-claim container's driver limit: %+v, %v; want 6144 + 2048 MiB", l, err)
	}

	// A claim container whose fence cannot be set does not start.
	if _, err := start("d3", "dc3", a, false); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("start without a fence: %v, want the start to fail", err)
	}
	if refusals := f.refusals(); len(refusals) != 1 || !strings.Contains(refusals[0], "claims team/claim-ca") {
		t.Errorf("refusals %q, want one naming the claim", refusals)
	}

	// A mount at the limits directory whose source is no claim's is not a claim
	// container: no limit is set from it.
	cg4, err := start("d4", "dc4", []*nriapi.Mount{{Source: filepath.Join(dir, "elsewhere"), Destination: api.ContainerLimitsDir, Type: "bind"}}, true)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if l, _ := mem.MemoryLimit("GPU-1", cg4); l.Set {
		t.Errorf("a limit set from a mount that is no claim's: %+v", l)
	}
}

// fenced is an NRI plugin connected to a runtime on a node whose modelled driver has
// the per-cgroup memory fence on GPU-0 and GPU-1.
type fenced struct {
	dir, root string
	mem       *gpu.CgroupMemory
	rt        *runtime
	p         *Plugin
	b         *binding.Binder
	mu        sync.Mutex
	refused   []string
}

// refusals are the reasons the plugin reported refusing containers, so far.
func (f *fenced) refusals() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.refused)
}

// startFenced starts it; opts adjust the binder's config before it is built.
func startFenced(t *testing.T, opts ...func(dir string, c *binding.Config)) *fenced {
	t.Helper()
	dir, err := os.MkdirTemp("", "nri") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fenced{dir: dir, root: filepath.Join(dir, "cgroup")}
	f.mem = gpu.NewCgroupMemory(map[string]uint64{"GPU-0": 80 << 30, "GPU-1": 80 << 30}, func(d string) bool {
		st, err := os.Stat(d)
		return err == nil && st.IsDir()
	})
	f.rt = startRuntime(t, dir, nil, nil)
	f.p, f.b = newPluginWith(t, dir, nil, func(c *binding.Config) {
		c.Fence = &binding.Fence{Driver: f.mem, CgroupRoot: f.root, Supported: func(string) bool { return true }}
		for _, o := range opts {
			o(dir, c)
		}
	})
	f.p.OnRefused = func(ns, pod, c, reason string) {
		f.mu.Lock()
		f.refused = append(f.refused, reason)
		f.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go f.p.Run(ctx)
	waitConnected(t, f.p)
	return f
}

// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
)

// newClaimBinder is newBinderWithPods with a claim checkpoint in dir.
func newClaimBinder(t *testing.T, dir string) (*Binder, *pods) {
	t.Helper()
	b, ps := newBinderWithPods(t, dir)
	cs, err := checkpoint.Open(filepath.Join(dir, "claims.json"))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg.ClaimStore = cs
	return b, ps
}

func TestBindClaim(t *testing.T) {
	dir := t.TempDir()
	b, ps := newClaimBinder(t, dir)
	c := Claim{UID: "3f1c-uid", Namespace: "team", Name: "infer-gpu", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 8192, Cores: 30}}}
	e, err := b.BindClaim(c)
	if err != nil {
		t.Fatal(err)
	}
	key := ClaimCgroup(c.UID)
	limitsDir := api.HostLimitsDir(filepath.Join(dir, "limits"), key)
	want := []Mount{
		{Source: limitsDir, Destination: api.ContainerLimitsDir, ReadOnly: true},
		// The claim's containers share one region, hence one limit.
		{Source: filepath.Join(limitsDir, "region"), Destination: api.ContainerRegionDir},
		{Source: filepath.Join(dir, "libtessera-cuda.so"), Destination: filepath.Join(dir, "libtessera-cuda.so"), ReadOnly: true},
		{Source: filepath.Join(dir, "ld.so.preload"), Destination: PreloadPath, ReadOnly: true},
	}
	if fmt.Sprint(e.Mounts) != fmt.Sprint(want) {
		t.Errorf("mounts %v\nwant %v", e.Mounts, want)
	}
	if fi, err := os.Stat(filepath.Join(limitsDir, "region")); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("region directory: %v %v", fi, err)
	}
	l, err := api.DecodeLimits(e.Limits)
	if err != nil {
		t.Fatal(err)
	}
	if l.Cgroup != key || l.RegionDir != api.ContainerRegionDir || len(l.GPUs) != 1 || l.GPUs[0] != (api.GPULimit{UUID: "GPU-1", MemoryMiB: 8192, Cores: 30}) {
		t.Errorf("limits %+v", l)
	}
	if onDisk, _ := os.ReadFile(filepath.Join(limitsDir, api.LimitsFileName)); string(onDisk) != string(e.Limits) {
		t.Errorf("limits file %q, edits %q", onDisk, e.Limits)
	}
	rec, ok := b.cfg.ClaimStore.Get(c.UID)
	if !ok || !rec.Claim || rec.Cgroup != key || rec.Namespace != "team" || rec.Pod != "infer-gpu" {
		t.Fatalf("claim record %+v %v", rec, ok)
	}
	if _, ok := b.cfg.Store.Get(c.UID); ok {
		t.Error("the claim went into the containers' checkpoint")
	}

	// A container placed on GPU-1 takes the compute window after the claim's.
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096, Cores: 50}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 50)))
	if _, err := b.Bind(req("c1", "main", ann)); err != nil {
		t.Fatal(err)
	}
	if r, _ := b.cfg.Store.Get("c1"); r.Phases["GPU-1"] != 30 {
		t.Errorf("container phase %d, want 30 (after the claim's window)", r.Phases["GPU-1"])
	}

	// Prepared again (kubelet retries, the agent restarted): the same limits.
	e2, err := b.BindClaim(c)
	if err != nil {
		t.Fatal(err)
	}
	if string(e2.Limits) != string(e.Limits) {
		t.Errorf("second bind limits %q, first %q", e2.Limits, e.Limits)
	}
	// The same UID with another allocation is refused.
	other := c
	other.Devices = []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 9000, Cores: 30}}
	var refused *RefusedError
	if _, err := b.BindClaim(other); !errors.As(err, &refused) || !strings.Contains(err.Error(), "allocation does not change") {
		t.Errorf("changed allocation: %v", err)
	}

	if err := b.UnbindClaim(c.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(limitsDir); !os.IsNotExist(err) {
		t.Error("claim limits directory left behind")
	}
	if _, ok := b.cfg.ClaimStore.Get(c.UID); ok {
		t.Error("claim record left behind")
	}
	if err := b.UnbindClaim(c.UID); err != nil {
		t.Errorf("second unbind: %v", err)
	}
}

func TestBindClaimRefused(t *testing.T) {
	grant := func(uuid string, mib int64, cores int) []api.DeviceGrant {
		return []api.DeviceGrant{{UUID: uuid, MemoryMiB: mib, Cores: cores}}
	}
	for _, tc := range []struct {
		name    string
		devices []api.DeviceGrant
		want    string
	}{
		{"no device", nil, "no device of this driver"},
		{"unknown GPU", grant("GPU-9", 4096, 10), "not a schedulable GPU"},
		{"MIG-mode parent", grant("GPU-2", 4096, 10), "not a schedulable GPU"},
		{"below a context", grant("GPU-0", 100, 10), "at least 576 MiB"},
		{"above the GPU", grant("GPU-0", 90000, 10), "which has 81920 MiB"},
		{"MIG above the instance", grant("MIG-1", 20000, 10), "which has 10240 MiB"},
		{"no cores", grant("GPU-0", 4096, 0), "cores must be 1..100"},
		{"too many cores", grant("GPU-0", 4096, 101), "cores must be 1..100"},
		{"twice", append(grant("GPU-0", 4096, 10), grant("GPU-0", 4096, 10)...), "twice"},
		{"no room beside the bound claim", grant("GPU-0", 81920-8192+1, 10), "does not fit"},
		{"no cores beside the bound claim", grant("GPU-0", 4096, 71), "does not fit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newClaimBinder(t, t.TempDir())
			if _, err := b.BindClaim(Claim{UID: "held", Namespace: "team", Name: "held", Devices: grant("GPU-0", 8192, 30)}); err != nil {
				t.Fatal(err)
			}
			_, err := b.BindClaim(Claim{UID: "new", Namespace: "team", Name: "c", Devices: tc.devices})
			var refused *RefusedError
			if !errors.As(err, &refused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a refusal with %q", err, tc.want)
			}
			if _, ok := b.cfg.ClaimStore.Get("new"); ok {
				t.Error("a refused claim was recorded")
			}
		})
	}
}

// A container whose assignment would overfill a GPU beside a prepared claim is refused:
// the two paths count each other.
func TestContainerRefusedBesideClaim(t *testing.T) {
	b, ps := newClaimBinder(t, t.TempDir())
	if _, err := b.BindClaim(Claim{UID: "held", Namespace: "team", Name: "held", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 80000, Cores: 50}}}); err != nil {
		t.Fatal(err)
	}
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 4096, Cores: 10}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 4096, 10)))
	_, err := b.Bind(req("c1", "main", ann))
	var refused *RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("got %v, want a refusal", err)
	}
}

// A claim's workConserving reaches its limits file on a time-sliced GPU, and is refused
// on an MPS GPU with what to change.
func TestBindClaimWorkConserving(t *testing.T) {
	b, _, _ := mpsBinder(t, 48)
	cs, err := checkpoint.Open(filepath.Join(t.TempDir(), "claims.json"))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg.ClaimStore = cs
	c := Claim{UID: "wc", Namespace: "team", Name: "wc", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096, Cores: 30}}, WorkConserving: true}
	e, err := b.BindClaim(c)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := api.DecodeLimits(e.Limits); err != nil || !l.WorkConserving {
		t.Errorf("limits %+v %v, want work-conserving", l, err)
	}
	// Without it, the same share is paced to its cores alone.
	c2 := Claim{UID: "plain", Namespace: "team", Name: "plain", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096, Cores: 30}}}
	if e, err := b.BindClaim(c2); err != nil {
		t.Fatal(err)
	} else if l, _ := api.DecodeLimits(e.Limits); l.WorkConserving {
		t.Error("a claim without workConserving got it")
	}
	_, err = b.BindClaim(Claim{UID: "mps", Namespace: "team", Name: "mps", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 4096, Cores: 30}}, WorkConserving: true})
	refusedWith(t, err, `GPU served by MPS, which divides the SMs and paces nothing: leave workConserving out, or select time-sliced devices (device.attributes["gpu.tessera.dev"].sharing == "time-sliced")`)
	if _, ok := b.cfg.ClaimStore.Get("mps"); ok {
		t.Error("the refused claim was recorded")
	}
}

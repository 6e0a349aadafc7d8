// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
)

// FuzzPrepare: whatever claim kubelet hands over, preparing it never panics; a claim
// prepared holds, per device, what its result consumed, within the device's memory
// and 1..100 % cores; unpreparing it leaves no limits directory, CDI spec or record.
func FuzzPrepare(f *testing.F) {
	q := func(m, c string) map[resourceapi.QualifiedName]string {
		return map[resourceapi.QualifiedName]string{CapacityMemory: m, CapacityCores: c}
	}
	for _, c := range []*resourceapi.ResourceClaim{
		claim("u1", result("gpu", "gpu-n-0", q("8Gi", "30"))),
		claim("u2", result("a", "gpu-n-0", nil), result("b", "gpu-n-1", q("576Mi", "1"))),
		claim("u3", result("gpu", "gpu-n-2", nil)),
		claim("u4", result("gpu", "gpu-n-1", q("1000000000", "500m"))),
		func() *resourceapi.ResourceClaim {
			c := claim("u5", result("gpu", "gpu-n-0", q("8Gi", "30")))
			c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{
				gpuConfig(resourceapi.AllocationConfigSourceClass, wcOff), gpuConfig(resourceapi.AllocationConfigSourceClaim, wcOn, "gpu")}
			return c
		}(),
	} {
		data, err := json.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	dir := f.TempDir()
	d, inv := newDriver(f, dir)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte) {
		var c resourceapi.ResourceClaim
		if json.Unmarshal(data, &c) != nil {
			return
		}
		res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{&c})
		if err != nil {
			t.Fatal(err)
		}
		r, ok := res[c.UID]
		if !ok {
			t.Fatal("no result for the claim")
		}
		limitsDir := api.HostLimitsDir(filepath.Join(dir, "limits"), binding.ClaimCgroup(string(c.UID)))
		if r.Err == nil && len(r.Devices) > 0 {
			data, err := os.ReadFile(filepath.Join(limitsDir, api.LimitsFileName))
			if err != nil {
				t.Fatal(err)
			}
			l, err := api.DecodeLimits(data)
			if err != nil {
				t.Fatal(err)
			}
			if len(l.GPUs) != len(r.Devices) {
				t.Fatalf("%d devices prepared, %d in the limits file", len(r.Devices), len(l.GPUs))
			}
			// The claim's configuration, as it reads, is what the limits file says.
			var ours []resourceapi.DeviceRequestAllocationResult
			for _, res := range c.Status.Allocation.Devices.Results {
				if res.Driver == DriverName {
					ours = append(ours, res)
				}
			}
			if cfg, err := ClaimConfig(&c, ours); err != nil || cfg.IsWorkConserving() != l.WorkConserving {
				t.Fatalf("prepared with work-conserving %v; the claim's configuration reads %+v, %v", l.WorkConserving, cfg, err)
			}
			for _, g := range l.GPUs {
				total, ok := inv.SchedulableMemoryMiB(g.UUID)
				if !ok || g.MemoryMiB > total || g.MemoryMiB < api.DefaultContextMiB || g.Cores < 1 || g.Cores > 100 {
					t.Fatalf("granted %+v", g)
				}
			}
		}
		un, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}})
		if err != nil || un[c.UID] != nil {
			t.Fatalf("unprepare: %v %v", err, un[c.UID])
		}
		if _, err := os.Stat(limitsDir); !os.IsNotExist(err) && c.UID != "" {
			t.Fatalf("limits directory left: %v", err)
		}
		if n := len(d.cfg.Binder.Claims()); n != 0 {
			t.Fatalf("%d claims still bound", n)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, "cdi", "*")); len(left) != 0 {
			t.Fatalf("CDI specs left: %v", left)
		}
	})
}

// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/go-logr/logr"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/binding/bindingtest"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/gpu"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// newDriver is a driver of node "n" (three 80 GiB GPUs, the third in MIG mode) whose binder and checkpoints live in dir; opening it again on the same
// dir is an agent restart.
func newDriver(t testing.TB, dir string) (*Driver, *api.NodeInventory) {
	t.Helper()
	inv := fixtures.PCIeNode("n", 3, "NVIDIA H100 80GB HBM3", 81920)
	inv.GPUs[2].MIG = &api.MIG{Instances: []api.MIGInstance{{UUID: "MIG-n-2a", Profile: "3g.40gb", MemoryMiB: 40192}}}
	devs := []gpu.Device{{UUID: inv.GPUs[0].UUID, Index: 0, Minor: 0}, {UUID: inv.GPUs[1].UUID, Index: 1, Minor: 1}}
	store, err := checkpoint.Open(filepath.Join(dir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	claims, err := checkpoint.Open(filepath.Join(dir, "claims.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := binding.New(binding.Config{
		NodeName: "n", Names: api.DefaultResourceNames(), Store: store, ClaimStore: claims,
		Devices: func() ([]gpu.Device, error) { return devs, nil }, LimitsRoot: filepath.Join(dir, "limits"),
		StatDevice: func(p string) (binding.DeviceNode, error) {
			return binding.DeviceNode{Path: p, Type: "c", Major: 195, Minor: 0, FileMode: 0o666}, nil
		},
		Pods: (&bindingtest.Pods{}).Get, SchedulerNames: []string{bindingtest.Scheduler},
		Inventory: func() (*api.NodeInventory, error) { return inv, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{NodeName: "n", Client: fake.NewClientset(), Binder: b, ClaimSpecDir: filepath.Join(dir, "cdi"),
		Inventory: func() (*api.NodeInventory, error) { return inv, nil }, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	return d, inv
}

// result is one allocation result of this driver on node n's pool.
func result(request, device string, capacity map[resourceapi.QualifiedName]string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: DriverName, Pool: "n", Device: device,
		ShareID: ptr.To(types.UID("share-" + request))}
	if capacity != nil {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
		for k, v := range capacity {
			r.ConsumedCapacity[k] = resource.MustParse(v)
		}
	}
	return r
}

func claim(uid string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "c-" + uid, UID: types.UID(uid)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}},
	}
}

func readSpec(t *testing.T, dir, uid string) *specs.Spec {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "cdi", "tessera.dev-claim_"+uid+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func TestPrepareUnprepare(t *testing.T) {
	dir := t.TempDir()
	d, _ := newDriver(t, dir)
	ctx := context.Background()
	c := claim("uid-1",
		result("gpu", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityMemory: "8Gi", CapacityCores: "30"}),
		result("whole", "gpu-n-1", nil)) // no consumed capacity: the whole GPU
	res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	r := res[c.UID]
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if len(r.Devices) != 2 {
		t.Fatalf("devices %+v", r.Devices)
	}
	for i, want := range []kubeletplugin.Device{
		{Requests: []string{"gpu"}, PoolName: "n", DeviceName: "gpu-n-0", ShareID: ptr.To(types.UID("share-gpu")), CDIDeviceIDs: []string{"tessera.dev/claim=uid-1"}},
		{Requests: []string{"whole"}, PoolName: "n", DeviceName: "gpu-n-1", ShareID: ptr.To(types.UID("share-whole")), CDIDeviceIDs: []string{"tessera.dev/claim=uid-1"}},
	} {
		got := r.Devices[i]
		if strings.Join(got.Requests, ",") != strings.Join(want.Requests, ",") || got.PoolName != want.PoolName || got.DeviceName != want.DeviceName ||
			*got.ShareID != *want.ShareID || strings.Join(got.CDIDeviceIDs, ",") != strings.Join(want.CDIDeviceIDs, ",") {
			t.Errorf("device %d: %+v, want %+v", i, got, want)
		}
	}
	// One limits file for the claim, with what each result consumed.
	limitsDir := api.HostLimitsDir(filepath.Join(dir, "limits"), binding.ClaimCgroup("uid-1"))
	data, err := os.ReadFile(filepath.Join(limitsDir, api.LimitsFileName))
	if err != nil {
		t.Fatal(err)
	}
	l, err := api.DecodeLimits(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GPUs) != 2 || l.GPUs[0].UUID != "GPU-n-0" || l.GPUs[0].MemoryMiB != 8192 || l.GPUs[0].Cores != 30 ||
		l.GPUs[1].UUID != "GPU-n-1" || l.GPUs[1].MemoryMiB != 81920 || l.GPUs[1].Cores != 100 {
		t.Errorf("limits %+v", l.GPUs)
	}
	// The claim's device: device nodes (no node spec here), the limits directory
	// read-only and the shared region read-write.
	spec := readSpec(t, dir, "uid-1")
	if spec.Kind != DefaultClaimKind || len(spec.Devices) != 1 || spec.Devices[0].Name != "uid-1" {
		t.Fatalf("spec %+v", spec)
	}
	mounts := map[string]string{}
	for _, m := range spec.Devices[0].ContainerEdits.Mounts {
		mounts[m.ContainerPath] = m.HostPath + " " + strings.Join(m.Options, ",")
	}
	if mounts[api.ContainerLimitsDir] != limitsDir+" rbind,nosuid,nodev,ro" ||
		mounts[api.ContainerRegionDir] != filepath.Join(limitsDir, "region")+" rbind,nosuid,nodev,rw" {
		t.Errorf("mounts %v", mounts)
	}
	if len(spec.Devices[0].ContainerEdits.DeviceNodes) == 0 {
		t.Error("no device nodes in the claim's device")
	}

	// Prepared again after a restart: the checkpoint keeps the binding.
	d2, _ := newDriver(t, dir)
	res, err = d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare after restart: %v %v", err, res[c.UID].Err)
	}
	if again, _ := os.ReadFile(filepath.Join(limitsDir, api.LimitsFileName)); string(again) != string(data) {
		t.Errorf("limits after restart %q, before %q", again, data)
	}
	// A second claim that would overfill GPU 0's cores is refused with the reason
	// while the first is allocated in the API.
	if _, err := d2.cfg.Client.ResourceV1().ResourceClaims("team").Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	over := claim("uid-2", result("gpu", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityMemory: "1Gi", CapacityCores: "71"}))
	res, err = d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{over})
	if err != nil || res[over.UID].Err == nil || !strings.Contains(res[over.UID].Err.Error(), "does not fit") {
		t.Errorf("overfull claim: %v %v", err, res[over.UID].Err)
	}

	un, err := d2.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: "team", Name: "c-uid-1"}, UID: "uid-1"}})
	if err != nil || un["uid-1"] != nil {
		t.Fatalf("unprepare: %v %v", err, un["uid-1"])
	}
	if _, err := os.Stat(limitsDir); !os.IsNotExist(err) {
		t.Error("limits directory left behind")
	}
	if _, err := os.Stat(filepath.Join(dir, "cdi", "tessera.dev-claim_uid-1.json")); !os.IsNotExist(err) {
		t.Error("claim spec left behind")
	}
	// Unpreparing again, or a claim never prepared, is no error.
	un, err = d2.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "uid-1"}, {UID: "never"}})
	if err != nil || un["uid-1"] != nil || un["never"] != nil {
		t.Errorf("second unprepare: %v %v", err, un)
	}
	// Now the 71 % claim fits.
	res, _ = d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{over})
	if res[over.UID].Err != nil {
		t.Errorf("claim after unprepare: %v", res[over.UID].Err)
	}
}

// A claim the API no longer allocates (deallocated once its pod went, or deleted)
// while kubelet has not unprepared it yet does not keep a new claim of its share out:
// Prepare releases it and binds the new one. A claim still allocated, or one the API
// cannot be asked about, keeps its room.
func TestPrepareReleasesStaleClaims(t *testing.T) {
	dir := t.TempDir()
	d, _ := newDriver(t, dir)
	ctx := context.Background()
	client := d.cfg.Client.ResourceV1().ResourceClaims("team")
	share := func(uid, cores string) *resourceapi.ResourceClaim {
		return claim(uid, result("gpu", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityMemory: "1Gi", CapacityCores: cores}))
	}
	prepare := func(c *resourceapi.ResourceClaim) error {
		t.Helper()
		res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if err != nil {
			t.Fatal(err)
		}
		return res[c.UID].Err
	}
	old := share("old", "60")
	if _, err := client.Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := prepare(old); err != nil {
		t.Fatal(err)
	}
	// Still allocated: the new claim is refused.
	if err := prepare(share("new", "60")); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("beside an allocated claim: %v", err)
	}
	// Deallocated in the API (its pod is gone), not yet unprepared: released.
	gone := old.DeepCopy()
	gone.Status.Allocation = nil
	if _, err := client.UpdateStatus(ctx, gone, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := prepare(share("new", "60")); err != nil {
		t.Fatalf("beside a deallocated claim: %v", err)
	}
	if _, err := os.Stat(api.HostLimitsDir(filepath.Join(dir, "limits"), binding.ClaimCgroup("old"))); !os.IsNotExist(err) {
		t.Error("the released claim's limits directory is left")
	}
	if _, err := os.Stat(filepath.Join(dir, "cdi", "tessera.dev-claim_old.json")); !os.IsNotExist(err) {
		t.Error("the released claim's CDI spec is left")
	}
	// Kubelet's Unprepare of the released claim comes later and finds nothing.
	un, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: "team", Name: "c-old"}, UID: "old"}})
	if err != nil || un["old"] != nil {
		t.Errorf("unprepare of the released claim: %v %v", err, un)
	}
	// "new" is not in the API at all and the API cannot be asked: it is kept.
	d.cfg.Client.(*fake.Clientset).PrependReactor("get", "resourceclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("the API server is not reachable")
	})
	if err := prepare(share("third", "60")); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("beside a claim the API cannot be asked about: %v", err)
	}
}

func TestPrepareBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"unallocated", &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "x", UID: "u"}}, "not allocated"},
		{"another node's pool", func() *resourceapi.ResourceClaim {
			r := result("gpu", "gpu-n-0", nil)
			r.Pool = "other"
			return claim("u", r)
		}(), `not of this node's pool "n"`},
		{"unknown device", claim("u", result("gpu", "gpu-n-7", nil)), "does not publish"},
		{"MIG-mode GPU as a whole", claim("u", result("gpu", "gpu-n-2", nil)), "does not publish"},
		{"memory not in MiB", claim("u", result("gpu", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityMemory: "1000000000"})), "not a whole number of MiB"},
		{"memory below a context", claim("u", result("gpu", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityMemory: "100Mi"})), "at least 576 MiB"},
		{"memory above the GPU", claim("u", result("gpu", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityMemory: "100Gi"})), "which has 81920 MiB"},
		{"cores zero", claim("u", result("gpu", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityCores: "0"})), "1..100"},
		{"cores fractional", claim("u", result("gpu", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityCores: "500m"})), "1..100"},
		{"unknown capacity", claim("u", result("gpu", "gpu-n-0", map[resourceapi.QualifiedName]string{"bandwidth": "1"})), "does not have"},
		{"same GPU twice", claim("u", result("a", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityMemory: "1Gi"}),
			result("b", "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityMemory: "1Gi"})), "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			d, _ := newDriver(t, dir)
			res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{tc.claim, nil})
			if err != nil {
				t.Fatal(err)
			}
			if e := res[tc.claim.UID].Err; e == nil || !strings.Contains(e.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", e, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "cdi", "tessera.dev-claim_u.json")); !os.IsNotExist(err) {
				t.Error("a spec was written for a refused claim")
			}
		})
	}
}

// A claim with no result of this driver is prepared with no device.
func TestPrepareOtherDriver(t *testing.T) {
	d, _ := newDriver(t, t.TempDir())
	r := result("nic", "eth0", nil)
	r.Driver = "net.example.com"
	c := claim("u", r)
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil || len(res[c.UID].Devices) != 0 {
		t.Errorf("got %+v %v", res, err)
	}
}

// A recoverable background error is only logged; any other stops the agent through
// Fatal, once.
func TestHandleError(t *testing.T) {
	d, _ := newDriver(t, t.TempDir())
	ctx := context.Background()
	d.HandleError(ctx, fmt.Errorf("slice refused: %w", kubeletplugin.ErrRecoverable), "publishing")
	select {
	case err := <-d.Fatal():
		t.Fatalf("recoverable error sent as fatal: %v", err)
	default:
	}
	d.HandleError(ctx, errors.New("listener closed"), "DRA gRPC server failed")
	d.HandleError(ctx, errors.New("again"), "registrar gRPC server failed")
	select {
	case err := <-d.Fatal():
		if !strings.Contains(err.Error(), "DRA gRPC server failed: listener closed") {
			t.Errorf("fatal %v", err)
		}
	default:
		t.Fatal("no fatal error")
	}
	if ok, why := d.Registered(); ok || why != "not started" {
		t.Errorf("registered before start: %v %q", ok, why)
	}
}

// gpuConfig is an allocation's configuration entry of this driver.
func gpuConfig(source resourceapi.AllocationConfigSource, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}
}

const (
	wcOn  = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true}`
	wcOff = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":false}`
)

// A claim's Tessera configuration reaches its limits file: the claim's entries over its
// class's, for the requests they name; other drivers' entries are theirs.
func TestPrepareClaimConfig(t *testing.T) {
	other := resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "net.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{"mtu":9000}`)}}}}
	share := func(request string) resourceapi.DeviceRequestAllocationResult {
		return result(request, "gpu-n-0", map[resourceapi.QualifiedName]string{CapacityMemory: "8Gi", CapacityCores: "30"})
	}
	for _, tc := range []struct {
		name   string
		config []resourceapi.DeviceAllocationConfiguration
		wc     bool
		err    string
	}{
		{"none", []resourceapi.DeviceAllocationConfiguration{other}, false, ""},
		{"the claim's", []resourceapi.DeviceAllocationConfiguration{other, gpuConfig(resourceapi.AllocationConfigSourceClaim, wcOn)}, true, ""},
		{"the class's", []resourceapi.DeviceAllocationConfiguration{gpuConfig(resourceapi.AllocationConfigSourceClass, wcOn)}, true, ""},
		// Listed after the claim's in the allocation, the class's still comes first.
		{"the claim's over the class's", []resourceapi.DeviceAllocationConfiguration{
			gpuConfig(resourceapi.AllocationConfigSourceClaim, wcOff), gpuConfig(resourceapi.AllocationConfigSourceClass, wcOn)}, false, ""},
		{"an entry that sets nothing keeps the one before", []resourceapi.DeviceAllocationConfiguration{
			gpuConfig(resourceapi.AllocationConfigSourceClaim, wcOn), gpuConfig(resourceapi.AllocationConfigSourceClaim, `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig"}`)}, true, ""},
		{"for the claim's request", []resourceapi.DeviceAllocationConfiguration{gpuConfig(resourceapi.AllocationConfigSourceClaim, wcOn, "gpu")}, true, ""},
		{"for another request", []resourceapi.DeviceAllocationConfiguration{gpuConfig(resourceapi.AllocationConfigSourceClaim, wcOn, "nic")}, false, ""},
		{"a typo", []resourceapi.DeviceAllocationConfiguration{gpuConfig(resourceapi.AllocationConfigSourceClaim,
			`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConservng":true}`)}, false, `configuration from the claim: gpu.tessera.dev parameters: unknown field "workConservng"`},
		{"a bad class entry", []resourceapi.DeviceAllocationConfiguration{gpuConfig(resourceapi.AllocationConfigSourceClass, `{"kind":"GPUConfig"}`, "gpu")},
			false, `configuration from its DeviceClass for requests gpu: gpu.tessera.dev parameters are apiVersion ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			d, _ := newDriver(t, dir)
			c := claim("u", share("gpu"))
			c.Status.Allocation.Devices.Config = tc.config
			res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
			if err != nil {
				t.Fatal(err)
			}
			if tc.err != "" {
				if e := res[c.UID].Err; e == nil || !strings.Contains(e.Error(), tc.err) {
					t.Fatalf("got %v, want an error with %q", e, tc.err)
				}
				if _, err := os.Stat(filepath.Join(dir, "cdi", "tessera.dev-claim_u.json")); !os.IsNotExist(err) {
					t.Error("a spec was written for a refused claim")
				}
				return
			}
			if res[c.UID].Err != nil {
				t.Fatal(res[c.UID].Err)
			}
			data, err := os.ReadFile(filepath.Join(api.HostLimitsDir(filepath.Join(dir, "limits"), binding.ClaimCgroup("u")), api.LimitsFileName))
			if err != nil {
				t.Fatal(err)
			}
			l, err := api.DecodeLimits(data)
			if err != nil {
				t.Fatal(err)
			}
			if l.WorkConserving != tc.wc {
				t.Errorf("work-conserving %v, want %v; limits:\n%s", l.WorkConserving, tc.wc, data)
			}
		})
	}
}

// A claim's devices share one limits file: requests configured apart are refused, and
// a prioritized list's choice ("gpu/big") takes its main request's configuration.
func TestClaimConfigPerRequest(t *testing.T) {
	c := claim("u")
	c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{gpuConfig(resourceapi.AllocationConfigSourceClaim, wcOn, "gpu")}
	a, b := result("gpu/big", "gpu-n-0", nil), result("other", "gpu-n-1", nil)
	cfg, err := ClaimConfig(c, []resourceapi.DeviceRequestAllocationResult{a})
	if err != nil || !cfg.IsWorkConserving() {
		t.Errorf("subrequest: %+v %v", cfg, err)
	}
	if _, err := ClaimConfig(c, []resourceapi.DeviceRequestAllocationResult{a, b}); err == nil ||
		!strings.Contains(err.Error(), `request "gpu/big" is configured workConserving: true and request "other" workConserving: false`) {
		t.Errorf("requests configured apart: %v", err)
	}
	c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, gpuConfig(resourceapi.AllocationConfigSourceClaim, wcOn, "other"))
	if cfg, err := ClaimConfig(c, []resourceapi.DeviceRequestAllocationResult{a, b}); err != nil || !cfg.IsWorkConserving() {
		t.Errorf("requests configured alike: %+v %v", cfg, err)
	}
}

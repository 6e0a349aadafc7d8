// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// fakeProc writes a host /proc as the NVIDIA driver lays it out with GPU 1 (minor 1)
// in MIG mode: GPU instances 3 and 5 with compute instance 0 each, plus the global
// mig/config and mig/monitor capabilities, which must never be bound.
func fakeProc(t *testing.T, dir string) string {
	t.Helper()
	root := filepath.Join(dir, "proc")
	files := map[string]string{
		"devices": "Character devices:\n  1 mem\n195 nvidia\n236 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  8 sd\n259 blkext\n",
		"driver/nvidia/capabilities/mig/config/access":           "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
		"driver/nvidia/capabilities/mig/monitor/access":          "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
		"driver/nvidia/capabilities/gpu1/mig/gi3/access":         "DeviceFileMinor: 138\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
		"driver/nvidia/capabilities/gpu1/mig/gi3/ci0/access":     "DeviceFileMinor: 139\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
		"driver/nvidia/capabilities/gpu1/mig/gi5/access":         "DeviceFileMinor: 156\nDeviceFileModify: 1\n",
		"driver/nvidia/capabilities/gpu1/mig/gi5/ci0/access":     "DeviceFileMinor: 157\nDeviceFileMode: 292\n",
		"driver/nvidia/capabilities/gpu1/mig/gi7/access":         "DeviceFileMode: 292\n",
		"driver/nvidia/capabilities/gpu1/mig/gi8/access":         "DeviceFileMinor: 174\n",
		"driver/nvidia/capabilities/gpu1/mig/gi8/ci0/access":     "DeviceFileMinor: x\n",
		"driver/nvidia/capabilities/gpu1/mig/gi9/access":         "DeviceFileMinor: 183\n",
		"driver/nvidia/capabilities/gpu1/mig/gi9/ci0/access.tmp": "",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

var migGPUs = []gpu.Device{
	{UUID: "GPU-0", Index: 0, Minor: 0},
	{UUID: "GPU-1", Index: 1, Minor: 1},
	{UUID: "MIG-3", Index: 1, Minor: 1, ParentUUID: "GPU-1", MIG: &gpu.MIGIDs{GPUInstance: 3, ComputeInstance: 0}},
	{UUID: "MIG-5", Index: 1, Minor: 1, ParentUUID: "GPU-1", MIG: &gpu.MIGIDs{GPUInstance: 5, ComputeInstance: 0}},
	{UUID: "MIG-7", Index: 1, Minor: 1, ParentUUID: "GPU-1", MIG: &gpu.MIGIDs{GPUInstance: 7, ComputeInstance: 0}},
	{UUID: "MIG-8", Index: 1, Minor: 1, ParentUUID: "GPU-1", MIG: &gpu.MIGIDs{GPUInstance: 8, ComputeInstance: 0}},
	{UUID: "MIG-9", Index: 1, Minor: 1, ParentUUID: "GPU-1", MIG: &gpu.MIGIDs{GPUInstance: 9, ComputeInstance: 0}},
	{UUID: "MIG-gone", Index: 1, Minor: 1, ParentUUID: "GPU-1", MIG: &gpu.MIGIDs{GPUInstance: 11, ComputeInstance: 0}},
}

// migInventory publishes GPU-1 in MIG mode with every instance of migGPUs.
var migInventory = func() *api.NodeInventory {
	inv := &api.NodeInventory{Version: api.InventoryVersion, GPUs: []api.GPU{
		{Index: 0, UUID: "GPU-0", MemoryMiB: 81920, Healthy: true},
		{Index: 1, UUID: "GPU-1", MemoryMiB: 81920, Healthy: true, MIG: &api.MIG{}},
	}}
	for _, d := range migGPUs {
		if d.ParentUUID != "" {
			inv.GPUs[1].MIG.Instances = append(inv.GPUs[1].MIG.Instances, api.MIGInstance{UUID: d.UUID, Profile: "1g.10gb", MemoryMiB: 10240})
		}
	}
	return inv
}()

type migBinder struct {
	*Binder
	pods *pods
}

func newMIGBinder(t *testing.T, dir, procRoot string, stat func(string) (DeviceNode, error)) migBinder {
	t.Helper()
	store, err := checkpoint.Open(filepath.Join(dir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	ps := &pods{byUID: map[string]*corev1.Pod{}}
	b, err := New(Config{
		NodeName: "node-1", Names: api.DefaultResourceNames(), Store: store,
		Devices:    func() ([]gpu.Device, error) { return migGPUs, nil },
		LimitsRoot: filepath.Join(dir, "limits"), StatDevice: stat, ProcRoot: procRoot,
		Pods: ps.get, SchedulerNames: []string{"tessera-binpack"},
		Inventory: func() (*api.NodeInventory, error) { return migInventory, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return migBinder{b, ps}
}

// request is container main of pod team/train asking for one 4096 MiB share per
// instance, and granted these instances; the pod is put where the binder reads pods.
func (b migBinder) request(t *testing.T, id string, uuids ...string) Request {
	var grants []api.DeviceGrant
	for _, u := range uuids {
		grants = append(grants, api.DeviceGrant{UUID: u, Index: 1, MemoryMiB: 4096})
	}
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: grants})
	b.pods.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(int64(len(uuids)), 4096, 0)))
	return req(id, "main", ann)
}

func nodeList(e *Edits) string {
	var out []string
	for _, d := range e.Devices {
		out = append(out, fmt.Sprintf("%s=%s%d:%d/%o", d.Path, d.Type, d.Major, d.Minor, d.FileMode))
	}
	return strings.Join(out, ",")
}

func TestBindMIGInstance(t *testing.T) {
	dir := t.TempDir()
	b := newMIGBinder(t, dir, fakeProc(t, dir), fakeDev)
	e, err := b.Bind(b.request(t, "m1", "MIG-3"))
	if err != nil {
		t.Fatal(err)
	}
	// The parent's node, the control nodes and the instance's two capability nodes;
	// not GPU 0, not the other instances' capabilities, not mig/config or mig/monitor.
	want := "/dev/nvidia1=c195:1/666,/dev/nvidiactl=c195:255/666,/dev/nvidia-uvm=c510:0/666," +
		"/dev/nvidia-caps/nvidia-cap138=c236:138/444,/dev/nvidia-caps/nvidia-cap139=c236:139/444"
	if got := nodeList(e); got != want {
		t.Errorf("devices\n got %s\nwant %s", got, want)
	}
	if len(e.Env) != 1 || e.Env[0] != [2]string{EnvVisibleDevices, "MIG-3"} {
		t.Errorf("env %v", e.Env)
	}
	rec, _ := b.cfg.Store.Get("m1")
	data, err := os.ReadFile(filepath.Join(rec.LimitsDir, api.LimitsFileName))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := api.DecodeLimits(data); err != nil || len(l.GPUs) != 1 || l.GPUs[0].UUID != "MIG-3" || l.GPUs[0].MemoryMiB != 4096 {
		t.Errorf("limits %+v %v", l, err)
	}

	// Two instances of one GPU: the parent's node once, both instances' capabilities
	// (a mode missing from the access file is the driver's default 0444).
	e, err = b.Bind(b.request(t, "m2", "MIG-5", "MIG-3"))
	if err != nil {
		t.Fatal(err)
	}
	want = "/dev/nvidia1=c195:1/666,/dev/nvidiactl=c195:255/666,/dev/nvidia-uvm=c510:0/666," +
		"/dev/nvidia-caps/nvidia-cap156=c236:156/444,/dev/nvidia-caps/nvidia-cap157=c236:157/444," +
		"/dev/nvidia-caps/nvidia-cap138=c236:138/444,/dev/nvidia-caps/nvidia-cap139=c236:139/444"
	if got := nodeList(e); got != want {
		t.Errorf("devices\n got %s\nwant %s", got, want)
	}
	if e.Env[0][1] != "MIG-5,MIG-3" {
		t.Errorf("env %v", e.Env)
	}
}

// Wherever the capability nodes cannot be resolved the container is refused: it never
// gets the whole parent GPU instead.
func TestBindMIGRefused(t *testing.T) {
	dir := t.TempDir()
	proc := fakeProc(t, dir)
	noCaps := filepath.Join(dir, "proc-nocaps")
	if err := os.MkdirAll(noCaps, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(noCaps, "devices"), []byte("Character devices:\n195 nvidia\n\nBlock devices:\n236 nvidia-caps\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	// A host node that disagrees with the proc tree.
	otherNode := func(path string) (DeviceNode, error) {
		if filepath.Base(path) == "nvidia-cap138" {
			return DeviceNode{Type: "c", Major: 236, Minor: 99}, nil
		}
		return fakeDev(path)
	}
	for name, tc := range map[string]struct {
		proc string
		stat func(string) (DeviceNode, error)
		uuid string
		want string
	}{
		"instance gone":         {proc, fakeDev, "MIG-gone", "gpu1/mig/gi11/access does not exist"},
		"no proc tree":          {filepath.Join(dir, "nothing"), fakeDev, "MIG-3", "devices: no such file"},
		"no nvidia-caps device": {noCaps, fakeDev, "MIG-3", `lists no "nvidia-caps" character device`},
		"no DeviceFileMinor":    {proc, fakeDev, "MIG-7", "gi7/access has no DeviceFileMinor line"},
		"bad compute minor":     {proc, fakeDev, "MIG-8", `DeviceFileMinor "x" is not a device minor`},
		"compute instance gone": {proc, fakeDev, "MIG-9", "gi9/ci0/access does not exist"},
		"host node disagrees":   {proc, otherNode, "MIG-3", "nvidia-cap138 is c 236:99"},
		"one of two unresolved": {proc, fakeDev, "MIG-3,MIG-gone", "MIG-gone"},
	} {
		t.Run(name, func(t *testing.T) {
			b := newMIGBinder(t, t.TempDir(), tc.proc, tc.stat)
			e, err := b.Bind(b.request(t, "x", strings.Split(tc.uuid, ",")...))
			var re *RefusedError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v %v, want a refusal containing %q", e, err, tc.want)
			}
			if e != nil || len(b.Records()) != 0 {
				t.Errorf("refused container bound or recorded: %v %v", e, b.Records())
			}
		})
	}
}

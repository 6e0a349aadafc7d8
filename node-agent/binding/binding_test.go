// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// fakeDev stands in for stat on /dev: nvidia<N> is char 195:N, nvidiactl 195:255,
// nvidia-uvm 510:0; anything else does not exist.
func fakeDev(path string) (DeviceNode, error) {
	base := filepath.Base(path)
	switch {
	case base == "nvidiactl":
		return DeviceNode{Path: path, Type: "c", Major: 195, Minor: 255, FileMode: 0o666}, nil
	case base == "nvidia-uvm":
		return DeviceNode{Path: path, Type: "c", Major: 510, Minor: 0, FileMode: 0o666}, nil
	case strings.HasPrefix(base, "nvidia"):
		var n int64
		if _, err := fmt.Sscanf(base, "nvidia%d", &n); err == nil {
			return DeviceNode{Path: path, Type: "c", Major: 195, Minor: n, FileMode: 0o666}, nil
		}
	}
	return DeviceNode{}, fmt.Errorf("%s: %w", path, os.ErrNotExist)
}

var gpus = []gpu.Device{{UUID: "GPU-0", Index: 0, Minor: 0}, {UUID: "GPU-1", Index: 1, Minor: 1}, {UUID: "MIG-1", Index: 1, Minor: 1, ParentUUID: "GPU-1"}}

// inventory is what the node publishes for gpus: two 80 GiB GPUs and a 10 GiB MIG
// instance (of a GPU in MIG mode, GPU-2, which is not schedulable as a whole).
var inventory = &api.NodeInventory{Version: api.InventoryVersion, GPUs: []api.GPU{
	{Index: 0, UUID: "GPU-0", MemoryMiB: 81920, Healthy: true},
	{Index: 1, UUID: "GPU-1", MemoryMiB: 81920, Healthy: true},
	{Index: 2, UUID: "GPU-2", MemoryMiB: 81920, Healthy: true, MIG: &api.MIG{Instances: []api.MIGInstance{{UUID: "MIG-1", Profile: "1g.10gb", MemoryMiB: 10240}}}},
}}

// pods is the binder's view of the API server in tests: pods by UID, and an error
// every lookup returns when set.
type pods struct {
	byUID       map[string]*corev1.Pod
	err         error
	freshReads  int
	staleCached map[string]*corev1.Pod // what the cache returns instead, when set
}

func (p *pods) get(ns, name, uid string, fresh bool) (*corev1.Pod, error) {
	if p.err != nil {
		return nil, p.err
	}
	if fresh {
		p.freshReads++
	} else if pod, ok := p.staleCached[uid]; ok {
		return pod, nil
	}
	pod := p.byUID[uid]
	if pod == nil || pod.Namespace != ns || pod.Name != name {
		return nil, nil
	}
	return pod, nil
}

// gpuLimits are a container's limits asking for n GPUs with mib MiB and cores % each
// (0: not set).
func gpuLimits(n, mib, cores int64) corev1.ResourceList {
	rl := corev1.ResourceList{"tessera.dev/gpu": *resource.NewQuantity(n, resource.DecimalSI)}
	if mib > 0 {
		rl["tessera.dev/gpu-memory"] = *resource.NewQuantity(mib, resource.DecimalSI)
	}
	if cores > 0 {
		rl["tessera.dev/gpu-cores"] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	return rl
}

// pod is pod team/<name> with UID uid, bound to node-1 by tessera-binpack, carrying
// ann, with these containers (name and limits; nil limits: no GPU).
func pod(uid, name string, ann map[string]string, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID(uid), Annotations: ann},
		Spec:       corev1.PodSpec{NodeName: "node-1", SchedulerName: "tessera-binpack", Containers: containers},
	}
}

func ctr(name string, limits corev1.ResourceList) corev1.Container {
	return corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: limits}}
}

func newBinder(t *testing.T, dir string) *Binder {
	t.Helper()
	b, _ := newBinderWithPods(t, dir)
	return b
}

func newBinderWithPods(t *testing.T, dir string) (*Binder, *pods) {
	t.Helper()
	store, err := checkpoint.Open(filepath.Join(dir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	hook := filepath.Join(dir, "libtessera-cuda.so")
	if err := os.WriteFile(hook, []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	ps := &pods{byUID: map[string]*corev1.Pod{}}
	b, err := New(Config{
		NodeName: "node-1", Names: api.DefaultResourceNames(), Store: store,
		Devices:    func() ([]gpu.Device, error) { return gpus, nil },
		LimitsRoot: filepath.Join(dir, "limits"), HookLibrary: hook, PreloadFile: filepath.Join(dir, "ld.so.preload"),
		StatDevice: fakeDev, Pods: ps.get, SchedulerNames: []string{"tessera-binpack", "tessera-spread"},
		Inventory: func() (*api.NodeInventory, error) { return inventory, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return b, ps
}

func assignment(t *testing.T, node string, cs ...api.ContainerAssignment) map[string]string {
	t.Helper()
	s, err := api.EncodeAssignment(&api.PodAssignment{Version: api.AssignmentVersion, Node: node, Containers: cs})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{api.AnnotationAssignment: s, "other": "x"}
}

func req(id, container string, ann map[string]string, env ...string) Request {
	return Request{PodUID: "uid-1", Namespace: "team", Pod: "train", PodAnnotations: ann, Container: container,
		ContainerID: id, CgroupsPath: "kubepods-burstable-poduid_1.slice:cri-containerd:" + id, Env: env}
}

func TestBindAssignedContainer(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	ann := assignment(t, "node-1",
		api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096, Cores: 30}, {UUID: "GPU-0", Index: 0, MemoryMiB: 4096, Cores: 30}}},
		api.ContainerAssignment{Name: "side", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 1024, Cores: 50}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(2, 4096, 30)), ctr("side", gpuLimits(1, 1024, 50)))
	e, err := b.Bind(req("c1", "main", ann, deviceplugin.EnvRequested+"=2"))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, d := range e.Devices {
		paths = append(paths, fmt.Sprintf("%s=%d:%d", d.Path, d.Major, d.Minor))
	}
	if got := strings.Join(paths, ","); got != "/dev/nvidia0=195:0,/dev/nvidia1=195:1,/dev/nvidiactl=195:255,/dev/nvidia-uvm=510:0" {
		t.Errorf("devices %s", got)
	}
	if len(e.Env) != 1 || e.Env[0] != [2]string{EnvVisibleDevices, "GPU-1,GPU-0"} {
		t.Errorf("env %v", e.Env)
	}
	cg := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poduid_1.slice/cri-containerd-c1.scope"
	limitsDir := api.HostLimitsDir(filepath.Join(dir, "limits"), cg)
	want := []Mount{
		{Source: limitsDir, Destination: api.ContainerLimitsDir, ReadOnly: true},
		{Source: "tmpfs", Destination: api.ContainerRegionDir, Type: "tmpfs", Options: []string{"nosuid", "nodev", "noexec", "size=1048576", "nr_inodes=16", "mode=1777"}},
		{Source: filepath.Join(dir, "libtessera-cuda.so"), Destination: filepath.Join(dir, "libtessera-cuda.so"), ReadOnly: true},
		{Source: filepath.Join(dir, "ld.so.preload"), Destination: PreloadPath, ReadOnly: true},
	}
	if fmt.Sprint(e.Mounts) != fmt.Sprint(want) {
		t.Errorf("mounts %v\nwant %v", e.Mounts, want)
	}
	data, err := os.ReadFile(filepath.Join(limitsDir, api.LimitsFileName))
	if err != nil {
		t.Fatal(err)
	}
	l, err := api.DecodeLimits(data)
	if err != nil {
		t.Fatal(err)
	}
	if l.Cgroup != cg || l.RegionDir != api.ContainerRegionDir || len(l.GPUs) != 2 || l.GPUs[0] != (api.GPULimit{UUID: "GPU-1", MemoryMiB: 4096, Cores: 30, Phase: 0}) || l.GPUs[1].UUID != "GPU-0" {
		t.Errorf("limits %+v", l)
	}
	if pre, _ := os.ReadFile(filepath.Join(dir, "ld.so.preload")); string(pre) != filepath.Join(dir, "libtessera-cuda.so")+"\n" {
		t.Errorf("preload %q", pre)
	}

	// The second container on GPU-1 gets the compute window after the first one's.
	if _, err := b.Bind(req("c2", "side", ann)); err != nil {
		t.Fatal(err)
	}
	r2, _ := b.cfg.Store.Get("c2")
	if r2.Phases["GPU-1"] != 30 {
		t.Errorf("phase %d, want 30", r2.Phases["GPU-1"])
	}
	// Binding c1 again (runtime retry, agent restart) keeps its phase and limits dir.
	if _, err := b.Bind(req("c1", "main", ann)); err != nil {
		t.Fatal(err)
	}
	if r1, _ := b.cfg.Store.Get("c1"); r1.Phases["GPU-1"] != 0 || r1.LimitsDir != limitsDir {
		t.Errorf("rebind: %+v", r1)
	}

	// Removal deletes the record and the directory.
	if err := b.Unbind("c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(limitsDir); !os.IsNotExist(err) {
		t.Error("limits dir left behind")
	}
	if _, ok := b.cfg.Store.Get("c1"); ok {
		t.Error("record left behind")
	}
}

func TestUntouchedAndRefused(t *testing.T) {
	b, ps := newBinderWithPods(t, t.TempDir())
	good := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1024}}})
	marker := deviceplugin.EnvRequested + "=1"
	// The pod's spec asks for what the cases' assignments grant; its annotation is
	// whatever each case's request carries (the API server and the runtime agree).
	spec := pod("uid-1", "train", nil, ctr("main", gpuLimits(1, 1024, 0)), ctr("sidecar", nil))
	ps.byUID["uid-1"] = spec
	for name, tc := range map[string]struct {
		r       Request
		refused string // "" : untouched
	}{
		"no annotation, no request":    {req("a", "sidecar", nil), ""},
		"sidecar not in assignment":    {req("b", "sidecar", good), ""},
		"bad annotation, no request":   {req("c", "sidecar", map[string]string{api.AnnotationAssignment: "{"}), ""},
		"requested without assignment": {req("d", "main", nil, marker), "has no tessera.dev/gpu-assignment annotation"},
		"requested, bad annotation":    {req("e", "main", map[string]string{api.AnnotationAssignment: `{"version":7}`}, marker), "version 7 is not supported"},
		"requested, not in assignment": {req("f", "sidecar", good, marker), "has no entry for it"},
		"assignment for another node":  {req("g", "main", assignment(t, "node-2", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1}}})), `is for node "node-2"`},
		"GPU not on node":              {req("h", "main", assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-9", MemoryMiB: 1024}}})), "GPU-9, which is not a schedulable GPU or MIG instance of this node"},
		"MIG instance without IDs":     {req("i", "main", assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "MIG-1", Index: 1, MemoryMiB: 1024}}})), "MIG instance MIG-1: its GPU and compute instance IDs could not be read"},
		"bad cgroups path":             {Request{PodAnnotations: good, Container: "main", ContainerID: "j", CgroupsPath: "nonsense"}, "cgroups path"},
		"no cgroups path":              {Request{PodAnnotations: good, Container: "main", ContainerID: "k"}, "no cgroups path"},
	} {
		t.Run(name, func(t *testing.T) {
			spec.Annotations = tc.r.PodAnnotations
			e, err := b.Bind(tc.r)
			if tc.refused == "" {
				if err != nil || e != nil {
					t.Fatalf("want untouched, got %v %v", e, err)
				}
				return
			}
			var re *RefusedError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("error %v, want refusal containing %q", err, tc.refused)
			}
			if _, ok := b.cfg.Store.Get(tc.r.ContainerID); ok {
				t.Error("a refused container was recorded")
			}
		})
	}
	// The pod spec also marks a container as requesting, without the marker.
	spec.Annotations = nil
	if _, err := b.Bind(req("z", "main", nil)); err == nil {
		t.Error("a container whose spec asks for GPUs ran without an assignment")
	}
	// Unless the scheduler left the container's GPUs to DRA (a node in DRA mode, a
	// DeviceClass serving tessera.dev/gpu): its claim is bound when prepared. Another
	// container's mapping, or another resource's, does not count.
	for _, m := range []struct {
		c, res string
		free   bool
	}{{"sidecar", "tessera.dev/gpu", false}, {"main", "example.com/fpga", false}, {"main", "tessera.dev/gpu", true}} {
		spec.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "train-extended-resources-x",
			RequestMappings: []corev1.ContainerExtendedResourceRequest{{ContainerName: m.c, ResourceName: m.res, RequestName: "container-0-request-0"}}}
		e, err := b.Bind(req("y", "main", nil))
		if m.free && (err != nil || e != nil) {
			t.Errorf("GPUs of container main left to DRA: %v %v, want untouched", e, err)
		}
		if !m.free && err == nil {
			t.Errorf("mapping of %s's %s: the container ran without an assignment", m.c, m.res)
		}
	}
	spec.Status.ExtendedResourceClaimStatus = nil
}

// After an agent restart with a lost checkpoint, Reconcile rebinds the running
// containers and forgets the ones that are gone.
func TestReconcileAfterRestart(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1024, Cores: 20}}})
	ps.byUID["uid-1"] = pod("uid-1", "train", ann, ctr("main", gpuLimits(1, 1024, 20)))
	if _, err := b.Bind(req("gone", "main", ann)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Bind(req("live", "main", ann)); err != nil {
		t.Fatal(err)
	}
	// Restart: a new binder over the same checkpoint file.
	b2, ps2 := newBinderWithPods(t, dir)
	ps2.byUID = ps.byUID
	if len(b2.Records()) != 2 {
		t.Fatalf("records after restart: %d", len(b2.Records()))
	}
	if errs := b2.Reconcile([]Request{req("live", "main", ann), req("plain", "app", nil)}); len(errs) != 0 {
		t.Fatal(errs)
	}
	recs := b2.Records()
	if len(recs) != 1 || recs[0].ContainerID != "live" || recs[0].Phases["GPU-0"] != 20 {
		t.Fatalf("records %+v", recs)
	}
	// Checkpoint lost entirely: reconcile rebinds from the pod annotations.
	os.Remove(filepath.Join(dir, "checkpoint.json"))
	b3, ps3 := newBinderWithPods(t, dir)
	ps3.byUID = ps.byUID
	if errs := b3.Reconcile([]Request{req("live", "main", ann)}); len(errs) != 0 {
		t.Fatal(errs)
	}
	if len(b3.Records()) != 1 {
		t.Fatalf("not rebuilt: %+v", b3.Records())
	}
}

func TestResolveCgroup(t *testing.T) {
	for in, want := range map[string]string{
		"kubepods-besteffort-pod12_3.slice:cri-containerd:abc": "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_3.slice/cri-containerd-abc.scope",
		"kubepods.slice:crio:abc":                              "/kubepods.slice/crio-abc.scope",
		"system.slice::abc.slice":                              "/system.slice/abc.slice",
		"/kubepods/besteffort/pod1/abc":                        "/kubepods/besteffort/pod1/abc",
		"/kubepods//x/":                                        "/kubepods/x",
	} {
		got, err := ResolveCgroup(in)
		if err != nil || got != want {
			t.Errorf("ResolveCgroup(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a:b", "notaslice:x:y", "-a.slice:x:y", "a--b.slice:x:y", "/a/../b", "/a b", "a.slice:x:"} {
		if got, err := ResolveCgroup(bad); err == nil {
			t.Errorf("ResolveCgroup(%q) = %q, want error", bad, got)
		}
	}
}

// A container whose pod has finished, or is gone from the pod cache, no longer
// computes: its window is free for phase placement before the runtime removes it (a
// pod just bound may be missing from the cache for a moment, and an unsynchronised
// cache knows nothing).
func TestPhaseFreesFinishedWindows(t *testing.T) {
	b, ps := newBinderWithPods(t, t.TempDir())
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	b.cfg.Now = func() time.Time { return now }
	synced := true
	cached := map[string]*corev1.Pod{}
	b.cfg.CachedPod = func(uid string) (*corev1.Pod, bool) {
		if !synced {
			return nil, false
		}
		return cached[uid], true
	}
	grant := func(cores int) api.ContainerAssignment {
		return api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 1024, Cores: cores}}}
	}
	bind := func(uid, id string, cores int) int {
		t.Helper()
		ann := assignment(t, "node-1", grant(cores))
		p := pod(uid, "p-"+uid, ann, ctr("main", gpuLimits(1, 1024, int64(cores))))
		ps.byUID[uid] = p
		if _, err := b.Bind(Request{PodUID: uid, Namespace: "team", Pod: p.Name, PodAnnotations: ann, Container: "main",
			ContainerID: id, CgroupsPath: "kubepods-burstable-pod" + uid + ".slice:cri-containerd:" + id}); err != nil {
			t.Fatal(err)
		}
		r, _ := b.cfg.Store.Get(id)
		return r.Phases["GPU-1"]
	}
	old := bind("old", "c-old", 30)
	cached["old"] = ps.byUID["old"]
	if old != 0 {
		t.Fatalf("first window at %d", old)
	}
	for _, tc := range []struct {
		name  string
		setup func()
		phase int
	}{
		{"its pod running", func() {}, 30},
		{"its pod succeeded", func() { p := *ps.byUID["old"]; p.Status.Phase = corev1.PodSucceeded; cached["old"] = &p }, 0},
		{"its pod failed", func() { p := *ps.byUID["old"]; p.Status.Phase = corev1.PodFailed; cached["old"] = &p }, 0},
		{"its pod gone, bound a moment ago", func() { delete(cached, "old"); now = now.Add(time.Second) }, 30},
		{"its pod gone, bound long ago", func() { delete(cached, "old"); now = now.Add(time.Minute) }, 0},
		{"the cache not synchronised", func() { delete(cached, "old"); synced = false }, 30},
	} {
		tc.setup()
		if got := bind("new", "c-new", 70); got != tc.phase {
			t.Errorf("%s: the 70%% window at %d, want %d", tc.name, got, tc.phase)
		}
		if err := b.Unbind("c-new"); err != nil {
			t.Fatal(err)
		}
		cached["old"], synced = ps.byUID["old"], true
	}
}

// The agent's charge model reaches every container's limits file: the charge line with
// the kernel model, none with the class estimator.
func TestBindChargeKernel(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	for i, kernel := range []bool{false, true} {
		b.cfg.ChargeKernel = kernel
		uid, id := fmt.Sprintf("uid-charge%d", i), fmt.Sprintf("charge%d", i)
		ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1024, Cores: 10}}})
		ps.byUID[uid] = pod(uid, "train", ann, ctr("main", gpuLimits(1, 1024, 10)))
		r := req(id, "main", ann, deviceplugin.EnvRequested+"=1")
		r.PodUID = uid
		r.CgroupsPath = "kubepods-burstable-pod" + uid + ".slice:cri-containerd:" + id
		e, err := b.Bind(r)
		if err != nil {
			t.Fatal(err)
		}
		l, err := api.DecodeLimits(e.Limits)
		if err != nil {
			t.Fatal(err)
		}
		if l.ChargeKernel != kernel || strings.Contains(string(e.Limits), "\ncharge kernel\n") != kernel {
			t.Errorf("ChargeKernel %v: limits file %q", kernel, e.Limits)
		}
	}
}

// A pod's work-conserving annotation reaches its containers' limits files; a value
// other than true or false refuses the container with the annotation named.
func TestBindWorkConserving(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	for i, tc := range []struct {
		value string
		want  bool
		err   string
	}{{"", false, ""}, {"false", false, ""}, {"true", true, ""}, {"yes", false, api.AnnotationWorkConserving}} {
		uid, id := fmt.Sprintf("uid-wc%d", i), fmt.Sprintf("wc%d", i)
		ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1024, Cores: 10}}})
		if tc.value != "" {
			ann[api.AnnotationWorkConserving] = tc.value
		}
		ps.byUID[uid] = pod(uid, "train", ann, ctr("main", gpuLimits(1, 1024, 10)))
		r := req(id, "main", ann, deviceplugin.EnvRequested+"=1")
		r.PodUID = uid
		r.CgroupsPath = "kubepods-burstable-pod" + uid + ".slice:cri-containerd:" + id
		e, err := b.Bind(r)
		if tc.err != "" {
			refusedWith(t, err, tc.err)
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.value, err)
		}
		l, err := api.DecodeLimits(e.Limits)
		if err != nil {
			t.Fatal(err)
		}
		if l.WorkConserving != tc.want {
			t.Errorf("annotation %q: limits work-conserving %v, want %v", tc.value, l.WorkConserving, tc.want)
		}
	}
}

// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/cdi"
	"github.com/tessera-dev/tessera/node-agent/cdi/cditest"
	"github.com/tessera-dev/tessera/node-agent/nvmlsource"
)

// fakeStatfs answers statfs with the filesystem type of each path.
func fakeStatfs(types map[string]int64) func(string, *unix.Statfs_t) error {
	return func(p string, st *unix.Statfs_t) error {
		t, ok := types[p]
		if !ok {
			return os.ErrNotExist
		}
		st.Type = t
		return nil
	}
}

func TestCheckCgroup(t *testing.T) {
	for _, tc := range []struct {
		name     string
		types    map[string]int64
		mode     string
		unmetHas string
	}{
		{"pure v2", map[string]int64{"/cg": cgroup2Magic}, "v2", ""},
		{"hybrid", map[string]int64{"/cg": tmpfsMagic, "/cg/unified": cgroup2Magic}, "hybrid", ""},
		{"v1 only", map[string]int64{"/cg": tmpfsMagic}, "v1", "only cgroup v1"},
		{"v1 controller mounted at the root", map[string]int64{"/cg": cgroup1Magic}, "v1", "only cgroup v1"},
		{"not cgroups", map[string]int64{"/cg": 0xEF53}, "", "not a cgroup mount"},
		{"missing", map[string]int64{}, "", "reading the cgroup mount /cg"},
	} {
		mode, why := checkCgroup("/cg", fakeStatfs(tc.types))
		if mode != tc.mode || (tc.unmetHas == "") != (why == "") || !strings.Contains(why, tc.unmetHas) {
			t.Errorf("%s: mode %q, unmet %q; want %q and %q", tc.name, mode, why, tc.mode, tc.unmetHas)
		}
	}
	// This machine's own cgroups are one of the supported kinds, or say why not.
	mode, why := checkCgroup("/sys/fs/cgroup", unix.Statfs)
	t.Logf("this machine: %q %s", mode, why)
}

func TestCheckNRISocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	missing := filepath.Join(dir, "nri.sock")
	if why := checkNRISocket(missing); !strings.Contains(why, "does not exist") || !strings.Contains(why, "io.containerd.nri.v1.nri") {
		t.Errorf("missing socket: %q", why)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	if why := checkNRISocket(file); !strings.Contains(why, "not a socket") {
		t.Errorf("regular file: %q", why)
	}
	l, err := net.Listen("unix", missing)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if why := checkNRISocket(missing); why != "" {
		t.Errorf("listening socket: %q", why)
	}
}

func TestCheckWritableDir(t *testing.T) {
	dir := t.TempDir()
	if why := checkWritableDir("the CDI spec directory", filepath.Join(dir, "cdi")); why != "" {
		t.Errorf("writable: %q", why)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "cdi")); len(entries) != 0 {
		t.Errorf("the probe left %v", entries)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	if why := checkWritableDir("the CDI spec directory", filepath.Join(file, "cdi")); !strings.Contains(why, "cannot be created") {
		t.Errorf("under a file: %q", why)
	}
}

func TestNRIFallback(t *testing.T) {
	dir := t.TempDir()
	c := parse(t, "--node-name", "n", "--nri-socket", filepath.Join(dir, "nri.sock"), "--hook-library", "/opt/hook.so", "--nri-unavailable", "fallback")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if msg := NRIFallback(&c); !strings.Contains(msg, "first CUDA call") || c.NRI || !c.BindFallback {
		t.Fatalf("no NRI socket with fallback: %q, nri %v, fallback %v", msg, c.NRI, c.BindFallback)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("the fallback configuration is invalid: %v", err)
	}
	c = parse(t, "--node-name", "n", "--nri-socket", filepath.Join(dir, "nri.sock"))
	if msg := NRIFallback(&c); msg != "" || !c.NRI {
		t.Fatalf("refuse (the default) switched: %q", msg)
	}
	for args, want := range map[string]string{
		"--nri-unavailable=fallback": "needs --hook-library",
		"--nri-unavailable=maybe":    "--nri-unavailable",
		"--cgroup-root=sys":          "--cgroup-root",
		"--cdi-spec-dir=var/run/cdi": "--cdi-spec-dir",
		"--cdi-kind=bad":             "--cdi-",
		"--cdi-hook=nvidia-cdi-hook": "--cdi-",
		"--dev-dir=/host/devices":    "--dev-dir",
	} {
		c := parse(t, append([]string{"--node-name", "n"}, strings.Fields(args)...)...)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
}

// unmetAgent is a simulated node's agent with NRI on whose runtime socket is missing.
func unmetAgent(t *testing.T, extra ...string) (*Agent, *fake.Clientset, *record.FakeRecorder, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "rq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	args := append([]string{"--simulate", sample("t4-4x-pcie.yaml"), "--node-name", "n1", "--kubeconfig", "unused",
		"--nri", "--nri-socket", filepath.Join(dir, "nri.sock"), "--device-plugin", "--device-plugin-dir", dir,
		"--state-dir", filepath.Join(dir, "state"), "--limits-root", filepath.Join(dir, "limits"), "--turns-dir", filepath.Join(dir, "turns")}, extra...)
	c := parse(t, args...)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	rec := record.NewFakeRecorder(20)
	a := newTestAgent(t, c, client, rec)
	return a, client, rec, dir
}

// bindOne asks the binding for a container of a pod assigned the node's first GPU
// and returns the refusal's reason ("" when bound).
func bindOne(t *testing.T, a *Agent) string {
	t.Helper()
	devs, _ := a.source.Devices()
	ann, _ := api.EncodeAssignment(&api.PodAssignment{Version: api.AssignmentVersion, Node: "n1",
		Containers: []api.ContainerAssignment{{Name: "main", Devices: []api.DeviceGrant{{UUID: devs[0].UUID, MemoryMiB: 1000}}}}})
	_, err := a.Binder.Bind(binding.Request{PodUID: "u", Namespace: "team", Pod: "p", Container: "main", ContainerID: "c1",
		PodAnnotations: map[string]string{api.AnnotationAssignment: ann}, CgroupsPath: "/kubepods/podu/c1"})
	var refused *binding.RefusedError
	if err != nil && !errors.As(err, &refused) {
		t.Fatal(err)
	}
	if refused == nil {
		return ""
	}
	return refused.Reason
}

func nodeAnnotation(t *testing.T, client *fake.Clientset) string {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Annotations[AnnotationRequirements]
}

func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A node whose runtime has no NRI socket: the agent says so (log, Node event, Node
// annotation) and fails closed: the device plugin refuses GPU containers with the
// reason, and the binding refuses them too. Once the socket is there and the plugin
// connected, both accept again.
func TestRequirementsFailClosed(t *testing.T) {
	a, client, rec, dir := unmetAgent(t)
	a.statfs = fakeStatfs(map[string]int64{"/sys/fs/cgroup": cgroup2Magic})
	a.checkStatic()

	err := a.allocate(&pluginapi.ContainerAllocateResponse{})
	if err == nil || !strings.Contains(err.Error(), "NRI socket") || !strings.Contains(err.Error(), "without limits") {
		t.Fatalf("Allocate with NRI missing: %v", err)
	}
	if v := nodeAnnotation(t, client); !strings.HasPrefix(v, "nri: the runtime's NRI socket") {
		t.Errorf("node annotation %q", v)
	}
	if ev := drain(rec); len(ev) != 1 || !strings.Contains(ev[0], "Warning TesseraRequirementNotMet nri:") {
		t.Errorf("events %v", ev)
	}
	if r := a.Health.Ready(); r.OK || !strings.Contains(strings.Join(r.Lines, "\n"), "[-]node-requirements failed: nri: the runtime's NRI socket") {
		t.Errorf("readiness %v", r.Lines)
	}
	if r := a.Health.Live(); strings.Contains(strings.Join(r.Lines, "\n"), "node-requirements failed") {
		t.Errorf("liveness depends on the requirements: %v", r.Lines)
	}
	// A container the binding sees came through NRI, which therefore works: the
	// NRI requirement is not the binding's reason to refuse (this one is refused
	// because its pod does not exist).
	if why := bindOne(t, a); strings.Contains(why, "NRI socket") {
		t.Fatalf("the binding refused for the NRI requirement: %s", why)
	}

	// The runtime comes up: the socket exists and the plugin connects.
	l, err := net.Listen("unix", filepath.Join(dir, "nri.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a.checkStatic()
	if err := a.allocate(&pluginapi.ContainerAllocateResponse{}); err != nil {
		t.Fatalf("Allocate once NRI is there: %v", err)
	}
	if v := nodeAnnotation(t, client); v != "met" {
		t.Errorf("node annotation %q", v)
	}
	if ev := drain(rec); len(ev) != 1 || !strings.Contains(ev[0], "Normal TesseraRequirementMet nri is met") {
		t.Errorf("events %v", ev)
	}
	// The live check before the plugin ever ran looks at the socket only.
	a.checkLive(time.Now())
	if err := a.allocate(&pluginapi.ContainerAllocateResponse{}); err != nil {
		t.Fatalf("live check, socket present: %v", err)
	}
	// The socket goes away (the runtime stopped): unmet again.
	l.Close()
	os.Remove(filepath.Join(dir, "nri.sock"))
	a.checkLive(time.Now())
	if err := a.allocate(&pluginapi.ContainerAllocateResponse{}); err == nil {
		t.Fatal("Allocate after the runtime's socket went away")
	}
}

// Pure cgroup v1 and an unwritable CDI directory are each refused with their reason.
func TestRequirementsCgroupAndCDIDirectory(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	a, client, _, _ := unmetAgent(t, "--cdi-spec-dir", filepath.Join(file, "cdi"))
	l, err := net.Listen("unix", a.cfg.NRISocket)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a.statfs = fakeStatfs(map[string]int64{"/sys/fs/cgroup": tmpfsMagic})
	a.checkStatic()
	err = a.allocate(&pluginapi.ContainerAllocateResponse{})
	if err == nil || !strings.Contains(err.Error(), "cgroup: the host has only cgroup v1") || !strings.Contains(err.Error(), "cdi-directory: the CDI spec directory") {
		t.Fatalf("Allocate: %v", err)
	}
	// The binding refuses a container it would bind for the first time, with the reason.
	if why := bindOne(t, a); !strings.Contains(why, "only cgroup v1") {
		t.Fatalf("bind on a cgroup v1 host: %q", why)
	}
	v := nodeAnnotation(t, client)
	if lines := strings.Split(v, "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "cdi-directory:") || !strings.HasPrefix(lines[1], "cgroup:") {
		t.Errorf("node annotation %q", v)
	}
	// A simulated node has no NVIDIA driver: the spec cannot be written, which is
	// one more reason.
	a.syncCDI()
	if err := a.allocate(&pluginapi.ContainerAllocateResponse{}); err == nil || !strings.Contains(err.Error(), "cdi: the node's CDI spec could not be written") {
		t.Fatalf("Allocate without a spec: %v", err)
	}
}

// The device plugin's Allocate on a node without NRI (the fallback binding) with CDI:
// every whole GPU's CDI device instead of device nodes, plus the hook and the socket;
// the spec comes from NVIDIA's discovery over a fake driver.
func TestFallbackAllocateCDI(t *testing.T) {
	root := cditest.DriverRoot(t, "usr/lib/x86_64-linux-gnu")
	lib := cditest.H100()
	src, err := nvmlsource.New(nvml.Interface(lib), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "fa")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	hook := filepath.Join(dir, "libtessera-cuda.so")
	os.WriteFile(hook, []byte("elf"), 0o644)
	c := parse(t, "--node-name", "n1", "--kubeconfig", "unused", "--nri=false", "--bind-fallback", "--bind-socket", filepath.Join(dir, "b", "bind.sock"),
		"--hook-library", hook, "--device-plugin-dir", dir, "--state-dir", filepath.Join(dir, "state"), "--limits-root", filepath.Join(dir, "limits"), "--turns-dir", filepath.Join(dir, "turns"),
		"--watchdog=false", "--metrics-addr=", "--health-addr=", "--cdi-spec-dir", filepath.Join(dir, "cdi"), "--cdi-driver-root", root)
	a, err := New(c, logr.Discard(), fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}), src, record.NewFakeRecorder(20))
	if err != nil {
		t.Fatal(err)
	}
	// The agent's generator with the fake NVML in place of the driver's library.
	g, err := cdi.New(cdi.Config{SpecDir: filepath.Join(dir, "cdi"), DriverRoot: root, NVML: lib, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	a.CDI = g
	var resp pluginapi.ContainerAllocateResponse
	if err := a.allocate(&resp); err == nil || !strings.Contains(err.Error(), "no CDI spec") {
		t.Fatalf("Allocate before the spec: %v", err)
	}
	a.syncCDI()
	if why := a.req.refusal(); why != "" {
		t.Fatal(why)
	}
	resp = pluginapi.ContainerAllocateResponse{}
	if err := a.allocate(&resp); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range resp.CdiDevices {
		names = append(names, d.Name)
	}
	devs, _ := src.Devices()
	if len(names) != 8 || len(resp.Devices) != 0 {
		t.Fatalf("CDI devices %v, device nodes %v", names, resp.Devices)
	}
	for _, d := range devs {
		if !slices.Contains(names, "tessera.dev/gpu="+d.UUID) {
			t.Errorf("%s missing from %v", d.UUID, names)
		}
	}
	// The limits directory, the hook, the preload file, every GPU's share directory
	// (read-only) and every GPU's turn file.
	if len(resp.Mounts) != 3+2*len(devs) || resp.Mounts[1].HostPath != hook ||
		resp.Mounts[3].ContainerPath != api.ContainerSharesDir+"/"+devs[0].UUID || !resp.Mounts[3].ReadOnly ||
		resp.Mounts[3+len(devs)].ContainerPath != api.ContainerTurnsDir+"/"+devs[0].UUID {
		t.Errorf("mounts %v", resp.Mounts)
	}
}

// While the NRI plugin is (re)connecting its requirement keeps its last state for
// nriGrace, and the other live checks still run; past the grace it is missing.
func TestRequirementsNRIGrace(t *testing.T) {
	a, _, _, _ := unmetAgent(t, "--cdi-spec-dir", filepath.Join(t.TempDir(), "cdi"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.NRI.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, since, _ := a.NRI.Connected(); !since.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the NRI plugin never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	a.checkLive(time.Now())
	l := strings.Join(a.req.list(), "\n")
	if strings.Contains(l, "nri:") || !strings.Contains(l, "cdi: the node's CDI spec could not be written") {
		t.Fatalf("within the grace: %q", l)
	}
	a.checkLive(time.Now().Add(nriGrace + time.Second))
	if l := strings.Join(a.req.list(), "\n"); !strings.Contains(l, "nri: the runtime's NRI socket") {
		t.Fatalf("past the grace: %q", l)
	}
}

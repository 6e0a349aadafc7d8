// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/bindserver"
)

func TestFallbackFlags(t *testing.T) {
	base := []string{"--node-name", "n", "--hook-library", "/opt/hook.so"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bind-fallback"}, "set --nri=false"},
		{[]string{"--bind-fallback", "--nri=false", "--device-plugin=false"}, "needs --device-plugin"},
		{[]string{"--bind-fallback", "--nri=false", "--hook-library="}, "needs --hook-library"},
		{[]string{"--bind-fallback", "--nri=false", "--bind-socket", "rel/bind.sock"}, "must be an absolute path"},
		{[]string{"--bind-fallback", "--nri=false"}, ""},
	} {
		c := parse(t, append(append([]string{}, base...), tc.args...)...)
		err := c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// An agent started with --bind-fallback: Allocate gives every GPU container the
// socket, the hook and all GPU device nodes, and the socket answers a container's
// process with its limits or refuses it with an event on its pod.
func TestFallbackAgent(t *testing.T) {
	dir, err := os.MkdirTemp("", "ta")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	dev := filepath.Join(dir, "dev")
	for _, d := range []string{dev, filepath.Join(dir, "dp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Stand-ins for the NVIDIA device nodes: character devices are what the binder
	// accepts, and /dev/null is one any machine has.
	for _, n := range []string{"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"} {
		if err := os.Symlink("/dev/null", filepath.Join(dev, n)); err != nil {
			t.Fatal(err)
		}
	}
	hook := filepath.Join(dir, "libtessera-cuda.so")
	if err := os.WriteFile(hook, []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "b", "bind.sock")
	c := parse(t, "--simulate", sample("t4-4x-pcie.yaml"), "--node-name", "n1", "--kubeconfig", "unused",
		"--nri=false", "--bind-fallback", "--bind-socket", socket, "--hook-library", hook, "--device-plugin",
		"--device-plugin-dir", filepath.Join(dir, "dp"), "--state-dir", filepath.Join(dir, "state"),
		"--limits-root", filepath.Join(dir, "limits"), "--turns-dir", filepath.Join(dir, "turns"), "--dev-dir", dev, "--proc-root", filepath.Join(dir, "proc"))
	src, err := OpenSource(&c, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	devs, _ := src.Devices()
	const (
		uid  = "0b4f7a52-1e2d-4c3b-9a8f-7e6d5c4b3a21"
		uid2 = "0b4f7a52-1e2d-4c3b-9a8f-7e6d5c4b3a22"
		cid  = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		cid2 = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	)
	ann, err := api.EncodeAssignment(&api.PodAssignment{Version: api.AssignmentVersion, Node: "n1",
		Containers: []api.ContainerAssignment{{Name: "main", Devices: []api.DeviceGrant{{UUID: devs[2].UUID, Index: 2, MemoryMiB: 3000, Cores: 25}}}}})
	if err != nil {
		t.Fatal(err)
	}
	pod := func(name, u, cid string, annotations map[string]string, limits corev1.ResourceList) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID(u), Annotations: annotations},
			Spec: corev1.PodSpec{NodeName: "n1", SchedulerName: "tessera-binpack",
				Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: limits}}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://" + cid}}},
		}
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		pod("train", uid, cid, map[string]string{api.AnnotationAssignment: ann}, corev1.ResourceList{
			"tessera.dev/gpu": resource.MustParse("1"), "tessera.dev/gpu-memory": resource.MustParse("3000"), "tessera.dev/gpu-cores": resource.MustParse("25")}),
		pod("plain", uid2, cid2, nil, nil))
	rec := record.NewFakeRecorder(10)
	a, err := New(c, logr.Discard(), client, src, rec)
	if err != nil {
		t.Fatal(err)
	}

	var resp pluginapi.ContainerAllocateResponse
	if err := a.fallbackAllocate(&resp); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range resp.Devices {
		got = append(got, d.HostPath)
	}
	if strings.Join(got, ",") != "/dev/nvidia0,/dev/nvidia1,/dev/nvidia2,/dev/nvidia3,/dev/nvidiactl,/dev/nvidia-uvm" {
		t.Errorf("devices %v", got)
	}
	want := []*pluginapi.Mount{
		{ContainerPath: api.ContainerLimitsDir, HostPath: filepath.Dir(socket), ReadOnly: true},
		{ContainerPath: hook, HostPath: hook, ReadOnly: true},
		{ContainerPath: binding.PreloadPath, HostPath: filepath.Join(dir, "state", "ld.so.preload"), ReadOnly: true},
	}
	// Every GPU's share directory, read-only, and every GPU's turn file, each on its
	// own and read-write: which GPUs the container has, and with what cores, is known
	// only at its first CUDA call.
	for _, d := range devs {
		want = append(want, &pluginapi.Mount{ContainerPath: api.ContainerSharesDir + "/" + d.UUID,
			HostPath: filepath.Join(c.LimitsRoot, api.SharesSubdir, d.UUID), ReadOnly: true})
	}
	for _, d := range devs {
		want = append(want, &pluginapi.Mount{ContainerPath: api.ContainerTurnsDir + "/" + d.UUID, HostPath: filepath.Join(dir, "turns", d.UUID)})
	}
	if fmt.Sprint(resp.Mounts) != fmt.Sprint(want) {
		t.Errorf("mounts %v\nwant %v", resp.Mounts, want)
	}
	turn := filepath.Join(dir, "turns", devs[2].UUID)
	if entries, err := os.ReadDir(filepath.Dir(turn)); err != nil || len(entries) != len(devs) {
		t.Errorf("turns directory after Allocate: %v %v, want a file per GPU", entries, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if a.Fallback.server.Serving() {
		t.Error("serving before Run")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(socket); err == nil && a.Fallback.server.Serving() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fallback socket never appeared")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The test process plays a process of container "main" of pod team/train.
	caller := func(podUID, cid string) {
		d := filepath.Join(dir, "proc", fmt.Sprint(os.Getpid()))
		os.MkdirAll(d, 0o755)
		cg := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice/cri-containerd-" + cid + ".scope\n"
		if err := os.WriteFile(filepath.Join(d, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	caller(uid, cid)
	data, err := bindserver.Fetch(socket, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l, err := api.DecodeLimits(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GPUs) != 1 || l.GPUs[0].UUID != devs[2].UUID || l.GPUs[0].MemoryMiB != 3000 || l.GPUs[0].Cores != 25 || l.ContextMiB != api.DefaultContextMiB {
		t.Errorf("limits %+v", l)
	}
	if recs := a.Binder.Records(); len(recs) != 1 || recs[0].Pod != "train" || recs[0].Container != "main" {
		t.Errorf("checkpoint %+v", recs)
	}
	// Paced at 25 %: the binding made its GPU's turn file before the hook got the limits.
	if fi, err := os.Stat(turn); err != nil || fi.Size() != api.TurnFileBytes || fi.Mode().Perm() != 0o666 {
		t.Errorf("turn file %s: %v %v", turn, fi, err)
	}

	caller(uid2, cid2)
	if _, err := bindserver.Fetch(socket, 15*time.Second); err == nil || !strings.Contains(err.Error(), "has no tessera.dev/gpu-assignment") {
		t.Fatalf("pod without an assignment: %v", err)
	}
	select {
	case ev := <-rec.Events:
		if !strings.Contains(ev, "GPUContainerRefused") || !strings.Contains(ev, `container "main" of pod team/plain`) {
			t.Errorf("event %q", ev)
		}
	case <-time.After(5 * time.Second):
		t.Error("no event for the refused container")
	}
}

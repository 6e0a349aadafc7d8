// SPDX-License-Identifier: Apache-2.0

//go:build gpu

package bindserver

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/binding/bindingtest"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/nvmlsource"
)

// TestFallbackRealGPU (go test -tags gpu, as root on a cgroup v2 GPU host, with
// TESSERA_HOOK naming a built libtessera-cuda.so, PyTorch installed): the fallback
// binding end to end without Kubernetes. Cgroups shaped like kubelet's (systemd
// driver, containerd) stand in for two pods' containers; the bind server answers from
// a static pod list; PyTorch processes start inside those cgroups in a mount
// namespace of their own, with the server's socket directory mounted read-only at
// /run/tessera and the hook preloaded through /etc/ld.so.preload, as the device
// plugin's Allocate mounts them. No limits file exists anywhere.
func TestFallbackRealGPU(t *testing.T) {
	hook := os.Getenv("TESSERA_HOOK")
	if hook == "" || os.Geteuid() != 0 {
		t.Skip("needs root and TESSERA_HOOK")
	}
	root := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		t.Skip("no cgroup v2 hierarchy at /sys/fs/cgroup")
	}
	_, self, _, _ := runtime.Caller(0)
	torchMem := filepath.Join(filepath.Dir(self), "..", "..", "cuda-hook", "gpu", "torch_mem.py")
	if v := os.Getenv("TESSERA_TORCH_MEM"); v != "" {
		torchMem = v
	}
	log := funcr.New(func(p, a string) { t.Log(p, a) }, funcr.Options{})
	src, err := nvmlsource.New(nvml.New(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	devs, err := src.Devices()
	if err != nil || len(devs) == 0 {
		t.Fatalf("devices %v %v", devs, err)
	}
	g := devs[0]

	// Two pods: team/train has a 4096 MiB grant for container "main"; team/plain has
	// no assignment.
	mkID := func(s string) string {
		h := sha256.Sum256([]byte(fmt.Sprint(s, os.Getpid(), time.Now().UnixNano())))
		return fmt.Sprintf("%x", h)
	}
	mkUID := func() string {
		h := mkID("uid")
		return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-8" + h[17:20] + "-" + h[20:32]
	}
	uidTrain, uidPlain, uidGone := mkUID(), mkUID(), mkUID()
	cidTrain, cidPlain, cidGone := mkID("train"), mkID("plain"), mkID("gone")
	cgroupOf := func(uid, cid string) string {
		u := strings.ReplaceAll(uid, "-", "_")
		return "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + u + ".slice/cri-containerd-" + cid + ".scope"
	}
	var created []string
	t.Cleanup(func() {
		for i := len(created) - 1; i >= 0; i-- {
			_ = os.WriteFile(filepath.Join(created[i], "cgroup.kill"), []byte("1"), 0o644)
			time.Sleep(50 * time.Millisecond)
			if err := os.Remove(created[i]); err != nil {
				t.Logf("removing cgroup %s: %v", created[i], err)
			}
		}
	})
	mkCgroup := func(p string) {
		acc := root
		for _, c := range strings.Split(strings.Trim(p, "/"), "/") {
			acc = filepath.Join(acc, c)
			if err := os.Mkdir(acc, 0o755); err == nil {
				created = append(created, acc)
			} else if !os.IsExist(err) {
				t.Fatal(err)
			}
		}
	}
	for _, p := range []string{cgroupOf(uidTrain, cidTrain), cgroupOf(uidPlain, cidPlain), cgroupOf(uidGone, cidGone)} {
		mkCgroup(p)
	}

	dir, err := os.MkdirTemp("", "tg")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := checkpoint.Open(filepath.Join(dir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	preload := filepath.Join(dir, "ld.so.preload")
	pods := &fakePods{pods: map[string]*corev1.Pod{}}
	b, err := binding.New(binding.Config{
		NodeName: "gpu-node", Names: api.DefaultResourceNames(), Devices: src.Devices, Store: store,
		LimitsRoot: filepath.Join(dir, "limits"), HookLibrary: hook, PreloadFile: preload, DevDir: "/dev",
		Pods: pods.Get, SchedulerNames: []string{bindingtest.Scheduler}, Inventory: src.Inventory,
	})
	if err != nil {
		t.Fatal(err)
	}
	a := &api.PodAssignment{Version: api.AssignmentVersion, Node: "gpu-node",
		Containers: []api.ContainerAssignment{{Name: "main", Devices: []api.DeviceGrant{{UUID: g.UUID, Index: g.Index, MemoryMiB: 4096}}}}}
	for _, p := range []struct {
		name, uid, cid string
		a              *api.PodAssignment
	}{{"train", uidTrain, cidTrain, a}, {"plain", uidPlain, cidPlain, nil}} {
		pod := &corev1.Pod{}
		pod.Namespace, pod.Name, pod.UID = "team", p.name, types.UID(p.uid)
		if p.a != nil {
			pod = bindingtest.Placed("team", p.name, p.uid, p.a)
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://" + p.cid}}
		pods.set(pod)
	}
	socket := filepath.Join(dir, "bind", "bind.sock")
	var refusals []string
	srv, err := New(Config{Socket: socket, Pods: pods, Binder: b, Log: log,
		OnRefused: func(pod *corev1.Pod, _ string, reason string) { refusals = append(refusals, reason) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Run(ctx)

	// The loader reads /etc/ld.so.preload whatever the environment; the bind mount
	// needs the file to exist on the host (an empty one changes nothing there).
	if _, err := os.Stat(binding.PreloadPath); os.IsNotExist(err) {
		if err := os.WriteFile(binding.PreloadPath, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(binding.PreloadPath)
	}
	// The container's limits directory is a mount point inside each test container;
	// on the host it must not outlive the test: the hook takes a /run/tessera it finds
	// for a Tessera container's and refuses CUDA without limits there (the hook's GPU
	// suite run after this test on the same machine would fail every check).
	if _, err := os.Stat(api.ContainerLimitsDir); os.IsNotExist(err) {
		if err := os.MkdirAll(api.ContainerLimitsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(api.ContainerLimitsDir)
	}
	const script = `mount --bind -o ro "$1" /run/tessera && mount -o remount,bind,ro /run/tessera && mount --bind "$2" /etc/ld.so.preload && shift 2 && ` +
		`test ! -e /run/tessera/limits && exec "$@"`
	var container func(cg string, args ...string) *exec.Cmd
	container = func(cg string, args ...string) *exec.Cmd {
		fd, err := unix.Open(filepath.Join(root, cg), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		// A mount namespace only: the processes of one container share one PID
		// namespace, and the hook's accounting tells its processes apart by PID.
		cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--",
			"sh", "-c", script, "sh", filepath.Dir(socket), preload}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		cmd.Env = append(os.Environ(), "TESSERA_HOOK_LOG=info", "PYTHONUNBUFFERED=1")
		return cmd
	}
	// Where this machine cannot make mount namespaces (itself an unprivileged
	// container, say), the processes still start in the cgroups, but find the socket
	// through a link at the container path on the host and load the hook through
	// LD_PRELOAD.
	if out, err := container(cgroupOf(uidTrain, cidTrain), "true").CombinedOutput(); err != nil {
		t.Logf("no mount namespace here (%v: %s); the socket is linked at %s and the hook preloaded by LD_PRELOAD", err, out, ContainerSocket)
		if _, err := os.Stat(api.ContainerLimitsPath); err == nil {
			t.Fatalf("%s exists on this host; the fallback is not taken where a limits file is", api.ContainerLimitsPath)
		}
		if err := os.Symlink(socket, ContainerSocket); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(ContainerSocket)
		container = func(cg string, args ...string) *exec.Cmd {
			fd, err := unix.Open(filepath.Join(root, cg), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(fd) })
			cmd := exec.Command(args[0], args[1:]...)
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
			cmd.Env = append(os.Environ(), "TESSERA_HOOK_LOG=info", "PYTHONUNBUFFERED=1", "LD_PRELOAD="+hook)
			return cmd
		}
	}
	run := func(name, cg string, args ...string) (string, error) {
		start := time.Now()
		out, err := container(cg, args...).CombinedOutput()
		t.Logf("%s (%.1fs): %v\n%s", name, time.Since(start).Seconds(), err, out)
		return string(out), err
	}

	// 1. Container main of team/train: the limit holds (cuMemGetInfo reports 4096 MiB,
	// tensors stop at the limit less the context charge).
	if _, err := run("train: fill to the limit", cgroupOf(uidTrain, cidTrain), "python3", torchMem, "oom", "4096", fmt.Sprint(api.DefaultContextMiB)); err != nil {
		t.Errorf("the limit from the socket did not hold: %v", err)
	}
	recs := b.Records()
	if len(recs) != 1 || recs[0].Cgroup != cgroupOf(uidTrain, cidTrain) || recs[0].Pod != "train" || recs[0].Container != "main" {
		t.Errorf("checkpoint %+v", recs)
	}

	// 2. Two processes of the container share its one limit.
	ready := filepath.Join(dir, "ready")
	holder := container(cgroupOf(uidTrain, cidTrain), "python3", torchMem, "hold", "2048", ready)
	var holdOut strings.Builder
	holder.Stdout, holder.Stderr = &holdOut, &holdOut
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 600; i++ {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := run("train: second process past the shared limit", cgroupOf(uidTrain, cidTrain), "python3", torchMem, "try", "2048", "oom"); err != nil {
		t.Errorf("a second process went past the container's shared limit: %v", err)
	}
	if _, err := run("train: second process within the shared limit", cgroupOf(uidTrain, cidTrain), "python3", torchMem, "try", "512", "ok"); err != nil {
		t.Errorf("a second process could not use the rest of the limit: %v", err)
	}
	// End the whole container, as the runtime would.
	if err := os.WriteFile(filepath.Join(root, cgroupOf(uidTrain, cidTrain), "cgroup.kill"), []byte("1"), 0o644); err != nil {
		holder.Process.Kill()
	}
	holder.Wait()
	t.Logf("holder: %s", holdOut.String())

	// 3. A pod without an assignment, and a pod the agent does not know: CUDA refused
	// with the agent's reason.
	for _, tc := range []struct{ name, cg, want string }{
		{"plain: no assignment", cgroupOf(uidPlain, cidPlain), "has no tessera.dev/gpu-assignment annotation"},
		{"unknown pod", cgroupOf(uidGone, cidGone), "is not a pod of this node"},
	} {
		out, err := run(tc.name, tc.cg, "python3", "-c", "import torch; torch.cuda.init(); print('CUDA', torch.cuda.device_count())")
		if err == nil || !strings.Contains(out, "the node agent refused") || !strings.Contains(out, tc.want) {
			t.Errorf("%s: CUDA was not refused with the agent's reason (%v)", tc.name, err)
		}
	}
	if len(refusals) != 2 {
		t.Errorf("refusals %q", refusals)
	}
}

// SPDX-License-Identifier: Apache-2.0

//go:build gpu

package nri

// Real-GPU checks of the container binding (go test -tags gpu, as root on a machine
// with at least two NVIDIA GPUs, cgroup v2, and no container runtime needed):
//
// The real plugin is driven over NRI's socket protocol by NRI's own runtime side, as
// containerd embeds it; the adjustment it returns is applied to an OCI spec with NRI's
// runtime-tools helper (what containerd does), and the container is run with runc.
// The root filesystem is the host's /usr and /opt, read-only, so nvidia-smi and
// PyTorch run inside.
//
//	TESSERA_RUNC          runc binary (required)
//	TESSERA_HOOK_LIBRARY  the CUDA hook, libtessera-cuda.so (required)
//	TESSERA_GPU_TEST_OUT  directory for the specs and container outputs (optional)

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	nriapi "github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	"github.com/go-logr/logr"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	rtgen "github.com/opencontainers/runtime-tools/generate"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
	"github.com/tessera-dev/tessera/node-agent/binding/bindingtest"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
	"github.com/tessera-dev/tessera/node-agent/nvmlsource"
)

type realNode struct {
	runc, hook string
	uuids      []string // by NVML index
	major      int64    // of /dev/nvidia<N>
	rt         *runtime
	dir        string
	out        string
	// pods and inv are what the binder checks each assignment against: run puts the
	// pod there as the scheduler placed it.
	pods *bindingtest.Pods
	inv  *api.NodeInventory
}

// setupRealNode starts the real NRI plugin over the node's GPUs; a test that needs
// more GPUs than the node has is skipped.
func setupRealNode(t *testing.T, minGPUs int) *realNode {
	t.Helper()
	n := &realNode{runc: os.Getenv("TESSERA_RUNC"), out: os.Getenv("TESSERA_GPU_TEST_OUT")}
	hook := os.Getenv("TESSERA_HOOK_LIBRARY")
	if n.runc == "" || hook == "" {
		t.Skip("TESSERA_RUNC and TESSERA_HOOK_LIBRARY are required")
	}
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	src, err := nvmlsource.New(nvml.New(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	inv, err := src.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) < minGPUs {
		t.Skipf("needs %d GPUs, the node has %d", minGPUs, len(inv.GPUs))
	}
	for _, g := range inv.GPUs {
		n.uuids = append(n.uuids, g.UUID)
	}
	n.pods, n.inv = &bindingtest.Pods{}, inv
	var st unix.Stat_t
	if err := unix.Stat("/dev/nvidia0", &st); err != nil {
		t.Fatal(err)
	}
	n.major = int64(unix.Major(uint64(st.Rdev)))

	// Short base path: unix socket paths are limited. The hook is copied under it so
	// that its path exists in the container's (writable) root, not under the host's
	// read-only /usr or /opt.
	n.dir, err = os.MkdirTemp("/var/tmp", "tnri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(n.dir) })
	n.hook = filepath.Join(n.dir, "lib", "libtessera-cuda.so")
	if err := os.MkdirAll(filepath.Dir(n.hook), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", hook, n.hook).CombinedOutput(); err != nil {
		t.Fatalf("copying the hook: %v %s", err, out)
	}

	store, err := checkpoint.Open(filepath.Join(n.dir, "state", "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := binding.New(binding.Config{
		NodeName: "gpu-node", Names: api.DefaultResourceNames(), Store: store, Devices: src.Devices,
		LimitsRoot: filepath.Join(n.dir, "limits"), HookLibrary: n.hook, PreloadFile: filepath.Join(n.dir, "state", "ld.so.preload"),
		Pods: n.pods.Get, SchedulerNames: []string{bindingtest.Scheduler},
		Inventory: func() (*api.NodeInventory, error) { return n.inv, nil },
		TurnsDir:  filepath.Join(n.dir, "turns"),
	})
	if err != nil {
		t.Fatal(err)
	}
	n.rt = startRuntime(t, n.dir, nil, nil)
	t.Cleanup(n.rt.r.Stop)
	p := New(b, filepath.Join(n.dir, "nri.sock"), logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitConnected(t, p)
	return n
}

// rootfs makes a container root: the host's /usr and /opt (and any real top-level
// library directory) bind-mounted read-only, its top-level links (bin, lib, ...) as
// links, and a copy of /etc, since the runtime mounts the preload file into /etc.
func (n *realNode) rootfs(t *testing.T, name string) (string, []rspec.Mount) {
	t.Helper()
	root := filepath.Join(n.dir, name, "rootfs")
	for _, d := range []string{"usr", "opt", "proc", "dev", "sys", "tmp", "run", "var", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ro := []string{"rbind", "ro", "nosuid"}
	mounts := []rspec.Mount{
		{Destination: "/usr", Type: "bind", Source: "/usr", Options: ro},
		{Destination: "/opt", Type: "bind", Source: "/opt", Options: ro},
		// No nodev: the device cgroup, not the mount, must be what denies a GPU.
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=1777", "size=1g"}},
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		host := "/" + l
		if target, err := os.Readlink(host); err == nil {
			if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
				t.Fatal(err)
			}
		} else if fi, err := os.Stat(host); err == nil && fi.IsDir() {
			if err := os.MkdirAll(filepath.Join(root, l), 0o755); err != nil {
				t.Fatal(err)
			}
			mounts = append(mounts, rspec.Mount{Destination: host, Type: "bind", Source: host, Options: ro})
		}
	}
	if out, err := exec.Command("cp", "-a", "/etc", filepath.Join(root, "etc")).CombinedOutput(); err != nil {
		t.Fatalf("copying /etc: %v %s", err, out)
	}
	_ = os.Remove(filepath.Join(root, "etc", "ld.so.preload"))
	return root, mounts
}

// containerdCaps is containerd's default capability set for a container.
var containerdCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}

// run creates the container through NRI (a pod assigned grants), builds its spec as
// containerd would and runs script in it with runc; it returns the output and the
// adjustment.
func (n *realNode) run(t *testing.T, name string, grants []api.DeviceGrant, script string) (string, string) {
	t.Helper()
	uid := "pod-" + name
	pod := &nriapi.PodSandbox{Id: "sb-" + name, Uid: uid, Name: name, Namespace: "gpu-test", Annotations: map[string]string{}}
	ann, err := api.EncodeAssignment(&api.PodAssignment{Version: api.AssignmentVersion, Node: "gpu-node",
		Containers: []api.ContainerAssignment{{Name: "main", Devices: grants}}})
	if err != nil {
		t.Fatal(err)
	}
	pod.Annotations[api.AnnotationAssignment] = ann
	// The binder checks the grant against the pod's request and the inventory: the
	// pod asks for 50% of each GPU's memory, and the inventory publishes each granted
	// GPU at twice its grant, so that two GPUs can carry different limits.
	placed := bindingtest.Placed(pod.Namespace, pod.Name, uid, &api.PodAssignment{Version: api.AssignmentVersion, Node: "gpu-node",
		Containers: []api.ContainerAssignment{{Name: "main", Devices: grants}}})
	lim := placed.Spec.Containers[0].Resources.Limits
	delete(lim, api.DefaultResourceNames().GPUMemory)
	lim[api.DefaultResourceNames().GPUMemoryPercent] = resource.MustParse("50")
	for _, d := range grants {
		for i := range n.inv.GPUs {
			if n.inv.GPUs[i].UUID == d.UUID {
				n.inv.GPUs[i].MemoryMiB = 2 * d.MemoryMiB
			}
		}
	}
	n.pods.Put(placed)
	cgroup := "/tessera-gpu-test/" + name
	ctr := &nriapi.Container{Id: "ctr-" + name, PodSandboxId: pod.Id, Name: "main", State: nriapi.ContainerState_CONTAINER_CREATED,
		Env:   []string{deviceplugin.EnvRequested + "=" + strconv.Itoa(len(grants)), "NVIDIA_VISIBLE_DEVICES=all"},
		Linux: &nriapi.LinuxContainer{CgroupsPath: cgroup}}
	adj, err := n.rt.create(t, pod, ctr)
	if err != nil {
		t.Fatal(err)
	}
	adjJSON, _ := json.MarshalIndent(adj, "", "  ")

	root, mounts := n.rootfs(t, name)
	g, err := rtgen.New("linux")
	if err != nil {
		t.Fatal(err)
	}
	g.SetRootPath(root)
	g.SetRootReadonly(false)
	g.SetHostname(name)
	g.SetProcessTerminal(false)
	g.SetProcessCwd("/")
	g.SetProcessArgs([]string{"/bin/sh", "-c", script})
	// The host's python3 (the one with PyTorch, in a virtual environment under /opt on
	// the GPU machines) first.
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	if py, err := exec.LookPath("python3"); err == nil {
		path = filepath.Dir(py) + ":" + path
	}
	g.AddProcessEnv("PATH", path)
	g.AddProcessEnv("HOME", "/tmp")
	g.AddProcessEnv("PYTHONUNBUFFERED", "1")
	// Keep NVLink multicast off, as on the host.
	for _, kv := range []string{"NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1"} {
		k, v, _ := strings.Cut(kv, "=")
		g.AddProcessEnv(k, v)
	}
	// The container's own environment, as the runtime would have it before NRI.
	for _, e := range ctr.Env {
		k, v, _ := strings.Cut(e, "=")
		g.AddProcessEnv(k, v)
	}
	g.SetLinuxCgroupsPath(cgroup)
	g.ClearProcessCapabilities()
	for _, c := range containerdCaps {
		if err := g.AddProcessCapability(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range mounts {
		g.AddMount(m)
	}
	// Like containerd's default spec: every device denied, then the defaults allowed
	// (runc adds those), then the adjustment's devices.
	spec := g.Config
	if spec.Linux.Resources == nil {
		spec.Linux.Resources = &rspec.LinuxResources{}
	}
	spec.Linux.Resources.Devices = []rspec.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	// runc is built here without its seccomp build tag (no libseccomp on the GPU
	// machines); containerd's default profile is beside the point of these checks.
	spec.Linux.Seccomp = nil
	if err := nrigen.SpecGenerator(&g).Adjust(adj); err != nil {
		t.Fatalf("applying the adjustment: %v", err)
	}
	bundle := filepath.Dir(root)
	specJSON, _ := json.MarshalIndent(g.Config, "", "  ")
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), specJSON, 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	args := []string{"--root", filepath.Join(n.dir, "runc"), "run", "--bundle", bundle, "ctr-" + name}
	out, err := exec.CommandContext(ctx, n.runc, args...).CombinedOutput()
	if err != nil && strings.Contains(string(out), "pivot_root") {
		// A root on initramfs cannot be pivoted away from.
		args = append([]string{args[0], args[1], args[2], "--no-pivot"}, args[3:]...)
		out, err = exec.CommandContext(ctx, n.runc, args...).CombinedOutput()
	}
	if n.out != "" {
		_ = os.MkdirAll(n.out, 0o755)
		_ = os.WriteFile(filepath.Join(n.out, name+".txt"), []byte(fmt.Sprintf("runc %s\n\n== adjustment\n%s\n\n== output\n%s\nrunc error: %v\n", strings.Join(args, " "), adjJSON, out, err)), 0o644)
		_ = os.WriteFile(filepath.Join(n.out, name+"-spec.json"), specJSON, 0o644)
	}
	t.Logf("container %s output:\n%s", name, out)
	if err != nil {
		t.Fatalf("runc: %v", err)
	}
	_ = os.Remove(cgroupDir(cgroup))
	return string(out), string(adjJSON)
}

func cgroupDir(cgroup string) string { return filepath.Join("/sys/fs/cgroup", cgroup) }

func field(t *testing.T, out, key string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + ` (.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Errorf("no %q line in the container's output", key)
		return ""
	}
	return strings.TrimSpace(m[1])
}

// A container bound to GPU 0 sees and opens only GPU 0: nvidia-smi and PyTorch (with
// the hook) show one GPU, a node made for GPU 1 (another GPU's, or on a node of one GPU
// a minor no GPU has) cannot be opened (the device cgroup says EPERM) while one made for
// GPU 0 can, the limits are read-only, the accounting
// region is in a tmpfs of the container's own, and GPU 0's turn file, alone, is there
// to write but not to remove.
func TestRealContainerBoundToOneGPU(t *testing.T) {
	n := setupRealNode(t, 1)
	script := fmt.Sprintf(`
echo "== nvidia-smi -L"; nvidia-smi -L; echo "nvidia-smi-rc $?"
echo "== /dev"; ls -l /dev | grep -i nvidia
python3 -c '
import torch
print("torch-count", torch.cuda.device_count())
print("torch-uuid0", "GPU-" + str(torch.cuda.get_device_properties(0).uuid))
'
mknod /tmp/nvidia0 c %[1]d 0; mknod /tmp/nvidia1 c %[1]d 1
python3 -c '
import os
for n in ("nvidia0", "nvidia1"):
    try:
        os.close(os.open("/tmp/" + n, os.O_RDWR)); print("open-" + n, "ok")
    except OSError as e:
        print("open-" + n, e.errno, e.strerror)
'
if (echo x >> /run/tessera/limits) 2>/tmp/w; then echo "limits-write ok"; else echo "limits-write $(cat /tmp/w)"; fi
echo "limits-mount $(grep " /run/tessera " /proc/self/mountinfo)"
echo "preload $(cat /etc/ld.so.preload)"
echo "region-mount $(grep " /run/tessera-region " /proc/self/mountinfo)"
echo "region-files $(ls -A /run/tessera-region | tr '\n' ' ')"
echo "shm-regions $(ls -A /dev/shm 2>/dev/null | grep -c '[.]region$')"
echo "turns $(cd /run/tessera-turns && for f in *; do echo "$f:$(stat -c %%s "$f")"; done)"
if (printf x | dd of=/run/tessera-turns/%[2]s bs=1 seek=4095 conv=notrunc) 2>/tmp/w; then echo "turn-write ok"; else echo "turn-write $(cat /tmp/w)"; fi
if rm /run/tessera-turns/%[2]s 2>/tmp/w; then echo "turn-unlink removed"; else echo "turn-unlink $(cat /tmp/w)"; fi
echo "== limits"; cat /run/tessera/limits
`, n.major, n.uuids[0])
	out, _ := n.run(t, "one", []api.DeviceGrant{{UUID: n.uuids[0], Index: 0, MemoryMiB: 16384, Cores: 50}}, script)

	var listed []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "GPU ") {
			listed = append(listed, l)
		}
	}
	if len(listed) != 1 || !strings.Contains(listed[0], n.uuids[0]) {
		t.Errorf("nvidia-smi -L lists %q, want only %s", listed, n.uuids[0])
	}
	if got := field(t, out, "torch-count"); got != "1" {
		t.Errorf("torch.cuda.device_count() = %s, want 1", got)
	}
	if got := field(t, out, "torch-uuid0"); got != n.uuids[0] {
		t.Errorf("torch device 0 is %s, want %s", got, n.uuids[0])
	}
	if got := field(t, out, "open-nvidia0"); got != "ok" {
		t.Errorf("opening GPU 0's node: %s", got)
	}
	if got := field(t, out, "open-nvidia1"); got != "1 Operation not permitted" {
		t.Errorf("opening GPU 1's node: %q, want EPERM from the device cgroup", got)
	}
	if got := field(t, out, "limits-write"); !strings.Contains(got, "Read-only file system") {
		t.Errorf("writing the limits file: %q", got)
	}
	if got := field(t, out, "limits-mount"); !regexp.MustCompile(`\sro[,\s]`).MatchString(got) {
		t.Errorf("limits mount not read-only: %q", got)
	}
	if got := field(t, out, "preload"); got != n.hook {
		t.Errorf("ld.so.preload: %q", got)
	}
	// PyTorch ran through the hook, whose region is in the container's own capped tmpfs
	// (mountinfo: mount options, then after " - " the type, source and the file
	// system's options), not in /dev/shm.
	mi := field(t, out, "region-mount")
	if opts, fs, ok := strings.Cut(mi, " - "); !ok || !strings.HasPrefix(fs, "tmpfs ") || !strings.Contains(fs, "size=1024k") ||
		!regexp.MustCompile(`\bnosuid\b`).MatchString(opts) || !regexp.MustCompile(`\bnodev\b`).MatchString(opts) ||
		!regexp.MustCompile(`\bnoexec\b`).MatchString(opts) {
		t.Errorf("region directory mount %q, want a tmpfs of 1024k, nosuid, nodev, noexec", mi)
	}
	if got := field(t, out, "region-files"); !regexp.MustCompile(`^tessera-[0-9a-f]{16}\.region$`).MatchString(got) {
		t.Errorf("the region directory holds %q, want the container's region alone", got)
	}
	if got := field(t, out, "shm-regions"); got != "0" {
		t.Errorf("%s accounting regions in /dev/shm, want none", got)
	}
	// The GPU's turn file, and only that GPU's: shared read-write with the GPU's other
	// paced containers (docs/cuda-hook.md, "GPU turns").
	if got, want := field(t, out, "turns"), n.uuids[0]+":4096"; got != want {
		t.Errorf("the turns directory holds %q, want %q", got, want)
	}
	if got := field(t, out, "turn-write"); got != "ok" {
		t.Errorf("writing the GPU's turn file: %q", got)
	}
	if got := field(t, out, "turn-unlink"); !strings.Contains(got, "Device or resource busy") {
		t.Errorf("removing the GPU's turn file: %q, want EBUSY (the file is a mount of its own)", got)
	}
}

// One container granted both GPUs at fractions, GPU 1 first: the hook shows them in
// the assignment's order, each with its own memory limit, and allocation on each
// stops at that device's limit.
func TestRealTwoGPUAssignment(t *testing.T) {
	n := setupRealNode(t, 2)
	grants := []api.DeviceGrant{
		{UUID: n.uuids[1], Index: 1, MemoryMiB: 6144, Cores: 30},
		{UUID: n.uuids[0], Index: 0, MemoryMiB: 3072, Cores: 30},
	}
	script := `
echo "== nvidia-smi -L"; nvidia-smi -L
python3 -c '
import torch
n = torch.cuda.device_count()
print("torch-count", n)
for i in range(n):
    p = torch.cuda.get_device_properties(i)
    free, total = torch.cuda.mem_get_info(i)
    print("dev%d-uuid" % i, "GPU-" + str(p.uuid))
    print("dev%d-total-mib" % i, total >> 20)
    xs = []
    try:
        while True:
            xs.append(torch.empty(128 << 20, dtype=torch.uint8, device=i))
    except torch.OutOfMemoryError:
        pass
    print("dev%d-alloc-mib" % i, len(xs) * 128)
    del xs
    torch.cuda.empty_cache()
'
echo "== limits"; cat /run/tessera/limits
`
	out, _ := n.run(t, "two", grants, script)
	if got := field(t, out, "torch-count"); got != "2" {
		t.Fatalf("torch.cuda.device_count() = %s, want 2", got)
	}
	ctx := int64(api.DefaultContextMiB)
	for i, g := range grants {
		if got := field(t, out, fmt.Sprintf("dev%d-uuid", i)); got != g.UUID {
			t.Errorf("device %d is %s, want %s (the assignment's order)", i, got, g.UUID)
		}
		total, _ := strconv.ParseInt(field(t, out, fmt.Sprintf("dev%d-total-mib", i)), 10, 64)
		if total != g.MemoryMiB {
			t.Errorf("device %d reports %d MiB total, want the limit %d", i, total, g.MemoryMiB)
		}
		alloc, _ := strconv.ParseInt(field(t, out, fmt.Sprintf("dev%d-alloc-mib", i)), 10, 64)
		// The context is charged against the limit; allocation stops within two
		// 128 MiB chunks of what is left, and never beyond it.
		if alloc > g.MemoryMiB-ctx || alloc < g.MemoryMiB-ctx-256 {
			t.Errorf("device %d: allocated %d MiB under a %d MiB limit (context %d MiB)", i, alloc, g.MemoryMiB, ctx)
		}
	}
}

// SPDX-License-Identifier: Apache-2.0

//go:build linux

// Package node is Tessera's real-node suite: a real kubelet, containerd 2.x with NRI
// and runc on this machine, started by test/node/node.sh with the control plane, the
// Tessera scheduler, a default scheduler and the node agent, and real pods that run
// test/node/probe (a CUDA program) against the fake libcuda.so.1 (make test-node) or
// the machine's GPUs (make test-node-gpu), the driver reaching GPU containers through
// the node agent's CDI spec only. Every pass (NRI binding, then the fallback binding
// at the first CUDA call) starts its own node.
//
// The tests run only with TESSERA_NODE_SUITE=1 (the make targets set it and build
// everything first): they need root, and they start kubelet and containerd.
package node

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api"
)

const (
	testImage        = "tessera.local/tessera-node-test:test"
	tesseraScheduler = "tessera-binpack"
	namespace        = "default"
)

// node is one running node of the suite.
type node struct {
	t      *testing.T
	dir    string
	mode   string
	gpu    bool
	name   string
	client kubernetes.Interface
	env    []string
}

// boxMain is set in the nodebox build (nodebox_test.go): the binary is then also the
// node's components, run by name.
var boxMain func(name string, args []string) (int, bool)

func TestMain(m *testing.M) {
	if boxMain != nil {
		if code, ok := boxMain(filepath.Base(os.Args[0]), os.Args[1:]); ok {
			os.Exit(code)
		}
	}
	os.Exit(m.Run())
}

func enabled(t *testing.T) {
	if os.Getenv("TESSERA_NODE_SUITE") != "1" {
		t.Skip("the real-node suite runs with TESSERA_NODE_SUITE=1 as root (make test-node, make test-node-gpu)")
	}
}

func repoRoot(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// startNode brings a node up with node.sh in the given binding mode and stops it, with
// everything on it, when the test ends. Its logs are copied to TESSERA_NODE_LOGS (if
// set) first.
func startNode(t *testing.T, mode string) *node {
	t.Helper()
	base := os.Getenv("NODE_DIR")
	if base == "" {
		base = "/tmp/tessera-node"
	}
	n := &node{t: t, dir: base + "-" + mode, mode: mode, gpu: os.Getenv("TESSERA_NODE_GPU") == "1", name: "tessera-node"}
	n.env = append(os.Environ(), "NODE_DIR="+n.dir, "MODE="+mode, "NODE_NAME="+n.name)
	if n.gpu {
		n.env = append(n.env, "GPU=1")
	}
	// A node left by an interrupted run is removed first.
	_ = n.sh("down")
	t.Cleanup(func() {
		if dst := os.Getenv("TESSERA_NODE_LOGS"); dst != "" {
			_ = os.MkdirAll(dst, 0o755)
			_ = exec.Command("cp", "-r", filepath.Join(n.dir, "run", "logs"), filepath.Join(dst, mode)).Run()
			_ = exec.Command("cp", "-r", filepath.Join(n.dir, "pod-logs"), filepath.Join(dst, mode+"-pod-logs")).Run()
		}
		if err := n.sh("down"); err != nil {
			t.Errorf("stopping the node: %v", err)
		}
	})
	if err := n.sh("up"); err != nil {
		t.Fatalf("starting the node: %v", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(n.dir, "run", "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	n.client = kubernetes.NewForConfigOrDie(cfg)
	// node.sh applied the chart's require-nri-plugin policy: wait until the API
	// server uses it.
	waitFor(t, 30*time.Second, "the require-nri-plugin admission policy in effect", func() (bool, error) {
		p, err := n.client.CoreV1().Pods(namespace).Create(context.Background(), n.pod(podSpec{name: "policy-check", gpus: 1}),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err
		}
		return p.Annotations[requiredPluginsKey+"probe"] == `["tessera"]`, nil
	})
	return n
}

// requiredPluginsKey (+ the container's name) is the pod annotation that NRI's default
// validator reads: the plugins that must be connected for the container to be created.
const requiredPluginsKey = "required-plugins.noderesource.dev/container."

// sh runs test/node/node.sh with the node's settings; its output goes to the test log.
func (n *node) sh(args ...string) error {
	cmd := exec.Command(filepath.Join(repoRoot(n.t), "test", "node", "node.sh"), args...)
	cmd.Env = n.env
	out, err := cmd.CombinedOutput()
	if len(out) > 0 {
		n.t.Logf("node.sh %s:\n%s", strings.Join(args, " "), strings.TrimRight(string(out), "\n"))
	}
	return err
}

// restart stops one component and starts it again after pause.
func (n *node) restart(component string, pause time.Duration) {
	n.t.Helper()
	if err := n.sh("stop", component); err != nil {
		n.t.Fatalf("stopping %s: %v", component, err)
	}
	time.Sleep(pause)
	if err := n.sh("start", component); err != nil {
		n.t.Fatalf("starting %s: %v", component, err)
	}
}

// podSpec is a pod running the probe with args: a GPU pod of Tessera's scheduler when
// memMiB or cores is set (memMiB < 0: the whole memory of the GPU), otherwise a plain
// pod of the default scheduler.
type podSpec struct {
	name      string
	gpus      int
	memMiB    int64
	cores     int
	scheduler string
	// privileged: the container sees every host device (B6's baseline on a GPU).
	privileged bool
	// hostDriver: the node's driver libraries are mounted from the host by the pod
	// itself and put on its loader path (B6's baseline: a CUDA pod without GPU
	// requests, which Tessera's CDI spec does not serve); driverVolume: the same
	// volume, not on the loader path (B6's GPU pods, so that both kinds have the
	// same volumes).
	hostDriver, driverVolume bool
	args                     []string
	// command replaces the image's entrypoint; env is added to the container's.
	command []string
	env     []v1.EnvVar
	// hostMounts are host directories mounted read-only, by container path.
	hostMounts map[string]string
	// claim: the pod's GPU is a ResourceClaim of this memory and cores (a DRA node),
	// named after the pod and created with it by startOne.
	claim *claimShape
}

// claimShape is a claim's capacity requests, and whether its gpu.tessera.dev
// configuration asks for work-conserving pacing.
type claimShape struct {
	memory, cores  string
	workConserving bool
}

// cdiLibraryDir is where the agent's CDI spec mounts the driver's libraries in a GPU
// container (no nvidia-cdi-hook on the suite's nodes).
const cdiLibraryDir = "/usr/local/nvidia/lib64"

// driverDir is the host directory of the node's driver libraries: the fake driver that
// node.sh installs, or the machine's (TESSERA_NODE_DRIVER_DIR).
func (n *node) driverDir() string {
	if !n.gpu {
		return filepath.Join(n.dir, "driver", "usr", "local", "nvidia", "lib64")
	}
	if dir := os.Getenv("TESSERA_NODE_DRIVER_DIR"); dir != "" {
		return dir
	}
	return "/usr/local/nvidia/lib64"
}

func (n *node) pod(s podSpec) *v1.Pod {
	limits := v1.ResourceList{}
	if s.gpus > 0 {
		limits[v1.ResourceName(api.DefaultDomain+"/gpu")] = *resource.NewQuantity(int64(s.gpus), resource.DecimalSI)
	}
	if s.memMiB > 0 {
		limits[v1.ResourceName(api.DefaultDomain+"/gpu-memory")] = *resource.NewQuantity(s.memMiB, resource.DecimalSI)
	}
	if s.cores > 0 {
		limits[v1.ResourceName(api.DefaultDomain+"/gpu-cores")] = *resource.NewQuantity(int64(s.cores), resource.DecimalSI)
	}
	sched := s.scheduler
	if sched == "" {
		sched = v1.DefaultSchedulerName
		if s.gpus > 0 {
			sched = tesseraScheduler
		}
	}
	zero := int64(0)
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: namespace},
		Spec: v1.PodSpec{
			SchedulerName: sched,
			// The node has no CNI plugin: only host-network pods start.
			HostNetwork:                   true,
			RestartPolicy:                 v1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero,
			Containers: []v1.Container{{
				Name: "probe", Image: testImage, ImagePullPolicy: v1.PullNever, Args: s.args,
				Resources: v1.ResourceRequirements{Limits: limits},
			}},
		},
	}
	c := &p.Spec.Containers[0]
	c.Command = s.command
	c.Env = append(c.Env, s.env...)
	for _, dst := range slices.Sorted(maps.Keys(s.hostMounts)) {
		name := fmt.Sprintf("host-%d", len(p.Spec.Volumes))
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: name, VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: s.hostMounts[dst]}}})
		c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: name, MountPath: dst, ReadOnly: true})
	}
	if s.privileged {
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &s.privileged}
	}
	if s.hostDriver || s.driverVolume {
		hostDriverSetup(p, n.driverDir(), s.hostDriver)
	}
	if s.claim != nil {
		// The claim's CDI device does not set the loader's path (docs/dra.md): the
		// pod names the driver's directory, as images on such nodes must.
		p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(s.name)}}
		c.Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
		c.Env = append(c.Env, v1.EnvVar{Name: "LD_LIBRARY_PATH", Value: cdiLibraryDir})
	}
	if !s.hostDriver && s.claim == nil && n.mode == "fallback" {
		// Without NRI nothing sets the loader's path for the driver the CDI spec
		// mounts: images must have it (NVIDIA's CUDA images do), as this pod does.
		c := &p.Spec.Containers[0]
		c.Env = append(c.Env, v1.EnvVar{Name: "LD_LIBRARY_PATH", Value: cdiLibraryDir})
	}
	return p
}

func (n *node) create(ctx context.Context, p *v1.Pod) *v1.Pod {
	n.t.Helper()
	out, err := n.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		n.t.Fatalf("creating pod %s: %v", p.Name, err)
	}
	return out
}

func (n *node) get(ctx context.Context, name string) *v1.Pod {
	n.t.Helper()
	p, err := n.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatalf("reading pod %s: %v", name, err)
	}
	return p
}

// deletePods deletes pods and waits until they are gone from the API server (kubelet
// has stopped their containers).
func (n *node) deletePods(ctx context.Context, names ...string) {
	n.t.Helper()
	zero := int64(0)
	for _, name := range names {
		err := n.client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			n.t.Fatalf("deleting pod %s: %v", name, err)
		}
	}
	waitFor(n.t, 90*time.Second, fmt.Sprintf("pods %v gone", names), func() (bool, error) {
		for _, name := range names {
			_, err := n.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				return false, nil
			}
			if !apierrors.IsNotFound(err) {
				return false, err
			}
		}
		return true, nil
	})
}

// deleteAll removes every pod of the namespace, so that a test leaves the node empty.
func (n *node) deleteAll(ctx context.Context) {
	n.t.Helper()
	pods, err := n.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	if len(names) > 0 {
		n.deletePods(ctx, names...)
	}
	n.deleteClaims(ctx)
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitPhase waits until the pod reaches one of the phases and returns it. When it
// does not, the failure says where the pod stood: its phase, conditions, containers'
// waiting or terminated reasons and its events.
func (n *node) waitPhase(ctx context.Context, name string, timeout time.Duration, phases ...v1.PodPhase) *v1.Pod {
	n.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		p, err := n.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			n.t.Fatalf("waiting for pod %s in phase %v: %v", name, phases, err)
		}
		if slices.Contains(phases, p.Status.Phase) {
			return p
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("pod %s in phase %v: not after %s; %s", name, phases, timeout, n.podState(ctx, p))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// podState describes where a pod stands, for a failure message.
func (n *node) podState(ctx context.Context, p *v1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s on node %q", p.Status.Phase, p.Spec.NodeName)
	for _, c := range p.Status.Conditions {
		if c.Status != v1.ConditionTrue {
			fmt.Fprintf(&b, "; %s=%s %s %s", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		switch {
		case cs.State.Waiting != nil:
			fmt.Fprintf(&b, "; container %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			fmt.Fprintf(&b, "; container %s terminated: exit %d %s", cs.Name, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason)
		case cs.State.Running != nil:
			fmt.Fprintf(&b, "; container %s running", cs.Name)
		}
	}
	evs, err := n.podEvents(ctx, p.Name)
	if err != nil {
		fmt.Fprintf(&b, "; events: %v", err)
	}
	for _, e := range evs {
		fmt.Fprintf(&b, "\n  event %s %s (x%d, last %s): %s", e.Type, e.Reason, e.Count, e.LastTimestamp.Format(time.TimeOnly), e.Message)
	}
	return b.String()
}

// probeLine is one "tessera-probe EVENT k=v ..." line of a container's log.
type probeLine struct {
	event  string
	fields map[string]string
	// logged is when the runtime wrote it (the CRI log's timestamp).
	logged time.Time
}

func (l probeLine) int(t *testing.T, key string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(l.fields[key], 10, 64)
	if err != nil {
		t.Fatalf("probe line %q: field %s: %v", l.event, key, err)
	}
	return v
}

// eachLogLine calls fn with each line of a container's log (the kubelet's files):
// its time and its text without the kubelet's timestamp and stream prefix.
func (n *node) eachLogLine(p *v1.Pod, container string, fn func(ts time.Time, text string)) {
	dir := filepath.Join(n.dir, "pod-logs", fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), container)
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	sort.Strings(files)
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			if parts := strings.SplitN(sc.Text(), " ", 4); len(parts) == 4 {
				ts, _ := time.Parse(time.RFC3339Nano, parts[0])
				fn(ts, parts[3])
			}
		}
		fh.Close()
	}
}

// podLogLines are the lines of a container's log that contain sub.
func (n *node) podLogLines(p *v1.Pod, container, sub string) []string {
	var out []string
	n.eachLogLine(p, container, func(_ time.Time, text string) {
		if strings.Contains(text, sub) {
			out = append(out, text)
		}
	})
	return out
}

// probeLines reads the probe's lines from the pod's container log, which kubelet keeps
// in the node's pod log directory (CRI format: "TIME STREAM TAG MESSAGE").
func (n *node) probeLines(p *v1.Pod) []probeLine {
	var out []probeLine
	n.eachLogLine(p, "probe", func(ts time.Time, text string) {
		if !strings.HasPrefix(text, "tessera-probe ") {
			return
		}
		words := strings.Fields(strings.TrimPrefix(text, "tessera-probe "))
		if len(words) == 0 {
			return
		}
		l := probeLine{event: words[0], fields: map[string]string{}, logged: ts}
		for _, w := range words[1:] {
			if k, v, ok := strings.Cut(w, "="); ok {
				l.fields[k] = v
			}
		}
		out = append(out, l)
	})
	return out
}

func find(lines []probeLine, event string) (probeLine, bool) {
	for _, l := range lines {
		if l.event == event {
			return l, true
		}
	}
	return probeLine{}, false
}

// waitLine waits until the pod's probe has printed event.
func (n *node) waitLine(ctx context.Context, p *v1.Pod, event string, timeout time.Duration) probeLine {
	n.t.Helper()
	var got probeLine
	waitFor(n.t, timeout, fmt.Sprintf("pod %s printing %q", p.Name, event), func() (bool, error) {
		var ok bool
		got, ok = find(n.probeLines(p), event)
		if !ok {
			if e, failed := find(n.probeLines(p), "error"); failed {
				return false, fmt.Errorf("the probe failed: %v", e.fields)
			}
		}
		return ok, nil
	})
	return got
}

// grant is the pod's assignment for the probe container (nil when it has none).
func grant(t *testing.T, p *v1.Pod) *api.ContainerAssignment {
	t.Helper()
	raw, ok := p.Annotations[api.AnnotationAssignment]
	if !ok {
		return nil
	}
	a, err := api.DecodeAssignment(raw)
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	return a.Container("probe")
}

// inventory is the node's published GPU inventory.
func (n *node) inventory(ctx context.Context) *api.NodeInventory {
	n.t.Helper()
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	inv, err := api.DecodeInventory(node.Annotations[api.AnnotationInventory])
	if err != nil {
		n.t.Fatalf("node inventory: %v", err)
	}
	return inv
}

// noDoubleGrant checks that the grants of the pods that hold one (not finished) fit
// their GPUs: memory within the GPU's, cores within 100%.
func (n *node) noDoubleGrant(ctx context.Context) {
	n.t.Helper()
	inv := n.inventory(ctx)
	total := map[string]int64{}
	for _, g := range inv.GPUs {
		total[g.UUID] = g.MemoryMiB
	}
	pods, err := n.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	mem, cores := map[string]int64{}, map[string]int{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		if g := grant(n.t, p); g != nil {
			for _, d := range g.Devices {
				mem[d.UUID] += d.MemoryMiB
				cores[d.UUID] += d.Cores
			}
		}
	}
	for u, m := range mem {
		if m > total[u] || cores[u] > 100 {
			n.t.Errorf("GPU %s granted twice: %d MiB of %d, %d%% cores", u, m, total[u], cores[u])
		}
	}
}

// SPDX-License-Identifier: Apache-2.0

// Package e2e drives the whole local stack from Go tests: etcd, kube-apiserver, the
// tessera-scheduler binary, simulated tessera-node-agent processes and kwok, started by
// hack/local-up.sh exactly as `make run` starts them. Each test gets its own cluster and
// asserts only what the API shows: where pods are bound, their assignment annotations,
// and the scheduler's reasons for the pods it refuses.
//
// Run with `make test-e2e`, which builds the binaries first. The binaries are taken from
// $BIN_DIR, or bin/ of the repository.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// Topologies shipped in config/simulated.
const (
	h100Node = "h100-8x-two-nvlink-islands.yaml"
	t4Node   = "t4-4x-pcie.yaml"
	t4MiB    = 15360
)

// waitTimeout bounds every wait. It is a guard against a hung test, not a performance
// assertion: on an idle machine every wait here ends in well under a second.
const waitTimeout = 90 * time.Second

func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

type node struct{ name, topology string }

type clusterOptions struct {
	nodes []node
	// workload applies config/local/workload.yaml, as make run does.
	workload bool
	// staleness is the scheduler's inventoryStaleness; heartbeat the agents'.
	staleness, heartbeat string
}

type cluster struct {
	t          *testing.T
	ctx        context.Context
	root       string
	runDir     string
	env        []string
	kubeconfig string
	client     kubernetes.Interface
}

// startCluster brings a cluster up with hack/local-up.sh and stops it when the test
// ends. The script's TESSERA_OWNER_PID watch stops it too if the test binary dies.
func startCluster(t *testing.T, o clusterOptions) *cluster {
	t.Helper()
	c, args := newCluster(t, o)
	out := c.script("local-up.sh", append(args, "--detach")...)
	t.Logf("cluster up:\n%s", out)
	c.connect()
	return c
}

// newCluster prepares the environment and arguments of hack/local-up.sh for o, and
// registers the cluster's stop; it starts nothing.
func newCluster(t *testing.T, o clusterOptions) (*cluster, []string) {
	t.Helper()
	root := repoRoot(t)
	base := t.TempDir()
	c := &cluster{t: t, ctx: context.Background(), root: root, runDir: filepath.Join(base, "run")}
	args := []string{"--no-build"}
	env := append(os.Environ(), "RUN_DIR="+c.runDir, fmt.Sprintf("TESSERA_OWNER_PID=%d", os.Getpid()))
	if o.nodes != nil {
		var b strings.Builder
		for _, n := range o.nodes {
			fmt.Fprintf(&b, "%s %s 32 256Gi\n", n.name, n.topology)
		}
		nodesFile := filepath.Join(base, "nodes.txt")
		if err := os.WriteFile(nodesFile, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		env = append(env, "NODES_FILE="+nodesFile)
	}
	if !o.workload {
		args = append(args, "--no-workload")
	}
	if o.staleness != "" {
		env = append(env, "INVENTORY_STALENESS="+o.staleness)
	}
	if o.heartbeat != "" {
		env = append(env, "AGENT_HEARTBEAT="+o.heartbeat)
	}
	c.env = env
	c.kubeconfig = filepath.Join(c.runDir, "kubeconfig")
	t.Cleanup(c.stop)
	return c, args
}

func (c *cluster) connect() {
	c.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		c.t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	c.client = kubernetes.NewForConfigOrDie(cfg)
}

// script runs a script of hack/ against this cluster and fails the test if it fails.
func (c *cluster) script(name string, args ...string) string {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(c.root, "hack", name), args...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("hack/%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (c *cluster) stop() {
	if c.t.Failed() {
		for _, l := range []string{"scheduler", "kwok"} {
			b, _ := os.ReadFile(filepath.Join(c.runDir, "logs", l+".log"))
			c.t.Logf("last lines of %s.log:\n%s", l, tail(string(b), 40))
		}
	}
	pids := c.pids()
	cmd := exec.Command(filepath.Join(c.root, "hack", "local-down.sh"))
	cmd.Env = c.env
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Errorf("hack/local-down.sh: %v\n%s", err, out)
	}
	c.checkStopped(pids)
}

// pids reads the processes the scripts recorded for this cluster.
func (c *cluster) pids() map[string]int {
	out := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(c.runDir, "pids", "*.pid"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			out[strings.TrimSuffix(filepath.Base(f), ".pid")] = pid
		}
	}
	return out
}

// checkStopped fails the test for every process of pids that is still running.
func (c *cluster) checkStopped(pids map[string]int) {
	c.t.Helper()
	for name, pid := range pids {
		if alive(pid) {
			c.t.Errorf("%s (pid %d) is still running after the cluster was stopped", name, pid)
		}
	}
}

// alive reports whether pid runs; an exited process not yet reaped by whoever
// inherited it does not count.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// stopComponent and startComponent stop and restart one process of the cluster
// (scheduler, kwok, agent-NODE).
func (c *cluster) stopComponent(name string) { c.t.Helper(); c.script("local-down.sh", name) }
func (c *cluster) startComponent(name string) {
	c.t.Helper()
	c.script("local-up.sh", "--start", name)
}

// kubectlTessera runs bin/kubectl-tessera against this cluster.
func (c *cluster) kubectlTessera(args ...string) string {
	c.t.Helper()
	bin := os.Getenv("BIN_DIR")
	if bin == "" {
		bin = filepath.Join(c.root, "bin")
	}
	cmd := exec.Command(filepath.Join(bin, "kubectl-tessera"), append(args, "--kubeconfig", c.kubeconfig)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("kubectl-tessera %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// --- pods -------------------------------------------------------------------------------

// gpuPod describes a single-container pod asking for GPUs.
type gpuPod struct {
	name      string
	scheduler string
	gpus      int
	memMiB    int // 0: the whole memory of each GPU
	cores     int
	priority  string // PriorityClass name
	ann       map[string]string
}

func (c *cluster) create(p gpuPod) *v1.Pod {
	c.t.Helper()
	if p.scheduler == "" {
		p.scheduler = "tessera-binpack"
	}
	limits := v1.ResourceList{"tessera.dev/gpu": *resource.NewQuantity(int64(p.gpus), resource.DecimalSI)}
	if p.memMiB > 0 {
		limits["tessera.dev/gpu-memory"] = *resource.NewQuantity(int64(p.memMiB), resource.DecimalSI)
	}
	if p.cores > 0 {
		limits["tessera.dev/gpu-cores"] = *resource.NewQuantity(int64(p.cores), resource.DecimalSI)
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "default", Annotations: p.ann},
		Spec: v1.PodSpec{
			SchedulerName:     p.scheduler,
			PriorityClassName: p.priority,
			Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: limits}}},
		},
	}
	got, err := c.client.CoreV1().Pods("default").Create(c.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("creating pod %s: %v", p.name, err)
	}
	return got
}

func (c *cluster) pod(name string) *v1.Pod {
	c.t.Helper()
	p, err := c.client.CoreV1().Pods("default").Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatalf("getting pod %s: %v", name, err)
	}
	return p
}

func (c *cluster) deletePod(name string) {
	c.t.Helper()
	if err := c.client.CoreV1().Pods("default").Delete(c.ctx, name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatalf("deleting pod %s: %v", name, err)
	}
}

// waitFor polls cond until it returns true; on timeout it fails with cond's last word.
func (c *cluster) waitFor(what string, cond func() (bool, string)) {
	c.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	last := ""
	for {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		if time.Now().After(deadline) {
			c.t.Fatalf("waiting for %s: gave up after %s; last state: %s", what, waitTimeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitRunning waits until the pod is bound, carries an assignment and kwok has started it.
func (c *cluster) waitRunning(names ...string) map[string]*v1.Pod {
	c.t.Helper()
	got := map[string]*v1.Pod{}
	for _, n := range names {
		c.waitFor("pod "+n+" running", func() (bool, string) {
			p, err := c.client.CoreV1().Pods("default").Get(c.ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got[n] = p
			_, assigned := p.Annotations[api.AnnotationAssignment]
			return p.Spec.NodeName != "" && assigned && p.Status.Phase == v1.PodRunning,
				fmt.Sprintf("node %q, assigned %v, phase %s, %s", p.Spec.NodeName, assigned, p.Status.Phase, scheduledMessage(p))
		})
	}
	return got
}

// waitUnschedulable waits until the scheduler has refused the pod and returns its reason.
func (c *cluster) waitUnschedulable(name string) string {
	c.t.Helper()
	var msg string
	c.waitFor("pod "+name+" refused by the scheduler", func() (bool, string) {
		p := c.pod(name)
		if p.Spec.NodeName != "" {
			c.t.Fatalf("pod %s was bound to %s; it must not fit", name, p.Spec.NodeName)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
				msg = cond.Message
				return true, ""
			}
		}
		return false, "no Unschedulable condition yet"
	})
	return msg
}

// waitGone waits until the pod object no longer exists.
func (c *cluster) waitGone(name string) {
	c.t.Helper()
	c.waitFor("pod "+name+" deleted", func() (bool, string) {
		_, err := c.client.CoreV1().Pods("default").Get(c.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
	})
}

func scheduledMessage(p *v1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodScheduled {
			return fmt.Sprintf("PodScheduled=%s %s", cond.Status, cond.Message)
		}
	}
	return "no PodScheduled condition"
}

// assignment decodes a pod's assignment; the pod must have one.
func assignment(t *testing.T, p *v1.Pod) *api.PodAssignment {
	t.Helper()
	a, err := api.DecodeAssignment(p.Annotations[api.AnnotationAssignment])
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	if a.Node != p.Spec.NodeName {
		t.Fatalf("pod %s is bound to %s but its assignment names %s", p.Name, p.Spec.NodeName, a.Node)
	}
	return a
}

// uuids lists the GPUs granted to a pod's containers, in order.
func uuids(t *testing.T, p *v1.Pod) []string {
	var out []string
	for _, ca := range assignment(t, p).Containers {
		for _, d := range ca.Devices {
			out = append(out, d.UUID)
		}
	}
	return out
}

func (c *cluster) inventory(nodeName string) *api.NodeInventory {
	c.t.Helper()
	n, err := c.client.CoreV1().Nodes().Get(c.ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	inv, err := api.DecodeInventory(n.Annotations[api.AnnotationInventory])
	if err != nil {
		c.t.Fatalf("node %s: %v", nodeName, err)
	}
	return inv
}

// checkNoOvercommit asserts the invariant every test must leave behind: on every GPU,
// the grants of the pods holding it fit its memory, its cores and each other.
func (c *cluster) checkNoOvercommit() {
	c.t.Helper()
	nodes, err := c.client.CoreV1().Nodes().List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	pods, err := c.client.CoreV1().Pods("").List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, p := range fixtures.CheckGrants(nodes.Items, pods.Items, 10).Problems {
		c.t.Error(p)
	}
}

// nodesOf returns the sorted distinct nodes the pods are bound to.
func nodesOf(pods map[string]*v1.Pod) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range pods {
		if !seen[p.Spec.NodeName] {
			seen[p.Spec.NodeName] = true
			out = append(out, p.Spec.NodeName)
		}
	}
	sort.Strings(out)
	return out
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

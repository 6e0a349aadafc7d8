// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clientset "k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	schedconfig "k8s.io/kubernetes/cmd/kube-scheduler/app/config"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/pkg/scheduler"
	testutils "k8s.io/kubernetes/test/integration/util"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare"
	"github.com/tessera-dev/tessera/plugins/gpushare/draplacement"
	"github.com/tessera-dev/tessera/plugins/noderesourcesfit"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// repoRoot is the repository root, found from this file's location.
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

type cluster struct {
	t          *testing.T
	ctx        context.Context
	client     clientset.Interface
	kubeconfig string
	ns         string
}

// startCluster starts kube-apiserver and etcd in-process.
func startCluster(t *testing.T) *cluster {
	// InitTestAPIServer registers its own cleanup, which deletes the test's objects
	// and then stops the API server.
	tc := testutils.InitTestAPIServer(t, "tessera", nil)
	c := &cluster{t: t, ctx: tc.Ctx, client: tc.ClientSet, ns: tc.NS.Name}
	c.kubeconfig = writeKubeconfig(t, tc.KubeConfig)
	return c
}

func writeKubeconfig(t *testing.T, rc *restclient.Config) string {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthority: rc.CAFile, CertificateAuthorityData: rc.CAData, InsecureSkipTLSVerify: rc.Insecure}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken, TokenFile: rc.BearerTokenFile,
		ClientCertificate: rc.CertFile, ClientCertificateData: rc.CertData, ClientKey: rc.KeyFile, ClientKeyData: rc.KeyData}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// sampleConfig rewrites a config from config/scheduler to point at this cluster,
// without leader election (each test runs one scheduler at a time).
func sampleConfig(t *testing.T, name, kubeconfig string) string {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "scheduler", name))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig, "qps": 500, "burst": 1000}
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// setupScheduler builds the scheduler exactly as the tessera-scheduler binary does:
// kube-scheduler's option parsing and Setup, with the plugin registered.
func setupScheduler(t *testing.T, ctx context.Context, configPath string) (*schedconfig.CompletedConfig, *scheduler.Scheduler) {
	t.Helper()
	opts := options.NewOptions()
	opts.ConfigFile = configPath
	opts.SecureServing.BindPort = 0 // no HTTPS server (and so no delegated auth) in tests
	cc, sched, err := schedapp.Setup(ctx, opts, schedapp.WithPlugin(gpushare.Name, gpushare.NewWithDefaults(&gpushare.Defaults{})),
		schedapp.WithPlugin(noderesourcesfit.Name, noderesourcesfit.New), schedapp.WithPlugin(draplacement.Name, draplacement.New))
	if err != nil {
		t.Fatalf("scheduler setup with %s: %v", filepath.Base(configPath), err)
	}
	return cc, sched
}

// syncScheduler does what kube-scheduler's app.Run does before scheduling, without
// leader election and serving, and minus the process-global configz registration that
// would make a second scheduler in one test process fail: it starts event recording
// and the informers and waits until the caches and handlers hold every object. The
// caller shuts cc.EventBroadcaster down.
func syncScheduler(ctx context.Context, cc *schedconfig.CompletedConfig, sched *scheduler.Scheduler) error {
	cc.EventBroadcaster.StartRecordingToSink(ctx.Done())
	cc.InformerFactory.Start(ctx.Done())
	if cc.DynInformerFactory != nil {
		cc.DynInformerFactory.Start(ctx.Done())
	}
	cc.InformerFactory.WaitForCacheSync(ctx.Done())
	if cc.DynInformerFactory != nil {
		cc.DynInformerFactory.WaitForCacheSync(ctx.Done())
	}
	return sched.WaitForHandlersSync(ctx)
}

// runScheduler syncs the scheduler and runs it until ctx is done.
func runScheduler(ctx context.Context, cc *schedconfig.CompletedConfig, sched *scheduler.Scheduler) {
	defer cc.EventBroadcaster.Shutdown()
	if err := syncScheduler(ctx, cc, sched); err != nil {
		klog.FromContext(ctx).Error(err, "Handlers are not fully synchronized")
	}
	sched.Run(ctx)
}

// runScheduler starts the scheduler with a sample config; the returned stop function
// cancels it and waits until it has returned.
func (c *cluster) startScheduler(config string) (stop func()) {
	ctx, cancel := context.WithCancel(c.ctx)
	ctx = klog.NewContext(ctx, klog.Background())
	cc, sched := setupScheduler(c.t, ctx, sampleConfig(c.t, config, c.kubeconfig))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		runScheduler(ctx, cc, sched)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	c.t.Cleanup(stop)
	return stop
}

// createNode creates a node with capacity for ordinary pods and inv as its inventory.
func (c *cluster) createNode(name string, inv *api.NodeInventory) *v1.Node {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: v1.NodeStatus{
			Capacity:    v1.ResourceList{v1.ResourceCPU: resource.MustParse("256"), v1.ResourceMemory: resource.MustParse("2Ti"), v1.ResourcePods: resource.MustParse("500")},
			Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("256"), v1.ResourceMemory: resource.MustParse("2Ti"), v1.ResourcePods: resource.MustParse("500")},
			Conditions:  []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
		},
	}
	if inv != nil {
		s, err := api.EncodeInventory(inv)
		if err != nil {
			c.t.Fatal(err)
		}
		n.Annotations[api.AnnotationInventory] = s
	}
	got, err := c.client.CoreV1().Nodes().Create(c.ctx, n, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("creating node %s: %v", name, err)
	}
	return got
}

// gpuLimits describes a container's GPU limits; empty fields are left out.
type gpuLimits struct {
	name                 string
	gpu, mem, pct, cores string
}

func newPod(ns, name, scheduler string, ann map[string]string, cs ...gpuLimits) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
		Spec:       v1.PodSpec{SchedulerName: scheduler, TerminationGracePeriodSeconds: new(int64)},
	}
	names := api.DefaultResourceNames()
	for _, c := range cs {
		lim := v1.ResourceList{}
		for rn, v := range map[v1.ResourceName]string{names.GPU: c.gpu, names.GPUMemory: c.mem, names.GPUMemoryPercent: c.pct, names.GPUCores: c.cores} {
			if v != "" {
				lim[rn] = resource.MustParse(v)
			}
		}
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: c.name, Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Limits: lim}})
	}
	return p
}

func (c *cluster) createPod(p *v1.Pod) *v1.Pod {
	got, err := c.client.CoreV1().Pods(p.Namespace).Create(c.ctx, p, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("creating pod %s: %v", p.Name, err)
	}
	return got
}

// waitBound waits for a pod to be bound and returns it.
func (c *cluster) waitBound(name string, timeout time.Duration) *v1.Pod {
	c.t.Helper()
	var pod *v1.Pod
	err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := c.client.CoreV1().Pods(c.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		return p.Spec.NodeName != "", nil
	})
	if err != nil {
		c.t.Fatalf("pod %s not bound after %s: %s", name, timeout, c.describe(name))
	}
	return pod
}

// waitUnschedulable waits until the scheduler reports the pod unschedulable and
// returns the condition's message.
func (c *cluster) waitUnschedulable(name string, timeout time.Duration) string {
	c.t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := c.client.CoreV1().Pods(c.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
				msg = cond.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		c.t.Fatalf("pod %s not reported unschedulable after %s: %s", name, timeout, c.describe(name))
	}
	return msg
}

func (c *cluster) describe(name string) string {
	p, err := c.client.CoreV1().Pods(c.ns).Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "node=%q", p.Spec.NodeName)
	for _, cond := range p.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s(%s: %s)", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	return b.String()
}

// assignment decodes a bound pod's assignment annotation.
func assignment(t *testing.T, p *v1.Pod) *api.PodAssignment {
	t.Helper()
	raw, ok := p.Annotations[api.AnnotationAssignment]
	if !ok {
		t.Fatalf("pod %s bound to %s without %s", p.Name, p.Spec.NodeName, api.AnnotationAssignment)
	}
	a, err := api.DecodeAssignment(raw)
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	if a.Node != p.Spec.NodeName {
		t.Fatalf("pod %s bound to %s but assigned GPUs of %s", p.Name, p.Spec.NodeName, a.Node)
	}
	return a
}

// checkGrants fails the test if any GPU is granted more memory, cores or tenants
// than it has (fixtures.CheckGrants); it returns the number of pods holding GPUs.
func (c *cluster) checkGrants(maxTenants int) int {
	c.t.Helper()
	nodes, err := c.client.CoreV1().Nodes().List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	pods, err := c.client.CoreV1().Pods(metav1.NamespaceAll).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	r := fixtures.CheckGrants(nodes.Items, pods.Items, maxTenants)
	for _, p := range r.Problems {
		c.t.Error(p)
	}
	return r.Holders
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

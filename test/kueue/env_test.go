// SPDX-License-Identifier: Apache-2.0

package kueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	qcache "sigs.k8s.io/kueue/pkg/cache/queue"
	schdcache "sigs.k8s.io/kueue/pkg/cache/scheduler"
	"sigs.k8s.io/kueue/pkg/constants"
	"sigs.k8s.io/kueue/pkg/controller/core"
	"sigs.k8s.io/kueue/pkg/controller/core/indexer"
	"sigs.k8s.io/kueue/pkg/controller/jobframework"
	"sigs.k8s.io/kueue/pkg/controller/jobs/job"
	"sigs.k8s.io/kueue/pkg/scheduler"
	preemptexpectations "sigs.k8s.io/kueue/pkg/scheduler/preemption/expectations"
)

const (
	// quotaPolicy names the chart's quota policies and their bindings.
	quotaPolicy = "tessera-quota-resources"
	// timeout bounds every wait: Kueue admits within a second or two here.
	timeout = 60 * time.Second
)

// requestNames is the prefix of the request names, which Kueue is told to ignore as
// docs/quotas.md says: Kueue admits no workload that requests a resource no
// resourceGroups entry covers, and the per-GPU names (tessera.dev/gpu, gpu-memory,
// gpu-memory-percent, gpu-cores) are not what a queue should count. No quota resource
// starts with it.
const requestNames = "tessera.dev/gpu"

// repoRoot is the repository root, found from this file's location.
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

type env struct {
	ctx    context.Context
	client client.Client
	log    *lockedBuffer
}

// startEnv starts etcd and kube-apiserver (the ones the main module builds) with
// Kueue's CRDs, applies the chart's quota policies and starts Kueue's controllers and
// scheduler in-process, ignoring the resources of the excluded prefixes. Everything
// stops at the test's end.
func startEnv(t *testing.T, excluded ...string) *env {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	scheme := kruntime.NewScheme()
	for _, add := range []func(*kruntime.Scheme) error{clientgoscheme.AddToScheme, kueue.AddToScheme, configapi.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory: assetsDir(t),
		CRDDirectoryPaths:     []string{kueueCRDs(t)},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := te.Start()
	if err != nil {
		t.Fatalf("starting etcd and kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := te.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{ctx: ctx, client: c, log: &lockedBuffer{}}
	applyQuotaPolicies(t, ctx, cfg)
	e.waitForMutation(t)
	e.startKueue(t, cfg, scheme, excluded)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Kueue's log, last lines:\n%s", e.log.tail(100))
		}
	})
	return e
}

// assetsDir is where etcd and kube-apiserver are: KUBEBUILDER_ASSETS (make test-kueue
// sets it), else the repository's bin/, where make builds them.
func assetsDir(t *testing.T) string {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(repoRoot(t), "bin")
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%s: %v (make test-kueue builds it)", b, err)
		}
	}
	return dir
}

// kueueCRDs is the directory of Kueue's CRDs in the module cache, for the version
// go.mod requires: the CRDs and the controllers always match.
func kueueCRDs(t *testing.T) string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kueue").Output()
	if err != nil {
		t.Fatalf("locating the kueue module: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "config", "components", "crd", "bases")
}

// policyResources are the kinds the chart's quota objects have, with their resources.
var policyResources = map[string]string{
	"MutatingAdmissionPolicy":          "mutatingadmissionpolicies",
	"MutatingAdmissionPolicyBinding":   "mutatingadmissionpolicybindings",
	"ValidatingAdmissionPolicy":        "validatingadmissionpolicies",
	"ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}

// applyQuotaPolicies creates the four tessera-quota-resources objects of the rendered
// chart, as checked in, so the test runs what a user installs.
func applyQuotaPolicies(t *testing.T, ctx context.Context, cfg *rest.Config) {
	path := filepath.Join(repoRoot(t), "config", "deploy", "manifests", "tessera.yaml")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	applied := 0
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		u := unstructured.Unstructured{Object: m}
		res, ok := policyResources[u.GetKind()]
		if m == nil || !ok || u.GetName() != quotaPolicy {
			continue
		}
		gvr := schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: res}
		if _, err := dc.Resource(gvr).Create(ctx, &u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		applied++
	}
	if applied != len(policyResources) {
		t.Fatalf("%s holds %d %s objects, want a mutating and a validating policy with their bindings", path, applied, quotaPolicy)
	}
}

// waitForMutation waits until the API server applies the new policies (it loads them
// asynchronously): a dry-run Job of 2 GPUs of 8192 MiB must come back holding 16384.
func (e *env) waitForMutation(t *testing.T) {
	probe := gpuJob("default", "probe", "", map[string]string{gpuRes: "2", memRes: "8192"})
	e.eventually(t, "the quota policies to mutate a Job", func() (bool, string) {
		j := probe.DeepCopy()
		if err := e.client.Create(e.ctx, j, client.DryRunAll); err != nil {
			return false, err.Error()
		}
		got := quotaOf(&j.Spec.Template.Spec.Containers[0])
		return got[totalMem] == 16384, fmt.Sprint(got)
	})
}

// startKueue wires Kueue's manager as its own main does (cmd/kueue), with the batch/v1
// Job integration only and no webhooks: the tests create Jobs suspended and labelled
// with their LocalQueue, which is what Kueue's Job webhook would ensure.
func (e *env) startKueue(t *testing.T, cfg *rest.Config, scheme *kruntime.Scheme, excluded []string) {
	ctrl.SetLogger(zap.New(zap.WriteTo(e.log)))
	kcfg := &configapi.Configuration{Resources: &configapi.Resources{ExcludeResourcePrefixes: excluded}}
	scheme.Default(kcfg)
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             crconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	cc := schdcache.New(mgr.GetClient(), schdcache.WithExcludedResourcePrefixes(excluded))
	requeuer := qcache.NewRequeuer()
	must(t, "the requeuer", mgr.Add(requeuer))
	expectations := preemptexpectations.New()
	queues := qcache.NewManager(mgr.GetClient(), cc, requeuer,
		qcache.WithPreemptionExpectations(expectations), qcache.WithExcludedResourcePrefixes(excluded))

	ctx, cancel := context.WithCancel(e.ctx)
	must(t, "Kueue's indexes", indexer.Setup(ctx, mgr.GetFieldIndexer()))
	must(t, "the Job indexes", job.SetupIndexes(ctx, mgr.GetFieldIndexer()))
	if failed, err := core.SetupControllers(mgr, queues, cc, kcfg, nil, expectations, nil); err != nil {
		t.Fatalf("setting up Kueue's %s controller: %v", failed, err)
	}
	r, err := job.NewReconciler(ctx, mgr.GetClient(), mgr.GetFieldIndexer(), mgr.GetEventRecorderFor(constants.JobControllerName),
		jobframework.WithCache(cc), jobframework.WithQueues(queues), jobframework.WithManagerName(constants.KueueName))
	must(t, "the Job reconciler", err)
	must(t, "the Job reconciler", r.SetupWithManager(mgr))
	jobframework.EnableIntegration(job.FrameworkName)
	sched := scheduler.New(queues, cc, mgr.GetClient(), mgr.GetEventRecorderFor(constants.AdmissionName),
		scheduler.WithPreemptionExpectations(expectations))
	must(t, "the scheduler", mgr.Add(sched))

	go queues.CleanUpOnContext(ctx)
	go cc.CleanUpOnContext(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Kueue's manager: %v", err)
		}
	})
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("setting up %s: %v", what, err)
	}
}

// eventually polls cond until it holds, failing the test after timeout with the last
// state cond described.
func (e *env) eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		var ok bool
		ok, last = cond()
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v; last seen: %s", what, err, last)
	}
}

// gpuJob is a suspended Job in queue (none: no label) whose one container asks the
// given limits, as a user writes it: Tessera's request names only.
func gpuJob(ns, name, queue string, limits map[string]string) *batchv1.Job {
	rl := v1.ResourceList{}
	for k, v := range limits {
		rl[v1.ResourceName(k)] = resource.MustParse(v)
	}
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.JobSpec{
			Suspend: ptr.To(true),
			Template: v1.PodTemplateSpec{Spec: v1.PodSpec{
				RestartPolicy: v1.RestartPolicyNever,
				Containers: []v1.Container{{Name: "c0", Image: "registry.k8s.io/pause:3.10",
					Resources: v1.ResourceRequirements{Limits: rl}}},
			}},
		},
	}
	if queue != "" {
		j.Labels = map[string]string{"kueue.x-k8s.io/queue-name": queue}
	}
	return j
}

// lockedBuffer collects Kueue's log, shown when a test fails.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	lines := strings.Split(strings.TrimRight(b.buf.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

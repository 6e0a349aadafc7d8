// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	clientset "k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/capabilities"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/config/deploy"
	"github.com/tessera-dev/tessera/node-agent/inventory"
	"github.com/tessera-dev/tessera/plugins/noderesourcesfit"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// The chart tests render config/deploy/tessera with the Helm library and send it to the
// real API server: every object through server-side apply in dry-run mode (schema,
// defaulting, validation and admission, nothing stored), then for real, to run the
// Tessera scheduler and the node agent's API calls under the chart's own service
// accounts.

// chartRelease is the release name the tests install under.
const chartRelease = "tessera"

// applier sends objects to the API server with server-side apply.
type applier struct {
	t      *testing.T
	ctx    context.Context
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func (c *cluster) applier() *applier {
	rc := c.restConfig()
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		c.t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		c.t.Fatal(err)
	}
	return &applier{t: c.t, ctx: c.ctx, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

// restConfig is the administrator's client configuration of this cluster.
func (c *cluster) restConfig() *restclient.Config {
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		c.t.Fatal(err)
	}
	return rc
}

// apply applies one YAML object; dryRun asks the server to do everything but store it.
// Unknown or duplicate fields are errors (fieldValidation=Strict).
func (a *applier) apply(doc string, dryRun bool) error {
	obj := &unstructured.Unstructured{}
	if err := yaml.UnmarshalStrict([]byte(doc), &obj.Object); err != nil {
		return fmt.Errorf("parsing: %w", err)
	}
	gvk := obj.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset() // a CRD created since the last discovery
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	data, err := obj.MarshalJSON()
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: "tessera-chart-test", Force: new(bool), FieldValidation: metav1.FieldValidationStrict}
	*opts.Force = true
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Patch(a.ctx, obj.GetName(), types.ApplyPatchType, data, opts)
	return err
}

// applyAll applies manifests in order, failing the test on the first error.
func (a *applier) applyAll(ms []deploy.Manifest, dryRun bool) {
	a.t.Helper()
	for _, m := range ms {
		if err := a.apply(m.YAML, dryRun); err != nil {
			a.t.Fatalf("applying %s %s (from %s, dry run %v): %v", m.Kind, m.Name, m.Source, dryRun, err)
		}
	}
}

func (c *cluster) renderChart(o deploy.Options) []deploy.Manifest {
	c.t.Helper()
	o.ChartDir = deploy.ChartDir(repoRoot(c.t))
	if o.Release == "" {
		o.Release = chartRelease
	}
	// As helm install renders it: for the server's Kubernetes and the API versions
	// and kinds its discovery lists.
	if o.KubeVersion == "" {
		o.KubeVersion = builtKubeVersion(c.t)
	}
	o.APIVersions = append(o.APIVersions, c.discoveredAPIVersions()...)
	ms, err := deploy.Render(o)
	if err != nil {
		c.t.Fatalf("rendering the chart: %v", err)
	}
	return ms
}

// builtKubeVersion is the Kubernetes minor this test binary is built with, and so the
// in-process API server's (which reports v0.0.0 without release ldflags): the minor of
// its k8s<minor> build tag where make test-integration K8S_MINOR=<minor> built it in
// that minor's module (build/k8s-minors), else the repository's pin. Test binaries
// carry their build tags in their build information, not their modules.
func builtKubeVersion(t testing.TB) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build information in the test binary")
	}
	for _, s := range bi.Settings {
		if s.Key != "-tags" {
			continue
		}
		for _, tag := range strings.Split(s.Value, ",") {
			if minor, ok := strings.CutPrefix(tag, "k8s"); ok {
				return minor + ".0"
			}
		}
	}
	return deploy.DefaultKubeVersion
}

// kubeMinor is "1.34" of "1.34.4".
func kubeMinor(version string) string {
	parts := strings.SplitN(version, ".", 3)
	return strings.Join(parts[:min(2, len(parts))], ".")
}

// discoveredAPIVersions lists the server's group/versions and group/version/Kinds,
// as Helm fills .Capabilities.APIVersions on install.
func (c *cluster) discoveredAPIVersions() []string {
	c.t.Helper()
	_, lists, err := c.client.Discovery().ServerGroupsAndResources()
	if err != nil {
		c.t.Fatalf("discovery: %v", err)
	}
	var out []string
	for _, l := range lists {
		out = append(out, l.GroupVersion)
		for _, r := range l.APIResources {
			if !strings.Contains(r.Name, "/") {
				out = append(out, l.GroupVersion+"/"+r.Kind)
			}
		}
	}
	return out
}

// servesMutatingPolicies reports whether the server serves MutatingAdmissionPolicy
// (GA from Kubernetes 1.36; in 1.34 and 1.35 a beta the API server must turn on),
// without which the chart renders none.
func (c *cluster) servesMutatingPolicies() bool {
	return slices.Contains(c.discoveredAPIVersions(), "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
}

// needMutatingPolicies skips a test of the chart's MutatingAdmissionPolicies on a
// server that does not serve them (make test-integration K8S_MINOR=1.34): the chart
// renders none there, which TestChartMutatingPoliciesPerMinor checks.
func (c *cluster) needMutatingPolicies(t *testing.T) {
	if !c.servesMutatingPolicies() {
		t.Skipf("Kubernetes %s serves no MutatingAdmissionPolicy (beta, off by default, before 1.36)", builtKubeVersion(t))
	}
}

// withT is the cluster as seen from a subtest: helpers fail the subtest, not its parent.
func (c *cluster) withT(t *testing.T) *cluster {
	cc := *c
	cc.t = t
	return &cc
}

// allowPrivileged lets the API server accept privileged containers, as real clusters
// do (kube-apiserver --allow-privileged=true, kubeadm's default); the test server
// leaves them off. The setting is process-wide and only ever widened here.
func allowPrivileged() {
	capabilities.ResetForTest()
	capabilities.Initialize(capabilities.Capabilities{AllowPrivileged: true})
}

func (c *cluster) createNamespace(name string) {
	_, err := c.client.CoreV1().Namespaces().Create(c.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// TestChartDryRun applies the chart, rendered for the default values and for a
// non-default set, to the API server with server-side dry-run.
func TestChartDryRun(t *testing.T) {
	parent := startCluster(t)
	allowPrivileged()
	a := parent.applier()

	t.Run("defaults", func(t *testing.T) {
		c := parent.withT(t)
		c.createNamespace("tessera-system")
		ms := c.renderChart(deploy.Options{Namespace: "tessera-system"})
		a.applyAll(ms, true)
		// Dry run stored nothing.
		if _, err := c.client.AppsV1().DaemonSets("tessera-system").Get(c.ctx, "tessera-node-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("dry run stored the DaemonSet (err %v)", err)
		}
	})

	t.Run("DRA mode", func(t *testing.T) {
		c := parent.withT(t)
		a := *a
		a.t = t
		c.createNamespace("tessera-dra")
		ms := c.renderChart(deploy.Options{Namespace: "tessera-dra", Set: []string{"agent.dra.enabled=true"}})
		n := 0
		for _, m := range ms {
			if m.Kind == "DaemonSet" || m.Kind == "DeviceClass" {
				n++
			}
		}
		if n != 4 {
			t.Fatalf("%d DaemonSets and DeviceClasses rendered, want the two agents and the two classes (shares, whole GPUs)", n)
		}
		a.applyAll(ms, true)
	})

	t.Run("plain manifests", func(t *testing.T) {
		if v := builtKubeVersion(t); kubeMinor(v) != kubeMinor(deploy.DefaultKubeVersion) {
			t.Skipf("the plain manifests are rendered for Kubernetes %s; this server is %s", deploy.DefaultKubeVersion, v)
		}
		a := *a
		a.t = t
		// The file users apply without Helm, namespace included; the namespace must be
		// created for real first, as kubectl apply -f would do in order.
		raw, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "deploy", "manifests", "tessera.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		docs := strings.Split(string(raw), "\n---\n")
		n := 0
		for _, d := range docs {
			if !strings.Contains(d, "kind:") {
				continue
			}
			n++
			if strings.Contains(d, "\nkind: Namespace\n") {
				continue // created by the "defaults" subtest
			}
			if err := a.apply(d, true); err != nil {
				t.Errorf("%v in:\n%s", err, d)
			}
		}
		if n < 15 {
			t.Errorf("only %d objects in the plain manifests", n)
		}
	})

	t.Run("non-default", func(t *testing.T) {
		c := parent.withT(t)
		a := *a
		a.t = t
		c.createNamespace("gpu-platform")
		values := filepath.Join(t.TempDir(), "values.yaml")
		chartWriteFile(t, values, `
resourceNames: {gpu: nvidia.com/gpu, gpuMemory: nvidia.com/gpumem, gpuMemoryPercent: nvidia.com/gpumem-percentage, gpuCores: nvidia.com/gpucores}
image: {registry: registry.example.com/gpu, pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
commonLabels: {team: platform}
scheduler:
  replicas: 3
  image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
  leaderElection: {leaseName: gpu-sched, leaseDuration: 30s}
  profiles:
    - {schedulerName: gpu-pack, nodePolicy: Binpack, devicePolicy: Binpack, args: {maxTenantsPerGPU: 4}}
    - {schedulerName: gpu-pack-nodes-spread-gpus, nodePolicy: Binpack, devicePolicy: Spread}
    - {schedulerName: gpu-spread, nodePolicy: Spread, devicePolicy: Spread, args: {topologyWeight: 5}}
  defaultNodePolicy: Spread
  logFormat: json
  extraArgs: [--kube-api-qps=200]
  priorityClassName: system-cluster-critical
  metrics: {serviceMonitor: {enabled: true, labels: {release: prometheus}}}
agent:
  nodeSelector: {nvidia.com/gpu.present: "true"}
  tolerations: []
  runtimeClassName: nvidia
  hostPaths: {nriSocket: /run/containerd/nri/nri.sock, hookDir: /opt/tessera/lib, limitsRoot: /run/gpu-limits, stateDir: /var/lib/gpu-agent}
  watchdog: {action: kill, grace: 10s}
  extraEnv: [{name: LD_LIBRARY_PATH, value: /run/nvidia/driver/usr/lib64}]
  extraVolumes: [{name: driver, hostPath: {path: /run/nvidia/driver}}]
  extraVolumeMounts: [{name: driver, mountPath: /run/nvidia/driver, readOnly: true}]
  metrics: {port: 9500, serviceMonitor: {enabled: true}}
`)
		ms := c.renderChart(deploy.Options{Release: "gpu", Namespace: "gpu-platform", ValueFiles: []string{values},
			Set: []string{"agent.devicePlugin.replicas=16"}, APIVersions: []string{"monitoring.coreos.com/v1"}})
		// The test API server serves no CRDs, so ServiceMonitors are checked against
		// the Services they must scrape instead of being applied.
		var rest, monitors []deploy.Manifest
		for _, m := range ms {
			if m.Kind == "ServiceMonitor" {
				monitors = append(monitors, m)
			} else {
				rest = append(rest, m)
			}
		}
		if len(monitors) != 2 {
			t.Errorf("%d ServiceMonitors rendered, want 2", len(monitors))
		}
		checkServiceMonitors(t, monitors, rest)
		a.applyAll(rest, true)
	})
}

// checkServiceMonitors checks that each ServiceMonitor selects exactly one of the
// chart's Services, in its namespace, and scrapes a port that Service names.
func checkServiceMonitors(t *testing.T, monitors, others []deploy.Manifest) {
	t.Helper()
	var services []v1.Service
	for _, m := range others {
		if m.Kind == "Service" {
			var s v1.Service
			if err := yaml.UnmarshalStrict([]byte(m.YAML), &s); err != nil {
				t.Fatal(err)
			}
			services = append(services, s)
		}
	}
	for _, m := range monitors {
		var sm struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
			Spec     struct {
				Selector          metav1.LabelSelector `json:"selector"`
				NamespaceSelector struct {
					MatchNames []string `json:"matchNames"`
				} `json:"namespaceSelector"`
				Endpoints []struct {
					Port string `json:"port"`
				} `json:"endpoints"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(m.YAML), &sm); err != nil {
			t.Fatal(err)
		}
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Fatalf("ServiceMonitor %s: %v", sm.Metadata.Name, err)
		}
		var matched []v1.Service
		for _, s := range services {
			if sel.Matches(labels.Set(s.Labels)) && len(sm.Spec.NamespaceSelector.MatchNames) == 1 && sm.Spec.NamespaceSelector.MatchNames[0] == s.Namespace {
				matched = append(matched, s)
			}
		}
		if len(matched) != 1 {
			t.Errorf("ServiceMonitor %s selects %d Services, want 1", sm.Metadata.Name, len(matched))
			continue
		}
		for _, ep := range sm.Spec.Endpoints {
			found := false
			for _, p := range matched[0].Spec.Ports {
				found = found || p.Name == ep.Port
			}
			if !found {
				t.Errorf("ServiceMonitor %s scrapes port %q, which Service %s does not name", sm.Metadata.Name, ep.Port, matched[0].Name)
			}
		}
	}
}

// TestChartRBAC installs the chart's service accounts and RBAC, then runs the Tessera
// scheduler with the chart's own configuration under its service account's token
// (leader election included) and schedules a GPU pod end to end; and checks the node
// agent's API calls under its service account: its own Node yes, any other no.
func TestChartRBAC(t *testing.T) {
	parent := startCluster(t)
	a := parent.applier()
	ns := parent.ns
	c := parent
	// Without MutatingAdmissionPolicy (1.34 and 1.35 by default) the chart's quota
	// check stands alone and the GPU pods below, which carry no quota resources, would
	// be refused: install without quota there (TestChartQuotaCheckAlone covers it).
	mutating := c.servesMutatingPolicies()
	// DRA mode on: its RBAC and own-slices policy are checked with the agent's below.
	// Without the whole-GPU DeviceClass: this test's nodes have no kubelet, so no
	// device plugin advertises tessera.dev/gpu on them, and with a class naming it in
	// extendedResourceName the scheduler would leave their GPU pods to DRA, as it does
	// on nodes in DRA mode (TestDRAWholeGPUsByExtendedResource).
	set := []string{"agent.dra.enabled=true", "agent.dra.wholeGPUClass=false"}
	if !mutating {
		set = append(set, "quota.enabled=false")
	}
	ms := c.renderChart(deploy.Options{Namespace: ns, Set: set})
	var schedulerConfig string
	var install []deploy.Manifest
	for _, m := range ms {
		switch m.Kind {
		case "Deployment", "DaemonSet":
			// No controllers run here; the tests below play the pods' part.
			continue
		case "ConfigMap":
			var cm v1.ConfigMap
			if err := yaml.Unmarshal([]byte(m.YAML), &cm); err != nil {
				t.Fatal(err)
			}
			schedulerConfig = cm.Data["scheduler-config.yaml"]
		}
		install = append(install, m)
	}
	a.applyAll(install, false)

	t.Run("scheduler", func(t *testing.T) {
		c := parent.withT(t)
		kubeconfig := c.serviceAccountKubeconfig(ns, "tessera-scheduler", nil)
		sa := c.clientFor(kubeconfig)

		// Delegated authentication and authorization of the scheduler's HTTPS port.
		if _, err := sa.CoreV1().ConfigMaps("kube-system").Get(c.ctx, "extension-apiserver-authentication", metav1.GetOptions{}); err != nil {
			t.Errorf("reading the authentication ConfigMap: %v", err)
		}
		if _, err := sa.AuthenticationV1().TokenReviews().Create(c.ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "x"}}, metav1.CreateOptions{}); err != nil {
			t.Errorf("creating a TokenReview: %v", err)
		}
		if _, err := sa.AuthorizationV1().SubjectAccessReviews().Create(c.ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "someone", NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}}}, metav1.CreateOptions{}); err != nil {
			t.Errorf("creating a SubjectAccessReview: %v", err)
		}
		// Least privilege: what the scheduler must not do.
		// The assignment travels in the binding (assignmentWrite: Binding, the default),
		// so the scheduler needs no write on pods beyond kube-scheduler's own.
		for _, chk := range []authorizationv1.ResourceAttributes{
			{Verb: "update", Resource: "pods"},
			{Verb: "patch", Resource: "pods", Namespace: ns},
			{Verb: "patch", Resource: "nodes"},
			{Verb: "get", Resource: "secrets", Namespace: ns},
			{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: ns, Name: "some-other-lease"},
		} {
			if c.allowed(sa, chk) {
				t.Errorf("the scheduler's service account may %s %s %s/%s", chk.Verb, chk.Resource, chk.Namespace, chk.Name)
			}
		}

		c.createNode("gpu-0", fixtures.NVLinkNode("gpu-0", 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB))
		stop := c.startChartScheduler(schedulerConfig, kubeconfig)
		defer stop()
		c.createPod(newPod(ns, "fraction", "tessera-binpack", nil, gpuLimits{name: "c", gpu: "1", mem: "20000", cores: "30"}))
		p := c.waitBound("fraction", 60*time.Second)
		d := assignment(t, p).Containers[0].Devices[0]
		if d.MemoryMiB != 20000 || d.Cores != 30 {
			t.Errorf("granted %+v, want 20000 MiB and 30%% cores", d)
		}
		// The chart's quota policy gave the pod its quota resources, which no node
		// advertises: the chart's scheduler placed it all the same.
		if q, want := p.Spec.Containers[0].Resources.Requests[api.ResourceTotalGPUMemory], int64(20000); mutating && q.Value() != want {
			t.Errorf("bound pod's %s request %s, want %d", api.ResourceTotalGPUMemory, q.String(), want)
		}
		lease, err := c.client.CoordinationV1().Leases(ns).Get(c.ctx, "tessera-scheduler", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the scheduler's lease: %v", err)
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			t.Errorf("lease %s has no holder", lease.Name)
		}
		c.createPod(newPod(ns, "spread", "tessera-spread", nil, gpuLimits{name: "c", gpu: "2", pct: "50"}))
		if a := assignment(t, c.waitBound("spread", 60*time.Second)); len(a.Containers[0].Devices) != 2 {
			t.Errorf("spread pod granted %d GPUs, want 2", len(a.Containers[0].Devices))
		}

		c.createPod(newPod(ns, "fragmentation", "tessera-fragmentation", nil, gpuLimits{name: "c", gpu: "1", mem: "1000", cores: "10"}))
		if d := assignment(t, c.waitBound("fragmentation", 60*time.Second)).Containers[0].Devices[0]; d.MemoryMiB != 1000 {
			t.Errorf("fragmentation pod granted %+v, want 1000 MiB", d)
		}
	})

	t.Run("node agent", func(t *testing.T) {
		c := parent.withT(t)
		c.createNode("agent-a", nil)
		c.createNode("agent-b", nil)
		// The agent's pod on agent-a: its token is bound to it and so names agent-a.
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "tessera-node-agent-a", Namespace: ns},
			Spec: v1.PodSpec{NodeName: "agent-a", ServiceAccountName: "tessera-node-agent",
				Containers: []v1.Container{{Name: "agent", Image: "registry.k8s.io/pause:3.10"}}},
		}
		pod = c.createPod(pod)
		agent := c.clientFor(c.serviceAccountKubeconfig(ns, "tessera-node-agent", pod))
		unbound := c.clientFor(c.serviceAccountKubeconfig(ns, "tessera-node-agent", nil))

		inv := fixtures.PCIeNode("agent-a", 2, "Tesla T4", fixtures.T4MiB)
		value, err := api.EncodeInventory(inv)
		if err != nil {
			t.Fatal(err)
		}
		// Exactly the patch the agent's inventory publisher sends.
		publish, err := inventory.Patch(value, inventory.Labels(inv))
		if err != nil {
			t.Fatal(err)
		}
		patchNode := func(cs clientset.Interface, node string, patch []byte) error {
			_, err := cs.CoreV1().Nodes().Patch(c.ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "tessera-node-agent"})
			return err
		}
		// The admission policy is enforced once the API server has loaded it.
		chartWaitFor(t, c.ctx, "the node restriction policy to be enforced", func() bool {
			return apierrors.IsForbidden(patchNode(agent, "agent-b", publish)) || apierrors.IsInvalid(patchNode(agent, "agent-b", publish))
		})
		if err := patchNode(agent, "agent-a", publish); err != nil {
			t.Fatalf("the agent cannot publish to its own node: %v", err)
		}
		n, err := c.client.CoreV1().Nodes().Get(c.ctx, "agent-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := api.DecodeInventory(n.Annotations[api.AnnotationInventory]); err != nil || n.Labels[api.LabelCount] != "2" {
			t.Errorf("inventory not published: %v, labels %v", err, n.Labels)
		}
		for _, tc := range []struct {
			name   string
			cs     clientset.Interface
			node   string
			patch  string
			reason string
		}{
			{"another node", agent, "agent-b", string(publish), "may not change node agent-b"},
			{"a token not bound to its pod", unbound, "agent-a", string(publish), "token bound to its pod"},
			{"a label outside tessera.dev", agent, "agent-a", `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`, "only tessera.dev/ labels"},
			{"removing a label", agent, "agent-a", `{"metadata":{"labels":{"kubernetes.io/hostname":null}}}`, "only tessera.dev/ labels"},
			{"an annotation outside tessera.dev", agent, "agent-a", `{"metadata":{"annotations":{"example.com/x":"y"}}}`, "only tessera.dev/ annotations"},
			{"the node's spec", agent, "agent-a", `{"spec":{"unschedulable":true}}`, "spec"},
		} {
			err := patchNode(tc.cs, tc.node, []byte(tc.patch))
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("%s: error %v, want a denial mentioning %q", tc.name, err, tc.reason)
			}
		}
		// Its other calls: the node's pods, events.
		if _, err := agent.CoreV1().Pods("").List(c.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=agent-a"}); err != nil {
			t.Errorf("listing the node's pods: %v", err)
		}
		ev := &v1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "tessera-", Namespace: ns}, InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name},
			Reason: "GPUContainerRefused", Message: "test", Type: v1.EventTypeWarning, Source: v1.EventSource{Component: "tessera-node-agent", Host: "agent-a"}}
		if _, err := agent.CoreV1().Events(ns).Create(c.ctx, ev, metav1.CreateOptions{}); err != nil {
			t.Errorf("recording an event: %v", err)
		}
		// Its metrics endpoint delegates authentication and authorization: the agent asks
		// the API server about a scraper's token and its right to get /metrics.
		for _, chk := range []authorizationv1.ResourceAttributes{
			{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"},
			{Verb: "create", Group: "authorization.k8s.io", Resource: "subjectaccessreviews"},
		} {
			if !c.allowed(agent, chk) {
				t.Errorf("the agent's service account may not create %s.%s", chk.Resource, chk.Group)
			}
		}
		tr, err := agent.AuthenticationV1().TokenReviews().Create(c.ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: "not-a-token"}}, metav1.CreateOptions{})
		if err != nil || tr.Status.Authenticated {
			t.Errorf("the agent's token review of a forged token: %v, %+v", err, tr)
		}
		sar, err := agent.AuthorizationV1().SubjectAccessReviews().Create(c.ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: "system:serviceaccount:" + ns + ":tenant-scraper",
				NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}}}, metav1.CreateOptions{})
		if err != nil || sar.Status.Allowed {
			t.Errorf("the agent's access review of a tenant getting /metrics: %v, %+v", err, sar)
		}
		// The watchdog evicts a pod that keeps coming back over its GPU memory grant:
		// through the Eviction API only (PodDisruptionBudgets hold), never a delete.
		if !c.allowed(agent, authorizationv1.ResourceAttributes{Verb: "create", Resource: "pods", Subresource: "eviction", Namespace: ns}) {
			t.Errorf("the agent's service account may not create pods/eviction")
		}
		for _, chk := range []authorizationv1.ResourceAttributes{
			{Verb: "get", Resource: "secrets", Namespace: ns},
			{Verb: "patch", Resource: "pods", Namespace: ns},
			{Verb: "delete", Resource: "pods", Namespace: ns},
			{Verb: "get", Resource: "pods", Subresource: "eviction", Namespace: ns},
			{Verb: "create", Resource: "pods", Subresource: "exec", Namespace: ns},
			{Verb: "delete", Resource: "nodes"},
			{Verb: "patch", Resource: "nodes", Subresource: "status"},
		} {
			if c.allowed(agent, chk) {
				t.Errorf("the agent's service account may %s %s/%s", chk.Verb, chk.Resource, chk.Subresource)
			}
		}
		for _, name := range []string{"tessera-node-agent-own-node", "tessera-node-agent-own-slices"} {
			vap, err := c.client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(c.ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tc := vap.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
				t.Errorf("%s does not type-check: %+v", name, tc.ExpressionWarnings)
			}
		}

		// DRA mode: the agent publishes its own node's gpu.tessera.dev slices and no
		// other.
		slice := func(name, node, driver string) *resourceapi.ResourceSlice {
			return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node),
					Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
					Devices: []resourceapi.Device{{Name: "gpu-0"}}}}
		}
		createSlice := func(cs clientset.Interface, s *resourceapi.ResourceSlice) error {
			_, err := cs.ResourceV1().ResourceSlices().Create(c.ctx, s, metav1.CreateOptions{})
			return err
		}
		refused := func(err error) bool {
			return err != nil && (apierrors.IsForbidden(err) || apierrors.IsInvalid(err))
		}
		chartWaitFor(t, c.ctx, "the own-slices policy to be enforced", func() bool {
			return refused(createSlice(agent, slice("probe-b", "agent-b", "gpu.tessera.dev")))
		})
		if err := createSlice(agent, slice("agent-a-gpu", "agent-a", "gpu.tessera.dev")); err != nil {
			t.Fatalf("the agent cannot publish its own node's slice: %v", err)
		}
		own, err := agent.ResourceV1().ResourceSlices().Get(c.ctx, "agent-a-gpu", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		own.Spec.Pool.Generation = 2
		if _, err := agent.ResourceV1().ResourceSlices().Update(c.ctx, own, metav1.UpdateOptions{}); err != nil {
			t.Errorf("the agent cannot update its own node's slice: %v", err)
		}
		if err := c.client.ResourceV1().ResourceSlices().Delete(c.ctx, "probe-b", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if err := createSlice(c.client, slice("agent-b-gpu", "agent-b", "gpu.tessera.dev")); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			err  error
		}{
			{"another node's slice", createSlice(agent, slice("agent-b-gpu-2", "agent-b", "gpu.tessera.dev"))},
			{"another driver's slice", createSlice(agent, slice("agent-a-other", "agent-a", "gpu.example.com"))},
			{"a token not bound to its pod", createSlice(unbound, slice("agent-a-gpu-2", "agent-a", "gpu.tessera.dev"))},
			{"deleting another node's slice", agent.ResourceV1().ResourceSlices().Delete(c.ctx, "agent-b-gpu", metav1.DeleteOptions{})},
		} {
			if !refused(tc.err) {
				t.Errorf("%s: %v, want a denial", tc.name, tc.err)
			}
		}
		if err := agent.ResourceV1().ResourceSlices().Delete(c.ctx, "agent-a-gpu", metav1.DeleteOptions{}); err != nil {
			t.Errorf("the agent cannot delete its own node's slice: %v", err)
		}
	})

	t.Run("assignment annotation", func(t *testing.T) {
		testAssignmentPolicy(t, parent.withT(t), schedulerConfig)
	})
	t.Run("CDI annotations", func(t *testing.T) {
		testCDIAnnotationPolicy(t, parent.withT(t))
	})
	t.Run("spec.nodeName", func(t *testing.T) {
		testNodeNamePolicy(t, parent.withT(t))
	})
}

// TestChartRBAC's "spec.nodeName" part: a pod created with spec.nodeName skips every
// scheduler, and kubelet would give it the node's device-plugin slots that it keeps
// while the agent refuses its containers. No one creates one that asks for a Tessera
// resource, a cluster administrator included, except a node's kubelet creating the
// mirror pod of a static pod.
func testNodeNamePolicy(t *testing.T, c *cluster) {
	ns := c.ns
	tenant := c.tenantClient("nodename-tenant")
	node := c.createNode("gpu-by-hand", fixtures.PCIeNode("gpu-by-hand", 2, "Tesla T4", fixtures.T4MiB))
	denied := func(err error) bool {
		return err != nil && (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) &&
			strings.Contains(err.Error(), "the pod sets spec.nodeName (gpu-by-hand) and asks for a Tessera GPU resource")
	}
	bound := func(name string, ann map[string]string, lim gpuLimits) *v1.Pod {
		p := newPod(ns, name, "", ann, lim)
		p.Spec.NodeName = node.Name
		return p
	}
	create := func(cs clientset.Interface, p *v1.Pod) error {
		_, err := cs.CoreV1().Pods(ns).Create(c.ctx, p, metav1.CreateOptions{})
		return err
	}
	// Every one of a GPU's 32 device-plugin slots (agent.devicePlugin.replicas).
	allSlots := gpuLimits{name: "c", gpu: "32"}
	probes := 0
	var last error
	chartWaitFor(t, c.ctx, "the spec.nodeName policy to be enforced", func() bool {
		probes++
		name := fmt.Sprintf("nodename-probe-%d", probes)
		if last = create(tenant, bound(name, nil, allSlots)); last == nil {
			_ = c.client.CoreV1().Pods(ns).Delete(c.ctx, name, metav1.DeleteOptions{})
		}
		return denied(last)
	})

	if err := create(tenant, bound("strand", nil, allSlots)); !denied(err) {
		t.Errorf("a tenant creating a pod with spec.nodeName that asks for every slot: %v", err)
	}
	if err := create(c.client, bound("strand-admin", nil, gpuLimits{name: "c", gpu: "1"})); !denied(err) {
		t.Errorf("an administrator creating a GPU pod with spec.nodeName: %v", err)
	}
	// Any Tessera resource, in any container.
	names := api.DefaultResourceNames()
	initOnly := bound("strand-init", nil, gpuLimits{name: "c"})
	initOnly.Spec.InitContainers = []v1.Container{{Name: "init", Image: "registry.k8s.io/pause:3.10",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{names.GPUMemory: resource.MustParse("1000")}}}}
	if err := create(tenant, initOnly); !denied(err) {
		t.Errorf("a pod with spec.nodeName whose init container asks for %s: %v", names.GPUMemory, err)
	}
	// The mirror-pod annotation exempts no one but a node's kubelet.
	mirror := map[string]string{"kubernetes.io/config.mirror": "0123456789abcdef"}
	if err := create(tenant, bound("strand-mirror", mirror, allSlots)); !denied(err) {
		t.Errorf("a tenant creating a GPU pod with spec.nodeName and the mirror-pod annotation: %v", err)
	}
	// What passes: a pod with spec.nodeName that asks for no Tessera resource, a GPU
	// pod left to the scheduler, and the mirror pod of a static GPU pod created by its
	// node's kubelet (kubelet admitted the static pod from its own manifests).
	if err := create(tenant, bound("by-hand-cpu", nil, gpuLimits{name: "c"})); err != nil {
		t.Errorf("a pod with spec.nodeName that asks for no GPU was refused: %v", err)
	}
	if err := create(tenant, newPod(ns, "scheduled", "no-such-scheduler", nil, allSlots)); err != nil {
		t.Errorf("a GPU pod without spec.nodeName was refused: %v", err)
	}
	rc := c.restConfig()
	rc.Impersonate = restclient.ImpersonationConfig{UserName: "system:node:" + node.Name, Groups: []string{"system:nodes", "system:authenticated"}}
	kubelet, err := clientset.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	static := bound("static-gpu-"+node.Name, mirror, gpuLimits{name: "c", gpu: "1"})
	static.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, Controller: new(bool)}}
	*static.OwnerReferences[0].Controller = true
	if err := create(kubelet, static); err != nil {
		t.Errorf("kubelet creating the mirror pod of a static GPU pod was refused: %v", err)
	}

	vap, err := c.client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(c.ctx, "tessera-node-agent-scheduled-gpu-pods", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tc := vap.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
		t.Errorf("the spec.nodeName policy does not type-check: %+v", tc.ExpressionWarnings)
	}
}

// TestChartRBAC's "CDI annotations" part: no one, a cluster administrator included,
// creates or edits a pod whose cdi.k8s.io/ annotations name a Tessera CDI device (the
// runtime would inject that GPU without limits); other CDI annotations pass.
func testCDIAnnotationPolicy(t *testing.T, c *cluster) {
	ns := c.ns
	pods := c.client.CoreV1().Pods(ns)
	named := map[string]string{"cdi.k8s.io/gpu": "vendor.example/dev=a,tessera.dev/gpu=GPU-00000000-0000-0000-0000-000000000001"}
	denied := func(err error) bool {
		return err != nil && (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) &&
			strings.Contains(err.Error(), "the annotation cdi.k8s.io/gpu names a tessera.dev/gpu CDI device")
	}
	create := func(name string, ann map[string]string) error {
		_, err := pods.Create(c.ctx, newPod(ns, name, "no-such-scheduler", ann, gpuLimits{name: "c", gpu: "1"}), metav1.CreateOptions{})
		return err
	}
	probes := 0
	var last error
	chartWaitFor(t, c.ctx, "the CDI annotation policy to be enforced", func() bool {
		probes++
		name := fmt.Sprintf("cdi-probe-%d", probes)
		if last = create(name, named); last == nil {
			_ = pods.Delete(c.ctx, name, metav1.DeleteOptions{})
		}
		return denied(last)
	})
	if err := create("cdi-named", map[string]string{"cdi.k8s.io/x": "tessera.dev/gpu=GPU-00000000-0000-0000-0000-000000000002"}); !denied(err) && !strings.Contains(fmt.Sprint(err), "cdi.k8s.io/x names") {
		t.Errorf("creating a pod that names a Tessera CDI device: %v", err)
	}
	if err := create("cdi-other", map[string]string{"cdi.k8s.io/x": "vendor.example/dev=a"}); err != nil {
		t.Errorf("another vendor's CDI annotation was refused: %v", err)
	}
	if err := create("cdi-plain", nil); err != nil {
		t.Fatalf("a plain pod was refused: %v", err)
	}
	body := `{"metadata":{"annotations":{"cdi.k8s.io/gpu":"tessera.dev/gpu=GPU-00000000-0000-0000-0000-000000000001"}}}`
	if _, err := pods.Patch(c.ctx, "cdi-plain", types.MergePatchType, []byte(body), metav1.PatchOptions{}); !denied(err) {
		t.Errorf("adding an annotation that names a Tessera CDI device: %v", err)
	}

	// Through pods/status, whose updates keep annotation changes: by an administrator
	// and by a tenant (given pods/status, more than tenants usually have).
	tenant := c.tenantClient("cdi-tenant")
	admins := []struct {
		who string
		cs  clientset.Interface
	}{{"an administrator", c.client}, {"a tenant", tenant}}
	for _, a := range admins {
		if _, err := a.cs.CoreV1().Pods(ns).Patch(c.ctx, "cdi-plain", types.MergePatchType, []byte(body), metav1.PatchOptions{}, "status"); !denied(err) {
			t.Errorf("%s adding an annotation that names a Tessera CDI device through pods/status: %v", a.who, err)
		}
	}
	// Another vendor's device passes there; changing its value to name a Tessera
	// device is adding one.
	other := `{"metadata":{"annotations":{"cdi.k8s.io/x":"vendor.example/dev=b"}}}`
	if _, err := tenant.CoreV1().Pods(ns).Patch(c.ctx, "cdi-plain", types.MergePatchType, []byte(other), metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("another vendor's CDI annotation through pods/status was refused: %v", err)
	}
	if cur, err := tenant.CoreV1().Pods(ns).Get(c.ctx, "cdi-plain", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else {
		cur.Annotations["cdi.k8s.io/x"] = "tessera.dev/gpu=GPU-00000000-0000-0000-0000-000000000003"
		_, err := tenant.CoreV1().Pods(ns).UpdateStatus(c.ctx, cur, metav1.UpdateOptions{})
		if err == nil || !strings.Contains(err.Error(), "the annotation cdi.k8s.io/x names a tessera.dev/gpu CDI device") {
			t.Errorf("changing a CDI annotation to name a Tessera device with an update of pods/status: %v", err)
		}
	}

	// In a binding, whose annotations the API server copies onto the pod.
	c.createNode("cdi-node", nil)
	bind := func(cs clientset.Interface, name string, ann map[string]string) error {
		b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}, Target: v1.ObjectReference{Kind: "Node", Name: "cdi-node"}}
		return cs.CoreV1().Pods(ns).Bind(c.ctx, b, metav1.CreateOptions{})
	}
	for _, a := range admins {
		if err := bind(a.cs, "cdi-plain", named); !denied(err) {
			t.Errorf("%s binding a pod with an annotation that names a Tessera CDI device: %v", a.who, err)
		}
	}
	if err := bind(c.client, "cdi-other", map[string]string{"cdi.k8s.io/y": "vendor.example/dev=c"}); err != nil {
		t.Errorf("a binding with another vendor's CDI annotation was refused: %v", err)
	}
	for name, wantNode := range map[string]string{"cdi-plain": "", "cdi-other": "cdi-node"} {
		p, err := pods.Get(c.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != wantNode {
			t.Errorf("pod %s is on node %q, want %q", name, p.Spec.NodeName, wantNode)
		}
		for k, v := range p.Annotations {
			if strings.HasPrefix(k, "cdi.k8s.io/") && strings.Contains(v, "tessera.dev/gpu") {
				t.Errorf("pod %s carries %s: %s", name, k, v)
			}
		}
	}
	vap, err := c.client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(c.ctx, "tessera-node-agent-cdi-annotations", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tc := vap.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
		t.Errorf("the CDI annotation policy does not type-check: %+v", tc.ExpressionWarnings)
	}
}

// TestChartRBAC's "assignment annotation" part: a tenant who can create, edit and even
// bind pods in its namespace cannot write the tessera.dev/gpu-assignment annotation in
// any way, and the scheduler's own binding, which carries it, still goes through.
func testAssignmentPolicy(t *testing.T, c *cluster, schedulerConfig string) {
	ns := c.ns
	tenant := c.tenantClient("tenant")

	c.createNode("gpu-policy", fixtures.NVLinkNode("gpu-policy", 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB))
	forged, err := api.EncodeAssignment(&api.PodAssignment{Version: api.AssignmentVersion, Node: "gpu-policy",
		Containers: []api.ContainerAssignment{{Name: "c", Devices: []api.DeviceGrant{{UUID: "GPU-00000000-0000-0000-0000-000000000000", MemoryMiB: 81920, Cores: 100}}}}})
	if err != nil {
		t.Fatal(err)
	}
	withForged := map[string]string{api.AnnotationAssignment: forged}
	denied := func(err error, want string) bool {
		return err != nil && (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), want)
	}
	create := func(name string, ann map[string]string, nodeName string) error {
		p := newPod(ns, name, "no-such-scheduler", ann, gpuLimits{name: "c", gpu: "1"})
		p.Spec.NodeName = nodeName
		_, err := tenant.CoreV1().Pods(ns).Create(c.ctx, p, metav1.CreateOptions{})
		return err
	}
	// The policy is enforced once the API server has loaded it.
	probes := 0
	var last error
	defer func() {
		if t.Failed() {
			t.Logf("the last probe's answer: %v", last)
		}
	}()
	chartWaitFor(t, c.ctx, "the assignment policy to be enforced", func() bool {
		probes++
		name := fmt.Sprintf("probe-%d", probes)
		last = create(name, withForged, "")
		if last == nil {
			_ = c.client.CoreV1().Pods(ns).Delete(c.ctx, name, metav1.DeleteOptions{})
		}
		return denied(last, "only the Tessera scheduler")
	})

	// Create with it, also with spec.nodeName set (no scheduler involved at all).
	if err := create("forged", withForged, ""); !denied(err, "only the Tessera scheduler may set") {
		t.Errorf("creating a pod with the annotation: %v", err)
	}
	// The policy against GPU pods that set spec.nodeName may be the one that answers.
	if err := create("forged-bound", withForged, "gpu-policy"); !denied(err, "only the Tessera scheduler may set") && !denied(err, "sets spec.nodeName") {
		t.Errorf("creating a bound pod with the annotation: %v", err)
	}
	// Add it to a pod of its own.
	if err := create("plain", nil, ""); err != nil {
		t.Fatalf("the tenant cannot create a plain pod: %v", err)
	}
	// patchAs sets (value "": removes) the annotation with a merge patch of the pod
	// or, with subresource "status", of its pods/status, whose updates keep
	// annotation changes.
	patchAs := func(cs clientset.Interface, name, value string, subresource ...string) error {
		v := "null"
		if value != "" {
			v = fmt.Sprintf("%q", value)
		}
		body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, api.AnnotationAssignment, v)
		_, err := cs.CoreV1().Pods(ns).Patch(c.ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{}, subresource...)
		return err
	}
	patch := func(name, value string) error { return patchAs(tenant, name, value) }
	if err := patch("plain", forged); !denied(err, "only the Tessera scheduler may change") {
		t.Errorf("adding the annotation: %v", err)
	}
	if err := patchAs(tenant, "plain", forged, "status"); !denied(err, "only the Tessera scheduler may change") {
		t.Errorf("adding the annotation through pods/status: %v", err)
	}
	if err := patchAs(c.client, "plain", forged, "status"); !denied(err, "only the Tessera scheduler may change") {
		t.Errorf("an administrator adding the annotation through pods/status: %v", err)
	}
	// Bind its pending pod itself with the annotation in the binding.
	b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "plain", Annotations: withForged}, Target: v1.ObjectReference{Kind: "Node", Name: "gpu-policy"}}
	if err := tenant.CoreV1().Pods(ns).Bind(c.ctx, b, metav1.CreateOptions{}); !denied(err, "only the Tessera scheduler may set") {
		t.Errorf("binding with the annotation: %v", err)
	}

	// The scheduler's binding carries it through the policy.
	kubeconfig := c.serviceAccountKubeconfig(ns, "tessera-scheduler", nil)
	stop := c.startChartScheduler(schedulerConfig, kubeconfig)
	defer stop()
	p := newPod(ns, "placed", "tessera-binpack", nil, gpuLimits{name: "c", gpu: "1", mem: "4096", cores: "20"})
	if _, err := tenant.CoreV1().Pods(ns).Create(c.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	placed := c.waitBound("placed", 60*time.Second)
	granted := placed.Annotations[api.AnnotationAssignment]
	if d := assignment(t, placed).Containers[0].Devices[0]; d.MemoryMiB != 4096 || d.Cores != 20 {
		t.Errorf("the scheduler granted %+v", d)
	}
	// Change it, remove it: refused. An edit that leaves it alone: allowed.
	if err := patch("placed", forged); !denied(err, "only the Tessera scheduler may change") {
		t.Errorf("changing the annotation: %v", err)
	}
	if err := patch("placed", ""); !denied(err, "only the Tessera scheduler may change") {
		t.Errorf("removing the annotation: %v", err)
	}
	if _, err := tenant.CoreV1().Pods(ns).Patch(c.ctx, "placed", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"a"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("an edit that leaves the annotation alone: %v", err)
	}
	// The same through pods/status: a patch and a whole-object update.
	if err := patchAs(tenant, "placed", forged, "status"); !denied(err, "only the Tessera scheduler may change") {
		t.Errorf("changing the annotation through pods/status: %v", err)
	}
	if err := patchAs(tenant, "placed", "", "status"); !denied(err, "only the Tessera scheduler may change") {
		t.Errorf("removing the annotation through pods/status: %v", err)
	}
	if err := patchAs(c.client, "placed", "", "status"); !denied(err, "only the Tessera scheduler may change") {
		t.Errorf("an administrator removing the annotation through pods/status: %v", err)
	}
	if cur, err := tenant.CoreV1().Pods(ns).Get(c.ctx, "placed", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else {
		cur.Annotations[api.AnnotationAssignment] = forged
		if _, err := tenant.CoreV1().Pods(ns).UpdateStatus(c.ctx, cur, metav1.UpdateOptions{}); !denied(err, "only the Tessera scheduler may change") {
			t.Errorf("changing the annotation with an update of pods/status: %v", err)
		}
	}
	// A status write that leaves it alone, as kubelet's are, passes.
	status := `{"status":{"conditions":[{"type":"example.com/ready","status":"True"}]}}`
	if _, err := tenant.CoreV1().Pods(ns).Patch(c.ctx, "placed", types.StrategicMergePatchType, []byte(status), metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("a status write that leaves the annotation alone: %v", err)
	}
	if got, err := c.client.CoreV1().Pods(ns).Get(c.ctx, "placed", metav1.GetOptions{}); err != nil || got.Annotations[api.AnnotationAssignment] != granted {
		t.Errorf("the scheduler's assignment changed: %v", err)
	}
	// Not even a cluster administrator writes it.
	_, err = c.client.CoreV1().Pods(ns).Create(c.ctx, newPod(ns, "admin", "no-such-scheduler", withForged, gpuLimits{name: "c", gpu: "1"}), metav1.CreateOptions{})
	if !denied(err, "only the Tessera scheduler may set") {
		t.Errorf("an administrator creating a pod with the annotation: %v", err)
	}
	vap, err := c.client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(c.ctx, "tessera-scheduler-gpu-assignment", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tc := vap.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
		t.Errorf("the assignment policy does not type-check: %+v", tc.ExpressionWarnings)
	}
}

// tenantClient creates a service account in the test namespace that may create, edit
// and delete pods there, and returns a client acting as it. It may also write
// pods/status and pods/binding, more than tenants usually have: the policies, not
// RBAC, must refuse what the tests try through them.
func (c *cluster) tenantClient(name string) clientset.Interface {
	c.t.Helper()
	ns := c.ns
	rbac := c.client.RbacV1()
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(c.ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "update", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
	}}
	if _, err := rbac.Roles(ns).Create(c.ctx, role, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}
	if _, err := rbac.RoleBindings(ns).Create(c.ctx, rb, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	return c.clientFor(c.serviceAccountKubeconfig(ns, name, nil))
}

// serviceAccountKubeconfig mints a token for a service account (bound to pod when
// given, as the kubelet's projected tokens are) and writes a kubeconfig that uses
// only that token.
func (c *cluster) serviceAccountKubeconfig(ns, name string, pod *v1.Pod) string {
	c.t.Helper()
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64)}}
	*tr.Spec.ExpirationSeconds = 3600
	if pod != nil {
		tr.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := c.client.CoreV1().ServiceAccounts(ns).CreateToken(c.ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("minting a token for %s/%s: %v", ns, name, err)
	}
	rc := restclient.AnonymousClientConfig(c.restConfig())
	rc.BearerToken = tok.Status.Token
	return writeKubeconfig(c.t, rc)
}

func (c *cluster) clientFor(kubeconfig string) clientset.Interface {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		c.t.Fatal(err)
	}
	cs, err := clientset.NewForConfig(rc)
	if err != nil {
		c.t.Fatal(err)
	}
	return cs
}

// allowed asks the API server whether the client's own identity may do something.
func (c *cluster) allowed(cs clientset.Interface, ra authorizationv1.ResourceAttributes) bool {
	c.t.Helper()
	r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(c.ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return r.Status.Allowed
}

// startChartScheduler runs the Tessera scheduler with the chart's configuration,
// pointed at kubeconfig, with leader election as the chart configures it.
func (c *cluster) startChartScheduler(config, kubeconfig string) (stop func()) {
	c.t.Helper()
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(config), &cfg); err != nil {
		c.t.Fatalf("the chart's scheduler configuration: %v", err)
	}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	path := filepath.Join(c.t.TempDir(), "scheduler-config.yaml")
	chartWriteFile(c.t, path, string(out))

	ctx, cancel := context.WithCancel(c.ctx)
	ctx = klog.NewContext(ctx, klog.Background())
	cc, sched := setupScheduler(c.t, ctx, path)
	// Every profile filters with TesseraNodeResourcesFit in place of NodeResourcesFit.
	for name, prof := range sched.Profiles {
		var filters []string
		for _, pl := range prof.ListPlugins().Filter.Enabled {
			filters = append(filters, pl.Name)
		}
		if contains(filters, "NodeResourcesFit") || !contains(filters, noderesourcesfit.Name) {
			c.t.Errorf("chart profile %s filters with %v, want %s and not NodeResourcesFit", name, filters, noderesourcesfit.Name)
		}
	}
	if cc.LeaderElection == nil {
		c.t.Fatal("the chart's configuration does not enable leader election")
	}
	le := *cc.LeaderElection
	le.Callbacks = leaderelection.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) { runScheduler(ctx, cc, sched) },
		OnStoppedLeading: func() {},
	}
	elector, err := leaderelection.NewLeaderElector(le)
	if err != nil {
		c.t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		elector.Run(ctx)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	c.t.Cleanup(stop)
	return stop
}

func chartWaitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func chartWriteFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestChartSchedulerName: the chart's MutatingAdmissionPolicy gives GPU pods that name
// no scheduler (or the default one) the first Tessera profile, and leaves every other
// pod as it is. Pods are created in dry-run mode: admission runs, nothing is stored.
func TestChartSchedulerName(t *testing.T) {
	c := startCluster(t)
	c.needMutatingPolicies(t)
	a := c.applier()
	install := func(set ...string) {
		for _, m := range c.renderChart(deploy.Options{Namespace: c.ns, Set: set}) {
			if m.Kind == "MutatingAdmissionPolicy" || m.Kind == "MutatingAdmissionPolicyBinding" {
				if err := a.apply(m.YAML, false); err != nil {
					t.Fatalf("applying %s %s: %v", m.Kind, m.Name, err)
				}
			}
		}
	}
	type container = policyContainer
	pod := func(scheduler string, labels map[string]string, cs ...container) *v1.Pod {
		p := policyPod(metav1.ObjectMeta{Namespace: c.ns, Labels: labels}, cs...)
		p.Spec.SchedulerName = scheduler
		return p
	}
	admitted := func(p *v1.Pod) string {
		got, err := c.client.CoreV1().Pods(c.ns).Create(c.ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("creating a pod (dry run): %v", err)
		}
		return got.Spec.SchedulerName
	}
	q := resource.MustParse
	gpu := v1.ResourceList{"tessera.dev/gpu": q("1"), "tessera.dev/gpu-memory": q("4096")}
	cpu := v1.ResourceList{v1.ResourceCPU: q("1")}

	install()
	chartWaitFor(t, c.ctx, "the scheduler-name policy to be applied", func() bool {
		return admitted(pod("", nil, container{limits: gpu})) == "tessera-fragmentation"
	})
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want string
	}{
		{"GPU pod naming no scheduler", pod("", nil, container{limits: gpu}), "tessera-fragmentation"},
		{"GPU pod naming the default scheduler", pod("default-scheduler", nil, container{limits: gpu}), "tessera-fragmentation"},
		{"memory percent only, in a second container", pod("", nil, container{limits: cpu}, container{limits: v1.ResourceList{"tessera.dev/gpu-memory-percent": q("50")}}), "tessera-fragmentation"},
		{"GPU init container", pod("", nil, container{init: true, limits: gpu}, container{limits: cpu}), "tessera-fragmentation"},
		{"GPU pod naming another Tessera profile", pod("tessera-spread", nil, container{limits: gpu}), "tessera-spread"},
		{"GPU pod naming another scheduler", pod("volcano", nil, container{limits: gpu}), "volcano"},
		{"GPU pod that opts out", pod("", map[string]string{"tessera.dev/keep-scheduler-name": "true"}, container{limits: gpu}), "default-scheduler"},
		{"pod without GPUs", pod("", nil, container{limits: cpu}), "default-scheduler"},
		{"pod asking for another vendor's GPU", pod("", nil, container{limits: v1.ResourceList{"nvidia.com/gpu": q("1")}}), "default-scheduler"},
	} {
		if got := admitted(tc.pod); got != tc.want {
			t.Errorf("%s: schedulerName %q, want %q", tc.name, got, tc.want)
		}
	}

	// HAMi-compatible names and another target profile: the policy follows the chart's
	// resource names.
	install("resourceNames.gpu=nvidia.com/gpu", "resourceNames.gpuMemory=nvidia.com/gpumem",
		"resourceNames.gpuMemoryPercent=nvidia.com/gpumem-percentage", "resourceNames.gpuCores=nvidia.com/gpucores",
		"scheduler.setSchedulerName.schedulerName=tessera-binpack")
	hami := v1.ResourceList{"nvidia.com/gpu": q("1"), "nvidia.com/gpumem": q("4096")}
	chartWaitFor(t, c.ctx, "the policy with HAMi names to be applied", func() bool {
		return admitted(pod("", nil, container{limits: hami})) == "tessera-binpack"
	})
	if got := admitted(pod("", nil, container{limits: gpu})); got != "default-scheduler" {
		t.Errorf("a tessera.dev pod under HAMi names: schedulerName %q, want default-scheduler", got)
	}
}

// The chart's require-nri-plugin policy annotates each GPU container of a pod, and only
// those, with required-plugins.noderesource.dev/container.<name>: ["tessera"] (what
// containerd's NRI default validator reads), on create and again on update, replacing
// a tenant's value; it is not rendered when the agent runs without NRI or when turned
// off.
func TestChartRequireNRIPlugin(t *testing.T) {
	c := startCluster(t)
	c.needMutatingPolicies(t)
	a := c.applier()
	const policy = "tessera-node-agent-require-nri-plugin"
	has := func(set ...string) bool {
		for _, m := range c.renderChart(deploy.Options{Namespace: c.ns, Set: set}) {
			if m.Kind == "MutatingAdmissionPolicy" && m.Name == policy {
				return true
			}
		}
		return false
	}
	if has("agent.nri.requirePlugin=false") || has("agent.nri.enabled=false", "agent.bindFallback.enabled=true") {
		t.Errorf("the %s policy is rendered with agent.nri.requirePlugin=false or the fallback binding", policy)
	}
	for _, m := range c.renderChart(deploy.Options{Namespace: c.ns}) {
		if (m.Kind == "MutatingAdmissionPolicy" || m.Kind == "MutatingAdmissionPolicyBinding") && m.Name == policy {
			if err := a.apply(m.YAML, false); err != nil {
				t.Fatalf("applying %s %s: %v", m.Kind, m.Name, err)
			}
		}
	}
	const key = "required-plugins.noderesource.dev/container."
	q := resource.MustParse
	gpu := v1.ResourceList{"tessera.dev/gpu": q("1"), "tessera.dev/gpu-memory": q("4096")}
	cpu := v1.ResourceList{v1.ResourceCPU: q("1")}
	pod := func(annotations map[string]string, init, main []v1.ResourceList) *v1.Pod {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "p-", Namespace: c.ns, Annotations: annotations},
			Spec: v1.PodSpec{SchedulerName: "tessera-binpack"}}
		for i, l := range init {
			p.Spec.InitContainers = append(p.Spec.InitContainers, v1.Container{Name: fmt.Sprintf("init%d", i), Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: l}})
		}
		for i, l := range main {
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: fmt.Sprintf("c%d", i), Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: l}})
		}
		return p
	}
	required := func(p *v1.Pod) map[string]string {
		out := map[string]string{}
		for k, v := range p.Annotations {
			if strings.HasPrefix(k, "required-plugins.noderesource.dev") {
				out[k] = v
			}
		}
		return out
	}
	dryRun := func(p *v1.Pod) map[string]string {
		got, err := c.client.CoreV1().Pods(c.ns).Create(c.ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("creating a pod (dry run): %v", err)
		}
		return required(got)
	}
	chartWaitFor(t, c.ctx, "the require-nri-plugin policy to be applied", func() bool {
		return len(dryRun(pod(nil, nil, []v1.ResourceList{gpu}))) == 1
	})
	tessera := `["tessera"]`
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		init, main  []v1.ResourceList
		want        map[string]string
	}{
		{"one GPU container", nil, nil, []v1.ResourceList{gpu}, map[string]string{key + "c0": tessera}},
		{"a GPU container beside a CPU one", map[string]string{"a": "b"}, nil, []v1.ResourceList{cpu, gpu}, map[string]string{key + "c1": tessera}},
		{"a GPU init container", nil, []v1.ResourceList{gpu}, []v1.ResourceList{cpu}, map[string]string{key + "init0": tessera}},
		{"memory percent only", nil, nil, []v1.ResourceList{{"tessera.dev/gpu-memory-percent": q("50")}}, map[string]string{key + "c0": tessera}},
		{"the tenant's empty list replaced", map[string]string{key + "c0": "[]", "required-plugins.noderesource.dev/pod": "[]"}, nil, []v1.ResourceList{gpu},
			map[string]string{key + "c0": tessera, "required-plugins.noderesource.dev/pod": "[]"}},
		{"a pod without GPUs", nil, nil, []v1.ResourceList{cpu}, map[string]string{}},
		{"another vendor's GPU", nil, nil, []v1.ResourceList{{"nvidia.com/gpu": q("1")}}, map[string]string{}},
	} {
		if got := dryRun(pod(tc.annotations, tc.init, tc.main)); !maps.Equal(got, tc.want) {
			t.Errorf("%s: annotations %v, want %v", tc.name, got, tc.want)
		}
	}

	// An update that removes the annotation gets it back.
	p, err := c.client.CoreV1().Pods(c.ns).Create(c.ctx, pod(nil, nil, []v1.ResourceList{gpu}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(p.Annotations, key+"c0")
	p, err = c.client.CoreV1().Pods(c.ns).Update(c.ctx, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("updating the pod: %v", err)
	}
	if got := required(p); got[key+"c0"] != tessera {
		t.Errorf("after an update removing it: annotations %v, want %s: %s", got, key+"c0", tessera)
	}
}

// TestChartMutatingPoliciesPerMinor: on the server of the minor this suite is built for
// (make test-integration K8S_MINOR=...), the chart renders its MutatingAdmissionPolicies
// exactly where the server serves them (GA and on by default from 1.36, a beta that is
// off by default in 1.34 and 1.35), and the quota check either way.
func TestChartMutatingPoliciesPerMinor(t *testing.T) {
	c := startCluster(t)
	version := builtKubeVersion(t)
	var minor int
	if _, err := fmt.Sscanf(version, "1.%d.", &minor); err != nil {
		t.Fatalf("Kubernetes version %q: %v", version, err)
	}
	serves := c.servesMutatingPolicies()
	if want := minor >= 36; serves != want {
		t.Errorf("Kubernetes %s serves MutatingAdmissionPolicy: %v, want %v (docs/install.md's table)", version, serves, want)
	}
	policies, quotaCheck := 0, false
	for _, m := range c.renderChart(deploy.Options{Namespace: c.ns}) {
		switch {
		case m.Kind == "MutatingAdmissionPolicy" || m.Kind == "MutatingAdmissionPolicyBinding":
			policies++
		case m.Kind == "ValidatingAdmissionPolicy" && m.Name == quotaPolicy:
			quotaCheck = true
		}
	}
	if want := map[bool]int{true: 6, false: 0}[serves]; policies != want {
		t.Errorf("Kubernetes %s: the chart rendered %d MutatingAdmissionPolicies and bindings, want %d", version, policies, want)
	}
	if !quotaCheck {
		t.Errorf("Kubernetes %s: the chart rendered no quota check (%s)", version, quotaPolicy)
	}
}

// policyContainer is a container of policyPod: an init container or not, and its limits.
type policyContainer struct {
	init   bool
	limits v1.ResourceList
}

// policyPod is a pod for the admission policies' tests: meta (its name generated), a
// pause container named c<i> for each of cs.
func policyPod(meta metav1.ObjectMeta, cs ...policyContainer) *v1.Pod {
	meta.GenerateName = "p-"
	p := &v1.Pod{ObjectMeta: meta}
	for i, ct := range cs {
		k := v1.Container{Name: fmt.Sprintf("c%d", i), Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Limits: ct.limits}}
		if ct.init {
			p.Spec.InitContainers = append(p.Spec.InitContainers, k)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, k)
		}
	}
	return p
}

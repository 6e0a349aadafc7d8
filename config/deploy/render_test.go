// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api"
)

func chartDir(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Join(filepath.Dir(file), "tessera")
}

func kinds(ms []Manifest) map[string]int {
	k := map[string]int{}
	for _, m := range ms {
		k[m.Kind]++
	}
	return k
}

func find(t *testing.T, ms []Manifest, kind, name string) map[string]any {
	t.Helper()
	for _, m := range ms {
		if m.Kind == kind && m.Name == name {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(m.YAML), &obj); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return obj
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

func TestRenderDefaults(t *testing.T) {
	ms, err := Render(Options{ChartDir: chartDir(t), NamespaceObject: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		"Namespace": 1, "ServiceAccount": 2, "ConfigMap": 1, "ClusterRole": 1, "ClusterRoleBinding": 3,
		"Role": 1, "RoleBinding": 2, "Service": 2, "DaemonSet": 1, "Deployment": 1,
		// The agent's own-node, CDI-annotation and scheduled-GPU-pod policies, the
		// scheduler's assignment policy and the quota resources' check.
		"ValidatingAdmissionPolicy": 5, "ValidatingAdmissionPolicyBinding": 5,
		// GPU pods get a Tessera schedulerName and their quota resources, and their GPU
		// containers require the agent's NRI plugin.
		"MutatingAdmissionPolicy": 3, "MutatingAdmissionPolicyBinding": 3,
	}
	got := kinds(ms)
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%d %s objects, want %d", got[k], k, n)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s objects", k)
		}
	}
	if ms[0].Kind != "Namespace" {
		t.Errorf("first object is a %s; the namespace must come first", ms[0].Kind)
	}
	// Every object parses, and namespaced ones are in the release namespace.
	for _, m := range ms {
		var obj struct {
			Metadata struct{ Namespace string } `json:"metadata"`
		}
		if err := yaml.UnmarshalStrict([]byte(m.YAML), &map[string]any{}); err != nil {
			t.Errorf("%s %s: %v", m.Kind, m.Name, err)
		}
		_ = yaml.Unmarshal([]byte(m.YAML), &obj)
		if ns := obj.Metadata.Namespace; ns != "" && ns != DefaultNamespace && !(m.Kind == "RoleBinding" && ns == "kube-system") {
			t.Errorf("%s %s in namespace %q", m.Kind, m.Name, ns)
		}
	}
	cm := find(t, ms, "ConfigMap", "tessera-scheduler")
	cfg := cm["data"].(map[string]any)["scheduler-config.yaml"].(string)
	for _, s := range []string{"schedulerName: tessera-binpack", "schedulerName: tessera-spread", "resourceNamespace: tessera-system",
		"schedulerName: tessera-fragmentation", "nodePolicy: Fragmentation", "fragmentationWindow: 2000",
		`ignoredResourceGroups: ["tessera.dev"]`, "nodePolicy: Spread", "devicePolicy: Binpack"} {
		if !strings.Contains(cfg, s) {
			t.Errorf("scheduler config lacks %q:\n%s", s, cfg)
		}
	}
	// Binpack and Fragmentation score alone; Spread keeps kube-scheduler's scores.
	// Score and PreScore, in each of the two.
	if n := strings.Count(cfg, "- name: NodeResourcesBalancedAllocation"); n != 4 {
		t.Errorf("BalancedAllocation disabled %d times, want at Score and PreScore in binpack and fragmentation:\n%s", n, cfg)
	}
	// The assignment travels in the binding: no role lets the scheduler patch pods.
	for _, m := range ms {
		if m.Kind == "ClusterRole" && strings.Contains(m.YAML, "patch") && strings.Contains(m.Name, "scheduler") {
			t.Errorf("ClusterRole %s lets the scheduler patch pods; the default assignmentWrite (Binding) needs no such right", m.Name)
		}
	}
}

func TestRenderNonDefault(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`
resourceNames: {gpu: nvidia.com/gpu, gpuMemory: nvidia.com/gpumem, gpuMemoryPercent: nvidia.com/gpumem-percentage, gpuCores: nvidia.com/gpucores}
scheduler:
  replicas: 2
  profiles:
    - {schedulerName: gpu-pack, nodePolicy: Binpack, devicePolicy: Spread, args: {topologyWeight: 5}}
    - {schedulerName: gpu-prebind, nodePolicy: Spread, args: {assignmentWrite: PreBind}}
agent:
  hostPaths: {hookDir: /opt/tessera/hook, nriSocket: /run/containerd/nri/nri.sock}
  hook: {install: false}
  watchdog: {action: kill}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ms, err := Render(Options{ChartDir: chartDir(t), Release: "gpu", Namespace: "gpu-system", ValueFiles: []string{values},
		Set: []string{"agent.metrics.serviceMonitor.enabled=true"}, APIVersions: []string{"monitoring.coreos.com/v1"}, KubeVersion: "1.37.2"})
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(ms)["ServiceMonitor"]; got != 1 {
		t.Errorf("%d ServiceMonitors, want the agent's only", got)
	}
	cm := find(t, ms, "ConfigMap", "gpu-scheduler")
	cfg := cm["data"].(map[string]any)["scheduler-config.yaml"].(string)
	for _, s := range []string{"schedulerName: gpu-pack", `ignoredResourceGroups: ["nvidia.com", "tessera.dev"]`, "gpuMemory: nvidia.com/gpumem", "topologyWeight: 5", "devicePolicy: Spread"} {
		if !strings.Contains(cfg, s) {
			t.Errorf("scheduler config lacks %q:\n%s", s, cfg)
		}
	}
	if strings.Contains(cfg, "tessera-spread") {
		t.Error("the default spread profile survived a profile list that replaced it")
	}
	// A PreBind profile patches the pod's annotation: the role that allows it is there.
	role := find(t, ms, "ClusterRole", "gpu-scheduler")
	if got := fmt.Sprint(role["rules"]); !strings.Contains(got, "patch") || !strings.Contains(got, "pods") {
		t.Errorf("assignmentWrite: PreBind without patch on pods: %s", got)
	}
	find(t, ms, "ClusterRoleBinding", "gpu-scheduler")
	ds := find(t, ms, "DaemonSet", "gpu-node-agent")
	spec := ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	if _, ok := spec["initContainers"]; ok {
		t.Error("hook.install=false still installs the hook")
	}
	ms, err = Render(Options{ChartDir: chartDir(t), Release: "gpu", Namespace: "gpu-system", ValueFiles: []string{values},
		Set: []string{"agent.hook.install=true"}, KubeVersion: "1.37.2"})
	if err != nil {
		t.Fatal(err)
	}
	ds = find(t, ms, "DaemonSet", "gpu-node-agent")
	spec = ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	inits, _ := spec["initContainers"].([]any)
	if len(inits) != 1 {
		t.Fatalf("hook.install=true: %d init containers, want install-hook", len(inits))
	}
	// The image has no shell: the agent binary installs the hook, into the host path
	// mounted at the same path.
	ic := inits[0].(map[string]any)
	if got := fmt.Sprint(ic["command"]); got != "[/usr/local/bin/tessera-node-agent install-hook --to=/opt/tessera/hook]" {
		t.Errorf("install-hook command %s", got)
	}
	if got := fmt.Sprint(ic["volumeMounts"]); !strings.Contains(got, "mountPath:/opt/tessera/hook") {
		t.Errorf("install-hook mounts %s, want the hook directory at its host path", got)
	}
	args := spec["containers"].([]any)[0].(map[string]any)["args"].([]any)
	joined := ""
	for _, a := range args {
		joined += a.(string) + " "
	}
	for _, s := range []string{"--resource-domain=nvidia.com", "--hook-library=/opt/tessera/hook/libtessera-cuda.so",
		"--nri-socket=/run/containerd/nri/nri.sock", "--watchdog-action=kill"} {
		if !strings.Contains(joined, s) {
			t.Errorf("agent args lack %s: %s", s, joined)
		}
	}
	dep := find(t, ms, "Deployment", "gpu-scheduler")
	if _, ok := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["affinity"]; !ok {
		t.Error("two scheduler replicas without anti-affinity")
	}
}

// TestRenderBindFallback: the agent without NRI gets the fallback flags, its socket
// directory at its host path, and may watch pods.
func TestRenderBindFallback(t *testing.T) {
	ms, err := Render(Options{ChartDir: chartDir(t), Release: "gpu", Namespace: "gpu-system",
		Set: []string{"agent.nri.enabled=false", "agent.bindFallback.enabled=true", "agent.hostPaths.bindSocket=/run/tessera-bind/agent.sock"}, KubeVersion: "1.37.2"})
	if err != nil {
		t.Fatal(err)
	}
	ds := find(t, ms, "DaemonSet", "gpu-node-agent")
	spec := ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	c := spec["containers"].([]any)[0].(map[string]any)
	joined := fmt.Sprint(c["args"])
	for _, s := range []string{"--nri=false", "--bind-fallback=true", "--bind-socket=/run/tessera-bind/agent.sock"} {
		if !strings.Contains(joined, s) {
			t.Errorf("agent args lack %s: %s", s, joined)
		}
	}
	if got := fmt.Sprint(c["volumeMounts"]); !strings.Contains(got, "mountPath:/run/tessera-bind name:bind") {
		t.Errorf("mounts %s", got)
	}
	if got := fmt.Sprint(spec["volumes"]); !strings.Contains(got, "path:/run/tessera-bind") {
		t.Errorf("volumes %s", got)
	}
	role := find(t, ms, "ClusterRole", "gpu-node-agent")
	if got := fmt.Sprint(role["rules"]); !strings.Contains(got, "resources:[pods] verbs:[get list watch]") {
		t.Errorf("rules %s", got)
	}
}

// TestRenderCDI: by default the agent writes the CDI spec into the host's CDI
// directory and reads the driver from the host's root, read-only; a driver root and
// search paths are passed as the agent sees them; CDI off removes both mounts and
// turns the agent's CDI off explicitly.
func TestRenderCDI(t *testing.T) {
	agent := func(set ...string) (string, string) {
		ms, err := Render(Options{ChartDir: chartDir(t), Release: "gpu", Namespace: "gpu-system", Set: set, KubeVersion: "1.37.2"})
		if err != nil {
			t.Fatal(err)
		}
		spec := find(t, ms, "DaemonSet", "gpu-node-agent")["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		c := spec["containers"].([]any)[0].(map[string]any)
		return fmt.Sprint(c["args"]), fmt.Sprint(c["volumeMounts"], spec["volumes"])
	}
	args, mounts := agent()
	for _, a := range []string{"--cdi-spec-dir=/var/run/cdi", "--cdi-kind=tessera.dev/gpu", "--cdi-driver-root=/host/driver",
		"--cdi-host-driver-root=/", "--cdi-hook=auto", "--nri-unavailable=refuse"} {
		if !strings.Contains(args, a) {
			t.Errorf("agent args lack %s: %s", a, args)
		}
	}
	for _, m := range []string{"mountPath:/var/run/cdi name:cdi", "mountPath:/host/driver name:cdi-driver-root readOnly:true", "hostPath:map[path:/ type:Directory] name:cdi-driver-root"} {
		if !strings.Contains(mounts, m) {
			t.Errorf("mounts lack %s: %s", m, mounts)
		}
	}
	args, _ = agent("agent.cdi.driverRoot=/run/nvidia/driver", "agent.cdi.librarySearchPaths={/usr/local/nvidia/lib64}",
		"agent.cdi.hook=/usr/local/nvidia/toolkit/nvidia-cdi-hook")
	for _, a := range []string{"--cdi-host-driver-root=/run/nvidia/driver", "--cdi-library-search-paths=/host/driver/usr/local/nvidia/lib64",
		"--cdi-hook=/usr/local/nvidia/toolkit/nvidia-cdi-hook"} {
		if !strings.Contains(args, a) {
			t.Errorf("agent args lack %s: %s", a, args)
		}
	}
	// NRI's stand-in needs the fallback socket's host directory mounted.
	args, mounts = agent("agent.nri.unavailable=fallback")
	if !strings.Contains(args, "--nri-unavailable=fallback") || !strings.Contains(args, "--bind-socket=/run/tessera/bind/bind.sock") ||
		strings.Contains(args, "--bind-fallback=true") || !strings.Contains(mounts, "mountPath:/run/tessera/bind name:bind") {
		t.Errorf("NRI fallback: args %s, mounts %s", args, mounts)
	}
	args, mounts = agent("agent.cdi.enabled=false")
	if !strings.Contains(args, "--cdi-spec-dir= ") || strings.Contains(args, "--cdi-kind") || strings.Contains(mounts, "name:cdi-driver-root") || strings.Contains(mounts, "name:cdi") {
		t.Errorf("CDI off: args %s, mounts %s", args, mounts)
	}
	// The CDI-annotation policy names the configured kind, and goes with CDI or its switch.
	policy := func(set ...string) string {
		ms, err := Render(Options{ChartDir: chartDir(t), Release: "gpu", Namespace: "gpu-system", Set: set, KubeVersion: "1.37.2"})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Kind == "ValidatingAdmissionPolicy" && m.Name == "gpu-node-agent-cdi-annotations" {
				return m.YAML
			}
		}
		return ""
	}
	if p := policy("agent.cdi.kind=example.com/gpu"); !strings.Contains(p, `contains("example.com/gpu")`) {
		t.Errorf("CDI-annotation policy for another kind:\n%s", p)
	}
	for _, off := range []string{"agent.cdi.enabled=false", "agent.cdi.annotationPolicy=false"} {
		if p := policy(off); p != "" {
			t.Errorf("%s: CDI-annotation policy still rendered", off)
		}
	}
}

// TestRenderNodeNamePolicy: the policy against GPU pods that set spec.nodeName names
// the configured resource names, and goes with the device plugin or its switch.
func TestRenderNodeNamePolicy(t *testing.T) {
	policy := func(set ...string) string {
		ms, err := Render(Options{ChartDir: chartDir(t), Release: "gpu", Namespace: "gpu-system", Set: set, KubeVersion: "1.37.2"})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Kind == "ValidatingAdmissionPolicy" && m.Name == "gpu-node-agent-scheduled-gpu-pods" {
				return m.YAML
			}
		}
		return ""
	}
	p := policy()
	for _, s := range []string{`k in ["tessera.dev/gpu", "tessera.dev/gpu-memory", "tessera.dev/gpu-memory-percent", "tessera.dev/gpu-cores"]`,
		"object.spec.nodeName", `request.userInfo.username.startsWith("system:node:")`, "kubernetes.io/config.mirror", "operations: [CREATE]"} {
		if !strings.Contains(p, s) {
			t.Errorf("the policy lacks %q:\n%s", s, p)
		}
	}
	p = policy("resourceNames.gpu=nvidia.com/gpu", "resourceNames.gpuMemory=nvidia.com/gpumem",
		"resourceNames.gpuMemoryPercent=nvidia.com/gpumem-percentage", "resourceNames.gpuCores=nvidia.com/gpucores")
	if !strings.Contains(p, `k in ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"]`) || strings.Contains(p, "tessera.dev/gpu") {
		t.Errorf("the policy for other resource names:\n%s", p)
	}
	for _, off := range []string{"agent.devicePlugin.enabled=false", "agent.devicePlugin.nodeNamePolicy=false", "agent.enabled=false"} {
		if p := policy(off); p != "" {
			t.Errorf("%s: the policy is still rendered", off)
		}
	}
}

// TestRenderQuotaPolicies: the quota policies follow the chart's resource names and
// write the api package's quota resource names; under other resource names the
// scheduler also ignores the tessera.dev group they live in; quota.enabled=false
// renders neither policy.
func TestRenderQuotaPolicies(t *testing.T) {
	render := func(set ...string) (policies map[string]string, schedulerConfig string) {
		ms, err := Render(Options{ChartDir: chartDir(t), Release: "gpu", Namespace: "gpu-system", Set: set, KubeVersion: "1.37.2"})
		if err != nil {
			t.Fatal(err)
		}
		policies = map[string]string{}
		for _, m := range ms {
			if m.Name == "gpu-quota-resources" {
				policies[m.Kind] = m.YAML
			}
		}
		cm := find(t, ms, "ConfigMap", "gpu-scheduler")
		return policies, cm["data"].(map[string]any)["scheduler-config.yaml"].(string)
	}
	p, cfg := render()
	if len(p) != 4 {
		t.Fatalf("rendered %d quota policy objects, want both policies and their bindings: %v", len(p), p)
	}
	names := make([]string, 0, 4)
	for _, n := range api.QuotaResourceNames() {
		names = append(names, fmt.Sprintf("%q", n))
	}
	quota := "[" + strings.Join(names, ", ") + "]"
	limits := fmt.Sprintf("[%d, %d, 100, 100]", api.MaxGPUsPerContainer, api.MaxMemoryMiB)
	for _, kind := range []string{"MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"} {
		for _, s := range []string{quota, limits, `"tessera.dev/gpu-memory" in c.resources.limits`, "operations: [CREATE]", "resources: [jobs]", `request.kind.kind == "Job" ? object.spec.template.spec : object.spec`, "failurePolicy: Fail"} {
			if !strings.Contains(p[kind], s) {
				t.Errorf("%s lacks %q:\n%s", kind, s, p[kind])
			}
		}
	}
	if !strings.Contains(cfg, `ignoredResourceGroups: ["tessera.dev"]`) {
		t.Errorf("scheduler config:\n%s", cfg)
	}
	hami := []string{"resourceNames.gpu=nvidia.com/gpu", "resourceNames.gpuMemory=nvidia.com/gpumem",
		"resourceNames.gpuMemoryPercent=nvidia.com/gpumem-percentage", "resourceNames.gpuCores=nvidia.com/gpucores"}
	p, cfg = render(hami...)
	if !strings.Contains(p["MutatingAdmissionPolicy"], `"nvidia.com/gpumem" in c.resources.limits`) || !strings.Contains(p["MutatingAdmissionPolicy"], quota) {
		t.Errorf("the policy under other resource names:\n%s", p["MutatingAdmissionPolicy"])
	}
	if !strings.Contains(cfg, `ignoredResourceGroups: ["nvidia.com", "tessera.dev"]`) {
		t.Errorf("under other resource names the scheduler must ignore the tessera.dev quota resources too:\n%s", cfg)
	}
	p, cfg = render(append(hami, "quota.enabled=false")...)
	if len(p) != 0 {
		t.Errorf("quota.enabled=false still renders %v", p)
	}
	if !strings.Contains(cfg, `ignoredResourceGroups: ["nvidia.com"]`) {
		t.Errorf("scheduler config without quota resources:\n%s", cfg)
	}
}

// TestRenderAgentMetrics: the agent's /metrics is HTTPS with delegated authentication
// and authorization (the agent may create token and access reviews), scraped with
// Prometheus' token; a provided certificate is mounted and passed; without metrics the
// agent may review nothing.
func TestRenderAgentMetrics(t *testing.T) {
	ms, err := Render(Options{ChartDir: chartDir(t), Release: "gpu", Namespace: "gpu-system", KubeVersion: "1.37.2",
		Set:         []string{"agent.metrics.serviceMonitor.enabled=true", "agent.metrics.tlsSecretName=agent-metrics-tls"},
		APIVersions: []string{"monitoring.coreos.com/v1"}})
	if err != nil {
		t.Fatal(err)
	}
	role := fmt.Sprint(find(t, ms, "ClusterRole", "gpu-node-agent")["rules"])
	for _, r := range []string{"apiGroups:[authentication.k8s.io] resources:[tokenreviews] verbs:[create]",
		"apiGroups:[authorization.k8s.io] resources:[subjectaccessreviews] verbs:[create]"} {
		if !strings.Contains(role, r) {
			t.Errorf("the agent's role lacks %s: %s", r, role)
		}
	}
	spec := find(t, ms, "DaemonSet", "gpu-node-agent")["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	c := spec["containers"].([]any)[0].(map[string]any)
	args := fmt.Sprint(c["args"])
	for _, a := range []string{"--metrics-addr=:9464", "--metrics-secure=true",
		"--tls-cert-file=/etc/tessera/metrics-tls/tls.crt", "--tls-private-key-file=/etc/tessera/metrics-tls/tls.key"} {
		if !strings.Contains(args, a) {
			t.Errorf("agent args lack %s: %s", a, args)
		}
	}
	if got := fmt.Sprint(spec["volumes"]); !strings.Contains(got, "name:metrics-tls secret:map[secretName:agent-metrics-tls]") {
		t.Errorf("volumes %s", got)
	}
	// kubelet's probes stay plain HTTP on the health port, without credentials.
	if got := fmt.Sprint(c["livenessProbe"], c["readinessProbe"]); strings.Contains(got, "HTTPS") || !strings.Contains(got, "port:health") {
		t.Errorf("probes %s", got)
	}
	ep := fmt.Sprint(find(t, ms, "ServiceMonitor", "gpu-node-agent")["spec"].(map[string]any)["endpoints"])
	for _, s := range []string{"scheme:https", "bearerTokenFile:/var/run/secrets/kubernetes.io/serviceaccount/token", "insecureSkipVerify:true"} {
		if !strings.Contains(ep, s) {
			t.Errorf("ServiceMonitor endpoint lacks %s: %s", s, ep)
		}
	}

	ms, err = Render(Options{ChartDir: chartDir(t), Release: "gpu", Namespace: "gpu-system", KubeVersion: "1.37.2",
		Set: []string{"agent.metrics.enabled=false"}})
	if err != nil {
		t.Fatal(err)
	}
	if role := fmt.Sprint(find(t, ms, "ClusterRole", "gpu-node-agent")["rules"]); strings.Contains(role, "review") {
		t.Errorf("without metrics the agent may still create reviews: %s", role)
	}
}

// TestRenderRejects checks that bad values fail with a message naming the problem,
// at render time rather than in the cluster.
func TestRenderRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		kube string
		want string
	}{
		{"unknown policy", []string{"scheduler.profiles[0].nodePolicy=Pack"}, "", "nodePolicy"},
		{"service monitor without its CRD", []string{"scheduler.metrics.serviceMonitor.enabled=true"}, "", "monitoring.coreos.com/v1"},
		{"resource names of two domains", []string{"resourceNames.gpu=a.io/gpu,resourceNames.gpuMemory=b.io/mem,resourceNames.gpuMemoryPercent=a.io/p,resourceNames.gpuCores=a.io/c"}, "", "one domain"},
		{"incomplete resource names", []string{"resourceNames.gpu=a.io/gpu"}, "", "resourceNames.gpuMemory"},
		{"device plugin name mismatch", []string{"resourceNames.gpu=a.io/gpus,resourceNames.gpuMemory=a.io/mem,resourceNames.gpuMemoryPercent=a.io/p,resourceNames.gpuCores=a.io/c"}, "", "a.io/gpu"},
		{"relative host path", []string{"agent.hostPaths.limitsRoot=run/tessera"}, "", "limitsRoot"},
		{"watchdog action", []string{"agent.watchdog.action=stop"}, "", "action"},
		{"fallback binding with NRI", []string{"agent.bindFallback.enabled=true"}, "", "agent.nri.enabled=false"},
		{"fallback binding without the hook", []string{"agent.bindFallback.enabled=true", "agent.nri.enabled=false", "agent.hook.enabled=false"}, "", "agent.hook.enabled"},
		{"relative driver root", []string{"agent.cdi.driverRoot=run/nvidia/driver"}, "", "driverRoot"},
		{"unknown NRI fallback", []string{"agent.nri.unavailable=ignore"}, "", "unavailable"},
		{"NRI fallback without the hook", []string{"agent.nri.unavailable=fallback", "agent.hook.enabled=false"}, "", "agent.nri.unavailable=fallback needs"},
		{"relative CDI directory", []string{"agent.hostPaths.cdiSpecDir=var/run/cdi"}, "", "cdiSpecDir"},
		{"relative DRA plugin directory", []string{"agent.dra.enabled=true", "agent.hostPaths.draPluginDir=plugins"}, "", "draPluginDir"},
		{"DRA without a node label", []string{"agent.dra.enabled=true", "agent.dra.nodeLabel="}, "", "agent.dra.nodeLabel"},
		{"too old a cluster", nil, "1.33.4", "requires Kubernetes"},
		{"too new a cluster", nil, "1.38.0", "requires Kubernetes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(Options{ChartDir: chartDir(t), Set: tc.set, KubeVersion: tc.kube})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// TestPlainManifestsUpToDate keeps config/deploy/manifests what the chart renders.
func TestPlainManifestsUpToDate(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(chartDir(t)), "manifests", "tessera.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := Render(Options{ChartDir: chartDir(t), NamespaceObject: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(raw), string(Join(ms))) {
		t.Error("config/deploy/manifests/tessera.yaml is out of date with the chart: run make manifests")
	}
}

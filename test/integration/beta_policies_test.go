// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	genericfeatures "k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	"k8s.io/kubernetes/test/integration/framework"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/config/deploy"
)

// startClusterWithBetaPolicies starts the in-process API server as a cluster of
// Kubernetes 1.34 or 1.35 that turned MutatingAdmissionPolicy's beta on
// (--feature-gates=MutatingAdmissionPolicy=true
// --runtime-config=admissionregistration.k8s.io/v1beta1=true), otherwise as
// startCluster does.
func startClusterWithBetaPolicies(t *testing.T) *cluster {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, genericfeatures.MutatingAdmissionPolicy, true)
	tCtx := ktesting.Init(t)
	client, rc, tearDown := framework.StartTestServer(tCtx, t, framework.TestServerSetup{
		ModifyServerRunOptions: func(o *options.ServerRunOptions) {
			// The plugins testutils.InitTestAPIServer turns off, for the same reasons.
			o.Admission.GenericAdmission.DisablePlugins = []string{"ServiceAccount", "TaintNodesByCondition", "Priority", "StorageObjectInUseProtection"}
			if o.APIEnablement.RuntimeConfig == nil {
				o.APIEnablement.RuntimeConfig = cliflag.ConfigurationMap{}
			}
			o.APIEnablement.RuntimeConfig["admissionregistration.k8s.io/v1beta1"] = "true"
		},
	})
	t.Cleanup(func() {
		tCtx.Cancel("tearing down the API server")
		tearDown()
	})
	ns := framework.CreateNamespaceOrDie(client, "tessera", t)
	c := &cluster{t: t, ctx: tCtx, client: client, ns: ns.Name}
	c.kubeconfig = writeKubeconfig(t, rc)
	return c
}

// TestChartBetaMutatingPolicies: on Kubernetes 1.34 and 1.35 with the beta turned on,
// the chart renders its three MutatingAdmissionPolicies as v1beta1 (from the server's
// discovery, as helm install does), the API server takes them, and they do what they
// do on 1.36 and later: a GPU pod that names no scheduler gets the first Tessera
// profile, its container its quota resources, and the NRI plugin requirement. From
// 1.36 the v1 policies are covered by TestChartSchedulerName, TestChartQuota and
// TestChartRequireNRIPlugin.
func TestChartBetaMutatingPolicies(t *testing.T) {
	if v := builtKubeVersion(t); kubeMinor(v) != "1.34" && kubeMinor(v) != "1.35" {
		t.Skipf("Kubernetes %s: MutatingAdmissionPolicy is GA from 1.36", v)
	}
	c := startClusterWithBetaPolicies(t)
	a := c.applier()
	applied := 0
	for _, m := range c.renderChart(deploy.Options{Namespace: c.ns}) {
		if m.Kind != "MutatingAdmissionPolicy" && m.Kind != "MutatingAdmissionPolicyBinding" {
			continue
		}
		if !strings.HasPrefix(m.YAML, "apiVersion: admissionregistration.k8s.io/v1beta1\n") &&
			!strings.Contains(m.YAML, "\napiVersion: admissionregistration.k8s.io/v1beta1\n") {
			t.Errorf("%s %s is not v1beta1:\n%s", m.Kind, m.Name, m.YAML)
		}
		if err := a.apply(m.YAML, false); err != nil {
			t.Fatalf("applying %s %s: %v", m.Kind, m.Name, err)
		}
		applied++
	}
	// On 1.34 the quota mutation is left out: its expression needs CEL's lists.flatten,
	// which 1.34 does not allow in new expressions (the quota check stands alone there).
	quotaMutation := kubeMinor(builtKubeVersion(t)) != "1.34"
	if want := map[bool]int{true: 6, false: 4}[quotaMutation]; applied != want {
		t.Fatalf("the chart rendered %d MutatingAdmissionPolicies and bindings for a server serving the beta, want %d", applied, want)
	}
	// The chart's first profile, which GPU pods naming no scheduler get.
	const profile = "tessera-fragmentation"
	pod := newPod(c.ns, "beta", "", nil, gpuLimits{name: "c", gpu: "2", mem: "8192"})
	var got *v1.Pod
	// The policies act once the API server's policy informers have them.
	chartWaitFor(t, c.ctx, "the policies to act", func() bool {
		p, err := c.client.CoreV1().Pods(c.ns).Create(c.ctx, pod.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Logf("creating the pod: %v", err)
			return false
		}
		got = p
		return p.Spec.SchedulerName == profile && len(p.Annotations) > 0 && (!quotaMutation || len(p.Spec.Containers[0].Resources.Requests) > 2)
	})
	if got.Spec.SchedulerName != profile {
		t.Errorf("schedulerName %q, want %q", got.Spec.SchedulerName, profile)
	}
	res := got.Spec.Containers[0].Resources
	for _, rl := range []v1.ResourceList{res.Limits, res.Requests} {
		if q := rl[api.ResourceTotalGPUMemory]; quotaMutation && q.Value() != 16384 {
			t.Errorf("%s %s, want 16384 (2 GPUs × 8192 MiB): %v", api.ResourceTotalGPUMemory, q.String(), rl)
		}
	}
	if v := got.Annotations["required-plugins.noderesource.dev/container.c"]; v != `["tessera"]` {
		t.Errorf("NRI plugin requirement %q, want [\"tessera\"]: %v", v, got.Annotations)
	}
}

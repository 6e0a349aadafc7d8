// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"cmp"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	admissionv1beta1 "k8s.io/api/admissionregistration/v1beta1"
	"sigs.k8s.io/yaml"
)

// The API versions a cluster's discovery lists for the admission policy kinds, as Helm
// passes them to .Capabilities.APIVersions on install: group/version/Kind.
const (
	discoveredVAP       = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
	discoveredMAP       = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
	discoveredMAPBeta   = "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"
	mapBindingKind      = "MutatingAdmissionPolicyBinding"
	mapKind             = "MutatingAdmissionPolicy"
	schedulerImageRepo  = "ghcr.io/tessera-dev/tessera-scheduler:"
	mutatingPoliciesAll = 3 // schedulerName, quota resources, NRI plugin required
)

// TestRenderPerKubeMinor renders the chart for each Kubernetes minor Tessera supports,
// as helm template (no discovery) and as helm install (the cluster's discovery) would:
// the scheduler image is that minor's build, and the MutatingAdmissionPolicies come in
// the API version the server serves, or not at all (beta before 1.36, off unless the
// API server turns it on), while the quota check stays.
func TestRenderPerKubeMinor(t *testing.T) {
	for _, tc := range []struct {
		name, kube string
		apis       []string
		set        []string
		image      string // tag or @digest after the repository
		mapAPI     string // apiVersion of the MutatingAdmissionPolicies; "" none
		policies   int    // how many; default mutatingPoliciesAll where mapAPI is set
	}{
		{name: "1.34 template", kube: "1.34.4", image: "0.1.0-k8s1.34"},
		{name: "1.34 beta off", kube: "1.34.4", apis: []string{discoveredVAP}, image: "0.1.0-k8s1.34"},
		// 1.34's CEL has no lists.flatten for new expressions: no quota mutation.
		{name: "1.34 beta on", kube: "1.34.4", apis: []string{discoveredVAP, discoveredMAPBeta}, image: "0.1.0-k8s1.34", mapAPI: "admissionregistration.k8s.io/v1beta1", policies: 2},
		{name: "1.35 template", kube: "v1.35.4", image: "0.1.0-k8s1.35"},
		{name: "1.35 beta on", kube: "1.35.4", apis: []string{discoveredVAP, discoveredMAPBeta}, image: "0.1.0-k8s1.35", mapAPI: "admissionregistration.k8s.io/v1beta1"},
		{name: "1.35 managed", kube: "v1.35.2-eks-3025e55", image: "0.1.0-k8s1.35"},
		{name: "1.36 template", kube: "1.36.3", image: "0.1.0-k8s1.36", mapAPI: "admissionregistration.k8s.io/v1"},
		{name: "1.36 installed", kube: "1.36.3", apis: []string{discoveredVAP, discoveredMAP}, image: "0.1.0-k8s1.36", mapAPI: "admissionregistration.k8s.io/v1"},
		{name: "1.36 API turned off", kube: "1.36.3", apis: []string{discoveredVAP}, image: "0.1.0-k8s1.36"},
		{name: "1.37 template", kube: "1.37.2", image: "0.1.0", mapAPI: "admissionregistration.k8s.io/v1"},
		{name: "1.37 installed", kube: "1.37.2", apis: []string{discoveredVAP, discoveredMAP}, image: "0.1.0", mapAPI: "admissionregistration.k8s.io/v1"},
		{name: "tag set", kube: "1.34.4", set: []string{"image.tag=2.0.0"}, image: "2.0.0-k8s1.34"},
		{name: "scheduler tag set", kube: "1.36.3", set: []string{"image.tag=2.0.0", "scheduler.image.tag=2.0.1"}, image: "2.0.1-k8s1.36", mapAPI: "admissionregistration.k8s.io/v1"},
		{name: "not per minor", kube: "1.34.4", set: []string{"scheduler.image.perKubeMinor=false"}, image: "0.1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := Render(Options{ChartDir: chartDir(t), KubeVersion: tc.kube, APIVersions: tc.apis, Set: tc.set})
			if err != nil {
				t.Fatal(err)
			}
			dep := find(t, ms, "Deployment", "tessera-scheduler")
			image := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["image"]
			if want := schedulerImageRepo + tc.image; image != want {
				t.Errorf("scheduler image %v, want %s", image, want)
			}
			got := kinds(ms)
			if tc.mapAPI == "" {
				if got[mapKind]+got[mapBindingKind] != 0 {
					t.Errorf("%d MutatingAdmissionPolicies and %d bindings on a server without the API", got[mapKind], got[mapBindingKind])
				}
			} else if want := cmp.Or(tc.policies, mutatingPoliciesAll); got[mapKind] != want || got[mapBindingKind] != want {
				t.Errorf("%d MutatingAdmissionPolicies and %d bindings, want %d each", got[mapKind], got[mapBindingKind], want)
			}
			// The quota check is there on every minor: without the mutation, pods carry
			// their totals and the check refuses wrong ones.
			find(t, ms, "ValidatingAdmissionPolicy", "tessera-quota-resources")
			for _, m := range ms {
				if m.Kind != mapKind && m.Kind != mapBindingKind {
					continue
				}
				if !strings.HasPrefix(m.YAML, "apiVersion: "+tc.mapAPI+"\n") && !strings.Contains(m.YAML, "\napiVersion: "+tc.mapAPI+"\n") {
					t.Errorf("%s %s is not %s:\n%s", m.Kind, m.Name, tc.mapAPI, m.YAML)
				}
				decodeStrict(t, m, tc.mapAPI)
			}
		})
	}
}

// decodeStrict decodes a MutatingAdmissionPolicy or its binding into the API type of
// its version, refusing unknown fields: what the API server's schema would refuse.
func decodeStrict(t *testing.T, m Manifest, apiVersion string) {
	t.Helper()
	var obj any
	switch {
	case apiVersion == "admissionregistration.k8s.io/v1beta1" && m.Kind == mapKind:
		obj = &admissionv1beta1.MutatingAdmissionPolicy{}
	case apiVersion == "admissionregistration.k8s.io/v1beta1":
		obj = &admissionv1beta1.MutatingAdmissionPolicyBinding{}
	case m.Kind == mapKind:
		obj = &admissionv1.MutatingAdmissionPolicy{}
	default:
		obj = &admissionv1.MutatingAdmissionPolicyBinding{}
	}
	if err := yaml.UnmarshalStrict([]byte(m.YAML), obj); err != nil {
		t.Errorf("%s %s as %s: %v", m.Kind, m.Name, apiVersion, err)
	}
}

// TestRenderDigestPinsSchedulerImage: a digest names one image, which is used on any
// minor as it is.
func TestRenderDigestPinsSchedulerImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	ms, err := Render(Options{ChartDir: chartDir(t), KubeVersion: "1.35.4", Set: []string{"scheduler.image.digest=" + digest}})
	if err != nil {
		t.Fatal(err)
	}
	dep := find(t, ms, "Deployment", "tessera-scheduler")
	raw, _ := yaml.Marshal(dep)
	if !strings.Contains(string(raw), "image: ghcr.io/tessera-dev/tessera-scheduler@"+digest+"\n") {
		t.Errorf("scheduler image is not the digest:\n%s", raw)
	}
}

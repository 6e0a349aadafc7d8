// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// podSpecOf is a DaemonSet's pod spec and its agent container's args.
func podSpecOf(ds map[string]any) (map[string]any, []string) {
	spec := ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	var args []string
	for _, a := range spec["containers"].([]any)[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	return spec, args
}

// nodeTerms is the node affinity's required terms of a pod spec.
func nodeTerms(spec map[string]any) []any {
	aff, _ := spec["affinity"].(map[string]any)
	na, _ := aff["nodeAffinity"].(map[string]any)
	req, _ := na["requiredDuringSchedulingIgnoredDuringExecution"].(map[string]any)
	terms, _ := req["nodeSelectorTerms"].([]any)
	return terms
}

func hasArg(args []string, prefix string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, prefix) })
}

// TestRenderDRA: with agent.dra.enabled the chart runs a second agent DaemonSet on the
// labelled nodes, in DRA mode and without the device plugin, while the device-plugin
// agent avoids them; the two select disjoint pods, the metrics Service both; the
// agent may manage ResourceSlices and read claims; the DeviceClass is installed.
// Off (the default), none of it is rendered.
func TestRenderDRA(t *testing.T) {
	off, err := Render(Options{ChartDir: chartDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	if k := kinds(off); k["DaemonSet"] != 1 || k["DeviceClass"] != 0 {
		t.Errorf("DRA off: %v", k)
	}
	ms, err := Render(Options{ChartDir: chartDir(t), Set: []string{"agent.dra.enabled=true", "agent.nri.unavailable=fallback"}})
	if err != nil {
		t.Fatal(err)
	}
	plugin, dra := find(t, ms, "DaemonSet", "tessera-node-agent"), find(t, ms, "DaemonSet", "tessera-node-agent-dra")
	pSpec, pArgs := podSpecOf(plugin)
	dSpec, dArgs := podSpecOf(dra)

	for _, a := range []string{"--dra", "--device-plugin=false", "--dra-plugin-dir=/var/lib/kubelet/plugins/gpu.tessera.dev",
		"--dra-registrar-dir=/var/lib/kubelet/plugins_registry", "--dra-cdi-spec-dir=/var/run/cdi", "--nri-unavailable=refuse"} {
		if !slices.Contains(dArgs, a) {
			t.Errorf("DRA agent args lack %s: %v", a, dArgs)
		}
	}
	for _, a := range []string{"--device-plugin-dir", "--bind-fallback", "--bind-socket"} {
		if hasArg(dArgs, a) {
			t.Errorf("DRA agent args have %s", a)
		}
	}
	if hasArg(pArgs, "--dra") || !slices.Contains(pArgs, "--device-plugin=true") || !slices.Contains(pArgs, "--nri-unavailable=fallback") {
		t.Errorf("device-plugin agent args %v", pArgs)
	}
	vols := fmt.Sprint(dSpec["volumes"])
	for _, v := range []string{"path:/var/lib/kubelet/plugins/gpu.tessera.dev", "path:/var/lib/kubelet/plugins_registry", "path:/var/run/cdi"} {
		if !strings.Contains(vols, v) {
			t.Errorf("DRA agent volumes lack %s: %s", v, vols)
		}
	}
	if strings.Contains(vols, "device-plugins") {
		t.Errorf("DRA agent mounts kubelet's device-plugin directory")
	}

	// Disjoint nodes.
	want := map[string]string{
		"plugin": "[map[matchExpressions:[map[key:tessera.dev/gpu-mode operator:NotIn values:[dra]]]]]",
		"dra":    "[map[matchExpressions:[map[key:tessera.dev/gpu-mode operator:In values:[dra]]]]]",
	}
	if got := fmt.Sprint(nodeTerms(pSpec)); got != want["plugin"] {
		t.Errorf("device-plugin agent node terms %s", got)
	}
	if got := fmt.Sprint(nodeTerms(dSpec)); got != want["dra"] {
		t.Errorf("DRA agent node terms %s", got)
	}
	// Disjoint pods; the metrics Service selects both.
	sel := func(ds map[string]any) map[string]any {
		return ds["spec"].(map[string]any)["selector"].(map[string]any)["matchLabels"].(map[string]any)
	}
	labels := func(ds map[string]any) map[string]any {
		return ds["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)["labels"].(map[string]any)
	}
	matches := func(sel, labels map[string]any) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	if matches(sel(plugin), labels(dra)) || matches(sel(dra), labels(plugin)) || !matches(sel(dra), labels(dra)) {
		t.Errorf("selectors overlap: %v / %v", sel(plugin), sel(dra))
	}
	svc := find(t, ms, "Service", "tessera-node-agent-metrics")["spec"].(map[string]any)["selector"].(map[string]any)
	if !matches(svc, labels(plugin)) || !matches(svc, labels(dra)) {
		t.Errorf("metrics Service selector %v misses an agent", svc)
	}

	role := fmt.Sprint(find(t, ms, "ClusterRole", "tessera-node-agent")["rules"])
	if !strings.Contains(role, "resources:[resourceslices] verbs:[get list watch create update delete]") || !strings.Contains(role, "resources:[resourceclaims] verbs:[get]") {
		t.Errorf("agent ClusterRole: %s", role)
	}
	// Only its own node's slices, by the node name in its token.
	own := fmt.Sprint(find(t, ms, "ValidatingAdmissionPolicy", "tessera-node-agent-own-slices")["spec"])
	if !strings.Contains(own, "object.spec.nodeName == variables.nodeName") || !strings.Contains(own, "resources:[resourceslices]") {
		t.Errorf("own-slices policy: %s", own)
	}
	find(t, ms, "ValidatingAdmissionPolicyBinding", "tessera-node-agent-own-slices")
	if k := kinds(off); k["ValidatingAdmissionPolicy"] != kinds(ms)["ValidatingAdmissionPolicy"]-1 {
		t.Errorf("admission policies: %d without DRA, %d with", k["ValidatingAdmissionPolicy"], kinds(ms)["ValidatingAdmissionPolicy"])
	}
	if !strings.Contains(fmt.Sprint(find(t, ms, "DeviceClass", "gpu.tessera.dev")["spec"]), `device.driver == "gpu.tessera.dev"`) {
		t.Error("DeviceClass selector")
	}
	// Whole GPUs of the extended resource, by the chart's resource name.
	if whole := fmt.Sprint(find(t, ms, "DeviceClass", "whole-gpu.tessera.dev")["spec"]); !strings.Contains(whole, "extendedResourceName:tessera.dev/gpu") ||
		!strings.Contains(whole, `sharing == "time-sliced"`) {
		t.Errorf("whole-GPU DeviceClass: %s", whole)
	}
	// The scheduler places claims on them.
	if cm := fmt.Sprint(find(t, ms, "ConfigMap", "tessera-scheduler")); !strings.Contains(cm, "TesseraDynamicResources") {
		t.Error("the scheduler config lacks TesseraDynamicResources")
	}
}

// TestRenderDRAWithNodeAffinity: the mode's label is added to every term of an
// affinity the values give (here the GPU Operator's two terms), not in place of it.
func TestRenderDRAWithNodeAffinity(t *testing.T) {
	ms, err := Render(Options{ChartDir: chartDir(t), ValueFiles: []string{gpuOperatorValues(t)}, Set: []string{"agent.dra.enabled=true", "agent.dra.deviceClass=false", "agent.dra.wholeGPUClass=false"}})
	if err != nil {
		t.Fatal(err)
	}
	if kinds(ms)["DeviceClass"] != 0 {
		t.Error("DeviceClass rendered with agent.dra.deviceClass=false and agent.dra.wholeGPUClass=false")
	}
	for name, op := range map[string]string{"tessera-node-agent": "NotIn", "tessera-node-agent-dra": "In"} {
		spec, _ := podSpecOf(find(t, ms, "DaemonSet", name))
		terms := nodeTerms(spec)
		if len(terms) != 2 {
			t.Fatalf("%s: %d terms", name, len(terms))
		}
		for _, term := range terms {
			got := fmt.Sprint(term)
			if !strings.Contains(got, "key:nvidia.com/gpu.deploy.client") || !strings.Contains(got, "map[key:tessera.dev/gpu-mode operator:"+op+" values:[dra]]") {
				t.Errorf("%s: term %s", name, got)
			}
		}
	}
}

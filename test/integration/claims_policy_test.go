// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/config/deploy"
)

// TestChartClaimsFromRequests: with agent.dra.claimsFromRequests on, the chart's
// MutatingAdmissionPolicy gives each GPU container that asks a share by the request
// names (count and memory in MiB, cores optional) a claim of the template named after
// its shape and takes the request names out, in the labelled namespaces only; it
// leaves whole GPUs, memory in percent, pods with a Tessera annotation and other
// namespaces' pods as they are, and the quota policy then counts nothing for the
// converted containers. Pods are created in dry-run mode.
func TestChartClaimsFromRequests(t *testing.T) {
	c := startCluster(t)
	c.needMutatingPolicies(t)
	const label = "tessera.dev/claims-from-requests"
	ns, err := c.client.CoreV1().Namespaces().Get(c.ctx, c.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[label] = "true"
	if _, err := c.client.CoreV1().Namespaces().Update(c.ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := c.ns + "-plain"
	c.createNamespace(other)

	a := c.applier()
	n := 0
	// The chart's templates for three shapes in the test's namespace.
	shapes := []any{
		map[string]any{"gpus": 1, "memoryMiB": 8192, "cores": 30},
		map[string]any{"gpus": 2, "memoryMiB": 4096},
		map[string]any{"gpus": 1, "memoryMiB": 8192, "cores": 30, "workConserving": true},
	}
	templates := map[string]*resourceapi.ResourceClaimTemplate{}
	for _, m := range c.renderChart(deploy.Options{Namespace: c.ns, Set: []string{"agent.dra.enabled=true", "agent.dra.claimsFromRequests.enabled=true"},
		Values: map[string]any{"agent": map[string]any{"dra": map[string]any{"claimsFromRequests": map[string]any{
			"templates": map[string]any{"namespaces": []any{c.ns}, "shapes": shapes}}}}}}) {
		if m.Kind == "ResourceClaimTemplate" {
			// The API server accepts each as rendered.
			tpl := &resourceapi.ResourceClaimTemplate{}
			if err := yaml.Unmarshal([]byte(m.YAML), tpl); err != nil {
				t.Fatal(err)
			}
			got, err := c.client.ResourceV1().ResourceClaimTemplates(c.ns).Create(c.ctx, tpl, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("ResourceClaimTemplate %s: %v", m.Name, err)
			}
			templates[got.Name] = got
		}
		if m.Name == chartRelease+"-claims-from-requests" || m.Name == quotaPolicy || m.Name == chartRelease+"-scheduler-for-gpu-pods" {
			if err := a.apply(m.YAML, false); err != nil {
				t.Fatalf("applying %s %s: %v", m.Kind, m.Name, err)
			}
			if m.Name == chartRelease+"-claims-from-requests" {
				n++
			}
		}
	}
	if n != 2 {
		t.Fatalf("the chart rendered %d claims-from-requests objects, want the policy and its binding", n)
	}

	q := resource.MustParse
	type container = policyContainer
	pod := func(namespace string, annotations map[string]string, cs ...container) *v1.Pod {
		return policyPod(metav1.ObjectMeta{Namespace: namespace, Annotations: annotations}, cs...)
	}
	create := func(p *v1.Pod) (*v1.Pod, error) {
		return c.client.CoreV1().Pods(p.Namespace).Create(c.ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	}
	admitted := func(p *v1.Pod) *v1.Pod {
		got, err := create(p)
		if err != nil {
			t.Fatalf("creating a pod (dry run): %v", err)
		}
		return got
	}
	// shape: the pod's claims as "name=template", then per container (init first) its
	// claims and the tessera.dev names left in its limits and requests.
	shape := func(p *v1.Pod) string {
		var out []string
		for _, rc := range p.Spec.ResourceClaims {
			tmpl := ""
			if rc.ResourceClaimTemplateName != nil {
				tmpl = *rc.ResourceClaimTemplateName
			}
			out = append(out, rc.Name+"="+tmpl)
		}
		for _, k := range append(append([]v1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			var names []string
			for _, cl := range k.Resources.Claims {
				names = append(names, "claim:"+cl.Name)
			}
			for _, rl := range []v1.ResourceList{k.Resources.Limits, k.Resources.Requests} {
				for r := range rl {
					if strings.HasPrefix(string(r), "tessera.dev/") {
						names = append(names, string(r))
					}
				}
			}
			slices.Sort(names)
			out = append(out, k.Name+"["+strings.Join(names, " ")+"]")
		}
		return strings.Join(out, " ")
	}
	share := v1.ResourceList{"tessera.dev/gpu": q("1"), "tessera.dev/gpu-memory": q("8192"), "tessera.dev/gpu-cores": q("30"), v1.ResourceCPU: q("1")}
	// Until all the policies are in effect, a pod may meet the quota check before its
	// mutation.
	chartWaitFor(t, c.ctx, "the claims-from-requests and quota policies to be applied", func() bool {
		converted, err := create(pod(c.ns, nil, container{limits: share}))
		if err != nil || len(converted.Spec.ResourceClaims) != 1 || converted.Spec.SchedulerName != "tessera-fragmentation" {
			return false
		}
		whole, err := create(pod(c.ns, nil, container{limits: v1.ResourceList{"tessera.dev/gpu": q("1")}}))
		if err != nil {
			return false
		}
		_, counted := whole.Spec.Containers[0].Resources.Limits["tessera.dev/total-whole-gpus"]
		return counted
	})

	// A converted pod goes to a Tessera profile, whichever of the two policies runs
	// first (the scheduler-name policy also matches the claims' template names).
	if got := admitted(pod(c.ns, nil, container{limits: share})).Spec.SchedulerName; got != "tessera-fragmentation" {
		t.Errorf("a converted pod: schedulerName %q, want tessera-fragmentation", got)
	}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want string
	}{
		{"a share with cores", pod(c.ns, nil, container{limits: share}),
			"tessera-gpu-0=tessera-gpu-1x8192mi-30c c0[claim:tessera-gpu-0]"},
		{"two GPUs, no cores", pod(c.ns, nil, container{limits: v1.ResourceList{"tessera.dev/gpu": q("2"), "tessera.dev/gpu-memory": q("4096")}}),
			"tessera-gpu-0=tessera-gpu-2x4096mi c0[claim:tessera-gpu-0]"},
		{"an init container and a container, each its own claim",
			pod(c.ns, nil, container{init: true, limits: share}, container{limits: v1.ResourceList{v1.ResourceCPU: q("1")}}, container{limits: share}),
			"tessera-gpu-0=tessera-gpu-1x8192mi-30c tessera-gpu-2=tessera-gpu-1x8192mi-30c c0[claim:tessera-gpu-0] c1[] c2[claim:tessera-gpu-2]"},
		{"whole GPUs, left to the whole-GPU class", pod(c.ns, nil, container{limits: v1.ResourceList{"tessera.dev/gpu": q("2")}}),
			"c0[tessera.dev/gpu tessera.dev/gpu tessera.dev/total-whole-gpus tessera.dev/total-whole-gpus]"},
		{"memory in percent, which a claim cannot ask", pod(c.ns, nil, container{limits: v1.ResourceList{"tessera.dev/gpu": q("1"), "tessera.dev/gpu-memory-percent": q("50")}}),
			"c0[tessera.dev/gpu tessera.dev/gpu tessera.dev/gpu-memory-percent tessera.dev/gpu-memory-percent tessera.dev/total-gpu-memory-percent tessera.dev/total-gpu-memory-percent]"},
		{"work-conserving", pod(c.ns, map[string]string{"tessera.dev/gpu-work-conserving": "true"}, container{limits: share}),
			"tessera-gpu-0=tessera-gpu-1x8192mi-30c-wc c0[claim:tessera-gpu-0]"},
		{"not work-conserving", pod(c.ns, map[string]string{"tessera.dev/gpu-work-conserving": "false"}, container{limits: share}),
			"tessera-gpu-0=tessera-gpu-1x8192mi-30c c0[claim:tessera-gpu-0]"},
		{"work-conserving and another Tessera annotation", pod(c.ns, map[string]string{"tessera.dev/gpu-work-conserving": "true", "tessera.dev/gpu-model-include": "H100"}, container{limits: share}),
			"c0[tessera.dev/gpu tessera.dev/gpu tessera.dev/gpu-cores tessera.dev/gpu-cores tessera.dev/gpu-memory tessera.dev/gpu-memory " +
				"tessera.dev/total-gpu-cores tessera.dev/total-gpu-cores tessera.dev/total-gpu-memory tessera.dev/total-gpu-memory]"},
		{"a pod with another Tessera annotation", pod(c.ns, map[string]string{"tessera.dev/gpu-sharing": "mps"}, container{limits: share}),
			"c0[tessera.dev/gpu tessera.dev/gpu tessera.dev/gpu-cores tessera.dev/gpu-cores tessera.dev/gpu-memory tessera.dev/gpu-memory " +
				"tessera.dev/total-gpu-cores tessera.dev/total-gpu-cores tessera.dev/total-gpu-memory tessera.dev/total-gpu-memory]"},
		{"a namespace without the label", pod(other, nil, container{limits: share}),
			"c0[tessera.dev/gpu tessera.dev/gpu tessera.dev/gpu-cores tessera.dev/gpu-cores tessera.dev/gpu-memory tessera.dev/gpu-memory " +
				"tessera.dev/total-gpu-cores tessera.dev/total-gpu-cores tessera.dev/total-gpu-memory tessera.dev/total-gpu-memory]"},
	} {
		if got := shape(admitted(tc.pod)); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}

	// The chart's templates are the ones the converted pods above name, and say what
	// their names say.
	for name, want := range map[string]string{
		"tessera-gpu-1x8192mi-30c":    "count:1 memory:8Gi cores:30",
		"tessera-gpu-2x4096mi":        "count:2 memory:4Gi distinct:gpu.tessera.dev/uuid",
		"tessera-gpu-1x8192mi-30c-wc": `count:1 memory:8Gi cores:30 selector:device.attributes["gpu.tessera.dev"].sharing == "time-sliced" config:{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true}`,
	} {
		tpl, ok := templates[name]
		if !ok {
			t.Errorf("the chart rendered no template %s (rendered: %v)", name, slices.Sorted(maps.Keys(templates)))
			continue
		}
		d := tpl.Spec.Spec.Devices
		r := d.Requests[0].Exactly
		got := fmt.Sprintf("count:%d", r.Count)
		for _, k := range []resourceapi.QualifiedName{"memory", "cores"} {
			if q, ok := r.Capacity.Requests[k]; ok {
				got += fmt.Sprintf(" %s:%s", k, q.String())
			}
		}
		for _, c := range d.Constraints {
			got += fmt.Sprintf(" distinct:%s", *c.DistinctAttribute)
		}
		for _, sel := range r.Selectors {
			got += " selector:" + sel.CEL.Expression
		}
		for _, cfg := range d.Config {
			got += " config:" + string(cfg.Opaque.Parameters.Raw)
			if _, err := api.DecodeGPUConfig(cfg.Opaque.Parameters.Raw); err != nil {
				t.Errorf("template %s: %v", name, err)
			}
		}
		if got != want {
			t.Errorf("template %s:\n got %s\nwant %s", name, got, want)
		}
	}

	// A pod that already has a claim of its own keeps it; the share's claim comes after.
	p := pod(c.ns, nil, container{limits: share})
	tmpl := "someone-elses"
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "nic", ResourceClaimTemplateName: &tmpl}}
	p.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "nic"}}
	if got, want := shape(admitted(p)), "nic=someone-elses tessera-gpu-0=tessera-gpu-1x8192mi-30c c0[claim:nic claim:tessera-gpu-0]"; got != want {
		t.Errorf("a pod with a claim of its own:\n got %s\nwant %s", got, want)
	}
}

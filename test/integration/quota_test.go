// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/config/deploy"
)

// quotaPolicy is the name of the chart's quota-resource policies and their bindings.
const quotaPolicy = chartRelease + "-quota-resources"

// quotaContainer is one container of a quota test pod: limits only (Kubernetes defaults
// the requests of extended resources from them), or requests too.
type quotaContainer struct {
	init     bool
	sidecar  bool
	limits   v1.ResourceList
	requests v1.ResourceList
}

func quotaPod(ns string, ann map[string]string, cs ...quotaContainer) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "q-", Namespace: ns, Annotations: ann}, Spec: v1.PodSpec{SchedulerName: "tessera-binpack"}}
	for i, ct := range cs {
		k := v1.Container{Name: fmt.Sprintf("c%d", i), Image: "registry.k8s.io/pause:3.10",
			Resources: v1.ResourceRequirements{Limits: ct.limits, Requests: ct.requests}}
		if ct.sidecar {
			always := v1.ContainerRestartPolicyAlways
			k.RestartPolicy = &always
		}
		if ct.init || ct.sidecar {
			p.Spec.InitContainers = append(p.Spec.InitContainers, k)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, k)
		}
	}
	return p
}

// quotaJob is a Job whose pod template is p: Kueue counts a Job from its template.
func quotaJob(p *v1.Pod) *batchv1.Job {
	t := v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: p.Annotations}, Spec: *p.Spec.DeepCopy()}
	t.Spec.RestartPolicy = v1.RestartPolicyNever
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{GenerateName: p.GenerateName, Namespace: p.Namespace},
		Spec: batchv1.JobSpec{Template: t}}
}

// quotaOf returns a container's quota resources in limits and in requests, failing
// when the two differ (Kubernetes requires equal requests and limits of extended
// resources; the API server would have refused the pod).
func quotaOf(t *testing.T, c *v1.Container) map[string]int64 {
	t.Helper()
	get := func(rl v1.ResourceList) map[string]int64 {
		out := map[string]int64{}
		for k, q := range rl {
			if api.IsQuotaResource(k) {
				out[string(k)] = q.Value()
			}
		}
		return out
	}
	l, r := get(c.Resources.Limits), get(c.Resources.Requests)
	if fmt.Sprint(l) != fmt.Sprint(r) {
		t.Errorf("container %s: quota resources in limits %v, in requests %v", c.Name, l, r)
	}
	return l
}

// TestChartQuota: the chart's quota policies write what each GPU container holds
// across its GPUs into its requests and limits, for every request shape, replacing
// what the pod carried, in a Pod and in a Job's pod template alike; a real
// ResourceQuota on those names admits pods up to its limit and refuses the next one;
// without the mutation, the validating policy refuses a pod or Job whose values
// differ.
func TestChartQuota(t *testing.T) {
	c := startCluster(t)
	c.needMutatingPolicies(t)
	a := c.applier()
	policies := map[string]string{}
	for _, m := range c.renderChart(deploy.Options{Namespace: c.ns}) {
		if m.Name == quotaPolicy {
			policies[m.Kind] = m.YAML
			if err := a.apply(m.YAML, false); err != nil {
				t.Fatalf("applying %s %s: %v", m.Kind, m.Name, err)
			}
		}
	}
	if len(policies) != 4 {
		t.Fatalf("the chart rendered %d quota policy objects, want a mutating and a validating policy with their bindings", len(policies))
	}
	q := resource.MustParse
	gpu := func(kv ...any) v1.ResourceList {
		rl := v1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			rl[v1.ResourceName(kv[i].(string))] = q(kv[i+1].(string))
		}
		return rl
	}
	const (
		G   = "tessera.dev/gpu"
		M   = "tessera.dev/gpu-memory"
		P   = "tessera.dev/gpu-memory-percent"
		C   = "tessera.dev/gpu-cores"
		TM  = string(api.ResourceTotalGPUMemory)
		TP  = string(api.ResourceTotalGPUMemoryPercent)
		TW  = string(api.ResourceTotalWholeGPUs)
		TC  = string(api.ResourceTotalGPUCores)
		CPU = "cpu"
	)
	create := func(p *v1.Pod, dryRun bool) (*v1.Pod, error) {
		opts := metav1.CreateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		return c.client.CoreV1().Pods(p.Namespace).Create(c.ctx, p, opts)
	}
	// createAs creates p as a Pod, or as the pod template of a Job (the Job controller
	// does not run here, so what is checked is the Job object itself), returning the
	// pod, or a pod made of the Job's template.
	kinds := []string{"Pod", "Job"}
	createAs := func(kind string, p *v1.Pod, dryRun bool) (*v1.Pod, error) {
		if kind == "Pod" {
			return create(p, dryRun)
		}
		opts := metav1.CreateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		j, err := c.client.BatchV1().Jobs(p.Namespace).Create(c.ctx, quotaJob(p), opts)
		if err != nil {
			return nil, err
		}
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: j.Namespace, Annotations: j.Spec.Template.Annotations},
			Spec: j.Spec.Template.Spec}, nil
	}
	for _, kind := range kinds {
		chartWaitFor(t, c.ctx, "the quota policies to be applied to a "+kind, func() bool {
			got, err := createAs(kind, quotaPod(c.ns, nil, quotaContainer{limits: gpu(G, "2", M, "8192")}), true)
			if err != nil {
				return false
			}
			v := got.Spec.Containers[0].Resources.Limits[api.ResourceTotalGPUMemory]
			return v.Value() == 16384
		})
	}

	type want map[string]int64
	for _, tc := range []struct {
		name string
		ann  map[string]string
		cs   []quotaContainer
		want []want // per container, init containers first
	}{
		{"MiB on 2 GPUs", nil, []quotaContainer{{limits: gpu(G, "2", M, "8192")}}, []want{{TM: 16384}}},
		{"MiB and cores", nil, []quotaContainer{{limits: gpu(G, "4", M, "10000", C, "30")}}, []want{{TM: 40000, TC: 120}}},
		{"MiB as 8Ki", nil, []quotaContainer{{limits: gpu(G, "1", M, "8Ki")}}, []want{{TM: 8192}}},
		{"percent", nil, []quotaContainer{{limits: gpu(G, "3", P, "25")}}, []want{{TP: 75}}},
		{"100 percent is whole", nil, []quotaContainer{{limits: gpu(G, "2", P, "100", C, "50")}}, []want{{TW: 2, TC: 100}}},
		{"whole GPUs", nil, []quotaContainer{{limits: gpu(G, "8")}}, []want{{TW: 8}}},
		{"whole GPU with cores", nil, []quotaContainer{{limits: gpu(G, "1", C, "100")}}, []want{{TW: 1, TC: 100}}},
		{"MIG instance", map[string]string{api.AnnotationModelInclude: "MIG 1g.10gb"}, []quotaContainer{{limits: gpu(G, "1")}}, []want{{TW: 1}}},
		{"MIG instance, MiB", map[string]string{api.AnnotationModelInclude: "MIG 2g.20gb"}, []quotaContainer{{limits: gpu(G, "1", M, "9000")}}, []want{{TM: 9000}}},
		{"MPS client", map[string]string{"tessera.dev/gpu-sharing": "mps"}, []quotaContainer{{limits: gpu(G, "1", M, "4096", C, "25")}}, []want{{TM: 4096, TC: 25}}},
		{"requests and limits both given", nil, []quotaContainer{{limits: gpu(G, "2", M, "100"), requests: gpu(G, "2", M, "100")}}, []want{{TM: 200}}},
		{"several containers, one without GPUs", nil, []quotaContainer{
			{limits: gpu(G, "1", M, "4096")}, {limits: gpu(CPU, "1")}, {limits: gpu(G, "2", P, "50", C, "10")}},
			[]want{{TM: 4096}, {}, {TP: 100, TC: 20}}},
		{"init container and sidecar", nil, []quotaContainer{
			{init: true, limits: gpu(G, "1", M, "20000")}, {sidecar: true, limits: gpu(G, "1", P, "10")}, {limits: gpu(G, "1", M, "4096")}},
			[]want{{TM: 20000}, {TP: 10}, {TM: 4096}}},
		{"own values overwritten", nil, []quotaContainer{{limits: gpu(G, "2", M, "8192", TM, "1", TP, "0", TW, "5", TC, "3")}}, []want{{TM: 16384}}},
		{"own values on a container without GPUs removed", nil, []quotaContainer{
			{limits: gpu(G, "1")}, {limits: gpu(CPU, "1", TM, "1")}, {limits: gpu(TW, "2")}}, []want{{TW: 1}, {}, {}}},
		{"own values on a pod without GPUs removed", nil, []quotaContainer{{limits: gpu(CPU, "1", TM, "1000")}}, []want{{}}},
		{"memory without a GPU count holds nothing", nil, []quotaContainer{{limits: gpu(M, "1000")}}, []want{{}}},
	} {
		for _, kind := range kinds {
			t.Run(kind+": "+tc.name, func(t *testing.T) {
				p := quotaPod(c.ns, tc.ann, tc.cs...)
				got, err := createAs(kind, p, true)
				if err != nil {
					t.Fatalf("creating the %s (dry run): %v", kind, err)
				}
				all := append(append([]v1.Container{}, got.Spec.InitContainers...), got.Spec.Containers...)
				// The Go derivation (api.QuotaTotals) over the parsed request agrees.
				req, perr := api.ParsePodRequest(got, api.DefaultResourceNames())
				for i := range all {
					g := quotaOf(t, &all[i])
					if fmt.Sprint(g) != fmt.Sprint(map[string]int64(tc.want[i])) {
						t.Errorf("container %s: quota resources %v, want %v", all[i].Name, g, tc.want[i])
					}
					if perr != nil {
						continue
					}
					ref := map[string]int64{}
					for _, cr := range req.Containers {
						if cr.Name == all[i].Name {
							for k, v := range cr.QuotaTotals() {
								ref[string(k)] = v.Value()
							}
						}
					}
					if fmt.Sprint(g) != fmt.Sprint(ref) {
						t.Errorf("container %s: quota resources %v, api.QuotaTotals %v", all[i].Name, g, ref)
					}
				}
			})
		}
	}

	// Requests that cannot be counted are refused with what to change.
	for _, tc := range []struct {
		name string
		c    quotaContainer
		want string
	}{
		{"no GPUs", quotaContainer{limits: gpu(G, "0", M, "1000")}, `container "c0": tessera.dev/gpu must be a whole number from 1 to 64`},
		{"too many GPUs", quotaContainer{limits: gpu(G, "65")}, `tessera.dev/gpu must be a whole number from 1 to 64`},
		{"percent over 100", quotaContainer{limits: gpu(G, "1", P, "150", C, "200")},
			`tessera.dev/gpu-memory-percent must be a whole number from 1 to 100, tessera.dev/gpu-cores must be a whole number from 1 to 100`},
		{"memory beyond any GPU", quotaContainer{limits: gpu(G, "1", M, "1e12")}, `tessera.dev/gpu-memory must be a whole number from 1 to 16777216`},
	} {
		for _, kind := range kinds {
			_, err := createAs(kind, quotaPod(c.ns, nil, tc.c), true)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %s: error %v, want one saying %q", kind, tc.name, err, tc.want)
			}
		}
	}

	// A real ResourceQuota. Without kube-controller-manager nothing fills its status, so
	// the test starts it at zero; the API server's quota admission then counts each pod.
	hard := gpu("requests."+TM, "32768", "requests."+TP, "100", "requests."+TW, "1", "requests."+TC, "100")
	rq, err := c.client.CoreV1().ResourceQuotas(c.ns).Create(c.ctx, &v1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: v1.ResourceQuotaSpec{Hard: hard}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the quota: %v", err)
	}
	rq.Status.Hard = hard
	rq.Status.Used = v1.ResourceList{}
	for k := range hard {
		rq.Status.Used[k] = q("0")
	}
	if _, err := c.client.CoreV1().ResourceQuotas(c.ns).UpdateStatus(c.ctx, rq, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("initialising the quota's status: %v", err)
	}
	// The quota admission reads quotas from an informer: until it has the status, it
	// would charge nothing.
	chartWaitFor(t, c.ctx, "the quota to be enforced", func() bool {
		_, err := create(quotaPod(c.ns, nil, quotaContainer{limits: gpu(G, "1", M, "32769")}), true)
		return err != nil && strings.Contains(err.Error(), "exceeded quota")
	})
	for _, step := range []struct {
		name   string
		cs     []quotaContainer
		refuse string // the exceeded resource, empty when admitted
	}{
		{"2 × 8192 MiB: 16384 of 32768", []quotaContainer{{limits: gpu(G, "2", M, "8192")}}, ""},
		// Init containers count as Kubernetes counts them: the larger of the largest init
		// container and the sum of the others, here 12288 MiB.
		{"init 12288 MiB, then 2 × 4096: 28672", []quotaContainer{{init: true, limits: gpu(G, "1", M, "12288")}, {limits: gpu(G, "1", M, "4096")}, {limits: gpu(G, "1", M, "4096")}}, ""},
		{"4 × 1024 MiB: 32768", []quotaContainer{{limits: gpu(G, "4", M, "1024")}}, ""},
		{"1 MiB more", []quotaContainer{{limits: gpu(G, "1", M, "1")}}, TM},
		{"2 × 50%, cores 50: 100 percent-GPUs of each", []quotaContainer{{limits: gpu(G, "2", P, "50", C, "50")}}, ""},
		{"1% more", []quotaContainer{{limits: gpu(G, "1", P, "1")}}, TP},
		{"1% more cores", []quotaContainer{{limits: gpu(G, "1", C, "1")}}, TC},
		{"a whole GPU", []quotaContainer{{limits: gpu(G, "1")}}, ""},
		{"a second whole GPU", []quotaContainer{{limits: gpu(G, "1")}}, TW},
		{"100% memory is a whole GPU", []quotaContainer{{limits: gpu(G, "1", P, "100")}}, TW},
	} {
		_, err := create(quotaPod(c.ns, nil, step.cs...), false)
		switch {
		case step.refuse == "" && err != nil:
			t.Errorf("%s: refused: %v", step.name, err)
		case step.refuse != "" && (err == nil || !strings.Contains(err.Error(), "exceeded quota") || !strings.Contains(err.Error(), step.refuse)):
			t.Errorf("%s: error %v, want the quota on %s exceeded", step.name, err, step.refuse)
		}
	}
	rq, err = c.client.CoreV1().ResourceQuotas(c.ns).Get(c.ctx, "gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]int64{"requests." + TM: 32768, "requests." + TP: 100, "requests." + TW: 1, "requests." + TC: 100} {
		if u := rq.Status.Used[v1.ResourceName(k)]; u.Value() != v {
			t.Errorf("quota used %s = %s, want %d", k, u.String(), v)
		}
	}

	// Without the mutation (its binding removed), the validating policy is what stops a
	// pod or Job that understates what it holds; one carrying the right values is
	// admitted. In a namespace without the quota, which is checked before the policy.
	free := c.ns + "-free"
	c.createNamespace(free)
	// Through the REST client: client-go's typed MutatingAdmissionPolicy client is
	// v1beta1 before 1.36 (make test-integration K8S_MINOR=1.34 builds this file there).
	if err := c.client.AdmissionregistrationV1().RESTClient().Delete().Resource("mutatingadmissionpolicybindings").Name(quotaPolicy).Do(c.ctx).Error(); err != nil {
		t.Fatal(err)
	}
	understated := quotaPod(free, nil, quotaContainer{limits: gpu(G, "2", M, "8192", TM, "8192")})
	for _, kind := range kinds {
		chartWaitFor(t, c.ctx, "the mutation of a "+kind+" to stop", func() bool {
			_, err := createAs(kind, understated, true)
			return err != nil
		})
	}
	for _, tc := range []struct {
		name string
		c    quotaContainer
		want string // empty: admitted
	}{
		{"per-GPU value", quotaContainer{limits: gpu(G, "2", M, "8192", TM, "8192")},
			`container "c0": tessera.dev/total-gpu-memory is what the container holds across its GPUs, counted by Tessera from its GPU request: it must be 16384`},
		{"none", quotaContainer{limits: gpu(G, "1", P, "50")}, `tessera.dev/total-gpu-memory-percent is what the container holds across its GPUs, counted by Tessera from its GPU request: it must be 50`},
		{"a name it holds none of", quotaContainer{limits: gpu(G, "1", M, "10", TM, "10", TW, "1")}, `tessera.dev/total-whole-gpus is what the container holds across its GPUs, counted by Tessera from its GPU request: the container holds none`},
		{"right values", quotaContainer{limits: gpu(G, "2", M, "8192", C, "20", TM, "16Ki", TC, "40")}, ""},
	} {
		for _, kind := range kinds {
			_, err := createAs(kind, quotaPod(free, nil, tc.c), true)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s: %s: refused: %v", kind, tc.name, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%s: %s: error %v, want one saying %q", kind, tc.name, err, tc.want)
			}
		}
	}
}

// TestChartQuotaCheckAlone: where the server serves no MutatingAdmissionPolicy
// (Kubernetes 1.34 and 1.35 unless the beta is turned on) the chart installs the quota
// check alone. Pods then carry their quota resources themselves: one whose totals are
// missing or wrong is refused with the value to set, one carrying them is admitted and
// counted by a real ResourceQuota, up to its limit. Where the server serves the
// mutation, TestChartQuota checks the same with the mutation's binding removed.
func TestChartQuotaCheckAlone(t *testing.T) {
	c := startCluster(t)
	if c.servesMutatingPolicies() {
		t.Skip("the server serves MutatingAdmissionPolicy: TestChartQuota covers the check without the mutation")
	}
	a := c.applier()
	applied := 0
	for _, m := range c.renderChart(deploy.Options{Namespace: c.ns}) {
		if m.Name != quotaPolicy {
			continue
		}
		if m.Kind != "ValidatingAdmissionPolicy" && m.Kind != "ValidatingAdmissionPolicyBinding" {
			t.Fatalf("the chart rendered %s %s for a server that does not serve it", m.Kind, m.Name)
		}
		if err := a.apply(m.YAML, false); err != nil {
			t.Fatalf("applying %s %s: %v", m.Kind, m.Name, err)
		}
		applied++
	}
	if applied != 2 {
		t.Fatalf("the chart rendered %d quota objects, want the validating policy and its binding", applied)
	}
	q := resource.MustParse
	gpu := func(kv ...string) v1.ResourceList {
		rl := v1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			rl[v1.ResourceName(kv[i])] = q(kv[i+1])
		}
		return rl
	}
	const (
		G  = "tessera.dev/gpu"
		M  = "tessera.dev/gpu-memory"
		TM = string(api.ResourceTotalGPUMemory)
	)
	create := func(p *v1.Pod, dryRun bool) error {
		opts := metav1.CreateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err := c.client.CoreV1().Pods(p.Namespace).Create(c.ctx, p, opts)
		return err
	}
	hard := gpu("requests."+TM, "16384")
	rq, err := c.client.CoreV1().ResourceQuotas(c.ns).Create(c.ctx, &v1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: v1.ResourceQuotaSpec{Hard: hard}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the quota: %v", err)
	}
	// Nothing fills the quota's status without kube-controller-manager: start it at zero.
	rq.Status.Hard, rq.Status.Used = hard, gpu("requests."+TM, "0")
	if _, err := c.client.CoreV1().ResourceQuotas(c.ns).UpdateStatus(c.ctx, rq, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("initialising the quota's status: %v", err)
	}
	understated := quotaPod(c.ns, nil, quotaContainer{limits: gpu(G, "2", M, "8192")})
	chartWaitFor(t, c.ctx, "the quota check to be enforced", func() bool { return create(understated, true) != nil })
	chartWaitFor(t, c.ctx, "the quota to be enforced", func() bool {
		err := create(quotaPod(c.ns, nil, quotaContainer{limits: gpu(G, "1", M, "16385", TM, "16385")}), true)
		return err != nil && strings.Contains(err.Error(), "exceeded quota")
	})
	for _, step := range []struct {
		name string
		c    quotaContainer
		want string // empty: admitted
	}{
		{"no totals", quotaContainer{limits: gpu(G, "2", M, "8192")}, `tessera.dev/total-gpu-memory is what the container holds across its GPUs, counted by Tessera from its GPU request: it must be 16384`},
		{"per-GPU value", quotaContainer{limits: gpu(G, "2", M, "8192", TM, "8192")}, "it must be 16384"},
		{"its totals", quotaContainer{limits: gpu(G, "2", M, "8192", TM, "16384")}, ""},
		{"1 MiB more", quotaContainer{limits: gpu(G, "1", M, "1", TM, "1")}, "exceeded quota"},
	} {
		err := create(quotaPod(c.ns, nil, step.c), false)
		switch {
		case step.want == "" && err != nil:
			t.Errorf("%s: refused: %v", step.name, err)
		case step.want != "" && (err == nil || !strings.Contains(err.Error(), step.want)):
			t.Errorf("%s: error %v, want one saying %q", step.name, err, step.want)
		}
	}
	rq, err = c.client.CoreV1().ResourceQuotas(c.ns).Get(c.ctx, "gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := rq.Status.Used["requests."+v1.ResourceName(TM)]; u.Value() != 16384 {
		t.Errorf("quota used %s, want 16384", u.String())
	}
}

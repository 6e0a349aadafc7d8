// SPDX-License-Identifier: Apache-2.0

// Package kueue checks that Kueue admits and queues Tessera GPU Jobs by the quota
// resources the chart's policies write (docs/quotas.md, "Kueue"). It is a module of
// its own because Kueue pins other Kubernetes library versions than Tessera.
package kueue

import (
	"fmt"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/controller/jobs/job"
)

const (
	gpuRes     = "tessera.dev/gpu"
	memRes     = "tessera.dev/gpu-memory"
	totalMem   = "tessera.dev/total-gpu-memory"
	totalPct   = "tessera.dev/total-gpu-memory-percent"
	totalWhole = "tessera.dev/total-whole-gpus"
	totalCores = "tessera.dev/total-gpu-cores"

	flavor = "gpu"
	// queue is the LocalQueue of each test namespace.
	queue = "gpu"
)

// quota is each ClusterQueue's nominal quota: 16 GiB in MiB, one GPU's memory in
// percent, one whole GPU, one GPU's compute.
var quota = map[string]string{totalMem: "16384", totalPct: "100", totalWhole: "1", totalCores: "100"}

// TestKueueAdmitsByQuotaResources: a ClusterQueue whose resourceGroups cover the four
// quota resources admits GPU Jobs, which ask Tessera's request names only, by what they
// hold across their GPUs, queues those over the quota until quota frees, and counts a
// Job that wrote an understated total by its true one.
func TestKueueAdmitsByQuotaResources(t *testing.T) {
	e := startEnv(t, requestNames)
	e.create(t, &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: flavor}})

	t.Run("MiB: admitted up to the quota, the next queued until the first is gone", func(t *testing.T) {
		ns := e.newQueue(t, "mib")
		a := e.createJob(t, gpuJob(ns, "a", queue, map[string]string{gpuRes: "2", memRes: "4096"}), map[string]int64{totalMem: 8192})
		wa := e.waitAdmitted(t, a)
		checkUsage(t, wa, map[string]int64{totalMem: 8192})

		// 8192 + 12288 > 16384: b waits, suspended, for the quota a holds.
		b := e.createJob(t, gpuJob(ns, "b", queue, map[string]string{gpuRes: "2", memRes: "6144"}), map[string]int64{totalMem: 12288})
		e.waitPending(t, b, totalMem)

		e.deleteJob(t, a)
		wb := e.waitAdmitted(t, b)
		checkUsage(t, wb, map[string]int64{totalMem: 12288})
	})

	t.Run("whole GPUs: counted under total-whole-gpus, not MiB", func(t *testing.T) {
		ns := e.newQueue(t, "whole")
		w1 := e.createJob(t, gpuJob(ns, "w1", queue, map[string]string{gpuRes: "1"}), map[string]int64{totalWhole: 1})
		checkUsage(t, e.waitAdmitted(t, w1), map[string]int64{totalWhole: 1})

		w2 := e.createJob(t, gpuJob(ns, "w2", queue, map[string]string{gpuRes: "1"}), map[string]int64{totalWhole: 1})
		e.waitPending(t, w2, totalWhole)

		// The queue's MiB are untouched: a MiB Job is admitted beside the waiting one.
		m := e.createJob(t, gpuJob(ns, "m", queue, map[string]string{gpuRes: "1", memRes: "4096"}), map[string]int64{totalMem: 4096})
		checkUsage(t, e.waitAdmitted(t, m), map[string]int64{totalMem: 4096})
		e.checkPending(t, w2)
	})

	t.Run("own understated total: overwritten, counted at what the Job holds", func(t *testing.T) {
		ns := e.newQueue(t, "understated")
		// Kept, 1 MiB would fit; 2 × 12288 = 24576 never does.
		u := e.createJob(t, gpuJob(ns, "u", queue, map[string]string{gpuRes: "2", memRes: "12288", totalMem: "1"}), map[string]int64{totalMem: 24576})
		wu := e.waitPending(t, u, totalMem)
		if got := quotaOf(&wu.Spec.PodSets[0].Template.Spec.Containers[0]); got[totalMem] != 24576 {
			t.Errorf("Kueue's Workload counts %s %d, want 24576", totalMem, got[totalMem])
		}
	})
}

// TestKueueNeedsRequestNamesIgnored: unless Kueue ignores the request names, a
// ClusterQueue of the quota resources admits no GPU Job, whatever its quota
// (docs/quotas.md says to configure excludeResourcePrefixes).
func TestKueueNeedsRequestNamesIgnored(t *testing.T) {
	e := startEnv(t)
	e.create(t, &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: flavor}})
	ns := e.newQueue(t, "unignored")
	j := e.createJob(t, gpuJob(ns, "a", queue, map[string]string{gpuRes: "1", memRes: "4096"}), map[string]int64{totalMem: 4096})
	e.waitPending(t, j, "unavailable in ClusterQueue")
}

func (e *env) create(t *testing.T, o client.Object) {
	t.Helper()
	if err := e.client.Create(e.ctx, o); err != nil {
		t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
}

// newQueue creates namespace name, a ClusterQueue name with the four quota resources
// and a LocalQueue for it in the namespace, and waits until the ClusterQueue is active.
func (e *env) newQueue(t *testing.T, name string) string {
	t.Helper()
	e.create(t, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	fq := kueue.FlavorQuotas{Name: flavor}
	var covered []v1.ResourceName
	for _, r := range []string{totalMem, totalPct, totalWhole, totalCores} {
		covered = append(covered, v1.ResourceName(r))
		fq.Resources = append(fq.Resources, kueue.ResourceQuota{Name: v1.ResourceName(r), NominalQuota: resource.MustParse(quota[r])})
	}
	cq := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: kueue.ClusterQueueSpec{
		NamespaceSelector: &metav1.LabelSelector{},
		ResourceGroups:    []kueue.ResourceGroup{{CoveredResources: covered, Flavors: []kueue.FlavorQuotas{fq}}},
	}}
	e.create(t, cq)
	e.create(t, &kueue.LocalQueue{ObjectMeta: metav1.ObjectMeta{Name: queue, Namespace: name},
		Spec: kueue.LocalQueueSpec{ClusterQueue: kueue.ClusterQueueReference(name)}})
	e.eventually(t, "ClusterQueue "+name+" to be active", func() (bool, string) {
		if err := e.client.Get(e.ctx, client.ObjectKeyFromObject(cq), cq); err != nil {
			return false, err.Error()
		}
		return apimeta.IsStatusConditionTrue(cq.Status.Conditions, kueue.ClusterQueueActive), fmt.Sprint(cq.Status.Conditions)
	})
	return name
}

// createJob creates j and checks that the API server's admission wrote want, the
// totals it holds, into its pod template's limits and requests, replacing any the
// Job carried.
func (e *env) createJob(t *testing.T, j *batchv1.Job, want map[string]int64) *batchv1.Job {
	t.Helper()
	e.create(t, j)
	c := &j.Spec.Template.Spec.Containers[0]
	for _, rl := range []v1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		if got := totalsIn(rl); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("Job %s: its template carries %v, want %v (limits %v, requests %v)", j.Name, got, want, c.Resources.Limits, c.Resources.Requests)
		}
	}
	return j
}

// workloadOf is the Workload Kueue created for j, or nil.
func (e *env) workloadOf(j *batchv1.Job) (*kueue.Workload, error) {
	wl := &kueue.Workload{}
	key := client.ObjectKey{Namespace: j.Namespace, Name: job.GetWorkloadNameForJob(j.Name, j.UID)}
	if err := e.client.Get(e.ctx, key, wl); err != nil {
		return nil, err
	}
	return wl, nil
}

// waitAdmitted waits until Kueue admitted j's Workload and started j (unsuspended it).
func (e *env) waitAdmitted(t *testing.T, j *batchv1.Job) *kueue.Workload {
	t.Helper()
	var wl *kueue.Workload
	e.eventually(t, "Job "+j.Name+" to be admitted and started", func() (bool, string) {
		var err error
		if wl, err = e.workloadOf(j); err != nil {
			return false, err.Error()
		}
		if err := e.client.Get(e.ctx, client.ObjectKeyFromObject(j), j); err != nil {
			return false, err.Error()
		}
		c := wl.Status.Conditions
		ok := apimeta.IsStatusConditionTrue(c, kueue.WorkloadQuotaReserved) && apimeta.IsStatusConditionTrue(c, kueue.WorkloadAdmitted) &&
			wl.Status.Admission != nil && j.Spec.Suspend != nil && !*j.Spec.Suspend
		return ok, fmt.Sprintf("suspend %v, conditions %v", ptr.Deref(j.Spec.Suspend, false), c)
	})
	return wl
}

// waitPending waits until Kueue left j's Workload without quota for a reason that
// mentions why (over the quota of that resource, say), then checks that j is still
// suspended.
func (e *env) waitPending(t *testing.T, j *batchv1.Job, why string) *kueue.Workload {
	t.Helper()
	var wl *kueue.Workload
	e.eventually(t, "Job "+j.Name+" to wait: "+why, func() (bool, string) {
		var err error
		if wl, err = e.workloadOf(j); err != nil {
			return false, err.Error()
		}
		c := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, why), fmt.Sprint(wl.Status.Conditions)
	})
	t.Logf("Job %s waits: %s", j.Name, apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved).Message)
	e.checkPending(t, j)
	return wl
}

// checkPending checks that j is suspended and its Workload holds no quota.
func (e *env) checkPending(t *testing.T, j *batchv1.Job) {
	t.Helper()
	if err := e.client.Get(e.ctx, client.ObjectKeyFromObject(j), j); err != nil {
		t.Fatal(err)
	}
	wl, err := e.workloadOf(j)
	if err != nil {
		t.Fatal(err)
	}
	if j.Spec.Suspend == nil || !*j.Spec.Suspend || wl.Status.Admission != nil ||
		apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved) {
		t.Fatalf("Job %s: suspend %v, admission %v, conditions %v; want it waiting", j.Name, j.Spec.Suspend, wl.Status.Admission, wl.Status.Conditions)
	}
}

// deleteJob deletes j and its Workload. No garbage collector runs here: the test
// deletes the Workload the Job owned, as the garbage collector would.
func (e *env) deleteJob(t *testing.T, j *batchv1.Job) {
	t.Helper()
	wl, err := e.workloadOf(j)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.Delete(e.ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Delete(e.ctx, wl); err != nil {
		t.Fatal(err)
	}
	// Kueue's Job reconciler lifts the Workload's finalizer once the Job is gone.
	e.eventually(t, "the Workload of Job "+j.Name+" to be gone", func() (bool, string) {
		err := e.client.Get(e.ctx, client.ObjectKeyFromObject(wl), wl)
		return apierrors.IsNotFound(err), fmt.Sprintf("err %v, finalizers %v", err, wl.Finalizers)
	})
}

// checkUsage checks the quota resources Kueue's admission of wl recorded against
// the flavor, and that the per-GPU request names were left out.
func checkUsage(t *testing.T, wl *kueue.Workload, want map[string]int64) {
	t.Helper()
	if len(wl.Status.Admission.PodSetAssignments) != 1 {
		t.Fatalf("Workload %s: admission %+v, want one pod set", wl.Name, wl.Status.Admission)
	}
	psa := wl.Status.Admission.PodSetAssignments[0]
	if got := totalsIn(psa.ResourceUsage); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Workload %s: admitted with usage %v, want %v", wl.Name, psa.ResourceUsage, want)
	}
	for r := range want {
		if f := psa.Flavors[v1.ResourceName(r)]; f != flavor {
			t.Errorf("Workload %s: %s assigned to flavor %q, want %q", wl.Name, r, f, flavor)
		}
	}
	for r := range psa.ResourceUsage {
		if !strings.HasPrefix(string(r), "tessera.dev/total-") {
			t.Errorf("Workload %s: admitted with usage of %s, which Kueue should ignore", wl.Name, r)
		}
	}
}

// totalsIn returns the quota resources of a resource list.
func totalsIn(rl v1.ResourceList) map[string]int64 {
	out := map[string]int64{}
	for k, q := range rl {
		if strings.HasPrefix(string(k), "tessera.dev/total-") {
			out[string(k)] = q.Value()
		}
	}
	return out
}

// quotaOf returns the quota resources of a container's limits.
func quotaOf(c *v1.Container) map[string]int64 {
	return totalsIn(c.Resources.Limits)
}

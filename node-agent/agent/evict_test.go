// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-dev/tessera/node-agent/checkpoint"
)

// The watchdog's evictions go through the Eviction API for the pod's UID only; a
// pod that is gone or was replaced needs none, a PodDisruptionBudget's refusal is
// returned so that the watchdog backs off.
func TestEvict(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		name    string
		answer  error
		wantErr bool
	}{
		{"evicted", nil, false},
		{"gone", apierrors.NewNotFound(pods, "p"), false},
		{"replaced by a pod of the same name", apierrors.NewConflict(pods, "p", errors.New("precondition failed: UID")), false},
		{"refused by a PodDisruptionBudget", apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10), true},
		{"forbidden", apierrors.NewForbidden(pods, "p", errors.New("no")), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			var got *policyv1.Eviction
			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "eviction" {
					return false, nil, nil
				}
				got = a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
				return true, nil, tc.answer
			})
			a := &Agent{client: client}
			err := a.evict(checkpoint.Record{Namespace: "ns", Pod: "p", PodUID: "uid-1"})
			if (err != nil) != tc.wantErr {
				t.Fatalf("evict: %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr && apierrors.IsTooManyRequests(tc.answer) && !apierrors.IsTooManyRequests(err) {
				t.Errorf("the refusal's status was lost: %v (%d)", err, http.StatusTooManyRequests)
			}
			if got == nil || got.Name != "p" || got.Namespace != "ns" || got.DeleteOptions == nil ||
				got.DeleteOptions.Preconditions == nil || *got.DeleteOptions.Preconditions.UID != "uid-1" {
				t.Errorf("eviction sent %+v", got)
			}
		})
	}
}

// A claim's record names the claim: the watchdog's eviction goes to the pods the claim
// is reserved for, each by its UID; a claim made again under the name, or gone, has
// none of the record's pods.
func TestEvictClaimPods(t *testing.T) {
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "train-gpu-0", UID: "claim-uid"},
		Status: resourcev1.ResourceClaimStatus{ReservedFor: []resourcev1.ResourceClaimConsumerReference{
			{Resource: "pods", Name: "train-0", UID: "pod-0"},
			{Resource: "pods", Name: "train-1", UID: "pod-1"},
			{APIGroup: "example.com", Resource: "jobs", Name: "j", UID: "job-0"},
		}},
	}
	rec := checkpoint.Record{ContainerID: "claim-uid", Namespace: "team", Pod: "train-gpu-0", Claim: true}
	for _, tc := range []struct {
		name string
		uid  types.UID
		want []string
	}{
		{"its pods", "claim-uid", []string{"train-0/pod-0", "train-1/pod-1"}},
		{"made again under its name", "other-uid", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := claim.DeepCopy()
			c.UID = tc.uid
			client := fake.NewClientset(c)
			var got []string
			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "eviction" {
					return false, nil, nil
				}
				ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
				got = append(got, ev.Name+"/"+string(*ev.DeleteOptions.Preconditions.UID))
				return true, nil, nil
			})
			a := &Agent{client: client}
			if err := a.evict(rec); err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("evicted %v, want %v", got, tc.want)
			}
		})
	}
	a := &Agent{client: fake.NewClientset()}
	if err := a.evict(rec); err != nil {
		t.Errorf("a claim that is gone: %v", err)
	}
}

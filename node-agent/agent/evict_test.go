// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"errors"
	"net/http"
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

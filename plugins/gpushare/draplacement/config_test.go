// SPDX-License-Identifier: Apache-2.0

package draplacement

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// draHandle is a scheduler handle whose DRA manager knows claims and classes only.
type draHandle struct {
	fwk.Handle
	claims  map[string]*resourceapi.ResourceClaim
	classes map[string]*resourceapi.DeviceClass
}

func (h *draHandle) SharedDRAManager() fwk.SharedDRAManager { return draManager{h: h} }

type draManager struct {
	fwk.SharedDRAManager
	h *draHandle
}

func (m draManager) ResourceClaims() fwk.ResourceClaimTracker { return claimTracker{h: m.h} }
func (m draManager) DeviceClasses() fwk.DeviceClassLister     { return classLister{h: m.h} }

type claimTracker struct {
	fwk.ResourceClaimTracker
	h *draHandle
}

func (c claimTracker) Get(namespace, name string) (*resourceapi.ResourceClaim, error) {
	if cl, ok := c.h.claims[namespace+"/"+name]; ok {
		return cl, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "resourceclaims"}, name)
}

type classLister struct {
	fwk.DeviceClassLister
	h *draHandle
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l.h.classes[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "deviceclasses"}, name)
}

// claimOrderer is an orderer of args whose scheduler knows claim team/c and classes,
// and pod team/p (with annotations) using that claim.
func claimOrderer(t *testing.T, args string, claim *resourceapi.ResourceClaim, annotations map[string]string, classes ...*resourceapi.DeviceClass) (*orderer, *v1.Pod) {
	t.Helper()
	a, _, err := decodeArgs(unknown(args))
	if err != nil {
		t.Fatal(err)
	}
	h := &draHandle{claims: map[string]*resourceapi.ResourceClaim{"team/c": claim}, classes: map[string]*resourceapi.DeviceClass{}}
	for _, c := range classes {
		h.classes[c.Name] = c
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p", UID: "p", Annotations: annotations},
		Spec: v1.PodSpec{ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("c")}}}}
	return newOrderer(a, h, true), pod
}

func opaque(driver, params string) resourceapi.DeviceConfiguration {
	return resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}
}

// A pod whose claim, or whose claim's Tessera class, carries a Tessera configuration
// that does not decode is unschedulable with the reason; other drivers' configurations
// and allocated claims are not read.
func TestConfigProblem(t *testing.T) {
	const good = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true}`
	const typo = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConservng":true}`
	tessera := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.tessera.dev"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.tessera.dev"`}}}}}
	badClass := tessera.DeepCopy()
	badClass.Name = "bad.tessera.dev"
	badClass.Spec.Config = []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: opaque(DriverName, `{"kind":"GPUConfig"}`)}}
	nic := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic"},
		Spec: resourceapi.DeviceClassSpec{Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: opaque(DriverName, `not json`)}}}}
	claim := func(class string, config ...resourceapi.DeviceConfiguration) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "c"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
				{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}}}}
		for _, dc := range config {
			c.Spec.Devices.Config = append(c.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{DeviceConfiguration: dc})
		}
		return c
	}
	allocated := claim("gpu.tessera.dev", opaque(DriverName, typo))
	allocated.Status.Allocation = &resourceapi.AllocationResult{}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"none", claim("gpu.tessera.dev"), ""},
		{"good", claim("gpu.tessera.dev", opaque(DriverName, good)), ""},
		{"another driver's", claim("gpu.tessera.dev", opaque("net.example.com", `{"mtu":9000}`)), ""},
		{"a typo", claim("gpu.tessera.dev", opaque("net.example.com", `{}`), opaque(DriverName, typo)),
			`ResourceClaim team/c, spec.devices.config[1]: gpu.tessera.dev parameters: unknown field "workConservng"`},
		{"the class's", claim("bad.tessera.dev"),
			`DeviceClass bad.tessera.dev, spec.config[0] (the cluster's, for request "gpu" of ResourceClaim team/c): gpu.tessera.dev parameters are apiVersion ""`},
		{"a class of another driver", claim("nic"), ""},
		{"allocated", allocated, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, pod := claimOrderer(t, `{}`, tc.claim, nil, tessera, badClass, nic)
			// A claim not made yet is passed over.
			pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, v1.PodResourceClaim{Name: "gone", ResourceClaimName: ptr.To("gone")})
			if got := o.configProblem(pod); got != tc.want && (tc.want == "" || !strings.Contains(got, tc.want)) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

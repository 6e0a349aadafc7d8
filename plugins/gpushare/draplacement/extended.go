// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34

package draplacement

import (
	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/features"
)

// extendedClass is the Tessera DeviceClass that serves the extended resource name on
// nodes that do not advertise it (its spec.extendedResourceName, KEP-5004), or "".
func (o *orderer) extendedClass(name v1.ResourceName) string {
	if !utilfeature.DefaultFeatureGate.Enabled(features.DRAExtendedResource) {
		return ""
	}
	m := o.h.SharedDRAManager()
	if m == nil {
		return ""
	}
	r := m.DeviceClassResolver()
	if r == nil {
		return ""
	}
	c := r.GetDeviceClass(name)
	if c == nil || !o.isTessera(c.Name) {
		return ""
	}
	return c.Name
}

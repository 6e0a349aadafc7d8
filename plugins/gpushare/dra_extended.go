// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34

package gpushare

import (
	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/features"

	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// draBacked reports whether the in-tree DRA plugin serves the extended resource name
// on nodes that do not advertise it: DRAExtendedResource is on and a DeviceClass names
// it in spec.extendedResourceName (KEP-5004; the scheduler's DeviceClass resolver has
// no such mapping before 1.35).
func draBacked(h fwk.Handle, name v1.ResourceName) bool {
	if h == nil || !utilfeature.DefaultFeatureGate.Enabled(features.DRAExtendedResource) {
		return false
	}
	m := h.SharedDRAManager()
	if m == nil {
		return false
	}
	r := m.DeviceClassResolver()
	return r != nil && r.GetDeviceClass(name) != nil
}

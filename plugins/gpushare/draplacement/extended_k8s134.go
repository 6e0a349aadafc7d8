// SPDX-License-Identifier: Apache-2.0

//go:build k8s1.34

package draplacement

import v1 "k8s.io/api/core/v1"

// extendedClass is "" on 1.34: its scheduler framework has no DeviceClass resolver
// (DRAExtendedResource is alpha there), so no extended resource is served by DRA.
func (o *orderer) extendedClass(v1.ResourceName) string { return "" }

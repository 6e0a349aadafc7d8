// SPDX-License-Identifier: Apache-2.0

//go:build k8s1.34

package gpushare

import (
	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// draBacked is false on 1.34: its scheduler framework has no DeviceClass resolver
// (DRAExtendedResource is alpha there), so tessera.dev/gpu is never served by DRA.
func draBacked(fwk.Handle, v1.ResourceName) bool { return false }

// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34 && !k8s1.35

package noderesourcesfit

import "github.com/tessera-dev/tessera/plugins/internal/fwk"

// NodeResourcesFit scores placements from Kubernetes 1.36; promoted as it is.
var _ fwk.PlacementScorePlugin = &Plugin{}

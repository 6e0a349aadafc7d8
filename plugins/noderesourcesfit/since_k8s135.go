// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34

package noderesourcesfit

import "github.com/tessera-dev/tessera/plugins/internal/fwk"

// NodeResourcesFit signs pods from Kubernetes 1.35; its SignPod is promoted as it is.
var _ fwk.SignPlugin = &Plugin{}

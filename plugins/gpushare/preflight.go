// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34 && !k8s1.35

package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// PreBindPreFlight skips pods PreBind has nothing to do for (preBindSkips) and lets
// the scheduler run this plugin's PreBind in parallel with other plugins' (from
// Kubernetes 1.36): it touches only the pod's own annotation.
func (pl *Plugin) PreBindPreFlight(ctx context.Context, cs fwk.CycleState, _ *v1.Pod, _ string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	skip, st := pl.preBindSkips(ctx, cs)
	if st != nil {
		return nil, st
	}
	if skip {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return &fwk.PreBindPreFlightResult{AllowParallel: true}, nil
}

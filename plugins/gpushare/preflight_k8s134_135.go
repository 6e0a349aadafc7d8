// SPDX-License-Identifier: Apache-2.0

//go:build k8s1.34 || k8s1.35

package gpushare

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// PreBindPreFlight skips pods PreBind has nothing to do for (preBindSkips). Before
// Kubernetes 1.36 it returns a status only: PreBind runs serially.
func (pl *Plugin) PreBindPreFlight(ctx context.Context, cs fwk.CycleState, _ *v1.Pod, _ string) *fwk.Status {
	skip, st := pl.preBindSkips(ctx, cs)
	if st != nil {
		return st
	}
	if skip {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

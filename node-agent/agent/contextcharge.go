// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// contextSource publishes the agent's charge per CUDA context (--context-mib) in the
// inventory, so that the scheduler places no container whose memory on a GPU is below
// it. The default charge is left out: an inventory without contextMiB means it, and
// reads as it did before the field. It also marks a node in DRA mode (--dra), where
// the scheduler places no pod asking for tessera.dev/* resources.
type contextSource struct {
	gpu.Source
	contextMiB int64
	dra        bool
}

func (s *contextSource) Inventory() (*api.NodeInventory, error) {
	inv, err := s.Source.Inventory()
	if err != nil {
		return nil, err
	}
	if s.contextMiB != 0 && s.contextMiB != api.DefaultContextMiB {
		inv.ContextMiB = s.contextMiB
	}
	inv.DRA = s.dra
	return inv, nil
}

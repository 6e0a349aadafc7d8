// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placementtest"
	"github.com/tessera-dev/tessera/test/fixtures"
)

const (
	h100Mem = fixtures.H100MiB
	t4Mem   = fixtures.T4MiB
)

func nvlinkInventory(node string, n, islandSize int, model string, mem int64) *api.NodeInventory {
	return fixtures.NVLinkNode(node, n, islandSize, model, mem)
}

func pcieInventory(node string, n int, model string, mem int64) *api.NodeInventory {
	return fixtures.PCIeNode(node, n, model, mem)
}

// The builders of nodes, pods and assignments are placementtest's, shared with
// internal/placement's tests.
type ctr = placementtest.Ctr

var (
	makeNode   = placementtest.Node
	makePod    = placementtest.Pod
	bindPod    = placementtest.Bound
	oneGrant   = placementtest.OneGrant
	mustEncode = placementtest.MustEncode
	h100       = placementtest.H100
	t4         = placementtest.T4
	withHost   = placementtest.WithHost
	hostNode   = placementtest.HostNode
)

// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

const stateKey fwk.StateKey = Name

// cycleState is the plugin's per-pod data for one scheduling cycle, under stateKey.
type cycleState struct {
	// skip is set for pods that ask for no GPU: every extension point returns at once.
	skip bool
	info *placement.PodInfo
	// hostOnly is set, with skip, for a pod without GPUs that the node-level placer
	// still scores (by the GPU capacity its CPU and memory would strand): what it
	// returned from HostOnlyPod.
	hostOnly *placement.PodInfo

	// id numbers this cycle (a clone gets its own): Filter keeps its allocation on
	// a node in the node's cache entry under this number, and Score uses it only when
	// the numbers match. 0 keeps nothing.
	id uint64

	// now is when PreFilter ran: Filter judges every node's heartbeat against it, one
	// clock reading per cycle instead of one per node (a cycle lasts milliseconds,
	// heartbeat limits tens of seconds).
	now time.Time

	// fit is the cycle's largest feasible node, measured by PreScore for the best-fit
	// term; Score only reads it (nil: not measured, e.g. under Spread).
	fit *placement.FitScale

	// overlay holds preemption's what-if changes per node (AddPod/RemovePod). It is
	// only ever changed on a cloned state, one node at a time, so it needs no lock.
	overlay map[string]*nodeDelta

	// assignment is what Reserve chose; Bind (or PreBind) writes it.
	assignment *api.PodAssignment

	// dra is set for a pod that asks only whole GPUs when a DeviceClass serves the
	// GPU resource through DRA (draBacked): on a node in DRA mode the in-tree DRA
	// plugin allocates its GPUs, and this plugin passes it (Filter) and leaves it
	// alone (Reserve, PreBind, Bind). delegated is the node Reserve left it to.
	dra       bool
	delegated string
}

// toDRA reports whether the pod's GPUs on the node of view v are the in-tree DRA
// plugin's to allocate.
func (s *cycleState) toDRA(v *placement.NodeView) bool {
	return s.dra && v.Model != nil && v.Model.DRA
}

// nodeDelta is preemption's simulated change to a node's usage.
type nodeDelta struct {
	removed map[types.UID]bool
	added   [][]placement.Grant
}

// Clone copies what a what-if evaluation may change. Filter results are not carried
// over: a clone has its own number and recomputes them against its own overlay.
func (s *cycleState) Clone() fwk.StateData {
	c := &cycleState{id: nextCycleID(), skip: s.skip, info: s.info, hostOnly: s.hostOnly, now: s.now, fit: s.fit, assignment: s.assignment,
		dra: s.dra, delegated: s.delegated}
	if len(s.overlay) > 0 {
		c.overlay = make(map[string]*nodeDelta, len(s.overlay))
		for n, d := range s.overlay {
			nd := &nodeDelta{removed: make(map[types.UID]bool, len(d.removed)), added: append([][]placement.Grant(nil), d.added...)}
			for uid := range d.removed {
				nd.removed[uid] = true
			}
			c.overlay[n] = nd
		}
	}
	return c
}

// cycleIDs numbers cycle states. Numbers are never reused, so an allocation kept by
// an earlier cycle can never pass for a later one's.
var cycleIDs atomic.Uint64

func nextCycleID() uint64 { return cycleIDs.Add(1) }

func (s *cycleState) delta(node string) *nodeDelta {
	if s.overlay == nil {
		s.overlay = map[string]*nodeDelta{}
	}
	d := s.overlay[node]
	if d == nil {
		d = &nodeDelta{removed: map[types.UID]bool{}}
		s.overlay[node] = d
	}
	return d
}

func getState(cs fwk.CycleState) (*cycleState, error) {
	d, err := cs.Read(stateKey)
	if err != nil {
		return nil, fmt.Errorf("reading %q from cycle state: %w", stateKey, err)
	}
	s, ok := d.(*cycleState)
	if !ok {
		return nil, fmt.Errorf("%q in cycle state has type %T", stateKey, d)
	}
	return s, nil
}

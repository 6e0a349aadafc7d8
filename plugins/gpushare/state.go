package gpushare

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
)

const stateKey fwk.StateKey = Name

// cycleState is the plugin's per-pod data for one scheduling cycle, under stateKey.
type cycleState struct {
	// skip is set for pods that ask for no GPU: every extension point returns at once.
	skip bool
	info *podInfo
	// hostOnly is set, with skip, for a pod without GPUs under the Fragmentation node
	// policy: it is still scored by the GPU capacity its CPU and memory would strand.
	hostOnly *podInfo

	// mu guards results, which the parallel Filter writes and Score reads.
	mu      sync.Mutex
	results map[string]*allocation

	// overlay holds preemption's what-if changes per node (AddPod/RemovePod). It is
	// only ever changed on a cloned state, one node at a time, so it needs no lock.
	overlay map[string]*nodeDelta

	// assignment is what Reserve chose; Bind (or PreBind) writes it.
	assignment *api.PodAssignment
}

// nodeDelta is preemption's simulated change to a node's usage.
type nodeDelta struct {
	removed map[types.UID]bool
	added   [][]grant
}

// Clone copies what a what-if evaluation may change. Filter results are not carried
// over: a clone recomputes them against its own overlay.
func (s *cycleState) Clone() fwk.StateData {
	c := &cycleState{skip: s.skip, info: s.info, hostOnly: s.hostOnly, results: map[string]*allocation{}, assignment: s.assignment}
	if len(s.overlay) > 0 {
		c.overlay = make(map[string]*nodeDelta, len(s.overlay))
		for n, d := range s.overlay {
			nd := &nodeDelta{removed: make(map[types.UID]bool, len(d.removed)), added: append([][]grant(nil), d.added...)}
			for uid := range d.removed {
				nd.removed[uid] = true
			}
			c.overlay[n] = nd
		}
	}
	return c
}

func (s *cycleState) store(node string, a *allocation) {
	s.mu.Lock()
	s.results[node] = a
	s.mu.Unlock()
}

func (s *cycleState) result(node string) *allocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.results[node]
}

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

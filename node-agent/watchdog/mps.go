// SPDX-License-Identifier: Apache-2.0

package watchdog

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// mpsBypass acts on a container that uses an MPS GPU outside the GPU's MPS server.
// Every container bound to an MPS GPU is meant to be an MPS client: MPS holds it to
// its share of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and the CUDA hook, seeing
// the share is MPS's, does not pace it. A process of the container that NVML lists
// with a context of its own (it changed CUDA_MPS_PIPE_DIRECTORY, or its daemon was
// down when it started) is held by neither, and time-slices against the MPS server's
// clients. The same PID seen so in two passes in a row counts, so that a process
// caught while it connects is not; one event per episode, as for compute.
func (w *Watchdog) mpsBypass(tr *track, cu *Usage) bool {
	var both []int
	for _, pid := range cu.OwnContext {
		if slices.Contains(tr.ownContext, pid) {
			both = append(both, pid)
		}
	}
	tr.ownContext = slices.Clone(cu.OwnContext)
	if w.cfg.ComputeAction == ActionOff || len(both) == 0 {
		tr.mpsActed = false
		return false
	}
	if tr.mpsActed {
		return false
	}
	pids := make([]string, len(both))
	for i, p := range both {
		pids[i] = strconv.Itoa(p)
	}
	what := fmt.Sprintf("runs process(es) %s on GPU %s with a CUDA context of their own instead of as clients of the GPU's MPS server, "+
		"so their use of the GPU is held to no gpu-cores share (CUDA_MPS_PIPE_DIRECTORY changed, or the MPS daemon was down when they started)",
		strings.Join(pids, ","), cu.GPU)
	w.act(cu, w.cfg.ComputeAction, "mps", "GPUMPSBypassed", what)
	if w.cfg.ComputeAction == ActionKill {
		tr.ownContext = nil
	} else {
		tr.mpsActed = true
	}
	return true
}

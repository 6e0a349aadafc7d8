// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
)

// A GPU's sharing mode (api.Sharing) is what its node agent publishes; a pod's is its
// tessera.dev/gpu-sharing annotation. A pod is placed only on GPUs of its own mode, so
// MPS clients and time-sliced tenants never share a GPU (PodInfo.Eligible and
// EligibleAt), and an MPS GPU takes no more containers than its MPS server's client
// limit (Fits). The node agent checks both again when it binds the container.

// ParseSharing reads the pod's sharing mode into info, and checks its work-conserving
// annotation (which does not move a placement: the node agent writes it into the
// container's limits) so that a bad one keeps the pod pending with the reason rather
// than refused at its containers' creation.
func ParseSharing(pod *v1.Pod, info *PodInfo) error {
	mode, err := api.PodSharing(pod)
	if err != nil {
		return err
	}
	wc, err := api.ParseWorkConserving(pod.Annotations[api.AnnotationWorkConserving])
	if err != nil {
		return err
	}
	if wc && mode == api.SharingMPS {
		return fmt.Errorf("annotation %s: work-conserving pacing is for time-sliced GPUs, and the pod's %s is mps, "+
			"where MPS divides the SMs and nothing is paced: remove one of the two", api.AnnotationWorkConserving, api.AnnotationSharing)
	}
	if mode == api.SharingMPS {
		if err := api.CheckMPSRequest(info.Req); err != nil {
			return err
		}
		info.mps = true
	}
	return nil
}

// modeMatches reports whether device i is in the pod's sharing mode. Nodes without
// MPS GPUs answer from the pod alone, without reading the device.
func modeMatches(m *nodemodel.Model, p *PodInfo, i int) bool {
	if !m.HasMPS {
		return !p.mps
	}
	return m.Devices[i].MPS == p.mps
}

// mpsRoom reports whether device i has a client slot left: always for a
// time-sliced device (whose tenants the profile's maxTenantsPerGPU bounds).
func mpsRoom(m *nodemodel.Model, u *Usage, i int) bool {
	return !m.Devices[i].MPS || u.Tenants < m.Devices[i].MPSClients
}

// MPSRoom is mpsRoom for the policies: whether device i, used as u, takes one more
// tenant under its MPS server's client limit (always, for a time-sliced device).
func MPSRoom(m *nodemodel.Model, u *Usage, i int) bool { return mpsRoom(m, u, i) }

// sharingMiss explains a node none of whose GPUs matched the pod when some would
// have but for their sharing mode; "" otherwise.
func sharingMiss(m *nodemodel.Model, p *PodInfo) string {
	other := PodInfo{ModelInclude: p.ModelInclude, ModelExclude: p.ModelExclude, UUIDInclude: p.UUIDInclude, UUIDExclude: p.UUIDExclude, mps: !p.mps}
	for i := range m.Devices {
		if other.Eligible(&m.Devices[i]) {
			if p.mps {
				return fmt.Sprintf("node has no GPU in mps sharing mode (the pod's %s is mps); see the node agent's --mps-gpus", api.AnnotationSharing)
			}
			return fmt.Sprintf("node's GPUs are in mps sharing mode; only pods with %s: mps are placed on them", api.AnnotationSharing)
		}
	}
	return ""
}

// mpsTenantsReason is the reason a node's MPS GPUs are full of clients.
func mpsTenantsReason(c *api.ContainerRequest) string {
	return fmt.Sprintf("node(s) had no MPS GPU with a client slot left for container %q", c.Name)
}

// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
)

// A container bound to a GPU in mps mode is a client of that GPU's MPS server (see
// package mps): it gets the GPU's pipe directory, read-only, and the GPU's shm
// directory as its /dev/shm (MPS clients and their server share memory through
// it); CUDA_MPS_PIPE_DIRECTORY names the pipe directory, and its gpu-cores and
// gpu-memory grants become CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT. Its limits file carries cores 0 for that GPU:
// MPS divides the SMs, so the hook must not also time-slice the container, and the
// hook still enforces the memory grant. The limits file's mps line carries the SM
// share and the pipe directory: the environment is the tenant's to change, so the hook
// sets the MPS client's variables from that line before the driver starts.
const (
	// ContainerMPSPipeDir is where the GPU's MPS pipe directory is mounted in the
	// container.
	ContainerMPSPipeDir = "/run/tessera-mps"
	// ContainerShmDir is where the GPU's MPS shm directory is mounted.
	ContainerShmDir = "/dev/shm"

	EnvMPSPipeDirectory     = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSThreadPercentage  = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPinnedMemoryLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// MPSDirs are the host directories of one GPU's MPS service.
type MPSDirs struct {
	Pipe, Shm string
}

// mpsDirs returns the MPS directories of the GPU when the agent serves it in mps
// mode.
func (b *Binder) mpsDirs(uuid string) (MPSDirs, bool) {
	if b.cfg.MPS == nil {
		return MPSDirs{}, false
	}
	return b.cfg.MPS(uuid)
}

// checkSharing checks the pod's sharing mode against the modes of the GPUs it was
// granted: the same mode on every GPU, the GPU served as the inventory says, one GPU
// per container under MPS, and room under the MPS server's client limit. It returns
// "" or what is wrong. The caller holds b.mu.
func (b *Binder) checkSharing(r *Request, pod *corev1.Pod, req api.PodRequest, ca *api.ContainerAssignment, inv *api.NodeInventory) string {
	mode, err := api.PodSharing(pod)
	if err != nil {
		return err.Error()
	}
	if mode == api.SharingMPS {
		if err := api.CheckMPSRequest(req); err != nil {
			return err.Error()
		}
		if r.Started {
			return fmt.Sprintf("it asks for MPS sharing (%s: mps), which needs the GPU's MPS directories in the container at its creation, "+
				"but it is being bound at its first CUDA call (the node has no NRI): MPS pods need NRI", api.AnnotationSharing)
		}
	}
	gpus := make(map[string]*api.GPU, len(inv.GPUs))
	for i := range inv.GPUs {
		gpus[inv.GPUs[i].UUID] = &inv.GPUs[i]
	}
	for _, d := range ca.Devices {
		g := gpus[d.UUID]
		if g == nil {
			// A MIG instance: never in mps mode (the inventory's validation).
			if mode == api.SharingMPS {
				return fmt.Sprintf("it asks for MPS sharing but was granted MIG instance %s, which is not served by MPS", d.UUID)
			}
			continue
		}
		if g.Mode() != mode {
			return fmt.Sprintf("the pod asks for %s sharing (annotation %s) but GPU %s is in %s mode; the scheduler never places it so, "+
				"so the GPU's mode changed after placement: delete the pod to have it placed again", mode, api.AnnotationSharing, d.UUID, g.Mode())
		}
		_, served := b.mpsDirs(d.UUID)
		if served != (mode == api.SharingMPS) {
			return fmt.Sprintf("GPU %s is in %s mode in the node's inventory, but the node agent does not serve it so", d.UUID, g.Mode())
		}
		if mode == api.SharingMPS {
			if n := b.mpsClients(d.UUID, r); n+1 > g.MPSClients {
				return fmt.Sprintf("GPU %s's MPS server takes %d clients and %d containers are bound to it already", d.UUID, g.MPSClients, n)
			}
		}
	}
	return ""
}

// mpsClients counts the containers bound to a GPU whose pods still exist, other
// than another instance of r's container.
func (b *Binder) mpsClients(uuid string, r *Request) int {
	type key struct{ pod, container string }
	seen := map[key]bool{{r.PodUID, r.Container}: true}
	n := 0
	for _, rec := range b.allRecords() {
		if rec.Claim {
			for _, g := range rec.Devices {
				if g.UUID == uuid && rec.ContainerID != r.ContainerID {
					n++
				}
			}
			continue
		}
		k := key{rec.PodUID, rec.Container}
		if seen[k] {
			continue
		}
		for _, g := range rec.Devices {
			if g.UUID != uuid {
				continue
			}
			if p, err := b.cfg.Pods(rec.Namespace, rec.Pod, rec.PodUID, false); err != nil || p != nil {
				seen[k] = true
				n++
			}
		}
	}
	return n
}

// mpsEdits turns off the hook's pacing on the container's MPS GPUs and returns the
// environment and mounts an MPS client needs; none for a time-sliced container.
func (b *Binder) mpsEdits(r *Request, grants []api.DeviceGrant, limits *api.ContainerLimits) ([][2]string, []Mount, error) {
	var env [][2]string
	var mounts []Mount
	for i, d := range grants {
		dirs, ok := b.mpsDirs(d.UUID)
		if !ok {
			continue
		}
		if len(grants) != 1 {
			return nil, nil, fmt.Errorf("GPU %s is served by MPS, which takes one GPU per container, and the container holds %d", d.UUID, len(grants))
		}
		if r.Started {
			return nil, nil, fmt.Errorf("GPU %s is served by MPS, which needs its directories in the container at creation; "+
				"the container is being bound at its first CUDA call", d.UUID)
		}
		limits.GPUs[i].Cores, limits.GPUs[i].Phase = 0, 0
		// Without a gpu-cores grant the client may use every SM, as the environment
		// (which then has no percentage) says.
		limits.MPS = &api.MPSLimit{ThreadPercent: 100, PipeDir: ContainerMPSPipeDir}
		if d.Cores > 0 {
			limits.MPS.ThreadPercent = d.Cores
		}
		// A client's context is smaller than a plain one, the more so the fewer SMs
		// its share gives it: charged as a plain one, a 30 % container would be
		// refused about 360 MiB per process below its grant.
		limits.ContextMiB = api.MPSContextMiB(limits.ContextMiB, limits.MPS.ThreadPercent)
		env = append(env, [2]string{EnvMPSPipeDirectory, ContainerMPSPipeDir})
		if d.Cores > 0 {
			env = append(env, [2]string{EnvMPSThreadPercentage, strconv.Itoa(d.Cores)})
		}
		// The client sees its one GPU as device 0.
		env = append(env, [2]string{EnvMPSPinnedMemoryLimit, fmt.Sprintf("0=%dM", d.MemoryMiB)})
		mounts = append(mounts,
			Mount{Source: dirs.Pipe, Destination: ContainerMPSPipeDir, ReadOnly: true},
			Mount{Source: dirs.Shm, Destination: ContainerShmDir})
	}
	return env, mounts, nil
}

// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"slices"
	"strconv"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
)

// Every container bound through NRI gets a directory of its own for its accounting
// region (docs/cuda-hook.md, "Shared by the container's processes"): a tmpfs at
// api.ContainerRegionDir that the runtime creates with the container and removes with
// it, named by the region line of its limits file. No host directory is shared: an MPS
// client's /dev/shm is its GPU's MPS shm directory, shared with every other client of
// the GPU, and a neighbour could otherwise write or lock the region kept there. The
// file system is capped (api.RegionDirBytes, and a few inodes: the hook makes one
// file) and mounted nosuid, nodev, noexec; mode 1777, as /dev/shm, because the tenant
// may run as any user.
//
// The fallback binding cannot add a mount to a running container: its containers keep
// their region in their pod's /dev/shm, which no other pod's container shares because
// MPS containers are bound only through NRI (mps.go).

// regionInodes caps the tmpfs's inodes: its root and the region file, with room.
const regionInodes = 16

// RegionMount is the container's private region directory.
func RegionMount() Mount {
	return Mount{Source: "tmpfs", Destination: api.ContainerRegionDir, Type: "tmpfs", Options: []string{
		"nosuid", "nodev", "noexec",
		"size=" + strconv.Itoa(api.RegionDirBytes),
		"nr_inodes=" + strconv.Itoa(regionInodes),
		"mode=1777",
	}}
}

// regionDir returns the region line of the container's limits file: the private
// directory where the container has it or is being given it, "" (the hook's /dev/shm)
// where it cannot have it. A container bound before keeps its record's choice: a later
// bind (the fallback socket asked from inside it, say) must not move new processes to
// another region than the running ones use, which would let each region count the
// grant once.
func regionDir(r *Request, prev *checkpoint.Record) string {
	switch {
	case prev != nil:
		return prev.RegionDir
	case r.Started:
		return ""
	case r.Running:
		// Created by an agent that mounted no region directory, the container has
		// none; its next process must still find its region.
		if !slices.Contains(r.Mounts, api.ContainerRegionDir) {
			return ""
		}
	}
	return api.ContainerRegionDir
}

// SPDX-License-Identifier: Apache-2.0

package api

import "fmt"

// The CUDA hooks of the paced containers that share one time-sliced GPU take turns on
// it through one small shared file per GPU, so that containers with long kernels run
// one after another instead of being cut into time slices by the driver
// (docs/cuda-hook.md, "GPU turns", which owns the file's layout). The node agent only
// provides the files: it creates them in one host directory, named by the GPU's UUID,
// and bind-mounts each file on its own, read-write, at ContainerTurnsDir/<name> into
// every container that the hook paces on that GPU (never the directory, so that a
// tenant can neither remove nor replace a file). To the agent a turn file is opaque: it has
// TurnFileBytes bytes, and all zeroes is a valid empty state, so a new file needs no
// content. A tenant that damages a file can only make its neighbours on that GPU fall
// back to plain time-slicing: the hook bounds every wait on it.

// ContainerTurnsDir is the directory inside the container where the node agent mounts
// the GPU turn files, each read-write. It is not under ContainerLimitsDir, which is a read-only mount
// of another directory.
const ContainerTurnsDir = "/run/tessera-turns"

// DefaultHostTurnsDir is the host directory of the turn files (the node agent's
// --turns-dir). It is on tmpfs, as /run is: the files must start empty at every boot,
// since what they hold is in the monotonic clock, which starts again at boot.
const DefaultHostTurnsDir = "/run/tessera/turns"

// TurnFileBytes is the size of each GPU's turn file.
const TurnFileBytes = 4096

// TurnFileName returns the name of a GPU's turn file inside the turns directory: the
// GPU's (or MIG instance's) UUID. A UUID that could not be one in a limits file (which
// could also name another path, through "/" or "..") is an error.
func TurnFileName(uuid string) (string, error) {
	if err := checkLimitsUUID(uuid); err != nil {
		return "", fmt.Errorf("GPU turn file: %w", err)
	}
	return uuid, nil
}

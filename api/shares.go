// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// A container granted no gpu-cores on a time-sliced GPU gets what the reservations on
// that GPU leave over, not a time slice beside them: its CUDA hook paces it to the
// GPU's unreserved share, which the node agent keeps in one small file per GPU (the
// share file) and rewrites whenever a container is bound to or leaves the GPU. The agent
// alone writes it: each GPU's file lives in a directory of its own, under
// HostSharesDir, that the agent bind-mounts read-only at ContainerSharesDir/<uuid> into
// the containers it gives that GPU without cores (a directory, so that the agent can
// replace the file atomically and the container sees the new one). docs/cuda-hook.md,
// "Unreserved containers", says how the hook reads it.
//
// Share file, version 1:
//
//	version 1
//	reserved 70      sum of the cores granted on the GPU (0..100 and beyond, never negative)
//	containers 2     containers on the GPU granted no cores
//	share 15         each of those containers' share of the GPU's time, percent (1..100)
//	phase 70         where in the pacing period their allowance is refilled, percent (0..99)
//
// Every line is required, in this order, each ending in "\n". share 100 means that
// nothing is reserved on the GPU: the containers without cores are not paced
// (time-slicing among themselves, as before any reservation).

// ContainerSharesDir is the directory inside a container under which the node agent
// mounts, read-only, the share directory of each GPU the container has without cores.
const ContainerSharesDir = "/run/tessera-shares"

// SharesSubdir is the directory under the node agent's limits root (HostSharesDir)
// that holds one share directory per GPU. It cannot be a container's limits
// directory, whose names are hexadecimal (LimitsKey).
const SharesSubdir = "gpus"

// ShareFileName is the name of the share file inside a GPU's share directory.
const ShareFileName = "share"

// ShareFileVersion is the version of the share file's format.
const ShareFileVersion = 1

// MinUnreservedShare is the least share a container without cores is paced to, however
// much of the GPU is reserved, and what the hook paces it to while it has never read
// a valid share file: one percent, so that its program goes on (slowly) rather than
// hanging in a launch, at the cost of at most one point of the reservations.
const MinUnreservedShare = 1

// MaxShareFileBytes bounds what the hook reads of a share file.
const MaxShareFileBytes = 256

// UnreservedShare is the content of one GPU's share file.
type UnreservedShare struct {
	// Reserved is the sum of the cores granted on the GPU.
	Reserved int
	// Containers counts the containers on the GPU granted no cores.
	Containers int
	// Share is each such container's share of the GPU's time in percent; 100: not paced.
	Share int
	// Phase is where in the pacing period their allowance is refilled, in percent.
	Phase int
}

// HostSharesDir returns the host directory of a GPU's share file under the node
// agent's limits root; a UUID that could not be one in a limits file is an error.
func HostSharesDir(limitsRoot, uuid string) (string, error) {
	if err := checkLimitsUUID(uuid); err != nil {
		return "", fmt.Errorf("GPU share file: %w", err)
	}
	return path.Join(limitsRoot, SharesSubdir, uuid), nil
}

// ComputeUnreservedShare is the share of the containers without cores on a GPU, given
// the compute windows granted there (reserved) and how many containers without cores
// share what they leave. Nothing reserved: 100, not paced. Otherwise the unreserved
// remainder split equally (at least MinUnreservedShare each), refilled at the start of
// the widest gap the reservations leave, as api.PlacePhase finds it. An equal split
// rather than the whole remainder each: containers paced each to the remainder would
// together take up to n times it, out of the reservations; and a shared allowance
// would be state that every one of those tenants can write.
func ComputeUnreservedShare(reserved []PhaseSpan, containers int) UnreservedShare {
	s := UnreservedShare{Containers: max(containers, 0), Share: 100}
	for _, r := range reserved {
		if r.Cores > 0 {
			s.Reserved += r.Cores
		}
	}
	if s.Reserved == 0 {
		return s
	}
	left := max(100-s.Reserved, 0)
	s.Share = max(left/max(s.Containers, 1), MinUnreservedShare)
	s.Phase, _ = PlacePhase(reserved, max(left, MinUnreservedShare))
	return s
}

// EncodeShare writes a share file.
func EncodeShare(s UnreservedShare) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "version %d\nreserved %d\ncontainers %d\nshare %d\nphase %d\n",
		ShareFileVersion, s.Reserved, s.Containers, s.Share, s.Phase), nil
}

// Validate checks the ranges of every field.
func (s UnreservedShare) Validate() error {
	switch {
	case s.Reserved < 0 || s.Reserved > 10000:
		return fmt.Errorf("share file: reserved %d out of range 0..10000", s.Reserved)
	case s.Containers < 0 || s.Containers > 100000:
		return fmt.Errorf("share file: containers %d out of range 0..100000", s.Containers)
	case s.Share < MinUnreservedShare || s.Share > 100:
		return fmt.Errorf("share file: share %d out of range %d..100", s.Share, MinUnreservedShare)
	case s.Phase < 0 || s.Phase > 99:
		return fmt.Errorf("share file: phase %d out of range 0..99", s.Phase)
	}
	return nil
}

// DecodeShare reads a share file: exactly the lines EncodeShare writes, in its order.
func DecodeShare(b []byte) (UnreservedShare, error) {
	var s UnreservedShare
	if len(b) > MaxShareFileBytes {
		return s, fmt.Errorf("share file: %d bytes, at most %d", len(b), MaxShareFileBytes)
	}
	if !bytes.HasSuffix(b, []byte("\n")) {
		return s, errors.New("share file: does not end in a newline")
	}
	lines := strings.Split(string(b[:len(b)-1]), "\n")
	keys := []string{"version", "reserved", "containers", "share", "phase"}
	if len(lines) != len(keys) {
		return s, fmt.Errorf("share file: %d lines, want %d", len(lines), len(keys))
	}
	vals := make([]int, len(keys))
	for i, ln := range lines {
		k, v, ok := strings.Cut(ln, " ")
		if !ok || k != keys[i] {
			return s, fmt.Errorf("share file: line %d: want \"%s <n>\"", i+1, keys[i])
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || len(v) > 6 || strconv.Itoa(n) != v {
			return s, fmt.Errorf("share file: line %d: %q is not a number", i+1, v)
		}
		vals[i] = n
	}
	if vals[0] != ShareFileVersion {
		return s, fmt.Errorf("share file: version %d, want %d", vals[0], ShareFileVersion)
	}
	s = UnreservedShare{Reserved: vals[1], Containers: vals[2], Share: vals[3], Phase: vals[4]}
	if err := s.Validate(); err != nil {
		return UnreservedShare{}, err
	}
	return s, nil
}

// SPDX-License-Identifier: Apache-2.0

// Package checkpoint keeps the node agent's record of the containers it bound to GPUs,
// in one versioned, checksummed file written atomically. After a restart the agent
// reloads it; a file that fails its checksum is set aside (never trusted, never
// deleted) and the agent rebuilds the records from the runtime's list of running
// containers instead.
//
// Kubelet's checkpoint manager (k8s.io/kubernetes/pkg/kubelet/checkpointmanager, in
// the pinned module) is not used, because it would not keep what this package
// guarantees for what it would replace:
//
//   - Durable writes. Its file store writes a temporary file, syncs it and renames it
//     over the old one, but does not sync the directory afterwards, so the rename may
//     be lost in a power cut; every write here syncs the directory after it.
//   - A checksum of the file's content. Its checksum package is a 32-bit FNV hash of
//     the Go value as spew prints it, which changes with the Go types rather than
//     with the bytes on disk; this file carries the SHA-256 of its records' compact
//     JSON, which a person can re-indent without breaking and check with any tool.
//   - Corruption handling and the decoder's fuzz test stay here either way: the
//     manager only returns a CorruptCheckpointError and leaves the file in place, and
//     the decoding is the caller's.
//
// It would also make the node agent import k8s.io/kubernetes, which it does not
// otherwise, for about thirty lines of file handling.
package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/tessera-dev/tessera/api"
)

// Version is the checkpoint format version.
const Version = 1

// Record is one bound container.
type Record struct {
	ContainerID string `json:"containerID"`
	PodUID      string `json:"podUID"`
	Namespace   string `json:"namespace"`
	Pod         string `json:"pod"`
	Container   string `json:"container"`
	// Cgroup is the container's cgroup path in the host's cgroup hierarchy.
	Cgroup string `json:"cgroup"`
	// Devices are the granted GPUs as the assignment gave them.
	Devices []api.DeviceGrant `json:"devices"`
	// Phases are the compute-pacing phases chosen per GPU UUID.
	Phases map[string]int `json:"phases,omitempty"`
	// LimitsDir is the host directory mounted into the container.
	LimitsDir string `json:"limitsDir"`
	// RegionDir is the region line of the container's limits file (the directory of
	// its accounting region as it sees it), "" for none: chosen at the first bind
	// from the mounts the container was created with, and kept.
	RegionDir string    `json:"regionDir,omitempty"`
	BoundAt   time.Time `json:"boundAt"`
	// Claim marks the record of a DRA ResourceClaim prepared on the node (kept in the
	// claim checkpoint): ContainerID is then the claim's UID, Namespace and Pod its
	// namespace and name, and Cgroup the key its limits file is written under
	// (binding.ClaimCgroup), shared by every container of the claim.
	Claim bool `json:"claim,omitempty"`
}

type file struct {
	Version int `json:"version"`
	// Checksum is the hex SHA-256 of the JSON encoding of Records.
	Checksum string            `json:"checksum"`
	Records  json.RawMessage   `json:"records"`
	records  map[string]Record // decoded
}

// ErrCorrupt is returned by Open when the file exists but cannot be trusted.
var ErrCorrupt = errors.New("checkpoint corrupt")

// Store is the checkpoint file and its records in memory. It is safe for concurrent use.
type Store struct {
	path string

	mu      sync.Mutex
	records map[string]Record
}

// Open loads path. A missing file gives an empty store. A corrupt one (bad JSON,
// unknown version, checksum mismatch) is renamed to path.corrupt-<unix time> and an
// empty store is returned together with an error wrapping ErrCorrupt, so that the
// caller logs it and rebuilds from the runtime.
func Open(path string) (*Store, error) {
	s := &Store{path: path, records: map[string]Record{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	recs, derr := decode(data)
	if derr != nil {
		aside := fmt.Sprintf("%s.corrupt-%d", path, time.Now().Unix())
		if err := os.Rename(path, aside); err != nil {
			return nil, fmt.Errorf("checkpoint %s is corrupt (%v) and cannot be set aside: %w", path, derr, err)
		}
		return s, fmt.Errorf("%w: %s: %v; moved to %s", ErrCorrupt, path, derr, aside)
	}
	s.records = recs
	return s, nil
}

func decode(data []byte) (map[string]Record, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	if f.Version != Version {
		return nil, fmt.Errorf("version %d is not supported (want %d)", f.Version, Version)
	}
	// The checksum covers the compact encoding, so that re-indenting the file (by a
	// person reading it) does not break it, while any change of content does.
	var compact bytes.Buffer
	if err := json.Compact(&compact, f.Records); err != nil {
		return nil, fmt.Errorf("records: %v", err)
	}
	sum := sha256.Sum256(compact.Bytes())
	if hex.EncodeToString(sum[:]) != f.Checksum {
		return nil, errors.New("checksum mismatch")
	}
	var list []Record
	if err := json.Unmarshal(f.Records, &list); err != nil {
		return nil, fmt.Errorf("records: %v", err)
	}
	recs := make(map[string]Record, len(list))
	for _, r := range list {
		if err := r.Validate(); err != nil {
			return nil, err
		}
		if _, dup := recs[r.ContainerID]; dup {
			return nil, fmt.Errorf("container %s has two records", r.ContainerID)
		}
		recs[r.ContainerID] = r
	}
	return recs, nil
}

// Validate checks that r is a record the agent could have written: a container id,
// devices that make a valid grant (as in an assignment), a clean cgroup path, phases
// only for the granted GPUs that the limits file accepts, a limits directory
// named after the cgroup, and no region directory but the container's own. A checkpoint whose checksum matches but that holds any
// other record is corrupt all the same: the agent rebuilds from the runtime rather
// than enforce, or remove directories, from it.
func (r Record) Validate() error {
	if r.ContainerID == "" {
		return errors.New("a record has no container id")
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("record of container %s: %s", r.ContainerID, fmt.Sprintf(format, a...))
	}
	grant := api.PodAssignment{Version: api.AssignmentVersion, Node: "-",
		Containers: []api.ContainerAssignment{{Name: "-", Devices: r.Devices}}}
	if err := grant.Validate(); err != nil {
		return bad("devices: %v", err)
	}
	if r.Cgroup != path.Clean(r.Cgroup) {
		return bad("cgroup %q is not a clean path", r.Cgroup)
	}
	limits, err := api.NewContainerLimits(grant.Containers[0], r.Cgroup)
	if err != nil {
		return bad("%v", err)
	}
	placed := 0
	for i := range limits.GPUs {
		if p, ok := r.Phases[limits.GPUs[i].UUID]; ok {
			limits.GPUs[i].Phase = p
			placed++
		}
	}
	if placed != len(r.Phases) {
		return bad("phases name a GPU the container was not granted")
	}
	if err := limits.Validate(); err != nil {
		return bad("%v", err)
	}
	if r.LimitsDir != "" && (!filepath.IsAbs(r.LimitsDir) || filepath.Clean(r.LimitsDir) != r.LimitsDir ||
		filepath.Base(r.LimitsDir) != api.LimitsKey(r.Cgroup)) {
		return bad("limits directory %q is not the cgroup's", r.LimitsDir)
	}
	if r.RegionDir != "" && r.RegionDir != api.ContainerRegionDir {
		return bad("region directory %q is not %s", r.RegionDir, api.ContainerRegionDir)
	}
	return nil
}

func encode(recs map[string]Record) ([]byte, error) {
	list := make([]Record, 0, len(recs))
	for _, r := range recs {
		list = append(list, r)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].ContainerID < list[j].ContainerID })
	body, err := json.Marshal(list)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	return json.MarshalIndent(file{Version: Version, Checksum: hex.EncodeToString(sum[:]), Records: body}, "", " ")
}

// Put adds or replaces a record and saves the file.
func (s *Store) Put(r Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, had := s.records[r.ContainerID]
	s.records[r.ContainerID] = r
	if err := s.saveLocked(); err != nil {
		if had {
			s.records[r.ContainerID] = prev
		} else {
			delete(s.records, r.ContainerID)
		}
		return err
	}
	return nil
}

// Delete removes a record and saves the file; a missing record is not an error.
func (s *Store) Delete(containerID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.records[containerID]; !ok {
		return nil
	}
	delete(s.records, containerID)
	return s.saveLocked()
}

// Get returns one record.
func (s *Store) Get(containerID string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[containerID]
	return r, ok
}

// List returns every record, ordered by container id.
func (s *Store) List() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Record, 0, len(s.records))
	for _, r := range s.records {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ContainerID < out[j].ContainerID })
	return out
}

// saveLocked writes a temporary file, syncs it and renames it over the checkpoint, so
// that a crash leaves either the old file or the new one, never half of one.
func (s *Store) saveLocked() error {
	data, err := encode(s.records)
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(s.path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // make the rename durable
		d.Close()
	}
	return nil
}

// SPDX-License-Identifier: Apache-2.0

package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/api"
)

func rec(id string) Record {
	return Record{ContainerID: id, PodUID: "uid-" + id, Namespace: "ns", Pod: "p", Container: "c",
		Cgroup: "/kubepods/pod/" + id, Devices: []api.DeviceGrant{{UUID: "GPU-1", MemoryMiB: 100, Cores: 30}},
		Phases: map[string]int{"GPU-1": 30}, RegionDir: api.ContainerRegionDir, BoundAt: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)}
}

func TestRoundTripAndRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "checkpoint.json")
	s, err := Open(path)
	if err != nil || len(s.List()) != 0 {
		t.Fatalf("fresh store: %v %v", s.List(), err)
	}
	for _, id := range []string{"b", "a", "c"} {
		if err := s.Put(rec(id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete("c"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("never-there"); err != nil {
		t.Fatal(err)
	}
	// A restarted agent sees exactly what was saved.
	s2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	got := s2.List()
	if len(got) != 2 || got[0].ContainerID != "a" || got[1].ContainerID != "b" {
		t.Fatalf("reloaded %+v", got)
	}
	if r, ok := s2.Get("b"); !ok || r.Phases["GPU-1"] != 30 || r.Devices[0].Cores != 30 || !r.BoundAt.Equal(rec("b").BoundAt) || r.RegionDir != api.ContainerRegionDir {
		t.Fatalf("record b: %+v", r)
	}
	matches, _ := filepath.Glob(path + ".tmp-*")
	if len(matches) != 0 {
		t.Errorf("temporary files left: %v", matches)
	}
}

func TestCorruption(t *testing.T) {
	for name, mutate := range map[string]func([]byte) []byte{
		"truncated":  func(b []byte) []byte { return b[:len(b)/2] },
		"bit flip":   func(b []byte) []byte { return []byte(strings.Replace(string(b), "uid-a", "uid-x", 1)) },
		"garbage":    func([]byte) []byte { return []byte("\x00\x01garbage") },
		"version":    func(b []byte) []byte { return []byte(strings.Replace(string(b), `"version": 1`, `"version": 9`, 1)) },
		"empty":      func([]byte) []byte { return nil },
		"bad record": func([]byte) []byte { return mustFile(t, `[{"containerID":""}]`) },
		// The checksum matches in the cases below; the records themselves cannot be trusted.
		"duplicate": func([]byte) []byte { return mustFile(t, "["+recJSON(t, rec("a"))+","+recJSON(t, rec("a"))+"]") },
		"limits dir escapes": func([]byte) []byte {
			r := rec("a")
			r.LimitsDir = "/run/tessera/containers/../../../etc/" + api.LimitsKey(r.Cgroup)
			return mustFile(t, "["+recJSON(t, r)+"]")
		},
		"no devices": func([]byte) []byte {
			r := rec("a")
			r.Devices, r.Phases = nil, nil
			return mustFile(t, "["+recJSON(t, r)+"]")
		},
		"phase past the period": func([]byte) []byte {
			r := rec("a")
			r.Phases["GPU-1"] = 80
			return mustFile(t, "["+recJSON(t, r)+"]")
		},
		"region in the shared /dev/shm": func([]byte) []byte {
			r := rec("a")
			r.RegionDir = "/dev/shm"
			return mustFile(t, "["+recJSON(t, r)+"]")
		},
		"negative index": func([]byte) []byte {
			r := rec("a")
			r.Devices[0].Index = -1
			return mustFile(t, "["+recJSON(t, r)+"]")
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "checkpoint.json")
			s, _ := Open(path)
			if err := s.Put(rec("a")); err != nil {
				t.Fatal(err)
			}
			data, _ := os.ReadFile(path)
			if err := os.WriteFile(path, mutate(data), 0o600); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(path)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v, want ErrCorrupt", err)
			}
			if s2 == nil || len(s2.List()) != 0 {
				t.Fatal("a corrupt checkpoint was trusted")
			}
			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("corrupt file not set aside: %v", aside)
			}
			// The store is usable and writes a good file again.
			if err := s2.Put(rec("z")); err != nil {
				t.Fatal(err)
			}
			if s3, err := Open(path); err != nil || len(s3.List()) != 1 {
				t.Fatalf("after rewrite: %v %v", s3, err)
			}
		})
	}
}

func recJSON(t *testing.T, r Record) string {
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustFile(t *testing.T, records string) []byte {
	data, err := encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Build a file with a valid checksum around bad records.
	f := strings.Replace(string(data), "[]", records, 1)
	s, _ := decodeChecksumFix([]byte(f), records)
	return s
}

func decodeChecksumFix(data []byte, records string) ([]byte, error) {
	sumOld := sha256hex([]byte("[]"))
	return []byte(strings.Replace(string(data), sumOld, sha256hex([]byte(records)), 1)), nil
}

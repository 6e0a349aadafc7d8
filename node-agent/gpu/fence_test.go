// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"errors"
	"testing"
)

func TestCgroupMemory(t *testing.T) {
	const gib = 1 << 30
	exists := map[string]bool{"/cg": true, "/cg/pod": true, "/cg/pod/c1": true, "/cg/pod/c2": true}
	m := NewCgroupMemory(map[string]uint64{"GPU-a": 16 * gib}, func(d string) bool { return exists[d] })

	if err := m.SetMemoryLimit("GPU-a", "/cg/pod/missing", gib, gib); err == nil {
		t.Error("a limit on a cgroup that does not exist was set")
	}
	if err := m.SetMemoryLimit("GPU-b", "/cg/pod/c1", gib, gib); !errors.Is(err, ErrFenceUnsupported) {
		t.Errorf("a GPU without the limit: %v", err)
	}
	for _, bad := range [][2]uint64{{2 * gib, gib}, {0, 17 * gib}} {
		if err := m.SetMemoryLimit("GPU-a", "/cg/pod/c1", bad[0], bad[1]); err == nil {
			t.Errorf("soft %d hard %d accepted", bad[0], bad[1])
		}
	}
	if err := m.SetMemoryLimit("GPU-a", "/cg/pod/c1", 4*gib, 4*gib); err != nil {
		t.Fatal(err)
	}
	if err := m.SetMemoryLimit("GPU-a", "/cg/pod", 6*gib, 6*gib); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		cg    string
		bytes uint64
		ok    bool
	}{
		{"/cg/pod/c1", 3 * gib, true},
		{"/cg/pod/c1", 2 * gib, false},     // c1's own 4 GiB
		{"/cg/pod/c1/sub", 2 * gib, false}, // a cgroup below c1 is held to c1's limit
		{"/cg/pod/c1/sub", gib, true},      // up to it
		{"/cg/pod/c2", 3 * gib, false},     // the pod's 6 GiB
		{"/cg/pod/c2", 2 * gib, true},      // within the pod's
		{"/other", 10 * gib, true},         // no limit
		{"/other", gib, false},             // the GPU is full
	}
	for i, s := range steps {
		err := m.Alloc("GPU-a", s.cg, s.bytes)
		if s.ok != (err == nil) || err != nil && !errors.Is(err, ErrOutOfMemory) {
			t.Errorf("step %d: alloc %d bytes in %s: %v, want ok=%v", i, s.bytes, s.cg, err, s.ok)
		}
	}
	l, err := m.MemoryLimit("GPU-a", "/cg/pod/c1")
	if err != nil || !l.Set || l.Hard != 4*gib || l.Used != 4*gib {
		t.Errorf("c1's limit: %+v, %v", l, err)
	}
	m.Free("GPU-a", "/cg/pod/c1", 3*gib)
	// The pod now holds 3 GiB (1 in c1/sub, 2 in c2): 2 more in c1 fit, 2 after them do not.
	if err := m.Alloc("GPU-a", "/cg/pod/c1", 2*gib); err != nil {
		t.Errorf("allocating within both limits after a free: %v", err)
	}
	if err := m.Alloc("GPU-a", "/cg/pod/c2", 2*gib); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("allocating past the pod's limit: %v", err)
	}
	if err := m.SetMemoryLimit("GPU-a", "/cg/pod/c1", 0, NoMemoryLimit); err != nil {
		t.Fatal(err)
	}
	if l, _ := m.MemoryLimit("GPU-a", "/cg/pod/c1"); l.Set {
		t.Errorf("cleared limit still set: %+v", l)
	}
	m.SetMemoryLimit("GPU-a", "/cg/pod/c2", gib, 3*gib)
	m.RemoveCgroup("/cg/pod/c2")
	if l, _ := m.MemoryLimit("GPU-a", "/cg/pod/c2"); l.Set || l.Used != 0 {
		t.Errorf("a removed cgroup keeps its limit or usage: %+v", l)
	}
}

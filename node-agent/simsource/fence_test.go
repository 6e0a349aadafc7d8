// SPDX-License-Identifier: Apache-2.0

package simsource

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tessera-dev/tessera/node-agent/gpu"
)

func TestSimulatedMemoryFence(t *testing.T) {
	for _, fence := range []bool{true, false} {
		dir := t.TempDir()
		file := filepath.Join(dir, "node.yaml")
		topo := "version: 1\ngpus:\n- model: NVIDIA H100\n  memoryMiB: 81559\n- model: NVIDIA A100\n  memoryMiB: 81920\n  mig:\n  - profile: 3g.40gb\n    memoryMiB: 40192\n"
		if fence {
			topo += "memoryFence: true\n"
		}
		if err := os.WriteFile(file, []byte(topo), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := New(file, "n")
		if err != nil {
			t.Fatal(err)
		}
		sup, err := s.FenceSupport(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(sup) != 2 || sup[0].Supported != fence || sup[1].Supported || sup[1].Reason == "" {
			t.Fatalf("memoryFence %v: support %+v", fence, sup)
		}
		cg := filepath.Join(dir, "c1")
		err = s.SetMemoryLimit(sup[0].UUID, cg, 1<<30, 1<<30)
		if !fence {
			if !errors.Is(err, gpu.ErrFenceUnsupported) {
				t.Errorf("without memoryFence: %v, want unsupported", err)
			}
			continue
		}
		if err == nil {
			t.Error("a limit was set on a cgroup directory that does not exist")
		}
		if err := os.Mkdir(cg, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := s.SetMemoryLimit(sup[0].UUID, cg, 1<<30, 1<<30); err != nil {
			t.Fatal(err)
		}
		if l, err := s.MemoryLimit(sup[0].UUID, cg); err != nil || l.Hard != 1<<30 {
			t.Errorf("limit: %+v, %v", l, err)
		}
		if err := s.Memory().Alloc(sup[0].UUID, cg, 2<<30); !errors.Is(err, gpu.ErrOutOfMemory) {
			t.Errorf("allocation past the limit: %v", err)
		}
		if err := s.SetMemoryLimit(sup[1].UUID, cg, 1<<30, 1<<30); !errors.Is(err, gpu.ErrFenceUnsupported) {
			t.Errorf("MIG-mode GPU: %v, want unsupported", err)
		}
	}
}

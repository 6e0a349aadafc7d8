// SPDX-License-Identifier: Apache-2.0

//go:build gpu

package cdi

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr/testr"

	"github.com/tessera-dev/tessera/node-agent/nvmlsource"
)

// The spec for the real driver of this machine, and a container root holding nothing
// but glibc, the spec's mounts and its device nodes, in which a process loads
// libcuda.so.1 and counts the GPUs. TESSERA_CDI_LIBRARY_SEARCH_PATHS (comma-separated)
// points the discovery at a driver outside the loader cache; TESSERA_CDI_SPEC_DIR
// keeps the spec. Run as root:
//
//	go test -tags gpu -run RealDriver ./node-agent/cdi
func TestRealDriverSpec(t *testing.T) {
	src, err := nvmlsource.New(nvml.New(), testr.New(t))
	if err != nil {
		t.Skipf("no NVML: %v", err)
	}
	defer src.Close()
	devs, err := src.Devices()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{SpecDir: os.Getenv("TESSERA_CDI_SPEC_DIR"), Hook: HookAuto, Log: testr.NewWithOptions(t, testr.Options{Verbosity: 1})}
	if cfg.SpecDir == "" {
		cfg.SpecDir = t.TempDir()
	}
	if p := os.Getenv("TESSERA_CDI_LIBRARY_SEARCH_PATHS"); p != "" {
		cfg.LibrarySearchPaths = strings.Split(p, ",")
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := g.Generate(devs)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	t.Logf("spec: %s", b)
	var names []string
	whole := 0
	for _, d := range devs {
		if d.ParentUUID == "" {
			whole++
			names = append(names, g.QualifiedName(d.UUID))
		}
	}
	spec := injected(t, cfg.SpecDir, []string{"PATH=/usr/bin"}, names...)
	if s.LibraryDir != "" {
		without, err := inRoot(t, spec, spec.Process.Env)
		t.Logf("without %s on LD_LIBRARY_PATH: %v %q", s.LibraryDir, err, strings.TrimSpace(without))
		if err == nil {
			t.Error("libcuda.so.1 loaded without the library directory")
		}
		spec.Process.Env = append(spec.Process.Env, "LD_LIBRARY_PATH="+s.LibraryDir)
	}
	out, err := inRoot(t, spec, spec.Process.Env)
	t.Logf("in the container root: %v %q", err, strings.TrimSpace(out))
	if err != nil || !strings.Contains(out, "cuInit+cuDeviceGetCount=0 devices=") {
		t.Fatalf("the driver did not load from the spec: %v\n%s", err, out)
	}
	if !strings.Contains(out, "devices="+itoa(whole)) {
		t.Fatalf("want %d devices: %s", whole, out)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

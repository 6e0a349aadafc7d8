// SPDX-License-Identifier: Apache-2.0

//go:build linux

package node

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// hostPython is the machine's Python with PyTorch, as it reports itself.
type hostPython struct {
	Exe            string   `json:"exe"`
	BasePrefix     string   `json:"base_prefix"`
	BaseExecPrefix string   `json:"base_exec_prefix"`
	Path           []string `json:"path"`
	Torch          string   `json:"torch"`
	Version        string   `json:"version"`
}

const hostRoot = "/host"

// findHostPython asks the machine's python3 (TESSERA_NODE_PYTHON, default python3 on
// PATH) where it and PyTorch live; an error when there is none or it has no PyTorch.
func findHostPython() (*hostPython, error) {
	py := os.Getenv("TESSERA_NODE_PYTHON")
	if py == "" {
		var err error
		if py, err = exec.LookPath("python3"); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c", `import json, os, sys
import torch
print(json.dumps({"exe": os.path.realpath(sys.executable), "base_prefix": sys.base_prefix,
  "base_exec_prefix": sys.base_exec_prefix, "path": [p for p in sys.path if p],
  "torch": os.path.dirname(torch.__file__), "version": torch.__version__}))`).Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %v", py, err)
	}
	var h hostPython
	if err := json.Unmarshal(bytes.TrimSpace(out), &h); err != nil {
		return nil, fmt.Errorf("%s: %q: %v", py, out, err)
	}
	return &h, nil
}

// interpreter is the ELF program interpreter (the dynamic loader) of exe.
func interpreter(exe string) (string, error) {
	f, err := elf.Open(exe)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", err
			}
			return filepath.EvalSymlinks(string(bytes.TrimRight(b, "\x00")))
		}
	}
	return "", fmt.Errorf("%s has no program interpreter", exe)
}

// hostLibraryDirs are the directories of the machine's loader cache (ldconfig -p).
func hostLibraryDirs() ([]string, error) {
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		ldconfig = "/sbin/ldconfig"
	}
	out, err := exec.Command(ldconfig, "-p").Output()
	if err != nil {
		return nil, fmt.Errorf("%s -p: %v", ldconfig, err)
	}
	var dirs []string
	for _, line := range strings.Split(string(out), "\n") {
		if _, path, ok := strings.Cut(line, " => "); ok {
			d := filepath.Dir(strings.TrimSpace(path))
			if r, err := filepath.EvalSymlinks(d); err == nil {
				d = r
			}
			if !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs, nil
}

// hostPythonPod is a pod of the probe's image that runs the machine's Python (with
// PyTorch) on script, mounted read-only from the host under /host: the host's loader
// runs it with the host's libraries, after the driver's directory that the agent's
// CDI spec mounts (/usr/local/nvidia/lib64), so that the driver comes through CDI
// and not from the host mount. The CUDA hook is preloaded by that loader as by any
// other (/etc/ld.so.preload in the container).
func (n *node) hostPythonPod(h *hostPython, s podSpec, script string) (*v1.Pod, error) {
	loader, err := interpreter(h.Exe)
	if err != nil {
		return nil, err
	}
	libs, err := hostLibraryDirs()
	if err != nil {
		return nil, err
	}
	need := append([]string{h.Exe, loader, h.BasePrefix, h.BaseExecPrefix, h.Torch}, h.Path...)
	need = append(need, libs...)
	s.hostMounts = map[string]string{}
	for _, p := range need {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		top := "/" + strings.SplitN(strings.TrimPrefix(p, "/"), "/", 2)[0]
		switch top {
		case "/", "/proc", "/sys", "/dev", "/run":
			continue
		}
		s.hostMounts[hostRoot+top] = top
	}
	// The loader's --library-path comes before the libraries' own RUNPATH: the
	// directories those name (PyTorch's, the NVIDIA wheels' next to it, the Python
	// build's) go first, so that the host's loader cache does not shadow them.
	own := []string{filepath.Join(h.Torch, "lib"), filepath.Join(filepath.Dir(h.Exe), "..", "lib")}
	wheels, _ := filepath.Glob(filepath.Join(filepath.Dir(h.Torch), "nvidia", "*", "lib"))
	own = append(own, wheels...)
	path := []string{cdiLibraryDir}
	for _, d := range append(own, libs...) {
		d = filepath.Clean(d)
		if r, err := filepath.EvalSymlinks(d); err == nil {
			d = r
		} else {
			continue
		}
		if !slices.Contains(path, hostRoot+d) {
			path = append(path, hostRoot+d)
		}
	}
	home := hostRoot + h.BasePrefix
	if h.BaseExecPrefix != h.BasePrefix {
		home += ":" + hostRoot + h.BaseExecPrefix
	}
	var pypath []string
	for _, p := range h.Path {
		pypath = append(pypath, hostRoot+p)
	}
	s.command = []string{hostRoot + loader, "--library-path", strings.Join(path, ":"), hostRoot + h.Exe, "-c", script}
	s.env = append(s.env, v1.EnvVar{Name: "PYTHONHOME", Value: home}, v1.EnvVar{Name: "PYTHONPATH", Value: strings.Join(pypath, ":")},
		v1.EnvVar{Name: "PYTHONNOUSERSITE", Value: "1"}, v1.EnvVar{Name: "PYTHONDONTWRITEBYTECODE", Value: "1"},
		v1.EnvVar{Name: "PYTHONUNBUFFERED", Value: "1"})
	return n.pod(s), nil
}

// torchScript trains a growing MLP (2048-wide layers added one at a time, Adam, a few
// steps each: about 68 MiB more per layer) until PyTorch raises OutOfMemoryError, and
// prints what it reached (after the probe's context line: the hook preloaded, the
// limits file there): the total and free memory CUDA reports (the hook's limit),
// PyTorch's peak reserved memory, the most the container held (total - free, as the
// hook counts it) and the file libcuda.so.1 was loaded from.
const torchScript = `
import os
# As the probe says it: whether the binding gave the container its hook and limits.
print("tessera-probe context preload=%s limits=%s" % (
    "yes" if os.path.exists("/etc/ld.so.preload") else "no",
    "yes" if os.path.exists("/run/tessera/limits") else "no"), flush=True)
import torch
MIB = 1 << 20
def mapped(name):
    with open("/proc/self/maps") as f:
        for line in f:
            if name in line:
                return line.split()[-1]
    return "-"
free0, total = torch.cuda.mem_get_info()
print("tessera-probe torch-start version=%s device=%s total_mib=%d free_mib=%d" % (
    torch.__version__, torch.cuda.get_device_name(0).replace(" ", "_"), total // MIB, free0 // MIB), flush=True)
width, layers, steps, stop = 2048, [], 0, "none"
peak_used = total - free0
try:
    while layers.__len__() < 1000:
        layers.append(torch.nn.Linear(width, width, device="cuda"))
        model = torch.nn.Sequential(*layers)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        for _ in range(3):
            x = torch.randn(512, width, device="cuda")
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
        torch.cuda.synchronize()
        free, _ = torch.cuda.mem_get_info()
        peak_used = max(peak_used, total - free)
except torch.cuda.OutOfMemoryError:
    stop = "oom"
free, _ = torch.cuda.mem_get_info()
peak_used = max(peak_used, total - free)
print("tessera-probe torch total_mib=%d context_mib=%d peak_reserved_mib=%d peak_used_mib=%d layers=%d steps=%d stop=%s driver=%s" % (
    total // MIB, (total - free0) // MIB, torch.cuda.max_memory_reserved() // MIB, peak_used // MIB,
    len(layers), steps, stop, mapped("libcuda.so")), flush=True)
`

// A pod asking gpu-memory: 4096 runs a PyTorch training loop (PyTorch and Python
// mounted from the host, the driver through CDI) that grows its model until PyTorch's
// OutOfMemoryError, and reaches within two 256 MiB chunks of its limit without
// passing it. Only on a GPU (the fake driver is not enough for PyTorch's runtime).
func testTorchLimit(n *node) {
	if !n.gpu {
		n.t.Skip("PyTorch needs a real GPU (TESSERA_NODE_GPU=1)")
	}
	h, err := findHostPython()
	if err != nil {
		n.t.Skipf("no Python with PyTorch on this machine: %v", err)
	}
	ctx := context.Background()
	p, err := n.hostPythonPod(h, podSpec{name: "torch-4096", gpus: 1, memMiB: 4096}, torchScript)
	if err != nil {
		n.t.Fatalf("the host's Python %s: %v", h.Exe, err)
	}
	n.t.Logf("host Python %s, PyTorch %s in %s; pod command %q, mounts %v", h.Exe, h.Version, h.Torch, p.Spec.Containers[0].Command[:4], p.Spec.Volumes)
	p = n.waitPhase(ctx, n.create(ctx, p).Name, 4*time.Minute, v1.PodSucceeded, v1.PodFailed)
	lines := n.probeLines(p)
	res, ok := find(lines, "torch")
	if p.Status.Phase != v1.PodSucceeded || !ok {
		n.t.Fatalf("pod %s: %s; it printed %v (its log is in %s)", p.Name, p.Status.Phase, lines, filepath.Join(n.dir, "pod-logs"))
	}
	n.requireBound(p)
	total, ctxMiB := res.int(n.t, "total_mib"), res.int(n.t, "context_mib")
	reserved, used := res.int(n.t, "peak_reserved_mib"), res.int(n.t, "peak_used_mib")
	n.t.Logf("PyTorch under 4096 MiB: total %d MiB, context %d, peak reserved %d, peak held %d MiB, %s layers, %s steps, stopped by %s; driver %s",
		total, ctxMiB, reserved, used, res.fields["layers"], res.fields["steps"], res.fields["stop"], res.fields["driver"])
	if total != 4096 {
		n.t.Errorf("torch.cuda.mem_get_info total %d MiB, want 4096", total)
	}
	if res.fields["stop"] != "oom" {
		n.t.Errorf("the training loop stopped by %q, want PyTorch's OutOfMemoryError", res.fields["stop"])
	}
	if used > 4096 || reserved+ctxMiB > 4096 {
		n.t.Errorf("past the limit: peak held %d MiB, peak reserved %d + context %d MiB, limit 4096", used, reserved, ctxMiB)
	}
	if used < 4096-2*256 {
		n.t.Errorf("peak held %d MiB: want within two 256 MiB chunks of the 4096 MiB limit", used)
	}
	if !strings.HasPrefix(res.fields["driver"], cdiLibraryDir+"/") {
		n.t.Errorf("libcuda loaded from %q, want the CDI spec's %s", res.fields["driver"], cdiLibraryDir)
	}
}

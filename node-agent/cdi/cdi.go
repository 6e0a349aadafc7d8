// SPDX-License-Identifier: Apache-2.0

// Package cdi writes the node's Container Device Interface (CDI) spec for its GPUs, so
// that the container runtime gives a Tessera container its GPUs' device nodes and the
// NVIDIA driver's user-space files (libcuda.so.1, libnvidia-ml.so.1, nvidia-smi, ...)
// whatever the container's image holds and whichever runtime handler the pod uses.
//
// Discovery is NVIDIA's own (nvidia-container-toolkit's pkg/nvcdi, the library behind
// `nvidia-ctk cdi generate` and the GPU Operator): it asks NVML for the driver version
// and the devices, and finds the driver's files under a configurable driver root. The
// spec is written with the CDI library's cache, which validates it and replaces the
// file atomically.
//
// Devices are named by UUID under Tessera's own kind (tessera.dev/gpu by default), so
// a container bound to GPU-x gets exactly "tessera.dev/gpu=GPU-x", and a MIG instance
// "tessera.dev/gpu=MIG-y". The kind differs from the toolkit's nvidia.com/gpu, so the
// two specs never claim the same device name on a node that has both.
//
// The toolkit's spec relies on its OCI hook (nvidia-cdi-hook) to update the
// container's dynamic-loader cache and create the libraries' soname links. Where that
// hook is installed the spec uses it, as the toolkit would. Where it is not, the spec
// is rewritten to need no hook: every driver library is mounted, under its file name
// and under its soname, into one directory (ContainerLibraryDir), which the loader is
// then told about (see LibraryDir).
package cdi

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"github.com/go-logr/logr"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/node-agent/gpu"
)

const (
	// DefaultSpecDir is the CDI directory containerd (2.x) and CRI-O read by default
	// for specs generated at run time.
	DefaultSpecDir = "/var/run/cdi"
	// DefaultKind is the vendor/class of Tessera's CDI devices.
	DefaultKind = "tessera.dev/gpu"
	// ContainerLibraryDir is where the driver's libraries are mounted in a container
	// when the spec uses no hook. It is the directory NVIDIA's CUDA images (and those
	// built on them: PyTorch, TensorFlow, NGC) already put on LD_LIBRARY_PATH.
	ContainerLibraryDir = "/usr/local/nvidia/lib64"
	// HookAuto and HookNone are the special values of Config.Hook.
	HookAuto = "auto"
	HookNone = "none"
)

// hookCandidates are where nvidia-cdi-hook is installed: by the toolkit's packages and
// by the GPU Operator's toolkit container.
var hookCandidates = []string{"/usr/bin/nvidia-cdi-hook", "/usr/local/nvidia/toolkit/nvidia-cdi-hook"}

// Config configures a Generator.
type Config struct {
	// SpecDir is the directory the spec is written to.
	SpecDir string
	// Kind is the devices' vendor/class (DefaultKind).
	Kind string
	// DriverRoot is where the agent sees the root filesystem holding the driver's
	// libraries and binaries ("/" on a host install; the host's root as mounted into
	// the agent's container otherwise).
	DriverRoot string
	// HostDriverRoot is the same directory as the runtime on the host sees it ("/"
	// by default): paths in the spec are rewritten from DriverRoot to it.
	HostDriverRoot string
	// DevRoot is where the agent sees the directory holding dev/nvidia*; DriverRoot
	// when empty. HostDevRoot is its path on the host ("/" by default).
	DevRoot, HostDevRoot string
	// LibrarySearchPaths, when set, are the only directories (absolute paths as the
	// agent sees them) searched for the driver's libraries, for drivers installed
	// outside the loader's cache (/usr/local/nvidia/lib64 on some clouds).
	LibrarySearchPaths []string
	// Hook is the host path of nvidia-cdi-hook, HookAuto to use it where it is
	// installed (looked for under DriverRoot), or HookNone to never use it.
	Hook string
	// NVML is the NVML library to query; nil: libnvidia-ml.so.1 is loaded from the
	// driver root.
	NVML nvml.Interface
	Log  logr.Logger
}

// Spec says what the last written spec holds.
type Spec struct {
	// Path is the spec file.
	Path string
	// Kind is the devices' vendor/class.
	Kind string
	// Devices are the device names (GPU and MIG UUIDs), sorted.
	Devices []string
	// Libraries are the container paths of the driver libraries mounted.
	Libraries []string
	// DeviceNodes are the container paths of every device node in the spec.
	DeviceNodes []string
	// Hook is the nvidia-cdi-hook the spec calls; empty when it calls none.
	Hook string
	// LibraryDir is ContainerLibraryDir when the spec uses no hook, else empty.
	LibraryDir string
	// Missing are devices of the agent's list that the spec has none for (a GPU the
	// driver's discovery did not find); a container granted one is refused. A GPU
	// in MIG mode is not missing: only its instances are devices.
	Missing []string `json:",omitempty"`
}

// Generator writes the node's spec and names its devices.
type Generator struct {
	cfg           Config
	vendor, class string

	mu   sync.Mutex
	last *Spec
	have map[string]bool // device names in the last written spec
	key  string          // the device list the last spec was made from
}

// New checks cfg.
func New(cfg Config) (*Generator, error) {
	if cfg.SpecDir == "" || !filepath.IsAbs(cfg.SpecDir) {
		return nil, fmt.Errorf("cdi: spec directory %q must be an absolute path", cfg.SpecDir)
	}
	if cfg.Kind == "" {
		cfg.Kind = DefaultKind
	}
	vendor, class := parser.ParseQualifier(cfg.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return nil, fmt.Errorf("cdi: kind %q: %w", cfg.Kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return nil, fmt.Errorf("cdi: kind %q: %w", cfg.Kind, err)
	}
	if cfg.DriverRoot == "" {
		cfg.DriverRoot = "/"
	}
	if cfg.HostDriverRoot == "" {
		cfg.HostDriverRoot = "/"
	}
	if cfg.DevRoot == "" {
		cfg.DevRoot = cfg.DriverRoot
	}
	if cfg.HostDevRoot == "" {
		cfg.HostDevRoot = cfg.HostDriverRoot
	}
	for _, p := range []string{cfg.DriverRoot, cfg.HostDriverRoot, cfg.DevRoot, cfg.HostDevRoot} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("cdi: driver and device roots must be absolute paths, not %q", p)
		}
	}
	for _, p := range cfg.LibrarySearchPaths {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("cdi: library search path %q must be absolute", p)
		}
	}
	switch {
	case cfg.Hook == "":
		cfg.Hook = HookAuto
	case cfg.Hook == HookAuto, cfg.Hook == HookNone, filepath.IsAbs(cfg.Hook):
	default:
		return nil, fmt.Errorf("cdi: hook %q must be %q, %q or an absolute path", cfg.Hook, HookAuto, HookNone)
	}
	return &Generator{cfg: cfg, vendor: vendor, class: class}, nil
}

// Kind is the devices' vendor/class.
func (g *Generator) Kind() string { return g.vendor + "/" + g.class }

// SpecName is the spec's file name without its extension.
func (g *Generator) SpecName() string { return cdiapi.GenerateSpecName(g.vendor, g.class) }

// QualifiedName is the fully qualified CDI name of a device of this kind.
func (g *Generator) QualifiedName(uuid string) string {
	return parser.QualifiedName(g.vendor, g.class, uuid)
}

// hook resolves Config.Hook.
func (g *Generator) hook() string {
	switch g.cfg.Hook {
	case HookNone:
		return ""
	case HookAuto:
		for _, c := range hookCandidates {
			if st, err := os.Stat(filepath.Join(g.cfg.DriverRoot, c)); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return c
			}
		}
		return ""
	}
	return g.cfg.Hook
}

// deviceKey identifies a device list: a spec is regenerated when it changes.
func deviceKey(devs []gpu.Device) string {
	var keys []string
	for _, d := range devs {
		k := fmt.Sprintf("%s/%d/%s", d.UUID, d.Minor, d.ParentUUID)
		if d.MIG != nil {
			k += fmt.Sprintf("/%d/%d", d.MIG.GPUInstance, d.MIG.ComputeInstance)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

// Sync writes the spec when the node's devices differ from those the last spec was
// made from (or no spec was written yet). It reports whether it wrote one.
func (g *Generator) Sync(devs []gpu.Device) (bool, *Spec, error) {
	g.mu.Lock()
	same := g.last != nil && g.key == deviceKey(devs)
	last := g.last
	g.mu.Unlock()
	if same {
		return false, last, nil
	}
	s, err := g.Generate(devs)
	return err == nil, s, err
}

// Generate discovers the driver and the devices, writes the spec and returns what it
// holds. devs is the agent's own device list; those the discovery has no device for
// are listed in Spec.Missing (DeviceNames refuses them).
func (g *Generator) Generate(devs []gpu.Device) (*Spec, error) {
	raw, hook, err := g.build()
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, d := range raw.Devices {
		have[d.Name] = true
	}
	parents := map[string]bool{}
	for _, d := range devs {
		if d.ParentUUID != "" {
			parents[d.ParentUUID] = true
		}
	}
	var missing []string
	for _, d := range devs {
		switch {
		case d.ParentUUID != "" && d.MIG == nil: // a MIG instance without IDs is never bound
		case parents[d.UUID] && !have[d.UUID]: // in MIG mode: its instances are the devices
		case !have[d.UUID]:
			missing = append(missing, d.UUID)
		}
	}
	if err := os.MkdirAll(g.cfg.SpecDir, 0o755); err != nil {
		return nil, fmt.Errorf("cdi: spec directory: %w", err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(g.cfg.SpecDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("cdi: %w", err)
	}
	// WriteSpec validates the spec (names, edits, version) and replaces the file
	// atomically, so a runtime never reads half a spec.
	name := g.SpecName() + ".yaml"
	if err := cache.WriteSpec(raw, name); err != nil {
		return nil, fmt.Errorf("cdi: writing the spec: %w", err)
	}
	s := summarize(raw, filepath.Join(g.cfg.SpecDir, name), g.Kind(), hook)
	s.Missing = missing
	g.mu.Lock()
	g.last, g.have, g.key = s, have, deviceKey(devs)
	g.mu.Unlock()
	return s, nil
}

// build runs NVIDIA's discovery and returns the spec for this node. A panic in the
// discovery (an NVML answer it did not expect) is returned as an error: the agent
// keeps running and binds no container until a spec is written.
func (g *Generator) build() (raw *specs.Spec, hook string, err error) {
	defer func() {
		if r := recover(); r != nil {
			raw, hook, err = nil, "", fmt.Errorf("cdi: NVIDIA discovery failed: %v", r)
		}
	}()
	namer, err := nvcdi.NewDeviceNamer(nvcdi.DeviceNameStrategyUUID)
	if err != nil {
		return nil, "", err
	}
	hook = g.hook()
	opts := []nvcdi.Option{
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithVendor(g.vendor), nvcdi.WithClass(g.class),
		nvcdi.WithDeviceNamers(namer),
		nvcdi.WithDriverRoot(g.cfg.DriverRoot), nvcdi.WithDevRoot(g.cfg.DevRoot),
		nvcdi.WithLogger(logger{g.cfg.Log}),
	}
	if len(g.cfg.LibrarySearchPaths) > 0 {
		opts = append(opts, nvcdi.WithLibrarySearchPaths(g.cfg.LibrarySearchPaths))
	}
	if g.cfg.NVML != nil {
		opts = append(opts, nvcdi.WithNvmlLib(g.cfg.NVML))
	}
	if hook != "" {
		opts = append(opts, nvcdi.WithNVIDIACDIHookPath(hook))
	} else {
		opts = append(opts, nvcdi.WithDisabledHooks(nvcdi.AllHooks))
	}
	lib, err := nvcdi.New(opts...)
	if err != nil {
		return nil, "", fmt.Errorf("cdi: NVIDIA discovery: %w", err)
	}
	sp, err := lib.GetSpec()
	if err != nil {
		return nil, "", fmt.Errorf("cdi: NVIDIA discovery: %w", err)
	}
	raw = sp.Raw()
	if raw == nil {
		return nil, "", errors.New("cdi: NVIDIA discovery returned no spec")
	}
	markCharDevices(raw)
	if hook == "" {
		if err := g.hooklessLibraries(raw); err != nil {
			return nil, "", err
		}
	}
	if g.cfg.DriverRoot != g.cfg.HostDriverRoot || g.cfg.DevRoot != g.cfg.HostDevRoot {
		t := root.NewDriverTransformer(
			root.WithDriverRoot(g.cfg.DriverRoot), root.WithTargetDriverRoot(g.cfg.HostDriverRoot),
			root.WithDevRoot(g.cfg.DevRoot), root.WithTargetDevRoot(g.cfg.HostDevRoot))
		if err := t.Transform(raw); err != nil {
			return nil, "", fmt.Errorf("cdi: rewriting the driver root: %w", err)
		}
	}
	return raw, hook, nil
}

// markCharDevices states the type of every device node NVIDIA's discovery gives with
// its numbers: its locator takes character devices only. A fully specified node needs
// no stat of the host path where the spec is applied (the agent resolving devices for
// a runtime that does not, in a container whose /dev may differ from the host's).
func markCharDevices(raw *specs.Spec) {
	mark := func(e *specs.ContainerEdits) {
		for _, n := range e.DeviceNodes {
			if n.Type == "" && n.Major != 0 {
				n.Type = "c"
			}
		}
	}
	mark(&raw.ContainerEdits)
	for i := range raw.Devices {
		mark(&raw.Devices[i].ContainerEdits)
	}
}

// hooklessLibraries moves every driver library mount of the common edits to
// ContainerLibraryDir and adds a mount under its soname, which the toolkit's hook
// would otherwise create as a link (ldconfig makes soname links; without it
// "libcuda.so.1" would not exist, only "libcuda.so.580.95.05").
func (g *Generator) hooklessLibraries(raw *specs.Spec) error {
	var out []*specs.Mount
	taken := map[string]bool{}
	add := func(m *specs.Mount) {
		if !taken[m.ContainerPath] {
			taken[m.ContainerPath] = true
			out = append(out, m)
		}
	}
	for _, m := range raw.ContainerEdits.Mounts {
		if !isLibrary(m.ContainerPath) {
			add(m)
			continue
		}
		base := filepath.Base(m.ContainerPath)
		mm := *m
		mm.ContainerPath = filepath.Join(ContainerLibraryDir, base)
		add(&mm)
		soname, err := readSoname(m.HostPath)
		if err != nil {
			return fmt.Errorf("cdi: driver library %s: %w", m.HostPath, err)
		}
		if soname != "" && soname != base && !strings.Contains(soname, "/") {
			alias := *m
			alias.ContainerPath = filepath.Join(ContainerLibraryDir, soname)
			add(&alias)
		}
		// The link-time names of the two libraries programs link against while they
		// run (Triton's and Numba's launchers are built with -lcuda): the toolkit's
		// hook makes these links too.
		if stem, _, ok := strings.Cut(base, ".so."); ok && linkNames[stem] {
			dev := *m
			dev.ContainerPath = filepath.Join(ContainerLibraryDir, stem+".so")
			add(&dev)
		}
	}
	raw.ContainerEdits.Mounts = out
	// The toolkit's CUDA-compat hook reads it; it names where libcuda is.
	for i, e := range raw.ContainerEdits.Env {
		if strings.HasPrefix(e, "NVIDIA_CTK_LIBCUDA_DIR=") {
			raw.ContainerEdits.Env[i] = "NVIDIA_CTK_LIBCUDA_DIR=" + ContainerLibraryDir
		}
	}
	return nil
}

// linkNames are the libraries that get a link-time name (lib<x>.so) without the hook.
var linkNames = map[string]bool{"libcuda": true, "libnvidia-ml": true}

// isLibrary says whether a path names a shared library (lib*.so or lib*.so.*).
func isLibrary(p string) bool {
	b := filepath.Base(p)
	return strings.HasPrefix(b, "lib") && (strings.HasSuffix(b, ".so") || strings.Contains(b, ".so."))
}

// readSoname returns an ELF shared object's DT_SONAME ("" when it has none).
func readSoname(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil {
		return "", err
	}
	if len(names) == 0 {
		return "", nil
	}
	return names[0], nil
}

func summarize(raw *specs.Spec, path, kind, hook string) *Spec {
	s := &Spec{Path: path, Kind: kind, Hook: hook}
	if hook == "" {
		s.LibraryDir = ContainerLibraryDir
	}
	nodes := map[string]bool{}
	addNodes := func(e *specs.ContainerEdits) {
		for _, n := range e.DeviceNodes {
			nodes[n.Path] = true
		}
	}
	for i := range raw.Devices {
		s.Devices = append(s.Devices, raw.Devices[i].Name)
		addNodes(&raw.Devices[i].ContainerEdits)
	}
	addNodes(&raw.ContainerEdits)
	for _, m := range raw.ContainerEdits.Mounts {
		if isLibrary(m.ContainerPath) {
			s.Libraries = append(s.Libraries, m.ContainerPath)
		}
	}
	for n := range nodes {
		s.DeviceNodes = append(s.DeviceNodes, n)
	}
	sort.Strings(s.Devices)
	sort.Strings(s.Libraries)
	sort.Strings(s.DeviceNodes)
	return s
}

// Last returns what the last written spec holds; nil before the first.
func (g *Generator) Last() *Spec {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

// LibraryDir is the container directory that holds the driver's libraries when the
// spec uses no hook (the binding adds it to LD_LIBRARY_PATH); empty otherwise.
func (g *Generator) LibraryDir() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil {
		return ""
	}
	return g.last.LibraryDir
}

// DeviceNames returns the fully qualified CDI names of these GPUs or MIG instances,
// in order. It fails for a UUID the written spec has no device for (no spec yet, or a
// device that appeared after it), so that a container is never started without the
// GPUs it was granted.
func (g *Generator) DeviceNames(uuids []string) ([]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil {
		return nil, fmt.Errorf("no CDI spec for the node's GPUs has been written to %s yet", g.cfg.SpecDir)
	}
	out := make([]string, 0, len(uuids))
	for _, u := range uuids {
		if !g.have[u] {
			return nil, fmt.Errorf("the node's CDI spec %s has no device %s", g.last.Path, u)
		}
		name := g.QualifiedName(u)
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out, nil
}

// Resolve applies the named CDI devices to an empty container spec exactly as a
// runtime does (the CDI library's own injection, from the spec files in the spec
// directory), for runtimes that do not resolve CDI devices themselves: the result's
// device nodes, mounts, environment and hooks are what the runtime must add.
func (g *Generator) Resolve(names []string) (*oci.Spec, error) {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(g.cfg.SpecDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("cdi: %w", err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, names...); err != nil {
		return nil, fmt.Errorf("cdi: resolving %s: %w", strings.Join(names, ", "), err)
	}
	return spec, nil
}

// logger sends the NVIDIA library's log lines to the agent's logger.
type logger struct{ log logr.Logger }

func (l logger) Debugf(f string, a ...any) { l.log.V(2).Info(fmt.Sprintf(f, a...)) }
func (l logger) Tracef(f string, a ...any) { l.log.V(3).Info(fmt.Sprintf(f, a...)) }
func (l logger) Infof(f string, a ...any)  { l.log.V(1).Info(fmt.Sprintf(f, a...)) }
func (l logger) Warningf(f string, a ...any) {
	l.log.V(1).Info(fmt.Sprintf(f, a...), "level", "warning")
}
func (l logger) Errorf(f string, a ...any) { l.log.Error(nil, fmt.Sprintf(f, a...)) }

// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// The limits file tells the CUDA hook inside one container what it may use. The node
// agent writes it on the host, in a directory keyed by the container's cgroup, and
// bind-mounts that directory read-only into the container at ContainerLimitsDir. The
// hook reads ContainerLimitsPath once per process; a tenant cannot edit it (read-only
// mount) and cannot make the hook ignore it (it takes precedence over everything else).
//
// The format is line-oriented text rather than JSON because a C reader inside every
// CUDA process must parse it with no dependencies, and a grammar this small is one that
// two implementations can agree on exactly. api/testdata/limits holds the vectors that
// both readers are tested against. The grammar:
//
//	file     = { line "\n" }            every line, the last one too, ends in "\n"
//	line     = comment | "" | record    only printable ASCII (0x20-0x7e)
//	comment  = "#" { any printable }
//	records, in this order, fields separated by exactly one space:
//	  version 1
//	  cgroup <path>                     absolute, at most 4096 bytes
//	  context-mib <n>                   0..65536
//	  region <directory>                optional, at most once, before the gpu lines
//	  charge kernel                     optional, at most once, after any region line,
//	                                    before the gpu lines
//	  gpu <uuid> <memory-mib> <cores> <phase>   1 to 64 lines, one per GPU
//	  mps <percent> <pipe-directory>    optional, at most once, after the gpu lines
//	  work-conserving                   optional, at most once, after the gpu lines;
//	                                    not with an mps line
//
// Numbers are decimal with no sign and no leading zeros. A uuid is 1-128 characters
// of [A-Za-z0-9-]. The gpu lines are in the order the container sees the GPUs (CUDA
// device 0 first). cores is the compute share in percent (0: not enforced); phase is
// where in each pacing period the container's share starts, in percent, so that the
// containers sharing one GPU can be given windows that do not overlap (cores+phase <=
// 100). The hook reads at most MaxLimitsBytes.
//
// An mps line says that the container is an MPS client (docs/node-agent.md, "MPS"):
// percent (1..100) is its share of each GPU's SMs, and pipe-directory (absolute,
// printable ASCII without spaces, at most MaxMPSPipeDirBytes) is where its GPU's MPS
// pipe directory is mounted. The hook then sets the MPS client's environment from this
// line before the driver starts, whatever the tenant's environment says (a lower
// percentage of the tenant's own stands), so the share cannot be talked up. MPS divides
// the SMs, so with an mps line every gpu line has cores 0: the hook does not also pace.
// A hook that predates the mps line rejects the file, and with it CUDA: an MPS client
// never runs unlimited under an older hook.
//
// A region line names the directory (absolute, printable ASCII without spaces, at
// most MaxRegionDirBytes) in which the hook keeps the container's accounting region,
// instead of /dev/shm: a directory of the container's own, which no other container
// can reach (an MPS client's /dev/shm is its GPU's MPS server's, shared by every
// client). A hook that predates the line rejects the file, and with it CUDA.
//
// A charge line chooses how the hook's pacer charges a kernel launch against the
// container's cores (docs/cuda-hook.md, "Charge models"): without it, each launch is
// charged its class's estimate (the class estimator); with "charge kernel", each
// launch is charged its own kernel's estimate times its class's gain. The node agent
// writes it from its --pacing-charge flag (kernel by default), for every container of
// the node, so that a tenant cannot choose, and tessera-run from its own. A file
// without it keeps the class model, which is what it meant to the hooks before the
// line, so that a file an older agent wrote paces as it did; a hook that predates the
// line rejects a file that has it, and with it CUDA.
//
// A work-conserving line lets the container's kernels use the GPU's time beyond its
// cores while no other context on the GPU has work, and holds them to cores again as
// soon as one does (docs/cuda-hook.md, "Work-conserving"). A hook that predates it
// rejects the file as well.

// The charge models of the hook's pacer: the node agent's --pacing-charge, and the
// limits file's charge line (ContainerLimits.ChargeKernel) for PacingChargeKernel.
const (
	PacingChargeClass  = "class"
	PacingChargeKernel = "kernel"
)

// ParsePacingCharge reads a charge model's name (a --pacing-charge value): whether it
// is the kernel model, or an error naming both models for any other name.
func ParsePacingCharge(name string) (kernel bool, err error) {
	switch name {
	case PacingChargeKernel:
		return true, nil
	case PacingChargeClass:
		return false, nil
	}
	return false, fmt.Errorf("%q: want %s (each launch charged its class's estimate) or %s (its own kernel's)",
		name, PacingChargeClass, PacingChargeKernel)
}

// LimitsVersion is the version of the limits file this package writes and reads.
const LimitsVersion = 1

// ContainerLimitsDir is where the node agent mounts the container's limits directory,
// read-only, inside the container. The CUDA hook's TESSERA_LIMITS_DIR is the same path.
const ContainerLimitsDir = "/run/tessera"

// LimitsFileName is the name of the limits file inside the limits directory.
const LimitsFileName = "limits"

// ContainerLimitsPath is the limits file as the CUDA hook sees it.
const ContainerLimitsPath = ContainerLimitsDir + "/" + LimitsFileName

// DefaultHostLimitsRoot is the host directory under which the node agent keeps one
// limits directory per container (HostLimitsDir). It lives on tmpfs: limits belong to
// running containers, which do not survive a reboot either, and they do survive an
// agent restart.
const DefaultHostLimitsRoot = "/run/tessera/containers"

// MaxLimitsBytes bounds the limits file.
const MaxLimitsBytes = 64 << 10

// MaxCgroupPathBytes bounds the cgroup field (PATH_MAX).
const MaxCgroupPathBytes = 4096

// MaxMPSPipeDirBytes bounds the mps line's pipe directory: MPS clients connect to Unix
// sockets in it, whose paths must fit sockaddr_un's 108 bytes with the socket's name.
const MaxMPSPipeDirBytes = 80

// MaxRegionDirBytes bounds the region line's directory: the hook's path of the
// region in it must fit its buffer.
const MaxRegionDirBytes = 128

// ContainerRegionDir is where the node agent mounts the container's own directory for
// its accounting region (the region line names it).
const ContainerRegionDir = "/run/tessera-region"

// RegionDirBytes is the size of the file system the node agent mounts at
// ContainerRegionDir. It holds one region, about 144 KiB in the hook's layout 4; a
// write past a tmpfs's size is a SIGBUS in the process that mapped the region, so the
// hook's tests check that the region fits with room to spare.
const RegionDirBytes = 1 << 20

// MaxContextMiB bounds the per-context charge.
const MaxContextMiB = 64 << 10

// DefaultContextMiB is what the hook charges against a GPU's memory limit for each
// process's CUDA context on that GPU: the driver takes this memory outside any
// allocation call, so without the charge N processes would overrun their grant by N
// contexts. 526 MiB was measured for a CUDA 13.0 context on an H200 (driver 580);
// the default rounds up with a margin. A node agent that measures its own GPUs
// should set ContainerLimits.ContextMiB instead.
const DefaultContextMiB = 576

// MPSContextMiB is the per-process context charge of an MPS client at threadPercent
// (its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), given the charge contextMiB of a plain
// context: 10 % of it plus 90 % of it scaled by the share, rounded up. An MPS client's
// context holds a fixed part and a part per SM it may use, and the client's SMs
// follow its share: on an H200 (driver 580, 132 SMs) a client's context took 58, 72,
// 122, 166, 274, 390 and 516 MiB at 5, 10, 20, 30, 50, 75 and 100 % (8, 12, 26, 38,
// 66, 98 and 132 SMs: 28.5 MiB + 3.69 MiB per SM), against 527 MiB for a plain
// context; with the default 576 MiB this charges 84, 110, 162, 214, 317, 447 and 576
// MiB. A percentage outside 1..100 is charged as 100.
func MPSContextMiB(contextMiB int64, threadPercent int) int64 {
	if threadPercent < 1 || threadPercent > 100 {
		threadPercent = 100
	}
	return (contextMiB*(100+9*int64(threadPercent)) + 999) / 1000
}

// PacingPeriodMicros is the length of the compute-pacing period that phase and cores
// are percentages of. It is fixed so that every container on a GPU uses the same
// period, which is what makes their phase windows line up. The CUDA hook's
// TESSERA_PACING_PERIOD_NS is the same value.
const PacingPeriodMicros = 20000

// ContainerLimits is the content of one container's limits file.
type ContainerLimits struct {
	// Cgroup is the container's cgroup path as the node agent saw it (host view); for
	// a DRA claim, shared by its containers, a key naming the claim
	// (/tessera.dev/claims/<uid>). The hook keys the shared accounting region by it,
	// so that every process of the container (or claim) shares one memory limit.
	Cgroup string
	// ContextMiB is charged against each GPU's memory limit per process that creates a
	// CUDA context on that GPU.
	ContextMiB int64
	// RegionDir is the directory, as the container sees it, of its accounting
	// region; "" for the hook's default (/dev/shm).
	RegionDir string
	// ChargeKernel charges each kernel launch its own kernel's estimate (the charge
	// line); false for the class estimator.
	ChargeKernel bool
	// GPUs are the container's GPUs, in the order the container sees them.
	GPUs []GPULimit
	// MPS is set when the container is an MPS client; nil otherwise.
	MPS *MPSLimit
	// WorkConserving lets the container use idle GPU time beyond its cores while no
	// other tenant of the GPU has work. Not with MPS.
	WorkConserving bool
}

// MPSLimit is what an MPS client container may use of its GPUs' MPS servers.
type MPSLimit struct {
	// ThreadPercent is the share of each GPU's SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE),
	// 1..100.
	ThreadPercent int
	// PipeDir is the MPS pipe directory as the container sees it
	// (CUDA_MPS_PIPE_DIRECTORY).
	PipeDir string
}

// GPULimit is what the container may use of one GPU.
type GPULimit struct {
	// UUID is the GPU's (or MIG instance's) UUID, as NVML and CUDA report it.
	UUID string
	// MemoryMiB is the device-memory limit, context charges included.
	MemoryMiB int64
	// Cores is the compute share in percent; 0 means not enforced.
	Cores int
	// Phase is the start of the container's window within each pacing period, in
	// percent of the period; 0 when Cores is 0.
	Phase int
}

// LimitsKey returns the name of a container's directory under the host limits root:
// a hash of its cgroup path, so that any cgroup path maps to one safe file name.
func LimitsKey(cgroupPath string) string {
	sum := sha256.Sum256([]byte(cgroupPath))
	return hex.EncodeToString(sum[:16])
}

// HostLimitsDir returns the host directory that holds the limits file of the container
// in cgroupPath; the node agent mounts it read-only at ContainerLimitsDir.
func HostLimitsDir(root, cgroupPath string) string {
	return path.Join(root, LimitsKey(cgroupPath))
}

// NewContainerLimits builds the limits of one container from the scheduler's grant and
// the container's cgroup path. Phases are left at 0: choosing non-overlapping windows
// needs every container on the GPU, which the caller knows (see PlacePhase).
func NewContainerLimits(c ContainerAssignment, cgroupPath string) (*ContainerLimits, error) {
	l := &ContainerLimits{Cgroup: cgroupPath, ContextMiB: DefaultContextMiB}
	for _, d := range c.Devices {
		l.GPUs = append(l.GPUs, GPULimit{UUID: d.UUID, MemoryMiB: d.MemoryMiB, Cores: d.Cores})
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("container %q: %w", c.Name, err)
	}
	return l, nil
}

// PhaseSpan is the window [Phase, Phase+Cores) of one container on a GPU.
type PhaseSpan struct{ Phase, Cores int }

// PlacePhase returns the lowest phase at which a window of cores percent overlaps none
// of taken, and true. If no gap is wide enough (windows freed by departed containers
// can leave the free time in pieces), it returns the phase whose window overlaps the
// taken ones least (the lowest of those) and false: the overlapping containers then
// meet in each other's windows, where the hook's pacer makes each give up part of
// what spills past its window (docs/cuda-hook.md, Slots), so the less they overlap the
// less they lose.
func PlacePhase(taken []PhaseSpan, cores int) (int, bool) {
	if cores <= 0 {
		return 0, true
	}
	best, bestOverlap := 0, -1
	for start := 0; start+cores <= 100; start++ {
		overlap := 0
		for _, t := range taken {
			if t.Cores <= 0 {
				continue
			}
			lo, hi := max(start, t.Phase), min(start+cores, t.Phase+t.Cores)
			if hi > lo {
				overlap += hi - lo
			}
		}
		if overlap == 0 {
			return start, true
		}
		if bestOverlap < 0 || overlap < bestOverlap {
			best, bestOverlap = start, overlap
		}
	}
	return best, false
}

// Validate checks every rule of the grammar that a ContainerLimits value can break.
func (l *ContainerLimits) Validate() error {
	if l == nil {
		return errors.New("limits: missing")
	}
	if err := checkCgroup(l.Cgroup); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if l.ContextMiB < 0 || l.ContextMiB > MaxContextMiB {
		return fmt.Errorf("limits: context-mib %d out of range 0..%d", l.ContextMiB, MaxContextMiB)
	}
	if l.RegionDir != "" {
		if err := checkRegionDir(l.RegionDir); err != nil {
			return fmt.Errorf("limits: %w", err)
		}
	}
	if len(l.GPUs) == 0 || len(l.GPUs) > MaxGPUsPerContainer {
		return fmt.Errorf("limits: %d gpus, want 1..%d", len(l.GPUs), MaxGPUsPerContainer)
	}
	seen := map[string]bool{}
	for i, g := range l.GPUs {
		p := fmt.Sprintf("limits: gpu %d", i)
		if err := checkLimitsUUID(g.UUID); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if seen[g.UUID] {
			return fmt.Errorf("%s: uuid %q appears twice", p, g.UUID)
		}
		seen[g.UUID] = true
		if g.MemoryMiB < 1 || g.MemoryMiB > MaxMemoryMiB {
			return fmt.Errorf("%s: memory-mib %d out of range 1..%d", p, g.MemoryMiB, MaxMemoryMiB)
		}
		if g.Cores < 0 || g.Cores > 100 {
			return fmt.Errorf("%s: cores %d out of range 0..100", p, g.Cores)
		}
		if g.Phase < 0 || g.Phase > 99 {
			return fmt.Errorf("%s: phase %d out of range 0..99", p, g.Phase)
		}
		if g.Cores == 0 && g.Phase != 0 {
			return fmt.Errorf("%s: phase %d set without cores", p, g.Phase)
		}
		if g.Cores+g.Phase > 100 {
			return fmt.Errorf("%s: cores %d + phase %d exceed the period (100)", p, g.Cores, g.Phase)
		}
		if l.MPS != nil && g.Cores != 0 {
			return fmt.Errorf("%s: cores %d with an mps line (MPS divides the SMs; the hook does not pace)", p, g.Cores)
		}
	}
	if l.MPS != nil {
		if l.MPS.ThreadPercent < 1 || l.MPS.ThreadPercent > 100 {
			return fmt.Errorf("limits: mps: percent %d out of range 1..100", l.MPS.ThreadPercent)
		}
		if err := checkMPSPipeDir(l.MPS.PipeDir); err != nil {
			return fmt.Errorf("limits: mps: %w", err)
		}
		if l.WorkConserving {
			return errors.New("limits: work-conserving with an mps line (MPS divides the SMs; the hook does not pace)")
		}
	}
	return nil
}

func checkRegionDir(d string) error {
	if len(d) > MaxRegionDirBytes {
		return fmt.Errorf("region directory is %d bytes, more than %d", len(d), MaxRegionDirBytes)
	}
	if err := checkCgroup(d); err != nil {
		return fmt.Errorf("region directory: %w", err)
	}
	return nil
}

func checkMPSPipeDir(d string) error {
	if len(d) > MaxMPSPipeDirBytes {
		return fmt.Errorf("pipe directory is %d bytes, more than %d", len(d), MaxMPSPipeDirBytes)
	}
	if err := checkCgroup(d); err != nil {
		return fmt.Errorf("pipe directory: %w", err)
	}
	return nil
}

// CheckCgroupPath returns an error unless p can be the cgroup of a limits file:
// absolute, at most MaxCgroupPathBytes, printable ASCII without spaces. The node
// agent checks the cgroup paths it resolves with it, so that a container whose
// cgroup Tessera cannot key is refused where the cgroup is found.
func CheckCgroupPath(p string) error { return checkCgroup(p) }

func checkCgroup(c string) error {
	if c == "" || c[0] != '/' {
		return fmt.Errorf("cgroup %q must be an absolute path", c)
	}
	if len(c) > MaxCgroupPathBytes {
		return fmt.Errorf("cgroup path is %d bytes, more than %d", len(c), MaxCgroupPathBytes)
	}
	for i := 0; i < len(c); i++ {
		if c[i] <= 0x20 || c[i] > 0x7e {
			return fmt.Errorf("cgroup %q has a byte that is not printable ASCII or is a space", c)
		}
	}
	return nil
}

func checkLimitsUUID(u string) error {
	if u == "" || len(u) > 128 {
		return fmt.Errorf("uuid %q must be 1..128 characters", u)
	}
	for i := 0; i < len(u); i++ {
		c := u[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("uuid %q may hold only letters, digits and '-'", u)
		}
	}
	return nil
}

// limitsHeader is the comment EncodeLimits puts first, for whoever opens the file.
const limitsHeader = "# Tessera container limits: written by the node agent, read by the CUDA hook.\n"

// EncodeLimits validates l and returns the file content, in the canonical form that
// the CUDA hook's reader also prints in its tests.
func EncodeLimits(l *ContainerLimits) ([]byte, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(limitsHeader)
	fmt.Fprintf(&b, "version %d\n", LimitsVersion)
	fmt.Fprintf(&b, "cgroup %s\n", l.Cgroup)
	fmt.Fprintf(&b, "context-mib %d\n", l.ContextMiB)
	if l.RegionDir != "" {
		fmt.Fprintf(&b, "region %s\n", l.RegionDir)
	}
	if l.ChargeKernel {
		b.WriteString("charge kernel\n")
	}
	for _, g := range l.GPUs {
		fmt.Fprintf(&b, "gpu %s %d %d %d\n", g.UUID, g.MemoryMiB, g.Cores, g.Phase)
	}
	if l.MPS != nil {
		fmt.Fprintf(&b, "mps %d %s\n", l.MPS.ThreadPercent, l.MPS.PipeDir)
	}
	if l.WorkConserving {
		b.WriteString("work-conserving\n")
	}
	return b.Bytes(), nil
}

// DecodeLimits parses and validates a limits file. Errors name the line.
func DecodeLimits(data []byte) (*ContainerLimits, error) {
	if len(data) == 0 {
		return nil, errors.New("limits: empty file")
	}
	if len(data) > MaxLimitsBytes {
		return nil, fmt.Errorf("limits: file is %d bytes, more than %d", len(data), MaxLimitsBytes)
	}
	if data[len(data)-1] != '\n' {
		return nil, errors.New("limits: last line does not end in a newline")
	}
	for i, c := range data {
		if c != '\n' && (c < 0x20 || c > 0x7e) {
			return nil, fmt.Errorf("limits: byte %d (0x%02x) is not printable ASCII", i, c)
		}
	}
	const (
		wantVersion = iota
		wantCgroup
		wantContext
		wantGPU
		done
	)
	state := wantVersion
	l := &ContainerLimits{}
	lines := strings.Split(string(data[:len(data)-1]), "\n")
	for n, line := range lines {
		ln := n + 1
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Split(line, " ")
		for _, s := range f {
			if s == "" {
				return nil, fmt.Errorf("limits: line %d: fields must be separated by exactly one space", ln)
			}
		}
		switch {
		case state == wantVersion:
			if f[0] != "version" || len(f) != 2 {
				return nil, fmt.Errorf("limits: line %d: want \"version %d\" first", ln, LimitsVersion)
			}
			v, err := limitsNumber(f[1], 1<<20)
			if err != nil {
				return nil, fmt.Errorf("limits: line %d: version: %w", ln, err)
			}
			if v != LimitsVersion {
				return nil, fmt.Errorf("limits: line %d: version %d is not supported (want %d)", ln, v, LimitsVersion)
			}
			state = wantCgroup
		case state == wantCgroup:
			if f[0] != "cgroup" || len(f) != 2 {
				return nil, fmt.Errorf("limits: line %d: want \"cgroup <path>\"", ln)
			}
			if err := checkCgroup(f[1]); err != nil {
				return nil, fmt.Errorf("limits: line %d: %w", ln, err)
			}
			l.Cgroup = f[1]
			state = wantContext
		case state == wantContext:
			if f[0] != "context-mib" || len(f) != 2 {
				return nil, fmt.Errorf("limits: line %d: want \"context-mib <n>\"", ln)
			}
			v, err := limitsNumber(f[1], MaxContextMiB)
			if err != nil {
				return nil, fmt.Errorf("limits: line %d: context-mib: %w", ln, err)
			}
			l.ContextMiB = v
			state = wantGPU
		case state == done:
			return nil, fmt.Errorf("limits: line %d: nothing may follow the mps or work-conserving line", ln)
		case f[0] == "region" && len(l.GPUs) == 0:
			if len(f) != 2 {
				return nil, fmt.Errorf("limits: line %d: want \"region <directory>\"", ln)
			}
			if l.RegionDir != "" {
				return nil, fmt.Errorf("limits: line %d: a second region line", ln)
			}
			if l.ChargeKernel {
				return nil, fmt.Errorf("limits: line %d: the region line must come before the charge line", ln)
			}
			if err := checkRegionDir(f[1]); err != nil {
				return nil, fmt.Errorf("limits: line %d: %w", ln, err)
			}
			l.RegionDir = f[1]
		case f[0] == "charge" && len(l.GPUs) == 0:
			if len(f) != 2 || f[1] != "kernel" {
				return nil, fmt.Errorf("limits: line %d: want \"charge kernel\"", ln)
			}
			if l.ChargeKernel {
				return nil, fmt.Errorf("limits: line %d: a second charge line", ln)
			}
			l.ChargeKernel = true
		case f[0] == "work-conserving" && len(l.GPUs) > 0:
			if len(f) != 1 {
				return nil, fmt.Errorf("limits: line %d: want \"work-conserving\" alone", ln)
			}
			l.WorkConserving = true
			state = done
		case f[0] == "mps" && len(l.GPUs) > 0:
			if len(f) != 3 {
				return nil, fmt.Errorf("limits: line %d: want \"mps <percent> <pipe-directory>\"", ln)
			}
			v, err := limitsNumber(f[1], 100)
			if err != nil {
				return nil, fmt.Errorf("limits: line %d: mps percent: %w", ln, err)
			}
			if v == 0 {
				return nil, fmt.Errorf("limits: line %d: mps percent 0 is not in 1..100", ln)
			}
			if err := checkMPSPipeDir(f[2]); err != nil {
				return nil, fmt.Errorf("limits: line %d: mps: %w", ln, err)
			}
			l.MPS = &MPSLimit{ThreadPercent: int(v), PipeDir: f[2]}
			state = done
		default:
			if f[0] != "gpu" || len(f) != 5 {
				return nil, fmt.Errorf("limits: line %d: want \"gpu <uuid> <memory-mib> <cores> <phase>\" or, last, \"mps <percent> <pipe-directory>\" or \"work-conserving\"", ln)
			}
			if len(l.GPUs) == MaxGPUsPerContainer {
				return nil, fmt.Errorf("limits: line %d: more than %d gpus", ln, MaxGPUsPerContainer)
			}
			g := GPULimit{UUID: f[1]}
			var err error
			if g.MemoryMiB, err = limitsNumber(f[2], MaxMemoryMiB); err != nil {
				return nil, fmt.Errorf("limits: line %d: memory-mib: %w", ln, err)
			}
			c, err := limitsNumber(f[3], 100)
			if err != nil {
				return nil, fmt.Errorf("limits: line %d: cores: %w", ln, err)
			}
			p, err := limitsNumber(f[4], 99)
			if err != nil {
				return nil, fmt.Errorf("limits: line %d: phase: %w", ln, err)
			}
			g.Cores, g.Phase = int(c), int(p)
			l.GPUs = append(l.GPUs, g)
		}
	}
	if state < wantGPU || len(l.GPUs) == 0 {
		return nil, errors.New("limits: incomplete: want version, cgroup, context-mib and at least one gpu line")
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return l, nil
}

// limitsNumber parses a decimal with no sign and no leading zeros, at most max.
func limitsNumber(s string, max int64) (int64, error) {
	if s == "" || len(s) > 10 {
		return 0, fmt.Errorf("%q is not a number of at most 10 digits", s)
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a decimal number", s)
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, err)
	}
	if v > max {
		return 0, fmt.Errorf("%d is more than %d", v, max)
	}
	return v, nil
}

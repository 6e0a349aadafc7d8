// SPDX-License-Identifier: Apache-2.0

// Command tessera-run runs a program under GPU limits without Kubernetes: it writes a
// limits file (the same format the node agent writes) and starts the program with the
// Tessera CUDA hook preloaded.
//
//	tessera-run --gpu 0 --memory 4Gi --cores 30 -- python train.py
//
// The hook accepts limits from TESSERA_LIMITS_FILE only where the administrator allows
// it: /etc/tessera/cuda-hook.conf, owned by root and writable by no one else, must
// contain the line "allow-env-limits yes". Inside a Tessera container the mounted
// limits always win, so this cannot raise a container's limits.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/tessera-dev/tessera/api"
)

// DefaultHook is where the packaged hook is installed.
const DefaultHook = "/usr/lib/tessera/libtessera-cuda.so"

type options struct {
	gpus    []string
	memory  string
	cores   int
	phase   int
	group   string
	context int64
	charge  string
	hook    string
	argv    []string
}

func parse(args []string) (*options, error) {
	fs := flag.NewFlagSet("tessera-run", flag.ContinueOnError)
	o := &options{}
	gpus := fs.String("gpu", "0", "GPUs, comma-separated: NVML indexes or UUIDs, in the order the program sees them")
	fs.StringVar(&o.memory, "memory", "", "memory limit per GPU: MiB, or with a unit (Mi, Gi)")
	fs.IntVar(&o.cores, "cores", 0, "compute share per GPU in percent (0: not limited)")
	fs.IntVar(&o.phase, "phase", 0, "start of the compute window in each pacing period, in percent; give programs sharing a GPU windows that do not overlap")
	fs.StringVar(&o.group, "group", "", "processes started with the same group share one memory limit (default: one limit per tessera-run)")
	fs.Int64Var(&o.context, "context-mib", api.DefaultContextMiB, "MiB charged per CUDA context")
	fs.StringVar(&o.charge, "pacing-charge", api.PacingChargeKernel, "how a kernel launch is charged against --cores: "+
		api.PacingChargeKernel+" (its own kernel's estimate) or "+api.PacingChargeClass+" (its class's), as the node agent's flag")
	fs.StringVar(&o.hook, "hook", DefaultHook, "path of libtessera-cuda.so")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.argv = fs.Args()
	if len(o.argv) == 0 {
		return nil, errors.New("no command given; usage: tessera-run [flags] -- command [args]")
	}
	if o.memory == "" {
		return nil, errors.New("--memory is required")
	}
	if _, err := api.ParsePacingCharge(o.charge); err != nil {
		return nil, fmt.Errorf("--pacing-charge %w", err)
	}
	o.gpus = strings.Split(*gpus, ",")
	return o, nil
}

// parseMiB reads "4096", "4096Mi" or "4Gi".
func parseMiB(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "Gi"):
		mult, s = 1024, strings.TrimSuffix(s, "Gi")
	case strings.HasSuffix(s, "Mi"):
		s = strings.TrimSuffix(s, "Mi")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("--memory %q: want a positive number of MiB, or Mi/Gi", s)
	}
	return n * mult, nil
}

// limitsFor builds the limits; uuidOf turns an NVML index into a UUID.
func limitsFor(o *options, uuidOf func(index string) (string, error)) (*api.ContainerLimits, error) {
	mib, err := parseMiB(o.memory)
	if err != nil {
		return nil, err
	}
	group := o.group
	if group == "" {
		group = strconv.Itoa(os.Getpid())
	}
	l := &api.ContainerLimits{Cgroup: "/tessera-run/" + group, ContextMiB: o.context, ChargeKernel: o.charge == api.PacingChargeKernel}
	for _, g := range o.gpus {
		uuid := g
		if _, err := strconv.Atoi(g); err == nil {
			if uuid, err = uuidOf(g); err != nil {
				return nil, err
			}
		}
		l.GPUs = append(l.GPUs, api.GPULimit{UUID: uuid, MemoryMiB: mib, Cores: o.cores, Phase: o.phase})
	}
	return l, l.Validate()
}

func nvidiaSMIUUID(index string) (string, error) {
	out, err := exec.Command("nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", index).Output()
	if err != nil {
		return "", fmt.Errorf("looking up the UUID of GPU %s with nvidia-smi: %w", index, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func run(args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	l, err := limitsFor(o, nvidiaSMIUUID)
	if err != nil {
		return err
	}
	data, err := api.EncodeLimits(l)
	if err != nil {
		return err
	}
	if _, err := os.Stat(o.hook); err != nil {
		return fmt.Errorf("hook: %w (set --hook)", err)
	}
	f, err := os.CreateTemp("", "tessera-limits-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(0o444); err != nil {
		return err
	}
	f.Close()
	prog, err := exec.LookPath(o.argv[0])
	if err != nil {
		return err
	}
	hook, _ := filepath.Abs(o.hook)
	env := append(os.Environ(), "TESSERA_LIMITS_FILE="+f.Name())
	preload := hook
	if p := os.Getenv("LD_PRELOAD"); p != "" {
		preload += " " + p
	}
	env = append(env, "LD_PRELOAD="+preload)
	// The limits file stays behind in the temporary directory: the program and its
	// children read it when they first use CUDA, which may be any time.
	return syscall.Exec(prog, o.argv, env)
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "tessera-run:", err)
		os.Exit(2)
	}
}

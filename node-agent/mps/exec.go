package mps

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// execEnv carries the GPU's shared-memory directory to the exec helper.
const execEnv = "TESSERA_MPS_EXEC_SHM"

// MPS clients and their server exchange shared memory through /dev/shm, so a client
// must see the same /dev/shm as its server. Each GPU therefore has its own shm
// directory (<root>/<uuid>/shm): its daemon runs in a private mount namespace
// where that directory is /dev/shm, and the binding mounts the same directory at
// /dev/shm in every container bound to the GPU. Tenants of different GPUs, and the
// host, never share it.
//
// The bind mount has to happen in the child between fork and exec, which Go's
// os/exec cannot do; the supervisor therefore starts the daemon through a helper
// program (the node agent's own binary): the supervisor makes the child's mount
// namespace (CLONE_NEWNS), the helper mounts and execs the control program.

// RunExecHelper is called first thing by a program that serves as the exec helper
// (Config.Helper). It returns at once unless the process was started as the helper;
// then it mounts and execs, and never returns.
func RunExecHelper() {
	shm, ok := os.LookupEnv(execEnv)
	if !ok {
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "MPS exec helper: no program to run")
		os.Exit(2)
	}
	if err := syscall.Mount(shm, "/dev/shm", "", syscall.MS_BIND, ""); err != nil {
		fmt.Fprintf(os.Stderr, "MPS exec helper: mounting %s at /dev/shm: %v\n", shm, err)
		os.Exit(2)
	}
	env := make([]string, 0, len(os.Environ()))
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, execEnv+"=") {
			env = append(env, e)
		}
	}
	err := syscall.Exec(os.Args[1], os.Args[1:], env)
	fmt.Fprintf(os.Stderr, "MPS exec helper: exec %s: %v\n", os.Args[1], err)
	os.Exit(2)
}

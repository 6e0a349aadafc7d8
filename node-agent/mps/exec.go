// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// execEnv carries the GPU's shared-memory directory to the exec helper.
const execEnv = "TESSERA_MPS_EXEC_SHM"

// execCgroupEnv carries the host cgroup the helper moves the daemon into
// (Config.Cgroup).
const execCgroupEnv = "TESSERA_MPS_EXEC_CGROUP"

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
	// Before anything else: from here on the thread is in the host's cgroup
	// namespace, and it is the thread that execs.
	runtime.LockOSThread()
	if cg := os.Getenv(execCgroupEnv); cg != "" {
		// A daemon outside the host's cgroup still serves its GPU; it only ends with
		// the agent's container. Serving matters more than outliving a restart, so
		// the helper goes on (the supervisor warned at start, HostCgroupReachable).
		if err := enterHostCgroup(cg); err != nil {
			fmt.Fprintf(os.Stderr, "MPS exec helper: cannot move into cgroup %s (%v); the daemon stays in the node agent's cgroup and ends with the agent's container\n", cg, err)
		}
	}
	if err := syscall.Mount(shm, "/dev/shm", "", syscall.MS_BIND, ""); err != nil {
		fmt.Fprintf(os.Stderr, "MPS exec helper: mounting %s at /dev/shm: %v\n", shm, err)
		os.Exit(2)
	}
	env := make([]string, 0, len(os.Environ()))
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, execEnv+"=") && !strings.HasPrefix(e, execCgroupEnv+"=") {
			env = append(env, e)
		}
	}
	err := syscall.Exec(os.Args[1], os.Args[1:], env)
	fmt.Fprintf(os.Stderr, "MPS exec helper: exec %s: %v\n", os.Args[1], err)
	os.Exit(2)
}

// HostCgroupReachable says whether this process can join the host's cgroup
// namespace, which the exec helper needs to move a daemon out of the agent's
// cgroup (Config.Cgroup). It fails where the agent does not share the host's PID
// namespace or lacks the privilege to enter PID 1's namespaces.
func HostCgroupReachable() error {
	ns, err := os.Open("/proc/1/ns/cgroup")
	if err != nil {
		return err
	}
	return ns.Close()
}

// enterHostCgroup moves the process into cg (a path below the host's cgroup v2
// root), made if missing. A container's cgroup namespace hides every cgroup outside
// its own, so the helper joins the cgroup namespace of PID 1 (the host's init, where
// the agent shares the host's PID namespace) and mounts that hierarchy in its private
// mount namespace, which the exec leaves behind unused.
func enterHostCgroup(cg string) error {
	ns, err := os.Open("/proc/1/ns/cgroup")
	if err != nil {
		return err
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("joining the host's cgroup namespace: %w", err)
	}
	dir, err := os.MkdirTemp("", "tessera-mps-cgroup-")
	if err != nil {
		return err
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting the host's cgroup2 hierarchy: %w", err)
	}
	defer func() { _ = unix.Unmount(dir, unix.MNT_DETACH); _ = os.Remove(dir) }()
	target := filepath.Join(dir, filepath.Clean("/"+cg))
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(target, "cgroup.procs"), []byte("0"), 0)
}

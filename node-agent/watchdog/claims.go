// SPDX-License-Identifier: Apache-2.0

package watchdog

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tessera-dev/tessera/node-agent/checkpoint"
)

// Attribution of a DRA claim's processes. A claim is bound when kubelet prepares it,
// before any of its containers exists, so its record names no cgroup (its Cgroup is
// the key its limits file is written under) and a process of its containers is owned
// by no record by cgroup. Every container of the claim has the claim's limits
// directory mounted (read-only, from the claim's CDI device), and a process's mounts
// are the kernel's word, which a tenant without CAP_SYS_ADMIN cannot forge: a process
// that holds GPU memory in no bound container is the claim's when its mount namespace
// shows the claim's limits directory as the source of a mount. A claim's containers
// share its limit, so their memory is summed under the claim.

// claimRecords returns the claim records of recs and the rest.
func claimRecords(recs []checkpoint.Record) (claims, containers []checkpoint.Record) {
	for _, r := range recs {
		if r.Claim {
			claims = append(claims, r)
		} else {
			containers = append(containers, r)
		}
	}
	return claims, containers
}

// claimOf returns the claim whose limits directory is the source of one of pid's
// mounts. In /proc/<pid>/mountinfo a bind mount's source is its fourth field, the
// path within the file system it was taken from: the whole host path where that file
// system is mounted at /, a tail of it otherwise, so the field must be a tail of the
// claim's directory ending in the directory's own name.
func claimOf(procRoot string, pid int, claims []checkpoint.Record) (checkpoint.Record, bool) {
	if len(claims) == 0 {
		return checkpoint.Record{}, false
	}
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "mountinfo"))
	if err != nil {
		return checkpoint.Record{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		root := unescapeMountinfo(fields[3])
		if root == "/" || !strings.HasPrefix(root, "/") {
			continue
		}
		for _, c := range claims {
			dir := filepath.Clean(c.LimitsDir)
			if c.LimitsDir != "" && strings.HasSuffix(dir, root) && filepath.Base(dir) == filepath.Base(root) {
				return c, true
			}
		}
	}
	return checkpoint.Record{}, false
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space, \011, \012,
// \134) in a path field.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// owns reports whether pid is still a process of r's container (of r's claim, for a
// claim's record), checked again right before acting on it: the PID may have been
// reused since the sample.
func (w *Watchdog) owns(r checkpoint.Record, pid int) bool {
	if r.Claim {
		c, ok := claimOf(w.cfg.ProcRoot, pid, []checkpoint.Record{r})
		return ok && c.ContainerID == r.ContainerID
	}
	cg, err := CgroupOf(w.cfg.ProcRoot, pid)
	return err == nil && holds(r.Cgroup, cg)
}

// containerCgroups returns the cgroups a stop of cu ends: the container's own, or for
// a claim the cgroups of the claim's processes on the GPU that still carry its mount
// (each a container of the claim), never the agent's own or the root.
func (w *Watchdog) containerCgroups(cu *Usage, self string) []string {
	r := cu.Record
	if !r.Claim {
		if r.Cgroup == "" || r.Cgroup == "/" || r.Cgroup == self {
			return nil
		}
		return []string{r.Cgroup}
	}
	var out []string
	for _, pid := range cu.PIDs {
		if !w.owns(r, pid) {
			continue
		}
		cg, err := CgroupOf(w.cfg.ProcRoot, pid)
		if err != nil || cg == "" || cg == "/" || cg == self || slices.Contains(out, cg) {
			continue
		}
		out = append(out, cg)
	}
	return out
}

// subject names what a record stands for in events: a container, or a claim's
// containers (a claim's record names the claim, its Container is empty).
func subject(r checkpoint.Record) string {
	if r.Claim {
		return fmt.Sprintf("the containers of ResourceClaim %s/%s", r.Namespace, r.Pod)
	}
	return "container " + r.Container
}

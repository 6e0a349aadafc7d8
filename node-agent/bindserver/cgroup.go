// SPDX-License-Identifier: Apache-2.0

package bindserver

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
)

// Identity is the container a process belongs to, read from its cgroup path.
type Identity struct {
	// PodUID is the pod's UID (dashed form, as the API server shows it).
	PodUID string
	// ContainerID is the runtime's container id, as the pod's status shows it after
	// the "<runtime>://" prefix.
	ContainerID string
	// Cgroup is the container's own cgroup in the host hierarchy: the path the NRI
	// binding records and the watchdog compares with, without any cgroups the
	// container's processes created below it.
	Cgroup string
}

// IdentifyProcess reads the content of /proc/<pid>/cgroup and returns the container
// the process belongs to. It looks at the unified (v2) entry first, then the v1
// controllers' (the memory controller first, as the watchdog does), and takes the
// first that names a Kubernetes container; on a pure v2 host only the "0::" entry
// exists, on a hybrid host the "0::" entry may be "/" and the v1 entries say where the
// process is.
func IdentifyProcess(content string) (Identity, error) {
	var unified, memory string
	var others []string
	for _, line := range strings.Split(content, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			unified = parts[2]
		case hasController(parts[1], "memory"):
			memory = parts[2]
		default:
			others = append(others, parts[2])
		}
	}
	var firstErr error
	for _, p := range append([]string{unified, memory}, others...) {
		if p == "" || p == "/" {
			continue
		}
		id, err := ParseCgroup(p)
		if err == nil {
			return id, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return Identity{}, firstErr
	}
	return Identity{}, errors.New("the process is in no cgroup below the root, so it is not in a Kubernetes container")
}

func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// Container cgroup name prefixes: containerd's CRI plugin, CRI-O, cri-dockerd.
var runtimePrefixes = []string{"cri-containerd-", "crio-", "docker-"}

// ParseCgroup reads a pod UID and container id from a container's cgroup path, in the
// shapes kubelet and the runtimes give them:
//
//	systemd driver:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
//	                 (crio-<id>.scope for CRI-O; no QoS slice for Guaranteed pods)
//	cgroupfs driver: /kubepods/burstable/pod<uid>/<id>   (crio-<id> for CRI-O; no QoS level for Guaranteed pods)
//
// Cgroups below the container's (a process that made its own) are allowed and
// dropped. A path that starts with "/.." (the reader is in a cgroup namespace of its
// own) is rebuilt from the pod and container components, which name themselves fully
// under systemd and under cgroupfs sit below kubelet's default root "/kubepods".
func ParseCgroup(p string) (Identity, error) {
	if p == "" || p[0] != '/' || strings.IndexFunc(p, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return Identity{}, fmt.Errorf("cgroup %q is not an absolute path of printable ASCII without spaces", p)
	}
	var comps []string
	if t := strings.Trim(p, "/"); t != "" {
		comps = strings.Split(t, "/")
	}
	relative := false
	for len(comps) > 0 && comps[0] == ".." {
		comps = comps[1:]
		relative = true
	}
	for _, c := range comps {
		if c == "" || c == "." || c == ".." {
			return Identity{}, fmt.Errorf("cgroup %q is not a clean path", p)
		}
	}
	for i, c := range comps {
		if uid, ok := systemdPodSlice(c); ok {
			if i+1 >= len(comps) {
				return Identity{}, fmt.Errorf("cgroup %q is a pod's cgroup, not one of its containers'", p)
			}
			scope := comps[i+1]
			if !strings.HasSuffix(scope, ".scope") {
				return Identity{}, fmt.Errorf("cgroup %q: %q is not a container's scope", p, scope)
			}
			prefix, id, err := containerName(strings.TrimSuffix(scope, ".scope"))
			if err != nil {
				return Identity{}, fmt.Errorf("cgroup %q: %w", p, err)
			}
			cg := "/" + strings.Join(comps[:i+2], "/")
			if relative {
				// The slice names hold their whole ancestry: rebuild the host path
				// the way systemd nests them.
				if cg, err = binding.ResolveCgroup(c + ":" + strings.TrimSuffix(prefix, "-") + ":" + id); err != nil {
					return Identity{}, fmt.Errorf("cgroup %q: %w", p, err)
				}
			}
			return found(p, Identity{PodUID: uid, ContainerID: id, Cgroup: cg})
		}
		if uid, ok := strings.CutPrefix(c, "pod"); ok && validUID(uid) && cgroupfsPodParent(comps, i, relative) {
			if i+1 >= len(comps) {
				return Identity{}, fmt.Errorf("cgroup %q is a pod's cgroup, not one of its containers'", p)
			}
			_, id, err := containerName(comps[i+1])
			if err != nil {
				return Identity{}, fmt.Errorf("cgroup %q: %w", p, err)
			}
			cg := "/" + strings.Join(comps[:i+2], "/")
			if relative {
				cg = "/kubepods"
				if i > 0 && (comps[i-1] == "burstable" || comps[i-1] == "besteffort") {
					cg += "/" + comps[i-1]
				}
				cg += "/" + c + "/" + comps[i+1]
			}
			return found(p, Identity{PodUID: uid, ContainerID: id, Cgroup: cg})
		}
	}
	if strings.Contains(p, "kubepods") {
		return Identity{}, fmt.Errorf("cgroup %q is under kubepods but names no pod", p)
	}
	return Identity{}, fmt.Errorf("cgroup %q is not a Kubernetes pod's container (no kubepods pod cgroup in it)", p)
}

// found returns id when the limits file can name its cgroup (a path longer than it
// allows, from a deep enough parent, cannot be keyed).
func found(p string, id Identity) (Identity, error) {
	if err := api.CheckCgroupPath(id.Cgroup); err != nil {
		return Identity{}, fmt.Errorf("cgroup %q: %w", p, err)
	}
	return id, nil
}

// systemdPodSlice matches kubepods-pod<uid>.slice, kubepods-burstable-pod<uid>.slice
// and kubepods-besteffort-pod<uid>.slice; systemd escapes the UID's dashes as
// underscores.
func systemdPodSlice(c string) (string, bool) {
	rest, ok := strings.CutSuffix(c, ".slice")
	if !ok {
		return "", false
	}
	for _, pre := range []string{"kubepods-pod", "kubepods-burstable-pod", "kubepods-besteffort-pod"} {
		if u, ok := strings.CutPrefix(rest, pre); ok {
			uid := strings.ReplaceAll(u, "_", "-")
			return uid, validUID(uid) && !strings.Contains(u, "-")
		}
	}
	return "", false
}

// cgroupfsPodParent says whether comps[i] sits where kubelet's cgroupfs driver puts a
// pod: under kubepods, or under kubepods/<burstable|besteffort>.
func cgroupfsPodParent(comps []string, i int, relative bool) bool {
	if i == 0 {
		return relative
	}
	parent := comps[i-1]
	if parent == "kubepods" {
		return true
	}
	if parent == "burstable" || parent == "besteffort" {
		return i == 1 && relative || i >= 2 && comps[i-2] == "kubepods"
	}
	return false
}

// validUID accepts what the API server and kubelet use as pod UIDs: RFC 4122 UUIDs,
// and the 32-hex-digit hashes of static pods.
func validUID(u string) bool {
	if len(u) < 32 || len(u) > 36 {
		return false
	}
	for i := 0; i < len(u); i++ {
		c := u[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == '-') {
			return false
		}
	}
	return true
}

// containerName splits a container cgroup name into its runtime prefix and id: "<id>"
// (containerd under cgroupfs), "cri-containerd-<id>", "crio-<id>", "docker-<id>".
func containerName(name string) (prefix, id string, err error) {
	if strings.HasPrefix(name, "crio-conmon-") {
		return "", "", fmt.Errorf("%q is CRI-O's container monitor, not a container", name)
	}
	id = name
	for _, pre := range runtimePrefixes {
		if rest, ok := strings.CutPrefix(name, pre); ok {
			prefix, id = pre, rest
			break
		}
	}
	if len(id) < 12 || len(id) > 128 {
		return "", "", fmt.Errorf("%q is not a container id", name)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", "", fmt.Errorf("%q is not a container id (lower-case hex expected)", name)
		}
	}
	return prefix, id, nil
}

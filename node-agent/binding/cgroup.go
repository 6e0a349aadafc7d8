// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"fmt"
	"path"
	"strings"

	"github.com/tessera-dev/tessera/api"
)

// ResolveCgroup turns the cgroups path a runtime puts in the OCI spec into the path of
// the container's cgroup in the host's hierarchy, the form /proc/<pid>/cgroup shows:
//
//	systemd driver:  "kubepods-besteffort-podU.slice:cri-containerd:ID"
//	              -> "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podU.slice/cri-containerd-ID.scope"
//	cgroupfs driver: "/kubepods/besteffort/podU/ID" (already a path)
//
// The limits file and the watchdog are both keyed by this path, so it must be the one
// the kernel reports for the container's processes.
func ResolveCgroup(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("the runtime gave no cgroups path")
	}
	if strings.HasPrefix(p, "/") {
		if strings.ContainsAny(p, " \t\n") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
			return "", fmt.Errorf("cgroups path %q is not a clean absolute path", p)
		}
		return checked(p, path.Clean(p))
	}
	parts := strings.Split(p, ":")
	if len(parts) != 3 || parts[0] == "" || parts[2] == "" {
		return "", fmt.Errorf("cgroups path %q is neither a path nor systemd's slice:prefix:name", p)
	}
	slice, prefix, name := parts[0], parts[1], parts[2]
	dir, err := expandSlice(slice)
	if err != nil {
		return "", fmt.Errorf("cgroups path %q: %w", p, err)
	}
	// The unit is one cgroup inside the slice: a "/" would move it elsewhere.
	if strings.Contains(prefix, "/") || strings.Contains(name, "/") {
		return "", fmt.Errorf("cgroups path %q: the unit name holds a \"/\"", p)
	}
	unit := name
	if prefix != "" {
		unit = prefix + "-" + name
	}
	if !strings.HasSuffix(unit, ".slice") {
		unit += ".scope"
	}
	return checked(p, path.Join(dir, unit))
}

// checked returns the resolved path when the limits file can name it (the hook keys
// the container's accounting by it), so that a cgroup Tessera cannot key is refused
// here rather than when the limits are written.
func checked(p, resolved string) (string, error) {
	if err := api.CheckCgroupPath(resolved); err != nil {
		return "", fmt.Errorf("cgroups path %q: %w", p, err)
	}
	return resolved, nil
}

// expandSlice turns "a-b-c.slice" into "/a.slice/a-b.slice/a-b-c.slice", as systemd
// nests slices by their dash-separated prefixes.
func expandSlice(slice string) (string, error) {
	if !strings.HasSuffix(slice, ".slice") || strings.Contains(slice, "/") {
		return "", fmt.Errorf("%q is not a systemd slice name", slice)
	}
	base := strings.TrimSuffix(slice, ".slice")
	if base == "-" {
		return "/", nil
	}
	if base == "" || strings.HasPrefix(base, "-") || strings.HasSuffix(base, "-") || strings.Contains(base, "--") {
		return "", fmt.Errorf("%q is not a valid slice name", slice)
	}
	var b strings.Builder
	prefix := ""
	for _, comp := range strings.Split(base, "-") {
		if prefix != "" {
			prefix += "-"
		}
		prefix += comp
		b.WriteString("/" + prefix + ".slice")
	}
	return b.String(), nil
}

// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tessera-dev/tessera/node-agent/gpu"
)

// MIG capability device nodes. With MIG, the driver admits a process to a GPU instance
// and a compute instance only if it can open their capability device nodes,
// /dev/nvidia-caps/nvidia-cap<N>; the minor N of each is published in
// /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access and
// .../gi<G>/ci<C>/access ("DeviceFileMinor: N"), the major is that of "nvidia-caps" in
// /proc/devices. A container assigned a MIG instance gets the parent GPU's node, the
// control nodes and exactly those two capability nodes, so its device cgroup denies
// every other instance.
//
// The driver's two global MIG capabilities, mig/config (create and destroy instances)
// and mig/monitor (read every instance's usage), are never given: like NVIDIA's
// container toolkit, which adds them only when a privileged container asks with
// NVIDIA_MIG_CONFIG_DEVICES / NVIDIA_MIG_MONITOR_DEVICES, and Tessera has no such
// request — a tenant must not reshape or watch the other tenants' instances.

// CapsDevDir is where the capability device nodes live in a container (and on the host,
// under Config.DevDir).
const CapsDevDir = "/dev/nvidia-caps"

// capsDevicesName is the character device of the capability nodes in /proc/devices.
const capsDevicesName = "nvidia-caps"

func (b *Binder) migCapNodes(d gpu.Device) ([]DeviceNode, error) {
	if d.MIG == nil {
		return nil, errors.New("its GPU and compute instance IDs could not be read through NVML, so its capability device nodes are unknown")
	}
	major, err := b.capsMajor()
	if err != nil {
		return nil, err
	}
	giDir := filepath.Join(b.cfg.ProcRoot, "driver", "nvidia", "capabilities", fmt.Sprintf("gpu%d", d.Minor), "mig", fmt.Sprintf("gi%d", d.MIG.GPUInstance))
	var out []DeviceNode
	for _, access := range []string{
		filepath.Join(giDir, "access"),
		filepath.Join(giDir, fmt.Sprintf("ci%d", d.MIG.ComputeInstance), "access"),
	} {
		minor, mode, err := readCapAccess(access)
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("nvidia-cap%d", minor)
		n := DeviceNode{Type: "c", Major: major, Minor: minor, FileMode: mode}
		// The host node, when the driver (nvidia-modprobe) has created it, must be the
		// same device: a mismatch means the proc tree and /dev disagree.
		if hn, err := b.cfg.StatDevice(filepath.Join(b.cfg.DevDir, "nvidia-caps", name)); err == nil {
			if hn.Type != "c" || hn.Major != major || hn.Minor != minor {
				return nil, fmt.Errorf("%s/%s is %s %d:%d, but %s names %d:%d", b.cfg.DevDir+"/nvidia-caps", name, hn.Type, hn.Major, hn.Minor, access, major, minor)
			}
			n.UID, n.GID = hn.UID, hn.GID
		}
		n.Path = CapsDevDir + "/" + name
		out = append(out, n)
	}
	return out, nil
}

// readCapAccess reads a capability's access file: its device minor and file mode
// (0444 when the file gives none, the driver's default).
func readCapAccess(path string) (minor int64, mode uint32, err error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, 0, fmt.Errorf("%s does not exist (is the MIG instance still there, and is the host's /proc given with --proc-root?)", path)
		}
		return 0, 0, err
	}
	defer f.Close()
	minor, mode = -1, 0o444
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "DeviceFileMinor":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || n > 1<<20 {
				return 0, 0, fmt.Errorf("%s: DeviceFileMinor %q is not a device minor", path, v)
			}
			minor = n
		case "DeviceFileMode":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil || n > 0o777 {
				return 0, 0, fmt.Errorf("%s: DeviceFileMode %q is not a file mode", path, v)
			}
			mode = uint32(n)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	if minor < 0 {
		return 0, 0, fmt.Errorf("%s has no DeviceFileMinor line", path)
	}
	return minor, mode, nil
}

// capsMajor returns the major number of the nvidia-caps character device.
func (b *Binder) capsMajor() (int64, error) {
	path := filepath.Join(b.cfg.ProcRoot, "devices")
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	char := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			char = true
			continue
		case strings.HasSuffix(line, "devices:"):
			char = false
			continue
		}
		if f := strings.Fields(line); char && len(f) == 2 && f[1] == capsDevicesName {
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return 0, fmt.Errorf("%s lists no %q character device (the driver has not loaded MIG support)", path, capsDevicesName)
}

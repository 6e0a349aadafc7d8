// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-dev/tessera/node-agent/cdi"
	"github.com/tessera-dev/tessera/node-agent/dra"
)

// DRACheckpoint is the file in --state-dir that records the prepared DRA claims.
const DRACheckpoint = "dra-checkpoint.json"

func bindDRAFlags(fs *flag.FlagSet, c *Config) {
	fs.BoolVar(&c.DRA, "dra", false, "serve the node's GPUs through the DRA kubelet plugin "+dra.DriverName+
		" (ResourceSlices and ResourceClaims) instead of the device plugin; needs --device-plugin=false")
	fs.StringVar(&c.DRAPluginDir, "dra-plugin-dir", kubeletplugin.KubeletPluginsDir+"/"+dra.DriverName, "with --dra: the plugin's directory under kubelet's plugins directory (holds its socket)")
	fs.StringVar(&c.DRARegistrarDir, "dra-registrar-dir", kubeletplugin.KubeletRegistryDir, "with --dra: kubelet's plugin registration directory")
	fs.StringVar(&c.DRACDISpecDir, "dra-cdi-spec-dir", cdi.DefaultSpecDir, "with --dra: where the CDI spec of each prepared claim is written (a directory the runtime reads CDI specs from)")
	fs.BoolVar(&c.DRAClaimRegionTmpfs, "dra-claim-region-tmpfs", true, "with --dra: mount a tmpfs of its own (1 MiB) at each prepared claim's accounting-region directory, "+
		"so that what a claim's containers write there cannot fill the file system of --limits-root; needs CAP_SYS_ADMIN and the limits root "+
		"shared with the host (Bidirectional mount propagation). false: the directory stays on the limits root's file system")
}

// validateDRA checks the DRA flags: a node serves Tessera's GPUs through the device
// plugin or through DRA, never both (one resource may not be served both ways on a
// node, KEP-5004), and claims are bound at preparation, which the fallback binding
// cannot follow.
func (c *Config) validateDRA() error {
	if !c.DRA {
		return nil
	}
	if c.DevicePlugin {
		return errors.New("--dra and --device-plugin are exclusive: a node serves Tessera's GPUs through one of them; pass --device-plugin=false")
	}
	if c.BindFallback {
		return errors.New("--dra and --bind-fallback are exclusive: claims are bound when kubelet prepares them")
	}
	for _, f := range []struct{ name, v string }{
		{"--state-dir", c.StateDir}, {"--limits-root", c.LimitsRoot}, {"--dra-cdi-spec-dir", c.DRACDISpecDir},
		{"--dra-plugin-dir", c.DRAPluginDir}, {"--dra-registrar-dir", c.DRARegistrarDir},
	} {
		if !filepath.IsAbs(f.v) {
			return fmt.Errorf("%s %q must be an absolute path with --dra", f.name, f.v)
		}
	}
	if c.TurnsDir != "" && !filepath.IsAbs(c.TurnsDir) {
		return fmt.Errorf("--turns-dir %q must be an absolute path (or empty, for no GPU turns)", c.TurnsDir)
	}
	return nil
}

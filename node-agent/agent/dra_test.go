// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"strings"
	"testing"
)

func TestValidateDRA(t *testing.T) {
	for args, want := range map[string]string{
		"--dra": "--dra and --device-plugin are exclusive",
		"--dra --device-plugin=false --nri=false --bind-fallback": "--dra and --bind-fallback are exclusive",
		"--dra --device-plugin=false --state-dir=state":           "--state-dir \"state\" must be an absolute path",
		"--dra --device-plugin=false --limits-root=lim":           "--limits-root \"lim\" must be an absolute path",
		"--dra --device-plugin=false --dra-cdi-spec-dir=":         "--dra-cdi-spec-dir \"\" must be an absolute path",
		"--dra --device-plugin=false --turns-dir=turns":           "--turns-dir \"turns\"",
	} {
		c := parse(t, append([]string{"--node-name", "n"}, strings.Fields(args)...)...)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", args, err, want)
		}
	}
	c := parse(t, "--node-name", "n", "--dra", "--device-plugin=false")
	if err := c.Validate(); err != nil {
		t.Errorf("DRA node: %v", err)
	}
	if c.DRAPluginDir != "/var/lib/kubelet/plugins/gpu.tessera.dev" || c.DRARegistrarDir != "/var/lib/kubelet/plugins_registry" || c.DRACDISpecDir != "/var/run/cdi" {
		t.Errorf("defaults %q %q %q", c.DRAPluginDir, c.DRARegistrarDir, c.DRACDISpecDir)
	}
}

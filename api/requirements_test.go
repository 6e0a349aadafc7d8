// SPDX-License-Identifier: Apache-2.0

package api

import (
	"strings"
	"testing"
)

func TestRequirementsError(t *testing.T) {
	for _, raw := range []string{"", "met", " met\n"} {
		if err := RequirementsError(raw); err != nil {
			t.Errorf("%q: %v", raw, err)
		}
	}
	err := RequirementsError("nri: no NRI socket at /var/run/nri/nri.sock\ncdi-directory: /var/run/cdi is not writable\n")
	if err == nil {
		t.Fatal("unmet requirements accepted")
	}
	for _, want := range []string{"nri: no NRI socket at /var/run/nri/nri.sock; cdi-directory: /var/run/cdi is not writable", "TesseraRequirementNotMet"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}

func TestRequirementsMemoryFenceIsInformation(t *testing.T) {
	for _, raw := range []string{"met\nmemory-fence: driver on every GPU", "met\nmemory-fence: hook and watchdog only (driver 580.65.06 has no per-cgroup memory limit)\n"} {
		if err := RequirementsError(raw); err != nil {
			t.Errorf("%q: %v", raw, err)
		}
	}
	err := RequirementsError("nri: no NRI socket\nmemory-fence: driver on every GPU")
	if err == nil || strings.Contains(err.Error(), "memory-fence") || !strings.Contains(err.Error(), "nri: no NRI socket") {
		t.Errorf("unmet requirement beside the fence line: %v", err)
	}
}

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

// SPDX-License-Identifier: Apache-2.0

package api

import (
	"strings"
	"testing"
)

func TestTurnFileName(t *testing.T) {
	for _, uuid := range []string{"GPU-ec8fc627-3b0e-4f6d-9a0a-1c2d3e4f5a6b", "MIG-1", "GPU-0"} {
		if got, err := TurnFileName(uuid); err != nil || got != uuid {
			t.Errorf("TurnFileName(%q) = %q, %v; want the UUID itself", uuid, got, err)
		}
	}
	for _, bad := range []string{"", "..", ".", "GPU-0/../../etc/passwd", "/GPU-0", "GPU 0", "GPU-0\x00", strings.Repeat("a", 129)} {
		if got, err := TurnFileName(bad); err == nil || !strings.Contains(err.Error(), "uuid") {
			t.Errorf("TurnFileName(%q) = %q, %v; want an error naming the uuid", bad, got, err)
		}
	}
}

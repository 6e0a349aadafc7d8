package gpushare

import (
	"fmt"
	"testing"
)

// The reasons built without fmt must read exactly as fmt would write them.
func TestReasonsMatchFmt(t *testing.T) {
	for _, name := range []string{"c", "main", "", `we"ird`, "ünï\tcode\x00"} {
		for _, v := range []int64{-1, 0, 7, 81559, 1 << 40} {
			want := fmt.Sprintf("largest free GPU memory on node is %d MiB, container %q asks %d MiB", v, name, v+1)
			if got := memoryReason(v, name, v+1); got != want {
				t.Errorf("memoryReason = %q, want %q", got, want)
			}
			for _, n := range []int{1, 2, 8} {
				want := fmt.Sprintf("most free GPU cores on node is %d%%, container %q asks %d%% on %s", int(v), name, int(v)+3, gpus(n))
				if got := coresReason(int(v), name, int(v)+3, n); got != want {
					t.Errorf("coresReason = %q, want %q", got, want)
				}
			}
		}
	}
}

// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"path"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
)

// FuzzResolveCgroup checks that ResolveCgroup never panics and that what it returns
// is what the limits file and the watchdog can be keyed by: an absolute, clean path
// the limits file accepts, that resolves to itself, and, in systemd's form, a single
// unit inside the slice it names.
func FuzzResolveCgroup(f *testing.F) {
	for _, seed := range []string{
		"kubepods-besteffort-pod12_3.slice:cri-containerd:abc",
		"kubepods.slice:crio:abc",
		"system.slice::abc.slice",
		"-.slice::x",
		"/kubepods/besteffort/pod1/abc",
		"/kubepods//x/",
		"/a/../b",
		"a.slice:x:",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := ResolveCgroup(in)
		if err != nil {
			return
		}
		if out == "" || out[0] != '/' || path.Clean(out) != out {
			t.Fatalf("ResolveCgroup(%q) = %q, not a clean absolute path", in, out)
		}
		l := api.ContainerLimits{Cgroup: out, GPUs: []api.GPULimit{{UUID: "GPU-1", MemoryMiB: 1}}}
		if err := l.Validate(); err != nil {
			t.Fatalf("ResolveCgroup(%q) = %q, which the limits file refuses: %v", in, out, err)
		}
		if again, err := ResolveCgroup(out); err != nil || again != out {
			t.Fatalf("ResolveCgroup(%q) = %q, but that resolves to %q, %v", in, out, again, err)
		}
		if !strings.HasPrefix(in, "/") {
			slice, _, _ := strings.Cut(in, ":")
			dir, err := expandSlice(slice)
			if err != nil {
				t.Fatalf("ResolveCgroup(%q) = %q from a slice it cannot expand: %v", in, out, err)
			}
			if path.Dir(out) != dir {
				t.Fatalf("ResolveCgroup(%q) = %q, not one unit inside %q", in, out, dir)
			}
		}
	})
}

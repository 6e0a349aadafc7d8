package cdi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-dev/tessera/node-agent/cdi/cditest"
)

// probe loads the driver as CUDA applications (and Tessera's hook) do, by soname.
const probe = `#include <dlfcn.h>
#include <stdio.h>
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
	if (!init) { printf("no cuInit\n"); return 1; }
	printf("cuInit=%d\n", init(0));
	return 0;
}
`

// What a container whose image has no driver and whose loader cache was never
// updated (no ldconfig hook) needs to load libcuda.so.1 from the spec written without
// the toolkit: the spec's mounts are applied to an empty root holding only glibc (and
// no /etc/ld.so.cache), as a runtime would apply them, and a process there dlopens
// "libcuda.so.1". Without the library directory on LD_LIBRARY_PATH it fails; with
// the binding's LD_LIBRARY_PATH (the image's own path, then the directory) it loads.
// Needs root (mount namespace, chroot) and gcc.
func TestHooklessSpecLoadsDriverWithoutLdconfig(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	root := cditest.DriverRoot(t, "usr/lib/x86_64-linux-gnu")
	lib := cditest.H100()
	devs := cditest.Devices(lib)
	// The host sees the driver where the test does, so the spec's host paths are real.
	g := newGen(t, Config{DriverRoot: root, HostDriverRoot: root, NVML: lib, Hook: HookNone})
	s, err := g.Generate(devs)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(filepath.Dir(s.Path)), cdiapi.WithAutoRefresh(false))
	must(t, err)
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/usr/bin", "LD_LIBRARY_PATH=/opt/app/lib"}}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, g.QualifiedName(devs[0].UUID)); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	bin := filepath.Join(dir, "probe")
	must(t, os.WriteFile(bin+".c", []byte(probe), 0o644))
	if b, err := exec.Command("gcc", "-o", bin, bin+".c", "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, b)
	}
	rootfs := filepath.Join(dir, "rootfs")
	var sh strings.Builder
	fmt.Fprintf(&sh, "set -e\nR=%s\nmkdir -p $R/usr/lib/x86_64-linux-gnu $R/lib64 $R/etc $R/opt/app/lib\nln -s usr/lib $R/lib\n", rootfs)
	// glibc only: the host's libraries directory and its loader.
	fmt.Fprintf(&sh, "mount --bind -o ro /usr/lib/x86_64-linux-gnu $R/usr/lib/x86_64-linux-gnu\nmount --bind -o ro /lib64 $R/lib64\n")
	fmt.Fprintf(&sh, "cp %s $R/probe\n", bin)
	for _, m := range spec.Mounts {
		if !isLibrary(m.Destination) {
			continue
		}
		fmt.Fprintf(&sh, "mkdir -p $R%s\ntouch $R%s\nmount --bind -o ro %s $R%s\n", filepath.Dir(m.Destination), m.Destination, m.Source, m.Destination)
	}
	run := func(env ...string) (string, error) {
		script := sh.String() + "C=$(command -v chroot)\nexec env -i " + strings.Join(env, " ") + " $C $R /probe\n"
		out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script).CombinedOutput()
		return string(out), err
	}
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libc.so.6"); err != nil {
		t.Skip("the host's glibc is not in /usr/lib/x86_64-linux-gnu")
	}

	// The image's environment as the spec leaves it: no library directory.
	imageEnv := spec.Process.Env
	without, err := run(imageEnv...)
	if err == nil || !strings.Contains(without, "libcuda.so.1") {
		t.Fatalf("libcuda.so.1 loaded without the library directory on the search path (or the probe failed otherwise): %v\n%s", err, without)
	}
	// With the binding's addition.
	withDir := []string{"LD_LIBRARY_PATH=/opt/app/lib:" + ContainerLibraryDir}
	for _, e := range imageEnv {
		if !strings.HasPrefix(e, "LD_LIBRARY_PATH=") {
			withDir = append(withDir, e)
		}
	}
	out, err := run(withDir...)
	if err != nil || !strings.Contains(out, "cuInit=0") {
		t.Fatalf("libcuda.so.1 not loaded with %s on LD_LIBRARY_PATH: %v\n%s", ContainerLibraryDir, err, out)
	}
	t.Logf("without the directory: %q; with it: %q", strings.TrimSpace(without), strings.TrimSpace(out))
}

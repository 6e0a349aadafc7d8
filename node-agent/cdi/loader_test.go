// SPDX-License-Identifier: Apache-2.0

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
	int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
	if (!init || !count) { printf("no cuInit or cuDeviceGetCount\n"); return 1; }
	int r = init(0), n = -1;
	if (r == 0) r = count(&n);
	printf("cuInit+cuDeviceGetCount=%d devices=%d\n", r, n);
	return r != 0;
}
`

// injected applies the CDI devices to an empty container spec with the given
// environment, as a runtime does.
func injected(t *testing.T, specDir string, env []string, devices ...string) *oci.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(specDir), cdiapi.WithAutoRefresh(false))
	must(t, err)
	spec := &oci.Spec{Process: &oci.Process{Env: env}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, devices...); err != nil {
		t.Fatal(err)
	}
	return spec
}

// inRoot runs the probe, as a container would, in a mount namespace whose root holds
// only the host's glibc (and no /etc/ld.so.cache) plus the spec's mounts and device
// nodes, with exactly env. It needs root, unshare and gcc.
func inRoot(t *testing.T, spec *oci.Spec, env []string) (string, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libc.so.6"); err != nil {
		t.Skip("the host's glibc is not in /usr/lib/x86_64-linux-gnu")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "probe")
	must(t, os.WriteFile(bin+".c", []byte(probe), 0o644))
	if b, err := exec.Command("gcc", "-o", bin, bin+".c", "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, b)
	}
	var sh strings.Builder
	fmt.Fprintf(&sh, "set -e\nR=%s\nmkdir -p $R/usr/lib/x86_64-linux-gnu $R/lib64 $R/etc $R/proc $R/sys $R/dev\nln -s usr/lib $R/lib\n", filepath.Join(dir, "rootfs"))
	fmt.Fprintf(&sh, "mount --bind -o ro /usr/lib/x86_64-linux-gnu $R/usr/lib/x86_64-linux-gnu\nmount --bind -o ro /lib64 $R/lib64\n")
	fmt.Fprintf(&sh, "mount -t proc proc $R/proc\nmount --rbind /sys $R/sys\ncp %s $R/probe\n", bin)
	for _, m := range spec.Mounts {
		fmt.Fprintf(&sh, "mkdir -p $R%s\n[ -d %s ] && mkdir -p $R%s || touch $R%s\nmount --bind -o ro %s $R%s\n",
			filepath.Dir(m.Destination), m.Source, m.Destination, m.Destination, m.Source, m.Destination)
	}
	for _, d := range spec.Linux.Devices {
		// The device node the runtime would create: bound from the host's.
		fmt.Fprintf(&sh, "mkdir -p $R%s\ntouch $R%s\nmount --bind /dev/%s $R%s\n", filepath.Dir(d.Path), d.Path, strings.TrimPrefix(d.Path, "/dev/"), d.Path)
	}
	script := sh.String() + "C=$(command -v chroot)\nexec env -i " + strings.Join(env, " ") + " $C $R /probe\n"
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script).CombinedOutput()
	return string(out), err
}

// What a container whose image has no driver and whose loader cache was never
// updated (no ldconfig hook) needs to load libcuda.so.1 from the spec written without
// the toolkit: without the library directory on LD_LIBRARY_PATH it fails; with the
// binding's LD_LIBRARY_PATH (the image's own path, then the directory) it loads.
func TestHooklessSpecLoadsDriverWithoutLdconfig(t *testing.T) {
	root := cditest.DriverRoot(t, "usr/lib/x86_64-linux-gnu")
	lib := cditest.H100()
	devs := cditest.Devices(lib)
	// The host sees the driver where the test does, so the spec's host paths are real.
	g := newGen(t, Config{DriverRoot: root, HostDriverRoot: root, NVML: lib, Hook: HookNone})
	s, err := g.Generate(devs)
	if err != nil {
		t.Fatal(err)
	}
	image := []string{"PATH=/usr/bin", "LD_LIBRARY_PATH=/opt/app/lib"}
	spec := injected(t, filepath.Dir(s.Path), image, g.QualifiedName(devs[0].UUID))
	// Only the libraries: the fake driver's device nodes are not real devices.
	spec.Linux.Devices = nil
	var mounts []oci.Mount
	for _, m := range spec.Mounts {
		if isLibrary(m.Destination) {
			mounts = append(mounts, m)
		}
	}
	spec.Mounts = mounts

	without, err := inRoot(t, spec, spec.Process.Env)
	if err == nil || !strings.Contains(without, "libcuda.so.1") {
		t.Fatalf("libcuda.so.1 loaded without the library directory on the search path (or the probe failed otherwise): %v\n%s", err, without)
	}
	with := []string{"PATH=/usr/bin", "LD_LIBRARY_PATH=/opt/app/lib:" + ContainerLibraryDir}
	out, err := inRoot(t, spec, with)
	if err != nil || !strings.Contains(out, "cuInit+cuDeviceGetCount=0") {
		t.Fatalf("libcuda.so.1 not loaded with %s on LD_LIBRARY_PATH: %v\n%s", ContainerLibraryDir, err, out)
	}
	t.Logf("without the directory: %q; with it: %q", strings.TrimSpace(without), strings.TrimSpace(out))
}

// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
)

// regionMounts returns the mounts at the region directory.
func regionMounts(e *Edits) []Mount {
	var out []Mount
	for _, m := range e.Mounts {
		if m.Destination == api.ContainerRegionDir {
			out = append(out, m)
		}
	}
	return out
}

// limitsOf reads the limits file the binder wrote for container id.
func limitsOf(t *testing.T, b *Binder, id string) *api.ContainerLimits {
	t.Helper()
	rec, ok := b.cfg.Store.Get(id)
	if !ok {
		t.Fatalf("no record of %s", id)
	}
	data, err := os.ReadFile(filepath.Join(rec.LimitsDir, api.LimitsFileName))
	if err != nil {
		t.Fatal(err)
	}
	l, err := api.DecodeLimits(data)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Two MPS clients of one GPU share the GPU's shm directory as their /dev/shm (MPS
// needs it), so their accounting regions must not live there: a neighbour could write
// 16 bytes into another's region (its next process fails cuInit) or hold its lock
// (its allocations wait). Each gets a tmpfs of its own at the region directory, which
// its limits file names, and no host directory there.
func TestMPSClientsKeepPrivateRegions(t *testing.T) {
	b, ps, dirs := mpsBinder(t, 48)
	for _, c := range []struct{ uid, name, id string }{{"u1", "a", "c1"}, {"u2", "b", "c2"}} {
		ann := mpsPod(t, ps, c.uid, c.name, "mps", 1, "GPU-0")
		e, err := b.Bind(mpsReq(c.uid, c.name, c.id, ann))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(e.Mounts, func(m Mount) bool { return m.Source == dirs.Shm && m.Destination == ContainerShmDir }) {
			t.Errorf("%s: mounts %v lack the GPU's shm directory at %s", c.id, e.Mounts, ContainerShmDir)
		}
		got := regionMounts(e)
		if fmt.Sprint(got) != fmt.Sprint([]Mount{RegionMount()}) {
			t.Errorf("%s: region mounts %v, want only %v", c.id, got, RegionMount())
		}
		for _, m := range e.Mounts {
			// Nothing of the host's at the region directory, nor the region directory
			// (or anything above or below it) bound to the GPU's shared shm directory.
			if m.Source == dirs.Shm && m.Destination != ContainerShmDir ||
				m.Destination == api.ContainerRegionDir && (m.Type != "tmpfs" || strings.HasPrefix(m.Source, "/")) {
				t.Errorf("%s: mount %v shares a host directory at the region", c.id, m)
			}
		}
		l := limitsOf(t, b, c.id)
		if l.RegionDir != api.ContainerRegionDir {
			t.Errorf("%s: limits file's region line %q, want %q", c.id, l.RegionDir, api.ContainerRegionDir)
		}
		if l.RegionDir == ContainerShmDir || strings.HasPrefix(l.RegionDir, ContainerShmDir+"/") {
			t.Errorf("%s: the region is in the GPU's shared shm directory %s", c.id, l.RegionDir)
		}
		if rec, _ := b.cfg.Store.Get(c.id); rec.RegionDir != api.ContainerRegionDir {
			t.Errorf("%s: record's region %q", c.id, rec.RegionDir)
		}
	}
}

// The region tmpfs is small, and nothing on it can be a device, set-user-ID or run.
func TestRegionMountOptions(t *testing.T) {
	m := RegionMount()
	if m.Type != "tmpfs" || m.ReadOnly || m.Destination != api.ContainerRegionDir {
		t.Errorf("region mount %+v", m)
	}
	for _, o := range []string{"nosuid", "nodev", "noexec", "size=1048576", "mode=1777"} {
		if !slices.Contains(m.Options, o) {
			t.Errorf("region mount options %v lack %s", m.Options, o)
		}
	}
	// Each call its own slice: the NRI plugin's adjustment must not share it.
	a, c := RegionMount(), RegionMount()
	a.Options[0] = "changed"
	if c.Options[0] != "nosuid" {
		t.Error("RegionMount's callers share one options slice")
	}
}

// tsReq is the request of pod team/p-<uid>'s container main, granted 4096 MiB and 20 %
// of GPU-1 (time-sliced).
func tsReq(t *testing.T, ps *pods, uid string) Request {
	t.Helper()
	grants := []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 4096, Cores: 20}}
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: grants})
	ps.byUID[uid] = pod(uid, "p-"+uid, ann, ctr("main", gpuLimits(1, 4096, 20)))
	r := req("c-"+uid, "main", ann, deviceplugin.EnvRequested+"=1")
	r.PodUID, r.Pod = uid, "p-"+uid
	r.CgroupsPath = "kubepods-burstable-pod" + uid + ".slice:cri-containerd:c-" + uid
	return r
}

// Where the region is: the private directory for a container created through NRI, its
// own /dev/shm for one the fallback binding meets running (it can add no mount), and
// for one NRI reports running (after a lost checkpoint) whatever it was created with.
// A container keeps its first bind's choice: binding it again through the fallback
// socket (asked from inside it) must not send its new processes to a second region,
// in which its grant would count again.
func TestRegionDirFollowsTheContainersMounts(t *testing.T) {
	b, ps := newBinderWithPods(t, t.TempDir())
	for _, tc := range []struct {
		name    string
		started bool
		running bool
		mounts  []string
		want    string
	}{
		{name: "created through NRI", want: api.ContainerRegionDir},
		{name: "fallback binding", started: true, want: ""},
		{name: "running, created with the region mount", running: true, mounts: []string{"/proc", api.ContainerRegionDir}, want: api.ContainerRegionDir},
		{name: "running, created without it", running: true, mounts: []string{"/proc", api.ContainerLimitsDir, "/dev/shm"}, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := strings.ReplaceAll(tc.name, " ", "-")
			uid = strings.ReplaceAll(uid, ",", "")
			r := tsReq(t, ps, uid)
			r.Started, r.Running, r.Mounts = tc.started, tc.running, tc.mounts
			e, err := b.Bind(r)
			if err != nil {
				t.Fatal(err)
			}
			if l, _ := api.DecodeLimits(e.Limits); l == nil || l.RegionDir != tc.want {
				t.Fatalf("limits %+v, want region %q", l, tc.want)
			}
			if got, want := len(regionMounts(e)), map[bool]int{true: 1}[tc.want != ""]; got != want {
				t.Errorf("%d region mounts, want %d", got, want)
			}
			// Bound again the other way: the first choice holds.
			again := r
			again.Started, again.Running, again.Mounts = !tc.started, false, nil
			e2, err := b.Bind(again)
			if err != nil {
				t.Fatal(err)
			}
			if l := limitsOf(t, b, r.ContainerID); l.RegionDir != tc.want {
				t.Errorf("bound again (started %v): region %q, want %q", again.Started, l.RegionDir, tc.want)
			}
			if string(e2.Limits) != string(e.Limits) {
				t.Errorf("bound again: limits\n%s\nwant\n%s", e2.Limits, e.Limits)
			}
		})
	}
}

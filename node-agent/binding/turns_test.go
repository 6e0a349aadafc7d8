// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
)

// bindGrants binds container "main" of a new pod (UID uid) granted grants, each
// asked for with the first grant's memory and cores.
func bindGrants(t *testing.T, b *Binder, ps *pods, uid string, grants ...api.DeviceGrant) (*Edits, error) {
	t.Helper()
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: grants})
	ps.byUID[uid] = pod(uid, "p-"+uid, ann, ctr("main", gpuLimits(int64(len(grants)), grants[0].MemoryMiB, int64(grants[0].Cores))))
	r := req("c-"+uid, "main", ann, deviceplugin.EnvRequested+"=1")
	r.PodUID, r.Pod = uid, "p-"+uid
	r.CgroupsPath = "kubepods-burstable-pod" + uid + ".slice:cri-containerd:c-" + uid
	return b.Bind(r)
}

// turnFiles lists the names in the turns directory, nil when it does not exist.
func turnFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// A container the hook paces on time-sliced GPUs gets a 4096-byte, mode 0666 turn file
// per paced GPU, whatever the agent's umask, each bind-mounted read-write on its own
// under the container's turns directory (never the directory itself); a container
// paced on no GPU, an MPS client, and a binder without a turns directory get neither.
func TestBindTurns(t *testing.T) {
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })
	for _, tc := range []struct {
		name   string
		grants []api.DeviceGrant
		mps    bool
		noDir  bool
		want   []string // turn files; none: no mount either
	}{
		{name: "paced", grants: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1024, Cores: 30}}, want: []string{"GPU-0"}},
		{name: "paced on two GPUs", grants: []api.DeviceGrant{{UUID: "GPU-1", Index: 1, MemoryMiB: 1024, Cores: 50}, {UUID: "GPU-0", MemoryMiB: 1024, Cores: 50}},
			want: []string{"GPU-0", "GPU-1"}},
		{name: "paced MIG instance", grants: []api.DeviceGrant{{UUID: "MIG-1", Index: 1, MemoryMiB: 1024, Cores: 40}}, want: []string{"MIG-1"}},
		{name: "whole GPU (cores 100)", grants: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1024, Cores: 100}}},
		{name: "not paced (no cores)", grants: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1024}}},
		{name: "MPS client", grants: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 4096, Cores: 30}}, mps: true},
		{name: "no turns directory", grants: []api.DeviceGrant{{UUID: "GPU-0", MemoryMiB: 1024, Cores: 30}}, noDir: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b *Binder
			var ps *pods
			var e *Edits
			var err error
			turns := filepath.Join(t.TempDir(), "state", "turns")
			if tc.mps {
				b, ps, _ = mpsBinder(t, 48)
				b.cfg.TurnsDir = turns
				e, err = b.Bind(mpsReq("u1", "infer", "c1", mpsPod(t, ps, "u1", "infer", "mps", 1, "GPU-0")))
			} else {
				b, ps = newBinderWithPods(t, t.TempDir())
				if !tc.noDir {
					b.cfg.TurnsDir = turns
				}
				if tc.grants[0].UUID == "MIG-1" {
					b.cfg.CDI = fakeCDI{}
				}
				e, err = bindGrants(t, b, ps, "u1", tc.grants...)
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []Mount
			for _, m := range e.Mounts {
				if strings.HasPrefix(m.Destination, api.ContainerTurnsDir) {
					got = append(got, m)
				}
			}
			if len(tc.want) == 0 {
				if len(got) > 0 {
					t.Errorf("mounts %v: turn files are mounted", got)
				}
				if got := turnFiles(t, turns); got != nil {
					t.Errorf("turns directory holds %v", got)
				}
				return
			}
			var want []Mount
			for _, name := range tc.want {
				want = append(want, Mount{Source: filepath.Join(turns, name), Destination: api.ContainerTurnsDir + "/" + name})
			}
			slices.SortFunc(got, func(a, b Mount) int { return strings.Compare(a.Destination, b.Destination) })
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("turn mounts %v, want %v (read-write, each file on its own)", got, want)
			}
			if fi, err := os.Lstat(turns); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
				t.Errorf("turns directory: %v %v, want a directory of mode 0755", fi.Mode(), err)
			}
			if got := turnFiles(t, turns); !slices.Equal(got, tc.want) {
				t.Errorf("turn files %v, want %v", got, tc.want)
			}
			for _, name := range tc.want {
				fi, err := os.Lstat(filepath.Join(turns, name))
				if err != nil {
					t.Fatal(err)
				}
				if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o666 || fi.Size() != api.TurnFileBytes {
					t.Errorf("%s: %v, %d bytes; want a regular file of mode 0666 and %d bytes", name, fi.Mode(), fi.Size(), api.TurnFileBytes)
				}
				data, _ := os.ReadFile(filepath.Join(turns, name))
				if strings.Trim(string(data), "\x00") != "" {
					t.Errorf("%s: a new turn file holds something other than zeroes", name)
				}
			}
		})
	}
}

// fakeCDI names every UUID's CDI device, so that a MIG instance binds without its
// capability nodes.
type fakeCDI struct{}

func (fakeCDI) DeviceNames(uuids []string) ([]string, error) {
	var out []string
	for _, u := range uuids {
		out = append(out, "tessera.dev/gpu="+u)
	}
	return out, nil
}
func (fakeCDI) LibraryDir() string { return "" }

// A turn file already there is kept: the containers running on its GPU have it mapped.
// One of another size or mode is resized and made 0666 in place, its content and inode
// kept; a second container on the GPU shares the same file.
func TestTurnFileKeptInPlace(t *testing.T) {
	dir := t.TempDir()
	b, ps := newBinderWithPods(t, dir)
	turns := filepath.Join(dir, "turns")
	b.cfg.TurnsDir = turns
	if err := os.MkdirAll(turns, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(turns, "GPU-0")
	if err := os.WriteFile(p, []byte("turn state"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bindGrants(t, b, ps, "u1", api.DeviceGrant{UUID: "GPU-0", MemoryMiB: 1024, Cores: 30}); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		after, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(before, after) {
			t.Errorf("%s: the turn file was replaced", what)
		}
		if after.Size() != api.TurnFileBytes || after.Mode().Perm() != 0o666 {
			t.Errorf("%s: %d bytes, mode %v; want %d, 0666", what, after.Size(), after.Mode(), api.TurnFileBytes)
		}
		if data, _ := os.ReadFile(p); !strings.HasPrefix(string(data), "turn state\x00") {
			t.Errorf("%s: content %q..., want what was there, then zeroes", what, data[:min(len(data), 16)])
		}
	}
	check("resized")
	if fi, _ := os.Stat(turns); fi.Mode().Perm() != 0o755 {
		t.Errorf("turns directory mode %v, want 0755", fi.Mode())
	}
	// Too long is cut back to the size, in place too.
	if err := os.Truncate(p, 3*api.TurnFileBytes); err != nil {
		t.Fatal(err)
	}
	if _, err := bindGrants(t, b, ps, "u2", api.DeviceGrant{UUID: "GPU-0", MemoryMiB: 1024, Cores: 30}); err != nil {
		t.Fatal(err)
	}
	check("second container")
}

// Anything but a regular file at a turn file's path (left on the host, or put there by
// a tenant when containers had the whole directory mounted) is removed without being followed, and a turn file
// made in its place: the binding goes on. Anything but a directory at the turns
// directory's path refuses the binding with the path and what to do, and is left as
// it is.
func TestTurnFileNotRegular(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, turns string) string // returns the path of the turn file or directory
		want  string                                  // the error, or "" where the entry is replaced
	}{
		{"symbolic link", func(t *testing.T, turns string) string {
			target := filepath.Join(filepath.Dir(turns), "secret")
			if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(turns, "GPU-0")
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			return p
		}, ""},
		{"dangling symbolic link", func(t *testing.T, turns string) string {
			p := filepath.Join(turns, "GPU-0")
			if err := os.Symlink(filepath.Join(filepath.Dir(turns), "new"), p); err != nil {
				t.Fatal(err)
			}
			return p
		}, ""},
		{"directory with files", func(t *testing.T, turns string) string {
			p := filepath.Join(turns, "GPU-0")
			if err := os.MkdirAll(filepath.Join(p, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(filepath.Dir(turns), "secret"), filepath.Join(p, "sub", "link")); err != nil {
				t.Fatal(err)
			}
			return p
		}, ""},
		{"named pipe", func(t *testing.T, turns string) string {
			p := filepath.Join(turns, "GPU-0")
			if err := syscall.Mkfifo(p, 0o666); err != nil {
				t.Fatal(err)
			}
			return p
		}, ""},
		{"turns directory a symbolic link", func(t *testing.T, turns string) string {
			if err := os.Remove(turns); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(t.TempDir(), turns); err != nil {
				t.Fatal(err)
			}
			return turns
		}, "is a symbolic link, not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			b, ps := newBinderWithPods(t, dir)
			turns := filepath.Join(dir, "turns")
			b.cfg.TurnsDir = turns
			if err := os.Mkdir(turns, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("x"), 0o600); err != nil && !os.IsExist(err) {
				t.Fatal(err)
			}
			p := tc.setup(t, turns)
			before, _ := os.Lstat(p)
			_, err := bindGrants(t, b, ps, "u1", api.DeviceGrant{UUID: "GPU-0", MemoryMiB: 1024, Cores: 30})
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), p+" "+tc.want) {
					t.Fatalf("error %v, want one naming %s and %q", err, p, tc.want)
				}
				if _, ok := b.cfg.Store.Get("c-u1"); ok {
					t.Error("a container whose turn file could not be made was recorded")
				}
				if after, _ := os.Lstat(p); !os.SameFile(before, after) || after.Mode() != before.Mode() {
					t.Errorf("%s was changed: %v, was %v", p, after.Mode(), before.Mode())
				}
			} else {
				if err != nil {
					t.Fatalf("binding: %v", err)
				}
				fi, err := os.Lstat(p)
				if err != nil || !fi.Mode().IsRegular() || fi.Size() != api.TurnFileBytes || fi.Mode().Perm() != 0o666 {
					t.Errorf("%s after binding: %v %v, want a regular file of %d bytes, mode 0666", p, fi, err, api.TurnFileBytes)
				}
			}
			if data, err := os.ReadFile(filepath.Join(dir, "secret")); err != nil || string(data) != "x" {
				t.Errorf("the link's target was removed or written: %q %v", data, err)
			}
			if fi, err := os.Stat(filepath.Join(dir, "secret")); err == nil && fi.Mode().Perm() != 0o600 {
				t.Errorf("the link's target's mode changed to %v", fi.Mode())
			}
		})
	}
}

// What takes a turn file's place again after the agent removed something else from it
// is refused, with the path and what to do.
func TestTurnFileReplacedOnce(t *testing.T) {
	p := filepath.Join(t.TempDir(), "GPU-0")
	if err := os.Symlink("/", p); err != nil {
		t.Fatal(err)
	}
	if err := ensureTurnPath(p, false); err == nil || !strings.Contains(err.Error(), p+" is a symbolic link, not a regular file: remove it") {
		t.Fatalf("error %v", err)
	}
}

// A UUID that could name another path never becomes a turn file's name.
func TestTurnFileBadUUID(t *testing.T) {
	dir := t.TempDir()
	for _, uuid := range []string{"../GPU-0", "GPU-0/x", "..", ""} {
		m, err := TurnFileMounts(dir, []string{uuid})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("uuid %q", uuid)) {
			t.Errorf("TurnFileMounts(%q): %v %v, want an error naming the uuid", uuid, m, err)
		}
	}
	if got := turnFiles(t, dir); got != nil {
		t.Errorf("files made: %v", got)
	}
	if got := turnFiles(t, filepath.Dir(dir)); slices.Contains(got, "GPU-0") {
		t.Error("a file was made outside the turns directory")
	}
}

// Every GPU's file is mounted once, in the order asked, however often a GPU is named.
func TestTurnFileMountsOncePerFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "turns")
	m, err := TurnFileMounts(dir, []string{"GPU-1", "GPU-0", "GPU-1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{Source: filepath.Join(dir, "GPU-1"), Destination: api.ContainerTurnsDir + "/GPU-1"},
		{Source: filepath.Join(dir, "GPU-0"), Destination: api.ContainerTurnsDir + "/GPU-0"},
	}
	if fmt.Sprint(m) != fmt.Sprint(want) {
		t.Errorf("mounts %v, want %v", m, want)
	}
	if got := turnFiles(t, dir); !slices.Equal(got, []string{"GPU-0", "GPU-1"}) {
		t.Errorf("turn files %v", got)
	}
}

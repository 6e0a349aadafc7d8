// SPDX-License-Identifier: Apache-2.0

package binding

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/deviceplugin"
)

// bindShare binds container "main" of a new pod (UID uid) granted 1024 MiB and cores %
// of GPU-0; started: as the fallback binding does, at the container's first CUDA call.
func bindShare(t *testing.T, b *Binder, ps *pods, uid string, cores int, started bool) *Edits {
	t.Helper()
	g := api.DeviceGrant{UUID: "GPU-0", MemoryMiB: 1024, Cores: cores}
	ann := assignment(t, "node-1", api.ContainerAssignment{Name: "main", Devices: []api.DeviceGrant{g}})
	ps.byUID[uid] = pod(uid, "p-"+uid, ann, ctr("main", gpuLimits(1, 1024, int64(cores))))
	r := req("c-"+uid, "main", ann, deviceplugin.EnvRequested+"=1")
	r.PodUID, r.Pod, r.Started = uid, "p-"+uid, started
	r.CgroupsPath = "kubepods-burstable-pod" + uid + ".slice:cri-containerd:c-" + uid
	e, err := b.Bind(r)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// readShare reads GPU-0's share file as the hook would through its mount.
func readShare(t *testing.T, b *Binder) api.UnreservedShare {
	t.Helper()
	dir, err := api.HostSharesDir(b.cfg.LimitsRoot, "GPU-0")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, api.ShareFileName))
	if err != nil {
		t.Fatal(err)
	}
	s, err := api.DecodeShare(data)
	if err != nil {
		t.Fatalf("share file %q: %v", data, err)
	}
	return s
}

// The share file of a GPU follows the containers bound on it, in both binding modes: a
// container without cores alone is not paced; beside a 70 % reservation it gets 30 %,
// refilled where the reservation's window ends; two such containers split the 30 %;
// the reservation's container gone (removed by the runtime, or forgotten by a
// reconcile), they are not paced again. Only containers without cores get the GPU's
// share directory, read-only.
func TestShareFileFollowsGrants(t *testing.T) {
	for _, mode := range []struct {
		name    string
		started bool
	}{{"NRI", false}, {"fallback", true}} {
		t.Run(mode.name, func(t *testing.T) {
			b, ps := newBinderWithPods(t, t.TempDir())
			dir, _ := api.HostSharesDir(b.cfg.LimitsRoot, "GPU-0")

			e := bindShare(t, b, ps, "u1", 0, mode.started)
			want := Mount{Source: dir, Destination: api.ContainerSharesDir + "/GPU-0", ReadOnly: true}
			if !slices.ContainsFunc(e.Mounts, func(m Mount) bool { return reflect.DeepEqual(m, want) }) {
				t.Fatalf("mounts %v lack the GPU's share directory %v", e.Mounts, want)
			}
			if got := readShare(t, b); got != (api.UnreservedShare{Containers: 1, Share: 100}) {
				t.Fatalf("alone: %+v, want share 100 (not paced)", got)
			}

			e = bindShare(t, b, ps, "u2", 70, mode.started)
			for _, m := range e.Mounts {
				if strings.HasPrefix(m.Destination, api.ContainerSharesDir) {
					t.Errorf("a container with cores got the share mount %v", m)
				}
			}
			if got := readShare(t, b); got != (api.UnreservedShare{Reserved: 70, Containers: 1, Share: 30, Phase: 70}) {
				t.Fatalf("beside 70 %%: %+v, want share 30 at phase 70", got)
			}

			bindShare(t, b, ps, "u3", 0, mode.started)
			if got := readShare(t, b); got != (api.UnreservedShare{Reserved: 70, Containers: 2, Share: 15, Phase: 70}) {
				t.Fatalf("two beside 70 %%: %+v, want 15 each", got)
			}

			if err := b.Unbind("c-u2"); err != nil {
				t.Fatal(err)
			}
			if got := readShare(t, b); got != (api.UnreservedShare{Containers: 2, Share: 100}) {
				t.Fatalf("reservation gone: %+v, want share 100", got)
			}

			bindShare(t, b, ps, "u4", 50, mode.started)
			if got := readShare(t, b); got.Share != 25 || got.Reserved != 50 {
				t.Fatalf("two beside 50 %%: %+v, want 25 each", got)
			}
			// The runtime lists u1 and u3 only: u4 left while the agent was away.
			var live []Request
			for _, uid := range []string{"u1", "u3"} {
				live = append(live, Request{ContainerID: "c-" + uid})
			}
			if errs := b.Reconcile(live); len(errs) > 0 {
				t.Fatal(errs)
			}
			if got := readShare(t, b); got != (api.UnreservedShare{Containers: 2, Share: 100}) {
				t.Fatalf("after the reconcile: %+v, want share 100", got)
			}
		})
	}
}

// A reservation whose pod has finished (the runtime has not removed its container
// yet) no longer holds its share back once the files are refreshed.
func TestShareFileFreesFinishedPods(t *testing.T) {
	b, ps := newBinderWithPods(t, t.TempDir())
	b.cfg.CachedPod = func(uid string) (*corev1.Pod, bool) { return ps.byUID[uid], true }
	bindShare(t, b, ps, "u1", 0, false)
	bindShare(t, b, ps, "u2", 60, false)
	if got := readShare(t, b); got.Share != 40 {
		t.Fatalf("beside 60 %%: %+v, want 40", got)
	}
	ps.byUID["u2"].Status.Phase = corev1.PodSucceeded
	if err := b.RefreshShares(); err != nil {
		t.Fatal(err)
	}
	if got := readShare(t, b); got.Share != 100 {
		t.Fatalf("the reservation's pod finished: %+v, want share 100", got)
	}
}

// An MPS client gets no share directory (MPS divides the SMs; the hook paces nothing).
func TestShareNotForMPS(t *testing.T) {
	b, ps, _ := mpsBinder(t, 48)
	e, err := b.Bind(mpsReq("u1", "infer", "c1", mpsPod(t, ps, "u1", "infer", "mps", 1, "GPU-0")))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range e.Mounts {
		if strings.HasPrefix(m.Destination, api.ContainerSharesDir) {
			t.Errorf("an MPS client got the share mount %v", m)
		}
	}
}

// Something other than a directory in a GPU's share directory's place (a symbolic link
// an intruder on the host made) is refused, never followed.
func TestShareDirNotDirectory(t *testing.T) {
	root := t.TempDir()
	target := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, api.SharesSubdir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(root, api.SharesSubdir, "GPU-0")); err != nil {
		t.Fatal(err)
	}
	if _, err := ShareDirMounts(root, []string{"GPU-0"}); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("ShareDirMounts over a symbolic link: %v, want a refusal naming it", err)
	}
	if _, err := ShareDirMounts(root, []string{"../x"}); err == nil {
		t.Fatal("ShareDirMounts of a UUID naming another path: want an error")
	}
}

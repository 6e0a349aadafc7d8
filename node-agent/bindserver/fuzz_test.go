// SPDX-License-Identifier: Apache-2.0

package bindserver

import (
	"path"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
)

// FuzzIdentifyProcess feeds IdentifyProcess arbitrary /proc/<pid>/cgroup content. It
// must never panic, and an identity it returns must be one the agent can act on: a
// valid pod UID and container id, and a cgroup that the limits file accepts, that
// identifies the same container again, and that the NRI binding resolves to itself
// (both bindings key the container by it).
func FuzzIdentifyProcess(f *testing.F) {
	sd := "/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope"
	fs := "/kubepods/burstable/pod" + uid + "/" + cid
	for _, seed := range []string{
		"0::" + sd + "\n",
		"12:pids:" + fs + "\n5:memory:" + fs + "\n1:name=systemd:/\n",
		"12:memory:" + sd + "\n1:name=systemd:" + sd + "\n0::/\n",
		"0::" + sd + "/app\n",
		"0::/../../kubepods-burstable-pod" + uidU + ".slice/crio-" + cid + ".scope\n",
		"0::/../../besteffort/pod" + uid + "/" + cid + "\n",
		"0::/k8s/kubepods/burstable/pod" + uid + "/" + cid + "\n",
		"0::/\n",
		"nonsense\n\x00\x01",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, content string) {
		id, err := IdentifyProcess(content)
		if err != nil {
			return
		}
		if !validUID(id.PodUID) {
			t.Fatalf("pod UID %q from %q", id.PodUID, content)
		}
		if _, cid, err := containerName(id.ContainerID); err != nil || cid != id.ContainerID {
			t.Fatalf("container id %q from %q: %v", id.ContainerID, content, err)
		}
		if id.Cgroup == "" || id.Cgroup[0] != '/' || path.Clean(id.Cgroup) != id.Cgroup {
			t.Fatalf("cgroup %q from %q is not a clean absolute path", id.Cgroup, content)
		}
		l := api.ContainerLimits{Cgroup: id.Cgroup, GPUs: []api.GPULimit{{UUID: "GPU-1", MemoryMiB: 1}}}
		if err := l.Validate(); err != nil {
			t.Fatalf("cgroup %q from %q: the limits file refuses it: %v", id.Cgroup, content, err)
		}
		again, err := ParseCgroup(id.Cgroup)
		if err != nil || again != id {
			t.Fatalf("%+v from %q, but its cgroup gives %+v, %v", id, content, again, err)
		}
		if r, err := binding.ResolveCgroup(id.Cgroup); err != nil || r != id.Cgroup {
			t.Fatalf("cgroup %q from %q: the NRI binding resolves it to %q, %v", id.Cgroup, content, r, err)
		}
	})
}

// SPDX-License-Identifier: Apache-2.0

package bindserver

import (
	"strings"
	"testing"
)

const (
	uid    = "3f6b2a1c-9d8e-4f70-8a6b-5c4d3e2f1a0b"
	uidU   = "3f6b2a1c_9d8e_4f70_8a6b_5c4d3e2f1a0b"
	cid    = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	static = "6d2c4a7be1f0983c5d4e3f2a1b0c9d8e" // a static pod's UID is a hash
)

func TestParseCgroup(t *testing.T) {
	sd := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope"
	for _, tc := range []struct {
		name, in, uid, cgroup string
	}{
		{"systemd containerd burstable", sd, uid, sd},
		{"systemd containerd guaranteed", "/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope", uid,
			"/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope"},
		{"systemd CRI-O besteffort", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/crio-" + cid + ".scope", uid,
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/crio-" + cid + ".scope"},
		{"systemd nested cgroup inside the container", sd + "/init.scope/worker", uid, sd},
		{"systemd seen from a cgroup namespace", "/../../kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope", uid, sd},
		{"systemd static pod", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + static + ".slice/cri-containerd-" + cid + ".scope", static,
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + static + ".slice/cri-containerd-" + cid + ".scope"},
		{"cgroupfs containerd burstable", "/kubepods/burstable/pod" + uid + "/" + cid, uid, "/kubepods/burstable/pod" + uid + "/" + cid},
		{"cgroupfs containerd guaranteed", "/kubepods/pod" + uid + "/" + cid, uid, "/kubepods/pod" + uid + "/" + cid},
		{"cgroupfs CRI-O", "/kubepods/besteffort/pod" + uid + "/crio-" + cid, uid, "/kubepods/besteffort/pod" + uid + "/crio-" + cid},
		{"cgroupfs nested", "/kubepods/pod" + uid + "/" + cid + "/sub", uid, "/kubepods/pod" + uid + "/" + cid},
		{"cgroupfs seen from a cgroup namespace", "/../../besteffort/pod" + uid + "/" + cid, uid, "/kubepods/besteffort/pod" + uid + "/" + cid},
		{"cgroupfs under a cgroup root", "/k8s/kubepods/burstable/pod" + uid + "/" + cid, uid, "/k8s/kubepods/burstable/pod" + uid + "/" + cid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := ParseCgroup(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if id.PodUID != tc.uid || id.ContainerID != cid || id.Cgroup != tc.cgroup {
				t.Errorf("got %+v\nwant uid %s id %s cgroup %s", id, tc.uid, cid, tc.cgroup)
			}
		})
	}
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "not an absolute path"},
		{"relative", "kubepods/pod" + uid + "/" + cid, "not an absolute path"},
		{"root", "/", "not a Kubernetes pod's container"},
		{"system service", "/system.slice/containerd.service", "not a Kubernetes pod's container"},
		{"pod cgroup only", "/kubepods.slice/kubepods-pod" + uidU + ".slice", "a pod's cgroup"},
		{"cgroupfs pod cgroup only", "/kubepods/burstable/pod" + uid, "a pod's cgroup"},
		{"CRI-O conmon", "/kubepods.slice/kubepods-pod" + uidU + ".slice/crio-conmon-" + cid + ".scope", "container monitor"},
		{"not a scope", "/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid, "not a container's scope"},
		{"id not hex", "/kubepods/pod" + uid + "/not-a-container-id-xyz", "not a container id"},
		{"id too short", "/kubepods/pod" + uid + "/abc", "not a container id"},
		{"uid with dashes in a slice", "/kubepods.slice/kubepods-pod" + uid + ".slice/cri-containerd-" + cid + ".scope", "names no pod"},
		{"bad uid", "/kubepods/podxyz/" + cid, "names no pod"},
		{"pod not under kubepods", "/other/pod" + uid + "/" + cid, "not a Kubernetes pod's container"},
		{"dot dot inside", "/kubepods/../pod" + uid + "/" + cid, "not a clean path"},
		{"space", "/kubepods/pod" + uid + "/" + cid + " x", "not an absolute path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := ParseCgroup(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseCgroup(%q) = %+v, %v; want an error containing %q", tc.in, id, err, tc.want)
			}
		})
	}
}

func TestIdentifyProcess(t *testing.T) {
	sd := "/kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope"
	fs := "/kubepods/burstable/pod" + uid + "/" + cid
	for _, tc := range []struct{ name, content, cgroup string }{
		{"pure v2", "0::" + sd + "\n", sd},
		{"v1 cgroupfs", "12:pids:" + fs + "\n5:memory:" + fs + "\n1:name=systemd:/\n", fs},
		{"hybrid: unified at the root, v1 has the container", "12:memory:" + sd + "\n1:name=systemd:" + sd + "\n0::/\n", sd},
		{"hybrid: unified names the container", "4:memory:" + sd + "\n0::" + sd + "\n", sd},
		{"v1 without memory controller", "3:cpu,cpuacct:" + fs + "\n2:pids:" + fs + "\n", fs},
		{"v2 unified is a sub-cgroup, v1 memory missing", "0::" + sd + "/app\n", sd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := IdentifyProcess(tc.content)
			if err != nil {
				t.Fatal(err)
			}
			if id.Cgroup != tc.cgroup || id.PodUID != uid || id.ContainerID != cid {
				t.Errorf("got %+v, want cgroup %s", id, tc.cgroup)
			}
		})
	}
	for _, tc := range []struct{ name, content, want string }{
		{"empty", "", "no cgroup below the root"},
		{"root only", "0::/\n", "no cgroup below the root"},
		{"host process", "0::/system.slice/sshd.service\n", "not a Kubernetes pod's container"},
		{"garbage", "nonsense\n\x00\x01", "no cgroup below the root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := IdentifyProcess(tc.content); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

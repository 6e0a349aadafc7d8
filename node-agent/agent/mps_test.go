// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/checkpoint"
)

func TestSelectMPSGPUs(t *testing.T) {
	inv := &api.NodeInventory{Version: api.InventoryVersion, GPUs: []api.GPU{
		{Index: 0, UUID: "GPU-a", MemoryMiB: 1}, {Index: 1, UUID: "GPU-b", MemoryMiB: 1},
		{Index: 2, UUID: "GPU-c", MemoryMiB: 1, MIG: &api.MIG{}},
	}}
	for spec, want := range map[string]string{"": "", "all": "GPU-a,GPU-b", "1": "GPU-b", "GPU-a, 1": "GPU-a,GPU-b"} {
		got, err := selectMPSGPUs(spec, inv)
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("%q: %v %v, want %s", spec, got, err, want)
		}
	}
	for spec, want := range map[string]string{"7": "neither the index nor the UUID", "2": "MIG mode", "0,GPU-a": "listed twice", "GPU-x": "neither"} {
		if _, err := selectMPSGPUs(spec, inv); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", spec, err, want)
		}
	}
}

func TestValidateMPS(t *testing.T) {
	for args, want := range map[string]string{
		"--mps-gpus=all --nri=false":                                 "--mps-gpus needs --nri",
		"--mps-gpus=all --mps-clients=49":                            "--mps-clients 49",
		"--mps-gpus=all --mps-control=bin/x":                         "must be absolute",
		"--mps-gpus=all --mps-health-interval=1ms":                   "--mps-health-interval",
		"--mps-gpus=0 --mps-root=relative/mps/root":                  "must be absolute",
		"--mps-gpus=all --mps-cgroup=/tessera-mps":                   "with --mps-keep-daemons",
		"--mps-gpus=all --mps-keep-daemons --mps-cgroup=tessera-mps": "clean absolute path",
		"--mps-gpus=all --mps-keep-daemons --mps-cgroup=/":           "clean absolute path",
	} {
		c := parse(t, append([]string{"--node-name", "n"}, strings.Fields(args)...)...)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", args, err, want)
		}
	}
	if c := parse(t, "--node-name", "n", "--mps-gpus", "all"); c.Validate() != nil || c.MPS.Clients != 48 || c.MPS.Control != "/usr/bin/nvidia-cuda-mps-control" ||
		c.MPS.KeepDaemons || c.MPS.Cgroup != "" {
		t.Errorf("defaults: %+v %v", c.MPS, c.Validate())
	}
	if c := parse(t, "--node-name", "n", "--mps-gpus", "all", "--mps-keep-daemons", "--mps-cgroup", "/tessera-mps"); c.Validate() != nil {
		t.Errorf("kept daemons in a cgroup: %v", c.Validate())
	}
}

// fakeControl is a minimal nvidia-cuda-mps-control: "-f" runs until told to quit,
// anything else answers the commands on stdin (no servers).
const fakeControl = `#!/bin/sh
pidfile="$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
if [ "$1" = -f ]; then
	echo $$ >"$pidfile"
	trap 'rm -f "$pidfile"; exit 0' TERM
	while :; do sleep 0.05; done
fi
pid=$(cat "$pidfile" 2>/dev/null) && kill -0 "$pid" 2>/dev/null || { echo "Cannot find MPS control daemon process"; exit 1; }
while read -r cmd arg; do
	[ "$cmd" = quit ] && kill "$pid"
done
exit 0
`

func TestSimulatedAgentServesMPS(t *testing.T) {
	dir, mpsRoot := t.TempDir(), shortMPSRoot(t)
	control := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(control, []byte(fakeControl), 0o755); err != nil {
		t.Fatal(err)
	}
	c := parse(t, "--simulate", sample("h100-8x-two-nvlink-islands.yaml"), "--node-name", "sim-0", "--kubeconfig", "unused",
		"--poll", "100ms", "--heartbeat", "1s", "--nri", "--nri-socket", filepath.Join(dir, "nri.sock"), "--state-dir", dir,
		"--limits-root", filepath.Join(dir, "limits"), "--turns-dir", filepath.Join(dir, "turns"), "--mps-gpus", "0,1", "--mps-control", control, "--mps-root", mpsRoot,
		"--mps-clients", "16", "--mps-health-interval", "100ms")
	c.MPS.NoHelper = true
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim-0"}})
	a := newTestAgent(t, c, client, record.NewFakeRecorder(10))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, _ := client.CoreV1().Nodes().Get(ctx, "sim-0", metav1.GetOptions{})
		inv, err := api.DecodeInventory(n.Annotations[api.AnnotationInventory])
		up := true
		for _, st := range a.MPS.Status() {
			up = up && st.Up
		}
		if err == nil && up {
			for _, g := range inv.GPUs {
				mps := g.Index < 2
				if (g.Mode() == api.SharingMPS) != mps || (mps && g.MPSClients != 16) {
					t.Errorf("GPU %d: sharing %q clients %d", g.Index, g.Sharing, g.MPSClients)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no MPS inventory or daemons: %v %+v", err, a.MPS.Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if dirs, ok := a.mpsDirs(a.MPS.GPUs()[0]); !ok || dirs.Pipe != filepath.Join(mpsRoot, a.MPS.GPUs()[0], "pipe") {
		t.Errorf("binding's MPS directories: %+v %v", dirs, ok)
	}
	if _, ok := a.mpsDirs("GPU-none"); ok {
		t.Error("an unserved GPU has MPS directories")
	}
	// Readiness may still wait for NRI (no runtime here), never for MPS.
	if lines := strings.Join(a.Health.Ready().Lines, "\n"); !strings.Contains(lines, "[+]mps ok") {
		t.Errorf("readiness with every daemon up:\n%s", lines)
	}
	pids := []int{}
	for _, st := range a.MPS.Status() {
		pids = append(pids, st.PID)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, st := range a.MPS.Status() {
		if st.Up || st.PID != 0 {
			t.Errorf("daemon still up after the agent stopped: %+v (pids %v)", st, pids)
		}
	}
}

func TestMPSFromNodeLabel(t *testing.T) {
	dir := t.TempDir()
	control := filepath.Join(dir, "nvidia-cuda-mps-control")
	if err := os.WriteFile(control, []byte(fakeControl), 0o755); err != nil {
		t.Fatal(err)
	}
	for label, want := range map[string]int{"": 0, "time-sliced": 0, "mps": 8, "MPS": -1} {
		c := parse(t, "--simulate", sample("h100-8x-two-nvlink-islands.yaml"), "--node-name", "sim-0", "--kubeconfig", "unused",
			"--nri", "--state-dir", dir, "--limits-root", filepath.Join(dir, "limits"), "--turns-dir", filepath.Join(dir, "turns"), "--mps-gpus", "node-label",
			"--mps-control", control, "--mps-root", shortMPSRoot(t))
		c.MPS.NoHelper = true
		src, err := OpenSource(&c, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim-0", Labels: map[string]string{}}}
		if label != "" {
			node.Labels[LabelSharing] = label
		}
		a, err := New(c, logr.Discard(), fake.NewClientset(node), src, record.NewFakeRecorder(10))
		switch {
		case want < 0:
			if err == nil || !strings.Contains(err.Error(), "is not one of mps, time-sliced") {
				t.Errorf("label %q: error %v", label, err)
			}
		case err != nil:
			t.Errorf("label %q: %v", label, err)
		case want == 0 && a.MPS != nil:
			t.Errorf("label %q: MPS served", label)
		case want > 0 && (a.MPS == nil || len(a.MPS.GPUs()) != want):
			t.Errorf("label %q: MPS GPUs %v", label, a.MPS)
		}
		src.Close()
	}
}

func TestMPSEventsGoToThePodsOnTheGPU(t *testing.T) {
	recs := []checkpoint.Record{
		{ContainerID: "1", PodUID: "u1", Namespace: "a", Pod: "p1", Container: "c1", Devices: []api.DeviceGrant{{UUID: "GPU-0"}}},
		{ContainerID: "2", PodUID: "u1", Namespace: "a", Pod: "p1", Container: "c2", Devices: []api.DeviceGrant{{UUID: "GPU-0"}}},
		{ContainerID: "3", PodUID: "u2", Namespace: "b", Pod: "p2", Container: "c", Devices: []api.DeviceGrant{{UUID: "GPU-1"}}},
		{ContainerID: "4", PodUID: "u3", Namespace: "b", Pod: "p3", Container: "c", Devices: []api.DeviceGrant{{UUID: "GPU-1"}, {UUID: "GPU-0"}}},
	}
	var got []string
	for _, r := range podsOnGPU(recs, "GPU-0") {
		got = append(got, r.Namespace+"/"+r.Name+"/"+string(r.UID))
	}
	if strings.Join(got, ",") != "a/p1/u1,b/p3/u3" {
		t.Errorf("pods on GPU-0: %v", got)
	}
	if len(podsOnGPU(recs, "GPU-9")) != 0 {
		t.Error("pods on a GPU nobody uses")
	}
}

// shortMPSRoot is a temporary --mps-root with a short path: each GPU's pipe directory
// under it must fit api.MaxMPSPipeDirBytes, which t.TempDir's paths may not.
func shortMPSRoot(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

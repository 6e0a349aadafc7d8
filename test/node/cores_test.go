// SPDX-License-Identifier: Apache-2.0

//go:build linux

package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-dev/tessera/api"
)

// Two pods at 30 and 70 gpu-cores on one GPU, computing at the same time, each get
// their share of a solo pod's kernel rate within ±3 points (B4's bound, there measured
// with processes on the machine; here through the whole node: scheduler, agent,
// limits file, hook). The probe launches compute-bound kernels (a PTX FMA loop, one
// 256-thread block per SM, about 92 µs each alone on an H200) for a fixed time,
// starting at a wall-clock time given in the pod spec so that both pods run together.
// All three pods are pinned to the same GPU. On the fake driver, whose simulated GPU
// is per process, only the plumbing is checked: the pods' limits files carry cores
// 30 and 70 in windows that do not overlap, and the programs ran.
func testCoresShares(n *node) {
	ctx := context.Background()
	uuid := n.firstGPU(ctx)
	// The pods must be running (CUDA initialized, the kernel loaded) before the
	// common start: slow on a loaded 2-core machine, about 1.5 s on a GPU machine.
	computeMS, startDelay := 5000, 12*time.Second
	if n.gpu {
		computeMS, startDelay = 3000, 5*time.Second
	}
	spec := func(name string, cores int, args ...string) *v1.Pod {
		// The hook's debug log ends with its pacing summary, which explains a share
		// that missed (logged below).
		p := n.pod(podSpec{name: name, gpus: 1, memMiB: 2048, cores: cores, args: args,
			env: []v1.EnvVar{{Name: "TESSERA_HOOK_LOG", Value: "debug"}}})
		p.Annotations = map[string]string{api.AnnotationUUIDInclude: uuid}
		return p
	}
	solo := n.create(ctx, spec("cores-solo", 0, "-compute", strconv.Itoa(computeMS)))
	solo = n.waitPhase(ctx, solo.Name, 2*time.Minute, v1.PodSucceeded, v1.PodFailed)
	soloRate, _ := n.rate(solo)

	at := time.Now().Add(startDelay)
	shares := map[int]*v1.Pod{}
	for _, c := range []int{30, 70} {
		shares[c] = n.create(ctx, spec(fmt.Sprintf("cores-%d", c), c, "-compute", strconv.Itoa(computeMS),
			"-start-at", strconv.FormatInt(at.UnixMilli(), 10), "-turns"))
	}
	limits := map[int]api.GPULimit{}
	for _, c := range []int{30, 70} {
		p := n.waitPhase(ctx, shares[c].Name, 2*time.Minute, v1.PodRunning, v1.PodSucceeded, v1.PodFailed)
		if g := grant(n.t, p); g == nil || len(g.Devices) != 1 || g.Devices[0].UUID != uuid || g.Devices[0].Cores != c {
			n.t.Fatalf("pod %s: assignment %+v, want %d%% of %s", p.Name, g, c, uuid)
		}
		limits[c] = n.limitsOf(p)
	}
	a, b := limits[30], limits[70]
	if a.Cores != 30 || b.Cores != 70 || a.UUID != uuid || b.UUID != uuid {
		n.t.Errorf("limits files: %+v and %+v, want cores 30 and 70 on %s", a, b, uuid)
	}
	if a.Phase < b.Phase+b.Cores && b.Phase < a.Phase+a.Cores {
		n.t.Errorf("the windows overlap: 30%% at phase %d, 70%% at phase %d", a.Phase, b.Phase)
	}
	got := map[int]float64{}
	for _, c := range []int{30, 70} {
		p := n.waitPhase(ctx, shares[c].Name, 2*time.Minute, v1.PodSucceeded, v1.PodFailed)
		r, late := n.rate(p)
		got[c] = 100 * r / soloRate
		n.checkStartedTogether(p, late)
		n.checkTurnFiles(p, uuid)
		for _, l := range n.podLogLines(p, "probe", "pacing summary charged") {
			n.t.Logf("pod %s: %s", p.Name, l)
		}
	}
	n.t.Logf("solo %.1f kernels/s; 30%% pod %.1f%% (phase %d), 70%% pod %.1f%% (phase %d) of it", soloRate, got[30], a.Phase, got[70], b.Phase)
	if n.gpu {
		for _, c := range []int{30, 70} {
			if got[c] < float64(c)-3 || got[c] > float64(c)+3 {
				n.t.Errorf("the %d%% pod got %.1f%% of the solo rate, want %d ± 3", c, got[c], c)
			}
		}
	}
}

// checkStartedTogether fails the test on a GPU (and logs it elsewhere, where a busy
// machine may start a pod late) when a pod began computing late ms after the common
// start its spec gave.
func (n *node) checkStartedTogether(p *v1.Pod, late int64) {
	n.t.Helper()
	if late <= 0 {
		return
	}
	msg := fmt.Sprintf("pod %s started computing %d ms after the common start: the pods did not run together", p.Name, late)
	if n.gpu {
		n.t.Error(msg)
	} else {
		n.t.Log(msg)
	}
}

// checkTurnFiles checks what the probe of a pod paced on the GPU uuid saw of the GPU
// turn files: that GPU's file, of 4096 bytes, among them (with NRI the only one; the
// fallback binding, which does not know the pod at Allocate, gives every GPU's), and
// a file the tenant, root in its container, cannot unlink: each is a mount of its own.
func (n *node) checkTurnFiles(p *v1.Pod, uuid string) {
	n.t.Helper()
	l, ok := find(n.probeLines(p), "turns")
	if !ok {
		n.t.Errorf("pod %s: no turns line from the probe", p.Name)
		return
	}
	files := strings.Split(l.fields["files"], ",")
	want := uuid + ":" + strconv.Itoa(api.TurnFileBytes)
	if !slices.Contains(files, want) || (n.mode == "nri" && len(files) != 1) {
		n.t.Errorf("pod %s: turn files %v, want %s (alone, with NRI)", p.Name, files, want)
	}
	for _, f := range files {
		if !strings.HasSuffix(f, ":"+strconv.Itoa(api.TurnFileBytes)) {
			n.t.Errorf("pod %s: turn file %s, want %d bytes", p.Name, f, api.TurnFileBytes)
		}
	}
	if l.fields["unlink"] != "EBUSY" {
		n.t.Errorf("pod %s: unlinking a turn file in the container gave %s, want EBUSY (a mount point)", p.Name, l.fields["unlink"])
	}
}

// firstGPU is the UUID of the first GPU of the node's inventory.
func (n *node) firstGPU(ctx context.Context) string {
	n.t.Helper()
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	inv, err := api.DecodeInventory(node.Annotations[api.AnnotationInventory])
	if err != nil || len(inv.GPUs) == 0 {
		n.t.Fatalf("node inventory: %v (%d GPUs)", err, len(inv.GPUs))
	}
	return inv.GPUs[0].UUID
}

// rate is the probe's kernels per second and how late it was for its start time.
func (n *node) rate(p *v1.Pod) (float64, int64) {
	n.t.Helper()
	lines := n.probeLines(p)
	r, ok := find(lines, "rate")
	if p.Status.Phase != v1.PodSucceeded || !ok {
		n.t.Fatalf("pod %s: %s; probe printed %v", p.Name, p.Status.Phase, lines)
	}
	v, err := strconv.ParseFloat(r.fields["per_s"], 64)
	if err != nil || v <= 0 {
		n.t.Fatalf("pod %s: rate %q", p.Name, r.fields["per_s"])
	}
	return v, r.int(n.t, "late_ms")
}

// limitsOf reads the limits file the agent wrote for the pod's one container (its
// first GPU).
func (n *node) limitsOf(p *v1.Pod) api.GPULimit {
	n.t.Helper()
	return n.containerLimits(p).GPUs[0]
}

// containerLimits reads the limits file the agent wrote for the pod's one container,
// which holds one GPU.
func (n *node) containerLimits(p *v1.Pod) *api.ContainerLimits {
	n.t.Helper()
	var dirs []string
	waitFor(n.t, 60*time.Second, fmt.Sprintf("the agent's record of pod %s", p.Name), func() (bool, error) {
		dirs = n.boundDirs(p.UID)
		return len(dirs) == 1, nil
	})
	data, err := os.ReadFile(filepath.Join(dirs[0], "limits"))
	if err != nil {
		n.t.Fatalf("limits of pod %s: %v", p.Name, err)
	}
	l, err := api.DecodeLimits(data)
	if err != nil || len(l.GPUs) != 1 {
		n.t.Fatalf("limits of pod %s: %v %+v", p.Name, err, l)
	}
	return l
}

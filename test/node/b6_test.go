// SPDX-License-Identifier: Apache-2.0

//go:build linux

package node

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestB6PodStart is benchmark B6 (make bench-node): the time from a pod's creation to
// its container's first CUDA call succeeding (the probe's first-cuda line: cuInit, a
// context and a 1 MiB cuMemAlloc), for TESSERA_B6_PODS (default 100) Tessera GPU pods
// and as many of the same pods without GPU requests, created one at a time and
// alternating, in the same run on the same node (NRI binding). It reports p50 and p99
// of each, their ratio, and the agent's share: the time its NRI plugin spent binding
// each container (the "took" of its "container bound" log line). Figures go to the
// test log and to $TESSERA_B6_OUT (default _output/b6/b6.txt). It measures; it asserts
// only that every pod started.
func TestB6PodStart(t *testing.T) {
	enabled(t)
	if os.Getenv("TESSERA_NODE_B6") != "1" {
		t.Skip("B6 runs with TESSERA_NODE_B6=1 (make bench-node)")
	}
	count := 100
	if v := os.Getenv("TESSERA_B6_PODS"); v != "" {
		var err error
		if count, err = strconv.Atoi(v); err != nil || count < 2 {
			t.Fatalf("TESSERA_B6_PODS=%q: want a number ≥ 2", v)
		}
	}
	// TESSERA_B6_MODE=dra: the GPU pods ask through a ResourceClaim on a node in DRA
	// mode (make bench-node B6_MODE=dra).
	mode := "nri"
	if os.Getenv("TESSERA_B6_MODE") == "dra" {
		mode = "dra"
	}
	n := startNode(t, mode).with(t)
	ctx := context.Background()
	if mode == "dra" {
		n.draReady(ctx)
	}
	spec := func(kind string, i int) podSpec {
		// Both kinds go through Tessera's scheduler, so that the difference is the
		// GPU path alone (assignment, device plugin, NRI binding, the hook).
		s := podSpec{name: fmt.Sprintf("b6-%s-%03d", kind, i), scheduler: tesseraScheduler}
		// A pod without GPU requests gets no driver from Tessera's CDI spec: the
		// baseline mounts the node's driver itself. The GPU pods get it through CDI
		// but mount the same volume (unused), so that both kinds have the same
		// volumes: kubelet's volume setup is a large part of a pod start (a
		// hostPath volume on one kind only made the baseline twice as slow here).
		switch {
		case kind == "gpu" && mode == "dra":
			// The claim is created with the pod, inside the measured time. Its
			// cores are all of the GPU's, as the device-plugin pods' GPU is unpaced.
			s.claim, s.driverVolume = &claimShape{memory: "4Gi", cores: "100"}, true
		case kind == "gpu":
			s.gpus, s.memMiB, s.driverVolume = 1, 4096, true
		default:
			// On a real GPU the baseline has no device node either and its CUDA
			// call would fail: it is then a privileged pod, which sees the host's
			// devices as a whole-GPU pod of NVIDIA's device plugin would.
			s.hostDriver, s.privileged = true, n.gpu
		}
		return s
	}
	// One pod of each kind first, not measured: the first container start pays for
	// cold caches (image snapshot, binaries) that later ones do not.
	for _, kind := range []string{"gpu", "plain"} {
		n.startOne(ctx, spec(kind, 999))
	}
	lat := map[string][]time.Duration{}
	var podsGPU []string
	for i := range count {
		kinds := []string{"gpu", "plain"}
		if i%2 == 1 {
			kinds = []string{"plain", "gpu"}
		}
		for _, kind := range kinds {
			s := spec(kind, i)
			lat[kind] = append(lat[kind], n.startOne(ctx, s))
			if kind == "gpu" {
				podsGPU = append(podsGPU, s.name)
			}
		}
	}
	took := n.agentBindTimes(podsGPU, mode)

	var b strings.Builder
	fmt.Fprintf(&b, "B6 pod start on a real node: pod creation -> first CUDA call succeeding, %d pods of each kind, created one at a time, alternating\n", count)
	fmt.Fprintf(&b, "node: kubelet %s, containerd %s, runc %s, %s driver; binding: %s\n", "v1.37.2", "v2.4.2", "v1.5.3", map[bool]string{true: "NVIDIA", false: "fake"}[n.gpu],
		map[string]string{"nri": "NRI", "dra": "DRA (a ResourceClaim of 4 GiB and 100 cores per pod, created with it)"}[mode])
	fmt.Fprintf(&b, "%-22s %10s %10s %10s %10s\n", "pods", "p50 ms", "p99 ms", "mean ms", "max ms")
	for _, kind := range []string{"plain", "gpu"} {
		d := lat[kind]
		fmt.Fprintf(&b, "%-22s %10.1f %10.1f %10.1f %10.1f\n", map[string]string{"plain": "without GPU requests", "gpu": "Tessera (1 GPU, 4 GiB)"}[kind],
			ms(pct(d, 50)), ms(pct(d, 99)), ms(mean(d)), ms(pct(d, 100)))
	}
	fmt.Fprintf(&b, "ratio Tessera/plain: p50 %.3f, p99 %.3f, mean %.3f\n",
		ms(pct(lat["gpu"], 50))/ms(pct(lat["plain"], 50)), ms(pct(lat["gpu"], 99))/ms(pct(lat["plain"], 99)), ms(mean(lat["gpu"]))/ms(mean(lat["plain"])))
	if len(took) == len(podsGPU) {
		var sum, all time.Duration
		for i := range took {
			sum += took[i]
		}
		for _, d := range lat["gpu"] {
			all += d
		}
		fmt.Fprintf(&b, "agent's share (%s): p50 %.2f ms, p99 %.2f ms; %.2f%% of the Tessera pods' total start time\n",
			map[string]string{"nri": "NRI CreateContainer binding", "dra": "NodePrepareResources"}[mode], ms(pct(took, 50)), ms(pct(took, 99)), 100*float64(sum)/float64(all))
	} else {
		fmt.Fprintf(&b, "agent's share: %d of %d binding times found in the agent's log\n", len(took), len(podsGPU))
	}
	t.Log("\n" + b.String())
	out := os.Getenv("TESSERA_B6_OUT")
	if out == "" {
		out = filepath.Join(repoRoot(t), "_output", "b6", "b6.txt")
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// startOne creates the pod, waits for its first CUDA call and returns the time from
// just before the create call to the probe's first-cuda timestamp (one clock: the pod
// runs on this machine). The pod is then deleted without waiting.
func (n *node) startOne(ctx context.Context, s podSpec) time.Duration {
	n.t.Helper()
	p := n.pod(s)
	t0 := time.Now()
	if s.claim != nil {
		n.createClaim(ctx, s.name, "", *s.claim)
	}
	p = n.create(ctx, p)
	var line probeLine
	waitFor(n.t, 2*time.Minute, fmt.Sprintf("pod %s's first CUDA call", p.Name), func() (bool, error) {
		var ok bool
		lines := n.probeLines(p)
		if line, ok = find(lines, "first-cuda"); ok {
			return true, nil
		}
		if e, failed := find(lines, "error"); failed {
			return false, fmt.Errorf("pod %s: the probe failed: %v", p.Name, e.fields)
		}
		return false, nil
	})
	ns := line.int(n.t, "unix_ns")
	zero := int64(0)
	_ = n.client.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if s.claim != nil {
		// No resource claim controller runs: once the pod is gone, the claim is
		// released and deleted here, so that its GPU is free for the next pods.
		waitFor(n.t, 2*time.Minute, "pod "+p.Name+" gone", func() (bool, error) {
			_, err := n.client.CoreV1().Pods(namespace).Get(ctx, p.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		n.releaseClaim(ctx, s.name)
		if err := n.client.ResourceV1().ResourceClaims(namespace).Delete(ctx, s.name, metav1.DeleteOptions{}); err != nil {
			n.t.Fatal(err)
		}
	}
	return time.Unix(0, ns).Sub(t0)
}

var (
	boundRE    = regexp.MustCompile(`"container bound".* pod="([^"]+)".* took="([^"]+)"`)
	preparedRE = regexp.MustCompile(`"claim prepared".* claim="([^"]+)".* took="([^"]+)"`)
)

// agentBindTimes reads the agent's binding time of each pod's container from its log:
// its NRI binding, or in DRA mode the preparation of its claim (named after the pod).
func (n *node) agentBindTimes(pods []string, mode string) []time.Duration {
	re := boundRE
	if mode == "dra" {
		re = preparedRE
	}
	f, err := os.Open(filepath.Join(n.dir, "run", "logs", "agent.log"))
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	byPod := map[string]time.Duration{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			if d, err := time.ParseDuration(m[2]); err == nil {
				byPod[m[1]] = d
			}
		}
	}
	var out []time.Duration
	for _, p := range pods {
		if d, ok := byPod[p]; ok {
			out = append(out, d)
		}
	}
	return out
}

// pct is the p-th percentile (nearest rank) of d.
func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	k := (p*len(s)+99)/100 - 1
	if k < 0 {
		k = 0
	}
	return s[k]
}

func mean(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(max(len(d), 1))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

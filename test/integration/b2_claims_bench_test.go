// SPDX-License-Identifier: Apache-2.0

// Built with the newest minor's modules only, as dra_test.go (the node agent's
// ResourceSlice devices).
//go:build !k8s1.34 && !k8s1.35 && !k8s1.36

package integration

// B2 for ResourceClaims: scheduling throughput of claim pods through the real
// kube-scheduler against a real API server, the in-tree DynamicResources plugin alone
// (the default profile: first fit) against the tessera-binpack profile
// (TesseraDynamicResources: the same allocator, devices in Binpack's order, nodes
// scored by Binpack over the claims' consumption).
//
// Two pools of identical nodes, one per phase (a node label the pods select), each node
// with eight H100s published as the node agent publishes them in DRA mode (its
// ResourceSlice devices and its inventory, dra: true), created directly: no agent runs.
// Each phase's pods and claims exist before its scheduler starts; the clock runs from
// sched.Run to the last successful scheduling attempt (b2Run). The mix: three in five
// pods take a share (10, 20 or 40 GiB and 10 to 50 % of the cores), three in ten a whole
// GPU, one in ten two whole GPUs. Beside pods/s the test reports how many GPUs each
// phase used (fewer is what binpacking is for). It reports; it asserts nothing about
// time.
//
// Gated by TESSERA_B2=1 with TESSERA_B2_CLAIMS=1. TESSERA_B2_CLAIMS_TESSERA_FIRST=1 runs
// the Tessera phase first. Sizes: TESSERA_B2_CLAIM_NODES
// (default 100 per pool), TESSERA_B2_CLAIM_PODS (default 1000 per phase). Results go to
// _output/b2/claims.txt.

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	clientset "k8s.io/client-go/kubernetes"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/dra"
	"github.com/tessera-dev/tessera/test/fixtures"
)

func TestB2Claims(t *testing.T) {
	if os.Getenv("TESSERA_B2") == "" || os.Getenv("TESSERA_B2_CLAIMS") == "" {
		t.Skip("B2 for claims: set TESSERA_B2=1 TESSERA_B2_CLAIMS=1 (make bench-b2-claims)")
	}
	nodes, pods := b2Env("TESSERA_B2_CLAIM_NODES", 100), b2Env("TESSERA_B2_CLAIM_PODS", 1000)
	rep := b2Progress(t)
	defer rep.Close()
	c := startCluster(t)
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = b2QPS, b2QPS
	client := clientset.NewForConfigOrDie(rc)
	c.createDeviceClasses()

	// The mix, drawn once: both phases place the same claims.
	type shape struct {
		count       int64
		memory      string // empty: the whole device
		cores       string
		description string
	}
	rng := rand.New(rand.NewSource(42))
	mix := make([]shape, pods)
	for i := range mix {
		switch r := rng.Intn(10); {
		case r < 6:
			mem := []string{"10Gi", "20Gi", "40Gi"}[rng.Intn(3)]
			mix[i] = shape{count: 1, memory: mem, cores: fmt.Sprint(10 * (1 + rng.Intn(5))), description: "share"}
		case r < 9:
			mix[i] = shape{count: 1, description: "whole"}
		default:
			mix[i] = shape{count: 2, description: "two whole"}
		}
	}

	pool := func(p string) {
		b2Parallel(t, nodes, rep.Add(p+": nodes", int64(nodes)), func(i int) error {
			name := fmt.Sprintf("%s-%d", p, i)
			inv := fixtures.NVLinkNode(name, 8, 4, "NVIDIA H100 80GB HBM3", fixtures.H100MiB)
			inv.DRA = true
			raw, err := api.EncodeInventory(inv)
			if err != nil {
				return err
			}
			n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
				Labels:      map[string]string{"kubernetes.io/hostname": name, "b2-pool": p},
				Annotations: map[string]string{api.AnnotationInventory: raw}},
				Status: v1.NodeStatus{
					Capacity:    v1.ResourceList{v1.ResourceCPU: resource.MustParse("256"), v1.ResourceMemory: resource.MustParse("2Ti"), v1.ResourcePods: resource.MustParse("500")},
					Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("256"), v1.ResourceMemory: resource.MustParse("2Ti"), v1.ResourcePods: resource.MustParse("500")},
					Conditions:  []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
				}}
			if _, err := client.CoreV1().Nodes().Create(c.ctx, n, metav1.CreateOptions{}); err != nil {
				return err
			}
			slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu"},
				Spec: resourceapi.ResourceSliceSpec{Driver: dra.DriverName, NodeName: ptr.To(name),
					Pool: resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1}, Devices: dra.Devices(inv)}}
			_, err = client.ResourceV1().ResourceSlices().Create(c.ctx, slice, metav1.CreateOptions{})
			return err
		})
		b2Parallel(t, pods, rep.Add(p+": claims and pods", int64(pods)), func(i int) error {
			s := mix[i]
			req := resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName, Count: s.count, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.tessera.dev"].type == "gpu"`}}}}
			if s.memory != "" {
				req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					dra.CapacityMemory: resource.MustParse(s.memory), dra.CapacityCores: resource.MustParse(s.cores)}}
			}
			name := fmt.Sprintf("%s-%d", p, i)
			if _, err := client.ResourceV1().ResourceClaims(c.ns).Create(c.ctx, &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
				Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}},
			}, metav1.CreateOptions{}); err != nil {
				return err
			}
			sched := v1.DefaultSchedulerName
			if p == "tessera" {
				sched = binpack
			}
			pod := newPod(c.ns, name, sched, nil)
			pod.Spec.NodeSelector = map[string]string{"b2-pool": p}
			pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}}
			pod.Spec.Containers = []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}
			_, err := client.CoreV1().Pods(c.ns).Create(c.ctx, pod, metav1.CreateOptions{})
			return err
		})
	}
	// usedGPUs counts the GPUs of pool p that some claim was allocated, and the claims.
	usedGPUs := func(p string) (gpus, claims int) {
		l, err := client.ResourceV1().ResourceClaims(c.ns).List(c.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for i := range l.Items {
			a := l.Items[i].Status.Allocation
			if a == nil || !strings.HasPrefix(l.Items[i].Name, p+"-") {
				continue
			}
			claims++
			for _, r := range a.Devices.Results {
				seen[r.Pool+"/"+r.Device] = true
			}
		}
		return len(seen), claims
	}

	// The second phase runs against an API server holding the first's objects too;
	// TESSERA_B2_CLAIMS_TESSERA_FIRST=1 swaps the order, to see what that costs.
	var up, ts b2Result
	var upGPUs, upClaims, tsGPUs, tsClaims int
	upstream := func() {
		pool("upstream")
		up = b2Run(t, c, rep, "upstream", b2Config(t, c, ""), v1.DefaultSchedulerName, pods, "")
		upGPUs, upClaims = usedGPUs("upstream")
	}
	tessera := func() {
		pool("tessera")
		ts = b2Run(t, c, rep, "tessera", b2Config(t, c, "tessera-scheduler.yaml"), binpack, pods, "")
		tsGPUs, tsClaims = usedGPUs("tessera")
	}
	order := "first fit, then Tessera"
	if os.Getenv("TESSERA_B2_CLAIMS_TESSERA_FIRST") != "" {
		tessera()
		upstream()
		order = "Tessera, then first fit"
	} else {
		upstream()
		tessera()
	}

	var out strings.Builder
	fmt.Fprintf(&out, "B2 for claims: %d nodes of 8 H100 per pool, %d claim pods per phase, %s\n", nodes, pods, order)
	fmt.Fprintf(&out, "%-30s %10s %10s %12s %10s\n", "phase", "bound", "pods/s", "claims", "GPUs used")
	fmt.Fprintf(&out, "%-30s %10d %10.1f %12d %10d\n", "DynamicResources (first fit)", up.bound, up.podsPerSec(), upClaims, upGPUs)
	fmt.Fprintf(&out, "%-30s %10d %10.1f %12d %10d\n", "TesseraDynamicResources", ts.bound, ts.podsPerSec(), tsClaims, tsGPUs)
	fmt.Fprintf(&out, "ratio (Tessera / first fit): %.2f pods/s\n", ts.podsPerSec()/up.podsPerSec())
	fmt.Fprintf(&out, "plugin time (s, all pods): DynamicResources %.2f, TesseraDynamicResources %.2f\n",
		up.pluginSum["DynamicResources"], ts.pluginSum["TesseraDynamicResources"])
	t.Log("\n" + out.String())
	dir := filepath.Join(repoRoot(t), "_output", "b2")
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "claims.txt"), []byte(out.String()), 0o644)
	}
}

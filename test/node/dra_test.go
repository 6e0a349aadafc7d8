// SPDX-License-Identifier: Apache-2.0

//go:build linux

package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/node-agent/binding"
)

// TestNodeDRA runs the node agent as the DRA driver gpu.tessera.dev under the real
// kubelet (its DRA plugin registration and NodePrepareResources), containerd (the
// claim's CDI devices) and runc: a claim pod placed by the Tessera scheduler sees
// exactly its claim's memory and is refused past it, its limits file mounted, and the
// claim is unprepared once the pod has finished (its limits directory and checkpoint
// record go).
func TestNodeDRA(t *testing.T) {
	enabled(t)
	n := startNode(t, "dra")
	ctx := context.Background()
	n.draReady(ctx)
	t.Run("ClaimCoresShares", func(t *testing.T) {
		tn := n.with(t)
		defer tn.deleteAll(ctx)
		testClaimCoresShares(tn)
	})
	t.Run("ClaimWorkConserving", func(t *testing.T) {
		tn := n.with(t)
		defer tn.deleteAll(ctx)
		testClaimWorkConserving(tn)
	})
	t.Run("WholeGPUExtendedResource", func(t *testing.T) {
		tn := n.with(t)
		defer tn.deleteAll(ctx)
		testWholeGPUExtendedResource(tn)
	})
	t.Run("ClaimMemoryLimit", func(t *testing.T) {
		tn := n.with(t)
		defer tn.deleteAll(ctx)
		p := tn.claimPod(ctx, "claim-4096", "", "4Gi", "50", "-fill", "-chunk", "256")
		p = tn.waitPhase(ctx, p.Name, 120*time.Second, v1.PodSucceeded, v1.PodFailed)
		lines := tn.probeLines(p)
		if p.Status.Phase != v1.PodSucceeded {
			t.Fatalf("pod %s: %s; probe said %v", p.Name, p.Status.Phase, lines)
		}
		ctxLine, _ := find(lines, "context")
		mem, ok := find(lines, "memory")
		fill, ok2 := find(lines, "fill")
		if !ok || !ok2 {
			t.Fatalf("probe printed %v", lines)
		}
		if ctxLine.fields["limits"] != "yes" {
			t.Errorf("the claim's limits file is not mounted: %v", ctxLine.fields)
		}
		if got := mem.int(t, "total_mib"); got != 4096 {
			t.Errorf("cuMemGetInfo total: %d MiB, want the claim's 4096", got)
		}
		if fill.fields["err"] != "2" {
			t.Errorf("allocation past the claim returned %s, want 2 (CUDA_ERROR_OUT_OF_MEMORY)", fill.fields["err"])
		}
		free, filled := mem.int(t, "free_mib"), fill.int(t, "filled_mib")
		if filled > free || free-filled >= 256 {
			t.Errorf("filled %d MiB of %d free: want within one 256 MiB chunk of the claim, never past it", filled, free)
		}
		t.Logf("4 GiB claim: total %d, free after context %d, filled %d MiB, then err %s", mem.int(t, "total_mib"), free, filled, fill.fields["err"])

		// Unprepared when the pod goes: the claim's limits directory is removed.
		got, err := tn.client.ResourceV1().ResourceClaims(namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Kubelet unprepares a claim once no running pod uses it: the pod has finished,
		// so its limits directory and its record in the agent's claim checkpoint go.
		uid := string(got.UID)
		dir := api.HostLimitsDir(filepath.Join(n.dir, "limits"), binding.ClaimCgroup(uid))
		waitFor(t, 60*time.Second, "the claim unprepared (its limits directory and checkpoint record removed)", func() (bool, error) {
			raw, err := os.ReadFile(filepath.Join(n.dir, "agent", "dra-checkpoint.json"))
			if err != nil && !os.IsNotExist(err) {
				return false, err
			}
			_, err = os.Stat(dir)
			return os.IsNotExist(err) && !strings.Contains(string(raw), uid), nil
		})
	})
	// Last: it restarts the agent twice.
	t.Run("ClaimMPS", func(t *testing.T) {
		tn := n.with(t)
		defer tn.deleteAll(ctx)
		testClaimMPS(tn)
	})
}

// A claim on a GPU the agent serves through MPS makes its container an MPS client of
// that GPU's server: the claim's cores are the client's thread percentage (its share
// of the SMs, in whole TPCs), its memory the pinned-memory limit and the hook's.
func testClaimMPS(n *node) {
	ctx := context.Background()
	uuid, g := n.mpsOnFirstGPU(ctx)
	// The restarted agent publishes the GPU's device with sharing "mps".
	waitFor(n.t, 60*time.Second, "the ResourceSlice showing GPU "+uuid+" in mps mode", func() (bool, error) {
		l, err := n.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.name})
		if err != nil {
			return false, err
		}
		for _, sl := range l.Items {
			for _, d := range sl.Spec.Devices {
				u, s := d.Attributes["uuid"], d.Attributes["sharing"]
				if u.StringValue != nil && strings.EqualFold(*u.StringValue, uuid) && s.StringValue != nil && *s.StringValue == "mps" {
					return true, nil
				}
			}
		}
		return false, nil
	})
	p := n.claimPod(ctx, "claim-mps-30", uuid, "2Gi", "30", "-mps")
	p = n.waitPhase(ctx, p.Name, 2*time.Minute, v1.PodSucceeded, v1.PodFailed)
	lines := n.probeLines(p)
	if p.Status.Phase != v1.PodSucceeded {
		n.t.Fatalf("pod %s: %s; probe said %v", p.Name, p.Status.Phase, lines)
	}
	m, ok := find(lines, "mps")
	if !ok {
		n.t.Fatalf("pod %s: no mps line; probe printed %v", p.Name, lines)
	}
	// After cuInit, as the driver sees the client: MPS on, the claim's GPU's pipe,
	// its cores as the thread percentage and its memory as the pinned limit.
	for k, want := range map[string]string{"enabled": "1", "pipe": containerMPSPipeDir, "percent": "30", "pinned": "0=2048M"} {
		if m.fields[k] != want {
			n.t.Errorf("pod %s: probe's %s=%q, want %q", p.Name, k, m.fields[k], want)
		}
	}
	if mem, ok := find(lines, "memory"); !ok || mem.int(n.t, "total_mib") != 2048 {
		n.t.Errorf("pod %s: want the claim's 2048 MiB, probe printed %v", p.Name, lines)
	}
	exact := float64(g.SMCount) * 30 / 100
	tol := max(2, float64(g.SMCount)/20)
	if got := float64(m.int(n.t, "sms")); got < exact-tol || got > exact+tol {
		n.t.Errorf("pod %s at 30%% of %d SMs: %.0f SMs, want about %.1f", p.Name, g.SMCount, got, exact)
	}
	n.t.Logf("claim on MPS GPU %s: %v", uuid, m.fields)
}

// A pod that asks only tessera.dev/gpu runs on the DRA node unchanged: the scheduler
// maps the resource to a claim of whole-gpu.tessera.dev (KEP-5004), kubelet has the
// agent prepare it, and the NRI binding leaves the container to it; the container
// sees a whole GPU under the hook, with the claim's limits file.
func testWholeGPUExtendedResource(n *node) {
	ctx := context.Background()
	p := n.create(ctx, n.pod(podSpec{name: "whole-er", gpus: 1, scheduler: tesseraScheduler,
		env: []v1.EnvVar{{Name: "LD_LIBRARY_PATH", Value: cdiLibraryDir}}}))
	p = n.waitPhase(ctx, p.Name, 120*time.Second, v1.PodSucceeded, v1.PodFailed)
	lines := n.probeLines(p)
	if p.Status.Phase != v1.PodSucceeded {
		n.t.Fatalf("pod %s: %s; probe said %v", p.Name, p.Status.Phase, lines)
	}
	st := p.Status.ExtendedResourceClaimStatus
	if st == nil || st.ResourceClaimName == "" {
		n.t.Fatalf("pod %s has no extended resource claim: %+v", p.Name, p.Status)
	}
	claim, err := n.client.ResourceV1().ResourceClaims(namespace).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		n.t.Fatalf("claim %s: %v %+v", st.ResourceClaimName, err, claim)
	}
	ctxLine, _ := find(lines, "context")
	mem, ok := find(lines, "memory")
	if !ok {
		n.t.Fatalf("probe printed %v", lines)
	}
	if ctxLine.fields["limits"] != "yes" {
		n.t.Errorf("the claim's limits file is not mounted: %v", ctxLine.fields)
	}
	// The claim's limit is the whole GPU's memory as the inventory has it (NVML's
	// total). The hook reports the lesser of its limit and the driver's own total, and
	// a real driver's is a little under NVML's (143155 of 143771 MiB on an H200, what
	// the driver keeps for itself): there the driver's total is the whole GPU.
	got, want := mem.int(n.t, "total_mib"), n.deviceMemMiB(ctx, claim.Status.Allocation.Devices.Results[0].Device)
	if got != want && !(n.gpu && got < want && got >= want-want/100) {
		n.t.Errorf("cuMemGetInfo total: %d MiB, want the whole GPU's %d", got, want)
	}
	n.t.Logf("whole GPU through tessera.dev/gpu: cuMemGetInfo total %d MiB of the inventory's %d", got, want)
}

// deviceMemMiB is the memory of the node's device of this DRA name, from the node's
// inventory.
func (n *node) deviceMemMiB(ctx context.Context, device string) int64 {
	n.t.Helper()
	for _, g := range n.inventory(ctx).GPUs {
		if strings.EqualFold(g.UUID, device) {
			return g.MemoryMiB
		}
	}
	n.t.Fatalf("device %s is not in node %s's inventory", device, n.name)
	return 0
}

// draReady creates the DeviceClasses of config/dra/deviceclass.yaml (shares, and whole
// GPUs of tessera.dev/gpu) and waits for the node's ResourceSlice.
func (n *node) draReady(ctx context.Context) {
	n.t.Helper()
	t := n.t
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "dra", "deviceclass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var dc resourceapi.DeviceClass
		if err := yaml.UnmarshalStrict([]byte(doc), &dc); err != nil {
			t.Fatalf("config/dra/deviceclass.yaml: %v", err)
		}
		if _, err := n.client.ResourceV1().DeviceClasses().Create(ctx, &dc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 60*time.Second, "the node's ResourceSlice", func() (bool, error) {
		l, err := n.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.name})
		return err == nil && len(l.Items) > 0, err
	})
}

// claimPod creates a claim of memory and cores on the GPU uuid (any GPU when empty)
// and a tessera-binpack pod of the probe using it, with args.
func (n *node) claimPod(ctx context.Context, name, uuid, memory, cores string, args ...string) *v1.Pod {
	n.t.Helper()
	return n.shapedClaimPod(ctx, name, uuid, claimShape{memory: memory, cores: cores}, args...)
}

// shapedClaimPod is claimPod with a claim of shape.
func (n *node) shapedClaimPod(ctx context.Context, name, uuid string, shape claimShape, args ...string) *v1.Pod {
	n.t.Helper()
	n.createClaim(ctx, name, uuid, shape)
	return n.create(ctx, n.pod(podSpec{name: name, scheduler: tesseraScheduler, args: args,
		env:   []v1.EnvVar{{Name: "TESSERA_HOOK_LOG", Value: "debug"}},
		claim: &shape}))
}

// createClaim creates claim name of shape on the GPU uuid (any GPU when empty).
func (n *node) createClaim(ctx context.Context, name, uuid string, shape claimShape) {
	n.t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev",
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(shape.memory), "cores": resource.MustParse(shape.cores)}}}
	if uuid != "" {
		req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.attributes["gpu.tessera.dev"].uuid == "` + uuid + `"`}}}
	}
	devices := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}
	if shape.workConserving {
		devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "gpu.tessera.dev", Parameters: runtime.RawExtension{
				Raw: []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","workConserving":true}`)}}}}}
	}
	_, err := n.client.ResourceV1().ResourceClaims(namespace).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       resourceapi.ResourceClaimSpec{Devices: devices},
	}, metav1.CreateOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
}

// claimLimits reads the limits file the agent wrote for the claim of pod p (named as
// the pod) while it is prepared.
func (n *node) claimLimits(ctx context.Context, p *v1.Pod) api.GPULimit {
	n.t.Helper()
	claim, err := n.client.ResourceV1().ResourceClaims(namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	file := filepath.Join(api.HostLimitsDir(filepath.Join(n.dir, "limits"), binding.ClaimCgroup(string(claim.UID))), "limits")
	var data []byte
	waitFor(n.t, 60*time.Second, "the limits file of claim "+p.Name, func() (bool, error) {
		data, err = os.ReadFile(file)
		return err == nil, nil
	})
	l, err := api.DecodeLimits(data)
	if err != nil || len(l.GPUs) != 1 {
		n.t.Fatalf("limits of claim %s: %v %+v", p.Name, err, l)
	}
	return l.GPUs[0]
}

// checkClaimRegionTmpfs checks that the prepared claim of pod p (named as the pod)
// has its region directory on a tmpfs of its own, of a container region's size: the
// agent's --dra-claim-region-tmpfs, on by default.
func (n *node) checkClaimRegionTmpfs(ctx context.Context, p *v1.Pod) {
	n.t.Helper()
	claim, err := n.client.ResourceV1().ResourceClaims(namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	dir := filepath.Join(api.HostLimitsDir(filepath.Join(n.dir, "limits"), binding.ClaimCgroup(string(claim.UID))), "region")
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		n.t.Errorf("claim %s's region directory: %v", p.Name, err)
		return
	}
	if size := uint64(fs.Blocks) * uint64(fs.Bsize); fs.Type != unix.TMPFS_MAGIC || size > uint64(api.RegionDirBytes) {
		n.t.Errorf("claim %s's region directory %s: file system %#x of %d bytes, want a tmpfs of at most %d", p.Name, dir, fs.Type, size, api.RegionDirBytes)
	}
}

// Two claims at 30 and 70 cores on one GPU, as CoresShares does with extended
// resources: their limits files carry the claims' cores in compute windows that do not
// overlap, each paced on the GPU's turn file, and on a GPU each gets its share of a
// whole-GPU claim's solo rate within 3 points (the fake driver's simulated GPU is per
// process: there the shares are logged).
func testClaimCoresShares(n *node) {
	ctx := context.Background()
	uuid := n.firstGPU(ctx)
	computeMS, startDelay := 5000, 12*time.Second
	if n.gpu {
		computeMS, startDelay = 3000, 5*time.Second
	}
	solo := n.claimPod(ctx, "claim-solo", uuid, "2Gi", "100", "-compute", strconv.Itoa(computeMS))
	solo = n.waitPhase(ctx, solo.Name, 2*time.Minute, v1.PodSucceeded, v1.PodFailed)
	soloRate, _ := n.rate(solo)
	n.releaseClaim(ctx, solo.Name)

	at := time.Now().Add(startDelay)
	shares := map[int]*v1.Pod{}
	for _, c := range []int{30, 70} {
		shares[c] = n.claimPod(ctx, fmt.Sprintf("claim-cores-%d", c), uuid, "2Gi", strconv.Itoa(c), "-compute", strconv.Itoa(computeMS),
			"-start-at", strconv.FormatInt(at.UnixMilli(), 10), "-turns")
	}
	limits := map[int]api.GPULimit{}
	for _, c := range []int{30, 70} {
		n.waitPhase(ctx, shares[c].Name, 2*time.Minute, v1.PodRunning, v1.PodSucceeded, v1.PodFailed)
		limits[c] = n.claimLimits(ctx, shares[c])
		n.checkClaimRegionTmpfs(ctx, shares[c])
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
	}
	n.t.Logf("claims: solo %.1f kernels/s; 30%% claim %.1f%% (phase %d), 70%% claim %.1f%% (phase %d) of it", soloRate, got[30], a.Phase, got[70], b.Phase)
	if n.gpu {
		for _, c := range []int{30, 70} {
			if got[c] < float64(c)-3 || got[c] > float64(c)+3 {
				n.t.Errorf("the %d%% claim got %.1f%% of the solo rate, want %d ± 3", c, got[c], c)
			}
		}
	}
}

// A claim configured workConserving (opaque parameters of gpu.tessera.dev) reaches
// its limits file through the scheduler's allocation and kubelet's prepare, and the
// hook lets its container use the idle GPU beyond its cores: alone at 30 % it runs at
// about its solo rate, where a claim of 30 % without it runs at about 30 % of it.
func testClaimWorkConserving(n *node) {
	ctx := context.Background()
	uuid := n.firstGPU(ctx)
	computeMS := "4000"
	if n.gpu {
		computeMS = "3000"
	}
	rateOf := func(name string, shape claimShape) (float64, bool) {
		p := n.shapedClaimPod(ctx, name, uuid, shape, "-compute", computeMS)
		n.waitPhase(ctx, p.Name, 2*time.Minute, v1.PodRunning, v1.PodSucceeded, v1.PodFailed)
		claim, err := n.client.ResourceV1().ResourceClaims(namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			n.t.Fatal(err)
		}
		var wc bool
		file := filepath.Join(api.HostLimitsDir(filepath.Join(n.dir, "limits"), binding.ClaimCgroup(string(claim.UID))), "limits")
		waitFor(n.t, 60*time.Second, "the limits file of claim "+p.Name, func() (bool, error) {
			data, err := os.ReadFile(file)
			if err != nil {
				return false, nil
			}
			l, err := api.DecodeLimits(data)
			if err != nil {
				return false, err
			}
			wc = l.WorkConserving
			return true, nil
		})
		p = n.waitPhase(ctx, p.Name, 2*time.Minute, v1.PodSucceeded, v1.PodFailed)
		r, _ := n.rate(p)
		n.releaseClaim(ctx, p.Name)
		return r, wc
	}
	solo, _ := rateOf("claim-wc-solo", claimShape{memory: "2Gi", cores: "100"})
	paced, pacedWC := rateOf("claim-wc-off", claimShape{memory: "2Gi", cores: "30"})
	free, freeWC := rateOf("claim-wc-on", claimShape{memory: "2Gi", cores: "30", workConserving: true})
	if pacedWC || !freeWC {
		n.t.Fatalf("limits files: work-conserving %v without the configuration, %v with it", pacedWC, freeWC)
	}
	n.t.Logf("claims alone on %s: solo %.1f kernels/s; 30%% %.1f%% of it, 30%% work-conserving %.1f%%", uuid, solo, 100*paced/solo, 100*free/solo)
	if free < 0.85*solo || free < 2*paced {
		n.t.Errorf("the work-conserving 30%% claim ran at %.1f%% of the solo rate alone (the paced one at %.1f%%): want at least 85%%, and twice the paced one",
			100*free/solo, 100*paced/solo)
	}
}

// deleteClaims releases and deletes every claim left once their pods are gone (the
// scheduler's claims for extended resources too): a claim outlives its pod and keeps
// its allocation, so without this a case's claims would hold capacity that the next
// case's claims are placed on.
func (n *node) deleteClaims(ctx context.Context) {
	n.t.Helper()
	claims, err := n.client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	for _, c := range claims.Items {
		if c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0 {
			n.releaseClaim(ctx, c.Name)
		}
		err := n.client.ResourceV1().ResourceClaims(namespace).Delete(ctx, c.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			n.t.Fatal(err)
		}
	}
}

// releaseClaim deallocates the claim of a finished pod as kube-controller-manager's
// resource claim controller would (the suite runs none): no consumer left, no
// allocation, so its capacity is free for the next claims.
func (n *node) releaseClaim(ctx context.Context, name string) {
	n.t.Helper()
	waitFor(n.t, 30*time.Second, "claim "+name+" released", func() (bool, error) {
		c, err := n.client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c.Status.ReservedFor, c.Status.Allocation = nil, nil
		_, err = n.client.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err == nil, nil
	})
}

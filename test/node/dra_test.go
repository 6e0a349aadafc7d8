// SPDX-License-Identifier: Apache-2.0

//go:build linux

package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

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
	for _, dc := range []*resourceapi.DeviceClass{{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu.tessera.dev"},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.tessera.dev"`}}}},
	}} {
		if _, err := n.client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 60*time.Second, "the node's ResourceSlice", func() (bool, error) {
		l, err := n.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.name})
		return err == nil && len(l.Items) > 0, err
	})
	t.Run("ClaimMemoryLimit", func(t *testing.T) {
		tn := n.with(t)
		defer tn.deleteAll(ctx)
		claim, err := tn.client.ResourceV1().ResourceClaims(namespace).Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "claim-4096", Namespace: namespace},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev",
					Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
						"memory": resource.MustParse("4Gi"), "cores": resource.MustParse("50")}}}}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The claim's CDI device does not set the loader's path (docs/dra.md): the pod
		// names the driver's directory, as images on such nodes must.
		p := tn.pod(podSpec{name: "claim-4096", scheduler: tesseraScheduler, args: []string{"-fill", "-chunk", "256"},
			env: []v1.EnvVar{{Name: "LD_LIBRARY_PATH", Value: cdiLibraryDir}}})
		p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim.Name)}}
		p.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
		p = tn.create(ctx, p)
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
		got, err := tn.client.ResourceV1().ResourceClaims(namespace).Get(ctx, claim.Name, metav1.GetOptions{})
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
}

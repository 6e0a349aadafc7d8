// SPDX-License-Identifier: Apache-2.0

// Built with the newest minor's modules only, as dra_test.go.

//go:build !k8s1.34 && !k8s1.35 && !k8s1.36

package integration

import (
	"context"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-dev/tessera/node-agent/dra"
)

// bindingCondition is the condition the test's GPU waits for before its pods bind.
const bindingCondition = "tessera.dev/test-attached"

// TestDRASharesBesideClaimInFlight: a share that fills a GPU beside another share whose
// pod (of another profile) is still binding is placed once that pod has bound. The
// in-tree allocator counts a claim in flight twice while its PreBind runs (allocated
// in memory and already written), so the second share does not fit until the first
// pod's PreBind ends, and no cluster event wakes it then; TesseraDynamicResources
// activates it. The GPU's
// device carries a binding condition, as a device that must be attached first does:
// the first pod's PreBind waits for it, which holds the window open for as long as the
// test needs (the same window is milliseconds without binding conditions, and it met
// two pods created together in the node suite). Without the activation the second pod
// waits for the queue's flush of unschedulable pods (5 minutes).
func TestDRASharesBesideClaimInFlight(t *testing.T) {
	c := startCluster(t)
	const node = "inflight-node"
	a, _, _ := c.draNodeOf(node, t.TempDir(), "t4-4x-pcie.yaml", 4)
	gpu := c.gpuUUID(node, 0)
	// The agent is stopped so that it does not publish its slice again over the
	// binding condition added below (the published slice stays).
	a.stop()
	c.addBindingCondition(node, dra.DeviceName(gpu))
	c.createDeviceClasses()
	c.startScheduler("tessera-scheduler.yaml")

	c.pinnedShareClaim("first", binpack, gpu, "30")
	first := c.waitAllocated("first", 30*time.Second)
	// first's pod is in PreBind, waiting for the binding condition: its claim is
	// written and still in flight. The second pod is of another profile: the claim
	// tracker, and so the double count, is the scheduler's, not a profile's.
	c.pinnedShareClaim("second", spread, gpu, "70")
	msg := c.waitUnschedulable("pod-second", 30*time.Second)
	t.Logf("second share while the first pod binds: %s", msg)

	start := time.Now()
	c.setBindingCondition(first)
	c.waitBound("pod-first", 30*time.Second)
	second := c.waitAllocated("second", 60*time.Second)
	t.Logf("second share allocated %s after the first share's binding condition was set", time.Since(start).Round(100*time.Millisecond))
	c.setBindingCondition(second)
	c.waitBound("pod-second", 30*time.Second)
	for _, cl := range []*resourceapi.ResourceClaim{first, second} {
		if r := cl.Status.Allocation.Devices.Results; len(r) != 1 || r[0].Device != dra.DeviceName(gpu) {
			t.Errorf("claim %s allocated %+v, want one share of %s", cl.Name, r, dra.DeviceName(gpu))
		}
	}
}

// addBindingCondition adds bindingCondition (and a failure condition) to device of
// node's published slice.
func (c *cluster) addBindingCondition(node, device string) {
	t := c.t
	t.Helper()
	l, err := c.client.ResourceV1().ResourceSlices().List(c.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("slices of %s: %v (%d)", node, err, len(l.Items))
	}
	s := &l.Items[0]
	found := false
	for i := range s.Spec.Devices {
		if s.Spec.Devices[i].Name == device {
			s.Spec.Devices[i].BindingConditions = []string{bindingCondition}
			s.Spec.Devices[i].BindingFailureConditions = []string{bindingCondition + "-failed"}
			found = true
		}
	}
	if !found {
		t.Fatalf("no device %s in the slice of %s", device, node)
	}
	got, err := c.client.ResourceV1().ResourceSlices().Update(c.ctx, s, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range got.Spec.Devices {
		if d.Name == device && len(d.BindingConditions) != 1 {
			t.Fatalf("the API server dropped the binding condition of %s (DRADeviceBindingConditions off?)", device)
		}
	}
}

// pinnedShareClaim creates claim name for a share of cores and 1 GiB on GPU uuid and
// a pod of profile using it.
func (c *cluster) pinnedShareClaim(name, profile, uuid, cores string) {
	c.t.Helper()
	c.newSelectedShareClaim(name, `device.attributes["gpu.tessera.dev"].uuid == "`+uuid+`"`, "1Gi", cores)
	c.claimPod(name, profile, nil)
}

// waitAllocated waits for claim name to be allocated and returns it.
func (c *cluster) waitAllocated(name string, timeout time.Duration) *resourceapi.ResourceClaim {
	c.t.Helper()
	var cl *resourceapi.ResourceClaim
	err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		cl, err = c.client.ResourceV1().ResourceClaims(c.ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && cl.Status.Allocation != nil, nil
	})
	if err != nil {
		c.t.Fatalf("claim %s not allocated within %s: %v", name, timeout, err)
	}
	return cl
}

// setBindingCondition reports the binding condition met for claim's device, as the
// driver of a device that needs attaching does.
func (c *cluster) setBindingCondition(cl *resourceapi.ResourceClaim) {
	c.t.Helper()
	err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		cur, err := c.client.ResourceV1().ResourceClaims(c.ns).Get(ctx, cl.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		r := cur.Status.Allocation.Devices.Results[0]
		cur.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: r.Driver, Pool: r.Pool, Device: r.Device, ShareID: (*string)(r.ShareID),
			Conditions: []metav1.Condition{{Type: bindingCondition, Status: metav1.ConditionTrue, Reason: "Attached", LastTransitionTime: metav1.Now()}}}}
		_, err = c.client.ResourceV1().ResourceClaims(c.ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err == nil, nil
	})
	if err != nil {
		c.t.Fatalf("binding condition of claim %s: %v", cl.Name, err)
	}
}

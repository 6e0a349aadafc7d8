// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// TestMPSPlacement: through the real scheduler, MPS pods land only on GPUs the node
// agent serves in mps mode, up to each GPU's client limit, and time-sliced pods never
// do; the pod that fits nowhere says why.
func TestMPSPlacement(t *testing.T) {
	c := startCluster(t)
	mps := fixtures.PCIeNode("mps", 2, "Tesla T4", fixtures.T4MiB)
	for i := range mps.GPUs {
		mps.GPUs[i].Sharing, mps.GPUs[i].MPSClients = api.SharingMPS, 2
	}
	c.createNode("mps", mps)
	c.createNode("ts", fixtures.PCIeNode("ts", 2, "Tesla T4", fixtures.T4MiB))
	c.startScheduler("tessera-scheduler.yaml")

	ann := map[string]string{api.AnnotationSharing: "mps"}
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("mps-%d", i)
		c.createPod(newPod(c.ns, name, binpack, ann, gpuLimits{name: "c", gpu: "1", mem: "1000", cores: "20"}))
		if p := c.waitBound(name, 30*time.Second); p.Spec.NodeName != "mps" {
			t.Errorf("MPS pod %s on %s", name, p.Spec.NodeName)
		}
	}
	c.createPod(newPod(c.ns, "mps-full", binpack, ann, gpuLimits{name: "c", gpu: "1", mem: "1000", cores: "20"}))
	msg := c.waitUnschedulable("mps-full", 30*time.Second)
	for _, want := range []string{`node(s) had no MPS GPU with a client slot left for container "c"`, "node has no GPU in mps sharing mode"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	// Time-sliced pods go to the other node, however full it gets.
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("ts-%d", i)
		c.createPod(newPod(c.ns, name, binpack, nil, gpuLimits{name: "c", gpu: "1", mem: "1000"}))
		if p := c.waitBound(name, 30*time.Second); p.Spec.NodeName != "ts" {
			t.Errorf("time-sliced pod %s on %s", name, p.Spec.NodeName)
		}
	}
	c.checkGrants(10)
}

// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
)

// TestRenderTenantLimitsAgree: with MPS on and every other value at its default, the
// three per-GPU limits the chart sets agree: the agent publishes no more MPS clients
// than the scheduler's maxTenantsPerGPU lets it place (so the published limit is
// reachable), and kubelet's device-plugin replicas are no ceiling below either. The
// agent's get on Nodes comes only with mps.gpus=node-label.
func TestRenderTenantLimitsAgree(t *testing.T) {
	for _, gpus := range []string{"all", "node-label"} {
		ms, err := Render(Options{ChartDir: chartDir(t), Set: []string{"agent.mps.gpus=" + gpus}, KubeVersion: "1.37.2"})
		if err != nil {
			t.Fatal(err)
		}
		ds := find(t, ms, "DaemonSet", "tessera-node-agent")
		spec := ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		args := fmt.Sprint(spec["containers"].([]any)[0].(map[string]any)["args"])
		cm := find(t, ms, "ConfigMap", "tessera-scheduler")
		cfg := cm["data"].(map[string]any)["scheduler-config.yaml"].(string)

		clients := intIn(t, args, `--mps-clients=(\d+)`)
		replicas := intIn(t, args, `--device-plugin-replicas=(\d+)`)
		tenants := intIn(t, cfg, `maxTenantsPerGPU: (\d+)`)
		if clients != tenants {
			t.Errorf("mps.gpus=%s: the agent publishes %d MPS clients per GPU, the scheduler places %d tenants per GPU; want them equal", gpus, clients, tenants)
		}
		if replicas < tenants || replicas < clients {
			t.Errorf("mps.gpus=%s: %d device-plugin replicas per GPU, below maxTenantsPerGPU %d or MPS clients %d", gpus, replicas, tenants, clients)
		}

		role := fmt.Sprint(find(t, ms, "ClusterRole", "tessera-node-agent")["rules"])
		wantGet := gpus == "node-label"
		if got := regexp.MustCompile(`resources:\[nodes\] verbs:\[patch get\]`).MatchString(role); got != wantGet {
			t.Errorf("mps.gpus=%s: get on nodes granted %v, want %v: %s", gpus, got, wantGet, role)
		}
	}
}

func intIn(t *testing.T, s, pattern string) int {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no %s in %s", pattern, s)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tessera-dev/tessera/api"
)

// GPU series carry DCGM exporter's labels (gpu: the index, UUID) and base units.
func TestLabelsJoinDCGM(t *testing.T) {
	m := New(nil)
	m.SetReadiness(func() bool { return true })
	m.SetInventory(&api.NodeInventory{GPUs: []api.GPU{{UUID: "GPU-a", Index: 3, Model: "NVIDIA H100", MemoryMiB: 80, Healthy: true}}})
	m.SetUsage([]GPUSample{
		{UUID: "GPU-a", Index: 3, Polled: true, UsedMiB: 10, UtilPercent: 50, UnattributedMiB: 1, AllocatedMiB: 40, AllocatedCores: 25},
		{UUID: "GPU-gone", Index: -1, AllocatedMiB: 2},
	}, []ContainerSample{{Namespace: "ns", Pod: "p", Container: "c", UUID: "GPU-a", Index: 3, UsedMiB: 9, LimitMiB: 40, SMPercent: 20, CoresLimit: 25}})
	m.WatchdogAction("kill", "ns", "p", "c")
	m.ContainerRefused()
	want := `
# HELP tessera_gpu_memory_total_bytes Device memory of the GPU.
# TYPE tessera_gpu_memory_total_bytes gauge
tessera_gpu_memory_total_bytes{UUID="GPU-a",gpu="3",modelName="NVIDIA H100"} 8.388608e+07
# HELP tessera_gpu_memory_allocated_bytes Device memory granted to bound containers on the GPU.
# TYPE tessera_gpu_memory_allocated_bytes gauge
tessera_gpu_memory_allocated_bytes{UUID="GPU-a",gpu="3"} 4.194304e+07
tessera_gpu_memory_allocated_bytes{UUID="GPU-gone",gpu=""} 2.097152e+06
# HELP tessera_gpu_utilization_ratio GPU core utilisation (0-1), as NVML reports it.
# TYPE tessera_gpu_utilization_ratio gauge
tessera_gpu_utilization_ratio{UUID="GPU-a",gpu="3"} 0.5
# HELP tessera_container_gpu_cores_limit_ratio Share of the GPU's compute (0-1) granted to the container (0: not enforced).
# TYPE tessera_container_gpu_cores_limit_ratio gauge
tessera_container_gpu_cores_limit_ratio{UUID="GPU-a",container="c",gpu="3",namespace="ns",pod="p"} 0.25
# HELP tessera_agent_ready 1 when the agent passes its readiness checks (/readyz).
# TYPE tessera_agent_ready gauge
tessera_agent_ready 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "tessera_gpu_memory_total_bytes",
		"tessera_gpu_memory_allocated_bytes", "tessera_gpu_utilization_ratio", "tessera_container_gpu_cores_limit_ratio", "tessera_agent_ready"); err != nil {
		t.Error(err)
	}
}

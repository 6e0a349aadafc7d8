// SPDX-License-Identifier: Apache-2.0

package watchdog

import (
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/node-agent/gpu"
)

func mpsGPU0(c *Config) { c.MPSGPU = func(u string) bool { return u == "GPU-0" } }

// On an MPS GPU the SM average is not checked (MPS holds the share), but a process
// outside the MPS server is acted on.
func TestMPSGPU(t *testing.T) {
	pass := func(w *Watchdog, src *fakeSource, clk *clock, ps ...gpu.ProcessUsage) []string {
		src.set(ps...)
		s, err := w.Check()
		if err != nil {
			t.Fatal(err)
		}
		clk.t = clk.t.Add(DefaultInterval)
		return s.Acted
	}
	t.Run("MPS clients at full SM use are not acted on", func(t *testing.T) {
		w, src, clk, events, killed, _, _ := setup(t, ActionKill, mpsGPU0, func(c *Config) { c.ComputeAction = ActionKill })
		for i := 0; i < 60; i++ {
			if acted := pass(w, src, clk, gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 100, SMPercent: 100, MPSClient: true}); len(acted) != 0 {
				t.Fatalf("acted at pass %d: %v %v %v", i, acted, *events, *killed)
			}
		}
	})
	t.Run("an MPS client over its memory is still acted on", func(t *testing.T) {
		w, src, clk, events, _, _, _ := setup(t, ActionEvent, mpsGPU0)
		var acted []string
		for i := 0; i < 8; i++ {
			acted = append(acted, pass(w, src, clk, gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 5000, MPSClient: true})...)
		}
		if len(acted) != 1 || !strings.Contains(acted[0], "memory") || !strings.Contains((*events)[0], "GPUMemoryOverLimit") {
			t.Fatalf("acted %v events %v", acted, *events)
		}
	})
	t.Run("a process with its own context", func(t *testing.T) {
		w, src, clk, events, _, _, _ := setup(t, ActionKill, mpsGPU0)
		own := gpu.ProcessUsage{PID: 11, GPUUUID: "GPU-0", UsedMemoryMiB: 100, SMPercent: 100}
		client := gpu.ProcessUsage{PID: 10, GPUUUID: "GPU-0", UsedMemoryMiB: 100, MPSClient: true}
		// Seen once (connecting): nothing.
		if acted := pass(w, src, clk, client, own); len(acted) != 0 {
			t.Fatalf("acted on the first sight: %v", acted)
		}
		if acted := pass(w, src, clk, client, own); len(acted) != 1 || acted[0] != "ns/p1/train GPU-0 compute" {
			t.Fatalf("acted %v", acted)
		}
		want := "GPUMPSBypassed container train runs process(es) 11 on GPU GPU-0 with a CUDA context of their own instead of as clients of the GPU's MPS server"
		if len(*events) != 1 || !strings.HasPrefix((*events)[0], "p1 "+want) || strings.Contains((*events)[0], "CUDA hook") {
			t.Errorf("events %v", *events)
		}
		// One event per episode; a new one after the process is gone and back.
		for i := 0; i < 5; i++ {
			pass(w, src, clk, client, own)
		}
		pass(w, src, clk, client)
		pass(w, src, clk, client, own)
		pass(w, src, clk, client, own)
		if len(*events) != 2 {
			t.Errorf("events %v", *events)
		}
	})
	t.Run("kill", func(t *testing.T) {
		w, src, clk, events, killed, _, _ := setup(t, ActionKill, mpsGPU0, func(c *Config) { c.ComputeAction = ActionKill })
		own := gpu.ProcessUsage{PID: 11, GPUUUID: "GPU-0", UsedMemoryMiB: 100}
		pass(w, src, clk, own)
		pass(w, src, clk, own)
		if len(*killed) != 1 || (*killed)[0] != 11 || !strings.Contains((*events)[0], "GPUMPSBypassedKilled") {
			t.Errorf("killed %v events %v", *killed, *events)
		}
	})
	t.Run("off", func(t *testing.T) {
		w, src, clk, events, _, _, _ := setup(t, ActionKill, mpsGPU0, func(c *Config) { c.ComputeAction = ActionOff })
		for i := 0; i < 4; i++ {
			pass(w, src, clk, gpu.ProcessUsage{PID: 11, GPUUUID: "GPU-0", UsedMemoryMiB: 100})
		}
		if len(*events) != 0 {
			t.Errorf("events %v", *events)
		}
	})
	t.Run("a time-sliced GPU is unaffected", func(t *testing.T) {
		// Container b (PID 20) on GPU-1, not MPS, with its own context: nothing.
		w, src, clk, events, _, _, _ := setup(t, ActionKill, mpsGPU0, func(c *Config) { c.ComputeAction = ActionKill })
		for i := 0; i < 4; i++ {
			pass(w, src, clk, gpu.ProcessUsage{PID: 20, GPUUUID: "GPU-1", UsedMemoryMiB: 100})
		}
		if len(*events) != 0 {
			t.Errorf("events %v", *events)
		}
	})
}

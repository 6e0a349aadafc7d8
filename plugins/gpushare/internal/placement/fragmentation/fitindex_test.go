// SPDX-License-Identifier: Apache-2.0

package fragmentation

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
)

// The fit index gives, for every device state, exactly the classes that ShapeFits
// accepts one by one: over MIG and unhealthy devices, GPUs of several sizes, model
// selections, requests by percent, MiB and whole memory, with and without cores, the
// tenant limit, and nodes without a context charge, with the default one and with a
// large one (under which small percent and MiB classes fit no device, or only some).
func TestFitIndexMatchesShapeFits(t *testing.T) {
	m := &nodemodel.Model{
		Devices: []nodemodel.Device{
			{Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Healthy: true},
			{Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Healthy: true},
			{Model: "NVIDIA H100 80GB HBM3 MIG 3g.40gb", MemoryMiB: 40192, Healthy: true, MIG: true},
			{Model: "Tesla T4", MemoryMiB: 15360, Healthy: true},
			{Model: "Tesla T4", MemoryMiB: 15360, Healthy: false},
			{Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, Healthy: true},
			{Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, Healthy: true, MPS: true, MPSClients: 2},
		},
		HasMPS: true,
	}
	for _, d := range m.Devices {
		m.Hot = append(m.Hot, nodemodel.DeviceHot{MemoryMiB: d.MemoryMiB, Healthy: d.Healthy, MIG: d.MIG})
	}
	rng := rand.New(rand.NewSource(5))
	selections := [][2][]string{{}, {{"h100"}, nil}, {{"mig 3g"}, nil}, {nil, {"t4"}}, {{"a100", "t4"}, {"mig"}}}
	var classes []Class
	for k := 0; k < 40; k++ {
		c := api.ContainerRequest{GPUs: 1 + rng.Intn(2)}
		switch rng.Intn(4) {
		case 0:
			c.MemoryPercent = 1 + rng.Intn(100)
		case 1:
			c.MemoryMiB = int64(1 + rng.Intn(50000))
		case 2: // whole memory
		}
		if rng.Intn(4) > 0 {
			c.Cores = 1 + rng.Intn(100)
		}
		sel := selections[0]
		if rng.Intn(5) == 0 {
			sel = selections[1+rng.Intn(len(selections)-1)]
		}
		classes = append(classes, Class{C: c, modelInclude: sel[0], modelExclude: sel[1], gpu: fmt.Sprint(k)})
	}
	x := newFitIndexes(classes)
	w := &placement.Weights{Memory: 1, Cores: 1, MaxTenants: 4}
	for trial := 0; trial < 3000; trial++ {
		m.ContextMiB = []int64{0, api.DefaultContextMiB, 4096}[trial%3]
		used := make([]placement.Usage, len(m.Devices))
		for i := range used {
			switch rng.Intn(4) {
			case 0: // free
			case 1:
				used[i] = placement.Usage{MemMiB: m.Devices[i].MemoryMiB, Cores: 100, Tenants: 1}
			default:
				used[i] = placement.Usage{MemMiB: rng.Int63n(m.Devices[i].MemoryMiB + 1), Cores: rng.Intn(101), Tenants: rng.Intn(5)}
			}
		}
		for i := range m.Devices {
			got := x.fitMask(m, used, i, w)
			for k := range classes {
				if want := ShapeFits(m, used, &classes[k], i, w); (got>>uint(k)&1 != 0) != want {
					t.Fatalf("trial %d, charge %d MiB, device %d (%s, %+v), class %+v: index says %v, shapeFits %v",
						trial, m.ContextMiB, i, m.Devices[i].Model, used[i], classes[k], !want, want)
				}
			}
		}
	}
	if n := len(*x.bySize.Load()); n != 4 {
		t.Errorf("%d memory sizes indexed, want the 4 of the node", n)
	}
	if newFitIndexes(make([]Class, 65)) != nil {
		t.Error("an index over 65 classes: fit masks hold 64")
	}
}

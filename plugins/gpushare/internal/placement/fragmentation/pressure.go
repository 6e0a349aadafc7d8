// SPDX-License-Identifier: Apache-2.0

package fragmentation

import (
	"math"
	"sort"
	"strings"

	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
)

// Model pressure: how much of each GPU model's capacity the workload's
// model-constrained pods are expected to need.
//
// Fragmentation measures a node only against the shapes that may use its GPUs
// (Stats), so it does not see that a pod able to run anywhere takes, on a node of
// a model that other pods require, capacity those pods cannot find elsewhere: on the
// FGD paper's gpuspec workloads a third of the GPU pods require a model, half of them
// a T4, whose pods alone ask more than the cluster's T4s hold. Each placement is
// therefore also charged, per GPU share it takes of a device, that device model's
// pressure: the constrained demand that may land on the model per unit of its
// capacity, at most 1 (every unit taken is a unit a constrained pod will miss).
//
// For the window's shapes, grouped by model selection S: d_S is their share of the
// window's GPU demand, c_S the cluster's GPUs that S admits and C all GPUs. At an
// arrived demand equal to the cluster's capacity, S asks d_S·C GPUs of c_S, spread
// over them, so a model M carries
//
//	pressure(M) = min(1, Σ_{S admits M} d_S·C / c_S)
//
// Unconstrained shapes admit every model alike and are left out: they move no
// placement from one model to another. Without constrained pods in the window there
// is no pressure and nothing changes (the default openb trace). Placements between
// nodes of one model cost the same, so the term only decides between models: an
// unconstrained pod goes where constrained pods are least likely to need the GPUs, a
// pod that admits several models to the one least in demand.

// pressureEvery is the most observed pods a computed pressure serves before it is
// computed again (the cluster's capacity is read from every node's inventory then).
const pressureEvery = 128

// modelPressure is the pressure of each GPU model with any, by model name as the
// node agent reports it (models sorted, rho in (0,1]).
type modelPressure struct {
	models []string
	rho    []float64
}

// of is model's pressure (0 for a model without).
func (p *modelPressure) of(model string) float64 {
	for i, m := range p.models {
		if m == model {
			return p.rho[i]
		}
	}
	return 0
}

// cost is the pressure that allocation a puts on m: per device it takes a share of,
// the share (by the plugin's memory and cores weights) times the device model's
// pressure, in GPUs like fragmentation. nil costs nothing.
func (p *modelPressure) cost(m *nodemodel.Model, a *placement.Allocation, w *placement.Weights) float64 {
	if p == nil {
		return 0
	}
	var c float64
	for _, pl := range a.Placements {
		for k, i := range pl.Devices {
			rho := p.of(m.Devices[i].Model)
			if rho == 0 {
				continue
			}
			memFrac := 0.0
			if mem := m.Hot[i].MemoryMiB; mem > 0 {
				memFrac = math.Min(1, float64(pl.MemMiB[k])/float64(mem))
			}
			c += rho * (w.Memory*memFrac + w.Cores*float64(pl.Cores)/100) / (w.Memory + w.Cores)
		}
	}
	return c
}

// hasSelection reports whether the shape requires or excludes GPU models.
func (s *fragShape) hasSelection() bool {
	return len(s.modelInclude) > 0 || len(s.modelExclude) > 0
}

// modelCapacity is the cluster's healthy GPUs (MIG instances aside) per model, and
// their mean memory.
type modelCapacity struct {
	models  []string // sorted
	gpus    []int64
	total   int64
	meanMiB int64
}

// clusterCapacity reads every node's inventory in c.
func clusterCapacity(c *placement.Cache) modelCapacity {
	byModel := map[string]int64{}
	var total, mem int64
	c.EachModel(func(m *nodemodel.Model, _ []placement.Usage) {
		for i := range m.Devices {
			if !m.Hot[i].Healthy || m.Hot[i].MIG {
				continue
			}
			byModel[m.Devices[i].Model]++
			total++
			mem += m.Hot[i].MemoryMiB
		}
	})
	capa := modelCapacity{total: total}
	for name := range byModel {
		capa.models = append(capa.models, name)
	}
	sort.Strings(capa.models)
	for _, name := range capa.models {
		capa.gpus = append(capa.gpus, byModel[name])
	}
	if total > 0 {
		capa.meanMiB = mem / total
	}
	return capa
}

// computePressure is the model pressure of the shapes counted in counts (every shape
// of the window, with how many pods had it) on a cluster of capacity capa. Demand is
// summed in integer milli-GPUs, so the result does not depend on map order.
func computePressure(counts map[string]*shapeCount, capa modelCapacity, w *placement.Weights) *modelPressure {
	if capa.total == 0 || capa.meanMiB == 0 {
		return nil
	}
	type group struct {
		demand  int64
		include []string
		exclude []string
	}
	groups := map[string]*group{}
	var total int64
	for _, sc := range counts {
		s := &sc.shape
		memFrac := math.Min(1, float64(s.C.MemoryOn(capa.meanMiB))/float64(capa.meanMiB))
		share := (w.Memory*memFrac + w.Cores*float64(s.C.Cores)/100) / (w.Memory + w.Cores)
		d := int64(sc.n) * int64(s.C.GPUs) * int64(math.Round(1000*share))
		total += d
		if !s.hasSelection() {
			continue
		}
		key := strings.Join(s.modelInclude, ",") + "|" + strings.Join(s.modelExclude, ",")
		g := groups[key]
		if g == nil {
			g = &group{include: s.modelInclude, exclude: s.modelExclude}
			groups[key] = g
		}
		g.demand += d
	}
	if total == 0 || len(groups) == 0 {
		return nil
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	rho := make([]float64, len(capa.models))
	admits := make([]bool, len(capa.models))
	for _, key := range keys {
		g := groups[key]
		sel := placement.PodInfo{ModelInclude: g.include, ModelExclude: g.exclude}
		var gpus int64
		for j, name := range capa.models {
			admits[j] = sel.Eligible(&nodemodel.Device{Model: name})
			if admits[j] {
				gpus += capa.gpus[j]
			}
		}
		if gpus == 0 {
			continue // nothing can serve these pods; they move no placement
		}
		perUnit := float64(g.demand) / float64(total) * float64(capa.total) / float64(gpus)
		for j := range capa.models {
			if admits[j] {
				rho[j] += perUnit
			}
		}
	}
	p := &modelPressure{}
	for j, name := range capa.models {
		if rho[j] > 0 {
			p.models = append(p.models, name)
			p.rho = append(p.rho, math.Min(1, rho[j]))
		}
	}
	if len(p.models) == 0 {
		return nil
	}
	return p
}

// Bind gives the workload model the cluster whose capacity model pressure is measured
// against and the plugin's weights. Without it there is no pressure.
func (w *WorkloadModel) Bind(c *placement.Cache, wt *placement.Weights) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cluster, w.weights = c, wt
}

// PressureNow is the window's model pressure, computed again once as many pods have
// been observed as the window held when it was last computed, at most pressureEvery
// (a window still filling is followed closely); nil while no pod of the window has a
// model selection.
func (w *WorkloadModel) PressureNow() *modelPressure {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.selective == 0 || w.cluster == nil || w.weights == nil {
		w.pressure, w.pressureAge = nil, pressureEvery
		return nil
	}
	if w.pressureAge >= min(pressureEvery, w.pressureLen) {
		w.pressure = computePressure(w.counts, clusterCapacity(w.cluster), w.weights)
		w.pressureAge, w.pressureLen = 0, len(w.ring)
	}
	return w.pressure
}

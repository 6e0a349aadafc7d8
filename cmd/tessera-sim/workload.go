// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/csv"
	"fmt"
	"math"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
)

// The FGD paper's workload varieties (its §6.3–6.5, the artifact's
// openb_pod_list_{gpuspec,multigpu,gpushare,cpu}NN.csv), built from a pod list in
// memory. docs/simulator.md says where each definition comes from.
//
//	gpuspecNN   NN% of the GPU pods (by count) require a GPU model set
//	multigpuNN  pods asking 2, 4 or 8 GPUs carry NN% of the GPU demand
//	gpushareNN  pods asking a fraction of one GPU carry NN% of the GPU demand
//	cpuNNN      CPU-only pods are NNN/10 % of all pods (cpu050: 5%, cpu250: 25%)
//
// The transformation is deterministic for a pod list, a node list and a seed.

// variety is a parsed -workload value.
type variety struct {
	kind    string  // "default", "gpuspec", "multigpu", "gpushare", "cpu"
	name    string  // as given, e.g. "gpuspec33"
	percent float64 // the defining proportion, 0..100
}

// parseVariety parses a -workload value: default (or empty), gpuspecNN, multigpuNN,
// gpushareNN (NN in 0..100) or cpuNNN (tenths of a percent, 000..999).
func parseVariety(s string) (variety, error) {
	if s == "" || s == "default" {
		return variety{kind: "default", name: "default"}, nil
	}
	for _, k := range []string{"gpuspec", "multigpu", "gpushare", "cpu"} {
		num, ok := strings.CutPrefix(s, k)
		if !ok || num == "" {
			continue
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 {
			break
		}
		v := variety{kind: k, name: s, percent: float64(n)}
		if k == "cpu" {
			if len(num) != 3 || n >= 1000 {
				break
			}
			v.percent = float64(n) / 10
		} else if n > 100 {
			break
		}
		return v, nil
	}
	return variety{}, fmt.Errorf("unknown workload %q: default, gpuspecNN, multigpuNN, gpushareNN (NN a percentage) or cpuNNN (tenths of a percent, e.g. cpu050)", s)
}

// podClass of a pod-list row: "cpu", "share" (a fraction of one GPU), "whole" (one
// whole GPU) or "multi" (2 or more GPUs). Rows that do not parse are "cpu"; the pod
// list is parsed (and rejected) after the transformation anyway.
func podClass(row map[string]string) string {
	n, _ := strconv.Atoi(row["num_gpu"])
	m, _ := strconv.Atoi(row["gpu_milli"])
	switch {
	case n <= 0:
		return "cpu"
	case n > 1:
		return "multi"
	case m < 1000:
		return "share"
	default:
		return "whole"
	}
}

// rowDemand is a row's GPU demand in milli-GPUs.
func rowDemand(row map[string]string) int64 {
	n, _ := strconv.ParseInt(row["num_gpu"], 10, 64)
	m, _ := strconv.ParseInt(row["gpu_milli"], 10, 64)
	if n <= 0 {
		return 0
	}
	return n * m
}

// drawer hands out the rows of a pool in a seeded random order, starting a new order
// when the pool is used up: a variety close to the pod list it comes from keeps most of
// its pods once, and one far from it repeats them evenly.
type drawer struct {
	rng   *rand.Rand
	pool  []map[string]string
	order []int
}

func (d *drawer) next() map[string]string {
	if len(d.order) == 0 {
		d.order = d.rng.Perm(len(d.pool))
	}
	i := d.order[0]
	d.order = d.order[1:]
	return d.pool[i]
}

func copyRow(row map[string]string) map[string]string {
	c := make(map[string]string, len(row))
	for k, v := range row {
		c[k] = v
	}
	return c
}

// specChoice is a GPU model set a gpuspec variety may require, with its weight.
type specChoice struct {
	models []string
	weight int
}

// specChoices are the model sets of the FGD artifact's gpuspec lists and how often
// they occur: counted on 376 constrained pods in five stretches spread over the
// simulator repository's data/csv/openb_pod_list_gpuspec33_cpu0.csv (rows 0-219,
// 1664-1885, 3456-3676, 5246-5462 and 6839-7063 of its 7,064 GPU pods). They follow
// what production pods asked, not the cluster's capacity (G2 is 71% of the GPUs but
// 12% of the constraints; T4 is 14% of the GPUs and 53% of them).
var specChoices = []specChoice{
	{[]string{"T4"}, 201},
	{[]string{"P100"}, 48},
	{[]string{"G2"}, 45},
	{[]string{"V100M16", "V100M32"}, 30},
	{[]string{"P100", "V100M16", "V100M32"}, 15},
	{[]string{"G3"}, 13},
	{[]string{"G2", "P100", "T4", "V100M16", "V100M32"}, 10},
	{[]string{"P100", "T4", "V100M16", "V100M32"}, 8},
	{[]string{"V100M32"}, 2},
	{[]string{"A10", "G2", "T4", "V100M16", "V100M32"}, 2},
	{[]string{"P100", "V100M16"}, 1},
	{[]string{"A10", "T4"}, 1},
}

// applyVariety returns the pod-list rows of variety v built from rows (nodes: the
// cluster, for the GPU models a gpuspec variety may require). The default variety
// returns rows unchanged; the others return new rows and leave rows alone.
func applyVariety(rows []map[string]string, nodes []traceNode, v variety, seed int64) ([]map[string]string, error) {
	rng := rand.New(rand.NewSource(seed))
	var gpuRows, cpuRows []map[string]string
	for _, r := range rows {
		if podClass(r) == "cpu" {
			cpuRows = append(cpuRows, r)
		} else {
			gpuRows = append(gpuRows, r)
		}
	}
	switch v.kind {
	case "default":
		return rows, nil
	case "gpuspec":
		return applyGPUSpec(rows, nodes, v.percent, rng)
	case "cpu":
		// The GPU pods stay; CPU-only pods are drawn until they are the given share of
		// all pods.
		q := v.percent / 100
		if q > 0 && len(cpuRows) == 0 {
			return nil, fmt.Errorf("workload %s: the pod list has no CPU-only pods to draw", v.name)
		}
		c := int(math.Round(q * float64(len(gpuRows)) / (1 - q)))
		out := make([]map[string]string, 0, len(gpuRows)+c)
		out = append(out, gpuRows...)
		d := &drawer{rng: rng, pool: cpuRows}
		for i := 0; i < c; i++ {
			out = append(out, d.next())
		}
		return renamed(out), nil
	case "multigpu", "gpushare":
		// The CPU-only pods stay; as many GPU pods as the list has are drawn, each from
		// the class the variety is about while that class's share of the GPU demand
		// drawn so far is below the target, else from the other GPU pods.
		want := "multi"
		if v.kind == "gpushare" {
			want = "share"
		}
		var in, rest []map[string]string
		for _, r := range gpuRows {
			if podClass(r) == want {
				in = append(in, r)
			} else {
				rest = append(rest, r)
			}
		}
		p := v.percent / 100
		if (p > 0 && len(in) == 0) || (p < 1 && len(rest) == 0) {
			return nil, fmt.Errorf("workload %s: the pod list lacks the GPU pods to draw it from", v.name)
		}
		din, drest := &drawer{rng: rng, pool: in}, &drawer{rng: rng, pool: rest}
		out := make([]map[string]string, 0, len(rows))
		out = append(out, cpuRows...)
		var demIn, demAll int64
		for i := 0; i < len(gpuRows); i++ {
			pickIn := p >= 1 || (p > 0 && (demAll == 0 || float64(demIn) < p*float64(demAll)))
			var r map[string]string
			if pickIn {
				r = din.next()
				demIn += rowDemand(r)
			} else {
				r = drest.next()
			}
			demAll += rowDemand(r)
			out = append(out, r)
		}
		return renamed(out), nil
	}
	return nil, fmt.Errorf("unknown workload kind %q", v.kind)
}

// renamed copies rows, naming them openb-pod-0000, -0001, … in order (a row may be
// drawn more than once), as the artifact's sampled lists are named.
func renamed(rows []map[string]string) []map[string]string {
	out := make([]map[string]string, len(rows))
	for i, r := range rows {
		c := copyRow(r)
		c["name"] = fmt.Sprintf("openb-pod-%04d", i)
		out[i] = c
	}
	return out
}

// applyGPUSpec gives round(p% of the GPU pods), picked at random, a GPU model set drawn
// from specChoices among the sets the cluster can serve for the pod: every model of the
// set is in the node list and one of its nodes has as many GPUs as the pod asks. The
// pods and their order are the list's.
func applyGPUSpec(rows []map[string]string, nodes []traceNode, percent float64, rng *rand.Rand) ([]map[string]string, error) {
	maxGPUs := map[string]int{}
	for _, n := range nodes {
		if n.gpus > maxGPUs[n.model] {
			maxGPUs[n.model] = n.gpus
		}
	}
	var gpuIdx []int
	for i, r := range rows {
		if podClass(r) != "cpu" {
			gpuIdx = append(gpuIdx, i)
		}
	}
	k := int(math.Round(percent / 100 * float64(len(gpuIdx))))
	out := make([]map[string]string, len(rows))
	copy(out, rows)
	for _, j := range rng.Perm(len(gpuIdx))[:k] {
		i := gpuIdx[j]
		n, _ := strconv.Atoi(rows[i]["num_gpu"])
		var fit []specChoice
		total := 0
		for _, c := range specChoices {
			ok := true
			served := false
			for _, m := range c.models {
				if g, in := maxGPUs[m]; !in {
					ok = false
				} else if g >= n {
					served = true
				}
			}
			if ok && served {
				fit = append(fit, c)
				total += c.weight
			}
		}
		if total == 0 {
			return nil, fmt.Errorf("workload gpuspec: no GPU model set of the table fits a %d-GPU pod on this node list", n)
		}
		x := rng.Intn(total)
		for _, c := range fit {
			if x < c.weight {
				r := copyRow(rows[i])
				r["gpu_spec"] = strings.Join(c.models, "|")
				out[i] = r
				break
			}
			x -= c.weight
		}
	}
	return out, nil
}

// openbPodColumns is the column order of the openb pod lists.
var openbPodColumns = []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"}

// writePodCSV writes rows as an openb pod list: its columns first, then any others the
// rows carry, in name order.
func writePodCSV(path string, rows []map[string]string) error {
	cols := append([]string(nil), openbPodColumns...)
	known := map[string]bool{}
	for _, c := range cols {
		known[c] = true
	}
	var extra []string
	for _, r := range rows {
		for c := range r {
			if !known[c] {
				known[c] = true
				extra = append(extra, c)
			}
		}
	}
	sort.Strings(extra)
	cols = append(cols, extra...)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(cols)
	rec := make([]string, len(cols))
	for _, r := range rows {
		for i, c := range cols {
			rec[i] = r[c]
		}
		_ = w.Write(rec)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

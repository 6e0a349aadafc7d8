// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/test/fixtures"
)

// traceNode is one row of an openb node list (sn,cpu_milli,memory_mib,gpu,model).
type traceNode struct {
	name      string
	cpuMilli  int64
	memoryMiB int64
	gpus      int
	model     string
}

// tracePod is one row of an openb pod list. Only the request columns matter: the
// replay follows the FGD protocol, where pods arrive in a shuffled order and never
// leave, so the timestamps are ignored.
type tracePod struct {
	name      string
	cpuMilli  int64
	memoryMiB int64
	numGPU    int
	gpuMilli  int64 // per GPU, 1..1000; 0 for CPU-only pods
	gpuSpec   []string
}

// kind is the pod's class in the paper's breakdown of failures.
func (p *tracePod) kind() string {
	switch {
	case p.numGPU == 0:
		return "cpu"
	case p.gpuMilli < 1000:
		return "fraction"
	default:
		return fmt.Sprintf("%dgpu", p.numGPU)
	}
}

// demandMilli is the pod's GPU demand in milli-GPUs (num_gpu × gpu_milli).
func (p *tracePod) demandMilli() int64 { return int64(p.numGPU) * p.gpuMilli }

// modelMemoryMiB is the device memory each trace model gets, as NVML reports it for
// the public models. G1, G2 and G3 are undisclosed in the trace; they get 32 GiB. The
// value does not change any placement: the replay asks memory as a percentage of the
// GPU (see podObject), exactly as the trace's gpu_milli is a share of a GPU whatever
// its model.
var modelMemoryMiB = map[string]int64{
	"P100":    16280,
	"T4":      15109,
	"V100M16": 16160,
	"V100M32": 32510,
	"A10":     22731,
	"A100":    81251,
	"G1":      32768,
	"G2":      32768,
	"G3":      32768,
}

// nvlinkModels are the models whose 4- and 8-GPU servers are built with NVLink (SXM
// boards); the others are PCIe cards. 8-GPU servers get two NVLink islands of four, the
// common layout, so multi-GPU pods exercise the topology code.
var nvlinkModels = map[string]bool{"V100M16": true, "V100M32": true, "A100": true, "G1": true, "G2": true, "G3": true}

// readCSV returns the rows of a headed CSV file as maps from column name to value.
func readCSV(path string) ([]map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: reading header: %w", path, err)
	}
	for i := range header {
		header[i] = strings.TrimSpace(header[i])
	}
	var rows []map[string]string
	for line := 2; ; line++ {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		row := make(map[string]string, len(header))
		for i, h := range header {
			if i < len(rec) {
				row[h] = strings.TrimSpace(rec[i])
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func intField(row map[string]string, col string, path string, line int) (int64, error) {
	s, ok := row[col]
	if !ok {
		return 0, fmt.Errorf("%s: no column %q", path, col)
	}
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s:%d: column %s: %w", path, line, col, err)
	}
	return v, nil
}

// readNodes reads a node list; nodes without GPUs are kept (they take CPU pods).
func readNodes(path string) ([]traceNode, error) {
	rows, err := readCSV(path)
	if err != nil {
		return nil, err
	}
	out := make([]traceNode, 0, len(rows))
	for i, row := range rows {
		line := i + 2
		n := traceNode{name: row["sn"], model: row["model"]}
		if n.name == "" {
			return nil, fmt.Errorf("%s:%d: empty sn", path, line)
		}
		if n.cpuMilli, err = intField(row, "cpu_milli", path, line); err != nil {
			return nil, err
		}
		if n.memoryMiB, err = intField(row, "memory_mib", path, line); err != nil {
			return nil, err
		}
		g, err := intField(row, "gpu", path, line)
		if err != nil {
			return nil, err
		}
		n.gpus = int(g)
		if n.gpus > 0 {
			if _, ok := modelMemoryMiB[n.model]; !ok {
				return nil, fmt.Errorf("%s:%d: GPU model %q has no memory size in the replay's table", path, line, n.model)
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// readPods reads a pod list in the openb format.
func readPods(path string) ([]tracePod, error) {
	rows, err := readCSV(path)
	if err != nil {
		return nil, err
	}
	return parsePods(rows, path)
}

// parsePods parses the rows of a pod list (as readCSV returns them); path names the
// list in errors.
func parsePods(rows []map[string]string, path string) ([]tracePod, error) {
	var err error
	out := make([]tracePod, 0, len(rows))
	for i, row := range rows {
		line := i + 2
		p := tracePod{name: row["name"]}
		if p.name == "" {
			p.name = fmt.Sprintf("pod-%05d", i)
		}
		if p.cpuMilli, err = intField(row, "cpu_milli", path, line); err != nil {
			return nil, err
		}
		if p.memoryMiB, err = intField(row, "memory_mib", path, line); err != nil {
			return nil, err
		}
		n, err := intField(row, "num_gpu", path, line)
		if err != nil {
			return nil, err
		}
		p.numGPU = int(n)
		if p.gpuMilli, err = intField(row, "gpu_milli", path, line); err != nil {
			return nil, err
		}
		if p.numGPU > 0 && (p.gpuMilli < 1 || p.gpuMilli > 1000) {
			return nil, fmt.Errorf("%s:%d: gpu_milli %d out of range 1..1000", path, line, p.gpuMilli)
		}
		if p.numGPU > 1 && p.gpuMilli != 1000 {
			return nil, fmt.Errorf("%s:%d: %d GPUs of %d milli each: fractions are only defined for one GPU", path, line, p.numGPU, p.gpuMilli)
		}
		if p.numGPU == 0 {
			p.gpuMilli = 0
		}
		for _, s := range strings.Split(row["gpu_spec"], "|") {
			if s = strings.TrimSpace(s); s != "" {
				p.gpuSpec = append(p.gpuSpec, s)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// nodeObject is the Node a Tessera node agent would publish for a trace node: CPU and
// host memory as allocatable, the GPUs as an inventory annotation.
func nodeObject(n *traceNode) (*v1.Node, error) {
	alloc := v1.ResourceList{
		v1.ResourceCPU:    *resource.NewMilliQuantity(n.cpuMilli, resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(n.memoryMiB<<20, resource.BinarySI),
		// The trace has no pod limit; the real kubelet default (110) would bind before
		// any GPU or CPU does on the biggest nodes, which the trace never saw.
		v1.ResourcePods: *resource.NewQuantity(10000, resource.DecimalSI),
	}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   n.name,
			UID:    types.UID("node-" + n.name),
			Labels: map[string]string{"kubernetes.io/hostname": n.name},
		},
		Status: v1.NodeStatus{Capacity: alloc, Allocatable: alloc,
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}},
	}
	if n.gpus == 0 {
		return node, nil
	}
	mem := modelMemoryMiB[n.model]
	var inv *api.NodeInventory
	switch {
	case nvlinkModels[n.model] && n.gpus >= 4:
		inv = fixtures.NVLinkNode(n.name, n.gpus, 4, n.model, mem)
	default:
		inv = fixtures.PCIeNode(n.name, n.gpus, n.model, mem)
	}
	raw, err := api.EncodeInventory(inv)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.name, err)
	}
	node.Annotations = map[string]string{api.AnnotationInventory: raw}
	return node, nil
}

// podObject is the pod a user would submit for a trace pod. A share s = gpu_milli/1000
// of one GPU becomes gpu-memory-percent = gpu-cores = 100·s (every share in the openb
// lists is a multiple of 10 milli, so this is exact; others are rounded to the nearest
// percent, at least 1). A whole GPU asks the whole memory and 100% cores (exclusive);
// num_gpu > 1 asks that many whole GPUs. gpu_spec becomes the model include list.
// askMemoryMiB turns a share's gpu-memory-percent into gpu-memory in MiB, what a
// ResourceClaim of the same share asks (memoryTable.shareMiB).
func askMemoryMiB(pod *v1.Pod, p *tracePod, t *memoryTable) {
	names := api.DefaultResourceNames()
	limits := pod.Spec.Containers[0].Resources.Limits
	pct, ok := limits[names.GPUMemoryPercent]
	if !ok {
		return
	}
	delete(limits, names.GPUMemoryPercent)
	limits[names.GPUMemory] = *resource.NewQuantity(t.shareMiB(p, pct.Value()), resource.DecimalSI)
}

func podObject(p *tracePod, name string, uid int) *v1.Pod {
	req := v1.ResourceList{
		v1.ResourceCPU:    *resource.NewMilliQuantity(p.cpuMilli, resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(p.memoryMiB<<20, resource.BinarySI),
	}
	names := api.DefaultResourceNames()
	limits := v1.ResourceList{}
	for k, v := range req {
		limits[k] = v
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(fmt.Sprintf("pod-%d", uid))},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main",
			Resources: v1.ResourceRequirements{Requests: req, Limits: limits}}}},
	}
	if p.numGPU == 0 {
		return pod
	}
	limits[names.GPU] = *resource.NewQuantity(int64(p.numGPU), resource.DecimalSI)
	if p.gpuMilli < 1000 {
		pct := sharePercent(p.gpuMilli)
		limits[names.GPUMemoryPercent] = *resource.NewQuantity(pct, resource.DecimalSI)
		limits[names.GPUCores] = *resource.NewQuantity(pct, resource.DecimalSI)
	} else {
		limits[names.GPUCores] = *resource.NewQuantity(100, resource.DecimalSI)
	}
	if len(p.gpuSpec) > 0 {
		pod.Annotations = map[string]string{api.AnnotationModelInclude: strings.Join(p.gpuSpec, ",")}
	}
	return pod
}

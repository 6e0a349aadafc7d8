// SPDX-License-Identifier: Apache-2.0

// Package metrics holds the node agent's Prometheus metrics: per GPU allocated versus
// used memory and compute, per container usage versus limit, watchdog actions,
// refused containers, the inventory's age and the agent's readiness.
//
// GPU series carry the labels DCGM exporter uses, so that the two join without
// relabelling: gpu is the GPU's index (as a string) and UUID its UUID. Values are in
// base units: bytes, and ratios (0-1) for shares of a GPU.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tessera-dev/tessera/api"
)

// Metrics is the agent's metric set, registered on its own registry. Callers set it
// through the methods below, which own the labels and the units.
type Metrics struct {
	Registry *prometheus.Registry

	gpuMemoryTotal     *prometheus.GaugeVec
	gpuMemoryAllocated *prometheus.GaugeVec
	gpuMemoryUsed      *prometheus.GaugeVec
	gpuCoresAllocated  *prometheus.GaugeVec
	gpuUtilization     *prometheus.GaugeVec
	gpuHealthy         *prometheus.GaugeVec
	gpuUnattributed    *prometheus.GaugeVec

	containerMemoryUsed  *prometheus.GaugeVec
	containerMemoryLimit *prometheus.GaugeVec
	containerSM          *prometheus.GaugeVec
	containerCoresLimit  *prometheus.GaugeVec

	watchdogActions   *prometheus.CounterVec
	containersRefused prometheus.Counter
}

var (
	gpuLabels       = []string{"gpu", "UUID"}
	containerLabels = []string{"namespace", "pod", "container", "gpu", "UUID"}
)

const mib = 1 << 20

// New creates and registers every metric. inventoryAge, when set, is sampled at scrape
// time for tessera_inventory_age_seconds.
func New(inventoryAge func() (time.Duration, bool)) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	g := func(name, help string, labels []string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "tessera", Name: name, Help: help}, labels)
		m.Registry.MustRegister(v)
		return v
	}
	m.gpuMemoryTotal = g("gpu_memory_total_bytes", "Device memory of the GPU.", append(gpuLabels, "modelName"))
	m.gpuMemoryAllocated = g("gpu_memory_allocated_bytes", "Device memory granted to bound containers on the GPU.", gpuLabels)
	m.gpuMemoryUsed = g("gpu_memory_used_bytes", "Device memory in use on the GPU, as NVML reports it.", gpuLabels)
	m.gpuCoresAllocated = g("gpu_cores_allocated_ratio", "Share of the GPU's compute (0-1) granted to bound containers.", gpuLabels)
	m.gpuUtilization = g("gpu_utilization_ratio", "GPU core utilisation (0-1), as NVML reports it.", gpuLabels)
	m.gpuHealthy = g("gpu_healthy", "1 when the GPU is healthy.", gpuLabels)
	m.gpuUnattributed = g("gpu_unattributed_memory_bytes", "Device memory the watchdog can attribute to no container: held by processes that are gone, of another PID namespace or outside the pods Tessera bound GPUs to, whose device files no single container holds.", gpuLabels)
	m.containerMemoryUsed = g("container_gpu_memory_used_bytes", "Device memory the container's processes hold on the GPU.", containerLabels)
	m.containerMemoryLimit = g("container_gpu_memory_limit_bytes", "Device memory the container may hold on the GPU.", containerLabels)
	m.containerSM = g("container_gpu_sm_ratio", "Share of the GPU's SMs (0-1) the container's processes used in the last sample.", containerLabels)
	m.containerCoresLimit = g("container_gpu_cores_limit_ratio", "Share of the GPU's compute (0-1) granted to the container (0: not enforced).", containerLabels)
	m.watchdogActions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "tessera", Name: "watchdog_actions_total",
		Help: "Actions the usage watchdog took against containers above their limits."}, []string{"action", "namespace", "pod", "container"})
	m.Registry.MustRegister(m.watchdogActions)
	m.containersRefused = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tessera", Name: "containers_refused_total",
		Help: "Containers refused at creation (asked for GPUs without a valid assignment)."})
	m.Registry.MustRegister(m.containersRefused)
	if inventoryAge != nil {
		m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "tessera", Name: "inventory_age_seconds",
			Help: "Seconds since the GPU inventory was last published (-1: never)."}, func() float64 {
			age, ok := inventoryAge()
			if !ok {
				return -1
			}
			return age.Seconds()
		}))
	}
	m.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// SetReadiness registers tessera_agent_ready, sampled from ready at scrape time (the
// same checks as /readyz).
func (m *Metrics) SetReadiness(ready func() bool) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "tessera", Name: "agent_ready",
		Help: "1 when the agent passes its readiness checks (/readyz)."}, func() float64 {
		if ready() {
			return 1
		}
		return 0
	}))
}

// SetInventory records the per-GPU static facts and health.
func (m *Metrics) SetInventory(inv *api.NodeInventory) {
	m.gpuMemoryTotal.Reset()
	m.gpuHealthy.Reset()
	for _, g := range inv.GPUs {
		idx := strconv.Itoa(g.Index)
		m.gpuMemoryTotal.WithLabelValues(idx, g.UUID, g.Model).Set(float64(g.MemoryMiB) * mib)
		h := 0.0
		if g.Healthy {
			h = 1
		}
		m.gpuHealthy.WithLabelValues(idx, g.UUID).Set(h)
	}
}

// GPUSample is one GPU's figures at one poll. Index is -1 when the GPU is not among
// the polled ones (a grant naming a GPU that NVML no longer reports).
type GPUSample struct {
	UUID  string
	Index int
	// Polled is false for a GPU known only from grants: only its grants are set.
	Polled          bool
	UsedMiB         int64
	UtilPercent     int // -1: unknown
	UnattributedMiB int64
	AllocatedMiB    int64
	AllocatedCores  int
}

// ContainerSample is one bound container's use of one GPU at one poll.
type ContainerSample struct {
	Namespace, Pod, Container string
	UUID                      string
	Index                     int // -1: unknown
	UsedMiB, LimitMiB         int64
	SMPercent                 int
	CoresLimit                int // percent; 0: not enforced
}

// SetUsage replaces the per-GPU and per-container usage series with one poll's.
func (m *Metrics) SetUsage(gpus []GPUSample, containers []ContainerSample) {
	for _, v := range []*prometheus.GaugeVec{m.gpuMemoryUsed, m.gpuUtilization, m.gpuUnattributed, m.gpuMemoryAllocated,
		m.gpuCoresAllocated, m.containerMemoryUsed, m.containerMemoryLimit, m.containerSM, m.containerCoresLimit} {
		v.Reset()
	}
	for _, g := range gpus {
		l := []string{index(g.Index), g.UUID}
		if g.Polled {
			m.gpuMemoryUsed.WithLabelValues(l...).Set(float64(g.UsedMiB) * mib)
			if g.UtilPercent >= 0 {
				m.gpuUtilization.WithLabelValues(l...).Set(float64(g.UtilPercent) / 100)
			}
			m.gpuUnattributed.WithLabelValues(l...).Set(float64(g.UnattributedMiB) * mib)
		}
		m.gpuMemoryAllocated.WithLabelValues(l...).Set(float64(g.AllocatedMiB) * mib)
		m.gpuCoresAllocated.WithLabelValues(l...).Set(float64(g.AllocatedCores) / 100)
	}
	for _, c := range containers {
		l := []string{c.Namespace, c.Pod, c.Container, index(c.Index), c.UUID}
		m.containerMemoryUsed.WithLabelValues(l...).Set(float64(c.UsedMiB) * mib)
		m.containerMemoryLimit.WithLabelValues(l...).Set(float64(c.LimitMiB) * mib)
		m.containerSM.WithLabelValues(l...).Set(float64(c.SMPercent) / 100)
		m.containerCoresLimit.WithLabelValues(l...).Set(float64(c.CoresLimit) / 100)
	}
}

// WatchdogAction counts one watchdog action against a container.
func (m *Metrics) WatchdogAction(action, namespace, pod, container string) {
	m.watchdogActions.WithLabelValues(action, namespace, pod, container).Inc()
}

// ContainerRefused counts one container refused at creation.
func (m *Metrics) ContainerRefused() { m.containersRefused.Inc() }

// index is the gpu label: the index as DCGM writes it, empty when unknown.
func index(i int) string {
	if i < 0 {
		return ""
	}
	return strconv.Itoa(i)
}

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

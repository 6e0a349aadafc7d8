// Package metrics holds the node agent's Prometheus metrics: per GPU allocated versus
// used memory and compute, per container usage versus limit, watchdog actions,
// refused containers and the inventory's age.
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

// Metrics is the agent's metric set, registered on its own registry.
type Metrics struct {
	Registry *prometheus.Registry

	GPUMemoryTotal     *prometheus.GaugeVec
	GPUMemoryAllocated *prometheus.GaugeVec
	GPUMemoryUsed      *prometheus.GaugeVec
	GPUCoresAllocated  *prometheus.GaugeVec
	GPUUtilization     *prometheus.GaugeVec
	GPUHealthy         *prometheus.GaugeVec
	GPUUnattributed    *prometheus.GaugeVec

	ContainerMemoryUsed  *prometheus.GaugeVec
	ContainerMemoryLimit *prometheus.GaugeVec
	ContainerSM          *prometheus.GaugeVec
	ContainerCoresLimit  *prometheus.GaugeVec

	WatchdogActions   *prometheus.CounterVec
	ContainersRefused prometheus.Counter
}

var (
	gpuLabels       = []string{"gpu", "index"}
	containerLabels = []string{"namespace", "pod", "container", "gpu"}
)

// New creates and registers every metric. inventoryAge, when set, is sampled at scrape
// time for tessera_inventory_age_seconds.
func New(inventoryAge func() (time.Duration, bool)) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	g := func(name, help string, labels []string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "tessera", Name: name, Help: help}, labels)
		m.Registry.MustRegister(v)
		return v
	}
	m.GPUMemoryTotal = g("gpu_memory_total_mib", "Device memory of the GPU.", append(gpuLabels, "model"))
	m.GPUMemoryAllocated = g("gpu_memory_allocated_mib", "Device memory granted to bound containers on the GPU.", gpuLabels)
	m.GPUMemoryUsed = g("gpu_memory_used_mib", "Device memory in use on the GPU, as NVML reports it.", gpuLabels)
	m.GPUCoresAllocated = g("gpu_cores_allocated_percent", "Compute share granted to bound containers on the GPU.", gpuLabels)
	m.GPUUtilization = g("gpu_utilization_percent", "GPU core utilisation, as NVML reports it.", gpuLabels)
	m.GPUHealthy = g("gpu_healthy", "1 when the GPU is healthy.", gpuLabels)
	m.GPUUnattributed = g("gpu_unattributed_memory_mib", "Device memory held by processes that belong to no bound container.", gpuLabels)
	m.ContainerMemoryUsed = g("container_gpu_memory_used_mib", "Device memory the container's processes hold on the GPU.", containerLabels)
	m.ContainerMemoryLimit = g("container_gpu_memory_limit_mib", "Device memory the container may hold on the GPU.", containerLabels)
	m.ContainerSM = g("container_gpu_sm_percent", "Share of the GPU's SMs the container's processes used in the last sample.", containerLabels)
	m.ContainerCoresLimit = g("container_gpu_cores_limit_percent", "Compute share granted to the container on the GPU (0: not enforced).", containerLabels)
	m.WatchdogActions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "tessera", Name: "watchdog_actions_total",
		Help: "Actions the usage watchdog took against containers above their memory limit."}, []string{"action", "namespace", "pod", "container"})
	m.Registry.MustRegister(m.WatchdogActions)
	m.ContainersRefused = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tessera", Name: "containers_refused_total",
		Help: "Containers refused at creation (asked for GPUs without a valid assignment)."})
	m.Registry.MustRegister(m.ContainersRefused)
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

// SetInventory records the per-GPU static facts and health.
func (m *Metrics) SetInventory(inv *api.NodeInventory) {
	m.GPUMemoryTotal.Reset()
	m.GPUHealthy.Reset()
	for _, g := range inv.GPUs {
		idx := itoa(g.Index)
		m.GPUMemoryTotal.WithLabelValues(g.UUID, idx, g.Model).Set(float64(g.MemoryMiB))
		h := 0.0
		if g.Healthy {
			h = 1
		}
		m.GPUHealthy.WithLabelValues(g.UUID, idx).Set(h)
	}
}

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

func itoa(i int) string { return strconv.Itoa(i) }

// SPDX-License-Identifier: Apache-2.0

package gpushare

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement/fragmentation"
)

// The plugin's metrics live in component-base's legacy registry, which kube-scheduler
// serves on its /metrics beside its own (as the in-tree plugins' do). Nothing here runs
// per node: decisions are counted once per pod at the extension point that decides,
// and the cache and fragmentation gauges are computed when Prometheus scrapes.
const (
	metricsNamespace = "tessera"
	metricsSubsystem = "scheduler"
)

// Results and reason classes of tessera_scheduler_decisions_total.
const (
	resultPlaced        = "placed"
	resultUnschedulable = "unschedulable"
	resultError         = "error"

	// reasonInvalidRequest: the pod's GPU request or annotations do not parse.
	reasonInvalidRequest = "invalid_request"
	// reasonCapacity: some node has the GPUs the pod may use, but not enough room
	// on them now (memory, cores, tenants, locality).
	reasonCapacity = "gpu_capacity"
	// reasonSelection: no node has GPUs that match what the pod asks (model or UUID
	// selection, count, size, health).
	reasonSelection = "gpu_selection"
	// reasonInventory: the nodes this plugin turned down have no usable GPU inventory
	// (no agent, an invalid or stale one).
	reasonInventory = "gpu_inventory"
	// reasonOther: no node was turned down by this plugin; other plugins (CPU,
	// taints, affinity) left none.
	reasonOther = "other_plugins"
	// reasonReserveConflict: the placement Filter found was taken before Reserve.
	reasonReserveConflict = "reserve_conflict"
	// reasonNotSynced: the GPU cache has not synced with the API server yet.
	reasonNotSynced = "cache_not_synced"
)

var (
	decisions = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "decisions_total",
		Help: "Scheduling decisions of TesseraGPUShare for GPU pods, by profile, node and GPU policy, and result " +
			"(placed: GPUs reserved; unschedulable or error, with a reason class).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"profile", "node_policy", "device_policy", "result", "reason"})

	reserveConflicts = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "reserve_conflicts_total",
		Help:           "Reserves that found the placement Filter chose already taken (the pod is retried).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"profile"})
)

var registerMetrics sync.Once

// RegisterMetrics registers the plugin's metrics in the legacy registry. Every
// factory calls it; it is exported for tools that serve the registry themselves.
func RegisterMetrics() {
	registerMetrics.Do(func() {
		legacyregistry.MustRegister(decisions, reserveConflicts)
		legacyregistry.CustomMustRegister(newCacheCollector(livePlugins))
	})
}

// decide counts one decision for a pod whose GPU policy is devicePolicy.
func (pl *Plugin) decide(devicePolicy Policy, result, reason string) {
	decisions.WithLabelValues(pl.profile, string(pl.args.NodePolicy), string(devicePolicy), result, reason).Inc()
}

// The plugins of running schedulers (those with informers), for the collector.
var (
	liveMu  sync.Mutex
	livePls = map[*Plugin]struct{}{}
)

func trackPlugin(pl *Plugin) (untrack func()) {
	liveMu.Lock()
	livePls[pl] = struct{}{}
	liveMu.Unlock()
	return func() {
		liveMu.Lock()
		delete(livePls, pl)
		liveMu.Unlock()
	}
}

func livePlugins() []*Plugin {
	liveMu.Lock()
	defer liveMu.Unlock()
	out := make([]*Plugin, 0, len(livePls))
	for pl := range livePls {
		out = append(out, pl)
	}
	return out
}

// cacheCollector reports the GPU cache and the cluster's fragmentation at scrape
// time. Its cost is one pass over the cached nodes per cache and per profile, under
// each node's read lock in turn; Filter never waits on it for longer than one node.
type cacheCollector struct {
	metrics.BaseStableCollector
	plugins func() []*Plugin
}

var (
	descCacheNodes = metrics.NewDesc("tessera_scheduler_cache_nodes",
		"Nodes with a usable GPU inventory in the plugin's cache.", nil, nil, metrics.ALPHA, "")
	descCacheGPUs = metrics.NewDesc("tessera_scheduler_cache_gpus",
		"GPUs in the cached inventories, by health.", []string{"health"}, nil, metrics.ALPHA, "")
	descCacheGrants = metrics.NewDesc("tessera_scheduler_cache_grants",
		"Grants (one container's share of one GPU) in the cache: assumed by Reserve and not yet seen bound, or bound.",
		[]string{"state"}, nil, metrics.ALPHA, "")
	descCacheMemory = metrics.NewDesc("tessera_scheduler_cache_gpu_memory_bytes",
		"Device memory of the cached GPUs.", nil, nil, metrics.ALPHA, "")
	descCacheGrantedMemory = metrics.NewDesc("tessera_scheduler_cache_granted_gpu_memory_bytes",
		"Device memory granted on the cached GPUs.", nil, nil, metrics.ALPHA, "")
	descCacheGrantedCores = metrics.NewDesc("tessera_scheduler_cache_granted_gpu_cores",
		"Compute granted on the cached GPUs, in GPUs (1 is all the cores of one GPU).", nil, nil, metrics.ALPHA, "")
	descFreeGPUs = metrics.NewDesc("tessera_scheduler_free_gpus",
		"Free capacity of the healthy cached GPUs, in GPUs, weighing memory and cores as the profile does.",
		[]string{"profile"}, nil, metrics.ALPHA, "")
	descFragmentedGPUs = metrics.NewDesc("tessera_scheduler_fragmented_gpus",
		"Free GPU capacity, in GPUs, that the expected pods cannot use, as the Fragmentation policy measures it "+
			"(GPU terms only): for workload whole_gpu, pods of one whole GPU; for workload learned, the profile's recent GPU pods "+
			"(profiles that learn one).",
		[]string{"profile", "workload"}, nil, metrics.ALPHA, "")
)

func newCacheCollector(plugins func() []*Plugin) *cacheCollector {
	return &cacheCollector{plugins: plugins}
}

func (c *cacheCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	for _, d := range []*metrics.Desc{descCacheNodes, descCacheGPUs, descCacheGrants, descCacheMemory,
		descCacheGrantedMemory, descCacheGrantedCores, descFreeGPUs, descFragmentedGPUs} {
		ch <- d
	}
}

func (c *cacheCollector) CollectWithStability(ch chan<- metrics.Metric) {
	pls := c.plugins()
	// Profiles of one scheduler share a cache: count each cache once. Schedulers in
	// one process (tests) may repeat a profile name: their figures are added.
	var cs placement.CacheStats
	seen := map[*placement.Cache]bool{}
	type key struct{ profile, workload string }
	frag := map[key]float64{}
	free := map[string]float64{}
	for _, pl := range pls {
		if !seen[pl.cache] {
			seen[pl.cache] = true
			pl.cache.Stats(&cs)
		}
		learned := pl.workload.Learned()
		var whole, fromWorkload, total float64
		pl.cache.EachView(func(e *placement.NodeEntry, v *placement.NodeView, used []placement.Usage) {
			f, wf := fragmentation.WholeGPUFragmentation(v.Model, used, &pl.w)
			total += f
			whole += wf
			if learned != nil {
				fromWorkload += learned.Fragmented(e, v, used, &pl.w)
			}
		})
		free[pl.profile] += total
		frag[key{pl.profile, "whole_gpu"}] += whole
		if learned != nil {
			frag[key{pl.profile, "learned"}] += fromWorkload
		}
	}
	gauge := func(d *metrics.Desc, v float64, labels ...string) {
		ch <- metrics.NewLazyConstMetric(d, metrics.GaugeValue, v, labels...)
	}
	gauge(descCacheNodes, float64(cs.Nodes))
	gauge(descCacheGPUs, float64(cs.Healthy), "healthy")
	gauge(descCacheGPUs, float64(cs.GPUs-cs.Healthy), "unhealthy")
	gauge(descCacheGrants, float64(cs.Assumed), "assumed")
	gauge(descCacheGrants, float64(cs.Bound), "bound")
	gauge(descCacheMemory, float64(cs.MemMiB)*mib)
	gauge(descCacheGrantedMemory, float64(cs.GrantedMiB)*mib)
	gauge(descCacheGrantedCores, float64(cs.GrantedCores)/100)
	for p, v := range free {
		gauge(descFreeGPUs, v, p)
	}
	for k, v := range frag {
		gauge(descFragmentedGPUs, v, k.profile, k.workload)
	}
}

const mib = 1 << 20

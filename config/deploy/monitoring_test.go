// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics/legacyregistry"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	agentmetrics "github.com/tessera-dev/tessera/node-agent/metrics"
	"github.com/tessera-dev/tessera/plugins/gpushare"
)

// monitoringOptions renders the chart with the dashboard and the alerts.
func monitoringOptions(set ...string) Options {
	return Options{Release: "gpu", Namespace: "gpu-system", KubeVersion: "1.37.2", APIVersions: []string{"monitoring.coreos.com/v1"},
		Set: append([]string{"monitoring.grafanaDashboard.enabled=true", "monitoring.prometheusRule.enabled=true"}, set...)}
}

// TestRenderMonitoring: the dashboard ships as a ConfigMap the Grafana sidecar finds
// by label, the alerts as a PrometheusRule whose up{job} selectors name the metrics
// Services; both are off by default.
func TestRenderMonitoring(t *testing.T) {
	ms, err := Render(Options{ChartDir: chartDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	if k := kinds(ms); k["PrometheusRule"] != 0 {
		t.Errorf("a default install renders a PrometheusRule")
	}
	for _, m := range ms {
		if strings.HasSuffix(m.Name, "-dashboard") {
			t.Errorf("a default install renders the dashboard")
		}
	}

	o := monitoringOptions("monitoring.grafanaDashboard.namespace=grafana", "monitoring.grafanaDashboard.annotations.grafana_folder=GPU",
		"monitoring.prometheusRule.labels.release=kps", "monitoring.prometheusRule.alertLabels.team=platform")
	o.ChartDir = chartDir(t)
	ms, err = Render(o)
	if err != nil {
		t.Fatal(err)
	}
	cm := find(t, ms, "ConfigMap", "gpu-dashboard")
	meta := cm["metadata"].(map[string]any)
	if meta["namespace"] != "grafana" || meta["labels"].(map[string]any)["grafana_dashboard"] != "1" ||
		meta["annotations"].(map[string]any)["grafana_folder"] != "GPU" {
		t.Errorf("dashboard ConfigMap metadata %v", meta)
	}
	want, err := os.ReadFile(filepath.Join(chartDir(t), "dashboards", "tessera.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cm["data"].(map[string]any)["tessera.json"]; got != strings.TrimSuffix(string(want), "\n") {
		t.Error("the ConfigMap's dashboard differs from dashboards/tessera.json")
	}

	rule := find(t, ms, "PrometheusRule", "gpu")
	if rule["metadata"].(map[string]any)["labels"].(map[string]any)["release"] != "kps" {
		t.Errorf("PrometheusRule labels %v", rule["metadata"])
	}
	var alerts []string
	for _, r := range ruleList(t, rule) {
		alerts = append(alerts, r["alert"].(string))
		if r["labels"].(map[string]any)["team"] != "platform" {
			t.Errorf("%s lacks the alert labels: %v", r["alert"], r["labels"])
		}
	}
	sort.Strings(alerts)
	if got := strings.Join(alerts, " "); got != "TesseraContainersRefused TesseraGPUFragmentationHigh TesseraGPUMemoryUnattributed TesseraGPUUnhealthy TesseraInventoryStale "+
		"TesseraNodeAgentDown TesseraNodeAgentNotReady TesseraReserveConflicts TesseraSchedulerDown TesseraUnschedulableGPUPodsRising TesseraWatchdogKills" {
		t.Errorf("alerts %s", got)
	}
	exprs := strings.Join(ruleExprs(t, ms), "\n")
	for _, s := range []string{`up{job="gpu-node-agent-metrics"}`, `up{job="gpu-scheduler-metrics"}`, "tessera_inventory_age_seconds > 180",
		"max by (node, gpu, UUID) (tessera_gpu_unattributed_memory_bytes) > 268435456", `action=~"kill|stop|evict"`} {
		if !strings.Contains(exprs, s) {
			t.Errorf("rules lack %s:\n%s", s, exprs)
		}
	}

	// Without the agent, its alerts go.
	o = monitoringOptions("agent.enabled=false")
	o.ChartDir = chartDir(t)
	if ms, err = Render(o); err != nil {
		t.Fatal(err)
	}
	if exprs := strings.Join(ruleExprs(t, ms), "\n"); strings.Contains(exprs, "tessera_agent_ready") {
		t.Errorf("agent alerts without the agent:\n%s", exprs)
	}

	// The PrometheusRule needs the Operator's CRD, like the ServiceMonitors.
	if _, err := Render(Options{ChartDir: chartDir(t), Set: []string{"monitoring.prometheusRule.enabled=true"}}); err == nil ||
		!strings.Contains(err.Error(), "monitoring.coreos.com/v1") {
		t.Errorf("PrometheusRule without its CRD: %v", err)
	}
}

func ruleList(t *testing.T, rule map[string]any) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, g := range rule["spec"].(map[string]any)["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			out = append(out, r.(map[string]any))
		}
	}
	return out
}

func ruleExprs(t *testing.T, ms []Manifest) []string {
	t.Helper()
	var out []string
	for _, r := range ruleList(t, find(t, ms, "PrometheusRule", "gpu")) {
		out = append(out, r["expr"].(string))
	}
	return out
}

// dashboardExprs returns every query of the dashboard: the panels' targets and the
// label_values() selectors of its variables.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir(t), "dashboards", "tessera.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q has a target without a query", p.Title)
			}
			out = append(out, tg.Expr)
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable query %q is not label_values(selector, label)", v.Definition)
			continue
		}
		out = append(out, m[1])
	}
	return out
}

// grafanaVars replaces Grafana's interval variables with a duration PromQL accepts.
// Other variables ($profile, $node) only appear inside label matchers' strings.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// prometheusSeries are series Prometheus writes itself for every target it scrapes.
var prometheusSeries = map[string]bool{"up": true}

// TestMonitoringNamesExportedMetrics parses every PromQL expression of the dashboard
// and the alerts and checks that each metric it selects is one that the scheduler
// plugin or the node agent registers, gathered from their registries in this process.
func TestMonitoringNamesExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	o := monitoringOptions()
	o.ChartDir = chartDir(t)
	ms, err := Render(o)
	if err != nil {
		t.Fatal(err)
	}
	exprs := append(dashboardExprs(t), ruleExprs(t, ms)...)
	if len(exprs) < 20 {
		t.Fatalf("only %d expressions found", len(exprs))
	}
	p := parser.NewParser(parser.Options{})
	used := map[string]bool{}
	for _, e := range exprs {
		ast, err := p.ParseExpr(grafanaVars.Replace(e))
		if err != nil {
			t.Errorf("%s: %v", e, err)
			continue
		}
		parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			if vs.Name == "" {
				t.Errorf("%s: a selector without a metric name", e)
				return nil
			}
			used[vs.Name] = true
			if !exported[vs.Name] && !prometheusSeries[vs.Name] {
				t.Errorf("%s: no binary exports %s", e, vs.Name)
			}
			return nil
		})
	}
	// Every Tessera metric is on the dashboard or in an alert.
	for name := range exported {
		if strings.HasPrefix(name, "tessera_") && !used[name] {
			t.Errorf("%s is exported but neither charted nor alerted on", name)
		}
	}
}

// exportedMetrics gathers the metric names of a scheduler plugin (from the legacy
// registry kube-scheduler serves) and of a node agent whose metrics have been set
// once, as a poll and a watchdog pass set them.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := pluginHandle{factory: informers.NewSharedInformerFactory(fake.NewClientset(), time.Hour)}
	if _, err := gpushare.New(ctx, nil, h); err != nil {
		t.Fatal(err)
	}
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	if !names["tessera_scheduler_decisions_total"] || !names["tessera_scheduler_fragmented_gpus"] {
		t.Fatalf("the scheduler plugin's metrics were not gathered: %v", names)
	}

	m := agentmetrics.New(func() (time.Duration, bool) { return time.Second, true })
	m.SetReadiness(func() bool { return true })
	m.SetInventory(&api.NodeInventory{GPUs: []api.GPU{{UUID: "GPU-0", Index: 0, Model: "T4", MemoryMiB: 15360, Healthy: true}}})
	m.SetUsage([]agentmetrics.GPUSample{{UUID: "GPU-0", Index: 0, Polled: true, UsedMiB: 1, UtilPercent: 1, AllocatedMiB: 1, AllocatedCores: 1}},
		[]agentmetrics.ContainerSample{{Namespace: "ns", Pod: "p", Container: "c", UUID: "GPU-0", Index: 0, UsedMiB: 1, LimitMiB: 2, SMPercent: 1, CoresLimit: 1}})
	m.WatchdogAction("kill", "ns", "p", "c")
	m.ContainerRefused()
	mfs, err = m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	return names
}

// pluginHandle is what the plugin's factory reads from the framework.
type pluginHandle struct {
	fwk.Handle
	factory informers.SharedInformerFactory
}

func (h pluginHandle) SharedInformerFactory() informers.SharedInformerFactory { return h.factory }
func (h pluginHandle) ProfileName() string                                    { return "tessera-binpack" }

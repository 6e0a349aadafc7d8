// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/plugins/gpushare"
	"github.com/tessera-dev/tessera/plugins/gpushare/draplacement"
)

// decodeGPUShareArgs decodes the TesseraGPUShare args of every profile of a
// KubeSchedulerConfiguration as the plugin does, and returns how many it found.
func decodeGPUShareArgs(t *testing.T, name, cfg string) int {
	t.Helper()
	var c struct {
		Profiles []struct {
			SchedulerName string `json:"schedulerName"`
			PluginConfig  []struct {
				Name string         `json:"name"`
				Args map[string]any `json:"args"`
			} `json:"pluginConfig"`
		} `json:"profiles"`
	}
	if err := yaml.Unmarshal([]byte(cfg), &c); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	n := 0
	for _, p := range c.Profiles {
		for _, pc := range p.PluginConfig {
			if pc.Name != gpushare.Name {
				continue
			}
			n++
			raw, err := yaml.Marshal(pc.Args)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := gpushare.DecodeArgs(&runtime.Unknown{Raw: raw, ContentType: runtime.ContentTypeYAML}, gpushare.Defaults{}); err != nil {
				t.Errorf("%s, profile %s: %v", name, p.SchedulerName, err)
			}
		}
	}
	return n
}

// The plugin args of the chart's scheduler config and of every sample in
// config/scheduler decode, default and validate (the format stays backward
// compatible as the args type changes).
func TestSchedulerConfigPluginArgsDecode(t *testing.T) {
	ms, err := Render(Options{ChartDir: chartDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	cm := find(t, ms, "ConfigMap", "tessera-scheduler")
	if n := decodeGPUShareArgs(t, "chart", cm["data"].(map[string]any)["scheduler-config.yaml"].(string)); n == 0 {
		t.Error("chart: no TesseraGPUShare args")
	}
	samples, err := filepath.Glob(filepath.Join(chartDir(t), "..", "..", "scheduler", "*.yaml"))
	if err != nil || len(samples) == 0 {
		t.Fatalf("no samples: %v", err)
	}
	for _, path := range samples {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if n := decodeGPUShareArgs(t, filepath.Base(path), string(b)); n == 0 {
			t.Errorf("%s: no TesseraGPUShare args", filepath.Base(path))
		}
	}
}

// A profile's weights and fragmentation window reach its TesseraDynamicResources args
// too (claims are placed by the same score as tessera.dev/* pods), and
// scheduler.plugin.draArgs overrides them for every profile.
func TestSchedulerConfigDRAArgsFollowProfile(t *testing.T) {
	ms, err := Render(Options{ChartDir: chartDir(t), Values: map[string]any{"scheduler": map[string]any{
		"profiles": []any{map[string]any{"schedulerName": "tessera-binpack", "nodePolicy": "Binpack", "devicePolicy": "Spread",
			"args": map[string]any{"islandWeight": 3, "topologyWeight": 5, "memoryWeight": 2, "coresWeight": 7}}},
		"plugin": map[string]any{"draArgs": map[string]any{"coresWeight": 4}, "allowPodPolicyOverride": false},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	cm := find(t, ms, "ConfigMap", "tessera-scheduler")
	var c struct {
		Profiles []struct {
			PluginConfig []struct {
				Name string         `json:"name"`
				Args map[string]any `json:"args"`
			} `json:"pluginConfig"`
		} `json:"profiles"`
	}
	if err := yaml.Unmarshal([]byte(cm["data"].(map[string]any)["scheduler-config.yaml"].(string)), &c); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range c.Profiles {
		for _, pc := range p.PluginConfig {
			if pc.Name != draplacement.Name {
				continue
			}
			found = true
			raw, err := yaml.Marshal(pc.Args)
			if err != nil {
				t.Fatal(err)
			}
			a, err := draplacement.DecodeArgs(&runtime.Unknown{Raw: raw, ContentType: runtime.ContentTypeYAML})
			if err != nil {
				t.Fatal(err)
			}
			if a.NodePolicy != "Binpack" || a.DevicePolicy != "Spread" || *a.IslandWeight != 3 || *a.TopologyWeight != 5 ||
				*a.MemoryWeight != 2 || *a.CoresWeight != 4 || *a.PolicyWeight != 1 || *a.AllowPodPolicyOverride {
				t.Errorf("TesseraDynamicResources args %s", raw)
			}
		}
	}
	if !found {
		t.Error("no TesseraDynamicResources args")
	}
}

// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// gpuOperatorValues is the chart's values file for nodes run by the NVIDIA GPU
// Operator (docs/gpu-operator.md).
func gpuOperatorValues(t *testing.T) string {
	return filepath.Join(chartDir(t), "values-gpu-operator.yaml")
}

// TestRenderGPUOperator renders the chart with values-gpu-operator.yaml and checks
// what the docs promise: the agent runs only where the operator's device plugin is
// off and leaves while the operator unloads the driver, under the operator's
// RuntimeClass, reads the driver from the driver
// container's root at /host/driver (read-only) and writes a spec whose host paths are
// under /run/nvidia/driver, without the toolkit's hook; Tessera advertises its own
// resource name, never nvidia.com/gpu; the rest of the chart is as by default.
func TestRenderGPUOperator(t *testing.T) {
	ms, err := Render(Options{ChartDir: chartDir(t), ValueFiles: []string{gpuOperatorValues(t)}})
	if err != nil {
		t.Fatal(err)
	}
	ds := find(t, ms, "DaemonSet", "tessera-node-agent")
	spec := ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)

	sel := spec["nodeSelector"].(map[string]any)
	if want := map[string]any{"tessera.dev/gpu-node": "true", "nvidia.com/gpu.deploy.device-plugin": "false"}; fmt.Sprint(sel) != fmt.Sprint(want) {
		t.Errorf("agent nodeSelector %v, want %v", sel, want)
	}
	// It leaves while the operator upgrades the driver or changes the MIG layout:
	// either term admits a node, the label "true" or no label.
	terms := spec["affinity"].(map[string]any)["nodeAffinity"].(map[string]any)["requiredDuringSchedulingIgnoredDuringExecution"].(map[string]any)["nodeSelectorTerms"].([]any)
	if got := fmt.Sprint(terms); len(terms) != 2 ||
		!strings.Contains(got, "[map[matchExpressions:[map[key:nvidia.com/gpu.deploy.client operator:In values:[true]]]]") ||
		!strings.Contains(got, "map[matchExpressions:[map[key:nvidia.com/gpu.deploy.client operator:DoesNotExist]]]]") {
		t.Errorf("agent node affinity terms %s", got)
	}
	if got := spec["runtimeClassName"]; got != "nvidia" {
		t.Errorf("agent runtimeClassName %v, want the operator's nvidia", got)
	}
	// NVIDIA's usual taint stays tolerated (the chart's default).
	if got := fmt.Sprint(spec["tolerations"]); !strings.Contains(got, "key:nvidia.com/gpu") {
		t.Errorf("agent tolerations %s", got)
	}

	c := spec["containers"].([]any)[0].(map[string]any)
	var args []string
	for _, a := range c["args"].([]any) {
		args = append(args, a.(string))
	}
	for _, want := range []string{"--cdi-driver-root=/host/driver", "--cdi-host-driver-root=/run/nvidia/driver",
		"--cdi-hook=none", "--cdi-spec-dir=/var/run/cdi", "--cdi-kind=tessera.dev/gpu", "--resource-domain=tessera.dev",
		"--device-plugin=true", "--nri=true", "--dev-dir=/host/dev"} {
		if !slices.Contains(args, want) {
			t.Errorf("agent args lack %s: %v", want, args)
		}
	}
	for _, a := range args {
		if strings.HasPrefix(a, "--cdi-library-search-paths") {
			t.Errorf("%s: the driver container's libraries are in its loader cache, no search path is needed", a)
		}
	}
	// The runtime's injection is asked for NVML only (MPS is off by default).
	env := fmt.Sprint(c["env"])
	for _, want := range []string{"name:NVIDIA_VISIBLE_DEVICES value:all", "name:NVIDIA_DRIVER_CAPABILITIES value:utility"} {
		if !strings.Contains(env, want) {
			t.Errorf("agent env lacks %s: %s", want, env)
		}
	}

	// The driver root: the host's /run/nvidia/driver, read-only at /host/driver, and
	// the node's CDI directory where the toolkit writes its own spec too.
	mounts := map[string]map[string]any{}
	for _, m := range c["volumeMounts"].([]any) {
		m := m.(map[string]any)
		mounts[m["name"].(string)] = m
	}
	volumes := map[string]map[string]any{}
	for _, v := range spec["volumes"].([]any) {
		v := v.(map[string]any)
		volumes[v["name"].(string)] = v
	}
	for name, want := range map[string]struct {
		mountPath, hostPath, hostType string
		readOnly                      bool
	}{
		"cdi-driver-root": {"/host/driver", "/run/nvidia/driver", "Directory", true},
		"cdi":             {"/var/run/cdi", "/var/run/cdi", "DirectoryOrCreate", false},
		"dev":             {"/host/dev", "/dev", "Directory", true},
	} {
		m, v := mounts[name], volumes[name]
		if m == nil || v == nil {
			t.Errorf("no %s mount or volume: %v %v", name, m, v)
			continue
		}
		ro, _ := m["readOnly"].(bool)
		hp := v["hostPath"].(map[string]any)
		if m["mountPath"] != want.mountPath || ro != want.readOnly || hp["path"] != want.hostPath || hp["type"] != want.hostType {
			t.Errorf("%s: mount %v, volume %v; want %s at %s (readOnly %v, %s)", name, m, v, want.hostPath, want.mountPath, want.readOnly, want.hostType)
		}
	}

	// Tessera's device plugin and policies name its own resources; nothing the chart
	// renders advertises, ignores or routes nvidia.com/gpu.
	cm := find(t, ms, "ConfigMap", "tessera-scheduler")
	cfg := cm["data"].(map[string]any)["scheduler-config.yaml"].(string)
	if !strings.Contains(cfg, `ignoredResourceGroups: ["tessera.dev"]`) {
		t.Errorf("scheduler config:\n%s", cfg)
	}
	for _, m := range ms {
		if strings.Contains(m.YAML, "nvidia.com/gpu\"") || strings.Contains(m.YAML, "nvidia.com/gpu:") {
			t.Errorf("%s %s names the nvidia.com/gpu resource", m.Kind, m.Name)
		}
	}

	// Everything but the agent's pod spec is what the defaults render.
	def, err := Render(Options{ChartDir: chartDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(def) != len(ms) {
		t.Fatalf("%d objects with the operator's values, %d by default", len(ms), len(def))
	}
	for i := range def {
		if def[i].Kind != ms[i].Kind || def[i].Name != ms[i].Name {
			t.Fatalf("object %d: %s %s, by default %s %s", i, ms[i].Kind, ms[i].Name, def[i].Kind, def[i].Name)
		}
		if def[i].Kind != "DaemonSet" && def[i].YAML != ms[i].YAML {
			t.Errorf("%s %s differs from the default rendering", ms[i].Kind, ms[i].Name)
		}
	}
}

// TestGPUOperatorValuesKnown: every value the file sets is one the chart has, so a
// misspelt key cannot pass silently (the schema allows unknown keys).
func TestGPUOperatorValuesKnown(t *testing.T) {
	read := func(path string) map[string]any {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return m
	}
	defaults := read(filepath.Join(chartDir(t), "values.yaml"))
	var walk func(prefix string, set, def map[string]any)
	walk = func(prefix string, set, def map[string]any) {
		for k, v := range set {
			d, ok := def[k]
			if !ok {
				t.Errorf("values-gpu-operator.yaml sets %s%s, which values.yaml does not have", prefix, k)
				continue
			}
			sub, isMap := v.(map[string]any)
			dsub, defIsMap := d.(map[string]any)
			// Maps of free keys (nodeSelector, affinity) are taken whole.
			if isMap && defIsMap && k != "nodeSelector" && k != "affinity" {
				walk(prefix+k+".", sub, dsub)
			}
		}
	}
	walk("", read(gpuOperatorValues(t)), defaults)
}

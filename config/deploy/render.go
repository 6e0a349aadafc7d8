// SPDX-License-Identifier: Apache-2.0

// Package deploy renders Tessera's Helm chart (config/deploy/tessera) with the Helm
// library, exactly as `helm template` would: the chart's values.schema.json is
// enforced, the kubeVersion constraint is checked, and the objects come out in Helm's
// install order. hack/render-manifests.sh uses it to write the plain manifests, and
// the integration tests use it to apply the chart to a real API server.
package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/strvals"
	"sigs.k8s.io/yaml"
)

// Defaults for a release when Options leaves them empty.
const (
	DefaultRelease     = "tessera"
	DefaultNamespace   = "tessera-system"
	DefaultKubeVersion = "1.37.0"
)

// Options says what to render.
type Options struct {
	// ChartDir is the chart directory (config/deploy/tessera).
	ChartDir string
	// Release and Namespace name the release; defaults tessera and tessera-system.
	Release   string
	Namespace string
	// ValueFiles are merged in order over the chart's values.yaml, then Set
	// (helm's --set syntax, "a.b=c,d=e") in order over them.
	ValueFiles []string
	Set        []string
	// Values, if not nil, are merged last (what a Go caller uses instead of --set).
	Values map[string]any
	// KubeVersion is the cluster version the chart is rendered for
	// (.Capabilities.KubeVersion); default 1.37.0, the newest minor Tessera supports
	// (1.34 to 1.37: the chart picks the scheduler image of the cluster's minor, and
	// the MutatingAdmissionPolicies only where the minor serves them).
	KubeVersion string
	// APIVersions are extra group/versions the cluster serves, beyond the built-in
	// Kubernetes ones (e.g. "monitoring.coreos.com/v1" for ServiceMonitors), and
	// group/version/Kind entries as a cluster's discovery lists them to Helm
	// ("admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy").
	APIVersions []string
	// NamespaceObject prepends a Namespace (with the Pod Security labels the node
	// agent needs) for installs without Helm, where nothing else creates it.
	NamespaceObject bool
}

// Manifest is one rendered object.
type Manifest struct {
	// Source is the template it came from, e.g. tessera/templates/agent-daemonset.yaml.
	Source string
	// Kind and Name as the object states them.
	Kind, Name string
	// YAML is the object's text.
	YAML string
}

// Render renders the chart and returns its objects in Helm's install order
// (namespaces, service accounts, RBAC, config maps, services, workloads, ...).
func Render(o Options) ([]Manifest, error) {
	if o.Release == "" {
		o.Release = DefaultRelease
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.KubeVersion == "" {
		o.KubeVersion = DefaultKubeVersion
	}
	ch, err := loader.Load(o.ChartDir)
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", o.ChartDir, err)
	}
	kv, err := chartutil.ParseKubeVersion(o.KubeVersion)
	if err != nil {
		return nil, fmt.Errorf("kube version %q: %w", o.KubeVersion, err)
	}
	if c := ch.Metadata.KubeVersion; c != "" && !chartutil.IsCompatibleRange(c, kv.String()) {
		return nil, fmt.Errorf("chart %s requires Kubernetes %s; %s is not supported", ch.Name(), c, kv.String())
	}
	vals, err := userValues(o)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	// A fresh slice: appending to the copied one could write into the package-wide
	// default set's array.
	caps.APIVersions = append(append(chartutil.VersionSet{}, caps.APIVersions...), o.APIVersions...)
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: o.Release, Namespace: o.Namespace, IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, err
	}
	// NOTES.txt is text for the person installing, not an object.
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	hooks, sorted, err := releaseutil.SortManifests(files, caps.APIVersions, releaseutil.InstallOrder)
	if err != nil {
		return nil, err
	}
	if len(hooks) > 0 {
		// Plain manifests cannot express hooks; the chart must not need them.
		return nil, fmt.Errorf("chart %s has hooks (%s); they cannot be rendered to plain manifests", ch.Name(), hooks[0].Path)
	}
	var out []Manifest
	if o.NamespaceObject {
		out = append(out, namespaceManifest(o.Namespace))
	}
	for _, m := range sorted {
		if m.Head == nil || m.Head.Metadata == nil {
			return nil, fmt.Errorf("%s: object without kind or name", m.Name)
		}
		out = append(out, Manifest{Source: m.Name, Kind: m.Head.Kind, Name: m.Head.Metadata.Name, YAML: strings.TrimSpace(m.Content) + "\n"})
	}
	return out, nil
}

// userValues merges the value files, --set strings and Go values in that order.
func userValues(o Options) (map[string]any, error) {
	base := map[string]any{}
	for _, f := range o.ValueFiles {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		base = mergeMaps(base, m)
	}
	for _, s := range o.Set {
		if err := strvals.ParseInto(s, base); err != nil {
			return nil, fmt.Errorf("--set %q: %w", s, err)
		}
	}
	if o.Values != nil {
		// Round-trip through YAML so typed Go values become what a values file gives.
		raw, err := yaml.Marshal(o.Values)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return nil, err
		}
		base = mergeMaps(base, m)
	}
	return base, nil
}

// mergeMaps is helm's own merge of value files: nested maps merge, anything else is
// replaced.
func mergeMaps(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bv, ok := v.(map[string]any); ok {
			if av, ok := out[k].(map[string]any); ok {
				out[k] = mergeMaps(av, bv)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// namespaceManifest is the release namespace, labelled for the Pod Security admission
// level the node agent needs (it is privileged: NRI socket, device nodes, host /proc).
func namespaceManifest(ns string) Manifest {
	y := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %s
  labels:
    app.kubernetes.io/part-of: tessera
    pod-security.kubernetes.io/enforce: privileged
    pod-security.kubernetes.io/warn: privileged
    pod-security.kubernetes.io/audit: privileged
`, ns)
	return Manifest{Source: "namespace", Kind: "Namespace", Name: ns, YAML: y}
}

// Join writes manifests as one multi-document YAML stream, each object preceded by
// the template it came from, as `helm template` does.
func Join(ms []Manifest) []byte {
	var b bytes.Buffer
	for _, m := range ms {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s", m.Source, m.YAML)
	}
	return b.Bytes()
}

// ChartDir returns the chart directory under a repository root.
func ChartDir(repoRoot string) string { return filepath.Join(repoRoot, "config", "deploy", "tessera") }

// LoadChart loads the chart, for callers that inspect its metadata.
func LoadChart(dir string) (*chart.Chart, error) { return loader.Load(dir) }

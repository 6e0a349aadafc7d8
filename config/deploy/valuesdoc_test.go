// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"sigs.k8s.io/yaml"
)

func TestValuesDocs(t *testing.T) {
	values := `# File header, not a value's.

# Domain of the resource names.
domain: tessera.dev

image:
  # Registry of both images.
  registry: ghcr.io/x
  # Pull policy.
  pullPolicy: IfNotPresent

# Leader election, for the values below.
election:
  # Lease length and renew deadline.
  lease: 15s
  renew: 10s

  # Retry period, after a blank line.
  retry: 2s

# The container's resources.
resources:
  limits:
    memory: 512Mi
`
	schema := `{"definitions": {"duration": {"type": "string"}},
	  "properties": {
	    "image": {"properties": {"pullPolicy": {"type": "string", "enum": ["Always", "Never"]}}},
	    "election": {"properties": {"lease": {"$ref": "#/definitions/duration"}}}}}`
	rows, err := ValuesDocs([]byte(values), []byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	want := []ValueDoc{
		{"domain", "string", `"tessera.dev"`, "Domain of the resource names."},
		{"image.registry", "string", `"ghcr.io/x"`, "Registry of both images."},
		{"image.pullPolicy", "string", `"IfNotPresent"`, `Pull policy. One of: "Always", "Never".`},
		{"election", "object", "", "Leader election, for the values below."},
		{"election.lease", "string (duration)", `"15s"`, "Lease length and renew deadline."},
		// One comment over a run of one-line values.
		{"election.renew", "string", `"10s"`, "Lease length and renew deadline."},
		{"election.retry", "string", `"2s"`, "Retry period, after a blank line."},
		// No schema properties and no comments inside: one value.
		{"resources", "object", `{"limits":{"memory":"512Mi"}}`, "The container's resources."},
	}
	if len(rows) != len(want) {
		t.Fatalf("got %d rows, want %d:\n%+v", len(rows), len(want), rows)
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d:\n got %+v\nwant %+v", i, rows[i], want[i])
		}
	}
}

func TestValuesDocsNeedsComments(t *testing.T) {
	_, err := ValuesDocs([]byte("# Documented.\na: 1\n\nb: 2\n"), []byte("{}"))
	if err == nil || !strings.Contains(err.Error(), "no comment above b") {
		t.Fatalf("error %v, want one naming b", err)
	}
}

func TestValuesTable(t *testing.T) {
	got := ValuesTable([]ValueDoc{{"a.b", "string", `"x|y"`, "Names <domain>/gpu, and <release>-x. Pipes | too."}})
	want := "| key | type | default | description |\n| --- | --- | --- | --- |\n" +
		"| `a.b` | string | `\"x\\|y\"` | Names `<domain>/gpu`, and `<release>-x`. Pipes \\| too. |\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestUpdateReadme(t *testing.T) {
	in := "# Chart\n\nhand-written\n\n" + TableStart + "\nold table\n" + TableEnd + "\n\nmore prose\n"
	out, err := UpdateReadme([]byte(in), "new table\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Chart\n\nhand-written\n\n" + TableStart + "\nnew table\n" + TableEnd + "\n\nmore prose\n"; string(out) != want {
		t.Errorf("got %q, want %q", out, want)
	}
	if _, err := UpdateReadme([]byte("no markers"), "t"); err == nil {
		t.Error("a README without markers was accepted")
	}
}

// TestChartReadmeUpToDate keeps the chart README's values table what values.yaml and
// values.schema.json say, as TestPlainManifestsUpToDate does for the manifests.
func TestChartReadmeUpToDate(t *testing.T) {
	current, want, err := ChartReadme(chartDir(t))
	if err != nil {
		t.Fatal(err)
	}
	if string(current) != string(want) {
		t.Error("config/deploy/tessera/README.md's values table is out of date with values.yaml: run make chart-readme")
	}
}

// TestChartReadmeCoversEveryValue: every value in values.yaml has a row, itself or
// through the object that holds it.
func TestChartReadmeCoversEveryValue(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var leaves []string
	leafKeys(values, "", &leaves)
	for _, k := range leaves {
		covered := false
		for p := k; p != ""; p = parent(p) {
			if strings.Contains(string(readme), "| `"+p+"` |") {
				covered = true
				break
			}
		}
		if !covered {
			t.Errorf("values.yaml's %s has no row in the README", k)
		}
	}
}

// TestHelmShowReadme: the chart as Helm loads it, from the directory and from the
// archive helm package writes, carries the README among its files, which is where
// helm show readme finds it (its first file named README.md, any case).
func TestHelmShowReadme(t *testing.T) {
	readme := func(ch *chart.Chart) string {
		for _, f := range ch.Files {
			if strings.EqualFold(f.Name, "README.md") {
				return string(f.Data)
			}
		}
		return ""
	}
	ch, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatal(err)
	}
	if out := readme(ch); !strings.HasPrefix(out, "# Tessera Helm chart") || !strings.Contains(out, "| `scheduler.plugin.weight` |") {
		t.Errorf("the chart's README is:\n%.300s", out)
	}
	archive, err := chartutil.Save(ch, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	packaged, err := loader.Load(archive)
	if err != nil {
		t.Fatal(err)
	}
	if readme(packaged) != readme(ch) {
		t.Errorf("%s does not carry the README", filepath.Base(archive))
	}
}

func leafKeys(m map[string]any, prefix string, out *[]string) {
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			leafKeys(sub, prefix+k+".", out)
			continue
		}
		*out = append(*out, prefix+k)
	}
	sort.Strings(*out)
}

func parent(key string) string {
	i := strings.LastIndex(key, ".")
	if i < 0 {
		return ""
	}
	return key[:i]
}

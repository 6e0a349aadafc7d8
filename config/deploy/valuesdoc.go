// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// The chart README's values table lies between these markers; everything else in
// the README is written by hand. UpdateReadme rewrites what is between them.
const (
	TableStart = "<!-- values-table:start (make chart-readme writes this table from values.yaml and values.schema.json) -->"
	TableEnd   = "<!-- values-table:end -->"
)

// ValueDoc is one row of the values table.
type ValueDoc struct {
	// Key is the value's path, e.g. scheduler.plugin.weight.
	Key string
	// Type is the schema's type (with the schema definition for a named scalar, e.g.
	// "string (duration)"), or the YAML value's where the schema says nothing.
	Type string
	// Default is the value in values.yaml as JSON; empty for a group whose values
	// have rows of their own.
	Default string
	// Description is the comment above the key in values.yaml, plus the schema's
	// allowed values.
	Description string
}

// schemaNode is the part of a JSON schema the table reads.
type schemaNode struct {
	Type       any                    `json:"type"`
	Ref        string                 `json:"$ref"`
	Enum       []any                  `json:"enum"`
	Properties map[string]*schemaNode `json:"properties"`
	Items      *schemaNode            `json:"items"`
}

type schema struct {
	schemaNode
	Definitions map[string]*schemaNode `json:"definitions"`
}

// resolve follows a $ref to a definition; name is the definition's, if any.
func (s *schema) resolve(n *schemaNode) (node *schemaNode, name string) {
	if n == nil || n.Ref == "" {
		return n, ""
	}
	name = strings.TrimPrefix(n.Ref, "#/definitions/")
	return s.Definitions[name], name
}

// ValuesDocs reads values.yaml and values.schema.json and returns one row per value,
// in the file's order. A mapping is described value by value where the schema lists
// its properties or values.yaml comments its keys; otherwise (resources, affinity,
// other Kubernetes objects passed through) it is one value. Every row must have a
// comment: an undocumented value is an error naming it.
func ValuesDocs(valuesYAML, schemaJSON []byte) ([]ValueDoc, error) {
	var s schema
	if err := json.Unmarshal(schemaJSON, &s); err != nil {
		return nil, fmt.Errorf("values.schema.json: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(valuesYAML, &doc); err != nil {
		return nil, fmt.Errorf("values.yaml: %w", err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("values.yaml: not a mapping")
	}
	w := &docWalker{schema: &s}
	w.mapping("", doc.Content[0], &s.schemaNode)
	if len(w.undocumented) > 0 {
		return nil, fmt.Errorf("values.yaml: no comment above %s (describe each value in a comment above it)", strings.Join(w.undocumented, ", "))
	}
	return w.rows, nil
}

type docWalker struct {
	schema       *schema
	rows         []ValueDoc
	undocumented []string
}

func (w *docWalker) mapping(prefix string, m *yaml.Node, sn *schemaNode) {
	prevDesc := ""
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		key := prefix + k.Value
		var child *schemaNode
		if sn != nil {
			child = sn.Properties[k.Value]
		}
		resolved, refName := w.schema.resolve(child)
		desc := comment(k)
		// One comment above a run of one-line values describes them all, as in
		//   # kube-scheduler's log verbosity and format (text or json).
		//   logVerbosity: 2
		//   logFormat: text
		if desc == "" && i >= 2 && oneLine(v) && oneLine(m.Content[i-1]) && k.Line == m.Content[i-2].Line+1 {
			desc = prevDesc
		}
		prevDesc = desc
		if expand(v, resolved) {
			// A group: a row of its own only when commented, then its values.
			if desc != "" {
				w.rows = append(w.rows, ValueDoc{Key: key, Type: "object", Description: desc})
			}
			w.mapping(key+".", v, resolved)
			continue
		}
		if desc == "" {
			w.undocumented = append(w.undocumented, key)
		}
		w.rows = append(w.rows, ValueDoc{
			Key:         key,
			Type:        typeOf(v, resolved, refName),
			Default:     defaultOf(v),
			Description: withEnum(desc, resolved),
		})
	}
}

// oneLine says whether a value sits on its key's line (a scalar or a flow collection).
func oneLine(v *yaml.Node) bool {
	return v.Kind == yaml.ScalarNode || v.Style&yaml.FlowStyle != 0
}

// expand says whether a mapping's keys get rows of their own.
func expand(v *yaml.Node, sn *schemaNode) bool {
	if v.Kind != yaml.MappingNode || len(v.Content) == 0 {
		return false
	}
	if sn != nil && len(sn.Properties) > 0 {
		return true
	}
	for i := 0; i < len(v.Content); i += 2 {
		if comment(v.Content[i]) != "" {
			return true
		}
	}
	return false
}

// comment is the comment block right above a key (or after it on its line), as one
// line of text.
func comment(k *yaml.Node) string {
	text := k.HeadComment
	if text == "" {
		text = k.LineComment
	}
	// A head comment separated from its key by a blank line belongs to a group
	// above; yaml keeps only the block next to the key here.
	var words []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if line != "" {
			words = append(words, line)
		}
	}
	return strings.Join(words, " ")
}

func typeOf(v *yaml.Node, sn *schemaNode, refName string) string {
	if sn != nil {
		switch t := sn.Type.(type) {
		case string:
			if refName != "" && t != "object" && t != "array" {
				return fmt.Sprintf("%s (%s)", t, refName)
			}
			return t
		case []any:
			var ts []string
			for _, x := range t {
				ts = append(ts, fmt.Sprint(x))
			}
			return strings.Join(ts, " or ")
		}
	}
	switch {
	case v.Kind == yaml.MappingNode:
		return "object"
	case v.Kind == yaml.SequenceNode:
		return "array"
	case v.Tag == "!!int":
		return "integer"
	case v.Tag == "!!bool":
		return "boolean"
	case v.Tag == "!!float":
		return "number"
	}
	return "string"
}

// defaultOf is the value as compact JSON, the form --set-json takes.
func defaultOf(v *yaml.Node) string {
	var x any
	if err := v.Decode(&x); err != nil {
		return v.Value
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return v.Value
	}
	return strings.TrimSpace(b.String())
}

func withEnum(desc string, sn *schemaNode) string {
	if sn == nil || len(sn.Enum) == 0 {
		return desc
	}
	var vals []string
	for _, e := range sn.Enum {
		vals = append(vals, defaultOf(&yaml.Node{Kind: yaml.ScalarNode, Value: fmt.Sprint(e), Tag: "!!str"}))
	}
	return strings.TrimSpace(desc + " One of: " + strings.Join(vals, ", ") + ".")
}

// angled finds words such as <domain>/gpu, which Markdown would take for HTML tags.
var angled = regexp.MustCompile("[^\\s,;()`]*<[^<>\\s]+>[^\\s,;()`]*")

// ValuesTable is the Markdown table of rows.
func ValuesTable(rows []ValueDoc) string {
	var b strings.Builder
	b.WriteString("| key | type | default | description |\n| --- | --- | --- | --- |\n")
	for _, r := range rows {
		def := ""
		if r.Default != "" {
			def = "`" + cell(r.Default) + "`"
		}
		desc := angled.ReplaceAllStringFunc(cell(r.Description), func(s string) string {
			w := strings.TrimRight(s, ".:")
			return "`" + w + "`" + s[len(w):]
		})
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.Key, r.Type, def, desc)
	}
	return b.String()
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// UpdateReadme puts table between the README's markers.
func UpdateReadme(readme []byte, table string) ([]byte, error) {
	s := string(readme)
	i, j := strings.Index(s, TableStart), strings.Index(s, TableEnd)
	if i < 0 || j < i {
		return nil, fmt.Errorf("the README has no %q ... %q markers", TableStart, TableEnd)
	}
	return []byte(s[:i+len(TableStart)] + "\n" + table + s[j:]), nil
}

// ChartReadme is the chart's README as it should be: the one in chartDir with its
// values table regenerated from the chart's values.yaml and values.schema.json.
func ChartReadme(chartDir string) (current, want []byte, err error) {
	read := func(name string) []byte {
		if err != nil {
			return nil
		}
		var b []byte
		b, err = os.ReadFile(filepath.Join(chartDir, name))
		return b
	}
	values, sch, readme := read("values.yaml"), read("values.schema.json"), read("README.md")
	if err != nil {
		return nil, nil, err
	}
	rows, err := ValuesDocs(values, sch)
	if err != nil {
		return nil, nil, err
	}
	want, err = UpdateReadme(readme, ValuesTable(rows))
	return readme, want, err
}

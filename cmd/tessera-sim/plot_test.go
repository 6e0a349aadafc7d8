// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/xml"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// summaries are two policies of two runs each, shaped like real A(x) curves: the
// ideal up to a knee, then flat.
func summaries() []*policySummary {
	run := func(knee float64) []float64 {
		a := make([]float64, 131)
		for x := range a {
			a[x] = math.Min(float64(x), knee)
		}
		a[0] = math.NaN() // no pod has arrived at 0%
		return a
	}
	return []*policySummary{
		{name: "binpack", a: [][]float64{run(92), run(93)}, u100: []float64{8, 7}},
		{name: "fragmentation", a: [][]float64{run(95), run(96)}, u100: []float64{5, 4}},
	}
}

func TestAllocPlotSVG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "alloc.svg")
	if err := writeAllocPlot(path, summaries()); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Well-formed XML whose root is an SVG element.
	dec := xml.NewDecoder(strings.NewReader(string(raw)))
	var root string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("alloc.svg is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
			if se.Name.Space != "http://www.w3.org/2000/svg" {
				t.Errorf("root namespace %q, want SVG's", se.Name.Space)
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	// The same information as before: both panels' titles, the axis labels, and a
	// legend entry with U(100) per policy.
	for _, want := range []string{
		"allocated vs arrived (mean over seeds)", "zoom: 75–130%",
		"arrived GPU demand (% of cluster GPU capacity)", "allocated GPU (%)",
		"binpack  U(100) 7.50 ± 0.71", "fragmentation  U(100) 4.50 ± 0.71", "ideal: min(x, 100)",
	} {
		if !strings.Contains(string(raw), xmlEscape(want)) {
			t.Errorf("alloc.svg lacks %q", want)
		}
	}
}

func TestAllocPlotPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "alloc.png")
	if err := writeAllocPlot(path, summaries()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("alloc.png: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 500 || b.Dy() < 200 {
		t.Errorf("alloc.png is %v, too small to read", b)
	}
}

func TestAllocPlotRejectsOtherFormats(t *testing.T) {
	if err := writeAllocPlot(filepath.Join(t.TempDir(), "alloc.gif"), summaries()); err == nil {
		t.Error("alloc.gif: no error")
	}
}

func xmlEscape(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// palette: one color per policy, in the order given (matplotlib's first seven).
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0x94, 0x67, 0xbd, 0xff},
	{0xff, 0x7f, 0x0e, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff},
}

// writeAllocPlot draws the mean allocated GPU capacity A(x) against arrived load x for
// every policy, with the ideal (everything that arrives is allocated) dashed, beside a
// zoom on 75..130% where the policies differ; the legend gives each policy's U(100).
// The format follows the file name: .svg, or .png.
func writeAllocPlot(path string, pols []*policySummary) error {
	full, err := allocPlot(pols, 0, 130, 0, 100, "allocated vs arrived (mean over seeds)", false)
	if err != nil {
		return err
	}
	zoom, err := allocPlot(pols, 75, 130, 70, 100, "zoom: 75–130%", true)
	if err != nil {
		return err
	}
	const w, h = 26 * vg.Centimeter, 11 * vg.Centimeter
	var canvas vg.CanvasWriterTo
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg":
		canvas = vgsvg.New(w, h)
	case ".png":
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	default:
		return fmt.Errorf("%s: want a .svg or .png file", path)
	}
	dc := draw.New(canvas)
	// A white background: the SVG is viewed on dark pages too.
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Centimeter, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	cs := plot.Align([][]*plot.Plot{{full, zoom}}, tiles, dc)
	full.Draw(cs[0][0])
	zoom.Draw(cs[0][1])

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// allocPlot is one panel: axes [xmin, xmax] × [ymin, ymax] in percent; the curves are
// clipped to it.
func allocPlot(pols []*policySummary, xmin, xmax, ymin, ymax float64, title string, legend bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "arrived GPU demand (% of cluster GPU capacity)"
	p.Y.Label.Text = "allocated GPU (%)"
	p.X.Tick.Marker, p.Y.Tick.Marker = plainTicks{}, plainTicks{}
	p.Add(plotter.NewGrid())

	// Ideal: min(x, 100).
	ideal, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 100, Y: 100}, {X: 130, Y: 100}})
	if err != nil {
		return nil, err
	}
	ideal.Color = color.Gray{0x88}
	ideal.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(ideal)
	if legend {
		p.Legend.Add("ideal: min(x, 100)", ideal)
	}
	for i, s := range pols {
		xy := meanCurve(s)
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		if legend {
			m, sd := meanSD(s.u100)
			p.Legend.Add(fmt.Sprintf("%s  U(100) %.2f ± %.2f", s.name, m, sd), l)
		}
	}
	// Set after Add, which widens the axes to the data.
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = xmin, xmax, ymin, ymax
	// Bottom right: below the curves, which are flat near the top past 100%.
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Millimeter*2, vg.Millimeter*2
	return p, nil
}

// meanCurve is A(x) averaged over a policy's runs, x = 0..130, skipping points that
// no run reached.
func meanCurve(s *policySummary) plotter.XYs {
	var xy plotter.XYs
	for x := 0; x <= 130; x++ {
		var vals []float64
		for _, a := range s.a {
			if x < len(a) && !math.IsNaN(a[x]) {
				vals = append(vals, a[x])
			}
		}
		if len(vals) == 0 {
			continue
		}
		m, _ := meanSD(vals)
		xy = append(xy, plotter.XY{X: float64(x), Y: m})
	}
	return xy
}

// plainTicks are gonum's default ticks labelled without trailing zeros (75, not 75.00).
type plainTicks struct{}

func (plainTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'g', -1, 64)
		}
	}
	return ts
}

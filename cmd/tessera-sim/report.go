package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// published are the FGD paper's U(100) on the default openb trace (unallocated GPU %
// when the arrived workload reaches the cluster's GPU capacity).
var published = []struct {
	name string
	u100 float64
}{{"Random", 13.70}, {"DotProd", 9.38}, {"Clustering", 8.35}, {"Packing", 8.22}, {"BestFit", 7.14}, {"FGD", 4.77}}

var fragPoints = []int{50, 80, 90, 100}

type policySummary struct {
	name      string
	doc       string
	u100      []float64
	a         [][]float64 // per run A(x)
	frag      map[int][]float64
	scheduled []float64
	wall      []float64
}

func writeReport(dir string, cl *cluster, pols []*policy, results []*runResult, packing string) error {
	byPolicy := map[string]*policySummary{}
	var order []*policySummary
	for _, p := range pols {
		s := &policySummary{name: p.name, doc: p.doc, frag: map[int][]float64{}}
		byPolicy[p.name] = s
		order = append(order, s)
	}

	curves, err := create(dir, "curves.csv")
	if err != nil {
		return err
	}
	fmt.Fprintln(curves.w, "policy,seed,arrived_pct,alloc_pct,unalloc_pct")
	runs, err := create(dir, "runs.csv")
	if err != nil {
		return err
	}
	fmt.Fprintln(runs.w, "policy,seed,pods,scheduled,failed,u100,frag50,frag80,frag90,frag100,wall_s")
	for _, r := range results {
		s := byPolicy[r.policy]
		a := curve(r.points, cl.totalGPU, 130)
		for x, v := range a {
			if math.IsNaN(v) {
				continue
			}
			fmt.Fprintf(curves.w, "%s,%d,%d,%.3f,%.3f\n", r.policy, r.seed, x, v, 100-v)
		}
		s.a = append(s.a, a)
		s.u100 = append(s.u100, 100-a[100])
		s.scheduled = append(s.scheduled, float64(r.scheduled))
		s.wall = append(s.wall, r.wallSeconds)
		var fr []string
		for _, x := range fragPoints {
			v, ok := r.fragAt[x]
			if ok {
				s.frag[x] = append(s.frag[x], v)
				fr = append(fr, fmt.Sprintf("%.2f", v))
			} else {
				fr = append(fr, "")
			}
		}
		fmt.Fprintf(runs.w, "%s,%d,%d,%d,%d,%.3f,%s,%.1f\n", r.policy, r.seed, r.podsTotal, r.scheduled, r.failed, 100-a[100], strings.Join(fr, ","), r.wallSeconds)
	}
	if err := curves.close(); err != nil {
		return err
	}
	if err := runs.close(); err != nil {
		return err
	}

	sum, err := create(dir, "summary.csv")
	if err != nil {
		return err
	}
	fmt.Fprintln(sum.w, "policy,runs,u100_mean,u100_sd,frag50,frag80,frag90,frag100,wall_s_mean")
	var md strings.Builder
	md.WriteString("| policy | runs | U(100) % mean ± sd | frag. ratio % at 50 / 80 / 90 / 100 | s per run |\n| --- | --- | --- | --- | --- |\n")
	for _, s := range order {
		m, sd := meanSD(s.u100)
		var fr, frmd []string
		for _, x := range fragPoints {
			fm, _ := meanSD(s.frag[x])
			fr = append(fr, fmt.Sprintf("%.2f", fm))
			frmd = append(frmd, fmt.Sprintf("%.1f", fm))
		}
		w, _ := meanSD(s.wall)
		fmt.Fprintf(sum.w, "%s,%d,%.3f,%.3f,%s,%.1f\n", s.name, len(s.u100), m, sd, strings.Join(fr, ","), w)
		fmt.Fprintf(&md, "| %s | %d | %.2f ± %.2f | %s | %.0f |\n", s.name, len(s.u100), m, sd, strings.Join(frmd, " / "), w)
	}
	md.WriteString("\nPublished (FGD paper, same trace, U(100) %): ")
	for i, p := range published {
		if i > 0 {
			md.WriteString(", ")
		}
		fmt.Fprintf(&md, "%s %.2f", p.name, p.u100)
	}
	md.WriteString("\n\n" + packing)
	if err := sum.close(); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	fmt.Print("\n" + md.String())
	if err := os.WriteFile(filepath.Join(dir, "alloc.svg"), []byte(plotSVG(order)), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s/{curves.csv,runs.csv,summary.csv,summary.md,alloc.svg}\n", dir)
	return nil
}

type outFile struct {
	f *os.File
	w *bufio.Writer
}

func create(dir, name string) (*outFile, error) {
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	return &outFile{f, bufio.NewWriter(f)}, nil
}

func (o *outFile) close() error {
	if err := o.w.Flush(); err != nil {
		o.f.Close()
		return err
	}
	return o.f.Close()
}

// plotSVG draws the mean allocated GPU capacity A(x) against arrived load x for every
// policy, with the ideal (everything that arrives is allocated) as a dotted line, and
// a zoom on 75..130% where the policies differ.
func plotSVG(pols []*policySummary) string {
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"}
	var b strings.Builder
	const W, H = 960, 420
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	panel := func(x0, y0, w, h float64, xmin, xmax, ymin, ymax float64, title string) {
		px := func(x float64) float64 { return x0 + (x-xmin)/(xmax-xmin)*w }
		py := func(y float64) float64 { return y0 + h - (y-ymin)/(ymax-ymin)*h }
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" font-size="13">%s</text>`+"\n", x0+w/2, y0-8, title)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", x0, y0, w, h)
		for _, t := range ticks(xmin, xmax) {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, px(t), y0, px(t), y0+h)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%g</text>`+"\n", px(t), y0+h+15, t)
		}
		for _, t := range ticks(ymin, ymax) {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, x0, py(t), x0+w, py(t))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%g</text>`+"\n", x0-4, py(t)+4, t)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">arrived GPU demand (%% of cluster GPU capacity)</text>`+"\n", x0+w/2, y0+h+32)
		fmt.Fprintf(&b, `<text transform="translate(%.0f,%.0f) rotate(-90)" text-anchor="middle">allocated GPU (%%)</text>`+"\n", x0-36, y0+h/2)
		// Ideal: min(x, 100).
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#888" stroke-dasharray="4 3" points="%.1f,%.1f %.1f,%.1f %.1f,%.1f"/>`+"\n",
			px(xmin), py(math.Max(ymin, math.Min(xmin, 100))), px(math.Min(100, xmax)), py(math.Min(100, ymax)), px(xmax), py(math.Min(100, ymax)))
		for i, p := range pols {
			var pts []string
			for x := int(xmin); x <= int(xmax); x++ {
				var vals []float64
				for _, a := range p.a {
					if x < len(a) && !math.IsNaN(a[x]) {
						vals = append(vals, a[x])
					}
				}
				if len(vals) == 0 {
					continue
				}
				m, _ := meanSD(vals)
				if m < ymin || m > ymax {
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(x)), py(m)))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colors[i%len(colors)], strings.Join(pts, " "))
		}
	}
	panel(60, 30, 380, 320, 0, 130, 0, 100, "allocated vs arrived (mean over seeds)")
	panel(530, 30, 300, 320, 75, 130, 70, 100, "zoom: 75–130%")
	for i, p := range pols {
		m, sd := meanSD(p.u100)
		y := 40 + 30*i
		fmt.Fprintf(&b, `<line x1="845" y1="%d" x2="865" y2="%d" stroke="%s" stroke-width="3"/>`, y, y, colors[i%len(colors)])
		fmt.Fprintf(&b, `<text x="870" y="%d">%s</text>`+"\n", y+4, p.name)
		fmt.Fprintf(&b, `<text x="870" y="%d" font-size="10" fill="#555">U(100) %.2f±%.2f</text>`+"\n", y+4+9, m, sd)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func ticks(lo, hi float64) []float64 {
	step := 10.0
	if hi-lo > 100 {
		step = 20
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+1e-9; t += step {
		out = append(out, t)
	}
	return out
}

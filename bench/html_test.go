package bench

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
)

// A plot of 12 runs' p99 and max (24 lines) holds its whole legend (it
// grows past 360 px to do so) and tells every line apart: a colour per
// run, past the palette's 8, and a dash for max.
func TestSVGPlotLegendHoldsManySeries(t *testing.T) {
	var ss []series
	for run := range 12 {
		ss = append(ss,
			series{name: fmt.Sprintf("run %d p99", run), xs: []float64{0, 1}, ys: []float64{1, 2}, group: run},
			series{name: fmt.Sprintf("run %d max", run), xs: []float64{0, 1}, ys: []float64{2, 4}, group: run, dash: dashed})
	}
	svg := svgPlot("latency", "s", "ms", ss, nil, nil, false)
	m := regexp.MustCompile(`<svg [^>]*height="([0-9.]+)"`).FindStringSubmatch(svg)
	if m == nil {
		t.Fatalf("no height in %.200s", svg)
	}
	h, _ := strconv.ParseFloat(m[1], 64)
	legend := regexp.MustCompile(`<line [^>]*y1="([0-9.]+)"[^>]*stroke="([^"]+)"( stroke-dasharray="([^"]+)")? stroke-width="2"/><text x="[0-9.]+" y="([0-9.]+)">([^<]*)</text>`).
		FindAllStringSubmatch(svg, -1)
	if len(legend) != len(ss) {
		t.Fatalf("%d legend entries, want %d", len(legend), len(ss))
	}
	seen := map[[2]string]string{}
	for _, e := range legend {
		y, _ := strconv.ParseFloat(e[1], 64)
		ty, _ := strconv.ParseFloat(e[5], 64)
		if y > h || ty > h {
			t.Errorf("legend entry %q at y %g (its text at %g), below the plot's %g px", e[6], y, ty, h)
		}
		k := [2]string{e[2], e[4]}
		if other, ok := seen[k]; ok {
			t.Errorf("%q and %q share colour %s and dash %q", other, e[6], k[0], k[1])
		}
		seen[k] = e[6]
	}
}

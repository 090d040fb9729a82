package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// series is one line of a plot. Its colour is its run's (group: the
// lines of one run share it), its dash what it shows of the run (p99 or
// max, VmRSS or RssAnon; "" solid).
type series struct {
	name  string
	xs    []float64
	ys    []float64
	group int
	dash  string // an SVG stroke-dasharray
}

// dashed is the dash of a run's second line (max beside p99, RssAnon
// beside VmRSS).
const dashed = "6 3"

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// colour is group's colour: the palette's, then hues a golden angle apart,
// so that no two runs share one.
func colour(group int) string {
	if group < len(palette) {
		return palette[group]
	}
	return fmt.Sprintf("hsl(%.1f,65%%,40%%)", math.Mod(float64(group-len(palette))*137.508+15, 360))
}

// legendStep is the height of a legend entry; the plot grows to hold
// them all.
const legendStep = 16.0

// svgPlot draws line series on a linear x axis and a log10 y axis, or a
// linear one from 0 (linearY). xTick labels x positions (nil: plain
// numbers). It is 360 px high, more where the legend needs it.
func svgPlot(title, xLabel, yLabel string, ss []series, xTicks []float64, xTickLabel func(float64) string, linearY bool) string {
	const W, L, R, T, B = 760.0, 70.0, 170.0, 30.0, 45.0
	H := max(360.0, T+12+float64(len(ss))*legendStep)
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for i := range s.xs {
			xmin, xmax = math.Min(xmin, s.xs[i]), math.Max(xmax, s.xs[i])
			y := math.Max(s.ys[i], 0.01)
			ymin, ymax = math.Min(ymin, y), math.Max(ymax, y)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`, W, H)
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="13" font-weight="bold">%s</text>`, L, html.EscapeString(title))
	if math.IsInf(xmin, 1) {
		b.WriteString(`<text x="100" y="100">no data</text></svg>`)
		return b.String()
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	px := func(x float64) float64 { return L + (x-xmin)/(xmax-xmin)*(W-L-R) }
	var py func(float64) float64
	var yTicks []float64
	if linearY {
		step := math.Pow(10, math.Floor(math.Log10(ymax)))
		top := math.Ceil(ymax/step) * step
		py = func(y float64) float64 { return H - B - y/top*(H-T-B) }
		for y := 0.0; y <= top; y += step {
			yTicks = append(yTicks, y)
		}
	} else {
		lo, hi := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
		if hi == lo {
			hi = lo + 1
		}
		py = func(y float64) float64 {
			return H - B - (math.Log10(math.Max(y, 0.01))-lo)/(hi-lo)*(H-T-B)
		}
		for e := lo; e <= hi; e++ {
			yTicks = append(yTicks, math.Pow(10, e))
		}
	}
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`, L, T, W-L-R, H-T-B)
	for _, yt := range yTicks {
		y := py(yt)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%g</text>`,
			L, W-R, y, y, L-4, y+4, yt)
	}
	if xTicks == nil {
		for i := 0; i <= 5; i++ {
			xTicks = append(xTicks, xmin+float64(i)*(xmax-xmin)/5)
		}
	}
	if xTickLabel == nil {
		xTickLabel = func(x float64) string { return fmt.Sprintf("%.3g", x) }
	}
	for _, x := range xTicks {
		if x < xmin || x > xmax {
			continue
		}
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#eee"/><text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`,
			px(x), px(x), T, H-B, px(x), H-B+14, html.EscapeString(xTickLabel(x)))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`, L+(W-L-R)/2, H-8, html.EscapeString(xLabel))
	fmt.Fprintf(&b, `<text transform="translate(14 %.0f) rotate(-90)" text-anchor="middle">%s</text>`, T+(H-T-B)/2, html.EscapeString(yLabel))
	for i, s := range ss {
		c := colour(s.group)
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		var pts []string
		for j := range s.xs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.xs[j]), py(s.ys[j])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s"%s stroke-width="1.5" points="%s"/>`, c, dash, strings.Join(pts, " "))
		ly := T + 12 + float64(i)*legendStep
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s"%s stroke-width="2"/><text x="%.0f" y="%.0f">%s</text>`,
			W-R+8, W-R+26, ly-4, ly-4, c, dash, W-R+30, ly, html.EscapeString(s.name))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// latencySpan says in a few words where x's latency starts and ends (its
// LatencyFrom says it in full).
func (r *Report) latencySpan(x Result) string {
	switch {
	case r.Scenario == ScenarioDrain:
		return "engine-start-to-commit"
	case x.LatencyAcked == x.Latency.Count:
		return "send-to-ack"
	default:
		return "send-to-ack-or-commit"
	}
}

// nines maps a percentile to -log10(1-p/100), so 90, 99, 99.9 are evenly spaced.
func nines(p float64) float64 { return -math.Log10(math.Max(1-p/100, 1e-6)) }

// WriteHTML writes a self-contained HTML report: the summary, a
// latency-over-time plot (rate runs only) and a percentile plot with a line
// per run (inline SVG, no external assets), titled by where the latency
// ends (see latencySpan).
func (r *Report) WriteHTML(w io.Writer) error {
	var b strings.Builder
	b.WriteString(`<!doctype html><html><head><meta charset="utf-8"><title>jetsink bench</title>
<style>body{font-family:sans-serif;margin:24px;max-width:1000px}pre{background:#f6f6f6;padding:12px;overflow-x:auto;font-size:12px}</style></head><body>`)
	fmt.Fprintf(&b, "<h1>jetsink bench: %s</h1>\n<pre>", html.EscapeString(r.Scenario))
	var text strings.Builder
	_ = r.WriteText(&text)
	b.WriteString(html.EscapeString(text.String()))
	b.WriteString("</pre>\n")

	name := func(x Result) string {
		n := fmt.Sprintf("%s #%d", x.Engine, x.Rep)
		if x.Variant != "" {
			n += " " + x.Variant
		}
		if x.lost() != "" {
			n += " (lost events: their latency is missing)"
		}
		return n
	}
	// The plots are titled by where the latency runs, which differs by
	// scenario and, in a rate run, by whether every row's ack was seen.
	spans := map[string]bool{}
	for _, x := range r.Results {
		if x.Failed == "" {
			spans[r.latencySpan(x)] = true
		}
	}
	title := "latency"
	if len(spans) == 1 {
		for sp := range spans {
			title = sp + " latency"
		}
	}
	var overTime, curves []series
	run := 0 // a run's lines share a colour
	for _, x := range r.Results {
		if x.Failed != "" {
			continue
		}
		run++
		n := name(x)
		if len(spans) > 1 {
			n += " (" + r.latencySpan(x) + ")"
		}
		p99 := series{name: n + " p99", group: run - 1}
		mx := series{name: n + " max", group: run - 1, dash: dashed}
		for _, t := range x.Timeline {
			p99.xs, p99.ys = append(p99.xs, t.T), append(p99.ys, t.P99)
			mx.xs, mx.ys = append(mx.xs, t.T), append(mx.ys, t.Max)
		}
		overTime = append(overTime, p99, mx)
		c := series{name: n, group: run - 1}
		for _, p := range x.Curve {
			c.xs, c.ys = append(c.xs, nines(p.Percentile)), append(c.ys, p.Ms)
		}
		curves = append(curves, c)
	}
	if r.Scenario == ScenarioRate {
		fmt.Fprintf(&b, "<h2>Latency over time</h2>\n<p>Per window of scheduled send time: p99 and max of %s.</p>\n", html.EscapeString(title))
		b.WriteString(svgPlot(title+" over time", "seconds since the first scheduled send", "ms (log)", overTime, nil, nil, false))
	} else {
		b.WriteString("<h2>Latency over time</h2>\n<p>Not plotted for a drain: its events were all sent before the engine started, so each one's latency is its commit time less the engine's start, which over time is the time axis itself.</p>\n")
	}
	b.WriteString("\n<h2>Latency by percentile</h2>\n")
	ticks := []float64{nines(0), nines(90), nines(99), nines(99.9), nines(99.99), nines(99.999), nines(100)}
	labels := map[float64]string{ticks[0]: "0", ticks[1]: "90", ticks[2]: "99", ticks[3]: "99.9", ticks[4]: "99.99", ticks[5]: "99.999", ticks[6]: "max"}
	b.WriteString(svgPlot(title+" by percentile", "percentile", "ms (log)", curves, ticks,
		func(x float64) string { return labels[x] }, false))
	var rss []series
	run = 0
	for _, x := range r.Results {
		if x.Failed != "" {
			continue
		}
		run++ // the colour of the run's latency lines
		if len(x.RSS) == 0 {
			continue
		}
		s, anon := series{name: name(x), group: run - 1}, series{name: name(x) + " anon", group: run - 1, dash: dashed}
		for _, p := range x.RSS {
			s.xs, s.ys = append(s.xs, float64(p.TS)), append(s.ys, mib(p.RSS))
			if p.Anon > 0 {
				anon.xs, anon.ys = append(anon.xs, float64(p.TS)), append(anon.ys, mib(p.Anon))
			}
		}
		rss = append(rss, s)
		if len(anon.xs) > 0 {
			rss = append(rss, anon)
		}
	}
	if len(rss) > 0 {
		b.WriteString("\n<h2>Memory over time</h2>\n<p>The engine's resident set (VmRSS) and, as \"anon\", its own part of it (RssAnon: heap, stacks, the Go runtime's; the rest is mostly its executable's pages), the most of each second; with --lock-for, the table was locked from the time the summary gives.</p>\n")
		b.WriteString(svgPlot("engine RSS over time", "seconds since the first scheduled send", "MiB", rss, nil, nil, true))
	}
	b.WriteString("\n</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

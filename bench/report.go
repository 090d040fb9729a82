package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// Stat is the median and spread of one figure over the repetitions.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// Spread is (max-min)/median, 0 when there is one value.
func (s Stat) Spread() float64 {
	if s.Median == 0 {
		return 0
	}
	return (s.Max - s.Min) / s.Median
}

func stat(vs []float64) Stat {
	if len(vs) == 0 {
		return Stat{}
	}
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// Summary aggregates one engine and variant over the repetitions. Ratio is
// the median over repetitions of this engine's events/s divided by the
// baseline's in the same repetition (0 without --compare), CPURatio the
// same of CPU per event. (A rate run offers both engines the same load, so
// its Ratio is near 1 whenever both keep up: compare latency and CPU.)
type Summary struct {
	Engine       string `json:"engine"`
	Variant      string `json:"variant,omitempty"`
	EventsPerSec Stat   `json:"events_per_s"`
	CPUPerEvent  Stat   `json:"cpu_us_per_event"`
	// SteadyCPUPerEvent leaves out the engine's start and shutdown (see
	// Result); N counts the runs that measured it.
	SteadyCPUPerEvent Stat `json:"steady_cpu_us_per_event,omitzero"`
	PeakRSSMiB        Stat `json:"peak_rss_mib"`
	// The peaks of RssAnon and RssFile (Result.RSSAnonMax, RSSFileMax);
	// N counts the runs that measured them.
	RSSAnonMiB Stat `json:"rss_anon_max_mib,omitzero"`
	RSSFileMiB Stat `json:"rss_file_max_mib,omitzero"`
	P50        Stat `json:"latency_p50_ms"`
	P90        Stat `json:"latency_p90_ms"`
	P99        Stat `json:"latency_p99_ms"`
	P999       Stat `json:"latency_p99_9_ms"`
	Max        Stat `json:"latency_max_ms"`
	P99Engine  Stat `json:"latency_stream_to_commit_p99_ms"` // the engine's part of P99 (to the COPY where CommitIsCopy)
	Load1      Stat `json:"load1"`
	Ratio      Stat `json:"ratio_to_baseline,omitzero"`
	CPURatio   Stat `json:"cpu_ratio_to_baseline,omitzero"`
	// LockRSSGrowthMiB is the engine's RSS growth while the table was
	// locked (Options.LockFor).
	LockRSSGrowthMiB Stat `json:"lock_rss_growth_mib,omitzero"`
	// LockRSSAnonGrowthMiB is the same of RssAnon.
	LockRSSAnonGrowthMiB Stat `json:"lock_rss_anon_growth_mib,omitzero"`

	commitEnd string // where P99Engine ends (Result.commitEnd)
}

func summarize(rs []Result) []Summary {
	type key struct{ engine, variant string }
	var order []key
	groups := map[key][]Result{}
	// Each variant's repetition runs its own baseline: a ratio is taken
	// against that one, never against another variant's.
	type run struct {
		variant string
		rep     int
	}
	baseline := map[run]Result{}
	for _, r := range rs {
		if r.Failed != "" || r.lost() != "" {
			// Partial figures: a 0 would drag every median down, and a
			// latency without the events lost flatters the tail.
			continue
		}
		k := key{r.Engine, r.Variant}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
		if r.Engine == EngineBaseline {
			baseline[run{r.Variant, r.Rep}] = r
		}
	}
	var out []Summary
	for _, k := range order {
		g := groups[k]
		col := func(f func(Result) float64) Stat {
			vs := make([]float64, len(g))
			for i, r := range g {
				vs[i] = f(r)
			}
			return stat(vs)
		}
		s := Summary{Engine: k.engine, Variant: k.variant,
			EventsPerSec: col(func(r Result) float64 { return r.EventsPerSec }),
			CPUPerEvent:  col(func(r Result) float64 { return r.CPUPerEvent }),
			PeakRSSMiB:   col(func(r Result) float64 { return float64(r.PeakRSS) / (1 << 20) }),
			P50:          col(func(r Result) float64 { return r.Latency.P50 }),
			P90:          col(func(r Result) float64 { return r.Latency.P90 }),
			P99:          col(func(r Result) float64 { return r.Latency.P99 }),
			P999:         col(func(r Result) float64 { return r.Latency.P999 }),
			Max:          col(func(r Result) float64 { return r.Latency.Max }),
			P99Engine:    col(func(r Result) float64 { return r.LatencyInEngine.P99 }),
			Load1:        col(func(r Result) float64 { return r.Load1 }),
		}
		var ratios, cpuRatios []float64
		for _, r := range g {
			b, ok := baseline[run{r.Variant, r.Rep}]
			if !ok || r.Engine == EngineBaseline {
				continue
			}
			if b.EventsPerSec > 0 {
				ratios = append(ratios, r.EventsPerSec/b.EventsPerSec)
			}
			if b.CPUPerEvent > 0 {
				cpuRatios = append(cpuRatios, r.CPUPerEvent/b.CPUPerEvent)
			}
		}
		s.Ratio, s.CPURatio = stat(ratios), stat(cpuRatios)
		s.commitEnd = g[0].commitEnd() // one bencher's runs: one server
		var growth, anonGrowth, steady, anon, file []float64
		for _, r := range g {
			if r.Lock != nil {
				growth = append(growth, mib(r.Lock.RSSGrowth))
				if r.Lock.RSSAnonBefore > 0 {
					anonGrowth = append(anonGrowth, mib(r.Lock.RSSAnonGrowth))
				}
			}
			if r.SteadyCPUPerEvent > 0 {
				steady = append(steady, r.SteadyCPUPerEvent)
			}
			if r.RSSAnonMax > 0 {
				anon, file = append(anon, mib(r.RSSAnonMax)), append(file, mib(r.RSSFileMax))
			}
		}
		s.SteadyCPUPerEvent = stat(steady)
		s.RSSAnonMiB, s.RSSFileMiB = stat(anon), stat(file)
		s.LockRSSGrowthMiB = stat(growth)
		s.LockRSSAnonGrowthMiB = stat(anonGrowth)
		out = append(out, s)
	}
	return out
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the human summary.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	switch r.Scenario {
	case ScenarioDrain:
		fmt.Fprintf(&b, "scenario drain: %d events preloaded over %d subjects; %s; NumCPU %d (CPU affinity, not a cgroup quota); %s\n", r.Events, r.Subjects, r.Target, r.CPUs, r.GoVer)
	default:
		fmt.Fprintf(&b, "scenario rate: %.0f events/s for %s over %d subjects (open loop); %s; NumCPU %d (CPU affinity, not a cgroup quota); %s\n", r.Rate, r.Duration, r.Subjects, r.Target, r.CPUs, r.GoVer)
	}
	fmt.Fprintf(&b, "streams' duplicate window: %s\n", r.DupWindow)
	for _, l := range r.Links {
		fmt.Fprintf(&b, "engines -> %s: a link adding %s to each round trip (chunks went out %.3f ms late on average, %.1f ms at most",
			l.Server, l.RTT, l.LateMeanMs, l.LateMaxMs)
		if l.Stalls > 0 {
			fmt.Fprintf(&b, "; it held traffic back %d times, %.1f ms in all", l.Stalls, l.StalledMs)
		}
		fmt.Fprintf(&b, "; %d connections)\n", l.Connections)
	}
	fmt.Fprintf(&b, "load average (1 min) before %.2f, after %.2f\n", r.LoadAvg[0], r.LoadAvg[1])
	if o := r.orderLine(); o != "" {
		fmt.Fprintln(&b, o)
	}
	fmt.Fprintln(&b, "\nper run:")
	for _, x := range r.Results {
		v := ""
		if x.Variant != "" {
			v = " [" + x.Variant + "]"
		}
		if x.Failed != "" {
			fmt.Fprintf(&b, "  #%d%s %-8s FAILED, not counted: %s\n", x.Rep, v, x.Engine, x.Failed)
			continue
		}
		fmt.Fprintf(&b, "  #%d%s %s\n", x.Rep, v, x.line(r.Scenario))
		if l := x.lost(); l != "" {
			fmt.Fprintf(&b, "      LOST EVENTS, not counted in the summary: %s\n", l)
		}
		// PublishPS is 0 for a run of one event: no rate to compare.
		if r.Scenario == ScenarioRate && r.Rate > 0 && x.PublishPS > 0 && x.PublishPS < 0.99*r.Rate {
			fmt.Fprintf(&b, "      THE PUBLISHER FELL BEHIND: it sent at %.0f/s of the %.0f/s offered (the latency still counts from the schedule)\n", x.PublishPS, r.Rate)
		}
		late, first := "", "startup"
		if r.Scenario == ScenarioRate {
			late, first = fmt.Sprintf(", %d late at the pending limit", x.PubLate), "first commit after"
		}
		stray := ""
		if x.Stray != 0 {
			stray += fmt.Sprintf(", %d with a stream_seq not published", x.Stray)
		}
		if x.StreamLastSeq != uint64(x.Published) {
			stray += fmt.Sprintf(", the stream's last sequence %d", x.StreamLastSeq)
		}
		fmt.Fprintf(&b, "      published %d at %.0f/s (%d publishes retried%s), committed %d rows (missing %d, duplicate %d%s), elapsed %.3fs (%s %.3fs), CPU %.2fs, batches min/p50/p90/max %d/%d/%d/%d mean %.0f\n",
			x.Published, x.PublishPS, x.PubRetried, late, x.Rows, x.Missing, x.Duplicate, stray, x.ElapsedS, first, x.StartupS, x.CPUSeconds,
			x.Batches.Min, x.Batches.P50, x.Batches.P90, x.Batches.Max, x.Batches.Mean)
		if l := x.SendLag; l != nil {
			fmt.Fprintf(&b, "      publisher send lag (send - scheduled) p50 %.2f p99 %.2f max %.1f ms, %d of %d events sent over 1 ms late\n",
				l.P50, l.P99, l.Max, l.Over1ms, l.Count)
		}
		if end, ok := strings.CutSuffix(x.LatencyFrom, ", from the engine's start"); ok {
			fmt.Fprintf(&b, "      latency is from the engine's start (the events were preloaded) to each event's commit (%s)\n", end)
		} else {
			fmt.Fprintf(&b, "      latency is from each event's scheduled send time to %s\n", x.LatencyFrom)
		}
		fmt.Fprintf(&b, "      %s\n", x.RanWith.line())
		if c := x.clockLine(); c != "" {
			fmt.Fprintf(&b, "      %s\n", c)
		}
		if c := x.clamped(); c != "" {
			fmt.Fprintf(&b, "      clamped into the histograms' range (1 µs..1 h): %s\n", c)
		}
	}
	fmt.Fprintln(&b, "\nsummary (median [min..max] over repetitions):")
	for _, s := range r.Summary {
		name := s.Engine
		if s.Variant != "" {
			name += " [" + s.Variant + "]"
		}
		parts := ""
		if s.RSSAnonMiB.N > 0 {
			parts = fmt.Sprintf(" (anon %s, file %s)", fmtStat(s.RSSAnonMiB, 1), fmtStat(s.RSSFileMiB, 1))
		}
		fmt.Fprintf(&b, "  %-22s events/s %s  CPU µs/event %s  peak RSS MiB %s%s  p50 ms %s  p90 ms %s  p99 ms %s  p99.9 ms %s  max ms %s",
			name, fmtStat(s.EventsPerSec, 0), fmtStat(s.CPUPerEvent, 2), fmtStat(s.PeakRSSMiB, 1), parts,
			fmtStat(s.P50, 1), fmtStat(s.P90, 1), fmtStat(s.P99, 1), fmtStat(s.P999, 1), fmtStat(s.Max, 1))
		if s.SteadyCPUPerEvent.N > 0 {
			fmt.Fprintf(&b, "  steady CPU µs/event %s", fmtStat(s.SteadyCPUPerEvent, 2))
		}
		if s.P99Engine.Median > 0 {
			fmt.Fprintf(&b, "  stored->%s p99 ms %s", s.commitEnd, fmtStat(s.P99Engine, 1))
		}
		if s.Ratio.N > 0 {
			fmt.Fprintf(&b, "  x baseline %s", fmtStat(s.Ratio, 2))
		}
		if s.CPURatio.N > 0 {
			fmt.Fprintf(&b, "  CPU/event x baseline %s", fmtStat(s.CPURatio, 2))
		}
		if s.LockRSSGrowthMiB.N > 0 {
			fmt.Fprintf(&b, "  RSS growth while locked MiB %s", fmtStat(s.LockRSSGrowthMiB, 1))
		}
		if s.LockRSSAnonGrowthMiB.N > 0 {
			fmt.Fprintf(&b, " (anon %s)", fmtStat(s.LockRSSAnonGrowthMiB, 1))
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// orderLine says which engine ran first in each repetition of a
// comparison: the order alternates, so an odd --count runs one engine
// first once more than the other, and the line says so.
func (r *Report) orderLine() string {
	if len(r.FirstByRep) == 0 {
		return ""
	}
	reps := map[string][]string{}
	var engines []string
	for i, e := range r.FirstByRep {
		if _, ok := reps[e]; !ok {
			engines = append(engines, e)
		}
		reps[e] = append(reps[e], fmt.Sprint(i+1))
	}
	var parts []string
	for _, e := range engines {
		parts = append(parts, fmt.Sprintf("%s in %s", e, strings.Join(reps[e], ", ")))
	}
	s := "ran first (the order alternates per repetition): " + strings.Join(parts, "; ")
	if len(engines) == 1 || len(reps[engines[0]]) != len(reps[engines[1]]) {
		s += " - not balanced: an odd --count runs one engine first once more"
	}
	return s
}

// clockLine warns of a server's clock off the host's by more than its
// estimate's uncertainty and clockWarn in r's run (its figures corrected
// for it), of one whose offset is not known to within clockWarn (a long
// round trip, or a drift over the run: the figures are right to within
// that), and of one the bench could not read (the figures uncorrected for
// it); "" when there is none.
func (r Result) clockLine() string {
	warn := float64(clockWarn) / float64(time.Millisecond)
	var parts []string
	for _, c := range []struct {
		name            string
		offset, pm, rtt float64
		unknown         bool
	}{{"PostgreSQL", r.PGClockOffsetMs, r.PGClockUncertaintyMs, r.PGClockRoundTripMs, r.PGClockUnknown},
		{"nats-server", r.NATSClockOffsetMs, r.NATSClockUncertaintyMs, r.NATSClockRoundTripMs, r.NATSClockUnknown}} {
		switch {
		case c.unknown:
			parts = append(parts, fmt.Sprintf("%s's clock COULD NOT BE READ (see stderr): the figures are uncorrected for its offset", c.name))
		case math.Abs(c.offset) > warn && math.Abs(c.offset) > c.pm:
			parts = append(parts, fmt.Sprintf("%s's clock OFF THIS HOST'S by %+.3f ms (±%.3f): its timestamps were taken less it, "+
				"the figures corrected to within the ±", c.name, c.offset, c.pm))
		case c.pm > warn:
			s := fmt.Sprintf("%s's clock offset not known to within ±%.3f ms", c.name, c.pm)
			if c.rtt > 0 {
				s += fmt.Sprintf(" (round trip %.3f ms", c.rtt)
				if drift := 2*c.pm - c.rtt; drift > 0.0005 {
					s += fmt.Sprintf(", drift over the run %.3f ms", drift)
				}
				s += ")"
			}
			parts = append(parts, s+": the figures are right to within that")
		}
	}
	return strings.Join(parts, "; ")
}

// clamped lists the distributions of r with values clamped into the
// histograms' range, or "" if none has.
func (r Result) clamped() string {
	var parts []string
	for _, d := range []struct {
		name string
		p    Percentiles
	}{{"latency", r.Latency}, {"to " + r.commitEnd(), r.LatencyToCommit}, {"send->stored", r.LatencyToStream},
		{"stored->" + r.commitEnd(), r.LatencyInEngine}, {"stored->COPY", r.LatencyBeforeCopy}, {"COPY->commit", r.LatencyCopyToCommit},
		{"stored->received", r.LatencyDelivery}, {"received->COPY", r.LatencyInside}, {"commit->ack", r.LatencyCommitToAck}} {
		if d.p.Clamped() > 0 {
			parts = append(parts, fmt.Sprintf("%s %d below 1 µs (negative included), %d above 1 h", d.name, d.p.BelowMin, d.p.AboveMax))
		}
	}
	return strings.Join(parts, "; ")
}

func fmtStat(s Stat, prec int) string {
	if s.N <= 1 {
		return fmt.Sprintf("%.*f", prec, s.Median)
	}
	return fmt.Sprintf("%.*f [%.*f..%.*f]", prec, s.Median, prec, s.Min, prec, s.Max)
}

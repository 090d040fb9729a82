package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/embedded"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// checkReport checks what must hold whatever the machine's speed: every
// published event committed once, percentiles monotone, batch sizes adding
// up, CPU and memory measured.
func checkReport(t *testing.T, rep *Report, engines int) {
	t.Helper()
	if len(rep.Results) != engines {
		t.Fatalf("%d results, want %d", len(rep.Results), engines)
	}
	for _, r := range rep.Results {
		if r.Published == 0 || r.Missing != 0 || r.Stray != 0 || r.Rows-r.Duplicate != int64(r.Published) || r.StreamLastSeq != uint64(r.Published) {
			t.Errorf("%s: published %d, rows %d, duplicate %d, missing %d, stray %d, stream's last sequence %d",
				r.Engine, r.Published, r.Rows, r.Duplicate, r.Missing, r.Stray, r.StreamLastSeq)
		}
		if rate := rep.Scenario == ScenarioRate; rate != (r.SendLag != nil) || rate && r.SendLag.Count != int64(r.Published) {
			t.Errorf("%s: send lag %+v in a %s run of %d events", r.Engine, r.SendLag, rep.Scenario, r.Published)
		}
		if l := r.Latency; l.Clamped() != 0 {
			t.Errorf("%s: latency clamped: %+v", r.Engine, l)
		}
		if r.Duplicate > max(r.Redelivered, 0) {
			t.Errorf("%s: %d duplicate rows but only %d redeliveries", r.Engine, r.Duplicate, r.Redelivered)
		}
		l := r.Latency
		if l.Count != r.Rows || !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) {
			t.Errorf("%s: latency not complete and monotone: %+v", r.Engine, l)
		}
		if len(r.Curve) == 0 || r.Curve[0].Percentile != 0 || r.Curve[0].Ms <= 0 {
			t.Errorf("%s: the curve's 0th percentile is not the least latency: %+v", r.Engine, r.Curve)
		}
		for i := 1; i < len(r.Curve); i++ {
			if r.Curve[i].Ms < r.Curve[i-1].Ms || r.Curve[i].Percentile <= r.Curve[i-1].Percentile {
				t.Errorf("%s: percentile curve not monotone at %d: %+v", r.Engine, i, r.Curve)
			}
		}
		var inWindows int64
		for _, p := range r.Timeline {
			inWindows += p.Count
		}
		if want := map[string]int64{ScenarioRate: r.Rows}[rep.Scenario]; inWindows != want { // none for a drain
			t.Errorf("%s: timeline holds %d rows, want %d", r.Engine, inWindows, want)
		}
		b := r.Batches
		if b.Count == 0 || b.Min < 1 || b.Min > b.P50 || b.P50 > b.P90 || b.P90 > b.Max ||
			int64(b.Mean*float64(b.Count)+0.5) != r.Rows {
			t.Errorf("%s: batches inconsistent with %d rows: %+v", r.Engine, r.Rows, b)
		}
		if r.EventsPerSec <= 0 || r.ElapsedS <= 0 || r.CPUSeconds <= 0 || r.PeakRSS <= 0 {
			t.Errorf("%s: figures missing: %+v", r.Engine, r)
		}
	}
	if len(rep.Summary) != engines {
		t.Errorf("%d summaries, want %d", len(rep.Summary), engines)
	}
	var text, js, html bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "summary") {
		t.Errorf("text report: %v\n%s", err, text.String())
	}
	if err := rep.WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"p99_9_ms"`) {
		t.Errorf("JSON report: %v", err)
	}
	// Self-contained: one inline plot for a drain (the percentiles), three
	// for a rate run (and latency over time, RSS), nothing loaded from
	// elsewhere.
	plots := 1
	if rep.Scenario == ScenarioRate {
		plots = 3
	}
	if err := rep.WriteHTML(&html); err != nil || strings.Count(html.String(), "<svg") != plots ||
		strings.Contains(html.String(), "src=") || strings.Contains(html.String(), "href=") {
		t.Errorf("HTML report: %v", err)
	}
}

// testBase is the default configuration on the servers the tests use.
func testBase(t *testing.T) config.Config {
	ns, pg := testenv.NATS(t), testenv.Postgres(t)
	base := config.Default()
	base.NATS.URL, base.Postgres.URL = ns.URL(), pg.URL
	return base
}

// TestDrainCompareBaseline runs a short drain of jetsink and the baseline on
// the servers the tests use (committed_at stands in for the commit time).
func TestDrainCompareBaseline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	base := testBase(t)
	base.Pipeline.Workers = 2
	rep, err := Run(ctx, Options{Exe: testenv.Jetsink(t), Base: base, Scenario: ScenarioDrain, Events: 20_000,
		Subjects: 100, Compare: true, Timeout: 3 * time.Minute, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 2)
	checkMemParts(t, rep)
	if len(rep.FirstByRep) != 1 || rep.FirstByRep[0] != rep.Results[0].Engine {
		t.Errorf("first engine by repetition %v, but %s ran first", rep.FirstByRep, rep.Results[0].Engine)
	}
	if s := rep.Summary; s[0].Ratio.N != 1 || s[0].Ratio.Median <= 0 {
		t.Errorf("no ratio to the baseline: %+v", s[0])
	}
	for _, r := range rep.Results {
		// As each engine logged it at its start.
		w := r.RanWith
		switch r.Engine {
		case EngineBaseline:
			if w.GOMAXPROCS < 1 || w.Workers != 1 || w.Connections != 1 || w.Mode != "at-least-once" || w.CPUQuota == "" || len(w.NotReported) > 0 {
				t.Errorf("baseline ran with %+v", w)
			}
		default:
			if w.GOMAXPROCS < 1 || w.Workers != 2 || w.Connections < 1 || w.Mode != "at-least-once" || w.CPUQuota == "" || len(w.NotReported) > 0 {
				t.Errorf("jetsink ran with %+v, want 2 workers in at-least-once mode, every key reported", w)
			}
		}
		if got := r.LatencyFrom; !strings.HasPrefix(got, "committed_at") && !strings.HasPrefix(got, "pg_xact") {
			t.Errorf("%s: latency source %q", r.Engine, got)
		}
		// Counted from the engine's own start, not the preload's sends
		// (which the second engine would pay the first one's run for).
		// (The histogram's max is its bucket's top: 3 significant digits.)
		if elapsed := r.ElapsedS * 1000; r.Latency.Max > elapsed*1.002+1 {
			t.Errorf("%s: drain latency max %.1f ms, longer than its run (%.1f ms)", r.Engine, r.Latency.Max, elapsed)
		}
		// So are its legs from the store time: a part of the whole.
		if r.LatencyInEngine.Count != r.Latency.Count || r.LatencyInEngine.Max > r.Latency.Max {
			t.Errorf("%s: stored->commit %+v, beyond the whole latency %+v", r.Engine, r.LatencyInEngine, r.Latency)
		}
	}
}

// With --postgres-rtt and --nats-rtt both engines reach the embedded
// servers through the delayed links, and still store every event once.
func TestDrainOverDelayedLinks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	base := config.Default()
	base.Pipeline.Workers = 1
	rep, err := Run(ctx, Options{Exe: testenv.Jetsink(t), Base: base, Embedded: true, ColdPostgres: true,
		Scenario: ScenarioDrain, Events: 5000, Subjects: 10, Compare: true, Timeout: 3 * time.Minute,
		PostgresRTT: 6 * time.Millisecond, NATSRTT: 2 * time.Millisecond, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 2)
	if len(rep.Links) != 2 || rep.Links[0].Server != "PostgreSQL" || rep.Links[1].Server != "NATS" ||
		rep.Links[0].RTT != "6ms" || rep.Links[1].RTT != "2ms" {
		t.Fatalf("links %+v", rep.Links)
	}
	for _, l := range rep.Links {
		// Each engine connects at least once to each server through it
		// (TestEngineConfigGoesThroughTheLinks: the baseline too); their
		// first answers waited for their due times.
		if l.Connections < 2 || l.LateMeanMs <= 0 || l.LateMaxMs < l.LateMeanMs {
			t.Errorf("%s link: %+v", l.Server, l)
		}
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "engines -> PostgreSQL: a link adding 6ms to each round trip") {
		t.Errorf("text report (%v):\n%s", err, text.String())
	}
}

// Both engines' configurations take the servers' URLs the engines
// connect to (the links'), not the bench's own; jetsink's also its run's
// names, and none of a config's nats.stream_* keys, with which jetsink
// would change the bench's stream for itself alone.
func TestEngineConfigGoesThroughTheLinks(t *testing.T) {
	b := &bencher{}
	b.cfg.NATS.URL, b.cfg.Postgres.URL = "nats://127.0.0.1:4222", "postgres://u@127.0.0.1:5432/db"
	b.cfg.NATS.StreamMaxAge, b.cfg.NATS.StreamMaxBytes, b.cfg.NATS.StreamReplicas, b.cfg.NATS.StreamDuplicateWindow = time.Hour, 1<<30, 3, 10*time.Second
	b.engineCfg = b.cfg
	b.engineCfg.NATS.URL, b.engineCfg.Postgres.URL = "nats://127.0.0.1:5000", "postgres://u@127.0.0.1:5001/db"
	for _, e := range []string{EngineJetsink, EngineBaseline} {
		tg := newTarget(e, "S", "p", Variant{})
		c := b.engineConfig(tg)
		if c.NATS.URL != b.engineCfg.NATS.URL || c.Postgres.URL != b.engineCfg.Postgres.URL {
			t.Errorf("%s: NATS %s, PostgreSQL %s; want the links'", e, c.NATS.URL, c.Postgres.URL)
		}
		if e == EngineJetsink && (c.NATS.Stream != "S" || c.Postgres.Table != tg.table || c.NATS.Consumer != tg.consumer) {
			t.Errorf("jetsink: stream %s, table %s, consumer %s", c.NATS.Stream, c.Postgres.Table, c.NATS.Consumer)
		}
		if e == EngineJetsink && (c.NATS.StreamMaxAge != 0 || c.NATS.StreamMaxBytes != 0 || c.NATS.StreamReplicas != 0 || c.NATS.StreamDuplicateWindow != 0) {
			t.Errorf("jetsink changes the bench's stream: %+v", c.NATS)
		}
	}
}

// A variant in exactly-once mode gets the unique index that mode needs
// (the base configuration is at-least-once), and drains. The report says
// what jetsink ran with, as jetsink logged it: the variant's mode, workers,
// connections and GOMAXPROCS (GOMAXPROCS=1 in its environment), in the
// JSON and the text; a value jetsink does not log is named as not logged,
// never worked out by the bench.
func TestDrainExactlyOnceVariant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := testBase(t)
	rep, err := Run(ctx, Options{Exe: testenv.Jetsink(t), Base: base, Scenario: ScenarioDrain, Events: 2000, Subjects: 10,
		Variants: []Variant{{Name: "postgres.mode=exactly-once", Set: []string{"postgres.mode=exactly-once", "pipeline.workers=3", "postgres.connections=2"},
			Env: []string{"GOMAXPROCS=1"}}},
		Timeout: time.Minute, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 1)
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Results []struct {
			RanWith RanWith `json:"ran_with"`
		} `json:"results"`
	}
	if err := json.Unmarshal(js.Bytes(), &parsed); err != nil || len(parsed.Results) != 1 {
		t.Fatalf("JSON report (%v):\n%s", err, js.String())
	}
	got := parsed.Results[0].RanWith
	if got.Workers != 3 || got.Mode != "exactly-once" {
		t.Errorf("ran_with %+v, want 3 workers in exactly-once mode", got)
	}
	if got.GOMAXPROCS != 1 || got.Connections != 2 || got.CPUQuota == "" || len(got.NotReported) > 0 {
		t.Errorf("ran_with %+v, want the variant's GOMAXPROCS 1 and 2 connections, and a CPU quota (none, say), every key reported", got)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "ran with (as it logged at its start): ") ||
		!strings.Contains(text.String(), "pipeline.workers 3") || !strings.Contains(text.String(), ", exactly-once") ||
		!strings.Contains(text.String(), "NumCPU ") {
		t.Errorf("text report (%v):\n%s", err, text.String())
	}
}

// A run that does not complete is marked, said so in the text, and left
// out of the summary: its zeros would drag the medians down.
func TestFailedRunLeftOutOfSummary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := testBase(t)
	rep, err := Run(ctx, Options{Exe: testenv.Jetsink(t), Base: base, Scenario: ScenarioDrain, Events: 100, Subjects: 10,
		Timeout: time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "did not drain within 1ms (--timeout)") {
		t.Fatalf("Run = %v, want the timeout", err)
	}
	if len(rep.Results) != 1 || !strings.Contains(rep.Results[0].Failed, "did not drain") || len(rep.Summary) != 0 {
		t.Fatalf("results %+v, summary %+v: want one failed run and no summary", rep.Results, rep.Summary)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "jetsink  FAILED, not counted: bench: jetsink did not drain") {
		t.Fatalf("text report (%v):\n%s", err, text.String())
	}

	rs := []Result{{Engine: EngineJetsink, Rep: 1, EventsPerSec: 100}, {Engine: EngineJetsink, Rep: 2, EventsPerSec: 120},
		{Engine: EngineJetsink, Rep: 3, Failed: "interrupted"}}
	if s := summarize(rs); len(s) != 1 || s[0].EventsPerSec.N != 2 || s[0].EventsPerSec.Median != 110 {
		t.Fatalf("summary %+v, want the median of the two complete runs", s)
	}

	// A run that lost events is left out too (its latency lacks them),
	// and said so.
	rs = []Result{{Engine: EngineJetsink, Rep: 1, EventsPerSec: 100, Published: 10, StreamLastSeq: 10},
		{Engine: EngineJetsink, Rep: 2, EventsPerSec: 300, Published: 10, StreamLastSeq: 10, Missing: 2},
		{Engine: EngineJetsink, Rep: 3, EventsPerSec: 120, Published: 10, StreamLastSeq: 10}}
	lossy := Report{Scenario: ScenarioDrain, Results: rs, Summary: summarize(rs)}
	if s := lossy.Summary; len(s) != 1 || s[0].EventsPerSec.N != 2 || s[0].EventsPerSec.Median != 110 {
		t.Fatalf("summary %+v, want the median of the two runs that lost nothing", s)
	}
	text.Reset()
	if err := lossy.WriteText(&text); err != nil || !strings.Contains(text.String(), "LOST EVENTS, not counted in the summary: 2 missing") {
		t.Fatalf("text report (%v):\n%s", err, text.String())
	}
}

// TestRateEmbedded runs 2 s at 2,000 events/s open loop on the embedded
// default (its own nats-server and PostgreSQL with fsync and commit
// timestamps on).
func TestRateEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if os.Getenv(testenv.EnvDatabaseURL) != "" {
		// The embedded default is what is under test here; it needs local
		// PostgreSQL binaries, which a JETSINK_TEST_DATABASE_URL setup may lack.
		t.Log("runs the embedded default regardless of " + testenv.EnvDatabaseURL)
	}
	rep, err := Run(ctx, Options{Exe: testenv.Jetsink(t), Base: config.Default(), Embedded: true, Scenario: ScenarioRate,
		Rate: 2000, Duration: 2 * time.Second, Subjects: 50, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 1)
	r := rep.Results[0]
	if r.Published != 4000 || r.SendLag == nil {
		t.Fatalf("published %d, send lag %v; want 4000 and a send lag", r.Published, r.SendLag)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), fmt.Sprintf("retried, %d late at the pending limit), committed", r.PubLate)) ||
		!strings.Contains(text.String(), "(first commit after ") ||
		!strings.Contains(text.String(), "events sent over 1 ms late\n      latency is from each event's scheduled send time to the first ack the bench saw\n") {
		t.Errorf("rate run's text report (%v) without the late events or the first commit:\n%s", err, text.String())
	}
	if r.LatencyFrom != "the first ack the bench saw" || r.LatencyAcked != r.Rows || r.Latency.Count != r.Rows {
		t.Errorf("rate run measured latency to %q (%d of %d rows acked), want every row's ack", r.LatencyFrom, r.LatencyAcked, r.Rows)
	}
	// The ack comes after the commit: its timestamp, its WAL flush.
	if c := r.LatencyCommitToAck; c.Count != r.Rows || c.P50 <= 0 {
		t.Errorf("commit->ack leg %+v for %d rows", c, r.Rows)
	}
	if len(r.Timeline) < 10 {
		t.Errorf("timeline has %d windows for a 2 s run, want about 20", len(r.Timeline))
	}
	if runtime.GOOS == "linux" && r.PostgresCPUPerEvent <= 0 {
		t.Errorf("no PostgreSQL CPU measured for the embedded server: %v µs/event", r.PostgresCPUPerEvent)
	}
	// The engine's CPU up to its last ack, in 10 ms ticks: none of its
	// shutdown, which CPUPerEvent holds.
	if runtime.GOOS == "linux" && (r.MachineEngineCPUPerEvent <= 0 || r.MachineEngineCPUPerEvent > r.CPUPerEvent+0.01e6/float64(r.Published)) {
		t.Errorf("engine CPU in the machine window %v µs/event, whole life %v", r.MachineEngineCPUPerEvent, r.CPUPerEvent)
	}
	if runtime.GOOS == "linux" && (r.SteadyCPUPerEvent <= 0 || rep.Summary[0].SteadyCPUPerEvent.N != 1) {
		t.Errorf("no steady CPU measured over 2 s of acks: %v µs/event, summary %+v", r.SteadyCPUPerEvent, rep.Summary[0].SteadyCPUPerEvent)
	}
}

// prepareEmbedded turns commit timestamps on either way; prepared warm,
// the cluster has WAL segments ready past the current one (recycled ones;
// a new cluster has at most one), so that the runs' WAL does not create
// and fsync new ones.
func TestPrepareEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := embedded.StartPostgres(embedded.WithFsync())
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Destroy()
	look := func(what string) (segments int, track, minWAL, maxWAL string) {
		t.Helper()
		db, err := pgx.Connect(ctx, pg.URL("postgres"))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer db.Close(ctx)
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_ls_waldir()
			WHERE name ~ '^[0-9A-F]{24}$' AND name > pg_walfile_name(pg_current_wal_lsn())`).Scan(&segments); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := db.QueryRow(ctx, `SELECT current_setting('track_commit_timestamp'),
			current_setting('min_wal_size'), current_setting('max_wal_size')`).Scan(&track, &minWAL, &maxWAL); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return segments, track, minWAL, maxWAL
	}
	if err := prepareEmbedded(ctx, pg, false); err != nil {
		t.Fatal(err)
	}
	if n, track, _, _ := look("cold"); n > 3 || track != "on" {
		t.Fatalf("cold: %d WAL segments ahead, track_commit_timestamp %s; want a new cluster's few and on", n, track)
	}
	if err := prepareEmbedded(ctx, pg, true); err != nil {
		t.Fatal(err)
	}
	// pg_reload_conf only signals the postmaster: give the new max_wal_size a
	// moment to reach a new connection's backend.
	var n int
	var track, minWAL, maxWAL string
	for range 50 {
		if n, track, minWAL, maxWAL = look("warm"); maxWAL == "1GB" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n < warmSegments-4 || track != "on" || minWAL != "1GB" || maxWAL != "1GB" {
		t.Fatalf("warm: %d WAL segments ahead, track_commit_timestamp %s, min_wal_size %s, max_wal_size %s; want >= %d ahead, on, 1GB, 1GB",
			n, track, minWAL, maxWAL, warmSegments-4)
	} else {
		t.Logf("warm: %d WAL segments ahead", n)
	}
}

// steadyCPU divides the CPU between two marks by the deliveries between
// them, and gives nothing for a window it cannot measure well.
func TestSteadyCPU(t *testing.T) {
	t0 := time.Unix(1000, 0)
	first := cpuMark{at: t0, ticks: 100, delivered: 10_000}
	for _, c := range []struct {
		name        string
		first, last cpuMark
		want        float64
	}{
		{"150 ticks over 30,000 deliveries", first, cpuMark{at: t0.Add(2 * time.Second), ticks: 250, delivered: 40_000}, 50},
		{"no first mark", cpuMark{}, cpuMark{at: t0.Add(2 * time.Second), ticks: 250, delivered: 40_000}, 0},
		{"under a second", first, cpuMark{at: t0.Add(999 * time.Millisecond), ticks: 250, delivered: 40_000}, 0},
		{"no deliveries in between", first, cpuMark{at: t0.Add(2 * time.Second), ticks: 250, delivered: 10_000}, 0},
	} {
		if got := steadyCPU(c.first, c.last); got != c.want {
			t.Errorf("%s: steadyCPU = %v µs/event, want %v", c.name, got, c.want)
		}
	}
}

// A drain's steady window opens at the last poll before the consumer
// delivered anything, so that it holds all the work of every event it
// counts: opened at the first ack (here 5,000 acked of 20,000 delivered,
// after 18 ticks of receiving and decoding them) it left out that CPU and
// still counted those events. A rate run's window opens where it was given.
func TestSteadyWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	polls := []cpuMark{
		{at: t0, ticks: 5}, // no consumer yet
		{at: t0.Add(25 * time.Millisecond), ticks: 10},                    // created, nothing delivered
		{at: t0.Add(50 * time.Millisecond), ticks: 28, delivered: 20_000}, // the first batch acked
		{at: t0.Add(time.Second), ticks: 60, delivered: 60_000},
	}
	last := cpuMark{at: t0.Add(2 * time.Second), ticks: 110, delivered: 100_000}
	w := newSteadyWindow(cpuMark{})
	for _, m := range polls {
		w.poll(m)
	}
	if got, want := steadyCPU(w.first, last), 10.0; got != want { // 100 ticks = 1 s over 100,000 events
		t.Errorf("drain: steady CPU %v µs/event from %+v, want %v from the poll before the first delivery", got, w.first, want)
	}
	// The first poll already saw deliveries: no window, rather than a biased one.
	w = newSteadyWindow(cpuMark{})
	for _, m := range polls[2:] {
		w.poll(m)
	}
	if got := steadyCPU(w.first, last); got != 0 {
		t.Errorf("no poll before the first delivery: steady CPU %v, want none", got)
	}
	// A rate run's first mark (the first scheduled send) stays.
	start := cpuMark{at: t0.Add(-time.Second), ticks: 0}
	w = newSteadyWindow(start)
	w.poll(cpuMark{at: t0, ticks: 40})
	if w.first != start {
		t.Errorf("rate: first mark moved to %+v", w.first)
	}
}

// scriptedEngine plays an engine and its consumer for ackPoller: each
// info call is answered with the next step, the engine having used
// answered ticks of CPU by the answer and late more while the answer
// travels back. Each request takes 500 ms.
type scriptedEngine struct {
	t0    time.Time
	now   time.Duration
	ticks int64
	steps []engineStep
}

type engineStep struct {
	err              error
	delivered, acked uint64
	answered, late   int64
}

func (e *scriptedEngine) poller(t *testing.T, lastSeq uint64, first cpuMark) *ackPoller {
	return &ackPoller{
		info: func(context.Context) (*jetstream.ConsumerInfo, error) {
			if len(e.steps) == 0 {
				t.Fatal("polled past the script")
			}
			st := e.steps[0]
			e.steps = e.steps[1:]
			e.now += 500 * time.Millisecond
			e.ticks = st.answered + st.late
			if st.err != nil {
				return nil, st.err
			}
			ci := &jetstream.ConsumerInfo{NumAckPending: int(st.delivered - st.acked)}
			ci.Delivered.Stream, ci.AckFloor.Stream = st.delivered, st.acked
			return ci, nil
		},
		cpu:     func() (cpuMark, bool) { return cpuMark{at: e.t0.Add(e.now), ticks: e.ticks}, true },
		lastSeq: lastSeq,
		w:       newSteadyWindow(first),
	}
}

// run polls until the poller is done and returns the steady CPU.
func (e *scriptedEngine) run(t *testing.T, p *ackPoller) float64 {
	t.Helper()
	for {
		if ci, steady, done := p.poll(context.Background()); done {
			if len(e.steps) != 0 || ci == nil {
				t.Fatalf("done with %d steps left, info %+v", len(e.steps), ci)
			}
			return steady
		}
	}
}

// Only a consumer not found yet says nothing was delivered: a poll the
// server did not answer (a timeout, a 503 from a saturated nats-server)
// says nothing, and sets no mark. Taken for "nothing yet", the two here
// moved a drain's first mark past the 35 ticks the engine had spent on its
// first deliveries meanwhile, and the steady CPU came out at 6.5
// µs/event, not 10.
func TestAckPollerSkipsUnansweredPolls(t *testing.T) {
	e := &scriptedEngine{t0: time.Unix(1000, 0), ticks: 5, steps: []engineStep{
		{err: jetstream.ErrConsumerNotFound, answered: 5},
		{err: context.DeadlineExceeded, answered: 25},
		{err: &jetstream.APIError{Code: 503, Description: "JetStream system temporarily unavailable"}, answered: 40},
		{delivered: 60_000, acked: 40_000, answered: 60},
		{delivered: 100_000, acked: 100_000, answered: 105}, // 100 ticks = 1 s over 100,000 events
	}}
	if got, want := e.run(t, e.poller(t, 100_000, cpuMark{})), 10.0; got != want {
		t.Errorf("steady CPU %v µs/event, want %v from the poll that did not find the consumer", got, want)
	}
}

// The window's first mark reads the CPU before the request, its last after
// the answer: each way, the window holds all the CPU of the events it
// counts. Here the engine, told nothing was delivered yet, spent 8 ticks on
// its first batch while the answer travelled back, and 3 on its last acks
// between the poll before last and the answer to the last; read after
// the round trip, the first mark left those 8 out (9.0 µs/event, not 9.8),
// read before the request, the last mark left those 3 out.
func TestAckPollerReadsCPUOnTheConservativeSide(t *testing.T) {
	e := &scriptedEngine{t0: time.Unix(1000, 0), ticks: 5, steps: []engineStep{
		{err: jetstream.ErrConsumerNotFound, answered: 10},
		{answered: 10, late: 8}, // the first mark: 10 ticks
		{delivered: 60_000, acked: 40_000, answered: 60, late: 45},
		{delivered: 100_000, acked: 100_000, answered: 108}, // the last: 108
	}}
	if got, want := e.run(t, e.poller(t, 100_000, cpuMark{})), 9.8; got != want { // 98 ticks over 100,000 events
		t.Errorf("drain: steady CPU %v µs/event, want %v", got, want)
	}
	// A rate run's first mark is given; the last still comes after the
	// answer.
	e = &scriptedEngine{t0: time.Unix(1000, 0), ticks: 50, steps: []engineStep{
		{delivered: 50_000, acked: 50_000, answered: 150},
	}}
	if got, want := e.run(t, e.poller(t, 50_000, cpuMark{at: time.Unix(999, 0), ticks: 50})), 20.0; got != want {
		t.Errorf("rate: steady CPU %v µs/event, want %v", got, want)
	}
}

// TestRateWithLock locks the table for 1.5 s of a 3 s run at 2,000
// events/s: every event is still committed once, none is redelivered (the
// lock is far shorter than ack_wait), events sent as the lock was taken wait
// for its release, and the lock's RSS figures come from the sampler.
func TestRateWithLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{Exe: testenv.Jetsink(t), Base: config.Default(), Embedded: true, Scenario: ScenarioRate,
		Rate: 2000, Duration: 3 * time.Second, Subjects: 50, Timeout: 2 * time.Minute,
		LockAt: 500 * time.Millisecond, LockFor: 1500 * time.Millisecond,
		ColdPostgres: true}) // TestRateEmbedded runs the prepared one
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, 1)
	r := rep.Results[0]
	l := r.Lock
	if l == nil {
		t.Fatal("no lock result")
	}
	if r.Published != 6000 || r.Missing != 0 || r.Duplicate != 0 || r.Redelivered != 0 {
		t.Errorf("published %d, missing %d, duplicate %d, redelivered %d; want 6000, 0, 0, 0", r.Published, r.Missing, r.Duplicate, r.Redelivered)
	}
	if l.HeldS < 1.5 || l.CatchUpS <= 0 || l.CatchUpS > r.ElapsedS-l.AtS-l.HeldS+0.001 {
		t.Errorf("lock held %.3f s, caught up %.3f s after the release of a %.3f s run", l.HeldS, l.CatchUpS, r.ElapsedS)
	}
	if waited := r.Latency.Max / 1000; waited < l.HeldS-0.3 {
		t.Errorf("max latency %.3f s while the table was locked for %.3f s: commits did not wait for the lock", waited, l.HeldS)
	}
	if l.RSSBefore <= 0 || l.RSSMaxDuring < l.RSSBefore || l.RSSMaxCatchUp <= 0 {
		t.Errorf("lock RSS before %d, max during %d, max catching up %d", l.RSSBefore, l.RSSMaxDuring, l.RSSMaxCatchUp)
	}
	if l.RSSAnonBefore <= 0 || l.RSSAnonBefore >= l.RSSBefore || l.RSSAnonMaxDuring < l.RSSAnonBefore || l.RSSAnonMaxCatchUp <= 0 {
		t.Errorf("lock RssAnon before %d (RSS %d), max during %d, max catching up %d", l.RSSAnonBefore, l.RSSBefore, l.RSSAnonMaxDuring, l.RSSAnonMaxCatchUp)
	}
	for _, p := range r.RSS {
		if p.Anon <= 0 || p.Anon >= p.RSS {
			t.Errorf("RSS timeline point %+v: want an RssAnon below the RSS", p)
		}
	}
	if len(r.RSS) < 3 {
		t.Errorf("RSS timeline %v: want a point per second of a 3 s run", r.RSS)
	}
	if s := rep.Summary[0].LockRSSGrowthMiB; s.N != 1 {
		t.Errorf("summary lock RSS growth %+v, want one value", s)
	}
	if s := rep.Summary[0].LockRSSAnonGrowthMiB; s.N != 1 {
		t.Errorf("summary lock RssAnon growth %+v, want one value", s)
	}
	var page bytes.Buffer
	if err := rep.WriteHTML(&page); err != nil || !strings.Contains(page.String(), ">jetsink #1 anon</text>") {
		t.Errorf("HTML report (%v): the memory plot has no RssAnon line:\n%s", err, page.String())
	}
}

// A lock that cannot be taken (here: no such table) reports its error from
// wait, calls fail with it (the publisher stops), and never marks; one that
// is cancelled while it waits to start returns at once.
func TestTableLockFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := &bencher{cfg: config.Default()}
	b.cfg.Postgres.URL = testenv.Postgres(t).URL
	var failed error
	marks := 0
	l, err := b.lockTable(ctx, "no_such_table", time.Second, func() { marks++ }, func(err error) { failed = err })
	if err != nil {
		t.Fatal(err)
	}
	l.start(time.Now())
	if err := l.wait(); err == nil || !strings.Contains(err.Error(), "no_such_table") || failed != err || marks != 0 {
		t.Fatalf("wait = %v, fail got %v, %d marks; want the lock's error twice and no mark", err, failed, marks)
	}

	failed = nil
	l, err = b.lockTable(ctx, "no_such_table", time.Second, func() { marks++ }, func(err error) { failed = err })
	if err != nil {
		t.Fatal(err)
	}
	l.start(time.Now().Add(time.Hour))
	l.cancel()
	if err := l.wait(); err != context.Canceled || failed != nil {
		t.Fatalf("cancelled lock: wait = %v, fail got %v; want context.Canceled and no call", err, failed)
	}
}

// hold's closing sample is taken while the lock is still held (another
// connection sees it), so result counts it in RSSMaxDuring, as
// LockResult says, not in the catch-up after the release; one more, after
// the release, is the catch-up's (TestRateWithLock's short catch-up had
// none).
func TestTableLockSamplesBothEndsWhileHeld(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg := testenv.Postgres(t)
	b := &bencher{cfg: config.Default(), db: pg.Conn(t)}
	b.cfg.Postgres.URL = pg.URL
	tg := target{engine: EngineBaseline, table: "lock_samples"}
	if err := b.createTable(ctx, tg); err != nil {
		t.Fatal(err)
	}
	defer b.dropTable(tg.table)
	var (
		samples []rssSample
		locked  []bool
		lockErr error
	)
	mark := func() { // on the lock's goroutine; the test waits for it
		samples = append(samples, rssSample{time.Now(), int64(len(samples)+1) << 20, int64(len(samples)+1) << 19})
		var n int
		err := b.db.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE relation = $1::regclass AND mode = 'AccessExclusiveLock' AND granted`, tg.table).Scan(&n)
		lockErr = errors.Join(lockErr, err)
		locked = append(locked, n > 0)
	}
	l, err := b.lockTable(ctx, tg.table, minLockFor, mark, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	l.start(start)
	if err := l.wait(); err != nil {
		t.Fatal(err)
	}
	if lockErr != nil {
		t.Fatal(lockErr)
	}
	if len(samples) != 3 || !locked[0] || !locked[1] || locked[2] {
		t.Fatalf("%d samples, lock held at each: %v; want 3, the first two while the lock was held, the last after", len(samples), locked)
	}
	r := l.result(samples, start, l.held.Add(time.Second))
	if r.RSSBefore != 1<<20 || r.RSSMaxDuring != 2<<20 || r.RSSGrowth != 1<<20 || r.RSSMaxCatchUp != 3<<20 {
		t.Errorf("before %d, max during %d, growth %d, max catching up %d; want 1 MiB, 2 MiB (the closing sample), 1 MiB, 3 MiB (the catch-up's first)",
			r.RSSBefore, r.RSSMaxDuring, r.RSSGrowth, r.RSSMaxCatchUp)
	}
	if r.RSSAnonBefore != 1<<19 || r.RSSAnonMaxDuring != 2<<19 || r.RSSAnonGrowth != 1<<19 || r.RSSAnonMaxCatchUp != 3<<19 {
		t.Errorf("anon before %d, max during %d, growth %d, max catching up %d; want half the RSS figures",
			r.RSSAnonBefore, r.RSSAnonMaxDuring, r.RSSAnonGrowth, r.RSSAnonMaxCatchUp)
	}
}

// treeCPU counts a live child's CPU (as for a running backend) and a child
// the parent has reaped (as for a backend that has exited).
func TestTreeCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const burn = `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done`
	// The parent shell starts a child that burns CPU and then stays alive.
	parent := exec.Command("sh", "-c", "sh -c '"+burn+"; sleep 60' & wait")
	parent.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(-parent.Process.Pid, syscall.SIGKILL)
		_ = parent.Wait()
	}()
	for {
		got, ok := treeCPU(parent.Process.Pid)
		if ok && got >= 40*time.Millisecond {
			break // the live child's CPU is counted
		}
		select {
		case <-ctx.Done():
			t.Fatalf("treeCPU of a shell whose live child burns CPU stays at %v", got)
		case <-time.After(10 * time.Millisecond):
		}
	}

	before, ok := treeCPU(os.Getpid())
	if !ok {
		t.Fatal("treeCPU cannot read this process")
	}
	cmd := exec.Command("sh", "-c", burn)
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	child := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	after, _ := treeCPU(os.Getpid())
	// USER_HZ ticks: allow one tick of rounding each for utime and stime.
	if got := after - before; got < child-20*time.Millisecond {
		t.Fatalf("treeCPU grew by %v while a reaped child used %v", got, child)
	}
	if child < 50*time.Millisecond {
		t.Fatalf("the child used only %v: the check above proves nothing", child)
	}
}

// testWriter sends progress lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []Options{
		{},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: "soak"},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioRate, Rate: 10},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioRate, Rate: 0.1, Duration: time.Second},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioRate, Rate: 10, Duration: time.Second, LockAt: time.Second, LockFor: time.Second},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioRate, Rate: 10, Duration: time.Second, LockFor: -time.Second},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioRate, Rate: 10, Duration: 5 * time.Second, LockFor: 100 * time.Millisecond},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, LockFor: time.Second},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, ColdPostgres: true},            // not embedded
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, PostgresRTT: time.Millisecond}, // not embedded
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, NATSRTT: time.Millisecond},     // not embedded
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, Embedded: true, NATSRTT: -time.Millisecond},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, DuplicateWindow: -time.Second},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, DuplicateWindow: time.Second}, // shorter than any resend span
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, Count: -1},
		{Exe: "x", Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, Subjects: -1},
		{Exe: "x", Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, Subjects: loadgen.MaxSubjects + 1},
		{Exe: "x", Subjects: 10, Scenario: ScenarioDrain, Events: 10, Timeout: -time.Second},
	} {
		// A valid configuration: a zero Base is refused for itself, which
		// would pass a case whose own check is missing.
		o.Base = config.Default()
		if _, err := Run(context.Background(), o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("Run(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}

	// A rate that is not a finite number, refused as such (not only by
	// loadgen's check, which waits for the other options to hold).
	for _, rate := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		o := Options{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioRate, Rate: rate, Duration: time.Second, Base: config.Default()}
		if err := o.defaults(); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "rate needs a finite --rate > 0") {
			t.Errorf("Rate %v: %v, want ErrInvalidOptions asking for a finite rate", rate, err)
		}
	}

	// What loadgen.Publish refuses, refused before the servers start.
	for _, o := range []Options{
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioRate, Rate: 1e12, Duration: 10 * time.Second},
		{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, EventBytes: 64<<20 + 1},
	} {
		o.Base = config.Default()
		if err := o.defaults(); !errors.Is(err, ErrInvalidOptions) || !errors.Is(err, loadgen.ErrInvalidOptions) {
			t.Errorf("Options{Rate: %v, Duration: %v, Events: %d, EventBytes: %d}: %v, want ErrInvalidOptions wrapping loadgen's",
				o.Rate, o.Duration, o.Events, o.EventBytes, err)
		}
	}

	// A run the embedded servers' disk cannot hold is refused before they
	// start (a trillion events at 280 bytes each is 255 TiB); a small one,
	// or one against configured servers, is not.
	huge := Options{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioRate, Rate: 1e12, Duration: time.Second, Embedded: true, Base: config.Default()}
	if err := huge.defaults(); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "1000000000000 events need at least") || !strings.Contains(err.Error(), "TMPDIR") {
		t.Errorf("--rate 1e12 --duration 1s on the embedded servers: %v, want ErrInvalidOptions naming the space and TMPDIR", err)
	}
	huge.Embedded = false
	if err := huge.defaults(); err != nil {
		t.Errorf("--rate 1e12 --duration 1s against configured servers: %v, want nil (their disk is not ours to read)", err)
	}
	small := Options{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 1_000_000, EventBytes: 1024, Embedded: true, Base: config.Default()}
	if err := small.defaults(); err != nil {
		t.Errorf("a 1M-event drain on the embedded servers: %v, want nil", err)
	}

	// Events padded past pipeline.max_event_bytes would all be
	// dead-lettered: refused, per variant.
	o := Options{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, EventBytes: 2048, Base: config.Default()}
	o.Base.Pipeline.MaxEventBytes = 1024
	if err := o.defaults(); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "pipeline.max_event_bytes 1024") {
		t.Errorf("EventBytes above max_event_bytes: %v", err)
	}
	o.Variants = []Variant{{Name: "big", Set: []string{"pipeline.max_event_bytes=4096"}}}
	if err := o.defaults(); err != nil {
		t.Errorf("a variant that raises max_event_bytes: %v", err)
	}
	o.Variants = append(o.Variants, Variant{Name: "small", Set: []string{"pipeline.max_event_bytes =2000"}})
	if err := o.defaults(); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "[small]") {
		t.Errorf("a variant below EventBytes: %v", err)
	}
	// By a variable, which a --set overrides.
	o.Variants = []Variant{{Name: "env", Env: []string{"JETSINK_PIPELINE_MAX_EVENT_BYTES=4096"}}}
	if err := o.defaults(); err != nil {
		t.Errorf("a variant that raises max_event_bytes by a variable: %v", err)
	}
	o.Variants[0].Set = []string{"pipeline.max_event_bytes=2000"}
	if err := o.defaults(); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("a --set below EventBytes over a variable above it: %v", err)
	}

	// A duplicate window whose PubAck wait would be under minAckWait is
	// refused, naming the smallest window taken (4.45s: 5 x (500ms +
	// 300ms), and a tenth of the window kept for the resends' way), which
	// is taken.
	o = Options{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, DuplicateWindow: 1600 * time.Millisecond, Base: config.Default()}
	if err := o.defaults(); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "give at least 4.45s (a PubAck wait of 500ms)") {
		t.Errorf("DuplicateWindow 1.6s: %v, want ErrInvalidOptions asking for at least 4.45s", err)
	}
	o.DuplicateWindow = loadgen.MinDuplicateWindow(minAckWait)
	if err := o.defaults(); err != nil || loadgen.MaxAckWait(o.DuplicateWindow) != minAckWait {
		t.Errorf("DuplicateWindow %v: %v, PubAck wait %v; want it taken, with %v", o.DuplicateWindow, err, loadgen.MaxAckWait(o.DuplicateWindow), minAckWait)
	}

	// Padding the embedded nats-server cannot take, refused before it starts.
	for _, n := range []int{-1, 1 << 20} {
		o := Options{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, EventBytes: n, Embedded: true, Base: config.Default()}
		o.Base.Pipeline.MaxEventBytes = 4 << 20
		if err := o.defaults(); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "--event-bytes") {
			t.Errorf("EventBytes %d, embedded: %v, want ErrInvalidOptions naming --event-bytes", n, err)
		}
	}
	// A configured server's max_payload may be larger (up to 64 MiB): its
	// limit is checked once connected, not against the embedded default.
	o = Options{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, EventBytes: 1 << 20, Base: config.Default()}
	o.Base.Pipeline.MaxEventBytes = 4 << 20
	if err := o.defaults(); err != nil {
		t.Errorf("EventBytes 1 MiB for a configured server: %v, want it taken", err)
	}
}

// Options with several mistakes are refused naming each of them, each
// wrapping ErrInvalidOptions, not the first alone; a variant's
// configuration problems among them, for every variant. (The publisher's
// and the disk's checks, which need the rest to hold, wait for them.)
func TestOptionsNameEveryProblem(t *testing.T) {
	o := Options{Exe: "x", Scenario: ScenarioRate, Rate: math.NaN(), Duration: time.Second, Subjects: 0, Timeout: time.Minute,
		EventBytes: -1, DuplicateWindow: -time.Second, ColdPostgres: true, Base: config.Default(),
		Variants: []Variant{{Name: "a", Set: []string{"pipeline.workers=-1"}}, {Name: "b", Set: []string{"postgres.connections=0"}}}}
	err := o.defaults()
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("%v, want ErrInvalidOptions", err)
	}
	want := []string{"--duplicate-window must not be negative", "--cold-postgres applies", "--subjects 0",
		"rate needs a finite --rate > 0 and --duration > 0", "--event-bytes must not be negative",
		"jetsink's configuration [a]", "jetsink's configuration [b]"}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not say %q", err, w)
		}
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("%v: not a joined error", err)
	}
	for _, e := range joined.Unwrap() {
		if !errors.Is(e, ErrInvalidOptions) {
			t.Errorf("%v: does not wrap ErrInvalidOptions", e)
		}
	}
	if n := len(joined.Unwrap()); n != len(want) {
		t.Errorf("%d problems named, want %d: %v", n, len(want), err)
	}
}

// A problem every variant has (a --set value shared by all, say) is named
// once, not once a variant; one of a variant's own keeps its name; and an
// --event-bytes above the embedded max_payload is not also sent to
// pipeline.max_event_bytes, which raising could not help.
func TestOptionsNameASharedProblemOnce(t *testing.T) {
	o := Options{Exe: "x", Scenario: ScenarioDrain, Events: 10, Subjects: 10, Timeout: time.Minute, Base: config.Default(),
		Variants: []Variant{
			{Name: "pipeline.pin=none", Set: []string{"postgres.connections=0", "pipeline.pin=none"}},
			{Name: "pipeline.pin=thread", Set: []string{"postgres.connections=0", "pipeline.pin=thread", "pipeline.workers=-1"}},
		}}
	err := o.defaults()
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("%v, want ErrInvalidOptions", err)
	}
	msg := err.Error()
	if n := strings.Count(msg, "postgres.connections"); n != 1 {
		t.Errorf("the shared unknown key named %d times, want once: %v", n, err)
	}
	if !strings.Contains(msg, "jetsink's configuration (every variant): ") {
		t.Errorf("%q does not say the shared problem is every variant's", msg)
	}
	if !strings.Contains(msg, "jetsink's configuration [pipeline.pin=thread]: ") || !strings.Contains(msg, "pipeline.workers") {
		t.Errorf("%q does not name the one variant's own problem with its name", msg)
	}
	if n := len(config.Problems(err)); n != 2 {
		t.Errorf("%d problems named, want 2: %v", n, err)
	}

	// A key jetsink does not know, in the base --set of a --matrix run:
	// the loader stops at it, the same for every variant.
	o = Options{Exe: "x", Scenario: ScenarioDrain, Events: 10, Subjects: 10, Timeout: time.Minute, Base: config.Default(),
		Variants: []Variant{
			{Name: "pipeline.pin=none", Set: []string{"postgres.batch_max_rows=0", "pipeline.pin=none"}},
			{Name: "pipeline.pin=thread", Set: []string{"postgres.batch_max_rows=0", "pipeline.pin=thread"}},
		}}
	if err := o.defaults(); err == nil || strings.Count(err.Error(), "batch_max_rows") != 1 {
		t.Errorf("%v: want the unknown key named once", err)
	}

	o = Options{Exe: "x", Scenario: ScenarioDrain, Events: 10, Subjects: 10, Timeout: time.Minute, Base: config.Default(),
		Embedded: true, EventBytes: 2_000_000, Variants: []Variant{{}}}
	err = o.defaults()
	if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("%v, want the embedded max_payload named", err)
	}
	if strings.Contains(err.Error(), "max_event_bytes") {
		t.Errorf("%q also sends the user to pipeline.max_event_bytes, which cannot help above max_payload", err)
	}
}

// --subjects 0 and --timeout 0 are refused, the flag and its value named,
// as --count 0 is: they were taken for 1000 subjects and 10 minutes, which
// neither the help nor the README says.
func TestOptionsRefuseNoSubjectsOrTimeout(t *testing.T) {
	valid := func() Options {
		return Options{Exe: "x", Scenario: ScenarioDrain, Events: 10, Subjects: 10, Timeout: time.Minute, Base: config.Default()}
	}
	if o := valid(); o.defaults() != nil {
		t.Fatalf("valid options refused: %v", o.defaults())
	}
	for _, tc := range []struct {
		mut func(*Options)
		say string
	}{
		{func(o *Options) { o.Subjects = 0 }, "--subjects 0: at least 1"},
		{func(o *Options) { o.Subjects = -3 }, "--subjects -3: at least 1"},
		{func(o *Options) { o.Timeout = 0 }, "--timeout 0s: give one engine's run a positive time"},
		{func(o *Options) { o.Timeout = -time.Second }, "--timeout -1s: give one engine's run a positive time"},
		{func(o *Options) { o.Count = -1 }, "--count -1: at least 1 repetition"},
	} {
		o := valid()
		tc.mut(&o)
		if err := o.defaults(); !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), tc.say) {
			t.Errorf("defaults() = %v; want ErrInvalidOptions with %q", err, tc.say)
		}
	}
}

// Each variant's configuration is loaded as "jetsink run" will load it,
// and a key or value it refuses is refused by Run before any server
// starts, with the loader's words (its "did you mean"), the variant named.
func TestOptionsValidateTheVariantsConfiguration(t *testing.T) {
	for _, tc := range []struct {
		v   Variant
		say string
	}{
		{Variant{Set: []string{"pipeline.wokers=2"}}, "did you mean pipeline.workers?"},
		{Variant{Name: "pipeline.workers=x", Set: []string{"pipeline.workers=x"}}, "jetsink's configuration [pipeline.workers=x]: "},
		{Variant{Name: "pipeline.workers=-1", Set: []string{"pipeline.workers=-1"}}, "pipeline.workers is -1"},
		{Variant{Name: "env:JETSINK_PIPELINE_WORKERS=x", Env: []string{"JETSINK_PIPELINE_WORKERS=x"}}, "JETSINK_PIPELINE_WORKERS"},
		{Variant{Name: "env:JETSINK_PIPELINE_WOKERS=2", Env: []string{"JETSINK_PIPELINE_WOKERS=2"}}, "not a jetsink setting"},
	} {
		o := Options{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, Base: config.Default(), Variants: []Variant{{}, tc.v}}
		_, err := Run(context.Background(), o)
		if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(fmt.Sprint(err), tc.say) {
			t.Errorf("variant %+v: %v; want ErrInvalidOptions with %q", tc.v, err, tc.say)
		}
	}
	o := Options{Exe: "x", Subjects: 10, Timeout: time.Minute, Scenario: ScenarioDrain, Events: 10, Base: config.Default(),
		Variants: []Variant{{Name: "pipeline.workers=2", Set: []string{"pipeline.workers=2"}}, {Name: "env:GOGC=200", Env: []string{"GOGC=200"}}}}
	if err := o.defaults(); err != nil {
		t.Errorf("good variants: %v", err)
	}
}

// BenchmarkDrain drives the processor in-process over b.N preloaded events
// (use -benchtime=200000x) on an embedded nats-server and the test
// PostgreSQL, for a CPU profile of jetsink's own code: the processor runs
// under the pprof label stage=jetsink (goroutines it starts inherit it), so
//
//	go test ./bench -run '^$' -bench Drain -benchtime 200000x -cpuprofile cpu.out
//	go tool pprof -tagfocus stage=jetsink -top cpu.out
//
// leaves out the publisher and the embedded nats-server.
func BenchmarkDrain(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ns, pg := testenv.NATS(b), testenv.Postgres(b)
	nc := ns.Connect(b)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	db := pg.Conn(b)
	bb := &bencher{js: js, db: db}
	stream, prefix := "BENCH_DRAIN", "benchdrain"
	if err := bb.createStream(ctx, stream, prefix); err != nil {
		b.Fatal(err)
	}
	if _, err := loadgen.Publish(ctx, nc, loadgen.Options{Subject: prefix, Subjects: 1000, Events: b.N, Run: 1, Stamp: true,
		NoTraceContext: true}); err != nil { // as `jetsink bench` publishes
		b.Fatal(err)
	}
	if err := bb.createTable(ctx, target{engine: EngineJetsink, table: "bench_drain"}); err != nil {
		b.Fatal(err)
	}
	cfg := config.Default()
	cfg.NATS.URL, cfg.NATS.Stream, cfg.NATS.Subjects, cfg.NATS.CreateStream = ns.URL(), stream, []string{prefix + ".>"}, true
	cfg.NATS.DeadLetterSubject = "benchdlq.drain"
	cfg.Postgres.URL, cfg.Postgres.Table, cfg.Postgres.Columns = pg.URL, "bench_drain", loadgen.Columns()
	cfg.Telemetry.Listen = ""
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var runErr error
	pprof.Do(ctx, pprof.Labels("stage", "jetsink"), func(ctx context.Context) {
		p, err := processor.New(ctx, cfg, log)
		if err != nil {
			runErr = err
			return
		}
		defer p.Close()
		intake, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(intake, ctx) }()
		for p.Sink().Stats().Rows < uint64(b.N) && ctx.Err() == nil {
			select {
			case runErr = <-done:
				stop()
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		stop()
		runErr = <-done
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if runErr != nil {
		b.Fatal(runErr)
	}
	var n int64
	if err := db.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{"bench_drain"}.Sanitize()).Scan(&n); err != nil || n < int64(b.N) {
		b.Fatalf("committed %d of %d rows: %v", n, b.N, err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
}

func TestChildProblems(t *testing.T) {
	c := &child{out: &tailBuffer{max: 1 << 10}}
	fmt.Fprintln(c.out, `time=1 level=INFO msg=started`)
	fmt.Fprintln(c.out, `time=2 level=WARN msg="pull heartbeats missed; checking the consumer"`)
	fmt.Fprintln(c.out, `{"time":3,"level":"ERROR","msg":"commit failed"}`)
	fmt.Fprintln(c.out, `time=4 level=WARN msg=third`)
	got := c.problems(2)
	if len(got) != 2 || !strings.Contains(got[0], "heartbeats missed") || !strings.Contains(got[1], "commit failed") {
		t.Fatalf("problems(2) = %q", got)
	}
}

// KillChildren ends the subprocesses running now (for a second signal,
// which exits without Run's clean-up); one that has exited is forgotten.
func TestKillChildren(t *testing.T) {
	done, err := startChild("true", nil)
	if err != nil {
		t.Fatal(err)
	}
	<-done.done
	var running []*child
	for range 2 {
		c, err := startChild("sleep", nil, "300")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.kill)
		running = append(running, c)
	}
	children.mu.Lock()
	_, kept := children.m[done]
	n := 0
	for _, c := range running {
		if _, ok := children.m[c]; ok {
			n++
		}
	}
	children.mu.Unlock()
	if kept || n != len(running) {
		t.Fatalf("%d of the %d running children registered, the exited one too: %v", n, len(running), kept)
	}
	// Out of the terminal's foreground group: a Ctrl-C reaches the bench
	// only, which stops its children once.
	for i, c := range running {
		if pgid, err := syscall.Getpgid(c.cmd.Process.Pid); err != nil || pgid != c.cmd.Process.Pid {
			t.Errorf("child %d (pid %d) is in process group %d (%v), want one of its own", i, c.cmd.Process.Pid, pgid, err)
		}
	}
	KillChildren()
	for i, c := range running {
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("child %d still runs 10 s after KillChildren", i)
		}
	}
}

// The directory of the engines' configuration files (the servers' URLs,
// NATS credentials) is private and marked as this process's, which the
// next bench's sweep needs to remove it after a SIGKILL (embedded.TempDir
// writes the owner file); RemoveTempDirs, a second signal's clean-up,
// removes it, and removeTempDir at the end of a run.
func TestTempDirIsSweptAndRemoved(t *testing.T) {
	dirs := make([]string, 2)
	for i := range dirs {
		dir, err := makeTempDir()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { removeTempDir(dir) })
		dirs[i] = dir
		if !strings.HasPrefix(filepath.Base(dir), tempDirPrefix) {
			t.Errorf("%s: not named %s*", dir, tempDirPrefix)
		}
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want a directory only its user may enter", dir, fi, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "owner.pid")); err != nil {
			t.Errorf("%s is not marked as this process's, and no sweep would remove it: %v", dir, err)
		}
		if err := os.WriteFile(filepath.Join(dir, "x.yaml"), []byte("postgres: {url: postgres://u:pw@db/x}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removeTempDir(dirs[0])
	if _, err := os.Stat(dirs[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after removeTempDir: %v", dirs[0], err)
	}
	RemoveTempDirs()
	if _, err := os.Stat(dirs[1]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after RemoveTempDirs: %v", dirs[1], err)
	}
}

// With --matrix and --compare baseline, each variant's repetition has its
// own baseline run, and its ratio is taken against that run.
func TestSummaryRatioPairsEachVariantWithItsBaseline(t *testing.T) {
	var rs []Result
	for rep := 1; rep <= 2; rep++ {
		for _, v := range []struct {
			name               string
			engine, basel      float64
			engineCPU, baseCPU float64
		}{{"a", 100, 50, 2, 8}, {"b", 90, 60, 3, 6}} {
			rs = append(rs,
				Result{Engine: EngineJetsink, Variant: v.name, Rep: rep, EventsPerSec: v.engine, CPUPerEvent: v.engineCPU},
				Result{Engine: EngineBaseline, Variant: v.name, Rep: rep, EventsPerSec: v.basel, CPUPerEvent: v.baseCPU})
		}
	}
	want := map[string]float64{"a": 2, "b": 1.5}
	wantCPU := map[string]float64{"a": 0.25, "b": 0.5}
	for _, s := range summarize(rs) {
		// The JSON has the ratios where they were taken, and no zero
		// ones ({"median":0,...}) for the baseline.
		js, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{`"ratio_to_baseline"`, `"cpu_ratio_to_baseline"`} {
			if has := bytes.Contains(js, []byte(k)); has != (s.Engine == EngineJetsink) {
				t.Errorf("%s: %s in its JSON: %v: %s", s.Engine, k, has, js)
			}
		}
		if s.Engine != EngineJetsink {
			if s.Ratio.N != 0 || s.CPURatio.N != 0 {
				t.Errorf("baseline with ratios to itself: %+v", s)
			}
			continue
		}
		if s.Ratio.N != 2 || s.Ratio.Min != want[s.Variant] || s.Ratio.Max != want[s.Variant] {
			t.Errorf("variant %s: ratio %+v, want %v in both repetitions", s.Variant, s.Ratio, want[s.Variant])
		}
		if c := s.CPURatio; c.N != 2 || c.Min != wantCPU[s.Variant] || c.Max != wantCPU[s.Variant] {
			t.Errorf("variant %s: CPU ratio %+v, want %v in both repetitions", s.Variant, c, wantCPU[s.Variant])
		}
	}
}

// A run that lost an event fails the bench; so does a duplicate row in
// exactly-once mode (set in the base config or by the variant), not one in
// at-least-once mode, nor the baseline's.
func TestLossCheck(t *testing.T) {
	b := &bencher{o: Options{Variants: []Variant{{}, {Name: "mode=eo", Set: []string{"postgres.mode=exactly-once"}},
		{Name: "env:eo", Env: []string{"JETSINK_POSTGRES_MODE=exactly-once"}}}}}
	for _, c := range []struct {
		r    Result
		lost bool
	}{
		{Result{Engine: EngineJetsink}, false},
		{Result{Engine: EngineJetsink, Missing: 1}, true},
		{Result{Engine: EngineBaseline, Published: 10, StreamLastSeq: 12}, true}, // stored twice by a resend: the figures are off
		{Result{Engine: EngineJetsink, Published: 10, StreamLastSeq: 10, Stray: 1}, true},
		{Result{Engine: EngineJetsink, Duplicate: 3}, false},
		{Result{Engine: EngineJetsink, Variant: "mode=eo", Duplicate: 3}, true},
		{Result{Engine: EngineBaseline, Variant: "mode=eo", Duplicate: 3}, false},
		{Result{Engine: EngineJetsink, Variant: "env:eo", Duplicate: 3}, true},
	} {
		if err := b.lossCheck([]Result{c.r}); errors.Is(err, ErrLost) != c.lost {
			t.Errorf("%+v: %v, want lost %v", c.r, err, c.lost)
		}
	}
	b.cfg.Postgres.Mode = sink.ExactlyOnce
	if err := b.lossCheck([]Result{{Engine: EngineJetsink, Duplicate: 1}}); !errors.Is(err, ErrLost) {
		t.Errorf("a duplicate row with exactly-once in the base config: %v", err)
	}
}

// Only what acknowledges a message ends its latency.
func TestIsAck(t *testing.T) {
	for p, want := range map[string]bool{"": true, "+ACK": true, "+NXT": true, "+NXT {\"batch\":1}": true,
		"-NAK": false, "+WPI": false, "+TERM": false, "+TERM reason": false} {
		if got := isAck([]byte(p)); got != want {
			t.Errorf("isAck(%q) = %v, want %v", p, got, want)
		}
	}
}

// measureTable counts the sequences 1 to the published count that are
// stored, so that a stray row (here stream_seq 7 of 5 published) cannot
// stand in for a lost one (4), and counts the latencies it clamps into the
// histograms' range: one committed before its scheduled time (a clock
// that disagrees), one over an hour.
func TestMeasureTableCountsSequencesAndClamps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := &bencher{db: testenv.Postgres(t).Conn(t)}
	tg := target{engine: EngineBaseline, table: "measure_seqs"}
	if err := b.createTable(ctx, tg); err != nil {
		t.Fatal(err)
	}
	defer b.dropTable(tg.table)
	// 5 is stored twice, sent at the same time: its second row, a
	// redelivery committed two hours later, is not a latency.
	if _, err := b.db.Exec(ctx, `INSERT INTO measure_seqs (id, ts, stream_seq, committed_at)
		SELECT gen_random_uuid(), now() - ms * interval '1 millisecond', seq, now() + later * interval '1 millisecond'
		FROM (VALUES (1, 5, 0), (2, 5, 0), (3, 5, 0), (5, 5, 7200000), (5, 5, 0), (7, 5, 0), (8, -3, 0), (9, 7200000, 0), (NULL, 5, 0)) AS v(seq, ms, later)`); err != nil {
		t.Fatal(err)
	}
	// Published 7: 4 and 6 are missing, 8, 9 and the row without a
	// stream_seq stray (that one has no latency).
	f, err := measureTable(ctx, b.db, tg.table, false, 0, nil, time.Time{}, 7, clocks{})
	if err != nil {
		t.Fatal(err)
	}
	if f.rows != 9 || f.duplicates != 1 || f.seqsStored != 5 || f.stray != 3 {
		t.Errorf("rows %d, duplicates %d, sequences stored %d, stray %d; want 9, 1, 5 (1, 2, 3, 5, 7), 3 (8, 9, NULL)",
			f.rows, f.duplicates, f.seqsStored, f.stray)
	}
	if l := f.latency; l.Count != 7 || l.BelowMin != 1 || l.AboveMax != 1 {
		t.Errorf("latency %+v: want 7 values (5's once), 1 clamped below 1 µs, 1 above an hour", l)
	}
	// The run lasts to the last commit of any row, the duplicate's too.
	if d := f.last.Sub(f.first); d != 2*time.Hour {
		t.Errorf("first to last commit %v, want 2h (to the duplicate's)", d)
	}
	if f.timeline != nil {
		t.Errorf("timeline %+v without a window", f.timeline)
	}
	// With acks watched (a rate run), the latency to the commit covers
	// every row the latency does, whether its ack was seen or not.
	acks := &ackTimes{base: time.Now(), at: make([]int64, 9)}
	acks.at[0], acks.at[1] = int64(time.Second), int64(time.Second)
	f, err = measureTable(ctx, b.db, tg.table, false, 0, acks, time.Time{}, 7, clocks{})
	if err != nil {
		t.Fatal(err)
	}
	if f.acked != 2 || f.toCommit.Count != f.latency.Count {
		t.Errorf("%d acks seen; to-commit latencies %d, latencies %d: want 2, and the same count", f.acked, f.toCommit.Count, f.latency.Count)
	}
}

// The latency timeline counts its windows, and their seconds, from the
// first scheduled send (from), as the RSS plot and the lock's times do,
// not from the first row's ts: here the events of the first 1.5 s have no
// row, and windows counted from the first row (at 1.5 s) put the latencies
// of 1.5 s and 2.2 s in one window at 0 s, that of 2.6 s in one at 1 s,
// where they belong in the windows of 1 s and 2 s.
func TestMeasureTableTimelineFromScheduleStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := &bencher{db: testenv.Postgres(t).Conn(t)}
	tg := target{engine: EngineBaseline, table: "measure_timeline"}
	if err := b.createTable(ctx, tg); err != nil {
		t.Fatal(err)
	}
	defer b.dropTable(tg.table)
	from := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if _, err := b.db.Exec(ctx, `INSERT INTO measure_timeline (id, ts, stream_seq, committed_at)
		SELECT gen_random_uuid(), $1::timestamptz + ms * interval '1 millisecond', seq, $1::timestamptz + (ms + 10) * interval '1 millisecond'
		FROM (VALUES (2, 1500), (3, 2200), (4, 2600)) AS v(seq, ms)`, from); err != nil {
		t.Fatal(err)
	}
	f, err := measureTable(ctx, b.db, tg.table, false, time.Second, nil, from, 4, clocks{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range f.timeline {
		got = append(got, fmt.Sprintf("%gs: %d", p.T, p.Count))
	}
	if want := []string{"1s: 1", "2s: 2"}; !slices.Equal(got, want) {
		t.Errorf("timeline (window start: latencies) %q, want %q", got, want)
	}
}

// The text report gives p50 to max in the runs and the summary, each
// run's latency end, the send lag and clamped values where there are any;
// the HTML titles its plots by the latency's end, and has no
// latency-over-time plot for a drain.
func TestReportWording(t *testing.T) {
	lat := Percentiles{Count: 10, P50: 1, P90: 2, P99: 3, P999: 4, Max: 5}
	res := func(engine string, rep int) Result {
		return Result{Engine: engine, Rep: rep, Published: 10, Rows: 10, StreamLastSeq: 10, EventsPerSec: 100, Latency: lat,
			LatencyFrom: "the first ack the bench saw", LatencyAcked: 10, Curve: []CurvePoint{{0, 1}, {100, 5}},
			Timeline: []TimePoint{{T: 0, Count: 10, P50: 1, P99: 3, Max: 5}},
			SendLag:  &SendLag{Percentiles: Percentiles{Count: 10, P50: 0.4, P99: 1.5, Max: 7}, Over1ms: 2}}
	}
	rep := &Report{Scenario: ScenarioRate, FirstByRep: []string{EngineJetsink, EngineBaseline, EngineJetsink}}
	for i, first := range rep.FirstByRep {
		second := map[string]string{EngineJetsink: EngineBaseline, EngineBaseline: EngineJetsink}[first]
		rep.Results = append(rep.Results, res(first, i+1), res(second, i+1))
	}
	rep.Results[1].LatencyFrom, rep.Results[1].LatencyAcked = "the first ack the bench saw (9 of 10 events; the rest pg_xact_commit_timestamp)", 9
	rep.Results[2].Latency.BelowMin = 3
	for i := range rep.Results[:4] { // each engine's first two: the third repetition measured no parts
		rep.Results[i].PeakRSS, rep.Results[i].RSSAnonMax, rep.Results[i].RSSFileMax = 60<<20, int64(36+i)<<20, 24<<20
	}
	rep.Summary = summarize(rep.Results)
	var text, js, page bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	got := text.String()
	for _, want := range []string{
		"latency p50 1.0 p90 2.0 p99 3.0 p99.9 4.0 max 5.0 ms",
		"p50 ms 1.0 [1.0..1.0]  p90 ms 2.0 [2.0..2.0]  p99 ms 3.0",
		"publisher send lag (send - scheduled) p50 0.40 p99 1.50 max 7.0 ms, 2 of 10 events sent over 1 ms late",
		"to the first ack the bench saw (9 of 10 events; the rest pg_xact_commit_timestamp)",
		"clamped into the histograms' range (1 µs..1 h): latency 3 below 1 µs",
		"RSS  60.0 MiB (anon 37.0, file 24.0)  latency",
		"peak RSS MiB 60.0 [0.0..60.0] (anon 37.5 [36.0..39.0], file 24.0 [24.0..24.0])  p50 ms",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("text report without %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "latency is from"); n != len(rep.Results) {
		t.Errorf("%d latency end points for %d runs:\n%s", n, len(rep.Results), got)
	}
	if n := strings.Count(got, "(anon "); n != 4+2 {
		t.Errorf("%d lines with the RSS parts, want the 4 runs' that measured them and both summaries:\n%s", n, got)
	}
	if n := strings.Count(got, "clamped into"); n != 1 {
		t.Errorf("%d clamp lines, want the one run's:\n%s", n, got)
	}
	if err := rep.WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"clamped_below_1us": 3`) || !strings.Contains(js.String(), `"sent_over_1ms_late": 2`) {
		t.Errorf("JSON report (%v):\n%s", err, js.String())
	}
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	h := page.String()
	if strings.Contains(h, "publish-to-commit") || !strings.Contains(h, "baseline #1 (send-to-ack-or-commit) p99") ||
		!strings.Contains(h, ">latency over time<") {
		t.Errorf("rate HTML with runs of two latency ends: plots not titled by them:\n%s", h)
	}
	rep.Results = rep.Results[:1]
	page.Reset()
	if err := rep.WriteHTML(&page); err != nil || !strings.Contains(page.String(), ">send-to-ack latency over time<") ||
		!strings.Contains(page.String(), ">send-to-ack latency by percentile<") {
		t.Errorf("rate HTML (%v): plots not titled send-to-ack:\n%s", err, page.String())
	}

	drain := &Report{Scenario: ScenarioDrain, Results: []Result{res(EngineJetsink, 1)}}
	drain.Results[0].LatencyFrom, drain.Results[0].Timeline, drain.Results[0].SendLag = "pg_xact_commit_timestamp, from the engine's start", nil, nil
	page.Reset()
	if err := drain.WriteHTML(&page); err != nil || strings.Count(page.String(), "<svg") != 1 ||
		!strings.Contains(page.String(), "Not plotted for a drain") || !strings.Contains(page.String(), ">engine-start-to-commit latency by percentile<") ||
		!strings.Contains(page.String(), `text-anchor="middle">max</text>`) {
		t.Errorf("drain HTML (%v): want only the percentile plot, titled engine-start-to-commit, its last point labelled max, and why:\n%s", err, page.String())
	}
	text.Reset()
	if err := drain.WriteText(&text); err != nil || strings.Contains(text.String(), "send lag") {
		t.Errorf("drain text (%v) says a send lag:\n%s", err, text.String())
	}
}

// With --compare the order alternates, jetsink first in the first
// repetition; without, jetsink runs alone. The report says which ran first
// in each repetition, and that an odd count is not balanced.
func TestRunOrder(t *testing.T) {
	for rep, want := range [][]string{{EngineJetsink, EngineBaseline}, {EngineBaseline, EngineJetsink}, {EngineJetsink, EngineBaseline}} {
		if got := runOrder(rep, true); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("repetition %d: %v, want %v", rep+1, got, want)
		}
	}
	if got := runOrder(1, false); len(got) != 1 || got[0] != EngineJetsink {
		t.Errorf("without compare: %v", got)
	}
	for _, c := range []struct {
		first []string
		line  string
	}{
		{[]string{EngineJetsink, EngineBaseline, EngineJetsink},
			"ran first (the order alternates per repetition): jetsink in 1, 3; baseline in 2 - not balanced: an odd --count runs one engine first once more\n"},
		{[]string{EngineJetsink, EngineBaseline}, "ran first (the order alternates per repetition): jetsink in 1; baseline in 2\n"},
		{[]string{EngineJetsink}, "ran first (the order alternates per repetition): jetsink in 1 - not balanced"},
		{nil, ""},
	} {
		rep := &Report{Scenario: ScenarioDrain, FirstByRep: c.first}
		var text, js bytes.Buffer
		if err := rep.WriteText(&text); err != nil || c.line != "" && !strings.Contains(text.String(), c.line) ||
			c.line == "" && strings.Contains(text.String(), "ran first") {
			t.Errorf("first %v: text report (%v) without %q:\n%s", c.first, err, c.line, text.String())
		}
		if err := rep.WriteJSON(&js); err != nil || len(c.first) > 0 && !strings.Contains(js.String(), `"first_engine_by_rep": [
    "`+strings.Join(c.first, "\",\n    \"")+`"
  ]`) {
			t.Errorf("first %v: JSON report (%v):\n%s", c.first, err, js.String())
		}
	}
}

// The engines get neither JETSINK_* nor OTEL_* variables from the bench's
// environment (an OTLP endpoint left in the shell would have jetsink trace
// every event and the baseline none); what the bench passes gets through.
func TestChildEnvironment(t *testing.T) {
	t.Setenv("JETSINK_POSTGRES_TABLE", "other")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("JSTEST_KEPT", "yes")
	c, err := startChild("env", []string{"OTEL_SERVICE_NAME=given"})
	if err != nil {
		t.Fatal(err)
	}
	<-c.done
	out := c.out.String()
	for _, v := range []string{"JETSINK_POSTGRES_TABLE=", "OTEL_EXPORTER_OTLP_ENDPOINT="} {
		if strings.Contains(out, v) {
			t.Errorf("the child's environment has %s...", v)
		}
	}
	for _, v := range []string{"JSTEST_KEPT=yes", "OTEL_SERVICE_NAME=given"} {
		if !strings.Contains(out, v) {
			t.Errorf("the child's environment lacks %s", v)
		}
	}
}

// A rate run whose publisher sent below 99% of the rate offered says so in
// its line; one that kept up does not, nor one of a single event (no rate:
// PublishPS 0).
func TestRateRunSaysThePublisherFellBehind(t *testing.T) {
	rs := []Result{{Engine: EngineJetsink, Rep: 1, PublishPS: 1000.4}, {Engine: EngineJetsink, Rep: 2, PublishPS: 905},
		{Engine: EngineJetsink, Rep: 3, PublishPS: 0}}
	r := Report{Scenario: ScenarioRate, Rate: 1000, Results: rs, Summary: summarize(rs)}
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(text.String(), "THE PUBLISHER FELL BEHIND: it sent at 905/s of the 1000/s offered"); n != 1 || strings.Count(text.String(), "FELL BEHIND") != 1 {
		t.Fatalf("want one run said to fall behind, the second:\n%s", text.String())
	}
}

// A latency's max is the value recorded, not the top of its histogram
// bucket: 59 min 59 s read 3,600,810 ms, over the hour that nothing was
// clamped above; a value over the hour reads as the hour, counted. No
// percentile reads above the max.
func TestHistMaxIsExact(t *testing.T) {
	for _, c := range []struct {
		d     time.Duration
		max   float64
		above int64
	}{
		{59*time.Minute + 59*time.Second, 3_599_000, 0},
		{2 * time.Hour, 3_600_000, 1},
		{1234567 * time.Microsecond, 1234.567, 0},
	} {
		h := newHist()
		h.record(time.Millisecond)
		h.record(c.d)
		p := h.percentiles()
		if p.Max != c.max || p.AboveMax != c.above {
			t.Errorf("%v: max %v ms, %d clamped above; want %v ms, %d", c.d, p.Max, p.AboveMax, c.max, c.above)
		}
		if p.P999 > p.Max || p.P99 > p.Max {
			t.Errorf("%v: p99 %v, p99.9 %v ms above the max %v", c.d, p.P99, p.P999, p.Max)
		}
	}
}

// A drain's text leaves out send->stored, the preload's publish latency
// (no part of the drain's), and gives stored->commit from the engine's
// start; a rate run's line splits its latency at the store time.
func TestDrainLineLeavesOutThePreload(t *testing.T) {
	lat := Percentiles{Count: 10, P50: 1, P90: 2, P99: 3, P999: 4, Max: 5}
	r := Result{Engine: EngineJetsink, Rep: 1, Published: 10, Rows: 10, StreamLastSeq: 10, Latency: lat,
		LatencyToStream: Percentiles{Count: 10, P50: 700, P99: 900, Max: 950}, LatencyInEngine: lat}
	for _, c := range []struct {
		scenario  string
		want, not string
	}{
		{ScenarioDrain, "stored->commit (from the engine's start) p50 1.0 p99 3.0 p99.9 4.0 max 5.0 ms", "send->stored"},
		{ScenarioRate, "of which send->stored p50 700.0 p99 900.0 max 950.0 ms, stored->commit p50 1.0", "engine's start"},
	} {
		rep := &Report{Scenario: c.scenario, Results: []Result{r}, Summary: summarize([]Result{r})}
		var text bytes.Buffer
		if err := rep.WriteText(&text); err != nil {
			t.Fatal(err)
		}
		if got := text.String(); !strings.Contains(got, c.want) || strings.Contains(got, c.not) {
			t.Errorf("%s: want %q, not %q:\n%s", c.scenario, c.want, c.not, got)
		}
	}
}

// Without commit timestamps a row's commit time is its COPY's
// (committed_at): the text names the legs that end there stored->COPY, in
// the run's line and the summary, not stored->commit.
func TestCopyTimeLegsSayCOPY(t *testing.T) {
	lat := Percentiles{Count: 10, P50: 1, P90: 2, P99: 3, P999: 4, Max: 5}
	r := Result{Engine: EngineJetsink, Rep: 1, Published: 10, Rows: 10, StreamLastSeq: 10, Latency: lat,
		LatencyToStream: Percentiles{Count: 10, P50: 700, P99: 900, Max: 950}, LatencyInEngine: lat,
		LatencyToCommit: Percentiles{Count: 10, P50: 1, P99: 3, Max: 5, BelowMin: 1}, CommitIsCopy: true}
	for _, c := range []struct {
		scenario string
		want     []string
	}{
		{ScenarioDrain, []string{"stored->COPY (from the engine's start) p50 1.0", "stored->COPY p99 ms 3.0", "to COPY 1 below 1 µs"}},
		{ScenarioRate, []string{"stored->COPY p50 1.0 p99 3.0", "stored->COPY p99 ms 3.0"}},
	} {
		rep := &Report{Scenario: c.scenario, Results: []Result{r}, Summary: summarize([]Result{r})}
		var text bytes.Buffer
		if err := rep.WriteText(&text); err != nil {
			t.Fatal(err)
		}
		got := text.String()
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: want %q:\n%s", c.scenario, w, got)
			}
		}
		if strings.Contains(got, "->commit") || strings.Contains(got, "to commit") {
			t.Errorf("%s: a leg named for the commit:\n%s", c.scenario, got)
		}
	}
}

// Steal time (a VM's CPU waiting while the hypervisor ran another guest) is
// no process's busy time: the machine's busy figures leave it out, and the
// report gives its share apart.
func TestMachineCPULeavesOutSteal(t *testing.T) {
	// USER_HZ 100: user 300, system 100, idle 400, steal 200 ticks.
	busy, idle, steal, ok := parseCPULine("cpu  300 0 100 400 0 0 0 200 0 0")
	if !ok || busy != 4*time.Second || idle != 4*time.Second || steal != 2*time.Second {
		t.Fatalf("busy %v, idle %v, steal %v, %v; want 4s, 4s, 2s", busy, idle, steal, ok)
	}
	if _, _, _, ok := parseCPULine("cpu0 1 2 3"); ok {
		t.Error("a short line parsed")
	}
	r := Result{Engine: EngineJetsink, Published: 1000}
	r.machineCPU(cpuSample{}, cpuSample{busy: busy, idle: idle, steal: steal})
	if r.MachineCPUPerEvent != 4000 || r.MachineBusy != 0.5 || r.MachineSteal != 0.2 {
		t.Errorf("machine %v µs/event, busy %v, steal %v; want 4000, 0.5, 0.2", r.MachineCPUPerEvent, r.MachineBusy, r.MachineSteal)
	}
	if want := "machine 50% busy (of the CPU time it had; 20% more stolen by the hypervisor), 4000.00 µs CPU/event"; !strings.Contains(r.line(ScenarioRate), want) {
		t.Errorf("line without %q:\n%s", want, r.line(ScenarioRate))
	}
}

// The publisher is told the duplicate window of the stream the bench made,
// the server's (2 minutes) when --duplicate-window is 0, so that its
// resends are held while reconnecting and none goes out past the window;
// a --duplicate-window given is passed as it is.
func TestPublisherKnowsTheStreamsWindow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := testenv.NATS(t)
	js, err := jetstream.New(ns.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ given, want time.Duration }{{0, 2 * time.Minute}, {10 * time.Second, 10 * time.Second}} {
		b := &bencher{js: js, o: Options{Subjects: 10, Scenario: ScenarioDrain, Events: 10, DuplicateWindow: c.given}}
		stream, prefix := fmt.Sprintf("BENCH_WINDOW_%d", c.given/time.Second), fmt.Sprintf("benchwindow%d", c.given/time.Second)
		if err := b.createStream(ctx, stream, prefix); err != nil {
			t.Fatal(err)
		}
		if got := b.publishOptions(prefix).DuplicateWindow; got != c.want {
			t.Errorf("--duplicate-window %v: the publisher is told %v, want %v", c.given, got, c.want)
		}
	}
}

package bench

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// fixedClock is a probe of a server whose clock is offset ahead of the
// host's, read at the middle of round trips rtts long (one per probe, in
// turn), each reading off the middle by skew.
func fixedClock(offset time.Duration, rtts []time.Duration, skew []time.Duration) clockProbe {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	i := 0
	return func(context.Context) (time.Time, time.Time, time.Time, error) {
		rtt, sk := rtts[i%len(rtts)], skew[i%len(skew)]
		i++
		return at.Add(rtt/2 + offset + sk), at, at.Add(rtt), nil
	}
}

// An estimate keeps the probe of the shortest round trip, as uncertain as
// half of it; over a run, the mean of the estimates before and after it,
// less certain by half their drift.
func TestEstimateOffset(t *testing.T) {
	ms := time.Millisecond
	o, err := estimateOffset(context.Background(), fixedClock(5*time.Second,
		[]time.Duration{9 * ms, 3 * ms, 1 * ms, 4 * ms, 2 * ms}, []time.Duration{4 * ms, 1 * ms, ms / 2, -ms, 0}))
	if err != nil {
		t.Fatal(err)
	}
	if want := (clockOffset{Offset: 5*time.Second + ms/2, Uncertainty: ms / 2}); o != want {
		t.Errorf("estimate %+v, want %+v (the 1 ms round trip's)", o, want)
	}
	got := over(clockOffset{Offset: 10 * ms, Uncertainty: ms}, clockOffset{Offset: 14 * ms, Uncertainty: 3 * ms})
	if want := (clockOffset{Offset: 12 * ms, Uncertainty: 5 * ms}); got != want {
		t.Errorf("over a run %+v, want %+v", got, want)
	}
}

// A run against servers whose clocks are ahead of the host's (PostgreSQL
// by 5 s, nats-server by 2 s) measures as one against clocks that agree:
// its rows' commit and stored times are taken less the offsets, so an
// elapsed time of 1 s is 1 s (6 s without), the events/s, latencies and
// their legs are the run's, the lock's catch-up ends when the rows were
// committed, and the text says the clocks were off.
func TestFinishCorrectsServerClocks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := testenv.NATS(t).JetStream(t)
	b := &bencher{o: Options{Scenario: ScenarioDrain}, js: js, db: testenv.Postgres(t).Conn(t), id: "clocks",
		pgNow:   fixedClock(5*time.Second, []time.Duration{0}, []time.Duration{0}),
		natsNow: fixedClock(2*time.Second, []time.Duration{0}, []time.Duration{0})}
	tg := newTarget(EngineBaseline, "BENCH_CLOCKS", "benchclocks", Variant{})
	if err := b.createStream(ctx, tg.stream, tg.prefix); err != nil {
		t.Fatal(err)
	}
	if err := b.createTable(ctx, tg); err != nil {
		t.Fatal(err)
	}
	defer b.dropTable(tg.table)
	clk, err := b.clocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Sent (ts) before from, stored 0.1 s and 0.2 s after it, committed
	// 0.5 s and 1 s after it, each on its server's clock.
	from := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if _, err := b.db.Exec(ctx, `INSERT INTO `+tg.table+` (id, ts, stream_seq, published_at, committed_at)
		SELECT gen_random_uuid(), $1::timestamptz - interval '1 second', seq,
			$1::timestamptz + interval '2 seconds' + stored * interval '1 millisecond',
			$1::timestamptz + interval '5 seconds' + committed * interval '1 millisecond'
		FROM (VALUES (1, 100, 500), (2, 200, 1000)) AS v(seq, stored, committed)`, from); err != nil {
		t.Fatal(err)
	}
	res := Result{Engine: tg.engine, Rep: 1, Published: 2}
	if err := b.finish(ctx, &res, tg, &jetstream.ConsumerInfo{}, Usage{}, from, nil, clk); err != nil {
		t.Fatal(err)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-6 }
	if !near(res.ElapsedS, 1) || !near(res.StartupS, 0.5) || !near(res.EventsPerSec, 2) {
		t.Errorf("elapsed %v s, startup %v s, %v events/s; want 1, 0.5, 2", res.ElapsedS, res.StartupS, res.EventsPerSec)
	}
	// A drain's latency runs from the engine's start: 500 and 1,000 ms;
	// stored->commit from the store time (after from): 400 and 800 ms.
	// (A percentile is its histogram bucket's top: 3 digits.)
	within := func(got, want float64) bool { return math.Abs(got-want) <= want/1000 }
	if l := res.Latency; l.Count != 2 || !near(l.Max, 1000) || !within(l.P50, 500) {
		t.Errorf("latency %+v, want 500 and 1000 ms", l)
	}
	if l := res.LatencyInEngine; l.Count != 2 || !near(l.Max, 800) || !within(l.P50, 400) {
		t.Errorf("stored->commit %+v, want 400 and 800 ms", l)
	}
	if !near(res.PGClockOffsetMs, 5000) || !near(res.NATSClockOffsetMs, 2000) || res.PGClockUncertaintyMs != 0 {
		t.Errorf("offsets PostgreSQL %v ms (±%v), nats-server %v ms; want 5000 (±0), 2000",
			res.PGClockOffsetMs, res.PGClockUncertaintyMs, res.NATSClockOffsetMs)
	}
	// The lock's catch-up: everything sent by from was committed 1 s
	// after it, on the host's clock.
	caughtUp, err := lastCommitSentBy(ctx, b.db, tg.table, false, from, res.clk.pg.Offset)
	if err != nil {
		t.Fatal(err)
	}
	if d := caughtUp.Sub(from); d != time.Second {
		t.Errorf("caught up %v after, want 1s", d)
	}
	var text bytes.Buffer
	rep := &Report{Scenario: ScenarioDrain, Results: []Result{res}}
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if want := "SERVER CLOCKS OFF THIS HOST'S: PostgreSQL +5000.000 ms (±0.000), nats-server +2000.000 ms"; !strings.Contains(text.String(), want) {
		t.Errorf("text without %q:\n%s", want, text.String())
	}
}

// The real probes read the test servers' clocks, which are this host's:
// offsets of about 0 (within half the round trip), and no warning in the
// text of such a run.
func TestClocksOfEmbeddedServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := &bencher{js: testenv.NATS(t).JetStream(t), db: testenv.Postgres(t).Conn(t), id: "realclocks"}
	defer b.deleteClockStream()
	c, err := b.clocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		name string
		o    clockOffset
	}{{"PostgreSQL", c.pg}, {"nats-server", c.nats}} {
		// A server's reading falls within its round trip, however long
		// it took: an offset larger than half of it would be a clock
		// that differs. (10 µs for the rounding: PostgreSQL keeps
		// microseconds.)
		if d := max(o.o.Offset, -o.o.Offset); d > o.o.Uncertainty+10*time.Microsecond {
			t.Errorf("%s: offset %v (±%v) from the host's own clock", o.name, o.o.Offset, o.o.Uncertainty)
		}
	}
	if !b.clockStream {
		t.Error("the NATS probe made no stream")
	}
}

// The text warns of a server clock more than a millisecond off, or not
// known to within one, and of nothing less.
func TestClockLine(t *testing.T) {
	for _, c := range []struct {
		r    Result
		warn bool
	}{
		{Result{}, false},
		{Result{PGClockOffsetMs: 0.4, PGClockUncertaintyMs: 0.1, NATSClockOffsetMs: -0.9, NATSClockUncertaintyMs: 0.9}, false},
		{Result{PGClockOffsetMs: -1.5, PGClockUncertaintyMs: 0.1}, true},
		{Result{NATSClockOffsetMs: 1.2}, true},
		{Result{PGClockUncertaintyMs: 2}, true},
	} {
		if l := c.r.clockLine(); (l != "") != c.warn {
			t.Errorf("%+v: %q, want a warning: %v", c.r, l, c.warn)
		}
	}
}

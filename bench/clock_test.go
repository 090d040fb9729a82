package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	if want := (clockOffset{Offset: 5*time.Second + ms/2, Uncertainty: ms / 2, RTT: ms}); o != want {
		t.Errorf("estimate %+v, want %+v (the 1 ms round trip's)", o, want)
	}
	before, after := clockOffset{Offset: 10 * ms, Uncertainty: ms, RTT: 2 * ms}, clockOffset{Offset: 14 * ms, Uncertainty: 3 * ms, RTT: 6 * ms}
	if got, want := over(before, after), (clockOffset{Offset: 12 * ms, Uncertainty: 5 * ms, RTT: 6 * ms}); got != want {
		t.Errorf("over a run %+v, want %+v", got, want)
	}
	// An estimate that could not read the clock leaves the other one.
	unknown := clockOffset{Unknown: true}
	if got := over(before, unknown); got != before {
		t.Errorf("over a run, unknown after it: %+v, want the estimate before, %+v", got, before)
	}
	if got := over(unknown, after); got != after {
		t.Errorf("over a run, unknown before it: %+v, want the estimate after, %+v", got, after)
	}
	if got := over(unknown, unknown); got != unknown {
		t.Errorf("over a run, unknown before and after: %+v, want unknown", got)
	}
}

// clockRun makes a drain's table on b whose rows were sent (ts) before
// from, stored 0.1 s and 0.2 s after it on a nats-server 2 s ahead of the
// host's clock, and committed 0.5 s and 1 s after it on a PostgreSQL 5 s
// ahead.
func clockRun(ctx context.Context, t *testing.T, b *bencher) (target, time.Time) {
	t.Helper()
	tg := newTarget(EngineBaseline, "BENCH_"+strings.ToUpper(b.id), "bench"+b.id, Variant{})
	if err := b.createStream(ctx, tg.stream, tg.prefix); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.deleteStream(tg.stream) })
	if err := b.createTable(ctx, tg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.dropTable(tg.table) })
	from := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if _, err := b.db.Exec(ctx, `INSERT INTO `+tg.table+` (id, ts, stream_seq, published_at, committed_at)
		SELECT gen_random_uuid(), $1::timestamptz - interval '1 second', seq,
			$1::timestamptz + interval '2 seconds' + stored * interval '1 millisecond',
			$1::timestamptz + interval '5 seconds' + committed * interval '1 millisecond'
		FROM (VALUES (1, 100, 500), (2, 200, 1000)) AS v(seq, stored, committed)`, from); err != nil {
		t.Fatal(err)
	}
	return tg, from
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
	tg, from := clockRun(ctx, t, b)
	clk := b.clocks(ctx)
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
	for _, want := range []string{"PostgreSQL's clock OFF THIS HOST'S by +5000.000 ms (±0.000)",
		"nats-server's clock OFF THIS HOST'S by +2000.000 ms (±0.000)"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text without %q:\n%s", want, text.String())
		}
	}
}

// failing is probe but for the calls fail says fail (counted from 1).
func failing(probe clockProbe, fail func(call int) bool) clockProbe {
	call := 0
	return func(ctx context.Context) (time.Time, time.Time, time.Time, error) {
		call++
		if fail(call) {
			return time.Time{}, time.Time{}, time.Time{}, errors.New("probe refused")
		}
		return probe(ctx)
	}
}

// A server's clock the bench cannot read before or after a run (a query
// refused, an account that takes no more streams) neither fails the run
// nor leaves it uncorrected when the other estimate read it: the offset is
// that estimate's. One read neither before nor after is marked unknown,
// said on stderr, and the text says the figures are uncorrected for it.
func TestFinishWithoutAClockReading(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, db := testenv.NATS(t).JetStream(t), testenv.Postgres(t).Conn(t)
	pg := fixedClock(5*time.Second, []time.Duration{0}, []time.Duration{0})
	nats := fixedClock(2*time.Second, []time.Duration{0}, []time.Duration{0})
	never := func(int) bool { return true }
	for _, c := range []struct {
		name                string
		pgNow, natsNow      clockProbe
		pgMs, natsMs        float64
		pgUnknown, natsUnkn bool
		elapsedS            float64
	}{
		// PostgreSQL's read before the run only (its probe fails from the
		// second estimate on), nats-server's after it only.
		{"before or after", failing(pg, func(call int) bool { return call > clockProbes }), failing(nats, func(call int) bool { return call == 1 }),
			5000, 2000, false, false, 1},
		{"neither", failing(pg, never), failing(nats, never), 0, 0, true, true, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			var said []string
			b := &bencher{o: Options{Scenario: ScenarioDrain}, js: js, db: db, id: "noclock" + strings.ReplaceAll(c.name, " ", ""),
				pgNow: c.pgNow, natsNow: c.natsNow, say: func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) }}
			tg, from := clockRun(ctx, t, b)
			clk := b.clocks(ctx)
			res := Result{Engine: tg.engine, Rep: 1, Published: 2}
			if err := b.finish(ctx, &res, tg, &jetstream.ConsumerInfo{}, Usage{}, from, nil, clk); err != nil {
				t.Fatalf("finish: %v, want a result", err)
			}
			if res.PGClockOffsetMs != c.pgMs || res.NATSClockOffsetMs != c.natsMs ||
				res.PGClockUnknown != c.pgUnknown || res.NATSClockUnknown != c.natsUnkn {
				t.Errorf("offsets PostgreSQL %v ms (unknown %v), nats-server %v ms (unknown %v); want %v (%v), %v (%v)",
					res.PGClockOffsetMs, res.PGClockUnknown, res.NATSClockOffsetMs, res.NATSClockUnknown, c.pgMs, c.pgUnknown, c.natsMs, c.natsUnkn)
			}
			if math.Abs(res.ElapsedS-c.elapsedS) > 1e-6 {
				t.Errorf("elapsed %v s, want %v", res.ElapsedS, c.elapsedS)
			}
			// A line for each failed estimate, of each server.
			all := strings.Join(said, "\n")
			if want := map[bool]int{false: 2, true: 4}[c.pgUnknown]; len(said) != want ||
				!strings.Contains(all, "could not read PostgreSQL's clock (probe refused)") ||
				!strings.Contains(all, "could not read nats-server's clock (probe refused)") {
				t.Errorf("said %q, want %d lines, of both servers' clocks", said, want)
			}
			line := res.clockLine()
			if got := strings.Contains(line, "PostgreSQL's clock COULD NOT BE READ (see stderr): the figures are uncorrected"); got != c.pgUnknown {
				t.Errorf("clock line %q: says PostgreSQL's clock could not be read: %v, want %v", line, got, c.pgUnknown)
			}
		})
	}
}

// The real probes read the test servers' clocks, which are this host's:
// offsets of about 0 (within half the round trip), and no warning in the
// text of such a run.
func TestClocksOfEmbeddedServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := &bencher{js: testenv.NATS(t).JetStream(t), db: testenv.Postgres(t).Conn(t), id: "realclocks"}
	defer b.deleteClockStream(true)
	c := b.clocks(ctx)
	if c.pg.Unknown || c.nats.Unknown {
		t.Fatalf("clocks %+v: not read", c)
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
	// The NATS probe's stream is gone after the estimate, so that it
	// holds none of the account's streams during a run; it is kept in a
	// file, as the bench's other streams, not in memory, which an account
	// may not allow.
	name := b.clockStreamName()
	if _, err := b.js.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the clock stream after an estimate: %v, want it deleted", err)
	}
	if _, _, _, err := b.natsClock(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := b.js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.CachedInfo().Config.Storage; st != jetstream.FileStorage {
		t.Errorf("the clock stream is in %v, want a file", st)
	}
}

// The bench's streams are made just after others were deleted, in an
// account that holds no other stream on the embedded server: the clock
// probe's, deleted after each estimate and made again on the next, and a
// repetition's, after the one before. nats-server may refuse a create that
// follows the delete of an account's last stream at once; both go through
// consumer.CreateStream, which tries again. The race struck about once in
// 1,000 pairs here, and under -race (as make test runs it) once in 30 to
// 500, so 750 pairs of each fail this nearly always when either path
// calls js.CreateStream itself (checked for each: failed at pairs 30 to
// 395 of the probe's, 85 and 524 of a repetition's).
func TestStreamsMadeAgainAfterDelete(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b := &bencher{js: testenv.NATS(t).JetStream(t), id: "again"} // its own server: no other stream in the account
	defer b.deleteClockStream(true)
	for i := range 750 {
		if _, _, _, err := b.natsClock(ctx); err != nil {
			t.Fatalf("pair %d, the clock probe's: %v", i, err)
		}
		if b.deleteClockStream(true); b.clockStream {
			t.Fatalf("pair %d: the clock probe's stream was not deleted", i)
		}
		stream := fmt.Sprintf("BENCH_again_%d", i%2) // as a run's names alternate
		if err := b.createStream(ctx, stream, "benchagain"); err != nil {
			t.Fatalf("pair %d, a repetition's: %v", i, err)
		}
		b.deleteStream(stream)
	}
}

// The text warns of a server clock off the host's by more than a
// millisecond and more than its ±, says of one whose offset is not known
// to within a millisecond that it is not (not that it is off), and of
// one that could not be read that the figures are uncorrected for it.
func TestClockLine(t *testing.T) {
	const off, vague, unread = "OFF THIS HOST'S", "not known to within", "COULD NOT BE READ"
	for _, c := range []struct {
		r    Result
		want []string // in the line, in order; none: no line
	}{
		{Result{}, nil},
		{Result{PGClockOffsetMs: 0.4, PGClockUncertaintyMs: 0.1, NATSClockOffsetMs: -0.9, NATSClockUncertaintyMs: 0.9}, nil},
		{Result{PGClockOffsetMs: -1.5, PGClockUncertaintyMs: 0.1}, []string{"PostgreSQL's clock " + off + " by -1.500 ms (±0.100)"}},
		{Result{NATSClockOffsetMs: 1.2}, []string{"nats-server's clock " + off + " by +1.200 ms (±0.000)"}},
		// A round trip of 4 ms, the clocks agreeing: uncertain, not off.
		{Result{PGClockUncertaintyMs: 2, PGClockRoundTripMs: 4}, []string{"PostgreSQL's clock offset " + vague + " ±2.000 ms (round trip 4.000 ms): "}},
		// Over 1 ms but within its ±, and a drift over the run.
		{Result{NATSClockOffsetMs: 1.5, NATSClockUncertaintyMs: 2, NATSClockRoundTripMs: 3},
			[]string{"nats-server's clock offset " + vague + " ±2.000 ms (round trip 3.000 ms, drift over the run 1.000 ms)"}},
		{Result{PGClockUnknown: true, NATSClockOffsetMs: 3, NATSClockUncertaintyMs: 0.2},
			[]string{"PostgreSQL's clock " + unread, "; nats-server's clock " + off + " by +3.000 ms"}},
	} {
		l := c.r.clockLine()
		if len(c.want) == 0 {
			if l != "" {
				t.Errorf("%+v: %q, want no line", c.r, l)
			}
			continue
		}
		rest := l
		for _, w := range c.want {
			i := strings.Index(rest, w)
			if i < 0 {
				t.Errorf("%+v: %q, want %q", c.r, l, w)
				break
			}
			rest = rest[i+len(w):]
		}
		if n := strings.Count(l, off) + strings.Count(l, vague) + strings.Count(l, unread); n != len(c.want) {
			t.Errorf("%+v: %q, %d warnings, want %d", c.r, l, n, len(c.want))
		}
	}
}

package sink

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetsink/jetsink/telemetry"
	"github.com/jetsink/jetsink/tests/testenv"
)

// tracedSink has s export its spans to a new in-memory exporter, which it
// returns with the tracing (to start message spans and Flush).
func tracedSink(t *testing.T, s *Sink) (*telemetry.Tracing, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tr, err := telemetry.NewTracingTo(exp, telemetry.Config{ServiceName: "test", SampleRatio: 1, MaxLinks: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	s.Instrument(tr, nil)
	return tr, exp
}

// A hard stop while the rest of a batch waits on a lock, after a row of it
// was dead-lettered: the copy span blamed the dead-lettered row's refusal
// ("hard stop after 2 failed attempts; last: SQLSTATE 23514", beside
// retries=0 and dead_lettered=1): failed attempts were forgotten only when
// the batch began (diff review of 5e6926b). A commit or a dead letter now
// forgets them.
func TestHardStopAfterADeadLetterBlamesNoRefusal(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Connections = 1 })
	tr, exp := tracedSink(t, s)
	admin, locker := pg.Conn(t), pg.Conn(t)
	refuseBadRows(t, ctx, admin, s.table, false) // 23514
	key := "hashtext('" + s.cfg.Table + "')"
	triggerOn(t, ctx, admin, s.table, "wait", "NEW.stream_seq = 8", "PERFORM pg_advisory_xact_lock("+key+")")
	execAll(t, ctx, locker, "SELECT pg_advisory_lock("+key+")")
	t.Cleanup(func() { _, _ = locker.Exec(context.Background(), "SELECT pg_advisory_unlock_all()") })
	rs, _ := rows(1, 10, func(seq int) string {
		if seq == 5 {
			return `{"bad":true}`
		}
		return `{}`
	})
	for i := range rs {
		rs[i].Event.Span = tr.StartMessage(rs[i].Event)
	}
	src := newSource()
	hard, cancel := context.WithCancel(ctx)
	defer cancel()
	wait := runSink(t, hard, s, src)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "row 5 dead-lettered", func() bool { letters, _ := dl.letters(); return len(letters) == 1 })
	waitFor(t, ctx, "rows 6-10 waiting on the lock", waitingOnLock(t, ctx, admin, s.cfg.AppName))
	cancel()
	_ = wait()
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var parked int64
	for _, sp := range exp.GetSpans() {
		if sp.Name != "copy "+s.cfg.Table {
			continue
		}
		set := attribute.NewSet(sp.Attributes...)
		v, _ := set.Value("jetsink.batch.dead_lettered")
		parked += v.AsInt64()
		t.Logf("copy span: %v %q", sp.Status.Code, sp.Status.Description)
		if d := sp.Status.Description; strings.Contains(d, "23514") || strings.Contains(d, "failed attempt") {
			t.Errorf("copy span's error %q blames the dead-lettered row's refusal; the batch waited on a lock", d)
		}
	}
	if parked != 1 {
		t.Errorf("copy spans' jetsink.batch.dead_lettered add up to %d, want 1", parked)
	}
}

// A hard stop's span error shows a data error by its SQLSTATE alone, as the
// log does (its message may quote a value: an enum label here); before,
// only a suspect error's was hidden (diff review of 5e6926b).
func TestStopErrorShowsAPgErrorByItsSQLSTATE(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&pgconn.PgError{Code: "22P02", Message: `invalid input value for enum mood: "secret"`}, "hard stop after 2 failed attempts; last: SQLSTATE 22P02"},
		{&pgconn.PgError{Code: "23514", Message: `new row violates check constraint "ok"`}, "hard stop after 2 failed attempts; last: SQLSTATE 23514"},
		{&pgconn.PgError{Severity: "ERROR", Code: "42501", Message: "permission denied for table t"}, "hard stop after 2 failed attempts; last: ERROR: permission denied for table t (SQLSTATE 42501)"},
	} {
		c := &committer{s: &Sink{}, failed: 2, lastFail: tc.err}
		if got := c.stopError().Error(); got != tc.want {
			t.Errorf("stopError of %v: %q, want %q", tc.err, got, tc.want)
		}
	}
}

// A batch retried in halves after a statement timeout had no retry event
// on its span (Unset, events [ack ack], retries=1): the halving returned
// before CopyRetry (diff review of b56ce62). Here the table is locked until
// the first split.
func TestTimeoutSplitHasARetryEvent(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, withParam(t, pg.URL, "statement_timeout", "300"), func(c *Config) { c.Connections = 1 })
	tr, exp := tracedSink(t, s)
	tx := lockTable(t, ctx, pg, s)
	rs, ms := rows(1, 2, nil)
	for i := range rs {
		rs[i].Event.Span = tr.StartMessage(rs[i].Event)
	}
	src := newSource()
	wait := runSink(t, ctx, s, src)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "a timeout split", func() bool { return s.Stats().TimeoutSplits >= 1 })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the rows acked", allAcked(ms))
	src.close()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var retries []attribute.Set
	for _, sp := range exp.GetSpans() {
		if sp.Name != "copy "+s.cfg.Table {
			continue
		}
		for _, e := range sp.Events {
			if e.Name == "retry" {
				retries = append(retries, attribute.NewSet(e.Attributes...))
			}
		}
	}
	if len(retries) < 1 {
		t.Fatal("no retry event on the copy span, retried after a statement timeout")
	}
	if typ, _ := retries[0].Value("error.type"); typ.AsString() != "57014" {
		t.Errorf("retry event: error.type %q, want 57014", typ.AsString())
	}
}

// A hard stop ends the span of a row whose stream was re-created since it
// was taken with "stale", saying nothing delivers it again; before, it said
// "abandoned" and that JetStream delivers it again after ack_wait (diff
// review of 5e6926b). A row of the current epoch is still "abandoned".
func TestHardStopLeavesAStaleRowStale(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	s, epochs := newEpochSink(t, ctx, "postgres://u:p@127.0.0.1:1/db?sslmode=disable&connect_timeout=1", func(c *Config) { c.CreateTable = false })
	tr, exp := tracedSink(t, s)
	rs, _ := rows(1, 2, nil)
	epochs.Advance()
	rs[1].Event.Epoch = epochs.Current() // rs[0] is of the epoch before
	for i := range rs {
		rs[i].Event.Span = tr.StartMessage(rs[i].Event)
	}
	src := newSource()
	hard, cancel := context.WithCancel(ctx)
	defer cancel()
	wait := runSink(t, hard, s, src)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "a failed attempt of the batch", func() bool { return s.Stats().Retries >= 1 })
	cancel()
	_ = wait()
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		rs[0].Event.Span.SpanContext().SpanID().String(): "stale",
		rs[1].Event.Span.SpanContext().SpanID().String(): "abandoned",
	}
	for _, sp := range exp.GetSpans() {
		w, ok := want[sp.SpanContext.SpanID().String()]
		if !ok {
			continue
		}
		delete(want, sp.SpanContext.SpanID().String())
		set := attribute.NewSet(sp.Attributes...)
		settle, _ := set.Value("jetsink.settle")
		d := sp.Status.Description
		t.Logf("message span: %s %q", settle.AsString(), d)
		if settle.AsString() != w {
			t.Errorf("message span: jetsink.settle %q, want %q", settle.AsString(), w)
		}
		if again := strings.Contains(d, "delivers it again after ack_wait"); again != (w == "abandoned") {
			t.Errorf("message span's error %q (jetsink.settle %s)", d, w)
		}
		if w == "stale" && !strings.Contains(d, "nothing delivers it again") {
			t.Errorf("stale message span's error %q, want it to say nothing delivers the event again", d)
		}
	}
	if len(want) != 0 {
		t.Errorf("message spans %v never ended nor exported", want)
	}
}

// An exactly-once batch whose commit's outcome was unknown (the connection
// cut after the server committed) is retried, and its rows, stored by that
// commit, come back as jetsink.batch.duplicates (the retry's ON CONFLICT
// skips them): its span now says so with
// jetsink.batch.commit_outcome_unknown=true (diff review of d0662ef).
func TestCopySpanSaysCommitOutcomeUnknown(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	proxy, proxied := newCommitCutter(t, pg.URL, ExactlyOnce)
	s, _ := newTestSink(t, ctx, proxied, func(c *Config) { c.Mode = ExactlyOnce; c.Connections = 1 })
	tr, exp := tracedSink(t, s)
	rs, ms := rows(1, 10, nil)
	for i := range rs {
		rs[i].Event.Span = tr.StartMessage(rs[i].Event)
	}
	proxy.armed.Store(true)
	src := newSource()
	wait := runSink(t, ctx, s, src)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "the rows acked", allAcked(ms))
	src.close()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if proxy.cut.Load() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.cut.Load())
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var spans int
	for _, sp := range exp.GetSpans() {
		if sp.Name != "copy "+s.cfg.Table {
			continue
		}
		spans++
		set := attribute.NewSet(sp.Attributes...)
		dups, _ := set.Value("jetsink.batch.duplicates")
		unknown, _ := set.Value("jetsink.batch.commit_outcome_unknown")
		t.Logf("copy span: duplicates %d, commit_outcome_unknown %v", dups.AsInt64(), unknown.AsBool())
		if dups.AsInt64() != 10 || !unknown.AsBool() {
			t.Errorf("copy span: jetsink.batch.duplicates %d, jetsink.batch.commit_outcome_unknown %v; want 10 and true (its own commit's rows)", dups.AsInt64(), unknown.AsBool())
		}
	}
	if spans != 1 {
		t.Errorf("%d copy spans, want 1", spans)
	}
}

package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/telemetry"
	"github.com/jetsink/jetsink/tests/testenv"
)

// The sink's connection is killed (pg_terminate_backend) while it waits for
// a lock with a batch in flight: the batch is retried on a new connection,
// every row lands once, every message is acked after its commit. The
// failed attempt is warned of and counted as a retry (before, a session
// ended mid-Query whose COPY had not gone out whole was tried again at
// once, in silence, as one ended while idle), and it is no possible
// duplicate: the server's FATAL came before the Query's last statement, so
// nothing committed (before, at-least-once counted 100).
func TestRetryAfterTerminateBackend(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Connections, c.Mode = 1, mode })
			logs := captureLog(t, s, time.Minute)
			admin := pg.Conn(t)
			locker := pg.Conn(t)
			src := newSource()
			wait := runSink(t, ctx, s, src)

			first, m1 := rows(1, 100, nil)
			src.push(t, ctx, first)
			waitFor(t, ctx, "first rows acked", allAcked(m1))

			tx, err := locker.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "LOCK TABLE "+s.table.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
			second, m2 := rows(101, 100, nil)
			src.push(t, ctx, second)
			waitFor(t, ctx, "the committer to wait for the lock", waitingOnLock(t, ctx, admin, s.cfg.AppName))
			var killed int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) k", s.cfg.AppName).Scan(&killed); err != nil || killed == 0 {
				t.Fatalf("terminate the sink's backends: %d, %v", killed, err)
			}
			waitFor(t, ctx, "a retry", func() bool { return s.Stats().Retries > 0 })
			for i, m := range m2 {
				if m.acks.Load() != 0 {
					t.Fatalf("message %d acked before its commit", i)
				}
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			waitFor(t, ctx, "second rows acked", allAcked(m2))
			src.close()
			if err := wait(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if n := count(t, ctx, admin, s.cfg.Table); n != 200 {
				t.Fatalf("%d rows, want 200", n)
			}
			st := s.Stats()
			if st.PossibleDuplicates != 0 || !strings.Contains(logs.String(), "57P01") {
				t.Errorf("%d possible duplicates (want 0), or no warning of the terminated attempt in the log:\n%s", st.PossibleDuplicates, logs)
			}
			t.Logf("stats %+v", st)
		})
	}
}

// PostgreSQL crashes (pg_ctl stop -m immediate) and comes back: batches are
// retried until they commit; nothing is acked before its commit and nothing
// is lost. exactly-once mode makes the count exact even if a COMMIT's
// outcome was unknown.
func TestRetryAcrossServerRestart(t *testing.T) {
	ctx := testCtx(t, 120*time.Second)
	cluster := testenv.NewCluster(t)
	s, _ := newTestSink(t, ctx, cluster.URL("postgres"), func(c *Config) { c.Mode = ExactlyOnce; c.Batch.MaxRows = 50 })
	src := newSource()
	wait := runSink(t, ctx, s, src)

	first, m1 := rows(1, 200, nil)
	src.push(t, ctx, first)
	waitFor(t, ctx, "first rows acked", allAcked(m1))

	if err := cluster.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	second, m2 := rows(201, 200, nil)
	src.push(t, ctx, second)
	waitFor(t, ctx, "a retry while the server is down", func() bool { return s.Stats().Retries > 0 })
	for i, m := range m2 {
		if m.acks.Load() != 0 {
			t.Fatalf("message %d acked while the server is down", i)
		}
	}
	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "second rows acked", allAcked(m2))
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	conn := (&testenv.PG{URL: cluster.URL("postgres")}).Conn(t)
	if n := count(t, ctx, conn, s.cfg.Table); n != 400 {
		t.Fatalf("%d rows, want 400", n)
	}
	t.Logf("stats %+v", s.Stats())
}

// readinessSink is a test sink (see newTestSink, with mut) on a database
// of the test's own, with refusedFor set to refused for the test, and an
// admin connection to that database.
func readinessSink(t *testing.T, refused time.Duration, mut func(*Config)) (context.Context, *Sink, *recDL, *pgx.Conn) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	old := refusedFor
	t.Cleanup(func() { refusedFor = old })
	refusedFor = refused
	pg := testenv.Postgres(t)
	s, dl := newTestSink(t, ctx, pg.URL, mut)
	return ctx, s, dl, pg.Conn(t)
}

// A missing table is a configuration error: batches are retried (not
// dead-lettered, not acked) until the operator creates the table.
func TestMissingTableRetriedUntilCreated(t *testing.T) {
	ctx, s, dl, _ := readinessSink(t, 300*time.Millisecond, func(c *Config) { c.CreateTable = false })
	src := newSource()
	wait := runSink(t, ctx, s, src)
	rs, ms := rows(1, 10, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "retries of the config error", func() bool { return s.Stats().ConfigErrors >= 2 })
	for i, m := range ms {
		if m.acks.Load() != 0 || m.terms.Load() != 0 {
			t.Fatalf("message %d settled while the table is missing", i)
		}
	}
	// Not ready once every batch has been refused for refusedFor; PostgreSQL
	// itself still answers.
	waitFor(t, ctx, "Ready to report the refusals", func() bool {
		err := s.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "has refused every batch") && strings.Contains(err.Error(), "SQLSTATE 42P01")
	})
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "Ready once a batch commits", func() bool { return s.Ready(ctx) == nil })
	finishClean(t, ctx, src, wait, dl, ms)
}

// A transient error that lasts (a full disk: PostgreSQL answers, and
// every batch fails) makes the sink not ready after refusedFor, without
// the hint for configuration errors; a commit makes it ready again.
func TestLastingTransientFailureMakesNotReady(t *testing.T) {
	ctx, s, dl, admin := readinessSink(t, 300*time.Millisecond, nil)
	triggerOn(t, ctx, admin, s.table, "diskfull", "true", "RAISE EXCEPTION 'could not extend file' USING ERRCODE = 'disk_full'")
	src := newSource()
	wait := runSink(t, ctx, s, src)
	rs, ms := rows(1, 10, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "Ready to report the failures", func() bool {
		err := s.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "has failed every batch") &&
			strings.Contains(err.Error(), "SQLSTATE 53100: could not extend file") && !strings.Contains(err.Error(), "jetsink check")
	})
	if st := s.Stats(); st.Retries == 0 || st.ConfigErrors != 0 || st.Rows != 0 {
		t.Fatalf("stats %+v", st)
	}
	// What a drain that times out now says held it up.
	if d, msg := s.Failing(); d < 300*time.Millisecond || !strings.Contains(msg, "SQLSTATE 53100") {
		t.Errorf("Failing() = %v, %q while every batch fails", d, msg)
	}
	if _, err := admin.Exec(ctx, "DROP TRIGGER diskfull ON "+s.table.Sanitize()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "Ready once a batch commits", func() bool { return s.Ready(ctx) == nil })
	if d, msg := s.Failing(); d != 0 || msg != "" {
		t.Errorf("Failing() = %v, %q once a batch committed", d, msg)
	}
	finishClean(t, ctx, src, wait, dl, ms)
}

// Readiness counts failing from the failure, not from the attempt's start:
// an attempt that waited long (here 2 s, in a trigger) before it failed
// does not make the sink not ready at once. And a batch the server judged
// (a data error: the row is dead-lettered) shows that it takes batches,
// though none committed: ready, after a transient failure before it. (The
// COPY's own error, a unique key's: one raised inside a trigger is
// suspect, see TestTriggerBugFailingEveryRow, and so is a CHECK's.)
func TestReadinessAfterALongAttemptOrARefusedRow(t *testing.T) {
	ctx, s, dl, admin := readinessSink(t, 1500*time.Millisecond, nil)
	if _, err := admin.Exec(ctx, "CREATE SEQUENCE attempts"); err != nil {
		t.Fatal(err)
	}
	// Attempt 1: 2 s, then a full disk; attempt 2: the row is refused by
	// a unique key, stored already (checked after the BEFORE trigger; a
	// CHECK that may refuse every row is suspect, held until rows commit).
	execAll(t, ctx, admin, "CREATE UNIQUE INDEX ON "+s.table.Sanitize()+" (stream, stream_seq); INSERT INTO "+
		s.table.Sanitize()+" (stream, stream_seq) VALUES ('S', 1)")
	triggerOn(t, ctx, admin, s.table, "judge", "nextval('attempts') = 1", `PERFORM pg_sleep(2);
		RAISE EXCEPTION 'could not extend file' USING ERRCODE = 'disk_full'`)
	src := newSource()
	wait := runSink(t, ctx, s, src)
	rs, ms := rows(1, 1, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "the first attempt's failure", func() bool { return s.Stats().Retries >= 1 })
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("not ready right after the first failure, which came at the end of a 2 s attempt: %v", err)
	}
	waitFor(t, ctx, "the row dead-lettered", func() bool { l, _ := dl.letters(); return len(l) == 1 })
	time.Sleep(refusedFor)
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("not ready once the server judged the row: %v", err)
	}
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if ms[0].terms.Load() != 1 {
		t.Fatalf("the refused row was not termed")
	}
}

// A BEFORE INSERT trigger with a bug that fails every row with a class 22
// error (PERFORM 1/0: 22012, raised inside the trigger) dead-lettered
// every event (classData) and kept the sink ready, where the same trigger
// raising P0001 dead-letters nothing. Now it is suspect: no row is
// dead-lettered while none commits, the sink is not ready, and at the end
// of a drain the rows are left unacked for JetStream to deliver again.
func TestTriggerBugFailingEveryRow(t *testing.T) {
	ctx, s, dl, admin := readinessSink(t, 300*time.Millisecond, func(c *Config) { c.Connections = 1 })
	trigger(t, ctx, admin, s.table, "buggy", "BEFORE INSERT", "ROW", "PERFORM 1/0; RETURN NEW;")
	src := newSource()
	hard, stop := context.WithTimeout(ctx, 25*time.Second)
	defer stop()
	wait := runSink(t, hard, s, src)
	rs, ms := rows(1, 20, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "Ready to report the refusals", func() bool {
		err := s.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "SQLSTATE 22012")
	})
	if letters, seqs := dl.letters(); len(letters) != 0 {
		t.Fatalf("rows %v dead-lettered (%+v) while the trigger fails every row", seqs, letters)
	}
	src.close() // a drain: the rows are given up, not retried until the hard stop
	if err := wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if letters, seqs := dl.letters(); len(letters) != 0 {
		t.Fatalf("rows %v dead-lettered (%+v), want none", seqs, letters)
	}
	for i, m := range ms {
		if m.acks.Load() != 0 || m.terms.Load() != 0 {
			t.Fatalf("row %d settled (acks %d, terms %d), want it left to JetStream", i+1, m.acks.Load(), m.terms.Load())
		}
	}
	if st := s.Stats(); st.GivenUp != uint64(len(ms)) || st.Rows != 0 {
		t.Errorf("stats %+v, want %d rows given up, none stored", st, len(ms))
	}
}

// Behind a pooler in transaction mode, an exactly-once batch may land on a
// server session without the staging table that the committer created on
// another: its COPY failed (42P01, or 3F000 in a session that never had a
// temporary table), logged at Error as the table's fault, counted as a
// retry and a configuration error, the connection closed, the batch
// retried after the backoff, for each new server session. Now the batch is
// tried again at once with the table's CREATE. The committer's own
// session stands in for the other: the table dropped in it, or the
// connection swapped for a new one while the committer thinks it staged.
func TestExactlyOnceStagingTableMissing(t *testing.T) {
	for _, tc := range []struct{ name, code string }{{"dropped", "42P01"}, {"new session", "3F000"}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			pg := testenv.Postgres(t)
			s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = ExactlyOnce; c.Connections = 1 })
			logs := &testenv.SyncBuffer{}
			s.log = slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
			c := &committer{s: s}
			defer c.closeConn()
			rs, _ := rows(1, 5, nil)
			if err := c.commitRetry(ctx, rs[:2], true); err != nil {
				t.Fatal(err)
			}
			switch tc.name {
			case "dropped":
				execAll(t, ctx, c.conn, "DROP TABLE "+s.staging.Sanitize())
			default:
				c.closeConn()
				if err := c.connect(ctx); err != nil {
					t.Fatal(err)
				}
				c.staged = true
			}
			if err := c.commitRetry(ctx, rs[2:], true); err != nil {
				t.Fatal(err)
			}
			if st := s.Stats(); st.Retries != 0 || st.ConfigErrors != 0 {
				t.Errorf("Retries %d, ConfigErrors %d; want 0, 0: a missing staging table is made, not a failure", st.Retries, st.ConfigErrors)
			}
			if out := logs.String(); strings.Contains(out, "level=ERROR") || strings.Contains(out, "level=WARN msg=\"batch failed") {
				t.Errorf("logged as a failure:\n%s", out)
			}
			if !strings.Contains(logs.String(), "SQLSTATE "+tc.code) {
				t.Errorf("want the retry logged at Debug with SQLSTATE %s:\n%s", tc.code, logs)
			}
			if n := count(t, ctx, pg.Conn(t), s.cfg.Table); n != 5 {
				t.Errorf("%d rows in the table, want 5", n)
			}
		})
	}
}

// slowConnects is pgURL through a proxy that holds each new connection for
// delay before its first byte either way: every connect takes that long at
// least.
func slowConnects(t *testing.T, pgURL string, delay time.Duration) string {
	t.Helper()
	l := listen(t)
	proxied, to := l.proxy(t, pgURL)
	l.relayTo(to, func(net.Conn) (up, down func([]byte) verdict) {
		time.Sleep(delay)
		p := func([]byte) verdict { return pass }
		return p, p
	})
	return proxied
}

// jetsink_commit_duration_seconds (committer.took) counted the connect too:
// every host tried, TLS, the login, the types read; and, when the server
// had ended the session while it was idle, the try that failed on it. A
// proxy that holds each new connection for delay makes every connect take
// that long at least, so the statements that committed took at most the
// commitRetry call's time less delay: the first batch (connecting), and
// one after pg_terminate_backend (a failed try, then a connect).
func TestCommitDurationLeavesOutTheConnect(t *testing.T) {
	const delay = 300 * time.Millisecond
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	proxied := slowConnects(t, pg.URL, delay)
	s, _ := newTestSink(t, ctx, proxied, nil)
	c := &committer{s: s}
	defer c.closeConn()
	rs, _ := rows(1, 4, nil)
	commit := func(what string, rows []pipeline.Row) {
		t.Helper()
		began := time.Now()
		if err := c.commitRetry(ctx, rows, true); err != nil {
			t.Fatal(err)
		}
		if took, most := c.took, time.Since(began)-delay; took > most {
			t.Errorf("%s: commit duration %v, more than the %v its call took less the %v its connect took at least",
				what, took, most+delay, delay)
		}
	}
	commit("first batch", rs[:2])
	execAll(t, ctx, pg.Conn(t), fmt.Sprintf("SELECT pg_terminate_backend(%d, 10000)", c.conn.PgConn().PID()))
	commit("after the session ended", rs[2:])
	if st := s.Stats(); st.Retries != 0 {
		t.Errorf("stats %+v", st)
	}
	if n := count(t, ctx, pg.Conn(t), s.cfg.Table); n != 4 {
		t.Errorf("%d rows in the table, want 4", n)
	}
}

// Exactly-once's commit duration (and the events' latency to the commit)
// took in the lookup that runs after the COMMIT when rows conflicted (a
// redelivered backlog: every batch). A proxy that holds the lookup
// (missingSQL, the one statement with unnest) for delay before passing it
// on makes the lookup take that long at least; the statements that
// committed take less than that.
func TestCommitDurationLeavesOutTheLookup(t *testing.T) {
	const delay = 500 * time.Millisecond
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	l := listen(t)
	proxied, to := l.proxy(t, pg.URL)
	var held atomic.Int64
	l.relay(to, func() (up, down func([]byte) verdict) {
		up = func(b []byte) verdict {
			if bytes.Contains(b, []byte("unnest(")) {
				held.Add(1)
				time.Sleep(delay) // the upstream hook's delay, not a synchronization
			}
			return pass
		}
		return up, func([]byte) verdict { return pass }
	})
	s, _ := newTestSink(t, ctx, proxied, func(c *Config) { c.Mode = ExactlyOnce; c.Connections = 1 })
	c := &committer{s: s}
	defer c.closeConn()
	rs, _ := rows(1, 2, nil)
	if err := c.commitRetry(ctx, rs, true); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := c.commitRetry(ctx, rs, true); err != nil { // redelivered: both conflict
		t.Fatal(err)
	}
	call := time.Since(began)
	if held.Load() == 0 {
		t.Fatal("the lookup was not held: the test shows nothing")
	}
	// The call took the statements, then the lookup, held delay at least:
	// the statements took at most the call less delay, however slow the
	// machine.
	if most := call - delay; c.took > most {
		t.Errorf("commit duration %v, more than the %v its call took less the %v the lookup after the commit was held", c.took, call, delay)
	}
	if n := count(t, ctx, pg.Conn(t), s.cfg.Table); n != 2 {
		t.Errorf("%d rows in the table, want 2", n)
	}
}

// A piece that timed out was measured from before the connect (every host
// tried, TLS, the login), while the pieces that commit are measured from
// their statements (took): pieceCommitted compared the two, and a slow
// connect made commits look fast beside it, the cap grow back sooner than
// it should and time out again. A proxy holds
// each new connection for delay; the statements time out after 100 ms
// (statement_timeout, a trigger sleeping per row): the attempt's limit
// is its statements' time, under delay.
func TestTimedOutPieceLeavesOutTheConnect(t *testing.T) {
	const delay = time.Second
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	proxied := slowConnects(t, withParam(t, pg.URL, "statement_timeout", "100"), delay)
	s, _ := newTestSink(t, ctx, proxied, nil)
	triggerOn(t, ctx, pg.Conn(t), s.table, "slow", "true", "PERFORM pg_sleep(1)")
	c := &committer{s: s}
	defer c.closeConn()
	rs, _ := rows(1, 4, nil)
	began := time.Now()
	if err := c.commitRetry(ctx, rs, true); !timedOut(err) {
		t.Fatalf("commitRetry = %v; want a statement timeout", err)
	}
	call := time.Since(began)
	if c.piece != 2 {
		t.Fatalf("cap %d after 4 rows timed out, want 2", c.piece)
	}
	// The call took the connect, delay at least, then the statements: their
	// time is at most the call less delay, however slow the machine.
	if most := call - delay; c.limit > most {
		t.Errorf("the timed-out attempt's limit is %v, more than the %v its call took less the %v its connect took", c.limit, call, delay)
	}
}

// A failure recorded after a commit that came later (another connection
// committed while this one classified and logged its error) does not make
// the sink unready once traffic stops; failures after the commit do.
func TestReadinessIgnoresAFailureRecordedLate(t *testing.T) {
	ctx, s, _, _ := readinessSink(t, 300*time.Millisecond, nil)
	failed := time.Now()
	time.Sleep(time.Millisecond)
	s.answered() // a commit elsewhere
	s.refused(errors.New("copy: disk full"), classTransient, failed)
	time.Sleep(2 * refusedFor)
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("not ready for a failure from before the last commit: %v", err)
	}
	// A failure stamped before the commit but recorded anyway (refused
	// racing answered) neither counts nor stops a new run from counting.
	s.refusedSince.Store(s.stamp(failed))
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("not ready for a stale failure: %v", err)
	}
	s.refused(errors.New("copy: disk full"), classTransient, time.Now())
	waitFor(t, ctx, "Ready to report failures since the last commit", func() bool {
		err := s.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "has failed every batch")
	})
}

// An Ack that fails after a commit is counted and logged; the row stays.
func TestAckErrorCounted(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, nil)
	rs, ms := rows(1, 5, nil)
	ms[2].failAck = true
	src := newSource()
	src.push(t, ctx, rs)
	src.close()
	if err := s.Run(ctx, src); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st := s.Stats(); st.AckErrors != 1 || st.Rows != 5 {
		t.Fatalf("stats %+v", st)
	}
}

// The hard context ends while exactly-once's Query of a redelivered batch
// waits for a lock, and the cancel request is lost on its way (the proxy
// cuts its connection): once the lock is gone the server finishes the
// Query, committing, and the sink closes the connection (ctx has ended).
// Every row conflicted, so the keys would have to be looked up in the
// table: on no connection. The attempt fails with the context's error (the
// rows are not acked; redelivered, they conflict again).
func TestExactlyOnceCancelLostQueryFinishes(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	l := listen(t)
	proxied, to := l.proxy(t, pg.URL)
	var cancels atomic.Int32
	l.relay(to, func() (up, down func([]byte) verdict) {
		first := true
		up = func(b []byte) verdict {
			const cancelRequest = 80877102
			if first && len(b) >= 8 && binary.BigEndian.Uint32(b[4:]) == cancelRequest {
				cancels.Add(1)
				return cut
			}
			first = false
			return pass
		}
		return up, func([]byte) verdict { return pass }
	})
	s, _ := newTestSink(t, ctx, proxied, func(c *Config) { c.Mode = ExactlyOnce; c.Connections = 1 })
	c := &committer{s: s}
	defer c.closeConn()
	rs, _ := rows(1, 5, nil)
	if _, err := c.attempt(ctx, rs); err != nil { // stored once; connected before the lock
		t.Fatal(err)
	}
	pid := c.conn.PgConn().PID()
	admin := pg.Conn(t)
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+s.table.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	hard, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.attempt(hard, rs)
		done <- err
	}()
	check := pg.Conn(t)
	waitFor(t, ctx, "the Query waiting for the lock", func() bool {
		var n int
		err := check.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass($1)", s.table.Sanitize()).Scan(&n)
		return err == nil && n > 0
	})
	cancel()
	waitFor(t, ctx, "the cancel request at the proxy", func() bool { return cancels.Load() > 0 })
	if err := tx.Commit(ctx); err != nil { // the lock goes; the Query finishes
		t.Fatal(err)
	}
	err = <-done
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "after the commit") {
		t.Fatalf("attempt = %v, want the context's error at the lookup after the commit", err)
	}
	if c.conn != nil {
		t.Fatal("the connection was kept after the hard context ended")
	}
	waitFor(t, ctx, "the attempt's session ended", func() bool {
		var n int
		err := check.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
		return err == nil && n == 0
	})
	if n := count(t, ctx, admin, s.cfg.Table); n != 5 {
		t.Fatalf("%d rows, want 5", n)
	}
}

// A batch that keeps failing is logged at Warn again every
// stillFailingEvery with how long it has failed, not only on its first
// failure; a failure that a server timeout caused says which limits to look
// at. Here lock_timeout ends every attempt while the table is locked.
func TestStillFailingBatchIsLoggedAgain(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, dl := newTestSink(t, ctx, withParam(t, pg.URL, "lock_timeout", "50"), func(c *Config) { c.Connections = 1 })
	logs := captureLog(t, s, 300*time.Millisecond)

	tx, err := pg.Conn(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE "+s.table.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	src := newSource()
	wait := runSink(t, ctx, s, src)
	rs, ms := rows(1, 10, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "the batch logged as still failing twice", func() bool {
		return strings.Count(logs.String(), "batch still failing") >= 2
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	finishClean(t, ctx, src, wait, dl, ms)

	var warns []string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "batch") {
			warns = append(warns, line)
		}
	}
	if retries := s.Stats().Retries; uint64(len(warns)) >= retries {
		t.Errorf("%d warnings for %d retries: every attempt was logged at Warn", len(warns), retries)
	}
	for _, w := range warns {
		if !strings.Contains(w, "SQLSTATE 55P03") || !strings.Contains(w, "hint=") || !strings.Contains(w, "lock_timeout") {
			t.Errorf("warning without the lock timeout's hint: %s", w)
		}
	}
	if !strings.Contains(warns[len(warns)-1], "failing_for=") {
		t.Errorf("the last warning does not say how long the batch has failed: %s", warns[len(warns)-1])
	}
}

// While the server refuses new connections (too many for jetsink's role
// or the server, 53300) and the committer's connection commits, Ready
// holds: in an operator's drill /readyz said 503 for minutes, naming the
// refused connection, while jetsink stored 1,000 events a second.
func TestReadyWhileNewConnectionsAreRefused(t *testing.T) {
	ctx, admin, role, s, src, wait, _ := roleSink(t, 1, false)
	refuseAdmin(t, ctx, admin, role, s, 1) // the committer's connection is the one the role may have
	if err := s.Ping(ctx); err == nil || !strings.Contains(err.Error(), "53300") {
		t.Fatalf("Ping with the role's one connection taken = %v, want SQLSTATE 53300", err)
	}
	rs, ms := rows(6, 5, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "rows acked", allAcked(ms))
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("Ready while batches commit: %v", err)
	}
	src.Close()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// On a quiet stream (no batch answered within answeredReady) while the
// server refuses new connections (53300), Ready pings on an idle
// committer's connection: ready while it answers, not once it is gone and
// another session holds the role's one connection. It said 503 before, on
// a stream with no events for 10 s, though the committers' connections
// were live.
func TestReadyOnAQuietStreamWhileNewConnectionsAreRefused(t *testing.T) {
	quietAfter(t, 100*time.Millisecond)
	ctx, admin, role, s, src, wait, _ := roleSink(t, 1, false)
	refuseAdmin(t, ctx, admin, role, s, 1)
	time.Sleep(2 * answeredReady)
	if err := s.Ping(ctx); err == nil || !strings.Contains(err.Error(), "53300") {
		t.Fatalf("Ping with the role's one connection taken = %v, want SQLSTATE 53300", err)
	}
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("Ready on a quiet stream, the committer's connection live: %v", err)
	}
	execAll(t, ctx, admin, terminateRole(role))
	holder, err := pgx.Connect(ctx, s.cfg.URL)
	if err != nil {
		t.Fatalf("take the role's one connection: %v", err)
	}
	defer holder.Close(context.Background())
	if err := s.Ready(ctx); err == nil || !strings.Contains(err.Error(), "53300") {
		t.Fatalf("Ready with the committer's connection gone and no new one allowed = %v, want SQLSTATE 53300", err)
	}
	holder.Close(ctx)
	src.Close()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// With two committers, one of whose connections the server has ended, an
// idle one still answers Ready's ping: the dead connection's error makes
// the next committer be asked.
func TestReadyPingsPastACommitterWhoseConnectionEnded(t *testing.T) {
	quietAfter(t, 100*time.Millisecond)
	ctx, admin, role, s, src, wait, _ := roleSink(t, 2, false)
	waitFor(t, ctx, "both committers connected", func() bool {
		return backends(t, ctx, admin, s.cfg.AppName, "true") == 3
	})
	refuseAdmin(t, ctx, admin, role, s, 2)
	execAll(t, ctx, admin, "SELECT pg_terminate_backend(min(pid), 5000) FROM pg_stat_activity WHERE usename = '"+role+"'")
	holder, err := pgx.Connect(ctx, s.cfg.URL) // the freed slot
	if err != nil {
		t.Fatalf("take the freed connection: %v", err)
	}
	defer holder.Close(context.Background())
	time.Sleep(2 * answeredReady)
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("Ready with one committer's connection live: %v", err)
	}
	holder.Close(ctx)
	src.Close()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// A committer's connection the server ended while it was idle (here
// pg_terminate_backend; a restart and idle_session_timeout alike) costs the
// next batch no failed attempt: it is tried again at once on a new
// connection, with no warning, no retry counted and, in at-least-once
// mode, no possible duplicate (the server's FATAL came before any answer
// to the batch). An operator's drill saw a warning per committer and a
// retry each time the load resumed after an idle_session_timeout.
func TestConnectionEndedWhileIdle(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			admin := pg.Conn(t)
			s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Connections, c.Mode = 1, mode })
			logs := captureLog(t, s, time.Minute)
			src := newSource()
			wait := runSink(t, ctx, s, src)
			rs, ms := rows(1, 5, nil)
			src.push(t, ctx, rs)
			waitFor(t, ctx, "rows acked", allAcked(ms))
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE application_name = left($1, 63)",
				s.cfg.AppName).Scan(&n); err != nil || n == 0 {
				t.Fatalf("terminate the sink's connections: %d, %v", n, err)
			}
			rs, ms = rows(6, 5, nil)
			src.push(t, ctx, rs)
			waitFor(t, ctx, "rows acked", allAcked(ms))
			st := s.Stats()
			if st.Retries != 0 || st.PossibleDuplicates != 0 || strings.Contains(logs.String(), "level=WARN") {
				t.Errorf("a connection ended while idle: %d retries, %d possible duplicates, log:\n%s", st.Retries, st.PossibleDuplicates, logs)
			}
			src.Close()
			if err := wait(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// While the server lets jetsink's role have fewer connections than it has
// committers (the role's CONNECTION LIMIT, max_connections), the batches
// of those that cannot connect go to the one that can: in an operator's
// drill they waited, each with its committer, until the limit was lifted
// minutes later (and a stop meanwhile always ended at drain_timeout).
func TestBatchesGoToTheCommitterThatCanConnect(t *testing.T) {
	ctx, admin, role, _, src, wait, _ := roleSink(t, 3, false)
	execAll(t, ctx, admin, "ALTER ROLE "+role+" CONNECTION LIMIT 1", terminateRole(role))
	var all []*recMsg
	for i := range 20 {
		rs, ms := rows(6+5*i, 5, nil)
		src.push(t, ctx, rs)
		all = append(all, ms...)
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, ctx, "every batch acked with one connection", allAcked(all))
	src.Close()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// A committer that cannot connect (the role's CONNECTION LIMIT) while
// another commits offers its batch to the others, and tries to connect
// again whenever none took it. While none comes free, those connects
// failed unseen: nothing logged, no retry counted, and Failing (so Ready)
// said nothing while the batch's events waited. Now each counts as a
// retry, the first is logged at Warn, and the sink is failing until a
// batch is answered. Batches of 5 rows: Y cannot connect for b; X
// commits a, then c (begun after Y's first failure, so Y's next failure
// hands b off) and stays in c's first Ack until the test lets it go, so
// that no committer is free to take b, whenever Y's retry comes. (X free
// for a moment between c and the next batch let Y hand b to it, and the
// Warn line never came.)
func TestHandOffConnectFailuresAreSeen(t *testing.T) {
	ctx, admin, role, s, src, wait, logs := roleSink(t, 2, true, func(c *Config) {
		c.Batch.MaxRows = 5
		c.Retry = RetryConfig{Initial: 1500 * time.Millisecond, Max: 1500 * time.Millisecond}
	})
	tx, am, bm := oneConnectionLocked(t, ctx, admin, role, s, src, nil)
	c, cm := rows(16, 5, nil)
	acking, proceed := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(proceed) })
	t.Cleanup(release) // before Run's cleanup, which waits for X
	cm[0].beforeAck = func() { close(acking); <-proceed }
	src.push(t, ctx, c)
	waitFor(t, ctx, "the other batch's connect refused", func() bool { return s.Stats().Retries > 0 })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "a acked", allAcked(am))
	select {
	case <-acking: // c committed; X is held in its Ack
	case <-ctx.Done():
		t.Fatal("c not committed")
	}
	retries := s.Stats().Retries
	seen, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	waitFor(t, seen, "the failed connects of the batch offered logged", func() bool {
		return strings.Contains(logs.String(), "cannot connect; offering the batch to the other committers")
	})
	waitFor(t, seen, "the failed connects of the batch offered counted", func() bool { return s.Stats().Retries > retries })
	if d, msg := s.Failing(); d == 0 || !strings.Contains(msg, "53300") {
		t.Errorf("Failing() = %v, %q while a batch waits for a committer that cannot connect; want failing, 53300", d, msg)
	}
	for _, m := range bm {
		if m.acks.Load() != 0 {
			t.Fatal("a row of b acked while its committer cannot connect and the other is busy")
		}
	}
	release()
	src.Close()
	waitFor(t, ctx, "every batch acked", allAcked(append(bm, cm...)))
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if d, msg := s.Failing(); d != 0 {
		t.Errorf("Failing() = %v, %q once every batch committed", d, msg)
	}
}

// A batch handed to another committer (errHandOff) ended its copy span with
// an Error status, as if it had failed, beside the span of the committer
// that took it and committed it. Now that span ends without one, marked
// jetsink.batch.handed_off. X, the committer with the role's one
// connection, waits on a lock with batch a while Y cannot connect for b;
// the lock gone, X commits a and then c (begun after Y's first failure),
// so that Y's next failure hands b to X.
func TestHandedOffBatchSpanIsNoError(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := telemetry.NewTracingTo(exp, telemetry.Config{ServiceName: "test", SampleRatio: 1, MaxLinks: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	ctx, admin, role, s, src, wait, _ := roleSinkWith(t, 2, false, func(s *Sink) { s.Instrument(tr, nil) }, func(c *Config) {
		c.Batch.MaxRows = 5
		c.Retry = RetryConfig{Initial: 300 * time.Millisecond, Max: 300 * time.Millisecond}
	})
	spans := map[trace.SpanID]bool{}
	tx, am, bm := oneConnectionLocked(t, ctx, admin, role, s, src, func(b []pipeline.Row) {
		for i := range b {
			b[i].Event.Span = tr.StartMessage(b[i].Event)
			spans[b[i].Event.Span.SpanContext().SpanID()] = true
		}
	})
	waitFor(t, ctx, "Y's connect refused", func() bool { return s.Stats().Retries > 0 })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "a acked", allAcked(am))
	c, cm := rows(16, 5, nil)
	src.push(t, ctx, c)
	waitFor(t, ctx, "b and c acked", allAcked(append(bm, cm...)))
	src.Close()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var handed, committed int
	for _, sp := range exp.GetSpans() {
		if sp.Name != "copy "+s.cfg.Table || !slices.ContainsFunc(sp.Links, func(l sdktrace.Link) bool { return spans[l.SpanContext.SpanID()] }) {
			continue
		}
		if sp.Status.Code == codes.Error {
			t.Errorf("b's copy span ended with status %v %q", sp.Status.Code, sp.Status.Description)
		}
		if slices.Contains(sp.Attributes, attribute.Bool("jetsink.batch.handed_off", true)) {
			handed++
		} else {
			committed++
		}
	}
	if handed != 1 || committed != 1 {
		t.Errorf("b's copy spans: %d handed off, %d others; want 1, 1", handed, committed)
	}
}

// A stop while a committer that cannot connect would hand its batch off:
// once the batcher is done no committer takes work (a token left in ready
// then is stale: its committer got nil and returned), and the batch is
// committed by its own committer when it can connect. A review found a
// send on the closed work channel here, a panic.
func TestStopWhileABatchWouldBeHandedOff(t *testing.T) {
	// Y, the committer without a connection, tries again 1-2 s after it
	// failed, while X commits a slow last batch after the batcher is done.
	ctx, admin, role, s, src, wait, _ := roleSink(t, 2, false, func(c *Config) { c.Retry = RetryConfig{Initial: 2 * time.Second, Max: 2 * time.Second} })
	triggerOn(t, ctx, admin, s.table, "slow", "NEW.stream_seq >= 21", "PERFORM pg_sleep(0.6)")
	tx, am, bm := oneConnectionLocked(t, ctx, admin, role, s, src, nil)
	waitFor(t, ctx, "the other batch's connect refused", func() bool { return s.Stats().Retries > 0 })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "X's first batch acked", allAcked(am))
	c, cm := rows(16, 5, nil) // an attempt that began after Y failed commits
	src.push(t, ctx, c)
	waitFor(t, ctx, "X's second batch acked", allAcked(cm))
	d, dm := rows(21, 5, nil) // 3 s on X's connection
	src.push(t, ctx, d)
	src.Close()
	waitFor(t, ctx, "every batch acked", allAcked(append(bm, dm...)))
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// A login the server refuses (the role's password changed) is not blamed on
// the table: the log says what to do, restart with the new credentials,
// and the rows commit once the old ones work again.
func TestRefusedLoginIsNotBlamedOnTheTable(t *testing.T) {
	ctx, admin, role, _, src, wait, logs := roleSink(t, 1, true)
	execAll(t, ctx, admin, "ALTER ROLE "+role+" PASSWORD 'rotated'", terminateRole(role))
	rs, ms := rows(6, 5, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "the refused login logged", func() bool { return strings.Contains(logs.String(), "28P01") })
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, "28P01") &&
			(!strings.Contains(line, "refuses jetsink's login") || !strings.Contains(line, "restart jetsink") || strings.Contains(line, "fix the table")) {
			t.Errorf("the refused login is logged as %s", line)
		}
	}
	if _, err := admin.Exec(ctx, "ALTER ROLE "+role+" PASSWORD 'role-pw'"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "rows acked", allAcked(ms))
	src.Close()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// A connect that reaches no server says where to set the URL, as NATS's
// connect error does. One a server answered (a refused login, alone or
// after a closed port in a failover list) has a cause of its own, and no
// such hint.
func TestConnectErrorSaysWhereToSetTheURLWhenNothingListens(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(url string) error {
		t.Helper()
		cfg := DefaultConfig()
		cfg.URL = url
		cfg.Table = uniqueName(t)
		s, err := New(ctx, cfg, testCols, &recDL{}, testLogger(t))
		if err != nil {
			t.Fatalf("New(%s): %v", url, err)
		}
		defer s.Close()
		_, err = s.Check(ctx)
		return err
	}
	const hint = "(is PostgreSQL listening there? set postgres.url, --database-url or JETSINK_DATABASE_URL)"
	err = check("postgres://u@" + closed + "/x") // sslmode=prefer: two tries, both refused
	if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.HasSuffix(err.Error(), hint) {
		t.Errorf("nothing listening: Check = %v; want the refusal, then %s", err, hint)
	}

	// A name that does not resolve, and a dial the connect timeout ends
	// (pgx keeps the context's error of it, not the dial's).
	for name, c := range map[string]struct {
		url        string
		instrument func(*pgx.ConnConfig)
	}{
		"no such host": {"postgres://u@db.invalid:5432/x", func(cc *pgx.ConnConfig) {
			cc.LookupFunc = func(_ context.Context, host string) ([]string, error) {
				return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			}
		}},
		"a dial timed out": {"postgres://u@" + closed + "/x", func(cc *pgx.ConnConfig) {
			cc.ConnectTimeout = 50 * time.Millisecond
			cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
				<-ctx.Done() // the connect timeout's
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}
		}},
	} {
		cfg := DefaultConfig()
		cfg.URL = c.url
		s, err := New(ctx, cfg, testCols, &recDL{}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		c.instrument(s.connCfg)
		_, err = s.connect(ctx)
		s.Close()
		if err == nil || !strings.HasSuffix(err.Error(), hint) {
			t.Errorf("%s: connect = %v; want it to end with %s", name, err, hint)
		}
	}

	// A server that takes the connection and never answers: pgx says
	// "timeout: context deadline exceeded" of it as of a dial's timeout,
	// but something listens there.
	silent := listen(t)
	silent.wg.Go(func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			silent.track(c) // held open, never written to, closed at cleanup
		}
	})
	{
		cfg := DefaultConfig()
		cfg.URL = "postgres://u@" + silent.Addr().String() + "/x"
		s, err := New(ctx, cfg, testCols, &recDL{}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		// Long enough that the loopback dial itself cannot time out on a
		// loaded machine (that dial failed would rightly earn the hint).
		s.connCfg.ConnectTimeout = time.Second
		_, err = s.connect(ctx)
		s.Close()
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "--database-url") {
			t.Errorf("a server that never answers: connect = %v; want its timeout without the hint", err)
		}
	}

	pg := testenv.Postgres(t)
	role, roleURL := newRole(t, ctx, pg.Conn(t), pg.URL)
	u, err := url.Parse(roleURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "wrong-pw")
	for name, wrong := range map[string]string{
		"a refused login":                     u.String(),
		"a closed port, then a login refused": strings.Replace(u.String(), "@"+u.Host, "@"+closed+","+u.Host, 1),
	} {
		err := check(wrong)
		if err == nil || !strings.Contains(err.Error(), "28P01") || strings.Contains(err.Error(), "--database-url") {
			t.Errorf("%s: Check = %v; want the refused login (28P01) without the hint", name, err)
		}
	}
}

// A batch that waits for a lock is reported while it waits, with who holds
// the lock, again as the wait doubles, and no more once it has committed.
func TestSlowBatchNamesWhatBlocksIt(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Connections = 1 })
	logs := captureLog(t, s, time.Minute)
	prev := slowBatchAfter
	slowBatchAfter = 300 * time.Millisecond
	t.Cleanup(func() { slowBatchAfter = prev })
	src := newSource()
	wait := runSink(t, ctx, s, src)

	tx := lockTable(t, ctx, pg, s)
	locker := tx.Conn()
	blocker := fmt.Sprintf("blocked_by=\"pid %d (", locker.PgConn().PID())
	batch, ms := rows(1, 50, nil)
	src.push(t, ctx, batch)
	reports := func() []string {
		var out []string
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, "batch waiting on PostgreSQL") {
				out = append(out, line)
			}
		}
		return out
	}
	waitFor(t, ctx, "two reports of the waiting batch", func() bool { return len(reports()) >= 2 })
	// Not years either: the committer stores its start as OldestAttempt
	// reads it (a stamp on the monotonic clock, not Unix nanoseconds).
	if age := s.OldestAttempt(); age < 2*slowBatchAfter || age > time.Hour {
		t.Errorf("OldestAttempt() = %v after two reports, want at least %v (and less than the test's minute)", age, 2*slowBatchAfter)
	}
	for _, line := range reports()[:2] {
		if !strings.Contains(line, "rows=50") || !strings.Contains(line, "wait=Lock:relation") || !strings.Contains(line, blocker) ||
			!strings.Contains(line, "idle in transaction") || !strings.Contains(line, "pg_terminate_backend") {
			t.Errorf("report %q does not say the batch waits for a lock that pid %d holds", line, locker.PgConn().PID())
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the batch acked", allAcked(ms))
	if age := s.OldestAttempt(); age != 0 {
		t.Errorf("OldestAttempt() = %v after the commit, want 0", age)
	}
	// Its commit says that the wait logged has ended, once, with the
	// reports' backend_pid; a batch that did not wait says nothing.
	ended := func() []string {
		var out []string
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, "batch committed after waiting") {
				out = append(out, line)
			}
		}
		return out
	}
	if got := ended(); len(got) != 1 {
		t.Fatalf("%d lines saying the batch committed after waiting, want 1: %q", len(got), got)
	}
	line := ended()[0]
	if pid := logValue(t, line, "backend_pid"); logValue(t, line, "rows") != "50" || pid != logValue(t, reports()[0], "backend_pid") {
		t.Errorf("%q does not name the batch of 50 rows of backend_pid %s", line, logValue(t, reports()[0], "backend_pid"))
	}
	if waited := logDuration(t, line, "waited"); waited < 2*slowBatchAfter {
		t.Errorf("waited=%v, want at least the %v of the second report", waited, 2*slowBatchAfter)
	}
	quick, mQuick := rows(51, 10, nil)
	src.push(t, ctx, quick)
	waitFor(t, ctx, "the next batch acked", allAcked(mQuick))
	if got := ended(); len(got) != 1 {
		t.Errorf("a batch that did not wait said it committed after waiting: %q", got[1:])
	}
	n := len(reports())
	time.Sleep(4 * slowBatchAfter) // past the next report a running watch would make
	if got := len(reports()); got != n {
		t.Errorf("%d reports after the batch committed", got-n)
	}
	// A look cut short because the attempt ended says nothing.
	over, cancel := context.WithCancel(ctx)
	cancel()
	s.reportSlow(over, locker.PgConn().PID(), nil, 50, time.Minute)
	if got := len(reports()); got != n {
		t.Errorf("a look whose attempt had ended logged: %q", reports()[n:])
	}
	// A backend pg_stat_activity does not know (behind a pooler).
	s.reportSlow(ctx, 1, nil, 50, time.Minute)
	if r := reports(); len(r) != n+1 || !strings.Contains(r[n], "no such backend") || !strings.Contains(r[n], "pooler") {
		t.Errorf("the report of an unknown backend: %q", r[n:])
	}
	// A backend on another server than the look reaches (the batch's
	// server left behind by a failover) is not "hidden by a pooler".
	s.reportSlow(ctx, locker.PgConn().PID(), &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 5432}, 50, time.Minute)
	if r := reports(); len(r) != n+2 || !strings.Contains(r[n+1], "wait=unknown") || !strings.Contains(r[n+1], "127.0.0.2:5432") ||
		!strings.Contains(r[n+1], "failover") || strings.Contains(r[n+1], "pooler") || strings.Contains(r[n+1], "blocked_by") {
		t.Errorf("the report of a backend on another server: %q", r[n+1:])
	}
	// While the admin connection is busy (a query of its own waiting on
	// the same lock) the report looks on a connection of its own: before,
	// it said only "wait for the admin connection: context deadline
	// exceeded", without who blocks the batch.
	tx = lockTable(t, ctx, pg, s)
	locker = tx.Conn()
	blocker = fmt.Sprintf("blocked_by=\"pid %d (", locker.PgConn().PID())
	s.adminSem <- struct{}{}
	batch, ms = rows(51, 10, nil)
	src.push(t, ctx, batch)
	waitFor(t, ctx, "a report while the admin connection is busy", func() bool {
		r := reports()
		return len(r) > n+1 && strings.Contains(r[len(r)-1], "rows=10")
	})
	if r := reports(); !strings.Contains(r[len(r)-1], blocker) || strings.Contains(r[len(r)-1], "look_err") {
		t.Errorf("report %q while the admin connection is busy does not name pid %d", r[len(r)-1], locker.PgConn().PID())
	}
	<-s.adminSem
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the second batch acked", allAcked(ms))
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// roleSink runs a sink of connections committers (and mods) as a role of
// the test's own (newRole), which may create its table, and has it commit
// rows 1-5; with capture its log is kept (captureLog). admin is a
// superuser's connection.
func roleSink(t *testing.T, connections int, capture bool, mods ...func(*Config)) (ctx context.Context, admin *pgx.Conn, role string, s *Sink, src source,
	wait func() error, logs *testenv.SyncBuffer) {
	t.Helper()
	return roleSinkWith(t, connections, capture, nil, mods...)
}

// roleSinkWith is roleSink calling before, if not nil, with the sink before
// Run starts (to instrument it).
func roleSinkWith(t *testing.T, connections int, capture bool, before func(*Sink), mods ...func(*Config)) (ctx context.Context, admin *pgx.Conn, role string,
	s *Sink, src source, wait func() error, logs *testenv.SyncBuffer) {
	t.Helper()
	ctx = testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	admin = pg.Conn(t)
	role, roleURL := newRole(t, ctx, admin, pg.URL, "GRANT CREATE ON SCHEMA public TO %[1]s")
	s, _ = newTestSink(t, ctx, roleURL, func(c *Config) {
		c.Connections = connections
		for _, mod := range mods {
			mod(c)
		}
	})
	if capture {
		logs = captureLog(t, s, time.Minute)
	}
	if before != nil {
		before(s)
	}
	src = newSource()
	wait = runSink(t, ctx, s, src)
	rs, ms := rows(1, 5, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "rows acked", allAcked(ms))
	return ctx, admin, role, s, src, wait, logs
}

// refuseAdmin limits role to n connections and ends s's admin connection,
// so that a new one is refused (53300) while the committers keep theirs.
func refuseAdmin(t *testing.T, ctx context.Context, admin *pgx.Conn, role string, s *Sink, n int) {
	t.Helper()
	var adminPID uint32
	if err := s.withAdmin(ctx, func(c *pgx.Conn) error { adminPID = c.PgConn().PID(); return nil }); err != nil {
		t.Fatal(err)
	}
	execAll(t, ctx, admin, fmt.Sprintf("ALTER ROLE %s CONNECTION LIMIT %d", role, n), fmt.Sprintf("SELECT pg_terminate_backend(%d, 5000)", adminPID))
}

// quietAfter makes a stream with no batch answered for d quiet to Ready
// (answeredReady) for the test.
func quietAfter(t *testing.T, d time.Duration) {
	old := answeredReady
	answeredReady = d
	t.Cleanup(func() { answeredReady = old })
}

// oneConnectionLocked limits role to one connection and locks s's table
// in a transaction of admin's, then hands s two batches: X, the committer
// with the connection, takes rows 6-10 (am) and waits on the lock; Y
// cannot connect and holds rows 11-15 (bm), given to prepare (when not
// nil) before they go. Rolling tx back lets X go on.
func oneConnectionLocked(t *testing.T, ctx context.Context, admin *pgx.Conn, role string, s *Sink, src source, prepare func([]pipeline.Row)) (tx pgx.Tx, am, bm []*recMsg) {
	t.Helper()
	execAll(t, ctx, admin, "ALTER ROLE "+role+" CONNECTION LIMIT 1", terminateRole(role))
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	execAll(t, ctx, admin, "LOCK TABLE "+s.table.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	a, am := rows(6, 5, nil) // X takes the connection and waits on the lock
	src.push(t, ctx, a)
	waitFor(t, ctx, "a batch waiting on the lock", func() bool {
		var n int
		execAll(t, ctx, admin, "SELECT pg_stat_clear_snapshot()") // admin is in the locking transaction
		// A connection of the role idle for a second is not X's, which
		// sends its statements as soon as it connects: it holds the one
		// the role may have, and X, refused (53300), would never reach
		// the lock (seen once in CI). Ended, it leaves the slot to X.
		execAll(t, ctx, admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+role+"' AND state = 'idle' AND state_change < clock_timestamp() - interval '1 second'")
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Lock'", role).Scan(&n)
		return err == nil && n == 1
	})
	b, bm := rows(11, 5, nil) // Y cannot connect
	if prepare != nil {
		prepare(b)
	}
	src.push(t, ctx, b)
	return tx, am, bm
}

// execAll runs each statement on c.
func execAll(t *testing.T, ctx context.Context, c *pgx.Conn, sqls ...string) {
	t.Helper()
	for _, q := range sqls {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// terminateRole is a statement that ends every session of role.
func terminateRole(role string) string {
	return "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = '" + role + "'"
}

// storedOnceEach checks the end of a lookup rig's test: every message
// acked once, and the table holding one row for each (row 1 stored before
// the test, the others by it).
func storedOnceEach(t *testing.T, ctx context.Context, pg *testenv.PG, s *Sink, ms []*recMsg) {
	t.Helper()
	for i, m := range ms {
		if n := m.acks.Load(); n != 1 {
			t.Errorf("message %d acked %d times, want once", i+1, n)
		}
	}
	if n := count(t, ctx, pg.Conn(t), s.cfg.Table); n != len(ms) {
		t.Errorf("%d rows, want %d", n, len(ms))
	}
}

// lookupRig is an exactly-once sink of one connection behind a proxy
// that, once armed, hands the first query after each COPY (sent once its
// Query's ReadyForQuery came: the lookup of the rows an INSERT that
// stored fewer than it staged left out) to onLookup, which decides its
// fate. Row 1 is stored and acked before it is armed, so that rows 1 to
// 5 sent again conflict on it and are looked up.
type lookupRig struct {
	pg    *testenv.PG
	s     *Sink
	dl    *recDL
	logs  *testenv.SyncBuffer
	src   source
	wait  func() error
	armed atomic.Bool
}

func newLookupRig(t *testing.T, ctx context.Context, onLookup func(client net.Conn) verdict) *lookupRig {
	t.Helper()
	return newLookupRigCut(t, ctx, onLookup, nil)
}

// newLookupRigCut is newLookupRig whose proxy also cuts the connection at
// the next write that ends a COPY once cutCopy is set (and clears it): the
// COPY fails, its commit's outcome unknown to the sink.
func newLookupRigCut(t *testing.T, ctx context.Context, onLookup func(client net.Conn) verdict, cutCopy *atomic.Bool) *lookupRig {
	t.Helper()
	r := &lookupRig{pg: testenv.Postgres(t)}
	l := listen(t)
	proxied, to := l.proxy(t, r.pg.URL)
	proxied = withParam(t, proxied, "sslmode", "disable") // the hook reads the messages
	l.relayTo(to, func(client net.Conn) (up, down func([]byte) verdict) {
		var f frontendStream
		copyDone := false // the client's last write ended a COPY
		up = func(b []byte) verdict {
			ts := f.types(b)
			if r.armed.Load() && copyDone && bytes.IndexByte(ts, 'P') >= 0 {
				if v := onLookup(client); v != pass {
					copyDone = false
					return v
				}
			}
			copyDone = bytes.IndexByte(ts, 'c') >= 0
			if copyDone && cutCopy != nil && cutCopy.CompareAndSwap(true, false) {
				return cut
			}
			return pass
		}
		return up, func([]byte) verdict { return pass }
	})
	r.s, r.dl = newTestSink(t, ctx, proxied, func(c *Config) { c.Connections, c.Mode = 1, ExactlyOnce })
	r.logs = captureLog(t, r.s, time.Minute)
	r.src = newSource()
	r.wait = runSink(t, ctx, r.s, r.src)
	first, m1 := rows(1, 1, nil)
	r.src.push(t, ctx, first)
	waitFor(t, ctx, "row 1 acked", allAcked(m1))
	r.armed.Store(true)
	return r
}

// answerLookup answers the lookup on client as the server answers a
// statement that failed with code and message: an ErrorResponse, then
// ReadyForQuery, the connection going on; the lookup is dropped.
func answerLookup(client net.Conn, code, message string) verdict {
	msg, err := (&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: code, Message: message}).Encode(nil)
	if err == nil {
		msg, err = (&pgproto3.ReadyForQuery{TxStatus: 'I'}).Encode(msg)
	}
	if err != nil {
		return cut
	}
	_, _ = client.Write(msg)
	return drop
}

// An exactly-once batch holding a row stored before (a redelivery) inserts
// fewer rows than it staged, so after its commit the sink looks up which of
// its rows the table lacks. When that lookup fails (a statement_timeout,
// 57014; the connection lost after the commit), the batch has committed
// all the same: it is sent again (its stored rows conflict) and looked up
// again, with no retry counted, no piece halved and no line saying that
// the batch failed or timed out; each row is acked once. Before, the
// timeout halved the committer's pieces (TimeoutSplits) and was logged as
// the batch's, and the lost connection as "batch failed; retrying until it
// commits", with a retry counted and the sink failing.
func TestExactlyOnceLookupFailsAfterCommit(t *testing.T) {
	for _, how := range []string{"timeout", "cut"} {
		t.Run(how, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			var failed atomic.Bool
			r := newLookupRig(t, ctx, func(client net.Conn) verdict {
				if !failed.CompareAndSwap(false, true) {
					return pass
				}
				if how == "cut" {
					return cut
				}
				// The server's answer to a statement that timed out; the
				// connection goes on.
				return answerLookup(client, "57014", "canceling statement due to statement timeout")
			})
			pg, s, dl, logs, src, wait := r.pg, r.s, r.dl, r.logs, r.src, r.wait
			again, ms := rows(1, 5, nil) // row 1 conflicts: 4 of 5 inserted, then the lookup
			src.push(t, ctx, again)
			finishClean(t, ctx, src, wait, dl, ms)
			if !failed.Load() {
				t.Fatal("no lookup went by to fail")
			}
			storedOnceEach(t, ctx, pg, s, ms)
			if st := s.Stats(); st.TimeoutSplits != 0 || st.Retries != 0 {
				t.Errorf("%d timeout splits, %d retries; want none: the batch committed", st.TimeoutSplits, st.Retries)
			}
			log := logs.String()
			for _, wrong := range []string{"timed out on the server", "batch failed", "retrying until it commits"} {
				if strings.Contains(log, wrong) {
					t.Errorf("the log says %q of a batch that committed:\n%s", wrong, log)
				}
			}
			if !strings.Contains(log, "batch committed, but the lookup of which of its rows the table stored failed") {
				t.Errorf("the log does not say the lookup failed after the commit:\n%s", log)
			}
		})
	}
}

// An exactly-once lookup after the commit that fails for good is a failed
// attempt, not a passing one: one the server refuses (42501, a grant on
// the key columns revoked) makes the sink report the refusal, and one that
// always times out halves the batch (TimeoutSplits) until the sink reports
// it failing. Nothing is acked before a lookup answers, and once lookups
// answer again every row is acked once and stored once.
func TestExactlyOnceLookupFailsForGood(t *testing.T) {
	for _, tc := range []struct{ code, message, ready string }{ // ready: what Ready says
		{"42501", "permission denied for table events", "has refused every batch"},
		{"57014", "canceling statement due to statement timeout", "has failed every batch"},
		// Suspect if a row's: the lookup's is never bisected nor dead-lettered.
		{"XX000", "could not read block 0", "has refused every batch"},
		// Transient, but the server's: a failed attempt from the first.
		{"53200", "out of memory", "has failed every batch"},
	} {
		t.Run(tc.code, func(t *testing.T) {
			old := refusedFor
			t.Cleanup(func() { refusedFor = old })
			refusedFor = 300 * time.Millisecond
			ctx := testCtx(t, 30*time.Second)
			var failed atomic.Int32
			r := newLookupRig(t, ctx, func(client net.Conn) verdict {
				failed.Add(1)
				return answerLookup(client, tc.code, tc.message)
			})
			pg, s, dl, logs, src, wait := r.pg, r.s, r.dl, r.logs, r.src, r.wait
			again, ms := rows(1, 5, nil) // row 1 conflicts: 4 of 5 inserted, then the lookup
			src.push(t, ctx, again)
			// Several lookups, not only the time Ready waits (refusedFor):
			// on a loaded machine the retry after the first could come
			// later than that.
			waitFor(t, ctx, "Ready to report the failing lookups, and them retried", func() bool {
				err := s.Ready(ctx)
				return err != nil && strings.Contains(err.Error(), tc.ready) && strings.Contains(err.Error(), "SQLSTATE "+tc.code) &&
					failed.Load() >= 2
			})
			if tc.code == "57014" {
				if st := s.Stats(); st.TimeoutSplits == 0 {
					t.Errorf("no timeout split while every lookup timed out: %+v", st)
				}
			} else if st := s.Stats(); (st.ConfigErrors == 0) != (tc.code == "53200") || st.Retries == 0 {
				t.Errorf("a refused lookup counted no retry, or a configuration error if and only if not transient: %+v", st)
			}
			for i, m := range ms {
				if m.acks.Load() != 0 || m.terms.Load() != 0 {
					t.Fatalf("message %d settled while no lookup answered", i+1)
				}
			}
			r.armed.Store(false)
			finishClean(t, ctx, src, wait, dl, ms)
			if failed.Load() < 2 {
				t.Fatalf("%d lookups failed, want several", failed.Load())
			}
			storedOnceEach(t, ctx, pg, s, ms)
			// The first timeout passes as a lookup to retry; a refusal
			// is logged as one, saying the transaction committed.
			want := "the transaction committed, but: look for rows missing"
			if tc.code == "57014" {
				want = "batch committed, but the lookup of which of its rows the table stored failed"
			}
			if !strings.Contains(logs.String(), want) {
				t.Errorf("the log does not say %q:\n%s", want, logs.String())
			}
			quiet := "batch committed, but the lookup of which of its rows the table stored failed"
			if tc.code == "53200" && strings.Contains(logs.String(), quiet) {
				t.Errorf("a lookup that ran out of memory passed quietly:\n%s", logs.String())
			}
		})
	}
}

// An exactly-once lookup after the commit whose connection is cut every
// time (a pooler's query_timeout, say) passes quietly only a few times;
// then each is a failed attempt: retries counted and the sink reported
// failing, not Ready while nothing is acked. Nothing is acked before a
// lookup answers; once one does, every row is acked once and stored once.
func TestExactlyOnceLookupCutEveryTime(t *testing.T) {
	old := refusedFor
	t.Cleanup(func() { refusedFor = old })
	refusedFor = 300 * time.Millisecond
	ctx := testCtx(t, 30*time.Second)
	var cuts atomic.Int32
	r := newLookupRig(t, ctx, func(net.Conn) verdict {
		cuts.Add(1)
		return cut
	})
	pg, s, dl, logs, src, wait := r.pg, r.s, r.dl, r.logs, r.src, r.wait
	again, ms := rows(1, 5, nil) // row 1 conflicts: 4 of 5 inserted, then the lookup
	src.push(t, ctx, again)
	waitFor(t, ctx, "Ready to report the lookups cut", func() bool {
		err := s.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "has failed every batch")
	})
	if n := cuts.Load(); n <= lookupQuietPasses {
		t.Errorf("Ready failing after %d lookups cut, want more than the %d that pass quietly", n, lookupQuietPasses)
	}
	if st := s.Stats(); st.Retries == 0 || st.ConfigErrors != 0 {
		t.Errorf("lookups cut past the bound: %+v; want retries counted, no configuration error", st)
	}
	for i, m := range ms {
		if m.acks.Load() != 0 || m.terms.Load() != 0 {
			t.Fatalf("message %d settled while no lookup answered", i+1)
		}
	}
	r.armed.Store(false)
	finishClean(t, ctx, src, wait, dl, ms)
	storedOnceEach(t, ctx, pg, s, ms)
	if !strings.Contains(logs.String(), "batch committed, but the lookup of which of its rows the table stored failed") {
		t.Errorf("the log does not say the lookup failed after the commit:\n%s", logs.String())
	}
}

// The bound on a batch's failed lookups that pass quietly
// (lookupQuietPasses) holds for the batch, not for each piece of it: a
// lookup that always times out halves the batch of 16 rows down to one
// (each timeout past the first is a failed attempt), and its pieces'
// lookups pass quietly no more often than the batch's would. Before, each
// piece's retries counted their own, and one more passed quietly per
// halving: five for 16 rows.
func TestExactlyOnceLookupQuietPassesPerBatch(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	var timeouts atomic.Int32
	r := newLookupRig(t, ctx, func(client net.Conn) verdict {
		timeouts.Add(1)
		return answerLookup(client, "57014", "canceling statement due to statement timeout")
	})
	pg, s, dl, logs, src, wait := r.pg, r.s, r.dl, r.logs, r.src, r.wait
	again, ms := rows(1, 16, nil) // row 1 conflicts: 15 of 16 inserted, then the lookup
	src.push(t, ctx, again)
	waitFor(t, ctx, "the batch halved down to one row", func() bool { return s.Stats().TimeoutSplits >= 4 })
	n := timeouts.Load()
	waitFor(t, ctx, "the lone row's lookups to time out again", func() bool { return timeouts.Load() >= n+3 })
	r.armed.Store(false)
	finishClean(t, ctx, src, wait, dl, ms)
	// Each commitRetry logs its first quiet pass at Warn (the others at
	// Debug, which the capture leaves out), so this counts every pass
	// of a piece that had one.
	quiet := strings.Count(logs.String(), "batch committed, but the lookup of which of its rows the table stored failed")
	if quiet == 0 || quiet > lookupQuietPasses {
		t.Errorf("%d quiet passes logged for one batch, want 1 to %d:\n%s", quiet, lookupQuietPasses, logs.String())
	}
	storedOnceEach(t, ctx, pg, s, ms)
}

// A row that alone takes longer than the statement_timeout was retried for
// ever (a timeout is transient, and one row cannot be halved): its
// committer stuck for good, its event neither stored nor dead-lettered,
// every drain running to drain_timeout, the row back after each restart.
// Now a row that timed out alone loneTimeoutsPoison times in a row, over
// loneSpan at least, with a commit of another row between each two, is
// dead-lettered with SQLSTATE 57014, and the others are stored ("slow": a
// trigger sleeps a second for row 3, the limit is 200 ms; rows come on
// another committer all along). So is a held row ("held": row 2 fails
// with a suspect error once, after row 1 was dead-lettered, so that the
// committer holds the rest of the batch, row 2 alone, which then times
// out; it was retried for ever, the rule left out for a held batch). The
// commits the rule waited for count for no row refused after it with a
// suspect error ("refused after": row 2 as in "held" but with row 3 behind
// it, so it is given up unheld; then the table refuses every row for a
// while, as a trigger added would, and row 3, refused first, was
// dead-lettered at once, the others' commits since row 2's suspect error
// taken for the table taking rows). Not
// while nothing commits ("table locked"), nor when one commit came early
// and the table is locked for every row since ("locked after commit": the
// rule counted that one commit for every later timeout), nor before the
// span has gone by ("row locked": its trigger waits for a lock held
// elsewhere, as an insert waits for a locked parent row, while the other
// rows commit): those rows are retried and, once the lock goes, stored.
// (The names are short: application_name, the test's, keeps 63 bytes.)
func TestRowSlowerThanTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		span time.Duration
	}{
		{"slow", time.Second},
		{"held", time.Second},
		{"refused after", time.Second},
		{"table locked", 500 * time.Millisecond},
		// Longer than the commits of rows 4 to 6 that may come while
		// the lock is taken.
		{"locked after commit", 2 * time.Second},
		{"row locked", time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			s, dl, logs := loneSink(t, ctx, withParam(t, pg.URL, "statement_timeout", "200"), tc.span)
			admin, locker := pg.Conn(t), pg.Conn(t)
			lockKey := strconv.FormatInt(time.Now().UnixNano()%1e12, 10)
			n := 3                  // rows in the first batch
			var closer *tableCloser // "refused after"
			switch tc.name {
			case "slow":
				triggerOn(t, ctx, admin, s.table, "slow", "NEW.stream_seq = 3", "PERFORM pg_sleep(1)")
			case "held", "refused after":
				// Row 1 refused (a data error, dead-lettered); row 2 a
				// suspect error on its first try only (a sequence is
				// not rolled back), then too slow.
				if tc.name == "held" {
					n = 2
				} else {
					// Every row refused, with a suspect error, from
					// row 2's dead letter on (as it starts: before row 3
					// is tried) until the test opens the table again.
					closer = closeOnDeadLetter(t, ctx, pg, admin, s, dl, 2)
				}
				seq := pgx.Identifier{s.table[len(s.table)-1] + "_n"}.Sanitize()
				execAll(t, ctx, admin, "CREATE SEQUENCE "+seq)
				// (The COPY's own error, a unique key's, row 1 stored
				// already: a trigger's 22023 would be suspect, raised
				// inside a function, and so would a CHECK's, which may
				// refuse every row.)
				execAll(t, ctx, admin, "CREATE UNIQUE INDEX ON "+s.table.Sanitize()+" (stream, stream_seq); INSERT INTO "+
					s.table.Sanitize()+" (stream, stream_seq) VALUES ('S', 1)")
				triggerOn(t, ctx, admin, s.table, "odd", "NEW.stream_seq = 2",
					"IF nextval('"+seq+"') = 1 THEN RAISE EXCEPTION 'odd once'; END IF; PERFORM pg_sleep(1)")
			case "row locked", "locked after commit":
				triggerOn(t, ctx, admin, s.table, "wait", "NEW.stream_seq = 3", "PERFORM pg_advisory_xact_lock("+lockKey+")")
				execAll(t, ctx, locker, "SELECT pg_advisory_lock("+lockKey+")")
			}
			src, wait := runBoth(t, ctx, admin, s)
			var tx pgx.Tx
			if tc.name == "table locked" {
				tx = lockTable(t, ctx, pg, s)
			}
			first, ms := rows(1, n, nil)
			if tc.name == "slow" {
				first[2].Event.Delivered = 2 // a redelivery: it may be stored already
			}
			src.push(t, ctx, first)
			// Halved down to one row that times out alone: row 3 (row 1
			// with the table locked, row 2 held).
			waitFor(t, ctx, "a row to time out alone", func() bool {
				return strings.Contains(logs.String(), `retrying until it commits" rows=1 `)
			})
			lone := time.Now()
			// Rows that another committer takes: 4 to 6 at once, and one
			// more at each call of feed, 50 ms apart at least.
			feed := feeder(t, ctx, src, n+1, &ms)
			if tc.name != "held" && tc.name != "refused after" {
				feed(3)
			}
			var bad int // the rows dead-lettered
			switch tc.name {
			case "refused after":
				feedUntilDeadLettered(t, ctx, dl, feed, "row 2 dead-lettered", 2)
				closer.waitClosed(t, ctx)
				waitRefusedAgain(t, ctx, s, dl, "row 3 to be refused again and again", 2)
				letters, seqs := dl.letters()
				if len(letters) != 2 || seqs[0] != 1 || seqs[1] != 2 || letters[1].SQLState != "57014" {
					t.Fatalf("dead letters %+v for rows %v, want rows 1 and 2 only (row 2's SQLSTATE 57014): "+
						"row 3 is refused while no row commits after it", letters, seqs)
				}
				closer.open(t, ctx, admin)
				stopOnceAcked(t, ctx, src, wait, ms[2:])
				closer.startedOnce(t)
				if _, seqs := dl.letters(); len(seqs) != 2 {
					t.Fatalf("rows %v dead-lettered, want 1 and 2", seqs)
				}
				execAll(t, ctx, admin, "DELETE FROM "+s.table.Sanitize()+" WHERE payload IS NULL") // row 1, stored before
				if got := count(t, ctx, admin, s.cfg.Table); got != len(ms)-2 {
					t.Errorf("%d rows in the table, want %d: all but rows 1 and 2", got, len(ms)-2)
				}
				return
			case "slow", "held":
				bad = n - 1 // row 3; row 2 (held)
				feedUntilDeadLettered(t, ctx, dl, feed, "the lone row dead-lettered", uint64(bad+1))
				dead := ms[bad : bad+1] // and row 1 (held), refused
				others := append(ms[:bad:bad], ms[bad+1:]...)
				if tc.name == "held" {
					dead, others = ms[:2], ms[2:]
				}
				stopOnceAcked(t, ctx, src, wait, others)
				letters, seqs := dl.letters()
				if len(letters) != len(dead) {
					t.Fatalf("dead letters %+v for rows %v, want %d", letters, seqs, len(dead))
				}
				l := letters[len(letters)-1]
				if seqs[len(seqs)-1] != uint64(bad+1) || l.SQLState != "57014" || l.Code != pipeline.CodeRefused ||
					!strings.Contains(l.Reason, "alone timed out") || !strings.Contains(l.Reason, "while other rows committed") ||
					strings.Contains(l.Reason, "may already be stored") != (tc.name == "slow") {
					t.Fatalf("dead letters %+v for rows %v, want the last for row %d, SQLSTATE 57014, saying it alone timed out while other rows committed "+
						"(and, only for the redelivered row 3, that it may already be stored)", letters, seqs, bad+1)
				}
				if tc.name == "held" && (seqs[0] != 1 || letters[0].SQLState != "23505") {
					t.Errorf("row 1's dead letter %+v (row %d), want its own, SQLSTATE 23505", letters[0], seqs[0])
				}
				if tc.name == "held" {
					execAll(t, ctx, admin, "DELETE FROM "+s.table.Sanitize()+" WHERE payload IS NULL") // row 1, stored before
				}
				endedOnce(t, ctx, admin, s, dead, others, "the dead-lettered")
				// Once: a held row given up by the held branch, not
				// retried unheld from a count of none and given up again.
				if n := strings.Count(logs.String(), "level=ERROR msg=\"a row alone timed out on the server again and again"); n != 1 {
					t.Errorf("the row given up is logged at Error %d times, want once:\n%s", n, logs)
				}
				return
			case "table locked", "locked after commit":
				if tc.name == "locked after commit" {
					// Locked as soon as one of rows 4 to 6 is stored
					// (the others may commit while the lock waits for
					// them, well within the span).
					var err error
					if tx, err = pg.Conn(t).Begin(ctx); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
					waitFor(t, ctx, "one of rows 4 to 6 acked", func() bool {
						return slices.ContainsFunc(ms[3:], func(m *recMsg) bool { return m.acks.Load() > 0 })
					})
					if _, err := tx.Exec(ctx, "LOCK TABLE "+s.table.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
						t.Fatal(err)
					}
					lone = time.Now()
				}
				// Well past the span, with the lone rows timing out every
				// 200-400 ms (on a loaded machine, slower: wait for the
				// timeouts too).
				r := s.Stats().Retries
				waitFor(t, ctx, "the span to go by four times, and 6 retries", func() bool {
					return time.Since(lone) > 4*tc.span && s.Stats().Retries >= r+2*loneTimeoutsPoison
				})
				if l, seqs := dl.letters(); len(l) != 0 {
					t.Fatalf("rows %v dead-lettered while nothing committed: %+v", seqs, l)
				}
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				if tc.name == "locked after commit" {
					execAll(t, ctx, locker, "SELECT pg_advisory_unlock("+lockKey+")")
				}
			case "row locked":
				waitFor(t, ctx, "rows 1, 2, 4, 5 and 6 acked", allAcked(append(ms[:2:2], ms[3:]...)))
				r := s.Stats().Retries
				waitFor(t, ctx, "row 3 to time out alone again, past the count", func() bool {
					l, _ := dl.letters()
					return s.Stats().Retries >= r+loneTimeoutsPoison+1 || len(l) > 0
				})
				if l, seqs := dl.letters(); len(l) != 0 {
					t.Fatalf("rows %v dead-lettered before the span went by: %+v", seqs, l)
				}
				execAll(t, ctx, locker, "SELECT pg_advisory_unlock("+lockKey+")")
			}
			finishClean(t, ctx, src, wait, dl, ms)
			if n := count(t, ctx, admin, s.cfg.Table); n != 6 {
				t.Errorf("%d rows in the table, want 6", n)
			}
		})
	}
}

// loneSink is a sink of two committers on url (whose statement_timeout
// the caller sets) that gives a row up for its lone timeouts once span has
// gone by, and the log it writes.
func loneSink(t *testing.T, ctx context.Context, url string, span time.Duration) (*Sink, *recDL, *testenv.SyncBuffer) {
	t.Helper()
	s, dl := newTestSink(t, ctx, url, func(c *Config) { c.Connections = 2 })
	s.loneSpan = span
	return s, dl, captureLog(t, s, time.Minute)
}

// runBoth runs s on a new source and waits for both its committers to
// connect.
func runBoth(t *testing.T, ctx context.Context, admin *pgx.Conn, s *Sink) (source, func() error) {
	t.Helper()
	src := newSource()
	wait := runSink(t, ctx, s, src)
	waitFor(t, ctx, "both committers connected", func() bool {
		return backends(t, ctx, admin, s.cfg.AppName, "true") >= 2
	})
	return src, wait
}

// tableCloser closes a sink's table as row seq's first dead letter
// starts: a trigger named "closed" (fired before the rows' own, in name
// order) refuses every row, with a suspect error, while the table closed
// holds a row. Only the first: a second dead letter of the row (a bug)
// must not block the committer in DeadLetter, nor close the table again;
// started counts them, for startedOnce once Run returns.
type tableCloser struct {
	closed  string // sanitized
	seq     uint64
	errc    chan error
	started atomic.Int32
}

func closeOnDeadLetter(t *testing.T, ctx context.Context, pg *testenv.PG, admin *pgx.Conn, s *Sink, dl *recDL, seq uint64) *tableCloser {
	t.Helper()
	c := &tableCloser{closed: pgx.Identifier{s.table[len(s.table)-1] + "_closed"}.Sanitize(), seq: seq, errc: make(chan error, 1)}
	execAll(t, ctx, admin, "CREATE TABLE "+c.closed+" (x int)")
	triggerOn(t, ctx, admin, s.table, "closed", "EXISTS (SELECT FROM "+c.closed+")", "RAISE EXCEPTION 'table closed'")
	closer := pg.Conn(t)
	dl.started = func(ev *pipeline.Event) {
		if ev.StreamSeq == seq && c.started.Add(1) == 1 {
			_, err := closer.Exec(ctx, "INSERT INTO "+c.closed+" VALUES (1)")
			c.errc <- err
		}
	}
	return c
}

// waitClosed waits for the dead letter's hook to close the table.
func (c *tableCloser) waitClosed(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case err := <-c.errc:
		if err != nil {
			t.Fatalf("close the table: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("timed out waiting for row %d's dead letter to close the table", c.seq)
	}
}

// open lets the table take rows again.
func (c *tableCloser) open(t *testing.T, ctx context.Context, admin *pgx.Conn) {
	t.Helper()
	execAll(t, ctx, admin, "TRUNCATE "+c.closed)
}

func (c *tableCloser) startedOnce(t *testing.T) {
	t.Helper()
	if n := c.started.Load(); n != 1 {
		t.Errorf("row %d's dead letter started %d times, want once", c.seq, n)
	}
}

// feeder returns feed, which pushes k rows to src, numbered on from next,
// and appends their messages to *ms, unless it did so less than 50 ms
// before: called at each poll of a wait, it gives the other committer rows
// to commit between a lone row's timeouts.
func feeder(t *testing.T, ctx context.Context, src source, next int, ms *[]*recMsg) (feed func(k int)) {
	var fed time.Time
	return func(k int) {
		if time.Since(fed) < 50*time.Millisecond {
			return
		}
		fed = time.Now()
		more, mk := rows(next, k, nil)
		next += k
		src.push(t, ctx, more)
		*ms = append(*ms, mk...)
	}
}

// feedUntilDeadLettered feeds a row at each poll until row seq is
// dead-lettered.
func feedUntilDeadLettered(t *testing.T, ctx context.Context, dl *recDL, feed func(k int), what string, seq uint64) {
	t.Helper()
	waitFor(t, ctx, what, func() bool {
		feed(1)
		_, seqs := dl.letters()
		return slices.Contains(seqs, seq)
	})
}

// waitRefusedAgain waits for the retries of a row refused alone to pass
// the lone-timeout count, or for more than letters dead letters (a row
// given up wrongly, which the caller reports).
func waitRefusedAgain(t *testing.T, ctx context.Context, s *Sink, dl *recDL, what string, letters int) {
	t.Helper()
	r := s.Stats().Retries
	waitFor(t, ctx, what, func() bool {
		l, _ := dl.letters()
		return s.Stats().Retries >= r+loneTimeoutsPoison || len(l) > letters
	})
}

// stopOnceAcked waits for ms acked, then ends src and waits for Run.
func stopOnceAcked(t *testing.T, ctx context.Context, src source, wait func() error, ms []*recMsg) {
	t.Helper()
	waitFor(t, ctx, "the other rows acked", allAcked(ms))
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// endedOnce checks how the messages ended: dead's termed once and never
// acked, stored's acked once and never termed; and that the table holds
// stored's rows only: all but the rows but names ("row 2").
func endedOnce(t *testing.T, ctx context.Context, admin *pgx.Conn, s *Sink, dead, stored []*recMsg, but string) {
	t.Helper()
	for _, m := range dead {
		if m.acks.Load() != 0 || m.terms.Load() != 1 {
			t.Errorf("a dead-lettered row's message acked %d times, termed %d, want termed once", m.acks.Load(), m.terms.Load())
		}
	}
	for i, m := range stored {
		if m.acks.Load() != 1 || m.terms.Load() != 0 {
			t.Errorf("stored row %d of %d: its message acked %d times, termed %d, want acked once", i+1, len(stored), m.acks.Load(), m.terms.Load())
		}
	}
	if got := count(t, ctx, admin, s.cfg.Table); got != len(stored) {
		t.Errorf("%d rows in the table, want %d: all but %s", got, len(stored), but)
	}
}

// row1BehindRow2 ends a test in which row 2, given up for its lone
// timeouts, closes the table as its dead letter starts (closer), with row
// 1 behind it: row 1 must then be refused again and again, not
// dead-lettered on commits that all came after its own suspect error;
// once the table opens, it and the rows fed are stored, and row 2 was
// given up once (one Error line), by the branch named in by. It returns
// row 2's dead letter.
func row1BehindRow2(t *testing.T, ctx context.Context, admin *pgx.Conn, s *Sink, dl *recDL, logs *testenv.SyncBuffer,
	src source, wait func() error, closer *tableCloser, ms []*recMsg, by string) pipeline.DeadLetter {
	t.Helper()
	closer.waitClosed(t, ctx)
	waitRefusedAgain(t, ctx, s, dl, "row 1 to be refused again and again", 1)
	letters, seqs := dl.letters()
	if len(letters) != 1 || seqs[0] != 2 || letters[0].SQLState != "57014" || letters[0].Code != pipeline.CodeRefused {
		t.Fatalf("dead letters %+v for rows %v, want row 2's only, SQLSTATE 57014: "+
			"row 1 is refused while no row commits after it", letters, seqs)
	}
	if n := ms[0].acks.Load(); n != 0 {
		t.Fatalf("row 1 acked %d times while the table refuses every row: it was not behind row 2", n)
	}
	closer.open(t, ctx, admin)
	others := append(ms[:1:1], ms[2:]...)
	stopOnceAcked(t, ctx, src, wait, others)
	closer.startedOnce(t)
	if _, seqs := dl.letters(); len(seqs) != 1 {
		t.Fatalf("rows %v dead-lettered, want row 2", seqs)
	}
	endedOnce(t, ctx, admin, s, ms[1:2], others, "row 2")
	if n := strings.Count(logs.String(), "a row alone timed out on the server again and again"); n != 1 {
		t.Errorf("row 2 given up %d times, want once, by %s:\n%s", n, by, logs)
	}
	return letters[0]
}

// cutCopyOnce is the URL of a proxy to pg, its statements ending at
// 200 ms, that cuts the connection at the first write that ends a COPY
// (the commit's outcome unknown to the sink), calling cutNow then. Each
// connection's writes go first to a hook that conn makes for it: a verdict
// other than pass is the write's.
func cutCopyOnce(t *testing.T, pg *testenv.PG, conn func() func([]byte) verdict, cutNow func()) string {
	t.Helper()
	l := listen(t)
	proxied, to := l.proxy(t, pg.URL)
	proxied = withParam(t, withParam(t, proxied, "sslmode", "disable"), "statement_timeout", "200") // the hook reads the messages
	var cutCopy atomic.Bool
	cutCopy.Store(true)
	l.relayTo(to, func(net.Conn) (up, down func([]byte) verdict) {
		first := conn()
		var f frontendStream
		up = func(b []byte) verdict {
			if v := first(b); v != pass {
				return v
			}
			if bytes.IndexByte(f.types(b), 'c') >= 0 && cutCopy.CompareAndSwap(true, false) {
				cutNow()
				return cut
			}
			return pass
		}
		return up, func([]byte) verdict { return pass }
	})
	return proxied
}

// row1MayBeStored ends a test in which row 1's COPY was cut (outcome
// unknown) and row 1, handed to the other committer, was given up there
// for its lone timeouts: its dead letter, the only one, must say that it
// may already be stored (its COPY's outcome was unknown, and why still
// so), and every other row be stored.
func row1MayBeStored(t *testing.T, ctx context.Context, admin *pgx.Conn, s *Sink, dl *recDL, ms []*recMsg, why string) {
	t.Helper()
	letters, seqs := dl.letters()
	if len(letters) != 1 || seqs[0] != 1 || letters[0].SQLState != "57014" || !strings.Contains(letters[0].Reason, "alone timed out") {
		t.Fatalf("dead letters %+v for rows %v, want row 1's only, for its lone timeouts (SQLSTATE 57014)", letters, seqs)
	}
	if !strings.Contains(letters[0].Reason, "may already be stored") {
		t.Errorf("row 1's dead letter %q does not say it may already be stored: its COPY's outcome was unknown %s", letters[0].Reason, why)
	}
	endedOnce(t, ctx, admin, s, ms[:1], ms[1:], "row 1")
}

// A held row that times out alone with rows of its batch behind it (the
// piece cap at one row) is given up by the held branch itself, once, and
// clears the suspect count, as an unheld one does. Rows 1 and 2 come as
// one batch: row 1 is slow in it (the 2-row COPY times out: the cap drops
// to one row), then refused once with a suspect error alone; the probe
// swaps row 2 in, refused once too, so the committer holds the rest, row 2
// then row 1, and row 2 times out alone while rows committed elsewhere
// (fed from then on) pass between its timeouts. Row 2 is dead-lettered
// (57014) and, as that starts, the table refuses every row for a while (a
// trigger added): row 1, behind it, is then refused with a commit of
// others since row 1's own suspect error long before, and was
// dead-lettered when the held branch gave row 2 up by itself without
// clearing that count. Without the branch, the row was retried again
// unheld, from a count of none, and given up a second time (logged twice).
func TestHeldRowSlowerThanTimeoutWithRowsAfter(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	s, dl, logs := loneSink(t, ctx, withParam(t, pg.URL, "statement_timeout", "200"), time.Second)
	admin := pg.Conn(t)
	closer := closeOnDeadLetter(t, ctx, pg, admin, s, dl, 2)
	name := s.table[len(s.table)-1]
	n1, n2 := pgx.Identifier{name + "_n1"}.Sanitize(), pgx.Identifier{name + "_n2"}.Sanitize()
	execAll(t, ctx, admin, "CREATE SEQUENCE "+n1, "CREATE SEQUENCE "+n2)
	// Triggers fire in name order: "closed" before the rows' own. A
	// sequence is not rolled back, so each counts its row's tries.
	triggerOn(t, ctx, admin, s.table, "one", "NEW.stream_seq = 1",
		"CASE nextval('"+n1+"') WHEN 1 THEN PERFORM pg_sleep(1); WHEN 2 THEN RAISE EXCEPTION 'one once'; ELSE NULL; END CASE")
	triggerOn(t, ctx, admin, s.table, "two", "NEW.stream_seq = 2",
		"IF nextval('"+n2+"') = 1 THEN RAISE EXCEPTION 'two once'; END IF; PERFORM pg_sleep(1)")
	src, wait := runBoth(t, ctx, admin, s)
	first, ms := rows(1, 2, nil)
	src.push(t, ctx, first)
	waitFor(t, ctx, "row 2 to time out alone, held", func() bool {
		return strings.Contains(logs.String(), `retrying until it commits" rows=1 `)
	})
	if st := s.Stats(); st.TimeoutSplits == 0 {
		t.Fatalf("no timeout split before the hold: %+v; the test needs the piece cap at one row", st)
	}
	// Rows that the other committer takes, so that commits come between
	// row 2's timeouts.
	feedUntilDeadLettered(t, ctx, dl, feeder(t, ctx, src, 3, &ms), "row 2 dead-lettered", 2)
	row1BehindRow2(t, ctx, admin, s, dl, logs, src, wait, closer, ms, "the held branch")
}

// A row that probe tries alone (the row before it refused with a suspect
// error, and nothing committed since) and that times out alone while rows
// commit elsewhere is given up once, there, and dead-lettered in its
// place, clearing the suspect count as any row given up for its lone
// timeouts does. Rows 1 and 2 come as one batch: row 1 is refused with a
// suspect error in the batch's COPY (its trigger fires before row 2's) and
// alone; probe swaps row 2 in, which sleeps past the 200 ms limit every
// time, and rows fed from then on commit on the other committer between
// its timeouts. Row 2 is dead-lettered (57014) and, as that starts, the
// table refuses every row for a while (a trigger added): row 1, behind it,
// must not be dead-lettered on the commits of row 2's wait, which all came
// after row 1's own suspect error. probe went on past the row's
// loneTimeoutError: the row, left unsettled, was held with row 1, retried
// from a count of none and given up a second time (two Error lines, and
// another loneSpan).
func TestProbedRowSlowerThanTimeout(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	s, dl, logs := loneSink(t, ctx, withParam(t, pg.URL, "statement_timeout", "200"), time.Second)
	admin := pg.Conn(t)
	closer := closeOnDeadLetter(t, ctx, pg, admin, s, dl, 2)
	n1 := pgx.Identifier{s.table[len(s.table)-1] + "_n1"}.Sanitize()
	execAll(t, ctx, admin, "CREATE SEQUENCE "+n1)
	// Triggers fire in name order: "closed" before the rows' own. A
	// sequence is not rolled back, so n1 counts row 1's tries that reach
	// its trigger: refused on the first two, stored on the next.
	triggerOn(t, ctx, admin, s.table, "one", "NEW.stream_seq = 1",
		"IF nextval('"+n1+"') <= 2 THEN RAISE EXCEPTION 'one twice'; END IF")
	triggerOn(t, ctx, admin, s.table, "two", "NEW.stream_seq = 2", "PERFORM pg_sleep(1)")
	src, wait := runBoth(t, ctx, admin, s)
	first, ms := rows(1, 2, nil)
	src.push(t, ctx, first)
	waitFor(t, ctx, "row 2 to time out alone, probed", func() bool {
		return strings.Contains(logs.String(), `msg="batch failed; retrying until it commits" rows=1 `)
	})
	var tries int
	if err := admin.QueryRow(ctx, "SELECT last_value FROM "+n1).Scan(&tries); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); tries != 2 || st.BisectCopies != 2 {
		t.Fatalf("row 1 tried %d times, %d bisection COPYs, as row 2 first timed out alone; the test needs rows 1 and 2 in one batch, "+
			"row 1 refused in its COPY and alone, then row 2 probed (2 and 2)", tries, st.BisectCopies)
	}
	// Rows that the other committer takes, so that commits come between
	// row 2's timeouts.
	feedUntilDeadLettered(t, ctx, dl, feeder(t, ctx, src, 3, &ms), "row 2 dead-lettered", 2)
	if l := row1BehindRow2(t, ctx, admin, s, dl, logs, src, wait, closer, ms, "probe"); strings.Contains(l.Reason, "may already be stored") {
		t.Errorf("row 2's dead letter %q says it may already be stored: a first delivery, no commit of unknown outcome", l.Reason)
	}
}

// A batch handed to another committer (errHandOff) after a commit of
// unknown outcome keeps that mark (batch.mayBeStored, written back as
// process returns), so that its row, given up there for its lone timeouts,
// is dead-lettered as one that may already be stored. Committer X's COPY
// of row 1 is cut as it ends (outcome unknown), and the proxy then refuses
// new connections, so that X cannot reconnect while Y, whose connection
// stays, commits row 2: X hands row 1's batch to Y. There row 1 (a
// trigger sleeps past the 200 ms limit) times out alone while X, let
// connect again, commits rows between. Without the write-back, Y started
// from a clean slate and the reason did not say so (a first delivery in
// at-least-once mode: nothing else marks it).
func TestMayBeStoredSurvivesHandOff(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	var refuse atomic.Bool
	proxied := cutCopyOnce(t, pg, func() func([]byte) verdict {
		refused := refuse.Load()
		return func([]byte) verdict {
			if refused {
				return cut
			}
			return pass
		}
	}, func() { refuse.Store(true) })
	s, dl, logs := loneSink(t, ctx, proxied, time.Second)
	admin := pg.Conn(t)
	tries := pgx.Identifier{s.table[len(s.table)-1] + "_n"}.Sanitize()
	execAll(t, ctx, admin, "CREATE SEQUENCE "+tries)
	triggerOn(t, ctx, admin, s.table, "slow", "NEW.stream_seq = 1", "PERFORM nextval('"+tries+"'); PERFORM pg_sleep(1)")
	src, wait := runBoth(t, ctx, admin, s)
	first, ms := rows(1, 1, nil)
	src.push(t, ctx, first)
	waitFor(t, ctx, "row 1's COPY cut, its outcome unknown", func() bool {
		return strings.Contains(logs.String(), "commit_outcome_unknown=true")
	})
	second, ms2 := rows(2, 1, nil) // Y's: X cannot connect
	src.push(t, ctx, second)
	ms = append(ms, ms2...)
	waitFor(t, ctx, "row 2 acked", allAcked(ms2))
	// Row 1 reaches the server only on Y's connection: X's COPY was cut
	// before it did, and X connects no more.
	waitFor(t, ctx, "row 1 tried on the server, handed to Y", func() bool {
		var called bool
		err := admin.QueryRow(ctx, "SELECT is_called FROM "+tries).Scan(&called)
		return err == nil && called
	})
	refuse.Store(false)
	feedUntilDeadLettered(t, ctx, dl, feeder(t, ctx, src, 3, &ms), "row 1 dead-lettered", 1)
	stopOnceAcked(t, ctx, src, wait, ms[1:])
	row1MayBeStored(t, ctx, admin, s, dl, ms, "before the hand-off")
}

// A batch handed off after a commit of unknown outcome and taken into a
// held batch (holdWait) marks the held batch (committer.unknown): absorb
// clears the handed-off batch's mark, and the held one's row, given up
// for its lone timeouts, is dead-lettered as one that may already be
// stored. Committer X's COPY of row 1 is cut as it ends (outcome unknown),
// and X's next connect waits at the proxy (gate) while Y commits row 2 and
// holds row 3: a "closed" table refuses every row (a trigger's RAISE,
// suspect), and nothing commits after row 3's failure. Let go, X's connect
// is cut: X hands row 1's batch to Y, whose hold takes it in (Y's own
// connects pass: a suspect error closes its connection each time). Y
// holds rows 1 and 3 until the table opens; then row 1 (a trigger sleeps
// past the 200 ms limit) times out alone on Y while X commits rows
// between. Without the carry-over in holdWait, Y's own attempts, all of
// known outcome, left the mark unset and the reason did not say so (a
// first delivery in at-least-once mode: nothing else marks it);
// TestMayBeStoredSurvivesHandOff passed under that change (its batch goes
// to a committer waiting in next, not in a hold).
func TestMayBeStoredTakenIntoHeld(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	var gateNext atomic.Bool
	gated, gate := make(chan struct{}), make(chan struct{})
	proxied := cutCopyOnce(t, pg, func() func([]byte) verdict {
		first, held := true, false
		return func(b []byte) verdict {
			if first {
				// The first connect after the cut, X's (not the
				// CancelRequest that follows the cut COPY): held, then cut.
				first = false
				const cancelRequest = 80877102
				isCancel := len(b) >= 8 && binary.BigEndian.Uint32(b[4:8]) == cancelRequest
				if held = !isCancel && gateNext.CompareAndSwap(true, false); held {
					close(gated)
				}
			}
			if held {
				<-gate
				return cut
			}
			return pass
		}
	}, func() { gateNext.Store(true) })
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open) // before the proxy's cleanup, which waits for the relays
	s, dl, logs := loneSink(t, ctx, proxied, time.Second)
	admin := pg.Conn(t)
	name := s.table[len(s.table)-1]
	closed := pgx.Identifier{name + "_closed"}.Sanitize()
	refusals, refused1 := pgx.Identifier{name + "_refusals"}.Sanitize(), pgx.Identifier{name + "_refused1"}.Sanitize()
	tries := pgx.Identifier{name + "_n"}.Sanitize()
	execAll(t, ctx, admin, "CREATE TABLE "+closed+" (x int)",
		"CREATE SEQUENCE "+refusals, "CREATE SEQUENCE "+refused1, "CREATE SEQUENCE "+tries)
	// Triggers fire in name order: "closed" before "slow". A sequence is
	// not rolled back: each counts its tries.
	triggerOn(t, ctx, admin, s.table, "closed", "EXISTS (SELECT FROM "+closed+")",
		"PERFORM nextval('"+refusals+"'); IF NEW.stream_seq = 1 THEN PERFORM nextval('"+refused1+"'); END IF; RAISE EXCEPTION 'table closed'")
	triggerOn(t, ctx, admin, s.table, "slow", "NEW.stream_seq = 1", "PERFORM nextval('"+tries+"'); PERFORM pg_sleep(1)")
	last := func(seq string) int64 {
		var n int64
		var called bool
		if err := admin.QueryRow(ctx, "SELECT last_value, is_called FROM "+seq).Scan(&n, &called); err != nil {
			t.Fatalf("read %s: %v", seq, err)
		}
		if !called {
			return 0
		}
		return n
	}
	src, wait := runBoth(t, ctx, admin, s)
	ms := make([]*recMsg, 0, 64)
	push := func(seq int) {
		r, m := rows(seq, 1, nil)
		src.push(t, ctx, r)
		ms = append(ms, m...)
	}
	push(1)
	waitFor(t, ctx, "row 1's COPY cut, its outcome unknown", func() bool {
		return strings.Contains(logs.String(), "commit_outcome_unknown=true")
	})
	select {
	case <-gated: // X's connect waits: Y's connects, all after it, pass
	case <-ctx.Done():
		t.Fatal("timed out waiting for X to connect again")
	}
	push(2) // Y's
	waitFor(t, ctx, "row 2 acked", allAcked(ms[1:2]))
	execAll(t, ctx, admin, "INSERT INTO "+closed+" VALUES (1)")
	push(3)
	// Y has taken row 3's batch (its token is out of ready): X's
	// hand-off can only go to Y's hold.
	waitFor(t, ctx, "row 3 refused on Y", func() bool { return last(refusals) > 0 })
	open()
	waitFor(t, ctx, "row 1's batch taken into Y's held one", func() bool { return s.Stats().TakenIntoHeld >= 1 })
	// Bisected again, row 1 is probed alone, then held with row 3: both
	// refused, for as long as the table is closed.
	waitFor(t, ctx, "row 1 held on Y", func() bool { return last(refused1) >= 2 })
	if n := last(tries); n != 0 {
		t.Fatalf("row 1 ran its slow trigger %d times before the table opened: the test needs it held on Y", n)
	}
	execAll(t, ctx, admin, "TRUNCATE "+closed)
	// Rows 1 and 3 time out together (a timeout split, the piece cap at
	// one row): Y is out of its hold, so the rows fed from now on go to X.
	waitFor(t, ctx, "rows 1 and 3 timed out together on Y", func() bool { return s.Stats().TimeoutSplits >= 1 })
	feedUntilDeadLettered(t, ctx, dl, feeder(t, ctx, src, 4, &ms), "row 1 dead-lettered", 1)
	stopOnceAcked(t, ctx, src, wait, ms[1:])
	row1MayBeStored(t, ctx, admin, s, dl, ms, "before Y's hold took it in")
}

// The in-a-row count of an exactly-once batch's lookup timeouts starts anew
// once a lookup answers: it was shared by every piece of the batch and
// never cleared, so a timeout in one piece, answered afterwards, and one
// in a later piece counted as two in a row, and the second halved the
// pieces again. Here the whole batch's lookup times out twice (a failed
// attempt: the batch is halved), the first piece's answers (with no row
// missing, or with one: "answered, rows missing"), and the second piece's
// times out once: a quiet pass, no second split.
func TestExactlyOnceLookupTimeoutsInARowPerPiece(t *testing.T) {
	t.Run("answered", testLookupTimeoutsAnswered)
	t.Run("answered, rows missing", testLookupTimeoutsMissingAnswered)
	t.Run("copy failed between", testLookupTimeoutsCopyFailed)
}

// lookupsTimingOut is a lookup rig whose lookups 1 and 2 (the whole
// batch's: a failed attempt, which halves it) and 4 (the second piece's
// first) time out, and which counts them in lookups; the others pass.
func lookupsTimingOut(t *testing.T, ctx context.Context) (r *lookupRig, lookups *atomic.Int32) {
	t.Helper()
	lookups = new(atomic.Int32)
	r = newLookupRig(t, ctx, func(client net.Conn) verdict {
		switch lookups.Add(1) {
		case 1, 2, 4:
			return answerLookup(client, "57014", "canceling statement due to statement timeout")
		}
		return pass
	})
	return r, lookups
}

// A lookup that answers with rows missing from the table (a *missingError:
// committed, the missing rows dead-lettered) answers as well as one that
// finds none missing: the next lookup timeout of the batch is the first in
// a row again. As in "answered", but a trigger leaves row 3 out of the
// table (RETURN NULL), so that the first piece's lookup finds it missing;
// the second piece's lookup then times out once: a quiet pass, no second
// split. The count was cleared only after an attempt with no error.
func testLookupTimeoutsMissingAnswered(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	r, lookups := lookupsTimingOut(t, ctx)
	pg, s, dl, src, wait := r.pg, r.s, r.dl, r.src, r.wait
	admin := pg.Conn(t)
	trigger(t, ctx, admin, s.table, "drop3", "BEFORE INSERT", "ROW", "IF NEW.stream_seq = 3 THEN RETURN NULL; END IF; RETURN NEW;")
	again, ms := rows(1, 16, nil) // row 1 conflicts, row 3 is left out: 14 of 16 inserted, then the lookup
	src.push(t, ctx, again)
	stored := append(ms[:2:2], ms[3:]...)
	waitFor(t, ctx, "rows acked", allAcked(stored))
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := lookups.Load(); n < 5 {
		t.Fatalf("%d lookups, want 5 or more: two of the whole batch, one per piece and the second piece's again", n)
	}
	if n := s.Stats().TimeoutSplits; n != 1 {
		t.Errorf("%d timeout splits, want 1: the second piece's lookup timed out once after the first piece's answered (row 3 missing)", n)
	}
	letters, seqs := dl.letters()
	if len(letters) != 1 || seqs[0] != 3 || letters[0].Code != pipeline.CodeRowCount {
		t.Fatalf("dead letters %+v for rows %v, want row 3's only, code %s", letters, seqs, pipeline.CodeRowCount)
	}
	if m := ms[2]; m.acks.Load() != 0 || m.terms.Load() != 1 {
		t.Errorf("row 3's message acked %d times, termed %d, want termed once", m.acks.Load(), m.terms.Load())
	}
	for i, m := range stored {
		if n := m.acks.Load(); n != 1 {
			t.Errorf("stored message %d acked %d times, want once", i, n)
		}
	}
	if n := count(t, ctx, admin, s.cfg.Table); n != len(stored) {
		t.Errorf("%d rows, want %d: all but row 3", n, len(stored))
	}
}

// A COPY that fails (its connection cut) between two lookup timeouts of
// the batch answers no lookup: the second timeout is the second in a row,
// a failed attempt that halves the batch, as when a lost connection ends a
// lookup between them (lookupPasses.passing). The count was cleared by
// any attempt that ended without a lookupError.
func testLookupTimeoutsCopyFailed(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	var lookups atomic.Int32
	var cutCopy atomic.Bool
	r := newLookupRigCut(t, ctx, func(client net.Conn) verdict {
		switch lookups.Add(1) {
		case 1:
			cutCopy.Store(true) // the batch sent again
			return answerLookup(client, "57014", "canceling statement due to statement timeout")
		case 2:
			return answerLookup(client, "57014", "canceling statement due to statement timeout")
		}
		return pass
	}, &cutCopy)
	pg, s, dl, src, wait := r.pg, r.s, r.dl, r.src, r.wait
	again, ms := rows(1, 16, nil) // row 1 conflicts: 15 of 16 inserted, then the lookup
	src.push(t, ctx, again)
	finishClean(t, ctx, src, wait, dl, ms)
	if cutCopy.Load() {
		t.Fatal("no COPY cut after the first lookup")
	}
	if n := s.Stats().TimeoutSplits; n != 1 {
		t.Errorf("%d timeout splits, want 1: the second lookup timeout, after a failed COPY, is the second in a row", n)
	}
	storedOnceEach(t, ctx, pg, s, ms)
}

func testLookupTimeoutsAnswered(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	r, lookups := lookupsTimingOut(t, ctx)
	pg, s, dl, src, wait := r.pg, r.s, r.dl, r.src, r.wait
	again, ms := rows(1, 16, nil) // row 1 conflicts: 15 of 16 inserted, then the lookup
	src.push(t, ctx, again)
	finishClean(t, ctx, src, wait, dl, ms)
	if n := lookups.Load(); n < 5 {
		t.Fatalf("%d lookups, want 5 or more: two of the whole batch, one per piece and the second piece's again", n)
	}
	if n := s.Stats().TimeoutSplits; n != 1 {
		t.Errorf("%d timeout splits, want 1: the second piece's lookup timed out once after the first piece's answered", n)
	}
	storedOnceEach(t, ctx, pg, s, ms)
}

// In exactly-once mode a refused row is looked up in the table by its key
// (an event stored before, that a CHECK added NOT VALID now refuses). When
// that lookup lost its connection, the row was dead-lettered "may already
// be stored" (replayed, stored twice), logged at Debug; when the hard stop
// ended it, too. Now a lookup that lost its connection is tried on a new
// one: row 2, stored before, is acked ("cut"); one that the stop ends
// leaves the row unsettled, for JetStream to deliver again ("stopped").
func TestExactlyOnceRefusedRowLookupFails(t *testing.T) {
	for _, how := range []string{"cut", "stopped"} {
		t.Run(how, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			pg := testenv.Postgres(t)
			l := listen(t)
			proxied, to := l.proxy(t, pg.URL)
			proxied = withParam(t, proxied, "sslmode", "disable") // the hooks read the messages
			var armed atomic.Bool
			var hits atomic.Int32
			l.relayTo(to, func(net.Conn) (up, down func([]byte) verdict) {
				var f frontendStream
				var refused atomic.Bool // the last statement failed with 23514, no COMMIT since
				up = func(b []byte) verdict {
					// The first extended-protocol query after the refusal
					// is the lookup (the COPY's transaction is a simple
					// query).
					if ts := f.types(b); armed.Load() && refused.Load() && bytes.IndexByte(ts, 'B') >= 0 && hits.Add(1) == 1 {
						if how == "cut" {
							return cut
						}
						stop()
						return drop
					}
					return pass
				}
				down = func(b []byte) verdict {
					if bytes.Contains(b, []byte("C23514\x00")) {
						refused.Store(true)
					}
					if bytes.Contains(b, []byte("COMMIT\x00")) {
						refused.Store(false)
					}
					return pass
				}
				return up, down
			})
			s, dl := newTestSink(t, ctx, proxied, func(c *Config) { c.Connections, c.Mode = 1, ExactlyOnce })
			logs := captureLog(t, s, time.Minute)
			src := newSource()
			t.Cleanup(src.close)
			wait := runSink(t, runCtx, s, src)
			first, m1 := rows(1, 3, nil)
			src.push(t, ctx, first)
			waitFor(t, ctx, "rows 1-3 acked", allAcked(m1))
			execAll(t, ctx, pg.Conn(t), "ALTER TABLE "+s.table.Sanitize()+" ADD CONSTRAINT no2 CHECK (stream_seq <> 2) NOT VALID")
			armed.Store(true)
			again, ms := rows(1, 3, nil)
			src.push(t, ctx, again)
			if how == "cut" {
				finishClean(t, ctx, src, wait, dl, ms)
			} else {
				_ = wait() // the stop's error
				if l, seqs := dl.letters(); len(l) != 0 {
					t.Errorf("rows %v dead-lettered at the stop: %+v", seqs, l)
				}
			}
			if hits.Load() == 0 {
				t.Fatalf("no lookup of a refused row was seen:\n%s", logs)
			}
			want := int32(1)
			if how == "stopped" {
				want = 0
			}
			if got := [2]int32{ms[1].acks.Load(), ms[1].terms.Load()}; got != [2]int32{want, 0} {
				t.Errorf("row 2: acks, terms %v; want [%d 0]", got, want)
			}
			if how == "cut" {
				for i, m := range ms {
					if m.acks.Load() != 1 || m.terms.Load() != 0 {
						t.Errorf("row %d: acks %d, terms %d; want acked once", i+1, m.acks.Load(), m.terms.Load())
					}
				}
			}
		})
	}
}

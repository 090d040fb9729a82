package sink

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsink/jetsink/embedded"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

// gated returns dbURL reached through a GateProxy, which the test cuts
// (PostgreSQL unreachable: connections closed, new ones turned away) and
// reopens.
func gated(t *testing.T, dbURL string) (*testenv.GateProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	gate := testenv.NewGateProxy(t, u.Host)
	u.Host = strings.TrimPrefix(gate.URL(), "nats://")
	return gate, u.String()
}

// releaseConfig is the tests' sink: it gives its events back after 2s
// without reaching the server.
func releaseConfig(mode Mode) func(*Config) {
	return func(c *Config) {
		c.Mode = mode
		c.ReleaseAfter = 2 * time.Second
		c.InProgressEvery = 600 * time.Millisecond
		c.HoldRows = 5000
		c.Batch.MaxRows = 100
	}
}

// delivered sets the delivery count of rs.
func delivered(rs []pipeline.Row, n uint32) []pipeline.Row {
	for i := range rs {
		rs[i].Event.Delivered = n
	}
	return rs
}

// allNaked reports whether every message of ms was nak'ed.
func allNaked(ms []*recMsg) func() bool {
	return func() bool {
		for _, m := range ms {
			if m.naks.Load() == 0 {
				return false
			}
		}
		return true
	}
}

// settledOnce fails unless every message of ms was nak'ed once (naks) or
// acked once, and nothing else.
func settledOnce(t *testing.T, what string, ms []*recMsg, naks bool) {
	t.Helper()
	for i, m := range ms {
		wantNaks, wantAcks := int32(0), int32(1)
		if naks {
			wantNaks, wantAcks = 1, 0
		}
		if m.naks.Load() != wantNaks || m.acks.Load() != wantAcks || m.terms.Load() != 0 {
			t.Fatalf("%s: message %d: %d naks, %d acks, %d terms; want %d naks, %d acks", what, i,
				m.naks.Load(), m.acks.Load(), m.terms.Load(), wantNaks, wantAcks)
		}
	}
}

// awaySwitch waits until Away reports away.
func awaySwitch(t *testing.T, ctx context.Context, s *Sink, away bool) {
	t.Helper()
	for {
		got, changed := s.Away()
		if got == away {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("Away() is still %v", got)
		}
	}
}

// PostgreSQL becomes unreachable: once ReleaseAfter has passed with no
// answer, the sink gives back (naks) every event it holds, the committers'
// batches and the batcher's alike, naks each event that comes meanwhile
// once, and reports itself away and not ready; once the server is
// reachable again, it takes events again, and the redeliveries are stored
// once each.
func TestReleasedWhilePostgresUnreachable(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 90*time.Second)
			pg := testenv.Postgres(t)
			gate, dbURL := gated(t, pg.URL)
			s, dl := newTestSink(t, ctx, dbURL, releaseConfig(mode))
			logs := captureLog(t, s, time.Minute)
			// Failing for less than ReleaseAfter before it goes away: so
			// that Ready once back shows the failures are forgotten.
			oldRefusedFor := refusedFor
			t.Cleanup(func() { refusedFor = oldRefusedFor })
			refusedFor = 500 * time.Millisecond
			// Cut before Run: no committer has a connection that dies
			// under a batch (a commit of unknown outcome, which
			// TestReleaseKeepsUnknownOutcome covers).
			gate.Cut()
			src := newSource()
			wait := runSink(t, ctx, s, src)
			if away, _ := s.Away(); away {
				t.Fatal("away before any failure")
			}
			held, mHeld := rows(51, 500, nil)
			src.push(t, ctx, held)
			awaySwitch(t, ctx, s, true)
			waitFor(t, ctx, "the held rows given back", allNaked(mHeld))
			if err := s.Ready(ctx); err == nil || !strings.Contains(err.Error(), "unreachable") {
				t.Fatalf("Ready while away: %v", err)
			}
			retries := s.Stats().Retries

			// Rows that come while away are given back by the batcher,
			// once each, none tried.
			more, mMore := rows(551, 100, nil)
			src.push(t, ctx, more)
			waitFor(t, ctx, "the rows come meanwhile given back", allNaked(mMore))
			settledOnce(t, "held", mHeld, true)
			settledOnce(t, "come meanwhile", mMore, true)
			st := s.Stats()
			if st.Released != 600 || st.ReleaseErrors != 0 {
				t.Fatalf("released %d (%d failed), want 600", st.Released, st.ReleaseErrors)
			}
			if st.Retries != retries {
				t.Fatalf("%d attempts while away for rows that came meanwhile, want none", st.Retries-retries)
			}
			if st.InProgressErrors != 0 {
				t.Fatalf("%d InProgress after a message was given back", st.InProgressErrors)
			}
			for i, m := range append(mHeld, mMore...) {
				if m.releases.Load() == 0 {
					t.Fatalf("message %d given back without its hold on the budget released", i)
				}
			}

			gate.Reopen()
			awaySwitch(t, ctx, s, false)
			if err := s.Ready(ctx); err != nil {
				t.Fatalf("Ready once back: %v", err)
			}
			again, mAgain := rows(51, 500, nil)
			src.push(t, ctx, delivered(again, 2))
			finishClean(t, ctx, src, wait, dl, mAgain)
			settledOnce(t, "redelivered", mAgain, false)
			if n := count(t, ctx, pg.Conn(t), s.cfg.Table); n != 500 {
				t.Fatalf("%d rows, want 500", n)
			}
			for _, line := range []string{"postgres has been unreachable too long", "postgres answers again"} {
				if !strings.Contains(logs.String(), line) {
					t.Errorf("no log line %q", line)
				}
			}
		})
	}
}

// The connection is cut after the server committed a batch and before its
// answer came, and PostgreSQL stays unreachable: in at-least-once mode the
// batch, which may be stored, is not given back (it would be stored
// again) but held, and committed once the server is back; in exactly-once
// mode it is given back, and its redelivery, stored already, is acked.
func TestReleaseKeepsUnknownOutcome(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 90*time.Second)
			pg := testenv.Postgres(t)
			gate, gateURL := gated(t, pg.URL)
			cutter, dbURL := newCommitCutter(t, gateURL, mode)
			cutter.onCut = gate.Cut
			s, dl := newTestSink(t, ctx, dbURL, releaseConfig(mode))
			src := newSource()
			wait := runSink(t, ctx, s, src)

			cutter.armed.Store(true)
			batch, mBatch := rows(1, 10, nil)
			src.push(t, ctx, batch)
			awaySwitch(t, ctx, s, true)
			// Rows that come meanwhile are given back: the sink is away.
			more, mMore := rows(11, 20, nil)
			src.push(t, ctx, more)
			waitFor(t, ctx, "the rows come meanwhile given back", allNaked(mMore))
			if mode == AtLeastOnce {
				// Two more attempts: the committer has looked at its
				// batch at least once while away.
				r := s.Stats().Retries
				waitFor(t, ctx, "two more attempts", func() bool { return s.Stats().Retries >= r+2 })
				for i, m := range mBatch {
					if m.naks.Load() != 0 || m.acks.Load() != 0 {
						t.Fatalf("message %d of the batch of unknown outcome: %d naks, %d acks while away", i, m.naks.Load(), m.acks.Load())
					}
				}
				if st := s.Stats(); st.Released != 20 {
					t.Fatalf("released %d, want the 20 come meanwhile", st.Released)
				}
				gate.Reopen()
				finishClean(t, ctx, src, wait, dl, mBatch)
				settledOnce(t, "unknown outcome", mBatch, false)
				if st := s.Stats(); st.PossibleDuplicates < 10 {
					t.Fatalf("%d possible duplicates, want 10 at least", st.PossibleDuplicates)
				}
				if n := count(t, ctx, pg.Conn(t), s.cfg.Table); n != 20 {
					t.Fatalf("%d rows, want 20 (the batch stored twice)", n)
				}
				return
			}
			waitFor(t, ctx, "the batch of unknown outcome given back", allNaked(mBatch))
			settledOnce(t, "unknown outcome", mBatch, true)
			gate.Reopen()
			awaySwitch(t, ctx, s, false)
			again, mAgain := rows(1, 10, nil)
			src.push(t, ctx, delivered(again, 2))
			finishClean(t, ctx, src, wait, dl, mAgain)
			if n := count(t, ctx, pg.Conn(t), s.cfg.Table); n != 10 {
				t.Fatalf("%d rows, want 10", n)
			}
		})
	}
}

// An event on its last delivery (nats.max_deliver) is never given back:
// its next delivery would be past max_deliver and dead-lettered for an
// outage. A batch a committer holds with one such row is kept whole;
// the batcher keeps only such rows; one given back at its second delivery
// is kept at its third (the outage goes on). Neither is an event taken
// before its stream was re-created (another epoch): nothing would deliver
// it again.
func TestReleaseKeepsLastDelivery(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	pg := testenv.Postgres(t)
	gate, dbURL := gated(t, pg.URL)
	// Exactly-once: the committer's batch, tried on the connection the cut
	// killed, has a commit of unknown outcome, which at-least-once keeps
	// whatever its rows.
	s, dl := newTestSink(t, ctx, dbURL, func(c *Config) {
		releaseConfig(ExactlyOnce)(c)
		c.Connections = 1
		c.MaxDeliver = 3
	})
	epochs := &pipeline.Epochs{}
	epochs.Advance()
	s.SetEpochs(epochs)
	current := func(rs []pipeline.Row) []pipeline.Row {
		for i := range rs {
			rs[i].Event.Epoch = epochs.Current()
		}
		return rs
	}
	src := newSource()
	wait := runSink(t, ctx, s, src)
	first, mFirst := rows(1, 1, nil)
	src.push(t, ctx, current(first))
	waitFor(t, ctx, "the first row acked", allAcked(mFirst))

	gate.Cut()
	// The committer's batch: five rows, one on its last delivery.
	mixed, mMixed := rows(2, 5, nil)
	mixed = current(delivered(mixed, 2))
	mixed[2].Event.Delivered = 3
	src.push(t, ctx, mixed)
	awaySwitch(t, ctx, s, true)

	// The batcher's: rows on their second delivery, on their last, and
	// of another epoch.
	second, mSecond := rows(10, 10, nil)
	last, mLast := rows(20, 10, nil)
	stale, mStale := rows(30, 10, nil) // epoch 0
	src.push(t, ctx, current(delivered(second, 2)))
	src.push(t, ctx, current(delivered(last, 3)))
	src.push(t, ctx, stale)
	waitFor(t, ctx, "the rows on their second delivery given back", allNaked(mSecond))
	// Their third delivery, the outage going on.
	third, mThird := rows(10, 10, nil)
	src.push(t, ctx, current(delivered(third, 3)))
	r := s.Stats().Retries
	renewed := append(append(append([]*recMsg(nil), mMixed...), mLast...), mThird...)
	kept := append(renewed, mStale...)
	waitFor(t, ctx, "the kept rows renewed, and two more attempts", func() bool {
		for _, m := range renewed {
			if m.inProgress.Load() == 0 {
				return false
			}
		}
		return s.Stats().Retries >= r+2
	})
	for i, m := range kept {
		if m.naks.Load() != 0 {
			t.Fatalf("kept message %d nak'ed", i)
		}
	}
	settledOnce(t, "second delivery", mSecond, true)
	if st := s.Stats(); st.Released != 10 {
		t.Fatalf("released %d, want 10", st.Released)
	}

	gate.Reopen()
	waitFor(t, ctx, "the kept rows acked", allAcked(renewed))
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got, _ := dl.letters(); len(got) != 0 {
		t.Fatalf("dead letters: %v", got)
	}
	for i, m := range mStale {
		if m.acks.Load() != 0 || m.naks.Load() != 0 {
			t.Fatalf("stale message %d: %d acks, %d naks", i, m.acks.Load(), m.naks.Load())
		}
	}
	if st := s.Stats(); st.StaleAcks != 10 {
		t.Fatalf("%d stale acks, want 10", st.StaleAcks)
	}
	if n := count(t, ctx, pg.Conn(t), s.cfg.Table); n != 1+5+10+10+10 {
		t.Fatalf("%d rows, want 36", n)
	}
}

// A batch waiting for a lock is no outage: the server is there. The sink
// neither goes away nor gives anything back, however long the wait.
func TestReleaseNotOnALockWait(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	s, admin, tx, src, wait, mFirst := lockedSinkWith(t, ctx, 200*time.Millisecond, func(s *Sink) {
		s.cfg.ReleaseAfter = time.Second
	})
	away, changed := s.Away()
	if away {
		t.Fatal("away at the start")
	}
	more, mMore := rows(2, 150, nil)
	src.push(t, ctx, more)
	waitFor(t, ctx, "a lock wait of 5 s", func() bool { return s.OldestAttempt() >= 5*time.Second })
	select {
	case <-changed:
		t.Fatal("the sink went away during a lock wait")
	default:
	}
	all := append(mFirst, mMore...)
	for i, m := range all {
		if m.naks.Load() != 0 {
			t.Fatalf("message %d nak'ed during a lock wait", i)
		}
	}
	unlockAndFinish(t, ctx, tx, src, wait, all, admin, s, 151)
	if st := s.Stats(); st.Released != 0 {
		t.Fatalf("released %d", st.Released)
	}
}

// A server that answers with an error (a lock timeout here) is reachable:
// the run of reach failures before it (connects turned away) ends, and
// the sink does not go away however long the answers are errors.
func TestReleaseAnsweredByAnError(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	gate, dbURL := gated(t, pg.URL)
	s, dl := newTestSink(t, ctx, withParam(t, dbURL, "lock_timeout", "100"), func(c *Config) {
		c.Connections = 1
		c.ReleaseAfter = time.Hour
	})
	tx := lockTable(t, ctx, pg, s)
	gate.Cut()
	src := newSource()
	wait := runSink(t, ctx, s, src)
	rs, ms := rows(1, 1, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "a connect turned away", func() bool { d, _ := s.unreachableFor(time.Now()); return d > 0 })
	gate.Reopen()
	waitFor(t, ctx, "a lock timeout", func() bool {
		r := s.refusedErr.Load()
		return r != nil && strings.Contains(r.msg, "55P03")
	})
	if d, msg := s.unreachableFor(time.Now()); d != 0 {
		t.Fatalf("unreachable for %v after an answer (%s)", d, msg)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	finishClean(t, ctx, src, wait, dl, ms)
}

// One connect turned away (PostgreSQL restarting, a pooler dropping its
// server connection), then a reconnect whose batch waits for a lock for
// longer than ReleaseAfter: the server is there, though no attempt has
// ended since the failed connect. The watcher probes it before going away,
// the probe answers, and the sink neither goes away nor gives anything
// back; the batch commits once the lock is gone.
func TestReleaseNotOnALockWaitAfterAFailedConnect(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	pg := testenv.Postgres(t)
	gate, dbURL := gated(t, pg.URL)
	s, dl := newTestSink(t, ctx, dbURL, func(c *Config) {
		c.Connections = 1
		c.ReleaseAfter = 2 * time.Second
	})
	admin := pg.Conn(t)
	tx := lockTable(t, ctx, pg, s)
	gate.Cut()
	src := newSource()
	wait := runSink(t, ctx, s, src)
	t.Cleanup(src.close)
	away, changed := s.Away()
	if away {
		t.Fatal("away at the start")
	}
	rs, ms := rows(1, 1, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "a connect turned away", func() bool { d, _ := s.unreachableFor(time.Now()); return d > 0 })
	gate.Reopen()
	waitFor(t, ctx, "the committer to wait for the lock", waitingOnLock(t, ctx, admin, s.cfg.AppName))
	// Once the failed connect is ReleaseAfter old, the watcher either
	// ends the run of failures (its probe answered) or goes away.
	waitFor(t, ctx, "the watcher to act on the failed connect", func() bool {
		away, _ := s.Away()
		d, _ := s.unreachableFor(time.Now())
		return away || d == 0
	})
	waitFor(t, ctx, "a lock wait of twice ReleaseAfter", func() bool { return s.OldestAttempt() >= 2*s.cfg.ReleaseAfter })
	select {
	case <-changed:
		t.Fatal("the sink went away while its batch waited for a lock after a failed connect")
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	finishClean(t, ctx, src, wait, dl, ms)
	if ms[0].naks.Load() != 0 {
		t.Fatal("the row was nak'ed")
	}
	if st := s.Stats(); st.Released != 0 {
		t.Fatalf("released %d", st.Released)
	}
	if n := count(t, ctx, admin, s.cfg.Table); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// reachSink is a sink for the unit tests of the reach stamps: it gives
// its events back after a second.
func reachSink() *Sink {
	return &Sink{cfg: Config{ReleaseAfter: time.Second}, born: time.Now().Add(-time.Hour), log: slog.New(slog.DiscardHandler)}
}

// Leaving AWAY forgets the batch failures of the outage (a sink that gave
// everything back has nothing to commit that would clear them), but not a
// run that began before it with the table refusing the batches (42501: a
// grant taken away), which readiness goes on reporting.
func TestLeavingAwayForgetsOnlyTheOutagesFailures(t *testing.T) {
	refused := &connectError{where: "127.0.0.1:1", err: syscall.ECONNREFUSED}
	for _, before := range []bool{false, true} {
		s := reachSink()
		start := time.Now().Add(-time.Minute)
		if before {
			s.refused(&pgconn.PgError{Code: "42501", Message: "permission denied for table events"}, classConfig, start.Add(-time.Minute))
		}
		s.noteReach(refused, start)
		s.refused(refused, classTransient, start)
		now := time.Now()
		d, msg := s.unreachableFor(now)
		if !s.goAway(now, d, msg) {
			t.Fatal("not away after a minute of failures")
		}
		s.reached(s.stamp(time.Now())) // the probe answers
		if away, _ := s.Away(); away {
			t.Fatal("away after an answer")
		}
		if d, _ := s.failing(); (d != 0) != before {
			t.Errorf("refused before the outage %v: failing for %v after it", before, d)
		}
	}
}

// A lookup after an exactly-once COMMIT that a lost connection ended (a
// pooler or the dead-connection watchdog cutting it) is no reach failure:
// the server answered the COMMIT just before. It ends a run of failures
// as any answer does. (Only a unit test: through a proxy cutting every
// lookup, the watcher's probe would answer and hide the difference.)
func TestLookupCutIsReached(t *testing.T) {
	for _, cut := range []error{
		&pgconn.PgError{Code: "08006", Message: "server conn crashed?"},
		&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
	} {
		if !cannotReach(cut) {
			t.Fatalf("%v: not a reach failure on its own", cut)
		}
		lookup := &lookupError{inserted: 0, err: fmt.Errorf("look for rows missing from the table after the commit: %w", cut)}
		if cannotReach(lookup) {
			t.Fatalf("%v: a reach failure", lookup)
		}
		s := reachSink()
		now := time.Now()
		s.noteReach(&connectError{where: "127.0.0.1:1", err: syscall.ECONNREFUSED}, now.Add(-time.Minute))
		if d, _ := s.unreachableFor(now); d < time.Minute {
			t.Fatalf("unreachable for %v after a refused connect", d)
		}
		s.noteReach(lookup, now.Add(-time.Second))
		if d, msg := s.unreachableFor(now); d != 0 {
			t.Fatalf("unreachable for %v after a COMMIT answered (%s)", d, msg)
		}
	}
}

// An answer that lands between the watcher's look at the stamps and its
// switch (a commit whose reached saw the sink not away yet) undoes the
// switch: the sink does not stay away with the server answering.
func TestGoAwayUndoneByAnAnswerMeanwhile(t *testing.T) {
	s := reachSink()
	refused := &connectError{where: "127.0.0.1:1", err: syscall.ECONNREFUSED}
	s.noteReach(refused, time.Now().Add(-time.Minute))
	now := time.Now()
	d, msg := s.unreachableFor(now) // the watcher's look
	s.reached(s.stamp(time.Now()))  // a commit
	if s.goAway(now, d, msg) {
		t.Fatal("went away after an answer")
	}
	if away, _ := s.Away(); away {
		t.Fatal("away after an answer")
	}
	// With no answer, it goes away.
	s.noteReach(refused, time.Now())
	later := time.Now().Add(time.Minute)
	d, msg = s.unreachableFor(later)
	if !s.goAway(later, d, msg) {
		t.Fatal("not away after a minute of failures")
	}
	if away, _ := s.Away(); !away {
		t.Fatal("not away")
	}
}

// logValue is the value of key in line, a slog text line, unquoted if it
// was quoted ("" if the line has no such key).
func logValue(t *testing.T, line, key string) string {
	t.Helper()
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		q, err := strconv.QuotedPrefix(v)
		if err != nil {
			t.Fatalf("%s in %q: %v", key, line, err)
		}
		u, _ := strconv.Unquote(q)
		return u
	}
	if j := strings.IndexAny(v, " \n"); j >= 0 {
		v = v[:j]
	}
	return v
}

// answersAgainLine is the last line of logs that says PostgreSQL answers
// again, the end of an outage.
func answersAgainLine(t *testing.T, logs string) string {
	t.Helper()
	var line string
	for l := range strings.Lines(logs) {
		if strings.Contains(l, "postgres answers again") {
			line = l
		}
	}
	if line == "" {
		t.Fatal("no line saying postgres answers again")
	}
	return line
}

// logDuration is the duration logged under key in line.
func logDuration(t *testing.T, line, key string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(logValue(t, line, key))
	if err != nil {
		t.Fatalf("%s in %q: %v", key, line, err)
	}
	return d
}

// PostgreSQL stops, the sink goes away once ReleaseAfter has passed, and
// the server starts again: the line that says it answers again gives the
// whole outage, from the first attempt that failed (unreachable_for), not
// only the time the pulls were paused (paused_for), which begins
// ReleaseAfter later at least. It said away_for=17s for an outage of 46 s.
func TestRecoveryLineGivesTheWholeOutage(t *testing.T) {
	ctx, cluster, s, dl, logs, src, wait := releasingSink(t)

	stopped := time.Now()
	if err := cluster.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	held, mHeld := rows(11, 50, nil)
	src.push(t, ctx, held)
	awaySwitch(t, ctx, s, true)
	waitFor(t, ctx, "the held rows given back", allNaked(mHeld))
	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	awaySwitch(t, ctx, s, false)
	back := time.Now()
	again, mAgain := rows(11, 50, nil)
	src.push(t, ctx, delivered(again, 2))
	finishClean(t, ctx, src, wait, dl, mAgain)

	line := answersAgainLine(t, logs.String())
	unreachable, paused := logDuration(t, line, "unreachable_for"), logDuration(t, line, "paused_for")
	// The pause began once the run of failures was ReleaseAfter old (each
	// rounded to the millisecond).
	if unreachable+time.Millisecond < paused+s.cfg.ReleaseAfter {
		t.Errorf("unreachable_for %v, paused_for %v: the outage began ReleaseAfter (%v) before the pause at least; line %q",
			unreachable, paused, s.cfg.ReleaseAfter, line)
	}
	if unreachable > back.Sub(stopped) {
		t.Errorf("unreachable_for %v, longer than the %v from the stop to the answer; line %q", unreachable, back.Sub(stopped), line)
	}
	if n, err := strconv.Atoi(logValue(t, line, "failed_attempts")); err != nil || n < 1 {
		t.Errorf("failed_attempts %q, want a count of 1 or more; line %q", logValue(t, line, "failed_attempts"), line)
	}
	if got := logValue(t, line, "released"); got != "50" {
		t.Errorf("released=%s, want 50; line %q", got, line)
	}
}

// A long outage counts every probe that failed in the line that ends it:
// once the sink is away the committers have given their batches back and
// stop trying, and failed_attempts kept the count it had when the sink
// went away (21 at away, still 21 after 8 s more of failing probes).
func TestRecoveryLineCountsTheFailedProbes(t *testing.T) {
	old := reachTick
	reachTick = 100 * time.Millisecond // probes on time, not a tick late
	t.Cleanup(func() { reachTick = old })
	ctx, cluster, s, dl, logs, src, wait := releasingSink(t)

	if err := cluster.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	held, mHeld := rows(11, 20, nil)
	src.push(t, ctx, held)
	awaySwitch(t, ctx, s, true)
	atAway := s.reachFails.Load() - s.reachFailsAt.Load()
	waitFor(t, ctx, "the held rows given back", allNaked(mHeld))
	// The outage itself, not a wait for an event: a few probe intervals.
	probeEvery := max(s.cfg.Retry.Max, time.Second)
	time.Sleep(4 * probeEvery)
	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	awaySwitch(t, ctx, s, false)
	again, mAgain := rows(11, 20, nil)
	src.push(t, ctx, delivered(again, 2))
	finishClean(t, ctx, src, wait, dl, mAgain)

	line := answersAgainLine(t, logs.String())
	n, err := strconv.ParseUint(logValue(t, line, "failed_attempts"), 10, 64)
	if err != nil {
		t.Fatalf("failed_attempts: %v; line %q", err, line)
	}
	// A probe every probeEvery while paused, less the one that answered
	// and one for the ticks' phase.
	paused := logDuration(t, line, "paused_for")
	if want := atAway + uint64(max(int(paused/probeEvery)-2, 1)); n < want {
		t.Errorf("failed_attempts=%d, %d when the sink went away: want %d at least after %v paused, a probe every %v; line %q",
			n, atAway, want, paused, probeEvery, line)
	}
}

// A run of reach failures starts where its first failed connect began,
// not where it ended: a dial whose packets were dropped ends up to
// connect_timeout per host later, and unreachable_for left that out. Not
// before the last answer, though; and a connection lost with no answer
// starts it at the loss.
func TestUnreachableFromTheConnectsStart(t *testing.T) {
	const dial = 30 * time.Second
	dropped := func(began time.Time) error {
		return &connectError{where: "10.0.0.1:5432", err: context.DeadlineExceeded, began: began}
	}
	lost := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}

	s := reachSink()
	ended := time.Now()
	s.noteReach(dropped(ended.Add(-dial)), ended)
	if d, _ := s.unreachableFor(ended); d != dial {
		t.Errorf("unreachable for %v after a connect of %v that failed; want %v", d, dial, dial)
	}

	// A run under way moves back to a connect that began before it.
	s = reachSink()
	s.noteReach(lost, ended.Add(-time.Second))
	s.noteReach(dropped(ended.Add(-dial)), ended)
	if d, _ := s.unreachableFor(ended); d != dial {
		t.Errorf("unreachable for %v; want the %v since the earliest connect's start", d, dial)
	}

	// An answer during the connect: the connect says nothing of the time
	// after the answer, and the run starts at its end (from just after
	// the answer, a connect that outlasted ReleaseAfter sent the sink
	// away at once, right after a commit).
	s = reachSink()
	answered := ended.Add(-time.Second)
	s.reached(s.stamp(answered))
	s.noteReach(dropped(ended.Add(-dial)), ended)
	if d, _ := s.unreachableFor(ended); d != 0 {
		t.Errorf("unreachable for %v at the end of a connect begun before an answer; want 0, from its end", d)
	}
	// A failure cut by the run's end (a probe at shutdown) is no word on
	// the server.
	s = reachSink()
	s.noteReach(&connectError{err: context.Canceled, began: ended.Add(-dial)}, ended)
	if d, _ := s.unreachableFor(ended.Add(time.Second)); d != 0 || s.reachFails.Load() != 0 {
		t.Errorf("unreachable for %v, %d failures counted after a cancelled connect; want none", d, s.reachFails.Load())
	}

	// A lost connection: from the loss.
	s = reachSink()
	s.noteReach(lost, ended)
	if d, _ := s.unreachableFor(ended.Add(time.Second)); d != time.Second {
		t.Errorf("unreachable for %v a second after a connection was lost; want 1s", d)
	}

	// A real connect to a server that never answers (packets taken, no
	// reply): the run starts where it began, connect_timeout before it
	// failed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-accepted
	})
	go func() {
		defer close(accepted)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // kept open, unanswered
		}
	}()
	cc, err := pgx.ParseConfig("postgres://jet@" + ln.Addr().String() + "/nodb?connect_timeout=1&sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	s = reachSink()
	s.connCfg = cc
	ctx := testCtx(t, 30*time.Second)
	_, err = s.connect(ctx)
	failed := time.Now()
	if !cannotReach(err) {
		t.Fatalf("connect to a server that never answers: %v; want a reach failure", err)
	}
	s.noteReach(err, failed)
	if d, _ := s.unreachableFor(failed); d < time.Second {
		t.Errorf("unreachable for %v when a connect of connect_timeout=1 failed; want 1s at least (%v)", d, err)
	}
}

// The line that ends an outage counts the attempts that failed in its run
// of failures: not those of a run an answer ended before, nor one from
// before that answer that ended after it; and its unreachable_for runs from
// the run's first failure.
func TestRecoveryLineCountsTheRunsFailures(t *testing.T) {
	s := reachSink()
	logs := &testenv.SyncBuffer{}
	s.log = slog.New(slog.NewTextHandler(logs, nil))
	refused := &connectError{where: "127.0.0.1:1", err: syscall.ECONNREFUSED}
	base := time.Now().Add(-time.Minute)
	s.noteReach(refused, base)
	s.noteReach(refused, base.Add(100*time.Millisecond))
	s.reached(s.stamp(base.Add(time.Second)))
	s.noteReach(refused, base.Add(500*time.Millisecond)) // ended after the answer
	start := base.Add(2 * time.Second)
	for i := range 3 {
		s.noteReach(refused, start.Add(time.Duration(i)*time.Second))
	}
	now := time.Now()
	d, msg := s.unreachableFor(now)
	if !s.goAway(now, d, msg) {
		t.Fatal("not away after a minute of failures")
	}
	answered := time.Now()
	s.reached(s.stamp(answered))
	line := logs.String()
	if !strings.Contains(line, "postgres answers again") {
		t.Fatalf("no line saying postgres answers again: %q", line)
	}
	if got := logValue(t, line, "failed_attempts"); got != "3" {
		t.Errorf("failed_attempts=%s, want 3; line %q", got, line)
	}
	if got, want := logDuration(t, line, "unreachable_for"), answered.Sub(start); got < want.Truncate(time.Millisecond) || got > time.Since(start)+time.Millisecond {
		t.Errorf("unreachable_for=%v, want the %v since the run's first failure; line %q", got, want, line)
	}
}

// While away the watcher probed every 2 s with Retry.Max 1 s, not every
// 1 s (and every Retry.Max + 1 s above that): the next probe was due
// probeEvery after a time read just after a tick, a hair past the tick
// that came probeEvery later, which it skipped. The ticks are given one by
// one here, no clock: with Retry.Max 1 s each one probes; with 2 s, every
// other one; with 2.5 s, every third (rounded up to the 1 s tick).
func TestAwayProbesEveryRetryMax(t *testing.T) {
	pg := testenv.Postgres(t)
	for _, tc := range []struct {
		max   time.Duration
		every int // ticks from one probe to the next
	}{{time.Second, 1}, {2 * time.Second, 2}, {2500 * time.Millisecond, 3}} {
		t.Run(fmt.Sprintf("every%d", tc.every), func(t *testing.T) {
			ctx := testCtx(t, 20*time.Second)
			gate, url := gated(t, pg.URL)
			s, _ := newTestSink(t, ctx, url, func(c *Config) { releaseConfig(AtLeastOnce)(c); c.Retry.Max = tc.max })
			ticks := make(chan time.Time)
			old := reachTicks
			reachTicks = func() (<-chan time.Time, func()) { return ticks, func() {} }
			t.Cleanup(func() { reachTicks = old })
			gate.Cut()
			s.switchReach(true, time.Now(), "cut")
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				(&run{s: s}).watchReach(ctx, stop)
			}()
			defer func() { close(stop); <-done }()
			base := s.reachFails.Load()
			want := uint64(0)
			for tick := range 4*tc.every + 1 {
				ticks <- time.Now() // taken: the tick before it is handled, and its probe begun if due
				if tick%tc.every == 0 {
					want++
					waitFor(t, ctx, fmt.Sprintf("probe %d, at tick %d of every %d", want, tick+1, tc.every),
						func() bool { return s.reachFails.Load()-base >= want })
				}
				if n := s.reachFails.Load() - base; n > want {
					t.Fatalf("%d probes by tick %d; want %d, one every %d ticks", n, tick+1, want, tc.every)
				}
			}
		})
	}
}

// releasingSink runs an at-least-once sink that releases (releaseConfig)
// on a cluster of the test's own, its log captured, and has it commit
// rows 1-10.
func releasingSink(t *testing.T) (ctx context.Context, cluster *embedded.Cluster, s *Sink, dl *recDL, logs *testenv.SyncBuffer, src source, wait func() error) {
	t.Helper()
	ctx = testCtx(t, 120*time.Second)
	cluster = testenv.NewCluster(t)
	s, dl = newTestSink(t, ctx, cluster.URL("postgres"), releaseConfig(AtLeastOnce))
	logs = captureLog(t, s, time.Minute)
	src = newSource()
	wait = runSink(t, ctx, s, src)
	first, mFirst := rows(1, 10, nil)
	src.push(t, ctx, first)
	waitFor(t, ctx, "the first rows acked", allAcked(mFirst))
	return ctx, cluster, s, dl, logs, src, wait
}

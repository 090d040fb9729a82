package sink

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

// commitCutter is a TCP proxy to PostgreSQL that, once armed, lets the
// write that commits through (the CopyDone that ends a batch's Query, in
// either mode), waits for the server's answer (so the transaction has
// committed), drops the answer and cuts the connection: the client cannot
// know the outcome.
type commitCutter struct {
	mode  Mode
	armed atomic.Bool
	cut   atomic.Int32
	// hold: instead of cutting the connection, keep it open and drop
	// everything the server sends on it from then on.
	hold atomic.Bool
	// onCut, if set, is called as the proxy cuts (or holds) the
	// connection, before the client can see it.
	onCut func()
}

// copyDone ends a COPY, and the sink writes nothing after it in a batch's
// Query (exactly-once's INSERT and COMMIT come before its data, in the
// Query message), so it ends the bytes the proxy reads.
var copyDone = []byte("c\x00\x00\x00\x04")

// commits reports whether b, read from the client, holds the message that
// commits a batch.
func commits(b []byte) bool { return bytes.HasSuffix(b, copyDone) }

// committed reports whether b, read from the server after commits, holds
// the answer to that message, the CommandComplete of the COPY or of the
// COMMIT: the server has committed once it sends it. What comes before it
// (the CopyInResponse of a COPY whose statement, rows and CopyDone went out
// in one write) passes.
func committed(m Mode, b []byte) bool {
	if m == AtLeastOnce {
		return bytes.Contains(b, []byte("COPY "))
	}
	return bytes.Contains(b, []byte("COMMIT\x00"))
}

func newCommitCutter(t *testing.T, dbURL string, m Mode) (*commitCutter, string) {
	t.Helper()
	l := listen(t)
	proxied, to := l.proxy(t, dbURL)
	p := &commitCutter{mode: m}
	l.relay(to, func() (up, down func([]byte) verdict) {
		var cutNext, holding atomic.Bool
		up = func(b []byte) verdict {
			if commits(b) && p.armed.CompareAndSwap(true, false) {
				cutNext.Store(true)
			}
			return pass
		}
		down = func(b []byte) verdict {
			switch {
			case holding.Load():
				return drop
			case !cutNext.Load() || !committed(p.mode, b):
				return pass
			}
			p.cut.Add(1)
			if p.onCut != nil {
				p.onCut()
			}
			if p.hold.Load() {
				holding.Store(true)
				return drop
			}
			return cut
		}
		return up, down
	})
	return p, proxied
}

// The connection drops after the server committed and before the answer
// arrived: the batch is retried. at-least-once stores it twice and counts
// possible duplicates; exactly-once stores it once.
func TestCommitOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		mode     Mode
		wantRows int
		wantDups uint64
	}{
		{AtLeastOnce, 20, 10},
		{ExactlyOnce, 10, 0},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			pg := testenv.Postgres(t)
			proxy, proxied := newCommitCutter(t, pg.URL, tc.mode)
			s, _ := newTestSink(t, ctx, proxied, func(c *Config) { c.Mode = tc.mode })
			proxy.armed.Store(true)
			src := newSource()
			rs, ms := rows(1, 10, nil)
			src.push(t, ctx, rs)
			src.close()
			if err := s.Run(ctx, src); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if proxy.cut.Load() != 1 {
				t.Fatalf("the proxy cut %d connections, want 1", proxy.cut.Load())
			}
			if !allAcked(ms)() {
				t.Fatal("not every message acked")
			}
			st := s.Stats()
			if st.Retries < 1 || st.PossibleDuplicates != tc.wantDups {
				t.Fatalf("stats %+v", st)
			}
			if n := count(t, ctx, pg.Conn(t), s.cfg.Table); n != tc.wantRows {
				t.Fatalf("%d rows, want %d", n, tc.wantRows)
			}
		})
	}
}

// The hard context ends while the answer to an at-least-once COPY is lost
// (the COPY has committed; the server's answers never arrive): the sink
// cannot know the outcome, acks nothing, and counts the rows as possible
// duplicates, since JetStream will deliver them again.
func TestOutcomeUnknownAtShutdownCounted(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	proxy, proxied := newCommitCutter(t, pg.URL, AtLeastOnce)
	proxy.hold.Store(true)
	s, _ := newTestSink(t, ctx, proxied, func(c *Config) { c.Connections = 1 })
	proxy.armed.Store(true)
	hard, cancel := context.WithCancel(ctx)
	defer cancel()
	src := newSource()
	wait := runSink(t, hard, s, src)
	rs, ms := rows(1, 10, nil)
	src.push(t, ctx, rs)
	admin := pg.Conn(t)
	waitFor(t, ctx, "the COPY to commit", func() bool { return proxy.cut.Load() == 1 && count(t, ctx, admin, s.cfg.Table) == 10 })
	cancel()
	if err := wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	for i, m := range ms {
		if m.acks.Load() != 0 {
			t.Fatalf("message %d acked without a known commit", i)
		}
	}
	if st := s.Stats(); st.PossibleDuplicates != 10 {
		t.Fatalf("PossibleDuplicates = %d, want 10 (stats %+v)", st.PossibleDuplicates, st)
	}
}

package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// releaseAckPending is the durable's nats.max_ack_pending in
// TestReleaseToAnotherInstanceWhilePostgresUnreachable: all that the
// instance cut off can hold from the other (its hold limit is higher).
const releaseAckPending = 2000

// releaseMaxRows is postgres.batch.max_rows in that test: it bounds what
// A keeps, at-least-once, while cut off (see keptAtMost).
const releaseMaxRows = 100

// Two jetsinks share one durable and one table; A reaches PostgreSQL
// through a gate, B directly. With A's gate cut, A takes in events it
// cannot store and, holding them with InProgress, would in the end hold
// every one the durable lets out (max_ack_pending), B none, for as long as
// the cut lasts. Once A has failed to reach the server for max(ack_wait,
// 30 s), it gives them back and pulls no more: while A is still cut, every
// event is in the table but those A keeps, A says so (released, not
// ready, /metrics), and once the gate reopens A takes events again.
// A gives each event back once, not what it takes again: it pulls no
// more (pulling on, it was given events back over and over, some until
// their last delivery, which it kept). Nothing is lost or dead-lettered;
// at-least-once, duplicates stay within
// what the sinks count as possible ones; exactly-once, none.
//
// What A keeps: exactly-once, nothing (every event here is on its first
// or second delivery, of the current stream). At-least-once, the batches
// whose commit had an unknown outcome: each committer's first after the
// cut, sent on a connection the gate had closed under it, and retried
// whole, not given back (it may be stored); so at most
// postgres.connections x max_rows rows, well below max_ack_pending.
func TestReleaseToAnotherInstanceWhilePostgresUnreachable(t *testing.T) {
	const warm, events, after = 1_000, 20_000, 1_000
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel() // mostly waiting for A to give up on PostgreSQL
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			t.Cleanup(http.DefaultClient.CloseIdleConnections)
			e.createStreams(ctx)

			cfgB := e.faultConfig(mode)
			cfgB.NATS.MaxAckPending = releaseAckPending
			cfgB.Postgres.Batch.MaxRows = releaseMaxRows
			keptAtMost := int64(0)
			if mode == sink.AtLeastOnce {
				keptAtMost = int64(cfgB.Postgres.Connections * releaseMaxRows)
			}
			cfgA := cfgB
			u, err := url.Parse(e.pg.URL)
			if err != nil {
				t.Fatal(err)
			}
			gate := testenv.NewGateProxy(t, u.Host)
			u.Host = strings.TrimPrefix(gate.URL(), "nats://")
			cfgA.Postgres.URL = u.String()
			// The same database through the gate: record it as B does, or
			// each would warn of the other writing elsewhere.
			cfgA.NATS.Destination = processor.Destination(e.pg.URL, e.table)
			a := e.start(ctx, cfgA) // creates the table
			b := e.start(ctx, cfgB)

			x := newExpected()
			e.publishDuring(ctx, x, 0, warm, 0, 10).wait(t, ctx)
			e.waitDrained(ctx, warm, a, b)

			gate.Cut()
			cut := time.Now()
			e.publishDuring(ctx, x, warm, events, 0, 10).wait(t, ctx)
			// ReleaseAfter is 30 s (ack_wait 10 s): a minute and a half
			// more is generous, and without the give-back B would never
			// get the events A holds: the table would lack
			// max_ack_pending of them, and as many would stay unacked.
			// Every event delivered; each not in the table unacked (A
			// keeps it), and at most keptAtMost of those.
			wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
			waitFor(t, wctx, "every event in the table, but those A keeps, while A is cut off", func() (bool, string) {
				n := e.count(ctx, "SELECT count(DISTINCT seq) FROM "+e.tableID())
				st := a.p.Sink().Stats()
				info := e.consumerInfo(ctx)
				unacked := int64(info.NumAckPending)
				return info.NumPending == 0 && n+unacked >= warm+events && unacked <= keptAtMost,
					fmt.Sprintf("distinct seqs %d of %d; A released %d; ack pending %d (A may keep %d), pending %d",
						n, warm+events, st.Released, unacked, keptAtMost, info.NumPending)
			})
			wcancel()
			stored := time.Since(cut)
			if away, _ := a.p.Sink().Away(); !away {
				t.Errorf("A is not away while its gate is cut")
			}
			// What A gave back is what it held: at most the durable's
			// max_ack_pending, and what came in before it stopped
			// pulling. One that pulled on would take back what it gave
			// back, over and over.
			if st := a.p.Sink().Stats(); st.Released == 0 || st.Released > 2*releaseAckPending {
				t.Errorf("A gave back %d events while cut off, want some, at most twice max_ack_pending (%d): %+v",
					st.Released, releaseAckPending, st)
			}
			if err := a.p.Sink().Ready(ctx); err == nil || !strings.Contains(err.Error(), "unreachable") {
				t.Errorf("A's sink ready while cut off: %v", err)
			}
			if code, body := adminGet(t, ctx, a, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "unreachable") {
				t.Errorf("A's /readyz while cut off: %d %.300s", code, body)
			}
			_, body := adminGet(t, ctx, a, "/metrics")
			if got := metricValue(body, "jetsink_postgres_unreachable"); got != 1 {
				t.Errorf("A's jetsink_postgres_unreachable = %v while cut off, want 1", got)
			}
			if got := metricValue(body, "jetsink_events_released_total"); got <= 0 {
				t.Errorf("A's jetsink_events_released_total = %v while cut off, want > 0", got)
			}

			gate.Reopen()
			waitFor(t, ctx, "A reaching PostgreSQL again", func() (bool, string) {
				away, _ := a.p.Sink().Away()
				return !away, "away"
			})
			// And it takes events again: its stream not refused (the
			// sequence check once took the rows B stored meanwhile for a
			// stream restarted under them), /readyz green.
			waitFor(t, ctx, "A ready again", func() (bool, string) {
				if err := a.p.Consumer().Refused(); err != nil {
					return false, err.Error()
				}
				code, body := adminGet(t, ctx, a, "/readyz")
				return code == http.StatusOK, fmt.Sprintf("/readyz %d %.300s", code, body)
			})
			e.publishDuring(ctx, x, warm+events, after, 0, 10).wait(t, ctx)
			e.waitSettled(ctx, x)
			a.drain(t)
			b.drain(t)
			v := e.check(ctx, x)
			sa, sb := a.p.Sink().Stats(), b.p.Sink().Stats()
			ca, cb := a.p.Consumer().Stats(), b.p.Consumer().Stats()
			t.Logf("stored in %v after the cut; A: received %d, committed %d, released %d (nak failed %d), possible duplicates %d; "+
				"B: received %d (redelivered %d), committed %d, possible duplicates %d",
				stored.Round(time.Millisecond), ca.Received, sa.Rows, sa.Released, sa.ReleaseErrors, sa.PossibleDuplicates,
				cb.Received, cb.Redelivered, sb.Rows, sb.PossibleDuplicates)
			e.judgeValid("release to another instance", mode, v, sinkAllowance(sa)+sinkAllowance(sb))
		})
	}
}

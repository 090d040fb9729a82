package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/sink"
)

// TestInFlightBytesBound: nats.max_in_flight_bytes bounds what jetsink
// holds in bytes while the table is locked, whatever max_ack_pending lets
// through: 150 events of 64 KiB (9.4 MiB) against a 2 MiB budget. Once the
// lock is gone every event is a row or a dead letter, and every way an
// event's life ends gives its bytes back: acked after commit, dead-lettered
// by a worker (an id that is no uuid), dead-lettered by the sink (a row a
// CHECK constraint refuses): the gauge comes back to 0.
func TestInFlightBytesBound(t *testing.T) {
	const good, badDecode, badRow, pad = 150, 4, 4, 64 << 10
	const budget = 2 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEnv(t)
	e.createStreams(ctx)
	cfg := e.config(sink.AtLeastOnce)
	cfg.NATS.MaxInFlightBytes = budget
	cfg.Postgres.Batch.MaxRows = 10
	cfg.Pipeline.MaxEventBytes = 1 << 20
	// A first event creates the table; then a constraint for the sink to
	// refuse rows with, and a lock that holds every batch.
	e.publish(ctx, 0, 1, 1)
	r := e.start(ctx, cfg)
	e.waitDrained(ctx, 1, r)
	e.exec(ctx, "ALTER TABLE "+e.tableID()+" ADD CHECK (value < 1e9)")
	lockConn := e.pg.Conn(t)
	tx := e.lockTable(ctx, lockConn, "ACCESS EXCLUSIVE")

	filler := strings.Repeat("x", pad)
	send := func(id, value string, i int) {
		data := fmt.Appendf(nil, `{"id":%q,"ts":"2026-12-03T10:00:00Z","device":"d%d","kind":"big","value":%s,"seq":%d,"tags":{"site":"s"},"pad":%q}`,
			id, i%7, value, i, filler)
		msg := &nats.Msg{Subject: fmt.Sprintf("%s.big.%d", e.prefix, i%7), Data: data, Header: nats.Header{jetstream.MsgIDHeader: {fmt.Sprintf("big-%d", i)}}}
		if _, err := e.js.PublishMsg(ctx, msg); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	for i := range good + badDecode + badRow {
		switch {
		case i%40 == 7 && i/40 < badDecode:
			send("not-a-uuid", "1.5", i)
		case i%40 == 23 && i/40 < badRow:
			send(fmt.Sprintf("00000000-0000-4000-b000-%012d", i), "1e12", i)
		default:
			send(fmt.Sprintf("00000000-0000-4000-a000-%012d", i), "1.5", i)
		}
	}

	held := func() int64 { h, _ := r.p.Consumer().InFlightBytes(); return h }
	waitFor(t, ctx, "the budget to fill behind the lock", func() (bool, string) {
		return held() > budget/2, fmt.Sprintf("%d bytes held", held())
	})
	var most int64
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		most = max(most, held())
	}
	// Every pull of a preloaded stream is cut by its bytes, so no pull is
	// left open with room unused: the bound holds exactly.
	if most > budget {
		t.Errorf("%d bytes held behind the lock, want at most max_in_flight_bytes %d", most, budget)
	}
	if info := e.consumerInfo(ctx); info.NumAckPending > budget/pad+1 {
		t.Errorf("%d messages delivered and unacked behind the lock: more than %d bytes' worth", info.NumAckPending, budget)
	}
	code, body := adminGet(t, ctx, r, "/metrics")
	if got := metricValue(body, "jetsink_in_flight_limit_bytes"); code != 200 || got != budget {
		t.Errorf("jetsink_in_flight_limit_bytes = %v (status %d), want %d:\n%s", got, code, budget, grep(body, "in_flight"))
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	const rows = 1 + good
	waitFor(t, ctx, "every event a row or a dead letter", func() (bool, string) {
		n, d := e.rows(ctx), e.dlqCount(ctx)
		return n == rows && d == badDecode+badRow, fmt.Sprintf("%d rows, %d dead letters", n, d)
	})
	waitFor(t, ctx, "jetsink_in_flight_bytes back to 0", func() (bool, string) {
		_, body := adminGet(t, ctx, r, "/metrics")
		got := metricValue(body, "jetsink_in_flight_bytes")
		return got == 0, fmt.Sprintf("jetsink_in_flight_bytes %v, held %d", got, held())
	})
	r.drain(t)
}

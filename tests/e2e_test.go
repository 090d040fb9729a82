package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// TestEndToEnd publishes 100,000 events over 1,000 subjects and checks that
// exactly those land in the table, every one acked, with every column of a
// sample equal to what was published: in both modes with the rings, and
// at-least-once with the channel hand-off that jetsink bench compares them to.
func TestEndToEnd(t *testing.T) {
	variants := []struct {
		mode    sink.Mode
		handoff string
	}{
		{sink.AtLeastOnce, pipeline.HandoffRing},
		{sink.ExactlyOnce, pipeline.HandoffRing},
		{sink.AtLeastOnce, pipeline.HandoffChannel},
	}
	for _, v := range variants {
		mode := v.mode
		name := string(mode)
		if v.handoff != pipeline.HandoffRing {
			name += "/handoff=" + v.handoff
		}
		t.Run(name, func(t *testing.T) {
			const events, subjects = 100_000, 1_000
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			e.createStreams(ctx)
			begin := time.Now()
			e.publish(ctx, 0, events, subjects)
			published := time.Since(begin)

			begin = time.Now()
			cfg := e.config(mode)
			cfg.Pipeline.Handoff = v.handoff
			r := e.start(ctx, cfg)
			e.waitDrained(ctx, events, r)
			elapsed := time.Since(begin)
			r.drain(t)
			t.Logf("%s: published %d in %v; drained in %v (%.0f events/s, under -race when run by make test)",
				name, events, published.Round(time.Millisecond), elapsed.Round(time.Millisecond), events/elapsed.Seconds())

			if n := e.rows(ctx); n != events {
				t.Fatalf("%d rows, want %d", n, events)
			}
			info := e.consumerInfo(ctx)
			if info.NumPending != 0 || info.NumAckPending != 0 {
				t.Fatalf("consumer pending %d, ack pending %d after drain", info.NumPending, info.NumAckPending)
			}
			e.checkSample(ctx, events, 300)
		})
	}
}

// checkSample compares n random rows column by column with the events
// loadgen published.
func (e *env) checkSample(ctx context.Context, events, n int) {
	e.t.Helper()
	seqs := make([]int64, n)
	for i := range seqs {
		seqs[i] = rand.Int64N(int64(events))
	}
	rows, err := e.db.Query(ctx, "SELECT id::text, ts, device, kind, value, seq, site, body::text, stream, stream_seq FROM "+
		pgx.Identifier{e.table}.Sanitize()+" WHERE seq = ANY($1)", seqs)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	checked := 0
	for rows.Next() {
		var (
			id, device, kind, site, body, stream string
			ts                                   time.Time
			value                                float64
			seq, streamSeq                       int64
		)
		if err := rows.Scan(&id, &ts, &device, &kind, &value, &seq, &site, &body, &stream, &streamSeq); err != nil {
			e.t.Fatal(err)
		}
		want := loadgen.Make(e.run, uint64(seq), 1_000)
		got := fmt.Sprintf("%s %s %s %s %g %s", id, ts.UTC().Format(time.RFC3339Nano), device, kind, value, site)
		exp := fmt.Sprintf("%s %s %s %s %g %s", want.UUID(), want.TS.Format(time.RFC3339Nano), want.Device, want.Kind, want.Value, want.Site)
		if got != exp {
			e.t.Errorf("seq %d: row %q, published %q", seq, got, exp)
		}
		var gotBody, wantBody any
		if err := json.Unmarshal([]byte(body), &gotBody); err != nil {
			e.t.Errorf("seq %d: body %q: %v", seq, body, err)
		}
		_ = json.Unmarshal(want.AppendJSON(nil), &wantBody)
		if fmt.Sprint(gotBody) != fmt.Sprint(wantBody) {
			e.t.Errorf("seq %d: body %s, published %s", seq, body, want.AppendJSON(nil))
		}
		if stream != e.stream || streamSeq < 1 {
			e.t.Errorf("seq %d: stream %q seq %d", seq, stream, streamSeq)
		}
		checked++
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	if checked < n/2 { // seqs may repeat; most must be found
		e.t.Fatalf("only %d of %d sampled rows found", checked, n)
	}
}

// gateWatch is how long TestNoPullBeforeTheSinkConnects watches the
// consumer once it waits at its pull gate: twice the sink's warmGrace
// (1 s), the shortest time sink.Sink.Warmed waits for anything; with every
// connect hanging, it waits for warmTimeout (10 s) or longer.
const gateWatch = 2 * time.Second

// jetsink pulls nothing until the sink can commit: while the committers'
// connects hang (PostgreSQL reached through a proxy that forwards
// nothing), the consumer waits at its pull gate, has no pull waiting and
// has delivered nothing, and the backlog stays in the stream; once they go
// through, it is drained.
func TestNoPullBeforeTheSinkConnects(t *testing.T) {
	const events = 2_000
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.createStreams(ctx)
	e.publish(ctx, 0, events, 4)
	u, err := url.Parse(e.pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	gate := testenv.NewGateProxy(t, u.Host)
	u.Host = strings.TrimPrefix(gate.URL(), "nats://")
	cfg := e.config(sink.AtLeastOnce)
	cfg.Postgres.URL = u.String()
	p := e.newProcessor(ctx, cfg) // creates the table through the proxy
	gate.Freeze()
	r := e.launch(ctx, p)
	t.Cleanup(gate.Thaw) // before the processor's: a failure here leaves nothing frozen for it
	untouched := func() {
		t.Helper()
		if info := e.consumerInfo(ctx); info.Delivered.Consumer != 0 || info.NumWaiting != 0 || info.NumPending != events {
			t.Fatalf("while no committer could connect: delivered %d, pulls waiting %d, pending %d of %d",
				info.Delivered.Consumer, info.NumWaiting, info.NumPending, events)
		}
	}
	// First the consumer must have got as far as the gate (its start-up
	// look-ups done), or a slow start would pass the watch below whether
	// the gate holds or not.
	waitFor(t, ctx, "the consumer waiting at its pull gate", func() (bool, string) {
		untouched()
		return goroutineIn("jetsink/consumer.(*Consumer).mayPull("), "no goroutine in consumer.(*Consumer).mayPull"
	})
	for end := time.Now().Add(gateWatch); time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond) // observation interval, not a wait for a condition
		untouched()
	}
	gate.Thaw()
	e.waitDrained(ctx, events, r)
	r.drain(t)
}

// TestAckOnlyAfterCommit holds an ACCESS EXCLUSIVE lock on the table: the
// events arrive but nothing may be acked until the lock goes and the rows
// commit.
func TestAckOnlyAfterCommit(t *testing.T) {
	const events = 1_000
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.createStreams(ctx)
	cfg := e.config(sink.AtLeastOnce)
	r := e.start(ctx, cfg) // creates the table

	tx := e.lockTable(ctx, e.pg.Conn(t), "ACCESS EXCLUSIVE")
	e.publish(ctx, 0, events, 10)

	// Every event is delivered to jetsink ...
	waitFor(t, ctx, "all events delivered", func() (bool, string) {
		info := e.consumerInfo(ctx)
		return info.NumPending == 0 && info.NumAckPending == events,
			fmt.Sprintf("pending %d, ack pending %d", info.NumPending, info.NumAckPending)
	})
	// ... and while the lock holds, none is acked: watch for a while.
	watchUntil := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(watchUntil) {
		info := e.consumerInfo(ctx)
		if info.AckFloor.Stream != 0 || info.NumAckPending != events {
			t.Fatalf("acked while the table was locked: ack floor %d, ack pending %d", info.AckFloor.Stream, info.NumAckPending)
		}
		time.Sleep(100 * time.Millisecond) // observation interval, not a wait for a condition
	}
	if err := tx.Rollback(ctx); err != nil { // releases the lock
		t.Fatal(err)
	}
	e.waitDrained(ctx, events, r)
	r.drain(t)
	if n := e.rows(ctx); n != events {
		t.Fatalf("%d rows, want %d", n, events)
	}
}

// goroutineIn reports whether a goroutine of this process is in fn (part
// of a stack frame's function name, as runtime.Stack prints it).
func goroutineIn(fn string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Contains(string(buf[:n]), fn)
		}
		buf = make([]byte, 2*len(buf))
	}
}

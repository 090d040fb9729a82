package consumer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
	"github.com/jetsink/jetsink/tests/testenv"
)

// pipeRun runs a Consumer's Run into a real pipeline of one worker that
// maps the payload to a jsonb column and dead-letters through the
// Consumer; the rows it makes go to rows, unsettled.
type pipeRun struct {
	p    *pipeline.Pipeline
	rows chan pipeline.Row
	wg   sync.WaitGroup
}

// startPipeline starts c's Run (intake and hard: ctx) and the pipeline
// behind it; both stop when ctx ends, which the test's deferred cancel
// does before the clean-up waits for them.
func startPipeline(t *testing.T, ctx context.Context, c *Consumer) *pipeRun {
	t.Helper()
	m, err := pipeline.Compile([]pipeline.Column{{Name: "body", From: "payload", Type: pipeline.TypeJSONB}})
	if err != nil {
		t.Fatal(err)
	}
	pcfg := pipeline.DefaultConfig()
	pcfg.Workers, pcfg.RingSize = 1, 16
	p, err := pipeline.New(pcfg, m, c, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	h := pipeline.NewHandoff(pipeline.HandoffRing, 1, pcfg.RingSize).(*pipeline.RingHandoff)
	pr := &pipeRun{p: p, rows: make(chan pipeline.Row, 64)}
	pr.wg.Go(func() { _ = c.Run(ctx, ctx, h.In) })
	pr.wg.Go(func() { _ = p.RunHandoff(ctx, h) })
	pr.wg.Go(func() {
		buf := make([]pipeline.Row, 16)
		for {
			n, err := h.PopN(ctx, buf)
			for _, row := range buf[:n] {
				select {
				case pr.rows <- row:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	t.Cleanup(pr.wg.Wait)
	return pr
}

// next returns the next row or fails the test at ctx's deadline.
func (pr *pipeRun) next(t *testing.T, ctx context.Context) pipeline.Row {
	t.Helper()
	select {
	case row := <-pr.rows:
		return row
	case <-ctx.Done():
		t.Fatalf("no row before the deadline: %v", ctx.Err())
		return pipeline.Row{}
	}
}

// An event nak'ed max_deliver times is delivered again (the durable sets
// no limit of its own) and dead-lettered on that delivery by the worker,
// undecoded (its payload, "0", would make a row), then terminated: no row
// of it, no advisory.
func TestMaxDeliverExtraDeliveryDeadLettered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.MaxDeliver = 2
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)
	nc := srv.Connect(t)
	advisories, err := nc.SubscribeSync(fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s", cfg.Stream, cfg.Consumer))
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 1, 1, 0)
	pr := startPipeline(t, ctx, c)
	for want := uint32(1); want <= 2; want++ {
		row := pr.next(t, ctx)
		if row.Event.Delivered != want || row.Event.Exhausted {
			t.Fatalf("row of delivery %d: count %d, exhausted %v", want, row.Event.Delivered, row.Event.Exhausted)
		}
		if err := row.Event.Msg.Nak(); err != nil {
			t.Fatal(err)
		}
	}
	waitMaxDeliverLetter(t, ctx, dlq, cfg) // delivered 3 times
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r := m.Header.Get(HeaderReason); !strings.Contains(r, "delivered 3 times without being stored") {
		t.Fatalf("reason %q", r)
	}
	waitFor(t, ctx, "the term", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.AckFloor == 1 && lag.NumAckPending == 0
	})
	// The next event's row is the next row: the dead-lettered delivery,
	// popped before it, made none.
	publish(t, ctx, js, cfg, 1, 1, 1)
	row := pr.next(t, ctx)
	if g := bodyIndex(t, &row.Event); g != 1 {
		t.Fatalf("row of event %d, delivery %d, after the dead letter; want event 1", g, row.Event.Delivered)
	}
	if err := row.Event.Msg.Ack(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.MaxDelivered != 1 || st.DeadLettered != 0 || st.DeadLetterFailed != 0 {
		t.Fatalf("consumer stats %+v, want MaxDelivered 1 and nothing else dead-lettered", st)
	}
	// The worker counts rows after pushing them, so the row may be here
	// before its count is; a dead letter is counted by its lane, after
	// the term.
	waitFor(t, ctx, "the pipeline to count the third row and the dead letter", func() bool {
		ps := pr.p.Stats()
		return ps.Rows >= 3 && ps.DeadLettered >= 1
	})
	if ps := pr.p.Stats(); ps.DeadLettered != 1 || ps.Rows != 3 {
		t.Fatalf("pipeline stats %+v, want 1 dead-lettered and 3 rows", ps)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := advisories.Pending(); n != 0 {
		t.Fatalf("%d max-deliveries advisories for a terminated event", n)
	}
}

// The event the review found lost: its last allowed delivery runs out
// while no jetsink runs (here a plain fetch on the durable takes it and
// never acks it). JetStream keeps it and delivers it again to the
// jetsink that comes back, which dead-letters it. (With the consumer's
// MaxDeliver at nats.max_deliver, the server gave up on it when the ack
// wait ran out and raised its advisory to nobody: the event was neither
// stored nor dead-lettered.)
func TestMaxDeliverRunsOutWhileJetsinkIsDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = time.Second
	cfg.MaxDeliver = 1
	// A jetsink ran (it made the streams and the durable), then stopped.
	first, err := New(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	_ = first.Close(context.Background())
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 1, 1, 0)
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var took jetstream.Msg
	for m := range batch.Messages() {
		took = m
	}
	if took == nil {
		t.Fatalf("fetch took nothing: %v", batch.Error())
	}
	if meta, err := took.Metadata(); err != nil || meta.NumDelivered != 1 {
		t.Fatalf("fetched delivery %+v (%v), want the first", meta, err)
	}
	// Its ack wait runs out with no jetsink subscribed. Nothing on the
	// server shows that before the next pull, so wait it out.
	select {
	case <-time.After(cfg.AckWait + time.Second):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}

	c := newConsumer(t, ctx, cfg)
	pr := startPipeline(t, ctx, c)
	waitMaxDeliverLetter(t, ctx, dlq, cfg) // delivered twice
	waitFor(t, ctx, "the term", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.AckFloor == 1 && lag.NumAckPending == 0
	})
	if st := c.Stats(); st.MaxDelivered != 1 {
		t.Fatalf("stats %+v, want MaxDelivered 1", st)
	}
	select {
	case row := <-pr.rows:
		t.Fatalf("a row of delivery %d", row.Event.Delivered)
	default:
	}
}

// nakCounter is a message that counts its naks.
type nakCounter struct {
	*fakeMsg
	naks int
}

func (m *nakCounter) Nak() error { m.naks++; return nil }

// A message push cannot hand on (the output closed; in exactly-once mode,
// the stream not verified) is nak'ed so that it comes back soon, but not
// once a new epoch has begun: its stream was replaced, and the nak would
// send the new stream's event with the same sequence back.
func TestPushNaksOnlyInItsEpoch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, exactlyOnce := range []bool{false, true} {
		c := &Consumer{log: testLogger(t, nil)}
		if exactlyOnce {
			c.cfg.StoredSeq = noRows
		}
		out := ringq.NewDispatch(1, 16, key)
		out.Close()
		for _, replaced := range []bool{false, true} {
			s := &session{ask: make(chan struct{}), verdict: make(chan error, 1), quit: make(chan struct{}),
				epoch: c.epochs.Current()}
			s.stopAnswering() // no serve: a verification fails at once
			if replaced {
				c.epochs.Advance()
			}
			msg := &nakCounter{fakeMsg: &fakeMsg{reply: "$JS.ACK.S.C.1.1.1.1.0", header: nats.Header{}}}
			if err := c.push(ctx, out, msg, s); err == nil {
				t.Fatalf("exactly-once %v, stream replaced %v: push = nil, want an error", exactlyOnce, replaced)
			}
			want := 1
			if replaced {
				want = 0
			}
			if msg.naks != want {
				t.Fatalf("exactly-once %v, stream replaced %v: %d naks, want %d", exactlyOnce, replaced, msg.naks, want)
			}
		}
	}
}

// push marks a delivery past nats.max_deliver Exhausted, and none when
// deliveries are unlimited.
func TestPushMarksDeliveriesPastMaxDeliver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		max       int
		delivered uint32
		want      bool
	}{{2, 1, false}, {2, 2, false}, {2, 3, true}, {2, 7, true}, {1, 2, true}, {-1, 1000, false}} {
		c := &Consumer{log: testLogger(t, nil), cfg: Config{MaxDeliver: tc.max}}
		out := ringq.NewDispatch(1, 16, key)
		msg := &fakeMsg{reply: fmt.Sprintf("$JS.ACK.S.C.%d.1.1.1.0", tc.delivered), header: nats.Header{}}
		if err := c.push(ctx, out, msg, &session{}); err != nil {
			t.Fatal(err)
		}
		ev, ok := out.Ring(0).TryPop()
		if !ok || ev.Delivered != tc.delivered || ev.Exhausted != tc.want {
			t.Fatalf("max_deliver %d, delivery %d: popped %v, delivered %d, exhausted %v; want exhausted %v",
				tc.max, tc.delivered, ok, ev.Delivered, ev.Exhausted, tc.want)
		}
	}
}

// The durable consumer's MaxDeliver is unlimited: jetsink counts
// deliveries itself. A durable made with a limit (nats.max_deliver + 1, by
// the jetsink before this one) is reported by check and updated by New;
// the record of events that jetsink could not dead-letter stays, and check
// reports it as a problem.
func TestOldMaxDeliverReportedAndUpdated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	makeStream(t, ctx, js, cfg)
	dlqStream(t, ctx, js, cfg)
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver + 1,
		Metadata: map[string]string{strandedKey: "7:11:0"}}); err != nil {
		t.Fatal(err)
	}
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("consumer %s has ack_wait 30s, max_deliver 11, filter \"\"; run will update it to 30s, "+
		"max_deliver -1 (unlimited: jetsink dead-letters an event delivered more than nats.max_deliver 10 times itself, "+
		"and keeps it until that dead letter is stored; a server-side limit could drop it unseen), \"\"", cfg.Consumer)
	stranded := strandedProblem("7:11:0")
	if len(ps) != 2 || ps[0] != stranded || !ps[1].Warning || ps[1].Message != want {
		t.Fatalf("problems:\n%s\nwant\n%s\nand the warning\n%s", problemsText(ps), stranded, want)
	}
	newConsumer(t, ctx, cfg)
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if got := cons.CachedInfo().Config.MaxDeliver; got != -1 {
		t.Fatalf("MaxDeliver after New = %d, want -1", got)
	}
	if ps, err := Check(ctx, cfg, testLogger(t, nil)); err != nil || len(ps) != 1 || ps[0] != stranded {
		t.Fatalf("check after New: %v\n%s", err, problemsText(ps))
	}
}

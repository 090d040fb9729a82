package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
	"github.com/jetsink/jetsink/tests/testenv"
)

func TestRunDeliversEveryMessageOnceInSubjectOrder(t *testing.T) {
	const (
		n        = 20000
		subjects = 37
		rings    = 4
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)

	start := time.Now()
	publish(t, ctx, js, cfg, n/2, subjects, 0) // a backlog before Run starts
	r := startRun(t, ctx, c, rings, 256, n)
	publish(t, ctx, js, cfg, n/2, subjects, n/2) // and a live stream while it runs

	seen := make(map[uint64]bool, n)
	consumerSeqs := make(map[uint64]bool, n)
	lastOf := make(map[string]int) // subject -> last body index
	ringOf := make(map[string]int) // subject -> ring it went to
	for len(seen) < n {
		g := r.next(t, ctx)
		ev := &g.ev
		i := bodyIndex(t, ev)
		if seen[ev.StreamSeq] {
			t.Fatalf("stream seq %d delivered twice", ev.StreamSeq)
		}
		seen[ev.StreamSeq] = true
		if consumerSeqs[ev.ConsumerSeq] {
			t.Fatalf("consumer seq %d seen twice", ev.ConsumerSeq)
		}
		consumerSeqs[ev.ConsumerSeq] = true
		switch {
		case ev.StreamSeq != uint64(i+1):
			t.Fatalf("message %d has stream seq %d, want %d", i, ev.StreamSeq, i+1)
		case ev.Stream != cfg.Stream:
			t.Fatalf("Stream = %q, want %q", ev.Stream, cfg.Stream)
		case ev.Subject != subjectOf(cfg, i, subjects):
			t.Fatalf("message %d on %q, want %q", i, ev.Subject, subjectOf(cfg, i, subjects))
		case ev.MsgID != "m"+strconv.Itoa(i):
			t.Fatalf("MsgID = %q, want m%d", ev.MsgID, i)
		case func() bool { v, ok := ev.HeaderLookup("traceparent"); return !ok || v != traceparent }():
			t.Fatalf("headers = %v (raw: %v), want the traceparent", ev.Header, ev.Header == nil)
		case ev.Delivered != 1:
			t.Fatalf("message %d delivered %d times", i, ev.Delivered)
		case ev.Published.Before(start.Add(-time.Second)) || ev.Published.After(time.Now()):
			t.Fatalf("Published = %v, outside the test", ev.Published)
		case ev.Received.Before(ev.Published.Add(-time.Second)):
			t.Fatalf("Received %v before Published %v", ev.Received, ev.Published)
		case ev.Msg == nil:
			t.Fatal("event without a message handle")
		case pulledBy(ev.Msg) != cmp.Or(cfg.PullClient, PullClientWire):
			t.Fatalf("pulled by %s, want nats.pull_client %q", pulledBy(ev.Msg), cfg.PullClient)
		}
		if ring, ok := ringOf[ev.Subject]; ok && ring != g.ring {
			t.Fatalf("subject %s went to rings %d and %d", ev.Subject, ring, g.ring)
		}
		ringOf[ev.Subject] = g.ring
		if last, ok := lastOf[ev.Subject]; ok && i <= last {
			t.Fatalf("subject %s: message %d after %d", ev.Subject, i, last)
		}
		lastOf[ev.Subject] = i
		if err := ev.Msg.Ack(); err != nil {
			t.Fatalf("ack %d: %v", ev.StreamSeq, err)
		}
	}
	waitFor(t, ctx, "all acks", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.NumPending == 0 && lag.NumAckPending == 0 && lag.AckFloor == n
	})
	r.stopClean(t, ctx)
	if r.popErrs.Load() != 0 {
		t.Fatal("a drainer saw an error other than ErrClosed")
	}
	if extra := len(r.events); extra != 0 {
		t.Fatalf("%d events more than published", extra)
	}
	if st := c.Stats(); st.Received != n || st.Redelivered != 0 {
		t.Fatalf("Stats = %+v, want %d received, none redelivered", st, n)
	}
}

// collectUntilStopped cancels intake and gathers every event Run still
// hands over until it returns and the drainers have ended.
func (r *runner) collectUntilStopped(t *testing.T, ctx context.Context) ([]got, error) {
	t.Helper()
	r.cancel()
	drained := make(chan struct{})
	go func() {
		r.drainers.Wait()
		close(drained)
	}()
	var evs []got
	var runErr error
	runDone := false
	for !runDone || drained != nil {
		select {
		case g := <-r.events:
			evs = append(evs, g)
		case runErr = <-r.done:
			runDone = true
			r.done = nil
		case <-drained:
			drained = nil
		case <-ctx.Done():
			t.Fatalf("Run did not stop after intake was cancelled: %v", ctx.Err())
		}
	}
	for len(r.events) > 0 {
		evs = append(evs, <-r.events)
	}
	return evs, runErr
}

func TestRunIntakeCancelLosesNothing(t *testing.T) {
	const n = 5000
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = 2 * time.Second
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, jsFor(t, srv), cfg, n, 11, 0)

	// Small rings and a small hand-off so that Run is blocked in Push with
	// the pull buffer full when intake is cancelled.
	r := startRun(t, ctx, c, 2, 16, 8)
	acked := make(map[uint64]bool, n)
	for len(acked) < 1000 {
		g := r.next(t, ctx)
		if err := g.ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
		acked[g.ev.StreamSeq] = true
	}
	rest, err := r.collectUntilStopped(t, ctx)
	if err != nil {
		t.Fatalf("Run after intake cancel = %v, want nil", err)
	}
	if r.popErrs.Load() != 0 {
		t.Fatal("a drainer saw an error other than ErrClosed: the dispatch was not closed cleanly")
	}
	// Whatever Run handed over while draining is left unacked: it must come
	// back to the next Run, as must everything never delivered.
	unacked := make(map[uint64]bool)
	for _, g := range rest {
		if !acked[g.ev.StreamSeq] {
			unacked[g.ev.StreamSeq] = true
		}
	}
	t.Logf("first run: %d acked, %d handed over while draining (left unacked)", len(acked), len(unacked))
	if len(acked)+len(unacked) >= n {
		t.Fatalf("the first run took everything (%d); the test needs a backlog left", len(acked)+len(unacked))
	}

	r2 := startRun(t, ctx, c, 2, 256, n)
	for len(acked) < n {
		g := r2.next(t, ctx)
		ev := &g.ev
		if unacked[ev.StreamSeq] && ev.Delivered < 2 {
			t.Fatalf("unacked seq %d came back with delivery count %d", ev.StreamSeq, ev.Delivered)
		}
		delete(unacked, ev.StreamSeq)
		if err := ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
		acked[ev.StreamSeq] = true
	}
	if len(unacked) != 0 {
		t.Fatalf("%d unacked messages never came back", len(unacked))
	}
	waitFor(t, ctx, "all acks", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.NumPending == 0 && lag.NumAckPending == 0
	})
	if err := r2.stop(t, ctx); err != nil {
		t.Fatalf("second Run = %v", err)
	}
}

// A restart loses nothing; one that keeps the server down longer than a
// look at the stream or the consumer waits (streamLookTimeout and
// lookTimeout: 5 s, half the outage here) is a lost connection too. (The
// look that the wire connection's loss asks for, failing while nats.go
// has not yet noticed its own loss, rarely comes here:
// TestWireLossFailedLookIsALostConnection checks that path.)
func TestRunSurvivesServerRestart(t *testing.T) {
	for _, down := range []time.Duration{0, 2 * time.Second} {
		t.Run(fmt.Sprintf("down %v", down), func(t *testing.T) { runSurvivesServerRestart(t, down) })
	}
}

func runSurvivesServerRestart(t *testing.T, down time.Duration) {
	const n = 10000
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = 2 * time.Second
	c := newConsumer(t, ctx, cfg)
	if down > 0 {
		c.streamLookTimeout, c.lookTimeout = down/2, down/2
	}
	pubConn := srv.Connect(t)
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, n/2, 7, 0)

	r := startRun(t, ctx, c, 2, 64, n)
	acked := make(map[uint64]bool, n)
	dups := 0
	take := func(until int) {
		t.Helper()
		for len(acked) < until {
			g := r.next(t, ctx)
			if acked[g.ev.StreamSeq] {
				dups++ // redelivery of a message whose ack the restart lost
			}
			acked[g.ev.StreamSeq] = true
			if err := g.ev.Msg.Ack(); err != nil && !errors.Is(err, context.Canceled) {
				t.Logf("ack %d: %v", g.ev.StreamSeq, err)
			}
		}
	}
	take(1000)
	srv.Shutdown()
	waitFor(t, ctx, "the consumer to notice the shutdown", func() bool { return !c.Ready() })
	time.Sleep(down)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "reconnect", func() bool { return c.Ready() && pubConn.IsConnected() })
	js2 := jsFor(t, srv)
	publish(t, ctx, js2, cfg, n/2, 7, n/2)
	take(n)
	waitFor(t, ctx, "all acks", func() bool {
		// Late redeliveries of messages whose acks the restart lost.
		for len(r.events) > 0 {
			g := <-r.events
			dups++
			_ = g.ev.Msg.Ack()
		}
		lag, err := c.Lag(ctx)
		return err == nil && lag.NumPending == 0 && lag.NumAckPending == 0
	})
	t.Logf("restart: %d redeliveries, stats %+v", dups, c.Stats())
	// The wire connection's loss while nats.go was down is a lost
	// connection, not a consumer gone: no re-creation.
	if st := c.Stats(); st.Resubscribes != 0 {
		t.Errorf("%d resubscribes over a server restart, want 0 (a lost connection, not a consumer gone)", st.Resubscribes)
	}
	r.stopClean(t, ctx)
}

func TestRunRecreatesDeletedConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 10, 2, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	for i := 0; i < 10; i++ {
		g := r.next(t, ctx)
		if err := g.ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	// The dead-letter stream too: re-creating the consumer makes it again
	// (create_stream; Config.CreateStream).
	if err := js.DeleteStream(ctx, cfg.Stream+"_DLQ"); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 10, 2, 10)
	// The re-created consumer starts from the beginning of the stream (its
	// ack state went with it); what matters is that the new messages come.
	got := make(map[int]bool)
	for len(got) < 10 {
		g := r.next(t, ctx)
		if i := bodyIndex(t, &g.ev); i >= 10 {
			got[i] = true
		}
		if err := g.ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if c.Stats().Resubscribes == 0 {
		t.Fatal("Resubscribes = 0 after the consumer was deleted")
	}
	if name, err := js.StreamNameBySubject(ctx, cfg.DeadLetterSubject); err != nil || name != cfg.Stream+"_DLQ" {
		t.Fatalf("stream for %s after the consumer was re-created = %q, %v; want %s_DLQ", cfg.DeadLetterSubject, name, err, cfg.Stream)
	}
	r.stopClean(t, ctx)
}

// A consumer deleted while Run runs is made again past the ack floor serve
// last asked the server for, not from the start of the stream: in
// at-least-once mode a new durable from the start stored every event the
// stream held again.
func TestRecreatedConsumerResumesPastItsAckFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = 50 * time.Millisecond
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 10, 2, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	ackUntilFloor(t, ctx, r, c, 10)
	if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	publishPastFloor(t, ctx, js, cfg, r)
	if !strings.Contains(log.String(), "start_seq=11") {
		t.Errorf("the log does not say where the consumer was made again:\n%s", log.String())
	}
	r.stopClean(t, ctx)
}

// A consumer lost while Run runs is made again on a work-queue stream too,
// delivering all (the server refuses any other start there, and deleted
// the events acked), and on either stream the loss is said once, not at
// each refused remake. As measured before: on a work-queue stream the
// remake past the floor was refused ("consumer must be deliver all on
// workqueue stream") every 5 s until jetsink restarted, the Warn
// repeated each time.
func TestLostConsumerMadeAgainOnceSaid(t *testing.T) {
	for _, tc := range []struct {
		retention jetstream.RetentionPolicy
		said      string // in the loss's Warn
	}{
		{jetstream.LimitsPolicy, "start_seq=11"},
		{jetstream.WorkQueuePolicy, "on a work-queue stream"},
	} {
		t.Run(tc.retention.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			js, cfg, _ := ownStream(t, ctx, jetstream.StreamConfig{Retention: tc.retention}, nil)
			c, log := newLoggedConsumer(t, ctx, cfg)
			c.floorEvery = 50 * time.Millisecond
			publish(t, ctx, js, cfg, 10, 2, 0)
			r := startRun(t, ctx, c, 1, 64, 1000)
			ackUntilFloor(t, ctx, r, c, 10)
			// Each remake refused a while (the stream's consumer_limits
			// below jetsink's max_ack_pending), as the work-queue stream
			// refused every one.
			if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
				t.Fatal(err)
			}
			sc := streamConfig(t, ctx, js, cfg.Stream)
			sc.ConsumerLimits.MaxAckPending = 10
			if _, err := js.UpdateStream(ctx, sc); err != nil {
				t.Fatal(err)
			}
			refused := apiErrors(t, ctx, js)
			waitFor(t, ctx, "three refused remakes", func() bool { return apiErrors(t, ctx, js) >= refused+3 })
			sc.ConsumerLimits.MaxAckPending = 0
			if _, err := js.UpdateStream(ctx, sc); err != nil {
				t.Fatal(err)
			}
			publishPastFloor(t, ctx, js, cfg, r)
			var gone []string
			for _, l := range strings.Split(log.String(), "\n") {
				if strings.Contains(l, "consumer gone") {
					gone = append(gone, l)
				}
			}
			if len(gone) != 1 || !strings.Contains(gone[0], tc.said) {
				t.Errorf("want one line saying the consumer went, with %q; got %d:\n%s", tc.said, len(gone), strings.Join(gone, "\n"))
			}
			r.stopClean(t, ctx)
		})
	}
}

// apiErrors is how many JetStream API requests of js's account the
// server has answered with an error.
func apiErrors(t *testing.T, ctx context.Context, js jetstream.JetStream) uint64 {
	t.Helper()
	ai, err := js.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ai.API.Errors
}

// A consumer lost before serve's first look (floorEvery) is made again
// past the ack floor it had when the session began, not from the start
// of the stream: Run asks for the floor before each session pulls. As
// measured: an operator's durable from sequence 91 over 100 events,
// 91..100 acked, jetsink started, the durable deleted within its first
// second; before, the 100 events came again.
func TestConsumerLostBeforeTheFirstLookResumesPastItsAckFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	js := jsFor(t, srv)
	makeStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 100, 1, 0)
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 91})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(10)
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ci, err := cons.Info(ctx); err != nil || ci.AckFloor.Stream != 100 {
		t.Fatalf("operator's durable before jetsink starts: %+v, %v; want ack floor 100", ci, err)
	}
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = time.Hour // no look of serve's in this test
	publish(t, ctx, js, cfg, 1, 1, 100)
	r := startRun(t, ctx, c, 1, 64, 1000)
	if first := r.next(t, ctx); bodyIndex(t, &first.ev) != 100 {
		t.Fatalf("first event %d, want 100", bodyIndex(t, &first.ev))
	}
	// The first event came from a session that asked before it pulled.
	if got := c.resumeFloor.Load(); got != 100 {
		t.Fatalf("ack floor known once the first session pulled = %d, want 100", got)
	}
	if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 10, 1, 101)
	// Event 100, taken and not acked, comes again; none before it.
	for seen := map[int]bool{}; len(seen) < 11; {
		g := r.next(t, ctx)
		i := bodyIndex(t, &g.ev)
		if i < 100 {
			t.Fatalf("event %d, acked before jetsink started, delivered again", i)
		}
		seen[i] = true
		if err := g.ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(log.String(), "start_seq=101") {
		t.Errorf("the log does not say where the consumer was made again:\n%s", log.String())
	}
	r.stopClean(t, ctx)
}

// Only on the stream the floor was learnt on: a consumer made again on a
// stream that replaced it (another creation time), or on one whose
// sequence went back below the floor under the same creation time (a
// restore from a backup), starts at the beginning of the stream. A
// consumer made past the floor whose stream could not be confirmed after
// is deleted and made again from the start if the stream is another, and
// kept if not.
func TestRecreatedConsumerStartsAtTheStartOfAnotherStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, cfg, c := enteredConsumer(t, ctx)
	publish(t, ctx, js, cfg, 10, 1, 0)
	for _, tc := range []struct {
		name   string
		floor  uint64
		other  bool // another creation time
		unsure bool // made past the floor, unconfirmed: not deleted first
		want   uint64
	}{
		{"same stream", 5, false, false, 6},
		{"another stream", 5, true, false, 0},
		{"sequence below the floor", 50, false, false, 0},
		{"unsure, same stream", 5, false, true, 6},
		{"unsure, another stream", 5, true, true, 0},
	} {
		c.resumeFloor.Store(tc.floor)
		c.resumeStream = c.streamCreated
		if tc.unsure {
			// As ensureConsumer leaves it when the look after failed.
			if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
				t.Fatal(err)
			}
			cc := c.consumerConfig(nil, nil)
			cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, tc.floor+1
			if _, err := js.CreateConsumer(ctx, cfg.Stream, cc); err != nil {
				t.Fatal(err)
			}
			c.resumeUnsure = true
		} else if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
			t.Fatal(err)
		}
		if tc.other {
			c.resumeStream = c.streamCreated.Add(-time.Hour)
		}
		if err := c.ensureConsumer(ctx, nil); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		if err != nil {
			t.Fatal(err)
		}
		got := cons.CachedInfo().Config
		switch {
		case tc.want > 0 && (got.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || got.OptStartSeq != tc.want):
			t.Errorf("%s: deliver policy %v from %d, want from sequence %d", tc.name, got.DeliverPolicy, got.OptStartSeq, tc.want)
		case tc.want == 0 && got.DeliverPolicy != jetstream.DeliverAllPolicy:
			t.Errorf("%s: deliver policy %v from %d, want all", tc.name, got.DeliverPolicy, got.OptStartSeq)
		}
		if c.resumeUnsure {
			t.Errorf("%s: still unsure after ensureConsumer", tc.name)
		}
	}
}

// A stream deleted under a jetsink that may not create it: Run retries,
// and after stuckAfter NotConsuming says why (the readiness check fails);
// once the stream is back and Run subscribes, it says nothing again.
func TestNotConsumingWhileTheStreamIsGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg) // makes the stream, with create_stream
	c.cfg.CreateStream = false
	c.stuckAfter = 300 * time.Millisecond
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	_ = r.next(t, ctx).ev.Msg.Ack()
	if err := c.NotConsuming(); err != nil {
		t.Fatalf("NotConsuming while consuming: %v", err)
	}
	if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "NotConsuming to say why", func() bool {
		err := c.NotConsuming()
		return err != nil && strings.Contains(err.Error(), "not consuming for") && errors.Is(err, jetstream.ErrStreamNotFound)
	})
	makeStream(t, ctx, js, cfg)
	waitFor(t, ctx, "NotConsuming to clear once the stream is back", func() bool { return c.NotConsuming() == nil })
	r.stopClean(t, ctx)
}

// A session whose pulls and looks at the consumer go unanswered (here a
// network path that stopped forwarding; JetStream without a leader gives
// the same): after stuckAfter NotConsuming says so, and once the consumer
// answers again it says nothing, and the events come. Before, the session
// lived on and the readiness check stayed green until nats.go's pings gave
// the connection up, minutes later.
func TestNotConsumingWhileTheConsumerDoesNotAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	c, p, cfg := closeSetup(t, ctx, srv, testConfig(t, srv).PullClient, nil)
	c.stuckAfter = 300 * time.Millisecond
	c.floorEvery = 200 * time.Millisecond
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	_ = r.next(t, ctx).ev.Msg.Ack()
	p.Freeze()
	// The pulls go unanswered; on a loaded machine the wire probe may
	// drop the connection first, and Run's look at the stream goes
	// unanswered then: either says why.
	waitFor(t, ctx, "NotConsuming to say why", func() bool {
		err := c.NotConsuming()
		return err != nil && (strings.Contains(err.Error(), "pulls went unanswered") || strings.Contains(err.Error(), "look up the stream"))
	})
	p.Thaw()
	waitFor(t, ctx, "NotConsuming to clear once the consumer answers", func() bool { return c.NotConsuming() == nil })
	publish(t, ctx, js, cfg, 1, 1, 1)
	r.ackUntil(t, ctx, 1)
	r.stopClean(t, ctx)
}

// JetStream turned off under a session (a server does that when its store's
// disk is full) and back (a restart, once space is freed): NotConsuming
// says that JetStream does not answer, not only that a look at the consumer
// failed; the warnings repeat once a minute at most, not a pair every few
// seconds (about 20 lines a minute in an operator's drill); and once
// JetStream is back, the pulls refused meanwhile ask for one look, not one
// each (31 warnings in 0.2 s in the drill, where a reload turned JetStream
// on again). The events come again. (Here the restart drops the pulls
// refused meanwhile with the connection, and few pulls reach the warning
// while JetStream is off: undoing the recheckGap guard, or the warning's
// quieting, passed. TestRecheckGapHoldsTheLook and
// TestNoRespondersWarningQuieted check those.)
func TestJetStreamOffAndOnAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.stuckAfter = 300 * time.Millisecond
	c.lookTimeout = 500 * time.Millisecond
	// 2 s, not 5: a second look within the last second checked below needs
	// a pull refused over 2 s after the look that found JetStream back.
	c.recheckGap = 2 * time.Second
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	_ = r.next(t, ctx).ev.Msg.Ack()
	count := func(msg string) int { return strings.Count(log.String(), msg) }

	if err := srv.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "NotConsuming to say that JetStream does not answer", func() bool {
		err := c.NotConsuming()
		return err != nil && strings.Contains(err.Error(), "JetStream does not answer")
	})
	time.Sleep(c.recheckGap + 2*time.Second) // more pulls and looks
	for _, msg := range []string{"a pull found no server to answer it", "consumer check failed"} {
		if n := count(msg); n > 1 {
			t.Errorf("%d warnings %q in a few seconds, want 1 a minute at most", n, msg)
		}
	}
	states := count("consumer state")
	srv.Shutdown() // the operator frees space and restarts the server
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "NotConsuming to clear once JetStream answers", func() bool { return c.NotConsuming() == nil })
	publish(t, ctx, js, cfg, 1, 1, 1)
	r.ackUntil(t, ctx, 1)
	time.Sleep(time.Second) // what the pulls refused before asked for
	if n := count("consumer state") - states; n > 1 {
		t.Errorf("%d looks at the consumer logged once JetStream was back, want 1 at most", n)
	}
	r.stopClean(t, ctx)
	if t.Failed() {
		t.Logf("the consumer's log:\n%s", log.String())
	}
}

// The consumer is deleted and someone creates one of the same name that
// jetsink cannot update (another ack policy). Run must not consume from it
// as if its own were back: it retries, saying why, and pushes nothing.
// (Before, any failure to re-create other than "not found" was logged and
// Run subscribed with its old handle, here to a consumer without acks.)
func TestRunDoesNotConsumeFromAConsumerItCannotUpdate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = 100 * time.Millisecond
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 5, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	for range 5 {
		r.next(t, ctx)
	}
	foreign := jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckNonePolicy, FilterSubject: cfg.FilterSubject}
	waitFor(t, ctx, "the foreign consumer in place", func() bool {
		// Run may re-create its own in between: delete that and try again.
		_ = js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer)
		cons, err := js.CreateConsumer(ctx, cfg.Stream, foreign)
		return err == nil && cons.CachedInfo().Config.AckPolicy == jetstream.AckNonePolicy
	})
	const retrying = "re-create stream/consumer; retrying"
	waitFor(t, ctx, "Run to refuse the foreign consumer", func() bool {
		return strings.Contains(log.String(), retrying) || strings.Contains(log.String(), "consuming on")
	})
	publish(t, ctx, js, cfg, 5, 1, 5)
	deadline := time.After(3 * time.Second)
	for {
		select {
		case g := <-r.events:
			if i := bodyIndex(t, &g.ev); i >= 5 {
				t.Fatalf("event %d pushed from a consumer jetsink could not update (ack policy none); log:\n%s", i, log.String())
			}
			continue
		case <-deadline:
		}
		break
	}
	if strings.Contains(log.String(), "consuming on") {
		t.Fatalf("Run consumed on after failing to update the consumer; log:\n%s", log.String())
	}
}

func TestRunHardCancelReturnsPromptly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, jsFor(t, srv), cfg, 100, 1, 0)

	// Nobody pops: Run blocks in Push once the one-slot ring is full.
	out := ringq.NewDispatch(1, 1, key)
	intake, stopIntake := context.WithCancel(ctx)
	defer stopIntake()
	hard, stopHard := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(intake, hard, out) }()
	waitFor(t, ctx, "the ring to fill", func() bool { return out.Ring(0).Len() == 1 })

	stopIntake() // the drain is stuck behind the full ring...
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while its drain was blocked and hard was alive", err)
	case <-time.After(100 * time.Millisecond):
	}
	began := time.Now()
	stopHard() // ...until hard gives up
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want it to wrap context.Canceled", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return after hard was cancelled")
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("Run took %s to return after hard was cancelled", d)
	}
	if _, err := out.Ring(0).Pop(ctx); err != nil {
		t.Fatalf("the pushed event is gone: %v", err)
	}
	if _, err := out.Ring(0).Pop(ctx); !errors.Is(err, ringq.ErrClosed) {
		t.Fatalf("Pop after Run returned = %v, want ErrClosed (Run closes the dispatch)", err)
	}
}

// A message that could not be handed on (the dispatch was closed by
// someone else) is nak'ed, and not counted as received: it comes again at
// once, not after ack_wait.
func TestRunCountsOnlyMessagesHandedOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	if cfg.AckWait < 30*time.Second {
		t.Fatalf("ack_wait %v: too short to tell a nak from its expiry", cfg.AckWait)
	}
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 1, 1, 0) // one: no other message is nak'ed
	out := ringq.NewDispatch(1, 4, key)
	out.Close()
	if err := c.Run(ctx, ctx, out); !errors.Is(err, ringq.ErrClosed) {
		t.Fatalf("Run into a closed dispatch = %v, want it to wrap ringq.ErrClosed", err)
	}
	if st := c.Stats(); st.Received != 0 || st.Redelivered != 0 {
		t.Fatalf("Stats after no message was handed on: Received %d, Redelivered %d; want 0, 0", st.Received, st.Redelivered)
	}
	// Delivered again within 5 s (to this Run's pulls, or to ones the
	// first subscription still had open): the nak's doing.
	startRun(t, ctx, newConsumer(t, ctx, cfg), 1, 64, 16)
	wait, cancelWait := context.WithTimeout(ctx, 5*time.Second)
	defer cancelWait()
	waitFor(t, wait, "the message delivered again", func() bool {
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return err == nil && cons.CachedInfo().Delivered.Consumer >= 2
	})
}

func TestRunClosesDispatchWhenIntakeAlreadyCancelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	c := newConsumer(t, ctx, testConfig(t, srv))
	out := ringq.NewDispatch(2, 4, func(*pipeline.Event) uint64 { return 0 })
	intake, stop := context.WithCancel(ctx)
	stop()
	if err := c.Run(intake, ctx, out); err != nil {
		t.Fatalf("Run with intake already over = %v, want nil", err)
	}
	for i := 0; i < out.N(); i++ {
		if _, err := out.Ring(i).Pop(ctx); !errors.Is(err, ringq.ErrClosed) {
			t.Fatalf("ring %d: Pop = %v, want ErrClosed", i, err)
		}
	}
}

func TestRunRecreatesDeletedStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 5, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	for i := 0; i < 5; i++ {
		if err := r.next(t, ctx).ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	// With nats.create_stream, Run puts stream and consumer back; the
	// stream continues the sequence, so that no late ack of an old
	// message can settle a new one.
	waitFor(t, ctx, "the stream to be re-created", func() bool {
		_, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return err == nil
	})
	publish(t, ctx, js, cfg, 5, 1, 100)
	for i := 0; i < 5; i++ {
		ev := r.next(t, ctx).ev
		if got := bodyIndex(t, &ev); got != 100+i || ev.StreamSeq != uint64(6+i) {
			t.Fatalf("after re-creation got message %d at seq %d, want %d at seq %d", got, ev.StreamSeq, 100+i, 6+i)
		}
		if err := ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	r.stopClean(t, ctx)
}

func TestRunWithPullMaxBytes(t *testing.T) {
	const n = 3000
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullMaxMessages = 256
	cfg.PullMaxBytes = 2 << 20
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, jsFor(t, srv), cfg, n, 3, 0)
	r := startRun(t, ctx, c, 2, 128, n)
	seen := make(map[uint64]bool, n)
	for len(seen) < n {
		ev := r.next(t, ctx).ev
		if seen[ev.StreamSeq] {
			t.Fatalf("seq %d twice", ev.StreamSeq)
		}
		seen[ev.StreamSeq] = true
		if err := ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	r.stopClean(t, ctx)
}

// nats.pull_max_bytes at max_payload leaves no room for a message's
// subject and ack reply, which the server counts against a pull's
// max_bytes: a message of max_payload is refused to every pull (a 409
// that nats.go answers by pulling again at once, for ever, silently).
// Both pull clients pull at least max_payload plus the margin.
func TestRunPullMaxBytesAtMaxPayload(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			cfg := testConfig(t, srv)
			cfg.PullClient = client
			mp := int(srv.Connect(t).MaxPayload())
			cfg.PullMaxBytes = mp
			var log syncBuffer
			c, err := New(ctx, cfg, testLogger(t, &log))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			js := jsFor(t, srv)
			if _, err := js.Publish(ctx, subjectOf(cfg, 0, 1), make([]byte, mp-16)); err != nil {
				t.Fatal(err)
			}
			publish(t, ctx, js, cfg, 1, 1, 1)
			r := startRun(t, ctx, c, 1, 64, 10)
			for want := range uint64(2) {
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				select {
				case got := <-r.events:
					if got.ev.StreamSeq != want+1 {
						t.Fatalf("seq %d, want %d", got.ev.StreamSeq, want+1)
					}
					_ = got.ev.Msg.Ack()
				case <-rctx.Done():
					t.Fatalf("a message of max_payload not delivered in 10 s with pull_max_bytes = max_payload; log:\n%s", log.String())
				}
				rcancel()
			}
			r.stopClean(t, ctx)
		})
	}
}

// nats.go stops its heartbeat timer while the handler runs, and starts it
// again on a reconnect: a handler blocked on a full pipeline then "misses"
// heartbeats every two of them, and each time jetsink looked the consumer
// up (two API requests) and logged a warning of missed heartbeats, for as
// long as the back-pressure lasted. That is no sign of a lost consumer.
// Heartbeats every second, not the tests' 500 ms: a gap of two of them
// (the timer's) under load is then 2 s, not 1 s.
func TestRunBlockedPushIsNoMissedHeartbeat(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullClient = PullClientNATSGo // the wire client has heartbeats of its own
	cfg.PullHeartbeat = time.Second
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 100, 1, 0)
	r := startRun(t, ctx, c, 1, 8, 1) // nothing read: 8 in the ring, 1 in events, 1 held by the drainer
	waitFor(t, ctx, "the pipeline to fill", func() bool { return r.out.Ring(0).Len() == 8 })
	srv.Shutdown()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "reconnect", c.Ready)
	time.Sleep(6 * cfg.PullHeartbeat) // three rounds of the restarted timer
	if n := c.Stats().HeartbeatsMissing; n != 0 {
		t.Errorf("%d missed heartbeats counted while the handler waited on a full pipeline", n)
	}
	for range 100 {
		_ = r.next(t, ctx).ev.Msg.Ack()
	}
	r.stopClean(t, ctx)
}

// TestRunRecoversWhenServerLosesStream restarts the server under a memory
// stream, so the stream and consumer are gone afterwards: Run sees it when
// it looks at the stream after the reconnect (before this look, the pulls
// met silence until heartbeats stopped), and once an operator re-creates
// the stream Run re-creates the consumer and carries on.
func TestRunRecoversWhenServerLosesStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	js := jsFor(t, srv)
	streamCfg := jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Storage: jetstream.MemoryStorage}
	if _, err := js.CreateStream(ctx, streamCfg); err != nil {
		t.Fatal(err)
	}
	cfg.CreateStream = false
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 3, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	for i := 0; i < 3; i++ {
		if err := r.next(t, ctx).ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	srv.Shutdown()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "reconnect", c.Ready)
	js2 := jsFor(t, srv)
	// A JetStream API request sent while the restarted server recovers
	// may go unanswered (a CI run under load waited out the whole minute
	// for one): ask again; creating the same stream again is idempotent.
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js2.CreateStream(actx, streamCfg)
		acancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		t.Logf("create stream after the restart: %v; asking again", err)
	}
	publish(t, ctx, js2, cfg, 3, 1, 10)
	for i := 0; i < 3; i++ {
		ev := r.next(t, ctx).ev
		if got := bodyIndex(t, &ev); got != 10+i {
			t.Fatalf("got message %d, want %d", got, 10+i)
		}
		if err := ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	// The events above came through the consumer Run re-created (the
	// operator re-created only the stream); the acks of the lost stream's
	// events were cut off by a new epoch.
	if st := c.Stats(); st.Epochs == 0 {
		t.Fatalf("Stats = %+v: want the stream's loss seen (a new epoch)", st)
	}
	r.stopClean(t, ctx)
}

func TestRunAfterCloseFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	c := newConsumer(t, ctx, testConfig(t, srv))
	_ = c.Close(context.Background())
	out := ringq.NewDispatch(1, 4, key)
	if err := c.Run(ctx, ctx, out); !errors.Is(err, jetstream.ErrConnectionClosed) {
		t.Fatalf("Run on a closed consumer = %v, want ErrConnectionClosed", err)
	}
	if _, err := out.Ring(0).Pop(ctx); !errors.Is(err, ringq.ErrClosed) {
		t.Fatalf("Pop = %v, want ErrClosed", err)
	}
}

// pulledBy names the pull client whose message m is.
func pulledBy(m pipeline.Msg) string {
	switch m.(type) {
	case *wire.Msg:
		return PullClientWire
	case jetstream.Msg:
		return PullClientNATSGo
	}
	return fmt.Sprintf("%T", m)
}

// With the wire pull client, a disconnect of nats.go's connection (which
// carries the acks) ends the wire connection too: nothing is pulled while
// acks cannot get out. Run pulls again on a new wire connection once
// nats.go is back, and nothing is lost.
func TestWireFollowsNATSGoDisconnect(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullClient = PullClientWire // about wire, whichever suite runs it
	// See below: a message the server still sends the dead connection
	// comes back after ack_wait.
	cfg.AckWait = 2 * time.Second
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	if err := r.next(t, ctx).ev.Msg.Ack(); err != nil {
		t.Fatal(err)
	}
	first := c.wc.Load()
	if first == nil {
		t.Fatal("no wire connection after a delivery")
	}
	if err := c.nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Done():
	case <-ctx.Done():
		t.Fatal("the wire connection outlived nats.go's disconnect")
	}
	// first is done before the server has dropped it: a message published
	// now could still go to its pull request, and come back only after
	// ack_wait (JetStream's rule for a client that goes away). Publish
	// once the server holds one pull request, from a new connection, which
	// makes that rare; when it happens anyway, the message comes back after
	// ack_wait, out of order: what counts is that each arrives.
	waitFor(t, ctx, "the new wire connection's pull alone at the server", func() bool {
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return err == nil && c.wc.Load() != first && cons.CachedInfo().NumWaiting == 1
	})
	publishThreeMore(t, ctx, js, cfg, c, r)
	if c.wc.Load() == first {
		t.Fatal("still the first wire connection")
	}
	r.stopClean(t, ctx)
}

// publishThreeMore publishes messages 1..3 after message 0, which r has
// delivered and the test acked; each must arrive once (in any order:
// one that went to a pull request of a connection just lost comes back
// after ack_wait), and is acked; then the server must have all four acked.
func publishThreeMore(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config, c *Consumer, r *runner) {
	t.Helper()
	publish(t, ctx, js, cfg, 3, 1, 1)
	seen := map[int]bool{}
	for len(seen) < 3 {
		ev := r.next(t, ctx).ev
		got := bodyIndex(t, &ev)
		if got < 1 || got > 3 || seen[got] {
			t.Fatalf("got message %d after %v, want each of 1..3 once", got, seen)
		}
		seen[got] = true
		if err := ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ctx, "all acked", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.AckFloor == 4 && lag.NumAckPending == 0
	})
}

// Once wire has been given up (three failed dials while nats.go was
// connected: a server in lame duck mode closes its listener before it
// drops its clients) nats.go pulls, but only until nats.go reconnects: then
// Run pulls with wire again, and nothing is lost or taken twice. Before,
// wire stayed given up for the life of the process.
func TestWireAgainAfterNATSGoReconnects(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullClient = PullClientWire // about wire, whichever suite runs it
	cfg.AckWait = 2 * time.Second   // see TestWireFollowsNATSGoDisconnect
	c := newConsumer(t, ctx, cfg)
	c.wireGaveUp.Store(true) // as wireConn leaves it after its third failed dial
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	if err := r.next(t, ctx).ev.Msg.Ack(); err != nil {
		t.Fatal(err)
	}
	if c.wc.Load() != nil {
		t.Fatal("wire pulled although given up")
	}
	if err := c.nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "a wire connection after nats.go's reconnect, its pull alone at the server", func() bool {
		wc := c.wc.Load()
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return wc != nil && !isDone(wc) && err == nil && cons.CachedInfo().NumWaiting == 1
	})
	publishThreeMore(t, ctx, js, cfg, c, r)
	r.stopClean(t, ctx)
}

// A wire connection the network leaves half-open (the server silent, the
// socket open) is dropped once the pull heartbeats stop and a PING gets no
// answer, a few seconds, instead of when its own PINGs fail, 40-60 s later:
// the session pulled nothing meanwhile.
func TestSilentWireConnectionDroppedAfterMissedHeartbeats(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	var buf syncBuffer
	c, p, _, _, stopRun := closeScene(t, ctx, srv, PullClientWire, &buf, 1)
	defer stopRun()
	first := c.wc.Load()
	if first == nil {
		t.Fatal("no wire connection after a delivery")
	}
	p.Freeze()
	frozen := time.Now()
	dctx, cancelDrop := context.WithTimeout(ctx, 12*time.Second)
	defer cancelDrop()
	waitFor(t, dctx, "the silent wire connection dropped", func() bool { return isDone(first) })
	t.Logf("dropped %v after the server went silent", time.Since(frozen).Round(100*time.Millisecond))
	if !strings.Contains(buf.String(), "wire pull connection does not answer") {
		t.Errorf("no warning that the wire connection did not answer; log:\n%s", buf.String())
	}
	p.Cut() // frees what waits on the frozen connections
	p.Reopen()
}

// nats.go's Consume refuses an idle heartbeat outside 500ms-30s, which the
// wire client takes: with pull_client nats.go (or when nats.go pulls in
// the wire client's place), a pull_heartbeat outside that range is moved
// to the nearest bound, with a warning, rather than failing every
// subscribe for ever.
func TestNATSGoPullsWithAHeartbeatOutsideItsRange(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullClient, cfg.PullHeartbeat = PullClientNATSGo, 200*time.Millisecond
	c, log := newLoggedConsumer(t, ctx, cfg)
	publish(t, ctx, jsFor(t, srv), cfg, 5, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 100)
	for _, ev := range takeN(t, ctx, r, 5) {
		if err := ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	r.stopClean(t, ctx)
	if !strings.Contains(log.String(), "nats.pull_heartbeat is outside the range nats.go's pulls take") || !strings.Contains(log.String(), "heartbeat=500ms") {
		t.Fatalf("no warning of the heartbeat moved to 500ms; log:\n%s", log.String())
	}
}

// An operator's edits of the durable while Run runs: a max_request_batch
// below jetsink's pulls ends the session, and Run applies the consumer's
// configuration again, so that the events flow again (before, consuming
// stalled for good); so do headers_only (before, each event came without
// its body, to be dead-lettered as invalid JSON) and a max_deliver (the
// server would give up on events, neither stored nor dead-lettered); a
// pause stays when jetsink updates the consumer, and is logged.
func TestRunOverOperatorsEdits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = 100 * time.Millisecond
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 5, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	for range 5 {
		if err := r.next(t, ctx).ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	onServer := func() jetstream.ConsumerConfig { return onServerConfig(t, ctx, js, cfg) }
	edit := func(change func(*jetstream.ConsumerConfig)) { editOnServer(t, ctx, js, cfg, change) }
	edit(func(cc *jetstream.ConsumerConfig) { cc.MaxRequestBatch = 1 }) // below any pull of jetsink's
	// The open pull expires (PullExpiry 2 s); the next is refused.
	waitFor(t, ctx, "max_request_batch 0 again", func() bool { return onServer().MaxRequestBatch == 0 })
	publish(t, ctx, js, cfg, 5, 1, 5)
	r.ackUntil(t, ctx, 9)

	// headers_only: the body left out. The message is nak'ed, the
	// configuration applied again, and it comes again whole.
	edit(func(cc *jetstream.ConsumerConfig) { cc.HeadersOnly = true })
	publish(t, ctx, js, cfg, 1, 1, 10)
	r.ackUntil(t, ctx, 10)
	// A max_deliver set on the server: applied again at the next look.
	edit(func(cc *jetstream.ConsumerConfig) { cc.MaxDeliver = 3 })
	waitFor(t, ctx, "max_deliver unlimited again", func() bool { return onServer().MaxDeliver == durableMaxDeliver })
	// A lower max_ack_pending: the throughput falls, nothing failing.
	edit(func(cc *jetstream.ConsumerConfig) { cc.MaxAckPending = 1 })
	waitFor(t, ctx, "max_ack_pending jetsink's again", func() bool { return onServer().MaxAckPending == c.cfg.maxAckPending() })
	if !strings.Contains(log.String(), "changed=max_ack_pending") {
		t.Errorf("max_ack_pending set back without a word:\n%s", log.String())
	}
	// An inactive_threshold: the server would delete the durable once
	// jetsink is stopped longer (and the next start make it anew from the
	// start of the stream). Applied again, and logged.
	edit(func(cc *jetstream.ConsumerConfig) { cc.InactiveThreshold = time.Hour })
	waitFor(t, ctx, "no inactive_threshold again", func() bool { return onServer().InactiveThreshold == 0 })
	if !strings.Contains(log.String(), "changed=inactive_threshold") {
		t.Errorf("inactive_threshold set back without a word:\n%s", log.String())
	}

	until := time.Now().Add(time.Hour)
	if _, err := js.PauseConsumer(ctx, cfg.Stream, cfg.Consumer, until); err != nil {
		t.Fatal(err)
	}
	if err := c.ensureConsumer(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); err != nil || !cons.CachedInfo().Paused {
		t.Fatalf("consumer after an update: %v; want it still paused", err)
	}
	if !strings.Contains(log.String(), "the consumer is paused") {
		t.Errorf("no word of the pause in the log:\n%s", log.String())
	}
	r.stopClean(t, ctx)
}

// A pause of the durable on the server while Run runs (nats consumer
// pause, nats-server 2.11) is logged at the next look, once, with
// resumes_in, and its end too. Before, nothing showed it: no pull fails,
// and the events wait in the stream.
func TestRunLogsAPauseOnTheServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = 50 * time.Millisecond
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	r.ackUntil(t, ctx, 0)
	paused := "the consumer was paused on the server (nats consumer pause)"
	over := "the consumer's pause on the server is over: delivering again"
	if _, err := js.PauseConsumer(ctx, cfg.Stream, cfg.Consumer, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the pause logged", func() bool { return strings.Contains(log.String(), paused) })
	// Logged once, not at every look (notePausedOnServer is safe from
	// here: its state is atomic).
	c.notePausedOnServer(&jetstream.ConsumerInfo{Paused: true, PauseRemaining: time.Hour})
	if _, err := js.ResumeConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the pause's end logged", func() bool { return strings.Contains(log.String(), over) })
	publish(t, ctx, js, cfg, 1, 1, 1)
	r.ackUntil(t, ctx, 1)
	if n := strings.Count(log.String(), paused); n != 1 {
		t.Errorf("the pause logged %d times, want once:\n%s", n, log.String())
	}
	if !strings.Contains(log.String(), "resumes_in=") {
		t.Errorf("the pause's line does not say when it ends:\n%s", log.String())
	}
	r.stopClean(t, ctx)
}

// A durable deleted while paused on the server, and made anew by Run, is
// not paused: the looks after say nothing of a pause's end. Before, the
// pause seen on the deleted one was kept, and the next look logged "the
// consumer's pause on the server is over".
func TestRemadeDurableForgetsThePauseOnTheServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = 50 * time.Millisecond
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	r.ackUntil(t, ctx, 0)
	if _, err := js.PauseConsumer(ctx, cfg.Stream, cfg.Consumer, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the pause logged", func() bool {
		return strings.Contains(log.String(), "the consumer was paused on the server (nats consumer pause)")
	})
	if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the durable made again", func() bool {
		_, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return c.Stats().Resubscribes >= 1 && err == nil
	})
	publish(t, ctx, js, cfg, 1, 1, 1)
	r.ackUntil(t, ctx, 1)
	from := c.looks.Load()
	waitFor(t, ctx, "three looks at the new durable", func() bool { return c.looks.Load() >= from+3 })
	r.stopClean(t, ctx)
	if strings.Contains(log.String(), "pause on the server is over") {
		t.Errorf("the end of a pause of a durable made anew, never paused, logged:\n%s", log.String())
	}
}

// A stream's consumer_limits.inactive_threshold, which the server gives
// jetsink's durable (it sets none) and does not let it go above, is no
// edit of the durable: before, every look set it back, ending the session,
// and the server gave it again at once (a resubscribe each look, for
// ever, retry_in doubling); nor is a limit raised while Run runs and
// given to the durable. It is warned of once, at run's start and by
// check, with the fix: once jetsink is stopped longer, the server deletes
// the durable and the next start makes it anew from the start of the
// stream.
func TestStreamConsumerLimitInactiveThresholdNotFought(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects,
		ConsumerLimits: jetstream.StreamConsumerLimits{InactiveThreshold: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	warning := "stream " + cfg.Stream + " has consumer_limits.inactive_threshold 1h0m0s, which the server gives jetsink's durable consumer"
	fix := "set the stream's consumer_limits.inactive_threshold to 0 (natscli's stream edit has no flag for it: edit the configuration with nats stream edit " + cfg.Stream + " --force --interactive"
	if w := checkText(t, ctx, cfg, false); !strings.Contains(w, warning) || !strings.Contains(w, fix) {
		t.Errorf("check does not warn of the stream's inactive_threshold limit, with the fix:\n%s", w)
	}
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = 50 * time.Millisecond
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	r.ackUntil(t, ctx, 0)
	from := c.looks.Load()
	waitFor(t, ctx, "five looks at the durable", func() bool { return c.looks.Load() >= from+5 })
	// The limit raised while Run runs, and the durable given the new one
	// (as another jetsink's update would have it): no edit either, though
	// not the limit Run noted.
	sc := streamConfig(t, ctx, js, cfg.Stream)
	sc.ConsumerLimits.InactiveThreshold = 2 * time.Hour
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) { cc.InactiveThreshold = 2 * time.Hour })
	from = c.looks.Load()
	waitFor(t, ctx, "five looks at the durable given the new limit", func() bool { return c.looks.Load() >= from+5 })
	publish(t, ctx, js, cfg, 1, 1, 1)
	r.ackUntil(t, ctx, 1)
	r.stopClean(t, ctx)
	if err := c.ensureStream(ctx); err != nil { // as Run does at each re-creation: not said again
		t.Fatal(err)
	}
	l := log.String()
	if strings.Contains(l, "changed=inactive_threshold") {
		t.Errorf("the stream's limit set back as an edit:\n%s", l)
	}
	if n := c.Stats().Resubscribes; n != 0 {
		t.Errorf("%d resubscribes, want none:\n%s", n, l)
	}
	if n := strings.Count(l, "stream "+cfg.Stream+" has consumer_limits.inactive_threshold "); n != 1 || !strings.Contains(l, warning) || !strings.Contains(l, fix) {
		t.Errorf("run warned of the stream's inactive_threshold limit %d times, want once, with the fix:\n%s", n, l)
	}
	if got := onServerConfig(t, ctx, js, cfg).InactiveThreshold; got != 2*time.Hour {
		t.Errorf("the durable's inactive_threshold is %v, want the stream's limit, 2h", got)
	}
}

// The fix inactiveLimitProblem advises, the stream's
// consumer_limits.inactive_threshold set to 0, takes effect while jetsink
// runs: the server leaves the limit it gave the durable, and a look (at
// most every inactiveLimitEvery, here advanced by inactiveLimitAt) finds
// the stream without it and sets the durable's back. Before, a durable's
// value equal to the limit noted was never looked at again: it kept 1h.
func TestStreamConsumerLimitInactiveThresholdRemovedSetBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects,
		ConsumerLimits: jetstream.StreamConsumerLimits{InactiveThreshold: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	c, log := newLoggedConsumer(t, ctx, cfg)
	if why := c.refreshFloor(ctx); why != "" {
		t.Fatalf("the stream's limit taken for an edit: changed=%s", why)
	}
	sc := streamConfig(t, ctx, js, cfg.Stream)
	sc.ConsumerLimits.InactiveThreshold = 0
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if got := onServerConfig(t, ctx, js, cfg).InactiveThreshold; got != time.Hour {
		t.Fatalf("the server took the limit off the durable (%v): the test has nothing to show", got)
	}
	c.inactiveLimitAt.Store(int64(c.sinceBase()) + 1)
	if why := c.refreshFloor(ctx); why != "" { // within inactiveLimitEvery: no look at the stream
		t.Errorf("the stream looked at again within inactiveLimitEvery: changed=%s", why)
	}
	c.inactiveLimitAt.Store(0) // inactiveLimitEvery passed
	if why := c.refreshFloor(ctx); why != "inactive_threshold" {
		t.Fatalf("after the stream's limit was removed, a look says changed=%q, want inactive_threshold", why)
	}
	// Run sets it back.
	c.floorEvery = 50 * time.Millisecond
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	r.ackUntil(t, ctx, 0)
	waitFor(t, ctx, "the durable's inactive_threshold set back to 0", func() bool {
		return onServerConfig(t, ctx, js, cfg).InactiveThreshold == 0
	})
	publish(t, ctx, js, cfg, 1, 1, 1)
	r.ackUntil(t, ctx, 1)
	r.stopClean(t, ctx)
	if !strings.Contains(log.String(), "changed=inactive_threshold") {
		t.Errorf("Run did not say it set the durable's inactive_threshold back:\n%s", log.String())
	}
}

// ensureStream's warnings of the event stream's settings are given once
// per stream, keyed on its creation time: a stream deleted and made again
// with interest retention and an inactive_threshold limit is warned of
// when Run re-creates the consumer on it (ensureStream), and not again at
// the next re-creation. Before, the flags set by the first stream hid the
// new stream's interest retention.
func TestStreamWarningsOncePerStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	limit := jetstream.StreamConsumerLimits{InactiveThreshold: time.Hour}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, ConsumerLimits: limit}); err != nil {
		t.Fatal(err)
	}
	c, log := newLoggedConsumer(t, ctx, cfg)
	interest := "stream " + cfg.Stream + " has interest retention: it keeps an event only"
	inactive := "stream " + cfg.Stream + " has consumer_limits.inactive_threshold 1h0m0s"
	lost := "this stream has interest retention: deleting the durable deletes every event"
	counts := func() (int, int, int) {
		l := log.String()
		return strings.Count(l, interest), strings.Count(l, inactive), strings.Count(l, lost)
	}
	if i, n, l := counts(); i != 0 || n != 1 || l != 0 {
		t.Fatalf("New on a limits stream: interest warned %d times, inactive_threshold %d (%d with interest), want 0, 1, 0:\n%s", i, n, l, log.String())
	}
	if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateStream(ctx, js, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Retention: jetstream.InterestPolicy,
		ConsumerLimits: limit}); err != nil { // the account's only stream, just deleted
		t.Fatal(err)
	}
	for range 2 { // as Run does at each re-creation of the consumer
		if err := c.ensureStream(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if i, n, l := counts(); i != 1 || n != 2 || l != 1 {
		t.Errorf("after the stream was made again with interest retention: interest warned %d times, inactive_threshold %d (%d with interest), want 1, 2, 1:\n%s",
			i, n, l, log.String())
	}
}

// A max_ack_pending lowered on the server is not set back when the
// stream's consumer_limits.max_ack_pending, set since, is below jetsink's:
// the server refuses jetsink's, and Run, re-creating the consumer at each
// try, would not have consumed again. It is warned of once, with the
// limit to raise the durable's to.
func TestStreamConsumerLimitMaxAckPendingNotFought(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects}); err != nil {
		t.Fatal(err)
	}
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = 50 * time.Millisecond
	if want := c.cfg.maxAckPending(); want <= 10 {
		t.Fatalf("jetsink's max_ack_pending %d; the test wants it above 10", want)
	}
	// Before Run: no look comes between the two edits.
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) { cc.MaxAckPending = 1 })
	sc := streamConfig(t, ctx, js, cfg.Stream)
	sc.ConsumerLimits.MaxAckPending = 10
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	r.ackUntil(t, ctx, 0)
	from := c.looks.Load()
	waitFor(t, ctx, "five looks at the durable", func() bool { return c.looks.Load() >= from+5 })
	publish(t, ctx, js, cfg, 1, 1, 1)
	r.ackUntil(t, ctx, 1)
	r.stopClean(t, ctx)
	l := log.String()
	if strings.Contains(l, "changed=max_ack_pending") || c.Stats().Resubscribes != 0 {
		t.Errorf("max_ack_pending set back against the stream's limit (%d resubscribes):\n%s", c.Stats().Resubscribes, l)
	}
	warning := "the consumer's max_ack_pending was lowered on the server, and the stream's consumer_limits.max_ack_pending"
	if n := strings.Count(l, warning); n != 1 || !strings.Contains(l, "will refuse the consumer at jetsink's next start") ||
		!strings.Contains(l, "set nats.max_ack_pending to 10 or less") {
		t.Errorf("the max_ack_pending left warned of %d times, want once, with the limit:\n%s", n, l)
	}
}

// An operator's edit of the durable's filter, or a backoff, while Run
// runs is seen at the next look (floorEvery) and set back, the filter
// change logged at Error with the ack floor and the delivered sequence:
// the server swaps a filter without going back, so the events the edit
// left out meanwhile are skipped for good; a backoff ([30s, 2s, 2s]:
// ack_wait stays 30 s) redelivers every 2 s while a row commits. Before,
// neither was seen.
func TestRunOverFilterAndBackoffEdits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, log, r, js := startFilterTestRun(t, ctx, nil)
	for range 2 {
		if err := r.next(t, ctx).ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	onServer := func() jetstream.ConsumerConfig { return onServerConfig(t, ctx, js, cfg) }
	edit := func(change func(*jetstream.ConsumerConfig)) { editOnServer(t, ctx, js, cfg, change) }
	// setBack waits for jetsink's configuration, within the test's
	// timeout: a look, a drain, an update and a new subscription each.
	setBack := func(what string, ok func(jetstream.ConsumerConfig) bool) {
		t.Helper()
		waitFor(t, ctx, what+" set back", func() bool { return ok(onServer()) })
	}
	wide := func(cc jetstream.ConsumerConfig) bool { return cc.FilterSubject == "" && len(cc.FilterSubjects) == 0 }
	only := subjectOf(cfg, 0, 2)

	edit(func(cc *jetstream.ConsumerConfig) { cc.FilterSubject = only })
	setBack("filter_subject", wide)
	edit(func(cc *jetstream.ConsumerConfig) { cc.FilterSubjects = []string{only} })
	setBack("filter_subjects", wide)
	edit(func(cc *jetstream.ConsumerConfig) {
		cc.BackOff = []time.Duration{30 * time.Second, 2 * time.Second, 2 * time.Second}
	})
	setBack("backoff", func(cc jetstream.ConsumerConfig) bool { return len(cc.BackOff) == 0 && cc.AckWait == cfg.AckWait })

	filterErrs := 0
	for line := range strings.Lines(log.String()) {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, "the consumer's filter was changed on the server") &&
			strings.Contains(line, "ack_floor=2") && strings.Contains(line, "delivered=2") {
			filterErrs++
		}
	}
	if filterErrs != 2 || !strings.Contains(log.String(), "changed=backoff") {
		t.Fatalf("%d Error lines for the filter edits (want one each, with ack_floor=2 delivered=2), and the backoff's; log:\n%s", filterErrs, log.String())
	}
	// Both subjects flow again.
	publish(t, ctx, js, cfg, 2, 2, 2)
	r.ackUntil(t, ctx, 3)
	r.stopClean(t, ctx)
}

// The remake refreshFloor advises after another filter was on the durable
// delivers the events of jetsink's filter the other one skipped: the
// server moves a durable's ack floor, once nothing is pending, to the last
// stream sequence it looked at, past those events, so the command starts
// past the floor noted under jetsink's filter, not the one the look
// found. Before, it said --deliver <the floor now + 1>, and a consumer
// made by it skipped them again (reproduced on the embedded server: filter
// s0, its event 1 acked; the filter edited to s1; s0's event at 3 never
// delivered, s1's at 4 acked: ack_floor 4, --deliver 5).
func TestFilterEditRemakeDeliversWhatTheEditSkipped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, log, js, cfg, ci := filterEditSkipsAnEvent(t, ctx)
	const skipped = filterEditSkipped
	if why := c.refreshFloor(ctx); !strings.Contains(why, "filter_subject") {
		t.Fatalf("the look after the edit found %q changed, want filter_subject", why)
	}
	found := ""
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "level=ERROR") && strings.Contains(l, "the consumer's filter was changed on the server") {
			found = l
		}
	}
	_, rest, ok := strings.Cut(found, "--deliver ")
	deliver, err := strconv.ParseUint(strings.Fields(rest + " x")[0], 10, 64)
	if !ok || err != nil {
		t.Fatalf("no Error line with a --deliver number; log:\n%s", log.String())
	}
	if requireUnattended(t, "run", found); deliver > skipped {
		t.Fatalf("the remake delivers from %d, past the event the edit skipped (%d), under ack floor %d:\n%s", deliver, skipped, ci.AckFloor.Stream, found)
	}
	if strings.Contains(found, "no ack floor under jetsink's filter is known") {
		t.Errorf("the Error line says no floor is known, though a look under jetsink's filter noted one:\n%s", found)
	}
	// The remake, as printed, delivers it.
	if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	remade, err := js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: deliver, FilterSubject: cfg.FilterSubject})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := remade.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, md.Sequence.Stream)
	}
	if len(got) != 1 || got[0] != skipped {
		t.Fatalf("the remake from %d delivered %v first, want %d", deliver, got, skipped)
	}
}

// An operator's filter edit that a session's end (missed heartbeats, a
// resubscribe) meets before the look (refreshFloor) is logged at Error
// with the remake past the floor the durable had under jetsink's filter:
// Run's ensureConsumer sets jetsink's filter back, and the next look
// finds nothing to say. Before, that re-creation logged only a Warn,
// "changing the consumer's filter", with no remake and no floor, and
// Run's floorNow then noted the floor the server had moved past the
// skipped events (diff review of 399ac8e). An edit a look said first is
// not said at Error twice: the re-creation after it warns.
func TestFilterEditMetByAResubscribeIsLoggedWithTheRemake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, log, js, cfg, _ := filterEditSkipsAnEvent(t, ctx)
	const skipped = filterEditSkipped
	// What Run does when a session ends by itself: the consumer made
	// again (ensureAll), then the floor looked at before subscribing.
	if err := c.ensureConsumer(ctx, nil); err != nil {
		t.Fatal(err)
	}
	c.floorNow(ctx)
	errorLines := func() []string {
		var lines []string
		for l := range strings.Lines(log.String()) {
			if strings.Contains(l, "level=ERROR") && strings.Contains(l, "filter") {
				lines = append(lines, l)
			}
		}
		return lines
	}
	found := errorLines()
	if len(found) != 1 || !strings.Contains(found[0], "changing the consumer's filter to nats.filter_subject") {
		t.Fatalf("%d Error lines about the filter after the re-creation, want 1 saying it changes it; log:\n%s", len(found), log.String())
	}
	_, rest, ok := strings.Cut(found[0], "--deliver ")
	deliver, err := strconv.ParseUint(strings.Fields(rest + " x")[0], 10, 64)
	if !ok || err != nil {
		t.Fatalf("the Error line has no --deliver number:\n%s", found[0])
	}
	if requireUnattended(t, "ensureConsumer", found[0]); deliver > skipped {
		t.Fatalf("the remake delivers from %d, past the event the edit skipped (%d):\n%s", deliver, skipped, found[0])
	}
	if strings.Contains(found[0], "no ack floor under jetsink's filter is known") {
		t.Errorf("the Error line says no floor is known, though a look under jetsink's filter noted one:\n%s", found[0])
	}
	if why := c.refreshFloor(ctx); why != "" {
		t.Fatalf("the look after the re-creation found %q changed", why)
	}
	// Edited again, and a look says so first: the re-creation after it
	// warns, and the Error lines are the look's one more.
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) { cc.FilterSubject = subjectOf(cfg, 1, 2) })
	if why := c.refreshFloor(ctx); !strings.Contains(why, "filter_subject") {
		t.Fatalf("the look after the second edit found %q changed, want filter_subject", why)
	}
	if err := c.ensureConsumer(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if found := errorLines(); len(found) != 2 || !strings.Contains(found[1], "the consumer's filter was changed on the server") {
		t.Fatalf("%d Error lines about the filter after a look's and a re-creation, want 2, the look's last; log:\n%s", len(found), log.String())
	}
	if !strings.Contains(log.String(), "level=WARN msg=\"changing the consumer's filter") {
		t.Errorf("the re-creation after the look did not warn that it changes the filter; log:\n%s", log.String())
	}
}

// A rewrite of the durable's metadata (markReplaced, as checkSeq marks a
// replaced stream) keeps the filter the server has, and its record: an
// operator's edit is still there for the next look (refreshFloor), which
// sets it back and logs it at Error with the ack floor and the delivered
// sequence. Before, the rewrite set jetsink's filter back silently, and
// the look found nothing to say.
func TestMetadataUpdateKeepsAnEditedFilter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var c *Consumer
	cfg, log, r, js := startFilterTestRun(t, ctx, func(cc *Consumer) { c = cc })
	r.ackUntil(t, ctx, 1)
	waitFor(t, ctx, "both acks on the server", func() bool {
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return err == nil && cons.CachedInfo().AckFloor.Stream == 2
	})
	// Stopped, so that no look of the run's sets the edit back first: the
	// test looks itself, below, and here, to note the floor under
	// jetsink's filter (the remake starts past it: editFloor).
	r.stopClean(t, ctx)
	if why := c.refreshFloor(ctx); why != "" {
		t.Fatalf("the look before the edit found %q changed", why)
	}
	only := subjectOf(cfg, 0, 2)
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) { cc.FilterSubject = only })
	edited := onServerConfig(t, ctx, js, cfg)
	created := time.Now()
	if err := c.markReplaced(ctx, created, true); err != nil {
		t.Fatal(err)
	}
	cc := onServerConfig(t, ctx, js, cfg)
	if cc.Metadata[replacedKey] != replacedMark(created) {
		t.Fatalf("metadata %v after markReplaced, want %s set", cc.Metadata, replacedKey)
	}
	if cc.FilterSubject != only || len(cc.FilterSubjects) != 0 {
		t.Fatalf("filter %q %q after a metadata update, want the edit %q kept", cc.FilterSubject, cc.FilterSubjects, only)
	}
	for _, k := range []string{filterKey, filterSetAtKey} {
		if cc.Metadata[k] != edited.Metadata[k] {
			t.Fatalf("%s = %q after a metadata update, want %q as before it", k, cc.Metadata[k], edited.Metadata[k])
		}
	}
	look := func(line string) {
		t.Helper()
		if why := c.refreshFloor(ctx); !strings.Contains(why, "filter_subject") {
			t.Fatalf("the look after the update found %q changed, want filter_subject", why)
		}
		found := ""
		for l := range strings.Lines(log.String()) {
			if strings.Contains(l, "level=ERROR") && strings.Contains(l, line) &&
				strings.Contains(l, "ack_floor=2") && strings.Contains(l, "delivered=2") {
				found = l
			}
		}
		if found == "" {
			t.Fatalf("no Error line %q with ack_floor=2 delivered=2; log:\n%s", line, log.String())
		}
		// Its command makes the durable again from the floor's stream
		// sequence + 1, the number, and runs without asking.
		remake := "nats consumer rm " + cfg.Stream + " " + cfg.Consumer + " --force, then nats consumer add " + cfg.Stream + " " + cfg.Consumer +
			" --pull --ack explicit --deliver 3 --replay instant --defaults;"
		if !strings.Contains(found, remake) || requireUnattended(t, "run", found) != 1 {
			t.Fatalf("the Error line does not say %q:\n%s", remake, found)
		}
	}
	look("the consumer's filter was changed on the server")

	// Another jetsink's filter, recorded an hour ago and first seen as
	// long ago (its keep is over): kept with its record, which the look
	// needs to tell it from an edit.
	setAt := filterSetAt(time.Now().Add(-time.Hour), only)
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) {
		cc.Metadata[filterKey], cc.Metadata[filterSetAtKey] = only, setAt
	})
	c.filterSeen = &seenFilter{filter: only, at: time.Now().Add(-time.Hour)}
	if err := c.markReplaced(ctx, created, false); err != nil {
		t.Fatal(err)
	}
	cc = onServerConfig(t, ctx, js, cfg)
	if _, ok := cc.Metadata[replacedKey]; ok || cc.FilterSubject != only || cc.Metadata[filterKey] != only || cc.Metadata[filterSetAtKey] != setAt {
		t.Fatalf("filter %q, metadata %v after a metadata update; want %s cleared, and %q kept with its record (%s)",
			cc.FilterSubject, cc.Metadata, replacedKey, only, setAt)
	}
	look("another jetsink of this durable consumer set another filter, which this one first saw longer than keep_for ago")
}

// Two jetsinks of one durable configured with two filters, as in a
// rolling update that changes nats.filter_subject: the one that starts
// sets its filter, recorded in the durable's metadata, and the one
// running keeps it rather than set its own back, logging at Error (once
// a minute at most) what it consumes; a backoff it sets back keeps that
// filter too. Before, it set its own back within floorEvery, the new one
// its own at its next look, and so on, each swap skipping events for good.
func TestRunKeepsAnotherJetsinksFilter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, log, r, js := startFilterTestRun(t, ctx, nil)
	r.ackUntil(t, ctx, 1)
	onServer := func() jetstream.ConsumerConfig { return onServerConfig(t, ctx, js, cfg) }
	only := subjectOf(cfg, 0, 2)
	other := cfg
	other.FilterSubject = only
	c2, log2 := newLoggedConsumer(t, ctx, other) // the new instance, starting
	if err := c2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log2.String(), "changing the consumer's filter") {
		t.Fatalf("no Warn from the instance that changed the filter; log:\n%s", log2.String())
	}
	kept := func(cc jetstream.ConsumerConfig) bool {
		return cc.FilterSubject == only && cc.Metadata[filterKey] == only
	}
	if cc := onServer(); !kept(cc) {
		t.Fatalf("after the second instance started: filter %q, metadata %v; want %q in both", cc.FilterSubject, cc.Metadata, only)
	}
	// Many looks (floorEvery 100 ms), even on a slow machine.
	const logged = "another jetsink of this durable consumer consumes with another filter"
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if cc := onServer(); !kept(cc) || strings.Contains(log.String(), "the consumer's filter was changed on the server") {
			t.Fatalf("the running instance sets its filter back: filter %q, metadata %v; want %q kept; log:\n%s", cc.FilterSubject, cc.Metadata, only, log.String())
		}
	}
	waitFor(t, ctx, "the Error line", func() bool { return strings.Contains(log.String(), logged) })
	if n := strings.Count(log.String(), logged); n != 1 {
		t.Fatalf("%d Error lines about the other filter in 3 s, want 1 (once a minute); log:\n%s", n, log.String())
	}
	// A backoff is set back, and the filter kept with it.
	cc := onServer()
	cc.BackOff = []time.Duration{30 * time.Second, 2 * time.Second}
	if _, err := js.UpdateConsumer(ctx, cfg.Stream, cc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "backoff set back", func() bool { return len(onServer().BackOff) == 0 })
	if cc := onServer(); !kept(cc) {
		t.Fatalf("after the backoff was set back: filter %q, metadata %v; want %q kept", cc.FilterSubject, cc.Metadata, only)
	}
	// It consumes what that filter delivers.
	publish(t, ctx, js, cfg, 2, 2, 2)
	r.ackUntil(t, ctx, 2)
	r.stopClean(t, ctx)
}

// Another jetsink's filter is kept only for filterKeep since this one
// first saw it, then set back as an operator's edit is, logged at Error
// with the ack floor and the delivered sequence: the jetsink that set it
// may have stopped. The time recorded with it (filterSetAtKey) does not
// count, being another host's clock: a record without one, or with one an
// hour old, is kept as long. Before, it was kept for as long as this one
// ran, skipping its own subjects' events.
func TestRunSetsItsFilterBackAfterTheKeep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// 30 looks (floorEvery: 100 ms) to a keep: one late look does not
	// make a set-back early, nor one a second early (the time recorded,
	// cut to whole seconds) pass.
	const keep = 3 * time.Second
	cfg, log, r, js := startFilterTestRun(t, ctx, func(c *Consumer) { c.filterKeep = keep })
	r.ackUntil(t, ctx, 1)
	onServer := func() jetstream.ConsumerConfig { return onServerConfig(t, ctx, js, cfg) }
	only := subjectOf(cfg, 0, 2)
	kept := func(cc jetstream.ConsumerConfig) bool {
		return cc.FilterSubject == only && cc.Metadata[filterKey] == only
	}
	ours := func(cc jetstream.ConsumerConfig) bool {
		return cc.FilterSubject == "" && len(cc.FilterSubjects) == 0 && cc.Metadata[filterKey] == ""
	}
	errorLines := func(msg string) int {
		n := 0
		for line := range strings.Lines(log.String()) {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, msg) && strings.Contains(line, "keep_for="+keep.String()) &&
				strings.Contains(line, "ack_floor=") && strings.Contains(line, "delivered=") {
				n++
			}
		}
		return n
	}
	const keptLine, setBackLine = "which this one keeps until keep_until", "which this one first saw longer than keep_for ago"

	// Another jetsink sets its filter, with the time. The keep is
	// measured from before it starts, which is before the running one
	// can first see its filter: not from the time recorded, cut to whole
	// seconds, which would let a set-back up to a second early pass.
	other := cfg
	other.FilterSubject = only
	started := time.Now()
	c2 := newConsumer(t, ctx, other)
	if err := c2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cc := onServer()
	ts, f, _ := strings.Cut(cc.Metadata[filterSetAtKey], " ")
	if _, err := time.Parse(time.RFC3339, ts); !kept(cc) || err != nil || f != only {
		t.Fatalf("after the second instance started: filter %q, metadata %v; want %q recorded with the time", cc.FilterSubject, cc.Metadata, only)
	}
	waitFor(t, ctx, "the Error line of the keep", func() bool { return errorLines(keptLine) > 0 })
	if cc := onServer(); !kept(cc) && time.Since(started) < keep {
		t.Fatalf("set back within the keep: filter %q, metadata %v", cc.FilterSubject, cc.Metadata)
	}
	waitFor(t, ctx, "its own filter set back", func() bool { return ours(onServer()) })
	if d := time.Since(started); d < keep {
		t.Fatalf("set its own filter back %v after the other's was set, want %v or more", d, keep)
	}
	waitFor(t, ctx, "the Error line of the set-back", func() bool { return errorLines(setBackLine) > 0 })
	if ts, f, _ := strings.Cut(onServer().Metadata[filterSetAtKey], " "); f != "" || ts == "" {
		t.Fatalf("%s = %q after the set-back, want the time and its own filter", filterSetAtKey, onServer().Metadata[filterSetAtKey])
	}

	// A record without a time, as jetsink 26294e5 wrote it: kept for
	// filterKeep since this one first saw it; so is the same one set
	// again at once after this one set its own back, with the time of
	// another filter left from before (26294e5 keeps the keys it does
	// not know), which does not count.
	var edited time.Time
	for i := range 2 {
		cc = onServer()
		cc.FilterSubject = only
		cc.Metadata[filterKey] = only
		delete(cc.Metadata, filterSetAtKey)
		if i == 1 {
			cc.Metadata[filterSetAtKey] = filterSetAt(time.Now().Add(-time.Hour), "")
		}
		edited = time.Now()
		if _, err := js.UpdateConsumer(ctx, cfg.Stream, cc); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "its own filter set back", func() bool { return ours(onServer()) })
		if d := time.Since(edited); d < keep {
			t.Fatalf("set its own filter back %v after a record without a time (%d), want %v or more", d, i+1, keep)
		}
		waitFor(t, ctx, "the Error line of the set-back", func() bool { return errorLines(setBackLine) > 1+i })
	}

	// A record whose time says it was set an hour ago (by a jetsink that
	// stopped, or on a host whose clock is behind): kept for filterKeep
	// all the same, since this one first saw it: the writer's clock is
	// not this one's.
	cc = onServer()
	cc.FilterSubject = only
	cc.Metadata[filterKey] = only
	cc.Metadata[filterSetAtKey] = filterSetAt(time.Now().Add(-time.Hour), only)
	edited = time.Now()
	if _, err := js.UpdateConsumer(ctx, cfg.Stream, cc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "its own filter set back", func() bool { return ours(onServer()) })
	if d := time.Since(edited); d < keep {
		t.Fatalf("set its own filter back %v after a record timed an hour ago, want %v or more (the keep counts on this clock)", d, keep)
	}
	waitFor(t, ctx, "the last Error line of the set-back", func() bool { return errorLines(setBackLine) > 3 })
	if strings.Contains(log.String(), "the consumer's filter was changed on the server") {
		t.Fatalf("another jetsink's filter taken for an operator's edit; log:\n%s", log.String())
	}
	// Both subjects flow again.
	publish(t, ctx, js, cfg, 2, 2, 2)
	r.ackUntil(t, ctx, 3)
	r.stopClean(t, ctx)
}

// ensureConsumer, applying its own filter, forgets when it first saw
// another jetsink's: that filter, set again later, is seen anew and kept
// for filterKeep from then. Remembered, the keep counted from the first
// sight, and the filter set again after this one set its own back was set
// back at once (the two swapping it, each swap skipping events).
// othersFilter forgets it too, at a look that finds the own filter, but a
// look may find the other's set again first; this test has no run, and
// so no look.
func TestApplyingItsOwnFilterForgetsAnothersFirstSight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	only := subjectOf(cfg, 0, 2)
	setOthers := func(cc *jetstream.ConsumerConfig) {
		cc.FilterSubject = only
		cc.Metadata[filterKey] = only
		cc.Metadata[filterSetAtKey] = filterSetAt(time.Now(), only)
	}
	editOnServer(t, ctx, js, cfg, setOthers)
	// First seen an hour ago: the keep is over, and ensureConsumer applies
	// its own filter.
	c.filterSeen = &seenFilter{filter: only, at: time.Now().Add(-time.Hour)}
	if err := c.ensureConsumer(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if cc := onServerConfig(t, ctx, js, cfg); cc.FilterSubject != "" || len(cc.FilterSubjects) != 0 || cc.Metadata[filterKey] != "" {
		t.Fatalf("filter %q %q, metadata %v after the keep; want its own (none) applied", cc.FilterSubject, cc.FilterSubjects, cc.Metadata)
	}
	// Set again: first seen now.
	editOnServer(t, ctx, js, cfg, setOthers)
	cc := onServerConfig(t, ctx, js, cfg)
	before := time.Now()
	f, at, ok := c.othersFilter(&cc)
	if !ok || f != only || at.Before(before) {
		t.Fatalf("othersFilter = %q, first seen %v ago, %v; want %q first seen now", f, time.Since(at).Round(time.Second), ok, only)
	}
	if !c.keepsOthers(at) {
		t.Fatal("the filter set again is not kept")
	}
}

// A subject delete marker (a message JetStream stores itself when a
// subject's last message ages out, with subject_delete_marker_ttl) is no
// event: acked, counted, not handed on. Before, it went to the pipeline
// with an empty body, to be dead-lettered as invalid JSON or stored as an
// empty row.
func TestRunSkipsSubjectDeleteMarkers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	js := jsFor(t, srv)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, MaxAge: time.Second,
		AllowMsgTTL: true, SubjectDeleteMarkerTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 1, 1, 0)
	// The message ages out, and the marker takes its place.
	waitFor(t, ctx, "the marker", func() bool {
		info, err := js.Stream(ctx, cfg.Stream)
		return err == nil && info.CachedInfo().State.LastSeq == 2
	})
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 1, 1, 1)
	r := startRun(t, ctx, c, 1, 64, 1000)
	g := r.next(t, ctx)
	if i := bodyIndex(t, &g.ev); i != 1 || g.ev.StreamSeq != 3 {
		t.Fatalf("first event handed on: body %d, stream_seq %d; want the one published after the marker (1, 3)", i, g.ev.StreamSeq)
	}
	if err := g.ev.Msg.Ack(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "every message acked", func() bool {
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return err == nil && cons.CachedInfo().AckFloor.Stream == 3
	})
	// Received counts an event once its push returned, which may be after
	// the ring handed it on.
	waitFor(t, ctx, "the event counted", func() bool { return c.Stats().Received == 1 })
	if st := c.Stats(); st.Markers != 1 || st.Received != 1 {
		t.Fatalf("stats %+v; want 1 marker, 1 event received", st)
	}
	r.stopClean(t, ctx)
}

// A message schedule (Nats-Schedule, on a stream with allow_msg_schedules)
// is no event: acked, counted, not handed on; the copy the server stores
// on the target subject when it fires is the event. Before, both were
// handed on, the schedule before its time. Both pull clients. With a
// server before 2.12 (played: serverVersion replaced), where the header
// means nothing, a message with it is an event, handed on: it was acked
// and dropped.
func TestRunSkipsMessageSchedules(t *testing.T) {
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		for _, version := range []string{"", "2.11.9"} {
			t.Run(client+"/"+cmp.Or(version, "this server"), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				if version != "" {
					t.Cleanup(func() { serverVersion = (*nats.Conn).ConnectedServerVersion })
					serverVersion = func(*nats.Conn) string { return version }
				}
				srv := testenv.NATS(t)
				cfg := testConfig(t, srv)
				cfg.PullClient = client
				js := jsFor(t, srv)
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects,
					AllowMsgSchedules: true}); err != nil {
					t.Fatal(err)
				}
				c := newConsumer(t, ctx, cfg)
				r := startRun(t, ctx, c, 1, 64, 1000)
				target := subjectOf(cfg, 1, 2)
				// An empty Nats-Schedule is no schedule: the server stores it
				// as any message, on any stream.
				e := &nats.Msg{Subject: subjectOf(cfg, 0, 2), Data: []byte("1"), Header: nats.Header{"Nats-Schedule": {""}}}
				if _, err := js.PublishMsg(ctx, e); err != nil {
					t.Fatal(err)
				}
				if g := r.next(t, ctx); g.ev.StreamSeq != 1 || bodyIndex(t, &g.ev) != 1 {
					t.Fatalf("first event handed on: %s:%d; want the one with an empty Nats-Schedule (1)", g.ev.Subject, g.ev.StreamSeq)
				} else if err := g.ev.Msg.Ack(); err != nil {
					t.Fatal(err)
				}
				m := &nats.Msg{Subject: subjectOf(cfg, 0, 2), Data: []byte("7"), Header: nats.Header{}}
				m.Header.Set("Nats-Schedule", "@at "+time.Now().Add(2*time.Second).UTC().Format(time.RFC3339))
				m.Header.Set("Nats-Schedule-Target", target)
				if _, err := js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
				schedules, received := uint64(1), uint64(2)
				if version != "" {
					// Before 2.12: the message with the header is an event.
					g := r.next(t, ctx)
					if g.ev.Subject != m.Subject || g.ev.StreamSeq != 2 || bodyIndex(t, &g.ev) != 7 {
						t.Fatalf("event after the first: %s:%d; want the one with Nats-Schedule (server %s), %s:2", g.ev.Subject, g.ev.StreamSeq, version, m.Subject)
					}
					if err := g.ev.Msg.Ack(); err != nil {
						t.Fatal(err)
					}
					schedules, received = 0, 3
				}
				g := r.next(t, ctx)
				if g.ev.Subject != target || g.ev.StreamSeq != 3 || bodyIndex(t, &g.ev) != 7 {
					t.Fatalf("event after the schedule: %s:%d; want the fired copy on %s:3", g.ev.Subject, g.ev.StreamSeq, target)
				}
				if err := g.ev.Msg.Ack(); err != nil {
					t.Fatal(err)
				}
				waitFor(t, ctx, "the events counted", func() bool { return c.Stats().Received == received })
				if st := c.Stats(); st.Schedules != schedules || st.Received != received || st.Markers != 0 {
					t.Fatalf("stats %+v; want %d schedules, %d events received", st, schedules, received)
				}
				waitFor(t, ctx, "every message acked", func() bool {
					cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
					return err == nil && cons.CachedInfo().AckFloor.Stream == 3
				})
				r.stopClean(t, ctx)
			})
		}
	}
}

// A server's version is 2.12 or later, or not, as its INFO spells it; one
// that does not parse is not (nothing is taken for a schedule then).
func TestVersionAtLeast(t *testing.T) {
	for v, want := range map[string]bool{
		"2.12.0": true, "2.12.0-RC.1": true, "v2.14.3": true, "2.15.2": true, "3.0.0": true, "2.100.0": true,
		"2.11.9": false, "2.11.10-beta": false, "2.9.25": false, "1.99.0": false,
		"": false, "2": false, "x.12.0": false, "2.x": false,
	} {
		if got := versionAtLeast(v, 2, 12); got != want {
			t.Errorf("versionAtLeast(%q, 2, 12) = %v, want %v", v, got, want)
		}
	}
}

// Empty messages whose publisher set headers JetStream also writes (a
// Nats-Msg-Size, as a republish with headers_only sends; a
// Nats-Marker-Reason without the marker's roll-up) are events, handed on
// as before: not nak'ed in a loop of sessions, not acked unseen.
func TestRunHandsOnEmptyMessagesWithJetStreamsHeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	for _, h := range []string{"Nats-Msg-Size", "Nats-Marker-Reason"} {
		m := &nats.Msg{Subject: subjectOf(cfg, 0, 1), Header: nats.Header{}}
		m.Header.Set(h, "5")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	r := startRun(t, ctx, c, 1, 64, 1000)
	for seq := uint64(1); seq <= 2; seq++ {
		g := r.next(t, ctx)
		if g.ev.StreamSeq != seq || len(g.ev.Data) != 0 {
			t.Fatalf("event %d: stream_seq %d, %d bytes; want stream_seq %d, empty", seq, g.ev.StreamSeq, len(g.ev.Data), seq)
		}
		if err := g.ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.Markers != 0 || st.Resubscribes != 0 {
		t.Fatalf("stats %+v; want no marker, no session ended", st)
	}
	r.stopClean(t, ctx)
}

// pullLimits names each limit of the consumer's on one pull that refuses
// jetsink's pulls, and the setting to lower.
func TestPullLimits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PullMaxMessages, cfg.PullExpiry, cfg.PullMaxBytes = 500, 30*time.Second, 0
	for _, tc := range []struct {
		cc   jetstream.ConsumerConfig
		want string
	}{
		{jetstream.ConsumerConfig{}, ""},
		{jetstream.ConsumerConfig{MaxRequestBatch: 500, MaxRequestExpires: time.Minute}, ""},
		{jetstream.ConsumerConfig{MaxRequestBatch: 100}, "max_request_batch 100 (set nats.pull_max_messages to 100 or less)"},
		{jetstream.ConsumerConfig{MaxRequestExpires: 10 * time.Second}, "max_request_expires 10s (set nats.pull_expiry to 10s or less)"},
		{jetstream.ConsumerConfig{MaxRequestMaxBytes: 1 << 20}, "max_request_max_bytes 1048576 (set nats.pull_max_bytes to 1048576 or less)"},
	} {
		if got := pullLimits(tc.cc, &cfg); got != tc.want {
			t.Errorf("pullLimits(%+v) = %q, want %q", tc.cc, got, tc.want)
		}
	}
	cfg.PullMaxBytes = 1 << 20
	if got := pullLimits(jetstream.ConsumerConfig{MaxRequestMaxBytes: 1 << 20}, &cfg); got != "" {
		t.Errorf("pull_max_bytes at the limit: %q, want none", got)
	}
}

// A server that refuses the user's acks (no publish permission on
// $JS.ACK) answers each with an error on the connection: logged at most
// once every asyncErrEvery, with the number held back, not a line per ack;
// the first says what it costs, and AcksRefused (the readiness check)
// reports it. Every event would otherwise come again after ack_wait, and
// be written again, with nothing but those lines to say so.
func TestRefusedAcksLogBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, cfg, reload := permissionsServer(t, ctx)
	c, log := newLoggedConsumer(t, ctx, cfg)
	const n = 300
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	r.ackUntil(t, ctx, 0)
	if err := c.AcksRefused(); err != nil {
		t.Fatalf("AcksRefused with acks allowed: %v", err)
	}
	reload("$JS.ACK.>")
	publish(t, ctx, js, cfg, n, 1, 1)
	began := time.Now()
	for range n {
		_ = r.next(t, ctx).ev.Msg.Ack()
	}
	waitFor(t, ctx, "a refused ack to be logged", func() bool { return strings.Contains(log.String(), "Permissions Violation") })
	time.Sleep(asyncErrEvery / 2) // the rest of the refusals come meanwhile
	lines := strings.Count(log.String(), "Permissions Violation")
	// The async error's or subscription's lines, and the first refusal's.
	if most := 3 * (1 + int(time.Since(began)/asyncErrEvery)); lines > most {
		t.Fatalf("%d refused acks logged %d lines in %v, want at most %d:\n%s", n, lines, time.Since(began), most, log)
	}
	if got := strings.Count(log.String(), "the server refuses jetsink's acks"); got != 1 {
		t.Fatalf("%d lines saying the acks are refused, want 1:\n%s", got, log)
	}
	if err := c.AcksRefused(); err == nil || !strings.Contains(err.Error(), "Permissions Violation") {
		t.Fatalf("AcksRefused = %v, want the server's refusal", err)
	}
	r.cancel()
}

// A user who may look at the stream and the consumer and ack, but not
// publish to the pull subject ($JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>):
// the server refuses each pull with an -ERR, nothing answers it, and each
// look at the consumer succeeds. NotConsuming reports it after stuckAfter,
// naming the subject to allow, and keeps reporting it through the looks
// at the consumer that the missed heartbeats bring and the floor's, which
// cleared what there was before (the readiness check stayed green while
// nothing was consumed). Once the permission is back, the heartbeats that
// come clear it, before any message; the events come. (With either pull
// client, JETSINK_TEST_PULL_CLIENT: nats.go's refusals come as its
// connection's async errors, wire's as its Sub's; make test runs both.)
func TestRefusedPullsNotConsuming(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, cfg, reload := permissionsServer(t, ctx)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.stuckAfter = 300 * time.Millisecond
	c.floorEvery = 200 * time.Millisecond
	c.recheckGap = time.Second
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	r.ackUntil(t, ctx, 0)

	subject := "$JS.API.CONSUMER.MSG.NEXT." + cfg.Stream + "." + cfg.Consumer
	reload(subject)
	reported := func() bool {
		err := c.NotConsuming()
		return err != nil && strings.Contains(err.Error(), "permission to publish to "+subject)
	}
	waitFor(t, ctx, "NotConsuming to name the pull subject", reported)
	states := strings.Count(log.String(), "consumer state") // a look at the consumer that succeeded
	misses := c.Stats().HeartbeatsMissing
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for until := time.Now().Add(c.recheckGap + 2*time.Second); time.Now().Before(until); <-tick.C {
		if !reported() {
			t.Fatalf("NotConsuming = %v, want the refused pulls still", c.NotConsuming())
		}
	}
	if strings.Count(log.String(), "consumer state") == states || c.Stats().HeartbeatsMissing == misses {
		t.Fatalf("no missed heartbeat and look at the consumer meanwhile; the test proves nothing:\n%s", log)
	}
	if n := strings.Count(log.String(), "the server refuses jetsink's pulls"); n != 1 {
		t.Errorf("%d lines saying the pulls are refused, want 1", n)
	}

	reload()
	waitFor(t, ctx, "NotConsuming to clear once the pulls get through", func() bool { return c.NotConsuming() == nil })
	publish(t, ctx, js, cfg, 1, 1, 1)
	r.ackUntil(t, ctx, 1)
	r.stopClean(t, ctx)
}

// Under noDeadline (what Run makes of its contexts), a JetStream API
// request the server never answers (a stream electing its leader) ends at
// nats.go's default timeout, not at the caller's deadline: Run retries it
// instead of not consuming until then. A cluster test hit it: killing the
// consumer's leader stalled an exactly-once run for the test's 3 minutes.
func TestAPIRequestsEndAtTheDefaultTimeoutUnderADeadline(t *testing.T) {
	srv := testenv.NATS(t)
	nc := srv.Connect(t)
	// Takes the request and answers nothing (JetStream answers too, but
	// not for a stream of another account's API prefix: none here).
	sub, err := nc.Subscribe("$JS.SILENT.API.>", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	js, err := jetstream.NewWithAPIPrefix(nc, "$JS.SILENT.API", jetstream.WithDefaultTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		ends bool // within 3 s
	}{{"noDeadline", noDeadline{ctx}, true}, {"the caller's deadline", ctx, false}} {
		rctx, rcancel := context.WithCancel(tc.ctx)
		done := make(chan error, 1)
		go func() { _, err := js.Stream(rctx, "S"); done <- err }()
		select {
		case err := <-done:
			if !tc.ends || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: the request ended (%v); want it to end at the default timeout: %v", tc.name, err, tc.ends)
			}
		case <-time.After(3 * time.Second):
			if tc.ends {
				t.Errorf("%s: the request still waits after 3s, past the default timeout", tc.name)
			}
			rcancel()
			<-done
		}
		rcancel()
	}
}

// An operator's filter edit that ensureConsumer says at Error is said once,
// though the update that sets jetsink's filter back fails and Run retries it
// every few seconds: here the stream's consumer_limits.max_ack_pending (10)
// refuses jetsink's (err_code 10121) after the operator lowered the
// durable's to fit it. Before, each retry logged the Error with its remake
// steps again (diff review of 7d5412d: 3 calls, 3 Error lines).
func TestFilterEditErrorSaidOnceThoughTheUpdateFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.FilterSubject = subjectOf(cfg, 0, 2)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = time.Hour
	js := jsFor(t, srv)
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) {
		cc.FilterSubject = subjectOf(cfg, 1, 2)
		cc.MaxAckPending = 10
	})
	sc := streamConfig(t, ctx, js, cfg.Stream)
	sc.ConsumerLimits.MaxAckPending = 10
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := c.ensureConsumer(ctx, nil); err == nil {
			t.Fatal("ensureConsumer set max_ack_pending above the stream's consumer_limits")
		}
	}
	n := 0
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "level=ERROR") && strings.Contains(l, "changing the consumer's filter") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d Error lines saying the filter changes after 3 failed updates, want 1; log:\n%s", n, log.String())
	}
}

// filterEditSkipped is the stream sequence of the event of jetsink's
// filter that filterEditSkipsAnEvent's operator edit skips.
const filterEditSkipped = 3

// filterEditSkipsAnEvent plays an operator's filter edit that skips an
// event of jetsink's filter: a consumer on s0 (its looks are the test's)
// takes and acks event 1 and notes the floor under its filter; the
// durable's filter is edited to s1; event 3 (s0) is published and never
// delivered, and a client of the durable takes and acks s1's events until
// the server has moved the ack floor past it. It returns the durable's
// info then.
func filterEditSkipsAnEvent(t *testing.T, ctx context.Context) (*Consumer, *syncBuffer, jetstream.JetStream, Config, *jetstream.ConsumerInfo) {
	t.Helper()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.FilterSubject = subjectOf(cfg, 0, 2)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = time.Hour // the test looks itself
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 2, 2, 0) // 1: s0 (jetsink's), 2: s1
	r := startRun(t, ctx, c, 1, 64, 1000)
	r.ackUntil(t, ctx, 0)
	waitFor(t, ctx, "the ack on the server", func() bool {
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return err == nil && cons.CachedInfo().AckFloor.Stream >= 1 && cons.CachedInfo().NumAckPending == 0
	})
	r.stopClean(t, ctx)
	if why := c.refreshFloor(ctx); why != "" {
		t.Fatalf("the look under jetsink's filter found %q changed", why)
	}
	// An operator's edit, and a client of the durable under it.
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) { cc.FilterSubject = subjectOf(cfg, 1, 2) })
	publish(t, ctx, js, cfg, 2, 2, 2) // 3: s0, 4: s1
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	// It takes s1's events (2, unless the run's pull took the server
	// past it, and 4) and acks them: the floor goes past 3.
	var ci *jetstream.ConsumerInfo
	waitFor(t, ctx, "the durable's ack floor past the event the edit skipped", func() bool {
		batch, err := cons.FetchNoWait(10)
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if ci, err = cons.Info(ctx); err != nil {
			t.Fatal(err)
		}
		return ci.AckFloor.Stream > filterEditSkipped
	})
	return c, log, js, cfg, ci
}

// publishPastFloor publishes events 10 to 19 and acks them as r delivers
// them, failing at any of events 0 to 9 (acked before the durable was
// lost: ackUntilFloor) delivered again.
func publishPastFloor(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config, r *runner) {
	t.Helper()
	publish(t, ctx, js, cfg, 10, 2, 10)
	for range 10 {
		g := r.next(t, ctx)
		if i := bodyIndex(t, &g.ev); i < 10 {
			t.Fatalf("event %d, acked before the consumer was deleted, delivered again", i)
		}
		if err := g.ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
}

// ackUntilFloor acks the next n events r delivers, then waits until serve
// has learnt the durable's ack floor at n (resumeFloor), as a remake of
// the durable starts past it.
func ackUntilFloor(t *testing.T, ctx context.Context, r *runner, c *Consumer, n uint64) {
	t.Helper()
	for range n {
		if err := r.next(t, ctx).ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ctx, "serve to learn the ack floor", func() bool { return c.resumeFloor.Load() == n })
}

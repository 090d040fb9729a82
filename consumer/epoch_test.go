package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
	"github.com/jetsink/jetsink/tests/testenv"
)

// A stream re-created by someone else from sequence 1 while its events are
// in flight: the new events come in a new epoch, an old event's dead letter
// is stored without terminating the new event that now has its sequence,
// and the two events with one sequence get a dead letter each. The direct
// ack at the end shows what the epoch guards against: the server matches an
// old event's ack to the new event by sequence alone.
func TestEpochKeepsOldSettlementsOffANewStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false // the operator owns the stream
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream + "_DLQ", Subjects: []string{cfg.DeadLetterSubject}}); err != nil {
		t.Fatal(err)
	}
	c, r := operatorStream(t, ctx, js, cfg, 3, 1000)
	old := takeN(t, ctx, r, 3)
	first := c.Epochs().Current()
	for _, ev := range old {
		if ev.Epoch != first {
			t.Fatalf("old event %d in epoch %d, want %d", ev.StreamSeq, ev.Epoch, first)
		}
	}

	recreateStream(t, ctx, js, cfg, 0)
	publish(t, ctx, js, cfg, 3, 1, 10)
	var fresh []pipeline.Event
	for len(fresh) < 3 {
		ev := r.next(t, ctx).ev
		if bodyIndex(t, &ev) < 10 {
			continue // an old event redelivered before the delete: not possible here, but not the point
		}
		fresh = append(fresh, ev)
	}
	second := c.Epochs().Current()
	if second == first {
		t.Fatalf("epoch still %d after the stream was re-created", first)
	}
	for _, ev := range fresh {
		if ev.Epoch != second {
			t.Fatalf("new event %d in epoch %d, want %d", ev.StreamSeq, ev.Epoch, second)
		}
	}
	if fresh[0].StreamSeq != old[0].StreamSeq {
		t.Fatalf("new stream starts at %d, old at %d: the test needs them to share sequences", fresh[0].StreamSeq, old[0].StreamSeq)
	}
	ackPending := func() int {
		t.Helper()
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending
	}
	waitFor(t, ctx, "the new events pending", func() bool { return ackPending() == 3 })

	// The old event's dead letter is stored; the new event with its
	// sequence stays pending.
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "test", Reason: "old"}
	heldBefore, _ := c.InFlightBytes()
	if err := c.DeadLetter(ctx, &old[0], dl); err != nil {
		t.Fatalf("DeadLetter(old): %v", err)
	}
	if st := c.Stats(); st.StaleTerms != 1 || st.DeadLettered != 1 {
		t.Fatalf("stale terms %d, dead lettered %d; want 1 and 1", st.StaleTerms, st.DeadLettered)
	}
	// Not terminated, but its life here is over: the in-flight budget
	// has its bytes back (wire's messages hold them).
	if cfg.PullClient != PullClientNATSGo && heldBefore == 0 {
		t.Error("no in-flight bytes held by the wire client's messages")
	}
	if held, _ := c.InFlightBytes(); heldBefore > 0 && held >= heldBefore {
		t.Errorf("in-flight bytes %d after the stale dead letter, %d before: not given back", held, heldBefore)
	}
	// The new event with the same sequence gets its own dead letter and
	// is terminated.
	if err := c.DeadLetter(ctx, &fresh[0], dl); err != nil {
		t.Fatalf("DeadLetter(new): %v", err)
	}
	dlq, err := js.Stream(ctx, cfg.Stream+"_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("dead-letter stream holds %d letters, want 2 (one per event, though they share a sequence)", info.State.Msgs)
	}
	waitFor(t, ctx, "only the terminated new event to leave the pending set", func() bool { return ackPending() == 2 })

	// An old event's dead letter that fails naks nothing: the nak would
	// send the new event with its sequence back, in nakDelay(1). (It is
	// published again until ctx ends: TestStaleDeadLetterOutlastsOutage.)
	if err := js.DeleteStream(ctx, cfg.Stream+"_DLQ"); err != nil {
		t.Fatal(err)
	}
	hard, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	if err := c.DeadLetter(hard, &old[2], dl); !errors.Is(err, ErrDeadLetter) || !errors.Is(err, pipeline.ErrStaleEpoch) {
		t.Fatalf("DeadLetter(old) without a dead-letter stream = %v, want ErrDeadLetter and pipeline.ErrStaleEpoch", err)
	}
	select {
	case g := <-r.events:
		t.Fatalf("event %d delivered again (delivery %d) after an old event's failed dead letter", g.ev.StreamSeq, g.ev.Delivered)
	case <-time.After(nakDelay(1) + time.Second):
	}

	// What the epoch prevents: acking the old event whose sequence the
	// second new event now has settles that new event.
	if old[1].StreamSeq != fresh[1].StreamSeq {
		t.Fatalf("sequences %d and %d differ", old[1].StreamSeq, fresh[1].StreamSeq)
	}
	if err := old[1].Msg.Ack(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the old ack to settle the new event", func() bool { return ackPending() == 1 })
	r.stopClean(t, ctx)
}

// A poison event taken before its stream was re-created, whose dead
// letter fails after that (the dead-letter stream does not answer, the
// breaker is open): it cannot be nak'ed, and no stream holds it any more,
// so its letter is published again until the dead-letter stream answers,
// 2 s later, and stored then; before, it was given up after one try, and
// the event lost. At a hard stop before a letter is stored the loss is
// logged at Error.
func TestStaleDeadLetterOutlastsOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = 8 * time.Second // a dead-letter publish may take 1 s
	js := jsFor(t, srv)
	makeStream(t, ctx, js, cfg)
	cfg.CreateStream = false // the operator owns both streams
	c, log := newLoggedConsumer(t, ctx, cfg)
	nc := srv.Connect(t)
	silent, err := nc.SubscribeSync(cfg.DeadLetterSubject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 3, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	evs := takeN(t, ctx, r, 3)
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}

	// A publish nobody answers opens the breaker; then nobody listens at
	// all, so that the probes are refused at once, and it stays open.
	if err := c.DeadLetter(ctx, &evs[0], dl); !errors.Is(err, ErrDeadLetter) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DeadLetter with nobody answering = %v, want ErrDeadLetter wrapping context.DeadlineExceeded", err)
	}
	if err := silent.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	first := c.Epochs().Current()
	recreateStream(t, ctx, js, cfg, 0)
	waitFor(t, ctx, "a new epoch", func() bool { return c.Epochs().Current() != first })

	stored := make(chan error, 1)
	go func() { stored <- c.DeadLetter(ctx, &evs[1], dl) }()
	select {
	case err := <-stored:
		t.Fatalf("DeadLetter of an event of the replaced stream = %v before any dead-letter stream answered; want it to keep trying", err)
	case <-time.After(2 * time.Second):
	}
	dlq := dlqStream(t, ctx, js, cfg)
	select {
	case err := <-stored:
		if err != nil {
			t.Fatalf("DeadLetter of an event of the replaced stream, the dead-letter stream back = %v, want nil", err)
		}
	case <-ctx.Done():
		t.Fatalf("the stale dead letter was not stored once the dead-letter stream answered: %v", ctx.Err())
	}
	m, err := dlq.GetLastMsgForSubject(ctx, cfg.DeadLetterSubject)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Header.Get(HeaderStreamSeq), strconv.FormatUint(evs[1].StreamSeq, 10); got != want {
		t.Fatalf("dead letter of stream_seq %s stored, want %s", got, want)
	}
	if st := c.Stats(); st.DeadLettered != 1 || st.StaleTerms != 1 {
		t.Fatalf("stats %+v; want 1 dead lettered, 1 stale term (the new stream's event with its sequence left alone)", st)
	}

	// A hard stop first: given up, and logged at Error with what was lost.
	if err := js.DeleteStream(ctx, dlq.CachedInfo().Config.Name); err != nil {
		t.Fatal(err)
	}
	hard, stop := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer stop()
	if err := c.DeadLetter(hard, &evs[2], dl); !errors.Is(err, ErrDeadLetter) || !errors.Is(err, pipeline.ErrStaleEpoch) {
		t.Fatalf("DeadLetter of an event of the replaced stream at a hard stop = %v, want ErrDeadLetter and pipeline.ErrStaleEpoch", err)
	}
	lost := false
	for line := range strings.Lines(log.String()) {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, "gave up the dead letter") &&
			strings.Contains(line, "stream_seq="+strconv.FormatUint(evs[2].StreamSeq, 10)) && strings.Contains(line, "subject="+evs[2].Subject) {
			lost = true
		}
	}
	if !lost {
		t.Fatalf("no Error line for the stale dead letter given up; log:\n%s", log.String())
	}
	r.stopClean(t, ctx)
}

// A consumer sequence that goes back within a session (the consumer was
// re-created under it) starts a new epoch before the event is pushed.
func TestEpochAdvancesWhenConsumerSequenceGoesBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	c := newConsumer(t, ctx, testConfig(t, srv))
	out := ringq.NewDispatch(1, 16, key)
	defer out.Close()
	s := &session{}
	reply := func(cseq int) string {
		return fmt.Sprintf("$JS.ACK.S.C.1.%d.%d.%d.0", cseq, cseq, time.Now().UnixNano())
	}
	pushed := func(cseq int) pipeline.Event {
		t.Helper()
		msg := &fakeMsg{reply: reply(cseq), header: nats.Header{}}
		if err := c.push(ctx, out, msg, s); err != nil {
			t.Fatal(err)
		}
		ev, ok := out.Ring(0).TryPop()
		if !ok {
			t.Fatal("pushed event not in the ring")
		}
		return ev
	}
	a, b := pushed(5), pushed(6)
	if a.Epoch != b.Epoch || c.Stats().Epochs != 0 {
		t.Fatalf("epochs %d, %d (%d new) for rising consumer sequences", a.Epoch, b.Epoch, c.Stats().Epochs)
	}
	back := pushed(1)
	if back.Epoch == b.Epoch || back.Epoch != c.Epochs().Current() || c.Stats().Epochs != 1 {
		t.Fatalf("after the consumer sequence went back: epoch %d, before %d, current %d, %d new",
			back.Epoch, b.Epoch, c.Epochs().Current(), c.Stats().Epochs)
	}
}

// A consumer deleted and re-created on the same stream reuses no
// sequence: the acks of the events on their way still settle the right
// events, so no new epoch begins.
func TestEpochKeptWhenOnlyTheConsumerIsRecreated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	r := startRun(t, ctx, c, 1, 64, 1000)
	publish(t, ctx, js, cfg, 1, 1, 0)
	before := r.next(t, ctx).ev
	if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the consumer re-created", func() bool { return c.Stats().Resubscribes > 0 })
	publish(t, ctx, js, cfg, 1, 1, 1)
	var after pipeline.Event
	for after.Data == nil || bodyIndex(t, &after) != 1 {
		after = r.next(t, ctx).ev // the first event may come again from the new consumer
	}
	if after.Epoch != before.Epoch || c.Stats().Epochs != 0 {
		t.Fatalf("epoch %d -> %d (%d new) after only the consumer was re-created", before.Epoch, after.Epoch, c.Stats().Epochs)
	}
	r.stopClean(t, ctx)
}

// recheck, after missed heartbeats, tells a stream re-created with its
// consumer (someone else's doing, without a 409 to end the session) from
// the same stream, and a consumer gone from its stream.
func TestRecheckSeesAReplacedStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, cfg, c := enteredConsumer(t, ctx)
	if leave, replaced := c.recheck(ctx); leave || replaced {
		t.Fatalf("same stream and consumer: leave %v, replaced %v", leave, replaced)
	}
	if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	if leave, replaced := c.recheck(ctx); !leave || replaced {
		t.Fatalf("consumer deleted: leave %v, replaced %v; want true, false", leave, replaced)
	}
	recreateStream(t, ctx, js, cfg, 0)
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, c.consumerConfig(nil, nil)); err != nil {
		t.Fatal(err)
	}
	if leave, replaced := c.recheck(ctx); !leave || !replaced {
		t.Fatalf("stream and consumer re-created: leave %v, replaced %v; want true, true", leave, replaced)
	}
}

// At-least-once, a stream and consumer deleted and re-created from 1 while
// the connection is down answer nats.go's pulls after the reconnect with no
// 409 and no missed heartbeat: the events taken before become stale, and
// every new event comes (again, if need be) in the current epoch. serve's
// look at the stream after the reconnect or push's check of the consumer
// sequence catches it: which one depends on whether jetsink reconnects
// before or after the operator's script re-creates the stream (both race
// for the restarted server), and the test fails only without both.
func TestEpochAfterAReconnectToAReplacedStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	cfg.AckWait = 2 * time.Second // stale deliveries of new events come back soon
	c, r := operatorStream(t, ctx, jsFor(t, srv), cfg, 3, 1000)
	old := takeN(t, ctx, r, 3)
	srv.Shutdown()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	replaceStream(t, ctx, jsFor(t, srv), cfg, c) // an operator's script, connected first
	replacedCleanly(t, ctx, c, r, old)
}

// The same, with jetsink kept away (a proxy refusing it) until the stream
// and consumer are re-created: the look at the stream after the reconnect
// finds the replacement, whatever push sees.
func TestEpochLookAfterReconnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	proxy := testenv.NewGateProxy(t, strings.TrimPrefix(srv.URL(), "nats://"))
	cfg := testConfig(t, srv)
	cfg.URL = proxy.URL()
	cfg.CreateStream = false
	cfg.AckWait = 2 * time.Second
	js := jsFor(t, srv) // the operator's, straight to the server
	makeStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 3, 1, 0)
	var log syncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("jetsink's log:\n%s", log.String())
		}
	})
	c, err := New(ctx, cfg, testLogger(t, &log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	r := startRun(t, ctx, c, 1, 64, 1000)
	old := takeN(t, ctx, r, 3)

	proxy.Cut()
	waitFor(t, ctx, "jetsink disconnected", func() bool { return strings.Contains(log.String(), "nats disconnected") })
	replaceStream(t, ctx, js, cfg, c)
	proxy.Reopen()

	// The wire connection's loss may also end the session while nats.go is
	// down, or ask for a look before nats.go has noticed the disconnect,
	// its request then lost with the old socket (after its timeout the
	// session ends): Run looks before it pulls again. Either way the
	// replacement is found.
	waitFor(t, ctx, "the look after the reconnect", func() bool {
		l := log.String()
		return strings.Contains(l, "stream re-created while disconnected") || strings.Contains(l, "stream re-created: the acks")
	})
	replacedCleanly(t, ctx, c, r, old)
}

// takeN returns the next n events r delivers.
func takeN(t *testing.T, ctx context.Context, r *runner, n int) []pipeline.Event {
	t.Helper()
	evs := make([]pipeline.Event, 0, n)
	for range n {
		evs = append(evs, r.next(t, ctx).ev)
	}
	return evs
}

// replaceStream deletes cfg's stream and re-creates it from sequence 1, with
// c's consumer on it, as an operator would, and publishes events 1000-1002.
func replaceStream(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config, c *Consumer) {
	t.Helper()
	recreateStream(t, ctx, js, cfg, 0)
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, c.consumerConfig(nil, nil)); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 3, 1, 1000)
}

// replacedCleanly checks, after replaceStream, that each new event comes
// (again, if need be) in c's current epoch, acking it then, and that the
// events old taken before are not in it; then it stops r.
func replacedCleanly(t *testing.T, ctx context.Context, c *Consumer, r *runner, old []pipeline.Event) {
	t.Helper()
	current := map[int]bool{}
	for len(current) < 3 {
		ev := r.next(t, ctx).ev
		if g := bodyIndex(t, &ev); g >= 1000 && ev.Epoch == c.Epochs().Current() {
			current[g] = true
			if err := ev.Msg.Ack(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, ev := range old {
		if ev.Epoch == c.Epochs().Current() {
			t.Fatalf("event %d of the deleted stream is still in the current epoch %d", ev.StreamSeq, ev.Epoch)
		}
	}
	r.stopClean(t, ctx)
}

// After missed heartbeats, recheck logs the server's view of the consumer
// next to the highest stream sequence jetsink has seen, for whoever reads
// the warning (nats-io/nats.go#1622 is one such stall).
func TestRecheckLogsTheConsumerState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	var buf syncBuffer
	c, err := New(ctx, cfg, testLogger(t, &buf))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	publish(t, ctx, js, cfg, 3, 1, 0)
	// The server counts a new message's pending for its consumers after it
	// has sent the PubAck: wait until it says 3.
	waitFor(t, ctx, "3 pending", func() bool {
		ci, err := c.cons.Load().Info(ctx)
		return err == nil && ci.NumPending == 3
	})
	if leave, replaced := c.recheck(ctx); leave || replaced {
		t.Fatalf("same stream and consumer: leave %v, replaced %v", leave, replaced)
	}
	const msg = `msg="consumer state"`
	const state = "waiting_pulls=0 ack_pending=0 max_ack_pending=32768 pending=3 delivered_stream_seq=0 seen_stream_seq=0 ack_floor_stream_seq=0"
	for line := range strings.Lines(buf.String()) {
		if strings.Contains(line, msg) && strings.HasSuffix(strings.TrimSpace(line), state) {
			return
		}
	}
	t.Fatalf("log:\n%s\nwant a line with %s ending in %s", buf.String(), msg, state)
}

// stopCC is a ConsumeContext whose Stop and Drain end the session at once.
type stopCC struct {
	jetstream.ConsumeContext
	closed chan struct{}
	once   sync.Once
}

func (c *stopCC) Stop()  { c.once.Do(func() { close(c.closed) }) }
func (c *stopCC) Drain() { c.Stop() }

// A pull nothing answered (503, no responders: wire reports one a
// heartbeat tick) has serve check the consumer at once, as missed
// heartbeats do, without counting as missed heartbeats: here it is gone,
// and the session ends for Run to re-create it.
func TestNoRespondersChecksTheConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, cfg, c := enteredConsumer(t, ctx)
	if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	cc := &stopCC{closed: make(chan struct{})}
	s := &session{cc: cc, closed: cc.closed, errs: make(chan error, 1), pushErr: make(chan error, 1),
		ask: make(chan struct{}), verdict: make(chan error, 1), quit: make(chan struct{})}
	s.errs <- fmt.Errorf("%w (%w)", nats.ErrNoResponders, wire.ErrNoResponders)
	done := make(chan error, 1)
	go func() {
		_, err := c.serve(ctx, ctx, s)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil || !s.gone {
			t.Fatalf("serve = %v, session gone %v; want nil, true", err, s.gone)
		}
	case <-time.After(10 * time.Second):
		cc.Stop()
		<-done
		t.Fatal("serve did not check the consumer after a pull found no responders")
	}
	if n := c.Stats().HeartbeatsMissing; n != 0 {
		t.Errorf("%d missed heartbeats counted, want none", n)
	}
}

// aloneSession is a session of its own (a stopCC; wire says whether it
// pulls with consumer/wire) on which errs were reported, for serveAlone.
func aloneSession(wire bool, errs ...error) (*session, *stopCC) {
	cc := &stopCC{closed: make(chan struct{})}
	s := &session{cc: cc, closed: cc.closed, errs: make(chan error, len(errs)), pushErr: make(chan error, 1),
		ask: make(chan struct{}), verdict: make(chan error, 1), quit: make(chan struct{}), wire: wire}
	for _, err := range errs {
		s.errs <- err
	}
	return s, cc
}

// serveAlone runs serve on s, and returns its result when it ends (an
// error too if it is over, which only an end of ctx should make it).
func serveAlone(ctx context.Context, c *Consumer, s *session) <-chan error {
	done := make(chan error, 1)
	go func() {
		over, err := c.serve(ctx, ctx, s)
		if over && err == nil {
			err = errors.New("serve over, with no error")
		}
		done <- err
	}()
	return done
}

// servedUntilMarker waits until serve has logged errMarker, which the
// test reported after the errors it checks, so that serve has taken those;
// it fails if serve ends first.
func servedUntilMarker(t *testing.T, ctx context.Context, log *syncBuffer, done <-chan error) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(log.String(), errMarker.Error()) {
		select {
		case err := <-done:
			t.Fatalf("serve ended (%v) before it took the marker reported after the errors; log:\n%s", err, log)
		case <-ctx.Done():
			t.Fatalf("serve did not take the marker reported after the errors; log:\n%s", log)
		case <-tick.C:
		}
	}
}

// errMarker is a pull error serve only logs (asyncErrEvery).
var errMarker = errors.New("marker: an error serve only logs")

// consumerAlone is a consumer of its own embedded server's stream, with
// its log, in the stream (enterStream) and with no look at the ack floor
// for an hour, for serve alone (serveAlone).
func consumerAlone(t *testing.T, ctx context.Context) (*Consumer, *syncBuffer, *testenv.NATSServer, Config) {
	t.Helper()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	if err := c.enterStream(ctx, false); err != nil {
		t.Fatal(err)
	}
	c.floorEvery = time.Hour
	return c, log, srv, cfg
}

// A pull nothing answered, or missed heartbeats, within recheckGap of
// the last look at the consumer ask for no other look: here the consumer
// is gone, and serve, which would find it so, goes on without looking
// until the marker reported after. (TestNoRespondersChecksTheConsumer:
// past recheckGap, it looks.) Before, TestJetStreamOffAndOnAgain alone
// touched the guard, and passed without it.
func TestRecheckGapHoldsTheLook(t *testing.T) {
	onePassOnly(t) // serve alone: no pull client
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"no responders", fmt.Errorf("%w (%w)", nats.ErrNoResponders, wire.ErrNoResponders)},
		{"missed heartbeats", fmt.Errorf("%w (%w)", jetstream.ErrNoHeartbeat, wire.ErrNoHeartbeat)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, log, srv, cfg := consumerAlone(t, ctx) // no other look meanwhile
			if err := jsFor(t, srv).DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
				t.Fatal(err)
			}
			c.recheckGap, c.lastRecheck = time.Hour, time.Now()
			s, cc := aloneSession(false, tc.err, tc.err, errMarker)
			done := serveAlone(ctx, c, s)
			servedUntilMarker(t, ctx, log, done)
			cc.Stop()
			if err := <-done; err != nil || s.gone {
				t.Fatalf("serve = %v, session gone %v; want nil, false", err, s.gone)
			}
			if l := log.String(); strings.Contains(l, "checking the consumer") || strings.Contains(l, "consumer gone") {
				t.Fatalf("serve looked at the consumer within recheckGap of the last look; log:\n%s", l)
			}
		})
	}
}

// The warning that a pull found no responders, each of which has serve
// look at the consumer, is logged once a minute at most (quietEvery), not
// once a look: JetStream disabled for hours logged a pair every few
// seconds. Before, TestJetStreamOffAndOnAgain alone counted it, and only
// one pull reached it there, quieted or not.
func TestNoRespondersWarningQuieted(t *testing.T) {
	onePassOnly(t) // serve alone: no pull client
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, log, _, _ := consumerAlone(t, ctx)
	c.recheckGap = 0 // each looks
	noResp := fmt.Errorf("%w (%w)", nats.ErrNoResponders, wire.ErrNoResponders)
	s, cc := aloneSession(false, noResp, noResp, noResp, errMarker)
	done := serveAlone(ctx, c, s)
	servedUntilMarker(t, ctx, log, done)
	cc.Stop()
	if err := <-done; err != nil || s.gone {
		t.Fatalf("serve = %v, session gone %v; want nil, false", err, s.gone)
	}
	l := log.String()
	if n := strings.Count(l, `msg="consumer state"`); n != 3 {
		t.Fatalf("%d looks at the consumer, want one for each of the 3 pulls; the test proves nothing; log:\n%s", n, l)
	}
	if n := strings.Count(l, "a pull found no server to answer it"); n != 1 {
		t.Fatalf("%d warnings that a pull found no server in a moment, want 1 (once a minute at most); log:\n%s", n, l)
	}
}

// The wire connection lost (connLost) and serve's look at the stream that
// its loss asked for failing (sent before nats.go noticed that its own
// connection was lost too; here the look times out at once) is a lost
// connection: the session drains and ends, not gone, and Run pulls again
// without re-creating anything. The same failing look without the wire
// connection's loss ends the session gone. Before,
// TestRunSurvivesServerRestart alone touched it, and the race it needs
// (nats.go still connected) rarely came there.
func TestWireLossFailedLookIsALostConnection(t *testing.T) {
	onePassOnly(t) // serve alone: no pull client
	for _, lost := range []bool{true, false} {
		t.Run(fmt.Sprintf("connLost %v", lost), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, log, _, _ := consumerAlone(t, ctx)
			c.streamLookTimeout = time.Nanosecond // every look at the stream fails
			c.lookAgain()                         // what the wire connection's loss, or nats.go's reconnect, asks for
			s, cc := aloneSession(true)
			s.connLost.Store(lost)
			done := serveAlone(ctx, c, s)
			select {
			case err := <-done:
				if err != nil || s.gone == lost {
					t.Fatalf("serve = %v, session gone %v; want nil, %v", err, s.gone, !lost)
				}
			case <-ctx.Done():
				cc.Stop()
				<-done
				t.Fatalf("serve did not end the session after the look at the stream failed; log:\n%s", log)
			}
			if failed := strings.Contains(log.String(), "could not look at the stream after the reconnect"); failed == lost {
				t.Fatalf("the failed look logged as such: %v, want %v; log:\n%s", failed, !lost, log)
			}
		})
	}
}

// The error a Sub reported just before it ended is logged, and kept for
// Run (session.lastErr), whichever of the two serve sees first: Go's
// select picks among ready cases at random, and the end alone said only
// that the subscription ended. Run reports it when the session ended at
// once: NotConsuming said "no reason given" when serve had read it first.
func TestSessionEndLogsItsReason(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	c := newConsumer(t, ctx, testConfig(t, srv))
	for i := range 20 {
		var buf syncBuffer
		c.log = testLogger(t, &buf)
		closed := make(chan struct{})
		close(closed)
		s := &session{closed: closed, errs: make(chan error, 1), pushErr: make(chan error, 1),
			ask: make(chan struct{}), verdict: make(chan error, 1), quit: make(chan struct{})}
		s.errs <- fmt.Errorf("%w: %w", wire.ErrBadRequest, &wire.StatusError{Code: 400, Description: "Bad Request"})
		if over, err := c.serve(ctx, ctx, s); over || err != nil {
			t.Fatalf("serve = %v, %v; want false, nil", over, err)
		}
		if !strings.Contains(buf.String(), "pull request refused") {
			t.Fatalf("run %d: the reason the subscription ended was not logged:\n%s", i, buf.String())
		}
		if !errors.Is(s.lastErr, wire.ErrBadRequest) {
			t.Fatalf("run %d: the session ended with lastErr %v, want the Sub's terminal error", i, s.lastErr)
		}
	}
}

// A poison event taken before its stream was re-created whose dead letter
// is over max_payload: no publish on this connection can store it, so it
// is given up at once, logged at Error with its stream, subject, sequence
// and both sizes, rather
// than tried until the hard stop (holding its lane, or a committer, and
// every graceful stop until drain_timeout).
func TestStaleDeadLetterOverMaxPayloadGivenUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	js := jsFor(t, srv)
	makeStream(t, ctx, js, cfg)
	dlqStream(t, ctx, js, cfg)
	cfg.CreateStream = false // the operator owns both streams
	c, log := newLoggedConsumer(t, ctx, cfg)
	// The letter's own headers take about 250 bytes: 100 under
	// max_payload leaves no room for them (TestDeadLetterOfALargeEventFitsMaxPayload).
	m := &nats.Msg{Subject: subjectOf(cfg, 0, 1), Data: []byte(strings.Repeat("x", int(c.nc.MaxPayload())-100))}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	first := c.Epochs().Current()
	recreateStream(t, ctx, js, cfg, 0)
	waitFor(t, ctx, "a new epoch", func() bool { return c.Epochs().Current() != first })

	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	done := make(chan error, 1)
	go func() { done <- c.DeadLetter(ctx, &ev, dl) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrDeadLetter) || !errors.Is(err, pipeline.ErrStaleEpoch) || !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("DeadLetter of a stale event over max_payload = %v, want ErrDeadLetter, pipeline.ErrStaleEpoch and nats.ErrMaxPayload", err)
		}
	case <-time.After(10 * time.Second): // at once, but for a slow machine
		t.Fatal("DeadLetter of a stale event over max_payload still trying after 10 s; want it given up at once")
	}
	lost := false
	for line := range strings.Lines(log.String()) {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, "gave up the dead letter") && strings.Contains(line, "stream="+cfg.Stream) &&
			strings.Contains(line, "stream_seq="+strconv.FormatUint(ev.StreamSeq, 10)) && strings.Contains(line, "subject="+ev.Subject) &&
			strings.Contains(line, "over the connected server's max_payload") && strings.Contains(line, "max_payload="+strconv.FormatInt(c.nc.MaxPayload(), 10)) &&
			strings.Contains(line, "dead_letter_bytes=") {
			lost = true
		}
	}
	if !lost {
		t.Fatalf("no Error line for the stale dead letter given up; log:\n%s", log.String())
	}
	r.stopClean(t, ctx)
}

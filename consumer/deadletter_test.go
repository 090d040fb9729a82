package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

// dlqStream returns the stream that captures cfg's dead letters: the one
// New made (create_stream), or a new one.
func dlqStream(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config) jetstream.Stream {
	t.Helper()
	if name, err := js.StreamNameBySubject(ctx, cfg.DeadLetterSubject); err == nil {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("dead-letter stream: %v", err)
		}
		return s
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "DLQ_" + cfg.Stream,
		Subjects: []string{cfg.DeadLetterSubject},
	})
	if err != nil {
		t.Fatalf("create dead-letter stream: %v", err)
	}
	return s
}

func TestDeadLetterPublishesThenTerminates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = time.Second
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)

	orig := &nats.Msg{Subject: subjectOf(cfg, 0, 1), Data: []byte(`{"id": not json`), Header: nats.Header{}}
	orig.Header.Set(HeaderMsgID, "orig-1")
	orig.Header.Set("traceparent", traceparent)
	orig.Header["X-Custom"] = []string{"a", "b"}
	// A JetStream control header that would make the dead-letter publish
	// fail if it were copied: the DLQ stream is not cfg.Stream.
	orig.Header.Set("Nats-Expected-Stream", cfg.Stream)
	if _, err := js.PublishMsg(ctx, orig); err != nil {
		t.Fatal(err)
	}

	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	reason := "invalid character 'n'\r\nlooking for beginning of value " + strings.Repeat("x", 2*MaxReasonLen)
	err := c.DeadLetter(ctx, &ev, pipeline.DeadLetter{
		Stage:    pipeline.StageDecode,
		Reason:   reason,
		Code:     "invalid_json",
		SQLState: "22P02",
	})
	if err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}

	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatalf("no dead letter stored: %v", err)
	}
	if string(m.Data) != string(orig.Data) || m.Subject != cfg.DeadLetterSubject {
		t.Fatalf("dead letter = %q on %s, want the original body on %s", m.Data, m.Subject, cfg.DeadLetterSubject)
	}
	// The id is the one the max-deliver path gives the same event: it
	// reads the event back from the stream, with its store time.
	stored, err := jsStreamMsg(t, ctx, js, cfg.Stream, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Header
	want := map[string]string{
		HeaderMsgID:     cfg.Stream + ":1:" + strconv.FormatInt(stored.Time.UnixNano(), 10),
		HeaderOrigMsgID: "orig-1",
		HeaderSubject:   orig.Subject,
		HeaderStream:    cfg.Stream,
		HeaderStreamSeq: "1",
		HeaderDelivered: "1",
		HeaderStage:     pipeline.StageDecode,
		HeaderCode:      "invalid_json",
		HeaderSQLState:  "22P02",
		"traceparent":   traceparent,
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if got := h.Values("X-Custom"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("X-Custom = %v, want [a b]", got)
	}
	if got := h.Get("Nats-Expected-Stream"); got != "" {
		t.Errorf("control header Nats-Expected-Stream was copied: %q", got)
	}
	gotReason := h.Get(HeaderReason)
	if strings.ContainsAny(gotReason, "\r\n") || len(gotReason) > MaxReasonLen ||
		!strings.HasPrefix(gotReason, "invalid character 'n' looking for beginning of value xxx") {
		t.Errorf("reason = %q (%d bytes), want one line of at most %d bytes", gotReason, len(gotReason), MaxReasonLen)
	}

	// Terminated, so acked as far as the consumer goes: the ack floor moves
	// past it and nothing is pending, now and after ack_wait has passed.
	waitFor(t, ctx, "the term", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.AckFloor == 1 && lag.NumAckPending == 0
	})
	if st := c.Stats(); st.DeadLettered != 1 || st.DeadLetterFailed != 0 {
		t.Fatalf("Stats = %+v", st)
	}

	// The same poison event dead-lettered again (a redelivery racing its
	// Term) is stored once.
	ack, err := js.PublishMsg(ctx, c.deadLetterMsg(&ev, pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json"}))
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Duplicate {
		t.Fatal("a second dead letter for the same event was stored again")
	}

	// Publish one more message: it is the next thing Run hands over, so the
	// dead-lettered one did not come back in between.
	if _, err := js.Publish(ctx, subjectOf(cfg, 1, 1), []byte("next")); err != nil {
		t.Fatal(err)
	}
	next := r.next(t, ctx).ev
	if next.StreamSeq != 2 {
		t.Fatalf("after the dead letter Run handed over seq %d (delivered %d), want 2", next.StreamSeq, next.Delivered)
	}
	if err := next.Msg.Ack(); err != nil {
		t.Fatal(err)
	}
	r.stopClean(t, ctx)
}

func TestDeadLetterWithoutStreamNaks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = 20 * time.Second // a redelivery within the test is the nak's doing
	// An operator-made stream and no create_stream: nothing makes a
	// dead-letter stream, so the dead-letter publish has nowhere to go.
	js := jsFor(t, srv)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects}); err != nil {
		t.Fatal(err)
	}
	cfg.CreateStream = false
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 1, 1, 0)

	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	began := time.Now()
	err := c.DeadLetter(ctx, &ev, pipeline.DeadLetter{Stage: pipeline.StageSink, Reason: "value too long", Code: "sql_22001", SQLState: "22001"})
	if !errors.Is(err, ErrDeadLetter) {
		t.Fatalf("DeadLetter with no stream on %s = %v, want ErrDeadLetter", cfg.DeadLetterSubject, err)
	}
	if !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("DeadLetter = %v, want it to wrap the publish error", err)
	}
	if st := c.Stats(); st.DeadLetterFailed != 1 || st.DeadLettered != 0 {
		t.Fatalf("Stats = %+v", st)
	}
	lag, err := c.Lag(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lag.AckFloor != 0 {
		t.Fatalf("ack floor = %d after a failed dead letter: the event was acked or terminated", lag.AckFloor)
	}
	// Nak'ed with a delay: it comes back, well before ack_wait.
	again := r.next(t, ctx).ev
	if again.StreamSeq != ev.StreamSeq || again.Delivered != 2 {
		t.Fatalf("got seq %d delivery %d, want seq %d again", again.StreamSeq, again.Delivered, ev.StreamSeq)
	}
	if d := time.Since(began); d < nakDelay(1)-500*time.Millisecond || d > cfg.AckWait/2 {
		t.Fatalf("redelivered after %s, want about %s", d, nakDelay(1))
	}
	if err := again.Msg.Ack(); err != nil {
		t.Fatal(err)
	}
	r.stopClean(t, ctx)
}

// A dead-letter publish that gets no answer (here a plain subscriber on
// the subject, which never replies, and no stream) gives up after
// min(5 s, ack_wait/8), not after nats.go's 5 s, and the event is nak'ed:
// a worker dead-lettering a run of poison events must not hold the events
// behind it in its ring near their ack_wait.
func TestDeadLetterPublishIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = 8 * time.Second // a publish may take 1 s
	js := jsFor(t, srv)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects}); err != nil {
		t.Fatal(err)
	}
	cfg.CreateStream = false // no dead-letter stream
	c := newConsumer(t, ctx, cfg)
	nc := srv.Connect(t)
	silent, err := nc.SubscribeSync(cfg.DeadLetterSubject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	began := time.Now()
	err = c.DeadLetter(ctx, &ev, pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"})
	took := time.Since(began)
	if !errors.Is(err, ErrDeadLetter) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DeadLetter with nobody answering = %v, want ErrDeadLetter wrapping context.DeadlineExceeded", err)
	}
	if want := cfg.AckWait / 8; took < want || took > want+time.Second {
		t.Fatalf("DeadLetter gave up after %s, want about %s", took, want)
	}
	waitFor(t, ctx, "the dead letter at the silent subscriber", func() bool {
		n, _, _ := silent.Pending()
		return n == 1
	})
	again := r.next(t, ctx).ev // nak'ed: it comes back
	if again.StreamSeq != ev.StreamSeq || again.Delivered != 2 {
		t.Fatalf("got seq %d delivery %d, want seq %d again", again.StreamSeq, again.Delivered, ev.StreamSeq)
	}
	if err := again.Msg.Ack(); err != nil {
		t.Fatal(err)
	}
	r.stopClean(t, ctx)
}

func TestDeadLetterConcurrent(t *testing.T) {
	const n, workers = 200, 8
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, n, 5, 0)

	r := startRun(t, ctx, c, 1, 256, n)
	evs := make(chan pipeline.Event, n)
	for i := 0; i < n; i++ {
		evs <- r.next(t, ctx).ev
	}
	close(evs)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range evs {
				errs <- c.DeadLetter(ctx, &ev, pipeline.DeadLetter{Stage: pipeline.StageDecode, Reason: "bad", Code: "w" + strconv.Itoa(w)})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("DeadLetter: %v", err)
		}
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("dead-letter stream holds %d messages, want %d", info.State.Msgs, n)
	}
	waitFor(t, ctx, "every term", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.AckFloor == n && lag.NumAckPending == 0
	})
	r.stopClean(t, ctx)
}

// The backstop: an event whose extra delivery (past max_deliver) is not
// settled either, as when the jetsink holding it stalls, is given up by the
// server, and dead-lettered from the server's advisory.
func TestMaxDeliverAdvisoryDeadLetters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = time.Second
	cfg.MaxDeliver = 2
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 1, 1, 0)

	// Never settle it: it is delivered twice to be stored, once more to be
	// dead-lettered, then the server gives up and says so in the advisory.
	r := startRun(t, ctx, c, 1, 16, 16)
	for want := uint32(1); want <= 3; want++ {
		ev := r.next(t, ctx).ev
		if ev.Delivered != want || ev.Exhausted != (want == 3) {
			t.Fatalf("delivery %d has count %d, exhausted %v", want, ev.Delivered, ev.Exhausted)
		}
	}
	waitMaxDeliverLetter(t, ctx, dlq, cfg)
	if st := c.Stats(); st.MaxDelivered != 1 || st.DeadLettered != 0 {
		t.Fatalf("Stats = %+v, want MaxDelivered 1", st)
	}
	r.stopClean(t, ctx)
}

// waitMaxDeliverLetter waits until dlq holds one message and checks that it
// is the max-deliver dead letter of the event publish numbered 0 (body "0",
// Nats-Msg-Id "m0", a traceparent), delivered cfg.MaxDeliver+1 times, first
// in cfg's stream.
func waitMaxDeliverLetter(t *testing.T, ctx context.Context, dlq jetstream.Stream, cfg Config) {
	t.Helper()
	waitFor(t, ctx, "the max-deliver dead letter", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "0" || m.Header.Get(HeaderCode) != pipeline.CodeMaxDeliver || m.Header.Get(HeaderStage) != pipeline.StageDeliver ||
		m.Header.Get(HeaderDelivered) != strconv.Itoa(cfg.MaxDeliver+1) || !isDeadLetterID(m.Header.Get(HeaderMsgID), cfg.Stream, 1) ||
		m.Header.Get(HeaderOrigMsgID) != "m0" || m.Header.Get("traceparent") != traceparent {
		t.Fatalf("dead letter = %q %v", m.Data, m.Header)
	}
}

// outageBeforeMaxDeliver makes the dead-letter subject unavailable (its
// stream deleted), publishes one event (or n[0], one per subject) and lets
// each be delivered cfg.MaxDeliver times without settling it, and then
// once more, marked Exhausted: the extra deliveries are returned,
// unsettled, so that unless the test settles them the server gives up on
// each after ack_wait while no dead letter can be stored. maxDeliverRetry
// is set to retry for the test and restored after it.
func outageBeforeMaxDeliver(t *testing.T, ctx context.Context, retry [2]time.Duration, log io.Writer, n ...int) (*Consumer, Config, jetstream.JetStream, *runner, []pipeline.Event) {
	t.Helper()
	events := 1
	if len(n) > 0 {
		events = n[0]
	}
	saved := maxDeliverRetry
	maxDeliverRetry = retry
	t.Cleanup(func() { maxDeliverRetry = saved })
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = time.Second
	cfg.MaxDeliver = 2
	c, err := New(ctx, cfg, testLogger(t, log))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(c.Close)
	js := jsFor(t, srv)
	name, err := js.StreamNameBySubject(ctx, cfg.DeadLetterSubject)
	if err != nil {
		t.Fatalf("dead-letter stream: %v", err)
	}
	if err := js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, events, events, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	delivered := map[uint64]uint32{}
	var last []pipeline.Event
	for range (cfg.MaxDeliver + 1) * events {
		ev := r.next(t, ctx).ev
		if delivered[ev.StreamSeq]++; ev.Delivered != delivered[ev.StreamSeq] {
			t.Fatalf("delivery %d of message %d has count %d", delivered[ev.StreamSeq], ev.StreamSeq, ev.Delivered)
		}
		if ev.Exhausted != (ev.Delivered > uint32(cfg.MaxDeliver)) {
			t.Fatalf("delivery %d of message %d: exhausted %v", ev.Delivered, ev.StreamSeq, ev.Exhausted)
		}
		if ev.Exhausted {
			last = append(last, ev)
		}
	}
	return c, cfg, js, r, last
}

// An event delivered past max_deliver while the dead-letter stream is gone:
// its dead letter fails, and it is nak'ed (with nakDelay); the server then
// gives up on it and raises its advisory, and the advisory path
// dead-letters it once the stream is back, however many attempts that
// takes: JetStream will not deliver it again, so giving up would lose it.
// (The handler used to give up after 4 attempts.)
func TestMaxDeliverDeadLetterOutlastsOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	c, cfg, js, r, last := outageBeforeMaxDeliver(t, ctx, [2]time.Duration{20 * time.Millisecond, 100 * time.Millisecond}, nil)
	// What the worker does with the extra delivery.
	if err := c.DeadLetter(ctx, &last[0], pipeline.MaxDeliverDeadLetter(uint64(last[0].Delivered))); !errors.Is(err, ErrDeadLetter) {
		t.Fatalf("DeadLetter of the extra delivery without a dead-letter stream = %v, want ErrDeadLetter", err)
	}
	nakked := time.Now()
	waitFor(t, ctx, "eight failed attempts", func() bool { return c.Stats().DeadLetterFailed >= 1+8 })
	// The advisory came when the nak's delay ran out, not after ack_wait.
	if d := time.Since(nakked); d < nakDelay(uint64(last[0].Delivered))-time.Second {
		t.Fatalf("advisory path failing after %s, before the nak's %s", d, nakDelay(uint64(last[0].Delivered)))
	}
	waitMaxDeliverLetter(t, ctx, dlqStream(t, ctx, js, cfg), cfg) // the outage ends
	waitFor(t, ctx, "the success counted", func() bool { return c.Stats().MaxDelivered == 1 })
	r.stopClean(t, ctx)
}

// Stopping while an advisory's event cannot be dead-lettered does not wait
// out the retry delay, and the log says which event stays in the stream.
func TestMaxDeliverRetryEndsWithClose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var log syncBuffer
	c, _, _, r, _ := outageBeforeMaxDeliver(t, ctx, [2]time.Duration{time.Hour, time.Hour}, &log)
	waitFor(t, ctx, "a failed attempt", func() bool { return c.Stats().DeadLetterFailed >= 1 })
	r.stopClean(t, ctx)
	// Drain waits for the handler; Close gives up on Drain after closeWait
	// and would leave the handler asleep (goleak would then fail the
	// package).
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(closeWait):
		t.Fatal("Close waited for the max-deliver retry's hour")
	}
	if s := log.String(); !strings.Contains(s, "they stay in the stream at these sequences") || !strings.Contains(s, "events=1:3") {
		t.Fatalf("log does not say where the event stays:\n%s", s)
	}
}

// An event that reached max_deliver and then left the stream (its limits
// removed it, or someone deleted it) cannot be dead-lettered ever: the
// handler says so once and stops retrying, so that the advisories behind it
// get their turn.
func TestMaxDeliverRetryStopsWhenTheEventIsGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var log syncBuffer
	c, cfg, js, r, _ := outageBeforeMaxDeliver(t, ctx, [2]time.Duration{20 * time.Millisecond, 100 * time.Millisecond}, &log)
	waitFor(t, ctx, "a failed attempt", func() bool { return c.Stats().DeadLetterFailed >= 1 })
	stream, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the handler to give up", func() bool {
		return strings.Contains(log.String(), "is no longer in the stream")
	})
	failed := c.Stats().DeadLetterFailed
	time.Sleep(500 * time.Millisecond) // five retry periods
	if now := c.Stats().DeadLetterFailed; now != failed {
		t.Fatalf("still retrying: %d failed attempts, then %d", failed, now)
	}
	r.stopClean(t, ctx)
}

// Events whose max-deliver dead letter is still failing when jetsink stops
// are recorded in the consumer's metadata, every one of them, and the next
// start dead-letters them once the dead-letter stream is back; the record
// is then cleared. (Before the record, they stayed in the stream unseen.)
func TestMaxDeliverRetryResumesAfterRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	c, cfg, js, r, _ := outageBeforeMaxDeliver(t, ctx, [2]time.Duration{time.Hour, time.Hour}, nil, 2)
	waitFor(t, ctx, "both events recorded", func() bool { return record(t, ctx, js, cfg) == "1:3,2:3" })
	r.stopClean(t, ctx)
	c.Close()

	dlq := dlqStream(t, ctx, js, cfg)
	c2 := newConsumer(t, ctx, cfg)
	waitFor(t, ctx, "both dead letters", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == 2
	})
	waitFor(t, ctx, "the record cleared", func() bool { return record(t, ctx, js, cfg) == "" })
	if st := c2.Stats(); st.MaxDelivered != 2 {
		t.Fatalf("restarted consumer: %+v", st)
	}
}

// A record left for a stream that was deleted and re-created since is
// dropped, not applied to the new stream's events at those sequences.
func TestMaxDeliverRecordGoesWithItsStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var log syncBuffer
	c, cfg, js, r, _ := outageBeforeMaxDeliver(t, ctx, [2]time.Duration{time.Hour, time.Hour}, &log)
	waitFor(t, ctx, "the event recorded", func() bool { return record(t, ctx, js, cfg) == "1:3" })
	r.stopClean(t, ctx)
	c.Close()
	recreateStream(t, ctx, js, cfg, 0)
	publish(t, ctx, js, cfg, 1, 1, 500) // another event at sequence 1
	dlq := dlqStream(t, ctx, js, cfg)
	// The consumer went with the stream; put the old record on a new one,
	// as a process that kept it in memory would.
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
		Metadata: map[string]string{strandedKey: "1:2:1577836800000000000"}}); err != nil { // a stream of 2020
		t.Fatal(err)
	}
	c2, err := New(ctx, cfg, testLogger(t, &log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c2.Close)
	// New has read the record and judged it before returning.
	if got := record(t, ctx, js, cfg); got != "" {
		t.Fatalf("record after New: %q, want it dropped", got)
	}
	if !strings.Contains(log.String(), "names events of a stream since deleted") {
		t.Fatalf("log does not say the record was dropped:\n%s", log.String())
	}
	c2.stranded.mu.Lock()
	left, running := len(c2.stranded.seqs), c2.stranded.running
	c2.stranded.mu.Unlock()
	if left != 0 || running {
		t.Fatalf("%d events left to retry (loop running: %v), want none", left, running)
	}
	if info, err := dlq.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("dead-letter stream: %d messages (%v), want none", info.State.Msgs, err)
	}
}

// record is the consumer's record of max-delivered events as
// "<seq>:<deliveries>,...", each entry checked to name the current stream.
func record(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config) string {
	t.Helper()
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	rec, bad := parseRecord(cons.CachedInfo().Config.Metadata[strandedKey])
	if bad != "" {
		t.Fatalf("unreadable record entry %q", bad)
	}
	var out []string
	for _, seq := range slices.Sorted(maps.Keys(rec)) {
		e := fmt.Sprintf("%d:%d", seq, rec[seq].deliveries)
		if rec[seq].stream != stream.CachedInfo().Created.UnixNano() {
			e += "(another stream)"
		}
		out = append(out, e)
	}
	return strings.Join(out, ",")
}

// Instances sharing the consumer keep each other's entries of the record,
// and an entry whose stream could not be looked up is kept.
func TestMaxDeliverRecordSharedByInstances(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	a, b := newConsumer(t, ctx, cfg), newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	stream, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	created := stream.CachedInfo().Created
	// Not running the retry loops: only the record is under test.
	for _, c := range []*Consumer{a, b} {
		c.stranded.mu.Lock()
		c.stranded.closing = true
		c.stranded.mu.Unlock()
	}
	a.strand(maxDeliverAdvisory{StreamSeq: 1, Deliveries: 2}, created)
	b.strand(maxDeliverAdvisory{StreamSeq: 3, Deliveries: 2}, time.Time{}) // stream unknown
	if err := a.ensureConsumer(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("1:2:%d,3:2:0", created.UnixNano())
	if got := cons.CachedInfo().Config.Metadata[strandedKey]; got != want {
		t.Fatalf("record %q, want %q", got, want)
	}
	a.resolve(1, strandedEntry{deliveries: 2, stream: created.UnixNano()})
	if got := record(t, ctx, js, cfg); got != "3:2(another stream)" { // b's entry, untagged
		t.Fatalf("after a resolved its entry: record %q", got)
	}
}

// jsStreamMsg reads message seq of stream.
func jsStreamMsg(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	t.Helper()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	return st.GetMsg(ctx, seq)
}

// isDeadLetterID reports whether id is "<stream>:<seq>:<Unix ns>".
func isDeadLetterID(id, stream string, seq uint64) bool {
	ns, ok := strings.CutPrefix(id, stream+":"+strconv.FormatUint(seq, 10)+":")
	if !ok {
		return false
	}
	_, err := strconv.ParseInt(ns, 10, 64)
	return err == nil
}

package consumer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
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

// dlqSetup is a dead-letter test's start: a server, a consumer on it, and
// the stream that captures its dead letters; ctx ends after 30 s.
func dlqSetup(t *testing.T) (context.Context, Config, *Consumer, jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	return ctx, cfg, c, js, dlqStream(t, ctx, js, cfg)
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
		HeaderMsgID:     cfg.Stream + ":1:" + strconv.FormatInt(stored.Time.UnixNano(), 10) + ":" + cfg.Consumer,
		HeaderConsumer:  cfg.Consumer,
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

// termFails is a message whose term fails in the client, as nats.go's
// does with its reconnect buffer full or its connection closed.
type termFails struct{ pipeline.Msg }

var errTermFailed = errors.New("term failed in the client")

func (termFails) TermWithReason(string) error { return errTermFailed }

// A dead letter stored whose original's term failed in the client is
// counted (Stats.TermErrors, in jetsink_ack_failures_total): the term was
// never sent, so it is not among the unconfirmed acks, and the event comes
// back after ack_wait. Before, only a Warn line told of it.
func TestDeadLetterCountsAFailedTerm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullClient = PullClientNATSGo // its message wrapped loses nothing a wire message's would
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	ev.Msg = termFails{ev.Msg}
	if err := c.DeadLetter(ctx, &ev, pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}); err != nil {
		t.Fatalf("DeadLetter = %v, want nil: the dead letter is stored", err)
	}
	if info, err := dlq.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("dead-letter stream: %+v, %v; want the letter stored", info, err)
	}
	if st := c.Stats(); st.TermErrors != 1 || st.DeadLettered != 1 || st.AcksUnconfirmed != 0 {
		t.Fatalf("Stats = %+v; want the failed term counted in TermErrors, alone", st)
	}
	r.stopClean(t, ctx)
}

// A dead letter stored whose original's term failed comes back with the
// event (delivered 2) and is dead-lettered again: the dead-letter stream
// keeps one letter of it, by the Nats-Msg-Id every delivery of the event
// gives (deadLetterID). Before, only an exact compare of the header's
// text caught an id that differs by delivery (a mutation audit), and
// such an id stores a letter for each delivery.
func TestDeadLetterAfterAFailedTermStoredOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullClient = PullClientNATSGo // its message wrapped loses nothing a wire message's would
	cfg.AckWait = time.Second         // the event comes back soon, its term never sent
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	ev := r.next(t, ctx).ev
	ev.Msg = termFails{ev.Msg}
	if err := c.DeadLetter(ctx, &ev, dl); err != nil || ev.Delivered != 1 {
		t.Fatalf("DeadLetter of delivery %d = %v, want delivery 1 stored", ev.Delivered, err)
	}
	again := r.next(t, ctx).ev
	if again.StreamSeq != ev.StreamSeq || again.Delivered != 2 {
		t.Fatalf("got seq %d delivery %d, want seq %d again, delivery 2", again.StreamSeq, again.Delivered, ev.StreamSeq)
	}
	if err := c.DeadLetter(ctx, &again, dl); err != nil {
		t.Fatalf("DeadLetter of delivery 2 = %v, want nil", err)
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("the dead-letter stream holds %d letters, want one of the event delivered twice", info.State.Msgs)
	}
	if st := c.Stats(); st.TermErrors != 1 || st.DeadLettered != 2 {
		t.Fatalf("Stats = %+v; want 2 dead letters, 1 failed term", st)
	}
	r.stopClean(t, ctx)
}

// A stored dead letter is logged once, at Warn, with what it is and why:
// subject, stream, stream_seq, stage, code, sqlstate, delivered and its
// reason, so that log.level=warn says why an event was dead-lettered.
// Before, the consumer's Warn line had no reason and the worker's Info
// line beside it had it, so at warn nobody saw it. A row the database
// refused keeps its reason, which may quote the row's values, out of the
// log (the letter has it).
func TestDeadLetterLogsItsReasonAtWarn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	for _, tc := range []struct {
		name       string
		dl         pipeline.DeadLetter
		want, hide string
	}{
		{"decode", pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: pipeline.CodeInvalidFormat,
			Reason: `decode column "at": invalid_format: value is not a valid timestamptz`}, `reason="decode column \"at\": invalid_format: value is not a valid timestamptz"`, ""},
		{"sink", pipeline.DeadLetter{Stage: pipeline.StageSink, Code: pipeline.CodeData, SQLState: "22P02",
			Reason: `invalid input syntax for type integer: "secret-value" (SQLSTATE 22P02)`}, "sqlstate=22P02", "secret-value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, srv)
			var buf syncBuffer
			c, err := New(ctx, cfg, slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			dlqStream(t, ctx, js, cfg)
			publish(t, ctx, js, cfg, 1, 1, 0)
			r := startRun(t, ctx, c, 1, 16, 16)
			ev := r.next(t, ctx).ev
			if err := c.DeadLetter(ctx, &ev, tc.dl); err != nil {
				t.Fatalf("DeadLetter: %v", err)
			}
			r.stopClean(t, ctx)
			var lines []string
			for l := range strings.Lines(buf.String()) {
				if strings.Contains(l, `msg="event dead-lettered"`) {
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 {
				t.Fatalf("%d lines of the stored letter at warn, want 1; log:\n%s", len(lines), buf.String())
			}
			l := lines[0]
			for _, want := range []string{"level=WARN", "subject=" + ev.Subject, "stream=" + ev.Stream, "stream_seq=" + strconv.FormatUint(ev.StreamSeq, 10),
				"stage=" + tc.dl.Stage, "code=" + tc.dl.Code, "delivered=1", "reason=", tc.want} {
				if !strings.Contains(l, want) {
					t.Errorf("the dead letter's line lacks %s: %s", want, l)
				}
			}
			if tc.hide != "" && strings.Contains(l, tc.hide) {
				t.Errorf("the dead letter's line quotes the row's value %q: %s", tc.hide, l)
			}
		})
	}
}

// letterOfTheFirst runs c, dead-letters the first event it delivers (as
// invalid JSON), stops it, and returns the letter stored first in dlq.
func letterOfTheFirst(t *testing.T, ctx context.Context, c *Consumer, dlq jetstream.Stream) *jetstream.RawStreamMsg {
	t.Helper()
	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	if err := c.DeadLetter(ctx, &ev, pipeline.DeadLetter{Stage: pipeline.StageDecode, Reason: "bad", Code: "invalid_json"}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	r.stopClean(t, ctx)
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatalf("no dead letter stored: %v", err)
	}
	return m
}

// A publisher's own Jetsink-* headers, in any case, do not reach the dead
// letter: where jetsink sets none (no SQLSTATE, no original Nats-Msg-Id)
// they would be read back as the letter's, and where it sets one, a
// second spelling would stand beside it. Other headers still come along.
func TestDeadLetterDropsThePublishersJetsinkHeaders(t *testing.T) {
	ctx, cfg, c, js, dlq := dlqSetup(t)
	orig := &nats.Msg{Subject: subjectOf(cfg, 0, 1), Data: []byte(`{"id": not json`), Header: nats.Header{
		HeaderSQLState:     {"99999"},
		HeaderOrigMsgID:    {"forged"},
		"jetsink-code":     {"forged"},
		"JETSINK-CUSTOM":   {"forged"},
		"X-Jetsink-Origin": {"kept"},
	}}
	if _, err := js.PublishMsg(ctx, orig); err != nil {
		t.Fatal(err)
	}
	m := letterOfTheFirst(t, ctx, c, dlq)
	var got []string
	for k, vs := range m.Header {
		if jetsinkHeader(k) {
			got = append(got, k+"="+strings.Join(vs, ","))
		}
	}
	slices.Sort(got)
	want := []string{
		HeaderCode + "=invalid_json",
		HeaderConsumer + "=" + cfg.Consumer,
		HeaderDelivered + "=1",
		HeaderReason + "=bad",
		HeaderStage + "=" + pipeline.StageDecode,
		HeaderStream + "=" + cfg.Stream,
		HeaderStreamSeq + "=1",
		HeaderSubject + "=" + orig.Subject,
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("Jetsink-* headers of the letter:\n got %v\nwant %v", got, want)
	}
	if v := m.Header.Get("X-Jetsink-Origin"); v != "kept" {
		t.Errorf("X-Jetsink-Origin = %q, want the original's %q", v, "kept")
	}
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
	makeStream(t, ctx, js, cfg)
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

// silentDeadLetterStream is a consumer (ack_wait 8 s: a dead-letter publish
// may take 1 s) of a fresh event stream, whose dead-letter subject no
// stream captures and a plain subscriber, silent, takes: a dead-letter
// publish gets no answer.
func silentDeadLetterStream(t *testing.T, ctx context.Context) (Config, jetstream.JetStream, *Consumer, *nats.Subscription) {
	t.Helper()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = 8 * time.Second
	js := jsFor(t, srv)
	makeStream(t, ctx, js, cfg)
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
	return cfg, js, c, silent
}

// A dead-letter publish that gets no answer (here a plain subscriber on
// the subject, which never replies, and no stream) gives up after
// min(5 s, ack_wait/8), not after nats.go's 5 s, and the event is nak'ed:
// a worker dead-lettering a run of poison events must not hold the events
// behind it in its ring near their ack_wait.
func TestDeadLetterPublishIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, js, c, silent := silentDeadLetterStream(t, ctx)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	began := time.Now()
	err := c.DeadLetter(ctx, &ev, pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"})
	took := time.Since(began)
	if !errors.Is(err, ErrDeadLetter) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DeadLetter with nobody answering = %v, want ErrDeadLetter wrapping context.DeadlineExceeded", err)
	}
	// Midway to nats.go's 5 s, for a loaded machine.
	if want := cfg.AckWait / 8; took < want || took > want+(5*time.Second-want)/2 {
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
	ctx, cfg, c, js, dlq := dlqSetup(t)
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
		m.Header.Get(HeaderDelivered) != strconv.Itoa(cfg.MaxDeliver+1) || !isDeadLetterID(m.Header.Get(HeaderMsgID), cfg.Stream, 1, cfg.Consumer) || m.Header.Get(HeaderConsumer) != cfg.Consumer ||
		m.Header.Get(HeaderOrigMsgID) != "m0" || m.Header.Get("traceparent") != traceparent {
		t.Fatalf("dead letter = %q %v", m.Data, m.Header)
	}
}

// An event whose dead letter fails on its delivery past max_deliver is
// nak'ed and delivered again, however long the outage lasts and whether or
// not a jetsink is running when the nak's delay runs out: the server sets
// no limit of its own, so it never gives up on the event (with the
// durable's MaxDeliver at max_deliver + 1 it did, and only its
// MAX_DELIVERIES advisory, sent once, said so).
func TestMaxDeliverDeadLetterOutlastsOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = time.Second
	cfg.MaxDeliver = 1
	// No create_stream, which would re-create a dead-letter stream, and no
	// dead-letter stream: the outage.
	js := jsFor(t, srv)
	makeStream(t, ctx, js, cfg)
	cfg.CreateStream = false
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	if ev := r.next(t, ctx).ev; ev.Delivered != 1 || ev.Exhausted {
		t.Fatalf("first delivery: count %d, exhausted %v", ev.Delivered, ev.Exhausted) // left to run out
	}
	ev := r.next(t, ctx).ev
	if ev.Delivered != 2 || !ev.Exhausted {
		t.Fatalf("second delivery: count %d, exhausted %v; want 2, exhausted", ev.Delivered, ev.Exhausted)
	}
	// What the worker does with it; the dead-letter stream is gone.
	if err := c.DeadLetter(ctx, &ev, pipeline.MaxDeliverDeadLetter(uint64(ev.Delivered))); !errors.Is(err, ErrDeadLetter) {
		t.Fatalf("DeadLetter without a dead-letter stream = %v, want ErrDeadLetter", err)
	}
	// No jetsink runs while the nak's delay runs out.
	r.stopClean(t, ctx)
	_ = c.Close(context.Background())
	select {
	case <-time.After(nakDelay(2) + time.Second):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}

	dlq := dlqStream(t, ctx, js, cfg)
	c2 := newConsumer(t, ctx, cfg)
	r2 := startRun(t, ctx, c2, 1, 16, 16)
	ev = r2.next(t, ctx).ev
	if ev.Delivered != 3 || !ev.Exhausted {
		t.Fatalf("after the outage: delivery %d, exhausted %v; want 3, exhausted", ev.Delivered, ev.Exhausted)
	}
	if err := c2.DeadLetter(ctx, &ev, pipeline.MaxDeliverDeadLetter(uint64(ev.Delivered))); err != nil {
		t.Fatalf("DeadLetter after the outage: %v", err)
	}
	waitFor(t, ctx, "the dead letter", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
	waitFor(t, ctx, "the term", func() bool {
		lag, err := c2.Lag(ctx)
		return err == nil && lag.AckFloor == 1 && lag.NumAckPending == 0
	})
	if st := c2.Stats(); st.MaxDelivered != 1 || st.DeadLetterFailed != 0 {
		t.Fatalf("stats %+v, want MaxDelivered 1", st)
	}
	r2.stopClean(t, ctx)
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

// isDeadLetterID reports whether id is "<stream>:<seq>:<Unix ns>:<consumer>".
func isDeadLetterID(id, stream string, seq uint64, consumer string) bool {
	rest, ok := strings.CutPrefix(id, stream+":"+strconv.FormatUint(seq, 10)+":")
	if !ok {
		return false
	}
	ns, ok := strings.CutSuffix(rest, ":"+consumer)
	if !ok {
		return false
	}
	_, err := strconv.ParseInt(ns, 10, 64)
	return err == nil
}

// A poison event close to max_payload: the dead letter's reason is cut so
// that the letter fits (the body and the other headers whole); one that
// cannot fit even without a reason fails, nak'ed, and says why.
func TestDeadLetterOfALargeEventFitsMaxPayload(t *testing.T) {
	ctx, cfg, c, js, dlq := dlqSetup(t)
	maxPayload := int(c.nc.MaxPayload())

	// The letter's own headers (ids, subject, stream, sequence, stage,
	// code) take about 250 bytes and a full reason 512 more: 600 bytes
	// under max_payload fits the first and part of the second.
	fits := []byte(strings.Repeat("x", maxPayload-600))
	tooBig := []byte(strings.Repeat("x", maxPayload-100))
	for i, data := range [][]byte{fits, tooBig} {
		m := &nats.Msg{Subject: subjectOf(cfg, i, 1), Data: data, Header: nats.Header{}}
		m.Header.Set(HeaderMsgID, "big-"+strconv.Itoa(i))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("publish event %d of %d bytes: %v", i, len(data), err)
		}
	}
	r := startRun(t, ctx, c, 1, 16, 16)
	reason := "invalid character 'x' looking for beginning of value " + strings.Repeat("y", MaxReasonLen)
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Reason: reason, Code: "invalid_json"}

	ev := r.next(t, ctx).ev
	if err := c.DeadLetter(ctx, &ev, dl); err != nil {
		t.Fatalf("DeadLetter of a %d-byte event: %v", len(ev.Data), err)
	}
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatalf("no dead letter stored: %v", err)
	}
	got := m.Header.Get(HeaderReason)
	if len(m.Data) != len(fits) || got == "" || len(got) >= MaxReasonLen || !strings.HasPrefix(reason, got) ||
		m.Header.Get(HeaderStreamSeq) != "1" || m.Header.Get(HeaderCode) != "invalid_json" {
		t.Fatalf("dead letter: %d-byte body (want %d), reason %d bytes %q, headers %v", len(m.Data), len(fits), len(got), got, m.Header)
	}

	ev = r.next(t, ctx).ev
	err = c.DeadLetter(ctx, &ev, dl)
	if !errors.Is(err, ErrDeadLetter) || !errors.Is(err, nats.ErrMaxPayload) || !strings.Contains(err.Error(), "max_payload "+strconv.Itoa(maxPayload)) {
		t.Fatalf("DeadLetter of a %d-byte event = %v, want ErrDeadLetter saying max_payload", len(ev.Data), err)
	}
	if st := c.Stats(); st.DeadLettered != 1 || st.DeadLetterFailed != 1 {
		t.Fatalf("Stats = %+v", st)
	}
	r.stopClean(t, ctx)
}

// A dead-letter stream that stops answering (here a plain subscriber on
// the subject, which never replies, and no stream) costs one publish
// timeout, not one per poison event: after the first publish times out,
// dead letters fail at once, nak'ed and counted as failed publishes, with
// nothing acked or terminated, until a probe (one at a time, at most every
// second) gets a PubAck.
func TestDeadLetterBreakerFailsFastUntilAProbeIsAnswered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, js, c, silent := silentDeadLetterStream(t, ctx)
	sent := func() int {
		n, _, _ := silent.Pending()
		return n
	}
	const n = 4
	publish(t, ctx, js, cfg, n, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	evs := make([]pipeline.Event, n)
	for i := range evs {
		evs[i] = r.next(t, ctx).ev
	}
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	timeout := c.deadLetterTimeout()

	if err := c.DeadLetter(ctx, &evs[0], dl); !errors.Is(err, ErrDeadLetter) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first DeadLetter with nobody answering = %v, want ErrDeadLetter wrapping context.DeadlineExceeded", err)
	}
	began := time.Now()
	err := c.DeadLetter(ctx, &evs[1], dl)
	// A publish waited for its timeout takes that long at least; failing
	// at once takes far less, also on a loaded machine.
	if took := time.Since(began); took >= timeout {
		t.Fatalf("the dead letter after a timed-out one took %s, a publish's timeout (%s); want it to fail at once", took, timeout)
	}
	if !errors.Is(err, ErrDeadLetter) || !errors.Is(err, errDeadLetterUnanswered) || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		t.Fatalf("DeadLetter with the breaker open = %v, want ErrDeadLetter wrapping errDeadLetterUnanswered, saying the last publish timed out", err)
	}

	// One probe at a time: while it waits for its answer, the others fail
	// at once without publishing.
	waitFor(t, ctx, "the probe to be due", func() bool { return c.dlBreaker.probeDue(time.Now()) })
	probed := make(chan error, 1)
	go func() { probed <- c.DeadLetter(ctx, &evs[2], dl) }()
	waitFor(t, ctx, "the probe at the silent subscriber", func() bool { return sent() == 2 })
	began = time.Now()
	if err := c.DeadLetter(ctx, &evs[3], dl); !errors.Is(err, errDeadLetterUnanswered) || time.Since(began) >= timeout {
		t.Fatalf("DeadLetter during a probe = %v after %s (a publish's timeout: %s), want errDeadLetterUnanswered at once", err, time.Since(began), timeout)
	}
	select {
	case err := <-probed:
		if !errors.Is(err, ErrDeadLetter) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("unanswered probe = %v, want ErrDeadLetter wrapping context.DeadlineExceeded", err)
		}
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if got := sent(); got != 2 {
		t.Fatalf("%d dead letters published, want 2 (the first and the probe)", got)
	}
	if st := c.Stats(); st.DeadLetterFailed != n || st.DeadLettered != 0 {
		t.Fatalf("Stats = %+v, want %d failed dead letters", st, n)
	}
	if lag, err := c.Lag(ctx); err != nil || lag.AckFloor != 0 {
		t.Fatalf("ack floor = %d (%v) after failed dead letters: an event was acked or terminated", lag.AckFloor, err)
	}

	// The stream answers again: every event was nak'ed and comes back; the
	// next probe closes the breaker, and the dead letter after it goes too.
	if err := silent.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	dlq := dlqStream(t, ctx, js, cfg)
	for i := range evs {
		evs[i] = r.next(t, ctx).ev
		if evs[i].Delivered != 2 {
			t.Fatalf("seq %d delivered %d times, want 2 (nak'ed once)", evs[i].StreamSeq, evs[i].Delivered)
		}
	}
	waitFor(t, ctx, "the probe to be due", func() bool { return c.dlBreaker.probeDue(time.Now()) })
	for i := range evs {
		if err := c.DeadLetter(ctx, &evs[i], dl); err != nil {
			t.Fatalf("DeadLetter %d once the stream answers: %v", i, err)
		}
	}
	if info, err := dlq.Info(ctx); err != nil || info.State.Msgs != n {
		t.Fatalf("dead-letter stream holds %v messages (%v), want %d", info.State.Msgs, err, n)
	}
	waitFor(t, ctx, "every term", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.AckFloor == n && lag.NumAckPending == 0
	})
	r.stopClean(t, ctx)
}

// The breaker on its own: a refusal neither opens nor closes it, a probe
// that is refused waits dlProbeEvery like one that times out, and a
// publish it holds back fails with the last error it recorded: the
// timeout that opened it, then a probe's refusal.
func TestDeadLetterBreakerStates(t *testing.T) {
	var b dlBreaker
	t0 := time.Unix(1000, 0)
	timedOut := context.DeadlineExceeded
	refused := jetstream.ErrNoStreamResponse
	admit := func(at time.Duration, wantProbe, wantOK bool) bool {
		t.Helper()
		probe, err := b.admit(t0.Add(at))
		if probe != wantProbe || (err == nil) != wantOK || err != nil && !errors.Is(err, errDeadLetterUnanswered) {
			t.Fatalf("admit at %s = probe %v, %v; want %v, ok %v", at, probe, err, wantProbe, wantOK)
		}
		return probe
	}
	heldBack := func(at time.Duration, last error) {
		t.Helper()
		_, err := b.admit(t0.Add(at))
		if !errors.Is(err, errDeadLetterUnanswered) || !strings.Contains(err.Error(), last.Error()) {
			t.Fatalf("admit at %s = %v, want errDeadLetterUnanswered saying %q", at, err, last)
		}
		if errors.Is(err, last) {
			t.Fatalf("admit at %s = %v wraps %v, which this call did not get", at, err, last)
		}
	}
	done := func(at time.Duration, probe bool, o dlOutcome, err error, want breakerChange) {
		t.Helper()
		if got := b.done(t0.Add(at), probe, o, err); got != want {
			t.Fatalf("done(%v, %d) at %s = %d, want %d", probe, o, at, got, want)
		}
	}
	admit(0, false, true)
	done(0, false, dlRefused, refused, breakerSame) // refused: still closed
	admit(0, false, true)
	done(time.Second, false, dlUnanswered, timedOut, breakerOpened)
	admit(time.Second+dlProbeEvery/2, false, false) // fails fast
	heldBack(time.Second+dlProbeEvery/2, timedOut)
	p := admit(time.Second+dlProbeEvery, true, true)
	admit(time.Second+dlProbeEvery, false, false) // one probe at a time
	done(3*time.Second, p, dlRefused, refused, breakerSame)
	admit(3*time.Second+dlProbeEvery/2, false, false) // a refused probe waits too
	heldBack(3*time.Second+dlProbeEvery/2, refused)   // and says why
	p = admit(3*time.Second+dlProbeEvery, true, true)
	done(5*time.Second, p, dlUnanswered, timedOut, breakerSame)
	heldBack(5*time.Second, timedOut)
	p = admit(5*time.Second+dlProbeEvery, true, true)
	done(5*time.Second+dlProbeEvery, p, dlAnswered, nil, breakerClosed)
	admit(5*time.Second+dlProbeEvery, false, true)
	admit(5*time.Second+dlProbeEvery, false, true)
}

// The open breaker's probe waits longer for its PubAck than a dead
// letter does: min(30 s, ack_wait/2), at least the dead letter's own
// min(5 s, ack_wait/8), at least 500 ms.
func TestDeadLetterProbeTimeout(t *testing.T) {
	for _, tc := range []struct{ ackWait, timeout, probe time.Duration }{
		{time.Second, 500 * time.Millisecond, 500 * time.Millisecond},
		{4 * time.Second, 500 * time.Millisecond, 2 * time.Second},
		{8 * time.Second, time.Second, 4 * time.Second},
		{30 * time.Second, 3750 * time.Millisecond, 15 * time.Second},
		{5 * time.Minute, 5 * time.Second, 30 * time.Second},
	} {
		c := &Consumer{cfg: Config{AckWait: tc.ackWait}}
		if got := c.deadLetterTimeout(); got != tc.timeout {
			t.Errorf("ack_wait %s: deadLetterTimeout %s, want %s", tc.ackWait, got, tc.timeout)
		}
		if got := c.probeTimeout(); got != tc.probe {
			t.Errorf("ack_wait %s: probeTimeout %s, want %s", tc.ackWait, got, tc.probe)
		}
	}
}

// A dead-letter stream whose PubAcks steadily take 2.5 s (here a plain
// subscriber that answers each publish so, as a duplicate), with ack_wait
// 12 s: a dead letter's 1.5 s runs out, and the breaker opens; the probe
// waits 6 s, gets its PubAck, and closes it, a duplicate's too. Before,
// the probe waited 1.5 s as well, and the breaker stayed open for good.
// (Margins of 1 s and 3.5 s either side of the answer's delay, for a slow
// machine.)
func TestDeadLetterSlowPubAcksCloseTheBreaker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = 12 * time.Second
	const answerIn = 2500 * time.Millisecond
	js := jsFor(t, srv)
	makeStream(t, ctx, js, cfg)
	cfg.CreateStream = false // no dead-letter stream
	c := newConsumer(t, ctx, cfg)
	nc := srv.Connect(t)
	slow, err := nc.SubscribeSync(cfg.DeadLetterSubject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// One publish at a time reaches it: each is answered answerIn after it is read.
	actx, stop := context.WithCancel(ctx)
	var answering sync.WaitGroup
	answering.Go(func() {
		for {
			m, err := slow.NextMsgWithContext(actx)
			if err != nil {
				return
			}
			select {
			case <-time.After(answerIn):
			case <-actx.Done():
				return
			}
			// An answer nobody waits for any more (a publish that timed
			// out) is dropped by the server: not an error here.
			_ = m.Respond([]byte(`{"stream":"SLOW","seq":1,"duplicate":true}`))
		}
	})
	t.Cleanup(func() {
		stop()
		answering.Wait()
	})
	publish(t, ctx, js, cfg, 4, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	evs := takeN(t, ctx, r, 4)
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}

	if err := c.DeadLetter(ctx, &evs[0], dl); !errors.Is(err, ErrDeadLetter) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DeadLetter with PubAcks after %v = %v, want ErrDeadLetter wrapping context.DeadlineExceeded (%v)", answerIn, err, c.deadLetterTimeout())
	}
	if err := c.DeadLetter(ctx, &evs[1], dl); !errors.Is(err, errDeadLetterUnanswered) {
		t.Fatalf("DeadLetter with the breaker open = %v, want errDeadLetterUnanswered", err)
	}
	waitFor(t, ctx, "the probe to be due", func() bool { return c.dlBreaker.probeDue(time.Now()) })
	if err := c.DeadLetter(ctx, &evs[2], dl); err != nil {
		t.Fatalf("the probe, its PubAck after %v (probe timeout %v) = %v, want nil", answerIn, c.probeTimeout(), err)
	}
	// Closed: the next dead letter is published, and waits its own 1.5 s.
	if err := c.DeadLetter(ctx, &evs[3], dl); errors.Is(err, errDeadLetterUnanswered) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DeadLetter after the probe = %v, want it published and timed out, not held back", err)
	}
	r.stopClean(t, ctx)
}

// While the breaker is open each dead letter fails in microseconds: they
// are all counted, but logged at most once every dlProbeEvery, each line
// with the number held back since the last (a run of poison events would
// log thousands of lines a second).
func TestDeadLetterBreakerOpenLogsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	var buf syncBuffer
	c, err := New(ctx, cfg, testLogger(t, &buf))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	c.dlBreaker.mu.Lock()
	c.dlBreaker.open, c.dlBreaker.next, c.dlBreaker.last = true, time.Now().Add(time.Hour), context.DeadlineExceeded
	c.dlBreaker.mu.Unlock()

	ev := pipeline.Event{Msg: &fakeMsg{}, Stream: cfg.Stream, StreamSeq: 1, Delivered: 1, Epoch: c.epochs.Current()}
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	const n = 2000
	began := time.Now()
	deadLetter := func() {
		t.Helper()
		if err := c.DeadLetter(ctx, &ev, dl); !errors.Is(err, errDeadLetterUnanswered) {
			t.Fatalf("DeadLetter with the breaker open = %v, want errDeadLetterUnanswered", err)
		}
	}
	for range n {
		deadLetter()
	}
	failedLogsBounded(t, ctx, c, &buf, n, began, deadLetter)
}

// failedLogsBounded checks the log buf of consumer c after n failed dead
// letters since began: at most one line per dlProbeEvery, and one more,
// sent by deadLetter a dlProbeEvery later, with the count held back.
func failedLogsBounded(t *testing.T, ctx context.Context, c *Consumer, buf *syncBuffer, n int, began time.Time, deadLetter func()) {
	t.Helper()
	took := time.Since(began)
	const line = "dead-letter publish failed"
	lines := strings.Count(buf.String(), line)
	if most := 1 + int(took/dlProbeEvery); lines < 1 || lines > most {
		t.Fatalf("%d failed dead letters in %s logged %d lines, want 1 to %d:\n%s", n, took, lines, most, buf.String())
	}
	waitFor(t, ctx, "dlProbeEvery to pass", func() bool { return time.Since(began.Add(took)) > dlProbeEvery })
	deadLetter()
	held, logged := 0, 0
	for _, l := range strings.Split(buf.String(), "\n") {
		if !strings.Contains(l, line) {
			continue
		}
		logged++
		_, v, ok := strings.Cut(l, "held_back=")
		if !ok {
			t.Fatalf("no held_back in %q", l)
		}
		k, err := strconv.Atoi(strings.Fields(v)[0])
		if err != nil {
			t.Fatal(err)
		}
		held += k
	}
	if logged != lines+1 || logged+held != n+1 {
		t.Fatalf("%d lines with %d held back, want %d lines and all %d dead letters accounted for:\n%s", logged, held, lines+1, n+1, buf.String())
	}
	if st := c.Stats(); st.DeadLetterFailed != uint64(n+1) {
		t.Fatalf("DeadLetterFailed = %d, want %d", st.DeadLetterFailed, n+1)
	}
}

// Dead letters the server refuses (here no stream captures the subject,
// with create_stream off) fail the same way at every delivery of every
// such event, for as long as it lasts: logged at most once every
// dlProbeEvery too, with the number held back. Before, each logged a line.
func TestDeadLetterRefusedLogsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	js := jsFor(t, srv)
	makeStream(t, ctx, js, cfg)
	c, buf := newLoggedConsumer(t, ctx, cfg)
	ev := pipeline.Event{Msg: &fakeMsg{}, Stream: cfg.Stream, StreamSeq: 1, Delivered: 1, Epoch: c.epochs.Current()}
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	deadLetter := func() {
		t.Helper()
		if err := c.DeadLetter(ctx, &ev, dl); !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Fatalf("DeadLetter without a dead-letter stream = %v, want ErrNoStreamResponse", err)
		}
	}
	const n = 50
	began := time.Now()
	for range n {
		deadLetter()
	}
	failedLogsBounded(t, ctx, c, buf, n, began, deadLetter)
}

// deletedDeadLetterStream is a running consumer (create_stream, ackWait)
// whose dead-letter stream, made by New, was deleted, with n events
// published and taken.
func deletedDeadLetterStream(t *testing.T, ctx context.Context, ackWait time.Duration, n int) (jetstream.JetStream, *Consumer, *runner, []pipeline.Event) {
	t.Helper()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv) // create_stream: true
	cfg.AckWait = ackWait
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	if err := js.DeleteStream(ctx, cfg.Stream+"_DLQ"); err != nil {
		t.Fatalf("delete the dead-letter stream New made: %v", err)
	}
	publish(t, ctx, js, cfg, n, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	evs := make([]pipeline.Event, n)
	for i := range evs {
		evs[i] = r.next(t, ctx).ev
	}
	return js, c, r, evs
}

// With create_stream, a dead-letter stream deleted while jetsink runs is
// made again by the dead letter that finds it gone, which is then sent
// once more and stored; at most every dlRecreateEvery: a dead letter that
// finds it gone again sooner fails (nak'ed), and one after that makes it.
func TestDeadLetterRecreatesDeletedStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Long enough that only the nak brings ev2 back, and again is not
	// redelivered while dlRecreateEvery passes, on a loaded machine too.
	js, c, r, evs := deletedDeadLetterStream(t, ctx, 16*time.Second, 2)
	ev1, ev2 := evs[0], evs[1]
	dlqName := c.cfg.Stream + "_DLQ"
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}

	if err := c.DeadLetter(ctx, &ev1, dl); err != nil {
		t.Fatalf("DeadLetter with the dead-letter stream deleted: %v", err)
	}
	dlq, err := js.Stream(ctx, dlqName)
	if err != nil {
		t.Fatalf("dead-letter stream not re-created: %v", err)
	}
	if info, err := dlq.Info(ctx); err != nil || info.State.Msgs != 1 || info.Config.Duplicates != 2*time.Minute {
		t.Fatalf("re-created dead-letter stream: %+v, %v; want 1 message, duplicate window 2m", info, err)
	}

	// Deleted again at once: not re-created within dlRecreateEvery.
	if err := js.DeleteStream(ctx, dlqName); err != nil {
		t.Fatal(err)
	}
	if err := c.DeadLetter(ctx, &ev2, dl); !errors.Is(err, ErrDeadLetter) || !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("DeadLetter right after a re-creation = %v, want ErrDeadLetter wrapping ErrNoStreamResponse", err)
	}
	if _, err := js.Stream(ctx, dlqName); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("dead-letter stream re-created again within %s: %v", dlRecreateEvery, err)
	}
	again := r.next(t, ctx).ev // nak'ed: it comes back
	if again.StreamSeq != ev2.StreamSeq || again.Delivered != 2 {
		t.Fatalf("got seq %d delivery %d, want seq %d again", again.StreamSeq, again.Delivered, ev2.StreamSeq)
	}
	waitFor(t, ctx, "dlRecreateEvery to pass", func() bool {
		return int64(c.sinceBase())+1-c.dlRecreated.Load() > int64(dlRecreateEvery)
	})
	if err := c.DeadLetter(ctx, &again, dl); err != nil {
		t.Fatalf("DeadLetter %s after the last re-creation: %v", dlRecreateEvery, err)
	}
	if st := c.Stats(); st.DeadLettered != 2 || st.DeadLetterFailed != 1 {
		t.Fatalf("Stats = %+v, want 2 dead-lettered, 1 failed", st)
	}
	waitFor(t, ctx, "both terms", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.AckFloor == 2 && lag.NumAckPending == 0
	})
	r.stopClean(t, ctx)
}

// With a short ack_wait (at most 4 s: a dead-letter publish may take
// 500 ms) a deleted dead-letter stream is re-created too: the publish that
// finds no stream is refused at once. nats.go retried it twice, 250 ms
// apart, so it timed out instead: the stream stayed deleted, and the
// breaker opened as if the stream did not answer.
func TestDeadLetterRecreatesDeletedStreamShortAckWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, c, r, evs := deletedDeadLetterStream(t, ctx, 2*time.Second, 1)
	if d := c.deadLetterTimeout(); d != 500*time.Millisecond {
		t.Fatalf("deadLetterTimeout = %s, want 500ms", d)
	}
	ev := evs[0]
	dlqName := c.cfg.Stream + "_DLQ"
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	if err := c.DeadLetter(ctx, &ev, dl); err != nil {
		t.Fatalf("DeadLetter with the dead-letter stream deleted: %v", err)
	}
	dlq, err := js.Stream(ctx, dlqName)
	if err != nil {
		t.Fatalf("dead-letter stream not re-created: %v", err)
	}
	if info, err := dlq.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("re-created dead-letter stream: %+v, %v; want 1 message", info, err)
	}
	c.dlBreaker.mu.Lock()
	open := c.dlBreaker.open
	c.dlBreaker.mu.Unlock()
	if open {
		t.Fatal("the breaker opened on a dead letter that found no stream")
	}
	if st := c.Stats(); st.DeadLettered != 1 || st.DeadLetterFailed != 0 {
		t.Fatalf("Stats = %+v, want 1 dead-lettered, none failed", st)
	}
	waitFor(t, ctx, "the term", func() bool {
		lag, err := c.Lag(ctx)
		return err == nil && lag.AckFloor == 1 && lag.NumAckPending == 0
	})
	r.stopClean(t, ctx)
}

// One event's dead letters are stored once only within the dead-letter
// stream's duplicate window of the first (README, "Failures and dead
// letters"): a delivery dead-lettered after it (its term lost, it came
// back late) stores a second letter.
func TestDeadLetterStoredAgainAfterDuplicateWindow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	js := jsFor(t, srv)
	makeStream(t, ctx, js, cfg)
	// Two dead letters must go within it, on a loaded machine too.
	const window = 2 * time.Second
	dlq, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream + "_DLQ", Subjects: []string{cfg.DeadLetterSubject}, Duplicates: window})
	if err != nil {
		t.Fatal(err)
	}
	cfg.CreateStream = false
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	letters := func() uint64 {
		info, err := dlq.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	if err := c.DeadLetter(ctx, &ev, dl); err != nil {
		t.Fatal(err)
	}
	stored := time.Now()
	if err := c.DeadLetter(ctx, &ev, dl); err != nil { // within the window
		t.Fatal(err)
	}
	if n := letters(); n != 1 {
		t.Fatalf("%d dead letters within the duplicate window, want 1", n)
	}
	// After it: the server forgets the id when its purge timer fires,
	// which may be late on a loaded machine, so the dead letter is sent
	// again until stored, as the redeliveries of its event would be.
	waitFor(t, ctx, "the duplicate window to pass", func() bool { return time.Since(stored) > window })
	waitFor(t, ctx, "a second dead letter after the duplicate window", func() bool {
		if err := c.DeadLetter(ctx, &ev, dl); err != nil {
			t.Fatal(err)
		}
		return letters() == 2
	})
	if n := letters(); n != 2 {
		t.Fatalf("%d dead letters after the duplicate window, want 2", n)
	}
	r.stopClean(t, ctx)
}

// Two jetsinks that read one stream through durables of their own (into two
// tables, say) share its dead-letter subject by default. Each gives up the
// same event for a reason of its own, and each letter is stored: one
// dead-letter id for both, and the dead-letter stream would drop the
// second as a duplicate, its reason lost, while its jetsink terminated the
// event all the same.
func TestDeadLettersOfTwoConsumersAreBothStored(t *testing.T) {
	ctx, cfg, c, js, dlq := dlqSetup(t)
	cfg2 := cfg
	cfg2.Consumer = cfg.Consumer + "_other"
	c2 := newConsumer(t, ctx, cfg2)
	publish(t, ctx, js, cfg, 1, 1, 0)
	for i, cc := range []*Consumer{c, c2} {
		r := startRun(t, ctx, cc, 1, 16, 16)
		ev := r.next(t, ctx).ev
		if err := cc.DeadLetter(ctx, &ev, pipeline.DeadLetter{Stage: pipeline.StageSink, Code: "constraint", Reason: "refused by table " + strconv.Itoa(i)}); err != nil {
			t.Fatalf("DeadLetter by %s: %v", cc.cfg.Consumer, err)
		}
		r.stopClean(t, ctx)
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("%d dead letters, want one from each consumer", info.State.Msgs)
	}
	for seq, want := range map[uint64]string{1: cfg.Consumer, 2: cfg2.Consumer} {
		m, err := dlq.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get(HeaderConsumer); got != want {
			t.Errorf("letter %d: %s %q, want %q", seq, HeaderConsumer, got, want)
		}
	}
}

// A user who may not publish to the dead-letter subject: the server drops
// each dead letter and says so on the connection, not to the publish.
// The publish, and the breaker's probe, end when the refusal arrives, not
// at their timeouts. The Error log, DeadLetter's error and the readiness
// check (DeadLettersDenied) name the permission to give, and the event is
// nak'ed; once it is given, the event's dead letter is stored and the
// check clears; a refusal noted before a publish began does not end it.
// Before, the log said only that the dead-letter stream did not answer,
// and the readiness check stayed green; and then each refused publish
// waited out its timeout. (The dead letter goes through nats.go with
// either pull client.)
func TestDeadLetterDeniedNamesThePermission(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, cfg, reload := permissionsServer(t, ctx)
	cfg.AckWait = 40 * time.Second // a dead-letter publish waits 5 s, a probe 20 s
	reload(cfg.DeadLetterSubject)
	c, log := newLoggedConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	want := "may not publish to " + cfg.DeadLetterSubject
	// deadLetter is DeadLetter for ev, which the server refuses: at once,
	// not after timeout (the refusal comes in milliseconds; half of
	// timeout is the margin for a loaded machine).
	deadLetter := func(ev *pipeline.Event, what string, timeout time.Duration) {
		t.Helper()
		began := time.Now()
		err := c.DeadLetter(ctx, ev, dl)
		if !errors.Is(err, ErrDeadLetter) || !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s denied by the server = %v, want ErrDeadLetter wrapping nats.ErrPermissionViolation, saying %q", what, err, want)
		}
		if took := time.Since(began); took > timeout/2 {
			t.Fatalf("%s denied by the server took %v, its timeout %v: it waited for the timeout, not the refusal", what, took, timeout)
		}
	}
	deadLetter(&ev, "DeadLetter", c.deadLetterTimeout())
	errorLine := func(msg string) bool {
		for line := range strings.Lines(log.String()) {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, msg) && strings.Contains(line, want) {
				return true
			}
		}
		return false
	}
	if !errorLine("the NATS user "+want+": give it permission") || !errorLine("dead-letter publish failed; event nak'ed") {
		t.Fatalf("no Error lines naming the permission, for the refusal and for the failed dead letter; log:\n%s", log)
	}
	if strings.Contains(log.String(), "did not answer") {
		t.Fatalf("a refused dead letter taken for an unanswered one; log:\n%s", log)
	}
	if err := c.DeadLettersDenied(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("DeadLettersDenied = %v, want it to say %q", err, want)
	}
	if lag, err := c.Lag(ctx); err != nil || lag.AckFloor != 0 {
		t.Fatalf("ack floor = %d (%v) after a denied dead letter: the event was acked or terminated", lag.AckFloor, err)
	}

	// Still denied: the nak'ed event comes back, and its dead letter, the
	// breaker's probe, which waits longer, is refused at once too.
	again := r.next(t, ctx).ev
	if again.StreamSeq != ev.StreamSeq || again.Delivered != 2 {
		t.Fatalf("got seq %d delivery %d, want seq %d again", again.StreamSeq, again.Delivered, ev.StreamSeq)
	}
	waitFor(t, ctx, "the probe to be due", func() bool { return c.dlBreaker.probeDue(time.Now()) })
	deadLetter(&again, "the breaker's probe", c.probeTimeout())

	// The permission given: the event comes back, and its dead letter,
	// the next probe, is stored.
	reload()
	again = r.next(t, ctx).ev
	if again.StreamSeq != ev.StreamSeq || again.Delivered != 3 {
		t.Fatalf("got seq %d delivery %d, want seq %d again", again.StreamSeq, again.Delivered, ev.StreamSeq)
	}
	waitFor(t, ctx, "the probe to be due", func() bool { return c.dlBreaker.probeDue(time.Now()) })
	if err := c.DeadLetter(ctx, &again, dl); err != nil {
		t.Fatalf("DeadLetter once the permission is given: %v", err)
	}
	info, err := dlqStream(t, ctx, js, cfg).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("dead-letter stream holds %d messages, want 1", info.State.Msgs)
	}
	if err := c.DeadLettersDenied(); err != nil {
		t.Fatalf("DeadLettersDenied after a dead letter was stored = %v, want nil", err)
	}

	// A refusal noted (as the connection's error handler notes one)
	// before a publish begins is not that publish's: it goes on to its
	// PubAck (a duplicate of the letter stored).
	c.noteDeadLetterDenial(fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, cfg.DeadLetterSubject))
	if err := c.DeadLettersDenied(); err == nil {
		t.Fatal("the refusal noted by hand was not noted")
	}
	if ack, err := c.publishDeadLetter(ctx, &again, c.deadLetterMsg(&again, dl)); err != nil || !ack.Duplicate {
		t.Fatalf("dead-letter publish after a refusal was noted = %+v, %v; want a duplicate's PubAck", ack, err)
	}
	r.stopClean(t, ctx)
}

// rawPublish publishes body to subject with header lines hdr ("Name:
// value" each) over a connection of its own that speaks the protocol by
// hand, as another client may: nats.go refuses to send some header names
// the server takes (writableHeaderName). It returns once the server has
// answered a PING sent after the publish.
func rawPublish(t *testing.T, url, subject string, hdr []string, body string) {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("server's first line %q: %v", line, err)
	}
	h := "NATS/1.0\r\n" + strings.Join(hdr, "\r\n") + "\r\n\r\n"
	fmt.Fprintf(conn, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}\r\nHPUB %s %d %d\r\n%s%s\r\nPING\r\n",
		subject, len(h), len(h)+len(body), h, body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("waiting for PONG: %v", err)
		}
		if strings.HasPrefix(line, "-ERR") {
			t.Fatalf("server refused the raw publish: %s", line)
		}
		if strings.HasPrefix(line, "PONG") {
			return
		}
	}
}

// An event whose header names nats.go refuses to write ("ce/type", which
// the server and other clients take) is dead-lettered without them, listed
// in Jetsink-Omitted-Headers: copied as received, they failed every publish
// of its letter (nats.ErrBadHeaderMsg), and the event was nak'ed forever.
func TestDeadLetterOmitsHeaderNamesNATSGoCannotWrite(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullClient = PullClientWire // nats.go's client cannot read such a header back
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)
	rawPublish(t, srv.URL(), subjectOf(cfg, 0, 1), []string{"ce/type: x", "X-Ok: kept", "ce/type: y", "Größe: 1"}, "not json")

	m := letterOfTheFirst(t, ctx, c, dlq)
	if got, want := m.Header.Get(HeaderOmitted), `"Gr\u00f6\u00dfe", "ce/type"`; got != want {
		t.Errorf("%s = %q, want %q", HeaderOmitted, got, want)
	}
	if v := m.Header.Get("X-Ok"); v != "kept" || string(m.Data) != "not json" {
		t.Errorf("letter's X-Ok %q, body %q; want the original's", v, m.Data)
	}
}

// Every header name deadLetterMsg writes is one nats.go writes: the
// letter of an event with every one-byte name, and others the server
// takes, is published by nats.go, and the names left out are exactly
// those nats.go refuses alone.
func TestDeadLetterHeaderNamesAreWritable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	nc := srv.Connect(t)
	names := []string{"", "ce/type", "Größe", "a b", "X-Ok", "{x}", "x\x7f"}
	for b := range 256 {
		names = append(names, string([]byte{byte(b)}))
	}
	ev := pipeline.Event{Stream: cfg.Stream, StreamSeq: 1, Subject: subjectOf(cfg, 0, 1), Header: nats.Header{}}
	var refused []string
	for _, k := range names {
		ev.Header[k] = []string{"v"}
		err := nc.PublishMsg(&nats.Msg{Subject: "probe", Header: nats.Header{k: {"v"}}})
		if err != nil && !errors.Is(err, nats.ErrBadHeaderMsg) {
			t.Fatalf("publish with header %q: %v", k, err)
		}
		if writableHeaderName(k) != (err == nil) {
			t.Errorf("writableHeaderName(%q) = %v, but nats.go's publish: %v", k, writableHeaderName(k), err)
		}
		if err != nil {
			refused = append(refused, k)
		}
	}
	m := c.deadLetterMsg(&ev, pipeline.DeadLetter{Stage: pipeline.StageDecode, Reason: "bad", Code: "invalid_json"})
	m.Subject = "probe"
	if err := nc.PublishMsg(m); err != nil {
		t.Fatalf("nats.go refuses the dead letter: %v", err)
	}
	omitted := m.Header.Get(HeaderOmitted)
	if len(omitted) > MaxReasonLen || !strings.HasSuffix(omitted, ", ...") {
		t.Errorf("%s is %d bytes, want at most %d ending in \", ...\" (more names than fit): %q", HeaderOmitted, len(omitted), MaxReasonLen, omitted)
	}
	for _, k := range names {
		if _, kept := m.Header[k]; kept == slices.Contains(refused, k) {
			t.Errorf("header %q kept: %v; nats.go refuses it: %v", k, kept, !kept)
		}
	}
}

func TestOmittedList(t *testing.T) {
	for _, tc := range []struct {
		names []string
		n     int
		want  string
	}{
		{[]string{"a/b"}, 512, `"a/b"`},
		{[]string{"a/b", "é\r\n"}, 512, `"a/b", "\u00e9\r\n"`},
		{[]string{"a/b", "c/d", "e/f"}, 14, `"a/b", ...`},
		{[]string{"a/b", "c/d"}, 12, `"a/b", "c/d"`},
		{[]string{"a/b", "c/d", "e/f"}, 17, `"a/b", "c/d", ...`},
		{[]string{strings.Repeat("/", 20)}, 10, "..."},
	} {
		if got := omittedList(tc.names, tc.n); got != tc.want || len(got) > tc.n {
			t.Errorf("omittedList(%q, %d) = %q, want %q", tc.names, tc.n, got, tc.want)
		}
	}
}

// A letter nats.go refuses for a header name (a backstop: deadLetterMsg
// leaves such names out) is given up at once by publishStale, as one over
// max_payload is: no publish of it can succeed, and retrying it would hold
// its lane until the hard stop.
func TestPublishStaleGivesUpABadHeaderName(t *testing.T) {
	ctx, cfg, c, _, _ := dlqSetup(t)
	ev := pipeline.Event{Stream: cfg.Stream, StreamSeq: 1, Subject: subjectOf(cfg, 0, 1)}
	m := &nats.Msg{Subject: cfg.DeadLetterSubject, Header: nats.Header{"ce/type": {"x"}}, Data: []byte("not json")}
	_, first := c.publishDeadLetter(ctx, &ev, m)
	if !errors.Is(first, nats.ErrBadHeaderMsg) {
		t.Fatalf("first publish: %v, want nats.ErrBadHeaderMsg", first)
	}
	stale, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.publishStale(stale, &ev, pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json"}, m, first)
	if !errors.Is(err, nats.ErrBadHeaderMsg) || stale.Err() != nil {
		t.Fatalf("publishStale: %v (its context: %v); want nats.ErrBadHeaderMsg at once, not at the hard stop", err, stale.Err())
	}
}

// A dead letter that comes back into the event stream (a source of the
// dead-letter stream added while jetsink runs, which New would refuse) is
// not dead-lettered again, which would store it under a new sequence to
// come back in turn, without end: it is nak'ed with the longest delay and
// logged at Error.
func TestDeadLetterThatCameBackIsNotDeadLetteredAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)
	sc := streamConfig(t, ctx, js, cfg.Stream)
	sc.Sources = []*jetstream.StreamSource{{Name: dlq.CachedInfo().Config.Name}}
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, cfg.DeadLetterSubject, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, ctx, c, 1, 16, 16)
	ev := r.next(t, ctx).ev
	if ev.Subject != cfg.DeadLetterSubject {
		t.Fatalf("event on %s, want the dead letter sourced back on %s", ev.Subject, cfg.DeadLetterSubject)
	}
	err := c.DeadLetter(ctx, &ev, pipeline.DeadLetter{Stage: pipeline.StageDecode, Reason: "bad", Code: "invalid_json"})
	if !errors.Is(err, ErrDeadLetter) {
		t.Fatalf("DeadLetter: %v, want ErrDeadLetter", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "sources or mirrors") || strings.Contains(msg, "re-published") {
		t.Errorf("DeadLetter: %v\nwant it to name the source, not a re-publish (it came back on the dead-letter subject)", err)
	}
	r.stopClean(t, ctx)
	loopRefused(t, ctx, dlq, c, log, 0)
	dropSourcing(t, ctx, js, cfg.Stream)
}

// loopRefused fails unless the dead-letter stream dlq holds one letter, c
// dead-lettered deadLettered events and failed one (the letter that came
// back, refused), and logged that at Error.
func loopRefused(t *testing.T, ctx context.Context, dlq jetstream.Stream, c *Consumer, log *syncBuffer, deadLettered uint64) {
	t.Helper()
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("dead-letter stream holds %d letters, want 1 (the letter that came back not dead-lettered again)", info.State.Msgs)
	}
	if s := c.Stats(); s.DeadLettered != deadLettered || s.DeadLetterFailed != 1 {
		t.Errorf("stats: %d dead-lettered, %d failed; want %d and 1", s.DeadLettered, s.DeadLetterFailed, deadLettered)
	}
	if !strings.Contains(log.String(), "level=ERROR msg=\"a dead letter came back as an event") {
		t.Errorf("log:\n%s\nwant the loop at Error", log.String())
	}
}

// A dead letter that comes back through a source that transforms its
// subject (dlq.X to in.X.fromdlq, in the event stream's subjects) is not
// on the dead-letter subject, but carries this consumer's and stream's
// Jetsink-Consumer and Jetsink-Stream: it is not dead-lettered again
// either. Before, only the subject was looked at, and such a letter was
// stored again under its new sequence, to come back in turn.
func TestDeadLetterThatCameBackTransformedIsNotDeadLetteredAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	dlq := dlqStream(t, ctx, js, cfg)
	sc := streamConfig(t, ctx, js, cfg.Stream)
	back := "in." + cfg.Stream + ".fromdlq"
	sc.Sources = []*jetstream.StreamSource{{
		Name:              dlq.CachedInfo().Config.Name,
		SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: cfg.DeadLetterSubject, Destination: back}},
	}}
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "in."+cfg.Stream+".a", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, ctx, c, 1, 16, 16)
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Reason: "bad", Code: "invalid_json"}
	first := r.next(t, ctx).ev
	if err := c.DeadLetter(ctx, &first, dl); err != nil {
		t.Fatalf("DeadLetter of the original: %v", err)
	}
	ev := r.next(t, ctx).ev
	if ev.Subject != back {
		t.Fatalf("event on %s, want the dead letter sourced back on %s", ev.Subject, back)
	}
	err := c.DeadLetter(ctx, &ev, dl)
	if !errors.Is(err, ErrDeadLetter) {
		t.Fatalf("DeadLetter of the letter that came back: %v, want ErrDeadLetter", err)
	}
	// Matched by its headers, it may also have been re-published by hand.
	if msg := err.Error(); !strings.Contains(msg, "re-published with its Jetsink-* headers") || !strings.Contains(msg, "jetsink dlq replay") {
		t.Errorf("DeadLetter of the letter that came back: %v\nwant it to name a letter re-published with its headers, and jetsink dlq replay", err)
	}
	r.stopClean(t, ctx)
	loopRefused(t, ctx, dlq, c, log, 1)
	dropSourcing(t, ctx, js, cfg.Stream)
}

// A dead-letter stream's leader election (a stepdown) answers a publish
// with no responders while the stream is there: with create_stream, it is
// not taken for a deletion ("deleted?", a re-creation), and it is not
// logged at ERROR (a publish that times out instead is: the breaker);
// the dead letter's event is nak'ed and comes back.
func TestDeadLetterStreamStepdownNotDeletion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, cfg := onCluster(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	c, logBuf := newLoggedConsumer(t, ctx, cfg) // makes <stream>_DLQ, three replicas
	publish(t, ctx, js, cfg, 200, 1, 0)
	r := startRun(t, ctx, c, 1, 256, 256)
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	nc := js.Conn()
	unanswered := 0
	for i := 0; unanswered < 2; i++ {
		if i == 150 {
			t.Fatalf("no dead letter went unanswered in %d stepdowns", i)
		}
		sctx, cancelStep := context.WithTimeout(ctx, 2*time.Second) // unanswered during an election
		resp, err := nc.RequestWithContext(sctx, "$JS.API.STREAM.LEADER.STEPDOWN."+cfg.Stream+"_DLQ", nil)
		cancelStep()
		if err != nil || !strings.Contains(string(resp.Data), `"success":true`) {
			continue // an election under way
		}
		ev := r.next(t, ctx).ev
		if err := c.DeadLetter(ctx, &ev, dl); errors.Is(err, jetstream.ErrNoStreamResponse) {
			unanswered++
		}
	}
	text := logBuf.String()
	if strings.Contains(text, "deleted?") {
		t.Errorf("a leader election taken for a deletion:\n%s", text)
	}
	// A publish the old leader took and dropped times out instead (no
	// answer at all): that opens the breaker, at ERROR as for any stream
	// that does not answer, and under load it happens. Only that.
	for l := range strings.Lines(text) {
		if strings.Contains(l, "level=ERROR") && !strings.Contains(l, "deadline exceeded") {
			t.Errorf("a leader election's no-responders logged at ERROR:\n%s", l)
		}
	}
	if !strings.Contains(text, "did not answer (a leader election?)") {
		t.Errorf("the election not said:\n%s", text)
	}
	r.stopClean(t, ctx)
}

// The stamps that space re-creating a deleted dead-letter stream
// (dlRecreated) and looking at the event stream's consumer_limits again
// (inactiveLimitAt) are on the monotonic clock, since New (sinceBase).
// Before, they were Unix nanoseconds of the wall clock, compared with it
// again: after the host's clock stepped back by D, a deleted dead-letter
// stream was not made again for D + dlRecreateEvery, and the stream's
// limit not looked at for D + inactiveLimitEvery. Here the process has
// run for an hour (base): a re-creation or a note just now holds the next
// off, one 10 minutes ago does not, and each writes a stamp of that clock.
func TestDeadLetterAndLimitStampsOnTheMonotonicClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.base = c.base.Add(-time.Hour) // keeps its monotonic reading
	now := func() int64 { return int64(c.sinceBase()) + 1 }

	c.dlRecreated.Store(now())
	if c.recreateDeadLetterStream(ctx) || strings.Contains(log.String(), "re-creating it") {
		t.Fatalf("the dead-letter stream re-created right after a re-creation; log:\n%s", log.String())
	}
	c.dlRecreated.Store(now() - int64(10*time.Minute))
	before := now()
	if !c.recreateDeadLetterStream(ctx) {
		t.Fatalf("the dead-letter stream not re-created 10 minutes after the last; log:\n%s", log.String())
	}
	if at := c.dlRecreated.Load(); at < before || at > now() {
		t.Errorf("dlRecreated = %d after a re-creation, want a stamp since New in [%d, %d]", at, before, now())
	}

	d := time.Hour
	c.inactiveLimit.Store(int64(d))
	c.inactiveLimitAt.Store(now())
	if !c.givenByStream(ctx, d) || c.inactiveLimit.Load() != int64(d) {
		t.Fatalf("the stream looked at again right after its limit was noted")
	}
	c.inactiveLimitAt.Store(now() - int64(10*time.Minute))
	before = now()
	if c.givenByStream(ctx, d) { // the stream has no limit: a look says so
		t.Fatalf("the stream's limit noted 10 minutes ago taken as the durable's inactive_threshold without a look")
	}
	if at := c.inactiveLimitAt.Load(); at < before || at > now() {
		t.Errorf("inactiveLimitAt = %d after a look, want a stamp since New in [%d, %d]", at, before, now())
	}
}

// A dead-letter publish no stream answered, and a lookup of the stream
// that captures the subject that fails otherwise than by finding none: the
// Warn says the dead-letter stream and the lookup's error apart. Before,
// the error stood where the stream's name goes: 'dead-letter stream (the
// lookup failed: context canceled) did not answer'.
func TestDeadLetterStreamLookupFailedSaidApart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	c, logBuf := newLoggedConsumer(t, ctx, testConfig(t, srv))
	gone, stop := context.WithCancel(ctx)
	stop()
	name, there := c.deadLetterStreamThere(gone)
	if name != "" || !there {
		t.Fatalf("a failed lookup gave %q, there %v; want no name, maybe there", name, there)
	}
	text := logBuf.String()
	if !strings.Contains(text, `msg="the dead-letter stream did not answer (a leader election?)`) ||
		!strings.Contains(text, `lookup_err="context canceled"`) || strings.Contains(text, "lookup failed") {
		t.Fatalf("the Warn:\n%s", text)
	}
	if got := (&dlNoLeaderError{stream: name, err: jetstream.ErrNoStreamResponse}).Error(); !strings.HasPrefix(got, "the dead-letter stream did not answer") {
		t.Fatalf("the error reads %q", got)
	}
}

// A dead-letter stream that is full (max_msgs 1, discard new) refuses the
// second letter: its event is nak'ed, not terminated; the error, the one
// Error line and the readiness check (DeadLettersDenied) name the stream
// and its limit (the line and the check give the command that raises
// it, and the other ways out); the error wraps
// pipeline.ErrDeadLetterHeldBack, so that the pipeline and the sink add no
// line of their own; the breaker holds the next letter back. Once the
// limit is raised, the events come back and their letters are stored,
// and the check clears. Before, the check stayed green, and each refusal
// was logged twice a second (the consumer's Error, the pipeline's Warn)
// with the server's words alone, "maximum messages exceeded".
func TestDeadLetterFullStreamSaysWhatToDo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	dlq := "DLQ_" + cfg.Stream
	sc := jetstream.StreamConfig{Name: dlq, Subjects: []string{cfg.DeadLetterSubject}, MaxMsgs: 1, Discard: jetstream.DiscardNew}
	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	c, log := newLoggedConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 3, 1, 0)
	r := startRun(t, ctx, c, 1, 16, 16)
	evs := []pipeline.Event{r.next(t, ctx).ev, r.next(t, ctx).ev, r.next(t, ctx).ev}
	dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}
	if err := c.DeadLetter(ctx, &evs[0], dl); err != nil {
		t.Fatalf("the first dead letter, with room for it: %v", err)
	}
	full := "dead-letter stream " + dlq + " is full (max_msgs 1, discard new, holding 1 letter)"
	raise := streamEdit(dlq, "--max-msgs 2")
	err := c.DeadLetter(ctx, &evs[1], dl)
	if !errors.Is(err, ErrDeadLetter) || !errors.Is(err, errDeadLetterFull) || !errors.Is(err, pipeline.ErrDeadLetterHeldBack) ||
		!strings.Contains(err.Error(), full) {
		t.Fatalf("DeadLetter into the full stream = %v, want ErrDeadLetter wrapping errDeadLetterFull and pipeline.ErrDeadLetterHeldBack, saying %q",
			err, full)
	}
	if err := c.DeadLettersDenied(); err == nil || !strings.Contains(err.Error(), full) || !strings.Contains(err.Error(), raise) {
		t.Fatalf("DeadLettersDenied = %v, want it to say %q and %q", err, full, raise)
	}
	c.dlBreaker.mu.Lock()
	open := c.dlBreaker.open
	c.dlBreaker.mu.Unlock()
	if !open {
		t.Fatal("the breaker is closed after a refusal for want of room: every letter would be sent to be refused")
	}
	// The breaker open: the third letter fails without a publish, and is
	// not logged again (a probe, on a machine slow enough to make it
	// one, is refused as full).
	if err := c.DeadLetter(ctx, &evs[2], dl); !errors.Is(err, pipeline.ErrDeadLetterHeldBack) {
		t.Fatalf("DeadLetter while the stream is full = %v, want pipeline.ErrDeadLetterHeldBack", err)
	}
	var lines []string
	for line := range strings.Lines(log.String()) {
		if strings.Contains(line, "level=ERROR") {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], full) || !strings.Contains(lines[0], raise) ||
		!strings.Contains(lines[0], "jetsink dlq replay") || !strings.Contains(lines[0], "nats stream purge "+dlq+" --force") {
		t.Fatalf("Error lines %q, want one saying %q, %q, jetsink dlq replay and nats stream purge; log:\n%s", lines, full, raise, log)
	}
	requireUnattended(t, "the full stream's Error line", lines[0])
	requireQuoted(t, "the full stream's Error line", lines[0])
	if strings.Contains(log.String(), "did not answer") {
		t.Fatalf("a full stream taken for one that does not answer; log:\n%s", log)
	}
	// The term reaches the server after DeadLetter returns: wait for the
	// floor to move to 1, then see it go no further.
	waitFor(t, ctx, "the ack floor at 1", func() bool { lag, err := c.Lag(ctx); return err == nil && lag.AckFloor >= 1 })
	if lag, err := c.Lag(ctx); err != nil || lag.AckFloor != 1 {
		t.Fatalf("ack floor = %d (%v), want 1: only the event whose letter was stored is terminated", lag.AckFloor, err)
	}

	// Room made: the nak'ed events come back, and their letters are
	// stored.
	sc.MaxMsgs = 10
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		ev := r.next(t, ctx).ev
		// The breaker closed, or its probe due.
		waitFor(t, ctx, "the probe to be due", func() bool { return c.dlBreaker.untilProbe(time.Now()) == 0 })
		if err := c.DeadLetter(ctx, &ev, dl); err != nil {
			t.Fatalf("DeadLetter of seq %d once the limit is raised: %v", ev.StreamSeq, err)
		}
	}
	info, err := dlqStream(t, ctx, js, cfg).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("dead-letter stream holds %d letters, want 3", info.State.Msgs)
	}
	if err := c.DeadLettersDenied(); err != nil {
		t.Fatalf("DeadLettersDenied once letters are stored again = %v, want nil", err)
	}
	if !strings.Contains(log.String(), "the dead-letter stream has room again") {
		t.Fatalf("no line saying the dead-letter stream has room again; log:\n%s", log)
	}
	r.stopClean(t, ctx)
}

// fullLimit tells a refusal for want of room by the server's error code
// (and, for 10077, the store's error it carries), through nats.go's
// wrapping, from the other refusals; deadLetterFullWords names the limit
// and gives a command natscli runs unattended, quoted for a shell.
func TestDeadLetterFullLimit(t *testing.T) {
	api := func(code int, errCode jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("nats: %w", &jetstream.APIError{Code: code, ErrorCode: errCode, Description: desc})
	}
	info := &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: "DLQ$x", MaxMsgs: 1000, MaxBytes: 1 << 20, MaxMsgsPerSubject: 5},
		State: jetstream.StreamState{Msgs: 1000, Bytes: 1 << 20}}
	for _, tc := range []struct {
		name  string
		err   error
		limit string // "" for not for want of room
		say   []string
	}{
		{"max_msgs", api(503, 10077, "maximum messages exceeded"), "max_msgs",
			[]string{"dead-letter stream DLQ$x is full (max_msgs 1000, discard new, holding 1000 letters)", "nats stream edit 'DLQ$x' --force --max-msgs 2000"}},
		{"max_bytes", api(503, 10077, "maximum bytes exceeded"), "max_bytes",
			[]string{"(max_bytes 1048576, discard new, holding 1048576 bytes)", "--max-bytes 2097152"}},
		{"max_msgs_per_subject", api(503, 10077, "maximum messages per subject exceeded"), "max_msgs_per_subject",
			[]string{"(max_msgs_per_subject 5, discard new)", "--max-msgs-per-subject 10"}},
		{"server store", api(503, 10023, "insufficient resources"), fullServer,
			[]string{"the NATS server's JetStream store is full", "max_file_store", "nats stream purge 'DLQ$x' --force"}},
		{"server store, reservation", api(500, 10047, "insufficient storage resources available"), fullServer, []string{"max_file_store"}},
		{"account", api(400, 10002, "resource limits exceeded for account"), fullAccount, []string{"account's JetStream storage limit"}},
		{"message too large", api(503, 10077, "message too large"), "", nil},
		{"max_msg_size", api(400, 10054, "message size exceeds maximum allowed"), "", nil},
		{"no stream", jetstream.ErrNoStreamResponse, "", nil},
		{"timeout", context.DeadlineExceeded, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit, ok := fullLimit(tc.err)
			if limit != tc.limit || ok != (tc.limit != "") {
				t.Fatalf("fullLimit(%v) = %q, %v; want %q", tc.err, limit, ok, tc.limit)
			}
			if !ok {
				return
			}
			what, fix := deadLetterFullWords(limit, info, "dlq.x", 100)
			text := what + ": " + fix
			for _, say := range tc.say {
				if !strings.Contains(text, say) {
					t.Errorf("words %q, want them to say %q", text, say)
				}
			}
			if requireUnattended(t, "deadLetterFullWords", text); requireQuoted(t, "deadLetterFullWords", text) == 0 {
				t.Errorf("words %q give no nats command", text)
			}
			// The stream not looked up: named by its subject.
			what, fix = deadLetterFullWords(limit, nil, "dlq.x", 100)
			if !strings.Contains(what+fix, "the one capturing dlq.x") {
				t.Errorf("words without the stream's info %q, want them to name its subject", what+": "+fix)
			}
		})
	}
}

// fullDeadLetterStream is a consumer whose dead-letter stream holds one
// letter at most (max_msgs 1, discard new) and holds one: stored from
// the fake event it returns with the others, numbered 1 to n. Its
// log is kept.
func fullDeadLetterStream(t *testing.T, ctx context.Context, n int) (Config, jetstream.JetStream, *Consumer, *syncBuffer, []*pipeline.Event) {
	t.Helper()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.AckWait = 4 * time.Second // a publish waits 500 ms for its answer, a probe 2 s
	sc := jetstream.StreamConfig{Name: "DLQ_" + cfg.Stream, Subjects: []string{cfg.DeadLetterSubject}, MaxMsgs: 1, Discard: jetstream.DiscardNew}
	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	c, log := newLoggedConsumer(t, ctx, cfg)
	evs := make([]*pipeline.Event, n)
	for i := range evs {
		evs[i] = &pipeline.Event{Msg: &fakeMsg{}, Stream: cfg.Stream, StreamSeq: uint64(i + 1), Subject: subjectOf(cfg, i, 1),
			Delivered: 1, Epoch: c.epochs.Current()}
	}
	if err := c.DeadLetter(ctx, evs[0], badJSON); err != nil {
		t.Fatalf("the first dead letter, with room for it: %v", err)
	}
	return cfg, js, c, log, evs
}

var badJSON = pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: "invalid_json", Reason: "bad"}

// A full dead-letter stream stays reported (DeadLettersDenied, the
// readiness check) until an answer shows there is room: a publish that
// gets no answer (the stream set to no_ack stands in for one without a
// leader: in a cluster, a stream that refuses a letter for want of store
// steps its leader down), one whose ctx ended, and a duplicate's PubAck
// (the server answers a duplicate before it looks at its limits) leave
// it; a letter stored clears it. Before, any end but another refusal for
// want of room cleared it: /readyz went green while the stream was still
// full, and red again at the next refusal.
func TestDeadLetterFullKeptUntilAnAnswerShowsRoom(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, js, c, _, evs := fullDeadLetterStream(t, ctx, 3)
	if err := c.DeadLetter(ctx, evs[1], badJSON); !errors.Is(err, errDeadLetterFull) {
		t.Fatalf("DeadLetter into the full stream = %v, want errDeadLetterFull", err)
	}
	stillFull := func(after string) {
		t.Helper()
		if err := c.DeadLettersDenied(); err == nil || !strings.Contains(err.Error(), "is full (max_msgs 1") {
			t.Fatalf("DeadLettersDenied after %s = %v, want the stream still reported full", after, err)
		}
	}
	stillFull("the refusal")
	probeDue := func() {
		t.Helper()
		waitFor(t, ctx, "the probe to be due", func() bool { return c.dlBreaker.probeDue(time.Now()) })
	}
	// The letter of the first event, stored, published again (as the
	// probe; its event lends its handle to the probe's InProgress alone).
	probeDue()
	if ack, err := c.publishDeadLetter(ctx, evs[0], c.deadLetterMsg(evs[0], badJSON)); err != nil || !ack.Duplicate {
		t.Fatalf("the stored letter published again = %+v, %v; want a duplicate's PubAck", ack, err)
	}
	stillFull("a duplicate's PubAck")

	sc, err := js.Stream(ctx, "DLQ_"+cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	conf := sc.CachedInfo().Config
	conf.NoAck = true
	if _, err := js.UpdateStream(ctx, conf); err != nil {
		t.Fatal(err)
	}
	if _, err := c.publishDeadLetter(ctx, evs[2], c.deadLetterMsg(evs[2], badJSON)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a dead letter to the stream set to no_ack = %v, want our timeout", err)
	}
	stillFull("a publish that got no answer")
	probeDue()
	ended, end := context.WithCancel(ctx)
	end()
	if _, err := c.publishDeadLetter(ended, evs[2], c.deadLetterMsg(evs[2], badJSON)); !errors.Is(err, context.Canceled) {
		t.Fatalf("a dead letter whose ctx ended = %v, want context.Canceled", err)
	}
	stillFull("a publish whose ctx ended")

	// Room made, and answers again: the next probe is stored.
	conf.NoAck, conf.MaxMsgs = false, 10
	if _, err := js.UpdateStream(ctx, conf); err != nil {
		t.Fatal(err)
	}
	probeDue()
	if err := c.DeadLetter(ctx, evs[2], badJSON); err != nil {
		t.Fatalf("DeadLetter once there is room: %v", err)
	}
	if err := c.DeadLettersDenied(); err != nil {
		t.Fatalf("DeadLettersDenied once a letter is stored = %v, want nil", err)
	}
}

// Which ends of a dead-letter publish not refused for want of room show
// the stream has room (showsRoom), clearing a note that it is full.
func TestDeadLetterShowsRoom(t *testing.T) {
	api := func(errCode jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: errCode, Description: desc})
	}
	for _, tc := range []struct {
		name string
		ack  *jetstream.PubAck
		err  error
		room bool
	}{
		{"stored", &jetstream.PubAck{Stream: "DLQ", Sequence: 2}, nil, true},
		{"a duplicate", &jetstream.PubAck{Stream: "DLQ", Sequence: 1, Duplicate: true}, nil, false},
		{"refused otherwise", nil, api(10060, "expected stream does not match"), true},
		{"no stream", nil, jetstream.ErrNoStreamResponse, true},
		{"our timeout", nil, context.DeadlineExceeded, false},
		{"ctx ended", nil, context.Canceled, false},
		{"no leader", nil, &dlNoLeaderError{stream: "DLQ", err: jetstream.ErrNoStreamResponse}, false},
		{"over max_msg_size", nil, api(jetstream.JSErrCodeStreamMessageExceedsMaximum, "message size exceeds maximum allowed"), false},
		{"too large for the store", nil, api(10077, "message too large"), false},
		{"over max_payload", nil, nats.ErrMaxPayload, false},
		{"no permission", nil, fmt.Errorf("the NATS user may not publish to dlq: give it permission: %w", nats.ErrPermissionViolation), false},
	} {
		if got := showsRoom(tc.ack, tc.err); got != tc.room {
			t.Errorf("%s: showsRoom = %v, want %v", tc.name, got, tc.room)
		}
	}
}

// A dead letter larger than the dead-letter stream's max_bytes itself
// (which the server refuses as "maximum bytes exceeded", an empty stream
// too) is refused, not full: its error says how large it is and to raise
// max_bytes to that, with a command whose limit lets it in; the breaker
// stays closed, so the small letter after it is stored, and the readiness
// check is not touched. The size it gives is the server's: one byte less
// of max_bytes refuses the letter, that size stores it. Before, it read
// "is full (max_bytes 4096, discard new, holding 0 bytes)", offered
// --max-bytes 8192 for a 10 KB letter or a purge of the empty stream,
// held back the letters after it, and kept the check red for as long as
// its event came back.
func TestDeadLetterLargerThanMaxBytesIsNotFull(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	dlq := "DLQ_" + cfg.Stream
	sc := jetstream.StreamConfig{Name: dlq, Subjects: []string{cfg.DeadLetterSubject}, MaxBytes: 4096, Discard: jetstream.DiscardNew}
	s, err := js.CreateStream(ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, ctx, cfg)
	ev := func(seq uint64, size int) *pipeline.Event {
		return &pipeline.Event{Msg: &fakeMsg{}, Stream: cfg.Stream, StreamSeq: seq, Subject: subjectOf(cfg, int(seq), 1),
			Delivered: 1, Epoch: c.epochs.Current(), Data: make([]byte, size)}
	}
	big := ev(1, 10<<10)
	err = c.DeadLetter(ctx, big, badJSON)
	if !errors.Is(err, ErrDeadLetter) || errors.Is(err, errDeadLetterFull) || errors.Is(err, pipeline.ErrDeadLetterHeldBack) {
		t.Fatalf("DeadLetter of a letter over max_bytes = %v, want ErrDeadLetter, neither full nor held back", err)
	}
	var size, offered int64
	if _, scanErr := fmt.Sscanf(err.Error()[strings.Index(err.Error(), "this dead letter ("):], "this dead letter (%d bytes", &size); scanErr != nil {
		t.Fatalf("the error %q gives no size: %v", err, scanErr)
	}
	say := []string{fmt.Sprintf("is larger than the stream's max_bytes 4096, and no room made would let it in: raise max_bytes to at least %d", size),
		streamEdit(dlq, "--max-bytes ")}
	for _, w := range say {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("DeadLetter of a letter over max_bytes = %v, want it to say %q", err, w)
		}
	}
	if _, scanErr := fmt.Sscanf(err.Error()[strings.Index(err.Error(), "--max-bytes "):], "--max-bytes %d", &offered); scanErr != nil || offered < size {
		t.Fatalf("the error %q offers max_bytes %d (%v), want at least the letter's %d", err, offered, scanErr, size)
	}
	if size <= 10<<10 || size > 11<<10 {
		t.Fatalf("the letter of a 10 KiB event is said to be %d bytes", size)
	}
	if err := c.DeadLettersDenied(); err != nil {
		t.Fatalf("DeadLettersDenied after a letter over max_bytes = %v, want nil: the stream is empty", err)
	}
	if err := c.DeadLetter(ctx, ev(2, 10), badJSON); err != nil {
		t.Fatalf("a small letter after one over max_bytes: %v, want it stored", err)
	}

	// The size is the server's: max_bytes one byte less refuses the
	// letter in the empty stream, the size itself stores it.
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	sc.MaxBytes = size - 1
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if err := c.DeadLetter(ctx, big, badJSON); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("this dead letter (%d bytes", size)) {
		t.Fatalf("DeadLetter with max_bytes %d = %v, want it refused as larger than max_bytes", sc.MaxBytes, err)
	}
	sc.MaxBytes = size
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if err := c.DeadLetter(ctx, big, badJSON); err != nil {
		t.Fatalf("DeadLetter with max_bytes %d, the size given: %v", sc.MaxBytes, err)
	}
	if err := c.DeadLettersDenied(); err != nil {
		t.Fatalf("DeadLettersDenied = %v, want nil", err)
	}
}

// A dead-letter stream full at max_bytes, then purged, then sent only
// letters larger than its max_bytes: the first of them, the breaker's
// probe, finds the room (its look at the stream, noteDeadLetterFull), so
// the readiness check no longer says full, the breaker closes (the
// letter after it is sent, and refused as too large itself, not held
// back), and no line after says full. A letter too large while the
// stream is still full leaves the note. Before, the check kept saying
// "is full (max_bytes 4096, discard new, holding 2840 bytes)" of the
// empty stream, with a fix of --max-bytes 8192, and each probe pushed
// the next back while the letters between were held back as full.
func TestDeadLetterTooLargeAfterFullFindsRoom(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ_" + cfg.Stream, Subjects: []string{cfg.DeadLetterSubject},
		MaxBytes: 4096, Discard: jetstream.DiscardNew})
	if err != nil {
		t.Fatal(err)
	}
	c, log := newLoggedConsumer(t, ctx, cfg)
	ev := func(seq uint64, size int) *pipeline.Event {
		return &pipeline.Event{Msg: &fakeMsg{}, Stream: cfg.Stream, StreamSeq: seq, Subject: subjectOf(cfg, int(seq), 1),
			Delivered: 1, Epoch: c.epochs.Current(), Data: make([]byte, size)}
	}
	for seq := uint64(1); ; seq++ {
		err := c.DeadLetter(ctx, ev(seq, 1000), badJSON)
		if errors.Is(err, errDeadLetterFull) {
			break
		}
		if err != nil {
			t.Fatalf("DeadLetter %d into the stream filling up: %v", seq, err)
		}
	}
	probeDue := func() {
		t.Helper()
		waitFor(t, ctx, "the probe to be due", func() bool { return c.dlBreaker.probeDue(time.Now()) })
	}
	// Still full: a letter too large, as the probe, leaves the note.
	probeDue()
	if err := c.DeadLetter(ctx, ev(100, 10<<10), badJSON); err == nil || !strings.Contains(err.Error(), "is larger than the stream's max_bytes") {
		t.Fatalf("a letter too large for the full stream = %v, want it refused as too large", err)
	}
	if err := c.DeadLettersDenied(); err == nil || !strings.Contains(err.Error(), "is full (max_bytes 4096") {
		t.Fatalf("DeadLettersDenied after a letter too large for the still full stream = %v, want it full", err)
	}

	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	logged := len(log.String())
	probeDue()
	if err := c.DeadLetter(ctx, ev(101, 10<<10), badJSON); err == nil || !strings.Contains(err.Error(), "is larger than the stream's max_bytes") {
		t.Fatalf("the probe, too large for the purged stream = %v, want it refused as too large", err)
	}
	if err := c.DeadLettersDenied(); err != nil {
		t.Fatalf("DeadLettersDenied after a letter too large for the purged stream = %v, want nil: it has room", err)
	}
	err = c.DeadLetter(ctx, ev(102, 10<<10), badJSON)
	if err == nil || errors.Is(err, pipeline.ErrDeadLetterHeldBack) || !strings.Contains(err.Error(), "is larger than the stream's max_bytes") {
		t.Fatalf("the letter after the probe = %v, want it sent and refused as too large, not held back", err)
	}
	if err := c.DeadLetter(ctx, ev(103, 10), badJSON); err != nil {
		t.Fatalf("a small letter into the purged stream: %v", err)
	}
	after := log.String()[logged:]
	if !strings.Contains(after, "the dead-letter stream has room again") {
		t.Errorf("the log after the purge does not say the stream has room again:\n%s", after)
	}
	if strings.Contains(after, "is full") {
		t.Errorf("the log after the purge still says the stream is full:\n%s", after)
	}
}

// A letter held back by the breaker takes the full words in the log only
// while DeadLettersDenied reports them (dlFullNoted): a note older than
// dlDeniedFor is not said again. Before, fullRefusal took any note left.
func TestDeadLetterHeldBackFullWordsAgeOut(t *testing.T) {
	c := &Consumer{}
	held := fmt.Errorf("%w (the last: full)", errDeadLetterUnanswered)
	c.dlFull.Store(&dlFullError{at: time.Now(), what: "stream is full", err: errors.New("refused")})
	if f := c.fullRefusal(held); f == nil {
		t.Fatal("fullRefusal of a letter held back after a fresh note = nil, want the note")
	}
	c.dlFull.Store(&dlFullError{at: time.Now().Add(-dlDeniedFor - time.Minute), what: "stream is full", err: errors.New("refused")})
	if f := c.fullRefusal(held); f != nil {
		t.Fatalf("fullRefusal of a letter held back after a note %v old = %q, want nil, as DeadLettersDenied", dlDeniedFor+time.Minute, f.what)
	}
}

// headerLen counts a header as nats.go sends it (nats.Msg's Size): the
// values trimmed of leading and trailing spaces and tabs, none at all
// for no headers. Before, the trimmed bytes were counted.
func TestHeaderLenAsSent(t *testing.T) {
	for _, h := range []nats.Header{
		nil,
		{HeaderReason: {"plain"}},
		{HeaderReason: {"  spaced  \t"}, "X-B": {"a", " b ", ""}},
	} {
		m := &nats.Msg{Subject: "dlq", Header: h}
		if got, want := headerLen(h), m.Size()-len(m.Subject); got != want {
			t.Errorf("headerLen(%q) = %d, want %d as nats.go sends it", h, got, want)
		}
	}
}

// nakFails is a message whose nak fails in the client.
type nakFails struct{ *fakeMsg }

func (nakFails) NakWithDelay(time.Duration) error { return errors.New("nak failed in the client") }

// While the dead-letter stream is full, the lines that say more than
// that an event was nak'ed (its nak failed too; the event's stream was
// re-created, and its letter is published again until stored) are
// logged once a second as other failures are, with what is full and
// the fix, not folded into the once-a-minute line of the ordinary
// failures. Before, they went to that line: one within a minute of it
// was not logged.
func TestDeadLetterFullKeepsTheRarerLines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, _, c, log, evs := fullDeadLetterStream(t, ctx, 4)
	if err := c.DeadLetter(ctx, evs[1], badJSON); !errors.Is(err, errDeadLetterFull) {
		t.Fatalf("DeadLetter into the full stream = %v, want errDeadLetterFull", err)
	}
	if !strings.Contains(log.String(), "event nak'ed for redelivery: dead-letter stream ") {
		t.Fatalf("no line for the refusal; log:\n%s", log)
	}
	evs[2].Msg = nakFails{&fakeMsg{}}
	if err := c.DeadLetter(ctx, evs[2], badJSON); !errors.Is(err, pipeline.ErrDeadLetterHeldBack) {
		t.Fatalf("DeadLetter while the stream is full = %v, want it held back or refused as full", err)
	}
	requireLine := func(what string) {
		t.Helper()
		for line := range strings.Lines(log.String()) {
			if strings.Contains(line, what) {
				if !strings.Contains(line, "is full (max_msgs 1") || !strings.Contains(line, "fix=") {
					t.Fatalf("the line %q does not say what is full and what to do", line)
				}
				return
			}
		}
		t.Fatalf("no line %q; log:\n%s", what, log)
	}
	requireLine("dead-letter publish failed, and so did the nak")

	stale := evs[3]
	stale.Epoch = c.epochs.Current() + 1
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- c.DeadLetter(sctx, stale, badJSON) }()
	const retried = "dead-letter publish failed for an event whose stream was re-created since"
	waitFor(t, ctx, "the stale event's line", func() bool { return strings.Contains(log.String(), retried) })
	stop()
	if err := <-done; !errors.Is(err, pipeline.ErrStaleEpoch) {
		t.Fatalf("DeadLetter of a stale event stopped hard = %v, want pipeline.ErrStaleEpoch", err)
	}
	requireLine(retried)
}

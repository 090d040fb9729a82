package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// hookJS is a JetStream whose publishes, streams and consumers a test can
// interfere with.
type hookJS struct {
	jetstream.JetStream
	afterPublish func()                                                    // called after each PubAck
	deleteMsg    func(s jetstream.Stream, seq uint64) error                // replaces Stream.DeleteMsg
	fetch        func(c jetstream.Consumer) (jetstream.MessageBatch, bool) // replaces Fetch when it reports true
	// loseAnswer, when it reports true for the n-th publish (from 1), drops
	// that publish's answer after the server has acted on it: the caller
	// gets what a PubAck lost on the way gives, a timeout.
	loseAnswer func(n int) bool
	// instead, when it returns an error for the n-th publish, sends nothing
	// and returns that error.
	instead func(ctx context.Context, n int) error
	// lookup, when it returns an error for a stream's name, looks nothing
	// up and returns that error.
	lookup func(name string) error
	// consumerLookup, when it returns an error for a consumer of a
	// stream, looks nothing up and returns that error.
	consumerLookup func(stream, name string) error
	published      []*nats.Msg // every message PublishMsg was given
	answers        []*jetstream.PubAck
}

func (h *hookJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	h.published = append(h.published, m)
	if h.instead != nil {
		if err := h.instead(ctx, len(h.published)); err != nil {
			return nil, err
		}
	}
	ack, err := h.JetStream.PublishMsg(ctx, m, opts...)
	if err == nil && h.loseAnswer != nil && h.loseAnswer(len(h.published)) {
		<-ctx.Done() // the caller's wait for the answer runs out
		return nil, ctx.Err()
	}
	if err == nil {
		h.answers = append(h.answers, ack)
	}
	if err == nil && h.afterPublish != nil {
		h.afterPublish()
	}
	return ack, err
}

func (h *hookJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if h.lookup != nil {
		if err := h.lookup(name); err != nil {
			return nil, err
		}
	}
	s, err := h.JetStream.Stream(ctx, name)
	if err != nil || h.deleteMsg == nil {
		return s, err
	}
	return &hookStream{Stream: s, deleteMsg: h.deleteMsg}, nil
}

func (h *hookJS) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	if h.consumerLookup != nil {
		if err := h.consumerLookup(stream, name); err != nil {
			return nil, err
		}
	}
	return h.JetStream.Consumer(ctx, stream, name)
}

func (h *hookJS) CreateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := h.JetStream.CreateConsumer(ctx, stream, cfg)
	if err != nil || h.fetch == nil {
		return c, err
	}
	return &hookConsumer{Consumer: c, fetch: h.fetch}, nil
}

type hookStream struct {
	jetstream.Stream
	deleteMsg func(s jetstream.Stream, seq uint64) error
}

func (s *hookStream) DeleteMsg(_ context.Context, seq uint64) error {
	return s.deleteMsg(s.Stream, seq)
}

type hookConsumer struct {
	jetstream.Consumer
	fetch func(c jetstream.Consumer) (jetstream.MessageBatch, bool)
}

func (c *hookConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	if b, ok := c.fetch(c.Consumer); ok {
		return b, nil
	}
	return c.Consumer.Fetch(n, opts...)
}

// emptyBatch is a fetch that brought nothing: what a server that does not
// deliver within the wait gives.
type emptyBatch struct{}

func (emptyBatch) Messages() <-chan jetstream.Msg {
	ch := make(chan jetstream.Msg)
	close(ch)
	return ch
}
func (emptyBatch) Error() error { return nil }

// Stopping intake between a letter's PubAck and its delete (Ctrl-C at the
// worst moment) still deletes that letter, and stops before the next one.
func TestReplayStopFinishesTheLetterUnderWay(t *testing.T) {
	js, ctx := setup(t, 5)
	intake, stop := context.WithCancel(ctx)
	defer stop()
	h := &hookJS{JetStream: js, afterPublish: stop}
	var outs []Outcome
	rep, err := Replay(intake, ctx, h, Options{Stream: "EV_DLQ"}, func(_ *Letter, o Outcome) { outs = append(outs, o) })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Replay: %v, want context.Canceled", err)
	}
	if len(outs) != 1 || !outs[0].Replayed || !outs[0].Deleted || outs[0].Err != nil {
		t.Fatalf("outcomes %+v, want one letter replayed and deleted", outs)
	}
	if rep.Replayed != 1 || rep.Deleted != 1 || rep.Failed != 0 || len(rep.Undeleted) != 0 {
		t.Fatalf("report %+v", rep)
	}
	if ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); ev != 1 || dl != 4 {
		t.Fatalf("%d events, %d dead letters; want 1 and 4 (each letter in exactly one place)", ev, dl)
	}
}

// Stopping hard after a PubAck gives the delete up, and the report names
// the letter that is now both an event and a dead letter.
func TestReplayHardStopNamesTheUndeletedLetter(t *testing.T) {
	js, ctx := setup(t, 3)
	hard, stop := context.WithCancel(ctx)
	defer stop()
	h := &hookJS{JetStream: js, afterPublish: stop}
	var outs []Outcome
	rep, err := Replay(hard, hard, h, Options{Stream: "EV_DLQ"}, func(_ *Letter, o Outcome) { outs = append(outs, o) })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Replay: %v, want context.Canceled", err)
	}
	if len(outs) != 1 || !outs[0].Replayed || outs[0].Deleted || !errors.Is(outs[0].Err, ErrDelete) {
		t.Fatalf("outcomes %+v, want one replayed, not deleted, ErrDelete", outs)
	}
	if !slices.Equal(rep.Undeleted, []uint64{1}) || rep.Failed != 1 {
		t.Fatalf("report %+v, want Undeleted [1]", rep)
	}
	if dl := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); dl != 3 {
		t.Fatalf("%d dead letters, want 3", dl)
	}
}

func TestReplayRetriesTheDelete(t *testing.T) {
	injected := errors.New("injected delete failure")
	for _, tc := range []struct {
		name      string
		deleteMsg func(calls *atomic.Int32) func(jetstream.Stream, uint64) error
		deleted   bool
	}{
		{"one failure", func(calls *atomic.Int32) func(jetstream.Stream, uint64) error {
			return func(s jetstream.Stream, seq uint64) error {
				if calls.Add(1) == 1 {
					return injected
				}
				return s.DeleteMsg(context.Background(), seq)
			}
		}, true},
		{"answer lost", func(calls *atomic.Int32) func(jetstream.Stream, uint64) error {
			return func(s jetstream.Stream, seq uint64) error {
				calls.Add(1)
				if err := s.DeleteMsg(context.Background(), seq); err != nil {
					return err
				}
				return nats.ErrTimeout // deleted, but the caller never hears so
			}
		}, true},
		{"always fails", func(calls *atomic.Int32) func(jetstream.Stream, uint64) error {
			return func(jetstream.Stream, uint64) error { calls.Add(1); return injected }
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, ctx := setup(t, 1)
			var calls atomic.Int32
			h := &hookJS{JetStream: js, deleteMsg: tc.deleteMsg(&calls)}
			var out Outcome
			rep, err := Replay(ctx, ctx, h, Options{Stream: "EV_DLQ"}, func(_ *Letter, o Outcome) { out = o })
			wantUnsettled(t, err, !tc.deleted)
			left := testenv.StreamMsgs(t, ctx, js, "EV_DLQ")
			if tc.deleted {
				if !out.Deleted || out.Err != nil || rep.Deleted != 1 || len(rep.Undeleted) != 0 || left != 0 {
					t.Fatalf("outcome %+v, report %+v, %d dead letters left; want deleted", out, rep, left)
				}
				return
			}
			if out.Deleted || !errors.Is(out.Err, ErrDelete) || !errors.Is(out.Err, injected) ||
				!slices.Equal(rep.Undeleted, []uint64{1}) || left != 1 {
				t.Fatalf("outcome %+v, report %+v, %d dead letters left", out, rep, left)
			}
			if n := calls.Load(); n != deleteAttempts {
				t.Fatalf("%d delete attempts, want %d", n, deleteAttempts)
			}
		})
	}
}

// Replay ends as soon as it has read up to where it ends, without waiting
// out a fetch: when the last letter does not match the filter, and when
// the last sequence was deleted (as a previous replay leaves it).
func TestReplayEndsWithoutWaiting(t *testing.T) {
	const wait = 20 * time.Second
	t.Run("last letter filtered out", func(t *testing.T) {
		js, ctx := setup(t, 4) // letter 4 (i=3) has code c1
		start := time.Now()
		rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", DryRun: true, FetchWait: wait, Filter: Filter{Codes: []string{"c0"}}}, nil)
		if err != nil || rep.Scanned != 4 || rep.Matched != 2 {
			t.Fatalf("report %+v, %v", rep, err)
		}
		if d := time.Since(start); d > wait/2 {
			t.Fatalf("Replay took %v: it waited for a fetch after the last letter", d)
		}
	})
	t.Run("last sequence deleted", func(t *testing.T) {
		js, ctx := setup(t, 4)
		s, err := js.Stream(ctx, "EV_DLQ")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteMsg(ctx, 4); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", DryRun: true, FetchWait: wait}, nil)
		if err != nil || rep.Scanned != 3 || rep.Matched != 3 {
			t.Fatalf("report %+v, %v", rep, err)
		}
		if d := time.Since(start); d > wait/2 {
			t.Fatalf("Replay took %v: it waited for a deleted letter", d)
		}
	})
}

// A fetch that brings nothing while letters remain is retried, not taken
// for the end of the stream; one that keeps bringing nothing is an error,
// never a success with letters left behind.
func TestReplayStall(t *testing.T) {
	for _, tc := range []struct {
		stalls  int
		wantErr error
	}{
		{1, nil},
		{stallRetries, nil},
		{1000, ErrStalled},
	} {
		t.Run(fmt.Sprintf("%d stalls", tc.stalls), func(t *testing.T) {
			js, ctx := setup(t, 3)
			n := 0
			h := &hookJS{JetStream: js, fetch: func(jetstream.Consumer) (jetstream.MessageBatch, bool) {
				n++
				return emptyBatch{}, n <= tc.stalls
			}}
			rep, err := Replay(ctx, ctx, h, Options{Stream: "EV_DLQ", FetchWait: 50 * time.Millisecond}, nil)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Replay: %v, want %v", err, tc.wantErr)
			}
			left := testenv.StreamMsgs(t, ctx, js, "EV_DLQ")
			if tc.wantErr == nil && (rep.Deleted != 3 || left != 0) {
				t.Fatalf("report %+v, %d dead letters left; want all 3 replayed", rep, left)
			}
			if tc.wantErr != nil && (rep.Matched != 0 || left != 3) {
				t.Fatalf("report %+v, %d dead letters left; want none touched", rep, left)
			}
		})
	}
}

// letterFour is the dead-letter stream of setup(t, 6) and its fourth
// letter, the cutoff of the --since and --until tests.
func letterFour(t *testing.T, ctx context.Context, js jetstream.JetStream) (jetstream.Stream, *jetstream.RawStreamMsg) {
	t.Helper()
	s, err := js.Stream(ctx, "EV_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	return s, m
}

// A replay that starts at --since reads from there, and knows the stream is
// read to the end when nothing at or after that time is left (the letters
// before it are not left to read).
func TestReplaySinceEnds(t *testing.T) {
	js, ctx := setup(t, 6)
	s, m := letterFour(t, ctx, js)
	o := Options{Stream: "EV_DLQ", DryRun: true, FetchWait: 100 * time.Millisecond, Filter: Filter{Since: m.Time}}
	var seqs []uint64
	rep, err := Replay(ctx, ctx, js, o, func(l *Letter, _ Outcome) { seqs = append(seqs, l.Seq) })
	if err != nil || fmt.Sprint(seqs) != "[4 5 6]" || rep.Scanned != 3 {
		t.Fatalf("seqs %v, report %+v, %v", seqs, rep, err)
	}
	for seq := uint64(4); seq <= 6; seq++ {
		if err := s.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	rep, err = Replay(ctx, ctx, js, o, nil)
	if err != nil || rep.Scanned != 0 {
		t.Fatalf("with letters 4-6 deleted: report %+v, %v", rep, err)
	}
}

// A replay with --until stops reading at the first letter stored at or
// after it: the letters after the cutoff are neither replayed nor read
// (Report.Scanned), where before all of them were read and filtered out.
// With every letter at or after the cutoff it does not even fetch.
func TestReplayUntilStopsReading(t *testing.T) {
	js, ctx := setup(t, 6)
	_, m := letterFour(t, ctx, js)
	o := Options{Stream: "EV_DLQ", FetchWait: 100 * time.Millisecond, Filter: Filter{Until: m.Time}}
	var seqs []uint64
	rep, err := Replay(ctx, ctx, js, o, func(l *Letter, _ Outcome) { seqs = append(seqs, l.Seq) })
	if err != nil || fmt.Sprint(seqs) != "[1 2 3]" || rep.Scanned != 3 || rep.Replayed != 3 || rep.Deleted != 3 {
		t.Fatalf("seqs %v, report %+v, %v; want letters 1-3 replayed and only they read", seqs, rep, err)
	}
	if dl := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); dl != 3 {
		t.Fatalf("%d dead letters left, want 4-6", dl)
	}
	fetches := 0
	h := &hookJS{JetStream: js, fetch: func(jetstream.Consumer) (jetstream.MessageBatch, bool) { fetches++; return nil, false }}
	rep, err = Replay(ctx, ctx, h, o, nil)
	if err != nil || rep.Scanned != 0 || fetches != 0 {
		t.Fatalf("with letters 4-6 left: report %+v, %v after %d fetches; want none read, no fetch", rep, err, fetches)
	}
}

// When the server goes away, ending hard ends Replay at once whatever it
// waits for: the next fetch (jetstream's ordered consumer re-made its
// consumer there under timeouts of its own, 10 s three times, whatever the
// contexts said), or the delete of the letter under way, which is then
// reported as re-published but not deleted.
func TestReplayHardStopWhenTheServerIsGone(t *testing.T) {
	// grace is how long after the server's end hard ends: Replay is
	// blocked on NATS by then. The old fetch took over 30 s.
	const grace, within = 300 * time.Millisecond, 5 * time.Second
	t.Run("fetching", func(t *testing.T) {
		srv, js, ctx := setupServer(t, fetchBatch+1)
		hard, giveUp := context.WithCancel(ctx)
		defer giveUp()
		var gone time.Time
		each := func(l *Letter, _ Outcome) {
			if l.Seq == fetchBatch { // the last of the first fetch: the next one finds no server
				srv.Shutdown()
				gone = time.Now()
				time.AfterFunc(grace, giveUp)
			}
		}
		rep, err := Replay(hard, hard, js, Options{Stream: "EV_DLQ", DryRun: true}, each)
		took := time.Since(gone)
		if !errors.Is(err, context.Canceled) || rep.Scanned != fetchBatch {
			t.Fatalf("Replay: %+v, %v; want %d letters scanned and context.Canceled", rep, err, fetchBatch)
		}
		if took > within {
			t.Fatalf("Replay returned %v after the server stopped, %v after hard ended", took.Round(time.Millisecond), (took - grace).Round(time.Millisecond))
		}
	})
	t.Run("deleting", func(t *testing.T) {
		srv, js, ctx := setupServer(t, 2)
		hard, giveUp := context.WithCancel(ctx)
		defer giveUp()
		intake, stop := context.WithCancel(hard)
		defer stop()
		var gone time.Time
		h := &hookJS{JetStream: js, afterPublish: func() {
			srv.Shutdown()
			gone = time.Now()
			stop()
			time.AfterFunc(grace, giveUp)
		}}
		var outs []Outcome
		rep, err := Replay(intake, hard, h, Options{Stream: "EV_DLQ"}, func(_ *Letter, o Outcome) { outs = append(outs, o) })
		took := time.Since(gone)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Replay: %v, want context.Canceled", err)
		}
		if len(outs) != 1 || !outs[0].Replayed || outs[0].Deleted || !errors.Is(outs[0].Err, ErrDelete) ||
			!slices.Equal(rep.Undeleted, []uint64{1}) || rep.Failed != 1 {
			t.Fatalf("outcomes %+v, report %+v; want letter 1 replayed, not deleted, and named", outs, rep)
		}
		if took > within {
			t.Fatalf("Replay returned %v after the server stopped, %v after hard ended", took.Round(time.Millisecond), (took - grace).Round(time.Millisecond))
		}
	})
}

// A re-publish whose answer is lost after the stream stored the event is
// sent again with the same Nats-Msg-Id: the stream answers that it holds it
// already (a duplicate), and the letter is deleted, the event stored once.
// When no answer ever comes, the letter stays and the report names it as
// one whose event may be stored.
func TestReplayRetriesARepublishWithoutAnswer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		loseAnswer func(n int) bool
		replayed   bool
	}{
		{"first answer lost", func(n int) bool { return n == 1 }, true},
		{"every answer lost", func(int) bool { return true }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, ctx := setup(t, 1)
			h := &hookJS{JetStream: js, loseAnswer: tc.loseAnswer}
			var out Outcome
			rep, err := Replay(ctx, ctx, h, Options{Stream: "EV_DLQ", LetterTimeout: 1500 * time.Millisecond},
				func(_ *Letter, o Outcome) { out = o })
			wantUnsettled(t, err, !tc.replayed)
			if len(h.published) < 2 {
				t.Fatalf("%d publishes, want the lost answer's publish sent again", len(h.published))
			}
			for _, m := range h.published {
				if id := m.Header.Get(jetstream.MsgIDHeader); id != h.published[0].Header.Get(jetstream.MsgIDHeader) || id == "" {
					t.Fatalf("re-publish with Nats-Msg-Id %q, want the first one's, %q", id, h.published[0].Header.Get(jetstream.MsgIDHeader))
				}
			}
			ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ")
			if ev != 1 {
				t.Fatalf("%d events after %d publishes, want 1", ev, len(h.published))
			}
			if tc.replayed {
				if len(h.answers) != 1 || !h.answers[0].Duplicate {
					t.Fatalf("answers %+v, want one, a duplicate", h.answers)
				}
				if !out.Replayed || !out.Deleted || out.Unsure || out.Err != nil || dl != 0 || len(rep.Unsure) != 0 {
					t.Fatalf("outcome %+v, report %+v, %d dead letters left; want replayed and deleted", out, rep, dl)
				}
				return
			}
			if out.Replayed || out.Deleted || !out.Unsure || !errors.Is(out.Err, ErrPublish) || dl != 1 ||
				!slices.Equal(rep.Unsure, []uint64{1}) || rep.Failed != 1 || len(rep.Undeleted) != 0 {
				t.Fatalf("outcome %+v, report %+v, %d dead letters left; want the letter kept and named unsure", out, rep, dl)
			}
		})
	}
}

// A re-publish the stream refuses (here: full, with the discard-new policy)
// is certainly not stored: it is not sent again, and not named unsure.
func TestReplayRefusedRepublishIsNotRetried(t *testing.T) {
	js, ctx := setup(t, 1)
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "ev.full", nil); err != nil {
		t.Fatal(err)
	}
	h := &hookJS{JetStream: js}
	var out Outcome
	rep, err := Replay(ctx, ctx, h, Options{Stream: "EV_DLQ"}, func(_ *Letter, o Outcome) { out = o })
	if err != nil {
		t.Fatal(err)
	}
	var apiErr *jetstream.APIError
	if len(h.published) != 1 || !errors.Is(out.Err, ErrPublish) || !errors.As(out.Err, &apiErr) || out.Unsure ||
		len(rep.Unsure) != 0 || rep.Failed != 1 {
		t.Fatalf("%d publishes, outcome %+v, report %+v; want one refused publish, not unsure", len(h.published), out, rep)
	}
	if dl := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); dl != 1 {
		t.Fatalf("%d dead letters, want 1", dl)
	}
}

// A letter whose header has a name nats.go will not write ("ce/type": the
// server and other clients take it; another tool may have written the
// letter) is refused before anything is sent: not sent again, and not
// unsure, as an unanswered publish would be.
func TestReplayHeaderNatsGoCannotWriteIsNotUnsure(t *testing.T) {
	js, ctx := setup(t, 0)
	h := &hookJS{JetStream: js}
	l := &Letter{Subject: "ev.1", Stream: "EV", StreamSeq: 7, MsgID: "m", Header: nats.Header{"ce/type": {"x"}}, Data: []byte("{}")}
	_, unanswered, err := publish(ctx, h, l, time.Second, 2*time.Minute)
	if !errors.Is(err, nats.ErrBadHeaderMsg) || unanswered || len(h.published) != 1 {
		t.Fatalf("%d publishes, unanswered %v, err %v; want one refused before sending, not unanswered", len(h.published), unanswered, err)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV"); n != 0 {
		t.Fatalf("%d events stored, want 0", n)
	}
}

// Once an attempt went unanswered, a later refusal does not show that the
// event is not stored (the first may be stored yet): the letter is named
// unsure. The answer that the same Nats-Msg-Id is still being stored (a
// clustered stream) is not a refusal: the publish is sent again.
func TestReplayRefusalAfterNoAnswerIsUnsure(t *testing.T) {
	noAnswer := func(ctx context.Context, n int) error {
		if n == 1 {
			<-ctx.Done() // the first attempt's answer never comes
			return ctx.Err()
		}
		return nil
	}
	inProcess := func(_ context.Context, n int) error {
		if n == 1 {
			return fmt.Errorf("nats: %w", &jetstream.APIError{Code: 409, ErrorCode: jsDuplicateInProcess, Description: "duplicate message id is in process"})
		}
		return nil
	}
	for _, tc := range []struct {
		name     string
		instead  func(context.Context, int) error
		full     bool // the event stream refuses the next attempt
		replayed bool
	}{
		{"no answer, then refused", noAnswer, true, false},
		{"in process, then stored", inProcess, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, ctx := setup(t, 1)
			if tc.full {
				if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew}); err != nil {
					t.Fatal(err)
				}
				if _, err := js.Publish(ctx, "ev.full", nil); err != nil {
					t.Fatal(err)
				}
			}
			h := &hookJS{JetStream: js, instead: tc.instead}
			var out Outcome
			rep, err := Replay(ctx, ctx, h, Options{Stream: "EV_DLQ", LetterTimeout: 3 * time.Second}, func(_ *Letter, o Outcome) { out = o })
			wantUnsettled(t, err, !tc.replayed)
			if len(h.published) != 2 {
				t.Fatalf("%d publishes, want 2", len(h.published))
			}
			if tc.replayed {
				if !out.Replayed || !out.Deleted || out.Unsure || out.Err != nil {
					t.Fatalf("outcome %+v, want replayed and deleted", out)
				}
				return
			}
			var apiErr *jetstream.APIError
			if !out.Unsure || !errors.Is(out.Err, ErrPublish) || !errors.As(out.Err, &apiErr) || !slices.Equal(rep.Unsure, []uint64{1}) {
				t.Fatalf("outcome %+v, report %+v; want unsure, ending on the refusal", out, rep)
			}
		})
	}
}

// wantUnsettled requires Replay's error to be nil, or, if unsettled, to
// wrap ErrUnsettled.
func wantUnsettled(t *testing.T, err error, unsettled bool) {
	t.Helper()
	if unsettled && !errors.Is(err, ErrUnsettled) || !unsettled && err != nil {
		t.Fatalf("Replay = %v, want ErrUnsettled: %v", err, unsettled)
	}
}

// A re-publish without an answer is sent again only while the event
// stream's duplicate window would still take the copy for a duplicate:
// with a window shorter than the letter's time, the replay stops sending
// and names the letter unsure instead of storing the event twice.
func TestReplayResendsOnlyWithinTheDuplicateWindow(t *testing.T) {
	js, ctx := setup(t, 1)
	const window = 1500 * time.Millisecond
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}, Duplicates: window}); err != nil {
		t.Fatal(err)
	}
	h := &hookJS{JetStream: js, loseAnswer: func(int) bool { return true }}
	var out Outcome
	rep, err := Replay(ctx, ctx, h, Options{Stream: "EV_DLQ", LetterTimeout: 6 * time.Second}, func(_ *Letter, o Outcome) { out = o })
	wantUnsettled(t, err, true)
	ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ")
	if ev != 1 {
		t.Fatalf("%d events after %d publishes, want 1: a copy went out after the %v window", ev, len(h.published), window)
	}
	if !out.Unsure || out.Replayed || dl != 1 || !slices.Equal(rep.Unsure, []uint64{1}) || !strings.Contains(out.Err.Error(), "duplicate window (1.5s)") {
		t.Fatalf("outcome %+v, report %+v, %d dead letters left; want the letter kept and named unsure, the window named", out, rep, dl)
	}
}

package dlq

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/tests/testenv"
)

// outcomes runs Replay with o and returns each letter's outcome by its
// original subject.
func outcomes(t *testing.T, ctx context.Context, js jetstream.JetStream, o Options) (Report, map[string]Outcome, error) {
	t.Helper()
	by := map[string]Outcome{}
	rep, err := Replay(ctx, ctx, js, o, func(l *Letter, out Outcome) { by[l.Subject] = out })
	return rep, by, err
}

// A letter is replayed only where nats.consumer reads its event: on its
// stream, through a filter that takes its subject. The others stay, are
// reported, and the replay goes on; a dry run says the same and changes
// nothing. In a stream with interest retention, the event stored where no
// consumer takes it would be dropped at once, PubAck and all.
func TestReplayOnlyWhereTheConsumerReads(t *testing.T) {
	t.Run("no consumer", func(t *testing.T) {
		js, ctx := setup(t, 3)
		rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink"})
		if err != nil || rep.Failed != 3 || rep.Replayed != 0 {
			t.Fatalf("report %+v, %v; want 3 failed", rep, err)
		}
		for subj, out := range by {
			if !errors.Is(out.Err, ErrNoReader) || out.Unsure {
				t.Errorf("%s: outcome %+v, want ErrNoReader", subj, out)
			}
		}
		if ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); ev != 0 || dl != 3 {
			t.Fatalf("%d events, %d dead letters; want 0 and 3", ev, dl)
		}
	})
	for _, retention := range []jetstream.RetentionPolicy{jetstream.LimitsPolicy, jetstream.InterestPolicy} {
		t.Run("filtered, "+retention.String(), func(t *testing.T) {
			js, ctx := setup(t, 3)
			if err := js.DeleteStream(ctx, "EV"); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}, Retention: retention}); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: "jetsink", FilterSubject: "ev.1", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				t.Fatal(err)
			}
			o := Options{Stream: "EV_DLQ", Consumer: "jetsink", DryRun: true}
			rep, by, err := outcomes(t, ctx, js, o)
			if err != nil || rep.Failed != 2 || !errors.Is(by["ev.0"].Err, ErrNoReader) || by["ev.1"].Err != nil ||
				testenv.StreamMsgs(t, ctx, js, "EV_DLQ") != 3 {
				t.Fatalf("dry run: report %+v, outcomes %+v, %v", rep, by, err)
			}
			o.DryRun = false
			rep, by, err = outcomes(t, ctx, js, o)
			if err != nil || rep.Failed != 2 || rep.Replayed != 1 || !by["ev.1"].Deleted ||
				!errors.Is(by["ev.0"].Err, ErrNoReader) || !errors.Is(by["ev.2"].Err, ErrNoReader) {
				t.Fatalf("report %+v, outcomes %+v, %v", rep, by, err)
			}
			if ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); ev != 1 || dl != 2 {
				t.Fatalf("%d events, %d dead letters; want 1 (ev.1) and 2", ev, dl)
			}
		})
	}
}

// Letters another jetsink wrote (its own durable on the same stream, the
// same dead-letter subject) are left for its replay, and counted.
func TestReplayLeavesOtherConsumersLetters(t *testing.T) {
	js, ctx := setup(t, 0)
	if _, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: "jetsink", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i, who := range []string{"jetsink", "other", "jetsink", "other"} {
		putLetterData(t, ctx, js, "dlq.EV", i, []byte("{}"), nats.Header{consumer.HeaderConsumer: {who}})
	}
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink"})
	if err != nil || rep.Replayed != 2 || rep.Others != 2 || rep.Matched != 2 {
		t.Fatalf("report %+v, %v; want jetsink's 2 replayed, 2 left as the other's", rep, err)
	}
	if _, ok := by["ev.1"]; ok {
		t.Fatalf("the other consumer's letter was handled: %+v", by["ev.1"])
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 2 {
		t.Fatalf("%d dead letters left, want the other's 2", n)
	}

	// After a rename (the letters carry the old name), WrittenBy replays
	// them; the consumer that reads the stream is still Consumer.
	rep, by, err = outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink", WrittenBy: "other"})
	if err != nil || rep.Replayed != 2 || rep.Others != 0 || rep.Matched != 2 || !by["ev.0"].Deleted || !by["ev.1"].Deleted {
		t.Fatalf("report %+v, %v, outcomes %+v; want the other's 2 replayed", rep, err, by)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 0 {
		t.Fatalf("%d dead letters left, want none", n)
	}
}

// A letter that names no consumer (no Jetsink-Consumer: a jetsink from
// before it wrote it) may be another jetsink's on the same stream, whose
// cause may not be fixed: the upgrade review's replay by consumer a
// re-published consumer b's 20 such letters, a's table got 20 rows of b's
// events and b's 20 came back. Replay by a (or WrittenBy b) leaves it,
// in a dry run too, and counts it apart from the other consumer's;
// IncludeUnnamed replays it, and still not b's.
func TestReplayLeavesLettersThatNameNoConsumer(t *testing.T) {
	js, ctx := setup(t, 0)
	for _, name := range []string{"a", "b"} { // two jetsinks, each taking every subject
		if _, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	for i, who := range [][]string{{"a"}, nil, {"b"}, nil} {
		putLetterData(t, ctx, js, "dlq.EV", i, []byte("{}"), nats.Header{consumer.HeaderConsumer: who})
	}
	for _, o := range []Options{
		{Stream: "EV_DLQ", Consumer: "a", DryRun: true},
		{Stream: "EV_DLQ", Consumer: "a", WrittenBy: "b", DryRun: true},
		{Stream: "EV_DLQ", Consumer: "a"},
	} {
		rep, by, err := outcomes(t, ctx, js, o)
		if err != nil || rep.Matched != 1 || rep.Others != 1 || rep.Unnamed != 2 || !slices.Equal(rep.UnnamedLetters, []uint64{2, 4}) || rep.Failed != 0 {
			t.Fatalf("%+v: report %+v, %v; want 1 matched, 1 other's, the 2 naming no consumer (2, 4) left", o, rep, err)
		}
		if _, ok := by["ev.1"]; ok {
			t.Fatalf("%+v: the letter naming no consumer was handled: %+v", o, by["ev.1"])
		}
	}
	if ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); ev != 1 || dl != 3 {
		t.Fatalf("%d events, %d dead letters; want a's 1 replayed, b's and the 2 naming no consumer left", ev, dl)
	}
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "a", IncludeUnnamed: true})
	if err != nil || rep.Replayed != 2 || rep.Deleted != 2 || rep.Unnamed != 0 || rep.Others != 1 || !by["ev.1"].Deleted || !by["ev.0"].Deleted {
		t.Fatalf("report %+v, %v, outcomes %+v; want the 2 naming no consumer replayed, b's left", rep, err, by)
	}
	if ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); ev != 3 || dl != 1 {
		t.Fatalf("%d events, %d dead letters; want 3 and b's 1", ev, dl)
	}
}

// Jetsinks on two streams with the default dead-letter subject share one
// dead-letter stream, and their durables may have the same name: with
// EventStream, a replay leaves the letters of the other stream's events
// (which the other jetsink may not be ready to take again) and counts them.
func TestReplayLeavesOtherStreamsLetters(t *testing.T) {
	js, ctx := setup(t, 0)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV2", Subjects: []string{"ev2.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, st := range []string{"EV", "EV2"} {
		if _, err := js.CreateOrUpdateConsumer(ctx, st, jetstream.ConsumerConfig{Durable: "jetsink", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	putLetterData(t, ctx, js, "dlq.EV", 0, []byte("{}"), nil)
	putLetterData(t, ctx, js, "dlq.EV", 1, []byte("{}"), nats.Header{consumer.HeaderStream: {"EV2"}, consumer.HeaderSubject: {"ev2.1"}})
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink", EventStream: "EV"})
	if err != nil || rep.Replayed != 1 || rep.Others != 1 || rep.Matched != 1 || !by["ev.0"].Deleted {
		t.Fatalf("report %+v, %v, outcomes %+v; want EV's letter replayed, EV2's left", rep, err, by)
	}
	if _, ok := by["ev2.1"]; ok {
		t.Fatalf("the other stream's letter was handled: %+v", by["ev2.1"])
	}
	rep, by, err = outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink", EventStream: "EV2"})
	if err != nil || rep.Replayed != 1 || rep.Others != 0 || !by["ev2.1"].Deleted {
		t.Fatalf("report %+v, %v, outcomes %+v; want EV2's letter replayed", rep, err, by)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV2"); n != 1 {
		t.Fatalf("%d events in EV2, want the replayed one", n)
	}
}

// WrittenBy names whose letters are replayed, not who reads them: a
// letter is still published only where Consumer reads.
func TestReplayWrittenByStillNeedsTheReader(t *testing.T) {
	js, ctx := setup(t, 0)
	if _, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: "old", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	putLetterData(t, ctx, js, "dlq.EV", 0, []byte("{}"), nats.Header{consumer.HeaderConsumer: {"old"}})
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "new", WrittenBy: "old"})
	if err != nil || rep.Replayed != 0 || rep.Failed != 1 || rep.Matched != 1 || !errors.Is(by["ev.0"].Err, ErrNoReader) {
		t.Fatalf("report %+v, %v, outcomes %+v; want the letter left (ErrNoReader): consumer new does not read EV", rep, err, by)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 1 {
		t.Fatalf("%d dead letters left, want 1", n)
	}
}

// Two dead letters of one stored event (the second written after the
// dead-letter stream's duplicate window: both carry its Nats-Msg-Id)
// replay as one event.
func TestReplayTwoLettersOfOneEventStoreItOnce(t *testing.T) {
	js, ctx := shortWindowDLQ(t)
	putTwice(t, ctx, js, 4, nil)
	if n := testenv.StreamMsgs(t, ctx, js, "SHORT_DLQ"); n != 2 {
		t.Fatalf("%d dead letters, want the two of one event", n)
	}
	rep, err := Replay(ctx, ctx, js, Options{Stream: "SHORT_DLQ"}, nil)
	if err != nil || rep.Replayed != 2 || rep.Deleted != 2 {
		t.Fatalf("report %+v, %v", rep, err)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV"); n != 1 {
		t.Fatalf("%d events from two dead letters of one event, want 1", n)
	}
}

// shortWindowDLQ is setup(t, 0) with a dead-letter stream SHORT_DLQ
// (dlq.short) whose duplicate window is 100 ms, so that two letters with
// one Nats-Msg-Id can both be stored.
func shortWindowDLQ(t *testing.T) (jetstream.JetStream, context.Context) {
	t.Helper()
	js, ctx := setup(t, 0)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SHORT_DLQ", Subjects: []string{"dlq.short"}, Duplicates: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	return js, ctx
}

// putTwice stores dead letter i (with extra headers) in SHORT_DLQ twice,
// one Nats-Msg-Id for both: the second once the stream's window has let the
// first's id go (it answers a duplicate until then).
func putTwice(t *testing.T, ctx context.Context, js jetstream.JetStream, i int, extra nats.Header) {
	t.Helper()
	putLetterData(t, ctx, js, "dlq.short", i, []byte("{}"), extra)
	for putLetterData(t, ctx, js, "dlq.short", i, []byte("{}"), extra).Duplicate {
		if ctx.Err() != nil {
			t.Fatal("the duplicate window never let the first letter's id go")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A letter whose own Nats-Msg-Id does not name one stored event (an older
// jetsink's "<stream>:<seq>", which two events of a stream re-created under
// its name share) replays under its dead-letter sequence: the second
// event is not dropped as a duplicate of the first.
func TestReplayOfOldLettersOfOneSequence(t *testing.T) {
	js, ctx := shortWindowDLQ(t)
	putTwice(t, ctx, js, 4, nats.Header{jetstream.MsgIDHeader: {"EV:104"}})
	if n := testenv.StreamMsgs(t, ctx, js, "SHORT_DLQ"); n != 2 {
		t.Fatalf("%d dead letters, want 2", n)
	}
	rep, err := Replay(ctx, ctx, js, Options{Stream: "SHORT_DLQ"}, nil)
	if err != nil || rep.Replayed != 2 {
		t.Fatalf("report %+v, %v", rep, err)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV"); n != 2 {
		t.Fatalf("%d events from two old letters of one sequence, want 2", n)
	}
}

// A dead-letter stream that denies deletes would leave every replayed
// letter in place, its event stored too: Replay refuses, unless Keep.
func TestReplayRefusesAStreamThatDeniesDeletes(t *testing.T) {
	js, ctx := setup(t, 2)
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EV_DLQ", Subjects: []string{"dlq.EV"}, DenyDelete: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ"}, nil); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("Replay = %v, want ErrInvalidOptions", err)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV"); n != 0 {
		t.Fatalf("%d events replayed, want none", n)
	}
	if rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", Keep: true}, nil); err != nil || rep.Replayed != 2 {
		t.Fatalf("Keep: %+v, %v", rep, err)
	}
}

// A dead-letter stream shared by several jetsinks: Options.Subject reads
// only this one's letters.
func TestReplayReadsOnlyItsSubject(t *testing.T) {
	js, ctx := setup(t, 0)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ALL_DLQ", Subjects: []string{"dlq.all.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		subject := "dlq.all.mine"
		if i%2 == 1 {
			subject = "dlq.all.theirs"
		}
		putLetter(t, ctx, js, subject, i)
	}
	rep, err := Replay(ctx, ctx, js, Options{Stream: "ALL_DLQ", Subject: "dlq.all.mine"}, nil)
	if err != nil || rep.Scanned != 3 || rep.Replayed != 3 {
		t.Fatalf("report %+v, %v; want the 3 letters of dlq.all.mine", rep, err)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "ALL_DLQ"); n != 3 {
		t.Fatalf("%d dead letters left, want the other jetsink's 3", n)
	}
}

// A fetch brings at most a few MiB (its letters are in memory at once),
// but at least one letter of the server's max_payload: letters larger than
// the usual bound still come, one fetch each.
func TestReplayLettersLargerThanAFetch(t *testing.T) {
	url := serverWith(t, &server.Options{ServerName: "dlq-large", MaxPayload: 16 << 20})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js := connectJS(t, url)
	createStreams(t, ctx, js)
	big := make([]byte, fetchBytes+1<<20) // over the usual bound, under max_payload
	for i := range 3 {
		putLetterData(t, ctx, js, "dlq.EV", i, big, nil)
	}
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", FetchWait: 5 * time.Second}, nil)
	if err != nil || rep.Replayed != 3 || rep.Deleted != 3 {
		t.Fatalf("report %+v, %v; want 3 large letters replayed", rep, err)
	}
}

// A server that refuses the user the subject answers nothing to the
// publish (it tells the connection): the letter is refused, not unsure,
// within one attempt, and the replay goes on.
func TestReplayPermissionRefusalIsNotUnsure(t *testing.T) {
	admin, replay, ctx := deniedReplay(t, 3, "ev.1")
	rep, by, err := outcomes(t, ctx, replay, Options{Stream: "EV_DLQ", LetterTimeout: 3 * time.Second})
	if err != nil || rep.Replayed != 2 || rep.Failed != 1 || len(rep.Unsure) != 0 {
		t.Fatalf("report %+v, %v; want ev.1 refused, the others replayed", rep, err)
	}
	if out := by["ev.1"]; !errors.Is(out.Err, ErrPublish) || !errors.Is(out.Err, nats.ErrPermissionViolation) || out.Unsure {
		t.Fatalf("ev.1: outcome %+v, want a refusal naming the permission", out)
	}
	if ev, dl := testenv.StreamMsgs(t, ctx, admin, "EV"), testenv.StreamMsgs(t, ctx, admin, "EV_DLQ"); ev != 2 || dl != 1 {
		t.Fatalf("%d events, %d dead letters left; want 2 and ev.1's", ev, dl)
	}
}

// A user the server refuses the consumer's info replays nothing, and each
// letter fails at once after the first: the refused lookup (which the
// server does not answer) is not asked again. Before, every letter waited
// its whole LetterTimeout for it.
func TestReplayRefusedConsumerInfoIsNotAskedAgain(t *testing.T) {
	// With nats.domain on a server of that domain, the server checks the
	// $JS.API subject it maps $JS.hub.API to, and names that one.
	for _, domain := range []string{"", "hub"} {
		t.Run("domain "+domain, func(t *testing.T) {
			admin, replay, ctx := deniedReplayIn(t, 3, "$JS.API.CONSUMER.INFO.EV.>", domain)
			if _, err := admin.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: "jetsink", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				t.Fatal(err)
			}
			// Three letters of 20 s each would outlast ctx's 30 s.
			rep, by, err := outcomes(t, ctx, replay, Options{Stream: "EV_DLQ", Consumer: "jetsink", LetterTimeout: 20 * time.Second})
			if err != nil || rep.Replayed != 0 || rep.Failed != 3 || len(rep.Unsure) != 0 {
				t.Fatalf("report %+v, %v; want all 3 letters failed, none unsure", rep, err)
			}
			for subject, out := range by {
				if !errors.Is(out.Err, ErrPublish) || !errors.Is(out.Err, nats.ErrPermissionViolation) {
					t.Errorf("%s: %v; want a refusal naming the permission", subject, out.Err)
				}
			}
			if dl := testenv.StreamMsgs(t, ctx, admin, "EV_DLQ"); dl != 3 {
				t.Fatalf("%d dead letters left, want 3", dl)
			}
		})
	}
}

// A user the server refuses the creation of the consumers that read the
// dead-letter stream gets an error naming the permission after the first
// fetch's wait, not ErrStalled after four ever longer ones: the server
// answers the refused request with silence, which looked like a stall.
func TestReplayRefusedReadingIsNotAStall(t *testing.T) {
	for _, domain := range []string{"", "hub"} {
		t.Run("domain "+domain, func(t *testing.T) {
			admin, replay, ctx := deniedReplayIn(t, 3, "$JS.API.CONSUMER.CREATE.EV_DLQ.>", domain)
			rep, _, err := outcomes(t, ctx, replay, Options{Stream: "EV_DLQ", FetchWait: 500 * time.Millisecond})
			if !errors.Is(err, nats.ErrPermissionViolation) || errors.Is(err, ErrStalled) || rep.Scanned != 0 {
				t.Fatalf("report %+v, %v; want a refusal naming the permission, nothing read", rep, err)
			}
			if want := "allow the user to publish to $JS.API.CONSUMER.CREATE.EV_DLQ.>"; !strings.Contains(err.Error(), want) {
				t.Errorf("%v: does not name the subject to allow, %s", err, want)
			}
			if dl := testenv.StreamMsgs(t, ctx, admin, "EV_DLQ"); dl != 3 {
				t.Fatalf("%d dead letters left, want 3", dl)
			}
		})
	}
}

// deniedReplay starts a server with the event and dead-letter streams and
// letters dead letters on dlq.EV, and returns a connection of its admin, one
// of a user who may publish anywhere but to deny, and a 30 s context.
func deniedReplay(t *testing.T, letters int, deny string) (admin, replay jetstream.JetStream, ctx context.Context) {
	t.Helper()
	return deniedReplayIn(t, letters, deny, "")
}

// deniedReplayIn is deniedReplay on a server whose JetStream is domain
// (none if ""), with replay's JetStream addressing it by that domain.
func deniedReplayIn(t *testing.T, letters int, deny, domain string) (admin, replay jetstream.JetStream, ctx context.Context) {
	t.Helper()
	const pass = "dlq-secret"
	url := serverWith(t, &server.Options{ServerName: "dlq-denied", JetStreamDomain: domain,
		Users: []*server.User{
			{Username: "admin", Password: pass},
			{Username: "replay", Password: pass, Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{deny}},
			}},
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	admin = connectJS(t, url, nats.UserInfo("admin", pass))
	createStreams(t, ctx, admin)
	for i := range letters {
		putLetter(t, ctx, admin, "dlq.EV", i)
	}
	replay = connectJS(t, url, nats.UserInfo("replay", pass))
	if domain != "" {
		var err error
		if replay, err = (consumer.Config{Domain: domain}).JetStream(replay.Conn()); err != nil {
			t.Fatal(err)
		}
	}
	return admin, replay, ctx
}

// serverWith starts a JetStream server of opts, on a free loopback port with
// a temporary store, for the test, and returns its client URL.
func serverWith(t *testing.T, opts *server.Options) string {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return srv.ClientURL()
}

// A user that may not read the event stream's config replays none of its
// letters: without it the replay cannot tell whether the stream would
// store the event under the letter's subject. Here the stream's
// subject_transform (events.> -> events.v2.>) would store the letter's
// events.v2.x as events.v2.v2.x, and the PubAck would name the right
// stream. Each letter stays with an error naming the subject to allow;
// the refused lookup (which the server does not answer) is asked once,
// and the letters of other streams replay.
func TestReplayWithoutStreamInfo(t *testing.T) {
	admin, replay, ctx := deniedReplay(t, 0, "$JS.API.STREAM.INFO.T_EVENTS")
	if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "T_EVENTS", Subjects: []string{"events.>"},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: "events.>", Destination: "events.v2.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		putLetterData(t, ctx, admin, "dlq.EV", i, []byte(`{}`), nats.Header{consumer.HeaderSubject: {"events.v2." + strconv.Itoa(i)}, consumer.HeaderStream: {"T_EVENTS"}})
	}
	putLetter(t, ctx, admin, "dlq.EV", 3) // to ev.0, of EV
	lookups := 0
	js := &hookJS{JetStream: replay, lookup: func(name string) error {
		if name == "T_EVENTS" {
			lookups++
		}
		return nil
	}}
	var errs []error
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", LetterTimeout: 3 * time.Second}, func(l *Letter, out Outcome) {
		if l.Stream == "T_EVENTS" {
			errs = append(errs, out.Err)
		}
	})
	if err != nil || rep.Replayed != 1 || rep.Failed != 3 || len(rep.Unsure) != 0 {
		t.Fatalf("report %+v, %v; want T_EVENTS' 3 letters refused, EV's replayed", rep, err)
	}
	for _, err := range errs {
		if !errors.Is(err, ErrPublish) || !errors.Is(err, nats.ErrPermissionViolation) ||
			!strings.Contains(fmt.Sprint(err), "could not read the config of stream T_EVENTS") ||
			!strings.Contains(fmt.Sprint(err), "allow the user to publish to $JS.API.STREAM.INFO.T_EVENTS") {
			t.Errorf("%v: want ErrPublish naming the refused lookup and the subject to allow", err)
		}
	}
	if lookups != 1 {
		t.Errorf("T_EVENTS looked up %d times, want once", lookups)
	}
	if ev, tev, dl := testenv.StreamMsgs(t, ctx, admin, "EV"), testenv.StreamMsgs(t, ctx, admin, "T_EVENTS"), testenv.StreamMsgs(t, ctx, admin, "EV_DLQ"); ev != 1 || tev != 0 || dl != 3 {
		t.Fatalf("%d events in EV, %d in T_EVENTS, %d dead letters; want 1, 0 and T_EVENTS' 3", ev, tev, dl)
	}
}

// An event stream whose lookup times out is not published to either, but
// the lookup is asked again for the next letter: a timeout passes.
func TestReplayStreamLookupTimeoutIsAskedAgain(t *testing.T) {
	base, ctx := setup(t, 2)
	lookups := 0
	js := &hookJS{JetStream: base, lookup: func(name string) error {
		if name != "EV" {
			return nil
		}
		if lookups++; lookups == 1 {
			return context.DeadlineExceeded
		}
		return nil
	}}
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ"})
	if err != nil || rep.Replayed != 1 || rep.Failed != 1 || len(rep.Unsure) != 0 {
		t.Fatalf("report %+v, %v; want the first letter refused, the second replayed", rep, err)
	}
	if out := by["ev.0"]; !errors.Is(out.Err, ErrPublish) || !errors.Is(out.Err, context.DeadlineExceeded) || out.Unsure || out.Replayed {
		t.Fatalf("ev.0: %+v; want ErrPublish naming the timeout, not re-published", out)
	}
	if ev, dl := testenv.StreamMsgs(t, ctx, base, "EV"), testenv.StreamMsgs(t, ctx, base, "EV_DLQ"); ev != 1 || dl != 1 {
		t.Fatalf("%d events, %d dead letters; want 1 and 1", ev, dl)
	}
}

// A letter is re-published only to a subject its event stream captures
// (unless the stream sources others): one it no longer captures is not
// stored elsewhere, and stays.
func TestReplayOnlyToASubjectTheStreamCaptures(t *testing.T) {
	js, ctx := setup(t, 2)
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ELSEWHERE", Subjects: []string{"ev.>"}}); err != nil {
		t.Fatal(err)
	}
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ"})
	if err != nil || rep.Failed != 2 || rep.Replayed != 0 || len(rep.Unsure) != 0 {
		t.Fatalf("report %+v, %v; want both letters refused", rep, err)
	}
	if out := by["ev.0"]; !errors.Is(out.Err, ErrNoReader) || !strings.Contains(out.Err.Error(), "does not capture ev.0 (its subjects: other.>)") {
		t.Fatalf("ev.0: %v, want ErrNoReader naming the stream's subjects", out.Err)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "ELSEWHERE"); n != 0 {
		t.Fatalf("%d events stored in a stream the letters' do not name", n)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 2 {
		t.Fatalf("%d dead letters left, want 2", n)
	}
}

// A letter whose Jetsink-Subject is a JetStream API (or another service's)
// subject is not published there: anyone allowed to publish to the
// dead-letter subject could otherwise have the replay's credentials purge
// or delete a stream, or ack another consumer's messages.
func TestReplayRefusesForgedSubjects(t *testing.T) {
	js, ctx := setup(t, 0)
	for range 3 {
		if _, err := js.Publish(ctx, "ev.x", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	forged := []string{"$JS.API.STREAM.PURGE.EV", "$JS.API.STREAM.DELETE.EV", "$JS.hub.API.STREAM.PURGE.EV",
		"$JS.ACK.EV.jetsink.1.1.1.1.0", "$SYS.REQ.SERVER.PING", "_INBOX.abc", "ev.*", "ev..x", "ev.a b"}
	for i, subj := range forged {
		putLetterData(t, ctx, js, "dlq.EV", i, []byte(`{}`), nats.Header{consumer.HeaderSubject: {subj}})
	}
	// One the stream captures: the refusals do not stop the replay.
	putLetterData(t, ctx, js, "dlq.EV", len(forged), []byte(`{}`), nats.Header{consumer.HeaderSubject: {"ev.ok"}})
	for _, dry := range []bool{true, false} {
		rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", DryRun: dry})
		if err != nil || rep.Failed != len(forged) {
			t.Fatalf("dry run %v: report %+v, %v; want %d letters refused", dry, rep, err, len(forged))
		}
		for _, subj := range forged {
			if out := by[subj]; !errors.Is(out.Err, ErrNoReader) || out.Replayed || out.Unsure {
				t.Errorf("dry run %v: letter to %q: %+v, want it refused (ErrNoReader)", dry, subj, out)
			}
		}
		if by["ev.ok"].Err != nil {
			t.Errorf("dry run %v: letter to ev.ok: %v", dry, by["ev.ok"].Err)
		}
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV"); n != 4 {
		t.Fatalf("event stream holds %d messages, want its 3 and the one replayed", n)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != uint64(len(forged)) {
		t.Fatalf("%d dead letters left, want the %d forged ones", n, len(forged))
	}
}

// The permission probes name the API subjects of the JetStream the replay
// uses: nats.domain's, or an imported account's prefix.
func TestAPIPrefixOfTheJetStream(t *testing.T) {
	nc := testenv.NATS(t).Connect(t)
	plain, _ := jetstream.New(nc)
	domain, _ := jetstream.NewWithDomain(nc, "hub")
	prefix, _ := jetstream.NewWithAPIPrefix(nc, "JS.acc.API")
	for js, want := range map[jetstream.JetStream]string{plain: "$JS.API.", domain: "$JS.hub.API.", prefix: "JS.acc.API."} {
		if got := api(js); got != want {
			t.Errorf("api = %q, want %q", got, want)
		}
	}
}

// A letter's Jetsink-Subject is its event's subject as its stream stored
// it, after the stream's subject transform. Re-published to it, the event
// would be transformed again (events.> -> events.v2.>: events.v2.x stored
// as events.v2.v2.x) and the letter deleted: such a letter is refused and
// stays, naming the transform; no Source is every subject, as nats-server
// has it. A transform whose Source the stored subject does not match
// changes nothing and the letter replays; where the stream does not capture
// the stored subject, the refusal says it is the transformed one.
func TestReplayRefusesASubjectTheStreamWouldTransformAgain(t *testing.T) {
	js, ctx := setup(t, 0)
	type stream struct {
		name      string
		subjects  []string
		transform jetstream.SubjectTransformConfig
		publish   string // the event's subject as published
		stored    string // and as stored
	}
	streams := []stream{
		{"T_EVENTS", []string{"events.>"}, jetstream.SubjectTransformConfig{Source: "events.>", Destination: "events.v2.>"}, "events.x", "events.v2.x"},
		{"T_ALL", []string{"in.>"}, jetstream.SubjectTransformConfig{Destination: "in.v2.>"}, "in.x", "in.v2.in.x"},
		{"T_RAW", []string{"raw.>", "clean.>"}, jetstream.SubjectTransformConfig{Source: "raw.>", Destination: "clean.>"}, "raw.x", "clean.x"},
		{"T_AWAY", []string{"a.>"}, jetstream.SubjectTransformConfig{Source: "a.>", Destination: "b.>"}, "a.x", "b.x"},
		// A transform that gives back the subject it is given: replayed.
		{"T_SAME", []string{"fx.*"}, jetstream.SubjectTransformConfig{Source: "fx.*", Destination: "fx.{{wildcard(1)}}"}, "fx.x", "fx.x"},
	}
	for i, s := range streams {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.name, Subjects: s.subjects, SubjectTransform: &s.transform}); err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, s.publish, []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		stored, err := js.Stream(ctx, s.name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := stored.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != s.stored {
			t.Fatalf("%s stored %s as %s, want %s", s.name, s.publish, m.Subject, s.stored)
		}
		putLetterData(t, ctx, js, "dlq.EV", i, []byte(`{}`), nats.Header{consumer.HeaderSubject: {m.Subject}, consumer.HeaderStream: {s.name}})
	}
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ"})
	if err != nil || rep.Matched != 5 || rep.Replayed != 2 || rep.Failed != 3 || len(rep.Unsure) != 0 {
		t.Fatalf("report %+v, %v; want T_RAW's and T_SAME's letters replayed, the others refused", rep, err)
	}
	for subj, want := range map[string]string{
		"events.v2.x": "transforms subjects events.> -> events.v2.> (subject_transform): events.v2.x is the subject as stored",
		"in.v2.in.x":  "transforms subjects > -> in.v2.> (subject_transform): in.v2.in.x is the subject as stored",
		"b.x":         "does not capture b.x (its subjects: a.>) (the letter's subject is the one stored, after the stream's subject transform a.> -> b.>",
	} {
		if out := by[subj]; !errors.Is(out.Err, ErrNoReader) || !strings.Contains(out.Err.Error(), want) || out.Replayed || out.Deleted {
			t.Errorf("letter to %s: %+v; want it refused (ErrNoReader) with %q", subj, out, want)
		}
	}
	if out := by["clean.x"]; out.Err != nil || !out.Deleted {
		t.Errorf("letter to clean.x (T_RAW transforms raw.>): %+v, want it replayed and deleted", out)
	}
	if out := by["fx.x"]; out.Err != nil || !out.Deleted {
		t.Errorf("letter to fx.x (T_SAME's transform gives it back): %+v, want it replayed and deleted", out)
	}
	for _, s := range streams {
		want := uint64(1)
		if s.name == "T_RAW" || s.name == "T_SAME" {
			want = 2
		}
		if n := testenv.StreamMsgs(t, ctx, js, s.name); n != want {
			t.Errorf("%s holds %d events, want %d", s.name, n, want)
		}
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 3 {
		t.Fatalf("%d dead letters left, want the 3 refused", n)
	}
}

// An event stream that drops a subject's oldest message to store a new one
// (max_msgs_per_subject, with discard old, or discard new without
// discard_new_per_subject) is not replayed into: three letters of ev.0
// re-published back to back would each push the one before out before
// jetsink read it, and all three letters would be deleted. They stay,
// naming the limit, and the dry run says so too. AllowMaxMsgsPerSubject
// replays them all the same (and the stream keeps one). With
// discard_new_per_subject the stream refuses the publish instead: the
// letters it refuses stay.
func TestReplayRefusesAStreamThatDropsPerSubject(t *testing.T) {
	for _, tc := range []struct {
		name             string
		discard          jetstream.DiscardPolicy
		newPerSubject    bool
		allow            bool
		replayed, failed int
		events, letters  uint64
		want             error  // each failed letter's
		says             string // and in its error
	}{
		{"discard old", jetstream.DiscardOld, false, false, 0, 3, 0, 3, ErrNoReader,
			"stream EV, the letter's Jetsink-Stream, drops a subject's oldest message to store a new one (max_msgs_per_subject 1, discard old)"},
		{"discard new", jetstream.DiscardNew, false, false, 0, 3, 0, 3, ErrNoReader,
			"(max_msgs_per_subject 1, with discard new but not discard_new_per_subject)"},
		{"allowed", jetstream.DiscardOld, false, true, 3, 0, 1, 0, nil, ""},
		{"discard new per subject", jetstream.DiscardNew, true, false, 1, 2, 1, 2, ErrPublish, "maximum messages per subject exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, ctx := setup(t, 0)
			if err := js.DeleteStream(ctx, "EV"); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"},
				MaxMsgsPerSubject: 1, Discard: tc.discard, DiscardNewPerSubject: tc.newPerSubject}); err != nil {
				t.Fatal(err)
			}
			for _, i := range []int{0, 3, 6} { // all three to ev.0
				putLetter(t, ctx, js, "dlq.EV", i)
			}
			for _, dry := range []bool{true, false} {
				var errs []error
				rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", DryRun: dry, AllowMaxMsgsPerSubject: tc.allow}, func(l *Letter, out Outcome) {
					if out.Err != nil {
						errs = append(errs, out.Err)
					}
					if out.Unsure {
						t.Errorf("dry run %v: letter %d unsure: %v", dry, l.Seq, out.Err)
					}
				})
				wantFailed, wantReplayed := tc.failed, tc.replayed
				if dry {
					wantReplayed = 0
					if tc.want != ErrNoReader {
						wantFailed = 0 // the server's refusal is not foreseen
					}
				}
				if err != nil || rep.Matched != 3 || rep.Replayed != wantReplayed || rep.Failed != wantFailed {
					t.Fatalf("dry run %v: report %+v, %v; want %d replayed, %d failed", dry, rep, err, wantReplayed, wantFailed)
				}
				for _, err := range errs {
					if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
						t.Errorf("dry run %v: %v; want %v with %q", dry, err, tc.want, tc.says)
					}
				}
			}
			if ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); ev != tc.events || dl != tc.letters {
				t.Fatalf("%d events, %d dead letters; want %d and %d", ev, dl, tc.events, tc.letters)
			}
		})
	}
}

// A letter of a key-value bucket's event ($KV.<bucket>.<key>, or one that
// carries KV-Operation) is not replayed, dry run or not: re-published, a
// delete or purge would remove the key's current value from the user's
// bucket, a put would stand over a newer one. The letters stay, are
// counted and named, and an ordinary letter beside them is replayed. The
// letters are built from what the bucket's stream stored, as jetsink
// writes them: the event's body and headers (not its Nats-* ones) plus
// Jetsink-*. Read from the bucket's own stream, only
// AllowMaxMsgsPerSubject would let them through (its history is a
// max_msgs_per_subject); read from a stream that sources the bucket, they
// would be stored by the bucket with no option at all.
func TestReplayRefusesKeyValueLetters(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		allow        bool
	}{
		{"the bucket's stream, AllowMaxMsgsPerSubject", "KV_CFG", true},
		{"a stream sourcing the bucket", "CFG_COPY", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, ctx := setup(t, 0)
			kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CFG", History: 5})
			if err != nil {
				t.Fatal(err)
			}
			if tc.stream != "KV_CFG" {
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: tc.stream, Sources: []*jetstream.StreamSource{{Name: "KV_CFG"}}}); err != nil {
					t.Fatal(err)
				}
			}
			do := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			put := func(key, value string) uint64 {
				t.Helper()
				rev, err := kv.PutString(ctx, key, value)
				do(err)
				return rev
			}
			last := func() uint64 {
				t.Helper()
				s, err := js.Stream(ctx, "KV_CFG")
				do(err)
				return s.CachedInfo().State.LastSeq
			}
			var events []uint64 // the bucket's stream sequences of the events dead-lettered
			events = append(events, put("a", "old"))
			put("b", "gone")
			do(kv.Delete(ctx, "b"))
			events = append(events, last())
			put("b", "kept")
			put("c", "gone")
			do(kv.Purge(ctx, "c"))
			events = append(events, last())
			put("c", "kept")
			put("a", "new")
			want := map[string]string{"a": "new", "b": "kept", "c": "kept"}
			bucket, err := js.Stream(ctx, "KV_CFG")
			do(err)
			var subjects []string
			for i, seq := range events {
				m, err := bucket.GetMsg(ctx, seq)
				do(err)
				h := nats.Header{consumer.HeaderSubject: {m.Subject}, consumer.HeaderStream: {tc.stream}}
				for k, v := range m.Header {
					if !strings.HasPrefix(k, "Nats-") {
						h[k] = v
					}
				}
				putLetterData(t, ctx, js, "dlq.EV", i, m.Data, h)
				subjects = append(subjects, m.Subject)
			}
			if ops := []string{kvOp(t, ctx, bucket, events[0]), kvOp(t, ctx, bucket, events[1]), kvOp(t, ctx, bucket, events[2])}; ops[0] != "" || ops[1] != "DEL" || ops[2] != "PURGE" {
				t.Fatalf("the bucket stored operations %q, want a put, DEL and PURGE", ops)
			}
			// An event of the bucket's stored by a source under another
			// subject keeps its KV-Operation.
			putLetterData(t, ctx, js, "dlq.EV", 3, nil, nats.Header{consumer.HeaderSubject: {"ev.cfg.b"}, kvOperation: {"DEL"}})
			putLetterData(t, ctx, js, "dlq.EV", 4, []byte(`{}`), nats.Header{consumer.HeaderSubject: {"ev.ok"}})
			refused := append(subjects, "ev.cfg.b")
			before := last()
			for _, dry := range []bool{true, false} {
				rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", DryRun: dry, AllowMaxMsgsPerSubject: tc.allow})
				if err != nil || rep.Failed != 4 || rep.KeyValue != 4 || !slices.Equal(rep.KeyValueLetters, []uint64{1, 2, 3, 4}) || rep.Matched != 5 {
					t.Fatalf("dry run %v: report %+v, %v; want the 4 letters of the bucket's events refused and named", dry, rep, err)
				}
				for _, subj := range refused {
					if out := by[subj]; !errors.Is(out.Err, ErrKeyValue) || out.Replayed || out.Unsure {
						t.Errorf("dry run %v: letter to %s: %+v, want it refused (ErrKeyValue)", dry, subj, out)
					}
				}
				if msg := fmt.Sprint(by[subjects[1]].Err); !strings.Contains(msg, "a delete (KV-Operation: DEL), which would remove the key's current value") ||
					!strings.Contains(msg, "nats stream rmm EV_DLQ 2") {
					t.Errorf("dry run %v: the delete letter's error does not say what it would do and what to do instead: %s", dry, msg)
				}
				if out := by["ev.ok"]; out.Err != nil || out.Replayed == dry {
					t.Errorf("dry run %v: the ordinary letter: %+v", dry, out)
				}
			}
			for key, value := range want {
				e, err := kv.Get(ctx, key)
				if err != nil || string(e.Value()) != value {
					t.Errorf("key %s: %v, %v; want %q, as before the replay", key, e, err, value)
				} else if e.Operation() != jetstream.KeyValuePut {
					t.Errorf("key %s: operation %v", key, e.Operation())
				}
			}
			if after := last(); after != before {
				t.Errorf("the bucket's stream went from sequence %d to %d: the replay wrote into it", before, after)
			}
			if ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); ev != 1 || dl != 4 {
				t.Fatalf("%d events, %d dead letters; want 1 (ev.ok) and the 4 refused", ev, dl)
			}
		})
	}
}

// kvOp is the KV-Operation of the bucket stream's message seq.
func kvOp(t *testing.T, ctx context.Context, s jetstream.Stream, seq uint64) string {
	t.Helper()
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	return m.Header.Get(kvOperation)
}

// A letter of an object store's event (an object's chunk,
// $O.<bucket>.C.<nuid>, or its meta, $O.<bucket>.M.<name>) is not
// replayed, dry run or not, as a key-value bucket's is not: re-published,
// a chunk would be added to its object's data, which would no longer match
// its digest, and a meta would stand over the object's newer one (here an
// older version whose chunks the next put purged, and a delete over the
// object put since). The letters stay, are counted and named apart from
// key-value ones, and an ordinary letter beside them is replayed. The
// letters are built as jetsink writes them from what nats.go's object
// store wrote, read as it wrote it (a later put or delete removes it):
// the event's body and headers but its Nats-* ones (the meta's
// Nats-Rollup) plus Jetsink-*. Read from the store's own stream, which
// keeps every message of a subject, nothing else stops them; read from a
// stream that sources it, the store would store them.
func TestReplayRefusesObjectStoreLetters(t *testing.T) {
	for _, tc := range []struct{ name, stream string }{
		{"the object store's stream", "OBJ_FILES"},
		{"a stream sourcing the object store", "FILES_COPY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, ctx := setup(t, 0)
			obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "FILES"})
			if err != nil {
				t.Fatal(err)
			}
			if tc.stream != "OBJ_FILES" {
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: tc.stream, Sources: []*jetstream.StreamSource{{Name: "OBJ_FILES"}}}); err != nil {
					t.Fatal(err)
				}
			}
			do := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			bucket, err := js.Stream(ctx, "OBJ_FILES")
			do(err)
			last := func() uint64 {
				t.Helper()
				info, err := bucket.Info(ctx)
				do(err)
				return info.State.LastSeq
			}
			// stored runs op and returns the messages it stored.
			stored := func(op func() error) []*jetstream.RawStreamMsg {
				t.Helper()
				from := last() + 1
				do(op())
				var ms []*jetstream.RawStreamMsg
				for seq := from; seq <= last(); seq++ {
					m, err := bucket.GetMsg(ctx, seq)
					do(err)
					ms = append(ms, m)
				}
				return ms
			}
			put := func(name, data string) func() error {
				return func() error { return putObject(ctx, js, obs, bucket, name, data) }
			}
			oldA := stored(put("a", "old data"))    // 2 chunks, meta
			newA := stored(put("a", "new data, a")) // 3 chunks, meta; old chunks purged, old meta rolled up
			stored(put("b", "kept"))                // 1 chunk, meta
			delB := stored(func() error { return obs.Delete(ctx, "b") })
			stored(put("b", "kept again"))
			if len(oldA) != 3 || len(newA) != 4 || len(delB) != 1 {
				t.Fatalf("the object store stored %d, %d and %d messages, want 3, 4 and 1", len(oldA), len(newA), len(delB))
			}
			events := []*jetstream.RawStreamMsg{oldA[2], newA[0], delB[0]} // a's old meta, a chunk of its new data, b's delete
			if events[0].Header.Get(jetstream.MsgRollup) != jetstream.MsgRollupSubject || !strings.HasPrefix(events[0].Subject, "$O.FILES.M.") ||
				!strings.HasPrefix(events[1].Subject, "$O.FILES.C.") || !strings.Contains(string(events[2].Data), `"deleted":true`) {
				t.Fatalf("the object store wrote %s %v, %s, %s %s: not a meta, a chunk and a delete", events[0].Subject, events[0].Header,
					events[1].Subject, events[2].Subject, events[2].Data)
			}
			var subjects []string
			for i, m := range events {
				h := nats.Header{consumer.HeaderSubject: {m.Subject}, consumer.HeaderStream: {tc.stream}}
				for k, v := range m.Header {
					if !strings.HasPrefix(k, "Nats-") {
						h[k] = v
					}
				}
				putLetterData(t, ctx, js, "dlq.EV", i, m.Data, h)
				subjects = append(subjects, m.Subject)
			}
			putLetterData(t, ctx, js, "dlq.EV", 3, []byte(`{}`), nats.Header{consumer.HeaderSubject: {"ev.ok"}})
			want := map[string]*jetstream.ObjectInfo{}
			for _, name := range []string{"a", "b"} {
				want[name], err = obs.GetInfo(ctx, name)
				do(err)
			}
			before := last()
			for _, dry := range []bool{true, false} {
				rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", DryRun: dry})
				if err != nil || rep.Failed != 3 || rep.ObjectStore != 3 || !slices.Equal(rep.ObjectStoreLetters, []uint64{1, 2, 3}) ||
					rep.KeyValue != 0 || rep.Matched != 4 {
					t.Fatalf("dry run %v: report %+v, %v; want the 3 letters of the object store's events refused and named", dry, rep, err)
				}
				for _, subj := range subjects {
					if out := by[subj]; !errors.Is(out.Err, ErrObjectStore) || out.Replayed || out.Unsure {
						t.Errorf("dry run %v: letter to %s: %+v, want it refused (ErrObjectStore)", dry, subj, out)
					}
				}
				for i, says := range []string{"its event is an object's meta", "its event is a chunk of an object's data"} {
					if msg := fmt.Sprint(by[subjects[i]].Err); !strings.Contains(msg, says) || !strings.Contains(msg, "nats object put <bucket> <file>") ||
						!strings.Contains(msg, fmt.Sprintf("nats stream rmm EV_DLQ %d", i+1)) {
						t.Errorf("dry run %v: the letter's error does not say what it would do and what to do instead: %s", dry, msg)
					}
				}
				if out := by["ev.ok"]; out.Err != nil || out.Replayed == dry {
					t.Errorf("dry run %v: the ordinary letter: %+v", dry, out)
				}
			}
			if after := last(); after != before {
				t.Errorf("the object store's stream went from sequence %d to %d: the replay wrote into it", before, after)
			}
			for name, w := range want {
				info, err := obs.GetInfo(ctx, name)
				if err != nil || info.NUID != w.NUID || info.Digest != w.Digest || info.Deleted {
					t.Errorf("object %s: %+v, %v; want %+v, as before the replay", name, info, err, w)
					continue
				}
				if _, err := obs.GetBytes(ctx, name); err != nil {
					t.Errorf("object %s: %v", name, err)
				}
			}
			if ev, dl := testenv.StreamMsgs(t, ctx, js, "EV"), testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); ev != 1 || dl != 3 {
				t.Fatalf("%d events, %d dead letters; want 1 (ev.ok) and the 3 refused", ev, dl)
			}
		})
	}
}

// putObject puts data as object name of obs (stream bucket) in 4-byte
// chunks, writing what nats.go's ObjectStore.Put writes: the chunks to
// $O.<bucket>.C.<a new nuid>, then the meta (the ObjectInfo as JSON) to
// $O.<bucket>.M.<name, base64url> with Nats-Rollup: sub, then a purge of
// the previous version's chunks. Not Put itself: in nats.go v1.55.0 it
// leaves a goroutine behind now and then (its publisher's
// resetPendingAcksOnReconnect may read the status channel only after
// cleanupReplySub has set it to nil, and waits on nil for ever), which
// the package's leak check reports. The test reads the objects back
// through obs.
func putObject(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket jetstream.Stream, name, data string) error {
	prev, err := obs.GetInfo(ctx, name, jetstream.GetObjectInfoShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return err
	}
	info := jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: 4}},
		Bucket: "FILES", NUID: strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix), Size: uint64(len(data))}
	h := sha256.New()
	for chunk := range slices.Chunk([]byte(data), 4) {
		if _, err := js.Publish(ctx, "$O.FILES.C."+info.NUID, chunk); err != nil {
			return err
		}
		h.Write(chunk)
		info.Chunks++
	}
	info.Digest = jetstream.GetObjectDigestValue(h)
	meta, err := json.Marshal(info)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: "$O.FILES.M." + base64.URLEncoding.EncodeToString([]byte(name)), Data: meta,
		Header: nats.Header{jetstream.MsgRollup: {jetstream.MsgRollupSubject}}}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		return err
	}
	if prev != nil && !prev.Deleted {
		return bucket.Purge(ctx, jetstream.WithPurgeSubject("$O.FILES.C."+prev.NUID))
	}
	return nil
}

// A subject delete marker, which the server stores in a dead-letter stream
// with subject_delete_marker_ttl where a subject's last letter aged out
// (max_age, or its TTL as here), is passed over and counted as a marker,
// not skipped as a message that is no dead letter, which the summary
// names for someone to look at.
func TestReplayPassesOverDeleteMarkers(t *testing.T) {
	js, ctx := setup(t, 0)
	if err := js.DeleteStream(ctx, "EV_DLQ"); err != nil {
		t.Fatal(err)
	}
	// max_msgs_per_subject 1: otherwise the server raises a message's TTL
	// to subject_delete_marker_ttl, and the marker's is an hour.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV_DLQ", Subjects: []string{"dlq.>"}, MaxMsgsPerSubject: 1,
		AllowMsgTTL: true, SubjectDeleteMarkerTTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "dlq.gone", Header: nats.Header{jetstream.MsgTTLHeader: {"1s"}}, Data: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "EV_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.GetLastMsgForSubject(ctx, "dlq.gone")
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(jetstream.MarkerReasonHeader) != "" {
			if len(m.Data) != 0 {
				t.Fatalf("the server's marker has a body: %q", m.Data)
			}
			break
		}
		if !sleep(ctx, 50*time.Millisecond) {
			t.Fatalf("no subject delete marker on dlq.gone: %v", ctx.Err())
		}
	}
	putLetter(t, ctx, js, "dlq.EV", 0)
	foreign, err := js.Publish(ctx, "dlq.other", []byte("not a dead letter"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ"}, nil)
	if err != nil || rep.Scanned != 3 || rep.Markers != 1 || rep.Skipped != 1 || !slices.Equal(rep.NotLetters, []uint64{foreign.Sequence}) ||
		rep.Matched != 1 || rep.Replayed != 1 {
		t.Fatalf("report %+v, %v; want the marker counted as one, the foreign message skipped, the letter replayed", rep, err)
	}
}

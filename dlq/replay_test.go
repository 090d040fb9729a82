package dlq

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/embedded"
	"github.com/jetsink/jetsink/tests/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setup starts an embedded server with an event stream EV (ev.>) and a
// dead-letter stream EV_DLQ (dlq.EV) holding n dead letters: letter i has
// subject ev.<i%3>, code "c<i%2>", stage decode for even i and sink for odd.
func setup(t *testing.T, n int) (jetstream.JetStream, context.Context) {
	t.Helper()
	_, js, ctx := setupServer(t, n)
	return js, ctx
}

// setupServer is setup that also returns the server, for a test to stop.
func setupServer(t *testing.T, n int) (*embedded.NATSServer, jetstream.JetStream, context.Context) {
	t.Helper()
	srv, err := embedded.StartNATS("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Destroy)
	js := connectJS(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	createStreams(t, ctx, js)
	for i := range n {
		putLetter(t, ctx, js, "dlq.EV", i)
	}
	return srv, js, ctx
}

// connectJS connects to url with opts, for the test.
func connectJS(t *testing.T, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// createStreams creates setup's streams: EV (ev.>) and EV_DLQ (dlq.EV).
func createStreams(t *testing.T, ctx context.Context, js jetstream.JetStream) {
	t.Helper()
	for _, sc := range []jetstream.StreamConfig{{Name: "EV", Subjects: []string{"ev.>"}}, {Name: "EV_DLQ", Subjects: []string{"dlq.EV"}}} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
}

// putLetter publishes dead letter i (see setup) to subject.
func putLetter(t *testing.T, ctx context.Context, js jetstream.JetStream, subject string, i int) {
	t.Helper()
	putLetterData(t, ctx, js, subject, i, []byte(fmt.Sprintf(`{"i":%d}`, i)), nil)
}

// letterID is dead letter i's own Nats-Msg-Id, as jetsink writes it.
func letterID(i int) string {
	return fmt.Sprintf("EV:%d:%d:jetsink", 100+i, 1_700_000_000_000_000_000+int64(i))
}

// putLetterData is putLetter with data for the body and extra headers (a
// nil value leaves the header out: {consumer.HeaderConsumer: nil} for a
// letter of an older jetsink, which names no consumer). Its letters are
// consumer jetsink's, as a jetsink of this version writes them. It
// returns the stream's PubAck.
func putLetterData(t *testing.T, ctx context.Context, js jetstream.JetStream, subject string, i int, data []byte, extra nats.Header) *jetstream.PubAck {
	t.Helper()
	stage := "decode"
	if i%2 == 1 {
		stage = "sink"
	}
	h := nats.Header{
		consumer.HeaderSubject:   {fmt.Sprintf("ev.%d", i%3)},
		consumer.HeaderStream:    {"EV"},
		consumer.HeaderStreamSeq: {strconv.Itoa(100 + i)},
		consumer.HeaderStage:     {stage},
		consumer.HeaderCode:      {fmt.Sprintf("c%d", i%2)},
		consumer.HeaderReason:    {"test"},
		consumer.HeaderOrigMsgID: {fmt.Sprintf("orig-%d", i)},
		consumer.HeaderConsumer:  {"jetsink"},
		jetstream.MsgIDHeader:    {letterID(i)},
		"Traceparent":            {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}
	for k, v := range extra {
		if v == nil {
			delete(h, k)
			continue
		}
		h[k] = v
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: data})
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

func TestReplayDryRunChangesNothing(t *testing.T) {
	js, ctx := setup(t, 10)
	var seen []uint64
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", DryRun: true, Filter: Filter{Codes: []string{"c1"}}},
		func(l *Letter, o Outcome) {
			if o != (Outcome{}) {
				t.Errorf("dry run outcome %+v", o)
			}
			seen = append(seen, l.Seq)
		})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Scanned != 10 || rep.Matched != 5 || rep.Replayed != 0 || len(seen) != 5 {
		t.Fatalf("report %+v, seen %v", rep, seen)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV"); n != 0 {
		t.Fatalf("dry run published %d events", n)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 10 {
		t.Fatalf("dry run left %d dead letters, want 10", n)
	}
	s, err := js.Stream(ctx, "EV_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Consumers; n != 0 {
		t.Fatalf("%d consumers left on the dead-letter stream", n)
	}
}

func TestReplayRepublishesAndDeletes(t *testing.T) {
	js, ctx := setup(t, 12)
	f := Filter{Stages: []string{"decode"}, Subject: "ev.*"} // even i: 6 letters
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", Filter: f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Matched != 6 || rep.Replayed != 6 || rep.Deleted != 6 || rep.Failed != 0 {
		t.Fatalf("report %+v", rep)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 6 {
		t.Fatalf("%d dead letters left, want 6", n)
	}
	// The replayed events: original subject, body and headers, no
	// Jetsink-* header, a fresh Nats-Msg-Id.
	oc, err := js.OrderedConsumer(ctx, "EV", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := oc.Fetch(6, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range batch.Messages() {
		got++
		var i int
		if _, err := fmt.Sscanf(string(m.Data()), `{"i":%d}`, &i); err != nil || i%2 != 0 {
			t.Errorf("replayed body %q", m.Data())
		}
		if m.Subject() != fmt.Sprintf("ev.%d", i%3) {
			t.Errorf("letter %d replayed to %s", i, m.Subject())
		}
		h := m.Headers()
		for k := range h {
			if len(k) > 8 && k[:8] == "Jetsink-" {
				t.Errorf("letter %d: header %s kept", i, k)
			}
		}
		if h.Get("Traceparent") == "" {
			t.Errorf("letter %d: original header lost", i)
		}
		if id := h.Get(jetstream.MsgIDHeader); id != fmt.Sprintf("orig-%d:replay:%s", i, letterID(i)) { // the dead letter's own id
			t.Errorf("letter %d: Nats-Msg-Id %q", i, id)
		}
	}
	if got != 6 {
		t.Fatalf("%d events in EV, want 6", got)
	}

	// Replaying again finds only the odd ones.
	rep, err = Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", Filter: f}, nil)
	if err != nil || rep.Matched != 0 || rep.Scanned != 6 {
		t.Fatalf("second replay: %+v, %v", rep, err)
	}
}

func TestReplayKeepAndDuplicateWindow(t *testing.T) {
	js, ctx := setup(t, 4)
	for range 2 {
		rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", Keep: true}, nil)
		if err != nil || rep.Replayed != 4 || rep.Deleted != 0 {
			t.Fatalf("replay --keep: %+v, %v", rep, err)
		}
	}
	// Same dead letters, same replay ids: the duplicate window stored them once.
	if n := testenv.StreamMsgs(t, ctx, js, "EV"); n != 4 {
		t.Fatalf("%d events after two replays of 4 letters, want 4", n)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 4 {
		t.Fatalf("--keep deleted dead letters: %d left", n)
	}
}

func TestReplaySeqRangeAndLimit(t *testing.T) {
	js, ctx := setup(t, 10)
	var seqs []uint64
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", DryRun: true, Filter: Filter{FirstSeq: 3, LastSeq: 8}, Limit: 4},
		func(l *Letter, _ Outcome) { seqs = append(seqs, l.Seq) })
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(seqs) != "[3 4 5 6]" || rep.Matched != 4 {
		t.Fatalf("seqs %v, report %+v", seqs, rep)
	}
}

// A letter whose event another stream stored stays, named unsure, and
// Replay goes on (the event is stored: running again would not settle it).
func TestReplayWrongStreamKeepsTheLetter(t *testing.T) {
	js, ctx := setup(t, 2)
	// The event stream no longer captures ev.0; another stream does, and
	// the event stream takes its events from it.
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ELSEWHERE", Subjects: []string{"ev.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"other.>"},
		Sources: []*jetstream.StreamSource{{Name: "ELSEWHERE"}}}); err != nil {
		t.Fatal(err)
	}
	var out Outcome
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ"}, func(_ *Letter, o Outcome) { out = o })
	if err != nil {
		t.Fatalf("Replay = %v, want it to go on past the letters", err)
	}
	if !errors.Is(out.Err, ErrWrongStream) || rep.Failed != 2 || rep.Deleted != 0 || !out.Unsure || !slices.Equal(rep.Unsure, []uint64{1, 2}) || rep.Matched != 2 {
		t.Fatalf("outcome %+v, report %+v", out, rep)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 2 {
		t.Fatalf("%d dead letters left after a replay to the wrong stream, want 2", n)
	}
}

// A message without Jetsink-Subject or Jetsink-Stream is skipped, and the
// report names the sequences of the first NotLettersNamed.
func TestReplaySkipsForeignMessages(t *testing.T) {
	js, ctx := setup(t, 2)
	var want []uint64
	for i := range NotLettersNamed + 2 {
		ack, err := js.Publish(ctx, "dlq.EV", []byte("not a dead letter"))
		if err != nil {
			t.Fatal(err)
		}
		if i < NotLettersNamed {
			want = append(want, ack.Sequence)
		}
	}
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", DryRun: true}, nil)
	if err != nil || rep.Scanned != NotLettersNamed+4 || rep.Skipped != NotLettersNamed+2 || rep.Matched != 2 || !slices.Equal(rep.NotLetters, want) {
		t.Fatalf("report %+v, %v; want sequences %v named", rep, err, want)
	}
}

func TestReplayInvalidOptions(t *testing.T) {
	js, ctx := setup(t, 0)
	for _, o := range []Options{
		{},
		{Stream: "EV_DLQ", Filter: Filter{FirstSeq: 5, LastSeq: 2}},
		{Stream: "EV_DLQ", Filter: Filter{Subject: "ev.>.x"}},
		{Stream: "EV_DLQ", Filter: Filter{Subject: "ev.a*"}},
		{Stream: "EV_DLQ", Filter: Filter{Stages: []string{"sink", "decoder"}}},
		{Stream: "EV_DLQ", Limit: -1},
	} {
		if _, err := Replay(ctx, ctx, js, o, nil); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%+v: %v, want ErrInvalidOptions", o, err)
		}
	}
	if _, err := Replay(ctx, ctx, js, Options{Stream: "NOPE"}, nil); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("missing stream: %v", err)
	}
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ"}, nil)
	if err != nil || !reflect.DeepEqual(rep, Report{}) {
		t.Errorf("empty stream: %+v, %v", rep, err)
	}
}

// A replayed letter keeps the event's own headers, not the Jetsink-*
// ones, nor any Nats-* header: jetsink writes none into a letter, so one
// there came from the server (a sourced stream's Nats-Stream-Source) or
// another tool, and would instruct the event stream.
func TestLetterMsgHeaders(t *testing.T) {
	l := &Letter{Seq: 7, Subject: "ev.1", Stream: "EV", StreamSeq: 3, MsgID: "orig", Data: []byte("{}"), Header: nats.Header{
		"Traceparent":          {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		"X-Tenant":             {"a", "b"},
		consumer.HeaderStage:   {"sink"},
		jetstream.MsgIDHeader:  {"EV:3:1:jetsink"},
		"Nats-Stream-Source":   {"SRC 12 ev.> ev.>"},
		"Nats-TTL":             {"1s"},
		"Nats-Expected-Stream": {"OTHER"},
	}}
	m := l.Msg()
	want := nats.Header{
		"Traceparent":         {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		"X-Tenant":            {"a", "b"},
		jetstream.MsgIDHeader: {"orig:replay:EV:3:1:jetsink"},
	}
	if m.Subject != "ev.1" || string(m.Data) != "{}" || !reflect.DeepEqual(m.Header, want) {
		t.Fatalf("replayed %s %q with headers %v, want ev.1 {} with %v", m.Subject, m.Data, m.Header, want)
	}
}

// A letter whose subject no stream takes (no responders) fails, certainly
// not stored, after a few tries, however short LetterTimeout is, and the
// replay goes on: it is not named unsure. (The event stream sources
// another, so its own subjects do not settle where the letter may go: see
// TestReplayOnlyToASubjectTheStreamCaptures.)
func TestReplayNoStreamIsNotUnsure(t *testing.T) {
	js, ctx := setup(t, 0)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORIGIN", Subjects: []string{"origin.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"},
		Sources: []*jetstream.StreamSource{{Name: "ORIGIN"}}}); err != nil {
		t.Fatal(err)
	}
	putLetterData(t, ctx, js, "dlq.EV", 0, []byte("{}"), nats.Header{consumer.HeaderSubject: {"nowhere.x"}})
	putLetter(t, ctx, js, "dlq.EV", 1)
	h := &hookJS{JetStream: js}
	var outs []Outcome
	rep, err := Replay(ctx, ctx, h, Options{Stream: "EV_DLQ", LetterTimeout: 1200 * time.Millisecond}, func(_ *Letter, o Outcome) { outs = append(outs, o) })
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 2 || outs[0].Unsure || !errors.Is(outs[0].Err, ErrPublish) || !errors.Is(outs[0].Err, jetstream.ErrNoStreamResponse) ||
		!outs[1].Replayed || rep.Failed != 1 || rep.Replayed != 1 || len(rep.Unsure) != 0 {
		t.Fatalf("outcomes %+v, report %+v; want the first failed, not unsure, the second replayed", outs, rep)
	}
	if len(h.published) != 1+noStreamRetries+1 {
		t.Fatalf("%d publishes, want %d for the letter with no stream and 1", len(h.published), 1+noStreamRetries+1)
	}
}

func TestFilterMatch(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	l := &Letter{Seq: 7, Time: at, Subject: "events.dev-1.x", Code: "constraint", Stage: "sink"}
	for _, tc := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Codes: []string{"invalid_json", "constraint"}}, true},
		{Filter{Codes: []string{"invalid_json"}}, false},
		{Filter{Stages: []string{"decode"}}, false},
		{Filter{Subject: "events.>"}, true},
		{Filter{Subject: "events.*.x"}, true},
		{Filter{Subject: "events.*"}, false},
		{Filter{Subject: "events.dev-1.x.y"}, false},
		{Filter{Since: at}, true},
		{Filter{Since: at.Add(time.Second)}, false},
		{Filter{Until: at}, false},
		{Filter{FirstSeq: 7, LastSeq: 7}, true},
		{Filter{FirstSeq: 8}, false},
	} {
		if got := tc.f.Match(l); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.f, got, tc.want)
		}
	}
}

func TestFilterUnknownCodes(t *testing.T) {
	f := Filter{Codes: []string{"constraint", "constrant", "invalid_json", "max_deliver", "nosuch"}}
	if got, want := f.UnknownCodes(), []string{"constrant", "nosuch"}; !reflect.DeepEqual(got, want) {
		t.Errorf("UnknownCodes() = %q, want %q", got, want)
	}
	if got := (Filter{}).UnknownCodes(); got != nil {
		t.Errorf("no codes: %q", got)
	}
}

// Refusals names each store's refused letters in that store's words, the
// ones its letters' errors use: a key-value bucket's first, then an object
// store's, and only those with letters refused.
func TestRefusalsNameEachStore(t *testing.T) {
	if got := (&Report{}).Refusals(); len(got) != 0 {
		t.Errorf("none refused: %+v", got)
	}
	rep := Report{ObjectStore: 2, ObjectStoreLetters: []uint64{5, 6}}
	if got := rep.Refusals(); len(got) != 1 || got[0].Store.Err != ErrObjectStore || got[0].N != 2 || !slices.Equal(got[0].Letters, []uint64{5, 6}) {
		t.Errorf("an object store's 2 refused: %+v", got)
	}
	rep = Report{KeyValue: 12, KeyValueLetters: []uint64{1, 2}, ObjectStore: 1, ObjectStoreLetters: []uint64{20}}
	got := rep.Refusals()
	if len(got) != 2 || got[0].Store.Err != ErrKeyValue || got[0].N != 12 || !slices.Equal(got[0].Letters, []uint64{1, 2}) ||
		got[1].Store.Err != ErrObjectStore || got[1].N != 1 || !slices.Equal(got[1].Letters, []uint64{20}) {
		t.Fatalf("both refused: %+v", got)
	}
	for i, subject := range []string{"$KV.CFG.k", "$O.FILES.C.wtysQV6Ewj3tM33So4Snvr"} {
		want := got[i].Store
		s, err := storeEvent(&Letter{Seq: 3, Subject: subject}, "EV_DLQ")
		if s.Err != want.Err || !errors.Is(err, want.Err) {
			t.Errorf("%s: store %q, error %v, want %q's", subject, s.Name, err, want.Name)
			continue
		}
		for _, words := range []string{want.Name, "into the " + want.Noun + " again", want.Restore} {
			if !strings.Contains(err.Error(), words) {
				t.Errorf("%s: no %q in %q", subject, words, err)
			}
		}
		// The Store counts its letters where Refusals reads them.
		var r Report
		n, letters := s.counts(&r)
		*n, *letters = 1, []uint64{3}
		if rs := r.Refusals(); len(rs) != 1 || rs[0].Store.Err != want.Err {
			t.Errorf("%s: a letter counted by its store is refused as %+v", subject, rs)
		}
	}
}

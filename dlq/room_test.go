package dlq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/tests/testenv"
)

// fullStream replaces setup's EV with one of cfg's limits (discard old),
// with the durable consumer jetsink on it, and publishes events to ev.9:
// read of them are fetched and acked by jetsink, in order, the rest not.
func fullStream(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, read, events int) jetstream.Stream {
	t.Helper()
	if err := js.DeleteStream(ctx, "EV"); err != nil {
		t.Fatal(err)
	}
	cfg.Name, cfg.Subjects, cfg.Discard = "EV", []string{"ev.>"}, jetstream.DiscardOld
	s, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: "jetsink", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	publishEvents(t, ctx, js, read)
	for n := 0; n < read; { // a fetch may bring fewer than asked for
		batch, err := c.Fetch(read-n, jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
	}
	publishEvents(t, ctx, js, events-read)
	return s
}

// publishEvents publishes n events to ev.9, as a publisher of the stream.
func publishEvents(t *testing.T, ctx context.Context, js jetstream.JetStream, n int) {
	t.Helper()
	for i := range n {
		if _, err := js.Publish(ctx, "ev.9", []byte(fmt.Sprintf(`{"event":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
}

// streamState is EV's first and last sequence and its message count.
func streamState(t *testing.T, ctx context.Context, s jetstream.Stream) jetstream.StreamState {
	t.Helper()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State
}

// An event stream with max_msgs and discard old, full of events jetsink
// has not read, is not replayed into: the replayed event would push out the
// oldest of them, which jetsink would never read, while its letter is
// deleted. The letter stays, naming the limit, the stream and the reader's
// ack floor, and the dry run says so too. Once jetsink has read enough
// (its ack floor moved) the letter is replayed, pushing out only an event
// read; AllowDiscardOld replays it all the same. Without a reader known
// (no Options.Consumer, a letter that names none) no message may be pushed
// out: a stream with room for the letter beside all it holds is replayed
// into, a full one is not, read or not.
func TestReplayRefusesToPushOutUnreadEvents(t *testing.T) {
	for _, tc := range []struct {
		name         string
		consumer     string // Options.Consumer
		writtenBy    string // the letter's Jetsink-Consumer, "" for none
		read, events int    // events jetsink acked, of those published
		max          int64  // max_msgs
		allow        bool
		replayed     bool
		says         string // the refusal's
		first        uint64 // the event stream's first sequence after it
	}{
		// The review's reproduction: the bad event 1, read (dead-lettered),
		// then 5 unread: the stream holds 2-6.
		{"full of unread events", "jetsink", "jetsink", 1, 6, 5, false, false,
			"stream EV, the letter's Jetsink-Stream, drops its oldest messages to store new ones (max_msgs 5, discard old), " +
				"and has no room: it held 5 messages, 5 of them after consumer jetsink's ack floor (stream sequence 1), not read yet", 2},
		{"room where jetsink read", "jetsink", "jetsink", 3, 6, 5, false, true, "", 3},
		{"allowed", "jetsink", "jetsink", 1, 6, 5, true, true, "", 3},
		// The reader the letter names, when Options.Consumer does not.
		{"the letter's consumer, full", "", "jetsink", 1, 6, 5, false, false,
			"it held 5 messages, 5 of them after consumer jetsink's ack floor (stream sequence 1)", 2},
		{"the letter's consumer, room", "", "jetsink", 3, 6, 5, false, true, "", 3},
		{"no reader known, full", "", "", 5, 5, 5, false, false, "it held 5 messages; its reader is not known " +
			"(dead letter 1 names no consumer, no Jetsink-Consumer header: an older jetsink wrote it), so no message may be pushed out", 1},
		{"the letter's consumer not on the stream", "", "other", 5, 5, 5, false, false, "it held 5 messages; its reader is not known " +
			"(consumer other, which dead letter 1 names in Jetsink-Consumer, is not on stream EV), so no message may be pushed out", 1},
		{"no reader known, room", "", "", 0, 4, 5, false, true, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, ctx := setup(t, 0)
			s := fullStream(t, ctx, js, jetstream.StreamConfig{MaxMsgs: tc.max}, tc.read, tc.events)
			before := streamState(t, ctx, s)
			h := nats.Header{consumer.HeaderConsumer: nil} // none: a letter of an older version
			if tc.writtenBy != "" {
				h = nats.Header{consumer.HeaderConsumer: {tc.writtenBy}}
			}
			putLetterData(t, ctx, js, "dlq.EV", 0, []byte("{}"), h)
			for _, dry := range []bool{true, false} {
				var errs []error
				rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", Consumer: tc.consumer, DryRun: dry, AllowDiscardOld: tc.allow},
					func(l *Letter, out Outcome) {
						if out.Err != nil {
							errs = append(errs, out.Err)
						}
					})
				wantReplayed := 0
				if tc.replayed && !dry {
					wantReplayed = 1
				}
				wantFailed := 1
				if tc.replayed {
					wantFailed = 0
				}
				if err != nil || rep.Matched != 1 || rep.Replayed != wantReplayed || rep.Failed != wantFailed {
					t.Fatalf("dry run %v: report %+v, %v; want %d replayed, %d failed", dry, rep, err, wantReplayed, wantFailed)
				}
				for _, err := range errs {
					if !errors.Is(err, ErrNoReader) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "--allow-discard-old") {
						t.Errorf("dry run %v: %v; want ErrNoReader with %q", dry, err, tc.says)
					}
				}
				if dry {
					if after := streamState(t, ctx, s); after.FirstSeq != before.FirstSeq || after.LastSeq != before.LastSeq {
						t.Fatalf("dry run: the stream went from %+v to %+v", before, after)
					}
				}
			}
			after := streamState(t, ctx, s)
			letters := testenv.StreamMsgs(t, ctx, js, "EV_DLQ")
			if tc.replayed && (after.LastSeq != before.LastSeq+1 || letters != 0) || !tc.replayed && (after.LastSeq != before.LastSeq || letters != 1) {
				t.Fatalf("event stream %+v (before %+v), %d letters left", after, before, letters)
			}
			if after.FirstSeq != tc.first {
				t.Fatalf("event stream's first sequence %d, want %d", after.FirstSeq, tc.first)
			}
		})
	}
}

// emptyLetterSize is what the event of a letter putLetterData writes
// without a body takes in EV in a file store (room.need): all letters 0-9
// carry headers of the same length.
func emptyLetterSize(t *testing.T, ctx context.Context, js jetstream.JetStream) int64 {
	t.Helper()
	return (&room{}).need(emptyLetter(t, ctx, js))
}

// emptyLetter is a letter putLetterData writes without a body, as Replay
// reads it; it leaves the dead-letter stream as it was.
func emptyLetter(t *testing.T, ctx context.Context, js jetstream.JetStream) *Letter {
	t.Helper()
	dlq, err := js.Stream(ctx, "EV_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	ack := putLetterData(t, ctx, js, "dlq.EV", 0, nil, nil)
	raw, err := dlq.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	l, err := letter(&jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: raw.Sequence}, Timestamp: raw.Time}, raw.Header, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := dlq.DeleteMsg(ctx, raw.Sequence); err != nil {
		t.Fatal(err)
	}
	return l
}

// storedBytes is what m takes in a stream of storage, as the server counts
// it: its bytes in a stream made for it (and deleted), under a subject of
// the same length (sz. for ev.).
func storedBytes(t *testing.T, ctx context.Context, js jetstream.JetStream, storage jetstream.StorageType, m *nats.Msg) int64 {
	t.Helper()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SIZE", Subjects: []string{"sz.>"}, Storage: storage})
	if err != nil {
		t.Fatal(err)
	}
	subject, ok := strings.CutPrefix(m.Subject, "ev.")
	if !ok {
		t.Fatalf("subject %s: want one under ev.", m.Subject)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "sz." + subject, Header: m.Header, Data: m.Data}); err != nil {
		t.Fatal(err)
	}
	n := int64(streamState(t, ctx, s).Bytes)
	if err := js.DeleteStream(ctx, "SIZE"); err != nil {
		t.Fatal(err)
	}
	return n
}

// max_bytes counts what the stream stores of a message: its subject,
// headers and body and the store's own bytes, which room.need counts
// exactly, in a file store and in a memory store (16 bytes a message, not
// the file store's 34: counted as 34, a letter that fits was refused). A
// letter whose event would push out bytes of events jetsink has not read,
// by one byte, stays; the next, one byte smaller, is replayed, and fills
// the stream to max_bytes exactly, pushing out nothing.
func TestReplayRefusesToPushOutUnreadBytes(t *testing.T) {
	for _, storage := range []jetstream.StorageType{jetstream.FileStorage, jetstream.MemoryStorage} {
		t.Run(storage.String(), func(t *testing.T) { refusesToPushOutUnreadBytes(t, storage) })
	}
}

func refusesToPushOutUnreadBytes(t *testing.T, storage jetstream.StorageType) {
	js, ctx := setup(t, 0)
	s := fullStream(t, ctx, js, jetstream.StreamConfig{MaxBytes: 1500, Storage: storage}, 0, 4) // none read
	before := streamState(t, ctx, s)
	empty := storedBytes(t, ctx, js, storage, emptyLetter(t, ctx, js).Msg())
	room := 1500 - int64(before.Bytes) - empty // the body that fits
	if room < 10 {
		t.Fatalf("4 events take %d bytes: too many for the test", before.Bytes)
	}
	putLetterData(t, ctx, js, "dlq.EV", 1, []byte(strings.Repeat("x", int(room+1))), nil)
	putLetterData(t, ctx, js, "dlq.EV", 2, []byte(strings.Repeat("y", int(room))), nil)
	by := map[string]Outcome{}
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink"}, func(l *Letter, out Outcome) { by[l.Subject] = out })
	if err != nil || rep.Replayed != 1 || rep.Failed != 1 || !by["ev.2"].Deleted {
		t.Fatalf("report %+v, %v, outcomes %+v; want ev.1's letter refused, ev.2's replayed", rep, err, by)
	}
	if err := by["ev.1"].Err; !errors.Is(err, ErrNoReader) || !strings.Contains(err.Error(), "(max_bytes 1500, discard old)") ||
		!strings.Contains(err.Error(), fmt.Sprintf("it held %d bytes, and the event takes about %d: to store it the stream would drop 1 bytes of its oldest messages, "+
			"and the oldest is after consumer jetsink's ack floor (stream sequence 0), not read yet", before.Bytes, empty+room+1)) {
		t.Fatalf("ev.1: %v", err)
	}
	after := streamState(t, ctx, s)
	if after.Bytes != 1500 || after.FirstSeq != before.FirstSeq || after.Msgs != before.Msgs+1 {
		t.Fatalf("event stream %+v (before %+v): want max_bytes reached exactly, nothing pushed out", after, before)
	}
}

// A publisher that fills the stream while the replay runs is seen: near
// its limit, the stream's state and jetsink's ack floor are read again
// before each letter. jetsink has read all 5 events, so the stream
// (max_msgs 10) has room for 10; after the first letter's event, 9 unread
// events come: the other two letters stay, and the stream keeps every
// event not read.
func TestReplayReadsTheRoomAgainNearTheLimit(t *testing.T) {
	base, ctx := setup(t, 0)
	s := fullStream(t, ctx, base, jetstream.StreamConfig{MaxMsgs: 10}, 5, 5)
	for i := range 3 {
		putLetterData(t, ctx, base, "dlq.EV", i, nil, nil)
	}
	js := &hookJS{JetStream: base}
	js.afterPublish = func() {
		if len(js.answers) == 1 {
			publishEvents(t, ctx, base, 9)
		}
	}
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink"})
	if err != nil || rep.Replayed != 1 || rep.Failed != 2 || !by["ev.0"].Deleted {
		t.Fatalf("report %+v, %v, outcomes %+v; want the first replayed, the other two refused", rep, err, by)
	}
	for _, subj := range []string{"ev.1", "ev.2"} {
		if err := by[subj].Err; !errors.Is(err, ErrNoReader) || !strings.Contains(err.Error(), "it held 10 messages, 10 of them after consumer jetsink's ack floor (stream sequence 5)") {
			t.Errorf("%s: %v", subj, err)
		}
	}
	// 15 events: the 5 read pushed out, the replayed one and the 9 new
	// ones kept.
	if st := streamState(t, ctx, s); st.FirstSeq != 6 || st.LastSeq != 15 || testenv.StreamMsgs(t, ctx, base, "EV_DLQ") != 2 {
		t.Fatalf("event stream %+v, %d letters left; want 6-15 and 2", st, testenv.StreamMsgs(t, ctx, base, "EV_DLQ"))
	}
}

// A dry run counts the letters it would replay against the room: with
// room for one event, of two letters it says one would be replayed and
// the other not, as the replay then does.
func TestReplayDryRunCountsTheRoom(t *testing.T) {
	js, ctx := setup(t, 0)
	s := fullStream(t, ctx, js, jetstream.StreamConfig{MaxMsgs: 5}, 0, 4)
	for i := range 2 {
		putLetter(t, ctx, js, "dlq.EV", i)
	}
	for _, dry := range []bool{true, false} {
		rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink", DryRun: dry})
		if err != nil || rep.Matched != 2 || rep.Failed != 1 || by["ev.0"].Err != nil || !errors.Is(by["ev.1"].Err, ErrNoReader) {
			t.Fatalf("dry run %v: report %+v, %v, outcomes %+v; want ev.0's letter replayed, ev.1's refused", dry, rep, err, by)
		}
	}
	if st := streamState(t, ctx, s); st.FirstSeq != 1 || st.Msgs != 5 {
		t.Fatalf("event stream %+v: want 1-5, nothing pushed out", st)
	}
}

// Under max_bytes the stream drops its oldest messages until it is under
// the limit again: whether those are all read is told by their own sizes,
// not the stream's average. The review's reproduction: 50 small events
// read, then one unread of 12,000 bytes; a letter whose event would push
// out one byte more than the 50 hold (the average put the unread bytes at
// about 281, and it was replayed, pushing out event 51) stays; the next,
// one byte smaller, pushes out exactly the 50 and is replayed, the stream
// at max_bytes exactly. A dry run says the same.
func TestReplayCountsTheBytesOfTheOldestEvents(t *testing.T) {
	js, ctx := setup(t, 0)
	s := fullStream(t, ctx, js, jetstream.StreamConfig{MaxBytes: 20000}, 50, 50)
	read := int64(streamState(t, ctx, s).Bytes)
	if _, err := js.Publish(ctx, "ev.9", []byte(strings.Repeat("u", 12000))); err != nil {
		t.Fatal(err)
	}
	before := streamState(t, ctx, s)
	body := 20000 - int64(before.Bytes) - emptyLetterSize(t, ctx, js) + read + 1 // pushes out read+1 bytes
	putLetterData(t, ctx, js, "dlq.EV", 1, []byte(strings.Repeat("x", int(body))), nil)
	putLetterData(t, ctx, js, "dlq.EV", 2, []byte(strings.Repeat("y", int(body-1))), nil)
	for _, dry := range []bool{true, false} {
		rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink", DryRun: dry})
		if err != nil || rep.Failed != 1 || by["ev.2"].Err != nil {
			t.Fatalf("dry run %v: report %+v, %v, outcomes %+v; want ev.1's letter refused, ev.2's replayed", dry, rep, err, by)
		}
		if err := by["ev.1"].Err; !errors.Is(err, ErrNoReader) || !strings.Contains(err.Error(), fmt.Sprintf(
			"to store it the stream would drop %d bytes of its oldest messages, and those up to consumer jetsink's ack floor (stream sequence 50), "+
				"read, hold %d of them; the rest would be messages after the floor, not read yet", read+1, read)) {
			t.Fatalf("dry run %v: ev.1: %v", dry, err)
		}
	}
	if after := streamState(t, ctx, s); after.FirstSeq != 51 || after.LastSeq != 52 || after.Bytes != 20000 || testenv.StreamMsgs(t, ctx, js, "EV_DLQ") != 1 {
		t.Fatalf("event stream %+v (before %+v): want 51 kept, the 50 read pushed out, max_bytes reached exactly, one letter left", after, before)
	}
}

// The walk counts each message as the store does: the stream's bytes are
// the sum of its messages', in a file store and a memory store, with
// headers and without, an empty body, a message deleted among them.
func TestWalkCountsWhatTheStoreHolds(t *testing.T) {
	for _, storage := range []jetstream.StorageType{jetstream.FileStorage, jetstream.MemoryStorage} {
		t.Run(storage.String(), func(t *testing.T) {
			js, ctx := setup(t, 0)
			s := fullStream(t, ctx, js, jetstream.StreamConfig{MaxBytes: 1 << 20, Storage: storage}, 0, 3)
			for _, m := range []*nats.Msg{
				{Subject: "ev.1", Header: nats.Header{"Nats-Msg-Id": {"a"}, "X-Some": {"b", "c"}}, Data: []byte("with headers")},
				{Subject: "ev.long.subject", Data: nil},
				{Subject: "ev.2", Header: nats.Header{"K": {""}}, Data: []byte("x")},
			} {
				if _, err := js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.DeleteMsg(ctx, 2); err != nil {
				t.Fatal(err)
			}
			st := streamState(t, ctx, s)
			rm := &room{stream: s, js: js, name: "EV", memory: storage == jetstream.MemoryStorage, floor: st.LastSeq, next: st.FirstSeq}
			for !rm.past {
				if err := rm.walk(ctx, 5*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			if rm.walked != int64(st.Bytes) || rm.reads != 5 {
				t.Fatalf("walked %d bytes in %d reads; the stream holds %d in 5 messages", rm.walked, rm.reads, st.Bytes)
			}
		})
	}
}

// The walk reads at most walkCap messages a reading: a letter whose event
// would push out more (a letter far bigger than the stream's events) is
// refused, saying so, and replayed once every event is read (no walk).
func TestReplayWalkIsBounded(t *testing.T) {
	js, ctx := setup(t, 0)
	s := fullStream(t, ctx, js, jetstream.StreamConfig{MaxBytes: 20000}, walkCap+50, walkCap+51) // the last one not read
	before := streamState(t, ctx, s)
	putLetterData(t, ctx, js, "dlq.EV", 1, []byte(strings.Repeat("x", int(19000-emptyLetterSize(t, ctx, js)))), nil)
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink"})
	if err != nil || rep.Failed != 1 || !errors.Is(by["ev.1"].Err, ErrNoReader) ||
		!strings.Contains(by["ev.1"].Err.Error(), fmt.Sprintf("and its %d oldest, which consumer jetsink has read, hold ", walkCap)) ||
		!strings.Contains(by["ev.1"].Err.Error(), "the replay reads no more to tell whether the rest were read") {
		t.Fatalf("report %+v, %v, outcomes %+v; want ev.1's letter refused at the walk's bound", rep, err, by)
	}
	if after := streamState(t, ctx, s); after.FirstSeq != before.FirstSeq || after.LastSeq != before.LastSeq {
		t.Fatalf("event stream %+v, before %+v", after, before)
	}
}

// Once the stream is full of events not read, the letters after the first
// are refused on the last reading, until roomAge has passed: not two
// requests each (STREAM.INFO, CONSUMER.INFO). The readings are counted on
// the server: at most one a roomAge, and the first.
func TestReplayRefusesOnTheLastReading(t *testing.T) {
	js, ctx := setup(t, 0)
	fullStream(t, ctx, js, jetstream.StreamConfig{MaxMsgs: 5}, 0, 5)
	const letters = 20
	for i := range letters {
		putLetter(t, ctx, js, "dlq.EV", i)
	}
	infos, err := js.Conn().SubscribeSync("$JS.API.STREAM.INFO.EV")
	if err != nil {
		t.Fatal(err)
	}
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink"}, nil)
	elapsed := time.Since(start)
	if err != nil || rep.Failed != letters || rep.Replayed != 0 {
		t.Fatalf("report %+v, %v; want all %d refused", rep, err, letters)
	}
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	n, _, err := infos.Pending()
	if err != nil {
		t.Fatal(err)
	}
	// One STREAM.INFO is window's, for the stream's config.
	if readings := n - 1; readings < 1 || readings > 1+int(elapsed/roomAge) {
		t.Fatalf("%d readings of the stream's state for %d letters refused in %v", readings, letters, elapsed)
	}
}

// nats.consumer deleted while the replay runs leaves no reader known: the
// stream, full, takes no letter more, and the refusal says why in the
// CLI's words.
func TestReplayReaderDeletedMeanwhile(t *testing.T) {
	base, ctx := setup(t, 0)
	s := fullStream(t, ctx, base, jetstream.StreamConfig{MaxMsgs: 6}, 5, 5)
	for i := range 2 {
		putLetter(t, ctx, base, "dlq.EV", i)
	}
	js := &hookJS{JetStream: base}
	js.afterPublish = func() {
		if err := base.DeleteConsumer(ctx, "EV", "jetsink"); err != nil {
			t.Error(err)
		}
	}
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink"})
	if err != nil || rep.Replayed != 1 || rep.Failed != 1 || !by["ev.0"].Deleted {
		t.Fatalf("report %+v, %v, outcomes %+v; want the first replayed, the second refused", rep, err, by)
	}
	if err := by["ev.1"].Err; !errors.Is(err, ErrNoReader) || !strings.Contains(err.Error(),
		"it held 6 messages; its reader is not known (consumer jetsink (nats.consumer) is no longer on stream EV), so no message may be pushed out") {
		t.Fatalf("ev.1: %v", err)
	}
	if st := streamState(t, ctx, s); st.FirstSeq != 1 || st.LastSeq != 6 {
		t.Fatalf("event stream %+v: want 1-6", st)
	}
}

// A user the server refuses STREAM.MSG.GET on the event stream cannot tell
// what a letter's event would push out under max_bytes: the letter stays,
// ErrPublish naming the subject to allow, and nothing is pushed out.
func TestReplayRefusedWalk(t *testing.T) {
	admin, replay, ctx := deniedReplay(t, 0, "$JS.API.STREAM.MSG.GET.EV")
	s := fullStream(t, ctx, admin, jetstream.StreamConfig{MaxBytes: 2000}, 5, 6) // the last one not read
	before := streamState(t, ctx, s)
	for i := range 2 {
		putLetterData(t, ctx, admin, "dlq.EV", i, []byte(strings.Repeat("x", 1900)), nil)
	}
	rep, by, err := outcomes(t, ctx, replay, Options{Stream: "EV_DLQ", Consumer: "jetsink", LetterTimeout: 3 * time.Second})
	if err != nil || rep.Replayed != 0 || rep.Failed != 2 {
		t.Fatalf("report %+v, %v; want both letters refused", rep, err)
	}
	for subject, out := range by {
		if !errors.Is(out.Err, ErrPublish) || !errors.Is(out.Err, nats.ErrPermissionViolation) ||
			!strings.Contains(out.Err.Error(), "allow the user to publish to $JS.API.STREAM.MSG.GET.EV") {
			t.Errorf("%s: %v; want a refusal naming the permission", subject, out.Err)
		}
	}
	if after := streamState(t, ctx, s); after.FirstSeq != before.FirstSeq || after.LastSeq != before.LastSeq ||
		testenv.StreamMsgs(t, ctx, admin, "EV_DLQ") != 2 {
		t.Fatalf("event stream %+v, before %+v; want nothing replayed, both letters left", after, before)
	}
}

// A replayed event reaches a stream that sources others through the
// origin that captures its subject, and the stream's copy carries a
// Nats-Stream-Source header the server adds, tens of bytes the letter does
// not have: the room counts an upper bound of it. The review's
// reproduction: ORIG (ev.>), EV sourcing it (max_bytes 5000, discard
// old), 5 events none read; a letter that fits as if EV stored it as
// published (it was replayed, and EV's copy, 46 bytes more, pushed out
// the unread event 1) stays; one smaller by the bound is re-published
// (stored by ORIG: ErrWrongStream, it stays too), and EV keeps every
// event.
func TestReplayCountsTheSourceHeader(t *testing.T) {
	js, ctx := setup(t, 0)
	if err := js.DeleteStream(ctx, "EV"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORIG", Subjects: []string{"ev.>"}}); err != nil {
		t.Fatal(err)
	}
	sources := []*jetstream.StreamSource{{Name: "ORIG"}}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Sources: sources, MaxBytes: 5000, Discard: jetstream.DiscardOld})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: "jetsink", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	publishEvents(t, ctx, js, 5)
	before := sourced(t, ctx, s, 5)
	room := 5000 - int64(before.Bytes) - emptyLetterSize(t, ctx, js) // the body that fits, stored as published
	extra := int64(sourceHeader(sources) + len("ev.1"))
	if room-extra < 10 {
		t.Fatalf("5 events take %d bytes: too many for the test", before.Bytes)
	}
	putLetterData(t, ctx, js, "dlq.EV", 1, []byte(strings.Repeat("x", int(room))), nil)
	putLetterData(t, ctx, js, "dlq.EV", 2, []byte(strings.Repeat("y", int(room-extra))), nil)
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink"})
	if err != nil || rep.Failed != 2 || rep.Deleted != 0 {
		t.Fatalf("report %+v, %v, outcomes %+v; want both letters kept", rep, err, by)
	}
	if err := by["ev.1"].Err; !errors.Is(err, ErrNoReader) || !strings.Contains(err.Error(), fmt.Sprintf("it held %d bytes, and the event takes about %d: "+
		"to store it the stream would drop %d bytes of its oldest messages, and the oldest is after consumer jetsink's ack floor (stream sequence 0), not read yet",
		before.Bytes, 5000-int64(before.Bytes)+extra, extra)) {
		t.Fatalf("ev.1: %v; want it refused", err)
	}
	if err := by["ev.2"].Err; !errors.Is(err, ErrWrongStream) {
		t.Fatalf("ev.2: %v; want it re-published, stored by ORIG", err)
	}
	if after := sourced(t, ctx, s, 6); after.FirstSeq != 1 || after.Msgs != 6 || after.Bytes > 5000 {
		t.Fatalf("event stream %+v (before %+v): want the replayed event beside the 5, none pushed out", after, before)
	}
}

// A stream that sources or mirrors the origin storing a replayed event
// takes its copy some time after the PubAck (in a cluster, later still): a
// reading of its state before then does not show it. The review's
// reproduction: each reading near the limit forgot the letters replayed
// since the last, and a replay of 30 letters each about a tenth of EV's
// room now and then let 11 through, and EV (max_bytes 20000, discard old)
// dropped events jetsink had not read. Here the copies are held back
// until the replay ends (EV's source, or that of the stream EV mirrors, is
// removed after the first PubAck, and added again after the replay, from
// where it left off): at most 10 letters are re-published, and EV keeps
// every event. Without the count of the letters in transit, the 30 were.
func TestReplayCountsCopiesInTransit(t *testing.T) {
	t.Run("sources", func(t *testing.T) { countsCopiesInTransit(t, false) })
	t.Run("mirror", func(t *testing.T) { countsCopiesInTransit(t, true) })
}

func countsCopiesInTransit(t *testing.T, mirror bool) {
	base, ctx := setup(t, 0)
	if err := base.DeleteStream(ctx, "EV"); err != nil {
		t.Fatal(err)
	}
	orig, err := base.CreateStream(ctx, jetstream.StreamConfig{Name: "ORIG", Subjects: []string{"ev.>"}})
	if err != nil {
		t.Fatal(err)
	}
	// The stream whose source is held back: EV, or the one EV mirrors.
	held := jetstream.StreamConfig{Name: "EV", Sources: []*jetstream.StreamSource{{Name: "ORIG"}}, MaxBytes: 20000, Discard: jetstream.DiscardOld}
	ev := held
	if mirror {
		held = jetstream.StreamConfig{Name: "MID", Sources: []*jetstream.StreamSource{{Name: "ORIG"}}}
		ev = jetstream.StreamConfig{Name: "EV", Mirror: &jetstream.StreamSource{Name: "MID"}, MaxBytes: 20000, Discard: jetstream.DiscardOld}
		if _, err := base.CreateStream(ctx, held); err != nil {
			t.Fatal(err)
		}
	}
	s, err := base.CreateStream(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := base.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: "jetsink", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	publishEvents(t, ctx, base, 5)
	before := sourced(t, ctx, s, 5)
	// Each letter takes about a tenth and a half of the room, counted
	// with the source header EV's copy has (in the mirror, the header
	// MID writes, which the room does not count): 10 fit, not 11.
	room := 20000 - int64(before.Bytes)
	body := room*2/21 - emptyLetterSize(t, ctx, base) - int64(sourceHeader(held.Sources)+len("ev.1"))
	for i := range 30 { // from 1: emptyLetter's 0 is a duplicate
		putLetterData(t, ctx, base, "dlq.EV", i+1, []byte(strings.Repeat("x", int(body))), nil)
	}
	js := &hookJS{JetStream: base}
	stalled := held
	stalled.Sources = nil
	js.afterPublish = func() {
		if len(js.published) == 1 {
			if _, err := base.UpdateStream(ctx, stalled); err != nil {
				t.Error(err)
			}
		}
	}
	republished, refused := 0, 0
	rep, err := Replay(ctx, ctx, js, Options{Stream: "EV_DLQ", Consumer: "jetsink"}, func(l *Letter, out Outcome) {
		switch {
		case errors.Is(out.Err, ErrWrongStream):
			republished++
		case errors.Is(out.Err, ErrNoReader):
			refused++
		default:
			t.Errorf("dead letter %d: %+v; want it re-published (stored by ORIG) or refused", l.Seq, out)
		}
	})
	if err != nil || rep.Deleted != 0 {
		t.Fatalf("report %+v, %v; want every letter kept (re-published ones are stored by ORIG)", rep, err)
	}
	if republished < 1 || republished > 10 || republished+refused != 30 {
		t.Errorf("%d letters re-published, %d refused (report %+v); want at most the 10 EV has room for re-published, the rest refused", republished, refused, rep)
	}
	if _, err := base.UpdateStream(ctx, held); err != nil {
		t.Fatal(err)
	}
	last := streamState(t, ctx, orig).LastSeq
	if after := sourced(t, ctx, s, last); after.FirstSeq != 1 || after.Msgs != last || after.Bytes > 20000 {
		t.Fatalf("event stream %+v (before %+v, %d re-published): want every event kept, none pushed out", after, before, republished)
	}
}

// sourced waits for stream s to have taken its last sequence from its
// sources, and returns its state.
func sourced(t *testing.T, ctx context.Context, s jetstream.Stream, last uint64) jetstream.StreamState {
	t.Helper()
	for {
		if st := streamState(t, ctx, s); st.LastSeq >= last {
			return st
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stream took no message %d from its sources: %v", last, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A reader looked up again after a lookup that timed out is read with:
// the stream's state and the reader's ack floor are read again, not the
// reading taken without a reader (every message unread, floor 0) kept for
// roomAge. jetsink has read 3 of EV's 5 events (max_msgs 5): room for 3.
// The first letter's CONSUMER.INFO times out, and it stays (its reader not
// known, no message may be pushed out); the second's is answered, and it
// is replayed (it was refused, "5 of them after consumer jetsink's ack
// floor (stream sequence 0)").
func TestReplayReaderFoundAfterATimeout(t *testing.T) {
	base, ctx := setup(t, 0)
	s := fullStream(t, ctx, base, jetstream.StreamConfig{MaxMsgs: 5}, 3, 5)
	for i := range 2 {
		putLetterData(t, ctx, base, "dlq.EV", i, []byte("{}"), nats.Header{consumer.HeaderConsumer: {"jetsink"}})
	}
	lookups := 0
	js := &hookJS{JetStream: base, consumerLookup: func(stream, name string) error {
		if stream != "EV" {
			return nil
		}
		if lookups++; lookups == 1 {
			return context.DeadlineExceeded
		}
		return nil
	}}
	rep, by, err := outcomes(t, ctx, js, Options{Stream: "EV_DLQ"})
	if err != nil || rep.Replayed != 1 || rep.Failed != 1 || lookups != 2 {
		t.Fatalf("report %+v, %v, outcomes %+v, %d lookups; want the first letter refused, the second replayed", rep, err, by, lookups)
	}
	if err := by["ev.0"].Err; !errors.Is(err, ErrNoReader) || !strings.Contains(err.Error(), "it held 5 messages; its reader is not known "+
		"(the info of consumer jetsink, which dead letter 1 names in Jetsink-Consumer, could not be read: context deadline exceeded)") {
		t.Fatalf("ev.0: %v", err)
	}
	if st := streamState(t, ctx, s); st.FirstSeq != 2 || st.LastSeq != 6 {
		t.Fatalf("event stream %+v: want the replayed event, a read one pushed out", st)
	}
}

package consumer

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// Events the stream's limits drop before the durable delivers them (here
// max_msgs with discard old: a stream that keeps too little behind a
// stopped jetsink) are lost to the table. They were lost without a word;
// now they are counted (DeletedUnread) and logged at Error with their
// sequences, at the next start (the stream's first sequence past the
// consumer's delivered one), each sequence once however often the
// consumer looks.
func TestEventsDeletedWhileStoppedAreCounted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, cfg, _ := ownStream(t, ctx, keepFive, nil)
	c1, log1 := newLoggedConsumer(t, ctx, cfg)
	r := startRun(t, ctx, c1, 1, 64, 64)
	publish(t, ctx, js, cfg, 2, 1, 0) // sequences 1 and 2
	r.ackUntil(t, ctx, 1)
	r.stopClean(t, ctx)
	_ = c1.Close(ctx)
	if n := c1.Stats().DeletedUnread; n != 0 || len(errorLines(log1.String(), "deleted events")) > 0 {
		t.Fatalf("nothing deleted yet: %d counted\n%s", n, log1)
	}

	// Stopped: events 2..21 (sequences 3..22) published, the stream keeps
	// sequences 18..22: 3..17 gone unread.
	publish(t, ctx, js, cfg, 20, 1, 2)
	c2, log2 := newLoggedConsumer(t, ctx, cfg)
	c2.floorEvery = 20 * time.Millisecond
	r2 := startRun(t, ctx, c2, 1, 64, 64)
	waitFor(t, ctx, "15 events counted deleted unread", func() bool { return c2.Stats().DeletedUnread >= 15 })
	waitLooks(t, ctx, c2, 5) // several looks more
	if n := c2.Stats().DeletedUnread; n != 15 {
		t.Fatalf("%d counted deleted unread, want 15", n)
	}
	if lines := errorLines(log2.String(), "deleted events before jetsink read them"); len(lines) != 1 ||
		!strings.Contains(lines[0], "events=15 ") || !strings.Contains(lines[0], "stream_seqs=3-17 ") {
		t.Fatalf("want one Error line for sequences 3-17; got %q", lines)
	}
	r2.ackUntil(t, ctx, 21)
	r2.stopClean(t, ctx)
}

// Events dropped while jetsink runs but before the server delivers them
// (here a purge while max_ack_pending holds the deliveries back; as a
// stream's limits do behind a jetsink held up by its database) are
// counted at the delivery after them: consecutive deliveries whose stream
// sequences leave a gap. Not by the looks, which this test turns off.
func TestEventsDeletedWhileRunningAreCounted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, cfg, stream := ownStream(t, ctx, jetstream.StreamConfig{}, heldOne)
	c, _ := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = time.Hour // no look of serve's: the start's alone
	r := startRun(t, ctx, c, 1, 64, 64)
	publish(t, ctx, js, cfg, 1, 1, 0) // sequence 1
	g := r.next(t, ctx)               // event 0, held unacked: the session is up, and holds back
	if i := bodyIndex(t, &g.ev); i != 0 {
		t.Fatalf("event %d, want 0", i)
	}
	publish(t, ctx, js, cfg, 4, 1, 1)                                         // sequences 2..5
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(4)); err != nil { // 1..3 go, 2 and 3 unread
		t.Fatal(err)
	}
	r.ackUntil(t, ctx, 4) // events 3 and 4
	r.stopClean(t, ctx)
	if n := c.Stats().DeletedUnread; n != 2 {
		t.Fatalf("%d counted deleted unread, want 2 (sequences 2 and 3)", n)
	}
}

// Under a filter the consumer passes over the other subjects' messages,
// and the stream's first sequence says nothing of its own: events of
// other subjects the stream drops are not counted as deleted unread.
func TestEventsDeletedUnreadNotCountedUnderAFilter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, cfg, _ := ownStream(t, ctx, keepFive, func(c *Config) { c.FilterSubject = "in." + c.Stream + ".s0" })
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = 50 * time.Millisecond
	r := startRun(t, ctx, c, 1, 64, 64)
	publish(t, ctx, js, cfg, 20, 2, 0) // even events on s0, odd on s1: the stream keeps 15..19
	r.ackUntil(t, ctx, 18)
	waitLooks(t, ctx, c, 5)
	r.stopClean(t, ctx)
	if n := c.Stats().DeletedUnread; n != 0 || len(errorLines(log.String(), "deleted events")) > 0 {
		t.Fatalf("%d counted deleted unread under a filter, want 0\n%s", n, log)
	}
}

// Each sequence is counted once, however often the looks and deliveries
// see it gone; a look under a filter counts nothing and stops the
// deliveries' count; consecutive first deliveries alone tell a gap (a
// consumer sequence skipped is another instance's delivery, or one lost
// on its way, which comes again).
func TestDeletedUnreadCountedOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, c := enteredConsumer(t, ctx)
	info := func(delivered uint64, filter string) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{Delivered: jetstream.SequenceInfo{Stream: delivered},
			Config: jetstream.ConsumerConfig{FilterSubject: filter}}
	}
	want := func(n uint64) {
		t.Helper()
		if got := c.Stats().DeletedUnread; got != n {
			t.Fatalf("%d counted, want %d", got, n)
		}
	}
	c.noteDeletedUnread(18, true, info(2, "")) // 3..17
	want(15)
	c.noteDeletedUnread(18, true, info(2, "")) // the same look again
	want(15)
	c.noteDeletedUnread(25, true, info(2, "")) // 18..24 more
	want(22)
	c.noteDeletedUnread(30, false, info(2, "")) // no look at the stream
	want(22)
	s := &session{}
	skipped := func(cons, seq uint64) {
		if prev, gap := s.firstDelivery(cons, seq); gap {
			c.noteSkipped(prev, seq)
		}
	}
	skipped(7, 25) // the session's first delivery: nothing before it
	skipped(8, 28) // 26, 27
	want(24)
	skipped(10, 31) // consumer sequence 9 went elsewhere: no gap told
	want(24)
	skipped(11, 31+1)
	want(24)
	c.noteDeletedUnread(40, true, info(32, "in.x")) // a filter on the server
	want(24)
	skipped(12, 40)
	want(24)
	c.noteDeletedUnread(40, true, info(32, "")) // unfiltered again: 33..39
	want(31)
	skipped(13, 45) // 41..44; 33..39 not again
	want(35)
}

// No false counts: a gap the stream had before the durable existed (a
// new durable's first pass over the stream's history), and a schedule the
// server purged as it fired while jetsink lagged (its fired copy is the
// event, delivered) are not events deleted unread. A subject delete marker
// that expired while jetsink was stopped is counted (a sequence gone is
// all jetsink sees), and the line says such markers may be among them.
func TestDeletedUnreadNoFalseCounts(t *testing.T) {
	t.Run("gap before the durable", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		js, cfg, s := ownStream(t, ctx, jetstream.StreamConfig{}, nil)
		publish(t, ctx, js, cfg, 5, 1, 0)
		if err := s.DeleteMsg(ctx, 3); err != nil {
			t.Fatal(err)
		}
		c, log := newLoggedConsumer(t, ctx, cfg)
		r := startRun(t, ctx, c, 1, 64, 64)
		r.ackUntil(t, ctx, 4)
		r.stopClean(t, ctx)
		if n := c.Stats().DeletedUnread; n != 0 {
			t.Fatalf("%d counted: %q", n, errorLines(log.String(), "deleted events"))
		}
	})
	t.Run("schedule fired while lagging", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		js, cfg, s := ownStream(t, ctx, jetstream.StreamConfig{AllowMsgSchedules: true}, heldOne)
		c, log := newLoggedConsumer(t, ctx, cfg)
		r := startRun(t, ctx, c, 1, 64, 64)
		publish(t, ctx, js, cfg, 1, 3, 2)          // sequence 1, on s2
		g := r.next(t, ctx)                        // held: the schedule waits
		fireScheduleHeld(t, ctx, js, s, cfg, r, g) // sequence 2; fired: 3, and 2 purged
		if n := c.Stats().DeletedUnread; n != 0 {
			t.Fatalf("%d counted: %q", n, errorLines(log.String(), "deleted events"))
		}
	})
	t.Run("filtered mirror", func(t *testing.T) {
		// A mirror with a filter keeps the origin's sequences and skips
		// those of the subjects it leaves out: gaps, all the time.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv := testenv.NATS(t)
		js := jsFor(t, srv)
		cfg := testConfig(t, srv)
		cfg.CreateStream = false
		if _, err := CreateStream(ctx, js, jetstream.StreamConfig{Name: "O" + cfg.Stream, Subjects: cfg.Subjects}); err != nil {
			t.Fatal(err)
		}
		if _, err := CreateStream(ctx, js, jetstream.StreamConfig{Name: cfg.Stream,
			Mirror: &jetstream.StreamSource{Name: "O" + cfg.Stream, FilterSubject: subjectOf(cfg, 0, 2)}}); err != nil {
			t.Fatal(err)
		}
		c, log := newLoggedConsumer(t, ctx, cfg)
		r := startRun(t, ctx, c, 1, 64, 64)
		waitFor(t, ctx, "the session's look", func() bool { return c.skipFloor.Load() != math.MaxUint64 })
		publish(t, ctx, js, cfg, 6, 2, 0) // the origin's 1..6; the mirror stores 1, 3, 5
		r.ackUntil(t, ctx, 4)
		r.stopClean(t, ctx)
		if n := c.Stats().DeletedUnread; n != 0 {
			t.Fatalf("%d counted: %q", n, errorLines(log.String(), "deleted events"))
		}
	})
	t.Run("schedules switched on while running", func(t *testing.T) {
		// allow_msg_schedules can be switched on, not off: a look while
		// the session runs sees it.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		js, cfg, s := ownStream(t, ctx, jetstream.StreamConfig{}, heldOne)
		sc := s.CachedInfo().Config
		c, log := newLoggedConsumer(t, ctx, cfg)
		c.floorEvery = 50 * time.Millisecond
		r := startRun(t, ctx, c, 1, 64, 64)
		publish(t, ctx, js, cfg, 1, 3, 2) // sequence 1, on s2
		g := r.next(t, ctx)               // held
		sc.AllowMsgSchedules = true
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "a look seeing schedules", func() bool { return c.gapsNotEvents.Load() })
		fireScheduleHeld(t, ctx, js, s, cfg, r, g) // sequence 2; fired: 3, and 2 purged
		if n := c.Stats().DeletedUnread; n != 0 {
			t.Fatalf("%d counted: %q", n, errorLines(log.String(), "deleted events"))
		}
	})
	t.Run("marker expired while stopped", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		js, cfg, s := ownStream(t, ctx, jetstream.StreamConfig{MaxAge: time.Second, AllowMsgTTL: true, SubjectDeleteMarkerTTL: time.Second}, nil)
		c1 := newConsumer(t, ctx, cfg)
		r1 := startRun(t, ctx, c1, 1, 64, 64)
		publish(t, ctx, js, cfg, 1, 1, 0)
		r1.ackUntil(t, ctx, 0)
		r1.stopClean(t, ctx)
		_ = c1.Close(ctx)
		waitFor(t, ctx, "the marker stored and expired", func() bool {
			info, err := s.Info(ctx)
			return err == nil && info.State.LastSeq == 2 && info.State.FirstSeq == 3
		})
		c, log := newLoggedConsumer(t, ctx, cfg)
		r := startRun(t, ctx, c, 1, 64, 64)
		waitFor(t, ctx, "the marker counted", func() bool { return c.Stats().DeletedUnread == 1 })
		r.stopClean(t, ctx)
		if lines := errorLines(log.String(), "deleted events"); len(lines) != 1 || !strings.Contains(lines[0], "may_include=") {
			t.Fatalf("want one Error line saying markers may be among them: %q", lines)
		}
	})
}

// fireScheduleHeld publishes a schedule that fires a second later as
// event 7, stream sequence 2 (the server purges it as it fires, and stores
// the event at 3), while g, sequence 1, is held unacked under
// max_ack_pending 1; then acks g and what r hands on up to event 7, and
// stops r.
func fireScheduleHeld(t *testing.T, ctx context.Context, js jetstream.JetStream, s jetstream.Stream, cfg Config, r *runner, g got) {
	t.Helper()
	m := &nats.Msg{Subject: subjectOf(cfg, 0, 2), Data: []byte("7"), Header: nats.Header{}}
	m.Header.Set("Nats-Schedule", "@at "+time.Now().Add(time.Second).UTC().Format(time.RFC3339))
	m.Header.Set("Nats-Schedule-Target", subjectOf(cfg, 1, 2))
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the schedule fired", func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.LastSeq == 3 && info.State.Msgs == 2
	})
	if err := g.ev.Msg.Ack(); err != nil {
		t.Fatal(err)
	}
	r.ackUntil(t, ctx, 7)
	r.stopClean(t, ctx)
}

// waitLooks waits until c's session has looked at the durable n times
// more (refreshFloor).
func waitLooks(t *testing.T, ctx context.Context, c *Consumer, n uint64) {
	t.Helper()
	until := c.looks.Load() + n
	waitFor(t, ctx, fmt.Sprintf("%d looks more", n), func() bool { return c.looks.Load() >= until })
}

// ownStream makes stream sc, named and on subjects as testConfig's, on a
// server of its own, and returns JetStream, the config (CreateStream off,
// set applied if not nil) and the stream.
func ownStream(t *testing.T, ctx context.Context, sc jetstream.StreamConfig, set func(*Config)) (jetstream.JetStream, Config, jetstream.Stream) {
	t.Helper()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	if set != nil {
		set(&cfg)
	}
	sc.Name, sc.Subjects = cfg.Stream, cfg.Subjects
	s, err := CreateStream(ctx, js, sc)
	if err != nil {
		t.Fatal(err)
	}
	return js, cfg, s
}

// keepFive keeps a stream's last 5 messages (max_msgs, discard old).
var keepFive = jetstream.StreamConfig{MaxMsgs: 5, Discard: jetstream.DiscardOld}

// heldOne has the server deliver one message at a time (max_ack_pending
// 1): the test holds one back by not acking it.
func heldOne(c *Config) { c.MaxAckPending = 1 }

// errorLines returns the lines of log at level ERROR that hold what.
func errorLines(log, what string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=ERROR") && strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return out
}

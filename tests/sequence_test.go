package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/sink"
)

// Exactly-once keys rows by (stream, stream_seq). A stream deleted while
// jetsink runs with nats.create_stream, or while it is stopped, is
// re-created by jetsink past the rows stored for it, so the events
// published to the new stream are stored too, not skipped as duplicates of
// the old ones.
func TestExactlyOnceRecreatedStreamContinuesSequence(t *testing.T) {
	const events = 2000
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := e.config(sink.ExactlyOnce)
	r := e.start(ctx, cfg) // creates the stream
	e.publish(ctx, 0, events, 10)
	e.waitDrained(ctx, events, r)

	recreated := func(stored uint64) {
		t.Helper()
		var st jetstream.StreamState
		waitFor(t, ctx, "jetsink to re-create the stream", func() (bool, string) {
			s, err := e.js.Stream(ctx, e.stream)
			if err != nil {
				return false, err.Error()
			}
			st = s.CachedInfo().State
			return true, ""
		})
		if st.LastSeq < stored {
			t.Fatalf("re-created stream starts at sequence %d, within the %d stored", st.LastSeq+1, stored)
		}
	}
	// While jetsink runs.
	if err := e.js.DeleteStream(ctx, e.stream); err != nil {
		t.Fatal(err)
	}
	recreated(events)
	e.publish(ctx, events, events, 10)
	e.waitDrained(ctx, 2*events, r)

	// While it is stopped: only the table knows the old sequence.
	r.drain(t)
	if err := e.js.DeleteStream(ctx, e.stream); err != nil {
		t.Fatal(err)
	}
	r = e.start(ctx, cfg)
	recreated(2 * events)
	e.publish(ctx, 2*events, events, 10)
	e.waitDrained(ctx, 3*events, r)
	if n := e.rows(ctx); n != 3*events {
		t.Fatalf("%d rows, want %d", n, 3*events)
	}
	r.drain(t)
}

// A stream re-created from sequence 1 by someone else is refused, while
// jetsink runs and again after a restart, even once it has been refilled
// past the stored rows; nothing of it is acked, and the rows of the old
// stream that were on their way still reach the table. Re-created past the
// stored rows, it is consumed.
func TestExactlyOnceRefusesRestartedSequence(t *testing.T) {
	const events, inFlight = 1000, 50
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e.createStreams(ctx)
	cfg := e.config(sink.ExactlyOnce)
	cfg.NATS.CreateStream = false
	r := e.start(ctx, cfg)
	e.publish(ctx, 0, events, 10)
	e.waitDrained(ctx, events, r)

	recreate := func(first uint64) { e.recreateStream(ctx, first) }
	refused := func(r *running, when string) {
		t.Helper()
		waitFor(t, ctx, when+": the stream refused", func() (bool, string) {
			select {
			case err := <-r.done:
				r.done <- err // for Cleanup
				t.Fatalf("%s: Run returned %v; it waits for the stream to be fixed", when, err)
			default:
			}
			err := r.p.Consumer().Refused()
			return errors.Is(err, consumer.ErrSequenceRestarted), fmt.Sprint(err)
		})
		t.Logf("%s: %v", when, r.p.Consumer().Refused())
		// Not one event of the new stream acked.
		if info := e.consumerInfo(ctx); info.AckFloor.Stream != 0 || info.Delivered.Stream != 0 {
			t.Fatalf("%s: new stream delivered up to %d, acked up to %d", when, info.Delivered.Stream, info.AckFloor.Stream)
		}
	}

	// Rows of the old stream held up by a lock when it is replaced.
	tx := e.lockTable(ctx, e.db, "EXCLUSIVE")
	e.publish(ctx, events, inFlight, 2)
	waitFor(t, ctx, "the held-up rows taken in", func() (bool, string) {
		n := r.p.Consumer().Stats().Received
		return n >= events+inFlight, fmt.Sprintf("%d received", n)
	})
	recreate(0)
	e.publish(ctx, 2*events, 10, 2)
	refused(r, "while running")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the held-up rows stored", func() (bool, string) {
		n := e.rows(ctx)
		return n == events+inFlight, fmt.Sprintf("%d rows", n)
	})

	// Refilled past the stored rows, and jetsink restarted: still refused.
	r.drain(t)
	e.publish(ctx, 3*events, events+inFlight, 10)
	r = e.start(ctx, cfg)
	refused(r, "after a restart")
	r.drain(t)
	if out, code := jetsinkCmd(t, nil, "check", "--config", e.writeConfig(sink.ExactlyOnce)); code != 1 || !strings.Contains(out, "stream sequence restarted") {
		t.Fatalf("check on the refused stream: exit %d\n%s", code, out)
	}
	if n := e.rows(ctx); n != events+inFlight {
		t.Fatalf("%d rows, want %d", n, events+inFlight)
	}

	// Re-created past the stored rows: consumed.
	recreate(events + inFlight + 1)
	e.publish(ctx, 5*events, 10, 2)
	r = e.start(ctx, cfg)
	e.waitDrained(ctx, events+inFlight+10, r)
	if n := e.count(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE stream_seq > %d", e.tableID(), events+inFlight)); n != 10 {
		t.Fatalf("%d rows past sequence %d, want 10", n, events+inFlight)
	}
	r.drain(t)
}

// recreateStream deletes the event stream and creates it again as an
// operator would, starting at sequence first (0: 1).
func (e *env) recreateStream(ctx context.Context, first uint64) {
	e.t.Helper()
	if err := e.js.DeleteStream(ctx, e.stream); err != nil {
		e.t.Fatal(err)
	}
	// Just after the delete the server may still be removing the old
	// store ("error creating store for stream"): try for a while.
	sc := jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.prefix + ".>"}, FirstSeq: first}
	waitFor(e.t, ctx, "the stream re-created", func() (bool, string) {
		_, err := e.js.CreateStream(ctx, sc)
		return err == nil, fmt.Sprint(err)
	})
}

// At-least-once, a stream re-created from sequence 1 by someone else while
// rows of the old stream are held up by a lock: those rows still reach the
// table but are not acked, since their sequences now name events of the
// new stream, which all reach the table and are acked by their own rows.
func TestAtLeastOnceRecreatedStreamSkipsOldAcks(t *testing.T) {
	const inFlight, fresh = 50, 100
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.createStreams(ctx)
	cfg := e.config(sink.AtLeastOnce)
	cfg.NATS.CreateStream = false
	r := e.start(ctx, cfg)
	received := func(n uint64) {
		t.Helper()
		waitFor(t, ctx, fmt.Sprintf("%d events taken in", n), func() (bool, string) {
			got := r.p.Consumer().Stats().Received
			return got >= n, fmt.Sprintf("%d received", got)
		})
	}

	tx := e.lockTable(ctx, e.db, "EXCLUSIVE")
	e.publish(ctx, 0, inFlight, 2) // sequences 1..inFlight, held up
	received(inFlight)
	e.recreateStream(ctx, 0)
	e.publish(ctx, inFlight, fresh, 2) // sequences 1..fresh of the new stream
	received(inFlight + fresh)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitDrained(ctx, inFlight+fresh, r)
	if st := r.p.Sink().Stats(); st.StaleAcks != inFlight {
		t.Fatalf("%d committed rows not acked, want the %d of the deleted stream", st.StaleAcks, inFlight)
	}
	if info := e.consumerInfo(ctx); info.AckFloor.Stream != fresh {
		t.Fatalf("new stream acked up to %d, want %d", info.AckFloor.Stream, fresh)
	}
	// The rows not acked gave back their in-flight bytes all the same.
	waitFor(t, ctx, "no in-flight bytes held", func() (bool, string) {
		h, _ := r.p.Consumer().InFlightBytes()
		return h == 0, fmt.Sprintf("%d bytes held", h)
	})
	r.drain(t)
}

package tests

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/sink"
)

// Exactly-once keys rows by (stream, stream_seq). A stream deleted while
// jetsink runs with nats.create_stream is re-created by jetsink past the
// rows stored for it, so the events published to the new stream are stored
// too, not skipped as duplicates of the old ones.
func TestExactlyOnceRecreatedStreamContinuesSequence(t *testing.T) {
	const events = 2000
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := e.start(ctx, e.config(sink.ExactlyOnce)) // creates the stream
	e.publish(ctx, 0, events, 10)
	e.waitDrained(ctx, events, r)

	if err := e.js.DeleteStream(ctx, e.stream); err != nil {
		t.Fatal(err)
	}
	var info *jetstream.StreamInfo
	waitFor(t, ctx, "jetsink to re-create the stream", func() (bool, string) {
		s, err := e.js.Stream(ctx, e.stream)
		if err != nil {
			return false, err.Error()
		}
		info = s.CachedInfo()
		return true, ""
	})
	if info.Config.FirstSeq <= events {
		t.Fatalf("re-created stream starts at sequence %d, within the %d stored", info.Config.FirstSeq, events)
	}
	e.publish(ctx, events, events, 10)
	e.waitDrained(ctx, 2*events, r)
	if n := e.rows(ctx); n != 2*events {
		t.Fatalf("%d rows, want %d", n, 2*events)
	}
	r.drain(t)
}

// A stream re-created from sequence 1 by someone else is refused, while
// jetsink runs and again at start-up, without acking any of its events;
// re-created past the stored rows, it is consumed.
func TestExactlyOnceRefusesRestartedSequence(t *testing.T) {
	const events = 1000
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.createStreams(ctx)
	cfg := e.config(sink.ExactlyOnce)
	cfg.NATS.CreateStream = false
	r := e.start(ctx, cfg)
	e.publish(ctx, 0, events, 10)
	e.waitDrained(ctx, events, r)

	recreate := func(first uint64) {
		t.Helper()
		if err := e.js.DeleteStream(ctx, e.stream); err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.prefix + ".>"}, FirstSeq: first}); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(r *running, when string) {
		t.Helper()
		select {
		case err := <-r.done:
			r.done <- err // for Cleanup
			if !errors.Is(err, consumer.ErrSequenceRestarted) {
				t.Fatalf("%s: Run returned %v, want ErrSequenceRestarted", when, err)
			}
			t.Logf("%s: %v", when, err)
		case <-ctx.Done():
			t.Fatalf("%s: Run went on with a restarted sequence", when)
		}
		if n := e.rows(ctx); n != events {
			t.Fatalf("%s: %d rows, want %d", when, n, events)
		}
		// Not one event of the new stream acked (the consumer may be gone
		// with a stream re-created after the refusal).
		if c, err := e.js.Consumer(ctx, e.stream, "jetsink"); err == nil {
			if info, err := c.Info(ctx); err == nil && info.AckFloor.Stream != 0 {
				t.Fatalf("%s: new stream acked up to %d", when, info.AckFloor.Stream)
			}
		}
	}

	recreate(0)
	e.publish(ctx, events, 10, 2)
	refused(r, "while running")
	refused(e.start(ctx, cfg), "at start-up")

	recreate(events + 1)
	e.publish(ctx, events, 10, 2) // the 10 events went with the stream
	r = e.start(ctx, cfg)
	e.waitDrained(ctx, events+10, r)
	if n := e.count(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE stream_seq > %d", e.tableID(), events)); n != 10 {
		t.Fatalf("%d rows past sequence %d, want 10", n, events)
	}
	r.drain(t)
}

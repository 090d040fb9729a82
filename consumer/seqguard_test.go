package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// With StoredSeq, the sequences of messages delivered but not yet stored
// count too: a deleted stream is re-created past them (create_stream), and
// a stream re-created by someone else from 1 is refused even when the
// table holds nothing for it yet. (tests/sequence_test.go runs the same
// against a real table.)
func TestStoredSeqCountsMessagesInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	noRows := func(context.Context, string) (uint64, error) { return 0, nil }

	t.Run("create_stream", func(t *testing.T) {
		cfg := testConfig(t, srv)
		cfg.StoredSeq = noRows
		c := newConsumer(t, ctx, cfg)
		publish(t, ctx, js, cfg, 5, 1, 0)
		r := startRun(t, ctx, c, 1, 64, 1000)
		for range 5 {
			r.next(t, ctx) // not acked: the sink still has it
		}
		if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "the stream to be re-created", func() bool {
			_, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
			return err == nil
		})
		publish(t, ctx, js, cfg, 1, 1, 100)
		if ev := r.next(t, ctx).ev; ev.StreamSeq != 6 {
			t.Fatalf("first message of the re-created stream has sequence %d, want 6", ev.StreamSeq)
		}
		if err := r.stop(t, ctx); err != nil {
			t.Fatalf("Run = %v", err)
		}
	})

	t.Run("re-created by someone else", func(t *testing.T) {
		cfg := testConfig(t, srv)
		cfg.CreateStream = false
		cfg.StoredSeq = noRows
		sc := jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects}
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
		c := newConsumer(t, ctx, cfg)
		publish(t, ctx, js, cfg, 5, 1, 0)
		r := startRun(t, ctx, c, 1, 64, 1000)
		for range 5 {
			r.next(t, ctx)
		}
		if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
		publish(t, ctx, js, cfg, 10, 1, 100) // past the 5 seen, so only the creation time tells
		select {
		case err := <-r.done:
			if !errors.Is(err, ErrSequenceRestarted) {
				t.Fatalf("Run = %v, want ErrSequenceRestarted", err)
			}
		case g := <-r.events:
			t.Fatalf("message %d of the re-created stream delivered", g.ev.StreamSeq)
		case <-ctx.Done():
			t.Fatal("Run went on with a re-created stream")
		}
	})
}

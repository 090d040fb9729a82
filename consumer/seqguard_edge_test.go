package consumer

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// Intake ends while serve verifies the stream for a message taken after a
// disconnect: the drain still pushes everything the client holds, verified
// under hard, as Run promises. (A first version stopped the session
// instead: 7 of 40 pushed.)
func TestStoredSeqIntakeEndDuringVerifyStillDrains(t *testing.T) {
	ctx, cancel, srv, cfg, js := guardedTest(t, 60*time.Second)
	defer cancel()
	c, log := newLoggedConsumer(t, ctx, cfg)
	const n = 40
	publish(t, ctx, js, cfg, n, 1, 0)
	r := startRun(t, ctx, c, 1, 2, 1)
	got := map[uint64]bool{}
	got[r.next(t, ctx).ev.StreamSeq] = true
	srv.Shutdown()
	waitFor(t, ctx, "the disconnect", func() bool { return c.seq.gen.Load() > 0 })
	for range 3 {
		got[r.next(t, ctx).ev.StreamSeq] = true
	}
	const waits = "could not verify the stream yet"
	waitFor(t, ctx, "serve waiting to verify", func() bool { return strings.Contains(log.String(), waits) })
	before := strings.Count(log.String(), waits)
	r.cancel() // intake over: drain
	waitFor(t, ctx, "the verification tried again for the drain", func() bool { return strings.Count(log.String(), waits) > before })
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case g := <-r.events:
			got[g.ev.StreamSeq] = true
			continue
		case err := <-r.done:
		tail:
			for {
				select {
				case g := <-r.events:
					got[g.ev.StreamSeq] = true
				case <-time.After(2 * time.Second):
					break tail
				}
			}
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
		case <-ctx.Done():
			t.Fatal("timeout")
		}
		break
	}
	if len(got) < 10 {
		t.Fatalf("only %d of %d messages pushed before Run returned nil after intake ended; the rest were held by the client and not drained", len(got), n)
	}
	t.Logf("%d pushed", len(got))
}

// Messages of the old stream still buffered in the client when the stream
// is re-created during a disconnect, with first_seq past the rows stored
// and past seenMax (as the refusal message advises), go with their stream:
// were they pushed after the new stream is accepted, old and new events
// would share sequences, and in exactly-once mode the new ones would be
// skipped as duplicates.
func TestStoredSeqOldBufferedMessagesGoWithTheirStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	cfg.StoredSeq = func(context.Context, string) (uint64, error) { return 50, nil }
	js := jsFor(t, srv)
	makeStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 100, 1, 0)
	c := newConsumer(t, ctx, cfg)
	r := startRun(t, ctx, c, 1, 2, 1)
	seen := map[uint64]int{}
	body := map[uint64]int{}
	max := uint64(0)
	for range 50 {
		ev := r.next(t, ctx).ev
		seen[ev.StreamSeq]++
		body[ev.StreamSeq] = bodyIndex(t, &ev)
	}
	// Let the handler fill the tiny ring and block; whatever seenMax is then,
	// first_seq past it keeps the new stream acceptable and old buffered
	// messages overlapping it (were it read early, the stream would be
	// refused instead, and nothing pushed twice either way).
	time.Sleep(500 * time.Millisecond)
	max = c.seq.seenMax.Load()
	first := max + 5
	t.Logf("seenMax %d, new stream first_seq %d", max, first)
	srv.Shutdown()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	js2 := jsFor(t, srv)
	recreateStream(t, ctx, js2, cfg, first)
	if _, err := js2.CreateOrUpdateConsumer(ctx, cfg.Stream, c.consumerConfig(nil, nil)); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js2, cfg, 5, 1, 1000)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case g := <-r.events:
			seen[g.ev.StreamSeq]++
			b := bodyIndex(t, &g.ev)
			if seen[g.ev.StreamSeq] > 1 {
				t.Fatalf("stream sequence %d pushed twice: body %d (old stream, buffered) and body %d (new stream); refused=%v", g.ev.StreamSeq, body[g.ev.StreamSeq], b, c.Refused())
			}
			body[g.ev.StreamSeq] = b
			continue
		case <-deadline:
		}
		break
	}
	t.Logf("no duplicate sequence; refused=%v; %d seqs", c.Refused(), len(seen))
}

// A purged stream keeps its last sequence across a server restart (else
// checkSeq would refuse it: it would end below the stored rows).
func TestStoredSeqPurgeThenRestartKeepsLastSeq(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	js := jsFor(t, srv)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 10, 1, 0)
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	js2 := jsFor(t, srv)
	var info *jetstream.StreamInfo
	waitFor(t, ctx, "stream", func() bool {
		st, err := js2.Stream(ctx, cfg.Stream)
		if err != nil {
			return false
		}
		info = st.CachedInfo()
		return true
	})
	if info.State.LastSeq != 10 {
		t.Fatalf("after purge and restart LastSeq = %d, want 10", info.State.LastSeq)
	}
}

// Exactly-once with create_stream: the server loses the stream (memory
// storage, or a lost store) while the client holds messages. The first one
// after the reconnect waits for serve to verify the stream; "stream not
// found" is not waited out but handed to Run, which re-creates it.
func TestStoredSeqLostStreamIsRecreated(t *testing.T) {
	ctx, cancel, srv, cfg, js := guardedTest(t, 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	cfg.CreateStream = false // New would refuse to turn the memory stream into a file one
	c := newConsumer(t, ctx, cfg)
	c.cfg.CreateStream = true // as if the store (a file stream's) were lost: Run must re-create it
	publish(t, ctx, js, cfg, 40, 1, 0)
	r := startRun(t, ctx, c, 1, 2, 1)
	r.next(t, ctx)
	srv.Shutdown()
	waitFor(t, ctx, "the disconnect", func() bool { return c.seq.gen.Load() > 0 })
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r.next(t, ctx)
	}
	js2 := jsFor(t, srv)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	for {
		if _, err := js2.Stream(wctx, cfg.Stream); err == nil {
			return
		}
		select {
		case <-wctx.Done():
			t.Fatalf("the stream was not re-created within 30 s (create_stream: true); Stats %+v", c.Stats())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Intake ends while the client holds messages taken before a disconnect,
// and the drain then finds the stream gone (the server lost its store):
// the epoch advances, as when a session ends with intake going on, so that
// what the session pushed is not acked into a stream that takes the name
// later. (Before, only the session that went on advanced it.)
func TestStoredSeqStreamLostDuringDrainAdvancesEpoch(t *testing.T) {
	ctx, cancel, srv, cfg, js := guardedTest(t, 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	cfg.CreateStream = false // memory: gone after the restart, and nothing re-creates it
	c, log := newLoggedConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 40, 1, 0)
	r := startRun(t, ctx, c, 1, 2, 1)
	before := r.next(t, ctx).ev.Epoch
	srv.Shutdown()
	waitFor(t, ctx, "the disconnect", func() bool { return c.seq.gen.Load() > 0 })
	// The handler waits on the full ring with a message it took before the
	// disconnect; the next one must be verified, and by then intake is over.
	r.cancel()
	const waits = "could not verify the stream yet"
	for !strings.Contains(log.String(), waits) {
		select {
		case <-r.events:
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no verification asked for during the drain")
		}
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case <-r.events:
			continue
		case err := <-r.done:
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
		case <-ctx.Done():
			t.Fatal("Run did not return after the drain")
		}
		break
	}
	if !strings.Contains(log.String(), "stream re-created or lost while draining") {
		t.Fatalf("no new epoch from the drain's verification:\n%s", log.String())
	}
	if now := c.Epochs().Current(); now == before {
		t.Fatalf("epoch still %d after the drain found the stream gone; log:\n%s", now, log.String())
	}
}

// A stream re-created from 1 with its consumer gone (checkSeq can run
// before Run makes the consumer again: after a reconnect or a lost pull
// connection) is refused, and the refusal is marked on a consumer made for
// it, so that a restart, knowing nothing of the old stream, refuses the
// stream too once it is refilled past the stored rows.
func TestStoredSeqRefusalMarkedWhenTheConsumerIsGone(t *testing.T) {
	ctx, cancel, _, cfg, js := guardedTest(t, 60*time.Second)
	defer cancel()
	cfg.CreateStream = false
	cfg.StoredSeq = func(context.Context, string) (uint64, error) { return 100, nil }
	makeStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 100, 1, 0)
	c := newConsumer(t, ctx, cfg)
	if err := c.checkSeq(ctx); err != nil {
		t.Fatalf("the first stream: %v", err)
	}
	recreateStream(t, ctx, js, cfg, 0) // its consumer goes with it
	if err := c.checkSeq(ctx); !errors.Is(err, ErrSequenceRestarted) {
		t.Fatalf("the re-created stream: %v, want ErrSequenceRestarted", err)
	}
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if marked, err := c.markedReplaced(ctx, s.CachedInfo().Created); err != nil || !marked {
		t.Fatalf("marked %v, %v; want the refusal in the consumer's metadata", marked, err)
	}
	publish(t, ctx, js, cfg, 150, 1, 1000) // refilled past the 100 stored
	c2 := newConsumer(t, ctx, cfg)         // a restart
	if err := c2.checkSeq(ctx); !errors.Is(err, ErrSequenceRestarted) {
		t.Fatalf("after a restart: %v, want ErrSequenceRestarted", err)
	}
}

// Exactly-once: while serve cannot verify the stream for a waiting
// message (here the user may no longer look it up; JetStream without a
// leader is the same), nothing is consumed, and serve reads nothing that
// would have recheck say so: NotConsuming reports it after stuckAfter (the
// readiness check fails), and clears once the stream is verified. Before,
// it stayed nil for as long as JetStream was silent.
func TestNotConsumingWhileTheStreamCannotBeVerified(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, cfg, reload := permissionsServer(t, ctx)
	name := cfg.Stream
	cfg.StoredSeq = noRows
	c := newConsumer(t, ctx, cfg)
	c.stuckAfter = 300 * time.Millisecond
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 1000)
	_ = r.next(t, ctx).ev.Msg.Ack()

	reload("$JS.API.STREAM.INFO." + name)
	c.lookAgain() // as a reconnect does: the next message waits for the stream to be verified
	publish(t, ctx, js, cfg, 1, 1, 1)
	waitFor(t, ctx, "NotConsuming to say why", func() bool {
		err := c.NotConsuming()
		return err != nil && strings.Contains(err.Error(), "verify the stream")
	})
	reload()
	r.ackUntil(t, ctx, 1)
	waitFor(t, ctx, "NotConsuming to clear once the stream is verified", func() bool { return c.NotConsuming() == nil })
	r.stopClean(t, ctx)
}

// A stream restored from a backup (here a server started again on an
// older copy of its store) keeps its creation time while its sequence goes
// back: at the first message after the restore it ends below a sequence
// delivered before, and is refused while it ends below the stored rows,
// before its new events reuse their sequences and are skipped as
// duplicates. Before, nats.go's session lived through the reconnect and
// took the same creation time for the same stream.
func TestStoredSeqRestoredStreamIsRefused(t *testing.T) {
	ctx, cancel, srv, cfg, js := guardedTest(t, 60*time.Second)
	defer cancel()
	var stored atomic.Uint64
	cfg.StoredSeq = func(context.Context, string) (uint64, error) { return stored.Load(), nil }
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 50, 1, 0)
	backup := t.TempDir()
	srv.Shutdown()
	if err := os.CopyFS(backup, os.DirFS(srv.StoreDir())); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 50, 1, 50)
	r := startRun(t, ctx, c, 1, 64, 1000)
	r.ackUntil(t, ctx, 99)
	stored.Store(100)

	srv.Shutdown()
	if err := os.RemoveAll(srv.StoreDir()); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(srv.StoreDir(), os.DirFS(backup)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 1, 1, 100) // stream sequence 51 again
	waitFor(t, ctx, "the restored stream refused", func() bool { return errors.Is(c.Refused(), ErrSequenceRestarted) })
	select {
	case g := <-r.events:
		t.Fatalf("the restored stream's event %d (stream_seq %d, under the stored rows) was pushed", bodyIndex(t, &g.ev), g.ev.StreamSeq)
	default:
	}
	r.cancel()
}

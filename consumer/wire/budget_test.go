package wire

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// A Sub with a Budget holds what the handler has taken, and not yet
// settled or released, within the budget: with the handler keeping every
// message, pulling stops at the limit, the silence that follows (no pull
// open, so no heartbeat) is not reported as a missed heartbeat, and
// pulling goes on as messages are acked, each way (Ack, AckAll, Nak,
// Release, Release then Ack), until all have come and the budget holds
// nothing.
func TestConsumeBudgetBoundsWhatIsHeld(t *testing.T) {
	const n, maxPayload, limit = 1500, 8 << 10, 64 << 10
	ctx := testCtx(t, 2*time.Minute)
	srv := startServer(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	js := jetStreamAt(t, serverURL(srv, "nats", ""))
	preload(t, ctx, js, "BUDGET", n, 3, jetstream.ConsumerConfig{AckWait: 5 * time.Minute})
	c := dialTest(t, ctx, serverURL(srv, "nats", ""))
	b := NewBudget(limit)
	var (
		mu   sync.Mutex
		kept []*Msg
		seen = map[uint64]bool{}
	)
	errs := newErrRecorder()
	sub, err := c.Consume(PullOptions{Stream: "BUDGET", Consumer: "C", MaxMessages: 1000, Budget: b,
		Expires: 2 * time.Second, Heartbeat: 500 * time.Millisecond, StallAfter: time.Second}, func(m *Msg) {
		_, sseq := ackMeta(t, m.Reply())
		mu.Lock()
		defer mu.Unlock()
		kept = append(kept, m)
		seen[sseq] = true
	}, errs.onErr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	eventually(t, 10*time.Second, "the budget filled", func() bool { return b.Held() > limit-maxPayload-pullMargin })
	// Four heartbeat intervals: a missed heartbeat is reported after two.
	var most int64
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		most = max(most, b.Held())
	}
	mu.Lock()
	got := len(kept)
	mu.Unlock()
	if most > limit {
		t.Errorf("the handler held %d bytes (%d messages), want at most the budget's %d", most, got, limit)
	}
	if got >= n/2 {
		t.Fatalf("%d of %d messages taken with the handler keeping them: the budget did not stop the pulls", got, n)
	}
	// The wait, with nothing released, is reported as a stall.
	var stall *StallError
	isStall := func(err error) bool {
		se, ok := errors.AsType[*StallError](err)
		if ok && stall == nil {
			stall = se
		}
		return ok
	}
	drainErrs(t, errs, func(err error) {
		if errors.Is(err, ErrNoHeartbeat) {
			t.Errorf("waiting for the budget's room reported as a missed heartbeat: %v", err)
		}
		isStall(err)
	})
	if stall == nil {
		_ = errs.wait(t, 10*time.Second, isStall)
	}
	if stall == nil || stall.Held != b.Held() || stall.Limit != limit || stall.Waited < time.Second {
		t.Errorf("stall report %+v, want one after 1s with the budget's %d of %d bytes", stall, b.Held(), limit)
	}
	// Settle what is kept, each way in turn, until all have come.
	var acks []*Msg
	round := 0
	for deadline := time.Now().Add(time.Minute); ; round++ {
		mu.Lock()
		batch := kept
		kept = nil
		done := len(seen) == n
		mu.Unlock()
		if done && len(batch) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages came", len(seen), n)
		}
		for i, m := range batch {
			switch (round + i) % 4 {
			case 0:
				acks = append(acks, m)
			case 1:
				if err := m.Ack(); err != nil {
					t.Fatalf("ack: %v", err)
				}
			case 2:
				m.Release() // a stale message: ends without a settlement
				m.Release() // twice is once
				if err := m.Ack(); err != nil {
					t.Fatalf("ack after release: %v", err)
				}
			case 3:
				if err := m.Term(); err != nil {
					t.Fatalf("term: %v", err)
				}
			}
		}
		if len(acks) > 0 {
			AckAll(acks, make([]error, len(acks)))
			acks = acks[:0]
		}
		if h := b.Held(); h < 0 {
			t.Fatalf("the budget holds %d bytes: a release counted twice", h)
		}
		time.Sleep(5 * time.Millisecond)
	}
	eventually(t, 10*time.Second, "nothing held once all are settled", func() bool { return b.Held() == 0 })
}

// drainErrs passes every error recorded so far to check.
func drainErrs(t *testing.T, r *errRecorder, check func(error)) {
	t.Helper()
	for {
		select {
		case err := <-r.ch:
			check(err)
		default:
			return
		}
	}
}

// room registers a waiter when fewer than want bytes are free; a release
// that frees them wakes it, once; forget stops it being woken. Run with
// -race, many goroutines taking and releasing never lose a wake-up: a
// waiter that found no room is woken once the budget empties.
func TestBudgetRoomAndWake(t *testing.T) {
	b := NewBudget(100)
	ch := make(chan struct{}, 1)
	if free := b.room(10, 0, ch); free != 100 {
		t.Fatalf("room of an empty budget: %d, want 100", free)
	}
	b.take(95)
	if free := b.room(10, 0, ch); free != 5 {
		t.Fatalf("room with 95 held: %d, want 5", free)
	}
	b.release(3) // 92 held: 8 free, still short of 10
	select {
	case <-ch:
		t.Fatal("woken before 10 bytes were free")
	default:
	}
	b.release(2) // 90 held: 10 free
	select {
	case <-ch:
	default:
		t.Fatal("not woken when 10 bytes became free")
	}
	if at := b.wakeAt.Load(); at != math.MinInt64 {
		t.Errorf("wakeAt %d after the only waiter was woken, want none", at)
	}
	// extra counts what the caller holds beside the budget.
	if free := b.room(10, 5, ch); free != 5 {
		t.Fatalf("room with 90 held and 5 of the caller's: %d, want 5", free)
	}
	b.forget(ch)
	b.release(90)
	select {
	case <-ch:
		t.Fatal("woken after forget")
	default:
	}
	// Grow wakes a waiter, whose room is then there; it never shrinks.
	b.take(95)
	if free := b.room(10, 0, ch); free != 5 {
		t.Fatalf("room with 95 held: %d, want 5", free)
	}
	b.Grow(200)
	select {
	case <-ch:
	default:
		t.Fatal("not woken when the budget grew")
	}
	if free := b.room(10, 0, ch); free != 105 {
		t.Fatalf("room after growing to 200 with 95 held: %d, want 105", free)
	}
	b.Grow(50)
	if got := b.Limit(); got != 200 {
		t.Fatalf("limit %d after Grow(50), want 200 (it never shrinks)", got)
	}
	b.release(95)

	// Concurrently: four goroutines take and release 7 bytes each of a
	// 30-byte budget; a waiter for 16 bytes gets them whenever two or
	// fewer hold theirs.
	b = NewBudget(30)
	var wg sync.WaitGroup
	var stop atomic.Bool
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				b.take(7)
				b.release(7)
			}
		})
	}
	woke := make(chan struct{}, 1)
	for i := 0; i < 200; i++ {
		if b.room(16, 0, woke) >= 16 {
			continue
		}
		select {
		case <-woke:
		case <-time.After(10 * time.Second):
			stop.Store(true)
			wg.Wait()
			t.Fatalf("waiter %d not woken: %d held", i, b.Held())
		}
	}
	stop.Store(true)
	wg.Wait()
	if h := b.Held(); h != 0 {
		t.Fatalf("%d held after every take was released", h)
	}
}

// BenchmarkBudget is what the budget adds to a message's path: the Sub's
// count of what waits for the handler and the hold (hand), the release of
// a committed batch's acks (AckAll's), and Event.End's Release, which then
// finds nothing held; off is the Sub's path without it. Messages are
// released in batches of 1,000, on another goroutine, as the sink does.
func BenchmarkBudget(b *testing.B) {
	const batch = 1000
	msgs := make([]*Msg, batch)
	for i := range msgs {
		m, buf := newMsg(300)
		m.subj, m.reply, m.hdr, m.data = 20, 80, 0, uint32(len(buf)-100)
		msgs[i] = m
	}
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			s := &Sub{}
			if on {
				s.opts.Budget = NewBudget(64 << 20)
			}
			todo := make(chan []*Msg) // unbuffered: the nil after a batch returns once it is done
			done := make(chan struct{})
			go func() {
				defer close(done)
				for ms := range todo {
					var rel releases
					for _, m := range ms {
						rel.add(m)
						m.Release()
					}
					rel.flush()
				}
			}()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				for _, m := range msgs {
					s.holdBytes(m, 1)
					if s.opts.Budget != nil {
						m.hold(s.opts.Budget)
					}
					s.holdBytes(m, -1)
				}
				todo <- msgs
				todo <- nil // wait for the batch before reusing it
			}
			close(todo)
			<-done
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(b.N, batch)), "ns/msg")
		})
	}
}

// Under a Budget without MaxBytes, a pull asks for a quarter of the budget,
// at most 8 MiB (a burst the server would otherwise send at once), and
// never less than the largest message needs. A Budget below that could
// never pull the largest message: Consume refuses it.
func TestConsumeBudgetPullSize(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := startServer(t, func(o *server.Options) { o.MaxPayload = 8 << 10 })
	js := jetStreamAt(t, serverURL(srv, "nats", ""))
	preload(t, ctx, js, "PULLSIZE", 1, 1, jetstream.ConsumerConfig{})
	c := dialTest(t, ctx, serverURL(srv, "nats", ""))
	_, err := c.Consume(PullOptions{Stream: "PULLSIZE", Consumer: "C", Budget: NewBudget(12 << 10)}, func(*Msg) {}, nil)
	if !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("Consume with a 12 KiB budget under an 8 KiB max_payload (+ 8 KiB): %v, want ErrInvalidOptions", err)
	}
	for _, tc := range []struct{ budget, want int64 }{{1 << 20, 256 << 10}, {256 << 20, maxPullBytes}, {20 << 10, 8<<10 + pullMargin}} {
		sub, err := c.Consume(PullOptions{Stream: "PULLSIZE", Consumer: "C", Budget: NewBudget(tc.budget)}, func(*Msg) {}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sub.pmu.Lock()
		got := sub.maxBytes
		sub.pmu.Unlock()
		sub.Stop()
		<-sub.Closed()
		if got != tc.want {
			t.Errorf("budget %d: a pull asked for %d bytes, want %d", tc.budget, got, tc.want)
		}
	}
}

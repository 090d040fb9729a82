package pipeline

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/ringq"
)

// TestChanHandoffPushAfterClose: a push after Close, as from a delivery
// goroutine still running when a shutdown is cut short, gets ErrClosed
// instead of a panic, and the worker drains what came before, then stops.
func TestChanHandoffPushAfterClose(t *testing.T) {
	h := NewChanHandoff(1, 4)
	ctx := context.Background()
	for i := range 3 {
		if err := h.Push(ctx, Event{Subject: "a", StreamSeq: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	h.Close() // idempotent
	// The channel has room: without the check before the send, select would
	// pick the send about half the time.
	for range 100 {
		if err := h.Push(ctx, Event{Subject: "a"}); !errors.Is(err, ringq.ErrClosed) {
			t.Fatalf("Push after Close = %v, want ErrClosed", err)
		}
	}
	in := h.Input(0)
	dst := make([]Event, 2)
	var got []uint64
	for {
		n, err := in.PopN(ctx, dst)
		if errors.Is(err, ringq.ErrClosed) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range dst[:n] {
			got = append(got, ev.StreamSeq)
		}
	}
	if len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Fatalf("popped %v, want [0 1 2]", got)
	}
}

// TestChanHandoffBlockedPush: a push blocked on a full channel returns
// ctx.Err() when ctx ends and ErrClosed when Close comes.
func TestChanHandoffBlockedPush(t *testing.T) {
	h := NewChanHandoff(1, 1)
	if err := h.Push(context.Background(), Event{Subject: "a"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h.Push(ctx, Event{Subject: "a"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Push on a full channel = %v, want DeadlineExceeded", err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Push(context.Background(), Event{Subject: "a"}) }()
	// Close once the push waits in its select: a push that starts after
	// Close returns ErrClosed without having waited at all.
	deadline := time.After(10 * time.Second)
	for !parkedIn("(*ChanHandoff).Push") {
		select {
		case err := <-done:
			t.Fatalf("Push on a full channel returned %v before Close", err)
		case <-deadline:
			t.Fatal("Push on a full channel never waited in a select or a channel send")
		case <-time.After(time.Millisecond):
		}
	}
	h.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ringq.ErrClosed) {
			t.Fatalf("blocked Push after Close = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the blocked Push")
	}
}

// TestChanHandoffOutputs: the sink's side reports ErrClosed only after every
// worker has closed its output (a second Close of one does not count twice)
// and every row is popped; a PushN after Close gets ErrClosed.
func TestChanHandoffOutputs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := NewChanHandoff(3, 4)
	for i := range 3 {
		rows := []Row{{Event: Event{Subject: strconv.Itoa(i)}}, {Event: Event{Subject: strconv.Itoa(i)}}}
		if n, err := h.Output(i).PushN(ctx, rows); n != 2 || err != nil {
			t.Fatalf("PushN = %d, %v", n, err)
		}
	}
	h.Output(0).Close()
	h.Output(0).Close()
	h.Output(1).Close()
	if _, err := h.Output(0).PushN(ctx, []Row{{}}); !errors.Is(err, ringq.ErrClosed) {
		t.Fatalf("PushN after Close = %v, want ErrClosed", err)
	}
	if h.OutLen(0) != 6 || h.OutLen(1) != 0 {
		t.Fatalf("OutLen = %d, %d; want 6, 0", h.OutLen(0), h.OutLen(1))
	}
	dst := make([]Row, 4)
	if n := h.TryPopN(dst); n != 4 {
		t.Fatalf("TryPopN = %d, want 4", n)
	}
	if n, err := h.PopN(ctx, dst); n != 2 || err != nil {
		t.Fatalf("PopN = %d, %v; want 2, nil", n, err)
	}
	// Worker 2 is still open: PopN waits.
	short, cancelShort := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancelShort()
	if _, err := h.PopN(short, dst); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PopN with an output open = %v, want DeadlineExceeded", err)
	}
	h.Output(2).Close()
	if _, err := h.PopN(ctx, dst); !errors.Is(err, ringq.ErrClosed) {
		t.Fatalf("PopN after every Close = %v, want ErrClosed", err)
	}
}

// TestHandoffsRouteByKey: both hand-offs send an event to worker
// Key(ev) % N(), so per-subject order holds through either.
func TestHandoffsRouteByKey(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []string{HandoffRing, HandoffChannel} {
		t.Run(kind, func(t *testing.T) {
			h := NewHandoff(kind, 3, 64)
			for i := range 30 {
				ev := Event{Subject: "s" + strconv.Itoa(i)}
				if err := h.Push(ctx, ev); err != nil {
					t.Fatal(err)
				}
			}
			h.Close()
			total := 0
			for w := range h.N() {
				if h.InLen(w) == 0 {
					t.Errorf("worker %d got nothing of 30 subjects", w)
				}
				dst := make([]Event, 64)
				for {
					n, err := h.Input(w).PopN(ctx, dst)
					if errors.Is(err, ringq.ErrClosed) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					for _, ev := range dst[:n] {
						if want := int(Key(&ev) % 3); want != w {
							t.Fatalf("%s went to worker %d, want %d", ev.Subject, w, want)
						}
					}
					total += n
				}
			}
			if total != 30 {
				t.Fatalf("%d events popped, want 30", total)
			}
		})
	}
}

// TestNewHandoffKinds: each kind builds its own hand-off, with the rings'
// capacity rounding for the channels too.
func TestNewHandoffKinds(t *testing.T) {
	if _, ok := NewHandoff(HandoffRing, 2, 8).(*RingHandoff); !ok {
		t.Error("ring: not a *RingHandoff")
	}
	h, ok := NewHandoff(HandoffChannel, 2, 1000).(*ChanHandoff)
	if !ok {
		t.Fatal("channel: not a *ChanHandoff")
	}
	if cap(h.in[0]) != 1024 || cap(h.out) != 2048 {
		t.Fatalf("channel capacities %d and %d, want 1024 and 2048 (as ringq rounds)", cap(h.in[0]), cap(h.out))
	}
}

// TestRunHandoffChecks: RunHandoff refuses a hand-off for another number of
// workers, a RingHandoff whose rings do not pair up, and a second run.
func TestRunHandoffChecks(t *testing.T) {
	newP := func() *Pipeline {
		p, err := New(testConfig(2, PinNone), mustCompile(t, orderColumns...), &recordingDeadLetterer{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ctx := context.Background()
	if err := newP().RunHandoff(ctx, NewChanHandoff(3, 8)); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("3 channels for 2 workers: %v, want ErrInvalidConfig", err)
	}
	bad := &RingHandoff{In: ringq.NewDispatch[Event](2, 8, Key), Out: ringq.NewMerge[Row](3, 8)}
	if err := newP().RunHandoff(ctx, bad); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("2 input and 3 output rings: %v, want ErrInvalidConfig", err)
	}
	p := newP()
	h := NewChanHandoff(2, 8)
	h.Close() // nothing to do: the workers find their inputs closed and stop
	if err := p.RunHandoff(ctx, h); err != nil {
		t.Fatalf("first run: %v", err)
	}
	h = NewChanHandoff(2, 8)
	h.Close() // without the check, the second run would stop as cleanly as the first
	if err := p.RunHandoff(ctx, h); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("second run: %v, want ErrInvalidConfig", err)
	}
}

// parkedIn reports whether a goroutine waits in a select or a channel
// operation with fn on its stack.
func parkedIn(fn string) bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if (strings.Contains(g, "[select") || strings.Contains(g, "[chan send")) && strings.Contains(g, fn) {
			return true
		}
	}
	return false
}

package ringq

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestCapacityRoundsUp(t *testing.T) {
	for _, tc := range []struct{ in, want int }{{-3, 1}, {0, 1}, {1, 1}, {2, 2}, {3, 4}, {5, 8}, {8, 8}, {1000, 1024}} {
		if got := New[int](tc.in).Cap(); got != tc.want {
			t.Errorf("New(%d).Cap() = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestTryPushTryPop(t *testing.T) {
	r := New[int](4)
	if _, ok := r.TryPop(); ok {
		t.Fatal("TryPop on an empty ring succeeded")
	}
	for i := range 4 {
		if !r.TryPush(i) {
			t.Fatalf("TryPush(%d) failed with room left", i)
		}
	}
	if r.TryPush(99) {
		t.Fatal("TryPush on a full ring succeeded")
	}
	if r.Len() != 4 {
		t.Fatalf("Len = %d, want 4", r.Len())
	}
	for i := range 4 {
		v, ok := r.TryPop()
		if !ok || v != i {
			t.Fatalf("TryPop = %d, %v; want %d, true", v, ok, i)
		}
	}
	if r.Len() != 0 {
		t.Fatalf("Len = %d, want 0", r.Len())
	}
}

func TestBatchWrapsAroundTheBuffer(t *testing.T) {
	ctx := context.Background()
	r := New[int](8)
	next, want := 0, 0
	dst := make([]int, 5)
	for range 100 {
		vs := []int{next, next + 1, next + 2}
		if n := r.TryPushN(vs); n != 3 {
			t.Fatalf("TryPushN = %d, want 3", n)
		}
		next += 3
		n, err := r.PopN(ctx, dst)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range dst[:n] {
			if v != want {
				t.Fatalf("popped %d, want %d", v, want)
			}
			want++
		}
	}
	for want < next {
		n := r.TryPopN(dst)
		if n == 0 {
			t.Fatalf("ring empty at %d, want %d items", want, next)
		}
		for _, v := range dst[:n] {
			if v != want {
				t.Fatalf("popped %d, want %d", v, want)
			}
			want++
		}
	}
}

func TestTryPushNPartial(t *testing.T) {
	r := New[int](4)
	if n := r.TryPushN([]int{1, 2, 3, 4, 5, 6}); n != 4 {
		t.Fatalf("TryPushN into an empty ring of 4 = %d, want 4", n)
	}
	if n := r.TryPushN([]int{7}); n != 0 {
		t.Fatalf("TryPushN into a full ring = %d, want 0", n)
	}
	if n, err := r.PopN(context.Background(), nil); n != 0 || err != nil {
		t.Fatalf("PopN(nil) = %d, %v; want 0, nil", n, err)
	}
}

func TestPoppedSlotsAreZeroed(t *testing.T) {
	ctx := context.Background()
	r := New[*[64]byte](64) // single-item pops hand slots back 8 at a time
	for i := range 10 {
		if err := r.Push(ctx, new([64]byte)); err != nil {
			t.Fatalf("Push %d: %v", i, err)
		}
	}
	if _, err := r.Pop(ctx); err != nil {
		t.Fatal(err)
	}
	dst := make([]*[64]byte, 3)
	if n := r.TryPopN(dst); n != 3 {
		t.Fatalf("TryPopN = %d, want 3", n)
	}
	if _, ok := r.TryPop(); !ok {
		t.Fatal("TryPop failed")
	}
	if n, err := r.PopN(ctx, dst); n != 3 || err != nil {
		t.Fatalf("PopN = %d, %v; want 3, nil", n, err)
	}
	for range 2 { // kept by the consumer until it finds the ring empty
		if _, err := r.Pop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := r.TryPop(); ok {
		t.Fatal("TryPop on an empty ring succeeded")
	}
	for i, p := range r.buf {
		if p != nil {
			t.Errorf("slot %d still holds a popped item", i)
		}
	}
	if r.Len() != 0 {
		t.Errorf("Len = %d after every item was popped, want 0", r.Len())
	}
}

// TestKeptSlotsAreZeroedAcrossTheWrap pops single items from rings whose slots run past
// the end of the array: every hand-back must zero what it hands back, both parts of it.
func TestKeptSlotsAreZeroedAcrossTheWrap(t *testing.T) {
	ctx := context.Background()
	for _, checks := range []bool{true, false} {
		opts := []Option{withStartIndex(idxMask - 5), WithDebug(true)} // slot 58 of 64 first
		if !checks {
			opts = append(opts, withoutChecks())
		}
		r := New[*[8]byte](64, opts...)
		m := NewMerge[*[8]byte](2, 64, opts...)
		for range 40 {
			if err := r.Push(ctx, new([8]byte)); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				if err := m.Ring(i).Push(ctx, new([8]byte)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for range 40 { // five hand-backs of 8, the first across the array's end
			if _, err := r.Pop(ctx); err != nil {
				t.Fatal(err)
			}
		}
		one := make([]*[8]byte, 1)
		for range 2*40 - 3 { // a Merge's one-item pops keep slots too
			if _, err := m.PopN(ctx, one); err != nil {
				t.Fatal(err)
			}
		}
		if n := m.TryPopN(make([]*[8]byte, 8)); n != 3 {
			t.Fatalf("TryPopN = %d, want the last 3", n)
		}
		if n := m.TryPopN(one); n != 0 {
			t.Fatalf("TryPopN on empty rings = %d", n)
		}
		for name, r := range map[string]*Ring[*[8]byte]{"ring": r, "merge ring 0": m.Ring(0), "merge ring 1": m.Ring(1)} {
			for i, p := range r.buf {
				if p != nil {
					t.Errorf("checks %v: %s: slot %d still holds a popped item", checks, name, i)
				}
			}
			if r.Len() != 0 || r.head.Load() != r.phead {
				t.Errorf("checks %v: %s: Len = %d, head %d, consumer at %d", checks, name, r.Len(), r.head.Load(), r.phead)
			}
		}
	}
}

// TestSingleItemPopsHandBackSlots checks the bound on how long single-item pops keep
// their slots: a full ring of 64 has room again after 8 of them (Cap/8), popped with Pop
// or with a Merge's one-item PopN.
func TestSingleItemPopsHandBackSlots(t *testing.T) {
	for _, merge := range []bool{false, true} {
		opts := []Option{withStartIndex(idxMask - 20), withoutChecks()} // across the index wrap
		var r *Ring[int]
		pop := func(ctx context.Context) (int, error) { return r.Pop(ctx) }
		if merge {
			m := NewMerge[int](1, 64, opts...)
			r = m.Ring(0)
			one := make([]int, 1)
			pop = func(ctx context.Context) (int, error) {
				_, err := m.PopN(ctx, one)
				return one[0], err
			}
		} else {
			r = New[int](64, opts...)
		}
		testHandBack(t, r, pop)
	}
}

func testHandBack(t *testing.T, r *Ring[int], pop func(context.Context) (int, error)) {
	ctx := context.Background()
	next := 0
	for r.TryPush(next) {
		next++
	}
	want := 0
	for round := range 20 {
		for range 8 {
			v, err := pop(ctx)
			if err != nil || v != want {
				t.Fatalf("round %d: pop = %d, %v; want %d, nil", round, v, err, want)
			}
			want++
		}
		for i := range 8 {
			if !r.TryPush(next) {
				t.Fatalf("round %d: TryPush %d of 8 failed after 8 pops", round, i+1)
			}
			next++
		}
		if r.TryPush(next) {
			t.Fatalf("round %d: TryPush succeeded on a full ring", round)
		}
	}
}

func TestCloseDrainsThenErrClosed(t *testing.T) {
	ctx := context.Background()
	r := New[int](8)
	for i := range 3 {
		if err := r.Push(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	r.Close()
	r.Close() // idempotent
	if err := r.Push(ctx, 3); !errors.Is(err, ErrClosed) {
		t.Fatalf("Push after Close = %v, want ErrClosed", err)
	}
	if r.TryPush(3) {
		t.Fatal("TryPush after Close succeeded")
	}
	if n, err := r.PushN(ctx, []int{3, 4}); n != 0 || !errors.Is(err, ErrClosed) {
		t.Fatalf("PushN after Close = %d, %v; want 0, ErrClosed", n, err)
	}
	for i := range 3 {
		v, err := r.Pop(ctx)
		if err != nil || v != i {
			t.Fatalf("Pop = %d, %v; want %d, nil", v, err, i)
		}
	}
	if _, err := r.Pop(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Pop on a closed, drained ring = %v, want ErrClosed", err)
	}
	if _, err := r.PopN(ctx, make([]int, 4)); !errors.Is(err, ErrClosed) {
		t.Fatalf("PopN on a closed, drained ring = %v, want ErrClosed", err)
	}
}

// TestCloseWakesBlockedSides closes a ring from a third goroutine while its producer is
// blocked on a full ring and another ring's consumer is blocked on an empty one.
func TestCloseWakesBlockedSides(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	full, empty := New[int](2, WithSpin(0), WithYield(0)), New[int](2, WithSpin(0), WithYield(0))
	full.TryPush(1)
	full.TryPush(2)
	pushErr, popErr := make(chan error, 1), make(chan error, 1)
	go func() { pushErr <- full.Push(ctx, 3) }()
	go func() {
		_, err := empty.Pop(ctx)
		popErr <- err
	}()
	waitFor(t, "the producer parks", func() bool { return parked(full.writers) })
	waitFor(t, "the consumer parks", func() bool { return parked(empty.readers) })
	full.Close()
	empty.Close()
	if err := <-pushErr; !errors.Is(err, ErrClosed) {
		t.Errorf("blocked Push = %v, want ErrClosed", err)
	}
	if err := <-popErr; !errors.Is(err, ErrClosed) {
		t.Errorf("blocked Pop = %v, want ErrClosed", err)
	}
	// The items pushed before Close are still delivered.
	for want := 1; want <= 2; want++ {
		if v, err := full.Pop(ctx); v != want || err != nil {
			t.Fatalf("Pop after Close = %d, %v; want %d, nil", v, err, want)
		}
	}
}

func TestCancelWhileBlocked(t *testing.T) {
	r := New[int](1, WithSpin(0), WithYield(0))
	r.TryPush(1)

	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() { errs <- r.Push(ctx, 2) }()
	waitFor(t, "the producer parks", func() bool { return parked(r.writers) })
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("Push after cancel = %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		_, err := r.PushN(ctx, []int{2, 3})
		errs <- err
	}()
	waitFor(t, "the producer parks in PushN", func() bool { return parked(r.writers) })
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("PushN after cancel = %v, want context.Canceled", err)
	}

	if v, err := r.Pop(context.Background()); v != 1 || err != nil {
		t.Fatalf("Pop = %d, %v; want 1, nil", v, err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		_, err := r.Pop(ctx)
		errs <- err
	}()
	waitFor(t, "the consumer parks", func() bool { return parked(r.readers) })
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("Pop after cancel = %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := r.PopN(ctx, make([]int, 4)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PopN past its deadline = %v, want context.DeadlineExceeded", err)
	}
	if r.Len() != 0 {
		t.Fatalf("Len after cancelled pushes = %d, want 0", r.Len())
	}
}

// TestMisuseDetected checks that a second producer (or consumer) entering while the first
// is inside a call panics instead of corrupting the ring.
func TestMisuseDetected(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := New[int](1, WithDebug(true), WithSpin(0), WithYield(0))
	r.TryPush(1)
	done := make(chan error, 1)
	go func() { done <- r.Push(ctx, 2) }() // blocks inside the producer side
	waitFor(t, "the producer parks", func() bool { return parked(r.writers) })
	mustPanic(t, "second producer", func() { r.TryPush(3) })
	cancel()
	<-done

	r2 := New[int](1, WithDebug(true), WithSpin(0), WithYield(0))
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go func() {
		_, err := r2.Pop(ctx2)
		done <- err
	}()
	waitFor(t, "the consumer parks", func() bool { return parked(r2.readers) })
	mustPanic(t, "second consumer", func() { r2.TryPop() })
	cancel2()
	<-done

	// A second Dispatch producer while the first one's key function runs: the
	// item the first one hands its key lives in the Dispatch, so the second
	// would route it by its own key without touching the same ring.
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	d := NewDispatch(2, 4, func(v *int) uint64 {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		return uint64(*v)
	}, WithDebug(true))
	// The first Push's item, 1, belongs on ring 1; had the second Push run, it
	// would have zeroed the item the first one's key reads, and 1 would land on
	// ring 0.
	ctx3, cancel3 := context.WithCancel(context.Background())
	defer cancel3()
	go func() { done <- d.Push(ctx3, 1) }()
	<-entered
	mustPanic(t, "second Dispatch producer", func() { _ = d.Push(ctx3, 0) })
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the first Push: %v", err)
	}
	if v, ok := d.Ring(1).TryPop(); !ok || v != 1 {
		t.Fatalf("ring 1 holds %d, %v; want the first Push's 1", v, ok)
	}
	if v, ok := d.Ring(0).TryPop(); ok {
		t.Fatalf("ring 0 holds %d; want nothing", v)
	}
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", what)
		}
	}()
	f()
}

// TestClosedRingTakesBackItsCopies pushes into a closed ring that has room: every push
// path copies the item into its slot before the publishing compare-and-swap finds the
// ring closed, and must then zero the slot again, or the ring keeps the item alive after
// its consumer has drained it.
func TestClosedRingTakesBackItsCopies(t *testing.T) {
	ctx := context.Background()
	for _, checks := range []bool{true, false} {
		for _, push := range []struct {
			name string
			push func(r *Ring[*int]) error
		}{
			{"Push", func(r *Ring[*int]) error { return r.Push(ctx, new(int)) }},
			{"TryPush", func(r *Ring[*int]) error {
				if r.TryPush(new(int)) {
					return nil
				}
				return ErrClosed
			}},
			{"PushN of 1", func(r *Ring[*int]) error { _, err := r.PushN(ctx, []*int{new(int)}); return err }},
			{"PushN across the end", func(r *Ring[*int]) error {
				_, err := r.PushN(ctx, []*int{new(int), new(int), new(int), new(int)})
				return err
			}},
			{"TryPushN", func(r *Ring[*int]) error {
				if r.TryPushN([]*int{new(int), new(int)}) > 0 {
					return nil
				}
				return ErrClosed
			}},
		} {
			opts := []Option{withStartIndex(idxMask - 5), WithDebug(true)} // slot 2 of 8 first
			if !checks {
				opts = append(opts, withoutChecks())
			}
			r := New[*int](8, opts...)
			for range 3 {
				if err := r.Push(ctx, new(int)); err != nil {
					t.Fatal(err)
				}
			}
			r.Close()
			if err := push.push(r); !errors.Is(err, ErrClosed) {
				t.Fatalf("checks %v: %s on a closed ring: %v, want ErrClosed", checks, push.name, err)
			}
			for range 3 {
				if _, err := r.Pop(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := r.Pop(ctx); !errors.Is(err, ErrClosed) {
				t.Fatalf("Pop after the drain: %v, want ErrClosed", err)
			}
			for i, p := range r.buf {
				if p != nil {
					t.Errorf("checks %v: %s on a closed ring left its item in slot %d", checks, push.name, i)
				}
			}
		}
	}
}

// TestColdWaitsStopYieldingAfterAPark checks the rule of the package documentation
// ("Waiting"): cold waits yield until one of them gets as far as parking, and never again
// after that, however many of them then succeed without parking.
func TestColdWaitsStopYieldingAfterAPark(t *testing.T) {
	n := newNotifier()
	// ready answers true at once; it was called in the yield phase when no
	// sleeper was counted yet.
	yielded := func(cold bool) bool {
		var inYield bool
		err := n.await(context.Background(), 0, 2, cold, func() bool {
			inYield = n.sleepers.Load() == 0
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		return inYield
	}
	if !yielded(true) {
		t.Fatal("a cold wait before any park did not yield")
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := n.await(cancelled, 0, 2, true, func() bool { return false }); !errors.Is(err, context.Canceled) {
		t.Fatalf("await = %v, want context.Canceled", err)
	}
	for i := range 100 {
		if yielded(true) {
			t.Fatalf("cold wait %d after a park yielded", i+1)
		}
	}
	if !yielded(false) {
		t.Fatal("a warm wait after a park did not yield")
	}
}

package ringq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

const stressItems = 200_000 // per producer

// item identifies one pushed value: who pushed it and its sequence number for that producer
// (or key). The pointer makes zeroing of popped slots observable to the GC and the race
// detector.
type item struct {
	src uint32
	seq uint32
	p   *uint32
}

func stressCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// produce pushes n items for source src with a random mix of Push, TryPush and PushN.
func produce(ctx context.Context, r *Ring[item], src uint32, n int, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, uint64(src)))
	batch := make([]item, 0, 70)
	seq := uint32(0)
	for int(seq) < n {
		switch rng.IntN(3) {
		case 0:
			if err := r.Push(ctx, item{src: src, seq: seq, p: &seq}); err != nil {
				return fmt.Errorf("push %d: %w", seq, err)
			}
			seq++
		case 1:
			if r.TryPush(item{src: src, seq: seq}) {
				seq++
			}
		default:
			batch = batch[:0]
			for k := rng.IntN(cap(batch)) + 1; k > 0 && int(seq)+len(batch) < n; k-- {
				batch = append(batch, item{src: src, seq: seq + uint32(len(batch))})
			}
			got, err := r.PushN(ctx, batch)
			seq += uint32(got)
			if err != nil {
				return fmt.Errorf("pushN at %d: %w", seq, err)
			}
		}
	}
	return nil
}

// checker verifies exactly-once, in-order delivery per source.
type checker struct {
	next []uint32
	err  error
}

func newChecker(sources int) *checker { return &checker{next: make([]uint32, sources)} }

func (c *checker) see(v item) {
	if c.err != nil {
		return
	}
	if int(v.src) >= len(c.next) {
		c.err = fmt.Errorf("item from unknown source %d", v.src)
		return
	}
	if v.seq != c.next[v.src] {
		c.err = fmt.Errorf("source %d: got seq %d, want %d", v.src, v.seq, c.next[v.src])
		return
	}
	c.next[v.src]++
}

func (c *checker) complete(n int) error {
	if c.err != nil {
		return c.err
	}
	for src, got := range c.next {
		if int(got) != n {
			return fmt.Errorf("source %d: %d items delivered, want %d", src, got, n)
		}
	}
	return nil
}

// consume pops until ErrClosed with a random mix of Pop, TryPop and PopN.
func consume(ctx context.Context, r *Ring[item], c *checker, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 99))
	dst := make([]item, 70)
	for {
		switch rng.IntN(3) {
		case 0:
			v, err := r.Pop(ctx)
			if err != nil {
				return err
			}
			c.see(v)
		case 1:
			if v, ok := r.TryPop(); ok {
				c.see(v)
			}
		default:
			n, err := r.PopN(ctx, dst[:rng.IntN(len(dst))+1])
			if err != nil {
				return err
			}
			for _, v := range dst[:n] {
				c.see(v)
			}
		}
	}
}

// checkDrained fails the test unless every slot of r is zero and every slot was handed
// back: what a ring must look like once its consumer has seen ErrClosed.
func checkDrained[T comparable](t *testing.T, r *Ring[T]) {
	t.Helper()
	var zero T
	for i, v := range r.buf {
		if v != zero {
			t.Fatalf("slot %d still holds an item after the drain", i)
		}
	}
	if h := r.head.Load(); h != r.phead {
		t.Fatalf("head = %d, consumer at %d: slots not handed back after the drain", h, r.phead)
	}
}

func TestStressSPSC(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"park-only", []Option{WithSpin(0), WithYield(0)}},
		{"wraparound", []Option{withStartIndex(idxMask - stressItems/2)}},
		{"unchecked", []Option{withoutChecks(), withStartIndex(idxMask - stressItems/2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := stressCtx(t)
			r := New[item](64, tc.opts...)
			c := newChecker(1)
			seed := uint64(time.Now().UnixNano())
			var perr error
			var wg sync.WaitGroup
			wg.Go(func() {
				defer r.Close()
				perr = produce(ctx, r, 0, stressItems, seed)
			})
			cerr := consume(ctx, r, c, seed)
			wg.Wait()
			if perr != nil {
				t.Fatalf("producer (seed %d): %v", seed, perr)
			}
			if !errors.Is(cerr, ErrClosed) {
				t.Fatalf("consumer (seed %d): %v, want ErrClosed", seed, cerr)
			}
			if err := c.complete(stressItems); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			checkDrained(t, r)
			if (tc.name == "wraparound" || tc.name == "unchecked") && r.head.Load() > stressItems {
				t.Fatalf("head = %d: the indices did not wrap", r.head.Load())
			}
		})
	}
}

func TestStressMerge(t *testing.T) {
	for _, producers := range []int{2, 3} {
		t.Run(fmt.Sprint(producers), func(t *testing.T) {
			ctx := stressCtx(t)
			opts := []Option{withStartIndex(idxMask - 1000)}
			if producers == 3 {
				opts = append(opts, withoutChecks()) // the fast paths, under -race too
			}
			m := NewMerge[item](producers, 64, opts...)
			seed := uint64(time.Now().UnixNano())
			errs := make([]error, producers)
			var wg sync.WaitGroup
			for p := range producers {
				wg.Go(func() {
					r := m.Ring(p)
					defer r.Close()
					errs[p] = produce(ctx, r, uint32(p), stressItems, seed)
				})
			}
			c := newChecker(producers)
			rng := rand.New(rand.NewPCG(seed, 7))
			dst := make([]item, 64)
			var cerr error
			for cerr == nil {
				if rng.IntN(4) == 0 {
					for _, v := range dst[:m.TryPopN(dst[:rng.IntN(len(dst))+1])] {
						c.see(v)
					}
					continue
				}
				size := 1 // half the pops take one item: tryPop1 and its kept slots
				if rng.IntN(2) == 0 {
					size = rng.IntN(len(dst)) + 1
				}
				var n int
				n, cerr = m.PopN(ctx, dst[:size])
				for _, v := range dst[:n] {
					c.see(v)
				}
			}
			wg.Wait()
			for p, err := range errs {
				if err != nil {
					t.Fatalf("producer %d (seed %d): %v", p, seed, err)
				}
			}
			if !errors.Is(cerr, ErrClosed) {
				t.Fatalf("consumer (seed %d): %v, want ErrClosed", seed, cerr)
			}
			if err := c.complete(stressItems); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			if m.Len() != 0 {
				t.Fatalf("Len = %d after drain", m.Len())
			}
			for i := range m.N() {
				checkDrained(t, m.Ring(i))
			}
		})
	}
}

func TestStressDispatch(t *testing.T) {
	const keys = 16
	for _, workers := range []int{2, 3} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			ctx := stressCtx(t)
			opts := []Option{withStartIndex(idxMask - 5000)}
			if workers == 3 {
				opts = append(opts, withoutChecks()) // the fast paths, under -race too
			}
			d := NewDispatch(workers, 64, func(v *item) uint64 { return uint64(v.src) }, opts...)
			seed := uint64(time.Now().UnixNano())
			checkers := make([]*checker, workers)
			errs := make([]error, workers)
			var wg sync.WaitGroup
			for w := range workers {
				checkers[w] = newChecker(keys)
				wg.Go(func() { errs[w] = consume(ctx, d.Ring(w), checkers[w], seed+uint64(w)) })
			}
			// One producer; the key is the source, each key numbered on its own.
			rng := rand.New(rand.NewPCG(seed, 1))
			var seqs [keys]uint32
			var perr error
			for range stressItems * workers {
				k := rng.IntN(keys)
				if perr = d.Push(ctx, item{src: uint32(k), seq: seqs[k]}); perr != nil {
					break
				}
				seqs[k]++
			}
			d.Close()
			wg.Wait()
			if perr != nil {
				t.Fatalf("producer (seed %d): %v", seed, perr)
			}
			total := 0
			for w, c := range checkers {
				if !errors.Is(errs[w], ErrClosed) {
					t.Fatalf("worker %d (seed %d): %v, want ErrClosed", w, seed, errs[w])
				}
				if c.err != nil {
					t.Fatalf("worker %d (seed %d): %v", w, seed, c.err)
				}
				for k, n := range c.next {
					if n == 0 {
						continue
					}
					if k%workers != w {
						t.Fatalf("worker %d got key %d, which belongs to worker %d", w, k, k%workers)
					}
					if n != seqs[k] {
						t.Fatalf("key %d: %d items delivered, want %d", k, n, seqs[k])
					}
					total += int(n)
				}
			}
			if total != stressItems*workers {
				t.Fatalf("%d items delivered, want %d", total, stressItems*workers)
			}
		})
	}
}

// TestStressCloseRacesPushes closes the ring from a third goroutine at a random moment
// while the producer pushes: every push that reported success must be popped exactly
// once, and none that failed.
func TestStressCloseRacesPushes(t *testing.T) {
	ctx := stressCtx(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for round := range 300 {
		var opts []Option
		if round%2 == 1 {
			opts = append(opts, withoutChecks()) // the fast paths, under -race too
		}
		r := New[item](8, opts...)
		c := newChecker(1)
		var pushed int
		var wg sync.WaitGroup
		wg.Go(func() {
			batch := make([]item, 5)
			for seq := uint32(0); ; {
				if seq%2 == 0 {
					if r.Push(ctx, item{seq: seq}) != nil {
						break
					}
					seq++
				} else {
					for i := range batch {
						batch[i] = item{seq: seq + uint32(i)}
					}
					n, err := r.PushN(ctx, batch)
					seq += uint32(n)
					if err != nil {
						pushed = int(seq) // a prefix may have landed before Close
						break
					}
				}
				pushed = int(seq)
			}
		})
		closeAfter := rng.IntN(200)
		wg.Go(func() {
			for r.Len() < closeAfter%8 {
				if r.closed() {
					return
				}
			}
			r.Close()
		})
		var cerr error
		for got := 0; cerr == nil; got++ {
			var v item
			v, cerr = r.Pop(ctx)
			if cerr == nil {
				c.see(v)
			}
			if got == closeAfter {
				r.Close()
			}
		}
		wg.Wait()
		if !errors.Is(cerr, ErrClosed) {
			t.Fatalf("round %d: consumer: %v", round, cerr)
		}
		if err := c.complete(pushed); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// TestNoLostWakeup parks the consumer (no spinning, no yielding) before every single push,
// so each item must be delivered by the eventcount's wake-up.
func TestNoLostWakeup(t *testing.T) {
	const items = 2000
	opts := []Option{WithSpin(0), WithYield(0)}
	ctx := stressCtx(t)

	t.Run("ring", func(t *testing.T) {
		r := New[int](4, opts...)
		got := make(chan int, items)
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				v, err := r.Pop(ctx)
				if err != nil {
					return
				}
				got <- v
			}
		})
		defer wg.Wait()
		defer r.Close()
		for i := range items {
			waitFor(t, "the consumer parks", func() bool { return parked(r.readers) })
			if err := r.Push(ctx, i); err != nil {
				t.Fatal(err)
			}
			if v := recv(t, ctx, got); v != i {
				t.Fatalf("got %d, want %d", v, i)
			}
		}
	})

	t.Run("merge", func(t *testing.T) {
		m := NewMerge[int](3, 4, opts...)
		got := make(chan int, items)
		var wg sync.WaitGroup
		wg.Go(func() {
			dst := make([]int, 8)
			for {
				n, err := m.PopN(ctx, dst)
				if err != nil {
					return
				}
				for _, v := range dst[:n] {
					got <- v
				}
			}
		})
		defer wg.Wait()
		defer m.Close()
		for i := range items {
			waitFor(t, "the consumer parks", func() bool { return parked(m.note) })
			if err := m.Ring(i%3).Push(ctx, i); err != nil {
				t.Fatal(err)
			}
			if v := recv(t, ctx, got); v != i {
				t.Fatalf("got %d, want %d", v, i)
			}
		}
	})

	t.Run("dispatch", func(t *testing.T) {
		d := NewDispatch(2, 4, func(v *int) uint64 { return uint64(*v) }, opts...)
		got := make(chan int, items)
		var wg sync.WaitGroup
		for w := range d.N() {
			wg.Go(func() {
				for {
					v, err := d.Ring(w).Pop(ctx)
					if err != nil {
						return
					}
					got <- v
				}
			})
		}
		defer wg.Wait()
		defer d.Close()
		for i := range items {
			w := d.Ring(i % 2)
			waitFor(t, "the worker parks", func() bool { return parked(w.readers) })
			if err := d.Push(ctx, i); err != nil {
				t.Fatal(err)
			}
			if v := recv(t, ctx, got); v != i {
				t.Fatalf("got %d, want %d", v, i)
			}
		}
	})

	// Producer parks on a full ring; the consumer frees one slot at a time.
	t.Run("full", func(t *testing.T) {
		drainParked(t, New[int](1, opts...), items, 1)
	})

	// Producer parks on a full ring of 64; the consumer pops single items, which hand
	// their slots back 8 at a time: each eighth pop must wake the producer.
	t.Run("full-lazy", func(t *testing.T) {
		drainParked(t, New[int](64, append(opts, withoutChecks())...), items, 8)
	})
}

// recv returns the next item from got, failing the test if none comes before ctx ends
// (a lost wake-up leaves the consumer parked).
func recv(t *testing.T, ctx context.Context, got <-chan int) int {
	t.Helper()
	select {
	case v := <-got:
		return v
	case <-ctx.Done():
		t.Fatal("no item came: a wake-up was lost")
		return 0
	}
}

// drainParked pushes 0..items-1 into r from a goroutine, and pops them in order, waiting
// before every every-th pop until the producer has parked on the full ring.
func drainParked(t *testing.T, r *Ring[int], items, every int) {
	ctx := stressCtx(t)
	var wg sync.WaitGroup
	var perr error
	wg.Go(func() {
		defer r.Close()
		for i := range items {
			if perr = r.Push(ctx, i); perr != nil {
				return
			}
		}
	})
	for i := range items {
		if i%every == 0 && i+r.Cap() < items {
			// Full again and parked: the producer woke for the slots the last
			// pops handed back (a sleeper count alone may still be the last park's).
			waitFor(t, "the producer refills the ring and parks", func() bool {
				return r.Len() == r.Cap() && parked(r.writers) || r.closed()
			})
		}
		v, err := r.Pop(ctx)
		if err != nil || v != i {
			r.Close() // the producer may be parked on the full ring
			wg.Wait()
			t.Fatalf("Pop = %d, %v; want %d, nil", v, err, i)
		}
	}
	wg.Wait()
	if perr != nil {
		t.Fatal(perr)
	}
}

// TestTrickleRandomTiming pushes items one at a time with random pauses while the consumer uses
// the default waiting policy, so wake-ups race with falling asleep at every stage.
func TestTrickleRandomTiming(t *testing.T) {
	ctx := stressCtx(t)
	m := NewMerge[item](2, 4, WithSpin(3), WithYield(1))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for p := range 2 {
		wg.Go(func() {
			r := m.Ring(p)
			defer r.Close()
			rng := rand.New(rand.NewPCG(uint64(p), 5))
			for seq := range uint32(5000) {
				for range rng.IntN(2000) { // a short, random pause without sleeping
				}
				if err := r.Push(ctx, item{src: uint32(p), seq: seq}); err != nil {
					errs[p] = err
					return
				}
			}
		})
	}
	c := newChecker(2)
	dst := make([]item, 3)
	var err error
	for err == nil {
		var n int
		n, err = m.PopN(ctx, dst)
		for _, v := range dst[:n] {
			c.see(v)
		}
	}
	wg.Wait()
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("consumer: %v", err)
	}
	for _, e := range errs {
		if e != nil {
			t.Fatal(e)
		}
	}
	if err := c.complete(5000); err != nil {
		t.Fatal(err)
	}
}

func TestMergeFairness(t *testing.T) {
	m := NewMerge[int](3, 64)
	for p := range 3 {
		for i := range 64 {
			m.Ring(p).TryPush(p*100 + i)
		}
	}
	seen := [3]int{}
	dst := make([]int, 16)
	for range 3 {
		n := m.TryPopN(dst)
		for _, v := range dst[:n] {
			seen[v/100]++
		}
	}
	for p, n := range seen {
		if n == 0 {
			t.Errorf("ring %d starved: %v", p, seen)
		}
	}
	if got := m.Len(); got != 3*64-48 {
		t.Errorf("Len = %d, want %d", got, 3*64-48)
	}
}

// An empty ring passes its turn on: with rings 0 and 1 full and ring 2
// empty, one-item and batch pops share evenly between 0 and 1 (a turn that
// only moved on by one ring per call gave ring 0 two thirds).
func TestMergeEmptyRingPassesItsTurnOn(t *testing.T) {
	for _, c := range []struct {
		name  string
		batch int
		block bool // PopN (its one-item path, without the misuse checks) or TryPopN
	}{{"TryPopN 1", 1, false}, {"TryPopN 4", 4, false}, {"PopN 1", 1, true}} {
		m := NewMerge[int](3, 256, withoutChecks())
		for p := range 2 {
			for i := range 256 {
				m.Ring(p).TryPush(p*1000 + i)
			}
		}
		seen := [3]int{}
		dst := make([]int, c.batch)
		for range 90 {
			n := 0
			if c.block {
				n, _ = m.PopN(context.Background(), dst)
			} else {
				n = m.TryPopN(dst)
			}
			for _, v := range dst[:n] {
				seen[v/1000]++
			}
		}
		if seen[0] != seen[1] || seen[0]+seen[1] != 90*c.batch {
			t.Errorf("%s: popped %v from rings 0, 1, 2; want the same from 0 and 1", c.name, seen)
		}
	}
}

// A Merge's one-item pops hand back the slots they read of a ring they find
// empty while other rings still have items: before, ring 0 kept its 3 read
// items referenced, and counted in Len, for as long as ring 1 gave.
func TestMergeOneItemPopsFlushAnEmptyRing(t *testing.T) {
	m := NewMerge[*int](2, 64, withoutChecks())
	for range 3 {
		m.Ring(0).TryPush(new(int))
	}
	for range 40 {
		m.Ring(1).TryPush(new(int))
	}
	one := make([]*int, 1)
	for range 10 {
		if n, err := m.PopN(context.Background(), one); n != 1 || err != nil {
			t.Fatalf("PopN = %d, %v", n, err)
		}
	}
	r := m.Ring(0)
	if got := r.Len(); got != 0 {
		t.Errorf("ring 0, empty for 4 pops, Len = %d, want 0", got)
	}
	for i, p := range r.buf {
		if p != nil {
			t.Errorf("ring 0 still references slot %d", i)
		}
	}
}

func TestMergeCloseAndCancel(t *testing.T) {
	m := NewMerge[int](2, 4, WithSpin(0), WithYield(0))
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() {
		_, err := m.PopN(ctx, make([]int, 4))
		errs <- err
	}()
	waitFor(t, "the consumer parks", func() bool { return parked(m.note) })
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("PopN after cancel = %v, want context.Canceled", err)
	}

	m.Ring(1).TryPush(7)
	m.Ring(0).Close() // one ring closed: PopN must still block, not spin
	go func() {
		dst := make([]int, 4)
		var err error
		for err == nil {
			_, err = m.PopN(context.Background(), dst)
		}
		errs <- err
	}()
	waitFor(t, "the consumer parks with one ring closed", func() bool { return parked(m.note) && m.Len() == 0 })
	stillParked(t, m.note)
	m.Ring(1).Close()
	if err := <-errs; !errors.Is(err, ErrClosed) {
		t.Fatalf("PopN with every ring closed = %v, want ErrClosed", err)
	}
}

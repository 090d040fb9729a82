package ringq

import (
	"context"
	"sync/atomic"
)

// Merge fans n producers into one consumer. Producer i is the single producer of Ring(i)
// and closes it after its last push; the one consumer calls PopN, TryPopN or Len. All the
// rings signal one shared notifier, so a consumer blocked in PopN wakes on a push into any
// ring without polling.
type Merge[T any] struct {
	rings   []*Ring[T]
	note    *notifier // shared by every ring as its readers notifier
	yield   int
	debug   bool
	next    int // round-robin start of the next pop: past the ring that gave last; consumer-owned
	popping atomic.Uint32
}

// NewMerge returns a Merge of n rings of the given capacity (see New); n below 1 counts
// as 1.
func NewMerge[T any](n, capacity int, opts ...Option) *Merge[T] {
	n = max(n, 1)
	cfg := buildConfig(opts)
	m := &Merge[T]{
		rings: make([]*Ring[T], n),
		note:  newNotifier(),
		yield: cfg.yield,
		debug: cfg.debug,
	}
	for i := range m.rings {
		m.rings[i] = newRing[T](capacity, cfg, m.note)
	}
	return m
}

// Ring returns ring i, 0 <= i < N(). Producer i pushes to it and finally closes it. Do not
// pop from it directly while the Merge's consumer runs.
func (m *Merge[T]) Ring(i int) *Ring[T] { return m.rings[i] }

// N returns the number of rings.
func (m *Merge[T]) N() int { return len(m.rings) }

// Len returns the number of items in all rings. Safe from any goroutine (a snapshot). Like
// Ring.Len it may count items that one-item PopN calls have taken but not yet handed back
// (see Ring.Pop).
func (m *Merge[T]) Len() int {
	n := 0
	for _, r := range m.rings {
		n += r.Len()
	}
	return n
}

// TryPopN moves up to len(dst) items into dst without blocking and returns how many; 0
// when nothing is ready. Each call starts at the ring after the last one that gave an
// item (to the last call that got one), so a busy ring cannot starve the others and an empty ring passes
// its turn on instead of doubling the next one's share. Items from one ring keep their
// order; items from different rings interleave. Consumer only.
func (m *Merge[T]) TryPopN(dst []T) int {
	if m.debug {
		m.enterConsumer()
		defer m.popping.Store(0)
	}
	n, _ := m.tryPopN(dst)
	return n
}

// PopN moves at least one and at most len(dst) items into dst, blocking until some ring
// has one, and returns how many. It returns ctx.Err() if ctx ends first, and ErrClosed
// once every ring is closed and drained. With an empty dst it returns 0, nil at once.
// Each call starts at the ring after the last one that gave an item, like TryPopN.
// Consumer only.
func (m *Merge[T]) PopN(ctx context.Context, dst []T) (int, error) {
	if m.debug {
		return m.popNDebug(ctx, dst)
	}
	return m.popN(ctx, dst)
}

func (m *Merge[T]) popNDebug(ctx context.Context, dst []T) (int, error) {
	m.enterConsumer()
	defer m.popping.Store(0)
	return m.popN(ctx, dst)
}

func (m *Merge[T]) popN(ctx context.Context, dst []T) (int, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	for {
		if len(dst) == 1 && !m.debug && m.tryPop1(&dst[0]) {
			return 1, nil
		}
		n, done := m.tryPopN(dst)
		if n > 0 {
			return n, nil
		}
		if done {
			return 0, ErrClosed
		}
		// No spinning: ready reads every ring's tail, the lines the producers are
		// writing, and probing them slowed a 2->1 fan-in of 40-byte items by 1.8x
		// (ringq/BENCHMARKS.md, session 13).
		if err := m.note.await(ctx, 0, m.yield, true, m.ready); err != nil {
			return 0, err
		}
	}
}

// tryPopN fills dst round-robin. done reports that every ring is closed and drained; it
// is only meaningful when n == 0.
func (m *Merge[T]) tryPopN(dst []T) (n int, done bool) {
	k := len(m.rings)
	i := m.next
	closed := 0
	for range k {
		if n == len(dst) {
			break
		}
		r := m.rings[i]
		if i++; i == k {
			i = 0
		}
		if m.debug {
			r.enterConsumer()
		}
		got, err := r.popSome(dst[n:])
		if m.debug {
			r.popping.Store(0)
		}
		if got > 0 {
			m.next = i // the next call starts past the ring that gave last
		}
		n += got
		if err != nil {
			closed++
		}
	}
	return n, closed == k
}

// tryPop1 is tryPopN for a single item without popSome's batch arithmetic: it moves the
// oldest item of the first ring that has one, in the same round-robin order, into *dst. It
// reports false when every ring looked empty; tryPopN then tells empty from closed. With
// the misuse checks on, popN goes through tryPopN only, which makes them.
func (m *Merge[T]) tryPop1(dst *T) bool {
	k := len(m.rings)
	i := m.next
	for range k {
		r := m.rings[i]
		if i++; i == k {
			i = 0
		}
		if h := r.phead; h != r.cachedTail || r.refreshTail(h) {
			*dst = r.buf[h&r.mask]
			r.take(h)
			m.next = i
			return true
		}
		r.flush() // found empty: its read slots go back now (doc.go), not at its next item
	}
	return false
}

// ready is the consumer's wake-up condition: an item in some ring, or every ring closed.
func (m *Merge[T]) ready() bool {
	closed := 0
	for _, r := range m.rings {
		t := r.tail.Load()
		if t&idxMask != r.phead {
			return true
		}
		if t&closedBit != 0 {
			closed++
		}
	}
	return closed == len(m.rings)
}

// Close closes every ring, for a consumer or supervisor that must stop the producers: their
// pending and later pushes fail with ErrClosed, and PopN drains what was pushed before.
// Normally each producer closes its own ring instead. Idempotent.
func (m *Merge[T]) Close() {
	for _, r := range m.rings {
		r.Close()
	}
}

func (m *Merge[T]) enterConsumer() {
	if !m.popping.CompareAndSwap(0, 1) {
		panic("ringq: concurrent consumers on a Merge")
	}
}

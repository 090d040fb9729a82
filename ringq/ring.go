package ringq

import (
	"context"
	"errors"
	"math/bits"
	"sync/atomic"
)

// ErrClosed is returned by Push and PushN once the ring is closed, and by Pop and PopN
// once the ring is closed and every item pushed before Close has been popped.
var ErrClosed = errors.New("ringq: ring closed")

const (
	// closedBit is the top bit of the tail word. Close sets it with a compare-and-swap, and
	// the producer publishes with a compare-and-swap against its own copy of the tail, so
	// a push either lands before Close (and will be popped) or fails with ErrClosed.
	closedBit = uint64(1) << 63
	// idxMask selects the 63-bit index part of head and tail. Indices count modulo 2^63.
	idxMask = closedBit - 1
	// maxCapacity bounds New's capacity argument.
	maxCapacity = 1 << 40
	// maxLazy bounds how many slots single-item pops keep before handing them back.
	maxLazy = 32
)

// Ring is a bounded single-producer, single-consumer FIFO queue.
//
// One goroutine at a time may act as the producer (TryPush, Push, TryPushN, PushN) and one
// goroutine at a time as the consumer (TryPop, Pop, TryPopN, PopN). Close, Len and Cap are
// safe from any goroutine. See the package documentation for the algorithm.
type Ring[T any] struct {
	_ pad

	// Read-only after construction.
	buf     []T
	mask    uint64 // len(buf)-1
	lazy    uint64 // single-item pops hand slots back this many at a time (see take)
	spin    int
	yield   int
	debug   bool
	readers *notifier // the consumer parks here; shared by the rings of a Merge
	writers *notifier // the producer parks here

	_ pad

	// Producer's cache line.
	tail       atomic.Uint64 // index of the next slot to fill, | closedBit once closed
	ptail      uint64        // producer's own copy of tail's index (it alone advances it)
	cachedHead uint64        // producer's last view of head
	pushing    atomic.Uint32 // debug: a producer call is running

	_ pad

	// Consumer's cache line.
	head       atomic.Uint64 // index of the first slot not yet handed back to the producer
	phead      uint64        // index of the next slot to read (phead >= head)
	pubHead    uint64        // consumer's copy of head; slots [pubHead, phead) are read, kept
	cachedTail uint64        // consumer's last view of tail's index
	popping    atomic.Uint32 // debug: a consumer call is running

	_ pad
}

// New returns an empty ring holding at least capacity items: capacity is rounded up to a
// power of two, and values below 1 count as 1. New panics if capacity exceeds 1<<40, like
// make does for an impossible size; that is a programming error, not input to validate.
func New[T any](capacity int, opts ...Option) *Ring[T] {
	cfg := buildConfig(opts)
	return newRing[T](capacity, cfg, newNotifier())
}

func newRing[T any](capacity int, cfg config, readers *notifier) *Ring[T] {
	if int64(capacity) > maxCapacity {
		panic("ringq: capacity exceeds 1<<40")
	}
	size := uint64(1)
	if capacity > 1 {
		size = 1 << bits.Len64(uint64(capacity-1))
	}
	r := &Ring[T]{
		buf:     make([]T, size),
		mask:    size - 1,
		lazy:    max(1, min(size/8, maxLazy)),
		spin:    cfg.spin,
		yield:   cfg.yield,
		debug:   cfg.debug,
		readers: readers,
		writers: newNotifier(),
	}
	if cfg.hasStart {
		r.tail.Store(cfg.start)
		r.head.Store(cfg.start)
		r.ptail, r.cachedHead = cfg.start, cfg.start
		r.phead, r.pubHead, r.cachedTail = cfg.start, cfg.start, cfg.start
	}
	return r
}

// Cap returns the ring's capacity (a power of two). Safe from any goroutine.
func (r *Ring[T]) Cap() int { return len(r.buf) }

// Len returns the number of items in the ring. Safe from any goroutine; from a goroutine
// other than the producer or consumer the value is a snapshot that may already be stale.
// While the consumer pops single items it may count items it has already popped, fewer
// than max(1, Cap/8) and at most 31, until it hands their slots back (see Pop).
func (r *Ring[T]) Len() int {
	h := r.head.Load() // head first: tail never moves backwards, so t-h cannot underflow
	t := r.tail.Load() & idxMask
	return int(min((t-h)&idxMask, uint64(len(r.buf))))
}

// Close closes the ring. Pushes that have not completed fail with ErrClosed; the consumer
// still pops every item that was pushed before, then gets ErrClosed. Close wakes every
// blocked Push and Pop. It is idempotent and safe from any goroutine, but the usual owner is
// the producer, after its last push.
func (r *Ring[T]) Close() {
	for {
		t := r.tail.Load()
		if t&closedBit != 0 {
			return
		}
		if r.tail.CompareAndSwap(t, t|closedBit) {
			break
		}
	}
	r.readers.signal()
	r.writers.signal()
}

// closed reports whether Close has been called.
func (r *Ring[T]) closed() bool { return r.tail.Load()&closedBit != 0 }

// ---- producer side ----

// TryPush adds v if there is room and reports whether it did. It returns false when the
// ring is full or closed. Producer only.
func (r *Ring[T]) TryPush(v T) bool {
	if r.debug {
		return r.tryPushDebug(v)
	}
	ok, _ := r.push1(v)
	return ok
}

func (r *Ring[T]) tryPushDebug(v T) bool {
	r.enterProducer()
	defer r.pushing.Store(0)
	ok, _ := r.push1(v)
	return ok
}

// Push adds v, blocking while the ring is full. It returns ctx.Err() if ctx ends first and
// ErrClosed if the ring is or becomes closed; in both cases v was not added. Producer only.
func (r *Ring[T]) Push(ctx context.Context, v T) error {
	// The fast path is push1 written out: one call and one copy of v fewer per item.
	t := r.ptail
	if r.debug || (t-r.cachedHead)&idxMask >= uint64(len(r.buf)) && !r.refreshHead(t) {
		return r.pushSlow(ctx, v)
	}
	i := t & r.mask
	r.buf[i] = v
	if !r.tail.CompareAndSwap(t, (t+1)&idxMask) { // fails only if Close set closedBit
		var zero T
		r.buf[i] = zero
		return ErrClosed
	}
	r.ptail = (t + 1) & idxMask
	r.readers.signal()
	return nil
}

// refreshHead reloads the producer's view of head and reports whether slot t is free.
func (r *Ring[T]) refreshHead(t uint64) bool {
	r.cachedHead = r.head.Load()
	return (t-r.cachedHead)&idxMask < uint64(len(r.buf))
}

// pushSlow is Push when the ring is full, or with the misuse checks on.
func (r *Ring[T]) pushSlow(ctx context.Context, v T) error {
	if r.debug {
		r.enterProducer()
		defer r.pushing.Store(0)
	}
	for {
		ok, err := r.push1(v)
		if ok || err != nil {
			return err
		}
		if err := r.writers.await(ctx, r.spin, r.yield, false, r.writable); err != nil {
			return err
		}
	}
}

// TryPushN adds as many leading items of vs as fit without blocking and returns how many.
// It publishes them with one atomic operation. It returns 0 when the ring is full or
// closed. Producer only.
func (r *Ring[T]) TryPushN(vs []T) int {
	if r.debug {
		r.enterProducer()
		defer r.pushing.Store(0)
	}
	n, _ := r.pushSome(vs)
	return n
}

// PushN adds all of vs in order, blocking while the ring is full, and publishes each run
// of items that fits with one atomic operation. It returns len(vs) and nil, or the number
// of leading items added before ctx ended (ctx.Err()) or the ring was closed (ErrClosed).
// With an empty vs it returns 0, nil at once, closed or not. Producer only.
func (r *Ring[T]) PushN(ctx context.Context, vs []T) (int, error) {
	if r.debug {
		r.enterProducer()
		defer r.pushing.Store(0)
	}
	done := 0
	for done < len(vs) {
		n, err := r.pushSome(vs[done:])
		done += n
		if err != nil {
			return done, err
		}
		if n == 0 {
			if err := r.writers.await(ctx, r.spin, r.yield, true, r.writable); err != nil {
				return done, err
			}
		}
	}
	return done, nil
}

// push1 adds v if there is room. It returns (false, nil) when full, (false, ErrClosed)
// when closed.
func (r *Ring[T]) push1(v T) (bool, error) {
	t := r.ptail
	if (t-r.cachedHead)&idxMask >= uint64(len(r.buf)) && !r.refreshHead(t) {
		if r.closed() {
			return false, ErrClosed
		}
		return false, nil
	}
	i := t & r.mask
	r.buf[i] = v
	next := (t + 1) & idxMask
	if !r.tail.CompareAndSwap(t, next) { // fails only if Close set closedBit
		var zero T
		r.buf[i] = zero
		return false, ErrClosed
	}
	r.ptail = next
	r.readers.signal()
	return true, nil
}

// pushSome copies as many leading items of vs as fit and publishes them at once.
func (r *Ring[T]) pushSome(vs []T) (int, error) {
	if len(vs) == 0 {
		return 0, nil
	}
	t := r.ptail
	size := uint64(len(r.buf))
	free := size - (t-r.cachedHead)&idxMask
	if free < uint64(len(vs)) {
		r.cachedHead = r.head.Load()
		free = size - (t-r.cachedHead)&idxMask
		if free == 0 {
			if r.closed() {
				return 0, ErrClosed
			}
			return 0, nil
		}
	}
	n := int(min(free, uint64(len(vs))))
	i := t & r.mask
	first := r.buf[i:]
	c := 1
	if n == 1 { // skip the bulk copy machinery for one item
		first[0] = vs[0]
	} else {
		c = copy(first, vs[:n])
		copy(r.buf, vs[c:n])
	}
	next := (t + uint64(n)) & idxMask
	if !r.tail.CompareAndSwap(t, next) { // closed meanwhile: take the copies back
		clear(first[:c])
		clear(r.buf[:n-c])
		return 0, ErrClosed
	}
	r.ptail = next
	r.readers.signal()
	return n, nil
}

// writable is the producer's wake-up condition: room in the ring, or closed.
func (r *Ring[T]) writable() bool {
	if (r.ptail-r.head.Load())&idxMask < uint64(len(r.buf)) {
		return true
	}
	return r.closed()
}

func (r *Ring[T]) enterProducer() {
	if !r.pushing.CompareAndSwap(0, 1) {
		panic("ringq: concurrent producers on a single-producer Ring")
	}
}

// ---- consumer side ----

// TryPop removes and returns the oldest item if there is one. It returns the zero value
// and false when the ring is empty (closed or not). Consumer only.
func (r *Ring[T]) TryPop() (T, bool) {
	// The same fast path as Pop's.
	h := r.phead
	if r.debug || h == r.cachedTail && !r.refreshTail(h) {
		return r.tryPopSlow()
	}
	v := r.buf[h&r.mask]
	r.take(h)
	return v, true
}

// tryPopSlow is TryPop when the ring is empty, or with the misuse checks on.
func (r *Ring[T]) tryPopSlow() (T, bool) {
	if r.debug {
		r.enterConsumer()
		defer r.popping.Store(0)
	}
	v, ok, _ := r.pop1()
	return v, ok
}

// Pop removes and returns the oldest item, blocking while the ring is empty. It returns
// ctx.Err() if ctx ends first, and ErrClosed once the ring is closed and drained.
// Consumer only.
//
// Pop and TryPop hand the emptied slots back to the producer max(1, Cap/8) at a time (at
// most 32), and all at once when they find the ring empty or when PopN or TryPopN pops
// items: until then the producer cannot refill them, and the ring still references their
// items.
func (r *Ring[T]) Pop(ctx context.Context) (T, error) {
	// The fast path is pop1 written out. A T larger than four words goes through memory,
	// and each call that returns one costs copies (and store-forwarding stalls), so the
	// common case calls nothing that returns a T: not even when the cached tail says
	// empty but the real one does not, which is every item when the consumer keeps up.
	h := r.phead
	if r.debug || h == r.cachedTail && !r.refreshTail(h) {
		return r.popSlow(ctx)
	}
	v := r.buf[h&r.mask]
	r.take(h)
	return v, nil
}

// refreshTail reloads the consumer's view of tail and reports whether slot h is filled.
func (r *Ring[T]) refreshTail(h uint64) bool {
	r.cachedTail = r.tail.Load() & idxMask
	return r.cachedTail != h
}

// take marks slot h, just read by a single-item pop, as popped. The slots go back to the
// producer r.lazy at a time, and whenever the consumer finds the ring empty or pops a
// batch: one atomic store, one look for a parked producer and one clearing pass per
// r.lazy items instead of per item, and no clearing of a slot next to the one the
// producer is filling (which would pull that cache line back and forth).
func (r *Ring[T]) take(h uint64) {
	h = (h + 1) & idxMask
	r.phead = h
	if (h-r.pubHead)&idxMask >= r.lazy {
		r.release(h)
	}
}

// release zeroes the popped slots [pubHead, h), so that the ring does not keep what their
// items point to alive, and hands them back to the producer by publishing head = h.
func (r *Ring[T]) release(h uint64) {
	p := r.pubHead
	if n := (h - p) & idxMask; n > 0 {
		first := r.buf[p&r.mask:]
		if uint64(len(first)) >= n {
			clear(first[:n])
		} else {
			clear(first)
			clear(r.buf[:n-uint64(len(first))])
		}
	}
	r.head.Store(h)
	r.pubHead = h
	r.writers.signal()
}

// flush hands back the slots single-item pops have kept. The consumer calls it whenever
// it finds the ring empty, so it never waits, or reports empty or closed, while it keeps
// slots; and a producer waiting on a full ring is waiting for items still to be popped.
func (r *Ring[T]) flush() {
	if r.phead != r.pubHead {
		r.release(r.phead)
	}
}

// popSlow is Pop when the ring is empty, or with the misuse checks on.
func (r *Ring[T]) popSlow(ctx context.Context) (T, error) {
	if r.debug {
		r.enterConsumer()
		defer r.popping.Store(0)
	}
	for {
		v, ok, err := r.pop1()
		if ok || err != nil {
			return v, err
		}
		if err := r.readers.await(ctx, r.spin, r.yield, true, r.readable); err != nil {
			return v, err
		}
	}
}

// TryPopN moves up to len(dst) of the oldest items into dst without blocking and returns
// how many; 0 when the ring is empty. Consumer only.
func (r *Ring[T]) TryPopN(dst []T) int {
	if r.debug {
		r.enterConsumer()
		defer r.popping.Store(0)
	}
	n, _ := r.popSome(dst)
	return n
}

// PopN moves at least one and at most len(dst) of the oldest items into dst, blocking
// while the ring is empty, and returns how many. The slots it empties are released with
// one atomic operation. It returns ctx.Err() if ctx ends first, and ErrClosed once the
// ring is closed and drained. With an empty dst it returns 0, nil at once. Consumer only.
func (r *Ring[T]) PopN(ctx context.Context, dst []T) (int, error) {
	if r.debug {
		r.enterConsumer()
		defer r.popping.Store(0)
	}
	if len(dst) == 0 {
		return 0, nil
	}
	for {
		n, err := r.popSome(dst)
		if n > 0 || err != nil {
			return n, err
		}
		if err := r.readers.await(ctx, r.spin, r.yield, true, r.readable); err != nil {
			return 0, err
		}
	}
}

// pop1 removes the oldest item. It returns ErrClosed when the ring is closed and empty.
func (r *Ring[T]) pop1() (v T, ok bool, err error) {
	h := r.phead
	if h == r.cachedTail {
		t := r.tail.Load()
		r.cachedTail = t & idxMask
		if h == r.cachedTail {
			r.flush()
			if t&closedBit != 0 {
				return v, false, ErrClosed
			}
			return v, false, nil
		}
	}
	v = r.buf[h&r.mask]
	r.take(h)
	return v, true, nil
}

// popSome moves up to len(dst) items into dst and releases their slots at once. It
// returns ErrClosed when the ring is closed and empty.
func (r *Ring[T]) popSome(dst []T) (int, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	h := r.phead
	avail := (r.cachedTail - h) & idxMask
	if avail < uint64(len(dst)) {
		t := r.tail.Load()
		r.cachedTail = t & idxMask
		avail = (r.cachedTail - h) & idxMask
		if avail == 0 {
			r.flush()
			if t&closedBit != 0 {
				return 0, ErrClosed
			}
			return 0, nil
		}
	}
	n := int(min(avail, uint64(len(dst))))
	i := h & r.mask
	if n == 1 { // skip the bulk copy machinery for one item
		dst[0] = r.buf[i]
	} else {
		c := copy(dst[:n], r.buf[i:])
		if c < n {
			copy(dst[c:n], r.buf)
		}
	}
	h = (h + uint64(n)) & idxMask
	r.phead = h
	r.release(h) // and the slots single-item pops kept, if any
	return n, nil
}

// readable is the consumer's wake-up condition: an item in the ring, or closed.
func (r *Ring[T]) readable() bool {
	t := r.tail.Load()
	return t&idxMask != r.phead || t&closedBit != 0
}

func (r *Ring[T]) enterConsumer() {
	if !r.popping.CompareAndSwap(0, 1) {
		panic("ringq: concurrent consumers on a single-consumer Ring")
	}
}

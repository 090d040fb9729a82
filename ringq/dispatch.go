package ringq

import (
	"context"
	"sync/atomic"
)

// Dispatch fans one producer out to n single-producer, single-consumer rings. Each item
// goes to ring key(&item) % n, so items with the same key stay in order.
//
// The producer goroutine calls Push and finally Close; worker i is the single consumer of
// Ring(i). N and Ring are safe from any goroutine; Close is safe from any goroutine too.
type Dispatch[T any] struct {
	rings []*Ring[T]
	key   func(*T) uint64
	// scratch holds the item while key looks at it. Producer-owned.
	scratch T
	// mask is N()-1 when N() is a power of two, so that Push computes key % N() as
	// key & mask instead of with a division (tens of cycles); 0 otherwise.
	mask uint64
	// debug: Push panics when another Push is running (WithDebug, or the race
	// detector), before a second producer can route the first one's item by its own.
	debug   bool
	pushing atomic.Uint32
}

// NewDispatch returns a Dispatch over n rings of the given capacity (see New); n below 1
// counts as 1. key must not retain the pointer it is given. NewDispatch panics if key is
// nil. An item goes to ring key % n, which for a power of two n is the key's low bits
// alone: key must mix every input bit into those (FNV-1a, for one, does not).
func NewDispatch[T any](n, capacity int, key func(*T) uint64, opts ...Option) *Dispatch[T] {
	if key == nil {
		panic("ringq: NewDispatch with a nil key function")
	}
	n = max(n, 1)
	cfg := buildConfig(opts)
	d := &Dispatch[T]{rings: make([]*Ring[T], n), key: key, debug: cfg.debug}
	if n&(n-1) == 0 {
		d.mask = uint64(n - 1)
	}
	for i := range d.rings {
		d.rings[i] = newRing[T](capacity, cfg, newNotifier())
	}
	return d
}

// Push adds v to ring key(&v) % N(), blocking while that ring is full. It returns
// ctx.Err() if ctx ends first and ErrClosed if the ring is closed. Producer only.
func (d *Dispatch[T]) Push(ctx context.Context, v T) error {
	if d.debug {
		return d.pushDebug(ctx, v)
	}
	return d.push(ctx, v)
}

// pushDebug is Push with the single-producer check: scratch and the ring's
// producer side are both the producer's alone.
func (d *Dispatch[T]) pushDebug(ctx context.Context, v T) error {
	if !d.pushing.CompareAndSwap(0, 1) {
		panic("ringq: concurrent producers on a Dispatch")
	}
	defer d.pushing.Store(0)
	return d.push(ctx, v)
}

func (d *Dispatch[T]) push(ctx context.Context, v T) error {
	// key looks at a copy in a Dispatch field: handing it &v would move every
	// pushed item to the heap (key is unknown code), and hiding &v from escape
	// analysis would let a key that keeps the pointer keep a pointer into a dead
	// stack frame.
	d.scratch = v
	k := d.key(&d.scratch)
	var zero T
	d.scratch = zero
	var i uint64
	if d.mask != 0 || len(d.rings) == 1 {
		i = k & d.mask
	} else {
		i = k % uint64(len(d.rings))
	}
	return d.rings[i].Push(ctx, v)
}

// Ring returns ring i, 0 <= i < N(). Worker i is its only consumer.
func (d *Dispatch[T]) Ring(i int) *Ring[T] { return d.rings[i] }

// N returns the number of rings.
func (d *Dispatch[T]) N() int { return len(d.rings) }

// Close closes every ring: each worker drains its ring and then gets ErrClosed. Usually
// called by the producer after its last Push. Idempotent.
func (d *Dispatch[T]) Close() {
	for _, r := range d.rings {
		r.Close()
	}
}

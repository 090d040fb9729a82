package pipeline

import (
	"sync"
	"sync/atomic"
)

// A slab is a block that a worker carves tuples from. It goes back to
// slabPool, to be carved again, once the worker has moved on to another
// slab and every row carved from it has been released (ReleaseRows).
//
// state holds, in one word so that both are checked and changed together,
// the slab's generation (the top 16 bits: which use of the slab this is)
// and a count (the rest) that goes down to zero: it starts at slabBias,
// every released row takes 1, and the worker takes slabBias minus the rows
// it carved when it retires the slab. The bias keeps the count above zero
// while the worker is still carving, however many rows are released
// meanwhile (a worker carves far fewer than slabBias rows from one slab),
// and it lets the worker count its rows without an atomic operation per
// row. Each row records the generation it was carved in, so that a row
// released again after its slab was reused (a copy released from a second
// place) is caught instead of taking a reference that belongs to another
// row.
type slab struct {
	buf   []byte
	state atomic.Uint64
	log   releaseLog // race-detector builds: which rows were released
}

const (
	slabBias  = 1 << 40
	genShift  = 48
	countMask = 1<<genShift - 1
)

var slabPool = sync.Pool{New: func() any { return &slab{buf: make([]byte, 0, slabSize)} }}

// newSlab takes an empty slab from the pool, or makes one, and starts its
// next generation.
func newSlab() *slab {
	s := slabPool.Get().(*slab)
	s.buf = s.buf[:0]
	s.log.reset()
	s.state.Store(uint64(s.gen()+1)<<genShift | slabBias)
	return s
}

// gen is the slab's present generation.
func (s *slab) gen() uint16 { return uint16(s.state.Load() >> genShift) }

// count is what is left of the slab's count.
func (s *slab) count() int64 { return int64(s.state.Load() & countMask) }

// release takes n references of generation gen off s and returns it to the
// pool when none is left.
func (s *slab) release(n int64, gen uint16) {
	for {
		old := s.state.Load()
		switch left := int64(old&countMask) - n; {
		case uint16(old>>genShift) != gen:
			panic("pipeline: a row released after its slab was reused (released twice?)")
		case left < 0:
			panic("pipeline: a row released twice")
		case !s.state.CompareAndSwap(old, old-uint64(n)):
			continue // a release of another row of the slab came first
		case left == 0:
			if poisonSlabs {
				// Race-detector builds (every test run in CI): a tuple
				// read after its release reads this pattern, which no
				// COPY tuple starts with (a negative field count), so
				// the server refuses it and tests see the mistake.
				b := s.buf[:cap(s.buf)]
				for i := range b {
					b[i] = 0xA5
				}
			}
			slabPool.Put(s)
		}
		return
	}
}

// ReleaseRows gives the memory of rows' tuples back to the workers, to be
// reused for later rows, and sets the Tuple of each row it gives back to
// nil; rows that own their tuple (over 8 KiB, or made without a worker)
// are left as they are. Call it once for each row a worker made, when
// nothing will read its Tuple again: the sink does after the row is
// settled. A row that is never released costs nothing but garbage
// collection. A row released while its Tuple is still read hands that
// reader another event's bytes, so a Row copied elsewhere must not be read
// after either copy is released, nor released from both places. A second
// release panics when the row's generation is not the slab's any more, or
// when it takes the slab's count below zero; in race-detector builds
// (every test run in CI) it always does (releaseLog). Elsewhere a second
// release of a row whose siblings are still held goes unseen, and gives
// the slab back early.
func ReleaseRows(rows []Row) {
	var (
		cur *slab
		gen uint16
		n   int64
	)
	for i := range rows {
		r := &rows[i]
		if r.slab == nil {
			continue
		}
		if r.slab != cur || r.gen != gen {
			if cur != nil {
				cur.release(n, gen)
			}
			cur, gen, n = r.slab, r.gen, 0
		}
		if poisonSlabs && r.gen == r.slab.gen() {
			r.slab.log.once(r.Tuple) // a stale generation's is caught by release
		}
		n++
		r.slab, r.gen, r.Tuple = nil, 0, nil
	}
	if cur != nil {
		cur.release(n, gen)
	}
}

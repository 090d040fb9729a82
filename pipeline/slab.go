package pipeline

import (
	"sync"
	"sync/atomic"
)

// A slab is a block that a worker carves tuples from. It goes back to
// slabPool, to be carved again, once the worker has moved on to another
// slab and every row carved from it has been released (ReleaseRows).
//
// refs counts down to zero: it starts at slabBias, every released row
// takes 1, and the worker takes slabBias minus the rows it carved when it
// retires the slab. The bias keeps the count above zero while the worker
// is still carving, however many rows are released meanwhile (a worker
// carves far fewer than slabBias rows from one slab), and it lets the
// worker count its rows without an atomic operation per row.
//
// gen counts the slab's uses: each row records the gen it was carved in, so
// that a row released again after its slab was reused (a copy released
// from a second place) is caught instead of taking a reference that
// belongs to another row.
type slab struct {
	buf  []byte
	refs atomic.Int64
	gen  atomic.Uint64
}

const slabBias = 1 << 40

var slabPool = sync.Pool{New: func() any { return &slab{buf: make([]byte, 0, slabSize)} }}

// newSlab takes an empty slab from the pool, or makes one.
func newSlab() *slab {
	s := slabPool.Get().(*slab)
	s.buf = s.buf[:0]
	s.refs.Store(slabBias)
	s.gen.Add(1)
	return s
}

// release takes n references off s and returns it to the pool when none is
// left.
func (s *slab) release(n int64) {
	switch left := s.refs.Add(-n); {
	case left == 0:
		if poisonSlabs {
			// Race-detector builds (every test run in CI): a tuple read
			// after its release reads this pattern, which no COPY
			// tuple starts with (a negative field count), so the
			// server refuses it and tests see the mistake.
			b := s.buf[:cap(s.buf)]
			for i := range b {
				b[i] = 0xA5
			}
		}
		slabPool.Put(s)
	case left < 0:
		panic("pipeline: a row released twice")
	}
}

// mismatch is ReleaseRows' answer to a row carved in an earlier use of its
// slab than the present one.
func mismatch() {
	panic("pipeline: a row released after its slab was reused (released twice?)")
}

// ReleaseRows gives the memory of rows' tuples back to the workers, to be
// reused for later rows, and sets the Tuple of each row it gives back to
// nil; rows that own their tuple (over 8 KiB, or made without a worker)
// are left as they are. Call it once for each row a worker made, when
// nothing will read its Tuple again: the sink does after the row is
// settled. A row that is never released costs nothing but garbage
// collection. A row released while its Tuple is still read hands that
// reader another event's bytes, so a Row copied elsewhere must not be read
// after either copy is released, nor released from both places: a second
// release panics (the slab's count goes below zero, or the row's
// generation is not the slab's any more).
func ReleaseRows(rows []Row) {
	var (
		cur *slab
		gen uint64
		n   int64
	)
	for i := range rows {
		r := &rows[i]
		if r.slab == nil {
			continue
		}
		if r.slab != cur {
			if cur != nil {
				cur.release(n)
			}
			cur, gen, n = r.slab, r.slab.gen.Load(), 0
		}
		if r.gen != gen {
			mismatch()
		}
		n++
		r.slab, r.gen, r.Tuple = nil, 0, nil
	}
	if cur != nil {
		cur.release(n)
	}
}

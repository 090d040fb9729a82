package ringq

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// Benchmarks compare the rings with what a reviewer would otherwise reach for, in the same
// run: a buffered channel of the same capacity (q=chan; for batch=64 a channel of [64]ev
// arrays holding the same number of items), and a mutex+slice queue with two sync.Conds
// (q=mutex; for batch=64 it moves 64 items per lock). One op is one item.
//
//	go test -run '^$' -bench . -benchmem -count 6 ./ringq

const benchCap = 1024

// ev is a stand-in for a pipeline envelope: a key, a sequence number and a payload slice,
// so that the queue copies a pointer-bearing value of realistic size (40 bytes).
type ev struct {
	seq, key uint64
	_        []byte // never set: it makes ev the envelope's 40 bytes, a pointer among them
}

func mkEv(i int) ev { return ev{seq: uint64(i), key: uint64(i)} }

// consumed receives a checksum from every consumer, so that consumers read what they are
// handed (a channel receive into the blank identifier would skip the copy out).
var consumed atomic.Uint64

func sumSeq(vs []ev) uint64 {
	var s uint64
	for i := range vs {
		s += vs[i].seq
	}
	return s
}

// ---- the mutex+slice baseline ----

type mutexQueue struct {
	mu        sync.Mutex
	notEmpty  sync.Cond
	notFull   sync.Cond
	buf       []ev
	head, len int
	closed    bool
}

func newMutexQueue(capacity int) *mutexQueue {
	q := &mutexQueue{buf: make([]ev, capacity)}
	q.notEmpty.L, q.notFull.L = &q.mu, &q.mu
	return q
}

func (q *mutexQueue) pushN(vs []ev) {
	q.mu.Lock()
	for len(vs) > 0 {
		for q.len == len(q.buf) {
			q.notFull.Wait()
		}
		for q.len < len(q.buf) && len(vs) > 0 {
			q.buf[(q.head+q.len)%len(q.buf)] = vs[0]
			q.len++
			vs = vs[1:]
		}
		q.notEmpty.Signal()
	}
	q.mu.Unlock()
}

func (q *mutexQueue) popN(dst []ev) int {
	q.mu.Lock()
	for q.len == 0 && !q.closed {
		q.notEmpty.Wait()
	}
	n := 0
	for q.len > 0 && n < len(dst) {
		dst[n] = q.buf[q.head]
		q.buf[q.head] = ev{}
		q.head = (q.head + 1) % len(q.buf)
		q.len--
		n++
	}
	q.notFull.Signal()
	q.mu.Unlock()
	return n
}

func (q *mutexQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.notEmpty.Broadcast()
	q.mu.Unlock()
}

// ---- harness ----

// run starts producers and consumers, times them, and waits for all of them. Besides
// ns/op it reports cpu-ns/op, the process CPU time (user+system) per item, which is less
// sensitive than wall time to other load on the machine.
func run(b *testing.B, producers []func(), consumers []func()) {
	b.Helper()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	var wg sync.WaitGroup
	for _, c := range consumers {
		wg.Go(c)
	}
	var pg sync.WaitGroup
	for _, p := range producers {
		pg.Go(p)
	}
	pg.Wait()
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

// split returns how many items each of k producers sends so that they add up to n.
func split(n, k, i int) int {
	if i < n%k {
		return n/k + 1
	}
	return n / k
}

// fill writes items from..from+len(dst)-1 into dst.
func fill(dst []ev, from int) {
	for i := range dst {
		dst[i] = mkEv(from + i)
	}
}

// ---- SPSC ----

func BenchmarkSPSC(b *testing.B) {
	ctx := context.Background()
	b.Run("batch=1/q=chan", func(b *testing.B) {
		ch := make(chan ev, benchCap)
		run(b, []func(){func() {
			for i := range b.N {
				ch <- mkEv(i)
			}
			close(ch)
		}}, []func(){func() {
			var sum uint64
			for v := range ch {
				sum += v.seq
			}
			consumed.Add(sum)
		}})
	})
	b.Run("batch=1/q=mutex", func(b *testing.B) {
		q := newMutexQueue(benchCap)
		run(b, []func(){func() {
			var one [1]ev
			for i := range b.N {
				one[0] = mkEv(i)
				q.pushN(one[:])
			}
			q.close()
		}}, []func(){func() {
			var one [1]ev
			var sum uint64
			for q.popN(one[:]) > 0 {
				sum += one[0].seq
			}
			consumed.Add(sum)
		}})
	})
	b.Run("batch=1/q=ring", func(b *testing.B) {
		r := New[ev](benchCap)
		run(b, []func(){func() {
			for i := range b.N {
				if r.Push(ctx, mkEv(i)) != nil {
					panic("push failed")
				}
			}
			r.Close()
		}}, []func(){func() {
			var sum uint64
			for {
				v, err := r.Pop(ctx)
				if err != nil {
					consumed.Add(sum)
					return
				}
				sum += v.seq
			}
		}})
	})
	b.Run("batch=64/q=chan", func(b *testing.B) {
		ch := make(chan [64]ev, benchCap/64)
		run(b, []func(){func() {
			var a [64]ev
			for i := 0; i < b.N; i += 64 {
				fill(a[:], i)
				ch <- a
			}
			close(ch)
		}}, []func(){func() {
			var sum uint64
			for a := range ch {
				sum += sumSeq(a[:])
			}
			consumed.Add(sum)
		}})
	})
	b.Run("batch=64/q=mutex", func(b *testing.B) {
		q := newMutexQueue(benchCap)
		run(b, []func(){func() {
			var a [64]ev
			for i := 0; i < b.N; i += 64 {
				fill(a[:], i)
				q.pushN(a[:])
			}
			q.close()
		}}, []func(){func() {
			var a [64]ev
			var sum uint64
			for n := q.popN(a[:]); n > 0; n = q.popN(a[:]) {
				sum += sumSeq(a[:n])
			}
			consumed.Add(sum)
		}})
	})
	b.Run("batch=64/q=ring", func(b *testing.B) {
		r := New[ev](benchCap)
		run(b, []func(){func() {
			var a [64]ev
			for i := 0; i < b.N; i += 64 {
				fill(a[:], i)
				if _, err := r.PushN(ctx, a[:]); err != nil {
					panic(err)
				}
			}
			r.Close()
		}}, []func(){func() {
			var a [64]ev
			var sum uint64
			for {
				n, err := r.PopN(ctx, a[:])
				if err != nil {
					consumed.Add(sum)
					return
				}
				sum += sumSeq(a[:n])
			}
		}})
	})
}

// ---- fan-in: 2 producers, 1 consumer ----

func BenchmarkFanIn2(b *testing.B) {
	ctx := context.Background()
	const np = 2
	b.Run("batch=1/q=chan", func(b *testing.B) {
		ch := make(chan ev, benchCap)
		var left sync.WaitGroup
		left.Add(np)
		prods := make([]func(), np)
		for p := range prods {
			prods[p] = func() {
				for i := range split(b.N, np, p) {
					ch <- mkEv(i)
				}
				if left.Done(); p == 0 {
					left.Wait()
					close(ch)
				}
			}
		}
		run(b, prods, []func(){func() {
			var sum uint64
			for v := range ch {
				sum += v.seq
			}
			consumed.Add(sum)
		}})
	})
	b.Run("batch=1/q=mutex", func(b *testing.B) {
		q := newMutexQueue(benchCap)
		var left sync.WaitGroup
		left.Add(np)
		prods := make([]func(), np)
		for p := range prods {
			prods[p] = func() {
				var one [1]ev
				for i := range split(b.N, np, p) {
					one[0] = mkEv(i)
					q.pushN(one[:])
				}
				if left.Done(); p == 0 {
					left.Wait()
					q.close()
				}
			}
		}
		run(b, prods, []func(){func() {
			var one [1]ev
			var sum uint64
			for q.popN(one[:]) > 0 {
				sum += one[0].seq
			}
			consumed.Add(sum)
		}})
	})
	b.Run("batch=1/q=ring", func(b *testing.B) {
		m := NewMerge[ev](np, benchCap)
		prods := make([]func(), np)
		for p := range prods {
			prods[p] = func() {
				r := m.Ring(p)
				for i := range split(b.N, np, p) {
					if r.Push(ctx, mkEv(i)) != nil {
						panic("push failed")
					}
				}
				r.Close()
			}
		}
		run(b, prods, []func(){func() {
			var one [1]ev
			var sum uint64
			for {
				n, err := m.PopN(ctx, one[:])
				if err != nil {
					consumed.Add(sum)
					return
				}
				sum += sumSeq(one[:n])
			}
		}})
	})
	b.Run("batch=64/q=chan", func(b *testing.B) {
		ch := make(chan [64]ev, benchCap/64)
		var left sync.WaitGroup
		left.Add(np)
		prods := make([]func(), np)
		for p := range prods {
			prods[p] = func() {
				var a [64]ev
				for i := 0; i < split(b.N, np, p); i += 64 {
					fill(a[:], i)
					ch <- a
				}
				if left.Done(); p == 0 {
					left.Wait()
					close(ch)
				}
			}
		}
		run(b, prods, []func(){func() {
			var sum uint64
			for a := range ch {
				sum += sumSeq(a[:])
			}
			consumed.Add(sum)
		}})
	})
	b.Run("batch=64/q=mutex", func(b *testing.B) {
		q := newMutexQueue(benchCap)
		var left sync.WaitGroup
		left.Add(np)
		prods := make([]func(), np)
		for p := range prods {
			prods[p] = func() {
				var a [64]ev
				for i := 0; i < split(b.N, np, p); i += 64 {
					fill(a[:], i)
					q.pushN(a[:])
				}
				if left.Done(); p == 0 {
					left.Wait()
					q.close()
				}
			}
		}
		run(b, prods, []func(){func() {
			var a [64]ev
			var sum uint64
			for n := q.popN(a[:]); n > 0; n = q.popN(a[:]) {
				sum += sumSeq(a[:n])
			}
			consumed.Add(sum)
		}})
	})
	b.Run("batch=64/q=ring", func(b *testing.B) {
		m := NewMerge[ev](np, benchCap)
		prods := make([]func(), np)
		for p := range prods {
			prods[p] = func() {
				r := m.Ring(p)
				var a [64]ev
				for i := 0; i < split(b.N, np, p); i += 64 {
					fill(a[:], i)
					if _, err := r.PushN(ctx, a[:]); err != nil {
						panic(err)
					}
				}
				r.Close()
			}
		}
		run(b, prods, []func(){func() {
			var a [64]ev
			var sum uint64
			for {
				n, err := m.PopN(ctx, a[:])
				if err != nil {
					consumed.Add(sum)
					return
				}
				sum += sumSeq(a[:n])
			}
		}})
	})
}

// ---- fan-out: 1 producer, 2 consumers, item i goes to consumer i%2 ----

func BenchmarkFanOut2(b *testing.B) {
	ctx := context.Background()
	const nc = 2
	b.Run("batch=1/q=chan", func(b *testing.B) {
		chs := make([]chan ev, nc)
		cons := make([]func(), nc)
		for c := range chs {
			chs[c] = make(chan ev, benchCap)
			cons[c] = func() {
				var sum uint64
				for v := range chs[c] {
					sum += v.seq
				}
				consumed.Add(sum)
			}
		}
		run(b, []func(){func() {
			for i := range b.N {
				v := mkEv(i)
				chs[v.key%nc] <- v
			}
			for _, ch := range chs {
				close(ch)
			}
		}}, cons)
	})
	b.Run("batch=1/q=mutex", func(b *testing.B) {
		qs := make([]*mutexQueue, nc)
		cons := make([]func(), nc)
		for c := range qs {
			qs[c] = newMutexQueue(benchCap)
			cons[c] = func() {
				var one [1]ev
				var sum uint64
				for qs[c].popN(one[:]) > 0 {
					sum += one[0].seq
				}
				consumed.Add(sum)
			}
		}
		run(b, []func(){func() {
			var one [1]ev
			for i := range b.N {
				one[0] = mkEv(i)
				qs[one[0].key%nc].pushN(one[:])
			}
			for _, q := range qs {
				q.close()
			}
		}}, cons)
	})
	b.Run("batch=1/q=ring", func(b *testing.B) {
		d := NewDispatch(nc, benchCap, func(v *ev) uint64 { return v.key })
		cons := make([]func(), nc)
		for c := range cons {
			cons[c] = func() {
				r := d.Ring(c)
				var sum uint64
				for {
					v, err := r.Pop(ctx)
					if err != nil {
						consumed.Add(sum)
						return
					}
					sum += v.seq
				}
			}
		}
		run(b, []func(){func() {
			for i := range b.N {
				if d.Push(ctx, mkEv(i)) != nil {
					panic("push failed")
				}
			}
			d.Close()
		}}, cons)
	})
	// Batched fan-out: the producer gathers 64 items per consumer before handing them over.
	b.Run("batch=64/q=chan", func(b *testing.B) {
		chs := make([]chan [64]ev, nc)
		cons := make([]func(), nc)
		for c := range chs {
			chs[c] = make(chan [64]ev, benchCap/64)
			cons[c] = func() {
				var sum uint64
				for a := range chs[c] {
					sum += sumSeq(a[:])
				}
				consumed.Add(sum)
			}
		}
		run(b, []func(){func() {
			var bufs [nc][64]ev
			var lens [nc]int
			for i := range b.N {
				v := mkEv(i)
				c := v.key % nc
				bufs[c][lens[c]] = v
				if lens[c]++; lens[c] == 64 {
					chs[c] <- bufs[c]
					lens[c] = 0
				}
			}
			for c, ch := range chs {
				if lens[c] > 0 {
					ch <- bufs[c]
				}
				close(ch)
			}
		}}, cons)
	})
	b.Run("batch=64/q=mutex", func(b *testing.B) {
		qs := make([]*mutexQueue, nc)
		cons := make([]func(), nc)
		for c := range qs {
			qs[c] = newMutexQueue(benchCap)
			cons[c] = func() {
				var a [64]ev
				var sum uint64
				for n := qs[c].popN(a[:]); n > 0; n = qs[c].popN(a[:]) {
					sum += sumSeq(a[:n])
				}
				consumed.Add(sum)
			}
		}
		run(b, []func(){func() {
			var bufs [nc][64]ev
			var lens [nc]int
			for i := range b.N {
				v := mkEv(i)
				c := v.key % nc
				bufs[c][lens[c]] = v
				if lens[c]++; lens[c] == 64 {
					qs[c].pushN(bufs[c][:])
					lens[c] = 0
				}
			}
			for c, q := range qs {
				q.pushN(bufs[c][:lens[c]])
				q.close()
			}
		}}, cons)
	})
	b.Run("batch=64/q=ring", func(b *testing.B) {
		d := NewDispatch(nc, benchCap, func(v *ev) uint64 { return v.key })
		cons := make([]func(), nc)
		for c := range cons {
			cons[c] = func() {
				r := d.Ring(c)
				var a [64]ev
				var sum uint64
				for {
					n, err := r.PopN(ctx, a[:])
					if err != nil {
						consumed.Add(sum)
						return
					}
					sum += sumSeq(a[:n])
				}
			}
		}
		run(b, []func(){func() {
			var bufs [nc][64]ev
			var lens [nc]int
			for i := range b.N {
				v := mkEv(i)
				c := v.key % nc
				bufs[c][lens[c]] = v
				if lens[c]++; lens[c] == 64 {
					if _, err := d.Ring(int(c)).PushN(ctx, bufs[c][:]); err != nil {
						panic(err)
					}
					lens[c] = 0
				}
			}
			for c := range nc {
				if _, err := d.Ring(c).PushN(ctx, bufs[c][:lens[c]]); err != nil {
					panic(err)
				}
			}
			d.Close()
		}}, cons)
	})
}

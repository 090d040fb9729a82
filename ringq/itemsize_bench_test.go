package ringq

import (
	"context"
	"sync"
	"testing"
)

// BenchmarkWord is SPSC/batch=1 and FanIn2/batch=1 again with 8-byte items (a uint64)
// instead of the 40-byte ev, ring against a buffered channel of the same capacity. Eight
// items share a cache line instead of 1.6, so it shows how much of a single-item hand-off
// is the item's own cache-line traffic, which every queue pays. The code is written out
// for uint64 rather than shared with the ev benchmarks through a type parameter: a generic
// benchmark loop measured 20-30% slower for ev, for both queues.
//
//	go test -run '^$' -bench 'Word|SPSC/batch=1|FanIn2/batch=1' -benchmem -count 6 ./ringq
func BenchmarkWord(b *testing.B) {
	ctx := context.Background()
	const np = 2
	b.Run("shape=SPSC/q=chan", func(b *testing.B) {
		ch := make(chan uint64, benchCap)
		run(b, []func(){func() {
			for i := range b.N {
				ch <- uint64(i)
			}
			close(ch)
		}}, []func(){func() { consumed.Add(sumChan(ch)) }})
	})
	b.Run("shape=SPSC/q=ring", func(b *testing.B) {
		r := New[uint64](benchCap)
		run(b, []func(){func() {
			for i := range b.N {
				if r.Push(ctx, uint64(i)) != nil {
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
				sum += v
			}
		}})
	})
	b.Run("shape=FanIn2/q=chan", func(b *testing.B) {
		ch := make(chan uint64, benchCap)
		var left sync.WaitGroup
		left.Add(np)
		prods := make([]func(), np)
		for p := range prods {
			prods[p] = func() {
				for i := range split(b.N, np, p) {
					ch <- uint64(i)
				}
				if left.Done(); p == 0 {
					left.Wait()
					close(ch)
				}
			}
		}
		run(b, prods, []func(){func() { consumed.Add(sumChan(ch)) }})
	})
	b.Run("shape=FanIn2/q=ring", func(b *testing.B) {
		m := NewMerge[uint64](np, benchCap)
		prods := make([]func(), np)
		for p := range prods {
			prods[p] = func() {
				r := m.Ring(p)
				for i := range split(b.N, np, p) {
					if r.Push(ctx, uint64(i)) != nil {
						panic("push failed")
					}
				}
				r.Close()
			}
		}
		run(b, prods, []func(){func() {
			var one [1]uint64
			var sum uint64
			for {
				_, err := m.PopN(ctx, one[:])
				if err != nil {
					consumed.Add(sum)
					return
				}
				sum += one[0] // n is 1: PopN blocks until it has an item
			}
		}})
	})
}

// sumChan receives until ch is closed and returns the sum of what it got.
func sumChan(ch chan uint64) uint64 {
	var sum uint64
	for v := range ch {
		sum += v
	}
	return sum
}

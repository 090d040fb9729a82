package ringq

import (
	"context"
	"sync"
	"testing"
	"time"
)

// BenchmarkIdle measures what waiting costs: a producer pushes 1,000 items/s (one per
// millisecond tick) for idleFor, the consumer spends almost all of that time waiting, and
// the benchmark reports the process CPU (user+system, from getrusage) per second of wall
// time and per item. The ring should idle like the channel. It runs the same fixed period
// whatever b.N is, so one iteration is the whole measurement.
func BenchmarkIdle(b *testing.B) {
	const idleFor = 3 * time.Second
	b.Run("q=chan", func(b *testing.B) {
		ch := make(chan ev, benchCap)
		idle(b, idleFor, func(v ev) { ch <- v }, func() { close(ch) }, func() bool {
			_, ok := <-ch
			return ok
		})
	})
	b.Run("q=ring", func(b *testing.B) {
		ctx := context.Background()
		r := New[ev](benchCap)
		idle(b, idleFor, func(v ev) { _ = r.Push(ctx, v) }, r.Close, func() bool {
			_, err := r.Pop(ctx)
			return err == nil
		})
	})
}

func idle(b *testing.B, d time.Duration, push func(ev), done func(), pop func() bool) {
	var wg sync.WaitGroup
	items := 0
	wg.Go(func() {
		for pop() {
			items++
		}
	})
	t0, cpu0 := time.Now(), processCPU()
	tick := time.NewTicker(time.Millisecond)
	for i := 0; time.Since(t0) < d; i++ {
		<-tick.C
		push(mkEv(i))
	}
	tick.Stop()
	done()
	wg.Wait()
	wall, cpu := time.Since(t0), processCPU()-cpu0
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu-%")
	b.ReportMetric(float64(cpu.Microseconds())/float64(max(items, 1)), "cpu-µs/item")
	b.ReportMetric(float64(items)/wall.Seconds(), "items/s")
}

package ringq_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/jetsink/jetsink/ringq"
)

// A producer and a consumer hand items over through a Ring; the producer closes it after
// its last push, and the consumer drains it until ErrClosed.
func Example() {
	ctx := context.Background()
	r := ringq.New[string](3) // rounded up to 4

	var wg sync.WaitGroup
	wg.Go(func() {
		defer r.Close()
		for _, s := range []string{"a", "b", "c", "d", "e"} {
			if err := r.Push(ctx, s); err != nil { // blocks while the ring is full
				return
			}
		}
	})

	for {
		s, err := r.Pop(ctx)
		if errors.Is(err, ringq.ErrClosed) {
			break
		}
		fmt.Print(s, " ")
	}
	wg.Wait()
	fmt.Println("| cap", r.Cap())
	// Output: a b c d e | cap 4
}

type event struct {
	subject string
	seq     int
}

// A Dispatch sends every event of a subject to the same worker, so per-subject order
// holds while the workers run in parallel.
func ExampleDispatch() {
	ctx := context.Background()
	d := ringq.NewDispatch(2, 64, func(e *event) uint64 { return uint64(len(e.subject)) })

	got := make([][]string, d.N())
	var wg sync.WaitGroup
	for w := range d.N() {
		wg.Go(func() {
			batch := make([]event, 16)
			for {
				n, err := d.Ring(w).PopN(ctx, batch)
				if err != nil { // ErrClosed: the producer is done and the ring is drained
					return
				}
				for _, e := range batch[:n] {
					got[w] = append(got[w], fmt.Sprintf("%s#%d", e.subject, e.seq))
				}
			}
		})
	}
	for i := range 3 {
		for _, subj := range []string{"ab", "abc"} {
			if err := d.Push(ctx, event{subj, i}); err != nil {
				panic(err)
			}
		}
	}
	d.Close()
	wg.Wait()
	for w, evs := range got {
		fmt.Println("worker", w, evs)
	}
	// Output:
	// worker 0 [ab#0 ab#1 ab#2]
	// worker 1 [abc#0 abc#1 abc#2]
}

// A Merge collects the output of several producers into one consumer, which wakes as
// soon as any producer pushes and stops once every producer has closed its ring.
func ExampleMerge() {
	ctx := context.Background()
	m := ringq.NewMerge[int](3, 8)

	var wg sync.WaitGroup
	for p := range m.N() {
		wg.Go(func() {
			r := m.Ring(p)
			defer r.Close()
			for i := range 4 {
				if err := r.Push(ctx, p*10+i); err != nil {
					return
				}
			}
		})
	}

	var all []int
	batch := make([]int, 5)
	for {
		n, err := m.PopN(ctx, batch)
		if errors.Is(err, ringq.ErrClosed) {
			break
		}
		all = append(all, batch[:n]...)
	}
	wg.Wait()
	sort.Ints(all)
	fmt.Println(all)
	// Output: [0 1 2 3 10 11 12 13 20 21 22 23]
}

package pipeline

import (
	"sync"
	"testing"
	"time"
)

// Of many concurrent calls within one interval one goes through, and the
// next one let through counts every other.
func TestEveryLetsOneThroughAndCountsTheRest(t *testing.T) {
	var e Every
	start := time.Now()
	const n = 1000
	var wg sync.WaitGroup
	var mu sync.Mutex
	through := 0
	for range n {
		wg.Go(func() {
			if held, ok := e.Allow(start, time.Hour); ok {
				mu.Lock()
				through++
				mu.Unlock()
				if held != 0 {
					t.Errorf("the first let through counts %d held back", held)
				}
			}
		})
	}
	wg.Wait()
	if through != 1 {
		t.Fatalf("%d let through within one interval, want 1", through)
	}
	if held, ok := e.Allow(start.Add(30*time.Minute), time.Hour); ok || held != 0 {
		t.Fatalf("within the interval: %d, %v", held, ok)
	}
	if held, ok := e.Allow(start.Add(time.Hour), time.Hour); !ok || held != n {
		t.Fatalf("after the interval: held %d, ok %v; want %d (the %d others and the one at 30 min)", held, ok, n, n-1)
	}
}

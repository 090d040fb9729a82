package processor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jetsink/jetsink/telemetry"
)

// A scrape's readiness checks run under a context of the SDK's that never
// ends (context.TODO), and the admin listener's shutdown waits for the
// scrape: they must end when fetches does, at once, and the gauge then
// keeps what the checks answered before rather than report them failing.
// Before, a check that hung held the scrape, and with it the exit, for its
// whole timeout.
func TestReadinessEndsWithFetches(t *testing.T) {
	fetches, endFetches := context.WithCancel(context.Background())
	defer endFetches()
	var hang bool
	entered := make(chan struct{}, 1)
	c := readinessCache(fetches, map[string]telemetry.Check{
		"postgres": func(ctx context.Context) error {
			if !hang {
				return nil
			}
			entered <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		},
	})
	c.TTL = 0 // every Get runs the checks
	ctx, cancel := within(context.TODO(), fetches)
	results, _, err := c.Get(ctx)
	cancel()
	if err != nil || len(results) != 1 || results["postgres"] != nil {
		t.Fatalf("first run: %v, %v; want postgres passing", results, err)
	}

	hang = true
	type got struct {
		results map[string]error
		err     error
	}
	done := make(chan got, 1)
	go func() {
		ctx, cancel := within(context.TODO(), fetches)
		defer cancel()
		r, _, err := c.Get(ctx)
		done <- got{r, err}
	}()
	<-entered
	endFetches()
	began := time.Now()
	var g got
	select {
	case g = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the checks did not end with fetches")
	}
	if took := time.Since(began); took >= telemetry.CheckTimeout/2 {
		t.Errorf("the checks ended %v after fetches, want at once, not at their %v timeout", took, telemetry.CheckTimeout)
	}
	if !errors.Is(g.err, context.Canceled) || len(g.results) != 1 || g.results["postgres"] != nil {
		t.Errorf("cut short: %v, %v; want the results from before (postgres passing) and the cut", g.results, g.err)
	}
}

package telemetry

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A failed fetch keeps the last good value and its time, so that a gauge
// fed from it holds its figure (and says how old it is) while the server
// does not answer, and is absent only before the first success.
func TestCachedKeepsTheLastGoodValue(t *testing.T) {
	fail := errors.New("no answer")
	results := []error{fail, nil, fail}
	calls := 0
	c := &Cached[int]{TTL: 0, Timeout: time.Second, Fetch: func(context.Context) (int, error) {
		err := results[calls]
		calls++
		if err != nil {
			return -1, err
		}
		return 7, nil
	}}
	v, at, err := c.Get(context.Background())
	if v != 0 || !at.IsZero() || !errors.Is(err, fail) {
		t.Fatalf("before any success: %d %v %v, want 0, the zero time and the error", v, at, err)
	}
	v, good, err := c.Get(context.Background())
	if v != 7 || good.IsZero() || err != nil {
		t.Fatalf("after a success: %d %v %v", v, good, err)
	}
	v, at, err = c.Get(context.Background())
	if v != 7 || !at.Equal(good) || !errors.Is(err, fail) {
		t.Fatalf("after a failure: %d %v %v, want 7 from %v and the error", v, at, err, good)
	}
	c.TTL = time.Hour
	if _, _, err := c.Get(context.Background()); calls != 3 || !errors.Is(err, fail) {
		t.Fatalf("within the TTL: %d fetches (want 3), err %v", calls, err)
	}
}

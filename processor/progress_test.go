package processor

import (
	"slices"
	"testing"
	"time"
)

func TestProgressArgs(t *testing.T) {
	was := tally{received: 10, committed: 8, deadLettered: 1}
	if args := progressArgs(was, was, time.Minute); args != nil {
		t.Errorf("nothing happened, yet %v", args)
	}
	now := tally{received: 130, redelivered: 2, committed: 128, deadLettered: 2, retries: 3}
	want := []any{"committed", uint64(120), "per_second", int64(2), "received", uint64(120), "redelivered", uint64(2),
		"dead_lettered", uint64(1), "retries", uint64(3)}
	if got := progressArgs(was, now, time.Minute); !slices.Equal(got, want) {
		t.Errorf("progressArgs = %v, want %v", got, want)
	}
	// The rarer fates, when some happened, so that the totals add up:
	// received = committed + dead_lettered + dead_letter_failed +
	// released + given_up, once nothing is in flight. Before, a line
	// after PostgreSQL was unreachable said 120 received, 20 committed,
	// and nothing of the other 100.
	was = tally{received: 10, committed: 8, deadLettered: 1, deadLetterFailed: 1}
	now = tally{received: 130, committed: 28, deadLettered: 2, deadLetterFailed: 4, released: 95, givenUp: 1}
	want = []any{"committed", uint64(20), "per_second", int64(0), "received", uint64(120), "redelivered", uint64(0),
		"dead_lettered", uint64(1), "retries", uint64(0), "dead_letter_failed", uint64(3), "released", uint64(95), "given_up", uint64(1)}
	if got := progressArgs(was, now, time.Minute); !slices.Equal(got, want) {
		t.Errorf("progressArgs = %v, want %v", got, want)
	}
	// Only those that happened: a line of nothing but a failed dead
	// letter is there, with it alone of the three.
	now = tally{received: 10, committed: 8, deadLettered: 1, deadLetterFailed: 2}
	want = []any{"committed", uint64(0), "per_second", int64(0), "received", uint64(0), "redelivered", uint64(0),
		"dead_lettered", uint64(0), "retries", uint64(0), "dead_letter_failed", uint64(1)}
	if got := progressArgs(was, now, time.Minute); !slices.Equal(got, want) {
		t.Errorf("progressArgs = %v, want %v", got, want)
	}
}

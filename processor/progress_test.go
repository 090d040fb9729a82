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
}

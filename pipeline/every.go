package pipeline

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Every lets something (a log line) through at most once per interval and
// counts the times it held it back, for the stages' logs of what can
// happen thousands of times a second (dead letters the consumer's breaker
// holds back, spans dropped on a full export queue). The zero value lets
// the first through. Safe for concurrent use, without a lock.
type Every struct {
	next atomic.Int64 // ns since everyBase before which nothing goes through
	held atomic.Int64 // held back since the last let through
}

// everyBase is what Every measures from: time.Now's monotonic clock, so
// that the wall clock stepping back (an NTP correction) does not hold
// everything back for as long as it stepped.
var everyBase = time.Now()

// Allow reports whether to go ahead at now (time.Now(): its monotonic
// reading is what counts), and if so how many were held back since the
// last time it said so. Every call is either let through or counted once
// in a later held.
func (e *Every) Allow(now time.Time, every time.Duration) (held int64, ok bool) {
	n := int64(now.Sub(everyBase))
	next := e.next.Load()
	if next != 0 && n < next || !e.next.CompareAndSwap(next, n+int64(every)) {
		e.held.Add(1)
		return 0, false
	}
	return e.held.Swap(0), true
}

// Log logs msg at level with args and held_back (see Allow) if Allow lets
// it through now, and reports whether it did. The args are evaluated
// either way: for a line whose args cost (a stack), call Allow first.
func (e *Every) Log(ctx context.Context, log *slog.Logger, level slog.Level, every time.Duration, msg string, args ...any) bool {
	held, ok := e.Allow(time.Now(), every)
	if ok {
		log.Log(ctx, level, msg, append(args, "held_back", held)...)
	}
	return ok
}

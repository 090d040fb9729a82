package processor

import (
	"context"
	"log/slog"
	"time"
)

// progressEvery is how often Run logs what it has done since the last
// time, at Info, when it has done something.
const progressEvery = time.Minute

// tally is what the progress log counts. Once nothing is in flight,
// received is the sum of the fates: committed, deadLettered,
// deadLetterFailed (nak'ed, they come back and are received again),
// released and givenUp.
type tally struct {
	received, redelivered, committed, deadLettered, retries uint64
	deadLetterFailed, released, givenUp                     uint64
}

func (p *Processor) tally() tally {
	cs, ss := p.consumer.Stats(), p.sink.Stats()
	return tally{received: cs.Received, redelivered: cs.Redelivered, committed: ss.Rows,
		deadLettered: cs.DeadLettered + cs.MaxDelivered, retries: ss.Retries,
		deadLetterFailed: cs.DeadLetterFailed, released: ss.Released, givenUp: ss.GivenUp}
}

// progressArgs are the log attributes of what happened between was and
// now, over d; none when nothing did. The rarer fates (dead_letter_failed,
// released, given_up) are there only when some happened.
func progressArgs(was, now tally, d time.Duration) []any {
	if now == was {
		return nil
	}
	committed := now.committed - was.committed
	args := []any{"committed", committed, "per_second", int64(float64(committed) / d.Seconds()),
		"received", now.received - was.received, "redelivered", now.redelivered - was.redelivered,
		"dead_lettered", now.deadLettered - was.deadLettered, "retries", now.retries - was.retries}
	for _, f := range []struct {
		key      string
		was, now uint64
	}{
		{"dead_letter_failed", was.deadLetterFailed, now.deadLetterFailed},
		{"released", was.released, now.released},
		{"given_up", was.givenUp, now.givenUp},
	} {
		if n := f.now - f.was; n > 0 {
			args = append(args, f.key, n)
		}
	}
	return args
}

// logProgress logs, every progressEvery until ctx ends, what the minute
// brought (nothing when it brought nothing: an idle jetsink stays quiet),
// and when ctx ends, the totals since start.
func (p *Processor) logProgress(ctx context.Context, log *slog.Logger) {
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	start := time.Now()
	last, lastAt := tally{}, start
	for {
		select {
		case <-ctx.Done():
			if args := progressArgs(tally{}, p.tally(), time.Since(start)); args != nil {
				log.Info("totals since start", append(args, "for", time.Since(start).Round(time.Second))...)
			}
			return
		case now := <-tick.C:
			t := p.tally()
			if args := progressArgs(last, t, now.Sub(lastAt)); args != nil {
				log.Info("progress", append(args, "for", now.Sub(lastAt).Round(time.Second))...)
			}
			last, lastAt = t, now
		}
	}
}

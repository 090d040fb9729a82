package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// LockResult is what happened around the table lock of Options.LockFor.
// The RSS figures are the engine's VmRSS, sampled every 250 ms.
type LockResult struct {
	AtS   float64 `json:"at_s"`   // lock taken, seconds after the first scheduled send
	HeldS float64 `json:"held_s"` // how long it was held
	// RSSBefore is the last sample before the lock was taken,
	// RSSMaxDuring the highest while it was held, RSSGrowth the difference.
	RSSBefore    int64 `json:"rss_before_bytes"`
	RSSMaxDuring int64 `json:"rss_max_during_bytes"`
	RSSGrowth    int64 `json:"rss_growth_bytes"`
	// CatchUpS runs from the release to the last commit.
	CatchUpS float64 `json:"catch_up_s"`
}

// RSSPoint is the highest VmRSS sampled in one second of a run.
type RSSPoint struct {
	TS  int   `json:"t_s"` // seconds after the first scheduled send
	RSS int64 `json:"rss_bytes"`
}

// tableLock holds an ACCESS EXCLUSIVE lock on a table from a time on, for a
// while, on a connection of its own.
type tableLock struct {
	cancel      context.CancelFunc
	done        chan struct{}
	err         error     // valid after done
	taken, held time.Time // when the lock was granted and released
}

// lockTable connects now (so that connecting does not delay the lock) and
// from at on holds an ACCESS EXCLUSIVE lock on table for d, then rolls back.
// The lock waits for a COPY in progress to finish, as any locker would.
func (b *bencher) lockTable(ctx context.Context, table string, at time.Time, d time.Duration) (*tableLock, error) {
	conn, err := pgx.Connect(ctx, b.cfg.Postgres.URL)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to lock %s: %w", table, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &tableLock{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
		l.err = l.hold(ctx, conn, table, at, d)
	}()
	return l, nil
}

func (l *tableLock) hold(ctx context.Context, conn *pgx.Conn, table string, at time.Time, d time.Duration) error {
	if err := sleepCtx(ctx, time.Until(at)); err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("bench: lock %s: %w", table, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		return fmt.Errorf("bench: lock %s: %w", table, err)
	}
	l.taken = time.Now()
	err = sleepCtx(ctx, d)
	if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && err == nil {
		err = fmt.Errorf("bench: unlock %s: %w", table, rerr)
	}
	l.held = time.Now()
	return err
}

// wait returns once the lock has been released (or could not be taken).
func (l *tableLock) wait() error {
	<-l.done
	l.cancel()
	return l.err
}

// result relates the RSS samples to the lock; start is the first scheduled
// send and last the last commit.
func (l *tableLock) result(samples []rssSample, start, last time.Time) *LockResult {
	r := &LockResult{AtS: l.taken.Sub(start).Seconds(), HeldS: l.held.Sub(l.taken).Seconds(),
		CatchUpS: max(0, last.Sub(l.held).Seconds())}
	for _, s := range samples {
		switch {
		case !s.at.After(l.taken):
			r.RSSBefore = s.rss
		case !s.at.After(l.held):
			r.RSSMaxDuring = max(r.RSSMaxDuring, s.rss)
		}
	}
	r.RSSGrowth = r.RSSMaxDuring - r.RSSBefore
	return r
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type rssSample struct {
	at  time.Time
	rss int64
}

// rssSampler reads a process's VmRSS every interval until stopped.
type rssSampler struct {
	stopc   chan struct{}
	once    sync.Once
	done    chan struct{}
	samples []rssSample // owned by the sampling goroutine until done
}

func sampleRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if kb, ok := procStatusKB(pid, "VmRSS:"); ok {
				s.samples = append(s.samples, rssSample{time.Now(), kb << 10})
			}
			select {
			case <-t.C:
			case <-s.stopc:
				return
			}
		}
	}()
	return s
}

// stop ends the sampling and returns the samples.
func (s *rssSampler) stop() []rssSample {
	s.once.Do(func() { close(s.stopc) })
	<-s.done
	return s.samples
}

// perSecond keeps the highest sample of each second after start (samples
// before start count in second 0).
func perSecond(samples []rssSample, start time.Time) []RSSPoint {
	var out []RSSPoint
	for _, s := range samples {
		ts := max(0, int(s.at.Sub(start)/time.Second))
		if n := len(out); n > 0 && out[n-1].TS == ts {
			out[n-1].RSS = max(out[n-1].RSS, s.rss)
			continue
		}
		out = append(out, RSSPoint{TS: ts, RSS: s.rss})
	}
	return out
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

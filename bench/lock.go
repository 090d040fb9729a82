package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// LockResult is what happened around the table lock of Options.LockFor.
// The RSS figures are the engine's VmRSS, sampled every 250 ms, and the
// RSSAnon ones its RssAnon in the same samples (its own memory, without
// the executable's pages; see MemPeaks); 0 where /proc has no RssAnon.
type LockResult struct {
	AtS   float64 `json:"at_s"`   // lock taken, seconds after the first scheduled send
	HeldS float64 `json:"held_s"` // how long it was held
	// RSSBefore is sampled as the lock is granted, RSSMaxDuring is the
	// highest sample from then to the release (one is taken at each end,
	// the last just before the release, while the lock is still held),
	// RSSGrowth the difference; RSSMaxCatchUp is the highest from the
	// release until the catch-up is over.
	RSSBefore     int64 `json:"rss_before_bytes"`
	RSSMaxDuring  int64 `json:"rss_max_during_bytes"`
	RSSGrowth     int64 `json:"rss_growth_bytes"`
	RSSMaxCatchUp int64 `json:"rss_max_catch_up_bytes"`
	// The same of RssAnon.
	RSSAnonBefore     int64 `json:"rss_anon_before_bytes,omitempty"`
	RSSAnonMaxDuring  int64 `json:"rss_anon_max_during_bytes,omitempty"`
	RSSAnonGrowth     int64 `json:"rss_anon_growth_bytes,omitempty"`
	RSSAnonMaxCatchUp int64 `json:"rss_anon_max_catch_up_bytes,omitempty"`
	// CatchUpS runs from the release until every event scheduled before
	// it is committed.
	CatchUpS float64 `json:"catch_up_s"`
}

// minLockFor is the shortest lock Options accepts: the sampler needs a few
// samples inside it.
const minLockFor = time.Second

// RSSPoint is the highest VmRSS, and the highest RssAnon, sampled in one
// second of a run.
type RSSPoint struct {
	TS   int   `json:"t_s"` // seconds after the first scheduled send
	RSS  int64 `json:"rss_bytes"`
	Anon int64 `json:"rss_anon_bytes,omitempty"` // 0 where /proc has no RssAnon
}

// tableLock holds an ACCESS EXCLUSIVE lock on a table from a time on, for a
// while, on a connection of its own.
type tableLock struct {
	cancel      context.CancelFunc
	at          chan time.Time // when to take the lock; see start
	done        chan struct{}
	err         error     // valid after done
	taken, held time.Time // when the lock was granted and released; valid after done
	mark        func()    // called as the lock is granted, just before it is released, and just after
}

// lockTable connects now (so that connecting does not delay the lock) and,
// from the time start gives on, holds an ACCESS EXCLUSIVE lock on table for
// d, then rolls back; mark runs as the lock is granted, while it is still
// held just before the rollback releases it, and once after (the
// catch-up's first sample). The lock waits for a COPY in progress to finish, as any locker
// would. If the lock fails, fail is called with the error (to stop the
// publisher).
func (b *bencher) lockTable(ctx context.Context, table string, d time.Duration, mark func(), fail func(error)) (*tableLock, error) {
	conn, err := pgx.Connect(ctx, b.cfg.Postgres.URL)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to lock %s: %w", table, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &tableLock{cancel: cancel, at: make(chan time.Time, 1), done: make(chan struct{}), mark: mark}
	go func() {
		defer close(l.done)
		defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
		if l.err = l.hold(ctx, conn, table, d); l.err != nil && ctx.Err() == nil {
			fail(l.err)
		}
	}()
	return l, nil
}

// start sets when to take the lock (the first scheduled send + LockAt);
// call it once. It does not block.
func (l *tableLock) start(at time.Time) {
	select {
	case l.at <- at:
	default:
	}
}

func (l *tableLock) hold(ctx context.Context, conn *pgx.Conn, table string, d time.Duration) error {
	var at time.Time
	select {
	case at = <-l.at:
	case <-ctx.Done():
		return ctx.Err()
	}
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
	l.mark()
	err = sleepCtx(ctx, d)
	// The closing sample is taken while the lock is still held, so that
	// result counts it in RSSMaxDuring (at or before held), not in the
	// catch-up.
	l.mark()
	if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && err == nil {
		err = fmt.Errorf("bench: unlock %s: %w", table, rerr)
	}
	l.held = time.Now()
	// And one as the catch-up begins, so that a catch-up shorter than the
	// sampling interval has its sample too.
	l.mark()
	return err
}

// wait returns once the lock has been released (or could not be taken).
func (l *tableLock) wait() error {
	<-l.done
	l.cancel()
	return l.err
}

// result relates the RSS samples to the lock: start is the first scheduled
// send, caughtUp the commit of the last event scheduled before the release.
func (l *tableLock) result(samples []rssSample, start, caughtUp time.Time) *LockResult {
	r := &LockResult{AtS: l.taken.Sub(start).Seconds(), HeldS: l.held.Sub(l.taken).Seconds(),
		CatchUpS: max(0, caughtUp.Sub(l.held).Seconds())}
	first := true
	for _, s := range samples {
		switch {
		case s.at.Before(l.taken):
		case !s.at.After(l.held):
			if first {
				// the sample taken as the lock was granted
				r.RSSBefore, r.RSSAnonBefore, first = s.rss, s.anon, false
			}
			r.RSSMaxDuring = max(r.RSSMaxDuring, s.rss)
			r.RSSAnonMaxDuring = max(r.RSSAnonMaxDuring, s.anon)
		case !s.at.After(caughtUp):
			r.RSSMaxCatchUp = max(r.RSSMaxCatchUp, s.rss)
			r.RSSAnonMaxCatchUp = max(r.RSSAnonMaxCatchUp, s.anon)
		}
	}
	r.RSSGrowth = r.RSSMaxDuring - r.RSSBefore
	r.RSSAnonGrowth = r.RSSAnonMaxDuring - r.RSSAnonBefore
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

package sink

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsink/jetsink/pipeline"
)

// An instance that cannot reach PostgreSQL would otherwise hold every
// event it can take (HoldRows, kept alive by InProgress) for as long as
// the outage lasts, and other instances of the same durable would get
// none of them. The sink tells reaching the server from being answered by
// it:
//
//	REACHABLE --reach failure--> FAILING(t0) --ReleaseAfter, no answer,--> AWAY
//	    ^                            |          a probe failed too          |
//	    +--- any answer, a probe ----+------- any answer, or a probe -------+
//
// A reach failure (cannotReach) is a connect that failed, whatever the
// cause (nothing listening, a refused login, too many connections, a
// server starting up), or a connection lost without an answer. Any other
// outcome of an attempt is an answer: the server is there (a lock
// timeout, a data error, a commit). A connect that succeeds is not one: a
// pooler accepts connects while its server is down. FAILING is today's
// behaviour: the batches are retried and held with InProgress. AWAY:
// the batcher and the committers give back what they hold that may be
// given back (releasable), nak'ed with releaseNakDelay, and nak the rows
// that still come; Away tells the consumer to stop pulling. The watcher
// (run.watchReach) probes once before going away (the attempt under way
// may wait for a lock on a connection that reached the server), then
// every max(Retry.Max, 1s), on a fresh connection (probeReach: the admin
// connection may still be alive), and any answer (a commit elsewhere, the
// probe) ends FAILING or AWAY.

// releaseNakDelay is the delay of the nak that gives an event back: it
// keeps this instance's pulls still open from taking it straight back.
const releaseNakDelay = 2 * time.Second

// reachTick is how often the watcher looks at the stamps. A variable for
// the tests.
var reachTick = time.Second

// reachTicks gives the watcher its ticks, every reachTick, and stops
// them. A variable for the tests, which give them one by one.
var reachTicks = func() (<-chan time.Time, func()) {
	t := time.NewTicker(reachTick)
	return t.C, t.Stop
}

// errReleased is commitRetry's answer when it gave its batch back (see
// committer.giveBack); process returns it and loop takes it as done.
var errReleased = errors.New("sink: batch given back while postgres is unreachable")

// reachState is one state of Away: replaced, never changed, at each
// switch, when changed is cancelled.
type reachState struct {
	away    bool
	since   time.Time // when AWAY began
	lastErr string    // the last reach failure when AWAY began
	// released is Stats.Released when AWAY began.
	released uint64
	changed  context.Context
	cancel   context.CancelFunc
}

// reachNow returns the current reach state, made on first use.
func (s *Sink) reachNow() *reachState {
	if st := s.reach.Load(); st != nil {
		return st
	}
	s.reachMu.Lock()
	defer s.reachMu.Unlock()
	if st := s.reach.Load(); st != nil {
		return st
	}
	st := &reachState{}
	st.changed, st.cancel = context.WithCancel(context.Background())
	s.reach.Store(st)
	return st
}

// Away reports whether the sink has given up reaching PostgreSQL for now
// (Config.ReleaseAfter without an answer): it gives back the events it
// holds and those that still come, and a consumer should stop pulling
// until it is no longer away. changed is closed at the next switch, either
// way, so that a caller can wait on it. Never away with ReleaseAfter 0,
// nor outside Run (a Run that ends ends being away). Safe for concurrent
// use, and cheap.
func (s *Sink) Away() (away bool, changed <-chan struct{}) {
	st := s.reachNow()
	return st.away, st.changed.Done()
}

// isAway reports whether the sink is away (see Away).
func (s *Sink) isAway() bool {
	st := s.reach.Load()
	return st != nil && st.away
}

// switchReach makes the state away (or not) if it is not already, and
// returns the state it replaced (nil: no switch).
func (s *Sink) switchReach(away bool, now time.Time, lastErr string) *reachState {
	s.reachNow()
	s.reachMu.Lock()
	defer s.reachMu.Unlock()
	old := s.reach.Load()
	if old.away == away {
		return nil
	}
	st := &reachState{away: away, since: now, lastErr: lastErr, released: s.st.released.Load()}
	st.changed, st.cancel = context.WithCancel(context.Background())
	s.reach.Store(st)
	old.cancel()
	return old
}

// cannotReach reports whether err, an attempt's, shows that the server
// could not be reached: a failed connect, whatever the cause (the sink's
// connectError, or pgx's ConnectError), or a connection lost with no
// answer (lostConn: a network error, a closed connection, a pooler's
// class 08, the dead-connection watchdog). Not a standby's lag
// (unreplicatedError: the primary answered), nor a lookup that failed
// after its COMMIT (lookupError, whatever cut it: the server answered the
// COMMIT), nor any answer of the server's on a live connection.
func cannotReach(err error) bool {
	if _, ok := errors.AsType[*unreplicatedError](err); ok {
		return false
	}
	if _, ok := errors.AsType[*lookupError](err); ok {
		return false
	}
	if _, ok := errors.AsType[*connectError](err); ok {
		return true
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	return lostConn(err)
}

// noteReach records the outcome of an attempt that ended at at: a reach
// failure starts (or goes on with) a run of them, unreachableSince; any
// answer stamps lastReached and ends AWAY. An attempt given up because
// the run ends (context.Canceled) shows nothing.
//
// A run starts where its first failed connect began (connectError.began),
// not where it ended: the server gave no answer from then on, and a dial
// whose packets are dropped ends up to connect_timeout per host later,
// which unreachable_for (and ReleaseAfter's count) would leave out. Never
// before the last answer, though. A connection lost with no answer
// starts it at the loss (at): when the server last answered on it is
// not known, and the attempt may have waited minutes for a lock.
func (s *Sink) noteReach(err error, at time.Time) {
	if s.cfg.ReleaseAfter <= 0 {
		return
	}
	t := s.stamp(at)
	if err != nil && errors.Is(err, context.Canceled) {
		// Given up because the run ends: no word on the server (a
		// probe cut by shutdown counted as a failure, and could send
		// the sink away as it stopped).
		return
	}
	if err != nil && cannotReach(err) {
		start := t
		if ce, ok := errors.AsType[*connectError](err); ok && !ce.began.IsZero() {
			start = min(t, s.stamp(ce.began))
		}
		msg := err.Error()
		s.reachErr.Store(&msg)
		// Counted before the run it may begin is stamped, so that a
		// concurrent failure counted after the run began counts in it
		// (one racing the stamp may count in the run before: a line's
		// count, not a budget).
		n := s.reachFails.Add(1)
		for {
			old := s.unreachableSince.Load()
			last := s.lastReached.Load()
			if t <= last {
				return // ended before the last answer
			}
			start := start
			if start <= last {
				// A connect begun before the last answer says nothing
				// of the time after it: from its end, as before a288e76
				// (else one that outlasted ReleaseAfter sent the sink
				// away at once, right after a commit).
				start = t
			}
			if old != 0 && old > last {
				// A run under way since old: one that began before it
				// (a long dial) moves its start back.
				if start >= old || s.unreachableSince.CompareAndSwap(old, start) {
					return
				}
				continue
			}
			if s.unreachableSince.CompareAndSwap(old, start) {
				s.reachFailsAt.Store(n - 1)
				return
			}
		}
	}
	s.reached(t)
}

// reached stamps lastReached with t (an answer) and ends AWAY.
func (s *Sink) reached(t int64) {
	// The run of failures that the answer ends, read before lastReached is
	// stamped: a failure after the answer begins a new run.
	runStart, failsAt := s.unreachableSince.Load(), s.reachFailsAt.Load()
	for {
		old := s.lastReached.Load()
		if old >= t || s.lastReached.CompareAndSwap(old, t) {
			break
		}
	}
	if s.isAway() {
		now := time.Now()
		if old := s.switchReach(false, now, ""); old != nil {
			// The batches that failed while it could not be reached are
			// given back: a server that answers again is not one failing
			// every batch, and an instance left with nothing to commit
			// (its events taken by another meanwhile) stayed not ready
			// until a batch of its own committed, on a quiet stream for
			// good. Only a run of failures that began with the attempts
			// that could not reach it (one of the table's kind under way
			// before stays until answered), and not one a committer
			// began since (the CAS).
			if since := s.refusedSince.Load(); since != 0 && since >= s.unreachableSince.Load() {
				s.refusedSince.CompareAndSwap(since, 0)
			}
			// Both lengths: the outage began at the first attempt that
			// could not reach it (unreachable_for: where a connect began,
			// where a connection was lost; see noteReach), ReleaseAfter and a
			// failed probe before the events were given back and the
			// pulls paused (paused_for); an operator comparing the line
			// with PostgreSQL's own log wants the first.
			args := []any{"unreachable_for", time.Duration(s.stamp(now) - runStart).Round(time.Millisecond),
				"failed_attempts", s.reachFails.Load() - failsAt,
				"paused_for", now.Sub(old.since).Round(time.Millisecond), "released", s.st.released.Load() - old.released}
			s.log.Info("postgres answers again; taking events again", args...)
		}
	}
}

// unreachableFor is how long attempts have failed to reach the server
// with no answer since (0: they do not), and the last such failure.
func (s *Sink) unreachableFor(now time.Time) (time.Duration, string) {
	since := s.unreachableSince.Load()
	if since == 0 || since <= s.lastReached.Load() {
		return 0, ""
	}
	msg := "an error"
	if p := s.reachErr.Load(); p != nil {
		msg = *p
	}
	return time.Duration(s.stamp(now) - since), msg
}

// goAway makes the sink AWAY, as attempts have not reached the server for
// d (ReleaseAfter or more) with no answer since, msg the last failure; it
// reports whether it did and the sink is still AWAY. An answer may land
// between the caller's unreachableFor and the switch: its reached saw the
// sink not away yet and did nothing. So the stamps are read again after
// the switch, which undoes it if they show an answer: reached stores
// lastReached before it loads the state, goAway stores the state before it
// loads lastReached, and with sequentially consistent atomics one of them
// sees the other's store.
func (s *Sink) goAway(now time.Time, d time.Duration, msg string) bool {
	if s.switchReach(true, now, msg) == nil {
		return false
	}
	if d, _ := s.unreachableFor(time.Now()); d == 0 {
		if s.switchReach(false, time.Now(), "") != nil {
			s.log.Debug("postgres answered as the sink went away; taking events still")
		}
		return false
	}
	return true
}

// watchReach is Run's watcher, until stop is closed or ctx ends: once the
// server has not been reached for ReleaseAfter, with no answer since, it
// probes it (probeReach) and makes the sink AWAY only if the probe fails
// too: the attempts that failed may be over, and the one under way may be
// waiting for a lock on a connection that reached the server (a connect
// refused while PostgreSQL restarted, then a long wait behind a CREATE
// INDEX), which no stamp shows. An answer ends the run of failures
// (reached). While AWAY it probes every max(Retry.Max, 1s) (rounded up
// to a whole tick, reachTick), an answer ending AWAY. A probe takes up
// to dialMax (a network that drops the packets), which delays going away
// by as much. When it returns (Run
// ends), the sink is not AWAY, and its probe has ended.
func (r *run) watchReach(ctx context.Context, stop <-chan struct{}) {
	s := r.s
	ctx, cancel := context.WithCancel(ctx)
	probed := make(chan error, 1) // the probe's answer; one probe at a time
	probing := false
	defer func() {
		cancel()
		if probing {
			<-probed
		}
		if old := s.switchReach(false, time.Now(), ""); old != nil {
			s.log.Debug("run ended while postgres was unreachable", "paused_for", time.Since(old.since).Round(time.Millisecond))
		}
	}()
	ticks, stopTicks := reachTicks()
	defer stopTicks()
	// While AWAY a probe is due every probeEvery, counted in ticks from
	// the one the last probe began at (or the first one), not timed:
	// a time read after a tick is a hair past it, and a probe due
	// probeEvery after it missed the tick that came then (every 2 s, not
	// every 1 s, with Retry.Max 1 s).
	probeEvery := max(s.cfg.Retry.Max, time.Second)
	probeTicks := int((probeEvery + reachTick - 1) / reachTick)
	ticksLeft := 0
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-ticks:
			ticksLeft--
		case err := <-probed:
			probing = false
			now := time.Now()
			if err == nil {
				s.reached(s.stamp(now))
				continue
			}
			// A failed probe is a failed attempt as a committer's is:
			// counted in the run (failed_attempts), its error the last.
			// The committers may have stopped trying (their batches given
			// back), and a long outage counted only their attempts before
			// it went away. (One that the server answered, a ping refused
			// on a live connection, ends the run as any answer does.)
			s.noteReach(err, now)
			if s.isAway() {
				continue
			}
			// The probe failed too: away, unless an answer came
			// meanwhile.
			d, msg := s.unreachableFor(now)
			if d < s.cfg.ReleaseAfter {
				continue
			}
			if s.goAway(now, d, msg) {
				s.log.Warn("postgres has been unreachable too long; giving back the events held here (nak'ed) "+
					"and pulling none until it answers",
					"unreachable_for", d.Round(time.Millisecond), "err", msg, "held", r.heldRows())
			}
			continue
		}
		now := time.Now()
		if !s.isAway() {
			if d, _ := s.unreachableFor(now); d < s.cfg.ReleaseAfter || probing {
				continue
			}
			// Ask the server before going away (see above).
			probing, ticksLeft = true, probeTicks
			go func() { probed <- s.probeReach(ctx) }()
			continue
		}
		if !probing && ticksLeft <= 0 {
			probing, ticksLeft = true, probeTicks
			go func() { probed <- s.probeReach(ctx) }()
		}
	}
}

// probeReach connects to the server on a connection of its own and pings
// it, bounded by dialMax: nil if it answers. Not on the admin connection
// (Ping): that one may still be alive while no new connection is let in
// (53300), and the committers need new ones.
func (s *Sink) probeReach(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.dialMax)
	defer cancel()
	return s.connectPing(ctx)
}

// heldRows counts the unsettled rows of every batch (the carry's too).
func (r *run) heldRows() int {
	n := 0
	count := func(b *batch) {
		b.mu.Lock()
		n += len(b.rows) - b.lo
		b.mu.Unlock()
	}
	for _, b := range r.all {
		count(b)
	}
	r.spareMu.Lock()
	defer r.spareMu.Unlock()
	for b := range r.spares {
		count(b)
	}
	return n
}

// releasable reports whether row, unsettled, may be given back (nak'ed):
// its event was taken in the current epoch (a nak of a row of an earlier
// one would land on the new stream's event with the same sequence, and
// the row itself would be lost: nothing delivers it again), it is not on
// its last delivery (JetStream counts the redelivery a nak brings, and
// the next would be past max_deliver: dead-lettered for an outage), and
// it has a message. The caller holds the epoch (Epochs.Hold).
func (s *Sink) releasable(row *pipeline.Row, epoch uint64) bool {
	return row.Event.Msg != nil && row.Event.Epoch == epoch &&
		(s.cfg.MaxDeliver <= 0 || int64(row.Event.Delivered) < int64(s.cfg.MaxDeliver))
}

// nakReleased gives row's event back: nak'ed with releaseNakDelay, its
// life in the process ended (outcome "released"). The caller holds the
// epoch. A nak that fails is counted; the event comes back after
// ack_wait.
func (s *Sink) nakReleased(row *pipeline.Row) {
	err := row.Event.Msg.NakWithDelay(releaseNakDelay)
	s.st.released.Add(1)
	if err != nil {
		s.st.releaseErrs.Add(1)
		s.log.Log(context.Background(), warnEvery(&s.releaseWarned), "nak failed as the event was given back; JetStream delivers it again after ack_wait",
			"stream_seq", row.Event.StreamSeq, "err", err)
	}
	row.Event.End("released", err)
}

// releaseRows gives back the rows of b, the batcher's (none settled),
// that may be given back, keeping the others in b, in order. It returns
// how many it gave back.
func (r *run) releaseRows(b *batch) int {
	s := r.s
	b.mu.Lock()
	defer b.mu.Unlock()
	epoch := s.epochs.Hold()
	defer s.epochs.Release()
	kept, n := b.lo, 0
	for i := b.lo; i < len(b.rows); i++ {
		row := &b.rows[i]
		if !s.releasable(row, epoch) {
			if kept != i {
				b.rows[kept] = *row
			}
			kept++
			continue
		}
		s.nakReleased(row)
		b.bytes -= len(row.Tuple)
		pipeline.ReleaseRows(b.rows[i : i+1])
		n++
	}
	clear(b.rows[kept:])
	b.rows = b.rows[:kept]
	if kept == 0 {
		b.lo, b.bytes = 0, 0
		b.since, b.due = time.Time{}, time.Time{}
	}
	return n
}

// giveBack gives back rows[lo:] of b, the committer's, all of them or none
// (false: one may not be given back, or, at-least-once, a commit of the
// batch had an unknown outcome: its rows may be stored, and would be
// stored again). They are marked settled first, so that the heartbeat
// sends no more InProgress for them.
func (c *committer) giveBack(b *batch, lo int) bool {
	s := c.s
	if c.unknown && s.cfg.Mode != ExactlyOnce {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	epoch := s.epochs.Hold()
	defer s.epochs.Release()
	rows := b.rows[lo:]
	for i := range rows {
		if !s.releasable(&rows[i], epoch) {
			return false
		}
	}
	b.lo = len(b.rows)
	for i := range rows {
		s.nakReleased(&rows[i])
	}
	return true
}

// releasing reports whether the committer gave its batch back (see
// giveBack): the sink is AWAY, and commitRetry is at process's main
// attempt (c.rel).
func (c *committer) releasing() bool {
	return c.rel.b != nil && c.s.isAway() && c.giveBack(c.rel.b, c.rel.lo)
}

// sleepReach waits d, or until ctx ends (its error), or until the sink
// goes AWAY or comes back (woke).
func (s *Sink) sleepReach(ctx context.Context, d time.Duration) (woke bool, err error) {
	changed := s.reachNow().changed
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return false, nil
	case <-changed.Done():
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// awayRound is one turn of the batcher while the sink is away (see Away):
// it gives back what the held batches and the open one b hold that may be
// given back (a held batch left empty is dropped), tops b up with the rows
// waiting and gives those back too, then waits for more rows, or for
// changed to end. It claims no committer and hands nothing over. Rows that
// may not be given back stay in b; a b full of them is held as a stall
// holds it, up to HoldRows, and past that nothing more is taken until the
// sink comes back. It returns ringq.ErrClosed once the Source is closed and
// drained.
func (r *run) awayRound(ctx context.Context, b **batch, held *[]*batch, heldRows *int, changed context.Context) error {
	cfg := &r.s.cfg.Batch
	kept := (*held)[:0]
	*heldRows = 0
	for _, h := range *held {
		r.releaseRows(h)
		if len(h.rows) == 0 {
			r.release(h)
			continue
		}
		kept = append(kept, h)
		*heldRows += len(h.rows)
	}
	clear((*held)[len(kept):])
	*held = kept
	for {
		full := r.top(*b, cfg)
		if r.releaseRows(*b) > 0 || !full {
			if full {
				continue // room again: top it up
			}
			break
		}
		// Full of rows that may not be given back.
		if *heldRows+len((*b).rows) <= r.s.holdRows() && r.holdAfter > 0 {
			*held = append(*held, *b)
			*heldRows += len((*b).rows)
			var ok bool
			if *b, ok = r.tryTake(); !ok {
				*b = r.newSpare()
			}
			continue
		}
		select {
		case <-changed.Done():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return r.wait(ctx, time.Time{}, -1, r.room(*b), changed)
}

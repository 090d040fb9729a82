package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
)

// carrySize is how many rows the batcher pops from the Source at once.
// Popped rows wait in the carry until they fit into a batch, so that
// max_rows and max_bytes are exact.
const carrySize = 256

// batchStart is the room for rows a batch starts with (at most max_rows):
// fill doubles it as rows come, up to max_rows, and the batch keeps what it
// grew to. max_rows may be up to 1<<20 while the rows in flight
// (max_ack_pending) are usually far fewer: Connections+1 batches of
// max_rows made up front would reserve ~240 MiB each, most of it never
// used.
const batchStart = 1024

// batch is a set of rows committed in one transaction. Batch objects are
// reused: Connections+1 of them circulate between the batcher (one open
// batch) and the committers (one each), plus the carry.
type batch struct {
	mu    sync.Mutex     // guards rows, lo, since and due against the heartbeat
	rows  []pipeline.Row // grown by fill up to max_rows (see batchStart), past it by absorb
	lo    int            // rows[:lo] are settled (acked, dead-lettered or given up); settlement is a prefix
	bytes int            // sum of len(Tuple) of rows
	since time.Time      // when JetStream delivered its oldest row; zero when empty
	due   time.Time      // when the heartbeat next sends InProgress for the rows

	deadline time.Time // batcher only: since + max_delay
	spare    bool      // made to hold rows during a stall; dropped after its commit

	// mayBeStored: a commit of its rows had an unknown outcome, so a row
	// given up may be stored already. Its committer's (committer.unknown,
	// kept here when process returns), it goes with the batch to the next
	// process call: a hand-off (errHandOff), a hold that takes it in.
	mayBeStored bool
}

// lingerEnd is when b, not full, stops waiting for a free committer: when
// its oldest row has been in jetsink for min_delay, or, while any other
// committer is busy, for overlap_delay if that is longer (see
// BatchConfig.OverlapDelay); at most max_delay.
func (b *batch) lingerEnd(cfg *BatchConfig, busy bool) time.Time {
	d := cfg.MinDelay
	if busy {
		d = max(d, cfg.OverlapDelay)
	}
	return b.since.Add(min(d, cfg.MaxDelay))
}

// settledTo records that rows[:hi] are settled (acked, dead-lettered, or
// given up), so that the heartbeat stops sending InProgress for them.
func (b *batch) settledTo(hi int) {
	b.mu.Lock()
	b.lo = hi
	b.mu.Unlock()
}

// reset empties the batch and gives its rows' tuples back to the workers
// (pipeline.ReleaseRows): nothing reads them after this.
func (b *batch) reset() {
	b.mu.Lock()
	pipeline.ReleaseRows(b.rows)
	clear(b.rows)
	b.rows = b.rows[:0]
	b.lo, b.bytes = 0, 0
	b.since, b.due = time.Time{}, time.Time{}
	b.mayBeStored = false
	b.mu.Unlock()
}

// absorb moves o's rows, none settled, to the end of b, and leaves o
// empty, to be released: a committer holding b for a suspect row takes
// them in (committer.holdWait). The rows stay unsettled and under the
// heartbeat, now b's. b may grow past max_rows; shrink gives that back.
func (b *batch) absorb(o *batch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b.mu.Lock()
	b.rows = append(b.rows, o.rows[o.lo:]...)
	b.bytes += o.bytes
	if !o.since.IsZero() && (b.since.IsZero() || o.since.Before(b.since)) {
		b.since = o.since
	}
	if !o.due.IsZero() && (b.due.IsZero() || o.due.Before(b.due)) {
		b.due = o.due
	}
	b.mu.Unlock()
	clear(o.rows) // moved, not released: b's now
	o.rows = o.rows[:0]
	o.lo, o.bytes = 0, 0
	o.since, o.due = time.Time{}, time.Time{}
	o.mayBeStored = false
}

// dropSettled drops the settled rows of b, at most upto of them (the
// prefix rows[:lo]), giving their tuples back, and moves the rest to the
// front. It returns how many it dropped.
func (b *batch) dropSettled(upto int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(b.lo, upto)
	if n <= 0 {
		return 0
	}
	for i := range b.rows[:n] {
		b.bytes -= len(b.rows[i].Tuple)
	}
	pipeline.ReleaseRows(b.rows[:n])
	m := copy(b.rows, b.rows[n:])
	clear(b.rows[m:])
	b.rows = b.rows[:m]
	b.lo -= n
	return n
}

// shrink gives back the memory of an empty batch that absorb grew past
// maxRows: it starts again with batchStart rows of room. One that fill
// grew (up to maxRows) keeps its room, so that a drain's batches, full
// each time, grow once and are then reused.
func (b *batch) shrink(maxRows int) {
	if cap(b.rows) <= maxRows {
		return
	}
	b.mu.Lock()
	b.rows = make([]pipeline.Row, 0, min(maxRows, batchStart))
	b.mu.Unlock()
}

// reserve makes room in b for k more rows, at most up to maxRows: it
// doubles b's room (at least to what k needs), so that filling a batch to
// max_rows copies its rows a few times at most, and only while it first
// grows. The caller holds b.mu.
func (b *batch) reserve(k, maxRows int) {
	n := len(b.rows)
	if k <= 0 || n+k <= cap(b.rows) {
		return
	}
	grown := make([]pipeline.Row, n, min(max(2*cap(b.rows), n+k), max(maxRows, n+k)))
	copy(grown, b.rows)
	b.rows = grown
}

// run is the state of one Run call.
type run struct {
	s       *Sink
	src     Source
	work    chan *batch   // batcher -> committers; unbuffered so that a send means a committer took it
	ready   chan struct{} // committer -> batcher: one token per committer waiting for work
	free    chan *batch   // committers -> batcher: emptied batches
	carry   *batch        // rows popped and not yet in a batch (rows[lo:])
	all     []*batch      // the regular batches and the carry, for the heartbeat (fixed at start)
	spareMu sync.Mutex
	spares  map[*batch]struct{} // spare batches now in use, for the heartbeat
	// holdAfter is how long a cut batch waits for a committer before the
	// batcher treats it as a stall and starts spare batches: half of
	// InProgressEvery, so that rows taken in then get their first
	// InProgress well within ack_wait. 0 (no heartbeat): never.
	holdAfter time.Duration

	wakeMu sync.Mutex
	wake   context.CancelFunc // ends the batcher's wait for rows when a committer frees up

	// workMu orders a committer's hand-off (committer.handOff, under the
	// read lock) before the batcher's close of work (closeWork); workDone
	// is set then: a token left in ready after it is stale (its committer
	// got nil and returned).
	workMu   sync.RWMutex
	workDone atomic.Bool

	// strandMu guards working, stranded and strandChange. working counts
	// the batches handed to committers (hand) that they have not
	// finished with, but for those of stranded committers
	// (committer.strandLocked): ones that wait, in strandedWait, to retry rows
	// refused with a suspect error after the batcher is done. A
	// committer's attempts count, stranded or not. So working is 0 after
	// the batcher is done when every committer with a batch left waits
	// in strandedWait: nothing commits, and nothing will, to show that
	// the table takes rows. That is a state, not an event: it ends when
	// one of them tries its rows again (it counts then), and comes again
	// when that try has failed too. stranded holds those committers:
	// none gives its rows up while one of them has a try still to come
	// (triesToCome), that may commit. strandChange is closed, and
	// replaced, at each change of working once the batcher is done, to
	// wake the stranded committers to look again.
	strandMu     sync.Mutex
	working      int
	stranded     map[*committer]struct{}
	strandChange chan struct{}

	// warming counts the committers whose first connect has not ended;
	// grace ends the wait for them warmGrace after the first connected
	// (see Sink.Warmed).
	warming   atomic.Int32
	firstConn sync.Once
	grace     *time.Timer

	// recheck carries a committer's request to compare the mapping with
	// the table after a type guard refused its batch (see look); one
	// request waits at most.
	recheck chan struct{}

	// pings carries Ready's pings to an idle committer
	// (Sink.pingCommitter), each a buffered channel for the result; done
	// is closed once the committers have returned.
	pings chan chan error
	done  chan struct{}

	// staleLeft counts the rows a hard stop left unsettled whose stream
	// was re-created since they were taken (leaveStale), for Run's log.
	staleLeft atomic.Int64
}

// leaveStale counts the unsettled rows of b whose event's stream was
// re-created since it was taken (its epoch is not the current one), as a
// hard stop drops b's rows: JetStream delivers the others again after
// ack_wait, but nothing delivers these, whose old stream is gone. It ends
// the span of each unsettled row's message, so that the batch span's links
// to them resolve: "abandoned" (errAbandoned), or "stale" (errLeftStale)
// for these.
func (r *run) leaveStale(b *batch) {
	cur := r.s.epochs.Current()
	b.mu.Lock()
	for i := b.lo; i < len(b.rows); i++ {
		ev := &b.rows[i].Event
		if ev.Epoch != cur {
			r.staleLeft.Add(1)
			ev.EndSpan("stale", errLeftStale)
			continue
		}
		ev.EndSpan("abandoned", errAbandoned)
	}
	b.mu.Unlock()
}

// errAbandoned ends the span of a message a hard stop left unsettled.
var errAbandoned = errors.New("hard stop: left unsettled, not acked; JetStream delivers it again after ack_wait")

// errLeftStale ends the span of a message a hard stop left unsettled whose
// stream was re-created since it was taken: nothing delivers it again.
var errLeftStale = fmt.Errorf("hard stop: left unsettled, not acked, and nothing delivers it again: %w", pipeline.ErrStaleEpoch)

// warmGrace is how long, after the first committer has connected, the
// others' first connects are waited for (see Sink.Warmed).
const warmGrace = time.Second

// warmEnded records that a committer's first connect ended, connected or
// not.
func (r *run) warmEnded(connected bool) {
	if r.warming.Add(-1) == 0 {
		r.s.markWarmed()
		return
	}
	if connected {
		r.firstConn.Do(func() { r.grace = time.AfterFunc(warmGrace, r.s.markWarmed) })
	}
}

// closeWork closes work once the batcher is done, after any hand-off under
// way.
func (r *run) closeWork() {
	r.workMu.Lock()
	defer r.workMu.Unlock()
	r.workDone.Store(true)
	close(r.work)
}

// Run moves rows from src into the table until src reports closed
// (ringq.ErrClosed) and every popped row is committed and acked (or
// dead-lettered, or, refused with an error that a row or the table may
// cause while nothing else is left to commit, left unacked for JetStream to
// redeliver: Stats.GivenUp, see committer.strandedWait); then it returns
// nil. ctx is the hard context: cancelling
// it abandons uncommitted batches (their messages are not acked and will be
// redelivered) and Run returns ctx.Err(), after logging at Error how many
// of their rows no one will redeliver, their stream re-created since they
// were taken (see run.leaveStale). A Source error other than
// ringq.ErrClosed is returned as is, after the batches handed over are
// done. Database failures are never returned: they are retried until ctx
// ends. Without a DeadLetterer (New with nil) Run returns an error wrapping
// ErrInvalidConfig at once. Every goroutine Run starts has ended when it
// returns, and so has a connect of the admin connection that its look at
// the table started (it ends that connect: see Sink.endAdminDial). Run
// must not be called twice at once.
func (s *Sink) Run(ctx context.Context, src Source) error {
	defer s.markWarmed()
	if s.dl == nil {
		return fmt.Errorf("%w: sink: Run needs a dead-letterer (New was given nil)", ErrInvalidConfig)
	}
	n := s.cfg.Connections
	r := &run{
		s:       s,
		src:     src,
		work:    make(chan *batch),
		ready:   make(chan struct{}, n),
		free:    make(chan *batch, n+1),
		carry:   &batch{rows: make([]pipeline.Row, 0, carrySize)},
		spares:  map[*batch]struct{}{},
		pings:   make(chan chan error),
		done:    make(chan struct{}),
		recheck: make(chan struct{}, 1),

		stranded:     map[*committer]struct{}{},
		strandChange: make(chan struct{}),
	}
	s.running.Store(r)
	defer s.running.Store(nil)
	if s.cfg.HoldRows > 0 {
		r.holdAfter = s.cfg.InProgressEvery / 2
	}
	r.warming.Store(int32(n))
	r.all = append(r.all, r.carry)
	for range n + 1 {
		b := &batch{rows: make([]pipeline.Row, 0, min(s.cfg.Batch.MaxRows, batchStart))}
		r.all = append(r.all, b)
		r.free <- b
	}

	// The table's problems are looked for while the committers connect:
	// with the server far away, the look's dozen queries would otherwise
	// hold up the first batch. Under warmCtx: a look still dialing a
	// server that answers nothing must not hold up a stop once the
	// batches are handed over. The same goroutine looks again when a
	// committer asks (run.look), until the committers have returned.
	warmCtx, stopWarm := context.WithCancel(ctx)
	lookCtx, stopLook := context.WithCancel(ctx)
	var look sync.WaitGroup
	defer s.endAdminDial() // one the look (or a committer) gave up on
	defer look.Wait()
	defer stopLook()
	defer stopWarm()
	look.Go(func() { r.look(warmCtx, lookCtx) })
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		c := &committer{s: s, r: r, bo: backoff{initial: s.cfg.Retry.Initial, max: s.cfg.Retry.Max}, started: &s.attempts[i%len(s.attempts)]}
		wg.Go(func() { errs[i] = c.loop(ctx, warmCtx) })
	}
	stopBeat := make(chan struct{})
	var beatWG sync.WaitGroup
	if s.cfg.InProgressEvery > 0 {
		beatWG.Go(func() { r.heartbeat(ctx, stopBeat) })
	}
	if s.cfg.ReleaseAfter > 0 {
		beatWG.Go(func() { r.watchReach(ctx, stopBeat) })
	}

	err := r.batcher(ctx)
	stopWarm() // every batch is handed over: a committer still connecting has none
	wg.Wait()
	stopLook() // no committer asks for a look any more
	close(r.done)
	if r.grace != nil {
		r.grace.Stop()
	}
	close(stopBeat)
	beatWG.Wait()
	for _, e := range errs {
		if err == nil {
			err = e
		}
	}
	if ctx.Err() != nil {
		// A hard stop: the committers counted the rows of their batches
		// as they dropped them; the batcher's (open, held, the carry)
		// are left here.
		for _, b := range r.all {
			r.leaveStale(b)
		}
		r.spareMu.Lock()
		for b := range r.spares {
			r.leaveStale(b)
		}
		r.spareMu.Unlock()
		if n := r.staleLeft.Load(); n > 0 {
			s.log.Error("hard stop left rows uncommitted for events whose stream was re-created since they were taken; "+
				"nothing delivers those events again, so they are lost unless their old stream still holds them",
				"events", n)
		}
	}
	return err
}

// look is Run's look at the table (logProblems): once at the start, under
// warmCtx, bounded by 10 s or dialMax (long enough for a connect past a
// dead host of a failover list); then again whenever a committer asks
// (recheckTable, after a type guard refused its batch), until ctx ends,
// bounded by readTypesTimeout, until one has logged the table's problems
// (typesLogged). At most once per stillFailingEvery, counting the first
// look unless it found the table fitting (then the table has changed
// since, and a look says how): a look logs, and while looks fail (the
// server refuses the admin connection, 53300) each says that it cannot
// compare. The committers do not wait for it: a look waits for the admin
// connection (held by a StoredSeq, a Ping, a check of Init's) and may
// have to connect it.
func (r *run) look(warmCtx, ctx context.Context) {
	s := r.s
	var last time.Time // the last look that logged
	if found, err := s.logProblems(warmCtx, max(10*time.Second, s.dialMax)); found || err != nil {
		last = time.Now()
	}
	for {
		select {
		case <-r.recheck:
		case <-ctx.Done():
			return
		}
		if s.typesLogged.Load() || time.Since(last) < stillFailingEvery {
			continue
		}
		last = time.Now()
		if found, _ := s.logProblems(ctx, readTypesTimeout); found {
			s.typesLogged.Store(true) // said which columns, and how to fix them
		}
	}
}

// recheckTable asks Run's look (run.look) to compare the mapping with the
// table again, without waiting for it.
func (r *run) recheckTable() {
	select {
	case r.recheck <- struct{}{}:
	default: // asked already
	}
}

// logProblems compares the mapping with the table once, within limit, so
// that a table that does not fit is reported at the start, as the first
// batch fails on it, and one that may store other values than sent is
// reported at all. It reports whether it found (and logged) any that is
// not a warning, and Check's error (logged unless ctx has ended, with the
// warnings postgres.url alone gives). An unlogged table is logged once
// per sink, here or by a committer's read of its types, whichever sees it
// first (Sink.warnUnlogged).
func (s *Sink) logProblems(ctx context.Context, limit time.Duration) (found bool, err error) {
	stopped := ctx
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	probs, err := s.checkAll(ctx, false) // not a full scan of the table at every start
	if err != nil && stopped.Err() != nil {
		return false, err // stopping: nothing to report the table to
	}
	if err != nil {
		s.log.Warn("cannot compare the column mapping with the table yet", "err", err)
		// probs are what postgres.url alone says (URLProblems), warnings
		// that matter most now: a spoofed server refusing the login.
	}
	for _, p := range probs {
		if p.unloggedTable {
			s.typesMu.Lock()
			warn := s.warnUnlogged()
			s.typesMu.Unlock()
			if !warn {
				continue // logged already, by a committer's read or a look before
			}
		}
		level, headline := problemLine(p)
		s.log.Log(ctx, level, headline, "problem", p.Message, "fix", p.Fix)
		found = found || level == slog.LevelError
	}
	return found, err
}

// problemLine is the level and the log line of a problem Check found: the
// server's release and settings have their own (ProblemServerVersion,
// serverWarnings), the table's say the table.
func problemLine(p Problem) (slog.Level, string) {
	switch {
	case p.Kind == ProblemServerVersion && p.Warning:
		return slog.LevelWarn, "the PostgreSQL release is past its end of life and not tested with jetsink"
	case p.Kind == ProblemServerVersion:
		return slog.LevelError, "the PostgreSQL release is older than jetsink supports; the table was not checked"
	}
	if headline, ok := serverWarnings[p.Kind]; ok {
		return slog.LevelWarn, headline
	}
	if p.Warning {
		return slog.LevelWarn, "the table may not store every event as sent"
	}
	return slog.LevelError, "the table does not fit the column mapping"
}

// serverWarnings are the log lines of Check's warnings about the server
// and the connection settings, not the table.
var serverWarnings = map[ProblemKind]string{
	ProblemServerTimeout: "a limit of the server's may slow the batches down",
	ProblemAsyncCommit:   "a crash of PostgreSQL may lose events already acked",
	ProblemAsyncStandby:  "a failover of PostgreSQL may lose events already acked",
	ProblemUnlogged:      "a crash or failover of PostgreSQL may lose events already acked",
	ProblemHostList:      "connections may land on a standby",
	ProblemTLSUnverified: "the connection to PostgreSQL does not make sure of the server",
}

// batcher is the one goroutine that pops rows and cuts batches.
//
// The rule: a batch is handed to a committer as soon as one is free and no
// more rows are waiting, unless it lingers (min_delay; overlap_delay while
// another committer is busy; a full batch never lingers); it grows only
// while it lingers or every committer is busy, and it is cut (stops
// taking rows) when it reaches max_rows or max_bytes, or when max_delay
// has passed since JetStream delivered its oldest row. So an idle sink
// commits a single row at once, and a busy one commits big batches. A cut
// batch waits for the next free committer; meanwhile the rings fill:
// back-pressure. Only when it has waited for InProgressEvery/2 (since
// JetStream delivered its oldest row) does the batcher call it a stall:
// the batch joins the held queue (oldest first) as it is, and the batcher
// opens a spare batch and keeps taking rows, up to Config.HoldRows, so that
// the in-flight messages sit in batches the heartbeat keeps alive
// (InProgress) rather than in the rings, where nothing does. Past HoldRows
// it waits for a committer again. Holding only on a stall keeps a merely
// busy sink (a drain) from holding max_ack_pending rows in memory.
func (r *run) batcher(ctx context.Context) error {
	defer r.closeWork()
	cfg := &r.s.cfg.Batch
	var held []*batch // cut batches waiting for a committer, oldest first
	heldRows := 0     // rows in held
	b, err := r.take(ctx)
	if err != nil {
		return err
	}
	closed := false
	// handOldest gives a committer whose token was taken the oldest held
	// batch, or the open one (then a new one is opened).
	handOldest := func() error {
		if len(held) > 0 {
			next := held[0]
			held = append(held[:0], held[1:]...)
			heldRows -= len(next.rows)
			return r.hand(ctx, next)
		}
		if err := r.hand(ctx, b); err != nil {
			return err
		}
		b, err = r.take(ctx)
		return err
	}
	// hold queues b, cut and stalled, and opens another batch to take rows
	// into, where the heartbeat reaches them.
	hold := func() {
		held = append(held, b)
		heldRows += len(b.rows)
		var ok bool
		if b, ok = r.tryTake(); !ok {
			b = r.newSpare()
		}
	}
	for {
		// While postgres is unreachable (Away), what may be given back
		// is, and so are the rows that come; once the Source is closed
		// (a drain), the batches go to the committers, which give back
		// what they may.
		reach := r.s.reachNow()
		if reach.away && !closed {
			if err := r.awayRound(ctx, &b, &held, &heldRows, reach.changed); errors.Is(err, ringq.ErrClosed) {
				closed = true
			} else if err != nil {
				return err
			}
			continue
		}
		full := r.top(b, cfg)
		if len(held) == 0 && len(b.rows) == 0 {
			if closed {
				return nil
			}
			n, err := r.src.PopN(ctx, r.carry.rows[:r.room(b)])
			if errors.Is(err, ringq.ErrClosed) {
				closed = true
				continue
			}
			if err != nil {
				return err
			}
			r.setCarry(n)
			continue
		}
		now := time.Now()
		// min_delay: a batch that is not full waits until its oldest row
		// has been in jetsink that long before it takes a free committer;
		// overlap_delay, if longer, while another committer is busy (free
		// can only grow meanwhile: only the batcher takes tokens, but for
		// a committer retrying a refused row, which takes its own back
		// after a while: committer.holdWait; its batch then waits until
		// its deadline at most).
		free := len(r.ready)
		busy := free < r.s.cfg.Connections
		lingerEnd := b.lingerEnd(cfg, busy)
		linger := !full && !closed && len(held) == 0 && now.Before(lingerEnd)
		if !linger && r.claim() {
			if err := handOldest(); err != nil {
				return err
			}
			continue
		}
		// Every committer is busy, or b lingers. While batches are held
		// (a stall), b's max_delay does not cut it: no committer is free
		// to take it, and a trickle of rows would take a spare batch,
		// and later a transaction, each.
		cut := full || closed || (len(b.rows) > 0 && len(held) == 0 && !now.Before(b.deadline))
		canHold := cut && len(b.rows) > 0 && heldRows+len(b.rows) <= r.s.holdRows() && r.holdAfter > 0
		if canHold && (len(held) > 0 || !now.Before(b.since.Add(r.holdAfter))) {
			hold()
			continue
		}
		if cut || closed {
			// Nothing more to take in: wait for a committer, or until b
			// has waited long enough to count as a stall.
			if canHold {
				if stalled, err := r.awaitCommitter(ctx, b.since.Add(r.holdAfter).Sub(now), reach.changed); err != nil {
					return err
				} else if stalled {
					if r.s.reachNow() != reach {
						continue // gone away (or back): look again
					}
					// Hold b as it is: topping it up first could take
					// it past HoldRows, and then nothing would be held.
					hold()
					continue
				}
			} else {
				select {
				case <-r.ready:
				case <-reach.changed.Done():
					continue // away: give back what may be, and claim no committer
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if err := handOldest(); err != nil {
				return err
			}
			continue
		}
		// Wait for more rows, a free committer, or b's max_delay; while b
		// lingers, for more rows or the end of its linger, and while it
		// lingers for overlap_delay also for another committer to free
		// up (with none busy, min_delay applies).
		// (Woken by a free committer or a deadline, the loop looks again.)
		var until time.Time
		wakeAbove := -1 // no wake
		switch {
		case !linger:
			wakeAbove = 0 // claim failed: no committer was free
			if len(b.rows) > 0 && len(held) == 0 {
				until = b.deadline
			}
		case lingerEnd.After(b.lingerEnd(cfg, false)):
			// overlap_delay: its end comes sooner if the others free up.
			until, wakeAbove = lingerEnd, free
		default:
			until = lingerEnd
		}
		if err := r.wait(ctx, until, wakeAbove, r.room(b), reach.changed); errors.Is(err, ringq.ErrClosed) {
			closed = true
		} else if err != nil {
			return err
		}
	}
}

// wait pops up to n rows into the carry, blocking until some come, until
// (unless it is zero), until changed ends (the sink goes away or comes
// back: see Away), or, when wakeAbove >= 0, until more than wakeAbove
// committers are free (it registers a wake for that). It returns
// ringq.ErrClosed once the Source is closed and drained.
func (r *run) wait(ctx context.Context, until time.Time, wakeAbove, n int, changed context.Context) error {
	var wctx context.Context
	var cancel context.CancelFunc
	if until.IsZero() {
		wctx, cancel = context.WithCancel(ctx)
	} else {
		wctx, cancel = context.WithDeadline(ctx, until)
	}
	defer cancel()
	defer context.AfterFunc(changed, cancel)()
	if wakeAbove >= 0 {
		r.setWake(cancel)
		defer r.setWake(nil)
		if len(r.ready) > wakeAbove { // a committer freed up before the wake was set
			return nil
		}
	}
	n, err := r.src.PopN(wctx, r.carry.rows[:n])
	switch {
	case n > 0:
		r.setCarry(n)
		return nil
	case errors.Is(err, ringq.ErrClosed):
		return err
	case ctx.Err() != nil:
		return ctx.Err()
	case wctx.Err() != nil:
		return nil
	default:
		return err
	}
}

// room is how many rows to pop at most: what b can still take, so that the
// carry never holds rows that fit in no batch (which would take rows out of
// the Source beyond HoldRows and weaken back-pressure).
func (r *run) room(b *batch) int {
	return max(1, min(carrySize, r.s.cfg.Batch.MaxRows-len(b.rows)))
}

// awaitCommitter waits for a committer's token (false) or for d to pass
// (true: the open batch now counts as stalled), or for changed to end
// (true too: the caller looks at the sink's reach again, see Away).
func (r *run) awaitCommitter(ctx context.Context, d time.Duration, changed context.Context) (bool, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.ready:
		return false, nil
	case <-t.C:
		return true, nil
	case <-changed.Done():
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// hand gives b to the committer whose token was taken. b counts as
// working (see run.working) from before the send: a committer that learns
// that work is closed has seen every batch handed counted.
func (r *run) hand(ctx context.Context, b *batch) error {
	r.addWork(1)
	select {
	case r.work <- b:
		return nil
	case <-ctx.Done():
		r.addWork(-1)
		return ctx.Err()
	}
}

// finished records that a committer is done with a batch handed to it
// (see run.working).
func (r *run) finished() {
	r.addWork(-1)
}

// addWork adds dw to run.working.
func (r *run) addWork(dw int) {
	r.strandMu.Lock()
	r.addWorkLocked(dw)
	r.strandMu.Unlock()
}

// addWorkLocked is addWork under r.strandMu. Once the batcher is done, it
// wakes the stranded committers (strandChange) to look at the change.
func (r *run) addWorkLocked(dw int) {
	r.working += dw
	if r.workDone.Load() && dw != 0 {
		close(r.strandChange)
		r.strandChange = make(chan struct{})
	}
}

// allStranded reports, under r.strandMu, whether the batcher is done and
// every committer with a batch left is stranded (see run.working).
func (r *run) allStranded() bool {
	return r.workDone.Load() && r.working == 0
}

// triesToCome reports, under r.strandMu, whether a stranded committer has
// a try of its rows still to come once every one is stranded
// (committer.strandedWait): it has not had its last try, or the table
// has taken rows since its rows were refused. Their lastTry and
// suspectSeq change only while they are not stranded (suspectFrom,
// strandedWait after unstrandLocked): read here under r.strandMu, after
// their strandLocked, they are not written meanwhile.
func (r *run) triesToCome() bool {
	for c := range r.stranded {
		if !c.lastTry || c.tableTakesRows() {
			return true
		}
	}
	return false
}

// newSpare makes a batch to hold rows while every committer is busy; its
// committer drops it after the commit, so spare memory lasts as long as the
// stall.
func (r *run) newSpare() *batch {
	b := &batch{rows: make([]pipeline.Row, 0, min(r.s.cfg.Batch.MaxRows, carrySize)), spare: true}
	r.spareMu.Lock()
	r.spares[b] = struct{}{}
	r.spareMu.Unlock()
	return b
}

// release returns a committed batch: a regular one to the free list, a
// spare one to the garbage collector.
func (r *run) release(b *batch) {
	if !b.spare {
		r.free <- b // never blocks: Connections+1 slots
		return
	}
	r.spareMu.Lock()
	delete(r.spares, b)
	r.spareMu.Unlock()
}

// tryTake gets an empty batch if one is free now.
func (r *run) tryTake() (*batch, bool) {
	select {
	case b := <-r.free:
		return b, true
	default:
		return nil, false
	}
}

// claim takes a waiting committer's token without blocking.
func (r *run) claim() bool {
	select {
	case <-r.ready:
		return true
	default:
		return false
	}
}

// take gets an empty batch. One is always free or about to be: there are
// Connections+1 and each committer returns its batch before asking for work.
func (r *run) take(ctx context.Context) (*batch, error) {
	select {
	case b := <-r.free:
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (r *run) setWake(f context.CancelFunc) {
	r.wakeMu.Lock()
	r.wake = f
	r.wakeMu.Unlock()
}

// wakeBatcher ends the batcher's wait for rows, if it is waiting, so that it
// hands its open batch to the committer that just freed up. The committer
// sends its ready token first: either the batcher sees the token after
// registering its wake, or the committer sees the registered wake here.
func (r *run) wakeBatcher() {
	r.wakeMu.Lock()
	f := r.wake
	r.wake = nil
	r.wakeMu.Unlock()
	if f != nil {
		f()
	}
}

// setCarry records that n rows were popped into the carry.
func (r *run) setCarry(n int) {
	c := r.carry
	c.mu.Lock()
	c.rows = c.rows[:n]
	c.lo = 0
	// The heartbeat's clock starts when JetStream delivered the oldest of
	// these rows, not when they reached the sink: ack_wait runs from then.
	now := time.Now()
	var age time.Duration
	for i := range c.rows {
		// Received may have no monotonic reading (consumer/wire stamps
		// the wall clock): age is then measured on the wall clock, and a
		// clock step in between only moves the first beat (earlier, or
		// no earlier than now); since keeps now's monotonic reading.
		if rc := c.rows[i].Event.Received; !rc.IsZero() {
			age = max(age, now.Sub(rc))
		}
	}
	since := now.Add(-age)
	c.since, c.due = since, since.Add(r.s.cfg.InProgressEvery/2)
	c.mu.Unlock()
}

// top moves rows into b, from the carry and then from the Source without
// blocking, until b is full or no row is waiting. It reports whether b is
// full: max_rows reached, or the next row would pass max_bytes. A row larger
// than max_bytes goes alone into a batch.
func (r *run) top(b *batch, cfg *BatchConfig) bool {
	for {
		c := r.carry
		if c.lo == len(c.rows) {
			if len(c.rows) > 0 {
				c.reset()
			}
			if len(b.rows) >= cfg.MaxRows || b.bytes >= cfg.MaxBytes {
				return true
			}
			n := r.src.TryPopN(c.rows[:r.room(b)])
			if n == 0 {
				return false
			}
			r.setCarry(n)
		}
		if r.fill(b, cfg) {
			return true
		}
	}
}

// fill moves rows from the carry into b until the carry is empty (false) or
// b is full (true).
func (r *run) fill(b *batch, cfg *BatchConfig) bool {
	c := r.carry
	c.mu.Lock()
	b.mu.Lock()
	defer c.mu.Unlock()
	defer b.mu.Unlock()
	if c.lo < len(c.rows) {
		if len(b.rows) == 0 {
			b.since, b.due = c.since, c.due
			b.deadline = b.since.Add(cfg.MaxDelay)
		} else {
			// The carry's rows may be older than b's: a worker that was
			// dead-lettering others of its chunk held them back. b's clocks
			// take the earlier of the two, so that no row waits for its
			// InProgress (or its commit) longer than its own clock says.
			if c.since.Before(b.since) {
				b.since = c.since
				b.deadline = b.since.Add(cfg.MaxDelay)
			}
			if c.due.Before(b.due) {
				b.due = c.due
			}
		}
	}
	b.reserve(min(len(c.rows)-c.lo, cfg.MaxRows-len(b.rows)), cfg.MaxRows)
	full := false
	i := c.lo
	for ; i < len(c.rows); i++ {
		sz := len(c.rows[i].Tuple)
		if len(b.rows) == cfg.MaxRows || (len(b.rows) > 0 && b.bytes+sz > cfg.MaxBytes) {
			full = true
			break
		}
		b.rows = append(b.rows, c.rows[i])
		b.bytes += sz
	}
	clear(c.rows[c.lo:i])
	c.lo = i
	return full || len(b.rows) == cfg.MaxRows || b.bytes >= cfg.MaxBytes
}

// heartbeat sends InProgress for the messages of every batch (and the
// carry) once the batch is due (batch.due): half of InProgressEvery after
// its oldest row came, then InProgressEvery after each beat; until stop is
// closed or ctx ends.
// The first comes sooner because a row's clock starts before the consumer
// stamps it Received: during a stall it may have waited in nats.go's pull
// buffer until the sink started taking rows into spare batches, which it
// does InProgressEvery/2 into the stall (holdAfter). So a batch's oldest
// row is at most about InProgressEvery/2 + InProgressEvery/2 + the
// ticker's InProgressEvery/4 old at its first InProgress, and
// InProgressEvery * 5/4 at each later one: with InProgressEvery =
// ack_wait/3, 0.42 of ack_wait, so that one InProgress lost (in a
// connection that fails, or refused: then the batch is due again at the
// next tick) leaves the next at most 0.75 of ack_wait after the last that
// arrived. A row that joins a batch gets the
// batch's next beat or its own first one (InProgressEvery/2 after it
// came), whichever is due sooner: fill keeps the earlier due time. So a
// held batch that keeps taking rows is beaten more often, at most once a
// tick (InProgressEvery/4), all its rows each time; a batch lives that
// long only during a stall, and holds at most max_rows.
func (r *run) heartbeat(ctx context.Context, stop <-chan struct{}) {
	every := r.s.cfg.InProgressEvery
	t := time.NewTicker(max(every/4, time.Millisecond))
	defer t.Stop()
	var snap []*batch
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case now := <-t.C:
			snap = append(snap[:0], r.all...)
			r.spareMu.Lock()
			for b := range r.spares {
				snap = append(snap, b)
			}
			r.spareMu.Unlock()
			for _, b := range snap {
				r.s.beat(b, now, every)
			}
		}
	}
}

// beat sends InProgress for b's unsettled rows once b is due: every/2
// after its oldest row came, then every after each beat (see heartbeat).
func (s *Sink) beat(b *batch, now time.Time, every time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lo >= len(b.rows) || now.Before(b.due) {
		return
	}
	b.due = now.Add(every)
	var sent, failed uint64
	var failure error
	// A row taken before its stream was re-created gets no InProgress:
	// JetStream would apply it to the new stream's event with the same
	// sequence (see pipeline.Epochs).
	epoch := s.epochs.Hold()
	for i := b.lo; i < len(b.rows); i++ {
		row := &b.rows[i]
		a := acker(row)
		if a == nil || row.Event.Epoch != epoch {
			continue
		}
		sent++
		if err := a.InProgress(); err != nil {
			failed++
			failure = err
		}
	}
	s.epochs.Release()
	s.st.inProgress.Add(sent)
	if failed > 0 {
		b.due = now.Add(every / 4) // again at the next tick
		s.st.inProgressErrs.Add(failed)
		// While NATS is away this fails at every tick, for every batch
		// held: one line a while (the counter has them all).
		s.log.Log(context.Background(), warnEvery(&s.beatWarned), "in-progress failed; JetStream may redeliver these messages while they are still held",
			"messages", failed, "err", failure)
	}
}

// renew sends InProgress for row, unless the heartbeat is off or its
// stream was re-created since it was taken, and counts it as the
// heartbeat does.
func (s *Sink) renew(row *pipeline.Row) {
	a := acker(row)
	if a == nil || s.cfg.InProgressEvery == 0 {
		return
	}
	var err error
	if !s.epochs.IfCurrent(row.Event.Epoch, func() { err = a.InProgress() }) {
		return
	}
	s.st.inProgress.Add(1)
	if err != nil {
		s.st.inProgressErrs.Add(1)
		// Called for each row of a miscounted COPY, up to max_rows of
		// them, and NATS being away refuses them all: one line a while
		// (the counter has them all).
		s.log.Log(context.Background(), warnEvery(&s.renewWarned), "in-progress failed before a dead letter; JetStream may redeliver the message meanwhile",
			"stream_seq", row.Event.StreamSeq, "err", err)
	}
}

// acker returns the row's message as the Acker the sink needs, nil if none.
func acker(row *pipeline.Row) Acker {
	if row.Event.Msg == nil {
		return nil
	}
	return row.Event.Msg
}

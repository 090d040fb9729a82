package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/telemetry"
)

// committer is one of the Connections goroutines that commit batches. It
// owns its connection.
type committer struct {
	s      *Sink
	r      *run
	conn   *pgx.Conn
	staged bool // exactly-once: the staging table exists on conn
	// unfound: the last read of the table's types on conn (readTypes)
	// found no table by its name, failed while the table was not pinned,
	// or was not kept and the read kept found none: made since, or found
	// by that read, the table is looked for again before the next
	// attempt's statements (try), which pins it and has the guards take
	// its types.
	unfound bool
	wire    copyWire
	bo      backoff
	// untouched: the last COPY's Query failed before the server answered
	// any of it (copyResult.untouched), for attempt.
	untouched bool
	// mayHand: commitRetry may give up the batch to another committer
	// (errHandOff): process tries it whole, nothing settled or held.
	mayHand bool
	guards  *string // the COPY with type guards (Sink.copySQL) the last attempt sent
	// eo caches exactly-once's Query (see exactlyOnce), built of guards
	// and whether staged.
	eo struct {
		q      copyQuery
		guards *string
		staged bool
	}
	// started is this committer's slot of Sink.attempts (nil outside Run).
	started *atomic.Int64

	// Telemetry of the batch being processed.
	span     trace.Span    // its "copy <table>" span, nil if not traced
	spanMsgs int           // the messages of the batch, with those taken in (the span's message count)
	took     time.Duration // the last committed transaction's duration: its statements, from stmtsAt
	commitAt time.Time     // when the last committed transaction committed (answered)
	stmtsAt  time.Time     // when the last try's statements began, after its connect
	answered time.Time     // when the last try's COPY (or Query) was answered, before exactly-once's lookup
	retries  uint64        // attempts retried
	settled  int           // rows acked
	inserted int           // rows the batch's commits inserted (exactly-once; at-least-once inserts what it settles)
	failed   int           // the batch's attempts that failed, ctx alive (its span's error at a hard stop: stopError)
	parked   int           // rows dead-lettered
	lastFail error         // the last of them
	bytes    int           // their tuple bytes

	// waitLogged is how long the last try ran if its wait was logged
	// (watchSlow; 0 if not), and waitPID its backend: a batch whose wait
	// was logged says so when it commits, as nothing else says that the
	// wait ended.
	waitLogged time.Duration
	waitPID    uint32

	// suspectSeq is the number of the last attempt that had started
	// (counters.attemptSeq) when the first classSuspect error since the
	// last row was dead-lettered for one was seen, 0 if none was. A commit
	// of an attempt numbered higher, on any connection, started after that
	// failure and shows that the table takes rows since, so that the error
	// comes from the rows that fail. (Not the failed attempt's own number:
	// an attempt that started while it ran may have committed before the
	// table began to refuse rows.) Set with lastTry (suspectFrom): a new
	// failure's rows get a last try of their own.
	suspectSeq uint64
	// suspectKey is the constraintKey of the error that set suspectSeq.
	suspectKey string
	// probed is where the suspect row went when probe last committed a
	// row in its place.
	probed int
	// absent, if absentOK, is the key of the refused row that storedBefore
	// last found missing from the table: deadLetter, about to park that
	// row, need not look it up again.
	absent   rowKey
	absentOK bool
	// held, while commitRetry retries classSuspect errors (see process), is
	// the batch whose rows it retries: holdWait adds rows to it.
	held *batch
	// rel, while commitRetry runs process's main attempt at b.rows[lo:]
	// (not a bisection's, a probe's nor a hold's), is the batch it may
	// give back while the sink is away (see releasing).
	rel struct {
		b  *batch
		lo int
	}
	// noWork: the batcher has closed work, so holdWait offers no token.
	noWork bool
	// lastTry: it has tried the rows refused since suspectSeq was last
	// set once every committer was stranded (strandedWait). It changes,
	// as suspectSeq does, only while the committer is not in
	// run.stranded (suspectFrom, and strandedWait after unstrandLocked):
	// the others read both there under run.strandMu (run.triesToCome).
	lastTry bool
	// hold carries a hold's retries over the rows holdWait takes in: the
	// next hold of the batch (resume) goes on with its backoff and its
	// count, so that new rows neither reset the backoff nor keep the
	// batch from being logged as still failing. (If the bisection after
	// them let the held row go, the next hold, of another row, goes on
	// all the same.)
	hold struct {
		resume          bool
		bo              backoff
		failing, warned time.Time
		attempts        int
	}
	// piece, if not 0, is the most rows an attempt of process takes, set
	// when an attempt timed out on the server (see pieceTimedOut); limit
	// is how long that attempt ran; pieceAt is when piece last changed.
	piece   int
	limit   time.Duration
	pieceAt time.Time
	// ends are the ends of the pieces findPoison split off and left
	// untried, nearest last: where process cuts its next try when poison
	// rows come one after another.
	ends []int
	// passes counts the batch's failed lookups after its commits
	// (lookupPasses) over every commitRetry of its pieces, so that the
	// bound holds per batch, not per halving of it; process resets it.
	passes lookupPasses
	// unknown: a commit of the batch's rows had an unknown outcome: a
	// row given up may be stored already. process starts it from the
	// batch's mayBeStored and keeps it there when it returns, so that it
	// outlives a hand-off or another process call of the batch.
	unknown bool
	// Scratch of settle: the messages of a committed piece, their acks' results.
	acks    []pipeline.Msg
	ackErrs []error
}

// loop commits batches until the batcher closes work (nil) or ctx ends. It
// connects (warm, under warmCtx) once it has first offered itself, so that
// every committer counts as free from the start and a batch handed over
// meanwhile goes to whichever committer is connected first.
func (c *committer) loop(ctx, warmCtx context.Context) error {
	defer c.closeConn()
	for first := true; ; first = false {
		c.r.ready <- struct{}{} // never blocks: at most one token per committer
		c.r.wakeBatcher()
		if first {
			c.warm(warmCtx)
			c.r.warmEnded(c.conn != nil)
		}
		b, err := c.next(ctx)
		if err != nil {
			return err
		}
		if b == nil {
			return nil
		}
		err = c.process(ctx, b)
		handed := false
		var off handOffRetry
		for errors.Is(err, errHandOff) {
			switch herr := c.handOff(ctx, b, off.wait); {
			case herr == nil:
				handed, err = true, nil // another committer has b now
			case errors.Is(herr, errHandOff):
				// None took it while offered: try it here if this
				// committer can connect now, else offer it again (not
				// process: that would warn of the batch anew each time).
				switch cerr := c.connect(ctx); {
				case cerr == nil:
					off = handOffRetry{}
					err = c.process(ctx, b)
				case ctx.Err() != nil:
					err = ctx.Err()
				default:
					c.handOffFailed(&off, cerr, len(b.rows))
				}
			case errors.Is(herr, errWorkDone):
				err = c.process(ctx, b) // no committer takes work any more: keep trying here
			default:
				err = herr
			}
		}
		c.r.finished() // with b: handed on (counted again for its taker), or done
		if handed {
			// Connect before taking work again; once the batcher is done
			// (warmCtx), there is none to take.
			if err := c.reconnect(warmCtx); err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		if _, ok := errors.AsType[*givenUpError](err); ok {
			err = nil // its rows left unacked, for JetStream to redeliver (process logged them)
		}
		if errors.Is(err, errReleased) {
			err = nil // given back (giveBack)
		}
		if ctx.Err() != nil {
			c.r.leaveStale(b) // a hard stop drops its unsettled rows
		}
		b.reset()
		if !b.spare {
			b.shrink(c.s.cfg.Batch.MaxRows)
		}
		c.r.release(b)
		if err != nil {
			return err
		}
	}
}

// next waits for the next batch (nil: the batcher is done), answering
// Ready's pings meanwhile (Sink.pingCommitter).
func (c *committer) next(ctx context.Context) (*batch, error) {
	for {
		select {
		case b := <-c.r.work:
			return b, nil
		case reply := <-c.r.pings:
			reply <- c.ping(ctx)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// committerPingTimeout bounds a ping on a committer's connection. Its
// context is the committer's (Run's), not the caller's: a ping cut short
// by a probe's timeout would close the connection (pgx closes one whose
// query was interrupted), and a new one may be what the server refuses.
const committerPingTimeout = 5 * time.Second

// ping pings the server on the committer's connection. A connection it
// has not got, or one that is closed or left behind by a failover (the
// next batch reconnects), is errNoIdleCommitter's: another committer may
// answer.
func (c *committer) ping(ctx context.Context) error {
	if c.conn == nil || c.conn.IsClosed() || c.s.behind(c.conn.PgConn()) {
		return errNoIdleCommitter
	}
	ctx, cancel := context.WithTimeout(ctx, committerPingTimeout)
	defer cancel()
	if err := c.conn.Ping(ctx); err != nil {
		if c.conn.IsClosed() {
			return fmt.Errorf("%w: %w", errNoIdleCommitter, err)
		}
		return err
	}
	return nil
}

// errHandOff: the committer could not connect while others committed
// (commitRetry); its batch, untouched, goes to one of them (handOff).
// errWorkDone: no committer takes work any more (handOff).
var (
	errHandOff  = errors.New("sink: batch handed to another committer")
	errWorkDone = errors.New("sink: the batcher is done")
)

// handOff gives b to a committer waiting for work, as the batcher does
// (claiming its token). errHandOff when none waits within wait (at least
// handWait); errWorkDone once the batcher is done (the tokens left in
// ready are stale, their committers gone). After it returns nil, b is the
// other committer's.
//
// It offers b in turns of handWait at most (offer), each under workMu's
// read lock, which closeWork waits for; and while closeWork waits, the
// other committers' hand-offs wait too (a writer waiting holds new
// readers back). One turn as long as wait (up to Retry.Max, 5 s by
// default) held the end of a drain up by as much.
func (c *committer) handOff(ctx context.Context, b *batch, wait time.Duration) error {
	deadline := time.Now().Add(max(wait, handWait))
	for {
		err := c.offer(ctx, b, min(handWait, time.Until(deadline)))
		if !errors.Is(err, errHandOff) || time.Until(deadline) <= 0 {
			return err
		}
	}
}

// offer is one turn of handOff: it waits up to wait for a committer to
// take b, holding workMu's read lock.
func (c *committer) offer(ctx context.Context, b *batch, wait time.Duration) error {
	c.r.workMu.RLock()
	defer c.r.workMu.RUnlock()
	if c.r.workDone.Load() {
		return errWorkDone
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-c.r.ready:
	case <-t.C:
		return errHandOff
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.r.hand(ctx, b)
}

// handWait is how long handOff waits at least for a committer to take a
// batch, and the longest it holds workMu's read lock at a time.
const handWait = time.Second

// handOffRetry is the state of a committer's connects that fail while its
// batch waits to be handed off (see loop): the connects back off as a
// batch's retries do, and wait, the backoff's last step, is how long the
// batch is offered before the next one (a committer that comes free takes
// it at once all the same).
type handOffRetry struct {
	bo              backoff
	wait            time.Duration
	attempts        int
	failing, warned time.Time // the first failure; the last one logged at Warn
}

// handOffFailed records a connect that failed (err) while the committer's
// batch of rows waited to be handed off. The committer holds the batch's
// events meanwhile, so this is a failing batch like any other: a retry
// counted, the sink failing (Failing, Ready) until a batch is answered,
// and a Warn line on the first failure and every stillFailingEvery (a
// connection limit of the role's or the server's, say).
func (c *committer) handOffFailed(off *handOffRetry, err error, rows int) {
	now := time.Now()
	if off.attempts == 0 {
		off.bo = backoff{initial: c.bo.initial, max: c.bo.max}
		off.failing = now
	}
	off.attempts++
	off.wait = max(off.bo.next(), handWait)
	c.s.st.retries.Add(1)
	c.s.noteReach(err, now)
	c.s.refused(err, c.s.classify(err), now)
	switch {
	case off.attempts == 1:
		off.warned = now
		c.s.log.Warn("cannot connect; offering the batch to the other committers until one takes it or this one connects",
			"rows", rows, "err", err, "retry_in", off.wait)
	case now.Sub(off.warned) >= stillFailingEvery:
		off.warned = now
		c.s.log.Warn("still cannot connect; offering the batch to the other committers until one takes it or this one connects",
			"rows", rows, "attempts", off.attempts, "failing_for", now.Sub(off.failing).Round(time.Millisecond), "err", err, "retry_in", off.wait)
	default:
		c.s.log.Debug("cannot connect again; offering the batch to the other committers", "rows", rows, "attempts", off.attempts, "err", err, "retry_in", off.wait)
	}
}

// reconnect connects the committer, retrying with backoff until it can or
// ctx ends (the batcher is done), after it handed its batch off: taking
// work it cannot commit would hold that too.
func (c *committer) reconnect(ctx context.Context) error {
	c.bo.reset()
	for c.conn == nil {
		err := c.connect(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.s.log.Debug("could not connect; not taking batches until it can", "err", err)
		if err := sleep(ctx, c.bo.next()); err != nil {
			return err
		}
	}
	return nil
}

// warmTimeout bounds how long a committer tries to connect at start, or
// the sink's dialMax if longer (a connect timeout for each host of a
// failover list: the first may be gone); after that the first batch it
// takes connects. A variable for the tests.
var warmTimeout = 10 * time.Second

// warm opens the committer's connection when Run starts, all committers at
// once, so that the first batches of a run do not each wait for a connect:
// ~20 ms on the project's machine against its own PostgreSQL, more with TLS
// or a remote server. (Committers take batches in turn, so connecting on
// first use put one connect on each of the first Connections batches.) A
// failure is left to the first batch's attempt, which retries with backoff
// and logs (a database that is down at start is not an error: run starts,
// and /readyz says what is wrong). Run cancels ctx once the batcher is done, so that a
// connect that hangs does not hold up its return.
func (c *committer) warm(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(warmTimeout, c.s.dialMax))
	defer cancel()
	if err := c.connect(ctx); err != nil {
		c.s.log.Debug("could not connect ahead of the first batch; its attempt will", "err", err)
	}
}

// connect opens the committer's connection and, on it, reads the table's
// column types for the guards (see Sink.readTypes). A failed read is left
// to the guards: they accept what they accepted before.
func (c *committer) connect(ctx context.Context) error {
	conn, err := c.s.connect(ctx)
	if err != nil {
		return err
	}
	c.unfound = false
	if err := c.readTypes(ctx, conn); err != nil {
		_ = conn.Close(context.Background())
		return err
	}
	c.conn, c.staged = conn, false
	return nil
}

// readTypes reads the table's column types on conn, the committer's (see
// Sink.readTypes), bounded by readTypesTimeout, and notes whether the
// read kept found the table (unfound). A failed read is logged and left to
// the guards: they accept what they accepted before, and, the table not
// pinned yet, the next attempt reads again (unfound): else a read at
// connect that failed with the connection open (a statement_timeout, a
// 42501) left the table as configured in that connection's statements,
// looked up along search_path, when it was made later and no check ran.
// Its error is returned only when conn is closed or ctx has ended.
func (c *committer) readTypes(ctx context.Context, conn *pgx.Conn) error {
	rctx, cancel := context.WithTimeout(ctx, readTypesTimeout)
	_, found, err := c.s.readTypes(rctx, conn)
	cancel()
	if err == nil {
		c.unfound = !found
		return nil
	}
	if conn.IsClosed() || ctx.Err() != nil {
		return err
	}
	// Read again before the next attempt only while the table is not
	// pinned: once it is, pinTable has written the COPY and its guards
	// with its schema-qualified name, and a read that keeps failing for a
	// reason of its own (EXECUTE on row_security_active revoked, the
	// role's statement_timeout) failed twice a batch for the connection's
	// life, before the attempt and after its commit (pinWritten, which
	// the acks wait for): with a statement_timeout, twice the timeout.
	c.s.typesMu.Lock()
	c.unfound = !c.s.pinned
	c.s.typesMu.Unlock()
	msg := "could not read the table's column types; the type guards accept the ones read before"
	if c.unfound {
		msg += "; read again before each attempt until the table is found"
	}
	if c.s.firstSeen("readTypes " + err.Error()) {
		c.s.log.Warn(msg, "err", err)
	} else {
		c.s.log.Debug(msg, "err", err)
	}
	return nil
}

func (c *committer) closeConn() {
	if c.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = c.conn.Close(ctx)
		c.conn = nil
	}
}

// process commits b and settles every row: acked after commit, or
// dead-lettered if the database refuses it. It returns nil, ctx.Err() once
// ctx has ended, errHandOff: b, untouched, is to go to another committer
// (commitRetry could not connect while others committed), or a
// *givenUpError: at the end of a drain, the rows of b it had not settled
// are left unacked (see strandedWait), or errReleased: the rows of b it
// had not settled were given back while the sink was away (giveBack).
func (c *committer) process(ctx context.Context, b *batch) (err error) {
	rows := b.rows
	c.retries, c.settled, c.inserted, c.bytes, c.held, c.unknown = 0, 0, 0, 0, nil, b.mayBeStored
	c.failed, c.lastFail, c.parked = 0, nil, 0
	c.absentOK = false
	c.passes = lookupPasses{}
	c.suspectFrom(0)
	c.hold.resume = false
	// c.span may start later too, with rows taken into the batch
	// (holdWait, linkTaken).
	c.span, c.spanMsgs = c.s.tracing.StartCopy(c.s.cfg.Table, rows), len(rows)
	defer func() {
		b.mayBeStored = c.unknown // c.held may have taken in a batch that was (holdWait)
		failed := err
		if errors.Is(err, errHandOff) && c.span != nil {
			// Not a failure: another committer takes the batch, untouched,
			// under a span of its own.
			c.span.SetAttributes(attribute.Bool("jetsink.batch.handed_off", true))
			failed = nil
		}
		if errors.Is(err, errReleased) && c.span != nil {
			// Not a failure: given back, for another instance to store.
			c.span.SetAttributes(attribute.Bool("jetsink.batch.released", true))
			failed = nil
		}
		if c.span != nil {
			if failed != nil && ctx.Err() != nil && c.lastFail != nil {
				// A hard stop cut the retries short: the span says what
				// failed the batch, not "context canceled".
				failed = c.stopError()
			}
			if c.unknown {
				// A commit of the batch's rows whose outcome was unknown
				// (the connection lost at its COMMIT): they may be stored,
				// and a retry's ON CONFLICT then counts them among
				// jetsink.batch.duplicates (at-least-once: stored twice).
				c.span.SetAttributes(attribute.Bool("jetsink.batch.commit_outcome_unknown", true))
			}
			telemetry.EndCopy(c.span, c.copyCounts(), c.bytes, c.retries, failed)
		}
		c.span = nil
	}()
	lo := 0
	// whole: try the rest of the batch at once, as long as poison rows come
	// apart; after two in a row the next tries go piece by piece along
	// c.ends, until a piece commits. A batch of n rows all refused then
	// costs about 2n COPYs instead of n(log2(n)+1); one poison row costs
	// what it did; pairs of poison rows over and over cost ~5% more (the
	// good row after a pair takes a piece and then the rest).
	whole, last := true, -2 // last: the poison row found before
	// piece: the last try was a piece cut by c.piece, or one that timed
	// out; the next one is no bisection COPY.
	piece := false
	c.ends = c.ends[:0]
	for lo < len(rows) {
		for len(c.ends) > 0 && c.ends[len(c.ends)-1] <= lo {
			c.ends = c.ends[:len(c.ends)-1]
		}
		end := len(rows)
		if !whole && len(c.ends) > 0 {
			end = c.ends[len(c.ends)-1]
		}
		hi := c.cut(b, rows, lo, end)
		if lo > 0 && !piece {
			c.s.st.bisectCopies.Add(1) // the rest after a poison row
		}
		piece = hi < end
		c.mayHand = lo == 0 && hi == len(rows) && c.held == nil
		c.rel.b, c.rel.lo = b, lo
		err := c.commitRetry(ctx, rows[lo:hi], true)
		c.mayHand = false
		c.rel.b = nil
		if errors.Is(err, errHandOff) || errors.Is(err, errReleased) {
			return err
		}
		if c.settleCommitted(ctx, b, lo, hi, err) {
			if err == nil {
				c.pieceCommitted(hi - lo)
			}
			if hi == len(rows) {
				return nil
			}
			lo, whole = hi, true
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if end == len(rows) {
			c.ends = c.ends[:0] // what is left of them lies in rows[lo:end]
		}
		if hi-lo > 1 && timedOut(err) {
			// Nothing committed, and c.piece is now half of it
			// (commitRetry returns a timeout only for a piece it can
			// halve): try the first half.
			piece = true
			continue
		}
		p, perr, alone, err := c.findPoison(ctx, b, lo, hi, err)
		if errors.Is(err, errHalved) {
			lo, piece = p, true // rows before p committed; c.piece is halved
			continue
		}
		if err != nil {
			return err
		}
		piece = false
		if !alone && !ownError(perr) && c.s.classify(perr) != classSuspect {
			// Row p was blamed on the error of a try with rows that have
			// committed since (a foreign key whose parent came
			// meanwhile, a statement trigger over the whole COPY): its
			// dead letter would give another row's reason, or none of
			// its own. Try it alone. (A suspect error is tried alone
			// below when the table takes rows.)
			c.s.st.bisectCopies.Add(1)
			perr = c.commitRetry(ctx, rows[p:p+1], false)
			if c.settleCommitted(ctx, b, p, p+1, perr) {
				lo = p + 1 // no poison row: whole and last stay
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if c.looksUp(perr) && c.storedBefore(ctx, b, p, perr) {
			// Row p, refused by the INSERT from staging, is in the table
			// already (a CHECK added NOT VALID since it was stored, a
			// trigger that refuses it now): acked as stored before. It
			// needs no commit to show whose fault the refusal is, so a
			// batch of such rows alone is not held. Not a poison row:
			// whole and last stay.
			lo = p + 1
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err() // the lookup may not have answered: row p is redelivered
		}
		whole, last = p != last+1, p
		if c.s.classify(perr) == classSuspect {
			// Row p fails with an error that a row may cause, or the
			// table (see classSuspect).
			switch {
			case c.tableTakesRows() && alone && c.sameConstraint(perr):
				// A CHECK or NOT NULL that judges the row alone (ownError)
				// refused it, by its own line or alone, and rows have
				// committed under that same constraint since it first
				// refused one: the constraint takes rows, and refuses
				// this one. The next it refuses needs no commit of its
				// own (a run of rows a publisher sent bad, a batch of
				// them among good ones); another constraint's does.
			case c.tableTakesRows():
				// findPoison may have blamed row p on an error its piece
				// had before the table changed: try it alone.
				c.s.st.bisectCopies.Add(1)
				perr = c.commitRetry(ctx, rows[p:p+1], false)
				if c.settleCommitted(ctx, b, p, p+1, perr) {
					lo = p + 1
					continue
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if !c.sameConstraint(perr) {
					c.suspectFrom(0) // the next refused row needs a commit of its own
				}
			case c.probe(ctx, b, p, &perr):
				// A row of the batch committed alone: the table takes
				// rows. Settled, it was moved to p; bisect again. But
				// a CHECK or NOT NULL that refused row p by its own
				// line (or alone) judges it alone: the row, moved
				// next, is dead-lettered without a bisection to find
				// it again.
				if alone && c.sameConstraint(perr) {
					c.unprobe(b, p)
					p++
					last = p
					break
				}
				lo = p + 1
				continue
			case isLoneTimeout(perr):
				// The row probe tried last, now at p (the suspect row
				// behind it), timed out alone while other rows
				// committed: given up below, once, like any poison row
				// (whole and last stay), as the held rest is; left
				// unsettled, it would be held with the rest, retried
				// from a count of none and given up a second time.
			case ctx.Err() != nil:
				return ctx.Err()
			default:
				// Still nothing committed: it may be the table. Retry the
				// rest as a whole (cut by c.piece), like a configuration
				// error, until it commits or rows commit elsewhere.
				// (findPoison may have settled rows before p: committed
				// with a miscount.) Meanwhile the batcher may hand this
				// committer more rows (holdWait): with them it bisects
				// again, so that a lone refused row cannot hold every
				// committer for good.
				lo = p
				hi := c.cut(b, rows, lo, len(rows)) // else a rest that times out would never reach holdWait
				c.held = b
				err := c.commitRetry(ctx, rows[lo:hi], true)
				c.held = nil
				c.unstrand()
				if gu, ok := errors.AsType[*givenUpError](err); ok {
					c.giveUp(b, lo, gu)
					return err
				}
				if c.hold.resume = errors.Is(err, errAbsorbed); c.hold.resume {
					// Rows were taken in: drop the settled ones first,
					// so that a hold that goes on through many batches
					// keeps only what it retries. Its lookups count
					// anew, as a new batch's would.
					c.passes = lookupPasses{}
					n := b.dropSettled(lo)
					lo, last = lo-n, last-n
					for i := range c.ends {
						c.ends[i] -= n
					}
					rows = b.rows
					continue
				}
				if isLoneTimeout(err) {
					// The held rest was row lo (= p) alone (the last of
					// the batch, or c.piece cuts at one row), and it timed
					// out alone while other rows committed: given up like
					// an unheld one, below (whole and last stay as for any
					// poison row). Rows before lo stay settled.
					perr = err
					break
				}
				if c.settleCommitted(ctx, b, lo, hi, err) {
					if err == nil {
						c.pieceCommitted(hi - lo)
					}
					if hi == len(rows) {
						return nil
					}
					lo, whole, piece = hi, true, true
					continue
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				// The table takes rows now, or the rest timed out (and
				// c.piece cuts it): bisect again.
				continue
			}
		}
		if isLoneTimeout(perr) {
			// Row p may have failed with a suspect error first (held or
			// not), or be a row probe tried in place p of a refused one,
			// and its timeouts waited for other rows' commits: the next row
			// refused with one (that row too) needs a commit after its
			// own failure, or a table that refuses every row since (a
			// trigger added) would have it dead-lettered.
			c.suspectFrom(0)
		}
		if !c.deadLetter(ctx, b, p, perr) {
			return ctx.Err() // left for JetStream to redeliver
		}
		lo = p + 1
	}
	return nil
}

// cut returns where a COPY of rows[lo:hi] (b's) ends: at hi, or before it
// after c.piece rows (a piece timed out: see pieceTimedOut), or at the
// batch bounds, postgres.batch.max_rows and max_bytes, which only a batch
// that took others in while held (holdWait) can pass: its rows commit in
// transactions no larger than the batcher's.
func (c *committer) cut(b *batch, rows []pipeline.Row, lo, hi int) int {
	bounds := &c.s.cfg.Batch
	n := bounds.MaxRows
	if c.piece > 0 {
		n = min(n, c.piece)
	}
	hi = min(hi, lo+n)
	if b.bytes <= bounds.MaxBytes {
		return hi // as the batcher filled it (b.bytes: this goroutine's)
	}
	size := 0
	for i := lo; i < hi; i++ {
		if size += len(rows[i].Tuple); size > bounds.MaxBytes && i > lo {
			return i
		}
	}
	return hi
}

// suspectProbes are the rows probe tries, as fractions of the way through
// the rows after the suspect one: the last, the middle, the quarters, ...
var suspectProbes = [...]float64{1, 1.0 / 2, 1.0 / 4, 3.0 / 4, 1.0 / 8, 5.0 / 8}

// probe looks for a row of b.rows[p+1:] that commits on its own, after row
// p failed with a classSuspect error and no row had committed since (so p
// is the first unsettled row). It tries up to len(suspectProbes) rows,
// each swapped into place p first, so that settlement stays a prefix: the
// suspect row takes the place of the first row tried, and a row tried that
// does not commit the place of the next (the last stays at p). c.probed
// records where the suspect row is, for unprobe. It reports whether one
// committed (it is then settled). A row tried that times out alone until
// commitRetry gives it up (loneTimeoutError) ends the probe: it stays at
// p, unsettled, and probe sets *perr to that error (and reports false),
// for process to dead-letter it in the suspect row's stead.
func (c *committer) probe(ctx context.Context, b *batch, p int, perr *error) bool {
	rows := b.rows
	n := len(rows) - p - 1 // rows after p
	tried := map[int]bool{}
	at := -1 // where the suspect row went: the first row tried's place
	for _, f := range suspectProbes {
		if n == 0 {
			break
		}
		q := p + min(max(int(f*float64(n)), 1), n) // 1..n rows after p
		if tried[q] {
			continue
		}
		tried[q] = true
		b.mu.Lock()
		rows[p], rows[q] = rows[q], rows[p]
		b.mu.Unlock()
		if at < 0 {
			at = q // later tries swap the row tried before, not it
		}
		c.s.st.bisectCopies.Add(1)
		err := c.commitRetry(ctx, rows[p:p+1], false)
		if c.settleCommitted(ctx, b, p, p+1, err) {
			c.probed = at
			return true
		}
		if isLoneTimeout(err) {
			*perr = err
			return false
		}
		if ctx.Err() != nil {
			return false
		}
	}
	return false
}

// unprobe moves the suspect row back to p+1 after probe committed a row
// alone in its place p (it went where the first row probe tried was:
// c.probed).
func (c *committer) unprobe(b *batch, p int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := c.probed
	b.rows[p+1], b.rows[q] = b.rows[q], b.rows[p+1]
}

// settleCommitted settles rows[lo:hi] of b if err, from committing them,
// says that they committed, and reports whether it did.
func (c *committer) settleCommitted(ctx context.Context, b *batch, lo, hi int, err error) bool {
	switch {
	case err == nil:
		c.settle(b, lo, hi)
	case committedMissing(err) != nil:
		c.settleMissing(ctx, b, lo, hi, committedMissing(err))
	case committedMiscount(err) != nil:
		// Committed: settled like a commit, whether or not ctx has ended.
		c.deadLetterMiscounted(ctx, b, lo, hi, committedMiscount(err))
	default:
		return false
	}
	c.failuresDealtWith()
	return true
}

// suspectFrom sets c.suspectSeq to seq (0: no suspect failure), and
// clears c.lastTry: rows refused anew get a last try of their own at the
// end of a drain (strandedWait). The committer is not stranded (it is
// not waiting in strandedWait), so no other reads them meanwhile
// (run.triesToCome).
func (c *committer) suspectFrom(seq uint64) {
	c.suspectSeq, c.lastTry = seq, false
}

// tableTakesRows reports whether an attempt that started after the
// classSuspect failure that set c.suspectSeq was seen has committed, on any
// connection.
func (c *committer) tableTakesRows() bool {
	return c.suspectSeq > 0 && c.s.st.committedStart.Load() > c.suspectSeq
}

// findPoison isolates the first row of rows[lo:hi] that the database
// refuses, knowing that rows[lo:hi] as a whole failed with a data error. It
// commits (and acks) good prefixes on the way: rows[lo:mid] is tried; if it
// commits, the poison is in rows[mid:hi]; if not, it is in rows[lo:mid], and
// mid..hi goes on c.ends. That is ceil(log2(hi-lo)) COPYs; process adds one
// for the rest of the batch, and one for the row alone when the error may
// not be its own (alone, below). If a piece times out (timedOut: a prefix
// without the refused row need not be faster than the attempt that failed,
// which may have failed before it ran any trigger), it returns lo and
// errHalved instead, with c.piece halved: process goes on from lo in
// smaller pieces, and bisects the one that fails.
//
// alone reports whether the error it returns is the row's own: it failed
// alone, or the error names its line of the COPY. Not when the row's last
// failed try held rows that committed since and the error names no line:
// a foreign key whose parent came meanwhile, a statement trigger that
// looks at the whole COPY.
func (c *committer) findPoison(ctx context.Context, b *batch, lo, hi int, last error) (p int, perr error, alone bool, err error) {
	rows := b.rows
	from := lo // where the COPY that failed with last began
	alone = hi-lo == 1
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		c.s.st.bisectCopies.Add(1)
		err := c.commitRetry(ctx, rows[lo:mid], true)
		me, mc := committedMissing(err), committedMiscount(err)
		switch {
		case err == nil:
			c.settle(b, lo, mid)
			lo, alone = mid, false
		case me != nil:
			c.settleMissing(ctx, b, lo, mid, me)
			lo, alone = mid, false
		case mc != nil:
			c.deadLetterMiscounted(ctx, b, lo, mid, mc)
			lo, alone = mid, false
		case ctx.Err() != nil:
			return 0, nil, false, ctx.Err()
		case mid-lo > 1 && timedOut(err):
			c.ends = append(c.ends, hi) // rows[mid:hi] is left untried
			return lo, nil, false, errHalved
		default:
			c.ends = append(c.ends, hi) // rows[mid:hi] is left untried
			hi, last, alone, from = mid, err, mid-lo == 1, lo
		}
	}
	if line, ok := copyLine(last); ok && from+line-1 == lo {
		alone = true // the error names lo's line
	}
	return lo, last, alone, nil
}

// constraintKey names the CHECK or NOT NULL constraint (ownError: it
// judges a row alone) that refused a row with err: its SQLSTATE, its
// name, its column; or the SQLSTATE of a table's expression that refused
// a value (tableExpression); "" for any other error. Once a commit that started
// after the first refusal by one shows that it takes rows
// (tableTakesRows), the rows it refuses are the rows' fault, not the
// table's (see committer.sameConstraint).
func constraintKey(err error) string {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	switch {
	case !ok || !ownError(err):
		return ""
	case pgErr.Code == "23514" || pgErr.Code == "23502":
		return pgErr.Code + "\x00" + pgErr.SchemaName + "\x00" + pgErr.TableName + "\x00" + pgErr.ConstraintName + "\x00" + pgErr.ColumnName
	case strings.HasPrefix(pgErr.Code, "22") && tableExpression(err, pgErr):
		return pgErr.Code // which expression, PostgreSQL does not say
	}
	return ""
}

// sameConstraint reports whether err is a refusal by the CHECK or NOT
// NULL constraint (constraintKey) that set c.suspectSeq.
func (c *committer) sameConstraint(err error) bool {
	k := constraintKey(err)
	return k != "" && k == c.suspectKey
}

// ownError reports whether err, a row's failure in a bisection, can only
// have been its own, whatever other rows its COPY held: a value the column
// refuses (class 22), a NULL (23502) or a CHECK constraint (23514 naming
// one), which look at the row alone. Not a foreign key, a unique or an
// exclusion constraint (others' rows, data that changes), nor anything a
// trigger raises.
func ownError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Where != "" && !strings.HasPrefix(pgErr.Where, "COPY ") {
		return false // raised inside a function: a trigger's
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "22"), pgErr.Code == "23502":
		return true
	case pgErr.Code == "23514":
		return pgErr.ConstraintName != ""
	}
	return false
}

// copyLine returns the line (row, from 1) of the COPY that err names in
// its context ("COPY <table>, line <n>[, column <c>...]"), as PostgreSQL
// reports an error raised while it stores a row: a check, a NOT NULL, a
// row trigger. Not one raised at the end of the statement (a foreign key,
// a statement trigger, a deferred constraint), nor one of exactly-once's
// INSERT.
func copyLine(err error) (int, bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return 0, false
	}
	for ctxLine := range strings.SplitSeq(pgErr.Where, "\n") {
		if !strings.HasPrefix(ctxLine, "COPY ") {
			continue
		}
		i := strings.Index(ctxLine, ", line ")
		if i < 0 {
			return 0, false
		}
		digits := ctxLine[i+len(", line "):]
		if j := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); j >= 0 {
			digits = digits[:j]
		}
		n, err := strconv.Atoi(digits)
		return n, err == nil && n > 0
	}
	return 0, false
}

// commitRetry commits rows in one transaction, retrying transient and
// configuration errors with backoff until ctx ends. It returns nil, a
// data-class error (SQLSTATE 22/23), a *miscountError of a COPY that
// committed, a *missingError of an exactly-once batch that committed with
// rows missing, or ctx.Err(). A classSuspect error it returns at once,
// unless c.held is set: then it retries it like a configuration error until
// rows commit elsewhere (tableTakesRows), or returns errAbsorbed once it
// has taken more rows into c.held (holdWait), or a *givenUpError once the
// batcher is done and no committer has a batch left that may commit
// (strandedWait). With halve set, it returns
// a server timeout (timedOut) of more than one row at once, having halved
// c.piece, for the caller to try the rows in smaller pieces. An
// exactly-once commit whose lookup of missing rows failed (lookupError) is
// never settled before a lookup answers: the rows are sent again (those
// stored conflict). A lookup that a lost connection or a first timeout
// ended is no failed attempt, up to a bound per batch (c.passes); any other is
// one, of classConfig unless transient, never bisected nor dead-lettered.
// While the sink is away (Away), at process's main attempt (c.rel), it
// returns errReleased instead of waiting for the next attempt once it has
// given the batch back (releasing).
func (c *committer) commitRetry(ctx context.Context, rows []pipeline.Row, halve bool) error {
	bo, first := &c.bo, 0
	var failing, warned time.Time // when this batch first failed, and was last logged at Warn
	switch {
	case c.held != nil && c.hold.resume:
		bo, first = &c.hold.bo, c.hold.attempts
		failing, warned = c.hold.failing, c.hold.warned
	case c.held != nil:
		c.hold.bo = backoff{initial: c.bo.initial, max: c.bo.max}
		bo = &c.hold.bo
	default:
		c.bo.reset()
	}
	var firstSeq uint64 // the attempt that failed first (see errHandOff)
	// Commits whose lookup of the rows missing from the table failed
	// (lookupError), and the backoff and last Warn line of their retries.
	var lookups int
	var lookupBo backoff
	var lookupWarned time.Time
	// The statement timeouts in a row of a lone row (see
	// loneTimeoutsPoison) with a commit of another row between each two:
	// how many, when the first came, and the last attempt started by the
	// latest, which a commit before the next must pass.
	var lone struct {
		n     int
		first time.Time
		last  uint64
	}
	for attempt := first; ; attempt++ {
		began := time.Now()
		seq := c.s.st.attemptSeq.Add(1)
		unknown, err := c.attempt(ctx, rows)
		failedAt := time.Now()
		c.s.noteReach(err, failedAt)
		if err == nil || committedMissing(err) != nil {
			// Committed, and its lookup answered (if it had one): the
			// next lookup timeout of the batch (another piece's, minutes
			// later) is the first in a row again. Not after a connect or
			// COPY error between two lookup timeouts: as a connection
			// lost during the lookup (passing), it shows nothing of the
			// lookup.
			c.passes.timeouts = 0
		}
		if err == nil {
			// (A commit that left rows out, below, shows less about the
			// table: not counted.)
			c.s.st.raiseCommittedStart(seq)
			c.commitAt = c.answered
			c.took = c.commitAt.Sub(c.stmtsAt)
			c.s.answered()
			switch {
			case c.waitLogged > 0:
				// Its wait was logged at Warn: the line that it ended,
				// with the backend_pid of those lines.
				args := []any{"rows", len(rows), "waited", roundWait(c.waitLogged), "backend_pid", c.waitPID}
				if attempt > 0 {
					args = append(args, "attempts", attempt+1)
				}
				c.s.log.Info("batch committed after waiting", args...)
			case attempt > 0:
				c.s.log.Info("batch committed after retries", "rows", len(rows), "attempts", attempt+1)
			}
			c.failuresDealtWith()
			return nil
		}
		if committedMiscount(err) != nil || committedMissing(err) != nil {
			c.commitAt = c.answered
			c.took = c.commitAt.Sub(c.stmtsAt)
			c.s.answered()
			c.failuresDealtWith()
			return err // committed: settled, never sent again
		}
		le, isLookup := errors.AsType[*lookupError](err)
		// Only the row's own statement timing out counts: not a lookup
		// after its commit (it committed), nor a commit whose outcome is
		// unknown; any other error starts the count anew, and so does a
		// timeout with no commit of an attempt started after the last
		// one (a table locked for every row since: one commit early on
		// must not count for the timeouts of a long lock after it).
		if unknown {
			c.unknown = true
		}
		if len(rows) == 1 && !isLookup && !unknown && queryCanceled(err) {
			if lone.n == 0 || c.s.st.committedStart.Load() <= lone.last {
				lone.n, lone.first = 0, failedAt
			}
			lone.n++
			lone.last = c.s.st.attemptSeq.Load()
		} else {
			lone.n = 0
		}
		if isLookup {
			// Committed, and not yet settled: never acked before a
			// lookup answers. The rows are sent again: those stored
			// conflict, and the lookup runs again. A commit that
			// inserted rows shows that the table takes rows; one that
			// inserted none may have had them all left out.
			if le.inserted > 0 {
				c.s.st.raiseCommittedStart(seq)
			}
			if ctx.Err() != nil {
				return ctx.Err() // unacked: redelivered, the stored rows conflict
			}
		}
		if isLookup && c.passes.passing(le.err, failedAt) {
			// A lookup that a lost connection or a first timeout
			// ended, within the bound: not a failed attempt (no retry
			// counted, no piece halved, the sink not failing).
			c.s.answered()
			if lookups == 0 {
				lookupBo = backoff{initial: c.bo.initial, max: c.bo.max}
			}
			lookups++
			wait := lookupBo.next()
			level := slog.LevelDebug
			if lookups == 1 || time.Since(lookupWarned) >= stillFailingEvery {
				level, lookupWarned = slog.LevelWarn, time.Now()
			}
			c.s.log.Log(ctx, level, "batch committed, but the lookup of which of its rows the table stored failed; "+
				"retrying the lookup (the batch is sent again: its stored rows conflict)",
				"rows", len(rows), "lookups", lookups, "err", le.err, "retry_in", wait)
			if err := sleep(ctx, wait); err != nil {
				return err
			}
			attempt-- // not a failure: the attempts that failed are counted as before
			continue
		}
		if ctx.Err() == nil { // not one a hard stop cut short: what the span tells at one (stopError)
			c.failed, c.lastFail = c.failed+1, err
		}
		if unknown && c.s.cfg.Mode == AtLeastOnce {
			// The rows may be in the table, and they will come again:
			// retried here, or redelivered by JetStream when ctx has
			// ended (they are not acked).
			c.s.st.possibleDups.Add(uint64(len(rows)))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt == first {
			firstSeq = seq
		} else if c.mayHand && c.r != nil && c.conn == nil && c.s.st.committedStart.Load() > firstSeq && !c.r.workDone.Load() {
			if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
				// This committer cannot connect (the role's or the
				// server's connection limit) while another commits
				// batches that started after this one first failed: the
				// batch goes to one that can.
				c.s.log.Debug("could not connect; handing the batch to a committer that can", "rows", len(rows), "err", err)
				return errHandOff
			}
		}
		cl := c.s.classify(err)
		if isLookup && cl != classTransient {
			// A lookup that fails for good (a grant revoked, a scan
			// error): the table's or the session's fault, never a row's
			// (the rows committed), so neither bisected nor
			// dead-lettered; retried and logged loudly, the sink failing.
			cl = classConfig
		}
		if cl == classSuspect {
			if c.suspectSeq == 0 || c.suspectKey != constraintKey(err) {
				// Not seq: only attempts that start from now on can
				// show that the table takes rows after this failure.
				// A constraint other than the one refused rows since
				// suspectSeq was set may refuse every row: its own.
				c.suspectFrom(c.s.st.attemptSeq.Load())
				c.suspectKey = constraintKey(err)
			}
			if c.tableTakesRows() {
				// A commit since this failure: the server judged the
				// row, which process dead-letters.
				c.s.answered()
				return err
			}
			if c.held == nil {
				return err
			}
		}
		if cl == classData {
			c.s.answered() // the server judged the rows: it takes batches
			return err
		}
		if span := failedAt.Sub(lone.first); lone.n >= loneTimeoutsPoison && span >= c.s.loneSpan {
			// Other rows commit between its timeouts, so the table is
			// neither locked nor slow for every row: this one is too
			// slow alone, and process dead-letters it (a held row too:
			// the rest of its held batch is this row alone).
			ev := &rows[0].Event
			c.s.log.Error("a row alone timed out on the server again and again while other rows committed; dead-lettering it",
				"stream", ev.Stream, "stream_seq", ev.StreamSeq, "timeouts", lone.n, "over", span.Round(time.Millisecond),
				"sqlstate", "57014", "hint", "raise statement_timeout for jetsink's role (ALTER ROLE ... SET), or find what makes this row slow (a trigger, a lock on a row it refers to)")
			// Stored already, perhaps: a redelivery, exactly-once's
			// (its BEFORE INSERT trigger runs before the conflict), or
			// a commit of this batch whose outcome was unknown.
			stored := c.s.cfg.Mode == ExactlyOnce || ev.Delivered > 1 || c.unknown
			return &loneTimeoutError{err: err, n: lone.n, span: span, mayBeStored: stored}
		}
		c.s.st.retries.Add(1)
		c.retries++
		if halve && len(rows) > 1 && timedOut(err) {
			// How long its statements ran, as took counts a commit's
			// (pieceCommitted compares the two): not the connect, nor a
			// try that found the session ended or without its staging
			// table.
			c.pieceTimedOut(len(rows), failedAt.Sub(laterOf(began, c.stmtsAt)))
			c.s.st.timeoutSplits.Add(1)
			c.s.logTimeoutSplit(err, len(rows), c.piece)
			if attempt == 0 || time.Since(warned) >= stillFailingEvery {
				// Retried, in halves: in the trace as the retries
				// below (a first failure, or one a minute on).
				typ, state := errorType(err)
				telemetry.CopyRetry(c.span, typ, state, attempt+1)
			}
			return err
		}
		wait := bo.next()
		if attempt == 0 {
			failing, warned = began, time.Now()
		}
		// Configuration and suspect errors are logged once per distinct
		// error for the whole run; a batch that keeps failing, whatever
		// the class, is logged again every stillFailingEvery.
		still := attempt > 0 && time.Since(warned) >= stillFailingEvery
		if still {
			warned = time.Now()
			shown := shownError(err, cl)
			c.s.log.Warn("batch still failing; retrying until it commits", withHint(err, "rows", len(rows), "attempts", attempt+1,
				"failing_for", time.Since(failing).Round(time.Millisecond), "err", shown, "retry_in", wait)...)
		}
		if attempt == 0 || still {
			// In the trace too, as often as in the log: a batch
			// retried for minutes otherwise ends with a status OK and
			// only its retries counted.
			typ, state := errorType(err)
			telemetry.CopyRetry(c.span, typ, state, attempt+1)
		}
		c.s.refused(err, cl, failedAt)
		switch {
		case cl == classSuspect:
			c.s.st.configErrs.Add(1)
			c.s.logSuspect(err)
			c.closeConn()
		case cl == classConfig:
			c.s.st.configErrs.Add(1)
			if _, ok := errors.AsType[*typesChangedError](err); ok && c.s.typesFitNow(ctx, c.conn, c.guards) {
				// Retyped to a type the guards had not seen, one that
				// stores the mapping's bytes as sent (a domain, citext):
				// they take it now. Not the table's fault.
				c.s.log.Info("a mapped column's type changed to one that stores the values as sent; retrying the batch", "rows", len(rows))
			} else {
				c.s.logConfigError(err)
				if ok && c.r != nil {
					c.r.recheckTable() // to say which columns, and how to fix them
				}
			}
			// Start the next attempt on a fresh connection: the table may
			// be fixed by then, and a staging table or cached statement
			// from before the fix would keep failing.
			c.closeConn()
		case attempt == 0:
			c.s.log.Warn("batch failed; retrying until it commits", withHint(err, "rows", len(rows), "err", err,
				"commit_outcome_unknown", unknown, "retry_in", wait)...)
		case !still:
			c.s.log.Debug("batch failed again", "rows", len(rows), "attempt", attempt+1, "err", err, "retry_in", wait)
		}
		if c.held != nil && cl == classSuspect {
			absorbed, werr := c.holdWait(ctx, wait)
			if gu, ok := errors.AsType[*givenUpError](werr); ok {
				if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
					gu.sqlstate = pgErr.Code
				}
				return gu
			}
			if werr != nil {
				return werr
			}
			if absorbed {
				c.hold.failing, c.hold.warned, c.hold.attempts = failing, warned, attempt+1
				return errAbsorbed
			}
			continue
		}
		// While the sink is away, process's main attempt gives its rows
		// back (when it may) rather than wait for the next one.
		if c.releasing() {
			return errReleased
		}
		if woke, err := c.s.sleepReach(ctx, wait); err != nil {
			return err
		} else if woke && c.releasing() {
			return errReleased
		}
	}
}

// unready takes back the token a committer offered (got false), or
// receives from work (got true: the batch the batcher claimed the token
// for, or nil once work is closed). The tokens in ready plus the batches
// being handed always equal the committers ready to receive; this one is,
// so one of the two is there, or about to be: the batcher claims a token
// just before it hands a batch, and a committer that took that batch in
// its place sends its own token right after (hence the short poll).
func (c *committer) unready(ctx context.Context) (o *batch, got bool, err error) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-c.r.ready:
			return nil, false, nil
		case o := <-c.r.work:
			return o, true, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-tick.C:
		}
	}
}

// errAbsorbed is commitRetry's answer when holdWait took more rows into
// the held batch: the caller bisects it again.
var errAbsorbed = errors.New("sink: more rows taken into the held batch")

// holdWait waits d before the next attempt at the held batch, as a
// committer ready for work: if the batcher hands it a batch meanwhile, its
// rows join the held batch (batch.absorb) and holdWait reports true. A row
// that fails with a classSuspect error is held until some other row
// commits (tableTakesRows); with every committer holding such a row
// (postgres.connections lone refused rows in a row, or one with one
// connection) no other row could, and nothing would ever commit again.
// Taken in, the next rows let probe show that the table takes rows, and
// the refused one is dead-lettered; if the table refuses every row, they
// are held with it, up to a batch more than HoldRows (or max_rows)
// unsettled, and a batch less one more at most.
//
// The token protocol of loop holds: holdWait offers one token; when d has
// passed it takes one back, any (they are all alike), or, if none is left
// (the batcher claimed it), receives the batch the batcher hands it.
func (c *committer) holdWait(ctx context.Context, d time.Duration) (bool, error) {
	r := c.r
	if r == nil {
		return false, sleep(ctx, d)
	}
	if r.workDone.Load() {
		c.noWork = true // (and the tokens left in ready are stale)
	}
	if c.noWork {
		return false, c.strandedWait(ctx, d)
	}
	lim := max(c.s.holdRows(), c.s.cfg.Batch.MaxRows)
	lim += min(c.s.cfg.Batch.MaxRows, math.MaxInt-lim) // HoldRows may be "no limit": math.MaxInt
	if len(c.held.rows)-c.held.lo >= lim {
		// Bounded like the rows the batcher holds in a stall, whatever
		// the Source lets in (the settled rows are dropped).
		return false, sleep(ctx, d)
	}
	select {
	case r.ready <- struct{}{}:
	default:
		return false, sleep(ctx, d) // no room: cannot happen (one token per committer)
	}
	r.wakeBatcher()
	until := time.Now().Add(d)
	t := time.NewTimer(d)
	defer t.Stop()
	var o *batch
	select {
	case o = <-r.work:
	case <-t.C:
		// Stop being a receiver: take a token back, or the batch the
		// batcher is handing on one. If another committer took that
		// batch (it sent its token after this one was claimed), its
		// token comes into ready at once: poll for either.
		var got bool
		var err error
		if o, got, err = c.unready(ctx); !got || err != nil {
			return false, err
		}
	case <-ctx.Done():
		return false, ctx.Err()
	}
	if o == nil {
		// The batcher is done (work closed): take the token back, and
		// wait without offering one from now on.
		c.noWork = true
		select {
		case <-r.ready:
		default:
		}
		return false, c.strandedWait(ctx, max(0, time.Until(until)))
	}
	c.linkTaken(o.rows[o.lo:])
	if o.mayBeStored {
		c.unknown = true // o was handed off after a commit of unknown outcome
	}
	c.held.absorb(o)
	r.release(o)
	r.finished() // o: its rows are the held batch's now
	c.s.st.takenIntoHeld.Add(1)
	return true, nil
}

// givenUpError is commitRetry's answer when the committer gives up the
// held batch's rows (see strandedWait): they are left unacked. It keeps
// the SQLSTATE of the error they failed with, not its message, which may
// quote a row.
type givenUpError struct{ sqlstate string }

func (e *givenUpError) Error() string {
	return "sink: rows refused (SQLSTATE " + e.sqlstate + ") given up at the end of the drain, unacked"
}

// strandedWait is holdWait once the batcher is done (noWork): no rows can
// come to show that the table takes rows but those other committers still
// commit. The committer is stranded while it waits (strandLocked): its batch
// leaves run.working. It waits d before the next attempt, or less once
// every committer with a batch left is stranded (run.allStranded):
// nothing commits, and nothing would ever commit again to tell the rows'
// fault from the table's; the drain would then last until the hard
// context ends (drain_timeout), to leave the rows unacked all the same.
// Instead, in that state, strandedWait returns nil at once for one last
// try (the table may have been fixed meanwhile) if the committer has not
// had it since its rows were refused (lastTry), or if the table has
// taken rows since (tableTakesRows: refused again, the row is
// dead-lettered); else, once no stranded committer has a try to come
// (run.triesToCome: its last one, or one after a commit since its rows
// were refused), a *givenUpError: the rows are left unacked,
// and JetStream redelivers them after ack_wait, as it does the rows of a
// hard stop, to a run with other rows to commit beside them (refused
// again, they are dead-lettered then) or with the table fixed.
//
// An attempt counts as work, stranded or not: strandedWait counts the
// committer again (unstrand) before it returns nil, so that the others
// wait for what its attempt shows. The state ends whenever a committer
// tries again, and comes again once its try has failed, or its batch is
// done: the last tries come one after another, and one that commits
// lets the others try again, and dead-letter their rows. The decision is
// taken under run.strandMu with the state, so that no committer gives its
// rows up on a state that another's attempt has already ended.
func (c *committer) strandedWait(ctx context.Context, d time.Duration) error {
	r := c.r
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		r.strandMu.Lock()
		c.strandLocked()
		if r.allStranded() {
			switch {
			case !c.lastTry || c.tableTakesRows():
				c.unstrandLocked()
				c.lastTry = true
				r.strandMu.Unlock()
				return nil
			case !r.triesToCome():
				r.strandMu.Unlock()
				return &givenUpError{}
			}
		}
		change := r.strandChange
		r.strandMu.Unlock()
		select {
		case <-change: // look again
		case <-t.C:
			c.unstrand()
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// strandLocked takes the committer's batch out of run.working, and puts
// it in run.stranded, under run.strandMu: it waits in strandedWait to
// retry rows held for a suspect error, and the batcher is done. unstrand
// counts it again, as it tries them (strandedWait) or its hold ends
// (process).
func (c *committer) strandLocked() {
	if _, ok := c.r.stranded[c]; !ok {
		c.r.stranded[c] = struct{}{}
		c.r.addWorkLocked(-1)
	}
}

func (c *committer) unstrand() {
	c.r.strandMu.Lock()
	c.unstrandLocked()
	c.r.strandMu.Unlock()
}

func (c *committer) unstrandLocked() {
	if _, ok := c.r.stranded[c]; ok {
		delete(c.r.stranded, c)
		c.r.addWorkLocked(1)
	}
}

// giveUp leaves the rows b.rows[lo:], held for e, unacked: JetStream
// redelivers them after ack_wait. It marks them settled first, as settle
// does, so that the heartbeat sends no more InProgress for them. Their
// events' life in the process ends here all the same (pipeline.Event.End,
// outcome "given_up"): their spans end, failed, and their messages give
// back their hold on the in-flight budget, as a stale row's do (settle).
// Logged at Warn, with the lowest stream sequence of the rows (probe
// reorders them) and the SQLSTATE but not the message, which may quote a
// row (see logSuspect).
func (c *committer) giveUp(b *batch, lo int, e *givenUpError) {
	n := len(b.rows) - lo
	if n <= 0 {
		return
	}
	b.settledTo(len(b.rows))
	c.s.st.givenUp.Add(uint64(n))
	lowest := b.rows[lo].Event.StreamSeq
	for i := lo; i < len(b.rows); i++ {
		lowest = min(lowest, b.rows[i].Event.StreamSeq)
		telemetry.EndMessage(&b.rows[i].Event, "given_up", e)
	}
	c.s.log.Warn("drain: rows the database refuses with an error that a row or the table may cause, and no other row left "+
		"to commit to tell which: left unacked; JetStream delivers them again after ack_wait, and a run that commits other "+
		"rows beside them dead-letters them if they are still refused",
		"rows", n, "lowest_stream_seq", lowest, "sqlstate", e.sqlstate)
}

// linkTaken links the batch's span to the messages of rows, taken into
// the batch (holdWait): the span of the COPY that commits them.
func (c *committer) linkTaken(rows []pipeline.Row) {
	c.spanMsgs += len(rows)
	c.span = c.s.tracing.LinkCopy(c.span, c.s.cfg.Table, rows, c.spanMsgs)
}

// logSuspect logs a classSuspect error that is being retried, once per
// SQLSTATE: with the server's message only when neither a function nor a
// trigger raised it (a RAISE may quote a row's values, which go to dead
// letters, not into the log), such as a server that stopped taking
// writes to avoid a transaction ID wraparound (54000), or corruption.
func (s *Sink) logSuspect(err error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		s.logConfigError(err)
		return
	}
	if !s.firstSeen("suspect " + pgErr.Code) {
		return
	}
	args := append([]any{"sqlstate", pgErr.Code}, schemaNames(pgErr)...)
	if pgErr.Where == "" && !strings.HasPrefix(pgErr.Code, "P0") && !strings.HasPrefix(pgErr.Code, "22") {
		args = append(args, "err", pgErr.Message)
		if strings.Contains(pgErr.Message, "wraparound") {
			args = append(args, "hint", "the server takes no writes until the database is vacuumed: see PostgreSQL's "+
				"\"Preventing Transaction ID Wraparound Failures\"")
		}
	}
	s.log.Error("the database refuses rows with an error that one row or the table may cause (a CHECK or NOT NULL constraint, a cast that "+
		"fails in a CHECK or a DEFAULT, a trigger raised, an index limit, an internal error), and no row has committed since to show that the table takes any: retrying them until one commits "+
		"here or elsewhere, or the table is fixed", args...)
}

// logTimeoutSplit logs that a piece of rows rows timed out on the server
// and that the committer now tries pieces of piece rows at most (see
// pieceTimedOut): at Warn once per stillFailingEvery for the sink, as
// every committer may do it while the limit is short, at Debug in between.
func (s *Sink) logTimeoutSplit(err error, rows, piece int) {
	s.log.Log(context.Background(), warnEvery(&s.splitWarned), "batch timed out on the server; trying it in smaller pieces",
		withHint(err, "rows", rows, "piece_rows", piece, "err", err)...)
}

// warnEvery is the level of a line that may come from every committer or
// batch again and again while one cause lasts: slog.LevelWarn once per
// stillFailingEvery for the sink (per e), slog.LevelDebug in between.
func warnEvery(e *pipeline.Every) slog.Level {
	if _, ok := e.Allow(time.Now(), stillFailingEvery); ok {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// logConfigError logs a configuration-class error loudly, once per distinct
// SQLSTATE and message.
func (s *Sink) logConfigError(err error) {
	key := err.Error()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		key = pgErr.Code + " " + pgErr.Message
	}
	if !s.firstSeen(key) {
		return
	}
	if pgErr != nil && strings.HasPrefix(pgErr.Code, "28") {
		// Refused at login: nothing in the table mends it, and jetsink
		// reads postgres.url at start only.
		s.log.Error("the database refuses jetsink's login (a changed password, or pg_hba.conf); if the credentials changed, "+
			"restart jetsink with the new ones in postgres.url: events wait in JetStream and the batch is retried until then", "err", err)
		return
	}
	s.log.Error("the database refuses every batch; fix the table or the permissions (`jetsink check` says what differs, where it can see it; "+
		"not what a trigger writes elsewhere: the error says what was refused): events wait in JetStream and the batch is retried until then", withHint(err, "err", err)...)
}

// firstSeen reports whether key is new to s.seenErrs, and records it.
func (s *Sink) firstSeen(key string) bool {
	s.seenErrsMu.Lock()
	defer s.seenErrsMu.Unlock()
	if _, seen := s.seenErrs[key]; seen {
		return false
	}
	s.seenErrs[key] = struct{}{}
	return true
}

// attempt runs one transaction. In at-least-once mode that is a single
// Query of the COPY between two type guards (see Sink.buildSQL), which
// PostgreSQL runs as one transaction: it commits when the server has taken
// the last row, with the same durability as an explicit COMMIT, and saves
// BEGIN's and COMMIT's round trips and parses, which at low rates cost
// more than the COPY of a small batch. Exactly-once's Query runs BEGIN;
// the type guard and the COPY into the staging table; INSERT ... SELECT
// ... ON CONFLICT DO NOTHING; COMMIT. When the INSERT inserted fewer rows
// than staged, a query after the commit looks for the batch's keys the
// table lacks (and attempt returns a *missingError if there were any, a
// *lookupError if the query failed).
// unknown reports that the statement that commits was sent and no answer
// came back, so the rows may have been committed.
//
// A connection the server ended while it was idle (a restart,
// pg_terminate_backend, idle_session_timeout) fails the first statement
// with the server's FATAL error, before anything of the batch ran: such an
// attempt is made again at once on a new connection, without a warning or
// a retry counted (see endedIdle). A session ended once the Query had
// begun (a COPY waiting on a lock that an operator's pg_terminate_backend
// ended) is a failed attempt like any other: warned of, counted, retried
// after the backoff. So is an exactly-once Query whose COPY finds no
// staging table in the session (stagingMissing: behind a pooler in
// transaction mode, another server session): made again at once with the
// table's CREATE.
func (c *committer) attempt(ctx context.Context, rows []pipeline.Row) (unknown bool, err error) {
	reused := c.conn != nil && !c.conn.IsClosed()
	c.untouched = false
	unknown, err = c.try(ctx, rows)
	if err != nil && reused && c.untouched && !unknown && ctx.Err() == nil && endedIdle(err) && (c.conn == nil || c.conn.IsClosed()) {
		c.s.log.Debug("the server had ended the connection; trying the batch on a new one", "rows", len(rows), "err", err)
		c.closeConn()
		unknown, err = c.try(ctx, rows)
	}
	if err != nil && !unknown && ctx.Err() == nil && c.stagingMissing(err) {
		c.s.log.Debug("the session has no staging table (a pooler's other server session, or a DISCARD); creating it and trying the batch again",
			"rows", len(rows), "err", err)
		c.staged = false
		return c.try(ctx, rows)
	}
	return unknown, err
}

// stagingMissing reports whether err is exactly-once's COPY into the
// staging table failing because the session lacks the table, in a Query
// without its CREATE (c.staged was set): 42P01, or 3F000 in a session
// that never had a temporary table ("schema pg_temp does not exist"). The
// COPY names no other relation, so no message is read. A pooler in
// transaction mode hands each transaction some server session, not
// always the one that created the table; a DISCARD ALL drops it.
func (c *committer) stagingMissing(err error) bool {
	if c.s.cfg.Mode != ExactlyOnce || !c.eo.staged {
		return false
	}
	if e, ok := errors.AsType[*copyStmtError](err); !ok || e.unready {
		return false
	}
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pgErr.Code == "42P01" || pgErr.Code == "3F000")
}

// endedIdle reports whether err is the server's FATAL error for a session
// it ended: 57P01 (pg_terminate_backend, a fast shutdown), 57P02 (another
// backend crashed), 57P05 (idle_session_timeout).
func endedIdle(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok || cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity) != "FATAL" {
		return false
	}
	switch pgErr.Code {
	case "57P01", "57P02", "57P05":
		return true
	}
	return false
}

// try is one attempt (see attempt).
func (c *committer) try(ctx context.Context, rows []pipeline.Row) (unknown bool, err error) {
	s := c.s
	c.waitLogged = 0
	if err := ctx.Err(); err != nil {
		return false, err // given up: a COPY sent now would only be cancelled
	}
	if c.conn != nil && (c.conn.IsClosed() || s.behind(c.conn.PgConn())) {
		// Closed, or made to a primary that a failover has left behind
		// since (a partition healed): its next connect is validated.
		c.closeConn()
	}
	if c.conn == nil {
		if err := c.connect(ctx); err != nil {
			return false, err
		}
	} else if c.unfound {
		// Opened before the table was made (by jetsink init, by hand):
		// look again, so that this attempt's statements name it by its
		// schema-qualified name (pinTable, unless a check has) and its
		// guards know its types. Else the connection's batches went on
		// naming it as configured, looked up along search_path, and a
		// table of that name made later earlier on the path took the
		// rows.
		if err := c.readTypes(ctx, c.conn); err != nil {
			c.closeConn()
			return false, err
		}
	}
	// The statements begin: the commit's duration (took) and the attempt's
	// age count from here, not from the connect (every host tried, TLS,
	// the types read), nor from a try before that the server had ended.
	c.stmtsAt = time.Now()
	stop := watchConn(c.conn.PgConn().Conn(), s.cfg.DeadConnectionTimeout)
	c.waitPID = c.conn.PgConn().PID()
	stopSlow := c.watchSlow(len(rows))
	if c.started != nil { // nil for a committer outside Run (tests, benchmarks)
		c.started.Store(s.stamp(c.stmtsAt)) // not UnixNano: the wall clock steps
		defer c.started.Store(0)
	}
	defer func() {
		c.waitLogged = stopSlow()
		if !stop() {
			return
		}
		s.st.deadConns.Add(1)
		c.closeConn() // closed under pgx's feet: the next attempt connects anew
		if err != nil {
			err = fmt.Errorf("no sign of life from the server for %v, connection given up: %w", s.cfg.DeadConnectionTimeout, err)
		}
	}()
	c.guards = s.copySQL.Load()
	if s.cfg.Mode == AtLeastOnce {
		sent, _, err := c.copy(ctx, guardedCopy(*c.guards, s.copyStmts), rows)
		c.answered = time.Now()
		if err != nil && committedMiscount(err) == nil {
			return sent && outcomeUnknown(err), err
		}
		c.pinWritten(ctx)
		return false, err
	}
	// Exactly-once: one Query begins the transaction, creates the staging
	// table on a new connection, copies the rows into it after the type
	// guard, inserts them from it into the table and commits. Its error
	// leaves the transaction open (aborted) on the connection.
	defer func() {
		if err != nil && c.conn != nil && !c.conn.IsClosed() && c.conn.PgConn().TxStatus() != 'I' {
			if _, rerr := c.conn.Exec(ctx, "rollback"); rerr != nil {
				c.closeConn() // its state is unknown
			}
		}
	}()
	sent, inserted, err := c.copy(ctx, c.exactlyOnce(), rows)
	// The commit's time (took, and the events' latency to it) ends here,
	// at the COMMIT's answer: not after the lookup below.
	c.answered = time.Now()
	if inserted > 0 { // committed (here, at least), ON CONFLICT skipping the rest
		c.inserted += int(inserted)
	}
	if _, ok := errors.AsType[*unreplicatedError](err); ok {
		// Stored here; on the standby perhaps not: retried, and the
		// table's key takes what is there already (ON CONFLICT). The
		// retry's COMMIT waits for the standby too even when every row
		// conflicts, and the standby then has all WAL up to it, the first
		// commit's included. Measured on PostgreSQL 15 with a standby
		// that never answers (TestSyncRepCancelIsNotAcked): a commit that
		// wrote rows into the staging table waits, one that only took an
		// xid does not. Likely the AccessExclusiveLock that emptying the
		// table ON COMMIT takes, which PostgreSQL logs to WAL for standbys.
		c.staged = true
		return true, err
	}
	if err != nil {
		return sent && outcomeUnknown(err), err
	}
	c.staged = true
	c.pinWritten(ctx)
	if inserted == int64(len(rows)) {
		return false, nil
	}
	// Fewer rows inserted than staged: conflicts (rows stored before, which
	// is what this mode is for) or rows that a BEFORE INSERT trigger
	// returning NULL (or a DO INSTEAD NOTHING rule) left out. Only the
	// latter are missing from the table: look the batch's keys up in it.
	// One more query, only when something did not insert. (After the
	// commit, not before: a row this batch stored that another session
	// deletes or re-keys within that round trip is taken for missing, and
	// dead-lettered. Nothing is lost; such a table cannot tell redeliveries
	// from new events anyway.)
	if c.conn == nil || c.conn.IsClosed() {
		// Closed after the commit (ctx ended meanwhile, or the server
		// ended the session before ReadyForQuery): the rows are not
		// acked (sent again, or redelivered: they conflict).
		return false, &lookupError{inserted: inserted,
			err: fmt.Errorf("look for rows missing from the table after the commit: %w", cmp.Or(ctx.Err(), pgconn.ErrConnClosed))}
	}
	missing, err := c.missingKeys(ctx, rows)
	if err != nil {
		return false, &lookupError{inserted: inserted, err: fmt.Errorf("look for rows missing from the table after the commit: %w", err)}
	}
	if len(missing) > 0 {
		return false, &missingError{sent: len(rows), keys: missing}
	}
	return false, nil
}

// pinWritten reads the types again after a commit when the read before
// its statements found no table: made between the two, it is the one
// the commit wrote, pinned now (pinTable), not at the connection's next
// batch, if one comes. A failed read is the next attempt's to make
// again: the rows are stored.
func (c *committer) pinWritten(ctx context.Context) {
	if !c.unfound || c.conn == nil || c.conn.IsClosed() {
		return
	}
	_ = c.readTypes(ctx, c.conn)
}

// lookupTimeoutsPassing is how many lookups after a commit (missingKeys) in
// a row may time out (lost connections between them not counted) before
// the next is a failed attempt like any other (commitRetry): counted, the
// piece halved, the sink failing.
const lookupTimeoutsPassing = 1

// lookupQuietPasses is how many of a batch's failed lookups after its
// commit may pass quietly (lookupPasses); so may none once
// stillFailingEvery has gone by since the first failed.
const lookupQuietPasses = 3

// lookupPasses counts the failed lookups after a batch's commits
// (committer.passes: one per batch, over the pieces a timeout cuts it into).
type lookupPasses struct {
	quiet    int       // passed quietly
	timeouts int       // server timeouts in a row, lost connections between them not counted; commitRetry clears it when an attempt commits and its lookup answers
	first    time.Time // when the first failed
}

// passing reports whether a lookup that failed with err at now, after its
// commit, is retried quietly as committed-but-unconfirmed (lookupError),
// not as a failed attempt: a lost connection (lostConn), or a server
// timeout (timedOut) while no more than lookupTimeoutsPassing have come
// in a row; and only lookupQuietPasses times, within stillFailingEvery of
// the first failure. Any other failure is a failed attempt: a transient
// server error (53200, 40001, 55P03, 57P01) counted with the sink
// failing; a timeout past the bound halving the batch, as a COPY's does,
// so a lookup that always exceeds a statement_timeout at this batch size
// ends; one that fails for good (a grant on the key columns revoked, a
// scan error) reported. A connection that a pooler cuts on every lookup,
// or timeouts between lost connections, then make the sink report
// failing too, not only pass for ever.
func (p *lookupPasses) passing(err error, now time.Time) bool {
	if p.first.IsZero() {
		p.first = now
	}
	lost := lostConn(err)
	switch {
	case timedOut(err):
		p.timeouts++
	case !lost:
		p.timeouts = 0
	}
	if p.quiet >= lookupQuietPasses || now.Sub(p.first) >= stillFailingEvery {
		return false
	}
	if !lost && (!timedOut(err) || p.timeouts > lookupTimeoutsPassing) {
		return false
	}
	p.quiet++
	return true
}

// lostConn reports whether err (transient) is a connection lost: no answer
// from the server (a network error, the connection closed), or a
// connection exception (class 08) a pooler sends for the server
// connection it lost. Not a server's refusal, an out of memory (53200),
// a serialization failure (40001), a lock timeout (55P03) or a shutdown
// (57P01).
func lostConn(err error) bool {
	if classify(err) != classTransient {
		return false
	}
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return !ok || strings.HasPrefix(pgErr.Code, "08")
}

// rowKey is a row's exactly-once key: its message's stream and sequence, as
// text (the columns' types are the mapping's: bigint, numeric or text).
type rowKey struct {
	stream, seq string
}

func keyOf(row *pipeline.Row) rowKey {
	return rowKey{row.Event.Stream, strconv.FormatUint(row.Event.StreamSeq, 10)}
}

// missingKeys returns the keys of rows, just committed or refused
// (refusedButStored), that the table lacks (the exactly-once missingSQL,
// which looks them up by the table's unique key): one round trip. Its
// error is the query's, unwrapped: the caller says which lookup failed.
func (c *committer) missingKeys(ctx context.Context, rows []pipeline.Row) (map[rowKey]struct{}, error) {
	streams, seqs := make([]string, len(rows)), make([]string, len(rows))
	for i := range rows {
		k := keyOf(&rows[i])
		streams[i], seqs[i] = k.stream, k.seq
	}
	rs, err := c.conn.Query(ctx, c.s.tsql.Load().missing, streams, seqs)
	if err != nil {
		return nil, err
	}
	keys := map[rowKey]struct{}{}
	var k rowKey
	if _, err := pgx.ForEachRow(rs, []any{&k.stream, &k.seq}, func() error {
		keys[k] = struct{}{}
		return nil
	}); err != nil {
		return nil, err
	}
	return keys, nil
}

// integralText drops the zero fraction a numeric(p,s) column's text has
// ("7.00" -> "7"), so that it reads as a decimal sequence (StoredSeq).
func integralText(s string) string {
	if i := strings.IndexByte(s, '.'); i >= 0 && strings.Trim(s[i+1:], "0") == "" {
		return s[:i]
	}
	return s
}

// missingError reports an exactly-once transaction that committed while
// the INSERT from staging left the rows with these keys out of the table
// (as they were looked up after the commit):
// a BEFORE INSERT trigger returned NULL for them (perhaps storing them in
// an inheritance child, which the lookup does not read), or a rule dropped them
// (or a trigger changed their key, so that they are stored under another
// one; that shows only when another row of the batch conflicted, since
// only then is the table searched). The other rows of the batch are
// stored.
type missingError struct {
	sent int
	keys map[rowKey]struct{}
}

func (e *missingError) Error() string {
	return fmt.Sprintf("move %d rows from staging: committed with %d of them missing from the table", e.sent, len(e.keys))
}

// lookupError reports an exactly-once transaction that committed with
// fewer rows inserted than staged, and whose lookup of the rows missing
// from the table (missingKeys) failed: a statement_timeout, a connection
// lost after the commit. Which of its rows it stored is not known, so none
// is settled; commitRetry sends the rows again (those stored conflict) and
// the lookup runs again.
type lookupError struct {
	inserted int64 // the rows the INSERT from staging stored
	err      error
}

func (e *lookupError) Error() string {
	return "the transaction committed, but: " + e.err.Error()
}

func (e *lookupError) Unwrap() error { return e.err }

// committedMissing returns err's *missingError, nil if it is none.
func committedMissing(err error) *missingError {
	var e *missingError
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// copy sends rows with the Query q holding one binary COPY on the
// committer's connection (see sendCopy), and returns the row count of q's
// INSERT from staging (exactly-once; see copyResult). After an error the
// server did not answer with, the connection is closed: its state is
// unknown. An at-least-once COPY that commits with a row count other than
// len(rows) returns a *miscountError.
func (c *committer) copy(ctx context.Context, q copyQuery, rows []pipeline.Row) (sent bool, inserted int64, err error) {
	sent, res := sendCopy(ctx, c.conn.PgConn(), &c.wire, q, rows)
	err = res.err
	c.untouched = res.untouched
	var pgErr *pgconn.PgError
	_, broken := errors.AsType[*brokenConnError](err)
	_, unreplicated := errors.AsType[*unreplicatedError](err)
	if broken || ctx.Err() != nil || err != nil && !errors.As(err, &pgErr) && !unreplicated {
		// No answer from the server, or one on a connection that broke,
		// or ctx has ended (the connection may carry a deadline now,
		// even after a COPY that committed). Not a commit whose wait for
		// a synchronous standby a cancel ended (pg_cancel_backend): the
		// server answered it to ReadyForQuery, and the connection serves
		// the retry (one that broke before ReadyForQuery is closed
		// already).
		c.closeConn()
	}
	if err != nil {
		if res.failedAt > 0 && res.failedAt < q.stmts {
			// The server's error (a FATAL too) came before the last
			// statement: nothing committed, neither exactly-once's
			// explicit transaction nor at-least-once's implicit one,
			// which commits as the Query's last statement ends.
			sent = false
		}
		inserted = -1
		if unreplicated {
			// Committed here: the rows the INSERT stored, which the
			// retry's ON CONFLICT skips (counted in the batch's span).
			inserted = res.inserted
		}
		return sent, inserted, c.statementError(q, res, len(rows))
	}
	if res.stored != int64(len(rows)) && q.insertAt == 0 {
		// (Exactly-once's COPY goes into the staging table, and the keys
		// looked up after the commit tell which rows are missing.)
		return sent, -1, &miscountError{sent: len(rows), stored: res.stored}
	}
	return sent, res.inserted, nil
}

// exactlyOnce is the Query of exactly-once (see Sink.buildSQL): BEGIN; the
// staging table's CREATE, unless the connection has it; the type guard
// and the COPY into staging (copySQL); the INSERT from staging; COMMIT.
// Built again only when the guards or the staging table's need change.
func (c *committer) exactlyOnce() copyQuery {
	s := c.s
	if c.eo.guards != c.guards || c.eo.staged != c.staged || c.eo.q.sql == "" {
		q := guardedCopy(*c.guards, s.copyStmts)
		pre, n := "BEGIN; ", 1
		if !c.staged {
			pre, n = pre+s.stageSQL+"; ", 2
		}
		q.sql = pre + q.sql + "; " + s.tsql.Load().insert + "; COMMIT"
		q.copyAt += n
		q.guards <<= n
		q.insertAt = q.stmts + n + 1
		q.stmts += n + 2
		c.eo.q, c.eo.guards, c.eo.staged = q, c.guards, c.staged
	}
	return c.eo.q
}

// statementError says which statement of q failed with res.err: at is its
// place (copyResult.failedAt; past the last, an error after it, a FATAL
// before ReadyForQuery). Exactly-once's statements before the guard are
// BEGIN and the staging table's CREATE; after the COPY come the INSERT
// from staging, where row-level security's policies apply
// (fromStagingError), and COMMIT. The COPY's error is a copyStmtError,
// marked unready when the session did not go on after it (not
// res.ready): an ERROR 08P01 followed by the connection closing is an
// older PgBouncer's report of the server connection it lost, not the
// server reading a row.
func (c *committer) statementError(q copyQuery, res copyResult, n int) error {
	at, err := res.failedAt, res.err
	if at == q.copyAt {
		return &copyStmtError{n: n, err: err, unready: !res.ready}
	}
	if q.insertAt > 0 && at > 0 && at <= q.stmts && at != q.copyAt && q.guards&(1<<at) == 0 {
		switch {
		case at == q.insertAt:
			return &fromStagingError{n: n, err: err}
		case at == q.stmts:
			return fmt.Errorf("commit %d rows: %w", n, err)
		case at == 1:
			return fmt.Errorf("begin: %w", err)
		default:
			return fmt.Errorf("create staging table: %w", err)
		}
	}
	return fmt.Errorf("copy %d rows: %w", n, err)
}

// copyStmtError is an error of the COPY statement itself, the one that
// reads the rows' fields (not a guard's, nor exactly-once's INSERT or
// COMMIT): see classify's 08P01. unready: the session closed before
// ReadyForQuery, so the error may be a pooler's, not the server's reading
// of a row (classify's 08P01 rule and stagingMissing want it ready; a
// line of context on it is the COPY's own either way, raisedInFunction).
type copyStmtError struct {
	n       int
	err     error
	unready bool
}

func (e *copyStmtError) Error() string {
	return fmt.Sprintf("copy %d rows: %v", e.n, e.err)
}

func (e *copyStmtError) Unwrap() error { return e.err }

// fromStagingError is exactly-once's INSERT from the staging table
// failing: the statement where row-level security's policies apply (see
// Sink.classify).
type fromStagingError struct {
	n   int
	err error
}

func (e *fromStagingError) Error() string {
	return fmt.Sprintf("move %d rows from staging: %v", e.n, e.err)
}

func (e *fromStagingError) Unwrap() error { return e.err }

// miscountError reports an at-least-once COPY that committed while the
// server counted another number of rows than were sent: a BEFORE INSERT
// trigger that returned NULL (or a foreign table's wrapper) left rows out,
// or the tag could not be read (stored -1). Which rows are missing is
// unknown.
type miscountError struct {
	sent   int
	stored int64 // -1: no row count in the CommandComplete tag
}

func (e *miscountError) Error() string {
	if e.stored < 0 {
		return fmt.Sprintf("copy %d rows: committed without a row count in its CommandComplete tag", e.sent)
	}
	return fmt.Sprintf("copy %d rows: committed with %d rows counted by the server", e.sent, e.stored)
}

// committedMiscount returns err's *miscountError, nil if it is none.
func committedMiscount(err error) *miscountError {
	var e *miscountError
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// errStaleEpoch ends the span of a committed row's message that is not
// acked because its stream was replaced (see Sink.SetEpochs).
var errStaleEpoch = fmt.Errorf("not acked: %w", pipeline.ErrStaleEpoch)

// settle acks rows[lo:hi] of b, which have just been committed, except
// those taken in an earlier epoch than the consumer's (see
// Sink.SetEpochs).
func (c *committer) settle(b *batch, lo, hi int) {
	bytes := c.ack(b, lo, hi)
	stored := b.rows[lo:hi]
	n := len(stored)
	c.settled += n
	c.bytes += int(bytes)
	c.s.metrics.BatchCommitted(context.Background(), stored, int(bytes), c.took, c.commitAt)
	st := &c.s.st
	st.batches.Add(1)
	st.rows.Add(uint64(n))
	st.bytes.Add(bytes)
}

// errorType is err's error.type and SQLSTATE for a "retry" event of the
// batch's span (telemetry.CopyRetry): the server's SQLSTATE when it
// answered with one, else what kind of failure it was, in few values.
func errorType(err error) (typ, sqlstate string) {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code, pgErr.Code
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return "connect", ""
	}
	if _, ok := errors.AsType[*typesChangedError](err); ok {
		return "types_changed", ""
	}
	if _, ok := errors.AsType[*brokenConnError](err); ok {
		return "connection_lost", ""
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return "timeout", ""
	}
	return "_OTHER", ""
}

// stopError is the error of a batch's span that a hard stop ended while
// its attempts failed: how many failed since the batch last committed rows
// or dead-lettered one (failuresDealtWith), and the last one's error, shown
// as the log shows it (shownError).
func (c *committer) stopError() error {
	shown := shownError(c.lastFail, c.s.classify(c.lastFail))
	attempts := "attempts"
	if c.failed == 1 {
		attempts = "attempt"
	}
	return fmt.Errorf("hard stop after %d failed %s; last: %v", c.failed, attempts, shown)
}

// shownError is err, of class cl, as the log and a batch's span show a
// failed attempt: a *pgconn.PgError of class suspect or data by its
// SQLSTATE and the names it gives (schemaNames), as its message may quote
// a row's value (22P02 an enum label, 22021 bytes; see logSuspect), any
// other error in full.
func shownError(err error, cl class) any {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && (cl == classSuspect || cl == classData) {
		shown := "SQLSTATE " + pgErr.Code
		names := schemaNames(pgErr)
		for i := 0; i < len(names); i += 2 {
			shown += fmt.Sprintf(", %s %s", names[i], names[i+1])
		}
		return shown
	}
	return err
}

// schemaNames is what pgErr names of the schema, as log attributes: the
// table, the column, the constraint and the data type it gives (fields of
// their own, never a row's value), so that a line on a table that refuses
// every row says which constraint to look at.
func schemaNames(pgErr *pgconn.PgError) []any {
	var names []any
	for _, kv := range [][2]string{{"table", pgErr.TableName}, {"column", pgErr.ColumnName},
		{"constraint", pgErr.ConstraintName}, {"data_type", pgErr.DataTypeName}} {
		if kv[1] != "" {
			names = append(names, kv[0], kv[1])
		}
	}
	return names
}

// failuresDealtWith forgets the batch's failed attempts (c.failed,
// c.lastFail) once some of its rows have committed or one was
// dead-lettered: what failed them is dealt with, and a hard stop's span
// error (stopError) blames only failures since, of rows still unsettled.
func (c *committer) failuresDealtWith() {
	c.failed, c.lastFail = 0, nil
}

// copyCounts is what the batch's span reports at its end
// (telemetry.EndCopy): the rows settled (acked; jetsink.batch.rows), the
// rows its commits inserted (db.response.returned_rows) and, in
// exactly-once mode, the rows acked as stored already
// (jetsink.batch.duplicates: a redelivery that ON CONFLICT skipped, or a
// refused row found in the table, ackStored). In at-least-once mode every
// row settled was inserted, and there are no duplicates to tell (-1).
func (c *committer) copyCounts() telemetry.CopyCounts {
	if c.s.cfg.Mode != ExactlyOnce {
		return telemetry.CopyCounts{Settled: c.settled, Inserted: c.settled, Duplicates: -1, DeadLettered: c.parked}
	}
	// Rows a commit inserted and that were then not acked (a stop, a
	// release) leave fewer settled than inserted: no duplicates among
	// them to count.
	return telemetry.CopyCounts{Settled: c.settled, Inserted: c.inserted, Duplicates: max(0, c.settled-c.inserted), DeadLettered: c.parked}
}

// ack acks rows[lo:hi] of b, found in the table, but those of an earlier
// epoch (see settle), marks them settled and returns their tuples' bytes.
// It counts no batch nor row: settle does, for a commit.
func (c *committer) ack(b *batch, lo, hi int) (bytes uint64) {
	b.settledTo(hi)
	var failed, stale uint64
	var first error
	epoch := c.s.epochs.Hold()
	acks := c.acks[:0]
	for i := lo; i < hi; i++ {
		row := &b.rows[i]
		bytes += uint64(len(row.Tuple))
		if row.Event.Msg == nil {
			continue
		}
		if row.Event.Epoch != epoch {
			stale++
			telemetry.EndMessage(&row.Event, "stale", errStaleEpoch)
			continue
		}
		acks = append(acks, row.Event.Msg)
	}
	errs := slices.Grow(c.ackErrs[:0], len(acks))[:len(acks)]
	c.s.ackAll(acks, errs)
	c.s.epochs.Release()
	// The rows acked above, in the same order: each one's result.
	k := 0
	for i := lo; i < hi && k < len(acks); i++ {
		row := &b.rows[i]
		if row.Event.Msg == nil || row.Event.Epoch != epoch {
			continue
		}
		err := errs[k]
		k++
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
		telemetry.EndMessage(&row.Event, "ack", err)
	}
	// Keep the scratch, not the messages nor the errors.
	clear(acks)
	clear(errs)
	c.acks, c.ackErrs = acks[:0], errs[:0]
	n := hi - lo
	telemetry.Acked(c.span, n, int(failed))
	st := &c.s.st
	if stale > 0 {
		st.staleAcks.Add(stale)
		c.s.log.Warn("rows committed but not acked: their stream was re-created since they were taken, and an ack "+
			"would settle the new stream's event with the same sequence", "messages", stale, "of", n)
	}
	if failed > 0 {
		st.ackErrs.Add(failed)
		c.s.log.Warn("ack failed after commit; those messages will be redelivered (a duplicate row in at-least-once mode)",
			"messages", failed, "of", n, "err", first)
	}
	return bytes
}

// settleMissing settles rows[lo:hi] of b, whose exactly-once transaction
// committed with the rows of e.keys missing from the table: the stored
// rows are acked, the missing ones dead-lettered (code "row_count"), so
// that replaying the dead letters stores each of them once. The missing
// rows are moved to the front of rows[lo:hi] and dead-lettered first, one
// at a time (parkHeld), so that the heartbeat keeps the rows still waiting
// from being redelivered while a slow dead-letter stream holds them up.
func (c *committer) settleMissing(ctx context.Context, b *batch, lo, hi int, e *missingError) {
	found := map[rowKey]struct{}{}
	for i := lo; i < hi; i++ {
		if k := keyOf(&b.rows[i]); hasKey(e.keys, k) {
			found[k] = struct{}{}
		}
	}
	if len(found) < len(e.keys) {
		// A key the server returned matches no row: the keys cannot be
		// trusted to say which rows are missing, so none is acked.
		st := &c.s.st
		st.miscounts.Add(1)
		st.uncounted.Add(uint64(len(e.keys)))
		c.s.log.Error("an exactly-once batch committed with rows missing from the table, and the keys PostgreSQL returned for them "+
			"match none of its rows: every row is dead-lettered with code "+pipeline.CodeRowCount+", not acked",
			"rows", hi-lo, "missing_keys", len(e.keys))
		dl := pipeline.DeadLetter{Stage: pipeline.StageSink, Code: pipeline.CodeRowCount,
			Reason: fmt.Sprintf("the transaction holding this row committed with %d of its %d rows missing from the table, "+
				"and which ones could not be told (their keys match no row sent); this row may be missing from the table", len(e.keys), hi-lo)}
		for i := lo; i < hi; i++ {
			c.parkHeld(ctx, b, i, dl)
		}
		return
	}
	st := &c.s.st
	st.miscounts.Add(1)
	st.uncounted.Add(uint64(len(e.keys)))
	c.s.log.Error("an exactly-once batch committed with rows missing from the table (a BEFORE INSERT trigger returned "+
		"NULL for them, a DO INSTEAD NOTHING rule dropped them, or a trigger changed their key): they are dead-lettered "+
		"with code "+pipeline.CodeRowCount+", the others acked", "rows", hi-lo, "missing_keys", len(e.keys))
	dl := pipeline.DeadLetter{Stage: pipeline.StageSink, Code: pipeline.CodeRowCount,
		Reason: "the transaction holding this row committed without it in the table: a BEFORE INSERT trigger returned NULL " +
			"for it (perhaps storing it elsewhere, an inheritance child say), a rule dropped it, or a trigger stored it under " +
			"another key; the rest of its batch was stored"}
	m := lo // rows[lo:m] are the missing ones
	b.mu.Lock()
	for i := lo; i < hi; i++ {
		if hasKey(e.keys, keyOf(&b.rows[i])) {
			b.rows[m], b.rows[i] = b.rows[i], b.rows[m]
			m++
		}
	}
	b.mu.Unlock()
	for i := lo; i < m; i++ {
		c.parkHeld(ctx, b, i, dl)
	}
	if m < hi {
		// Not when every row is missing: a commit with no row settled
		// counts no batch (Stats.Batches), as a miscounted COPY's does
		// not.
		c.settle(b, m, hi)
	}
}

func hasKey(keys map[rowKey]struct{}, k rowKey) bool {
	_, ok := keys[k]
	return ok
}

// deadLetter parks row p of b, which the database refuses with err. If the
// dead-letterer fails, it has nak'ed the message (unless its stream was
// re-created since): the row is not acked.
//
// In exactly-once mode a row the INSERT from staging refused is looked up
// in the table first (refusedButStored): a CHECK, a domain's constraint, a
// row-level security policy or a BEFORE INSERT trigger judges a row before
// ON CONFLICT finds its key stored, so an event stored before can be
// refused when delivered again (a CHECK added NOT VALID since, a consumer
// re-created to deliver from the start). Stored, it is acked as a
// duplicate, as ON CONFLICT would have; dead-lettered, a replay would store
// it again. When ctx ends before the lookup answers, the row is left
// unsettled (JetStream redelivers it) and deadLetter reports false.
func (c *committer) deadLetter(ctx context.Context, b *batch, p int, err error) bool {
	row := &b.rows[p]
	looked, stored := c.refusedButStored(ctx, b, p, err)
	if stored {
		c.ackStored(ctx, b, p, err)
		return true
	}
	if !looked && ctx.Err() != nil && c.looksUp(err) {
		return false
	}
	dl := pipeline.DeadLetter{Stage: pipeline.StageSink, Code: pipeline.CodeData, Reason: err.Error()}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		dl.SQLState = pgErr.Code
		dl.Reason = pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
		switch {
		case pgErr.Code[:2] == "23":
			dl.Code = pipeline.CodeConstraint
		case valueRefused(err, pgErr):
			// data, although suspect (held while every row fails)
		case c.s.classify(err) == classSuspect:
			dl.Code = pipeline.CodeRefused
		}
		if le, ok := errors.AsType[*loneTimeoutError](err); ok {
			dl.Code, dl.Reason = pipeline.CodeRefused, le.reason(pgErr)
		} else if c.mayBeStored(&row.Event, err, looked) {
			dl.Reason += mayBeStoredNote
		}
	}
	if !c.parkHeld(ctx, b, p, dl) {
		return true // nak'ed by the dead-letterer, settled
	}
	// The reason may quote a value of the row: it goes to the dead letter,
	// not into the log.
	// At most once a second: a table that refuses many rows would log
	// a line each, beside the consumer's (the dead-letter stream holds
	// every one, jetsink_events_dead_lettered_total counts them).
	attrs := []any{"stream", row.Event.Stream, "stream_seq", row.Event.StreamSeq, "sqlstate", dl.SQLState}
	if pgErr != nil {
		attrs = append(attrs, "constraint", pgErr.ConstraintName, "column", pgErr.ColumnName)
	}
	c.s.dlDone.Log(ctx, c.s.log, slog.LevelInfo, time.Second, "row refused by the database, dead-lettered", attrs...)
	return true
}

// storedBefore looks row p of b, refused by exactly-once's INSERT from
// staging with err, up in the table (refusedButStored) and, if it is
// there, acks it as stored before (ackStored) and reports true. Found
// absent, its key is kept in c.absent, so that deadLetter does not look
// it up again.
func (c *committer) storedBefore(ctx context.Context, b *batch, p int, err error) bool {
	looked, stored := c.refusedButStored(ctx, b, p, err)
	if stored {
		c.ackStored(ctx, b, p, err)
		return true
	}
	if looked {
		c.absent, c.absentOK = keyOf(&b.rows[p]), true
	}
	return false
}

// ackStored acks row p of b, refused by the database with err but found
// in the table by its key (refusedButStored): an event stored before, as
// ON CONFLICT would have skipped it. The row and its bytes count in
// Stats (Rows, Bytes: jetsink_events_committed_total counts such
// redeliveries too), but no batch: no commit stored it, and the metrics'
// batch latency is not this one's.
func (c *committer) ackStored(ctx context.Context, b *batch, p int, err error) {
	row := &b.rows[p]
	bytes := c.ack(b, p, p+1)
	c.settled++
	c.bytes += int(bytes)
	c.s.st.rows.Add(1)
	c.s.st.bytes.Add(bytes)
	c.s.storedDone.Log(ctx, c.s.log, slog.LevelInfo, time.Second, "row refused by the database, but its key is in the table "+
		"already: acked as stored before", "stream", row.Event.Stream, "stream_seq", row.Event.StreamSeq, "sqlstate", sqlState(err))
}

// refusedButStored looks row p of b, which the database refused with err,
// up in the table when err is exactly-once's INSERT from staging's (not a
// lone timeout's: see loneTimeoutError), on the committer's connection
// (made anew if it has none). looked reports that the lookup answered;
// stored, that the row's key is in the table. A lookup that fails for a
// lost connection or a timeout while ctx lives is tried once more on a new
// connection; one that still fails, or fails otherwise, is logged at Warn
// (at most once a second), and the row's dead letter says that it may be
// stored. When ctx has ended meanwhile, nothing is looked (the caller
// leaves the row unsettled: JetStream redelivers it).
func (c *committer) refusedButStored(ctx context.Context, b *batch, p int, err error) (looked, stored bool) {
	if !c.looksUp(err) {
		return false, false
	}
	absent := c.absentOK && c.absent == keyOf(&b.rows[p])
	c.absentOK = false
	if absent {
		return true, false // storedBefore found it missing just now
	}
	var lerr error
	for try := 0; try < 2; try++ {
		if c.conn != nil && c.conn.IsClosed() {
			c.closeConn()
		}
		if c.conn == nil {
			if lerr = c.connect(ctx); lerr != nil {
				break
			}
		}
		lctx, cancel := context.WithTimeout(ctx, readTypesTimeout)
		var missing map[rowKey]struct{}
		missing, lerr = c.missingKeys(lctx, b.rows[p:p+1])
		timeout := lctx.Err() != nil || timedOut(lerr)
		cancel()
		if lerr == nil {
			return true, len(missing) == 0
		}
		if ctx.Err() != nil || !timeout && !c.conn.IsClosed() {
			break // ended, or an answer that another try would repeat
		}
		c.closeConn() // lost, or its state unknown after a timeout
	}
	if ctx.Err() == nil {
		c.s.lookupFails.Log(ctx, c.s.log, slog.LevelWarn, time.Second, "could not look a refused row up in the table by its key; "+
			"if it is dead-lettered, its letter says that it may already be stored", "stream", b.rows[p].Event.Stream,
			"stream_seq", b.rows[p].Event.StreamSeq, "err", lerr)
	}
	return false, false
}

// looksUp reports whether a row refused with err is looked up in the table
// (refusedButStored): in exactly-once mode, for the INSERT from staging's
// error but a lone timeout's.
func (c *committer) looksUp(err error) bool {
	return c.s.cfg.Mode == ExactlyOnce && isFromStaging(err) && !isLoneTimeout(err)
}

// isFromStaging reports whether err is exactly-once's INSERT from staging's
// (fromStagingError).
func isFromStaging(err error) bool {
	_, ok := errors.AsType[*fromStagingError](err)
	return ok
}

// sqlState is err's SQLSTATE, "" if it has none.
func sqlState(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code
	}
	return ""
}

// mayBeStored reports whether ev's row, which the database refuses with
// err, may be in the table all the same, as its dead letter then says
// (replayed, it is published anew: a new key, stored twice in exactly-once
// mode): a redelivery (an earlier delivery may have committed, its ack
// lost, or be committing on another connection), or a batch with a commit
// of unknown outcome (c.unknown). In exactly-once mode, too, when err is
// the INSERT from staging's and looked is false: its CHECKs, its domains'
// constraints, its row-level security and its BEFORE INSERT triggers judge
// a row before ON CONFLICT finds it stored (a CHECK added NOT VALID since
// the row was stored, a consumer re-created to deliver stored events
// again), and the row could not be looked up in the table
// (refusedButStored), which otherwise settles it. Not for the staging
// COPY's error, which no row stored as sent meets.
func (c *committer) mayBeStored(ev *pipeline.Event, err error, looked bool) bool {
	if c.unknown || ev.Delivered > 1 {
		return true
	}
	return !looked && isFromStaging(err) // exactly-once's only
}

// deadLetterMiscounted settles rows[lo:hi] of b, whose COPY committed while
// the server counted e.stored rows of them: some of them are not in the
// table (or, with a trigger that redirects rows elsewhere, not where the
// count looks), and which ones is unknown. Acking them would lose those
// silently; sending them again would store the others twice, and a
// trigger would drop the same rows again. So every row of the COPY is
// dead-lettered (code "row_count"): the dead-letter subject holds every
// event that may be missing, for the operator to check and replay.
func (c *committer) deadLetterMiscounted(ctx context.Context, b *batch, lo, hi int, e *miscountError) {
	st := &c.s.st
	st.miscounts.Add(1)
	if e.stored >= 0 && e.stored < int64(e.sent) {
		st.uncounted.Add(uint64(int64(e.sent) - e.stored))
	}
	c.s.log.Error("a COPY committed with another row count than the rows sent (a BEFORE INSERT trigger returning NULL, "+
		"or a foreign table, leaves rows out): its messages are dead-lettered with code "+pipeline.CodeRowCount+", not acked",
		"rows_sent", e.sent, "rows_counted", e.stored, "first_stream_seq", b.rows[lo].Event.StreamSeq)
	reason := fmt.Sprintf("the COPY holding this row committed, but PostgreSQL counted %d of its %d rows; "+
		"this row may be missing from the table", e.stored, e.sent)
	if e.stored < 0 {
		reason = fmt.Sprintf("the COPY holding this row committed without a row count for its %d rows; "+
			"this row may be missing from the table", e.sent)
	}
	dl := pipeline.DeadLetter{Stage: pipeline.StageSink, Code: pipeline.CodeRowCount, Reason: reason}
	for i := lo; i < hi; i++ {
		c.parkHeld(ctx, b, i, dl)
	}
}

// parkHeld dead-letters row i of b, whose rows before it are settled. It
// marks rows[:i+1] settled first, so that the heartbeat sends no
// InProgress for the row once it is parked (nats.go refuses it for a
// terminated message, and the refusal would look like a failed heartbeat),
// and renews the row's ack wait instead, so that JetStream does not
// redeliver it while its dead letter is published. Rows after i keep their
// heartbeat while they wait.
func (c *committer) parkHeld(ctx context.Context, b *batch, i int, dl pipeline.DeadLetter) bool {
	b.settledTo(i + 1)
	row := &b.rows[i]
	c.s.renew(row)
	return c.park(ctx, row, dl)
}

// park hands row to the dead-letterer and counts the outcome. It reports
// whether the row was dead-lettered; if not, the dead-letterer has nak'ed
// its message (it comes back; see pipeline.FailedDeadLetter for the
// exception) and the failure is logged.
func (c *committer) park(ctx context.Context, row *pipeline.Row, dl pipeline.DeadLetter) bool {
	// The row leaves the batch, dead-lettered or nak'ed: the attempts
	// that failed on it are no cause of a hard stop's.
	c.failuresDealtWith()
	if derr := c.s.dl.DeadLetter(ctx, &row.Event, dl); derr != nil {
		c.s.st.deadLetterErrs.Add(1)
		if errors.Is(derr, pipeline.ErrDeadLetterHeldBack) {
			return false // logged by the dead-letterer, at most once a second
		}
		// At most once a second (a dead letter that fails fails for
		// every such row, at every delivery), as the consumer logs it.
		msg := "dead-letter failed; the message was nak'ed and will come back"
		if pipeline.FailedDeadLetter(derr) == "stale" {
			// The dead-letterer tried until the hard stop, or gave up
			// at once on a letter over the connected server's
			// max_payload, and logged giving up at Error.
			msg = "dead-letter given up (at the hard stop, or at once if over the server's max_payload); the event's stream was re-created since it was taken, so nothing delivers it again"
		}
		c.s.dlFails.Log(ctx, c.s.log, slog.LevelWarn, time.Second, msg, "stream", row.Event.Stream,
			"stream_seq", row.Event.StreamSeq, "code", dl.Code, "sqlstate", dl.SQLState, "err", derr)
		return false
	}
	c.s.st.deadLettered.Add(1)
	c.parked++
	return true
}

package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/pipeline"
)

// ErrAcksUnconfirmed is wrapped by Close's error when acks or terms that
// were sent may not have reached the server: Close could not confirm them
// (the server did not answer a flush in time, or the connection is closed),
// or a connection they went into was lost before a flush had confirmed
// them. Their events are delivered again after nats.ack_wait.
var ErrAcksUnconfirmed = errors.New("acks not confirmed by the NATS server")

// While Run runs, the consumer confirms every confirmEvery that the server
// has read the acks and terms sent so far (a PING on each connection,
// answered once the server has read what was written before it), waiting
// up to confirmTimeout. The confirmations bound what a lost connection, or
// a Close that cannot reach the server, puts in doubt: the acks sent since
// the last one (see ackLedger). Two PINGs a second cost nothing next to
// the acks.
const (
	confirmEvery   = time.Second
	confirmTimeout = 5 * time.Second
)

// abortBudget is what Close gives the connections to take what they hold
// once its context has ended (a second signal, the drain's deadline).
const abortBudget = 250 * time.Millisecond

// ackLedger follows the acks and terms handed to the connections (AckAll,
// DeadLetter), so that the consumer can tell how many may not have reached
// the server rather than claim they all did. A flush that the server
// answers confirms everything written before it. A connection lost takes
// with it what it had written and the server had not read (nats.go and
// wire alike), while what is buffered for nats.go's reconnect is sent after
// it and confirmed by the next flush. So a confirmation accounts for the
// acks sent since the one before: in doubt up to the last loss, if there was
// one since; confirmed after it, if its flush succeeded.
//
//	the acks, in the order they were sent:
//	|<- accounted for ->|<---- in doubt ---->|<- confirmed by this flush ->|
//	0               confirmed              lostAt                          n
//
// A flush that fails confirms nothing: Run's next confirmation tries again,
// Close's puts everything since confirmed in doubt.
//
// Two counts keep that conservative: a loss takes the count of acks begun
// (a batch counted before it is written, so that none written before the
// loss escapes it), a confirmation the count of acks sent (counted once
// written, so that none counted is still to be written after its PING).
// nats.go tells of a disconnect a moment late (its handler runs once its
// reader and flusher have stopped), so the acks sent in that moment are
// counted in doubt although they went into the reconnect buffer.
type ackLedger struct {
	begun  atomic.Uint64             // acks and terms being handed to a connection, or handed
	sent   atomic.Uint64             // acks and terms a connection took (written or buffered)
	lostAt atomic.Uint64             // begun when a connection was last lost (the largest)
	lostWC atomic.Pointer[wire.Conn] // the last wire connection whose loss lostAt counts

	// reconnectsSeen is nats.go's Stats().Reconnects as the consumer's
	// reconnect handler last read it: nats.go runs the disconnect handler
	// (which calls lost) a moment after the connection is gone, and the
	// reconnect handler after it, so a count above this one means a
	// reconnect whose disconnect may not have been told yet.
	reconnectsSeen atomic.Uint64
	// disconnects and reconnects count the calls of the two handlers:
	// while they are equal, the handlers know of no outage under way.
	disconnects, reconnects atomic.Uint64

	// final is set by the first to account for Close's confirmation: the
	// final confirm, or Close giving up on it (abandon); abandoned, when
	// abandon did.
	final, abandoned atomic.Bool

	mu          sync.Mutex    // one confirmation at a time; guards the fields below
	confirmed   uint64        // sent when the last confirmation was taken: what came before is accounted for
	confirmedAt atomic.Uint64 // confirmed, for abandon, which cannot take mu
	wc          *wire.Conn    // the wire connection open then, nil if none

	// doubtSeq is the highest stream sequence delivered (seqGuard.seenMax)
	// when a confirmation last counted acks in doubt: every one of them
	// was for a message at or below it (see settleDoubt).
	doubtSeq uint64
}

// begin counts k acks or terms about to be handed to a connection.
func (l *ackLedger) begin(k int) { l.begun.Add(uint64(k)) }

// end counts what begin counted as handed over (ok of them) or not.
func (l *ackLedger) end(k, ok int) {
	l.sent.Add(uint64(ok))
	if failed := k - ok; failed > 0 {
		l.begun.Add(^uint64(failed - 1)) // not sent: never in doubt
	}
}

// lost records that a connection was lost now: the acks handed to it so
// far and not yet confirmed may be lost with it.
func (l *ackLedger) lost() {
	n := l.begun.Load()
	for {
		old := l.lostAt.Load()
		if n <= old || l.lostAt.CompareAndSwap(old, n) {
			return
		}
	}
}

// abandon is Close giving up on a final confirmation stuck behind a
// connection (a write to a server that reads nothing holds its lock): it
// returns the number of acks begun since the last confirmation, all of
// them unconfirmed, and true; or false if the final confirmation has
// accounted for them already (then what it returns stands, and it may
// have returned before the close that is held). Begun, not sent: a batch
// whose write that same lock holds was counted as begun and not yet as
// sent, and its acks, of committed events, may never go out.
func (l *ackLedger) abandon() (unconfirmed uint64, ok bool) {
	if !l.final.CompareAndSwap(false, true) {
		return 0, false
	}
	l.abandoned.Store(true)
	begun := l.begun.Load()
	return begun - min(l.confirmedAt.Load(), begun), true
}

// wireLost is lost for wire connection wc, once however often it is told.
func (l *ackLedger) wireLost(wc *wire.Conn) {
	if wc != nil && l.lostWC.Swap(wc) != wc {
		l.lost()
	}
}

// AckAll acks every message of ms and puts each result in errs, as Ack on
// each would (for sink.Sink.SetAckAll). The messages the wire pull client
// delivered over one open connection are acked in one write to it; others,
// and those whose connection has closed since, one by one (the latter
// through the consumer's nats.go connection). The acks that a connection
// took are counted for Close, which confirms that the server has read them.
func (c *Consumer) AckAll(ms []pipeline.Msg, errs []error) {
	c.acks.begin(len(ms))
	wire.AckAll(ms, errs)
	ok := 0
	for _, err := range errs[:len(ms)] {
		if err == nil {
			ok++
		}
	}
	c.acks.end(len(ms), ok)
	if ok > 0 {
		// Under the sink's Hold: Current is the epoch of these events.
		c.recent.record(c.sinceBase(), c.epochs.Current(), ms, errs)
	}
}

// confirm flushes the open wire connection and nats.go's (waiting, within
// ctx, for one that is reconnecting: the PING goes after the acks buffered
// for the reconnect) and accounts for the acks and terms sent since the
// last confirmation. Those it cannot vouch for are counted in
// Stats.AcksUnconfirmed and returned: the ones sent before a connection
// was lost since the last confirmation (or during the flush: its answer
// then came on a new connection) and, when a flush failed and final is
// set, every one begun since then (also those still being handed over). When a flush fails and final is not set,
// nothing changes: the next confirmation tries again. A final confirmation
// flushes again after a connection lost during its flush (a NATS restart)
// while ctx has time and nats.go's connection is not closed.
func (c *Consumer) confirm(ctx context.Context, final bool) (unconfirmed uint64, err error) {
	l := &c.acks
	l.mu.Lock()
	defer l.mu.Unlock()
	wc := c.wc.Load()
	if wc != nil && isDone(wc) {
		// Failed (only Close closes it otherwise, after this): a
		// session's end may have told already, or not yet (it ends on
		// its own goroutine), or none was running. Counted once.
		l.wireLost(wc)
		wc = nil
	}
	if l.wc != nil && l.wc != wc {
		// Failed and replaced since the last confirmation.
		l.wireLost(l.wc)
	}
	l.wc = wc
	n := l.sent.Load()
	if n == l.confirmed && !final {
		return 0, nil // nothing to confirm: spare the server the PINGs
	}
	var lostAt uint64
	for {
		// told: the disconnect handler has run for an outage not over yet
		// (as the handlers know it), so lostAt counts its loss.
		told := l.disconnects.Load() != l.reconnects.Load()
		reconnects := c.nc.Stats().Reconnects
		if !told && reconnects != l.reconnectsSeen.Load() {
			// nats.go has reconnected (or tried to) since the handlers
			// last ran: the disconnect handler's loss may be untold.
			l.lost()
		}
		lostAt = l.lostAt.Load() // before the flush: a loss during it fails it, or shows in Reconnects
		start := time.Now()
		err = c.flush(ctx, wc)
		if err == nil {
			if !told && c.nc.Stats().Reconnects != reconnects {
				// The PING went into the reconnect buffer of a connection
				// lost before it, and the disconnect handler had not run
				// when lostAt was read: what was written on the old
				// connection may be gone.
				lostAt = n
			}
			break
		}
		if !final || ctx.Err() != nil || c.nc.IsClosed() {
			break
		}
		// A connection lost during the flush (nats.go releases its pending
		// flushes, and its disconnect aborts the wire connection): what it
		// held is in doubt; confirm the rest on what comes back.
		l.lost()
		if wc != nil && isDone(wc) {
			l.wireLost(wc)
			wc, l.wc = nil, nil
		}
		if d := 50*time.Millisecond - time.Since(start); d > 0 {
			select { // not a busy loop if a flush fails at once
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
	}
	if err != nil && !final {
		return 0, err
	}
	upTo := min(lostAt, n)
	if err != nil {
		// Final, and given up on: every ack begun is in doubt, those of a
		// batch still being handed over (a write to a server that reads
		// nothing holds the connection's lock) with the rest.
		upTo = max(n, l.begun.Load())
	}
	// Close's final confirmation accounts unless Close has given up on it
	// (abandon) and counted these already.
	if account := !final || l.final.CompareAndSwap(false, true); account && upTo > l.confirmed {
		unconfirmed = upTo - l.confirmed
		c.stats.acksUnconfirmed.Add(unconfirmed)
		// Each was begun before now, for a message delivered before now.
		l.doubtSeq = max(l.doubtSeq, c.seq.seenMax.Load())
	}
	l.confirmed = n
	l.confirmedAt.Store(n)
	return unconfirmed, err
}

// settleDoubt shows, when it can, that the acks and terms counted in
// Stats.AcksUnconfirmed took nothing with them after all: once Close's
// final confirmation went through (the server has read every ack sent
// since), the durable's ack floor at or past doubtSeq means that every
// message those acks may have been for was acked or terminated, here or
// by another instance, and none comes back for them; AcksSettled then
// takes AcksUnconfirmed. The server applies acks a moment after it reads
// them, so the floor is looked at settleLooks times, settleGap apart,
// within ctx. Nothing is shown after Close gave up on the final
// confirmation (abandon: its acks' sequences are not in doubtSeq) or a
// stream or consumer was replaced (the floor is then another's).
func (c *Consumer) settleDoubt(ctx context.Context) {
	l := &c.acks
	l.mu.Lock()
	seq := l.doubtSeq
	l.mu.Unlock()
	n := c.stats.acksUnconfirmed.Load()
	cons := c.cons.Load()
	if n == 0 || seq == 0 || l.abandoned.Load() || c.stats.epochs.Load() != 0 || cons == nil || ctx.Err() != nil {
		return
	}
	for i := range settleLooks {
		if i > 0 {
			select {
			case <-time.After(settleGap):
			case <-ctx.Done():
				return
			}
		}
		lctx, cancel := context.WithTimeout(ctx, settleLookTimeout)
		ci, err := cons.Info(lctx)
		cancel()
		if err != nil {
			return
		}
		if ci.AckFloor.Stream >= seq && n == c.stats.acksUnconfirmed.Load() {
			c.stats.acksSettled.Store(n)
			return
		}
	}
}

// How settleDoubt looks at the ack floor: it adds about 1 s to a Close
// whose acks were really lost (within Close's deadline), and at most
// settleLookTimeout when the server does not answer (a look that fails
// ends it). 1 s, not 200 ms: a loaded server (or a loaded machine under
// -race) may apply the acks it has read later than 200 ms.
const (
	settleLooks       = 6
	settleGap         = 200 * time.Millisecond
	settleLookTimeout = time.Second
)

// flush returns once the server has read everything written before it on
// wc (when not nil) and on nats.go's connection, or with the first error.
// ctx must have a deadline (nats.go's FlushWithContext wants one).
func (c *Consumer) flush(ctx context.Context, wc *wire.Conn) error {
	var werr error
	var wg sync.WaitGroup
	if wc != nil {
		wg.Go(func() {
			if err := wc.Flush(ctx); err != nil {
				werr = fmt.Errorf("flush the wire pull connection: %w", err)
			}
		})
	}
	// A PING sent while reconnecting waits in nats.go's reconnect buffer
	// behind the acks, and is answered once they have gone out on the new
	// connection; a disconnect before the answer fails it (nats.go
	// releases pending flushes with ErrConnectionClosed).
	nerr := c.nc.FlushWithContext(ctx)
	if nerr != nil {
		nerr = fmt.Errorf("flush the NATS connection (%s): %w", c.nc.Status(), nerr)
	}
	wg.Wait()
	return errors.Join(werr, nerr)
}

// confirming takes a confirmation every confirmEvery until the function it
// returns is called; that function waits for the goroutine to end, at most
// abortBudget (confirmWait), or hardConfirmWait when told that hard has
// ended.
func (c *Consumer) confirming() (stop func(hardEnded bool)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(confirmEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
			c.resendAcks(true, 0)
			cctx, cancelConfirm := context.WithTimeout(ctx, confirmTimeout)
			n, _ := c.confirm(cctx, false)
			cancelConfirm()
			if n > 0 {
				c.log.Warn("a connection to NATS was lost: acks sent before it may not have reached the server; "+
					"their events are delivered again after ack_wait (a duplicate row in at-least-once mode)", "acks", n)
			}
		}
	}()
	return func(hardEnded bool) {
		cancel()
		wait := c.confirmWait
		if hardEnded {
			wait = hardConfirmWait
		}
		select {
		case <-done:
		case <-time.After(wait):
			// Its flush waits behind a write to a server that reads
			// nothing (nats.go takes its lock before it looks at the
			// context): it ends when that write times out, and Close
			// does not wait for it either.
		}
	}
}

// hardConfirmWait is how long Run waits for the ack confirmer once hard has
// ended: time enough for one that is not held by a connection's lock to
// end, and little of the abortBudget (250 ms) a hard stop (processor.Run)
// gives all its stages.
const hardConfirmWait = 25 * time.Millisecond

// closeContext is what Close waits under: ctx while it has time left, at
// most closeWait when ctx has no deadline; when ctx has ended already,
// abortBudget.
func closeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() != nil {
		return context.WithTimeout(context.WithoutCancel(ctx), abortBudget)
	}
	if _, ok := ctx.Deadline(); !ok {
		return context.WithTimeout(ctx, closeWait)
	}
	return context.WithCancel(ctx)
}

// isDone reports whether wc has closed or failed.
func isDone(wc *wire.Conn) bool {
	select {
	case <-wc.Done():
		return true
	default:
		return false
	}
}

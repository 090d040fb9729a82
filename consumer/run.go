package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/pipeline"
)

// HeaderMsgID is the header JetStream de-duplicates on.
const HeaderMsgID = "Nats-Msg-Id"

// Back-off between attempts to subscribe or to re-create the consumer.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// Output is where Run pushes events: a pipeline.Handoff, or a
// *ringq.Dispatch[pipeline.Event]. Push returns ringq.ErrClosed when it
// was closed first (a pipeline.ChanHandoff may still take a push that
// races Close); Run calls Close when it returns.
type Output interface {
	Push(ctx context.Context, ev pipeline.Event) error
	Close()
}

// Run pulls messages continuously and pushes each, wrapped in a
// pipeline.Event, into out (blocking while the chosen ring is full, which is
// how back-pressure reaches JetStream). It is the producer of out and closes
// it before returning, whatever the outcome.
//
// Run consumes with consumer/wire (nats.pull_client "wire", the default) or
// nats.go's Consume: the pushes happen on the pull subscription's delivery
// goroutine, one message at a time, while Run's own goroutine supervises. A
// new subscription starts only after the previous one's delivery goroutine
// has finished, so out always has exactly one producer at a time.
//
// Run survives disconnects and server restarts: nats.go re-issues the pull
// on reconnect and when heartbeats stop; a wire subscription ends with its
// connection (also when nats.go's disconnects: it pulls only while the
// JetStream API can get through), hands on what it holds, and Run subscribes again on a
// new connection once nats.go is connected. When heartbeats stop Run also checks
// that the stream and consumer still exist; when they are gone, or the
// subscription ends by itself (consumer deleted), Run re-creates them (the
// stream only with nats.create_stream) and subscribes again, with capped
// backoff, logging each step. A consumer made again on the stream it was
// on starts past the ack floor serve last had from the server (every
// floorEvery), not at the start of the stream (resumeAfterFloor).
//
// While the pull pause (SetPullPause) holds, Run pulls nothing: the
// session drains and ends, and Run waits for the pause's end before it
// looks at the stream and pulls again (see the package documentation).
//
// When ctx (intake) ends, Run stops pulling, drains the subscription so
// messages already delivered to this client are still pushed, and returns
// nil. That drain and those pushes are bounded by hard. When hard ends, Run
// returns promptly with an error wrapping hard's error; messages it took but
// did not push are nak'ed, the rest are redelivered after nats.ack_wait.
// Run returns an error wrapping ringq.ErrClosed if out was closed by someone
// else and one wrapping jetstream.ErrConnectionClosed if Close was called,
// or if nats.go closed the connection for good: when the server refused
// jetsink's credentials on reconnect, that error wraps the refusal
// (nats.ErrAuthorization, nats.ErrAuthExpired, ...) too, and names the fix.
// Run must not be called concurrently with itself. While it runs, a
// goroutine of its own confirms every second that the server has read the
// acks sent (see the package documentation).
//
// Once hard has ended, Run waits hardRunWait at most for its supervising
// goroutine, which asks nats.go about its connection and sends JetStream
// API requests: a write to a server that reads nothing holds nats.go's
// lock, which those take first, until writeTimeout (10 s). Run then closes
// out and returns; that goroutine ends when the write does (or Close), and
// Run is not to be called again before.
func (c *Consumer) Run(ctx, hard context.Context, out Output) error {
	done := make(chan error, 1)
	go func() { done <- c.run(ctx, hard, out) }()
	select {
	case err := <-done:
		return err
	case <-hard.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(hardRunWait):
		out.Close() // the pushes left fail (ErrClosed), and so does any after them
		c.log.Warn("hard stop: not waiting for the consumer's supervision, held by nats.go's connection (a write to a server that reads nothing, say)",
			"waited", hardRunWait)
		return fmt.Errorf("consume: shutdown cut short: %w", hard.Err())
	}
}

// hardRunWait is how long Run waits for its supervising goroutine once hard
// has ended: its way out takes hardConfirmWait at most when nothing holds
// it, and a hard stop (processor.Run) gives all its stages abortBudget.
const hardRunWait = 100 * time.Millisecond

// closedError is Run's error for a connection closed for good: by Close,
// or by nats.go, which gives up on reconnecting when the server refused
// the credentials twice (a password changed and the server reloaded, a JWT
// expired or revoked); that reason (the connection's last error) is said
// with the fix. Both wrap jetstream.ErrConnectionClosed.
func (c *Consumer) closedError() error {
	last := c.nc.LastError()
	switch {
	case errors.Is(last, nats.ErrAuthorization), errors.Is(last, nats.ErrAuthExpired),
		errors.Is(last, nats.ErrAuthRevoked), errors.Is(last, nats.ErrAccountAuthExpired):
		return fmt.Errorf("consume: %w: NATS refused jetsink's credentials on reconnect (%w): fix nats.user/nats.password (or nats.creds_file / nats.nkey_file) and restart",
			jetstream.ErrConnectionClosed, last)
	}
	return fmt.Errorf("consume: %w", jetstream.ErrConnectionClosed)
}

// run is Run's body, on a goroutine of Run's.
func (c *Consumer) run(ctx, hard context.Context, out Output) error {
	defer out.Close()
	stopConfirming := c.confirming()
	defer func() { stopConfirming(hard.Err() != nil) }()
	if sub := c.watchLeader(); sub != nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	// Every JetStream API request Run makes is bounded by nats.go's
	// default timeout (5 s), also under a ctx with a deadline: one the
	// server drops (a stream or consumer electing a leader answers nothing)
	// waited for the whole deadline, not consuming meanwhile.
	ctx, hard = noDeadline{ctx}, noDeadline{hard}
	c.pauseNoted = false
	backoff := retryMin
	ensure := false   // the stream or consumer went away: re-create them first
	advanced := false // a new epoch started since the last session began
	for {
		if err := hard.Err(); err != nil {
			return fmt.Errorf("consume: shutdown cut short: %w", err)
		}
		if ctx.Err() != nil {
			return nil
		}
		if c.nc.IsClosed() {
			return c.closedError()
		}
		if c.awaitUnpaused(ctx, hard) {
			// Nothing is looked at meanwhile (the sequence check may
			// need PostgreSQL); the stream may be replaced, and the
			// consumer gone, by the end: the loop's top looks again.
			backoff = retryMin
			continue
		}
		retry := func(what string, err error) {
			if missing(err) {
				ensure = true
			}
			c.setStuck(c.why(ctx, what, err), err)
			if ctx.Err() != nil || c.nc.IsClosed() {
				return
			}
			// At Warn while it may be routine (a leader election, a
			// rolling upgrade), at Error once NotConsuming reports it;
			// the same line again once a minute at most.
			level := slog.LevelWarn
			if c.NotConsuming() != nil {
				level = slog.LevelError
			}
			now := time.Now()
			if c.retrySince.IsZero() {
				c.retrySince = now
			}
			c.retries++
			if line := fmt.Sprint(level, what); line != c.retryLine {
				// The held-back count stays: the Error after 30 s of
				// Warns says how many were not logged.
				c.retryLine, c.retryLog = line, pipeline.Every{}
			}
			if _, ok := c.retryLog.Allow(now, quietEvery); ok {
				c.log.Log(ctx, level, what+"; retrying", "err", err, "retry_in", backoff,
					"failing_for", now.Sub(c.retrySince).Round(time.Millisecond), "attempts", c.retries, "held_back", c.retryHeld)
				c.retryHeld, c.retryTold = 0, true
			} else {
				c.retryHeld++
			}
			sleep(ctx, hard, backoff)
			backoff = min(2*backoff, retryMax)
		}
		if ensure {
			if !advanced {
				// Before re-creating anything: the acks flushed now reach
				// no consumer, or the old one, not the new one's events.
				// (A failed look: enterStream decides, retrying.)
				if changed, _ := c.streamChanged(ctx); changed {
					c.newEpoch(slog.LevelWarn, "stream deleted or re-created")
					advanced = true
				}
			}
			if err := c.ensureAll(ctx); err != nil {
				if !errors.Is(err, errDeadLetterStream) {
					retry("re-create stream/consumer", err)
					continue
				}
				// Both are there; a dead-letter stream is not worth
				// stopping for (a dead letter that finds none makes it
				// again, at most every dlRecreateEvery, or is nak'ed).
				c.log.Error("dead-letter stream not created; consuming on", "err", err)
			}
			ensure = false
		}
		if err := c.checkSeq(ctx); errors.Is(err, ErrSequenceRestarted) {
			c.stuck.Store(nil) // Refused says why
			c.refuse(ctx, hard, err)
			ensure = true // the stream may be re-created meanwhile, without the consumer
			continue
		} else if err != nil {
			retry("check the stream's sequence against the table", err)
			continue
		}
		c.seq.refused.Store(nil)
		if err := c.enterStream(ctx, advanced); err != nil {
			retry("look up the stream", err)
			continue
		}
		if !c.mayPull(ctx, hard) {
			continue // the loop's top returns, or looks again after a pause
		}
		c.floorNow(ctx)
		s, err := c.subscribe(hard, out)
		if err != nil {
			retry("subscribe to the consumer", err)
			continue
		}
		advanced = false
		began := time.Now()
		over, err := c.serve(ctx, hard, s)
		if over {
			return err
		}
		advanced = s.advanced.Load()
		if time.Since(began) > time.Minute {
			backoff = retryMin
		}
		if s.toWire {
			continue
		}
		if s.paused {
			// Not a resubscribe: the loop's top waits for the pause's end
			// and looks at the stream before the next session pulls.
			continue
		}
		if s.connLost.Load() && !s.gone {
			// The wire connection failed (with the server, or because
			// nats.go's did: see natsOptions): nothing is gone. Pull again
			// once nats.go, which carries the API and the acks of the lost
			// connection's messages, is back.
			c.log.Info("wire pull connection lost; pulling again once NATS is reachable")
			if time.Since(began) < time.Second {
				// Lost as soon as made: do not dial in a tight loop.
				sleep(ctx, hard, backoff)
				backoff = min(2*backoff, retryMax)
			}
			for !c.nc.IsConnected() && !c.nc.IsClosed() {
				if !sleep(ctx, hard, 100*time.Millisecond) {
					break
				}
			}
			continue
		}
		// The subscription ended without us (consumer deleted, ...) or
		// because the consumer or its stream is gone: re-create them and
		// subscribe again.
		c.stats.resubscribes.Add(1)
		ensure = true
		if time.Since(began) < sessionConfirm {
			// Ended by itself at once (a refused pull request, ...):
			// not consuming, as much as a step that fails.
			c.setStuck("pull subscription ended at once", s.lastErr)
		}
		if !s.gone {
			c.log.Warn("pull subscription ended; re-creating the consumer", "retry_in", backoff)
			if !sleep(ctx, hard, backoff) {
				continue
			}
			backoff = min(2*backoff, retryMax)
		}
	}
}

// retriesOver ends a run of Run's retries, its session having lasted: if
// one of its lines was logged, the end is too (an alert raised on the
// Error sees it cleared), with how long it failed and the retries made.
func (c *Consumer) retriesOver() {
	if c.retrySince.IsZero() {
		return
	}
	if c.retryTold {
		c.log.Info("consuming again", "failing_for", time.Since(c.retrySince).Round(time.Millisecond), "attempts", c.retries,
			"held_back", c.retryHeld)
	}
	// A run that logged nothing leaves no held-back count to the next.
	c.retrySince, c.retries, c.retryTold, c.retryHeld = time.Time{}, 0, false, 0
}

// stuckState is why Run has not pulled since when (Consumer.stuck).
type stuckState struct {
	since time.Time
	err   error
}

// setStuck notes that Run could not pull (what failed, with err), since
// the first such failure in a row.
func (c *Consumer) setStuck(what string, err error) {
	since := time.Now()
	if st := c.stuck.Load(); st != nil {
		since = st.since
	}
	if err == nil {
		err = errors.New("no reason given")
	}
	c.stuck.Store(&stuckState{since: since, err: fmt.Errorf("%s: %w", what, err)})
}

// sessionConfirm is how long a session must last for Run to count as
// pulling again (NotConsuming clears).
const sessionConfirm = 2 * time.Second

// stuckAfter is how long Run may retry before it can pull until
// NotConsuming reports it: as long as the sink's failing batches take to
// fail its readiness.
const stuckAfter = 30 * time.Second

// NotConsuming returns why Run has not been able to pull for stuckAfter or
// longer (the stream or the consumer cannot be made or looked at, the
// subscription is refused: deleted with nats.create_stream off, no
// permission; or a session's pulls and looks at the consumer go
// unanswered, until a look is answered; or the server refuses the pulls
// themselves, no permission to publish to the pull subject, until a pull
// gets through), or nil. Safe from any goroutine; the readiness check
// reports it.
func (c *Consumer) NotConsuming() error {
	// What Run retries now first; a refusal of the pulls may be older.
	if st := c.stuck.Load(); st != nil {
		if d := time.Since(st.since); d >= c.stuckAfter {
			return fmt.Errorf("not consuming for %v: %w", d.Round(time.Second), st.err)
		}
	}
	if r := c.pullsRefused.Load(); r != nil {
		if d := time.Since(r.since); d >= c.stuckAfter {
			return fmt.Errorf("not consuming for %v: %w", d.Round(time.Second), r.err)
		}
	}
	return nil
}

// enterStream looks the stream up before a session subscribes and, unless
// advanced says Run has just done so, starts a new epoch if it is not the
// stream the previous session consumed (it was deleted and re-created
// since, and the consumer with it): from then on the acks and terms of
// the old stream's events still on their way are skipped, and those sent
// before are flushed to the server before the new session pulls.
func (c *Consumer) enterStream(ctx context.Context, advanced bool) error {
	created, err := c.streamCreatedAt(ctx)
	if err != nil {
		return err
	}
	if !advanced && !c.streamCreated.IsZero() && !created.Equal(c.streamCreated) {
		c.newEpoch(slog.LevelWarn, "stream re-created")
	}
	c.streamCreated = created
	return nil
}

// newSessionEpoch starts a new epoch for serve, which ends session s
// because its stream was replaced: what s still pushes keeps s's epoch, and
// is not settled. Run then does not start another before the next session.
func (c *Consumer) newSessionEpoch(s *session, why string) {
	s.advanced.Store(true) // first: push must not make what it pushes from now on current
	c.newEpoch(slog.LevelWarn, why)
}

// streamChanged reports whether the stream is gone or is not the one the
// last session consumed (another creation time). A failed look-up says
// neither: it returns false and the error.
func (c *Consumer) streamChanged(ctx context.Context) (bool, error) {
	if c.streamCreated.IsZero() {
		return false, nil // no session yet: no event taken
	}
	created, err := c.streamCreatedAt(ctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return !created.Equal(c.streamCreated), nil
}

// streamCreatedAt looks the stream up and returns its creation time.
func (c *Consumer) streamCreatedAt(ctx context.Context) (time.Time, error) {
	info, err := c.streamInfo(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return info.Created, nil
}

// streamInfo looks the stream up, for at most streamLookTimeout (5 s).
func (c *Consumer) streamInfo(ctx context.Context) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, c.streamLookTimeout)
	defer cancel()
	stream, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", c.cfg.Stream, err)
	}
	return stream.CachedInfo(), nil
}

// newEpoch starts a new epoch (see pipeline.Epochs), once no ack or term
// is being sent, flushes the ones sent before to the server, and returns it.
func (c *Consumer) newEpoch(level slog.Level, why string) uint64 {
	e := c.epochs.Advance()
	c.stats.epochs.Add(1)
	c.log.Log(context.Background(), level, why+": the acks and terms of events taken before are skipped from now on "+
		"(a re-created stream reuses their sequences); their rows are still written, and JetStream redelivers "+
		"those that are still in a stream", "epoch", e)
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.nc.FlushWithContext(fctx); err != nil {
		c.log.Warn("flush before the new epoch", "err", err)
	}
	if wc := c.wc.Load(); wc != nil {
		select {
		case <-wc.Done(): // its acks went through nats.go's, flushed above
		default:
			if err := wc.Flush(fctx); err != nil {
				c.log.Warn("flush the wire pull connection before the new epoch", "err", err)
			}
		}
	}

	return e
}

// missing reports whether err says the stream or the consumer does not
// exist.
func missing(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, ErrStreamNotFound)
}

// refuse holds off a stream checkSeq refused: it logs why (at ERROR, at
// first and then every 5 minutes), makes Refused report it, and waits
// refusedRecheck before Run looks again. Meanwhile nothing is pulled, and
// what was taken before goes on to the table, not acked (its stream was
// replaced: a new epoch began); the events of the refused stream wait in
// it until it is re-created past the stored rows or postgres.table names
// another table.
func (c *Consumer) refuse(ctx, hard context.Context, err error) {
	first := c.seq.refused.Swap(&err) == nil
	if first || time.Since(c.seq.refusedLogged) >= 10*c.recheckRefused {
		c.log.Error("not consuming the stream: its sequence restarted under stored rows; checking again every "+c.recheckRefused.String(), "err", err)
		c.seq.refusedLogged = time.Now()
	}
	sleep(ctx, hard, c.recheckRefused)
}

// session is one Consume subscription.
type session struct {
	cc     jetstream.ConsumeContext
	closed <-chan struct{} // closed once the delivery goroutine has returned
	errs   chan error      // errors nats.go reports; sends never block
	// pushErr carries the first failed Push (hard over, out closed); after
	// it the handler only naks.
	pushErr chan error
	// With Config.StoredSeq, push asks serve (ask) to verify the stream
	// and waits for the answer (verdict) before it takes a session's first
	// message, one whose consumer sequence went back, or one after a
	// reconnect. quit is closed when serve stops answering.
	ask      chan struct{}
	verdict  chan error
	quit     chan struct{}
	quitOnce sync.Once
	failed   bool   // delivery goroutine only
	lastCons uint64 // delivery goroutine only: the last consumer sequence pushed
	// firstCons and firstStream are the consumer and stream sequences of
	// the last first delivery pushed (delivery goroutine only), for
	// noteSkipped.
	firstCons, firstStream uint64
	// handling is set while the handler runs (push may wait on a full
	// pipeline), with nats.go's pulls only: nats.go's heartbeat timer,
	// which it stops then, "misses" heartbeats when a reconnect starts it
	// again meanwhile. (Never set for the wire client, whose heartbeats
	// are measured apart from the handler: real.)
	handling atomic.Bool
	// epoch is stamped on the events the session pushes: the consumer's
	// epoch when it subscribed, or the one push started when the consumer
	// sequence went back. An epoch started by serve (the stream was
	// replaced) makes whatever the session still pushes stale.
	epoch uint64
	// advanced: serve started a new epoch to end the session (it found
	// the stream replaced); Run does not start another before the next
	// session, and push does not start one, so that what it still pushes
	// stays stale. (An epoch push started does not count for Run: the
	// stream may have been replaced after it.)
	advanced atomic.Bool
	gone     bool // the consumer or its stream went away while this session ran
	// connLost: the session's wire connection failed (consumeWire); Run
	// pulls again once nats.go is connected, without re-creating anything.
	connLost atomic.Bool
	// wire: the session pulls with consumer/wire. toWire: serve ended a
	// session that nats.go pulled only because wire had been given up,
	// once nats.go reconnected (which gives wire another chance); Run
	// subscribes again at once, re-creating nothing.
	wire, toWire bool
	// paused: serve ended the session, draining it, because the pull
	// pause holds (SetPullPause); Run waits for its end.
	paused bool
	// headersOnly: push met a message of a consumer that delivers headers
	// only (an operator set headers_only): serve ends the session, and
	// Run applies the consumer's configuration again. Sends never block.
	headersOnly chan struct{}
	// bodies: what push learnt of the consumer when an empty message with
	// Nats-Msg-Size came (delivery goroutine only): 0 not asked yet,
	// bodiesWhole or bodiesLeftOut.
	bodies int
	// lastErr is the last error serve read from errs, while the session
	// ran or after it ended (logErrs): why it ended by itself, as far as
	// the client said. (A Sub reports its terminal error just before it
	// ends, and serve often reads it while the session still runs.)
	lastErr error
	// unlogged is the last error serve read from errs and held back from
	// the log (Consumer.subErrs), until another is logged: the session's
	// end logs it, as the reason it may have ended for.
	unlogged error
	// heartbeat is the idle heartbeat the session's pulls ask for. quiet
	// is when the session last gave a sign that its pulls may not get
	// through: it began, reported an error (a missed heartbeat among
	// them), or NATS was found away or reconnected (serve's goroutine
	// only; see provePulls).
	heartbeat time.Duration
	quiet     time.Time
}

// await asks serve to verify the stream and returns its verdict.
func (s *session) await(hard context.Context) error {
	select {
	case s.ask <- struct{}{}:
	case <-s.quit:
		return errNotVerified
	case <-hard.Done():
		return hard.Err()
	}
	select {
	case err := <-s.verdict:
		return err
	case <-s.quit:
		select {
		case err := <-s.verdict: // answered just before
			return err
		default:
			return errNotVerified
		}
	case <-hard.Done():
		return hard.Err()
	}
}

// wireProbeTimeout is how long probeWire waits for its PONG with nothing
// at all coming from the server.
const wireProbeTimeout = 2 * time.Second

// probeWire pings the wire connection wc, on a goroutine of its own, and
// aborts it when no PONG comes and no byte either for wireProbeTimeout: a
// connection the network left half-open (the server gone without a word)
// would otherwise hold the session, which pulls nothing, until the PINGs
// of its own schedule failed, 40-60 s. The session then ends as for any
// lost wire connection, and Run pulls again on a new one. The probe does
// not drop a connection still receiving: a large message over a slow link
// (64 MiB takes 5 s at 100 Mbit/s) holds the PONG behind it, and aborting
// there lost the message half-read, again at each redelivery. It waits on
// while each wireProbeTimeout brings bytes, and ends with its PONG or with
// the connection. Nor does the connection's own pinger (every
// pingInterval) count an interval in which the frame it is reading came
// on. A frame whose bytes keep coming, however slowly, is bounded by its
// size (max_payload) and by the server: its write deadline, and its own
// pings, whose PINGs wait behind the frame as well.
func (c *Consumer) probeWire(wc *wire.Conn) {
	go func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		answer := make(chan error, 1)
		go func() { answer <- wc.Flush(ctx) }()
		look := time.NewTicker(wireProbeTimeout)
		defer look.Stop()
		last := wc.LastRead()
		for {
			select {
			case <-answer: // the PONG, or the connection gone
				return
			case <-look.C:
			}
			if read := wc.LastRead(); !read.Equal(last) {
				last = read // bytes came: the server is there
				continue
			}
			cancel()
			if err := <-answer; err != nil && !isDone(wc) { // nil: the PONG came just now
				c.log.Warn("wire pull connection does not answer; dropping it",
					"silent_for", wireProbeTimeout)
				wc.Abort()
			}
			return
		}
	}()
}

// stopAnswering makes await return at once from now on: serve is leaving.
func (s *session) stopAnswering() { s.quitOnce.Do(func() { close(s.quit) }) }

// subscribe starts a Consume subscription whose handler pushes into out.
func (c *Consumer) subscribe(hard context.Context, out Output) (*session, error) {
	cfg := &c.cfg
	s := &session{errs: make(chan error, 16), pushErr: make(chan error, 1),
		ask: make(chan struct{}), verdict: make(chan error, 1), quit: make(chan struct{}),
		headersOnly: make(chan struct{}, 1), epoch: c.epochs.Current(), wire: c.pullsWithWire()}
	c.noteServerVersion(c.nc)
	handle := func(msg delivery) {
		if s.failed {
			c.nak(msg, s.epoch)
			return
		}
		if !s.wire { // only nats.go's heartbeat timer needs it
			s.handling.Store(true)
			defer s.handling.Store(false)
		}
		if err := c.push(hard, out, msg, s); err != nil {
			s.failed = true
			if !errors.Is(err, errNotVerified) {
				s.pushErr <- err
			}
		}
	}
	onErr := func(err error) {
		select {
		case s.errs <- err:
		default: // Run is behind; the next error will do
		}
	}
	if s.wire {
		s.heartbeat = cfg.PullHeartbeat
		cc, err := c.consumeWire(hard, s, handle, onErr)
		if err != nil {
			return nil, fmt.Errorf("consume: %w", err)
		}
		s.cc, s.closed = cc, cc.Closed()
		return s, nil
	}
	c.bounded.Store(false) // nats.go's Consume: no byte budget
	opts := make([]jetstream.PullConsumeOpt, 0, 4)
	pull := c.pullMessages()
	msgs, lowered := natsGoPullMessages(pull, cfg.PullMaxMessages == 0)
	if lowered {
		c.log.Warn("nats.pull_max_messages is more than nats.go's pulls can hold; pulling with fewer", "pull_max_messages", pull, "messages", msgs)
	}
	if cfg.PullMaxBytes > 0 {
		// For the server this connection has now. nats.go's pulls keep
		// it across a reconnect: a server of the cluster with a larger
		// max_payload may then refuse its largest messages to them
		// (README: set pull_max_bytes for the largest, or 0).
		n := pullBytes(cfg.PullMaxBytes, c.nc.MaxPayload(), c.log)
		opts = append(opts, jetstream.PullMaxMessagesWithBytesLimit(msgs, n))
	} else {
		opts = append(opts, jetstream.PullMaxMessages(msgs))
	}
	hb, moved := cfg.natsGoHeartbeat()
	s.heartbeat = hb
	if moved {
		c.log.Warn("nats.pull_heartbeat is outside the range nats.go's pulls take; pulling with the nearest", "pull_heartbeat", cfg.PullHeartbeat,
			"heartbeat", hb, "range", minNATSGoHeartbeat.String()+"-"+maxNATSGoHeartbeat.String())
	}
	opts = append(opts,
		jetstream.PullExpiry(cfg.PullExpiry),
		jetstream.PullHeartbeat(hb),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { onErr(err) }),
	)
	cc, err := c.cons.Load().Consume(func(msg jetstream.Msg) { handle(msg) }, opts...)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	s.cc = cc
	// Taken now, while the subscription is valid: this channel is closed
	// only after the delivery goroutine has returned.
	s.closed = cc.Closed()
	return s, nil
}

// serve watches one session until it ends. over says Run is to return err;
// otherwise Run subscribes again.
func (c *Consumer) serve(ctx, hard context.Context, s *session) (over bool, err error) {
	defer s.stopAnswering()
	paused, pauseSwitch := c.pausedNow()
	if paused { // since mayPull looked
		return c.pauseSession(hard, s)
	}
	floorTick := time.NewTicker(c.floorEvery)
	defer floorTick.Stop()
	confirm := time.NewTimer(sessionConfirm)
	defer confirm.Stop()
	s.quiet = time.Now()
	for {
		select {
		case <-confirm.C:
			c.stuck.Store(nil) // the session lasts: Run got through (not pullsRefused)
			c.retriesOver()
		case <-floorTick.C:
			c.provePulls(s)
			if why := c.refreshFloor(ctx); why != "" {
				c.log.Warn("the consumer's configuration was changed on the server; applying jetsink's again", "changed", why)
				return s.drain(hard)
			}
		case <-s.headersOnly:
			c.log.Warn("the consumer delivers headers only (headers_only was set on the server); applying jetsink's configuration again: " +
				"the events come again whole")
			return s.drain(hard)
		case <-ctx.Done():
			// Intake over: stop pulling, push what this client holds,
			// verifying the stream still where push asks (bounded by hard).
			s.cc.Drain()
			for {
				select {
				case <-s.ask:
					err := c.verifyPatiently(hard, hard)
					if streamGone(err) {
						// As when intake goes on (below): this session's
						// events must not be acked into the stream that
						// now has the name, or takes it next.
						c.newSessionEpoch(s, "stream re-created or lost while draining")
					}
					s.verdict <- err
					if err != nil {
						s.stopAnswering() // the rest is nak'ed
					}
					continue
				case <-s.closed:
					select {
					case err := <-s.pushErr:
						return true, err
					default:
						return true, nil
					}
				case <-hard.Done():
					// Do not wait for nats.go's drain: the handler now only naks.
					return true, fmt.Errorf("consume: drain cut short: %w", hard.Err())
				}
			}
		case <-hard.Done():
			s.cc.Stop()
			return true, fmt.Errorf("consume: shutdown cut short: %w", hard.Err())
		case <-pauseSwitch:
			if paused, pauseSwitch = c.pausedNow(); paused {
				return c.pauseSession(hard, s)
			}
		case err := <-s.pushErr:
			s.cc.Stop()
			return true, err
		case <-s.ask:
			err := c.verifyPatiently(ctx, hard)
			if err != nil && !streamGone(err) && ctx.Err() != nil {
				err = c.verifyPatiently(hard, hard) // intake ended meanwhile: verify for the drain
			}
			// The epoch advances before push has the verdict, so that no
			// commit finishing meanwhile acks this session's events into
			// the stream that now has the name, or takes it next.
			switch {
			case errors.Is(err, ErrSequenceRestarted):
				c.log.Warn("stream re-created while consuming; its sequence restarted under stored rows", "err", err)
				c.newSessionEpoch(s, "stream re-created while consuming")
			case errors.Is(err, errStreamChanged):
				// What the client still holds may be the old stream's, whose
				// sequences the new one reuses: let it go with its stream.
				c.log.Warn("stream re-created while consuming; subscribing to the new one afresh")
				c.newSessionEpoch(s, "stream re-created while consuming")
			case errors.Is(err, jetstream.ErrStreamNotFound):
				// Run re-creates it, unless intake has ended.
				c.log.Warn("stream gone while consuming", "err", err)
				c.newSessionEpoch(s, "stream lost while consuming")
			}
			s.verdict <- err
			switch {
			case err == nil:
			case streamGone(err):
				return s.leave(hard)
			default:
				c.log.Warn("could not verify the stream while consuming; subscribing again", "err", err)
				return s.leave(hard)
			}
		case <-c.reconnected:
			s.quiet = time.Now() // the pulls begin again (provePulls)
			if !s.wire && c.pullsWithWire() {
				// wire was given up (wireConn); nats.go's reconnect gave it
				// another chance. The next session looks at the stream.
				c.log.Info("nats reconnected: pulling with nats.pull_client wire again")
				s.toWire = true
				return s.drain(hard)
			}
			if c.cfg.StoredSeq != nil {
				continue // push has serve verify the stream after a reconnect
			}
			if !c.nc.IsConnected() {
				// The wire connection's loss (lookAgain) while nats.go's
				// is down too: nothing can be looked at now, and nats.go's
				// reconnect sends another token (its ReconnectHandler).
				// Meanwhile the Sub ends, and Run pulls again once NATS
				// is back: a lost connection, not a consumer gone.
				continue
			}
			// While the connection was down the stream may have been
			// re-created, with the consumer, and nats.go's pulls go on with
			// whatever answers them.
			changed, err := c.streamChanged(ctx)
			if err != nil && s.connLost.Load() {
				// The wire connection's loss asked for the look, sent
				// before nats.go noticed that its own was lost too. Run
				// pulls again once NATS is back, and looks at the stream
				// before it does (enterStream): a lost connection, not a
				// consumer gone.
				return s.drain(hard)
			}
			if err != nil {
				// Not knowing is not good enough: subscribe again, and
				// let Run look (it retries) before it pulls.
				c.log.Warn("could not look at the stream after the reconnect; subscribing again", "err", err)
				return s.leaveDraining(hard)
			}
			if changed {
				c.log.Warn("stream re-created while disconnected")
				c.newSessionEpoch(s, "stream re-created while disconnected")
				return s.leaveDraining(hard)
			}
		case err := <-s.errs:
			s.lastErr = err
			s.quiet = time.Now() // whatever it says (provePulls)
			if st, ok := errors.AsType[*wire.StallError](err); ok {
				c.log.Warn("no pull: the events in flight fill nats.max_in_flight_bytes, and none has been settled meanwhile",
					"waited", st.Waited.Round(time.Second), "held_bytes", st.Held, "max_in_flight_bytes", st.Limit,
					"hint", "if the sink logs that a batch waits or fails (\"batch waiting on PostgreSQL\", \"batch failed\", \"batch still failing\"), "+
						"that is why; if not, an event is held that will never be settled (a bug: please report it); "+
						"a restart loses nothing, the events come back after ack_wait")
				continue
			}
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				// A pull nothing answered: no server holds the consumer
				// now. The pulls go on (wire: one a heartbeat tick).
				if time.Since(c.lastRecheck) < c.recheckGap {
					continue // a look has just been made
				}
				c.noResponders.Log(ctx, c.log, slog.LevelWarn, quietEvery,
					"a pull found no server to answer it (a consumer leader election, the consumer gone, or JetStream unavailable); checking the consumer", "err", err)
			case errors.Is(err, jetstream.ErrNoHeartbeat) && s.handling.Load():
				// The timer nats.go started again on a reconnect while
				// push waits on a full pipeline: back-pressure, nothing
				// missed (nats.go stops the timer while a message is
				// handled, and starts it again after).
				c.log.Debug("pull heartbeat timer fired while the pipeline is full; not a missed heartbeat")
				continue
			case errors.Is(err, jetstream.ErrNoHeartbeat):
				// nats.go pulls again by itself; find out whether the
				// consumer is still there (a restart that lost the store,
				// a re-created stream or consumer answer pulls with
				// silence).
				c.stats.heartbeatsMissing.Add(1)
				if wc := c.wc.Load(); s.wire && wc != nil {
					c.probeWire(wc)
				}
				if time.Since(c.lastRecheck) < c.recheckGap {
					continue // a look has just been made (those missed while it ran come in a burst)
				}
				c.missedBeats.Log(ctx, c.log, slog.LevelWarn, quietEvery, "pull heartbeats missed; checking the consumer")
			case leadershipChange(err):
				// Not a fault of the pulls (both clients pull again): the
				// acks sent around it may be lost (leaderacks.go).
				c.leaderChanged(err)
				continue
			case strings.Contains(err.Error(), "Exceeded MaxRequest"):
				// nats.go's pulls are past the consumer's max_request_*
				// limits (an operator's edit), each refused alike: end the
				// session, and Run applies the consumer's configuration
				// again. (The wire client's Sub ends by itself.)
				c.log.Warn("the consumer's limits refuse the pulls; applying its configuration again", "err", err)
				return s.drain(hard)
			default:
				c.noteAckRefusal(err)
				c.notePullRefusal(err) // the wire client's pulls
				s.unlogged = err
				if c.subErrs.Log(ctx, c.log, slog.LevelWarn, asyncErrEvery, pullFailed, "err", err) {
					s.unlogged = nil
				}
				continue
			}
			leave, replaced := c.recheck(ctx)
			c.lastRecheck = time.Now()
			// The look decides whether the session consumes: the
			// confirmation due meanwhile (a look may take 7 s) must not
			// clear what it found.
			confirm.Stop()
			switch {
			case !leave:
			case !replaced:
				return s.leave(hard)
			case c.cfg.StoredSeq != nil:
				// Exactly-once: push would not take the new stream's
				// events before serve verified it.
				c.newSessionEpoch(s, "stream deleted or re-created while consuming")
				return s.leave(hard)
			default:
				// nats.go may have pulled from a consumer someone
				// re-created, and an old ack sent before the new epoch
				// may have settled one of those events: push what the
				// client holds (stale: stored, not acked) rather than
				// drop it.
				c.newSessionEpoch(s, "stream deleted or re-created while consuming")
				return s.leaveDraining(hard)
			}
		case <-s.closed:
			// Ended by nats.go: consumer deleted, bad request, connection
			// closed. The reason, reported just before it ended, may still
			// wait in errs: this case and that one were ready together. Or
			// it was read, and held back from the log (subErrs).
			if s.unlogged != nil {
				c.log.Warn(pullFailed, "err", s.unlogged)
			}
			s.logErrs(c.log)
			if c.nc.IsClosed() {
				return true, c.closedError()
			}
			select {
			case err := <-s.pushErr:
				return true, err
			default:
				return false, nil
			}
		}
	}
}

// push wraps msg and pushes it into out under hard. With Config.StoredSeq
// it takes a session's first message, one from a consumer created since
// (its consumer sequence went back), or one after a reconnect only once
// serve has verified the stream (session.await).
func (c *Consumer) push(hard context.Context, out Output, msg delivery, s *session) error {
	meta, ok := parseAckReply(msg.Reply())
	if !ok {
		// Not a JetStream message: nothing to settle, nothing to store.
		c.log.Error("message without JetStream metadata dropped", "subject", msg.Subject(), "reply", msg.Reply())
		pipeline.Release(msg)
		return nil
	}
	if c.cfg.StoredSeq == nil && s.lastCons != 0 && meta.consSeq <= s.lastCons && !s.advanced.Load() {
		// A consumer created since this session began (its sequence went
		// back): its stream may have replaced the one the events still on
		// their way came from, and this may be the new stream's event.
		// (Exactly-once verifies the stream first, below.) Not once serve
		// has started an epoch to end the session: what it still pushes
		// stays stale.
		s.epoch = c.newEpoch(slog.LevelWarn, "consumer re-created while consuming")
	}
	if c.cfg.StoredSeq != nil {
		if s.lastCons == 0 || meta.consSeq <= s.lastCons || c.seq.gen.Load() != c.seq.checkedGen.Load() {
			if err := s.await(hard); err != nil {
				// Not nak'ed when serve found the stream replaced (it
				// starts a new epoch before the verdict): this may be the
				// old stream's message, whose nak would land on the new
				// stream's event with its sequence. It comes back after
				// ack_wait if its stream still has it.
				c.nak(msg, s.epoch)
				if hard.Err() != nil {
					return fmt.Errorf("consume: push event: %w", hard.Err())
				}
				return fmt.Errorf("%w: %w", errNotVerified, err)
			}
		}
	}
	if c.resendFrom.Load() != 0 && !s.advanced.Load() {
		// The first delivery since a leader change: the new leader's.
		// Only now: its epoch is decided (a re-created consumer's above,
		// a replaced stream's by serve before await's verdict), and acks
		// of an older one must not go out (the server finds a pending
		// event by stream sequence alone).
		c.resendAcks(false, s.epoch)
	}
	s.lastCons = meta.consSeq
	if meta.delivered == 1 {
		if prev, gap := s.firstDelivery(meta.consSeq, meta.streamSeq); gap {
			c.noteSkipped(prev, meta.streamSeq)
		}
	}
	var (
		h        map[string][]string
		msgID    string
		received time.Time
	)
	switch m := msg.(type) {
	case *wire.Msg:
		// Stamped once per read from the socket, not per message.
		received, msgID = m.Received(), m.HeaderGet(HeaderMsgID)
	case jetstream.Msg:
		if h = m.Headers(); len(h[HeaderMsgID]) > 0 {
			msgID = h[HeaderMsgID][0]
		}
	case pipeline.RawHeader:
		msgID = m.HeaderGet(HeaderMsgID)
	}
	// Every message seen counts for continueSeq, an event or not (its
	// ack may still be on its way).
	if meta.streamSeq > c.seq.seenMax.Load() {
		c.seq.seenMax.Store(meta.streamSeq)
	}
	if end := meta.streamSeq + meta.pending; end > c.seq.seenEnd.Load() {
		c.seq.seenEnd.Store(end)
	}
	if c.stuck.Load() != nil {
		c.stuck.Store(nil) // a message came: consuming (recheck)
	}
	if c.pullsRefused.Load() != nil {
		c.pullsRefused.Store(nil) // a pull got through
	}
	if c.schedulesReserved.Load() && isSchedule(msg, h) {
		// A schedule (allow_msg_schedules): the server stores it as sent
		// on its own subject and, when it fires, a copy without
		// Nats-Schedule on the target subject, which is the event. Acked,
		// counted, not handed on.
		c.stats.schedules.Add(1)
		c.settleMarker(msg, s.epoch)
		return nil
	}
	if len(msg.Data()) == 0 {
		if headerOf(msg, h, headerMarkerReason) != "" && headerOf(msg, h, headerRollup) == "sub" {
			// A marker JetStream wrote itself when the subject's last
			// message went (subject_delete_marker_ttl: aged out, purged,
			// removed; it also rolls the subject up): no event. Acked,
			// counted, not handed on.
			c.stats.markers.Add(1)
			c.settleMarker(msg, s.epoch)
			return nil
		}
		if headerOf(msg, h, headerMsgSize) != "" && c.bodiesLeftOut(hard, s) {
			// Its body left out (headers_only): serve has the
			// configuration applied again, and the event comes again
			// whole. (An empty event with that header, a republish's,
			// goes on as any other.)
			c.nak(msg, s.epoch)
			select {
			case s.headersOnly <- struct{}{}:
			default:
			}
			return nil
		}
	}
	if received.IsZero() {
		received = time.Now()
	}
	ev := pipeline.Event{
		Msg:         msg,
		Subject:     msg.Subject(),
		Data:        msg.Data(),
		Header:      h,
		Stream:      meta.stream,
		StreamSeq:   meta.streamSeq,
		ConsumerSeq: meta.consSeq,
		Delivered:   pipeline.DeliveryCount(meta.delivered),
		Published:   meta.published,
		Received:    received,
		MsgID:       msgID,
		Epoch:       s.epoch,
		// Past nats.max_deliver: the worker dead-letters it undecoded
		// (the server sets no limit: durableMaxDeliver).
		Exhausted: c.cfg.MaxDeliver > 0 && meta.delivered > uint64(c.cfg.MaxDeliver),
	}
	if c.traceMsg != nil {
		ev.Span = c.traceMsg(ev)
	}
	if err := out.Push(hard, ev); err != nil {
		// Taken but not handed on: let JetStream redeliver it soon.
		if c.nak(msg, ev.Epoch) {
			ev.End("nak", err)
		} else {
			ev.End("stale", err)
		}
		return fmt.Errorf("consume: push event: %w", err)
	}
	c.stats.received.Add(1) // counted once handed on: a nak'ed one comes again
	if ev.Delivered > 1 {
		c.stats.redelivered.Add(1)
	}
	return nil
}

// headerMarkerReason is the header of a subject delete marker, a message
// JetStream stores itself (nats-server's JSMarkerReason).
const headerMarkerReason = "Nats-Marker-Reason"

// headerMsgSize is the header JetStream sets on a message of a consumer
// that delivers headers only, instead of its body.
const headerMsgSize = "Nats-Msg-Size"

// What session.bodies knows.
const (
	bodiesWhole = 1 + iota
	bodiesLeftOut
)

// bodiesLeftOut reports whether session s's consumer delivers headers
// only, asking the server once per session (on the delivery goroutine,
// only for an empty message with Nats-Msg-Size); a look that fails counts
// as yes: applying the configuration again is harmless.
func (c *Consumer) bodiesLeftOut(hard context.Context, s *session) bool {
	if s.bodies == 0 {
		ctx, cancel := context.WithTimeout(hard, 5*time.Second)
		ci, err := c.cons.Load().Info(ctx)
		cancel()
		s.bodies = bodiesWhole
		if err != nil || ci.Config.HeadersOnly {
			s.bodies = bodiesLeftOut
		}
	}
	return s.bodies == bodiesLeftOut
}

// headerRollup is set on a subject delete marker too ("sub").
const headerRollup = "Nats-Rollup"

// headerSchedule is the header of a message schedule (nats-server's
// JSSchedulePattern: "@at <time>", "@every <interval>", a cron
// expression), matched exactly as the server does.
const headerSchedule = "Nats-Schedule"

// isSchedule reports whether msg is a message schedule: a non-empty
// Nats-Schedule header. Push asks only while the server reserves the
// header (schedulesReserved). The server refuses one on a stream without
// allow_msg_schedules, stores an empty one as an ordinary message, and
// removes it (and every Nats-Schedule-* header but the Nats-Schedule-Next
// it adds) from the copy it stores on the target subject when the schedule
// fires. Only a message with headers is looked at: no map lookup or scan
// for one without (h is nil for nats.go's, the header block empty for
// wire's), and a wire message's header block is parsed again (after the
// Nats-Msg-Id) only when the name occurs in it.
func isSchedule(msg delivery, h map[string][]string) bool {
	switch m := msg.(type) {
	case *wire.Msg:
		b := m.HeaderBlock()
		return b != "" && strings.Contains(b, headerSchedule) && m.HeaderGet(headerSchedule) != ""
	case pipeline.RawHeader:
		return m.HeaderGet(headerSchedule) != ""
	}
	if len(h) == 0 {
		return false
	}
	v := h[headerSchedule]
	return len(v) > 0 && v[0] != ""
}

// noteServerVersion records whether the server nc is connected to reserves
// Nats-Schedule (schedulesReserved): nats-server 2.12 or later. Before
// 2.12 the header means nothing and a message carrying it is an event
// like any other, which push must not ack and drop. Taken at New, at each
// session's start and at each reconnect of nc (kept while nc is not
// connected); the wire client's connection is taken to reach a server of
// the same version.
func (c *Consumer) noteServerVersion(nc *nats.Conn) {
	if v := serverVersion(nc); v != "" { // "" while not connected: as last known
		c.schedulesReserved.Store(versionAtLeast(v, 2, 12))
	}
}

// serverVersion is nc's server's version as its INFO gave it; tests
// replace it to play an older server.
var serverVersion = (*nats.Conn).ConnectedServerVersion

// versionAtLeast reports whether version ("2.12.0", "v2.14.1-RC.2") is
// major.minor or later; false when it does not parse (no version known:
// nothing is taken for a schedule).
func versionAtLeast(version string, major, minor int) bool {
	version = strings.TrimPrefix(version, "v")
	ma, rest, ok := strings.Cut(version, ".")
	if !ok {
		return false
	}
	mi, _, _ := strings.Cut(rest, ".")
	mi, _, _ = strings.Cut(mi, "-")
	x, err1 := strconv.Atoi(ma)
	y, err2 := strconv.Atoi(mi)
	if err1 != nil || err2 != nil {
		return false
	}
	return x > major || x == major && y >= minor
}

// headerOf returns msg's header key; h is its headers when push has them
// (nats.go's messages).
func headerOf(msg delivery, h map[string][]string, key string) string {
	switch m := msg.(type) {
	case *wire.Msg:
		return m.HeaderGet(key)
	case pipeline.RawHeader:
		return m.HeaderGet(key)
	}
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// settleMarker acks a message that is no event (a marker, a schedule)
// taken in epoch (see nak for why not in another), counted for Close to
// confirm, and ends its life here.
func (c *Consumer) settleMarker(msg pipeline.Msg, epoch uint64) {
	defer pipeline.Release(msg)
	c.epochs.IfCurrent(epoch, func() {
		c.acks.begin(1)
		err := msg.Ack()
		c.acks.end(1, btoi(err == nil))
	})
}

// nak naks msg, taken in epoch, unless a new epoch has begun since (see
// pipeline.Epochs): its stream was replaced, and JetStream would apply the
// nak to the new stream's event with the same sequence, sending it again
// while it may be in flight. A message not nak'ed comes back after
// ack_wait if its stream still has it. nak reports whether it nak'ed.
// Either way the message's life in the process ends: what it holds of the
// in-flight budget is given back.
func (c *Consumer) nak(msg pipeline.Msg, epoch uint64) bool {
	defer pipeline.Release(msg)
	return c.epochs.IfCurrent(epoch, func() { _ = msg.Nak() })
}

// streamGone reports whether verify found the session's stream replaced
// (accepted or refused) or gone.
func streamGone(err error) bool {
	return errors.Is(err, ErrSequenceRestarted) || errors.Is(err, errStreamChanged) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// verifyPatiently is verify, tried again while it fails for a reason
// other than a refusal (NATS or PostgreSQL unreachable), so that a
// reconnect or a short outage does not cost the waiting message a
// delivery. It gives up when ctx or hard ends or the connection closes.
// Meanwhile nothing is consumed (serve reads nothing else, so no missed
// heartbeat has recheck set it): a failed try counts towards NotConsuming
// (push clears it when the message goes on).
func (c *Consumer) verifyPatiently(ctx, hard context.Context) error {
	wait := retryMin
	for {
		err := c.verify(ctx)
		if err == nil || streamGone(err) || ctx.Err() != nil || hard.Err() != nil || c.nc.IsClosed() {
			return err // a stream gone is Run's to re-create
		}
		c.setStuck("verify the stream before the waiting message", err)
		c.log.Warn("could not verify the stream yet; the message waits", "err", err, "retry_in", wait)
		if !sleep(ctx, hard, wait) {
			return err
		}
		wait = min(2*wait, retryMax)
	}
}

// leave ends the session because its consumer or stream went away (Run
// re-creates them), as serve returns.
func (s *session) leave(hard context.Context) (over bool, err error) {
	s.gone = true
	s.stopAnswering()
	s.cc.Stop()
	return s.awaitClosed(hard)
}

// leaveDraining is leave, except that the messages the client holds are
// pushed (bounded by hard) rather than dropped.
func (s *session) leaveDraining(hard context.Context) (over bool, err error) {
	s.gone = true
	return s.drain(hard)
}

// drain ends the session with nothing gone (Run subscribes again as it
// is): the messages the client holds are pushed, bounded by hard.
func (s *session) drain(hard context.Context) (over bool, err error) {
	s.stopAnswering()
	s.cc.Drain()
	return s.awaitClosed(hard)
}

// pullFailed is the message of an error a session's pull client reported
// (a lost connection, a refused pull, a deleted consumer); the session may
// go on, or end and Run subscribe again.
const pullFailed = "pulling from the consumer failed"

// logErrs logs, at Warn, the errors the session reported that nobody has
// read.
func (s *session) logErrs(log *slog.Logger) {
	for {
		select {
		case err := <-s.errs:
			log.Warn(pullFailed, "err", err)
			s.lastErr = err
		default:
			return
		}
	}
}

// awaitClosed waits for the session's delivery goroutine to return; over
// when a Push failed meanwhile (out closed: no next session).
func (s *session) awaitClosed(hard context.Context) (over bool, err error) {
	select {
	case <-s.closed:
		select {
		case err := <-s.pushErr:
			return true, err
		default:
			return false, nil
		}
	case <-hard.Done():
		return true, fmt.Errorf("consume: shutdown cut short: %w", hard.Err())
	}
}

// recheck looks the consumer up. leave reports whether the consumer, or
// the stream it was on, is gone or replaced (the stream was deleted,
// perhaps re-created since, the consumer with it; the consumer was
// deleted): Run must then re-create what is missing, check the stream's
// sequence, and subscribe again. replaced reports that the stream is not
// the one the session began on.
func (c *Consumer) recheck(ctx context.Context) (leave, replaced bool) {
	if !c.nc.IsConnected() {
		return false, false // reconnecting: nats.go re-pulls once it is back
	}
	rctx, cancel := context.WithTimeout(ctx, c.lookTimeout)
	defer cancel()
	cons, err := c.js.Consumer(rctx, c.cfg.Stream, c.cfg.Consumer)
	switch {
	case err == nil:
		c.stuck.Store(nil) // the consumer answers
		// The server's side of the stall next to what this consumer has
		// seen, for whoever reads the warning. nats.go has pulled again
		// before it reported the missed heartbeats, so waiting_pulls
		// counts that new pull; the rest tells a server that stopped
		// delivering (delivered = seen, pending > 0) from deliveries that
		// did not arrive (delivered > seen), and both from max_ack_pending
		// holding them back (ack_pending = max_ack_pending).
		if ci := cons.CachedInfo(); ci != nil {
			c.log.Warn("consumer state", "waiting_pulls", ci.NumWaiting,
				"ack_pending", ci.NumAckPending, "max_ack_pending", ci.Config.MaxAckPending,
				"pending", ci.NumPending, "delivered_stream_seq", ci.Delivered.Stream,
				"seen_stream_seq", c.seq.seenMax.Load(), "ack_floor_stream_seq", ci.AckFloor.Stream)
		}
		// Another instance sharing the consumer, or an operator, may have
		// re-created a deleted stream and the consumer on it already.
		if changed, _ := c.streamChanged(rctx); changed {
			c.log.Warn("stream re-created, and the consumer on it")
			return true, true
		}
		c.noteFloor(cons.CachedInfo())
		return false, false
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		c.log.Warn("consumer gone; re-creating it", "err", err)
		changed, _ := c.streamChanged(rctx)
		return true, changed
	default:
		// Neither the pulls nor this look got an answer (JetStream
		// unavailable, a consumer without quorum): not consuming, as
		// when Run cannot subscribe, until a look gets one.
		what := "look up the consumer after its pulls went unanswered"
		if ctx.Err() == nil {
			what = c.why(ctx, what, err)
			c.setStuck(what, err)
		}
		c.checkErrs.Log(ctx, c.log, slog.LevelWarn, quietEvery, "consumer check failed", "what", what, "err", err)
		return false, false
	}
}

// why is what (a step that failed with err), after jetStreamGone when err
// is one that JetStream's absence gives (jetStreamSilent) and JetStream does not answer a request for the account's
// information either, within 2 s (lookTimeout if shorter); after
// natsSilent instead when then the server does not answer a PING within
// as long either, on a connection still open (what alone if it dropped
// meanwhile, or ctx ended); jetStreamGone only after a PING answered. Not while
// NATS itself is away (a request would wait for the reconnect) or ctx has
// ended.
func (c *Consumer) why(ctx context.Context, what string, err error) string {
	if !jetStreamSilent(err) || ctx.Err() != nil || !c.nc.IsConnected() {
		return what
	}
	wait := min(2*time.Second, c.lookTimeout)
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if _, err := c.js.AccountInfo(lctx); err == nil {
		return what
	}
	// Not even a PING answered: the server itself is silent, not only
	// its JetStream.
	fctx, fcancel := context.WithTimeout(ctx, wait)
	defer fcancel()
	if err := c.nc.FlushWithContext(fctx); err != nil {
		if ctx.Err() != nil || !c.nc.IsConnected() {
			// The connection dropped (or was declared stale) during the
			// flush, or ctx ended: neither says JetStream is gone.
			return what
		}
		return natsSilent + ": " + what
	}
	return jetStreamGone + ": " + what
}

// jetStreamSilent reports whether err is one that JetStream's absence
// gives: no answer (a timeout), no responders, not enabled, or
// "JetStream system temporarily unavailable" (errCodeJetStreamUnavailable:
// a cluster that has lost its meta leader says so while it elects one).
func jetStreamSilent(err error) bool {
	apiErr := (*jetstream.APIError)(nil)
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeJetStreamUnavailable
}

// errCodeJetStreamUnavailable is the server's error code for "JetStream
// system temporarily unavailable" (JSClusterNotAvailErr), which nats.go
// has no name for.
const errCodeJetStreamUnavailable jetstream.ErrorCode = 10008

// natsSilent is what NotConsuming says while the server answers nothing
// at all, not even a PING, on a connection still open: a server stopped
// (SIGSTOP), overloaded, or a network that drops its traffic; nats.go
// gives the connection up as stale after two pings 20 s apart.
const natsSilent = "NATS does not answer (the server stopped or overloaded, or the network drops the traffic to it)"

// jetStreamGone is what NotConsuming says while JetStream itself does not
// answer, for the operator who reads /readyz: a server disables JetStream
// when its store cannot be written (its log says "JetStream out of
// resources, will be DISABLED", on a full disk, in a cluster; a server
// alone keeps JetStream but fails every write to the stream, which
// jetsink, consuming, does not see), and a cluster without a meta leader
// answers no request.
const jetStreamGone = "JetStream does not answer (disabled by the server: a full store disk, out of resources; or a cluster without a meta leader)"

// provePulls clears pullsRefused (notePullRefusal) once session s shows
// that its pulls get through without a message to say so: for
// pullsProven(s.heartbeat) no pull was refused, NATS stayed connected, and
// the session reported no error, so no missed heartbeat. Both pull
// clients pull again at a missed heartbeat (wire within three heartbeat
// intervals, nats.go within two), and a refused pull misses them all:
// were the pulls still refused, one would have been refused meanwhile.
// (nats.go tells of no heartbeat but by its absence.) Neither a look at
// the consumer nor a session that lasts shows that much. Called every
// floorEvery; serve's goroutine.
func (c *Consumer) provePulls(s *session) {
	r := c.pullsRefused.Load()
	if r == nil {
		return
	}
	now := time.Now()
	if !c.nc.IsConnected() {
		s.quiet = now // nothing pulls meanwhile
		return
	}
	if need := pullsProven(s.heartbeat); now.Sub(s.quiet) < need || now.Sub(r.at) < need {
		return
	}
	if c.pullsRefused.CompareAndSwap(r, nil) {
		c.log.Info("the server takes jetsink's pulls again", "subject", c.pullSubject())
	}
}

// pullsProven is how long a session's pulls of idle heartbeat hb must go
// unrefused, and its heartbeats unmissed, for provePulls: four heartbeat
// intervals, a second at least (a refusal reaches Run through a queue).
func pullsProven(hb time.Duration) time.Duration { return max(4*hb, time.Second) }

// floorEvery is how often serve asks the server for the consumer's ack
// floor (noteFloor): at most that much of what was acked is delivered
// again should the consumer go away.
const floorEvery = 10 * time.Second

// floorNow asks the server for the consumer's ack floor (noteFloor)
// before a session pulls, on the stream enterStream has just looked at:
// serve asks only every floorEvery, and a consumer lost before the first
// of those in a process that had not learnt a floor yet (its start, the
// consumer an operator's from a later sequence) was made again from the
// start of the stream, delivering again every event it held. Not from the
// info ensureConsumer had, which may be of a stream replaced since. Unless
// NATS is away; a failure leaves the floor as it was. Run's goroutine.
func (c *Consumer) floorNow(ctx context.Context) {
	// Whatever the look finds: what the last session knew, perhaps of a
	// stream replaced since, does not hold for this one.
	c.unfiltered.Store(false) // until a look shows it
	c.skipFloor.Store(math.MaxUint64)
	c.deletedMu.Lock()
	if !c.deletedStream.Equal(c.streamCreated) { // a stream re-created: its sequences anew
		c.deletedStream, c.deletedThrough = c.streamCreated, 0
	}
	c.deletedMu.Unlock()
	if !c.nc.IsConnected() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	first, last, firstOK := c.streamSeqs(ctx)
	c.noteSkipFloor(last, firstOK)
	if ci, err := c.cons.Load().Info(ctx); err == nil {
		c.noteFloor(ci)
		c.noteDeletedUnread(first, firstOK, ci) // while jetsink was stopped, say
	}
}

// noteSkipFloor sets skipFloor to last, the stream's last sequence seen
// now (when ok), unless it is set for this session already: the gaps in
// what the stream held then may be older than the durable (a new one's
// first pass over the stream's history), and only those above it are
// counted (noteSkipped).
func (c *Consumer) noteSkipFloor(last uint64, ok bool) {
	if ok {
		c.skipFloor.CompareAndSwap(math.MaxUint64, last)
	}
}

// streamSeqs looks at the stream the session consumes for its first and
// last sequences, for noteDeletedUnread and noteSkipped; ok false when it
// need not (a filter on the consumer) or could not (a failed look, a
// stream replaced since). It notes whether the stream deletes messages of
// its own that are no events (selfDeleting: subject delete markers with a
// TTL, schedules purged as they fire), and whether its gaps are no events
// deleted (gapsNotEvents).
func (c *Consumer) streamSeqs(ctx context.Context) (first, last uint64, ok bool) {
	if c.cfg.FilterSubject != "" {
		return 0, 0, false
	}
	stream, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return 0, 0, false
	}
	info := stream.CachedInfo()
	if !c.streamCreated.IsZero() && !info.Created.Equal(c.streamCreated) {
		return 0, 0, false // replaced: the next session looks at the new one
	}
	c.selfDeleting.Store(info.Config.SubjectDeleteMarkerTTL > 0 || info.Config.AllowMsgSchedules)
	// A mirror with a filter or a transform keeps the origin's sequences
	// and skips those of the messages it leaves out.
	mi := info.Config.Mirror
	c.gapsNotEvents.Store(info.Config.AllowMsgSchedules || mi != nil && (mi.FilterSubject != "" || len(mi.SubjectTransforms) > 0))
	return info.State.FirstSeq, info.State.LastSeq, true
}

// noteDeletedUnread counts the events the stream removed from its head
// before the durable delivered them (countDeletedUnread): its limits
// (max_age, max_msgs, max_bytes with discard old) or a purge dropped them
// while they waited behind a slow or stopped jetsink. first (when firstOK)
// is the stream's first sequence, looked at before ci, the consumer's
// info: every sequence after the consumer's last delivered one and before
// first was gone before the consumer could deliver it (one dropped after
// the look at the stream waits for the next look, or for noteSkipped).
// Only for a consumer without a filter, whose delivered sequence passes
// every message of the stream (under a filter, the messages of other
// subjects dropped would be counted too): ci says whether it has one
// (unfiltered), for noteSkipped too. Run's goroutine.
func (c *Consumer) noteDeletedUnread(first uint64, firstOK bool, ci *jetstream.ConsumerInfo) {
	unfiltered := c.cfg.FilterSubject == "" && ci.Config.FilterSubject == "" && len(ci.Config.FilterSubjects) == 0
	c.unfiltered.Store(unfiltered)
	if !unfiltered || !firstOK || first <= ci.Delivered.Stream+1 {
		return
	}
	c.countDeletedUnread(ci.Delivered.Stream+1, first-1, "first_seq", first, "delivered_stream_seq", ci.Delivered.Stream)
}

// firstDelivery notes a first delivery of the session at consSeq and
// streamSeq, and reports whether it follows the session's last at the
// next consumer sequence but not the next stream sequence (a gap for
// noteSkipped), and that one's stream sequence. Inlined in push: a
// comparison a message. Delivery goroutine.
func (s *session) firstDelivery(consSeq, streamSeq uint64) (prevStream uint64, gap bool) {
	prevCons, prevStream := s.firstCons, s.firstStream
	s.firstCons, s.firstStream = consSeq, streamSeq
	return prevStream, prevCons != 0 && consSeq == prevCons+1 && streamSeq > prevStream+1
}

// noteSkipped counts the events the consumer passed over between two
// first deliveries of a session with consecutive consumer sequences (no
// other delivery, to this instance or another, came between them), at
// stream sequences prevStream and streamSeq (push makes the test, inline):
// the stream sequences between theirs were gone when the server came to them,
// removed from its head (noteDeletedUnread, between its looks) or its
// middle (a message TTL, max_msgs_per_subject, a rollup, a delete). Only
// once a look has shown the consumer without a filter (unfiltered), and
// only above the stream's last sequence at the session's start
// (skipFloor): the gaps in what the stream held then may be older than
// the durable (a new one's first pass over a stream's history, a KV
// bucket's overwritten revisions, a mirror's skipped sequences). Not on a
// stream whose gaps are no events (gapsNotEvents): one that purges its
// schedules as they fire, a mirror that leaves messages out. Delivery
// goroutine; a
// comparison a message.
func (c *Consumer) noteSkipped(prevStream, streamSeq uint64) {
	if !c.unfiltered.Load() {
		return
	}
	floor := c.skipFloor.Load()
	if floor == math.MaxUint64 || streamSeq-1 <= floor || c.gapsNotEvents.Load() {
		return
	}
	c.countDeletedUnread(max(prevStream+1, floor+1), streamSeq-1, "delivered_stream_seq", prevStream, "next_delivered_stream_seq", streamSeq)
}

// countDeletedUnread counts stream sequences lo..hi as events the stream
// deleted before jetsink read them (Stats.DeletedUnread), those of them
// not counted before in this process (deletedThrough), and logs them at
// Error, at most once a minute. Every instance on the durable counts
// those it sees: the same ones at its looks.
func (c *Consumer) countDeletedUnread(lo, hi uint64, args ...any) {
	c.deletedMu.Lock()
	defer c.deletedMu.Unlock()
	lo = max(lo, c.deletedThrough+1)
	if hi < lo {
		return
	}
	c.deletedThrough = hi
	n := hi - lo + 1
	total := c.stats.deletedUnread.Add(n)
	if c.selfDeleting.Load() {
		args = append(args, "may_include", "subject delete markers or fired schedules, which the stream deletes itself and are no events")
	}
	c.deletedLog.Log(context.Background(), c.log, slog.LevelError, time.Minute,
		"the stream deleted events before jetsink read them: its limits (max_age, max_msgs, max_bytes, discard old, "+
			"max_msgs_per_subject, a message TTL) or a purge or delete removed them while they waited, and no table will hold them",
		append([]any{"events", n, "stream_seqs", fmt.Sprintf("%d-%d", lo, hi), "total", total,
			"fix", "keep events longer than jetsink can fall behind (nats stream edit " + shellWord(c.cfg.Stream) +
				" --max-age, --max-msgs, --max-bytes), or publish them again from their source"}, args...)...)
}

// refreshFloor asks the server for the consumer's ack floor (noteFloor),
// unless NATS is away; a failure is left to the next tick. It returns
// what of the consumer's configuration someone changed on the server
// since jetsink applied it ("" for nothing) that would lose events or
// deliver them wrongly: its body left out (headers_only), a delivery
// limit (max_deliver: the server gives up on an event, neither stored nor
// dead-lettered), a shorter ack_wait, a backoff (it sets the waits after
// the first delivery, whatever ack_wait says: events come again while
// they commit), a lower max_ack_pending (the throughput falls, nothing
// failing; unless the stream's consumer_limits keep jetsink's from being
// set again: warned of, once), an inactive_threshold (the server deletes
// the durable when jetsink is stopped longer, and the next start makes it
// anew from the start of the stream; unless it is the stream's
// consumer_limits', which the server gives it again), another filter. The server swaps a filter without going
// back: the events the other filter left out that were published
// meanwhile are skipped, and jetsink's filter, applied again, does not
// bring them back. That is logged at Error with the ack floor and the
// delivered sequence, and the commands that make the consumer again past
// the floor it had under jetsink's filter (editFloor), not past its floor
// now, which the server moved past the events skipped.
// A filter another jetsink of the durable set (othersFilter: the one
// recorded in its metadata) is not set back until filterKeep has passed
// since this process first saw it, but logged at Error, at most once a
// minute: two
// jetsinks configured otherwise, as in a rolling update that changes
// nats.filter_subject, would swap it back and forth. Past filterKeep it
// is set back as an edit is (the jetsink that set it may have stopped),
// logged at Error with the ack floor and the delivered sequence.
// A destination record (destinationKey) naming another than
// Config.Destination is warned of (another jetsink writing elsewhere
// shares the durable, or did) and this one's recorded again (an empty
// or removed record silently): while both run, each warns once a look.
func (c *Consumer) refreshFloor(ctx context.Context) string {
	if !c.nc.IsConnected() {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	first, last, firstOK := c.streamSeqs(ctx) // before the consumer's: see noteDeletedUnread
	c.noteSkipFloor(last, firstOK)            // if the session's first look failed
	ci, err := c.cons.Load().Info(ctx)
	if err != nil {
		return ""
	}
	c.noteDeletedUnread(first, firstOK, ci)
	c.stuck.Store(nil) // the consumer answers (recheck)
	c.looks.Add(1)
	c.noteFloor(ci)
	c.notePausedOnServer(ci)
	got := ci.Config
	var changed []string
	if got.HeadersOnly {
		changed = append(changed, "headers_only")
	}
	if got.MaxDeliver != durableMaxDeliver {
		changed = append(changed, "max_deliver")
	}
	if got.AckWait < c.cfg.AckWait {
		// Shorter: events come again while they commit. (Not longer,
		// which costs nothing: instances of two settings, as in a rolling
		// update, would set it back and forth.)
		changed = append(changed, "ack_wait")
	}
	if len(got.BackOff) > 0 {
		changed = append(changed, "backoff")
	}
	if want := c.cfg.maxAckPending(); want > 0 && got.MaxAckPending > 0 && got.MaxAckPending < want {
		// Lower: the server delivers no more than that unacked, and the
		// throughput falls with nothing failing. (Not higher, as
		// ack_wait; nor under nats.max_ack_pending -1, which the
		// server's own limits may lower.) Not either when the stream's
		// consumer_limits.max_ack_pending is below jetsink's, set since
		// the edit: the server would refuse jetsink's at each update,
		// and Run, re-creating the consumer, would not consume again.
		limits, ok := c.streamLimits(ctx)
		switch {
		case !ok: // the next look
		case limits.MaxAckPending > 0 && limits.MaxAckPending < want:
			if !c.ackPendingLeft.Swap(true) {
				c.log.Warn("the consumer's max_ack_pending was lowered on the server, and the stream's consumer_limits.max_ack_pending, "+
					"below jetsink's, keeps jetsink from setting it back (the server refuses a higher one): fewer events are delivered at a time, "+
					"and the server will refuse the consumer at jetsink's next start and at any re-creation while it runs (as to resubscribe)",
					"max_ack_pending", got.MaxAckPending, "limit", limits.MaxAckPending, "nats.max_ack_pending", want,
					"fix", fmt.Sprintf("set nats.max_ack_pending to %d or less, or remove the stream's limit", limits.MaxAckPending))
			}
		default:
			c.ackPendingLeft.Store(false)
			changed = append(changed, "max_ack_pending")
		}
	} else {
		c.ackPendingLeft.Store(false)
	}
	if got.InactiveThreshold > 0 && !c.givenByStream(ctx, got.InactiveThreshold) {
		// The server deletes the durable once no pull has come for
		// that long: while jetsink is stopped, and the next start makes
		// it anew from the start of the stream. (Not the stream's
		// consumer_limits.inactive_threshold, which the server gives a
		// consumer that sets none, as jetsink's: setting it back, the
		// server gives it again. ensureStream warns of it.)
		changed = append(changed, "inactive_threshold")
	}
	f, at, others := c.othersFilter(&got)
	switch {
	case others && c.keepsOthers(at):
		// Set by another jetsink of this durable (filterKey): setting
		// it back at once would have the two swap it for as long as both
		// run.
		c.otherFilterLog.Log(ctx, c.log, slog.LevelError, time.Minute, "another jetsink of this durable consumer consumes with another filter, "+
			"which this one keeps until keep_until (keep_for after it first saw it) rather than set its own back at once (the two would swap it, "+
			"each swap skipping events): this one consumes the events of that filter, not of its nats.filter_subject, and then sets its "+
			"own back; if that is not a rolling update under way, give the two jetsinks the same nats.filter_subject, or a nats.consumer each",
			"filter_subject", f, "nats.filter_subject", c.cfg.FilterSubject, "first_seen", at.UTC().Format(time.RFC3339),
			"keep_for", c.filterKeep, "keep_until", at.Add(c.filterKeep).UTC().Format(time.RFC3339),
			"ack_floor", ci.AckFloor.Stream, "delivered", ci.Delivered.Stream)
	case others:
		changed = append(changed, "filter_subject")
		c.filterEditSaid = true
		c.log.Error("another jetsink of this durable consumer set another filter, which this one first saw longer than keep_for ago: this one sets its own back, "+
			"since the one that set it may no longer run; the events on the subjects that filter left out that were published "+
			"meanwhile may have been skipped, and are not delivered once jetsink's filter is applied again (the server does not go back); "+
			"to have them delivered, "+c.remakeAfterEdit(ci)+
			"; if the other jetsink still runs, give the two the same "+
			"nats.filter_subject, or a nats.consumer each (each sets its own back keep_for after the other)",
			"filter_subject", f, "nats.filter_subject", c.cfg.FilterSubject, "first_seen", at.UTC().Format(time.RFC3339),
			"keep_for", c.filterKeep, "ack_floor", ci.AckFloor.Stream, "delivered", ci.Delivered.Stream)
	case !sameFilter(&got, c.cfg.FilterSubject):
		changed = append(changed, "filter_subject")
		c.filterEditSaid = true
		c.log.Error("the consumer's filter was changed on the server: the events on the subjects it left out that were published "+
			"meanwhile may have been skipped, and are not delivered once jetsink's filter is applied again (the server does not go back); "+
			"to have them delivered, "+c.remakeAfterEdit(ci),
			"filter_subject", got.FilterSubject, "filter_subjects", got.FilterSubjects,
			"nats.filter_subject", c.cfg.FilterSubject, "ack_floor", ci.AckFloor.Stream, "delivered", ci.Delivered.Stream)
	}
	if dest := c.cfg.Destination; dest != "" && got.Metadata[destinationKey] != dest {
		recorded := got.Metadata[destinationKey]
		if p, ok := destinationProblem(c.cfg.Consumer, recorded, dest); ok {
			c.log.Warn(p.Message, "fix", p.Fix, "recorded_destination", recorded, "destination", dest)
		}
		// Recorded again, so that the other, if it runs, warns too; a
		// failure is left to the next look.
		if err := c.recordDestination(ctx); err != nil {
			c.log.Debug("could not record the destination in the consumer's metadata", "err", err)
		}
	}
	return strings.Join(changed, ", ")
}

// givenByStream reports whether d, the durable's inactive_threshold, is
// the event stream's consumer_limits.inactive_threshold (inactiveLimit),
// or could not be told apart from it (a failed look). When it is not the
// one last noted, the stream is looked at again: its limit may have been
// changed since, and the durable given the new one by an update (another
// jetsink's). When it is, the stream is looked at again too, at most
// every inactiveLimitEvery: the server does not take the limit off the
// consumers it gave it to when the stream's is removed (the fix
// inactiveLimitProblem advises), so the durable keeps it, and only a look
// at the stream tells that it is jetsink's to set back now.
func (c *Consumer) givenByStream(ctx context.Context, d time.Duration) bool {
	if at := c.inactiveLimitAt.Load(); d == time.Duration(c.inactiveLimit.Load()) &&
		at != 0 && int64(c.sinceBase())+1-at < int64(inactiveLimitEvery) {
		return true
	}
	limits, ok := c.streamLimits(ctx)
	return !ok || d == limits.InactiveThreshold
}

// inactiveLimitEvery is how often givenByStream looks at the stream again
// while the durable's inactive_threshold is the stream's limit last noted.
const inactiveLimitEvery = time.Minute

// streamLimits looks at the event stream's consumer_limits now, and notes
// its inactive_threshold (inactiveLimit); ok false when the look failed.
func (c *Consumer) streamLimits(ctx context.Context) (limits jetstream.StreamConsumerLimits, ok bool) {
	stream, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return limits, false
	}
	limits = stream.CachedInfo().Config.ConsumerLimits
	c.noteInactiveLimit(limits.InactiveThreshold)
	return limits, true
}

// noteInactiveLimit notes the event stream's
// consumer_limits.inactive_threshold d, as seen now (inactiveLimit,
// inactiveLimitAt).
func (c *Consumer) noteInactiveLimit(d time.Duration) {
	c.inactiveLimit.Store(int64(d))
	c.inactiveLimitAt.Store(int64(c.sinceBase()) + 1)
}

// remakeSteps says how to have the durable deliver again the events
// another filter on it skipped: deleted and made again with jetsink's
// filter from stream sequence floor + 1 (deliverAfter), as a number, not
// the placeholder a fix without the floor says (floorPlaceholder); on a
// stream with interest retention, after a holding consumer from there is
// added (holdFirst). floor is editFloor's, and past says which floor it
// is: the ack floor the durable had under jetsink's filter
// (floorUnderFilter), not its floor now, which the server moved past the
// events skipped; or, when none is known, its floor now (floorNowOnly).
func (c *Consumer) remakeSteps(past string, floor uint64) string {
	return remakeStepsFor(&c.cfg, c.interest.Load(), past, floor)
}

// remakeStepsFor is remakeSteps for cfg's durable on an event stream with
// interest retention or not, for check, which has no Consumer.
func remakeStepsFor(cfg *Config, interest bool, past string, floor uint64) string {
	return fmt.Sprintf("stop jetsink and make the consumer again past %s, stream sequence %d "+
		"(nats consumer rm %s %s --force, then %s; jetsink keeps where it starts and sets the rest), which delivers again what was acked past that floor%s",
		past, floor, shellWord(cfg.Stream), shellWord(cfg.Consumer), consumerAdd(cfg.Stream, cfg.Consumer, cfg.FilterSubject, deliverAfter(floor)),
		holdFirst(cfg, deliverAfter(floor), interest))
}

// editFloor is the ack floor (a stream sequence) to make the durable again
// past once ci shows another filter on it (remakeSteps): the floor last
// noted under jetsink's filter on the stream of this session (noteFloor
// notes none under another), or ci's if lower. Not ci's own: under the
// other filter the server moved it past the events of jetsink's filter
// that it skipped (a durable that had acked everything delivered takes
// the last stream sequence it looked at as its floor), and a consumer made
// past it would skip them again. Without such a floor (none noted on this
// stream), ci's, with known false.
func (c *Consumer) editFloor(ci *jetstream.ConsumerInfo) (floor uint64, known bool) {
	floor = ci.AckFloor.Stream
	if c.streamCreated.IsZero() || !c.resumeStream.Equal(c.streamCreated) {
		return floor, false
	}
	return min(floor, c.resumeFloor.Load()), true
}

// The floors remakeSteps names: the one the durable had under jetsink's
// filter (editFloor's, known), or its floor now.
const (
	floorUnderFilter = "the ack floor it had under jetsink's filter"
	floorNowOnly     = "its ack floor now"
)

// remakeAfterEdit is remakeSteps from editFloor(ci), saying so when no
// floor under jetsink's filter is known.
func (c *Consumer) remakeAfterEdit(ci *jetstream.ConsumerInfo) string {
	floor, known := c.editFloor(ci)
	if known {
		return c.remakeSteps(floorUnderFilter, floor)
	}
	return c.remakeSteps(floorNowOnly, floor) + "; no ack floor under jetsink's filter is known to this process, and this one, the consumer's now, may be past " +
		"events the other filter skipped: to have those too, make it from a sequence before the other filter was set"
}

// notePausedOnServer logs, once for each pause, that the durable (ci, as
// the server has it) is paused on the server (nats consumer pause; the
// server keeps a pause through jetsink's updates), with resumes_in, and
// that it delivers again once the pause is over: nothing else showed
// such a pause while jetsink ran, no pull fails, and the events wait in
// the stream. (ensureConsumer warns of one it finds, once too.)
func (c *Consumer) notePausedOnServer(ci *jetstream.ConsumerInfo) {
	if ci.Paused {
		if !c.serverPaused.Swap(true) {
			c.log.Warn("the consumer was paused on the server (nats consumer pause): nothing is delivered until it resumes (nats consumer resume, or its pause time)",
				"resumes_in", ci.PauseRemaining.Round(time.Second))
		}
		return
	}
	if c.serverPaused.Swap(false) {
		c.log.Info("the consumer's pause on the server is over: delivering again")
	}
}

// sameFilter reports whether cc filters as jetsink's filter would: one
// filter subject, want ("" for none), in FilterSubject or alone in
// FilterSubjects.
func sameFilter(cc *jetstream.ConsumerConfig, want string) bool {
	switch len(cc.FilterSubjects) {
	case 0:
		return cc.FilterSubject == want
	case 1:
		return cc.FilterSubject == "" && cc.FilterSubjects[0] == want && want != ""
	}
	return false
}

// noteFloor keeps ci's ack floor as where a consumer Run makes again
// starts, for the stream of the current session, when ci has jetsink's
// filter. (Should ci be of a
// consumer on a stream that replaced it meanwhile, the floor is kept for
// a stream that is gone, and never used.) Run's goroutine.
func (c *Consumer) noteFloor(ci *jetstream.ConsumerInfo) {
	if ci == nil || c.streamCreated.IsZero() {
		return
	}
	if !sameFilter(&ci.Config, c.cfg.FilterSubject) {
		// Under another filter the server moves the floor past events of
		// jetsink's it skips (with nothing pending, to the last stream
		// sequence it looked at): the floor noted before is kept, for a
		// consumer made again and for the remake refreshFloor advises
		// (editFloor).
		return
	}
	// The latest, not the highest: a floor that went back on the same
	// stream (the consumer or the stream's sequence reset) is the safe one.
	c.resumeFloor.Store(ci.AckFloor.Stream)
	c.resumeStream = c.streamCreated
}

// ensureAll re-creates the stream (only with nats.create_stream), the
// consumer, and then the dead-letter stream (only with create_stream).
func (c *Consumer) ensureAll(ctx context.Context) error {
	if err := c.ensureStream(ctx); err != nil {
		return err
	}
	if err := c.ensureConsumer(ctx, nil); err != nil {
		return err
	}
	return c.ensureDeadLetterStream(ctx)
}

// sleep waits d or until intake or hard ends; it reports whether d passed.
func sleep(intake, hard context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-intake.Done():
		return false
	case <-hard.Done():
		return false
	}
}

// noDeadline is a context whose deadline is hidden but still ends it:
// nats.go bounds a JetStream API request by its default timeout only under
// a context without a deadline, and otherwise waits until the deadline for
// an answer that may never come.
type noDeadline struct{ context.Context }

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// mayPull waits for the pull gate (SetPullGate), and while the pull
// pause (SetPullPause) holds; false if ctx or hard ended, or the
// connection closed, first, or if it waited for a pause's end (Run then
// looks at the stream again before it pulls).
func (c *Consumer) mayPull(ctx, hard context.Context) bool {
	if c.pullGate != nil {
		select {
		case <-c.pullGate:
		case <-ctx.Done():
			return false
		case <-hard.Done():
			return false
		case <-c.closed:
			return false
		}
	}
	return !c.awaitUnpaused(ctx, hard)
}

// pausedNow asks the pull pause (SetPullPause) whether it holds, and for
// the channel closed at its next switch: false and nil without one.
func (c *Consumer) pausedNow() (paused bool, changed <-chan struct{}) {
	if c.pullPause == nil {
		return false, nil
	}
	return c.pullPause()
}

// awaitUnpaused waits while the pull pause holds, until it ends or ctx or
// hard ends, or the connection closes, first; it reports whether the pause
// held when it was called. A pause a session noted (pauseSession) that
// ended while it drained ends here too, not waited for. Run's goroutine.
func (c *Consumer) awaitUnpaused(ctx, hard context.Context) bool {
	paused, changed := c.pausedNow()
	if !paused {
		c.noteResumed()
		return false
	}
	c.notePaused()
	for paused {
		select {
		case <-changed:
		case <-ctx.Done():
			return true
		case <-hard.Done():
			return true
		case <-c.closed:
			return true
		}
		paused, changed = c.pausedNow()
	}
	c.noteResumed()
	return true
}

// noteResumed logs, once for each pause notePaused noted, that pulling
// resumes, and lets the next pause be noted.
func (c *Consumer) noteResumed() {
	if !c.pauseNoted {
		return
	}
	c.pauseNoted = false
	c.log.Info("pulling resumed: the sink reaches PostgreSQL again", "paused_for", time.Since(c.pausedAt).Round(time.Millisecond))
}

// pauseSession ends session s for the pull pause: it pulls no more, and
// what its client holds is pushed on (the sink gives it back), bounded by
// hard, as at a shutdown's drain. Run then waits for the pause's end.
func (c *Consumer) pauseSession(hard context.Context, s *session) (over bool, err error) {
	c.notePaused()
	s.paused = true
	return s.drain(hard)
}

// notePaused logs, once for each pause, that pulling paused, and clears
// what Run had found stuck: not pulling is meant now, not a fault for
// NotConsuming (Run counts anew, should a step fail after the pause).
func (c *Consumer) notePaused() {
	if c.pauseNoted {
		return
	}
	c.pauseNoted, c.pausedAt = true, time.Now()
	c.stuck.Store(nil)
	c.log.Info("pulling paused: the sink cannot reach PostgreSQL (it gives back the events it held); nothing is pulled until it can")
}

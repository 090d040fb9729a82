package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetsink/jetsink/processor"
)

func newRunCmd() *cobra.Command {
	var cf configFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the processor until SIGTERM/SIGINT/SIGHUP",
		Long: `Run the processor: pull from the durable consumer, map, COPY, COMMIT, ack.

A signal during start-up (connecting, creating or checking the stream, the
consumer and the table) stops it and exits 0: nothing has been taken in.
On SIGTERM or SIGINT (or SIGHUP, unless started ignoring it: nohup) it
drains: stops pulling, lets the rings empty, commits and acks the last batch, waits until NATS has confirmed the acks (for a
connection that is reconnecting too), and exits 0, within drain_timeout;
telemetry then shuts down (the last spans, the admin listener: a little over
3 s more at most; a second signal cuts both short, to about 1.5 s). A second
signal, or the drain timeout, before the acks are confirmed gives up waiting
and exits with status 130 within about 2.5 s at most (short budgets for the
stages, the NATS connections and the last spans; also after a stage failed, whose error is printed too; a signal within
100 ms of the one before is taken as a repeat of it, as timeout(1) sends); nothing that
was not committed has been acked, so JetStream redelivers it, and acks
NATS had not confirmed are logged: their events come back after ack_wait.
Acks that cannot be confirmed before then (the connection closed for good)
exit 1, saying so; acks that a connection lost on the way may have taken (a
NATS restart) are logged with their number, and the exit is 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			log := newLogger(cfg, cmd.ErrOrStderr())
			defer logExitAs(cfg, log, &err)

			ctx := cmd.Context()
			intake, stopIntake := context.WithCancel(ctx)
			defer stopIntake()
			hard, stopHard := context.WithCancelCause(ctx)
			defer stopHard(nil)

			var running atomic.Pointer[processor.Processor] // set once started
			dd := &drainDeadline{timeout: cfg.DrainTimeout, fire: func() {
				args := []any{"drain_timeout", cfg.DrainTimeout}
				if p := running.Load(); p != nil {
					// Between the log's once-a-minute lines a failing batch
					// is logged at Debug only: say what it meets.
					if d, msg := p.Sink().Failing(); d > 0 {
						args = append(args, "batches_failing_for", d.Round(time.Millisecond), "last_batch_error", msg)
					}
					if age := p.Sink().OldestAttempt(); age > 0 {
						args = append(args, "oldest_attempt", age.Round(time.Millisecond))
					}
					args = append(args, "acks_unconfirmed", p.Consumer().Stats().AcksUnconfirmed)
				}
				log.Warn("drain timeout: exiting now; uncommitted events stay unacked and will be redelivered (the log above says what held the drain up: "+
					"a batch failing or waiting on PostgreSQL, acks waiting on NATS)", args...)
				stopHard(fmt.Errorf("%w: drain took longer than drain_timeout %s", errAborted, cfg.DrainTimeout))
			}}
			defer dd.finish()
			// Start-up (connecting, creating or checking the stream, the
			// consumer and the table, which may build an index) has nothing
			// to drain: the first signal cancels it. New's context ends
			// only while New runs (st), so nothing New made is left with
			// one that has ended.
			startCtx, stopStart := context.WithCancel(hard)
			defer stopStart()
			var st struct {
				sync.Mutex
				done, stopped bool
			}
			defer watchSignals(func(sig os.Signal) {
				st.Lock()
				starting := !st.done
				st.stopped = starting
				st.Unlock()
				beginDrain(dd, func() {
					if starting {
						stopStart()
					}
					stopIntake()
				}, func() {
					if starting {
						log.Info("stopping: still starting up, nothing taken in yet; a second signal exits at once", "signal", sig.String())
					} else {
						log.Info("draining: stopped pulling, committing what is in flight; a second signal exits at once", "signal", sig.String(), "drain_timeout", cfg.DrainTimeout)
					}
				})
			}, func(sig os.Signal) {
				if !dd.cutShort(func() {
					log.Warn("second signal: exiting now; uncommitted events stay unacked and will be redelivered", "signal", sig.String())
					stopHard(fmt.Errorf("%w by a second signal (%s)", errAborted, sig))
				}) {
					if dd.wasCut() {
						// drain_timeout came first and ended it hard.
						log.Info("second signal: the drain was cut short already by drain_timeout; exiting", "signal", sig.String())
						return
					}
					// The acks are confirmed: what is left is telemetry.
					log.Info("second signal: the drain is over; not waiting for the export of the last spans", "signal", sig.String())
					stopHard(fmt.Errorf("second signal (%s) after the drain", sig))
				}
			})()

			logCPU("/", log)
			defer applyMemoryLimit(cfg.MemoryLimit, log)()
			p, err := processor.New(startCtx, cfg, log)
			st.Lock()
			st.done = true
			stopped := st.stopped
			st.Unlock()
			if stopped {
				// Whether New noticed or not: nothing was pulled.
				if err == nil {
					_ = p.Shutdown(hard)
				}
				if cut := aborted(hard); cut != nil {
					return runResult(err, cut, nil) // a second signal, or drain_timeout
				}
				if err != nil && !errors.Is(err, context.Canceled) {
					return err // start-up failed on its own (say, a connect that timed out)
				}
				log.Info("stopped before starting: nothing was taken in")
				return nil
			}
			if err != nil {
				// A second signal, or drain_timeout, while still connecting?
				return runResult(err, aborted(hard), nil)
			}
			running.Store(p)
			// What was unsettled when the stop began: the drain's last
			// line tells the stop's share from the run's.
			var atStop atomic.Pointer[unsettled]
			defer context.AfterFunc(intake, func() { u := unsettledOf(p); atStop.Store(&u) })()
			err = p.Run(intake, hard)
			// The drain is over once NATS has read the acks of the last
			// batches: CloseStages waits for that until the drain's
			// deadline (a connection that is reconnecting holds them in its
			// buffer, and closing it would drop them) and gives up at once
			// when hard ends. Without a signal (a stage failed) it waits at
			// most 10 s.
			closeCtx := hard
			if d := dd.deadline(); !d.IsZero() {
				var cancel context.CancelFunc
				closeCtx, cancel = context.WithDeadline(hard, d)
				defer cancel()
			}
			closeErr := p.CloseStages(closeCtx)
			if closeErr != nil && closeCtx.Err() == context.DeadlineExceeded {
				dd.expire() // the drain's deadline passed, whether or not its timer has fired yet
			}
			// Over: neither the timer nor a second signal turns a drain
			// that ended in time into an exit 130 from here on, while
			// telemetry shuts down (the last spans, the admin listener:
			// bounded by Shutdown, and cut short by a second signal).
			cut := dd.finish()
			// Not closeCtx: the drain's deadline does not cut the export
			// of the last spans short; a second signal does (hard).
			_ = p.Shutdown(hard) // CloseStages' error, which closeErr holds
			var cutBy error
			if cut {
				cutBy = aborted(hard)
			}
			if err := runResult(err, cutBy, closeErr); err != nil {
				return err
			}
			logDrained(log, unsettledOf(p), atStop.Load())
			return nil
		},
	}
	cf.register(cmd.Flags())
	return cmd
}

// aborted is hard's cause when a second signal or drain_timeout ended it
// (it wraps errAborted), nil otherwise.
func aborted(hard context.Context) error {
	if cause := context.Cause(hard); errors.Is(cause, errAborted) {
		return cause
	}
	return nil
}

// runResult is what run returns, given the error of the stages (or of
// connecting), the drain's cut (aborted's) and the error of CloseStages. A
// cut decides the exit status, 130, as promised for a second signal and
// drain_timeout, also after a stage failed; but it does not hide that
// failure: both are returned, joined, and printed. A stage's error that
// only says the cut ended it (context.Canceled) is left out.
func runResult(err, cut, closeErr error) error {
	switch {
	case cut != nil && (err == nil || errors.Is(err, context.Canceled)):
		return cut
	case cut != nil && !errors.Is(err, cut):
		return errors.Join(err, cut)
	case err != nil:
		return err // it holds cut, if any
	case closeErr != nil:
		return fmt.Errorf("drain: %w", closeErr)
	}
	return nil
}

// beginDrain is the first signal's work: it starts the drain's deadline,
// then stop (which ends intake, or start-up), and only then say logs it.
// The deadline first: with nothing in flight Run returns as soon as intake
// ends, and run then reads the deadline for CloseStages; read before start,
// it is zero, and CloseStages waits its own 10 s instead of drain_timeout.
// The log last: a write to a stderr that blocks (a full pipe) must not
// hold up the drain. So an idle Run may end, and say so, before this line
// is written: on a slow stderr "drained" can precede "draining".
func beginDrain(dd *drainDeadline, stop, say func()) {
	dd.start()
	stop()
	say()
}

// drainDeadline decides how a drain ends: complete (finish), or cut short
// by its deadline (the timer that start sets timeout from now, or expire)
// or by a second signal (cut), whichever comes first. A cut runs under its
// lock, so that finish returns either before any cut or after the one that
// came first has run to its end, never while one is under way, and nothing
// is cut after finish; fire (the deadline's cut) runs at most once.
type drainDeadline struct {
	timeout time.Duration
	fire    func() // the deadline's cut: ends the drain hard

	mu    sync.Mutex
	timer *time.Timer
	at    time.Time
	ended bool // finish or a cut came
	cut   bool // a cut came first
}

func (d *drainDeadline) start() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ended || d.timer != nil {
		return
	}
	d.at = time.Now().Add(d.timeout)
	d.timer = time.AfterFunc(d.timeout, d.expire)
}

// deadline is when the drain must end; zero before start.
func (d *drainDeadline) deadline() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at
}

// expire cuts the drain short with fire unless it has ended; when the timer
// is firing already, it returns once fire has (so that the drain's end is
// seen).
func (d *drainDeadline) expire() { d.cutShort(d.fire) }

// cutShort ends the drain with f, which ends it hard, unless it has ended
// already (finish, or another cut, came first); it reports whether it ran
// f. f runs under d's lock: it must not call d.
func (d *drainDeadline) cutShort(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ended {
		return false
	}
	d.ended, d.cut = true, true
	if d.timer != nil {
		d.timer.Stop()
	}
	f()
	return true
}

// wasCut reports whether a cut (cutShort) ended the drain.
func (d *drainDeadline) wasCut() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cut
}

// finish ends the drain as complete unless a cut came first, waiting for a
// cut under way, and reports whether one did: from then on nothing cuts it.
func (d *drainDeadline) finish() (cut bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ended = true
	if d.timer != nil {
		d.timer.Stop()
	}
	return d.cut
}

// unsettled counts the events a drain that committed every event taken
// in could not settle here: acks that a lost connection may have taken
// (unconfirmed) or that a connection refused (ackErrors, e.g. nats.go's
// reconnect buffer full), whose events come back after ack_wait; the
// publishes to $JS.ACK the server refused for want of permission
// (acksRefused: the client sees no error, the server drops them; acks,
// terms, naks and InProgress alike, their events come back after ack_wait
// or may); events nak'ed because their dead letter could not be stored
// (deadLetterFailed), which come back after the nak's delay; the terms
// of stored dead letters that failed in the client (termErrors: their
// events come back after ack_wait, and are dead-lettered again); and those
// left to the stream that replaced theirs (stale: committed rows not
// acked, dead letters whose original was not terminated); and rows the
// database refused at the end with nothing left to commit to tell the
// row's fault from the table's (givenUp: left unacked, they come back
// after ack_wait); and the events given back while PostgreSQL was
// unreachable (released: nak'ed, they come back for this instance or
// another; their naks that failed count in ackErrors, their events come
// back after ack_wait). Of the unconfirmed, settled are those the
// consumer showed settled after all at its close
// (consumer.Stats.AcksSettled: the durable's ack floor was past every
// message they may have been for).
type unsettled struct {
	unconfirmed, ackErrors, acksRefused, deadLetterFailed, termErrors, stale, givenUp, released uint64
	settled                                                                                     uint64
}

// unsettledOf reads p's counters.
func unsettledOf(p *processor.Processor) unsettled {
	cs, ss := p.Consumer().Stats(), p.Sink().Stats()
	return unsettled{unconfirmed: cs.AcksUnconfirmed, ackErrors: ss.AckErrors + ss.ReleaseErrors, acksRefused: cs.AcksRefused, deadLetterFailed: cs.DeadLetterFailed,
		termErrors: cs.TermErrors, stale: ss.StaleAcks + cs.StaleTerms, givenUp: ss.GivenUp, released: ss.Released, settled: min(cs.AcksSettled, cs.AcksUnconfirmed)}
}

// logDrained says how a drain that committed every event taken in ended:
// every event settled (committed and acked, or dead-lettered; acks a lost
// connection may have taken count as settled once the consumer showed
// them so), or some not, counted by u since the start; of them, those
// since the stop began (u less atStop; not told when atStop is nil).
func logDrained(log *slog.Logger, u unsettled, atStop *unsettled) {
	if rest := u; rest.unconfirmed-rest.settled == 0 {
		if rest.unconfirmed, rest.settled = 0, 0; rest == (unsettled{}) {
			var args []any
			if u.unconfirmed > 0 {
				// Said: the log above warned of them.
				args = []any{"acks_unconfirmed", u.unconfirmed, "acks_unconfirmed_settled", u.settled}
			}
			log.Info("drained: every event taken in is committed and acked, or dead-lettered", args...)
			return
		}
	}
	args := []any{"acks_unconfirmed", u.unconfirmed, "ack_errors", u.ackErrors, "acks_refused", u.acksRefused, "dead_letter_failed", u.deadLetterFailed,
		"term_errors", u.termErrors, "stale", u.stale, "given_up", u.givenUp, "released", u.released}
	if u.settled > 0 {
		args = append(args, "acks_unconfirmed_settled", u.settled)
	}
	if atStop != nil { // nil: the stop's snapshot was not taken (in time)
		args = append(args, "stop_acks_unconfirmed", u.unconfirmed-atStop.unconfirmed, "stop_ack_errors", u.ackErrors-atStop.ackErrors,
			"stop_acks_refused", u.acksRefused-atStop.acksRefused, "stop_dead_letter_failed", u.deadLetterFailed-atStop.deadLetterFailed,
			"stop_term_errors", u.termErrors-atStop.termErrors, "stop_stale", u.stale-atStop.stale, "stop_given_up", u.givenUp-atStop.givenUp,
			"stop_released", u.released-atStop.released)
	}
	// The message names only the kinds that occurred (the args carry
	// every count): an explanation of all seven made a line of about a
	// thousand characters, most about counts that were zero.
	var kinds []string
	for _, k := range []struct {
		n    uint64
		what string
	}{
		{u.ackErrors + u.unconfirmed - u.settled, "acks that failed or that a lost connection may have taken (their events come back after ack_wait)"},
		{u.acksRefused, "publishes to $JS.ACK the server refused for want of permission (acks_refused: acks, terms, naks and InProgress alike; their events come back, or may, after ack_wait)"},
		{u.deadLetterFailed, "events whose dead letter could not be stored (nak'ed, they come back)"},
		{u.termErrors, "dead letters stored whose term failed (term_errors: their events come back after ack_wait)"},
		{u.stale, "events of a stream replaced under them (left to it)"},
		{u.givenUp, "rows the database refused at the end with nothing left to commit to tell the row's fault from the table's (given_up: unacked, they come back after ack_wait)"},
		{u.released, "events given back while PostgreSQL was unreachable (released: nak'ed, they come back, to this instance or another; naks that failed count in ack_errors)"},
	} {
		if k.n > 0 {
			kinds = append(kinds, k.what)
		}
	}
	msg := "drained: every event taken in is committed or given back, but since the start not all were settled here: " + strings.Join(kinds, "; ") + "; each is logged above"
	if atStop != nil {
		msg += "; stop_* count those since the stop began"
	}
	log.Warn(msg, args...)
}

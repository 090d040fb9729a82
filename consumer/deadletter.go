package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
)

// ErrDeadLetter is wrapped by DeadLetter when the dead letter could not be
// published; the original was nak'ed with a delay (unless the error also
// wraps pipeline.ErrStaleEpoch: its stream was re-created, and the
// publish was tried until ctx ended), not acked or terminated.
var ErrDeadLetter = errors.New("dead-letter publish failed")

// Headers jetsink adds to a dead letter, next to the original headers.
const (
	HeaderSubject   = "Jetsink-Subject"    // original subject
	HeaderStream    = "Jetsink-Stream"     // original stream
	HeaderStreamSeq = "Jetsink-Stream-Seq" // original stream sequence
	HeaderDelivered = "Jetsink-Delivered"  // delivery count when it was given up
	HeaderStage     = "Jetsink-Stage"      // pipeline.StageDecode, StageSink or StageDeliver
	HeaderReason    = "Jetsink-Reason"     // error text, one line, at most MaxReasonLen bytes
	HeaderCode      = "Jetsink-Code"       // short machine-readable reason
	HeaderSQLState  = "Jetsink-SQLState"   // PostgreSQL SQLSTATE, when there is one
	HeaderOrigMsgID = "Jetsink-Msg-Id"     // the original Nats-Msg-Id, when there was one
	HeaderConsumer  = "Jetsink-Consumer"   // the durable consumer that gave it up (nats.consumer)
	// HeaderOmitted lists, quoted (strconv.QuoteToASCII) and comma-separated,
	// the original's header names nats.go cannot write (writableHeaderName),
	// left out of the letter, in byte order; at most MaxReasonLen bytes, ", ..." ending a
	// list cut short.
	HeaderOmitted = "Jetsink-Omitted-Headers"
)

// Consumer parks events for the pipeline and sink stages.
var _ pipeline.DeadLetterer = (*Consumer)(nil)

// MaxReasonLen bounds the Jetsink-Reason header, in bytes.
const MaxReasonLen = 512

// Nak delays after a failed dead-letter publish: 2s doubling per delivery,
// at most 60s.
const (
	dlNakBase = 2 * time.Second
	dlNakMax  = 60 * time.Second
)

// DeadLetter publishes ev to nats.dead_letter_subject, waits for the
// stream's acknowledgement, and only then terminates the original with the
// reason code (pipeline.DeadLetterer). The dead letter carries the original
// body and headers, except JetStream's own Nats-* control headers, which
// would act on the dead-letter stream (the original Nats-Msg-Id moves to
// Jetsink-Msg-Id), and any Jetsink-* header of the original's own, which
// would pass for jetsink's, and any header whose name nats.go cannot write
// (writableHeaderName; listed in Jetsink-Omitted-Headers, HeaderOmitted);
// it gets Nats-Msg-Id deadLetterID(ev, consumer) so a poison event
// redelivered before its Term lands is stored once, and the Jetsink-*
// headers above. A letter of this consumer's that came back (refuseLoop:
// an event on the dead-letter subject itself, or one whose
// Jetsink-Consumer and Jetsink-Stream are this consumer's and stream's,
// sourced back under another subject) is not dead-lettered again but
// nak'ed with the longest delay. Jetsink-Reason is shortened or left out
// if the letter would otherwise exceed the connection's max_payload.
//
// The publish may take min(5 s, nats.ack_wait/8), at least 500 ms, and
// less if ctx ends first, or if the server refuses a dead letter
// meanwhile for want of permission (the error then wraps
// nats.ErrPermissionViolation and names the permission to give). One
// that gets no answer in that time, or is so refused, opens a breaker:
// until a probe publish (one at a time, at most every second,
// waiting min(30 s, nats.ack_wait/2) for its answer) gets a PubAck,
// DeadLetter publishes nothing and fails at once, as a
// failed publish does, and logs such failures at most once a second
// (logFailedDeadLetter). A publish that finds no stream, with
// nats.create_stream set, re-creates the dead-letter stream (at most every
// 5 s) and is sent once more. If it fails, the original is nak'ed with a delay
// growing with its delivery count and the error returned wraps
// ErrDeadLetter; unless its stream was replaced since (see below): then
// nothing would deliver it again, and the letter is published again,
// waiting for the breaker's probes, until it is stored or ctx ends
// (publishStale), or at once if it is over the connected server's
// max_payload (no publish on this connection can store it); at that end the error also wraps pipeline.ErrStaleEpoch,
// and the event is lost, which is logged at Error. An event of
// dl.Stage pipeline.StageDeliver (delivered past nats.max_deliver) is
// counted in Stats.MaxDelivered, every other in Stats.DeadLettered. If the
// publish
// succeeds and the Term fails, DeadLetter logs it, counts it in
// Stats.TermErrors and returns nil (the
// message will come back, its dead letter is not stored again if it is
// published within the dead-letter stream's duplicate window of the first,
// and it is terminated then). An event whose stream was replaced since it was taken
// (its Epoch is not the consumer's) is not terminated: the term would land
// on the new stream's event with the same sequence. A stored letter is
// logged at Warn, "event dead-lettered", at most once a second for each
// code (held_back counts the rest of that code), with its reason, but for a row the database refused,
// whose reason may quote the row's values (its code and SQLSTATE are
// logged). Safe for concurrent use.
func (c *Consumer) DeadLetter(ctx context.Context, ev *pipeline.Event, dl pipeline.DeadLetter) error {
	if ev.Msg == nil {
		return fmt.Errorf("%w: event %s:%d has no message handle", ErrDeadLetter, ev.Stream, ev.StreamSeq)
	}
	// Whatever happens below, the event's life here ends: its bytes go
	// back to the in-flight budget (a nak or term does it too; a stale
	// event gets neither).
	defer pipeline.Release(ev.Msg)
	if c.cameBack(ev) {
		return c.refuseLoop(ev, dl)
	}
	m := c.deadLetterMsg(ev, dl)
	ack, err := c.publishDeadLetter(ctx, ev, m)
	if errors.Is(err, nats.ErrBadHeaderMsg) {
		err = fmt.Errorf("%w: a header name of the dead letter is one nats.go cannot write (a bug: such names are left out)", err)
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		err = fmt.Errorf("%w: the dead letter is %d bytes with its headers, the server's max_payload %d (raise it, or remove the event from the stream)",
			err, headerLen(m.Header)+len(m.Data), c.nc.MaxPayload())
	}
	if err != nil {
		c.stats.deadLetterFailed.Add(1)
		delay := nakDelay(uint64(ev.Delivered))
		var nerr error
		if !c.epochs.IfCurrent(ev.Epoch, func() { nerr = ev.Msg.NakWithDelay(delay) }) {
			// Its stream was replaced: a nak would send the new stream's
			// event with the same sequence back while it may be in flight,
			// and the event itself is in no stream any more (or in one
			// whose durable was made past it): this letter is its only
			// copy. It is published again until it is stored, or ctx ends.
			if ack, err = c.publishStale(ctx, ev, dl, m, err); err != nil {
				return fmt.Errorf("%w: publish to %s: %w; not nak'ed: %w", ErrDeadLetter, c.cfg.DeadLetterSubject, err, pipeline.ErrStaleEpoch)
			}
		} else if nerr != nil {
			c.logFailedDeadLetter(err, true, "dead-letter publish failed, and so did the nak; the event comes back after ack_wait", "subject", ev.Subject,
				"stream_seq", ev.StreamSeq, "code", dl.Code, "dead_letter_subject", c.cfg.DeadLetterSubject, "err", err, "nak_err", nerr)
			return fmt.Errorf("%w: publish to %s: %w (nak: %w)", ErrDeadLetter, c.cfg.DeadLetterSubject, err, nerr)
		} else {
			c.logFailedDeadLetter(err, false, "dead-letter publish failed; event nak'ed for redelivery", "subject", ev.Subject, "stream_seq", ev.StreamSeq, "code", dl.Code,
				"dead_letter_subject", c.cfg.DeadLetterSubject, "retry_in", delay, "err", err)
			return fmt.Errorf("%w: publish to %s: %w", ErrDeadLetter, c.cfg.DeadLetterSubject, err)
		}
	}
	// Every stored dead letter counts, a repeat too (JetStream de-duplicated
	// it: an earlier delivery's publish was stored, and its term failed or
	// its PubAck was lost), as the pipeline's and the sink's counters and
	// jetsink_events_dead_lettered_total count it: the PubAck cannot tell
	// whether that earlier one was counted.
	if dl.Stage == pipeline.StageDeliver {
		c.stats.maxDelivered.Add(1)
	} else {
		c.stats.deadLettered.Add(1)
	}
	// The one line of a stored dead letter (the worker and the sink log
	// none at Warn), at most once every dlProbeEvery for each code: a
	// producer sending bad events, or a table refusing many rows, would
	// log a line each (the dead-letter stream holds every one,
	// jetsink_events_dead_lettered_total counts them).
	msg := "event dead-lettered"
	if ack.Duplicate {
		msg = "event dead-lettered before (its dead letter is stored once); terminating it"
	}
	c.dlDoneLog.of(dl.Code).Log(ctx, c.log, slog.LevelWarn, dlProbeEvery, msg, "subject", ev.Subject, c.eventStream(ev), "stream_seq", ev.StreamSeq,
		"stage", dl.Stage, "code", dl.Code, "sqlstate", dl.SQLState, "delivered", ev.Delivered, "reason", loggedReason(dl))
	reason := dl.Code
	if reason == "" {
		reason = "dead_letter"
	}
	if !c.epochs.IfCurrent(ev.Epoch, func() {
		// Counted as an ack, for Close to confirm.
		c.acks.begin(1)
		err = ev.Msg.TermWithReason(reason)
		c.acks.end(1, btoi(err == nil))
	}) {
		// Its stream was replaced: a term would land on the new stream's
		// event with the same sequence.
		c.stats.staleTerms.Add(1)
		c.log.Warn("dead letter stored; the original is not terminated, its stream was re-created since",
			"stream_seq", ev.StreamSeq)
		return nil
	}
	if err != nil {
		// The dead letter is stored: this is not a failed dead letter. The
		// event comes back after ack_wait and is terminated then; its dead
		// letter is de-duplicated by Nats-Msg-Id if it comes back within the
		// dead-letter stream's duplicate window (2 minutes by default), and
		// stored twice otherwise.
		c.stats.termErrors.Add(1)
		c.log.Warn("dead letter stored, but terminating the original failed; it will come back, and its dead letter "+
			"is stored again only if that is after the dead-letter stream's duplicate window", "stream_seq", ev.StreamSeq, "err", err)
	}
	return nil
}

// cameBack reports whether ev is a dead letter of this consumer's that
// came back into the event stream: on the dead-letter subject itself, or,
// through a source that transforms its subject, with this consumer's and
// stream's Jetsink-Consumer and Jetsink-Stream. Only such a letter carries
// both: deadLetterMsg leaves out an original's own Jetsink-* headers, and
// so does `jetsink dlq replay`.
func (c *Consumer) cameBack(ev *pipeline.Event) bool {
	if ev.Subject == c.cfg.DeadLetterSubject {
		return true
	}
	consumer, _ := ev.HeaderLookup(HeaderConsumer)
	stream, _ := ev.HeaderLookup(HeaderStream)
	return consumer == c.cfg.Consumer && stream == c.cfg.Stream
}

// refuseLoop settles ev, a dead letter of this consumer's that came back
// (cameBack), without dead-lettering it: the event stream sources or
// mirrors the dead-letter stream, or, for one matched by its headers, the
// letter may also have been re-published by hand with them (a replay by
// jetsink dlq replay strips them), which its error says. New refuses such a stream; a source
// added while Run runs is refused when Run looks at the stream again, at
// its next resubscribe (ensureAll: ErrInvalidConfig, retried, consuming
// nothing until the source is removed), and letters may come back before.
// Dead-lettering one stores it again under a new sequence, which comes
// back in turn, without end (a reviewer's run: 5,600 letters a second of
// one bad event). The letter stays where it is; ev is nak'ed with the
// longest delay (dlNakMax), not terminated, so that nothing is lost while
// the stream's sources are put right, and counted and logged at Error (at
// most once a second) as a failed dead letter. One whose stream was
// replaced since is neither (the nak would land on the new stream's event
// with its sequence): its letter is stored already.
func (c *Consumer) refuseLoop(ev *pipeline.Event, dl pipeline.DeadLetter) error {
	c.stats.deadLetterFailed.Add(1)
	how, fix := "which stream "+ev.Stream+" sources or mirrors", "take the dead-letter stream out of its sources"
	logged := "a dead letter came back as an event: the event stream sources or mirrors the dead-letter stream; "
	if ev.Subject != c.cfg.DeadLetterSubject {
		// Matched by its Jetsink-* headers: a source that transforms the
		// subject, or a letter re-published by hand with its headers
		// (nats stream get, then nats pub), which replay would strip.
		how = "through a source or mirror of the dead-letter stream, or re-published with its Jetsink-* headers"
		fix = "take the dead-letter stream out of the stream's sources, and replay letters with jetsink dlq replay, which strips those headers"
		logged = "a dead letter came back as an event: the event stream sources or mirrors the dead-letter stream, or the letter was re-published with its Jetsink-* headers; "
	}
	err := fmt.Errorf("%w: event %s:%d (subject %s) is a dead letter of consumer %s that came back from nats.dead_letter_subject %s (%s); "+
		"not dead-lettered again (each would come back in turn): %s", ErrDeadLetter, ev.Stream, ev.StreamSeq,
		ev.Subject, c.cfg.Consumer, c.cfg.DeadLetterSubject, how, fix)
	var nerr error
	if !c.epochs.IfCurrent(ev.Epoch, func() { nerr = ev.Msg.NakWithDelay(dlNakMax) }) {
		return fmt.Errorf("%w; not nak'ed: its stream was re-created since", err)
	}
	args := []any{c.eventStream(ev), "stream_seq", ev.StreamSeq, "code", dl.Code, "dead_letter_subject", c.cfg.DeadLetterSubject,
		"retry_in", dlNakMax, "fix", fix}
	if nerr != nil {
		err = fmt.Errorf("%w (nak: %w)", err, nerr)
		args = append(args, "nak_err", nerr)
	}
	c.logFailedDeadLetter(err, false, logged+"it is not dead-lettered again, but nak'ed (each would come back in turn, without end)", args...)
	return err
}

// eventStream is what a line about ev says of its stream beside c.log's
// "stream", the configured one (slog writes a key given twice twice, and
// Elasticsearch and OpenSearch refuse a JSON line with a key twice):
// nothing for an event of this consumer's, whose ack subject names the
// consumer's stream (the same name after the stream is re-created: the
// epoch, not the name, tells them apart), and "event_stream" for one of
// another stream handed to DeadLetter. An empty Attr, which slog's
// handlers leave out, stands for nothing.
func (c *Consumer) eventStream(ev *pipeline.Event) slog.Attr {
	if ev.Stream == c.cfg.Stream {
		return slog.Attr{}
	}
	return slog.String("event_stream", ev.Stream)
}

// loggedReason is dl's reason for the log: a row the database refused
// (pipeline.StageSink, also as the cause of a max_deliver letter) has its
// reason in the letter only (Jetsink-Reason), since the database's error
// may quote a value of the row; its code and SQLSTATE are logged.
func loggedReason(dl pipeline.DeadLetter) string {
	if dl.Stage == pipeline.StageSink {
		return "refused by the database: see the dead letter's Jetsink-Reason"
	}
	return dl.Reason
}

// Waits between the publishes of a stale event's dead letter
// (publishStale): 250 ms doubling, at most 5 s.
const (
	staleRetryBase = 250 * time.Millisecond
	staleRetryMax  = 5 * time.Second
)

// publishStale publishes m, the dead letter of ev whose first publish
// failed with err after ev's stream was replaced (its epoch is not the
// current one), again and again until it is stored, or ctx (the run's
// hard stop) ends: ev can be neither nak'ed (the nak would land on the
// new stream's event with its sequence) nor redelivered (its stream is
// gone, or its durable was made past it), so giving up the letter loses
// the event. It waits staleRetryBase, doubling up to staleRetryMax, after
// a publish that failed, and after one the open breaker held back until
// its next probe is due, so that it may be that probe. The letter's
// Nats-Msg-Id holds ev's store time (deadLetterID), so it cannot be taken
// for a letter of the new stream's event with the same sequence. If ctx
// ends first, or the letter is over max_payload or has a header name
// nats.go cannot write (neverFits: retrying
// would only hold ev's lane, or the sink's committer, until the hard
// stop), it logs the loss at Error, every time, and returns the last
// error.
func (c *Consumer) publishStale(ctx context.Context, ev *pipeline.Event, dl pipeline.DeadLetter, m *nats.Msg, err error) (*jetstream.PubAck, error) {
	wait := staleRetryBase
	for tries := 1; ; tries++ {
		if neverFits(err) {
			if errors.Is(err, nats.ErrBadHeaderMsg) {
				c.log.Error("gave up the dead letter of an event whose stream was re-created since: nats.go cannot write one of its header names "+
					"(a bug: such names are left out); the event is lost, neither stored nor dead-lettered (its stream no longer holds it)",
					c.eventStream(ev), "subject", ev.Subject, "stream_seq", ev.StreamSeq, "published", ev.Published, "code", dl.Code,
					"dead_letter_subject", c.cfg.DeadLetterSubject, "tries", tries, "err", err)
				return nil, err
			}
			// Given up though a reconnect to a server with a larger
			// max_payload could store it: waiting for one that may never
			// come would hold ev's lane, or the committer, until the hard stop.
			size, limit := headerLen(m.Header)+len(m.Data), c.nc.MaxPayload()
			c.log.Error(fmt.Sprintf("gave up the dead letter of an event whose stream was re-created since: it is %d bytes with its headers, "+
				"over the connected server's max_payload (%d bytes); the event is lost, neither stored nor dead-lettered (its stream no "+
				"longer holds it)", size, limit),
				c.eventStream(ev), "subject", ev.Subject, "stream_seq", ev.StreamSeq, "published", ev.Published, "code", dl.Code,
				"dead_letter_subject", c.cfg.DeadLetterSubject, "dead_letter_bytes", size, "max_payload", limit, "tries", tries, "err", err)
			return nil, err
		}
		c.logFailedDeadLetter(err, true, "dead-letter publish failed for an event whose stream was re-created since: it cannot be nak'ed, "+
			"and nothing delivers it again, so the publish is tried again until it is stored (or jetsink is stopped hard)",
			c.eventStream(ev), "subject", ev.Subject, "stream_seq", ev.StreamSeq, "code", dl.Code,
			"dead_letter_subject", c.cfg.DeadLetterSubject, "tries", tries, "err", err)
		d := wait
		if errors.Is(err, errDeadLetterUnanswered) {
			d = max(c.dlBreaker.untilProbe(time.Now()), 10*time.Millisecond)
		} else {
			wait = min(2*wait, staleRetryMax)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			c.log.Error("gave up the dead letter of an event whose stream was re-created since, at a hard stop: the event is lost, "+
				"neither stored nor dead-lettered (its stream no longer holds it)", c.eventStream(ev), "subject", ev.Subject,
				"stream_seq", ev.StreamSeq, "published", ev.Published, "code", dl.Code, "dead_letter_subject", c.cfg.DeadLetterSubject,
				"tries", tries, "err", err)
			return nil, err
		case <-t.C:
		}
		var ack *jetstream.PubAck
		if ack, err = c.publishDeadLetter(ctx, ev, m); err == nil {
			c.log.Warn("dead letter of an event whose stream was re-created since stored after tries failed",
				c.eventStream(ev), "stream_seq", ev.StreamSeq, "tries", tries)
			return ack, nil
		}
	}
}

// neverFits reports whether err, a dead-letter publish's, is one that no
// publish of the same letter on this connection can get past: the letter
// is over the connected server's max_payload (nats.go refuses it before
// sending, every time; fitReason has already cut the reason), or has a
// header name nats.go cannot write (nats.ErrBadHeaderMsg: deadLetterMsg
// leaves every such name out, so this is a backstop, not an expected end). Only a
// reconnect to a server with a larger max_payload (nc.MaxPayload follows
// the server's INFO) could store it; publishStale does not wait for one. A refusal of the server
// (no stream, a full one) or no answer may end; so may a permissions
// violation on the dead-letter subject (the server drops the publish and
// says so on the connection, not to the request: publishOnce ends the
// publishes under way then, naming the permission), which is tried again
// as no answer is: a permission given saves the event.
func neverFits(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadHeaderMsg)
}

// logFailedDeadLetter logs a failed dead letter at Error, at most once
// every dlProbeEvery, with held_back, the number not logged since the last
// such line: one that the open breaker held back (err wraps
// errDeadLetterUnanswered) fails in microseconds, and a run of poison
// events would log thousands a second; one refused (no stream, a letter
// past max_payload) fails the same way at every delivery of every such
// event, for as long as it lasts. One refused for want of room, or held
// back while the stream is full (fullRefusal), says what is full and
// what to do, and, unless own is set, is logged at most once every
// quietEvery. own is for a line that says more than that the event was
// nak'ed (the nak failed too; the event's stream was re-created, and the
// letter is published again until stored): it keeps the once-a-second
// bound. Before, such lines went to the once-a-minute line, and one
// within a minute of the ordinary line was not logged. Stats.DeadLetterFailed
// counts them all.
func (c *Consumer) logFailedDeadLetter(err error, own bool, msg string, args ...any) {
	if full := c.fullRefusal(err); full != nil {
		msg, args = msg+": "+full.what, append(args, "fix", full.fix)
		if !own {
			// The same refusal for every dead letter until room is
			// made: logged with what to do, as the permission case is,
			// once every quietEvery (the readiness check fails
			// meanwhile).
			c.dlFullLog.Log(context.Background(), c.log, slog.LevelError, quietEvery, msg, args...)
			return
		}
	}
	limit := &c.dlFailLog
	if errors.Is(err, errDeadLetterUnanswered) {
		limit = &c.dlHeldLog
	}
	level := slog.LevelError
	if _, ok := errors.AsType[*dlNoLeaderError](err); ok {
		level = slog.LevelWarn // it comes back after the nak's delay
	}
	limit.Log(context.Background(), c.log, level, dlProbeEvery, msg, args...)
}

// errDeadLetterUnanswered is wrapped by DeadLetter when it did not
// publish at all: the breaker is open (see publishDeadLetter). The error
// also says what the last publish counted by the breaker got (dlBreaker's
// admit): no answer, or a probe's refusal such as no stream.
var errDeadLetterUnanswered = pipeline.ErrDeadLetterHeldBack

// dlProbeEvery is how often, at most, an open breaker lets one dead letter
// through as a probe.
const dlProbeEvery = time.Second

// dlCodeLimit bounds the line of a stored dead letter, "event
// dead-lettered", to one every dlProbeEvery for each code, held_back
// counting that code's letters not logged since: under one bound for
// all, the code that came first in each second took every line, and
// another as frequent was never named (a reviewer's run: 240 letters,
// half of them out_of_range, logged as invalid_json only). The codes are
// pipeline.DeadLetterCodes, a small fixed set, each with its own bound;
// any other code (a DeadLetterer's caller may pass one) shares the last.
// The zero value is ready; safe for concurrent use.
type dlCodeLimit struct {
	byCode [dlCodeSlots]pipeline.Every
}

// dlCodeSlots is the number of bounds of a dlCodeLimit: room for more
// codes than pipeline.DeadLetterCodes has, and one for any other
// (TestDeadLetterCodesHaveASlotEach).
const dlCodeSlots = 20

// dlCodeSlot is the index of each of pipeline.DeadLetterCodes in a
// dlCodeLimit; read-only.
var dlCodeSlot = func() map[string]int {
	m := map[string]int{}
	for i, code := range pipeline.DeadLetterCodes() {
		m[code] = min(i, dlCodeSlots-1)
	}
	return m
}()

// of is the bound of code's lines.
func (l *dlCodeLimit) of(code string) *pipeline.Every {
	if i, ok := dlCodeSlot[code]; ok {
		return &l.byCode[i]
	}
	return &l.byCode[dlCodeSlots-1]
}

// dlRecreateEvery is how often, at most, DeadLetter re-creates a deleted
// dead-letter stream (create_stream).
const dlRecreateEvery = 5 * time.Second

// publishDeadLetter publishes m, ev's dead letter, and waits for its
// PubAck, at most deadLetterTimeout, through a breaker: a publish that got no answer in
// that time (a dead-letter stream without quorum, or with no_ack, or a
// connection gone silent), as opposed to one refused, opens it, and the
// dead letters after it fail at once with errDeadLetterUnanswered, so that
// a run of poison events does not hold a worker's lanes (their letters,
// renewed with InProgress, waiting with their share of the in-flight
// budget), or the sink, for a timeout each. One dead letter at a
// time, at most every dlProbeEvery, goes through as a probe, and waits
// longer for its PubAck (probeTimeout), so that a dead-letter stream whose
// PubAcks steadily take longer than deadLetterTimeout still closes the
// breaker; ev, unless its stream was replaced since, gets InProgress
// before it, so that the wait does not run it past its ack wait. The
// first PubAck (a duplicate's too) closes the breaker. A publish that finds no stream
// (jetstream.ErrNoStreamResponse) with nats.create_stream set re-creates
// the dead-letter stream, at most every dlRecreateEvery, and is sent once
// more. A publish under way when the server refuses a dead letter on the
// connection (noteDeadLetterDenial: the user may not publish to the
// subject) ends then, rather than at its timeout, with an error that says
// so and wraps the refusal (nats.ErrPermissionViolation; publishOnce);
// for the breaker it is unanswered, so that while the permission is
// missing one probe a second is refused, not every dead letter. A dead
// letter stored clears the refusal (DeadLettersDenied). A publish refused
// for want of room (fullLimit: a full dead-letter stream, or JetStream
// store) is noted (noteDeadLetterFull) and opens the breaker the same
// way; a publish whose answer shows room (showsRoom: a letter stored, or
// another refusal of the stream's) clears that note, one that got no
// answer leaves it. A letter larger than the stream's max_bytes itself is
// refused, not full (noteDeadLetterFull): the note is cleared, and the
// breaker closed, when the stream looked up for it shows room for the
// letters that were refused as full; otherwise both are left as they
// were.
func (c *Consumer) publishDeadLetter(ctx context.Context, ev *pipeline.Event, m *nats.Msg) (*jetstream.PubAck, error) {
	probe, err := c.dlBreaker.admit(time.Now())
	if err != nil {
		return nil, err
	}
	timeout := c.deadLetterTimeout()
	if probe {
		timeout = c.probeTimeout()
		var perr error
		c.epochs.IfCurrent(ev.Epoch, func() { perr = ev.Msg.InProgress() })
		if perr != nil {
			c.log.Warn("in-progress before a dead-letter probe failed; the event may be delivered again meanwhile (its dead letter is stored once)",
				"stream_seq", ev.StreamSeq, "err", perr)
		}
	}
	ack, err := c.publishOnce(ctx, m, timeout)
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		if name, ok := c.deadLetterStreamThere(ctx); ok {
			// Not sent again at once: the nak's delay brings it back.
			err = &dlNoLeaderError{stream: name, err: err}
		} else if c.cfg.CreateStream && c.recreateDeadLetterStream(ctx) {
			ack, err = c.publishOnce(ctx, m, timeout)
		}
	}
	outcome := dlAnswered
	wasFull, tooLargeRoom := false, false
	if limit, ok := fullLimit(err); ok {
		err, tooLargeRoom = c.noteDeadLetterFull(ctx, err, limit, m)
		wasFull = tooLargeRoom
	} else if showsRoom(ack, err) {
		wasFull = c.dlFull.Swap(nil) != nil
	}
	switch {
	case tooLargeRoom:
		// A letter too large, refused by a stream that has room again
		// for the letters refused as full (noteDeadLetterFull): the
		// breaker the full stream opened closes, as on a letter stored,
		// rather than hold back the letters after it until one is.
	case err == nil:
		// The user may publish there (again).
		c.dlDenied.Store(nil)
	case errors.Is(err, errDeadLetterFull):
		// Unanswered for the breaker, as a refused permission: until a
		// probe a second is stored, the dead letters after it fail at
		// once, not each sent to be refused (a full store, as opposed
		// to a full stream, also costs the server a log line and its
		// stream leader a step-down per publish).
		outcome = dlUnanswered
	case errors.Is(err, nats.ErrPermissionViolation):
		// The server refused a dead letter while this one was under way
		// (publishOnce), and answers none it refuses. Unanswered for the
		// breaker: the dead letters after it fail at once, and a probe a
		// second finds the permission given, rather than each being sent
		// and refused (an -ERR, and a line in the server's log, each).
		outcome = dlUnanswered
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		// Our own timeout, not the caller's end.
		outcome = dlUnanswered
	default:
		outcome = dlRefused
	}
	switch c.dlBreaker.done(time.Now(), probe, outcome, err) {
	case breakerOpened:
		if errors.Is(err, errDeadLetterFull) {
			break // DeadLetter logs it, with what to do (logFailedDeadLetter)
		}
		msg := "the dead-letter stream did not answer a publish: dead letters fail at once (their events are nak'ed) " +
			"until a probe, one every " + dlProbeEvery.String() + " at most, is answered"
		if errors.Is(err, nats.ErrPermissionViolation) {
			msg = "the server refused a dead letter: the NATS user may not publish to " + c.cfg.DeadLetterSubject + ": give it permission; " +
				"dead letters fail at once (their events are nak'ed) until a probe, one every " + dlProbeEvery.String() + " at most, is stored"
		}
		// nats_status: a connection that is reconnecting buffers the
		// publish, and it times out the same way; the stream may be fine.
		c.log.Error(msg, "dead_letter_subject", c.cfg.DeadLetterSubject, "timeout", timeout, "probe_timeout", c.probeTimeout(),
			"nats_status", c.nc.Status().String(), "err", err)
	case breakerClosed:
		msg := "the dead-letter stream answers again"
		if wasFull {
			msg = "the dead-letter stream has room again: dead letters are stored"
		}
		c.log.Info(msg, "dead_letter_subject", c.cfg.DeadLetterSubject)
	}
	return ack, err
}

// showsRoom reports whether a dead-letter publish that was not refused
// for want of room (fullLimit) ended in an answer that shows the
// dead-letter stream is no longer full, so that a note of it
// (noteDeadLetterFull) is cleared: a PubAck, but for a duplicate's (the
// server answers one before it looks at the stream's limits), a refusal
// of the stream's other than of this letter's size (max_msg_size), or no
// stream at all (jetstream.ErrNoStreamResponse, the stream looked up and
// gone). No answer shows nothing: our timeout, ctx's end, a stream
// without a leader (*dlNoLeaderError; in a cluster a stream refusing a
// letter for want of store steps its leader down, and the next
// publishes get no answer), nor does a refusal of the client's (over
// max_payload, a header name) or of the user's (a permission). Before,
// each of those cleared the note, and the readiness check went green
// while the stream was still full.
func showsRoom(ack *jetstream.PubAck, err error) bool {
	if err == nil {
		return ack == nil || !ack.Duplicate
	}
	if _, noLeader := errors.AsType[*dlNoLeaderError](err); noLeader {
		return false
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		return true
	}
	api, ok := errors.AsType[*jetstream.APIError](err)
	return ok && api.ErrorCode != jetstream.JSErrCodeStreamMessageExceedsMaximum && !(api.ErrorCode == 10077 && api.Description == "message too large")
}

// publishOnce is one publish of m, bounded by timeout, that
// nats.go does not retry: by default it sends a publish that finds no
// stream (no responders) twice more, 250 ms apart, so that with a 500 ms
// deadline it ended in context.DeadlineExceeded, not
// jetstream.ErrNoStreamResponse: the deleted stream was not re-created,
// and the breaker opened as if nobody had answered. Without the retries it
// is a refusal, at once; its event is nak'ed, or the stream re-created.
//
// The server answers no publish it refuses for want of permission; it
// says so on the connection, with the subject and nothing that tells one
// publish from another (noteDeadLetterDenial). So every dead-letter
// publish under way when such a refusal is noted ends then (unless its
// PubAck came first, or ctx ended), with an error that names the
// permission and wraps the refusal (nats.ErrPermissionViolation): it
// went, or was about to go, to the subject refused, by the user refused.
// One begun after a refusal is noted is not touched by it. (A refusal of
// an earlier publish that timed out can still end one begun before it
// arrived; that one would be refused too, unless the permission was
// given in between: then its event is nak'ed and its dead letter,
// published again, is stored once by its Nats-Msg-Id if that is within
// the dead-letter stream's duplicate window.) An answer that came before
// the refusal (a stream's refusal, no stream) is returned as it came: the
// server answered it, so the permission was there.
func (c *Consumer) publishOnce(ctx context.Context, m *nats.Msg, timeout time.Duration) (*jetstream.PubAck, error) {
	dctx, deny := context.WithCancelCause(ctx)
	defer deny(nil)
	key := c.dlPublishing.add(deny)
	defer c.dlPublishing.remove(key)
	pctx, cancel := context.WithTimeout(dctx, timeout)
	defer cancel()
	ack, err := c.js.PublishMsg(pctx, m, jetstream.WithRetryAttempts(0))
	// The caller's end wins; a refusal is dctx's cause (noteDeadLetterDenial
	// notes only permission violations), and only the publish's end by
	// that cancel is the refusal's.
	ended := errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
	if cause := context.Cause(dctx); ended && ctx.Err() == nil && errors.Is(cause, nats.ErrPermissionViolation) {
		return nil, fmt.Errorf("the NATS user may not publish to %s: give it permission: %w", m.Subject, cause)
	}
	return ack, err
}

// publishSet holds the cancel functions of the dead-letter publishes
// under way, for noteDeadLetterDenial to end them. The zero value is
// empty. Safe for concurrent use.
type publishSet struct {
	mu      sync.Mutex
	next    uint64
	cancels map[uint64]context.CancelCauseFunc
}

// add keeps cancel until remove is called with the key it returns.
func (s *publishSet) add(cancel context.CancelCauseFunc) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancels == nil {
		s.cancels = make(map[uint64]context.CancelCauseFunc)
	}
	s.next++
	s.cancels[s.next] = cancel
	return s.next
}

// remove forgets the cancel function add kept under key.
func (s *publishSet) remove(key uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cancels, key)
}

// cancelAll cancels, with cause, the publishes under way, and forgets
// them.
func (s *publishSet) cancelAll(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, cancel := range s.cancels {
		cancel(cause)
		delete(s.cancels, key)
	}
}

// dlNoLeaderError is a dead-letter publish no stream answered while a
// stream captures the subject: its leader is being elected (a stepdown, a
// server restarting), most likely. Logged at Warn, not Error.
type dlNoLeaderError struct {
	stream string
	err    error
}

func (e *dlNoLeaderError) Error() string {
	return dlStreamWords(e.stream) + " did not answer (a leader election?): " + e.err.Error()
}

// dlStreamWords names the dead-letter stream name, or, when its lookup
// failed (name empty), the dead-letter stream alone.
func dlStreamWords(name string) string {
	if name == "" {
		return "the dead-letter stream"
	}
	return "dead-letter stream " + name
}

func (e *dlNoLeaderError) Unwrap() error { return e.err }

// deadLetterStreamThere looks up the stream that captures the dead-letter
// subject after a publish no stream answered, and reports whether one (or,
// the lookup failing otherwise, maybe one) is there: only
// jetstream.ErrStreamNotFound says it was deleted. The verdict is kept
// for dlRecreateEvery, so that a run of poison events during an election
// looks once; a look that finds it is logged at Warn.
func (c *Consumer) deadLetterStreamThere(ctx context.Context) (string, bool) {
	now := int64(c.sinceBase()) + 1
	if v := c.dlLooked.Load(); v != nil && now-v.at < int64(dlRecreateEvery) {
		return v.name, v.there
	}
	name, _, err := c.lookDeadLetterStream(ctx, false)
	v := &dlLook{at: now, name: name, there: !errors.Is(err, jetstream.ErrStreamNotFound)}
	c.dlLooked.Store(v)
	if v.there {
		args := []any{"dead_letter_subject", c.cfg.DeadLetterSubject}
		if err != nil {
			args = append(args, "lookup_err", err) // and the stream not named
		}
		c.log.Warn(dlStreamWords(v.name)+" did not answer (a leader election?); its dead letters' events are nak'ed and come back", args...)
	}
	return v.name, v.there
}

// lookDeadLetterStream looks up the stream that captures the dead-letter
// subject, within max(deadLetterTimeout, 2 s): its name ("" when the
// lookup failed: err says why, jetstream.ErrStreamNotFound that none
// captures it) and, with info set, its StreamInfo, nil when that second
// request failed (a stream without a leader answers none: a caller that
// looks after no answer asks for the name alone).
func (c *Consumer) lookDeadLetterStream(ctx context.Context, info bool) (string, *jetstream.StreamInfo, error) {
	lctx, cancel := context.WithTimeout(ctx, max(c.deadLetterTimeout(), 2*time.Second))
	defer cancel()
	name, err := c.js.StreamNameBySubject(lctx, c.cfg.DeadLetterSubject)
	if err != nil {
		return "", nil, err
	}
	if !info {
		return name, nil, nil
	}
	s, err := c.js.Stream(lctx, name)
	if err != nil {
		return name, nil, nil
	}
	return name, s.CachedInfo(), nil
}

// dlLook is deadLetterStreamThere's last verdict, at (sinceBase+1).
type dlLook struct {
	at    int64
	name  string
	there bool
}

// recreateDeadLetterStream makes the dead-letter stream again
// (ensureDeadLetterStream) after a dead letter found none, unless that was
// tried less than dlRecreateEvery ago (by this call's or another's dead
// letter). It reports whether a stream captures the subject now.
func (c *Consumer) recreateDeadLetterStream(ctx context.Context) bool {
	now := int64(c.sinceBase()) + 1 // the monotonic clock: a step of the host's does not hold it off
	last := c.dlRecreated.Load()
	if last != 0 && now-last < int64(dlRecreateEvery) || !c.dlRecreated.CompareAndSwap(last, now) {
		return false
	}
	c.log.Warn("no stream captures the dead-letter subject (deleted?); re-creating it (create_stream: true)",
		"dead_letter_subject", c.cfg.DeadLetterSubject)
	cctx, cancel := context.WithTimeout(ctx, max(c.deadLetterTimeout(), 2*time.Second))
	defer cancel()
	if err := c.ensureDeadLetterStream(cctx); err != nil {
		c.log.Error("re-creating the dead-letter stream failed", "err", err)
		return false
	}
	return true
}

// A dead-letter publish's outcome, for the breaker.
type dlOutcome int

const (
	dlAnswered   dlOutcome = iota // PubAck
	dlUnanswered                  // no answer within deadLetterTimeout
	dlRefused                     // any other error: the server (or nats.go) said no
)

// A change of the breaker's state, for the log.
type breakerChange int

const (
	breakerSame breakerChange = iota
	breakerOpened
	breakerClosed
)

// dlBreaker stops dead-letter publishes while the dead-letter stream does
// not answer. Closed (the zero value), every publish goes. A publish that
// gets no answer opens it; open, publishes fail at once, but for one probe
// at a time, at most every dlProbeEvery; a PubAck (a probe's, or one of a
// publish sent before it opened) closes it. Safe for concurrent use.
type dlBreaker struct {
	mu      sync.Mutex
	open    bool
	probing bool      // a probe is on its way
	next    time.Time // no probe before
	last    error     // open: the last unanswered publish's, or refused probe's, error
}

// admit reports whether it is the open breaker's probe, or, when a
// publish may not go now, an error wrapping errDeadLetterUnanswered that
// gives the last error recorded (not wrapped: this call did not get it,
// and a context error of its own would read as the caller's end).
func (b *dlBreaker) admit(now time.Time) (probe bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return false, nil
	}
	if b.probing || now.Before(b.next) {
		if b.last == nil {
			return false, errDeadLetterUnanswered
		}
		return false, fmt.Errorf("%w (the last: %s)", errDeadLetterUnanswered, b.last.Error())
	}
	b.probing = true
	return true, nil
}

// untilProbe is how long, from now, until admit would let a probe go: 0
// when the breaker is closed or a probe is due, a quarter of
// dlProbeEvery while one is under way.
func (b *dlBreaker) untilProbe(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case !b.open:
		return 0
	case b.probing:
		return dlProbeEvery / 4
	}
	return max(b.next.Sub(now), 0)
}

// probeDue reports whether admit would let a probe go now (tests).
func (b *dlBreaker) probeDue(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open && !b.probing && !now.Before(b.next)
}

// done records a publish's outcome and error (probe: admit said it was
// the probe).
func (b *dlBreaker) done(now time.Time, probe bool, o dlOutcome, err error) breakerChange {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch o {
	case dlAnswered:
		if b.open {
			b.open, b.last = false, nil
			return breakerClosed
		}
	case dlUnanswered:
		b.next = now.Add(dlProbeEvery)
		b.last = err
		if !b.open {
			b.open = true
			return breakerOpened
		}
	case dlRefused:
		if probe {
			b.next = now.Add(dlProbeEvery)
			b.last = err
		}
	}
	return breakerSame
}

// deadLetterID is a dead letter's Nats-Msg-Id:
// "<stream>:<stream_seq>:<store time, Unix ns>:<consumer>". Every delivery of one event
// gives the same id, so the dead-letter stream keeps one dead letter per
// event as long as each is published within its duplicate window of the
// first one stored (and the stream was not re-created since). The store
// time tells apart two events with one sequence, of a stream deleted and
// re-created under the same name: with the sequence alone, JetStream would
// drop the second event's dead letter as a duplicate of the first's and
// report success, and the second event would be terminated with no dead
// letter stored. The consumer tells apart the letters of two jetsinks that
// read one stream through durables of their own (into two tables, say) and
// share its dead-letter subject, the default: each gives the event up for
// reasons of its own.
func deadLetterID(ev *pipeline.Event, consumer string) string {
	id := ev.Stream + ":" + strconv.FormatUint(ev.StreamSeq, 10)
	if !ev.Published.IsZero() {
		id += ":" + strconv.FormatInt(ev.Published.UnixNano(), 10)
	}
	return id + ":" + consumer
}

// deadLetterMsg is ev's dead letter for dl (see DeadLetter). The original's
// own Jetsink-* headers, in any case, are left out with its Nats-* ones:
// only the ones jetsink sets below may say what the letter is, and one the
// publisher sent where jetsink sets none (Jetsink-SQLState of a letter
// without a SQLSTATE, Jetsink-Msg-Id of an event without a Nats-Msg-Id)
// would otherwise be read back by `jetsink dlq` as the letter's own.
func (c *Consumer) deadLetterMsg(ev *pipeline.Event, dl pipeline.DeadLetter) *nats.Msg {
	h := make(nats.Header, len(ev.Header)+10)
	var omitted []string
	for k, v := range ev.HeaderFields() {
		if strings.HasPrefix(k, "Nats-") || jetsinkHeader(k) {
			continue
		}
		if !writableHeaderName(k) {
			if !slices.Contains(omitted, k) {
				omitted = append(omitted, k)
			}
			continue
		}
		h[k] = append(h[k], v)
	}
	if len(omitted) > 0 {
		slices.Sort(omitted)
		h.Set(HeaderOmitted, omittedList(omitted, MaxReasonLen))
	}
	if ev.MsgID != "" {
		h.Set(HeaderOrigMsgID, ev.MsgID)
	}
	seq := strconv.FormatUint(ev.StreamSeq, 10)
	h.Set(HeaderMsgID, deadLetterID(ev, c.cfg.Consumer))
	h.Set(HeaderConsumer, c.cfg.Consumer)
	h.Set(HeaderSubject, ev.Subject)
	h.Set(HeaderStream, ev.Stream)
	h.Set(HeaderStreamSeq, seq)
	h.Set(HeaderDelivered, strconv.FormatUint(uint64(ev.Delivered), 10))
	h.Set(HeaderStage, oneLine(dl.Stage, 64))
	h.Set(HeaderReason, oneLine(dl.Reason, MaxReasonLen))
	h.Set(HeaderCode, oneLine(dl.Code, 64))
	if dl.SQLState != "" {
		h.Set(HeaderSQLState, oneLine(dl.SQLState, 16))
	}
	fitReason(h, len(ev.Data), c.nc.MaxPayload())
	return &nats.Msg{Subject: c.cfg.DeadLetterSubject, Header: h, Data: ev.Data}
}

// writableHeaderName reports whether nats.go (v1.55, isHeaderKeyValid)
// writes a header named k: at least one byte, each printable ASCII (33 to
// 126) but for "()/,:;<=>?@[\]{} and the double quote. It refuses to
// publish a message with any other (nats.ErrBadHeaderMsg), although the
// server, and other clients, pass names such as "ce/type" on: copied into
// a dead letter, such a name failed every publish of it, and its event
// was nak'ed again and again.
func writableHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if b := k[i]; b < 33 || b > 126 || strings.IndexByte(`"()/,:;<=>?@[\]{}`, b) >= 0 {
			return false
		}
	}
	return true
}

// omittedList is the value of HeaderOmitted for names: each quoted in
// ASCII (a valid header value whatever the name holds: no CR, LF or
// blank at either end), ", " between them, in the order given, at most n bytes: the names past that are left
// out and ", ..." ends the list.
func omittedList(names []string, n int) string {
	const more = ", ..."
	var b strings.Builder
	for i, k := range names {
		q := strconv.QuoteToASCII(k)
		if i > 0 {
			q = ", " + q
		}
		reserve := 0 // room for more, unless this is the last name
		if i < len(names)-1 {
			reserve = len(more)
		}
		if b.Len()+len(q)+reserve > n {
			if b.Len() == 0 {
				return "..."
			}
			b.WriteString(more)
			break
		}
		b.WriteString(q)
	}
	return b.String()
}

// jetsinkHeader reports whether k names a Jetsink-* header, in any case:
// nats.go keeps a header's name as it was sent, so "jetsink-sqlstate" is
// another key than HeaderSQLState, and a reader that folds case (as HTTP
// tools do) would take it for it.
func jetsinkHeader(k string) bool {
	const prefix = "Jetsink-"
	return len(k) >= len(prefix) && strings.EqualFold(k[:len(prefix)], prefix)
}

// fitReason shortens, or drops, the Jetsink-Reason header of a dead letter
// whose headers and body of n bytes would exceed the connection's
// max_payload: an event that reached the stream close to that size would
// otherwise have no dead letter ever (nats.go refuses the publish), and be
// nak'ed until max_deliver runs out. The body and the other headers stay
// whole; if they alone exceed max_payload, the publish still fails and
// says so.
func fitReason(h nats.Header, n int, maxPayload int64) {
	over := int64(headerLen(h)+n) - maxPayload
	if over <= 0 {
		return
	}
	r := h.Get(HeaderReason)
	if keep := int64(len(r)) - over; keep > 0 {
		if r = oneLine(r, int(keep)); r != "" {
			h.Set(HeaderReason, r)
			return
		}
	}
	h.Del(HeaderReason)
}

// headerLen is the size of h as nats.go writes it (nats.Msg's
// headerSize): "NATS/1.0\r\n", a "key: value\r\n" line per value, its
// leading and trailing spaces and tabs trimmed (textproto.TrimString),
// and "\r\n"; no headers, nothing. Before, the trimmed bytes were counted:
// a value ending in spaces made fitReason cut the reason for bytes never
// sent, and the size a letter too large is said to take more than the
// stream stores.
func headerLen(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": \r\n") + len(textproto.TrimString(v))
		}
	}
	return n
}

// oneLine makes s a safe header value: whitespace, control characters and
// line separators become one space per run, invalid UTF-8 becomes '?', and
// the result is cut to at most n bytes on a rune boundary.
func oneLine(s string, n int) string {
	var b strings.Builder
	b.Grow(min(len(s), n))
	space := false // the last rune written was a space
	for _, r := range s {
		switch {
		case r == utf8.RuneError:
			r = '?'
		case unicode.IsSpace(r), unicode.IsControl(r), r == '\u2028', r == '\u2029':
			if space {
				continue
			}
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > n {
			break
		}
		b.WriteRune(r)
		space = r == ' '
	}
	return strings.TrimSpace(b.String())
}

// deadLetterTimeout bounds one dead-letter publish: min(5 s, ack_wait/8),
// but at least 500 ms, which a PubAck from a replicated stream under load
// may need. The events waiting in a worker's lanes for their dead letters
// get InProgress from the pipeline's heartbeat (pipeline.SetHeartbeat: the
// sink's period, a third of ack_wait by default), and the lanes have no
// bound of their own (a worker's letters are bounded by the in-flight
// budget, or by a limit derived from max_ack_pending, 512 at least:
// pipeline.SetLetterLimit, pipeline.DefaultLetterLimit). The letter under way gets none: its lane
// settles it (term or nak) once this publish returns. Taken from its lane
// at most 5/4 of a heartbeat period after its last InProgress (5/12 of
// ack_wait by default), it is settled well within its ack wait after a
// publish so bounded (a re-creation of the dead-letter stream, and the
// publish sent again, at most every dlRecreateEvery, take longer). The
// breaker (publishDeadLetter) keeps a run of poison events, while the
// dead-letter stream hangs, from waiting out this timeout one after
// another in their lanes. (nats.go's own default is 5 s.)
func (c *Consumer) deadLetterTimeout() time.Duration {
	return max(min(5*time.Second, c.cfg.AckWait/8), 500*time.Millisecond)
}

// probeTimeout bounds the publish of the open breaker's probe:
// min(30 s, nats.ack_wait/2), but at least deadLetterTimeout. With
// deadLetterTimeout alone a dead-letter stream whose PubAcks steadily take
// longer (a replicated stream under load, 500 ms being the bound for an
// ack_wait up to 4 s) kept the breaker open for good: every probe timed
// out, and every dead letter failed. One probe at a time waits this long,
// at most every dlProbeEvery, while the other dead letters fail at once;
// its event got InProgress just before (publishDeadLetter), and the sink
// renews a row's before it parks it, so half of ack_wait leaves the
// settling time.
func (c *Consumer) probeTimeout() time.Duration {
	return max(min(30*time.Second, c.cfg.AckWait/2), c.deadLetterTimeout())
}

// nakDelay is how long a message waits after a failed dead-letter publish.
func nakDelay(delivered uint64) time.Duration {
	if delivered < 1 {
		delivered = 1
	}
	if delivered > 6 {
		return dlNakMax
	}
	return min(dlNakBase<<(delivered-1), dlNakMax)
}

// btoi is 1 for true, 0 for false.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// errDeadLetterFull is wrapped by a dead-letter publish refused for want
// of room (a *dlFullError).
var errDeadLetterFull = errors.New("the dead-letter stream is full")

// dlFullError is a dead-letter publish the server refused for want of
// room (fullLimit), with words that name what is full and say what to do.
// It wraps the server's refusal (a *jetstream.APIError), errDeadLetterFull
// and pipeline.ErrDeadLetterHeldBack: the consumer logs these
// (logFailedDeadLetter: once every quietEvery, but for its rarer lines),
// and the pipeline and the sink, which log a failed dead letter each once
// a second unless it wraps that sentinel, would add a line of their own
// for the same refusal, with nothing to do in it.
type dlFullError struct {
	at       time.Time             // refused then
	lookedAt time.Time             // words made then
	limit    string                // fullLimit's
	what     string                // what is full (deadLetterFullWords)
	fix      string                // what to do (deadLetterFullWords)
	info     *jetstream.StreamInfo // the dead-letter stream's, looked up at lookedAt (nil: the look failed)
	size     int64                 // the letter refused, as the stream stores it (storedSize)
	err      error                 // the server's refusal
}

func (e *dlFullError) Error() string { return e.what + ": " + e.err.Error() }

func (e *dlFullError) Unwrap() []error {
	return []error{e.err, errDeadLetterFull, errDeadLetterUnanswered}
}

// The limits fullLimit names, besides a stream's own (max_msgs,
// max_bytes, max_msgs_per_subject).
const (
	fullServer  = "server"  // the server's max_file_store or max_memory_store
	fullAccount = "account" // the account's JetStream storage limit
)

// fullLimit reports whether err is the server refusing a message for want
// of room, and which limit refused it: a stream with discard new at its
// max_msgs, max_bytes or max_msgs_per_subject (API error 10077, the
// store's error as the description: nats-server's ErrMaxMsgs, ErrMaxBytes
// and ErrMaxMsgsPerSubject, whose texts are the only thing that tells
// them apart), the server's JetStream store full (10023, insufficient
// resources: max_file_store, or max_memory_store for a memory stream; or
// 10047 and 10028, which 2.15.2 sends for a stream's reservation, not a
// publish), or the account's JetStream limit reached (10002). Each
// refuses every dead letter alike until room is made. (10077 with other
// text, such as a message too large, is not for want of room.)
func fullLimit(err error) (string, bool) {
	var api *jetstream.APIError
	if err == nil || !errors.As(err, &api) {
		return "", false
	}
	switch api.ErrorCode {
	case 10077:
		switch api.Description {
		case "maximum messages exceeded":
			return "max_msgs", true
		case "maximum bytes exceeded":
			return "max_bytes", true
		case "maximum messages per subject exceeded":
			return "max_msgs_per_subject", true
		}
	case 10023, 10047, 10028:
		return fullServer, true
	case 10002:
		return fullAccount, true
	}
	return "", false
}

// noteDeadLetterFull takes err, the server's refusal of m, a dead letter,
// for want of room (limit: fullLimit). At max_bytes it may be no want of
// room: the server refuses a letter whenever the bytes stored and the
// letter's (as the stream stores it, storedSize) would pass max_bytes,
// an empty stream too, so a letter larger than max_bytes itself never
// fits, while the letters after it may. Such a refusal is returned as a
// *dlTooLargeError, which says how far to raise max_bytes, and not noted:
// the breaker stays closed, and the readiness check is not touched.
// Before, it was taken for a full stream: the words said to purge an
// empty stream or raise max_bytes to a size still too small, the breaker
// held back the letters after it, and the check stayed red for as long
// as its event came back. Any other refusal is noted for
// DeadLettersDenied and returned as a *dlFullError. Its words are made
// again (deadLetterFullWords, after a look at the dead-letter stream,
// lookDeadLetterStream) at most once every quietEvery, or when the limit
// changes, or when the look they were made with would find m too large
// (it is looked at again before m is taken for too large): one look per
// refusal would add two requests to each. (A letter too large is looked
// at each time it is refused; its event comes back only after its nak's
// delay.) That look also tells whether a note of the stream full still
// holds (hasRoom): if not, the note is cleared and room reports true, as
// showsRoom does for a letter stored. Before, a stream full, then
// purged, then sent only letters too large, kept the note: the
// readiness check said it was full (and to raise max_bytes) while it
// stood empty, and the breaker held back the letters after each probe.
func (c *Consumer) noteDeadLetterFull(ctx context.Context, err error, limit string, m *nats.Msg) (_ error, room bool) {
	now := time.Now()
	noted := c.dlFull.Load()
	prev := noted
	if prev == nil || prev.limit != limit || now.Sub(prev.lookedAt) >= quietEvery || tooLarge(limit, prev.info, m) {
		_, info, _ := c.lookDeadLetterStream(ctx, true)
		if tooLarge(limit, info, m) {
			if noted != nil && noted.hasRoom(info) {
				room = c.dlFull.CompareAndSwap(noted, nil)
			}
			return newTooLargeError(info, m, err), room
		}
		what, fix := deadLetterFullWords(limit, info, c.cfg.DeadLetterSubject, storedSize(m, info))
		prev = &dlFullError{lookedAt: now, limit: limit, what: what, fix: fix, info: info}
	}
	f := &dlFullError{at: now, lookedAt: prev.lookedAt, limit: limit, what: prev.what, fix: prev.fix, info: prev.info,
		size: storedSize(m, prev.info), err: err}
	c.dlFull.Store(f)
	return f, false
}

// hasRoom reports whether info, the dead-letter stream's looked up after
// f was noted, shows room at f's limit: at max_bytes for a letter of the
// size f's was (what the stream holds and it within max_bytes), at
// max_msgs for one more letter, or either limit gone, or discard new
// gone. A limit the stream's info does not show (max_msgs_per_subject,
// the server's or the account's store) is taken as still reached: a
// letter stored, or another answer of the stream's (showsRoom), clears
// the note then.
func (e *dlFullError) hasRoom(info *jetstream.StreamInfo) bool {
	if info == nil {
		return false
	}
	if info.Config.Discard != jetstream.DiscardNew {
		return true
	}
	switch e.limit {
	case "max_bytes":
		return info.Config.MaxBytes <= 0 || int64(info.State.Bytes)+e.size <= info.Config.MaxBytes
	case "max_msgs":
		return info.Config.MaxMsgs <= 0 || int64(info.State.Msgs) < info.Config.MaxMsgs
	}
	return false
}

// tooLarge reports whether m, refused at limit, is larger than the
// max_bytes of the stream that info (nil: not known) describes.
func tooLarge(limit string, info *jetstream.StreamInfo, m *nats.Msg) bool {
	return limit == "max_bytes" && info != nil && info.Config.MaxBytes > 0 && storedSize(m, info) > info.Config.MaxBytes
}

// storedSize is the bytes m takes in the stream info describes (nil: a
// file stream), as StoredSize counts them.
func storedSize(m *nats.Msg, info *jetstream.StreamInfo) int64 {
	memory := info != nil && info.Config.Storage == jetstream.MemoryStorage
	return StoredSize(memory, len(m.Subject), headerLen(m.Header), len(m.Data))
}

// StoredSize is what a message of subject, encoded headers (0: none) and
// body of these lengths takes in a stream, as nats-server 2.15.2 counts it
// against max_bytes (fileStoreMsgSize, memStoreMsgSize): those lengths
// plus, in a file store, the record's length (4), sequence (8), timestamp
// (8), subject length (2), header length (4, none without headers) and a
// hash (8); in a memory store, 16.
func StoredSize(memory bool, subject, hdr, data int) int64 {
	n := int64(subject + hdr + data)
	switch {
	case memory:
		return n + 16
	case hdr == 0:
		return n + 30
	}
	return n + 34
}

// dlTooLargeError is a dead letter refused at the dead-letter stream's
// max_bytes (discard new) that is larger than max_bytes itself
// (noteDeadLetterFull): no room made lets it in. It is a refusal, as one
// past max_msg_size is (logFailedDeadLetter, once every dlProbeEvery; the
// pipeline and the sink log their own): it does not wrap
// errDeadLetterFull or pipeline.ErrDeadLetterHeldBack.
type dlTooLargeError struct {
	size     int64  // the letter, as the stream stores it
	maxBytes int64  // the stream's
	stream   string // the stream's name
	err      error  // the server's refusal
}

func newTooLargeError(info *jetstream.StreamInfo, m *nats.Msg, err error) *dlTooLargeError {
	return &dlTooLargeError{size: storedSize(m, info), maxBytes: info.Config.MaxBytes, stream: info.Config.Name, err: err}
}

func (e *dlTooLargeError) Error() string {
	return fmt.Sprintf("this dead letter (%d bytes, as dead-letter stream %s stores it) is larger than the stream's max_bytes %d, "+
		"and no room made would let it in: raise max_bytes to at least %d (%s): %v", e.size, e.stream, e.maxBytes, e.size,
		streamEdit(e.stream, fmt.Sprintf("--max-bytes %d", max(2*e.maxBytes, 2*e.size))), e.err)
}

func (e *dlTooLargeError) Unwrap() error { return e.err }

// fullRefusal is the refusal for want of room that err, a failed dead
// letter's, is, or was held back by (the breaker open after one, while
// no publish has got another answer since, noted no longer ago than
// DeadLettersDenied reports it: dlFullNoted), or nil.
func (c *Consumer) fullRefusal(err error) *dlFullError {
	if f, ok := errors.AsType[*dlFullError](err); ok {
		return f
	}
	if errors.Is(err, errDeadLetterUnanswered) {
		return c.dlFullNoted()
	}
	return nil
}

// dlFullNoted is the last refusal of a dead letter for want of room
// (noteDeadLetterFull), if not cleared since and at most dlDeniedFor ago,
// or nil: the one DeadLettersDenied reports, and the words a letter held
// back takes in the log (fullRefusal), so that the log does not say full
// once the readiness check no longer does.
func (c *Consumer) dlFullNoted() *dlFullError {
	if f := c.dlFull.Load(); f != nil && time.Since(f.at) <= dlDeniedFor {
		return f
	}
	return nil
}

// deadLetterFullWords says what refused a dead letter of size bytes (as
// the stream stores it, storedSize) for want of room (limit: fullLimit),
// and what to do, with info, the dead-letter stream's (nil when it could
// not be looked up), and subject, the dead-letter subject. The limit it
// offers is twice the present one, and at max_bytes at least what the
// stream holds and the letter. The commands are shell-quoted, and
// natscli's edit and purge get --force (without a terminal they fail
// asking).
func deadLetterFullWords(limit string, info *jetstream.StreamInfo, subject string, size int64) (what, fix string) {
	name, stream := "<dead-letter stream>", "the dead-letter stream (the one capturing "+subject+")"
	if info != nil {
		name, stream = shellWord(info.Config.Name), "dead-letter stream "+info.Config.Name
	}
	edit := func(flag string, have int64) string {
		if info == nil {
			return "nats stream edit " + name + " --force " + flag + " <more>"
		}
		more := max(2*have, have+1)
		if limit == "max_bytes" {
			more = max(more, int64(info.State.Bytes)+size)
		}
		return streamEdit(info.Config.Name, fmt.Sprintf("%s %d", flag, more))
	}
	purge := "nats stream purge " + name + " --force"
	const until = "; until then each event to dead-letter is nak'ed and delivered again, none lost, and enough of them fill max_ack_pending and stall jetsink"
	letters := "read its letters, then replay them after a fix (jetsink dlq replay deletes each letter it replays) or delete them (" + purge + ")"
	switch limit {
	case "max_msgs", "max_bytes", "max_msgs_per_subject":
		var have int64
		flag, held := "--"+strings.ReplaceAll(limit, "_", "-"), ""
		if info != nil {
			switch limit {
			case "max_msgs":
				have, held = info.Config.MaxMsgs, fmt.Sprintf(", holding %d letters", info.State.Msgs)
				if info.State.Msgs == 1 {
					held = ", holding 1 letter"
				}
			case "max_bytes":
				have, held = info.Config.MaxBytes, fmt.Sprintf(", holding %d bytes", info.State.Bytes)
			default:
				have = info.Config.MaxMsgsPerSubject
			}
		}
		at := limit
		if info != nil {
			at = fmt.Sprintf("%s %d", limit, have)
		}
		return fmt.Sprintf("%s is full (%s, discard new%s) and refuses more letters", stream, at, held),
			fmt.Sprintf("raise its %s (%s), or %s%s", limit, edit(flag, have), letters, until)
	case fullAccount:
		return "the NATS account's JetStream storage limit is reached, and " + stream + " refuses more letters",
			fmt.Sprintf("raise the account's JetStream limits (max_file, or max_mem for a memory stream), or free the account's store: %s%s", letters, until)
	}
	return "the NATS server's JetStream store is full (insufficient resources: max_file_store, or max_memory_store for a memory stream, or its disk), and " +
			stream + " refuses more letters",
		fmt.Sprintf("free the server's store (add disk, raise max_file_store, or delete what it holds: %s)%s", letters, until)
}

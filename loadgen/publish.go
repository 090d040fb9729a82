package loadgen

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetsink/jetsink/telemetry"
)

// ErrNotAcked is returned when JetStream did not acknowledge every publish.
var ErrNotAcked = errors.New("publishes not acknowledged by JetStream")

// ErrInvalidOptions is wrapped by the errors of Options.Validate.
var ErrInvalidOptions = errors.New("loadgen: invalid options")

// errReconnecting is the cause of a send the connection refused while it
// was reconnecting (it keeps nothing for the reconnect): the event did not
// go out, and is sent again once the connection is back.
var errReconnecting = errors.New("connection reconnecting: the send was refused, and goes again once the connection is back")

// Options says what to publish.
type Options struct {
	Subject  string // subject prefix; events go to <Subject>.<device>
	Subjects int    // number of distinct devices (subjects); 0: 1
	// EventBytes pads each event's JSON to this many bytes (Pad); 0 or
	// less than a bare event's ~180 bytes: no padding.
	EventBytes int
	Events     int           // publish this many (preload), or
	Rate       float64       // events per second, open loop, for
	Duration   time.Duration // this long (Rate and Duration go together)
	Run        uint64        // run id: makes ids and Nats-Msg-Ids unique per run
	First      uint64        // first sequence number (default 0)
	// MaxPending bounds the publishes not yet settled: awaiting their
	// PubAck, or failed and waiting to be sent again (default 4096). At the
	// bound the publisher waits, also in open loop: the events due
	// meanwhile go out late and are counted in Result.Late.
	MaxPending int
	// AckWait is how long a publish may wait for its PubAck before it counts
	// as failed and is sent again (default 5s). A resend is stored once only
	// within the stream's duplicate window, which must cover ResendSpan(AckWait);
	// MinDuplicateWindow(AckWait) when given as DuplicateWindow, of which
	// Publish keeps a margin.
	AckWait time.Duration
	// DuplicateWindow is the stream's duplicate window (0: not known). When
	// set, a publish is never sent again once the window less a margin
	// (min(DuplicateWindow/10, 1s), for the resend's way to the server) has
	// passed since its first send (the first the connection took: one it
	// refused went nowhere): JetStream would store a resend that
	// reaches it after the window a second time. Such a publish is given up
	// instead (Result.Failed and Result.PastWindow), as one never
	// acknowledged. ResendSpan within the window is no guarantee: a machine
	// that descheduled the publisher sends late.
	//
	// Whatever the window, Publish sends nothing while the connection
	// reconnects (see Publish): a resend that comes due meanwhile is held,
	// not counting as a try, until the connection is back; with the
	// window set it is given up once its time runs out, as nats.go would
	// keep it in the connection's reconnect buffer and send it at the
	// reconnect, however late. Give Publish a connection made with
	// nats.ReconnectBufSize(-1): a resend handed to it just as it drops
	// then fails at once (an ordinary failed send, sent again after the
	// reconnect while the window lasts) rather than wait in that buffer.
	DuplicateWindow time.Duration
	// Progress, when set, is called about every 100ms with the count sent.
	Progress func(sent int)
	// Stamp sets each event's ts to its scheduled send time (open loop) or
	// its send time (preload) instead of Base + seq ms, so that a benchmark
	// measures latency from the schedule (no coordinated omission). Stamped
	// events are no longer a pure function of (run, seq).
	Stamp bool
	// Tracer, when set, wraps each publish in a PRODUCER span "send
	// <subject>" (a child of ctx's span, if any) and sends its W3C
	// traceparent in the message headers, so that jetsink's process span
	// is its child. nil: each event still carries a traceparent, with a
	// random trace and span id and the sampled flag cleared, so that a
	// consumer that samples parent-based (jetsink does) does not trace it.
	Tracer trace.Tracer
	// NoTraceContext, with Tracer nil, sends no traceparent: jetsink then
	// samples the events as roots, at telemetry.sample_ratio. Benchmarks
	// of that sampling need it.
	NoTraceContext bool
	// Started, when set, is called once on the calling goroutine with the
	// schedule's start (Result.Start), before the first send: a caller can
	// time what it does from the first scheduled send. The first events go
	// out as late as it takes (Result.SendLag shows it).
	Started func(start time.Time)
	// Stop, when it is closed, ends the sending: Publish sends no more
	// events and waits, under its context, for the PubAcks of those sent
	// (resending what fails, as at the end of a full run), then returns
	// with Result.Stopped set. Cancelling the context instead returns at
	// once, with what was sent unsettled.
	Stop <-chan struct{}
}

// headerRoom is what Publish keeps of max_payload for an event's headers:
// the NATS/1.0 line, Nats-Msg-Id (under 50 bytes) and traceparent (55 and
// its key) take under 150, which leaves ~350 for a tracestate that a
// publisher's tracer may add (W3C allows up to 512: such an event may not
// fit, and its publish fails).
const headerRoom = 512

// MaxEventBytes is the largest EventBytes a server of maxPayload takes:
// what headerRoom leaves.
func MaxEventBytes(maxPayload int64) int64 { return maxPayload - headerRoom }

// MaxSubjects bounds Options.Subjects: Publish keeps every subject's name
// (about 40 MiB at the bound).
const MaxSubjects = 1 << 20

// MaxMaxPending bounds Options.MaxPending: Publish sizes its table of
// unsettled publishes for it up front, and each holds its event until it
// is settled (about 1 GiB of 1 KiB events at the bound).
const MaxMaxPending = 1 << 20

// Validate reports, wrapping ErrInvalidOptions, options Publish refuses:
// no Subject; neither or both of Events and Rate; Rate without Duration,
// or Duration without Rate; a Rate x Duration of less than one event;
// Subjects above MaxSubjects; negative counts.
// Zero Subjects, MaxPending and AckWait take their defaults.
func (o Options) Validate() error {
	var msg string
	switch {
	case o.Subject == "":
		msg = "Subject is required"
	case o.Events < 0:
		msg = "Events must not be negative"
	case o.Subjects < 0 || o.Subjects > MaxSubjects:
		msg = fmt.Sprintf("Subjects must be 0 (one) up to %d (got %d)", MaxSubjects, o.Subjects)
	case o.DuplicateWindow < 0:
		msg = "DuplicateWindow must be 0 (not known) or the stream's duplicate window"
	case o.MaxPending < 0 || o.MaxPending > MaxMaxPending:
		msg = fmt.Sprintf("MaxPending must be 0 (the default) up to %d (got %d)", MaxMaxPending, o.MaxPending)
	case o.EventBytes < 0 || o.EventBytes > 64<<20:
		msg = "EventBytes must be 0 (no padding) up to 64 MiB, the largest max_payload"
	case o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0):
		msg = "Rate must be a positive number of events per second"
	case o.Events > 0 && o.Rate > 0:
		msg = "give Events or Rate, not both"
	case o.Rate > 0 && o.Duration <= 0:
		msg = "Rate needs a positive Duration"
	case o.Rate == 0 && o.Duration != 0:
		msg = "Duration goes with Rate; Events are published as fast as acknowledged"
	case o.Rate == 0 && o.Events == 0:
		msg = "give Events, or Rate and Duration"
	case o.Rate > 0 && o.Rate*o.Duration.Seconds() < 1:
		msg = fmt.Sprintf("Rate x Duration (%g/s x %v) is less than one event", o.Rate, o.Duration)
	case o.Rate*o.Duration.Seconds() >= 1<<40:
		msg = "Rate x Duration is too many events"
	}
	if msg != "" {
		return fmt.Errorf("%w: %s", ErrInvalidOptions, msg)
	}
	return nil
}

// Total is the number of events Publish sends: Events, or Rate x Duration
// rounded to the nearest whole event.
func (o Options) Total() int {
	if o.Rate > 0 {
		return int(math.Round(o.Rate * o.Duration.Seconds()))
	}
	return o.Events
}

// Result counts what happened. Once Publish has returned without being
// cancelled, Sent = Acked + Duplicate + Failed.
type Result struct {
	// Sent counts the events sent, each once however often it was sent
	// again; once the connection is closed, less those whose every send
	// it refused (they never left the process).
	Sent  int
	Acked int // stored: acknowledged by JetStream (a resend's duplicate PubAck included)
	// Duplicate counts the events whose first send JetStream acknowledged
	// as a duplicate: it held their Nats-Msg-Id already (Run and First
	// used before, within the duplicate window) and did not store them again.
	Duplicate int
	// Failed counts the events given up: not acknowledged after every
	// retry, or past the window (PastWindow). A success PubAck to a send
	// of one that comes later, while Publish runs, counts it Acked (or
	// Duplicate) instead: JetStream stored it. Publish waits for such
	// PubAcks until ResendSpan(AckWait) has passed since its last
	// give-up (see Publish).
	Failed int
	// PastWindow counts, of Failed, the publishes given up before their
	// retries ran out because a resend would have gone out past
	// Options.DuplicateWindow (less its margin) after the first send.
	PastWindow int
	// Retried counts the resends after a failed or timed-out PubAck that
	// the connection took (not those it refused, nor those held while it
	// reconnected).
	Retried int
	// Late counts, in open loop, the events sent after their due time
	// because MaxPending publishes were unsettled, or the connection was
	// reconnecting, when they were due. It does not count an event sent
	// late because the publisher was slow or not scheduled: SendLag does.
	Late int
	// SendLag is, in open loop, the distribution of each event's send lag:
	// its first send (the clock read just before it was handed to the
	// connection, after the event was encoded) minus its due time, in microseconds (1 µs to 1 hour, 3 significant digits; a lag
	// below 1 µs is recorded as 0, one over an hour as an hour). The loop
	// sleeps at least a millisecond at a time and then sends everything
	// due, so up to ~1 ms is by design; more is the publisher descheduled,
	// slow, or held at MaxPending. nil for a preload.
	SendLag *hdrhistogram.Histogram
	// SendLagMax is the largest send lag, exactly; SentOver1ms counts the
	// events sent more than 1 ms after their due time (open loop).
	SendLagMax  time.Duration
	SentOver1ms int
	// Stopped says Options.Stop ended the sending before every event
	// was sent.
	Stopped bool
	// Start is when the schedule started: event i was due at Start +
	// i/Rate (open loop); a preload's first send. Elapsed runs from it to
	// the last PubAck (or the give-up), Sending to the last event's first
	// send (as SendLag, the clock read just before the send).
	Start   time.Time
	Elapsed time.Duration
	Sending time.Duration
	// firstSent is when the first event's first send began (the clock
	// read just before it), from Start, as Sending is the last's:
	// SendRate's span.
	firstSent time.Duration
}

// SendRate is the rate the events went out at: the Sent-1 intervals
// between the start of the first send and the start of the last (the
// clock is read just before each is handed to the connection), over the
// time between them. In open loop that is Rate when every event went out on
// time ((Sent-1)/Rate apart; Sent over Sending overstated the rate by
// Sent/(Sent-1)), below Rate when the publisher fell behind its schedule;
// in a preload, the rate the publisher could send at (Sending also holds
// the first send, so Sent-1 over it understated a short preload's). It
// does not wait for the PubAcks and the resends after the last send, as
// Sent/Elapsed does. 0 with fewer than two sends: no interval to measure.
func (r Result) SendRate() float64 {
	span := r.Sending - r.firstSent
	if r.Sent < 2 || span <= 0 {
		return 0
	}
	return float64(r.Sent-1) / span.Seconds()
}

// The send lag histogram's range, in microseconds.
const (
	lagMinUS = 1
	lagMaxUS = int64(time.Hour / time.Microsecond)
)

// sendLag records the open loop's send lags; used only by the sending
// goroutine. record allocates nothing.
type sendLag struct {
	h       *hdrhistogram.Histogram
	max     time.Duration
	over1ms int
}

func newSendLag() *sendLag { return &sendLag{h: hdrhistogram.New(lagMinUS, lagMaxUS, 3)} }

func (l *sendLag) record(d time.Duration) {
	if d > l.max {
		l.max = d
	}
	if d > time.Millisecond {
		l.over1ms++
	}
	_ = l.h.RecordValue(min(max(d.Microseconds(), 0), lagMaxUS)) // within range: no error
}

// A PubAck that fails, or does not come within AckWait, does not mean the
// message was not stored: the publisher sends it again with the same
// Nats-Msg-Id, retryWait after the failure (nats.go waits as long before
// it resends a publish that found no stream), up to maxRetries times, and
// JetStream's duplicate window stores it at most once. The publisher
// notices an expired AckWait or a due resend within slack (it scans for
// expired publishes at most every scanEvery, and a goroutine may wake
// late), so a resend goes out at most AckWait + retryWait + slack after
// the send before it. See ResendSpan.
const (
	maxRetries = 5
	slack      = 50 * time.Millisecond
	scanEvery  = 10 * time.Millisecond
)

// publisher.unanswered keeps a bit per try in a uint8: maxRetries + 1
// tries must fit, or a try's bit would be 0 and its event never kept for
// a late PubAck (this does not compile when they do not).
var _ [8 - (maxRetries + 1)]struct{}

// retryWait is a var for tests only: one sets it long to show that a
// resend held for a reconnect goes out at the reconnect, not retryWait on.
var retryWait = 250 * time.Millisecond

// givenUpSpan is how long Publish waits, at the end, for the late PubAcks
// of the events given up (see awaitGivenUp): ResendSpan. A var for tests
// only: one makes it an hour, to show that the wait ends when the PubAck
// comes, with no timing in the test.
var givenUpSpan = ResendSpan

// sendTick is the open-loop publisher's shortest sleep.
const sendTick = time.Millisecond

// never is a time since start that does not come.
const never = time.Duration(math.MaxInt64)

// noFirst is the first send's time of an event the connection took no
// send of yet (each was refused: nothing went out), whose duplicate
// window has not started.
const noFirst = int64(math.MinInt64)

// ResendSpan is the longest time from an event's first send to its last
// resend when PubAcks do not come within ackWait (<= 0: the default 5s):
// 5 x (ackWait + 300ms), 26.5s with the default. A stream's duplicate
// window shorter than this may store a late resend a second time; one
// shorter than MinDuplicateWindow(ackWait), given as
// Options.DuplicateWindow, makes Publish give up the resends that would
// go out in its last resendMargin, or after it.
func ResendSpan(ackWait time.Duration) time.Duration {
	if ackWait <= 0 {
		ackWait = 5 * time.Second
	}
	return maxRetries * (ackWait + retryWait + slack)
}

// resendMargin is what Publish keeps of a known duplicate window for a
// resend's way to the server (nats.go's flush, the network, JetStream's
// queue): no resend goes out later than window - resendMargin(window)
// after the event's first send. (The window runs from when JetStream
// stored the first send, which is later than the publisher's clock read
// for it.) MaxAckWait leaves it out, so that with an AckWait of
// MaxAckWait(window) every resend, the last included, is due before it
// and goes out unless the machine runs the publisher that much late.
func resendMargin(window time.Duration) time.Duration { return min(window/10, time.Second) }

// MaxAckWait is the longest AckWait whose ResendSpan fits in a duplicate
// window of window less the margin Publish keeps of it for a resend's
// way to the server (a tenth, at most 1s), truncated to 10ms; 0 if none
// does: 1.5s for a 10s window. With a longer AckWait and
// Options.DuplicateWindow set, Publish gives up the last resends rather
// than send them past the window.
func MaxAckWait(window time.Duration) time.Duration {
	return max((window-resendMargin(window))/maxRetries-retryWait-slack, 0).Truncate(10 * time.Millisecond)
}

// MinDuplicateWindow is the shortest duplicate window, rounded up to
// 10ms, that covers every resend of a publish with ackWait (<= 0: the
// default 5s): ResendSpan(ackWait) and the margin Publish keeps of the
// window; the window MaxAckWait gives ackWait for (ackWait a multiple of
// 10ms). 4.45s for 500ms, 27.5s for the default.
func MinDuplicateWindow(ackWait time.Duration) time.Duration {
	span := ResendSpan(ackWait)
	// The margin is a tenth of the window under 10s, 1s from 10s on.
	w := span + time.Second
	if w < 10*time.Second {
		w = (span*10 + 8) / 9 // the least w with w - w/10 >= span
	}
	const unit = 10 * time.Millisecond
	return (w + unit - 1) / unit * unit
}

// MsgID is the Nats-Msg-Id of event seq of run.
func MsgID(run, seq uint64) string {
	return strconv.FormatUint(run, 36) + "-" + strconv.FormatUint(seq, 10)
}

// Publish publishes events and waits for every PubAck. It returns an error
// wrapping ErrInvalidOptions if o does not validate, one wrapping
// ErrNotAcked if any publish failed, and ctx's error if cancelled; the
// Result counts what happened in every case. Events JetStream already held
// (Result.Duplicate) are not an error.
//
// While nc reconnects Publish sends nothing: the next event waits for the
// reconnect (in open loop the events due meanwhile go out late, counted in
// Result.Late), and a resend due meanwhile is held without using up a try
// (see Options.DuplicateWindow), so that an outage of any length the
// connection rides out (nats.MaxReconnects) gives nothing up. With a
// connection that never closes (nats.MaxReconnects(-1)) Publish therefore
// waits through an outage as long as ctx allows: bound it with ctx (or
// Stop) if that is not what you want. Options.Progress is called about
// every 100ms with the same count while the next event waits for the
// reconnect. Once nc is closed (its reconnects ran out, or it was
// closed) Publish sends nothing more: it gives up at once every event not
// yet sent and every publish not yet acknowledged (Result.Failed), and
// returns an error wrapping ErrNotAcked and nats.ErrConnectionClosed that
// counts both. Result.Sent then counts only the events a send of which
// the connection took, not those it refused.
//
// An event given up whose PubAck comes later counts as acknowledged (or
// duplicate) after all: JetStream stored it. Once every publish is settled
// or given up, Publish therefore waits for the PubAcks still due to the
// last events given up, until ResendSpan(AckWait) (26.5s with the
// default) has passed since the last give-up: not at all when that was
// long before the end (one whose every send was answered with a failure
// has none due; the wait ends early when the last comes, the connection
// closes or ctx ends, and returns what was counted, without ctx's error:
// nothing is unsettled then). Options.Progress is called about every
// 100ms meanwhile.
func Publish(ctx context.Context, nc *nats.Conn, o Options) (Result, error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	if limit := MaxEventBytes(nc.MaxPayload()); o.EventBytes > 0 && int64(o.EventBytes) > limit {
		// Each publish would fail, and be sent again, until it gave up.
		return Result{}, fmt.Errorf("%w: EventBytes %d: with up to %d bytes of headers it does not fit the server's max_payload, %d bytes; at most %d",
			ErrInvalidOptions, o.EventBytes, headerRoom, nc.MaxPayload(), limit)
	}
	if o.Subjects < 1 {
		o.Subjects = 1
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 4096
	}
	if o.AckWait <= 0 {
		o.AckWait = 5 * time.Second
	}
	total := o.Total()
	p, err := newPublisher(ctx, nc, o)
	if err != nil {
		return Result{}, err
	}
	defer p.close()
	if o.Rate > 0 {
		p.lag = newSendLag()
	}
	if o.Started != nil {
		o.Started(p.start)
	}
	var (
		res    Result
		now    time.Duration       // since p.start, as last read
		roomAt = time.Duration(-1) // when the last wait for room under MaxPending ended
	)
	stop := o.Stop
	for i := 0; i < total; i++ {
		if err := ctx.Err(); err != nil {
			return p.result(res), err
		}
		if stopped(stop) {
			res.Stopped = true
			break
		}
		seq := o.First + uint64(i)
		var due time.Duration
		if o.Rate > 0 {
			// Open loop: event i is due at start + i/Rate, whatever
			// happened to the ones before it, as long as fewer than
			// MaxPending publishes are unsettled. The publisher sleeps
			// at least sendTick at a time and then sends everything due,
			// each event stamped with its own due time: an event goes out
			// up to sendTick late (and its latency counts that), instead
			// of a timer and a flush per event, which at 20k/s cost the
			// publisher and nats-server most of a core.
			due = time.Duration(math.Round(float64(i) * float64(time.Second) / o.Rate))
			now = time.Since(p.start)
			if due > now {
				if now, _, err = p.wait(ctx, stop, &res, now, max(due, now+sendTick), math.MaxInt, false); err != nil {
					return p.result(res), err
				}
			}
		}
		var held bool
		if now, held, err = p.wait(ctx, stop, &res, now, 0, o.MaxPending-1, true); err != nil {
			return p.result(res), err
		}
		if stopped(stop) {
			res.Stopped = true
			break
		}
		if p.closed {
			// The connection closed (wait gave up what was unsettled):
			// sent now, each event would be refused, or tried again on a
			// closed connection.
			p.unsent += total - i
			break
		}
		if held {
			roomAt = now
		}
		if o.Rate > 0 && due < roomAt {
			res.Late++
		}
		var stamp int64
		if o.Stamp {
			if o.Rate > 0 {
				stamp = p.start.Add(due).UnixNano()
			} else {
				stamp = time.Now().UnixNano()
			}
		}
		// A first send is never held; one the connection refuses (closed,
		// or dropped since wait looked: no reconnect buffer) fails, and
		// counts in Sent until abandon takes it back out.
		now, _ = p.send(ctx, seq, stamp, 1, noFirst)
		if res.Sent == 0 {
			res.firstSent = now
		}
		res.Sending = now
		if p.lag != nil {
			p.lag.record(now - due)
		}
		res.Sent++
		p.progress(now, res.Sent)
	}
	// Wait for the last PubAcks, resending what fails, until every publish
	// is acknowledged or given up.
	if _, _, err := p.wait(ctx, nil, &res, now, 0, 0, false); err != nil {
		return p.result(res), err
	}
	last := p.awaitGivenUp(ctx, &res)
	res, err = p.finish(res)
	res.Elapsed = last
	return res, err
}

// awaitGivenUp waits, once every publish is settled or given up, for the
// late PubAcks of the events last given up with a send still unanswered
// (givenUp): during the run a late PubAck counts for as long as a later
// event takes to be given up, but the last MaxPending give-ups had
// nothing after them, and Publish, returning, ended the reply
// subscription: they stayed failed though JetStream stored them, and
// `jetsink publish` failed and said to publish them again.
//
// It waits until one event's resends span (ResendSpan(AckWait): such a
// PubAck is late by about the time its event took to be given up, or
// more) has passed since the last give-up that kept an event (keptAt):
// timed from the run's end, it made a run that stalled early wait 26.5s
// at the end for events given up minutes before. It ends sooner when none
// is left (a success PubAck settled each, or a failure PubAck answered
// its last unanswered send), the connection is closed, or ctx ends (what
// is counted then stands: nothing is unsettled). Options.Progress is
// called about every 100ms meanwhile, with the same count, as during an
// outage. It returns, as time since start, when the last PubAck that
// settled or answered a kept event came: the wait's start if none did.
func (p *publisher) awaitGivenUp(ctx context.Context, res *Result) time.Duration {
	now := time.Since(p.start)
	last := now
	p.mu.Lock()
	left, end := len(p.givenUp), p.keptAt+givenUpSpan(p.o.AckWait)
	p.mu.Unlock()
	for left > 0 && now < end && !p.closed && !p.nc.IsClosed() {
		p.progress(now, res.Sent)
		d := end - now
		if p.o.Progress != nil {
			d = min(d, 100*time.Millisecond)
		}
		p.timer.Reset(d)
		select {
		case <-ctx.Done():
			p.timer.Stop()
			return last
		case <-p.wake: // onReply settled or answered one
			p.timer.Stop()
		case _, open := <-p.status: // closed: the loop sees it
			p.timer.Stop()
			if !open {
				p.status = nil
			}
		case <-p.timer.C:
		}
		now = time.Since(p.start)
		p.mu.Lock()
		if n := len(p.givenUp); n < left {
			left, last = n, now
		}
		p.mu.Unlock()
	}
	return last
}

// progress calls Options.Progress, if set, with sent when it was last
// called 100ms or more before now (time since start).
func (p *publisher) progress(now time.Duration, sent int) {
	if p.o.Progress != nil && now-p.lastProgress >= 100*time.Millisecond {
		p.o.Progress(sent)
		p.lastProgress = now
	}
}

// stopped reports whether stop is closed; a nil stop never is.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// result completes res with the counts kept by onReply and the time since
// the start.
func (p *publisher) result(res Result) Result {
	p.mu.Lock()
	res.Acked, res.Duplicate, res.Failed, res.PastWindow = p.acked, p.dups, p.gaveUp, p.pastWindow
	p.mu.Unlock()
	if p.lag != nil {
		res.SendLag, res.SendLagMax, res.SentOver1ms = p.lag.h, p.lag.max, p.lag.over1ms
	}
	res.Start = p.start
	res.Elapsed = time.Since(p.start)
	return res
}

// finish completes res once every publish is acknowledged or given up.
func (p *publisher) finish(res Result) (Result, error) {
	res = p.result(res)
	if p.o.Progress != nil {
		p.o.Progress(res.Sent)
	}
	if p.closed && (p.unsent > 0 || res.Failed > 0) {
		last := ""
		if err := p.lastErr(); err != nil {
			last = fmt.Sprintf(" (last failure: %v)", err)
		}
		return res, fmt.Errorf("%w: the NATS connection closed (%w: its reconnects ran out, or it was closed): "+
			"%d of %d events not published, %d sent and not acknowledged (stored or not)%s; "+
			"the ones not published are the last, from seq %d: publishing those with the same Run stores each once "+
			"(sending again the ones not acknowledged stores them twice if they were stored and the stream's duplicate window has passed since: "+
			"the reconnects took long)",
			ErrNotAcked, nats.ErrConnectionClosed, p.unsent, p.o.Total(), res.Failed, last, p.o.First+uint64(res.Sent))
	}
	if res.Failed > 0 {
		if res.PastWindow > 0 {
			// Name the window even when another failure came last: the
			// cause of the give-ups is not the publish's failure.
			return res, fmt.Errorf("%w: %d of %d, %d of them given up because %v (last: %v)",
				ErrNotAcked, res.Failed, res.Sent, res.PastWindow, p.errWindow, p.lastErr())
		}
		return res, fmt.Errorf("%w: %d of %d (last: %v)", ErrNotAcked, res.Failed, res.Sent, p.lastErr())
	}
	return res, nil
}

// publisher sends events with a reply subject of its own,
// <inbox>.<seq>_<try>, and reads the PubAcks on one wildcard subscription.
// It keeps what it needs to send an event again, (seq, stamp), not the
// message: an event is a function of (run, seq) and its stamp. Unlike
// nats.go's PublishAsync it allocates no future, timer or map entry with
// pointers per publish and decodes a PubAck's JSON only when it is not the
// plain success shape.
//
// Every publish not yet settled is in pending (sent, awaiting its PubAck)
// or in failed (waiting retryWait to be sent again); together they hold at
// most MaxPending, so that a resend never waits for room.
type publisher struct {
	nc      *nats.Conn
	o       Options
	start   time.Time
	prefix  string // reply subject prefix, "<inbox>."
	sub     *nats.Subscription
	status  chan nats.Status // RECONNECTING or CLOSED: the PubAcks in flight are lost; CONNECTED: back
	errLate error            // the cause of a publish failed for want of a PubAck
	// resendBy is, from an event's first send, the last moment a resend
	// of it may go out (never: Options.DuplicateWindow not known);
	// errWindow says why one after it is given up.
	resendBy  time.Duration
	errWindow error

	// Used only by the sending goroutine.
	msg        nats.Msg
	buf        []byte
	reply      []byte   // the reply subject being built
	tp         []byte   // the traceparent being built
	subjects   []string // per device, made on first use
	template   string   // "<Subject>.*", every device's subject
	sendSpan   string   // "send <template>"
	lag        *sendLag // open loop only
	timer      *time.Timer
	nextExpire time.Duration // when expireLate is next due, since start
	// lastProgress is when Options.Progress was last called, since start.
	lastProgress time.Duration
	// closed is set once the connection was found closed and what was
	// unsettled given up (abandon); unsent counts the events not
	// published then: never sent, or every send of which the connection
	// refused.
	closed bool
	unsent int
	// heldResends counts the resends in failed held for a reconnect
	// (failedPub.held): wait sends them at once when the connection is
	// back (releaseHeld).
	heldResends int

	mu      sync.Mutex
	pending map[uint64]inFlight // by seq
	failed  []failedPub         // oldest first
	// queued holds the seqs in failed, and the one resendDue took from
	// it until send puts it in pending (or it is given up or held): true
	// once a PubAck to an earlier send settled the event (it is stored).
	// resendDue and send drop it then rather than send it again, or give
	// it up past the window (keeping its room under MaxPending until it
	// was due).
	queued map[uint64]bool
	acked  int   // settled by a PubAck that stored the event (or a resend of it)
	dups   int   // settled by a duplicate PubAck to the first send
	err    error // the last failure's cause
	// gaveUp counts the events given up (Result.Failed), pastWindow those
	// of them given up for the duplicate window (Result.PastWindow): kept
	// here with acked and dups, as onReply moves an event from them to
	// those when a PubAck comes after the give-up.
	gaveUp, pastWindow int
	// givenUp holds the events given up after a send that went out,
	// true for one given up for the window, until a success PubAck to
	// one of their sends comes (JetStream stored a send whose PubAck was
	// later than AckWait): onReply then counts the event settled
	// instead, once. Such a PubAck may come as long as the reply
	// subscription lives (until Publish returns, which waits a while for
	// them: awaitGivenUp; none comes on a closed connection), so
	// givenUpRing bounds what is kept to the last MaxPending events given
	// up, as many as may be unsettled at once: a PubAck that comes more
	// give-ups than that after its event's is dropped, the event counted
	// failed. (An event is kept at least as long as a later event takes
	// to be given up: the MaxPending-th give-up after it is of an event
	// first sent after it was given up.) Only events with a send still
	// unanswered are kept, and only until a failure PubAck answers the
	// last (see unanswered): one whose every send was answered with a
	// failure has nothing more to come.
	givenUp     map[uint64]bool
	givenUpRing []uint64 // the seqs given up, oldest at givenUpNext once full
	givenUpNext int
	keptAt      time.Duration // when the last event kept in givenUp was given up, since start
	// unanswered holds, per event not settled, the sends that failed
	// without their PubAck (AckWait passed, or the connection dropped),
	// bit try-1 for its try-th send: a PubAck to one may still come, until
	// a failure PubAck to it says it will not. A send answered late with a
	// failure (a slow server, a full discard-new stream) has nothing more
	// to come either: kept as unanswered, it made Publish wait
	// ResendSpan at the end for nothing.
	unanswered map[uint64]uint8
	limit      int // wake the sender when len(pending)+len(failed) <= limit
	wake       chan struct{}
}

type inFlight struct {
	stamp int64 // the event's ts in Unix ns; 0: Base + seq ms
	sent  int64 // time since start, ns
	first int64 // the sent of the first send the connection took
	try   int   // 1 for the first send
}

type failedPub struct {
	seq   uint64
	stamp int64
	first int64 // when the connection first took a send of the event, time since start in ns; noFirst: none
	try   int   // the send that failed
	at    int64 // when it failed, time since start in ns; when it was last held
	held  bool  // a resend held while the connection reconnected (see releaseHeld)
}

// traceparentHeader is the W3C trace context header, in the lower case
// propagation.TraceContext writes.
const traceparentHeader = "traceparent"

func newPublisher(ctx context.Context, nc *nats.Conn, o Options) (*publisher, error) {
	p := &publisher{
		nc:         nc,
		o:          o,
		prefix:     nc.NewInbox() + ".",
		errLate:    fmt.Errorf("no PubAck within %v", o.AckWait),
		resendBy:   never,
		subjects:   make([]string, o.Subjects),
		template:   o.Subject + ".*",
		sendSpan:   "send " + o.Subject + ".*",
		timer:      time.NewTimer(time.Hour),
		nextExpire: never,
		pending:    make(map[uint64]inFlight, o.MaxPending),
		queued:     make(map[uint64]bool),
		givenUp:    make(map[uint64]bool),
		unanswered: make(map[uint64]uint8),
		limit:      -1,
		wake:       make(chan struct{}, 1),
		buf:        make([]byte, 0, 256),
	}
	p.timer.Stop()
	if w := o.DuplicateWindow; w > 0 {
		p.resendBy = w - resendMargin(w)
		p.errWindow = fmt.Errorf("a resend would fall outside the stream's duplicate window (%v) and could store the event twice "+
			"(none goes out later than %v after the event's first send; a longer window lets more resends through)", w, p.resendBy)
	}
	if o.Tracer == nil {
		p.msg.Header = nats.Header{jetstream.MsgIDHeader: []string{""}}
		if !o.NoTraceContext {
			p.msg.Header[traceparentHeader] = []string{""}
		}
	}
	sub, err := nc.Subscribe(p.prefix+"*", p.onReply)
	if err != nil {
		return nil, fmt.Errorf("loadgen: subscribe to PubAcks: %w", err)
	}
	// Make sure the server has the subscription before the first PubAck.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	p.sub = sub
	p.status = nc.StatusChanged(nats.RECONNECTING, nats.CLOSED, nats.CONNECTED)
	p.start = time.Now()
	return p, nil
}

func (p *publisher) close() {
	if p.status != nil {
		p.nc.RemoveStatusListener(p.status)
	}
	_ = p.sub.Unsubscribe()
}

// sendOutcome says what send did with a send.
type sendOutcome int

const (
	sendDone       sendOutcome = iota // handed to the connection (a failure of that included)
	sendPastWindow                    // a resend not sent: resendBy has passed
	sendHeld                          // a resend not sent: the connection is reconnecting
	sendSettled                       // a resend not sent: a PubAck to an earlier send settled the event
	sendClosed                        // a resend not sent: the connection is closed
	sendRefused                       // handed to the connection, which refused it: nothing went out (failed, as a lost PubAck)
)

// send publishes event seq (with ts stamp, if not 0) for the try-th time
// and records it as in flight before the PubAck can arrive. It returns
// when it sent, as time since start: the clock read after encoding and
// just before PublishMsg (one clock read per event, shared with its
// caller), so the time PublishMsg takes is not in it. first is when
// the connection first took a send of the event (time since start, ns), or
// noFirst: this send's time, if the connection takes it. A resend (try > 1)
// may not go out: see holdBack.
func (p *publisher) send(ctx context.Context, seq uint64, stamp int64, try int, first int64) (time.Duration, sendOutcome) {
	// Looked at before the encoding too: a resend held through an outage
	// comes due every retryWait, and would be encoded each time for
	// nothing (a 64 MiB event takes a while).
	if out := p.holdBack(try, first); out != sendDone {
		return 0, out
	}
	if encodeHook != nil {
		encodeHook(seq)
	}
	ev := Make(p.o.Run, seq, p.o.Subjects)
	if stamp != 0 {
		ev.TS = time.Unix(0, stamp).UTC()
	}
	p.buf = ev.AppendJSON(p.buf[:0])
	if p.o.EventBytes > 0 {
		p.buf = Pad(p.buf, p.o.EventBytes)
	}
	dev := seq % uint64(p.o.Subjects)
	if p.subjects[dev] == "" {
		p.subjects[dev] = ev.Subject(p.o.Subject)
	}
	m := &p.msg
	m.Subject = p.subjects[dev]
	p.reply = append(p.reply[:0], p.prefix...)
	p.reply = strconv.AppendUint(p.reply, seq, 10)
	p.reply = append(p.reply, '_')
	p.reply = strconv.AppendInt(p.reply, int64(try), 10)
	m.Reply = string(p.reply)
	m.Data = p.buf
	// Again after the encoding (a 64 MiB event takes a while), just
	// before the send: a publisher descheduled in between would send it
	// late, or to a connection that dropped meanwhile.
	if out := p.holdBack(try, first); out != sendDone {
		return 0, out
	}
	var span trace.Span
	if p.o.Tracer != nil {
		// A fresh header per message: one left from the last message
		// could carry its traceparent.
		m.Header = nats.Header{jetstream.MsgIDHeader: []string{MsgID(p.o.Run, seq)}}
		var sctx context.Context
		// Named after the subjects' template, not the subject: one per
		// device would give a tracing backend an operation per device.
		sctx, span = p.o.Tracer.Start(ctx, p.sendSpan, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("messaging.system", "nats"),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", m.Subject),
				attribute.String("messaging.destination.template", p.template),
				attribute.String("messaging.message.id", m.Header.Get(jetstream.MsgIDHeader))))
		telemetry.InjectTrace(sctx, m.Header)
	} else {
		m.Header[jetstream.MsgIDHeader][0] = MsgID(p.o.Run, seq)
		if !p.o.NoTraceContext {
			p.tp = appendUnsampledTraceparent(p.tp[:0])
			m.Header[traceparentHeader][0] = string(p.tp)
		}
	}
	now := time.Since(p.start)
	if d := now + p.o.AckWait; d < p.nextExpire {
		p.nextExpire = d
	}
	f := inFlight{stamp: stamp, sent: int64(now), first: first, try: try}
	if first == noFirst {
		f.first = int64(now)
	}
	p.mu.Lock()
	// A resend's seq stays in queued until here, and moves to pending
	// under the one lock: a PubAck to an earlier send finds the event in
	// one or the other, whenever it comes.
	if settled, ok := p.queued[seq]; ok {
		delete(p.queued, seq)
		if settled {
			p.mu.Unlock()
			if span != nil {
				span.End()
			}
			return now, sendSettled
		}
	}
	p.pending[seq] = f
	p.mu.Unlock()
	if err := p.nc.PublishMsg(m); err != nil {
		if errors.Is(err, nats.ErrReconnectBufExceeded) {
			// nats.go's "outbound buffer limit exceeded" says nothing
			// of the outage: the connection had no reconnect buffer.
			err = errReconnecting
		}
		p.mu.Lock()
		if _, ok := p.pending[seq]; ok { // not settled by an earlier send's PubAck meanwhile
			delete(p.pending, seq)
			// Nothing went out: the window starts at a send the
			// connection takes. (Started here, an outage longer than the
			// window gave the event up as past it, "could store the event
			// twice", though no send of it ever reached the server.)
			f.first = first
			p.failLocked(seq, f, err)
		}
		p.mu.Unlock()
		if span != nil {
			span.End()
		}
		return now, sendRefused
	}
	if span != nil {
		span.End()
	}
	return now, sendDone
}

// holdBack says whether a resend (try > 1) of an event first sent at first
// (time since start, ns; noFirst: none sent yet) must not go out now:
// sendPastWindow once resendBy has passed since then (the caller gives the
// event up), sendHeld while the connection is reconnecting (the caller
// holds it), sendClosed once it is closed (the caller gives every
// unsettled publish up: see abandon), else sendDone. While the connection
// reconnects, nats.go keeps what it is handed for the reconnect, which
// may come after the window; without a reconnect buffer it refuses it at
// once, and each resend would use up a try for as long as the outage
// lasts. (Publish holds first sends before they get to
// send: see wait.)
func (p *publisher) holdBack(try int, first int64) sendOutcome {
	switch {
	case try == 1:
		return sendDone
	case first != noFirst && time.Since(p.start)-time.Duration(first) >= p.resendBy:
		return sendPastWindow
	}
	switch p.nc.Status() {
	case nats.RECONNECTING:
		return sendHeld
	case nats.CLOSED:
		return sendClosed
	}
	return sendDone
}

// Test hooks, nil outside tests: encodeHook is called each time send
// encodes event seq; resendHook by resendDue between taking a failed
// publish of seq from failed and sending it again.
var encodeHook, resendHook func(seq uint64)

// appendUnsampledTraceparent appends a W3C traceparent with a random trace
// id and span id and the sampled flag cleared: a span context that records
// nothing, for a consumer to see the event's trace context without tracing
// it. The ids are random, not unguessable (math/rand/v2).
func appendUnsampledTraceparent(dst []byte) []byte {
	var id [24]byte // trace id (16 bytes), span id (8)
	hi, lo, span := rand.Uint64(), rand.Uint64(), rand.Uint64()
	if hi|lo == 0 {
		lo = 1 // an all-zero trace id is invalid
	}
	if span == 0 {
		span = 1 // as is an all-zero span id
	}
	binary.BigEndian.PutUint64(id[0:], hi)
	binary.BigEndian.PutUint64(id[8:], lo)
	binary.BigEndian.PutUint64(id[16:], span)
	dst = append(dst, "00-"...)
	dst = hex.AppendEncode(dst, id[:16])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, id[16:])
	return append(dst, "-00"...)
}

// onReply settles the publish its subject names.
func (p *publisher) onReply(m *nats.Msg) {
	token := m.Subject[len(p.prefix):]
	i := strings.IndexByte(token, '_')
	if i < 0 {
		return
	}
	seq, err1 := strconv.ParseUint(token[:i], 10, 64)
	try, err2 := strconv.Atoi(token[i+1:])
	if err1 != nil || err2 != nil {
		return
	}
	dup, cause := pubAck(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	if cause != nil {
		p.answeredLocked(seq, try, cause)
	}
	f, ok := p.pending[seq]
	if !ok {
		if cause != nil {
			return // settled, waiting to be sent again, or given up: a failure changes none of that
		}
		// Settled already, or failed and waiting to be sent again: a
		// success to an earlier send (its PubAck later than AckWait)
		// settles the event there too. Its resend would have found the
		// event stored, but would now be given up if it fell past the
		// duplicate window: counted failed though JetStream stored it.
		if settled, waiting := p.queued[seq]; waiting {
			if !settled {
				p.queued[seq] = true
				p.settleLocked(seq, dup, try)
			}
			return
		}
		// Given up (its tries used, or past the window), and stored all
		// the same: left failed, it made `jetsink publish` fail and say
		// to publish it again, which past the window stores it twice.
		if past, ok := p.givenUp[seq]; ok {
			delete(p.givenUp, seq) // once: a resend's duplicate PubAck may follow
			p.gaveUp--
			if past {
				p.pastWindow--
			}
			p.settleLocked(seq, dup, try)
			p.signal() // for awaitGivenUp
		}
		return
	}
	if cause != nil && f.try != try {
		return // an earlier send's failure; this send may still succeed
	}
	// A success settles the event whichever send it answers: it is stored.
	delete(p.pending, seq)
	if cause != nil {
		p.failLocked(seq, f, cause)
	} else {
		p.settleLocked(seq, dup, try)
	}
	if p.limit >= 0 && len(p.pending)+len(p.failed) <= p.limit {
		p.limit = -1
		p.signal()
	}
}

// settleLocked counts event seq settled by a successful PubAck to its
// try-th send: no other PubAck to it matters now. p.mu is held.
func (p *publisher) settleLocked(seq uint64, dup bool, try int) {
	delete(p.unanswered, seq)
	if dup && try == 1 {
		// The first send found the Nats-Msg-Id stored already: not by
		// this call. A resend's duplicate is the expected one.
		p.dups++
	} else {
		p.acked++
	}
}

// answeredLocked notes that the try-th send of seq was answered with a
// failure, cause: if it had failed without its PubAck before
// (unanswered), none comes now, and cause is the last failure's (the
// error names it rather than the PubAck's wait: a full stream says so
// late). An event given up with no send left unanswered leaves givenUp,
// and awaitGivenUp is woken: it need not wait for it. p.mu is held.
func (p *publisher) answeredLocked(seq uint64, try int, cause error) {
	b, ok := p.unanswered[seq]
	if !ok || try < 1 || try > maxRetries+1 || b&(1<<(try-1)) == 0 {
		return
	}
	p.err = cause
	if b &^= 1 << (try - 1); b != 0 {
		p.unanswered[seq] = b
		return
	}
	delete(p.unanswered, seq)
	if _, kept := p.givenUp[seq]; kept {
		delete(p.givenUp, seq)
		p.signal() // for awaitGivenUp
	}
}

// unansweredLocked marks f, a send of seq, failed without its PubAck.
// p.mu is held.
func (p *publisher) unansweredLocked(seq uint64, f inFlight) {
	p.unanswered[seq] |= 1 << (f.try - 1)
}

// signal wakes the sending goroutine if it waits, or makes its next wait
// look again.
func (p *publisher) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

var (
	pubAckOK  = []byte(`{"stream":"`)
	pubAckDup = []byte(`"duplicate"`)
)

// pubAck reports whether m is a PubAck that stored the message (nil), or
// found it stored already (dup, nil), or failed (the error). nats-server
// writes a success as {"stream":"S","seq":N,...}, with "duplicate": true
// when it was a duplicate, and a failure as {"error":{...}}; anything but
// a plain success is decoded in full.
func pubAck(m *nats.Msg) (dup bool, err error) {
	if bytes.HasPrefix(m.Data, pubAckOK) && !bytes.Contains(m.Data, pubAckDup) {
		return false, nil
	}
	if len(m.Data) == 0 {
		if st := m.Header.Get("Status"); st != "" {
			if st == "503" {
				return false, jetstream.ErrNoStreamResponse
			}
			return false, fmt.Errorf("status %s %s", st, m.Header.Get("Description"))
		}
		return false, jetstream.ErrInvalidJSAck
	}
	var r struct {
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
		Stream    string `json:"stream"`
		Duplicate bool   `json:"duplicate"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return false, fmt.Errorf("%w: %w", jetstream.ErrInvalidJSAck, err)
	}
	if r.Error != nil {
		return false, fmt.Errorf("%s (%d)", r.Error.Description, r.Error.Code)
	}
	if r.Stream == "" {
		return false, jetstream.ErrInvalidJSAck
	}
	return r.Duplicate, nil
}

// failLocked queues the failed send f of seq to be sent again, and wakes
// the sender to schedule it. p.mu is held.
func (p *publisher) failLocked(seq uint64, f inFlight, cause error) {
	p.failed = append(p.failed, failedPub{seq: seq, stamp: f.stamp, first: f.first, try: f.try, at: int64(time.Since(p.start))})
	p.queued[seq] = false
	p.err = cause
	p.signal()
}

// wait runs the publisher's upkeep (expiring publishes whose PubAck is
// later than AckWait, sending again what failed) until until has passed
// and at most limit publishes are unsettled, and, with conn, the
// connection is not reconnecting: a first send waits for the reconnect
// rather than be refused (no reconnect buffer) or kept for it (one that
// may be sent past the duplicate window), and a closed connection ends
// the wait: it gives up every unsettled publish at once (abandon), and
// the caller sends no more (p.closed). now is the time since start as the
// caller last read it. A closed stop (nil: never) ends it early, without
// an error: the caller checks stop. It returns the time since start when
// it returned, and whether it waited for the limit or the connection.
func (p *publisher) wait(ctx context.Context, stop <-chan struct{}, res *Result, now, until time.Duration, limit int, conn bool) (time.Duration, bool, error) {
	held := false
	for {
		if now >= p.nextExpire {
			p.expireLate(now)
		}
		if p.heldResends > 0 && p.nc.Status() == nats.CONNECTED {
			// Back (the CONNECTED status woke the wait): what was held
			// goes now, not when it comes due again, up to retryWait on.
			p.releaseHeld(now)
		}
		p.resendDue(ctx, res, now)
		st := p.nc.Status()
		if st == nats.CLOSED {
			// Nothing sent from now on goes out: a wait for the PubAcks
			// and tries of the unsettled, 4096 at a time, would only
			// delay the error (a 1M-event publish by ~6 minutes).
			p.abandon(res)
			return now, held, nil
		}
		p.mu.Lock()
		over := len(p.pending)+len(p.failed) > limit
		next := p.nextExpire
		if len(p.failed) > 0 {
			next = min(next, time.Duration(p.failed[0].at)+retryWait)
		}
		p.limit = -1
		if over {
			p.limit = limit
		}
		p.mu.Unlock()
		away := conn && st == nats.RECONNECTING
		if !over && !away && now >= until {
			return now, held, nil
		}
		held = held || over || away
		if away {
			// The same count: the caller's output does not freeze
			// for the outage, and it can tell that the count stalls.
			p.progress(now, res.Sent)
		}
		d := next - now
		if now < until {
			d = min(d, until-now)
		}
		if away {
			// The CONNECTED status wakes it; this bounds the wait should
			// that be missed (a full status channel drops it).
			d = min(d, retryWait)
		}
		p.timer.Reset(max(d, 0))
		select {
		case <-ctx.Done():
			p.timer.Stop()
			return now, held, ctx.Err()
		case <-stop: // the caller sees it closed and stops sending
			p.timer.Stop()
			return time.Since(p.start), held, nil
		case <-p.wake:
			p.timer.Stop()
		case st, open := <-p.status:
			p.timer.Stop()
			if st != nats.CONNECTED { // back: the loop looks at the connection again
				p.connectionLost(open)
			}
		case <-p.timer.C:
		}
		now = time.Since(p.start)
	}
}

// releaseHeld makes the resends held for a reconnect due at now, keeping
// failed oldest first (by at): resendDue sends them next.
func (p *publisher) releaseHeld(now time.Duration) {
	due := int64(now - retryWait)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.failed {
		if f := &p.failed[i]; f.held {
			f.held, f.at = false, min(f.at, due)
		}
	}
	slices.SortStableFunc(p.failed, func(a, b failedPub) int { return cmp.Compare(a.at, b.at) })
	p.heldResends = 0
}

// expireLate counts as failed the publishes sent AckWait or more before
// now, and sets when to look next: when the oldest left reaches AckWait,
// but not sooner than scanEvery (a scan reads every pending publish).
func (p *publisher) expireLate(now time.Duration) {
	cutoff := int64(now - p.o.AckWait)
	oldest := int64(math.MaxInt64)
	p.mu.Lock()
	for seq, f := range p.pending {
		switch {
		case f.sent <= cutoff:
			delete(p.pending, seq)
			p.unansweredLocked(seq, f) // its PubAck may be late only
			p.failLocked(seq, f, p.errLate)
		case f.sent < oldest:
			oldest = f.sent
		}
	}
	p.mu.Unlock()
	p.nextExpire = never
	if oldest != math.MaxInt64 {
		p.nextExpire = max(time.Duration(oldest)+p.o.AckWait, now+scanEvery)
	}
}

// resendDue sends again each failed publish whose retryWait has passed at
// now, or gives it up (see giveUpLocked) after maxRetries resends or
// once a resend would go out past the duplicate window (resendBy); it
// drops one a late PubAck settled meanwhile, and puts back one due while
// the connection is reconnecting (see send). Once the connection is closed it sends nothing: it puts the
// resend back and returns, and wait gives them all up. It does not block:
// a resend takes the room its failed send held under MaxPending.
func (p *publisher) resendDue(ctx context.Context, res *Result, now time.Duration) {
	for {
		p.mu.Lock()
		if len(p.failed) == 0 || time.Duration(p.failed[0].at)+retryWait > now {
			p.mu.Unlock()
			return
		}
		f := p.failed[0]
		p.failed = p.failed[1:]
		if f.held {
			f.held = false
			p.heldResends--
		}
		// Its seq stays in queued until send moves it to pending (or it
		// is given up or held), so that a PubAck to an earlier send that
		// comes meanwhile finds it: in neither map, the PubAck was
		// dropped, and a resend past the window gave up a stored event.
		if settled := p.queued[f.seq]; settled || f.try > maxRetries {
			delete(p.queued, f.seq)
			if !settled { // else stored: a late PubAck to an earlier send said so
				p.giveUpLocked(f.seq, false)
			}
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		if resendHook != nil {
			resendHook(f.seq)
		}
		switch _, out := p.send(ctx, f.seq, f.stamp, f.try+1, f.first); out {
		case sendPastWindow:
			p.mu.Lock()
			if !p.queued[f.seq] { // else stored, settled meanwhile
				p.giveUpLocked(f.seq, true) // past the window
			}
			delete(p.queued, f.seq)
			p.mu.Unlock()
		case sendHeld, sendClosed:
			// Not a try: looked at again retryWait on, for the window,
			// or at once when the connection is back (releaseHeld). Its
			// room under MaxPending stays taken, unless it was settled
			// meanwhile. Closed, wait gives it up with the rest.
			p.mu.Lock()
			if p.queued[f.seq] {
				delete(p.queued, f.seq)
			} else {
				f.at, f.held = int64(time.Since(p.start)), true
				p.failed = append(p.failed, f)
				p.heldResends++
			}
			p.mu.Unlock()
			if out == sendClosed {
				return
			}
		case sendSettled: // stored: dropped, as above
		case sendRefused:
			// Failed again at once, a try used; not counted in Retried,
			// which counts the resends that went out.
		default:
			res.Retried++
		}
	}
}

// giveUpLocked counts event seq given up, past the duplicate window if
// past, and, when a send of it is still unanswered (failed without its
// PubAck, and not answered with a failure since), keeps it in givenUp for
// that PubAck, which may still come. p.mu is held.
func (p *publisher) giveUpLocked(seq uint64, past bool) {
	p.gaveUp++
	if past {
		p.pastWindow++
	}
	if p.unanswered[seq] == 0 {
		// Every send refused, or answered with a failure (no stream, a
		// stream's limit): nothing more comes, and Publish need not
		// wait for it at the end (awaitGivenUp).
		return
	}
	if len(p.givenUpRing) < max(p.o.MaxPending, 1) {
		p.givenUpRing = append(p.givenUpRing, seq)
	} else {
		// Forgotten (settled since, maybe): a PubAck to it counts nothing.
		old := p.givenUpRing[p.givenUpNext]
		delete(p.givenUp, old)
		delete(p.unanswered, old)
		p.givenUpRing[p.givenUpNext] = seq
		p.givenUpNext = (p.givenUpNext + 1) % len(p.givenUpRing)
	}
	p.givenUp[seq] = past
	p.keptAt = time.Since(p.start)
}

// abandon gives up, the connection being closed, every publish not yet
// settled: one in pending, or failed after a send the connection took,
// counts failed (it went out: it may be stored, its PubAck lost);
// one every send of which the connection refused did not go out, and is
// taken back out of res.Sent into p.unsent. It sets p.closed.
func (p *publisher) abandon(res *Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Not kept for a late PubAck (giveUpLocked): none comes on a closed
	// connection.
	p.gaveUp += len(p.pending)
	clear(p.pending)
	for _, f := range p.failed {
		switch {
		case p.queued[f.seq]: // settled by a late PubAck: counted acked
		case f.first == noFirst:
			res.Sent--
			p.unsent++
		default:
			p.gaveUp++
		}
	}
	p.failed = p.failed[:0]
	p.heldResends = 0
	clear(p.queued)
	p.closed = true
}

// connectionLost fails the publishes in flight after a status change; a
// closed status channel is not one and is not read again.
func (p *publisher) connectionLost(open bool) {
	if !open {
		p.status = nil
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cause := errors.New("connection lost before the PubAck")
	for seq, f := range p.pending {
		delete(p.pending, seq)
		p.unansweredLocked(seq, f) // lost, or sent after the reconnect (a cluster's other server)
		p.failLocked(seq, f, cause)
	}
}

func (p *publisher) lastErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

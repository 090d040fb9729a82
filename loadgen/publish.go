package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetsink/jetsink/telemetry"
)

// ErrNotAcked is returned when JetStream did not acknowledge every publish.
var ErrNotAcked = errors.New("publishes not acknowledged by JetStream")

// Options says what to publish.
type Options struct {
	Subject  string        // subject prefix; events go to <Subject>.<device>
	Subjects int           // number of distinct devices (subjects), >= 1
	Events   int           // publish this many (preload), or
	Rate     float64       // events per second, open loop, for
	Duration time.Duration // this long (Rate and Duration go together)
	Run      uint64        // run id: makes ids and Nats-Msg-Ids unique per run
	First    uint64        // first sequence number (default 0)
	// MaxPending bounds async publishes awaiting their PubAck (default 4096).
	MaxPending int
	// AckWait is how long a publish may wait for its PubAck before it counts
	// as failed and is sent again (default 5s). A resend is stored once only
	// within the stream's duplicate window, which must cover up to 5 x
	// (AckWait + 250ms) after the first send.
	AckWait time.Duration
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
	// is its child. nil: no spans, no trace headers.
	Tracer trace.Tracer
}

// Result counts what happened.
type Result struct {
	Sent    int
	Acked   int
	Failed  int // not acknowledged after every retry
	Retried int // publishes sent again after a failed or timed-out PubAck
	Elapsed time.Duration
}

// A PubAck that fails, or does not come within AckWait, does not mean the
// message was not stored: the publisher sends it again with the same
// Nats-Msg-Id, retryWait after the failure (nats.go waits as long before
// it resends a publish that found no stream), up to maxRetries times, and
// JetStream's duplicate window stores it at most once. So the window must
// cover maxRetries x (AckWait + retryWait) from the first send: 26 s with
// the default AckWait.
const (
	maxRetries = 5
	retryWait  = 250 * time.Millisecond
)

// checkEvery is how often the publisher looks for publishes to expire or
// to send again.
const checkEvery = 50 * time.Millisecond

// sendTick is the open-loop publisher's shortest sleep.
const sendTick = time.Millisecond

// MsgID is the Nats-Msg-Id of event seq of run.
func MsgID(run, seq uint64) string {
	return strconv.FormatUint(run, 36) + "-" + strconv.FormatUint(seq, 10)
}

// Publish publishes events and waits for every PubAck. It returns an error
// wrapping ErrNotAcked if any publish failed, and ctx's error if cancelled.
func Publish(ctx context.Context, nc *nats.Conn, o Options) (Result, error) {
	if o.Subject == "" {
		return Result{}, errors.New("loadgen: Subject is required")
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
	total := o.Events
	var interval time.Duration
	if o.Rate > 0 {
		if o.Duration <= 0 {
			return Result{}, errors.New("loadgen: Rate needs Duration")
		}
		total = int(o.Rate * o.Duration.Seconds())
		interval = time.Duration(float64(time.Second) / o.Rate)
	}
	p, err := newPublisher(ctx, nc, o)
	if err != nil {
		return Result{}, err
	}
	defer p.close()
	var lastProgress time.Duration // since p.start
	var res Result
	for i := 0; i < total; i++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		seq := o.First + uint64(i)
		due := p.start.Add(time.Duration(i) * interval)
		if interval > 0 {
			// Open loop: event i is due at start + i*interval, whatever
			// happened to the ones before it. The publisher sleeps at
			// least sendTick at a time and then sends everything due,
			// each event stamped with its own due time: an event goes out
			// up to sendTick late (and its latency counts that), instead
			// of a timer and a flush per event, which at 20k/s cost the
			// publisher and nats-server most of a core.
			if wait := time.Until(due); wait > 0 {
				if err := p.sleep(ctx, max(wait, sendTick)); err != nil {
					return res, err
				}
			}
		}
		if err := p.waitPending(ctx, o.MaxPending-1, 0); err != nil {
			return res, err
		}
		var stamp int64
		if o.Stamp {
			if interval == 0 {
				due = time.Now()
			}
			stamp = due.UnixNano()
		}
		now := p.send(ctx, seq, stamp, 1)
		res.Sent++
		if err := p.maintain(ctx, &res, now); err != nil {
			return res, err
		}
		if o.Progress != nil && now-lastProgress >= 100*time.Millisecond {
			o.Progress(res.Sent)
			lastProgress = now
		}
	}
	// Wait for the last PubAcks, resending what fails, until every publish
	// is acknowledged or given up.
	for {
		if err := p.resendDue(ctx, &res); err != nil {
			return res, err
		}
		p.mu.Lock()
		pending, failed := len(p.pending), len(p.failed)
		p.mu.Unlock()
		var err error
		switch {
		case pending == 0 && failed == 0:
			return p.finish(res)
		case pending == 0:
			// Only resends waiting for their retryWait: waitPending
			// would return at once.
			err = p.sleep(ctx, checkEvery)
		default:
			err = p.waitPending(ctx, 0, checkEvery)
		}
		if err != nil {
			return res, err
		}
	}
}

// finish completes res once every publish is acknowledged or given up.
func (p *publisher) finish(res Result) (Result, error) {
	res.Elapsed = time.Since(p.start)
	res.Acked = res.Sent - res.Failed
	if p.o.Progress != nil {
		p.o.Progress(res.Sent)
	}
	if res.Failed > 0 {
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
type publisher struct {
	nc     *nats.Conn
	o      Options
	start  time.Time
	prefix string // reply subject prefix, "<inbox>."
	sub    *nats.Subscription
	status chan nats.Status // RECONNECTING or CLOSED: the PubAcks in flight are lost

	// Used only by the sending goroutine.
	msg        nats.Msg
	buf        []byte
	reply      []byte   // the reply subject being built
	subjects   []string // per device, made on first use
	timer      *time.Timer
	nextCheck  time.Duration
	nextExpire time.Duration

	mu      sync.Mutex
	pending map[uint64]inFlight // by seq
	failed  []failedPub         // oldest first
	err     error               // the last failure's cause
	limit   int                 // wake the sender when len(pending) <= limit
	wake    chan struct{}
}

type inFlight struct {
	stamp int64 // the event's ts in Unix ns; 0: Base + seq ms
	sent  int64 // time since start, ns
	try   int   // 1 for the first send
}

type failedPub struct {
	seq   uint64
	stamp int64
	try   int   // the send that failed
	at    int64 // when it failed, time since start in ns
}

func newPublisher(ctx context.Context, nc *nats.Conn, o Options) (*publisher, error) {
	p := &publisher{
		nc:       nc,
		o:        o,
		prefix:   nc.NewInbox() + ".",
		subjects: make([]string, o.Subjects),
		timer:    time.NewTimer(time.Hour),
		pending:  make(map[uint64]inFlight, o.MaxPending),
		limit:    -1,
		wake:     make(chan struct{}, 1),
		buf:      make([]byte, 0, 256),
	}
	p.timer.Stop()
	if o.Tracer == nil {
		p.msg.Header = nats.Header{jetstream.MsgIDHeader: []string{""}}
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
	p.status = nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	p.start = time.Now()
	p.nextExpire = o.AckWait / 4
	return p, nil
}

func (p *publisher) close() {
	if p.status != nil {
		p.nc.RemoveStatusListener(p.status)
	}
	_ = p.sub.Unsubscribe()
}

// send publishes event seq (with ts stamp, if not 0) for the try-th time
// and records it as in flight before the PubAck can arrive. It returns
// when it sent, as time since start (one clock read per event, shared
// with its caller).
func (p *publisher) send(ctx context.Context, seq uint64, stamp int64, try int) time.Duration {
	ev := Make(p.o.Run, seq, p.o.Subjects)
	if stamp != 0 {
		ev.TS = time.Unix(0, stamp).UTC()
	}
	p.buf = ev.AppendJSON(p.buf[:0])
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
	var span trace.Span
	if p.o.Tracer != nil {
		// A fresh header per message: one left from the last message
		// could carry its traceparent.
		m.Header = nats.Header{jetstream.MsgIDHeader: []string{MsgID(p.o.Run, seq)}}
		var sctx context.Context
		sctx, span = p.o.Tracer.Start(ctx, "send "+m.Subject, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("messaging.system", "nats"),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", m.Subject),
				attribute.String("messaging.message.id", m.Header.Get(jetstream.MsgIDHeader))))
		telemetry.InjectTrace(sctx, m.Header)
	} else {
		m.Header[jetstream.MsgIDHeader][0] = MsgID(p.o.Run, seq)
	}
	now := time.Since(p.start)
	f := inFlight{stamp: stamp, sent: int64(now), try: try}
	p.mu.Lock()
	p.pending[seq] = f
	p.mu.Unlock()
	if err := p.nc.PublishMsg(m); err != nil {
		p.mu.Lock()
		if _, ok := p.pending[seq]; ok { // not settled by an earlier send's PubAck meanwhile
			delete(p.pending, seq)
			p.failLocked(seq, f, err)
		}
		p.mu.Unlock()
	}
	if span != nil {
		span.End()
	}
	return now
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
	cause := pubAckError(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	f, ok := p.pending[seq]
	if !ok {
		return // settled already, or failed and waiting to be sent again
	}
	if cause != nil && f.try != try {
		return // an earlier send's failure; this send may still succeed
	}
	// A success settles the event whichever send it answers: it is stored.
	delete(p.pending, seq)
	if cause != nil {
		p.failLocked(seq, f, cause)
	}
	if len(p.pending) <= p.limit {
		p.limit = -1
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

var pubAckOK = []byte(`{"stream":"`)

// pubAckError is nil if m is a PubAck that stored (or de-duplicated) the
// message. nats-server writes a success as {"stream":"S","seq":N,...} and
// a failure as {"error":{...}}; anything else is decoded in full.
func pubAckError(m *nats.Msg) error {
	if bytes.HasPrefix(m.Data, pubAckOK) {
		return nil
	}
	if len(m.Data) == 0 {
		if st := m.Header.Get("Status"); st != "" {
			if st == "503" {
				return jetstream.ErrNoStreamResponse
			}
			return fmt.Errorf("status %s %s", st, m.Header.Get("Description"))
		}
		return jetstream.ErrInvalidJSAck
	}
	var r struct {
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
		Stream string `json:"stream"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return fmt.Errorf("%w: %v", jetstream.ErrInvalidJSAck, err)
	}
	if r.Error != nil {
		return fmt.Errorf("%s (%d)", r.Error.Description, r.Error.Code)
	}
	if r.Stream == "" {
		return jetstream.ErrInvalidJSAck
	}
	return nil
}

// failLocked queues the failed send f of seq to be sent again. p.mu is held.
func (p *publisher) failLocked(seq uint64, f inFlight, cause error) {
	p.failed = append(p.failed, failedPub{seq: seq, stamp: f.stamp, try: f.try, at: int64(time.Since(p.start))})
	p.err = cause
}

// maintain runs between sends, every checkEvery: it expires publishes
// whose PubAck is later than AckWait and sends again what failed. now is
// the time since start.
func (p *publisher) maintain(ctx context.Context, res *Result, now time.Duration) error {
	if now < p.nextCheck {
		return nil
	}
	p.nextCheck = now + checkEvery
	p.expireLate(now)
	return p.resendDue(ctx, res)
}

// expireLate counts as failed the publishes sent more than AckWait before
// now, at most once every AckWait/4.
func (p *publisher) expireLate(now time.Duration) {
	if now < p.nextExpire {
		return
	}
	p.nextExpire = now + p.o.AckWait/4
	p.expire(int64(now-p.o.AckWait), fmt.Errorf("no PubAck within %v", p.o.AckWait))
}

// resendDue sends again each failed publish whose retryWait has passed, or
// gives it up (counting it in res.Failed) after maxRetries resends.
func (p *publisher) resendDue(ctx context.Context, res *Result) error {
	now := int64(time.Since(p.start))
	p.mu.Lock()
	var due []failedPub
	keep := p.failed[:0]
	for _, f := range p.failed {
		if now-f.at >= int64(retryWait) {
			due = append(due, f)
		} else {
			keep = append(keep, f)
		}
	}
	p.failed = keep
	p.mu.Unlock()
	for _, f := range due {
		if f.try > maxRetries {
			res.Failed++
			continue
		}
		if err := p.waitPending(ctx, p.o.MaxPending-1, 0); err != nil {
			return err
		}
		p.send(ctx, f.seq, f.stamp, f.try+1)
		res.Retried++
	}
	return nil
}

// waitPending returns once at most n publishes await their PubAck, or after
// maxWait (0: no limit). While it waits, publishes whose PubAck is later
// than AckWait, or was lost with a reconnect, count as failed.
func (p *publisher) waitPending(ctx context.Context, n int, maxWait time.Duration) error {
	var deadline time.Duration
	if maxWait > 0 {
		deadline = time.Since(p.start) + maxWait
	}
	for {
		p.mu.Lock()
		if len(p.pending) <= n {
			p.mu.Unlock()
			return nil
		}
		p.limit = n
		p.mu.Unlock()
		now := time.Since(p.start)
		if deadline > 0 && now >= deadline {
			return nil
		}
		d := max(p.nextExpire-now, time.Millisecond)
		if deadline > 0 {
			d = min(d, deadline-now)
		}
		p.timer.Reset(d)
		select {
		case <-ctx.Done():
			p.timer.Stop()
			return ctx.Err()
		case <-p.wake:
			p.timer.Stop()
		case _, open := <-p.status:
			p.timer.Stop()
			p.connectionLost(open)
		case <-p.timer.C:
			p.expireLate(time.Since(p.start))
		}
	}
}

// sleep waits d, or until ctx is done. A reconnect meanwhile fails the
// publishes in flight.
func (p *publisher) sleep(ctx context.Context, d time.Duration) error {
	p.timer.Reset(d)
	for {
		select {
		case <-ctx.Done():
			p.timer.Stop()
			return ctx.Err()
		case _, open := <-p.status:
			p.connectionLost(open)
		case <-p.timer.C:
			return nil
		}
	}
}

// connectionLost fails the publishes in flight after a status change; a
// closed status channel is not one and is not read again.
func (p *publisher) connectionLost(open bool) {
	if !open {
		p.status = nil
		return
	}
	p.expire(math.MaxInt64, errors.New("connection lost before the PubAck"))
}

// expire counts as failed every publish sent before the given time since
// start.
func (p *publisher) expire(before int64, cause error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for seq, f := range p.pending {
		if f.sent < before {
			delete(p.pending, seq)
			p.failLocked(seq, f, cause)
		}
	}
}

func (p *publisher) lastErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

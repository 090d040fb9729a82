package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// maxRetries bounds how often a publish whose PubAck failed is sent again.
const maxRetries = 5

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
	total := o.Events
	var interval time.Duration
	if o.Rate > 0 {
		if o.Duration <= 0 {
			return Result{}, errors.New("loadgen: Rate needs Duration")
		}
		total = int(o.Rate * o.Duration.Seconds())
		interval = time.Duration(float64(time.Second) / o.Rate)
	}
	var (
		mu     sync.Mutex
		failed []*nats.Msg // awaiting a retry
	)
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(o.MaxPending),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, _ error) {
			mu.Lock()
			failed = append(failed, m)
			mu.Unlock()
		}))
	if err != nil {
		return Result{}, fmt.Errorf("loadgen: %w", err)
	}
	start := time.Now()
	lastProgress := start
	buf := make([]byte, 0, 256)
	var res Result
	for i := 0; i < total; i++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		seq := o.First + uint64(i)
		due := start.Add(time.Duration(i) * interval)
		if interval > 0 {
			// Open loop: event i is due at start + i*interval, whatever
			// happened to the ones before it. The publisher sleeps at
			// least sendTick at a time and then sends everything due,
			// each event stamped with its own due time: an event goes out
			// up to sendTick late (and its latency counts that), instead
			// of a timer and a flush per event, which at 20k/s cost the
			// publisher and nats-server most of a core.
			if wait := time.Until(due); wait > 0 {
				t := time.NewTimer(max(wait, sendTick))
				select {
				case <-ctx.Done():
					t.Stop()
					return res, ctx.Err()
				case <-t.C:
				}
			}
		}
		ev := Make(o.Run, seq, o.Subjects)
		if o.Stamp {
			if interval == 0 {
				due = time.Now()
			}
			ev.TS = due.UTC()
		}
		buf = ev.AppendJSON(buf[:0])
		msg := &nats.Msg{
			Subject: ev.Subject(o.Subject),
			Data:    append([]byte(nil), buf...),
			Header:  nats.Header{jetstream.MsgIDHeader: []string{MsgID(o.Run, seq)}},
		}
		var span trace.Span
		if o.Tracer != nil {
			var sctx context.Context
			sctx, span = o.Tracer.Start(ctx, "send "+msg.Subject, trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithAttributes(attribute.String("messaging.system", "nats"),
					attribute.String("messaging.operation.type", "send"),
					attribute.String("messaging.destination.name", msg.Subject),
					attribute.String("messaging.message.id", msg.Header.Get(jetstream.MsgIDHeader))))
			telemetry.InjectTrace(sctx, msg.Header)
		}
		if _, err := js.PublishMsgAsync(msg); err != nil {
			mu.Lock()
			failed = append(failed, msg)
			mu.Unlock()
		}
		if span != nil {
			span.End()
		}
		res.Sent++
		if o.Progress != nil && time.Since(lastProgress) >= 100*time.Millisecond {
			o.Progress(res.Sent)
			lastProgress = time.Now()
		}
	}
	// A PubAck that times out on a busy server does not mean the message was
	// not stored: publish it again with the same Nats-Msg-Id, and JetStream's
	// duplicate window stores it at most once.
	for attempt := 0; ; attempt++ {
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return res, ctx.Err()
		}
		mu.Lock()
		retry := failed
		failed = nil
		mu.Unlock()
		if len(retry) == 0 || attempt == maxRetries {
			res.Failed = len(retry)
			break
		}
		res.Retried += len(retry)
		for _, m := range retry {
			if _, err := js.PublishMsgAsync(m); err != nil {
				mu.Lock()
				failed = append(failed, m)
				mu.Unlock()
			}
		}
	}
	res.Elapsed = time.Since(start)
	res.Acked = res.Sent - res.Failed
	if o.Progress != nil {
		o.Progress(res.Sent)
	}
	if res.Failed > 0 {
		return res, fmt.Errorf("%w: %d of %d", ErrNotAcked, res.Failed, res.Sent)
	}
	return res, nil
}

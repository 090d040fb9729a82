package pipeline

import (
	"context"
	"fmt"
	"iter"
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Msg is the handle of one JetStream message as the later stages need it:
// settle it once its fate is known. jetstream.Msg satisfies it, so neither
// pipeline nor sink imports NATS.
type Msg interface {
	Ack() error
	Nak() error
	NakWithDelay(delay time.Duration) error
	InProgress() error
	Term() error
	TermWithReason(reason string) error
}

// Event is one message as the consumer received it. It travels by value
// through ring #1; Data and Header alias the message's own buffers and must
// not be modified.
type Event struct {
	Msg         Msg
	Subject     string
	Data        []byte
	Header      map[string][]string // nats.Header's underlying type; nil when Msg is a RawHeader: use HeaderLookup
	Stream      string
	StreamSeq   uint64
	ConsumerSeq uint64
	// Delivered is the delivery count, 1 on first delivery (at most
	// MaxUint32). It is 32 bits so that it and Exhausted share one word:
	// Event stays 192 bytes, three cache lines, as it crosses the rings.
	Delivered uint32
	// Exhausted: the consumer took the message past nats.max_deliver
	// (Delivered is above it). It is not decoded: the worker dead-letters
	// it (MaxDeliverDeadLetter). JetStream, whose MaxDeliver for jetsink's
	// consumer is unlimited, delivers it again until that is done.
	Exhausted bool
	Published time.Time // JetStream's store time
	// Received is when the consumer took it: with the wire pull client,
	// the wall-clock time of the socket read that completed the message
	// (one clock reading per read), without a monotonic reading; with
	// nats.go's, time.Now() in the consumer.
	Received time.Time
	MsgID    string // Nats-Msg-Id header, "" when absent
	// Epoch is the consumer's epoch for the message (see Epochs): settle
	// it (ack, term) only while Epochs.Hold returns the same.
	Epoch uint64
	// Span is the message's CONSUMER span ("process <subject pattern>":
	// see telemetry.Tracing.SetDestinations), nil when tracing is off or
	// the message is not sampled, so checking it for nil is all an
	// unsampled event costs. The consumer starts it on receipt
	// (parented on the publisher's traceparent); whoever settles the
	// message ends it (telemetry.EndMessage): the sink after the ack, the
	// dead-letterer, or the consumer when it naks. Its SpanContext is what
	// the sink's "copy <table>" batch span links to.
	Span trace.Span
}

// RawHeader is implemented by a Msg that keeps its message's header block
// as received instead of decoding it into a map (consumer/wire's Msg):
// the consumer leaves Event.Header nil for such a message, and
// HeaderLookup and HeaderFields read the headers through the Msg. That saves decoding
// every message's headers when most events need one of them at most.
type RawHeader interface {
	// HeaderLookup returns the first value of key, matched exactly, and
	// whether the field is there.
	HeaderLookup(key string) (string, bool)
	// HeaderGet is HeaderLookup's value; HeaderFold is the first value
	// matched exactly, or else the first matched ignoring case. Neither
	// allocates.
	HeaderGet(key string) string
	HeaderFold(key string) string
	// HeaderFields yields every field, in the order sent.
	HeaderFields() iter.Seq2[string, string]
}

// HeaderLookup returns the first value of header key, matched exactly (as
// a lookup in Header is), and whether the field is there.
func (ev *Event) HeaderLookup(key string) (string, bool) {
	if ev.Header != nil {
		if v := ev.Header[key]; len(v) > 0 {
			return v[0], true
		}
		return "", false
	}
	if rh, ok := ev.Msg.(RawHeader); ok {
		return rh.HeaderLookup(key)
	}
	return "", false
}

// HeaderFields yields every header field of the event, once per value.
func (ev *Event) HeaderFields() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		if ev.Header == nil {
			if rh, ok := ev.Msg.(RawHeader); ok {
				for k, v := range rh.HeaderFields() {
					if !yield(k, v) {
						return
					}
				}
			}
			return
		}
		for k, vs := range ev.Header {
			for _, v := range vs {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

// DeliveryCount is n as Event.Delivered holds it: at most MaxUint32.
func DeliveryCount(n uint64) uint32 {
	return uint32(min(n, math.MaxUint32))
}

// Releaser is implemented by a Msg that holds bytes of the consumer's
// in-flight budget until its final settlement (consumer/wire's Msg):
// Release gives them back early, for a message whose life ends without
// one. It is safe to call more than once.
type Releaser interface{ Release() }

// Release gives back what m holds of the in-flight budget, if anything
// (see Releaser).
func Release(m Msg) {
	if r, ok := m.(Releaser); ok {
		r.Release()
	}
}

// End ends ev's life in the process: it gives back what its message holds
// of the in-flight budget (Release; a final settlement has done it
// already, but a message not settled, its stream replaced, holds it until
// now) and ends its span (EndSpan). Whoever decides an event's fate calls
// it once, after settling it: the sink after the ack, the dead-letterer,
// the consumer when it naks.
func (ev *Event) End(outcome string, err error) {
	Release(ev.Msg)
	ev.EndSpan(outcome, err)
}

// EndSpan ends ev's span, if it has one, with how the message was settled:
// outcome is "ack", "dead_letter", "nak", "stale" (not acked: its
// stream was re-created since it was taken), "given_up" (not acked:
// refused at the end of a drain with nothing left to commit to tell why;
// JetStream delivers it again) or "released" (nak'ed with a short delay:
// given back, PostgreSQL unreachable, for another instance to store; a
// non-nil err is the nak's, and JetStream delivers it after ack_wait) or
// "abandoned" (left unsettled in a batch at a hard stop; delivered again
// after ack_wait), as
// the attribute jetsink.settle unless it is "ack"; a non-nil err marks the
// span failed. Without a span it is a nil check.
func (ev *Event) EndSpan(outcome string, err error) {
	sp := ev.Span
	if sp == nil {
		return
	}
	if outcome != "ack" { // ack is the rule; say only the exceptions
		sp.SetAttributes(attribute.String("jetsink.settle", outcome))
	}
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// Row is one decoded event on its way to the sink: the event it came from
// (kept to settle it and, if the database refuses the row, to dead-letter it)
// and the row's fields in PostgreSQL's binary COPY tuple format.
type Row struct {
	Event Event
	// Tuple is a complete binary COPY tuple: int16 field count, then per
	// field an int32 length (-1 for NULL) and that many bytes. The sink
	// writes it verbatim between the COPY header and trailer. A worker's
	// tuples share blocks that are written again once the worker has moved
	// on from one and ReleaseRows has given back every row carved from it;
	// ReleaseRows sets the Tuple of the rows it is given to nil (a copy of
	// a row keeps its own, which must not be read after that).
	Tuple []byte

	slab *slab  // the block Tuple was carved from; nil if it has its own
	gen  uint16 // slab's generation when Tuple was carved
}

// Stage names the stage that gave up on an event, for dead-letter headers.
const (
	StageDecode = "decode"
	StageSink   = "sink"
	// StageDeliver: no stage gave up on the event, its deliveries ran out
	// (nats.max_deliver) before any of them was stored.
	StageDeliver = "deliver"
)

// CodeMaxDeliver is the DeadLetter.Code of an event dead-lettered with
// StageDeliver.
const CodeMaxDeliver = "max_deliver"

// MaxDeliverDeadLetter is the dead letter of an event that was delivered
// (the count) times without being stored: taken past nats.max_deliver
// (Event.Exhausted).
func MaxDeliverDeadLetter(delivered uint64) DeadLetter {
	return DeadLetter{Stage: StageDeliver, Code: CodeMaxDeliver,
		Reason: fmt.Sprintf("delivered %d times without being stored (nats.max_deliver)", delivered)}
}

// DeadLetter says why an event could not be stored.
type DeadLetter struct {
	Stage    string // StageDecode, StageSink or StageDeliver
	Reason   string // human-readable error text
	Code     string // short machine-readable reason (e.g. "invalid_json", "required_missing", "too_large")
	SQLState string // PostgreSQL SQLSTATE when the database refused the row
}

// DeadLetterer parks an event that can never be stored on the dead-letter
// subject and settles the original. Implementations publish first, wait for
// the server's acknowledgement, and only then terminate the original; if the
// publish fails they must not ack or terminate it (nak it with a delay
// instead, unless its epoch is stale: then they leave it and the error
// wraps ErrStaleEpoch) and return the error. Either way the event's life in
// the process ends: they give back its hold on the in-flight budget
// (Release), also when they leave it. The consumer package implements it.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, ev *Event, dl DeadLetter) error
}

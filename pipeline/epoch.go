package pipeline

import (
	"errors"
	"sync"
	"sync/atomic"
)

// ErrStaleEpoch is wrapped by a settlement that was skipped because the
// event's stream was re-created since the event was taken (see Epochs).
var ErrStaleEpoch = errors.New("its stream was re-created since the message was taken")

// ErrDeadLetterHeldBack is wrapped by a DeadLetter call whose failure the
// dead-letterer logs itself, boundedly: it published nothing because the
// breaker is open (an earlier publish got no answer, or was refused for
// want of permission or room, and no probe has been stored since), or its
// publish was refused for want of room. The message is nak'ed as after any
// failed dead letter. Callers count it but do not log each one, which
// while a run of poison events meets a hung or full dead-letter stream
// would be a line per event.
var ErrDeadLetterHeldBack = errors.New("not published: the dead-letter breaker is open (an earlier publish got no answer or was refused), and no probe has been stored since")

// FailedDeadLetter names what became of a message whose DeadLetter call
// failed with err: "nak" (nak'ed, it comes back), or "stale" when the
// error wraps ErrStaleEpoch (not nak'ed: a nak would land on the new
// stream's event with the same sequence; the dead-letterer tried until the
// hard stop, or gave up at once on a letter over the server's max_payload,
// and logged giving it up at Error, as nothing delivers it again). It is
// the outcome for Event.EndSpan. "nak" also covers the rare failures that nak nothing (the
// nak itself failed, or the event had no message handle): such a message
// comes back after ack_wait instead.
func FailedDeadLetter(err error) string {
	if errors.Is(err, ErrStaleEpoch) {
		return "stale"
	}
	return "nak"
}

// Epochs numbers the streams the consumer has taken events from, so that
// an event of a stream that was deleted and re-created under it is never
// acked or terminated: JetStream matches an ack to a message by stream
// sequence alone, and a re-created stream starts its sequence again at 1,
// so a late ack of an old event would settle the new event with the same
// sequence, and a crash before that event's row commits would lose it.
//
// The consumer stamps each event with an epoch (Event.Epoch): Current as
// its pull session began, or the one it started in that session. It calls
// Advance when it finds the stream replaced, before it takes events from
// the new one where it can; events a session takes after that keep the
// session's older epoch. Whoever settles events (the sink's acks and
// InProgress, the dead-letter path's terms and naks, the consumer's naks)
// brackets the settling with Hold and Release (IfCurrent, for one event)
// and skips the events whose epoch is not the one Hold returned: JetStream redelivers
// them if their stream still exists, so that costs a duplicate row at
// worst. Advance waits for every Hold to be released, so once it returns
// no settling of an older epoch starts; the consumer then flushes the
// acks sent so far to the server before it pulls from the new stream.
//
// A nil *Epochs is valid: its epoch is always 0 and nothing is skipped.
// All methods are safe from any goroutine.
type Epochs struct {
	mu  sync.RWMutex
	cur atomic.Uint64
}

// Current returns the epoch to stamp on an event taken now.
func (e *Epochs) Current() uint64 {
	if e == nil {
		return 0
	}
	return e.cur.Load()
}

// Hold blocks Advance until Release and returns the current epoch. Events
// of any other epoch must not be acked or terminated before Release.
func (e *Epochs) Hold() uint64 {
	if e == nil {
		return 0
	}
	e.mu.RLock()
	return e.cur.Load()
}

// Release ends a Hold.
func (e *Epochs) Release() {
	if e != nil {
		e.mu.RUnlock()
	}
}

// IfCurrent calls settle, under a Hold, if epoch is the current one, and
// reports whether it did: the way to ack, nak, terminate or renew one
// event of that epoch.
func (e *Epochs) IfCurrent(epoch uint64, settle func()) bool {
	if e.Hold() != epoch {
		e.Release()
		return false
	}
	defer e.Release()
	settle()
	return true
}

// Advance starts a new epoch, after every Hold in progress is released,
// and returns it (a nil *Epochs stays at 0).
func (e *Epochs) Advance() uint64 {
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur.Add(1)
}

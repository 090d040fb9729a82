package pipeline

import (
	"context"
	"fmt"
	"sync"
)

// causesKept bounds how many failed dead letters Causes remembers: each is
// an event nak'ed while its dead letter could not be stored, and at most
// max_ack_pending (10,000 when derived) can be in flight. The oldest are
// forgotten first; such an event's letter then says max_deliver, as before.
const causesKept = 4096

// Causes is a DeadLetterer in front of Next that keeps the dead letter of
// an event whose dead letter failed (Next returned an error and nak'ed the
// event), so that, if the event's deliveries run out before a letter of it
// is stored (a dead-letter stream away for minutes), the letter stored at
// last gives that cause (its stage, code, SQLSTATE and reason, with the
// deliveries added to the reason) instead of StageDeliver's max_deliver:
// `jetsink dlq replay --code invalid_json` finds it, and the reason says
// what was wrong. It remembers for this process only, and at most
// causesKept events. Safe for concurrent use.
type Causes struct {
	Next DeadLetterer

	mu    sync.Mutex
	kept  map[causeKey]DeadLetter
	order []causeKey // oldest first; may hold keys forgotten since
}

// causeKey is an event: its stream's epoch, name and sequence (a stream
// re-created under jetsink numbers its events from 1 again).
type causeKey struct {
	epoch  uint64
	stream string
	seq    uint64
}

// DeadLetter hands dl to Next; for a letter of StageDeliver, the cause of
// the event's failed letter before it, if one is kept.
func (c *Causes) DeadLetter(ctx context.Context, ev *Event, dl DeadLetter) error {
	k := causeKey{ev.Epoch, ev.Stream, ev.StreamSeq}
	cause := dl
	if dl.Stage == StageDeliver {
		if kept, ok := c.lookup(k); ok {
			cause, dl = kept, kept
			dl.Reason = fmt.Sprintf("%s (delivered %d times, past nats.max_deliver: its dead letters failed before)", kept.Reason, ev.Delivered)
		}
	}
	err := c.Next.DeadLetter(ctx, ev, dl)
	switch {
	case err == nil:
		c.forget(k)
	case cause.Stage != StageDeliver && FailedDeadLetter(err) == "nak":
		c.keep(k, cause)
	}
	return err
}

func (c *Causes) lookup(k causeKey) (DeadLetter, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dl, ok := c.kept[k]
	return dl, ok
}

func (c *Causes) keep(k causeKey, dl DeadLetter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kept == nil {
		c.kept = make(map[causeKey]DeadLetter)
	}
	if _, ok := c.kept[k]; !ok {
		c.order = append(c.order, k)
	}
	c.kept[k] = dl
	for len(c.kept) > causesKept {
		delete(c.kept, c.order[0])
		c.order = c.order[1:]
	}
	if len(c.order) > 2*causesKept {
		// Keys forgotten since they were kept: drop them from the order.
		live := c.order[:0]
		for _, o := range c.order {
			if _, ok := c.kept[o]; ok {
				live = append(live, o)
			}
		}
		clear(c.order[len(live):])
		c.order = live
	}
}

func (c *Causes) forget(k causeKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.kept, k)
}

package pipeline

import (
	"context"
	"fmt"
	"sync"
	"unicode/utf8"
)

// causesKept bounds how many failed dead letters Causes remembers: each is
// an event nak'ed while its dead letter could not be stored, and at most
// max_ack_pending (10,000 when derived) can be in flight. The oldest are
// forgotten first; such an event's letter then says max_deliver, as before.
const causesKept = 4096

// causeReasonMax bounds a kept reason in bytes (a database's error may
// quote the whole value), so that causesKept bounds the memory too; the
// dead letter's header is cut shorter anyway (consumer.MaxReasonLen).
const causeReasonMax = 512

// Causes is a DeadLetterer in front of Next that keeps the dead letter of
// an event whose dead letter failed (Next returned an error and nak'ed the
// event), so that, if the event's deliveries run out before a letter of it
// is stored (a dead-letter stream away for minutes), the letter stored at
// last gives that cause (its stage, code and SQLSTATE, and its reason
// after the deliveries) instead of StageDeliver's max_deliver: `jetsink dlq
// replay --code invalid_json` finds it, and the reason says what was
// wrong. It remembers for this process only, and at most causesKept
// events. Put it in front of whatever counts dead letters, so that they
// count the letter stored. Safe for concurrent use.
type Causes struct {
	Next DeadLetterer

	mu    sync.Mutex
	n     uint64 // numbers the keeps, for order
	kept  map[causeKey]keptCause
	order []keptAt // oldest first; an entry whose number is not its key's is stale
}

// causeKey is an event: its stream's epoch, name and sequence (a stream
// re-created under jetsink numbers its events from 1 again).
type causeKey struct {
	epoch  uint64
	stream string
	seq    uint64
}

type keptCause struct {
	dl DeadLetter
	n  uint64
}

type keptAt struct {
	k causeKey
	n uint64
}

// DeadLetter hands dl to Next; for a letter of StageDeliver, the cause of
// the event's failed letter before it, if one is kept.
func (c *Causes) DeadLetter(ctx context.Context, ev *Event, dl DeadLetter) error {
	k := causeKey{ev.Epoch, ev.Stream, ev.StreamSeq}
	dl, cause := c.letter(k, ev, dl)
	err := c.Next.DeadLetter(ctx, ev, dl)
	switch {
	case err == nil:
		c.forget(k)
	case cause.Stage != StageDeliver && FailedDeadLetter(err) == "nak":
		c.keep(k, cause)
	}
	return err
}

// letter is the letter DeadLetter stores for dl of ev, and its cause
// (what is kept if storing it fails).
func (c *Causes) letter(k causeKey, ev *Event, dl DeadLetter) (stored, cause DeadLetter) {
	if dl.Stage != StageDeliver {
		return dl, dl
	}
	kept, ok := c.lookup(k)
	if !ok {
		return dl, dl
	}
	stored = kept
	stored.Reason = fmt.Sprintf("delivered %d times, past nats.max_deliver, its dead letters failed before: %s", ev.Delivered, kept.Reason)
	return stored, kept
}

// storedAs is the letter DeadLetter would store for dl of ev now, for
// the worker's log line (storesAs).
func (c *Causes) storedAs(ev *Event, dl DeadLetter) DeadLetter {
	stored, _ := c.letter(causeKey{ev.Epoch, ev.Stream, ev.StreamSeq}, ev, dl)
	return stored
}

// storesAs is a DeadLetterer that may store another letter than the one
// it is handed (Causes), so that a log line can name the one stored.
type storesAs interface {
	storedAs(ev *Event, dl DeadLetter) DeadLetter
}

func (c *Causes) lookup(k causeKey) (DeadLetter, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kc, ok := c.kept[k]
	return kc.dl, ok
}

func (c *Causes) keep(k causeKey, dl DeadLetter) {
	if len(dl.Reason) > causeReasonMax {
		cut := causeReasonMax
		for cut > 0 && !utf8.RuneStart(dl.Reason[cut]) {
			cut--
		}
		dl.Reason = dl.Reason[:cut]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kept == nil {
		c.kept = make(map[causeKey]keptCause)
	}
	if kc, ok := c.kept[k]; ok {
		c.kept[k] = keptCause{dl, kc.n} // its place in the order stays
		return
	}
	c.n++
	c.kept[k] = keptCause{dl, c.n}
	c.order = append(c.order, keptAt{k, c.n})
	for len(c.kept) > causesKept {
		o := c.order[0]
		c.order = c.order[1:]
		if c.kept[o.k].n == o.n {
			delete(c.kept, o.k)
		}
	}
	if len(c.order) > 2*causesKept {
		// Entries of causes forgotten since they were kept: drop them.
		live := c.order[:0]
		for _, o := range c.order {
			if c.kept[o.k].n == o.n {
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

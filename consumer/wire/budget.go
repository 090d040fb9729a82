package wire

import (
	"math"
	"sync"
	"sync/atomic"
)

// Budget bounds the bytes of the messages that Subs have handed on and
// that are not yet released (PullOptions.Budget): a Sub pulls only while
// the budget has room for a message of the server's max_payload (plus
// pullMargin) beside what it holds itself, and asks each pull for no more
// bytes than that room. A message holds what the server counts against a
// pull's max_bytes (subject, ack reply, headers and payload: about its
// allocation) from the moment the Sub hands it to the
// handler until its final settlement (Ack, Nak, NakWithDelay, Term,
// TermWithReason, AckAll; sent or not) or Release, whichever comes first;
// each releases once. The bound is not hard: pulls left open with their
// bytes unused (a stream with nothing more to deliver) can each be filled
// by a burst, so what is held can pass Limit by about one pull's bytes
// for each open pull beyond the first. One Budget may serve many Subs on
// many connections; its methods are safe for concurrent use.
type Budget struct {
	limit  atomic.Int64 // only grows (Grow)
	id     uint32
	held   atomic.Int64
	wakeAt atomic.Int64 // a release that brings held to this or below wakes the waiters; MinInt64: none

	mu      sync.Mutex
	waiters map[chan struct{}]int64 // wake channel -> the held level it waits for
}

// budgets finds a Budget by the id a Msg keeps (Msg has no pointers).
// Budgets are never removed: a process makes a few (one per consumer).
var budgets struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*Budget]
}

// NewBudget returns a Budget of limit bytes (at least 1).
func NewBudget(limit int64) *Budget {
	b := &Budget{waiters: map[chan struct{}]int64{}}
	b.limit.Store(max(limit, 1))
	b.wakeAt.Store(math.MinInt64)
	budgets.mu.Lock()
	defer budgets.mu.Unlock()
	var list []*Budget
	if p := budgets.list.Load(); p != nil {
		list = *p
	}
	list = append(list[:len(list):len(list)], b)
	b.id = uint32(len(list))
	budgets.list.Store(&list)
	return b
}

func budgetByID(id uint32) *Budget {
	if p := budgets.list.Load(); p != nil && id > 0 && int(id) <= len(*p) {
		return (*p)[id-1]
	}
	return nil
}

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit.Load() }

// Grow raises the budget to limit bytes, if that is more, and wakes the
// Subs waiting for room (for a server that takes larger messages than the
// budget was made for).
func (b *Budget) Grow(limit int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if limit <= b.limit.Load() {
		return
	}
	b.limit.Store(limit)
	for ch := range b.waiters {
		delete(b.waiters, ch)
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	b.wakeAt.Store(math.MinInt64)
}

// Held is the bytes of the messages handed on and not yet released.
func (b *Budget) Held() int64 { return b.held.Load() }

// take counts n bytes as held.
func (b *Budget) take(n int64) { b.held.Add(n) }

// release gives back n bytes, waking the waiters whose room it made.
func (b *Budget) release(n int64) {
	if b.held.Add(-n) <= b.wakeAt.Load() {
		b.wake()
	}
}

// room returns the bytes free beyond extra (what the caller holds itself,
// not yet taken). When fewer than want are free it registers ch (capacity
// 1) to get a value once a release brings them to want, and returns what
// is free. A caller that no longer waits calls forget.
func (b *Budget) room(want, extra int64, ch chan struct{}) int64 {
	if free := b.Limit() - b.held.Load() - extra; free >= want {
		if b.wakeAt.Load() != math.MinInt64 {
			b.forget(ch) // an earlier wait, over: no wake-up for it
		}
		return free
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	limit := b.limit.Load() // Grow changes it under mu only
	at := limit - want - extra
	b.waiters[ch] = at
	if at > b.wakeAt.Load() {
		b.wakeAt.Store(at)
	}
	// held is read after wakeAt is written, and release reads wakeAt
	// after it writes held: a release meanwhile is seen here or wakes ch.
	free := limit - b.held.Load() - extra
	if free >= want {
		b.drop(ch)
	}
	return free
}

// forget stops waking ch.
func (b *Budget) forget(ch chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.drop(ch)
}

// drop removes ch from the waiters and recomputes wakeAt; mu must be held.
func (b *Budget) drop(ch chan struct{}) {
	if _, ok := b.waiters[ch]; !ok {
		return
	}
	delete(b.waiters, ch)
	at := int64(math.MinInt64)
	for _, a := range b.waiters {
		at = max(at, a)
	}
	b.wakeAt.Store(at)
}

func (b *Budget) wake() {
	b.mu.Lock()
	defer b.mu.Unlock()
	held := b.held.Load()
	at := int64(math.MinInt64)
	for ch, a := range b.waiters {
		if held > a {
			at = max(at, a)
			continue
		}
		delete(b.waiters, ch)
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	b.wakeAt.Store(at)
}

// pullMargin is what the server counts of a message against a pull's
// max_bytes beyond its header block and payload (which max_payload
// bounds): its subject and ack reply. A pull asks for at least
// max_payload + pullMargin, so that the largest message fits.
const pullMargin = 8 << 10

// pullSize is what the server counts of m against a pull's max_bytes.
func (m *Msg) pullSize() int64 {
	return int64(m.subj) + int64(m.reply) + int64(m.hdr) + int64(m.data)
}

// hold makes m hold its pullSize of b until Release or its final
// settlement.
func (m *Msg) hold(b *Budget) {
	b.take(m.pullSize())
	m.budget.Store(b.id)
}

// Release gives back the bytes m holds of its Sub's Budget, if it still
// holds them (see Budget); a final settlement does it too. Call it for a
// message whose life ends without one (dropped, or not acked because its
// stream was replaced). It is cheap and safe to call more than once.
func (m *Msg) Release() {
	// Most calls find nothing held (a settlement released it): a load
	// is cheaper than a swap.
	if m.budget.Load() == 0 {
		return
	}
	if id := m.budget.Swap(0); id != 0 {
		if b := budgetByID(id); b != nil {
			b.release(m.pullSize())
		}
	}
}

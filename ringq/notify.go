package ringq

import (
	"context"
	"runtime"
	"sync/atomic"
)

// cacheLine is the padding unit. 128 rather than 64 bytes because x86's adjacent-line
// prefetcher pulls cache lines in pairs, which makes 64-byte neighbours share traffic.
const cacheLine = 128

type pad [cacheLine]byte

// notifier is an eventcount: a way for one side to sleep until the other side has changed
// state, without missing a change that happens while it is falling asleep, and without the
// other side paying more than one atomic load when nobody sleeps.
//
// Waiter (await):  sleepers++ ; re-check the condition ; if still false, receive from wake.
// Signaller:       change the state (an atomic store) ; if sleepers != 0, try-send on wake.
//
// Both the state change and sleepers++ are sequentially consistent atomic operations, so
// they are ordered: either the signaller's load sees sleepers != 0 and sends a token, or
// the waiter's increment came later and its re-check sees the new state. A token sent to a
// waiter that already left stays in the one-slot buffer and costs one spurious wake-up (the
// waiter re-checks and parks again). Parking on a channel lets a waiter also select on
// ctx.Done().
//
// A notifier has one waiter at a time by contract (the single consumer or the single
// producer of a ring, or the consumer of a Merge); any number of goroutines may signal it.
type notifier struct {
	_        pad
	sleepers atomic.Int32
	wake     chan struct{}
	_        pad
	// coldParked: a cold wait (see await) got as far as parking, and cold waits skip the
	// yield phase from then on: when items trickle in, yielding only burns CPU before the
	// inevitable park. Warm waits neither use nor set it.
	// Owned by the single waiter, and on its own cache line so that the signallers' loads
	// of sleepers do not miss whenever the waiter updates it.
	coldParked bool
	_          pad
}

func newNotifier() *notifier {
	return &notifier{wake: make(chan struct{}, 1)}
}

// signal wakes the sleeping waiter, if there is one. Call it after the state change.
func (n *notifier) signal() {
	if n.sleepers.Load() != 0 {
		select {
		case n.wake <- struct{}{}:
		default: // a token is already pending; the waiter will re-check anyway
		}
	}
}

// await returns nil once ready reports true, or ctx.Err() if ctx ends first. It spins,
// then yields, then parks; while parked it uses no CPU. With cold set, once a cold wait
// has got as far as parking, cold waits skip the yields for good. A single-item
// producer waits warm (always yields first): when both sides of a ring park after a
// recent park, they take turns filling and emptying it instead of running side by side
// (ringq/BENCHMARKS.md, session 13).
func (n *notifier) await(ctx context.Context, spin, yield int, cold bool, ready func() bool) error {
	for range spin {
		if ready() {
			return nil
		}
	}
	if cold && n.coldParked {
		yield = 0
	}
	for range yield {
		runtime.Gosched()
		if ready() {
			return nil
		}
	}
	if cold {
		n.coldParked = true
	}
	done := ctx.Done()
	for {
		n.sleepers.Add(1)
		if ready() {
			n.sleepers.Add(-1)
			return nil
		}
		if done == nil { // context.Background and friends: a plain receive is cheaper
			<-n.wake
			n.sleepers.Add(-1)
		} else {
			select {
			case <-n.wake:
				n.sleepers.Add(-1)
			case <-done:
				n.sleepers.Add(-1)
				return ctx.Err()
			}
		}
		if ready() {
			return nil
		}
	}
}

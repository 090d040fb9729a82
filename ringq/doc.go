// Package ringq provides the bounded, blocking, lock-free queues that carry events
// between jetsink's stages: a single-producer, single-consumer Ring, a Dispatch that fans
// one producer out to one Ring per worker (consumer -> workers), and a Merge that fans one
// Ring per worker into one consumer (workers -> sink). Nothing is ever dropped or
// overwritten: a full ring blocks its producer, and that back-pressure is what stops
// jetsink pulling from JetStream when the database is slow.
//
// # Goroutines and what is safe concurrently
//
// ringq starts no goroutines. Every Ring has two roles, each held by one goroutine at a
// time:
//
//   - the producer calls TryPush, Push, TryPushN and PushN;
//   - the consumer calls TryPop, Pop, TryPopN and PopN.
//
// The producer and the consumer run concurrently with each other. Close, Len and Cap are
// safe from any goroutine. A role may move to another goroutine only through a
// happens-before edge (a channel, a WaitGroup, a mutex). Two producers or two consumers at
// once are a programming error: with WithDebug, or in any build with the race detector,
// the second one to enter panics instead of silently losing or duplicating items.
//
// A Dispatch has one producer goroutine, which calls Push and finally Close; worker i is
// the consumer of Ring(i). A Merge has one consumer goroutine, which calls PopN and
// TryPopN (Len is safe from any goroutine); producer i is the producer of Ring(i) and
// closes it after its last push.
//
// # Index states
//
// A Ring is a power-of-two array of slots and two free-running counters: head, the number
// of slots the consumer has emptied and handed back, written only by the consumer; and
// tail, the number of items pushed so far, written by the producer (and by Close, which
// sets its top bit; see Close below). Item number i
// lives in slot i & mask. The ring holds tail-head items (unsigned, modulo the index
// space), so full and empty need
// no spare slot and no flag. With capacity 4 (mask 3):
//
//	empty: head == tail                 h
//	                                    t
//	                                   [ ][ ][ ][ ]
//
//	two items: tail-head == 2              h     t
//	                                   [ ][a][b][ ]
//
//	full: tail-head == 4, Push waits       t
//	                                       h
//	                                   [d][a][b][c]
//
//	wrapped: head = 2^63-1, tail = 2          t  h
//	three items, in slots 3, 0, 1      [b][c][ ][a]     slot(2^63-1) = 3, slot(0) = 0
//
// The producer writes slot tail & mask and then publishes tail+1. The consumer reads the
// next unread slot, zeroes it (so the ring does not keep the item's buffers alive), and hands
// it back by publishing head+1. PushN and PopN move a whole run of slots (two copies when
// the run wraps the array) and publish the index once. Single-item pops (Pop, TryPop, a
// Merge's PopN into one slot) hand their slots back lazily: the consumer keeps its own
// count of what it has read and zeroes and publishes every max(1, Cap/8) slots (at most
// 32), and at once when it finds the ring empty or pops a batch, so it never waits, or
// reports empty or closed, while it keeps slots. That saves an atomic store per item and
// keeps the consumer from writing zeros into the cache line the producer is filling next.
// The price: a producer waiting on a full ring may have to wait for up to that many more
// pops, a consumer that stops popping keeps up to that many items referenced, and Len
// counts them. Each side keeps a cached copy of the other side's index and re-reads the
// real one only when the cache says full (producer) or empty (consumer) or, for PushN and
// PopN, has too little room or too few items for the whole batch, so in steady
// state neither side touches the other's cache line for every item. Each index sits on
// its own cache line (128 bytes, for the adjacent-line prefetcher) next to that side's
// private fields.
//
// # Memory ordering
//
// Go's sync/atomic operations are sequentially consistent, which gives the two
// hand-offs this ring needs. The producer's slot writes happen before its atomic store of
// tail, and the consumer's atomic load of that tail value happens before its reads of the
// slots, so the consumer never sees a half-written item. Symmetrically the consumer's read
// and zeroing of a slot happen before its store of head, which happens before the producer
// reuses the slot. Because an atomic store or compare-and-swap of an index costs far more
// than a plain store (a full fence on amd64; on arm64 a store-release, and the cache line
// moves to the other core), the batch calls publish once per batch, not once per item. The race detector understands these
// edges, so -race checks the slot accesses too.
//
// # Why one producer and one consumer only
//
// In the naive ring with two atomic indices each index has exactly one writer, so a plain
// "read my index, write the slot, store index+1" needs no read-modify-write; that is what
// makes it correct, and it is correct only for one producer and one consumer: two
// producers can read the same tail, write the same slot, and both store tail+1, so one
// item is overwritten and lost; two consumers can read the same slot and both store
// head+1, so one item is delivered twice and the next one skipped. Nothing in the
// indices shows that it happened. This ring keeps the one-writer rule for head, and for
// tail but for Close: the producer publishes with one compare-and-swap per call (per run
// of items for PushN), which only Close can make fail (see Close), so it never retries
// and never contends with another producer. Several producers or consumers need more:
// a read-modify-write that other producers make fail and retry, on every item (a lock, or
// Vyukov's per-slot sequence numbers), which measured slower here than one SPSC ring per
// worker, so Dispatch and Merge build fan-out and fan-in from SPSC rings instead.
//
// # Why the capacity must be a power of two
//
// The indices are never reset: they count up and wrap around at the end of the index
// space (2^63 here; bit 63 of tail is the closed flag). Slot i & mask equals i mod capacity,
// and consecutive indices must map to consecutive slots even across the wrap, where index
// 2^63-1 is followed by index 0. That holds only if the capacity divides 2^63, that is, if
// it is a power of two. With a capacity of 6, index 2^63-1 maps to slot 1 and the next index,
// 0, to slot 0: the producer would overwrite an unread item and the consumer would read
// slots out of order. So rounding the capacity up to a power of two is a correctness
// requirement, not only a way to replace a division by a mask. (Unsigned subtraction
// modulo 2^63 keeps tail-head right across the wrap for the same reason.) Tests start the
// indices just below the wrap to exercise it.
//
// # Close
//
// Close may race with a push from another goroutine, so whether a push "made it" must be
// decided atomically. Close sets the top bit of tail with a compare-and-swap, and the
// producer publishes with a compare-and-swap from the tail it owns; after Close that
// compare fails, the producer takes its copies back and returns ErrClosed. So each push
// either lands before Close, and will be popped, or fails; the consumer reads the final
// tail and the closed bit in one load, drains, and then gets ErrClosed.
//
// # Waiting
//
// A blocked call re-checks the ring a few times (WithSpin), then calls runtime.Gosched a
// few times (WithYield), then parks on an eventcount: it registers as a sleeper, re-checks
// the ring, and blocks on a one-slot channel, selecting on ctx.Done() as well. The other
// side, after publishing its index, loads the sleeper count and sends a token only if
// someone sleeps, so a push or pop costs one extra atomic load when nobody waits, and a
// parked goroutine costs no CPU. Sequential consistency rules out a lost wake-up: either
// the signaller sees the sleeper, or the sleeper's re-check sees the new index. A Merge's
// rings share one eventcount for their consumer, so a push into any ring wakes it without
// polling; that consumer does not spin, because its check reads every ring's tail, the
// lines the producers are writing. The defaults spin very little, because spinning longer
// (1-10 µs) measured slower than parking on two cores, busy or quiet: on a busy machine
// the spinner takes CPU time the other side needs; on a quiet one a spin that catches the
// next item hands over that one item, so the two sides fall into lockstep, a wait every
// 5-13 items, with both cores busy. In a saturated single-item hand-off waits are rare (a few per thousand
// items) and a parked side resumes only tens of microseconds after its wake-up, long
// enough for the other side to run hundreds of items ahead. Once a wait of PushN, Pop,
// PopN or Merge.PopN has got as far as parking, that side's waits of those calls skip the
// yields for good, so that a trickle of items idles like a channel. (Until session 40 this
// said "the next 16 waits"; the code never did that, and a version that did drained
// jetsink no faster: BENCHMARKS.md, session 40.) Push always yields first: without that
// exception, both sides of a saturated ring of 40-byte items parked about once per 1,000
// items and took turns (the producer filled the ring while the consumer slept, then slept
// while the consumer emptied it), at about half the throughput. See BENCHMARKS.md.
//
// # Errors
//
// Push, PushN and Dispatch.Push return ErrClosed once the ring is closed (PushN with an
// empty vs returns 0, nil, as PopN with an empty dst does). Pop, PopN and
// Merge.PopN return ErrClosed once the ring (for a Merge: every ring) is closed and
// drained. Every blocking call returns ctx.Err() when its context ends while it waits (a
// call that does not have to wait succeeds even if ctx is already done). Nothing is
// added or removed by a call that returns an error, except the leading items counted by
// PushN.
package ringq

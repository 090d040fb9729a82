package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jetsink/jetsink/ringq"
)

const (
	// batchSize is how many events a worker pops at once: batching 64
	// items amortises the ring's atomics (DESIGN.md: ~10x).
	batchSize = 64
	// slabSize is the size of the blocks tuples are carved from.
	slabSize = 64 << 10
	// ownSliceAbove: tuples larger than this get their own allocation
	// rather than wasting the rest of a slab.
	ownSliceAbove = slabSize / 8
)

// worker is one decode goroutine. Everything in it is owned by that goroutine.
type worker struct {
	id      int
	p       *Pipeline
	enc     *Encoder
	in      Input
	out     Output
	stats   *workerStats
	letters *letterer
	scratch []byte // the tuple being encoded
	slab    *slab  // tuples are carved from here; nil before the first
	carved  int64  // rows carved from slab
	gen     uint16 // slab's generation, kept so that a row costs no atomic load
}

// run is the worker loop; see Pipeline.Run.
func (w *worker) run(ctx context.Context) error {
	defer w.out.Close()
	unpin, err := w.p.pin(w.id)
	if err != nil {
		return err
	}
	defer unpin()
	defer w.retire()

	evs := make([]Event, batchSize)
	rows := make([]Row, 0, batchSize)
	for {
		n, err := w.in.PopN(ctx, evs)
		if errors.Is(err, ringq.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		rows = rows[:0]
		for i := range evs[:n] {
			ev := &evs[i]
			var dl DeadLetter
			var column string
			if ev.Exhausted {
				// Past nats.max_deliver: not decoded, whatever it holds.
				dl = MaxDeliverDeadLetter(uint64(ev.Delivered))
			} else {
				row, derr := w.encode(ev)
				if derr == nil {
					rows = append(rows, row)
					continue
				}
				dl, column = decodeDeadLetter(derr)
			}
			// The letter goes to its lane, and the worker on: storing it
			// takes a round trip or more (letterLanes).
			lt := letter{ev: *ev, dl: dl, column: column, stats: w.stats}
			if w.letters.add(lt) {
				continue
			}
			// The worker's letters are at their limit (a dead-letter
			// stream that answers slowly, or not at all): the rows
			// decoded so far go on before the worker waits for room,
			// since on their way to the sink they get its InProgress, and
			// here nothing renews their ack wait. They are the events
			// before this one, so the order within a subject stays.
			if rows, err = w.push(ctx, rows); err != nil {
				return err
			}
			if err := w.letters.wait(ctx, lt); err != nil {
				return err
			}
		}
		clear(evs[:n]) // let the payloads go once their rows do
		if rows, err = w.push(ctx, rows); err != nil {
			return err
		}
	}
}

// push hands rows to the output ring (blocking while it is full) and
// returns rows emptied for reuse. Nothing is pushed for no rows.
func (w *worker) push(ctx context.Context, rows []Row) ([]Row, error) {
	if len(rows) == 0 {
		return rows, nil
	}
	if _, err := w.out.PushN(ctx, rows); err != nil {
		if errors.Is(err, ringq.ErrClosed) {
			return rows, fmt.Errorf("pipeline worker %d: push rows: output closed by someone else: %w", w.id, err)
		}
		return rows, err
	}
	w.stats.rows.Add(uint64(len(rows)))
	clear(rows)
	return rows[:0], nil
}

// encode returns ev's row, its tuple in a slice of its own. Rows wait in
// the sink's batch until commit, so a slab is not written again until the
// worker has retired it and the sink has released every row carved from
// it (ReleaseRows). A tuple over ownSliceAbove gets an allocation of its
// own; when it is sure to be over (inPlace), the event is encoded straight
// into one of about its size (tupleCap), else it is copied out of the
// scratch tuple.
func (w *worker) encode(ev *Event) (Row, error) {
	var t []byte
	var err error
	own := w.inPlace(ev)
	if own {
		t, err = w.appendTuple(make([]byte, 0, w.enc.m.tupleCap(len(ev.Data))), ev)
	} else {
		t, err = w.appendTuple(w.scratch[:0], ev)
		w.scratch = t
	}
	if err != nil {
		w.trimScratch() // a column may have grown it before another failed
		return Row{}, err
	}
	n := len(t)
	if n > ownSliceAbove {
		if !own {
			t = append(make([]byte, 0, n), t...)
			w.trimScratch()
		}
		return Row{Event: *ev, Tuple: t[:n:n]}, nil
	}
	if w.slab == nil || cap(w.slab.buf)-len(w.slab.buf) < n {
		w.retire()
		w.slab = newSlab()
		w.gen = w.slab.gen()
	}
	s := w.slab
	off := len(s.buf)
	s.buf = append(s.buf, t...)
	w.carved++
	return Row{Event: *ev, Tuple: s.buf[off : off+n : off+n], slab: s, gen: w.gen}, nil
}

// inPlace reports whether ev's tuple, if ev is stored at all, is over
// ownSliceAbove for sure: a column that stores the payload holds all of it,
// so a payload over ownSliceAbove, and within max_event_bytes (a larger one
// is refused before any column), makes such a tuple. An estimate
// (tupleCap) would not do: over ownSliceAbove for a wide mapping or a
// payload just under it, it would have an event whose tuple ends up small
// allocate a buffer, be carved from a slab, and drop it, every time.
func (w *worker) inPlace(ev *Event) bool {
	n := len(ev.Data)
	return w.enc.m.payloadCols > 0 && n > ownSliceAbove && (w.enc.maxEventBytes <= 0 || int64(n) <= w.enc.maxEventBytes)
}

// trimScratch does not keep a huge scratch buffer after an outlier.
func (w *worker) trimScratch() {
	if cap(w.scratch) > 4*slabSize {
		w.scratch = nil
	}
}

// appendTuple encodes ev after dst (w.scratch or a tuple of its own). A
// panic of the encoder's, a bug that this event's bytes reach, is
// recovered for this event alone (see recovered); redelivered, the event
// would panic again, and take down the process and everything in flight
// each time, until max_deliver. The deferred recover costs nothing
// measurable (BENCHMARKS.md).
func (w *worker) appendTuple(dst []byte, ev *Event) (tuple []byte, err error) {
	defer func() {
		if v := recover(); v != nil {
			tuple, err = nil, w.recovered(ev, v)
		}
	}()
	return w.enc.AppendTuple(dst, ev)
}

// recovered deals with v, a panic of the encoder's on ev: it logs it at
// Error with the stack (at most once a second for the whole pipeline,
// with the number held back), replaces the encoder and the scratch
// buffer, which the panic may have left half-written, and returns ev's
// DecodeError, CodeInternal. Call it from the deferred function that
// recovered v, so that the stack is the panic's.
func (w *worker) recovered(ev *Event, v any) error {
	if held, ok := w.p.panics.Allow(time.Now(), time.Second); ok {
		w.p.log.LogAttrs(context.Background(), slog.LevelError, "decoder panic: the event is dead-lettered (code internal); this is a bug of jetsink's, please report it with the stack",
			slog.String("subject", ev.Subject), slog.String("stream", ev.Stream), slog.Uint64("stream_seq", ev.StreamSeq),
			slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())), slog.Int64("held_back", held))
	}
	w.enc = w.p.m.NewEncoder(w.p.cfg.MaxEventBytes)
	w.scratch = nil
	return &DecodeError{Code: CodeInternal, Reason: fmt.Sprintf("panic while decoding the event, a bug of jetsink's: %v", v)}
}

// retire stops carving from the current slab: it goes back to the pool
// once its rows are released.
func (w *worker) retire() {
	if w.slab != nil {
		w.slab.release(slabBias-w.carved, w.gen)
		w.slab, w.carved = nil, 0
	}
}

// decodeDeadLetter is the dead letter of an event encode refused, and the
// column at fault ("" for the event as a whole).
func decodeDeadLetter(err error) (DeadLetter, string) {
	var de *DecodeError
	if !errors.As(err, &de) {
		de = &DecodeError{Code: CodeInvalidJSON, Reason: err.Error()}
	}
	return de.DeadLetter(), de.Column
}

// failedDeadLetterEvery is how often, at most, a stage logs a failed dead
// letter: one that fails (no dead-letter stream, a full one) fails at every
// delivery of every such event, for as long as it lasts. The dead-letterer
// (the consumer) logs each failure too, as often at most. A stored one
// only the dead-letterer logs (the consumer, at Warn, with its reason).
const failedDeadLetterEvery = time.Second

// deadLetter hands an event that will not become a row (undecodable, or
// past nats.max_deliver) to the DeadLetterer, in a lane (letterer), and
// counts it in stats, its worker's. If that fails the DeadLetterer has
// nak'ed the event (it will come back), so the lane logs and carries on;
// or, for an event whose stream was re-created since (FailedDeadLetter
// "stale"), which nothing would deliver again, it tried until ctx ended,
// and logged the loss itself.
func (p *Pipeline) deadLetter(ctx context.Context, ev *Event, dl DeadLetter, column string, stats *workerStats) {
	logged := dl // the letter stored: Causes may store a failed letter's cause for max_deliver's
	if s, ok := p.dl.(storesAs); ok {
		logged = s.storedAs(ev, dl)
	}
	attrs := []any{"subject", ev.Subject, "stream", ev.Stream, "stream_seq", ev.StreamSeq, "stage", logged.Stage, "code", logged.Code, "column", column}
	if dlErr := p.dl.DeadLetter(ctx, ev, dl); dlErr != nil {
		stats.deadLetterFailed.Add(1)
		if errors.Is(dlErr, ErrDeadLetterHeldBack) {
			return // logged by the dead-letterer, at most once a second
		}
		msg := "dead-letter failed; event nak'ed for redelivery"
		if FailedDeadLetter(dlErr) == "stale" {
			msg = "dead-letter given up at a hard stop; its stream was re-created since, so the event is lost"
		}
		p.dlFails.Log(ctx, p.log, slog.LevelWarn, failedDeadLetterEvery, msg, append(attrs, "error", dlErr.Error())...)
		return
	}
	// Stored: the dead-letterer logs it (the consumer, once, at Warn,
	// with the reason); a line here too logged every letter twice.
	stats.deadLettered.Add(1)
}

package pipeline

import (
	"context"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/jetsink/jetsink/ringq"
)

// Input is a worker's input queue. PopN blocks until it moves at least one
// event, and returns ringq.ErrClosed once the queue is closed and drained.
type Input interface {
	PopN(ctx context.Context, dst []Event) (int, error)
}

// Output is a worker's output queue. PushN blocks until all of rows are in
// (or ctx ends, or the queue is closed: ringq.ErrClosed). The worker that
// pushes calls Close after its last PushN, and only it: a ChanHandoff's
// output must not be closed under a PushN that is still sending.
type Output interface {
	PushN(ctx context.Context, rows []Row) (int, error)
	Close()
}

// Handoff is the pair of queues around the workers (config key
// pipeline.handoff):
//
//   - the consumer calls Push for each event, which goes to worker
//     Key(ev) % N(), and Close after its last Push;
//   - worker i pops from Input(i) and pushes its rows to Output(i);
//   - the sink pops rows with PopN and TryPopN, and gets ringq.ErrClosed
//     once every worker has closed its output and the rows are drained.
//
// Errors are the ringq ones: ringq.ErrClosed, or ctx.Err().
type Handoff interface {
	Push(ctx context.Context, ev Event) error
	Close()
	N() int
	Input(i int) Input
	Output(i int) Output
	PopN(ctx context.Context, dst []Row) (int, error)
	TryPopN(dst []Row) int
	// InLen and OutLen are how many events wait for worker i and how many
	// of its rows wait for the sink, for the occupancy gauges.
	InLen(i int) int
	OutLen(i int) int
}

// NewHandoff returns the hand-off of the given kind (HandoffRing or
// HandoffChannel) for n workers, each queue holding capacity items.
func NewHandoff(kind string, n, capacity int) Handoff {
	if kind == HandoffChannel {
		return NewChanHandoff(n, capacity)
	}
	return &RingHandoff{
		In:  ringq.NewDispatch[Event](n, capacity, Key),
		Out: ringq.NewMerge[Row](n, capacity),
	}
}

// RingHandoff is the default hand-off: a ringq.Dispatch of one ring per
// worker in, a ringq.Merge of one ring per worker out. In and Out must have
// the same number of rings.
type RingHandoff struct {
	In  *ringq.Dispatch[Event]
	Out *ringq.Merge[Row]
}

// Push pushes ev to ring Key(ev) % N() of In.
func (h *RingHandoff) Push(ctx context.Context, ev Event) error { return h.In.Push(ctx, ev) }

// Close closes In's rings.
func (h *RingHandoff) Close() { h.In.Close() }

// N returns the number of workers (In's rings).
func (h *RingHandoff) N() int { return h.In.N() }

// Input returns In's ring i.
func (h *RingHandoff) Input(i int) Input { return h.In.Ring(i) }

// Output returns Out's ring i.
func (h *RingHandoff) Output(i int) Output { return h.Out.Ring(i) }

// PopN pops rows from Out.
func (h *RingHandoff) PopN(ctx context.Context, dst []Row) (int, error) { return h.Out.PopN(ctx, dst) }

// TryPopN pops rows from Out without blocking.
func (h *RingHandoff) TryPopN(dst []Row) int { return h.Out.TryPopN(dst) }

// InLen returns the length of In's ring i.
func (h *RingHandoff) InLen(i int) int { return h.In.Ring(i).Len() }

// OutLen returns the length of Out's ring i.
func (h *RingHandoff) OutLen(i int) int { return h.Out.Ring(i).Len() }

// ChanHandoff is the hand-off a Go programmer writes first, kept so that
// jetsink bench can measure the rings against it end to end
// (pipeline.handoff: channel): one buffered channel of events per worker,
// chosen by Key as with the rings, and one buffered channel of rows that
// all workers send to and the sink receives from. Workers and the sink
// batch as they do with the rings: one blocking receive, then up to a
// batch of receives that do not block.
//
// Its guarantees on Close are weaker than the rings'. The input channels
// are never closed: the consumer's delivery goroutine may still push after
// Close when a shutdown is cut short, and a send on a closed channel
// panics. Close closes a done channel instead. A Push that starts after
// Close returns ringq.ErrClosed (and the consumer naks the message), and a
// worker that finds done closed drains its channel and stops. But a Push
// running at the same time as Close may still succeed, and its event may
// land after the worker's last drain: it is then never stored, acked or
// nak'ed, and JetStream redelivers it after ack_wait, as it does every
// message a cut-short shutdown leaves unacked. (A ring decides with one
// compare-and-swap whether a push landed before Close, so there every
// event pushed is popped.) The clean intake drain is not affected: the
// consumer closes only after its delivery goroutine has returned.
//
// The output channel is closed by the last worker to close its Output,
// after all their sends. Workers send rows one at a time, as the first
// version of such code does; a channel of row batches would take fewer
// locks.
type ChanHandoff struct {
	in      []chan Event
	out     chan Row
	done    chan struct{}
	once    sync.Once
	open    atomic.Int64 // workers whose Output is not closed yet
	outputs []chanOutput
}

// NewChanHandoff returns a ChanHandoff for n workers (n below 1 counts as
// 1): n input channels of capacity events and one output channel of
// n x capacity rows, as many slots as the rings would have (capacity is
// rounded up to a power of two, as ringq does).
func NewChanHandoff(n, capacity int) *ChanHandoff {
	n = max(n, 1)
	capacity = 1 << bits.Len(uint(max(capacity, 1)-1))
	h := &ChanHandoff{
		in:      make([]chan Event, n),
		out:     make(chan Row, n*capacity),
		done:    make(chan struct{}),
		outputs: make([]chanOutput, n),
	}
	for i := range h.in {
		h.in[i] = make(chan Event, capacity)
		h.outputs[i].h = h
	}
	h.open.Store(int64(n))
	return h
}

// Push sends ev to worker Key(ev) % N(), blocking while its channel is
// full. It returns ctx.Err() if ctx ends first and ringq.ErrClosed if
// Close came first; a Push racing Close may succeed (see ChanHandoff).
func (h *ChanHandoff) Push(ctx context.Context, ev Event) error {
	i := Key(&ev) % uint64(len(h.in))
	select {
	case <-h.done:
		return ringq.ErrClosed
	default:
	}
	select {
	case h.in[i] <- ev:
		return nil
	case <-h.done:
		return ringq.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close tells the workers that no more events come: each drains its
// channel and stops. Idempotent.
func (h *ChanHandoff) Close() { h.once.Do(func() { close(h.done) }) }

// N returns the number of workers.
func (h *ChanHandoff) N() int { return len(h.in) }

// Input returns worker i's input.
func (h *ChanHandoff) Input(i int) Input { return chanInput{ch: h.in[i], done: h.done} }

// Output returns worker i's output.
func (h *ChanHandoff) Output(i int) Output { return &h.outputs[i] }

// PopN receives at least one and at most len(dst) rows, blocking while
// there are none; ringq.ErrClosed once every Output is closed and the rows
// are drained.
func (h *ChanHandoff) PopN(ctx context.Context, dst []Row) (int, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	select {
	case r, ok := <-h.out:
		if !ok {
			return 0, ringq.ErrClosed
		}
		dst[0] = r
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return 1 + h.TryPopN(dst[1:]), nil
}

// TryPopN receives up to len(dst) rows without blocking.
func (h *ChanHandoff) TryPopN(dst []Row) int { return tryRecv(h.out, dst) }

// tryRecv receives up to len(dst) items from ch without blocking; it stops
// at an empty or closed channel.
func tryRecv[T any](ch chan T, dst []T) int {
	for n := range dst {
		select {
		case v, ok := <-ch:
			if !ok {
				return n
			}
			dst[n] = v
		default:
			return n
		}
	}
	return len(dst)
}

// InLen returns how many events wait in worker i's channel.
func (h *ChanHandoff) InLen(i int) int { return len(h.in[i]) }

// OutLen returns, for i 0, how many rows wait in the shared output channel
// (all workers' rows); for other i, 0.
func (h *ChanHandoff) OutLen(i int) int {
	if i == 0 {
		return len(h.out)
	}
	return 0
}

type chanInput struct {
	ch   chan Event
	done chan struct{}
}

// PopN receives at least one and at most len(dst) events, blocking while
// there are none; ringq.ErrClosed once Close was called and the channel is
// drained.
func (in chanInput) PopN(ctx context.Context, dst []Event) (int, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	select {
	case ev := <-in.ch:
		dst[0] = ev
	case <-in.done:
		// Closed: drain what is left, then report it.
		if n := tryRecv(in.ch, dst); n > 0 {
			return n, nil
		}
		return 0, ringq.ErrClosed
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return 1 + tryRecv(in.ch, dst[1:]), nil
}

type chanOutput struct {
	h      *ChanHandoff
	closed atomic.Bool
}

// PushN sends rows in order, blocking while the channel is full. It
// returns ringq.ErrClosed if this Output was closed.
func (o *chanOutput) PushN(ctx context.Context, rows []Row) (int, error) {
	if o.closed.Load() {
		return 0, ringq.ErrClosed
	}
	for i := range rows {
		select {
		case o.h.out <- rows[i]:
		case <-ctx.Done():
			return i, ctx.Err()
		}
	}
	return len(rows), nil
}

// Close marks this worker's output done; the last one closes the channel.
// Idempotent.
func (o *chanOutput) Close() {
	if o.closed.CompareAndSwap(false, true) && o.h.open.Add(-1) == 0 {
		close(o.h.out)
	}
}

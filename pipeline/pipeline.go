package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/jetsink/jetsink/ringq"
)

// ErrInvalidConfig is wrapped by the errors of Config.Validate and New.
var ErrInvalidConfig = errors.New("invalid pipeline config")

// Pin modes: how a worker goroutine is tied to the machine.
const (
	PinNone   = "none"   // the Go scheduler moves workers freely (default)
	PinThread = "thread" // each worker locks its OS thread (runtime.LockOSThread)
	PinCPU    = "cpu"    // as thread, and the thread is bound to one CPU of the allowed set, round-robin
)

// Hand-off kinds: the queues between the consumer, the workers and the sink.
const (
	HandoffRing    = "ring"    // ringq: one SPSC ring per worker in, one per worker out (default)
	HandoffChannel = "channel" // buffered channels, to measure the rings against (see ChanHandoff)
)

// Config sizes the pipeline; the yaml tags are the keys under pipeline: in
// the config file. The zero value is not valid; start from DefaultConfig.
type Config struct {
	// Workers is the number of worker goroutines; 0 means PhysicalCores().
	Workers int `yaml:"workers"`
	// Pin is PinNone (default), PinThread or PinCPU. Measured on a 2-vCPU
	// machine, pinning made the worker hand-off slower (see BENCHMARKS.md),
	// so it stays off unless a benchmark on the target machine says otherwise.
	Pin string `yaml:"pin"`
	// RingSize is the capacity of each worker's input and output ring
	// (rounded up to a power of two by ringq). Default 1024: measured with
	// jetsink bench (BENCHMARKS.md), 8192 cost 137 MiB peak RSS in a drain
	// and 1024 80 MiB at the same throughput.
	RingSize int `yaml:"ring_size"`
	// MaxEventBytes is the largest payload the workers decode; larger ones
	// are dead-lettered with CodeTooLarge. Default 1 MiB.
	MaxEventBytes int64 `yaml:"max_event_bytes"`
	// Handoff is HandoffRing (default) or HandoffChannel. It exists to
	// compare the two with jetsink bench (--matrix pipeline.handoff=ring,channel);
	// BENCHMARKS.md has the figures behind the default.
	Handoff string `yaml:"handoff"`
}

// Defaults of Config.
const (
	DefaultRingSize      = 1024
	DefaultMaxEventBytes = 1 << 20
	maxWorkers           = 4096
	maxRingSize          = 1 << 24
	// maxRingSlots bounds workers × ring_size (see Validate): about 850 MiB
	// of rings.
	maxRingSlots = 1 << 21
	// slotBytes is what one ring slot of each kind takes: an input ring's
	// Event and an output ring's Row.
	slotBytes = int64(unsafe.Sizeof(Event{}) + unsafe.Sizeof(Row{}))
)

// DefaultConfig returns the documented defaults: Workers 0 (physical cores),
// Pin "none", RingSize 1024, MaxEventBytes 1 MiB, Handoff "ring".
func DefaultConfig() Config {
	return Config{Workers: 0, Pin: PinNone, RingSize: DefaultRingSize, MaxEventBytes: DefaultMaxEventBytes, Handoff: HandoffRing}
}

// Validate checks every field and returns an error for each problem,
// joined (errors.Join), each wrapping ErrInvalidConfig and naming the
// config key; or nil.
func (c Config) Validate() error {
	var errs []error
	if c.Workers < 0 || c.Workers > maxWorkers {
		errs = append(errs, fmt.Errorf("%w: pipeline.workers is %d; use 0 (one per physical core) or 1..%d", ErrInvalidConfig, c.Workers, maxWorkers))
	}
	if c.Pin != PinNone && c.Pin != PinThread && c.Pin != PinCPU {
		errs = append(errs, fmt.Errorf("%w: pipeline.pin is %q; use none, thread or cpu", ErrInvalidConfig, c.Pin))
	}
	if c.RingSize < 2 || c.RingSize > maxRingSize {
		errs = append(errs, fmt.Errorf("%w: pipeline.ring_size is %d; use 2..%d (1024 is the default)", ErrInvalidConfig, c.RingSize, maxRingSize))
	} else if w := c.Workers; w >= 0 && w <= maxWorkers {
		if w == 0 {
			w = PhysicalCores()
		}
		// Each worker's two rings are allocated whole at start, rounded up
		// to a power of two: a product too large would have the process
		// die of it, or a channel hand-off panic, instead of saying why.
		slots := int64(w) << bits.Len(uint(c.RingSize-1)) // int64: 2^36 at the bounds
		if slots > maxRingSlots {
			errs = append(errs, fmt.Errorf("%w: pipeline.workers (%d) times pipeline.ring_size (%d, rounded up to a power of two) is %d ring slots, "+
				"%d MiB allocated at start; keep it at most %d (ring_size %d at %d workers)",
				ErrInvalidConfig, w, c.RingSize, slots, slots*slotBytes>>20, maxRingSlots, 1<<(bits.Len(uint(maxRingSlots/w))-1), w))
		}
	}
	if c.MaxEventBytes < 1 {
		errs = append(errs, fmt.Errorf("%w: pipeline.max_event_bytes is %d; it must be at least 1 (1MiB is the default)", ErrInvalidConfig, c.MaxEventBytes))
	}
	if c.Handoff != HandoffRing && c.Handoff != HandoffChannel {
		errs = append(errs, fmt.Errorf("%w: pipeline.handoff is %q; use ring or channel", ErrInvalidConfig, c.Handoff))
	}
	return errors.Join(errs...)
}

// Pipeline runs the decode workers between the consumer's dispatch rings
// and the sink's merge rings. Build it with New; Run it once.
type Pipeline struct {
	cfg     Config
	workers int
	m       *Mapper
	dl      DeadLetterer
	log     *slog.Logger
	cpus    []int // PinCPU: the CPUs to hand out, from this process's affinity mask
	running atomic.Bool
	stats   []workerStats
	panics  Every // the log of decoder panics (worker.recovered)
	dlFails Every // the log of failed dead letters (worker.deadLetter)

	// Set before Run (SetHeartbeat, SetLetterLimit).
	beatEvery   time.Duration // InProgress for waiting dead letters; 0: none
	epochs      *Epochs
	letterLimit func() int // letters a worker's lanes hold before it waits; nil: DefaultLetterLimit

	letterBeats    atomic.Uint64 // InProgress sent for waiting dead letters
	letterBeatErrs atomic.Uint64 // and failed
	beatFails      Every         // the log of failed ones
}

// SetHeartbeat makes the workers' lanes send InProgress every period for
// the events waiting there for their dead letters (the first half a
// period after delivery), skipping events of an epoch other than epochs'
// current one. 0, the default, sends none. Call it before Run; the sink's
// period (sink.Config.InProgressEvery) is the one to pass.
func (p *Pipeline) SetHeartbeat(every time.Duration, epochs *Epochs) {
	p.beatEvery, p.epochs = every, epochs
}

// SetLetterLimit sets how many events may wait in a worker's lanes for
// their dead letters before the worker waits for room (at least 1):
// limit is asked each time a letter is handed on. Without it,
// DefaultLetterLimit. Call it before Run. The waiting events hold their
// share of the consumer's in-flight budget, which is what bounds them
// when limit returns more.
func (p *Pipeline) SetLetterLimit(limit func() int) { p.letterLimit = limit }

// workerStats are one worker's counters, padded against false sharing.
type workerStats struct {
	rows, deadLettered, deadLetterFailed atomic.Uint64
	lettersWaiting                       atomic.Int64 // in the worker's lanes
	_                                    [32]byte
}

// Stats are cumulative counts since New.
type Stats struct {
	Rows             uint64 // events encoded and pushed to the output rings
	DeadLettered     uint64 // events handed to the DeadLetterer successfully: undecodable, or Exhausted
	DeadLetterFailed uint64 // DeadLetterer calls that failed: the event is not lost (nak'ed, or left to come back after ack_wait; one of a re-created stream is not wanted)
	// LettersWaiting is how many events wait in the workers' lanes for
	// their dead letters now (not counting the ones under way).
	LettersWaiting int64
	// LetterInProgress counts the InProgress sent for waiting events, and
	// LetterInProgressErrors those that failed.
	LetterInProgress, LetterInProgressErrors uint64
}

// New returns a Pipeline for cfg. It returns an error wrapping
// ErrInvalidConfig if cfg is invalid or m or dl is nil. A nil log discards.
func New(cfg Config, m *Mapper, dl DeadLetterer, log *slog.Logger) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("%w: no column mapping", ErrInvalidConfig)
	}
	if dl == nil {
		return nil, fmt.Errorf("%w: no dead-letterer", ErrInvalidConfig)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := cfg.Workers
	if n == 0 {
		n = PhysicalCores()
	}
	p := &Pipeline{cfg: cfg, workers: n, m: m, dl: dl, log: log, stats: make([]workerStats, n)}
	if cfg.Pin == PinCPU {
		cpus, err := allowedCPUs()
		if err != nil {
			return nil, fmt.Errorf("%w: pipeline.pin is cpu but the CPU affinity mask is unreadable: %w", ErrInvalidConfig, err)
		}
		p.cpus = cpus
	}
	return p, nil
}

// Workers returns the number of workers Run expects: the number of rings
// the Dispatch and the Merge passed to Run must each have.
func (p *Pipeline) Workers() int { return p.workers }

// Stats returns the counters summed over the workers. Safe from any goroutine.
func (p *Pipeline) Stats() Stats {
	var s Stats
	for i := range p.stats {
		s.Rows += p.stats[i].rows.Load()
		s.DeadLettered += p.stats[i].deadLettered.Load()
		s.DeadLetterFailed += p.stats[i].deadLetterFailed.Load()
		s.LettersWaiting += p.stats[i].lettersWaiting.Load()
	}
	s.LetterInProgress = p.letterBeats.Load()
	s.LetterInProgressErrors = p.letterBeatErrs.Load()
	return s
}

// Key returns the dispatch key of ev: FNV-1a (64-bit) of its subject, then
// murmur3's 64-bit finalizer, so that events of one subject go to one
// worker and keep their order. Pass it to ringq.NewDispatch. It allocates
// nothing.
//
// The finalizer is not optional: the dispatch takes the key's low bits
// (k & (N-1)), and FNV-1a's low k bits depend only on the low k bits of
// each byte (xor and multiply carry upwards only). Without it, subjects
// that differ in a byte's higher bits alone always shared a worker:
// "events.A" and "events.a" for up to 32 workers, "orders.eu" and
// "orders.us" for 2.
func Key(ev *Event) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	s := ev.Subject
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= prime64
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Run starts one worker per ring of in and blocks until all have stopped.
// Worker i is the only consumer of in.Ring(i) and the only producer of
// out.Ring(i). A worker stops when its input ring is closed and drained, or
// when ctx ends; either way it closes out.Ring(i) on its way out (whoever
// sends closes), so the sink sees every output ring close.
//
// Events a worker holds when ctx ends are neither stored nor settled;
// JetStream redelivers them after AckWait, as for any unacknowledged message.
// A worker hands the dead letters of events that will not become rows to
// lanes of its own (letterLanes) and goes on; Run returns once the lanes
// have handed every letter to the DeadLetterer. Once ctx has ended, a
// letter under way fails (its event nak'ed), and those still queued are
// left with their events to JetStream, as the events in the rings are.
//
// Run returns nil after a clean drain, ctx.Err() if ctx ended first, and an
// error wrapping ErrInvalidConfig if in and out differ in their number of
// rings (or differ from Workers()) or Run is called twice: then it starts
// no worker and closes no ring (a second call's rings may be the first
// one's), and the caller, whose mistake it is, ends the sink. A worker that
// finds its output ring closed under it returns ringq.ErrClosed, wrapped.
func (p *Pipeline) Run(ctx context.Context, in *ringq.Dispatch[Event], out *ringq.Merge[Row]) error {
	return p.RunHandoff(ctx, &RingHandoff{In: in, Out: out})
}

// RunHandoff is Run over any Handoff: worker i pops from h.Input(i) and
// pushes to h.Output(i), which it closes when it stops. h.N() must be
// Workers().
func (p *Pipeline) RunHandoff(ctx context.Context, h Handoff) error {
	if rh, ok := h.(*RingHandoff); ok && rh.Out.N() != rh.In.N() {
		return fmt.Errorf("%w: %d input rings and %d output rings for %d workers", ErrInvalidConfig, rh.In.N(), rh.Out.N(), p.workers)
	}
	if h.N() != p.workers {
		return fmt.Errorf("%w: a hand-off for %d workers, want %d", ErrInvalidConfig, h.N(), p.workers)
	}
	if !p.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run called twice", ErrInvalidConfig)
	}
	// A worker that fails stops its siblings, as errgroup would.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		werr error
	)
	for i := range h.N() {
		w := &worker{
			id:    i,
			p:     p,
			enc:   p.m.NewEncoder(p.cfg.MaxEventBytes),
			in:    h.Input(i),
			out:   h.Output(i),
			stats: &p.stats[i],
		}
		wg.Go(func() {
			w.letters = p.startLetters(wctx, w.stats)
			err := w.run(wctx)
			if err != nil {
				mu.Lock()
				if werr == nil {
					werr = err
				}
				mu.Unlock()
				cancel() // the siblings stop, and the lanes store no more
			}
			// The letters it handed on: stored, nak'ed, or (ctx ended)
			// left to JetStream.
			w.letters.close()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	return werr
}

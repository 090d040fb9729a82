package telemetry

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/jetsink/jetsink/pipeline"
)

// The export queue's sizes when OTEL_BSP_MAX_QUEUE_SIZE and
// OTEL_BSP_MAX_EXPORT_BATCH_SIZE do not set them: room for about a second
// of spans at full sampling (telemetry/BENCHMARKS.md), exported 1,024 at a
// time.
const (
	defaultQueueSpans  = 16384
	defaultExportSpans = 1024
)

// SpanStats counts the sampled spans that ended, by where they went.
// Ended - Exported - Dropped - ExportFailed is what waits in the export
// queue (or in an export under way).
type SpanStats struct {
	Ended        uint64 // sampled spans that ended
	Exported     uint64 // in exports the collector took
	ExportFailed uint64 // in exports that failed (the exporter's retries included): lost
	Dropped      uint64 // not queued because the export queue was full: lost
}

// spanQueue is the batch span processor with a count of what it loses. The
// SDK's processor drops a span when its queue is full and says so only at
// debug level of the SDK's own logger, which jetsink does not show; in its
// blocking mode it drops nothing and blocks the span's End instead, which
// would stall a worker behind a slow collector. spanQueue wraps the blocking
// one and never lets it block: it reserves a place for each span before
// handing it over and drops (and counts) the span when the queue's room is
// taken. A place is freed when the span reaches the exporter, so the
// reservations bound what the queue holds, and the blocking processor always
// finds room.
type spanQueue struct {
	sdktrace.SpanProcessor // the SDK's batch processor, WithBlocking

	room  int64        // the queue's size
	held  atomic.Int64 // spans handed over and not yet passed to the exporter
	ended atomic.Uint64
	drops atomic.Uint64
	sent  atomic.Uint64 // spans in exports that succeeded
	fails atomic.Uint64 // spans in exports that failed

	log      *slog.Logger // nil: slog.Default()
	dropWarn pipeline.Every
	// advice says, in the drop's log line, what makes fewer spans
	// (Tracing.dropAdvice); nil: only the queue's and collector's remedies.
	advice func() string
}

// newSpanQueue builds the batch processor exporting to exp (which it wraps
// to count what it exports) with the queue sizes the OTEL_BSP_* variables
// or the defaults say; advice is spanQueue.advice.
func newSpanQueue(exp *stoppable, log *slog.Logger, advice func() string) *spanQueue {
	room := envPositive("OTEL_BSP_MAX_QUEUE_SIZE", defaultQueueSpans)
	batch := min(envPositive("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", defaultExportSpans), room)
	q := &spanQueue{room: int64(room), log: log, advice: advice}
	exp.queue = q
	q.SpanProcessor = sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithBlocking(),
		sdktrace.WithMaxQueueSize(room+flushSlack), sdktrace.WithMaxExportBatchSize(batch))
	return q
}

// flushSlack is the room the processor's queue has beyond the spans': a
// ForceFlush queues a marker, which a span End must not have to wait
// behind when the spans fill their share.
const flushSlack = 64

// envPositive is the positive integer in the variable name, or def when it
// is unset or not one (the SDK ignores such a value too).
func envPositive(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// OnEnd queues a sampled span, or drops it when the queue is full.
func (q *spanQueue) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	q.ended.Add(1)
	if q.held.Add(1) > q.room {
		q.held.Add(-1)
		q.dropped()
		return
	}
	q.SpanProcessor.OnEnd(s)
}

// dropped counts a dropped span and logs, at most once per errEvery, how
// many were dropped so far and what to do about it.
func (q *spanQueue) dropped() {
	n := q.drops.Add(1)
	if _, ok := q.dropWarn.Allow(time.Now(), errEvery); !ok {
		return
	}
	msg := "spans dropped: the export queue is full (the collector takes spans more slowly than jetsink makes them); "
	if q.advice != nil {
		msg += q.advice() + "; or "
	}
	msg += "raise OTEL_BSP_MAX_QUEUE_SIZE, or give the collector more capacity"
	q.logger().LogAttrs(context.Background(), slog.LevelWarn, msg,
		slog.Uint64("dropped_total", n), slog.Int64("queue", q.room))
}

// taken frees the places of n spans the exporter took from the queue.
func (q *spanQueue) taken(n int) { q.held.Add(-int64(n)) }

// exported counts n spans by the outcome of their export.
func (q *spanQueue) exported(n int, err error) {
	if err != nil {
		q.fails.Add(uint64(n))
	} else {
		q.sent.Add(uint64(n))
	}
}

// stats reads Ended last: every span counted elsewhere has ended before,
// so Ended is never less than the others' sum.
func (q *spanQueue) stats() SpanStats {
	st := SpanStats{Exported: q.sent.Load(), ExportFailed: q.fails.Load(), Dropped: q.drops.Load()}
	st.Ended = q.ended.Load()
	return st
}

func (q *spanQueue) logger() *slog.Logger {
	if q.log == nil {
		return slog.Default()
	}
	return q.log
}

// Package telemetry is jetsink's observability: traces (OpenTelemetry,
// exported with OTLP), metrics (OpenTelemetry, served by a Prometheus
// exporter) and the admin listener that serves /healthz (the process is
// alive), /readyz (every readiness check passes: NATS connected, PostgreSQL
// answering and not failing every batch; processor defines them) and
// /metrics. While the process starts, before those checks exist, the same
// listener serves NewStarting's handler: all three answer 503 "starting: "
// and the phase, at once.
//
// # Traces
//
// NewTracing builds the tracer provider. The exporter is OTLP/HTTP or
// OTLP/gRPC, chosen by Config.OTLPEndpoint's scheme (http, https, grpc,
// grpcs) or, without it, by the standard OTEL_EXPORTER_OTLP_* variables,
// which the exporters read themselves (OTEL_EXPORTER_OTLP_ENDPOINT alone is
// enough; OTEL_EXPORTER_OTLP_PROTOCOL=grpc switches to gRPC). With neither,
// tracing is off: no provider, and every method below is a nil check.
// Sampling is parent-based: a message whose traceparent is sampled is
// traced, one whose traceparent is not is not, and a message without one is
// a root sampled with Config.SampleRatio. OTEL_TRACES_SAMPLER, when set,
// decides instead (samplerFromEnv); its forms without parentbased_ apply
// the ratio to every message, whatever its traceparent's sampled flag says,
// and decide from the traceparent's trace id as the SDK's TraceIDRatioBased
// does (its last 8 bytes), so that a publisher sampling at the same ratio
// keeps the same traces; a message without a valid traceparent takes a
// random draw.
//
// Ended spans wait in the batch span processor's queue (16,384, or
// OTEL_BSP_MAX_QUEUE_SIZE). The SDK drops a span when that queue is full
// and tells no one (or, in its blocking mode, stalls the End); spanQueue
// drops it without stalling and counts it, and counts what each export
// carried (Tracing.SpanStats, jetsink_trace_spans_lost_total); a drop is
// logged at most once a minute, and Shutdown logs the spans never exported.
// The drop's line says what makes fewer spans under the sampler in force,
// for the messages traced so far (Tracing.dropAdvice): a message whose
// publisher sampled it is traced whatever Config.SampleRatio (or a
// parentbased_ sampler's OTEL_TRACES_SAMPLER_ARG) says, so for those it
// names OTEL_TRACES_SAMPLER=traceidratio, which applies its ratio to every
// message, or a publisher that samples fewer; the ratio only for messages
// traced as roots. Under the SDK's own sampler (Config.SampleRatio < 0,
// publish) it says to lower OTEL_TRACES_SAMPLER_ARG when a traceidratio
// sampler is already set, and to set one otherwise. And, always, a larger
// queue or a faster collector.
//
// Spans, following the OpenTelemetry messaging conventions:
//
//   - "process <pattern>", CONSUMER, one per sampled message: started by
//     StartMessage when the consumer receives the message (its start time is
//     Event.Received), parented on the publisher's traceparent, named after
//     the subject pattern the message came through, or else its stream
//     (Tracing.SetDestinations; not the subject, whose ids would make one
//     span name per device), with
//     messaging.system=nats, messaging.destination.name and .template,
//     messaging.message.id, messaging.nats.stream, .stream_sequence and
//     .delivery_count. It lives in pipeline.Event.Span until the message is
//     settled, and ends there (EndMessage): at the ack after the commit, at
//     the dead letter (failed, an exception of type jetsink.dead_letter,
//     jetsink.dead_letter.stage and .code), at a nak (failed), or,
//     left unacked at the end of a drain (given_up), failed.
//     Its duration is thus receive-to-settle. A message a hard shutdown
//     leaves unsettled in one of the sink's batches (taken, not committed)
//     has its span ended then, failed, with jetsink.settle=abandoned, so
//     that the batch span's link to it resolves (JetStream delivers it
//     again after ack_wait), or jetsink.settle=stale if its stream was
//     re-created since it was taken (nothing delivers it again); one not
//     yet in a batch (in the consumer or the pipeline) is never settled,
//     and its span is never ended nor exported.
//   - "copy <table>", CLIENT, one per batch that holds a sampled message: a
//     new root (always kept) with a link to every sampled message's span
//     (at most the link limit: Config.MaxLinks or OTEL_SPAN_LINK_COUNT_LIMIT,
//     never over maxLinks, 10,000; jetsink.batch.links_dropped counts the
//     rest),
//     messaging.batch.message_count, db.system.name=postgresql,
//     db.collection.name, db.operation.name=COPY, and at its end (EndCopy)
//     the rows settled (jetsink.batch.rows: acked), the rows its commits
//     inserted (db.response.returned_rows), in exactly-once mode the rows
//     acked as stored before (jetsink.batch.duplicates: redeliveries its
//     INSERT skipped), the rows dead-lettered (jetsink.batch.dead_lettered),
//     the bytes committed (jetsink.batch.bytes) and the attempts retried
//     (jetsink.batch.retries); each ack round is an "ack" event on it. A
//     batch that fails gets a "retry" event (CopyRetry: error.type, the
//     SQLSTATE or "connect", "timeout", "connection_lost",
//     "types_changed", "_OTHER"; db.response.status_code, the SQLSTATE;
//     jetsink.batch.attempts) at its first failure and at each "batch
//     still failing" line the sink logs (a minute apart), not at every
//     attempt. A batch that a committer retrying it takes the
//     next ones into (a refused row no commit has shown to be at fault)
//     gets their links too (LinkCopy), up to the same limit: the span keeps
//     its first links, its own messages' then those taken in, and
//     jetsink.batch.links_dropped counts the sampled messages past it.
//     A batch whose attempts a hard shutdown cuts short ends its span
//     failed with "hard stop after N failed attempts; last: <error>" (a
//     row's refusal by its SQLSTATE alone), not "context canceled": the
//     attempts failed since its rows last committed or one was
//     dead-lettered; with none (rows waiting on a lock), "context
//     canceled". A batch one of whose commits had an unknown outcome
//     (the connection lost at COMMIT) has
//     jetsink.batch.commit_outcome_unknown=true: its rows may be stored,
//     and in exactly-once mode jetsink.batch.duplicates then counts those
//     its retry skipped.
//     A batch its committer hands to another committer (it could not
//     connect while the others could) ends its span with
//     jetsink.batch.handed_off=true, not as an error: the span of the
//     committer that takes it, a new one, commits it.
//
// An unsampled message costs a header lookup and, for a root, one random
// number (with a traceparent and a sampler without parentbased_, the
// reading of 16 hex digits of its trace id instead): no allocation, no
// attribute, no link (TestUnsampledAllocatesNothing).
//
// The errors the SDK reports on its own (an export that failed in the
// background, every few seconds while the collector is down; the exports
// cut short at shutdown) go to Config.Log at Warn level instead of the
// standard log package's stderr: the first at once, then at most one line a
// minute with the count left out, and the count still pending when the
// Tracing shuts down. The SDK's error handler is process-wide; NewTracing
// installs jetsink's once, and the Tracing built last that is still alive
// gets the errors (slog.Default() when none is).
//
// Publishers propagate their context with InjectTrace (W3C traceparent and
// tracestate in NATS headers, lower-case keys); Carrier also reads the
// canonical keys ("Traceparent") that propagation.HeaderCarrier writes.
//
// # Metrics
//
// NewMetrics builds a meter provider whose reader is a Prometheus exporter
// on a registry of its own; Metrics.Handler serves it at /metrics. Hot-path
// instruments (batch rows and bytes, commit duration, dead letters by stage
// and code) are recorded once per batch or per dead letter without
// allocating. The publish-to-commit latency, one value per row, is counted a
// batch at a time by a histogram of jetsink's own (eventLatency) that the
// exporter reads as a metric Producer: ~5 ns per row against ~100 for the
// SDK's Record (BenchmarkBatchCommitted). The stages' own counters (consumer,
// sink) and the ring lengths are read by observable instruments at scrape
// time (registered by the processor), and the consumer's lag is fetched at
// most every few seconds (Cached).
//
// # Goroutines and concurrency
//
// The tracer provider's batch span processor owns one goroutine, stopped by
// Tracing.Shutdown; Flush exports what has ended within a context. The
// meter provider starts none: collection runs on the scraping request's
// goroutine. Serve owns one goroutine (the HTTP server) and the handlers of
// its requests, and waits for all of them before it returns: the requests
// still running after the shutdown grace (2 s; ServeOn ends it early when
// its hard context ends) have their connections closed, which cancels
// their contexts, so every handler must return once its request's context
// is done. A /metrics scrape runs the processor's callbacks under a
// context of the SDK's that never ends (context.TODO), so whatever they
// fetch must end by other means (the processor ends those fetches when the
// listener stops). Checks run on each /readyz request,
// concurrently with everything else, so they must be safe for concurrent
// use and bounded in time; each gets a context with a short timeout.
// Tracing, Metrics, DeadLetterer, Cached and the SDK error handler are safe
// for concurrent use; a nil *Tracing or *Metrics records nothing.
package telemetry

// Package consumer is jetsink's only contact with NATS: it connects, makes
// sure the JetStream stream and the durable pull consumer exist, pulls
// messages continuously into ring #1 (a ringq.Dispatch keyed by subject), and
// parks events that can never be stored on the dead-letter subject.
//
// # Flow
//
// New validates the Config, connects (reconnecting forever with capped
// backoff), creates or binds the stream and creates or updates the durable
// consumer (explicit acks, nats.ack_wait, nats.max_deliver,
// nats.max_ack_pending, nats.filter_subject). Run pulls with nats.go's
// Consume: up to nats.pull_max_messages (and optionally nats.pull_max_bytes
// per pull) buffered in the client, a new pull sent when half are taken,
// idle heartbeats from the server. Each message becomes a pipeline.Event (one
// Metadata parse; Data and Header alias nats.go's buffers) pushed into the
// dispatch, which blocks while the worker's ring is
// full: that is where back-pressure reaches JetStream, which keeps the backlog
// on disk. The consumer never acks; the sink does, after COMMIT.
//
// An event that reaches nats.max_deliver without an ack is never delivered
// again. New subscribes to the server's MAX_DELIVERIES advisory for the
// consumer; on each, the event is read back from the stream by sequence and
// published to the dead-letter subject (stage "deliver", code "max_deliver").
// Nothing else will bring the event back, so that publish is retried, with
// backoff, until it succeeds, the event has left the stream, or the
// connection closes (then an ERROR line names the stream sequence where the
// event stays).
//
// # A stream that restarts its sequence
//
// A stream deleted and re-created starts again at sequence 1. In
// exactly-once mode rows are keyed by (stream, stream_seq), so its events
// would conflict with the old rows and be skipped as duplicates. The wiring
// then sets Config.StoredSeq (the table's highest sequence for the stream),
// and:
//   - with nats.create_stream, a missing stream is created with first_seq
//     past the table's rows and past every message of the old stream this
//     process has seen (those may still be on their way to the table);
//   - before each subscription Run compares the stream with the table, and
//     returns ErrSequenceRestarted, acking nothing, when the stream ends
//     below the table's highest sequence, or when it was re-created since
//     the last check and starts at or below what was stored or seen.
//
// Not detected: a stream deleted and re-created while jetsink was stopped
// and refilled past the table's rows before it starts again.
//
// # Goroutines
//
// Run blocks on the caller's goroutine, supervising. The pushes happen on
// nats.go's delivery goroutine of the pull subscription, one message at a
// time; Run starts a new subscription only after the previous one's delivery
// goroutine has returned, so the dispatch has one producer at a time, and Run
// closes it before returning. nats.go's other goroutines (reader, flusher,
// pull loop, status watcher, the advisory subscription's handler) end with
// the subscription and with the connection (Close). Nothing here outlives
// Close.
//
// # Shutdown
//
// Run takes two contexts. When intake ends, Run stops pulling, drains the
// messages already delivered to this client into the dispatch, closes it and
// returns nil; when hard ends, it gives up promptly (unpushed messages are
// redelivered by JetStream after ack_wait). Close drains the connection so
// the acks the sink sent are flushed; call it after Run and after the sink
// has settled its last batch.
//
// # Concurrency
//
// DeadLetter (pipeline.DeadLetterer), Lag, Stats and Ready are safe from any
// goroutine; DeadLetter is called by many workers at once. Run must not run
// twice at the same time on one Consumer.
//
// # Errors
//
// Validate and New wrap ErrInvalidConfig for configuration mistakes (never
// quoting a password or credentials). New wraps ErrStreamNotFound when the
// stream is missing and nats.create_stream is false. DeadLetter wraps
// ErrDeadLetter when the publish failed (the original was nak'ed with a
// delay, never acked or terminated). Run returns nil after a clean intake
// shutdown, and otherwise wraps the hard context's error, ringq.ErrClosed
// or jetstream.ErrConnectionClosed.
package consumer

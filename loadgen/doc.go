// Package loadgen is jetsink's publisher side: it makes realistic telemetry
// events (about 180 bytes of JSON: uuid id, RFC 3339 ts, device, kind,
// value, seq, tags) and publishes them to JetStream with Nats-Msg-Id and a
// W3C traceparent set, either as fast as JetStream acknowledges (a preload
// of N events) or open-loop at a fixed rate, where each event's send time
// is scheduled in advance so that a slow system does not lower the offered
// load. The open loop pauses only when Options.MaxPending publishes await
// their PubAck (or a resend), or while the connection reconnects; the
// events due meanwhile go out late, and Result.Late counts them. Result.SendLag records every event's send lag
// (its send minus its due time) whatever the cause, a descheduled or slow
// publisher included, without an allocation per event; Result.Start is the
// schedule's start, and Options.Started is called with it before the
// first send.
//
// A publish whose PubAck fails or does not come within Options.AckWait is
// sent again, up to 5 times (a resend held for a reconnect is no try, and
// goes out as soon as the connection is back); the stream's duplicate
// window must cover ResendSpan(AckWait) for JetStream to store it once.
// Once the connection is closed (its reconnects ran out) Publish gives up
// at once what is unsent or unacknowledged, and says how many of each.
// Told the window (Options.DuplicateWindow), Publish gives a publish up
// rather than send a resend past it; MinDuplicateWindow(AckWait) lets
// every resend through, and MaxAckWait(window) is the AckWait that does.
// A publish given up whose PubAck comes later, while Publish runs, counts
// as acknowledged (or duplicate) after all (JetStream stored it), not
// failed; Publish waits a while for those of the last events given up
// before it returns (until ResendSpan(AckWait) has passed since the last
// give-up of an event with a send still unanswered). An event
// whose first send JetStream reports as a duplicate (its Nats-Msg-Id,
// from Run and First, was used before) counts in Result.Duplicate, not
// Result.Acked.
//
// Events are a pure function of (run, seq): tests and benchmarks can
// recompute what was published and check every stored value against it.
//
// Publish runs on the calling goroutine; the connection's goroutine
// delivers the PubAcks to it, and nothing of Publish's outlives the call.
// Concurrent calls are independent. It is not part of the processor's run
// path; `jetsink publish`, `jetsink bench`, `jetsink demo` and the
// end-to-end tests use it.
package loadgen

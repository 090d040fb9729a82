// Package loadgen is jetsink's publisher side: it makes realistic telemetry
// events (about 180 bytes of JSON: uuid id, RFC 3339 ts, device, kind,
// value, seq, tags) and publishes them to JetStream with Nats-Msg-Id set,
// either as fast as JetStream acknowledges (a preload of N events) or
// open-loop at a fixed rate, where each event's send time is scheduled in
// advance so that a slow system does not lower the offered load.
//
// Events are a pure function of (run, seq): tests and benchmarks can
// recompute what was published and check every stored value against it.
//
// Publish owns its goroutines and waits for them. It is not part of the
// processor's run path; `jetsink publish`, `jetsink bench`, `jetsink demo`
// and the end-to-end tests use it.
package loadgen

// Package processor wires the stages of one jetsink process together:
//
//	consumer --ring #1 (ringq.Dispatch, one SPSC ring per worker)--> pipeline workers
//	         --ring #2 (ringq.Merge, one SPSC ring per worker)--> sink --COMMIT--> ack
//
// It is the one place that knows every stage; the stages know only the
// pipeline's Event and Row types and the rings between them.
//
// Goroutines: Run starts one goroutine per stage (the consumer loop, the
// pipeline's Run, the sink's Run) and waits for all of them before it
// returns, and the stages wait for theirs, with two exceptions on a hard
// stop. The consumer returns without waiting for its subscription's
// delivery goroutine (wire's or nats.go's), which may still be in a
// message's handler when Run returns; its push into the closed ring fails
// and the message is nak'ed. That goroutine ends with the connection, in
// CloseStages. And once the caller's hard has ended, Run waits
// abortedBudget at most for the stages: a write to a NATS server that
// reads nothing (a partition that drops packets, a frozen server) holds
// an ack, an InProgress or a dead letter, and the stage making it, until
// the connection's write timeout (10 s, then as long again on nats.go's
// connection), past the bound a cut-short stop promises; and the sink's
// committer whose COPY was given up on waits up to 5 s for PostgreSQL's
// answer to its cancel, which a server that does not answer never gives.
// Run logs those stages at Warn, with what is known to hold each (held:
// the sink is in a commit attempt, or not), and returns hard's error; they
// end when their writes or waits do: at their timeouts, or sooner if
// CloseStages gets to close the connection under them. Nothing is torn by
// not waiting: acks follow COMMIT, so such a stage acks only what is
// committed, the counters Run and Shutdown read are atomic, and
// CloseStages and Shutdown bound their own waits (the consumer's Close
// gives up on a connection held by such a write). The admin listener that
// New started ends in Shutdown: apart from such stages, nothing outlives
// Shutdown (or Close).
//
// The admin listener is served from New on, by a goroutine of its own
// (telemetry.ServeOn): while New connects and checks, /healthz, /readyz
// and /metrics answer 503 "starting: <what New is doing>"
// (telemetry.NewStarting); Run swaps its own handler in on the same
// server, so no connection is refused or dropped at the hand-over. A New
// that fails stops it and closes the listener before it returns, at once:
// a profile under way, or a connection that has sent no request, is cut
// off, not given the grace a stop gives the requests in flight.
//
// Starting: the consumer's first pull (after its start-up checks, which
// run meanwhile) waits until the sink's committers' first connects have
// ended, connected or failed, or a second after the first connected
// (sink.Sink.Warmed, consumer.Consumer.SetPullGate): events wait in the
// stream, not in jetsink, until it can store them.
//
// Cut off: once the sink has failed to reach PostgreSQL for ack_wait or
// 30 s, whichever is longer (releaseAfter), with no answer from it, it
// gives back (nak) the events it holds and those still coming, and the
// consumer pulls nothing until it answers (sink.Sink.Away,
// consumer.Consumer.SetPullPause): the durable's other instances store
// them meanwhile.
//
// Stopping uses two contexts: cancelling intake stops the consumer from
// pulling; each stage then drains into the next, the sink commits and acks
// the last batch under hard, and Run returns nil. Cancelling hard gives up
// at once: nothing that is not committed is acked, and JetStream
// redelivers it after ack_wait. CloseStages, after Run, confirms that NATS
// has read the acks (waiting, within its context, for a connection that is
// reconnecting) and closes the connections; given hard (with the drain's
// deadline), it too gives up at once when hard ends, and reports acks it
// could not confirm (consumer.ErrAcksUnconfirmed). The drain is over when
// it returns; Shutdown then shuts telemetry down (the last spans, the admin
// listener, metrics), within bounds of its own.
//
// Panics: the pipeline recovers one while an event is decoded, and
// dead-letters that event (pipeline.CodeInternal). A panic anywhere else
// in a stage is not recovered, here or in the stages: unwound halfway, a
// stage may hold a lock that another stage waits for, or leave
// goroutines Run would never see stop, and a jetsink that hangs in its
// drain is worse than one that exits and is restarted. Go ends the process
// then (exit status 2, the stack on stderr); acks are sent only after
// COMMIT, so what was not committed comes back after ack_wait.
package processor

// Package dlq reads jetsink's dead-letter stream and replays dead letters to
// the subjects they came from, once whatever refused them has been fixed.
//
// A dead letter (see consumer.DeadLetter) is the original body and headers
// plus Jetsink-* headers: Jetsink-Subject, Jetsink-Stream,
// Jetsink-Stream-Seq, Jetsink-Stage, Jetsink-Code, Jetsink-SQLState,
// Jetsink-Reason, Jetsink-Msg-Id (the original Nats-Msg-Id).
//
// Replay walks the dead-letter stream with an ordered consumer (ephemeral,
// no server-side state, no acks), from the first sequence the Filter allows
// up to the stream's last sequence when Replay started, so that it ends even
// while new dead letters arrive. For each dead letter the Filter matches it
// publishes the original body to Jetsink-Subject with the original headers
// minus every Jetsink-* header and with a fresh Nats-Msg-Id,
// "<original msg id>:replay:<dead-letter seq>" ("<stream>:<stream_seq>"
// stands in for a missing original id), so that the duplicate window of the
// event stream does not swallow it and a second replay of the same dead
// letter within the window is stored once. It waits for the PubAck, checks
// that the stream that stored it is the Jetsink-Stream the event came from,
// and only then, unless Options.Keep is set, deletes the dead letter from
// the dead-letter stream. An event is therefore never lost: a failure
// before the PubAck leaves the dead letter in place; a failure to delete
// after it leaves both, and the next replay is de-duplicated by JetStream
// within its duplicate window.
//
// DryRun lists what would be replayed and changes nothing.
//
// Replay is called by one goroutine and starts none that outlive it.
package dlq

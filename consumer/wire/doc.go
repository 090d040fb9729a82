// Package wire is a minimal NATS client for one job: pulling messages from
// a JetStream durable pull consumer and settling them. It exists because
// nats.go's general-purpose reader costs jetsink about a third of its CPU
// per event: it allocates a *nats.Msg, copied strings and a decoded header
// map for every message and hands each one across goroutines.
//
// # What it does
//
// Dial opens one connection to one server (nats:// or tls:// URL), reads
// INFO, upgrades to TLS when configured or required, authenticates with a
// user/password (or token), an NKey seed file (signing the server's nonce)
// or a credentials file (user JWT and seed), and waits for the server to
// confirm. Conn.Consume subscribes to an inbox and pulls from a durable
// consumer ($JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>), keeping about
// MaxMessages requested as nats.go's Consume does: it asks again when half
// has been handled, takes back the credit the server returns with a 408 or
// 409 status (Nats-Pending-Messages), and pulls afresh, reporting
// ErrNoHeartbeat, when neither a message nor an idle heartbeat arrives for
// two to three heartbeat intervals (silence is sampled once per interval,
// so that a message costs no timer reset; a frame part-way read whose
// bytes still arrive is not silence, as a heartbeat would wait behind it).
// Conn.LastRead tells when bytes last came, for a caller that would take
// an unanswered PING for a dead connection. Msg settles a message (Ack, Nak,
// NakWithDelay, InProgress, Term, TermWithReason) with the payloads
// JetStream expects, on the connection that delivered it while that is
// open, after that through Options.Settle if set (jetsink passes its
// nats.go connection's Publish, which reconnects, so that a message
// outlives the connection that delivered it); AckAll acks many messages
// under one lock per connection. *Msg satisfies jetsink's pipeline.Msg.
//
// # What it does not do
//
// It never reconnects: when the connection fails (read or write error,
// -ERR, unanswered pings; a ping interval in which a frame part-way read
// came on counts neither way) every Sub ends with an error wrapping
// ErrConnectionClosed and the caller dials again. It subscribes to nothing
// but its pull inboxes, speaks no JetStream API but the pull (streams and
// consumers are created and inspected with nats.go), follows no cluster
// INFO updates, lame duck mode or leader changes beyond taking back the
// credit of a 409 Leadership Change, and supports neither websocket URLs
// nor servers that want the TLS handshake before INFO.
//
// # Goroutines
//
// A Conn owns a reader (parses the protocol, answers PINGs, hands messages
// to the Subs), a flusher (writes the buffered output when woken, so many
// settlements share one write) and a pinger. Each Sub owns a delivery
// goroutine that runs its handler and onErr, so a slow handler never keeps
// the reader from answering PINGs; Drain writes its UNSUB from one more,
// short-lived, which the delivery goroutine waits for (so Drain never waits
// for a write under way). Close ends the Conn's goroutines and waits for
// them; each Sub's goroutines end on Stop, after Drain, on a terminal
// status, or when the connection ends, and Closed tells. Conn, Sub and Msg
// methods are safe for concurrent use.
//
// # One allocation per message
//
// A delivered message costs exactly one allocation: a []byte whose start
// is the Msg struct (it has no pointer fields; its Conn is found through a
// registry) followed by the subject, reply, header block and payload,
// which Subject, Reply, Data, HeaderGet and HeaderFields return as strings
// and slices aliasing it (unsafe.String). The bytes are never modified.
// Headers are looked up in the raw block, never decoded into a map. The
// one object without pointers is cheap for the garbage collector, and the
// handler receives it on the goroutine that will settle it.
//
// Frames larger than 64 MiB, the largest max_payload a server allows (plus
// a little header slack), and malformed frames close the connection with
// ErrProtocol; the parser never panics on any input.
package wire

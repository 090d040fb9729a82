// Package consumer is jetsink's only contact with NATS: it connects, makes
// sure the JetStream stream and the durable pull consumer exist, pulls
// messages continuously into ring #1 (a ringq.Dispatch keyed by subject), and
// parks events that can never be stored on the dead-letter subject.
//
// # Flow
//
// New validates the Config, connects (reconnecting forever with capped
// backoff; a connection whose server left two pings 20 s apart unanswered
// is given up as stale and reconnected), creates or binds the stream and creates or updates the durable
// consumer (explicit acks, nats.ack_wait, no MaxDeliver of its own (see
// below), nats.max_ack_pending, nats.filter_subject; a durable of another
// kind, with another ack policy or a push consumer, which no update can
// change, it refuses as a bad nats.consumer; one whose replay policy is
// original it keeps, and warns that a backlog drains no faster than it
// was published). Run pulls with
// consumer/wire on a connection of its own (nats.pull_client "wire", the
// default; its messages are acked over that connection while it is open,
// a committed batch's in one write (Consumer.AckAll, for
// sink.Sink.SetAckAll), and through nats.go's connection after, for a day
// after it closed; later JetStream delivers them again) or nats.go's
// Consume:
// up to nats.pull_max_messages (and optionally nats.pull_max_bytes per
// pull) requested, a new pull sent when half are taken, idle heartbeats
// from the server. Each message (but the subject delete markers JetStream
// stores itself and the message schedules (a non-empty Nats-Schedule
// header, while nats.go's server is 2.12 or later: before, the header
// means nothing and the message is an event) whose fired copies are the events, which are acked and counted (Stats.Markers,
// Stats.Schedules), and one delivered without its body by a
// consumer someone made headers-only, which is nak'ed while the
// configuration is applied again) becomes a pipeline.Event (one reply-subject
// parse; Data aliases the client's buffer; Header is nats.go's map, or nil
// for a wire message, whose raw headers pipeline.RawHeader reads) pushed into the
// dispatch, which blocks while the worker's ring is
// full: that is where back-pressure reaches JetStream, which keeps the backlog
// on disk. The consumer acks no event; the sink does, after COMMIT.
//
// With the wire client, nats.max_in_flight_bytes bounds the same chain in
// bytes (wire.Budget): each message holds its bytes from when the Sub
// hands it on until a final settlement (ack, term, nak) or
// pipeline.Event.End, which whoever decides its fate calls (a message not
// settled because its stream was replaced is released there); the Sub
// pulls only while the budget has room for the largest message.
//
// # Instances of one durable
//
// Instances sharing nats.consumer share its events, each event delivered
// to one of them. Two writing to two destinations (Config.Destination:
// the wiring names the PostgreSQL server, database and table) would each
// get only some of the stream's events, with nothing failing. So each
// records its destination in the durable's metadata (jetsink_destination)
// when it applies its configuration (New, and Run when it makes the
// consumer again), warning first when the record names another, and each
// look at the consumer while it runs (every 10 s) does the same: while
// two such instances run both keep warning; once one has gone the other
// stops. Check reports such a record as a warning (a move to a new
// destination, the old instances stopped, shows it until run records the
// new one). Other jetsinks' filters are kept for a while (filterKey).
//
// # max_deliver
//
// jetsink tries to store an event nats.max_deliver times (every delivery
// counts, also those jetsink nak'ed itself), and enforces that limit
// itself: the durable consumer's MaxDeliver is unlimited. Run marks a
// delivery whose count is past nats.max_deliver (pipeline.Event.Exhausted);
// the worker that takes it hands it, undecoded, to DeadLetter (stage
// "deliver", code "max_deliver", or, through pipeline.Causes, the cause of
// an earlier letter of it that failed), which publishes it to the dead-letter
// subject and terminates it, as any dead letter. If that dead letter
// fails, the event is nak'ed with a delay and comes back, marked again, as
// often as it takes; an event whose tries ran out while no jetsink was
// running stays in the stream and is dead-lettered when one is back.
//
// So the server never gives up on an event: it raises no MAX_DELIVERIES
// advisory for jetsink's consumer, and nothing depends on hearing one. (A
// server-side limit did: the server raises that advisory once and keeps no
// copy, so an event it gave up on while no jetsink was subscribed was
// neither stored nor dead-lettered.) Left: a delivery jetsink still holds
// past ack_wait (a stall InProgress did not cover) can be both stored,
// when its row commits later, and dead-lettered from a later delivery;
// and while the dead-letter subject cannot be written, events past
// nats.max_deliver keep coming back and, with enough of them, take up
// nats.max_ack_pending: jetsink then stalls rather than drop them.
//
// # A stream that restarts its sequence
//
// A stream deleted and re-created starts again at sequence 1, and an ack
// names a stream sequence, which the server matches by sequence alone. In
// exactly-once mode rows are also keyed by (stream, stream_seq), so a
// restarted stream's events would conflict with the old rows and be
// skipped as duplicates. So:
//   - with nats.create_stream, a missing stream is created with first_seq
//     past every message of the old stream this process was delivered
//     (their rows and acks may still be on their way) and, in exactly-once
//     mode, past the table's highest sequence for it (Config.StoredSeq);
//   - in exactly-once mode, before each subscription Run compares the
//     stream with the table and refuses (Refused wraps
//     ErrSequenceRestarted; /readyz reports it) a stream that ends below the
//     table's highest sequence, or that replaced the stream last accepted
//     and starts at or below the highest sequence stored or delivered. A
//     refused stream is marked in the consumer's metadata, so a restart
//     still refuses it after it has been refilled past the stored rows, and
//     `jetsink check` reports it. Run takes nothing from it and looks again
//     every 30 s; what it took before goes on to the table. Re-creating the
//     stream with first_seq past the stored rows, or pointing
//     postgres.table at a new table, ends the refusal. Meanwhile the
//     stream's own limits (max_age, max_msgs, max_bytes) still apply to
//     its events;
//   - in exactly-once mode, a session's first message, one whose consumer
//     sequence went back (a consumer created since), and one after a
//     disconnect wait while Run confirms the stream is the one it checked
//     (retrying while NATS or PostgreSQL is away; no InProgress is sent
//     meanwhile, so a wait past ack_wait brings a redelivery). If the
//     stream was replaced, the session ends and what the client holds of
//     the old stream goes with it (the new one may reuse its sequences);
//     the new stream is then checked like any other;
//   - in both modes, each session stamps its events with an epoch
//     (pipeline.Epochs, Event.Epoch), and a new epoch begins when the
//     stream is gone or replaced: before Run re-creates a missing stream
//     (or the consumer of a replaced one), when a session begins on a
//     stream created at another time than the last session's, when serve
//     finds the stream replaced (exactly-once: verify; both modes: recheck
//     after missed heartbeats; at-least-once: a look after each
//     reconnect), and, in at-least-once mode, when a session's consumer
//     sequence goes back. Each new epoch waits until no ack or term is
//     being sent and flushes those sent before, on both connections; from then on the sink does
//     not ack, and DeadLetter does not terminate, events of an earlier
//     epoch (their rows are written all the same; their dead letters,
//     which nothing would send again, are published until stored or the
//     hard stop, not nak'ed). An old ack would
//     otherwise settle the new stream's event with the same sequence. A
//     consumer re-created on the same stream starts no epoch when Run
//     re-creates it (no sequence is reused); one re-created by someone
//     else while a session runs does, in at-least-once mode, which costs
//     a redelivery of what is in flight. When serve finds the stream
//     replaced in at-least-once mode, the session drains what the client
//     holds (pushed, stale) instead of dropping it. Left open: the server
//     queues acks and pull requests apart, so an ack sent after a consumer
//     someone else re-created has delivered to this client, and before
//     the new epoch, can settle a new event.
//
// With nats.create_stream in exactly-once mode, New needs the table's
// highest sequence to create a missing stream: with PostgreSQL down then,
// it fails (and says so) rather than create a stream from 1. The checks
// need stream and consumer INFO on NATS and, for StoredSeq, SELECT on the
// table's key columns.
//
// Not detected: a stream deleted and re-created while no jetsink was
// running and refilled past the table's rows before the next start (or
// whose consumer, which carries the mark, was deleted); and, with several
// instances sharing the consumer, rows another instance still has on their
// way (each knows only its own deliveries).
//
// # Goroutines
//
// Run blocks on the caller's goroutine, supervising. The pushes happen on
// the delivery goroutine of the pull subscription (wire's or nats.go's),
// one message at a time; Run starts a new subscription only after the previous one's delivery
// goroutine has returned, so the dispatch has one producer at a time, and Run
// closes it before returning. Run also starts, and waits for on return, the
// goroutine that confirms the acks every second (below). nats.go's other
// goroutines (reader, flusher, pull loop, status watcher) and wire's
// (reader, flusher, pinger) end with the subscription and with the
// connection (Close). Nothing here outlives Close for long. Five waits
// are bounded rather than joined: Run's wait for the ack confirmer's last
// flush, and Close's for the connections, give up after abortBudget
// (250 ms; Run's after 25 ms once hard has ended, a hard stop giving all
// its stages 250 ms) when a write to a server that reads nothing holds a
// connection's lock (that flush or close then ends at writeTimeout, 10 s);
// once hard has ended, Run waits 100 ms at most for its own supervising
// goroutine, which asks nats.go about its connection and sends JetStream
// API requests, both of which wait for nats.go's lock (Run closes the
// dispatch and returns; that goroutine ends with the write, or at Close);
// the flush-then-abort of a wire connection dropped after nats.go's
// disconnect runs on its own for at most abortFlush; and a probe of the
// wire connection after missed heartbeats (probeWire) runs on its own
// until its PONG, until wireProbeTimeout (2 s) passes with nothing
// received (it then aborts the connection), or until the connection ends
// (Close): while a large message arrives slowly it waits on (as the
// connection's pinger does), which the server's write deadline and its
// own pings bound.
//
// # Shutdown
//
// Run takes two contexts. When intake ends, Run stops pulling, drains the
// messages already delivered to this client into the dispatch, closes it and
// returns nil; when hard ends, it gives up promptly (unpushed messages are
// redelivered by JetStream after ack_wait). Close(ctx) confirms that the
// server has read the acks and terms sent (a flush of each connection,
// waiting for one that is reconnecting: nats.go sends what it buffered
// meanwhile first, and closing it instead would drop that), then closes the
// connections; call it after Run and after the sink has settled its last
// batch. It waits while ctx has time (at most 10 s without a deadline) and,
// once ctx has ended, gives the connections 250 ms and closes them without
// waiting for a server that does not answer.
//
// # Pausing
//
// SetPullPause gives Run a pause to follow (the processor passes the
// sink's Away: PostgreSQL unreachable, the events held given back). When
// it holds, the session that pulls ends as at a shutdown's drain (what the
// pull client holds is pushed on, for the sink to give back; nothing more
// is pulled, and the server drops the open pull with its subscription), and
// Run waits for the pause's end, looking at nothing meanwhile (the
// sequence check may need PostgreSQL), before it re-creates what went
// away, checks the stream and pulls again. A pause is no fault: no
// resubscribe or missed heartbeat is counted, NotConsuming does not report
// it, and it is logged at Info once as it begins and once as it ends. An
// intake or hard end while paused returns at once.
//
// # Acks that may not have reached the server
//
// An ack is sent once the connection has taken it; nats.go buffers it
// while reconnecting, and both clients drop what a connection had written
// and the server had not read when that connection is lost. So the
// consumer counts the acks and terms handed over (AckAll, DeadLetter), and
// while Run runs it confirms them every second with a flush of each
// connection (a PING, answered after what was written before it). Those
// sent before a connection was lost and not confirmed before it, and those
// Close cannot confirm (with those of a batch that a write to a server
// that reads nothing keeps from being handed over), may not have reached
// the server: they are logged at
// Warn, counted in Stats.AcksUnconfirmed, and, at Close, reported by an
// error wrapping ErrAcksUnconfirmed. Their events are delivered again after
// ack_wait (a duplicate row in at-least-once mode) if they did not. The
// count is an upper bound: at a loss it takes all the acks sent since the
// last confirmation (a second's, or the whole outage's when the server went
// silent first) and those sent in the moment before nats.go tells of the
// disconnect, although some of them reached the server; at a Close that
// cannot confirm, a held batch's acks are counted although they may yet
// fail to be written (the sink then reports them too). A consumer leader
// change loses acks too, on a server that stays up: the old leader drops
// those it had queued or not yet replicated, and one sent while no server
// holds the ack subscription reaches no one. When a pull tells of one (409
// Leadership Change, either client) or the leader elected advisory does
// ($JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.<stream>.<durable>, which
// Run subscribes to on a clustered connection: under back-pressure no pull
// waits at the new leader, and no 409 comes), Run logs it once at Warn
// (those told within 1 s of it are the same change) and sends again the
// acks of the last 2 s (at most 4,096, kept by reply subject) at the first
// delivery after it, under that delivery's epoch only, and once more at
// the confirmer's next tick (Stats.AcksResent; an ack of a message already
// acked is a no-op); acks of that window it no longer holds, and all of
// them when no delivery comes within ack_wait of the change (the resend
// is then dropped: their events have come back by then), count in Stats.AcksMaybeLostAtLeaderChange, not among the
// acks that failed. Terms are not sent again. Deliveries the old leader held back are not
// acks lost: the new leader delivers them after ack_wait. A dead letter's
// term that fails in the client was never sent: it is counted apart, in
// Stats.TermErrors (its event comes back after ack_wait too). Once Close's
// final confirmation has gone through, it looks at the durable's ack
// floor: at or past the highest stream sequence delivered when acks were
// last put in doubt, every message they may have been for is acked or
// terminated (here or by another instance), and Stats.AcksSettled takes
// Stats.AcksUnconfirmed; otherwise (a floor below, no answer, a stream or
// consumer replaced since the start, a final confirmation given up on)
// it stays 0.
//
// # Concurrency
//
// DeadLetter (pipeline.DeadLetterer), Lag, Stats and Ready are safe from any
// goroutine; DeadLetter is called by many goroutines at once (the
// workers' dead-letter lanes, 16 each, and the sink's connections). Run must not run
// twice at the same time on one Consumer.
//
// # Errors
//
// Validate and New wrap ErrInvalidConfig for configuration mistakes (never
// quoting a password or credentials). New wraps ErrStreamNotFound when the
// stream is missing and nats.create_stream is false. DeadLetter wraps
// ErrDeadLetter when the publish failed, or was not tried because an
// earlier one got no answer and no probe has been stored since (the original was
// nak'ed with a delay, never acked or terminated); with
// pipeline.ErrStaleEpoch too when the original's stream was re-created
// and ctx ended before its letter could be stored, or the letter is over
// max_payload (nats.ErrMaxPayload too) or holds a header name nats.go
// cannot write (nats.ErrBadHeaderMsg too; a backstop: such names are left
// out of the letter). Run returns nil after a clean intake
// shutdown, and otherwise wraps the hard context's error, ringq.ErrClosed
// or jetstream.ErrConnectionClosed (with nats.ErrAuthorization or another
// refusal of the credentials when nats.go closed the connection for
// that). Close wraps ErrAcksUnconfirmed when acks
// may not have reached the server.
package consumer

package processor

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/telemetry"
)

// Lag is fetched at most this often, however often /metrics is scraped.
const (
	lagTTL     = 2 * time.Second
	lagTimeout = time.Second
)

// observe registers the observable instruments: counters read from the
// stages' Stats (nothing is added to the hot path for them), ring occupancy
// per ring, and the consumer's lag, cached for lagTTL. What a scrape
// fetches (the lag, the readiness checks) ends when fetches does, as well
// as with the callback's context: the Prometheus exporter calls it with
// context.TODO, which never ends, and the admin listener's shutdown waits
// for the scrape. A fetch cut short keeps the figures fetched before. The
// returned function unregisters them.
func (p *Processor) observe(fetches context.Context, h pipeline.Handoff) (func(), error) {
	m := p.metrics.Meter()
	var errs []error
	counterIn := func(name, desc, unit string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	counter := func(name, desc string) metric.Int64ObservableCounter { return counterIn(name, desc, "{event}") }
	gauge := func(name, desc, unit string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return g
	}
	received := counter("jetsink.events.received", "Events handed to the workers, each delivery once (not markers, schedules, or messages nak'ed before hand-on)")
	redelivered := counter("jetsink.events.redelivered", "Received messages that JetStream had delivered before")
	markers := counter("jetsink.events.markers", "Subject delete markers JetStream stored itself (subject_delete_marker_ttl): acked, no events")
	schedules := counter("jetsink.events.schedules", "Message schedules (a Nats-Schedule header): acked, no events; their fired copies are")
	deletedUnread := counter("jetsink.events.deleted_unread", "Events the stream deleted before the durable delivered them (its limits: max_age, max_msgs, max_bytes, max_msgs_per_subject, a message TTL; a purge or delete): lost to the table, logged at Error. Not counted under a filter, nor from gaps older than the start; each instance counts what it sees (aggregate with max)")
	committed := counter("jetsink.events.committed", "Events whose batch committed to PostgreSQL; in exactly-once mode also redeliveries of events already stored, which the INSERT skipped or a constraint refused (found stored by their key). Their acks go out after the commit: jetsink.ack.failures counts those that failed or were refused, jetsink.ack.stale the rows of a re-created stream, which are not acked")
	maxDelivered := counter("jetsink.events.max_delivered", "Events dead-lettered as max_deliver: delivered past nats.max_deliver (one whose earlier dead letter failed counts under that letter's cause)")
	dlFailed := counter("jetsink.dead_letter.failures", "Dead letters not stored: the publish failed, or was not tried while the dead-letter stream does not answer (a breaker holds the publishes back until a probe gets through). The event is nak'ed and comes back (after ack_wait if the nak fails too); one whose stream was re-created since it was taken is left alone, neither nak'ed nor terminated")
	possibleDups := counter("jetsink.events.possible_duplicates", "Rows sent again after a COMMIT with unknown outcome (at-least-once)")
	ackErrs := counter("jetsink.ack.failures", "Acks after commit, terms after a dead letter was stored, and naks of events given back while PostgreSQL was unreachable (jetsink.events.released), that failed in the client (say, nats.go's reconnect buffer full); acks and terms sent on a connection lost before a flush confirmed them (those of the last flush at shutdown are counted after the last scrape, in the exit's log line only); and every publish to $JS.ACK the server refused for want of permission: acks, terms, naks and InProgress alike. A message whose ack or term was lost comes back after ack_wait (a committed row a duplicate in at-least-once mode); one whose InProgress was refused may")
	acksResent := counterIn("jetsink.ack.resent", "Acks sent again after a consumer leader change (a stepdown, a server restart in a cluster), which loses acks sent around it: those of the last 2 s, at most 4,096, once the new leader delivers; an ack of a message already acked is a no-op", "{ack}")
	acksLeaderLost := counterIn("jetsink.ack.leader_change_lost", "Acks sent around a consumer leader change that could not be sent again (more than the 4,096 kept, or nothing delivered within ack_wait of the change): the server may have lost them, and their events come back after ack_wait (a duplicate row each in at-least-once mode); not counted in jetsink.ack.failures", "{ack}")
	staleSettles := counter("jetsink.ack.stale", "Messages not acked after commit, or not terminated after their dead letter was stored, because their stream was re-created since they were taken")
	miscounts := counterIn("jetsink.copy.miscounts",
		"COPYs that committed with a row count other than the rows sent, and exactly-once batches that committed with rows missing from the table (dead-lettered, code row_count)", "{statement}")
	uncounted := counter("jetsink.events.uncounted", "Rows sent in miscounted COPYs minus the rows the server counted, and rows missing after an exactly-once batch: rows that may be missing from the table")
	batches := counterIn("jetsink.batches.committed",
		"Transactions that committed a batch", "{batch}")
	retries := counterIn("jetsink.batch.retries",
		"Batch transactions that failed and were retried", "{attempt}")
	timeoutSplits := counterIn("jetsink.batch.timeout_splits",
		"Attempts of more than one row that a server timeout ended (statement_timeout, transaction_timeout, a cancel); each halved that connection's cap on rows per attempt", "{attempt}")
	bisectCopies := counterIn("jetsink.batch.bisect_copies",
		"Extra COPYs spent finding the rows the database refuses in a batch that failed", "{statement}")
	takenIntoHeld := counterIn("jetsink.batch.taken_into_held",
		"Batches taken into one retried while the database refuses a row that no commit has yet shown to be at fault, to bisect again with their rows", "{batch}")
	inProgressErrs := counterIn("jetsink.in_progress.failures",
		"Heartbeats (InProgress) that failed for messages waiting in the sink (a batch retried, or waiting for a committer) or for their dead letters; sent again at the next tick, but past ack_wait JetStream may deliver such a message again", "{message}")
	resubscribes := counterIn("jetsink.consumer.resubscribes",
		"Pull subscriptions started again, the consumer made again where needed, after one ended by itself (a consumer deleted, a pull refused) or for a consumer or stream gone or re-created, or its configuration changed on the server, or the stream unreadable after a reconnect; not after a lost connection alone (nats.go pulls on across a reconnect, the wire client on a new connection)", "{subscription}")
	heartbeatsMissed := counterIn("jetsink.consumer.heartbeats_missed",
		"Pulls whose idle heartbeats stopped coming (a server gone or stalled, a consumer lost); the consumer is then looked up, at most once every 5 s", "{pull}")
	epochs := counterIn("jetsink.consumer.epochs",
		"Streams or consumers replaced under events in flight: the events taken before are stored but not acked", "{epoch}")
	deadConns := counterIn("jetsink.postgres.dead_connections",
		"Connections to PostgreSQL given up because the server gave no sign of life for dead_connection_timeout", "{connection}")
	released := counter("jetsink.events.released", "Events given back to JetStream (nak'ed with a 2 s delay, for the durable's other instances to store) because PostgreSQL could not be reached for max(ack_wait, 30s); naks of theirs that failed count in jetsink.ack.failures")
	givenUp := counter("jetsink.events.given_up", "Rows a drain left unacked because the database refused them with an error the row or the table may cause, and nothing committed after to tell which; JetStream delivers them again after ack_wait")
	lettersWaiting := gauge("jetsink.dead_letter.waiting", "Events waiting in the workers' lanes for their dead letters to be stored (not counting one under way per lane): a dead-letter stream that answers slowly", "{event}")
	ring := gauge("jetsink.ring.occupancy", "Events waiting in a ring (in: consumer to worker, out: worker to sink)", "{event}")
	inFlight := gauge("jetsink.in_flight", "Bytes of the messages taken from JetStream whose fate is not yet settled (nats.max_in_flight_bytes bounds them; wire pull client)", "By")
	inFlightLimit := gauge("jetsink.in_flight.limit", "nats.max_in_flight_bytes as applied (0: no bound)", "By")
	pending := gauge("jetsink.consumer.pending", "Messages in the stream not yet delivered to the durable consumer", "{message}")
	ackPending := gauge("jetsink.consumer.ack_pending", "Messages delivered and not yet acked", "{message}")
	lagAge, err := m.Float64ObservableGauge("jetsink.consumer.lag.age",
		metric.WithDescription("Time since the server last told the pending and ack_pending figures (they keep their last value while it does not answer)"),
		metric.WithUnit("s"))
	errs = append(errs, err)
	attemptAge, err := m.Float64ObservableGauge("jetsink.batch.attempt.age",
		metric.WithDescription("How long the longest commit attempt under way has run, 0 when none runs: a batch waiting for a lock, or on a server that hangs, shows here before anything fails"),
		metric.WithUnit("s"))
	errs = append(errs, err)
	unreachable := gauge("jetsink.postgres.unreachable", "1 while PostgreSQL has not been reached for max(ack_wait, 30s): the events held here are given back and nothing is pulled until it answers; else 0", "")
	ready := gauge("jetsink.ready", "1 while a readiness check passes, 0 while it fails, by check (nats, postgres): what /readyz answers, checked at most every 2 s", "")
	spansExported := counterIn("jetsink.trace.spans.exported",
		"Sampled spans the collector took", "{span}")
	spansLost := counterIn("jetsink.trace.spans.lost",
		"Sampled spans not exported: the export queue was full (reason queue_full) or their export failed (export_failed)", "{span}")
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("metric instrument: %w", err)
		}
	}

	inAttrs := make([]metric.ObserveOption, h.N())
	outAttrs := make([]metric.ObserveOption, h.N())
	for i := range h.N() {
		w := attribute.String("worker", strconv.Itoa(i))
		inAttrs[i] = metric.WithAttributes(attribute.String("ring", "in"), w)
		outAttrs[i] = metric.WithAttributes(attribute.String("ring", "out"), w)
	}
	lag := &telemetry.Cached[consumer.Lag]{TTL: lagTTL, Timeout: lagTimeout, Fetch: p.consumer.Lag}
	checks := p.readiness()
	readyAttrs := make(map[string]metric.ObserveOption, len(checks))
	for name := range checks {
		readyAttrs[name] = metric.WithAttributes(attribute.String("check", name))
	}
	readiness := readinessCache(fetches, checks)
	queueFull := metric.WithAttributes(attribute.String("reason", "queue_full"))
	exportFailed := metric.WithAttributes(attribute.String("reason", "export_failed"))
	reg, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := within(ctx, fetches)
		defer cancel()
		cs, ss, ps := p.consumer.Stats(), p.sink.Stats(), p.pipeline.Stats()
		o.ObserveInt64(received, int64(cs.Received))
		o.ObserveInt64(redelivered, int64(cs.Redelivered))
		o.ObserveInt64(markers, int64(cs.Markers))
		o.ObserveInt64(schedules, int64(cs.Schedules))
		o.ObserveInt64(deletedUnread, int64(cs.DeletedUnread))
		o.ObserveInt64(maxDelivered, int64(cs.MaxDelivered))
		o.ObserveInt64(dlFailed, int64(cs.DeadLetterFailed))
		o.ObserveInt64(resubscribes, int64(cs.Resubscribes))
		o.ObserveInt64(heartbeatsMissed, int64(cs.HeartbeatsMissing))
		o.ObserveInt64(epochs, int64(cs.Epochs))
		o.ObserveInt64(committed, int64(ss.Rows))
		o.ObserveInt64(possibleDups, int64(ss.PossibleDuplicates))
		o.ObserveInt64(ackErrs, int64(ackFailures(cs, ss)))
		o.ObserveInt64(staleSettles, int64(ss.StaleAcks+cs.StaleTerms))
		o.ObserveInt64(acksResent, int64(cs.AcksResent))
		o.ObserveInt64(acksLeaderLost, int64(cs.AcksMaybeLostAtLeaderChange))
		o.ObserveInt64(miscounts, int64(ss.Miscounts))
		o.ObserveInt64(uncounted, int64(ss.Uncounted))
		o.ObserveInt64(batches, int64(ss.Batches))
		o.ObserveInt64(retries, int64(ss.Retries))
		o.ObserveInt64(deadConns, int64(ss.DeadConnections))
		o.ObserveInt64(timeoutSplits, int64(ss.TimeoutSplits))
		o.ObserveInt64(bisectCopies, int64(ss.BisectCopies))
		o.ObserveInt64(takenIntoHeld, int64(ss.TakenIntoHeld))
		o.ObserveInt64(inProgressErrs, int64(ss.InProgressErrors+ps.LetterInProgressErrors))
		o.ObserveInt64(lettersWaiting, ps.LettersWaiting)
		o.ObserveInt64(givenUp, int64(ss.GivenUp))
		o.ObserveInt64(released, int64(ss.Released))
		away, _ := p.sink.Away()
		o.ObserveInt64(unreachable, boolInt(away))
		o.ObserveFloat64(attemptAge, p.sink.OldestAttempt().Seconds())
		held, limit := p.consumer.InFlightBytes()
		o.ObserveInt64(inFlight, held)
		o.ObserveInt64(inFlightLimit, limit)
		for i := range h.N() {
			o.ObserveInt64(ring, int64(h.InLen(i)), inAttrs[i])
			o.ObserveInt64(ring, int64(h.OutLen(i)), outAttrs[i])
		}
		// The last figures the server gave, while it does not answer
		// (an alert on them must not go quiet in a NATS outage); their
		// age says how old they are.
		if l, at, _ := lag.Get(ctx); !at.IsZero() {
			o.ObserveInt64(pending, int64(l.NumPending))
			o.ObserveInt64(ackPending, int64(l.NumAckPending))
			o.ObserveFloat64(lagAge, time.Since(at).Seconds())
		}
		results, _, _ := readiness.Get(ctx)
		for name, err := range results {
			o.ObserveInt64(ready, boolInt(err == nil), readyAttrs[name])
		}
		if p.tracing.Enabled() {
			st := p.tracing.SpanStats()
			o.ObserveInt64(spansExported, int64(st.Exported))
			o.ObserveInt64(spansLost, int64(st.Dropped), queueFull)
			o.ObserveInt64(spansLost, int64(st.ExportFailed), exportFailed)
		}
		return nil
	}, received, redelivered, markers, schedules, deletedUnread, committed, maxDelivered, dlFailed, resubscribes, heartbeatsMissed, epochs, possibleDups, ackErrs, acksResent, acksLeaderLost, staleSettles, miscounts, uncounted, batches, retries, deadConns, timeoutSplits, bisectCopies, takenIntoHeld, inProgressErrs, lettersWaiting, givenUp, released, ring, inFlight, inFlightLimit, pending, ackPending,
		lagAge, attemptAge, unreachable, ready, spansExported, spansLost)
	if err != nil {
		return nil, fmt.Errorf("metric callback: %w", err)
	}
	return func() { _ = reg.Unregister() }, nil
}

// readinessCache runs checks for the jetsink_ready gauge, at most every
// lagTTL. A run that fetches cut short (the listener stopping, a second
// signal) fails as a whole, so that the gauge keeps what the checks
// answered before rather than report them failing for that.
func readinessCache(fetches context.Context, checks map[string]telemetry.Check) *telemetry.Cached[map[string]error] {
	return &telemetry.Cached[map[string]error]{TTL: lagTTL, Timeout: time.Duration(len(checks)) * telemetry.CheckTimeout,
		Fetch: func(ctx context.Context) (map[string]error, error) {
			results := telemetry.RunChecks(ctx, checks, telemetry.CheckTimeout)
			if err := fetches.Err(); err != nil {
				return nil, fmt.Errorf("readiness checks cut short: %w", err)
			}
			return results, nil
		}}
}

// within is ctx, ended also when fetches ends. Call cancel when done.
func within(ctx, fetches context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(fetches, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// boolInt is 1 for true, 0 for false.
func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// ackFailures is jetsink_ack_failures_total: the acks (sink) and dead
// letters' terms (consumer) that failed in the client, and the naks of
// events given back while PostgreSQL was unreachable (sink) that did; the
// acks and terms a lost connection may have taken, and the publishes to
// $JS.ACK the server refused. Each event among them comes back after
// ack_wait, or may.
func ackFailures(cs consumer.Stats, ss sink.Stats) uint64 {
	return ss.AckErrors + ss.ReleaseErrors + cs.TermErrors + cs.AcksUnconfirmed + cs.AcksRefused
}

package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Servers' clocks. A run's figures subtract timestamps of three clocks:
// the bench host's (the schedule, the engine's start, the acks, jetsink's
// received_at), PostgreSQL's (committed_at, pg_xact_commit_timestamp) and
// nats-server's (a message's stored time, published_at). On the embedded
// servers the three are one, the host's; a configured server's may be
// off by any amount, and each figure that subtracts the host's time from
// a server's would be off by as much (a PostgreSQL 5 s ahead made a
// 21,000 events/s drain read 3,400, and its p50 5.7 s). So before and
// after each engine's run the bench estimates each server's offset, and
// every server timestamp is taken less its server's offset.

// clockProbes is how many round trips an estimate takes: the shortest
// one counts.
const clockProbes = 5

// clockWarn is the offset above which the text report warns.
const clockWarn = time.Millisecond

// clockProbe reads a server's clock once: server is its reading, taken at
// some time between sent and back on the host's clock (both read with
// time.Now, so that they carry the monotonic clock).
type clockProbe func(ctx context.Context) (server, sent, back time.Time, err error)

// clockOffset is a server's clock less the host's: the server's reading
// taken at the middle of its round trip, give or take Uncertainty (half
// the round trip, plus half the drift between two estimates).
type clockOffset struct {
	Offset      time.Duration
	Uncertainty time.Duration
}

// estimateOffset probes a server's clock clockProbes times and keeps the
// estimate of the shortest round trip. It returns probe's error.
func estimateOffset(ctx context.Context, probe clockProbe) (clockOffset, error) {
	var best clockOffset
	for i := range clockProbes {
		server, sent, back, err := probe(ctx)
		if err != nil {
			return clockOffset{}, err
		}
		rtt := max(back.Sub(sent), 0)
		// server has no monotonic reading: Sub compares wall clocks.
		o := clockOffset{Offset: server.Sub(sent.Add(rtt / 2)), Uncertainty: rtt / 2}
		if i == 0 || o.Uncertainty < best.Uncertainty {
			best = o
		}
	}
	return best, nil
}

// over is the offset over a run from the estimates before and after it:
// their mean, as uncertain as the less certain one plus half their drift.
func over(before, after clockOffset) clockOffset {
	drift := after.Offset - before.Offset
	return clockOffset{Offset: before.Offset + drift/2,
		Uncertainty: max(before.Uncertainty, after.Uncertainty) + max(drift, -drift)/2}
}

// clocks are PostgreSQL's and nats-server's offsets from the host's clock.
type clocks struct {
	pg, nats clockOffset
}

// over is the offsets over a run, c before it and after after it.
func (c clocks) over(after clocks) clocks {
	return clocks{pg: over(c.pg, after.pg), nats: over(c.nats, after.nats)}
}

// clocks estimates both servers' offsets.
func (b *bencher) clocks(ctx context.Context) (clocks, error) {
	pgNow, natsNow := b.pgNow, b.natsNow
	if pgNow == nil {
		pgNow = b.pgClock
	}
	if natsNow == nil {
		natsNow = b.natsClock
	}
	var c clocks
	var err error
	if c.pg, err = estimateOffset(ctx, pgNow); err != nil {
		return c, fmt.Errorf("bench: read PostgreSQL's clock: %w", err)
	}
	if c.nats, err = estimateOffset(ctx, natsNow); err != nil {
		return c, fmt.Errorf("bench: read nats-server's clock: %w", err)
	}
	return c, nil
}

// pgClock reads PostgreSQL's clock_timestamp(), the clock of committed_at
// and of commit timestamps.
func (b *bencher) pgClock(ctx context.Context) (server, sent, back time.Time, err error) {
	sent = time.Now()
	err = b.db.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&server)
	back = time.Now()
	return server, sent, back, err
}

// natsClock publishes a message to a stream of the bench's own (made on
// first use, in memory, holding one message) and reads the time
// nats-server stored it at, the clock of a message's metadata timestamp:
// stored between the publish and its PubAck.
func (b *bencher) natsClock(ctx context.Context) (server, sent, back time.Time, err error) {
	name, subject := "BENCH_"+b.id+"_CLOCK", "bench"+b.id+"_clock"
	if !b.clockStream {
		if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject},
			Storage: jetstream.MemoryStorage, MaxMsgs: 1}); err != nil {
			return server, sent, back, fmt.Errorf("create stream %s: %w", name, err)
		}
		b.clockStream = true
	}
	sent = time.Now()
	ack, err := b.js.Publish(ctx, subject, nil)
	back = time.Now()
	if err != nil {
		return server, sent, back, err
	}
	s, err := b.js.Stream(ctx, name)
	if err != nil {
		return server, sent, back, err
	}
	m, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		return server, sent, back, err
	}
	return m.Time, sent, back, nil
}

// deleteClockStream removes the stream natsClock made, if it did.
func (b *bencher) deleteClockStream() {
	if b.clockStream {
		b.deleteStream("BENCH_" + b.id + "_CLOCK")
	}
}

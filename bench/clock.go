package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
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
// the round trip, plus half the drift between two estimates). RTT is the
// round trip it was read in (the longer of two estimates'). Unknown says
// the server's clock could not be read: Offset is 0, and the figures
// that subtract its timestamps from the host's are uncorrected for it.
type clockOffset struct {
	Offset      time.Duration
	Uncertainty time.Duration
	RTT         time.Duration
	Unknown     bool
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
		o := clockOffset{Offset: server.Sub(sent.Add(rtt / 2)), Uncertainty: rtt / 2, RTT: rtt}
		if i == 0 || o.Uncertainty < best.Uncertainty {
			best = o
		}
	}
	return best, nil
}

// over is the offset over a run from the estimates before and after it:
// their mean, as uncertain as the less certain one plus half their drift.
// When one of them is unknown it is the other (unknown when both are).
func over(before, after clockOffset) clockOffset {
	switch {
	case before.Unknown:
		return after
	case after.Unknown:
		return before
	}
	drift := after.Offset - before.Offset
	return clockOffset{Offset: before.Offset + drift/2,
		Uncertainty: max(before.Uncertainty, after.Uncertainty) + max(drift, -drift)/2,
		RTT:         max(before.RTT, after.RTT)}
}

// clocks are PostgreSQL's and nats-server's offsets from the host's clock.
type clocks struct {
	pg, nats clockOffset
}

// over is the offsets over a run, c before it and after after it.
func (c clocks) over(after clocks) clocks {
	return clocks{pg: over(c.pg, after.pg), nats: over(c.nats, after.nats)}
}

// clocks estimates both servers' offsets. A server whose clock it cannot
// read (a probe failed: a query refused, an account that takes no more
// streams) it says so of on stderr and marks Unknown: a run's figures
// are not worth less for it than before the bench corrected for clocks,
// and a finished run is not thrown away for it.
func (b *bencher) clocks(ctx context.Context) clocks {
	pgNow, natsNow := b.pgNow, b.natsNow
	if pgNow == nil {
		pgNow = b.pgClock
	}
	if natsNow == nil {
		natsNow = b.natsClock
	}
	var c clocks
	for _, s := range []struct {
		name  string
		probe clockProbe
		o     *clockOffset
	}{{"PostgreSQL", pgNow, &c.pg}, {"nats-server", natsNow, &c.nats}} {
		o, err := estimateOffset(ctx, s.probe)
		if err != nil {
			o = clockOffset{Unknown: true}
			if ctx.Err() == nil && b.say != nil { // a run being stopped has other things to say
				b.say("could not read %s's clock (%v): this estimate of its offset from this host's is left out "+
					"(with neither the one before nor the one after the run, the run's figures are uncorrected for it)", s.name, err)
			}
		}
		*s.o = o
	}
	b.deleteClockStream(false)
	return c
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
// an estimate's first probe, in a file as the bench's other streams, an
// account that allows no memory storage being able to hold it, and
// deleted after the estimate, so that it holds no stream of the account's
// limit during a run) and reads the time nats-server stored it at, the
// clock of a message's metadata timestamp: stored between the publish and
// its PubAck.
func (b *bencher) natsClock(ctx context.Context) (server, sent, back time.Time, err error) {
	name, subject := b.clockStreamName(), "bench"+b.id+"_clock"
	if !b.clockStream {
		b.clockStream = true // deleteClockStream tries, whatever the answer: a lost reply may hide a stream made
		// consumer.CreateStream: made again just after the delete, it may
		// be refused once by a race in nats-server, which it tries again.
		if _, err := consumer.CreateStream(ctx, b.js, jetstream.StreamConfig{Name: name, Subjects: []string{subject},
			Storage: jetstream.FileStorage, MaxMsgs: 1}); err != nil {
			return server, sent, back, fmt.Errorf("create stream %s: %w", name, err)
		}
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

func (b *bencher) clockStreamName() string { return "BENCH_" + b.id + "_CLOCK" }

// deleteClockStream removes the stream natsClock made, if it may have
// made one; it stays to be deleted again (at the end of Run) when the
// server does not say it is gone, and Run's last try says so when it
// fails (last): the stream would hold one of the account's streams.
func (b *bencher) deleteClockStream(last bool) {
	if !b.clockStream {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := b.js.DeleteStream(ctx, b.clockStreamName())
	if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
		b.clockStream = false
	} else if last && b.say != nil {
		b.say("could not delete the clock probe's stream %s (%v): delete it by hand (nats stream rm %s)", b.clockStreamName(), err, b.clockStreamName())
	}
}

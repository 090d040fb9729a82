package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// A hard stop (a second signal, drain_timeout) while NATS reads nothing:
// Run returns hard's error at once, although a committer is held in its
// acks' write (under the wire connection's lock, until its 10 s write
// timeout), and what comes after it (CloseStages, Shutdown) is bounded
// too. Before, Run waited for that write: 10 s, then as long again on
// nats.go's connection, past the ~2.5 s a cut-short stop promises (and
// with drain_timeout 30 s, past the 45 s grace that compose and Kubernetes
// are told to give: SIGKILL, exit 137).
func TestHardStopDoesNotWaitForAStuckAck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEnv(t)
	e.createStreams(ctx)
	proxy := testenv.NewGateProxy(t, strings.TrimPrefix(e.nats.URL(), "nats://"))

	// Their acks (~300 bytes each, with a consumer's name as long as
	// JetStream takes) are more than the sockets between jetsink and the
	// frozen proxy hold, with the committers' batches besides: jetsink's
	// send buffer grows to net.ipv4.tcp_wmem's maximum at most (4 MiB by
	// default), the proxy's receive buffer is pinned (testenv asks 256 KiB;
	// Linux gives up to twice that, capped by net.core.rmem_max: 512 KiB
	// where the cap is 4 MiB, 416 KiB where it is 212992) and it holds one
	// read (32 KiB): ~16,000 acks. Runs saw 200 to 20,000 rows committed
	// (the InProgress of the events waiting can fill the sockets first).
	// So that few events do: a test under -race publishes slowly.
	const events = 30_000
	cfg := e.config(sink.AtLeastOnce)
	cfg.NATS.URL = proxy.URL()
	cfg.NATS.Consumer = "jetsink_" + strings.Repeat("x", 200)
	cfg.NATS.MaxInFlightBytes = 256 << 20
	cfg.NATS.MaxAckPending = 2 * events
	cfg.Pipeline.RingSize = 32768 // the rings hold them all while the table is locked
	// The freeze silences the pull's heartbeats too. With the default 1 s,
	// two silent ticks have the consumer probe the wire connection and, no
	// PONG for 2 s later, drop it: that ends the ack write held here, and
	// acks go on nats.go's connection, whose lock holds the consumer's way
	// out instead. 15 s, the most the default pull_expiry allows, puts the
	// first missed heartbeat 15 s or more after the freeze (checked at the
	// stop).
	cfg.NATS.PullHeartbeat = 15 * time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := processor.New(ctx, cfg, log)
	if err != nil {
		t.Fatalf("processor.New: %v", err)
	}
	intake, stopIntake := context.WithCancel(ctx)
	hard, stopHard := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- p.Run(intake, hard) }()
	t.Cleanup(func() {
		stopIntake()
		stopHard()
		<-done
		proxy.Cut() // ends the writes it held
		p.Close()
	})

	tx := e.lockTable(ctx, e.pg.Conn(t), "ACCESS EXCLUSIVE")
	e.publish(ctx, 0, events, 4)
	waitFor(t, ctx, "jetsink to take the events in", func() (bool, string) {
		n := p.Consumer().Stats().Received
		return n >= events, fmt.Sprintf("%d received", n)
	})
	logged, missed := len(logs.String()), p.Consumer().Stats().HeartbeatsMissing
	proxy.Freeze()
	frozen := time.Now()
	if err := tx.Rollback(ctx); err != nil { // the rows commit, and their acks fill the sockets
		t.Fatal(err)
	}
	// Until the commits stop: the committers are held by the write of
	// their acks (or have committed everything, which the log tells
	// below). Two quiet seconds in a row: one COPY and COMMIT can take
	// more than a second on a loaded machine.
	for last, quiet := int64(-1), 0; quiet < 2; {
		select {
		case err := <-done:
			t.Fatalf("Run returned before the stop: %v", err)
		case <-time.After(time.Second):
		}
		n := e.rows(ctx)
		if n == events {
			break
		}
		if n == last {
			quiet++
		} else {
			quiet = 0
		}
		last = n
	}
	// A heartbeat missed since the freeze is the probe's start: the stop
	// would come too late to find the ack write held (see PullHeartbeat).
	if n, after := p.Consumer().Stats().HeartbeatsMissing, logs.String()[logged:]; n > missed || strings.Contains(after, "dropping it") {
		t.Fatalf("the stop comes after pull heartbeats were missed in the freeze (%d), and the consumer probes or drops "+
			"the wire connection, ending the ack write this test holds; raise nats.pull_heartbeat (%s) or "+
			"make the wait shorter; log:\n%s", n-missed, cfg.NATS.PullHeartbeat, logs.String())
	}

	stopIntake()
	stopHard() // a second signal
	start := time.Now()
	select {
	case err = <-done:
		done <- err // for Cleanup
	case <-time.After(6 * time.Second):
		t.Fatalf("Run still runs 6 s after hard's end (it waits for an ack that NATS does not read); log:\n%s", logs.String())
	}
	ran := time.Since(start)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want hard's error (context.Canceled)", err)
	}
	held := regexp.MustCompile(`not waiting any longer for stages still running.* stages=(\S*)`).FindStringSubmatch(logs.String())
	if held == nil || !slices.Contains(strings.Split(held[1], ","), "sink") {
		t.Fatalf("no Warn naming the sink as held (did the acks fill the sockets? %d of %d rows committed); log:\n%s",
			e.rows(ctx), events, logs.String())
	}
	// The consumer is held by nothing: the acks' write holds the wire
	// connection's lock, which nothing on its way out waits for (Drain's
	// UNSUB waits for it on a goroutine of its own). So it returns at
	// hard's end, normally microseconds after it, not by its fallback, a
	// timer (hardRunWait, 100 ms) that stands in when nats.go's connection
	// holds it. But a machine that stalls the process longer than that
	// wakes with both ready, and the timer may win (the hard stop then
	// names the consumer too, past its 250 ms): neither tells the fix from
	// the bug. Seconds do: the bug holds the consumer's own goroutine until
	// the held write ends, at its 10 s timeout (it began before the quiet
	// seconds above) or the proxy's cut (Cleanup); the fix lets it end at
	// once. Checked before CloseStages, whose Close of the wire connection
	// ends the write.
	named := strings.Split(held[1], ",")
	if others := slices.DeleteFunc(slices.Clone(named), func(s string) bool { return s == "sink" || s == "consumer" }); len(others) > 0 {
		t.Errorf("the hard stop gave up waiting for stages=%s, want the sink (and at most the consumer, see below); log:\n%s",
			held[1], logs.String())
	}
	quit, stopQuit := context.WithTimeout(ctx, 2*time.Second)
	defer stopQuit()
	waitFor(t, quit, "the consumer's goroutine to end after Run returned", func() (bool, string) {
		return !goroutineIn("jetsink/consumer.(*Consumer).run("), "a goroutine still in consumer.(*Consumer).run: " +
			"something on its way out waits for the wire connection the acks' write holds"
	})
	if slices.Contains(named, "consumer") || strings.Contains(logs.String(), "not waiting for the consumer's supervision") {
		t.Logf("the consumer returned by its timer (stages=%s), but its goroutine ended within 2 s: the process was stalled, not the consumer held", held[1])
	}
	// What follows Run is bounded as well: cmd calls these next.
	closing := time.Now()
	if err := p.CloseStages(hard); err == nil {
		t.Errorf("CloseStages = nil, want the acks it could not confirm; log:\n%s", logs.String())
	}
	_ = p.Shutdown(hard)
	after := time.Since(closing)
	if d := ran + after; d > 9*time.Second {
		t.Errorf("Run, CloseStages and Shutdown took %v after hard's end (Run %v), want a few seconds", d, ran)
	}
	t.Logf("stopped %v after the freeze; Run returned %v after hard's end; CloseStages and Shutdown took %v; %d of %d rows committed",
		start.Sub(frozen), ran, after, e.rows(ctx), events)
}

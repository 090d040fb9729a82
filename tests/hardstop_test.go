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

	// Their acks are more than the sockets between jetsink and the frozen
	// proxy hold (up to 4 MiB sent, 6 MiB received; the proxy itself holds
	// one read, 32 KiB, per direction and then reads nothing): ~300 bytes
	// each, with a consumer's name as long as JetStream takes, so that few
	// events do (a test under -race publishes slowly).
	const events = 50_000
	cfg := e.config(sink.AtLeastOnce)
	cfg.NATS.URL = proxy.URL()
	cfg.NATS.Consumer = "jetsink_" + strings.Repeat("x", 200)
	cfg.NATS.MaxInFlightBytes = 256 << 20
	cfg.NATS.MaxAckPending = 2 * events
	cfg.Pipeline.RingSize = 32768 // the rings hold them all while the table is locked
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
	proxy.Freeze()
	if err := tx.Rollback(ctx); err != nil { // the rows commit, and their acks fill the sockets
		t.Fatal(err)
	}
	// Until the commits stop: the committers are held by the write of
	// their acks (or have committed everything, which the log tells below).
	for last := int64(-1); ; {
		select {
		case err := <-done:
			t.Fatalf("Run returned before the stop: %v", err)
		case <-time.After(time.Second):
		}
		n := e.rows(ctx)
		if n == last {
			break
		}
		last = n
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
	// The consumer is held by nothing (the acks' write holds the wire
	// connection's lock, which nothing on its way out waits for), and
	// returns within 100 ms of hard's end: within the 250 ms given, but not
	// by a margin a loaded machine always keeps, so it is only reported
	// here; consumer's TestRunReturnsOnHardWhileAWriteHoldsTheConnection and
	// wire's TestDrainDoesNotWaitForAWriteHoldingTheConnection check it.
	if held[1] != "sink" {
		t.Logf("the hard stop gave up waiting for stages=%s (the consumer should return at hard's end)", held[1])
	}
	// What follows Run is bounded as well: cmd calls these next.
	if err := p.CloseStages(hard); err == nil {
		t.Error("CloseStages = nil, want the acks it could not confirm")
	}
	_ = p.Shutdown(hard)
	if d := time.Since(start); d > 9*time.Second {
		t.Errorf("Run, CloseStages and Shutdown took %v after hard's end (Run %v), want a few seconds", d, ran)
	}
	t.Logf("Run returned %v after hard's end; CloseStages and Shutdown %v after it; %d of %d rows committed",
		ran, time.Since(start)-ran, e.rows(ctx), events)
}

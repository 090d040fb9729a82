package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

// closeSetup is a consumer of the test's own stream, connected to srv
// through a testenv.GateProxy with the pull client named, and logging to buf (nil:
// the test's log).
func closeSetup(t *testing.T, ctx context.Context, srv *testenv.NATSServer, client string, buf io.Writer, mods ...func(*Config)) (*Consumer, *testenv.GateProxy, Config) {
	t.Helper()
	p := testenv.NewGateProxy(t, strings.TrimPrefix(srv.URL(), "nats://"))
	cfg := testConfig(t, srv)
	cfg.URL = p.URL()
	cfg.PullClient = client
	for _, mod := range mods {
		mod(&cfg)
	}
	c, err := New(ctx, cfg, testLogger(t, buf))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, p, cfg
}

// closeScene is closeSetup, a Run under a hard context (stopRun ends it),
// and the messages of n events it took.
func closeScene(t *testing.T, ctx context.Context, srv *testenv.NATSServer, client string, buf io.Writer, n int, mods ...func(*Config)) (
	c *Consumer, p *testenv.GateProxy, cfg Config, ms []pipeline.Msg, stopRun func()) {
	t.Helper()
	c, p, cfg = closeSetup(t, ctx, srv, client, buf, mods...)
	r, stopRun := startHardRun(t, ctx, c)
	publish(t, ctx, jsFor(t, srv), cfg, n, 1, 0)
	return c, p, cfg, takeMsgs(t, ctx, r, n), stopRun
}

// ackedWhileCut is a closeScene whose connections to NATS are then cut:
// its 3 messages are acked while nats.go reconnects (the acks wait in its
// buffer) and its Run is ended.
func ackedWhileCut(t *testing.T, ctx context.Context, srv *testenv.NATSServer, client string, buf *syncBuffer) (*Consumer, *testenv.GateProxy, Config) {
	t.Helper()
	c, p, cfg, ms, stopRun := closeScene(t, ctx, srv, client, buf, 3)
	p.Cut()
	waitDisconnected(t, ctx, c, buf)
	ackAll(t, c, ms) // buffered for the reconnect
	stopRun()
	return c, p, cfg
}

// ackedWhileFrozen is a closeScene whose Run has ended and whose 3
// messages are then acked while the server reads nothing: the acks wait in
// the frozen connections.
func ackedWhileFrozen(t *testing.T, ctx context.Context, srv *testenv.NATSServer, client string, buf io.Writer, mods ...func(*Config)) (*Consumer, *testenv.GateProxy, Config) {
	t.Helper()
	c, p, cfg, ms, stopRun := closeScene(t, ctx, srv, client, buf, 3, mods...)
	stopRun() // no confirmation runs after Run
	p.Freeze()
	ackAll(t, c, ms)
	return c, p, cfg
}

// takeMsgs returns the messages of the next n events r pushes.
func takeMsgs(t *testing.T, ctx context.Context, r *runner, n int) []pipeline.Msg {
	t.Helper()
	var ms []pipeline.Msg
	for _, ev := range takeN(t, ctx, r, n) {
		ms = append(ms, ev.Msg)
	}
	return ms
}

// ackAll acks ms with c.AckAll, as the sink does, and fails the test if a
// connection refused one (a buffered ack is not refused).
func ackAll(t *testing.T, c *Consumer, ms []pipeline.Msg) {
	t.Helper()
	errs := make([]error, len(ms))
	c.AckAll(ms, errs)
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("AckAll: %v", err)
	}
}

// startHardRun is startRun under a hard context of its own, and the
// function that ends it and waits for Run to return. How Run ended does not
// matter to Close; ending it with hard spares the tests nats.go's drain of
// a subscription whose connection is down (10 s, DrainTimeout).
func startHardRun(t *testing.T, ctx context.Context, c *Consumer) (r *runner, stop func()) {
	t.Helper()
	hard, stopHard := context.WithCancel(ctx)
	t.Cleanup(stopHard)
	r = startRun(t, hard, c, 1, 16, 16)
	return r, func() {
		t.Helper()
		stopHard()
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return within 5s of hard ending")
		}
	}
}

// fillSocket runs write again and again on a goroutine of its own, until
// it fails or has run max times, and returns once the count has stopped
// growing for 300 ms: the socket takes no more and a write holds the
// connection's lock. The channel it returns is closed when the goroutine
// ends, once the test has freed the writer (p.Cut).
func fillSocket(write func() error, max int64) <-chan struct{} {
	var sent atomic.Int64
	filler := make(chan struct{})
	go func() {
		defer close(filler)
		for sent.Load() < max && write() == nil {
			sent.Add(1)
		}
	}()
	for last := int64(-1); ; {
		time.Sleep(300 * time.Millisecond)
		n := sent.Load()
		if n == last {
			break
		}
		last = n
	}
	return filler
}

// publishUntilFull is fillSocket publishing 1 KiB messages on nats.go's
// connection, 256 MiB at most, standing for the acks of many batches.
func publishUntilFull(c *Consumer) <-chan struct{} {
	payload := make([]byte, 1024)
	return fillSocket(func() error { return c.nc.Publish("filler.x", payload) }, 256<<10)
}

// waitConfirmerFlushing waits until the ack confirmer holds c.acks.mu, as
// it does while it flushes.
func waitConfirmerFlushing(t *testing.T, ctx context.Context, c *Consumer) {
	t.Helper()
	waitFor(t, ctx, "the ack confirmer flushing", func() bool {
		if c.acks.mu.TryLock() {
			c.acks.mu.Unlock()
			return false
		}
		return true
	})
}

// waitDisconnected waits until the consumer has noticed that its
// connections are down: nats.go reconnecting, the wire connection failed,
// and both losses recorded (nats.go's handler runs a moment after its
// status changes; acks sent meanwhile would count as in doubt).
func waitDisconnected(t *testing.T, ctx context.Context, c *Consumer, log *syncBuffer) {
	t.Helper()
	waitFor(t, ctx, "nats.go reconnecting and the wire connection gone", func() bool {
		wc := c.wc.Load()
		return !c.nc.IsConnected() && strings.Contains(log.String(), `msg="nats disconnected"`) &&
			(wc == nil || isDone(wc) && c.acks.lostWC.Load() == wc)
	})
}

// ackPending is the durable consumer's count of messages delivered and
// not acked, asked of srv directly (not through the proxy).
func ackPending(t *testing.T, ctx context.Context, srv *testenv.NATSServer, cfg Config) int {
	t.Helper()
	cons, err := jsFor(t, srv).Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	return cons.CachedInfo().NumAckPending
}

// Once its context has ended (a second signal: hard), or its deadline has
// passed (drain_timeout), Close returns within abortBudget or so even when
// the server hangs: it keeps the connections open and answers nothing, as
// a server stopped with SIGSTOP. Before, Close waited up to 10 s for the
// wire connection's flush and then up to 11 s for nats.go's Drain, whatever
// the caller's deadline, so a second signal did not end jetsink. The acks
// the server never confirmed are counted, not claimed.
func TestCloseBoundedWhileServerHangs(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		for _, tc := range []struct {
			name     string
			deadline time.Duration // 0: the context has ended before Close
		}{{"ended", 0}, {"deadline", 1500 * time.Millisecond}} {
			t.Run(client+"/"+tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				srv := testenv.NATS(t)
				var buf syncBuffer
				c, p, _, ms, stopRun := closeScene(t, ctx, srv, client, &buf, 3)

				p.Freeze()
				ackAll(t, c, ms)
				stopRun()

				var closeCtx context.Context
				var cancelClose context.CancelFunc
				if tc.deadline > 0 {
					closeCtx, cancelClose = context.WithTimeout(ctx, tc.deadline) // the drain's deadline
				} else {
					closeCtx, cancelClose = context.WithCancel(ctx)
					cancelClose() // a second signal: hard has ended
				}
				defer cancelClose()
				start := time.Now()
				err := c.Close(closeCtx)
				if took, limit := time.Since(start), tc.deadline+4*time.Second; took > limit { // 10-21 s before
					t.Fatalf("Close took %v while the server hung, want under %v (the caller's deadline and the abort budget)", took, limit)
				}
				if !errors.Is(err, ErrAcksUnconfirmed) {
					t.Fatalf("Close = %v, want ErrAcksUnconfirmed: the server never read the 3 acks", err)
				}
				if st := c.Stats(); st.AcksUnconfirmed != 3 {
					t.Fatalf("Stats.AcksUnconfirmed = %d, want 3", st.AcksUnconfirmed)
				}
				if !strings.Contains(buf.String(), "acks not confirmed by NATS at shutdown") {
					t.Fatalf("no warning about the unconfirmed acks in the log:\n%s", buf.String())
				}
			})
		}
	}
}

// Acks sent while the connection to NATS is down are buffered by nats.go
// for the reconnect: the wire connection, which carries the acks of its
// messages while it is open, fails with it, and they go through nats.go's
// connection after. Close waits, while its context has time, for the
// reconnect and a flush that confirms them. Before, its Drain closed the
// reconnecting connection at once, which dropped them without an error:
// the events were delivered again although the shutdown said acked.
func TestCloseWaitsForTheReconnectToConfirmAcks(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			var buf syncBuffer
			c, p, cfg := ackedWhileCut(t, ctx, srv, client, &buf)

			reopen := time.AfterFunc(300*time.Millisecond, p.Reopen)
			defer reopen.Stop()
			cctx, cancelClose := context.WithTimeout(ctx, 10*time.Second)
			defer cancelClose()
			if err := c.Close(cctx); err != nil {
				t.Fatalf("Close = %v, want nil: NATS came back within the deadline", err)
			}
			if st := c.Stats(); st.AcksUnconfirmed != 0 {
				t.Fatalf("Stats.AcksUnconfirmed = %d, want 0", st.AcksUnconfirmed)
			}
			// The server takes an ack in after it has read it; a dropped
			// one would leave the message pending until ack_wait (30 s).
			wctx, cancelWait := context.WithTimeout(ctx, 3*time.Second)
			defer cancelWait()
			waitFor(t, wctx, "the 3 acks to reach the server", func() bool { return ackPending(t, ctx, srv, cfg) == 0 })
		})
	}
}

// When the server cannot be reached before Close's deadline, the acks
// buffered for the reconnect are dropped with the connection: Close says
// so (ErrAcksUnconfirmed, Stats.AcksUnconfirmed, a warning) instead of
// returning as if they had been sent.
func TestCloseCountsAcksItCannotConfirm(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			var buf syncBuffer
			c, _, cfg := ackedWhileCut(t, ctx, srv, client, &buf)

			cctx, cancelClose := context.WithTimeout(ctx, time.Second)
			defer cancelClose()
			start := time.Now()
			err := c.Close(cctx)
			if took := time.Since(start); took > 5*time.Second { // closeWait, 10 s, when the context is ignored
				t.Fatalf("Close took %v, want about its 1s deadline", took)
			}
			if !errors.Is(err, ErrAcksUnconfirmed) {
				t.Fatalf("Close = %v, want ErrAcksUnconfirmed", err)
			}
			if st := c.Stats(); st.AcksUnconfirmed != 3 {
				t.Fatalf("Stats.AcksUnconfirmed = %d, want 3", st.AcksUnconfirmed)
			}
			if log := buf.String(); !strings.Contains(log, "acks not confirmed by NATS at shutdown") || !strings.Contains(log, "acks=3") {
				t.Fatalf("log:\n%s\nwant a warning that 3 acks were not confirmed", log)
			}
			if n := ackPending(t, ctx, srv, cfg); n != 3 {
				t.Fatalf("%d messages pending an ack on the server, want the 3 whose acks were dropped", n)
			}
		})
	}
}

// Acks written into a connection that is then lost may be lost with it
// (nats.go and wire alike drop what the server had not read): once the
// consumer has a connection again, its next confirmation counts them and
// says so, rather than let them pass for delivered.
func TestLostConnectionCountsItsUnconfirmedAcks(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			var buf syncBuffer
			c, p, cfg := closeSetup(t, ctx, srv, client, &buf)
			r := startRun(t, ctx, c, 1, 16, 16)
			publish(t, ctx, jsFor(t, srv), cfg, 3, 1, 0)
			ms := takeMsgs(t, ctx, r, 3)

			p.Freeze()
			ackAll(t, c, ms) // written, never read by the server
			p.Cut()
			p.Reopen()
			waitFor(t, ctx, "the acks counted as unconfirmed", func() bool { return c.Stats().AcksUnconfirmed == 3 })
			if !strings.Contains(buf.String(), "a connection to NATS was lost: acks sent before it may not have reached the server") {
				t.Fatalf("no warning about the acks in the log:\n%s", buf.String())
			}
			if n := ackPending(t, ctx, srv, cfg); n != 3 {
				t.Fatalf("%d messages pending an ack on the server, want the 3 whose acks were lost", n)
			}
			r.stopClean(t, ctx)
			cctx, cancelClose := context.WithTimeout(ctx, 5*time.Second)
			defer cancelClose()
			if err := c.Close(cctx); err != nil {
				t.Fatalf("Close = %v, want nil: nothing was sent since", err)
			}
			if st := c.Stats(); st.AcksUnconfirmed != 3 || st.AcksSettled != 0 {
				t.Fatalf("Stats.AcksUnconfirmed = %d, AcksSettled = %d after Close, want still 3, and 0: the acks were lost",
					st.AcksUnconfirmed, st.AcksSettled)
			}
		})
	}
}

// Acks a lost connection may have taken whose messages were acked since
// (here: they were lost, came back after ack_wait and were acked again;
// or they had reached the server after all) are shown settled at Close by
// the durable's ack floor: Stats.AcksSettled takes AcksUnconfirmed, and
// the drain can say every event was settled. Before, a connection lost
// once made every later drain warn of them.
func TestCloseShowsLostAcksSettledByTheAckFloor(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			c, p, cfg := closeSetup(t, ctx, srv, client, nil, func(cfg *Config) { cfg.AckWait = time.Second })
			r := startRun(t, ctx, c, 1, 16, 16)
			publish(t, ctx, jsFor(t, srv), cfg, 3, 1, 0)
			ms := takeMsgs(t, ctx, r, 3)
			p.Freeze()
			ackAll(t, c, ms) // written, never read by the server
			p.Cut()
			p.Reopen()
			waitFor(t, ctx, "the acks counted as unconfirmed", func() bool { return c.Stats().AcksUnconfirmed == 3 })
			ackAll(t, c, takeMsgs(t, ctx, r, 3)) // delivered again after ack_wait
			r.stopClean(t, ctx)
			cctx, cancelClose := context.WithTimeout(ctx, 10*time.Second)
			defer cancelClose()
			if err := c.Close(cctx); err != nil {
				t.Fatalf("Close = %v, want nil", err)
			}
			if st := c.Stats(); st.AcksUnconfirmed != 3 || st.AcksSettled != 3 {
				t.Fatalf("Stats.AcksUnconfirmed = %d, AcksSettled = %d after Close, want 3 and 3: the ack floor is past them",
					st.AcksUnconfirmed, st.AcksSettled)
			}
		})
	}
}

// Close confirms the acks sent since the last confirmation; when a
// connection they were written into was lost meanwhile, its flush on the
// new connection cannot vouch for them, so Close reports them although it
// reached the server.
func TestCloseCountsAcksOfALostConnection(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			var buf syncBuffer
			c, p, cfg := ackedWhileFrozen(t, ctx, srv, client, &buf) // Close's confirmation is the first
			p.Cut()                                                  // the acks go with the connections
			// No session is there to see the wire connection fail: Close
			// finds it failed.
			waitFor(t, ctx, "nats.go reconnecting and the wire connection gone", func() bool {
				wc := c.wc.Load()
				return !c.nc.IsConnected() && strings.Contains(buf.String(), `msg="nats disconnected"`) && (wc == nil || isDone(wc))
			})
			p.Reopen()
			cctx, cancelClose := context.WithTimeout(ctx, 10*time.Second)
			defer cancelClose()
			err := c.Close(cctx)
			// Counted and logged, not an error: the flush went through,
			// and a connection lost on the way is ordinary (a NATS restart).
			if err != nil || !strings.Contains(buf.String(), "lost shortly before shutdown") {
				t.Fatalf("Close = %v, want nil and a warning for acks a lost connection may have taken; log:\n%s", err, buf.String())
			}
			if st := c.Stats(); st.AcksUnconfirmed != 3 {
				t.Fatalf("Stats.AcksUnconfirmed = %d, want 3", st.AcksUnconfirmed)
			}
			if n := ackPending(t, ctx, srv, cfg); n != 3 {
				t.Fatalf("%d messages pending an ack on the server, want the 3 whose acks were lost", n)
			}
		})
	}
}

// NATS restarts while Close waits for the server's answer (it hangs, then
// its connections are cut, and it is back 200 ms later): Close flushes
// again on the new connection and returns nil within its deadline, the
// acks that went into the lost one counted, as for a restart before Close.
// Before, its one flush failed and Close returned ErrAcksUnconfirmed (exit
// 1) with most of its deadline left.
func TestCloseFlushesAgainAfterARestart(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			var buf syncBuffer
			c, p, _ := ackedWhileFrozen(t, ctx, srv, client, &buf)
			restart := time.AfterFunc(500*time.Millisecond, func() { // Close's flush is waiting then
				p.Cut()
				time.Sleep(200 * time.Millisecond)
				p.Reopen()
			})
			defer restart.Stop()
			cctx, cancelClose := context.WithTimeout(ctx, 10*time.Second)
			defer cancelClose()
			if err := c.Close(cctx); err != nil {
				t.Fatalf("Close = %v, want nil: NATS was back within a second of a 10 s deadline; log:\n%s", err, buf.String())
			}
			if st := c.Stats(); st.AcksUnconfirmed != 3 {
				t.Fatalf("Stats.AcksUnconfirmed = %d, want the 3 acks the lost connection held", st.AcksUnconfirmed)
			}
		})
	}
}

// nats.go calls the disconnect handler (which counts the loss) on a
// goroutine of its own once the connection is gone; a confirmation that
// comes before it, while nats.go reconnects (its PING goes into the
// reconnect buffer and is answered on the new connection) or once it has
// reconnected, must not vouch for the acks written into the old
// connection. Before, it did, and Close then said every ack had reached
// the server while the 3 below never did.
func TestConfirmBeforeTheDisconnectHandler(t *testing.T) {
	onePassOnly(t)
	for _, reconnected := range []bool{false, true} {
		t.Run(fmt.Sprintf("reconnected=%v", reconnected), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			release := make(chan struct{})
			var buf syncBuffer
			c, p, cfg := ackedWhileFrozen(t, ctx, srv, PullClientNATSGo, &buf,
				func(cfg *Config) { cfg.beforeDisconnect = func() { <-release } })
			p.Cut() // the acks go with the connections
			waitFor(t, ctx, "nats.go reconnecting", func() bool { return !c.nc.IsConnected() })
			p.Reopen()
			if reconnected {
				waitFor(t, ctx, "nats.go reconnected", c.nc.IsConnected)
			}
			cctx, cancelConfirm := context.WithTimeout(ctx, 5*time.Second)
			n, err := c.confirm(cctx, false) // the handler has not run
			cancelConfirm()
			close(release)
			if err != nil {
				t.Fatalf("confirm: %v", err)
			}
			if n != 3 || c.Stats().AcksUnconfirmed != 3 {
				t.Fatalf("confirm counted %d unconfirmed (Stats %d), want the 3 acks the lost connection held", n, c.Stats().AcksUnconfirmed)
			}
			if pending := ackPending(t, ctx, srv, cfg); pending != 3 {
				t.Fatalf("%d messages pending an ack, want 3 (the acks were to be lost)", pending)
			}
		})
	}
}

// A server that reads nothing while the acks of many batches fill the
// socket: each connection's writer then holds its lock for up to its
// write timeout, which a flush and nats.go's Close take before they look
// at a context. A Close whose context has ended (a second signal) still
// returns within about abortBudget, counting the acks it could not
// confirm. Before, it took about a minute (nats.go's default write
// timeout).
func TestCloseBoundedWithAFullSocket(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			var buf syncBuffer
			c, p, _ := ackedWhileFrozen(t, ctx, srv, client, &buf)
			// Standing for the acks of many more batches: publish until
			// the socket takes no more.
			filler := publishUntilFull(c)
			ended, end := context.WithCancel(ctx)
			end() // a second signal
			start := time.Now()
			err := c.Close(ended)
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("Close took %v with its context ended, want about %v", d, abortBudget)
			}
			if !errors.Is(err, ErrAcksUnconfirmed) {
				t.Errorf("Close = %v, want ErrAcksUnconfirmed", err)
			}
			p.Cut() // frees the writer
			<-filler
		})
	}
}

// A wire connection lost on its own (a write that timed out, the server
// dropping a slow consumer) while nats.go stays connected: the acks
// written into it are counted in doubt, as for a loss of both, also when
// no session runs to see it fail (Run has returned) and no confirmation
// has seen it open.
func TestCloseCountsAcksOfALostWireConnection(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	var buf syncBuffer
	c, p, _ := ackedWhileFrozen(t, ctx, srv, PullClientWire, &buf) // into the wire connection, which the proxy holds
	wc := c.wc.Load()
	if wc == nil {
		t.Fatal("no wire connection")
	}
	wc.Abort()
	p.Thaw()
	cctx, cancelClose := context.WithTimeout(ctx, 10*time.Second)
	defer cancelClose()
	if err := c.Close(cctx); err != nil {
		t.Fatalf("Close = %v, want nil (nats.go stayed connected); log:\n%s", err, buf.String())
	}
	if st := c.Stats(); st.AcksUnconfirmed != 3 {
		t.Fatalf("Stats.AcksUnconfirmed = %d, want the 3 acks written into the lost wire connection", st.AcksUnconfirmed)
	}
}

// Once hard has ended, Run returns promptly also while a write to a server
// that reads nothing holds a connection's lock (the acks and InProgress of
// many batches fill the socket, until its write timeout): well within the
// abortBudget a hard stop (processor.Run) gives all its stages, which
// before named the consumer among those it gave up on. Before, with the
// wire client, intake's end drained the subscription, whose UNSUB waited
// for the wire connection's lock, and Run with it, 10 s (writeTimeout)
// after hard had ended; with nats.go's connection full, Run's supervision
// waited for nats.go's lock (IsConnected after missed heartbeats, an API
// request) as long, and its wait for the ack confirmer took abortBudget.
func TestRunReturnsOnHardWhileAWriteHoldsTheConnection(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			c, p, cfg := closeSetup(t, ctx, srv, client, nil)
			hard, stopHard := context.WithCancel(ctx)
			t.Cleanup(stopHard)
			r := startRun(t, hard, c, 1, 16, 16)
			publish(t, ctx, jsFor(t, srv), cfg, 3, 1, 0)
			ms := takeMsgs(t, ctx, r, 3)
			p.Freeze()
			ackAll(t, c, ms[:2]) // for the confirmer to confirm
			// A committer's InProgress, standing for the settlements of
			// many batches: until the socket takes no more and the write
			// holds the lock.
			filler := fillSocket(ms[2].InProgress, 1<<20)
			waitConfirmerFlushing(t, ctx, c)
			if client == PullClientNATSGo {
				// Its supervision then looks at the consumer, which waits
				// for nats.go's lock (without this, hard may end first).
				waitFor(t, ctx, "a missed heartbeat", func() bool { return c.Stats().HeartbeatsMissing > 0 })
			}
			r.cancel() // intake: Run drains, which a server that reads nothing never completes
			select {
			case err := <-r.done:
				t.Fatalf("Run = %v at intake's end with the server frozen, want it draining until hard", err)
			case <-time.After(200 * time.Millisecond):
			}
			stopHard() // a second signal
			start := time.Now()
			select {
			case err := <-r.done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Run = %v, want hard's error", err)
				}
			case <-time.After(writeTimeout / 2):
				t.Fatalf("Run still runs %v after hard's end (a write to the frozen server holds a connection until writeTimeout, %v)", writeTimeout/2, writeTimeout)
			}
			// Not timed here: Run waits hardRunWait at most, which
			// TestHardWaitsFitTheAbortBudget holds to the budget.
			t.Logf("Run returned %v after hard's end", time.Since(start))
			_ = c.Close(hard) // as processor.CloseStages does: bounded, its context ended
			p.Cut()           // frees the writer
			<-filler
		})
	}
}

// Run's waits once hard has ended fit well within the abortBudget a hard
// stop (processor.Run) gives all its stages: Run's wait for its
// supervision (hardRunWait), which also waits for the ack confirmer
// (hardConfirmWait) on its way out. The tests of these waits
// (TestRunReturnsOnHardWhileAWriteHoldsTheConnection,
// TestConfirmerNotWaitedForOnceHardHasEnded) tell them from the bugs they
// guard (seconds) rather than time them against the budget, which a loaded
// machine does not keep to within 100 ms.
func TestHardWaitsFitTheAbortBudget(t *testing.T) {
	if hardConfirmWait >= hardRunWait {
		t.Errorf("hardConfirmWait %v, hardRunWait %v: Run would not wait for a way out that nothing holds", hardConfirmWait, hardRunWait)
	}
	if hardRunWait+hardConfirmWait > abortBudget*4/5 {
		t.Errorf("hardRunWait %v + hardConfirmWait %v, want well within abortBudget %v (at most 4/5 of it)", hardRunWait, hardConfirmWait, abortBudget)
	}
}

// When Close cannot confirm the acks while a write to a server that reads
// nothing holds a connection (it gives up on the connection, nats.go's
// here, or its final flush fails, wire's), the acks it counts unconfirmed
// include those of a batch that the held lock keeps from being written
// (begun, never sent): they are committed events whose acks may never go
// out, and come back after ack_wait. Before, only the acks a connection
// had taken were counted.
func TestCloseCountsTheAcksOfABatchHeldByTheWrite(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			var buf syncBuffer
			c, p, _, ms, stopRun := closeScene(t, ctx, srv, client, &buf, 5)
			stopRun() // no confirmation runs after Run
			p.Freeze()
			ackAll(t, c, ms[:3]) // sent into the frozen connection
			// InProgress until the socket takes no more and a write holds
			// the connection's lock.
			filler := fillSocket(ms[4].InProgress, 1<<20)
			held := make(chan struct{})
			go func() { // a committer's batch, held by the write
				defer close(held)
				c.AckAll(ms[3:], make([]error, 2))
			}()
			waitFor(t, ctx, "the held batch's acks begun", func() bool { return c.acks.begun.Load() == 5 })
			ended, end := context.WithCancel(ctx)
			end() // a second signal
			err := c.Close(ended)
			if !errors.Is(err, ErrAcksUnconfirmed) {
				t.Errorf("Close = %v, want ErrAcksUnconfirmed", err)
			}
			if st := c.Stats(); st.AcksUnconfirmed != 5 {
				t.Errorf("Stats.AcksUnconfirmed = %d, want 5: the 3 sent and the 2 of the batch held by the write", st.AcksUnconfirmed)
			}
			if log := buf.String(); !strings.Contains(log, "acks=5 ") {
				t.Errorf("log:\n%s\nwant the warning to count 5 acks not confirmed", log)
			}
			p.Cut() // frees the writers
			<-filler
			<-held
		})
	}
}

// Once hard has ended, Run waits for its ack confirmer only a moment
// (hardConfirmWait), not abortBudget: a confirmer whose flush waits for
// nats.go's lock, which a write to a server that reads nothing holds (its
// socket full), ends only at the write timeout, and a hard stop
// (processor.Run) gives all its stages abortBudget. Before, Run's wait for
// it alone took that long, and the hard stop named the consumer. The wait
// before hard's end is 5 s here, so that one taken by mistake stands out
// from hardConfirmWait on a loaded machine (abortBudget is 250 ms).
func TestConfirmerNotWaitedForOnceHardHasEnded(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	c, p, _ := closeSetup(t, ctx, srv, PullClientNATSGo, nil)
	c.confirmWait = 5 * time.Second
	c.acks.begin(1) // an ack sent, for the confirmer to confirm
	c.acks.end(1, 1)
	p.Freeze()
	filler := publishUntilFull(c)
	stop := c.confirming()
	waitConfirmerFlushing(t, ctx, c)
	start := time.Now()
	stop(true)
	if d := time.Since(start); d > c.confirmWait/2 {
		t.Errorf("the confirmer's stop took %v once hard had ended, want hardConfirmWait (%v), not the wait before hard's end (%v)", d, hardConfirmWait, c.confirmWait)
	}
	ended, end := context.WithCancel(ctx)
	end()
	_ = c.Close(ended)
	p.Cut() // frees the writers
	<-filler
}

// A final confirm that fails accounts for the acks it could not confirm;
// when closing the connections then takes longer than abortBudget past
// Close's deadline (nats.go's lock held by a write, its closed handler
// late), Close still reports them (ErrAcksUnconfirmed and a warning), from
// the confirm's result. Before, Close gave up on the close with abandon,
// which found them accounted for already and counted none: Close returned
// nil and logged nothing while Stats.AcksUnconfirmed counted them (seen
// in the hard-stop test as CloseStages = nil). Here nats.go's connection
// is closed under the consumer, so the confirm fails at once, and the
// disconnect handler holds the closed handler, which Close waits for,
// until the test ends; Close's context ends only once the confirm has
// accounted.
func TestCloseReportsAConfirmThatFailedBeforeAHeldClose(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			release := make(chan struct{})
			var buf syncBuffer
			c, _, _, ms, stopRun := closeScene(t, ctx, srv, client, &buf, 3,
				func(cfg *Config) { cfg.beforeDisconnect = func() { <-release } })
			stopRun() // no confirmation runs after Run
			ackAll(t, c, ms)
			c.nc.Close() // its handlers wait for release
			defer close(release)

			cctx, cancelClose := context.WithCancel(ctx)
			defer cancelClose()
			closed := make(chan error, 1)
			go func() { closed <- c.Close(cctx) }()
			waitFor(t, ctx, "the final confirm to account for the acks", c.acks.final.Load)
			cancelClose() // the deadline: Close gives the close abortBudget
			var err error
			select {
			case err = <-closed:
			case <-ctx.Done():
				t.Fatal("Close did not return after its context ended")
			}
			if !errors.Is(err, ErrAcksUnconfirmed) {
				t.Errorf("Close = %v, want ErrAcksUnconfirmed: the final confirm failed", err)
			}
			if st := c.Stats(); st.AcksUnconfirmed != 3 {
				t.Errorf("Stats.AcksUnconfirmed = %d, want 3", st.AcksUnconfirmed)
			}
			if log := buf.String(); !strings.Contains(log, "acks not confirmed by NATS at shutdown") || !strings.Contains(log, "acks=3 ") {
				t.Errorf("log:\n%s\nwant a warning that 3 acks were not confirmed", log)
			}
		})
	}
}

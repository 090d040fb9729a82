package wire

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// acceptOne serves one connection with serve and returns the URL to dial.
func acceptOne(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		serve(conn)
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return "nats://" + l.Addr().String()
}

// fakeServer accepts one connection, sends info, reads up to CONNECT's
// PING and then runs script with the connection and its reader.
func fakeServer(t *testing.T, info string, script func(net.Conn, *bufio.Reader)) string {
	t.Helper()
	return acceptOne(t, fakeServe(info, script))
}

// fakeServe is fakeServer's server, for one connection.
func fakeServe(info string, script func(net.Conn, *bufio.Reader)) func(net.Conn) {
	return func(conn net.Conn) {
		br := bufio.NewReader(conn)
		if _, err := conn.Write([]byte("INFO " + info + "\r\n")); err != nil {
			return
		}
		if readToPing(br) {
			script(conn, br)
		}
	}
}

// readToPing reads what the client sends up to its first PING (CONNECT's)
// and reports whether that PING came before the connection ended.
func readToPing(br *bufio.Reader) bool {
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return false
		}
		if strings.HasPrefix(line, "PING") {
			return true
		}
	}
}

const fakeInfo = `{"server_id":"fake","headers":true,"max_payload":100}`

// writeStatus sends a JetStream status (a header block, no payload) to the
// Sub's inbox.
func writeStatus(w io.Writer, inbox, sid, block string) {
	_, _ = fmt.Fprintf(w, "HMSG %s %s %d %d\r\n%s\r\n", inbox, sid, len(block), len(block), block)
}

// pullServer is a fake server that takes a Sub's subscription, answers
// pings, and hands each pull request (the n-th from 1, with its JSON body)
// to onPull, which writes the answer, if any, to w.
func pullServer(t *testing.T, onPull func(w io.Writer, inbox, sid string, n int, body string)) string {
	t.Helper()
	return fakeServer(t, pullInfo, pullScript(onPull))
}

const pullInfo = `{"server_id":"fake","headers":true,"max_payload":1048576}`

// pullScript is pullServer's script.
func pullScript(onPull func(w io.Writer, inbox, sid string, n int, body string)) func(net.Conn, *bufio.Reader) {
	return func(conn net.Conn, br *bufio.Reader) {
		_, _ = conn.Write([]byte("PONG\r\n")) // CONNECT's
		var inbox, sid string
		for n := 0; ; {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			f := strings.Fields(line)
			switch {
			case len(f) == 3 && f[0] == "SUB":
				inbox, sid = f[1], f[2]
			case len(f) == 1 && f[0] == "PING":
				_, _ = conn.Write([]byte("PONG\r\n"))
			case len(f) == 4 && f[0] == "PUB" && strings.Contains(f[1], "MSG.NEXT"):
				body, err := br.ReadString('\n')
				if err != nil {
					return
				}
				n++
				onPull(conn, inbox, sid, n, body)
			}
		}
	}
}

// waitErr waits for the connection to end and returns its error.
func waitErr(t *testing.T, c *Conn) error {
	t.Helper()
	select {
	case <-c.Done():
		return c.Err()
	case <-time.After(10 * time.Second):
		t.Fatal("connection still open")
		return nil
	}
}

func TestFakeServerProtocolErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		send string
		want error
	}{
		"garbage":       {"PONG\r\nWHAT IS THIS\r\n", ErrProtocol},
		"over 64 MiB":   {"PONG\r\nMSG a 1 70000000\r\n", ErrProtocol},
		"bad crlf":      {"PONG\r\nMSG a 1 2\r\nabXY", ErrProtocol},
		"fatal -ERR":    {"PONG\r\n-ERR 'Unknown Protocol Operation'\r\n", &ServerError{}},
		"eof mid frame": {"PONG\r\nMSG a 1 50\r\nabc", ErrConnectionClosed},
	} {
		t.Run(name, func(t *testing.T) {
			url := fakeServer(t, fakeInfo, func(conn net.Conn, br *bufio.Reader) {
				_, _ = conn.Write([]byte(tc.send))
				if name != "eof mid frame" {
					_, _ = br.ReadString(0) // until the client hangs up
				}
			})
			c, err := Dial(testCtx(t, 10*time.Second), Options{URL: url})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = waitErr(t, c)
			var se *ServerError
			switch {
			case errors.As(tc.want, &se):
				if !errors.As(err, &se) || se.Text != "Unknown Protocol Operation" {
					t.Errorf("got %v, want the -ERR", err)
				}
			case tc.want == ErrConnectionClosed:
				if !errors.Is(err, ErrConnectionClosed) && !strings.Contains(err.Error(), "unexpected EOF") {
					t.Errorf("got %v", err)
				}
			default:
				if !errors.Is(err, tc.want) {
					t.Errorf("got %v, want %v", err, tc.want)
				}
			}
		})
	}
}

// pingAnswer dials a fake server that sends send (after INFO and CONNECT's
// PING) and returns the line the client writes next, failing the test if
// the connection ends first.
func pingAnswer(t *testing.T, send string) string {
	t.Helper()
	answered := make(chan string, 1)
	url := fakeServer(t, fakeInfo, func(conn net.Conn, br *bufio.Reader) {
		_, _ = conn.Write([]byte(send))
		line, _ := br.ReadString('\n')
		answered <- line
		_, _ = br.ReadString(0) // until the client hangs up
	})
	c, err := Dial(testCtx(t, 10*time.Second), Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case line := <-answered:
		return line
	case <-c.Done():
		t.Fatalf("connection ended: %v", c.Err())
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
	}
	return ""
}

// A message over the server's max_payload (stored under a larger limit
// elsewhere in a cluster) is read, not taken for a protocol error that
// would end the connection at every delivery of it.
func TestFrameOverMaxPayloadIsRead(t *testing.T) {
	body := strings.Repeat("x", 5000) // max_payload is 100
	if line := pingAnswer(t, "PONG\r\nMSG a 1 5000\r\n"+body+"\r\nPING\r\n"); line != "PONG\r\n" {
		t.Fatalf("the client answered the PING after the message with %q", line)
	}
}

func TestFakeServerConnect(t *testing.T) {
	t.Run("authorization violation", func(t *testing.T) {
		url := acceptOne(t, func(conn net.Conn) {
			_, _ = conn.Write([]byte("INFO " + fakeInfo + "\r\n"))
			_, _ = bufio.NewReader(conn).ReadString('\n')
			_, _ = conn.Write([]byte("-ERR 'Authorization Violation'\r\n"))
		})
		_, err := Dial(testCtx(t, 10*time.Second), Options{URL: url, User: "u", Password: "p4ss"})
		if !errors.Is(err, ErrAuthorization) || strings.Contains(err.Error(), "p4ss") {
			t.Errorf("got %v, want ErrAuthorization", err)
		}
	})
	t.Run("no INFO before the deadline", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = Dial(ctx, Options{URL: "nats://" + l.Addr().String()})
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
			t.Errorf("got %v after %v", err, time.Since(start))
		}
	})
	t.Run("options", func(t *testing.T) {
		for _, o := range []Options{{}, {URL: "ws://localhost"}, {URL: "nats://x", PingInterval: -1},
			{URL: "nats://x", NKeyFile: "a", CredsFile: "b"}} {
			if _, err := Dial(context.Background(), o); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("%+v: %v", o, err)
			}
		}
	})
}

func TestFakeServerPings(t *testing.T) {
	t.Run("answers PING", func(t *testing.T) {
		if line := pingAnswer(t, "PONG\r\nINFO {}\r\n+OK\r\nPING\r\n"); line != "PONG\r\n" {
			t.Errorf("answered %q", line)
		}
	})
	t.Run("stale", func(t *testing.T) {
		url := fakeServer(t, fakeInfo, func(conn net.Conn, br *bufio.Reader) {
			_, _ = conn.Write([]byte("PONG\r\n"))
			_, _ = br.ReadString(0) // never answers the pings
		})
		c, err := Dial(testCtx(t, 10*time.Second), Options{URL: url, PingInterval: 50 * time.Millisecond, MaxPingsOut: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := waitErr(t, c); !errors.Is(err, ErrStaleConnection) {
			t.Errorf("got %v, want ErrStaleConnection", err)
		}
	})
}

// consumeInto subscribes a handler that sends every message to a channel.
func consumeInto(t *testing.T, c *Conn, o PullOptions, rec *errRecorder) (*Sub, chan *Msg) {
	t.Helper()
	msgs := make(chan *Msg, 10000)
	onErr := func(error) {}
	if rec != nil {
		onErr = rec.onErr
	}
	sub, err := c.Consume(o, func(m *Msg) { msgs <- m }, onErr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Stop(); <-sub.Closed() })
	return sub, msgs
}

func TestServerShutdownEndsSubs(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	preload(t, ctx, js, "SHUT", 10, 1, jetstream.ConsumerConfig{AckWait: time.Minute})
	c := dialTest(t, ctx, srv.URL())
	rec := newErrRecorder()
	sub, msgs := consumeInto(t, c, PullOptions{Stream: "SHUT", Consumer: "C", Expires: 2 * time.Second, Heartbeat: 500 * time.Millisecond}, rec)
	for range 10 {
		_ = nextMsg(t, msgs, 10*time.Second).Ack()
	}
	srv.Shutdown()
	waitClosed(t, sub, 10*time.Second)
	if !errors.Is(sub.Err(), ErrConnectionClosed) {
		t.Errorf("Sub ended with %v, want ErrConnectionClosed", sub.Err())
	}
	rec.wait(t, time.Second, func(err error) bool { return errors.Is(err, ErrConnectionClosed) })
	if c.Err() == nil {
		t.Error("Conn.Err is nil after the server went away")
	}
}

func TestConsumerDeletedEndsSub(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	preload(t, ctx, js, "DEL", 1, 1, jetstream.ConsumerConfig{AckWait: time.Minute})
	c := dialTest(t, ctx, srv.URL())
	rec := newErrRecorder()
	sub, msgs := consumeInto(t, c, PullOptions{Stream: "DEL", Consumer: "C", Expires: 2 * time.Second, Heartbeat: 500 * time.Millisecond}, rec)
	_ = nextMsg(t, msgs, 10*time.Second).Ack()
	if err := js.DeleteConsumer(ctx, "DEL", "C"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, sub, 10*time.Second)
	if err := sub.Err(); !errors.Is(err, ErrConsumerDeleted) {
		t.Errorf("Sub ended with %v, want ErrConsumerDeleted", err)
	}
	rec.wait(t, time.Second, func(err error) bool { return errors.Is(err, ErrConsumerDeleted) })
	if c.Err() != nil {
		t.Errorf("connection failed: %v", c.Err())
	}
}

// A pull past one of the consumer's max_request_* limits (an operator's
// edit) ends the Sub with ErrBadRequest, naming the limit: the same pull
// would be refused again. Before, the Sub pulled again after each run of
// missed heartbeats, for ever.
func TestPullPastTheConsumersLimitsEndsTheSub(t *testing.T) {
	for _, tc := range []struct {
		name string
		cc   jetstream.ConsumerConfig
	}{
		{"MaxRequestBatch", jetstream.ConsumerConfig{MaxRequestBatch: 10}},
		{"MaxRequestExpires", jetstream.ConsumerConfig{MaxRequestExpires: time.Second}},
		{"MaxRequestMaxBytes", jetstream.ConsumerConfig{MaxRequestMaxBytes: 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, time.Minute)
			srv := testenv.NATS(t)
			js := srv.JetStream(t)
			preload(t, ctx, js, "LIM", 3, 1, tc.cc)
			c := dialTest(t, ctx, srv.URL())
			sub, _ := consumeInto(t, c, PullOptions{Stream: "LIM", Consumer: "C", MaxMessages: 500, MaxBytes: 1 << 20, Expires: 30 * time.Second, Heartbeat: 5 * time.Second}, nil)
			select {
			case <-sub.Closed():
			case <-ctx.Done():
				t.Fatal("the Sub did not end")
			}
			if err := sub.Err(); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "Exceeded "+tc.name) {
				t.Fatalf("Sub.Err() = %v, want ErrBadRequest naming %s", err, tc.name)
			}
		})
	}
}

// A pull refused because too many pulls wait on the consumer (409 Exceeded
// MaxWaiting) is gone: the Sub reports it and pulls again at its next
// heartbeat tick. Before, it counted the refused pull as open and pulled
// only after missed heartbeats. The fake server sends what nats-server
// (2.15) does not: it answers so only a pull without idle_heartbeat, and
// drops a Sub's refused pulls silently (see onStatus).
func TestPullPastMaxWaitingPullsAgainNextTick(t *testing.T) {
	const tick = time.Second
	var mu sync.Mutex
	var at []time.Time
	url := pullServer(t, func(w io.Writer, inbox, sid string, n int, _ string) {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		if n == 1 {
			writeStatus(w, inbox, sid, "NATS/1.0 409 Exceeded MaxWaiting\r\n\r\n")
		}
	})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	rec := newErrRecorder()
	consumeInto(t, c, PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, Expires: 30 * time.Second, Heartbeat: tick}, rec)
	rec.wait(t, 10*time.Second, func(err error) bool {
		var se *StatusError
		return errors.As(err, &se) && se.Code == 409 && strings.Contains(se.Description, "MaxWaiting")
	})
	eventually(t, 10*time.Second, "a second pull", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(at) >= 2
	})
	mu.Lock()
	gap := at[1].Sub(at[0])
	mu.Unlock()
	// Missed heartbeats would take two ticks or more.
	if gap < tick/2 || gap >= 2*tick {
		t.Fatalf("pulled again %v after the refused pull; want at the next tick (%v)", gap, tick)
	}
}

// nats-server (2.15) refuses a pull past the consumer's max_waiting with no
// word to a client that asks for idle heartbeats, as the Sub always does
// (a 409 Exceeded MaxWaiting goes only to pulls without): the Sub hears
// nothing, reports ErrNoHeartbeat after missed heartbeats and pulls
// afresh, and so on until there is room. This shows how it recovers; it
// does not time it.
func TestPullPastMaxWaitingRecoversAtMissedHeartbeats(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	preload(t, ctx, js, "MW", 0, 1, jetstream.ConsumerConfig{AckWait: time.Minute, MaxWaiting: 1})
	cons, err := js.Consumer(ctx, "MW", "C")
	if err != nil {
		t.Fatal(err)
	}
	// Another client's pull takes the one place, without heartbeats.
	nc := srv.Connect(t)
	inbox := nats.NewInbox()
	other, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.MW.C", inbox, []byte(`{"batch":1,"expires":60000000000}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the other pull waiting", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting == 1
	})
	c := dialTest(t, ctx, srv.URL())
	rec := newErrRecorder()
	_, msgs := consumeInto(t, c, PullOptions{Stream: "MW", Consumer: "C", MaxMessages: 10, Expires: 2 * time.Second, Heartbeat: 300 * time.Millisecond}, rec)
	notMaxWaiting := func(err error) {
		t.Helper()
		t.Logf("onErr: %v", err)
		if se := (*StatusError)(nil); errors.As(err, &se) && strings.Contains(se.Description, "MaxWaiting") {
			t.Fatalf("onErr: %v; nats-server says that only to pulls without idle_heartbeat", err)
		}
	}
	rec.wait(t, 10*time.Second, func(err error) bool { notMaxWaiting(err); return errors.Is(err, ErrNoHeartbeat) })
	if info, err := cons.Info(ctx); err != nil || info.NumWaiting != 1 {
		t.Fatalf("consumer info %+v, %v; want the other pull alone waiting", info, err)
	}
	// The place frees (the other client goes); a pull after the next
	// missed heartbeats takes it and delivers.
	if err := other.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, "MW", 1, 1, 1)
	if err := nextMsg(t, msgs, 20*time.Second).Ack(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case err := <-rec.ch:
			notMaxWaiting(err)
		default:
			return
		}
	}
}

// A pull that nothing answers (a 503: no responders, as for a consumer
// that does not exist, or during a leader election) is reported at once,
// and the Sub pulls again at its heartbeat ticks, not at once (which would
// be refused as fast, in a loop) and not only after missed heartbeats.
func TestNoRespondersPullsAgainEachTick(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	preload(t, ctx, js, "HB", 0, 1, jetstream.ConsumerConfig{AckWait: time.Minute})
	c := dialTest(t, ctx, srv.URL())
	rec := newErrRecorder()
	const tick = 300 * time.Millisecond
	_, msgs := consumeInto(t, c, PullOptions{Stream: "HB", Consumer: "MISSING", Expires: 2 * time.Second, Heartbeat: tick}, rec)
	rec.wait(t, 5*time.Second, func(err error) bool { return errors.Is(err, ErrNoResponders) })
	// Refused pulls with no missed heartbeats between them were pulled
	// again at a tick (after missed heartbeats, each would follow an
	// ErrNoHeartbeat). A loaded machine may hold a refusal back past two
	// ticks, and the Sub then reports ErrNoHeartbeat and pulls afresh:
	// that starts the row again, it does not fail the test.
	start := time.Now()
	deadline := time.After(10 * time.Second)
	var refused, row, missed int
	inRow := false
	for !inRow || time.Since(start) < 7*tick {
		select {
		case err := <-rec.ch:
			switch {
			case errors.Is(err, ErrNoResponders):
				refused++
				row++
				inRow = inRow || row >= 3
			case errors.Is(err, ErrNoHeartbeat):
				missed++
				row = 0
				t.Logf("onErr: %v", err)
			default:
				t.Fatalf("onErr: %v; want only refused pulls", err)
			}
		case <-deadline:
			t.Fatalf("%d pulls refused, %d missed heartbeats in %v: no 3 refused in a row; want one pulled again each tick (%v), not after missed heartbeats",
				refused, missed, time.Since(start).Round(time.Millisecond), tick)
		case <-time.After(10 * time.Millisecond):
		}
	}
	// Not at once either, in a loop: one a tick at most (a tick or two
	// more for a pull sent before start, the ticker does not catch up).
	if elapsed := time.Since(start); refused > int(elapsed/tick)+2 {
		t.Errorf("%d pulls refused in %v; want one a tick (%v), %d at most", refused, elapsed.Round(time.Millisecond), tick, int(elapsed/tick)+2)
	}
	// Once the consumer is there, the next tick's pull delivers.
	if _, err := js.CreateConsumer(ctx, "HB", jetstream.ConsumerConfig{Durable: "MISSING", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, "HB", 1, 1, 1)
	if err := nextMsg(t, msgs, 10*time.Second).Ack(); err != nil {
		t.Fatal(err)
	}
}

// A pull nothing answers (503) while messages that came before are held
// (as during a consumer leader election, with a slow handler) is pulled
// again at the next tick too, not as soon as the handler has taken enough
// of them: each such pull is refused as fast, and resets what is pending,
// so that each message handled after it pulled again, up to one refused
// pull a held message at an electing cluster instead of one a tick.
func TestNoRespondersWithMessagesHeldPullsAtTheTick(t *testing.T) {
	const tick, n = 2 * time.Second, 10
	var pulls atomic.Int32
	first := make(chan time.Time, 1)
	url := pullServer(t, func(w io.Writer, inbox, sid string, k int, _ string) {
		pulls.Add(1)
		if k == 1 {
			first <- time.Now()
			for i := 1; i <= n; i++ {
				_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.%d.%d.0.0 1\r\nx\r\n", sid, i, i)
			}
		}
		writeStatus(w, inbox, sid, "NATS/1.0 503\r\n\r\n")
	})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	rec := newErrRecorder()
	release := make(chan struct{})
	var handled atomic.Int32
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: n, Expires: 30 * time.Second, Heartbeat: tick},
		func(*Msg) {
			<-release
			// The server has answered every pull sent before (its 503
			// is read before the PONG) by the time the next message is
			// handled: as at a cluster that refuses them as fast.
			_ = c.Flush(ctx)
			handled.Add(1)
		}, rec.onErr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	eventually(t, 5*time.Second, "the 503 with the messages held", func() bool {
		sub.pmu.Lock()
		defer sub.pmu.Unlock()
		return sub.repull
	})
	close(release)
	eventually(t, 5*time.Second, "the messages handled", func() bool { return handled.Load() == n })
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The first pull, and one a tick since (a busy machine may have
	// taken a tick or more to get here); not one a message handled.
	start := <-first
	if got, most := pulls.Load(), 2+int32(time.Since(start)/tick); got > most {
		t.Fatalf("%d pulls in %v, with %d messages held at the 503; want the first and one a tick, %d at most", got, time.Since(start).Round(time.Millisecond), n, most)
	}
	eventually(t, 2*tick, "the tick's pull", func() bool { return pulls.Load() >= 2 })
	rec.wait(t, time.Second, func(err error) bool { return errors.Is(err, ErrNoResponders) })
}

// A pull the server keeps open and never answers, not even with
// heartbeats, is reported after two quiet heartbeat intervals, and the Sub
// asks afresh.
func TestNoHeartbeat(t *testing.T) {
	pulls := make(chan string, 16)
	url := pullServer(t, func(_ io.Writer, _, _ string, _ int, body string) { pulls <- body })
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	rec := newErrRecorder()
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, Expires: 30 * time.Second, Heartbeat: 300 * time.Millisecond},
		func(m *Msg) { _ = m.Ack() }, rec.onErr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	<-pulls
	start := time.Now()
	rec.wait(t, 5*time.Second, func(err error) bool { return errors.Is(err, ErrNoHeartbeat) })
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("ErrNoHeartbeat after %v, before two heartbeat intervals", d)
	}
	select {
	case <-pulls:
	case <-time.After(5 * time.Second):
		t.Fatal("no pull after the missed heartbeats")
	}
}

func TestHeartbeatsKeepQuietSubAlive(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	preload(t, ctx, js, "QUIET", 0, 1, jetstream.ConsumerConfig{AckWait: time.Minute})
	c := dialTest(t, ctx, srv.URL())
	rec := newErrRecorder()
	_, msgs := consumeInto(t, c, PullOptions{Stream: "QUIET", Consumer: "C", Expires: 4 * time.Second, Heartbeat: 500 * time.Millisecond}, rec)
	// An expiry (its 408 gives the credit back, the Sub pulls again) and
	// no missed heartbeats: the idle heartbeats count as life. Were they
	// not, ErrNoHeartbeat would come every two ticks until the first
	// expiry, four times in the window (with a 2 s expiry, the 408s of
	// the pulls sent after each would hide all but two); once is a
	// loaded machine holding a heartbeat or the reader back for just over
	// a second.
	const window = 5 * time.Second
	timeout := time.After(window)
	missed := 0
	for quiet := true; quiet; {
		select {
		case err := <-rec.ch:
			if !errors.Is(err, ErrNoHeartbeat) {
				t.Fatalf("onErr on a quiet stream: %v", err)
			}
			missed++
			t.Logf("onErr: %v", err)
		case <-timeout:
			quiet = false
		}
	}
	if missed > 1 {
		t.Fatalf("ErrNoHeartbeat %d times in %v on a quiet stream with idle heartbeats every 500ms; want once at most", missed, window)
	}
	publish(t, ctx, js, "QUIET", 1, 1, 1)
	if err := nextMsg(t, msgs, 5*time.Second).Ack(); err != nil {
		t.Fatal(err)
	}
}

// slowMessage writes one message of chunks x 20,000 bytes to sid, a chunk
// every 100 ms (200 KB/s: 50 chunks, a megabyte, over a link of a few
// Mbit/s, or 64 MiB over 100 Mbit/s, take as long), with no heartbeat
// meanwhile: the server sends nothing else while a frame is part-way
// written. After each chunk whose index (from 0) is in pauseAfter it waits
// 1.8 s more: 1.9 s without a byte, one quiet tick at a 1 s heartbeat.
func slowMessage(w io.Writer, sid string, chunks int, pauseAfter ...int) {
	_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.1.1.0.0 %d\r\n", sid, chunks*20000)
	chunk := []byte(strings.Repeat("x", 20000))
	for i := range chunks {
		_, _ = w.Write(chunk)
		time.Sleep(100 * time.Millisecond)
		if slices.Contains(pauseAfter, i) {
			time.Sleep(1800 * time.Millisecond)
		}
	}
	_, _ = w.Write([]byte("\r\n"))
}

// slowServer is a pullServer that answers the first pull with slowMessage.
func slowServer(t *testing.T, chunks int, pauseAfter ...int) string {
	t.Helper()
	return pullServer(t, func(w io.Writer, inbox, sid string, n int, body string) {
		if n == 1 {
			slowMessage(w, sid, chunks, pauseAfter...)
		}
	})
}

// consumeSlow consumes from c as the slow-message tests do (heartbeat
// 1 s, pulls that expire after 30 s), with onErr, and returns the count of
// messages handled; the Sub stops in t.Cleanup, before c closes.
func consumeSlow(t *testing.T, c *Conn, onErr func(error)) *atomic.Int64 {
	t.Helper()
	handled := new(atomic.Int64)
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, Expires: 30 * time.Second, Heartbeat: time.Second},
		func(*Msg) { handled.Add(1) }, onErr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Stop(); <-sub.Closed() })
	return handled
}

// errorsUntilHandled dials url, consumes with consumeSlow until one
// message is handled (within 20 s), and returns the errors the Sub
// reported meanwhile, each with its time since Consume.
func errorsUntilHandled(t *testing.T, url string) []string {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	var mu sync.Mutex
	var errs []string
	start := time.Now()
	handled := consumeSlow(t, c, func(err error) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf("%.1fs %v", time.Since(start).Seconds(), err))
		mu.Unlock()
	})
	eventually(t, 20*time.Second, "handled", func() bool { return handled.Load() == 1 })
	t.Logf("handled after %.1fs", time.Since(start).Seconds())
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(errs)
}

// A large message arriving slowly, its bytes flowing all the while, is not
// missed heartbeats: the server's heartbeat waits behind it. (It was: the
// Sub reported ErrNoHeartbeat and pulled again, and jetsink's consumer
// then pinged the connection and, the PONG being behind the message too,
// aborted it, losing the message half-read, again at each redelivery.)
func TestSlowLargeMessageIsNotSilence(t *testing.T) {
	if errs := errorsUntilHandled(t, slowServer(t, 50)); len(errs) > 0 {
		t.Fatalf("errors while the message's bytes were flowing: %v", errs)
	}
}

// Pauses within one large message arriving slowly, each shorter than two
// heartbeat intervals, do not add up to missed heartbeats: a tick that
// finds the Sub's own frame still arriving is life. (They did: such a tick
// counted neither way, so one quiet tick in each pause made two, and
// ErrNoHeartbeat came at 5 s.)
func TestPausesWithinASlowMessageDoNotAddUp(t *testing.T) {
	// 30 chunks, pausing after the 5th and the 20th.
	if errs := errorsUntilHandled(t, slowServer(t, 30, 4, 19)); len(errs) > 0 {
		t.Fatalf("errors while the message's bytes came, with pauses: %v", errs)
	}
}

// A frame whose bytes stop coming part-way is silence all the same: the
// reader waiting inside a frame counts as life only while it reads.
func TestStalledFrameIsSilence(t *testing.T) {
	url := pullServer(t, func(w io.Writer, inbox, sid string, n int, body string) {
		if n == 1 {
			_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.1.1.0.0 %d\r\n%s", sid, 50*20000, strings.Repeat("x", 20000))
		}
	})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	rec := newErrRecorder()
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, Expires: 2 * time.Second, Heartbeat: 500 * time.Millisecond},
		func(*Msg) {}, rec.onErr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	rec.wait(t, 5*time.Second, func(err error) bool { return errors.Is(err, ErrNoHeartbeat) })
}

// The connection's own pings do not give up a connection while a large
// message arrives slowly, its bytes flowing all the while, though the
// PONGs wait behind it. (They did: with pings every second, 2 out, the
// connection failed as stale at 3 s, the message half-read; jetsink pings
// every 20 s, and 64 MiB takes 54 s at 10 Mbit/s.)
func TestSlowLargeMessageIsNotAStaleConnection(t *testing.T) {
	url := slowServer(t, 50)
	ctx := testCtx(t, 30*time.Second)
	c, err := Dial(ctx, Options{URL: url, PingInterval: time.Second, MaxPingsOut: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	handled := consumeSlow(t, c, nil)
	start := time.Now()
	// Its PING follows the pull: the PONG comes after the message.
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("Flush behind a message still arriving, after %.1fs: %v", time.Since(start).Seconds(), err)
	}
	if d := time.Since(start); d < 4*time.Second {
		t.Fatalf("Flush answered after %v, before the message could have arrived; the test needs it slower", d)
	}
	eventually(t, 10*time.Second, "handled", func() bool { return handled.Load() == 1 })
}

// A frame whose bytes stop coming part-way leaves the pings unanswered as
// any silence does: the connection is stale.
func TestStalledFrameIsAStaleConnection(t *testing.T) {
	hold := make(chan struct{})
	url := pullServer(t, func(w io.Writer, inbox, sid string, n int, body string) {
		if n == 1 {
			_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.1.1.0.0 %d\r\n%s", sid, 50*20000, strings.Repeat("x", 20000))
			<-hold // reads nothing more: its PONGs would be read as the frame's bytes
		}
	})
	t.Cleanup(func() { close(hold) })
	ctx := testCtx(t, 30*time.Second)
	c, err := Dial(ctx, Options{URL: url, PingInterval: 200 * time.Millisecond, MaxPingsOut: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, Expires: 30 * time.Second, Heartbeat: 10 * time.Second},
		func(*Msg) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	if err := waitErr(t, c); !errors.Is(err, ErrStaleConnection) {
		t.Fatalf("got %v, want ErrStaleConnection", err)
	}
}

// While a large message arrives slowly, a Flush waits behind it (the PONG
// comes after it), and LastRead tells that the connection is not silent.
func TestLastReadAdvancesBehindASlowMessage(t *testing.T) {
	url := slowServer(t, 50)
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	handled := consumeSlow(t, c, nil)
	time.Sleep(500 * time.Millisecond) // let the message start: no condition to poll
	fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	before := c.LastRead()
	if err := c.Flush(fctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush behind a message still arriving: %v, want the deadline", err)
	}
	if handled.Load() != 0 {
		t.Fatal("the message was handled within 2.5 s; the test needs it slower")
	}
	if after := c.LastRead(); !after.After(before) {
		t.Fatalf("LastRead %v did not advance from %v while bytes flowed", after, before)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("Flush after the message: %v", err)
	}
	eventually(t, 10*time.Second, "handled", func() bool { return handled.Load() == 1 })
}

func TestDrainDeliversWhatArrived(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	preload(t, ctx, js, "DRN", 1000, 1, jetstream.ConsumerConfig{AckWait: time.Minute})
	c := dialTest(t, ctx, srv.URL())
	release := make(chan struct{})
	var handled atomic.Int64
	sub, err := c.Consume(PullOptions{Stream: "DRN", Consumer: "C", MaxMessages: 100}, func(m *Msg) {
		if handled.Add(1) == 1 {
			<-release
		}
		if err := m.Ack(); err != nil {
			t.Errorf("ack: %v", err)
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The first handler call holds the goroutine; the other 99 requested
	// arrive in the buffer.
	eventually(t, 10*time.Second, "buffer filled", func() bool { return len(sub.ch) == 99 })
	// The blocked handler does not hold up the reader: a round trip works.
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("Flush while the handler is blocked: %v", err)
	}
	sub.Drain()
	close(release)
	waitClosed(t, sub, 10*time.Second)
	if err := sub.Err(); err != nil {
		t.Errorf("Err after Drain: %v", err)
	}
	if got := handled.Load(); got != 100 {
		t.Errorf("handled %d after Drain, want the 100 that arrived", got)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cons, _ := js.Consumer(ctx, "DRN", "C")
	// The server applies acks on a queue of its own: the PONG says they
	// were read, not applied.
	eventually(t, 10*time.Second, "ack floor 100", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.AckFloor.Stream == 100
	})
}

// When the connection fails, a Sub whose messages are settled through
// Options.Settle reports the failure, then hands on what had arrived, and
// those messages can still be settled; JetStream need not deliver them
// again.
func TestHeldMessagesOutliveAFailedConnection(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	preload(t, ctx, js, "HELD", 100, 1, jetstream.ConsumerConfig{AckWait: time.Minute})
	var settled atomic.Int64
	c, err := Dial(ctx, Options{URL: srv.URL(), Settle: func(string, []byte) error { settled.Add(1); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	release := make(chan struct{})
	var handled, handledAfterErr atomic.Int64
	var failed atomic.Bool
	sub, err := c.Consume(PullOptions{Stream: "HELD", Consumer: "C", MaxMessages: 100}, func(m *Msg) {
		if handled.Add(1) == 1 {
			<-release
		}
		if failed.Load() {
			handledAfterErr.Add(1)
		}
		if err := m.Ack(); err != nil {
			t.Errorf("ack: %v", err)
		}
	}, func(err error) {
		if errors.Is(err, ErrConnectionClosed) {
			failed.Store(true)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "buffer filled", func() bool { return len(sub.ch) == 99 })
	srv.Shutdown()
	eventually(t, 10*time.Second, "the connection failed", func() bool { return c.Err() != nil })
	close(release)
	waitClosed(t, sub, 10*time.Second)
	if !errors.Is(sub.Err(), ErrConnectionClosed) {
		t.Errorf("Sub ended with %v, want ErrConnectionClosed", sub.Err())
	}
	if h, after, s := handled.Load(), handledAfterErr.Load(), settled.Load(); h != 100 || after != 99 || s != 100 {
		t.Errorf("handled %d (%d after the error was reported), settled %d; want 100 (99), 100", h, after, s)
	}
}

func TestStopIsPrompt(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	preload(t, ctx, js, "STOP", 1000, 1, jetstream.ConsumerConfig{AckWait: time.Minute})
	c := dialTest(t, ctx, srv.URL())
	release := make(chan struct{})
	var handled atomic.Int64
	sub, err := c.Consume(PullOptions{Stream: "STOP", Consumer: "C", MaxMessages: 100}, func(*Msg) {
		if handled.Add(1) == 1 {
			<-release
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "buffer filled", func() bool { return len(sub.ch) == 99 })
	sub.Stop()
	close(release)
	waitClosed(t, sub, time.Second)
	if got := handled.Load(); got != 1 {
		t.Errorf("handled %d, want only the one running at Stop", got)
	}
	if sub.Err() != nil {
		t.Errorf("Err after Stop: %v", sub.Err())
	}
}

func TestCloseEndsAllSubs(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	preload(t, ctx, js, "CLS", 10, 1, jetstream.ConsumerConfig{AckWait: time.Minute})
	c := dialTest(t, ctx, srv.URL())
	recA, recB := newErrRecorder(), newErrRecorder()
	a, msgs := consumeInto(t, c, PullOptions{Stream: "CLS", Consumer: "C", MaxMessages: 5}, recA)
	b, _ := consumeInto(t, c, PullOptions{Stream: "CLS", Consumer: "C", MaxMessages: 5}, recB)
	_ = nextMsg(t, msgs, 10*time.Second)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Sub{a, b} {
		waitClosed(t, s, 5*time.Second)
		if !errors.Is(s.Err(), ErrConnectionClosed) {
			t.Errorf("Sub ended with %v", s.Err())
		}
	}
	for _, r := range []*errRecorder{recA, recB} {
		r.wait(t, time.Second, func(err error) bool { return errors.Is(err, ErrConnectionClosed) })
	}
	if !errors.Is(c.Err(), ErrConnectionClosed) {
		t.Errorf("Conn.Err %v", c.Err())
	}
}

func TestPullOptions(t *testing.T) {
	for _, o := range []PullOptions{
		{Consumer: "C"}, {Stream: "S"}, {Stream: "a.b", Consumer: "C"}, {Stream: "S", Consumer: "C*"},
		{Stream: "S", Consumer: "C", Expires: 500 * time.Millisecond},
		{Stream: "S", Consumer: "C", Expires: 2 * time.Second, Heartbeat: 1500 * time.Millisecond},
		{Stream: "S", Consumer: "C", MaxMessages: -1},
		{Stream: "S", Consumer: "C", APIPrefix: "a b"},
	} {
		if err := o.withDefaults(); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	o := PullOptions{Stream: "S", Consumer: "C"}
	if err := o.withDefaults(); err != nil || o.MaxMessages != 500 || o.Expires != 30*time.Second || o.Heartbeat != 15*time.Second || o.APIPrefix != "$JS.API" {
		t.Errorf("defaults: %+v %v", o, err)
	}
}

// A 409 Leadership Change voids the requests still open on the server,
// not the messages that arrived: the Sub counts those as outstanding
// until handled, and pulls only what is missing, once fewer than half are.
// (Counting them as nothing asked for a full batch on top of them at once.)
func TestLeadershipChangeKeepsArrivedMessagesCounted(t *testing.T) {
	pulls := make(chan string, 16)
	sendStatus := make(chan struct{})
	url := pullServer(t, func(w io.Writer, inbox, sid string, n int, body string) {
		pulls <- body
		if n != 1 {
			return
		}
		for i := 1; i <= 9; i++ {
			_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.%d.%d.0.0 1\r\nx\r\n", sid, i, i)
		}
		<-sendStatus
		writeStatus(w, inbox, sid, "NATS/1.0 409 Leadership Change\r\n\r\n")
	})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock() // before the Sub's Stop waits for its handler
	var handled atomic.Int64
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, Expires: 30 * time.Second, Heartbeat: 10 * time.Second}, func(*Msg) {
		if handled.Add(1) == 1 {
			<-release
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { unblock(); sub.Stop(); <-sub.Closed() }()
	batch := func() string {
		select {
		case b := <-pulls:
			return b
		case <-time.After(10 * time.Second):
			t.Fatal("no pull")
			return ""
		}
	}
	if b := batch(); !strings.HasPrefix(b, `{"batch":10,`) {
		t.Fatalf("first pull %q", b)
	}
	eventually(t, 10*time.Second, "8 messages waiting, 1 in the handler", func() bool { return len(sub.ch) == 8 })
	close(sendStatus)
	select {
	case b := <-pulls:
		t.Fatalf("pulled %q with 9 messages in hand and 10 wanted", b)
	case <-time.After(500 * time.Millisecond):
	}
	unblock()
	if b := batch(); !strings.HasPrefix(b, `{"batch":6,`) {
		t.Fatalf("pull after handling 5 of 9: %q, want a batch of 6", b)
	}
}

// 409 "Message Size Exceeds MaxBytes" ends a pull whose bytes ran out:
// routine after messages, but in a run with none between, the next message
// cannot be pulled at all. The Sub says so once per run, and not for the
// routine case; past the run it pulls again once a heartbeat tick, not at
// once (the server refuses at once: a busy loop on both sides). A pull
// that took messages says so in its Nats-Pending-Bytes, less than it asked
// for: routine too, when a replicated consumer's status overtakes the
// messages (taken: none come before the statuses).
func TestMessageLargerThanMaxBytesReported(t *testing.T) {
	// Long enough that "at once" (under tick/2) holds on a loaded machine.
	const tick = time.Second
	for _, tc := range []struct {
		name    string
		between bool // a message before each status
		took    int  // bytes each pull took, by its status
		routine bool
	}{
		{"none taken", false, 0, false},
		{"messages between", true, 0, true},
		{"taken, overtaken by the status", false, 100, true},
	} {
		between := tc.between
		t.Run(tc.name, func(t *testing.T) {
			const answers = 2*tooBigRun + 1
			lastPull := make(chan struct{}) // the pull after the last answer: all answers read
			var mu sync.Mutex
			var at []time.Time // when each pull came
			url := pullServer(t, func(w io.Writer, inbox, sid string, n int, _ string) {
				mu.Lock()
				at = append(at, time.Now())
				mu.Unlock()
				if n > answers {
					if n == answers+1 {
						close(lastPull)
					}
					return // left open
				}
				if between {
					_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.%d.%d.0.0 1\r\nx\r\n", sid, n, n)
				}
				writeStatus(w, inbox, sid, fmt.Sprintf("NATS/1.0 409 Message Size Exceeds MaxBytes\r\nNats-Pending-Messages: 10\r\nNats-Pending-Bytes: %d\r\n\r\n", 2<<20-tc.took))
			})
			ctx := testCtx(t, 30*time.Second)
			c := dialTest(t, ctx, url)
			errs := make(chan error, 16)
			sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, MaxBytes: 2 << 20, Expires: 30 * time.Second, Heartbeat: tick},
				func(m *Msg) { _ = m.Ack() }, func(err error) { errs <- err })
			if err != nil {
				t.Fatal(err)
			}
			defer func() { sub.Stop(); <-sub.Closed() }()
			select {
			case <-lastPull:
			case <-ctx.Done():
				t.Fatal("the Sub did not pull after every answer")
			}
			mu.Lock()
			pulled := at[:answers+1] // later ones follow missed heartbeats
			mu.Unlock()
			// The next error but a missed heartbeat (the fake server sends
			// none), or nil after d.
			nextErr := func(d time.Duration) error {
				deadline := time.After(d)
				for {
					select {
					case err := <-errs:
						if !errors.Is(err, ErrNoHeartbeat) {
							return err
						}
					case <-deadline:
						return nil
					}
				}
			}
			for n := 2; n <= len(pulled); n++ {
				// Pull n follows answer n-1. Past the run (tooBigRun
				// answers, which the pull after it, uncapped under a
				// Budget, follows at once), a tick later.
				paced := !tc.routine && n-1 > tooBigRun
				if gap := pulled[n-1].Sub(pulled[n-2]); paced != (gap >= tick/2) {
					t.Errorf("pull %d came %v after pull %d; paced by the tick (%v): want %v", n, gap, n-1, tick, paced)
				}
			}
			if tc.routine {
				if err := nextErr(200 * time.Millisecond); err != nil {
					t.Fatalf("routine 409s reported: %v", err)
				}
				return
			}
			var se *StatusError
			err = nextErr(10 * time.Second)
			if err == nil {
				t.Fatal("a run of 409s with no message between was not reported")
			}
			if !errors.As(err, &se) || se.Code != 409 || !strings.Contains(err.Error(), "larger than the pull's max_bytes (2097152 bytes") {
				t.Fatalf("error %v, want the 409 and why", err)
			}
			if err := nextErr(200 * time.Millisecond); err != nil {
				t.Fatalf("reported again in the same run: %v", err)
			}
		})
	}
}

// A pull whose max_bytes the messages use up exactly ends on the server
// without a status (nats-server's nextWaiting): the Sub pulls again once
// what arrived is handled, instead of counting the messages the pull did
// not bring as still on their way until missed heartbeats. A pull with a
// byte to spare is still open, and the Sub waits for its status.
func TestPullWhoseBytesRanOutExactlyEnds(t *testing.T) {
	const maxBytes = 1 << 20 // the fake server's max_payload, the least MaxBytes may be
	for _, spare := range []int{0, 1} {
		t.Run(fmt.Sprintf("bytes to spare: %d", spare), func(t *testing.T) {
			pulls := make(chan string, 16)
			url := pullServer(t, func(w io.Writer, inbox, sid string, n int, body string) {
				pulls <- body
				if n != 1 {
					return
				}
				reply := "$JS.ACK.S.C.1.1.1.0.0"
				data := strings.Repeat("x", maxBytes-spare-len("S.x")-len(reply))
				_, _ = fmt.Fprintf(w, "MSG S.x %s %s %d\r\n%s\r\n", sid, reply, len(data), data)
			})
			ctx := testCtx(t, 30*time.Second)
			c := dialTest(t, ctx, url)
			var handled atomic.Int64
			var errs []error
			var mu sync.Mutex
			sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, MaxBytes: maxBytes, Expires: 30 * time.Second, Heartbeat: 10 * time.Second},
				func(*Msg) { handled.Add(1) }, func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() })
			if err != nil {
				t.Fatal(err)
			}
			defer func() { sub.Stop(); <-sub.Closed() }()
			if b := <-pulls; !strings.Contains(b, fmt.Sprintf(`"max_bytes":%d,`, maxBytes)) {
				t.Fatalf("first pull %q", b)
			}
			eventually(t, 10*time.Second, "the message handled", func() bool { return handled.Load() == 1 })
			select {
			case b := <-pulls:
				if spare > 0 {
					t.Fatalf("pulled %q while the first pull, %d byte short of its max_bytes, is open", b, spare)
				}
				if !strings.HasPrefix(b, `{"batch":10,`) {
					t.Fatalf("second pull %q, want a batch of 10", b)
				}
			case <-time.After(3 * time.Second):
				if spare == 0 {
					mu.Lock()
					defer mu.Unlock()
					t.Fatalf("no pull after the first one's bytes ran out (errors: %v)", errs)
				}
			}
		})
	}
}

// A pull that ends by its batch count, its max_bytes mostly unused, gets
// no status: its bytes must not stay counted as open, or a later pull whose
// bytes run out exactly (no status either) is not seen to end, and the Sub
// pulls again only after missed heartbeats.
func TestExactBytesAfterACountEndedPull(t *testing.T) {
	const maxBytes = 1 << 20
	pulls := make(chan string, 16)
	url := pullServer(t, func(w io.Writer, inbox, sid string, n int, body string) {
		pulls <- body
		switch n {
		case 1: // ends by its batch count
			for i := range 10 {
				_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.%d.%d.0.0 1\r\nx\r\n", sid, i+1, i+1)
			}
		case 2: // ends by its bytes, exactly, with no status
			reply := "$JS.ACK.S.C.1.11.11.0.0"
			data := strings.Repeat("x", maxBytes-len("S.x")-len(reply))
			_, _ = fmt.Fprintf(w, "MSG S.x %s %s %d\r\n%s\r\n", sid, reply, len(data), data)
		}
	})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	var handled atomic.Int64
	var mu sync.Mutex
	var errs []error
	var sub *Sub
	subbed := make(chan struct{})
	handler := func(*Msg) {
		if handled.Add(1) == 1 {
			// All of the first pull arrives before the second is sent
			// (at half, after six are handled): it has ended, by count.
			<-subbed
			for deadline := time.Now().Add(5 * time.Second); len(sub.ch) < 9 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		}
	}
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, MaxBytes: maxBytes, Expires: 30 * time.Second, Heartbeat: 10 * time.Second},
		handler, func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() })
	close(subbed)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	for i := 1; i <= 3; i++ {
		select {
		case b := <-pulls:
			t.Logf("pull %d: %s", i, strings.TrimSpace(b))
		case <-time.After(5 * time.Second):
			sub.pmu.Lock()
			pending := sub.pending
			sub.pmu.Unlock()
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("no pull %d within 5s (handled %d, pending %d, openBytes %d, errors %v)", i, handled.Load(), pending, sub.openBytes.Load(), errs)
		}
	}
}

// batchSum adds up the "batch" of the pull bodies in pulls, read until it
// is empty, and returns it with the bodies.
func batchSum(t *testing.T, pulls chan string) (int, []string) {
	t.Helper()
	var sum int
	var bodies []string
	for {
		select {
		case b := <-pulls:
			var p struct{ Batch int }
			if err := json.Unmarshal([]byte(b), &p); err != nil {
				t.Fatalf("pull %q: %v", b, err)
			}
			sum += p.Batch
			bodies = append(bodies, strings.TrimSpace(b))
		default:
			return sum, bodies
		}
	}
}

// nats-server 2.15 ends a pull by its batch count, its max_bytes mostly
// unused, with a 409 Batch Completed right after its last message. When
// the delivery goroutine has sent the next pull between the two (every
// message requested arrived: it forgets the open bytes), the status's
// bytes must not come off the new pull's too: openBytes reached 0 at the
// new pull's first message, and the Sub pulled a third time while the
// second was open, past MaxMessages.
func TestBatchCompletedAfterTheNextPull(t *testing.T) {
	const maxBytes = 1 << 20
	pullSize := func(i int) int { return len("S.x") + len(fmt.Sprintf("$JS.ACK.S.C.1.%d.%d.0.0", i, i)) + 1 }
	var first int // the pullSize of pull 1's ten messages
	for i := 1; i <= 10; i++ {
		first += pullSize(i)
	}
	pulls := make(chan string, 16)
	url := pullServer(t, func(w io.Writer, inbox, sid string, n int, body string) {
		pulls <- body
		switch n {
		case 1: // ends by its batch count; its status comes with pull 2
			for i := 1; i <= 10; i++ {
				_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.%d.%d.0.0 1\r\nx\r\n", sid, i, i)
			}
		case 2:
			writeStatus(w, inbox, sid, fmt.Sprintf("NATS/1.0 409 Batch Completed\r\nNats-Pending-Messages: 0\r\nNats-Pending-Bytes: %d\r\n\r\n", maxBytes-first))
			// As large as pull 1's ten: with their bytes taken off pull
			// 2's, it used up the rest.
			reply := "$JS.ACK.S.C.1.11.11.0.0"
			data := strings.Repeat("x", first-len("S.x")-len(reply))
			_, _ = fmt.Fprintf(w, "MSG S.x %s %s %d\r\n%s\r\n", sid, reply, len(data), data)
		}
	})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	var handled atomic.Int64
	ready := make(chan struct{})
	rec := newErrRecorder()
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, MaxBytes: maxBytes, Expires: 30 * time.Second, Heartbeat: 10 * time.Second},
		func(*Msg) {
			if handled.Add(1) == 1 {
				<-ready // all of pull 1 arrives before pull 2 is sent
			}
		}, rec.onErr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	eventually(t, 10*time.Second, "pull 1's ten messages arrived", func() bool { return sub.held.Load() == 10 })
	close(ready)
	eventually(t, 10*time.Second, "pull 2's message handled", func() bool { return handled.Load() == 11 })
	// The Sub writes a pull before it hands on the message that prompted
	// it: the server has read any once it answers this PING.
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	sum, bodies := batchSum(t, pulls)
	if len(bodies) != 2 || sum-11 > 10 {
		t.Fatalf("pulls %q: %d requested and not handled, MaxMessages 10; want 2 pulls", bodies, sum-11)
	}
	if got, want := sub.openBytes.Load(), int64(maxBytes-first); got != want {
		t.Fatalf("openBytes %d, want %d (pull 2's max_bytes less its message)", got, want)
	}
}

// With a replicated consumer a pull's 409 Batch Completed overtakes its
// messages (the server holds deliveries back until they are replicated).
// Sent with every earlier message arrived (a reset), that pull's status
// still subtracts its bytes: otherwise they stayed counted, a later pull
// whose bytes ran out exactly was not seen to end, and the Sub waited for
// missed heartbeats.
func TestBatchCompletedBeforeItsMessages(t *testing.T) {
	const maxBytes = 1 << 20
	msg := func(w io.Writer, sid string, i int) {
		_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.%d.%d.0.0 1\r\nx\r\n", sid, i, i)
	}
	size := func(from, to int) (n int) {
		for i := from; i <= to; i++ {
			n += len("S.x") + len(fmt.Sprintf("$JS.ACK.S.C.1.%d.%d.0.0", i, i)) + 1
		}
		return n
	}
	pulls := make(chan string, 16)
	url := pullServer(t, func(w io.Writer, inbox, sid string, n int, body string) {
		pulls <- body
		switch n {
		case 1: // ten messages, then its status
			for i := 1; i <= 10; i++ {
				msg(w, sid, i)
			}
			writeStatus(w, inbox, sid, fmt.Sprintf("NATS/1.0 409 Batch Completed\r\nNats-Pending-Messages: 0\r\nNats-Pending-Bytes: %d\r\n\r\n", maxBytes-size(1, 10)))
		case 2: // batch 6: its status first, then two of its messages
			writeStatus(w, inbox, sid, fmt.Sprintf("NATS/1.0 409 Batch Completed\r\nNats-Pending-Messages: 0\r\nNats-Pending-Bytes: %d\r\n\r\n", maxBytes-size(11, 16)))
			msg(w, sid, 11)
			msg(w, sid, 12)
		case 3: // pull 2's other four, then one that uses up pull 3's bytes exactly
			for i := 13; i <= 16; i++ {
				msg(w, sid, i)
			}
			reply := "$JS.ACK.S.C.1.17.17.0.0"
			data := strings.Repeat("x", maxBytes-len("S.x")-len(reply))
			_, _ = fmt.Fprintf(w, "MSG S.x %s %s %d\r\n%s\r\n", sid, reply, len(data), data)
		}
	})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	var handled atomic.Int64
	ready := make(chan struct{})
	rec := newErrRecorder()
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, MaxBytes: maxBytes, Expires: 30 * time.Second, Heartbeat: 10 * time.Second},
		func(*Msg) {
			if handled.Add(1) == 1 {
				<-ready
			}
		}, rec.onErr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	// All of pull 1 and its status before pull 2 is sent (at six handled).
	eventually(t, 10*time.Second, "pull 1 and its status arrived", func() bool { return sub.held.Load() == 10 && sub.openBytes.Load() == 0 })
	close(ready)
	eventually(t, 10*time.Second, "the last message handled", func() bool { return handled.Load() == 17 })
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	_, bodies := batchSum(t, pulls)
	if len(bodies) != 4 {
		t.Fatalf("pulls %q; want a fourth once pull 3's bytes ran out", bodies)
	}
}

// After a run of 409 "Message Size Exceeds MaxBytes", a Sub under a Budget
// asks for all of the Budget's room, so that a message stored under a
// larger max_payload may come, but for that one message only; once it
// came, pulls are capped at maxPullBytes again (an uncapped burst may
// exceed the server's max_pending for the client).
func TestPullsCappedAgainAfterTheLargeMessage(t *testing.T) {
	pulls := make(chan string, 16)
	url := pullServer(t, func(w io.Writer, inbox, sid string, n int, body string) {
		pulls <- body
		switch {
		case n <= tooBigRun:
			writeStatus(w, inbox, sid, "NATS/1.0 409 Message Size Exceeds MaxBytes\r\nNats-Pending-Messages: 10\r\nNats-Pending-Bytes: 8388608\r\n\r\n")
		case n == tooBigRun+1:
			_, _ = fmt.Fprintf(w, "MSG S.x %s $JS.ACK.S.C.1.1.1.0.0 1\r\nx\r\n", sid)
			writeStatus(w, inbox, sid, "NATS/1.0 409 Batch Completed\r\nNats-Pending-Messages: 0\r\nNats-Pending-Bytes: 1000\r\n\r\n")
		}
	})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10, Budget: NewBudget(64 << 20), Expires: 30 * time.Second, Heartbeat: 10 * time.Second},
		func(m *Msg) { _ = m.Ack() }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	capped := fmt.Sprintf(`"max_bytes":%d,`, maxPullBytes)
	for n := 1; n <= tooBigRun+2; n++ {
		var b string
		select {
		case b = <-pulls:
		case <-ctx.Done():
			t.Fatalf("no pull %d", n)
		}
		if want := n <= tooBigRun || n == tooBigRun+2; strings.Contains(b, capped) != want {
			t.Fatalf("pull %d: %q; capped at %d bytes: want %v", n, b, maxPullBytes, want)
		}
		// The uncapped pull asks for the large message alone: those behind
		// it must not come in one burst of the Budget's whole room.
		if one := strings.HasPrefix(b, `{"batch":1,`); one != (n == tooBigRun+1) {
			t.Fatalf("pull %d: %q; a batch of 1: want %v", n, b, n == tooBigRun+1)
		}
	}
}

// Flush gives up when its ctx ends while a write holds the connection (a
// server that stopped reading keeps a write going for up to WriteTimeout),
// instead of waiting for the write first.
func TestFlushHonoursItsContextWhileAWriteHoldsTheConnection(t *testing.T) {
	url := pullServer(t, func(io.Writer, string, string, int, string) {})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock() // as the flusher holds it through a stuck write
	unlock := time.AfterFunc(3*time.Second, c.mu.Unlock)
	fctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Flush(fctx)
	took := time.Since(start)
	if unlock.Stop() {
		c.mu.Unlock()
	}
	if !errors.Is(err, context.DeadlineExceeded) || took > 2*time.Second {
		t.Fatalf("Flush = %v after %v, want its context's deadline at once", err, took)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("Flush once the write is over: %v", err)
	}
}

// Drain returns at once while a write to a server that reads nothing holds
// the connection's lock (until Options.WriteTimeout): its UNSUB waits on a
// goroutine of the Sub's, and the drain completes once the write is over.
// Before, Drain waited for the lock, and so did the caller's shutdown:
// consumer.Run, its hard context ended, held until the write timed out.
func TestDrainDoesNotWaitForAWriteHoldingTheConnection(t *testing.T) {
	url := pullServer(t, func(io.Writer, string, string, int, string) {})
	ctx := testCtx(t, 30*time.Second)
	c := dialTest(t, ctx, url)
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 10}, func(*Msg) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil { // SUB and the pull are out
		t.Fatal(err)
	}
	c.mu.Lock() // as the flusher holds it through a stuck write
	unlock := time.AfterFunc(3*time.Second, c.mu.Unlock)
	drained := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(drained)
		sub.Drain()
	}()
	select {
	case <-drained:
	case <-time.After(2 * time.Second):
	}
	took := time.Since(start)
	if unlock.Stop() {
		c.mu.Unlock()
	}
	<-drained
	if took > time.Second {
		t.Fatalf("Drain took %v with the connection's lock held, want it to return at once", took)
	}
	waitClosed(t, sub, 5*time.Second) // the UNSUB and its PING went out, and the PONG came
	if err := sub.Err(); err != nil {
		t.Fatalf("Err after Drain: %v", err)
	}
}

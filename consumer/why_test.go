package consumer

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// A server that answers nothing at all (stopped with SIGSTOP, overloaded,
// a network that drops its traffic) on a connection still open is said
// to be NATS not answering; before, why blamed JetStream (a full disk, a
// cluster without a meta leader) for it too. A server that answers
// without JetStream is still JetStream not answering.
func TestWhyTellsASilentServerFromJetStreamGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	silent := silentServer(t, false)
	dropping := silentServer(t, true)
	noJS := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	const what = "look up the consumer"
	for _, tc := range []struct {
		name, url string
		// look bounds the account info request and the flush: short
		// where nothing answers, long where the PONG must come in time
		// on a loaded machine.
		look      time.Duration
		want, not string
	}{
		{"a silent server", silent, 300 * time.Millisecond, natsSilent + ": " + what, jetStreamGone},
		{"a server without JetStream", noJS.ClientURL(), 2 * time.Second, jetStreamGone + ": " + what, natsSilent},
		// The connection drops during the flush: neither (before, it
		// fell through to JetStream being gone).
		{"a server that closes on the PING", dropping, 2 * time.Second, what, "answer"},
	} {
		// No reconnect before why has looked (nats.go waits ReconnectWait
		// before it dials the one server again).
		nc, err := nats.Connect(tc.url, nats.MaxReconnects(-1), nats.ReconnectWait(time.Minute))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		c := &Consumer{nc: nc, js: js, lookTimeout: tc.look}
		got := c.why(ctx, what, nats.ErrTimeout)
		nc.Close()
		if !strings.HasPrefix(got, tc.want) || strings.Contains(got, tc.not) {
			t.Errorf("%s: why = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// "JetStream system temporarily unavailable" (API error 10008: a cluster
// without a meta leader while it elects one) is JetStream not answering,
// as a timeout is; before, why said the step alone. And check, which met
// a quorum loss as "JetStream is not available on nats.url: context
// deadline exceeded", says it in run's words (jetStreamGone).
func TestJetStreamUnavailableSaidAsRunSaysIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	noJS := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	nc, err := nats.Connect(noJS.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const what = "look up the consumer"
	c := &Consumer{nc: nc, js: js, lookTimeout: 2 * time.Second}
	unavailable := fmt.Errorf("look up: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"})
	if got := c.why(ctx, what, unavailable); got != jetStreamGone+": "+what {
		t.Errorf("why of API error 10008 = %q, want %q", got, jetStreamGone+": "+what)
	}
	if got := c.why(ctx, what, &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeBadRequest}); got != what {
		t.Errorf("why of a bad request = %q, want %q", got, what)
	}
	// check, on a server that answers a client's connect and nothing
	// after (no answer to the account info request): run's words.
	cfg := testConfigURL(t, silentServer(t, false))
	cctx, ccancel := context.WithTimeout(ctx, time.Second)
	_, err = Check(cctx, cfg, testLogger(t, nil))
	ccancel()
	if err == nil || !strings.HasPrefix(err.Error(), "JetStream is not available on nats.url: "+jetStreamGone+": ") {
		t.Errorf("check on a silent server: %v, want %q first", err, "JetStream is not available on nats.url: "+jetStreamGone)
	}
	// On a server without JetStream, and with a domain no JetStream
	// answers in, New's words: -js, nats.domain; not a full disk.
	jsSrv := testenv.NATS(t)
	for _, tc := range []struct{ url, domain, want string }{
		{noJS.ClientURL(), "", "is it run with -js?"},
		{jsSrv.URL(), "nope", `no JetStream answers in domain "nope" from this server: check nats.domain, and, through a leaf node, that its link to the servers of that domain is up`},
	} {
		cfg := testConfigURL(t, tc.url)
		cfg.Domain = tc.domain
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := Check(cctx, cfg, testLogger(t, nil))
		ccancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), jetStreamGone) {
			t.Errorf("check on %s (domain %q): %v, want %q and not %q", tc.url, tc.domain, err, tc.want, jetStreamGone)
		}
	}
}

// silentServer is the URL of a fake NATS server that answers a client's
// connect (INFO, then a PONG for its first PING) and nothing after, while
// it keeps the connection open and reads what comes; or, with
// closeOnPing, closes the connection at the next PING.
func silentServer(t *testing.T, closeOnPing bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = l.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		var readers sync.WaitGroup
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
			readers.Wait()
		}()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, conn)
			_, _ = io.WriteString(conn, `INFO {"server_id":"silent","version":"2.10.0","proto":1,"headers":true,"max_payload":1048576}`+"\r\n")
			readers.Go(func() {
				r := bufio.NewReader(conn)
				answered := false
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if answered && closeOnPing && strings.HasPrefix(line, "PING") {
						_ = conn.Close()
						return
					}
					if !answered && strings.HasPrefix(line, "PING") {
						answered = true
						_, _ = io.WriteString(conn, "PONG\r\n")
					}
				}
			})
		}
	}()
	return "nats://" + l.Addr().String()
}

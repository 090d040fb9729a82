package consumer

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/consumer/wire"
)

// probeServer is a fake NATS server for one wire connection: it confirms
// CONNECT, then hands the connection and the PINGs it reads (one value
// each) to script, which runs on a goroutine of its own. It returns the URL
// to dial; the connection and the goroutines end in t.Cleanup.
func probeServer(t *testing.T, script func(conn net.Conn, pings <-chan struct{})) string {
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
		if _, err := conn.Write([]byte(`INFO {"server_id":"fake","headers":true,"max_payload":1048576}` + "\r\n")); err != nil {
			return
		}
		br := bufio.NewReader(conn)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if strings.HasPrefix(line, "PING") {
				break
			}
		}
		if _, err := conn.Write([]byte("PONG\r\n")); err != nil {
			return
		}
		pings := make(chan struct{}, 64)
		scripted := make(chan struct{})
		go func() {
			defer close(scripted)
			script(conn, pings)
		}()
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				break
			}
			if strings.HasPrefix(line, "PING") {
				pings <- struct{}{}
			}
		}
		close(pings)
		<-scripted
	}()
	t.Cleanup(func() { _ = l.Close(); <-done })
	return "nats://" + l.Addr().String()
}

// probeWire drops a connection that answers its PING with nothing at all
// within wireProbeTimeout, but not one that is still receiving: a large
// message arriving slowly holds the PONG (and the pull's heartbeats)
// behind it. Before, the probe aborted such a connection after 2 s, the
// message half-read, and again at each redelivery.
func TestProbeWireDropsOnlyASilentConnection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flowing bool
	}{{"bytes flowing", true}, {"silent", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			url := probeServer(t, func(conn net.Conn, pings <-chan struct{}) {
				if !tc.flowing {
					for range pings { // read, never answered
					}
					return
				}
				// 1,000,000 bytes over about 5 s (200 KB/s), then the
				// PONGs, which the server sends after what it wrote.
				_, _ = conn.Write([]byte("MSG S.x 1 $JS.ACK.S.C.1.1.1.0.0 1000000\r\n"))
				chunk := []byte(strings.Repeat("x", 20000))
				for range 50 {
					if _, err := conn.Write(chunk); err != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				_, _ = conn.Write([]byte("\r\n"))
				for range pings {
					_, _ = conn.Write([]byte("PONG\r\n"))
				}
			})
			wc, err := wire.Dial(ctx, wire.Options{URL: url})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = wc.Close() }()
			log := &syncBuffer{}
			c := &Consumer{log: testLogger(t, log)}
			start := time.Now()
			c.probeWire(wc)
			if tc.flowing {
				// This Flush's PONG comes after the probe's.
				if err := wc.Flush(ctx); err != nil {
					t.Fatalf("the connection was dropped while the message arrived, after %.1fs: %v (log: %s)", time.Since(start).Seconds(), err, log.String())
				}
				if took := time.Since(start); took < 3*time.Second {
					t.Fatalf("answered after %v: the message did not hold the PONG past wireProbeTimeout", took)
				}
				return
			}
			select {
			case <-wc.Done():
			case <-ctx.Done():
				t.Fatal("a connection answering nothing was not dropped")
			}
			if took := time.Since(start); took < wireProbeTimeout || took > 2*wireProbeTimeout+time.Second {
				t.Errorf("dropped after %v, want %v to %v", took, wireProbeTimeout, 2*wireProbeTimeout)
			}
			if err := wc.Err(); !errors.Is(err, wire.ErrConnectionClosed) || !strings.Contains(log.String(), "does not answer") {
				t.Errorf("Err %v, log %q", err, log.String())
			}
		})
	}
}

package consumer

import (
	"context"
	"math"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetsink/jetsink/tests/testenv"
)

// nsDialer makes the consumer's sockets inside a partition's namespace.
type nsDialer struct{ p *testenv.Partition }

func (d nsDialer) Dial(network, address string) (c net.Conn, err error) {
	err = d.p.Do(func() error { c, err = net.DialTimeout(network, address, 2*time.Second); return err })
	return c, err
}

// A server that goes silent without closing the connection is given up
// after maxPingsOut unanswered pings, and once it answers again the
// consumer reconnects and goes on delivering. With the test's ping
// interval (300 ms) not applied, jetsink's own 20 s (given up after
// 40-60 s) left the connection up past the test's 30 s deadline.
func TestSilentServerGivenUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	p := testenv.NewPartition(t)
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, srv)
	cfg.URL = "nats://" + testenv.Proxy(t, p.HostIP+":0", u.Host, math.MaxInt)
	cfg.dialer = nsDialer{p}
	cfg.pingEvery = 300 * time.Millisecond
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	r := startRun(t, ctx, c, 1, 16, 16)
	publish(t, ctx, js, cfg, 1, 1, 0)
	if g := r.next(t, ctx); bodyIndex(t, &g.ev) != 0 {
		t.Fatalf("first event %d, want 0", bodyIndex(t, &g.ev))
	}

	p.Cut(t)
	waitFor(t, ctx, "the silent connection to be given up", func() bool { return c.nc.Status() != nats.CONNECTED })
	p.Heal(t)
	waitFor(t, ctx, "the reconnect", func() bool { return c.nc.Status() == nats.CONNECTED })
	publish(t, ctx, js, cfg, 1, 1, 1)
	if g := r.next(t, ctx); bodyIndex(t, &g.ev) != 1 {
		t.Fatalf("event after the reconnect %d, want 1", bodyIndex(t, &g.ev))
	}
	r.stopClean(t, ctx)
}

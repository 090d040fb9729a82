package consumer

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetsink/jetsink/tests/testenv"
)

// nats.go connected to a server by IP (as to one another server gave out)
// while nats.url names a host: wire checks the server's certificate
// against that host name, as nats.go does, also with nats.tls.ca_file set.
// Before, the CA file's settings replaced the name, and wire checked the
// certificate against the IP.
func TestWireOptionsServerNameOfALearnedServer(t *testing.T) {
	srv := testenv.NATS(t)
	nc, err := nats.Connect(srv.URL()) // nats://127.0.0.1:<port>
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL(), "nats://"), ":")
	for _, tc := range []struct {
		name string
		tls  TLSConfig
	}{{"no TLS settings", TLSConfig{}}, {"ca_file", TLSConfig{CAFile: testenv.CAFile(t)}}} {
		c := &Consumer{cfg: Config{URL: "tls://localhost:" + port, TLS: tc.tls}, nc: nc, log: slog.Default()}
		o, err := c.wireOptions(nc.ConnectedUrl())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if o.ServerName != "localhost" || o.TLS != nil && o.TLS.ServerName != "" {
			t.Errorf("%s: ServerName %q (TLS set: %v); want ServerName localhost, and no TLS.ServerName to override it", tc.name, o.ServerName, o.TLS != nil)
		}
	}
	// Connected by the configured name: nothing to say.
	c := &Consumer{cfg: Config{URL: srv.URL()}, nc: nc, log: slog.Default()}
	if o, err := c.wireOptions(nc.ConnectedUrl()); err != nil || o.ServerName != "" {
		t.Errorf("connected as configured: ServerName %q, %v; want none", o.ServerName, err)
	}
}

// A server in lame duck mode (a rolling restart's step) closes its
// listener seconds before it closes its clients: nats.go stays connected
// to it meanwhile, and wire, dialling the server nats.go is on, was
// refused until it gave up and left the pulls to nats.go. It dials another
// server of the cluster instead.
//
// Everything from the listener's close to the wire connection's flush
// must happen while nats.go is still on n1, within the server's grace
// period: 5 s, not the cluster's 1 s, which a loaded machine could
// overrun (the test then fails saying nats.go left n1 already). The server
// exits a few seconds after it, well within the test's minute.
func TestWireDialsAnotherServerWhileNATSGosIsInLameDuckMode(t *testing.T) {
	cl := testenv.NewNATSCluster(t, 2, testenv.LameDuckGrace(5*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // after the cluster's start, which has bounds of its own
	defer cancel()
	nc, err := nats.Connect(cl.URLs(), nats.DontRandomize(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	first := cl.URLs()[:strings.IndexByte(cl.URLs(), ',')]
	if nc.ConnectedUrl() != first {
		t.Fatalf("nats.go connected to %s, want %s", nc.ConnectedUrl(), first)
	}
	ducked := make(chan error, 1)
	go func() { ducked <- cl.LameDuck(ctx, 0) }()
	defer func() { <-ducked }()
	waitFor(t, ctx, "n1's listener closed", func() bool {
		conn, err := net.Dial("tcp", strings.TrimPrefix(first, "nats://"))
		if err == nil {
			_ = conn.Close()
		}
		return err != nil
	})
	if !nc.IsConnected() || nc.ConnectedUrl() != first {
		t.Fatalf("nats.go left n1 already (%s): lame duck mode closed its clients before the test dialled", nc.ConnectedUrl())
	}
	c := &Consumer{cfg: Config{URL: cl.URLs()}, nc: nc, log: slog.Default()}
	wc, err := c.wireConn(ctx)
	if err != nil {
		t.Fatalf("wire refused while another server of the cluster is up: %v", err)
	}
	defer wc.Close()
	if err := wc.Flush(ctx); err != nil {
		t.Fatalf("the wire connection does not answer: %v", err)
	}
}

// The servers the wire connection may fall back to carry the credentials
// nats.go connects to them with (its pool gives none): those of their URL
// in nats.url, or for one nats.go discovered those of the URL it connected
// with; the server it is on is not among them.
func TestOtherServersKeepTheURLsCredentials(t *testing.T) {
	pool := []string{"nats://127.0.0.1:1", "nats://127.0.0.1:2", "nats://127.0.0.1:3", "tls://127.0.0.1:4", "nats://127.0.0.1:5"}
	discovered := []string{"nats://127.0.0.1:2", "tls://127.0.0.1:4"}
	configured := "nats://u:p@127.0.0.1:1, nats://x:y@127.0.0.1:3,nats://127.0.0.1:5"
	for _, tc := range []struct {
		connected string
		want      []string
	}{
		{"nats://u:p@127.0.0.1:1", []string{"nats://u:p@127.0.0.1:2", "nats://x:y@127.0.0.1:3", "tls://u:p@127.0.0.1:4", "nats://127.0.0.1:5"}},
		{"nats://s3cr3t-token@127.0.0.1:2", []string{"nats://u:p@127.0.0.1:1", "nats://x:y@127.0.0.1:3", "tls://s3cr3t-token@127.0.0.1:4", "nats://127.0.0.1:5"}},
		{"nats://127.0.0.1:5", []string{"nats://u:p@127.0.0.1:1", "nats://127.0.0.1:2", "nats://x:y@127.0.0.1:3", "tls://127.0.0.1:4"}},
	} {
		if got := otherServers(tc.connected, pool, discovered, configured); !slices.Equal(got, tc.want) {
			t.Errorf("connected to %s: %q, want %q", tc.connected, got, tc.want)
		}
	}
}

// raceDialer dials address, except the first dial after arm: that one
// cuts the proxy nats.go's connection goes through, waits until nats.go's
// disconnect handler has run, and then dials the server at direct.
type raceDialer struct {
	armed  atomic.Bool
	cut    func()
	ran    func() bool // the disconnect handler has run
	direct string
}

func (d *raceDialer) Dial(network, address string) (net.Conn, error) {
	if !d.armed.CompareAndSwap(true, false) {
		return net.Dial(network, address)
	}
	d.cut()
	deadline := time.Now().Add(10 * time.Second)
	for !d.ran() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return net.Dial(network, d.direct)
}

// nats.go disconnects while the wire connection is being dialled: its
// disconnect handler aborts the wire connection it finds, and finds none
// (the old one, not this one). wireConn then must not hand on a live wire
// connection while nats.go is away: the wire client pulls only while the
// API, and the acks of a lost wire connection's messages, can get
// through. Before, the session pulled meanwhile.
func TestWireConnNotMadeWhileNATSDisconnects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	p := testenv.NewGateProxy(t, strings.TrimPrefix(srv.URL(), "nats://"))
	cfg := testConfig(t, srv)
	cfg.URL = p.URL()
	d := &raceDialer{cut: p.Cut, direct: strings.TrimPrefix(srv.URL(), "nats://")}
	cfg.dialer = d
	c := newConsumer(t, ctx, cfg)
	before := c.acks.disconnects.Load()
	d.ran = func() bool { return c.acks.disconnects.Load() != before }
	d.armed.Store(true)
	wc, err := c.wireConn(ctx)
	if !d.ran() {
		t.Fatal("nats.go's disconnect handler did not run while the wire connection was dialled; the test proves nothing")
	}
	if err == nil && !isDone(wc) {
		t.Fatalf("wireConn returned a live wire connection while nats.go is disconnected (connected: %v)", c.nc.IsConnected())
	}
	t.Logf("wireConn: %v", err)
	p.Reopen() // for Close, which confirms the acks
	waitFor(t, ctx, "the reconnect", c.nc.IsConnected)
}

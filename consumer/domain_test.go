package consumer

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/embedded"
)

// hubAndLeaf starts a hub server whose JetStream is domain "hub" and a
// leaf node of it with a JetStream of its own (domain "leaf"), both on
// loopback, and waits until the hub's JetStream answers through the leaf:
// the link being up is not enough, the hub's API subjects reach the leaf
// a moment later (New got "no responders" in domain "hub" once in a
// flake hunt's run under load).
func hubAndLeaf(t *testing.T) (hub, leaf *server.Server) {
	t.Helper()
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	hub = startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, JetStreamDomain: "hub", StoreDir: t.TempDir(), ServerName: "hub",
		LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: port}})
	remote := &url.URL{Scheme: "nats-leaf", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	leaf = startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, JetStreamDomain: "leaf", StoreDir: t.TempDir(), ServerName: "leaf",
		LeafNode: server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{remote}}}}})
	nc, err := nats.Connect(leaf.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return hub, leaf
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hub's JetStream does not answer through the leaf node (leaf nodes: hub %d, leaf %d): %v",
				hub.NumLeafNodes(), leaf.NumLeafNodes(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// With nats.domain, jetsink connected to a leaf node consumes the stream
// its hub keeps: it creates the stream, the dead-letter stream and the
// durable in the hub's domain, pulls through the leaf, and its acks reach
// the hub's consumer. Without it, the same configuration reaches the
// leaf's own JetStream, where there is no such stream.
func TestDomainConsumesTheHubsStream(t *testing.T) {
	const n = 500
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hub, leaf := hubAndLeaf(t)
	hubNC, err := nats.Connect(hub.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hubNC.Close)
	hubJS, err := jetstream.New(hubNC)
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t)
	cfg := DefaultConfig()
	cfg.URL, cfg.Domain = leaf.ClientURL(), "hub"
	cfg.Stream, cfg.Subjects, cfg.Consumer = name, []string{"in." + name + ".>"}, "c_"+name
	cfg.CreateStream, cfg.DeadLetterSubject = true, "dlq."+name
	cfg.PullExpiry, cfg.PullHeartbeat = 2*time.Second, 500*time.Millisecond
	cfg.PullClient = cmp.Or(os.Getenv("JETSINK_TEST_PULL_CLIENT"), cfg.PullClient)

	c := newConsumer(t, ctx, cfg)
	for _, s := range []string{name, name + "_DLQ"} {
		if _, err := hubJS.Stream(ctx, s); err != nil {
			t.Fatalf("stream %s in the hub: %v", s, err)
		}
	}
	publish(t, ctx, hubJS, cfg, n, 4, 0)
	r := startRun(t, ctx, c, 2, 256, n)
	for range n {
		if err := r.next(t, ctx).ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	r.stopClean(t, ctx)
	waitFor(t, ctx, "the acks on the hub's consumer", func() bool {
		cons, err := hubJS.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return err == nil && cons.CachedInfo().AckFloor.Stream == n
	})
	_ = c.Close(context.Background())
	// check looks in the same domain: the stream, the durable and the
	// dead-letter stream are there (not "run will create them").
	if ps, err := Check(ctx, cfg, testLogger(t, nil)); err != nil || len(ps) > 0 {
		t.Fatalf("Check with nats.domain = %v, %v; want no problem", ps, err)

	}

	// The leaf's own JetStream has no such stream: without nats.domain,
	// New does not find it.
	cfg.Domain, cfg.CreateStream = "", false
	if _, err := New(ctx, cfg, testLogger(t, nil)); !errors.Is(err, ErrStreamNotFound) {
		t.Fatalf("New without nats.domain on the leaf = %v, want ErrStreamNotFound", err)
	}
	// A domain nothing serves: New says which key to check.
	cfg.Domain = "nowhere"
	if _, err := New(ctx, cfg, testLogger(t, nil)); !errors.Is(err, nats.ErrNoResponders) || !strings.Contains(err.Error(), `domain "nowhere"`) {
		t.Fatalf("New with a domain nothing serves = %v, want no responders naming the domain", err)
	}
}

// nats.domain must be one subject token.
func TestDomainValidated(t *testing.T) {
	for _, d := range []string{"a.b", "a b", "*", ">", "a\tb"} {
		cfg := DefaultConfig()
		cfg.Domain = d
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "nats.domain") {
			t.Errorf("Validate with nats.domain %q = %v, want an error naming nats.domain", d, err)
		}
	}
	cfg := DefaultConfig()
	cfg.Domain = "a/b" // not a stream name, but a domain the server takes
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate with nats.domain a/b = %v", err)
	}
	cfg.Domain = "hub"
	if got := cfg.APIPrefix(); got != "$JS.hub.API" {
		t.Errorf("APIPrefix = %q, want $JS.hub.API", got)
	}
}

package testenv

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetsink/jetsink/embedded"
)

// NATSCluster is a JetStream cluster of in-process nats-servers on
// loopback, routed to each other: what a production stream with replicas
// runs on. Each node keeps its client port, route port and store across
// Shutdown and Restart, as a restarted server does.
type NATSCluster struct {
	t     testing.TB
	mu    sync.Mutex
	nodes []*clusterNode
}

type clusterNode struct {
	opts *server.Options
	srv  *server.Server // nil while stopped
}

// Lame duck mode as a test can wait for: the clients are closed over
// lameDuckDuration after lameDuckGrace (a real server's defaults are 2
// minutes and 10 s).
const (
	lameDuckDuration = 4 * time.Second
	lameDuckGrace    = time.Second
)

// NewNATSCluster starts n routed JetStream servers (named n1, n2, ...) and
// waits until the cluster has a meta leader. They are shut down in
// t.Cleanup.
func NewNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	c := &NATSCluster{t: t}
	routes := make([]string, n)
	for i := range n {
		port, err := embedded.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		routePort, err := embedded.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", routePort)
		c.nodes = append(c.nodes, &clusterNode{opts: &server.Options{
			ServerName:          fmt.Sprintf("n%d", i+1),
			Host:                "127.0.0.1",
			Port:                port,
			JetStream:           true,
			StoreDir:            t.TempDir(),
			Cluster:             server.ClusterOpts{Name: "jetsink-test", Host: "127.0.0.1", Port: routePort},
			LameDuckDuration:    lameDuckDuration,
			LameDuckGracePeriod: lameDuckGrace,
			NoLog:               true,
			NoSigs:              true,
		}})
	}
	for _, nd := range c.nodes {
		nd.opts.Routes = server.RoutesFromStr(strings.Join(routes, ","))
	}
	// After the store directories' removal (t.TempDir) was registered:
	// cleanups run last first, and a running server writes in its store.
	t.Cleanup(c.destroy)
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			t.Fatal(err)
		}
	}
	c.waitMetaLeader()
	return c
}

func (c *NATSCluster) start(i int) error {
	opts := *c.nodes[i].opts // a server keeps and changes its options
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("nats-server %s: %w", opts.ServerName, err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("nats-server %s not ready after 10s", opts.ServerName)
	}
	c.mu.Lock()
	c.nodes[i].srv = srv
	c.mu.Unlock()
	return nil
}

// waitMetaLeader waits until a running node leads the JetStream meta group
// and every running node knows the cluster: JetStream API requests are
// answered.
func (c *NATSCluster) waitMetaLeader() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		leader, current := false, true
		for _, nd := range c.nodes {
			if nd.srv == nil {
				continue
			}
			leader = leader || nd.srv.JetStreamIsLeader()
			current = current && nd.srv.JetStreamIsCurrent()
		}
		c.mu.Unlock()
		if leader && current {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatal("the NATS cluster elected no JetStream meta leader in 30s")
}

// URLs is every node's client URL, separated by commas.
func (c *NATSCluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", nd.opts.Port)
	}
	return strings.Join(urls, ",")
}

// Connect returns a client connection to the cluster that reconnects for
// ever, closed in t.Cleanup.
func (c *NATSCluster) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to the NATS cluster: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Node is the index of the node called name (n1 is 0); -1 if none.
func (c *NATSCluster) Node(name string) int {
	for i, nd := range c.nodes {
		if nd.opts.ServerName == name {
			return i
		}
	}
	return -1
}

// Name is node i's server name.
func (c *NATSCluster) Name(i int) string { return c.nodes[i].opts.ServerName }

// Shutdown stops node i at once, as a crash or a kill would (its clients'
// connections drop; no lame duck mode).
func (c *NATSCluster) Shutdown(i int) {
	c.mu.Lock()
	srv := c.nodes[i].srv
	c.nodes[i].srv = nil
	c.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// LameDuck takes node i through lame duck mode, as a rolling restart does:
// it stops accepting clients, hands its Raft leaderships over, and closes
// its clients over a few seconds; it returns once the server is down.
func (c *NATSCluster) LameDuck(ctx context.Context, i int) error {
	c.mu.Lock()
	srv := c.nodes[i].srv
	c.mu.Unlock()
	if srv == nil {
		return fmt.Errorf("nats-server %s is not running", c.Name(i))
	}
	done := make(chan struct{})
	go func() {
		srv.LameDuckShutdown()
		srv.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		srv.Shutdown()
		<-done
		return ctx.Err()
	}
	c.mu.Lock()
	c.nodes[i].srv = nil
	c.mu.Unlock()
	return nil
}

// Restart starts stopped node i again on its ports and store, and waits
// until the cluster has a meta leader again.
func (c *NATSCluster) Restart(i int) error {
	c.mu.Lock()
	running := c.nodes[i].srv != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("nats-server %s is running", c.Name(i))
	}
	if err := c.start(i); err != nil {
		return err
	}
	c.waitMetaLeader()
	return nil
}

func (c *NATSCluster) destroy() {
	for i := range c.nodes {
		c.Shutdown(i)
	}
}

package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/embedded"
)

// NATSCluster is a JetStream cluster of nats-servers on loopback, each in
// a process of its own (NATSServerBinary), routed to each other: what a
// production stream with replicas runs on. A node can be killed (a crash:
// its connections reset, no leadership handed over, nothing flushed), or
// taken through lame duck mode, and restarted on its ports and store.
type NATSCluster struct {
	t     testing.TB
	bin   string
	mu    sync.Mutex
	nodes []*clusterNode
}

type clusterNode struct {
	name string
	port int    // client port
	conf string // configuration file
	dir  string // store and log
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// NATSClusterOption changes how NewNATSCluster configures its servers.
type NATSClusterOption func(*natsClusterOptions)

type natsClusterOptions struct {
	lameDuckGrace time.Duration
}

// LameDuckGrace sets the servers' lame_duck_grace_period: how long a server
// in lame duck mode, its listener closed, waits before it starts closing
// its clients. 1 s unless set; a test that must act while its clients are
// still connected asks for more.
func LameDuckGrace(d time.Duration) NATSClusterOption {
	return func(o *natsClusterOptions) { o.lameDuckGrace = d }
}

// NewNATSCluster starts n routed JetStream servers (named n1, n2, ...) and
// waits until the cluster answers JetStream API requests. They are killed
// in t.Cleanup.
func NewNATSCluster(t testing.TB, n int, opts ...NATSClusterOption) *NATSCluster {
	t.Helper()
	o := natsClusterOptions{lameDuckGrace: time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	c := &NATSCluster{t: t, bin: NATSServerBinary(t)}
	ports := make([]int, 0, 2*n) // client ports, then route ports
	for len(ports) < 2*n {
		p, err := embedded.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		// Each was free when picked, and then released, so FreePort may
		// give it again: two servers, or a server's two listeners, on one
		// port would fail to start.
		if !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("%q", fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i]))
	}
	for i := range n {
		nd := &clusterNode{name: fmt.Sprintf("n%d", i+1), port: ports[i], dir: t.TempDir()}
		nd.conf = filepath.Join(nd.dir, "nats.conf")
		// Lame duck mode as a test can wait for: after a grace period of
		// 1 s unless LameDuckGrace says otherwise (10 s by nats-server's
		// default) the clients are closed one a second at most, over up
		// to 30 s (the least a server takes; 2 minutes by default), and a
		// test has few.
		conf := fmt.Sprintf(`server_name: %s
listen: "127.0.0.1:%d"
jetstream { store_dir: %q }
cluster {
  name: "jetsink-test"
  listen: "127.0.0.1:%d"
  routes: [%s]
}
lame_duck_duration: "30s"
lame_duck_grace_period: %q
`, nd.name, nd.port, filepath.Join(nd.dir, "store"), ports[n+i], strings.Join(routes, ", "), o.lameDuckGrace)
		if err := os.WriteFile(nd.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, nd)
	}
	// After the directories' removal (t.TempDir) was registered: cleanups
	// run last first, and a running server writes in its store.
	t.Cleanup(c.destroy)
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			t.Fatal(err)
		}
	}
	c.waitJetStream(-1)
	return c
}

// start starts node i and waits until it accepts clients.
func (c *NATSCluster) start(i int) error {
	nd := c.nodes[i]
	logf, err := os.OpenFile(filepath.Join(nd.dir, "nats.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(c.bin, "-c", nd.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	DieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start nats-server %s: %w", nd.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	c.mu.Lock()
	nd.cmd, nd.done = cmd, done
	c.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", nd.port), time.Second)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		// The error carries the end of the server's log: its directory
		// is t.TempDir's, removed when the test ends.
		select {
		case <-done:
			return fmt.Errorf("nats-server %s exited at start; the end of its log:\n%s", nd.name, logTail(logf.Name()))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server %s accepts no client after 20s: %w; the end of its log:\n%s", nd.name, err, logTail(logf.Name()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logTail is the last 20 lines of the file at path, or why it cannot be
// read.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// waitJetStream waits until the cluster answers a JetStream API request
// (it has a meta leader) over a connection to node i, or to any node when
// i is -1.
func (c *NATSCluster) waitJetStream(i int) {
	c.t.Helper()
	url := c.URLs()
	if i >= 0 {
		url = c.url(i)
	}
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
		if err == nil {
			var js jetstream.JetStream
			if js, err = jetstream.New(nc); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err = js.AccountInfo(ctx)
				cancel()
			}
			nc.Close()
			if err == nil {
				return
			}
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("the NATS cluster answers no JetStream request in 30s: %v", last)
}

func (c *NATSCluster) url(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].port)
}

// URLs is every node's client URL, separated by commas.
func (c *NATSCluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.url(i)
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
		if nd.name == name {
			return i
		}
	}
	return -1
}

// NodeOf is the index of the node at url (a client URL, as URLs gives
// them); -1 if none.
func (c *NATSCluster) NodeOf(url string) int {
	for i := range c.nodes {
		if url == c.url(i) {
			return i
		}
	}
	return -1
}

// Name is node i's server name.
func (c *NATSCluster) Name(i int) string { return c.nodes[i].name }

// Kill kills node i (SIGKILL), as a crash would: its connections reset,
// it hands no leadership over and flushes nothing.
func (c *NATSCluster) Kill(i int) {
	c.mu.Lock()
	nd := c.nodes[i]
	cmd, done := nd.cmd, nd.done
	nd.cmd = nil
	c.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		<-done
	}
}

// LameDuck takes node i through lame duck mode (SIGUSR2), as a rolling
// restart does: it stops accepting clients, hands its leaderships over,
// closes its clients over a few seconds and exits; LameDuck returns then.
func (c *NATSCluster) LameDuck(ctx context.Context, i int) error {
	c.mu.Lock()
	nd := c.nodes[i]
	cmd, done := nd.cmd, nd.done
	c.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("nats-server %s is not running", nd.name)
	}
	if err := cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		return fmt.Errorf("lame duck mode for %s: %w", nd.name, err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		return errors.Join(ctx.Err(), fmt.Errorf("nats-server %s still in lame duck mode", nd.name))
	}
	c.mu.Lock()
	nd.cmd = nil
	c.mu.Unlock()
	return nil
}

// Restart starts stopped node i again on its ports and store, and waits
// until it answers JetStream API requests.
func (c *NATSCluster) Restart(i int) error {
	c.mu.Lock()
	running := c.nodes[i].cmd != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("nats-server %s is running", c.Name(i))
	}
	if err := c.start(i); err != nil {
		return err
	}
	c.waitJetStream(i)
	return nil
}

func (c *NATSCluster) destroy() {
	for i := range c.nodes {
		c.Kill(i)
	}
}

package testenv

import (
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// NATSServer is an embedded nats-server with JetStream, bound to 127.0.0.1.
// Shutdown and Restart keep the port and the store directory, so clients
// reconnect and streams survive as they would with a real restart.
type NATSServer struct {
	mu       sync.Mutex
	srv      *server.Server
	port     int
	storeDir string
}

// NATS starts an embedded JetStream server on a random loopback port with a
// temporary store directory. It is shut down and its store removed in
// t.Cleanup.
func NATS(t testing.TB) *NATSServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "jetsink-nats-")
	if err != nil {
		t.Fatalf("nats store dir: %v", err)
	}
	n := &NATSServer{storeDir: dir, port: -1}
	if err := n.start(); err != nil {
		_ = os.RemoveAll(dir)
		t.Fatalf("start embedded nats-server: %v", err)
	}
	t.Cleanup(func() {
		n.Shutdown()
		_ = os.RemoveAll(dir)
	})
	return n
}

func (n *NATSServer) start() error {
	opts := &server.Options{
		ServerName: "jetsink-test",
		Host:       "127.0.0.1",
		Port:       n.port,
		JetStream:  true,
		StoreDir:   n.storeDir,
		NoLog:      true,
		NoSigs:     true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("nats-server not ready after 10s")
	}
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		srv.Shutdown()
		return fmt.Errorf("nats-server listens on %v, want TCP", srv.Addr())
	}
	n.srv = srv
	n.port = addr.Port
	return nil
}

// URL is the client URL, e.g. nats://127.0.0.1:40123.
func (n *NATSServer) URL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return fmt.Sprintf("nats://127.0.0.1:%d", n.port)
}

// Shutdown stops the server; it is a no-op when already stopped.
func (n *NATSServer) Shutdown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// Restart starts the server again on the same port and store directory.
func (n *NATSServer) Restart() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return fmt.Errorf("nats-server is running")
	}
	return n.start()
}

// Connect returns a client connection closed in t.Cleanup.
func (n *NATSServer) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(n.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to embedded nats-server: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

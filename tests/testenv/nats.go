package testenv

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetsink/jetsink/embedded"
)

// NATSServer is an embedded JetStream server (see embedded.NATSServer):
// URL, Shutdown, Restart (same port and store) and Connect.
type NATSServer struct {
	*embedded.NATSServer
}

// NATS starts an embedded JetStream server on a random loopback port with a
// temporary store directory, destroyed in t.Cleanup.
func NATS(t testing.TB) *NATSServer {
	t.Helper()
	n, err := embedded.StartNATS("")
	if err != nil {
		t.Fatalf("start embedded nats-server: %v", err)
	}
	t.Cleanup(n.Destroy)
	return &NATSServer{n}
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

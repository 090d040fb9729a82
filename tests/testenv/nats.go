package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// JetStream returns a JetStream context on a new connection (see Connect).
func (n *NATSServer) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// StreamMsgs returns how many messages the stream called name holds.
func StreamMsgs(t testing.TB, ctx context.Context, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

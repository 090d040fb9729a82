package embedded

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSServer is an in-process nats-server with JetStream, bound to
// 127.0.0.1. Shutdown and Restart keep the port and the store directory, so
// clients reconnect and streams survive as with a real restart.
type NATSServer struct {
	mu       sync.Mutex
	srv      *server.Server
	port     int
	storeDir string
	ownDir   bool
}

// StartNATS starts a JetStream server on a random loopback port. storeDir ""
// makes a temporary one that Destroy removes; if this process dies first, the
// next StartNATS("") of any process removes it (see the package doc).
func StartNATS(storeDir string) (*NATSServer, error) {
	n := &NATSServer{storeDir: storeDir}
	if storeDir == "" {
		sweepOrphansOnce(natsDirPrefix, nil) // an in-process server died with its owner
		dir, err := ownedTempDir(natsDirPrefix, 0o700)
		if err != nil {
			return nil, fmt.Errorf("nats store dir: %w", err)
		}
		n.storeDir, n.ownDir = dir, true
	}
	// A port below the kernel's ephemeral range (FreePort), where Restart
	// finds it free again; another, should one be taken in between.
	var err error
	for range 3 {
		if n.port, err = FreePort(); err != nil {
			break
		}
		if err = n.start(); err == nil {
			return n, nil
		}
		if l, lerr := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(n.port)); lerr == nil {
			_ = l.Close()
			break // the port was free: something else failed (each try waits 10 s)
		}
	}
	n.Destroy()
	return nil, err
}

func (n *NATSServer) start() error {
	srv, err := server.NewServer(&server.Options{
		ServerName: "jetsink-embedded",
		Host:       "127.0.0.1",
		Port:       n.port,
		JetStream:  true,
		StoreDir:   n.storeDir,
		NoLog:      true,
		NoSigs:     true,
	})
	if err != nil {
		return fmt.Errorf("embedded nats-server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("embedded nats-server not ready after 10s")
	}
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		srv.Shutdown()
		return fmt.Errorf("embedded nats-server listens on %v, want TCP", srv.Addr())
	}
	n.srv, n.port = srv, addr.Port
	return nil
}

// URL is the client URL, e.g. nats://127.0.0.1:40123.
func (n *NATSServer) URL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return fmt.Sprintf("nats://127.0.0.1:%d", n.port)
}

// StoreDir is the JetStream store directory.
func (n *NATSServer) StoreDir() string { return n.storeDir }

// Shutdown stops the server; a no-op when already stopped.
func (n *NATSServer) Shutdown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// Restart starts a stopped server again on the same port and store.
func (n *NATSServer) Restart() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return fmt.Errorf("embedded nats-server is running")
	}
	return n.start()
}

// DisableJetStream turns JetStream off, as a server does when its store
// cannot be written (a full disk); clients stay connected. Restart brings
// it back (turning it on in place races with the server's own API
// dispatch, which the race detector reports).
func (n *NATSServer) DisableJetStream() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv == nil {
		return fmt.Errorf("embedded nats-server is stopped")
	}
	return n.srv.DisableJetStream()
}

// Destroy shuts the server down and removes a store directory it made.
func (n *NATSServer) Destroy() {
	n.Shutdown()
	if n.ownDir {
		_ = removeOwned(n.storeDir)
	}
}

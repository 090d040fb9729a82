package testenv

import (
	"net"
	"sync"
	"testing"
)

// GateProxy forwards TCP connections to a target (a NATS server) while
// open. Cut closes every connection and turns new ones away (accepted and
// closed at once) until Reopen. Freeze stops forwarding, both ways, on
// every connection while keeping them open, as a server stopped with
// SIGSTOP would; Thaw or Cut ends it. (Proxy, by contrast, forwards a fixed number
// of connections and is cut by closing its listener.)
//
// What a frozen connection takes in before the client's writes block is
// the client's send buffer (the kernel's to size), the proxy's receive
// buffer, pinned to gateSocketBuffer so that no autotuning (up to
// net.ipv4.tcp_rmem's maximum, 32 MiB on some hosts) makes it larger, and
// the one read, 32 KiB, the pipe holds.
type GateProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   bool
	conns  []net.Conn
	frozen chan struct{} // closed when the freeze ends; nil when not frozen
	wg     sync.WaitGroup
}

// NewGateProxy listens on a random loopback port and forwards to target
// (host:port) until t's cleanup, which closes everything and waits for the
// proxy's goroutines.
func NewGateProxy(t testing.TB, target string) *GateProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &GateProxy{ln: ln, target: target, open: true}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// gateSocketBuffer is the receive and send buffer asked for on each of the
// proxy's sockets. Linux gives up to twice that, for its bookkeeping,
// capped by net.core.rmem_max and net.core.wmem_max (212992 on many
// distributions: 416 KiB, not 512 KiB).
const gateSocketBuffer = 256 << 10

// URL is the proxy's address as a NATS URL.
func (p *GateProxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *GateProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if !p.open {
			p.mu.Unlock()
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		pinBuffers(c)
		pinBuffers(s)
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c) })
		p.wg.Go(func() { p.pipe(c, s) })
	}
}

// pinBuffers sets c's buffers to gateSocketBuffer, which also stops the
// kernel from growing them. It is best effort: a platform that refuses
// keeps its own sizes.
func pinBuffers(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(gateSocketBuffer)
		_ = tc.SetWriteBuffer(gateSocketBuffer)
	}
}

// pipe copies src to dst, holding what it read while frozen, until either
// fails; then it closes both.
func (p *GateProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			frozen := p.frozen
			p.mu.Unlock()
			if frozen != nil {
				<-frozen
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Freeze stops forwarding, keeping the connections open.
func (p *GateProxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

// Thaw ends a freeze: what the connections hold goes on.
func (p *GateProxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

// Cut closes every connection, ends a freeze, and turns new connections
// away until Reopen.
func (p *GateProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = false
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	if p.frozen != nil {
		close(p.frozen) // what the pipes hold goes nowhere: their connections are closed
		p.frozen = nil
	}
}

// Reopen forwards new connections again.
func (p *GateProxy) Reopen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = true
}

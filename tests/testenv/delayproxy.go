package testenv

import (
	"net"
	"sync"
	"testing"
	"time"
)

// DelayProxy forwards TCP connections to a target (a NATS server) as a
// network half a round trip long each way would: each chunk of bytes read
// from either side is written to the other delay after it was read, in
// order. So a request and its answer take 2*delay more than on loopback.
// Bandwidth is not limited; up to 1,024 chunks wait per direction, beyond
// that the reader waits.
type DelayProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	mu     sync.Mutex
	closed bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

// NewDelayProxy listens on a random loopback port and forwards to target
// (host:port) with delay each way, until t's cleanup, which closes
// everything and waits for the proxy's goroutines.
func NewDelayProxy(t testing.TB, target string, delay time.Duration) *DelayProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &DelayProxy{ln: ln, target: target, delay: delay}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		p.closed = true
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// URL is the proxy's address as a NATS URL.
func (p *DelayProxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *DelayProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c) })
		p.wg.Go(func() { p.pipe(c, s) })
	}
}

// chunk is bytes read and when they are due at the other side.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, each chunk delay after it was read, until
// either fails; then it closes both.
func (p *DelayProxy) pipe(dst, src net.Conn) {
	chunks := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer dst.Close()
		defer src.Close() // a failed write ends the reader too
		for c := range chunks {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}()
	defer func() { <-done }()
	defer close(chunks)
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case chunks <- chunk{b: buf[:n], due: time.Now().Add(p.delay)}:
			case <-done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

package bench

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// A link stands for the network between the engines and a server on
// another machine: it listens on loopback and forwards every connection to
// the server, holding each chunk of bytes, in each direction, for half the
// round-trip time before it passes it on. Bandwidth is not limited (a chunk
// read while others wait is held for its own half RTT, not queued behind
// them), and order is kept: one writer per direction sends the chunks in
// the order they were read, each at its due time, so a round trip costs
// the RTT at least. Go's timers are coarse below a millisecond: a chunk
// can wait up to about a millisecond more, which the link measures (Late).
//
// The engines connect through the link; the bench itself (the publisher,
// the ack watcher, the checks) connects to the server directly, so what
// the link delays is the engine's traffic only. Its copying costs CPU in
// the bench process, on the same machine.
type link struct {
	ln     net.Listener
	target string
	half   time.Duration

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	accepted atomic.Int64 // connections forwarded
	// For Late: the chunks sent, the sum and the most of how much later
	// than due they went out, the delay added beyond half the RTT.
	chunks atomic.Int64
	lateNs atomic.Int64
	maxNs  atomic.Int64
}

// linkChunk is what a direction holds: n bytes of a pooled buffer read
// from one side, due on the other at due; eof ends the direction.
type linkChunk struct {
	buf *[]byte
	n   int
	due time.Time
	eof bool
}

// A chunk is up to linkChunkSize bytes, and a direction holds at most
// linkQueueLen of them (8 MiB), more than a round trip of a few
// milliseconds carries at the rates the bench offers; beyond that its
// reader waits, as a sender waits for a full TCP window.
const (
	linkChunkSize = 32 << 10
	linkQueueLen  = 256
)

var linkBufs = sync.Pool{New: func() any { b := make([]byte, linkChunkSize); return &b }}

// startLink listens on 127.0.0.1 and forwards to target with rtt added to
// every round trip.
func startLink(target string, rtt time.Duration) (*link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: the delayed link's listener: %w", err)
	}
	l := &link{ln: ln, target: target, half: rtt / 2, conns: map[net.Conn]struct{}{}}
	l.wg.Go(l.accept)
	return l, nil
}

// Addr is where the engines connect.
func (l *link) Addr() string { return l.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for the link's
// goroutines.
func (l *link) Close() {
	l.ln.Close()
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// Late is how much later than due the chunks went out: the mean and the
// most, the delay the link added beyond half the RTT.
func (l *link) Late() (mean, most time.Duration) {
	n := l.chunks.Load()
	if n == 0 {
		return 0, 0
	}
	return time.Duration(l.lateNs.Load() / n), time.Duration(l.maxNs.Load())
}

func (l *link) late(d time.Duration) {
	d = max(d, 0)
	l.chunks.Add(1)
	l.lateNs.Add(int64(d))
	for {
		m := l.maxNs.Load()
		if int64(d) <= m || l.maxNs.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

func (l *link) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", l.target, 10*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !l.track(c, s) {
			return
		}
		l.accepted.Add(1)
		var both sync.WaitGroup
		both.Add(2)
		l.wg.Go(func() { l.direction(c, s); both.Done() })
		l.wg.Go(func() { l.direction(s, c); both.Done() })
		l.wg.Go(func() {
			both.Wait()
			c.Close()
			s.Close()
			l.untrack(c, s)
		})
	}
}

func (l *link) track(cs ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		l.conns[c] = struct{}{}
	}
	return true
}

func (l *link) untrack(cs ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cs {
		delete(l.conns, c)
	}
}

// direction carries src's bytes to dst, each chunk half the RTT after it
// was read. The end of src's bytes (EOF) reaches dst as a half close after
// the bytes before it; any other error closes both connections, as does a
// failed write.
func (l *link) direction(src, dst net.Conn) {
	q := make(chan linkChunk, linkQueueLen)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.send(q, src, dst)
	}()
	for {
		bp := linkBufs.Get().(*[]byte)
		n, err := src.Read(*bp)
		if n > 0 {
			q <- linkChunk{buf: bp, n: n, due: time.Now().Add(l.half)}
		} else {
			linkBufs.Put(bp)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				q <- linkChunk{eof: true}
			} else {
				src.Close()
				dst.Close()
			}
			close(q)
			<-done
			return
		}
	}
}

// send writes q's chunks to dst at their due times, those due together in
// one write. After a failed write it closes both connections, which ends
// the reader, and takes what is left in q until the reader closes it.
func (l *link) send(q <-chan linkChunk, src, dst net.Conn) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var (
		held = make([]linkChunk, 0, 64)
		bufs = make(net.Buffers, 0, 64)
		next *linkChunk // taken from q, not due yet
	)
	for {
		var c linkChunk
		if next != nil {
			c, next = *next, nil
		} else {
			var ok bool
			if c, ok = <-q; !ok {
				return
			}
		}
		if c.eof {
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			continue // q closes next
		}
		if d := time.Until(c.due); d > 0 {
			timer.Reset(d)
			<-timer.C
		}
		l.late(time.Since(c.due))
		held = append(held[:0], c)
	gather:
		for len(held) < 64 {
			select {
			case n, ok := <-q:
				if !ok {
					break gather
				}
				if n.eof || time.Now().Before(n.due) {
					next = &n
					break gather
				}
				l.late(time.Since(n.due))
				held = append(held, n)
			default:
				break gather
			}
		}
		out := bufs[:0] // WriteTo consumes out, not bufs
		for _, h := range held {
			out = append(out, (*h.buf)[:h.n])
		}
		_, err := out.WriteTo(dst)
		for _, h := range held {
			linkBufs.Put(h.buf)
		}
		if err != nil {
			src.Close()
			dst.Close()
			for c := range q {
				if c.buf != nil {
					linkBufs.Put(c.buf)
				}
			}
			return
		}
	}
}

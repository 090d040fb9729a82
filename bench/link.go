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
// round-trip time before it passes it on. So a request and its answer take
// the RTT more than on loopback, a new connection's first answer too (the
// link connects to the server half an RTT after the engine connected), and
// the end of a connection (a close, or a reset after the bytes before it)
// arrives half an RTT late like the bytes. Order is kept: one writer per
// direction sends the chunks in the order they were read, each at its due
// time, and those due together in one write. Bandwidth is not limited: a
// chunk read while others wait is held for its own half RTT, up to
// linkQueueBytes (or 1,024 chunks) held per direction; beyond that the reader waits for the
// writer (a stall, counted: the link itself held the traffic back, which a
// network with a large enough window would not).
//
// The writer sleeps with nanosleep, not a Go timer: Go's timers round a
// wait to whole milliseconds while the process is otherwise idle, which
// would add up to a millisecond each way. A chunk can still go out late
// when the machine is busy; the link measures by how much (Late).
//
// The engines connect through the link; the bench itself (the publisher,
// the ack watcher, the checks) connects to the server directly, so what
// the link delays is the engine's traffic only. Its copying costs CPU in
// the bench process, on the same machine.
type link struct {
	ln         net.Listener
	target     string
	half       time.Duration
	queueBytes int // per direction

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	accepted atomic.Int64 // connections forwarded
	// For Late: the chunks (and ends) sent, the sum and the most of how
	// much later than due they went out.
	sent   atomic.Int64
	lateNs atomic.Int64
	maxNs  atomic.Int64
	// For Stalls: how often and how long a reader waited because its
	// direction held queueBytes, or 1,024 chunks.
	stalls  atomic.Int64
	stallNs atomic.Int64
}

// linkQueueBytes bounds what one direction holds, far more than a round
// trip of a few milliseconds carries at the rates the bench offers (100,000
// events/s is ~60 MB/s of NATS deliveries: 300 KB in 5 ms).
const linkQueueBytes = 16 << 20

// linkReadSize is the most one read takes; a read of up to linkCopyBelow
// bytes is copied out of the pooled buffer into one of its own size, so
// that small chunks hold little memory.
const (
	linkReadSize  = 32 << 10
	linkCopyBelow = 4 << 10
)

var linkBufs = sync.Pool{New: func() any { b := make([]byte, linkReadSize); return &b }}

// linkChunk is what a direction holds: bytes read from one side (in a
// pooled buffer, or a copy of their own when buf is nil), due on the other
// at due; or, with end set, the end of the bytes: a close (err nil after
// EOF) or the error that ended them.
type linkChunk struct {
	data []byte
	buf  *[]byte
	due  time.Time
	end  bool
	err  error
}

func (c linkChunk) size() int {
	if c.buf != nil {
		return cap(*c.buf)
	}
	return len(c.data)
}

func (c linkChunk) free() {
	if c.buf != nil {
		linkBufs.Put(c.buf)
	}
}

// startLink listens on 127.0.0.1 and forwards to target with rtt added to
// every round trip, holding at most queueBytes in each direction.
func startLink(target string, rtt time.Duration, queueBytes int) (*link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: the delayed link's listener: %w", err)
	}
	l := &link{ln: ln, target: target, half: rtt / 2, queueBytes: max(queueBytes, linkReadSize), conns: map[net.Conn]struct{}{}}
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

// Late is how much later than due the chunks went out, the mean and the
// most: every chunk, and every connection's end, each way, timed as its
// write (or close) began, whether the writer slept until it was due or
// took it overdue (blocked on a slow reader, or descheduled) or gathered it
// into the write of an earlier one. Each way, a chunk took half the RTT
// plus that; the write itself is not counted.
func (l *link) Late() (mean, most time.Duration) {
	n := l.sent.Load()
	if n == 0 {
		return 0, 0
	}
	return time.Duration(l.lateNs.Load() / n), time.Duration(l.maxNs.Load())
}

// Stalls is how often, and how long in all, a reader waited because its
// direction held linkQueueBytes, or 1,024 chunks, already.
func (l *link) Stalls() (int64, time.Duration) {
	return l.stalls.Load(), time.Duration(l.stallNs.Load())
}

// report is what the link did, for the bench's report on server.
func (l *link) report(server string, rtt time.Duration) LinkReport {
	mean, most := l.Late()
	stalls, stalled := l.Stalls()
	return LinkReport{Server: server, RTT: rtt.String(), RTTms: millis(rtt), LateMeanMs: millis(mean), LateMaxMs: millis(most),
		Stalls: stalls, StalledMs: millis(stalled), Connections: l.accepted.Load()}
}

func (l *link) late(d time.Duration) {
	d = max(d, 0)
	l.sent.Add(1)
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
		if !l.track(c) {
			return
		}
		l.wg.Go(func() { l.connect(c) })
	}
}

// connect reaches the server for c half an RTT after c came (as its SYN
// would have), then carries both directions until both have ended.
func (l *link) connect(c net.Conn) {
	defer l.untrack(c)
	defer c.Close()
	sleepUntil(time.Now().Add(l.half))
	s, err := net.DialTimeout("tcp", l.target, 10*time.Second)
	if err != nil {
		return
	}
	defer s.Close()
	if !l.track(s) {
		return
	}
	defer l.untrack(s)
	l.accepted.Add(1)
	var both sync.WaitGroup
	both.Go(func() { l.direction(c, s) })
	both.Go(func() { l.direction(s, c) })
	both.Wait()
}

func (l *link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *link) untrack(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, c)
}

// direction carries src's bytes to dst, each chunk half the RTT after it
// was read. The end of src's bytes reaches dst half an RTT after the last
// of them, as a half close after EOF, as a close after any other error.
func (l *link) direction(src, dst net.Conn) {
	q := make(chan linkChunk, 1024)
	room := newByteBudget(l.queueBytes)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.send(q, room, src, dst)
	}()
	defer func() { <-done }()
	defer close(q)
	for {
		bp := linkBufs.Get().(*[]byte)
		n, err := src.Read(*bp)
		if n > 0 {
			c := linkChunk{data: (*bp)[:n], buf: bp}
			if n <= linkCopyBelow {
				c = linkChunk{data: append([]byte(nil), (*bp)[:n]...)}
				linkBufs.Put(bp)
			}
			waited := room.take(c.size())
			c.due = time.Now().Add(l.half)
			select {
			case q <- c:
			default: // 1,024 chunks held
				start := time.Now()
				q <- c
				waited += max(time.Since(start), 1)
			}
			if waited > 0 {
				l.stalls.Add(1)
				l.stallNs.Add(int64(waited))
			}
		} else {
			linkBufs.Put(bp)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			q <- linkChunk{end: true, err: err, due: time.Now().Add(l.half)}
			return
		}
	}
}

// send writes q's chunks to dst at their due times, those due together in
// one write, and ends dst as the end chunk says. After a failed write it
// closes both connections, which ends the reader, and takes what is left
// in q until the reader closes it.
func (l *link) send(q <-chan linkChunk, room *byteBudget, src, dst net.Conn) {
	var (
		held = make([]linkChunk, 0, 64)
		bufs = make(net.Buffers, 0, 64)
		next *linkChunk // taken from q, not due yet
	)
	drain := func() {
		for c := range q {
			room.give(c.size())
			c.free()
		}
	}
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
		sleepUntil(c.due) // returns at once when c is overdue
		if c.end {
			l.late(time.Since(c.due))
			if tc, ok := dst.(*net.TCPConn); ok && c.err == nil {
				_ = tc.CloseWrite() // the other direction goes on
			} else {
				src.Close()
				dst.Close()
			}
			drain() // nothing comes after the end
			return
		}
		held = append(held[:0], c)
	gather:
		for len(held) < cap(held) {
			select {
			case n, ok := <-q:
				if !ok {
					break gather
				}
				if n.end || time.Now().Before(n.due) {
					next = &n
					break gather
				}
				held = append(held, n)
			default:
				break gather
			}
		}
		out := bufs[:0] // WriteTo consumes out, not bufs
		for _, h := range held {
			out = append(out, h.data)
		}
		// Every chunk counts, those taken or gathered past their due
		// time too (the writer was blocked or descheduled): counting only
		// those it slept for would hide the delay when the machine is busy.
		at := time.Now()
		for _, h := range held {
			l.late(at.Sub(h.due))
		}
		_, err := out.WriteTo(dst)
		for _, h := range held {
			room.give(h.size())
			h.free()
		}
		if err != nil {
			src.Close() // ends the reader
			dst.Close()
			drain()
			return
		}
	}
}

// byteBudget is the room a direction has left for the bytes it holds.
type byteBudget struct {
	mu   sync.Mutex
	cond sync.Cond
	free int
}

func newByteBudget(n int) *byteBudget {
	b := &byteBudget{free: n}
	b.cond.L = &b.mu
	return b
}

// take waits until n bytes fit and takes them; it returns how long it
// waited. n is at most linkReadSize, so the room of an empty queue fits it.
func (b *byteBudget) take(n int) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.free >= n {
		b.free -= n
		return 0
	}
	start := time.Now()
	for b.free < n {
		b.cond.Wait()
	}
	b.free -= n
	return max(time.Since(start), 1)
}

func (b *byteBudget) give(n int) {
	b.mu.Lock()
	b.free += n
	b.mu.Unlock()
	b.cond.Broadcast()
}

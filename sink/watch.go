package sink

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// watchConn watches the TCP connection under nc while a batch uses it:
// once the server's host has given no sign of life for d (see silent), it
// closes nc, which ends the statement waiting on it with an error. stop
// ends the watch and reports whether it closed nc. A connection that is
// not TCP (a unix socket), or d 0, is not watched.
//
// Why not TCP_USER_TIMEOUT, which the kernel applies by itself: it also
// ends a connection whose peer is alive but has closed its receive window
// for that long with data waiting to go out, which is what a COPY waiting
// for a lock does once its rows fill the sockets (measured on Linux 6.18:
// a peer that stopped reading, every window probe answered, lost the
// connection after the timeout). The lock may be on a partition or held
// by a transaction that inserted the same key, taken after the server
// has started reading, so the sink cannot keep its rows back until then.
// A given-up connection would also leave its backend queued for the lock.
func watchConn(nc net.Conn, d time.Duration) (stop func() bool) {
	rc, ok := rawTCP(nc)
	if d <= 0 || !ok || !canWatch {
		return func() bool { return false }
	}
	// A timer rather than a goroutine: most batches end before the first
	// look. mu orders a look against stop, so that nothing is closed
	// after stop has returned.
	w := &watch{nc: nc, rc: rc, d: d, every: min(max(d/10, 50*time.Millisecond), 5*time.Second), start: time.Now()}
	w.mu.Lock()
	w.t = time.AfterFunc(w.every, w.look)
	w.mu.Unlock()
	return w.stop
}

// watch is one watchConn.
type watch struct {
	nc       net.Conn
	rc       syscall.RawConn
	d, every time.Duration
	start    time.Time

	mu      sync.Mutex
	t       *time.Timer
	stopped bool
	fired   bool
}

func (w *watch) look() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if silentFor(w.rc, w.d, time.Since(w.start)) {
		w.fired = true
		_ = w.nc.Close()
		return
	}
	w.t.Reset(w.every)
}

func (w *watch) stop() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.t.Stop()
	return w.fired
}

// rawTCP returns the socket under nc (under TLS too) if it is TCP.
func rawTCP(nc net.Conn) (syscall.RawConn, bool) {
	if t, ok := nc.(interface{ NetConn() net.Conn }); ok { // TLS
		nc = t.NetConn()
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil, false
	}
	rc, err := tc.SyscallConn()
	return rc, err == nil
}

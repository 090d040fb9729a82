package sink

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/jetsink/jetsink/tests/testenv"
)

// The sink's connections carry TCP_USER_TIMEOUT as configured (0: the
// kernel's default, also 0), and a unix socket, which has no TCP options,
// still connects.
func TestDialSetsTCPUserTimeout(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for _, d := range []time.Duration{0, 1500 * time.Millisecond, 90 * time.Second} {
		c, err := dialFunc(d)(ctx, "tcp", l.Addr().String())
		if err != nil {
			t.Fatalf("dial with %v: %v", d, err)
		}
		if got := userTimeout(t, c); got != int(d/time.Millisecond) {
			t.Errorf("TCP_USER_TIMEOUT with %v: %d ms", d, got)
		}
		c.Close()
	}

	path := filepath.Join(t.TempDir(), "s")
	ul, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	c, err := dialFunc(time.Second)(ctx, "unix", path)
	if err != nil {
		t.Fatalf("dial a unix socket: %v", err)
	}
	c.Close()
}

func userTimeout(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	}); err != nil || gerr != nil {
		t.Fatalf("getsockopt: %v %v", err, gerr)
	}
	return v
}

// A COPY that waits for a lock longer than tcp_user_timeout keeps its
// connection: its rows (8 MB, more than the sockets buffer) stay in jetsink
// until the server has taken the lock and the COPY, so the server's side
// never closes the TCP window on data waiting to go out, which the kernel
// would count against the timeout. Sent with the statement at once, the
// rows filled the sockets and the connection ended after the timeout
// (then the batch was retried on a new one).
func TestLockWaitOutlastsTCPUserTimeout(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	const n, pad = 1000, 8 << 10
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) {
		c.Connections = 1
		c.TCPUserTimeout = time.Second
		c.Batch.MaxRows = n
		c.Batch.MaxBytes = 64 << 20
		c.Batch.MaxDelay = time.Hour
		c.Batch.MinDelay = 0
	})
	admin := pg.Conn(t)
	tx := lockTable(t, ctx, pg, s)
	rs, ms := rows(1, n, func(seq int) string { return fmt.Sprintf(`{"n":%d,"pad":"%s"}`, seq, strings.Repeat("x", pad)) })
	src := newSource()
	src.push(t, ctx, rs)
	src.close()
	wait := runSink(t, ctx, s, src)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // before runSink's wait
	waitFor(t, ctx, "the COPY to wait for the lock", waitingOnLock(t, ctx, admin, s.cfg.AppName))
	// Four times the timeout: the kernel checks it when a window probe is
	// due, and probes back off (0.2, 0.4, 0.8, 1.6 s ...).
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) {
		if r := s.Stats().Retries; r != 0 {
			t.Fatalf("the COPY was retried %d times while it waited for the lock", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r := s.Stats().Retries; r != 0 {
		t.Fatalf("the COPY was retried %d times", r)
	}
	if !allAcked(ms)() {
		t.Fatal("not every message acked")
	}
	var got int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+s.table.Sanitize()).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("%d rows stored, want %d", got, n)
	}
}

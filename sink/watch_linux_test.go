package sink

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

// The rule of watchConn: silent once nothing acknowledges unacknowledged
// data, or two or more probes in a row, for d.
func TestSilentRule(t *testing.T) {
	const d = 2 * time.Second
	for _, tc := range []struct {
		unacked uint32
		probes  uint8
		lastAck uint32 // ms
		want    bool
	}{
		{0, 0, 3_600_000, false}, // idle for an hour: nothing outstanding
		{3, 0, 1999, false},
		{3, 0, 2000, true},     // data unacknowledged for d
		{0, 1, 120_000, false}, // a probe on its way, backed off to 2 minutes: the host may be fine
		{0, 2, 1999, false},
		{0, 2, 2000, true}, // two probes unanswered, nothing heard for d
	} {
		if got := silent(tc.unacked, tc.probes, time.Duration(tc.lastAck)*time.Millisecond, d); got != tc.want {
			t.Errorf("silent(unacked %d, probes %d, last ack %d ms ago) = %v, want %v", tc.unacked, tc.probes, tc.lastAck, got, tc.want)
		}
	}
}

// A COPY that waits for a lock four times as long as
// dead_connection_timeout keeps its connection: its rows (8 MB, more than
// the sockets buffer) fill the sockets, the server's window closes (the
// test checks that it did), and the server's host answers every window
// probe, which the watch counts as a sign of life. TCP_USER_TIMEOUT instead
// ended this connection after the timeout ("write: connection timed out",
// then a retry); so did a watch that looked at the time since the last
// acknowledgement alone.
func TestLockWaitOutlivesDeadConnectionTimeout(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	const n, pad = 1000, 8 << 10
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) {
		c.Connections = 1
		c.DeadConnectionTimeout = time.Second
		c.Batch.MaxRows = n
		c.Batch.MaxBytes = 64 << 20
		c.Batch.MaxDelay = time.Hour
		c.Batch.MinDelay = 0
	})
	var conns []net.Conn
	var mu sync.Mutex
	dial := s.connCfg.DialFunc
	s.connCfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}
	admin := pg.Conn(t)
	tx := lockTable(t, ctx, pg, s)
	rs, ms := rows(1, n, func(seq int) string { return fmt.Sprintf(`{"n":%d,"pad":"%s"}`, seq, strings.Repeat("x", pad)) })
	src := newSource()
	src.push(t, ctx, rs)
	src.close()
	wait := runSink(t, ctx, s, src)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // before runSink's wait
	waitFor(t, ctx, "the COPY to wait for the lock", waitingOnLock(t, ctx, admin, s.cfg.AppName))
	// Four times the timeout: window probes back off (0.2, 0.4, 0.8, 1.6 s
	// ...), each answered.
	closed := false
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) {
		if r := s.Stats().Retries; r != 0 {
			t.Fatalf("the COPY was retried %d times while it waited for the lock", r)
		}
		mu.Lock()
		for _, c := range conns {
			closed = closed || windowClosed(t, c)
		}
		mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	if !closed {
		t.Fatal("the server's receive window never closed: the COPY did not fill the sockets, so this test showed nothing (raise n or pad)")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st := s.Stats(); st.Retries != 0 || st.DeadConnections != 0 {
		t.Fatalf("retries %d, dead connections %d; want 0", st.Retries, st.DeadConnections)
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

// windowClosed reports whether c's peer advertises a zero window while the
// kernel probes it; false for a connection that is not TCP or is closed.
func windowClosed(t *testing.T, c net.Conn) bool {
	t.Helper()
	rc, ok := rawTCP(c)
	if !ok {
		return false
	}
	info, err := tcpInfo(rc)
	if err != nil {
		return false
	}
	return info.Snd_wnd == 0 && info.Backoff > 0
}

// BenchmarkWatchConn is what the watch costs a batch that ends before its
// first look (d/10): starting and stopping it.
func BenchmarkWatchConn(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if c, err := l.Accept(); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1)) // until the client closes
		}
	})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	for b.Loop() {
		if watchConn(c, time.Minute)() {
			b.Fatal("fired")
		}
	}
}

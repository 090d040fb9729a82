package sink

import (
	"context"
	"math"
	"net"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

// A server that stops answering in the middle of a run, without closing
// the connection, costs dead_connection_timeout, not the kernel's ~15
// minutes of retransmissions: once the server's answers are dropped, the
// batch's statements go unacknowledged, the watch gives the connection up,
// the batch is retried (connects hang until the path is back), and it
// commits, once. Exactly-once mode, because what the server received
// before may have committed unseen.
func TestVanishedServerNoticedAfterDeadConnectionTimeout(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	p := testenv.NewPartition(t)
	_, to := withHost(t, pg.URL, "")
	proxied, _ := withHost(t, pg.URL, testenv.Proxy(t, p.HostIP+":0", to, math.MaxInt))
	s, _ := newTestSink(t, ctx, proxied, func(c *Config) {
		c.Mode = ExactlyOnce
		c.Connections = 1
		c.DeadConnectionTimeout = time.Second
		c.Batch.MinDelay = 0
	})
	dial := s.connCfg.DialFunc // the committers' sockets are made inside the namespace
	s.connCfg.DialFunc = func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = p.Do(func() error { c, err = dial(ctx, network, addr); return err })
		return c, err
	}
	src := newSource()
	wait := runSink(t, ctx, s, src)
	first, m1 := rows(1, 1, nil)
	src.push(t, ctx, first)
	waitFor(t, ctx, "the first row acked", allAcked(m1))
	if st := s.Stats(); st.DeadConnections != 0 || st.Retries != 0 {
		t.Fatalf("before the cut: %+v", st)
	}

	p.Cut(t)
	second, m2 := rows(2, 1, nil)
	src.push(t, ctx, second)
	waitFor(t, ctx, "the silent connection to be given up", func() bool { return s.Stats().DeadConnections > 0 })
	if m2[0].acks.Load() != 0 {
		t.Fatal("the second row was acked while the server's answers were dropped")
	}
	p.Heal(t)
	waitFor(t, ctx, "the second row acked", allAcked(m2))
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var n int
	if err := pg.Conn(t).QueryRow(ctx, "SELECT count(*) FROM "+s.table.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d rows stored, want 2", n)
	}
}

package sink

import (
	"context"
	"fmt"
	"strings"
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
		if got := silent(tc.unacked, tc.probes, tc.lastAck, d); got != tc.want {
			t.Errorf("silent(unacked %d, probes %d, last ack %d ms ago) = %v, want %v", tc.unacked, tc.probes, tc.lastAck, got, tc.want)
		}
	}
}

// A COPY that waits for a lock four times as long as
// dead_connection_timeout keeps its connection: its rows (8 MB, more than
// the sockets buffer) fill the sockets, the server's window closes, and the
// server's host answers every window probe, which the watch counts as a
// sign of life. TCP_USER_TIMEOUT instead ended this connection after the
// timeout ("write: connection timed out", then a retry); so did a watch
// that looked at the time since the last acknowledgement alone.
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

package sink

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/tests/testenv"
)

// After a failover, the old primary back up as a primary (first in the
// failover list, so it would get every new connection, and take commits on
// its own) is refused: its timeline is older than the promoted standby's,
// which jetsink's connections reached. The rows wait, and commit on the new
// primary once the old one is fenced (stopped).
func TestOldPrimaryRefusedAfterFailover(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	primary := testenv.NewCluster(t)
	standby := testenv.NewStandby(t, primary)
	s, _ := newTestSink(t, ctx, testenv.FailoverURL("postgres", primary, standby), func(c *Config) { c.Connections = 1 })
	src := newSource()
	wait := runSink(t, ctx, s, src)
	exec := func(url, sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	rs, ms := rows(1, 5, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "rows acked on the primary", allAcked(ms))

	if err := primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	rs, ms = rows(6, 5, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "rows acked on the promoted standby", allAcked(ms))

	// The old primary comes back as one, and commits alone.
	if err := primary.Start(); err != nil {
		t.Fatal(err)
	}
	exec(primary.URL("postgres"), "ALTER SYSTEM RESET synchronous_standby_names")
	exec(primary.URL("postgres"), "SELECT pg_reload_conf()")
	// jetsink's connection to the new primary ends: the next one tries
	// the old primary first.
	exec(standby.URL("postgres"), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '"+s.cfg.AppName+"'")
	before := s.Stats().ConfigErrors
	rs, ms = rows(11, 5, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "the old primary refused, or the rows acked", func() bool {
		return s.Stats().ConfigErrors > before || allAcked(ms)()
	})
	if allAcked(ms)() {
		t.Fatal("rows acked on the old primary of a failover")
	}
	if n := count(t, ctx, connTo(t, ctx, primary.URL("postgres")), s.cfg.Table); n != 5 {
		t.Fatalf("the old primary has %d rows, want the 5 from before the failover", n)
	}

	// Fenced: the rows go to the new primary.
	if err := primary.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "rows acked on the new primary", allAcked(ms))
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := count(t, ctx, connTo(t, ctx, standby.URL("postgres")), s.cfg.Table); n != 15 {
		t.Fatalf("the new primary has %d rows, want 15", n)
	}
}

// connTo connects to url, closed in t.Cleanup.
func connTo(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

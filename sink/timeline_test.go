package sink

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/tests/testenv"
)

// After a failover, the old primary back up as one is refused (first in
// the failover list, it would get every new connection, and take commits
// on its own): its timeline is older than the promoted standby's, which
// jetsink's connections reached. Refused, the connect goes on to the next
// host, the new primary.
func TestOldPrimaryRefusedAfterFailover(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	primary, standby, s, src, wait := failoverSink(t, ctx, false)

	if err := primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	rs, ms := rows(6, 5, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "rows acked on the promoted standby", allAcked(ms))

	// The old primary comes back as one, and commits alone.
	if err := primary.Start(); err != nil {
		t.Fatal(err)
	}
	execOn(t, ctx, primary.URL("postgres"), "ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()")
	// jetsink's connection to the new primary ends: the next one tries
	// the old primary first.
	execOn(t, ctx, standby.URL("postgres"), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '"+s.cfg.AppName+"'")
	rs, ms = rows(11, 5, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "rows acked", allAcked(ms))
	closeAndCount(t, ctx, src, wait, s.cfg.Table, primary, 5, standby, 15)
	if !refusedOldPrimary(s) {
		t.Fatal("no refusal of the old primary was logged")
	}
}

// A connection made before a failover to a primary that stays up (a
// partition between it and the standby, healed) is given up once another
// connection has reached the promoted standby's newer timeline: kept, a
// committer's would go on committing on the old primary, and the admin
// connection's would answer /readyz for it. Either is cut, and the other
// must follow.
func TestConnectionToAPrimaryLeftBehindIsReplaced(t *testing.T) {
	for _, cut := range []string{"admin", "committer"} {
		t.Run(cut, func(t *testing.T) {
			ctx := testCtx(t, 2*time.Minute)
			// The standby first: refused while it is one
			// (target_session_attrs), taken once promoted.
			primary, standby, s, src, wait := failoverSink(t, ctx, true)

			// The standby is promoted while the primary stays up, and
			// takes commits alone.
			execOn(t, ctx, primary.URL("postgres"), "ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()")
			if err := standby.Promote(); err != nil {
				t.Fatal(err)
			}
			var adminPID uint32
			if err := s.withAdmin(ctx, func(c *pgx.Conn) error { adminPID = c.PgConn().PID(); return nil }); err != nil {
				t.Fatal(err)
			}
			if cut == "admin" {
				execOn(t, ctx, primary.URL("postgres"), fmt.Sprintf("SELECT pg_terminate_backend(%d)", adminPID))
				waitFor(t, ctx, "a ping on the promoted standby", func() bool {
					seen := s.timelines.Load()
					return s.Ping(ctx) == nil && seen != nil && seen.tl == 2
				})
			} else {
				// application_name is cut to 63 bytes on the server.
				var n int
				if err := connTo(t, ctx, primary.URL("postgres")).QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "+
					"WHERE application_name = left($1, 63) AND pid <> $2", s.cfg.AppName, adminPID).Scan(&n); err != nil || n != 1 {
					t.Fatalf("cut the committer's connection: %d cut, %v", n, err)
				}
			}
			rs, ms := rows(6, 5, nil)
			src.push(t, ctx, rs)
			waitFor(t, ctx, "rows acked", allAcked(ms))
			var addr string
			waitFor(t, ctx, "the admin connection on the promoted standby", func() bool {
				err := s.withAdmin(ctx, func(c *pgx.Conn) error { addr = c.PgConn().Conn().RemoteAddr().String(); return nil })
				return err == nil && strings.HasSuffix(addr, fmt.Sprintf(":%d", standby.Port()))
			})
			closeAndCount(t, ctx, src, wait, s.cfg.Table, primary, 5, standby, 10)
		})
	}
}

// failoverSink starts a primary with a synchronous standby and a running
// sink of one committer on a failover list of both (the standby first if
// standbyFirst), and has it commit rows 1-5 on the primary.
func failoverSink(t *testing.T, ctx context.Context, standbyFirst bool) (primary, standby *testenv.Cluster, s *Sink, src source, wait func() error) {
	t.Helper()
	primary = testenv.NewCluster(t)
	standby = testenv.NewStandby(t, primary)
	list := testenv.FailoverURL("postgres", primary, standby)
	if standbyFirst {
		list = testenv.FailoverURL("postgres", standby, primary)
	}
	s, _ = newTestSink(t, ctx, list, func(c *Config) { c.Connections = 1 })
	src = newSource()
	wait = runSink(t, ctx, s, src)
	rs, ms := rows(1, 5, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "rows acked on the primary", allAcked(ms))
	return primary, standby, s, src, wait
}

// closeAndCount ends the sink's run and checks the rows of table on the
// old primary (those from before the promotion) and on the new one.
func closeAndCount(t *testing.T, ctx context.Context, src source, wait func() error, table string,
	old *testenv.Cluster, onOld int, promoted *testenv.Cluster, onPromoted int) {
	t.Helper()
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := count(t, ctx, connTo(t, ctx, old.URL("postgres")), table); n != onOld {
		t.Fatalf("the old primary has %d rows, want the %d from before the promotion", n, onOld)
	}
	if n := count(t, ctx, connTo(t, ctx, promoted.URL("postgres")), table); n != onPromoted {
		t.Fatalf("the new primary has %d rows, want %d", n, onPromoted)
	}
}

// refusedOldPrimary reports whether s logged the refusal of an old primary.
func refusedOldPrimary(s *Sink) bool {
	s.seenErrsMu.Lock()
	defer s.seenErrsMu.Unlock()
	for k := range s.seenErrs {
		if strings.HasPrefix(k, "split brain ") {
			return true
		}
	}
	return false
}

// execOn runs each statement on a connection of its own to url.
func execOn(t *testing.T, ctx context.Context, url string, sqls ...string) {
	t.Helper()
	conn := connTo(t, ctx, url)
	for _, sql := range sqls {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
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

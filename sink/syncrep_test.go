package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsink/jetsink/tests/testenv"
)

// A commit waiting for a synchronous standby that a cancel takes out of
// its wait has committed on the server and perhaps not on the standby:
// PostgreSQL warns ("canceling wait for synchronous replication due to
// user request") and then reports the statement done. A failover to that
// standby loses the rows, so they must not be acked: they come again. The
// cancel is an operator's (pg_cancel_backend: both modes) or the sink's
// own at a hard stop (at-least-once's COPY; exactly-once's COMMIT ends
// with an error then anyway). Here the standby never answers
// (synchronous_standby_names names one that does not exist).
func TestSyncRepCancelIsNotAcked(t *testing.T) {
	ctx := testCtx(t, 120*time.Second)
	cluster := testenv.NewCluster(t)
	url := cluster.URL("postgres")
	admin := (&testenv.PG{URL: url}).Conn(t)
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			// Last, after Run has stopped: commits wait no more.
			t.Cleanup(func() { syncStandby(t, ctx, admin, url, "") })
			s, dl := newTestSink(t, ctx, url, func(c *Config) { c.Mode = mode; c.Batch.MaxRows = 50 })
			src := newSource()
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			wait := runSink(t, runCtx, s, src)
			first, m1 := rows(1, 50, nil)
			src.push(t, ctx, first)
			waitFor(t, ctx, "the first rows acked", allAcked(m1))

			// An operator cancels the committer's wait.
			m2, pid := cancelSyncRepWait(t, ctx, admin, url, s, src)
			if m2[0].acks.Load() == 0 {
				waitSyncRep(t, ctx, admin, s.cfg.AppName) // the retry waits in turn
				// On the same connection: the cancel ended a wait, not
				// the session, and the server answered to ReadyForQuery.
				if got := syncRepPID(t, ctx, admin, s.cfg.AppName); got != pid {
					t.Errorf("the retry waits on backend %d, want %d: the connection was closed after the cancelled wait", got, pid)
				}
			}
			for i, m := range m2 {
				if m.acks.Load() != 0 {
					t.Fatalf("row %d acked after its commit's wait for the standby was cancelled", 51+i)
				}
			}
			syncStandby(t, ctx, admin, url, "")
			waitFor(t, ctx, "the second rows acked once the standby is not waited for", allAcked(m2))
			want := 150 // at-least-once: the cancelled commit's rows, and the retry's
			if mode == ExactlyOnce {
				want = 100
			}
			if n := count(t, ctx, admin, s.cfg.Table); n != want {
				t.Errorf("%d rows, want %d", n, want)
			}

			// A hard stop cancels the wait.
			syncStandby(t, ctx, admin, url, "nobody")
			third, m3 := rows(101, 50, nil)
			src.push(t, ctx, third)
			waitSyncRep(t, ctx, admin, s.cfg.AppName)
			stop()
			if err := wait(); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run = %v after a hard stop, want context.Canceled", err)
			}
			for i, m := range m3 {
				if m.acks.Load() != 0 {
					t.Fatalf("row %d acked after a hard stop cancelled its commit's wait for the standby", 101+i)
				}
			}
			syncStandby(t, ctx, admin, url, "")
			if letters, _ := dl.letters(); len(letters) != 0 {
				t.Errorf("%d rows dead-lettered, want none", len(letters))
			}
		})
	}
}

// The warning that tells of a commit cancelled out of its wait for a
// synchronous standby reaches the client only at client_min_messages
// warning or below. Set to error for the sink's role (or database), or
// in the URL's options, it was not sent, and such a commit was acked.
// Each batch's first guard raises the level to warning for its own
// transaction (raiseToWarning), and the server resets it only after the
// commit's wait: in at-least-once's implicit transaction as in
// exactly-once's BEGIN ... COMMIT. The sessions keep error otherwise.
func TestSyncRepWarningForced(t *testing.T) { // a short name: application_name keeps 63 bytes
	ctx := testCtx(t, 240*time.Second)
	cluster := testenv.NewCluster(t)
	url := cluster.URL("postgres")
	admin := (&testenv.PG{URL: url}).Conn(t)
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		for _, via := range []string{"role", "options"} {
			t.Run(string(mode)+"/"+via, func(t *testing.T) {
				sinkURL := withParam(t, url, "options", "-cclient_min_messages=error") // no space: withParam would write it as "+"
				if via == "role" {
					_, sinkURL = newRole(t, ctx, admin, url, "GRANT CREATE ON SCHEMA public TO %[1]s",
						"ALTER ROLE %[1]s SET client_min_messages = error")
				}
				// After Run has stopped, before the role is dropped (which
				// would wait for the standby).
				t.Cleanup(func() { syncStandby(t, ctx, admin, url, "") })
				s, dl := newTestSink(t, ctx, sinkURL, func(c *Config) { c.Mode = mode; c.Batch.MaxRows = 50 })
				// The sink leaves its sessions at the level asked for.
				var level string
				if err := s.withAdmin(ctx, func(c *pgx.Conn) error {
					return c.QueryRow(ctx, "SHOW client_min_messages").Scan(&level)
				}); err != nil || level != "error" {
					t.Fatalf("client_min_messages %q (%v) for the sink's sessions, want error", level, err)
				}
				src := newSource()
				wait := runSink(t, ctx, s, src)
				first, m1 := rows(1, 50, nil)
				src.push(t, ctx, first)
				waitFor(t, ctx, "the first rows acked", allAcked(m1))

				m2, _ := cancelSyncRepWait(t, ctx, admin, url, s, src)
				for i, m := range m2 {
					if m.acks.Load() != 0 {
						t.Fatalf("row %d acked after its commit's wait for the standby was cancelled", 51+i)
					}
				}
				syncStandby(t, ctx, admin, url, "")
				finishClean(t, ctx, src, wait, dl, m2)
			})
		}
	}
}

// raiseToWarning sets client_min_messages to warning for the transaction
// only when the session has it at error, keeps a lower level, warns of
// nothing, and lasts to the end of the transaction: the implicit one of
// a Query of several statements (at-least-once's) and an explicit one
// (exactly-once's). The session has its own level again afterwards.
func TestRaiseToWarning(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	for _, tc := range []struct{ level, want string }{
		{"error", "warning"},
		{"warning", "warning"},
		{"notice", "notice"},
		{"log", "log"},
		{"debug1", "debug1"},
	} {
		var notices atomic.Int64
		cc, err := pgx.ParseConfig(withParam(t, pg.URL, "options", "-cclient_min_messages="+tc.level))
		if err != nil {
			t.Fatal(err)
		}
		cc.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) { notices.Add(1) }
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{
			"SELECT " + raiseToWarning + "; SELECT 1; SELECT current_setting('client_min_messages')",
			"BEGIN; SELECT " + raiseToWarning + "; SELECT 1; SELECT current_setting('client_min_messages'); COMMIT",
		} {
			rs, err := conn.PgConn().Exec(ctx, q).ReadAll()
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			last := rs[len(rs)-1] // the current_setting
			if strings.HasPrefix(q, "BEGIN") {
				last = rs[len(rs)-2]
			}
			in := string(last.Rows[0][0])
			var after string
			if err := conn.QueryRow(ctx, "SHOW client_min_messages").Scan(&after); err != nil {
				t.Fatal(err)
			}
			if in != tc.want || after != tc.level {
				t.Errorf("at %s, %q: %s in the transaction and %s after it, want %s and %s", tc.level, q, in, after, tc.want, tc.level)
			}
		}
		_ = conn.Close(ctx)
		if n := notices.Load(); n != 0 {
			t.Errorf("at %s: %d notices, want none", tc.level, n)
		}
	}
}

// The sink's connections send only the startup parameters PgBouncer
// accepts by default (and user, database): it answers any other with
// "FATAL: unsupported startup parameter", so every connect failed when
// the sink added client_min_messages.
func TestStartupParamsPassPgBouncer(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	l := listen(t)
	proxied, to := l.proxy(t, withParam(t, pg.URL, "sslmode", "disable")) // the relay reads the startup message
	var mu sync.Mutex
	var params []string
	l.relay(to, func() (up, down func([]byte) verdict) {
		var buf []byte
		started := false
		return func(b []byte) verdict {
			mu.Lock()
			defer mu.Unlock()
			if started {
				return pass
			}
			buf = append(buf, b...)
			if len(buf) < 8 || len(buf) < int(binary.BigEndian.Uint32(buf)) {
				return pass
			}
			started = true
			// Length, protocol version, then name and value pairs
			// ending with an empty name.
			fields := strings.Split(string(buf[8:binary.BigEndian.Uint32(buf)]), "\x00")
			for i := 0; i+1 < len(fields) && fields[i] != ""; i += 2 {
				params = append(params, fields[i])
			}
			return pass
		}, func([]byte) verdict { return pass }
	})
	s, _ := newTestSink(t, ctx, proxied, nil)
	c := &committer{s: s}
	defer c.closeConn()
	rs, _ := rows(1, 5, nil)
	if _, err := c.attempt(ctx, rs); err != nil { // connects
		t.Fatal(err)
	}
	accepted := map[string]bool{"user": true, "database": true, // PgBouncer's own
		"client_encoding": true, "datestyle": true, "timezone": true, "standard_conforming_strings": true, "application_name": true}
	mu.Lock()
	defer mu.Unlock()
	if len(params) == 0 {
		t.Fatal("no startup message seen")
	}
	for _, p := range params {
		if !accepted[strings.ToLower(p)] {
			t.Errorf("startup parameter %q, which PgBouncer refuses by default; sent: %v", p, params)
		}
	}
}

// A trigger's RAISE WARNING for each row, read only after a hard stop (a
// relay holds the server's answer here, as a socket's buffer may), is no
// sign of a commit cancelled out of its wait for a synchronous standby:
// the batch committed, and is acked. Before, any WARNING read once the
// hard context had ended counted, and the committed batch was left
// unacked (redelivered: a duplicate, or in exactly-once mode a conflict).
func TestTriggerWarningsReadAfterHardStop(t *testing.T) {
	const marker = "jetsink-trigger-warning"
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			admin := pg.Conn(t)
			l := listen(t)
			proxied, to := l.proxy(t, withParam(t, pg.URL, "sslmode", "disable")) // the relay reads the answers
			hold := make(chan struct{})
			release := sync.OnceFunc(func() { close(hold) })
			t.Cleanup(release) // before the listener's cleanup, which waits for the relay
			var held atomic.Bool
			l.relay(to, func() (up, down func([]byte) verdict) {
				return func([]byte) verdict { return pass }, func(b []byte) verdict {
					if bytes.Contains(b, []byte(marker)) {
						held.Store(true)
						<-hold
					}
					return pass
				}
			})
			s, dl := newTestSink(t, ctx, proxied, func(c *Config) { c.Mode = mode; c.Connections = 1 })
			table := s.table.Sanitize()
			if _, err := admin.Exec(ctx, "CREATE FUNCTION warn() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE WARNING '"+marker+
				" %', NEW.stream_seq; RETURN NEW; END$$; CREATE TRIGGER warn BEFORE INSERT ON "+table+" FOR EACH ROW EXECUTE FUNCTION warn()"); err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			src := newSource()
			wait := runSink(t, runCtx, s, src)
			rs, ms := rows(1, 50, nil)
			src.push(t, ctx, rs)
			waitFor(t, ctx, "the batch committed and its warnings held", func() bool { return held.Load() && count(t, ctx, admin, s.cfg.Table) == 50 })
			stop()
			release()
			if err := wait(); err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("Run = %v after a hard stop, want nil or context.Canceled", err)
			}
			for i, m := range ms {
				if m.acks.Load() != 1 {
					t.Fatalf("row %d acked %d times, want once: it committed, and only a trigger warned", 1+i, m.acks.Load())
				}
			}
			if letters, _ := dl.letters(); len(letters) != 0 {
				t.Errorf("%d rows dead-lettered, want none", len(letters))
			}
			if n := count(t, ctx, admin, s.cfg.Table); n != 50 {
				t.Errorf("%d rows, want 50", n)
			}
		})
	}
}

// syncStandby sets synchronous_standby_names and returns once commits
// wait for it ("nobody": a probe's commit waits) or no longer do ("").
func syncStandby(t *testing.T, ctx context.Context, admin *pgx.Conn, url, names string) {
	t.Helper()
	if _, err := admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '"+names+"'"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	// The checkpointer takes the setting in its own time: probe a commit
	// on a connection of its own until it waits (or does not).
	for {
		probe, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = probe.Exec(pctx, "CREATE TABLE IF NOT EXISTS syncrep_probe (n int); INSERT INTO syncrep_probe VALUES (1)")
		cancel()
		_ = probe.Close(context.Background())
		if waits := err != nil; waits == (names != "") {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("synchronous_standby_names = %q not in effect: %v", names, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cancelSyncRepWait names a synchronous standby that never comes, hands s
// rows 51-100, cancels the COMMIT's wait for it as an operator would
// (pg_cancel_backend), and returns once the batch was retried or acked:
// the rows' messages, and the backend whose wait it cancelled.
func cancelSyncRepWait(t *testing.T, ctx context.Context, admin *pgx.Conn, url string, s *Sink, src source) ([]*recMsg, uint32) {
	t.Helper()
	syncStandby(t, ctx, admin, url, "nobody")
	second, m2 := rows(51, 50, nil)
	src.push(t, ctx, second)
	waitSyncRep(t, ctx, admin, s.cfg.AppName)
	pid := syncRepPID(t, ctx, admin, s.cfg.AppName)
	retries := s.Stats().Retries
	if _, err := admin.Exec(ctx, "SELECT pg_cancel_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the batch retried (or acked) after the cancel", func() bool { return s.Stats().Retries > retries || m2[0].acks.Load() != 0 })
	return m2, pid
}

// syncRepPID waits until one backend of the application waits for the
// synchronous standby while it runs a statement, and returns it. (Not one
// that waits as it exits: a closed exactly-once connection's backend
// drops its staging table then, in a transaction of its own whose commit
// waits too, while pg_stat_activity says it is idle.)
func syncRepPID(t *testing.T, ctx context.Context, admin *pgx.Conn, app string) uint32 {
	t.Helper()
	var pids []uint32
	waitFor(t, ctx, "a statement waiting for the standby", func() bool {
		rs, err := admin.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'SyncRep' AND state = 'active'", app)
		if err == nil {
			pids, err = pgx.CollectRows(rs, pgx.RowTo[uint32])
		}
		if err != nil {
			t.Fatal(err)
		}
		return len(pids) > 0
	})
	if len(pids) != 1 {
		t.Fatalf("backends %v running a statement that waits for the standby, want one", pids)
	}
	return pids[0]
}

// waitSyncRep waits until a backend of the application waits for the
// synchronous standby.
func waitSyncRep(t *testing.T, ctx context.Context, admin *pgx.Conn, app string) {
	t.Helper()
	waitFor(t, ctx, "a commit waiting for the standby", func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'SyncRep'", app).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// A WARNING from the server itself (no context) while the last statement
// commits counts after the sink's own cancel request, whatever it says
// (the server's messages may be translated); without one, only the
// English text. A trigger's RAISE WARNING (with a context), or any
// warning before the last statement, never counts: read after a hard
// stop, one of those had the committed batch refused.
func TestSyncRepCancelled(t *testing.T) {
	const en = "canceling wait for synchronous replication due to user request"
	const fr = "annulation de l'attente pour la réplication synchrone"
	const plpgsql = "PL/pgSQL function w() line 1 at RAISE"
	for _, tc := range []struct {
		severity, where, message string
		committing, cancelled    bool
		want                     bool
	}{
		{"WARNING", "", en, true, false, true},
		{"WARNING", "", fr, true, true, true},
		{"WARNING", "", fr, true, false, false},
		{"NOTICE", "", en, true, true, false},
		{"WARNING", "", "a trigger's RAISE WARNING", true, false, false},
		{"WARNING", plpgsql, "row 7", true, true, false},                       // a deferred trigger's, at commit, after a hard stop
		{"WARNING", plpgsql, en, true, false, false},                           // a trigger's that quotes the text
		{"WARNING", plpgsql + "\nCOPY t, line 1", "row 7", false, true, false}, // a row trigger's, read after a hard stop
		{"WARNING", "", "row 7", false, true, false},                           // before the last statement
		{"WARNING", "", en, false, false, false},
	} {
		if got := syncRepCancelled(tc.severity, tc.where, tc.message, tc.committing, tc.cancelled); got != tc.want {
			t.Errorf("syncRepCancelled(%q, %q, %q, %v, %v) = %v, want %v", tc.severity, tc.where, tc.message, tc.committing, tc.cancelled, got, tc.want)
		}
	}
}

package sink

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsink/jetsink/tests/testenv"
)

// A read-only session's fix says to renew a pooler's server sessions too:
// behind PgBouncer, those that started read-only stay so after the ALTER,
// however often jetsink connects again. So does run's log line of a batch
// refused with 25006.
func TestReadOnlyFixNamesThePooler(t *testing.T) {
	if p := readOnlySessionProblem; p.Kind != ProblemReadOnly || !strings.Contains(p.Fix, "default_transaction_read_only = off") ||
		!strings.Contains(p.Fix, "RECONNECT <db>") {
		t.Errorf("fix %q, want the ALTER and PgBouncer's RECONNECT", p.Fix)
	}
	args := withHint(&pgconn.PgError{Severity: "ERROR", Code: "25006", Message: "cannot execute COPY FROM in a read-only transaction"}, "err", "x")
	if h := fmt.Sprint(args...); !strings.Contains(h, "hint") || !strings.Contains(h, "RECONNECT <db>") {
		t.Errorf("withHint of 25006 = %v, want the pooler's RECONNECT", args)
	}
}

// An error of the admin connection's with SQLSTATE 42P05 or 26000 (pgx's
// prepared statements through a pooler in transaction mode) says so and
// what to do; any other error is as it was. Real errors of a server's, on
// Check's path (readAdmin).
func TestPooledStatementsHint(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, nil)
	for _, tc := range []struct {
		sql, code string
		hinted    bool
	}{
		{"PREPARE stmtcache_x AS SELECT 1; PREPARE stmtcache_x AS SELECT 1", "42P05", true},
		{"EXECUTE stmtcache_missing", "26000", true},
		{"SELECT * FROM jetsink_no_such_table", "42P01", false},
	} {
		err := s.readAdmin(ctx, func(c *pgx.Conn) error {
			defer c.Exec(ctx, "DEALLOCATE ALL")
			_, err := c.Exec(ctx, tc.sql)
			return fmt.Errorf("check the server version of %s: %w", s.where, err)
		})
		pgErr, ok := errors.AsType[*pgconn.PgError](err)
		if !ok || pgErr.Code != tc.code {
			t.Fatalf("%s: %v, want SQLSTATE %s", tc.sql, err, tc.code)
		}
		if got := strings.Contains(err.Error(), "max_prepared_statements") &&
			strings.Contains(err.Error(), "default_query_exec_mode=cache_statement"); got != tc.hinted {
			t.Errorf("%s: %q; hinted %v, want %v", tc.sql, err, got, tc.hinted)
		}
		if strings.Count(hintPooledStatements(err).Error(), "max_prepared_statements") > 1 {
			t.Errorf("%s: hinted twice", tc.sql)
		}
	}
	args := withHint(&pgconn.PgError{Severity: "ERROR", Code: "42P05", Message: `prepared statement "stmtcache_1" already exists`}, "err", "x")
	if h := fmt.Sprint(args...); !strings.Contains(h, "max_prepared_statements") {
		t.Errorf("withHint of 42P05 = %v, want the pooler's hint", args)
	}
	if args := withHint(&pgconn.PgError{Severity: "ERROR", Code: "42P01"}, "err", "x"); len(args) != 2 {
		t.Errorf("withHint of 42P01 = %v, want no hint", args)
	}
}

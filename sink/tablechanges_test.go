package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

// A column retyped while the sink runs. Binary COPY sends the mapping's
// bytes whatever the column's type, so without the type guards a bigint's
// bytes in a double precision column stored 2e-322 for 42 and acked it,
// and a jsonb's in a json column (its version byte) dead-lettered every
// row as bad JSON; exactly-once staged in the table's types, so a
// connection opened after the change stored 2e-322 too. Now nothing is
// stored or dead-lettered, and the batch is retried until the type is the
// mapping's again.
func TestColumnRetypedWhileRunning(t *testing.T) {
	for _, tc := range []struct {
		name             string
		mode             Mode
		column, to, back string
	}{
		{"same_width", AtLeastOnce, "stream_seq", "double precision", "bigint"},
		{"refused_as_data", AtLeastOnce, "payload", "json", "jsonb USING payload::jsonb"},
		{"same_width", ExactlyOnce, "stream_seq", "double precision", "bigint"},
	} {
		t.Run(string(tc.mode)+"_"+tc.name, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			s, dl, logs, admin, src, wait, rs, ms := tenOfTwenty(t, ctx, tc.mode, 1)

			alter := "ALTER TABLE " + s.table.Sanitize() + " ALTER COLUMN " + tc.column + " TYPE "
			if _, err := admin.Exec(ctx, alter+tc.to); err != nil {
				t.Fatal(err)
			}
			if tc.mode == ExactlyOnce {
				// A new connection makes a new staging table: it had
				// the table's types, now the mapping's.
				var n int
				if err := admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "+
					"datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'").Scan(&n); err != nil || n == 0 {
					t.Fatalf("%d connections of the sink ended (%v)", n, err)
				}
			}
			src.push(t, ctx, rs[10:])
			{
				waitFor(t, ctx, "the batch refused by the guard, retried", func() bool { return s.Stats().ConfigErrors >= 3 })
				for i, m := range ms[10:] {
					if m.acks.Load()+m.terms.Load()+m.naks.Load() != 0 {
						t.Fatalf("row %d settled while its column has another type", 11+i)
					}
				}
				if n := count(t, ctx, admin, s.cfg.Table); n != 10 {
					t.Fatalf("%d rows stored while a column has another type, want 10", n)
				}
				// Which column, Run's look says, off the committers' path.
				waitFor(t, ctx, "the log to say that the column changed type and which", func() bool {
					return strings.Contains(logs.String(), "no longer all have the types the mapping writes") &&
						strings.Contains(logs.String(), "but the mapping writes")
				})
				if _, err := admin.Exec(ctx, alter+tc.back); err != nil {
					t.Fatal(err)
				}
			}
			finishClean(t, ctx, src, wait, dl, ms)
			var n int
			var sum, frac float64
			if err := admin.QueryRow(ctx, "SELECT count(*), sum(stream_seq::float8), sum(stream_seq::float8 - trunc(stream_seq::float8)) FROM "+
				s.table.Sanitize()).Scan(&n, &sum, &frac); err != nil {
				t.Fatal(err)
			}
			if n != 20 || sum != 210 || frac != 0 {
				t.Fatalf("%d rows, stream_seq summing to %v (fractions %v), want 20 rows, 1..20 summing to 210", n, sum, frac)
			}
		})
	}
}

// The column changes type while the batch waits for a lock on the table.
// The guard reads the types only once it holds the table's lock, which
// keeps them until the COPY has committed: a guard that read them before
// (from pg_attribute, say) passed, and the COPY that got the lock after
// the ALTER stored the mapping's bytes as the new type.
func TestColumnRetypedWhileTheBatchWaits(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Connections = 1 })
	logs := captureLog(t, s, time.Minute)
	admin := pg.Conn(t)
	src := newSource()
	wait := runSink(t, ctx, s, src)
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+s.table.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	rs, ms := rows(1, 10, nil)
	src.push(t, ctx, rs)
	watcher := pg.Conn(t)
	waitFor(t, ctx, "the batch waiting for the lock", waitingOnLock(t, ctx, watcher, s.cfg.AppName))
	alter := "ALTER TABLE " + s.table.Sanitize() + " ALTER COLUMN stream_seq TYPE "
	if _, err := tx.Exec(ctx, alter+"double precision"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the guard", func() bool { return strings.Contains(logs.String(), "no longer all have the types the mapping writes") })
	if n := count(t, ctx, admin, s.cfg.Table); n != 0 {
		t.Fatalf("%d rows stored with the wrong type", n)
	}
	if _, err := admin.Exec(ctx, alter+"bigint"); err != nil {
		t.Fatal(err)
	}
	finishClean(t, ctx, src, wait, dl, ms)
	var sum int64
	if err := admin.QueryRow(ctx, "SELECT sum(stream_seq) FROM "+s.table.Sanitize()).Scan(&sum); err != nil || sum != 55 {
		t.Fatalf("stream_seq sums to %d (%v), want 55", sum, err)
	}
}

// Faults of the table that every row meets are not the rows': a
// partitioned table without a partition for the rows (its maintenance is
// late), a NOT NULL column that nothing maps to, an identity column that
// ran out of numbers, a CHECK added NOT VALID that no row passes, a CHECK's
// or a DEFAULT's cast that fails for every row (class 22, no column named
// at the COPY; at-least-once: exactly-once's INSERT names none, and its
// class 22 errors are taken for the row's). Each row failed (23514
// with or without a constraint name, 23502, 2200H, 22007, 22P02) and was dead-lettered,
// all of them, for the operator to replay; now the batch is held and
// retried until the table is fixed, and then stored.
func TestTableFaultEveryRowMeetsIsHeld(t *testing.T) {
	const (
		checkCast   = "ALTER TABLE %[1]s ADD CONSTRAINT chk CHECK ((payload->>'n')::date > '2020-01-01') NOT VALID%.0[2]s"
		defaultCast = "ALTER TABLE %[1]s ADD COLUMN tenant int; ALTER TABLE %[1]s ALTER COLUMN tenant SET DEFAULT current_setting('application_name')::int%.0[2]s"
		dropCheck   = "ALTER TABLE %[1]s DROP CONSTRAINT chk%.0[2]s"
		setDefault  = "ALTER TABLE %[1]s ALTER COLUMN tenant SET DEFAULT 0%.0[2]s"
	)
	for _, tc := range []struct {
		name, fault, fix string
		partitioned      bool
	}{
		{"no_partition", "CREATE TABLE %[2]s PARTITION OF %[1]s FOR VALUES FROM (0) TO (51)",
			"CREATE TABLE %[3]s PARTITION OF %[1]s FOR VALUES FROM (51) TO (1000)", true},
		{"unmapped_not_null", "ALTER TABLE %[1]s ADD COLUMN extra int NOT NULL%.0[2]s",
			"ALTER TABLE %[1]s ALTER COLUMN extra SET DEFAULT 0%.0[2]s", false},
		{"identity_ran_out", "ALTER TABLE %[1]s ADD COLUMN n int GENERATED ALWAYS AS IDENTITY (MAXVALUE 2); SELECT nextval(pg_get_serial_sequence('%[1]s', 'n')); " +
			"INSERT INTO %[1]s (stream, stream_seq) VALUES ('X', 0)%.0[2]s",
			"ALTER TABLE %[1]s ALTER COLUMN n SET MAXVALUE 1000; DELETE FROM %[1]s WHERE stream = 'X'%.0[2]s", false},
		{"check_every_row", "ALTER TABLE %[1]s ADD CONSTRAINT chk CHECK (stream_seq < 0) NOT VALID%.0[2]s", dropCheck, false},
		{"check_cast", checkCast, dropCheck, false},
		{"default_cast", defaultCast, setDefault, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Connections = 1; c.CreateTable = !tc.partitioned })
			admin := pg.Conn(t)
			table := s.table.Sanitize()
			sql := func(f string) string {
				return fmt.Sprintf(f, table, pgx.Identifier{s.cfg.Table + "_old"}.Sanitize(), pgx.Identifier{s.cfg.Table + "_new"}.Sanitize())
			}
			if tc.partitioned {
				if _, err := admin.Exec(ctx, "CREATE TABLE "+table+" (stream text NOT NULL, stream_seq bigint NOT NULL, payload jsonb) "+
					"PARTITION BY RANGE (stream_seq)"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := admin.Exec(ctx, sql(tc.fault)); err != nil {
				t.Fatal(err)
			}
			src := newSource()
			wait := runSink(t, ctx, s, src)
			rs, ms := rows(51, 10, nil)
			src.push(t, ctx, rs)
			waitFor(t, ctx, "the batch retried", func() bool { return s.Stats().ConfigErrors >= 3 })
			if l, seqs := dl.letters(); len(l) != 0 {
				t.Fatalf("rows %v dead-lettered for a fault of the table: %+v", seqs, l)
			}
			for i, m := range ms {
				if m.acks.Load()+m.terms.Load() != 0 {
					t.Fatalf("row %d settled while the table refuses every row", 51+i)
				}
			}
			if _, err := admin.Exec(ctx, sql(tc.fix)); err != nil {
				t.Fatal(err)
			}
			finishClean(t, ctx, src, wait, dl, ms)
			if n := count(t, ctx, admin, s.cfg.Table); n != 10 {
				t.Fatalf("%d rows stored, want 10", n)
			}
		})
	}
}

// varchar(n) and char(n) read text's bytes as text does: the guard lets
// them by, and check warns of their length, not of another type.
func TestTextIntoVarcharAndChar(t *testing.T) {
	for _, typ := range []string{"varchar(10)", "char(3)", "varchar"} {
		t.Run(typ, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			pg := testenv.Postgres(t)
			s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.CreateTable = false })
			admin := pg.Conn(t)
			if _, err := admin.Exec(ctx, "CREATE TABLE "+s.table.Sanitize()+" (stream "+typ+", stream_seq bigint, payload jsonb)"); err != nil {
				t.Fatal(err)
			}
			probs, err := s.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			warned := false
			for _, p := range probs {
				if !p.Warning || p.Kind != ProblemTypeModifier || p.Column != "stream" {
					t.Errorf("problem %+v", p)
				}
				warned = true
			}
			if warned != (typ != "varchar") {
				t.Errorf("%s: warned of its length %v", typ, warned)
			}
			storeClean(t, ctx, s, dl, 5)
			var stream string
			if err := admin.QueryRow(ctx, "SELECT stream::text || '|' FROM "+s.table.Sanitize()+" LIMIT 1").Scan(&stream); err != nil || stream != "S|" {
				t.Fatalf("stream %q (%v), want S", stream, err)
			}
		})
	}
}

// Exactly-once's unique index is made with IF NOT EXISTS, which only looks
// for the name: after the table was renamed (its index keeps the name) or
// a concurrent build failed (an INVALID index), init made no index and
// said the table was ready, check's fix was that same no-op statement, and
// every batch failed. Init now fails saying what holds the name and how to
// free it, check's fix says it too, and after that fix init makes the index.
func TestInitWhenTheIndexNameIsTaken(t *testing.T) {
	for _, tc := range []struct{ name, says, fix string }{{"renamed_table", "a table renamed since", "ALTER INDEX"},
		{"invalid_index", "INVALID index", "DROP INDEX"}, {"other_index", "is not a unique index on exactly the key's columns", "ALTER INDEX"}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			pg := testenv.Postgres(t)
			s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = ExactlyOnce; c.CreateTable = false })
			admin := pg.Conn(t)
			table, index := s.table.Sanitize(), pgx.Identifier{s.indexName()}.Sanitize()
			if tc.name == "renamed_table" {
				if err := s.Init(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := admin.Exec(ctx, "ALTER TABLE "+table+" RENAME TO "+pgx.Identifier{s.cfg.Table + "_old"}.Sanitize()); err != nil {
					t.Fatal(err)
				}
			} else if tc.name == "other_index" {
				if _, err := admin.Exec(ctx, s.DDL()[0]+"; CREATE INDEX "+index+" ON "+table+" (stream)"); err != nil {
					t.Fatal(err)
				}
			} else {
				if _, err := admin.Exec(ctx, s.DDL()[0]+"; INSERT INTO "+table+" (stream, stream_seq) VALUES ('S', 1), ('S', 1)"); err != nil {
					t.Fatal(err)
				}
				if _, err := admin.Exec(ctx, "CREATE UNIQUE INDEX CONCURRENTLY "+index+" ON "+table+" (stream, stream_seq)"); err == nil {
					t.Fatal("a unique index built over duplicates")
				}
				if _, err := admin.Exec(ctx, "DELETE FROM "+table); err != nil {
					t.Fatal(err)
				}
			}
			err := s.Init(ctx)
			if !errors.Is(err, ErrNoKeyIndex) || !strings.Contains(err.Error(), tc.fix) {
				t.Fatalf("Init with the index's name taken: %v, want ErrNoKeyIndex saying %s", err, tc.fix)
			}
			probs, err := s.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var fix string
			for _, p := range probs {
				if p.Kind == ProblemNoUniqueIndex {
					fix = p.Fix
					if p.InitMakes() {
						t.Errorf("InitMakes() for an index whose name is taken (check took it for a warning under create_table)")
					}
				}
			}
			if !strings.Contains(fix, tc.fix) || !strings.Contains(fix, tc.says) {
				t.Fatalf("check's fix %q, want it to say %q and %s", fix, tc.says, tc.fix)
			}
			if _, err := admin.Exec(ctx, strings.SplitN(fix, "; then ", 2)[0][strings.Index(fix, tc.fix):]); err != nil {
				t.Fatalf("check's fix %q: %v", fix, err)
			}
			if err := s.Init(ctx); err != nil {
				t.Fatalf("Init after the fix: %v", err)
			}
			if probs, err := s.Check(ctx); err != nil || len(probs) != 0 {
				t.Fatalf("Check after init: %v %v", probs, err)
			}
		})
	}
}

// A view COPY cannot write into passed check, and every batch then failed
// (42809): check names it now, and lets a view with an INSTEAD OF INSERT
// trigger by.
func TestCheckRelationKind(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.CreateTable = false })
	admin := pg.Conn(t)
	table := s.table.Sanitize()
	base := pgx.Identifier{s.cfg.Table + "_base"}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE TABLE "+base+" (stream text, stream_seq bigint, payload jsonb); "+
		"CREATE VIEW "+table+" AS SELECT * FROM "+base); err != nil {
		t.Fatal(err)
	}
	kinds := func() []ProblemKind {
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ks []ProblemKind
		for _, p := range probs {
			ks = append(ks, p.Kind)
		}
		return ks
	}
	if ks := kinds(); len(ks) != 1 || ks[0] != ProblemRelationKind {
		t.Fatalf("problems of a view without a trigger: %v, want %s", ks, ProblemRelationKind)
	}
	fn := pgx.Identifier{s.cfg.Table + "_route"}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE FUNCTION "+fn+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO "+base+
		" VALUES (NEW.*); RETURN NEW; END $$; CREATE TRIGGER route INSTEAD OF INSERT ON "+table+" FOR EACH ROW EXECUTE FUNCTION "+fn+"()"); err != nil {
		t.Fatal(err)
	}
	// COPY counts each row it hands the trigger as stored: one the
	// trigger stores nowhere would be acked and missing. Warned, naming it.
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) != 1 || probs[0].Kind != ProblemRowTrigger || !probs[0].Warning || !strings.Contains(probs[0].Message, "(route)") {
		t.Fatalf("problems of a view with an INSTEAD OF INSERT trigger: %+v, want one row_trigger warning naming route", probs)
	}
}

// The guard after the COPY: a column that changes type after the first
// guard passed, before the COPY takes its lock, is found by the second,
// which rolls the COPY back. Which guard fails cannot be timed from
// outside, so the Query here has a first statement that passes and a last
// that fails as the guard does.
func TestGuardAfterTheCopyRollsItBack(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, nil)
	admin := pg.Conn(t)
	conn := pg.Conn(t)
	stmts := strings.Split(*s.copySQL.Load(), "; ")
	if len(stmts) != 3 || s.copyStmts != 3 || stmts[0] != stmts[2]+", "+raiseToWarning || !strings.HasPrefix(stmts[1], "COPY ") {
		t.Fatalf("at-least-once's Query: %d statements %q", s.copyStmts, *s.copySQL.Load())
	}
	rs, _ := rows(1, 5, nil)
	var w copyWire
	sent, res := sendCopy(ctx, conn.PgConn(), &w, guardedCopy("SELECT 1; "+stmts[1]+"; SELECT 1/(count(*) = 0)::int FROM "+s.table.Sanitize(), 3), rs)
	err := res.err
	var tc *typesChangedError
	if !sent || !errors.As(err, &tc) || !tc.afterCopy || s.classify(err) != classConfig {
		t.Fatalf("sendCopy = %v, %v; want a typesChangedError after the COPY", sent, err)
	}
	if n := count(t, ctx, admin, s.cfg.Table); n != 0 {
		t.Fatalf("%d rows stored by a COPY its guard rolled back", n)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the connection after the guard failed: %v", err)
	}
}

// At-least-once needs INSERT on the table and nothing else: its guards
// read the types of the table's row type, which needs no privilege (a
// guard reading the table's columns needed SELECT on them, and stopped
// every batch of a role that may only insert).
func TestAtLeastOnceNeedsOnlyInsert(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	owner, _ := newTestSink(t, ctx, pg.URL, nil) // creates the table
	_, roleURL := newRole(t, ctx, admin, pg.URL, "GRANT USAGE ON SCHEMA public TO %[1]s", "GRANT INSERT ON "+owner.table.Sanitize()+" TO %[1]s")
	s, dl := newTestSink(t, ctx, roleURL, func(c *Config) { c.Table, c.CreateTable = owner.cfg.Table, false })
	storeClean(t, ctx, s, dl, 10)
	if n := count(t, ctx, admin, s.cfg.Table); n != 10 {
		t.Fatalf("%d rows stored, want 10", n)
	}
}

// Columns of a domain over the mapping's type, or of citext for a text
// mapping, read the mapping's bytes as sent: a domain's binary input is its
// base type's, then its constraints, and citext's is text's. The guards
// compared exact types, so such a table had every batch refused (and check
// called it a mismatch). Now check accepts them, the first batch commits
// without a guard failing, and a row that a domain's constraint refuses
// is dead-lettered as such. A domain over another type stays refused, and
// so does citext for exactly-once's key (its index ignores case), and a
// domain's length draws check's warning as a column's does.
func TestDomainsAndCitext(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = mode; c.CreateTable = false })
			admin := pg.Conn(t)
			stream := "citext"
			if mode == ExactlyOnce {
				stream = "label" // a key column: citext is refused (below)
			}
			probs := typedTable(t, ctx, admin, s, "CREATE EXTENSION citext; CREATE DOMAIN label AS text; "+
				"CREATE DOMAIN not3 AS bigint CHECK (VALUE <> 3); CREATE DOMAIN seq AS not3; CREATE DOMAIN doc AS jsonb CHECK (VALUE ? 'n')",
				stream, "seq", "doc")
			for _, p := range probs {
				t.Errorf("problem %+v", p)
			}
			src := newSource()
			wait := runSink(t, ctx, s, src)
			rs, ms := rows(1, 10, func(seq int) string {
				if seq == 5 {
					return `{"x":5}`
				}
				return fmt.Sprintf(`{"n":%d}`, seq)
			})
			src.push(t, ctx, rs)
			waitFor(t, ctx, "rows settled", func() bool {
				l, _ := dl.letters()
				return allAcked(append(append([]*recMsg(nil), ms[:2]...), append(ms[3:4], ms[5:]...)...))() && len(l) == 2
			})
			src.close()
			if err := wait(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			letters, seqs := dl.letters()
			if slices.Sort(seqs); !slices.Equal(seqs, []uint64{3, 5}) {
				t.Errorf("dead letters of seqs %v, want 3 and 5", seqs)
			}
			for _, l := range letters {
				if l.Code != pipeline.CodeConstraint || l.SQLState != "23514" {
					t.Errorf("dead letter %+v, want code constraint, SQLSTATE 23514", l)
				}
			}
			if st := s.Stats(); st.ConfigErrors != 0 {
				t.Errorf("%d attempts refused as configuration errors: the guards refused the table's types", st.ConfigErrors)
			}
			var n, sum int64
			var same bool
			if err := admin.QueryRow(ctx, "SELECT count(*), sum(stream_seq), bool_and(stream::text = 'S' AND (stream = 's') = "+
				fmt.Sprint(mode == AtLeastOnce)+" AND (payload->>'n')::bigint = stream_seq) FROM "+s.table.Sanitize()).Scan(&n, &sum, &same); err != nil || n != 8 || sum != 55-3-5 || !same {
				t.Fatalf("%d rows, stream_seq summing to %d, values as sent: %v (%v); want 8, 47, true", n, sum, same, err)
			}
		})
	}
	for _, tc := range []struct {
		name, stream, seq string
		mode              Mode
		want              []string
	}{
		{"domain_over_another_type", "text", "small", AtLeastOnce, []string{"type_mismatch stream_seq false"}},
		{"citext_key", "citext", "bigint", ExactlyOnce, []string{"type_mismatch stream false"}},
		{"domain_with_a_length", "short", "bigint", AtLeastOnce, []string{"type_modifier stream true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = tc.mode; c.CreateTable = false; c.Connections = 1 })
			admin := pg.Conn(t)
			probs := typedTable(t, ctx, admin, s, "CREATE EXTENSION citext; CREATE DOMAIN small AS integer; CREATE DOMAIN short AS varchar(5)",
				tc.stream, tc.seq, "jsonb")
			var got []string
			for _, p := range probs {
				got = append(got, fmt.Sprintf("%s %s %v", p.Kind, p.Column, p.Warning))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("problems %q, want %q", got, tc.want)
			}
			if tc.name == "domain_with_a_length" {
				return
			}
			src := newSource()
			wait := runSink(t, ctx, s, src)
			rs, ms := rows(1, 5, nil)
			src.push(t, ctx, rs)
			waitFor(t, ctx, "the batch refused by the guard, retried", func() bool { return s.Stats().ConfigErrors >= 3 })
			if n := count(t, ctx, admin, s.cfg.Table); n != 0 {
				t.Fatalf("%d rows stored in a column the guard refuses", n)
			}
			col, typ := "stream_seq", "bigint"
			if tc.name == "citext_key" {
				col, typ = "stream", "text"
			}
			if _, err := admin.Exec(ctx, "ALTER TABLE "+s.table.Sanitize()+" ALTER COLUMN "+col+" TYPE "+typ); err != nil {
				t.Fatal(err)
			}
			finishClean(t, ctx, src, wait, dl, ms)
		})
	}
}

// ciCollation makes a nondeterministic ICU collation, "ci", that ignores
// case (the test cluster's PostgreSQL is built with ICU).
const ciCollation = "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"

// caseEvents makes the rows of events of streams "ORDERS" and "orders",
// both with sequence 7: under a collation that ignores case, one key.
func caseEvents() ([]pipeline.Row, []*recMsg) {
	ms := []*recMsg{{}, {}}
	return carved([]pipeline.Event{
		{Msg: ms[0], Stream: "ORDERS", StreamSeq: 7, Subject: "events.x", Data: []byte(`{"n":1}`)},
		{Msg: ms[1], Stream: "orders", StreamSeq: 7, Subject: "events.x", Data: []byte(`{"n":2}`)},
	}), ms
}

// In exactly-once mode a key column, or a unique index on the key, that
// compares with a nondeterministic collation (here one that ignores case)
// takes the events of streams "ORDERS" and "orders" with the same
// sequence for one key: ON CONFLICT DO NOTHING skipped the second, the
// lookup after the commit found the first in its place, and the second
// was acked and never stored. Check and Init now report it as an error,
// and the guards refuse every batch until the collation changes (as for
// citext); after the fix Check gives, both events are stored. For a
// primary key on such a column that a foreign key references, the fix
// re-collates the column: dropping the constraint would fail.
func TestNondeterministicKeyCollation(t *testing.T) {
	for _, where := range []string{"column", "index", "primary key"} {
		t.Run(where, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			admin := pg.Conn(t)
			s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = ExactlyOnce; c.CreateTable = false; c.Connections = 1 })
			stream := "text COLLATE ci"
			if where == "index" {
				stream = "text"
			}
			var probs []Problem
			if where == "primary key" {
				table := s.table.Sanitize()
				ref := pgx.Identifier{s.table[len(s.table)-1] + "_ref"}.Sanitize()
				if _, err := admin.Exec(ctx, ciCollation+"; CREATE TABLE "+table+" (stream text COLLATE ci, stream_seq bigint, payload jsonb, PRIMARY KEY (stream, stream_seq)); "+
					"CREATE TABLE "+ref+" (stream text COLLATE ci, stream_seq bigint, FOREIGN KEY (stream, stream_seq) REFERENCES "+table+")"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+ref) })
			} else {
				probs = typedTable(t, ctx, admin, s, ciCollation, stream, "bigint", "jsonb")
			}
			if where != "column" {
				if where == "index" {
					if _, err := admin.Exec(ctx, "CREATE UNIQUE INDEX caseless ON "+s.table.Sanitize()+" (stream COLLATE ci, stream_seq)"); err != nil {
						t.Fatal(err)
					}
				}
				var err error
				if probs, err = s.Check(ctx); err != nil {
					t.Fatal(err)
				}
			}
			var got []string
			for _, p := range probs {
				got = append(got, fmt.Sprintf("%s %s %v", p.Kind, p.Column, p.Warning))
			}
			want := []string{"collation stream false"}
			if where == "index" {
				want = []string{"collation  false"}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("problems %q, want %q", got, want)
			}
			if where == "primary key" && !strings.HasPrefix(probs[0].Fix, "ALTER TABLE "+s.Table()+" ALTER COLUMN") {
				t.Fatalf("fix %q for a primary key, want the column re-collated", probs[0].Fix)
			}
			if err := s.Init(ctx); !errors.Is(err, ErrNoKeyIndex) || !strings.Contains(err.Error(), "nondeterministic collation") {
				t.Fatalf("Init = %v, want ErrNoKeyIndex naming the collation", err)
			}

			logs := captureLog(t, s, time.Minute)
			src := newSource()
			wait := runSink(t, ctx, s, src)
			rs, ms := caseEvents()
			src.push(t, ctx, rs)
			settled := func() bool {
				for _, m := range ms {
					if m.acks.Load() != 0 || m.terms.Load() != 0 {
						return true
					}
				}
				return false
			}
			waitFor(t, ctx, "the batch refused by the guard, retried", func() bool { return s.Stats().ConfigErrors >= 2 || settled() })
			if settled() {
				t.Fatal("a row settled (acked or dead-lettered) under a key that ignores case")
			}
			if n := count(t, ctx, admin, s.cfg.Table); n != 0 {
				t.Fatalf("%d rows stored under a key that ignores case", n)
			}
			if l := logs.String(); !strings.Contains(l, "nondeterministic collation") {
				t.Errorf("the log does not name the collation:\n%s", l)
			}
			for _, q := range strings.Split(probs[0].Fix, "; then ") {
				if _, err := admin.Exec(ctx, q); err != nil {
					t.Fatalf("the fix %q: %v", q, err)
				}
			}
			finishClean(t, ctx, src, wait, dl, ms)
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(DISTINCT stream COLLATE \"C\") FROM "+s.table.Sanitize()+" WHERE stream_seq = 7").Scan(&n); err != nil || n != 2 {
				t.Fatalf("%d streams stored with sequence 7 (%v), want 2: ORDERS and orders", n, err)
			}
			if probs, err := s.Check(ctx); err != nil || len(probs) != 0 {
				t.Errorf("Check after the fix: %v, %v", probs, err)
			}
		})
	}
}

// On a key column with a nondeterministic collation and no key index,
// Init fails (ErrNoKeyIndex, naming the collation) without building the
// index first: the build blocks writes, for long on a big table, and
// would not help. Once the column is re-collated as Check says, Init
// builds it.
func TestInitBuildsNoIndexOnALooseKey(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = ExactlyOnce; c.CreateTable = false })
	if _, err := admin.Exec(ctx, ciCollation+"; CREATE TABLE "+s.table.Sanitize()+" (stream text COLLATE ci, stream_seq bigint, payload jsonb)"); err != nil {
		t.Fatal(err)
	}
	indexes := func() int {
		t.Helper()
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_index WHERE indrelid = to_regclass($1)", s.table.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := s.Init(ctx); !errors.Is(err, ErrNoKeyIndex) || !strings.Contains(err.Error(), "nondeterministic collation") {
		t.Fatalf("Init = %v, want ErrNoKeyIndex naming the collation", err)
	}
	if n := indexes(); n != 0 {
		t.Fatalf("%d indexes built by an Init that fails on the key's collation, want none", n)
	}
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(probs, func(p Problem) bool { return p.Kind == ProblemCollation })
	if i < 0 {
		t.Fatalf("problems %v, want one of the collation", probs)
	}
	if _, err := admin.Exec(ctx, probs[i].Fix); err != nil {
		t.Fatalf("the fix %q: %v", probs[i].Fix, err)
	}
	if err := s.Init(ctx); err != nil {
		t.Fatalf("Init after the fix: %v", err)
	}
	if n := indexes(); n != 1 {
		t.Fatalf("%d indexes after Init, want its key index", n)
	}
}

// A column retyped while the sink runs to a domain over its type, or to
// citext: the guard refuses a batch once per connection (the types it
// accepts were read when the connection opened), the types are read again,
// and the rows commit as sent, with an Info line and no error logged. One
// connection, which committed the first rows: the types it read are
// certainly the old ones (a second one, still connecting on a loaded
// machine when the column changed, read the new ones, took the batch and
// refused nothing: make test saw it once).
func TestColumnRetypedToADomainWhileRunning(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			s, dl, logs, admin, src, wait, rs, ms := tenOfTwenty(t, ctx, mode, 1)
			table := s.table.Sanitize()
			stream := "citext"
			if mode == ExactlyOnce {
				stream = "label" // a key column: not citext
			}
			if _, err := admin.Exec(ctx, "CREATE EXTENSION citext; CREATE DOMAIN label AS text; CREATE DOMAIN seq AS bigint CHECK (VALUE > 0); "+
				"ALTER TABLE "+table+" ALTER COLUMN stream TYPE "+stream+", ALTER COLUMN stream_seq TYPE seq"); err != nil {
				t.Fatal(err)
			}
			src.push(t, ctx, rs[10:])
			finishClean(t, ctx, src, wait, dl, ms)
			var n, sum int64
			if err := admin.QueryRow(ctx, "SELECT count(*), sum(stream_seq) FROM "+table+" WHERE stream::text = 'S'").Scan(&n, &sum); err != nil || n != 20 || sum != 210 {
				t.Fatalf("%d rows of stream S, stream_seq summing to %d (%v); want 20, 210", n, sum, err)
			}
			if st := s.Stats(); st.ConfigErrors != 1 {
				t.Errorf("%d attempts refused, want 1 (the guard, once for the connection)", st.ConfigErrors)
			}
			if l := logs.String(); strings.Contains(l, "level=ERROR") || !strings.Contains(l, "type changed to one that stores the values as sent") {
				t.Errorf("the log does not say the type changed, or logs an error:\n%s", l)
			}
		})
	}
}

// Row-level security that applies to jetsink's role: PostgreSQL refuses
// COPY FROM into the table, so at-least-once fails every batch, and check
// says so as an error; exactly-once inserts from staging under the
// policies, and check warns that a row their WITH CHECK refuses is
// dead-lettered.
func TestCheckRowSecurity(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			s, _, admin, role, roleURL := ownedSink(t, ctx, mode)
			kinds := func() (ks []string) {
				probs, err := s.Check(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range probs {
					ks = append(ks, fmt.Sprintf("%s/%v", p.Kind, p.Warning))
				}
				return ks
			}
			if ks := kinds(); len(ks) != 0 {
				t.Fatalf("problems before row-level security: %v", ks)
			}
			table := s.table.Sanitize()
			forceRowSecurity(t, ctx, admin, table)
			want := fmt.Sprintf("%s/%v", ProblemRowSecurity, mode == ExactlyOnce)
			if ks := kinds(); len(ks) != 1 || ks[0] != want {
				t.Fatalf("problems under row-level security: %v, want %s", ks, want)
			}
			if mode == ExactlyOnce {
				// A row the SELECT policies hide is refused by INSERT ...
				// ON CONFLICT (42501), not stored: not a row_count.
				probs, err := s.Check(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if m := probs[0].Message; !strings.Contains(m, "SELECT policies hide") || !strings.Contains(m, "code refused") ||
					strings.Contains(m, "row_count") {
					t.Errorf("the warning says %q, want a row the SELECT policies hide refused (42501, code refused)", m)
				}
			}
			// What check says of each mode, from the server itself.
			conn, err := pgx.Connect(ctx, roleURL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			_, err = conn.PgConn().CopyFrom(ctx, strings.NewReader("S\t1\t{\"n\":1}\n"), "COPY "+table+" FROM STDIN")
			if code := sqlState(err); code != "0A000" {
				t.Errorf("COPY FROM into a table under row-level security: %v, want SQLSTATE 0A000", err)
			}
			_, err = conn.Exec(ctx, "INSERT INTO "+table+" SELECT 'S', 2, '{}'::jsonb")
			if code := sqlState(err); code != "42501" {
				t.Errorf("INSERT of a row WITH CHECK refuses: %v, want SQLSTATE 42501", err)
			}
			if _, err := admin.Exec(ctx, "ALTER ROLE "+role+" BYPASSRLS"); err != nil {
				t.Fatal(err)
			}
			if ks := kinds(); len(ks) != 0 {
				t.Fatalf("problems with BYPASSRLS: %v", ks)
			}
		})
	}
}

// Row-level security at run time. Exactly-once: a row that the policy's
// WITH CHECK refuses (42501) is dead-lettered (code refused) once other
// rows have committed; 42501 was a configuration error, retried for ever,
// so that one event stopped the stream. At-least-once: PostgreSQL refuses
// COPY FROM into the table (0A000), and every batch is held, none
// dead-lettered, until the role is exempted.
func TestRowSecurityAtRun(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			s, dl, admin, role, _ := ownedSink(t, ctx, mode)
			forceRowSecurity(t, ctx, admin, s.table.Sanitize())
			src := newSource()
			wait := runSink(t, ctx, s, src)
			rs, ms := rows(1, 10, func(seq int) string {
				if seq == 3 {
					return `{}`
				}
				return fmt.Sprintf(`{"n":%d}`, seq)
			})
			src.push(t, ctx, rs)
			others := append(append([]*recMsg(nil), ms[:2]...), ms[3:]...)
			if mode == AtLeastOnce {
				waitFor(t, ctx, "the batch refused and retried", func() bool { return s.Stats().ConfigErrors >= 5 })
				if n := count(t, ctx, admin, s.cfg.Table); n != 0 {
					t.Fatalf("%d rows stored", n)
				}
				if l, _ := dl.letters(); len(l) != 0 {
					t.Fatalf("dead letters %+v of a table that refuses COPY", l)
				}
				if _, err := admin.Exec(ctx, "ALTER ROLE "+role+" BYPASSRLS"); err != nil {
					t.Fatal(err)
				}
				finishClean(t, ctx, src, wait, dl, ms)
				return
			}
			waitFor(t, ctx, "rows settled", func() bool {
				l, _ := dl.letters()
				return allAcked(others)() && len(l) == 1
			})
			src.close()
			if err := wait(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if letters, seqs := dl.letters(); seqs[0] != 3 || letters[0].Code != pipeline.CodeRefused || letters[0].SQLState != "42501" {
				t.Fatalf("dead letter of seq %d: %+v, want seq 3, code refused, SQLSTATE 42501", seqs[0], letters[0])
			}
			if n := count(t, ctx, admin, s.cfg.Table); n != 9 {
				t.Fatalf("%d rows stored, want 9", n)
			}
		})
	}
}

// ownedSink is a one-connection sink of mode on a database of the test's
// own, whose role (not a superuser) owns the sink's table. admin is a
// superuser's connection.
func ownedSink(t *testing.T, ctx context.Context, mode Mode) (s *Sink, dl *recDL, admin *pgx.Conn, role, roleURL string) {
	t.Helper()
	pg := testenv.Postgres(t)
	admin = pg.Conn(t)
	role, roleURL = newRole(t, ctx, admin, pg.URL, "GRANT CREATE, USAGE ON SCHEMA public TO %[1]s")
	s, dl = newTestSink(t, ctx, roleURL, func(c *Config) { c.Mode = mode; c.Connections = 1 })
	return s, dl, admin, role, roleURL
}

// forceRowSecurity makes row-level security apply to table's owner too,
// with one policy, which takes the rows whose payload has "n".
func forceRowSecurity(t *testing.T, ctx context.Context, admin *pgx.Conn, table string) {
	t.Helper()
	if _, err := admin.Exec(ctx, "ALTER TABLE "+table+" ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY; CREATE POLICY p ON "+
		table+" USING (true) WITH CHECK (payload ? 'n')"); err != nil {
		t.Fatal(err)
	}
}

// typedTable runs the statements types on admin, then creates s's table
// with the columns stream, stream_seq and payload of the types given (and,
// in exactly-once mode, its unique key), and returns what s.Check finds.
func typedTable(t *testing.T, ctx context.Context, admin *pgx.Conn, s *Sink, types, stream, seq, payload string) []Problem {
	t.Helper()
	ddl := types + "; CREATE TABLE " + s.table.Sanitize() + " (stream " + stream + ", stream_seq " + seq + ", payload " + payload + ")"
	if s.cfg.Mode == ExactlyOnce {
		ddl += "; " + s.DDL()[1]
	}
	if _, err := admin.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return probs
}

// tenOfTwenty runs a sink of mode with conns connections on a table of its
// own, makes 20 rows (rs, ms) and waits until the first 10 are acked.
func tenOfTwenty(t *testing.T, ctx context.Context, mode Mode, conns int) (s *Sink, dl *recDL, logs *testenv.SyncBuffer, admin *pgx.Conn,
	src source, wait func() error, rs []pipeline.Row, ms []*recMsg) {
	t.Helper()
	pg := testenv.Postgres(t)
	s, dl = newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = mode; c.Connections = conns })
	logs = captureLog(t, s, time.Minute)
	admin = pg.Conn(t)
	src = newSource()
	wait = runSink(t, ctx, s, src)
	rs, ms = rows(1, 20, nil)
	src.push(t, ctx, rs[:10])
	waitFor(t, ctx, "the first rows acked", allAcked(ms[:10]))
	return s, dl, logs, admin, src, wait, rs, ms
}

// A batch a type guard refused is reported by /readyz as the type change
// it is, not as the guard's division by zero (an operator drill saw
// "SQLSTATE 22012: division by zero").
func TestRefusalByATypeGuardSaysWhy(t *testing.T) {
	s := &Sink{born: time.Now()}
	err := &typesChangedError{err: &pgconn.PgError{Code: "22012", Message: "division by zero"}}
	s.refused(err, classify(err), time.Now())
	r := s.refusedErr.Load()
	if r == nil || !r.table || strings.Contains(r.msg, "division by zero") || !strings.Contains(r.msg, "no longer all have the types the mapping writes") {
		t.Fatalf("refusal %+v, want the type change, of the table, without the guard's division by zero", r)
	}
}

// A batch that a type guard refuses is retried without waiting for the
// admin connection, and the mapping is compared with the table (Check) by
// Run's look, off the committers' path, at most once per stillFailingEvery.
// Before, every retry of every committer read the types on the admin
// connection and ran Check itself: behind a busy admin connection each
// retry waited 10 s for the one and up to max(10 s, dialMax) for the
// other; while Check failed (the admin connection refused), every retry
// logged "cannot compare the column mapping with the table yet"; and each
// committer logged the table's problems.
func TestTypeGuardRefusalsAndTheTableCheck(t *testing.T) {
	const cannot = "cannot compare the column mapping with the table yet"
	const notFit = "the table does not fit the column mapping"
	// start runs a sink of 3 committers on a table whose payload is json,
	// not the mapping's jsonb, with 3 batches of 2 rows for them; hold
	// takes the admin connection first, as a long StoredSeq would.
	start := func(t *testing.T, ctx context.Context, hold bool) (s *Sink, logs *testenv.SyncBuffer, release, finish func()) {
		t.Helper()
		pg := testenv.Postgres(t)
		s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Connections, c.Batch.MaxRows = 3, 2 })
		logs = captureLog(t, s, time.Minute)
		admin := pg.Conn(t)
		table := s.table.Sanitize()
		if _, err := admin.Exec(ctx, "ALTER TABLE "+table+" ALTER COLUMN payload TYPE json USING payload::json"); err != nil {
			t.Fatal(err)
		}
		var held atomic.Bool
		release = func() {
			if held.CompareAndSwap(true, false) {
				<-s.adminSem
			}
		}
		if hold {
			s.adminSem <- struct{}{}
			held.Store(true)
			t.Cleanup(release) // after Run returns, before Close
		}
		src := newSource()
		wait := runSink(t, ctx, s, src)
		rs, ms := rows(1, 6, nil)
		src.push(t, ctx, rs)
		finish = func() {
			t.Helper()
			if _, err := admin.Exec(ctx, "ALTER TABLE "+table+" ALTER COLUMN payload TYPE jsonb USING payload::jsonb"); err != nil {
				t.Fatal(err)
			}
			finishClean(t, ctx, src, wait, dl, ms)
			if n := count(t, ctx, admin, s.cfg.Table); n != 6 {
				t.Fatalf("%d rows, want 6", n)
			}
		}
		return s, logs, release, finish
	}
	retried := func(t *testing.T, ctx context.Context, s *Sink, n uint64, within time.Duration) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		from := s.Stats().ConfigErrors
		waitFor(t, wctx, fmt.Sprintf("%d more retries of the refused batches", n), func() bool { return s.Stats().ConfigErrors >= from+n })
	}

	t.Run("check held up, then failing", func(t *testing.T) {
		ctx := testCtx(t, 60*time.Second)
		s, logs, release, finish := start(t, ctx, true)
		// The admin connection is busy: the retries go on all the same,
		// well within the 10 s one retry waited for it.
		retried(t, ctx, s, 20, 8*time.Second)
		// The admin connection refused from now on (as a server at its
		// connection limit does, 53300; here the sink's own refusal after
		// Close): every look fails at once.
		s.closed = true
		release()
		waitFor(t, ctx, "a look that cannot compare", func() bool { return strings.Contains(logs.String(), cannot) })
		retried(t, ctx, s, 20, 30*time.Second)
		if n := strings.Count(logs.String(), cannot); n != 1 {
			t.Errorf("%q logged %d times within a minute, want once:\n%s", cannot, n, logs)
		}
		s.adminSem <- struct{}{}
		s.closed = false
		<-s.adminSem
		finish()
	})

	t.Run("check says what to fix", func(t *testing.T) {
		ctx := testCtx(t, 60*time.Second)
		s, logs, _, finish := start(t, ctx, false)
		probs, err := s.Check(ctx)
		errs := 0 // problems that are not warnings
		for _, p := range probs {
			if !p.Warning {
				errs++
			}
		}
		if err != nil || errs == 0 {
			t.Fatalf("Check = %v, %v; want the payload's type", probs, err)
		}
		retried(t, ctx, s, 20, 30*time.Second)
		// The look at the start said it, and the committers' refusals
		// within the minute after do not say it again.
		if n := strings.Count(logs.String(), notFit); n != errs {
			t.Errorf("%q logged %d times for %d problems, want once each:\n%s", notFit, n, errs, logs)
		}
		if strings.Contains(logs.String(), cannot) {
			t.Errorf("%q logged:\n%s", cannot, logs)
		}
		finish()
	})
}

// A sink started before its table existed did not pin the table made
// afterwards (by jetsink init, by hand): its committer's read at connect
// found none, and the COPY on that connection then named the table as
// configured, looked up along search_path for the connection's life, so
// a table of that name made later earlier on the path took the rows. An
// attempt on a connection opened before the table was found now looks for
// it again, pins it (pinTable) and reads its types: a column that is a
// domain is no type guard's refusal (without the read, the first batch
// was refused, a configuration error). Pinned by a check instead (Run's
// look after a type guard refused a batch, or at the start after the
// committers' first read), the COPY and exactly-once's INSERT went on
// naming the table as configured until a committer read the types again.
func TestTableMadeLaterIsPinned(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		for _, tc := range []struct {
			by     string // what finds the table first: the batch, or a check
			domain bool   // the payload column is a domain over jsonb
		}{{"batch", false}, {"batch", true}, {"check", false}} {
			name := string(mode) + "_" + tc.by
			if tc.domain {
				name += "_domain"
			}
			t.Run(name, func(t *testing.T) {
				ctx := testCtx(t, 60*time.Second)
				pg := testenv.Postgres(t)
				s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = mode; c.Connections = 1; c.CreateTable = false })
				logs := captureLog(t, s, time.Minute)
				admin := pg.Conn(t)
				public, shadow, makeShadow, counts := shadowing(t, ctx, admin, s)
				src, wait := runWarmed(t, ctx, s)
				waitFor(t, ctx, "Run's look at the start", func() bool {
					return strings.Contains(logs.String(), "does not exist (or is not on search_path)")
				})
				ddl := s.DDL()
				if tc.domain {
					domain := pgx.Identifier{"doc_" + strings.ReplaceAll(string(mode), "-", "_")}.Sanitize()
					ddl[0] = strings.Replace(ddl[0], " jsonb", " "+domain, 1)
					ddl = append([]string{"CREATE DOMAIN " + domain + " AS jsonb"}, ddl...)
				}
				execAll(t, ctx, admin, ddl...)
				if tc.by == "check" {
					if _, err := s.Check(ctx); err != nil {
						t.Fatal(err)
					}
				}
				shadowedMidway(t, ctx, s, src, wait, dl, public, shadow, makeShadow, counts)
				if n := s.Stats().ConfigErrors; n != 0 {
					t.Errorf("%d configuration errors; want none (the payload column is a domain over jsonb, which the guards take once read)", n)
				}
			})
		}
	}
}

// A committer whose read of the table's types at connect failed with the
// connection left open (a 42501 here: EXECUTE on row_security_active
// revoked from its role; a statement_timeout alike) noted nothing to look
// for again, and its COPY named the table as configured for the
// connection's life, looked up along search_path: a table of that name
// made later in a schema earlier on the path took at-least-once's rows,
// acked, while Table() said public. Pinned by a check ("check": the
// committer's every read fails, the check pins the table before its own
// read of row_security_active fails), the COPY and exactly-once's type
// guard went on naming the table as configured: pinTable did not write
// them again. Made after the start with no check ("later": the read at
// connect fails once), the table was never pinned at all.
func TestTablePinnedAfterAFailedRead(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		for _, by := range []string{"check", "later"} {
			t.Run(string(mode)+"_"+by, func(t *testing.T) {
				ctx := testCtx(t, 60*time.Second)
				pg := testenv.Postgres(t)
				admin := pg.Conn(t)
				var db string
				if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
					t.Fatal(err)
				}
				// Not a superuser (whom no REVOKE stops); CREATE on the
				// database for the schema named after it (shadowing).
				rc, s, dl := sinkAsRole(t, ctx, admin, pg.URL, mode, "GRANT CREATE, USAGE ON SCHEMA public TO %[1]s",
					"GRANT CREATE ON DATABASE "+pgx.Identifier{db}.Sanitize()+" TO %[1]s")
				logs := captureLog(t, s, time.Minute)
				public, shadow, makeShadow, counts := shadowing(t, ctx, rc, s)
				const rlsFunc = "pg_catalog.row_security_active(oid)"
				execAll(t, ctx, admin, "REVOKE EXECUTE ON FUNCTION "+rlsFunc+" FROM PUBLIC")
				if by == "check" {
					execAll(t, ctx, rc, s.DDL()...)
				}
				src, wait := runWarmed(t, ctx, s)
				if !strings.Contains(logs.String(), "could not read the table's column types") {
					t.Fatalf("the committer's read at connect did not fail: the test shows nothing")
				}
				if by == "check" {
					// Its own read of row_security_active fails, after
					// the pin.
					_, _ = s.Check(ctx)
					if s.Table() != public {
						t.Fatalf("the check did not pin the table: %s, want %s", s.Table(), public)
					}
				} else {
					waitFor(t, ctx, "Run's look at the start", func() bool {
						return strings.Contains(logs.String(), "does not exist (or is not on search_path)")
					})
					execAll(t, ctx, admin, "GRANT EXECUTE ON FUNCTION "+rlsFunc+" TO PUBLIC")
					execAll(t, ctx, rc, s.DDL()...)
				}
				shadowedMidway(t, ctx, s, src, wait, dl, public, shadow, makeShadow, counts)
				if q := *s.copySQL.Load(); !strings.Contains(q, public) {
					t.Errorf("the COPY and its guards do not name %s: %s", public, q)
				}
			})
		}
	}
}

// A read of the types that keeps failing for a reason of its own
// (EXECUTE on row_security_active revoked, the role's statement_timeout,
// a 42703) had the committer read again before every attempt and after
// every commit (pinWritten, which the acks wait for), for the
// connection's life, also once the table was pinned (Run's look pinned
// it at the start): 20 failed reads for 10 batches, with a
// statement_timeout twice the timeout a batch. Pinned, the COPY and its
// guards name the table already (pinTable writes them again): no read
// is made again. The failed reads are counted by their log lines (the
// first at Warn, the others at Debug).
func TestFailingReadNotMadeAgainOncePinned(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			admin := pg.Conn(t)
			// Not a superuser, whom no REVOKE stops.
			rc, s, dl := sinkAsRole(t, ctx, admin, pg.URL, mode, "GRANT CREATE, USAGE ON SCHEMA public TO %[1]s")
			logs := captureLog(t, s, time.Minute)
			s.log = slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
			execAll(t, ctx, rc, s.DDL()...)
			public := pgx.Identifier{"public", s.cfg.Table}.Sanitize()
			execAll(t, ctx, admin, "REVOKE EXECUTE ON FUNCTION pg_catalog.row_security_active(oid) FROM PUBLIC")
			const failed = "could not read the table's column types"
			src := newSource()
			wait := runSink(t, ctx, s, src)
			waitFor(t, ctx, "the table pinned by Run's look", func() bool { return s.Table() == public })
			select {
			case <-s.Warmed(): // the committer's connection is open, its read done
			case <-ctx.Done():
				t.Fatal("the committer did not connect")
			}
			if !strings.Contains(logs.String(), failed) {
				t.Fatal("the committer's read at connect did not fail: the test shows nothing")
			}
			// The first batch may read once more: the read at connect may
			// have failed before the pin.
			rs, ms := rows(1, 11, nil)
			src.push(t, ctx, rs[:1])
			waitFor(t, ctx, "row 1 acked", allAcked(ms[:1]))
			before := strings.Count(logs.String(), failed)
			for i := 1; i < len(rs); i++ {
				src.push(t, ctx, rs[i:i+1])
				waitFor(t, ctx, fmt.Sprintf("row %d acked", i+1), allAcked(ms[i:i+1]))
			}
			if n := strings.Count(logs.String(), failed) - before; n != 0 {
				t.Errorf("%d failed reads of the types for 10 batches, the table pinned (%s); want none", n, s.Table())
			}
			finishClean(t, ctx, src, wait, dl, ms)
		})
	}
}

// Of two reads of the types that overlap, the one that began last is
// kept; the committer of the other one noted that its read had found the
// table (committer.unfound false), though neither the pin nor the COPY came
// from it: when the read kept had run its query before the table was
// made, that committer's COPY named the table as configured for the
// connection's life. readTypes now reports whether the read kept found
// the table. The read that began later and was kept first is stood in
// for by typesStored.
func TestReadTypesNotKeptReportsTheKeptRead(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.CreateTable = false })
	conn, admin := pg.Conn(t), pg.Conn(t)
	read := func() bool {
		t.Helper()
		_, exists, err := s.readTypes(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		return exists
	}
	if read() {
		t.Fatal("a table found before it was made")
	}
	execAll(t, ctx, admin, s.DDL()...)
	// A read that begins after the next one and is kept before it, having
	// run its query before the CREATE: found none.
	s.typesMu.Lock()
	s.typesStored = s.typesGen.Load() + 2
	s.typesMu.Unlock()
	if read() {
		t.Error("a read that was not kept reports the table found, while the read kept found none: its committer would not look again")
	}
	s.typesGen.Add(1) // the read that stood in
	if !read() {
		t.Error("the read kept does not report the table found")
	}
	if public := (pgx.Identifier{"public", s.cfg.Table}).Sanitize(); s.Table() != public || !strings.Contains(*s.copySQL.Load(), public) {
		t.Errorf("the table is %s, want %s, in the COPY too: %s", s.Table(), public, *s.copySQL.Load())
	}
}

// The configured name, unqualified ("table: events"), went through
// search_path in every statement: a table of the same name made while
// jetsink ran in a schema earlier on the path (one named after the role,
// "$user", first by default) took the rows from then on, acked, without a
// word. Now the statements name the table the first connection found, by
// its schema-qualified name: every row goes there.
func TestTableNameKeptWhenShadowedOnSearchPath(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = mode; c.Connections = 2 })
			logs := captureLog(t, s, time.Minute)
			admin := pg.Conn(t)
			public, shadow, makeShadow, counts := shadowing(t, ctx, admin, s)
			src := newSource()
			wait := runSink(t, ctx, s, src)
			rs, ms := rows(1, 20, nil)
			src.push(t, ctx, rs[:10])
			waitFor(t, ctx, "rows 1-10 acked", allAcked(ms[:10]))
			makeShadow()
			var found string
			if err := admin.QueryRow(ctx, "SELECT to_regclass($1)::oid::regclass::text", s.table.Sanitize()).Scan(&found); err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(found, "public.") {
				t.Fatalf("the name finds %s, not the new table: the test shows nothing", found)
			}
			if mode == ExactlyOnce {
				// The stored sequences are read from the table the rows
				// go to, not the shadow: read from the shadow (empty),
				// a stream made again under the table would be taken
				// for a new one, and its events skipped as stored.
				if seq, err := s.StoredSeq(ctx, "S"); err != nil || seq != 10 {
					t.Errorf("StoredSeq %d, %v; want 10, from %s", seq, err, public)
				}
			}
			src.push(t, ctx, rs[10:])
			finishClean(t, ctx, src, wait, dl, ms)
			// A column the shadow has and the mapping does not fill
			// fails every batch there: check must not read the shadow.
			execAll(t, ctx, admin, "ALTER TABLE "+shadow+" ADD COLUMN extra int NOT NULL")
			if probs, err := s.Check(ctx); err != nil {
				t.Error(err)
			} else {
				for _, p := range probs {
					if !p.Warning {
						t.Errorf("check of %s, not the shadow: %v", public, p)
					}
				}
			}
			if inPublic, inShadow := counts(); inPublic != 20 || inShadow != 0 {
				t.Fatalf("%d rows in %s, %d in %s (made later, earlier on search_path); want all 20 in the first", inPublic, public, inShadow, shadow)
			}
			if s.Table() != public {
				t.Errorf("the table is %s, want %s", s.Table(), public)
			}
			// In exactly-once mode New's Init checks the table, and
			// pins it, before the log is captured.
			if mode == AtLeastOnce && !strings.Contains(logs.String(), "by its schema-qualified name") {
				t.Errorf("the name found not logged:\n%s", logs)
			}
		})
	}
}

// jetsink check on its own did not pin the table's name: it read the
// configured name through search_path at each look, and named the table
// as configured ("events"), while run writes the table its first
// connection found. With a table of that name made later in a schema
// earlier on the path (search_path set for the role, or in the URL's
// options), a check on the same sink read the new one, and run, started
// after the check, wrote it, not the table checked. Now check finds the
// table as run does, pins it, and names it schema-qualified: the second
// check reads the first table, and run writes it.
func TestCheckPinsTheTableRunWrites(t *testing.T) {
	for _, via := range []string{"role", "url"} {
		t.Run(via, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			admin := pg.Conn(t)
			url := pg.URL
			execAll(t, ctx, admin, "CREATE SCHEMA home; CREATE SCHEMA shadow")
			const path = "shadow, home"
			switch via {
			case "role":
				var db string
				if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
					t.Fatal(err)
				}
				execAll(t, ctx, admin, "ALTER ROLE CURRENT_USER IN DATABASE "+pgx.Identifier{db}.Sanitize()+" SET search_path = "+path)
			case "url":
				u, err := neturl.Parse(pg.URL)
				if err != nil {
					t.Fatal(err)
				}
				// %20, not +: pgx reads a + in the query as itself.
				opt := strings.ReplaceAll(neturl.QueryEscape("-c search_path="+strings.ReplaceAll(path, " ", "")), "+", "%20")
				u.RawQuery += "&options=" + opt
				url = u.String()
			}
			execAll(t, ctx, admin, "SET search_path = "+path) // as jetsink's sessions have it
			s, dl := newTestSink(t, ctx, url, func(c *Config) { c.CreateTable = false })
			home := pgx.Identifier{"home", s.cfg.Table}.Sanitize()
			shadow := pgx.Identifier{"shadow", s.cfg.Table}.Sanitize()
			// Unlogged: check's warning of it names the table.
			execAll(t, ctx, admin, "CREATE UNLOGGED TABLE "+home+" (stream text, stream_seq int8, payload jsonb)")
			check := func(when string) {
				t.Helper()
				probs, err := s.Check(ctx)
				if err != nil {
					t.Fatalf("check %s: %v", when, err)
				}
				named := false
				for _, p := range probs {
					if !p.Warning {
						t.Errorf("check %s: of %s, not the shadow: %v", when, home, p)
					}
					named = named || p.Kind == ProblemUnlogged && strings.Contains(p.Message, home+" is unlogged")
				}
				if !named {
					t.Errorf("check %s: %v; want %s named as unlogged", when, probs, home)
				}
				if s.Table() != home {
					t.Errorf("check %s: the table is %s; want %s", when, s.Table(), home)
				}
			}
			check("before the shadow")
			// A column the shadow has and the mapping does not fill
			// would fail every batch there: check must not read it.
			execAll(t, ctx, admin, "CREATE TABLE "+shadow+" (LIKE "+home+" INCLUDING ALL, extra int NOT NULL)")
			var finds string
			if err := admin.QueryRow(ctx, "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = to_regclass($1)",
				pgx.Identifier{s.cfg.Table}.Sanitize()).Scan(&finds); err != nil {
				t.Fatal(err)
			}
			if finds != "shadow" {
				t.Fatalf("the name finds %s, not the shadow: the test shows nothing", finds)
			}
			check("after the shadow")
			// Rows that the shadow would take, were they written there.
			execAll(t, ctx, admin, "ALTER TABLE "+shadow+" ALTER COLUMN extra DROP NOT NULL")
			storeClean(t, ctx, s, dl, 10)
			var inHome, inShadow int
			if err := admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+home+"), (SELECT count(*) FROM "+shadow+")").Scan(&inHome, &inShadow); err != nil {
				t.Fatal(err)
			}
			if inHome != 10 || inShadow != 0 {
				t.Fatalf("%d rows in %s (checked), %d in %s; want all 10 in the table checked", inHome, home, inShadow, shadow)
			}
		})
	}
}

// Once check had pinned the table, a drop of it beside a table of the same
// name earlier on search_path was named as the configured name, "t", with
// the fix CREATE TABLE IF NOT EXISTS "t" (...), which, run as printed,
// does nothing (the shadow is "t"), and Init's and StoredSeq's errors, and
// the sink's log lines (table=), named the table as configured too. They
// now name the pinned table, and the fix makes it by that name or has
// jetsink look the name up again.
func TestPinnedTableDroppedBesideAShadow(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	u, err := neturl.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.RawQuery += "&options=" + strings.ReplaceAll(neturl.QueryEscape("-c search_path=shadow,home"), "+", "%20")
	execAll(t, ctx, admin, "CREATE SCHEMA home; CREATE SCHEMA shadow")
	var logs testenv.SyncBuffer
	cfg := DefaultConfig()
	cfg.URL = u.String()
	cfg.Table = uniqueName(t)
	cfg.Mode = ExactlyOnce
	cfg.CreateTable = false
	s, err := New(ctx, cfg, testCols, &recDL{}, slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testWriter{t}), nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	home := pgx.Identifier{"home", cfg.Table}.Sanitize()
	shadow := pgx.Identifier{"shadow", cfg.Table}.Sanitize()
	execAll(t, ctx, admin, "CREATE TABLE "+home+" (stream text NOT NULL, stream_seq int8 NOT NULL, payload jsonb, UNIQUE (stream, stream_seq))")
	if _, err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Table() != home {
		t.Fatalf("check pinned %s; want %s", s.Table(), home)
	}
	execAll(t, ctx, admin, "CREATE TABLE "+shadow+" (LIKE "+home+" INCLUDING ALL); DROP TABLE "+home)
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(probs, func(p Problem) bool { return p.Kind == ProblemTableMissing })
	if i < 0 {
		t.Fatalf("check: %v; want the table missing", probs)
	}
	p := probs[i]
	if !strings.Contains(p.Message, home) || strings.Contains(p.Fix, "IF NOT EXISTS "+pgx.Identifier{cfg.Table}.Sanitize()) ||
		!strings.Contains(p.Fix, "CREATE TABLE IF NOT EXISTS "+home) || !strings.Contains(p.Fix, "it now finds "+shadow) || p.InitMakes() {
		t.Errorf("check names %v (Init makes it: %v); want %s named, made by that name, or looked up again (it now finds %s)",
			p, p.InitMakes(), home, shadow)
	}
	// The pinned table's name in StoredSeq's errors and in the log.
	execAll(t, ctx, admin, "CREATE TABLE "+home+" (stream text, stream_seq text, payload jsonb); INSERT INTO "+home+" VALUES ('S', 'x', null)")
	if _, err := s.StoredSeq(ctx, "S"); err == nil || !strings.Contains(err.Error(), home) {
		t.Errorf("StoredSeq = %v; want an error naming %s", err, home)
	}
	s.log.Info("a line")
	if want := "table=home." + cfg.Table + " "; !strings.Contains(logs.String(), want) {
		t.Errorf("the sink's log lines do not say %s:\n%s", want, logs.String())
	}
	// Init's error, once its check has pinned the table: a table with
	// inheritance children, on which it builds no index.
	cfg.Table += "_i"
	cfg.CreateTable = true
	home = pgx.Identifier{"home", cfg.Table}.Sanitize()
	execAll(t, ctx, admin, "CREATE TABLE "+home+" (stream text NOT NULL, stream_seq int8 NOT NULL, payload jsonb); "+
		"CREATE TABLE "+pgx.Identifier{"home", cfg.Table + "_c"}.Sanitize()+" () INHERITS ("+home+")")
	if s2, err := New(ctx, cfg, testCols, &recDL{}, testLogger(t)); err == nil {
		s2.Close()
		t.Errorf("New made a sink on a table with inheritance children")
	} else if !errors.Is(err, ErrNoKeyIndex) || !strings.Contains(err.Error(), ErrNoKeyIndex.Error()+": "+home+" on") {
		t.Errorf("New = %v; want ErrNoKeyIndex naming %s", err, home)
	}
}

// The sink's log lines spelt a table two ways, table="\"events2\"" before
// it was found on search_path and table="\"public\".\"events2\"" after,
// and processor's table=events a third: a grep for one missed the
// others. They now spell it as PostgreSQL's quote_ident would, part by
// part: events2 before, public.events2 after, the line between saying
// which configured name the one found is for.
func TestLogLinesSpellTheTableOneWay(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	var logs testenv.SyncBuffer
	cfg := DefaultConfig()
	cfg.URL = pg.URL
	cfg.Table = uniqueName(t)
	cfg.CreateTable = false
	cfg.Retry = RetryConfig{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}
	s, err := New(ctx, cfg, testCols, &recDL{}, slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testWriter{t}), nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if got := s.LogName(); got != cfg.Table {
		t.Fatalf("LogName() = %q before the table is found; want %q", got, cfg.Table)
	}
	src := newSource()
	wait := runSink(t, ctx, s, src)
	rs, ms := rows(1, 10, nil)
	src.push(t, ctx, rs)
	waitFor(t, ctx, "a batch refused for the missing table", func() bool { return s.Stats().ConfigErrors >= 1 })
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	// Found (pinned) by the committer's retry, as in production, which
	// calls no check: its connect reads the types, and when that read
	// finds no table (Init's CREATE came after it, before the COPY) the
	// read after the commit does (at-least-once's Init checks nothing).
	finishClean(t, ctx, src, wait, &recDL{}, ms)

	before, after := "table="+cfg.Table+" ", "table=public."+cfg.Table+" "
	var nBefore, nAfter int
	for line := range strings.Lines(logs.String()) {
		switch {
		case strings.Contains(line, before):
			nBefore++
		case strings.Contains(line, after):
			nAfter++
		default:
			t.Errorf("a line of the sink's with neither %q nor %q: %q", before, after, line)
		}
		if strings.Contains(line, "found the table on search_path") && !strings.Contains(line, after+"db=") ||
			strings.Contains(line, "found the table on search_path") && !strings.Contains(line, "configured="+cfg.Table+"\n") {
			t.Errorf("the line that the table was found does not tie %s to %s: %q", after, before, line)
		}
	}
	if nBefore == 0 || nAfter == 0 {
		t.Errorf("%d lines say %q and %d %q; want both", nBefore, before, nAfter, after)
	}
	if got := s.LogName(); got != "public."+cfg.Table {
		t.Errorf("LogName() = %q once the table is found; want public.%s", got, cfg.Table)
	}
}

// logName quotes a part of a table's name where, and only where,
// PostgreSQL's quote_ident does: upper case, characters other than
// lower-case ASCII letters, digits and '_', a leading digit, and the
// keywords that are not unreserved (every one the server lists).
func TestLogNameQuotesAsQuoteIdent(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := testenv.Postgres(t).Conn(t)
	names := []string{"events", "Events", "my table", `a"b`, "a.b", "_x", "x1", "1x", "x$y", "événements", "abs", "name", "key"}
	rs, err := c.Query(ctx, "SELECT word FROM pg_get_keywords()")
	if err != nil {
		t.Fatal(err)
	}
	words, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range append(names, words...) {
		var want string
		if err := c.QueryRow(ctx, "SELECT quote_ident($1)", n).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if got := logName(pgx.Identifier{n}); got != want {
			t.Errorf("logName(%q) = %s; quote_ident says %s (quotedKeywords is PostgreSQL 15's list, and this test runs against 15: a later server quotes other words, which the log leaves as they are)", n, got, want)
		}
	}
	// And the reverse: a stray word in quotedKeywords (a typo, an
	// unreserved keyword) would quote a name the server leaves alone, and
	// no name above need show it.
	rs, err = c.Query(ctx, "SELECT word FROM pg_get_keywords() WHERE catcode <> 'U'")
	if err != nil {
		t.Fatal(err)
	}
	quoted, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for w := range quotedKeywords {
		if !slices.Contains(quoted, w) {
			t.Errorf("quotedKeywords has %q, which quote_ident does not quote (not a keyword of this server's, or an unreserved one): take it out", w)
		}
	}
	for cfg, want := range map[string]string{
		"events":             "events",
		"public.events":      "public.events",
		`"My Schema"."t.1"`:  `"My Schema"."t.1"`,
		`Events`:             `"Events"`,
		`app."order"`:        `app."order"`,
		`"app"."user_event"`: `app.user_event`,
	} {
		id, err := ParseTable(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := logName(id); got != want {
			t.Errorf("postgres.table %s: logName = %s; want %s", cfg, got, want)
		}
	}
}

// shadowing names s's table in public and in a schema named after the
// connected role ("$user", first on search_path by default), and returns
// makeShadow, which makes that schema and a table like the first in it,
// and counts, which counts the rows of each.
func shadowing(t *testing.T, ctx context.Context, admin *pgx.Conn, s *Sink) (public, shadow string, makeShadow func(), counts func() (inPublic, inShadow int)) {
	t.Helper()
	var role string
	if err := admin.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	public = pgx.Identifier{"public", s.cfg.Table}.Sanitize()
	shadow = pgx.Identifier{role, s.cfg.Table}.Sanitize()
	makeShadow = func() {
		execAll(t, ctx, admin, "CREATE SCHEMA "+pgx.Identifier{role}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{role}.Sanitize()+
			"; CREATE TABLE "+shadow+" (LIKE "+public+" INCLUDING ALL)")
	}
	counts = func() (int, int) {
		var inPublic, inShadow int
		if err := admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+public+"), (SELECT count(*) FROM "+shadow+")").Scan(&inPublic, &inShadow); err != nil {
			t.Fatal(err)
		}
		return inPublic, inShadow
	}
	return public, shadow, makeShadow, counts
}

// shadowedMidway runs 20 rows through s, the shadow (see shadowing) made
// after the first 10 are acked, and finishes the run (finishClean): every
// row must be in public, and s's table be public.
func shadowedMidway(t *testing.T, ctx context.Context, s *Sink, src source, wait func() error, dl *recDL,
	public, shadow string, makeShadow func(), counts func() (int, int)) {
	t.Helper()
	rs, ms := rows(1, 20, nil)
	src.push(t, ctx, rs[:10])
	waitFor(t, ctx, "rows 1-10 acked", allAcked(ms[:10]))
	makeShadow()
	src.push(t, ctx, rs[10:])
	finishClean(t, ctx, src, wait, dl, ms)
	if inPublic, inShadow := counts(); inPublic != 20 || inShadow != 0 {
		t.Errorf("%d rows in %s, %d in %s (made later, earlier on search_path); want all 20 in the first", inPublic, public, inShadow, shadow)
	}
	if s.Table() != public {
		t.Errorf("the table is %s, want %s", s.Table(), public)
	}
}

// sinkAsRole makes a role that is not a superuser (whom no REVOKE stops),
// with grants (see newRole), and a sink of one connection in mode that
// connects as it and makes no table, and a connection of its own as the
// role, closed at the test's end.
func sinkAsRole(t *testing.T, ctx context.Context, admin *pgx.Conn, pgURL string, mode Mode, grants ...string) (*pgx.Conn, *Sink, *recDL) {
	t.Helper()
	_, roleURL := newRole(t, ctx, admin, pgURL, grants...)
	rc, err := pgx.Connect(ctx, roleURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rc.Close(context.Background()) })
	s, dl := newTestSink(t, ctx, roleURL, func(c *Config) { c.Mode = mode; c.Connections = 1; c.CreateTable = false })
	return rc, s, dl
}

// runWarmed runs s on a new source (runSink) and waits until its
// committer's connection is open and its read of the types done.
func runWarmed(t *testing.T, ctx context.Context, s *Sink) (source, func() error) {
	t.Helper()
	src := newSource()
	wait := runSink(t, ctx, s, src)
	select {
	case <-s.Warmed():
	case <-ctx.Done():
		t.Fatal("the committer did not connect")
	}
	return src, wait
}

// A CHECK's cast that fails for some rows (class 22, no column named): in
// at-least-once mode held as a table's fault would be until other rows
// commit, then each such row is dead-lettered alone with its own SQLSTATE,
// code data, and the next (same expression, same SQLSTATE: constraintKey)
// needs no try of its own: no more COPYs than exactly-once's, whose INSERT
// names no column and dead-letters such a row at once.
func TestTableExpressionRefusingSomeRowsDeadLettersThem(t *testing.T) {
	copies := map[Mode]uint64{}
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			pg := testenv.Postgres(t)
			s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Connections = 1; c.Mode = mode })
			admin := pg.Conn(t)
			if _, err := admin.Exec(ctx, "ALTER TABLE "+s.table.Sanitize()+" ADD CONSTRAINT n_positive CHECK ((payload->>'n')::int > 0)"); err != nil {
				t.Fatal(err)
			}
			src := newSource()
			wait := runSink(t, ctx, s, src)
			t.Cleanup(src.close)
			rs, ms := rows(1, 30, func(seq int) string {
				if seq%3 == 0 {
					return `{"n":"x"}`
				}
				return fmt.Sprintf(`{"n":%d}`, seq)
			})
			src.push(t, ctx, rs)
			waitFor(t, ctx, "rows 1-10 settled", allSettled(ms))
			src.close()
			if err := wait(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			letters, seqs := dl.letters()
			copies[mode] = s.Stats().BisectCopies
			var want []uint64
			for seq := uint64(3); seq <= 30; seq += 3 {
				want = append(want, seq)
			}
			if !slices.Equal(seqs, want) {
				t.Fatalf("dead letters %+v (rows %v), want rows %v", letters, seqs, want)
			}
			for _, l := range letters {
				if l.SQLState != "22P02" || l.Code != pipeline.CodeData {
					t.Errorf("letter %+v, want SQLSTATE 22P02, code data", l)
				}
			}
			if n := count(t, ctx, admin, s.cfg.Table); n != 20 {
				t.Errorf("%d rows stored, want 20", n)
			}
		})
	}
	if copies[AtLeastOnce] > copies[ExactlyOnce] {
		t.Errorf("bisection COPYs: %d in at-least-once mode, %d in exactly-once: a refused row after the first took a try of its own",
			copies[AtLeastOnce], copies[ExactlyOnce])
	}
}

package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v3"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

func TestDDL(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	cfg := DefaultConfig()
	cfg.Table = `app."Events"`
	cfg.Mode = ExactlyOnce
	s, err := New(ctx, cfg, testCols, &recDL{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := s.DDL()
	want := []string{
		"CREATE TABLE IF NOT EXISTS \"app\".\"Events\" (\n\t\"stream\" text NOT NULL,\n\t\"stream_seq\" bigint NOT NULL,\n\t\"payload\" jsonb\n)",
		`CREATE UNIQUE INDEX IF NOT EXISTS "Events_stream_seq_key" ON "app"."Events" ("stream", "stream_seq")`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("DDL:\n%q\nwant\n%q", got, want)
	}
}

func TestInitAndCheck(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.CreateTable = false; c.Mode = ExactlyOnce })
	tbl := s.table.Sanitize()
	kinds := func() []ProblemKind {
		t.Helper()
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		var k []ProblemKind
		for _, p := range probs {
			if p.Message == "" || p.Fix == "" {
				t.Errorf("problem without message or fix: %+v", p)
			}
			k = append(k, p.Kind)
		}
		return k
	}
	if k := kinds(); !slices.Equal(k, []ProblemKind{ProblemTableMissing}) {
		t.Fatalf("missing table: %v", k)
	}
	if probs, _ := s.Check(ctx); !probs[0].InitMakes() {
		t.Fatalf("a missing table in a schema jetsink may create in: InitMakes() false (%s)", probs[0])
	}
	exec := func(q string) {
		t.Helper()
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("CREATE TABLE " + tbl + " (stream text, payload text, extra int NOT NULL)")
	k := kinds()
	slices.Sort(k)
	want := []ProblemKind{ProblemColumnMissing, ProblemNoUniqueIndex, ProblemNotNull, ProblemTypeMismatch}
	if !slices.Equal(k, want) {
		t.Fatalf("wrong table: %v, want %v", k, want)
	}
	exec("DROP TABLE " + tbl)
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx); err != nil {
		t.Fatalf("Init twice: %v", err)
	}
	if k := kinds(); len(k) != 0 {
		t.Fatalf("after Init: %v", k)
	}
	exec("ALTER TABLE " + tbl + " ALTER COLUMN payload DROP NOT NULL, ALTER COLUMN stream SET NOT NULL")
	exec("ALTER TABLE " + tbl + " ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY, ADD COLUMN at timestamptz NOT NULL DEFAULT now()")
	if k := kinds(); len(k) != 0 {
		t.Fatalf("identity and default columns: %v", k)
	}
	exec(`CREATE FUNCTION keep_row() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'`)
	exec("CREATE TRIGGER after_ins AFTER INSERT ON " + tbl + " FOR EACH ROW EXECUTE FUNCTION keep_row()")
	exec("CREATE TRIGGER before_stmt BEFORE INSERT ON " + tbl + " FOR EACH STATEMENT EXECUTE FUNCTION keep_row()")
	exec("CREATE TRIGGER before_upd BEFORE UPDATE ON " + tbl + " FOR EACH ROW EXECUTE FUNCTION keep_row()")
	exec("CREATE TRIGGER off BEFORE INSERT ON " + tbl + " FOR EACH ROW EXECUTE FUNCTION keep_row()")
	exec("ALTER TABLE " + tbl + " DISABLE TRIGGER off")
	if k := kinds(); len(k) != 0 {
		t.Fatalf("triggers that cannot drop an inserted row: %v", k)
	}
	exec("CREATE TRIGGER b_ins BEFORE INSERT OR UPDATE ON " + tbl + " FOR EACH ROW EXECUTE FUNCTION keep_row()")
	exec("CREATE TRIGGER a_always BEFORE INSERT ON " + tbl + " FOR EACH ROW EXECUTE FUNCTION keep_row()")
	exec("ALTER TABLE " + tbl + " ENABLE ALWAYS TRIGGER a_always")
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) != 1 || probs[0].Kind != ProblemRowTrigger || !probs[0].Warning ||
		!strings.Contains(probs[0].Message, "(a_always, b_ins)") {
		t.Fatalf("BEFORE INSERT row triggers: %+v, want one row_trigger warning naming a_always and b_ins", probs)
	}
	exec("DROP TRIGGER b_ins ON " + tbl + "; DROP TRIGGER a_always ON " + tbl)
	exec("CREATE RULE off_ins AS ON INSERT TO " + tbl + " DO INSTEAD NOTHING")
	exec("ALTER TABLE " + tbl + " DISABLE RULE off_ins")
	if k := kinds(); len(k) != 0 {
		t.Fatalf("a disabled INSERT rule leaves exactly-once's INSERT alone: %v", k)
	}
	exec("CREATE RULE on_upd AS ON UPDATE TO " + tbl + " DO INSTEAD NOTHING")
	exec("ALTER TABLE " + tbl + " DISABLE RULE on_upd") // still refused by INSERT ... ON CONFLICT
	exec("CREATE RULE ins_nothing AS ON INSERT TO " + tbl + " DO INSTEAD NOTHING")
	logTbl := pgx.Identifier{s.cfg.Table + "_log"}.Sanitize()
	exec("CREATE TABLE " + logTbl + " (stream text)")
	exec("CREATE RULE ins_also AS ON INSERT TO " + tbl + " DO ALSO INSERT INTO " + logTbl + " VALUES (NEW.stream)")
	if probs, err = s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if len(probs) != 1 || probs[0].Kind != ProblemRule || probs[0].Warning ||
		!strings.Contains(probs[0].Message, "(ins_also, ins_nothing, on_upd)") {
		t.Fatalf("rules in exactly-once mode: %+v, want one rule problem naming ins_also, ins_nothing and on_upd", probs)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

// INSERT rules in at-least-once mode: COPY does not run them, so a rule
// routing rows elsewhere (DO INSTEAD) or copying them (DO ALSO) did nothing
// for jetsink's rows, and check said nothing. It warns now, of enabled
// INSERT rules only; the rows are stored in the table as they are.
func TestCheckWarnsOfInsertRulesAtLeastOnce(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	s, dl := newTestSink(t, ctx, pg.URL, nil)
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	tbl := s.table.Sanitize()
	logTbl := pgx.Identifier{s.cfg.Table + "_log"}.Sanitize()
	for _, q := range []string{
		"CREATE TABLE " + logTbl + " (stream text)",
		"CREATE RULE off_ins AS ON INSERT TO " + tbl + " DO INSTEAD NOTHING",
		"ALTER TABLE " + tbl + " DISABLE RULE off_ins",
		"CREATE RULE on_upd AS ON UPDATE TO " + tbl + " DO INSTEAD NOTHING",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if probs, err := s.Check(ctx); err != nil || len(probs) != 0 {
		t.Fatalf("a disabled INSERT rule and an UPDATE rule, which COPY never meets: %v, %v", probs, err)
	}
	for _, q := range []string{
		"CREATE RULE ins_nothing AS ON INSERT TO " + tbl + " WHERE NEW.stream_seq = 2 DO INSTEAD NOTHING",
		"CREATE RULE ins_also AS ON INSERT TO " + tbl + " DO ALSO INSERT INTO " + logTbl + " VALUES (NEW.stream)",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) != 1 || probs[0].Kind != ProblemRule || !probs[0].Warning || !strings.Contains(probs[0].Message, "(ins_also, ins_nothing)") {
		t.Fatalf("INSERT rules in at-least-once mode: %+v, want one rule warning naming ins_also and ins_nothing", probs)
	}
	// What the warning says: the rules do nothing for COPY's rows.
	storeClean(t, ctx, s, dl, 3)
	if n, logged := count(t, ctx, admin, s.cfg.Table), count(t, ctx, admin, s.cfg.Table+"_log"); n != 3 || logged != 0 {
		t.Fatalf("%d rows in the table, %d in the rule's; want 3 and 0 (COPY runs no rule)", n, logged)
	}
}

// A BEFORE INSERT row trigger on a partition, not on the partitioned
// table: check read the table's triggers only, and said nothing of one
// that returns NULL for some rows, which dead-lettered whole batches
// (code row_count). Check names it with its partition, in both modes; a
// trigger made on the table is named once, not once more for each
// partition's clone; a disabled one not at all. With postgres.table the
// partition itself, the table's trigger's clone there is what fires: it
// is named (it was not, every clone dropped as named already).
func TestCheckWarnsOfAPartitionsTrigger(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	tbl := uniqueName(t)
	for _, q := range []string{
		"CREATE TABLE " + tbl + " (stream text, stream_seq int8, payload jsonb, UNIQUE (stream, stream_seq)) PARTITION BY LIST (stream)",
		"CREATE TABLE " + tbl + "_a PARTITION OF " + tbl + " FOR VALUES IN ('a')",
		"CREATE TABLE " + tbl + "_d PARTITION OF " + tbl + " DEFAULT",
		"CREATE FUNCTION " + tbl + "_f() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN IF NEW.stream_seq % 10 = 0 THEN RETURN NULL; END IF; RETURN NEW; END'",
		"CREATE TRIGGER norm BEFORE INSERT ON " + tbl + " FOR EACH ROW EXECUTE FUNCTION " + tbl + "_f()",
		"CREATE TRIGGER skip BEFORE INSERT ON " + tbl + "_d FOR EACH ROW EXECUTE FUNCTION " + tbl + "_f()",
		"CREATE TRIGGER off BEFORE INSERT ON " + tbl + "_a FOR EACH ROW EXECUTE FUNCTION " + tbl + "_f()",
		"ALTER TABLE " + tbl + "_a DISABLE TRIGGER off",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, tc := range []struct{ name, table, want string }{
		{"table", tbl, `(norm, skip (on partition "public"."` + tbl + `_d"))`},
		// postgres.table a partition, written straight into: the
		// parent's trigger fires there through its clone, which is the
		// partition's (its parent trigger is outside the tree checked).
		{"partition", tbl + "_d", "(norm, skip)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
				s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Table, c.Mode, c.CreateTable = tc.table, mode, false })
				probs, err := s.Check(ctx)
				if err != nil {
					t.Fatal(err)
				}
				found := problemsOf(probs, ProblemRowTrigger)
				if len(found) != 1 || !found[0].Warning || !strings.Contains(found[0].Message, tc.want) {
					t.Errorf("%s: row triggers %v, want one warning naming %s", mode, found, tc.want)
				}
			}
		})
	}
}

// Names that differ in case alone: jetsink quotes names, so a mapping's
// column "Dev" is not the table's dev, nor postgres.table Events the
// table events. Check said to ADD COLUMN "Dev" (a second column nobody
// reads), and that the table does not exist, which init (and run's
// create_table) then made beside the one meant. Check now names the one
// there and what to write, and Init refuses to make the table.
func TestCheckNamesThatDifferInCase(t *testing.T) {
	t.Run("column", func(t *testing.T) {
		probs := checkTableOf(t, "dev text", pipeline.Column{Name: "Dev", From: "json:dev", Type: pipeline.TypeText})
		if len(probs) != 1 || probs[0].Kind != ProblemColumnMissing || probs[0].Fix != "write name: dev for this column in postgres.columns" ||
			!strings.Contains(probs[0].Message, `a column "dev" does: names in postgres.columns are case-sensitive`) {
			t.Fatalf("problems %v, want one column_missing naming dev", probs)
		}
	})
	// Two columns differ from the mapping in case alone: which is meant is
	// the operator's to say, and both are named (only "Dev" was).
	t.Run("two columns", func(t *testing.T) {
		probs := checkTableOf(t, `"Dev" text, dev text`, pipeline.Column{Name: "DEV", From: "json:dev", Type: pipeline.TypeText})
		if len(probs) != 1 || probs[0].Kind != ProblemColumnMissing ||
			probs[0].Fix != "write name: Dev or name: dev for this column in postgres.columns, whichever is meant" ||
			!strings.Contains(probs[0].Message, `columns "Dev", "dev" do: names in postgres.columns are case-sensitive`) {
			t.Fatalf("problems %v, want one column_missing naming Dev and dev", probs)
		}
	})
	// Two mappings differ from one column in case alone: each was told to
	// write name: dev, and doing both lists dev twice, which New refuses.
	t.Run("two mappings", func(t *testing.T) {
		probs := checkTableOf(t, "dev text", pipeline.Column{Name: "DEV", From: "json:dev", Type: pipeline.TypeText},
			pipeline.Column{Name: "Dev", From: "json:dev2", Type: pipeline.TypeText})
		if len(probs) != 2 {
			t.Fatalf("problems %v, want two column_missing", probs)
		}
		for _, p := range probs {
			if p.Kind != ProblemColumnMissing || !strings.HasPrefix(p.Fix, "write name: dev for the one of DEV, Dev meant, and remove the others") ||
				!strings.Contains(p.Message, "postgres.columns maps DEV, Dev, all missing, and a column can be listed once") {
				t.Errorf("problem %v, want column_missing saying one of DEV, Dev can be dev", p)
			}
		}
	})
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	tbl := uniqueName(t)
	schema := tbl + "_s"
	for _, q := range []string{"CREATE TABLE " + tbl + " (stream text, stream_seq int8, payload jsonb)",
		"CREATE SCHEMA " + schema, "CREATE TABLE " + schema + ".ev (stream text, stream_seq int8, payload jsonb)"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	upper := strings.ToUpper(tbl[:1]) + tbl[1:]
	for _, tc := range []struct{ table, write string }{
		{upper, tbl},                                      // on search_path
		{"PUBLIC." + upper, "public." + tbl},              // in the schema named, itself in another case
		{strings.ToUpper(schema) + ".Ev", schema + ".ev"}, // in a schema off search_path
	} {
		t.Run(tc.table, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.URL, cfg.Table = pg.URL, tc.table
			s, err := New(ctx, cfg, testCols, &recDL{}, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			probs, err := s.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(probs) != 1 || probs[0].Kind != ProblemTableMissing || probs[0].InitMakes() ||
				probs[0].Fix != "write postgres.table: "+tc.write || !strings.Contains(probs[0].Message, "case-sensitive") {
				t.Fatalf("problems %v, want one table_missing, not one init makes, saying to write %s", probs, tc.write)
			}
			if err := s.Init(ctx); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "write postgres.table: "+tc.write) {
				t.Fatalf("Init: %v, want ErrInvalidConfig saying to write %s", err, tc.write)
			}
			cfg.CreateTable = true // run's create_table: New runs Init
			if s, err := New(ctx, cfg, testCols, &recDL{}, testLogger(t)); !errors.Is(err, ErrInvalidConfig) {
				if err == nil {
					s.Close()
				}
				t.Fatalf("New with create_table: %v, want ErrInvalidConfig", err)
			}
			name, err := ParseTable(tc.table)
			if err != nil {
				t.Fatal(err)
			}
			var made bool
			if err := admin.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name.Sanitize()).Scan(&made); err != nil || made {
				t.Fatalf("a table %s was made (%v)", tc.table, err)
			}
		})
	}
}

// Relations that differ from postgres.table in case alone and are not
// the table meant. (a) An unrelated view "Tbl" in a legacy schema later
// on search_path: check's fix said to write postgres.table: Tbl (the
// view), and Init refused to make tbl in public beside nothing. A table
// "Tbl" there is named as a note, and Init makes tbl in public, where
// the name says. (b) postgres.table naming a materialized view: Init said
// it did not exist, "but" it did, case-sensitive (the view itself); it
// now says it is not a table. (c) A twin with a dot in its name: the fix
// said write postgres.table: "a.b", which YAML reads as a.b, schema a.
// (d) A table "Tbl" in the legacy schema when jetsink's role may not
// create in the first (PostgreSQL 15's public): the fix said only to
// GRANT CREATE, the twin's "write postgres.table: Tbl" lost.
func TestCaseTwinsThatAreNotTheTable(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	tbl := uniqueName(t)
	legacy := tbl + "_legacy"
	upper := strings.ToUpper(tbl[:1]) + tbl[1:]
	for _, q := range []string{
		"CREATE SCHEMA " + legacy,
		`CREATE VIEW ` + legacy + `."` + upper + `_v" AS SELECT 1 AS x`,
		`CREATE TABLE ` + legacy + `."` + upper + `_t" (stream text, stream_seq int8, payload jsonb)`,
		"CREATE MATERIALIZED VIEW " + tbl + "_mv AS SELECT 'a'::text AS stream, 1::int8 AS stream_seq, '{}'::jsonb AS payload",
		`CREATE TABLE "` + tbl + `.Dot" (stream text, stream_seq int8, payload jsonb)`,
		`CREATE TABLE ` + legacy + `."` + upper + `_g" (stream text, stream_seq int8, payload jsonb)`,
		"CREATE SCHEMA " + tbl + "_a",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+legacy+", "+tbl+"_a CASCADE") })
	dbURL := withSearchPath(t, pg.URL, "public,"+legacy)
	newSink := func(t *testing.T, table string) *Sink {
		t.Helper()
		cfg := DefaultConfig()
		cfg.URL, cfg.Table = dbURL, table
		s, err := New(ctx, cfg, testCols, &recDL{}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	missing := func(t *testing.T, s *Sink) Problem {
		t.Helper()
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := problemsOf(probs, ProblemTableMissing)
		if len(found) != 1 {
			t.Fatalf("problems %v, want one table_missing", probs)
		}
		return found[0]
	}
	made := func(t *testing.T, table string) {
		t.Helper()
		var ok bool
		if err := admin.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", "public."+table).Scan(&ok); err != nil || !ok {
			t.Fatalf("public.%s not made (%v)", table, err)
		}
	}
	t.Run("view elsewhere", func(t *testing.T) {
		s := newSink(t, tbl+"_v")
		if p := missing(t, s); !p.InitMakes() || strings.Contains(p.String(), upper) {
			t.Fatalf("%s: want one init makes, the view not named", p)
		}
		if err := s.Init(ctx); err != nil {
			t.Fatalf("Init: %v", err)
		}
		made(t, tbl+"_v")
	})
	t.Run("table elsewhere", func(t *testing.T) {
		s := newSink(t, tbl+"_t")
		p := missing(t, s)
		if !p.InitMakes() || !strings.Contains(p.Message, `"`+legacy+`"."`+upper+`_t", in another schema, differs in case alone`) ||
			!strings.HasSuffix(p.Fix, "write postgres.table: "+upper+"_t") {
			t.Fatalf("%s: want one init makes, naming the table elsewhere as a note", p)
		}
		// run's create_table runs no check: Init says it at Warn.
		logs := captureLog(t, s, time.Minute)
		if err := s.Init(ctx); err != nil {
			t.Fatalf("Init: %v", err)
		}
		made(t, tbl+"_t")
		if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "write postgres.table: "+upper+"_t") ||
			!strings.Contains(l, `other="`+legacy+`.\"`+upper+`_t\""`) {
			t.Fatalf("Init logged %q, want a warning naming the table elsewhere and what to write for it", l)
		}
	})
	t.Run("table elsewhere no create", func(t *testing.T) {
		_, roleURL := newRole(t, ctx, admin, pg.URL, "GRANT USAGE ON SCHEMA "+tbl+"_a, "+legacy+" TO %[1]s")
		cfg := DefaultConfig()
		cfg.URL, cfg.Table = withSearchPath(t, roleURL, tbl+"_a,"+legacy), tbl+"_g"
		s, err := New(ctx, cfg, testCols, &recDL{}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		p := missing(t, s)
		a := `"` + tbl + `_a"`
		if p.InitMakes() || !strings.Contains(p.Message, "may not create tables in schema "+a) ||
			!strings.Contains(p.Message, `"`+legacy+`"."`+upper+`_g", in another schema, differs in case alone`) ||
			!strings.Contains(p.Fix, "write postgres.table: "+upper+"_g; else GRANT CREATE ON SCHEMA "+a) {
			t.Fatalf("%s: want one init cannot, naming the table elsewhere and what to write for it, else the grant", p)
		}
	})
	t.Run("materialized view", func(t *testing.T) {
		s := newSink(t, tbl+"_mv")
		err := s.Init(ctx)
		if !errors.Is(err, ErrInvalidConfig) || strings.Contains(err.Error(), "case-sensitive") ||
			!strings.Contains(err.Error(), "is not a table (pg_class.relkind m)") {
			t.Fatalf("Init: %v, want ErrInvalidConfig saying it is not a table", err)
		}
	})
	t.Run("dot", func(t *testing.T) {
		s := newSink(t, `"`+tbl+`.dot"`)
		p := missing(t, s)
		want := `'"` + tbl + `.Dot"'`
		if p.InitMakes() || p.Fix != "write postgres.table: "+want {
			t.Fatalf("%s: want one init cannot, fix write postgres.table: %s", p, want)
		}
		// Pasted into the configuration, it reads back as the table.
		var cfg struct {
			Table string `yaml:"table"`
		}
		if err := yaml.Unmarshal([]byte("table: "+want), &cfg); err != nil {
			t.Fatal(err)
		}
		if name, err := ParseTable(cfg.Table); err != nil || !slices.Equal(name, pgx.Identifier{tbl + ".Dot"}) {
			t.Fatalf("postgres.table: %s reads back as %v (%v), want %s.Dot", want, name, err, tbl)
		}
	})
}

// A name in a fix, written as a YAML value, reads back as the name. One
// with a line break or a control character was single-quoted: YAML folds
// a break into a space there, and refuses a control character.
func TestYAMLScalarReadsBack(t *testing.T) {
	for _, v := range []string{"events", "a.b", `"a.b"`, "null", "1st", "it's", "é", "tab\there", " lead and trail ",
		"line\nbreak", "cr\rlf\r\n", "nul\x00", "bell\a", "del\x7f", "nel\u0085", "ls\u2028ps\u2029", "bom\ufeff", `back\slash\n`, "esc\x1b"} {
		var got struct {
			Name string `yaml:"name"`
		}
		doc := "name: " + yamlScalar(v) + "\n"
		if err := yaml.Unmarshal([]byte(doc), &got); err != nil || got.Name != v {
			t.Errorf("%q written as %q reads back as %q (%v)", v, doc, got.Name, err)
		}
	}
}

// A DEFERRABLE unique or primary key constraint on (stream, stream_seq)
// cannot be exactly-once's ON CONFLICT arbiter (SQLSTATE 55000), not even
// beside Init's non-deferrable index: Check reports it, and its fix, run,
// leaves a table that Check passes and ON CONFLICT works on.
func TestCheckDeferrableKeyConstraint(t *testing.T) {
	for _, def := range []string{
		"CONSTRAINT key UNIQUE (stream, stream_seq) DEFERRABLE",
		"PRIMARY KEY (stream_seq, stream) DEFERRABLE INITIALLY DEFERRED",
	} {
		t.Run(strings.Fields(def)[0], func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			pg := testenv.Postgres(t)
			admin := pg.Conn(t)
			s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.CreateTable = false; c.Mode = ExactlyOnce })
			tbl := s.table.Sanitize()
			exec := func(q string) error {
				_, err := admin.Exec(ctx, q)
				return err
			}
			if err := exec("CREATE TABLE " + tbl + " (stream text NOT NULL, stream_seq bigint NOT NULL, payload jsonb, " + def + ")"); err != nil {
				t.Fatal(err)
			}
			insert := "INSERT INTO " + tbl + " VALUES ('S', 1, '{}') ON CONFLICT (stream, stream_seq) DO NOTHING"
			deferrable := func(when string) Problem {
				t.Helper()
				probs, err := s.Check(ctx)
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				if len(probs) != 1 || probs[0].Kind != ProblemDeferrableUnique || probs[0].Warning ||
					!strings.Contains(probs[0].Message, "is DEFERRABLE, and must not be") {
					t.Fatalf("%s: problems %+v, want one %s problem saying the constraint must not be DEFERRABLE",
						when, probs, ProblemDeferrableUnique)
				}
				var pgErr *pgconn.PgError
				if err := exec(insert); !errors.As(err, &pgErr) || pgErr.Code != "55000" {
					t.Fatalf("%s: INSERT ... ON CONFLICT = %v, want SQLSTATE 55000 (the server refuses the arbiter)", when, err)
				}
				return probs[0]
			}
			deferrable("deferrable constraint")
			// Init makes its index, which does not help: it says so.
			if err := s.Init(ctx); !errors.Is(err, ErrNoKeyIndex) || !strings.Contains(err.Error(), "DEFERRABLE") {
				t.Fatalf("Init = %v, want ErrNoKeyIndex saying the constraint is DEFERRABLE", err)
			}
			p := deferrable("after Init")
			if err := exec(p.Fix); err != nil {
				t.Fatalf("the fix %q: %v", p.Fix, err)
			}
			if probs, err := s.Check(ctx); err != nil || len(probs) != 0 {
				t.Fatalf("after the fix %q: problems %+v, %v", p.Fix, probs, err)
			}
			for range 2 {
				if err := exec(insert); err != nil {
					t.Fatalf("INSERT ... ON CONFLICT after the fix: %v", err)
				}
			}
			if n := count(t, ctx, admin, s.cfg.Table); n != 1 {
				t.Fatalf("%d rows, want 1", n)
			}
		})
	}
}

// In at-least-once mode a unique index on columns jetsink writes turns
// every redelivered event into a dead letter: check warns of it, also
// through an expression, and not of an index on a column jetsink leaves to
// a default or on one that differs per delivery.
func TestCheckWarnsOfAUniqueKeyInAtLeastOnceMode(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	cfg := DefaultConfig()
	cfg.URL, cfg.Table, cfg.Mode = pg.URL, uniqueName(t), AtLeastOnce
	cols := append(slices.Clone(testCols), pipeline.Column{Name: "received_at", From: "meta:received_at", Type: pipeline.TypeTimestamptz})
	s, err := New(ctx, cfg, cols, &recDL{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	tbl := s.table.Sanitize()
	exec := func(q string) {
		t.Helper()
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	check := func() []Problem {
		t.Helper()
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return probs
	}
	if p := check(); len(p) != 0 {
		t.Fatalf("after Init: %+v", p)
	}
	exec("ALTER TABLE " + tbl + " ADD COLUMN id bigserial PRIMARY KEY")                       // jetsink leaves it to its default
	exec("CREATE UNIQUE INDEX id_seq_key ON " + tbl + " (id, stream_seq)")                    // and with a column jetsink writes
	exec("CREATE UNIQUE INDEX id_expr_key ON " + tbl + " ((id + stream_seq))")                // through an expression
	exec("CREATE UNIQUE INDEX delivery_key ON " + tbl + " (stream, stream_seq, received_at)") // differs per delivery
	if p := check(); len(p) != 0 {
		t.Fatalf("unique indexes a redelivered row cannot fail: %+v", p)
	}
	want := func(what, name string) {
		t.Helper()
		p := check()
		if len(p) != 1 || p[0].Kind != ProblemUniqueKey || !p[0].Warning || !strings.Contains(p[0].Message, name) ||
			!strings.Contains(p[0].Fix, "use postgres.mode: exactly-once") || strings.Contains(p[0].Message, "two events can share") {
			t.Fatalf("%s: %+v, want one unique_key warning of redeliveries naming %s and pointing to exactly-once", what, p, name)
		}
	}
	exec("CREATE UNIQUE INDEX expr_key ON " + tbl + " (stream, (stream_seq + 1))")
	want("an expression over written columns", "expr_key (stream, expression)")
	exec("CREATE UNIQUE INDEX seq_key ON " + tbl + " (stream, stream_seq) WHERE stream_seq > 0")
	want("a partial index on written columns", "seq_key (stream, stream_seq)")
}

func TestPingErrorHasNoPassword(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	cfg := DefaultConfig()
	cfg.URL = "postgres://jet:s3cret@127.0.0.1:1/nodb?connect_timeout=2"
	s, err := New(ctx, cfg, testCols, &recDL{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Ping(ctx)
	if err == nil {
		t.Fatal("Ping to port 1 succeeded")
	}
	if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "127.0.0.1:1/nodb") {
		t.Fatalf("Ping error %q", err)
	}
}

// newKeySink is an exactly-once sink on url for a table of the test's own
// with only the key columns: str (meta:stream, text) and sq
// (meta:stream_seq, typ), created by New if create.
func newKeySink(t *testing.T, ctx context.Context, url string, typ pipeline.Type, create bool) *Sink {
	t.Helper()
	cfg := DefaultConfig()
	cfg.URL = url
	cfg.Table = uniqueName(t)
	cfg.Mode = ExactlyOnce
	cfg.CreateTable = create
	cols := []pipeline.Column{
		{Name: "str", From: "meta:stream", Type: pipeline.TypeText},
		{Name: "sq", From: "meta:stream_seq", Type: typ},
	}
	s, err := New(ctx, cfg, cols, &recDL{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// StoredSeq reads the highest sequence stored for one stream, ordering text
// sequences as numbers, and reads a missing table as empty.
func TestStoredSeq(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	for _, typ := range []pipeline.Type{pipeline.TypeInt8, pipeline.TypeNumeric, pipeline.TypeText} {
		t.Run(string(typ), func(t *testing.T) {
			s := newKeySink(t, ctx, pg.URL, typ, false)
			got := func(stream string) uint64 {
				t.Helper()
				n, err := s.StoredSeq(ctx, stream)
				if err != nil {
					t.Fatalf("StoredSeq(%s): %v", stream, err)
				}
				return n
			}
			if n := got("S"); n != 0 {
				t.Fatalf("no table: %d, want 0", n)
			}
			if err := s.Init(ctx); err != nil {
				t.Fatal(err)
			}
			if n := got("S"); n != 0 {
				t.Fatalf("empty table: %d, want 0", n)
			}
			// 99 sorts above 100 as text; stream T's rows are not S's.
			if _, err := admin.Exec(ctx, "INSERT INTO "+s.table.Sanitize()+
				" VALUES ('S', '99'), ('S', '100'), ('S', '7'), ('T', '5000')"); err != nil {
				t.Fatal(err)
			}
			if n := got("S"); n != 100 {
				t.Fatalf("StoredSeq(S) = %d, want 100", n)
			}
			if n := got("U"); n != 0 {
				t.Fatalf("StoredSeq(U) = %d, want 0", n)
			}
		})
	}
	s, _ := newTestSink(t, ctx, pg.URL, nil) // at-least-once
	if _, err := s.StoredSeq(ctx, "S"); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("StoredSeq in at-least-once mode: %v, want ErrInvalidConfig", err)
	}
}

// Exactly-once's lookup after a commit finds the keys the table lacks
// whatever type the mapping gives the sequence column (bigint, numeric,
// text; here a numeric(20,2) and a varchar stream column), by the keys as
// keyOf writes them; a key of another stream with the same sequence does
// not count.
func TestMissingKeysBySequenceType(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	for _, typ := range []pipeline.Type{pipeline.TypeInt8, pipeline.TypeNumeric, pipeline.TypeText} {
		t.Run(string(typ), func(t *testing.T) {
			s := newKeySink(t, ctx, pg.URL, typ, true)
			alter := "ALTER TABLE " + s.table.Sanitize() + " ALTER str TYPE varchar(40)"
			if typ == pipeline.TypeNumeric {
				alter += ", ALTER sq TYPE numeric(20,2)" // stored as 1.00
			}
			if _, err := admin.Exec(ctx, alter); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.Exec(ctx, "INSERT INTO "+s.table.Sanitize()+" VALUES ('S', '1'), ('S', '3'), ('T', '4')"); err != nil {
				t.Fatal(err)
			}
			c := &committer{s: s}
			defer c.closeConn()
			if err := c.connect(ctx); err != nil {
				t.Fatal(err)
			}
			rs, _ := rows(1, 4, nil)
			missing, err := c.missingKeys(ctx, rs)
			want := map[rowKey]struct{}{{"S", "2"}: {}, {"S", "4"}: {}}
			if err != nil || !maps.Equal(missing, want) {
				t.Fatalf("missingKeys = %v, %v; want %v", missing, err, want)
			}
		})
	}
}

// The lookup after a commit compares a text key as bytes too: a key
// column that got a collation ignoring case while a connection was open
// (the guards, which would refuse it, read the collation when a
// connection opens) found "ORDERS" for "orders", which ON CONFLICT had
// skipped, and the event was acked and never stored. Now it is missing,
// and dead-lettered.
func TestMissingKeysComparedAsBytes(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	for _, typ := range []pipeline.Type{pipeline.TypeInt8, pipeline.TypeText} {
		t.Run(string(typ), func(t *testing.T) {
			s := newKeySink(t, ctx, pg.URL, typ, true)
			alter := "ALTER TABLE " + s.table.Sanitize() + " ALTER str TYPE text COLLATE ci"
			if typ == pipeline.TypeText {
				alter += ", ALTER sq TYPE text COLLATE ci"
			}
			if _, err := admin.Exec(ctx, "CREATE COLLATION IF NOT EXISTS ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false); "+
				alter+"; INSERT INTO "+s.table.Sanitize()+" VALUES ('ORDERS', '7')"); err != nil {
				t.Fatal(err)
			}
			c := &committer{s: s}
			defer c.closeConn()
			if err := c.connect(ctx); err != nil {
				t.Fatal(err)
			}
			rs, _ := caseEvents()
			missing, err := c.missingKeys(ctx, rs)
			want := map[rowKey]struct{}{{"orders", "7"}: {}}
			if err != nil || !maps.Equal(missing, want) {
				t.Fatalf("missingKeys = %v, %v; want %v", missing, err, want)
			}
		})
	}
}

// holdAdmin has a call hold s's admin connection until done is called
// (again: a no-op), and then returns its error on busy.
func holdAdmin(ctx context.Context, s *Sink) (done func(), busy <-chan error) {
	held, release := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		errs <- s.withAdmin(ctx, func(*pgx.Conn) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	return sync.OnceFunc(func() { close(release) }), errs
}

// While another call holds the admin connection (StoredSeq may read a
// whole table), Ping answers on a connection of its own, so that /readyz
// neither waits behind it nor fails for it.
func TestPingWhileAdminIsBusy(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, nil)
	done, busy := holdAdmin(ctx, s)
	// Before the cleanups, which wait for the admin connection.
	defer done()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second) // the admin server's probe timeout
	defer cancel()
	err := s.Ping(pctx)
	if err != nil {
		t.Fatalf("Ping while the admin connection is busy: %v", err)
	}
	// Not with a context that has ended.
	dead, cancelDead := context.WithCancel(ctx)
	cancelDead()
	err = s.Ping(dead)
	done()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Ping with an ended context while the admin connection is busy = %v, want context.Canceled", err)
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once the admin connection is free: %v", err)
	}
}

// A ping on an admin connection that the server has ended while it was idle
// (a restart, pg_terminate_backend, idle_session_timeout) is made again on
// a new one: before, the first /readyz probe after it failed, saying
// "SQLSTATE 57P01: terminating connection due to administrator command",
// while PostgreSQL was ready.
func TestPingAfterTheAdminConnectionWasEnded(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, nil)
	for i := range 3 {
		var pid uint32
		if err := s.withAdmin(ctx, func(c *pgx.Conn) error { pid = c.PgConn().PID(); return nil }); err != nil {
			t.Fatal(err)
		}
		execOn(t, ctx, pg.URL, fmt.Sprintf("SELECT pg_terminate_backend(%d, 5000)", pid))
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("Ping %d after the admin connection was ended: %v", i+1, err)
		}
	}
}

// Pings that come while the admin connection is busy share one
// connection of their own, however many there are: /readyz takes any
// number of requests, and a connection each would take the server past
// max_connections while a slow batch is reported (the committers'
// reconnects, and other clients, would then be refused).
func TestPingsWhileAdminIsBusyShareAConnection(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, nil)
	dials, gate := gatedDials(s)
	done, busy := holdAdmin(ctx, s)
	defer done()
	g := gate()
	const pings = 50
	errs := make(chan error, pings)
	for range pings {
		go func() {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			errs <- s.Ping(pctx)
		}()
	}
	for dials.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(3 * pingWait) // the others' waits for the admin connection end meanwhile
	n := dials.Load()
	close(g)
	for range pings {
		if err := <-errs; err != nil {
			t.Errorf("Ping: %v", err)
		}
	}
	if n != 1 {
		t.Errorf("%d pings while the admin connection was busy dialed %d connections, want them to share 1", pings, n)
	}
	done()
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
}

// Close ends a ping on a connection of its own still under way and waits
// for it, and no such ping starts once Close has begun (a /readyz probe
// that comes while Close holds the admin connection): no connection
// outlives Close. The ping's dial here, once ended, returns only when let
// go: Close must not return before.
func TestCloseWaitsForPrivatePings(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	// sslmode=prefer: pgx dials again, without TLS, after the first dial
	// fails (as for a host of two addresses).
	s, _ := newTestSink(t, ctx, withParam(t, pg.URL, "sslmode", "prefer"), nil)
	var dials atomic.Int64
	var gated, first atomic.Bool
	dialing, ended, letGo := make(chan struct{}), make(chan struct{}), make(chan struct{})
	s.connCfg.DialFunc = func(dctx context.Context, network, addr string) (net.Conn, error) {
		if gated.Load() {
			dials.Add(1)
			if !first.CompareAndSwap(false, true) {
				// pgx dials again for a TLS fallback (sslmode=prefer)
				// or a host's next address: only the first is held.
				return nil, cmp.Or(dctx.Err(), errors.New("a dial after the held one"))
			}
			close(dialing)
			<-dctx.Done()
			close(ended)
			<-letGo
			return nil, dctx.Err()
		}
		return (&net.Dialer{}).DialContext(dctx, network, addr)
	}
	done, busy := holdAdmin(ctx, s)
	gated.Store(true)
	pinged := make(chan error, 1)
	go func() { pinged <- s.Ping(ctx) }()
	<-dialing
	done()
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { s.CloseContext(ctx); close(closed) }()
	select {
	case <-ended:
	case <-closed:
		t.Fatal("Close returned while a ping on a connection of its own was under way, without ending it")
	}
	select {
	case <-closed:
		t.Fatal("Close returned before the ping it ended was done")
	default:
	}
	close(letGo)
	<-closed
	if err := <-pinged; err == nil {
		t.Error("the ping Close ended answered")
	}
	before := dials.Load()
	pc := s.privatePing(ctx)
	<-pc.done
	if !errors.Is(pc.err, errSinkClosed) || dials.Load() != before {
		t.Fatalf("a ping after Close: %v, %d connections dialed; want errSinkClosed, and none", pc.err, dials.Load()-before)
	}
}

// CloseContext does not wait behind another call on the admin connection
// once its context has ended (a second signal stops at once).
func TestCloseContextWhileAdminIsBusy(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, nil)
	done, busy := holdAdmin(ctx, s)
	// Before the cleanups, which wait for the admin connection.
	defer done()
	dead, cancel := context.WithCancel(ctx)
	cancel()
	closed := make(chan struct{})
	go func() {
		s.CloseContext(dead)
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("CloseContext with an ended context waits for the busy admin connection")
	}
	done()
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	// Free, it closes whatever ctx says: after it, nothing opens the
	// admin connection again. (A select between the two would leave it
	// open half the time: ten sinks.)
	for range 10 {
		s, _ := newTestSink(t, ctx, pg.URL, nil)
		s.CloseContext(dead)
		if err := s.withAdmin(ctx, func(*pgx.Conn) error { return nil }); !errors.Is(err, errSinkClosed) {
			t.Fatalf("admin connection used after CloseContext with an ended context: %v", err)
		}
	}
}

// What refuses every batch whatever the rows is found by Check: a missing
// INSERT privilege, in exactly-once mode SELECT and TEMP too, and a
// read-only session.
func TestCheckPrivilegesAndReadOnly(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	owner, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = ExactlyOnce }) // creates the table
	// As check names it, schema-qualified.
	tbl := pgx.Identifier{"public", owner.cfg.Table}.Sanitize()
	role := uniqueName(t)
	exec := func(q string) {
		t.Helper()
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db := pgx.Identifier{admin.Config().Database}.Sanitize()
	exec("CREATE ROLE " + role + " LOGIN PASSWORD 'limited-pw'")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = admin.Exec(ctx, "DROP ROLE "+role)
	})
	exec("GRANT USAGE ON SCHEMA public TO " + role)
	exec("REVOKE TEMP ON DATABASE " + db + " FROM PUBLIC")
	u, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "limited-pw")
	check := func(mode Mode) []string {
		t.Helper()
		s, _ := newTestSink(t, ctx, u.String(), func(c *Config) { c.Table, c.Mode, c.CreateTable = owner.cfg.Table, mode, false })
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		var got []string
		for _, p := range probs {
			if !p.Warning { // at-least-once warns of the exactly-once key
				got = append(got, string(p.Kind)+": "+p.Fix)
			}
		}
		return got
	}
	want := []string{"privilege: GRANT INSERT ON " + tbl + " TO <jetsink's role>", "privilege: GRANT SELECT ON " + tbl + " TO <jetsink's role>",
		"privilege: GRANT TEMP ON DATABASE " + db + " TO <jetsink's role>"}
	if got := check(ExactlyOnce); !slices.Equal(got, want) {
		t.Fatalf("exactly-once, no privileges:\n%q\nwant\n%q", got, want)
	}
	if got := check(AtLeastOnce); !slices.Equal(got, want[:1]) {
		t.Fatalf("at-least-once, no privileges:\n%q\nwant\n%q", got, want[:1])
	}
	// Column privileges do on every mapped column, not on some: the fix
	// names the columns that lack them.
	exec("GRANT INSERT (stream, stream_seq), SELECT (stream) ON " + tbl + " TO " + role)
	some := []string{`privilege: GRANT INSERT ("payload") ON ` + tbl + ` TO <jetsink's role> (or GRANT INSERT ON ` + tbl + ` TO <jetsink's role>)`,
		`privilege: GRANT SELECT ("payload", "stream_seq") ON ` + tbl + ` TO <jetsink's role> (or GRANT SELECT ON ` + tbl + ` TO <jetsink's role>)`,
		want[2]}
	if got := check(ExactlyOnce); !slices.Equal(got, some) {
		t.Fatalf("exactly-once, privileges on some columns:\n%q\nwant\n%q", got, some)
	}
	exec("GRANT INSERT (payload), SELECT (stream_seq, payload) ON " + tbl + " TO " + role)
	exec("GRANT TEMP ON DATABASE " + db + " TO " + role)
	if got := check(ExactlyOnce); len(got) != 0 {
		t.Fatalf("with the privileges on the mapped columns: %q", got)
	}
	exec("GRANT INSERT, SELECT ON " + tbl + " TO " + role)
	if got := check(ExactlyOnce); len(got) != 0 {
		t.Fatalf("with the privileges: %q", got)
	}
	exec("ALTER ROLE " + role + " SET default_transaction_read_only = on")
	if got := check(ExactlyOnce); len(got) != 1 || !strings.HasPrefix(got[0], "read_only: ALTER ROLE") {
		t.Fatalf("read-only role: %q", got)
	}
}

// A serial column jetsink leaves to its default, in a table owned by
// another role that granted INSERT only: every row calls nextval, which
// needs USAGE on the sequence, and every batch failed (42501, permission
// denied for sequence) while check said ok. Check names each such
// sequence (on a partitioned table, the parent's defaults), not one an
// identity column uses nor one a mapped column's default would call, and
// the grants it says are all an INSERT needs.
func TestCheckSequencePrivilegeOfAnUnmappedDefault(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	role, roleURL := newRole(t, ctx, admin, pg.URL, "GRANT USAGE ON SCHEMA public TO %[1]s")
	base := uniqueName(t)
	for _, tc := range []struct{ name, ddl string }{
		{"table", "CREATE TABLE %[1]s (stream text, stream_seq int8, payload jsonb, id bigserial, " +
			"n int8 GENERATED BY DEFAULT AS IDENTITY, m int8 DEFAULT nextval('%[1]s_m'), w bigserial)"},
		{"partitioned", "CREATE TABLE %[1]s (stream text, stream_seq int8, payload jsonb, id bigserial, " +
			"n int8 GENERATED BY DEFAULT AS IDENTITY, m int8 DEFAULT nextval('%[1]s_m'), w bigserial) PARTITION BY LIST (stream); " +
			"CREATE TABLE %[1]s_d PARTITION OF %[1]s DEFAULT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := base + "_" + tc.name[:1]
			for _, q := range []string{"CREATE SEQUENCE " + tbl + "_m", fmt.Sprintf(tc.ddl, tbl), "GRANT INSERT ON " + tbl + " TO " + role} {
				if _, err := admin.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			s, _ := newTestSink(t, ctx, roleURL, func(c *Config) { c.Table, c.CreateTable = tbl, false })
			s.cols = append(slices.Clone(testCols), pipeline.Column{Name: "w", From: "json:w", Type: pipeline.TypeInt8, Required: true})
			probs, err := s.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range probs {
				if !p.Warning {
					got = append(got, string(p.Kind)+" "+p.Column+": "+p.Fix)
				}
			}
			want := []string{
				`privilege id: GRANT USAGE ON SEQUENCE "public"."` + tbl + `_id_seq" TO <jetsink's role>`,
				`privilege m: GRANT USAGE ON SEQUENCE "public"."` + tbl + `_m" TO <jetsink's role>`,
			}
			if !slices.Equal(got, want) {
				t.Fatalf("problems:\n%q\nwant\n%q", got, want)
			}
			// What check says is what the role's INSERT needs: refused
			// before the grants, stored after them, the identity
			// column's sequence ungranted.
			rc, err := pgx.Connect(ctx, roleURL)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close(context.Background())
			ins := "INSERT INTO " + tbl + " (stream, stream_seq, payload, w) VALUES ('s', 1, '{}', 7)"
			var pgErr *pgconn.PgError
			if _, err := rc.Exec(ctx, ins); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
				t.Fatalf("INSERT before the grants: %v, want SQLSTATE 42501", err)
			}
			for _, q := range []string{tbl + "_id_seq", tbl + "_m"} {
				if _, err := admin.Exec(ctx, "GRANT USAGE ON SEQUENCE "+q+" TO "+role); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := rc.Exec(ctx, ins); err != nil {
				t.Fatalf("INSERT after the grants check named: %v", err)
			}
			if probs, err = s.Check(ctx); err != nil {
				t.Fatal(err)
			}
			for _, p := range probs {
				if !p.Warning {
					t.Errorf("after the grants: %s", p)
				}
			}
		})
	}
}

// A database not in UTF8: jetsink's sessions say they send UTF-8, so that
// PostgreSQL converts what it can ("é" stays "é" in LATIN1; before, it was
// stored as "Ã©") and refuses what it cannot ("€"), whose row alone is
// dead-lettered. check warns of LATIN1 and refuses SQL_ASCII, where a
// jsonb \u escape above 007F stops every batch holding it.
func TestServerEncoding(t *testing.T) {
	t.Run("LATIN1", func(t *testing.T) {
		ctx := testCtx(t, 30*time.Second)
		pg := testenv.PostgresEncoding(t, "LATIN1")
		s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Connections = 1 })
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(probs) != 1 || probs[0].Kind != ProblemEncoding || !probs[0].Warning || !strings.Contains(probs[0].Message, "LATIN1") {
			t.Fatalf("problems %v, want one encoding warning naming LATIN1", probs)
		}
		payloads := []string{`{"v":"é"}`, `{"v":"\u00e9"}`, `{"v":"€"}`, `{"v":"ü"}`}
		rs, ms := rows(1, len(payloads), func(seq int) string { return payloads[seq-1] })
		src := newSource()
		src.push(t, ctx, rs)
		src.close()
		if err := s.Run(ctx, src); err != nil {
			t.Fatalf("Run: %v", err)
		}
		for i, m := range ms {
			acks, terms := int32(1), int32(0) // stored
			if i == 2 {
				acks, terms = 0, 1 // "€": dead-lettered
			}
			if m.acks.Load() != acks || m.terms.Load() != terms {
				t.Errorf("%s: acks %d, terms %d", payloads[i], m.acks.Load(), m.terms.Load())
			}
		}
		if letters, seqs := dl.letters(); len(letters) != 1 || seqs[0] != 3 || letters[0].SQLState != "22P05" {
			t.Errorf("dead letters %+v of %v, want the one of seq 3 (SQLSTATE 22P05)", letters, seqs)
		}
		conn, err := pgx.Connect(ctx, withParam(t, pg.URL, "client_encoding", "UTF8"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, "SELECT payload->>'v' FROM "+s.table.Sanitize()+" ORDER BY stream_seq")
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"é", "é", "ü"}; !slices.Equal(got, want) {
			t.Fatalf("stored %q, want %q", got, want)
		}
	})
	t.Run("SQL_ASCII", func(t *testing.T) {
		ctx := testCtx(t, 30*time.Second)
		pg := testenv.PostgresEncoding(t, "SQL_ASCII")
		s, _ := newTestSink(t, ctx, pg.URL, nil)
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(probs) != 1 || probs[0].Kind != ProblemEncoding || probs[0].Warning || !strings.Contains(probs[0].Message, "SQL_ASCII") {
			t.Fatalf("problems %v, want one encoding error naming SQL_ASCII", probs)
		}
		// Said without the table too: check is most often run before init.
		if _, err := pg.Conn(t).Exec(ctx, "DROP TABLE "+s.table.Sanitize()); err != nil {
			t.Fatal(err)
		}
		probs, err = s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[ProblemKind]bool{}
		for _, p := range probs {
			kinds[p.Kind] = true
		}
		if len(probs) != 2 || !kinds[ProblemEncoding] || !kinds[ProblemTableMissing] {
			t.Fatalf("without the table: problems %v, want the encoding error and the missing table", probs)
		}
	})
}

// Settings of the server's for jetsink's sessions that check warns of:
// a statement_timeout under 10 s (a batch that takes longer is cut into
// pieces), and synchronous_commit off (acked events can be lost in a
// crash of the server). A longer timeout, none, or another
// synchronous_commit is not reported.
func TestCheckWarnsOfServerSettings(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	for _, tc := range []struct {
		param, setting string
		want           ProblemKind // "": none
		says           string
	}{
		{"statement_timeout", "300", ProblemServerTimeout, "statement_timeout is 300ms"},
		{"statement_timeout", "20000", "", ""},
		{"statement_timeout", "0", "", ""},
		{"synchronous_commit", "off", ProblemAsyncCommit, "synchronous_commit is off"},
		{"synchronous_commit", "on", "", ""},
		{"synchronous_commit", "local", "", ""},
	} {
		s, _ := newTestSink(t, ctx, withParam(t, pg.URL, tc.param, tc.setting), nil)
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if tc.want == "" {
			if len(probs) != 0 {
				t.Fatalf("%s %s: problems %v", tc.param, tc.setting, probs)
			}
			continue
		}
		if len(probs) != 1 || probs[0].Kind != tc.want || !probs[0].Warning || !strings.Contains(probs[0].Message, tc.says) {
			t.Fatalf("%s %s: problems %v, want one warning, %s, saying %q", tc.param, tc.setting, probs, tc.want, tc.says)
		}
	}
}

// A server that standbys stream from, whose commits wait for none of them,
// is warned of: a failover to one loses commits whose events were acked.
// Once a synchronous standby is named, and synchronous_commit waits for it,
// nothing is reported; a session with synchronous_commit local is.
func TestCheckWarnsOfAsyncStandby(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	primary := testenv.NewCluster(t)
	purl := primary.URL("postgres")
	check := func(u string) []Problem {
		t.Helper()
		s, _ := newTestSink(t, ctx, u, nil)
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return probs
	}
	if probs := check(purl); len(probs) != 0 {
		t.Fatalf("no standby: problems %v", probs)
	}
	standby := testenv.NewStandby(t, primary) // synchronous: synchronous_standby_names '*'
	if probs := check(purl); len(probs) != 0 {
		t.Fatalf("a synchronous standby: problems %v", probs)
	}
	// On the standby, where the table is missing too: a standby takes no
	// CREATE TABLE either, which check says beside the missing table (run
	// with create_table would fail on it).
	s, _ := newTestSink(t, ctx, standby.URL("postgres"), func(c *Config) { c.CreateTable = false })
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) != 2 || probs[0].Kind != ProblemReadOnly || probs[1].Kind != ProblemTableMissing {
		t.Fatalf("the standby, without the table: problems %v, want read_only and table_missing", probs)
	}
	if probs[1].InitMakes() {
		t.Error("check says init or run makes the table on a standby")
	}
	// A failover list: with target_session_attrs, nothing to say; without
	// it, a connection may land on the standby.
	list := testenv.FailoverURL("postgres", primary, standby)
	if probs := check(list); len(probs) != 0 {
		t.Fatalf("a failover list: problems %v", probs)
	}
	anyURL, err := url.Parse(list)
	if err != nil {
		t.Fatal(err)
	}
	q := anyURL.Query()
	q.Del("target_session_attrs")
	anyURL.RawQuery = q.Encode()
	if probs := check(anyURL.String()); len(probs) != 1 || probs[0].Kind != ProblemHostList || !probs[0].Warning ||
		!strings.Contains(probs[0].Message, fmt.Sprintf("names 2 hosts (127.0.0.1:%d,127.0.0.1:%d)", primary.Port(), standby.Port())) {
		t.Fatalf("a failover list without target_session_attrs: problems %v, want one warning, %s", probs, ProblemHostList)
	}
	wantWarning := func(probs []Problem, says string) {
		t.Helper()
		if len(probs) != 1 || probs[0].Kind != ProblemAsyncStandby || !probs[0].Warning ||
			!strings.Contains(probs[0].Message, "1 physical replication connection(s) (standbys; also pg_receivewal or a base backup) stream from 127.0.0.1:") || !strings.Contains(probs[0].Message, says) {
			t.Fatalf("problems %v, want one warning, %s, saying %q", probs, ProblemAsyncStandby, says)
		}
	}
	wantWarning(check(withParam(t, purl, "synchronous_commit", "local")), "synchronous_commit is local")
	// off has its own warning, which says as much.
	if probs := check(withParam(t, purl, "synchronous_commit", "off")); len(probs) != 1 || probs[0].Kind != ProblemAsyncCommit {
		t.Fatalf("synchronous_commit off: problems %v, want %s only", probs, ProblemAsyncCommit)
	}

	admin := primary.URL("postgres")
	for _, sql := range []string{"ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()"} {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, sql)
		_ = conn.Close(ctx)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	waitFor(t, ctx, "the reload", func() bool { return len(check(purl)) == 1 })
	wantWarning(check(purl), "synchronous_standby_names is empty")
}

// A server whose pg_settings jetsink's role may not read costs check the
// timeout warning only: it says so, and checks the rest.
func TestCheckWithoutPgSettings(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	if _, err := admin.Exec(ctx, "REVOKE SELECT ON pg_catalog.pg_settings FROM PUBLIC"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "GRANT SELECT ON pg_catalog.pg_settings TO PUBLIC") })
	_, roleURL := newRole(t, ctx, admin, pg.URL, "GRANT CREATE ON SCHEMA public TO %[1]s")
	s, _ := newTestSink(t, ctx, roleURL, nil)
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) != 1 || probs[0].Kind != ProblemServerTimeout || !probs[0].Warning || !strings.Contains(probs[0].Message, "could not read") ||
		!strings.Contains(probs[0].Message, "42501") {
		t.Fatalf("problems %v, want one warning that pg_settings could not be read", probs)
	}
	// Init of the table that exists, in exactly-once mode, checks it
	// first: the refused read is a warning there too, not an aborted
	// transaction (25P02) that fails the start.
	eo, _ := newTestSink(t, ctx, roleURL, func(c *Config) { c.Table, c.Mode, c.CreateTable = s.cfg.Table, ExactlyOnce, false })
	if err := eo.Init(ctx); err != nil {
		t.Fatalf("exactly-once Init of an existing table without pg_settings: %v", err)
	}
}

// checkTableOf makes a table of the test's own with testCols' columns and
// the columns ddl defines, and returns what Check finds for the mapping of
// testCols and cols.
func checkTableOf(t *testing.T, ddl string, cols ...pipeline.Column) []Problem {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	table := uniqueName(t)
	if _, err := pg.Conn(t).Exec(ctx, "CREATE TABLE "+table+" (stream text, stream_seq int8, payload jsonb, "+ddl+")"); err != nil {
		t.Fatal(err)
	}
	return checkTableNamed(t, ctx, pg.URL, table, cols...)
}

// checkTableNamed is what check finds of table on url mapped from testCols
// and cols.
func checkTableNamed(t *testing.T, ctx context.Context, url, table string, cols ...pipeline.Column) []Problem {
	t.Helper()
	cfg := DefaultConfig()
	cfg.URL, cfg.Table = url, table
	s, err := New(ctx, cfg, append(slices.Clone(testCols), cols...), &recDL{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return probs
}

// A nullable column with a DEFAULT, mapped from a value an event may lack,
// gets NULL, not the default, from such an event (the COPY names every
// mapped column): a warning. Not for a required column, nor a source that
// is never missing, nor a NOT NULL column (an error of its own).
func TestCheckWarnsOfAnIgnoredDefault(t *testing.T) {
	probs := checkTableOf(t, `seen timestamptz DEFAULT now(), kind text DEFAULT 'x', msg text DEFAULT '',
		at timestamptz DEFAULT now(), sent timestamptz DEFAULT now(), n int4 NOT NULL DEFAULT 0`,
		pipeline.Column{Name: "seen", From: "json:seen", Type: pipeline.TypeTimestamptz}, // warned
		pipeline.Column{Name: "kind", From: "header:Kind", Type: pipeline.TypeText},      // warned
		pipeline.Column{Name: "msg", From: "meta:msg_id", Type: pipeline.TypeText},       // warned
		pipeline.Column{Name: "at", From: "json:at", Type: pipeline.TypeTimestamptz, Required: true},
		pipeline.Column{Name: "sent", From: "meta:published_at", Type: pipeline.TypeTimestamptz},
		pipeline.Column{Name: "n", From: "json:n", Type: pipeline.TypeInt4}) // NOT NULL: its own problem
	var warned []string
	for _, p := range probs {
		switch {
		case p.Kind == ProblemIgnoredDefault && p.Warning:
			warned = append(warned, p.Column)
		case p.Kind == ProblemNotNull && p.Column == "n":
			// Said there, as it is not warned of apart.
			if !strings.Contains(p.Message, "its DEFAULT is not applied") {
				t.Errorf("n: %s; want it to say its DEFAULT is not applied", p.Message)
			}
		default:
			t.Errorf("unexpected problem %+v", p)
		}
	}
	if slices.Sort(warned); !slices.Equal(warned, []string{"kind", "msg", "seen"}) {
		t.Fatalf("ignored defaults warned for %v, want kind, msg, seen", warned)
	}
}

// A NOT NULL column mapped from a source every event has (a meta field
// but msg_id, a text or bytea payload) needs no required: check says
// nothing of it. Before, it was an error (check exited 1 and run logged
// that the table does not fit) for the columns an exactly-once key is made
// of. A jsonb payload is NULL for a NATS KV bucket's delete and purge
// markers: a warning naming them, which suggests required (not for a
// required one); with a DEFAULT and no NOT NULL, the ignored default's
// warning names them.
func TestCheckNotNullOfSourcesNeverNull(t *testing.T) {
	probs := checkTableOf(t, `seq2 int8 NOT NULL, subj text NOT NULL, pub timestamptz NOT NULL, body jsonb NOT NULL,
		id text NOT NULL, x int4 NOT NULL, btext text NOT NULL, bbytes bytea NOT NULL, breq jsonb NOT NULL,
		bdef jsonb DEFAULT '{}'`,
		pipeline.Column{Name: "seq2", From: "meta:stream_seq", Type: pipeline.TypeInt8},
		pipeline.Column{Name: "subj", From: "meta:subject", Type: pipeline.TypeText},
		pipeline.Column{Name: "pub", From: "meta:published_at", Type: pipeline.TypeTimestamptz},
		pipeline.Column{Name: "body", From: "payload", Type: pipeline.TypeJSONB},  // a KV marker's is NULL
		pipeline.Column{Name: "id", From: "meta:msg_id", Type: pipeline.TypeText}, // an event may have none
		pipeline.Column{Name: "x", From: "/x", Type: pipeline.TypeInt4},
		pipeline.Column{Name: "btext", From: "payload", Type: pipeline.TypeText},
		pipeline.Column{Name: "bbytes", From: "payload", Type: pipeline.TypeBytea},
		pipeline.Column{Name: "breq", From: "payload", Type: pipeline.TypeJSONB, Required: true},
		pipeline.Column{Name: "bdef", From: "payload", Type: pipeline.TypeJSONB})
	var got []string
	for _, p := range probs {
		switch {
		case p.Column == "body":
			if p.Kind != ProblemNotNull || !p.Warning ||
				!strings.Contains(p.Message, "a NATS KV bucket's delete or purge marker (an empty body with KV-Operation: DEL or PURGE) stores NULL there") ||
				!strings.Contains(p.Fix, "set required: true on column body") {
				t.Errorf("body: %+v; want a not_null warning naming KV markers, suggesting required", p)
			}
		case p.Column == "bdef":
			if p.Kind != ProblemIgnoredDefault || !p.Warning ||
				!strings.Contains(p.Message, "has a DEFAULT, but a NATS KV bucket's delete or purge marker") {
				t.Errorf("bdef: %+v; want an ignored_default warning naming KV markers", p)
			}
		case p.Kind != ProblemNotNull || p.Warning:
			t.Errorf("unexpected problem %+v", p)
			continue
		}
		if strings.Contains(p.Message, "DEFAULT") && p.Column != "bdef" {
			t.Errorf("%s, without a DEFAULT: %s", p.Column, p.Message)
		}
		got = append(got, p.Column)
	}
	if slices.Sort(got); !slices.Equal(got, []string{"bdef", "body", "id", "x"}) {
		t.Fatalf("problems for %v, want bdef, body, id and x only", got)
	}
}

// A numeric or timestamptz column with a precision is a warning naming
// it: PostgreSQL rounds what jetsink sends to it (and refuses a number too
// large for numeric(p,s), one bisection per row). Before, the type's OID
// matched and check said nothing.
func TestCheckWarnsOfTypeModifiers(t *testing.T) {
	probs := checkTableOf(t, "amount numeric(10,2), total numeric, at timestamptz(3), seen timestamptz, at6 timestamptz(6), code varchar(3)",
		pipeline.Column{Name: "code", From: "json:code", Type: pipeline.TypeText},
		pipeline.Column{Name: "amount", From: "json:amount", Type: pipeline.TypeNumeric},
		pipeline.Column{Name: "total", From: "json:total", Type: pipeline.TypeNumeric},
		pipeline.Column{Name: "at", From: "json:at", Type: pipeline.TypeTimestamptz},
		pipeline.Column{Name: "seen", From: "json:seen", Type: pipeline.TypeTimestamptz},
		pipeline.Column{Name: "at6", From: "json:at6", Type: pipeline.TypeTimestamptz}) // 6 digits: all there are
	var got []string
	for _, p := range probs {
		if p.Kind != ProblemTypeModifier || !p.Warning {
			t.Errorf("unexpected problem %+v", p)
			continue
		}
		got = append(got, p.Column)
	}
	slices.Sort(got)
	if want := []string{"amount", "at", "code"}; !slices.Equal(got, want) {
		t.Fatalf("type modifier warnings for %v, want %v: %v", got, want, probs)
	}
	for _, p := range probs {
		if p.Column == "amount" && (!strings.Contains(p.Message, "numeric(10,2)") || !strings.Contains(p.Message, "22003")) {
			t.Errorf("amount: %s", p.Message)
		}
		// PostgreSQL cuts a text longer only by spaces at its end
		// ('abc     ' into varchar(3) is 'abc'), unsaid: the warning says so.
		if p.Column == "code" && (!strings.Contains(p.Message, "22001") || !strings.Contains(p.Message, "only by spaces at its end")) {
			t.Errorf("code: %s", p.Message)
		}
	}
}

// A missing table that Init could not make (its schema does not exist, or
// jetsink's role may not create in it) is not one that create_table fixes
// (InitMakes), and check says why: before, check called it a warning with
// create_table and run failed at every start.
func TestCheckMissingTableInit(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	schema := fmt.Sprintf("s_%d", time.Now().UnixNano())
	missing := func(t *testing.T, url string, says, fix string) {
		t.Helper()
		s, _ := newTestSink(t, ctx, url, func(c *Config) { c.Table = schema + ".events"; c.CreateTable = false })
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(probs) != 1 || probs[0].Kind != ProblemTableMissing || probs[0].InitMakes() ||
			!strings.Contains(probs[0].Message, says) || !strings.Contains(probs[0].Fix, fix) {
			t.Fatalf("problems %v, want a missing table Init cannot make, saying %q, fix %q", probs, says, fix)
		}
		if err := s.Init(ctx); err == nil {
			t.Fatal("Init made it after all")
		}
	}
	q := pgx.Identifier{schema}.Sanitize()
	missing(t, pg.URL, "schema "+q+" does not exist", "CREATE SCHEMA "+q)
	role := schema + "_r"
	for _, q := range []string{"CREATE SCHEMA " + schema, "CREATE ROLE " + role + " LOGIN PASSWORD 'pw'",
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE; DROP OWNED BY "+role+"; DROP ROLE "+role)
	})
	u, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "pw")
	missing(t, u.String(), "may not create tables in schema "+q, "GRANT CREATE ON SCHEMA "+q)
}

// gatedDials has s count the connections it dials from when gate is
// called, each held until the channel gate returned is closed (or its
// dial's context ends).
func gatedDials(s *Sink) (dials *atomic.Int64, gate func() chan struct{}) {
	dials = new(atomic.Int64)
	var g atomic.Pointer[chan struct{}]
	s.connCfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if c := g.Load(); c != nil {
			dials.Add(1)
			select {
			case <-*c:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	return dials, func() chan struct{} {
		c := make(chan struct{})
		g.Store(&c)
		return c
	}
}

// withSearchPath is dbURL with its sessions' search_path set to path.
func withSearchPath(t *testing.T, dbURL, path string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", path)
	u.RawQuery = q.Encode()
	return u.String()
}

// Init finds the table wherever search_path finds it: CREATE TABLE IF NOT
// EXISTS looks in the first schema only, and made an empty table there
// that hid the real one (every later COPY went to it).
func TestInitFindsTheTableOnSearchPath(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	first, second := fmt.Sprintf("sa_%d", time.Now().UnixNano()), fmt.Sprintf("sb_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+first+"; CREATE SCHEMA "+second+
		"; CREATE TABLE "+second+".events (stream text, stream_seq int8, payload jsonb)"); err != nil {
		t.Fatal(err)
	}
	dbURL := withSearchPath(t, pg.URL, first+","+second)
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		s, _ := newTestSink(t, ctx, dbURL, func(c *Config) { c.Table, c.Mode = "events", mode })
		if err := s.Init(ctx); err != nil {
			t.Fatalf("%s: Init: %v", mode, err)
		}
		var tables, indexes int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'events' AND relkind = 'r'
			AND relnamespace::regnamespace::text IN ($1, $2)`, first, second).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass AND indisunique`, second+".events").Scan(&indexes); err != nil {
			t.Fatal(err)
		}
		if want := map[Mode]int{AtLeastOnce: 0, ExactlyOnce: 1}[mode]; tables != 1 || indexes != want {
			t.Fatalf("%s: %d tables named events, %d unique indexes on %s.events; want 1 and %d", mode, tables, indexes, second, want)
		}
	}
}

// Tables every batch would fail in are errors of check: a mapped generated
// column (COPY cannot write it), a GENERATED ALWAYS identity in
// exactly-once mode (its INSERT cannot), a partitioned table without
// partitions; and not, since the guard reads the pinned schema-qualified
// name, a table whose name finds a type first.
func TestCheckTablesEveryBatchFails(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	check := func(t *testing.T, ddl string, mode Mode, table string, cols []pipeline.Column, kind ProblemKind, says string, searchPath ...string) {
		t.Helper()
		if _, err := admin.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
		dbURL := pg.URL
		if len(searchPath) > 0 {
			dbURL = withSearchPath(t, pg.URL, searchPath[0])
		}
		s, _ := newTestSink(t, ctx, dbURL, func(c *Config) { c.Table, c.Mode, c.CreateTable = table, mode, false })
		s.cols = append(slices.Clone(testCols), cols...)
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range probs {
			if p.Kind == kind && !p.Warning && strings.Contains(p.Message, says) {
				return
			}
		}
		t.Fatalf("problems %v, want a %s error saying %q", probs, kind, says)
	}
	n := time.Now().UnixNano()
	t.Run("generated", func(t *testing.T) {
		tbl := fmt.Sprintf("gen_%d", n)
		check(t, "CREATE TABLE "+tbl+" (stream text, stream_seq int8, payload jsonb, q int4, twice int4 GENERATED ALWAYS AS (q * 2) STORED)",
			AtLeastOnce, tbl, []pipeline.Column{{Name: "twice", From: "json:t", Type: pipeline.TypeInt4}}, ProblemGenerated, "generated column")
	})
	t.Run("identity always, exactly-once", func(t *testing.T) {
		tbl := fmt.Sprintf("ident_%d", n)
		check(t, "CREATE TABLE "+tbl+" (stream text, stream_seq int8, payload jsonb, id int8 GENERATED ALWAYS AS IDENTITY, UNIQUE (stream, stream_seq))",
			ExactlyOnce, tbl, []pipeline.Column{{Name: "id", From: "json:id", Type: pipeline.TypeInt8}}, ProblemGenerated, "GENERATED ALWAYS AS IDENTITY")
	})
	t.Run("no partitions", func(t *testing.T) {
		tbl := fmt.Sprintf("parts_%d", n)
		check(t, "CREATE TABLE "+tbl+" (stream text, stream_seq int8, payload jsonb) PARTITION BY LIST (stream)",
			AtLeastOnce, tbl, nil, ProblemRelationKind, "without partitions")
	})
	// A table whose name finds a type first (path) failed every batch's
	// at-least-once type guard, (NULL::<name>).<column>, and check said
	// so; the guard reads the schema-qualified name a connection pins, so
	// it is no error now: check must not say every batch fails.
	t.Run("a name that finds a type", func(t *testing.T) {
		schema := fmt.Sprintf("st_%d", n)
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+".path (stream text, stream_seq int8, payload jsonb)"); err != nil {
			t.Fatal(err)
		}
		s, dl := newTestSink(t, ctx, withSearchPath(t, pg.URL, schema), func(c *Config) { c.Table, c.Mode, c.CreateTable = "path", AtLeastOnce, false })
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range probs {
			if !p.Warning {
				t.Errorf("check of table path: %v", p)
			}
		}
		storeClean(t, ctx, s, dl, 5)
		var stored int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".path").Scan(&stored); err != nil || stored != 5 {
			t.Errorf("%d rows stored in %s.path, %v; want 5", stored, schema, err)
		}
	})
}

// A missing exactly-once key index on a table partitioned by another
// column is not one Init can make (CREATE UNIQUE INDEX fails, 0A000):
// check said create_table would fix it, and run then failed at start.
// Then check's fix was still that CREATE UNIQUE INDEX, and Init ran it
// and failed with "create table ...: unique constraint on partitioned
// table must include all partitioning columns": the fix now says what
// can be done, Init fails with check's words, building nothing, and the
// partition key is spoken of only where it is another column.
func TestCheckKeyIndexOfAPartitionedTable(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	n := time.Now().UnixNano()
	for i, c := range []struct {
		by, sub   string // sub: the partition _a's own PARTITION BY, if any
		initMakes bool
	}{
		{"RANGE (at)", "", false}, {"LIST (stream)", "", true}, {"RANGE ((stream_seq % 2))", "", false},
		// PostgreSQL needs the key columns of every level in the
		// index: a partition partitioned by another column is as its
		// table would be (check read the top level's key alone, and
		// Init failed with 0A000 under "create table").
		{"LIST (stream)", "RANGE (at)", false},
		// _a attached with its columns in another order: stream_seq is
		// its third, the table's second; by name it is the key.
		{"LIST (stream)", "RANGE (stream_seq)", true},
		// A key column in a collation other than its column's: the
		// index must use the key's (0A000), and Init's takes the
		// column's. Check compared names alone, said Init makes it,
		// and Init failed with a raw 0A000. At the top, and below.
		{`LIST (stream COLLATE "C")`, "", false},
		{"LIST (stream)", `RANGE (stream COLLATE "C")`, false},
	} {
		tbl := fmt.Sprintf("kp_%d_%d", n, i)
		if c.sub != "" {
			c.by += " / " + c.sub // for the messages
		}
		ddl := []string{"CREATE TABLE " + tbl + " (stream text, stream_seq int8, payload jsonb, at timestamptz) PARTITION BY " + strings.Split(c.by, " / ")[0],
			"CREATE TABLE " + tbl + "_d PARTITION OF " + tbl + " DEFAULT"}
		if c.sub != "" {
			ddl = append(ddl, "CREATE TABLE "+tbl+"_a (at timestamptz, payload jsonb, stream_seq int8, stream text) PARTITION BY "+c.sub,
				"CREATE TABLE "+tbl+"_a1 PARTITION OF "+tbl+"_a DEFAULT",
				"ALTER TABLE "+tbl+" ATTACH PARTITION "+tbl+"_a FOR VALUES IN ('a')")
		}
		for _, q := range ddl {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		s, _ := newTestSink(t, ctx, pg.URL, func(cfg *Config) { cfg.Table, cfg.Mode, cfg.CreateTable = tbl, ExactlyOnce, false })
		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := lastProblem(probs, ProblemNoUniqueIndex)
		if found == nil {
			t.Fatalf("partitioned by %s: problems %v, want no_unique_index", c.by, probs)
		}
		if found.InitMakes() != c.initMakes {
			t.Errorf("partitioned by %s: InitMakes = %v, want %v: %s", c.by, found.InitMakes(), c.initMakes, found)
		}
		if says := strings.Contains(found.Message, "partition key"); says == c.initMakes {
			t.Errorf("partitioned by %s: the message speaks of the partition key: %v, want %v: %s", c.by, says, !c.initMakes, found)
		}
		err = s.Init(ctx)
		if c.initMakes {
			if err != nil {
				t.Errorf("partitioned by %s: Init: %v", c.by, err)
			}
			continue
		}
		if strings.HasPrefix(found.Fix, "CREATE UNIQUE INDEX") || !strings.Contains(found.Fix, "postgres.mode: at-least-once") {
			t.Errorf("partitioned by %s: fix %q, want one that can be done", c.by, found.Fix)
		}
		if !errors.Is(err, ErrNoKeyIndex) || !strings.Contains(err.Error(), found.String()) {
			t.Errorf("partitioned by %s: Init: %v, want ErrNoKeyIndex with check's words %q", c.by, err, found)
		}
		if c.sub != "" && (!strings.Contains(found.Message, `its partition "public"."`+tbl+`_a" is partitioned by `) ||
			!strings.Contains(found.Message, "(PARTITION BY "+c.sub+")")) {
			t.Errorf("partitioned by %s: %s, want the partition and its PARTITION BY named", c.by, found)
		}
		if strings.Contains(c.by, "COLLATE") && !strings.Contains(found.Message, `stream in collation "C", not the column's "default"`) {
			t.Errorf("partitioned by %s: %s, want the key's collation and the column's named", c.by, found)
		}
	}
}

// Init makes no second unique index where a usable one is there: a
// primary key on (stream, stream_seq) does for exactly-once's ON CONFLICT.
func TestInitKeepsAKeyThatIsThere(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	tbl := fmt.Sprintf("pk_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE TABLE "+tbl+" (stream text, stream_seq int8, payload jsonb, PRIMARY KEY (stream, stream_seq))"); err != nil {
		t.Fatal(err)
	}
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Table, c.Mode = tbl, ExactlyOnce })
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass AND indisunique", tbl).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d unique indexes on %s after Init, want the primary key's only", n, tbl)
	}
}

// An UNLOGGED table (or partition) loses its rows in a crash, and a
// standby has none of them: a crash or failover after jetsink acked their
// events lost them, and nothing said so. Check warns of it; and a table
// made unlogged while jetsink runs is logged at Warn once a connection
// reads the table again.
func TestCheckWarnsOfAnUnloggedTable(t *testing.T) {
	for _, tc := range []struct{ name, ddl, says string }{
		{"logged", "CREATE TABLE %[1]s (stream text, stream_seq int8, payload jsonb)", ""},
		{"unlogged", "CREATE UNLOGGED TABLE %[1]s (stream text, stream_seq int8, payload jsonb)", "is unlogged"},
		{"unlogged_partition", "CREATE TABLE %[1]s (stream text, stream_seq int8, payload jsonb) PARTITION BY RANGE (stream_seq); " +
			"CREATE TABLE %[2]s PARTITION OF %[1]s FOR VALUES FROM (0) TO (100); " +
			"CREATE UNLOGGED TABLE %[3]s PARTITION OF %[1]s FOR VALUES FROM (100) TO (200)", "partitions of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			pg := testenv.Postgres(t)
			s, dl := newTestSink(t, ctx, pg.URL, func(c *Config) { c.CreateTable = false })
			admin := pg.Conn(t)
			table := s.table.Sanitize()
			execAll(t, ctx, admin, fmt.Sprintf(tc.ddl, table, pgx.Identifier{s.cfg.Table + "_a"}.Sanitize(), pgx.Identifier{s.cfg.Table + "_b"}.Sanitize()))
			probs, err := s.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := problemsOf(probs, ProblemUnlogged)
			if tc.says == "" {
				if len(got) != 0 {
					t.Fatalf("problems %v for a logged table", got)
				}
			} else if len(got) != 1 || !got[0].Warning || !strings.Contains(got[0].Message, tc.says) ||
				!strings.Contains(got[0].Message, "a crash or failover empties") || !strings.Contains(got[0].Fix, "SET LOGGED") {
				t.Fatalf("problems %v, want one warning saying %q and that a crash or failover empties it", got, tc.says)
			}
			if tc.name != "logged" {
				return
			}
			logs := captureLog(t, s, time.Minute)
			src := newSource()
			wait := runSink(t, ctx, s, src)
			rs, ms := rows(1, 2, nil)
			src.push(t, ctx, rs[:1])
			waitFor(t, ctx, "row 1 acked", allAcked(ms[:1]))
			execAll(t, ctx, admin, "ALTER TABLE "+table+" SET UNLOGGED")
			// A new connection reads the table again.
			execAll(t, ctx, admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "+quoteLiteral(s.cfg.AppName))
			src.push(t, ctx, rs[1:])
			finishClean(t, ctx, src, wait, dl, ms)
			if n := strings.Count(logs.String(), "the table is unlogged now"); n != 1 {
				t.Fatalf("the table made unlogged logged %d times, want once:\n%s", n, logs)
			}
		})
	}
}

// A table first seen unlogged after the start was not logged at all:
// readTypes warned only of a table it had seen logged before (pinned),
// so one made unlogged while jetsink ran (created after the start, or
// dropped and made again UNLOGGED before a read saw it gone) went
// unsaid. Now the first sight of an unlogged table is logged once, by
// whichever sees it first: a committer's read of the types, or Run's look
// (logProblems), which does not log it again after a read, nor a read
// after it.
func TestTableFirstSeenUnloggedWarnsOnce(t *testing.T) {
	for _, tc := range []string{"made_after_start", "remade_unlogged", "read_then_look", "look_then_read"} {
		t.Run(tc, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			pg := testenv.Postgres(t)
			s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.CreateTable = false })
			logs := captureLog(t, s, time.Minute)
			admin, conn := pg.Conn(t), pg.Conn(t)
			table := s.table.Sanitize()
			read := func() {
				t.Helper()
				if _, _, err := s.readTypes(ctx, conn); err != nil {
					t.Fatal(err)
				}
			}
			look := func() {
				t.Helper()
				if _, err := s.logProblems(ctx, 10*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			const cols = " (stream text, stream_seq int8, payload jsonb)"
			switch tc {
			case "made_after_start":
				read() // no table yet
				execAll(t, ctx, admin, "CREATE UNLOGGED TABLE "+table+cols)
				read()
				read()
			case "remade_unlogged":
				execAll(t, ctx, admin, "CREATE TABLE "+table+cols)
				look()
				read() // logged: pins it
				execAll(t, ctx, admin, "DROP TABLE "+table+"; CREATE UNLOGGED TABLE "+table+cols)
				read()
				look()
				read()
			case "read_then_look":
				execAll(t, ctx, admin, "CREATE UNLOGGED TABLE "+table+cols)
				read()
				look()
				read()
			case "look_then_read":
				execAll(t, ctx, admin, "CREATE UNLOGGED TABLE "+table+cols)
				look()
				read()
				look()
			}
			// The look's line or the read's, once.
			if n := strings.Count(logs.String(), "is unlogged"); n != 1 {
				t.Fatalf("the unlogged table logged %d times, want once:\n%s", n, logs)
			}
		})
	}
}

// A plain table with inheritance children and no key index, in exactly-once
// mode: Init named the missing index, its fix a CREATE UNIQUE INDEX that
// would not help (the last key problem won), and check with create_table
// said that run makes the index, while run failed at every start. Now Init
// names the inheritance children, builds nothing, and the missing index is
// one Init does not make.
func TestInitNamesInheritanceBeforeMissingIndex(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Mode = ExactlyOnce; c.CreateTable = false })
	admin := pg.Conn(t)
	table, child := s.table.Sanitize(), pgx.Identifier{s.cfg.Table + "_c"}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE TABLE "+table+" (stream text NOT NULL, stream_seq bigint NOT NULL, payload jsonb); "+
		"CREATE TABLE "+child+" () INHERITS ("+table+")"); err != nil {
		t.Fatal(err)
	}
	probs, err := s.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(probs, func(p Problem) bool { return p.Kind == ProblemNoUniqueIndex })
	if i < 0 || probs[i].InitMakes() {
		t.Errorf("check: %v; want a missing unique index that Init does not make", probs)
	}
	err = s.Init(ctx)
	if !errors.Is(err, ErrNoKeyIndex) || !strings.Contains(fmt.Sprint(err), "INHERITS") || strings.Contains(fmt.Sprint(err), "CREATE UNIQUE INDEX") {
		t.Errorf("Init = %v; want ErrNoKeyIndex naming the INHERITS children, not a CREATE UNIQUE INDEX", err)
	}
	var indexes int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass", table).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != 0 {
		t.Errorf("Init built %d indexes on a table with inheritance children", indexes)
	}
}

// Of two type reads that overlap, the one that began last is kept, but it
// may have run its query first: one that saw the table still logged,
// kept after one that saw it unlogged, set it back to logged, so that the
// next read (a reconnect) warned a second time (TestCheckWarnsOfAnUnloggedTable
// logged twice now and then, its committers' first reads overlapping the
// ALTER). A REPEATABLE READ transaction begun before the ALTER plays that
// read here. The table made unlogged is logged once.
func TestTableMadeUnloggedWarnsOnce(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, nil)
	logs := captureLog(t, s, time.Minute)
	admin, conn, stale := pg.Conn(t), pg.Conn(t), pg.Conn(t)
	read := func(c *pgx.Conn) {
		t.Helper()
		if _, _, err := s.readTypes(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	read(conn) // pins the table, logged
	execAll(t, ctx, stale, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
	execAll(t, ctx, admin, "ALTER TABLE "+s.table.Sanitize()+" SET UNLOGGED")
	read(conn)  // unlogged now: warns
	read(stale) // began last, saw it logged
	read(conn)
	if n := strings.Count(logs.String(), "the table is unlogged now"); n != 1 {
		t.Fatalf("the table made unlogged logged %d times, want once:\n%s", n, logs)
	}
}

// A table written in at-least-once mode holds rows with the same key
// (redeliveries), and the operator switches to exactly-once. Init's
// CREATE UNIQUE INDEX failed with "create table ...: could not create
// unique index (SQLSTATE 23505)", no key, no fix (a restart loop under a
// supervisor), and check said "none needed: run makes it". Check now finds
// a key that is there twice and gives a DELETE that keeps one of each;
// Init names the index, PostgreSQL's DETAIL and the same DELETE; after it,
// Init builds the index. Also on a table partitioned by stream, where the
// index can be built.
func TestExactlyOnceOnATableWithDuplicateKeys(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	exec := func(q string) {
		t.Helper()
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, part := range []string{"", " PARTITION BY LIST (stream)"} {
		tbl := fmt.Sprintf("dup_%d", time.Now().UnixNano())
		exec("CREATE TABLE " + tbl + " (stream text NOT NULL, stream_seq int8 NOT NULL, payload jsonb)" + part)
		if part != "" {
			exec("CREATE TABLE " + tbl + "_d PARTITION OF " + tbl + " DEFAULT")
		}
		// EVENTS 1 stored three times, 2 once; OTHER 1 once.
		exec("INSERT INTO " + tbl + ` VALUES ('EVENTS', 2, '{}'), ('EVENTS', 1, '{"n": 1}'), ('OTHER', 1, '{}'),
			('EVENTS', 1, '{"n": 2}'), ('EVENTS', 1, '{"n": 3}')`)
		s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Table, c.Mode, c.CreateTable = tbl, ExactlyOnce, false })

		probs, err := s.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := lastProblem(probs, ProblemNoUniqueIndex)
		if found == nil {
			t.Fatalf("%q: problems %v, want no_unique_index", part, probs)
		}
		if found.InitMakes() || !strings.Contains(found.Message, `("stream", "stream_seq")=(EVENTS, 1)`) ||
			!strings.Contains(found.Fix, "keep one row of each key") || !strings.HasSuffix(found.Fix, "; then jetsink init") {
			t.Errorf("%q: InitMakes %v, %s; want a problem naming (EVENTS, 1), fixed by a DELETE, then init", part, found.InitMakes(), found)
		}

		err = s.Init(ctx)
		pgErr, _ := errors.AsType[*pgconn.PgError](err)
		if !errors.Is(err, ErrNoKeyIndex) || pgErr == nil || pgErr.Code != "23505" {
			t.Fatalf("%q: Init = %v; want ErrNoKeyIndex and PostgreSQL's 23505", part, err)
		}
		for _, want := range []string{`create unique index "` + tbl + `_stream_seq_key"`, "Key (stream, stream_seq)=(EVENTS, 1) is duplicated", found.Fix} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q: Init = %v; want it to say %q", part, err, want)
			}
		}

		// The DELETE as given, run: one row of each key is left.
		_, del, _ := strings.Cut(found.Fix, "): DELETE FROM ")
		del, _, _ = strings.Cut("DELETE FROM "+del, "; then jetsink init")
		exec(del)
		var rows, keys int
		if err := admin.QueryRow(ctx, "SELECT count(*), count(DISTINCT (stream, stream_seq)) FROM "+tbl).Scan(&rows, &keys); err != nil {
			t.Fatal(err)
		}
		if rows != 3 || keys != 3 {
			t.Fatalf("%q: after %s: %d rows of %d keys, want 3 of 3", part, del, rows, keys)
		}
		if err := s.Init(ctx); err != nil {
			t.Fatalf("%q: Init after the DELETE: %v", part, err)
		}
		if probs, err := s.Check(ctx); err != nil || len(probs) != 0 {
			t.Fatalf("%q: Check after Init: %v, %v; want none", part, probs, err)
		}
	}
}

// Check's scan for rows with the same key is bounded: past s.keyScan
// (here a lock another session holds) the problem says it did not look,
// and still says what to do if there are any. Run's look at start does no
// such scan.
func TestCheckDuplicateKeysNotScanned(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	admin := pg.Conn(t)
	tbl := fmt.Sprintf("dupscan_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE TABLE "+tbl+" (stream text, stream_seq int8, payload jsonb)"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "INSERT INTO "+tbl+" VALUES ('EVENTS', 1, '{}'), ('EVENTS', 1, '{}')"); err != nil {
		t.Fatal(err)
	}
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) { c.Table, c.Mode, c.CreateTable = tbl, ExactlyOnce, false })
	noIndex := func(probs []Problem, err error) Problem {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		p := lastProblem(probs, ProblemNoUniqueIndex)
		if p == nil {
			t.Fatalf("problems %v, want no_unique_index", probs)
		}
		return *p
	}

	// Run's start: no scan, the sentence of what may fail.
	logs := captureLog(t, s, time.Hour)
	if _, err := s.logProblems(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); strings.Contains(out, "(EVENTS, 1)") || !strings.Contains(out, "building it fails if the table holds rows with the same key") {
		t.Errorf("Run's look at start: %s; want no scan for the key that is there twice", out)
	}

	lock := pg.Conn(t)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE "+tbl+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	s.keyScan = 200 * time.Millisecond
	p := noIndex(s.Check(ctx))
	if !strings.Contains(p.Message, "which check did not look for: the table is too large to scan in 200ms") ||
		!strings.Contains(p.Message, "if the build fails (SQLSTATE 23505), keep one row of each key") ||
		!p.InitMakes() {
		t.Errorf("scan past keyScan: %s (InitMakes %v); want it not looked at, saying what to do if there are any", p, p.InitMakes())
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if p := noIndex(s.Check(ctx)); !strings.Contains(p.Message, "(EVENTS, 1)") {
		t.Errorf("once the lock is gone: %s; want the key that is there twice", p)
	}
}

// problemsOf is those of probs of kind k, in their order.
func problemsOf(probs []Problem, k ProblemKind) []Problem {
	var of []Problem
	for _, p := range probs {
		if p.Kind == k {
			of = append(of, p)
		}
	}
	return of
}

// lastProblem is the last of probs of kind k, nil if none is.
func lastProblem(probs []Problem, k ProblemKind) *Problem {
	var found *Problem
	for i := range probs {
		if probs[i].Kind == k {
			found = &probs[i]
		}
	}
	return found
}

// check's fix for a column of another type than the mapping's must not
// change the rows the table holds: a mapping type that writes the column
// as it is comes first, an ALTER is said to keep every value only where it
// does (run here on rows, in a session whose TimeZone is not UTC), and a
// timestamp without a zone is converted as UTC, not in the session's zone
// (a table moved from Telegraf, whose timestamps are UTC).
func TestCheckRetypeFixKeepsRows(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if _, err := conn.Exec(ctx, "SET TimeZone = 'Europe/Rome'"); err != nil {
		t.Fatal(err)
	}
	table := uniqueName(t)
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE EXTENSION IF NOT EXISTS citext")
	exec("CREATE DOMAIN " + table + "_pos AS int4 CHECK (VALUE > 0)")
	exec("CREATE TABLE " + table + " (stream text, stream_seq int8, payload jsonb, ts timestamp, amount float8, n int4, d date, " +
		"pi " + table + "_pos, ci citext)")
	exec("INSERT INTO " + table + " VALUES ('S', 1, '{}', '2026-12-07 12:00:00', 19.99, 2147483647, '2026-12-07', 1, 'x')")
	cols := []pipeline.Column{
		{Name: "ts", From: "json:ts", Type: pipeline.TypeTimestamptz},
		{Name: "amount", From: "json:amount", Type: pipeline.TypeInt8},
		{Name: "n", From: "json:n", Type: pipeline.TypeInt8},
		{Name: "d", From: "json:d", Type: pipeline.TypeTimestamptz},
		{Name: "pi", From: "json:pi", Type: pipeline.TypeInt8},
		{Name: "ci", From: "json:ci", Type: pipeline.TypeInt8},
	}
	check := func(cols []pipeline.Column) map[string]string {
		t.Helper()
		fixes := map[string]string{}
		for _, p := range checkTableNamed(t, ctx, pg.URL, table, cols...) {
			if p.Kind == ProblemTypeMismatch {
				fixes[p.Column] = p.Fix
			}
		}
		return fixes
	}
	fixes := check(cols)
	if len(fixes) != 6 {
		t.Fatalf("type mismatches %v, want ts, amount, n, d, pi and ci", fixes)
	}
	// The statement a fix gives, up to where its words begin.
	alter := func(col string) string {
		t.Helper()
		f := fixes[col]
		i := strings.Index(f, "ALTER TABLE")
		if i < 0 {
			t.Fatalf("%s: %q gives no ALTER", col, f)
		}
		f = f[i:]
		for _, end := range []string{" if the times", ", which"} {
			if j := strings.Index(f, end); j >= 0 {
				f = f[:j]
			}
		}
		return f
	}
	for col, want := range map[string]string{"amount": "type: float8 ", "n": "type: int4 ", "d": "type: date ", "pi": "type: int4 ", "ci": "type: text "} {
		if !strings.HasPrefix(fixes[col], want) {
			t.Errorf("%s: %q does not begin with %q", col, fixes[col], want)
		}
	}
	if strings.Contains(fixes["ts"], "type: ") || !strings.Contains(fixes["ts"], `USING "ts" AT TIME ZONE 'UTC'`) ||
		!strings.Contains(fixes["ts"], "no type of postgres.columns writes the column as it is") {
		t.Errorf("ts: %q, want no type (jetsink writes no timestamp) and the ALTER taking the times for UTC", fixes["ts"])
	}
	if !strings.Contains(fixes["amount"], "may round") || strings.Contains(fixes["amount"], "keeps every value") {
		t.Errorf("amount: %q, want the ALTER to a bigint said to round", fixes["amount"])
	}
	// A domain's ALTER keeps the values but leaves the domain's CHECK
	// behind: said.
	if !strings.Contains(fixes["pi"], "no longer of the domain") || strings.Contains(fixes["n"], "domain") {
		t.Errorf("pi: %q; n: %q: want the domain's ALTER, alone, to say the domain goes", fixes["pi"], fixes["n"])
	}
	for _, col := range []string{"n", "d", "pi"} {
		if !strings.Contains(fixes[col], "keeps every value") {
			t.Errorf("%s: %q, want the ALTER said to keep every value", col, fixes[col])
		}
	}
	// The mapping types the fixes name write the columns as they are.
	kept := slices.Clone(cols)
	kept[1].Type, kept[2].Type, kept[3].Type, kept[4].Type, kept[5].Type = pipeline.TypeFloat8, pipeline.TypeInt4, pipeline.TypeDate,
		pipeline.TypeInt4, pipeline.TypeText
	if f := check(kept); len(f) != 1 || f["ts"] == "" {
		t.Errorf("with the types the fixes name: mismatches %v, want ts's alone", f)
	}
	// The ALTERs said to keep every value, and ts's, keep the row's values.
	for _, col := range []string{"ts", "n", "d"} {
		exec(alter(col))
	}
	var ts, d time.Time
	var n int64
	if err := conn.QueryRow(ctx, "SELECT ts, n, d FROM "+table).Scan(&ts, &n, &d); err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC); !ts.Equal(want) {
		t.Errorf("ts after its fix: %v, want %v", ts, want)
	}
	if want := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC); !d.Equal(want) {
		t.Errorf("d after its fix: %v, want %v", d, want)
	}
	if n != 2147483647 {
		t.Errorf("n after its fix: %d, want 2147483647", n)
	}
	if f := check(cols[:4]); len(f) != 1 || f["amount"] == "" {
		t.Errorf("after the ALTERs: mismatches %v, want amount's alone", f)
	}
}

// A unique index on columns jetsink writes that two events can share (a
// device, not the stream's sequence) keeps the first event's row and
// dead-letters the others, in either mode (jetsink never updates a row:
// users of sinks with an upsert mode expect the latest): check warns of it
// in both modes, and does not send an at-least-once user to exactly-once
// as the fix for it, which skips only events delivered again. So for a
// sequence in the predicate alone, and beside a receive time (one a read,
// which may bring many events) or a delivery count; not beside the
// consumer's sequence (one a delivery), nor for the sequence with a value
// that differs a delivery (nothing to warn of).
func TestCheckWarnsOfAUniqueKeyEventsCanShare(t *testing.T) {
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			pg := testenv.Postgres(t)
			cfg := DefaultConfig()
			cfg.URL, cfg.Table, cfg.Mode = pg.URL, uniqueName(t), mode
			cols := append(slices.Clone(testCols),
				pipeline.Column{Name: "device", From: "json:device", Type: pipeline.TypeText},
				pipeline.Column{Name: "dl", From: "meta:delivered", Type: pipeline.TypeInt4},
				pipeline.Column{Name: "received_at", From: "meta:received_at", Type: pipeline.TypeTimestamptz},
				pipeline.Column{Name: "cs", From: "meta:consumer_seq", Type: pipeline.TypeInt8})
			s, err := New(ctx, cfg, cols, &recDL{}, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Init(ctx); err != nil {
				t.Fatal(err)
			}
			exec := func(q string) {
				t.Helper()
				if _, err := pg.Conn(t).Exec(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			tbl := s.table.Sanitize()
			exec("CREATE UNIQUE INDEX device_cs ON " + tbl + " (device, cs)")
			exec("CREATE UNIQUE INDEX seq_at ON " + tbl + " (stream, stream_seq, received_at)")
			if probs, err := s.Check(ctx); err != nil || len(probs) != 0 {
				t.Fatalf("unique indexes no two events share: %+v, %v", probs, err)
			}
			exec("CREATE UNIQUE INDEX device_key ON " + tbl + " (device)")
			exec("CREATE UNIQUE INDEX pred_seq ON " + tbl + " (device) WHERE stream_seq > 0")
			exec("CREATE UNIQUE INDEX device_dl ON " + tbl + " (device, dl)")
			exec("CREATE UNIQUE INDEX device_at ON " + tbl + " (device, received_at)")
			probs, err := s.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(probs) != 1 || probs[0].Kind != ProblemUniqueKey || !probs[0].Warning ||
				!strings.Contains(probs[0].Message, "never updates a row") || !strings.Contains(probs[0].Fix, "DISTINCT ON") {
				t.Fatalf("%+v, want one unique_key warning saying jetsink never updates a row, with a view for the latest", probs)
			}
			for _, name := range []string{"device_key (device)", "pred_seq (device)", "device_dl (device, dl)", "device_at (device, received_at)"} {
				if !strings.Contains(probs[0].Message, name) {
					t.Errorf("%q does not name %s", probs[0].Message, name)
				}
			}
			for _, name := range []string{"device_cs", "seq_at"} {
				if strings.Contains(probs[0].Message, name) {
					t.Errorf("%q names %s, which no two events share", probs[0].Message, name)
				}
			}
			if mode == AtLeastOnce && !strings.Contains(probs[0].Fix, "not other events with the same values") {
				t.Errorf("fix %q does not say exactly-once does not help with other events' values", probs[0].Fix)
			}
		})
	}
}

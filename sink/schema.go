package sink

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsink/jetsink/pipeline"
)

// pgType is a column type as PostgreSQL names it, with the OID of the type
// binary COPY writes: the column must have exactly this type, or one of
// compat, whose binary input reads the same bytes as the same value
// (varchar and char for text; a length limit, or char's padding, apply),
// or a type that reads applies to.
type pgType struct {
	name   string
	oid    uint32
	compat []uint32
	recv   string // the C function that reads the type's binary input
}

// accepts reports whether a column of type oid stores t's bytes as sent.
func (t pgType) accepts(oid uint32) bool { return oid == t.oid || slices.Contains(t.compat, oid) }

// reads reports whether a column of type ct stores t's bytes as sent: a
// type t accepts, a domain over one (its binary input is its base type's,
// then its constraints, which refuse a row as data; a length or precision
// of the domain applies as a column's would), or, unless byTypeOnly, a
// type whose binary input is the same built-in C function as t's (citext
// reads text's with textrecv). In exactly-once mode the INSERT from
// staging also needs a binary-coercible implicit or assignment cast from
// t to such a type (one WITHOUT FUNCTION: a function could change the
// value).
func (t pgType) reads(ct colType, exactlyOnce, byTypeOnly bool) bool {
	if t.accepts(ct.base) {
		return true
	}
	return !byTypeOnly && ct.recv != "" && ct.recv == t.recv && (!exactlyOnce || slices.Contains(ct.castFrom, t.oid))
}

var pgTypes = map[pipeline.Type]pgType{
	pipeline.TypeText:        {name: "text", oid: 25, compat: []uint32{1043, 1042}, recv: "textrecv"}, // varchar, char
	pipeline.TypeUUID:        {name: "uuid", oid: 2950, recv: "uuid_recv"},
	pipeline.TypeInt2:        {name: "smallint", oid: 21, recv: "int2recv"},
	pipeline.TypeInt4:        {name: "integer", oid: 23, recv: "int4recv"},
	pipeline.TypeInt8:        {name: "bigint", oid: 20, recv: "int8recv"},
	pipeline.TypeFloat4:      {name: "real", oid: 700, recv: "float4recv"},
	pipeline.TypeFloat8:      {name: "double precision", oid: 701, recv: "float8recv"},
	pipeline.TypeNumeric:     {name: "numeric", oid: 1700, recv: "numeric_recv"},
	pipeline.TypeBool:        {name: "boolean", oid: 16, recv: "boolrecv"},
	pipeline.TypeTimestamptz: {name: "timestamptz", oid: 1184, recv: "timestamptz_recv"},
	pipeline.TypeDate:        {name: "date", oid: 1082, recv: "date_recv"},
	pipeline.TypeJSONB:       {name: "jsonb", oid: 3802, recv: "jsonb_recv"},
	pipeline.TypeBytea:       {name: "bytea", oid: 17, recv: "bytearecv"},
}

// colType is a column's type as reads sees it: typ its own (a domain's
// for a column of a domain), base the type under any domains, mod the
// type modifier that applies (the column's, or the nearest domain's that
// has one: numeric(10,2), varchar(5)), recv the built-in C function that
// reads base's binary input ("" if it is not one), castFrom the types
// with a binary-coercible implicit or assignment cast to base.
// looseCollation names the column's collation if it is nondeterministic
// (an ICU collation that ignores case or accents: see Sink.looseKey), ""
// otherwise.
type colType struct {
	typ, base      uint32
	mod            int32
	recv           string
	castFrom       []uint32
	looseCollation string
}

// columnTypesSQL reads the colType of every column of the table whose
// OID is $1, or else of the one $2 names (none if there is no such table).
// The catalogs it reads need no privilege.
const columnTypesSQL = `WITH RECURSIVE t(name, typ, base, mod, coll) AS (
	SELECT attname::text, atttypid, atttypid, atttypmod, attcollation FROM pg_attribute
	WHERE attrelid = coalesce($1::oid, to_regclass($2::text)::oid) AND attnum > 0 AND NOT attisdropped
	UNION ALL
	SELECT t.name, t.typ, d.typbasetype, CASE WHEN t.mod >= 0 THEN t.mod ELSE d.typtypmod END, t.coll
	FROM t JOIN pg_type d ON d.oid = t.base AND d.typtype = 'd')
SELECT t.name, t.typ, t.base, t.mod, coalesce(p.prosrc, ''),
	ARRAY(SELECT castsource FROM pg_cast WHERE casttarget = t.base AND castcontext <> 'e' AND castmethod = 'b'),
	coalesce((SELECT collname::text FROM pg_collation WHERE oid = t.coll AND NOT collisdeterministic), '')
FROM t JOIN pg_type b ON b.oid = t.base AND b.typtype <> 'd'
	LEFT JOIN pg_proc p ON p.oid = b.typreceive AND p.prolang = 12 -- internal`

// looseKeyIndexSQL reports whether the table $1 names has a unique index
// that exactly-once's ON CONFLICT ($2, $3) takes for an arbiter (no
// expression, no predicate, those two key columns) with a
// nondeterministic collation (see uniqueIndex.looseCollation).
const looseKeyIndexSQL = `SELECT EXISTS (SELECT FROM pg_index i
	JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attname = $2
	JOIN pg_attribute b ON b.attrelid = i.indrelid AND b.attname = $3
	WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indisvalid AND i.indexprs IS NULL AND i.indpred IS NULL
		AND i.indnkeyatts = 2 AND (i.indkey::int2[])[0:1] @> ARRAY[a.attnum, b.attnum]
		AND EXISTS (SELECT FROM pg_collation c WHERE c.oid = ANY (i.indcollation::oid[]) AND NOT c.collisdeterministic))`

// columnTypes reads the types of the table's columns, by name: the table
// whose OID is rel, or if rel is nil the one its name finds on
// search_path.
func (s *Sink) columnTypes(ctx context.Context, c *pgx.Conn, rel *uint32) (map[string]colType, error) {
	rows, err := c.Query(ctx, columnTypesSQL, rel, s.tsql.Load().name)
	if err != nil {
		return nil, err
	}
	return scanColumnTypes(rows)
}

// scanColumnTypes reads columnTypesSQL's rows, and closes them.
func scanColumnTypes(rows pgx.Rows) (map[string]colType, error) {
	cts := map[string]colType{}
	var name string
	var ct colType
	_, err := pgx.ForEachRow(rows, []any{&name, &ct.typ, &ct.base, &ct.mod, &ct.recv, &ct.castFrom, &ct.looseCollation}, func() error {
		cts[name], ct = ct, colType{}
		return nil
	})
	return cts, err
}

// DDL returns the statements Init runs: CREATE TABLE IF NOT EXISTS with one
// column per mapped column (NOT NULL where Required) and, in exactly-once
// mode, CREATE UNIQUE INDEX IF NOT EXISTS on (stream, stream_seq). Every
// name is a quoted identifier.
func (s *Sink) DDL() []string { return s.ddl(s.table.Sanitize(), true) }

// ddl is DDL on table (a quoted, maybe schema-qualified name), without
// the CREATE TABLE unless create.
func (s *Sink) ddl(table string, create bool) []string {
	var ddl []string
	if create {
		defs := make([]string, len(s.cols))
		for i, c := range s.cols {
			defs[i] = pgx.Identifier{c.Name}.Sanitize() + " " + pgTypes[c.Type].name
			if c.Required {
				defs[i] += " NOT NULL"
			}
		}
		ddl = append(ddl, "CREATE TABLE IF NOT EXISTS "+table+" (\n\t"+strings.Join(defs, ",\n\t")+"\n)")
	}
	if s.cfg.Mode == ExactlyOnce {
		ddl = append(ddl, "CREATE UNIQUE INDEX IF NOT EXISTS "+pgx.Identifier{s.indexName()}.Sanitize()+
			" ON "+table+" ("+pgx.Identifier{s.streamC}.Sanitize()+", "+pgx.Identifier{s.seqC}.Sanitize()+")")
	}
	return ddl
}

// indexName is the exactly-once unique index's name, <table>_stream_seq_key
// cut to PostgreSQL's 63-byte limit on a UTF-8 boundary.
func (s *Sink) indexName() string { return withSuffix(s.table[len(s.table)-1], "_stream_seq_key") }

// withSuffix is base+suffix, base cut on a UTF-8 boundary to fit
// PostgreSQL's 63-byte names.
func withSuffix(base, suffix string) string {
	if len(base)+len(suffix) > 63 {
		n := 63 - len(suffix)
		for n > 0 && base[n]&0xC0 == 0x80 {
			n--
		}
		base = base[:n]
	}
	return base + suffix
}

// Init runs DDL in one transaction. Errors name the statement's object, not
// the connection string. In exactly-once mode it then checks that the
// table has its unique key index: CREATE UNIQUE INDEX IF NOT EXISTS does
// nothing when another relation has the index's name, and every batch
// would then fail (ErrNoKeyIndex; the message says what holds the name);
// so would they beside a DEFERRABLE unique constraint on the key
// (ErrNoKeyIndex too, saying how to make it not deferrable), and a key
// column or key index with a nondeterministic collation would skip
// events (ErrNoKeyIndex too: ProblemCollation; on such a column Init
// builds no index, which would not help), and a plain table with
// inheritance children would store redeliveries again (ErrNoKeyIndex too:
// ProblemInheritance; no index built either). Where no such index can be
// built (a table partitioned by another column, or by a key column in
// a collation other than its column's, at any level of its partitions, a
// foreign table, a view) Init builds none, and fails with
// ErrNoKeyIndex and check's words.
// When the table holds rows with the same key (at-least-once mode stores
// redeliveries again), the index's build fails: the error wraps
// ErrNoKeyIndex and PostgreSQL's, names the key, and gives a DELETE that
// keeps one row of each.
// It makes no table when one whose name differs in case alone is in the
// schema it would make it in (ErrInvalidConfig: postgres.table is
// quoted, and would name a second table beside it); beside one in
// another schema on search_path it makes the table, logging at Warn what
// to write if that one is meant; nor does it make one when the name
// finds a relation that is not a table, a foreign table or a view (a
// materialized view, say: ErrInvalidConfig; CREATE TABLE IF NOT EXISTS
// would do nothing, and every batch fail).
func (s *Sink) Init(ctx context.Context) error {
	var missing *Problem
	var indexFailed bool // the CREATE UNIQUE INDEX failed, not the CREATE TABLE
	var twinElsewhere *tableTwin
	err := s.withAdmin(ctx, func(c *pgx.Conn) error {
		// A table the name finds anywhere on search_path is the one:
		// CREATE TABLE IF NOT EXISTS looks in the first schema only, and
		// would make an empty table there that hides it (a schema named
		// after the role, "$user" first on the path). Asked before the
		// transaction: check's reads may fail (pg_settings refused) and
		// would abort it.
		ddl := s.DDL()
		var found, kind string
		var probs []Problem // exactly-once: what check finds in the table that is there
		err := c.QueryRow(ctx, `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.relkind::text
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.oid = to_regclass($1)`, s.table.Sanitize()).Scan(&found, &kind)
		switch {
		case err == nil && !strings.Contains("rpfv", kind):
			return fmt.Errorf("%w: not made: %s is not a table (pg_class.relkind %s), and CREATE TABLE IF NOT EXISTS would "+
				"leave it as it is: COPY cannot write into it, so every batch would fail; set postgres.table to a table",
				ErrInvalidConfig, found, kind)
		case err == nil:
			ddl = s.ddl(found, false)
			if s.cfg.Mode == ExactlyOnce {
				if probs, err = s.check(ctx, c, false); err != nil {
					return err
				}
				if len(probs) == 1 && probs[0].Kind == ProblemServerVersion && !probs[0].Warning {
					return fmt.Errorf("init: %s", probs[0]) // nothing else was looked at
				}
				has := func(k ProblemKind) bool {
					return slices.ContainsFunc(probs, func(p Problem) bool { return p.Kind == k })
				}
				// The key index Init cannot make (another relation
				// holds its name, the table's partition key is another
				// column, a foreign table or a view) is named below in
				// check's words; building it would fail, or do nothing.
				// On a read-only session the CREATE's own error says so.
				cannotIndex := !has(ProblemReadOnly) && slices.ContainsFunc(probs, func(p Problem) bool {
					return p.Kind == ProblemNoUniqueIndex && p.initCannot
				})
				if !has(ProblemNoUniqueIndex) || has(ProblemCollation) || has(ProblemInheritance) || cannotIndex {
					// A usable key index is there (a primary key on
					// the key, say): another would cost every insert,
					// and its build would block writes at start. Or a
					// key column compares with a nondeterministic
					// collation, or the table has inheritance
					// children: Init fails below whatever it builds,
					// and the build would block writes, for long on a
					// big table, for nothing.
					ddl = nil
				}
			}
		case errors.Is(err, pgx.ErrNoRows):
			// None: CREATE TABLE IF NOT EXISTS makes it, unless one whose
			// name differs in case alone is in the schema it would be
			// made in, which the operator meant (a second table beside
			// it would be read by nobody). One in another schema is
			// check's note: the table made is where the name says.
			twin, ok, terr := s.caseTwin(ctx, c)
			if terr != nil {
				return terr
			}
			if ok && twin.here {
				return fmt.Errorf("%w: not made: %s", ErrInvalidConfig, twin.problem(s))
			}
			if ok {
				twinElsewhere = &twin
			}
			err = nil
		default:
			return err
		}
		if len(ddl) > 0 {
			err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				for i, q := range ddl {
					if _, err := tx.Exec(ctx, q); err != nil {
						indexFailed = s.cfg.Mode == ExactlyOnce && i == len(ddl)-1
						return err
					}
				}
				return nil
			})
		}
		if err == nil && twinElsewhere != nil {
			// Made, as check's note said: run's create_table makes it
			// with no check run, and the table meant may be the twin,
			// which nothing then reads from.
			s.log.Warn("made the table where postgres.table names it; a table whose name differs in case alone is in another "+
				"schema on search_path (names in postgres.table are case-sensitive): if that is the table meant, write "+
				"postgres.table: "+twinElsewhere.write+" and drop the table made", "other", twinElsewhere.log)
		}
		if err != nil || s.cfg.Mode != ExactlyOnce {
			return err
		}
		if len(ddl) > 0 { // else probs is the table as it stays
			if probs, err = s.check(ctx, c, false); err != nil {
				return err
			}
		}
		for _, p := range probs {
			// A DEFERRABLE constraint on the key makes INSERT ... ON
			// CONFLICT fail even beside the index Init made; a key that
			// compares with a nondeterministic collation would skip
			// events as stored before; a table with inheritance
			// children has an index that does not span them (see
			// ProblemInheritance). The collation is named first, then
			// the inheritance: the index is made only once they are
			// fixed, so naming the missing index (and a CREATE UNIQUE
			// INDEX for its fix) would send the operator the wrong way.
			if p.Kind == ProblemNoUniqueIndex || p.Kind == ProblemDeferrableUnique || p.Kind == ProblemCollation || p.Kind == ProblemInheritance {
				if missing == nil || keyRank(p.Kind) < keyRank(missing.Kind) {
					missing = &p
				}
			}
		}
		return err
	})
	// The table by the name its statements use: schema-qualified once
	// Init's check has found it (pinTable).
	if err != nil && indexFailed {
		idx := pgx.Identifier{s.indexName()}.Sanitize()
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "23505" {
			// The table was written in at-least-once mode, which
			// stores a redelivered event again: its rows come first.
			return fmt.Errorf("create unique index %s on %s on %s: the table holds rows with the same key (%s; events stored "+
				"again: at-least-once mode writes a redelivered event twice); fix: %s (%w: %w)",
				idx, s.Table(), s.where, strings.TrimSuffix(pgErr.Detail, "."), s.dedupeFix(s.Table()), ErrNoKeyIndex, err)
		}
		return fmt.Errorf("create unique index %s on %s on %s: %w", idx, s.Table(), s.where, err)
	}
	if err != nil {
		return fmt.Errorf("create table %s on %s: %w", s.Table(), s.where, err)
	}
	if missing != nil {
		return fmt.Errorf("%w: %s on %s: %s", ErrNoKeyIndex, s.Table(), s.where, missing)
	}
	return nil
}

// dedupeFix is the fix for rows with the same exactly-once key in table
// (quoted): a DELETE that keeps one of each, then init.
func (s *Sink) dedupeFix(table string) string {
	st, sq := pgx.Identifier{s.streamC}.Sanitize(), pgx.Identifier{s.seqC}.Sanitize()
	return fmt.Sprintf("keep one row of each key (whichever: rows of one key differ if a trigger or a change of the mapping "+
		"came between their writes), in a transaction, in a maintenance window (it scans the table and locks the rows it "+
		"deletes: on a big table it takes long): DELETE FROM %s a USING %s b WHERE a.%s = b.%s AND a.%s = b.%s AND "+
		"a.ctid > b.ctid; then jetsink init", table, table, st, st, sq, sq)
}

// duplicateKey looks in table (quoted) for rows with the same exactly-once
// key, and returns the first found, as "(stream, seq)", or "". It scans
// the whole table, so the server ends it after s.keyScan
// (statement_timeout): then, or when the server refuses it (no SELECT
// privilege), unscanned says why, and err is nil.
func (s *Sink) duplicateKey(ctx context.Context, c *pgx.Conn, table string) (dup, unscanned string, err error) {
	st, sq := pgx.Identifier{s.streamC}.Sanitize(), pgx.Identifier{s.seqC}.Sanitize()
	err = pgx.BeginTxFunc(ctx, c, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", max(s.keyScan.Milliseconds(), 1))); err != nil {
			return err
		}
		// NULL keys are never equal to a unique index, nor to the DELETE.
		err := tx.QueryRow(ctx, "SELECT format('(%s, %s)', "+st+", "+sq+") FROM "+table+" WHERE "+st+" IS NOT NULL AND "+sq+
			" IS NOT NULL GROUP BY "+st+", "+sq+" HAVING count(*) > 1 LIMIT 1").Scan(&dup)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && ctx.Err() == nil {
		if pgErr.Code == "57014" {
			return "", fmt.Sprintf("the table is too large to scan in %s (or was locked that long)", s.keyScan), nil
		}
		return "", fmt.Sprintf("the scan failed (%v)", err), nil
	}
	if err != nil {
		return "", "", fmt.Errorf("look for rows with the same key in %s on %s: %w", table, s.where, err)
	}
	return dup, "", nil
}

// keyRank orders the key problems Init names (the first found of the
// lowest rank): a collation, then inheritance children, which keep Init
// from building the index, then the rest.
func keyRank(k ProblemKind) int {
	switch k {
	case ProblemCollation:
		return 0
	case ProblemInheritance:
		return 1
	}
	return 2
}

// ErrNoKeyIndex: Init ran, and the table still has no unique index on the
// exactly-once key that INSERT ... ON CONFLICT can use (or one that does
// not span the table's inheritance children: ProblemInheritance).
var ErrNoKeyIndex = errors.New("no usable unique index on the exactly-once key after init")

// ProblemKind classifies a Problem.
type ProblemKind string

// The problems Check finds.
const (
	ProblemTableMissing  ProblemKind = "table_missing"
	ProblemColumnMissing ProblemKind = "column_missing"
	ProblemTypeMismatch  ProblemKind = "type_mismatch"
	// ProblemNotNull: a NOT NULL column that nothing maps to and has no
	// default, or whose mapping is not required and may be NULL
	// (pipeline.Column.MayBeNull). A warning for a jsonb payload column,
	// NULL for a NATS KV bucket's delete and purge markers alone.
	ProblemNotNull       ProblemKind = "not_null"
	ProblemGenerated     ProblemKind = "generated"
	ProblemNoUniqueIndex ProblemKind = "no_unique_index"
	// ProblemDeferrableUnique: in exactly-once mode a unique or primary key
	// constraint on exactly (stream, stream_seq) is DEFERRABLE. INSERT ...
	// ON CONFLICT refuses it as an arbiter (SQLSTATE 55000), even beside a
	// non-deferrable index on the same columns, so every batch would fail.
	ProblemDeferrableUnique ProblemKind = "deferrable_unique"
	// ProblemCollation: in exactly-once mode a key column (meta:stream,
	// meta:stream_seq), or a unique index ON CONFLICT takes for an arbiter
	// on them, compares with a nondeterministic collation (an ICU one
	// that ignores case or accents). The events of streams "ORDERS" and
	// "orders" with the same sequence then share a key: the second would
	// be skipped as stored before. The sink refuses every batch (retried
	// until the collation changes), as for a column of type citext.
	ProblemCollation ProblemKind = "collation"
	// ProblemRowTrigger is a warning: the table, or a partition of it,
	// has enabled BEFORE INSERT row triggers. One that returns NULL leaves
	// its row out of the COPY, and the sink then dead-letters the whole
	// batch (code row_count); in exactly-once mode, only the rows missing
	// from the table. Also the warning for a view written through INSTEAD
	// OF INSERT row triggers: COPY counts each row handed to one as
	// stored, so a row it stores nowhere is acked and missing.
	ProblemRowTrigger ProblemKind = "row_trigger"
	// ProblemUniqueKey is a warning: the table has a unique index all of
	// whose columns jetsink writes. On the stream's sequence, in
	// at-least-once mode: an event delivered again (after a crash, a lost
	// ack or a COMMIT whose outcome was lost) then fails it and is
	// dead-lettered (code constraint) although its row is stored, each
	// such row found by bisecting its batch. On values two events can
	// share (a device), in either mode: jetsink never updates a row, so
	// the second such event is dead-lettered and the table keeps the first.
	ProblemUniqueKey ProblemKind = "unique_key"
	// ProblemPrivilege: jetsink's role lacks a privilege every batch needs:
	// INSERT on the table; in exactly-once mode also SELECT on it (the
	// missing-rows query, the stream checks) and TEMP on the database (the
	// staging table); and USAGE on each sequence that the default of a
	// column jetsink does not write calls (a serial key's nextval), which
	// a table's INSERT grant does not give. A trigger that writes another
	// table the role may not is not seen.
	ProblemPrivilege ProblemKind = "privilege"
	// ProblemReadOnly: the session is read-only (a standby in recovery, or
	// default_transaction_read_only for the role or database): every
	// batch fails with SQLSTATE 25006. The setting is read when a session
	// starts, so behind a pooler its fix includes renewing the pooler's
	// server sessions (PgBouncer's RECONNECT).
	ProblemReadOnly ProblemKind = "read_only"
	// ProblemRule: in exactly-once mode the table has UPDATE rules (even
	// disabled ones) or enabled INSERT rules. INSERT ... ON CONFLICT fails
	// on such a table (SQLSTATE 0A000), except under an INSERT rule DO
	// INSTEAD NOTHING, where it stores nothing. In at-least-once mode, a
	// warning of enabled INSERT rules: COPY does not run them, so they do
	// nothing for jetsink's rows.
	ProblemRule ProblemKind = "rule"
	// ProblemInheritance: in exactly-once mode the table is a plain table
	// with inheritance children (CREATE TABLE ... INHERITS). Its unique
	// index on the key does not span them: a row a BEFORE INSERT trigger
	// sends into a child is not seen by INSERT ... ON CONFLICT, and each
	// redelivery of its event would be stored again. The sink looks rows up
	// in the table itself alone (its rows' tableoid; of a partitioned table,
	// in its partitions too), so such a row is dead-lettered (code
	// row_count), not acked; Init fails, and builds no index. (A partitioned table's unique
	// index spans its partitions: not reported.)
	ProblemInheritance ProblemKind = "inheritance"
	// ProblemEncoding: the database's encoding is not UTF8. SQL_ASCII is an
	// error: PostgreSQL neither checks nor converts text there, and refuses
	// jsonb's \u escapes above 007F (SQLSTATE 0A000, a batch retried until
	// the database changes). Any other is a warning: jetsink's UTF-8 is
	// converted, and an event with a character the encoding lacks is
	// dead-lettered (SQLSTATE 22P05, after a bisection of its batch).
	ProblemEncoding ProblemKind = "encoding"
	// ProblemTypeModifier: a numeric or timestamptz column with a
	// precision, numeric(10,2) or timestamptz(3). PostgreSQL rounds the
	// values jetsink sends to it, and refuses a number with more digits
	// before the point than it allows (SQLSTATE 22003: the row is
	// dead-lettered after a bisection of its batch). A warning.
	ProblemTypeModifier ProblemKind = "type_modifier"
	// ProblemRelationKind: the table is a relation COPY cannot write
	// into: a view without an INSTEAD OF INSERT trigger, a materialized
	// view, a sequence. Every batch fails (SQLSTATE 42809).
	ProblemRelationKind ProblemKind = "relation_kind"
	// ProblemRowSecurity: row-level security applies to jetsink's role
	// on the table. PostgreSQL refuses COPY FROM into such a table
	// (SQLSTATE 0A000): in at-least-once mode every batch fails. In
	// exactly-once mode the policies apply to the INSERT from staging: a
	// row their WITH CHECK refuses (SQLSTATE 42501) is dead-lettered, code
	// refused, once other rows have committed; and a stored row the role
	// may not SELECT looks missing after a conflict (a warning).
	ProblemRowSecurity ProblemKind = "row_security"
	// ProblemServerTimeout is a warning: statement_timeout or
	// transaction_timeout for jetsink's sessions is under
	// shortServerTimeout. A batch that takes longer (a lock wait, a slow
	// disk, a large max_rows) is ended by the server and tried again in
	// smaller pieces (see committer.pieceTimedOut): nothing is lost, but
	// the pieces cost throughput.
	ProblemServerTimeout ProblemKind = "server_timeout"
	// ProblemAsyncCommit is a warning: synchronous_commit is off for
	// jetsink's sessions. A COMMIT then returns before its WAL is on disk,
	// jetsink acks the events, and a crash of the server loses the last
	// of them (up to three times wal_writer_delay) for good: acked, they
	// are not redelivered.
	ProblemAsyncCommit ProblemKind = "async_commit"
	// ProblemAsyncStandby is a warning: standbys stream from the server
	// and no COMMIT of jetsink's waits for one (synchronous_standby_names
	// is empty, or synchronous_commit is local for its sessions). A
	// failover to a standby loses the commits it had not received yet,
	// whose events jetsink has acked.
	ProblemAsyncStandby ProblemKind = "async_standby"
	// ProblemUnlogged is a warning: the table, or a partition of it, is
	// UNLOGGED. PostgreSQL empties such a table after a crash, and a
	// standby has none of its rows, so a crash or a failover loses rows
	// whose events jetsink has acked.
	ProblemUnlogged ProblemKind = "unlogged"
	// ProblemHostList is a warning: postgres.url names several hosts
	// without target_session_attrs. Each connection takes the first host
	// that answers, a standby too, and every batch on a standby fails
	// (SQLSTATE 25006) until that connection is replaced.
	ProblemHostList ProblemKind = "host_list"
	// ProblemTLSUnverified is a warning: postgres.url reaches a host that
	// is not this machine (a Unix socket, 127.0.0.0/8, ::1, localhost,
	// 0.0.0.0, ::)
	// with an sslmode that does not make sure of the server: disable;
	// allow and prefer (pgx's default, as libpq's), which connect in
	// plaintext when TLS is not used and check no certificate when it is,
	// sslrootcert or not; require without sslrootcert, whose TLS
	// checks no certificate; and verify-ca without sslrootcert, whose TLS
	// takes any certificate a CA of the system signed, for any name (pgx
	// checks the chain, never the name). Each host of a list is looked at. Whoever is on the way (a man in
	// the middle, a spoofed DNS name) can then ask for the password in
	// cleartext, and read and change the events.
	ProblemTLSUnverified ProblemKind = "tls_unverified"
	// ProblemIgnoredDefault is a warning: a mapped column that may get
	// NULL (pipeline.Column.MayBeNull) has a DEFAULT, which an event
	// without the value does not get: the COPY names every mapped column,
	// and sends NULL for it.
	ProblemIgnoredDefault ProblemKind = "ignored_default"
	// ProblemServerVersion is the server's release: before 12 an error
	// (the checks read catalog columns it lacks, such as
	// pg_attribute.attgenerated, and nothing else is looked at), 12 to 14
	// a warning (past their end of life, and not tested with jetsink).
	ProblemServerVersion ProblemKind = "server_version"
)

// versionProblem reports the problem with a server whose
// server_version_num is num, if it has one (see ProblemServerVersion).
func versionProblem(num int) (Problem, bool) {
	const fix = "upgrade PostgreSQL to 15 or newer"
	v := fmt.Sprintf("%d.%d", num/10000, num%10000) // 10 and newer: major, minor
	if num < 100000 {
		v = fmt.Sprintf("%d.%d.%d", num/10000, num/100%100, num%100) // 9.6.24 is 90624
	}
	switch {
	case num < 120000:
		return Problem{Kind: ProblemServerVersion, Fix: fix,
			Message: "PostgreSQL " + v + " is older than 12, which jetsink needs: its checks read catalog columns that release " +
				"lacks (pg_attribute.attgenerated), and it is tested with 15 and newer"}, true
	case num < 150000:
		return Problem{Kind: ProblemServerVersion, Warning: true, Fix: fix,
			Message: "PostgreSQL " + v + " is past its end of life (14, the last of 12 to 14, in November 2026) and not tested with " +
				"jetsink, which is tested with 15 and newer"}, true
	}
	return Problem{}, false
}

// shortServerTimeout: a statement_timeout or transaction_timeout under it
// is reported (ProblemServerTimeout). A batch of the default max_rows
// commits in tens of milliseconds on an idle server, but a busy one, or
// a lock held for a moment elsewhere, can take seconds.
const shortServerTimeout = 10 * time.Second

// keyScanTimeout bounds check's look for rows with the same exactly-once
// key where the key index is missing (duplicateKey), a full scan of the
// table: check should answer, and a big table's duplicates show when the
// index is built.
const keyScanTimeout = 10 * time.Second

// Problem is one difference between the mapping and the table.
type Problem struct {
	Kind    ProblemKind
	Column  string // "" for table-level problems
	Message string // what is wrong
	Fix     string // how to fix it (often a SQL statement)
	// Warning marks a problem the sink can write despite (ProblemRowTrigger,
	// ProblemUniqueKey).
	Warning bool
	// initCannot marks a missing table or unique index that Init (run
	// with postgres.create_table) would not make: see InitMakes.
	initCannot bool
	// unloggedTable marks the ProblemUnlogged of the table itself (not
	// its partitions'), which Run logs once (see Sink.warnUnlogged).
	unloggedTable bool
}

// InitMakes reports whether Init (jetsink init, or run with
// postgres.create_table: true) makes what p says is missing: the table, or
// exactly-once's unique index. Not when the table's schema does not exist
// or jetsink's role may not create in it, nor when another relation holds
// the index's name (CREATE ... IF NOT EXISTS would skip it).
func (p Problem) InitMakes() bool {
	return (p.Kind == ProblemTableMissing || p.Kind == ProblemNoUniqueIndex) && !p.initCannot
}

func (p Problem) String() string { return p.Message + "; fix: " + p.Fix }

// Check compares the mapping with the table in the database and returns
// every problem found (none: the sink can write). The error is for failing
// to ask (connection, permission), not for problems; with it come the
// warnings postgres.url alone gives (ProblemHostList,
// ProblemTLSUnverified), which matter most when the connect fails: a
// spoofed server refusing the login, say. It only reads: on an admin
// connection the server has ended since its last use (a restart,
// pg_terminate_backend), it asks again on a new one. In exactly-once mode,
// where the key index is missing, it scans the table for rows with the
// same key, which would fail Init's CREATE UNIQUE INDEX, for 10 s at most
// (the problem says when it did not finish); Run's look at start does not.
func (s *Sink) Check(ctx context.Context) ([]Problem, error) { return s.checkAll(ctx, true) }

// checkAll is Check; scan looks for rows with the same exactly-once key
// where the key index is missing (duplicateKey), a full scan: Check asks
// for it, Run's look at start does not (logProblems), nor does Init, whose
// CREATE UNIQUE INDEX is that scan.
func (s *Sink) checkAll(ctx context.Context, scan bool) ([]Problem, error) {
	var probs []Problem
	err := s.readAdmin(ctx, func(c *pgx.Conn) error {
		var err error
		probs, err = s.check(ctx, c, scan)
		return err
	})
	if err != nil {
		probs = nil // what it found before the error is not the whole
	}
	return append(probs, s.URLProblems()...), err
}

// URLProblems returns the warnings postgres.url alone gives, without
// connecting: ProblemHostList and ProblemTLSUnverified. Check returns
// them too, with its error as well; init, whose connect may fail before
// any Check, says them beside that error.
func (s *Sink) URLProblems() []Problem {
	var probs []Problem
	if hosts := hostsOf(&s.connCfg.Config); s.hostList {
		probs = append(probs, Problem{Kind: ProblemHostList, Warning: true,
			Message: fmt.Sprintf("postgres.url names %d hosts (%s) without target_session_attrs: a connection takes the first one that "+
				"answers, a standby too (after a failover, the old primary rejoined as one), where every batch fails with SQLSTATE 25006",
				len(hosts), strings.Join(hosts, ",")),
			Fix: "add target_session_attrs=read-write to postgres.url; if every host reaches the same primary (poolers in front of it), this does not apply"})
	}
	if s.tlsUnverified.Kind != "" {
		probs = append(probs, s.tlsUnverified)
	}
	return probs
}

// check is checkAll on c, but for what postgres.url alone says (the host
// list, TLS).
func (s *Sink) check(ctx context.Context, c *pgx.Conn, scan bool) ([]Problem, error) {
	var num int
	if err := c.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		return nil, fmt.Errorf("check the server version of %s: %w", s.where, err)
	}
	vp, old := versionProblem(num)
	if old && !vp.Warning {
		return []Problem{vp}, nil // the checks below would fail on its catalog
	}
	probs, err := s.checkTable(ctx, c, scan)
	if old {
		probs = append(probs, vp)
	}
	if slices.ContainsFunc(probs, func(p Problem) bool { return p.Kind == ProblemReadOnly }) {
		// Init can make nothing on a read-only session (a standby): check
		// must not say "run makes it" of a missing table there.
		for i := range probs {
			probs[i].initCannot = true
		}
	}
	return probs, err
}

// checkTable is check but for what a read-only session means for Init.
func (s *Sink) checkTable(ctx context.Context, c *pgx.Conn, scan bool) ([]Problem, error) {
	tname := s.tsql.Load().name // the table the batches write, once a connection has found it
	var enc string
	if err := c.QueryRow(ctx, "SELECT current_setting('server_encoding')").Scan(&enc); err != nil {
		return nil, fmt.Errorf("check the encoding of %s: %w", s.where, err)
	}
	encProblem, badEnc := encodingProblem(enc)
	// The table the batches write: the one the name finds now, pinned
	// (as a committer's first read does) unless a read or a check found
	// one before, so that run, in this process, writes the table checked
	// here, and check names it by its schema-qualified name.
	found, err := scanFoundTable(c.QueryRow(ctx, foundTableSQL, tname))
	if err != nil {
		return nil, fmt.Errorf("check table %s on %s: %w", tname, s.where, err)
	}
	if found.name == nil {
		// What refuses every batch, and the server's settings, whatever
		// the table: a standby takes no CREATE TABLE either.
		probs, err := s.checkWritable(ctx, c, nil)
		if err != nil {
			return nil, err
		}
		if badEnc {
			probs = append(probs, encProblem)
		}
		p, err := s.tableMissing(ctx, c)
		if err != nil {
			return nil, err
		}
		return append(probs, p), nil
	}
	s.typesMu.Lock()
	s.pinTable(found.name)
	s.typesMu.Unlock()
	tname = found.name.Sanitize()
	oid := &found.oid
	var kind string
	var insteadOf, partitions, unlogged bool
	var unloggedParts *string // the unlogged partitions, if any
	if err := c.QueryRow(ctx, `SELECT relkind::text, EXISTS (SELECT FROM pg_trigger WHERE tgrelid = $1 AND tgenabled <> 'D'
		AND tgtype & 64 <> 0 AND tgtype & 4 <> 0), EXISTS (SELECT FROM pg_inherits WHERE inhparent = $1),
		c.relpersistence = 'u',
		(SELECT string_agg(p.relid::regclass::text, ', ' ORDER BY p.relid::regclass::text) FROM pg_partition_tree($1) p
			JOIN pg_class pc ON pc.oid = p.relid WHERE p.relid <> $1 AND pc.relpersistence = 'u')
		FROM pg_class c WHERE c.oid = $1`, *oid).Scan(&kind, &insteadOf, &partitions,
		&unlogged, &unloggedParts); err != nil {
		return nil, fmt.Errorf("check table %s on %s: %w", tname, s.where, err)
	}
	var kindProblem []Problem
	if unlogged {
		kindProblem = append(kindProblem, Problem{Kind: ProblemUnlogged, Warning: true,
			Message: fmt.Sprintf("%s is unlogged: a crash or failover empties it after jetsink has acked its events, "+
				"which are then in neither the table nor the stream's unacked events", tname),
			Fix: fmt.Sprintf("ALTER TABLE %s SET LOGGED", tname), unloggedTable: true})
	}
	if unloggedParts != nil {
		kindProblem = append(kindProblem, Problem{Kind: ProblemUnlogged, Warning: true,
			Message: fmt.Sprintf("partitions of %s are unlogged (%s): a crash or failover empties them after jetsink has acked their events, "+
				"which are then in neither the table nor the stream's unacked events", tname, *unloggedParts),
			Fix: "ALTER TABLE <partition> SET LOGGED, for each"})
	}
	switch kind {
	case "p":
		if !partitions {
			kindProblem = append(kindProblem, Problem{Kind: ProblemRelationKind,
				Message: fmt.Sprintf("%s is a partitioned table without partitions: every row fails (SQLSTATE 23514, no partition of "+
					"relation found for row), so every batch would be retried and nothing stored", tname),
				Fix: fmt.Sprintf("CREATE TABLE ... PARTITION OF %s FOR VALUES ... (or DEFAULT)", tname)})
		}
	case "r", "f": // a table, a foreign table
		if partitions && s.cfg.Mode == ExactlyOnce {
			kindProblem = append(kindProblem, Problem{Kind: ProblemInheritance,
				Message: fmt.Sprintf("%s has inheritance children (INHERITS), which its unique index on the exactly-once key does not "+
					"span: a row a trigger sends into a child is not seen by INSERT ... ON CONFLICT, so each redelivery of its event "+
					"would be stored again; jetsink looks rows up in %s alone, and dead-letters such rows (code row_count)", tname, tname),
				Fix: "write into a table without inheritance children (a partitioned table's unique index spans its partitions), " +
					"or use postgres.mode: at-least-once"})
		}
	case "v":
		if !insteadOf {
			kindProblem = append(kindProblem, Problem{Kind: ProblemRelationKind,
				Message: fmt.Sprintf("%s is a view without an INSTEAD OF INSERT trigger: COPY cannot write into it (SQLSTATE 42809), "+
					"so every batch would fail and be retried", tname),
				Fix: "set postgres.table to the table the view reads, or give the view an INSTEAD OF INSERT trigger"})
			break
		}
		// COPY counts each row it hands an INSTEAD OF trigger as stored,
		// whatever the trigger does with it: the row count that finds a
		// row a BEFORE trigger drops (row_count) cannot find this one.
		triggers, err := s.catalogNames(ctx, c, "triggers", `SELECT tgname::text FROM pg_trigger
			WHERE tgrelid = $1 AND NOT tgisinternal AND tgtype & 69 = 69 AND tgenabled <> 'D' ORDER BY tgname`, *oid)
		if err != nil {
			return nil, err
		}
		kindProblem = append(kindProblem, Problem{Kind: ProblemRowTrigger, Warning: true,
			Message: fmt.Sprintf("%s is a view written through INSTEAD OF INSERT triggers (%s): COPY counts every row it hands "+
				"them as stored, so a row they store nowhere (RETURN NULL, a branch that inserts nothing) is acked and missing, "+
				"and jetsink cannot tell", tname, strings.Join(triggers, ", ")),
			Fix: "make sure the triggers store every row they are given, or write into the table itself (a BEFORE INSERT " +
				"trigger there can do the view's work: a row it drops is found and dead-lettered, code row_count)"})
	default:
		kindProblem = append(kindProblem, Problem{Kind: ProblemRelationKind,
			Message: fmt.Sprintf("%s is not a table (pg_class.relkind %s): COPY cannot write into it, so every batch would fail and be retried",
				tname, kind),
			Fix: "set postgres.table to a table"})
	}
	type attr struct {
		typ                       uint32
		typmod                    int32
		format                    string
		notNull, hasDefault, auto bool
		num                       int16
		generated, always         bool // GENERATED ALWAYS AS (expr) STORED; GENERATED ALWAYS AS IDENTITY
	}
	attrs := map[string]attr{}
	rows, err := c.Query(ctx, `SELECT attname, attnum, atttypid, atttypmod, format_type(atttypid, atttypmod), attnotnull, atthasdef,
		attidentity <> '' OR attgenerated <> '', attgenerated <> '', attidentity = 'a'
		FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`, *oid)
	if err != nil {
		return nil, fmt.Errorf("check columns of %s on %s: %w", tname, s.where, err)
	}
	for rows.Next() {
		var name string
		var a attr
		if err := rows.Scan(&name, &a.num, &a.typ, &a.typmod, &a.format, &a.notNull, &a.hasDefault, &a.auto, &a.generated, &a.always); err != nil {
			rows.Close()
			return nil, fmt.Errorf("check columns of %s on %s: %w", tname, s.where, err)
		}
		attrs[name] = a
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("check columns of %s on %s: %w", tname, s.where, err)
	}

	cts, err := s.columnTypes(ctx, c, oid)
	if err != nil {
		return nil, fmt.Errorf("check column types of %s on %s: %w", tname, s.where, err)
	}
	probs, err := s.checkWritable(ctx, c, oid)
	if err != nil {
		return nil, err
	}
	probs = append(probs, kindProblem...)
	if badEnc {
		probs = append(probs, encProblem)
	}
	mapped := map[string]pipeline.Column{}
	looseKeys := false // a key column's collation is nondeterministic: its indexes' too, by default
	for _, c := range s.cols {
		mapped[c.Name] = c
		want := pgTypes[c.Type]
		col := pgx.Identifier{c.Name}.Sanitize()
		a, ok := attrs[c.Name]
		switch {
		case !ok:
			p := Problem{Kind: ProblemColumnMissing, Column: c.Name,
				Message: fmt.Sprintf("column %s of %s does not exist", col, tname),
				Fix:     fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", tname, col, want.name)}
			// One whose name differs in case alone is the one meant
			// (jetsink quotes names: "Dev" is not dev): a second column
			// would be one nobody reads.
			columns := slices.Sorted(maps.Keys(attrs))
			if twins := caseTwinColumns(c.Name, columns, s.cols); len(twins) > 0 {
				p.Message, p.Fix = s.columnTwinProblem(p.Message, c.Name, twins, columns, tname)
			}
			probs = append(probs, p)
		case a.generated:
			probs = append(probs, Problem{Kind: ProblemGenerated, Column: c.Name,
				Message: fmt.Sprintf("column %s of %s is a generated column: jetsink cannot write it (SQLSTATE 42P10 from COPY, 428C9 from exactly-once's INSERT), so every batch would fail and be retried", col, tname),
				Fix:     fmt.Sprintf("remove column %s from postgres.columns; PostgreSQL computes it", c.Name)})
		case a.always && s.cfg.Mode == ExactlyOnce:
			probs = append(probs, Problem{Kind: ProblemGenerated, Column: c.Name,
				Message: fmt.Sprintf("column %s of %s is GENERATED ALWAYS AS IDENTITY: exactly-once's INSERT cannot write it (SQLSTATE 428C9), so every batch would fail and be retried", col, tname),
				Fix:     fmt.Sprintf("remove column %s from postgres.columns, or ALTER TABLE %s ALTER COLUMN %s SET GENERATED BY DEFAULT", c.Name, tname, col)})
		case s.looseKey(c, cts[c.Name]):
			looseKeys = true
			probs = append(probs, Problem{Kind: ProblemCollation, Column: c.Name,
				Message: fmt.Sprintf("column %s of %s, part of exactly-once's key, compares with the nondeterministic collation %s: events whose keys "+
					"it takes for equal (streams \"ORDERS\" and \"orders\", say) would be skipped as stored before and acked, so jetsink "+
					"stores nothing in this table until it changes (each batch is retried)", col, tname, pgx.Identifier{cts[c.Name].looseCollation}.Sanitize()),
				Fix: fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN %s TYPE %s COLLATE "default"`, tname, col, a.format)})
		case !s.columnReads(c, cts[c.Name]):
			what := "so jetsink stores nothing in this table until they match (each batch is retried)"
			probs = append(probs, Problem{Kind: ProblemTypeMismatch, Column: c.Name,
				Message: fmt.Sprintf("column %s of %s is %s but the mapping writes %s: binary COPY sends %s's bytes, which a column "+
					"of another type reads as another value or refuses, %s", col, tname, a.format, want.name, want.name, what),
				Fix: s.retypeFix(c, cts[c.Name], a.format, tname)})
		case a.notNull && c.MayBeNull() && c.From == "payload":
			// A jsonb payload column is NULL for a NATS KV bucket's delete
			// and purge markers alone: a warning, as most streams carry
			// none, and a table that passed check before still does.
			probs = append(probs, Problem{Kind: ProblemNotNull, Column: c.Name, Warning: true,
				Message: fmt.Sprintf("column %s of %s is NOT NULL but its mapping (payload, jsonb) is not required: a NATS KV bucket's delete "+
					"or purge marker (an empty body with KV-Operation: DEL or PURGE) stores NULL there, so each one fails its batch "+
					"(SQLSTATE 23502) and is dead-lettered by the database (code constraint), one batch bisect at a time%s",
					col, tname, ignoredDefaultNote(a.hasDefault && !a.auto)),
				Fix: fmt.Sprintf("if the stream carries no KV markers, nothing; to keep them out, set required: true on column %s in "+
					"postgres.columns (jetsink then dead-letters each as required_missing, without failing a batch); to store them, "+
					"ALTER TABLE %s ALTER COLUMN %s DROP NOT NULL", c.Name, tname, col)})
		case a.notNull && c.MayBeNull():
			// Not a source that always has a value (meta:stream_seq,
			// meta:subject, a text or bytea payload, ...): those need no
			// required.
			probs = append(probs, Problem{Kind: ProblemNotNull, Column: c.Name,
				Message: fmt.Sprintf("column %s of %s is NOT NULL but its mapping is not required: an event without it is dead-lettered by the database, one batch bisect at a time%s", col, tname, ignoredDefaultNote(a.hasDefault && !a.auto)),
				Fix:     fmt.Sprintf("set required: true on column %s in postgres.columns, or ALTER TABLE %s ALTER COLUMN %s DROP NOT NULL", c.Name, tname, col)})
		case a.hasDefault && !a.auto && c.MayBeNull():
			without := "an event without " + c.From
			if c.From == "payload" {
				without = "a NATS KV bucket's delete or purge marker (an empty body with KV-Operation: DEL or PURGE)"
			}
			probs = append(probs, Problem{Kind: ProblemIgnoredDefault, Column: c.Name, Warning: true,
				Message: fmt.Sprintf("column %s of %s has a DEFAULT, but %s stores NULL there: the COPY names every mapped column", col, tname, without),
				Fix: fmt.Sprintf("if every event has it, set required: true on column %s; to store the default instead, a BEFORE INSERT trigger can set "+
					"NEW.%s := coalesce(NEW.%s, <the default>)", c.Name, col, col)})
		}
		// timestamptz(6) is what timestamptz keeps anyway: no rounding.
		// ct: a domain's base type and modifier, as a column's.
		if ct := cts[c.Name]; ok && ct.base == want.oid && ct.mod >= 0 && (c.Type != pipeline.TypeTimestamptz || ct.mod < 6) {
			probs = append(probs, typeModifierProblem(tname, c.Name, a.format, c.Type))
		}
		if ct := cts[c.Name]; ok && ct.base != want.oid && want.accepts(ct.base) && (ct.mod >= 0 || ct.base == 1042) {
			probs = append(probs, Problem{Kind: ProblemTypeModifier, Column: c.Name, Warning: true,
				Message: fmt.Sprintf("column %s of %s is %s: PostgreSQL refuses a longer text (SQLSTATE 22001), which is dead-lettered "+
					"(code data) after a bisection of its batch, but for one longer only by spaces at its end, which it cuts off unsaid; "+
					"and it pads a shorter one in char(n) with spaces", col, tname, a.format),
				Fix: fmt.Sprintf("if every value fits, nothing; to store any length as sent, ALTER TABLE %s ALTER COLUMN %s TYPE text", tname, col)})
		}
	}
	for name, a := range attrs {
		if _, ok := mapped[name]; ok || !a.notNull || a.hasDefault || a.auto {
			continue
		}
		col := pgx.Identifier{name}.Sanitize()
		probs = append(probs, Problem{Kind: ProblemNotNull, Column: name,
			Message: fmt.Sprintf("column %s of %s is NOT NULL without a default and nothing maps to it: every insert fails", col, tname),
			Fix:     fmt.Sprintf("map a value to %s in postgres.columns, give it a DEFAULT, or ALTER TABLE %s ALTER COLUMN %s DROP NOT NULL", name, tname, col)})
	}
	triggers, err := s.rowTriggers(ctx, c, *oid)
	if err != nil {
		return nil, err
	}
	if len(triggers) > 0 {
		msg := fmt.Sprintf("%s has BEFORE INSERT row triggers (%s): if one returns NULL, its row is left out of the COPY, "+
			"and jetsink dead-letters every row of that batch (code row_count) since it cannot tell which rows are missing",
			tname, strings.Join(triggers, ", "))
		fix := "make sure these triggers never return NULL for jetsink's rows, or write into a table without them"
		if s.cfg.Mode == ExactlyOnce {
			msg = fmt.Sprintf("%s has BEFORE INSERT row triggers (%s): a row one returns NULL for is missing after the "+
				"INSERT, and jetsink dead-letters it (code row_count); one that stores the row elsewhere (into another "+
				"table) and returns NULL, or changes %s or %s, gets past INSERT ... ON CONFLICT, which runs after the "+
				"trigger: a redelivered event would be stored again, and is dead-lettered (code row_count) only when jetsink "+
				"looks its key up in %s and finds it missing",
				tname, strings.Join(triggers, ", "), s.streamC, s.seqC, tname)
			fix = "make sure these triggers never return NULL for jetsink's rows, never store them elsewhere, nor change their key; " +
				"or write into a table without them"
		}
		probs = append(probs, Problem{Kind: ProblemRowTrigger, Warning: true, Message: msg, Fix: fix})
	}
	idx, err := s.uniqueIndexes(ctx, c, *oid)
	if err != nil {
		return nil, err
	}
	names := map[int16]string{}
	sources := map[string]string{}
	for name, a := range attrs {
		if col, ok := mapped[name]; ok {
			names[a.num] = name
			sources[name] = col.From
		}
	}
	eventKeys, sharedKeys := writtenUniqueIndexes(idx, names, sources)
	if s.cfg.Mode == AtLeastOnce && len(eventKeys) > 0 {
		probs = append(probs, Problem{Kind: ProblemUniqueKey, Warning: true,
			Message: fmt.Sprintf("%s has unique indexes on columns jetsink writes (%s): in at-least-once mode an event "+
				"delivered again (after a crash, a lost ack, or a COMMIT whose outcome was lost) fails the key and is "+
				"dead-lettered (code constraint) although its row is stored, and each such row costs a bisection of its "+
				"batch (about log2(rows) COPYs)", tname, strings.Join(eventKeys, ", ")),
			Fix: "use postgres.mode: exactly-once, which skips events stored before by (stream, stream_seq), " +
				"or drop the unique indexes if duplicate rows are acceptable"})
	}
	if len(sharedKeys) > 0 {
		// Not the stream's sequence: two events can hold the same values
		// (a device, an order id), and jetsink never updates a row. Users
		// of sinks with an upsert mode (Kafka Connect's JDBC sink, an ON
		// CONFLICT DO UPDATE) expect the latest row per key.
		msg := fmt.Sprintf("%s has unique indexes on columns jetsink writes that two events can share (%s): jetsink only "+
			"inserts, it never updates a row, so an event whose values such an index holds already is refused by the database "+
			"(SQLSTATE 23505) and dead-lettered (code constraint), each costing a bisection of its batch (about log2(rows) "+
			"COPYs): the table keeps the first event's row for each key, not the latest", tname, strings.Join(sharedKeys, ", "))
		fix := "if each event's values are its own (an event id its publisher sets once), nothing: a copy of one is " +
			"dead-lettered; to keep the latest row per key, drop the index, store every event, and read the latest through " +
			"a view (SELECT DISTINCT ON (key) ... ORDER BY key, published_at DESC)"
		if s.cfg.Mode == AtLeastOnce {
			msg += "; in at-least-once mode an event delivered again fails it too, although its row is stored"
			fix += "; postgres.mode: exactly-once skips events delivered again, not other events with the same values"
		} else {
			msg += "; exactly-once's ON CONFLICT skips only events stored before by (stream, stream_seq)"
		}
		probs = append(probs, Problem{Kind: ProblemUniqueKey, Warning: true, Message: msg, Fix: fix})
	}
	if s.cfg.Mode == AtLeastOnce {
		rules, err := s.catalogNames(ctx, c, "rules", `SELECT rulename::text FROM pg_rewrite
			WHERE ev_class = $1 AND ev_type = '3' AND ev_enabled IN ('O', 'A') ORDER BY rulename`, *oid)
		if err != nil {
			return nil, err
		}
		if len(rules) > 0 {
			probs = append(probs, Problem{Kind: ProblemRule, Warning: true,
				Message: fmt.Sprintf("%s has INSERT rules (%s), which COPY does not run: jetsink's rows go into %s as they are, "+
					"and the rules do nothing for them (no DO INSTEAD, no DO ALSO)", tname, strings.Join(rules, ", "), tname),
				Fix: "do the rules' work in a trigger (COPY runs triggers: an AFTER INSERT one for a DO ALSO), or drop the rules"})
		}
	}
	if s.cfg.Mode == ExactlyOnce {
		rules, err := s.conflictRules(ctx, c, *oid)
		if err != nil {
			return nil, err
		}
		if len(rules) > 0 {
			probs = append(probs, Problem{Kind: ProblemRule,
				Message: fmt.Sprintf("%s has UPDATE or INSERT rules (%s): exactly-once's INSERT ... ON CONFLICT fails on it "+
					"(SQLSTATE 0A000, retried until the table changes), or under an INSERT rule DO INSTEAD NOTHING stores nothing",
					tname, strings.Join(rules, ", ")),
				Fix: "drop the rules (DROP RULE name ON " + tname + "; an UPDATE rule blocks it even when disabled), " +
					"or use at-least-once mode, where COPY does not run rules (so they do not do what they were made for either)"})
		}
		usable, deferrable, loose := keyIndexes(idx, attrs[s.streamC].num, attrs[s.seqC].num)
		key := "(" + pgx.Identifier{s.streamC}.Sanitize() + ", " + pgx.Identifier{s.seqC}.Sanitize() + ")"
		for _, u := range loose {
			if looseKeys {
				break // fixed with the column
			}
			fix := "DROP INDEX " + u.qualified + "; then " + s.DDL()[1]
			if u.con != "" {
				// Not expected: PostgreSQL gives a constraint's index
				// its columns' collations (ADD CONSTRAINT ... USING
				// INDEX refuses another), so the column is reported
				// above. Should one come: re-collate the key's columns,
				// as there, since dropping the constraint fails while a
				// foreign key depends on it.
				var alters []string
				for _, k := range []string{s.streamC, s.seqC} {
					if mapped[k].Type == pipeline.TypeText {
						alters = append(alters, fmt.Sprintf(`ALTER COLUMN %s TYPE %s COLLATE "default"`, pgx.Identifier{k}.Sanitize(), attrs[k].format))
					}
				}
				fix = "ALTER TABLE " + tname + " " + strings.Join(alters, ", ")
			}
			probs = append(probs, Problem{Kind: ProblemCollation,
				Message: fmt.Sprintf("the unique index %s on %s %s compares with a nondeterministic collation: exactly-once's "+
					"INSERT ... ON CONFLICT takes it for an arbiter, and would skip events whose keys it takes for equal (streams "+
					"\"ORDERS\" and \"orders\", say) as stored before, so jetsink stores nothing in this table until it changes "+
					"(each batch is retried)", u.qualified, tname, key),
				Fix: fix})
		}
		for _, k := range deferrable {
			con := pgx.Identifier{k.name}.Sanitize()
			probs = append(probs, Problem{Kind: ProblemDeferrableUnique,
				Message: fmt.Sprintf("the unique constraint %s on %s %s is DEFERRABLE, and must not be: exactly-once's "+
					"INSERT ... ON CONFLICT refuses a deferrable constraint as its arbiter (SQLSTATE 55000), even beside a "+
					"non-deferrable unique index, so every batch would fail and be retried until the constraint changes", con, tname, key),
				Fix: "ALTER TABLE " + tname + " DROP CONSTRAINT " + con + ", ADD CONSTRAINT " + con + " " + k.immediateDef})
		}
		if !usable && len(deferrable) == 0 {
			fix := s.DDL()[1]
			taken, err := s.indexNameTaken(ctx, c, *oid)
			if err != nil {
				return nil, err
			}
			if taken != "" {
				fix = taken + "; then " + fix
			}
			msg := fmt.Sprintf("exactly-once mode needs a unique index on %s %s and there is none", tname, key)
			// Whether Init's CREATE UNIQUE INDEX can make it: not on a
			// foreign table or a view (42809), nor on a table partitioned
			// by another column or an expression (0A000), nor on a table
			// with inheritance children, on which Init fails without
			// building it (ProblemInheritance).
			cannot := taken != "" || kind == "f" || kind == "v" || kind == "r" && partitions
			if kind == "p" {
				other, part, by, coll, err := s.otherPartitionKey(ctx, c, *oid)
				if err != nil {
					return nil, fmt.Errorf("check the partition key of %s on %s: %w", tname, s.where, err)
				}
				if other {
					// PostgreSQL refuses the CREATE UNIQUE INDEX (0A000),
					// and a table's partition key cannot change: the fix
					// is another table, or another mode.
					cannot = true
					level, what, others := "", tname, "others"
					if part != "" {
						level, what = " at every level", "its partition "+part
					}
					if coll != "" {
						level += ", each in the key's collation"
						others = coll
					}
					msg += fmt.Sprintf(", nor can there be: on a partitioned table a unique index must hold the partition key's "+
						"columns%s, and %s is partitioned by %s (PARTITION BY %s)", level, what, others, by)
					fix = fmt.Sprintf("write into a table partitioned by %s, by %s, or by both, in their columns' collations, at "+
						"every level (a new table: the partition key of a table cannot change), or use postgres.mode: at-least-once",
						s.seqC, s.streamC)
				}
			}
			if kind == "f" || kind == "v" {
				msg += " (a foreign table or a view has no index of its own: exactly-once needs a table)"
				fix = "set postgres.table to a table, or use postgres.mode: at-least-once"
			}
			if taken == "" && !cannot {
				dup, unscanned := "", ""
				if scan {
					if dup, unscanned, err = s.duplicateKey(ctx, c, tname); err != nil {
						return nil, err
					}
				}
				switch {
				case dup != "":
					// Init's CREATE UNIQUE INDEX would fail (23505):
					// the rows come first.
					cannot = true
					msg += fmt.Sprintf(", and building it fails: the table holds rows with the same key, %s=%s among them "+
						"(events stored again: at-least-once mode writes a redelivered event twice)", key, dup)
					fix = s.dedupeFix(tname)
				case unscanned != "":
					msg += fmt.Sprintf("; building it fails if the table holds rows with the same key (at-least-once writes "+
						"duplicates), which check did not look for: %s; if the build fails (SQLSTATE 23505), %s", unscanned, s.dedupeFix(tname))
				case !scan:
					msg += "; building it fails if the table holds rows with the same key (at-least-once writes duplicates)"
				}
			}
			probs = append(probs, Problem{Kind: ProblemNoUniqueIndex, Message: msg, Fix: fix, initCannot: cannot})
		}
	}
	return probs, nil
}

// otherPartitionKey looks at every partitioned table of rel's tree, rel
// first, for a partition key with a column other than the exactly-once
// key's, or an expression, or a key column in a collation other than its
// column's: PostgreSQL builds a unique index on a partitioned table only
// if it holds the key columns of every level, each in the key's collation
// (0A000), and Init's index takes its columns' collations. It reports
// whether there is one, the first, and its PARTITION BY; part is its
// schema-qualified name, quoted, unless it is rel itself (""); coll, when
// the key's columns are the exactly-once key's and one is in another
// collation, says which (`stream in collation "C", not the column's
// "default"`). Key columns are compared by name, each read on its own
// level's table: a partition attached with its columns in another order
// numbers them otherwise. By name, a missing key column is no match for
// an expression (attnum 0, as a missing column's was).
func (s *Sink) otherPartitionKey(ctx context.Context, c *pgx.Conn, rel uint32) (other bool, part, by, coll string, err error) {
	rows, err := c.Query(ctx, `SELECT p.level = 0, n.nspname::text, r.relname::text,
			pg_get_partkeydef(pt.partrelid),
			ARRAY(SELECT coalesce(a.attname::text, '') FROM unnest(pt.partattrs::int2[], pt.partcollation::oid[]) k(num, coll)
				LEFT JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = k.num AND k.num <> 0), -- '': an expression
			ARRAY(SELECT CASE WHEN a.attcollation IS DISTINCT FROM k.coll AND k.num <> 0
					THEN format('%s in collation %s, not the column''s %s', quote_ident(a.attname), k.coll::regcollation,
						coalesce(nullif(a.attcollation, 0)::regcollation::text, 'none'))
					ELSE '' END
				FROM unnest(pt.partattrs::int2[], pt.partcollation::oid[]) k(num, coll)
				LEFT JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = k.num AND k.num <> 0)
		FROM pg_partition_tree($1) p JOIN pg_partitioned_table pt ON pt.partrelid = p.relid
		JOIN pg_class r ON r.oid = p.relid JOIN pg_namespace n ON n.oid = r.relnamespace
		ORDER BY p.level, n.nspname, r.relname`, rel)
	if err != nil {
		return false, "", "", "", err
	}
	var top bool
	var schema, name, def string
	var keys, colls []string
	_, err = pgx.ForEachRow(rows, []any{&top, &schema, &name, &def, &keys, &colls}, func() error {
		if other {
			return nil
		}
		if slices.ContainsFunc(keys, func(k string) bool { return k != s.streamC && k != s.seqC }) {
			other, by = true, def
		} else if i := slices.IndexFunc(colls, func(c string) bool { return c != "" }); i >= 0 {
			other, by, coll = true, def, colls[i]
		}
		if other && !top {
			part = pgx.Identifier{schema, name}.Sanitize()
		}
		return nil
	})
	return other, part, by, coll, err
}

// tableMissing is the problem of a table that does not exist: one Init
// makes, unless the schema it would be made in does not exist or
// jetsink's role may not create in it. Once the name is pinned to
// another (pinTable: the table found along search_path), the problem is
// that table's (pinnedMissing).
func (s *Sink) tableMissing(ctx context.Context, c *pgx.Conn) (Problem, error) {
	tname := s.table.Sanitize()
	if pinned := s.tsql.Load().name; pinned != tname {
		return s.pinnedMissing(ctx, c, pinned)
	}
	p := Problem{Kind: ProblemTableMissing, Message: fmt.Sprintf("table %s does not exist (or is not on search_path)", tname),
		Fix: "run `jetsink init`, set postgres.create_table: true, or run: " + strings.Join(s.DDL(), "; ")}
	twin, ok, err := s.caseTwin(ctx, c)
	if err != nil {
		return Problem{}, err
	}
	if ok && twin.here {
		return twin.problem(s), nil
	}
	var schema *string
	if len(s.table) == 2 {
		schema = &s.table[0]
	}
	var name *string
	var exists, create bool
	if err := c.QueryRow(ctx, `SELECT x.name, n.oid IS NOT NULL, coalesce(has_schema_privilege(n.oid, 'CREATE'), false)
		FROM (SELECT coalesce($1, current_schema()) AS name) x LEFT JOIN pg_namespace n ON n.nspname = x.name`, schema).
		Scan(&name, &exists, &create); err != nil {
		return Problem{}, fmt.Errorf("check the schema of table %s on %s: %w", tname, s.where, err)
	}
	switch {
	case name == nil:
		p.initCannot = true
		p.Message += ", and no schema on search_path exists to create it in"
		p.Fix = "create the schema, or name one in postgres.table (schema.table)"
	case !exists:
		p.initCannot = true
		sch := pgx.Identifier{*name}.Sanitize()
		p.Message += fmt.Sprintf(", and its schema %s does not exist either", sch)
		p.Fix = "CREATE SCHEMA " + sch + ", or name another in postgres.table"
	case !create:
		p.initCannot = true
		sch := pgx.Identifier{*name}.Sanitize()
		p.Message += fmt.Sprintf(", and jetsink's role may not create tables in schema %s", sch)
		p.Fix = "GRANT CREATE ON SCHEMA " + sch + " TO <jetsink's role>, or create the table as its owner: " + strings.Join(s.DDL(), "; ")
	}
	if ok {
		// Made where the name says, beside nothing: the twin may
		// still be the table meant, whether or not Init can make the
		// table; said after the schema's outcome, whose fix replaces
		// the default one, so that it is not lost with it.
		p.Message += fmt.Sprintf("; %s, in another schema, differs in case alone: names in postgres.table are case-sensitive "+
			"(jetsink quotes them)", twin.name)
		if p.initCannot {
			p.Fix = "if " + twin.name + " is the table meant, write postgres.table: " + twin.write + "; else " + p.Fix
		} else {
			p.Fix += "; or, if " + twin.name + " is the table meant, write postgres.table: " + twin.write
		}
	}
	return p, nil
}

// tableTwin is a table whose name differs from postgres.table's in case
// alone: name its schema-qualified name, quoted; write what to write in
// postgres.table for it; here whether it is in the schema Init would
// make the table in (the one postgres.table names, in whatever case, or
// else current_schema()), beside which Init makes no second table.
type tableTwin struct {
	name, write string
	log         string // name as the log lines spell a table (logName)
	here        bool
}

// problem is the missing table's problem beside the twin t, in the
// schema Init would make it in: jetsink quotes the name, so "Events" is
// not events, and Init would make a second, empty table that nobody reads
// beside it. Init refuses to make the table (initCannot).
func (t tableTwin) problem(s *Sink) Problem {
	return Problem{Kind: ProblemTableMissing, initCannot: true,
		Message: fmt.Sprintf("table %s does not exist, but %s does: names in postgres.table are case-sensitive (jetsink quotes "+
			"them), and jetsink init (or postgres.create_table: true) would make a second, empty table beside it",
			s.table.Sanitize(), t.name),
		Fix: "write postgres.table: " + t.write}
}

// caseTwin finds, for a missing table, a table (a partitioned or a
// foreign one too) whose name differs from postgres.table's in case alone,
// in the schema postgres.table names or else on search_path; one in the
// schema Init would make the table in first. ok reports one found. Views
// and materialized views are left out: an unrelated view of a similar
// name (in a legacy schema on search_path, say) would otherwise keep Init
// from making the table, and a relation of exactly the name is no twin
// (Init names a materialized view the name finds as not a table).
func (s *Sink) caseTwin(ctx context.Context, c *pgx.Conn) (t tableTwin, ok bool, err error) {
	var schema *string
	if len(s.table) == 2 {
		schema = &s.table[0]
	}
	var nsp, rel string
	var visible bool
	err = c.QueryRow(ctx, `SELECT n.nspname::text, c.relname::text, pg_table_is_visible(c.oid),
			$1::text IS NOT NULL OR n.nspname = current_schema() AS here
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE lower(c.relname) = lower($2) AND c.relkind IN ('r', 'p', 'f')
			AND NOT (c.relname = $2 AND n.nspname = coalesce($1, n.nspname))
			AND CASE WHEN $1::text IS NULL THEN n.nspname = ANY (current_schemas(false)) ELSE lower(n.nspname) = lower($1) END
		ORDER BY here DESC, array_position(current_schemas(false), n.nspname), n.nspname, c.relname LIMIT 1`, schema, s.table[len(s.table)-1]).
		Scan(&nsp, &rel, &visible, &t.here)
	if errors.Is(err, pgx.ErrNoRows) {
		return tableTwin{}, false, nil
	}
	if err != nil {
		return tableTwin{}, false, fmt.Errorf("check table %s on %s: %w", s.table.Sanitize(), s.where, err)
	}
	t.name, t.write, t.log = pgx.Identifier{nsp, rel}.Sanitize(), tableConfigPart(rel), logName(pgx.Identifier{nsp, rel})
	if schema != nil || !visible {
		t.write = tableConfigPart(nsp) + "." + t.write
	}
	t.write = yamlScalar(t.write)
	return t, true, nil
}

// tableConfigPart is a part of postgres.table as ParseTable reads it back
// as name: verbatim, or quoted if it holds a dot or starts with a quote.
func tableConfigPart(name string) string {
	if strings.Contains(name, ".") || strings.HasPrefix(name, `"`) {
		return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
	}
	return name
}

// yamlScalar is v as a YAML value that reads back as the string v:
// verbatim if it holds only ASCII letters, digits, '_', '.' and '$', does
// not start with a digit or a dot and is no YAML keyword (null, true,
// ...); else single-quoted; or double-quoted, with Go's escapes (which
// YAML's double-quoted style reads alike), if it holds a character that
// Go does not print, tab aside: a line break would be folded into a space
// in single quotes (YAML reads U+0085, U+2028 and U+2029 as breaks too),
// and other control characters are not allowed in a YAML file unescaped.
// A name tableConfigPart quotes, "a.b", pasted as it is, would lose its
// quotes to YAML and be read as schema a, table b. A name that is not
// UTF-8 has no YAML form (a YAML file is UTF-8).
func yamlScalar(v string) string {
	if strings.ContainsFunc(v, func(r rune) bool { return r != '\t' && !unicode.IsPrint(r) }) {
		return strconv.Quote(v)
	}
	plain := v != "" && !strings.ContainsAny(v[:1], "0123456789.") &&
		!slices.Contains([]string{"null", "true", "false", "yes", "no", "on", "off", "y", "n"}, strings.ToLower(v))
	for _, r := range v {
		plain = plain && (r == '_' || r == '.' || r == '$' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}
	if plain {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// pinnedMissing is the problem of the table the batches write, pinned
// as pinned (pinTable), that no longer exists: dropped, or moved to
// another schema. The configured name may find another table now (one of
// that name in a schema earlier on search_path), which DDL's CREATE TABLE
// IF NOT EXISTS, unqualified, would leave as it is, as Init would: the
// fix makes the table by its pinned name, or has jetsink look the name up
// again.
func (s *Sink) pinnedMissing(ctx context.Context, c *pgx.Conn, pinned string) (Problem, error) {
	now, err := scanFoundTable(c.QueryRow(ctx, foundTableSQL, s.table.Sanitize()))
	if err != nil {
		return Problem{}, fmt.Errorf("check table %s on %s: %w", s.table.Sanitize(), s.where, err)
	}
	finds := "it finds none now"
	if now.name != nil {
		finds = "it now finds " + now.name.Sanitize()
	}
	return Problem{Kind: ProblemTableMissing, initCannot: true,
		Message: fmt.Sprintf("table %s does not exist (dropped, or moved to another schema): jetsink found it as %s and writes it by that name",
			pinned, s.table.Sanitize()),
		Fix: "run: " + strings.Join(s.ddl(pinned, true), "; ") +
			"; or restart jetsink to look the name up again (" + finds + ")"}, nil
}

// indexNameTaken says why DDL's CREATE UNIQUE INDEX IF NOT EXISTS would
// do nothing for the table rel, which has no usable key index, and how to
// free the name: IF NOT EXISTS looks only for a relation of that name in
// the schema. "" if the name is free.
func (s *Sink) indexNameTaken(ctx context.Context, c *pgx.Conn, rel uint32) (string, error) {
	var name, kind, on string
	var valid, ours bool
	err := c.QueryRow(ctx, `SELECT c.oid::regclass::text, c.relkind::text, coalesce(i.indrelid::regclass::text, ''), coalesce(i.indisvalid, true),
		coalesce(i.indrelid = $2, false)
		FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid
		WHERE c.relname = $1 AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $2)`, s.indexName(), rel).
		Scan(&name, &kind, &on, &valid, &ours)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("check the unique index of %s on %s: %w", s.table.Sanitize(), s.where, err)
	}
	old := pgx.Identifier{withSuffix(s.indexName(), "_old")}.Sanitize()
	free := "ALTER INDEX " + name + " RENAME TO " + old
	switch {
	case kind == "i" && !valid:
		return fmt.Sprintf("the name is taken by the INVALID index %s on %s (a CREATE INDEX CONCURRENTLY that failed), which "+
			"jetsink init's IF NOT EXISTS skips: DROP INDEX %s", name, on, name), nil
	case kind == "i" && !ours:
		return fmt.Sprintf("the name is taken by the index %s of %s (a table renamed since jetsink init made it, say), which "+
			"jetsink init's IF NOT EXISTS skips: %s", name, on, free), nil
	case kind == "i":
		return fmt.Sprintf("the index %s on %s is not a unique index on exactly the key's columns, without a condition, "+
			"and jetsink init's IF NOT EXISTS skips it: %s", name, on, free), nil
	}
	return fmt.Sprintf("the name of the index is taken by %s (relkind %s), which jetsink init's IF NOT EXISTS skips: "+
		"ALTER TABLE %s RENAME TO %s", name, kind, name, old), nil
}

// caseTwinColumns is the table's columns (columns, sorted by name) whose
// names differ from name in case alone and that no column of the mapping
// cols writes.
func caseTwinColumns(name string, columns []string, cols []pipeline.Column) []string {
	var twins []string
	for _, a := range columns {
		if a != name && strings.EqualFold(a, name) && !slices.ContainsFunc(cols, func(c pipeline.Column) bool { return c.Name == a }) {
			twins = append(twins, a)
		}
	}
	return twins
}

// columnTwinProblem is the message (msg, and what follows) and fix of
// the missing column name of table (whose columns are columns) when its
// columns twins differ from it in case alone. Each is named: which one
// is meant is the operator's to say. Mappings missing alike (DEV and
// Dev, beside dev) get no same rename each, which would list a column
// twice (New refuses that): one of them may be renamed, the others added
// to the table or removed. Names in the fix are YAML values (yamlScalar).
func (s *Sink) columnTwinProblem(msg, name string, twins, columns []string, table string) (string, string) {
	quoted := make([]string, len(twins))
	names := make([]string, len(twins))
	for i, t := range twins {
		quoted[i], names[i] = pgx.Identifier{t}.Sanitize(), "name: "+yamlScalar(t)
	}
	if len(twins) == 1 {
		msg += fmt.Sprintf(", but a column %s does", quoted[0])
	} else {
		msg += fmt.Sprintf(", but columns %s do", strings.Join(quoted, ", "))
	}
	msg += ": names in postgres.columns are case-sensitive (jetsink quotes them)"
	write := strings.Join(names, " or ")
	var alike []string // the mappings missing alike, name among them
	for _, c := range s.cols {
		if !slices.Contains(columns, c.Name) && strings.EqualFold(c.Name, name) {
			alike = append(alike, c.Name)
		}
	}
	if len(alike) < 2 {
		if len(twins) == 1 {
			return msg, fmt.Sprintf("write %s for this column in postgres.columns", write)
		}
		return msg, fmt.Sprintf("write %s for this column in postgres.columns, whichever is meant", write)
	}
	msg += fmt.Sprintf("; postgres.columns maps %s, all missing, and a column can be listed once", strings.Join(alike, ", "))
	return msg, fmt.Sprintf("write %s for the one of %s meant, and remove the others from postgres.columns or add them "+
		"(ALTER TABLE %s ADD COLUMN ...)", write, strings.Join(alike, ", "), table)
}

// typeModifierProblem warns of column name of table, whose type with its
// modifier is format (see ProblemTypeModifier).
func typeModifierProblem(table, name, format string, t pipeline.Type) Problem {
	col := pgx.Identifier{name}.Sanitize()
	msg := fmt.Sprintf("column %s of %s is %s: PostgreSQL rounds what jetsink writes to its precision, and stores it without an error", col, table, format)
	if t == pipeline.TypeNumeric {
		msg += "; a number with more digits before the point than it allows is refused (SQLSTATE 22003) and dead-lettered " +
			"(code data), each after a bisection of its batch"
	}
	return Problem{Kind: ProblemTypeModifier, Column: name, Warning: true, Message: msg,
		Fix: fmt.Sprintf("if every value fits, nothing; to store values as sent, ALTER TABLE %s ALTER COLUMN %s TYPE %s", table, col, pgTypes[t].name)}
}

// encodingProblem says what a database in the server encoding enc means
// for jetsink's UTF-8 rows (see ProblemEncoding); none for UTF8.
func encodingProblem(enc string) (Problem, bool) {
	fix := "store into a database created WITH ENCODING 'UTF8' (CREATE DATABASE name ENCODING 'UTF8' TEMPLATE template0)"
	switch enc {
	case "UTF8":
		return Problem{}, false
	case "SQL_ASCII":
		return Problem{Kind: ProblemEncoding, Fix: fix,
			Message: "the database's encoding is SQL_ASCII: PostgreSQL stores text bytes there unchecked and unconverted, " +
				"and refuses a jsonb value with a \\u escape above 007F (SQLSTATE 0A000), which stops every batch holding one " +
				"(retried until the database changes)"}, true
	}
	return Problem{Kind: ProblemEncoding, Warning: true, Fix: fix,
		Message: fmt.Sprintf("the database's encoding is %s: PostgreSQL converts jetsink's UTF-8 to it, and an event with "+
			"a character %s lacks is dead-lettered (SQLSTATE 22P05, code data), each after a bisection of its batch", enc, enc)}, true
}

// checkWritable finds what would refuse every batch whatever the rows:
// missing privileges, or a read-only session. Without it, check passed and
// run then retried every batch for ever ("the database refuses every
// batch"). rel is nil for a table that does not exist: then the session's
// and the server's problems only.
func (s *Sink) checkWritable(ctx context.Context, c *pgx.Conn, rel *uint32) ([]Problem, error) {
	tname := s.tsql.Load().name // schema-qualified once a check or a read has found the table
	var insert, sel, temp, recovery, rls bool
	var readOnly string
	// Column privileges on every mapped column do as well as the
	// table's: COPY names those columns only, and so do exactly-once's
	// INSERT and its reads. (A missing column is a problem of its own,
	// and has_column_privilege would fail on it.)
	names := make([]string, len(s.cols))
	for i, col := range s.cols {
		names[i] = col.Name
	}
	// lackIns, lackSel: the mapped columns without the column privilege,
	// of mappedN there; named in the fix when some have it (a column
	// grant that missed a column), not when none has.
	var lackIns, lackSel []string
	var mappedN int
	err := c.QueryRow(ctx, `WITH mapped AS (SELECT a.attname FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0
			AND NOT a.attisdropped AND a.attname = ANY($2::text[]))
		SELECT has_table_privilege($1::oid, 'INSERT') OR NOT EXISTS (SELECT FROM mapped WHERE NOT has_column_privilege($1::oid, attname, 'INSERT')),
		has_table_privilege($1::oid, 'SELECT') OR NOT EXISTS (SELECT FROM mapped WHERE NOT has_column_privilege($1::oid, attname, 'SELECT')),
		has_database_privilege(current_database(), 'TEMP'), pg_is_in_recovery(), current_setting('transaction_read_only'),
		coalesce(row_security_active($1::oid), false),
		ARRAY(SELECT attname::text FROM mapped WHERE NOT has_column_privilege($1::oid, attname, 'INSERT') ORDER BY attname),
		ARRAY(SELECT attname::text FROM mapped WHERE NOT has_column_privilege($1::oid, attname, 'SELECT') ORDER BY attname),
		(SELECT count(*) FROM mapped)`, rel, names).
		Scan(&insert, &sel, &temp, &recovery, &readOnly, &rls, &lackIns, &lackSel, &mappedN)
	if err != nil {
		return nil, fmt.Errorf("check privileges on %s on %s: %w", tname, s.where, err)
	}
	var probs []Problem
	grant := func(priv, on string) {
		probs = append(probs, Problem{Kind: ProblemPrivilege,
			Message: fmt.Sprintf("jetsink's role may not %s %s, which every batch needs", priv, on),
			Fix:     fmt.Sprintf("GRANT %s ON %s TO <jetsink's role>", priv, on)})
	}
	grantCols := func(priv string, lack []string) {
		if len(lack) == 0 || len(lack) == mappedN {
			grant(priv, tname)
			return
		}
		cols := make([]string, len(lack))
		for i, l := range lack {
			cols[i] = pgx.Identifier{l}.Sanitize()
		}
		list := strings.Join(cols, ", ")
		probs = append(probs, Problem{Kind: ProblemPrivilege,
			Message: fmt.Sprintf("jetsink's role has %s on some mapped columns of %s but not on %s, which every batch needs",
				priv, tname, list),
			Fix: fmt.Sprintf("GRANT %s (%s) ON %s TO <jetsink's role> (or GRANT %s ON %s TO <jetsink's role>)", priv, list, tname, priv, tname)})
	}
	if !insert {
		grantCols("INSERT", lackIns)
	}
	if s.cfg.Mode == ExactlyOnce {
		if !sel {
			grantCols("SELECT", lackSel)
		}
		if !temp {
			grant("TEMP", "DATABASE "+pgx.Identifier{c.Config().Database}.Sanitize())
		}
	}
	if rel != nil {
		seqs, err := s.deniedSequences(ctx, c, *rel, names)
		if err != nil {
			return nil, err
		}
		for _, q := range seqs {
			probs = append(probs, Problem{Kind: ProblemPrivilege, Column: q.col,
				Message: fmt.Sprintf("jetsink's role may not use sequence %s, which the default of column %s of %s calls (nothing maps "+
					"to the column, so every row takes its default): every batch fails (SQLSTATE 42501, permission denied for sequence)",
					q.seq, pgx.Identifier{q.col}.Sanitize(), tname),
				Fix: fmt.Sprintf("GRANT USAGE ON SEQUENCE %s TO <jetsink's role>", q.seq)})
		}
	}
	if rls {
		fix := "exempt jetsink's role: ALTER ROLE <jetsink's role> BYPASSRLS, or make it the table's owner without FORCE ROW LEVEL SECURITY"
		if s.cfg.Mode == AtLeastOnce {
			probs = append(probs, Problem{Kind: ProblemRowSecurity,
				Message: fmt.Sprintf("row-level security applies to jetsink's role on %s, and PostgreSQL refuses COPY FROM into such a table "+
					"(SQLSTATE 0A000): every batch would fail and be retried", tname),
				Fix: fix + "; or set postgres.mode: exactly-once, which inserts from a staging table under the policies"})
		} else {
			probs = append(probs, Problem{Kind: ProblemRowSecurity, Warning: true,
				Message: fmt.Sprintf("row-level security applies to jetsink's role on %s: a row that a policy's WITH CHECK refuses, "+
					"or that the role's SELECT policies hide (INSERT ... ON CONFLICT, which exactly-once uses, checks each row against "+
					"them too), is refused (SQLSTATE 42501) and dead-lettered (code refused) once other rows have committed, not stored", tname),
				Fix: "give the role a SELECT policy over every row it stores (if the policies refuse rows on purpose, that is all); or " + fix})
		}
	}
	type limit struct{ Name, Setting, Unit string }
	var set []limit
	limits, err := c.Query(ctx, `SELECT name, setting, coalesce(unit, '') FROM pg_settings
		WHERE name IN ('statement_timeout', 'transaction_timeout', 'synchronous_commit', 'synchronous_standby_names') ORDER BY name`)
	if err == nil {
		set, err = pgx.CollectRows(limits, pgx.RowToStructByPos[limit])
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("check the server's timeouts on %s: %w", s.where, err)
		}
		// Only a warning is lost: say so, and check the rest.
		probs = append(probs, Problem{Kind: ProblemServerTimeout, Warning: true,
			Message: fmt.Sprintf("could not read statement_timeout and transaction_timeout from pg_settings (%v); a limit shorter than a batch "+
				"takes costs throughput", err),
			Fix: "SHOW statement_timeout; SHOW transaction_timeout; as jetsink's role: more than 10s, or 0"})
	}
	var syncCommit, syncNames string
	for _, l := range set {
		if l.Name == "synchronous_standby_names" {
			syncNames = l.Setting
			continue
		}
		if l.Name == "synchronous_commit" {
			syncCommit = l.Setting
			if l.Setting == "off" {
				probs = append(probs, Problem{Kind: ProblemAsyncCommit, Warning: true,
					Message: "synchronous_commit is off for jetsink's sessions: a COMMIT returns before it is on disk, jetsink acks its events, " +
						"and a crash of the server loses the last ones acked, which JetStream does not deliver again",
					Fix: "ALTER ROLE <jetsink's role> SET synchronous_commit = on (or the same on the database, or in postgresql.conf)"})
			}
			continue
		}
		ms, err := strconv.ParseInt(l.Setting, 10, 64)
		if err != nil || l.Unit != "ms" || ms <= 0 || ms >= shortServerTimeout.Milliseconds() {
			continue
		}
		probs = append(probs, Problem{Kind: ProblemServerTimeout, Warning: true,
			Message: fmt.Sprintf("%s is %v for jetsink's sessions: a batch that takes longer (a lock wait, a busy server, a large "+
				"postgres.batch.max_rows) is ended by the server and tried again in smaller pieces, which costs throughput", l.Name,
				time.Duration(ms)*time.Millisecond),
			Fix: fmt.Sprintf("ALTER ROLE <jetsink's role> SET %s = '1min' (or 0, no limit); or lower postgres.batch.max_rows", l.Name)})
	}
	if p, ok := s.asyncStandby(ctx, c, syncCommit, syncNames); ok && !recovery {
		probs = append(probs, p)
	}
	switch {
	case recovery:
		probs = append(probs, Problem{Kind: ProblemReadOnly,
			Message: fmt.Sprintf("%s is a standby in recovery: it takes no writes", s.serverOf(c)),
			Fix:     "point postgres.url at the primary"})
	case readOnly == "on":
		probs = append(probs, readOnlySessionProblem)
	}
	return probs, nil
}

// deniedSeq is a sequence the default of an unmapped column calls and
// jetsink's role may not use: the column's name, the sequence's
// schema-qualified and quoted.
type deniedSeq struct{ col, seq string }

// deniedSequences returns the sequences that the defaults of rel's
// columns other than mapped call (a serial's nextval) and jetsink's role
// may use neither with USAGE nor with UPDATE: nextval needs one of them,
// and every row takes those defaults, so every batch fails (42501) though
// INSERT on the table is granted (a table owned by another role, a
// serial key jetsink leaves to its default). An identity column needs no
// grant (its sequence is the table's own), nor has it a pg_attrdef row; a
// partitioned table's rows take the parent's defaults, which are rel's.
// The CASE keeps has_sequence_privilege from the rows of other
// relations a default depends on: the planner may call it before
// relkind's test, and it fails on a table.
func (s *Sink) deniedSequences(ctx context.Context, c *pgx.Conn, rel uint32, mapped []string) ([]deniedSeq, error) {
	rows, err := c.Query(ctx, `SELECT a.attname::text, n.nspname::text, sq.relname::text
		FROM pg_attrdef ad
		JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum AND NOT a.attisdropped
		JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid AND d.refclassid = 'pg_class'::regclass
		JOIN pg_class sq ON sq.oid = d.refobjid JOIN pg_namespace n ON n.oid = sq.relnamespace
		WHERE ad.adrelid = $1 AND a.attname <> ALL ($2::text[])
			AND CASE WHEN sq.relkind = 'S' THEN NOT (has_sequence_privilege(sq.oid, 'USAGE') OR has_sequence_privilege(sq.oid, 'UPDATE'))
				ELSE false END
		ORDER BY a.attnum, 2, 3`, rel, mapped)
	if err == nil {
		var out []deniedSeq
		if out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (deniedSeq, error) {
			var q deniedSeq
			var schema, name string
			err := r.Scan(&q.col, &schema, &name)
			q.seq = pgx.Identifier{schema, name}.Sanitize()
			return q, err
		}); err == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("check the sequences of the defaults of %s on %s: %w", s.tsql.Load().name, s.where, err)
}

// readOnlySessionProblem is checkWritable's problem of a session that
// default_transaction_read_only makes read-only. The setting applies to a
// session when it starts: behind a pooler, the server sessions it keeps
// open stay read-only after the fix (PgBouncer's until server_lifetime,
// an hour by default), however often jetsink connects again, so the fix
// says to renew them too.
var readOnlySessionProblem = Problem{Kind: ProblemReadOnly,
	Message: "the session is read-only (default_transaction_read_only for the role or database): every batch fails with SQLSTATE 25006",
	Fix: "ALTER ROLE <jetsink's role> SET default_transaction_read_only = off (or the same on the database); " +
		readOnlyPoolerFix}

// readOnlyPoolerFix is the part of a read-only session's fix for a pooler
// between jetsink and the server: its server sessions that started
// read-only stay so until they are replaced.
const readOnlyPoolerFix = "behind a pooler, also renew its server connections (PgBouncer: RECONNECT <db> on its admin console), " +
	"whose sessions stay read-only until they end"

// serverOf is the address c is connected to (one host of a failover
// list), or the list when it cannot tell.
func (s *Sink) serverOf(c *pgx.Conn) string {
	if nc := c.PgConn().Conn(); nc != nil {
		return nc.RemoteAddr().String() + "/" + c.Config().Database
	}
	return s.where
}

// asyncStandby returns ProblemAsyncStandby when physical replication
// connections stream from the server (pg_stat_replication rows whose
// walsender has no database: standbys, but also pg_receivewal or a base
// backup; not a logical subscriber, which is no failover target) and a
// COMMIT of jetsink's waits for none, given the settings read for its
// session (synchronous_commit off has a warning of its own; "" when they
// could not be read, which says nothing). A cascading standby, which
// streams from another standby, is not seen. A server whose views cannot
// be read costs the warning only.
func (s *Sink) asyncStandby(ctx context.Context, c *pgx.Conn, syncCommit, syncNames string) (Problem, bool) {
	var why string
	switch {
	case syncCommit == "" || syncCommit == "off":
		return Problem{}, false
	case syncNames == "":
		why = "synchronous_standby_names is empty"
	case syncCommit == "local":
		why = "synchronous_commit is local for jetsink's sessions"
	default:
		return Problem{}, false
	}
	var n int64
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_activity a USING (pid)
		WHERE a.datname IS NULL`).Scan(&n); err != nil || n == 0 {
		return Problem{}, false
	}
	return Problem{Kind: ProblemAsyncStandby, Warning: true,
		Message: fmt.Sprintf("%d physical replication connection(s) (standbys; also pg_receivewal or a base backup) stream from %s and no "+
			"COMMIT of jetsink's waits for one (%s): a failover to a standby loses the commits it had not received yet, whose events "+
			"jetsink has acked and JetStream does not deliver again", n, s.serverOf(c), why),
		Fix: "make every COMMIT wait for the standbys a failover may promote: name them in synchronous_standby_names (FIRST n or ANY n; " +
			"with ANY 1 (a, b) a commit waits for one of them, which is enough only if the failover promotes the standby that is furthest " +
			"ahead, as Patroni and repmgr do), with synchronous_commit on for jetsink's role; if no standby is ever promoted, this does not apply"}, true
}

// rowTriggers returns the names of the user triggers that fire BEFORE
// INSERT FOR EACH ROW in a normal session (enabled, or enabled ALWAYS) on
// rel or on any partition of it, where a row routed there meets them: a
// partition's own as "name (on partition <partition>)". A trigger made
// on a partitioned table is cloned onto each partition (tgparentid, from
// PostgreSQL 13; on 12 the clones are internal): named once, as the
// table's. A clone whose parent trigger is outside rel's tree (rel is a
// partition itself, written straight into, and the trigger is its
// parent's) is what fires there: named as rel's. tgtype bits: 1 row, 2
// before, 4 insert.
func (s *Sink) rowTriggers(ctx context.Context, c *pgx.Conn, rel uint32) ([]string, error) {
	rows, err := c.Query(ctx, `WITH tree AS (SELECT $1::oid AS relid UNION SELECT relid FROM pg_partition_tree($1))
		SELECT t.tgname::text, t.tgrelid <> $1, n.nspname::text, r.relname::text
		FROM tree p
		JOIN pg_trigger t ON t.tgrelid = p.relid JOIN pg_class r ON r.oid = t.tgrelid JOIN pg_namespace n ON n.oid = r.relnamespace
		WHERE NOT t.tgisinternal AND t.tgtype & 7 = 7 AND t.tgenabled IN ('O', 'A')
			AND NOT EXISTS (SELECT FROM pg_trigger pt WHERE pt.oid = coalesce((to_jsonb(t) ->> 'tgparentid')::oid, 0)
				AND pt.tgrelid IN (SELECT relid FROM tree))
		ORDER BY t.tgrelid <> $1, n.nspname, r.relname, t.tgname`, rel)
	if err == nil {
		var names []string
		if names, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var name, schema, part string
			var onPart bool
			if err := r.Scan(&name, &onPart, &schema, &part); err != nil || !onPart {
				return name, err
			}
			return name + " (on partition " + pgx.Identifier{schema, part}.Sanitize() + ")", nil
		}); err == nil {
			return names, nil
		}
	}
	return nil, fmt.Errorf("check triggers of %s on %s: %w", s.table.Sanitize(), s.where, err)
}

// uniqueIndex is a valid unique index of the table, as check reads it.
type uniqueIndex struct {
	name      string
	key       []int16 // key columns' attnums; 0 for an expression
	used      []int16 // the columns its expressions and predicate use (pg_depend)
	plain     bool    // no predicate, no expression: ON CONFLICT (cols) can infer it
	pred      bool    // a partial index: WHERE ...
	immediate bool    // not DEFERRABLE
	con, def  string  // the UNIQUE or PRIMARY KEY constraint behind it and its definition, if any
	qualified string  // its schema-qualified name, quoted
	// looseCollation: a key column of it compares with a
	// nondeterministic collation (see ProblemCollation).
	looseCollation bool
}

// uniqueIndexes reads rel's valid unique indexes, by name.
func (s *Sink) uniqueIndexes(ctx context.Context, c *pgx.Conn, rel uint32) ([]uniqueIndex, error) {
	rows, err := c.Query(ctx, `SELECT ic.relname::text, (i.indkey::int2[])[0:i.indnkeyatts-1],
		array(SELECT d.refobjsubid::int2 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
			AND d.objid = i.indexrelid AND d.refclassid = 'pg_class'::regclass AND d.refobjid = i.indrelid
			AND d.refobjsubid > 0),
		i.indpred IS NULL AND i.indexprs IS NULL, i.indpred IS NOT NULL, i.indimmediate,
		coalesce(con.conname::text, ''), coalesce(pg_get_constraintdef(con.oid), ''),
		quote_ident(n.nspname) || '.' || quote_ident(ic.relname),
		EXISTS (SELECT FROM pg_collation co WHERE co.oid = ANY (i.indcollation::oid[]) AND NOT co.collisdeterministic)
		FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_namespace n ON n.oid = ic.relnamespace
		LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid AND con.contype IN ('p', 'u')
		WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid ORDER BY ic.relname`, rel)
	if err == nil {
		var out []uniqueIndex
		if out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (uniqueIndex, error) {
			var u uniqueIndex
			err := r.Scan(&u.name, &u.key, &u.used, &u.plain, &u.pred, &u.immediate, &u.con, &u.def, &u.qualified, &u.looseCollation)
			return u, err
		}); err == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("check indexes of %s on %s: %w", s.table.Sanitize(), s.where, err)
}

// keepsValues lists the changes of a column's type, from its base type's
// OID to the one a mapping writes, that ALTER COLUMN ... TYPE makes
// without changing a value the table holds, with the USING each needs
// (%[1]s: the column). Others convert as PostgreSQL's casts do: a float
// rounded into an integer or a numeric, a timestamptz cut to a date, text
// re-read, a timestamp read in the session's TimeZone.
var keepsValues = map[[2]uint32]string{
	{21, 23}: "", {21, 20}: "", {21, 1700}: "", {21, 700}: "", {21, 701}: "", // smallint
	{23, 20}: "", {23, 1700}: "", {23, 701}: "", // integer
	{20, 1700}:   "",                                    // bigint
	{1082, 1184}: "%[1]s::timestamp AT TIME ZONE 'UTC'", // a date: its midnight, UTC
}

// retypeFix says how to make column c's mapping and the table's column,
// of type ct, agree. A mapping type that writes the column as it is comes
// first: it leaves the rows there alone. ALTER COLUMN ... TYPE rewrites
// the table under an ACCESS EXCLUSIVE lock and converts every row it
// holds: said plainly where that can change them (a user migrating a
// table of timestamps without a zone, or of floats, would otherwise
// shift or round its history by following the fix).
func (s *Sink) retypeFix(c pipeline.Column, ct colType, format, tname string) string {
	want := pgTypes[c.Type]
	col := pgx.Identifier{c.Name}.Sanitize()
	alter := fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE %s", tname, col, want.name)
	rewrite := "it rewrites the table under an ACCESS EXCLUSIVE lock"
	if ct.typ != ct.base {
		// Of a domain: ALTER ... TYPE leaves it, and its CHECKs, behind.
		rewrite += fmt.Sprintf(", and the column is no longer of the domain %s: its constraints no longer apply "+
			"(a domain over %s keeps them)", format, want.name)
	}
	var ddl string
	if using, ok := keepsValues[[2]uint32{ct.base, want.oid}]; ok {
		if using != "" {
			alter += " USING " + fmt.Sprintf(using, col)
		}
		ddl = fmt.Sprintf("%s, which keeps every value the column holds (%s)", alter, rewrite)
	} else if ct.base == 1114 && want.oid == 1184 { // timestamp without time zone
		ddl = fmt.Sprintf("%s USING %s AT TIME ZONE 'UTC' if the times it holds are UTC, else with the zone they were "+
			"written in (without USING, PostgreSQL reads them in the session's TimeZone and may shift them; %s)", alter, col, rewrite)
	} else {
		ddl = fmt.Sprintf("%s USING %s::%s, which converts the rows the table holds as that cast does: it may round, "+
			"truncate or shift them, or fail (look at them first; %s)", alter, col, want.name, rewrite)
	}
	for _, t := range slices.Sorted(maps.Keys(pgTypes)) {
		other := c
		other.Type = t
		if t == c.Type || !s.columnReads(other, ct) { // citext reads text's bytes too
			continue
		}
		if _, err := pipeline.Compile([]pipeline.Column{other}); err != nil {
			continue // its source cannot fill one (meta:stream_seq as text, say)
		}
		return fmt.Sprintf("type: %s for column %s in postgres.columns, which writes the column as it is and leaves its rows alone; or %s", t, c.Name, ddl)
	}
	return ddl + "; no type of postgres.columns writes the column as it is"
}

// writtenUniqueIndexes returns those of idx that can refuse a row for
// values jetsink wrote, each as "name (col, ...)": those whose columns (key
// columns, and the columns their expressions and predicate use) are all
// among written (attnum -> name), source giving each one's mapping source.
// An index on a column jetsink leaves to a default (a serial key) or on
// meta:consumer_seq (one value a delivery) cannot, and is left out.
// eventKeys are those with the stream's sequence (meta:stream_seq) as a
// key column, or in an expression of one that is not partial, which only
// the same event delivered again repeats, and not then with a column that
// differs a delivery (meta:received_at, meta:delivered). shared are the
// others, whose values two events can share (a device, an order id; a
// device with received_at, the time of a read that may bring many events;
// a sequence in the predicate alone). An expression over the sequence
// that two sequences share (stream_seq / 1000) is taken for the sequence.
func writtenUniqueIndexes(idx []uniqueIndex, written map[int16]string, source map[string]string) (eventKeys, shared []string) {
next:
	for _, u := range idx {
		var cols []string
		for _, k := range u.key {
			if k == 0 { // an expression: its columns are in used
				cols = append(cols, "expression")
				continue
			}
			cols = append(cols, written[k])
		}
		event, delivery := false, false
		for i, k := range slices.Concat(u.key, u.used) {
			col, ok := written[k]
			if k == 0 {
				continue
			}
			if !ok || source[col] == "meta:consumer_seq" {
				continue next
			}
			switch source[col] {
			case "meta:stream_seq":
				event = event || i < len(u.key) || !u.pred
			case "meta:received_at", "meta:delivered":
				delivery = true
			}
		}
		name := u.name + " (" + strings.Join(cols, ", ") + ")"
		switch {
		case !event:
			shared = append(shared, name)
		case !delivery:
			eventKeys = append(eventKeys, name)
		}
	}
	return eventKeys, shared
}

// conflictRules returns the names of the rules on rel that stop INSERT ...
// ON CONFLICT: UPDATE rules, enabled or not (PostgreSQL refuses it with
// any), and enabled INSERT rules. ev_type: '2' UPDATE, '3' INSERT.
func (s *Sink) conflictRules(ctx context.Context, c *pgx.Conn, rel uint32) ([]string, error) {
	return s.catalogNames(ctx, c, "rules", `SELECT rulename::text FROM pg_rewrite
		WHERE ev_class = $1 AND (ev_type = '2' OR ev_type = '3' AND ev_enabled IN ('O', 'A')) ORDER BY rulename`, rel)
}

// catalogNames runs a catalog query for rel that returns names; what names
// them in errors.
func (s *Sink) catalogNames(ctx context.Context, c *pgx.Conn, what, sql string, rel uint32) ([]string, error) {
	rows, err := c.Query(ctx, sql, rel)
	if err == nil {
		var names []string
		if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err == nil {
			return names, nil
		}
	}
	return nil, fmt.Errorf("check %s of %s on %s: %w", what, s.table.Sanitize(), s.where, err)
}

// keyConstraint is a DEFERRABLE unique or primary key constraint on the
// exactly-once key columns.
type keyConstraint struct {
	name         string
	immediateDef string // its definition without DEFERRABLE, INITIALLY DEFERRED
}

// keyIndexes looks at those of idx that are plain (no predicate, no
// expression) with key columns exactly {a, b}: those that ON CONFLICT (a,
// b) infers as its arbiters (whatever their collations). usable reports
// one that is not deferrable; deferrable lists the constraints behind the
// deferrable ones, which PostgreSQL refuses as arbiters (SQLSTATE 55000)
// whether or not a usable one exists beside them. Only a UNIQUE or
// PRIMARY KEY constraint can be DEFERRABLE, never a CREATE UNIQUE INDEX
// (Init's). loose lists those with a nondeterministic collation
// (ProblemCollation), usable or not.
func keyIndexes(idx []uniqueIndex, a, b int16) (usable bool, deferrable []keyConstraint, loose []uniqueIndex) {
	if a == 0 || b == 0 {
		return false, nil, nil
	}
	for _, u := range idx {
		k := u.key
		if !u.plain || len(k) != 2 || !((k[0] == a && k[1] == b) || (k[0] == b && k[1] == a)) {
			continue
		}
		if u.looseCollation {
			loose = append(loose, u)
		}
		switch {
		case u.immediate:
			usable = true
		case u.con != "":
			// pg_get_constraintdef ends with " DEFERRABLE" and then
			// " INITIALLY DEFERRED" when the constraint has them.
			def := strings.TrimSuffix(strings.TrimSuffix(u.def, " INITIALLY DEFERRED"), " DEFERRABLE")
			deferrable = append(deferrable, keyConstraint{name: u.con, immediateDef: def})
		}
	}
	return usable, deferrable, loose
}

// StoredSeq returns the highest stream sequence the table holds for stream
// (0: none, or no table yet). Exactly-once only: it reads the key columns,
// one index entry with the unique index on (stream, stream_seq) that init
// creates; with a text sequence column, or an index led by stream_seq, it
// reads every row of stream. The consumer asks it before it creates the
// stream, so that a re-created stream continues past the table's rows,
// and before it subscribes, to refuse a stream whose sequence restarted
// under the table (consumer.Config.StoredSeq).
func (s *Sink) StoredSeq(ctx context.Context, stream string) (uint64, error) {
	if s.cfg.Mode != ExactlyOnce {
		return 0, fmt.Errorf("%w: StoredSeq needs postgres.mode exactly-once", ErrInvalidConfig)
	}
	seq := pgx.Identifier{s.seqC}.Sanitize()
	if s.seqText {
		seq += "::numeric"
	}
	table := s.Table()
	q := "SELECT max(" + seq + ")::numeric::text FROM " + table +
		" WHERE " + pgx.Identifier{s.streamC}.Sanitize() + " = $1"
	var max *string
	err := s.withAdmin(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, q, stream).Scan(&max)
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // no such table or schema yet
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the highest %s stored for stream %s in %s on %s: %w", s.seqC, stream, table, s.where, err)
	}
	if max == nil {
		return 0, nil
	}
	n, err := strconv.ParseUint(integralText(*max), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the highest %s stored for stream %s in %s is %q, not a stream sequence", s.seqC, stream, table, *max)
	}
	return n, nil
}

// ignoredDefaultNote is what a NOT NULL column's problem adds when the
// column has a DEFAULT: the COPY names every mapped column, so the DEFAULT
// never stands in for a value an event lacks (the column's own
// ProblemIgnoredDefault is not given beside it).
func ignoredDefaultNote(hasDefault bool) string {
	if !hasDefault {
		return ""
	}
	return " (its DEFAULT is not applied: the COPY names every mapped column)"
}

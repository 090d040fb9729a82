package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsink/jetsink/pipeline"
)

// copyWire's writes, read back as protocol messages, are one Query, then
// CopyData messages whose payloads are exactly header, tuples and trailer,
// then CopyDone; no write but the one holding a larger row passes
// copyChunk.
func TestCopyWire(t *testing.T) {
	const sql = "COPY t (a) FROM STDIN (FORMAT binary)"
	for _, tc := range []struct {
		name string
		n    int
		big  int // index of a row larger than copyChunk, or -1
	}{
		{"empty", 0, -1},
		{"one", 1, -1},
		{"many", 5000, -1},
		{"big row", 40, 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, _ := rows(1, tc.n, func(seq int) string { return fmt.Sprintf(`{"n":%d,"pad":"%0100d"}`, seq, seq) })
			if tc.big >= 0 {
				rs[tc.big].Tuple = tuple("S", 18, `{"pad":"`+strings.Repeat("x", copyChunk+100)+`"}`)
			}
			want := append([]byte(nil), copyHeader...)
			for _, r := range rs {
				want = append(want, r.Tuple...)
			}
			want = append(want, copyTrailer...)

			var w copyWire
			var writes [][]byte
			write := func(b []byte) error {
				writes = append(writes, append([]byte(nil), b...))
				return nil
			}
			w.begin(sql)
			for i := range rs {
				if w.full(len(rs[i].Tuple)) {
					_ = w.flush(write)
				}
				w.buf = append(w.buf, rs[i].Tuple...)
			}
			writes = append(writes, append([]byte(nil), w.end()...))

			var stream, all []byte
			for i, b := range writes {
				if len(b) > copyChunk && !(tc.big >= 0 && len(b) < copyChunk+len(rs[tc.big].Tuple)+64) {
					t.Errorf("write %d is %d bytes, over copyChunk", i, len(b))
				}
				all = append(all, b...)
			}
			var types []byte
			for len(all) > 0 {
				if len(all) < 5 {
					t.Fatalf("%d stray bytes", len(all))
				}
				typ, n := all[0], int(binary.BigEndian.Uint32(all[1:5]))
				body := all[5 : 1+n]
				switch typ {
				case 'Q':
					if string(body) != sql+"\x00" {
						t.Fatalf("query %q", body)
					}
				case 'd':
					stream = append(stream, body...)
				case 'c':
					if n != 4 {
						t.Fatalf("CopyDone length %d", n)
					}
				default:
					t.Fatalf("message type %q", typ)
				}
				types = append(types, typ)
				all = all[1+n:]
			}
			if types[0] != 'Q' || types[len(types)-1] != 'c' || bytes.Count(types, []byte{'c'}) != 1 {
				t.Fatalf("message order %q", types)
			}
			if !bytes.Equal(stream, want) {
				t.Fatalf("COPY stream differs: %d bytes, want %d", len(stream), len(want))
			}
			if tc.n == 5000 && len(writes) < 2 {
				t.Fatalf("5000 rows in %d write(s): the chunking never ran", len(writes))
			}
		})
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want class
	}{
		{&pgconn.PgError{Code: "23514", ConstraintName: "ok"}, classSuspect}, // a CHECK every row may meet
		{&pgconn.PgError{Code: "23514"}, classSuspect},                       // no partition for the row
		{&pgconn.PgError{Code: "23502", ColumnName: "stream"}, classSuspect}, // a NOT NULL every row may meet
		{&pgconn.PgError{Code: "2200H"}, classSuspect},                       // a serial column ran out
		{&pgconn.PgError{Code: "22001"}, classData},
		{fmt.Errorf("copy: %w", &pgconn.PgError{Code: "23505"}), classData},
		// Raised inside a function (a trigger's bug fails every row): its
		// context has the function's line before the COPY's, or any line
		// for a statement with none of its own; counted, not read.
		{&copyStmtError{n: 3, err: &pgconn.PgError{Code: "23505", Where: "tのCOPY、行 3"}}, classData},
		// A value its column's type refuses (named at the COPY; in another
		// language, or from exactly-once's INSERT, taken for one): the
		// row's. One a table's expression refuses (a CHECK's or a
		// DEFAULT's cast, no column named): a row's or the table's.
		{&copyStmtError{n: 3, err: &pgconn.PgError{Code: "22P02", Where: "COPY t, line 3, column a"}}, classData},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Code: "22P02", Where: "tのCOPY、行 3、列 a"}}, classData},
		{&fromStagingError{n: 3, err: &pgconn.PgError{Code: "22001"}}, classData},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Code: "22007", Where: "COPY t, line 3"}}, classSuspect},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Code: "23505", Where: "COPY t, line 3"}}, classData},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Code: "22012",
			Where: "SQL statement \"SELECT 1/0\"\nPL/pgSQL function f() line 1 at PERFORM\nCOPY t, line 3"}}, classSuspect},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Code: "23505",
			Where: "SQL-Anweisung »INSERT INTO log VALUES (1)«\nPL/pgSQL-Funktion f() Zeile 1 bei SQL-Anweisung\nCOPY t, Zeile 3"}}, classSuspect},
		{&fromStagingError{n: 3, err: &pgconn.PgError{Code: "22P02", Where: "PL/pgSQL function f() line 1 at assignment"}}, classSuspect},
		{&fromStagingError{n: 3, err: &pgconn.PgError{Code: "22012", Where: "PL/pgSQL-Funktion f() Zeile 1 bei PERFORM"}}, classSuspect},
		{&fromStagingError{n: 3, err: &pgconn.PgError{Code: "23505"}}, classData},
		{fmt.Errorf("commit 3 rows: %w", &pgconn.PgError{Code: "23503"}), classData}, // a deferred foreign key
		{fmt.Errorf("commit 3 rows: %w", &pgconn.PgError{Code: "22012", Where: "PL/pgSQL function f() line 1 at PERFORM"}), classSuspect},
		{&pgconn.PgError{Code: "22P03"}, classSuspect},
		{&pgconn.PgError{Code: "22P04"}, classSuspect},
		// A field shorter than its column's type reads (PostgreSQL 15's
		// words), told by severity and statement, not by the translated
		// context: a row's value, or the table's type; not a lost
		// connection.
		{&copyStmtError{n: 3, err: &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01",
			Message: "insufficient data left in message", Where: "COPY t, line 3, column a"}}, classSuspect},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "08P01",
			Message: "nicht genug Daten in Message übrig", Where: "COPY t, Zeile 3, Spalte a"}}, classSuspect},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01",
			Where: "tのCOPY、行 3、列 a"}}, classSuspect},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Severity: "ERROR", Code: "08P01"}}, classSuspect}, // before 9.6: no unlocalized severity
		{&copyStmtError{n: 3, err: &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "08P01",
			Where: "COPY t, line 3, column a"}}, classTransient},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "FATAL", Code: "08P01"}}, classTransient},
		// Not the COPY statement's (a guard's, the COMMIT's, a connect's).
		{&pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01", Where: "COPY t, line 3, column a"}, classTransient},
		{fmt.Errorf("commit 3 rows: %w", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01"}), classTransient},
		{&copyStmtError{n: 3, err: &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08006"}}, classTransient},
		{&pgconn.PgError{Code: "40001"}, classTransient},
		{&pgconn.PgError{Code: "40P01"}, classTransient},
		{&pgconn.PgError{Code: "57P01"}, classTransient},
		{&pgconn.PgError{Code: "53300"}, classTransient},
		{&pgconn.PgError{Code: "08006"}, classTransient},
		{&pgconn.PgError{Code: "55P03"}, classTransient},
		{&pgconn.PgError{Code: "55006"}, classTransient},
		{fmt.Errorf("create staging table: %w", &pgconn.PgError{Severity: "FATAL", Code: "25P03"}), classTransient},
		{&pgconn.PgError{Severity: "FATAL", Code: "25P04"}, classTransient},
		{&pgconn.PgError{Code: "25P02"}, classConfig},
		{&pgconn.PgError{Code: "55000"}, classConfig},
		{&pgconn.PgError{Code: "42P01"}, classConfig},
		{&pgconn.PgError{Code: "P0001"}, classSuspect},
		{&pgconn.PgError{Code: "P0004"}, classSuspect},
		{fmt.Errorf("copy: %w", &pgconn.PgError{Code: "54000"}), classSuspect},
		{&pgconn.PgError{Code: "54001"}, classSuspect},
		{&pgconn.PgError{Code: "44000"}, classSuspect},
		{&pgconn.PgError{Code: "XX000"}, classSuspect},
		{&pgconn.PgError{Code: "0A000"}, classSuspect},
		{&pgconn.PgError{Code: "09000"}, classSuspect},
		{&pgconn.PgError{Code: "2F005"}, classSuspect},
		{&pgconn.PgError{Code: "25006"}, classConfig},
		{&pgconn.PgError{Code: "3F000"}, classConfig},
		{&pgconn.PgError{Code: "HV00N"}, classConfig},
		{&pgconn.PgError{Code: "0LP01"}, classConfig},
		{&pgconn.PgError{Code: "F0000"}, classConfig},
		{&pgconn.PgError{Code: "P01"}, classConfig},
		{&pgconn.PgError{Code: "42501"}, classConfig},
		{&pgconn.PgError{Code: "28P01"}, classConfig},
		{fmt.Errorf("begin: %w", pgconn.ErrConnClosed), classTransient},
		{fmt.Errorf("copy: %w", io.ErrUnexpectedEOF), classTransient},
		{&net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, classTransient},
		{errors.New("something else"), classConfig},
	}
	for _, tc := range cases {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	if outcomeUnknown(&pgconn.PgError{Code: "40001", Severity: "ERROR"}) || !outcomeUnknown(io.ErrUnexpectedEOF) {
		t.Error("outcomeUnknown")
	}
	// The session ended, maybe after the commit (terminated while waiting
	// for a synchronous standby); the localized severity counts when the
	// server sent no unlocalized one (before PostgreSQL 9.6).
	if !outcomeUnknown(&pgconn.PgError{Code: "57P01", Severity: "FATAL", SeverityUnlocalized: "FATAL"}) ||
		!outcomeUnknown(&pgconn.PgError{Code: "57P01", Severity: "FATAL"}) {
		t.Error("outcomeUnknown of a FATAL error")
	}
}

// A 42501 is a row's only from exactly-once's INSERT under row-level
// security. From a connect, the staging table or a guard it is a grant's,
// which may fail new connections only while others commit: as a suspect,
// it would dead-letter rows that store fine.
func TestClassifyUnderRowSecurity(t *testing.T) {
	s := &Sink{}
	denied := &pgconn.PgError{Code: "42501"}
	insert := &fromStagingError{n: 3, err: denied}
	for _, tc := range []struct {
		rls  bool
		err  error
		want class
	}{
		{false, insert, classConfig},
		{true, insert, classSuspect},
		{true, fmt.Errorf("copy 3 rows: %w", insert), classSuspect},
		{true, denied, classConfig},
		{true, fmt.Errorf("create staging table: %w", denied), classConfig},
		{true, &fromStagingError{n: 3, err: &pgconn.PgError{Code: "42P01"}}, classConfig},
	} {
		s.rowSecurity.Store(tc.rls)
		if got := s.classify(tc.err); got != tc.want {
			t.Errorf("row security %v: classify(%v) = %d, want %d", tc.rls, tc.err, got, tc.want)
		}
	}
}

// copyCount reads "COPY n" and nothing else.
func TestCopyCount(t *testing.T) {
	for _, tc := range []struct {
		tag  string
		want int64
	}{
		{"COPY 0", 0},
		{"COPY 5000", 5000},
		{"COPY 9223372036854775807", 9223372036854775807},
		{"COPY 9223372036854775808", -1},
		{"COPY 9999999999999999999", -1},
		{"COPY 00000000000000000000042", 42},
		{"COPY ", -1},
		{"COPY", -1},
		{"COPY -1", -1},
		{"COPY 1 2", -1},
		{"INSERT 0 5", -1},
		{"copy 5", -1},
		{"", -1},
	} {
		if got := copyCount([]byte(tc.tag)); got != tc.want {
			t.Errorf("copyCount(%q) = %d, want %d", tc.tag, got, tc.want)
		}
	}
}

// copyCount never panics, and agrees with strconv on what it accepts.
func FuzzCopyCount(f *testing.F) {
	for _, s := range []string{"COPY 0", "COPY 12", "COPY ", "INSERT 0 1", "COPY 99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tag string) {
		n := copyCount([]byte(tag))
		digits, ok := strings.CutPrefix(tag, "COPY ")
		want, err := strconv.ParseInt(digits, 10, 64)
		if !ok || err != nil || want < 0 || strings.ContainsAny(digits, "+-") {
			want = -1
		}
		if n != want {
			t.Fatalf("copyCount(%q) = %d, want %d", tag, n, want)
		}
	})
}

func TestBackoffBounds(t *testing.T) {
	b := backoff{initial: 100, max: 1000}
	for i := range 20 {
		d := b.next()
		if d < 50 || d > 1000 {
			t.Fatalf("step %d: %d out of bounds", i, d)
		}
	}
}

// The cap on a committer's pieces after server timeouts: halved by each
// timeout (never raised by one), doubled by a commit fast enough that twice
// the cap would take under half the timed-out attempt's time, or once per
// pieceRelax whatever the speed, and gone at max_rows.
func TestPieceCap(t *testing.T) {
	s := &Sink{cfg: Config{Batch: BatchConfig{MaxRows: 5000}}}
	c := &committer{s: s}
	c.pieceCommitted(100)
	if c.piece != 0 {
		t.Fatalf("a commit set a cap: %d", c.piece)
	}
	c.pieceTimedOut(5000, 5*time.Second)
	c.pieceTimedOut(2500, 5*time.Second)
	if c.piece != 1250 || c.limit != 5*time.Second {
		t.Fatalf("after two timeouts: cap %d, limit %v; want 1250, 5s", c.piece, c.limit)
	}
	c.pieceTimedOut(5000, 5*time.Second) // a held batch's uncut rest
	if c.piece != 1250 {
		t.Fatalf("a timeout of 5000 rows raised the cap to %d", c.piece)
	}
	c.took = 1200 * time.Millisecond // 2500 rows would take 2.4 s, under half of 5 s
	c.pieceCommitted(1250)
	if c.piece != 2500 {
		t.Fatalf("a fast commit left the cap at %d, want 2500", c.piece)
	}
	c.took = 2 * time.Second // 5000 rows would take 4 s: too slow
	c.pieceCommitted(2500)
	if c.piece != 2500 {
		t.Fatalf("a slow commit moved the cap to %d", c.piece)
	}
	c.pieceTimedOut(2500, 5*time.Second)
	c.took = 2 * time.Second // 1250 rows: 2500 would take 4 s
	c.pieceCommitted(1250)
	if c.piece != 1250 {
		t.Fatalf("a slow commit moved the cap to %d", c.piece)
	}
	c.pieceAt = time.Now().Add(-pieceRelax)
	c.pieceCommitted(1250)
	if c.piece != 2500 || time.Since(c.pieceAt) > time.Minute/2 {
		t.Fatalf("after pieceRelax: cap %d, changed %v ago; want 2500, now", c.piece, time.Since(c.pieceAt))
	}
	c.pieceCommitted(1250)
	if c.piece != 2500 {
		t.Fatalf("doubled again by relaxing: %d", c.piece)
	}
	c.took = time.Millisecond
	c.pieceCommitted(2500)
	if c.piece != 0 {
		t.Fatalf("a cap of max_rows is left: %d", c.piece)
	}
}

// Sanitize then ParseTable gives the same parts back, and ParseTable never
// panics.
func FuzzParseTable(f *testing.F) {
	for _, s := range []string{"events", "a.b", `"a.b".c`, `x"; drop table y; --`, `"a""b"`, "", ".", `"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseTable(s)
		if err != nil {
			return
		}
		again, err := ParseTable(id.Sanitize())
		if err != nil || len(again) != len(id) {
			t.Fatalf("%q -> %q -> %q, %v", s, id.Sanitize(), again, err)
		}
		for i := range id {
			if again[i] != id[i] {
				t.Fatalf("%q -> %q -> %q", s, id.Sanitize(), again)
			}
		}
	})
}

// The batcher's cut rules without a database: fill moves rows from the
// carry and stops exactly at max_rows and max_bytes.
func TestFillLimits(t *testing.T) {
	rs, _ := rows(1, 10, nil)
	size := len(rs[0].Tuple)
	for _, tc := range []struct {
		cfg  BatchConfig
		want int
	}{
		{BatchConfig{MaxRows: 4, MaxBytes: 1 << 20}, 4},
		{BatchConfig{MaxRows: 100, MaxBytes: 3 * size}, 3},
		{BatchConfig{MaxRows: 100, MaxBytes: 3*size - 1}, 2},
		{BatchConfig{MaxRows: 100, MaxBytes: 1}, 1}, // a row larger than max_bytes goes alone
		{BatchConfig{MaxRows: 100, MaxBytes: 1 << 20}, 10},
	} {
		r := &run{carry: &batch{rows: make([]pipeline.Row, 0, carrySize)}}
		r.carry.rows = append(r.carry.rows, rs...)
		b := &batch{rows: make([]pipeline.Row, 0, tc.cfg.MaxRows)}
		full := r.fill(b, &tc.cfg)
		if len(b.rows) != tc.want || full != (tc.want < 10) || r.carry.lo != tc.want {
			t.Errorf("%+v: %d rows, full %v, carry at %d; want %d", tc.cfg, len(b.rows), full, r.carry.lo, tc.want)
		}
	}
}

// Rows older than the batch they join (a worker held them back while it
// dead-lettered others of its chunk) bring the batch's clocks forward: its
// max_delay deadline, and its next InProgress, which is then due when
// theirs is, not a whole interval after the batch's last beat.
func TestOlderRowsBringTheBatchClocksForward(t *testing.T) {
	const every = 4 * time.Second
	cfg := BatchConfig{MaxRows: 100, MaxBytes: 1 << 20, MaxDelay: time.Second}
	r := &run{s: &Sink{cfg: Config{InProgressEvery: every}}, carry: &batch{rows: make([]pipeline.Row, 0, carrySize)}}
	t0 := time.Now()
	take := func(rs []pipeline.Row, received time.Time) {
		for i := range rs {
			rs[i].Event.Received = received
		}
		copy(r.carry.rows[:len(rs)], rs)
		r.setCarry(len(rs))
	}
	b := &batch{rows: make([]pipeline.Row, 0, cfg.MaxRows)}
	newer, newerMsgs := rows(1, 2, nil)
	take(newer, t0)
	r.fill(b, &cfg)
	r.s.beat(b, t0.Add(every/2), every) // the batch's first beat
	if n := newerMsgs[0].inProgress.Load(); n != 1 {
		t.Fatalf("%d InProgress at the first beat, want 1", n)
	}

	older, olderMsgs := rows(3, 2, nil)
	held := t0.Add(-every)
	take(older, held)
	r.fill(b, &cfg)
	if len(b.rows) != 4 || !b.since.Equal(held) || !b.deadline.Equal(held.Add(cfg.MaxDelay)) {
		t.Fatalf("%d rows, since %v, deadline %v; want 4 rows, since %v, deadline %v",
			len(b.rows), b.since.Sub(t0), b.deadline.Sub(t0), held.Sub(t0), held.Add(cfg.MaxDelay).Sub(t0))
	}
	// The older rows' first beat was due at held + every/2, before they
	// joined; the batch's own next one is every after its first.
	r.s.beat(b, t0.Add(every/2+time.Millisecond), every)
	for i, m := range olderMsgs {
		if n := m.inProgress.Load(); n != 1 {
			t.Errorf("older row %d: %d InProgress at the next tick, want 1", i, n)
		}
	}
	r.s.beat(b, t0.Add(every), every) // not due again yet
	if n := olderMsgs[0].inProgress.Load(); n != 1 {
		t.Errorf("older row: %d InProgress, want 1: a beat is due every after the last", n)
	}
}

// consumer/wire stamps Received with the wall clock only: the carry's clock
// still starts at the oldest receipt and keeps a monotonic reading, so that
// later beats and deadlines do not follow wall-clock steps.
func TestCarryClockFromWallOnlyReceipts(t *testing.T) {
	r := &run{s: &Sink{cfg: Config{InProgressEvery: 4 * time.Second}}, carry: &batch{rows: make([]pipeline.Row, 0, carrySize)}}
	rs, _ := rows(1, 3, nil)
	before := time.Now()
	for i := range rs {
		age := time.Duration(i+1) * time.Second
		rs[i].Event.Received = time.Unix(0, before.Add(-age).UnixNano()) // no monotonic reading
	}
	copy(r.carry.rows[:len(rs)], rs)
	r.setCarry(len(rs))
	after := time.Now()
	since := r.carry.since
	if lo, hi := before.Add(-3*time.Second-time.Millisecond), after.Add(-3*time.Second); since.Before(lo) || since.After(hi) {
		t.Errorf("since %v after the start, want the oldest receipt, 3s before", since.Sub(before))
	}
	if !strings.Contains(since.String(), " m=") {
		t.Errorf("since %v has no monotonic reading", since)
	}
	if want := since.Add(2 * time.Second); !r.carry.due.Equal(want) {
		t.Errorf("due %v, want since + InProgressEvery/2", r.carry.due.Sub(since))
	}
}

// A failed connect says each distinct line once, and keeps its cause.
func TestConnectErrorSaysEachTryOnce(t *testing.T) {
	try := errors.New("\ta (1): dial error: connection refused")
	cause := errors.Join(errors.New("failed to connect to `user=u database=x`:"), try, try)
	err := error(&connectError{where: "db:5432/x", err: cause})
	if got := err.Error(); !strings.HasPrefix(got, "connect to postgres db:5432/x: failed") || strings.Count(got, "connection refused") != 1 {
		t.Errorf("Error() = %q, want where and each line once", got)
	}
	if !errors.Is(err, try) {
		t.Errorf("the cause is lost: %v", err)
	}
}

// Under sslmode=prefer a server without TLS refuses it, and the try without
// TLS follows: the refusal is no error, and the failed connect says only
// what the second try met. Under sslmode=require it is the whole story.
func TestConnectErrorLeavesOutTheRefusedTLSTry(t *testing.T) {
	head := errors.New("failed to connect to `user=u database=x`:")
	tls := errors.New("\ta (1): tls error: server refused TLS connection")
	auth := errors.New("\ta (1): failed SASL auth: FATAL: password authentication failed for user \"u\" (SQLSTATE 28P01)")
	got := (&connectError{where: "db:5432/x", err: errors.Join(head, tls, auth)}).Error()
	if strings.Contains(got, "tls error") || !strings.Contains(got, "28P01") || !strings.Contains(got, "user=u") {
		t.Errorf("prefer: Error() = %q, want the second try's error alone", got)
	}
	got = (&connectError{where: "db:5432/x", err: errors.Join(head, tls)}).Error()
	if !strings.Contains(got, "server refused TLS connection") {
		t.Errorf("require: Error() = %q, want the TLS refusal", got)
	}
	// A failover list under require: each host's refusal is its own.
	other := errors.New("\tb (2): tls error: server refused TLS connection")
	got = (&connectError{where: "a,b/x", err: errors.Join(head, tls, other)}).Error()
	if strings.Count(got, "server refused TLS connection") != 2 {
		t.Errorf("require, two hosts: Error() = %q, want both refusals", got)
	}
}

// A connect the server refused with a DETAIL or HINT says them: pgx's text
// leaves them out, and "Hot standby mode is disabled." is why a standby
// refuses (57P03). Each try of a failover list keeps its own.
func TestConnectErrorSaysTheServersDetail(t *testing.T) {
	standby := &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P03",
		Message: "the database system is not accepting connections", Detail: "Hot standby mode is disabled."}
	starting := &pgconn.PgError{Severity: "FATAL", Code: "57P03",
		Message: "the database system is starting up", Hint: "try later"}
	head := errors.New("failed to connect to `user=u database=x`:")
	try := func(host string, pe *pgconn.PgError) error {
		return fmt.Errorf("\t%s (%s): server error: %w", host, host, pe)
	}
	got := (&connectError{where: "a,b/x", err: errors.Join(head, try("a", standby), try("b", starting))}).Error()
	for _, want := range []string{
		"not accepting connections (SQLSTATE 57P03) (DETAIL: Hot standby mode is disabled.)",
		"starting up (SQLSTATE 57P03) (HINT: try later)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Error() = %q, want %q", got, want)
		}
	}
	// Two tries that met the same refusal (sslmode=prefer's, with TLS and
	// without) are one line, which says the detail once.
	again := *standby
	got = (&connectError{where: "a/x", err: errors.Join(head, try("a", standby), try("a", &again))}).Error()
	if strings.Count(got, "Hot standby mode is disabled.") != 1 {
		t.Errorf("Error() = %q, want the detail once", got)
	}
	// Two hosts that refused with the same message, each with its own
	// detail: each line says its own.
	other := *standby
	other.Detail = "another detail"
	got = (&connectError{where: "a,b/x", err: errors.Join(head, try("a", standby), try("b", &other))}).Error()
	for _, want := range []string{
		"a (a): server error: FATAL: the database system is not accepting connections (SQLSTATE 57P03) (DETAIL: Hot standby mode is disabled.)",
		"b (b): server error: FATAL: the database system is not accepting connections (SQLSTATE 57P03) (DETAIL: another detail)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Error() = %q, want %q", got, want)
		}
	}
	// An ERROR (not a connect's refusal) is as pgx says it.
	plain := &pgconn.PgError{Severity: "ERROR", Code: "42501", Message: "no", Detail: "a row's value"}
	if got := (&connectError{where: "a/x", err: try("a", plain)}).Error(); strings.Contains(got, "DETAIL") {
		t.Errorf("Error() = %q, want no detail of an ERROR", got)
	}
}

// A URL naming several hosts (a failover list) is named whole in the log
// and errors, and each host gets the least connect timeout, so that a dead
// first host does not hold up every connect to the live one for
// dead_connection_timeout; a connect_timeout of the URL's own is kept.
func TestFailoverListConnect(t *testing.T) {
	for _, c := range []struct {
		url, where string
		timeout    time.Duration
	}{
		{"postgres://u@db1:5432/x?sslmode=disable", "db1:5432/x", time.Minute},
		{"postgres://u@db1:5432,db2:5433/x?sslmode=prefer", "db1:5432,db2:5433/x", minConnectTimeout},
		{"postgres://u@db1,[::1]:5433/x?sslmode=disable&target_session_attrs=read-write", "db1:5432,[::1]:5433/x", minConnectTimeout},
		{"postgres://u@db1,db2/x?connect_timeout=3", "db1:5432,db2:5432/x", 3 * time.Second},
	} {
		cfg := DefaultConfig()
		cfg.URL = c.url
		cfg.DeadConnectionTimeout = time.Minute
		s, err := New(context.Background(), cfg, testCols, &recDL{}, testLogger(t))
		if err != nil {
			t.Fatalf("New(%s): %v", c.url, err)
		}
		if s.where != c.where || s.connCfg.ConnectTimeout != c.timeout {
			t.Errorf("%s: where %q, connect timeout %v; want %q, %v", c.url, s.where, s.connCfg.ConnectTimeout, c.where, c.timeout)
		}
		s.Close()
	}
}

// dropSettled drops the settled prefix, gives its tuples back, and keeps
// the rest, tuples intact, at the front.
func TestBatchDropSettled(t *testing.T) {
	rs, _ := rows(1, 5, nil)
	want := make([]string, 0, 2)
	for _, r := range rs[3:] {
		want = append(want, string(r.Tuple))
	}
	b := &batch{rows: rs, lo: 3}
	for _, r := range rs {
		b.bytes += len(r.Tuple)
	}
	if n := b.dropSettled(10); n != 3 || b.lo != 0 || len(b.rows) != 2 {
		t.Fatalf("dropped %d: lo %d, %d rows; want 3, 0, 2", n, b.lo, len(b.rows))
	}
	for i, r := range b.rows {
		if r.Event.StreamSeq != uint64(4+i) || string(r.Tuple) != want[i] {
			t.Fatalf("row %d: seq %d, tuple %q; want seq %d, %q", i, r.Event.StreamSeq, r.Tuple, 4+i, want[i])
		}
	}
	if b.bytes != len(want[0])+len(want[1]) {
		t.Fatalf("bytes %d", b.bytes)
	}
	if n := b.dropSettled(10); n != 0 || len(b.rows) != 2 {
		t.Fatalf("nothing settled: dropped %d", n)
	}
	b.lo = 2
	if n := b.dropSettled(1); n != 1 || b.lo != 1 || b.rows[0].Event.StreamSeq != 5 {
		t.Fatalf("upto 1: dropped %d, lo %d, first seq %d", n, b.lo, b.rows[0].Event.StreamSeq)
	}
}

// The staging table's name follows the mapping's column types: a session
// that kept another mapping's staging table (a pooler in transaction mode
// hands it to this client) does not take it, as CREATE TEMP TABLE IF NOT
// EXISTS would; the same mapping finds its own again.
func TestStagingTableFollowsTheMapping(t *testing.T) {
	a, b := stagingTable(`"v" int8`), stagingTable(`"v" float8`)
	if a.Sanitize() == b.Sanitize() {
		t.Fatalf("the staging tables of two mappings share the name %s", a.Sanitize())
	}
	if again := stagingTable(`"v" int8`); again.Sanitize() != a.Sanitize() || a[0] != "pg_temp" {
		t.Fatalf("staging table %s, then %s, for one mapping; want one name in pg_temp", a.Sanitize(), again.Sanitize())
	}
}

// A dead letter says that its row may already be stored when it may: a
// redelivery, a batch with a commit of unknown outcome, or, in exactly-once
// mode, a refusal raised in a function the INSERT from staging called (a
// BEFORE INSERT trigger runs before ON CONFLICT finds a stored row), or
// any refusal of the INSERT from staging that could not be looked up in the
// table (a CHECK is judged before ON CONFLICT too). Only lone timeouts'
// letters said so.
func TestDeadLetterSaysItMayBeStored(t *testing.T) {
	const suffix = "it may already be stored"
	check := &pgconn.PgError{Code: "23514", ConstraintName: "ok", Message: "check", Where: "COPY t, line 1"}
	trigger := &pgconn.PgError{Code: "P0001", Message: "row refused", Where: "PL/pgSQL function f() line 1 at RAISE"}
	for _, tc := range []struct {
		name      string
		mode      Mode
		delivered uint32
		unknown   bool
		err       error
		stored    bool
	}{
		{"first delivery", AtLeastOnce, 1, false, &copyStmtError{n: 1, err: check}, false},
		{"redelivery", AtLeastOnce, 2, false, &copyStmtError{n: 1, err: check}, true},
		{"unknown commit", AtLeastOnce, 1, true, &copyStmtError{n: 1, err: check}, true},
		{"trigger, at-least-once", AtLeastOnce, 1, false, &copyStmtError{n: 1, err: trigger}, false},
		// Not looked up (no server to connect to): a CHECK judges a
		// stored row before ON CONFLICT too (one added NOT VALID since).
		{"exactly-once check", ExactlyOnce, 1, false, &fromStagingError{n: 1, err: &pgconn.PgError{Code: "23514", ConstraintName: "ok"}}, true},
		{"exactly-once staging COPY", ExactlyOnce, 1, false, &copyStmtError{n: 1, err: &pgconn.PgError{Code: "22P03", Where: "COPY s, line 1, column a"}}, false},
		{"exactly-once trigger", ExactlyOnce, 1, false, &fromStagingError{n: 1, err: trigger}, true},
		{"exactly-once redelivery", ExactlyOnce, 3, false, &fromStagingError{n: 1, err: check}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dl := &recDL{}
			s := &Sink{dl: dl, log: slog.New(slog.DiscardHandler)}
			s.cfg.Mode = tc.mode
			cc, err := pgx.ParseConfig("postgres://jetsink@127.0.0.1:1/none?connect_timeout=5") // nothing listens on port 1
			if err != nil {
				t.Fatal(err)
			}
			s.connCfg = cc
			c := &committer{s: s, unknown: tc.unknown}
			rs, ms := rows(1, 1, nil)
			rs[0].Event.Delivered = tc.delivered
			c.deadLetter(context.Background(), &batch{rows: rs}, 0, tc.err)
			letters, _ := dl.letters()
			if len(letters) != 1 || ms[0].terms.Load() != 1 {
				t.Fatalf("letters %+v, terms %d; want one", letters, ms[0].terms.Load())
			}
			if got := strings.Contains(letters[0].Reason, suffix); got != tc.stored {
				t.Errorf("reason %q: says it may be stored: %v, want %v", letters[0].Reason, got, tc.stored)
			}
		})
	}
}

// A suspect error is logged once per SQLSTATE, with the server's message
// when no function or trigger raised it (a wraparound stop says why, and
// what to do), never with a RAISE's, which may quote a row.
func TestLogSuspectQuotesOnlyTheServersOwnMessages(t *testing.T) {
	var buf bytes.Buffer
	s := &Sink{log: slog.New(slog.NewTextHandler(&buf, nil)), seenErrs: map[string]struct{}{}}
	wrap := &pgconn.PgError{Severity: "ERROR", Code: "54000",
		Message: `database is not accepting commands that assign new transaction IDs to avoid wraparound data loss in database "db"`}
	raised := &pgconn.PgError{Severity: "ERROR", Code: "P0001", Message: "row secret-42 refused", Where: "PL/pgSQL function f() line 3 at RAISE"}
	fromTrigger := &pgconn.PgError{Severity: "ERROR", Code: "XX000", Message: "secret-43", Where: "PL/pgSQL function g() line 1"}
	// A CHECK every row fails: named, as the fix starts there.
	check := &pgconn.PgError{Severity: "ERROR", Code: "23514", Message: `new row for relation "t" violates check constraint "c90"`,
		Detail: "Failing row contains (secret-44).", TableName: "t", ConstraintName: "c90", Where: "COPY t, line 1"}
	// A value refused: its message may quote it.
	cast := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: `invalid input syntax for type integer: "secret-45"`}
	for _, err := range []error{wrap, wrap, raised, fromTrigger, check, cast} {
		s.logSuspect(fmt.Errorf("copy: %w", err))
	}
	out := buf.String()
	if !strings.Contains(out, "sqlstate=23514 table=t constraint=c90") {
		t.Errorf("a CHECK's refusal logged without the table and the constraint:\n%s", out)
	}
	if got := shownError(check, classSuspect); got != "SQLSTATE 23514, table t, constraint c90" {
		t.Errorf("shownError = %q", got)
	}
	if n := strings.Count(out, "sqlstate=54000"); n != 1 || !strings.Contains(out, "to avoid wraparound") || !strings.Contains(out, "vacuumed") {
		t.Errorf("54000 logged %d times, want once with its message and the hint:\n%s", n, out)
	}
	if strings.Contains(out, "secret") || !strings.Contains(out, "sqlstate=P0001") || !strings.Contains(out, "sqlstate=XX000") {
		t.Errorf("a raised message was logged, or a SQLSTATE not:\n%s", out)
	}
}

// The rows of a miscounted COPY are each renewed (InProgress) before their
// dead letters: while NATS refuses InProgress, that is one warning a while
// for the sink, not one per row (up to max_rows); the counter has them all.
func TestRefusedRenewWarnsOnceAWhile(t *testing.T) {
	var buf bytes.Buffer
	dl := &recDL{}
	s := &Sink{cfg: Config{InProgressEvery: time.Second}, dl: dl, log: slog.New(slog.NewTextHandler(&buf, nil))}
	c := &committer{s: s}
	const n = 50
	rs, ms := rows(1, n, nil)
	defer pipeline.ReleaseRows(rs)
	for _, m := range ms {
		m.refuseInProgress.Store(1)
	}
	b := &batch{rows: rs}
	c.deadLetterMiscounted(context.Background(), b, 0, n, &miscountError{sent: n, stored: n - 1})
	if letters, _ := dl.letters(); len(letters) != n || s.Stats().InProgressErrors != n {
		t.Fatalf("%d dead letters, %d InProgress refused; want %d of each", len(letters), s.Stats().InProgressErrors, n)
	}
	if got := strings.Count(buf.String(), "level=WARN msg=\"in-progress failed"); got != 1 {
		t.Errorf("%d warnings for %d refused InProgress in a row, want 1:\n%s", got, n, buf.String())
	}
}

// A batch starts with room for batchStart rows, whatever max_rows says, and
// fill grows it as rows come: every row lands in order, max_rows stays
// exact, and the room never passes max_rows, so shrink keeps it for the
// next batch. Room that absorb added past max_rows shrink gives back.
func TestFillGrowsTheBatchUpToMaxRows(t *testing.T) {
	const n = 3000
	rs, _ := rows(1, n, nil)
	defer pipeline.ReleaseRows(rs)
	for _, maxRows := range []int{maxBatchRows, 2500, 1000} {
		cfg := BatchConfig{MaxRows: maxRows, MaxBytes: 1 << 30}
		r := &run{carry: &batch{rows: make([]pipeline.Row, 0, carrySize)}}
		b := &batch{rows: make([]pipeline.Row, 0, min(maxRows, batchStart))}
		for next := 0; next < n && len(b.rows) < maxRows; {
			k := copy(r.carry.rows[:carrySize], rs[next:])
			r.carry.rows, r.carry.lo = r.carry.rows[:k], 0
			r.fill(b, &cfg)
			next += r.carry.lo
		}
		want := min(n, maxRows)
		if len(b.rows) != want || cap(b.rows) > maxRows {
			t.Fatalf("max_rows %d: %d rows, room for %d; want %d rows, room for at most max_rows", maxRows, len(b.rows), cap(b.rows), want)
		}
		for i := range b.rows {
			if b.rows[i].Event.StreamSeq != uint64(i+1) {
				t.Fatalf("max_rows %d: row %d is event %d", maxRows, i, b.rows[i].Event.StreamSeq)
			}
		}
		grown := cap(b.rows)
		clear(b.rows) // the rows are rs's: released once, by the test
		b.rows = b.rows[:0]
		b.shrink(maxRows)
		if cap(b.rows) != grown {
			t.Fatalf("max_rows %d: shrink took the room fill grew (%d) down to %d", maxRows, grown, cap(b.rows))
		}
	}
	b := &batch{rows: make([]pipeline.Row, 0, 10)}
	b.absorb(&batch{rows: make([]pipeline.Row, 20)})
	b.rows = b.rows[:0]
	if b.shrink(10); cap(b.rows) != 10 {
		t.Fatalf("shrink left room for %d rows after absorb, want 10", cap(b.rows))
	}
}

// strandedRun is a drained run (the batcher done) with n committers, each
// holding a batch, for the tests of committer.strandedWait; commit
// records a commit of an attempt that starts now, refuse the refusal of
// a committer's rows with a suspect error (no commit since).
func strandedRun(n int) (r *run, cs []*committer, commit func(), refuse func(c *committer)) {
	s := &Sink{}
	r = &run{s: s, stranded: map[*committer]struct{}{}, strandChange: make(chan struct{})}
	for range n {
		cs = append(cs, &committer{s: s, r: r})
	}
	r.addWork(n)
	r.workDone.Store(true)
	commit = func() { s.st.committedStart.Store(s.st.attemptSeq.Add(1)) }
	refuse = func(c *committer) { c.suspectFrom(s.st.attemptSeq.Add(1)) }
	return r, cs, commit, refuse
}

// workingNow is run.working, read under its lock.
func (r *run) workingNow() int {
	r.strandMu.Lock()
	defer r.strandMu.Unlock()
	return r.working
}

// Once every committer is stranded, one of them tries its rows once more
// (a last try), and its try counts as work: the others wait for what it
// shows. A committer that goes back to work (another's commit shows that
// the table takes rows, and it bisects) keeps the others from giving up
// until it is stranded again, and a row refused anew gets a last try of
// its own. The sequence a review found (three connections, the table
// fixed as the drain began): A, B and C stranded; A's last try fails,
// B's commits; A and C see it and bisect; A's next refused row must not
// be given up while C still commits, nor without a try once C is done.
// The looks are ordered by holding some back (a strand alone).
func TestStrandedIsAStateNotAnEvent(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	r, cs, commit, refuse := strandedRun(3)
	a, b, c := cs[0], cs[1], cs[2]
	for _, x := range cs {
		refuse(x)
	}
	r.strandMu.Lock()
	b.strandLocked()
	c.strandLocked()
	r.strandMu.Unlock()
	if err := a.strandedWait(ctx, time.Hour); err != nil {
		t.Fatalf("A's wait with every committer stranded = %v, want nil: its last try", err)
	}
	// A's last try fails, with nothing committed: B's and C's are to come.
	errA := make(chan error, 1)
	go func() { errA <- a.strandedWait(ctx, time.Hour) }()
	if err := b.strandedWait(ctx, time.Hour); err != nil {
		t.Fatalf("B's wait = %v, want nil: its last try", err)
	}
	if n := r.workingNow(); n != 1 {
		t.Fatalf("working = %d during B's last try, want 1: a try counts as work", n)
	}
	// B's last try commits, and B is done: A tries again.
	commit()
	r.finished()
	if err := <-errA; err != nil {
		t.Fatalf("A's wait after B's commit = %v, want nil: another try", err)
	}
	// C looks while A tries: a retry after its backoff, which counts as
	// work too.
	if err := c.strandedWait(ctx, time.Millisecond); err != nil {
		t.Fatalf("C's wait with A trying = %v, want nil (a retry)", err)
	}
	if n := r.workingNow(); n != 2 {
		t.Fatalf("working = %d with A trying and C retrying, want 2", n)
	}
	// A's and C's tries, refused, see B's commit: they bisect. A commits
	// a piece, dead-letters its row, and its next row is refused, with
	// no commit since.
	if !a.tableTakesRows() || !c.tableTakesRows() {
		t.Fatal("B's commit does not show A and C that the table takes rows")
	}
	commit()
	a.suspectFrom(0)
	refuse(a)
	for i := range 3 {
		if err := a.strandedWait(ctx, time.Millisecond); err != nil {
			t.Fatalf("A's wait %d with C committing = %v, want nil (a retry)", i+1, err)
		}
	}
	// C is done, without a commit since: A's new row gets its last try.
	r.finished()
	if err := a.strandedWait(ctx, time.Hour); err != nil {
		t.Fatalf("A's wait once C is done = %v, want nil: the new row's last try", err)
	}
	if err := a.strandedWait(ctx, time.Hour); !isGivenUp(err) {
		t.Fatalf("A's wait after the new row's last try failed = %v, want a *givenUpError", err)
	}
}

// A committer whose last try has failed does not give its rows up while
// another, stranded, has its last try still to come (run.triesToCome): that
// try may commit. Y's look is held back here (its strand alone) so that
// X looks first.
func TestStrandedWaitsForTheOthersLastTries(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	r, cs, _, refuse := strandedRun(2)
	x, y := cs[0], cs[1]
	refuse(x)
	refuse(y)
	r.strandMu.Lock()
	y.strandLocked()
	r.strandMu.Unlock()
	if err := x.strandedWait(ctx, time.Hour); err != nil {
		t.Fatalf("X's first wait = %v, want nil: its last try", err)
	}
	if err := x.strandedWait(ctx, time.Millisecond); err != nil {
		t.Fatalf("X's wait with Y's last try to come = %v, want nil (a retry)", err)
	}
	errX := make(chan error, 1)
	go func() { errX <- x.strandedWait(ctx, time.Hour) }()
	if err := y.strandedWait(ctx, time.Hour); err != nil {
		t.Fatalf("Y's wait = %v, want nil: its last try", err)
	}
	if err := y.strandedWait(ctx, time.Hour); !isGivenUp(err) {
		t.Fatalf("Y's wait after its last try failed = %v, want a *givenUpError", err)
	}
	if err := <-errX; !isGivenUp(err) {
		t.Fatalf("X's wait after both last tries failed = %v, want a *givenUpError", err)
	}
	if n := r.workingNow(); n != 0 {
		t.Fatalf("working = %d with both given up, want 0", n)
	}
}

// A committer does not give its rows up while another, stranded, has a
// try to come after its last one: a commit since its rows were refused
// (tableTakesRows) sends it to try again, and that try may commit, and
// have the first one's rows dead-lettered. The sequence a review found
// (three connections): A, C and D stranded; D's last try fails, C's
// commits and C goes on; A's retry sees C's commit, bisects, and its
// next row is refused anew; C is done; A's new row gets its last try,
// which fails, before D has looked again. D's look is held back here
// (its strand alone) so that A looks first.
func TestStrandedWaitsForATryAfterACommit(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	r, cs, commit, refuse := strandedRun(3)
	a, c, d := cs[0], cs[1], cs[2]
	for _, x := range cs {
		refuse(x)
	}
	r.strandMu.Lock()
	a.strandLocked()
	c.strandLocked()
	r.strandMu.Unlock()
	if err := d.strandedWait(ctx, time.Hour); err != nil {
		t.Fatalf("D's wait = %v, want nil: its last try", err)
	}
	// D's last try fails; it strands, and looks later.
	r.strandMu.Lock()
	d.strandLocked()
	r.strandMu.Unlock()
	if err := c.strandedWait(ctx, time.Hour); err != nil {
		t.Fatalf("C's wait = %v, want nil: its last try", err)
	}
	// C's last try commits, and C goes on with its batch. A retries
	// after its backoff, sees C's commit, bisects, and its next row is
	// refused with no commit since.
	commit()
	if err := a.strandedWait(ctx, time.Millisecond); err != nil {
		t.Fatalf("A's wait with C committing = %v, want nil (a retry)", err)
	}
	if !a.tableTakesRows() || !d.tableTakesRows() {
		t.Fatal("C's commit does not show A and D that the table takes rows")
	}
	a.suspectFrom(0)
	refuse(a)
	r.finished() // C is done
	if err := a.strandedWait(ctx, time.Hour); err != nil {
		t.Fatalf("A's wait once C is done = %v, want nil: the new row's last try", err)
	}
	// A's last try fails: D has a try to come, after C's commit.
	errA := make(chan error, 1)
	go func() { errA <- a.strandedWait(ctx, time.Hour) }()
	if err := d.strandedWait(ctx, time.Hour); err != nil {
		t.Fatalf("D's wait after C's commit = %v, want nil: another try", err)
	}
	// D's try commits, and D is done: A tries again.
	commit()
	r.finished()
	if err := <-errA; err != nil {
		t.Fatalf("A's wait after D's commit = %v, want nil: another try (A gave its rows up while D's try was to come)", err)
	}
}

func isGivenUp(err error) bool {
	_, ok := errors.AsType[*givenUpError](err)
	return ok
}

// A committer that offers its batch for long (handOff's wait is the
// backoff of its failing connects, up to Retry.Max) holds workMu's read
// lock a turn of handWait at a time: the batcher's closeWork, at the end
// of a drain, waits for one turn at most, not for the whole wait, and the
// offer then ends with errWorkDone (the batch is committed by its own
// committer).
func TestHandOffLetsWorkClose(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	r := &run{ready: make(chan struct{}, 2), work: make(chan *batch)}
	c := &committer{r: r}
	done := make(chan error, 1)
	go func() { done <- c.handOff(ctx, &batch{}, 20*time.Second) }()
	waitFor(t, ctx, "the offer holding the read lock", func() bool {
		if r.workMu.TryLock() {
			r.workMu.Unlock()
			return false
		}
		return true
	})
	start := time.Now()
	r.closeWork()
	if d := time.Since(start); d > 3*handWait {
		t.Errorf("closeWork waited %v for an offer of 20s, want handWait (%v) at most", d.Round(time.Millisecond), handWait)
	}
	select {
	case err := <-done:
		if !errors.Is(err, errWorkDone) {
			t.Errorf("handOff = %v once work closed, want errWorkDone", err)
		}
	case <-ctx.Done():
		t.Fatal("handOff went on offering after work closed")
	}
}

// A server older than 12 is an error (the checks would fail on catalog
// columns it lacks), 12 to 14 a warning (past their end of life,
// untested), 15 and newer nothing.
func TestVersionProblem(t *testing.T) {
	for _, c := range []struct {
		num            int
		problem, error bool
		shows          string
	}{
		{90624, true, true, "9.6.24"},
		{90500, true, true, "9.5.0"},
		{100023, true, true, "10.23"},
		{110022, true, true, "11.22"},
		{119999, true, true, "11.9999"},
		{120000, true, false, "12.0"},
		{140015, true, false, "14.15"},
		{149999, true, false, "14.9999"},
		{150000, false, false, ""},
		{150008, false, false, ""},
		{180001, false, false, ""},
	} {
		p, ok := versionProblem(c.num)
		if ok != c.problem || (ok && (p.Warning == c.error || p.Kind != ProblemServerVersion || !strings.Contains(p.Message, "PostgreSQL "+c.shows+" "))) {
			t.Errorf("versionProblem(%d) = %+v, %v; want a problem %v, an error %v, naming %s", c.num, p, ok, c.problem, c.error, c.shows)
		}
	}
}

// The server's release is logged under its own line, not as the table's
// problem: nothing about the table was checked on a server older than 12.
func TestProblemLine(t *testing.T) {
	old, _ := versionProblem(110022)
	eol, _ := versionProblem(140015)
	for _, c := range []struct {
		p     Problem
		level slog.Level
		says  string
	}{
		{old, slog.LevelError, "the PostgreSQL release is older than jetsink supports"},
		{eol, slog.LevelWarn, "the PostgreSQL release is past its end of life"},
		{Problem{Kind: ProblemAsyncCommit, Warning: true}, slog.LevelWarn, "a crash of PostgreSQL"},
		{Problem{Kind: ProblemIgnoredDefault, Warning: true}, slog.LevelWarn, "the table may not store every event as sent"},
		{Problem{Kind: ProblemTableMissing}, slog.LevelError, "the table does not fit the column mapping"},
	} {
		if level, line := problemLine(c.p); level != c.level || !strings.HasPrefix(line, c.says) {
			t.Errorf("problemLine(%s) = %v %q; want %v %q...", c.p.Kind, level, line, c.level, c.says)
		}
	}
}

// Only the COPY statement's error is a copyStmtError, unready when the
// session closed before ReadyForQuery (what classify's 08P01 rule needs):
// not a guard's, nor exactly-once's INSERT or COMMIT.
func TestStatementErrorOfTheCopy(t *testing.T) {
	e := &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01"}
	atLeastOnce := copyQuery{stmts: 2, copyAt: 2, guards: 1 << 1}
	exactlyOnce := copyQuery{stmts: 6, copyAt: 4, guards: 1 << 3, insertAt: 5}
	for _, c := range []struct {
		q    copyQuery
		at   int
		copy bool
	}{
		{atLeastOnce, 1, false}, {atLeastOnce, 2, true},
		{exactlyOnce, 1, false}, {exactlyOnce, 3, false}, {exactlyOnce, 4, true}, {exactlyOnce, 5, false}, {exactlyOnce, 6, false},
	} {
		for _, ready := range []bool{true, false} {
			// Not ready: the connection closed after the ERROR (an older
			// PgBouncer's lost server connection), transient.
			err := (&committer{}).statementError(c.q, copyResult{failedAt: c.at, err: e, ready: ready}, 3)
			if e, ok := errors.AsType[*copyStmtError](err); ok != c.copy || ok && e.unready == ready {
				t.Errorf("statement %d of %+v, ready %v: %v, a copyStmtError %v; want %v, marked unready when not ready", c.at, c.q, ready, err, ok, c.copy)
			}
			want := classTransient
			if c.copy && ready {
				want = classSuspect
			}
			if got := classify(err); got != want {
				t.Errorf("statement %d, ready %v: an ERROR 08P01 classed %v, want %v", c.at, ready, got, want)
			}
			// A key the COPY refuses, under translated lc_messages:
			// the COPY's own one line of context, whether or not the
			// session went on after it; the INSERT from staging has no
			// line of its own, so one there is a function's.
			refused := &pgconn.PgError{Code: "23505", Where: "tのCOPY、行 3"}
			want = classSuspect
			if c.at == c.q.copyAt {
				want = classData
			}
			rerr := (&committer{}).statementError(c.q, copyResult{failedAt: c.at, err: refused, ready: ready}, 3)
			if got := classify(rerr); got != want {
				t.Errorf("statement %d, ready %v: %v classed %v, want %v", c.at, ready, rerr, got, want)
			}
		}
	}
}

// A failed lookup after a commit passes quietly only as a lost connection
// or a first timeout in a row (lost connections between timeouts do not
// break the row), and at most lookupQuietPasses times a batch, within
// stillFailingEvery; other transient server errors are failed attempts.
func TestLookupPasses(t *testing.T) {
	lost := fmt.Errorf("look for rows missing from the table after the commit: %w", io.ErrUnexpectedEOF)
	pooler := &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "08P01", Message: "query_timeout"}
	timeout := &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014"}
	oom := &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "53200"}
	shutdown := &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}
	serial := &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40001"}
	lock := &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "55P03"}
	denied := &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "42501"}
	type step struct {
		err  error
		pass bool
	}
	for name, steps := range map[string][]step{
		"cut every time":               {{lost, true}, {lost, true}, {lost, true}, {lost, false}, {lost, false}},
		"pooler every time":            {{pooler, true}, {pooler, true}, {pooler, true}, {pooler, false}},
		"timeouts between cuts":        {{timeout, true}, {lost, true}, {timeout, false}},
		"timeout after the bound":      {{lost, true}, {lost, true}, {lost, true}, {timeout, false}},
		"out of memory":                {{oom, false}, {lost, true}, {oom, false}},
		"shutdown":                     {{shutdown, false}},
		"serialization":                {{serial, false}},
		"lock timeout":                 {{lock, false}},
		"refused":                      {{denied, false}},
		"other error between timeouts": {{timeout, true}, {oom, false}, {timeout, true}},
	} {
		var p lookupPasses
		now := time.Now()
		for i, s := range steps {
			if got := p.passing(s.err, now); got != s.pass {
				t.Errorf("%s: lookup %d failing with %v passes %v, want %v", name, i+1, s.err, got, s.pass)
			}
			now = now.Add(time.Millisecond)
		}
	}
	var p lookupPasses
	now := time.Now()
	if !p.passing(io.EOF, now) {
		t.Error("a first lost connection does not pass")
	}
	if p.passing(io.EOF, now.Add(stillFailingEvery)) {
		t.Error("a lost connection passes stillFailingEvery after the first failed lookup")
	}
}

// A batch keeps the mark that a commit of its rows had an unknown outcome
// (so the lone-timeout rule's dead letter says a row may already be
// stored) from one process call to the next: a hand-off or another try of
// the batch started from a clean slate and lost it.
func TestMayBeStoredOutlivesProcess(t *testing.T) {
	s := &Sink{cfg: Config{Batch: BatchConfig{MaxRows: 10, MaxBytes: 1 << 20}}, log: slog.New(slog.DiscardHandler)}
	c := &committer{s: s}
	rs, _ := rows(1, 2, nil)
	b := &batch{rows: rs, mayBeStored: true} // its reset, below, releases the rows
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the attempt gives up at once, before any connect
	if err := c.process(ctx, b); !errors.Is(err, context.Canceled) {
		t.Fatalf("process = %v, want context.Canceled", err)
	}
	if !c.unknown || !b.mayBeStored {
		t.Errorf("after process: committer's unknown %v, batch's mayBeStored %v; want both true", c.unknown, b.mayBeStored)
	}
	b.reset()
	if b.mayBeStored {
		t.Error("a reset batch is marked as maybe stored")
	}
}

// OldestAttempt reads the committers' starts as the committers store them,
// stamps on the monotonic clock (s.stamp), not Unix nanoseconds of the wall
// clock, which a step back would hide a stuck attempt from (JetsinkBatchStuck
// late by the step) and a step forward would age. Bounds far from any
// machine's speed: an hour's attempt is past 59 minutes and not a day old.
func TestOldestAttemptOnTheMonotonicClock(t *testing.T) {
	s := &Sink{born: time.Now().Add(-2 * time.Hour), attempts: make([]atomic.Int64, 2)}
	if age := s.OldestAttempt(); age != 0 {
		t.Fatalf("OldestAttempt() = %v with none under way, want 0", age)
	}
	s.attempts[1].Store(s.stamp(time.Now().Add(-time.Hour)))
	if age := s.OldestAttempt(); age < 59*time.Minute || age > 24*time.Hour {
		t.Fatalf("OldestAttempt() = %v for an attempt started an hour ago (stamp %d), want about an hour", age, s.attempts[1].Load())
	}
}

package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// class is what the sink does about a failed attempt.
type class int

const (
	// classTransient: the database or the network hiccuped (SQLSTATE class
	// 08 but an ERROR 08P01 of the COPY statement, 40, 53, 55P03,
	// 55006, 57, 58; 25P03 and 25P04, a session timeout that ended the
	// connection; lost connection; timeout). Retry the whole
	// batch with backoff; one that a statement or transaction timeout
	// ended (timedOut), in smaller pieces.
	classTransient class = iota
	// classData: the database refused a row (SQLSTATE class 22 or 23,
	// raised by the statement, not inside a function it called; but
	// 23514 and 23502, which a constraint every row meets raises too, and
	// a table's expression's class 22, tableExpression).
	// Bisect the batch to find it and dead-letter it.
	classData
	// classConfig: the table, the session or the permissions do not fit
	// the mapping (tableClass: 42xxx, 28xxx, 3Dxxx, 3Fxxx, 25xxx such as
	// a read-only session, 55xxx, ...; a type guard's typesChangedError),
	// or an error that is not the server's. The
	// operator can fix it without losing an event, so the batch is retried
	// with backoff like a transient error, but logged loudly, once per
	// distinct error.
	classConfig
	// classSuspect: any other server error. A row may cause it although
	// it is outside classes 22 and 23: a trigger's RAISE (class P0), an
	// index entry too large for its index (54000), a trigger's recursion
	// too deep (54001), a WITH CHECK OPTION (44000), an internal error
	// (XX000), a feature a value needs (0A000), a CHECK or NOT NULL
	// violation (23514, 23502), a binary field its column's
	// type cannot read (an ERROR 08P01 of the COPY statement, copyStmtError;
	// in class 22, 22P03 and 22P04, see classify; a class 22 error of a
	// table's expression, tableExpression), and any class 22 or 23
	// error raised inside a function (raisedInFunction: a trigger's bug,
	// PERFORM 1/0, fails every row). It may as well come from
	// the table (a trigger that refuses every row), so such a batch is
	// bisected, and a row that fails alone is dead-lettered only once a
	// commit attempt that started after the failure has committed, on any
	// connection; until then it is retried and logged like classConfig
	// (see committer.process). Retrying it forever instead would let one
	// event stop the whole stream.
	classSuspect
)

// tableClass reports whether class (an SQLSTATE's first two characters)
// holds errors that the table, the session or the grants cause, never one
// row: 03, 0B, 0F, 0L, 0P, 0Z (statement, transaction, locator, grantor,
// role and diagnostics states), 24, 25, 26, 2B, 2D, 34, 3B (cursor,
// transaction and savepoint states: 25006 is a read-only session), 28
// (authorization), 3D, 3F (database, schema), 42 (syntax and access: an
// undefined column, a missing grant), 55 (object state: 55000 is a
// deferrable arbiter; 55P03 and 55006 are transient), 72 (snapshot too
// old), F0 (configuration file), HV (foreign data wrapper). Class 09 (a
// triggered action) and every class not listed here may come from a row.
func tableClass(class string) bool {
	switch class {
	case "03", "0B", "0F", "0L", "0P", "0Z", "24", "25", "26", "28", "2B", "2D",
		"34", "3B", "3D", "3F", "42", "55", "72", "F0", "HV":
		return true
	}
	return false
}

// classify is the package's classify, but insufficient_privilege (42501)
// from exactly-once's INSERT while row-level security applies to the
// table (Sink.rowSecurity) is classSuspect: a policy's WITH CHECK refuses
// some rows with it, and so do the SELECT policies the rows they hide
// (ON CONFLICT checks a row against them too).
func (s *Sink) classify(err error) class {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "42501" && s.rowSecurity.Load() {
		if _, ok := errors.AsType[*fromStagingError](err); ok {
			// insufficient_privilege from the INSERT under row-level
			// security: a missing grant, or a row that a policy's
			// WITH CHECK refuses. (Not from a connect, the staging
			// table or a guard: those are a grant's only, and may hit
			// only new connections while others commit.)
			return classSuspect
		}
	}
	return classify(err)
}

// classify says how to handle err (never nil). It uses predicates only.
func classify(err error) class {
	if _, ok := errors.AsType[*typesChangedError](err); ok {
		return classConfig // a guard's division by zero (22012), not a row's
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		if len(code) != 5 {
			return classConfig
		}
		if code == "22P03" || code == "22P04" {
			// invalid_binary_representation, bad_copy_file_format: a
			// column whose type is not the mapping's (binary COPY needs
			// the exact type) fails every row, the table's fault; but
			// the type guards stop such a batch before its COPY
			// (typesChangedError), and a row can cause these too: a
			// trigger may raise any SQLSTATE. Suspect, then: bisected,
			// and a row that fails alone is dead-lettered only once
			// another attempt has committed, which a table every row
			// fails in never lets happen.
			return classSuspect
		}
		if e, ok := errors.AsType[*copyStmtError](err); ok && !e.unready && code == "08P01" && cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity) == "ERROR" {
			// protocol_violation at ERROR severity (the session goes
			// on: statementError wraps it only once ReadyForQuery
			// came; an older PgBouncer's lost server connection, an
			// ERROR 08P01 and then the socket closed, stays
			// transient) from our COPY statement: the server reading a value
			// of a COPY row ("insufficient data left in message": a
			// field shorter than its column's type reads, PostgreSQL
			// 15), 22P03's case for a field too short, not a lost
			// connection (that one ends the session: FATAL). Suspect,
			// as 22P03 is: a fault of every row (one in the wire
			// format) dead-letters nothing, since no other attempt
			// commits. Not told by its context ("COPY t, line 3,
			// column a"), which lc_messages translates, the "COPY"
			// too ("tのCOPY、行 3、列 a").
			return classSuspect
		}
		if code == "2200H" {
			// sequence_generator_limit_exceeded: a serial or identity
			// column has run out of numbers, and every row fails. The
			// table's fault, unless a trigger draws for some rows.
			return classSuspect
		}
		if code == "23514" || code == "23502" {
			// check_violation, not_null_violation: a row's value the
			// constraint refuses, or a constraint that every row
			// meets, the table's fault: a CHECK added (NOT VALID, or
			// to an empty table) that no event passes, a NOT NULL on
			// a column the events leave empty or the mapping does not
			// write, a domain's CHECK, or, without a constraint name,
			// no partition for the row (a table whose next partition
			// is not made yet). Dead-lettered at once, every row of
			// such a table went to the dead-letter stream within
			// seconds; suspect, a row refused alone is dead-lettered
			// once other rows commit beside it, and a table that
			// refuses every row is held and retried until it is fixed.
			return classSuspect
		}
		switch code[:2] {
		case "22", "23":
			if raisedInFunction(err, pgErr) {
				// A trigger's (or a function's a CHECK or a DEFAULT
				// calls) failing: a bug in it (PERFORM 1/0, a cast that
				// fails) fails every row as a refused value does one,
				// and the table's owner fixes it without replaying
				// events. Suspect, as its RAISE is: a row it refuses
				// alone is dead-lettered once other rows commit, and
				// a function that fails every row dead-letters none.
				return classSuspect
			}
			if code[:2] == "22" && tableExpression(err, pgErr) {
				// A value no column's type refused, but an expression
				// of the table's: a CHECK's cast (a CHECK added NOT
				// VALID that fails on every event), a DEFAULT's, a
				// generated column's. Dead-lettered at once, every row
				// of such a table went to the dead-letter stream within
				// seconds (two COPYs a row); suspect, as a CHECK's
				// false is. A value its column's type refuses (named in
				// the context) stays the row's: held, a run of such
				// events (a publisher's bug) would fill the hold and
				// stall the stream behind it.
				return classSuspect
			}
			return classData
		case "08", "40", "53", "57", "58":
			return classTransient
		}
		switch code {
		case "55P03", "55006": // lock_not_available, object_in_use
			return classTransient
		case "25P03", "25P04":
			// idle_in_transaction_session_timeout, transaction_timeout
			// (PostgreSQL 17): the server ended the session (FATAL) and
			// rolled the transaction back. A lost connection, not the
			// table's fault: the next attempt connects anew.
			return classTransient
		}
		if tableClass(code[:2]) {
			return classConfig
		}
		return classSuspect
	}
	var netErr net.Error
	switch {
	case pgconn.Timeout(err), pgconn.SafeToRetry(err),
		errors.As(err, &netErr),
		errors.Is(err, pgconn.ErrConnClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return classTransient
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return classTransient
	}
	if _, ok := errors.AsType[*unreplicatedError](err); ok {
		return classTransient // the standby lags, or was waited for in vain: not the table's fault
	}
	// Anything else (a protocol surprise, a closed tx) is retried on a new
	// connection and reported like a configuration error: loudly.
	return classConfig
}

// tableExpression reports whether pgErr, err's class 22 server error
// (raised by the statement, not in a function it called), is an
// expression of the table's failing rather than a value its column's type
// refuses: at the COPY, a context that names no column ("COPY t, line 3":
// a CHECK's, a DEFAULT's, a generated column's, an index expression's
// cast), against "COPY t, line 3, column a" for the column's own input
// (binary COPY quotes no value). Read in English only: a context in
// another language (lc_messages), and exactly-once's INSERT from staging,
// which has none, are taken for the column's, dead-lettered as before.
func tableExpression(err error, pgErr *pgconn.PgError) bool {
	if _, ok := errors.AsType[*copyStmtError](err); !ok {
		return false
	}
	return strings.HasPrefix(pgErr.Where, "COPY ") && !strings.Contains(pgErr.Where, ", column ")
}

// valueRefused reports whether pgErr, err's server error, is a value
// refused by the statement itself (class 22, not raised in a function):
// its column's type or a table's expression; dead-lettered with code data.
// Not 22P03, 22P04 (a column of another type than the mapping's) or
// 2200H (a sequence that ran out): the table's, mostly.
func valueRefused(err error, pgErr *pgconn.PgError) bool {
	switch pgErr.Code {
	case "22P03", "22P04", "2200H":
		return false
	}
	return strings.HasPrefix(pgErr.Code, "22") && !raisedInFunction(err, pgErr)
}

// raisedInFunction reports whether pgErr, err's server error, was raised
// inside a function that the failed statement called (a trigger, or a
// function a CHECK constraint or a DEFAULT calls), not by the statement
// itself: its context names the function's line before the statement's
// own. The COPY's own errors have one line of context, "COPY t, line n,
// column c" (a value its column refuses, a NOT NULL, a CHECK, a unique
// key), which a function's follow; exactly-once's INSERT from staging, a
// foreign key and a COMMIT have none. The lines are counted, not read,
// since lc_messages translates them ("tのCOPY、行 3、列 a"), but for an
// error not known to be at the COPY statement (copyStmtError, ready or
// not): a line of its own there is a function's unless it reads "COPY ".
// A function in C that fails adds no line: taken for the statement's.
func raisedInFunction(err error, pgErr *pgconn.PgError) bool {
	switch {
	case pgErr.Where == "":
		return false
	case strings.Contains(pgErr.Where, "\n"):
		return true
	}
	if _, ok := errors.AsType[*copyStmtError](err); ok {
		return false
	}
	return !strings.HasPrefix(pgErr.Where, "COPY ")
}

// stillFailingEvery is how often a batch that keeps failing with transient
// errors is logged at Warn again (the attempts between are logged at Debug),
// so that a long outage stays visible in the log, not only in the retries
// counter.
var stillFailingEvery = time.Minute

// withHint appends a "hint" attribute to the log arguments args when err,
// the error an attempt failed with, is one whose fix lies outside the
// table: a server-side timeout or a cancel, or an error of the session
// (sessionHint: a read-only session, 25006; prepared statements a pooler
// in transaction mode shares, 42P05 and 26000). A timeout is retried like
// any transient error, since a lock held elsewhere goes away; a statement
// or transaction timeout shorter than a batch takes is met by cutting the
// batch into pieces (timedOut), which costs time; a lock_timeout or
// idle_in_transaction_session_timeout too short fails every attempt.
// Either way the limit wants raising. Any other error gets no hint.
func withHint(err error, args ...any) []any {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return args
	}
	switch pgErr.Code {
	case "57014", "25P04":
		// query_canceled (statement_timeout, or a cancel request),
		// transaction_timeout: see timedOut.
		return append(args, "hint", "a server timeout or a cancel ended the attempt; the rows are tried again in smaller pieces, down to one "+
			"row, so a lock held elsewhere or a statement_timeout or transaction_timeout shorter than a batch takes costs time, "+
			"not events; raise the timeout for jetsink's role (ALTER ROLE ... SET) or lower postgres.batch.max_rows")
	case "55P03", "25P03":
		// lock_not_available (lock_timeout),
		// idle_in_transaction_session_timeout.
		return append(args, "hint", "a server timeout ended the attempt: a lock held elsewhere goes away, but a lock_timeout "+
			"or idle_in_transaction_session_timeout too short for jetsink's role fails every attempt; raise it (ALTER ROLE ... SET)")
	}
	if h := sessionHint(pgErr); h != "" {
		return append(args, "hint", h)
	}
	return args
}

// pooledStatementsHint is the hint of an error that a pooler in
// transaction mode causes under a default_query_exec_mode that names
// statements or keeps the unnamed one across round trips: pgx's
// cache_statement prepares "stmtcache_..." statements, which another
// client's transaction on the same server session finds already there
// (42P05) or this client's next one misses on another (26000);
// describe_exec prepares the unnamed statement and executes it in a second
// round trip, which may reach another server session (26000). jetsink's
// default (exec) and cache_describe name none and keep none across round
// trips.
const pooledStatementsHint = "a pooler in transaction mode shares server sessions between clients, and pgx's prepared statements do not " +
	"survive that: remove default_query_exec_mode=cache_statement (or describe_exec) from postgres.url (jetsink's default, exec, " +
	"prepares none), or use PgBouncer 1.21 or later with max_prepared_statements set"

// sessionHint is the hint for an error of the session rather than the
// table: a read-only session (25006), which behind a pooler outlasts its
// fix, and prepared statements a pooler shares (42P05
// duplicate_prepared_statement, 26000 invalid_sql_statement_name). ""
// for any other.
func sessionHint(pgErr *pgconn.PgError) string {
	switch pgErr.Code {
	case "25006":
		return "the session is read-only (a standby, or default_transaction_read_only): point postgres.url at the primary, " +
			"or set default_transaction_read_only off for jetsink's role or database; " + readOnlyPoolerFix
	case "42P05", "26000":
		return pooledStatementsHint
	}
	return ""
}

// pooledStatementsError is an error of the admin connection's (Check,
// Init, Ping) with SQLSTATE 42P05 or 26000, which says
// pooledStatementsHint after it (see hintPooledStatements).
type pooledStatementsError struct{ err error }

func (e *pooledStatementsError) Error() string {
	return e.err.Error() + " (" + pooledStatementsHint + ")"
}

func (e *pooledStatementsError) Unwrap() error { return e.err }

// hintPooledStatements is err, or err with pooledStatementsHint when it
// is the server's 42P05 or 26000 (see pooledStatementsHint): check
// and create_table failed with pgx's "prepared statement
// "stmtcache_..." already exists" alone, and run's start-up look
// warned the same.
func hintPooledStatements(err error) error {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok || (pgErr.Code != "42P05" && pgErr.Code != "26000") {
		return err
	}
	if _, ok := errors.AsType[*pooledStatementsError](err); ok {
		return err
	}
	return &pooledStatementsError{err: err}
}

// errHalved is findPoison's answer when a piece timed out (timedOut):
// process goes on in smaller pieces.
var errHalved = errors.New("a piece timed out; halved")

// pieceRelax: a committer whose pieces are capped since a timeout doubles
// the cap at least this often, even if its commits take too long for
// pieceCommitted to, so that a limit raised since (or a lock wait mistaken
// for one) costs at most one timed-out attempt per pieceRelax.
const pieceRelax = time.Minute

// pieceTimedOut caps the committer's attempts at half the rows of the one
// that timed out after running d: the next ones take c.piece rows at
// most. A statement_timeout shorter than a batch takes, retried at full
// size, fails for ever; halved down to the size that fits, the batch
// commits in pieces, and so do the next batches, timing out again only
// when pieceCommitted tries twice the cap once a pieceRelax.
func (c *committer) pieceTimedOut(rows int, d time.Duration) {
	if half := max(rows/2, 1); c.piece == 0 || half < c.piece {
		c.piece = half
	}
	c.limit, c.pieceAt = d, time.Now()
}

// laterOf returns the later of a and b.
func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// pieceCommitted doubles c.piece after a piece of rows rows committed, if
// twice the cap would take less than half the time the timed-out attempt
// ran, at the rate this piece committed (so that the cap grows back within
// about log2(max_rows) commits once a lock that made attempts time out
// is gone), or if it has not doubled for pieceRelax. A cap of max_rows is
// no cap.
func (c *committer) pieceCommitted(rows int) {
	if c.piece == 0 || rows == 0 {
		return
	}
	fast := c.took*time.Duration(2*c.piece)/time.Duration(rows) < c.limit/2
	if !fast && time.Since(c.pieceAt) < pieceRelax {
		return
	}
	if c.piece, c.pieceAt = 2*c.piece, time.Now(); c.piece >= c.s.cfg.Batch.MaxRows {
		c.piece = 0
	}
}

// timedOut reports whether err is a server timeout that a smaller piece
// of the batch may beat: query_canceled (statement_timeout; also a cancel
// request, pg_cancel_backend) or transaction_timeout (PostgreSQL 17).
// Retried at full size, a batch that takes longer than the limit would
// fail for ever; halved (pieceTimedOut), its pieces commit. A lock
// wait (lock_timeout, 55P03) does not depend on the rows: not one.
func timedOut(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "57014" || pgErr.Code == "25P04"
}

// A row that a statement timeout ends every time it is tried alone would be
// retried for ever (a timeout is transient, and one row cannot be halved):
// its committer stuck for good, its event neither stored nor dead-lettered,
// every drain running to drain_timeout, and the row back after each
// restart. A lock held elsewhere ends the same way for a while, though, so
// commitRetry gives such a row up as poison (loneTimeoutError) only once it
// has timed out alone loneTimeoutsPoison times in a row, over
// loneTimeoutSpan at least, with a commit between each two of an attempt
// (another row's) that started after the timeout before: a table that is
// locked, or a server that is slow for every row, commits none (one commit
// before a long lock counts for the timeouts up to it only), and a lock on
// the row's parent held for less than the span is waited out. A held row
// (process) is given up too when the held rest is that row alone, and so is
// a row that probe tries alone in the place of a refused one (once, where
// it is). The rule never fires without another committer that commits: with
// connections: 1, or while every committer is stuck on a slow row of its
// own, such rows are retried for ever, as before, and a drain runs to
// drain_timeout.
const (
	loneTimeoutsPoison = 3
	loneTimeoutSpan    = 5 * time.Minute
)

// loneTimeoutError is commitRetry's answer for a row that it gives up on
// after its lone timeouts (see loneTimeoutsPoison): process dead-letters it,
// with the timeout's SQLSTATE (57014).
type loneTimeoutError struct {
	err  error // the last timeout
	n    int
	span time.Duration
	// mayBeStored: a redelivery, exactly-once, or a commit of its batch
	// whose outcome was unknown: the row may be in the table already.
	mayBeStored bool
}

func (e *loneTimeoutError) Error() string {
	return fmt.Sprintf("the row alone timed out on the server %d times in a row over %v while other rows committed: %v",
		e.n, e.span.Round(time.Second), e.err)
}

func (e *loneTimeoutError) Unwrap() error { return e.err }

// isLoneTimeout reports whether err is (or wraps) a loneTimeoutError.
func isLoneTimeout(err error) bool {
	_, ok := errors.AsType[*loneTimeoutError](err)
	return ok
}

// reason is the dead letter's reason: the timeout's message and SQLSTATE
// (it quotes no value of the row), and why the row was given up.
func (e *loneTimeoutError) reason(pgErr *pgconn.PgError) string {
	r := fmt.Sprintf("%s (SQLSTATE %s): this row alone timed out %d times in a row over %v while other rows committed",
		pgErr.Message, pgErr.Code, e.n, e.span.Round(time.Second))
	if e.mayBeStored {
		r += mayBeStoredNote
	}
	return r
}

// mayBeStoredNote ends the reason of a dead letter whose row may be in the
// table already (committer.mayBeStored): a replay of it would store it
// twice.
const mayBeStoredNote = "; it may already be stored: check its key before replaying"

// queryCanceled reports whether err is the server's query_canceled
// (57014): a statement_timeout, which a row slower than it meets every
// time, or a cancel request, which the code does not tell apart. Not
// transaction_timeout (25P04), which ends the session.
func queryCanceled(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == "57014"
}

// outcomeUnknown reports whether a failed COMMIT may have committed: the
// server did not answer (any error that is not a server error response),
// or it ended the session (FATAL, PANIC), which can come after the commit:
// pg_terminate_backend while a committed transaction waits for a
// synchronous standby ("The transaction has already committed locally").
func outcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) || endsSession(pgErr)
}

// endsSession reports whether e ends the server's session: FATAL or
// PANIC, by the severity the server does not translate (PostgreSQL 9.6
// and later send it), by the one it does when there is none. The
// translated one alone would miss a server with lc_messages other than
// English ("SCHWERWIEGEND" in German).
func endsSession(e *pgconn.PgError) bool {
	switch cmp.Or(e.SeverityUnlocalized, e.Severity) {
	case "FATAL", "PANIC":
		return true
	}
	return false
}

// backoff is capped exponential backoff with jitter: each wait is drawn
// from [d/2, d], so none is shorter than half the current step.
type backoff struct {
	initial, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.initial
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits d or until ctx ends, returning ctx.Err() then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

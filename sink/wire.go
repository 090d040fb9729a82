package sink

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/jetsink/jetsink/pipeline"
)

// One COPY ... FROM STDIN on the wire, without waiting between messages:
// the statement (Query), the binary COPY stream in CopyData messages, and
// CopyDone go out in writes of up to copyChunk bytes, while a goroutine
// reads the answers up to ReadyForQuery (the server may write during the
// COPY: see sendCopy). A small batch is one write; pgx's CopyFrom makes
// three (the statement, the data from a goroutine that reads the rows,
// CopyDone) and starts a background reader per call.
//
// Nothing waits for CopyInResponse: a COPY sent as a simple Query that
// fails (before or during copy-in) answers ErrorResponse and ReadyForQuery
// at once, and the server then drops every CopyData, CopyDone and CopyFail
// that still arrives ("the rest of that message is discarded and
// ReadyForQuery is issued. [...] any subsequent CopyData, CopyDone, or
// CopyFail messages issued by the frontend will simply be dropped",
// protocol-flow.html, COPY Operations). So once the reader has seen the
// ErrorResponse, the writer stops before its next write: every write ends
// on a message boundary, and the connection is ready for the next
// statement without a CopyDone or CopyFail.

// copyChunk is how many bytes are gathered for one write. The buffer is per
// committer and grows past copyChunk only for a single larger row.
const copyChunk = 256 << 10

// CancelWait bounds how long a COPY given up on (ctx ended after CopyDone)
// waits for its answer: the cancel request, sent again while its
// connection fails, and the server's answer to the COPY, together. Then
// the connection is given up and the outcome is unknown. A hard stop
// can wait this long for a committer (the processor's log says so).
const CancelWait = 5 * time.Second

// The binary COPY stream around the tuples: signature, flags (0) and header
// extension length (0); the trailer is a field count of -1.
var (
	copyHeader  = []byte("PGCOPY\n\xff\r\n\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00")
	copyTrailer = []byte{0xff, 0xff}
)

// cancelRetry is the first pause before a cancel request that could not
// be sent (its connection failed) is sent again; it doubles up to
// cancelRetryMax. cancelAttempt bounds one attempt, so that a dial that
// hangs is tried again within CancelWait.
const (
	cancelRetry    = 50 * time.Millisecond
	cancelRetryMax = time.Second
	cancelAttempt  = time.Second
)

// copyWire builds the messages of one COPY into buf.
type copyWire struct {
	buf  []byte
	open int // offset of the open CopyData message, -1 if none

	// Kept here, in the committer's reused state, rather than allocated
	// per COPY: refused is set by the COPY's reader when an ErrorResponse
	// arrives (the statement has failed, and the writer sends nothing
	// more); cancelErr by the reader's cancel request goroutine before it
	// ends (see readCopyResult).
	refused   atomic.Bool
	cancelErr error
}

// errRefused ends writeCopy early: the server has refused the COPY.
var errRefused = errors.New("the server refused the COPY")

// begin starts a COPY of sql: the Query message, and a CopyData message
// holding the stream header.
func (w *copyWire) begin(sql string) {
	w.buf = append(w.buf[:0], 'Q')
	w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(4+len(sql)+1))
	w.buf = append(w.buf, sql...)
	w.buf = append(w.buf, 0)
	w.openData()
	w.buf = append(w.buf, copyHeader...)
}

func (w *copyWire) openData() {
	w.open = len(w.buf)
	w.buf = append(w.buf, 'd', 0, 0, 0, 0)
}

// closeData fills in the length of the open CopyData message.
func (w *copyWire) closeData() {
	if w.open >= 0 {
		binary.BigEndian.PutUint32(w.buf[w.open+1:], uint32(len(w.buf)-w.open-1))
		w.open = -1
	}
}

// full reports whether adding n more bytes should wait for a write first.
func (w *copyWire) full(n int) bool { return len(w.buf) > 0 && len(w.buf)+n > copyChunk }

// flush writes what is gathered and opens a new CopyData message.
func (w *copyWire) flush(write func([]byte) error) error {
	w.closeData()
	err := write(w.buf)
	w.buf = w.buf[:0]
	w.openData()
	return err
}

// end closes the stream: trailer, CopyDone.
func (w *copyWire) end() []byte {
	w.buf = append(w.buf, copyTrailer...)
	w.closeData()
	w.buf = append(w.buf, 'c', 0, 0, 0, 4)
	return w.buf
}

// shrink drops a buffer that a large row grew well past copyChunk.
func (w *copyWire) shrink() {
	if cap(w.buf) > 4*copyChunk {
		w.buf = nil
	}
}

// copyQuery is one Query holding a COPY, and where the COPY is in it.
type copyQuery struct {
	sql    string
	stmts  int    // statements in sql
	copyAt int    // the COPY's place among them, from 1
	guards uint64 // bit n set: statement n is a type guard (see typesChangedError)
	// insertAt is the place of exactly-once's INSERT from staging (0:
	// none), whose row count copyResult.inserted holds.
	insertAt int
}

// guardedCopy is the Query of copySQL (see Sink.buildSQL) of stmts
// statements: the COPY alone (1), a type guard and the COPY (2), or the
// guard, the COPY and the guard again (3). Without a BEGIN, the server
// runs them as one transaction.
func guardedCopy(sql string, stmts int) copyQuery {
	q := copyQuery{sql: sql, stmts: stmts, copyAt: min(stmts, 2)}
	if stmts > 1 {
		q.guards = 1 << 1
	}
	if stmts > 2 {
		q.guards |= 1 << 3
	}
	return q
}

// sendCopy runs one Query q holding a COPY of rows on pg, which commits
// (without a BEGIN, as one transaction; with one, by its last statement,
// COMMIT); a type guard in it that fails returns a *typesChangedError.
// sent reports that every byte, CopyDone included, was written: an error
// after that (other than the server's own) leaves open whether the Query
// committed. res.stored is the row count of the COPY's CommandComplete tag
// ("COPY n"), -1 if there was none or it could not be read; the Query has
// committed when res.err is nil, whatever stored says.
//
// The answers are read while the rows go out (by a goroutine that ends
// before sendCopy returns): the server may write while it reads the COPY,
// a NOTICE per row from a trigger for instance, and once both sides' socket
// buffers were full, a writer that only reads afterwards and a server that
// cannot write would wait for each other forever. Once an ErrorResponse
// has arrived, no more is written (see the top of this file): a COPY
// refused at its first row costs the bytes in flight, not the batch.
//
// Cancelling ctx while writing ends the write (the statement cannot commit
// without CopyDone) and sends the server a cancel request, waiting (up to
// CancelWait) until it has gone out but not for an answer: a backend
// waiting on a locked table would not see its client go before it got the
// lock, and one reading the COPY's data would never answer it. Cancelling
// ctx while waiting for the answer (a locked table) sends the server a
// cancel request and reads on, for up to CancelWait: the answer then says
// whether the COPY committed before the cancel reached it, so a shutdown
// does not leave the outcome unknown.
func sendCopy(ctx context.Context, pg *pgconn.PgConn, w *copyWire, q copyQuery, rows []pipeline.Row) (sent bool, res copyResult) {
	defer w.shrink()
	nc := pg.Conn()
	w.refused.Store(false)
	answer := make(chan copyResult, 1)
	cancelSent := make(chan struct{})
	go func() { answer <- readCopyResult(ctx, pg, w, q, cancelSent) }()
	if err := writeCopy(ctx, nc, w, q.sql, rows); err != nil {
		if errors.Is(err, errRefused) {
			// The server has failed the statement and reads on to
			// ReadyForQuery by itself; the connection stays usable.
			res = <-answer
			res.stored = -1
			return false, res
		}
		// No CopyDone went out: the statement cannot commit, and the
		// connection is given up. Stop the reader, within a second: an
		// error the server sent before it closed the connection may
		// still be on its way.
		deadline := time.Now().Add(time.Second)
		if ctx.Err() != nil {
			// The reader sends the server a cancel request: let it go
			// out first (within CancelWait), for a backend waiting on a
			// locked table, which would not see its client go before it
			// got the lock, and would hold its connection slot and its
			// place in the lock's queue until then. Not its answer: a
			// backend reading the COPY's data takes a cancel only with
			// the next message, which will not come.
			<-cancelSent
			deadline = time.Unix(1, 0)
		}
		_ = nc.SetReadDeadline(deadline)
		res = <-answer
		res.stored = -1
		if _, ok := errors.AsType[*pgconn.PgError](res.err); ok && ctx.Err() == nil {
			// The server said why (a FATAL error: the backend
			// terminated, transaction_timeout): the write failed because
			// of it, and it, not the broken pipe, classifies the failure
			// (a timeout halves the batch). The connection is broken all
			// the same.
			res.err = &brokenConnError{res.err}
			return false, res
		}
		res.err = writeErr(ctx, err)
		return false, res
	}
	// Once CopyDone is out, the server may commit even if ctx has ended
	// meanwhile: wait for the answer (the reader cancels on the server if
	// ctx has ended).
	res = <-answer
	if res.untouched {
		res.stored = -1
		return false, res // the server's own error, and nothing ran: not committed
	}
	if res.complete && res.err != nil {
		// The last statement is done (committed), and then the
		// connection failed or the backend ended (FATAL) before
		// ReadyForQuery. Report the COPY, and close the connection so
		// that the next statement does not go to a dead one.
		_ = pg.Close(context.Background())
		res.err = nil
	}
	if _, ok := errors.AsType[*txStatusError](res.err); ok {
		// Closed, the server rolls the open transaction back; the
		// outcome is unknown all the same (committer.copy).
		_ = pg.Close(context.Background())
	}
	return true, res
}

// txStatusError reports a Query holding a COPY that the server answered
// without an error, but after which its session is not idle (status, of
// ReadyForQuery: 'T' in a transaction, 'E' in a failed one): each Query of
// the sink ends its transaction, implicit (at-least-once) or with COMMIT
// (exactly-once), so the server did not run it as sent (a pooler's
// surprise). The connection is closed, which rolls back whatever it holds,
// and the outcome counts as unknown: nothing is acked, and the batch is
// sent again.
type txStatusError struct{ status byte }

func (e *txStatusError) Error() string {
	return fmt.Sprintf("the server answered the batch's Query with the session in transaction status %q, not idle: "+
		"its commit is not certain; connection closed, not acked, sent again", e.status)
}

// copyResult is the answer to one Query holding a COPY. complete reports
// that the CommandComplete of its last statement arrived (with no error
// before it, nor a ReadyForQuery after it that finds the session in a
// transaction: txStatusError): a COPY in autocommit, or in the implicit transaction of a
// Query of several statements, has committed by then, since the server
// commits before it reports the last statement (a COMMIT too). stored is
// the row count in the COPY's CommandComplete, -1 without one; inserted
// the row count of the INSERT at copyQuery.insertAt ("INSERT 0 n"), -1
// without one.
type copyResult struct {
	complete bool
	stored   int64
	inserted int64
	err      error
	// failedAt is the statement (from 1) under way when the server's
	// error came, 0 if none came.
	failedAt int
	// untouched: err came before any answer to the Query: the server
	// had ended the session before it ran any of it (a backend
	// terminated while idle sends its FATAL at once, and it is read
	// with the next query's answers), or ended it during the first
	// statement, before it answered (at-least-once's first guard).
	// Nothing was stored.
	untouched bool
	// ready: ReadyForQuery came, after the error too: the session went
	// on. Without it after an ERROR, the server (or a pooler: "server
	// conn crashed?") closed the connection instead.
	ready bool
}

// copyCount reads the row count of a COPY's CommandComplete tag, "COPY n";
// -1 if the tag is not that.
func copyCount(tag []byte) int64 {
	const prefix = "COPY "
	if len(tag) <= len(prefix) || string(tag[:len(prefix)]) != prefix {
		return -1
	}
	var n int64
	for _, c := range tag[len(prefix):] {
		d := int64(c - '0')
		if c < '0' || c > '9' || n > (math.MaxInt64-d)/10 {
			return -1
		}
		n = n*10 + d
	}
	return n
}

// writeCopy writes the statement, the rows and CopyDone.
func writeCopy(ctx context.Context, nc net.Conn, w *copyWire, sql string, rows []pipeline.Row) error {
	stopWrites := context.AfterFunc(ctx, func() { _ = nc.SetWriteDeadline(time.Unix(1, 0)) })
	// A write deadline set by stopWrites' func after this returned does
	// not matter: ctx has ended, and the connection is closed then.
	defer stopWrites()
	write := func(b []byte) error {
		if w.refused.Load() {
			return errRefused
		}
		_, err := nc.Write(b)
		return err
	}
	w.begin(sql)
	for i := range rows {
		t := rows[i].Tuple
		if w.full(len(t)) {
			if err := w.flush(write); err != nil {
				return err
			}
		}
		w.buf = append(w.buf, t...)
	}
	return write(w.end())
}

// writeErr reports a failed write as the context's error when that caused
// it.
func writeErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// brokenConnError is the server's error for a COPY whose connection broke
// while the COPY was written: it classifies the failure, and the
// connection is closed (committer.copy) whatever it says.
type brokenConnError struct{ err error }

func (e *brokenConnError) Error() string { return e.err.Error() }
func (e *brokenConnError) Unwrap() error { return e.err }

// readCopyResult reads the server's answers to one Query q up to
// ReadyForQuery (or an error) and returns its outcome; it sets w.refused
// when an ErrorResponse arrives. When ctx ends first, it sends a cancel
// request and waits up to CancelWait for the answer; the cancel request's
// goroutine has ended when it returns. It closes cancelSent once the
// cancel request has gone out or failed, or when it returns without one.
func readCopyResult(ctx context.Context, pg *pgconn.PgConn, w *copyWire, q copyQuery, cancelSent chan<- struct{}) (res copyResult) {
	res.stored, res.inserted = -1, -1
	// unreplicated is the text of the warning that says a commit's wait
	// for a synchronous standby was cancelled (see syncRepCancelled),
	// copied when it comes: pgproto3 decodes every notice into the same
	// struct, so a later notice would overwrite it.
	var unreplicated *string
	defer func() {
		// On every return: also when the connection fails between the
		// last CommandComplete and ReadyForQuery (res.complete, with an
		// error), the warning before it says the commit may not be on
		// the standby.
		if res.complete && unreplicated != nil {
			res.complete, res.err = false, &unreplicatedError{warning: *unreplicated}
		}
	}()
	nc := pg.Conn()
	answered, endCancel := context.WithCancel(context.Background())
	cancelDone := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(cancelDone)
		cctx, cancel := context.WithTimeout(answered, CancelWait)
		defer cancel()
		w.cancelErr = cancelCopy(cctx, pg)
		close(cancelSent)
		// Give the server time to answer (after a failed cancel request
		// too: the COPY may end by itself), then stop waiting.
		<-cctx.Done()
		if answered.Err() == nil {
			_ = nc.SetReadDeadline(time.Unix(1, 0))
		}
	})
	defer func() {
		// The answer is in: a cancel request still on its way is moot
		// (and ctx has ended, so the connection is closed after this).
		endCancel()
		if stop() {
			close(cancelSent) // none was or will be sent
		} else {
			<-cancelDone
			var pgErr *pgconn.PgError
			if res.err != nil && w.cancelErr != nil && !res.complete && !errors.As(res.err, &pgErr) {
				// No answer: say why the cancel did not get one.
				res.err = errors.Join(res.err, w.cancelErr)
			}
			w.cancelErr = nil
		}
	}()
	var pgErr error
	done := 0      // statements complete
	rowed := false // the statement under way has sent a row
	answers := 0   // messages read
	for {
		msg, err := pg.ReceiveMessage(context.Background())
		if err != nil {
			switch {
			case pgErr != nil: // e.g. ERROR, then the server closed
				res.err = pgErr
			case ctx.Err() != nil:
				res.err = errors.Join(ctx.Err(), err)
			default: // a FATAL error comes here too (the sink's OnPgError closes on it: see New)
				res.err = err
				_, fatal := errors.AsType[*pgconn.PgError](err)
				res.untouched = fatal && answers == 0
				if fatal {
					res.failedAt = done + 1
				}
			}
			return res
		}
		answers++
		switch msg := msg.(type) {
		case *pgproto3.CommandComplete:
			done++
			rowed = false
			if done == q.stmts {
				res.complete = pgErr == nil
			}
			if done == q.insertAt {
				res.inserted = pgconn.NewCommandTag(string(msg.CommandTag)).RowsAffected()
			}
			if done == q.copyAt {
				res.stored = copyCount(msg.CommandTag)
			}
		case *pgproto3.DataRow:
			rowed = true
		case *pgproto3.NoticeResponse:
			// Only while the last statement runs, which commits (at
			// its end, before its CommandComplete).
			committing := pgErr == nil && done == q.stmts-1
			if unreplicated == nil && syncRepCancelled(cmp.Or(msg.SeverityUnlocalized, msg.Severity), msg.Where, msg.Message, committing, ctx.Err() != nil) {
				warning := msg.Message // a string: the struct is reused, the text is not
				unreplicated = &warning
			}
		case *pgproto3.ErrorResponse:
			if pgErr == nil {
				e := pgconn.ErrorResponseToPgError(msg)
				pgErr = e
				res.failedAt = done + 1
				// A guard fails by dividing by zero before its row; an
				// error after the last statement's row is the
				// transaction's, at commit (a deferred constraint).
				if q.guards&(1<<res.failedAt) != 0 && !rowed && e.Code == "22012" {
					pgErr = &typesChangedError{afterCopy: done >= q.copyAt, err: e}
				}
				w.refused.Store(true)
			}
		case *pgproto3.ReadyForQuery:
			res.err, res.ready = pgErr, true
			if pgErr == nil && msg.TxStatus != 'I' {
				// Every statement went through, and the transaction
				// is still open ('T') or failed ('E'): the Query
				// did not end with the commit it was built to end
				// with. A later statement would commit, or roll
				// back, the batch with it.
				res.complete, res.err = false, &txStatusError{status: msg.TxStatus}
			}
			return res
		}
	}
}

// syncRepCancelled reports whether a notice (its severity, not
// translated, its context and message) may say that a commit waiting
// for a synchronous standby was cancelled out of its wait: committed on
// this server, and perhaps not on the standby (PostgreSQL's syncrep.c: a
// WARNING, "canceling wait for synchronous replication due to user
// request", then the statement completes as if nothing happened). Lost if
// the server fails over to that standby: such a commit must not be
// acked. That warning comes while the commit runs (committing: the
// Query's last statement, before its CommandComplete) and from the
// server itself, with no context (where ""); a trigger's RAISE WARNING
// has one ("PL/pgSQL function ..."), and one raised while the rows are
// copied or inserted comes before the last statement, so neither counts,
// even when it is read after the hard context ended (it may have waited
// in the socket's buffer). Its SQLSTATE, 01000, is any WARNING's, and
// says nothing. A WARNING that fits, after the sink's own cancel request
// (cancelled), counts whatever it says (the server's messages may be
// translated); otherwise (pg_cancel_backend by someone else) only the
// English text is known. Either way the worst a wrong guess costs is a
// redelivery.
func syncRepCancelled(severity, where, message string, committing, cancelled bool) bool {
	return severity == "WARNING" && where == "" && committing &&
		(cancelled || strings.Contains(message, "synchronous replication"))
}

// unreplicatedError reports a commit that a cancel took out of its wait
// for a synchronous standby (syncRepCancelled): its outcome on the
// standby is unknown, so its rows are not acked, and come again.
type unreplicatedError struct{ warning string }

func (e *unreplicatedError) Error() string {
	return "committed on the server but cancelled while waiting for a synchronous standby (WARNING: " + e.warning +
		"): not acked; sent again (at-least-once: a possible duplicate), acked once a commit of them waits out the standby"
}

// typesChangedError reports that a type guard (see Sink.buildSQL) found a
// mapped column of another type than the mapping's: nothing of the batch
// is stored. afterCopy says it was the guard after the COPY, which rolled
// the COPY back (the column changed type between the two guards); err is
// the guard's division by zero.
type typesChangedError struct {
	afterCopy bool
	err       *pgconn.PgError
}

func (e *typesChangedError) Error() string {
	when := ""
	if e.afterCopy {
		when = " (it changed while the batch was sent: the COPY was rolled back)"
	}
	return "the table's columns no longer all have the types the mapping writes (binary COPY would store other values), " +
		"or an exactly-once key column or its unique index compares with a nondeterministic collation" + when +
		": nothing of the batch is stored, and it is retried until they fit (`jetsink check` names the columns)"
}

func (e *typesChangedError) Unwrap() error { return e.err }

// cancelCopy asks the server to cancel pg's statement, sending the cancel
// request again after a pause (cancelRetry, doubling up to cancelRetryMax)
// while its connection fails, until one goes out or ctx ends. A cancel
// request that is not sent leaves the COPY running, and one blocked on a
// lock commits once the lock is gone: its rows are then stored although
// the sink has given up on them (a duplicate once they are redelivered).
// The error is the last attempt's, nil once one was sent.
func cancelCopy(ctx context.Context, pg *pgconn.PgConn) error {
	pause := cancelRetry
	for {
		actx, cancel := context.WithTimeout(ctx, cancelAttempt)
		err := pg.CancelRequest(actx)
		cancel()
		if err == nil {
			return nil
		}
		err = fmt.Errorf("cancel request: %w", err)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		pause = min(2*pause, cancelRetryMax)
	}
}

package sink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

// The server may write while it reads a COPY (a trigger's NOTICE per row).
// If the sink wrote the whole COPY before reading anything, both sides
// would block in write once the socket buffers are full, and the batch
// would never commit: the answers must be read while the rows go out.
func TestCopyWhileServerSendsNotices(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) {
		c.Connections, c.Batch.MaxRows, c.Batch.MaxBytes = 1, 5000, 64<<20
	})
	admin := pg.Conn(t)
	tbl := s.table.Sanitize()
	fn := pgx.Identifier{s.cfg.Table + "_notice"}.Sanitize()
	for _, q := range []string{
		"CREATE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE '%', repeat('n', 65536); RETURN NEW; END $$",
		"CREATE TRIGGER noisy BEFORE INSERT ON " + tbl + " FOR EACH ROW EXECUTE FUNCTION " + fn + "()",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	pad := strings.Repeat("p", 16<<10)
	rs, ms := rows(1, 1500, func(seq int) string { return fmt.Sprintf(`{"n":%d,"pad":%q}`, seq, pad) })
	src := newSource()
	wait := runSink(t, ctx, s, src)
	src.push(t, ctx, rs)
	src.close()
	waitFor(t, ctx, "the rows to be acked", allAcked(ms))
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := count(t, ctx, admin, s.cfg.Table); n != len(rs) {
		t.Fatalf("%d rows, want %d", n, len(rs))
	}
}

// fakePG is a PostgreSQL server of the test's own on a loopback port: it
// accepts one connection (AuthenticationOk at once), hands each cancel
// request to the test, and runs the test's script on the connection.
type fakePG struct {
	cancels chan struct{} // one value per cancel request received
	closed  atomic.Int32  // cancel connections the client has closed
	// failDials is how many of the next cancel connections fail to dial
	// (-1: all); dials counts the cancel dials tried.
	failDials, dials atomic.Int32
}

// connectFake starts a fakePG running script and connects to it.
func connectFake(t *testing.T, ctx context.Context, script func(be *pgproto3.Backend, f *fakePG)) (*pgconn.PgConn, *fakePG) {
	t.Helper()
	return connectFakeWith(t, ctx, nil, script)
}

// connectFakeWith is connectFake with the connection's config changed by
// tune first, when it is not nil.
func connectFakeWith(t *testing.T, ctx context.Context, tune func(*pgconn.Config), script func(be *pgproto3.Backend, f *fakePG)) (*pgconn.PgConn, *fakePG) {
	t.Helper()
	ln := listen(t)
	f := &fakePG{cancels: make(chan struct{}, 4)}
	ln.wg.Go(func() {
		first := true
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ln.track(c)
			main := first
			first = false
			ln.wg.Go(func() {
				be := pgproto3.NewBackend(c, c)
				msg, err := be.ReceiveStartupMessage()
				if err != nil {
					return
				}
				if _, ok := msg.(*pgproto3.CancelRequest); ok {
					f.cancels <- struct{}{}
					// Like a server that is slow to close: the client
					// closes the cancel connection itself.
					return
				}
				if !main {
					return
				}
				be.Send(&pgproto3.AuthenticationOk{})
				be.Send(&pgproto3.BackendKeyData{ProcessID: 42, SecretKey: []byte{1, 2, 3, 4}})
				be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				if be.Flush() != nil {
					return
				}
				script(be, f)
				c.Close()
			})
		}
	})
	cfg, err := pgconn.ParseConfig("postgres://u@" + ln.Addr().String() + "/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	dial := cfg.DialFunc
	first := true // the first dial is the connection; later ones cancel
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !first {
			f.dials.Add(1)
			if n := f.failDials.Load(); n != 0 {
				f.failDials.CompareAndSwap(n, max(n-1, -1))
				return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused (test)")}
			}
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if first {
			first = false
			return c, nil
		}
		return &closeCounter{Conn: c, n: &f.closed}, nil
	}
	if tune != nil {
		tune(cfg)
	}
	pg, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	return pg, f
}

type closeCounter struct {
	net.Conn
	n    *atomic.Int32
	once sync.Once
}

func (c *closeCounter) Close() error {
	c.once.Do(func() { c.n.Add(1) })
	return c.Conn.Close()
}

// receiveCopy reads one COPY from the client, up to CopyDone.
func receiveCopy(be *pgproto3.Backend) bool {
	for {
		msg, err := be.Receive()
		if err != nil {
			return false
		}
		if _, ok := msg.(*pgproto3.CopyDone); ok {
			return true
		}
	}
}

// A COPY in autocommit has committed once its CommandComplete arrived: an
// error after it (the backend ended, or the connection broke, before
// ReadyForQuery) must not make the sink send the batch again as if it had
// failed, and the connection is closed for the next attempt.
func TestCopyCompleteThenFatal(t *testing.T) {
	for _, fatal := range []bool{true, false} {
		t.Run(fmt.Sprintf("fatal=%v", fatal), func(t *testing.T) {
			ctx := testCtx(t, 10*time.Second)
			pg, _ := connectFake(t, ctx, func(be *pgproto3.Backend, _ *fakePG) {
				if !receiveCopy(be) {
					return
				}
				be.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY 3")})
				if fatal {
					be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01",
						Message: "terminating connection due to administrator command"})
				}
				_ = be.Flush()
			}) // then the fake closes the connection
			rs, _ := rows(1, 3, nil)
			var w copyWire
			sent, res := sendCopy(ctx, pg, &w, guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1), rs)
			stored, err := res.stored, res.err
			if !sent || stored != 3 || err != nil {
				t.Fatalf("sendCopy = %v, %d, %v; want true, 3, nil (the COPY committed)", sent, stored, err)
			}
			if !pg.IsClosed() {
				t.Fatal("the connection is still open")
			}
		})
	}
}

// The warning that says a commit's wait for a synchronous standby was
// cancelled is the one the error quotes, also when other notices follow it
// before the COPY completes (a trigger's RAISE NOTICE, a second WARNING):
// pgproto3 decodes every notice into one struct, which the next overwrites.
func TestSyncRepWarningKeptPastLaterNotices(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	const warning = "canceling wait for synchronous replication due to user request"
	pg, _ := connectFake(t, ctx, func(be *pgproto3.Backend, _ *fakePG) {
		if !receiveCopy(be) {
			return
		}
		be.Send(&pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "01000", Message: warning})
		be.Send(&pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: "a later notice"})
		be.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY 3")})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		_ = be.Flush()
	})
	rs, _ := rows(1, 3, nil)
	var w copyWire
	_, res := sendCopy(ctx, pg, &w, guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1), rs)
	ue, ok := errors.AsType[*unreplicatedError](res.err)
	if !ok || res.complete {
		t.Fatalf("sendCopy: complete %v, %v; want an *unreplicatedError", res.complete, res.err)
	}
	if ue.warning != warning {
		t.Fatalf("the error quotes %q, want the warning %q", ue.warning, warning)
	}
}

// tooBigForFlight is a batch of 64 MiB, more than loopback TCP holds in
// flight: a writer to a server that reads none of it is still writing
// when the test acts.
func tooBigForFlight() []pipeline.Row {
	pad := strings.Repeat("p", 16<<10)
	rs, _ := rows(1, 4096, func(seq int) string { return fmt.Sprintf(`{"n":%d,"pad":%q}`, seq, pad) })
	return rs
}

// A FATAL error that ends the session while the client is still writing a
// large COPY (transaction_timeout, 25P04; a terminated backend, 57P01)
// breaks the write; sendCopy returns the server's error, which classifies
// the failure, not the broken pipe's.
func TestCopyFatalWhileWriting(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pg, _ := connectFake(t, ctx, func(be *pgproto3.Backend, _ *fakePG) {
		if _, err := be.Receive(); err != nil { // the Query; the rows are never read
			return
		}
		be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "25P04",
			Message: "terminating connection due to transaction timeout"})
		_ = be.Flush()
	}) // then the fake closes the connection
	rs := tooBigForFlight() // the writer is still writing when the error comes
	var w copyWire
	sent, res := sendCopy(ctx, pg, &w, guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1), rs)
	err := res.err
	var pgErr *pgconn.PgError
	if sent || !errors.As(err, &pgErr) || pgErr.Code != "25P04" || !timedOut(err) {
		t.Fatalf("sendCopy = %v, %v; want not sent, the server's 25P04", sent, err)
	}
}

// When the hard context ends while a large COPY is still being written (a
// locked table, whose backend reads nothing), the writes stop and the
// server still gets a cancel request: a backend waiting on a lock does not
// see its client go, and would keep its connection and its place in the
// lock's queue until it got the lock.
func TestCopyCancelWhileWriting(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	hard, cancel := context.WithCancel(ctx)
	defer cancel()
	var cancelled atomic.Bool
	pg, f := connectFake(t, ctx, func(be *pgproto3.Backend, f *fakePG) {
		if _, err := be.Receive(); err != nil { // the Query; the rows are never read
			return
		}
		cancel()
		select {
		case <-f.cancels:
			cancelled.Store(true)
		case <-time.After(CancelWait):
			return
		}
		be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014",
			Message: "canceling statement due to user request"})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		_ = be.Flush()
	})
	// The first cancel dial fails, as a remote server's can be slow to
	// take: the cancel request is on its way well after the writes stop.
	f.failDials.Store(1)
	rs := tooBigForFlight()
	var w copyWire
	sent, res := sendCopy(hard, pg, &w, guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1), rs)
	err := res.err
	// The write stops on the hard context's end, or, when the server's
	// answer to the cancel request comes first, on that.
	var pgErr *pgconn.PgError
	if sent || !errors.Is(err, context.Canceled) && !(errors.As(err, &pgErr) && pgErr.Code == "57014") {
		t.Fatalf("sendCopy = %v, %v; want not sent, the hard context's error or 57014", sent, err)
	}
	if !cancelled.Load() {
		t.Fatal("no cancel request reached the server")
	}
}

// A backend that reads a COPY's data takes a cancel request only with the
// next message, which a write cut by the hard context never sends: once the
// request has gone out, sendCopy gives up at once instead of waiting
// CancelWait for an answer that will not come.
func TestCopyCancelWhileWritingUnanswered(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	hard, cancel := context.WithCancel(ctx)
	defer cancel()
	returned := make(chan struct{})
	pg, f := connectFake(t, ctx, func(be *pgproto3.Backend, f *fakePG) {
		if _, err := be.Receive(); err != nil { // the Query; the rows are never read
			return
		}
		cancel()
		select { // no answer, to the cancel request or at all
		case <-returned:
		case <-ctx.Done():
		}
	})
	rs := tooBigForFlight()
	var w copyWire
	start := time.Now()
	sent, res := sendCopy(hard, pg, &w, guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1), rs)
	err := res.err
	took := time.Since(start)
	close(returned)
	if sent || !errors.Is(err, context.Canceled) {
		t.Fatalf("sendCopy = %v, %v; want not sent, the hard context's error", sent, err)
	}
	select {
	case <-f.cancels:
	default:
		t.Fatal("no cancel request reached the server")
	}
	if took > CancelWait/2 {
		t.Fatalf("sendCopy took %v after the hard context ended, waiting for an answer that cannot come (CancelWait %v)", took, CancelWait)
	}
}

// When the hard context ends while a COPY waits, the COPY is cancelled on
// the server and its outcome is known (57014, not committed), and the
// cancel request's goroutine has ended (its connection closed) by the time
// sendCopy returns: none outlives the call. A cancel request whose
// connection fails is sent again.
func TestCopyCancel(t *testing.T) {
	for _, c := range []struct {
		name      string
		failDials int32
	}{
		{"ends with the call", 0},
		{"retried after failed dials", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t, 10*time.Second)
			hard, cancel := context.WithCancel(ctx)
			defer cancel()
			pg, f := connectFake(t, ctx, func(be *pgproto3.Backend, f *fakePG) {
				if !receiveCopy(be) {
					return
				}
				cancel()
				select {
				case <-f.cancels:
				case <-ctx.Done():
					return
				}
				be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014",
					Message: "canceling statement due to user request"})
				be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				_ = be.Flush()
			})
			f.failDials.Store(c.failDials)
			rs, _ := rows(1, 3, nil)
			var w copyWire
			sent, res := sendCopy(hard, pg, &w, guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1), rs)
			err := res.err
			var pgErr *pgconn.PgError
			if !sent || !errors.As(err, &pgErr) || pgErr.Code != "57014" {
				t.Fatalf("sendCopy = %v, %v; want true, 57014", sent, err)
			}
			if n := f.dials.Load(); n != c.failDials+1 {
				t.Fatalf("%d cancel dials, want %d (%d failed, then one sent)", n, c.failDials+1, c.failDials)
			}
			if n := f.closed.Load(); n != 1 {
				t.Fatalf("%d cancel connections closed when sendCopy returned, want 1", n)
			}
		})
	}
}

// When no cancel request gets through and the server never answers, the
// COPY is given up after CancelWait (shutdown stays bounded), having tried
// the cancel request several times; the outcome is unknown and the error
// says why.
func TestCopyCancelFailsWithinCancelWait(t *testing.T) {
	ctx := testCtx(t, CancelWait+10*time.Second)
	hard, cancel := context.WithCancel(ctx)
	defer cancel()
	pg, f := connectFake(t, ctx, func(be *pgproto3.Backend, f *fakePG) {
		if !receiveCopy(be) {
			return
		}
		cancel()
		for { // never answers; reads until the client closes
			if _, err := be.Receive(); err != nil {
				return
			}
		}
	})
	f.failDials.Store(-1)
	rs, _ := rows(1, 3, nil)
	var w copyWire
	start := time.Now()
	sent, res := sendCopy(hard, pg, &w, guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1), rs)
	err := res.err
	took := time.Since(start)
	if !sent || err == nil || !outcomeUnknown(err) || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "cancel request") {
		t.Fatalf("sendCopy = %v, %v; want true and an unknown outcome naming the cancel request", sent, err)
	}
	if took < CancelWait-time.Second || took > CancelWait+5*time.Second { // bounded, with room for a loaded machine
		t.Fatalf("sendCopy took %v, want about CancelWait (%v)", took, CancelWait)
	}
	if n := f.dials.Load(); n < 3 {
		t.Fatalf("%d cancel dials within CancelWait, want several", n)
	}
	t.Logf("gave up after %v and %d cancel dials", took, f.dials.Load())
}

// countConn counts the bytes written to a connection.
type countConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// The server refuses a large COPY at its first row: the writer stops once
// the ErrorResponse is in instead of sending the whole batch for the server
// to drop, and the connection is left idle (ReadyForQuery) and takes the
// next COPY and query as usual.
func TestCopyStopsWritingAfterError(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pgt := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pgt.URL, nil)
	admin := pgt.Conn(t)
	tbl := s.table.Sanitize()
	if _, err := admin.Exec(ctx, "ALTER TABLE "+tbl+" ADD CONSTRAINT ok CHECK (payload->>'bad' IS NULL)"); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgconn.ParseConfig(pgt.URL)
	if err != nil {
		t.Fatal(err)
	}
	var written atomic.Int64
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countConn{Conn: c, n: &written}, nil
	}
	pg, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	pid := pg.PID()

	pad := strings.Repeat("p", 16<<10)
	// 96 MiB: more than loopback TCP can hold in flight (net.ipv4.tcp_wmem
	// and tcp_rmem allow 4 + 32 MiB here), so that writing half of it means
	// the writer went on after the error; a fast machine wrote 10 MB of a
	// 32 MiB batch before it stopped, more than the quarter allowed then.
	rs, _ := rows(1, 6144, func(seq int) string {
		if seq == 1 {
			return `{"bad":true}`
		}
		return fmt.Sprintf(`{"n":%d,"pad":%q}`, seq, pad)
	})
	total := 0
	for _, r := range rs {
		total += len(r.Tuple)
	}
	var w copyWire
	before := written.Load()
	sent, res := sendCopy(ctx, pg, &w, guardedCopy(*s.copySQL.Load(), s.copyStmts), rs)
	err = res.err
	wrote := written.Load() - before
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Fatalf("sendCopy = %v, %v; want 23514", sent, err)
	}
	t.Logf("wrote %d of the batch's %d bytes before stopping", wrote, total)
	if wrote > int64(total/2) {
		t.Fatalf("wrote %d bytes of a %d-byte batch refused at its first row", wrote, total)
	}
	if sent {
		t.Fatal("sendCopy reports CopyDone sent")
	}
	if pg.IsClosed() || pg.TxStatus() != 'I' {
		t.Fatalf("connection closed %v, transaction status %q; want open and idle", pg.IsClosed(), pg.TxStatus())
	}

	good := rs[1:101]
	sent, res = sendCopy(ctx, pg, &w, guardedCopy(*s.copySQL.Load(), s.copyStmts), good)
	if !sent || res.stored != int64(len(good)) || res.err != nil {
		t.Fatalf("next COPY on the connection: %v, %d, %v; want true, %d, nil", sent, res.stored, res.err, len(good))
	}
	got, err := pg.Exec(ctx, "SELECT count(*) FROM "+tbl).ReadAll()
	if err != nil || len(got) != 1 || len(got[0].Rows) != 1 || string(got[0].Rows[0][0]) != "100" {
		t.Fatalf("query after the COPYs: %v, %v", got, err)
	}
	if pg.PID() != pid || pg.IsClosed() {
		t.Fatal("the connection was replaced")
	}
	if n := count(t, ctx, admin, s.cfg.Table); n != len(good) {
		t.Fatalf("%d rows, want %d", n, len(good))
	}
}

// An ERROR 08P01 while the COPY is the statement under way is the server
// reading a row's field only when the session goes on (ReadyForQuery):
// suspect. An older PgBouncer reports the server connection it lost
// ("server conn crashed?", query_timeout) as that same ERROR and then
// closes the socket: a lost connection, transient, never bisected.
func TestCopyProtocolErrorThenClosed(t *testing.T) {
	for _, ready := range []bool{true, false} {
		t.Run(fmt.Sprintf("ready=%v", ready), func(t *testing.T) {
			ctx := testCtx(t, 10*time.Second)
			pg, _ := connectFake(t, ctx, func(be *pgproto3.Backend, _ *fakePG) {
				if !receiveCopy(be) {
					return
				}
				be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01",
					Message: "server conn crashed?"})
				if ready {
					be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				}
				_ = be.Flush()
				if ready {
					_, _ = be.Receive() // until the client closes
				}
			}) // then the fake closes the connection
			rs, _ := rows(1, 3, nil)
			var w copyWire
			q := guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1)
			_, res := sendCopy(ctx, pg, &w, q, rs)
			if res.err == nil || res.failedAt != q.copyAt || res.ready != ready {
				t.Fatalf("sendCopy: err %v at %d, ready %v; want an error at %d, ready %v", res.err, res.failedAt, res.ready, q.copyAt, ready)
			}
			want := classTransient
			if ready {
				want = classSuspect
			}
			if got := classify((&committer{}).statementError(q, res, len(rs))); got != want {
				t.Fatalf("ERROR 08P01 of the COPY, ready %v: classed %v, want %v", ready, got, want)
			}
		})
	}
}

// A session the server ended while idle (pg_terminate_backend, 57P01)
// leaves its FATAL error in the socket, read with the next Query's
// answers: the attempt is untouched (committer.attempt tries again at once
// on a new connection, with no warning or retry counted) and the
// connection closed, also when the server's messages are not in English.
// pgx's own OnPgError told a FATAL by the translated severity, and on a
// German server ("SCHWERWIEGEND") read it as an ordinary message: a failed
// attempt, warned of, counted and backed off.
func TestFatalWhileIdleTranslated(t *testing.T) {
	for _, sev := range []string{"FATAL", "SCHWERWIEGEND", "PANIK"} {
		t.Run(sev, func(t *testing.T) {
			ctx := testCtx(t, 10*time.Second)
			cfg := DefaultConfig()
			cfg.URL = "postgres://u@127.0.0.1:1/db" // New connects to nothing without create_table
			cfg.Table = uniqueName(t)
			s, err := New(ctx, cfg, testCols, &recDL{}, testLogger(t))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			unlocalized := map[string]string{"FATAL": "FATAL", "SCHWERWIEGEND": "FATAL", "PANIK": "PANIC"}[sev]
			waiting := make(chan struct{})
			pg, _ := connectFakeWith(t, ctx, func(c *pgconn.Config) { c.OnPgError = s.connCfg.OnPgError }, func(be *pgproto3.Backend, _ *fakePG) {
				be.Send(&pgproto3.ErrorResponse{Severity: sev, SeverityUnlocalized: unlocalized, Code: "57P01",
					Message: "Verbindung wird abgebrochen aufgrund von Anweisung des Administrators"})
				_ = be.Flush()
				close(waiting)
			}) // then the fake closes the connection, as the backend exits
			select {
			case <-waiting:
			case <-ctx.Done():
				t.Fatal("the fake server did not send its error")
			}
			rs, _ := rows(1, 3, nil)
			var w copyWire
			sent, res := sendCopy(ctx, pg, &w, guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1), rs)
			if sent || !res.untouched || !endedIdle(res.err) && unlocalized == "FATAL" {
				t.Fatalf("sendCopy = %v, untouched %v, %v; want not sent, untouched, the server's 57P01", sent, res.untouched, res.err)
			}
			if !pg.IsClosed() {
				t.Fatal("the connection is still open after the server's " + unlocalized)
			}
		})
	}
}

// Every Query of the sink ends its transaction: a COPY answered without an
// error but with the session still in a transaction ('T') or a failed one
// ('E') did not run as sent, and a later statement would commit or roll
// back its rows with it. Not complete (not acked), an unknown outcome (sent
// again; at-least-once counts a possible duplicate), the connection closed.
func TestCopyCompleteInTransaction(t *testing.T) {
	for _, status := range []byte{'T', 'E'} {
		t.Run(string(status), func(t *testing.T) {
			ctx := testCtx(t, 10*time.Second)
			pg, _ := connectFake(t, ctx, func(be *pgproto3.Backend, _ *fakePG) {
				if !receiveCopy(be) {
					return
				}
				be.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY 3")})
				be.Send(&pgproto3.ReadyForQuery{TxStatus: status})
				_ = be.Flush()
				_, _ = be.Receive() // until the client closes
			})
			rs, _ := rows(1, 3, nil)
			var w copyWire
			q := guardedCopy("COPY t (a) FROM STDIN (FORMAT binary)", 1)
			sent, res := sendCopy(ctx, pg, &w, q, rs)
			if _, ok := errors.AsType[*txStatusError](res.err); !ok || res.complete || !sent {
				t.Fatalf("sendCopy = %v, complete %v, %v; want sent, not complete, a *txStatusError", sent, res.complete, res.err)
			}
			if err := (&committer{}).statementError(q, res, len(rs)); !outcomeUnknown(err) {
				t.Fatalf("%v: the outcome counts as known", err)
			}
			if !pg.IsClosed() {
				t.Fatalf("the connection is still open, in transaction status %q", pg.TxStatus())
			}
		})
	}
}

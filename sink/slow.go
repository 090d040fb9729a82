package sink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// slowBatchAfter is how long an attempt may wait on PostgreSQL before the
// sink says so; it says so again each time the wait has doubled. A batch
// that waits for a lock is otherwise silent: no error comes back, and
// watchConn sees a server that is alive. Back-pressure then stops the
// consumer, and the log would show nothing of why.
var slowBatchAfter = 30 * time.Second

// slowLookTimeout bounds one look at pg_stat_activity.
const slowLookTimeout = 5 * time.Second

// watchSlow reports (reportSlow) an attempt of rows on the committer's
// connection that has run for slowBatchAfter, and again at twice that, four
// times, and so on. stop ends the watch and waits for a look under way,
// which it cuts short; it returns how long the attempt had run if the wait
// was logged (0 if not), for the line that says the wait ended.
func (c *committer) watchSlow(rows int) (stop func() (logged time.Duration)) {
	return c.s.watchSlow(c.conn.PgConn().PID(), c.conn.PgConn().Conn().RemoteAddr(), rows)
}

func (s *Sink) watchSlow(pid uint32, server net.Addr, rows int) (stop func() (logged time.Duration)) {
	w := &slowWatch{s: s, pid: pid, server: server, rows: rows, start: time.Now(), next: slowBatchAfter}
	w.wg.Add(1)
	w.mu.Lock()
	w.t = time.AfterFunc(w.next, w.look)
	w.mu.Unlock()
	return w.stop
}

// slowWatch is one watchSlow. A timer rather than a goroutine, and the
// look's context made only when it runs: nearly every attempt ends long
// before the first look.
type slowWatch struct {
	s      *Sink
	pid    uint32
	server net.Addr // the committer connection's peer (nil: not known)
	rows   int
	start  time.Time
	wg     sync.WaitGroup // the pending or running look

	mu      sync.Mutex
	t       *time.Timer
	next    time.Duration // since start, when the next look is due
	stopped bool
	logged  bool               // a look logged the wait
	ctx     context.Context    // the looks'; nil before the first
	cancel  context.CancelFunc // ends a look under way
}

func (w *slowWatch) look() {
	defer w.wg.Done()
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	if w.cancel == nil {
		w.ctx, w.cancel = context.WithCancel(context.Background())
	}
	ctx := w.ctx
	w.mu.Unlock()
	logged := w.s.reportSlow(ctx, w.pid, w.server, w.rows, time.Since(w.start))
	w.mu.Lock()
	defer w.mu.Unlock()
	w.logged = w.logged || logged
	if w.stopped {
		return
	}
	w.next *= 2
	w.wg.Add(1)
	w.t.Reset(w.next - time.Since(w.start))
}

func (w *slowWatch) stop() time.Duration {
	ran := time.Since(w.start)
	w.mu.Lock()
	w.stopped = true
	if w.t.Stop() {
		w.wg.Done() // the look that will not run
	}
	cancel := w.cancel
	w.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.logged {
		return 0
	}
	return ran
}

// reportSlow logs, at Warn, that an attempt of rows has waited on backend
// pid for waited, with what pg_stat_activity says the backend waits for and
// which sessions block it (pg_blocking_pids): their pid, user, application
// and, where the role may see them (its own sessions, or with
// pg_read_all_stats), their state and how long their transaction has been
// open; never their query, whose text may hold data. A look that fails is
// logged with its error instead, and so is one whose connection reached
// another server than server, the backend's peer (nil: not known): a
// failover list's next host after a failover, which has no such backend.
// Nothing is logged once ctx has ended: the attempt is over. It reports
// whether it logged.
func (s *Sink) reportSlow(ctx context.Context, pid uint32, server net.Addr, rows int, waited time.Duration) bool {
	lctx, cancel := context.WithTimeout(ctx, slowLookTimeout)
	defer cancel()
	var (
		waitType, waitEvent, state string
		blockers                   []string
	)
	err := s.adminOrOwn(lctx, func(a *pgx.Conn) error {
		if server != nil {
			if nc := a.PgConn().Conn(); nc != nil && nc.RemoteAddr().String() != server.String() {
				return &otherServerError{batch: server.String(), look: nc.RemoteAddr().String()}
			}
		}
		var pids []int32
		err := a.QueryRow(lctx, `SELECT coalesce(wait_event_type, ''), coalesce(wait_event, ''), coalesce(state, ''),
	ARRAY(SELECT DISTINCT b FROM unnest(pg_blocking_pids(pid)) b ORDER BY b)
FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&waitType, &waitEvent, &state, &pids)
		if err != nil || len(pids) == 0 {
			return err
		}
		rs, err := a.Query(lctx, `SELECT pid, coalesce(usename, ''), coalesce(application_name, ''), coalesce(state, ''),
	coalesce(extract(epoch FROM statement_timestamp() - xact_start)::float8, -1)
FROM pg_stat_activity WHERE pid = ANY($1)`, pids)
		if err != nil {
			return err
		}
		found := map[int32]string{}
		for rs.Next() {
			var (
				p                 int32
				user, app, bstate string
				open              float64
			)
			if err := rs.Scan(&p, &user, &app, &bstate, &open); err != nil {
				rs.Close()
				return err
			}
			found[p] = describeBlocker(p, user, app, bstate, open)
		}
		if err := rs.Err(); err != nil {
			return err
		}
		for _, p := range pids { // in pid order
			switch d, ok := found[p]; {
			case ok:
				blockers = append(blockers, d)
			case p == 0:
				blockers = append(blockers, "a prepared transaction (pg_prepared_xacts; COMMIT PREPARED or ROLLBACK PREPARED ends it)")
			default:
				blockers = append(blockers, fmt.Sprintf("pid %d (gone since)", p))
			}
		}
		return nil
	})
	if ctx.Err() != nil {
		return false // the attempt ended while we looked
	}
	args := []any{"rows", rows, "waited", roundWait(waited), "backend_pid", pid}
	var hints []string
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		args = append(args, "wait", "unknown: no such backend in pg_stat_activity")
		hints = append(hints, "a connection pooler between jetsink and PostgreSQL hides the server's backend")
	case errors.As(err, new(*otherServerError)):
		args = append(args, "wait", "unknown", "look_err", err)
		hints = append(hints, "a new connection reaches another host of postgres.url than the batch's: after a failover, "+
			"the batch's server may be gone, and its connection ends within dead_connection_timeout; or that server "+
			"takes no new connections")
	case err != nil:
		args = append(args, "look_err", err)
	default:
		args = append(args, "state", state, "wait", strings.Trim(waitType+":"+waitEvent, ":"))
	}
	switch waitEvent {
	case "SyncRep":
		hints = append(hints, "the COMMIT waits for a synchronous standby (synchronous_standby_names, synchronous_commit)")
	case "ClientRead":
		hints = append(hints, "PostgreSQL waits for jetsink to send the batch: jetsink is short of CPU, or the network is slow")
	}
	if len(blockers) > 0 {
		args = append(args, "blocked_by", strings.Join(blockers, "; "))
		hints = append(hints, "the blocking sessions hold a lock the batch needs (on the table, a row of the same key, or a partition); "+
			"end their transactions, or pg_terminate_backend(pid); the batch commits as soon as they do")
	}
	if len(hints) > 0 {
		args = append(args, "hint", strings.Join(hints, "; "))
	}
	s.log.Warn("batch waiting on PostgreSQL", args...)
	return true
}

// otherServerError: the look at a waiting batch's backend reached another
// server than the batch's connection.
type otherServerError struct{ batch, look string }

func (e *otherServerError) Error() string {
	return fmt.Sprintf("the batch's connection is to %s, the look's reached %s, where its backend is not", e.batch, e.look)
}

// describeBlocker says who a blocking session is: "pid 5678 (user app,
// idle in transaction, transaction open 42s)".
func describeBlocker(pid int32, user, app, state string, open float64) string {
	var parts []string
	if who := strings.TrimSpace(user + " " + app); who != "" {
		parts = append(parts, who)
	}
	if state != "" {
		parts = append(parts, state)
	}
	if open >= 0 {
		parts = append(parts, "transaction open "+roundWait(time.Duration(open*float64(time.Second))).String())
	}
	if len(parts) == 0 {
		return fmt.Sprintf("pid %d", pid)
	}
	return fmt.Sprintf("pid %d (%s)", pid, strings.Join(parts, ", "))
}

// roundWait rounds a wait for a log line: to 100 ms under 10 s, else to
// the second.
func roundWait(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// adminOrOwn runs f on the admin connection or, when that stays busy for
// pingWait, on a connection of its own, closed after: a report of what
// blocks a batch must not wait behind an admin query blocked by the same
// lock (the table's highest stream_seq, read to re-create a stream). One
// such connection at a time (every committer's batch waits on the same
// lock, and reports at the same moments): the others wait for it, or the
// admin connection, whichever comes first. Not after Close
// (errSinkClosed).
func (s *Sink) adminOrOwn(ctx context.Context, f func(*pgx.Conn) error) error {
	t := time.NewTimer(pingWait)
	defer t.Stop()
	select {
	case s.adminSem <- struct{}{}:
		return s.onAdmin(ctx, f, true)
	case <-ctx.Done():
		return fmt.Errorf("wait for the admin connection: %w", ctx.Err())
	case <-t.C:
	}
	select {
	case s.adminSem <- struct{}{}:
		return s.onAdmin(ctx, f, true)
	case s.ownLook <- struct{}{}:
		defer func() { <-s.ownLook }()
	case <-ctx.Done():
		return fmt.Errorf("wait for a connection: %w", ctx.Err())
	}
	s.pingMu.Lock()
	closed := s.pingClosed
	s.pingMu.Unlock()
	if closed {
		return fmt.Errorf("postgres %s: %w", s.where, errSinkClosed)
	}
	c, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = c.Close(cctx)
		cancel()
	}()
	return f(c)
}

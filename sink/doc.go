// Package sink writes decoded rows to one PostgreSQL table in batches with
// binary COPY and settles their JetStream messages: a message is acked only
// after the transaction holding its row has committed.
//
// # Goroutines
//
// Run starts, and waits for before it returns:
//   - the batcher (Run's own goroutine): the only caller of Source.PopN and
//     TryPopN; it cuts batches and hands them to committers;
//   - Connections committers: each owns one connection and commits one batch
//     at a time (COPY, which commits by itself; then ack), so that one batch
//     is copied while the next one fills; during a COPY it reads the
//     server's answers in a goroutine of its own, which ends with the COPY;
//   - a heartbeat, when InProgressEvery > 0: it sends InProgress for the
//     messages of every batch held (growing, waiting for a committer,
//     blocked on a lock, retrying, waiting for dead letters), half that
//     interval after its oldest row came and then every interval;
//   - a watcher, when ReleaseAfter > 0: it tells when PostgreSQL has
//     been unreachable that long (Away), and then probes it (see
//     Failures).
//
// Each committer owns one *pgx.Conn, opens it when Run starts (all at once,
// so that the first batches do not each wait for a connect) and reconnects
// it after it breaks; a separate admin connection serves Ping, Init, Check,
// StoredSeq and the report of a slow batch. While another call holds that
// one, Ping pings on a short connection of its own (privatePing: one at a
// time, which the Pings meanwhile share), and the slow-batch report looks
// on another (adminOrOwn: one at a time). So the sink keeps Connections+1
// connections open and has up to Connections+3 at once, all with
// application_name AppName. A pool buys nothing here: every
// connection has exactly one user, and the exactly-once staging table is
// per connection state the committer tracks itself. A committer that
// cannot connect (the role's or the server's connection limit) while
// others commit offers its batch to them; while none is free to take it,
// it tries to connect again with the retries' backoff, each failure a
// retry counted (Stats.Retries), logged at Warn at first and every minute,
// and the sink failing (Failing, Ready) until a batch is answered. One
// more goroutine of Run's, the look, compares the mapping with the table
// (Check, on the admin connection) while the committers first connect,
// and again when a type guard refuses a batch, at most once a minute
// (run.look): no committer waits for it.
//
// Batch objects are reused (Connections+1 of them, plus a 256-row carry),
// so the hot path allocates nothing per row. Each starts with room for
// 1024 rows (batchStart) and doubles it as rows come, up to max_rows, so
// that a large max_rows reserves only what its batches come to hold.
// Ping, Stats, DDL, Init and Check are safe concurrently with Run; Close
// must come after Run.
//
// # Batching
//
// A batch is cut at Batch.MaxRows rows OR Batch.MaxBytes bytes of tuples
// (both exact; a single larger row goes alone) OR Batch.MaxDelay. MaxDelay
// is not a wait: when every committer is free and rows are waiting, the
// batcher gathers what is waiting and hands it over at once, so a single
// row at an idle sink is committed immediately. A batch grows while every
// committer is busy or while it lingers (below), and MaxDelay bounds how
// long it keeps growing (counted from when JetStream delivered its oldest
// row); after that it stops taking rows and waits, and rows back up in the
// rings (back-pressure), until the wait becomes a stall (see
// Config.HoldRows).
//
// Batch.MinDelay (linger, 2ms by default) changes "at once": a batch that
// is not full waits for a free committer until its oldest row has been in
// jetsink that long, so a steady trickle makes fewer, larger transactions.
// Batch.OverlapDelay (20ms by default) applies while any other committer
// is busy: a batch that is not full then waits until no other committer
// is busy (and its MinDelay has passed), or until its oldest row has been
// in jetsink for OverlapDelay, whichever comes first. Validate refuses
// either above MaxDelay; a default above a MaxDelay set lower follows it.
// So a second committer commits beside the first only when the batch is
// full or the first falls behind: concurrent small COPYs into one table
// cost PostgreSQL more per row than one larger one (BENCHMARKS.md,
// session 16).
//
// # Delivery
//
// at-least-once (default): one COPY statement per batch, between two type
// guards in the same Query, which PostgreSQL runs as one transaction (the
// guards keep a column of another type from storing other values than
// sent: see Sink.buildSQL), then Ack every message of the batch. A
// crash or a failed Ack between the two redelivers the message and stores
// the row twice; under a unique index on columns the sink writes, the
// second copy fails the key and is dead-lettered (code constraint) after
// a bisection of its batch, and Check warns of such an index
// (ProblemUniqueKey). The statement, the rows and CopyDone go out without
// waiting for the server in between (one write for a small batch), while
// the answers are read as they come; BEGIN and COMMIT would cost two more
// round trips. Once the server has refused the COPY (an ErrorResponse),
// the rest of the batch is not sent: the server would only drop it, and
// the connection is ready for the next statement without it. When the
// hard context ends while the COPY waits (a locked table), the sink sends
// the server a cancel request, again after a short pause while the cancel
// connection fails (for up to CancelWait, 5s, in all), and reads the
// answer, so that a statement it gave up on cannot commit later; a COPY
// whose Query's last CommandComplete arrived has committed, whatever
// follows it. Unless a WARNING came before it that says (or, after the
// sink's cancel, may say) that the commit's wait for a synchronous
// standby was cancelled: committed here, perhaps not on the standby, so
// not acked (an unknown outcome, sent again). Only a WARNING of the
// server's own (without a context, which a trigger's RAISE has) that
// comes while the last statement commits counts. The first guard raises
// client_min_messages to warning for the batch's transaction when it is
// error (for the role, the database or in the URL), at which the server
// would not send that warning; a lower level is kept. Not at the
// session's start: PgBouncer refuses a startup parameter it does not
// track. Exactly-once's Query, which ends with its COMMIT, is judged the
// same way.
//
// A batch is acked as stored only when that CommandComplete counts exactly
// the rows sent ("COPY n"). A BEFORE INSERT trigger that returns NULL, or a
// foreign table, makes the server count fewer: the COPY has committed, but
// some rows are not in the table (or, with a trigger that redirects them,
// elsewhere), and the count does not say which. Acking would lose those
// rows silently, and sending the batch again would store the others twice
// (the trigger drops the same rows again). So every row of that COPY is
// dead-lettered with code "row_count" and a reason giving both counts,
// Stats.Miscounts and Stats.Uncounted count it, and one line is logged at
// error level: the dead-letter subject then holds every event that may be
// missing, for the operator to check against the table and replay. In
// exactly-once mode the COPY goes into the staging table, which has no
// triggers; the INSERT that follows inserts fewer rows than staged
// whenever some conflict, so when it does, one more query after the
// COMMIT looks the batch's keys up in the table (by its unique key) and
// finds those it lacks. (If that lookup fails, a statement_timeout or a
// connection lost after the COMMIT, the batch has committed all the same:
// nothing is acked yet, the batch is sent again, its stored rows conflict,
// and the lookup runs again; no failed attempt is counted, and no piece
// halved, for up to three such lookups of a batch within a minute; past
// that, or for another transient error such as 53200, each is a failed
// attempt, counted with the sink failing.) A BEFORE INSERT
// trigger returning NULL or a DO INSTEAD NOTHING rule left those out (or a
// trigger stored them under another key): here the sink knows which they
// are, so only they are dead-lettered with code "row_count" and the rest of
// the batch is acked. Replaying a dead letter publishes a new message (a
// new stream sequence), which is stored once if nothing drops it again.
//
// exactly-once: each batch is COPYed into a per-connection temporary
// staging table (ON COMMIT DELETE ROWS; the mapping's types, and a type
// guard keeps the INSERT from converting to a column of another type) and
// moved with INSERT ... SELECT ... ON CONFLICT (stream, stream_seq) DO
// NOTHING in the same transaction, so a redelivered message adds nothing.
// BEGIN, the guard, the COPY, the INSERT and COMMIT go out as one Query
// (with the staging table's CREATE on a new connection, and in a Query
// sent again at once, no failed attempt, when the COPY finds the session
// without the table: behind a pooler in transaction mode, another server
// session), the same way as at-least-once's: one round trip a batch, one
// more when the INSERT's row count is short (the lookup above), two more
// when the session lacks the staging table (the failed Query's ROLLBACK,
// and the Query sent again with the CREATE); no transaction waits on
// jetsink between its statements (idle in transaction; but for the
// ROLLBACK after a Query that failed). The lookup's keys are read after
// the commit: a row the batch stored that another session deletes within
// that round trip is taken for missing and dead-lettered (such a table
// cannot tell redeliveries from new events anyway). No unique constraint
// on exactly those columns may be DEFERRABLE: ON CONFLICT refuses one as
// its arbiter (SQLSTATE 55000, even beside a non-deferrable index), so
// every batch would fail; Check reports it (ProblemDeferrableUnique), and
// Init fails on it (ErrNoKeyIndex). Nor may a key column, or a unique
// index on the key, compare with a nondeterministic collation (an ICU one
// that ignores case): the events of streams "ORDERS" and "orders" with the
// same sequence would share a key, and the second be skipped as stored.
// Check reports it (ProblemCollation; its fix re-collates the column,
// which a foreign key on it does not block), Init fails on it (without
// building the key index first), and the type guards refuse every batch
// once a committer's connection has read it as it opened (the lookup after
// a commit compares text keys as bytes too, so a change the guards have
// not read yet dead-letters such an event instead of acking it). Nor may
// a plain table have inheritance children: its unique index does not span
// them, so a row a BEFORE INSERT trigger sends into a child gets past ON
// CONFLICT at every delivery. Check reports it (ProblemInheritance), Init
// fails on it, and the lookup after a commit counts a row only in the
// table itself or in a partition of a partitioned table, so such a row is
// dead-lettered (code "row_count"), not acked. A stream
// deleted and re-created restarts its sequence, and its rows would
// conflict with old ones: StoredSeq tells the consumer the table's highest
// sequence, so that it re-creates a stream past it and refuses one that
// restarted (package consumer, "A stream that restarts its sequence").
// Order is not promised.
//
// The statements name the table as the first connection that finds it
// does (a committer's readTypes, or a check: Check, Run's look at the
// start, Init's), by its schema-qualified name (pinTable, logged at Info
// when postgres.table is unqualified; Sink.Table), not by the name as
// configured. A table made after jetsink started (by jetsink init, by
// hand) is found by the first batch that writes it: a committer whose
// connection found no table (or could not read the catalog, the table
// not pinned yet) looks again before each attempt, and after the commit
// of one (the table made between the look and the COPY); a table found by
// a check, or by another committer, is named by every committer's next
// attempt.
// Check reads and names the same table, and so do Init's and StoredSeq's
// errors and the sink's log lines (table=, spelt as quote_ident would,
// part by part: events, then public.events; "Events"; Sink.LogName) from
// then on. So a table of the same name made later in a schema earlier on
// search_path
// ("$user", first by default), or a search_path changed for the role,
// does not take the rows. A table dropped and made again under that name
// is still found; one moved to another schema is not (every batch fails
// with 42P01, retried, until jetsink is restarted). Check names a pinned
// table that is gone by its pinned name, its fix the CREATE TABLE of that
// name (the configured one may find another table now, which CREATE
// TABLE IF NOT EXISTS would leave as it is) or a restart.
//
// # Failures
//
// Errors are classified with predicates (SQLSTATE class via errors.As,
// pgconn.SafeToRetry, pgconn.Timeout, net.Error, pgconn.ErrConnClosed):
//   - transient (class 08, 40, 53, 57, 58, 55P03, 55006, lost connection,
//     timeout, and 25P03/25P04, an idle-in-transaction or transaction
//     timeout that ended the session): the whole batch is retried with
//     capped exponential backoff and jitter (Retry.Initial..Retry.Max) until
//     the hard context ends; logged at Warn on the first failure and again
//     every minute while the batch keeps failing, with a hint when a server
//     timeout (57014, 55P03, 25P03, 25P04) ended the attempt;
//   - but statement_timeout, transaction_timeout or a cancel (57014,
//     25P04) of more than one row: the committer caps its attempts at half
//     the rows and goes on in pieces (Stats.TimeoutSplits), down to one row,
//     which is retried; a row whose statement times out alone (57014) 3
//     times in a row over 5 minutes at least, with a commit of another
//     row (of an attempt started after the timeout before) between each
//     two, is too slow alone, not locked out: it is dead-lettered (code
//     refused, SQLSTATE 57014; "may already be stored" when a redelivery,
//     exactly-once, or a commit of unknown outcome may have stored it) and
//     logged at Error (see loneTimeoutsPoison). It needs those commits of
//     other rows: with connections: 1, or while every committer is stuck
//     on a slow row of its own, none comes, so such a row is retried for
//     ever and a drain runs to drain_timeout (its rows left unacked, to
//     come back). The cap carries over to its next batches, so that a
//     limit shorter than a batch takes costs each committer the timeouts
//     of one batch's halvings, not of every batch's; it doubles after a
//     commit fast enough that twice the cap would take under half the
//     time the timed-out attempt ran (after a
//     lock wait that outlasted the limit: within about log2(max_rows)
//     commits once the lock is gone), and at least once a minute otherwise,
//     at the cost of one timeout a minute while the limit stays short.
//     Bisection does the same when one of its pieces times out. Check
//     warns of a statement_timeout or transaction_timeout under 10 s
//     (ProblemServerTimeout), and of synchronous_commit off, with which
//     a crash of the server loses commits already acked
//     (ProblemAsyncCommit), and of physical standbys that no COMMIT waits
//     for, with which a failover does (ProblemAsyncStandby), and of an
//     UNLOGGED table or partition, which a crash or a failover empties
//     (ProblemUnlogged; Run logs an unlogged table at Warn once, at
//     its first sight: at the start, or, for a table made unlogged, or
//     made or made again UNLOGGED, while jetsink runs, once a connection
//     reads the table again);
//   - COMMIT (at-least-once: the whole COPY) sent and no answer: outcome
//     unknown, treated as not committed and retried; in at-least-once mode
//     its rows count as PossibleDuplicates; so is one answered without an
//     error but with the session left in a transaction (ReadyForQuery's
//     status not idle), whose connection is closed;
//   - data (class 22, 23, raised by the statement itself: a value its
//     column refuses, a constraint; but a CHECK or NOT NULL violation,
//     23514 or 23502, and a class 22 error of an expression of the
//     table's, a CHECK's or DEFAULT's cast, whose COPY context names no
//     column, which the next class takes): the batch is bisected; good rows are
//     committed and acked, each refused row is dead-lettered through the
//     DeadLetterer (which terms it, or naks it and returns an error, in
//     which case it is not acked), for its own error: one that names its
//     line of the COPY, or that it failed with alone (it is tried alone
//     once more when the error came from a try whose other rows have
//     committed since: a foreign key whose parent came meanwhile, a
//     statement trigger). At most ceil(log2(n))+2 extra COPYs per
//     refused row; after two refused rows in a row the rest is tried in
//     the pieces the bisection left, so a run of refused rows costs about
//     two COPYs per row. In exactly-once mode a row the INSERT from
//     staging refused (this class or the next, not a lone timeout) is
//     first looked up in the table by its key: its CHECKs, domains,
//     row-level security and BEFORE INSERT triggers judge a row before
//     ON CONFLICT finds it stored (a CHECK added NOT VALID after it was
//     stored, a consumer re-made to deliver from the start), so a stored
//     one is acked as a duplicate, as ON CONFLICT would have, not
//     dead-lettered, and counts in Stats.Rows and Bytes (no batch). It is
//     looked up as soon as the bisection finds it, before the next class's
//     rule: a stored row needs no commit to show whose fault its refusal
//     is, so a batch of stored events that a constraint or trigger refuses
//     is acked, not held. A refused row's letter says that it may already
//     be stored when it may (committer.mayBeStored): a redelivery, a
//     commit of its batch of unknown outcome, or in exactly-once mode a
//     refusal of the INSERT from staging whose lookup did not answer (one
//     that lost its connection or timed out is tried once more on a new
//     connection; a failure is logged at Warn, at most once a second; a
//     lookup the hard stop ends leaves the row unsettled, to be delivered
//     again);
//   - an error that a row may cause but the table may as well (a
//     trigger's RAISE, class P0; a class 22 or 23 error raised inside a
//     function, whose context names it, as a trigger's bug that fails
//     every row does, PERFORM 1/0; a CHECK or NOT NULL violation, 23514
//     or 23502, which a constraint added while jetsink runs raises for
//     every row, a CHECK no event passes, added NOT VALID, a NOT NULL on a
//     column the events leave empty, a domain's CHECK, a partition not
//     made yet; a class 22 error of a table's expression, in at-least-once
//     mode, dead-lettered with code "data"; an index entry too large, 54000; an
//     internal error, XX000; any server error outside the classes listed
//     here and those of the table, the session and the grants, below): the
//     batch is bisected the same way, but a row that fails alone is
//     dead-lettered (code "refused") only if a commit attempt that started
//     after the failure was seen has committed, on any connection: that
//     shows the table takes rows (a commit of an attempt that started
//     while the failed one ran shows nothing: it may precede the refusal).
//     Each such row needs a commit of its own, but for one that the
//     CHECK or NOT NULL constraint that refused a row before it refuses
//     by its own line of the COPY (or alone): once a commit that started
//     after that constraint's first refusal shows that it takes rows, the
//     rows it refuses are theirs (a run of bad events), dead-lettered as
//     they are found (after a probe that commits, the refused row is
//     dead-lettered at once, not bisected for again). Until then up to 6 other
//     rows of the batch are tried alone (one given up there for its lone
//     timeouts, above, is dead-lettered then, once, and ends the search;
//     the refused row is tried again after it); if none commits, the rest
//     of the batch is retried like a configuration error (below) until it
//     commits or rows commit elsewhere. So a trigger that refuses every row
//     dead-letters nothing, and one that starts refusing every row partway
//     through a batch at most the row where it started (in exactly-once
//     mode, rows it refuses that are stored already are acked, above).
//     While it retries, the committer also takes the batch the batcher
//     hands it (committer.holdWait) into the retried one and bisects
//     again, so that refused rows holding every connection do not keep
//     the rows behind them from committing, and from showing that the
//     table takes rows. At the end of a drain (the Source closed and
//     every batch handed out), once every committer with a batch left is
//     retrying such rows, nothing can commit any more to tell: each tries
//     its rows once more, and once every one of those tries has failed
//     with no commit since, their rows are left unacked (JetStream
//     redelivers them after ack_wait, as after a hard stop; their events
//     end with outcome "given_up", giving back their hold on the
//     in-flight budget), logged at Warn and counted in Stats.GivenUp,
//     and Run returns, instead of retrying until the hard context ends
//     (committer.strandedWait). A commit meanwhile (a committer still at
//     work, or another's last try) shows that the table takes rows:
//     refused again, the rows are dead-lettered instead;
//   - a COPY that committed with another row count than the rows sent (see
//     Delivery): not retried; its rows are dead-lettered, not acked; an
//     exactly-once batch that committed with rows missing from the table:
//     those rows are dead-lettered, the others acked;
//   - an error of the table, the session or the grants (42xxx undefined
//     table or column, 42501 permission, 28xxx authentication, 25006 a
//     read-only session, 55000, 3Dxxx, 3Fxxx, ...; see tableClass), and
//     one that is not the server's, means the table or the grants do not fit.
//     The operator can fix that without losing an event, so the batch is
//     retried with backoff like a transient error, and logged at error level
//     once per distinct error. Nothing is dead-lettered for it.
//
// A connection whose server has gone silent without closing it (a dead
// host, a firewall that dropped its state) is a lost connection too, but
// the kernel reports it only after ~15 minutes of retransmissions. While
// a batch uses a connection, a watch reads the kernel's TCP_INFO for it
// (every Config.DeadConnectionTimeout/10, at most every 5s) and closes it
// once data has gone unacknowledged, or two or more keepalive or window
// probes in a row unanswered, for DeadConnectionTimeout; the batch is
// then retried, and Stats.DeadConnections counts it. A live server answers
// probes even while it reads nothing, so a COPY waiting for a lock keeps
// its connection however long it waits (see watchConn for why not
// TCP_USER_TIMEOUT). A server that dies while its window is closed is
// noticed later, up to ~4 minutes (window probes are then up to 2 minutes
// apart), and only the next TCP hop is watched (a proxy in between is the
// one to notice a dead server behind it).
//
// Such a wait is silent, so an attempt still under way after 30 s
// (slowBatchAfter) is logged at Warn, and again each time its wait has
// doubled, with what pg_stat_activity says its backend waits for and the
// sessions pg_blocking_pids names (reportSlow, on the admin connection;
// their pid, user, application, state and transaction age, not their
// query). A batch whose wait was logged logs its commit at Info ("batch
// committed after waiting", with how long its attempt ran and the same
// backend_pid): nothing else would say that the wait ended. It costs an
// attempt that ends sooner a timer, ~0.5 µs (BenchmarkSlowWatch).
//
// A sink that cannot reach PostgreSQL gives its events back, so that
// other instances of the durable may store them (release.go). Config.
// ReleaseAfter (0: never) sets how long: once attempts have failed to reach
// the server for that long (a connect that failed, whatever the server
// said, refused login and too many connections included; a connection
// lost with no answer), with no answer from it since (a commit, any error
// of the server's on a live connection: a lock timeout, a data error; a
// lookup that failed after its COMMIT, which the server answered), and a
// probe on a connection of its own has failed too, the sink is away (Away;
// Ready fails, with the last failure): one line at Warn, with how long,
// the error and the rows held. A COPY waiting for a lock is no failure,
// however long, and the probe answering ends the run of failures before
// it (a connect refused while PostgreSQL restarted, then a long wait
// behind a CREATE INDEX). While away, the batcher hands nothing over: it
// nak's (with a 2 s delay) the rows it holds and those that still come,
// once each, and takes a spare batch only to hold rows that may not be
// given back (below); a committer retrying
// its batch gives the rest of it back instead of waiting for the next
// attempt. Only what may be given back is, so that nothing is stored
// twice, lost or dead-lettered for the outage: a row of the current epoch
// (a nak of another would land on the new stream's event, and nothing
// would deliver the row again), not on its last delivery (Config.
// MaxDeliver: JetStream counts the redelivery a nak brings), with a
// message. The batcher keeps the rows that may not (held, and kept alive
// with InProgress, as in a stall); a committer gives back its whole batch
// or keeps it whole, and in at-least-once mode keeps a batch one of whose
// commits had an unknown outcome (its rows may be stored). A committer
// bisecting, probing or holding refused rows keeps them. The rows given
// back are settled (no more InProgress), their events ended with outcome
// "released", counted in Stats.Released, and a nak that fails in
// Stats.ReleaseErrors (JetStream delivers the event again after ack_wait).
// The sink probes the server every max(Retry.Max, 1s) on a connection of
// its own; the first answer (the probe's, or a commit's) ends it: one
// line at Info, with how long and how many rows were given back, and
// everything goes on as before. Run ending ends it too.
//
// # Use
//
//	s, err := sink.New(ctx, cfg, mapper.Columns(), deadLetterer, log)
//	merge := ringq.NewMerge[pipeline.Row](workers, ringSize) // the workers' output rings
//	err = s.Run(hardCtx, merge) // nil once every ring is closed and drained
//	s.Close()
//
// # Errors
//
// Validate, New and ParseTable return errors wrapping ErrInvalidConfig.
// Run returns nil, the hard context's error, or a Source's own error (and
// one wrapping ErrInvalidConfig at once when New was given no
// DeadLetterer).
// Errors never contain the
// connection string; they name host, port and database. A failed connect
// says the server's DETAIL and HINT, which pgx's text leaves out. An error
// of the admin connection (Check, Init, Ping, Ready) with SQLSTATE 42P05
// or 26000, and a batch's logged with one, says that a pooler in
// transaction mode shares server sessions under pgx's cache_statement or
// describe_exec (pooledStatementsHint); one of a read-only session (25006)
// logged says to renew a pooler's server sessions after the fix.
package sink

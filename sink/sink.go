package sink

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/telemetry"
)

// Acker settles a message once its row is stored. pipeline.Msg (and so
// jetstream.Msg) satisfies it; the sink needs nothing else from NATS.
type Acker interface {
	Ack() error
	InProgress() error
}

// Source is the sink's input: the fan-in of the workers' output rings
// (*ringq.Merge[pipeline.Row]). PopN blocks until it moves at least one row
// and returns ringq.ErrClosed once every producer is done and everything is
// drained; TryPopN never blocks. One goroutine (the batcher) calls them.
type Source interface {
	PopN(ctx context.Context, dst []pipeline.Row) (int, error)
	TryPopN(dst []pipeline.Row) int
}

// Stats are cumulative counters, safe to read at any time.
type Stats struct {
	Batches            uint64 // batches committed (a bisected batch counts once per committed piece; one whose every row is dead-lettered after its commit, miscounted or missing from the table, counts none, as in the batch metrics: Rows/Batches is the mean batch size)
	Rows               uint64 // rows committed (in exactly-once mode: rows offered that are in the table after the commit, a redelivered one stored before included, and one refused but found stored before, acked with no commit)
	Bytes              uint64 // tuple bytes committed (and of the rows Rows counts without a commit)
	Retries            uint64 // failed attempts that were retried
	PossibleDuplicates uint64 // rows whose COMMIT outcome was unknown in at-least-once mode (sent again, or left to redelivery at shutdown)
	ConfigErrors       uint64 // attempts retried for an error of the table, the session or the grants (42xxx, 28xxx, ...), or for one a row or the table may cause (a trigger's RAISE, 54000, XX000, ...) while no commit since showed that the table takes rows (see the package doc, Failures)
	BisectCopies       uint64 // extra COPYs spent isolating poison rows
	TakenIntoHeld      uint64 // batches a committer retrying a refused row took into its batch, to bisect again with their rows (see holdWait)
	TimeoutSplits      uint64 // attempts of more than one row that a server timeout ended (statement_timeout, transaction_timeout, a cancel): each halved the committer's cap on rows per attempt, or left it lower (see committer.pieceTimedOut)
	DeadLettered       uint64 // rows dead-lettered by the sink
	Miscounts          uint64 // at-least-once COPYs that committed with a row count other than the rows sent (all their rows were dead-lettered, code "row_count", not acked), and exactly-once batches that committed with rows missing from the table (those rows were)
	Uncounted          uint64 // rows sent minus rows counted in those COPYs, plus the rows missing after those batches: rows that may be missing from the table
	DeadLetterErrors   uint64 // dead-letter calls that failed (the message was nak'ed, not acked)
	AckErrors          uint64 // Ack calls that failed (the message will be redelivered)
	StaleAcks          uint64 // committed rows not acked because their stream was replaced since they were taken (see pipeline.Epochs)
	InProgress         uint64 // InProgress calls sent
	InProgressErrors   uint64 // InProgress calls that failed
	DeadConnections    uint64 // connections given up because the server gave no sign of life for dead_connection_timeout
	GivenUp            uint64 // rows left unacked at the end of a drain: refused with an error a row or the table may cause, and nothing left to commit to tell which (JetStream redelivers them after ack_wait)
	Released           uint64 // rows given back (nak'ed with a short delay, for another instance to take) while postgres was unreachable (see Away)
	ReleaseErrors      uint64 // of those, naks that failed (the message is redelivered after ack_wait)
}

type counters struct {
	batches, rows, bytes, retries, possibleDups, configErrs, bisectCopies atomic.Uint64
	deadLettered, deadLetterErrs, ackErrs, inProgress, inProgressErrs     atomic.Uint64
	miscounts, uncounted, staleAcks, deadConns, takenIntoHeld             atomic.Uint64
	timeoutSplits, givenUp, released, releaseErrs                         atomic.Uint64

	// attemptSeq numbers the sink's commit attempts as they start;
	// committedStart is the highest number of an attempt that committed.
	// A commit whose attempt started after a failure was seen (numbered
	// above attemptSeq as read then) shows that the table took rows after
	// it (committer.tableTakesRows).
	attemptSeq, committedStart atomic.Uint64
}

// raiseCommittedStart raises committedStart to seq, the number of an
// attempt that committed.
func (c *counters) raiseCommittedStart(seq uint64) {
	for cur := c.committedStart.Load(); cur < seq && !c.committedStart.CompareAndSwap(cur, seq); {
		cur = c.committedStart.Load()
	}
}

// Sink writes rows to one PostgreSQL table in batches and settles their
// messages. Create it with New, run it with Run, and Close it after Run has
// returned. Ping, Stats, DDL, Init and Check are safe at any time.
type Sink struct {
	cfg     Config
	table   pgx.Identifier
	cols    []pipeline.Column
	dl      pipeline.DeadLetterer
	log     *slog.Logger
	connCfg *pgx.ConnConfig
	// dropped is the last admin connection pgx closed after an error
	// (guarded by adminSem), for Close to wait for its cleanup.
	dropped *pgconn.PgConn
	where   string // host:port/db for messages; never the password
	streamC string // exactly-once: name of the meta:stream column
	seqC    string // exactly-once: name of the meta:stream_seq column
	seqText bool   // exactly-once: that column is text (ordered as text, not as numbers)

	copySQL   atomic.Pointer[string] // COPY into the table (at-least-once) or the staging table, with type guards (see buildSQL)
	copyStmts int                    // statements in copySQL: 3 (guard, COPY, guard) or 2 (guard, COPY)
	staging   pgx.Identifier         // exactly-once: the staging table (stagingTable)
	stageSQL  string                 // exactly-once: CREATE TEMP TABLE IF NOT EXISTS staging (mapped columns only)
	// tsql is the table's name in the batches' statements, and
	// exactly-once's statements that name it (see buildSQL): the
	// configured name until a committer's readTypes, or a check, finds
	// the table, its schema-qualified name from then on (pinTable).
	tsql   atomic.Pointer[tableSQL]
	pinned bool // tsql names the table found (held by typesMu)
	// unloggedWarned: the table has been logged at Warn as unlogged
	// (held by typesMu), by readTypes or by Run's look (logProblems):
	// once per sink, whichever sees it first, at the start or later (see
	// warnUnlogged).
	unloggedWarned bool

	adminSem   chan struct{} // holds admin: a mutex that a waiter's context can give up
	ownLook    chan struct{} // holds the one connection of its own a waiting-batch report may open (adminOrOwn)
	admin      *pgx.Conn     // the "+1" connection: Ping, Init, Check; nil until needed
	pingMu     sync.Mutex
	pinging    *pingCall                // the ping on a connection of its own under way, which other Pings wait for
	adminDial  *dialCall                // the admin connection's connect under way, or done and not yet taken (see dialAdmin)
	pingClosed bool                     // Close has begun: no more such pings, nor admin connects
	dialMax    time.Duration            // bounds a connect no caller's context bounds (see New)
	loneSpan   time.Duration            // loneTimeoutSpan; the tests shorten it
	keyScan    time.Duration            // keyScanTimeout; the tests shorten it
	timelines  atomic.Pointer[timeline] // the newest timeline connections reached (see validateTimeline)
	hostList   bool                     // postgres.url names several hosts without target_session_attrs (ProblemHostList)
	closed     bool                     // Close has run: admin is not opened again (held like admin)
	seenErrsMu sync.Mutex
	seenErrs   map[string]struct{} // configuration errors already logged
	// tlsUnverified: postgres.url may reach a host that is not this
	// machine in plaintext, or over TLS that checks no certificate
	// (ProblemTLSUnverified); its Kind is "" when not.
	tlsUnverified Problem
	// typesLogged: Check's problems were logged after a type guard failed (run.look).
	typesLogged atomic.Bool
	// splitWarned: a timed-out batch's line at Warn; beatWarned: a refused
	// InProgress's, renewWarned one refused before a dead letter (see
	// warnEvery).
	splitWarned, beatWarned, renewWarned pipeline.Every
	dlFails, dlDone                      pipeline.Every // the logs of failed dead letters (park) and stored ones (deadLetter)
	storedDone                           pipeline.Every // the log of refused rows found stored and acked (deadLetter)
	lookupFails                          pipeline.Every // the log of refused rows that could not be looked up (refusedButStored)
	// typesGen numbers the reads of the table's types; typesMu holds
	// typesStored, the number of the read copySQL's guards come from
	// (see readTypes).
	typesGen    atomic.Uint64
	typesMu     sync.Mutex
	typesStored uint64
	// typesAlso and typesRefuse are the guards' types of the read kept
	// (setCopySQL's arguments), for pinTable to write the COPY again
	// with; typesFound, that that read found the table (all held by
	// typesMu).
	typesAlso   map[string]uint32
	typesRefuse map[string]bool
	typesFound  bool
	// rowSecurity: row-level security applies to the committers' role on
	// the table (read with the types): a 42501 may be a row's (see
	// Sink.classify).
	rowSecurity atomic.Bool

	// refusedSince is when batches began failing (any class but a row's,
	// and not a timeout that cut a batch into pieces) with none committed
	// or judged since (a stamp; 0: not failing), refusedErr what the
	// latest such failure said (see Ready).
	refusedSince atomic.Int64
	refusedErr   atomic.Pointer[refusal]
	// lastAnswered is when answered last ran: a failure from before it
	// shows nothing, even if refused records it after. Both are stamps
	// (stamp): monotonic, as a wall clock stepped back between them
	// would misorder them.
	lastAnswered atomic.Int64
	// unreachableSince is when attempts began failing to reach the
	// server (cannotReach) with no answer since (a stamp; 0: never);
	// lastReached is when the server last answered anything, reachErr
	// the latest reach failure (see noteReach, and release.go).
	unreachableSince, lastReached atomic.Int64
	reachErr                      atomic.Pointer[string]
	// reachFails counts the reach failures noted (noteReach), and
	// reachFailsAt is its count when the run of them under way began: the
	// line that ends an outage says how many attempts it failed.
	reachFails, reachFailsAt atomic.Uint64
	// reach is the state Away reports, replaced under reachMu at each
	// switch (switchReach).
	reach         atomic.Pointer[reachState]
	reachMu       sync.Mutex
	releaseWarned pipeline.Every // the log of failed naks (nakReleased)
	// born is when New made the sink, where stamps count from.
	born time.Time

	// attempts holds, per committer, when its commit attempt under way
	// started (a stamp, on the monotonic clock; 0: none): see
	// OldestAttempt.
	attempts []atomic.Int64

	// running is the Run under way (nil: none), for pingCommitter.
	running atomic.Pointer[run]

	// warmed is closed once the committers' first connects have ended,
	// or Run has returned (see Warmed).
	warmed     chan struct{}
	warmedOnce sync.Once

	st counters

	// Set by Instrument before Run; nil records nothing.
	tracing *telemetry.Tracing
	metrics *telemetry.Metrics

	// epochs is the consumer's (SetEpochs); nil acks every committed row.
	epochs *pipeline.Epochs
	// holdLimit may lower Config.HoldRows while the run goes on
	// (SetHoldLimit); nil leaves it.
	holdLimit func() int
	// ackAll acks a committed batch's messages (SetAckAll; ackEach by default).
	ackAll func(ms []pipeline.Msg, errs []error)
}

// Warmed is closed once every committer's first connect in the first Run
// has ended, connected or failed (a server that refuses connections: the
// first batches retry), or a second (warmGrace) after the first connected,
// should another's hang on its own (a lost SYN, a backend slow to
// authenticate); or once Run has returned. A server that answers nothing
// holds it as long as a connect may take (warm: at least warmTimeout, and
// dialMax). A consumer that starts pulling then does not take events
// before it can store them: they wait in the stream, not in memory with
// their ack_wait running. And the connects (a backend each to start,
// authentication, the table's types) are not slowed by the events' flow:
// measured at 20,000 events/s on the project's 2-core host, they took
// 110-220 ms with the flow running, and the first events waited for them
// (BENCHMARKS.md, session 52). A later Run of the same Sink does not wait.
func (s *Sink) Warmed() <-chan struct{} { return s.warmed }

func (s *Sink) markWarmed() { s.warmedOnce.Do(func() { close(s.warmed) }) }

// Instrument makes Run trace each batch as a "copy <table>" span linked to
// its sampled messages, end every message's span when it is acked, and
// record batch and latency metrics. Either may be nil. Call it before Run,
// not concurrently with it.
func (s *Sink) Instrument(t *telemetry.Tracing, m *telemetry.Metrics) {
	s.tracing, s.metrics = t, m
}

// SetEpochs gives the sink the consumer's epochs: a committed row whose
// event was taken in an earlier epoch (its stream was deleted and
// re-created since, see pipeline.Epochs) is not acked, since the ack would
// settle the new stream's event with the same sequence. Call it before
// Run, not concurrently with it.
func (s *Sink) SetEpochs(e *pipeline.Epochs) { s.epochs = e }

// SetHoldLimit gives the sink a bound on the rows it takes in while the
// database stalls that may change while it runs, below Config.HoldRows:
// "no limit" holds only while what is in flight is bounded in bytes
// (the wire pull client; nats.go pulls over a websocket, or after wire
// could not connect, without a byte budget). limit is called from the
// sink's goroutines, often: it must be cheap and safe for concurrent use.
// Call it before Run, not concurrently with it.
func (s *Sink) SetHoldLimit(limit func() int) { s.holdLimit = limit }

// holdRows is Config.HoldRows, or what SetHoldLimit's function says now if
// that is less.
func (s *Sink) holdRows() int {
	if s.holdLimit == nil {
		return s.cfg.HoldRows
	}
	return min(s.cfg.HoldRows, s.holdLimit())
}

// SetAckAll gives the sink a way to ack the messages of a committed batch
// in one call, cheaper than Ack on each (consumer.AckAll): ackAll must ack
// every message of ms and put each result in errs[i]. Without it each
// message's Ack is called (nil restores that). Call it before Run, not
// concurrently with it.
func (s *Sink) SetAckAll(ackAll func(ms []pipeline.Msg, errs []error)) {
	if ackAll == nil {
		ackAll = ackEach
	}
	s.ackAll = ackAll
}

// ackEach is the default of SetAckAll.
func ackEach(ms []pipeline.Msg, errs []error) {
	for i, m := range ms {
		errs[i] = m.Ack()
	}
}

// stagingTable is the exactly-once staging table of a mapping whose
// columns are defs, one per connection: its name holds a hash of defs, so
// that a session that still has the staging table of another mapping (a
// pooler in transaction mode hands sessions from client to client, and
// another jetsink may share the role) does not take it: CREATE TEMP TABLE
// IF NOT EXISTS would keep it, and a binary COPY into columns of other
// types can store wrong values without an error (float8 bytes read as
// int8).
func stagingTable(defs string) pgx.Identifier {
	sum := sha256.Sum256([]byte(defs))
	return pgx.Identifier{"pg_temp", "jetsink_staging_" + hex.EncodeToString(sum[:6])}
}

// New validates cfg and cols and prepares Connections+1 connections
// (application_name AppName): one per committer and one for Ping, Init and
// Check, and up to two short ones while that one is busy (one for Ping,
// one for the slow-batch report: Connections+3 at once; see the package
// doc). New itself connects only when cfg.CreateTable is set: then it
// runs Init and returns its error. Otherwise a database that is down at
// start-up only delays the first commit: Run opens the committers'
// connections when it starts, and retries them for ever. dl may be nil
// for a Sink that only serves DDL, Init, Check and Ping (jetsink
// check/init); Run needs it. Errors wrap ErrInvalidConfig for a bad config
// or mapping; connection errors name host, port and database only.
func New(ctx context.Context, cfg Config, cols []pipeline.Column, dl pipeline.DeadLetterer, log *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("%w: postgres.columns is empty; list the columns or pass the raw-mode columns", ErrInvalidConfig)
	}
	if log == nil {
		log = slog.Default()
	}
	table, _ := ParseTable(cfg.Table)
	s := &Sink{cfg: cfg, table: table, cols: append([]pipeline.Column(nil), cols...), dl: dl, seenErrs: map[string]struct{}{},
		adminSem: make(chan struct{}, 1), ownLook: make(chan struct{}, 1), ackAll: ackEach, attempts: make([]atomic.Int64, max(cfg.Connections, 1)), born: time.Now(),
		warmed: make(chan struct{}), loneSpan: loneTimeoutSpan, keyScan: keyScanTimeout}
	seen := map[string]bool{}
	for _, c := range s.cols {
		if c.Name == "" || strings.ContainsRune(c.Name, 0) {
			return nil, fmt.Errorf("%w: postgres.columns: a column has an empty name or one with NUL", ErrInvalidConfig)
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("%w: postgres.columns: column %q is listed twice", ErrInvalidConfig, c.Name)
		}
		seen[c.Name] = true
		if _, ok := pgTypes[c.Type]; !ok {
			return nil, fmt.Errorf("%w: postgres.columns: column %q has unknown type %q", ErrInvalidConfig, c.Name, c.Type)
		}
		switch c.From {
		case "meta:stream":
			s.streamC = c.Name
		case "meta:stream_seq":
			s.seqC, s.seqText = c.Name, c.Type == pipeline.TypeText
		}
	}
	if cfg.Mode == ExactlyOnce {
		if p := ExactlyOnceKeyProblem(s.cols); p != "" {
			return nil, fmt.Errorf("%w: %s", ErrInvalidConfig, p)
		}
	}
	s.buildSQL()

	cc, err := pgx.ParseConfig(cfg.URL)
	if err != nil {
		return nil, urlError(cfg.URL, err)
	}
	cc.RuntimeParams["application_name"] = cfg.AppName
	// The sink's statements run once or a few times on each connection
	// (the table's checks, its types on each connect) or go on a wire path
	// of their own (the batches): pgx's default, preparing each statement
	// and caching it, costs each a second round trip on every connection
	// and saves none. One round trip each, with the server inferring the
	// parameters' types as a prepare would (QueryExecModeExec), unless the
	// URL sets default_query_exec_mode.
	if !strings.Contains(cfg.URL, "default_query_exec_mode") {
		cc.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	// The encoder writes UTF-8. Without this the session takes the
	// database's encoding, and in a LATIN1 database "é" would be stored as
	// "Ã©" without an error; with it, PostgreSQL converts, and refuses a
	// character the database cannot hold (SQLSTATE 22P05: its row is
	// dead-lettered). A client_encoding in the URL is overridden.
	cc.RuntimeParams["client_encoding"] = "UTF8"
	// pgx closes a connection on a FATAL error, but tells one by the
	// severity the server translates: on a server with lc_messages in
	// German ("SCHWERWIEGEND") the connection stayed open in pgx's eyes
	// and the FATAL came as an ordinary message, so a session the server
	// had ended while idle cost a batch a failed attempt, warned of and
	// counted, where it costs none (committer.attempt). A PANIC ends the
	// session too.
	pgxOnError := cc.OnPgError
	cc.OnPgError = func(pc *pgconn.PgConn, e *pgconn.PgError) bool {
		return !endsSession(e) && (pgxOnError == nil || pgxOnError(pc, e))
	}
	hosts := hostsOf(&cc.Config)
	if d := cfg.DeadConnectionTimeout; d > 0 && cc.ConnectTimeout == 0 {
		// A host that is gone answers no connect either: without a
		// connect_timeout in the URL, pgx tries each host (and address)
		// for this long. When the URL names several (a failover list),
		// each is given the least, so that a primary that vanished
		// holds every connect to the new one up by 10 s, not by
		// dead_connection_timeout.
		cc.ConnectTimeout = max(d, minConnectTimeout)
		if len(hosts) > 1 {
			cc.ConnectTimeout = minConnectTimeout
		}
	}
	// Every connection is checked for the old primary of a failover
	// (validateTimeline), after target_session_attrs' own check if the
	// URL sets one: refused, pgx tries the next host.
	s.hostList = len(hosts) > 1 && cc.ValidateConnect == nil
	s.tlsUnverified, _ = tlsProblem(&cc.Config)
	tsa := cc.ValidateConnect
	cc.ValidateConnect = func(ctx context.Context, pc *pgconn.PgConn) error {
		if tsa != nil {
			if err := tsa(ctx, pc); err != nil {
				return err
			}
		}
		return s.validateTimeline(ctx, pc)
	}
	s.connCfg = cc
	s.where = strings.Join(hosts, ",") + "/" + cc.Database
	// A connect tries each host in turn, each address of it for the
	// connect timeout (two addresses a host, say: IPv4 and IPv6); without
	// one, until the kernel gives up (about 2 minutes on Linux's
	// defaults).
	s.dialMax = time.Duration(2*len(hosts))*cmp.Or(cc.ConnectTimeout, kernelConnectTimeout) + dialSlack
	// table= is the name the statements use, spelt as LogName spells it:
	// schema-qualified once a connection or a check has found the table
	// (pinTable).
	s.log = slog.New(&tableLog{base: log.With("component", "sink").Handler(), db: s.where, table: s.LogName, cur: new(atomic.Pointer[namedLog])})
	if cfg.CreateTable {
		if err := s.Init(ctx); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// ExactlyOnceKeyProblem says what exactly-once's key lacks in cols (the
// column from meta:stream, the one from meta:stream_seq, or both), as New
// refuses it, or "" when cols have both; for a configuration's checks made
// before any sink is.
func ExactlyOnceKeyProblem(cols []pipeline.Column) string {
	var streamC, seqC string
	for _, c := range cols {
		switch c.From {
		case "meta:stream":
			streamC = c.Name
		case "meta:stream_seq":
			seqC = c.Name
		}
	}
	// Only the column that is missing is suggested.
	const (
		stream = `{name: stream, from: "meta:stream", type: text}`
		seq    = `{name: stream_seq, from: "meta:stream_seq", type: int8}`
	)
	switch {
	case streamC != "" && seqC != "":
		return ""
	case streamC == "" && seqC == "":
		return "postgres.mode exactly-once needs a column from meta:stream and one from meta:stream_seq in postgres.columns " +
			"(the unique key); add " + stream + " and " + seq + ", or use at-least-once"
	case streamC == "":
		return fmt.Sprintf("postgres.mode exactly-once needs a column from meta:stream in postgres.columns beside %q "+
			"(from meta:stream_seq): the two are the unique key; add %s, or use at-least-once", seqC, stream)
	default:
		return fmt.Sprintf("postgres.mode exactly-once needs a column from meta:stream_seq in postgres.columns beside %q "+
			"(from meta:stream): the two are the unique key; add %s, or use at-least-once", streamC, seq)
	}
}

// hostTried is a host:port of postgres.url and pgx's tries of it.
type hostTried struct {
	host string
	port uint16
	name string        // host:port
	tls  []*tls.Config // one a try, in pgx's order; nil: plaintext
}

// hostsTried lists the hosts cc connects to, in the order tried (the
// first, then its fallbacks), once each with all its tries (sslmode=prefer
// makes two fallbacks of each host, one with TLS and one without).
func hostsTried(cc *pgconn.Config) []*hostTried {
	var hosts []*hostTried
	targets := append([]*pgconn.FallbackConfig{{Host: cc.Host, Port: cc.Port, TLSConfig: cc.TLSConfig}}, cc.Fallbacks...)
	for _, f := range targets {
		name := net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port)))
		i := slices.IndexFunc(hosts, func(h *hostTried) bool { return h.name == name })
		if i < 0 {
			hosts = append(hosts, &hostTried{host: f.Host, port: f.Port, name: name})
			i = len(hosts) - 1
		}
		hosts[i].tls = append(hosts[i].tls, f.TLSConfig)
	}
	return hosts
}

// hostsOf lists the host:port pairs cc connects to, in the order tried,
// once each (hostsTried).
func hostsOf(cc *pgconn.Config) []string {
	var names []string
	for _, h := range hostsTried(cc) {
		names = append(names, h.name)
	}
	return names
}

// connect opens one connection. The error names host, port and database.
func (s *Sink) connect(ctx context.Context) (*pgx.Conn, error) {
	// The dials that fail are counted for this connect alone (see
	// unreachable): pgx reports a dial's timeout and a server's, after
	// the dial, alike.
	began := time.Now()
	cc := s.connCfg.Copy()
	var failed atomic.Int32
	dial := cc.DialFunc
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			failed.Add(1)
		}
		return conn, err
	}
	c, err := pgx.ConnectConfig(ctx, cc) // which copies it
	if err != nil {
		return nil, &connectError{where: s.where, err: err, dialsFailed: int(failed.Load()), began: began}
	}
	return c, nil
}

// connectError is a failed connect, said once per distinct line: pgx tries
// each address once with TLS and once without (sslmode=prefer, the
// default), and lists every try, the same dial error twice. A server that
// refuses TLS is no error under prefer, where the try without it follows:
// that line goes (it led operators to look at TLS for a refused password).
// A connect that reached no server (unreachable) ends with where to set
// the URL, as the NATS connect error does.
type connectError struct {
	where       string
	err         error
	dialsFailed int // how many of its tries failed to dial
	// began is when the connect began: a run of reach failures starts
	// there (noteReach), not at its end, which a dial whose packets are
	// dropped puts up to connect_timeout per host later.
	began time.Time
}

func (e *connectError) Error() string {
	lines := strings.Split(e.err.Error(), "\n")
	kept := lines[:0]
	for i, l := range lines {
		if i+1 < len(lines) && refusedTLSRetried(l, lines[i+1]) {
			continue
		}
		if !slices.Contains(kept, l) {
			kept = append(kept, l)
		}
	}
	// pgx's text of the server's error leaves out its DETAIL and HINT,
	// which say why a server refused: "Hot standby mode is disabled." of
	// a standby with hot_standby off (57P03 "the database system is not
	// accepting connections"), say.
	// The try is found by its whole text, address and all: two hosts that
	// refused with the same message may say different details.
	for _, f := range fatalErrorsOf(e.err) {
		extra := pgErrorExtra(f.pe)
		if extra == "" {
			continue
		}
		text := f.try
		if text == "" || strings.Contains(text, "\n") {
			text = f.pe.Error()
		}
		at := slices.IndexFunc(kept, func(l string) bool { return strings.Contains(l, text) })
		switch {
		case at < 0:
			kept[len(kept)-1] += extra
		case !strings.Contains(kept[at], extra):
			kept[at] += extra
		}
	}
	msg := "connect to postgres " + e.where + ": " + strings.Join(kept, "\n")
	if unreachable(e.err, e.dialsFailed) {
		msg += " (is PostgreSQL listening there? set postgres.url, --database-url or JETSINK_DATABASE_URL)"
	}
	return msg
}

// fatalError is a server error ending the session, with the text of the
// try that met it: the error errors.Join listed it under (pgx's
// perDialConnectError, "addr (host): ..."), or "" if none.
type fatalError struct {
	pe  *pgconn.PgError
	try string
}

// fatalErrorsOf is every server error ending the session (FATAL, PANIC:
// a connect's refusals) in err's tree, each once, with its try.
func fatalErrorsOf(err error) []fatalError {
	var found []fatalError
	var walk func(err error, try string)
	walk = func(err error, try string) {
		switch e := err.(type) {
		case nil:
		case *pgconn.PgError:
			if endsSession(e) && !slices.ContainsFunc(found, func(f fatalError) bool { return f.pe == e }) {
				found = append(found, fatalError{pe: e, try: try})
			}
		case interface{ Unwrap() []error }:
			for _, c := range e.Unwrap() {
				if c != nil {
					walk(c, c.Error())
				}
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap(), try)
		}
	}
	walk(err, "")
	return found
}

// pgErrorExtra is pe's DETAIL and HINT as connectError adds them after
// pgx's text, or "" when it has neither.
func pgErrorExtra(pe *pgconn.PgError) string {
	var parts []string
	if pe.Detail != "" {
		parts = append(parts, "DETAIL: "+pe.Detail)
	}
	if pe.Hint != "" {
		parts = append(parts, "HINT: "+pe.Hint)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// unreachable reports whether err, a failed connect, reached no server:
// every address tried failed to dial (refused, no route, a timeout) or
// its name did not resolve. A refused login, a TLS error or any other
// answer means a server is there, and has a cause of its own; so does a
// server that took the connection and then said nothing until the connect
// timeout. dialsFailed is how many of the connect's dials failed: a try
// that timed out counts as a dial's only if as many dials failed as tries
// failed to dial or timed out.
func unreachable(err error, dialsFailed int) bool {
	ce, ok := errors.AsType[*pgconn.ConnectError](err)
	if !ok {
		return false
	}
	tries := []error{ce.Unwrap()} // one, or errors.Join's of every try
	if j, ok := tries[0].(interface{ Unwrap() []error }); ok {
		tries = j.Unwrap()
	}
	dials := 0 // tries that failed to dial, or timed out
	for _, try := range tries {
		if op, ok := errors.AsType[*net.OpError](try); ok && op.Op == "dial" {
			dials++
			continue
		}
		if _, ok := errors.AsType[*net.DNSError](try); ok {
			continue
		}
		// pgx replaces a dial's timeout under the connect timeout with
		// the context's error (normalizeTimeoutError), and a read's
		// timeout after the dial alike: told apart by dialsFailed.
		if errors.Is(try, context.DeadlineExceeded) {
			dials++
			continue
		}
		return false
	}
	return len(tries) > 0 && dials <= dialsFailed
}

// refusedTLSRetried reports whether line, a try of pgx's ConnectError
// ("\t<address> (<ip>): <error>"), is a server's refusal of TLS that the
// next line tries again at the same address (sslmode=prefer).
func refusedTLSRetried(line, next string) bool {
	const refused = ": tls error: server refused TLS connection"
	addr, ok := strings.CutSuffix(line, refused)
	return ok && strings.HasPrefix(addr, "\t") && strings.HasPrefix(next, addr+": ")
}

func (e *connectError) Unwrap() error { return e.err }

// errSinkClosed: the sink's admin connection is not opened after Close.
var errSinkClosed = errors.New("the sink is closed")

// withAdmin runs f on the admin connection, (re)connecting it as needed and
// dropping it after an error that closed it. While another call holds the
// connection (StoredSeq may read a whole table), it waits until ctx ends.
// After Close it fails with errSinkClosed.
func (s *Sink) withAdmin(ctx context.Context, f func(*pgx.Conn) error) error {
	select {
	case s.adminSem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("wait for the admin connection: %w", ctx.Err())
	}
	return s.onAdmin(ctx, f, false)
}

// readAdmin is withAdmin for an f that only reads: a failure that closed
// an admin connection made before the call is tried once more on a new
// one (see onAdmin).
func (s *Sink) readAdmin(ctx context.Context, f func(*pgx.Conn) error) error {
	select {
	case s.adminSem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("wait for the admin connection: %w", ctx.Err())
	}
	return s.onAdmin(ctx, f, true)
}

// onAdmin is withAdmin once adminSem is taken; it releases it. If again,
// f only reads (a ping, a look at pg_stat_activity), and a failure that
// closed a connection made before this call is retried once on a new one:
// the server ends idle connections (a restart, pg_terminate_backend, an
// idle_session_timeout), and an idle connection learns it only when used;
// a /readyz probe would report such a connection's end (57P01) as
// PostgreSQL not ready, once, while it is.
func (s *Sink) onAdmin(ctx context.Context, f func(*pgx.Conn) error, again bool) error {
	defer func() { <-s.adminSem }()
	stale, err := s.onAdminOnce(ctx, f)
	if err != nil && stale && again && ctx.Err() == nil {
		_, err = s.onAdminOnce(ctx, f)
	}
	return hintPooledStatements(err)
}

// onAdminOnce is one try of onAdmin's. stale reports that f failed on a
// connection made before, and that the failure closed it.
func (s *Sink) onAdminOnce(ctx context.Context, f func(*pgx.Conn) error) (stale bool, err error) {
	if s.closed {
		// Not connect again: a /readyz probe while the process shuts
		// down would leave a connection nothing closes.
		return false, fmt.Errorf("postgres %s: %w", s.where, errSinkClosed)
	}
	if s.admin != nil && (s.admin.IsClosed() || s.behind(s.admin.PgConn())) {
		if !s.admin.IsClosed() { // made to a primary a failover has left behind since
			closeConn(ctx, s.admin)
		}
		s.admin = nil
	}
	old := s.admin != nil
	if s.admin == nil {
		c, err := s.dialAdmin(ctx)
		if err != nil {
			return false, err
		}
		s.admin = c
	}
	err = f(s.admin)
	closed := err != nil && s.admin.IsClosed()
	if closed {
		// pgx closes a connection whose context ended in the background,
		// sending the server a cancel request first: Close waits for that.
		s.dropped = s.admin.PgConn()
		s.admin = nil
	}
	return old && closed, err
}

// dialCall is a connect of the admin connection's: conn or err is set
// before done is closed. cancel ends it (endAdminDial).
type dialCall struct {
	done   chan struct{}
	conn   *pgx.Conn
	err    error
	cancel context.CancelFunc
}

// dialAdmin connects the admin connection (the caller holds adminSem). The
// connect is bounded by dialMax, not by ctx: a /readyz probe allows a
// couple of seconds, while a connect may spend a connect timeout on each
// host before the one that answers (a primary that vanished, first in a
// failover list). A caller whose ctx ends first gets an error, and the
// connect goes on, for the next call to take (or join while under way); so
// probes that each give up still reach the live host. A failed connect is
// not kept: the next call starts anew. Run ends one still under way as it
// returns (endAdminDial), and so does Close (CloseContext).
func (s *Sink) dialAdmin(ctx context.Context) (*pgx.Conn, error) {
	s.pingMu.Lock()
	d := s.adminDial
	if d == nil {
		if s.pingClosed {
			s.pingMu.Unlock()
			return nil, fmt.Errorf("postgres %s: %w", s.where, errSinkClosed)
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.dialMax)
		d = &dialCall{done: make(chan struct{}), cancel: cancel}
		s.adminDial = d
		go func() {
			defer cancel()
			c, err := s.connect(dctx)
			s.pingMu.Lock()
			closing := err == nil && s.pingClosed // Close has begun, and will not take it
			if closing {
				d.err = fmt.Errorf("postgres %s: %w", s.where, errSinkClosed)
			} else {
				d.conn, d.err = c, err
			}
			if err != nil || closing {
				s.adminDial = nil
			}
			s.pingMu.Unlock()
			if closing {
				closeConn(dctx, c) // before done: Close waits for it
			}
			close(d.done)
		}()
	}
	s.pingMu.Unlock()
	select {
	case <-d.done:
	case <-ctx.Done():
		per := "until the kernel gives up"
		if t := s.connCfg.ConnectTimeout; t > 0 {
			per = "for up to " + t.String()
		}
		return nil, fmt.Errorf("connect to postgres %s: still trying (each host %s): %w", s.where, per, ctx.Err())
	}
	s.pingMu.Lock()
	if s.adminDial == d {
		s.adminDial = nil // taken
	}
	s.pingMu.Unlock()
	return d.conn, d.err
}

// endAdminDial ends the admin connection's connect under way, if any
// (one done already is left for the next caller to take), and waits for
// its goroutine, dialSlack at most: Run calls it as it returns, for a
// connect that its look at the table, or a committer's, started and gave
// up on (see dialAdmin), so that none outlives Run. A Ping that waits for
// that connect then fails.
func (s *Sink) endAdminDial() {
	s.pingMu.Lock()
	d := s.adminDial
	s.pingMu.Unlock()
	if d == nil {
		return
	}
	d.cancel()
	t := time.NewTimer(dialSlack)
	defer t.Stop()
	select {
	case <-d.done:
	case <-t.C:
	}
}

// closeConn closes c, waiting a second at most for the server's goodbye.
func closeConn(ctx context.Context, c *pgx.Conn) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = c.Close(cctx)
}

// buildSQL writes the statements of a batch.
//
// Binary COPY carries no types: the server reads each field with the
// receive function of its column's type as it is when the COPY runs,
// while the bytes are the mapping's. A column whose type is not the
// mapping's (the table was altered or re-created while jetsink runs, or
// never fit: Check says so, but run starts anyway) reads them wrongly:
// a wider type fails the COPY (22P03, 08P01), but one of the same width
// stores another value without an error (a bigint's bytes in a double
// precision column, a timestamptz's in a timestamp, small numbers in a
// numeric as 0), and some refuse every row as bad data (a jsonb's in a
// json column), which would dead-letter them all. So every batch runs a
// type guard: a statement that divides by zero (see typesChangedError)
// unless every mapped column has the mapping's type (or one
// pgType.accepts, or one pgType.reads that readTypes found in the table),
// in the transaction that stores the batch:
//   - at-least-once sends one simple Query of three statements, which
//     PostgreSQL runs as one transaction: the guard, the COPY, the guard
//     again. The first keeps rows from failing one by one in a table of
//     other types; the second reads the types while the COPY's ROW
//     EXCLUSIVE lock keeps them as the COPY found them (no ALTER TABLE
//     can commit before this transaction ends), and rolls the COPY back
//     if a change came between the two. The guards read the types of the
//     table's row type ((NULL::table).column), which needs no privilege:
//     the COPY needs INSERT alone.
//   - exactly-once copies into a staging table with the mapping's types,
//     in a Query after the guard, whose FROM takes the table's ACCESS
//     SHARE lock (this mode needs SELECT anyway) and holds it until
//     COMMIT, so the INSERT from staging, which would convert a value to
//     a column of another type, meets the types the guard saw.
//
// The guards cost the server 35-55 µs of CPU per batch
// (BenchmarkCopyGuard).
func (s *Sink) buildSQL() {
	names := make([]string, len(s.cols))
	defs := make([]string, len(s.cols))
	for i, c := range s.cols {
		names[i] = pgx.Identifier{c.Name}.Sanitize()
		defs[i] = names[i] + " " + pgTypes[c.Type].name
	}
	if s.cfg.Mode == ExactlyOnce {
		// Only the mapped columns, with the mapping's types (see above)
		// and no constraints.
		cols := strings.Join(defs, ", ")
		s.staging = stagingTable(cols)
		s.stageSQL = "CREATE TEMP TABLE IF NOT EXISTS " + pgx.Identifier{s.staging[1]}.Sanitize() +
			" (" + cols + ") ON COMMIT DELETE ROWS"
	}
	s.copyStmts = 2
	if s.cfg.Mode == AtLeastOnce {
		s.copyStmts = 3
	}
	s.tsql.Store(s.tableSQLOf(s.table))
	s.setCopySQL(nil, nil)
}

// tableSQL is the table's name in the batches' statements (name, quoted),
// in the log lines (logName), and exactly-once's statements that name it.
type tableSQL struct {
	name    string
	log     string
	insert  string // exactly-once: INSERT ... SELECT ... ON CONFLICT DO NOTHING
	missing string // exactly-once: the keys ($1 streams, $2 sequences) the table lacks
}

// tableSQLOf builds the statements of tableSQL for the table id, after
// buildSQL has set the staging table.
func (s *Sink) tableSQLOf(id pgx.Identifier) *tableSQL {
	name := id.Sanitize()
	t := &tableSQL{name: name, log: logName(id)}
	if s.cfg.Mode != ExactlyOnce {
		return t
	}
	names := make([]string, len(s.cols))
	for i, c := range s.cols {
		names[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	list := strings.Join(names, ", ")
	stream, seq := pgx.Identifier{s.streamC}.Sanitize(), pgx.Identifier{s.seqC}.Sanitize()
	t.insert = "INSERT INTO " + name + " (" + list + ") SELECT " + list + " FROM " +
		s.staging.Sanitize() + " ON CONFLICT (" + stream + ", " + seq + ") DO NOTHING"
	// The keys as keyOf writes them, each looked up as the mapping's
	// type (the staging table's) by the table's unique key.
	var streamT, seqT string
	for _, c := range s.cols {
		switch c.Name {
		case s.streamC:
			streamT = pgTypes[c.Type].name
		case s.seqC:
			seqT = pgTypes[c.Type].name
		}
	}
	// A text key is compared a second time as bytes (COLLATE "C"):
	// under a nondeterministic collation, which the guards refuse
	// (see looseKey) but which a column may get while a connection
	// is open, "orders" would be found as "ORDERS" and acked,
	// although ON CONFLICT skipped it. The first comparison, in the
	// column's collation, keeps the unique index usable.
	exact := func(col, key, typ string) string {
		if typ != "text" {
			return ""
		}
		return " AND t." + col + " = k." + key + "::text COLLATE pg_catalog.\"C\""
	}
	// A row counts only in the table itself, or in a partition of a
	// partitioned one, whose unique index spans its partitions: not
	// in a plain table's inheritance children, where ON CONFLICT
	// does not see it (a BEFORE INSERT trigger that redirects rows
	// there would have each redelivery stored again, and acked). Not
	// FROM ONLY, which reads nothing of a partitioned table. The
	// table's relkind is read once per lookup (an InitPlan).
	reg := quoteLiteral(name) + "::regclass"
	t.missing = "SELECT k.stream, k.seq FROM unnest($1::text[], $2::text[]) k(stream, seq) WHERE NOT EXISTS (SELECT 1 FROM " +
		name + " t WHERE t." + stream + " = k.stream::" + streamT + " AND t." + seq + " = k.seq::" + seqT +
		exact(stream, "stream", streamT) + exact(seq, "seq", seqT) +
		" AND (t.tableoid = " + reg + " OR (SELECT relkind FROM pg_catalog.pg_class WHERE oid = " + reg + ") = 'p'))"
	return t
}

// raiseToWarning, a column of each batch's first type guard, raises
// client_min_messages to warning for the batch's transaction when the
// session has it above (error, set for the role, the database or in the
// URL; also fatal and panic before PostgreSQL 12). A commit that a cancel
// took out of its wait for a synchronous standby says so only in a
// WARNING (see syncRepCancelled), which the server does not send at
// error: that commit would be acked. set_config(..., true) lasts until
// the transaction ends, the implicit one of at-least-once's Query too,
// and the server resets it only after the commit record and the wait
// (CommitTransaction: RecordTransactionCommit, then AtEOXact_GUC), so the
// warning goes out (TestSyncRepWarningForced). A lower level (notice,
// log, debug1, ...) sends warnings too and is kept as asked. Not a
// startup parameter: PgBouncer refuses every one it does not track
// ("unsupported startup parameter"), and a session's setting would not
// follow the client under transaction pooling. A setting read (and, at
// error, one set_config) in a statement every batch runs anyway: no
// round trip.
const raiseToWarning = "CASE WHEN current_setting('client_min_messages') IN ('error', 'fatal', 'panic') " +
	"THEN set_config('client_min_messages', 'warning', true) END"

// setCopySQL writes the COPY of a batch with its type guards (see
// buildSQL), which accept for each mapped column the mapping's type, the
// types pgType.accepts, and the type also[column] (one reads accepts);
// for a column in refuse, none (an exactly-once key with a
// nondeterministic collation: see looseKey). The first guard also
// raises client_min_messages for the transaction (raiseToWarning).
func (s *Sink) setCopySQL(also map[string]uint32, refuse map[string]bool) {
	table := s.tsql.Load().name
	names := make([]string, len(s.cols))
	typedRow := make([]string, len(s.cols)) // (NULL::table).column, at-least-once
	typedX := make([]string, len(s.cols))   // x.column, exactly-once
	for i, c := range s.cols {
		names[i] = pgx.Identifier{c.Name}.Sanitize()
		oids := append([]uint32{pgTypes[c.Type].oid}, pgTypes[c.Type].compat...)
		if o, ok := also[c.Name]; ok {
			oids = append(oids, o)
		}
		in := make([]string, len(oids))
		for j, o := range oids {
			in[j] = strconv.FormatUint(uint64(o), 10)
		}
		typedRow[i] = "pg_typeof((NULL::" + table + ")." + names[i] + ")::oid IN (" + strings.Join(in, ", ") + ")"
		typedX[i] = "pg_typeof(x." + names[i] + ")::oid IN (" + strings.Join(in, ", ") + ")"
		if refuse[c.Name] {
			typedRow[i], typedX[i] = "false", "false"
		}
	}
	target := table
	if s.cfg.Mode == ExactlyOnce {
		target = s.staging.Sanitize()
	}
	sql := "COPY " + target + " (" + strings.Join(names, ", ") + ") FROM STDIN (FORMAT binary)"
	if s.cfg.Mode == AtLeastOnce {
		// The regclass first: a missing table fails as the COPY would
		// (42P01), not as a missing row type (42704).
		guard := "SELECT " + quoteLiteral(table) + "::regclass, 1/(" + strings.Join(typedRow, " AND ") + ")::int"
		sql = guard + ", " + raiseToWarning + "; " + sql + "; " + guard
	} else {
		// ON false: the table is not read (the plan's inner side is a
		// Result with a one-time filter); ONLY: not its partitions.
		guard := "SELECT 1/(" + strings.Join(typedX, " AND ") + ")::int, " + raiseToWarning +
			" FROM (SELECT) one LEFT JOIN ONLY " + table + " x ON false"
		sql = guard + "; " + sql
	}
	s.copySQL.Store(&sql)
}

// readTypes reads, on c, whether row-level security applies to the
// committers' role on the table (rowSecurity) and the types of its
// columns, and makes the type guards accept those that store the
// mapping's bytes as sent although they are neither the mapping's nor one
// pgTypes lists: a domain, citext (see Sink.columnReads), whose OIDs
// differ from database to database, and from server to server after a
// failover. A committer calls it on every connection it opens, and after
// a guard failed. In exactly-once mode the guards refuse every batch
// while a key column, or a unique index on the key, has a nondeterministic
// collation (see looseKey). fits reports that every mapped column has
// such a type now, and no such collation applies. Of reads that overlap,
// the one that began last is kept: exists reports that the read kept,
// this one or one that began after it, found the table, so that the
// guards and the table's name in the COPY come from a read that found it
// (a committer whose read was not kept, its table found or not, looks
// again if the kept one found none: see committer.unfound). An error
// leaves the guards as they were.
func (s *Sink) readTypes(ctx context.Context, c *pgx.Conn) (fits, exists bool, err error) {
	gen := s.typesGen.Add(1)
	table := s.tsql.Load().name
	// The reads in one round trip (a new connection's start-up waits
	// for them: see Warmed).
	var b pgx.Batch
	b.Queue(columnTypesSQL, (*uint32)(nil), table)
	b.Queue("SELECT row_security_active(to_regclass($1))", table)
	eo := s.cfg.Mode == ExactlyOnce
	if eo {
		b.Queue(looseKeyIndexSQL, table, s.streamC, s.seqC)
	}
	b.Queue(foundTableSQL, table)
	br := c.SendBatch(ctx, &b)
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return false, false, fmt.Errorf("read the column types of %s: %w", table, err)
	}
	cts, err := scanColumnTypes(rows)
	if err != nil {
		return false, false, fmt.Errorf("read the column types of %s: %w", table, err)
	}
	var rls *bool
	if err := br.QueryRow().Scan(&rls); err != nil {
		return false, false, fmt.Errorf("read whether row-level security applies to %s: %w", table, err)
	}
	looseIndex := false
	if eo {
		if err := br.QueryRow().Scan(&looseIndex); err != nil {
			return false, false, fmt.Errorf("read the collations of the unique indexes of %s: %w", table, err)
		}
	}
	found, err := scanFoundTable(br.QueryRow())
	if err != nil {
		return false, false, fmt.Errorf("read the schema of %s: %w", table, err)
	}
	if err := br.Close(); err != nil {
		return false, false, fmt.Errorf("read the column types of %s: %w", table, err)
	}
	also := map[string]uint32{}
	refuse := map[string]bool{}
	fits = true
	for _, col := range s.cols {
		ct, ok := cts[col.Name]
		switch {
		case !ok || !s.columnReads(col, ct):
			fits = false
		case s.looseKey(col, ct) || looseIndex && col.Name == s.streamC:
			fits, refuse[col.Name] = false, true
		case !pgTypes[col.Type].accepts(ct.typ):
			also[col.Name] = ct.typ
		}
	}
	s.typesMu.Lock()
	defer s.typesMu.Unlock()
	if found.unlogged && s.warnUnlogged() {
		// Not logged by Run's look, nor by a read before (kept or not:
		// it was unlogged when this one looked): made unlogged since the
		// start (ALTER TABLE ... SET UNLOGGED), made (or dropped and
		// made again) unlogged after it, or seen here before the look
		// got to it.
		s.log.Warn("the table is unlogged now: a crash or failover of PostgreSQL empties it after jetsink has acked its events",
			"fix", "ALTER TABLE "+found.name.Sanitize()+" SET LOGGED")
	}
	if gen > s.typesStored {
		s.typesStored = gen
		s.typesAlso, s.typesRefuse, s.typesFound = also, refuse, found.name != nil
		s.rowSecurity.Store(rls != nil && *rls)
		if found.name != nil {
			s.pinTable(found.name)
		}
		s.setCopySQL(also, refuse)
	}
	return fits, s.typesFound, nil
}

// foundTableSQL finds the table the name $1 names, as the batches'
// statements find it (to_regclass: along search_path when unqualified):
// its OID, schema, name, and whether it is unlogged. No row when there is
// none. readTypes and check read it (scanFoundTable), and pin the name it
// finds (pinTable).
const foundTableSQL = `SELECT c.oid, n.nspname, c.relname, c.relpersistence = 'u' FROM pg_catalog.pg_class c
	JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`

// foundTable is what foundTableSQL found: name is nil when there is no
// such table.
type foundTable struct {
	oid      uint32
	name     pgx.Identifier // schema, name
	unlogged bool
}

// scanFoundTable reads foundTableSQL's row.
func scanFoundTable(row pgx.Row) (foundTable, error) {
	var f foundTable
	var schema, name string
	switch err := row.Scan(&f.oid, &schema, &name, &f.unlogged); {
	case err == nil:
		f.name = pgx.Identifier{schema, name}
	case !errors.Is(err, pgx.ErrNoRows):
		return foundTable{}, err
	}
	return f, nil
}

// warnUnlogged reports whether the table, seen unlogged, is to be logged
// at Warn now: the first time only (held by typesMu). Of reads that
// overlap, one kept after another may have run its query first and seen
// the table as it was (see readTypes), and Run's look and a committer's
// read may see it at the same start: each would log it again.
func (s *Sink) warnUnlogged() bool {
	warn := !s.unloggedWarned
	s.unloggedWarned = true
	return warn
}

// Table returns the table's name as the batches' statements name it:
// schema-qualified once a committer's connection or a check (Check,
// Init's) has found the table, the configured name, quoted, until then.
// jetsink check names the table it checked by it.
func (s *Sink) Table() string { return s.tsql.Load().name }

// pinTable makes the batches' statements name the table found, by its
// schema-qualified name, from now on (held by typesMu): the first table
// found, by a committer's readTypes or by a check, whichever comes first,
// so that check reads the table run writes. The COPY and its guards are
// written again with it (setCopySQL, with the types of the read kept), so
// that every committer's next attempt names it: before, only a
// committer's readTypes did, and a committer whose read at connect had
// failed (a statement_timeout, a 42501: the connection stays open) named
// the table as configured for the connection's life after a check had
// pinned it, as did a committer whose read found it but was not kept.
// The name is looked up along search_path by every statement that uses
// it as configured (unqualified, as "table: events"): a table of the same
// name made later in a schema earlier on the path ("$user", one made
// for the role), or a search_path changed for jetsink's role, took the
// rows from then on, acked, without a word (or, owned by another role,
// failed every batch with 42501, naming a grant on the wrong table), and
// exactly-once stored redeliveries again there. A table dropped and made
// again under the same name is still found; one moved to another schema
// is not (every batch fails, 42P01, retried: restart jetsink).
func (s *Sink) pinTable(found pgx.Identifier) {
	if s.pinned {
		return
	}
	s.pinned = true
	if found.Sanitize() == s.tsql.Load().name {
		return
	}
	s.tsql.Store(s.tableSQLOf(found))
	s.setCopySQL(s.typesAlso, s.typesRefuse)
	// Its table= is the name found (the lines before it had the configured
	// one): configured= ties the two.
	s.log.Info("found the table on search_path: its statements name it by its schema-qualified name from now on", "configured", logName(s.table))
}

// LogName returns the table's name as the sink's log lines give it
// (table=): Table's, each part quoted only where PostgreSQL needs it, as
// quote_ident does (public.events, "Events", "order"), where Table quotes
// every part: a grep for events finds the lines of a table of that name
// whatever the line. Before the table is found on search_path it is the
// configured name (events), then the name found (public.events), which
// the line that says so ties to the configured one (configured=events).
func (s *Sink) LogName() string { return s.tsql.Load().log }

// logName is id as SQL that names it, each part quoted only where
// PostgreSQL needs it, as quote_ident decides: a part that is not all
// lower-case ASCII letters, digits and '_' (not starting with a digit), or
// that is one of PostgreSQL 15's keywords that quote_ident quotes.
func logName(id pgx.Identifier) string {
	parts := make([]string, len(id))
	for i, p := range id {
		parts[i] = p
		if needsQuotes(p) {
			parts[i] = pgx.Identifier{p}.Sanitize()
		}
	}
	return strings.Join(parts, ".")
}

func needsQuotes(p string) bool {
	if p == "" || p[0] >= '0' && p[0] <= '9' {
		return true
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return true
		}
	}
	_, kw := quotedKeywords[p]
	return kw
}

// quotedKeywords are the keywords of PostgreSQL 15 that quote_ident quotes
// (SELECT word FROM pg_get_keywords() WHERE catcode <> 'U'). A later
// release's new ones are left unquoted: only the log's spelling, not a
// statement's.
var quotedKeywords = func() map[string]struct{} {
	m := map[string]struct{}{}
	for _, w := range strings.Fields(`all analyse analyze and any array as asc asymmetric authorization between bigint binary
		bit boolean both case cast char character check coalesce collate collation column
		concurrently constraint create cross current_catalog current_date current_role
		current_schema current_time current_timestamp current_user dec decimal default deferrable
		desc distinct do else end except exists extract false fetch float for foreign freeze from
		full grant greatest group grouping having ilike in initially inner inout int integer
		intersect interval into is isnull join lateral leading least left like limit localtime
		localtimestamp national natural nchar none normalize not notnull null nullif numeric
		offset on only or order out outer overlaps overlay placing position precision primary real
		references returning right row select session_user setof similar smallint some substring
		symmetric table tablesample then time timestamp to trailing treat trim true union unique
		user using values varchar variadic verbose when where window with xmlattributes xmlconcat
		xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize xmltable`) {
		m[w] = struct{}{}
	}
	return m
}()

// tableLog is the sink's slog.Handler: base's, with the attributes table
// (table(), as at each line) and db, then those of the With and WithGroup
// calls on it (then). The handler with the attributes is made again when
// the name changes (once, at pinTable).
type tableLog struct {
	base  slog.Handler
	db    string
	table func() string
	then  func(slog.Handler) slog.Handler // nil: none
	cur   *atomic.Pointer[namedLog]
}

// namedLog is the handler a tableLog made for the table named name.
type namedLog struct {
	name string
	h    slog.Handler
}

func (l *tableLog) handler() slog.Handler {
	name := l.table()
	if n := l.cur.Load(); n != nil && n.name == name {
		return n.h
	}
	h := l.base.WithAttrs([]slog.Attr{slog.String("table", name), slog.String("db", l.db)})
	if l.then != nil {
		h = l.then(h)
	}
	l.cur.Store(&namedLog{name, h})
	return h
}

func (l *tableLog) Enabled(ctx context.Context, level slog.Level) bool {
	return l.base.Enabled(ctx, level)
}

func (l *tableLog) Handle(ctx context.Context, r slog.Record) error {
	return l.handler().Handle(ctx, r)
}

func (l *tableLog) WithAttrs(as []slog.Attr) slog.Handler {
	return l.with(func(h slog.Handler) slog.Handler { return h.WithAttrs(as) })
}

func (l *tableLog) WithGroup(name string) slog.Handler {
	return l.with(func(h slog.Handler) slog.Handler { return h.WithGroup(name) })
}

func (l *tableLog) with(f func(slog.Handler) slog.Handler) slog.Handler {
	then := f
	if prev := l.then; prev != nil {
		then = func(h slog.Handler) slog.Handler { return f(prev(h)) }
	}
	return &tableLog{base: l.base, db: l.db, table: l.table, then: then, cur: new(atomic.Pointer[namedLog])}
}

// readTypesTimeout bounds a readTypes: a server gone silent would
// otherwise hold it until TCP gives up (a committer's watch on its
// connection starts with the attempt).
const readTypesTimeout = 10 * time.Second

// typesFitNow reads the table's types again after the guards failed, on
// c, the connection of the committer whose attempt they failed (sent: the
// COPY with the guards that attempt sent), and reports whether every
// mapped column now has a type that stores the mapping's bytes as sent
// and the guards have changed since (a column retyped to a domain over
// its type: they accept it from now on, whichever committer read it
// first). Guards that fail as they are mean the table is at fault. On c,
// not the admin connection: a retry does not wait for a StoredSeq or a
// check that holds that one. False if c is closed (the next attempt's
// connect reads the types).
func (s *Sink) typesFitNow(ctx context.Context, c *pgx.Conn, sent *string) bool {
	if c == nil || c.IsClosed() {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, readTypesTimeout)
	defer cancel()
	fits, _, err := s.readTypes(ctx, c)
	return err == nil && fits && sent != nil && *sent != *s.copySQL.Load()
}

// columnReads reports whether a column of type ct stores col's bytes as
// sent (pgType.reads). In exactly-once mode the key columns (meta:stream,
// meta:stream_seq) take no type by its binary input alone: such a type
// has other comparisons (citext's ignore case), and the unique index would
// take the events of streams "A" and "a" for one another's.
func (s *Sink) columnReads(col pipeline.Column, ct colType) bool {
	eo := s.cfg.Mode == ExactlyOnce
	return pgTypes[col.Type].reads(ct, eo, eo && (col.Name == s.streamC || col.Name == s.seqC))
}

// looseKey reports whether, in exactly-once mode, col is a key column
// (meta:stream, meta:stream_seq) of type ct that compares with a
// nondeterministic collation: the unique index then takes the events of
// streams "ORDERS" and "orders" with the same sequence for one another's,
// ON CONFLICT DO NOTHING skips the second, and the lookup after the
// commit (missingSQL, but for its COLLATE "C") finds the first in its
// place. The guards refuse every batch then (readTypes), and Check says
// why (ProblemCollation), as for citext (columnReads).
func (s *Sink) looseKey(col pipeline.Column, ct colType) bool {
	return s.cfg.Mode == ExactlyOnce && (col.Name == s.streamC || col.Name == s.seqC) && ct.looseCollation != ""
}

// quoteLiteral quotes s as an SQL string literal, whatever
// standard_conforming_strings says (s has no NUL).
func quoteLiteral(s string) string {
	return "E'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}

// Close closes the admin connection. Run closes the committers' own
// connections before it returns; call Close after Run has returned.
func (s *Sink) Close() { s.CloseContext(context.Background()) }

// CloseContext is Close, giving up its waits once ctx ends: the goodbye
// to the server on the admin connection (a second at most), and the
// cancel request pgx sends for an admin statement whose context ended
// (dropWait at most). A server that does not answer at all would hold up
// a stop that must be at once (a second signal) for both. So would
// another call holding the admin connection (StoredSeq, Check): if ctx
// ends first, CloseContext returns without closing it, leaving it to the
// process's exit. It also ends a ping on a connection of its own
// (privatePing) or an admin connect (dialAdmin) still under way, whose
// callers gave up on it, and waits for it, dialSlack at most.
func (s *Sink) CloseContext(ctx context.Context) {
	select {
	case s.adminSem <- struct{}{}:
	default: // busy: wait while ctx lasts (an ended one must not win a free semaphore's race)
		select {
		case s.adminSem <- struct{}{}:
		case <-ctx.Done():
			return
		}
	}
	defer func() { <-s.adminSem }()
	s.pingMu.Lock()
	pc, d := s.pinging, s.adminDial
	s.pingClosed = true
	s.pingMu.Unlock()
	// A ping or admin connect whose caller gave up on it may be under
	// way (a stop during New's, check's or init's connect to a server
	// that takes the connection and never answers): ended now, nothing
	// is left to take it, then waited for, dialSlack at most, as it closes
	// its own connection. Not cancelled, Close waited out dialSlack for a
	// connect that went on (5 s of a docker stop's 10). One that connects
	// before the cancel tells is closed anyway (pingClosed).
	if pc != nil {
		pc.cancel()
	}
	if d != nil {
		d.cancel()
	}
	wait := time.NewTimer(dialSlack)
	defer wait.Stop()
	if pc != nil {
		select {
		case <-pc.done:
		case <-ctx.Done():
		case <-wait.C:
		}
	}
	if d != nil {
		done := false
		select { // done already wins over an ended ctx
		case <-d.done:
			done = true
		default:
			select {
			case <-d.done:
				done = true
			case <-ctx.Done():
			case <-wait.C:
			}
		}
		if done && d.conn != nil { // done before Close began, and not taken
			closeConn(ctx, d.conn)
		}
	}
	s.closed = true
	if s.admin != nil {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_ = s.admin.Close(cctx)
		s.admin = nil
	}
	if s.dropped != nil {
		// The cancel request pgx sends for a statement whose context
		// ended (`jetsink init` stopped with Ctrl-C while it builds an
		// index): a process that exits first leaves the statement, and
		// its locks, running on the server.
		t := time.NewTimer(dropWait)
		defer t.Stop()
		select {
		case <-s.dropped.CleanupDone():
		case <-t.C:
		case <-ctx.Done():
		}
		s.dropped = nil
	}
}

// dropWait bounds Close's wait for a dropped admin connection's cancel
// request.
const dropWait = 5 * time.Second

// Ping checks that PostgreSQL answers (for /readyz), on the admin
// connection, or on one of its own while another call holds that one for
// longer than pingWait: StoredSeq may read a whole table, Check and the
// slow-commit report take seconds, and a probe must not fail (taking the
// process out of service) for waiting behind them. Pings that come
// meanwhile wait for that one's answer, not connect each: /readyz takes
// any number of requests, and connections past max_connections would fail
// the committers' reconnects (and other clients of the server). The error
// names host, port and database only.
func (s *Sink) Ping(ctx context.Context) error {
	t := time.NewTimer(pingWait)
	defer t.Stop()
	var err error
	select {
	case s.adminSem <- struct{}{}:
		err = s.onAdmin(ctx, func(c *pgx.Conn) error { return c.Ping(ctx) }, true)
	case <-t.C:
		pc := s.privatePing(ctx)
		select {
		case <-pc.done:
			err = pc.err
		case <-ctx.Done():
			err = ctx.Err()
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("ping postgres %s: %w", s.where, err)
	}
	return nil
}

// pingCall is a ping on a connection of its own: err is set before done
// is closed.
type pingCall struct {
	done   chan struct{}
	err    error
	cancel context.CancelFunc // ends it (CloseContext)
}

// connectPing connects on a connection of its own, pings the server on it
// and closes it, within ctx: a look that no committer's or the admin
// connection's state can answer for (privatePing, probeReach).
func (s *Sink) connectPing(ctx context.Context) error {
	c, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(ctx, c)
	return c.Ping(ctx)
}

// privatePing returns the ping on a connection of its own under way, or
// starts one, bounded by dialMax, not by ctx: the callers that
// wait for it bound their waits with contexts of their own, and one that
// comes later must not get an earlier one's deadline for an answer. After
// Close has begun it starts none (errSinkClosed).
func (s *Sink) privatePing(ctx context.Context) *pingCall {
	s.pingMu.Lock()
	defer s.pingMu.Unlock()
	if s.pinging != nil {
		return s.pinging
	}
	pc := &pingCall{done: make(chan struct{}), cancel: func() {}}
	if s.pingClosed {
		pc.err = errSinkClosed
		close(pc.done)
		return pc
	}
	s.pinging = pc
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.dialMax)
	pc.cancel = cancel
	go func() {
		defer cancel()
		err := s.connectPing(pctx)
		s.pingMu.Lock()
		s.pinging = nil
		s.pingMu.Unlock()
		pc.err = err
		close(pc.done)
	}()
	return pc
}

// pingWait is how long Ping waits for a busy admin connection before it
// pings on a connection of its own. dialMax bounds that ping, and an admin
// connect: a connect timeout per host, plus dialSlack for the ping or
// what follows the connect (each caller's wait is bounded by its own
// context).
const (
	pingWait  = 100 * time.Millisecond
	dialSlack = 5 * time.Second
	// kernelConnectTimeout: how long Linux tries a TCP connect to a
	// host that does not answer, at the default tcp_syn_retries (6):
	// 127 s.
	kernelConnectTimeout = 130 * time.Second
)

// refusedFor is how long batches must have failed, none committing,
// before Ready reports it. Shorter than the minute a probe's
// failureThreshold x periodSeconds usually allows, long enough that a
// table being re-created, a grant being changed or a failover does not
// flap it. A variable for the tests.
var refusedFor = 30 * time.Second

// refusal is the latest failure of a batch, as Ready shows it.
type refusal struct {
	msg string
	// table: a configuration or suspect error, which `jetsink check`
	// may explain; otherwise a transient one (a full disk, too many
	// connections, a server shutting down).
	table bool
}

// Ready is the sink's readiness (for /readyz): PostgreSQL answers (Ping;
// or refuses a new connection while batches commit, answered within
// answeredReady, or while an idle committer's connection answers a ping),
// and has not failed every batch for refusedFor: with a configuration
// error, such as a missing table, a revoked permission or a read-only
// server, or a transient one that lasts, such as a full disk. Ping alone
// stays healthy then while nothing is written. While the sink is away
// (Away: it could not reach the server for Config.ReleaseAfter and gave
// its events back) it is not ready, whatever a ping says.
func (s *Sink) Ready(ctx context.Context) error {
	if st := s.reach.Load(); st != nil && st.away {
		d, msg := s.unreachableFor(time.Now())
		if d == 0 {
			d, msg = time.Since(st.since), st.lastErr
		}
		return fmt.Errorf("postgres %s unreachable for %v; the events held here were given back, and none are taken until it answers: %s",
			s.where, d.Round(time.Second), msg)
	}
	if err := s.Ping(ctx); err != nil {
		if !tooManyConnections(err) {
			return err
		}
		// A new connection is refused (too many connections for the
		// role or the server) while the committers commit, or (a quiet
		// stream) while an idle committer's connection answers: the
		// server is there, and a probe that failed now would take a
		// process out of service that stores every event.
		if !s.answeredWithin(answeredReady) && s.pingCommitter(ctx) != nil {
			return err
		}
	}
	if d, r := s.failing(); d >= refusedFor {
		if r.table {
			return fmt.Errorf("postgres %s has refused every batch for %v, none committed: %s (`jetsink check` says what differs, where it can see it)",
				s.where, d.Round(time.Second), r.msg)
		}
		return fmt.Errorf("postgres %s has failed every batch for %v, none committed: %s",
			s.where, d.Round(time.Second), r.msg)
	}
	return nil
}

// failing returns how long batches have failed, none answered since (0:
// they do not), and the latest failure.
func (s *Sink) failing() (time.Duration, refusal) {
	since := s.refusedSince.Load()
	if since == 0 || since <= s.lastAnswered.Load() {
		return 0, refusal{}
	}
	r := refusal{msg: "an error", table: true}
	if p := s.refusedErr.Load(); p != nil {
		r = *p
	}
	return time.Duration(s.stamp(time.Now()) - since), r
}

// Failing returns, while batches fail and none has been answered since,
// for how long and the latest failure's error ("" otherwise): what holds a
// drain up, when it times out.
func (s *Sink) Failing() (time.Duration, string) {
	d, r := s.failing()
	return d, r.msg
}

// tooManyConnections reports whether err is a connect the server refused
// for want of a connection slot (53300: the role's CONNECTION LIMIT, or
// max_connections).
func tooManyConnections(err error) bool {
	if _, ok := errors.AsType[*pgconn.ConnectError](err); !ok {
		return false
	}
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == "53300"
}

// answeredReady is how recently a batch must have been answered (answered)
// for Ready to overlook an admin connection that cannot connect without
// pinging on a committer's. A variable for the tests.
var answeredReady = 10 * time.Second

// errNoIdleCommitter: Run is not running, or it has no idle committer with
// a connection to ping on.
var errNoIdleCommitter = errors.New("no idle committer connected")

// pingCommitter pings the server on an idle committer's connection (see
// committer.next), for Ready when the admin connection cannot connect.
func (s *Sink) pingCommitter(ctx context.Context) error {
	r := s.running.Load()
	if r == nil {
		return errNoIdleCommitter
	}
	// Whichever idle committer takes it: one without a (live) connection
	// says so, and the next is asked (waiting receivers take turns).
	err := errNoIdleCommitter
	for range s.cfg.Connections {
		reply := make(chan error, 1)
		select {
		case r.pings <- reply:
		case <-r.done:
			return errNoIdleCommitter
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case err = <-reply:
		case <-ctx.Done():
			return ctx.Err()
		}
		if !errors.Is(err, errNoIdleCommitter) {
			return err
		}
	}
	return err
}

// answeredWithin reports whether a batch was answered within d.
func (s *Sink) answeredWithin(d time.Duration) bool {
	at := s.lastAnswered.Load()
	return at != 0 && time.Duration(s.stamp(time.Now())-at) < d
}

// refused records a batch that failed at at with err, of class cl (not
// classData); answered clears it. It counts from the failure, not from
// the attempt's start: an attempt that waited long (a lock, a connection
// gone silent) while others committed must not make Ready fail at once.
// A failure from before the last answer (recorded late, after a commit
// elsewhere) is not recorded, and an earlier one recorded late does not
// stand in the way of a new run.
func (s *Sink) refused(err error, cl class, at time.Time) {
	t := s.stamp(at)
	if t <= s.lastAnswered.Load() {
		return
	}
	msg := err.Error()
	var pgErr *pgconn.PgError
	if _, ok := errors.AsType[*typesChangedError](err); ok {
		// Its own words: the guard's division by zero would name no cause.
	} else if errors.As(err, &pgErr) {
		msg = "SQLSTATE " + pgErr.Code + ": " + pgErr.Message
		if cl == classSuspect {
			msg = "SQLSTATE " + pgErr.Code // its message may quote a row (see logSuspect)
		}
	}
	s.refusedErr.Store(&refusal{msg: msg, table: cl != classTransient})
	for {
		old := s.refusedSince.Load()
		if old != 0 && old > s.lastAnswered.Load() {
			return // a run of failures under way since old
		}
		if s.refusedSince.CompareAndSwap(old, t) {
			return
		}
	}
}

// stamp is t as refusedSince and lastAnswered hold it: nanoseconds since
// the sink was made, on the monotonic clock, plus one (0 is "never").
func (s *Sink) stamp(t time.Time) int64 { return int64(t.Sub(s.born)) + 1 }

// answered clears what refused recorded: a batch committed, or the
// server judged its rows (a data error: they are dead-lettered or
// bisected; a row it refused once the table took others), which shows
// that it takes batches.
func (s *Sink) answered() {
	now := s.stamp(time.Now())
	s.lastAnswered.Store(now)
	if s.cfg.ReleaseAfter > 0 {
		s.reached(now)
	}
	if s.refusedSince.Load() != 0 {
		s.refusedSince.Store(0)
	}
}

// OldestAttempt is how long the longest commit attempt under way has run,
// 0 when none runs: a batch waiting for a lock, or on a server that hangs,
// shows here long before anything fails. It is timed on the monotonic
// clock: a step of the wall clock neither hides a stuck attempt (a step
// back) nor ages one (a step forward).
func (s *Sink) OldestAttempt() time.Duration {
	now := s.stamp(time.Now())
	var oldest int64
	for i := range s.attempts {
		if at := s.attempts[i].Load(); at != 0 {
			oldest = max(oldest, now-at)
		}
	}
	return time.Duration(oldest)
}

// Stats returns a snapshot of the counters.
func (s *Sink) Stats() Stats {
	return Stats{
		Batches:            s.st.batches.Load(),
		Rows:               s.st.rows.Load(),
		Bytes:              s.st.bytes.Load(),
		Retries:            s.st.retries.Load(),
		PossibleDuplicates: s.st.possibleDups.Load(),
		ConfigErrors:       s.st.configErrs.Load(),
		BisectCopies:       s.st.bisectCopies.Load(),
		TakenIntoHeld:      s.st.takenIntoHeld.Load(),
		TimeoutSplits:      s.st.timeoutSplits.Load(),
		DeadLettered:       s.st.deadLettered.Load(),
		Miscounts:          s.st.miscounts.Load(),
		Uncounted:          s.st.uncounted.Load(),
		DeadLetterErrors:   s.st.deadLetterErrs.Load(),
		AckErrors:          s.st.ackErrs.Load(),
		StaleAcks:          s.st.staleAcks.Load(),
		InProgress:         s.st.inProgress.Load(),
		InProgressErrors:   s.st.inProgressErrs.Load(),
		DeadConnections:    s.st.deadConns.Load(),
		GivenUp:            s.st.givenUp.Load(),
		Released:           s.st.released.Load(),
		ReleaseErrors:      s.st.releaseErrs.Load(),
	}
}

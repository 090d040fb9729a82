package consumer

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/pipeline"
)

// ErrStreamNotFound is returned by New when nats.create_stream is false and
// the stream does not exist. It also matches jetstream.ErrStreamNotFound.
var ErrStreamNotFound = errors.New("stream not found")

// closeWait bounds how long Close waits for the server to confirm the acks
// when its context has no deadline.
const closeWait = 10 * time.Second

// writeTimeout bounds a write to NATS on nats.go's connection, as
// wire.Options.WriteTimeout's default does on the wire connection.
const writeTimeout = 10 * time.Second

// abortFlush bounds how long the wire connection may take to send the acks
// it buffered when nats.go's disconnects (see natsOptions).
const abortFlush = 2 * time.Second

// Consumer is a connection to NATS bound to one stream and one durable pull
// consumer. Run is called by one goroutine; DeadLetter, Lag, Stats and Ready
// are safe from any goroutine.
type Consumer struct {
	cfg  Config
	log  *slog.Logger
	base time.Time // taken at New: monotonic stamps are durations since it
	// recent holds the acks sent lately, resendFrom when a leader change
	// was told (sinceBase+1; 0: none due), for resendAcks (leaderacks.go).
	recent      recentAcks
	resendFrom  atomic.Int64
	resendAgain atomic.Int64  // resendFrom as the first resend took it
	resendEpoch atomic.Uint64 // the epoch the first resend sent under
	lastTold    atomic.Int64  // resendFrom as leaderChanged last set it
	// leaderWatchDenied: the refusal of Run's subscription to the
	// consumer's leader change advisory (watchLeader) has been said.
	leaderWatchDenied atomic.Bool
	// streamReplicas is the event stream's replicas as ensureStream last
	// read them; durableReplicasWarned, once its durable's fewer were.
	// streamStorage is its storage, as ensureStream last read it;
	// memoryDurableWarned, once its durable's in memory was
	// (memoryDurableProblem); maxWaitingWarned, once its durable's low
	// max_waiting was (maxWaitingProblem).
	streamReplicas        atomic.Int64
	durableReplicasWarned atomic.Bool
	streamStorage         atomic.Int64
	memoryDurableWarned   atomic.Bool
	maxWaitingWarned      atomic.Bool
	nc                    *nats.Conn
	js                    jetstream.JetStream
	closed                chan struct{} // closed by the connection's closed handler
	// reconnected has a token after each reconnect, for serve.
	reconnected chan struct{}
	// outage watches the connection while it is lost (natsOptions).
	outage natsOutage

	// cons is the durable consumer handle; Run replaces it when it has to
	// re-create the consumer.
	cons atomic.Pointer[consumerHandle]
	// batchLimit is the consumer's max_request_batch as the server last
	// told it (0: none), for pullMessages.
	batchLimit atomic.Int64

	stats counters

	// seq is what checkSeq knows of the stream's sequence.
	seq seqGuard
	// metaMu serialises this process's updates of the consumer's metadata.
	metaMu sync.Mutex

	// wc is the wire pull client's connection (nats.pull_client "wire"),
	// nil until its first session; Run's goroutine replaces it when it has
	// died, Close closes it.
	wc      atomic.Pointer[wire.Conn]
	wsNoted atomic.Bool // pullsWithWire logged that a websocket URL keeps nats.go
	// wireDialFails counts failed wire dials in a row; wireGaveUp: nats.go
	// pulls from now on (wireConn).
	wireDialFails atomic.Int32
	wireGaveUp    atomic.Bool
	// budget bounds the bytes of the wire client's messages in flight
	// (Config.MaxInFlightBytes); nil without a bound. bounded: the
	// current session pulls under it (wire, not nats.go).
	budget  atomic.Pointer[wire.Budget]
	bounded atomic.Bool

	// epochs tells the sink and the dead-letter path which events came
	// from a stream that has been replaced since (see pipeline.Epochs);
	// streamCreated is the creation time of the stream the last session
	// consumed (Run's goroutine only).
	epochs        pipeline.Epochs
	streamCreated time.Time
	// deletedThrough is the highest sequence countDeletedUnread has
	// counted in the stream created at deletedStream, under deletedMu;
	// deletedLog bounds its Error line. unfiltered: the last look showed
	// the consumer without a filter (noteDeletedUnread).
	deletedMu      sync.Mutex
	deletedThrough uint64
	deletedStream  time.Time
	deletedLog     pipeline.Every
	unfiltered     atomic.Bool
	// skipFloor is the stream's last sequence when the session began
	// (floorNow): noteSkipped counts only gaps above it (MaxUint64: none).
	// selfDeleting: the stream deletes messages of its own that are no
	// events (subject delete markers with a TTL, fired schedules).
	// gapsNotEvents: the stream's gaps are no events deleted (it purges
	// schedules as they fire; a mirror with a filter or transforms skips
	// the sequences of what it leaves out): noteSkipped counts none.
	skipFloor     atomic.Uint64
	selfDeleting  atomic.Bool
	gapsNotEvents atomic.Bool

	// resumeFloor is where Run makes again a consumer that went away while
	// it ran: past the ack floor (a stream sequence) the server last
	// reported for it under jetsink's filter on the stream created at
	// resumeStream (noteFloor), so that a deleted durable does not
	// deliver the whole stream again. refreshFloor's remake after another
	// filter starts past it too (editFloor).
	// serve asks for the floor every floorEvery. Run's goroutine only.
	resumeFloor  atomic.Uint64 // atomic for the tests' sake
	resumeStream time.Time
	floorEvery   time.Duration
	// resumeUnsure: a consumer made past the floor whose stream could not
	// be confirmed after (ensureConsumer). Run's goroutine only.
	resumeUnsure bool
	// starting: New's call of ensureConsumer, which refuses a durable
	// made beside another of this destination (lookForSiblings); Run's
	// warn. New's goroutine, then Run's.
	starting bool
	// interest: the event stream has interest retention, where deleting
	// the durable deletes its events (ensureStream; holdFirst).
	// workQueue: it has work-queue retention, where the server makes a
	// consumer only to deliver all (resumeAfterFloor). Looked at by each
	// ensureStream, though the server lets no update change a stream's
	// retention to or from work-queue: a stream that replaced it may have
	// another.
	interest  atomic.Bool
	workQueue atomic.Bool
	// goneSaid: resumeAfterFloor has said the consumer went and is made
	// again; cleared once it is (ensureConsumer), so that a remake the
	// server refuses, retried every few seconds, says it once a loss.
	// metaMu held.
	goneSaid bool
	// serverPaused: the durable was last seen paused on the server
	// (nats consumer pause), and that was logged (ensureConsumer,
	// notePausedOnServer).
	serverPaused atomic.Bool
	// sealedNoted: createStream has said the event stream is sealed.
	sealedNoted atomic.Bool
	// streamNoted is the creation time of the event stream whose settings
	// ensureStream has logged what it warns of in (replicas, the
	// publishers' deletions, interest retention): once per stream, not
	// again at each re-creation of the consumer, but again for a stream
	// that replaced it. inactiveLimitNoted: that of the stream whose
	// consumer_limits.inactive_threshold (inactiveLimitProblem) it has
	// warned of, when it first found one.
	streamNoted        atomic.Pointer[time.Time]
	inactiveLimitNoted atomic.Pointer[time.Time]
	// inactiveLimit is the event stream's consumer_limits.inactive_threshold
	// as last looked at (ensureStream, streamLimits): the server gives it
	// to a consumer that sets none, as jetsink's durable does, so it is no
	// edit (refreshFloor). A time.Duration.
	inactiveLimit atomic.Int64
	// inactiveLimitAt is when inactiveLimit was noted (sinceBase+1, the
	// monotonic clock; 0: never): the tests set it to 0 to have the next
	// look look at the stream (givenByStream).
	inactiveLimitAt atomic.Int64
	// ackPendingLeft: refreshFloor has said it leaves a max_ack_pending
	// lowered on the server that the stream's consumer_limits keep it from
	// setting back; cleared when there is none.
	ackPendingLeft atomic.Bool
	// looks counts refreshFloor's answered looks at the durable (the
	// tests count them).
	looks atomic.Uint64
	// filterApplied: ensureConsumer has applied nats.filter_subject once
	// (New); later updates keep a filter another jetsink of the durable
	// recorded (othersFilter). metaMu held.
	filterApplied bool
	// filterEditSaid: refreshFloor has logged another filter on the
	// durable at Error, with the remake past the floor before it, which
	// the ensureConsumer that sets jetsink's back then only warns of
	// (and clears). Run's goroutine only.
	filterEditSaid bool
	// otherFilterLog bounds refreshFloor's Error line about another
	// jetsink's filter (serve's goroutine only).
	otherFilterLog pipeline.Every
	// filterKeep is how long another jetsink's filter is kept since it
	// was set (defaultFilterKeep; shorter in tests). filterSeen is such a
	// filter recorded without a time, and when it was first seen
	// (othersFilter), under filterSeenMu.
	filterKeep   time.Duration
	filterSeenMu sync.Mutex
	filterSeen   *seenFilter

	// dlBreaker fails dead letters fast while the dead-letter stream does
	// not answer; dlRecreated is when DeadLetter last re-created that
	// stream (sinceBase+1, the monotonic clock; 0: never; see
	// publishDeadLetter); dlHeldLog bounds the log lines of the dead
	// letters the open breaker holds back.
	dlBreaker   dlBreaker
	dlRecreated atomic.Int64
	dlLooked    atomic.Pointer[dlLook] // deadLetterStreamThere's last verdict
	dlHeldLog   pipeline.Every
	dlFailLog   pipeline.Every // the same for the other failed dead letters
	dlDoneLog   dlCodeLimit    // the same for the stored ones, for each code
	// asyncErrs and subErrs bound the log lines of the connections' and
	// the pull subscription's errors (asyncErrEvery): a server that
	// refuses the user's acks answers each with one.
	asyncErrs, subErrs pipeline.Every
	// noResponders, missedBeats and checkErrs bound the log lines of
	// pulls that no server answered or that missed their heartbeats, and
	// of looks at the consumer that failed (quietEvery): JetStream
	// disabled for hours would log a pair every few seconds. lastRecheck
	// is when serve's last look at the consumer ended; a pull looks again
	// only recheckGap after it (the constant; shorter in tests). serve's
	// goroutine only.
	noResponders, missedBeats, checkErrs pipeline.Every
	lastRecheck                          time.Time
	recheckGap                           time.Duration
	// retryLog bounds Run's retry lines (quietEvery), made anew when the
	// line's level or step (retryLine) changes, so that the new line goes
	// out at once; retryHeld counts the lines held back since the last
	// one out, across such changes. retrySince is when this run of
	// retries began (zero: none), retries how many it made, retryTold
	// whether one of its lines went out (retriesOver). Run's goroutine
	// only.
	retryLog   pipeline.Every
	retryLine  string
	retryHeld  int64
	retrySince time.Time
	retries    int
	retryTold  bool
	// acksRefused is the server's last refusal of an ack or InProgress
	// (no permission on $JS.ACK): see AcksRefused.
	acksRefused atomic.Pointer[refusal]
	// dlDenied is the server's last refusal of a dead letter (the user
	// may not publish to nats.dead_letter_subject), cleared by a dead
	// letter stored: see DeadLettersDenied. dlDeniedLog bounds its Error
	// lines (quietEvery).
	dlDenied    atomic.Pointer[refusal]
	dlDeniedLog pipeline.Every
	// dlFull is the last refusal of a dead letter for want of room (a
	// full dead-letter stream, or JetStream store: noteDeadLetterFull),
	// cleared by a dead-letter publish that gets another answer: see
	// DeadLettersDenied. dlFullLog bounds its Error lines (quietEvery).
	dlFull    atomic.Pointer[dlFullError]
	dlFullLog pipeline.Every
	// dlPublishing holds the cancel functions of the dead-letter
	// publishes under way (publishOnce), which noteDeadLetterDenial
	// cancels with the refusal.
	dlPublishing publishSet
	// pullsRefused is set while the server refuses the pulls themselves
	// (no permission to publish to the pull subject: notePullRefusal), for
	// NotConsuming. Unlike stuck, which a look at the consumer or a session
	// that lasts clears, only a pull shown to get through clears it: a
	// message (push), or heartbeats that keep coming (provePulls).
	pullsRefused atomic.Pointer[pullRefusal]
	// schedulesReserved: the server nats.go is connected to reserves the
	// Nats-Schedule header (2.12 or later: noteServerVersion), so push
	// takes a message with one for a schedule, not an event.
	schedulesReserved atomic.Bool

	// recheckRefused is refusedRecheck as New found it.
	recheckRefused time.Duration

	// stuck is set while Run retries a step before it can pull (the
	// stream or consumer cannot be made or looked at, the subscription is
	// refused), since the first failure; cleared once it subscribes.
	// stuckAfter is how long that lasts before NotConsuming says so.
	stuck      atomic.Pointer[stuckState]
	stuckAfter time.Duration
	// lookTimeout bounds serve's look at the consumer after its pulls
	// went unanswered (5 s); streamLookTimeout a look at the stream
	// (streamInfo: 5 s). Shorter in tests.
	lookTimeout, streamLookTimeout time.Duration

	// acks follows the acks and terms sent, for the confirmations of Run
	// and Close.
	acks ackLedger
	// confirmWait is how long the end of Run waits for the ack confirmer
	// while hard has not ended: abortBudget (longer in tests, so that a
	// wait of it stands out from hardConfirmWait's).
	confirmWait time.Duration
	// closeOnce and closeErr make Close idempotent.
	closeOnce sync.Once
	closeErr  error

	// destinations: see Destinations; set by the first ensureStream.
	destinations []string

	// traceMsg starts an event's span (telemetry.Tracing.StartMessage);
	// nil when tracing is off. Set before Run.
	traceMsg func(ev pipeline.Event) trace.Span
	// pullGate is closed when Run may pull (SetPullGate); nil: at once.
	pullGate <-chan struct{}
	// pullPause says whether Run is to pull nothing now (SetPullPause);
	// nil: never paused. pauseNoted: the pause that holds now, since
	// pausedAt, has been logged (Run's goroutine only).
	pullPause  func() (paused bool, changed <-chan struct{})
	pauseNoted bool
	pausedAt   time.Time
}

// SetPullGate makes Run wait for gate to be closed before its first pull:
// its start-up checks (the stream, the stored sequence) run meanwhile.
// The processor passes the sink's Warmed, so that nothing is taken in
// before it can be stored. Call it before Run, not concurrently with it.
func (c *Consumer) SetPullGate(gate <-chan struct{}) { c.pullGate = gate }

// SetPullPause makes Run pull nothing while f reports paused: the
// session that pulls then ends as at a shutdown's drain (what the pull
// client holds is pushed on; what the server has not sent, it delivers to
// another subscriber), no pull is sent, and Run waits for changed (closed
// at the next switch; f is asked again then) before it looks at the stream
// and pulls again, as after a resubscribe but counting none. Neither the
// silence meanwhile nor the pause itself is a fault: no missed heartbeat,
// no resubscribe, nothing for NotConsuming. The processor passes the
// sink's Away, so that an instance that cannot reach PostgreSQL, and has
// given back the events it held, takes none from the others sharing the
// consumer. f is called from Run's goroutine only and must not block;
// nil: never paused. Call it before Run, not concurrently with it.
func (c *Consumer) SetPullPause(f func() (paused bool, changed <-chan struct{})) { c.pullPause = f }

// SetTracer makes Run call start for each event it receives, before the
// event is pushed, and store the span it returns (nil: not sampled) in
// ev.Span; telemetry's Tracing.StartMessage is such a function. The event
// goes by value so that push keeps it on the stack (no allocation). nil
// turns it off. Call it before Run, not concurrently with it.
func (c *Consumer) SetTracer(start func(ev pipeline.Event) trace.Span) { c.traceMsg = start }

// Epochs returns the epochs the consumer stamps on its events (Event.Epoch).
// Whoever acks them (the sink) must skip an event whose epoch is not the
// one Hold returns: its stream was replaced since, and the ack would land
// on another event. DeadLetter does the same for its terms.
func (c *Consumer) Epochs() *pipeline.Epochs { return &c.epochs }

type consumerHandle struct{ jetstream.Consumer }

type counters struct {
	received          atomic.Uint64
	redelivered       atomic.Uint64
	deadLettered      atomic.Uint64
	deadLetterFailed  atomic.Uint64
	maxDelivered      atomic.Uint64
	resubscribes      atomic.Uint64
	heartbeatsMissing atomic.Uint64
	epochs            atomic.Uint64
	staleTerms        atomic.Uint64
	termErrors        atomic.Uint64
	acksUnconfirmed   atomic.Uint64
	acksResent        atomic.Uint64
	acksMaybeLost     atomic.Uint64
	acksSettled       atomic.Uint64
	acksRefused       atomic.Uint64
	markers           atomic.Uint64
	schedules         atomic.Uint64
	deletedUnread     atomic.Uint64
}

// InFlightBytes is what the messages in flight hold of the in-flight byte
// budget (Config.MaxInFlightBytes), and the budget's size while it bounds
// the pulls (0 while nats.go pulls: a websocket URL, or wire given up).
// Only the wire pull client's messages count.
func (c *Consumer) InFlightBytes() (held, limit int64) {
	b := c.budget.Load()
	if b == nil {
		return 0, 0
	}
	if c.bounded.Load() {
		limit = b.Limit()
	}
	return b.Held(), limit
}

// Stats are the consumer's counters since New.
type Stats struct {
	Received          uint64 // messages pushed into the dispatch
	Redelivered       uint64 // of which delivered more than once
	DeadLettered      uint64 // dead letters stored for the workers and the sink (not MaxDelivered's); a repeat counts again
	DeadLetterFailed  uint64 // dead letters whose publish failed (original nak'ed; or, its stream re-created, published again until stored or the hard stop), once each
	MaxDelivered      uint64 // events dead-lettered as max_deliver (pipeline.StageDeliver): past nats.max_deliver, with no earlier failed letter's cause (pipeline.Causes)
	Resubscribes      uint64 // pull subscriptions started again after one ended by itself or for a consumer or stream gone, replaced or changed, or the stream unreadable after a reconnect (not a lost connection alone)
	HeartbeatsMissing uint64 // pull heartbeats missed (server gone or slow); the consumer is then looked up, at most every recheckGap
	Epochs            uint64 // new epochs: the stream or consumer was replaced under events in flight
	StaleTerms        uint64 // dead letters stored whose original was not terminated: its stream was replaced
	// TermErrors counts dead letters stored whose original's term failed
	// in the client (nats.go's reconnect buffer full, the connection
	// closed): never sent, so not among AcksUnconfirmed. The event comes
	// back after nats.ack_wait and is dead-lettered again (stored once
	// within the dead-letter stream's duplicate window, twice after it).
	TermErrors uint64
	// AcksUnconfirmed counts acks and terms (AckAll, DeadLetter) that may
	// not have reached the server: sent on a connection lost before a flush
	// confirmed them, or left unconfirmed by Close. Their events are
	// delivered again after nats.ack_wait (a duplicate row in at-least-once
	// mode) if they did not.
	AcksUnconfirmed uint64
	// AcksResent counts acks sent again after a consumer leader change
	// (a pull's 409 Leadership Change, or the leader elected advisory): the
	// old leader may have dropped them, and the new one may never have had
	// them. An ack of a message already acked is a no-op.
	AcksResent uint64
	// AcksMaybeLostAtLeaderChange counts acks sent in the recentAckWindow
	// (2 s) before a consumer leader change that were not sent again:
	// more than the recentAckCap (4,096) kept, or, with no delivery for
	// a resend within nats.ack_wait of the change, all of them. The server read
	// them, and the new leader has all but those of the change's last
	// moments: an upper bound of what comes back after nats.ack_wait, not
	// acks that failed (AcksUnconfirmed).
	AcksMaybeLostAtLeaderChange uint64
	// AcksSettled is AcksUnconfirmed as it was when Close showed them
	// settled after all (0 when it could not): its final confirmation went
	// through, and the durable's ack floor was then at or past the highest
	// stream sequence delivered to this instance when any of them was put
	// in doubt, so every message they may have been for was acked or
	// terminated (by this instance or another) and none comes back for
	// them. Not tried after a stream or consumer was replaced (Epochs).
	AcksSettled uint64
	// AcksRefused counts the publishes to $JS.ACK subjects the server
	// refused (the user may not publish there; see AcksRefused): acks,
	// terms, naks and InProgress alike, the server's error names only the
	// subject. Their events are delivered again after nats.ack_wait. The
	// wire client's refusals reach it through a bounded queue, and some
	// may not be counted in a burst.
	AcksRefused uint64
	// Markers counts the messages JetStream wrote itself (subject delete
	// markers: Nats-Marker-Reason and Nats-Rollup: sub, an empty body)
	// that were acked and not handed on: they are no events.
	Markers uint64
	// Schedules counts the message schedules (a Nats-Schedule header, on a
	// stream with allow_msg_schedules, from a server of 2.12 or later:
	// before, the header means nothing) that were acked and not handed on:
	// each is a publisher's order to the server, which stores the event
	// on the schedule's target subject when it fires (handed on as any
	// event).
	Schedules uint64
	// DeletedUnread counts the events the stream removed before the
	// durable delivered them: its limits (max_age, max_msgs, max_bytes,
	// discard old; max_msgs_per_subject, a message TTL) or a purge or
	// delete dropped them while they waited, unread (noteDeletedUnread,
	// noteSkipped). Not under a filter, nor from gaps in what the stream
	// held at the start; each instance counts what it sees.
	DeletedUnread uint64
}

// Lag is the durable consumer's backlog as the server reports it.
type Lag struct {
	NumPending     uint64 // messages in the stream not yet delivered
	NumAckPending  int    // delivered and not yet acked
	NumRedelivered int    // delivered more than once and not yet acked
	NumWaiting     int    // open pull requests
	AckFloor       uint64 // stream sequence below which everything is acked
}

// New validates cfg, connects to NATS, creates or binds the stream and
// creates or updates the durable pull consumer, whose MaxDeliver is
// unlimited: Run marks a delivery past nats.max_deliver
// (pipeline.Event.Exhausted) for the worker to dead-letter (Jetsink-Stage
// "deliver", Jetsink-Code "max_deliver"), and the server delivers the event
// again until that dead letter is stored.
//
// The connection reconnects forever with capped exponential backoff; it logs
// disconnects and reconnects on log. With cfg.CreateStream the stream is
// created with file storage, or its subjects updated. Otherwise a missing
// stream fails with an error wrapping ErrStreamNotFound. Errors from Validate
// wrap ErrInvalidConfig; so does a dead-letter subject the bound stream
// itself captures, or a nats.pull_max_bytes below the server's max_payload;
// so does, in at-least-once mode (no StoredSeq), a durable to be made from
// the start of the stream beside another that a jetsink writing to
// Destination used (a renamed nats.consumer: lookForSiblings).
// ctx bounds the setup only.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "consumer", "stream", cfg.Stream, "consumer", cfg.Consumer)
	c := &Consumer{cfg: cfg, log: log, base: time.Now(), closed: make(chan struct{}), reconnected: make(chan struct{}, 1),
		recheckRefused: refusedRecheck, floorEvery: floorEvery, filterKeep: defaultFilterKeep, stuckAfter: stuckAfter, lookTimeout: 5 * time.Second,
		streamLookTimeout: 5 * time.Second, recheckGap: recheckGap, confirmWait: abortBudget}
	c.outage.after = outageAfter

	opts, err := c.natsOptions()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		// nats.go's errors do not quote credentials.
		return nil, cfg.ConnectError(err)
	}
	c.nc = nc
	c.noteServerVersion(nc)
	if p, ok := clearTextProblem(nc, &c.cfg); ok {
		log.Warn(p.Message, "fix", p.Fix)
	}
	// A request the server refuses the user waits out its timeout and
	// names no permission: New names the subject to allow.
	before := nc.LastError()
	sctx, stop := watchAPIDenial(ctx, nc, &c.cfg, before)
	err = c.setup(sctx)
	stop()
	if err != nil {
		_ = c.Close(ctx)
		return nil, apiDenialError(nc, &c.cfg, before, err)
	}
	var budget int64
	if b := c.budget.Load(); b != nil {
		budget = b.Limit()
	}
	log.Info("nats consumer ready", "url", connectedURL(nc), "max_ack_pending", cfg.maxAckPending(), "max_in_flight_bytes", budget)
	return c, nil
}

// The consumer's connection pings the server every pingInterval and gives
// itself up as stale (then reconnects) when more than maxPingsOut pings in
// a row went unanswered: a server gone silent without closing the
// connection (a dead host, a firewall that dropped its state) is noticed
// 40-60 s after it went silent, rather than after 4-6 minutes at nats.go's
// defaults (2 minutes, 2 pings). Meanwhile its acks cannot reach the
// server; the events they were for are delivered again after ack_wait.
const (
	pingInterval = 20 * time.Second
	maxPingsOut  = 2
)

func (c *Consumer) natsOptions() ([]nats.Option, error) {
	cfg := &c.cfg
	opts := []nats.Option{
		nats.Name("jetsink"),
		// Every subject this connection publishes to is an ack reply the
		// server sent, a JetStream API subject nats.go builds from names
		// Validate checked, or nats.dead_letter_subject, which Validate
		// checked too: the four scans nats.go makes of each subject were 3%
		// of jetsink's CPU in a drain, all on acks (BENCHMARKS.md, session 23).
		nats.SkipSubjectValidation(),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnectDelay),
		nats.DrainTimeout(closeWait),
		// A write that the server does not read within this fails the
		// connection (nats.go's default, a minute, held a stopping jetsink
		// that long behind a hung server: the write holds the lock that
		// flushes and Close take).
		nats.FlusherTimeout(writeTimeout),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if cfg.beforeDisconnect != nil {
				cfg.beforeDisconnect()
			}
			c.seq.gen.Add(1) // see the reconnect handler
			if wc := c.wc.Load(); wc != nil {
				// Pull only while the API (and the acks of a closed wire
				// connection's messages) can get through: the wire session
				// hands on what it holds and ends; Run pulls again once
				// nats.go is back (and has sent the acks it buffered, which
				// must not reach a stream's events pulled meanwhile: see
				// pipeline.Epochs). The acks the wire connection buffered
				// are sent first: it may be healthy.
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), abortFlush)
					defer cancel()
					_ = wc.Flush(ctx)
					wc.Abort()
				}()
			}
			if err == nil && (nc.IsClosed() || nc.IsDraining()) {
				return // our own Close
			}
			// What this connection had written and the server had not
			// read is gone with it; what comes now waits for the reconnect.
			c.acks.lost()
			c.acks.disconnects.Add(1)
			c.log.Warn("nats disconnected", "err", err)
			c.outage.down(c.log)
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { c.outage.failed(err) }),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			// nats.go calls this after the disconnect handler: the loss is
			// told (see confirm).
			c.acks.reconnectsSeen.Store(nc.Stats().Reconnects)
			c.acks.reconnects.Add(1)
			c.noteServerVersion(nc) // perhaps another server's
			// A wire pull client given up (wireConn) gets another chance:
			// what kept it away (a server in lame duck mode that closed
			// its listener first, a certificate) may be gone with the
			// server nats.go left.
			c.wireDialFails.Store(0)
			c.wireGaveUp.Store(false)
			away, attempts := c.outage.up()
			c.log.Info("nats reconnected", "url", connectedURL(nc), "away_for", away.Round(time.Millisecond), "reconnect_attempts", attempts)
			// While the connection was down the stream may have been
			// re-created, and nats.go's pulls go on with whatever stream
			// answers: push (exactly-once) or serve (at-least-once) has
			// Run check it again.
			c.lookAgain()
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			c.outage.stop() // before Close returns: nothing is logged after it
			close(c.closed)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if c.noteLeaderWatchDenial(err) {
				return
			}
			c.noteAckRefusal(err)
			c.notePullRefusal(err) // nats.go's pulls
			c.noteDeadLetterDenial(err)
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			c.asyncErrs.Log(context.Background(), c.log, slog.LevelError, asyncErrEvery, "nats async error", "subscription", subject, "err", err)
		}),
	}
	opts = append(opts, nats.PingInterval(cmp.Or(cfg.pingEvery, pingInterval)), nats.MaxPingsOutstanding(maxPingsOut))
	if cfg.dialer != nil {
		opts = append(opts, nats.SetCustomDialer(cfg.dialer))
	}
	auth, err := cfg.AuthOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	return opts, nil
}

// AuthOptions are the nats.go options for the nats: section's credentials
// and TLS files, for every client jetsink opens (the consumer, check, dlq).
// Errors wrap ErrInvalidConfig and never quote a secret.
func (c *Config) AuthOptions() ([]nats.Option, error) {
	var opts []nats.Option
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.CredsFile != "" {
		if err := checkCredsFile(c.CredsFile); err != nil {
			return nil, err
		}
		// Read again at each connect: a file rotated in place is used.
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(c.NKeyFile)
		if err != nil {
			// The error may quote the file; say only which key failed.
			return nil, fmt.Errorf("%w: nats.nkey_file %q is not a readable NKey seed file", ErrInvalidConfig, c.NKeyFile)
		}
		opts = append(opts, o)
	}
	if _, err := c.tlsFiles(); err != nil {
		return nil, err
	}
	// Read again at each connect: files rotated in place are used.
	if c.TLS.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.TLS.CAFile))
	}
	if c.TLS.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.TLS.CertFile, c.TLS.KeyFile))
	}
	return opts, nil
}

// tlsFiles reads nats.tls's files into a TLS configuration, nil without
// them. A file that cannot be read or used is a bad configuration
// (ErrInvalidConfig: exit 2): nats.go would read it only while it
// connects, and its error there read as a server that cannot be reached.
// The error never quotes a key.
func (c *Config) tlsFiles() (*tls.Config, error) {
	if c.TLS.CAFile == "" && c.TLS.CertFile == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLS.CAFile != "" {
		pem, err := os.ReadFile(c.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nats.tls.ca_file %q cannot be read: %w", ErrInvalidConfig, c.TLS.CAFile, errors.Unwrap(err))
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: nats.tls.ca_file %q holds no PEM certificate", ErrInvalidConfig, c.TLS.CAFile)
		}
	}
	if c.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			// The error may quote the key; say only which files.
			return nil, fmt.Errorf("%w: nats.tls.cert_file %q and key_file %q are not a readable, usable pair", ErrInvalidConfig, c.TLS.CertFile, c.TLS.KeyFile)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// checkCredsFile refuses a nats.creds_file that cannot be read or is not
// a user's credentials (wire.ParseCreds), as a bad configuration: nats.go
// reads it only while it connects, and its error there looked like a
// server that cannot be reached. The path is read as written, as nats.go
// reads the seed from it ("~" is not the home directory). The error never
// quotes the file.
func checkCredsFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: nats.creds_file %q cannot be read: %w", ErrInvalidConfig, path, errors.Unwrap(err))
	}
	defer clear(b)
	_, kp, err := wire.ParseCreds(b)
	if err != nil {
		return fmt.Errorf("%w: nats.creds_file %q is not a NATS user's credentials file: it %w", ErrInvalidConfig, path, err)
	}
	kp.Wipe()
	return nil
}

// refusal is an error the server sent, and when.
type refusal struct {
	at  time.Time
	err error
}

// noteAckRefusal keeps err if it is the server refusing an ack or
// InProgress: a permission violation on a $JS.ACK subject (an -ERR on the
// connection that sent it; the server drops the ack). The first of a run
// is logged at Error, saying what it costs.
func (c *Consumer) noteAckRefusal(err error) {
	if err == nil {
		return
	}
	t := strings.ToLower(err.Error())
	if !strings.Contains(t, "permissions violation") || !strings.Contains(t, `"$js.ack.`) {
		return
	}
	c.stats.acksRefused.Add(1)
	if prev := c.acksRefused.Swap(&refusal{at: time.Now(), err: err}); prev == nil || time.Since(prev.at) > acksRefusedFor {
		c.log.Error("the server refuses jetsink's acks: every event is written, then delivered again after ack_wait, "+
			"and written again (at-least-once mode); give the user permission to publish to $JS.ACK.<stream>.> "+
			"(and $JS.ACK.*.*.<stream>.>, the form a server with a domain or newer ack subjects uses) "+
			"(the readiness check fails meanwhile)", "err", err)
	}
}

// noteDeadLetterDenial keeps err if it is the server refusing a dead
// letter: a permissions violation for a publish to
// nats.dead_letter_subject. The server drops the publish and says so on
// the connection (nats.go's async error), not to the publish, which
// would only time out: so the dead-letter publishes under way now end at
// once with an error that wraps err and names the permission
// (publishOnce); those begun after are not touched. Logged at Error at
// most once every quietEvery (with the number held back): a run of
// poison events is refused at every probe. Safe from any goroutine.
func (c *Consumer) noteDeadLetterDenial(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	// nats.go's text: `nats: permissions violation: Permissions Violation
	// for Publish to "<subject>"`; the subject is the one sent, no prefix.
	t := err.Error()
	if !strings.Contains(strings.ToLower(t), "for publish to") || !strings.Contains(t, `"`+c.cfg.DeadLetterSubject+`"`) {
		return
	}
	c.dlDenied.Store(&refusal{at: time.Now(), err: err})
	c.dlPublishing.cancelAll(err)
	c.dlDeniedLog.Log(context.Background(), c.log, slog.LevelError, quietEvery,
		"the NATS user may not publish to "+c.cfg.DeadLetterSubject+": give it permission; until then no dead letter is stored, "+
			"and the events to dead-letter are nak'ed and delivered again, none lost (the readiness check fails meanwhile)",
		"dead_letter_subject", c.cfg.DeadLetterSubject, "err", err)
}

// dlDeniedFor is how long after the server last refused a dead letter
// DeadLettersDenied still reports it, unless a dead letter is stored
// first: an event whose dead letter failed comes back within dlNakMax,
// and is refused again while the permission is missing.
const dlDeniedFor = 2 * dlNakMax

// DeadLettersDenied returns the server's refusal of a dead letter seen in
// the last dlDeniedFor and not followed by a dead letter stored, or nil:
// the user may not publish to nats.dead_letter_subject (the error wraps
// nats.ErrPermissionViolation), or the dead-letter stream, or the
// JetStream store under it, is full (the error wraps the server's
// *jetstream.APIError, names the limit and says what to do:
// noteDeadLetterFull). A full one is forgotten, too, once a dead-letter
// publish's answer shows room (showsRoom: a letter stored, or another
// refusal of the stream's); a publish that gets no answer leaves it. Safe
// from any goroutine; the readiness check reports it.
func (c *Consumer) DeadLettersDenied() error {
	if r := c.dlDenied.Load(); r != nil && time.Since(r.at) <= dlDeniedFor {
		return fmt.Errorf("the NATS user may not publish to %s, so no dead letter is stored (%v ago): give it permission: %w",
			c.cfg.DeadLetterSubject, time.Since(r.at).Round(time.Second), r.err)
	}
	if f := c.dlFullNoted(); f != nil {
		return fmt.Errorf("%s, so no dead letter is stored (the last refused %v ago): %s: %w", f.what, time.Since(f.at).Round(time.Second), f.fix, f.err)
	}
	return nil
}

// pullRefusal is the server refusing the pulls: since the first refusal
// of a run, at the last, err saying so.
type pullRefusal struct {
	since, at time.Time
	err       error
}

// pullSubject is the subject the pulls are published to, the one a user
// must be allowed to publish to.
func (c *Consumer) pullSubject() string {
	return c.cfg.APIPrefix() + ".CONSUMER.MSG.NEXT." + c.cfg.Stream + "." + c.cfg.Consumer
}

// notePullRefusal notes err if it is the server refusing a pull: a
// permission violation for a publish to pullSubject (an -ERR on the
// connection that pulled: nats.go's async error, or the wire Sub's error;
// the server drops the pull, and nothing answers it). Nothing is consumed
// meanwhile, although the stream and the consumer answer every look:
// NotConsuming reports it after stuckAfter, until provePulls or push
// clears it. The first of a run is logged at Error, naming the subject to
// allow. Safe from any goroutine.
func (c *Consumer) notePullRefusal(err error) {
	if err == nil {
		return
	}
	subject := c.pullSubject()
	t := err.Error()
	// On the servers of nats.domain themselves, the server maps
	// $JS.<domain>.API to $JS.API before it checks the permission, and
	// names the subject it checked.
	local := "$JS.API.CONSUMER.MSG.NEXT." + c.cfg.Stream + "." + c.cfg.Consumer
	if !strings.Contains(strings.ToLower(t), "permissions violation") ||
		!strings.Contains(t, `"`+subject+`"`) && (c.cfg.Domain == "" || !strings.Contains(t, `"`+local+`"`)) {
		return
	}
	subject = apiSubjects(c.cfg, "CONSUMER.MSG.NEXT."+c.cfg.Stream+"."+c.cfg.Consumer)
	now := time.Now()
	why := fmt.Errorf("the server refuses the pulls: give the user permission to publish to %s: %w", subject, err)
	for {
		prev := c.pullsRefused.Load()
		r := &pullRefusal{since: now, at: now, err: why}
		if prev != nil {
			r.since = prev.since
		}
		if !c.pullsRefused.CompareAndSwap(prev, r) {
			continue
		}
		if prev == nil {
			c.log.Error("the server refuses jetsink's pulls: nothing is consumed; give the user permission to publish to "+subject+
				" (the readiness check fails after "+c.stuckAfter.String()+")", "err", err)
		}
		return
	}
}

// acksRefusedFor is how long after the server last refused an ack
// AcksRefused still reports it: acks go out with every commit, so a
// refusal that stops for this long has been fixed.
const acksRefusedFor = 30 * time.Second

// AcksRefused returns the server's refusal of an ack or InProgress seen in
// the last acksRefusedFor (the user may not publish to $JS.ACK), or nil.
// Safe from any goroutine; the readiness check reports it.
func (c *Consumer) AcksRefused() error {
	r := c.acksRefused.Load()
	if r == nil || time.Since(r.at) > acksRefusedFor {
		return nil
	}
	return fmt.Errorf("the server refuses jetsink's acks (%v ago): %w", time.Since(r.at).Round(time.Second), r.err)
}

// asyncErrEvery is how often, at most, an error the server sends on a
// connection (nats.go's async errors, the wire pull connection's -ERR) is
// logged, with the number held back: a permission the user lacks for acks
// is refused at every ack and InProgress, thousands a second.
const asyncErrEvery = time.Second

// quietEvery is how often, at most, a warning that repeats for as long as
// JetStream does not answer is logged, with the number held back.
const quietEvery = time.Minute

// recheckGap is how long after a look at the consumer a pull that no
// server answered asks for no other: pulls go out once a heartbeat tick,
// and those refused while a look ran (up to 5 s) come in a burst.
const recheckGap = 5 * time.Second

// outageAfter is how long the NATS connection stays lost before natsOutage
// logs an Error: as long as NotConsuming waits (stuckAfter), and as
// PostgreSQL's default release_after. Not ack_wait: the server redelivers
// nothing to a jetsink it cannot reach, and a reconnect in a rolling
// upgrade of the servers takes seconds. The Error comes again after
// outageRepeatMin, doubling up to outageRepeatMax, while it lasts.
const (
	outageAfter     = stuckAfter
	outageRepeatMin = time.Minute
	outageRepeatMax = 16 * time.Minute
)

// natsOutage watches a lost NATS connection. nats.go reconnects for ever
// (MaxReconnects(-1)) and tells only the loss (Warn) and the reconnect:
// an outage of ten minutes logged one Warn, and an alert on Error, which
// sees PostgreSQL's outages, missed it. Both pull clients stop with
// nats.go's connection (the wire client pulls only while it is up: see
// natsOptions), so one watch covers both. The Error comes once the
// connection has been lost for after in all within one outage: a loss
// that comes back for moments and is lost again (a crash-looping server, a
// flapping link) goes on with the outage while the connection has been
// lost in it longer than up (a review's flapping server, down 94% of the
// time in drops under 30 s, logged no Error), and starts a new one
// otherwise (a blip, then a restart 20 s later, is not 30 s lost; drops of
// 50 ms every 20 s are no outage). An outage ends once the connection has
// stayed up for after. Its methods run on nats.go's callback goroutine,
// tell on a timer's; mu guards all.
type natsOutage struct {
	mu        sync.Mutex
	after     time.Duration // the first Error once lost this long (tests shorten it); 0: no watch (Check's connection, which does not reconnect)
	since     time.Time     // when the outage began; zero while there is none
	lost      bool          // the connection is lost now
	lostAt    time.Time     // when it was lost last
	upAt      time.Time     // when it came back last
	lostTotal time.Duration // lost in the outage, before the loss under way
	upTotal   time.Duration // up in the outage, between its losses
	gen       uint64        // the outage's number: a timer of an earlier one does nothing
	timer     *time.Timer   // the next look (tell)
	next      time.Duration // the wait after the next Error
	told      bool          // the outage's first Error is logged
	attempts  int           // reconnect attempts failed in the outage
	dropped   int           // attempts failed since the last loss
	brief     int           // times the connection came back in the outage
	lastErr   error         // the last attempt's error
	stopped   bool          // the connection is closed: nothing more to say
}

// down notes a connection lost now: it goes on with the outage under way
// if the connection has been lost in it longer than up, and came back less
// than after ago; else it starts one.
func (o *natsOutage) down(log *slog.Logger) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stopped || o.after <= 0 || o.lost {
		return
	}
	now := time.Now()
	o.lost, o.lostAt, o.dropped = true, now, 0
	if !o.since.IsZero() {
		if up := now.Sub(o.upAt); up < o.after && o.lostTotal >= o.upTotal+up {
			o.upTotal += up
			o.brief++
			return
		}
	}
	if o.timer != nil {
		o.timer.Stop()
	}
	o.gen++
	gen := o.gen
	o.since, o.lostTotal, o.upTotal, o.told = now, 0, 0, false
	o.attempts, o.brief, o.lastErr, o.next = 0, 0, nil, outageRepeatMin
	o.timer = time.AfterFunc(o.after, func() { o.tell(log, gen) })
}

// failed counts a reconnect attempt that failed with err.
func (o *natsOutage) failed(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.lost {
		o.attempts++
		o.dropped++
		o.lastErr = err
	}
}

// up notes the connection back. It returns how long it was lost this
// time and the reconnect attempts that failed meanwhile; the outage ends
// once it stays up for after (tell).
func (o *natsOutage) up() (away time.Duration, attempts int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.lost {
		return 0, 0
	}
	o.lost, o.upAt = false, time.Now()
	away = o.upAt.Sub(o.lostAt)
	o.lostTotal += away
	return away, o.dropped
}

// stop ends the watch for good (the connection is closed): once it
// returns, tell logs nothing.
func (o *natsOutage) stop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stopped = true
	if o.timer != nil {
		o.timer.Stop()
	}
}

// tell logs that the connection is lost, once lost for after in the
// outage, and sets the next look; with the connection up for after, the
// outage is over.
func (o *natsOutage) tell(log *slog.Logger, gen uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stopped || gen != o.gen || o.since.IsZero() {
		return // stop, or a later outage, came first
	}
	again := func(d time.Duration) { o.timer = time.AfterFunc(d, func() { o.tell(log, gen) }) }
	if !o.lost {
		if up := time.Since(o.upAt); up < o.after {
			again(o.after - up)
			return
		}
		o.since, o.timer = time.Time{}, nil
		return
	}
	lostFor := o.lostTotal + time.Since(o.lostAt)
	if !o.told && lostFor < o.after {
		again(o.after - lostFor)
		return
	}
	o.told = true
	lastErr := "none yet"
	if o.lastErr != nil {
		lastErr = o.lastErr.Error()
	}
	log.Error("NATS unreachable: nothing is consumed or acked, the events wait in JetStream; jetsink keeps reconnecting",
		"unreachable_for", lostFor.Round(time.Millisecond), "outage_for", time.Since(o.since).Round(time.Millisecond),
		"reconnect_attempts", o.attempts, "brief_reconnects", o.brief,
		"last_err", lastErr, "next_report_in", o.next, "fix", "check that the NATS servers of nats.url are up and reachable from this host")
	again(o.next)
	o.next = min(2*o.next, outageRepeatMax)
}

// reconnectDelay is 100ms doubling per attempt up to 5s, with 20% jitter.
func reconnectDelay(attempts int) time.Duration {
	d := 5 * time.Second
	if attempts < 6 {
		d = 100 * time.Millisecond << attempts
	}
	return d + rand.N(d/5+1)
}

func (c *Consumer) setup(ctx context.Context) error {
	cfg := &c.cfg
	if p, ok := pullMaxBytesProblem(cfg.PullMaxBytes, c.nc.MaxPayload()); ok {
		if !p.Warning {
			return fmt.Errorf("%w: %s", ErrInvalidConfig, p)
		}
		c.log.Warn(p.String())
	}
	if cfg.PullClient == PullClientNATSGo {
		if cfg.MaxInFlightBytes > 0 {
			c.log.Warn("nats.max_in_flight_bytes applies to the wire pull client only; with nats.pull_client nats.go, bound memory with nats.max_ack_pending and nats.pull_max_bytes")
		}
	} else if budget := cfg.inFlightBudget(c.nc.MaxPayload()); budget > 0 {
		if p, ok := inFlightProblem(budget, c.nc.MaxPayload()); ok {
			return fmt.Errorf("%w: %s", ErrInvalidConfig, p)
		}
		c.budget.Store(wire.NewBudget(budget))
	}
	js, err := cfg.JetStream(c.nc)
	if err != nil {
		return err
	}
	c.js = js
	if err := c.ensureStream(ctx); err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("%w (%s)", err, noJetStreamHint(cfg.Domain))
		}
		return err
	}
	if err := c.ensureDeadLetterStream(ctx); err != nil {
		return err
	}
	c.starting = true // lookForSiblings refuses, at New only
	defer func() { c.starting = false }()
	return c.ensureConsumer(ctx, nil)
}

// ensureStream creates or updates the stream (CreateStream) or checks that
// it exists, and refuses a stream that captures the dead-letter subject,
// or sources or mirrors the stream that does (ErrInvalidConfig).
func (c *Consumer) ensureStream(ctx context.Context) error {
	cfg := &c.cfg
	var stream jetstream.Stream
	var err error
	if cfg.CreateStream {
		stream, err = c.createStream(ctx)
		if err != nil {
			return fmt.Errorf("create or update stream %s: %w", cfg.Stream, err)
		}
	} else {
		stream, err = c.js.Stream(ctx, cfg.Stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("%w: %w: nats.stream %s does not exist; create it or set nats.create_stream: true",
				ErrStreamNotFound, err, cfg.Stream)
		}
		if err != nil {
			return fmt.Errorf("look up stream %s: %w", cfg.Stream, err)
		}
	}
	sc := &stream.CachedInfo().Config
	c.streamReplicas.Store(int64(sc.Replicas))
	c.streamStorage.Store(int64(sc.Storage))
	subjects := sc.Subjects
	p, interest := interestProblem(sc, cfg)
	// Said once a stream, at the start: Run calls this again at each
	// re-creation, of the same stream or of one that replaced it.
	created := stream.CachedInfo().Created
	if !sameTime(c.streamNoted.Swap(&created), created) {
		if p, ok := replicaProblem(clusterOf(c.nc, cfg), sc); ok && p.Warning {
			c.log.Warn(p.Message, "fix", p.Fix)
		}
		for _, p := range publisherDeletions(sc) {
			c.log.Warn(p.Message, "fix", p.Fix)
		}
		if interest {
			c.log.Warn(p.Message, "fix", p.Fix)
		}
	}
	c.interest.Store(interest)
	c.workQueue.Store(sc.Retention == jetstream.WorkQueuePolicy)
	c.noteInactiveLimit(sc.ConsumerLimits.InactiveThreshold)
	if p, ok := inactiveLimitProblem(sc); ok && !sameTime(c.inactiveLimitNoted.Swap(&created), created) {
		c.log.Warn(p.Message, "fix", p.Fix)
	}
	if p, ok := filterProblem(cfg, sc); ok {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, p)
	}
	if c.destinations == nil {
		c.destinations = []string{cfg.FilterSubject}
		if cfg.FilterSubject == "" {
			c.destinations = append([]string{}, subjects...) // not nil: set once
		}
	}
	if err := checkNoLoop(cfg.Stream, subjects, cfg.DeadLetterSubject); err != nil {
		return err
	}
	return c.checkNoSourceLoop(ctx, sc)
}

// sameTime reports whether noted is t (false when nil).
func sameTime(noted *time.Time, t time.Time) bool {
	return noted != nil && noted.Equal(t)
}

// checkNoSourceLoop refuses event stream sc when it mirrors or sources the
// stream that captures the dead-letter subject (checkNoSourceLoop, the
// function): <stream>_DLQ when none does yet and create_stream will make
// it. A stream that neither mirrors nor sources costs no look-up; a
// failed look-up is left to ensureDeadLetterStream, which logs it.
func (c *Consumer) checkNoSourceLoop(ctx context.Context, sc *jetstream.StreamConfig) error {
	if sc.Mirror == nil && len(sc.Sources) == 0 {
		return nil
	}
	cfg := &c.cfg
	name, err := c.js.StreamNameBySubject(ctx, cfg.DeadLetterSubject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && cfg.CreateStream:
		name = c.deadLetterStreamConfig(ctx).Name
	case err != nil:
		return nil
	}
	return checkNoSourceLoop(sc, name, cfg.DeadLetterSubject, cfg.FilterSubject)
}

// Destinations are the subject patterns the consumer takes messages from,
// as New found them: nats.filter_subject, or else the stream's subjects
// (none for a stream that only sources others). Tracing names message
// spans after them (telemetry.Tracing.SetDestinations).
func (c *Consumer) Destinations() []string { return slices.Clone(c.destinations) }

// errDeadLetterStream marks ensureDeadLetterStream's errors: when Run
// re-creates the stream and consumer, only this step failing lets it
// consume on.
var errDeadLetterStream = errors.New("dead-letter stream")

// ensureDeadLetterStream looks up the stream that captures the dead-letter
// subject and logs at Warn what deadLetterStreamProblems finds in its
// settings. When there is none it creates <stream>_DLQ with
// create_stream (deadLetterStreamConfig), so that a fresh deployment can
// park poison events from the start; without create_stream jetsink
// creates nothing and says so (as `jetsink check` does). Its errors wrap
// errDeadLetterStream; without create_stream a failed look-up is only
// logged.
func (c *Consumer) ensureDeadLetterStream(ctx context.Context) error {
	cfg := &c.cfg
	name, err := c.js.StreamNameBySubject(ctx, cfg.DeadLetterSubject)
	switch {
	case err == nil:
		c.warnDeadLetterStream(ctx, name)
		return nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		err = fmt.Errorf("%w: look up the stream of nats.dead_letter_subject %s: %w", errDeadLetterStream, cfg.DeadLetterSubject, err)
		if !cfg.CreateStream {
			c.log.Warn("could not check the dead-letter stream", withDenial(c.nc, cfg, "STREAM.NAMES", "err", err)...)
			return nil
		}
		return err
	case !cfg.CreateStream:
		c.log.Warn("no stream captures nats.dead_letter_subject: events that cannot be stored are nak'ed again and again instead of parked",
			"dead_letter_subject", cfg.DeadLetterSubject, "fix", "create one, or set nats.create_stream: true")
		return nil
	}
	sc := c.deadLetterStreamConfig(ctx)
	if _, err := CreateStream(ctx, c.js, sc); err != nil {
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// No stream captures the subject, but the name is taken: its
			// subjects were edited (or another stream has the name).
			var p Problem
			if s, serr := c.js.Stream(ctx, sc.Name); serr == nil {
				p = deadLetterNameInUse(sc.Name, cfg.DeadLetterSubject, s.CachedInfo().Config.Subjects)
			} else {
				p = deadLetterNameInUseUnread(sc.Name, cfg.DeadLetterSubject, serr)
			}
			return fmt.Errorf("%w: create %s for %s: %w: %s", errDeadLetterStream, sc.Name, cfg.DeadLetterSubject, err, p)
		}
		return fmt.Errorf("%w: create %s for %s: %w", errDeadLetterStream, sc.Name, cfg.DeadLetterSubject, err)
	}
	c.log.Info("created dead-letter stream", "dlq_stream", sc.Name, "subject", cfg.DeadLetterSubject,
		"duplicate_window", sc.Duplicates, "replicas", sc.Replicas)
	return nil
}

// deadLetterNameInUse is the Problem of a stream named name, the one
// create_stream makes for nats.dead_letter_subject subject, that exists
// and captures subjects, not subject: its subjects were edited (nats
// stream edit), so no stream captures the subject and none can be made
// under that name.
func deadLetterNameInUse(name, subject string, subjects []string) Problem {
	return Problem{Message: deadLetterNameInUseMessage(name, subject, "it captures "+cmp.Or(strings.Join(subjects, ", "), "no subjects")+": its subjects were edited?"),
		Fix: fmt.Sprintf("give %s the subject again, keeping those it has (--subjects replaces the whole list: %s), or set nats.dead_letter_subject to a subject it captures",
			name, streamEdit(name, subjectFlags(append(slices.Clip(subjects), subject))))}
}

// deadLetterNameInUseUnread is deadLetterNameInUse when the stream's
// subjects could not be read (lookErr): no command that sets them is
// printed, since one without them would remove them (natscli's --subjects
// replaces the whole list, and --force asks nothing).
func deadLetterNameInUseUnread(name, subject string, lookErr error) Problem {
	return Problem{Message: deadLetterNameInUseMessage(name, subject, "its subjects could not be read: "+lookErr.Error()),
		Fix: fmt.Sprintf("see the subjects it has (nats stream info %s), then give it the subject again, keeping them (%s: "+
			"--subjects replaces the whole list), or set nats.dead_letter_subject to a subject it captures",
			shellWord(name), streamEdit(name, "--subjects <each subject it has> --subjects "+shellWord(subject)))}
}

func deadLetterNameInUseMessage(name, subject, captures string) string {
	return fmt.Sprintf("stream %s exists but does not capture nats.dead_letter_subject %s (%s), "+
		"so no stream captures dead letters, and create_stream cannot make %s", name, subject, captures, name)
}

// subjectFlags is a --subjects flag for each of subjects, as nats stream
// edit reads them: the stream's whole list, which replaces the one it has.
func subjectFlags(subjects []string) string {
	flags := make([]string, len(subjects))
	for i, s := range subjects {
		flags[i] = "--subjects " + shellWord(s)
	}
	return strings.Join(flags, " ")
}

// deadLetterStreamConfig is the dead-letter stream jetsink creates:
// <stream>_DLQ on file, limits retention with no limit (a dead letter
// stays until someone deletes it), a duplicate window of twice
// nats.ack_wait and at least the server's default 2 minutes (so that a
// poison event that comes back after ack_wait, its term lost, is stored
// once), and the event stream's replicas (a dead letter is the only copy
// of an event terminated in the event stream).
func (c *Consumer) deadLetterStreamConfig(ctx context.Context) jetstream.StreamConfig {
	cfg := &c.cfg
	sc := jetstream.StreamConfig{
		Name:       cfg.Stream + "_DLQ",
		Subjects:   []string{cfg.DeadLetterSubject},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Discard:    jetstream.DiscardOld,
		Duplicates: max(deadLetterDuplicates(cfg.AckWait), 2*time.Minute),
	}
	if s, err := c.js.Stream(ctx, cfg.Stream); err == nil {
		sc.Replicas = s.CachedInfo().Config.Replicas
	}
	return sc
}

// warnDeadLetterStream logs the problems of stream name's settings as a
// dead-letter stream.
func (c *Consumer) warnDeadLetterStream(ctx context.Context, name string) {
	s, err := c.js.Stream(ctx, name)
	if err != nil {
		c.log.Warn("could not check the dead-letter stream", withDenial(c.nc, &c.cfg, "STREAM.INFO."+name, "dlq_stream", name, "err", err)...)
		return
	}
	var events *jetstream.StreamConfig
	if es, err := c.js.Stream(ctx, c.cfg.Stream); err == nil {
		events = &es.CachedInfo().Config
	}
	for _, p := range deadLetterStreamProblems(&s.CachedInfo().Config, events, c.cfg.AckWait, c.nc.MaxPayload()) {
		c.log.Warn(p.Message, "fix", p.Fix)
	}
}

// Close confirms that the server has read the acks and terms sent (a flush
// of each connection; one that is reconnecting is waited for, and its
// PING follows the acks buffered for the reconnect; a connection lost
// during the flush is flushed again once it is back), then closes the
// connections. It waits while ctx has time left, at most closeWait when ctx
// has no deadline; once ctx has ended (before or during the wait) it gives
// the connections abortBudget to close, without waiting for the server,
// and returns: a connection whose write a server that reads nothing holds
// closes in the background when the write times out (writeTimeout). Acks
// and terms that may not have reached the server are logged at Warn,
// counted in Stats.AcksUnconfirmed, and reported by an error wrapping
// ErrAcksUnconfirmed: their events are delivered again after ack_wait.
// Call it after Run has returned and the sink has settled its last batch
// (a Run still going returns an error). Idempotent: later calls return the
// first one's result.
func (c *Consumer) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { c.closeErr = c.close(ctx) })
	return c.closeErr
}

func (c *Consumer) close(ctx context.Context) error {
	wait, cancel := closeContext(ctx)
	defer cancel()
	type result struct {
		n   uint64
		err error
	}
	// The final confirm's result is handed over before the connections
	// close: once it has accounted for the acks, abandon counts none, and
	// a close held past abortBudget must not leave them unreported.
	confirmed := make(chan result, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := c.confirm(wait, true)
		confirmed <- result{n, err}
		if err == nil {
			c.settleDoubt(wait)
		}
		if wc := c.wc.Load(); wc != nil {
			if err == nil {
				_ = wc.Close()
			} else {
				// Close would write out its buffer, which a server that
				// does not read can hold for Options.WriteTimeout.
				wc.Abort()
			}
		}
		// Not Drain: the acks are confirmed or given up on already; Drain
		// would wait for the subscriptions and flush again, up to
		// closeWait each, on a server that may not answer, and on a
		// connection that is reconnecting it closes at once, dropping
		// what it buffered.
		c.nc.Close()
		<-c.closed
	}()
	var r result
	select {
	case <-done:
		r = <-confirmed
	case <-wait.Done():
		select {
		case <-done:
			r = <-confirmed
		case <-time.After(abortBudget):
			// A write to a server that reads nothing holds a connection's
			// lock, which its flush and Close take before they look at a
			// context, until writeTimeout: leave them to it.
			if n, ok := c.acks.abandon(); ok {
				c.stats.acksUnconfirmed.Add(n)
				r = result{n, fmt.Errorf("the connections to NATS did not close within %s of the deadline (a write to a server that reads nothing holds them)", abortBudget)}
			} else {
				// The final confirm has accounted for the acks (and
				// sends what it found at once); closing is what is held.
				r = <-confirmed
			}
		}
	}
	n, err := r.n, r.err
	if n == 0 {
		return nil
	}
	if err == nil {
		// The flush went through; a connection lost before it may have
		// taken acks with it. Logged and counted as while running (a NATS
		// restart does this), not an error: nothing is lost, and whether
		// they arrived cannot be known.
		c.log.Warn("a connection to NATS was lost shortly before shutdown: acks sent before it may not have reached the server; "+
			"their events are delivered again after ack_wait (a duplicate row in at-least-once mode)", "acks", n)
		return nil
	}
	c.log.Warn("acks not confirmed by NATS at shutdown: they may not have reached the server, and their events are "+
		"then delivered again after ack_wait (a duplicate row in at-least-once mode, none in exactly-once)", "acks", n, "err", err)
	return fmt.Errorf("%w: %d acks may not have reached the server (%w); their events are delivered again after ack_wait", ErrAcksUnconfirmed, n, err)
}

// lookAgain marks that the stream may have been replaced while a connection
// was down: push (exactly-once) verifies it before the next message, and
// serve (at-least-once) looks at it. One pending look is enough.
func (c *Consumer) lookAgain() {
	c.seq.gen.Add(1)
	select {
	case c.reconnected <- struct{}{}:
	default:
	}
}

// Ready reports whether the connection to NATS is up. (A wire pull
// connection that cannot be made is not waited on for ever: after a few
// failed dials nats.go pulls, see pullsWithWire.)
func (c *Consumer) Ready() bool { return c.nc.IsConnected() }

// Server is the URL of the server nats.go is connected to, without
// credentials; "" while it is not connected.
func (c *Consumer) Server() string { return connectedURL(c.nc) }

// Lag asks the server for the consumer's backlog. It returns the
// jetstream error when the server cannot answer (e.g.
// jetstream.ErrConsumerNotFound, context errors).
func (c *Consumer) Lag(ctx context.Context) (Lag, error) {
	info, err := c.cons.Load().Info(ctx)
	if err != nil {
		return Lag{}, fmt.Errorf("consumer info: %w", err)
	}
	return Lag{
		NumPending:     info.NumPending,
		NumAckPending:  info.NumAckPending,
		NumRedelivered: info.NumRedelivered,
		NumWaiting:     info.NumWaiting,
		AckFloor:       info.AckFloor.Stream,
	}, nil
}

// Stats returns the counters. Safe from any goroutine.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Received:                    s.received.Load(),
		Redelivered:                 s.redelivered.Load(),
		Markers:                     s.markers.Load(),
		Schedules:                   s.schedules.Load(),
		DeletedUnread:               s.deletedUnread.Load(),
		DeadLettered:                s.deadLettered.Load(),
		DeadLetterFailed:            s.deadLetterFailed.Load(),
		MaxDelivered:                s.maxDelivered.Load(),
		Resubscribes:                s.resubscribes.Load(),
		HeartbeatsMissing:           s.heartbeatsMissing.Load(),
		Epochs:                      s.epochs.Load(),
		StaleTerms:                  s.staleTerms.Load(),
		TermErrors:                  s.termErrors.Load(),
		AcksUnconfirmed:             s.acksUnconfirmed.Load(),
		AcksSettled:                 s.acksSettled.Load(),
		AcksResent:                  s.acksResent.Load(),
		AcksMaybeLostAtLeaderChange: s.acksMaybeLost.Load(),
		AcksRefused:                 s.acksRefused.Load(),
	}
}

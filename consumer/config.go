package consumer

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
)

// ErrInvalidConfig is wrapped by every error Validate returns. The message
// names the offending key (as in the YAML file, e.g. nats.ack_wait) and says
// how to fix it.
var ErrInvalidConfig = errors.New("invalid config")

// Defaults of the nats: section; see Config for what each means.
const (
	DefaultURL               = "nats://127.0.0.1:4222"
	DefaultStream            = "EVENTS"
	DefaultSubject           = "events.>"
	DefaultConsumer          = "jetsink"
	DefaultAckWait           = 30 * time.Second
	DefaultMaxDeliver        = 10
	DefaultDeadLetterSubject = "jetsink.dlq.EVENTS"
	DefaultPullMaxMessages   = 4096 // what PullMaxMessages 0 derives, at most
	DefaultPullExpiry        = 30 * time.Second
	DefaultPullHeartbeat     = 1 * time.Second
	// PullClient values.
	PullClientNATSGo = "nats.go"
	PullClientWire   = "wire"
	// DefaultMaxAckPending is what New asks for when Config.MaxAckPending is
	// 0 and the caller did not derive a value with DeriveMaxAckPending. It is
	// deliberately generous: a caller without rings and batches of its own
	// to derive from still should not be throttled, so it only has to be large enough
	// never to be the bottleneck (the server's own default, 1000, caps a
	// 5000-row batch policy at one short batch per max_delay).
	DefaultMaxAckPending = 32768
	// DefaultMaxInFlightBytes is the in-flight byte budget when
	// Config.MaxInFlightBytes is 0, unless four messages of the server's
	// max_payload need more.
	DefaultMaxInFlightBytes = 32 << 20
)

// maxNameLen is JetStream's limit on stream and consumer names.
const maxNameLen = 255

// Config is the nats: section of the jetsink configuration. The yaml tags are
// the key names of the file; DefaultConfig gives the documented defaults.
type Config struct {
	// URL of the NATS server; several may be given separated by commas.
	// Credentials embedded in the URL are never logged. A nats:// URL
	// uses TLS only when the server asks for it; tls:// (or TLS.CAFile)
	// makes it mandatory. New and Check warn of a connection without TLS
	// that carries credentials to a server not on loopback. Default
	// nats://127.0.0.1:4222.
	URL string `yaml:"url"`
	// CredsFile is a JWT + NKey credentials file (decentralised auth).
	CredsFile string `yaml:"creds_file"`
	// User and Password authenticate with a username and password. Mutually
	// exclusive with CredsFile and NKeyFile.
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// NKeyFile is a file holding an NKey seed. Mutually exclusive with
	// CredsFile and User/Password.
	NKeyFile string `yaml:"nkey_file"`
	// TLS configures a TLS connection; empty fields are not used.
	TLS TLSConfig `yaml:"tls"`

	// Domain is the JetStream domain that holds the stream and the dead
	// letters, when it is not the one of the server jetsink connects to: a
	// leaf node whose hub keeps them. JetStream API requests (stream and
	// consumer lookups, pulls) then go to $JS.<domain>.API instead of
	// $JS.API. Empty: the connected server's own JetStream.
	Domain string `yaml:"domain"`

	// Stream is the JetStream stream to consume. Default EVENTS.
	Stream string `yaml:"stream"`
	// Subjects the stream captures; used only when CreateStream is set.
	// Default ["events.>"].
	Subjects []string `yaml:"subjects"`
	// CreateStream makes New create the stream (file storage, Subjects) or
	// update its subjects, leaving the rest of an existing stream's
	// configuration (limits, duplicate window, replicas) as it is, and
	// creates <Stream>_DLQ for DeadLetterSubject when no stream captures it:
	// at start, when Run re-creates the stream or the consumer (gone, or
	// its subscription ended; ensureAll), and when a dead letter finds it
	// deleted. When false
	// New binds to an existing stream and fails with ErrStreamNotFound if
	// there is none. Default false.
	CreateStream bool `yaml:"create_stream"`
	// StreamMaxAge and StreamMaxBytes bound the stream with CreateStream
	// (JetStream's max_age and max_bytes; a stream jetsink creates discards
	// old events, one there keeps its discard policy): it keeps every
	// event, stored by jetsink or not, until it is older than StreamMaxAge
	// or the oldest events no longer fit in StreamMaxBytes. 0 (the
	// default) is no limit for a stream jetsink creates, and leaves an
	// existing stream's limit as it is; set, it is applied to an existing
	// stream too. Without a limit the stream keeps every event for good.
	// An event not yet stored when its limit deletes it is lost: choose
	// them beyond the longest outage of PostgreSQL to ride out. Only with
	// CreateStream.
	StreamMaxAge   time.Duration `yaml:"stream_max_age"`
	StreamMaxBytes int64         `yaml:"stream_max_bytes"`
	// StreamReplicas is how many servers of a JetStream cluster keep the
	// stream with CreateStream, 1 to 5. 0 (the default) creates it with
	// one, the server's default, and leaves an existing stream's as it
	// is; set, it is applied to an existing stream too (the server scales
	// it). With one replica, the loss of that server's disk loses the
	// events on it, acked to their publishers: on a cluster, check and run
	// warn of it. Only with CreateStream.
	StreamReplicas int `yaml:"stream_replicas"`
	// StreamDuplicateWindow is the stream's duplicate window with
	// CreateStream (JetStream's duplicate_window): how long it remembers
	// each Nats-Msg-Id to drop a publisher's retry, at least 100ms and at
	// most StreamMaxAge. nats-server keeps every ID of the window in
	// memory, ~160 bytes each, and cleans them up as they expire: at
	// 20,000 events/s the default 2 minutes holds 2.4M (measured:
	// ~380 MB, and a tail of collections that slowed every process on
	// two cores; a 10 s window halved jetsink's p99 there). Size it to
	// how long your publishers retry. 0 (the default) creates the stream
	// with the server's default, 2 minutes (or its max_age, if shorter),
	// and leaves an existing stream's as it is; set, it is applied to an
	// existing stream too. Only with CreateStream.
	StreamDuplicateWindow time.Duration `yaml:"stream_duplicate_window"`
	// Consumer is the name of the durable pull consumer, created or updated
	// by New. Several jetsink instances with the same name share the work.
	// Default jetsink.
	Consumer string `yaml:"consumer"`
	// FilterSubject restricts the consumer to matching subjects; "" takes
	// the whole stream.
	FilterSubject string `yaml:"filter_subject"`
	// AckWait is how long JetStream waits for an ack before redelivering.
	// At least 1s. Default 30s.
	AckWait time.Duration `yaml:"ack_wait"`
	// MaxDeliver caps the deliveries of one message that jetsink tries to
	// store; -1 means unlimited. Default 10. jetsink enforces it, not the
	// server (the durable consumer's own MaxDeliver is unlimited,
	// durableMaxDeliver): a message delivered past MaxDeliver is not
	// decoded but dead-lettered (stage "deliver", code "max_deliver") and
	// terminated, and delivered again until that dead letter is stored.
	MaxDeliver int `yaml:"max_deliver"`
	// MaxAckPending caps the messages delivered and not yet acked. 0 means
	// derived: the wiring calls DeriveMaxAckPending with what its rings and
	// batches can hold (at most MaxDerivedAckPending); if it is still 0, New
	// uses DefaultMaxAckPending.
	// -1 means unlimited. Must not be below a PullMaxMessages that is set.
	MaxAckPending int `yaml:"max_ack_pending"`
	// DeadLetterSubject receives events that can never be stored. Some
	// stream other than Stream must capture it (a stream capturing its own
	// dead letters would loop). Default jetsink.dlq.EVENTS.
	DeadLetterSubject string `yaml:"dead_letter_subject"`

	// PullMaxMessages bounds the messages a pull subscription keeps
	// requested and not yet taken; a new pull is sent when fewer than half
	// of them are. 0 (the default) derives it (PullMessages):
	// DefaultPullMaxMessages, at most MaxAckPending and the consumer's
	// max_request_batch; with nats.go's pulls at most
	// natsGoDerivedPullMessages. It has to cover what arrives in a round
	// trip to the server: with NATS 1 ms away (bench --nats-rtt) 1,024
	// drained at 0.85x the rate of 4,096, 5 ms away at 0.62x, and on
	// loopback no faster (BENCHMARKS.md, session 50). The wire client
	// bounds the bytes apart from it, by the in-flight budget; nats.go
	// counts a subscription holding more than 64 MiB as a slow consumer
	// and drops messages (JetStream redelivers them after ack_wait), so
	// with it keep pull_max_messages x typical event size well below
	// that, or set PullMaxBytes. nats.go's pulls ask for at most 250,000
	// (maxNATSGoPullMessages).
	PullMaxMessages int `yaml:"pull_max_messages"`
	// PullMaxBytes additionally caps the bytes of one pull request, and
	// (with the wire pull client) holds what waits for the pipeline to
	// typically about three times that (wire.PullOptions); 0 (the
	// default) means no byte cap. It must be at least the server's
	// max_payload (New checks), or a larger message would stall the
	// consumer for good. No byte cap by default because the rest of the
	// chain (rings, batches) is bounded in events, not bytes, so a byte cap
	// here alone would not bound memory in bytes; bound the event size with
	// the server's max_payload and pipeline.max_event_bytes instead.
	PullMaxBytes int `yaml:"pull_max_bytes"`
	// MaxInFlightBytes bounds, in bytes, the messages jetsink holds: from
	// when the consumer takes each from the wire pull client until its
	// fate is settled (acked after its commit, dead-lettered, nak'ed),
	// counting what the server counts against a pull (subject, ack reply,
	// headers, payload). The consumer pulls only while the budget, less
	// what waits in the pull client's buffer, has room for a message of
	// the server's max_payload, and asks each pull for no more than that
	// room; the rest waits in JetStream. max_ack_pending bounds the same
	// messages in number. The bound is not hard: pulls left open on a
	// stream with nothing more to deliver can each be filled by a burst,
	// a quarter of it up to 8 MiB (or PullMaxBytes) each. 0 (the default) means
	// DefaultMaxInFlightBytes, or 4 x (max_payload + 8 KiB) if that is
	// more; -1 means no bound. At least max_payload + 8 KiB (New checks;
	// wireBudget grows it for a server that takes more). It does not apply
	// while nats.go pulls (PullClient "nats.go", a websocket URL, wire
	// given up).
	MaxInFlightBytes int64 `yaml:"max_in_flight_bytes"`
	// PullExpiry is how long one pull request waits on the server. At least
	// 1s. Default 30s.
	PullExpiry time.Duration `yaml:"pull_expiry"`
	// PullHeartbeat is the idle heartbeat the server sends on an open pull;
	// two missed heartbeats make nats.go pull again and Run re-check the
	// consumer. It also bounds a known stall: now and then the server holds
	// no pull request while nats.go believes one is open (nats.go#1622), and
	// delivery stops until two heartbeats are missed; with the former
	// default of 5s the bench saw 10 s gaps in ~1 of 6 drains. At least
	// 100ms and at most half of PullExpiry. Default 1s.
	PullHeartbeat time.Duration `yaml:"pull_heartbeat"`
	// PullClient is what pulls the messages: "wire" (the default:
	// consumer/wire, jetsink's own reader of the NATS protocol, on a
	// connection of its own: it allocates once per message and decodes
	// headers only when asked; plain TCP or TLS, user/password, nkey and
	// creds authentication; nats.go pulls over a websocket URL) or
	// "nats.go" (nats.go's jetstream Consume). Either way the JetStream
	// API and dead letters use nats.go's connection; wire's messages are
	// acked over its own while it is open, and through nats.go's after.
	PullClient string `yaml:"pull_client"`

	// StoredSeq, when set, returns the highest sequence of stream that the
	// table already holds rows for (0: none). The exactly-once wiring sets
	// it (sink.Sink.StoredSeq), as rows are keyed by (stream, stream_seq)
	// there: with CreateStream, a missing stream is then created to
	// continue past those rows, and Run refuses a stream whose sequence
	// restarted under them (ErrSequenceRestarted). Not a file key.
	StoredSeq func(ctx context.Context, stream string) (uint64, error) `yaml:"-"`
	// Destination names where this instance writes the events (the
	// wiring gives the PostgreSQL server, database and table, never a
	// user or password: anyone who may read the consumer's info reads
	// it). New and Run record it in the durable's metadata
	// (destinationKey), and warn when the record names another: jetsinks
	// sharing a durable split its events between them, so two writing to
	// two destinations each get only some of the stream's events. Check
	// reports it too. "" records and compares nothing. Not a file key.
	Destination string `yaml:"-"`

	// For tests: the consumer's connection dials with dialer when it is
	// set, and pings every pingEvery instead of pingInterval when it is
	// not 0; nats.go's disconnect handler calls beforeDisconnect first
	// (standing for a handler that runs late: nats.go calls it on a
	// goroutine of its own, after the connection is gone).
	dialer           nats.CustomDialer
	pingEvery        time.Duration
	beforeDisconnect func()
}

// TLSConfig is the nats.tls: section.
type TLSConfig struct {
	// CAFile is a PEM bundle of the CAs trusted to sign the server's
	// certificate.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client certificate and its key, for
	// servers that verify clients. Give both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		URL:               DefaultURL,
		Stream:            DefaultStream,
		Subjects:          []string{DefaultSubject},
		Consumer:          DefaultConsumer,
		AckWait:           DefaultAckWait,
		MaxDeliver:        DefaultMaxDeliver,
		DeadLetterSubject: DefaultDeadLetterSubject,
		PullExpiry:        DefaultPullExpiry,
		PullHeartbeat:     DefaultPullHeartbeat,
		PullClient:        PullClientWire,
	}
}

// maxReplicas is the most replicas JetStream keeps of a stream.
const maxReplicas = 5

// minDuplicateWindow is the shortest duplicate window nats-server takes.
const minDuplicateWindow = 100 * time.Millisecond

// MaxDerivedAckPending caps what DeriveMaxAckPending derives. Each message
// in flight holds ~1.2 KiB of heap besides its payload (nats.go's message and
// header map, the row's tuple), and the heap's peak follows what is in
// flight. In 1M-event bench drains (180-byte events) the uncapped default
// (then 20,120, with 2 sink connections) took the peak RSS over 64 MiB in 3 of 6 runs (64.8-69.1 MiB) and
// 10,000 in none of 6 (58.9-60.4), at the same rate and CPU per event
// (BENCHMARKS.md, session 12). At ~190k events/s, 10,000 is ~50 ms of
// events; in those drains an event's p50 from receipt to its COPY was 11-14
// ms and from COPY to commit 4-6 ms. A larger max_ack_pending can be set
// explicitly.
const MaxDerivedAckPending = 10000

// MaxPullMessages bounds nats.pull_max_messages: a pull subscription
// allocates a buffer of twice that many message pointers when it starts
// (16 MiB at the bound), and far fewer already keep a drain fed
// (BENCHMARKS.md).
const MaxPullMessages = 1 << 20

// DeriveMaxAckPending sets MaxAckPending, when it is 0, to inFlight (what the
// rest of the chain can hold: ring slots, events waiting for their dead
// letters and open batch rows) plus
// PullMessages, at most MaxDerivedAckPending (but never below
// PullMessages), so that the server does not throttle the consumer
// below what jetsink can use while memory stays bounded. An explicit
// MaxAckPending is left alone.
func (c *Config) DeriveMaxAckPending(inFlight int) {
	if c.MaxAckPending == 0 && inFlight > 0 {
		pull := c.PullMessages()
		c.MaxAckPending = max(min(inFlight+pull, MaxDerivedAckPending), pull)
	}
}

// PullMessages is the messages a pull subscription keeps requested:
// PullMaxMessages, or when that is 0 (derived) DefaultPullMaxMessages, at
// most MaxAckPending when that is set (the server delivers no more). The
// consumer's max_request_batch lowers a derived one further once the
// server has told it (Consumer.pullMessages).
func (c Config) PullMessages() int {
	if c.PullMaxMessages > 0 {
		return c.PullMaxMessages
	}
	if c.MaxAckPending > 0 {
		return min(DefaultPullMaxMessages, c.MaxAckPending)
	}
	return DefaultPullMaxMessages
}

// inFlightBudget is the in-flight byte budget for a server whose
// max_payload is maxPayload; 0 for none.
func (c Config) inFlightBudget(maxPayload int64) int64 {
	switch c.MaxInFlightBytes {
	case -1:
		return 0
	case 0:
		return max(DefaultMaxInFlightBytes, 4*(maxPayload+pullBytesMargin))
	}
	return c.MaxInFlightBytes
}

// maxAckPending is what New asks the server for.
func (c Config) maxAckPending() int {
	if c.MaxAckPending == 0 {
		return max(DefaultMaxAckPending, c.PullMessages())
	}
	return c.MaxAckPending
}

// Validate checks the configuration without touching the network, and
// returns every problem it finds, joined (errors.Join). Every error wraps
// ErrInvalidConfig, names the key and says how to fix it. It never quotes
// the password or the content of a credentials file.
func (c Config) Validate() error {
	var errs []error
	if err := validateURLs(c.URL); err != nil {
		errs = append(errs, err)
	}
	auth := 0
	if c.User != "" || c.Password != "" {
		auth++
		if c.User == "" {
			errs = append(errs, fmt.Errorf("%w: nats.password is set without nats.user; set both or neither", ErrInvalidConfig))
		}
	}
	if c.CredsFile != "" {
		auth++
	}
	if c.NKeyFile != "" {
		auth++
	}
	if auth > 1 {
		errs = append(errs, fmt.Errorf("%w: nats.user/password, nats.creds_file and nats.nkey_file are alternatives; set only one of them", ErrInvalidConfig))
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		errs = append(errs, fmt.Errorf("%w: nats.tls.cert_file and nats.tls.key_file go together; set both or neither", ErrInvalidConfig))
	}
	if c.Domain != "" && strings.ContainsAny(c.Domain, " \t\r\n\f.*>") {
		// The server's own rule for a domain name: one subject token.
		errs = append(errs, fmt.Errorf("%w: nats.domain %q may not contain whitespace, '.', '*' or '>'", ErrInvalidConfig, c.Domain))
	}
	streamOK := true
	if err := validName("nats.stream", c.Stream, DefaultStream); err != nil {
		errs = append(errs, err)
		streamOK = false
	}
	if err := validName("nats.consumer", c.Consumer, DefaultConsumer); err != nil {
		errs = append(errs, err)
	}
	if c.StreamMaxAge < 0 || c.StreamMaxAge > 0 && c.StreamMaxAge <= c.AckWait {
		errs = append(errs, fmt.Errorf("%w: nats.stream_max_age must be 0 (no limit) or longer than nats.ack_wait %s (got %s): an event that comes again after ack_wait would be gone",
			ErrInvalidConfig, c.AckWait, c.StreamMaxAge))
	}
	if c.StreamMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("%w: nats.stream_max_bytes must be 0 (no limit) or positive (got %d)", ErrInvalidConfig, c.StreamMaxBytes))
	}
	if c.StreamReplicas < 0 || c.StreamReplicas > maxReplicas {
		errs = append(errs, fmt.Errorf("%w: nats.stream_replicas must be 0 (the server's default, 1, for a stream jetsink creates) or 1 to %d (got %d)",
			ErrInvalidConfig, maxReplicas, c.StreamReplicas))
	}
	if w := c.StreamDuplicateWindow; w < 0 || w > 0 && w < minDuplicateWindow || w > 0 && c.StreamMaxAge > 0 && w > c.StreamMaxAge {
		errs = append(errs, fmt.Errorf("%w: nats.stream_duplicate_window must be 0 (the server's default, 2m) or from %s to nats.stream_max_age (got %s): the server refuses the rest",
			ErrInvalidConfig, minDuplicateWindow, w))
	}
	if !c.CreateStream && (c.StreamMaxAge != 0 || c.StreamMaxBytes != 0 || c.StreamReplicas != 0 || c.StreamDuplicateWindow != 0) {
		errs = append(errs, fmt.Errorf("%w: nats.stream_max_age, nats.stream_max_bytes, nats.stream_replicas and nats.stream_duplicate_window apply to the stream jetsink creates or updates: "+
			"set nats.create_stream: true, or set them on the stream (%s)", ErrInvalidConfig, streamEdit(c.Stream, "--max-age ... --max-bytes ... --replicas ... --dupe-window ...")))
	}
	if c.CreateStream && len(c.Subjects) == 0 {
		errs = append(errs, fmt.Errorf("%w: nats.subjects is empty; with nats.create_stream: true give the subjects the stream captures, e.g. [\"events.>\"]", ErrInvalidConfig))
	}
	for i, s := range c.Subjects {
		if err := validSubject(s, true); err != nil {
			errs = append(errs, fmt.Errorf("%w: nats.subjects[%d] %q: %s", ErrInvalidConfig, i, s, err))
		}
	}
	if c.FilterSubject != "" {
		if err := validSubject(c.FilterSubject, true); err != nil {
			errs = append(errs, fmt.Errorf("%w: nats.filter_subject %q: %s", ErrInvalidConfig, c.FilterSubject, err))
		}
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("%w: nats.ack_wait must be at least 1s (got %s)", ErrInvalidConfig, c.AckWait))
	}
	if c.MaxDeliver == 0 || c.MaxDeliver < -1 {
		errs = append(errs, fmt.Errorf("%w: nats.max_deliver must be -1 (unlimited) or at least 1 (got %d)", ErrInvalidConfig, c.MaxDeliver))
	}
	if c.MaxDeliver >= math.MaxInt32 {
		// Event.Delivered is 32 bits.
		errs = append(errs, fmt.Errorf("%w: nats.max_deliver must be below %d (got %d); -1 is unlimited", ErrInvalidConfig, math.MaxInt32, c.MaxDeliver))
	}
	if c.PullMaxMessages < 0 || c.PullMaxMessages > MaxPullMessages {
		errs = append(errs, fmt.Errorf("%w: nats.pull_max_messages must be 0 (derived) or 1 to %d (got %d)", ErrInvalidConfig, MaxPullMessages, c.PullMaxMessages))
	}
	if c.PullMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("%w: nats.pull_max_bytes must be 0 (no byte cap) or positive (got %d)", ErrInvalidConfig, c.PullMaxBytes))
	}
	if c.MaxInFlightBytes < -1 {
		errs = append(errs, fmt.Errorf("%w: nats.max_in_flight_bytes must be 0 (derived), -1 (no bound) or positive (got %d)", ErrInvalidConfig, c.MaxInFlightBytes))
	}
	if c.MaxAckPending < -1 {
		errs = append(errs, fmt.Errorf("%w: nats.max_ack_pending must be 0 (derived), -1 (unlimited) or positive (got %d)", ErrInvalidConfig, c.MaxAckPending))
	}
	if c.MaxAckPending > 0 && c.PullMaxMessages > 0 && c.MaxAckPending < c.PullMaxMessages {
		errs = append(errs, fmt.Errorf("%w: nats.max_ack_pending (%d) is below nats.pull_max_messages (%d); raise it or set 0 to derive it", ErrInvalidConfig, c.MaxAckPending, c.PullMaxMessages))
	}
	if c.PullExpiry < time.Second {
		errs = append(errs, fmt.Errorf("%w: nats.pull_expiry must be at least 1s (got %s)", ErrInvalidConfig, c.PullExpiry))
	}
	switch c.PullClient {
	case "", PullClientNATSGo, PullClientWire:
	default:
		errs = append(errs, fmt.Errorf("%w: nats.pull_client must be %q or %q (got %q)", ErrInvalidConfig, PullClientNATSGo, PullClientWire, c.PullClient))
	}
	// Against half the expiry only when the expiry itself is valid: else
	// its own problem is the one to fix. (nats.go's pulls take 500ms-30s:
	// natsGoHeartbeat.)
	if c.PullHeartbeat < 100*time.Millisecond || c.PullExpiry >= time.Second && c.PullHeartbeat > c.PullExpiry/2 {
		errs = append(errs, fmt.Errorf("%w: nats.pull_heartbeat must be between 100ms and half of nats.pull_expiry (got %s with expiry %s)", ErrInvalidConfig, c.PullHeartbeat, c.PullExpiry))
	}
	dlqOK := false
	if c.DeadLetterSubject == "" {
		errs = append(errs, fmt.Errorf("%w: nats.dead_letter_subject is empty; set a subject that another stream captures, e.g. %s", ErrInvalidConfig, DefaultDeadLetterSubject))
	} else if err := validSubject(c.DeadLetterSubject, false); err != nil {
		errs = append(errs, fmt.Errorf("%w: nats.dead_letter_subject %q: %s", ErrInvalidConfig, c.DeadLetterSubject, err))
	} else {
		dlqOK = true
	}
	if c.CreateStream && dlqOK && streamOK { // else their own problems come first
		if err := checkNoLoop(c.Stream, c.Subjects, c.DeadLetterSubject); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkNoLoop fails when one of the stream's subjects captures the
// dead-letter subject: dead letters would be consumed again.
func checkNoLoop(stream string, subjects []string, dlq string) error {
	for _, s := range subjects {
		if SubjectMatches(s, dlq) {
			return fmt.Errorf("%w: nats.dead_letter_subject %q is captured by stream %s's subject %q, so dead letters would be consumed again; use a subject outside the stream, e.g. jetsink.dlq.%s, captured by a stream of its own",
				ErrInvalidConfig, dlq, stream, s, stream)
		}
	}
	return nil
}

// checkNoSourceLoop fails when event stream sc mirrors or sources
// dlqStream, the stream that captures the dead-letter subject dlq, through
// a filter that takes dlq, and the durable's filter (nats.filter_subject,
// "" for all) takes the letters as they arrive: every dead letter would
// come back as an event, be dead-lettered again under its new sequence,
// and so on without end (the original's Jetsink-* headers are not copied
// to its letter, so nothing marks it). A source from another account or
// domain (External) is another stream of that name. The subject a letter
// arrives on is judged as the source's subject transform makes it (a
// mapping function's token, any); under a subject transform of sc's own
// the durable's filter is not judged.
func checkNoSourceLoop(sc *jetstream.StreamConfig, dlqStream, dlq, filter string) error {
	from := slices.Clone(sc.Sources)
	kind := "sources"
	if sc.Mirror != nil {
		from = append([]*jetstream.StreamSource{sc.Mirror}, from...)
	}
	for i, src := range from {
		if src == nil || src.Name != dlqStream || src.External != nil {
			continue
		}
		if i == 0 && sc.Mirror != nil {
			kind = "mirrors"
		}
		arrives, ok := sourcedAs(src, dlq)
		if !ok || filter != "" && sc.SubjectTransform == nil && !pipeline.SubjectsOverlap(filter, arrives) {
			continue
		}
		return fmt.Errorf("%w: stream %s %s %s, which captures nats.dead_letter_subject %q, so every dead letter would come back as an event "+
			"and be dead-lettered again, without end; take %s out of the stream's sources (or give the source a filter_subject that leaves %s out), "+
			"set nats.filter_subject to leave it out, or use a nats.dead_letter_subject that a stream the event stream does not source captures",
			ErrInvalidConfig, sc.Name, kind, dlqStream, dlq, dlqStream, dlq)
	}
	return nil
}

// sourcedAs is the subject on which a message published to subject dlq of
// src's stream arrives in the stream that sources (or mirrors) it, and
// false when src's filter or transforms leave it out. Under a transform it
// is what nats-server's own transform makes of dlq (Transformed), or, where
// that cannot be known, a pattern for it.
func sourcedAs(src *jetstream.StreamSource, dlq string) (string, bool) {
	if len(src.SubjectTransforms) > 0 {
		for _, t := range src.SubjectTransforms {
			if t.Source == "" || SubjectMatches(t.Source, dlq) {
				if t.Destination == "" {
					return dlq, true
				}
				if s, ok := Transformed(cmp.Or(t.Source, ">"), t.Destination, dlq); ok {
					return s, true
				}
				return storedPattern(t.Destination), true
			}
		}
		return "", false
	}
	if src.FilterSubject != "" && !SubjectMatches(src.FilterSubject, dlq) {
		return "", false
	}
	return dlq, true
}

// Transformed is the subject a subject transform from src to dest makes
// of subject, a literal subject that src matches: nats-server's own
// transform, so that every mapping function is read as the server reads
// it. False when the server would not take the transform, or when it
// draws a token at random (another subject each time).
func Transformed(src, dest, subject string) (string, bool) {
	if strings.Contains(strings.ToLower(dest), "random(") {
		return "", false
	}
	t, err := server.NewSubjectTransform(src, dest)
	if err != nil {
		return "", false
	}
	s, err := t.Match(subject)
	return s, err == nil
}

func validateURLs(list string) error {
	if strings.TrimSpace(list) == "" {
		return fmt.Errorf("%w: nats.url is empty; set it, e.g. %s", ErrInvalidConfig, DefaultURL)
	}
	var errs []error // one per entry at fault
	for i, raw := range strings.Split(list, ",") {
		if err := validateURL(i+1, strings.TrimSpace(raw)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// validateURL checks entry n of nats.url, raw.
func validateURL(n int, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		// Do not quote raw: it may carry a password (user:1234 reads
		// as host:port too).
		if _, port, err := net.SplitHostPort(raw); err == nil && !strings.ContainsAny(raw, "@/%?#") && digits(port) {
			return fmt.Errorf("%w: nats.url entry %d has no scheme: put nats:// before its host:port", ErrInvalidConfig, n)
		}
		return fmt.Errorf("%w: nats.url entry %d is not a URL like nats://host:4222", ErrInvalidConfig, n)
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Errorf("%w: nats.url entry %d has scheme %q; use nats://, tls://, ws:// or wss://", ErrInvalidConfig, n, u.Scheme)
	}
	// url.Parse takes any digits for a port; a dial would refuse them
	// only at connect, which reads as a server that cannot be reached
	// (exit 1, restarted for ever) instead of a bad setting.
	if p := u.Port(); p != "" {
		if v, err := strconv.ParseUint(p, 10, 16); err != nil || v == 0 {
			return fmt.Errorf("%w: nats.url entry %d has port %s; a port is 1 to 65535", ErrInvalidConfig, n, p)
		}
	}
	return nil
}

// APIPrefix is the JetStream API prefix for c.Domain: $JS.API, or
// $JS.<domain>.API.
func (c Config) APIPrefix() string {
	if c.Domain == "" {
		return "$JS.API"
	}
	return "$JS." + c.Domain + ".API"
}

// JetStream is the JetStream API on nc that c names: the connected
// server's, or c.Domain's.
func (c Config) JetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	var js jetstream.JetStream
	var err error
	if c.Domain == "" {
		js, err = jetstream.New(nc)
	} else {
		js, err = jetstream.NewWithDomain(nc, c.Domain)
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return js, nil
}

// validName checks a stream or consumer name the way the server does.
func validName(key, name, example string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s is empty; set a name such as %s", ErrInvalidConfig, key, example)
	case len(name) > maxNameLen:
		return fmt.Errorf("%w: %s is %d bytes long; JetStream allows %d", ErrInvalidConfig, key, len(name), maxNameLen)
	case strings.ContainsAny(name, ".*>/\\"):
		return fmt.Errorf("%w: %s %q may not contain '.', '*', '>', '/' or '\\'", ErrInvalidConfig, key, name)
	}
	for _, r := range name {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("%w: %s %q may not contain whitespace or control characters", ErrInvalidConfig, key, name)
		}
	}
	return nil
}

// validSubject checks a NATS subject; wildcards are allowed only when
// wildcards is set.
func validSubject(s string, wildcards bool) error {
	if s == "" {
		return errors.New("empty subject")
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return errors.New("subjects may not contain whitespace or control characters")
		}
	}
	tokens := strings.Split(s, ".")
	for i, t := range tokens {
		switch {
		case t == "":
			return errors.New("empty token (leading, trailing or double '.')")
		case t == "*" || t == ">":
			if !wildcards {
				return errors.New("must be a literal subject without '*' or '>'")
			}
			if t == ">" && i != len(tokens)-1 {
				return errors.New("'>' must be the last token")
			}
		case strings.ContainsAny(t, "*>"):
			return errors.New("'*' and '>' must be whole tokens")
		}
	}
	return nil
}

// SubjectMatches reports whether the NATS subject pattern (which may hold
// the * and > wildcards) matches the literal subject.
func SubjectMatches(pattern, subject string) bool {
	for {
		p, prest, pmore := strings.Cut(pattern, ".")
		s, srest, smore := strings.Cut(subject, ".")
		switch {
		case p == ">":
			return true
		case p != "*" && p != s:
			return false
		case !pmore || !smore:
			return pmore == smore
		}
		pattern, subject = prest, srest
	}
}

// durableMaxDeliver is the durable consumer's MaxDeliver, whatever
// nats.max_deliver says: unlimited. jetsink enforces nats.max_deliver
// itself: a delivery past it is dead-lettered undecoded
// (pipeline.Event.Exhausted), and if that dead letter fails the message
// is nak'ed and comes back. A server-side limit would let the server give
// up on a message that is neither stored nor dead-lettered, and say so
// only in its MAX_DELIVERIES advisory, which nobody may be listening to
// and which it never repeats.
const durableMaxDeliver = -1

// minNATSGoHeartbeat and maxNATSGoHeartbeat bound the idle heartbeat of
// nats.go's pulls: its Consume refuses any other (the wire client takes
// any).
const (
	minNATSGoHeartbeat = 500 * time.Millisecond
	maxNATSGoHeartbeat = 30 * time.Second
)

// maxNATSGoPullMessages bounds the messages of nats.go's pulls: its
// subscription holds at most nats.DefaultSubPendingMsgsLimit (500,000,
// and jetstream's Consume offers no way to raise it) and drops what comes
// beyond that as a slow consumer (back after ack_wait, each time counted
// towards max_deliver); half, for what a pull and the pull again at half
// of it may bring while the handler waits.
const maxNATSGoPullMessages = nats.DefaultSubPendingMsgsLimit / 2

// natsGoPullMessages is pull (what the consumer would pull) within what
// nats.go's pulls can hold, and whether it had to be lowered; a derived
// one (pull_max_messages 0) is at most natsGoDerivedPullMessages, which is
// no lowering to warn of.
func natsGoPullMessages(pull int, derived bool) (int, bool) {
	if derived {
		pull = min(pull, natsGoDerivedPullMessages)
	}
	n := min(pull, maxNATSGoPullMessages)
	return n, n != pull
}

// natsGoDerivedPullMessages bounds a derived pull_max_messages with
// nats.go's pulls: they carry no byte cap unless pull_max_bytes sets one,
// and its subscription drops what it holds beyond 64 MiB as a slow
// consumer (JetStream redelivers it after ack_wait); 1,024 takes events
// of up to 64 KiB. The wire client bounds bytes by the in-flight budget.
const natsGoDerivedPullMessages = 1024

// natsGoHeartbeat is nats.pull_heartbeat within nats.go's bounds, and
// whether it had to be moved there. (Within half of pull_expiry still:
// Validate holds pull_expiry to at least 1s.)
func (c Config) natsGoHeartbeat() (time.Duration, bool) {
	hb := min(max(c.PullHeartbeat, minNATSGoHeartbeat), maxNATSGoHeartbeat)
	return hb, hb != c.PullHeartbeat
}

// ConnectError says that connecting to c.URL (nats.url: one or more,
// comma separated) failed with err, naming the servers without their
// credentials (a user, a password or a token) and what to check, by the
// cause (connectHint), blaming the client certificate for a connection
// closed right after the TLS handshake only when nats.tls.cert_file sets
// one.
func (c Config) ConnectError(err error) error {
	return fmt.Errorf("nats.url %s: %w (%s)", ServersOf(c.URL), err, connectHint(err, c.TLS.CertFile != ""))
}

// The hints of connectHint.
const (
	hintListening   = "is a nats-server with JetStream listening there? set nats.url, --nats-url or JETSINK_NATS_URL"
	hintAuth        = "the server refused jetsink's credentials: check nats.user and nats.password (or nats.creds_file, nats.nkey_file, or the user info in nats.url)"
	hintNoNKeys     = "the server has no NKey users, so it refused nats.nkey_file's key: check nats.nkey_file, or use the credentials the server has (nats.user and nats.password, nats.creds_file, a token)"
	hintCA          = "jetsink could not verify the server's TLS certificate: set nats.tls.ca_file to the CA that signed it"
	hintHostname    = "the server's TLS certificate is not for the host in nats.url: connect by a name the certificate holds"
	hintClientCrt   = "the server refused jetsink's TLS client certificate: check nats.tls.cert_file and nats.tls.key_file (given, current, signed by a CA the server trusts)"
	hintNoClientCrt = "the server wants a TLS client certificate, which jetsink did not give: set nats.tls.cert_file and nats.tls.key_file"
	hintNoTLS       = "the server offers no TLS, which the configuration asks for (nats.tls, or a tls:// URL in nats.url): drop those settings or enable TLS on the server"
	hintTLS         = "the TLS handshake with the server failed: check nats.tls (ca_file, cert_file, key_file) against the server's tls settings"
	hintClosed      = "the server closed the connection before it said a word: nothing behind the address does that (a port mapping or a load balancer with no server ready yet: is a nats-server with JetStream listening there? set nats.url, --nats-url or JETSINK_NATS_URL), or a server with tls { handshake_first: true }, which jetsink does not support (give it a delay instead, such as handshake_first: \"300ms\")"
	hintTLSClosed   = "the server closed the connection right after the TLS handshake: a server that wants a client certificate does that (set nats.tls.cert_file and nats.tls.key_file), or a TLS proxy with no server ready behind it: is a nats-server with JetStream listening there? check nats.tls against the server's tls settings"
)

// connectHint is what to check after nats.Connect failed with err: a
// refused credential, a TLS setting, or, for a failed dial (refused, no
// route, a timeout, a name not found) and whatever else, whether a
// nats-server listens at nats.url at all. clientCert is whether
// nats.tls.cert_file sets a client certificate.
func connectHint(err error, clientCert bool) string {
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		return hintAuth
	case errors.Is(err, nats.ErrNkeysNotSupported):
		// The server answered, with no nonce in its INFO: it has no NKey
		// users (nats.nkey_file set).
		return hintNoNKeys
	case errors.Is(err, nats.ErrSecureConnWanted):
		return hintNoTLS
	}
	if _, ok := errors.AsType[x509.HostnameError](err); ok {
		return hintHostname
	}
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return hintCA
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return hintCA
	}
	if _, ok := errors.AsType[x509.CertificateInvalidError](err); ok {
		return hintCA
	}
	if a, ok := remoteTLSAlert(err); ok && clientCertAlert(a) {
		if !clientCert {
			return hintNoClientCrt
		}
		return hintClientCrt
	}
	closed := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if errors.Is(err, nats.ErrTLS) && (closed || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		// nats.go: closed by the server right after the TLS handshake,
		// which is how a server (or a proxy) refuses a client certificate
		// under TLS 1.3, when its alert came too late to be read, or
		// asks for one jetsink did not give; a TLS proxy with no server
		// behind it closes there as well.
		if clientCert {
			return hintClientCrt
		}
		return hintTLSClosed
	}
	if closed {
		// Before the server's INFO: a plain TCP listener (docker-proxy,
		// a load balancer) with nothing behind it accepts and closes,
		// as does a server with TLS handshake first.
		return hintClosed
	}
	if _, ok := remoteTLSAlert(err); ok || errors.Is(err, nats.ErrTLS) {
		return hintTLS
	}
	return hintListening
}

// remoteTLSAlert is the alert the server sent that err carries: crypto/tls
// reports one as a *net.OpError with Op "remote error" around its
// (unexported) alert type, a uint8.
func remoteTLSAlert(err error) (uint8, bool) {
	op, ok := errors.AsType[*net.OpError](err)
	if !ok || op.Op != "remote error" || op.Err == nil {
		return 0, false
	}
	v := reflect.ValueOf(op.Err)
	if v.Kind() != reflect.Uint8 {
		return 0, false
	}
	return uint8(v.Uint()), true
}

// clientCertAlert reports whether the TLS alert a is about the client's
// certificate (RFC 8446 6.2): bad_certificate, unsupported_certificate,
// certificate_revoked, certificate_expired, certificate_unknown,
// unknown_ca, certificate_required.
func clientCertAlert(a uint8) bool {
	switch a {
	case 42, 43, 44, 45, 46, 48, 116:
		return true
	}
	return false
}

// connectedURL is the server nc is connected to, for the log: without the
// user info (nats.go's ConnectedUrlRedacted hides a password only, and
// shows a token or a user name).
func connectedURL(nc *nats.Conn) string { return serverOf(nc.ConnectedUrl()) }

// serverOf is one server's URL, as nats.go gives it (url.URL.String(),
// which leaves a comma in the user info unescaped: ServersOf would split
// there, before the user info), cut to its scheme and host.
func serverOf(u string) string {
	if p, err := url.Parse(u); err == nil && p.Host != "" {
		return p.Scheme + "://" + p.Host
	}
	if i := strings.LastIndexByte(u, '@'); i >= 0 {
		scheme := ""
		if j := strings.Index(u, "://"); j >= 0 && j < i {
			scheme = u[:j+3]
		}
		u = scheme + u[i+1:]
	}
	return ServersOf(u)
}

// ServersOf is NATS URLs (comma separated) with each cut to its scheme and
// host: no user, password or token (whatever characters a password holds:
// everything up to the last @ goes), no path or query. For logs and output.
func ServersOf(urls string) string {
	var out []string
	for s := range strings.SplitSeq(urls, ",") {
		s = strings.TrimSpace(s)
		scheme := ""
		if i := strings.Index(s, "://"); i >= 0 {
			scheme, s = s[:i+3], s[i+3:]
		}
		if i := strings.LastIndexByte(s, '@'); i >= 0 {
			s = s[i+1:]
		}
		if i := strings.IndexAny(s, "/?#"); i >= 0 {
			s = s[:i]
		}
		out = append(out, scheme+s)
	}
	return strings.Join(out, ",")
}

// digits reports whether s is a non-empty run of ASCII digits.
func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

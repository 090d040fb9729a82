package sink

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrInvalidConfig is wrapped by every error Validate and New return for a
// configuration the sink cannot run with. The text names the key and says
// how to fix it; it never contains the connection string.
var ErrInvalidConfig = errors.New("invalid postgres config")

// Mode is the delivery mode.
type Mode string

// The delivery modes.
const (
	// AtLeastOnce acks a message after the transaction holding its row has
	// committed; a crash between COMMIT and ack stores the row twice.
	AtLeastOnce Mode = "at-least-once"
	// ExactlyOnce additionally moves every batch through a staging table with
	// INSERT ... ON CONFLICT (stream, stream_seq) DO NOTHING, so that a
	// redelivered message adds nothing.
	ExactlyOnce Mode = "exactly-once"
)

// Config is the postgres: section of the config file. The zero value is not
// usable; start from DefaultConfig.
type Config struct {
	// URL is the connection string (postgres:// URL or key=value DSN). It is
	// never logged nor put into an error.
	URL string `yaml:"url"`
	// Table is "table" or "schema.table"; quote a part ("My.Schema"."t")
	// to keep a dot or upper case in it. Default "events".
	Table string `yaml:"table"`
	// CreateTable runs Init (CREATE TABLE IF NOT EXISTS, and the unique index
	// in exactly-once mode) at start-up. Default false.
	CreateTable bool `yaml:"create_table"`
	// Mode is AtLeastOnce (default) or ExactlyOnce.
	Mode Mode `yaml:"mode"`
	// Batch says when a batch is cut.
	Batch BatchConfig `yaml:"batch"`
	// Connections is the number of committers, each with its own connection,
	// so that batches are COPYed while the next ones fill and one slow
	// commit does not hold the rest up. Default 4: at 50,000 events/s it
	// cut the p99 by a fifth against 2, at the same CPU; drains and the p99
	// at 20,000 events/s did not change (BENCHMARKS.md, session 14).
	Connections int `yaml:"connections"`
	// AppName is the application_name of the sink's connections (visible in
	// pg_stat_activity). Default "jetsink".
	AppName string `yaml:"app_name"`
	// DeadConnectionTimeout is how long a connection that a batch is using
	// may go without a sign of life from the server's host before jetsink
	// gives it up and retries the batch on a new one: data sent and not
	// acknowledged, or TCP keepalive or window probes unanswered, for that
	// long (read from the kernel's TCP_INFO). Without it a server that
	// vanishes without closing the connection (a failover that moves the
	// address, a firewall that drops the connection's state, a dead host)
	// holds a COPY until the kernel gives up retransmitting, ~15 minutes by
	// default. A server that is alive answers probes even while it reads
	// nothing (a lock wait, a full window), so only a server that is gone
	// or unreachable counts. One that dies while its window is closed (a
	// COPY waiting for a lock) is noticed later, up to ~4 minutes, as the
	// kernel's window probes are then up to 2 minutes apart. Only the next
	// TCP hop is watched: behind PgBouncer or a TCP proxy, a dead server
	// is the proxy's to notice. Without a connect_timeout in postgres.url
	// it also bounds each connect, to at least 10s. 0 turns it off.
	// Default 60s.
	DeadConnectionTimeout time.Duration `yaml:"dead_connection_timeout"`
	// Retry bounds the backoff between attempts of a failed batch.
	Retry RetryConfig `yaml:"retry"`
	// InProgressEvery is how often the messages of a batch that is held
	// (growing while the committers are busy, waiting for a committer,
	// blocked on a lock, retrying) are told InProgress so that JetStream does
	// not redeliver them. The wiring sets it to nats.ack_wait/3; 0 turns it
	// off. Not a YAML key.
	InProgressEvery time.Duration `yaml:"-"`
	// HoldRows is how many rows the stages before the sink can hold (ring
	// slots plus the pull buffer); set by the wiring, not a YAML key. Once a
	// cut batch has waited InProgressEvery/2 for a committer (a stall), the
	// sink keeps taking rows into spare batches, up to HoldRows, so that a
	// stalled database finds every in-flight message in a batch that
	// InProgress reaches instead of in a ring where nothing does. 0, or
	// InProgressEvery 0, keeps no spare batches; math.MaxInt sets no limit.
	HoldRows int `yaml:"-"`
	// ReleaseAfter is how long the sink may fail to reach PostgreSQL, with
	// no answer from it meanwhile, before it gives back the events it
	// holds (nak'ed with a short delay, so that other instances of the
	// durable take them) and reports itself away (Sink.Away), until the
	// server answers again: see the package doc, Failures. Set by the
	// wiring, not a YAML key; 0 never gives events back.
	ReleaseAfter time.Duration `yaml:"-"`
	// MaxDeliver is nats.max_deliver (0: no limit): an event on its last
	// delivery is never given back, since its next one would be past
	// max_deliver and dead-lettered for an outage. Set by the wiring, not
	// a YAML key.
	MaxDeliver int `yaml:"-"`
}

// BatchConfig is postgres.batch: a batch is cut at MaxRows OR MaxBytes OR
// MaxDelay, whichever comes first (see the package doc for MaxDelay,
// MinDelay and OverlapDelay).
type BatchConfig struct {
	MaxRows  int           `yaml:"max_rows"`  // default 5000
	MaxBytes int           `yaml:"max_bytes"` // sum of tuple lengths; default 4 MiB
	MaxDelay time.Duration `yaml:"max_delay"` // default 20ms
	// MinDelay (linger) holds a batch that is not full back from a free
	// connection until its oldest row has been in jetsink that long, so
	// that a steady trickle makes fewer, larger transactions. 0 hands rows
	// over at once. At most MaxDelay (Validate refuses more), but for the
	// default, which follows a MaxDelay set under it. Default 2ms
	// (BENCHMARKS.md, session 12: at 20k/s on two cores a third busy, the
	// p99 was 8-9 ms against 12-24 ms at 5-10ms; on two saturated cores,
	// session 5, 10ms halved the p99 against 5ms).
	MinDelay time.Duration `yaml:"min_delay"`
	// OverlapDelay holds a batch that is not full back from a free
	// connection while any other connection is committing: it waits until
	// none is (and MinDelay has passed), or until its oldest row has been
	// in jetsink for OverlapDelay, whichever comes first. So a second
	// connection commits beside the first only when the batch is full or
	// the first falls behind, and a drain makes fewer, larger
	// transactions, which cost PostgreSQL less per row than concurrent
	// small ones (BENCHMARKS.md, session 16). 0: a free connection takes
	// the batch after MinDelay, busy or not. At most MaxDelay (Validate
	// refuses more), but for the default, which follows a MaxDelay set
	// under it. Default 20ms.
	OverlapDelay time.Duration `yaml:"overlap_delay"`
}

// RetryConfig is postgres.retry: capped exponential backoff with jitter.
type RetryConfig struct {
	Initial time.Duration `yaml:"initial"` // default 100ms
	Max     time.Duration `yaml:"max"`     // default 5s
}

// Upper bounds: Connections+1 batches may each grow to max_rows rows (see
// batchStart), and a batch holds at most max_bytes of tuples in memory.
const (
	maxBatchRows  = 1 << 20
	maxBatchBytes = 1 << 30
	// maxDeadConnectionTimeout keeps the timeout's milliseconds well inside
	// TCP_INFO's 32-bit counters.
	maxDeadConnectionTimeout = 24 * time.Hour
	// minConnectTimeout is the least connect timeout a small
	// dead_connection_timeout sets: a TLS and SCRAM connect takes several
	// round trips.
	minConnectTimeout = 10 * time.Second
)

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		URL:                   "postgres://postgres@127.0.0.1:5432/postgres",
		Table:                 "events",
		Mode:                  AtLeastOnce,
		Batch:                 BatchConfig{MaxRows: 5000, MaxBytes: 4 << 20, MaxDelay: 20 * time.Millisecond, MinDelay: 2 * time.Millisecond, OverlapDelay: 20 * time.Millisecond},
		Connections:           4,
		AppName:               "jetsink",
		DeadConnectionTimeout: 60 * time.Second,
		Retry:                 RetryConfig{Initial: 100 * time.Millisecond, Max: 5 * time.Second},
	}
}

// Validate checks every field and returns every problem it finds, joined
// (errors.Join), each wrapping ErrInvalidConfig.
func (c *Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, fmt.Errorf("%w: postgres.url is empty; set it or JETSINK_DATABASE_URL", ErrInvalidConfig))
	} else if pc, err := pgconn.ParseConfig(c.URL); err != nil {
		errs = append(errs, urlError(c.URL, err))
	} else {
		// pgx, as libpq, ends the user and password at the first @ (of the
		// part before the first /): a raw @ or / in a password leaves the
		// rest of it in a host or the database name, which every log line
		// and error names ("db"). Said without quoting the URL.
		hosts := []string{pc.Host}
		for _, f := range pc.Fallbacks {
			hosts = append(hosts, f.Host)
		}
		if strings.Contains(pc.Database, "@") || slices.ContainsFunc(hosts, func(h string) bool { return strings.Contains(h, "@") }) {
			errs = append(errs, fmt.Errorf("%w: postgres.url has an @ in a host or the database name: a user or password holding @, / or : must have them percent-encoded (%%40, %%2F, %%3A)", ErrInvalidConfig))
		}
		for k := range pc.RuntimeParams {
			// pgx sends a parameter it does not know to the server, which
			// refuses pgxpool's (42704) at every connect.
			if strings.HasPrefix(k, "pool_") {
				errs = append(errs, fmt.Errorf("%w: postgres.url sets %s, a pgxpool setting that PostgreSQL refuses as an unknown parameter; remove it (postgres.connections sets jetsink's connections)", ErrInvalidConfig, k))
			}
		}
	}
	if _, err := ParseTable(c.Table); err != nil {
		errs = append(errs, err)
	}
	switch c.Mode {
	case AtLeastOnce, ExactlyOnce:
	default:
		errs = append(errs, fmt.Errorf("%w: postgres.mode is %q; use %q or %q", ErrInvalidConfig, c.Mode, AtLeastOnce, ExactlyOnce))
	}
	if c.Batch.MaxRows < 1 || c.Batch.MaxRows > maxBatchRows {
		errs = append(errs, fmt.Errorf("%w: postgres.batch.max_rows must be between 1 and %d (default 5000)", ErrInvalidConfig, maxBatchRows))
	}
	if c.Batch.MaxBytes < 1 || c.Batch.MaxBytes > maxBatchBytes {
		errs = append(errs, fmt.Errorf("%w: postgres.batch.max_bytes must be between 1 and 1GiB (default 4MiB)", ErrInvalidConfig))
	}
	if c.Batch.MaxDelay < 0 {
		errs = append(errs, fmt.Errorf("%w: postgres.batch.max_delay must be >= 0 (default 20ms)", ErrInvalidConfig))
	}
	if c.Batch.MinDelay < 0 {
		errs = append(errs, fmt.Errorf("%w: postgres.batch.min_delay must be >= 0 (default 2ms)", ErrInvalidConfig))
	}
	if c.Batch.OverlapDelay < 0 {
		errs = append(errs, fmt.Errorf("%w: postgres.batch.overlap_delay must be >= 0 (default %v)", ErrInvalidConfig, DefaultConfig().Batch.OverlapDelay))
	}
	// A linger past max_delay would be cut at max_delay (lingerEnd): a
	// value written so is refused rather than quietly shortened. Validate
	// sees values, not where they came from, so a default that a smaller
	// max_delay caps (max_delay: 1ms alone) cannot be told from the same
	// value written out: that one value is let through, and follows
	// max_delay.
	def := DefaultConfig().Batch
	for _, d := range []struct {
		key      string
		val, def time.Duration
	}{{"min_delay", c.Batch.MinDelay, def.MinDelay}, {"overlap_delay", c.Batch.OverlapDelay, def.OverlapDelay}} {
		if c.Batch.MaxDelay >= 0 && d.val > c.Batch.MaxDelay && d.val != d.def {
			errs = append(errs, fmt.Errorf("%w: postgres.batch.%s (%v) is above postgres.batch.max_delay (%v), which bounds how long a batch lingers: "+
				"set %s at most max_delay, or raise max_delay", ErrInvalidConfig, d.key, d.val, c.Batch.MaxDelay, d.key))
		}
	}
	if c.Connections < 1 || c.Connections > 64 {
		errs = append(errs, fmt.Errorf("%w: postgres.connections must be between 1 and 64 (default 4)", ErrInvalidConfig))
	}
	if c.AppName == "" || strings.ContainsRune(c.AppName, 0) {
		errs = append(errs, fmt.Errorf("%w: postgres.app_name must be a non-empty string without NUL (default jetsink)", ErrInvalidConfig))
	}
	if c.DeadConnectionTimeout != 0 && (c.DeadConnectionTimeout < time.Second || c.DeadConnectionTimeout > maxDeadConnectionTimeout) {
		errs = append(errs, fmt.Errorf("%w: postgres.dead_connection_timeout must be 0 (off) or between 1s and 24h (default 60s)", ErrInvalidConfig))
	}
	if c.Retry.Initial <= 0 {
		errs = append(errs, fmt.Errorf("%w: postgres.retry.initial must be > 0 (default 100ms)", ErrInvalidConfig))
	}
	if c.Retry.Max < c.Retry.Initial {
		errs = append(errs, fmt.Errorf("%w: postgres.retry.max must be >= postgres.retry.initial (default 5s)", ErrInvalidConfig))
	}
	if c.ReleaseAfter < 0 {
		errs = append(errs, fmt.Errorf("%w: the release delay must be >= 0 (0: never give events back)", ErrInvalidConfig))
	}
	if c.MaxDeliver < 0 {
		errs = append(errs, fmt.Errorf("%w: max deliver must be >= 0 (0: no limit)", ErrInvalidConfig))
	}
	if c.InProgressEvery < 0 {
		errs = append(errs, fmt.Errorf("%w: in-progress interval must be >= 0 (it is nats.ack_wait/3)", ErrInvalidConfig))
	}
	return errors.Join(errs...)
}

// ParseTable splits "table" or "schema.table" on the first dot outside
// double quotes into a pgx.Identifier. A part that starts with a double
// quote ends at the matching quote and may hold dots ("" is a literal
// quote); any other part is taken verbatim up to the next dot, quotes
// included. Names are not folded to lower case: they are always quoted as
// identifiers, so "Events" and "events" are different tables. Empty
// parts and more than two parts are errors wrapping ErrInvalidConfig.
func ParseTable(s string) (pgx.Identifier, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w: postgres.table %q %s; use table or schema.table (quote a part with \" to keep a dot in it)", ErrInvalidConfig, s, why)
	}
	var parts []string
	var cur strings.Builder
	quoted, inQuotes := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case inQuotes && ch == '"' && i+1 < len(s) && s[i+1] == '"':
			cur.WriteByte('"')
			i++
		case inQuotes && ch == '"':
			inQuotes = false
		case !inQuotes && ch == '"' && cur.Len() == 0 && !quoted:
			inQuotes, quoted = true, true
		case !inQuotes && ch == '.':
			if cur.Len() == 0 {
				return nil, bad("has an empty part")
			}
			parts = append(parts, cur.String())
			cur.Reset()
			quoted = false
		case !inQuotes && quoted:
			return nil, bad("has characters after a closing quote")
		default:
			cur.WriteByte(ch)
		}
	}
	if inQuotes {
		return nil, bad("has an unterminated quote")
	}
	if cur.Len() == 0 {
		return nil, bad("has an empty part")
	}
	parts = append(parts, cur.String())
	if len(parts) > 2 {
		return nil, bad("has more than two parts")
	}
	for _, p := range parts {
		if strings.ContainsRune(p, 0) {
			return nil, bad("contains NUL")
		}
	}
	return pgx.Identifier(parts), nil
}

// urlError says why pgconn.ParseConfig refused url, without the URL: the
// parse error quotes it, with its password removed only as far as pgx can
// tell one from the rest of a string it could not parse. What follows the
// quoted URL in that error (the reason, and the underlying error: a bad
// port, an unknown sslmode, a CA file that cannot be read) is kept. The
// error wraps ErrInvalidConfig, not err.
func urlError(url string, err error) error {
	why := ""
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		// "cannot parse `<url>`: <reason> (<cause>)"; cut at the last
		// "`: ", so that nothing of the URL can be left in.
		if i := strings.LastIndex(pe.Error(), "`: "); i >= 0 {
			why = ": " + unquoteParts(pe.Error()[i+len("`: "):])
		}
	}
	hint := ""
	if strings.TrimSpace(url) != url {
		hint = "; it begins or ends with white space (a newline from a secret file?)"
	}
	return fmt.Errorf("%w: postgres.url cannot be used as a postgres:// URL or key=value connection string%s%s "+
		"(the PG* environment variables, such as PGSSLMODE, and the files it names count too)", ErrInvalidConfig, why, hint)
}

// unquoteParts replaces what s quotes ("...") with "…", but for a single
// character: pgx's reasons quote the input they stumbled on, which may be
// a piece of a password (missing "=" after "horse" from password=correct
// horse; a percent escape in a password with a '/' that pgx took for the
// database name).
func unquoteParts(s string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		j := strings.IndexByte(s[i+1:], '"')
		if j < 0 {
			b.WriteString(s[:i]) // an unmatched quote: drop the rest
			return b.String()
		}
		b.WriteString(s[:i+1])
		if q := s[i+1 : i+1+j]; utf8.RuneCountInString(q) == 1 {
			b.WriteString(q)
		} else {
			b.WriteString("…")
		}
		b.WriteByte('"')
		s = s[i+1+j+1:]
	}
}

package config

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"time"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/telemetry"
)

// ErrInvalidConfig is wrapped by every error that a bad value causes here
// (the sections' Validate methods wrap their own ErrInvalidConfig sentinels).
var ErrInvalidConfig = errors.New("invalid config")

// Config is the whole configuration of one jetsink process.
type Config struct {
	NATS      consumer.Config `yaml:"nats"`
	Pipeline  pipeline.Config `yaml:"pipeline"`
	Postgres  Postgres        `yaml:"postgres"`
	Telemetry Telemetry       `yaml:"telemetry"`
	Log       Log             `yaml:"log"`
	// DrainTimeout bounds the graceful drain after SIGTERM/SIGINT: stop
	// pulling, empty the rings, commit and ack the last batch. Past it the
	// process gives up; nothing uncommitted is acked. Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// MemoryLimit paces the Go garbage collector of "jetsink run".
	// "auto" (MemoryLimitAuto, the default) adjusts GOGC after every
	// collection so that the next one starts when the heap reaches 32MiB,
	// or 1.5x the live heap if that is more: the collector runs far less
	// often than Go's default on jetsink's small heap, and up to twice as
	// often with a large one, to hold memory down; under a cgroup's memory
	// limit (a container's) it also sets Go's soft memory limit to 90% of
	// it less 24MiB, at least 16MiB, as a backstop. A size is
	// Go's soft memory limit (debug.SetMemoryLimit: heap, stacks and
	// runtime data; not the binary's own pages) with GOGC 400 under it: the
	// tightest bound on memory, but near it the collector works harder, up
	// to half the CPU, and past it memory grows rather than the process
	// failing. 0: Go's
	// defaults (no limit, GOGC 100). The GOMEMLIMIT and GOGC environment
	// variables override this key. "auto", 0, or a size in bytes or e.g.
	// 48MiB.
	MemoryLimit int64 `yaml:"memory_limit"`
}

// Postgres is the sink's configuration plus the column mapping.
type Postgres struct {
	sink.Config `yaml:",inline"`
	// Columns maps event values to table columns; empty means raw mode
	// (pipeline.RawColumns).
	Columns []pipeline.Column `yaml:"columns"`
}

// Telemetry configures traces, metrics and the admin listener.
type Telemetry struct {
	// ServiceName is the traces' and metrics' service.name (default
	// jetsink); OTEL_SERVICE_NAME overrides it.
	ServiceName string `yaml:"service_name"`
	// OTLPEndpoint is the collector's base URL: http(s)://host:4318 for
	// OTLP/HTTP, grpc(s)://host:4317 for OTLP/gRPC. Empty: the standard
	// OTEL_EXPORTER_OTLP_* variables decide; with none, tracing is off.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// SampleRatio is the share of messages without a traceparent that are
	// traced (0..1, default 1); the others follow their publisher's choice.
	// OTEL_TRACES_SAMPLER, when set, decides instead (see telemetry).
	SampleRatio float64 `yaml:"sample_ratio"`
	// Listen is the admin listener (/healthz, /readyz, /metrics); empty
	// turns it off. Default 127.0.0.1:9464.
	Listen string `yaml:"listen"`
	// Pprof also serves Go's profiles under /debug/pprof/ on the admin
	// listener (CPU, heap, allocations, goroutines). Off by default: a
	// profile costs CPU while it runs and the heap one shows event data.
	Pprof bool `yaml:"pprof"`
}

// Log configures log/slog output.
type Log struct {
	Level  string `yaml:"level"`  // debug | info | warn | error
	Format string `yaml:"format"` // text | json
}

// MemoryLimitAuto is Config.MemoryLimit for memory_limit: auto (the
// default): GOGC paced for a small heap; see Config.MemoryLimit.
const MemoryLimitAuto = -1

// Default returns the configuration used for every key the file, the
// environment and the flags leave unset.
func Default() Config {
	return Config{
		NATS:     consumer.DefaultConfig(),
		Pipeline: pipeline.DefaultConfig(),
		Postgres: Postgres{Config: sink.DefaultConfig()},
		Telemetry: Telemetry{
			ServiceName: "jetsink",
			SampleRatio: 1.0,
			Listen:      "127.0.0.1:9464",
		},
		Log:          Log{Level: "info", Format: "text"},
		DrainTimeout: 30 * time.Second,
		MemoryLimit:  MemoryLimitAuto,
	}
}

// Columns returns the effective mapping: the configured columns, or raw
// mode's when none are configured.
func (c *Config) Columns() []pipeline.Column {
	if len(c.Postgres.Columns) == 0 {
		return pipeline.RawColumns()
	}
	return c.Postgres.Columns
}

// Validate checks every section and the rules that span sections. It
// returns every problem found, joined (errors.Join; Problems splits them),
// each wrapping ErrInvalidConfig or the section's sentinel.
func (c *Config) Validate() error {
	var errs []error
	errs = append(errs, Problems(c.NATS.Validate())...)
	errs = append(errs, Problems(c.Pipeline.Validate())...)
	errs = append(errs, Problems(c.Postgres.Config.Validate())...)
	if _, err := pipeline.Compile(c.Columns()); err != nil {
		for _, e := range Problems(err) { // one per column at fault
			if ce := (*pipeline.ColumnError)(nil); errors.As(e, &ce) {
				errs = append(errs, fmt.Errorf("%w: postgres.columns[%d] (%q): %s", ErrInvalidConfig, ce.Index, ce.Name, ce.Reason))
				continue
			}
			errs = append(errs, fmt.Errorf("%w: postgres.columns: %w", ErrInvalidConfig, e))
		}
	}
	if c.Postgres.Mode == sink.ExactlyOnce {
		if p := sink.ExactlyOnceKeyProblem(c.Columns()); p != "" {
			errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidConfig, p))
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("%w: log.level must be debug, info, warn or error, not %q", ErrInvalidConfig, c.Log.Level))
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("%w: log.format must be text or json, not %q", ErrInvalidConfig, c.Log.Format))
	}
	if c.Telemetry.ServiceName == "" {
		// Only when written so (the default is jetsink): an empty
		// variable (compose's ${VAR:-}) would otherwise become jetsink,
		// unsaid, as postgres.app_name refuses it.
		errs = append(errs, fmt.Errorf("%w: telemetry.service_name must not be empty (default jetsink; OTEL_SERVICE_NAME overrides it)", ErrInvalidConfig))
	}
	if !(c.Telemetry.SampleRatio >= 0 && c.Telemetry.SampleRatio <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("%w: telemetry.sample_ratio must be between 0 and 1, not %g", ErrInvalidConfig, c.Telemetry.SampleRatio))
	}
	if l := c.Telemetry.Listen; l != "" {
		// Checked here rather than when run binds it, after connecting
		// to NATS and PostgreSQL; check says so too.
		_, port, err := net.SplitHostPort(l)
		if err == nil {
			_, err = strconv.ParseUint(port, 10, 16)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: telemetry.listen must be host:port with a port from 0 to 65535, e.g. 127.0.0.1:9464 or :9464, or empty for none, not %q", ErrInvalidConfig, l))
		}
	}
	if err := telemetry.CheckEndpoint(c.Telemetry.OTLPEndpoint); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidConfig, err))
	}
	if c.MemoryLimit < MemoryLimitAuto || (c.MemoryLimit > 0 && c.MemoryLimit < 16<<20) {
		errs = append(errs, fmt.Errorf("%w: memory_limit must be auto, 0 (none) or at least 16MiB (got %d bytes); jetsink's runtime alone needs ~10MiB", ErrInvalidConfig, c.MemoryLimit))
	}
	if c.DrainTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%w: drain_timeout must be positive (e.g. 30s)", ErrInvalidConfig))
	}
	return errors.Join(errs...)
}

// Problems returns the problems an error of Validate or Load joins, each
// one line, in the order found: err's parts if errors.Join made
// it (theirs too, if joined in turn), else err alone; none for nil.
func Problems(err error) []error {
	if err == nil {
		return nil
	}
	// Only errors.Join's: fmt.Errorf with two %w ("%w: postgres.columns:
	// %w") unwraps to a list too, but it is one problem, and its parts
	// alone lose the message.
	j, ok := err.(interface{ Unwrap() []error })
	if !ok || reflect.TypeOf(err) != joinType {
		return []error{err}
	}
	var errs []error
	for _, e := range j.Unwrap() {
		errs = append(errs, Problems(e)...)
	}
	return errs
}

var joinType = reflect.TypeOf(errors.Join(errors.New("")))

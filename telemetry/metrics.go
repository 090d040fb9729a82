package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/jetsink/jetsink/pipeline"
)

// Metrics owns the meter provider whose only reader is a Prometheus
// exporter on a registry of its own; Handler serves it. The instruments
// recorded on the hot path are created once here; everything the stages
// already count (consumer.Stats, sink.Stats, ...) is read by observable
// instruments at scrape time instead (see Observe). Safe for concurrent use;
// a nil *Metrics records nothing.
type Metrics struct {
	mp      *sdkmetric.MeterProvider
	meter   metric.Meter
	handler http.Handler
	service string // the resource's service.name

	batchRows    metric.Int64Histogram
	batchBytes   metric.Int64Histogram
	commitDur    metric.Float64Histogram
	latency      *eventLatency
	deadLettered metric.Int64Counter
}

// NewMetrics builds the meter provider and the hot-path instruments.
// Errors are the SDK's, wrapped.
func NewMetrics(service string) (*Metrics, error) {
	reg := prometheus.NewRegistry()
	// The process's (RSS, open file descriptors) and the Go runtime's
	// (go_goroutines, the heap).
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	// When this process started, read once: process_start_time_seconds is
	// worked out from the boot time at each scrape, and moves when the
	// clock is stepped (an alert counting its changes as restarts would
	// fire).
	started := prometheus.NewGauge(prometheus.GaugeOpts{Name: "jetsink_start_time_seconds",
		Help: "When this jetsink process started, in seconds since the Unix epoch: each change is a restart"})
	started.Set(float64(time.Now().UnixMilli()) / 1e3)
	reg.MustRegister(started)
	latency := newEventLatency()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithProducer(latency))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	res, err := newResource(service)
	if err != nil {
		return nil, err
	}
	m := &Metrics{
		mp:      sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)),
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		latency: latency,
		service: serviceName(res),
	}
	m.meter = m.mp.Meter(Scope)
	seconds := metric.WithExplicitBucketBoundaries(latencyBounds[:]...)
	var errs [4]error
	m.batchRows, errs[0] = m.meter.Int64Histogram("jetsink.batch.rows",
		metric.WithDescription("Rows per committed batch (one COPY transaction)"), metric.WithUnit("{row}"),
		metric.WithExplicitBucketBoundaries(1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000))
	m.batchBytes, errs[1] = m.meter.Int64Histogram("jetsink.batch.size",
		metric.WithDescription("Bytes of binary COPY tuples per committed batch"), metric.WithUnit("By"),
		metric.WithExplicitBucketBoundaries(1<<10, 16<<10, 64<<10, 256<<10, 1<<20, 4<<20, 16<<20, 64<<20))
	m.commitDur, errs[2] = m.meter.Float64Histogram("jetsink.commit.duration",
		metric.WithDescription("Duration of the statements that committed a batch: the COPY (at-least-once, autocommit), or BEGIN, COPY, INSERT, COMMIT (exactly-once)"), metric.WithUnit("s"), seconds)
	m.deadLettered, errs[3] = m.meter.Int64Counter("jetsink.events.dead_lettered",
		metric.WithDescription("Events parked on the dead-letter subject, by stage and reason code"), metric.WithUnit("{event}"))
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("metric instrument: %w", err)
		}
	}
	// Every stage and code from 0: a pair's first dead letter is then an
	// increase to Prometheus (a series that begins at 1 is not, and an
	// alert that looks for new series fires after any gap in the scrapes).
	for _, k := range pipeline.DeadLetterKinds() {
		m.deadLettered.Add(context.Background(), 0, metric.WithAttributes(stageAttr(k.Stage), codeAttr(k.Code)))
	}
	return m, nil
}

// Handler serves the metrics in the Prometheus text format (/metrics).
func (m *Metrics) Handler() http.Handler { return m.handler }

// Meter is jetsink's meter, for observable instruments.
func (m *Metrics) Meter() metric.Meter { return m.meter }

// ServiceName is the service.name of the metrics' resource (target_info),
// and of the spans' when NewTracing is given the same Config.ServiceName
// (both resources come from newResource): the name NewMetrics was given
// ("jetsink" when empty) unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES names another. "" for a nil *Metrics.
func (m *Metrics) ServiceName() string {
	if m == nil {
		return ""
	}
	return m.service
}

// Shutdown stops the meter provider: callbacks are unregistered and
// scrapes return nothing more. It returns the SDK's error.
func (m *Metrics) Shutdown(ctx context.Context) error {
	if m == nil {
		return nil
	}
	if err := m.mp.Shutdown(ctx); err != nil {
		return fmt.Errorf("shut down metrics: %w", err)
	}
	return nil
}

// BatchCommitted records one committed batch: its rows and bytes, how long
// the committing transaction took, and for each row the time from its
// JetStream publish to committed, when the transaction committed (not
// when this is called: the acks written since are not the commit's). It
// allocates nothing.
func (m *Metrics) BatchCommitted(ctx context.Context, rows []pipeline.Row, bytes int, took time.Duration, committed time.Time) {
	if m == nil || len(rows) == 0 {
		return
	}
	m.batchRows.Record(ctx, int64(len(rows)))
	m.batchBytes.Record(ctx, int64(bytes))
	m.commitDur.Record(ctx, took.Seconds())
	m.latency.record(committed, rows)
}

// DeadLettered counts one event parked by stage with reason code.
func (m *Metrics) DeadLettered(ctx context.Context, stage, code string) {
	if m == nil {
		return
	}
	m.deadLettered.Add(ctx, 1, metric.WithAttributes(stageAttr(stage), codeAttr(code)))
}

// Cached is a value fetched at most once per TTL however often it is read:
// the JetStream lag gauges read it at every scrape without sending a
// request to the server each time. After the TTL, the first reader
// fetches and every reader meanwhile waits for that one fetch, at most its
// timeout (so a slow server costs one request, not one per scrape). Safe
// for concurrent use.
type Cached[T any] struct {
	TTL     time.Duration
	Timeout time.Duration
	Fetch   func(ctx context.Context) (T, error)

	mu      sync.Mutex
	tried   time.Time // the last fetch
	fetched time.Time // the last fetch that succeeded: val's time
	val     T
	err     error
}

// Get returns the cached value and the time it was fetched, refreshing it
// when the last fetch is older than TTL. When that fetch failed it returns
// the last good value (the zero time and value when there is none) and the
// fetch's error.
func (c *Cached[T]) Get(ctx context.Context) (T, time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.tried.IsZero() && time.Since(c.tried) < c.TTL {
		return c.val, c.fetched, c.err
	}
	fctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	v, err := c.Fetch(fctx)
	c.tried, c.err = time.Now(), err
	if err == nil {
		c.val, c.fetched = v, c.tried
	}
	return c.val, c.fetched, c.err
}

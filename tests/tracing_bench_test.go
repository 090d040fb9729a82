package tests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// BenchmarkTracingThroughput is jetsink end to end (JetStream -> workers ->
// COPY -> ack) on a preloaded stream of events without a traceparent, with
// tracing off, at sample_ratio 0.01 and at 1, exporting OTLP/HTTP to an
// in-process collector that discards the spans. Each op drains one preloaded
// stream per variant, in rotating order, and reports each variant's drain
// rate (<variant>-events/s), so that -count runs interleave the variants on
// a noisy machine:
//
//	go test -run '^$' -bench TracingThroughput -benchtime 1x -count 6 ./tests
func BenchmarkTracingThroughput(b *testing.B) {
	const events = 40000
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	ns := testenv.NATS(b)
	nc := ns.Connect(b)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	pg := testenv.Postgres(b)
	variants := []struct {
		name  string
		ratio float64 // < 0: tracing off
	}{{"off", -1}, {"ratio0.01", 0.01}, {"ratio1", 1}}
	b.ReportMetric(0, "ns/op")
	for range b.N {
		// Rotate the order so that no variant always runs first.
		r := int(round.Add(1))
		for k := range variants {
			v := variants[(r+k)%len(variants)]
			rate := drainRate(b, ns.URL(), nc, js, pg.URL, collector.URL, v.ratio, events)
			b.ReportMetric(rate, v.name+"-events/s")
		}
	}
}

// round rotates BenchmarkTracingThroughput's order across -count runs.
var round atomic.Int64

// drainRate preloads events into a new stream and returns the rate at
// which a fresh processor commits them all.
func drainRate(b *testing.B, natsURL string, nc *nats.Conn, js jetstream.JetStream, pgURL, collector string, ratio float64, events int) float64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := uniq.Add(1)
	stream, prefix, table := fmt.Sprintf("TB_%d", n), fmt.Sprintf("tb%d", n), fmt.Sprintf("tbench_%d", n)
	// consumer.CreateStream: the variant before deleted the account's only
	// streams just now, which nats-server may refuse a create after.
	if _, err := consumer.CreateStream(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), stream) }()
	if _, err := consumer.CreateStream(ctx, js, jetstream.StreamConfig{Name: stream + "_DLQ", Subjects: []string{"dlq." + stream}}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), stream+"_DLQ") }()
	// No traceparent: jetsink samples the events as roots, at the ratio
	// under test (an unsampled parent would decide for it).
	if res, err := loadgen.Publish(ctx, nc, loadgen.Options{Subject: prefix, Subjects: 100, Events: events, Run: uint64(n),
		NoTraceContext: true}); err != nil {
		b.Fatalf("preload: %+v: %v", res, err)
	}
	cfg := config.Default()
	cfg.NATS.URL = natsURL
	cfg.NATS.Stream, cfg.NATS.Consumer = stream, "jetsink"
	cfg.NATS.DeadLetterSubject = "dlq." + stream
	cfg.Postgres.URL, cfg.Postgres.Table, cfg.Postgres.CreateTable = pgURL, table, true
	cfg.Postgres.Mode = sink.AtLeastOnce
	cfg.Postgres.Columns = loadgen.Columns()
	cfg.Telemetry.Listen = ""
	cfg.Telemetry.ServiceName = "jetsink-bench"
	if ratio >= 0 {
		cfg.Telemetry.OTLPEndpoint = collector
		cfg.Telemetry.SampleRatio = ratio
	}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	p, err := processor.New(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	db, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close(context.Background())
	intake, stopIntake := context.WithCancel(ctx)
	done := make(chan error, 1)

	start := time.Now()
	go func() { done <- p.Run(intake, ctx) }()
	for p.Sink().Stats().Rows < uint64(events) {
		select {
		case err := <-done:
			b.Fatalf("processor stopped: %v", err)
		case <-ctx.Done():
			b.Fatalf("not drained: %d of %d rows", p.Sink().Stats().Rows, events)
		case <-time.After(2 * time.Millisecond):
		}
	}
	took := time.Since(start)
	stopIntake()
	if err := <-done; err != nil {
		b.Fatalf("Run: %v", err)
	}
	_, _ = db.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{table}.Sanitize())
	return float64(events) / took.Seconds()
}

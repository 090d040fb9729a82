package telemetry

import (
	"context"
	"math"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/jetsink/jetsink/pipeline"
)

// scrape returns /metrics' sample lines by name (labels included).
func scrape(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	out := map[string]float64{}
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestEventLatencyMatchesTheSDK records the same latencies into
// jetsink.event.latency and into an SDK histogram with the same bounds, and
// compares what /metrics shows for the two: every bucket, the count and the
// sum. The values include each bound exactly (it counts in its own bucket),
// just above it, negatives (clock skew), values above the last bound, and
// rows without a publish time (not counted), spread over several batches.
func TestEventLatencyMatchesTheSDK(t *testing.T) {
	m, err := NewMetrics("test")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Shutdown(context.Background()) }()
	sdk, err := m.meter.Float64Histogram("jetsink.test.sdk_latency", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(latencyBounds[:]...))
	if err != nil {
		t.Fatal(err)
	}
	var ds []time.Duration
	for _, b := range latencyBounds {
		d := time.Duration(math.Round(b * 1e9))
		ds = append(ds, d, d+1, d-1)
	}
	ds = append(ds, 0, -time.Millisecond, 90*time.Second, 1234567*time.Microsecond)
	now := time.Now()
	var rows []pipeline.Row
	for i, d := range ds {
		rows = append(rows, pipeline.Row{Event: pipeline.Event{Published: now.Add(-d)}})
		sdk.Record(context.Background(), max(d, 0).Seconds()) // a negative age counts as none (TestEventLatencyFromAClockAhead)
		if i%3 == 0 {
			rows = append(rows, pipeline.Row{}) // no publish time
		}
		if i%10 == 9 {
			m.latency.record(now, rows)
			rows = rows[:0]
		}
	}
	m.latency.record(now, rows)

	got := scrape(t, m)
	const ours, theirs = "jetsink_event_latency_seconds", "jetsink_test_sdk_latency_seconds"
	n := 0
	for k, v := range got {
		if !strings.HasPrefix(k, ours) {
			continue
		}
		n++
		want, ok := got[theirs+strings.TrimPrefix(k, ours)]
		if !ok {
			t.Errorf("%s: no such sample for the SDK histogram", k)
			continue
		}
		if strings.HasPrefix(k, ours+"_sum") {
			if math.Abs(v-want) > 1e-9*math.Abs(want) {
				t.Errorf("%s = %v, the SDK's %v", k, v, want)
			}
			continue
		}
		if v != want {
			t.Errorf("%s = %v, the SDK's %v", k, v, want)
		}
	}
	if want := len(latencyBounds) + 1 + 2; n != want {
		t.Errorf("%d samples of %s, want %d (buckets, +Inf, count, sum): %v", n, ours, want, got)
	}
	for k, v := range got {
		if strings.HasPrefix(k, ours+"_count") && v != float64(len(ds)) {
			t.Errorf("%s = %v, want %d", k, v, len(ds))
		}
	}
}

// BenchmarkBatchCommitted is the per-row cost of recording a committed
// batch's latencies: "sdk" is the SDK histogram's Record for every row (what
// BatchCommitted did before), "batched" is eventLatency.record.
func BenchmarkBatchCommitted(b *testing.B) {
	m, err := NewMetrics("bench")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = m.Shutdown(context.Background()) }()
	sdk, err := m.meter.Float64Histogram("jetsink.bench.sdk_latency", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(latencyBounds[:]...))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	rows := make([]pipeline.Row, 5000)
	for i := range rows {
		rows[i].Event.Published = now.Add(-time.Duration(i) * 3 * time.Millisecond)
	}
	b.ReportAllocs()
	b.Run("sdk", func(b *testing.B) {
		for b.Loop() {
			for i := range rows {
				sdk.Record(context.Background(), now.Sub(rows[i].Event.Published).Seconds())
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rows)), "ns/row")
	})
	b.Run("batched", func(b *testing.B) {
		for b.Loop() {
			m.latency.record(now, rows)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rows)), "ns/row")
	})
}

// TestEventLatencySumDoesNotWrap: a backfill batch of month-old rows sums
// to more than a time.Duration holds (~292 years); the sum must not wrap.
func TestEventLatencySumDoesNotWrap(t *testing.T) {
	h := newEventLatency()
	now := time.Now()
	const age, n = 30 * 24 * time.Hour, 5000
	rows := make([]pipeline.Row, n)
	for i := range rows {
		rows[i].Event.Published = now.Add(-age)
	}
	h.record(now, rows)
	if want := n * age.Seconds(); math.Abs(h.sum-want) > 1e-9*want || h.count != n || h.counts[len(latencyBounds)] != n {
		t.Fatalf("sum %v s, count %d, +Inf bucket %d; want %v s, %d, %d", h.sum, h.count, h.counts[len(latencyBounds)], want, n, n)
	}
}

// An event published "after" it was committed (the server's clock runs
// ahead of jetsink's) counts as no latency: a negative one in the sum
// would hide the age of the others.
func TestEventLatencyFromAClockAhead(t *testing.T) {
	h := newEventLatency()
	now := time.Now()
	rows := make([]pipeline.Row, 2)
	rows[0].Event.Published = now.Add(time.Hour)
	rows[1].Event.Published = now.Add(-time.Second)
	h.record(now, rows)
	if h.sum != 1 || h.count != 2 || h.counts[0] != 1 {
		t.Fatalf("sum %v s, count %d, first bucket %d; want 1 s, 2, 1", h.sum, h.count, h.counts[0])
	}
}

package telemetry

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/jetsink/jetsink/pipeline"
)

// latencyBounds are the bucket boundaries of jetsink's duration
// histograms, in seconds.
var latencyBounds = [...]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// eventLatency is the histogram jetsink.event.latency: one value per
// committed row, publish to commit. The SDK's histogram pays an attribute
// lookup, a lock and a search for every value; at one value per row that
// was ~4% of jetsink's CPU in a drain, on the committing goroutine. This
// one counts a whole batch into local buckets and adds them under one lock,
// and the Prometheus exporter reads it as an external metric Producer, so
// /metrics shows it as before: same name, unit, scope and buckets, a
// cumulative histogram with the SDK's bucket rule (a value equal to a bound
// counts in that bound's bucket). Two differences: the series is there,
// all zero, from the start (the SDK's appeared with the first value), and
// a Producer belongs to one reader, so a metric reader added besides the
// Prometheus exporter would have to be given it too. Safe for concurrent
// use.
type eventLatency struct {
	start  time.Time
	limits [len(latencyBounds)]time.Duration // latencyBounds as durations

	mu     sync.Mutex
	counts [len(latencyBounds) + 1]uint64
	count  uint64
	sum    float64 // seconds
}

func newEventLatency() *eventLatency {
	h := &eventLatency{start: time.Now()}
	for i, b := range latencyBounds {
		h.limits[i] = time.Duration(math.Round(b * float64(time.Second)))
	}
	return h
}

// bucket is the index of the first bound >= d, len(limits) above them all.
func (h *eventLatency) bucket(d time.Duration) int {
	lo, hi := 0, len(h.limits)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if h.limits[mid] < d {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// record adds now minus the JetStream publish time of every row that has
// one.
func (h *eventLatency) record(now time.Time, rows []pipeline.Row) {
	var (
		counts [len(latencyBounds) + 1]uint64
		n      uint64
		sum    float64 // seconds, as the SDK sums: a Duration would wrap
	)
	for i := range rows {
		p := rows[i].Event.Published
		if p.IsZero() {
			continue
		}
		// A server clock ahead of this one's gives a negative age:
		// counted as none, not subtracted from the sum, which would hide
		// the age of other events.
		d := max(now.Sub(p), 0)
		counts[h.bucket(d)]++
		n++
		sum += d.Seconds()
	}
	if n == 0 {
		return
	}
	h.mu.Lock()
	for i, c := range counts {
		h.counts[i] += c
	}
	h.count += n
	h.sum += sum
	h.mu.Unlock()
}

// Produce is the metric.Producer the exporter reads at every scrape.
func (h *eventLatency) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	dp := metricdata.HistogramDataPoint[float64]{
		StartTime: h.start,
		Time:      time.Now(),
		Bounds:    slices.Clone(latencyBounds[:]), // the reader's own copy, as the SDK hands out
	}
	h.mu.Lock()
	dp.BucketCounts = append([]uint64(nil), h.counts[:]...)
	dp.Count = h.count
	dp.Sum = h.sum
	h.mu.Unlock()
	return []metricdata.ScopeMetrics{{
		Scope: instrumentation.Scope{Name: Scope},
		Metrics: []metricdata.Metrics{{
			Name:        "jetsink.event.latency",
			Description: "From the JetStream publish (stream store time) to the commit of the event's row",
			Unit:        "s",
			Data: metricdata.Histogram[float64]{
				Temporality: metricdata.CumulativeTemporality,
				DataPoints:  []metricdata.HistogramDataPoint[float64]{dp},
			},
		}},
	}}, nil
}

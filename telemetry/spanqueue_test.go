package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

// gateExporter holds every export until release is closed, then fails them
// all when fail is set. entered is closed when the first export begins.
type gateExporter struct {
	release chan struct{}
	entered chan struct{}
	once    sync.Once
	fail    bool
	mu      sync.Mutex
	got     int
}

func (g *gateExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	g.once.Do(func() { close(g.entered) })
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	g.mu.Lock()
	g.got += len(spans)
	g.mu.Unlock()
	if g.fail {
		return errors.New("collector refused")
	}
	return nil
}

func (*gateExporter) Shutdown(context.Context) error { return nil }

// A collector that takes nothing must not stall the spans' End (the
// workers' goroutines), not even after a Flush gave up waiting for it: the
// spans past the queue's room are dropped, counted, and logged once; those
// queued are exported when it answers.
func TestSpanQueueDropsWhenFullAndCounts(t *testing.T) {
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "8")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
	for _, fail := range []bool{false, true} {
		exp := &gateExporter{release: make(chan struct{}), entered: make(chan struct{}), fail: fail}
		var logs testenv.SyncBuffer
		tr, err := newTracing(exp, Config{ServiceName: "test", SampleRatio: 1, Log: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		end := func(k int) {
			for range k {
				ev := event(nil)
				ev.Span = tr.StartMessage(ev)
				EndMessage(&ev, "ack", nil)
			}
		}
		const n = 100
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			end(4) // a batch: the export that does not return
			<-exp.entered
			end(7) // the queue's room but one
			// The Flush's marker takes a place in the queue.
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			_ = tr.Flush(ctx)
			cancel()
			end(n - 11)
		}()
		select {
		case <-ended:
		case <-time.After(20 * time.Second):
			close(exp.release)
			t.Fatal("ending spans blocked behind an export that does not return")
		}
		st := tr.SpanStats()
		// The queue's 8, and the batch of 4 the exporter holds.
		if st.Ended != n || st.Dropped != n-12 {
			t.Fatalf("with the exporter stuck: %+v, want %d ended and %d dropped", st, n, n-12)
		}
		if c := strings.Count(logs.String(), "spans dropped"); c != 1 {
			t.Errorf("%d log lines about dropped spans, want 1 (at most one a minute):\n%s", c, logs.String())
		}
		close(exp.release)
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		st = tr.SpanStats()
		sent, failed := st.Exported, st.ExportFailed
		if fail {
			sent, failed = failed, sent
		}
		if failed != 0 || sent != n-st.Dropped || int(sent) != exp.got {
			t.Errorf("fail %v: %+v after Shutdown, the exporter got %d", fail, st, exp.got)
		}
		if !strings.Contains(logs.String(), "spans not exported") {
			t.Errorf("Shutdown did not log the spans lost:\n%s", logs.String())
		}
	}
}

func TestSamplerFromEnv(t *testing.T) {
	for _, c := range []struct {
		sampler, arg string
		ratio        float64
		parentBased  bool
		bad          bool
	}{
		{"always_on", "", 1, false, false},
		{"always_off", "", 0, false, false},
		{"traceidratio", "0.25", 0.25, false, false},
		{"traceidratio", "", 1, false, false},
		{"parentbased_always_on", "", 1, true, false},
		{"parentbased_always_off", "", 0, true, false},
		{"parentbased_traceidratio", "0.01", 0.01, true, false},
		{"parentbased_traceidratio", "1.5", 0, false, true},
		{"traceidratio", "half", 0, false, true},
		{"jaeger_remote", "", 0, false, true},
		{"parentbased_xray", "", 0, false, true},
	} {
		t.Setenv("OTEL_TRACES_SAMPLER", c.sampler)
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", c.arg)
		ratio, parentBased, set, err := samplerFromEnv()
		if c.bad {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%s %q: err %v, want ErrInvalidConfig", c.sampler, c.arg, err)
			}
			continue
		}
		if err != nil || !set || ratio != c.ratio || parentBased != c.parentBased {
			t.Errorf("%s %q: ratio %g parentBased %v set %v err %v, want %g %v", c.sampler, c.arg, ratio, parentBased, set, err, c.ratio, c.parentBased)
		}
	}
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	if _, _, set, err := samplerFromEnv(); set || err != nil {
		t.Errorf("unset: set %v err %v", set, err)
	}
}

// OTEL_TRACES_SAMPLER decides over telemetry.sample_ratio, and its forms
// without parentbased_ override a publisher's sampled flag (the span stays
// the publisher's child).
func TestSamplerFromEnvDecides(t *testing.T) {
	sampled := nats.Header{"traceparent": []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	unsampled := nats.Header{"traceparent": []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}}
	for _, c := range []struct {
		sampler string
		ratio   float64 // telemetry.sample_ratio, overridden
		h       nats.Header
		want    bool
	}{
		{"parentbased_traceidratio", 1, nil, false}, // ARG 0 below
		{"parentbased_always_off", 1, nil, false},
		{"parentbased_always_off", 1, sampled, true},
		{"parentbased_always_on", 0, unsampled, false},
		{"always_on", 0, unsampled, true},
		{"always_on", 0, nil, true},
		{"always_off", 1, sampled, false},
	} {
		t.Setenv("OTEL_TRACES_SAMPLER", c.sampler)
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
		exp := tracetest.NewInMemoryExporter()
		tr := newTestTracing(t, exp, c.ratio)
		ev := event(c.h)
		ev.Span = tr.StartMessage(ev)
		if got := ev.Span != nil; got != c.want {
			t.Errorf("%s, sample_ratio %g, headers %v: sampled %v, want %v", c.sampler, c.ratio, c.h, got, c.want)
			continue
		}
		if ev.Span == nil {
			continue
		}
		EndMessage(&ev, "ack", nil)
		if err := tr.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		spans := exp.GetSpans()
		if len(spans) != 1 || !spans[0].SpanContext.IsSampled() {
			t.Fatalf("%s: exported %v", c.sampler, spans)
		}
		if c.h != nil && spans[0].Parent.SpanID().String() != "b7ad6b7169203331" {
			t.Errorf("%s: parent %v, want the publisher's span", c.sampler, spans[0].Parent.SpanID())
		}
	}
}

// A batch span keeps at most its limit of links and says how many it left
// out, instead of growing past what a collector takes in one export.
func TestStartCopyBoundsLinks(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr := newTestTracing(t, exp, 1) // MaxLinks 1000
	tr.maxLinks = 128
	rows := make([]pipeline.Row, 130)
	for i := range rows {
		rows[i].Event = event(nil)
		rows[i].Event.Span = tr.StartMessage(rows[i].Event)
	}
	cp := tr.StartCopy("events", rows)
	EndCopy(cp, len(rows), 1000, 0, nil)
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var copySp *tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindClient {
			copySp = &s
		}
	}
	if copySp == nil {
		t.Fatal("no copy span exported")
	}
	if len(copySp.Links) != 128 || copySp.DroppedLinks != 0 {
		t.Errorf("%d links (%d dropped by the SDK), want 128", len(copySp.Links), copySp.DroppedLinks)
	}
	want := attribute.Int("jetsink.batch.links_dropped", 2)
	found := false
	for _, a := range copySp.Attributes {
		found = found || a == want
	}
	if !found {
		t.Errorf("copy span attributes %v lack %v", copySp.Attributes, want)
	}
	for i := range rows {
		rows[i].Event.EndSpan("ack", nil)
	}
	big, err := newTracing(discard{}, Config{ServiceName: "test", SampleRatio: 1, MaxLinks: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = big.Shutdown(context.Background()) }()
	if big.maxLinks != maxLinks {
		t.Errorf("MaxLinks 1<<20 kept %d links, want at most %d", big.maxLinks, maxLinks)
	}
}

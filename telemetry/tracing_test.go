package telemetry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/jetsink/jetsink/pipeline"
)

// discard is a span exporter that drops everything: the benchmarks measure
// jetsink's side, not a collector.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// shutSeen is an exporter whose shut is closed once its Shutdown has
// returned.
type shutSeen struct {
	sdktrace.SpanExporter
	shut chan struct{}
}

func newShutSeen(exp sdktrace.SpanExporter) *shutSeen {
	return &shutSeen{SpanExporter: exp, shut: make(chan struct{})}
}

func (s *shutSeen) Shutdown(ctx context.Context) error {
	defer close(s.shut)
	return s.SpanExporter.Shutdown(ctx)
}

func newTestTracing(t testing.TB, exp sdktrace.SpanExporter, ratio float64) *Tracing {
	t.Helper()
	tr, err := newTracing(exp, Config{ServiceName: "test", SampleRatio: ratio, MaxLinks: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr
}

func event(h nats.Header) pipeline.Event {
	return pipeline.Event{Subject: "events.dev1", Data: []byte(`{"id":1}`), Header: h, Stream: "EVENTS",
		StreamSeq: 42, Delivered: 1, Received: time.Now(), MsgID: "run-42"}
}

func TestInjectExtractRoundTrip(t *testing.T) {
	tr := newTestTracing(t, discard{}, 1)
	ctx, sp := tr.Tracer().Start(context.Background(), "publish")
	defer sp.End()
	h := nats.Header{}
	InjectTrace(ctx, h)
	if h.Get("traceparent") == "" {
		t.Fatalf("no traceparent header in %v", h)
	}
	got := trace.SpanContextFromContext(ExtractTrace(context.Background(), h))
	if got.TraceID() != sp.SpanContext().TraceID() || got.SpanID() != sp.SpanContext().SpanID() || !got.IsSampled() {
		t.Fatalf("extracted %v, want %v", got, sp.SpanContext())
	}
	// propagation.HeaderCarrier writes the canonical MIME key; jetsink
	// reads that too.
	h2 := nats.Header{}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h2))
	if _, ok := h2["Traceparent"]; !ok {
		t.Fatalf("HeaderCarrier wrote %v", h2)
	}
	if got := trace.SpanContextFromContext(ExtractTrace(context.Background(), h2)); got.SpanID() != sp.SpanContext().SpanID() {
		t.Fatalf("extracted from canonical keys: %v", got)
	}
}

// Headers taken over from another message (a forwarder's msg.Header) lose
// that message's traceparent and tracestate, in any case, when a span is
// injected; without a span they are left as they are.
func TestInjectTraceReplacesAnOldTrace(t *testing.T) {
	tr := newTestTracing(t, discard{}, 1)
	old := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	h := nats.Header{"Traceparent": {old}, "tracestate": {"v=stale"}, "Tracestate": {"w=stale"}, "Other": {"kept"}}
	InjectTrace(context.Background(), h)
	if len(h) != 4 {
		t.Fatalf("no span to inject, yet the headers changed: %v", h)
	}
	ctx, sp := tr.Tracer().Start(context.Background(), "forward")
	defer sp.End()
	InjectTrace(ctx, h)
	got := trace.SpanContextFromContext(ExtractTrace(context.Background(), h))
	if got.SpanID() != sp.SpanContext().SpanID() || got.TraceState().Len() != 0 {
		t.Errorf("extracted %v (tracestate %q), want the new span without a tracestate", got, got.TraceState())
	}
	if len(h) != 2 || h.Get("Other") != "kept" {
		t.Errorf("headers %v, want the new traceparent and Other", h)
	}
}

func TestStartMessageParentAndSampling(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := newTracing(exp, Config{ServiceName: "test", SampleRatio: 0, MaxLinks: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tr.Shutdown(context.Background()) }()

	// A sampled publisher: the message span is its child even at ratio 0.
	pub, err := newTracing(discard{}, Config{ServiceName: "pub", SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Shutdown(context.Background()) }()
	ctx, psp := pub.Tracer().Start(context.Background(), "send")
	h := nats.Header{}
	InjectTrace(ctx, h)
	psp.End()
	ev := event(h)
	ev.Span = tr.StartMessage(ev)
	if ev.Span == nil {
		t.Fatal("sampled parent: no span")
	}
	rows := []pipeline.Row{{Event: ev}, {Event: event(nil)}}
	cp := tr.StartCopy("events", rows)
	if cp == nil {
		t.Fatal("no copy span for a batch with a sampled message")
	}
	Acked(cp, 2, 0)
	EndMessage(&ev, "ack", nil)
	EndCopy(cp, rowsOf(2), 100, 1, nil)

	// An unsampled parent and a root at ratio 0: nothing.
	h2 := nats.Header{"traceparent": []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}}
	for _, e := range []pipeline.Event{event(h2), event(nil)} {
		e.Span = tr.StartMessage(e)
		if e.Span != nil {
			t.Fatalf("unsampled message got a span (headers %v)", e.Header)
		}
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans exported, want process and copy", len(spans))
	}
	proc, copySp := spans[0], spans[1]
	if proc.Name != "process" || proc.SpanKind != trace.SpanKindConsumer || proc.Parent.SpanID() != psp.SpanContext().SpanID() {
		t.Errorf("process span %q kind %v parent %v, want child of %v", proc.Name, proc.SpanKind, proc.Parent.SpanID(), psp.SpanContext().SpanID())
	}
	if copySp.Name != "copy events" || copySp.SpanKind != trace.SpanKindClient || len(copySp.Links) != 1 ||
		copySp.Links[0].SpanContext.SpanID() != proc.SpanContext.SpanID() {
		t.Errorf("copy span %q kind %v links %v", copySp.Name, copySp.SpanKind, copySp.Links)
	}
	// Whatever the case of the header's key (NATS headers are
	// case-sensitive; Extract reads any case, and so must the sampling).
	// The same headers read from the message's raw header block (Header
	// nil: consumer/wire's messages).
	for _, key := range []string{"traceparent", "TraceParent", "TRACEPARENT"} {
		for _, raw := range []bool{false, true} {
			ev := event(nats.Header{key: h["traceparent"]})
			if raw {
				ev.Msg, ev.Header = &rawMsg{h: ev.Header}, nil
			}
			if ev.Span = tr.StartMessage(ev); ev.Span == nil {
				t.Fatalf("sampled parent under the key %q (raw %v): no span", key, raw)
			}
			if got := ev.Span.SpanContext().TraceID(); got != psp.SpanContext().TraceID() {
				t.Fatalf("key %q (raw %v): trace %v, want the publisher's %v", key, raw, got, psp.SpanContext().TraceID())
			}
			ev.Span.End()
		}
	}
}

// rawMsg is a message whose headers are read through pipeline.RawHeader,
// as consumer/wire's are.
type rawMsg struct{ h nats.Header }

func (m *rawMsg) HeaderGet(key string) string {
	v, _ := m.HeaderLookup(key)
	return v
}

func (m *rawMsg) HeaderLookup(key string) (string, bool) {
	if v := m.h[key]; len(v) > 0 {
		return v[0], true
	}
	return "", false
}

// HeaderFold is Carrier.Get: the exact key first, then any case.
func (m *rawMsg) HeaderFold(key string) string { return Carrier(m.h).Get(key) }

func (m *rawMsg) HeaderFields() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for k, vs := range m.h {
			for _, v := range vs {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

func (*rawMsg) Ack() error                       { return nil }
func (*rawMsg) Nak() error                       { return nil }
func (*rawMsg) NakWithDelay(time.Duration) error { return nil }
func (*rawMsg) InProgress() error                { return nil }
func (*rawMsg) Term() error                      { return nil }
func (*rawMsg) TermWithReason(string) error      { return nil }

func TestDeadLettererEndsSpanAndCounts(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr := newTestTracing(t, exp, 1)
	m, err := NewMetrics("test")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Shutdown(context.Background()) }()
	fail := errors.New("publish failed")
	stale := fmt.Errorf("publish failed; not nak'ed: %w", pipeline.ErrStaleEpoch)
	const counted = `jetsink_events_dead_lettered_total{code="invalid_json",otel_scope_name="github.com/jetsink/jetsink",otel_scope_schema_url="",otel_scope_version="",stage="decode"}`
	// Every stage and code is served from 0, before its first dead letter:
	// an alert's increase() sees that one too.
	before := scrape(t, m)
	for _, k := range pipeline.DeadLetterKinds() {
		key := `jetsink_events_dead_lettered_total{code="` + k.Code + `",otel_scope_name="github.com/jetsink/jetsink",otel_scope_schema_url="",otel_scope_version="",stage="` + k.Stage + `"}`
		if got, ok := before[key]; !ok || got != 0 {
			t.Errorf("before any dead letter: %s = %v (served: %v), want 0", key, got, ok)
		}
	}
	for i, next := range []error{nil, fail, stale} {
		d := &DeadLetterer{Next: dlFunc(func() error { return next }), Metrics: m}
		ev := event(nil)
		ev.Span = tr.StartMessage(ev)
		if err := d.DeadLetter(context.Background(), &ev, pipeline.DeadLetter{Stage: "decode", Code: "invalid_json"}); !errors.Is(err, next) {
			t.Fatalf("DeadLetter = %v, want %v", err, next)
		}
		// Only the stored dead letter counts; the failed ones were nak'ed
		// or, their stream re-created, left alone.
		if got := scrape(t, m)[counted]; got != 1 {
			t.Fatalf("after dead letter %d (err %v): %s = %v, want 1", i+1, next, counted, got)
		}
	}
	_ = tr.Flush(context.Background())
	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3: %v", len(spans), spans)
	}
	for i, want := range []string{"dead_letter", "nak", "stale"} {
		sp := spans[i]
		var settle string
		for _, kv := range sp.Attributes {
			if kv.Key == "jetsink.settle" {
				settle = kv.Value.AsString()
			}
		}
		if sp.Status.Code.String() != "Error" || settle != want {
			t.Errorf("span %d: status %v, jetsink.settle %q; want Error, %q", i, sp.Status.Code, settle, want)
		}
	}
}

// Without a span too, every outcome of a dead letter ends the event's
// hold on the in-flight budget: a stored dead letter whose original was
// not terminated (its stream re-created) is settled by nothing else.
func TestDeadLettererReleasesWithoutSpan(t *testing.T) {
	fail := errors.New("publish failed")
	stale := fmt.Errorf("publish failed; not nak'ed: %w", pipeline.ErrStaleEpoch)
	for _, next := range []error{nil, fail, stale} {
		d := &DeadLetterer{Next: dlFunc(func() error { return next })}
		msg := &releaseMsg{}
		ev := pipeline.Event{Msg: msg, Subject: "events.a"}
		_ = d.DeadLetter(context.Background(), &ev, pipeline.DeadLetter{Stage: "decode", Code: "invalid_json"})
		if msg.released != 1 {
			t.Errorf("dead letter with error %v: released %d times, want once", next, msg.released)
		}
	}
}

// releaseMsg counts Release calls (pipeline.Releaser).
type releaseMsg struct {
	rawMsg
	released int
}

func (m *releaseMsg) Release() { m.released++ }

type dlFunc func() error

func (f dlFunc) DeadLetter(context.Context, *pipeline.Event, pipeline.DeadLetter) error { return f() }

// TestUnsampledAllocatesNothing: tracing on, an unsampled message (no
// traceparent and ratio 0, or a traceparent with the sampled flag clear)
// costs no allocation, and neither does its copy span or settling it.
func TestUnsampledAllocatesNothing(t *testing.T) {
	tr := newTestTracing(t, discard{}, 0)
	h := nats.Header{"traceparent": []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}}
	msgID := nats.Header{"Nats-Msg-Id": []string{"m1"}}
	upper := nats.Header{"Traceparent": h["traceparent"]}
	for i, hdr := range []nats.Header{nil, h, h, msgID, upper, {}} {
		ev := event(hdr)
		if i >= 2 { // read from the raw header block
			ev.Msg, ev.Header = &rawMsg{h: hdr}, nil
		}
		rows := []pipeline.Row{{Event: ev}}
		if n := testing.AllocsPerRun(1000, func() {
			rows[0].Event.Span = tr.StartMessage(rows[0].Event)
			if sp := tr.StartCopy("events", rows); sp != nil {
				t.Fatal("copy span for an unsampled batch")
			}
			EndMessage(&rows[0].Event, "ack", nil)
		}); n != 0 {
			t.Errorf("headers %v (raw: %v): %v allocations per unsampled event, want 0", hdr, i >= 2, n)
		}
	}
}

// BenchmarkTraceEvent is the per-event cost of the instrumented hot path:
// StartMessage on receipt, the batch's copy span (1000 rows, amortised),
// EndMessage on ack, for tracing off (no provider), on at 1% and at 100%
// (roots: messages without a traceparent), exporting through the batch
// processor to an exporter that drops the spans.
func BenchmarkTraceEvent(b *testing.B) {
	const batch = 1000
	for _, c := range []struct {
		name  string
		ratio float64
	}{{"off", -1}, {"ratio=0.01", 0.01}, {"ratio=1", 1}} {
		b.Run(c.name, func(b *testing.B) {
			var tr *Tracing
			if c.ratio >= 0 {
				tr = newTestTracing(b, discard{}, c.ratio)
			}
			rows := make([]pipeline.Row, batch)
			proto := event(nil)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; {
				n := min(batch, b.N-i)
				for j := range rows[:n] {
					rows[j].Event = proto
					rows[j].Event.Span = tr.StartMessage(rows[j].Event)
				}
				sp := tr.StartCopy("events", rows[:n])
				for j := range rows[:n] {
					EndMessage(&rows[j].Event, "ack", nil)
				}
				Acked(sp, n, 0)
				EndCopy(sp, rowsOf(n), n*200, 0, nil)
				i += n
			}
		})
	}
}

func ExampleInjectTrace() {
	msg := nats.NewMsg("events.dev1")
	// ctx carries the publisher's span (here a fixed one).
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
		SpanID:     trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	InjectTrace(ctx, msg.Header)
	fmt.Println(msg.Header.Get("traceparent"))
	// Output: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
}

func TestNewTracingEndpoints(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	ctx := context.Background()
	check := func(endpoint string, want bool) {
		t.Helper()
		tr, err := NewTracing(ctx, Config{OTLPEndpoint: endpoint, SampleRatio: 1})
		if err != nil {
			t.Fatalf("%q: %v", endpoint, err)
		}
		if tr.Enabled() != want {
			t.Errorf("%q (env %q): Enabled = %v, want %v", endpoint, os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), tr.Enabled(), want)
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_ = tr.Shutdown(sctx)
	}
	check("", false)
	check("http://127.0.0.1:1", true)
	check("grpc://127.0.0.1:1", true)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	check("", true)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	check("", true)
	for _, bad := range []string{"ftp://host", "127.0.0.1:4318", "http://", "http://user:pass@127.0.0.1:1"} {
		if _, err := NewTracing(ctx, Config{OTLPEndpoint: bad}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q: err = %v, want ErrInvalidConfig", bad, err)
		}
	}
	// The variables' credentials would be dropped the same way.
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(v, "https://user:s3cret@127.0.0.1:1")
		_, err := NewTracing(ctx, Config{SampleRatio: 1})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), v) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s with credentials: err = %v, want ErrInvalidConfig naming it, without the password", v, err)
		}
		t.Setenv(v, "https://127.0.0.1:1/?api_key=k")
		if _, err := NewTracing(ctx, Config{SampleRatio: 1}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), v) {
			t.Errorf("%s with a query: err = %v, want ErrInvalidConfig naming it", v, err)
		}
		// A password with a '/': url.Parse fails, and the exporter would
		// print the variable whole.
		t.Setenv(v, "https://user:ab/cd@127.0.0.1:1")
		if _, err := NewTracing(ctx, Config{SampleRatio: 1}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), v) ||
			strings.Contains(err.Error(), "ab/cd") {
			t.Errorf("%s that does not parse: err = %v, want ErrInvalidConfig naming it, without the password", v, err)
		}
		// No scheme: "otel-collector" would be the scheme, with no
		// host, and the HTTP exporter would post to https:///v1/traces;
		// gRPC takes host:port.
		t.Setenv(v, "otel-collector:4318")
		if _, err := NewTracing(ctx, Config{SampleRatio: 1}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), v) {
			t.Errorf("%s without a scheme: err = %v, want ErrInvalidConfig naming it", v, err)
		}
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", " grpc ")
		checkEnv := func(what string) {
			t.Helper()
			tr, err := NewTracing(ctx, Config{SampleRatio: 1})
			if err != nil || !tr.Enabled() {
				t.Fatalf("%s %s: %v (enabled %v), want tracing on", v, what, err, err == nil && tr.Enabled())
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_ = tr.Shutdown(sctx)
		}
		checkEnv("host:port with grpc")
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
		// White space around a value (a secret file's newline) is no
		// part of it, as the exporters read it.
		t.Setenv(v, " http://127.0.0.1:1\n")
		checkEnv("with white space")
		t.Setenv(v, "")
	}
	// A bad protocol names the variable it came from.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
	if _, err := NewTracing(ctx, Config{SampleRatio: 1}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
		t.Errorf("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL http/json: err = %v, want ErrInvalidConfig naming it", err)
	}
	// With telemetry.otlp_endpoint too, whatever its scheme: a typo or an
	// unsupported protocol is not taken for http/protobuf.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
	for _, v := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		for _, proto := range []string{"grcp", "http/json"} {
			t.Setenv(v, proto)
			for _, endpoint := range []string{"http://127.0.0.1:1", "grpc://127.0.0.1:1"} {
				tr, err := NewTracing(ctx, Config{OTLPEndpoint: endpoint, SampleRatio: 1})
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), v) {
					t.Errorf("%s %s with telemetry.otlp_endpoint %s: err = %v, want ErrInvalidConfig naming it", v, proto, endpoint, err)
				}
				if err == nil {
					_ = tr.Shutdown(ctx)
				}
			}
		}
		t.Setenv(v, "")
	}
}

// TestHeadersVariablesChecked: a part of OTEL_EXPORTER_OTLP_HEADERS (or
// ..._TRACES_HEADERS) that the exporters would skip, logging it whole to
// stderr, is refused without quoting it, whichever way the endpoint is
// given; well-formed headers pass.
func TestHeadersVariablesChecked(t *testing.T) {
	ctx := t.Context()
	for _, v := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		for _, c := range []struct{ val, secret, want string }{
			{"Authorization: Bearer s3cret", "s3cret", "part 1 (of 1, comma-separated) has no '='"},
			{"x-team=a,Authorization Bearer=s3cret", "s3cret", "part 2 (of 2, comma-separated) has a key that is not a header name"},
			{"Authorization=Bearer%zzs3cret", "s3cret", "part 1 (of 1, comma-separated) has a value that does not %-unescape"},
		} {
			t.Setenv(v, c.val)
			for _, endpoint := range []string{"http://127.0.0.1:1", ""} {
				t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", map[string]string{"": "http://127.0.0.1:1"}[endpoint])
				_, err := NewTracing(ctx, Config{OTLPEndpoint: endpoint, SampleRatio: 1})
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), v+": its "+c.want) || strings.Contains(err.Error(), c.secret) {
					t.Errorf("%s=%q, endpoint %q: err = %v, want ErrInvalidConfig with %q, without the secret", v, c.val, endpoint, err, c.want)
				}
			}
		}
		t.Setenv(v, "Authorization=Bearer%20s3cret, x-team = a,")
		tr, err := NewTracing(ctx, Config{OTLPEndpoint: "http://127.0.0.1:1", SampleRatio: 1})
		if err != nil {
			t.Fatalf("%s well formed: %v", v, err)
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_ = tr.Shutdown(sctx)
		cancel()
		t.Setenv(v, "")
	}
}

// TestCheckEndpointCredentials: an endpoint with userinfo is refused (the
// exporters would drop it and send no authentication) with a pointer to
// OTEL_EXPORTER_OTLP_HEADERS, and no error message quotes the credentials,
// whether the endpoint parses or not.
func TestCheckEndpointCredentials(t *testing.T) {
	for _, c := range []struct {
		endpoint, secret, want string // want: in the message
	}{
		{"https://user:s3cret@collector:4318", "s3cret", "OTEL_EXPORTER_OTLP_HEADERS"},
		{"grpcs://user:s3cret@collector:4317", "s3cret", "OTEL_EXPORTER_OTLP_HEADERS"},
		{"https://tok3n@collector:4318/v1/traces", "tok3n", "xxxxx@collector:4318/v1/traces"}, // the user name is the token
		{"https://user:s3cret@collector:4318?a=b@c", "s3cret", "xxxxx@c"},
		// A password or token with '/', '?' or '#' in it: url.Parse ends
		// the authority there, and what follows holds the '@'.
		{"https://user:ab/cd@collector:4318", "ab/cd", "xxxxx@collector:4318"},    // does not parse
		{"https://ab/cd@collector:4318", "ab/cd", "OTEL_EXPORTER_OTLP_HEADERS"},   // host "ab"
		{"https://tok#en@collector:4318", "tok#en", "OTEL_EXPORTER_OTLP_HEADERS"}, // host "tok"
		{"https://user:p?w@collector:4318", "p?w", "xxxxx@collector:4318"},        // does not parse
		{"http://collector:4318/a@b", "-", "OTEL_EXPORTER_OTLP_HEADERS"},
		{"ftp://user:s3cret@collector", "s3cret", "the scheme must be"},
		{"user:s3cret@collector:4318", "s3cret", "is not a URL"},          // read as scheme "user"
		{"http://user:s3cr%zt@collector:4318", "s3cr%zt", "is not a URL"}, // does not parse
		{"http://us@r:p@ss@collector:4318", "p@ss", "xxxxx@collector:4318"},
		// A query or fragment is dropped by the exporters too.
		{"https://collector:4318/v1/traces?api_key=k3y", "-", "ignore a query (?...) or fragment"},
		{"https://collector:4318?", "-", "ignore a query"},
		{"grpc://collector:4317#frag", "-", "ignore a query"},
	} {
		err := CheckEndpoint(c.endpoint)
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q: err = %v, want ErrInvalidConfig", c.endpoint, err)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, c.secret) || !strings.Contains(msg, c.want) {
			t.Errorf("%q: %q; want %q in it and not %q", c.endpoint, msg, c.want, c.secret)
		}
	}
	for _, ok := range []string{"", "http://127.0.0.1:4318", "https://collector:4318/otlp/v1/traces", "grpc://collector:4317"} {
		if err := CheckEndpoint(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}

// A collector that takes the connection and never answers holds neither
// Shutdown past its context (and stopGrace) nor, after it, any goroutine
// (TestMain's goleak): the export under way is cancelled.
func TestShutdownCancelsAHungExport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // read nothing, answer nothing
		}
	}()
	defer func() {
		ln.Close()
		<-accepted
		for _, c := range conns {
			c.Close()
		}
	}()
	exp, err := newExporter(context.Background(), "http://"+ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	seen := newShutSeen(exp)
	tr, ev := oneSpanEnded(t, seen)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := tr.Flush(ctx); err == nil {
		t.Fatal("Flush to a collector that never answers returned nil")
	}
	// Shutdown's own export of the spans still queued runs on the batch
	// processor's goroutine, under the processor's export timeout (30 s).
	ev.Span = tr.StartMessage(ev)
	EndMessage(&ev, "ack", nil)
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := tr.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want its context's deadline", err)
	}
	// Without the cancel, the export would hold on for the exporter's
	// timeout (10 s) and retries (a minute), until the connection closes.
	select {
	case <-seen.shut:
	default:
		t.Fatalf("the exporter is still exporting %v after Shutdown returned", time.Since(start))
	}
}

// A Shutdown whose context is already done (a second signal, say) still
// stops the batch processor and the exporter, at once: the SDK's own
// Shutdown gives up on a done context before it stops anything, and would
// never do it later (goleak, in VerifyNone and in TestMain, sees the
// processor's goroutine left).
func TestShutdownWithADoneContextStopsEverything(t *testing.T) {
	seen := newShutSeen(discard{})
	tr, _ := oneSpanEnded(t, seen)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := tr.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown = %v, want its context's error", err)
	}
	took := time.Since(start)
	select {
	case <-seen.shut:
	default:
		t.Fatalf("the exporter was not shut down (Shutdown took %v)", took)
	}
	if took >= stopGrace {
		t.Errorf("Shutdown took %v, the whole grace for a hung export, with nothing to wait for", took)
	}
	goleak.VerifyNone(t)
}

// A bad OTEL_TRACES_SAMPLER is refused before anything starts: no batch
// processor goroutine is left behind the error.
func TestBadSamplerStartsNothing(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "jaeger_remote")
	if _, err := newTracing(discard{}, Config{ServiceName: "test", SampleRatio: 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	goleak.VerifyNone(t)
}

// Message spans are named after the subject pattern a message came
// through, not its subject: subjects that carry an id would give the
// tracing backend one operation per id.
func TestMessageSpanNames(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := newTracing(exp, Config{ServiceName: "test", SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tr.Shutdown(context.Background()) }()
	tr.SetDestinations("EVENTS", []string{"orders.*.created", "events.>", "events.dev1"})
	cases := []struct{ subject, name, template string }{
		{"events.dev1", "process events.>", "events.>"}, // the first that matches
		{"events.dev2.temp", "process events.>", "events.>"},
		{"orders.42.created", "process orders.*.created", "orders.*.created"},
		{"orders.42.deleted", "process EVENTS", ""}, // none matches: the stream, no template
		{"events", "process EVENTS", ""},            // > needs a token
	}
	for _, c := range cases {
		ev := event(nil)
		ev.Subject = c.subject
		ev.Span = tr.StartMessage(ev)
		EndMessage(&ev, "ack", nil)
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != len(cases) {
		t.Fatalf("%d spans, want %d", len(spans), len(cases))
	}
	for i, c := range cases {
		sp := spans[i]
		var template, dest string
		for _, a := range sp.Attributes {
			switch a.Key {
			case "messaging.destination.template":
				template = a.Value.AsString()
			case "messaging.destination.name":
				dest = a.Value.AsString()
			}
		}
		if sp.Name != c.name || template != c.template || dest != c.subject {
			t.Errorf("subject %s: span %q, template %q, destination %q; want %q, %q, %q",
				c.subject, sp.Name, template, dest, c.name, c.template, c.subject)
		}
	}
}

// An invalid traceparent is dropped, whatever its sampled bit says: the
// message is sampled as a root is (here always, at ratio 1) and its span
// starts a new trace. A valid one with the bit clear is not sampled.
func TestInvalidTraceparentIsSampledAsARoot(t *testing.T) {
	tr := newTestTracing(t, discard{}, 1)
	for _, tc := range []struct {
		tp      string
		sampled bool
	}{
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", false},
		{"00-00000000000000000000000000000000-b7ad6b7169203331-00", true},    // trace id all zero
		{"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-00", true},    // span id all zero
		{"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", true},    // version ff
		{"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-00", true},    // upper-case hex
		{"00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-00", true},    // not hex
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0x", true},    // flags not hex
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-04", true},    // version 00 with unknown flags
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-x", true},  // version 00 with more fields
		{"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00x", true},   // flags not two characters
		{"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-x", false}, // a later version's field
	} {
		ev := event(nats.Header{"traceparent": []string{tc.tp}})
		sp := tr.StartMessage(ev)
		if (sp != nil) != tc.sampled {
			t.Errorf("%s: span %v, want sampled %v", tc.tp, sp != nil, tc.sampled)
			continue
		}
		if sp == nil {
			continue
		}
		if got := sp.SpanContext().TraceID().String(); got == tc.tp[3:35] {
			t.Errorf("%s: the span continues the invalid trace", tc.tp)
		}
		ev.Span = sp
		EndMessage(&ev, "ack", nil)
	}
}

// oneSpanEnded is newTestTracing on exp, sampling all, with the span of
// an event ended: one the batch processor holds for its exporter.
func oneSpanEnded(t *testing.T, exp sdktrace.SpanExporter) (*Tracing, pipeline.Event) {
	t.Helper()
	tr := newTestTracing(t, exp, 1)
	ev := event(nil)
	ev.Span = tr.StartMessage(ev)
	EndMessage(&ev, "ack", nil)
	return tr, ev
}

// A span keeps copies of the message's strings, not views of its buffer:
// consumer/wire's subject, reply (the stream's name) and headers alias the
// message's one allocation, payload and all, which a span waiting in the
// export queue would otherwise keep alive past the message's settling and
// outside max_in_flight_bytes. Overwriting the buffer after the span ended
// must not change what is exported.
func TestMessageSpanCopiesTheMessagesStrings(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr := newTestTracing(t, exp, 0)
	buf := []byte("events.dev1|EVENTS|run-42|vendor=abc")
	view := func(s string) string {
		i := bytes.Index(buf, []byte(s))
		return unsafe.String(&buf[i], len(s))
	}
	ev := pipeline.Event{Subject: view("events.dev1"), Stream: view("EVENTS"), MsgID: view("run-42"),
		Data: []byte(`{}`), StreamSeq: 1, Delivered: 1, Received: time.Now(),
		Msg: &rawMsg{h: nats.Header{
			"traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
			"tracestate":  {view("vendor=abc")},
		}}}
	ev.Span = tr.StartMessage(ev)
	if ev.Span == nil {
		t.Fatal("a sampled traceparent: no span")
	}
	EndMessage(&ev, "ack", nil)
	for i := range buf {
		buf[i] = 'x'
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	got := map[attribute.Key]string{}
	for _, a := range spans[0].Attributes {
		got[a.Key] = a.Value.String()
	}
	for k, want := range map[attribute.Key]string{"messaging.destination.name": "events.dev1",
		"messaging.nats.stream": "EVENTS", "messaging.message.id": "run-42"} {
		if got[k] != want {
			t.Errorf("%s = %q after the message's buffer was overwritten, want %q", k, got[k], want)
		}
	}
	if ts := spans[0].SpanContext.TraceState().String(); ts != "vendor=abc" {
		t.Errorf("tracestate %q after the message's buffer was overwritten, want vendor=abc", ts)
	}
}

// OTEL_SPAN_LINK_COUNT_LIMIT, when set, is the links a span keeps, lower or
// higher than MaxLinks (postgres.batch.max_rows): the user asked for it.
// Unset, MaxLinks decides (at least the SDK's 128); either way at most
// maxLinks. One that is not a number is refused, naming the variable.
func TestSpanLinkLimitVariable(t *testing.T) {
	for _, c := range []struct {
		env      string
		maxLinks int
		want     int
	}{
		{"", 1000, 1000},
		{"", 10, sdktrace.DefaultLinkCountLimit},
		{"", 1 << 20, maxLinks},
		{"5", 1000, 5},
		{" 5\n", 1000, 5},
		{"0", 1000, 0},
		{"2000", 1000, 2000},
		{"20000", 1000, maxLinks},
		{"-1", 1000, maxLinks}, // the SDK's "no limit"
	} {
		t.Setenv("OTEL_SPAN_LINK_COUNT_LIMIT", c.env)
		tr, err := newTracing(discard{}, Config{ServiceName: "test", SampleRatio: 1, MaxLinks: c.maxLinks})
		if err != nil {
			t.Fatalf("%q, MaxLinks %d: %v", c.env, c.maxLinks, err)
		}
		_ = tr.Shutdown(context.Background())
		if tr.maxLinks != c.want {
			t.Errorf("OTEL_SPAN_LINK_COUNT_LIMIT %q, MaxLinks %d: %d links, want %d", c.env, c.maxLinks, tr.maxLinks, c.want)
		}
	}

	// What a batch span and the SDK keep.
	t.Setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "5")
	exp := tracetest.NewInMemoryExporter()
	tr := newTestTracing(t, exp, 1) // MaxLinks 1000
	rows := make([]pipeline.Row, 8)
	links := make([]trace.Link, len(rows))
	for i := range rows {
		rows[i].Event = event(nil)
		rows[i].Event.Span = tr.StartMessage(rows[i].Event)
		links[i] = trace.Link{SpanContext: rows[i].Event.Span.SpanContext()}
	}
	cp := tr.StartCopy("events", rows)
	EndCopy(cp, rowsOf(len(rows)), 1000, 0, nil)
	_, sp := tr.Tracer().Start(context.Background(), "linked", trace.WithLinks(links...))
	sp.End()
	for i := range rows {
		rows[i].Event.EndSpan("ack", nil)
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindClient || s.Name == "linked" {
			got[s.Name] = len(s.Links)
		}
	}
	if got["copy events"] != 5 || got["linked"] != 5 {
		t.Errorf("links kept %v, want 5 on the batch span and on a span of Tracer", got)
	}

	t.Setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "lots")
	if _, err := newTracing(discard{}, Config{ServiceName: "test", SampleRatio: 1}); !errors.Is(err, ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "OTEL_SPAN_LINK_COUNT_LIMIT") {
		t.Errorf("OTEL_SPAN_LINK_COUNT_LIMIT lots: err = %v, want ErrInvalidConfig naming it", err)
	}
}

// OTEL_SDK_DISABLED is true only as "true" in any case (the specification:
// 1 or t is not); OTEL_TRACES_EXPORTER is a list in which none switches
// tracing off and otlp keeps it, and any other exporter, which jetsink
// would have replaced with OTLP, is refused naming the variable.
func TestStandardVariablesSwitchingTracing(t *testing.T) {
	ctx := context.Background()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	for _, c := range []struct {
		disabled, exporter string
		on                 bool
	}{
		{"", "", true},
		{"true", "", false},
		{" TRUE\n", "", false},
		{"True", "otlp", false},
		{"1", "", true},
		{"t", "", true},
		{"false", "", true},
		{"yes", "", true},
		{"", "none", false},
		{"", " None ", false},
		{"", "none,none", false},
		{"", "otlp", true},
		{"", " otlp , OTLP ", true},
		{"", "otlp,", true},
	} {
		t.Setenv("OTEL_SDK_DISABLED", c.disabled)
		t.Setenv("OTEL_TRACES_EXPORTER", c.exporter)
		tr, err := NewTracing(ctx, Config{SampleRatio: 1})
		if err != nil {
			t.Fatalf("OTEL_SDK_DISABLED %q, OTEL_TRACES_EXPORTER %q: %v", c.disabled, c.exporter, err)
		}
		if tr.Enabled() != c.on {
			t.Errorf("OTEL_SDK_DISABLED %q, OTEL_TRACES_EXPORTER %q: Enabled = %v, want %v", c.disabled, c.exporter, tr.Enabled(), c.on)
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = tr.Shutdown(sctx)
		cancel()
	}
	t.Setenv("OTEL_SDK_DISABLED", "")
	for _, bad := range []string{"console", "zipkin", "otlp,console", "jaeger", "none,otlp"} {
		t.Setenv("OTEL_TRACES_EXPORTER", bad)
		if tr, err := NewTracing(ctx, Config{SampleRatio: 1}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER") || tr.Enabled() {
			t.Errorf("OTEL_TRACES_EXPORTER %q: err = %v, want ErrInvalidConfig naming the variable, and no tracing", bad, err)
		}
	}
}

// A value of OTEL_SDK_DISABLED that is neither true nor false is taken
// as false, with a warning, as the specification asks.
func TestSDKDisabledOtherValueWarns(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	for _, v := range []string{"false", "FALSE", "", "1"} {
		t.Setenv("OTEL_SDK_DISABLED", v)
		if _, err := NewTracing(context.Background(), Config{Log: log}); err != nil {
			t.Fatal(err)
		}
	}
	if out := buf.String(); strings.Count(out, "OTEL_SDK_DISABLED") != 1 || !strings.Contains(out, "value=1") {
		t.Errorf("want one warning, for 1:\n%s", out)
	}
}

// A malformed OTEL_RESOURCE_ATTRIBUTES stops start-up as a bad
// configuration (ErrInvalidConfig, exit status 2), as a bad
// OTEL_TRACES_SAMPLER does, naming the variable.
func TestBadResourceAttributesAreInvalidConfig(t *testing.T) {
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "team=a,oops")
	_, err := newTracing(discard{}, Config{ServiceName: "test", SampleRatio: 1})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "OTEL_RESOURCE_ATTRIBUTES") {
		t.Fatalf("err = %v, want ErrInvalidConfig naming OTEL_RESOURCE_ATTRIBUTES", err)
	}
}

// Metrics.ServiceName is the service.name the spans and metrics carry:
// OTEL_SERVICE_NAME, then OTEL_RESOURCE_ATTRIBUTES's service.name, override
// the configured name (the start-up log line names it).
func TestServiceNameIsTheResources(t *testing.T) {
	for _, c := range []struct{ configured, envName, attrs, want string }{
		{"", "", "", "jetsink"},
		{"sink-a", "", "", "sink-a"},
		{"sink-a", "billing", "", "billing"},
		{"sink-a", "", "deployment.environment=prod,service.name=orders", "orders"},
		{"sink-a", "billing", "service.name=orders", "billing"},
	} {
		t.Setenv("OTEL_SERVICE_NAME", c.envName)
		t.Setenv("OTEL_RESOURCE_ATTRIBUTES", c.attrs)
		exp := tracetest.NewInMemoryExporter()
		tr, err := NewTracingTo(exp, Config{ServiceName: c.configured, SampleRatio: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, sp := tr.Tracer().Start(context.Background(), "send")
		sp.End()
		if err := tr.Provider().ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, sp := range exp.GetSpans() {
			names = append(names, serviceName(sp.Resource))
		}
		if len(names) != 1 || names[0] != c.want {
			t.Errorf("%+v: spans' service.name %q, want [%q]", c, names, c.want)
		}
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		m, err := NewMetrics(c.configured)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.ServiceName(); got != c.want {
			t.Errorf("%+v: Metrics.ServiceName %q, want %q", c, got, c.want)
		}
		if err := m.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	var off *Metrics
	if got := off.ServiceName(); got != "" {
		t.Errorf("a nil Metrics' ServiceName %q, want empty", got)
	}
}

// rowsOf is the counts of a batch of n rows all inserted, in at-least-once
// mode (no duplicates to tell).
func rowsOf(n int) CopyCounts { return CopyCounts{Settled: n, Inserted: n, Duplicates: -1} }

// A batch span tells the rows it acked (jetsink.batch.rows) from those its
// commits inserted (db.response.returned_rows): an exactly-once
// redelivery that ON CONFLICT skipped is a duplicate
// (jetsink.batch.duplicates), not a row stored. At-least-once's spans have
// no jetsink.batch.duplicates.
func TestEndCopyCounts(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := NewTracingTo(exp, Config{ServiceName: "test", SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	for _, n := range []CopyCounts{{Settled: 10, Inserted: 3, Duplicates: 7, DeadLettered: 2}, rowsOf(4)} {
		ev := pipeline.Event{Subject: "s", Stream: "S", StreamSeq: 1}
		ev.Span = tr.StartMessage(ev)
		cp := tr.StartCopy("events", []pipeline.Row{{Event: ev}})
		EndMessage(&ev, "ack", nil)
		EndCopy(cp, n, 100, 0, nil)
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got []attribute.Set
	for _, sp := range exp.GetSpans() {
		if sp.Name == "copy events" {
			got = append(got, attribute.NewSet(sp.Attributes...))
		}
	}
	if len(got) != 2 {
		t.Fatalf("%d copy spans exported, want 2", len(got))
	}
	for i, want := range []map[attribute.Key]int64{
		{"jetsink.batch.rows": 10, "db.response.returned_rows": 3, "jetsink.batch.duplicates": 7, "jetsink.batch.dead_lettered": 2},
		{"jetsink.batch.rows": 4, "db.response.returned_rows": 4, "jetsink.batch.dead_lettered": 0},
	} {
		for k, w := range want {
			if v, ok := got[i].Value(k); !ok || v.AsInt64() != w {
				t.Errorf("span %d: %s = %v (set %v), want %d", i, k, v.AsInt64(), ok, w)
			}
		}
		if _, ok := got[i].Value("jetsink.batch.duplicates"); ok && i == 1 {
			t.Errorf("span %d (at-least-once): jetsink.batch.duplicates set", i)
		}
	}
}

package telemetry

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
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

// OTEL_TRACES_SAMPLER=traceidratio decides from the traceparent's trace id,
// as the SDK's TraceIDRatioBased does, not by a draw per message: a
// publisher sampling at the same ratio keeps the same traces, so jetsink's
// spans are not orphans. An id whose last 8 bytes are zero is always kept,
// one whose last 8 bytes are all ones never, whatever the sampled flag;
// for random ids jetsink and the SDK agree; a message not kept costs no
// allocation.
func TestTraceIDRatioDecidesFromTheTraceID(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "traceidratio")
	tp := func(id trace.TraceID, flags string) nats.Header {
		return nats.Header{"traceparent": {"00-" + id.String() + "-b7ad6b7169203331-" + flags}}
	}
	low := func(b byte) trace.TraceID {
		id := trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd}
		for i := 8; i < 16; i++ {
			id[i] = b
		}
		return id
	}
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
	tr := newTestTracing(t, discard{}, 1)
	for _, flags := range []string{"00", "01"} {
		kept := 0
		for range 1000 {
			for _, h := range []nats.Header{tp(low(0), flags), tp(low(0xff), flags)} {
				ev := event(h)
				if ev.Span = tr.StartMessage(ev); ev.Span != nil {
					if ev.Span.SpanContext().TraceID() != low(0) {
						t.Fatalf("flags %s: span of trace %v kept, want only %v's", flags, ev.Span.SpanContext().TraceID(), low(0))
					}
					kept++
					EndMessage(&ev, "ack", nil)
				}
			}
		}
		if kept != 1000 {
			t.Errorf("flags %s, ratio 0.5: %d of 1000 messages of trace ...0000 kept (and none of ...ffff), want all", flags, kept)
		}
	}
	ev := event(tp(low(0xff), "01"))
	if n := testing.AllocsPerRun(1000, func() {
		if tr.StartMessage(ev) != nil {
			t.Fatal("trace ...ffff kept at ratio 0.5")
		}
	}); n != 0 {
		t.Errorf("%v allocations per message not kept, want 0", n)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	for _, ratio := range []float64{0.01, 0.5, 0.9} {
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", strconv.FormatFloat(ratio, 'g', -1, 64))
		tr := newTestTracing(t, discard{}, 1)
		sdk := sdktrace.TraceIDRatioBased(ratio)
		kept := 0
		for range 2000 {
			var id trace.TraceID
			binary.BigEndian.PutUint64(id[:8], rng.Uint64())
			binary.BigEndian.PutUint64(id[8:], rng.Uint64())
			want := sdk.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: id}).Decision == sdktrace.RecordAndSample
			ev := event(tp(id, "01"))
			ev.Span = tr.StartMessage(ev)
			if got := ev.Span != nil; got != want {
				t.Fatalf("ratio %g, trace %v: kept %v, TraceIDRatioBased says %v", ratio, id, got, want)
			}
			if ev.Span != nil {
				kept++
				EndMessage(&ev, "ack", nil)
			}
		}
		if ratio == 0.5 && (kept < 800 || kept > 1200) {
			t.Errorf("ratio 0.5: %d of 2000 random traces kept", kept)
		}
	}
}

// LinkCopy stops at the batch span's limit of links: the span keeps its
// first links (its own messages', then those taken in) rather than the
// SDK evicting the oldest for each new one, and jetsink.batch.links_dropped
// counts the messages past the limit, across calls, with those StartCopy
// left out.
func TestLinkCopyKeepsTheFirstLinks(t *testing.T) {
	t.Setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "4")
	exp := tracetest.NewInMemoryExporter()
	tr := newTestTracing(t, exp, 1)
	sampled := func(n int) []pipeline.Row {
		rows := make([]pipeline.Row, n)
		for i := range rows {
			rows[i].Event = event(nil)
			rows[i].Event.Span = tr.StartMessage(rows[i].Event)
		}
		return rows
	}
	for _, c := range []struct {
		name      string
		start     int   // sampled rows of the batch
		taken     []int // sampled rows of each LinkCopy
		wantLinks int   // the first rows linked
		dropped   int64 // 0: no attribute
	}{
		{"under the limit", 2, []int{1, 1}, 4, 0},
		{"at the limit", 4, []int{3}, 4, 3},
		{"reaching it", 3, []int{2, 2}, 4, 3},
		{"over it from the start", 6, []int{1, 2}, 4, 5},
	} {
		var all []pipeline.Row
		rows := sampled(c.start)
		all = append(all, rows...)
		cp := tr.StartCopy("events", rows)
		total := len(rows)
		for _, n := range c.taken {
			rows := append(sampled(n), pipeline.Row{Event: event(nil)}) // and one not sampled
			all = append(all, rows...)
			total += len(rows)
			if got := tr.LinkCopy(cp, "events", rows, total); got != cp {
				t.Fatalf("%s: LinkCopy returned another span", c.name)
			}
		}
		EndCopy(cp, rowsOf(total), 1000, 1, nil)
		var ids []trace.SpanID // of the sampled rows, in order
		for i := range all {
			if sp := all[i].Event.Span; sp != nil {
				ids = append(ids, sp.SpanContext().SpanID())
			}
			all[i].Event.EndSpan("ack", nil)
		}
		if err := tr.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		copySp := exportedCopySpan(exp)
		exp.Reset()
		if copySp == nil {
			t.Fatalf("%s: no copy span exported", c.name)
		}
		if len(copySp.Links) != c.wantLinks || copySp.DroppedLinks != 0 {
			t.Errorf("%s: %d links (%d dropped by the SDK), want %d", c.name, len(copySp.Links), copySp.DroppedLinks, c.wantLinks)
		}
		for i, l := range copySp.Links {
			if l.SpanContext.SpanID() != ids[i] {
				t.Errorf("%s: link %d is to %v, want the batch's sampled message %d (%v)", c.name, i, l.SpanContext.SpanID(), i, ids[i])
			}
		}
		attrs := attribute.NewSet(copySp.Attributes...)
		got, ok := attrs.Value("jetsink.batch.links_dropped")
		if c.dropped == 0 && ok || c.dropped != 0 && got.AsInt64() != c.dropped {
			t.Errorf("%s: jetsink.batch.links_dropped %v (set %v), want %d", c.name, got.AsInt64(), ok, c.dropped)
		}
		if got, _ := attrs.Value("messaging.batch.message_count"); got.AsInt64() != int64(total) {
			t.Errorf("%s: messaging.batch.message_count %d, want %d", c.name, got.AsInt64(), total)
		}
	}

	// A span StartCopy did not start: its links are counted as the SDK
	// holds them.
	rows := sampled(6)
	links := make([]trace.Link, 4)
	for i := range links {
		links[i] = trace.Link{SpanContext: rows[i].Event.Span.SpanContext()}
	}
	_, other := tr.Tracer().Start(context.Background(), "other", trace.WithLinks(links...))
	other = tr.LinkCopy(other, "events", rows[4:], 6)
	other.End()
	for i := range rows {
		rows[i].Event.EndSpan("ack", nil)
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, s := range exp.GetSpans() {
		if s.Name != "other" {
			continue
		}
		set := attribute.NewSet(s.Attributes...)
		got, _ := set.Value("jetsink.batch.links_dropped")
		if len(s.Links) != 4 || s.DroppedLinks != 0 || s.Links[0].SpanContext.SpanID() != links[0].SpanContext.SpanID() || got.AsInt64() != 2 {
			t.Errorf("another span: %d links (%d dropped by the SDK), links_dropped %d, want its 4 first kept and 2 counted", len(s.Links), s.DroppedLinks, got.AsInt64())
		}
	}
}

// exportedCopySpan is the last copy (client) span exp holds, or nil.
func exportedCopySpan(exp *tracetest.InMemoryExporter) *tracetest.SpanStub {
	var sp *tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindClient {
			sp = &s
		}
	}
	return sp
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
	EndCopy(cp, rowsOf(len(rows)), 1000, 0, nil)
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	copySp := exportedCopySpan(exp)
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

// The line logged when spans are dropped names what samples fewer under
// the sampler in force: a message whose publisher sampled it is traced
// whatever telemetry.sample_ratio (or a parentbased_ sampler's ARG) says,
// so for those it names traceidratio and the publisher, not the ratio.
func TestDropAdviceFollowsTheSampler(t *testing.T) {
	// Kept by traceidratio at any ratio above 0: its last 8 bytes are 0.
	sampled := nats.Header{"traceparent": []string{"00-0af7651916cd43dd0000000000000000-b7ad6b7169203331-01"}}
	unsampled := nats.Header{"traceparent": []string{"00-0af7651916cd43dd0000000000000000-b7ad6b7169203331-00"}}
	for _, c := range []struct {
		sampler, arg string // OTEL_TRACES_SAMPLER, _ARG
		ratio        float64
		h            nats.Header
		want, not    []string
	}{
		{"", "", 0.01, sampled,
			[]string{"publisher sampled them", "whatever telemetry.sample_ratio says", "set OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG", "sample fewer in the publisher"},
			[]string{"at telemetry.sample_ratio"}},
		{"", "", 1, nil,
			[]string{"without a traceparent are traced at telemetry.sample_ratio: lower it"},
			[]string{"traceidratio", "publisher sampled them"}},
		{"parentbased_traceidratio", "0.5", 1, sampled,
			[]string{"whatever OTEL_TRACES_SAMPLER_ARG says", "set OTEL_TRACES_SAMPLER=traceidratio with"},
			[]string{"telemetry.sample_ratio", "without a traceparent"}},
		{"parentbased_always_on", "", 0, nil,
			[]string{"set OTEL_TRACES_SAMPLER=parentbased_traceidratio with OTEL_TRACES_SAMPLER_ARG"},
			[]string{"telemetry.sample_ratio", "publisher sampled them"}},
		// parentbased_always_on takes no ARG: none is said to be ignored.
		{"parentbased_always_on", "", 0, sampled,
			[]string{"publisher sampled them", "traced by parentbased_always_on, which follows the publisher", "set OTEL_TRACES_SAMPLER=traceidratio with"},
			[]string{"OTEL_TRACES_SAMPLER_ARG says", "telemetry.sample_ratio", "without a traceparent"}},
		{"traceidratio", "0.5", 1, sampled,
			[]string{"lower OTEL_TRACES_SAMPLER_ARG"},
			[]string{"telemetry.sample_ratio", "publisher sampled them"}},
		{"always_on", "", 0, unsampled,
			[]string{"set OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG", "(not always_on)"},
			[]string{"telemetry.sample_ratio"}},
		// The SDK's own sampler (publish): spans started with Tracer.
		{"", "", -1, nil,
			[]string{"set OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG"},
			[]string{"telemetry.sample_ratio", "(not "}},
		// ... already at a ratio (compose's publish): lower it.
		{"traceidratio", "1", -1, nil,
			[]string{"lower OTEL_TRACES_SAMPLER_ARG"},
			[]string{"set OTEL_TRACES_SAMPLER=", "telemetry.sample_ratio"}},
		{"parentbased_always_on", "", -1, nil,
			[]string{"set OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG", "(not parentbased_always_on)"},
			[]string{"telemetry.sample_ratio"}},
	} {
		name := c.sampler + "/" + strconv.FormatFloat(c.ratio, 'g', -1, 64) + "/" + strings.Join(c.h["traceparent"], "")
		t.Setenv("OTEL_TRACES_SAMPLER", c.sampler)
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", c.arg)
		t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "1")
		t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
		exp := &gateExporter{release: make(chan struct{}), entered: make(chan struct{})}
		var logs testenv.SyncBuffer
		tr, err := newTracing(exp, Config{ServiceName: "test", SampleRatio: c.ratio, Log: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		end := func() {
			if c.ratio < 0 {
				_, sp := tr.Tracer().Start(context.Background(), "send")
				sp.End()
				return
			}
			ev := event(c.h)
			if ev.Span = tr.StartMessage(ev); ev.Span == nil {
				t.Fatalf("%s: the message was not sampled", name)
			}
			EndMessage(&ev, "ack", nil)
		}
		end() // exported, and held there
		select {
		case <-exp.entered:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no export began", name)
		}
		end() // the queue's one place
		end() // dropped
		close(exp.release)
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		_, line, ok := strings.Cut(logs.String(), "spans dropped")
		if !ok {
			t.Fatalf("%s: no drop logged:\n%s", name, logs.String())
		}
		line, _, _ = strings.Cut(line, "\n")
		if st := tr.SpanStats(); st.Dropped != 1 || !strings.Contains(line, "raise OTEL_BSP_MAX_QUEUE_SIZE") {
			t.Errorf("%s: %+v, logged:\n%s", name, st, logs.String())
		}
		for _, w := range c.want {
			if !strings.Contains(line, w) {
				t.Errorf("%s: the drop's line does not say %q:\n%s", name, w, line)
			}
		}
		for _, w := range c.not {
			if strings.Contains(line, w) {
				t.Errorf("%s: the drop's line says %q:\n%s", name, w, line)
			}
		}
	}
}

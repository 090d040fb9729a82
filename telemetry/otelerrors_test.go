package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/jetsink/jetsink/tests/testenv"
)

// record is one slog record as recorder keeps it.
type record struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// recorder is a slog.Handler that keeps its records. Safe for concurrent
// use: the SDK logs from its own goroutines.
type recorder struct {
	mu   sync.Mutex
	recs []record
}

func (*recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler     { return r }
func (r *recorder) WithGroup(string) slog.Handler          { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	attrs := map[string]string{}
	rec.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	r.mu.Lock()
	r.recs = append(r.recs, record{rec.Level, rec.Message, attrs})
	r.mu.Unlock()
	return nil
}

func (r *recorder) records() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.recs...)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSDKErrorsGoToTheLogger: the errors of the exports that the batch span
// processor runs on its own (on its timer, and the last at Shutdown) to a
// collector that refuses connections go to Config.Log, the first at once
// and the rest counted, and never to the standard log package's output.
func TestSDKErrorsGoToTheLogger(t *testing.T) {
	std := &testenv.SyncBuffer{} // the SDK writes from its goroutines while the test reads
	prev := log.Writer()
	log.SetOutput(std)
	t.Cleanup(func() { log.SetOutput(prev) })
	// Export every 10 ms instead of every 5 s. A refused connection is not
	// retried: each export fails at once.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
	rec := &recorder{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := NewTracing(ctx, Config{ServiceName: "test", OTLPEndpoint: "http://127.0.0.1:1", SampleRatio: 1, Log: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Enabled() {
		t.Fatal("tracing is off with an endpoint")
	}
	shut := false
	defer func() {
		if !shut {
			_ = tr.Shutdown(context.Background())
		}
	}()
	suppressed := func() int {
		sdkErrs.mu.Lock()
		defer sdkErrs.mu.Unlock()
		return tr.errs.suppressed
	}
	end := func() {
		ev := event(nil)
		if ev.Span = tr.StartMessage(ev); ev.Span == nil {
			t.Fatal("no span at ratio 1")
		}
		EndMessage(&ev, "ack", nil)
	}

	// Not Flush: it returns the export's error to its caller (processor.Run
	// logs it) instead of reporting it to the SDK's error handler.
	end()
	eventually(t, "no error logged", func() bool { return len(rec.records()) > 0 || std.String() != "" })
	if s := std.String(); s != "" {
		t.Fatalf("the standard logger got %q", s)
	}
	end()
	eventually(t, "the second failed export not held back", func() bool { return suppressed() >= 1 })
	// The last span goes out with Shutdown's final export, cut short.
	end()
	sctx, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_ = tr.Shutdown(sctx)
	scancel()
	shut = true

	if s := std.String(); s != "" {
		t.Errorf("the standard logger got %q", s)
	}
	recs := rec.records()
	if len(recs) != 3 {
		t.Fatalf("%d records, want the first error, the count held back and the spans lost: %+v", len(recs), recs)
	}
	first, last, lost := recs[0], recs[1], recs[2]
	failed, _ := strconv.Atoi(lost.attrs["export_failed"])
	left, _ := strconv.Atoi(lost.attrs["left_at_shutdown"])
	if lost.msg != "spans not exported" || failed < 2 || failed+left != 3 || lost.attrs["exported"] != "0" {
		t.Errorf("last record %+v: want the 3 spans, 2 or 3 of whose exports failed", lost)
	}
	if first.level != slog.LevelWarn || !strings.Contains(first.attrs["err"], "connection refused") {
		t.Errorf("first record %+v: want Warn with the export's connection refused", first)
	}
	if _, ok := first.attrs["suppressed"]; ok {
		t.Errorf("first record %+v counts suppressed errors", first)
	}
	if n, _ := strconv.Atoi(last.attrs["suppressed"]); last.level != slog.LevelWarn || n < 2 || last.attrs["last_err"] == "" {
		t.Errorf("last record %+v: want Warn with suppressed >= 2 and the last error", last)
	}
	// The route is gone: nothing refers to the test's logger any more.
	sdkErrs.mu.Lock()
	n := len(sdkErrs.routes)
	sdkErrs.mu.Unlock()
	if n != 0 {
		t.Errorf("%d routes left after Shutdown", n)
	}
}

// TestSDKErrorsRateLimit: the first error is logged at once, then one line
// per errEvery with the count held back since the previous one; the count
// still held back is logged when the route is removed; errors go to the
// latest live route.
func TestSDKErrorsRateLimit(t *testing.T) {
	var h sdkErrors
	older, newer := &recorder{}, &recorder{}
	ro := h.add(slog.New(older))
	rn := h.add(slog.New(newer))
	t0 := time.Now()
	for i := range 12 { // every 5 s for a minute: the first logged
		h.handle(fmt.Errorf("export %d", i), t0.Add(time.Duration(i)*5*time.Second))
	}
	h.handle(errors.New("export 12"), t0.Add(errEvery))
	h.handle(errors.New("export 13"), t0.Add(errEvery+5*time.Second))
	h.remove(rn)
	h.remove(rn) // again: nothing
	h.handle(errors.New("to the older"), t0.Add(errEvery+10*time.Second))
	h.remove(ro)

	got := func(r *recorder) string {
		var b strings.Builder
		for _, rec := range r.records() {
			fmt.Fprintf(&b, "%s %s err=%s suppressed=%s last_err=%s\n", rec.level, rec.msg,
				rec.attrs["err"], rec.attrs["suppressed"], rec.attrs["last_err"])
		}
		return b.String()
	}
	want := `WARN opentelemetry error err=export 0 suppressed= last_err=
WARN opentelemetry error err=export 12 suppressed=11 last_err=
WARN opentelemetry errors suppressed err= suppressed=1 last_err=export 13
`
	if g := got(newer); g != want {
		t.Errorf("the newer route logged\n%s\nwant\n%s", g, want)
	}
	if g, want := got(older), "WARN opentelemetry error err=to the older suppressed= last_err=\n"; g != want {
		t.Errorf("the older route logged\n%s\nwant\n%s", g, want)
	}
}

// TestSDKErrorsConcurrent: Tracings built and shut down while the SDK
// reports errors from other goroutines (run with -race).
func TestSDKErrorsConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			tr, err := newTracing(discard{}, Config{ServiceName: "test", SampleRatio: 1, Log: slog.New(&recorder{})})
			if err != nil {
				t.Error(err)
				return
			}
			for j := range 20 {
				otel.Handle(fmt.Errorf("error %d.%d", i, j))
			}
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

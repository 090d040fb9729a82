package processor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/telemetry"
	"github.com/jetsink/jetsink/tests/testenv"
)

// While New connects (here to a PostgreSQL that takes the connection and
// never answers, as a blackholed host or one building an index for
// minutes does to the checks), the admin listener answers at once: 503
// with what New is doing, for /healthz, /readyz and /metrics. Before, New
// bound the listener and only Run served it: a probe's connection was
// taken and never answered (curl -m2 /healthz timed out with 0 bytes,
// `jetsink healthcheck --live` said context deadline exceeded). A New
// that fails closes the listener, as before.
func TestAdminAnswersWhileStarting(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pgAddr, accepted := testenv.SilentServer(t)
	cfg := config.Default()
	cfg.Telemetry.Listen = "127.0.0.1:0"
	cfg.Postgres.URL = "postgres://jetsink@" + pgAddr + "/jetsink?sslmode=disable&connect_timeout=600"
	cfg.Postgres.CreateTable = true     // New connects to create the table where missing
	cfg.NATS.URL = "nats://127.0.0.1:1" // never reached: PostgreSQL comes first
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	bound := make(chan map[string]string, 1)
	log := slog.New(&recordHandler{msg: "admin listener: starting", attrs: bound})
	newCtx, stopNew := context.WithCancel(ctx)
	defer stopNew()
	type result struct {
		p   *Processor
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := New(newCtx, cfg, log)
		done <- result{p, err}
	}()
	var addr string
	select {
	case m := <-bound:
		addr = m["addr"]
	case r := <-done:
		t.Fatalf("New returned before the admin listener was served: %v", r.err)
	case <-ctx.Done():
		t.Fatal("no admin listener served while New runs")
	}
	select {
	case <-accepted: // New is connecting to PostgreSQL, which says nothing
	case r := <-done:
		t.Fatalf("New returned without connecting to PostgreSQL: %v", r.err)
	case <-ctx.Done():
		t.Fatal("New never connected to PostgreSQL")
	}
	// A generous timeout: the failure this catches is no answer at all.
	client := &http.Client{Timeout: 20 * time.Second}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s while New connects: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		want := "starting: connecting to PostgreSQL"
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(string(body), want) {
			t.Errorf("GET %s while New connects: %s %q, want 503 %q...", path, resp.Status, body, want)
		}
	}
	stopNew()
	if r := <-done; r.err == nil {
		r.p.Close()
		t.Fatal("New against a PostgreSQL that never answers returned no error")
	}
	// The failed start-up closed the listener.
	if c, err := net.Dial("tcp", addr); err == nil {
		_ = c.Close()
		t.Errorf("the admin listener %s still takes connections after New failed", addr)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial the admin listener after New failed: %v, want refused", err)
	}
}

// recordHandler sends the attributes of the first record logged with msg,
// by key as text, and drops every record.
type recordHandler struct {
	msg   string
	attrs chan<- map[string]string
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != h.msg {
		return nil
	}
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	select {
	case h.attrs <- m:
	default:
	}
	return nil
}

// Run's handler takes over from the start-up handler on the same listener
// and server: a connection kept alive across the hand-over is answered by
// each in turn, 503 then 200, and is not dropped; the stop that Run leaves
// to Shutdown closes the listener.
func TestAdminHandOverKeepsTheListener(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := telemetry.NewMetrics("jetsink-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
	p := &Processor{log: slog.New(slog.DiscardHandler), metrics: m}
	p.setPhase("connecting to NATS")
	l, err := telemetry.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.startAdmin(l)
	addr := l.Addr().String()
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	get := func(path string) (int, string, bool) {
		t.Helper()
		var reused bool
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, string(body), reused
	}
	if code, body, _ := get("/healthz"); code != http.StatusServiceUnavailable || body != "starting: connecting to NATS\n" {
		t.Fatalf("GET /healthz while starting: %d %q, want 503 \"starting: connecting to NATS\"", code, body)
	}
	stop, err := p.serveAdmin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, body, reused := get("/healthz"); code != http.StatusOK || body != "ok\n" || !reused {
		t.Errorf("GET /healthz once Run serves: %d %q on the connection kept alive %v, want 200 \"ok\" on it", code, body, reused)
	}
	if a := p.AdminAddr(); a == nil || a.String() != addr {
		t.Errorf("AdminAddr = %v once Run serves, want %s", a, addr)
	}
	stop()
	if c, err := net.Dial("tcp", addr); err == nil {
		_ = c.Close()
		t.Errorf("the admin listener %s still takes connections after its stop", addr)
	}
	if _, err := p.serveAdmin(ctx); err == nil {
		t.Error("a second serveAdmin served a listener that is gone")
	}
}

// A New that fails stops its start-up admin server at once. Before, it
// gave the requests in flight telemetry.ServeOn's 2 s grace, under a
// context nothing ends (Close's Background: run's hard context, which a
// second signal cancels, never reaches New): a profile under way
// (telemetry.pprof) or a connection that had sent no request yet held a
// cancelled start-up for 2 s, then the Warn "requests still running after
// 2s cut off". The profile here runs for 10 minutes; without the cut, the
// grace runs out and that Warn is logged. Under go test -cpuprofile the
// handler cannot start a profile (one is under way): that part is left out.
func TestFailedNewCutsOffTheAdminListener(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pgAddr, accepted := testenv.SilentServer(t)
	cfg := config.Default()
	cfg.Telemetry.Listen = "127.0.0.1:0"
	cfg.Telemetry.Pprof = true
	cfg.Postgres.URL = "postgres://jetsink@" + pgAddr + "/jetsink?sslmode=disable&connect_timeout=600"
	cfg.Postgres.CreateTable = true     // New connects to create the table where missing
	cfg.NATS.URL = "nats://127.0.0.1:1" // never reached: PostgreSQL comes first
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	bound := make(chan map[string]string, 1)
	rec := &warnRecorder{}
	log := slog.New(&teeHandler{rec, &recordHandler{msg: "admin listener: starting", attrs: bound}})
	newCtx, stopNew := context.WithCancel(ctx)
	defer stopNew()
	done := make(chan error, 1)
	go func() {
		p, err := New(newCtx, cfg, log)
		if err == nil {
			p.Close()
		}
		done <- err
	}()
	var addr string
	select {
	case m := <-bound:
		addr = m["addr"]
	case err := <-done:
		t.Fatalf("New returned before the admin listener was served: %v", err)
	case <-ctx.Done():
		t.Fatal("no admin listener served while New runs")
	}
	select {
	case <-accepted: // New is connecting to PostgreSQL, which says nothing
	case err := <-done:
		t.Fatalf("New returned without connecting to PostgreSQL: %v", err)
	case <-ctx.Done():
		t.Fatal("New never connected to PostgreSQL")
	}
	// A CPU profile of 10 minutes, under way when New fails, unless one
	// runs already (go test -cpuprofile): the handler would refuse it at
	// once.
	profiling := cpuProfileFree()
	if !profiling {
		t.Log("a CPU profile is under way (go test -cpuprofile?): no profile request")
	}
	profiled := make(chan error, 1)
	go func() {
		if !profiling {
			profiled <- nil
			return
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/profile?seconds=600", nil)
		if err == nil {
			var resp *http.Response
			if resp, err = http.DefaultClient.Do(req); err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}
		profiled <- err
	}()
	if profiling {
		waitStacks(ctx, t, "the profile's handler running", func(stacks string) bool {
			return strings.Contains(stacks, "net/http/pprof.Profile(")
		})
	}
	// And a connection that sends nothing, taken by the server.
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw.Close() }()
	serving := 1
	if profiling {
		serving = 2
	}
	waitStacks(ctx, t, "the server serving both connections", func(stacks string) bool {
		return strings.Count(stacks, "net/http.(*conn).serve(") >= serving
	})

	stopNew()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("New against a PostgreSQL that never answers returned no error")
		}
	case <-ctx.Done():
		t.Fatal("New did not return after its context was cancelled")
	}
	for _, w := range rec.lines() {
		if strings.Contains(w, "cut off") {
			t.Errorf("a failed New logged %q: its start-up requests were given a grace, or their cut warned of", w)
		}
	}
	// ServeOn waited for the profile's handler, which its cut ended.
	if stacks := allStacks(); strings.Contains(stacks, "net/http/pprof.Profile(") {
		t.Error("the profile's handler still runs after New failed")
	}
	select {
	case <-profiled: // an error or a cut-short body: the request ended
	case <-ctx.Done():
		t.Error("the profile's request did not end with the failed New")
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		_ = c.Close()
		t.Errorf("the admin listener %s still takes connections after New failed", addr)
	}
}

// cpuProfileFree reports whether a CPU profile could start now: none is
// under way (go test -cpuprofile starts one for the whole run).
func cpuProfileFree() bool {
	if err := pprof.StartCPUProfile(io.Discard); err != nil {
		return false
	}
	pprof.StopCPUProfile()
	return true
}

// waitStacks polls the goroutines' stacks until ok says yes, failing the
// test at ctx's end with what it waited for.
func waitStacks(ctx context.Context, t *testing.T, what string, ok func(stacks string) bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !ok(allStacks()) {
		select {
		case <-ctx.Done():
			t.Fatalf("waited for %s until the test's deadline", what)
		case <-tick.C:
		}
	}
}

// allStacks is every goroutine's stack.
func allStacks() string {
	buf := make([]byte, 1<<20)
	for {
		if n := runtime.Stack(buf, true); n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// warnRecorder keeps the records logged at Warn or above, as text.
type warnRecorder struct {
	mu    sync.Mutex
	warns []string
}

func (h *warnRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *warnRecorder) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *warnRecorder) WithGroup(string) slog.Handler                { return h }
func (h *warnRecorder) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	h.mu.Lock()
	h.warns = append(h.warns, line)
	h.mu.Unlock()
	return nil
}

func (h *warnRecorder) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.warns)
}

// teeHandler hands every record to each of its handlers that takes it.
type teeHandler []slog.Handler

func (h teeHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h teeHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h teeHandler) WithGroup(string) slog.Handler            { return h }
func (h teeHandler) Handle(ctx context.Context, r slog.Record) error {
	for _, x := range h {
		if x.Enabled(ctx, r.Level) {
			_ = x.Handle(ctx, r.Clone())
		}
	}
	return nil
}

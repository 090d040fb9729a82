package telemetry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Check reports whether one dependency is usable; nil means ready.
type Check func(ctx context.Context) error

// Admin is the admin HTTP handler.
type Admin struct {
	checks  map[string]Check
	timeout time.Duration
	mux     *http.ServeMux
}

// CheckTimeout is how long /readyz gives each check. A probe that waits
// a little longer for the answer (`jetsink healthcheck --timeout`) gets the
// one that names what failed.
const CheckTimeout = 2 * time.Second

// NewAdmin builds the handler with named readiness checks.
func NewAdmin(checks map[string]Check) *Admin {
	a := &Admin{checks: checks, timeout: CheckTimeout, mux: http.NewServeMux()}
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	a.mux.HandleFunc("GET /readyz", a.readyz)
	return a
}

// NewStarting builds the handler to serve while a process starts, before
// its readiness checks exist: /healthz, /readyz and /metrics answer 503,
// "starting: " and what phase returns (say, "connecting to PostgreSQL"),
// at once: a probe fails fast with the reason instead of waiting for an
// answer that comes only once start-up is over. Handle adds others
// (pprof's).
func NewStarting(phase func() string) *Admin {
	a := &Admin{timeout: CheckTimeout, mux: http.NewServeMux()}
	starting := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "starting: "+phase())
	}
	for _, pattern := range []string{"GET /healthz", "GET /readyz", "GET /metrics"} {
		a.mux.HandleFunc(pattern, starting)
	}
	return a
}

// Handle adds a handler (e.g. /metrics).
func (a *Admin) Handle(pattern string, h http.Handler) { a.mux.Handle(pattern, h) }

// ServeHTTP implements http.Handler.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Ready runs every check and returns the failures by name, sorted.
func (a *Admin) Ready(ctx context.Context) []string {
	results := RunChecks(ctx, a.checks, a.timeout)
	var failed []string
	for _, name := range slices.Sorted(maps.Keys(results)) {
		if err := results[name]; err != nil {
			failed = append(failed, name+": "+err.Error())
		}
	}
	return failed
}

// RunChecks runs each check, one after another, each within timeout, and
// returns every check's error by name (nil: it passed): what /readyz
// answers, and what the jetsink_ready gauge reports.
func RunChecks(ctx context.Context, checks map[string]Check, timeout time.Duration) map[string]error {
	results := make(map[string]error, len(checks))
	for name, check := range checks {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		results[name] = check(cctx)
		cancel()
	}
	return results
}

func (a *Admin) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if failed := a.Ready(r.Context()); len(failed) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready")
		fmt.Fprintln(w, strings.Join(failed, "\n"))
		return
	}
	fmt.Fprintln(w, "ready")
}

// Serve listens on addr and serves h until ctx is cancelled, then shuts the
// server down: it waits up to shutdownGrace for the requests in flight,
// then closes their connections, which cancels their contexts, and waits
// for their handlers to return (so h's handlers must return once their
// request's context is done; pprof's and /readyz's do). It returns the
// listen error, or nil after a clean shutdown; an error wrapping
// context.DeadlineExceeded when requests had to be cut off. If ready is
// non-nil, Serve sends the bound address on it (so it must be buffered or
// read) before it serves; a caller that listens on port 0 learns the port
// from it.
func Serve(ctx context.Context, addr string, h http.Handler, ready chan<- net.Addr) error {
	l, err := Listen(addr)
	if err != nil {
		return err
	}
	return ServeOn(ctx, context.Background(), l, h, ready)
}

// Listen binds the admin listener's address, so that a caller can learn
// that it is taken before it does anything else. The error says what to
// change.
func Listen(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listener %s: %w (another jetsink on this host? give telemetry.listen another address, "+
			"e.g. --set telemetry.listen=127.0.0.1:0 for any free port, or \"\" for no listener)", addr, err)
	}
	return l, nil
}

// adminIdleTimeout closes a kept-alive connection that sends no next
// request: without it net/http keeps it, and its goroutine, open for good,
// and a client that opens many and goes silent uses up the process's file
// descriptors, which its NATS and PostgreSQL connections need. (A scraper
// asks every 15-60 s and reconnects when it must.) A variable for the
// tests.
var adminIdleTimeout = 2 * time.Minute

// ServeOn is Serve on a listener that Listen bound; it closes l. The
// requests in flight when ctx ends get shutdownGrace, or less: the grace
// ends when hard does (at once if hard has ended already: a second signal
// must not wait for a CPU profile), and the error then wraps hard's
// error.
func ServeOn(ctx, hard context.Context, l net.Listener, h http.Handler, ready chan<- net.Addr) error {
	addr := l.Addr().String()
	var err error
	if ready != nil {
		ready <- l.Addr()
	}
	var handlers inflight
	srv := &http.Server{Handler: handlers.wrap(h), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: adminIdleTimeout}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		// Serve failed (accepting): end what it served before.
		_ = srv.Close()
		handlers.wait()
		return fmt.Errorf("admin listener %s: %w", addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(hard, shutdownGrace)
	defer cancel()
	err = srv.Shutdown(sctx)
	if err != nil {
		// Shutdown gave up on a request still running (a 30 s CPU
		// profile, a /readyz check): Close ends its connection, and
		// with it its request's context.
		_ = srv.Close()
		// The grace running out is Shutdown's DeadlineExceeded; hard's
		// end, its Canceled.
		if !errors.Is(err, context.DeadlineExceeded) && hard.Err() != nil {
			err = fmt.Errorf("requests still running cut off, the shutdown cut short: %w", err)
		} else {
			err = fmt.Errorf("requests still running after %v cut off: %w", shutdownGrace, err)
		}
	}
	if serr := <-done; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	// Neither Shutdown, when it gives up, nor Close waits for the
	// handlers: without this, a handler would outlive Serve.
	handlers.wait()
	if err != nil {
		return fmt.Errorf("admin listener shutdown: %w", err)
	}
	return nil
}

// shutdownGrace is how long Serve lets the requests in flight finish.
const shutdownGrace = 2 * time.Second

// inflight counts the handlers running, so that Serve can wait for them.
// Not a bare WaitGroup: a request accepted just before Close could call Add
// while wait is in Wait, which WaitGroup forbids.
type inflight struct {
	mu      sync.Mutex
	closing bool
	wg      sync.WaitGroup
}

// wrap returns h counted. A request that arrives once wait has begun gets
// 503 without running h.
func (f *inflight) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		if f.closing {
			f.mu.Unlock()
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		f.wg.Add(1)
		f.mu.Unlock()
		defer f.wg.Done()
		h.ServeHTTP(w, r)
	})
}

// wait returns when every handler started has returned; none starts after.
func (f *inflight) wait() {
	f.mu.Lock()
	f.closing = true
	f.mu.Unlock()
	f.wg.Wait()
}

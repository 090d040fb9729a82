package telemetry

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
)

// The OpenTelemetry SDK reports the errors it cannot return to a caller (a
// background export that failed, the exports cut short at shutdown, a
// Prometheus collection that failed) to one process-wide error handler,
// which by default prints them with the standard log package to stderr:
// outside jetsink's logger, so a log.format: json pipeline gets plain text
// lines among its records. sdkErrors replaces that handler once, for the
// whole process, and sends the errors to the logger of the Tracing built
// last that is not shut down yet (Config.Log). The SDK does not say which
// provider an error comes from, so when several Tracings are alive (tests
// build several; jetsink run builds one) the latest one gets them all.
// With none, they go to slog.Default().
//
// A collector that is down fails an export every few seconds, for as long
// as it stays down: each route logs the first error at once, then at most
// one line per errEvery with the number of errors left out since the
// previous line, and, when its Tracing shuts down, the count still pending.
var (
	sdkErrs     sdkErrors
	sdkErrsOnce sync.Once
)

// errEvery is the least time between two lines of one route.
const errEvery = time.Minute

// sdkErrors is an otel.ErrorHandler. Safe for concurrent use: the SDK calls
// it from its own goroutines (the batch span processor's, an exporter's, a
// scrape's) while Tracings come and go.
type sdkErrors struct {
	mu       sync.Mutex
	routes   []*errRoute // live Tracings' routes, the latest last
	fallback errRoute    // slog.Default(), when no Tracing is live
}

// errRoute is where the errors of one Tracing go, and what its rate limit
// holds back. Its fields other than log are guarded by sdkErrors.mu.
type errRoute struct {
	log        *slog.Logger // nil: slog.Default() at the time of logging
	next       time.Time    // before it, errors are counted, not logged
	suppressed int          // errors not logged since the last line
	last       error        // the latest of them
}

// installSDKErrors makes sdkErrs the SDK's error handler; only the first
// call does anything, so that building a second Tracing does not set the
// global again.
func installSDKErrors() {
	sdkErrsOnce.Do(func() { otel.SetErrorHandler(&sdkErrs) })
}

// Handle implements otel.ErrorHandler.
func (h *sdkErrors) Handle(err error) { h.handle(err, time.Now()) }

func (h *sdkErrors) handle(err error, now time.Time) {
	if err == nil {
		return
	}
	h.mu.Lock()
	r := &h.fallback
	if n := len(h.routes); n > 0 {
		r = h.routes[n-1]
	}
	if now.Before(r.next) {
		r.suppressed++
		r.last = err
		h.mu.Unlock()
		return
	}
	n := r.suppressed
	r.next, r.suppressed, r.last = now.Add(errEvery), 0, nil
	log := r.logger()
	h.mu.Unlock()
	// Logged outside the lock: a slow log writer must not hold up every
	// other goroutine of the SDK that reports an error meanwhile.
	attrs := []slog.Attr{slog.String("err", err.Error())}
	if n > 0 {
		attrs = append(attrs, slog.Int("suppressed", n))
	}
	log.LogAttrs(context.Background(), slog.LevelWarn, "opentelemetry error", attrs...)
}

func (r *errRoute) logger() *slog.Logger {
	if r.log == nil {
		return slog.Default()
	}
	return r.log
}

// add routes the errors to log from now on, until remove.
func (h *sdkErrors) add(log *slog.Logger) *errRoute {
	r := &errRoute{log: log}
	h.mu.Lock()
	h.routes = append(h.routes, r)
	h.mu.Unlock()
	return r
}

// remove stops routing errors to r, and logs the count of those it held
// back, if any, so that the last minute of failures is not lost. Calling it
// again does nothing.
func (h *sdkErrors) remove(r *errRoute) {
	h.mu.Lock()
	i := slices.Index(h.routes, r)
	if i < 0 {
		h.mu.Unlock()
		return
	}
	h.routes = slices.Delete(h.routes, i, i+1)
	n, last := r.suppressed, r.last
	r.suppressed, r.last = 0, nil
	h.mu.Unlock()
	if n > 0 {
		r.logger().LogAttrs(context.Background(), slog.LevelWarn, "opentelemetry errors suppressed",
			slog.Int("suppressed", n), slog.String("last_err", last.Error()))
	}
}

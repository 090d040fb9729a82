// Package telemetry serves jetsink's admin listener: /healthz (the process
// is alive), /readyz (every readiness check passes: NATS connected,
// PostgreSQL answering) and, as metrics arrive, /metrics.
//
// Serve owns one goroutine (the HTTP server) and stops it before it returns.
// Checks run on each /readyz request, concurrently with everything else, so
// they must be safe for concurrent use and bounded in time; each gets a
// context with a short timeout.
package telemetry

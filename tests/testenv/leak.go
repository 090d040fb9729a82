package testenv

import "go.uber.org/goleak"

// findLeaks reports goroutines still running after the tests. The embedded
// nats-server and the pgx connections leave none once closed.
func findLeaks() error { return goleak.Find() }

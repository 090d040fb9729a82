package testenv

import "go.uber.org/goleak"

// findLeaks reports goroutines still running after the tests. The embedded
// nats-server and the pgx connections leave none once closed, but for one
// file store of nats-server (v2.15.2) whose flush loop, and with it the
// store's registration with the access-time service, outlived a server
// that had shut down: seen once in a `make test` on a loaded machine, not
// reproduced. Most likely a stream the server was still creating when it
// shut down (a request the client gave up on, such as a dead-letter stream
// jetsink re-creates under a deadline). A server left running would leave
// its accept loops and much more, which are still reported.
func findLeaks() error {
	return goleak.Find(
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	)
}

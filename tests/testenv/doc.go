// Package testenv gives tests the real servers jetsink talks to: an embedded
// nats-server with JetStream on a random loopback port (or a routed cluster
// of them, NewNATSCluster), and a throwaway
// PostgreSQL cluster started from the installed PostgreSQL binaries (initdb,
// pg_ctl, postgres) on a free port.
//
// PostgreSQL refuses to run as root, so when the test process is root the
// cluster runs as the "postgres" user in a directory that user owns (not
// t.TempDir, which is root-only). Set JETSINK_TEST_DATABASE_URL to use an
// existing server instead; each test then gets a fresh database on it.
//
// Tests that cannot get a server fail with a message that says how to
// provide one. Nothing here skips except NewPartition, which needs root and
// iproute2's ip: without them it skips the test, saying how to run it,
// unless CI is set, where it fails the test instead.
//
// Packages that use Postgres call Main from TestMain so that the shared
// cluster is stopped when the test binary ends, every cluster it started
// is stopped shortly before its -timeout would panic (which no cleanup
// outlives: the servers die with the binary, their directories stay until
// a later StartPostgres sweeps them), and goroutine leaks are reported:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// Everything here is safe for concurrent use by parallel tests.
package testenv

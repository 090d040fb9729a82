// Package embedded starts the servers jetsink talks to, on this machine, for
// `jetsink demo`, `jetsink bench` and the tests (through tests/testenv): an
// in-process nats-server with JetStream on a random loopback port, and a
// throwaway PostgreSQL cluster made with the installed initdb and pg_ctl on
// a free port, run as the "postgres" user when the process is root
// (PostgreSQL refuses root) in a directory that user owns.
//
// Both are safe for concurrent use. Whoever starts one calls Destroy.
package embedded

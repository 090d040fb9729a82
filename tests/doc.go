// Package tests holds jetsink's end-to-end tests: real embedded nats-server,
// real throwaway PostgreSQL, the real processor (in-process, or the jetsink
// binary as a subprocess for crash and signal tests). tests/testenv starts
// the servers.
package tests

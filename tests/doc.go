// Package tests holds jetsink's end-to-end tests: real embedded nats-server,
// real throwaway PostgreSQL, the real processor (in-process, or the jetsink
// binary as a subprocess for crash and signal tests). tests/testenv starts
// the servers. TestChaos combines the single-fault tests: random faults, one
// after another, against a jetsink subprocess under load (README.md says
// how to run it as a soak).
package tests

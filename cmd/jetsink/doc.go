// Command jetsink moves events from NATS JetStream into PostgreSQL.
// See `jetsink --help` and the README.
//
// Each subcommand is a cobra command made by a new*Cmd function (root.go):
// run (the processor, package processor), check, init, keys, publish
// (package loadgen), bench (package bench), demo (package embedded's
// servers, then a run), dlq replay (package dlq) and healthcheck. main
// executes one and turns its error into the exit status (exitCode): 0, 1
// for a failure at run time, 2 for bad flags or configuration (the
// sentinels config.ErrInvalidConfig, bench.ErrInvalidOptions and
// usageError), 130 when a second signal or the drain timeout cut a drain
// short. A command whose log is JSON has its exit written as one record
// of that log (jsonLogged).
//
// Goroutines: the command runs on main's. The commands that stop on a
// signal (run, demo, publish, bench, dlq replay, check, init) start one
// more (watchSignals, directly or through signalStages or
// cancelOnSignal): it reads SIGINT, SIGTERM and SIGHUP,
// calls the first handler on the first signal and the second on the next
// (one within repeatWindow of the first counts as the same), and ends
// when the command calls the stop function it returned, which waits for
// it. As the first process of a PID namespace jetsink arms exitOnSignal's
// goroutine once the handlers are used up: it exits on the next signal.
// demo runs the processor on a goroutine of its own and waits for it
// before returning. Nothing else is started here; the packages own their
// goroutines and say so in their doc.go.
package main

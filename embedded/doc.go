// Package embedded starts the servers jetsink talks to, on this machine, for
// `jetsink demo`, `jetsink bench` and the tests (through tests/testenv): an
// in-process nats-server with JetStream on a random loopback port, and a
// throwaway PostgreSQL cluster made with the installed initdb and postgres
// (PostgreSQL 15 or newer: PATH's pg_ctl's, else the newest) on a free
// port, run as the "postgres" user when the process is root (PostgreSQL
// refuses root) in a directory that user owns.
//
// Both are safe for concurrent use. Whoever starts one calls Destroy. The
// PostgreSQL server is a child of the process that started it, not a
// daemon (pg_ctl start's): the kernel sends it SIGQUIT, PostgreSQL's
// immediate shutdown, when that process ends, however it ends (SIGKILL,
// the OOM killer), so no server outlives its owner with its port and
// password. A goroutine locked to the thread that started the server (the
// signal comes when that thread ends) reaps it; Stop and Destroy wait for
// it. pg_ctl still stops and promotes the server.
//
// What a killed process cannot remove stays until the next start: the
// temporary directories (jetsink-nats-*, jetsink-pg-* in os.TempDir(), and
// TempDir's) hold an owner.pid naming the process that made them and when
// it started, which that process keeps locked (flock) while it uses them;
// if it dies without Destroy (a panic, SIGKILL, go test -timeout), the
// next StartNATS("") of any process of the same user removes its NATS
// directories, and the next StartPostgres its clusters, stopping a server
// still running there first, and jetsink demo's jetsink-demo-* (its config
// file holds the cluster's URL with the password); TempDir removes those
// of its own prefix. A locked owner.pid keeps its directory whatever its
// pid says (the pid of another PID namespace sharing the temporary
// directory means nothing here).
//
// Their ports are below the kernel's ephemeral range, so that a server
// restarted on its port (NATSServer.Restart, Cluster.Start) does not find
// it taken by the source port of a connection opened in the pause.
//
// The cluster's superuser has a random password, which Cluster.URL carries:
// the server refuses connections without it, over TCP and its Unix socket,
// so that other users of the machine cannot connect as the superuser (and,
// through COPY ... TO PROGRAM, run commands as the server's OS user). Show
// the URL only to whoever started the cluster.
package embedded

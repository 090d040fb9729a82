// Package bench is `jetsink bench`: it runs a scenario end to end against
// NATS JetStream and PostgreSQL and measures jetsink from the outside.
//
// A scenario is drain (preload N events, then start jetsink and time how
// long it takes to commit and ack them all) or rate (start jetsink, publish
// open loop at a fixed rate for a duration, wait until everything is
// committed). jetsink runs as a subprocess (`jetsink run --config <generated
// YAML>`), so that its CPU time (user+sys, from the child's rusage) and peak
// RSS (VmHWM from /proc/<pid>/status) are its own and not the publisher's or
// the embedded servers'.
//
// VmHWM is the peak of RssAnon + RssFile + RssShmem. RssAnon is the
// engine's own memory (for jetsink the Go heap at its goal, stacks, the
// runtime's metadata); RssFile is the pages of its executable the kernel
// has mapped, and how many it maps depends on how the binary entered the
// page cache (one read whole, by cp or sha256sum, sits in large folios
// that a fault maps whole: the same binary started with ~9 MiB more), so
// it moves with the host's state, not the code's. A goroutine per child
// (memSampler) reads the parts from /proc/<pid>/status every 25 ms (in the
// bench process, some tens of µs a read, none of it the child's) and keeps
// each one's peak, with RssFile in the sample of the anon peak; the report
// gives them beside VmHWM (MemPeaks, Result.RSSAnonMax), and a comparison
// across sessions should read RssAnon. A sample misses a peak shorter than
// 25 ms, which VmHWM does not.
//
// Latency is publish-to-commit measured from each event's *scheduled* send
// time (loadgen.Options.Stamp puts it in the event's ts), so a stalled
// system does not hide its own delay (no coordinated omission). In a rate
// run it ends when the bench sees the event's first ack: it subscribes to
// the engine's ack subjects ($JS.ACK.<stream>.<consumer>.>) on a
// connection of its own, and an engine acks only after the row's COMMIT
// has returned, so the end is on the bench's own clock and after the
// commit's WAL flush. (pg_xact_commit_timestamp is taken before that
// flush: on this project's VM the COMMIT returned 1-2 ms after it at the
// median, tens of ms in the tail.) A drain's latency starts at the
// engine's start, as its events were sent before, and ends at the commit
// time, without an ack subscription that would take CPU from nats-server
// while it delivers at full speed. The commit time of a row is
// pg_xact_commit_timestamp(xmin) when the server tracks commit timestamps
// (the embedded server is restarted with track_commit_timestamp=on), else
// the row's committed_at column (DEFAULT clock_timestamp(), filled by
// COPY), which is when the row was copied, a little before its COMMIT; the
// legs of the latency (send to stored, stored to received, to the COPY, to
// the commit, commit to ack) use it, and the text report names the legs
// that end there for the COPY (stored->COPY; the JSON keeps its keys and
// says commit_time_is_copy_time). Rows per transaction (grouped by
// xmin) give the batch-size distribution.
//
// Those figures subtract timestamps of three clocks: the bench host's
// (the schedule, the engine's start, the acks, jetsink's received_at),
// PostgreSQL's (commit and COPY times) and nats-server's (a message's
// stored time). Before and after each engine's run the bench estimates
// each server's offset from the host's (clock.go: of five round trips, a
// SELECT clock_timestamp() and a publish whose stored time is read back,
// the shortest, the reading taken at its middle, give or take half of it)
// and takes every server timestamp less its offset over the run (the mean
// of the two); the report gives the offsets (pg_clock_offset_ms,
// nats_clock_offset_ms, each with its +- and the round trip it was read
// in) and the text warns of one that is off by more than a millisecond
// and more than its +-, and says of one not known to within a
// millisecond (a round trip over 2 ms, or a drift over the run) that it
// is not. On the embedded servers, which keep the host's clock, they come
// out at about 0. A probe that fails (a query refused, an account that
// takes no more streams: the NATS probe's stream, in a file as the
// bench's other streams, lives for the estimate only) does not fail the
// run: the bench says so on stderr and takes the other estimate; with
// neither, the JSON says pg_clock_offset_unknown (or nats_...) and the
// text that the figures are uncorrected for that server. A rate run's
// headline latency, from the schedule to the ack, is on the host's clock
// alone.
//
// A run that lost an event (acked by JetStream to the publisher, absent
// from the table), or stored one twice in exactly-once mode, makes Run
// return ErrLost with the report.
//
// The embedded PostgreSQL is also prepared like a server that has been
// running (unless Options.ColdPostgres): a new cluster creates, zero-fills
// and fsyncs a 16 MB WAL segment file whenever it fills one (every ~2 s at
// 20,000 events/s) while commits wait; a running server recycles old
// segments instead. So the bench has segments made and recycled before the
// first run (prepareEmbedded), and runs a CHECKPOINT before each engine's
// run, so that every run starts with the pages of the runs before it
// written out.
//
// Baseline is the consumer a competent engineer writes first (one
// goroutine, Consume into a channel, 1,000 messages or 50 ms,
// BEGIN/CopyFrom/COMMIT, ack each). It runs as the hidden
// `jetsink bench baseline` subprocess on the same preloaded stream through
// its own durable consumer and table, so the two are compared in the same
// run under the same load. It is not on jetsink's run path. Like the tests
// and loadgen, this package talks to both NATS and PostgreSQL: it stands
// outside the stages whose boundaries STYLE.md draws.
//
// A rate run can lock the engine's table (Options.LockFor): a goroutine
// holds an ACCESS EXCLUSIVE lock on a connection of its own from LockAt for
// LockFor, while another samples the engine's VmRSS and RssAnon every
// 250 ms (and as the lock is granted and released), to show what the
// engine's memory, redeliveries and catch-up do while the database stalls.
//
// With Options.PostgresRTT or NATSRTT (embedded servers only) the engines
// reach that server through a delayed link (link.go): a proxy on loopback
// that holds each chunk of bytes for half the round-trip time each way,
// in order, sleeping with nanosleep (Go's timers would round each wait up
// to a millisecond). It stands for a server on another machine, as
// production has it, without a network to set up (tc's netem needs a
// kernel module this project's machines lack). The bench's own
// connections stay direct, so the publisher and the measurement are not
// delayed; the report says how late the link's chunks went out (a busy
// machine delays the link too) and whether it ever held traffic back.
//
// Run owns every goroutine and subprocess it starts and waits for them; it
// is not safe to run two benchmarks against the same servers at once with
// the same Options.ID.
package bench

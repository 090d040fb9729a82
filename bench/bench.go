package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/embedded"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
)

// ErrInvalidOptions is wrapped by Run's errors for options it cannot run.
var ErrInvalidOptions = errors.New("invalid bench options")

// The scenarios.
const (
	ScenarioDrain = "drain" // preload Events, then start the consumer and time the drain
	ScenarioRate  = "rate"  // start the consumer, publish open loop at Rate for Duration
)

// The engines a run measures.
const (
	EngineJetsink  = "jetsink"
	EngineBaseline = "baseline"
)

// Variant is one column of a side-by-side comparison: --set overrides and
// environment variables (NAME=value, e.g. GOGC=200) passed to the jetsink
// subprocess only.
type Variant struct {
	Name string   `json:"name"`
	Set  []string `json:"set,omitempty"`
	Env  []string `json:"env,omitempty"`
}

// Options says what to run.
type Options struct {
	// Exe is the jetsink binary; its "run" and "bench baseline" commands are
	// started as subprocesses.
	Exe string
	// Base is the configuration the generated one starts from: NATS and
	// PostgreSQL URLs (unless Embedded) and every tuning key. Stream,
	// subjects, consumer, table, columns, telemetry.listen and the log
	// level are set per run.
	Base config.Config
	// Embedded starts an embedded nats-server and a throwaway PostgreSQL
	// cluster with fsync on (and track_commit_timestamp on).
	Embedded bool
	Scenario string
	Events   int           // drain: events to preload
	Rate     float64       // rate: events per second
	Duration time.Duration // rate: for this long
	Subjects int           // distinct subjects (devices), 1 to loadgen.MaxSubjects
	// EventBytes pads each event's JSON to this many bytes
	// (loadgen.Options.EventBytes); 0: ~180 bytes.
	EventBytes int
	// DuplicateWindow is the streams' JetStream duplicate window; 0 leaves
	// the server's default (2 minutes). The publisher sets Nats-Msg-Id on
	// every event, and nats-server keeps each ID for the window.
	DuplicateWindow time.Duration
	// ColdPostgres leaves the embedded cluster as initdb made it. By default
	// its WAL is prepared like that of a server that has been running (see
	// prepareEmbedded), and each engine's run starts after a CHECKPOINT.
	ColdPostgres bool
	// PostgresRTT and NATSRTT, when positive (embedded only), put the
	// engines' connections to that server through a link that adds this
	// much to every round trip, as if the server ran on another machine
	// (see link). The bench's own connections are direct.
	PostgresRTT, NATSRTT time.Duration

	// LockFor, when positive (rate only), takes an ACCESS EXCLUSIVE lock on
	// the engine's table LockAt after the first scheduled send and holds it
	// for LockFor while the publisher keeps its rate: what the engine does
	// while the database stalls (its memory, redeliveries) and how long it
	// takes to catch up. The engine's RSS is sampled throughout.
	LockAt, LockFor time.Duration
	// Compare runs the baseline consumer too, on the same preloaded stream.
	Compare bool
	// Count repeats the whole measurement; default 1.
	Count int
	// Variants run jetsink once per variant; default one with no overrides.
	Variants []Variant
	// Timeout bounds how long one engine may take to ack everything: from
	// its start in a drain, from the end of publishing in a rate run;
	// must be positive.
	Timeout time.Duration
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
}

// Result is one engine's measurement in one repetition.
type Result struct {
	Engine    string `json:"engine"`
	Variant   string `json:"variant,omitempty"`
	Rep       int    `json:"rep"`
	Published int    `json:"published"`
	Rows      int64  `json:"rows"`
	Duplicate int64  `json:"duplicate_rows"`
	// Missing counts the sequences 1 to Published of which the table has
	// no row; Stray the rows with any other stream_seq, and StreamLastSeq
	// is the stream's last sequence, Published unless the stream holds
	// events the publisher did not count (a resend stored twice).
	Missing       int64  `json:"missing"`
	Stray         int64  `json:"rows_outside_published_seqs"`
	StreamLastSeq uint64 `json:"stream_last_seq"`
	// PublishPS is the rate the publisher sent at (loadgen's SendRate):
	// the intervals between the first send and the last over the time
	// between them, not to the last PubAck; 0 for one event. In a rate
	// run, --rate when every event went out on time, below it when the
	// publisher fell behind.
	PublishPS float64 `json:"publish_per_s"`
	// PubRetried counts publishes sent again after a failed or late PubAck;
	// a retried event keeps its scheduled time, so its latency shows it.
	PubRetried int `json:"publish_retried"`
	// PubLate counts a rate run's events sent late because the publisher
	// paused at its pending limit; SendLag covers every cause. Their
	// latency still counts from the schedule.
	PubLate int `json:"publish_late,omitempty"`
	// SendLag is a rate run's send lag: each event's send minus its
	// scheduled time (the publisher descheduled, slow, or paused), with the
	// count sent over 1 ms late; up to ~1 ms is the publisher's design
	// (it sleeps at least 1 ms, then sends everything due).
	SendLag *SendLag `json:"publish_send_lag,omitempty"`
	// Elapsed runs from the subprocess's start (drain) or the first
	// scheduled send (rate) to the last commit.
	ElapsedS      float64 `json:"elapsed_s"`
	StartupS      float64 `json:"startup_s"` // subprocess start (drain) or first scheduled send (rate) to first commit
	EventsPerSec  float64 `json:"events_per_s"`
	CPUSeconds    float64 `json:"cpu_s"`
	CPUPerEvent   float64 `json:"cpu_us_per_event"`
	CPUPerMillion float64 `json:"cpu_s_per_million"`
	// SteadyCPUPerEvent is the engine's CPU per event while it works, from
	// the last poll before its consumer delivered anything (drain) or the
	// first scheduled send (rate) to its last ack, per message delivered in
	// between (all of them): without its start and shutdown, which
	// CPUPerEvent (its whole life) includes. 0 when that window is under a
	// second or no poll came before the first delivery (Linux only).
	SteadyCPUPerEvent float64 `json:"steady_cpu_us_per_event,omitempty"`
	PeakRSS           int64   `json:"peak_rss_bytes"` // VmHWM: the peak of the parts below together
	// The peaks of the parts of the engine's resident set (see MemPeaks),
	// sampled every 25 ms from its start to its stop: RssAnon is its own
	// memory (heap, stacks, the runtime's), RssFile the pages of its
	// executable the kernel has mapped, which move with how the binary
	// entered the page cache. PeakRSS mixes the two; compare RSSAnonMax
	// across sessions. 0 where /proc has no RssAnon.
	RSSAnonMax       int64 `json:"rss_anon_max_bytes,omitempty"`
	RSSFileAtAnonMax int64 `json:"rss_file_at_anon_max_bytes,omitempty"` // RssFile in the sample of RSSAnonMax
	RSSFileMax       int64 `json:"rss_file_max_bytes,omitempty"`
	RSSShmemMax      int64 `json:"rss_shmem_max_bytes,omitempty"`
	// Where the machine's CPU went while this engine ran (its start to its
	// last ack; Linux only): every process's busy time per event, the share
	// of the machine that was busy, and the bench process's own time per
	// event (the embedded nats-server and the publisher live there). The
	// rest of MachineCPUPerEvent - CPUPerEvent - BenchCPUPerEvent is mostly
	// PostgreSQL (and whatever else runs on the machine). Steal time (on a
	// VM, a CPU of this guest waiting while the hypervisor ran another) is
	// no process's: it is in neither, and MachineBusy is the busy share of
	// the time the CPUs were this machine's. MachineSteal is the share of
	// all the CPU time that was stolen.
	MachineCPUPerEvent float64 `json:"machine_cpu_us_per_event,omitempty"`
	MachineBusy        float64 `json:"machine_busy_share,omitempty"`
	MachineSteal       float64 `json:"machine_steal_share,omitempty"`
	BenchCPUPerEvent   float64 `json:"bench_process_cpu_us_per_event,omitempty"`
	// This engine's CPU per event in the same window (CPUPerEvent holds
	// its shutdown too), in the kernel's 10 ms ticks: what the machine's
	// rest is reckoned without.
	MachineEngineCPUPerEvent float64 `json:"machine_engine_cpu_us_per_event,omitempty"`
	// The embedded PostgreSQL's CPU per event (postmaster and children);
	// 0 against a configured server.
	PostgresCPUPerEvent float64     `json:"postgres_cpu_us_per_event,omitempty"`
	Redelivered         int64       `json:"redelivered"`
	Latency             Percentiles `json:"latency"`
	// LatencyFrom says where Latency starts and ends. A rate run's ends
	// when the bench saw the event's first ack (after its commit's WAL
	// flush; LatencyAcked events, the rest at their commit time); a
	// drain's starts at the engine's start (its events were sent before)
	// and ends at the commit time (pg_xact_commit_timestamp, or the COPY's
	// committed_at without commit timestamps): not subscribing to a
	// drain's acks leaves the bench process's CPU to nats-server.
	LatencyFrom  string `json:"latency_end"`
	LatencyAcked int64  `json:"latency_acked_rows,omitempty"`
	// CommitIsCopy says the server does not track commit timestamps
	// (track_commit_timestamp off): a row's "commit" time is then its
	// committed_at, when COPY wrote it, a little before its COMMIT, and
	// so every leg named for the commit (latency_stream_to_commit,
	// latency_to_commit, a drain's Latency) ends at the COPY. The text
	// report names those legs stored->COPY and send->COPY then.
	CommitIsCopy bool `json:"commit_time_is_copy_time,omitempty"`
	// The servers' clocks less the bench host's over the run (estimated
	// before and after it, from the round trip of a query and of a
	// publish), give or take their uncertainty: every timestamp of a
	// server (commit and COPY times, a message's stored time) was taken
	// less its server's offset before it was compared with the host's
	// (the elapsed time, the rate, the latencies and their legs, the
	// lock's catch-up). About 0 on the embedded servers, which keep the
	// host's clock. The round trip is the probe's the estimate was read
	// in (the ± is half of it, plus half the drift from before the run to
	// after it). Unknown: the bench could read that server's clock
	// neither before nor after the run (it said why on stderr); its offset
	// then reads 0, and the figures are uncorrected for it.
	PGClockOffsetMs        float64 `json:"pg_clock_offset_ms"`
	PGClockUncertaintyMs   float64 `json:"pg_clock_offset_plus_minus_ms"`
	PGClockRoundTripMs     float64 `json:"pg_clock_round_trip_ms"`
	PGClockUnknown         bool    `json:"pg_clock_offset_unknown,omitempty"`
	NATSClockOffsetMs      float64 `json:"nats_clock_offset_ms"`
	NATSClockUncertaintyMs float64 `json:"nats_clock_offset_plus_minus_ms"`
	NATSClockRoundTripMs   float64 `json:"nats_clock_round_trip_ms"`
	NATSClockUnknown       bool    `json:"nats_clock_offset_unknown,omitempty"`
	clk                    clocks
	// Latency split at the moment JetStream stored the event (its
	// metadata timestamp, the published_at column): scheduled send ->
	// stored is the publisher's and nats-server's part, stored -> commit
	// is the engine's (delivery, decode, batching, COPY, COMMIT). In a
	// drain, send -> stored is the preload's publish latency, before the
	// engine started, no part of Latency (the text report leaves it out);
	// stored -> commit starts at the engine's start there, so it is
	// Latency itself.
	LatencyToStream Percentiles `json:"latency_to_stream"`
	LatencyInEngine Percentiles `json:"latency_stream_to_commit"`
	// The engine's part split at the row's COPY (its committed_at, a
	// clock_timestamp() default): stored -> COPY is delivery, decode and
	// waiting for a batch and a connection; COPY -> commit is the rest of
	// the COPY and the COMMIT (fsync). Only with commit timestamps.
	LatencyBeforeCopy   Percentiles `json:"latency_stream_to_copy,omitzero"`
	LatencyCopyToCommit Percentiles `json:"latency_copy_to_commit,omitzero"`
	// stored -> COPY split again where the engine received the event (its
	// received_at; jetsink only): JetStream delivery, then jetsink itself.
	LatencyDelivery Percentiles `json:"latency_stream_to_received,omitzero"`
	LatencyInside   Percentiles `json:"latency_received_to_copy,omitzero"`
	// The commit timestamp to the ack's arrival (rate runs with commit
	// timestamps): the commit's WAL flush, the ack's way to the bench.
	LatencyCommitToAck Percentiles `json:"latency_commit_to_ack,omitzero"`
	// LatencyToCommit is Latency ended at the commit time instead of the
	// ack (rate runs), as runs before the bench watched acks measured it.
	LatencyToCommit Percentiles  `json:"latency_to_commit,omitzero"`
	Curve           []CurvePoint `json:"percentile_curve"`
	// Timeline is Latency per window of scheduled send time; rate runs
	// only: a drain's latency is its commit time less the engine's start,
	// which over time is the time axis itself.
	Timeline []TimePoint `json:"timeline,omitempty"`
	Batches  Batches     `json:"batches"`
	// RSS is the engine's resident set (VmRSS) over the run, the most of
	// each second from samples every 250 ms (rate scenario).
	RSS []RSSPoint `json:"rss,omitempty"`
	// Lock is what happened around the table lock (Options.LockFor).
	Lock  *LockResult `json:"lock,omitempty"`
	Load1 float64     `json:"load1"` // one-minute load average when the run ended
	// RanWith is what the engine ran with, as it logged at its start.
	RanWith RanWith `json:"ran_with"`
	// Log holds the engine's warnings and errors (the first 10 in the tail
	// of its output): a heartbeat missed, a retried batch.
	Log []string `json:"log,omitempty"`
	// Failed is why the run did not complete; its figures are partial
	// and left out of the summary.
	Failed string `json:"failed,omitempty"`
}

// SendLag is the publisher's send lag in a rate run.
type SendLag struct {
	Percentiles
	Over1ms int `json:"sent_over_1ms_late"`
}

// failed marks r as a run that did not complete, with err.
func (r *Result) failed(err error) {
	if err != nil {
		r.Failed, _, _ = strings.Cut(err.Error(), "\n")
	}
}

// Report is everything Run measured.
type Report struct {
	Scenario string  `json:"scenario"`
	Events   int     `json:"events,omitempty"`
	Rate     float64 `json:"rate,omitempty"`
	Duration string  `json:"duration,omitempty"`
	Subjects int     `json:"subjects"`
	// EventBytes is Options.EventBytes: events padded to this size.
	EventBytes int    `json:"event_bytes,omitempty"`
	Target     string `json:"target"` // "embedded (fsync on...)" or "configured"
	// CPUs is the bench's runtime.NumCPU: the CPUs its affinity mask
	// allows, the host's in a container limited by a cgroup CPU quota
	// (docker run --cpus=2 on a 64-core host: 64). What each engine ran
	// with, GOMAXPROCS among it, is its Result's RanWith.
	CPUs    int        `json:"cpus"`
	GoVer   string     `json:"go"`
	Started time.Time  `json:"started"`
	LoadAvg [2]float64 `json:"load1_before_after"`
	Results []Result   `json:"results"`
	Summary []Summary  `json:"summary"`
	// FirstByRep is, with --compare, the engine that ran first in each
	// repetition (index 0 is repetition 1). The order alternates, so with
	// an odd Count one engine runs first once more than the other.
	FirstByRep []string `json:"first_engine_by_rep,omitempty"`

	// DupWindow is the streams' duplicate window ("server default" for 0).
	DupWindow string `json:"duplicate_window"`
	// Links are the delayed links the engines reached the servers over
	// (Options.PostgresRTT, NATSRTT).
	Links []LinkReport `json:"links,omitempty"`
}

// LinkReport is one delayed link (see link) over the whole run: the
// round-trip time it added; how much later than due its chunks went out
// (every chunk, as its write began: a busy machine, or a writer held up by
// a slow reader; each way, a chunk took half the RTT plus that); how
// often and how long its readers waited because it held its most already
// (the link, not the engine, held the traffic back); and the engines'
// connections it carried.
type LinkReport struct {
	Server      string  `json:"server"`
	RTT         string  `json:"rtt"`
	RTTms       float64 `json:"rtt_ms"`
	LateMeanMs  float64 `json:"late_mean_ms"`
	LateMaxMs   float64 `json:"late_max_ms"`
	Stalls      int64   `json:"stalls"`
	StalledMs   float64 `json:"stalled_ms"`
	Connections int64   `json:"connections"`
}

// Run runs the scenario Count times and returns the report. Errors wrap
// ErrInvalidOptions, or say which step failed (with the subprocess's last
// output when it failed); ctx's error when cancelled.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	say := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, format+"\n", args...)
		}
	}
	rep := &Report{Scenario: o.Scenario, Subjects: o.Subjects, EventBytes: o.EventBytes, CPUs: runtime.NumCPU(), GoVer: runtime.Version(),
		Started: time.Now().UTC(), Target: "configured", DupWindow: "server default"}
	if o.DuplicateWindow > 0 {
		rep.DupWindow = o.DuplicateWindow.String()
	}
	rep.LoadAvg[0] = loadAvg1()
	if o.Scenario == ScenarioDrain {
		rep.Events = o.Events
	} else {
		rep.Rate, rep.Duration = o.Rate, o.Duration.String()
	}

	cfg := o.Base
	pgPID := 0
	if o.Embedded {
		rep.Target = "embedded (fsync on)"
		ns, err := embedded.StartNATS("")
		if err != nil {
			return nil, err
		}
		defer ns.Destroy()
		pg, err := embedded.StartPostgres(embedded.WithFsync())
		if err != nil {
			return nil, err
		}
		defer pg.Destroy()
		cfg.NATS.URL, cfg.Postgres.URL = ns.URL(), pg.URL("postgres")
		if !o.ColdPostgres {
			rep.Target = "embedded (fsync on, WAL segments recycled, CHECKPOINT before each run)"
			say("preparing PostgreSQL's WAL: %d segment switches and a CHECKPOINT leave ~%d segments (%d MB) to recycle",
				warmSegments, warmSegments, warmSegments*16)
		}
		if err := prepareEmbedded(ctx, pg, !o.ColdPostgres); err != nil {
			return nil, err
		}
		pgPID = pg.PID()
		say("embedded NATS %s, throwaway PostgreSQL %s %s", ns.URL(), pg.URL("postgres"), strings.TrimPrefix(rep.Target, "embedded "))
	}
	engineCfg := cfg
	for _, ln := range []struct {
		server string
		rtt    time.Duration
		url    *string
	}{{"PostgreSQL", o.PostgresRTT, &engineCfg.Postgres.URL}, {"NATS", o.NATSRTT, &engineCfg.NATS.URL}} {
		if ln.rtt <= 0 {
			continue
		}
		u, err := url.Parse(*ln.url)
		if err != nil {
			return nil, fmt.Errorf("bench: %s's URL: %w", ln.server, err)
		}
		lk, err := startLink(u.Host, ln.rtt, linkQueueBytes)
		if err != nil {
			return nil, err
		}
		rep.Links = append(rep.Links, lk.report(ln.server, ln.rtt)) // in start order; the figures come at Close
		i := len(rep.Links) - 1                                     // not a pointer: the next link's append may move them
		defer func() {
			lk.Close()
			rep.Links[i] = lk.report(ln.server, ln.rtt)
		}()
		u.Host = lk.Addr()
		*ln.url = u.String()
		say("the engines reach %s over a link adding %v to each round trip (%s)", ln.server, ln.rtt, lk.Addr())
	}
	// The publisher's: no reconnect buffer, whose resends could reach a
	// stream after its duplicate window (loadgen.Options.DuplicateWindow).
	nc, err := natsConnect(cfg.NATS, "jetsink-bench", nats.ReconnectBufSize(-1))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	// Acks are read on a connection of their own: the publisher's
	// PubAcks come in on nc.
	ackNC, err := natsConnect(cfg.NATS, "jetsink-bench-acks")
	if err != nil {
		return nil, err
	}
	defer ackNC.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	db, err := pgx.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to PostgreSQL: %w", err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	var track string
	if err := db.QueryRow(ctx, "SHOW track_commit_timestamp").Scan(&track); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	dir, err := makeTempDir()
	if err != nil {
		return nil, err
	}
	defer removeTempDir(dir)

	b := &bencher{o: o, cfg: cfg, engineCfg: engineCfg, js: js, ackNC: ackNC, db: db, dir: dir, byCommitTS: track == "on", say: say, pgPID: pgPID,
		id: strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	defer b.deleteClockStream(true)
	for r := 0; r < o.Count; r++ {
		if o.Compare {
			rep.FirstByRep = append(rep.FirstByRep, runOrder(r, true)[0])
		}
		for _, v := range o.Variants {
			res, err := b.repetition(ctx, r, v)
			rep.Results = append(rep.Results, res...)
			if err != nil {
				rep.LoadAvg[1] = loadAvg1()
				rep.Summary = summarize(rep.Results)
				return rep, err
			}
		}
	}
	rep.LoadAvg[1] = loadAvg1()
	rep.Summary = summarize(rep.Results)
	return rep, b.lossCheck(rep.Results)
}

// ErrLost is wrapped by Run's error when an engine lost events, or
// duplicated rows in exactly-once mode: the report is still returned.
var ErrLost = errors.New("events lost or duplicated")

// lossCheck reports the runs that lost events (published, acked by
// JetStream and missing from the table) and jetsink's exactly-once runs
// that stored an event twice. At-least-once may store an event twice after
// a redelivery: that is counted in the report, not an error.
func (b *bencher) lossCheck(results []Result) error {
	var bad []string
	for _, r := range results {
		name := fmt.Sprintf("%s rep %d%s", r.Engine, r.Rep, variantSuffix(Variant{Name: r.Variant}))
		if l := r.lost(); l != "" {
			bad = append(bad, name+": "+l)
		}
		if r.Duplicate != 0 && r.Engine == EngineJetsink && b.exactlyOnce(r.Variant) {
			bad = append(bad, fmt.Sprintf("%s: %d duplicate rows in exactly-once mode", name, r.Duplicate))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("bench: %w: %s", ErrLost, strings.Join(bad, "; "))
	}
	return nil
}

// lost says how run r lost events, or stored rows of events it was not
// offered: rows missing, rows whose stream_seq was not published, a
// resend stored twice in the stream; "" if none of these. Such a run's
// figures are not of the load offered (a missing event has no latency),
// so the summary leaves it out.
func (r Result) lost() string {
	var l []string
	if r.Missing > 0 {
		l = append(l, fmt.Sprintf("%d missing", r.Missing))
	}
	if r.Stray > 0 {
		l = append(l, fmt.Sprintf("%d rows whose stream_seq is not one of the %d published", r.Stray, r.Published))
	}
	if r.StreamLastSeq != uint64(r.Published) && r.Failed == "" {
		// A resend stored twice: the figures count events that were not offered.
		l = append(l, fmt.Sprintf("the stream's last sequence is %d, the publisher had %d acknowledged", r.StreamLastSeq, r.Published))
	}
	return strings.Join(l, ", ")
}

// exactlyOnce reports whether jetsink ran the variant named name in
// exactly-once mode: the base config's mode, unless the variant sets it
// (--set or an environment variable).
func (b *bencher) exactlyOnce(name string) bool {
	mode := string(b.cfg.Postgres.Mode)
	for _, v := range b.o.Variants {
		if v.Name == name {
			mode = variantValue(mode, "postgres.mode", v)
		}
	}
	return strings.TrimSpace(mode) == string(sink.ExactlyOnce)
}

// minAckWait is the shortest PubAck wait the publisher is given (from
// Options.DuplicateWindow, which must cover its resends): a shorter one
// resends events whose PubAck is merely late, under load or over a slow
// link, and the resends' work skews the figures.
const minAckWait = 500 * time.Millisecond

// defaults fills in the defaults and refuses what a run could not do,
// before any server starts. It names every problem it finds, joined, not
// the first alone: a command line with two mistakes is mended in one go.
// (The checks that need the others to hold, the publisher's and the
// disk's, are made only when those pass.)
func (o *Options) defaults() error {
	var errs []error
	refuse := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if o.Exe == "" {
		refuse("the jetsink binary is required")
	}
	if o.DuplicateWindow < 0 {
		refuse("--duplicate-window must not be negative")
	}
	if o.DuplicateWindow > 0 && loadgen.MaxAckWait(o.DuplicateWindow) < minAckWait {
		refuse("--duplicate-window %v leaves the publisher a PubAck wait of %v, under which it would resend events still on their way, "+
			"skewing the figures: give at least %v (a PubAck wait of %v), or 0 for the server's default",
			o.DuplicateWindow, loadgen.MaxAckWait(o.DuplicateWindow), loadgen.MinDuplicateWindow(minAckWait), minAckWait)
	}
	if o.PostgresRTT < 0 || o.NATSRTT < 0 {
		refuse("--postgres-rtt and --nats-rtt must not be negative")
	}
	if (o.PostgresRTT > 0 || o.NATSRTT > 0) && !o.Embedded {
		refuse("--postgres-rtt and --nats-rtt apply to the embedded servers only; against servers on other machines, the network adds its own")
	}
	if o.ColdPostgres && !o.Embedded {
		refuse("--cold-postgres applies to the embedded PostgreSQL only, not to a configured server")
	}
	// Subjects and Timeout have no default here: the command's flags give
	// theirs, and a 0 typed there is refused, not taken for one.
	if o.Subjects < 1 || o.Subjects > loadgen.MaxSubjects {
		refuse("--subjects %d: at least 1 and at most %d distinct subjects", o.Subjects, loadgen.MaxSubjects)
	}
	if o.Timeout <= 0 {
		refuse("--timeout %v: give one engine's run a positive time to ack everything, e.g. 10m", o.Timeout)
	}
	if o.Count < 0 {
		refuse("--count %d: at least 1 repetition", o.Count)
	}
	if o.Count == 0 {
		o.Count = 1
	}
	if len(o.Variants) == 0 {
		o.Variants = []Variant{{}}
	}
	switch o.Scenario {
	case ScenarioDrain:
		if o.Events <= 0 {
			refuse("drain needs --events >= 1")
		}
	case ScenarioRate:
		if !(o.Rate > 0) || math.IsInf(o.Rate, 0) || o.Duration <= 0 { // NaN too
			refuse("rate needs a finite --rate > 0 and --duration > 0")
		} else if o.Rate*o.Duration.Seconds() < 1 {
			refuse("--rate x --duration publishes no event")
		}
		if o.LockFor != 0 && (o.LockFor < minLockFor || o.LockAt < 0 || o.LockAt >= o.Duration) {
			refuse("--lock-for must be at least %v and --lock-at within --duration (%v), not negative", minLockFor, o.Duration)
		}
	default:
		refuse("--scenario must be %s or %s, not %q", ScenarioDrain, ScenarioRate, o.Scenario)
	}
	if o.LockFor != 0 && o.Scenario != ScenarioRate {
		refuse("--lock-for needs --scenario rate")
	}
	if o.EventBytes < 0 {
		refuse("--event-bytes must not be negative (0: no padding)")
	}
	// The embedded nats-server has the default max_payload; a configured
	// one's is known once connected (loadgen.Publish checks it then).
	payloadTooBig := false
	if limit := loadgen.MaxEventBytes(natsserver.MAX_PAYLOAD_SIZE); o.Embedded && int64(o.EventBytes) > limit {
		payloadTooBig = true
		refuse("--event-bytes %d does not fit the embedded nats-server's max_payload (%d bytes, with room for the headers): at most %d",
			o.EventBytes, natsserver.MAX_PAYLOAD_SIZE, limit)
	}
	// What loadgen.Publish would refuse (a rate that is not a number, or
	// too many events), refused before any server starts, once the
	// options it is made of hold.
	if len(errs) == 0 {
		if err := o.publishOptions("bench", o.scenarioLoad()).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%w: the publisher: %w", ErrInvalidOptions, err))
		}
	}
	// A problem every variant has (a --set key jetsink does not know, say)
	// is named once, not once a variant.
	problems := make([][]error, len(o.Variants))
	shared := map[string]int{}
	for i, v := range o.Variants {
		cfg, err := o.variantConfig(v)
		if err != nil {
			problems[i] = config.Problems(err)
			seen := map[string]bool{}
			for _, p := range problems[i] {
				if !seen[p.Error()] {
					seen[p.Error()] = true
					shared[p.Error()]++
				}
			}
			continue
		}
		// Above max_payload, raising max_event_bytes would not help: that
		// problem is named alone, above.
		if limit := cfg.Pipeline.MaxEventBytes; limit > 0 && int64(o.EventBytes) > limit && !payloadTooBig {
			refuse("--event-bytes %d is above pipeline.max_event_bytes %d%s: jetsink would dead-letter every event; "+
				"raise it (--set pipeline.max_event_bytes=N) or pad less", o.EventBytes, limit, variantSuffix(v))
		}
	}
	named := map[string]bool{}
	for i, v := range o.Variants {
		for _, p := range problems[i] {
			which := variantSuffix(v)
			if len(o.Variants) > 1 && shared[p.Error()] == len(o.Variants) {
				if named[p.Error()] {
					continue
				}
				named[p.Error()] = true
				which = " (every variant)"
			}
			errs = append(errs, fmt.Errorf("%w: jetsink's configuration%s: %w", ErrInvalidOptions, which, p))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if o.Embedded {
		return o.fitsDisk(os.TempDir())
	}
	return nil
}

// variantConfig loads the configuration jetsink runs variant v with, as
// "jetsink run" loads it: the file the bench writes for it (Base with a
// run's names; the servers' URLs are Base's here), then v's JETSINK_
// variables, then its --set values, validated. A key or value jetsink would
// refuse is so refused before any server starts, not after the preload.
// Its error is config.Parse's or Validate's: config.Problems splits it.
func (o *Options) variantConfig(v Variant) (config.Config, error) {
	raw, err := yaml.Marshal(jetsinkConfig(o.Base, newTarget(EngineJetsink, "BENCH_CHECK", "benchcheck", v)))
	if err != nil {
		return config.Config{}, fmt.Errorf("bench: write config: %w", err)
	}
	cfg, err := config.Parse(raw, v.Env, v.Set)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return config.Config{}, err
	}
	return cfg, nil
}

// variantValue is the config key at path as variant v runs jetsink: base,
// unless one of v's environment variables (JETSINK_ plus the path) or,
// above those, one of its --set values gives it.
func variantValue(base, path string, v Variant) string {
	value := base
	for _, kv := range v.Env {
		if name, val, ok := strings.Cut(kv, "="); ok {
			if p, ok := config.KeyOfEnv(name); ok && p == path {
				value = val
			}
		}
	}
	for _, kv := range v.Set {
		if p, val, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(p) == path {
			value = val
		}
	}
	return value
}

// prepareEmbedded turns track_commit_timestamp on and restarts the cluster,
// so that a row's commit time is its transaction's. With warm, it also
// gives the cluster what a server that has been running has: WAL segments
// to recycle. A new cluster has one, and then every 16 MB of WAL creates a
// new segment file, zero-filled and fsynced while commits wait; at 20,000
// events/s that is one every ~2 s, at 50,000 one every ~0.8 s. A server past
// its first checkpoints renames old segments for reuse instead, keeping at
// least min_wal_size of them past the latest checkpoint (more, up to
// max_wal_size, when its checkpoints lie further apart). So: min_wal_size 1 GB,
// 64 segments made by switching, and a CHECKPOINT that recycles all 64
// (~1 GB, ~50 s of WAL at 50,000 events/s; the runs' own checkpoints recycle
// more). max_wal_size is raised to 4 GB while the switches run, so that
// they trigger no checkpoint of their own (one midway recycled segments the
// later switches then used up, and left only 35-38 ready: at 50,000
// events/s the run created new segments from ~30 s on), and is reset to its
// default, 1 GB, afterwards. An effect on the figures has not been
// measurable at either rate (BENCHMARKS.md, sessions 13 and 14).
// warmSegments is how many WAL segments prepareEmbedded makes and recycles:
// min_wal_size (1 GB) of 16 MB segments.
const warmSegments = 64

func prepareEmbedded(ctx context.Context, pg *embedded.Cluster, warm bool) error {
	settings := []string{"ALTER SYSTEM SET track_commit_timestamp = on"}
	if warm {
		settings = append(settings, "ALTER SYSTEM SET min_wal_size = '1GB'", "ALTER SYSTEM SET max_wal_size = '4GB'")
	}
	if err := execAll(ctx, pg, settings); err != nil {
		return err
	}
	if err := pg.Stop("fast"); err != nil {
		return fmt.Errorf("bench: restart PostgreSQL: %w", err)
	}
	if err := pg.Start(); err != nil {
		return fmt.Errorf("bench: restart PostgreSQL: %w", err)
	}
	if !warm {
		return nil
	}
	return execAll(ctx, pg, []string{
		// Each switch needs WAL written since the last one: a logical
		// decoding message is a WAL record and nothing else.
		fmt.Sprintf(`DO $$BEGIN FOR i IN 1..%d LOOP
			PERFORM pg_logical_emit_message(false, 'jetsink-bench', 'warm');
			PERFORM pg_switch_wal();
		END LOOP; END$$`, warmSegments),
		"CHECKPOINT",
		"ALTER SYSTEM RESET max_wal_size",
		"SELECT pg_reload_conf()", // max_wal_size needs no restart
	})
}

// execAll runs each statement on a new connection to pg's postgres database.
func execAll(ctx context.Context, pg *embedded.Cluster, stmts []string) error {
	db, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		return fmt.Errorf("bench: connect to PostgreSQL: %w", err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	for i, q := range stmts {
		if _, err := db.Exec(ctx, q); err != nil {
			return fmt.Errorf("bench: prepare PostgreSQL (statement %d of %d): %w", i+1, len(stmts), err)
		}
	}
	return nil
}

// checkpointFirst runs a CHECKPOINT before an engine's run on the prepared
// embedded cluster: every run starts with the dirty pages of the ones before
// written out and their WAL recycled, whatever ran earlier.
func (b *bencher) checkpointFirst(ctx context.Context) error {
	if !b.o.Embedded || b.o.ColdPostgres {
		return nil
	}
	if _, err := b.db.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("bench: CHECKPOINT before the run: %w", err)
	}
	return nil
}

// bencher holds one Run's connections.
type bencher struct {
	o          Options
	cfg        config.Config
	engineCfg  config.Config // cfg with the URLs the engines connect to (through the links)
	js         jetstream.JetStream
	ackNC      *nats.Conn // the rate runs' ack subscriptions
	db         *pgx.Conn
	dir        string
	id         string
	byCommitTS bool
	pgPID      int           // the embedded postmaster, or 0
	dupWindow  time.Duration // the duplicate window of the last stream made
	// pgNow and natsNow read the servers' clocks (nil: pgClock,
	// natsClock); clockStream says natsClock may have made its stream,
	// which deleteClockStream has not seen gone.
	pgNow, natsNow clockProbe
	clockStream    bool
	seq            int
	say            func(string, ...any)
}

// target names one engine's stream, consumer and table.
type target struct {
	engine, stream, prefix, consumer, table string
	variant                                 Variant
}

// newTarget names engine's consumer and table on stream.
func newTarget(engine, stream, prefix string, v Variant) target {
	return target{engine: engine, stream: stream, prefix: prefix, consumer: "bench_" + engine,
		table: strings.ToLower(stream) + "_" + engine, variant: v}
}

func (b *bencher) names() (stream, prefix string) {
	b.seq++
	return fmt.Sprintf("BENCH_%s_%d", b.id, b.seq), fmt.Sprintf("bench%s_%d", b.id, b.seq)
}

// repetition measures every engine once for variant v.
func (b *bencher) repetition(ctx context.Context, rep int, v Variant) ([]Result, error) {
	engines := runOrder(rep, b.o.Compare)
	var results []Result
	if b.o.Scenario == ScenarioDrain {
		stream, prefix := b.names()
		if err := b.createStream(ctx, stream, prefix); err != nil {
			return nil, err
		}
		defer b.deleteStream(stream)
		b.say("rep %d%s: preloading %d events into %s", rep+1, variantSuffix(v), b.o.Events, stream)
		pub, err := loadgen.Publish(ctx, b.js.Conn(), b.publishOptions(prefix))
		if err != nil {
			return nil, fmt.Errorf("bench: preload: %w", err)
		}
		for _, e := range engines {
			t := newTarget(e, stream, prefix, v)
			res, err := b.drain(ctx, t, pub)
			res.Rep = rep + 1
			res.failed(err)
			results = append(results, res)
			if err != nil {
				return results, err
			}
			b.say("  %s", res.line(ScenarioDrain))
		}
		return results, nil
	}
	for _, e := range engines {
		stream, prefix := b.names()
		if err := b.createStream(ctx, stream, prefix); err != nil {
			return results, err
		}
		t := newTarget(e, stream, prefix, v)
		b.say("rep %d%s: %s at %.0f/s for %v", rep+1, variantSuffix(v), e, b.o.Rate, b.o.Duration)
		res, err := b.rate(ctx, t)
		b.deleteStream(stream)
		res.Rep = rep + 1
		res.failed(err)
		results = append(results, res)
		if err != nil {
			return results, err
		}
		b.say("  %s", res.line(ScenarioRate))
	}
	return results, nil
}

// runOrder is the order the engines run in repetition rep (from 0). With
// compare it alternates, so that neither always runs on a warmer (or
// busier) machine: jetsink first in the 1st, 3rd, ... repetition. An odd
// count cannot balance it; the report says which ran first in each
// (Report.FirstByRep). A random order would balance it only on average.
func runOrder(rep int, compare bool) []string {
	if !compare {
		return []string{EngineJetsink}
	}
	if rep%2 == 1 {
		return []string{EngineBaseline, EngineJetsink}
	}
	return []string{EngineJetsink, EngineBaseline}
}

// publishOptions completes lo (the events or the rate) for a run on the
// subjects under prefix. The events carry each its scheduled send time
// (Stamp) and no traceparent, so that jetsink samples them as roots at its
// own ratio, as in the runs before the publisher sent one by default. The
// PubAck wait is short enough that every resend of an event falls within
// the streams' duplicate window (loadgen.MaxAckWait), when one is set, and
// none goes out past that window (loadgen gives such a publish up).
func (o *Options) publishOptions(prefix string, lo loadgen.Options) loadgen.Options {
	lo.Subject, lo.Subjects, lo.Run, lo.Stamp, lo.NoTraceContext = prefix, o.Subjects, uint64(time.Now().UnixNano()), true, true
	lo.EventBytes = o.EventBytes
	if o.DuplicateWindow > 0 {
		lo.AckWait = min(loadgen.MaxAckWait(o.DuplicateWindow), 5*time.Second) // defaults refuses a window too short for any
		lo.DuplicateWindow = o.DuplicateWindow
	}
	return lo
}

// scenarioLoad is what the scenario publishes: the preload's events, or
// the rate for the duration.
func (o *Options) scenarioLoad() loadgen.Options {
	if o.Scenario == ScenarioRate {
		return loadgen.Options{Rate: o.Rate, Duration: o.Duration}
	}
	return loadgen.Options{Events: o.Events}
}

// Bytes a run's event takes at the least on the embedded servers' disk:
// in the stream, its subject, Nats-Msg-Id and the file store's record
// framing beside the body (~100 bytes); in PostgreSQL, its row's tuple
// header and typed columns (~150 bytes) beside the body's jsonb, of which
// no more than ~2 KB is counted (PostgreSQL compresses a larger value, and
// the padding of --event-bytes is a run of one letter), before any index
// or WAL. The estimate is low on purpose: it refuses only a run that
// cannot fit.
const (
	streamBytesPerEvent = 100
	rowBytesPerEvent    = 150
	rowBodyBytesMax     = 2048
	bareEventBytes      = 180 // loadgen's unpadded telemetry event
)

// fitsDisk refuses a run whose events cannot fit on the file system of dir,
// where the embedded nats-server and PostgreSQL keep their data: the stream
// holds every event until the run ends, so a rate or an event count far
// beyond the disk (--rate 1e12 --duration 1s is a trillion events) would
// otherwise publish until the disk filled or --timeout ended the run, minutes
// later. Where the free space cannot be read, nothing is refused.
func (o *Options) fitsDisk(dir string) error {
	free, ok := freeBytes(dir)
	if !ok {
		return nil
	}
	body := max(o.EventBytes, bareEventBytes)
	need := float64(o.scenarioLoad().Total()) * float64(body+streamBytesPerEvent+min(body, rowBodyBytesMax)+rowBytesPerEvent)
	if need <= float64(free) {
		return nil
	}
	return fmt.Errorf("%w: %d events need at least %s on the embedded servers' disk (the stream keeps them all until the run ends, "+
		"and each is a row in PostgreSQL), and %s has %s free: publish fewer (--events, or --rate x --duration), "+
		"or set TMPDIR to a larger disk", ErrInvalidOptions, o.scenarioLoad().Total(),
		gib(need), dir, gib(float64(free)))
}

// gib is n bytes in GiB, for a message.
func gib(n float64) string {
	return strconv.FormatFloat(n/(1<<30), 'f', 1, 64) + " GiB"
}

func variantSuffix(v Variant) string {
	if v.Name == "" {
		return ""
	}
	return " [" + v.Name + "]"
}

func (b *bencher) createStream(ctx context.Context, stream, prefix string) error {
	// consumer.CreateStream: a repetition's stream is made just after the one
	// before was deleted, which nats-server may refuse once (a race it has).
	s, err := consumer.CreateStream(ctx, b.js, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"},
		Storage: jetstream.FileStorage, Duplicates: b.o.DuplicateWindow})
	if err != nil {
		return fmt.Errorf("bench: create stream %s: %w", stream, err)
	}
	b.dupWindow = s.CachedInfo().Config.Duplicates
	return nil
}

// publishOptions is Options.publishOptions for the events of prefix, with
// the duplicate window of the stream made for them (the server's, 2
// minutes by default, when --duplicate-window is 0), past which the
// publisher sends no resend.
func (b *bencher) publishOptions(prefix string) loadgen.Options {
	lo := b.o.publishOptions(prefix, b.o.scenarioLoad())
	if lo.DuplicateWindow == 0 {
		lo.DuplicateWindow = b.dupWindow
	}
	return lo
}

// deleteStream removes a run's stream and the dead-letter stream jetsink
// made for it.
func (b *bencher) deleteStream(stream string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = b.js.DeleteStream(ctx, stream)
	_ = b.js.DeleteStream(ctx, stream+"_DLQ")
}

// createTable makes t's table: the mapped columns plus committed_at, which
// COPY fills with its default, and for jetsink in exactly-once mode (the
// variant's, else the configuration's) the unique index that mode needs.
func (b *bencher) createTable(ctx context.Context, tg target) error {
	table := tg.table
	t := pgx.Identifier{table}.Sanitize()
	_, err := b.db.Exec(ctx, "DROP TABLE IF EXISTS "+t+"; CREATE TABLE "+t+` (
	id uuid NOT NULL, ts timestamptz NOT NULL, device text, kind text, value double precision,
	seq bigint, site text, body jsonb, stream text, stream_seq bigint, published_at timestamptz, received_at timestamptz,
	committed_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	if err != nil {
		return fmt.Errorf("bench: create table %s: %w", table, err)
	}
	if tg.engine == EngineJetsink && b.exactlyOnce(tg.variant.Name) {
		if _, err := b.db.Exec(ctx, "CREATE UNIQUE INDEX ON "+t+" (stream, stream_seq)"); err != nil {
			return fmt.Errorf("bench: create the exactly-once index on %s: %w", table, err)
		}
	}
	return nil
}

func (b *bencher) dropTable(table string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = b.db.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
}

// benchColumns is loadgen's mapping plus the JetStream timestamp, which
// splits the latency into the part before the stream and the engine's.
func benchColumns() []pipeline.Column {
	return append(loadgen.Columns(),
		pipeline.Column{Name: "published_at", From: "meta:published_at", Type: pipeline.TypeTimestamptz},
		pipeline.Column{Name: "received_at", From: "meta:received_at", Type: pipeline.TypeTimestamptz})
}

// start starts t's engine as a subprocess.
func (b *bencher) start(t target) (*child, error) {
	// The URLs and NATS credentials go in the file (0600), not on the
	// command line, which any local user may read.
	path, err := b.writeConfig(t, b.engineConfig(t))
	if err != nil {
		return nil, err
	}
	if t.engine == EngineBaseline {
		return startChild(b.o.Exe, nil, "bench", "baseline", "--config", path, "--stream", t.stream,
			"--consumer", t.consumer, "--table", t.table)
	}
	args := []string{"run", "--config", path}
	for _, kv := range t.variant.Set {
		args = append(args, "--set", kv)
	}
	return startChild(b.o.Exe, t.variant.Env, args...)
}

// engineConfig is the configuration t's engine runs with: the servers'
// URLs it connects to (through the links, when there are), and for
// jetsink the run's stream, consumer, table and mapping.
func (b *bencher) engineConfig(t target) config.Config {
	if t.engine == EngineBaseline {
		return b.engineCfg
	}
	return jetsinkConfig(b.engineCfg, t)
}

// jetsinkConfig is cfg with t's stream, consumer, table and mapping, and
// the bench's settings for jetsink: the configuration jetsink runs t with.
func jetsinkConfig(cfg config.Config, t target) config.Config {
	cfg.NATS.Stream = t.stream
	cfg.NATS.Subjects = []string{t.prefix + ".>"}
	cfg.NATS.CreateStream = true
	// The stream is the bench's, made alike for both engines: jetsink
	// leaves it as it is (a config's nats.stream_* would change it for
	// jetsink only, and in a drain for the engine after it too).
	cfg.NATS.StreamMaxAge, cfg.NATS.StreamMaxBytes, cfg.NATS.StreamReplicas, cfg.NATS.StreamDuplicateWindow = 0, 0, 0, 0
	cfg.NATS.Consumer = t.consumer
	cfg.NATS.DeadLetterSubject = "benchdlq." + t.prefix
	cfg.Postgres.Table = t.table
	cfg.Postgres.CreateTable = false
	cfg.Postgres.Columns = benchColumns()
	cfg.Telemetry.Listen = ""
	// Info for its start-up line, which says what it ran with (RanWith);
	// after it, an Info line a minute (progress) and a few at the stop.
	cfg.Log.Level = "info"
	return cfg
}

// writeConfig writes cfg for t's engine into the bench's directory and
// returns its path.
func (b *bencher) writeConfig(t target, cfg config.Config) (string, error) {
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("bench: write config: %w", err)
	}
	path := filepath.Join(b.dir, t.table+".yaml")
	if err := os.WriteFile(path, raw, 0o600); err != nil { // it holds the database URL and credentials
		return "", fmt.Errorf("bench: write config: %w", err)
	}
	return path, nil
}

// pollTimeout bounds one consumer-info request of waitAcked.
const pollTimeout = 2 * time.Second

// waitAcked polls the consumer until every message of the stream up to
// lastSeq is acked and nothing is pending. It also returns the engine's CPU
// per event from first to the last poll (see steadyCPU); without a first
// mark (a drain), from the last poll before the consumer delivered anything
// (see steadyWindow).
func (b *bencher) waitAcked(ctx context.Context, c *child, t target, lastSeq uint64, first cpuMark) (*jetstream.ConsumerInfo, float64, error) {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, b.o.Timeout)
	defer cancel()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	pid := c.cmd.Process.Pid
	p := &ackPoller{
		info: func(ctx context.Context) (*jetstream.ConsumerInfo, error) {
			// Each request within pollTimeout, not --timeout: a busy
			// nats-server drops API requests it has no room for
			// unanswered, and one lost must not hold the poll (nor hide
			// the engine's exit) until the run's deadline.
			ctx, cancel := context.WithTimeout(ctx, pollTimeout)
			defer cancel()
			cons, err := b.js.Consumer(ctx, t.stream, t.consumer)
			if err != nil {
				return nil, err
			}
			return cons.CachedInfo(), nil
		},
		cpu:     func() (cpuMark, bool) { return cpuNow(pid) },
		lastSeq: lastSeq,
		w:       newSteadyWindow(first),
	}
	// The first poll at once, not a tick later: an engine that has
	// delivered within the first tick would leave a drain's window
	// without its first mark.
	for {
		if ci, steady, done := p.poll(ctx); done {
			return ci, steady, nil
		}
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return nil, 0, fmt.Errorf("bench: interrupted while %s drained: %w", t.engine, context.Cause(parent))
			}
			return nil, 0, fmt.Errorf("bench: %s did not drain within %v (--timeout): %w%s", t.engine, b.o.Timeout, ctx.Err(), logged(c))
		case <-c.done:
			return nil, 0, fmt.Errorf("bench: %s exited early (%v):\n%s", t.engine, c.err, c.out.String())
		case <-tick.C:
		}
	}
}

// ackPoller is waitAcked's poll of the consumer: info asks the server for
// its state, cpu reads the engine's CPU time.
type ackPoller struct {
	info    func(context.Context) (*jetstream.ConsumerInfo, error)
	cpu     func() (cpuMark, bool)
	lastSeq uint64
	w       *steadyWindow
}

// poll asks for the consumer's state once. When every message up to
// lastSeq is acked and nothing is pending, it returns the state and the
// engine's steady CPU per event (see steadyCPU), and done; until then it
// gives the steady window its mark.
func (p *ackPoller) poll(ctx context.Context) (ci *jetstream.ConsumerInfo, steady float64, done bool) {
	// The window's first mark is read before the request: what the
	// answer says was delivered (nothing, for a first mark) was delivered
	// by then too, the count only grows. Read after the round trip, it
	// could hold the CPU of messages delivered after the server answered,
	// which the window then counted without their CPU: the same bias as
	// a first mark too late, if smaller. Before, the window holds a little
	// more CPU than its events', never less.
	m, _ := p.cpu()
	ci, err := p.info(ctx)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		// Not created yet: nothing delivered. (The bench made the stream
		// before it started the engine: a stream not found is not this.)
		p.w.poll(m)
		return nil, 0, false
	case err != nil:
		// A timeout, or a 503 from a server too busy to answer, says
		// nothing of what was delivered: taken for "nothing yet", it
		// moved a drain's first mark past work already done, and the
		// steady CPU per event came out too low. No mark; the next poll
		// asks again.
		return nil, 0, false
	}
	if ci.AckFloor.Stream >= p.lastSeq && ci.NumPending == 0 && ci.NumAckPending == 0 {
		// The last mark, for the same bias, after the answer: the CPU of
		// every ack it counts is in it.
		last, ok := p.cpu()
		if !ok {
			return ci, 0, true
		}
		last.delivered = ci.Delivered.Stream
		return ci, steadyCPU(p.w.first, last), true
	}
	m.delivered = ci.Delivered.Stream
	p.w.poll(m)
	return nil, 0, false
}

// steadyWindow finds the first mark of a drain's steady CPU window in
// waitAcked's polls: the last one before the consumer had delivered
// anything (one that did not find the consumer counts; one the server did
// not answer does not, see ackPoller.poll). From there to the
// last ack, numerator and denominator cover the same work: everything the
// engine did for every event (receive, decode, COPY, commit, ack), counted
// by the consumer's delivered count at both marks. A window opened at the
// first ack instead left out the CPU of the up to max_ack_pending messages
// received and decoded by then while counting them. A rate run's first
// mark is the first scheduled send, before anything is delivered too.
type steadyWindow struct {
	first cpuMark
	open  bool // no delivery seen yet: a poll with none moves first
}

func newSteadyWindow(first cpuMark) *steadyWindow {
	return &steadyWindow{first: first, open: first.at.IsZero()}
}

// poll takes a poll's mark: m.delivered is what the consumer had delivered
// (0 before it existed); m.at is zero if the CPU could not be read.
func (w *steadyWindow) poll(m cpuMark) {
	switch {
	case !w.open:
	case m.delivered > 0:
		w.open = false // first stays the last mark before it, or none
	default:
		w.first = m
	}
}

// cpuMark is a process's CPU time when a consumer had delivered so many
// messages.
type cpuMark struct {
	at    time.Time
	ticks int64 // user + system, in clockTick
	// delivered is the stream sequence of the last message delivered:
	// the messages delivered, on a stream numbered from 1 without gaps,
	// which the bench's streams are.
	delivered uint64
}

// cpuNow samples pid's CPU time, with nothing delivered.
func cpuNow(pid int) (cpuMark, bool) {
	f, ok := procStat(pid)
	if !ok {
		return cpuMark{}, false
	}
	return cpuMark{at: time.Now(), ticks: f.utime + f.stime}, true
}

// steadyCPU is the CPU per delivered message, in µs, between two marks:
// the engine at work, without its start (exec, connecting, creating the
// consumer) or its shutdown. 0 when there is no first mark or the window
// is shorter than a second, where the 10 ms clock tick would make it
// coarse.
func steadyCPU(first, last cpuMark) float64 {
	if first.at.IsZero() || last.at.Sub(first.at) < time.Second || last.delivered <= first.delivered {
		return 0
	}
	cpu := time.Duration(last.ticks-first.ticks) * clockTick
	return float64(cpu.Microseconds()) / float64(last.delivered-first.delivered)
}

// waitReady polls until t's consumer exists and has a pull request open.
func (b *bencher) waitReady(ctx context.Context, c *child, t target) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: %s not consuming after a minute: %w\n%s", t.engine, ctx.Err(), c.out.String())
		case <-c.done:
			return fmt.Errorf("bench: %s exited early (%v):\n%s", t.engine, c.err, c.out.String())
		case <-tick.C:
		}
		if info, err := b.js.Consumer(ctx, t.stream, t.consumer); err == nil {
			if ci, err := info.Info(ctx); err == nil && ci.NumWaiting > 0 {
				return nil
			}
		}
	}
}

// drain starts t's engine on the preloaded stream and measures it.
func (b *bencher) drain(ctx context.Context, t target, pub loadgen.Result) (Result, error) {
	res := Result{Engine: t.engine, Variant: t.variant.Name, Published: pub.Acked,
		PublishPS: pub.SendRate(), PubRetried: pub.Retried}
	if err := b.createTable(ctx, t); err != nil {
		return res, err
	}
	defer b.dropTable(t.table)
	if err := b.checkpointFirst(ctx); err != nil {
		return res, err
	}
	clk := b.clocks(ctx)
	before, cpuOK := sampleCPU(b.pgPID)
	c, err := b.start(t)
	if err != nil {
		return res, err
	}
	return res, b.settle(ctx, &res, c, t, before, cpuOK, c.started, cpuMark{}, nil, clk)
}

// rate starts t's engine, publishes open loop, and measures it.
func (b *bencher) rate(ctx context.Context, t target) (Result, error) {
	res := Result{Engine: t.engine, Variant: t.variant.Name}
	if err := b.createTable(ctx, t); err != nil {
		return res, err
	}
	defer b.dropTable(t.table)
	if err := b.checkpointFirst(ctx); err != nil {
		return res, err
	}
	clk := b.clocks(ctx)
	before, cpuOK := sampleCPU(b.pgPID)
	c, err := b.start(t)
	if err != nil {
		return res, err
	}
	rss := sampleRSS(c.cmd.Process.Pid, 250*time.Millisecond, c.done)
	abort := func(err error) (Result, error) {
		rss.stop()
		c.kill()
		res.RanWith = ranWith(c.out.head()) // logged at its start: the failed run's settings too
		return res, err
	}
	if err := b.waitReady(ctx, c, t); err != nil {
		return abort(err)
	}
	acks, err := recordAcks(b.ackNC, t.stream, t.consumer)
	if err != nil {
		return abort(err)
	}
	defer acks.stop()
	pubCtx, stopPub := context.WithCancelCause(ctx)
	defer stopPub(nil)
	var lock *tableLock
	if b.o.LockFor > 0 {
		var err error
		if lock, err = b.lockTable(ctx, t.table, b.o.LockFor, rss.mark, stopPub); err != nil {
			return abort(err)
		}
	}
	// Everything is timed from the schedule's start, the first event's due
	// time: the steady CPU window opens there (nothing is delivered yet),
	// and the lock is taken LockAt after it.
	var first cpuMark
	o := b.publishOptions(t.prefix)
	o.Started = func(start time.Time) {
		first, _ = cpuNow(c.cmd.Process.Pid)
		if lock != nil {
			lock.start(start.Add(b.o.LockAt))
		}
	}
	pub, err := loadgen.Publish(pubCtx, b.js.Conn(), o)
	if err != nil {
		err = fmt.Errorf("bench: publish: %w", err)
	}
	if lock != nil {
		if err != nil {
			lock.cancel()
		}
		if lerr := lock.wait(); lerr != nil && (err == nil || context.Cause(pubCtx) == lerr) {
			err = lerr // the lock failed and stopped the publisher
		}
	}
	if err != nil {
		return abort(err)
	}
	res.Published, res.PublishPS, res.PubRetried, res.PubLate = pub.Acked, pub.SendRate(), pub.Retried, pub.Late
	res.SendLag = sendLag(pub)
	err = b.settle(ctx, &res, c, t, before, cpuOK, pub.Start, first, acks, clk)
	samples := rss.stop()
	res.RSS = perSecond(samples, pub.Start)
	if lock != nil && err == nil {
		caughtUp, cerr := lastCommitSentBy(ctx, b.db, t.table, b.byCommitTS, lock.held, res.clk.pg.Offset)
		if cerr != nil {
			return res, fmt.Errorf("bench: measure the catch-up: %w", cerr)
		}
		res.Lock = lock.result(samples, pub.Start, caughtUp)
	}
	return res, err
}

// sendLag is pub's send lag in the report's terms; nil for a preload.
func sendLag(pub loadgen.Result) *SendLag {
	if pub.SendLag == nil {
		return nil
	}
	// The exact max, where the histogram's is its bucket's top.
	return &SendLag{Percentiles: percentiles(pub.SendLag, pub.SendLagMax.Microseconds()), Over1ms: pub.SentOver1ms}
}

// settle waits until t's engine c has acked the res.Published events, stops
// it and fills res: the machine's CPU since before (when cpuOK), the
// engine's usage and log problems, its steady CPU since first (see
// waitAcked), and what the table says, with elapsed time counted from from
// and latency ending at acks, when non-nil (see measureTable), and the
// servers' timestamps corrected for their clocks (clk, as estimated before
// the run; finish estimates them again).
func (b *bencher) settle(ctx context.Context, res *Result, c *child, t target, before cpuSample, cpuOK bool, from time.Time,
	first cpuMark, acks *ackTimes, clk clocks) error {
	ci, steady, err := b.waitAcked(ctx, c, t, uint64(res.Published), first)
	// Logged at its start, long before: what it ran with, failed or not.
	res.RanWith = ranWith(c.out.head())
	if err != nil {
		c.kill()
		res.Log = c.problems(10)
		return err
	}
	if acks != nil {
		acks.stop() // every ack is in: the server sends what it has before the drain ends
	}
	res.SteadyCPUPerEvent = steady
	if after, ok := sampleCPU(b.pgPID); ok && cpuOK {
		res.machineCPU(before, after)
		if m, ok := cpuNow(c.cmd.Process.Pid); ok && res.Published > 0 {
			res.MachineEngineCPUPerEvent = (time.Duration(m.ticks) * clockTick).Seconds() * 1e6 / float64(res.Published)
		}
	}
	usage, stopErr := c.stop(30 * time.Second)
	res.Log = c.problems(10)
	if err := b.finish(ctx, res, t, ci, usage, from, acks, clk); err != nil {
		return err
	}
	if stopErr != nil {
		return fmt.Errorf("bench: %s: %w\n%s", t.engine, stopErr, c.out.String())
	}
	return nil
}

// machineCPU fills the machine-wide CPU figures from two samples. It
// needs res.Published.
func (r *Result) machineCPU(before, after cpuSample) {
	if r.Published == 0 {
		return
	}
	busy, idle, steal := after.busy-before.busy, after.idle-before.idle, after.steal-before.steal
	r.MachineCPUPerEvent = busy.Seconds() * 1e6 / float64(r.Published)
	if busy+idle > 0 {
		r.MachineBusy = float64(busy) / float64(busy+idle)
	}
	if busy+idle+steal > 0 {
		r.MachineSteal = float64(steal) / float64(busy+idle+steal)
	}
	r.BenchCPUPerEvent = (after.self - before.self).Seconds() * 1e6 / float64(r.Published)
	if before.pgOK && after.pgOK {
		r.PostgresCPUPerEvent = (after.pg - before.pg).Seconds() * 1e6 / float64(r.Published)
	}
}

// finish fills res from the table, the consumer and the child's usage,
// with the servers' timestamps taken less their clocks' offsets over the
// run: clk, estimated before it, and an estimate now.
func (b *bencher) finish(ctx context.Context, res *Result, t target, ci *jetstream.ConsumerInfo, u Usage, from time.Time,
	acks *ackTimes, clk clocks) error {
	res.Load1 = loadAvg1()
	res.clk = clk.over(b.clocks(ctx))
	res.PGClockOffsetMs, res.PGClockUncertaintyMs = millis(res.clk.pg.Offset), millis(res.clk.pg.Uncertainty)
	res.PGClockRoundTripMs, res.PGClockUnknown = millis(res.clk.pg.RTT), res.clk.pg.Unknown
	res.NATSClockOffsetMs, res.NATSClockUncertaintyMs = millis(res.clk.nats.Offset), millis(res.clk.nats.Uncertainty)
	res.NATSClockRoundTripMs, res.NATSClockUnknown = millis(res.clk.nats.RTT), res.clk.nats.Unknown
	window := time.Second
	if b.o.Scenario == ScenarioRate && b.o.Duration < 20*time.Second {
		window = max(b.o.Duration/20, 10*time.Millisecond)
	}
	if b.o.Scenario == ScenarioDrain {
		window = 0 // a drain's latency is its commit time less the engine's start: over time, that is the time axis
	}
	f, err := measureTable(ctx, b.db, t.table, b.byCommitTS, window, acks, from, int64(res.Published), res.clk)
	if err != nil {
		return fmt.Errorf("bench: measure %s: %w", t.table, err)
	}
	commit := "committed_at (copy time)"
	if b.byCommitTS {
		commit = "pg_xact_commit_timestamp"
	}
	switch {
	case acks == nil:
		res.LatencyFrom = commit + ", from the engine's start"
	case f.acked == f.latency.Count:
		res.LatencyFrom = "the first ack the bench saw"
	default:
		res.LatencyFrom = fmt.Sprintf("the first ack the bench saw (%d of %d events; the rest %s)", f.acked, f.latency.Count, commit)
	}
	res.LatencyAcked = f.acked
	res.CommitIsCopy = !b.byCommitTS
	res.LatencyCommitToAck, res.LatencyToCommit = f.commitToAck, f.toCommit
	res.Rows, res.Duplicate, res.Stray = f.rows, f.duplicates, f.stray
	res.Missing = int64(res.Published) - f.seqsStored
	res.Latency, res.Curve, res.Timeline, res.Batches = f.latency, f.curve, f.timeline, f.batches
	res.LatencyToStream, res.LatencyInEngine = f.toStream, f.inEngine
	res.LatencyBeforeCopy, res.LatencyCopyToCommit = f.beforeCopy, f.copyToCommit
	res.LatencyDelivery, res.LatencyInside = f.delivery, f.inside
	if !f.last.IsZero() {
		res.ElapsedS = f.last.Sub(from).Seconds()
		res.StartupS = f.first.Sub(from).Seconds()
		if res.ElapsedS > 0 {
			res.EventsPerSec = float64(f.seqsStored) / res.ElapsedS
		}
	}
	res.CPUSeconds = u.CPU.Seconds()
	if res.Published > 0 {
		res.CPUPerEvent = u.CPU.Seconds() * 1e6 / float64(res.Published)
		res.CPUPerMillion = res.CPUPerEvent
	}
	res.PeakRSS = u.PeakRSS
	res.RSSAnonMax, res.RSSFileAtAnonMax, res.RSSFileMax, res.RSSShmemMax = u.Mem.Anon, u.Mem.FileAtAnon, u.Mem.File, u.Mem.Shmem
	res.Redelivered = int64(ci.Delivered.Consumer) - int64(res.Published)
	s, err := b.js.Stream(ctx, t.stream)
	if err != nil {
		return fmt.Errorf("bench: stream %s: %w", t.stream, err)
	}
	res.StreamLastSeq = s.CachedInfo().State.LastSeq
	return nil
}

// line is r in one line and its details, for a run of scenario.
func (r Result) line(scenario string) string {
	steady := ""
	if r.SteadyCPUPerEvent > 0 {
		steady = fmt.Sprintf(" (%.2f steady)", r.SteadyCPUPerEvent)
	}
	rss := ""
	if r.RSSAnonMax > 0 {
		rss = fmt.Sprintf(" (anon %.1f, file %.1f)", mib(r.RSSAnonMax), mib(r.RSSFileMax))
	}
	s := fmt.Sprintf("%-8s %9.0f events/s  CPU %5.2f µs/event%s  RSS %5.1f MiB%s  latency p50 %.1f p90 %.1f p99 %.1f p99.9 %.1f max %.1f ms  batches %d (p50 %d rows)  redelivered %d  load %.2f",
		r.Engine, r.EventsPerSec, r.CPUPerEvent, steady, float64(r.PeakRSS)/(1<<20), rss, r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.P999, r.Latency.Max,
		r.Batches.Count, r.Batches.P50, r.Redelivered, r.Load1)
	if r.MachineCPUPerEvent > 0 {
		engine := r.MachineEngineCPUPerEvent
		if engine == 0 {
			engine = r.CPUPerEvent
		}
		rest := r.MachineCPUPerEvent - engine - r.BenchCPUPerEvent
		stolen := ""
		if r.MachineSteal >= 0.005 {
			stolen = fmt.Sprintf(" (of the CPU time it had; %.0f%% more stolen by the hypervisor)", 100*r.MachineSteal)
		}
		s += fmt.Sprintf("\n           machine %.0f%% busy%s, %.2f µs CPU/event in all: %.2f this engine, %.2f nats-server+bench, ",
			100*r.MachineBusy, stolen, r.MachineCPUPerEvent, engine, r.BenchCPUPerEvent)
		if r.PostgresCPUPerEvent > 0 {
			s += fmt.Sprintf("%.2f PostgreSQL, %.2f other", r.PostgresCPUPerEvent, rest-r.PostgresCPUPerEvent)
		} else {
			s += fmt.Sprintf("%.2f the rest (PostgreSQL, other)", rest)
		}
	}
	commit := r.commitEnd()
	switch {
	case r.LatencyInEngine.Count == 0:
	case scenario == ScenarioDrain:
		// A drain's send->stored is the preload's, before the engine
		// started: no part of its latency, which stored->commit is whole.
		s += fmt.Sprintf("\n           stored->%s (from the engine's start) p50 %.1f p99 %.1f p99.9 %.1f max %.1f ms",
			commit, r.LatencyInEngine.P50, r.LatencyInEngine.P99, r.LatencyInEngine.P999, r.LatencyInEngine.Max)
	default:
		s += fmt.Sprintf("\n           of which send->stored p50 %.1f p99 %.1f max %.1f ms, stored->%s p50 %.1f p99 %.1f p99.9 %.1f max %.1f ms",
			r.LatencyToStream.P50, r.LatencyToStream.P99, r.LatencyToStream.Max,
			commit, r.LatencyInEngine.P50, r.LatencyInEngine.P99, r.LatencyInEngine.P999, r.LatencyInEngine.Max)
	}
	if r.LatencyCopyToCommit.Count > 0 {
		s += fmt.Sprintf("\n           stored->COPY p50 %.1f p99 %.1f max %.1f ms, COPY->commit p50 %.1f p99 %.1f max %.1f ms",
			r.LatencyBeforeCopy.P50, r.LatencyBeforeCopy.P99, r.LatencyBeforeCopy.Max,
			r.LatencyCopyToCommit.P50, r.LatencyCopyToCommit.P99, r.LatencyCopyToCommit.Max)
	}
	if r.LatencyInside.Count > 0 {
		s += fmt.Sprintf("\n           stored->received p50 %.1f p99 %.1f max %.1f ms, received->COPY p50 %.1f p99 %.1f max %.1f ms",
			r.LatencyDelivery.P50, r.LatencyDelivery.P99, r.LatencyDelivery.Max,
			r.LatencyInside.P50, r.LatencyInside.P99, r.LatencyInside.Max)
	}
	if r.LatencyCommitToAck.Count > 0 {
		s += fmt.Sprintf("\n           commit->ack seen p50 %.1f p99 %.1f max %.1f ms; send->%s p50 %.1f p99 %.1f p99.9 %.1f max %.1f ms",
			r.LatencyCommitToAck.P50, r.LatencyCommitToAck.P99, r.LatencyCommitToAck.Max,
			commit, r.LatencyToCommit.P50, r.LatencyToCommit.P99, r.LatencyToCommit.P999, r.LatencyToCommit.Max)
	}
	if l := r.Lock; l != nil {
		s += fmt.Sprintf("\n           table locked at %.1f s for %.1f s: RSS %.1f MiB as it was taken, at most %.1f while held (%+.1f), %.1f catching up; everything sent before the release committed %.1f s after it",
			l.AtS, l.HeldS, mib(l.RSSBefore), mib(l.RSSMaxDuring), mib(l.RSSGrowth), mib(l.RSSMaxCatchUp), l.CatchUpS)
		if l.RSSAnonBefore > 0 {
			s += fmt.Sprintf("\n           of which anon (RssAnon) %.1f MiB as it was taken, at most %.1f while held (%+.1f), %.1f catching up",
				mib(l.RSSAnonBefore), mib(l.RSSAnonMaxDuring), mib(l.RSSAnonGrowth), mib(l.RSSAnonMaxCatchUp))
		}
	}
	for _, l := range r.Log {
		s += "\n           log: " + l
	}
	if r.Missing != 0 || r.Duplicate != 0 || r.Stray != 0 {
		s += fmt.Sprintf("  MISSING %d DUPLICATE %d STRAY %d", r.Missing, r.Duplicate, r.Stray)
	}
	return s
}

// commitEnd names where r's legs "to the commit" end: the commit, or the
// COPY when the server tracks no commit timestamps (CommitIsCopy).
func (r Result) commitEnd() string {
	if r.CommitIsCopy {
		return "COPY"
	}
	return "commit"
}

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

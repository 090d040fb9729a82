package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetsink/jetsink/telemetry"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
)

// Processor is one running jetsink: connected to NATS and PostgreSQL, ready
// to Run.
type Processor struct {
	cfg      config.Config
	log      *slog.Logger
	consumer *consumer.Consumer
	sink     *sink.Sink
	pipeline *pipeline.Pipeline
	tracing  *telemetry.Tracing
	metrics  *telemetry.Metrics

	adminAddr   atomic.Pointer[net.Addr]
	admin       atomic.Pointer[adminServer] // served by New, taken by Run's serveAdmin or stopped by Shutdown
	phase       atomic.Pointer[string]      // what New is doing, for the start-up handler
	exportStuck atomic.Bool                 // Run's last flush failed

	laterMu sync.Mutex
	later   []func() // what Run leaves for Shutdown, in order (see atShutdown)
	shut    bool     // Shutdown has run them: what comes now runs when Run returns

	stagesOnce sync.Once // CloseStages once
	stagesErr  error
	closeOnce  sync.Once // Shutdown (and Close) once
	closeErr   error
}

// New binds the admin listener's address (telemetry.listen) first and
// serves it at once, then connects to NATS and PostgreSQL and builds the
// stages. Until Run serves the admin endpoints for real, /healthz, /readyz
// and /metrics answer 503 with "starting: " and what New is doing (or
// "connected, not running yet" once it has returned); Run takes the
// listener over without closing it. Shutdown (or Close) stops it if Run
// never does; New stops it when it fails, cutting off what is in flight
// (abortAdmin). cfg must have passed Validate.
// Errors come from the stage that failed (consumer, sink or pipeline
// sentinels, wrapped with the operation).
func New(ctx context.Context, cfg config.Config, log *slog.Logger) (*Processor, error) {
	mapper, err := pipeline.Compile(cfg.Columns())
	if err != nil {
		return nil, fmt.Errorf("compile mapping: %w", err)
	}
	p := &Processor{log: log}
	if cfg.NATS.Destination == "" {
		// Recorded in the durable's metadata: other instances warn of a
		// jetsink writing elsewhere, and a renamed consumer is refused
		// (consumer.Config.Destination), for every caller (run, demo).
		cfg.NATS.Destination = Destination(cfg.Postgres.URL, cfg.Postgres.Table)
	}
	if cfg.Pipeline.Workers == 0 {
		cfg.Pipeline.Workers = pipeline.PhysicalCores()
	}
	workers := cfg.Pipeline.Workers
	// What the chain can hold beyond the pull buffer: both rings of every
	// worker, the events waiting for their dead letters in its lanes, and
	// one open batch per connection plus the one being filled.
	cfg.NATS.DeriveMaxAckPending(workers*(2*cfg.Pipeline.RingSize+pipeline.LettersPerWorker) +
		(cfg.Postgres.Connections+1)*cfg.Postgres.Batch.MaxRows)
	p.cfg = cfg
	// The admin listener's address first: taken (another jetsink on the
	// host), it is said before NATS and PostgreSQL are touched. Served at
	// once: a probe during start-up (an index built for minutes) is
	// answered 503 with the phase, not left waiting.
	p.setPhase("setting up telemetry")
	if cfg.Telemetry.Listen != "" {
		l, err := telemetry.Listen(cfg.Telemetry.Listen)
		if err != nil {
			return nil, err
		}
		p.startAdmin(l)
	}

	tc := cfg.Telemetry
	p.tracing, err = telemetry.NewTracing(ctx, telemetry.Config{ServiceName: tc.ServiceName, OTLPEndpoint: tc.OTLPEndpoint,
		SampleRatio: tc.SampleRatio, MaxLinks: cfg.Postgres.Batch.MaxRows, Log: log})
	if err != nil {
		p.abortAdmin()
		return nil, fmt.Errorf("tracing: %w", err)
	}
	if p.metrics, err = telemetry.NewMetrics(tc.ServiceName); err != nil {
		p.fail()
		return nil, fmt.Errorf("metrics: %w", err)
	}

	// Dead letters from the workers and the sink are counted by reason and
	// end the message's span; they go out through the consumer, made below.
	// In front, Causes gives a letter past max_deliver the cause of the
	// event's letter that failed before it: the metrics and the span then
	// count the letter that is stored.
	counted := &telemetry.DeadLetterer{Metrics: p.metrics}
	dl := &pipeline.Causes{Next: counted}
	sinkCfg := cfg.Postgres.Config
	if sinkCfg.InProgressEvery == 0 {
		// A third, so that one InProgress lost (with a connection, or
		// refused) still leaves the next in time: see sink's heartbeat.
		sinkCfg.InProgressEvery = cfg.NATS.AckWait / 3
	}
	sinkCfg.HoldRows = holdRows(&cfg, workers)
	setRelease(&sinkCfg, &cfg.NATS)
	p.setPhase("preparing the sink")
	if sinkCfg.CreateTable {
		// The index of exactly-once's key, built on a large table, can
		// take minutes.
		p.setPhase("connecting to PostgreSQL, creating the table and its index where missing (postgres.create_table)")
	}
	p.sink, err = sink.New(ctx, sinkCfg, mapper.Columns(), dl, log)
	if err != nil {
		p.fail()
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	natsCfg := cfg.NATS
	if sinkCfg.Mode == sink.ExactlyOnce {
		// Rows are keyed by (stream, stream_seq): a stream re-created
		// from sequence 1 would have its events skipped as duplicates.
		natsCfg.StoredSeq = p.sink.StoredSeq
	}
	p.setPhase("connecting to NATS and checking the stream and the consumer")
	p.consumer, err = consumer.New(ctx, natsCfg, log)
	if err != nil {
		p.fail()
		return nil, fmt.Errorf("start the NATS consumer: %w", err)
	}
	counted.Next = p.consumer
	if p.tracing.Enabled() {
		p.tracing.SetDestinations(cfg.NATS.Stream, p.consumer.Destinations())
		p.consumer.SetTracer(p.tracing.StartMessage)
	}
	p.sink.Instrument(p.tracing, p.metrics)
	p.sink.SetEpochs(p.consumer.Epochs())
	p.consumer.SetPullGate(p.sink.Warmed()) // nothing taken in before the committers connect
	p.consumer.SetPullPause(p.sink.Away)    // nor while the sink gives its events back
	if sinkCfg.HoldRows == math.MaxInt {
		// "No limit" holds only while the wire pull client pulls under
		// max_in_flight_bytes: nats.go pulls over a websocket, and after
		// wire could not connect, with no byte budget, and the rows the
		// sink took in would be the whole backlog.
		p.sink.SetHoldLimit(holdLimit(p.consumer.InFlightBytes, max(boundedHoldRows(&cfg, workers), cfg.NATS.MaxAckPending)))
	}
	p.sink.SetAckAll(p.consumer.AckAll) // counts the acks, for Shutdown to confirm
	p.pipeline, err = pipeline.New(cfg.Pipeline, mapper, dl, log)
	if err != nil {
		p.fail()
		return nil, fmt.Errorf("build pipeline: %w", err)
	}
	// The events waiting for their dead letters get InProgress as the
	// sink's rows do, and are bounded as those are.
	p.pipeline.SetHeartbeat(sinkCfg.InProgressEvery, p.consumer.Epochs())
	p.pipeline.SetLetterLimit(letterLimit(&cfg, p.consumer.InFlightBytes))
	logTelemetry(log, p.tracing, p.metrics)
	p.setPhase("connected, not running yet")
	return p, nil
}

// fail releases what a New that fails has made: the start-up admin
// server first, with no grace (abortAdmin), then the rest (Close).
func (p *Processor) fail() {
	p.abortAdmin()
	p.Close()
}

// abortAdmin stops the start-up admin server of a New that fails, and
// closes its listener, with no grace for the requests in flight: the
// start-up handler answers at once, so what a grace would wait for is a
// profile under way (telemetry.pprof) or a connection that has sent no
// request yet (http.Server.Shutdown counts one idle only after 5 s), and
// it would hold the failed start-up up to telemetry.ServeOn's 2 s, which
// nothing would cut short: Close sets no deadline, and the hard context
// that a second signal ends in jetsink run never reaches New. Those are
// cut off, and not logged: jetsink is not starting, and New's error says
// why.
func (p *Processor) abortAdmin() {
	if s := p.admin.Swap(nil); s != nil {
		if err := s.abort(); err != nil && !errors.Is(err, context.Canceled) {
			p.log.Warn("admin listener", "err", err)
		}
	}
}

// setPhase says what New is doing, for the start-up handler's 503.
func (p *Processor) setPhase(phase string) { p.phase.Store(&phase) }

// startPhase is the phase setPhase last set.
func (p *Processor) startPhase() string { return *p.phase.Load() }

// adminServer is the admin listener, served from New on: requests get
// the handler h holds, the start-up handler (telemetry.NewStarting) until
// Run swaps in its own, on the same listener and server, so that no
// connection is refused or dropped at the hand-over.
type adminServer struct {
	h          atomic.Pointer[http.Handler]
	addr       net.Addr
	stopServe  context.CancelFunc // begins the server's shutdown
	cancelHard context.CancelFunc // ends the grace of the requests in flight
	done       chan error         // ServeOn's result
}

func (s *adminServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// serve makes h what requests get from now on.
func (s *adminServer) serve(h http.Handler) { s.h.Store(&h) }

// stop shuts the server down and closes its listener: the requests in
// flight get telemetry.ServeOn's grace, which ends when hard does.
func (s *adminServer) stop(hard context.Context) error {
	unhook := context.AfterFunc(hard, s.cancelHard)
	defer unhook()
	s.stopServe()
	err := <-s.done
	s.cancelHard()
	return err
}

// abort shuts the server down and closes its listener at once: the
// requests in flight, and the connections that have sent none, are cut
// off (telemetry.ServeOn then returns an error wrapping context.Canceled).
func (s *adminServer) abort() error {
	s.cancelHard() // first: ServeOn's grace derives from it
	s.stopServe()
	return <-s.done
}

// startAdmin serves l with the start-up handler, and the profiles when
// telemetry.pprof is on (a start-up that hangs can be looked into).
func (p *Processor) startAdmin(l net.Listener) {
	s := &adminServer{done: make(chan error, 1)}
	starting := telemetry.NewStarting(p.startPhase)
	p.handlePprof(starting)
	s.serve(starting)
	ctx, stopServe := context.WithCancel(context.Background())
	hard, cancelHard := context.WithCancel(context.Background())
	s.stopServe, s.cancelHard = stopServe, cancelHard
	ready := make(chan net.Addr, 1)
	go func() { s.done <- telemetry.ServeOn(ctx, hard, l, s, ready) }()
	s.addr = <-ready // sent before ServeOn serves, whatever comes after
	p.admin.Store(s)
	p.log.Info("admin listener: starting", "addr", s.addr.String(), "answers", "503 until running")
}

// logTelemetry logs, at start-up, whether spans are exported, what samples
// them, and the service.name that spans and metrics carry: the resource's,
// which OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES take over
// telemetry.service_name.
func logTelemetry(log *slog.Logger, tr *telemetry.Tracing, m *telemetry.Metrics) {
	log.Info("telemetry", "tracing", tr.Enabled(), "sampling", tr.Sampler(), "service", m.ServiceName())
}

// Run moves events until intake is cancelled and everything taken in is
// committed and acked, dead-lettered, or (rows the database refused at
// the end with nothing left to commit to tell why: sink Stats.GivenUp)
// left unacked for JetStream to deliver again (returns nil), until hard ends (returns
// hard's error, context.Cause's), or until a stage fails (returns its error after the others
// have stopped). Once hard has ended, Run waits abortedBudget at most for
// the stages to stop: one that a write to a server that reads nothing
// holds (an ack, an InProgress, a dead letter, until the connection's
// write timeout) is logged at Warn and left running; it ends with that
// write, or when CloseStages closes its connection.
func (p *Processor) Run(intake, hard context.Context) error {
	callerHard := hard // the caller's: not ended by a stage's failure
	aborted := callerHard.Done()
	hard, cancelHard := context.WithCancelCause(hard)
	defer cancelHard(nil)
	intake, cancelIntake := context.WithCancel(intake)
	defer cancelIntake()

	// What a /metrics scrape fetches (the lag, the readiness checks) runs
	// under fetches: the SDK calls the callbacks with a context that never
	// ends, and the listener's shutdown waits for the scrape. They end
	// when the listener begins to stop (a scrape under way then reports
	// the figures fetched before) or when the caller's hard does.
	fetches, endFetches := context.WithCancel(callerHard)
	if p.cfg.Telemetry.Listen != "" {
		stop, err := p.serveAdmin(callerHard)
		if err != nil {
			endFetches()
			return err
		}
		// The listener outlives Run: Shutdown, which may wait for NATS to
		// confirm the last acks, stops it near its end, so that /healthz,
		// /readyz and /metrics answer until the process is about to exit.
		defer p.atShutdown(func() {
			endFetches()
			stop()
		})()
	}

	h, in := newHandoff(p.cfg.Pipeline)
	unobserve, err := p.observe(fetches, h)
	if err != nil {
		endFetches()
		return err
	}
	// After the listener: a last scrape still finds the final counts (the
	// counters are read by these callbacks, and vanish without them).
	defer p.atShutdown(func() {
		endFetches()
		unobserve()
	})()
	// Export the spans of everything settled. hard may be over already (a
	// stage failed, or the drain timed out): give the flush a moment anyway,
	// a short one when the caller's hard has ended (a second signal), and
	// none left once it ends during the flush.
	defer func() {
		budget := exportBudget
		select {
		case <-aborted:
			budget = abortedBudget
		default:
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(hard), budget)
		defer cancel()
		if budget == exportBudget {
			defer context.AfterFunc(callerHard, cancel)()
		}
		if p.tracing.Enabled() {
			p.log.Info("exporting the last spans", "within", budget)
		}
		if err := p.tracing.Flush(fctx); err != nil {
			p.log.Warn("tracing: spans not flushed", "err", err)
			p.exportStuck.Store(true) // Close does not wait as long again
		}
	}()

	st := &stages{hard: hard, cancelHard: cancelHard, cancelIntake: cancelIntake}
	st.start("consumer", func() error { return p.consumer.Run(intake, hard, in) })
	st.start("pipeline", func() error { return p.pipeline.RunHandoff(hard, h) })
	st.start("sink", func() error { return p.sink.Run(hard, h) })
	// GOMAXPROCS and connections beside workers: what a figure ran with
	// (jetsink bench reads this line; GOMAXPROCS follows a cgroup CPU
	// quota, which runtime.NumCPU does not).
	p.log.Info("jetsink running", "workers", p.cfg.Pipeline.Workers, "connections", p.cfg.Postgres.Connections,
		"gomaxprocs", runtime.GOMAXPROCS(0), "handoff", p.cfg.Pipeline.Handoff, "stream", p.cfg.NATS.Stream,
		"consumer", p.cfg.NATS.Consumer, "table", p.sink.LogName(), "mode", p.cfg.Postgres.Mode)
	progress, stopProgress := context.WithCancel(context.Background())
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		p.logProgress(progress, p.log)
	}()
	// Once the caller's hard has ended, the stages get abortedBudget to
	// stop, as the connections do in CloseStages: one held by a write to a
	// server that reads nothing (see stages.wait) is left to end at that
	// write's timeout, within the process's last seconds or after them.
	errs, stuck := st.wait(aborted, abortedBudget)
	if len(stuck) > 0 {
		p.log.Warn("hard stop: not waiting any longer for stages still running (each ends when what holds it times out); "+
			"nothing uncommitted is acked", "stages", strings.Join(stuck, ","), "held", strings.Join(heldBy(stuck, p.sink.OldestAttempt()), "; "),
			"waited", abortedBudget)
	}
	stopProgress() // the totals, once every stage has stopped (or been given up on)
	<-progressDone

	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := context.Cause(hard); err != nil {
		return err
	}
	return nil
}

// heldBy says what is known to hold each stage stuck names at a hard stop,
// given how long the sink's longest commit attempt under way has run (0:
// none). The sink is held by PostgreSQL while a commit attempt runs: a
// COPY given up on waits for the server's answer to its cancel (up to
// sink.CancelWait), which a server that does not answer (a
// blackholed host) never gives; otherwise, as the other stages, by a
// write to a NATS server that reads nothing (acks, InProgress, dead
// letters), until the connection's write timeout.
func heldBy(stuck []string, attempt time.Duration) []string {
	held := make([]string, 0, len(stuck))
	for _, name := range stuck {
		switch {
		case name == "sink" && attempt > 0:
			held = append(held, fmt.Sprintf("sink: a commit attempt on PostgreSQL under way for %v (a COPY given up on waits up to %v "+
				"for the server's answer to its cancel), or a write of acks to a NATS server that reads nothing",
				attempt.Round(time.Millisecond), sink.CancelWait))
		case name == "sink":
			held = append(held, "sink: no commit attempt under way; a write of its acks or InProgress to a NATS server that reads nothing, say")
		case name == "pipeline":
			held = append(held, "pipeline: a dead letter's publish to a NATS server that reads nothing, say")
		default:
			held = append(held, name+": a write to a NATS server that reads nothing, say")
		}
	}
	return held
}

// readiness is the checks /readyz runs and the jetsink_ready gauge
// reports, by name.
func (p *Processor) readiness() map[string]telemetry.Check {
	return map[string]telemetry.Check{
		"nats": func(context.Context) error {
			if !p.consumer.Ready() {
				return errors.New("not connected")
			}
			if err := p.consumer.NotConsuming(); err != nil {
				return err // the stream or consumer gone, no permission: retried for 30 s or more
			}
			if err := p.consumer.AcksRefused(); err != nil {
				return err // every event comes again after ack_wait
			}
			if err := p.consumer.DeadLettersDenied(); err != nil {
				return err // no dead letter stored (no permission, or the dead-letter stream or store full): poison events come again and again
			}
			return p.consumer.Refused() // a stream whose sequence restarted: not consuming
		},
		"postgres": p.sink.Ready,
	}
}

// serveAdmin serves the admin endpoints for real (/healthz, /readyz,
// /metrics) on the listener New serves, in place of the start-up handler,
// and returns the function that stops it and waits for it: the requests in
// flight then get a grace that hard's end cuts short (telemetry.ServeOn).
func (p *Processor) serveAdmin(hard context.Context) (stop func(), err error) {
	admin := telemetry.NewAdmin(p.readiness())
	admin.Handle("GET /metrics", p.metrics.Handler())
	p.handlePprof(admin)
	s := p.admin.Swap(nil)
	if s == nil {
		return nil, errors.New("admin listener: already served by an earlier Run, or closed by Shutdown")
	}
	select {
	case err := <-s.done: // it failed (accepting) while New ran
		return nil, err
	default:
	}
	s.serve(admin)
	p.adminAddr.Store(&s.addr)
	p.log.Info("admin listener", "addr", s.addr.String())
	return func() {
		if err := s.stop(hard); err != nil {
			p.log.Warn("admin listener", "err", err)
		}
	}, nil
}

// handlePprof adds Go's profiles to admin when telemetry.pprof is on.
func (p *Processor) handlePprof(admin *telemetry.Admin) {
	if p.cfg.Telemetry.Pprof {
		// Not /debug/pprof/cmdline: the command line can hold a
		// password (--database-url, --set nats.password=...), and the
		// listener is often published (0.0.0.0 in a container). Index
		// answers that path 404.
		admin.Handle("/debug/pprof/", http.HandlerFunc(pprof.Index))
		admin.Handle("/debug/pprof/profile", http.HandlerFunc(pprof.Profile))
		admin.Handle("/debug/pprof/symbol", http.HandlerFunc(pprof.Symbol))
		admin.Handle("/debug/pprof/trace", http.HandlerFunc(pprof.Trace))
	}
}

// AdminAddr is the admin listener's address once Run serves it for real
// (New serves it with the start-up handler before), nil before or when
// telemetry.listen is empty.
func (p *Processor) AdminAddr() net.Addr {
	if a := p.adminAddr.Load(); a != nil {
		return *a
	}
	return nil
}

// Consumer gives access to the consumer for health checks and lag.
func (p *Processor) Consumer() *consumer.Consumer { return p.consumer }

// Sink gives access to the sink for health checks and statistics.
func (p *Processor) Sink() *sink.Sink { return p.sink }

// PipelineStats returns the workers' counters.
func (p *Processor) PipelineStats() pipeline.Stats { return p.pipeline.Stats() }

// CloseStages ends the drain: it confirms that NATS has read the acks of
// the committed rows and closes the connections (consumer.Consumer.Close):
// while ctx has time left (at most 10 s when it has no deadline) it waits
// for a connection that is reconnecting; once ctx has ended it gives the
// connections abortedBudget and closes them. Then it closes the sink's
// admin connection (whose waits on PostgreSQL end with ctx too, see
// sink.Sink.CloseContext). The acks come first: they keep events from
// coming back, while the admin connection carries no data, and its close
// can wait seconds on a PostgreSQL that does not answer (or on a /readyz
// probe that holds it), which must not spend the drain's deadline first.
// Call it after Run returns; once it has returned nothing is acked any
// more, and what is left (Shutdown) is telemetry. The error wraps
// consumer.ErrAcksUnconfirmed when acks may not have reached NATS (their
// events come back after ack_wait); the consumer has logged how many.
// Later calls return the first call's result at once.
func (p *Processor) CloseStages(ctx context.Context) error {
	p.stagesOnce.Do(func() {
		if p.consumer != nil {
			p.stagesErr = p.consumer.Close(ctx)
		}
		if p.sink != nil {
			p.sink.CloseContext(ctx)
		}
	})
	return p.stagesErr
}

// Shutdown releases the connections (CloseStages, unless it has run) and
// shuts telemetry down, and returns CloseStages' error. The spans not yet
// exported get up to exportBudget more within ctx (Run has flushed them
// already), or abortedBudget when Run's flush failed or ctx has ended,
// plus up to a second for an export that had to be cancelled
// (telemetry.Tracing.Shutdown); meanwhile the admin listener stops: a
// scrape under way stops fetching (it reports the figures fetched before),
// and the requests in flight get up to 2 s, none once the hard context
// given to Run has ended (telemetry.ServeOn); then metrics get
// abortedBudget. So telemetry holds up the end for a little over 3 s at
// most (the export's 2 s, the exporter's second to stop, metrics' 250 ms),
// and for about 1.5 s at most once ctx (Run's hard) has ended: the
// export's 250 ms, the exporter's second, metrics' 250 ms. Call it after
// Run returns. Later calls, and Close, return the first call's result at
// once.
func (p *Processor) Shutdown(ctx context.Context) error {
	p.closeOnce.Do(func() { p.closeErr = p.shutdown(ctx) })
	return p.closeErr
}

// Close is Shutdown without a deadline of the caller's: the acks get up to
// 10 s to be confirmed. Its error is logged by the consumer.
func (p *Processor) Close() { _ = p.Shutdown(context.Background()) }

// closeAdminListener stops the listener New serves, and closes it, unless
// Run serves it: the start-up handler's requests in flight get the grace
// of telemetry.ServeOn, cut short when ctx ends.
func (p *Processor) closeAdminListener(ctx context.Context) {
	if s := p.admin.Swap(nil); s != nil {
		if err := s.stop(ctx); err != nil {
			p.log.Warn("admin listener", "err", err)
		}
	}
}

func (p *Processor) shutdown(ctx context.Context) error {
	p.closeAdminListener(ctx)
	err := p.CloseStages(ctx)
	// A second signal during the export ends it too (ctx), after which
	// the exporter gets the second it takes to give up.
	tctx, cancel := context.WithTimeout(ctx, exportBudget)
	if p.exportStuck.Load() || ctx.Err() != nil {
		cancel()
		tctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), abortedBudget)
	}
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := p.tracing.Shutdown(tctx); err != nil {
			p.log.Warn("tracing shutdown", "err", err)
		}
	})
	// Beside the export, not after it: neither waits for the other.
	p.laterMu.Lock()
	later := p.later
	p.later, p.shut = nil, true
	p.laterMu.Unlock()
	for _, f := range later {
		f()
	}
	wg.Wait()
	mctx, cancel := context.WithTimeout(context.Background(), abortedBudget)
	defer cancel()
	if err := p.metrics.Shutdown(mctx); err != nil {
		p.log.Warn("metrics shutdown", "err", err)
	}
	return err
}

// How long the export of the last spans may hold up the end of Run and
// Close: a collector that takes the connection and never answers would
// otherwise hold a stopping jetsink for as long as its exporter's timeouts.
const (
	exportBudget  = 2 * time.Second
	abortedBudget = 250 * time.Millisecond
)

// atShutdown leaves f, a clean-up of Run's, to Shutdown, which runs such
// functions in the order they were left, near its end. If Shutdown has
// run already, f runs when Run returns instead: call the result with
// defer.
func (p *Processor) atShutdown(f func()) (deferred func()) {
	p.laterMu.Lock()
	defer p.laterMu.Unlock()
	if p.shut {
		return f
	}
	p.later = append(p.later, f)
	return func() {}
}

// Tracing is the processor's tracing (Enabled false when off).
func (p *Processor) Tracing() *telemetry.Tracing { return p.tracing }

// newHandoff builds the hand-off cfg.Handoff names for cfg.Workers workers
// (already resolved from 0), and what the consumer pushes into: the
// hand-off itself, or for rings its Dispatch, one call per event fewer.
func newHandoff(cfg pipeline.Config) (pipeline.Handoff, consumer.Output) {
	h := pipeline.NewHandoff(cfg.Handoff, cfg.Workers, cfg.RingSize)
	if rh, ok := h.(*pipeline.RingHandoff); ok {
		return h, rh.In
	}
	return h, h
}

// releaseFloor is the least time the sink must have failed to reach
// PostgreSQL before it gives its events back (releaseAfter): as long as
// the sink's refusedFor and the consumer's stuckAfter, it rides out a
// failover or a pooler's restart, which should not send every event held
// here to another instance.
const releaseFloor = 30 * time.Second

// releaseAfter is sink.Config.ReleaseAfter for nats.ack_wait ackWait:
// ackWait, or releaseFloor if longer. ack_wait is how long the operator
// lets a crashed instance's events wait before they go to the others:
// those of an instance cut off from PostgreSQL wait as long, not longer
// (but for releaseFloor), and a cut shorter than that moves none.
func releaseAfter(ackWait time.Duration) time.Duration {
	return max(releaseFloor, ackWait)
}

// setRelease sets what the sink needs to give its events back to the
// durable's other instances, instead of holding them, once it cannot
// reach PostgreSQL (sink.Sink.Away): when (releaseAfter), and
// nats.max_deliver, since a give-back adds a delivery and an event on its
// last one is kept (-1, no limit, is the sink's 0).
func setRelease(sc *sink.Config, nc *consumer.Config) {
	sc.ReleaseAfter = releaseAfter(nc.AckWait)
	sc.MaxDeliver = max(nc.MaxDeliver, 0)
}

// holdRows is how many rows the sink may take in while the database
// stalls, so that InProgress reaches every in-flight message. No limit
// when nats.max_in_flight_bytes bounds what is in flight (the wire pull
// client), whatever nats.max_ack_pending: JetStream's count of unacked
// messages does not bound what jetsink holds, as the stream deletes
// messages jetsink holds (max_age, max_msgs, a purge: the server drops
// them from its pending count and delivers more), and a durable's
// max_ack_pending on the server may be above this instance's. A limit of
// max_ack_pending rows then filled during a long stall, the rows after it
// waited in the rings with no InProgress and came again every ack_wait,
// and each copy was stored (up to max_age/ack_wait times). Without that
// bound (nats.pull_client nats.go, max_in_flight_bytes -1) memory comes
// first: what the rings and the pull buffer hold, or max_ack_pending if
// more, and rows past it may be delivered again.
// (That no limit holds only while the wire client pulls: see holdLimit.)
// A database that cannot be reached at all, for releaseAfter, is not a
// stall: the sink gives back what it holds, and the consumer pulls no more
// (sink.Sink.Away).
func holdRows(cfg *config.Config, workers int) int {
	if cfg.NATS.PullClient != consumer.PullClientNATSGo && cfg.NATS.MaxInFlightBytes >= 0 {
		return math.MaxInt
	}
	return max(boundedHoldRows(cfg, workers), cfg.NATS.MaxAckPending)
}

// boundedHoldRows is what the rings and the pull buffer hold.
func boundedHoldRows(cfg *config.Config, workers int) int {
	ring := 1 << bits.Len(uint(max(cfg.Pipeline.RingSize, 1)-1)) // ringq rounds up to a power of two
	return 2*workers*ring + cfg.NATS.PullMessages()
}

// holdLimit is the sink's hold limit (sink.SetHoldLimit) when holdRows
// sets none: none while inFlight (consumer.InFlightBytes) reports a byte
// budget that bounds the pulls, else bounded.
func holdLimit(inFlight func() (held, limit int64), bounded int) func() int {
	return func() int {
		if _, limit := inFlight(); limit > 0 {
			return math.MaxInt
		}
		return bounded
	}
}

// letterLimit is how many events may wait in a worker's lanes for their
// dead letters (pipeline.SetLetterLimit): no limit while a byte budget
// bounds the pulls (the waiting events hold their share of it, as the
// rows the sink holds do: see holdRows), else nats.max_ack_pending or
// pipeline.DefaultLetterLimit, whichever is larger (so the default also
// when max_ack_pending is -1, no limit, or smaller than it).
func letterLimit(cfg *config.Config, inFlight func() (held, limit int64)) func() int {
	bounded := max(pipeline.DefaultLetterLimit, cfg.NATS.MaxAckPending)
	return func() int {
		if _, limit := inFlight(); limit > 0 {
			return math.MaxInt
		}
		return bounded
	}
}

// stages runs Run's three stages and stops all of them when one fails.
type stages struct {
	hard         context.Context // ends when the caller's does or a stage fails
	cancelHard   context.CancelCauseFunc
	cancelIntake context.CancelFunc
	mu           sync.Mutex
	errs         []error
	running      []*stage // in the order started
}

// stage is one of stages', done closed once its function has returned.
type stage struct {
	name string
	done chan struct{}
}

func (s *stages) start(name string, run func() error) {
	st := &stage{name: name, done: make(chan struct{})}
	s.mu.Lock()
	s.running = append(s.running, st)
	s.mu.Unlock()
	go func() {
		defer close(st.done)
		err := run()
		// A stage stopped by hard's end says so with hard's error (Canceled
		// or, for a caller's hard that ended by its deadline,
		// DeadlineExceeded; or its cause): not a failure of its own. Any
		// other error is one, even one that wraps context.Canceled (a
		// context of the stage's own) while hard lives: skipped, it would
		// leave the stage gone and the others running.
		if err == nil || s.endedByHard(err) {
			return
		}
		s.mu.Lock()
		s.errs = append(s.errs, fmt.Errorf("%s: %w", name, err))
		s.mu.Unlock()
		// One stage failing stops the whole chain: nothing after it can
		// make progress, and nothing before it may be acked. Intake too:
		// the consumer's start-up checks (the stored sequence, creating the
		// stream) wait on it, not on hard.
		s.cancelHard(err)
		s.cancelIntake()
	}()
}

// endedByHard reports whether err only says that hard has ended.
func (s *stages) endedByHard(err error) bool {
	herr := s.hard.Err()
	if herr == nil {
		return false
	}
	return errors.Is(err, context.Canceled) || errors.Is(err, herr) || errors.Is(err, context.Cause(s.hard))
}

// wait returns once every stage has stopped, with the failures; or, once
// aborted (the caller's hard) has ended, budget later at most, with the
// failures so far and the names of the stages still running. Those are
// held where hard's end cannot reach them: a write to a server that reads
// nothing (an ack, an InProgress, a dead letter) holds its connection's
// lock until its write timeout, 10 s or more, past what a cut-short stop
// promises. Nothing is lost by not waiting: acks follow COMMIT, so what
// they would still ack is committed, and what they leave unacked comes
// back after ack_wait.
func (s *stages) wait(aborted <-chan struct{}, budget time.Duration) (errs []error, stuck []string) {
	s.mu.Lock()
	all := slices.Clone(s.running)
	s.mu.Unlock()
	var giveUp <-chan time.Time
	for i := 0; i < len(all); {
		select {
		case <-all[i].done:
			i++
		case <-aborted:
			aborted = nil
			t := time.NewTimer(budget)
			defer t.Stop()
			giveUp = t.C
		case <-giveUp:
			for _, st := range all[i:] {
				select {
				case <-st.done:
				default:
					stuck = append(stuck, st.name)
				}
			}
			i = len(all)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.errs), stuck
}

package tests

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var uniq atomic.Int64

// env is one test's servers, stream and table.
type env struct {
	t       *testing.T
	nats    *testenv.NATSServer // nil on a cluster (newClusterEnv)
	natsURL string
	nc      *nats.Conn
	js      jetstream.JetStream
	pg      *testenv.PG
	db      *pgx.Conn
	stream  string
	prefix  string // subject prefix
	table   string
	run     uint64
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOn(t, testenv.Postgres(t))
}

// newEnvOn is newEnv on a database of the caller's choosing (e.g. on a
// cluster the test stops and starts).
func newEnvOn(t *testing.T, pg *testenv.PG) *env {
	t.Helper()
	srv := testenv.NATS(t)
	return newEnvWith(t, srv, srv.URL(), srv.Connect(t), pg)
}

// newClusterEnv is newEnv on a NATS cluster: clients are given every
// node's URL.
func newClusterEnv(t *testing.T, cl *testenv.NATSCluster) *env {
	t.Helper()
	return newEnvWith(t, nil, cl.URLs(), cl.Connect(t), testenv.Postgres(t))
}

func newEnvWith(t *testing.T, srv *testenv.NATSServer, natsURL string, nc *nats.Conn, pg *testenv.PG) *env {
	t.Helper()
	n := uniq.Add(1)
	e := &env{
		t:       t,
		nats:    srv,
		natsURL: natsURL,
		nc:      nc,
		pg:      pg,
		stream:  fmt.Sprintf("E2E_%d", n),
		prefix:  fmt.Sprintf("e2e%d", n),
		table:   fmt.Sprintf("events_%d", n),
		run:     uint64(time.Now().UnixNano()),
	}
	var err error
	if e.js, err = jetstream.New(e.nc); err != nil {
		t.Fatal(err)
	}
	e.db = e.pg.Conn(t)
	return e
}

// config is a processor configuration for this env.
func (e *env) config(mode sink.Mode) config.Config {
	cfg := config.Default()
	cfg.NATS.URL = e.natsURL
	cfg.NATS.Stream = e.stream
	cfg.NATS.Subjects = []string{e.prefix + ".>"}
	cfg.NATS.CreateStream = true
	cfg.NATS.Consumer = "jetsink"
	cfg.NATS.DeadLetterSubject = "dlq." + e.stream
	cfg.NATS.AckWait = 10 * time.Second
	cfg.Pipeline.Workers = 2
	cfg.Pipeline.RingSize = 1024
	cfg.Postgres.URL = e.pg.URL
	cfg.Postgres.Table = e.table
	cfg.Postgres.CreateTable = true
	cfg.Postgres.Mode = mode
	cfg.Postgres.Batch.MaxRows = 1000
	cfg.Postgres.Columns = loadgen.Columns()
	cfg.DrainTimeout = 30 * time.Second
	cfg.Telemetry.Listen = "127.0.0.1:0" // tests run in parallel processes
	if err := cfg.Validate(); err != nil {
		e.t.Fatalf("test config: %v", err)
	}
	return cfg
}

// createStreams makes the event stream and a dead-letter stream, as an
// operator would before starting jetsink.
func (e *env) createStreams(ctx context.Context) {
	e.t.Helper()
	if _, err := e.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.prefix + ".>"}}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: e.stream + "_DLQ", Subjects: []string{"dlq." + e.stream}}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) publish(ctx context.Context, first uint64, n, subjects int) {
	e.t.Helper()
	res, err := loadgen.Publish(ctx, e.nc, loadgen.Options{Subject: e.prefix, Subjects: subjects, Events: n, Run: e.run, First: first})
	if err != nil {
		e.t.Fatalf("publish: %+v: %v", res, err)
	}
}

// running is a processor running in this test process.
type running struct {
	stopIntake context.CancelFunc
	stopHard   context.CancelFunc
	done       chan error
	p          *processor.Processor
}

// start runs a processor of cfg (newProcessor, launch).
func (e *env) start(ctx context.Context, cfg config.Config) *running {
	e.t.Helper()
	return e.launch(ctx, e.newProcessor(ctx, cfg))
}

// newProcessor makes a processor of cfg that logs warnings and errors to
// the test's log.
func (e *env) newProcessor(ctx context.Context, cfg config.Config) *processor.Processor {
	e.t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := processor.New(ctx, cfg, log)
	if err != nil {
		e.t.Fatalf("processor.New: %v", err)
	}
	return p
}

// launch runs p until the test's cleanup, which stops its intake and waits
// for it (stopping it hard after 30 s).
func (e *env) launch(ctx context.Context, p *processor.Processor) *running {
	intake, stopIntake := context.WithCancel(ctx)
	hard, stopHard := context.WithCancel(context.WithoutCancel(ctx))
	r := &running{stopIntake: stopIntake, stopHard: stopHard, done: make(chan error, 1), p: p}
	go func() { r.done <- p.Run(intake, hard) }()
	e.t.Cleanup(func() {
		r.stopIntake()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			r.stopHard()
			<-r.done
		}
		r.stopHard()
		p.Close()
	})
	return r
}

// drain stops intake and waits for a clean return.
func (r *running) drain(t *testing.T) {
	t.Helper()
	r.stopIntake()
	select {
	case err := <-r.done:
		r.done <- err // for Cleanup
		if err != nil {
			t.Fatalf("Run after drain: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60s of stopping intake")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s; last state: %s", what, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (e *env) count(ctx context.Context, query string, args ...any) int64 {
	e.t.Helper()
	var n int64
	if err := e.db.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// lockTable locks the event table in mode (ACCESS EXCLUSIVE stops reads
// too, EXCLUSIVE lets them through) in a transaction on conn; ending the
// transaction releases it.
func (e *env) lockTable(ctx context.Context, conn *pgx.Conn, mode string) pgx.Tx {
	e.t.Helper()
	tx, err := conn.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+e.tableID()+" IN "+mode+" MODE"); err != nil {
		e.t.Fatalf("lock table: %v", err)
	}
	return tx
}

func (e *env) rows(ctx context.Context) int64 {
	return e.count(ctx, "SELECT count(*) FROM "+pgx.Identifier{e.table}.Sanitize())
}

func (e *env) consumerInfo(ctx context.Context) *jetstream.ConsumerInfo {
	e.t.Helper()
	c, err := e.js.Consumer(ctx, e.stream, "jetsink")
	if err != nil {
		e.t.Fatalf("consumer info: %v", err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		e.t.Fatalf("consumer info: %v", err)
	}
	return info
}

// waitDrained waits until the table holds want distinct ids and the
// consumer has nothing pending or unacked.
func (e *env) waitDrained(ctx context.Context, want int64, running ...*running) {
	e.t.Helper()
	waitFor(e.t, ctx, fmt.Sprintf("%d rows and an empty consumer", want), func() (bool, string) {
		for _, r := range running {
			select {
			case err := <-r.done:
				r.done <- err // for Cleanup
				e.t.Fatalf("processor stopped while draining: %v", err)
			default:
			}
		}
		ids := e.count(ctx, "SELECT count(DISTINCT id) FROM "+pgx.Identifier{e.table}.Sanitize())
		info := e.consumerInfo(ctx)
		state := fmt.Sprintf("distinct ids %d, pending %d, ack pending %d, redelivered %d", ids, info.NumPending, info.NumAckPending, info.NumRedelivered)
		return ids == want && info.NumPending == 0 && info.NumAckPending == 0, state
	})
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/embedded"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
)

func newDemoCmd() *cobra.Command {
	var (
		events, subjects int
		mode             string
		keep             bool
		verbose          bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run everything on this machine: embedded NATS, a throwaway PostgreSQL, publish, drain, report",
		Long: `Start an embedded nats-server with JetStream and a throwaway PostgreSQL
cluster (PostgreSQL 15 or newer: initdb and pg_ctl on PATH, else the
newest under /usr/lib/postgresql; as root it runs as the postgres
user), publish --events telemetry events over --subjects subjects, run
jetsink until every event is settled (committed and then acked, or
dead-lettered), print what happened, and remove everything. --keep leaves
both servers up until Ctrl-C so you can look.

Ctrl-C (SIGINT or SIGTERM) stops publishing and pulling, lets jetsink commit
what it holds, removes everything and exits 1 (0 once --keep is waiting); a
second one gives the drain up and exits with status 130. Killed outright
(SIGKILL, the OOM killer), the demo takes PostgreSQL down with it, but its
directories in the temporary directory (jetsink-nats-*, jetsink-pg-* and,
with --keep, jetsink-demo-*, whose config file holds the password of a
server gone) stay until the next demo removes them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Before the servers start, which takes seconds.
			switch m := sink.Mode(mode); {
			case m != sink.AtLeastOnce && m != sink.ExactlyOnce:
				return usageError{fmt.Errorf("--mode %q: use %s or %s", mode, sink.AtLeastOnce, sink.ExactlyOnce)}
			case events < 1:
				return usageError{fmt.Errorf("--events %d: publish at least 1", events)}
			case subjects < 1 || subjects > loadgen.MaxSubjects:
				return usageError{fmt.Errorf("--subjects %d: give 1 up to %d", subjects, loadgen.MaxSubjects)}
			}
			pub := loadgen.Options{Subject: "events", Subjects: subjects, Events: events}
			if err := pub.Validate(); err != nil {
				return usageError{err}
			}
			out := cmd.OutOrStdout()
			// The first signal stops publishing and pulling and lets the
			// drain finish (or ends --keep); a second one gives the drain
			// up, as in run, and a third ends the process.
			intake, hard, stop := signalStages(cmd, "stopping; a second signal exits at once", "exiting now")
			defer stop()
			// stopped is the error to return once a signal came: the
			// first one's, or errAborted after a second.
			stopped := func(err error) error {
				if cause := context.Cause(hard); errors.Is(cause, errAborted) {
					return cause
				}
				if intake.Err() != nil {
					return context.Cause(intake)
				}
				return err
			}
			logLevel := slog.LevelWarn
			if verbose {
				logLevel = slog.LevelInfo
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))

			ns, err := embedded.StartNATS("")
			if err != nil {
				return err
			}
			defer ns.Destroy()
			pg, err := embedded.StartPostgres(embedded.WithFsync())
			if err != nil {
				return err
			}
			defer pg.Destroy()
			// The URL carries the cluster's random password: without it
			// the one who started the demo could not look at the table.
			fmt.Fprintf(out, "embedded NATS     %s\nthrowaway PostgreSQL %s (fsync on)\n", ns.URL(), pg.URL("postgres"))
			if err := stopped(nil); err != nil {
				return err
			}

			cfg, err := demoConfig(ns.URL(), pg.URL("postgres"), sink.Mode(mode))
			if err != nil {
				return err
			}
			p, err := processor.New(hard, cfg, log)
			if err != nil {
				return stopped(err)
			}
			defer func() { _ = p.Shutdown(hard) }() // a second signal ends its wait for the acks' confirmation

			nc, err := nats.Connect(ns.URL(), nats.Name("jetsink-demo-publisher"))
			if err != nil {
				return err
			}
			defer nc.Close()
			pub.Run = uint64(time.Now().UnixNano())
			res, err := loadgen.Publish(intake, nc, pub)
			if err != nil {
				return stopped(fmt.Errorf("publish: %w", err))
			}
			fmt.Fprintf(out, "published %d events over %s in %v (%.0f/s)\n",
				res.Acked, subjectsUsed(res.Acked, subjects), res.Elapsed.Round(time.Millisecond), float64(res.Acked)/res.Elapsed.Seconds())

			pull, stopPull := context.WithCancel(intake)
			defer stopPull()
			ran := make(chan struct{})
			var runErr error
			start := time.Now()
			go func() {
				defer close(ran)
				runErr = p.Run(pull, hard)
			}()
			err = waitSettled(intake, p, ran)
			elapsed := time.Since(start)
			stopPull() // settled, or a signal: the drain is quick (a second signal ends it)
			<-ran
			if err != nil {
				if runErr != nil {
					err = fmt.Errorf("%w: %w", err, runErr)
				}
				return stopped(err)
			}
			if runErr != nil {
				return stopped(runErr)
			}
			report(out, p, res.Acked, elapsed, cfg)
			if !keep {
				fmt.Fprintln(out, "\nnext: jetsink demo --keep leaves these servers up, with a config file for jetsink check, publish and run;"+
					" see README.md, \"Running it\", for your own")
				return nil
			}
			// The demo's table has the demo's columns, not raw mode's:
			// what jetsink does next needs its config. Its directory is
			// marked as this process's: the next demo removes it if this
			// one dies without doing so (a second signal, SIGKILL).
			dir, err := embedded.TempDir(embedded.DemoDirPrefix)
			if err != nil {
				return err
			}
			defer func() { _ = embedded.RemoveTempDir(dir) }()
			file := filepath.Join(dir, "jetsink.yaml")
			if err := os.WriteFile(file, demoConfigFile(cfg), 0o600); err != nil { // it holds the password
				return err
			}
			fmt.Fprintf(out, "\nservers kept up; Ctrl-C to remove them (and %s). Try:\n"+
				"  psql '%s' -c 'SELECT count(*) FROM events'\n"+
				"  %[3]s check --config '%[1]s'\n"+
				"  %[3]s publish --config '%[1]s' --subject events --events 100000\n"+
				"  %[3]s run --config '%[1]s'     (then Ctrl-C; metrics on http://127.0.0.1:9464/metrics meanwhile)\n",
				file, pg.URL("postgres"), invokedAs(os.Args[0]))
			<-intake.Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&events, "events", 200_000, "events to publish")
	f.IntVar(&subjects, "subjects", 1000, "distinct subjects")
	f.StringVar(&mode, "mode", string(sink.AtLeastOnce), "at-least-once or exactly-once")
	f.BoolVar(&keep, "keep", false, "keep the servers running until Ctrl-C")
	f.BoolVarP(&verbose, "verbose", "v", false, "jetsink's info logs on stderr")
	return cmd
}

// demoConfig is the demo's configuration: the embedded servers, the
// loadgen table, created on the fly.
func demoConfig(natsURL, pgURL string, mode sink.Mode) (config.Config, error) {
	cfg := config.Default()
	cfg.NATS.URL = natsURL
	cfg.NATS.CreateStream = true
	cfg.Postgres.URL = pgURL
	cfg.Postgres.CreateTable = true
	cfg.Postgres.Mode = mode
	cfg.Postgres.Columns = loadgen.Columns()
	cfg.Telemetry.Listen = "127.0.0.1:0"
	return cfg, cfg.Validate()
}

// demoConfigFile is cfg as a config file for the commands a user runs
// against the demo's servers: its URLs, mode and columns (the rest are
// defaults).
func demoConfigFile(cfg config.Config) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# The servers of a jetsink demo --keep, removed with this file when it exits.\n"+
		"nats:\n  url: %q\n  create_stream: true\npostgres:\n  url: %q\n  mode: %s\n  columns:\n",
		cfg.NATS.URL, cfg.Postgres.URL, cfg.Postgres.Mode)
	for _, c := range cfg.Postgres.Columns {
		fmt.Fprintf(&b, "    - {name: %q, from: %q, type: %q, required: %t}\n", c.Name, c.From, c.Type, c.Required)
	}
	return []byte(b.String())
}

// waitSettled polls until the durable consumer has nothing pending and
// nothing awaiting an ack: every event published before is settled, either
// committed and then acked or dead-lettered (a dead letter never becomes a
// row, so counting rows could wait forever). It returns ctx's error, or an
// error when ran is closed first (the processor stopped).
func waitSettled(ctx context.Context, p *processor.Processor, ran <-chan struct{}) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ran:
			return errors.New("jetsink stopped before every event was settled")
		case <-tick.C:
		}
		lag, err := p.Consumer().Lag(ctx)
		if err == nil && lag.NumPending == 0 && lag.NumAckPending == 0 {
			return nil
		}
	}
}

func report(w io.Writer, p *processor.Processor, events int, elapsed time.Duration, cfg config.Config) {
	ss, cs := p.Sink().Stats(), p.Consumer().Stats()
	avg := 0.0
	if ss.Batches > 0 {
		avg = float64(ss.Rows) / float64(ss.Batches)
	}
	fmt.Fprintf(w, "drained %d events into table %q (%s) in %v: %.0f events/s\n",
		events, cfg.Postgres.Table, cfg.Postgres.Mode, elapsed.Round(time.Millisecond), float64(events)/elapsed.Seconds())
	dead := cs.DeadLettered + cs.MaxDelivered // the consumer publishes every dead letter, the sink's too
	fmt.Fprintf(w, "batches %d (%.0f rows on average), retries %d, dead letters %d, redelivered %d\n",
		ss.Batches, avg, ss.Retries, dead, cs.Redelivered)
	if dead > 0 {
		// The letters are gone with the demo's servers, unless --keep
		// (whose config file, printed next, dlq replay takes).
		fmt.Fprintf(w, "every event committed, then acked, or dead-lettered (with --keep: jetsink dlq replay --config <its file> --dry-run "+
			"lists them); consumer pending 0, ack pending 0\n")
		return
	}
	fmt.Fprintln(w, "every event committed, then acked; consumer pending 0, ack pending 0")
}

// invokedAs is how to run this binary again from the same shell: arg0 as
// given, or "go run ./cmd/jetsink" for a binary go run built (and removes
// when it exits).
func invokedAs(arg0 string) string {
	if strings.Contains(filepath.ToSlash(arg0), "/go-build") {
		return "go run ./cmd/jetsink"
	}
	return arg0
}

// subjectsUsed says over how many subjects that many published events went:
// loadgen sends event n to subject n mod subjects, so fewer events than
// subjects use one each.
func subjectsUsed(events, subjects int) string {
	n := min(events, subjects)
	if n == 1 {
		return "1 subject"
	}
	return fmt.Sprintf("%d subjects", n)
}

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
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
		Long: `Start an embedded nats-server with JetStream and a throwaway PostgreSQL 15
cluster (initdb/pg_ctl must be installed; as root it runs as the postgres
user), publish --events telemetry events over --subjects subjects, run
jetsink until every event is committed and acked, print what happened, and
remove everything. --keep leaves both servers up until Ctrl-C so you can look.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
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
			fmt.Fprintf(out, "embedded NATS     %s\nthrowaway PostgreSQL 127.0.0.1:%d (fsync on)\n", ns.URL(), pg.Port())

			cfg := config.Default()
			cfg.NATS.URL = ns.URL()
			cfg.NATS.CreateStream = true
			cfg.Postgres.URL = pg.URL("postgres")
			cfg.Postgres.CreateTable = true
			cfg.Postgres.Mode = sink.Mode(mode)
			cfg.Postgres.Columns = loadgen.Columns()
			cfg.Telemetry.Listen = "127.0.0.1:0"
			if err := cfg.Validate(); err != nil {
				return err
			}
			p, err := processor.New(ctx, cfg, log)
			if err != nil {
				return err
			}
			defer p.Close()

			nc, err := nats.Connect(ns.URL(), nats.Name("jetsink-demo-publisher"))
			if err != nil {
				return err
			}
			defer nc.Close()
			res, err := loadgen.Publish(ctx, nc, loadgen.Options{Subject: "events", Subjects: subjects, Events: events, Run: uint64(time.Now().UnixNano())})
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			fmt.Fprintf(out, "published %d events over %d subjects in %v (%.0f/s)\n",
				res.Acked, subjects, res.Elapsed.Round(time.Millisecond), float64(res.Acked)/res.Elapsed.Seconds())

			intake, stopIntake := context.WithCancel(ctx)
			defer stopIntake()
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- p.Run(intake, context.WithoutCancel(ctx)) }()
			if err := waitCommitted(ctx, p, uint64(res.Acked), done); err != nil {
				stopIntake()
				<-done
				return err
			}
			elapsed := time.Since(start)
			stopIntake()
			if err := <-done; err != nil {
				return err
			}
			report(out, p, res.Acked, elapsed, cfg)
			if keep {
				fmt.Fprintf(out, "\nservers kept up; Ctrl-C to remove them.\n  psql '%s' -c 'SELECT count(*) FROM events'\n", pg.URL("postgres"))
				<-ctx.Done()
			}
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

// waitCommitted polls until want rows are committed and the consumer has
// nothing pending or unacked.
func waitCommitted(ctx context.Context, p *processor.Processor, want uint64, done <-chan error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			return fmt.Errorf("jetsink stopped early: %w", err)
		case <-tick.C:
		}
		if p.Sink().Stats().Rows < want {
			continue
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
	fmt.Fprintf(w, "batches %d (%.0f rows on average), retries %d, dead letters %d, redelivered %d\n",
		ss.Batches, avg, ss.Retries, ss.DeadLettered+cs.DeadLettered, cs.Redelivered)
	fmt.Fprintln(w, "every event committed, then acked; consumer pending 0, ack pending 0")
}

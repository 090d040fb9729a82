package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/telemetry"
)

// errCheckFailed is returned when check found problems that would stop run.
var errCheckFailed = errors.New("check found problems")

func newCheckCmd() *cobra.Command {
	var cf configFlags
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Validate the config, reach NATS and PostgreSQL, compare the mapping with the table",
		Long: `Validate the configuration (with the OTEL_* tracing variables), connect to
NATS and PostgreSQL, and report what 'jetsink run' would find: the stream,
the durable consumer, a stream for the dead-letter subject, the table, and
each mapped column's type against the table's; in exactly-once mode also a
stream whose sequence restarted below the table's rows (deleted and
re-created). It creates and changes nothing.
Exit status 0 when run would work (warnings allowed), 1 when something must
be fixed first, 2 for a bad config. Ctrl-C (SIGINT or SIGTERM) stops the
checks under way and exits 1; a second one exits at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			log := newLogger(cfg, cmd.ErrOrStderr())
			defer logExitAs(cfg, log, &err)
			// Tracing as run sets it up, with the OTEL_* variables: run
			// refuses a bad one (exit 2). It exports nothing here.
			if err := checkTracing(cmd.Context(), cfg, log); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintln(out, "config: ok")
			// The first signal ends the checks under way (a query on a
			// locked table waits for the lock).
			ctx, stop := cancelOnSignal(cmd, "stopping check", cfg, log)
			defer stop()
			failed := 0
			badConfig := false // a setting run would refuse (exit 2) once it sees the server
			report := func(section string, warning bool, text string) {
				if ctx.Err() != nil {
					// What the stop cut short, not a finding.
					return
				}
				level := "error"
				if warning {
					level = "warning"
				} else {
					failed++
				}
				fmt.Fprintf(out, "%s: %s: %s\n", section, level, text)
			}

			mapper, err := pipeline.Compile(cfg.Columns())
			if err != nil {
				return err
			}
			pgCfg := cfg.Postgres.Config
			pgCfg.CreateTable = false // check creates nothing
			s, err := sink.New(ctx, pgCfg, mapper.Columns(), nil, log)
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("%w: check did not finish (%w)", context.Cause(ctx), err)
				}
				return err
			}
			defer s.Close()

			natsCfg := cfg.NATS
			natsCfg.Destination = processor.Destination(cfg.Postgres.URL, cfg.Postgres.Table)
			if pgCfg.Mode == sink.ExactlyOnce {
				natsCfg.StoredSeq = s.StoredSeq
			}
			natsProblems, err := consumer.Check(ctx, natsCfg, log)
			if err != nil {
				report("nats", false, err.Error())
				badConfig = isSectionConfigError(err) // an unreadable nkey or credentials file
			} else {
				for _, p := range natsProblems {
					report("nats", p.Warning, p.String())
					badConfig = badConfig || p.Config && !p.Warning
				}
				if len(natsProblems) == 0 {
					fmt.Fprintf(out, "nats: ok (stream %s, consumer %s)\n", cfg.NATS.Stream, cfg.NATS.Consumer)
				}
			}

			switch pgProblems, err := s.Check(ctx); {
			case err != nil:
				report("postgres", false, err.Error())
				for _, p := range pgProblems { // what postgres.url alone says (TLS, a host list)
					report("postgres", p.Warning, p.String())
				}
			case len(pgProblems) == 0:
				fmt.Fprintf(out, "postgres: ok (table %s matches the %d mapped columns)\n", s.Table(), len(mapper.Columns()))
			default:
				for _, p := range pgProblems {
					// Only warnings when run fixes them: create_table makes a missing table, and the unique index
					// exactly-once needs on an existing one (IF NOT EXISTS), where it can (InitMakes).
					runMakes := cfg.Postgres.CreateTable && p.InitMakes()
					if runMakes {
						p.Fix = "none needed: run makes it (postgres.create_table: true)"
					}
					report("postgres", p.Warning || runMakes, p.String())
				}
			}
			if ctx.Err() != nil {
				return fmt.Errorf("%w: check did not finish; what it found before it stopped is above", context.Cause(ctx))
			}
			if failed > 0 && badConfig {
				// Exit 2, as run's for the same settings. The message
				// only counts: each problem is above.
				return fmt.Errorf("%w: %d to fix, the configuration among them (%w)", errCheckFailed, failed, consumer.ErrInvalidConfig)
			}
			if failed > 0 {
				return fmt.Errorf("%w: %d to fix", errCheckFailed, failed)
			}
			return nil
		},
	}
	cf.register(cmd.Flags())
	return cmd
}

// checkTracing builds and shuts down the tracer and meter providers run
// would build (both read OTEL_* variables: the resource labels the
// metrics as well), exporting nothing: what they refuse, run refuses.
func checkTracing(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	tc := cfg.Telemetry
	m, err := telemetry.NewMetrics(tc.ServiceName)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer mcancel()
	_ = m.Shutdown(mctx) // nothing was recorded
	tr, err := telemetry.NewTracing(ctx, telemetry.Config{ServiceName: tc.ServiceName, OTLPEndpoint: tc.OTLPEndpoint,
		SampleRatio: tc.SampleRatio, MaxLinks: cfg.Postgres.Batch.MaxRows, Log: log})
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = tr.Shutdown(sctx) // nothing was traced: nothing to lose
	return nil
}

package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
)

func newInitCmd() *cobra.Command {
	var cf configFlags
	var printOnly bool
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create the table (and, in exactly-once mode, its unique index) from the mapping",
		Long: `Create the target table from postgres.columns (or raw mode's columns) if it
does not exist, and in exactly-once mode the unique index on (stream, stream_seq)
that makes redeliveries harmless. An existing table's columns are left alone
(init then compares the table with the mapping, as 'jetsink check' does:
warnings are printed, and a table that does not fit is named with what to fix,
exit status 1), but in exactly-once mode
the index is added to a table without a usable unique key on (stream, stream_seq)
(a primary key does) and without an index of its name (<table>_stream_seq_key):
CREATE UNIQUE INDEX blocks writes to the table while it builds, and fails if
the table holds duplicates. The table is the one search_path finds, in
whichever schema; a new one is made in the first. When the name is taken by another index (of a
table renamed since, or left INVALID by a failed concurrent build), init
says what holds it and how to free it, and exits 1. --print shows the SQL
that makes both where there is no table, without running it (on an existing
table init runs only what is missing of it). init reads the postgres: and
log: settings only, and connects to no NATS server: it refuses --nats-url
and --stream.

Ctrl-C (SIGINT or SIGTERM) cancels the statement under way on the server,
rolls the DDL back and exits 1; a second one exits at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if err := refused(cmd.Flags(), initIgnores, "nats-url", "stream"); err != nil {
				return err
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			log := newLogger(cfg, cmd.ErrOrStderr())
			defer logExitAs(cfg, log, &err)
			mapper, err := pipeline.Compile(cfg.Columns())
			if err != nil {
				return err
			}
			// The first signal cancels the DDL under way (CREATE UNIQUE
			// INDEX blocks writes to the table while it builds): the sink
			// has PostgreSQL cancel it when ctx ends.
			ctx, stop := cancelOnSignal(cmd, "cancelling init", cfg, log)
			defer stop()
			stopped := func(err error) error {
				if ctx.Err() != nil {
					return fmt.Errorf("%w: init did not finish, and its DDL is one transaction: run it again (%w)", context.Cause(ctx), err)
				}
				return err
			}
			sinkCfg := cfg.Postgres.Config
			sinkCfg.CreateTable = false                                  // New would run Init itself; --print must not
			s, err := sink.New(ctx, sinkCfg, mapper.Columns(), nil, log) // init never processes rows
			if err != nil {
				return stopped(err)
			}
			defer s.Close()
			if printOnly {
				for _, stmt := range s.DDL() {
					fmt.Fprintln(cmd.OutOrStdout(), strings.TrimSpace(stmt)+";")
				}
				return nil
			}
			if err := s.Init(ctx); err != nil {
				urlWarnings(cmd.OutOrStdout(), s.URLProblems())
				return stopped(err)
			}
			// An existing table is left as it is: say whether it fits, as
			// check would, rather than call it ready and have run refuse it.
			probs, err := s.Check(ctx)
			if err != nil {
				urlWarnings(cmd.OutOrStdout(), probs)
				return stopped(fmt.Errorf("table %s is there, but comparing it with the mapping failed: %w", cfg.Postgres.Table, err))
			}
			bad := 0
			for _, p := range probs {
				level := "warning"
				if !p.Warning {
					level = "error"
					bad++
				}
				fmt.Fprintf(cmd.OutOrStdout(), "postgres: %s: %s\n", level, p)
			}
			if bad > 0 {
				return fmt.Errorf("%w: table %s is there but does not fit the mapping: %d to fix", errCheckFailed, cfg.Postgres.Table, bad)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "table %s ready (%s)\n", cfg.Postgres.Table, cfg.Postgres.Mode)
			return nil
		},
	}
	cf.registerTable(cmd.Flags())
	// Taken once and never used: refused, saying why.
	refuseFlags(cmd.Flags(), "nats-url", "stream")
	cmd.Flags().BoolVar(&printOnly, "print", false, "print the SQL instead of running it")
	return cmd
}

// initIgnores is why init refuses --nats-url and --stream.
const initIgnores = "init makes and checks the table only, from the postgres: and log: settings, and uses no NATS server or stream (jetsink check checks those)"

// urlWarnings prints the warnings postgres.url alone gives (TLS that does
// not make sure of the server, a host list), which init says beside an
// error: a spoofed server refusing the login is when they matter most.
func urlWarnings(out io.Writer, probs []sink.Problem) {
	for _, p := range probs {
		fmt.Fprintf(out, "postgres: warning: %s\n", p)
	}
}

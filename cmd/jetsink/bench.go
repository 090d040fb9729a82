package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/jetsink/jetsink/bench"
	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/processor"
)

func newBenchCmd() *cobra.Command {
	var (
		cf       configFlags
		o        bench.Options
		compare  string
		matrix   string
		jsonOut  bool
		htmlFile string
		quiet    bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark jetsink end to end: throughput, publish-to-commit latency, CPU and memory",
		Long: `Run a scenario end to end and measure jetsink from the outside.

  --scenario drain   preload --events events, then start jetsink and time how
                     long it takes to commit and ack them all
  --scenario rate    start jetsink, publish open loop at --rate events/s for
                     --duration, and wait until everything is committed;
                     with --lock-for D, lock the table (ACCESS EXCLUSIVE)
                     --lock-at after the first send for D meanwhile, and
                     report jetsink's memory before and during the lock,
                     redeliveries, and how long it took to catch up

A flag of the other scenario is refused rather than ignored, and so is
--log-level: jetsink runs at info, for its start-up line, which the report
gives as what it ran with (GOMAXPROCS, workers, connections, mode); --set
log.level=LEVEL changes it (above info, the report cannot say); its last
lines are shown if it fails.

By default it runs on an embedded nats-server and a throwaway PostgreSQL
cluster with fsync on, prepared like a running server: WAL segments to
recycle, and a CHECKPOINT before each engine's run (--cold-postgres: as
initdb made it). Given both servers, from --nats-url and --database-url,
JETSINK_NATS_URL and JETSINK_DATABASE_URL (or JETSINK_POSTGRES_URL), or
nats.url and postgres.url in a config file (--config or JETSINK_CONFIG), it
runs against those instead, creating and dropping its own streams and tables
there, and says so on stderr, naming the settings; one server given without
the other is refused. A config file that sets neither URL runs against
jetsink's default servers (127.0.0.1). --postgres-rtt and --nats-rtt put the engines' connections
to the embedded servers through a link that holds each chunk of bytes for
half that time each way, as if the server ran on another machine (the bench's
own connections stay direct; the link's copying runs in the bench process).
jetsink runs as a subprocess ("jetsink run"), so its CPU
time and peak RSS are its own (peak RSS is VmHWM, the executable's mapped
pages included; the peaks of its RssAnon and RssFile are given beside it). Latency runs from each event's scheduled send
time (no coordinated omission) to the first ack the bench sees for it, after
its transaction's commit and the commit's WAL flush (rate; the commit
timestamp is reported beside it), or from the engine's start to the commit
(drain, whose events were sent before). A rate run also reports the
publisher's send lag (each event's send minus its scheduled time). A lost
event (a published sequence with no row), a row of a sequence not
published, or a duplicate row in exactly-once mode, makes the exit status
non-zero.

--compare baseline runs the straightforward consumer in the same run and
prints the ratios of events/s and of CPU per event: in a drain, on the same
preloaded data; in a rate run, on its own stream under the same schedule
(whose events/s ratio is near 1 when both keep up: compare latency and
CPU). --stream and --table are ignored:
each run makes (and removes) its own. --matrix key=v1,v2 runs jetsink
once per value (e.g. --matrix pipeline.pin=none,thread,cpu; env:NAME sets an
environment variable instead, e.g. --matrix env:GOGC=100,200); --set overrides
apply to jetsink only, so neither takes the keys the bench sets itself:
nats.url and postgres.url (use --nats-url and --database-url), and the
stream, subjects, consumer, dead-letter subject and table (its own per run).
Each variant's configuration is loaded as jetsink will load it before
anything starts: a key or value it refuses exits 2 at once.
The engines get no JETSINK_* or OTEL_* variable from the bench's
environment: to trace jetsink, --set telemetry.otlp_endpoint=URL.`,
		Example: `  jetsink bench --scenario drain --events 1000000 --compare baseline --count 3
  jetsink bench --scenario rate --rate 20000 --duration 60s --html report.html
  jetsink bench --scenario rate --rate 20000 --duration 90s --lock-at 15s --lock-for 60s
  jetsink bench --scenario drain --events 200000 --matrix pipeline.workers=1,2,4 --json
  jetsink bench --scenario drain --events 500000 --compare baseline --postgres-rtt 2ms`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The first signal stops the run and cleans up (the engine, the
			// streams, the tables, the embedded servers: up to a minute or
			// two); a second kills the engines, removes the directory of
			// their configuration files (which hold the servers' URLs and
			// credentials) and exits at once, leaving what is not cleaned
			// up yet (the next bench's sweep removes stray embedded servers
			// and the directory of a bench killed outright).
			ctx, cancel := context.WithCancelCause(cmd.Context())
			defer cancel(nil)
			errOut := cmd.ErrOrStderr()
			stop := watchSignals(func(sig os.Signal) {
				fmt.Fprintf(errOut, "jetsink: %s: stopping the bench and cleaning up; a second signal exits at once\n", sig)
				cancel(fmt.Errorf("stopped by %s", sig))
			}, func(sig os.Signal) {
				fmt.Fprintf(errOut, "jetsink: second %s: killing the engines, removing their configuration files, and exiting without the rest of the clean-up\n", sig)
				bench.KillChildren()
				bench.RemoveTempDirs()
				os.Exit(exitAborted)
			})
			defer stop()
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the jetsink binary: %w", err)
			}
			o.Exe = exe
			if cmd.Flags().Changed("lock-at") && o.LockFor == 0 {
				return fmt.Errorf("%w: --lock-at needs --lock-for", bench.ErrInvalidOptions)
			}
			if o.Count < 1 {
				// bench.Options takes 0 for its default, 1; asked for on
				// the command line, 0 repetitions is no run.
				return usageError{fmt.Errorf("--count %d: at least 1 repetition", o.Count)}
			}
			if err := otherScenarioFlags(cmd, o.Scenario); err != nil {
				return err
			}
			if cmd.Flags().Changed("log-level") {
				// configFlags has it; the bench has no log of its own, and
				// each engine logs at info, for its start-up line (its last
				// lines are shown if it fails).
				return usageError{errors.New("--log-level: the bench logs nothing of its own, and jetsink runs at info (its start-up line says what it ran with); " +
					"--set log.level=LEVEL changes jetsink's, whose last lines the bench shows if it fails")}
			}
			for _, kv := range cf.set {
				if err := benchOwnsKey("--set", kv); err != nil {
					return err
				}
			}
			if matrix != "" {
				if err := benchOwnsKey("--matrix", matrix); err != nil {
					return err
				}
			}
			// --set goes to the jetsink subprocess, on top of the config.
			sets := cf.set
			cf.set = nil
			// Embedded or not, the file, JETSINK_* and flags such as --mode
			// give every key but the servers' URLs (and the stream, consumer
			// and table, which bench names per run).
			var origins map[string]string
			if o.Base, origins, err = cf.loadOrigins(); err != nil {
				return err
			}
			if o.Embedded, err = benchServers(errOut, o.Base, origins, cf.file, cf.given("config")); err != nil {
				return err
			}
			if o.Base.NATS.Domain != "" {
				// From --config or JETSINK_NATS_DOMAIN: the bench would
				// make its stream in one JetStream and jetsink in another.
				return usageError{fmt.Errorf("nats.domain %q: %s", o.Base.NATS.Domain, benchOwned["nats.domain"])}
			}
			switch compare {
			case "":
			case "baseline":
				o.Compare = true
			default:
				return usageError{fmt.Errorf("--compare takes only %q", "baseline")}
			}
			if matrix == "" {
				o.Variants = []bench.Variant{{Set: sets}}
			} else {
				key, vals, ok := strings.Cut(matrix, "=")
				if !ok || key == "" || vals == "" {
					return usageError{fmt.Errorf("--matrix wants key=v1,v2,..., e.g. pipeline.pin=none,thread")}
				}
				for _, v := range strings.Split(vals, ",") {
					vr := bench.Variant{Name: key + "=" + v, Set: sets}
					if name, ok := strings.CutPrefix(key, "env:"); ok {
						vr.Env = []string{name + "=" + v}
					} else {
						vr.Set = append(append([]string(nil), sets...), key+"="+v)
					}
					o.Variants = append(o.Variants, vr)
				}
			}
			if !quiet {
				o.Progress = cmd.ErrOrStderr()
			}
			rep, err := bench.Run(ctx, o)
			return writeReport(cmd.OutOrStdout(), rep, err, jsonOut, htmlFile)
		},
	}
	cf.register(cmd.Flags())
	// Each run makes its own stream and table: taken, and ignored, but
	// not offered.
	_ = cmd.Flags().MarkHidden("stream")
	_ = cmd.Flags().MarkHidden("table")
	_ = cmd.Flags().MarkHidden("log-level") // refused: see RunE
	f := cmd.Flags()
	f.StringVar(&o.Scenario, "scenario", bench.ScenarioDrain, "drain or rate")
	f.IntVar(&o.Events, "events", 200_000, "drain: events to preload")
	f.Float64Var(&o.Rate, "rate", 20_000, "rate: events per second, open loop")
	f.DurationVar(&o.Duration, "duration", 10*time.Second, "rate: how long to publish")
	f.DurationVar(&o.LockAt, "lock-at", 5*time.Second, "rate: when to lock the table, after the first send (with --lock-for)")
	f.DurationVar(&o.LockFor, "lock-for", 0, "rate: hold an ACCESS EXCLUSIVE lock on the table this long (0: no lock)")
	f.IntVar(&o.Subjects, "subjects", 1000, "distinct subjects (devices)")
	f.IntVar(&o.EventBytes, "event-bytes", 0, "pad each event's JSON to this many bytes (0: ~180 bytes, unpadded); within max_payload and pipeline.max_event_bytes (1 MiB each by default)")
	f.StringVar(&compare, "compare", "", "baseline: also run the straightforward consumer on the same data")
	f.IntVar(&o.Count, "count", 1, "repetitions (median and spread are reported)")
	f.StringVar(&matrix, "matrix", "", "run jetsink once per value of a key (or env:NAME), e.g. pipeline.pin=none,thread,cpu")
	f.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "give up on one engine's run after this long")
	f.DurationVar(&o.DuplicateWindow, "duplicate-window", 0, "the streams' JetStream duplicate window (0: the server's default, 2m); at least 4.45s, which leaves the publisher a PubAck wait of 500ms within it")
	f.DurationVar(&o.PostgresRTT, "postgres-rtt", 0, "embedded: the engines reach PostgreSQL over a link adding this to each round trip, as to a server on another machine (e.g. 1ms)")
	f.DurationVar(&o.NATSRTT, "nats-rtt", 0, "embedded: the engines reach NATS over a link adding this to each round trip")
	f.BoolVar(&o.ColdPostgres, "cold-postgres", false, "embedded: leave the throwaway PostgreSQL as initdb made it (no recycled WAL, no CHECKPOINT before each run)")
	f.BoolVar(&jsonOut, "json", false, "print the report as JSON instead of the summary")
	f.StringVar(&htmlFile, "html", "", "also write a self-contained HTML report (inline SVG) to this file")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress lines on stderr")
	cmd.AddCommand(newBenchBaselineCmd())
	return cmd
}

// benchServers reports whether the bench is to start embedded servers:
// when nothing gives either server's URL and there is no config file. It
// refuses one server given without the other (a JETSINK_DATABASE_URL
// exported for "jetsink run" would otherwise send the bench to the default
// NATS server, or switch the embedded ones off unsaid), and says on errOut
// which settings point it at servers of the user's, where it creates and
// drops its streams and tables. origins are config.LoadOrigins'; file is
// the config file, from --config when flagged, else JETSINK_CONFIG.
func benchServers(errOut io.Writer, cfg config.Config, origins map[string]string, file string, flagged bool) (embedded bool, err error) {
	fileSetting := ""
	if file != "" {
		fileSetting = "JETSINK_CONFIG=" + file
		if flagged {
			fileSetting = "--config " + file
		}
	}
	natsFrom, pgFrom := origins["nats.url"], origins["postgres.url"]
	if natsFrom == "" && pgFrom == "" && file == "" {
		return true, nil
	}
	// What to drop for the embedded servers, each once: a line of the
	// file is dropped with the file.
	var drop []string
	for _, from := range []string{natsFrom, pgFrom, fileSetting} {
		switch {
		case from == "", strings.HasPrefix(from, "line "), slices.Contains(drop, from):
		case strings.HasPrefix(from, "--"): // --config FILE among them
			drop = append(drop, "drop "+from)
		default: // a variable, JETSINK_CONFIG=FILE among them
			name, _, _ := strings.Cut(from, "=")
			drop = append(drop, "unset "+name)
		}
	}
	drops := strings.Join(drop, " and ")
	said := func(key, from string) string {
		if strings.HasPrefix(from, "line ") {
			return key + " at " + from
		}
		return from
	}
	if (natsFrom == "") != (pgFrom == "") {
		given, server, missing, ways := said("postgres.url", pgFrom), "PostgreSQL", "NATS", "--nats-url, JETSINK_NATS_URL or nats.url in the config file"
		if pgFrom == "" {
			given, server, missing, ways = said("nats.url", natsFrom), "NATS", "PostgreSQL", "--database-url, JETSINK_DATABASE_URL or postgres.url in the config file"
		}
		return false, usageError{fmt.Errorf("bench: %s gives the %s server and nothing gives the %s one: give it too (%s) to run against your servers, or neither for the embedded ones (%s)",
			given, server, missing, ways, drops)}
	}
	server := func(key, from, server string) string {
		if from == "" {
			return server + " (the default)"
		}
		return server + " from " + said(key, from)
	}
	lead := ""
	if fileSetting != "" {
		lead = fileSetting + ": "
	}
	fmt.Fprintf(errOut, "jetsink: bench: %sagainst your servers, not embedded ones, creating and dropping its BENCH_* streams and bench* tables there: NATS %s, PostgreSQL %s; %s for the embedded ones\n",
		lead, server("nats.url", natsFrom, consumer.ServersOf(cfg.NATS.URL)), server("postgres.url", pgFrom, pgServerOf(cfg.Postgres.URL)), drops)
	return false, nil
}

// pgServerOf is a PostgreSQL connection string (URL or key=value words)
// cut to its hosts and ports, as pgx reads them: without a user or password,
// which may hold a comma (consumer.ServersOf would split a URL there), or the
// database.
func pgServerOf(conn string) string {
	pc, err := pgconn.ParseConfig(conn)
	if err != nil { // validation has parsed it already
		return "(a connection string pgx does not read)"
	}
	return "postgres://" + strings.Join(processor.PostgresHosts(pc), ",")
}

// scenarioFlags are the flags that apply to one scenario only.
var scenarioFlags = map[string][]string{
	bench.ScenarioDrain: {"events"},
	bench.ScenarioRate:  {"rate", "duration", "lock-at", "lock-for"},
}

// otherScenarioFlags returns a usage error if cmd's command line sets a
// flag of a scenario other than scenario: it would be ignored.
func otherScenarioFlags(cmd *cobra.Command, scenario string) error {
	if _, ok := scenarioFlags[scenario]; !ok {
		return nil // bench.Run names the scenarios
	}
	for _, other := range []string{bench.ScenarioDrain, bench.ScenarioRate} {
		if other == scenario {
			continue
		}
		for _, name := range scenarioFlags[other] {
			if cmd.Flags().Changed(name) {
				return usageError{fmt.Errorf("--%s applies to --scenario %s only, and this is --scenario %s", name, other, scenario)}
			}
		}
	}
	return nil
}

// benchOwned are the keys bench sets in the configuration it writes for
// jetsink, with what to use instead. Its --set and --matrix go to jetsink
// only: one of these would point jetsink at other servers, or at a stream
// or table the bench does not watch, and the run would wait until --timeout.
var benchOwned = map[string]string{
	"nats.url":                     "use --nats-url (or --config), which the bench connects to as well",
	"postgres.url":                 "use --database-url (or --config), which the bench connects to as well",
	"nats.stream":                  "the bench creates a stream of its own for each run",
	"nats.subjects":                "the bench creates a stream of its own for each run",
	"nats.create_stream":           "the bench creates a stream of its own for each run",
	"nats.consumer":                "the bench names the durable consumer it watches for each run",
	"nats.dead_letter_subject":     "the bench names the dead-letter subject for each run",
	"nats.domain":                  "the bench and its engines use the JetStream of the server they connect to: point --nats-url at a server of the stream's domain",
	"nats.stream_duplicate_window": "use --duplicate-window: the bench creates every run's stream with it, for both engines, and its publisher waits for resends by it",
	"nats.stream_max_age":          "the bench creates a stream of its own for each run, the same for both engines",
	"nats.stream_max_bytes":        "the bench creates a stream of its own for each run, the same for both engines",
	"nats.stream_replicas":         "the bench creates a stream of its own for each run, the same for both engines",
	"postgres.table":               "the bench creates a table of its own, with loadgen's columns, for each run",
	"postgres.create_table":        "the bench creates a table of its own, with loadgen's columns, for each run",
}

// benchOwnsKey returns a usage error if kv (key=value, given with flag)
// sets a key in benchOwned.
func benchOwnsKey(flag, kv string) error {
	key, _, _ := strings.Cut(kv, "=")
	key = strings.TrimSpace(key)
	if name, ok := strings.CutPrefix(key, "env:"); ok {
		// --matrix env:JETSINK_...: the variable of a key, which the
		// subprocess reads after its own JETSINK_ variables are removed.
		if path, ok := config.KeyOfEnv(name); ok {
			key = path
		}
	}
	if instead, ok := benchOwned[key]; ok {
		// Not the value: a URL may hold a password.
		return usageError{fmt.Errorf("%s %s: the bench sets this key itself (%s goes to jetsink only): %s", flag, key, flag, instead)}
	}
	return nil
}

// newBenchBaselineCmd is the baseline consumer bench compares against, run
// as a subprocess so that its CPU and memory are measured like jetsink's.
func newBenchBaselineCmd() *cobra.Command {
	var c bench.BaselineConfig
	var file string
	cmd := &cobra.Command{
		Use:    "baseline",
		Short:  "The straightforward consumer `jetsink bench --compare baseline` measures (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), stopSignals()...)
			defer stop()
			if file != "" {
				cfg, err := config.Load(config.Source{File: file, FileFrom: "--config"})
				if err != nil {
					return err
				}
				if c.NATSOptions, err = cfg.NATS.AuthOptions(); err != nil {
					return err
				}
				// The URLs from the file (0600) rather than the command
				// line, which any local user may read (/proc/<pid>/cmdline):
				// they may hold passwords.
				if c.NATSURL == "" {
					c.NATSURL = cfg.NATS.URL
				}
				if c.DatabaseURL == "" {
					c.DatabaseURL = cfg.Postgres.URL
				}
			}
			c.Log = cmd.ErrOrStderr()                              // its start-up line, for the report's ran_with
			logCPU("/", slog.New(slog.NewTextHandler(c.Log, nil))) // its GOMAXPROCS and CPU quota, as run's
			return bench.RunBaseline(ctx, c)
		},
	}
	f := cmd.Flags()
	f.StringVar(&file, "config", "", "jetsink config file whose nats: credentials and TLS settings, nats.url and postgres.url to use")
	f.StringVar(&c.NATSURL, "nats-url", "", "NATS server URL (instead of the config's)")
	f.StringVar(&c.Stream, "stream", "", "stream")
	f.StringVar(&c.Consumer, "consumer", "", "durable consumer")
	f.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL URL (instead of the config's)")
	f.StringVar(&c.Table, "table", "", "table")
	return cmd
}

// writeReport writes rep, when the run made one, to htmlFile if set and as
// JSON or text to out, and returns runErr joined with what could not be
// written. A report cut short (jetsink bench --json > FILE on a full disk)
// must not exit 0 as if it were whole: it may be all there is of a run of
// many minutes. runErr (a lost event, say) comes first, and is not hidden
// by a failed write either.
func writeReport(out io.Writer, rep *bench.Report, runErr error, jsonOut bool, htmlFile string) error {
	if rep == nil {
		return runErr
	}
	var errs []error
	if htmlFile != "" {
		if err := writeHTML(htmlFile, rep); err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	if jsonOut {
		err = rep.WriteJSON(out)
	} else {
		err = rep.WriteText(out)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("could not write the report, which is cut short or missing: %w; "+
			"make room or send it elsewhere, and run the bench again", err))
	}
	if len(errs) == 0 {
		return runErr // as Run returned it: exitCode tells its kinds apart
	}
	return errors.Join(append([]error{runErr}, errs...)...)
}

func writeHTML(path string, rep *bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("html report: %w", err)
	}
	if err := rep.WriteHTML(f); err != nil {
		f.Close()
		return fmt.Errorf("html report: %w", err)
	}
	return f.Close()
}

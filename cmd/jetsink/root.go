package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/telemetry"
)

// version is the module's version, the commit (and its time, when the
// build recorded it) and the Go version:
// "(devel) 9c9e632f1a2b (2026-12-03T12:30:00Z, modified), go1.26.8".
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (no build information), " + runtime.Version()
	}
	v := bi.Main.Version
	var rev, at, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(len(s.Value), 12)]
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	switch {
	case rev != "" && at+modified != "":
		v += " " + rev + " (" + strings.TrimPrefix(at+modified, ", ") + ")"
	case rev != "":
		v += " " + rev
	case buildCommit != "":
		v += " " + buildCommit
	}
	return v + ", " + bi.GoVersion
}

// buildCommit is set by the Makefile (-X main.buildCommit=...): git
// describe's commit, for builds that record no VCS information.
var buildCommit string

// errAborted marks a run whose drain was cut short.
var errAborted = errors.New("aborted")

// usageError is a bad command line.
type usageError struct{ error }

func isSectionConfigError(err error) bool {
	return errors.Is(err, consumer.ErrInvalidConfig) || errors.Is(err, sink.ErrInvalidConfig) ||
		errors.Is(err, pipeline.ErrInvalidConfig) || errors.Is(err, pipeline.ErrInvalidMapping) ||
		errors.Is(err, telemetry.ErrInvalidConfig)
}

// configFlags are the flags every command that needs the configuration has.
type configFlags struct {
	file     string
	set      []string
	natsURL  string
	dbURL    string
	stream   string
	table    string
	mode     string
	logLevel string
	// fs is the command's flag set, which says which flags were given:
	// a flag given empty (--database-url "$DATABASE_URL", the variable
	// unset) is a value to validate and refuse, not one left out.
	fs *pflag.FlagSet
}

func (f *configFlags) register(fs *pflag.FlagSet) {
	f.registerTable(fs)
	f.natsURLFlag(fs)
	fs.StringVar(&f.stream, "stream", "", "JetStream stream (nats.stream; default "+consumer.DefaultStream+")")
}

// registerNATS registers the flags of a command that reads the
// configuration but uses only its nats: section.
func (f *configFlags) registerNATS(fs *pflag.FlagSet) {
	f.registerFile(fs)
	f.natsURLFlag(fs)
}

// registerTable registers the flags of a command that reads the
// configuration but uses only its postgres: and log: sections (init).
func (f *configFlags) registerTable(fs *pflag.FlagSet) {
	f.registerFile(fs)
	fs.StringVar(&f.logLevel, "log-level", "", "debug, info, warn or error (log.level)")
	fs.StringVar(&f.dbURL, "database-url", "", "PostgreSQL URL (postgres.url, env JETSINK_DATABASE_URL; default "+sink.DefaultConfig().URL+")")
	fs.StringVar(&f.table, "table", "", "target table (postgres.table; default "+sink.DefaultConfig().Table+")")
	fs.StringVar(&f.mode, "mode", "", "at-least-once or exactly-once (postgres.mode; default "+string(sink.DefaultConfig().Mode)+")")
}

// registerFile registers --config and --set, which every command that
// reads the configuration has.
func (f *configFlags) registerFile(fs *pflag.FlagSet) {
	f.fs = fs
	fs.StringVarP(&f.file, "config", "c", os.Getenv("JETSINK_CONFIG"), "YAML config file (env JETSINK_CONFIG)")
	fs.StringArrayVar(&f.set, "set", nil, "override any key, e.g. --set nats.ack_wait=1m (repeatable; 'jetsink keys' lists them)")
}

func (f *configFlags) natsURLFlag(fs *pflag.FlagSet) {
	fs.StringVar(&f.natsURL, "nats-url", "", "NATS server URL (nats.url, env JETSINK_NATS_URL; default "+consumer.DefaultURL+")")
}

// refuseFlags registers names as hidden flags taking a value, for refused
// to refuse saying why, rather than pflag with a bare "unknown flag".
func refuseFlags(fs *pflag.FlagSet, names ...string) {
	for _, name := range names {
		fs.String(name, "", "")
		_ = fs.MarkHidden(name) // registered just above
	}
}

// refused returns a usageError naming the first of names given in fs,
// saying why, or nil.
func refused(fs *pflag.FlagSet, why string, names ...string) error {
	for _, name := range names {
		if fs.Changed(name) {
			return usageError{fmt.Errorf("--%s: %s; leave it out", name, why)}
		}
	}
	return nil
}

// load reads file, environment and flags, flags winning. A shortcut flag
// given counts, even empty: validation refuses an empty URL, naming the
// flag, where leaving it out would reach the file's, the environment's or
// the default server. --config given empty is a usageError: it would read
// no file, not JETSINK_CONFIG's.
func (f *configFlags) load() (config.Config, error) {
	cfg, _, err := f.loadOrigins()
	return cfg, err
}

// loadOrigins is load that also says where each key set got its value
// (config.LoadOrigins).
func (f *configFlags) loadOrigins() (config.Config, map[string]string, error) {
	var flags []config.Flag
	for _, fl := range []config.Flag{
		{Name: "--nats-url", Key: "nats.url", Value: f.natsURL}, {Name: "--database-url", Key: "postgres.url", Value: f.dbURL},
		{Name: "--stream", Key: "nats.stream", Value: f.stream}, {Name: "--table", Key: "postgres.table", Value: f.table},
		{Name: "--mode", Key: "postgres.mode", Value: f.mode}, {Name: "--log-level", Key: "log.level", Value: f.logLevel},
	} {
		if f.given(strings.TrimPrefix(fl.Name, "--")) {
			flags = append(flags, fl)
		}
	}
	from := "JETSINK_CONFIG" // the flag's default
	if f.given("config") {
		if f.file == "" {
			// --config "$CFG" with CFG unset: no file at all, not
			// JETSINK_CONFIG's, would be read.
			return config.Config{}, nil, usageError{errors.New("--config is empty (a variable left unset?): give the config file's path, or leave --config out")}
		}
		from = "--config"
	}
	return config.LoadOrigins(config.Source{File: f.file, FileFrom: from, Env: os.Environ(), Flags: flags, Set: f.set})
}

// given reports whether the flag name was on the command line.
func (f *configFlags) given(name string) bool {
	return f.fs != nil && f.fs.Lookup(name) != nil && f.fs.Changed(name)
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level)) // validated already
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		opts.ReplaceAttr = durationText
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// durationText writes a duration in a JSON log as the text log does
// ("1m0s", "17.134s"): slog's JSON handler writes nanoseconds, a bare
// 60000000000 under keys (retry_in, away_for, drain_timeout) that name no
// unit.
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "jetsink",
		Short: "Move events from NATS JetStream into PostgreSQL, fast, with back-pressure, and lose none",
		Long: strings.TrimSpace(`
jetsink reads a JetStream stream through a durable pull consumer, maps each
JSON event to a row of typed columns, writes rows in batches with binary COPY
inside a transaction, and acks each message only after its transaction has
committed. A slow database slows the consumer; the backlog waits in JetStream.

Configuration: a YAML file (--config), overridden by JETSINK_* environment
variables (JETSINK_NATS_URL, JETSINK_DATABASE_URL, and each key that
"jetsink keys" lists, as JETSINK_ and its path in capitals with _ for each
dot: JETSINK_POSTGRES_BATCH_MAX_ROWS, JETSINK_DRAIN_TIMEOUT), overridden by
flags (--set key=value).`),
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	root.SetVersionTemplate("jetsink {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if a := c.Flags().Args(); len(a) > 0 && c.HasSubCommands() {
			// "jetsink dlq replya --dry-run": the word before the flag
			// is what is wrong.
			return unknownCommand(c, a[0])
		}
		return usageError{flagError(err)}
	})
	root.AddCommand(newRunCmd(), newCheckCmd(), newInitCmd(), newKeysCmd(), newHealthcheckCmd(), newPublishCmd(), newDemoCmd(), newBenchCmd(), newDLQCmd())
	// cobra adds its completion command as it executes; add it now, so that
	// its command lines are checked too.
	root.InitDefaultCompletionCmd()
	root.InitDefaultHelpCmd()
	for _, c := range root.Commands() {
		argsAreUsage(c)
		if c.Name() == "help" {
			helpTopicIsUsage(root, c)
		}
	}
	return root
}

// helpTopicIsUsage makes "jetsink help <no such command>" a usage error:
// cobra's help command prints "Unknown help topic" and succeeds, and for
// "jetsink help dlq nosuch" prints dlq's help.
func helpTopicIsUsage(root, help *cobra.Command) {
	run := help.Run
	help.Run = nil
	help.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			found, rest, err := root.Find(args)
			if err != nil || found == root {
				return unknownCommand(root, args[0])
			}
			if len(rest) > 0 {
				return unknownCommand(found, rest[0])
			}
		}
		run(cmd, args)
		return nil
	}
}

// execute runs root and returns its error, as a usageError when the
// command line itself was wrong: cobra reports an unknown subcommand of
// jetsink (found before any flag is parsed, with its suggestion) as a plain
// error of the command that only groups others.
//
// Every command's output goes through one stdout that remembers its first
// failed write: output cut short (keys or init --print > FILE on a full
// disk, --version > /dev/full) fails the command with exitFailed, saying
// so once, unless the command's own error already says it (bench's).
func execute(ctx context.Context, root *cobra.Command) error {
	out := &stdout{w: root.OutOrStdout()}
	// Also where cobra prints the error of a failed --version, which is
	// then reported once, by exitCode.
	root.SetOut(out)
	help := root.HelpFunc()
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		// Rendered whole first: cobra's own help prints a failed write's
		// error itself, and it is reported once, below.
		var buf bytes.Buffer
		c.SetOut(&buf)
		help(c, args)
		c.SetOut(out)
		_, _ = out.Write(buf.Bytes())
	})
	cmd, err := root.ExecuteContextC(ctx)
	if out.err != nil {
		switch {
		case err == nil, err == out.err: // err is --version's write
			return out.failed()
		case !errors.Is(err, out.err):
			err = errors.Join(err, out.failed())
		}
	}
	var usage usageError
	switch {
	case err != nil && cmd != nil && !cmd.Runnable() && !errors.As(err, &usage):
		if m := cobraUnknown.FindStringSubmatch(err.Error()); m != nil {
			if name, uerr := strconv.Unquote(m[1]); uerr == nil {
				return unknownCommand(cmd, name) // quoted as shownArg cuts it
			}
		}
		return usageError{err}
	case errors.As(err, &usage) && cmd != nil && cmd.Annotations[usageExitsFailed] != "":
		return errors.New(err.Error()) // exitFailed, not exitConfig
	}
	return err
}

// stdout is the commands' output: it remembers the first write that
// failed, and writes nothing after it.
type stdout struct {
	w   io.Writer
	err error
}

func (o *stdout) Write(p []byte) (int, error) {
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	o.err = err
	return n, err
}

// failed is the error of output that could not be written whole: an
// outputClosed when the reader went away (EPIPE: `jetsink keys | head`).
func (o *stdout) failed() error {
	err := fmt.Errorf("could not write the output, which is cut short or missing: %w", o.err)
	if errors.Is(o.err, syscall.EPIPE) {
		return outputClosed{err}
	}
	return err
}

// outputClosed is the error of output whose reader has gone (EPIPE): the
// command exits with exitFailed, saying nothing, as a program that
// SIGPIPE ends would (jetsink catches SIGPIPE: survivePipes).
type outputClosed struct{ error }

func (e outputClosed) Unwrap() error { return e.error }

// cobraUnknown matches cobra's error for an unknown subcommand of the root
// (its legacyArgs), which quotes the argument whole.
var cobraUnknown = regexp.MustCompile(`^unknown command ("(?:[^"\\]|\\.)*") for `)

// usageExitsFailed, set in a command's Annotations, makes a bad command
// line of it exit with exitFailed, not exitConfig: healthcheck's, as
// Docker reserves 2 in a health check.
const usageExitsFailed = "jetsink-usage-exits-failed"

// argsAreUsage makes a bad command line below jetsink exit with
// exitConfig, as a bad flag does: an argument a command does not take, and
// an unknown subcommand of a command that groups others (jetsink dlq),
// for which cobra would print the help and succeed.
func argsAreUsage(c *cobra.Command) {
	switch {
	case c.HasSubCommands() && !c.Runnable():
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return unknownCommand(cmd, args[0])
		}
	case c.Args != nil:
		args := c.Args
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				if len(a) > 0 && strings.Contains(err.Error(), a[0]) {
					// cobra.NoArgs quotes the argument, which may be a
					// flag's value given after a space instead of "=":
					// --set nats.password hunter2. Quote none.
					msg := fmt.Sprintf("%s takes no arguments, and %d given", cmd.CommandPath(), len(a))
					if cmd.Flags().Lookup("set") != nil {
						msg += " (--set takes key=value, with no space around the =)"
					}
					return usageError{errors.New(msg)}
				}
				return usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		argsAreUsage(sub)
	}
}

// unknownCommand is the usage error for name given to cmd, with cobra's
// suggestions. It quotes name up to its first character that no command
// or configuration key holds (shownArg).
func unknownCommand(cmd *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", shownArg(name), cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's own default for its message
	}
	if s := cmd.SuggestionsFor(name); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	if cmd.CommandPath() == "jetsink dlq" && slices.Contains([]string{"list", "ls", "show", "inspect", "peek"}, name) {
		// Not "did you mean replay": replay without --dry-run publishes.
		msg += "; 'jetsink dlq replay --dry-run' lists the dead letters and replays none"
	}
	if cmd.HasAvailableSubCommands() {
		msg += " ('" + cmd.CommandPath() + " --help' lists the commands)"
	}
	return usageError{errors.New(msg)}
}

// flagError is pflag's error err, without the argument it quotes whole
// where that may hold a value: "-database-url=postgres://u:pw@db" (one
// dash, as Go's flag package takes it) is "unknown shorthand flag: 'd' in
// -database-url=postgres://u:pw@db", and "---set=..." a "bad flag syntax"
// quoting all of it. The argument is cut as shownArg cuts it.
func flagError(err error) error {
	if e, ok := errors.AsType[*pflag.NotExistError](err); ok && e.GetSpecifiedShortnames() != "" {
		return fmt.Errorf("unknown shorthand flag: %q in -%s (long flags take two dashes: --name=value)",
			e.GetSpecifiedName(), shownArg(e.GetSpecifiedShortnames()))
	}
	if e, ok := errors.AsType[*pflag.InvalidSyntaxError](err); ok {
		return fmt.Errorf("bad flag syntax: %s", shownArg(e.GetSpecifiedFlag()))
	}
	return err
}

// shownArg is arg up to its first byte outside [A-Za-z0-9._-], then
// "...": an argument that is no command may be a misplaced value, a URL
// with a password (--set postgres.url postgres://u:pw@db, with a space).
func shownArg(arg string) string {
	for i := range len(arg) {
		c := arg[i]
		if !(c == '.' || c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return arg[:i] + "..."
		}
	}
	return arg
}

// newKeysCmd lists every configuration key with its environment variable.
func newKeysCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keys",
		Short: "List every configuration key, its type, default and environment variable",
		Long: `List every configuration key that the environment and --set can set, with its
type, environment variable and default. postgres.columns, the mapping, is
set in the file only (see the README). A key that a shorter variable sets
too has a line for it (JETSINK_DATABASE_URL, short for
JETSINK_POSTGRES_URL). A default of 0 is derived at start
(pipeline.workers: the physical cores; nats.max_ack_pending: from the
rings and the pull;
nats.pull_max_messages: 4096, or 1024 with nats.go's pull client, at most
max_ack_pending and the consumer's max_request_batch;
nats.max_in_flight_bytes: 32MiB, or 4 x (the server's max_payload + 8KiB)
if more). Elsewhere 0 leaves a thing as NATS has it: nats.pull_max_bytes
(no cap per pull), nats.stream_max_age and nats.stream_max_bytes (no
limit: a created stream keeps events for good), nats.stream_replicas (a
created stream has one), nats.stream_duplicate_window (2 minutes).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%-36s %-9s %-40s %s\n", "KEY", "TYPE", "VARIABLE", "DEFAULT")
			for _, k := range config.Keys() {
				fmt.Fprintf(w, "%-36s %-9s %-40s %s\n", k.Path, k.Type, config.EnvName(k.Path), config.DefaultValue(k.Path))
				for _, alias := range config.EnvAliases(k.Path) {
					fmt.Fprintf(w, "%-36s %-9s %-40s %s\n", k.Path, k.Type, alias, "(short for "+config.EnvName(k.Path)+")")
				}
			}
			return nil
		},
	}
}

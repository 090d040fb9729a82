package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/telemetry"
)

// maxEventBytes is the largest --event-bytes publish takes: NATS's
// largest max_payload (loadgen.Options.Validate's bound).
const maxEventBytes = 64 << 20

func newPublishCmd() *cobra.Command {
	var (
		cf       configFlags
		o        loadgen.Options
		quiet    bool
		progress = func(io.Writer, int, int, time.Time) {}
	)
	cmd := &cobra.Command{
		Use:   "publish",
		Short: "Publish realistic telemetry events to JetStream (a load generator)",
		Long: `Publish ~180-byte JSON telemetry events (uuid id, RFC 3339 ts, device, kind,
value, seq, tags; --event-bytes pads them with a "pad" field) to
<subject>.<device> over --subjects devices, each with a Nats-Msg-Id of
<run in base 36>-<seq> so that retries are stored once. A stream must capture
the subjects.

Either --events N (as fast as JetStream acknowledges), or --rate R --duration D
(open loop: event i is due at start + i/R whatever happened before, so a slow
system does not lower the offered load, except that the publisher pauses
while --max-pending publishes are unacknowledged; the events due meanwhile go
out late, counted as "late" in the summary). The open loop also prints each
event's send lag (its send minus its due time, whatever the cause: a paused
or descheduled publisher too) and how many went out over 1 ms late; it
sleeps at least 1 ms at a time and then sends what is due, so up to about
1 ms is by design. The server, credentials and TLS settings come from the
nats: section (--config, JETSINK_NATS_*, --set, --nats-url), as for jetsink
run.

A publish whose PubAck fails or does not come within --ack-wait is sent again
250ms later, up to 5 times: the last resend goes out at most
5 x (ack-wait + 300ms) after the first send (26.5s by default), and the
stream's duplicate window must cover that, and a tenth of itself more (at
most 1s) for the resend's way to the server, for JetStream to store it once
(27.5s by default). publish reads the window and warns when it is shorter;
an event still unacknowledged when the window less that margin has passed
since its first send is given up and counted failed, not sent again. While
the connection reconnects, resends wait for it.

Exit status: non-zero if any publish was not acknowledged after the resends.
Events whose first send JetStream reports as a duplicate (their Nats-Msg-Id
was used before: a reused --run with overlapping --first) are counted as
"duplicate", not "acked", with a warning, but exit 0: the stream holds every
event, so re-running a publish that failed part-way with the same --run
fills in what is missing and succeeds, within the stream's duplicate window
of the first run's sends (after it, the events it stored are stored again). The run id is printed when publishing
starts (unless --quiet) and in the summary.

Ctrl-C (SIGINT or SIGTERM) stops publishing, waits up to 10 s (or
--ack-wait, if longer) for the PubAcks of the events sent, resending what
fails, prints the summary with the run id and the flags that publish the
rest, and exits 1; what is still unacknowledged then is counted, and a
re-run with the same --run within the stream's duplicate window stores each
event once. A second one exits at once.

Each event carries a W3C traceparent. With OTEL_EXPORTER_OTLP_ENDPOINT set,
each publish is a PRODUCER span "send <subject prefix>.*" (service OTEL_SERVICE_NAME,
default jetsink-publish; sampler OTEL_TRACES_SAMPLER), the parent of
jetsink's process span. Without it the traceparent has random ids and the
sampled flag cleared, so jetsink (sampling parent-based) does not trace the
events; --no-trace-context sends none, and jetsink samples them at its
telemetry.sample_ratio.`,
		Example: `  jetsink publish --nats-url nats://127.0.0.1:4222 --subject events --events 1000000
  jetsink publish --subject events --rate 20000 --duration 60s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Each range is checked here, by its flag's name, before
			// loadgen's Validate, which names its Options' fields and takes
			// 0 for a default. Given, --events 0, --rate 0 and --duration 0s
			// are refused with their value, not taken as left out.
			switch {
			case o.Subject == "":
				return usageError{errors.New("--subject: give the subject prefix, e.g. events")}
			case subjectPrefixProblem(o.Subject) != "":
				return usageError{fmt.Errorf("--subject %q: %s", o.Subject, subjectPrefixProblem(o.Subject))}
			case o.Events < 0 || o.Events == 0 && cmd.Flags().Changed("events"):
				return usageError{fmt.Errorf("--events %d: give a positive number of events", o.Events)}
			case o.Subjects < 1 || o.Subjects > loadgen.MaxSubjects:
				return usageError{fmt.Errorf("--subjects %d: give 1 up to %d (the number of devices, each its own subject)", o.Subjects, loadgen.MaxSubjects)}
			case o.MaxPending < 1 || o.MaxPending > loadgen.MaxMaxPending:
				return usageError{fmt.Errorf("--max-pending %d: give 1 up to %d (the publishes awaiting their PubAck or a resend, at which the publisher pauses)",
					o.MaxPending, loadgen.MaxMaxPending)}
			case o.EventBytes < 0 || o.EventBytes > maxEventBytes:
				return usageError{fmt.Errorf("--event-bytes %d: give 0 (unpadded) or a size in bytes, at most %d (64 MiB, the largest max_payload)", o.EventBytes, maxEventBytes)}
			case math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) || o.Rate < 0 || o.Rate == 0 && cmd.Flags().Changed("rate"):
				return usageError{fmt.Errorf("--rate %g: give a positive number of events per second", o.Rate)}
			case o.AckWait <= 0:
				return usageError{fmt.Errorf("--ack-wait %v: give a duration above 0, such as 5s", o.AckWait)}
			case (o.Events > 0) == (o.Rate > 0):
				return usageError{fmt.Errorf("give either --events or --rate with --duration")}
			case o.Rate > 0 && o.Duration <= 0 && cmd.Flags().Changed("duration"):
				return usageError{fmt.Errorf("--duration %v: give a positive duration to publish at --rate for, such as 60s", o.Duration)}
			case o.Rate > 0 && o.Duration <= 0:
				return usageError{fmt.Errorf("--rate needs --duration")}
			case o.Events > 0 && cmd.Flags().Changed("duration"):
				return usageError{fmt.Errorf("--duration goes with --rate; --events publishes as fast as acknowledged")}
			case o.Rate > 0 && o.Rate*o.Duration.Seconds() < 1:
				return usageError{fmt.Errorf("--rate %g for --duration %v is less than one event", o.Rate, o.Duration)}
			}
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			if n := uint64(o.Total()); o.First > math.MaxUint64-(n-1) {
				return usageError{fmt.Errorf("--first %d: %d events from it would pass the largest sequence number, %d", o.First, n, uint64(math.MaxUint64))}
			}
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			// The first signal stops publishing; a second one ends
			// what is left (the traces' export) at once.
			intake, hard, stop := signalStages(cmd, "stopping publishing; a second signal exits at once", "exiting now")
			defer stop()
			if o.Run == 0 {
				o.Run = uint64(time.Now().UnixNano())
			}
			// stopped is err, or after a signal what the signal did, the
			// run and how to go on from sent events.
			stopped := func(err error, sent, unsettled int) error {
				if cause := context.Cause(hard); errors.Is(cause, errAborted) {
					return cause
				}
				if intake.Err() == nil {
					return err
				}
				return fmt.Errorf("%w after %d of %d events: %s", context.Cause(intake), sent, o.Total(), resumeHint(o, sent, unsettled))
			}
			// The first signal stops the connecting, but not a connection
			// made: the PubAcks of what was sent come on it (natsConnect
			// closes its connections when its context ends).
			connCtx, cancelConn := context.WithCancel(hard)
			defer cancelConn()
			unwatch := context.AfterFunc(intake, cancelConn)
			// No reconnect buffer: a resend kept for a reconnect could reach
			// the stream after its duplicate window (loadgen.Options). The
			// handlers (on nats.go's goroutine) say why the progress stalls:
			// loadgen sends nothing while the connection reconnects.
			errOut, nl := cmd.ErrOrStderr(), ""
			if f, ok := errOut.(*os.File); ok && !quiet && term.IsTerminal(int(f.Fd())) {
				nl = "\n" // below the progress bar's line (redrawn while paused too)
			}
			nc, err := natsConnect(connCtx, cfg.NATS, "jetsink-publish", nats.ReconnectBufSize(-1),
				nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
					if c.IsClosed() { // our Close at the end, or the reconnects ran out: Publish's error says so
						return
					}
					fmt.Fprintf(errOut, "%sjetsink: NATS connection lost (%v): publishing paused until it reconnects\n", nl, err)
				}),
				nats.ReconnectHandler(func(c *nats.Conn) {
					fmt.Fprintf(errOut, "%sjetsink: NATS connection back (%s): publishing resumes\n", nl, c.ConnectedUrlRedacted())
				}))
			if !unwatch() && err == nil {
				nc.Close()
				err = context.Cause(intake)
			}
			if err != nil {
				return stopped(err, 0, 0)
			}
			defer nc.Close()
			tr, err := telemetry.NewTracing(intake, telemetry.Config{
				ServiceName: envOr("OTEL_SERVICE_NAME", "jetsink-publish"), SampleRatio: -1})
			if err != nil {
				return err
			}
			defer func() {
				ctx, cancel := context.WithTimeout(hard, 10*time.Second)
				defer cancel()
				if err := tr.Shutdown(ctx); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "tracing:", err)
				}
			}()
			if tr.Enabled() {
				o.Tracer = tr.Tracer()
			}
			if limit := loadgen.MaxEventBytes(nc.MaxPayload()); o.EventBytes > 0 && int64(o.EventBytes) > limit {
				return usageError{fmt.Errorf("--event-bytes %d: an event and its headers must fit the server's max_payload, %d bytes: give at most %d",
					o.EventBytes, nc.MaxPayload(), limit)}
			}
			out := cmd.ErrOrStderr()
			if err := checkStream(intake, out, nc, cfg.NATS, &o); err != nil {
				return stopped(err, 0, 0)
			}
			total := o.Total()
			if !quiet {
				// Now, not only in the summary: a publish killed before it
				// could print one is filled in with the same --run.
				fmt.Fprintf(out, "publishing %d events from seq %d as run %d (Nats-Msg-Ids %s-<seq>); to fill in what a failed or stopped publish missed, run it again with --run %d "+
					"within the stream's duplicate window (after it, the events that were stored are stored again)\n",
					total, o.First, o.Run, strconv.FormatUint(o.Run, 36), o.Run)
				progress = plainProgress()
				if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
					progress = barProgress
				}
			}
			start := time.Now()
			o.Progress = func(sent int) { progress(out, sent, total, start) }
			// The first signal stops the sending (Stop); the PubAcks of
			// what was sent are still waited for, for a while.
			pctx, cancelP := context.WithCancel(hard)
			defer cancelP()
			defer context.AfterFunc(intake, func() {
				time.AfterFunc(max(stopAckWait, o.AckWait), cancelP)
			})()
			o.Stop = intake.Done()
			res, err := loadgen.Publish(pctx, nc, o)
			if !quiet {
				fmt.Fprintln(out)
			}
			if res.Duplicate > 0 {
				fmt.Fprintf(out, "warning: JetStream held %d of these events already (Nats-Msg-Ids %s-<seq> used before: --run %d reused with an overlapping --first) and did not store them again\n",
					res.Duplicate, strconv.FormatUint(o.Run, 36), o.Run)
			}
			late := ""
			if o.Rate > 0 {
				late = fmt.Sprintf(", late %d", res.Late)
			}
			rate := "" // no rate from fewer than two sends
			if res.Sent > 1 {
				rate = fmt.Sprintf("sent at %.0f/s, ", res.SendRate())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "published %d events in %v (%sthe last PubAck %v after the start); acked %d, duplicate %d, retried %d, failed %d%s; run %d\n",
				res.Sent, res.Sending.Round(time.Millisecond), rate, res.Elapsed.Round(time.Millisecond), res.Acked, res.Duplicate,
				res.Retried, res.Failed, late, o.Run)
			if l := res.SendLag; l != nil && l.TotalCount() > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "send lag (send - due) p50 %.2f p99 %.2f max %.1f ms; %d of %d sent over 1 ms late\n",
					float64(l.ValueAtQuantile(50))/1000, float64(l.ValueAtQuantile(99))/1000, float64(res.SendLagMax)/float64(time.Millisecond),
					res.SentOver1ms, l.TotalCount())
			}
			if err == nil && !res.Stopped {
				return nil // every event sent and stored, the signal or not
			}
			if errors.Is(err, nats.ErrConnectionClosed) && intake.Err() == nil && res.Sent < o.Total() {
				// The reconnects ran out: minutes, likely past the stream's
				// duplicate window, so running it all again could store
				// what was stored twice; the rest never went out.
				err = fmt.Errorf("%w; publish the rest with %s", err, restFlags(o, res.Sent))
			}
			return stopped(err, res.Sent, res.Sent-res.Acked-res.Duplicate)
		},
	}
	f := cmd.Flags()
	cf.registerNATS(f) // --config, --set, --nats-url: the nats: section's URL, credentials and TLS
	f.StringVar(&o.Subject, "subject", "events", "subject prefix; events go to <subject>.<device>")
	f.IntVar(&o.Subjects, "subjects", 1000, "number of devices (distinct subjects)")
	f.IntVar(&o.EventBytes, "event-bytes", 0, "pad each event's JSON to this many bytes (0: ~180 bytes, unpadded); with its headers within the server's max_payload")
	f.IntVar(&o.Events, "events", 0, "publish this many events, as fast as acknowledged")
	f.Float64Var(&o.Rate, "rate", 0, "events per second, open loop (with --duration)")
	f.DurationVar(&o.Duration, "duration", 0, "how long to publish at --rate")
	f.Uint64Var(&o.Run, "run", 0, "run id for ids and Nats-Msg-Ids (default: the clock)")
	f.Uint64Var(&o.First, "first", 0, "first sequence number")
	f.IntVar(&o.MaxPending, "max-pending", 4096, "publishes awaiting their PubAck or a resend; at this many the publisher pauses, also with --rate")
	f.DurationVar(&o.AckWait, "ack-wait", 5*time.Second, "send a publish again when its PubAck has not come within this; the stream's duplicate window must cover 5 x (ack-wait + 300ms) and a tenth more (at most 1s)")
	f.BoolVar(&o.Stamp, "stamp", false, "set each event's ts to its scheduled send time (--rate) or its send time, not a fixed time plus seq ms: "+
		"the table's now() - ts is then publish-to-commit latency from the schedule (a run is no longer repeatable event for event)")
	f.BoolVar(&o.NoTraceContext, "no-trace-context", false, "send no traceparent when not tracing (jetsink then samples the events at telemetry.sample_ratio)")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
}

// subjectPrefixProblem says what is wrong with --subject, "" if nothing:
// events go to <subject>.<device>, which must be a subject a publish can
// go to. NATS takes a wildcard token there (events.> goes to
// "events.>.dev-0"), and refuses white space only at the publish, which
// publish would send again and again.
func subjectPrefixProblem(s string) string {
	if strings.ContainsFunc(s, unicode.IsSpace) {
		return "a subject holds no white space"
	}
	for _, tok := range strings.Split(s, ".") {
		switch tok {
		case "":
			return "a subject has no empty token (no dot at either end, no two dots together)"
		case "*", ">":
			return "events go to <subject>.<device>: give a plain subject, without the wildcards * and >"
		}
	}
	return ""
}

// stopAckWait is how long, at least, publish waits for the PubAcks of what
// it sent after the first signal.
const stopAckWait = 10 * time.Second

// resumeHint says how to go on after a publish of o stopped having sent
// sent events, unsettled of which JetStream had not acknowledged (no
// PubAck yet, or failed).
func resumeHint(o loadgen.Options, sent, unsettled int) string {
	rest := restFlags(o, sent)
	if unsettled == 0 {
		if sent >= o.Total() {
			return "every event is stored"
		}
		return fmt.Sprintf("every event sent is stored; publish the rest with %s", rest)
	}
	again := fmt.Sprintf("--run %d --first %d", o.Run, o.First) + countFlags(o, o.Total())
	hint := fmt.Sprintf("%d sent were not acknowledged (yet) and may not be stored; run again with %s within the stream's duplicate window (what is stored is not stored twice)",
		unsettled, again)
	if sent < o.Total() {
		hint += ", or publish the rest with " + rest
	}
	return hint
}

// countFlags are the flags that publish n of o's events.
func countFlags(o loadgen.Options, n int) string {
	if o.Rate == 0 {
		return fmt.Sprintf(" --events %d", n)
	}
	// To the nanosecond: Options.Total rounds rate x duration, and this
	// duration gives back n exactly.
	return fmt.Sprintf(" --rate %g --duration %v", o.Rate, time.Duration(math.Round(float64(n)/o.Rate*1e9)))
}

// restFlags are the flags that publish o's events after the first sent.
func restFlags(o loadgen.Options, sent int) string {
	return fmt.Sprintf("--run %d --first %d", o.Run, o.First+uint64(sent)) + countFlags(o, o.Total()-sent)
}

// checkStream looks up the stream that captures o's first event. None, or
// no JetStream, is an error before anything is sent: every publish would
// wait for a PubAck that never comes and be sent again, minutes of it for a
// large --events. It warns on w when the stream's duplicate window is
// shorter than the span over which a publish may be sent again, so that a
// late resend would be stored twice. Other lookup errors are left for
// Publish to report. It looks in nats.domain's JetStream when that is set
// (a publisher on a leaf node whose hub keeps the stream). It sets
// o.DuplicateWindow to the stream's window: no resend goes out past it (the
// publish is given up instead, and counted not acknowledged).
func checkStream(ctx context.Context, w io.Writer, nc *nats.Conn, ncfg consumer.Config, o *loadgen.Options) error {
	js, err := ncfg.JetStream(nc)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ev := loadgen.Make(o.Run, o.First, o.Subjects)
	subject := ev.Subject(o.Subject)
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("no JetStream stream captures %s: create one for %s.> (jetsink run with nats.create_stream does), or fix --subject", subject, o.Subject)
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		if ncfg.Domain != "" {
			return fmt.Errorf("no JetStream in domain %q (nats.domain) reachable from this NATS server, or not for this account (%w)", ncfg.Domain, err)
		}
		return fmt.Errorf("no JetStream on this NATS server, or not for this account (%w): run nats-server with -js", err)
	case err != nil:
		return nil
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil
	}
	window, span := s.CachedInfo().Config.Duplicates, loadgen.ResendSpan(o.AckWait)
	o.DuplicateWindow = window
	need := loadgen.MinDuplicateWindow(o.AckWait) // the span, and the margin kept for the resends' way
	if window <= 0 || window >= need {
		return nil
	}
	fix := fmt.Sprintf("raise the stream's duplicate window to %v or more", need)
	if ack := loadgen.MaxAckWait(window); ack > 0 {
		fix = fmt.Sprintf("set --ack-wait %v or less, or raise the stream's duplicate window to %v", ack, need)
	}
	fmt.Fprintf(w, "warning: stream %s de-duplicates over %v, but a publish may be sent again up to %v after its first send (5 resends with --ack-wait %v), "+
		"and a tenth of the window (at most 1s) is kept for a resend's way to the server; an event still unacknowledged when the window less that has passed "+
		"is given up and counted failed rather than risk being stored twice: %s\n",
		name, window, span, o.AckWait, fix)
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// plainProgress prints a line a second, for logs and pipes.
func plainProgress() func(io.Writer, int, int, time.Time) {
	var last time.Time
	return func(w io.Writer, sent, total int, start time.Time) {
		if time.Since(last) < time.Second && sent != total {
			return
		}
		last = time.Now()
		fmt.Fprintf(w, "sent %d/%d (%.0f/s)\n", sent, total, float64(sent)/time.Since(start).Seconds())
	}
}

func barProgress(w io.Writer, sent, total int, start time.Time) {
	const width = 40
	filled := 0
	if total > 0 {
		filled = width * sent / total
	}
	bar := make([]byte, width)
	for i := range bar {
		bar[i] = '.'
		if i < filled {
			bar[i] = '#'
		}
	}
	fmt.Fprintf(w, "\r[%s] %d/%d %.0f/s ", bar, sent, total, float64(sent)/time.Since(start).Seconds())
}

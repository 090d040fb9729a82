package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/telemetry"
)

func newPublishCmd() *cobra.Command {
	var (
		url      string
		o        loadgen.Options
		quiet    bool
		progress = func(io.Writer, int, int, time.Time) {}
	)
	cmd := &cobra.Command{
		Use:   "publish",
		Short: "Publish realistic telemetry events to JetStream (a load generator)",
		Long: `Publish ~180-byte JSON telemetry events (uuid id, RFC 3339 ts, device, kind,
value, seq, tags) to <subject>.<device> over --subjects devices, each with a
Nats-Msg-Id of <run>-<seq> so that retries are stored once.

Either --events N (as fast as JetStream acknowledges), or --rate R --duration D
(open loop: event i is sent at start + i/R whatever happened before, so a slow
system does not lower the offered load). Exits non-zero if any publish was not
acknowledged by JetStream after retries. A stream must capture the subjects.

With OTEL_EXPORTER_OTLP_ENDPOINT set, each publish is a PRODUCER span
"send <subject>" (service OTEL_SERVICE_NAME, default jetsink-publish; sampler
OTEL_TRACES_SAMPLER) and carries its W3C traceparent header, so that jetsink's
process span is its child.`,
		Example: `  jetsink publish --nats-url nats://127.0.0.1:4222 --subject events --events 1000000
  jetsink publish --subject events --rate 20000 --duration 60s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (o.Events > 0) == (o.Rate > 0) {
				return usageError{fmt.Errorf("give either --events or --rate with --duration")}
			}
			if o.Rate > 0 && o.Duration <= 0 {
				return usageError{fmt.Errorf("--rate needs --duration")}
			}
			nc, err := nats.Connect(url, nats.Name("jetsink-publish"))
			if err != nil {
				return fmt.Errorf("connect to %s: %w", url, err)
			}
			defer nc.Close()
			tr, err := telemetry.NewTracing(cmd.Context(), telemetry.Config{
				ServiceName: envOr("OTEL_SERVICE_NAME", "jetsink-publish"), SampleRatio: -1})
			if err != nil {
				return err
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 10*time.Second)
				defer cancel()
				if err := tr.Shutdown(ctx); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "tracing:", err)
				}
			}()
			if tr.Enabled() {
				o.Tracer = tr.Tracer()
			}
			if o.Run == 0 {
				o.Run = uint64(time.Now().UnixNano())
			}
			total := o.Events
			if o.Rate > 0 {
				total = int(o.Rate * o.Duration.Seconds())
			}
			out := cmd.ErrOrStderr()
			if !quiet {
				progress = plainProgress()
				if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
					progress = barProgress
				}
			}
			start := time.Now()
			o.Progress = func(sent int) { progress(out, sent, total, start) }
			res, err := loadgen.Publish(cmd.Context(), nc, o)
			if !quiet && progress != nil {
				fmt.Fprintln(out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "published %d events in %v (%.0f/s); acked %d, retried %d, failed %d; run %d\n",
				res.Sent, res.Elapsed.Round(time.Millisecond), float64(res.Sent)/res.Elapsed.Seconds(), res.Acked, res.Retried, res.Failed, o.Run)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "nats-url", envOr("JETSINK_NATS_URL", nats.DefaultURL), "NATS server URL")
	f.StringVar(&o.Subject, "subject", "events", "subject prefix; events go to <subject>.<device>")
	f.IntVar(&o.Subjects, "subjects", 1000, "number of devices (distinct subjects)")
	f.IntVar(&o.Events, "events", 0, "publish this many events, as fast as acknowledged")
	f.Float64Var(&o.Rate, "rate", 0, "events per second, open loop (with --duration)")
	f.DurationVar(&o.Duration, "duration", 0, "how long to publish at --rate")
	f.Uint64Var(&o.Run, "run", 0, "run id for ids and Nats-Msg-Ids (default: the clock)")
	f.Uint64Var(&o.First, "first", 0, "first sequence number")
	f.IntVar(&o.MaxPending, "max-pending", 4096, "async publishes awaiting their PubAck")
	f.DurationVar(&o.AckWait, "ack-wait", 5*time.Second, "send a publish again when its PubAck has not come within this; the stream's duplicate window must cover 5 x (ack-wait + 250ms)")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
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

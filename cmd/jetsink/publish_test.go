package main

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/tests/testenv"
)

// runPublish runs `jetsink publish args...` and returns its stdout,
// stderr and error.
func runPublish(t *testing.T, ctx context.Context, args ...string) (string, string, error) {
	t.Helper()
	unsetenv(t, "OTEL_EXPORTER_OTLP_ENDPOINT")
	unsetenv(t, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	var stdout, stderr testenv.SyncBuffer // nats.go's handlers write to stderr too
	root := newRoot()
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	root.SetArgs(append([]string{"publish"}, args...))
	err := root.ExecuteContext(ctx)
	return stdout.String(), stderr.String(), err
}

// Flags that cannot make a run are usage errors, found before connecting,
// that name the flag and the range it takes (not loadgen's Options
// fields, whose 0 means a default).
func TestPublishCmdUsageErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args []string
		say  string
	}{
		{[]string{"--rate", "0.5", "--duration", "1s"}, "less than one event"},
		{[]string{"--events", "10", "--duration", "1s"}, "--duration goes with --rate"},
		{[]string{"--rate", "10"}, "--rate needs --duration"},
		{[]string{"--events", "10", "--rate", "10", "--duration", "1s"}, "give either --events or --rate"},
		{[]string{}, "give either --events or --rate"},
		{[]string{"--events", "-5"}, "--events -5: "},
		// Given, a value that publishes nothing is named, not taken as
		// the flag left out.
		{[]string{"--events", "0"}, "--events 0: give a positive number of events"},
		{[]string{"--events", "-1"}, "--events -1: give a positive number of events"},
		{[]string{"--rate", "0", "--duration", "1s"}, "--rate 0: give a positive number of events per second"},
		{[]string{"--rate", "-2", "--duration", "1s"}, "--rate -2: give a positive number of events per second"},
		{[]string{"--rate", "10", "--duration", "-1s"}, "--duration -1s: give a positive duration"},
		{[]string{"--rate", "10", "--duration", "0s"}, "--duration 0s: give a positive duration"},
		{[]string{"--events", "10", "--duration", "0s"}, "--duration goes with --rate"},
		{[]string{"--events", "10", "--subjects", "0"}, "--subjects 0: give 1 up to 1048576"},
		{[]string{"--events", "10", "--subjects", "2000000"}, "--subjects 2000000: give 1 up to 1048576"},
		{[]string{"--events", "10", "--max-pending", "0"}, "--max-pending 0: give 1 up to 1048576"},
		{[]string{"--events", "10", "--max-pending", "2000000"}, "--max-pending 2000000: give 1 up to 1048576"},
		{[]string{"--events", "10", "--event-bytes", "-1"}, "--event-bytes -1: "},
		{[]string{"--events", "10", "--event-bytes", "100000000"}, "--event-bytes 100000000: give 0 (unpadded) or a size in bytes, at most 67108864"},
		{[]string{"--rate", "inf", "--duration", "1s"}, "--rate +Inf: give a positive number"},
		{[]string{"--events", "10", "--rate", "-1"}, "--rate -1: give a positive number"},
		{[]string{"--events", "10", "--subject", ""}, "--subject: give the subject prefix"},
		{[]string{"--events", "10", "--ack-wait", "0s"}, "--ack-wait 0s: "},
		{[]string{"--events", "10", "--subject", "events.>"}, `--subject "events.>": events go to <subject>.<device>: give a plain subject, without the wildcards`},
		{[]string{"--events", "10", "--subject", "*.x"}, "without the wildcards * and >"},
		{[]string{"--events", "10", "--subject", "a b"}, `--subject "a b": a subject holds no white space`},
		{[]string{"--events", "10", "--subject", "a\tb"}, "no white space"},
		{[]string{"--events", "10", "--subject", "events."}, "no empty token"},
		{[]string{"--events", "10", "--subject", ".events"}, "no empty token"},
		{[]string{"--events", "10", "--subject", "a..b"}, "no empty token"},
		{[]string{"--events", "2", "--first", "18446744073709551615"}, "--first 18446744073709551615: 2 events from it would pass the largest sequence number"},
		{[]string{"--rate", "10", "--duration", "1s", "--first", "18446744073709551610"}, "10 events from it would pass"},
	} {
		// Nothing listens on port 1: a run that got past the checks would
		// fail to connect instead.
		_, _, err := runPublish(t, ctx, append(tc.args, "--nats-url", "nats://127.0.0.1:1", "-q")...)
		var usage usageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.say) {
			t.Errorf("publish %v: %v, want a usage error with %q", tc.args, err, tc.say)
		}
	}
}

// publish warns when the stream's duplicate window is shorter than the
// resends may take, and reports, warns about and exits 0 for events the
// stream held already.
func TestPublishCmdWarnsAndCountsDuplicates(t *testing.T) {
	ns := testenv.NATS(t)
	js := ns.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PC", Subjects: []string{"pc.>"}, Duplicates: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	args := []string{"--nats-url", ns.URL(), "--subject", "pc", "--subjects", "5", "--events", "50", "--run", "42", "-q"}
	stdout, stderr, err := runPublish(t, ctx, args...)
	if err != nil || !strings.Contains(stdout, "acked 50, duplicate 0,") {
		t.Fatalf("first run: %v\n%s%s", err, stdout, stderr)
	}
	if !strings.Contains(stderr, "--ack-wait 1.5s or less") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("want one line of warning naming --ack-wait 1.5s for a 10s window; stderr:\n%s", stderr)
	}
	// Again, with an --ack-wait the window covers.
	stdout, stderr, err = runPublish(t, ctx, append(args, "--ack-wait", "1.5s")...)
	if err != nil || !strings.Contains(stdout, "acked 0, duplicate 50,") {
		t.Fatalf("second run: %v\n%s%s", err, stdout, stderr)
	}
	if strings.Contains(stderr, "de-duplicates over") || !strings.Contains(stderr, "--run 42 reused") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("want only the one-line warning about a reused --run; stderr:\n%s", stderr)
	}
	st, err := js.Stream(ctx, "PC")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 50 {
		t.Fatalf("stream holds %d messages, want 50", n)
	}
	// The open loop reports its late events and its send lag.
	stdout, stderr, err = runPublish(t, ctx, "--nats-url", ns.URL(), "--subject", "pc", "--rate", "100", "--duration", "100ms", "--ack-wait", "1s", "-q")
	if err != nil || !strings.Contains(stdout, "acked 10, duplicate 0, retried 0, failed 0, late 0;") ||
		!regexp.MustCompile(`\nsend lag \(send - due\) p50 [0-9.]+ p99 [0-9.]+ max [0-9.]+ ms; [0-9]+ of 10 sent over 1 ms late\n$`).MatchString(stdout) || stderr != "" {
		t.Fatalf("open loop: %v\n%s%s", err, stdout, stderr)
	}
}

// publish tells the publisher the stream's duplicate window: a publish
// whose PubAck never comes (a stream with no_ack) is resent until a resend
// would fall outside the window, then given up and counted failed (exit
// non-zero), rather than resent past it and stored twice.
func TestPublishCmdResendsWithinTheDuplicateWindow(t *testing.T) {
	ns := testenv.NATS(t)
	js := ns.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PW", Subjects: []string{"pw.>"}, Duplicates: 2 * time.Second, NoAck: true}); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := runPublish(t, ctx, "--nats-url", ns.URL(), "--subject", "pw", "--events", "5", "--ack-wait", "400ms", "-q")
	if !errors.Is(err, loadgen.ErrNotAcked) || !strings.Contains(err.Error(), "outside the stream's duplicate window (2s)") {
		t.Fatalf("publish to a stream that never acks: %v, want %v naming the 2s window\n%s%s", err, loadgen.ErrNotAcked, stdout, stderr)
	}
	st, err := js.Stream(ctx, "PW")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 5 {
		t.Fatalf("stream holds %d messages, want 5: a resend went out past the duplicate window", n)
	}
}

// A NATS restart during a publish is said on stderr as it happens (the
// progress stalls while loadgen holds its sends), and nothing is lost.
func TestPublishCmdSaysWhyItPauses(t *testing.T) {
	ns := testenv.NATS(t)
	js := ns.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PP", Subjects: []string{"pp.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		stdout, stderr string
		err            error
	}
	done := make(chan result, 1)
	go func() {
		stdout, stderr, err := runPublish(t, ctx, "--nats-url", ns.URL(), "--subject", "pp", "--rate", "2000", "--duration", "4s", "-q")
		done <- result{stdout, stderr, err}
	}()
	for testenv.StreamMsgs(t, ctx, js, "PP") < 500 {
		select {
		case r := <-done:
			t.Fatalf("publish ended before the restart: %v\n%s%s", r.err, r.stdout, r.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	ns.Shutdown()
	time.Sleep(time.Second) // the outage: the scenario, not a wait for an event
	if err := ns.Restart(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !strings.Contains(r.stdout, "acked 8000, duplicate 0,") {
		t.Fatalf("publish across a restart: %v\n%s%s", r.err, r.stdout, r.stderr)
	}
	// Once each: not again at publish's own Close at the end.
	if strings.Count(r.stderr, "jetsink: NATS connection lost (") != 1 || !strings.Contains(r.stderr, "publishing paused until it reconnects") ||
		strings.Count(r.stderr, "jetsink: NATS connection back (") != 1 {
		t.Errorf("stderr does not say once that the connection was lost and came back:\n%s", r.stderr)
	}
}

// --stamp sets each event's ts to when it was due (open loop), not to
// loadgen.Base plus its seq in milliseconds.
func TestPublishCmdStamp(t *testing.T) {
	ns := testenv.NATS(t)
	js := ns.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PS", Subjects: []string{"ps.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, stamp := range []bool{false, true} {
		before := time.Now()
		args := []string{"--nats-url", ns.URL(), "--subject", "ps", "--rate", "100", "--duration", "50ms", "-q"}
		if stamp {
			args = append(args, "--stamp")
		}
		if stdout, stderr, err := runPublish(t, ctx, args...); err != nil {
			t.Fatalf("--stamp %v: %v\n%s%s", stamp, err, stdout, stderr)
		}
		st, err := js.Stream(ctx, "PS")
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetLastMsgForSubject(ctx, "ps.>")
		if err != nil {
			t.Fatal(err)
		}
		var ev struct{ TS time.Time }
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("%s: %v", m.Data, err)
		}
		if stamped := !ev.TS.Before(before.Truncate(time.Second)); stamped != stamp {
			t.Errorf("--stamp %v: the last event's ts is %v (publish began %v)", stamp, ev.TS, before)
		}
	}
}

// No stream for the subject, or no JetStream: an error at once, before a
// publish waits for a PubAck that never comes.
func TestPublishCmdWithoutStream(t *testing.T) {
	ns := testenv.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	stdout, stderr, err := runPublish(t, ctx, "--nats-url", ns.URL(), "--subject", "nostream", "--events", "100000", "-q")
	if err == nil || !strings.Contains(err.Error(), "no JetStream stream captures nostream.") || stdout != "" {
		t.Fatalf("publish to a subject no stream captures: %v\n%s%s", err, stdout, stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v to refuse", d)
	}

	// Padded past what the server's max_payload takes: said before
	// anything is announced or sent, as a usage error.
	stdout, stderr, err = runPublish(t, ctx, "--nats-url", ns.URL(), "--subject", "nostream", "--events", "3", "--event-bytes", "5000000")
	var usage usageError
	if !errors.As(err, &usage) || !strings.Contains(err.Error(), "--event-bytes 5000000") || !strings.Contains(err.Error(), "at most") ||
		stdout != "" || strings.Contains(stderr, "publishing") {
		t.Fatalf("publish --event-bytes past max_payload: %v\n%s%s", err, stdout, stderr)
	}

	plain := natsServer(t, &server.Options{})
	stdout, stderr, err = runPublish(t, ctx, "--nats-url", plain.ClientURL(), "--subject", "x", "--events", "100000", "-q")
	if err == nil || !strings.Contains(err.Error(), "no JetStream") || stdout != "" {
		t.Fatalf("publish to a server without JetStream: %v\n%s%s", err, stdout, stderr)
	}
}

// publish takes the nats: section's credentials, as run does.
func TestPublishCmdUsesTheNATSSection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natsServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir(), Username: "pub", Password: "s3cret"})
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("pub", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "AUTH", Subjects: []string{"auth.>"}}); err != nil {
		t.Fatal(err)
	}
	args := []string{"--nats-url", srv.ClientURL(), "--subject", "auth", "--events", "20", "-q"}
	if _, _, err := runPublish(t, ctx, args...); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("publish without credentials: %v, want an authorization error", err)
	}
	stdout, stderr, err := runPublish(t, ctx, append(args, "--set", "nats.user=pub", "--set", "nats.password=s3cret")...)
	if err != nil || !strings.Contains(stdout, "acked 20,") {
		t.Fatalf("publish with nats.user and nats.password: %v\n%s%s", err, stdout, stderr)
	}
}

// natsServer starts a nats-server with o (testenv.NATS has JetStream and
// no authentication) on a random loopback port, shut down in t.Cleanup.
func natsServer(t *testing.T, o *server.Options) *server.Server {
	t.Helper()
	o.Host, o.Port, o.NoLog, o.NoSigs = "127.0.0.1", -1, true, true
	srv, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return srv
}

// Ctrl-C stops a publish under way: the run id, from the clock, is printed
// when it starts, and the summary names it and how to publish the rest;
// the exit status is 1.
func TestPublishCmdStopsOnSignal(t *testing.T) {
	catchSignals(t)
	unsetenv(t, "OTEL_EXPORTER_OTLP_ENDPOINT")
	unsetenv(t, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	ns := testenv.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := ns.JetStream(t).CreateStream(ctx, jetstream.StreamConfig{Name: "PSIG", Subjects: []string{"psig.>"}}); err != nil {
		t.Fatal(err)
	}
	cmdCtx, cmdCancel := context.WithCancel(ctx)
	r := startJetsink(t, cmdCtx, "publish", "--nats-url", ns.URL(), "--subject", "psig", "--subjects", "5", "--events", "50000000")
	t.Cleanup(cmdCancel) // before the cleanup waiting for it, should the signal not stop it
	r.waitOutput(t, ctx, "sent ")
	started := regexp.MustCompile(`publishing 50000000 events from seq 0 as run (\d+) `).FindStringSubmatch(r.out.String())
	if started == nil {
		t.Fatalf("no run id at the start:\n%s", r.out.String())
	}
	interrupt(t)
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	code := r.wait(t, wctx)
	run := started[1]
	if code != exitFailed || !regexp.MustCompile(`\npublished \d+ events in .*; run `+run+`\n`).MatchString(r.out.String()) ||
		r.err == nil || !strings.Contains(r.err.Error(), "stopped by interrupt after ") || !strings.Contains(r.err.Error(), "--run "+run+" --first ") {
		t.Fatalf("exit %d (%v), want %d with a summary naming run %s and how to go on:\n%s", code, r.err, exitFailed, run, r.out.String())
	}
	// The PubAcks of what was sent are waited for: all of it is stored.
	m := regexp.MustCompile(`\npublished (\d+) events in .*; acked (\d+), `).FindStringSubmatch(r.out.String())
	if m == nil || m[1] != m[2] || !strings.Contains(r.err.Error(), "every event sent is stored") {
		t.Fatalf("after the signal: %v, want every event sent acked:\n%s", r.err, r.out.String())
	}
}

// The flags that go on from a stopped publish publish what is left, in the
// same mode: a rate run's hint gives the rate and the remaining duration
// (with only --run and --first, the original --rate and --duration would
// send a whole run's worth more).
func TestResumeHint(t *testing.T) {
	events := loadgen.Options{Run: 7, First: 10, Events: 1000}
	if got := resumeHint(events, 400, 0); !strings.HasSuffix(got, "publish the rest with --run 7 --first 410 --events 600") {
		t.Errorf("events: %s", got)
	}
	rate := loadgen.Options{Run: 7, Rate: 100, Duration: 10 * time.Second}
	got := resumeHint(rate, 250, 5)
	if !strings.Contains(got, "run again with --run 7 --first 0 --rate 100 --duration 10s ") ||
		!strings.HasSuffix(got, "publish the rest with --run 7 --first 250 --rate 100 --duration 7.5s") {
		t.Errorf("rate: %s", got)
	}
	if got := resumeHint(events, 1000, 0); got != "every event is stored" {
		t.Errorf("all sent and stored: %s", got)
	}
	// Every event sent, some not acknowledged: nothing is left to publish.
	if got := resumeHint(events, 1000, 3); strings.Contains(got, "publish the rest") || !strings.Contains(got, "run again with --run 7 --first 10 --events 1000 ") {
		t.Errorf("all sent: %s", got)
	}
	// After the reconnects ran out: only the rest, which never went out.
	if got := restFlags(events, 400); got != "--run 7 --first 410 --events 600" {
		t.Errorf("the rest: %s", got)
	}
	// The remaining duration publishes the remaining events, not a few
	// more for a duration rounded up.
	rate = loadgen.Options{Run: 7, Rate: 20000, Duration: 10 * time.Second}
	got = resumeHint(rate, 12345, 0)
	_, flag, ok := strings.Cut(got, "--duration ")
	d, err := time.ParseDuration(flag)
	if !ok || err != nil {
		t.Fatalf("rate: %s", got)
	}
	if n := (loadgen.Options{Rate: 20000, Duration: d}).Total(); n != 200000-12345 {
		t.Errorf("the hint's --duration %v publishes %d events, want %d", d, n, 200000-12345)
	}
}

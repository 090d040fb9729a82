package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/dlq"
	"github.com/jetsink/jetsink/tests/testenv"
)

// dlqSetup starts a server with a dead-letter stream EV_DLQ (dlq.EV) holding
// n dead letters of stream EV whose subjects, slow.<i>, no stream captures:
// the test answers their re-publishes itself, when it likes, with a PubAck
// from EV, through the channel it returns. EV (on ev.>) has the durable
// consumer jetsink, unfiltered, so that replay finds a reader for them;
// the letters are its (Jetsink-Consumer), as this version writes them.
func dlqSetup(t *testing.T, ctx context.Context, n int) (*testenv.NATSServer, jetstream.JetStream, <-chan *nats.Msg) {
	t.Helper()
	srv := testenv.NATS(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// EV sources ORIGIN: replay then does not hold a letter's subject to
	// EV's own (it may be ORIGIN's), and slow.> reaches the test.
	for _, sc := range []jetstream.StreamConfig{{Name: "EV_DLQ", Subjects: []string{"dlq.EV"}}, {Name: "ORIGIN", Subjects: []string{"origin.>"}},
		{Name: "EV", Subjects: []string{"ev.>"}, Sources: []*jetstream.StreamSource{{Name: "ORIGIN"}}}} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: consumer.DefaultConfig().Consumer}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		h := nats.Header{
			consumer.HeaderSubject:   {"slow." + strconv.Itoa(i)},
			consumer.HeaderStream:    {"EV"},
			consumer.HeaderStreamSeq: {strconv.Itoa(100 + i)},
			consumer.HeaderStage:     {"sink"},
			consumer.HeaderCode:      {"constraint"},
			consumer.HeaderConsumer:  {consumer.DefaultConfig().Consumer},
		}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "dlq.EV", Header: h, Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	pubs := make(chan *nats.Msg, n)
	sub, err := nc.ChanSubscribe("slow.>", pubs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return srv, js, pubs
}

func pubAck(t *testing.T, m *nats.Msg, seq int) {
	t.Helper()
	if err := m.Respond([]byte(fmt.Sprintf(`{"stream":"EV","seq":%d}`, seq))); err != nil {
		t.Fatal(err)
	}
}

// lettersStay checks that nothing more was re-published and that want
// dead letters are left in EV_DLQ.
func lettersStay(t *testing.T, ctx context.Context, js jetstream.JetStream, pubs <-chan *nats.Msg, want uint64) {
	t.Helper()
	select {
	case m := <-pubs:
		t.Fatalf("%s re-published", m.Subject)
	default:
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != want {
		t.Fatalf("%d dead letters left, want %d", n, want)
	}
}

func receive(t *testing.T, ctx context.Context, pubs <-chan *nats.Msg) *nats.Msg {
	t.Helper()
	select {
	case m := <-pubs:
		return m
	case <-ctx.Done():
		t.Fatal("no re-publish arrived")
		return nil
	}
}

// Ctrl-C while a dead letter waits for its PubAck: replay finishes that
// letter (re-published and deleted), stops before the next, prints the
// summary and exits 1.
func TestDLQReplayFirstSignalFinishesTheLetter(t *testing.T) {
	catchSignals(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, pubs := dlqSetup(t, ctx, 3)
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV")

	first := receive(t, ctx, pubs)
	interrupt(t)
	r.waitOutput(t, ctx, "stopping after the dead letter under way")
	pubAck(t, first, 1)
	if code := r.wait(t, ctx); code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, r.out.String())
	}
	out := r.out.String()
	if strings.Count(out, "replayed, deleted") != 1 || !strings.Contains(out, "matched 1, replayed 1, deleted 1") {
		t.Fatalf("want the letter under way replayed and deleted, and the summary:\n%s", out)
	}
	lettersStay(t, ctx, js, pubs, 2)
}

// A second Ctrl-C gives up the letter under way at once (it stays a dead
// letter) and exits 130 with the summary.
func TestDLQReplaySecondSignalExitsAtOnce(t *testing.T) {
	catchSignals(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, pubs := dlqSetup(t, ctx, 2)
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV")

	receive(t, ctx, pubs) // and never answer it
	interrupt(t)
	r.waitOutput(t, ctx, "stopping after the dead letter under way")
	r.interruptAgain(t, ctx, "jetsink: second interrupt")
	second := time.Now()
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second) // the letter's own timeout is 30 s
	defer wcancel()
	if code := r.wait(t, wctx); code != exitAborted {
		t.Fatalf("exit %d, want %d\n%s", code, exitAborted, r.out.String())
	}
	t.Logf("returned %v after the second signal", time.Since(second).Round(time.Millisecond))
	if out := r.out.String(); !strings.Contains(out, "matched 1, replayed 0, deleted 0") {
		t.Fatalf("no summary:\n%s", out)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 2 {
		t.Fatalf("%d dead letters left, want 2", n)
	}
}

// A server that accepts the connection and never answers: a second Ctrl-C
// ends the connect at once (not after its 5 s timeout) and exits 130.
func TestDLQReplaySecondSignalEndsTheConnect(t *testing.T) {
	catchSignals(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, accepted := testenv.SilentServer(t)
	// A connect that ended by its own timeout must not pass for one the
	// signal cut: the timeout well past the bound below.
	// Put back after startJetsink's cleanup has waited for its run.
	t.Cleanup(func(d time.Duration) func() { return func() { natsConnectTimeout = d } }(natsConnectTimeout))
	natsConnectTimeout = time.Minute
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", "nats://"+addr, "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV")

	select {
	case <-accepted:
	case <-ctx.Done():
		t.Fatal("jetsink did not connect")
	}
	interrupt(t)
	r.waitOutput(t, ctx, "stopping after the dead letter under way")
	r.interruptAgain(t, ctx, "jetsink: second interrupt")
	second := time.Now()
	if code := r.wait(t, ctx); code != exitAborted {
		t.Fatalf("exit %d (%v), want %d\n%s", code, r.err, exitAborted, r.out.String())
	}
	if d := time.Since(second); d > 10*time.Second { // the connect's own timeout is a minute here
		t.Fatalf("returned %v after the second signal", d.Round(time.Millisecond))
	}
}

// A letter re-published but not deleted (here the dead-letter stream is
// sealed meanwhile) is named, with what to do, and the exit status is 1.
func TestDLQReplayNamesUndeletedLetters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, pubs := dlqSetup(t, ctx, 1)
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV")

	m := receive(t, ctx, pubs)
	s, err := js.Stream(ctx, "EV_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Sealed = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	pubAck(t, m, 1)
	if code := r.wait(t, ctx); code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, r.out.String())
	}
	out := r.out.String()
	if !strings.Contains(out, "NOT deleted, so both event and dead letter: EV_DLQ 1;") || !strings.Contains(out, "duplicate window") {
		t.Fatalf("the undeleted letter is not named:\n%s", out)
	}
	if !strings.Contains(r.err.Error(), "sequences 1") {
		t.Fatalf("error %q does not name the letter", r.err)
	}
}

// A letter whose re-publish another stream stored stays, and the summary
// and the error name it as one whose event may be stored; --keep says that
// the letters it kept are both events and dead letters.
func TestDLQReplayNamesUnsureAndKeptLetters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, pubs := dlqSetup(t, ctx, 2)
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", "--seq", "1")
	m := receive(t, ctx, pubs)
	if err := m.Respond([]byte(`{"stream":"EV_SOURCE","seq":7}`)); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t, ctx); code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, r.out.String())
	}
	out := r.out.String()
	if !strings.Contains(out, "MAY be stored") || !strings.Contains(out, ": EV_DLQ 1;") || !strings.Contains(r.err.Error(), "may be stored (EV_DLQ sequences 1)") {
		t.Fatalf("the letter whose event may be stored is not named:\n%s\nerror: %v", out, r.err)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 2 {
		t.Fatalf("%d dead letters left, want 2", n)
	}

	r = startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", "--seq", "2", "--keep")
	pubAck(t, receive(t, ctx, pubs), 1)
	if code := r.wait(t, ctx); code != exitOK {
		t.Fatalf("--keep: exit %d, want %d\n%s", code, exitOK, r.out.String())
	}
	if out := r.out.String(); !strings.Contains(out, "--keep: the 1 replayed dead letters stay in EV_DLQ") {
		t.Fatalf("--keep does not say what it left:\n%s", out)
	}
}

// A --code that this jetsink never writes (a typo, most likely) matches
// nothing, and replay says so before it starts.
func TestDLQReplayWarnsOfAnUnknownCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, _, _ := dlqSetup(t, ctx, 1)
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", "--dry-run",
		"--code", "constrant", "--code", "invalid_json")
	if code := r.wait(t, ctx); code != exitOK {
		t.Fatalf("exit %d, want %d\n%s", code, exitOK, r.out.String())
	}
	out := r.out.String()
	if !strings.Contains(out, `warning: --code "constrant" is no code this jetsink writes (invalid_json, `) ||
		strings.Contains(out, `"invalid_json" is no code`) || !strings.Contains(out, "matched 0") {
		t.Fatalf("no warning for the unknown code alone, or a match:\n%s", out)
	}
}

// A negative --limit is refused as a bad flag, before anything connects
// (the NATS URL here answers nothing) and with no summary printed.
func TestDLQReplayRefusesANegativeLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", "nats://127.0.0.1:1", "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", "--limit", "-1")
	if code := r.wait(t, ctx); code != exitConfig || strings.Contains(r.out.String(), "scanned") {
		t.Fatalf("exit %d, want %d and no summary\n%s", code, exitConfig, r.out.String())
	}
}

// --since and --until take a positive duration, meaning that long ago, or
// an RFC 3339 time. A negative duration would be a time after now, and
// --until -1h would then select, replay and delete every dead letter.
func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in      string
		want    time.Time
		wantErr string
	}{
		{"", time.Time{}, ""},
		{"2h", now.Add(-2 * time.Hour), ""},
		{"0s", now, ""},
		{"2026-12-01T08:00:00Z", time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC), ""},
		{"-1h", time.Time{}, `"-1h" is a negative duration: give a positive one`},
		{"-1ns", time.Time{}, "negative duration"},
		{"yesterday", time.Time{}, "neither a duration"},
	} {
		got, err := parseWhen(tc.in, now)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("parseWhen(%q): %v", tc.in, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("parseWhen(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
		case tc.wantErr == "" && !got.Equal(tc.want):
			t.Errorf("parseWhen(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// A negative --since or --until is refused as a bad flag, before anything
// connects (the NATS URL here answers nothing).
func TestDLQReplayRefusesANegativeDuration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, flag := range []string{"--until", "--since"} {
		r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", "nats://127.0.0.1:1", "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", flag, "-1h")
		code := r.wait(t, ctx)
		if msg := fmt.Sprint(r.err); code != exitConfig || !strings.Contains(msg, flag+`: "-1h" is a negative duration`) || strings.Contains(r.out.String(), "scanned") {
			t.Errorf("%s -1h: exit %d (%s), want %d, naming the negative duration, and no summary\n%s", flag, code, msg, exitConfig, r.out.String())
		}
	}
}

func TestDLQHelpSaysWhatItDoes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := startJetsink(t, ctx, "dlq", "--help")
	if code := r.wait(t, ctx); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := r.out.String()
	if strings.Contains(out, "list them") || !strings.Contains(out, "replay") {
		t.Fatalf("dlq --help promises a command it lacks, or not replay:\n%s", out)
	}
	// The filters refuse an empty value (nonEmpty): their help gives no
	// default, as pflag's own slices print none.
	r = startJetsink(t, ctx, "dlq", "replay", "--help")
	if code := r.wait(t, ctx); code != 0 || !strings.Contains(r.out.String(), "--code") || strings.Contains(r.out.String(), "(default [])") {
		t.Fatalf("dlq replay --help: exit %d, want 0, the filters without a default []:\n%s", code, r.out.String())
	}
}

// Without nats.consumer on the letters' stream nothing would read a
// replayed event: replay publishes nothing, names the consumer, keeps the
// letters and exits 1; --dry-run says the same.
func TestDLQReplayNeedsAReader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, pubs := dlqSetup(t, ctx, 2)
	for _, args := range [][]string{{"--set", "nats.consumer=elsewhere", "--written-by", "jetsink", "--dry-run"}, {"--set", "nats.consumer=elsewhere", "--written-by", "jetsink"}} {
		r := startJetsink(t, ctx, append([]string{"dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV"}, args...)...)
		if code := r.wait(t, ctx); code != exitFailed {
			t.Fatalf("%v: exit %d, want %d\n%s", args, code, exitFailed, r.out.String())
		}
		if out := r.out.String(); strings.Count(out, "stream EV has no consumer elsewhere") != 2 {
			t.Fatalf("%v: the missing consumer is not named for each letter:\n%s", args, out)
		}
	}
	lettersStay(t, ctx, js, pubs, 2)
}

// A dead letter's headers are anyone's who may publish to the dead-letter
// subject: the listing escapes what a terminal would act on (ESC, BEL),
// in the fields and in an error that quotes them, and nothing raw reaches
// the output.
func TestDLQReplayEscapesHeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, _ := dlqSetup(t, ctx, 0)
	h := nats.Header{
		consumer.HeaderSubject:   {"slow.\x1b[2K"},
		consumer.HeaderStream:    {"EV"},
		consumer.HeaderStreamSeq: {"100"},
		consumer.HeaderStage:     {"sink\x1b[2K"},
		consumer.HeaderCode:      {"constraint\x1b]0;title\x07"},
		consumer.HeaderSQLState:  {"23505\u202e"},
		consumer.HeaderConsumer:  {consumer.DefaultConfig().Consumer},
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "dlq.EV", Header: h, Data: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		say  []string
	}{
		{nil, []string{` stage="sink\x1b[2K" code="constraint\x1b]0;title\a" sqlstate="23505\u202e" `, ` "slow.\x1b[2K" `}},
		{[]string{"--set", "nats.consumer=elsewhere", "--written-by", "jetsink"}, []string{"would fail: ", `dead letter 1 to slow.\x1b[2K: `}},
	} {
		r := startJetsink(t, ctx, append([]string{"dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", "--dry-run"}, tc.args...)...)
		r.wait(t, ctx)
		out := r.out.String() + fmt.Sprint(r.err)
		if strings.ContainsAny(out, "\x1b\x07\u202e") {
			t.Errorf("%v: a header's control characters reach the output raw:\n%q", tc.args, out)
		}
		for _, want := range tc.say {
			if !strings.Contains(out, want) {
				t.Errorf("%v: no %s in:\n%s", tc.args, want, out)
			}
		}
	}
}

// escapeControl writes what a terminal would act on as Go escapes and
// leaves text and line feeds alone; escapedError, replay's error with it,
// still wraps its error for the exit status.
func TestEscapeControl(t *testing.T) {
	for in, want := range map[string]string{
		"dead letter 1 to events.a: refused": "dead letter 1 to events.a: refused",
		"to slow.\x1b[2K: x":                 `to slow.\x1b[2K: x`,
		"bell\a, invalid \xff, rtl \u202e":   `bell\a, invalid \xff, rtl \u202e`,
		"one\ntwo, café":                     "one\ntwo, café",
	} {
		if got := escapeControl(in); got != want {
			t.Errorf("escapeControl(%q) = %q, want %q", in, got, want)
		}
	}
	err := escapedError{fmt.Errorf("%w: dead letter 1 to slow.\x1b[2K", errAborted)}
	if !errors.Is(err, errAborted) || strings.Contains(err.Error(), "\x1b") || exitCode(err) != exitAborted {
		t.Errorf("escapedError: %q, exit %d; want it to wrap errAborted (exit %d), escaped", err, exitCode(err), exitAborted)
	}
}

// --dry-run's summary says what would be replayed and what would fail, not
// "replayed 0, deleted 0" as if a replay had failed to do anything.
func TestDLQReplayDryRunSummary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, pubs := dlqSetup(t, ctx, 3)
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", "--dry-run", "--seq", "1-2")
	if code := r.wait(t, ctx); code != exitOK {
		t.Fatalf("exit %d, want %d\n%s", code, exitOK, r.out.String())
	}
	out := r.out.String()
	if !strings.Contains(out, "EV_DLQ: scanned 2, matched 2, would replay 2, would fail 0, skipped 0 (not dead letters), 0 of other consumers' or streams'; dry run: nothing re-published or deleted") ||
		strings.Contains(out, "replayed 0") || strings.Contains(out, "deleted 0") {
		t.Fatalf("the dry run's summary does not say what it would do:\n%s", out)
	}
	r = startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", "--dry-run", "--set", "nats.consumer=elsewhere", "--written-by", "jetsink")
	if code := r.wait(t, ctx); code != exitFailed {
		t.Fatalf("no reader: exit %d, want %d\n%s", code, exitFailed, r.out.String())
	}
	if out := r.out.String(); !strings.Contains(out, "matched 3, would replay 0, would fail 3,") {
		t.Fatalf("no reader: the dry run's summary does not say that all would fail:\n%s", out)
	}
	// The letters are of stream EV's events: a jetsink on another stream
	// (nats.stream, here the default) leaves them to EV's.
	r = startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--dry-run")
	if code := r.wait(t, ctx); code != exitOK {
		t.Fatalf("another stream: exit %d, want %d\n%s", code, exitOK, r.out.String())
	}
	if out := r.out.String(); !strings.Contains(out, "matched 0, would replay 0, would fail 0, skipped 0 (not dead letters), 3 of other consumers' or streams'") {
		t.Fatalf("another stream: the dry run's summary does not leave EV's letters:\n%s", out)
	}
	lettersStay(t, ctx, js, pubs, 3)
}

// A letter that names no consumer (a jetsink from before Jetsink-Consumer
// wrote it) may be another jetsink's on the same stream: replay leaves it,
// the summary counts it, and a line names it and says how to replay it;
// --include-unnamed takes it.
func TestDLQReplayLeavesLettersThatNameNoConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, pubs := dlqSetup(t, ctx, 1)
	h := nats.Header{consumer.HeaderSubject: {"slow.old"}, consumer.HeaderStream: {"EV"}, consumer.HeaderStreamSeq: {"200"},
		consumer.HeaderStage: {"sink"}, consumer.HeaderCode: {"constraint"}}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "dlq.EV", Header: h, Data: []byte(`{}`)}); err != nil { // sequence 2
		t.Fatal(err)
	}
	args := []string{"dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", "--dry-run"}
	r := startJetsink(t, ctx, args...)
	if code := r.wait(t, ctx); code != exitOK {
		t.Fatalf("exit %d, want %d\n%s", code, exitOK, r.out.String())
	}
	out := r.out.String()
	for _, want := range []string{
		"EV_DLQ: scanned 2, matched 1, would replay 1, would fail 0, skipped 0 (not dead letters), 0 of other consumers' or streams', left 1 naming no consumer; dry run",
		"left 1 dead letters that name no consumer (EV_DLQ 2): a jetsink from before 2026-12-03 wrote them",
		"(nats.consumer jetsink)", "replay them with --include-unnamed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "slow.old") {
		t.Errorf("the letter naming no consumer is listed as if replayed:\n%s", out)
	}
	r = startJetsink(t, ctx, append(args, "--include-unnamed")...)
	if code := r.wait(t, ctx); code != exitOK {
		t.Fatalf("--include-unnamed: exit %d, want %d\n%s", code, exitOK, r.out.String())
	}
	if out := r.out.String(); !strings.Contains(out, "EV_DLQ: scanned 2, matched 2, would replay 2, would fail 0, skipped 0 (not dead letters), 0 of other consumers' or streams'; dry run") ||
		!strings.Contains(out, " slow.old ") || strings.Contains(out, "naming no consumer") {
		t.Fatalf("--include-unnamed: the letter naming no consumer is not taken:\n%s", out)
	}
	lettersStay(t, ctx, js, pubs, 2)
}

// A connection ctxDialer dialed and that is closed no longer waits for the
// context's end (its context.AfterFunc is stopped): a publish --duration
// 24h that reconnects often would otherwise keep every connection it ever
// dialed. One still open is closed when the context ends.
func TestCtxDialerReleasesClosedConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		close(accepted)
		for c := range accepted {
			_ = c.Close()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &ctxDialer{ctx: ctx, Dialer: net.Dialer{Timeout: 5 * time.Second}}
	for i := range 20 {
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		cc, ok := c.(*ctxConn)
		if !ok {
			t.Fatalf("Dial returned a %T, not a *ctxConn", c)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if cc.stop() {
			t.Fatalf("connection %d: closed, but its close at the context's end was still registered", i)
		}
	}
	open, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	_ = open.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := open.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("an open connection after the context ended: read %v, want net.ErrClosed", err)
	}
}

// limitedStreamReplay starts a server with dead-letter stream EV_DLQ
// (dlq.EV) and event stream EV (ev.>, with limits' limits), jetsink's
// durable on EV, as many unread events on EV as events says (ev.0, ev.1,
// ...) and a dead letter of an EV event for each subject of letters
// (stream sequences from 100); it returns the replay's arguments.
func limitedStreamReplay(t *testing.T, ctx context.Context, limits jetstream.StreamConfig, events int, letters ...string) (jetstream.JetStream, []string) {
	t.Helper()
	srv := testenv.NATS(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	limits.Name, limits.Subjects = "EV", []string{"ev.>"}
	for _, sc := range []jetstream.StreamConfig{{Name: "EV_DLQ", Subjects: []string{"dlq.EV"}}, limits} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: consumer.DefaultConfig().Consumer}); err != nil {
		t.Fatal(err)
	}
	for i := range events {
		if _, err := js.Publish(ctx, "ev."+strconv.Itoa(i), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	for i, subject := range letters {
		h := nats.Header{consumer.HeaderSubject: {subject}, consumer.HeaderStream: {"EV"}, consumer.HeaderStreamSeq: {strconv.Itoa(100 + i)},
			consumer.HeaderStage: {"sink"}, consumer.HeaderCode: {"constraint"}, consumer.HeaderConsumer: {consumer.DefaultConfig().Consumer}}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "dlq.EV", Header: h, Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	return js, []string{"dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV"}
}

// An event stream that keeps one message per subject (max_msgs_per_subject
// 1, discard old) would let each of three letters of ev.0 replayed back to
// back push the one before out before jetsink read it: replay refuses it,
// naming the limit and the flag, in the dry run too, and keeps the letters
// (exit 1); --allow-max-msgs-per-subject replays them all the same.
func TestDLQReplayRefusesAStreamThatDropsPerSubject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, args := limitedStreamReplay(t, ctx, jetstream.StreamConfig{MaxMsgsPerSubject: 1}, 0, "ev.0", "ev.0", "ev.0")
	for _, extra := range [][]string{{"--dry-run"}, nil} {
		r := startJetsink(t, ctx, append(args, extra...)...)
		if code := r.wait(t, ctx); code != exitFailed {
			t.Fatalf("%v: exit %d, want %d\n%s", extra, code, exitFailed, r.out.String())
		}
		if out := r.out.String(); strings.Count(out, "(max_msgs_per_subject 1, discard old)") != 3 || !strings.Contains(out, "--allow-max-msgs-per-subject") {
			t.Fatalf("%v: the limit and the flag are not named for each letter:\n%s", extra, out)
		}
		if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 3 {
			t.Fatalf("%v: %d dead letters left, want 3", extra, n)
		}
	}
	r := startJetsink(t, ctx, append(args, "--allow-max-msgs-per-subject")...)
	if code := r.wait(t, ctx); code != exitOK || !strings.Contains(r.out.String(), "replayed 3, deleted 3") {
		t.Fatalf("--allow-max-msgs-per-subject: exit %d, want %d and all 3 replayed\n%s", code, exitOK, r.out.String())
	}
}

// An event stream that keeps 3 messages, discard old, all 3 not read by
// the durable: a replayed letter would push the oldest out. replay refuses
// it, naming the limit and the flag, in the dry run too, and keeps the
// letter (exit 1), the stream untouched; --allow-discard-old replays it all
// the same.
func TestDLQReplayRefusesToPushOutAnUnreadEvent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, args := limitedStreamReplay(t, ctx, jetstream.StreamConfig{MaxMsgs: 3}, 3, "ev.9")
	for _, extra := range [][]string{{"--dry-run"}, nil} {
		r := startJetsink(t, ctx, append(args, extra...)...)
		if code := r.wait(t, ctx); code != exitFailed {
			t.Fatalf("%v: exit %d, want %d\n%s", extra, code, exitFailed, r.out.String())
		}
		if out := r.out.String(); !strings.Contains(out, "max_msgs 3") || !strings.Contains(out, "--allow-discard-old") {
			t.Fatalf("%v: the limit and the flag are not named:\n%s", extra, out)
		}
		if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 1 {
			t.Fatalf("%v: %d dead letters left, want 1", extra, n)
		}
		if info, err := js.Stream(ctx, "EV"); err != nil || info.CachedInfo().State.FirstSeq != 1 {
			t.Fatalf("%v: stream EV %v, %v: want its first event (sequence 1) kept", extra, info, err)
		}
	}
	r := startJetsink(t, ctx, append(args, "--allow-discard-old")...)
	if code := r.wait(t, ctx); code != exitOK || !strings.Contains(r.out.String(), "replayed 1, deleted 1") {
		t.Fatalf("--allow-discard-old: exit %d, want %d and the letter replayed\n%s", code, exitOK, r.out.String())
	}
}

// A filter flag given an empty or blank value, or a list with an empty
// entry ("--code $CODE" with CODE unset), is a bad flag naming it, before
// anything connects (the NATS URL here answers nothing): pflag took "" for
// no filter, and replay then replayed and deleted every dead letter.
func TestDLQReplayRefusesAnEmptyFilter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"--code", ""}, {"--code="}, {"--code", " "}, {"--code", "constraint,"}, {"--code", "constraint", "--code", ""},
		{"--stage", ""}, {"--stage", "decode,,sink"},
		{"--subject", ""}, {"--subject", " "}, {"--since", ""}, {"--until", "\t"}, {"--seq", ""},
		{"--dlq-stream", ""}, {"--event-stream", ""}, {"--written-by", ""},
	} {
		r := startJetsink(t, ctx, append([]string{"dlq", "replay", "--nats-url", "nats://127.0.0.1:1", "--set", "nats.stream=EV"}, args...)...)
		code := r.wait(t, ctx)
		flag := "" // the last flag given: the empty one
		for _, a := range args {
			if strings.HasPrefix(a, "--") {
				flag = strings.TrimSuffix(a, "=")
			}
		}
		if msg := fmt.Sprint(r.err); code != exitConfig || !strings.Contains(msg, `for "`+flag+`" flag`) || strings.Contains(r.out.String(), "scanned") {
			t.Errorf("%q: exit %d (%s), want %d naming %s, and no summary\n%s", args, code, msg, exitConfig, flag, r.out.String())
		}
	}
}

// The summary names the sequences of the messages skipped as no dead
// letters (the first few), for whoever goes to look at them.
func TestDLQReplayNamesSkippedMessages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, _ := dlqSetup(t, ctx, 1)
	for range 12 { // sequences 2 to 13
		if _, err := js.Publish(ctx, "dlq.EV", []byte("not a dead letter")); err != nil {
			t.Fatal(err)
		}
	}
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV", "--dry-run")
	if code := r.wait(t, ctx); code != exitOK {
		t.Fatalf("exit %d, want %d\n%s", code, exitOK, r.out.String())
	}
	if want := "skipped 12 (not dead letters, without Jetsink-Subject or Jetsink-Stream: 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 2 more), "; !strings.Contains(r.out.String(), want) {
		t.Fatalf("no %q in:\n%s", want, r.out.String())
	}
}

// Letters of a key-value bucket's events are refused, dry run or not: the
// summary counts them and names the first few, says why and what to do
// instead, and the exit status is 1 as for any letter not replayed.
func TestDLQReplayNamesKeyValueLetters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, _ := dlqSetup(t, ctx, 0)
	for i := range 12 { // sequences 1 to 12
		h := nats.Header{
			consumer.HeaderSubject:  {"$KV.CFG.k" + strconv.Itoa(i)},
			consumer.HeaderStream:   {"EV"},
			consumer.HeaderStage:    {"decode"},
			consumer.HeaderCode:     {"invalid_json"},
			consumer.HeaderConsumer: {consumer.DefaultConfig().Consumer},
			"KV-Operation":          {"DEL"},
		}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "dlq.EV", Header: h}); err != nil {
			t.Fatal(err)
		}
	}
	for _, dry := range []bool{true, false} {
		args := []string{"dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV"}
		if dry {
			args = append(args, "--dry-run")
		}
		r := startJetsink(t, ctx, args...)
		if code := r.wait(t, ctx); code != exitFailed {
			t.Fatalf("dry run %v: exit %d, want %d\n%s", dry, code, exitFailed, r.out.String())
		}
		out := r.out.String()
		for _, want := range []string{
			"refused 12 dead letters of a key-value bucket's events (EV_DLQ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 2 more): ",
			"a delete or purge removing the key's current value",
			"put back by hand what the bucket should hold (nats kv put <bucket> <key> <value>), then delete them (nats stream rmm EV_DLQ <seq>)",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("dry run %v: no %q in:\n%s", dry, want, out)
			}
		}
		if dry && !strings.Contains(out, "would replay 0, would fail 12, skipped 0 (not dead letters), 0 of") ||
			!dry && !strings.Contains(out, "replayed 0, deleted 0, skipped 0 (not dead letters), 0 of other consumers' or streams', failed 12") {
			t.Errorf("dry run %v: the summary does not count them as failed:\n%s", dry, out)
		}
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 12 {
		t.Fatalf("%d dead letters left, want the 12 refused", n)
	}
}

// Letters of an object store's events (its chunks and meta) are refused
// and named apart from key-value ones, as those are: the summary counts
// them, says why and what to do instead, and the exit status is 1.
func TestDLQReplayNamesObjectStoreLetters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, js, _ := dlqSetup(t, ctx, 0)
	for _, subj := range []string{"$O.FILES.C.wtysQV6Ewj3tM33So4Snvr", "$O.FILES.M.YQ=="} { // sequences 1 and 2
		h := nats.Header{
			consumer.HeaderSubject:  {subj},
			consumer.HeaderStream:   {"EV"},
			consumer.HeaderStage:    {"decode"},
			consumer.HeaderCode:     {"invalid_json"},
			consumer.HeaderConsumer: {consumer.DefaultConfig().Consumer},
		}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "dlq.EV", Header: h}); err != nil {
			t.Fatal(err)
		}
	}
	r := startJetsink(t, ctx, "dlq", "replay", "--nats-url", srv.URL(), "--dlq-stream", "EV_DLQ", "--set", "nats.stream=EV")
	if code := r.wait(t, ctx); code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, r.out.String())
	}
	out := r.out.String()
	for _, want := range []string{
		"refused 2 dead letters of an object store's events (EV_DLQ 1, 2): ",
		"a chunk added to its object's data, which would no longer match its digest, a meta standing over the object's newer one",
		"put back by hand what the object store should hold (nats object put <bucket> <file>), then delete them (nats stream rmm EV_DLQ <seq>)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "key-value") {
		t.Errorf("the object store's letters named as a key-value bucket's:\n%s", out)
	}
	if n := testenv.StreamMsgs(t, ctx, js, "EV_DLQ"); n != 2 {
		t.Fatalf("%d dead letters left, want the 2 refused", n)
	}
}

// The server's subject delete markers are counted apart in the summary,
// only when there are some, not as messages that are no dead letters.
func TestDLQReplaySummaryMarkers(t *testing.T) {
	if got := markers(dlq.Report{Skipped: 1}); got != "" {
		t.Errorf("no markers: %q, want nothing said", got)
	}
	if got, want := markers(dlq.Report{Markers: 2}), ", passed over 2 subject delete markers (the server's, where letters aged out)"; got != want {
		t.Errorf("markers: %q, want %q", got, want)
	}
}

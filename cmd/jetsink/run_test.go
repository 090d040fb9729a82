package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/tests/testenv"
)

// A drain that finished is not ended by its deadline afterwards: before
// drainDeadline, a timer firing between a complete Shutdown and the exit
// turned a clean drain into status 130.
func TestDrainDeadlineAfterFinish(t *testing.T) {
	var fired atomic.Int32
	// An hour: the timer must not fire between start and finish on a slow
	// machine; expire plays the late timer.
	d := &drainDeadline{timeout: time.Hour, fire: func() { fired.Add(1) }}
	if !d.deadline().IsZero() {
		t.Fatal("a deadline before the first signal")
	}
	d.start()
	at := d.deadline()
	if at.IsZero() || time.Until(at) > time.Hour {
		t.Fatalf("deadline %v, want within an hour from now", at)
	}
	d.finish()
	d.expire() // what the timer does if it fires now
	if n := fired.Load(); n != 0 {
		t.Fatalf("fire called %d times after finish, want 0", n)
	}
	// A first signal after the end starts nothing: no deadline, no timer
	// (on one finished before it ever started).
	d = &drainDeadline{timeout: time.Hour, fire: func() { fired.Add(1) }}
	d.finish()
	d.start()
	if !d.deadline().IsZero() {
		t.Fatalf("a start following finish set a deadline (%v)", d.deadline())
	}
}

// The first signal sets the drain's deadline before it ends intake, and
// logs last. Before, it ended intake first: an idle Run returned at once,
// run read a zero deadline, and CloseStages waited its own 10 s instead of
// drain_timeout; and it logged first, so a stderr that blocked (a full
// pipe) held up the drain itself.
func TestBeginDrainOrder(t *testing.T) {
	dd := &drainDeadline{timeout: time.Hour, fire: func() {}}
	defer dd.finish()
	stopped := make(chan bool, 1) // whether the deadline was set when stop ran
	said, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		beginDrain(dd, func() { stopped <- !dd.deadline().IsZero() }, func() {
			close(said)
			<-release // a log write that blocks
		})
	}()
	defer func() { close(release); <-done }()
	var set bool
	select {
	case set = <-stopped:
	case <-said:
		// stop, had it come first, sent before said was closed.
		select {
		case set = <-stopped:
		default:
			t.Fatal("the log line came before intake ended: a write that blocks would hold up the drain")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("intake not ended")
	}
	if !set {
		t.Fatal("intake ended before the drain's deadline was set")
	}
}

// The deadline fires once, whether the timer or an explicit expire (the
// Shutdown that ran out of time) comes first.
func TestDrainDeadlineFiresOnce(t *testing.T) {
	var fired atomic.Int32
	d := &drainDeadline{timeout: 10 * time.Millisecond, fire: func() { fired.Add(1) }}
	d.start()
	d.start() // a repeated start does not move the deadline or add a timer
	deadline := time.Now().Add(5 * time.Second)
	for fired.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	d.expire()
	d.finish()
	if n := fired.Load(); n != 1 {
		t.Fatalf("fire called %d times, want 1", n)
	}

	fired.Store(0)
	d = &drainDeadline{timeout: time.Hour, fire: func() { fired.Add(1) }}
	d.start()
	d.expire()
	d.expire()
	d.finish()
	if n := fired.Load(); n != 1 {
		t.Fatalf("explicit expire: fire called %d times, want 1", n)
	}
	if !d.wasCut() {
		t.Fatal("wasCut after expire: false")
	}
	d = &drainDeadline{timeout: time.Hour, fire: func() {}}
	d.start()
	if d.finish(); d.wasCut() {
		t.Fatal("wasCut after a drain that finished: true")
	}
}

// The drain's last line claims every event settled only when no ack
// failed or went into a connection that was lost, the server refused no
// publish to $JS.ACK, no dead letter failed (its event nak'ed) nor its
// term, no event
// was left to a replaced stream and no row given up at the end for the
// database's refusal; before, acks a connection refused (counted by the
// sink), then failed dead letters and stale settles, and then acks the
// server refused, did not stop the claim.
func TestLogDrained(t *testing.T) {
	for _, u := range []unsettled{{}, {unconfirmed: 3}, {ackErrors: 5}, {unconfirmed: 3, ackErrors: 5}, {acksRefused: 4}, {deadLetterFailed: 2}, {termErrors: 3}, {stale: 7}, {givenUp: 1}, {released: 4}} {
		var buf bytes.Buffer
		logDrained(slog.New(slog.NewTextHandler(&buf, nil)), u, nil)
		out := buf.String()
		settled := u == (unsettled{})
		if got := strings.Contains(out, "committed and acked"); got != settled {
			t.Errorf("%+v: %q", u, out)
		}
		want := fmt.Sprintf("acks_unconfirmed=%d ack_errors=%d acks_refused=%d dead_letter_failed=%d term_errors=%d stale=%d given_up=%d released=%d",
			u.unconfirmed, u.ackErrors, u.acksRefused, u.deadLetterFailed, u.termErrors, u.stale, u.givenUp, u.released)
		if !settled && (!strings.Contains(out, "level=WARN") || !strings.Contains(out, want)) {
			t.Errorf("%+v: want a warning with %q: %q", u, want, out)
		}
		// The message explains the kinds that occurred, and only those:
		// all seven made a line of about a thousand characters.
		for _, k := range []struct {
			n      uint64
			phrase string
		}{
			{u.ackErrors + u.unconfirmed - u.settled, "acks that failed"}, {u.acksRefused, "for want of permission"},
			{u.deadLetterFailed, "dead letter could not be stored"}, {u.termErrors, "whose term failed"}, {u.stale, "stream replaced"},
			{u.givenUp, "refused at the end"}, {u.released, "while PostgreSQL was unreachable"},
		} {
			if got := strings.Contains(out, k.phrase); got != (k.n > 0) {
				t.Errorf("%+v: %q in the line: %v, want %v: %q", u, k.phrase, got, k.n > 0, out)
			}
		}
	}
	// Acks a lost connection may have taken, which the consumer showed
	// settled at its close (the ack floor past them): the clean line, with
	// their count; not while anything else is unsettled. Before, a
	// connection lost once made every later drain warn of them.
	for _, tc := range []struct {
		u    unsettled
		want string
	}{
		{unsettled{unconfirmed: 1500, settled: 1500}, `level=INFO msg="drained: every event taken in is committed and acked, or dead-lettered" acks_unconfirmed=1500 acks_unconfirmed_settled=1500`},
		{unsettled{unconfirmed: 1500, settled: 1500, ackErrors: 1}, "level=WARN"},
		{unsettled{unconfirmed: 1500}, "level=WARN"},
	} {
		var buf bytes.Buffer
		logDrained(slog.New(slog.NewTextHandler(&buf, nil)), tc.u, &unsettled{unconfirmed: 1500})
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("%+v: want %q: %q", tc.u, tc.want, buf.String())
		}
	}
	// What the run left before the stop is told apart from the stop's.
	// Events given back while PostgreSQL was unreachable are not settled
	// here: before, a drain after a release said that every event was
	// committed and acked, or dead-lettered.
	var buf bytes.Buffer
	logDrained(slog.New(slog.NewTextHandler(&buf, nil)), unsettled{unconfirmed: 698, ackErrors: 2, acksRefused: 9, givenUp: 3, released: 40},
		&unsettled{unconfirmed: 698, acksRefused: 6, givenUp: 1, released: 40})
	if want := "acks_unconfirmed=698 ack_errors=2 acks_refused=9 dead_letter_failed=0 term_errors=0 stale=0 given_up=3 released=40 stop_acks_unconfirmed=0 stop_ack_errors=2 stop_acks_refused=3 stop_dead_letter_failed=0 stop_term_errors=0 stop_stale=0 stop_given_up=2 stop_released=0"; !strings.Contains(buf.String(), want) {
		t.Errorf("want %q: %q", want, buf.String())
	}
}

// A user who may not publish to $JS.ACK: the server drops each ack and
// tells only with an -ERR, so every batch commits and no ack call fails,
// and at the stop NATS confirms the flush. The drain's last line says the
// acks were refused; before, it said every event taken in was committed
// and acked, and exited 0 while every event was to come back after
// ack_wait.
func TestRunDrainTellsOfRefusedAcks(t *testing.T) {
	const events, pass = 20, "no-acks"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	catchSignals(t)
	srv := natsServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir(), Users: []*server.User{{Username: "jetsink", Password: pass,
		Permissions: &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.ACK.>"}}}}}})
	pg := testenv.Postgres(t)
	r := startJetsink(t, ctx, "run", "--nats-url", srv.ClientURL(), "--database-url", pg.URL,
		"--set", "nats.user=jetsink", "--set", "nats.password="+pass,
		"--set", "nats.create_stream=true", "--set", "postgres.create_table=true",
		"--set", "telemetry.listen=127.0.0.1:0")
	r.waitOutput(t, ctx, "jetsink running")
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("jetsink", pass))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range events {
		if _, err := js.Publish(ctx, "events.a", fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	r.waitOutput(t, ctx, "the server refuses jetsink's acks")
	interrupt(t)
	code := r.wait(t, ctx)
	out := r.out.String()
	m := regexp.MustCompile(`acks_refused=(\d+)`).FindStringSubmatch(out)
	if code != exitOK || strings.Contains(out, "every event taken in is committed and acked") || m == nil || m[1] == "0" {
		t.Fatalf("exit %d (%v), want %d and a last line that counts the refused acks (acks_refused):\n%s", code, r.err, exitOK, out)
	}
}

// An expire while the timer's fire is under way returns only after fire
// has: run's check of the drain's end must see what fire did. Before, it
// returned at once, and a drain that timed out could exit 1 instead of 130
// (TestShutdownReportsAcksNATSNeverConfirmed failed so once in CI).
func TestDrainDeadlineExpireWaitsForFire(t *testing.T) {
	d, release, fired := firingDeadline()
	returned := make(chan struct{})
	go func() {
		d.expire()
		close(returned)
	}()
	select {
	case <-returned:
		t.Fatal("expire returned while the timer's fire was under way")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-returned
	if !fired.Load() {
		t.Fatal("expire returned before fire had")
	}
	d.finish()
}

// firingDeadline starts a drainDeadline whose timer fires at once and
// returns while its fire is under way: fire returns once release is
// closed, and sets fired then.
func firingDeadline() (d *drainDeadline, release chan struct{}, fired *atomic.Bool) {
	release, firing := make(chan struct{}), make(chan struct{})
	fired = &atomic.Bool{}
	d = &drainDeadline{timeout: time.Millisecond, fire: func() {
		close(firing)
		<-release
		fired.Store(true)
	}}
	d.start()
	<-firing
	return d, release, fired
}

// finish, while the timer's fire is under way, returns only after fire
// has, and says that the drain was cut: what run reads once it returns
// (hard's cause) is then fire's. Before, finish returned at once, and the
// timer could end a drain that had been declared complete.
func TestDrainDeadlineFinishWaitsForFire(t *testing.T) {
	d, release, fired := firingDeadline()
	returned := make(chan bool)
	go func() { returned <- d.finish() }()
	select {
	case <-returned:
		t.Fatal("finish returned while the timer's fire was under way")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if cut := <-returned; !cut || !fired.Load() {
		t.Fatalf("finish after a fire: cut %v, fire returned %v; want both", cut, fired.Load())
	}

	// A drain that finished first is never cut, by the timer or a signal.
	d = &drainDeadline{timeout: time.Hour, fire: func() { t.Error("fire after finish") }}
	d.start()
	if d.finish() {
		t.Fatal("finish before any cut says the drain was cut")
	}
	if d.cutShort(func() { t.Error("a second signal's cut ran after finish") }) {
		t.Fatal("cutShort after finish reports a cut")
	}
	d.expire()
}

// A drain is over once NATS has confirmed the acks: telemetry shutting down
// after that (here the admin listener, which gives a request in flight 2 s)
// is no longer held to drain_timeout. Before, the deadline was finished
// only after all of Shutdown, so a drain that had committed and acked
// everything in time exited 130, warning that uncommitted events stay
// unacked.
func TestRunDrainEndsWhenAcksAreConfirmed(t *testing.T) {
	const events = 50
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	catchSignals(t)
	ns := testenv.NATS(t)
	pg := testenv.Postgres(t)
	r := startJetsink(t, ctx, "run", "--nats-url", ns.URL(), "--database-url", pg.URL,
		"--set", "nats.create_stream=true", "--set", "postgres.create_table=true",
		"--set", "telemetry.listen=127.0.0.1:0", "--set", "telemetry.pprof=true",
		"--set", "drain_timeout=1900ms") // under the listener's 2 s, with room for a slow drain
	r.waitOutput(t, ctx, "jetsink running")
	js := ns.JetStream(t)
	for i := range events {
		if _, err := js.Publish(ctx, "events.a", fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	conn := pg.Conn(t)
	for rows := 0; rows < events; {
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM events").Scan(&rows); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d rows of %d stored:\n%s", rows, events, r.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}

	// A CPU profile of 30 s, in flight when the drain ends.
	_, profiled := profileInFlight(t, ctx, r)

	interrupt(t)
	code := r.wait(t, ctx)
	<-profiled // cut off by the listener's shutdown
	out := r.out.String()
	if code != exitOK || strings.Contains(out, "drain timeout") || !strings.Contains(out, "every event taken in is committed and acked") {
		t.Fatalf("exit %d (%v), want %d after a clean drain, without a drain timeout:\n%s", code, r.err, exitOK, out)
	}
}

// A second signal after the drain ends the admin listener's grace at
// once: a request in flight (here a 30 s CPU profile) is cut off, not
// given its 2 s. Before, the grace ran its course whatever the signals
// said.
func TestRunSecondSignalCutsTheAdminGrace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	catchSignals(t)
	ns := testenv.NATS(t)
	pg := testenv.Postgres(t)
	r := startJetsink(t, ctx, "run", "--nats-url", ns.URL(), "--database-url", pg.URL,
		"--set", "nats.create_stream=true", "--set", "postgres.create_table=true",
		"--set", "telemetry.listen=127.0.0.1:0", "--set", "telemetry.pprof=true")
	r.waitOutput(t, ctx, "jetsink running")
	addr, profiled := profileInFlight(t, ctx, r)

	interrupt(t)
	// The listener closed: the drain is over, and the grace has begun.
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		_ = c.Close()
		select {
		case <-ctx.Done():
			t.Fatalf("the admin listener still accepts:\n%s", r.out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	r.interruptAgain(t, ctx, "second signal:")
	sent := time.Now()
	code := r.wait(t, ctx)
	took := time.Since(sent)
	<-profiled
	out := r.out.String()
	if code != exitOK || !strings.Contains(out, "second signal: the drain is over") {
		t.Fatalf("exit %d (%v), want %d after a second signal that came once the drain was over:\n%s", code, r.err, exitOK, out)
	}
	// Without the cut, the 2 s grace less the 200 ms or more interruptAgain waits,
	// and the listener logs that the grace ran out ("after 2s cut off").
	// The log line, not the time, decides: the time only shows.
	t.Logf("returned %v after the second signal", took)
	if !strings.Contains(out, "the shutdown cut short") {
		t.Fatalf("jetsink returned %v after the second signal without cutting the admin listener's grace short:\n%s", took, out)
	}
}

// SIGHUP (the terminal closed) drains and stops jetsink as SIGINT does.
// Before, it ended the process at once: no drain, and demo's PostgreSQL
// left running.
func TestRunDrainsOnHangup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	catchSignals(t) // without the fix, jetsink does not stop: no process killed
	ns := testenv.NATS(t)
	pg := testenv.Postgres(t)
	r := startJetsink(t, ctx, "run", "--nats-url", ns.URL(), "--database-url", pg.URL,
		"--set", "nats.create_stream=true", "--set", "postgres.create_table=true",
		"--set", "telemetry.listen=127.0.0.1:0") // not the default port: a running jetsink may hold it
	r.waitOutput(t, ctx, "jetsink running")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	code := r.wait(t, ctx)
	if out := r.out.String(); code != exitOK || !strings.Contains(out, "hangup") {
		t.Fatalf("exit %d (%v), want %d after a drain the hangup began:\n%s", code, r.err, exitOK, out)
	}
}

// nohupChild is set in the process TestStopSignalsUnderNohup starts.
const nohupChild = "JETSINK_TEST_NOHUP_CHILD"

// A SIGHUP jetsink was started ignoring (nohup) stays ignored: catching it
// would have it stop jetsink. The child starts with SIGHUP ignored, as
// nohup starts it; signal.Ignore in this process could not be undone.
func TestStopSignalsUnderNohup(t *testing.T) {
	if os.Getenv(nohupChild) == "1" {
		fmt.Println(slices.Contains(stopSignals(), os.Signal(syscall.SIGHUP)), signal.Ignored(syscall.SIGHUP))
		return
	}
	if !slices.Contains(stopSignals(), os.Signal(syscall.SIGHUP)) && !signal.Ignored(syscall.SIGHUP) {
		t.Error("stopSignals leaves SIGHUP out")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `trap "" HUP; exec "$0" -test.run='^TestStopSignalsUnderNohup$'`, exe)
	cmd.Env = append(os.Environ(), nohupChild+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if first, _, _ := strings.Cut(string(out), "\n"); first != "false true" {
		t.Fatalf("child started ignoring SIGHUP: caught by stopSignals, ignored = %q; want \"false true\"", first)
	}
}

// goroutines is the stack of every goroutine of the test binary.
func goroutines() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// A stage's failure followed by a cut (a second signal, drain_timeout) is
// reported with both errors, and exits 130 as a cut does. Before, only the
// cut was: "aborted by a second signal", never the consumer's error.
func TestRunResultKeepsTheStageErrorOfACutDrain(t *testing.T) {
	stage := fmt.Errorf("consumer: %w", errors.New("nats: connection closed"))
	cut := fmt.Errorf("%w by a second signal (interrupt)", errAborted)
	for _, tc := range []struct {
		name               string
		err, cut, closeErr error
		want               []error
		code               int
	}{
		{"stage failed, then a cut", stage, cut, nil, []error{stage, cut}, exitAborted},
		{"cut only", nil, cut, nil, []error{cut}, exitAborted},
		{"a stage ended by the cut", fmt.Errorf("pipeline: %w", context.Canceled), cut, nil, []error{cut}, exitAborted},
		{"Run returned the cut", cut, cut, nil, []error{cut}, exitAborted},
		{"stage failed", stage, nil, errors.New("acks unconfirmed"), []error{stage}, exitFailed},
		{"acks unconfirmed", nil, nil, errors.New("acks unconfirmed"), nil, exitFailed},
		{"clean", nil, nil, nil, nil, exitOK},
	} {
		got := runResult(tc.err, tc.cut, tc.closeErr)
		for _, w := range tc.want {
			if !errors.Is(got, w) {
				t.Errorf("%s: %v does not hold %v", tc.name, got, w)
			}
		}
		if got != nil && strings.Count(got.Error(), "aborted") > 1 {
			t.Errorf("%s: the cut is reported twice: %v", tc.name, got)
		}
		if code := exitCode(got); code != tc.code {
			t.Errorf("%s: exit %d, want %d", tc.name, code, tc.code)
		}
	}
}

// profileInFlight asks the admin listener of r for a CPU profile of 30 s
// and returns once its handler runs: the listener's address, and where
// the request's end (cut off by the listener's shutdown) comes.
func profileInFlight(t *testing.T, ctx context.Context, r *jetsinkRun) (string, <-chan error) {
	t.Helper()
	m := regexp.MustCompile(`"admin listener" addr=(\S+)`).FindStringSubmatch(r.out.String())
	if m == nil {
		t.Fatalf("no admin listener address in the output:\n%s", r.out.String())
	}
	profiled := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m[1]+"/debug/pprof/profile?seconds=30", nil)
		if err != nil {
			profiled <- err
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		profiled <- err
	}()
	for !strings.Contains(goroutines(), "net/http/pprof.Profile(") {
		select {
		case <-ctx.Done():
			t.Fatal("the profile request never reached its handler")
		case <-time.After(10 * time.Millisecond):
		}
	}
	return m[1], profiled
}

// With log.format json every line run writes is a JSON object, the last
// saying why it exited (a NATS refusal at start, exit 1), and durations
// are written as in the text log. Before, the reason was a line of text
// (two, for pgx's errors), which a pipeline parsing each line as JSON
// dropped: the one line an operator of a crash-looping jetsink looks for.
func TestRunLogsItsExitAsJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := natsServer(t, &server.Options{JetStream: true, StoreDir: t.TempDir(), Users: []*server.User{{Username: "jetsink", Password: "right"}}})
	pg := testenv.Postgres(t)
	r := startJetsink(t, ctx, "run", "--nats-url", srv.ClientURL(), "--database-url", pg.URL,
		"--set", "nats.user=jetsink", "--set", "nats.password=wrong", "--set", "log.format=json",
		"--set", "telemetry.listen=127.0.0.1:0")
	code := r.wait(t, ctx)
	out := strings.TrimSpace(r.out.String())
	lines := strings.Split(out, "\n")
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Errorf("a line that is not JSON: %q", l)
		}
	}
	var last struct {
		Level, Msg, Err string
		ExitCode        int `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || code != exitFailed ||
		last.Level != "ERROR" || last.Msg != "exiting" || last.ExitCode != exitFailed || !strings.Contains(last.Err, "nats") {
		t.Fatalf("exit %d, last line %+v (%v); want exit %d and an ERROR record \"exiting\" naming the NATS failure:\n%s", code, last, err, exitFailed, out)
	}
}

// Durations in a JSON log read as in the text log, not as nanoseconds
// under a key that names no unit.
func TestJSONLogWritesDurationsAsText(t *testing.T) {
	var buf bytes.Buffer
	cfg := config.Default()
	cfg.Log.Format = "json"
	newLogger(cfg, &buf).Info("x", "retry_in", time.Minute, slog.Group("g", "away_for", 17134*time.Millisecond))
	if want := `"retry_in":"1m0s","g":{"away_for":"17.134s"}`; !strings.Contains(buf.String(), want) {
		t.Fatalf("want %s in %s", want, buf.String())
	}
}

// run logs the "cpu" line at its start, before it connects (so also when
// start-up fails), with the keys jetsink bench's report reads (gomaxprocs,
// cpu_quota): before, the report said "not logged: cpu_quota" for every
// figure, and nothing said what CPU quota GOMAXPROCS had followed.
func TestRunLogsTheCPULine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := startJetsink(t, ctx, "run", "--nats-url", "nats://127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/x",
		"--set", "log.format=json", "--set", "telemetry.listen=127.0.0.1:0")
	if code := r.wait(t, ctx); code != exitFailed {
		t.Fatalf("exit %d, want %d (no NATS there):\n%s", code, exitFailed, r.out.String())
	}
	want, err := readCPUQuota("/")
	if err != nil {
		t.Logf("this machine's CPU quota is not read (%v): want none", err)
	}
	var cpu []map[string]any
	for l := range strings.Lines(r.out.String()) {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "cpu" {
			cpu = append(cpu, rec)
		}
	}
	if len(cpu) != 1 || cpu[0]["level"] != "INFO" || cpu[0]["gomaxprocs"] != float64(runtime.GOMAXPROCS(0)) ||
		cpu[0]["cpu_quota"] != want.String() || cpu[0]["numcpu"] != float64(runtime.NumCPU()) {
		t.Fatalf("cpu records %v; want one at INFO with gomaxprocs %d, cpu_quota %q, numcpu %d:\n%s",
			cpu, runtime.GOMAXPROCS(0), want, runtime.NumCPU(), r.out.String())
	}
}

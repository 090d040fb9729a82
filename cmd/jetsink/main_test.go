package main

import (
	"context"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// catchSignals keeps SIGINT and SIGTERM, which the test sends to its own
// process, from ending the test binary while the code under test is not
// catching them (before it starts, after it stops, or old code that never
// does).
func catchSignals(t *testing.T) {
	t.Helper()
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	t.Cleanup(func() { signal.Stop(ch) })
}

func interrupt(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
}

// interruptAgain sends a second SIGINT, once it can no longer be taken for
// a repeat of the first (repeatWindow after the first was handled, which
// the caller has seen), and again every 2*repeatWindow until the output
// has want, the second signal's line: the window runs from the end of the
// first signal's handler, which a loaded machine may reach well after the
// line the caller saw. The caller catches signals (catchSignals), so one
// more SIGINT after the second is harmless.
func (r *jetsinkRun) interruptAgain(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	tick := time.NewTicker(2 * repeatWindow)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			t.Fatalf("no %q in the output after a second SIGINT:\n%s", want, r.out.String())
		case <-r.done:
			return // the caller's wait says whether it should have
		case <-tick.C:
		}
		if strings.Contains(r.out.String(), want) {
			return
		}
		interrupt(t)
	}
}

// jetsinkRun is a command line running in this process.
type jetsinkRun struct {
	out  testenv.SyncBuffer // stdout and stderr
	done chan struct{}
	err  error
}

// startJetsink runs jetsink with args in this process until it returns.
func startJetsink(t *testing.T, ctx context.Context, args ...string) *jetsinkRun {
	t.Helper()
	t.Setenv("JETSINK_CONFIG", "")
	r := &jetsinkRun{done: make(chan struct{})}
	root := newRoot()
	if args == nil {
		args = []string{} // nil makes cobra read os.Args, the test binary's flags
	}
	root.SetArgs(args)
	root.SetOut(&r.out)
	root.SetErr(&r.out)
	go func() {
		defer close(r.done)
		r.err = execute(ctx, root)
	}()
	t.Cleanup(func() { <-r.done })
	return r
}

// waitOutput polls until the output holds want.
func (r *jetsinkRun) waitOutput(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(r.out.String(), want) {
		select {
		case <-ctx.Done():
			t.Fatalf("no %q in the output:\n%s", want, r.out.String())
		case <-r.done:
			if !strings.Contains(r.out.String(), want) {
				t.Fatalf("jetsink returned (%v) without %q in the output:\n%s", r.err, want, r.out.String())
			}
			return
		case <-tick.C:
		}
	}
}

// wait waits for the command to return and gives its exit status.
func (r *jetsinkRun) wait(t *testing.T, ctx context.Context) int {
	t.Helper()
	select {
	case <-r.done:
		return exitCode(r.err)
	case <-ctx.Done():
		t.Fatalf("jetsink did not return:\n%s", r.out.String())
		return -1
	}
}

// A command line jetsink cannot take exits with exitConfig, as a bad flag
// does, whatever part of it is wrong; a bare command that groups others
// prints its help and succeeds.
func TestBadCommandLineExitCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args []string
		want int
		say  string
	}{
		{[]string{"frobnicate"}, exitConfig, `unknown command "frobnicate" for "jetsink"`},
		{[]string{"rnu"}, exitConfig, `unknown command "rnu" for "jetsink"; did you mean run?`},
		{[]string{"rnu", "--help"}, exitConfig, `unknown command "rnu" for "jetsink"; did you mean run?`},
		// A flag's value after a space, not "=": the argument is not
		// quoted past its first character that no command holds.
		{[]string{"run", "--set", "postgres.url", "postgres://u:pw@db/x"}, exitConfig, `jetsink run takes no arguments, and 1 given (--set takes key=value`},
		{[]string{"run", "--set", "nats.password", "u:pw@"}, exitConfig, `jetsink run takes no arguments, and 1 given`},
		{[]string{"postgres://u:pw@db/x"}, exitConfig, `unknown command "postgres..." for "jetsink"`},
		{[]string{"rnu", "--config", "x.yaml"}, exitConfig, `unknown command "rnu" for "jetsink"`},
		{[]string{"dlq", "replya", "--dry-run"}, exitConfig, `unknown command "replya" for "jetsink dlq"; did you mean replay?`},
		{[]string{"--no-such-flag"}, exitConfig, "unknown flag: --no-such-flag"},
		{[]string{"dlq", "--no-such-flag"}, exitConfig, "unknown flag: --no-such-flag"},
		{[]string{"dlq", "list"}, exitConfig, `unknown command "list" for "jetsink dlq"; 'jetsink dlq replay --dry-run' lists the dead letters and replays none ('jetsink dlq --help' lists the commands)`},
		{[]string{"run", "extra"}, exitConfig, `jetsink run takes no arguments, and 1 given`},
		{[]string{"keys", "--no-such-flag"}, exitConfig, "unknown flag"},
		{[]string{"bench", "--lock-at", "10s"}, exitConfig, "--lock-at needs --lock-for"},
		{[]string{"dlq", "replay", "--stream", "X"}, exitConfig, "unknown flag: --stream"},
		{[]string{"dlq", "replay", "--stage", "decoder"}, exitConfig, `stage "decoder"`},
		{[]string{"dlq"}, exitOK, "jetsink dlq [command]"},
		{nil, exitOK, "Available Commands"},
		{[]string{"help", "run"}, exitOK, "jetsink run [flags]"},
		{[]string{"help", "dlq", "replay"}, exitOK, "jetsink dlq replay [flags]"},
		{[]string{"help", "nosuch"}, exitConfig, `unknown command "nosuch" for "jetsink"`},
		{[]string{"help", "rnu"}, exitConfig, "did you mean run?"},
		{[]string{"help", "dlq", "nosuch"}, exitConfig, `unknown command "nosuch" for "jetsink dlq"`},
		{[]string{"completion", "bash", "extra"}, exitConfig, `jetsink completion bash takes no arguments, and 1 given`},
		{[]string{"completion", "tcsh"}, exitConfig, `unknown command "tcsh" for "jetsink completion"`},
		// One dash, as Go's flag package takes a long flag; three: pflag
		// quotes the whole argument, value and all.
		{[]string{"run", "-database-url=postgres://u:pw@db/x"}, exitConfig, `unknown shorthand flag: "d" in -database-url... (long flags take two dashes`},
		{[]string{"run", "---database-url=postgres://u:pw@db/x"}, exitConfig, "bad flag syntax: ---database-url..."},
	} {
		r := startJetsink(t, ctx, tc.args...)
		code := r.wait(t, ctx)
		msg := r.out.String()
		if r.err != nil {
			msg += r.err.Error()
		}
		if code != tc.want || !strings.Contains(msg, tc.say) {
			t.Errorf("jetsink %s: exit %d, want %d with %q in:\n%s", strings.Join(tc.args, " "), code, tc.want, tc.say, msg)
		}
		if strings.Contains(msg, "u:pw@") {
			t.Errorf("jetsink %s: the password is in:\n%s", strings.Join(tc.args, " "), msg)
		}
	}
}

func TestVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := startJetsink(t, ctx, "--version")
	if code := r.wait(t, ctx); code != 0 || !regexp.MustCompile(`^jetsink \S.*, go1\.\d+`).MatchString(r.out.String()) {
		t.Fatalf("jetsink --version: exit %d, %q", code, r.out.String())
	}
}

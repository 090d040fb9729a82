package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetsink/jetsink/bench"
)

// --set and --matrix go to the jetsink subprocess only: the keys the bench
// sets itself are usage errors that say what to use, before any server
// starts, and a URL's password is not repeated.
func TestBenchRejectsKeysItOwns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args []string
		say  string
	}{
		{[]string{"--set", "postgres.url=postgres://u:s3cret@db/x"}, "--set postgres.url: the bench sets this key itself (--set goes to jetsink only): use --database-url"},
		{[]string{"--set", "nats.url=nats://h:4222"}, "use --nats-url"},
		{[]string{"--set", "pipeline.workers=2", "--set", " nats.stream =S"}, "--set nats.stream: the bench sets this key itself"},
		{[]string{"--set", "postgres.table=t"}, "a table of its own"},
		{[]string{"--set", "nats.consumer=c"}, "durable consumer"},
		{[]string{"--matrix", "postgres.table=a,b"}, "--matrix postgres.table: the bench sets this key itself"},
		{[]string{"--matrix", "env:JETSINK_POSTGRES_URL=postgres://u:s3cret@db/x"}, "--matrix postgres.url: the bench sets this key itself"},
		{[]string{"--matrix", "env:JETSINK_DATABASE_URL=postgres://u:s3cret@db/x"}, "--matrix postgres.url: the bench sets this key itself"},
		{[]string{"--matrix", "env:JETSINK_NATS_STREAM=A,B"}, "--matrix nats.stream: the bench sets this key itself"},
		{[]string{"--set", "nats.domain=hub"}, "--set nats.domain: the bench sets this key itself"},
		{[]string{"--set", "nats.stream_duplicate_window=10s"}, "--set nats.stream_duplicate_window: the bench sets this key itself (--set goes to jetsink only): use --duplicate-window"},
		{[]string{"--matrix", "nats.stream_max_age=1m,1h"}, "--matrix nats.stream_max_age: the bench sets this key itself"},
	} {
		r := startJetsink(t, ctx, append([]string{"bench", "-q"}, tc.args...)...)
		code := r.wait(t, ctx)
		msg := r.out.String()
		if r.err != nil {
			msg += r.err.Error()
		}
		if code != exitConfig || !strings.Contains(msg, tc.say) || strings.Contains(msg, "s3cret") || strings.Contains(msg, "embedded NATS") {
			t.Errorf("bench %v: exit %d, want %d with %q in:\n%s", tc.args, code, exitConfig, tc.say, msg)
		}
	}
	// From the environment (or --config) too: the bench would make its
	// stream in one JetStream and jetsink its own in the domain's.
	t.Setenv("JETSINK_NATS_DOMAIN", "hub")
	r := startJetsink(t, ctx, "bench", "-q")
	if code := r.wait(t, ctx); code != exitConfig || !strings.Contains(r.out.String()+fmt.Sprint(r.err), `nats.domain "hub": the bench and its engines use the JetStream`) {
		t.Errorf("bench with JETSINK_NATS_DOMAIN: exit %d, want %d naming nats.domain in:\n%s%v", code, exitConfig, r.out.String(), r.err)
	}
}

// A --set or --matrix value (or key) that jetsink would refuse is a
// configuration error, exit 2 with the loader's words, before any server
// starts: not an exit 1 from the jetsink subprocess after the preload.
func TestBenchChecksTheEnginesConfigurationFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		args []string
		say  string
	}{
		{[]string{"--set", "pipeline.wokers=2"}, "--set pipeline.wokers: no such key (did you mean pipeline.workers?)"},
		{[]string{"--matrix", "pipeline.workers=1,x"}, "jetsink's configuration [pipeline.workers=x]: "},
		{[]string{"--matrix", "env:JETSINK_PIPELINE_WORKERS=1,-1"}, "pipeline.workers is -1"},
		{[]string{"--event-bytes", "2000000"}, "--event-bytes 2000000 does not fit the embedded nats-server's max_payload"},
		{[]string{"--duplicate-window", "1600ms"}, "--duplicate-window 1.6s leaves the publisher a PubAck wait of 20ms"},
	} {
		r := startJetsink(t, ctx, append([]string{"bench", "-q", "--events", "100"}, tc.args...)...)
		code := r.wait(t, ctx)
		msg := r.out.String() + fmt.Sprint(r.err)
		if code != exitConfig || !strings.Contains(msg, tc.say) || strings.Contains(msg, "embedded NATS") {
			t.Errorf("bench %v: exit %d, want %d with %q in:\n%s", tc.args, code, exitConfig, tc.say, msg)
		}
	}
}

// A flag of the other scenario would be ignored: refused, exit 2, before
// anything connects (the NATS URL here answers nothing); so is --log-level,
// which the engines do not take.
func TestBenchRefusesFlagsItWouldIgnore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		args []string
		say  string
	}{
		{[]string{"--rate", "100"}, "--rate applies to --scenario rate only, and this is --scenario drain"},
		{[]string{"--scenario", "drain", "--duration", "5s"}, "--duration applies to --scenario rate only"},
		{[]string{"--scenario", "drain", "--lock-for", "5s"}, "--lock-for applies to --scenario rate only"},
		{[]string{"--scenario", "rate", "--events", "100"}, "--events applies to --scenario drain only, and this is --scenario rate"},
		{[]string{"--events", "100", "--log-level", "debug"}, "--log-level: the bench logs nothing of its own"},
	} {
		r := startJetsink(t, ctx, append([]string{"bench", "-q", "--nats-url", "nats://127.0.0.1:1"}, tc.args...)...)
		code := r.wait(t, ctx)
		msg := r.out.String() + fmt.Sprint(r.err)
		if code != exitConfig || !strings.Contains(msg, tc.say) {
			t.Errorf("bench %v: exit %d, want %d with %q in:\n%s", tc.args, code, exitConfig, tc.say, msg)
		}
	}
}

// fullDisk is stdout on a full disk: a write takes part of what it is
// given, then fails.
type fullDisk struct{ took int }

func (w *fullDisk) Write(p []byte) (int, error) {
	n := min(len(p), 16)
	w.took += n
	return n, &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.ENOSPC}
}

// A report that could not be written whole (jetsink bench --json > FILE
// on a full disk) fails the bench, saying so, as JSON and as text, and
// beside the run's own failure; a report written whole leaves the run's
// error as it was.
func TestBenchReportWriteFailure(t *testing.T) {
	rep := &bench.Report{Scenario: bench.ScenarioDrain, Events: 10, Subjects: 1}
	lost := fmt.Errorf("bench: 2 events lost")
	for _, tc := range []struct {
		json   bool
		runErr error
	}{{true, nil}, {false, nil}, {true, lost}} {
		w := &fullDisk{}
		err := writeReport(w, rep, tc.runErr, tc.json, "")
		if w.took == 0 {
			t.Fatalf("json %v: nothing written", tc.json)
		}
		if code := exitCode(err); code != exitFailed || !strings.Contains(fmt.Sprint(err), "could not write the report") ||
			!errors.Is(err, syscall.ENOSPC) {
			t.Errorf("json %v, run error %v: exit %d, %v; want %d, saying the report could not be written (ENOSPC)",
				tc.json, tc.runErr, code, err, exitFailed)
		}
		if tc.runErr != nil && !errors.Is(err, tc.runErr) {
			t.Errorf("the run's error lost behind the report's: %v", err)
		}
	}
	var out strings.Builder
	if err := writeReport(&out, rep, lost, true, ""); err != lost || !strings.Contains(out.String(), `"scenario": "drain"`) {
		t.Errorf("report written: %v, want the run's error as it was; output:\n%s", err, out.String())
	}
	if err := writeReport(&out, nil, lost, false, ""); err != lost {
		t.Errorf("no report: %v, want the run's error", err)
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetsink/jetsink/bench"
	"github.com/jetsink/jetsink/config"
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
		{[]string{"--duplicate-window", "3s"}, "--duplicate-window 3s leaves the publisher a PubAck wait of 240ms"},
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
// which the engines do not take, and a --count below 1 (bench.Options
// takes 0 for 1).
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
		{[]string{"--events", "100", "--count", "0"}, "--count 0: at least 1 repetition"},
		{[]string{"--events", "100", "--count", "-1"}, "--count -1: at least 1 repetition"},
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

// A server given from any source (flag, variable, the config file) turns
// the embedded servers off: one without the other is refused, exit 2,
// naming the setting and what to unset, before anything connects (a
// JETSINK_DATABASE_URL exported for "jetsink run" sent the bench to the
// default NATS server); both are announced on stderr, with the settings
// that give them and without their passwords.
func TestBenchSaysWhichSettingsGiveTheServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	file := filepath.Join(t.TempDir(), "jetsink.yaml")
	if err := os.WriteFile(file, []byte("postgres:\n  url: postgres://u:s3cret@127.0.0.1:1/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		say  []string
	}{
		{[]string{"JETSINK_DATABASE_URL=postgres://u:s3cret@127.0.0.1:1/x"}, nil, exitConfig,
			[]string{"JETSINK_DATABASE_URL gives the PostgreSQL server and nothing gives the NATS one", "--nats-url, JETSINK_NATS_URL or nats.url", "(unset JETSINK_DATABASE_URL)"}},
		{[]string{"JETSINK_POSTGRES_URL=postgres://u:s3cret@127.0.0.1:1/x"}, nil, exitConfig,
			[]string{"JETSINK_POSTGRES_URL gives the PostgreSQL server", "(unset JETSINK_POSTGRES_URL)"}},
		{[]string{"JETSINK_NATS_URL=nats://u:s3cret@127.0.0.1:1"}, nil, exitConfig,
			[]string{"JETSINK_NATS_URL gives the NATS server and nothing gives the PostgreSQL one", "--database-url, JETSINK_DATABASE_URL or postgres.url", "(unset JETSINK_NATS_URL)"}},
		{nil, []string{"--database-url", "postgres://u:s3cret@127.0.0.1:1/x"}, exitConfig,
			[]string{"--database-url gives the PostgreSQL server", "(drop --database-url)"}},
		{nil, []string{"--config", file}, exitConfig,
			[]string{"postgres.url at line 2 of " + file + " gives the PostgreSQL server", "(drop --config " + file + ")"}},
		{[]string{"JETSINK_NATS_URL=nats://u:s3cret@127.0.0.1:1"}, []string{"--config", file}, exitFailed,
			[]string{"jetsink: bench: --config " + file + ": against your servers, not embedded ones, creating and dropping its BENCH_* streams",
				"NATS nats://127.0.0.1:1 from JETSINK_NATS_URL, PostgreSQL postgres://127.0.0.1:1 from postgres.url at line 2 of " + file,
				"unset JETSINK_NATS_URL and drop --config " + file + " for the embedded ones", "nats.url nats://127.0.0.1:1"}},
		// A comma in the password: the URL was cut there, before its user.
		{[]string{"JETSINK_NATS_URL=nats://127.0.0.1:1"}, []string{"--database-url", "postgres://u:s3cret,x@127.0.0.1:1/x"}, exitFailed,
			[]string{"PostgreSQL postgres://127.0.0.1:1 from --database-url;"}},
		{[]string{"JETSINK_DATABASE_URL=postgres://u:s3cret@127.0.0.1:1/x"}, []string{"--nats-url", "nats://u:s3cret@127.0.0.1:1"}, exitFailed,
			[]string{"NATS nats://127.0.0.1:1 from --nats-url, PostgreSQL postgres://127.0.0.1:1 from JETSINK_DATABASE_URL; drop --nats-url and unset JETSINK_DATABASE_URL for the embedded ones"}},
	} {
		t.Run(strings.Join(append(append([]string(nil), tc.env...), tc.args...), " "), func(t *testing.T) {
			for _, kv := range tc.env {
				name, value, _ := strings.Cut(kv, "=")
				t.Setenv(name, value)
			}
			r := startJetsink(t, ctx, append([]string{"bench", "-q", "--events", "10"}, tc.args...)...)
			code := r.wait(t, ctx)
			msg := r.out.String() + fmt.Sprint(r.err)
			if code != tc.code || strings.Contains(msg, "s3cret") || strings.Contains(msg, "embedded NATS") {
				t.Errorf("exit %d, want %d, without the password or embedded servers, in:\n%s", code, tc.code, msg)
			}
			for _, s := range tc.say {
				if !strings.Contains(msg, s) {
					t.Errorf("no %q in:\n%s", s, msg)
				}
			}
		})
	}
	// A file from JETSINK_CONFIG (which startJetsink clears) that sets
	// neither server: jetsink's defaults, said so.
	var out strings.Builder
	embedded, err := benchServers(&out, config.Default(), map[string]string{"pipeline.workers": "line 1 of j.yaml"}, "j.yaml", false)
	if want := "jetsink: bench: JETSINK_CONFIG=j.yaml: against your servers, not embedded ones, creating and dropping its BENCH_* streams and bench* tables there: " +
		"NATS nats://127.0.0.1:4222 (the default), PostgreSQL postgres://127.0.0.1:5432 (the default); unset JETSINK_CONFIG for the embedded ones\n"; embedded || err != nil || out.String() != want {
		t.Errorf("JETSINK_CONFIG setting no server: embedded %v, %v, said\n%s\nwant\n%s", embedded, err, out.String(), want)
	}
	var help strings.Builder
	root := newRoot()
	root.SetArgs([]string{"bench", "--help"})
	root.SetOut(&help)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"JETSINK_NATS_URL", "JETSINK_DATABASE_URL", "JETSINK_POSTGRES_URL", "JETSINK_CONFIG"} {
		if !strings.Contains(help.String(), v) {
			t.Errorf("bench --help does not name %s:\n%s", v, help.String())
		}
	}
}

// pgServerOf names a PostgreSQL server as pgx reads the connection string,
// never with its user or password.
func TestPgServerOf(t *testing.T) {
	t.Setenv("PGHOST", "") // pgx takes a missing host or port from these
	t.Setenv("PGPORT", "")
	for conn, want := range map[string]string{
		"postgres://u:x@s3cret@h1:5432/db":             "postgres://h1:5432", // refused by validation first
		"postgres://u:p,ss@h1:5432/db":                 "postgres://h1:5432",
		"postgres://u:p@h1:5432,h2:5433/db":            "postgres://h1:5432,h2:5433",
		"postgresql://u:p%40x@h1/db?sslmode=prefer":    "postgres://h1:5432",
		"host = db1 port = 6543 user=u password='a,b'": "postgres://db1:6543",
	} {
		if got := pgServerOf(conn); got != want {
			t.Errorf("pgServerOf(%q) = %q, want %q", conn, got, want)
		}
	}
}

package tests

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// jetsinkCmd runs the binary and returns its combined output and exit code.
func jetsinkCmd(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	bin := testenv.Jetsink(t) // the first call builds it: not on the command's clock
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	testenv.DieWithTest(cmd)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	default:
		t.Fatalf("jetsink %v: %v\n%s", args, err, out)
		return "", -1
	}
}

func TestCLIHelpEverywhere(t *testing.T) {
	for _, sub := range []string{"", "run", "check", "init", "publish", "demo", "keys", "healthcheck", "bench", "dlq", "dlq replay"} {
		args := append(strings.Fields(sub), "--help")
		out, code := jetsinkCmd(t, nil, args...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("jetsink %s --help: exit %d\n%s", sub, code, out)
		}
	}
}

func TestCLIBadConfigNamesTheKey(t *testing.T) {
	out, code := jetsinkCmd(t, []string{"JETSINK_POSTGRES_BATCH_MAX_ROWS=0"}, "check")
	if code != 2 || !strings.Contains(out, "max_rows") {
		t.Fatalf("exit %d, want 2 naming max_rows:\n%s", code, out)
	}
	// Tracing settings run refuses with exit 2 (read from OTEL_* when it
	// sets tracing up), check refuses too, before it connects anywhere.
	for _, env := range [][]string{
		{"JETSINK_TELEMETRY_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_HEADERS=garbage"},
		{"JETSINK_TELEMETRY_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER=jaeger_remote"},
		// The resource labels the metrics too (target_info): run refuses
		// a bad one with tracing off.
		{"OTEL_RESOURCE_ATTRIBUTES=team=a,oops"},
	} {
		if out, code = jetsinkCmd(t, env, "check"); code != 2 || !strings.Contains(out, "OTEL_") {
			t.Errorf("%v: exit %d, want 2 naming the variable:\n%s", env, code, out)
		}
	}
	out, code = jetsinkCmd(t, nil, "run", "--set", "postgres.tabel=x")
	if code != 2 || !strings.Contains(out, "postgres.tabel") {
		t.Fatalf("exit %d, want 2 naming postgres.tabel:\n%s", code, out)
	}
}

func TestCLIInitAndCheck(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfgPath := e.writeConfig(sink.ExactlyOnce)
	noCreate := []string{"JETSINK_POSTGRES_CREATE_TABLE=false"}

	// Nothing exists yet: check says what to fix and fails, and creates
	// nothing, not even with create_table.
	out, code := jetsinkCmd(t, noCreate, "check", "--config", cfgPath)
	if code != 1 || !strings.Contains(out, "stream "+e.stream+" does not exist") ||
		!strings.Contains(out, "table "+pgx.Identifier{e.table}.Sanitize()+" does not exist") {
		t.Fatalf("check before setup: exit %d\n%s", code, out)
	}
	// The stream is what fails it; the table, which run makes, is a
	// warning that asks for nothing.
	out, code = jetsinkCmd(t, []string{"JETSINK_POSTGRES_CREATE_TABLE=true"}, "check", "--config", cfgPath)
	if code != 1 || !strings.Contains(out, "postgres: warning: table") || !strings.Contains(out, "none needed: run makes it") {
		t.Fatalf("check before setup with create_table: exit %d, want 1 and the table as a warning that needs nothing\n%s", code, out)
	}
	var exists bool
	if err := e.db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", e.table).Scan(&exists); err != nil || exists {
		t.Fatalf("check created the table (%v)", err)
	}

	out, code = jetsinkCmd(t, nil, "init", "--config", cfgPath, "--print")
	if code != 0 || !strings.Contains(out, "CREATE TABLE IF NOT EXISTS") || !strings.Contains(out, "CREATE UNIQUE INDEX") {
		t.Fatalf("init --print: exit %d\n%s", code, out)
	}
	if err := e.db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", e.table).Scan(&exists); err != nil || exists {
		t.Fatalf("init --print created the table (%v)", err)
	}
	if out, code = jetsinkCmd(t, nil, "init", "--config", cfgPath); code != 0 {
		t.Fatalf("init: exit %d\n%s", code, out)
	}
	e.createStreams(ctx)
	out, code = jetsinkCmd(t, noCreate, "check", "--config", cfgPath)
	// The ok line names the table check found and run will write, by its
	// schema-qualified name (an unqualified table is looked up on search_path).
	if code != 0 || !strings.Contains(out, `postgres: ok (table "public".`) {
		t.Fatalf("check after init: exit %d\n%s", code, out)
	}
	// Settings run refuses once it sees the server, or cannot read: exit
	// 2, a bad configuration, as run's.
	for _, bad := range []struct{ env, key string }{
		{"JETSINK_NATS_PULL_MAX_BYTES=1000", "nats.pull_max_bytes"},
		{"JETSINK_NATS_NKEY_FILE=" + filepath.Join(t.TempDir(), "missing.nk"), "missing.nk"},
	} {
		if out, code = jetsinkCmd(t, append([]string{bad.env}, noCreate...), "check", "--config", cfgPath); code != 2 || !strings.Contains(out, bad.key) {
			t.Errorf("check with %s: exit %d, want 2 naming %s\n%s", bad.env, code, bad.key, out)
		}
	}

	// An existing table without exactly-once's unique index: a problem,
	// unless create_table will add the index.
	var index string
	if err := e.db.QueryRow(ctx, `SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = $1::regclass AND indisunique`, e.table).Scan(&index); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, "DROP INDEX "+index); err != nil {
		t.Fatal(err)
	}
	if out, code = jetsinkCmd(t, noCreate, "check", "--config", cfgPath); code != 1 || !strings.Contains(out, "needs a unique index") {
		t.Fatalf("check without the unique index: exit %d\n%s", code, out)
	}
	if out, code = jetsinkCmd(t, []string{"JETSINK_POSTGRES_CREATE_TABLE=true"}, "check", "--config", cfgPath); code != 0 || !strings.Contains(out, "needs a unique index") {
		t.Fatalf("check without the unique index, with create_table: exit %d, want 0 with a warning\n%s", code, out)
	}
	if out, code = jetsinkCmd(t, nil, "init", "--config", cfgPath); code != 0 {
		t.Fatalf("init: exit %d\n%s", code, out)
	}

	// Rows stored past the stream's last sequence: the stream was deleted
	// and re-created, and exactly-once would skip its events.
	if _, err := e.db.Exec(ctx, `INSERT INTO `+e.table+` (id, ts, stream, stream_seq) VALUES (gen_random_uuid(), now(), $1, 500)`, e.stream); err != nil {
		t.Fatal(err)
	}
	out, code = jetsinkCmd(t, noCreate, "check", "--config", cfgPath)
	if code != 1 || !strings.Contains(out, "stream sequence restarted") || !strings.Contains(out, "first_seq 501") {
		t.Fatalf("check with rows past the stream's sequence: exit %d\n%s", code, out)
	}
	if _, err := e.db.Exec(ctx, `TRUNCATE `+e.table); err != nil {
		t.Fatal(err)
	}

	// A column whose type no longer matches is named.
	if _, err := e.db.Exec(ctx, `ALTER TABLE `+e.table+` ALTER COLUMN value TYPE text`); err != nil {
		t.Fatal(err)
	}
	out, code = jetsinkCmd(t, noCreate, "check", "--config", cfgPath)
	if code != 1 || !strings.Contains(out, `column "value"`) {
		t.Fatalf("check with a wrong column type: exit %d\n%s", code, out)
	}
	t.Logf("check output:\n%s", out)
}

// A second signal while jetsink is still connecting (here NATS and
// PostgreSQL are one address that accepts and never answers: the sink's
// first look at PostgreSQL goes on in the background, the NATS connect
// holds up start-up) exits with 130 and says it was aborted, as during a
// drain, once the connect under way gives up; it exited 1 with the
// connect's error before.
func TestCLISecondSignalWhileConnectingAborts(t *testing.T) {
	bin := testenv.Jetsink(t)
	addr, accepted := testenv.SilentServer(t) // each connection held: nothing is read or answered
	cmd := exec.Command(bin, "run", "--nats-url", "nats://"+addr, "--database-url", "postgres://jetsink@"+addr+"/db?sslmode=disable",
		"--set", "nats.stream=S", "--set", "nats.create_stream=true", "--set", "nats.subjects=s.>",
		"--set", "telemetry.listen=127.0.0.1:0") // not the default port: a running jetsink may hold it
	testenv.DieWithTest(cmd)
	cmd.Env = append(os.Environ(), "JETSINK_CONFIG=")
	var out testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		done <- cmd.Wait()
		close(exited)
	}()
	defer func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	select {
	case <-accepted:
	case err := <-done:
		t.Fatalf("jetsink exited (%v) before connecting:\n%s", err, out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("jetsink did not connect within 30 s:\n%s", out.String())
	}
	for i := range 2 {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); i == 0 && !strings.Contains(out.String(), "still starting up"); {
			if time.Now().After(deadline) { // the first signal stops the start-up: handled alone
				t.Fatalf("no stop after the first signal:\n%s", out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if i == 0 {
			time.Sleep(repeatGap)
		}
	}
	select {
	case err := <-done:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 130 || !strings.Contains(out.String(), "aborted") {
			t.Fatalf("jetsink = %v, want exit 130 saying aborted:\n%s", err, out.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("jetsink did not exit within 5 s of the second signal:\n%s", out.String())
	}
}

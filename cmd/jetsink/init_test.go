package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// Ctrl-C stops an init whose CREATE UNIQUE INDEX waits (here for a lock a
// transaction holds; on a large table, for the build): it exits 1 at
// once, saying so, instead of being killed or waiting on.
func TestInitStopsOnSignal(t *testing.T) {
	catchSignals(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg := testenv.Postgres(t)
	args := []string{"init", "--database-url", pg.URL, "--table", "initsig"}
	if r := startJetsink(t, ctx, args...); r.wait(t, ctx) != exitOK {
		t.Fatalf("init at-least-once: %v\n%s", r.err, r.out.String())
	}
	lockTable(t, ctx, pg.URL, "initsig")

	// Cleanups run last first: this one ends the command, should the
	// signal not, before the lock is released.
	cmdCtx, cmdCancel := context.WithCancel(ctx)
	r := startJetsink(t, cmdCtx, append(args, "--mode", "exactly-once")...)
	t.Cleanup(cmdCancel)
	waitLockWait(t, ctx, pg.URL, "initsig")
	interrupt(t)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	code := r.wait(t, wctx)
	if code != exitFailed || r.err == nil || !strings.Contains(r.err.Error(), "stopped by interrupt: init did not finish") {
		t.Fatalf("exit %d (%v), want %d saying init was stopped\n%s", code, r.err, exitFailed, r.out.String())
	}
}

// init leaves an existing table's columns alone, and says when they do not
// fit the mapping (exit 1, as check), instead of calling the table ready
// for a run that would refuse it; one that fits is ready.
func TestInitSaysWhenTheTableDoesNotFit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if _, err := conn.Exec(ctx, "CREATE TABLE initfit (x int)"); err != nil {
		t.Fatal(err)
	}
	r := startJetsink(t, ctx, "init", "--database-url", pg.URL, "--table", "initfit")
	out := r.out.String
	if code := r.wait(t, ctx); code != exitFailed || r.err == nil ||
		!strings.Contains(r.err.Error(), "table initfit is there but does not fit the mapping") ||
		!strings.Contains(out(), "postgres: error: ") || strings.Contains(out(), "ready") {
		t.Fatalf("init on a table that does not fit: exit %d (%v), want %d naming what to fix\n%s", code, r.err, exitFailed, out())
	}
	r = startJetsink(t, ctx, "init", "--database-url", pg.URL, "--table", "initnew")
	if code := r.wait(t, ctx); code != exitOK || !strings.Contains(r.out.String(), "table initnew ready (at-least-once)") {
		t.Fatalf("init of a new table: exit %d (%v)\n%s", code, r.err, r.out.String())
	}
}

// lockTable locks table in a transaction that the test's end rolls back.
func lockTable(t *testing.T, ctx context.Context, url, table string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
}

// waitLockWait polls until a session waits for a lock on table.
func waitLockWait(t *testing.T, ctx context.Context, url, table string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass", table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no session waits for a lock on %s", table)
		case <-tick.C:
		}
	}
}

// Ctrl-C stops a check whose query waits (for a lock on the table, here
// in exactly-once mode's look at the table's highest stream sequence): it
// exits 1 at once, saying the check did not finish.
func TestCheckStopsOnSignal(t *testing.T) {
	catchSignals(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg := testenv.Postgres(t)
	ns := testenv.NATS(t)
	if _, err := ns.JetStream(t).CreateStream(ctx, jetstream.StreamConfig{Name: "CHECKSIG", Subjects: []string{"checksig.>"}}); err != nil {
		t.Fatal(err)
	}
	args := []string{"--database-url", pg.URL, "--table", "checksig", "--mode", "exactly-once"}
	if r := startJetsink(t, ctx, append([]string{"init"}, args...)...); r.wait(t, ctx) != exitOK {
		t.Fatalf("init: %v\n%s", r.err, r.out.String())
	}
	lockTable(t, ctx, pg.URL, "checksig")

	cmdCtx, cmdCancel := context.WithCancel(ctx)
	r := startJetsink(t, cmdCtx, append([]string{"check", "--nats-url", ns.URL(), "--stream", "CHECKSIG"}, args...)...)
	t.Cleanup(cmdCancel)
	waitLockWait(t, ctx, pg.URL, "checksig")
	interrupt(t)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	code := r.wait(t, wctx)
	if code != exitFailed || r.err == nil || !strings.Contains(r.err.Error(), "stopped by interrupt: check did not finish") {
		t.Fatalf("exit %d (%v), want %d saying check was stopped\n%s", code, r.err, exitFailed, r.out.String())
	}
}

// init makes and checks the table only: --nats-url and --stream, which it
// took and never used, are refused, naming the flag, and its help lists
// the flags it uses.
func TestInitRefusesNATSFlags(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const pgNowhere = "postgres://127.0.0.1:1/x"
	for _, tc := range []struct {
		args []string
		say  string
	}{
		{[]string{"init", "--nats-url", "nats://127.0.0.1:1", "--database-url", pgNowhere}, "--nats-url: init "},
		{[]string{"init", "--print", "--stream=ORDERS", "--database-url", pgNowhere}, "--stream: init "},
		{[]string{"init", "--stream=", "--database-url", pgNowhere}, "--stream: init "},
	} {
		r := startJetsink(t, ctx, tc.args...)
		code := r.wait(t, ctx)
		msg := r.out.String()
		if r.err != nil {
			msg += r.err.Error()
		}
		if code != exitConfig || !strings.Contains(msg, tc.say) {
			t.Errorf("jetsink %s: exit %d, want %d with %q in:\n%s", strings.Join(tc.args, " "), code, exitConfig, tc.say, msg)
		}
	}
	r := startJetsink(t, ctx, "init", "--help")
	help := r.out.String
	if code := r.wait(t, ctx); code != exitOK {
		t.Fatalf("init --help: exit %d\n%s", code, help())
	}
	_, flags, _ := strings.Cut(help(), "\nFlags:\n")
	for _, f := range []string{"--config", "--set", "--database-url", "--table", "--mode", "--log-level", "--print"} {
		if !strings.Contains(flags, f+" ") && !strings.Contains(flags, f+"[") { // --print[=true|false]
			t.Errorf("init --help does not list %s:\n%s", f, help())
		}
	}
	for _, f := range []string{"--nats-url", "--stream"} {
		if strings.Contains(flags, f) {
			t.Errorf("init --help lists %s, which init does not use:\n%s", f, help())
		}
	}
}

// check and init say what postgres.url alone warns of (TLS that does not
// make sure of a remote server, a host list without target_session_attrs)
// beside a connect that fails, when they matter most (a spoofed server
// refusing the login); the error still fails them (exit 1).
func TestCheckAndInitWarnOfTheURLWhenTheyCannotConnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const url = "postgres://u:p@127.0.0.1:1,db.invalid:5432/x?connect_timeout=2"
	for _, args := range [][]string{
		{"check", "--nats-url", "nats://127.0.0.1:1", "--stream", "URLWARN", "--database-url", url, "--table", "urlwarn"},
		{"init", "--database-url", url, "--table", "urlwarn"},
	} {
		r := startJetsink(t, ctx, args...)
		code := r.wait(t, ctx)
		out := r.out.String()
		if r.err != nil {
			out += r.err.Error()
		}
		if code != exitFailed || !strings.Contains(out, "connect to postgres 127.0.0.1:1,db.invalid:5432/x") ||
			!strings.Contains(out, "postgres: warning: postgres.url connects to db.invalid:5432 ") ||
			!strings.Contains(out, "postgres: warning: postgres.url names 2 hosts") {
			t.Errorf("jetsink %s: exit %d, want %d with the connect error and both URL warnings in:\n%s", args[0], code, exitFailed, out)
		}
	}
}

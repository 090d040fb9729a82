package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// A poison event never becomes a row; the demo's wait ends all the same,
// once it is dead-lettered.
func TestWaitSettledCountsDeadLetters(t *testing.T) {
	const events = 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := testenv.NATS(t)
	pg := testenv.Postgres(t)
	cfg, err := demoConfig(ns.URL(), pg.URL, sink.AtLeastOnce)
	if err != nil {
		t.Fatal(err)
	}
	p, err := processor.New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	nc := ns.Connect(t)
	if _, err := loadgen.Publish(ctx, nc, loadgen.Options{Subject: "events", Subjects: 2, Events: events, Run: 1}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "events.poison", []byte("not json")); err != nil {
		t.Fatal(err)
	}

	pull, stopPull := context.WithCancel(ctx)
	defer stopPull()
	ran := make(chan struct{})
	var runErr error
	go func() {
		defer close(ran)
		runErr = p.Run(pull, ctx)
	}()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	werr := waitSettled(wctx, p, ran)
	stopPull()
	<-ran
	if werr != nil {
		t.Fatalf("waitSettled: %v (rows %d, dead letters %d)", werr, p.Sink().Stats().Rows, p.Consumer().Stats().DeadLettered)
	}
	if runErr != nil {
		t.Fatal(runErr)
	}
	if rows, dead := p.Sink().Stats().Rows, p.Consumer().Stats().DeadLettered; rows != events || dead != 1 {
		t.Fatalf("rows %d, dead letters %d; want %d and 1", rows, dead, events)
	}
}

func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Fewer events than the 1000 subjects: the subjects used are said,
	// one per event (it said 1000).
	r := startJetsink(t, ctx, "demo", "--events", "300")
	if code := r.wait(t, ctx); code != 0 {
		t.Fatalf("exit %d\n%s", code, r.out.String())
	}
	if out := r.out.String(); !strings.Contains(out, "published 300 events over 300 subjects in ") ||
		!strings.Contains(out, "drained 300 events") || !strings.Contains(out, "dead letters 0") {
		t.Fatalf("no report, or not over 300 subjects:\n%s", out)
	}
}

func TestSubjectsUsed(t *testing.T) {
	for _, tc := range []struct {
		events, subjects int
		want             string
	}{{10, 1000, "10 subjects"}, {300, 3, "3 subjects"}, {1, 1000, "1 subject"}, {5, 1, "1 subject"}, {0, 1000, "0 subjects"}} {
		if got := subjectsUsed(tc.events, tc.subjects); got != tc.want {
			t.Errorf("subjectsUsed(%d, %d) = %q, want %q", tc.events, tc.subjects, got, tc.want)
		}
	}
}

// A drain that cannot finish (the table is locked) gives way to a second
// Ctrl-C, which exits 130.
func TestDemoSecondSignalAbortsAHungDrain(t *testing.T) {
	catchSignals(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r := startJetsink(t, ctx, "demo", "--events", "50000", "--subjects", "10")

	r.waitOutput(t, ctx, "throwaway PostgreSQL")
	pgURL := regexp.MustCompile(`throwaway PostgreSQL (postgres://\S+)`).FindStringSubmatch(r.out.String())
	if pgURL == nil {
		t.Fatalf("no PostgreSQL URL in:\n%s", r.out.String())
	}
	conn, err := pgx.Connect(ctx, pgURL[1])
	if err != nil {
		t.Fatal(err)
	}
	tx := lockEvents(t, ctx, conn)
	// Runs before the cleanup that waits for jetsink: if the second signal
	// did not end it, releasing the lock lets the drain finish.
	t.Cleanup(func() { _ = tx.Rollback(context.Background()); _ = conn.Close(context.Background()) })
	if strings.Contains(r.out.String(), "published") {
		t.Fatal("the table was locked only after publishing ended: the drain may have finished already")
	}

	r.waitOutput(t, ctx, "published")
	waitLockWait(t, ctx, pgURL[1], "events")
	interrupt(t)
	r.waitOutput(t, ctx, "stopping; a second signal exits at once")
	r.interruptAgain(t, ctx, "jetsink: second interrupt")
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	if code := r.wait(t, wctx); code != exitAborted {
		t.Fatalf("exit %d, want %d\n%s", code, exitAborted, r.out.String())
	}
}

// lockEvents waits for the demo to create table events and locks it in a
// transaction that the test ends.
func lockEvents(t *testing.T, ctx context.Context, conn *pgx.Conn) pgx.Tx {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err = tx.Exec(ctx, "LOCK TABLE events IN ACCESS EXCLUSIVE MODE"); err == nil {
			return tx
		}
		_ = tx.Rollback(ctx)
		select {
		case <-ctx.Done():
			t.Fatalf("table events never appeared: %v", err)
		case <-tick.C:
		}
	}
}

// Flags demo cannot run with are usage errors naming the flag, found
// before it starts any server.
func TestDemoUsageErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args []string
		say  string
	}{
		{[]string{"--mode", "exactly_once"}, `--mode "exactly_once": use at-least-once or exactly-once`},
		{[]string{"--events", "0"}, "--events 0"},
		{[]string{"--events", "-5"}, "--events -5"},
		{[]string{"--subjects", "0"}, "--subjects 0"},
		{[]string{"--subjects", "1048577"}, "--subjects 1048577"},
	} {
		r := startJetsink(t, ctx, append([]string{"demo"}, tc.args...)...)
		code := r.wait(t, ctx)
		if code != exitConfig || r.err == nil || !strings.Contains(r.err.Error(), tc.say) || strings.Contains(r.out.String(), "embedded NATS") {
			t.Errorf("demo %v: exit %d (%v), want %d with %q and no server started; output:\n%s", tc.args, code, r.err, exitConfig, tc.say, r.out.String())
		}
	}
}

// The config file demo --keep writes loads as the demo's own: its URLs,
// mode and columns, so that check, publish and run fit the demo's table.
func TestDemoConfigFileLoads(t *testing.T) {
	cfg, err := demoConfig("nats://127.0.0.1:4999", "postgres://postgres:pa%3Ass@127.0.0.1:5999/postgres?sslmode=disable", sink.ExactlyOnce)
	if err != nil {
		t.Fatal(err)
	}
	got, err := config.Parse(demoConfigFile(cfg), nil, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, demoConfigFile(cfg))
	}
	if got.NATS.URL != cfg.NATS.URL || got.Postgres.URL != cfg.Postgres.URL || got.Postgres.Mode != cfg.Postgres.Mode ||
		!got.NATS.CreateStream || !slices.Equal(got.Postgres.Columns, cfg.Postgres.Columns) {
		t.Errorf("loaded %+v\nwant the demo's %+v", got, cfg)
	}
}

// demo --keep leaves its servers up with a config file that jetsink check
// accepts against them (the table has the demo's columns), and removes it
// at Ctrl-C.
func TestDemoKeepWritesAConfigThatChecks(t *testing.T) {
	catchSignals(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r := startJetsink(t, ctx, "demo", "--events", "100", "--subjects", "2", "--keep")
	r.waitOutput(t, ctx, "servers kept up")
	m := regexp.MustCompile(`check --config '([^']+)'`).FindStringSubmatch(r.out.String())
	if m == nil {
		t.Fatalf("no config file in:\n%s", r.out.String())
	}
	// Marked as the demo's (embedded.TempDir), for the next demo's sweep
	// to remove should this one die first.
	if _, err := os.Stat(filepath.Join(filepath.Dir(m[1]), "owner.pid")); err != nil {
		t.Errorf("the config file's directory is not marked as the demo's: %v", err)
	}
	check := startJetsink(t, ctx, "check", "--config", m[1])
	if code := check.wait(t, ctx); code != 0 {
		t.Errorf("check --config %s: exit %d\n%s", m[1], code, check.out.String())
	}
	interrupt(t)
	if code := r.wait(t, ctx); code != 0 {
		t.Fatalf("demo --keep after Ctrl-C: exit %d\n%s", code, r.out.String())
	}
	if _, err := os.Stat(filepath.Dir(m[1])); !os.IsNotExist(err) {
		t.Errorf("%s after the demo: %v, want it removed", filepath.Dir(m[1]), err)
	}
}

// demo --keep prints commands to run next: through go run when go run
// built this binary (it is gone once demo exits), else as invoked.
func TestInvokedAs(t *testing.T) {
	for arg0, want := range map[string]string{
		"/tmp/go-build2638/b001/exe/jetsink": "go run ./cmd/jetsink",
		"bin/jetsink":                        "bin/jetsink",
		"jetsink":                            "jetsink",
	} {
		if got := invokedAs(arg0); got != want {
			t.Errorf("invokedAs(%q) = %q, want %q", arg0, got, want)
		}
	}
}

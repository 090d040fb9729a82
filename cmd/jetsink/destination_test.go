package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/tests/testenv"
)

// run records its destination (postgres.url's server and database, and
// postgres.table) in the durable's metadata, and check warns of a durable
// whose record names another (exit 0: a warning), naming both, and of
// nothing when it names the configured one.
func TestRunAndCheckCompareTheDestination(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	catchSignals(t)
	ns := testenv.NATS(t)
	pg := testenv.Postgres(t)
	args := []string{"--nats-url", ns.URL(), "--database-url", pg.URL,
		"--set", "nats.create_stream=true", "--set", "postgres.create_table=true"}
	r := startJetsink(t, ctx, append([]string{"run", "--table", "destrun", "--set", "telemetry.listen=127.0.0.1:0"}, args...)...)
	r.waitOutput(t, ctx, "jetsink running")
	cons, err := ns.JetStream(t).Consumer(ctx, "EVENTS", "jetsink")
	if err != nil {
		t.Fatal(err)
	}
	ours := processor.Destination(pg.URL, "destrun")
	if got := cons.CachedInfo().Config.Metadata["jetsink_destination"]; got != ours || ours == "" {
		t.Fatalf("run recorded destination %q, want %q", got, ours)
	}
	interrupt(t)
	if code := r.wait(t, ctx); code != exitOK {
		t.Fatalf("run: exit %d (%v)\n%s", code, r.err, r.out.String())
	}

	check := startJetsink(t, ctx, append([]string{"check", "--table", "destother"}, args...)...)
	out := check.out.String
	if code := check.wait(t, ctx); code != exitOK || !strings.Contains(out(), "nats: warning: ") || !strings.Contains(out(), "split its events") ||
		!strings.Contains(out(), strconv.Quote(ours)) || !strings.Contains(out(), strconv.Quote(processor.Destination(pg.URL, "destother"))) {
		t.Fatalf("check of another table: exit %d (%v), want %d with a warning naming %q and the other table\n%s", code, check.err, exitOK, ours, out())
	}
	check = startJetsink(t, ctx, append([]string{"check", "--table", "destrun"}, args...)...)
	if code := check.wait(t, ctx); code != exitOK || strings.Contains(check.out.String(), "split its events") {
		t.Fatalf("check of the recorded table: exit %d (%v), want %d without a split\n%s", code, check.err, exitOK, check.out.String())
	}
}

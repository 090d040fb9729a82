package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

// destinationOf names the PostgreSQL server (its hosts sorted), database
// and table a jetsink writes to, never its user or password: the durable's
// metadata, where it is recorded, is readable by anyone who may read the
// consumer's info.
func TestDestinationOf(t *testing.T) {
	t.Setenv("PGHOST", "") // pgx takes a missing host, port or database from these
	t.Setenv("PGPORT", "")
	t.Setenv("PGDATABASE", "")
	for _, c := range []struct{ conn, table, want string }{
		{"postgres://jetsink:s3cret@db1:5432/app", "events", "db1:5432/app events"},
		{"postgres://jetsink:s3cret@db1/app?sslmode=prefer", `"My.Schema".events`, `db1:5432/app "My.Schema".events`},
		{"postgres://u:p@h2:5433,h1:5432/app", "public.events", "h1:5432,h2:5433/app public.events"},
		{"postgres://u:p@h1:5432,h2:5433/app", "public.events", "h1:5432,h2:5433/app public.events"},
		{"host=db1 port=6543 dbname=app user=s3cretuser password='s3cret,x'", "events", "db1:6543/app events"},
		{"postgres://u:x@s3cret@h1:5432/app", "events", "h1:5432/app events"}, // refused by validation first
		{"postgres://u:p@[::1]:5432/app", "events", "[::1]:5432/app events"},
		{"postgres://h1:5432/app?password=s3cret&user=s3cretuser", "events", "h1:5432/app events"},
		{"not a connection string ://", "events", ""},
	} {
		got := destinationOf(c.conn, c.table)
		if got != c.want {
			t.Errorf("destinationOf(%q, %q) = %q, want %q", c.conn, c.table, got, c.want)
		}
		if strings.Contains(got, "s3cret") || strings.Contains(got, "@") {
			t.Errorf("destinationOf(%q) = %q holds a credential", c.conn, got)
		}
	}
}

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
	ours := destinationOf(pg.URL, "destrun")
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
		!strings.Contains(out(), strconv.Quote(ours)) || !strings.Contains(out(), strconv.Quote(destinationOf(pg.URL, "destother"))) {
		t.Fatalf("check of another table: exit %d (%v), want %d with a warning naming %q and the other table\n%s", code, check.err, exitOK, ours, out())
	}
	check = startJetsink(t, ctx, append([]string{"check", "--table", "destrun"}, args...)...)
	if code := check.wait(t, ctx); code != exitOK || strings.Contains(check.out.String(), "split its events") {
		t.Fatalf("check of the recorded table: exit %d (%v), want %d without a split\n%s", code, check.err, exitOK, check.out.String())
	}
}

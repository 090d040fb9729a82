package processor

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/tests/testenv"
)

// Destination names the PostgreSQL server (its hosts sorted), database
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
		got := Destination(c.conn, c.table)
		if got != c.want {
			t.Errorf("Destination(%q, %q) = %q, want %q", c.conn, c.table, got, c.want)
		}
		if strings.Contains(got, "s3cret") || strings.Contains(got, "@") {
			t.Errorf("Destination(%q) = %q holds a credential", c.conn, got)
		}
	}
}

// New records the destination in the durable's metadata for every caller,
// not only `jetsink run`: demo and the end-to-end tests call New with the
// config as loaded, and their durables had no jetsink_destination, so
// nothing warned of another jetsink writing elsewhere and a renamed
// consumer's guard (consumer.Config.Destination) was off.
func TestNewRecordsTheDestination(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns, pg, cfg := serversConfig(t, "destnew", nil)
	p, err := New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cons, err := ns.JetStream(t).Consumer(ctx, cfg.NATS.Stream, cfg.NATS.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	want := Destination(pg.URL, "destnew")
	if got := cons.CachedInfo().Config.Metadata["jetsink_destination"]; got != want || want == "" {
		t.Fatalf("New recorded destination %q, want %q", got, want)
	}
}

// serversConfig is a config for New on an embedded nats-server and a
// throwaway PostgreSQL of the test's own: stream NAME (upper case) on
// name.>, table name, both made by jetsink, no admin listener; set may
// change it before it is validated.
func serversConfig(t *testing.T, name string, set func(*config.Config)) (*testenv.NATSServer, *testenv.PG, config.Config) {
	t.Helper()
	ns := testenv.NATS(t)
	pg := testenv.Postgres(t)
	cfg := config.Default()
	cfg.NATS.URL = ns.URL()
	cfg.NATS.CreateStream = true
	cfg.NATS.Stream = strings.ToUpper(name)
	cfg.NATS.Subjects = []string{name + ".>"}
	cfg.Postgres.URL = pg.URL
	cfg.Postgres.Table = name
	cfg.Postgres.CreateTable = true
	cfg.Telemetry.Listen = ""
	if set != nil {
		set(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return ns, pg, cfg
}

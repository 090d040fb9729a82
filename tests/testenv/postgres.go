package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/embedded"
)

// EnvDatabaseURL names the variable that points the tests at an existing
// PostgreSQL server instead of a throwaway cluster.
const EnvDatabaseURL = "JETSINK_TEST_DATABASE_URL"

const howToProvide = "install PostgreSQL 15 or newer so that initdb and pg_ctl are on PATH " +
	"(Debian, Ubuntu: apt-get install postgresql; binaries in /usr/lib/postgresql/<version>/bin), " +
	"or set " + EnvDatabaseURL + "=postgres://user:pass@127.0.0.1:5432/postgres " +
	"to a server where that user may CREATE DATABASE"

// PG is a database of its own for one test.
type PG struct {
	// URL connects to the test's database. On a throwaway cluster it
	// carries the cluster's password, without which the server refuses
	// connections.
	URL string
	// Cluster is the throwaway cluster serving it, nil when
	// JETSINK_TEST_DATABASE_URL named an existing server.
	Cluster *embedded.Cluster
}

var shared struct {
	mu      sync.Mutex
	cluster *embedded.Cluster
	err     error
}

// Postgres gives the test a fresh, empty database, dropped in t.Cleanup. It
// lives on one throwaway cluster shared by the test binary (started on first
// use and stopped by Main), or on the server JETSINK_TEST_DATABASE_URL names.
func Postgres(t testing.TB) *PG {
	t.Helper()
	return postgres(t, "")
}

// PostgresEncoding is Postgres with a database in the server encoding enc
// ("LATIN1", "SQL_ASCII", ...), made from template0 with the C locale.
func PostgresEncoding(t testing.TB, enc string) *PG {
	t.Helper()
	return postgres(t, " ENCODING '"+enc+"' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
}

// postgres makes the test's database, with the CREATE DATABASE options
// given.
func postgres(t testing.TB, options string) *PG {
	t.Helper()
	adminURL := os.Getenv(EnvDatabaseURL)
	var cluster *embedded.Cluster
	if adminURL == "" {
		shared.mu.Lock()
		if shared.cluster == nil && shared.err == nil {
			shared.cluster, shared.err = embedded.StartPostgres()
			if shared.err == nil {
				if shared.err = keep(shared.cluster); shared.err != nil {
					shared.cluster = nil
				}
			}
		}
		var err error
		cluster, err = shared.cluster, shared.err // not :=, which would leave PG.Cluster nil
		shared.mu.Unlock()
		if err != nil {
			t.Fatalf("no PostgreSQL for this test: %v; or set %s to a server of your own", err, EnvDatabaseURL)
		}
		adminURL = cluster.URL("postgres")
	}
	name := "jetsink_" + randomHex(6)
	if err := adminExec(adminURL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+options); err != nil {
		t.Fatalf("create test database: %v (%s)", err, howToProvide)
	}
	t.Cleanup(func() {
		if err := adminExec(adminURL, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	dbURL, err := withDatabase(adminURL, name)
	if err != nil {
		t.Fatalf("test database URL: %v", err)
	}
	return &PG{URL: dbURL, Cluster: cluster}
}

// Conn opens a connection to the test's database, closed in t.Cleanup.
func (p *PG) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// Main runs the tests, stops the shared cluster, and reports goroutines that
// outlived them (goleak). Shortly before the test binary's -timeout runs
// out it destroys every PostgreSQL cluster this package started, which
// would outlive the timeout's panic. Call it from TestMain.
func Main(m *testing.M) {
	flag.Parse() // m.Run would parse them after the watchdog needs -test.timeout
	watchdog := startWatchdog()
	code := m.Run()
	if watchdog != nil {
		watchdog.Stop()
	}
	removeBinaries()
	shared.mu.Lock()
	if shared.cluster != nil {
		if err := destroy(shared.cluster); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stop shared PostgreSQL: %v\n", err)
		}
		shared.cluster = nil
	}
	shared.mu.Unlock()
	if code == 0 {
		if err := findLeaks(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Cluster is a throwaway PostgreSQL cluster (see embedded.Cluster).
type Cluster = embedded.Cluster

// WithFsync keeps fsync on, as in production (see embedded.WithFsync).
var WithFsync = embedded.WithFsync

// NewCluster starts a cluster of the test's own, for tests that stop, kill or
// restart the server. It is destroyed in t.Cleanup. It fails the test, saying
// how to provide PostgreSQL, when the binaries are missing.
func NewCluster(t testing.TB, opts ...embedded.ClusterOption) *embedded.Cluster {
	t.Helper()
	c, err := embedded.StartPostgres(opts...)
	if err != nil {
		t.Fatalf("no PostgreSQL cluster for this test (it stops and restarts its own, so %s cannot stand in): %v", EnvDatabaseURL, err)
	}
	if err := keep(c); err != nil {
		t.Fatalf("PostgreSQL cluster for this test: %v", err)
	}
	t.Cleanup(func() {
		if err := destroy(c); err != nil {
			t.Errorf("destroy PostgreSQL cluster: %v", err)
		}
	})
	return c
}

func adminExec(url, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

func withDatabase(raw, db string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%s must be a postgres:// URL", EnvDatabaseURL)
	}
	u.Path = "/" + db
	return u.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

// NewStandby starts a streaming-replication standby of primary (see
// embedded.Cluster.StartStandby), destroyed in t.Cleanup, and makes it
// synchronous: from then on a commit on primary returns once the standby
// has flushed it, so a failover to the standby loses no commit a client
// was told of. (The standby's own settings do not name one: promoted, it
// commits alone. A second standby of the same primary would copy the
// setting in its base backup, and promoted, wait for a standby of its own
// at every commit: one per primary.)
func NewStandby(t testing.TB, primary *embedded.Cluster) *embedded.Cluster {
	t.Helper()
	s, err := primary.StartStandby()
	if err != nil {
		t.Fatalf("standby of the PostgreSQL cluster: %v", err)
	}
	if err := keep(s); err != nil {
		t.Fatalf("standby of the PostgreSQL cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := destroy(s); err != nil {
			t.Errorf("destroy PostgreSQL standby: %v", err)
		}
	})
	for _, sql := range []string{"ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"} {
		if err := adminExec(primary.URL("postgres"), sql); err != nil {
			t.Fatalf("make the standby synchronous: %s: %v", sql, err)
		}
	}
	return s
}

// FailoverURL is the first cluster's URL for database db, naming every
// cluster's address in order, with target_session_attrs=read-write: libpq's
// (and pgx's) way to follow a failover, connecting to whichever server takes
// writes.
func FailoverURL(db string, clusters ...*embedded.Cluster) string {
	u, err := url.Parse(clusters[0].URL(db))
	if err != nil {
		panic(err) // URL builds it
	}
	hosts := make([]string, len(clusters))
	for i, c := range clusters {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port()))
	}
	u.Host = strings.Join(hosts, ",")
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	return u.String()
}

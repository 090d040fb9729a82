package sink

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/tests/testenv"
)

// postgres.url is judged as pgx parsed it (a URL, a key=value DSN,
// PGSSLMODE, a service file): a host that is not this machine, reached
// with an sslmode that does not make sure of the server (pgx's default
// prefer, with sslrootcert too; allow; disable; require without
// sslrootcert; verify-ca without sslrootcert, which pgx checks against
// the system's CAs and not the name), is warned of, naming the hosts and
// what the setting does; verify-full, verify-ca and require with
// sslrootcert (verify-ca in pgx) are not, nor loopback and unspecified
// (0.0.0.0, ::) hosts and Unix sockets. Every host of a list is judged.
func TestTLSProblem(t *testing.T) {
	ca := testenv.CAFile(t)
	svc := filepath.Join(t.TempDir(), "pg_service.conf")
	if err := os.WriteFile(svc, []byte("[remote]\nhost=db.example.com\nsslmode=require\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGSERVICEFILE", svc)
	for _, c := range []struct {
		dsn, env string // env: PGSSLMODE
		says     string // "": no warning
	}{
		{dsn: "postgres://u@127.0.0.1:5432/x"},
		{dsn: "postgres://u@127.9.9.9:5432/x?sslmode=disable"},
		{dsn: "postgres://u@localhost/x"},
		{dsn: "postgres://u@LOCALHOST./x?sslmode=require"},
		{dsn: "postgres://u@[::1]:5433/x?sslmode=disable"},
		{dsn: "postgres://u@0.0.0.0/x?sslmode=disable"}, // Linux connects it to this machine
		{dsn: "postgres://u@[::]:5433/x?sslmode=require"},
		{dsn: "host=/var/run/postgresql user=u dbname=x sslmode=disable"},
		{dsn: "postgres://u@%2Ftmp/x"},
		{dsn: "postgres://u@db.example.com/x", says: "connects to db.example.com:5432 over TLS that checks no certificate, and in plaintext when the server declines TLS (sslmode=prefer"},
		{dsn: "postgres://u@db.example.com/x?sslmode=prefer", says: "(sslmode=prefer"},
		{dsn: "postgres://u@db.example.com/x?sslmode=require", says: "connects to db.example.com:5432 over TLS that checks no certificate (sslmode=require without sslrootcert)"},
		{dsn: "postgres://u@10.0.0.5:6432/x?sslmode=disable", says: "connects to 10.0.0.5:6432 without TLS (sslmode=disable)"},
		{dsn: "postgres://u@db.example.com/x?sslmode=allow", says: "in plaintext first, and over TLS that checks no certificate if the server wants TLS (sslmode=allow)"},
		{dsn: "postgres://u@db.example.com/x?sslmode=prefer&sslrootcert=" + ca, says: "over TLS that checks no certificate, and in plaintext when the server declines TLS (sslmode=prefer"},
		{dsn: "postgres://u@db.example.com/x?sslnegotiation=direct", says: "over TLS that checks no certificate"},
		{dsn: "postgres://u@db.example.com/x?sslmode=verify-full&sslrootcert=" + ca},
		{dsn: "postgres://u@db.example.com/x?sslmode=verify-ca&sslrootcert=" + ca},
		{dsn: "postgres://u@db.example.com/x?sslmode=verify-ca", says: "connects to db.example.com:5432 over TLS that takes any certificate a public CA signed, for any name (sslmode=verify-ca without sslrootcert"},
		{dsn: "postgres://u@db.example.com,db2.example.com:5433/x?sslmode=verify-ca", says: "connects to db.example.com:5432,db2.example.com:5433 over TLS that takes any certificate"},
		{dsn: "postgres://u@db.example.com/x?sslmode=verify-ca&sslrootcert=system"},
		{dsn: "postgres://u@db.example.com/x?sslmode=require&sslrootcert=" + ca},
		{dsn: "postgres://u@db.example.com/x?sslmode=verify-full"},
		// key=value, PGSSLMODE, a service file
		{dsn: "host=db.example.com user=u dbname=x", says: "connects to db.example.com:5432 over TLS that checks no certificate, and in plaintext"},
		{dsn: "host=db.example.com user=u dbname=x sslmode=verify-full sslrootcert=" + ca},
		{dsn: "postgres://u@db.example.com/x", env: "disable", says: "without TLS (sslmode=disable)"},
		{dsn: "postgres://u@db.example.com/x", env: "verify-full"},
		{dsn: "service=remote user=u dbname=x", says: "connects to db.example.com:5432 over TLS that checks no certificate (sslmode=require"},
		// lists: each host, the loopback ones left out
		{dsn: "postgres://u@127.0.0.1:5432,db2.example.com:5433/x", says: "connects to db2.example.com:5433 over TLS"},
		{dsn: "postgres://u@localhost,10.0.0.5,[::1],10.0.0.6:5433/x?sslmode=require", says: "connects to 10.0.0.5:5432,10.0.0.6:5433 over TLS"},
		{dsn: "host=/tmp,localhost,db.example.com user=u sslmode=disable", says: "connects to db.example.com:5432 without TLS"},
		{dsn: "postgres://u@127.0.0.1,localhost,[::1]/x?sslmode=disable"},
		{dsn: "postgres://u@0.0.0.0,db.example.com,[::]/x?sslmode=disable", says: "connects to db.example.com:5432 without TLS"},
	} {
		t.Setenv("PGSSLMODE", c.env)
		if c.env == "" {
			os.Unsetenv("PGSSLMODE")
		}
		cc, err := pgx.ParseConfig(c.dsn)
		if err != nil {
			t.Fatalf("%s: %v", c.dsn, err)
		}
		p, ok := tlsProblem(&cc.Config)
		switch {
		case c.says == "" && ok:
			t.Errorf("%s (PGSSLMODE=%s): %s, want none", c.dsn, c.env, p)
		case c.says != "" && !ok:
			t.Errorf("%s (PGSSLMODE=%s): no problem, want one saying %q", c.dsn, c.env, c.says)
		case ok && (p.Kind != ProblemTLSUnverified || !p.Warning || !strings.Contains(p.Message, c.says) ||
			!strings.Contains(p.Message, "can ask for the password in cleartext and get it, and read and change the events") ||
			!strings.Contains(p.Fix, "sslmode=verify-full and sslrootcert=")):
			t.Errorf("%s (PGSSLMODE=%s): %+v, want a warning, %s, saying %q", c.dsn, c.env, p, ProblemTLSUnverified, c.says)
		}
	}
}

// Check says it, for the hosts not on this machine only, and Run's first
// look (logProblems) logs it at Warn; a URL on this machine gets neither.
func TestCheckWarnsOfUnverifiedTLS(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, nil)
	logs := captureLog(t, s, time.Minute)
	if found, err := s.logProblems(ctx, 10*time.Second); found || err != nil || strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("%s: found %v, err %v, log:\n%s", pg.URL, found, err, logs)
	}
	// A failover list whose second host is elsewhere: the first answers.
	u, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	want := "connects to db.invalid:5432 without TLS (sslmode=disable)"
	if ip := net.ParseIP(u.Hostname()); (ip == nil || !ip.IsLoopback()) && u.Hostname() != "localhost" {
		want = "," + want[len("connects to "):] // the test's server is elsewhere, and named first
	}
	u.Host += ",db.invalid:5432"
	list := withParam(t, u.String(), "target_session_attrs", "read-write")
	s, _ = newTestSink(t, ctx, list, nil)
	probs, err := s.Check(ctx)
	if err != nil || len(probs) != 1 || probs[0].Kind != ProblemTLSUnverified || !probs[0].Warning || !strings.Contains(probs[0].Message, want) {
		t.Fatalf("%s: problems %v, err %v; want one warning, %s, saying %q", list, probs, err, ProblemTLSUnverified, want)
	}
	logs = captureLog(t, s, time.Minute)
	if found, err := s.logProblems(ctx, 10*time.Second); found || err != nil ||
		!strings.Contains(logs.String(), `level=WARN msg="the connection to PostgreSQL does not make sure of the server" problem="postgres.url connects to`) {
		t.Fatalf("%s: found %v, err %v; want the warning logged, log:\n%s", list, found, err, logs)
	}
}

// Run's first look that cannot connect logs postgres.url's own warnings
// beside its error: a server refusing the login may be a spoofed one.
func TestFirstLookWarnsOfTheURLWhenItCannotConnect(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	const list = "postgres://u:p@127.0.0.1:1,db.invalid:5432/x?connect_timeout=2"
	s, _ := newTestSink(t, ctx, list, func(c *Config) { c.CreateTable = false })
	logs := captureLog(t, s, time.Minute)
	if found, err := s.logProblems(ctx, 10*time.Second); found || err == nil {
		t.Fatalf("found %v, err %v; want the connect's error", found, err)
	}
	for _, want := range []string{
		`level=WARN msg="cannot compare the column mapping with the table yet"`,
		`level=WARN msg="the connection to PostgreSQL does not make sure of the server" problem="postgres.url connects to db.invalid:5432`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("want %q in the log:\n%s", want, logs)
		}
	}
}

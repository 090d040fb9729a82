package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// Fault scenarios that need jetsink as a process of its own: kill -9, its
// memory under a locked table, and what its configuration does with hostile
// names and secrets.

// 1) kill -9 of the jetsink process mid-batch while events are still being
// published; a new process takes over. At-least-once may duplicate the
// batches that had committed and not yet been acked: two per connection
// (kill9Duplicates, 2 x 2 x 1000 in writeConfig).
func TestFaultKill9DuringPublish(t *testing.T) {
	const events = 20_000
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e.createStreams(ctx)
			cfgPath := e.writeConfig(mode)
			first := e.spawn(cfgPath)

			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, events, 4000, 100)
			waitFor(t, ctx, "a quarter of the events committed", func() (bool, string) {
				n := e.tableRows(ctx)
				return n >= events/4, fmt.Sprintf("%d rows", n)
			})
			if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			first.wait(t, 10*time.Second)
			atKill := e.rows(ctx)

			second := e.spawn(cfgPath)
			pub.wait(t, ctx)
			e.waitSettled(ctx, x)
			if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := second.wait(t, 40*time.Second); code != 0 {
				t.Fatalf("second run: exit status %d; output:\n%s", code, second.stderr.String())
			}
			v := e.check(ctx, x)
			t.Logf("%d rows at the kill", atKill)
			e.judgeValid("1 kill -9 during publish", mode, v, kill9Duplicates)
		})
	}
}

// procStatus reads VmRSS and VmHWM (KiB) of pid.
func procStatus(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	return rss, hwm, sc.Err()
}

// redeliveries is how often the durable consumer delivered a message again:
// its delivery sequence counts every delivery, the stream sequence each
// message once (the stream holds only this test's events, from 1).
func (e *env) redeliveries(ctx context.Context) uint64 {
	info := e.consumerInfo(ctx)
	return info.Delivered.Consumer - info.Delivered.Stream
}

// 7) The table is locked (ACCESS EXCLUSIVE) for 20s, twice ack_wait
// (10s), while the publisher sends far more than drains (nothing drains
// during the lock). The process's memory stays bounded (back-pressure keeps
// the backlog in JetStream), nothing is redelivered (InProgress), nothing is
// lost.
//
// ack_wait is 10 s, not writeConfig's 5 s: the sink sends InProgress every
// third of ack_wait, checked every quarter of that, so up to 5/12 of
// ack_wait apart (~2.1 s of 5 s), and the two jetsinks of this test run at
// once on a loaded machine: a stall of ~3 s took an event past a 5 s
// ack_wait and failed the test. 10 s leaves ~5.8 s. The lock stays twice
// ack_wait: the events taken in as it starts wait for all of it, ~10 s
// past their ack_wait, and without InProgress come again.
func TestFaultTableLocked(t *testing.T) {
	const (
		warm, events = 2_000, 25_000
		ackWait      = 10 * time.Second
		lock         = 2 * ackWait
		rssBoundKiB  = 100 << 10 // 100 MiB: about twice what was measured (45 MiB)
	)
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel() // mostly waiting for the lock
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e.createStreams(ctx)
			p := e.spawn(e.writeConfig(mode, fmt.Sprintf("nats.ack_wait: %v", ackWait)))
			pid := p.cmd.Process.Pid

			x := newExpected()
			e.publishDuring(ctx, x, 0, warm, 0, 100).wait(t, ctx)
			e.waitSettled(ctx, x)
			_, warmHWM, err := procStatus(pid)
			if err != nil {
				t.Fatalf("read /proc/%d/status: %v; output:\n%s", pid, err, p.stderr.String())
			}

			tx := e.lockTable(ctx, e.pg.Conn(t), "ACCESS EXCLUSIVE")
			lockedAt := time.Now()
			atLock := e.consumerInfo(ctx)
			pub := e.publishDuring(ctx, x, warm, events, float64(events)/(lock.Seconds()-3), 100)
			var maxRSS int64
			for time.Since(lockedAt) < lock {
				rss, _, err := procStatus(pid)
				if err != nil {
					t.Fatalf("read /proc/%d/status: %v; output:\n%s", pid, err, p.stderr.String())
				}
				maxRSS = max(maxRSS, rss)
				time.Sleep(250 * time.Millisecond) // sampling interval, not a wait for a condition
			}
			info := e.consumerInfo(ctx)
			redeliveredInLock := e.redeliveries(ctx)
			if err := tx.Rollback(ctx); err != nil { // releases the lock
				t.Fatal(err)
			}
			pub.wait(t, ctx)
			e.waitSettled(ctx, x)
			_, hwm, err := procStatus(pid)
			if err != nil {
				t.Fatalf("read /proc/%d/status: %v; output:\n%s", pid, err, p.stderr.String())
			}
			redelivered := e.redeliveries(ctx)
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t, 40*time.Second); code != 0 {
				t.Fatalf("exit status %d; output:\n%s", code, p.stderr.String())
			}

			v := e.check(ctx, x)
			t.Logf("lock %v: published %d during it, %d acked (drained); at its end the consumer had %d pending in JetStream and %d delivered unacked",
				lock, events, info.AckFloor.Consumer-atLock.AckFloor.Consumer, info.NumPending, info.NumAckPending)
			t.Logf("RSS: max VmRSS during the lock %d MiB, VmHWM %d MiB (after warm-up %d MiB); bound %d MiB",
				maxRSS>>10, hwm>>10, warmHWM>>10, rssBoundKiB>>10)
			t.Logf("redeliveries: %d during the lock, %d in all", redeliveredInLock, redelivered)
			if hwm == 0 || maxRSS == 0 {
				t.Errorf("no VmHWM (%d) or VmRSS (%d) read from /proc/%d/status", hwm, maxRSS, pid)
			}
			if hwm > rssBoundKiB || maxRSS > rssBoundKiB {
				t.Errorf("VmHWM %d MiB (VmRSS at most %d MiB during the lock) is over the %d MiB bound", hwm>>10, maxRSS>>10, rssBoundKiB>>10)
			}
			if redelivered != 0 {
				// While the database stalls the sink keeps taking rows
				// into spare batches and sends InProgress for every one it
				// holds (README, "While the database stalls"): none may
				// come again.
				t.Errorf("%d redeliveries with a lock (%v) longer than ack_wait (%v): events held by jetsink got no InProgress", redelivered, lock, ackWait)
			}
			// Each redelivery above may add a duplicate; the test has
			// failed already if there was one.
			e.judgeValid("7 table locked 20s", mode, v, int64(redelivered))
		})
	}
}

// jsonString quotes s for YAML (a JSON string is a YAML double-quoted scalar).
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// 9) Hostile identifiers are quoted, never executed, end to end (config ->
// init -> run); secrets from the DSN, nats.password and a creds file never
// appear in any output, of a failing configuration or of a working one.
func TestFaultHostileNamesAndSecrets(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.createStreams(ctx)
	e.table = `ev"; DROP TABLE victim; --`
	valueCol := `va"lue'); DROP TABLE victim; --`
	e.exec(ctx, "CREATE TABLE victim (x int)")

	// The secret is the server's own password (the throwaway clusters have a
	// random one); a URL without one, of a server that lets it in without
	// (JETSINK_TEST_DATABASE_URL), gets a sentinel the server ignores.
	dsn := e.pg.URL
	pu, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	secret, ok := pu.User.Password()
	switch {
	case !ok:
		secret = fmt.Sprintf("Sentinel%dSecret", e.run%1_000_000)
		pu.User = url.UserPassword(pu.User.Username(), secret)
		dsn = pu.String()
	case len(secret) < 8:
		t.Fatalf("the database URL's password is too short to look for in the output (it would match other words): give %s one of 8 characters or more", testenv.EnvDatabaseURL)
	}
	creds := filepath.Join(t.TempDir(), "bad.creds")
	if err := os.WriteFile(creds, []byte("-----BEGIN NATS USER JWT-----\n"+secret+"\n------END NATS USER JWT------\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	closed := closedPort(t)
	yaml := func(natsURL, natsAuth, pgURL string) string {
		cfg := fmt.Sprintf(`
nats:
  url: %s
%s
  stream: %s
  consumer: jetsink
  dead_letter_subject: dlq.%s
  ack_wait: 5s
pipeline: {workers: 2, ring_size: 1024}
postgres:
  url: %s
  table: %s
  mode: exactly-once
  batch: {max_rows: 1000, max_delay: 20ms}
  columns:
    - {name: id, from: "json:id", type: uuid, required: true}
    - {name: ts, from: "json:ts", type: timestamptz, required: true}
    - {name: %s, from: "json:value", type: float8}
    - {name: seq, from: "json:seq", type: int8}
    - {name: stream, from: "meta:stream", type: text}
    - {name: stream_seq, from: "meta:stream_seq", type: int8}
drain_timeout: 30s
telemetry: {listen: "127.0.0.1:0"}
log: {level: debug, format: text}
`, jsonString(natsURL), natsAuth, e.stream, e.stream, jsonString(pgURL), jsonString(e.table), jsonString(valueCol))
		path := filepath.Join(t.TempDir(), "jetsink.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	userPass := "  user: jetsink\n  password: " + jsonString(secret)
	credsFile := "  creds_file: " + jsonString(creds)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pgDown := *u
	pgDown.Host = fmt.Sprintf("127.0.0.1:%d", closed)
	badPort := pgDown.String()
	badDB := strings.Replace(dsn, u.Path, "/no_such_db", 1)
	noLeak := func(what, out string) {
		t.Helper()
		if strings.Contains(out, secret) {
			t.Errorf("%s: the secret appears in the output:\n%s", what, out)
		}
	}
	// run retries PostgreSQL for ever, so it is run only where NATS fails
	// it at once.
	pgOnly, natsOnly, all := []string{"check", "init"}, []string{"check", "run"}, []string{"check", "init", "run"}
	failing := []struct {
		name, cfg string
		cmds      []string
		code      int // 0: any but 0
	}{
		{"postgres down", yaml(e.nats.URL(), userPass, badPort), pgOnly, 0},
		{"no such database", yaml(e.nats.URL(), userPass, badDB), pgOnly, 0},
		{"unparsable dsn", yaml(e.nats.URL(), userPass, "postgres://postgres:"+secret+"@[::1/x"), all, 0},
		{"nats down", yaml(fmt.Sprintf("nats://127.0.0.1:%d", closed), userPass, dsn), natsOnly, 0},
		{"bad creds file", yaml(e.nats.URL(), credsFile, dsn), natsOnly, 2}, // a bad configuration
	}
	for _, f := range failing {
		for _, cmd := range f.cmds {
			out, code := jetsinkTimed(t, 20*time.Second, cmd, "--config", f.cfg)
			if code == 0 || (f.code != 0 && code != f.code) {
				t.Errorf("%s: jetsink %s exited %d, want %d (0: any but 0):\n%s", f.name, cmd, code, f.code, out)
			}
			noLeak(f.name+": jetsink "+cmd, out)
		}
	}

	good := yaml(e.nats.URL(), userPass, dsn)
	out, code := jetsinkCmd(t, []string{"JETSINK_CONFIG="}, "init", "--config", good)
	noLeak("init", out)
	if code != 0 {
		t.Fatalf("init: exit %d\n%s", code, out)
	}
	p := e.spawn(good)
	x := newExpected()
	e.publishDuring(ctx, x, 0, 1_000, 0, 10).wait(t, ctx)
	e.waitSettled(ctx, x)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 40*time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.stderr.String())
	}
	noLeak("run", p.stderr.String())
	out, _ = jetsinkCmd(t, []string{"JETSINK_CONFIG="}, "check", "--config", good)
	noLeak("check", out)

	if n := e.count(ctx, "SELECT count(*) FROM pg_class WHERE relname = 'victim'"); n != 1 {
		t.Fatalf("table victim is gone: an identifier was executed")
	}
	if n := e.count(ctx, "SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2",
		pgx.Identifier{e.table}.Sanitize(), valueCol); n != 1 {
		t.Fatalf("column %q not found in table %q", valueCol, e.table)
	}
	if n := e.count(ctx, "SELECT count(*) FROM "+e.tableID()+" WHERE "+pgx.Identifier{valueCol}.Sanitize()+" IS NOT NULL"); n != 1_000 {
		t.Errorf("%d rows with the hostile column filled, want 1000", n)
	}
	v := e.check(ctx, x)
	e.judgeValid("9 hostile names, secrets", sink.ExactlyOnce, v, 0)
}

// jetsinkTimed runs the binary for at most d and returns its output and
// exit code (-1 when it had to be killed).
func jetsinkTimed(t *testing.T, d time.Duration, args ...string) (string, int) {
	t.Helper()
	bin := testenv.Jetsink(t) // may build it: not on d's clock
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	testenv.DieWithTest(cmd)
	cmd.Env = append(os.Environ(), "JETSINK_CONFIG=")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Errorf("jetsink %v did not return within %v:\n%s", args, d, out)
		return string(out), -1
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	default:
		t.Fatalf("jetsink %v: %v\n%s", args, err, out)
		return "", -1
	}
}

// closedPort is a loopback port nothing listens on, until the test ends:
// a socket bound to it, never listening, refuses every connection and
// keeps other listeners and outgoing connections off it (a port released
// at once could be taken by another test's listener meanwhile, and a
// connect would then hang rather than be refused).
func closedPort(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(fd) // SOCK_CLOEXEC is Linux's
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

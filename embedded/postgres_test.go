package embedded

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A cluster whose owner died is stopped and removed by the next start; one
// whose owner lives is left alone.
func TestSweepOrphans(t *testing.T) {
	orphan, err := StartPostgres()
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = orphan.Destroy() })
	alive, err := StartPostgres()
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = alive.Destroy() })

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := orphaned(orphan.dir, []byte(strconv.Itoa(dead.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	sweepOrphans(pgDirPrefix, stopOrphan)

	if _, err := os.Stat(orphan.dir); !os.IsNotExist(err) {
		t.Fatalf("orphan's directory still there: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(orphan.Port()), time.Second); err == nil {
		conn.Close()
		t.Fatal("orphan's server still accepts connections")
	}
	if _, err := os.Stat(alive.dir); err != nil {
		t.Fatalf("a live owner's cluster was swept: %v", err)
	}
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(alive.Port()), time.Second)
	if err != nil {
		t.Fatalf("a live owner's server was stopped: %v", err)
	}
	conn.Close()
}

// deadPID is the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	return dead.Process.Pid
}

// A temporary NATS store directory whose owner died (a panic, SIGKILL, or
// go test -timeout skipped Destroy) is removed by the next sweep; one whose
// owner lives is left alone.
func TestSweepOrphanedNATSStoreDirs(t *testing.T) {
	orphan, err := StartNATS("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(orphan.Destroy)
	alive, err := StartNATS("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(alive.Destroy)
	if !strings.HasPrefix(filepath.Base(orphan.StoreDir()), natsDirPrefix) {
		t.Fatalf("store dir %s does not start with %s, so no sweep finds it", orphan.StoreDir(), natsDirPrefix)
	}

	if pid, err := readPID(filepath.Join(orphan.StoreDir(), ownerFile)); err != nil || pid != os.Getpid() {
		t.Fatalf("store dir's owner file: pid %d, %v; want this process, %d", pid, err, os.Getpid())
	}
	orphan.Shutdown() // what a crash leaves: the directory, no server
	if err := orphaned(orphan.StoreDir(), []byte(strconv.Itoa(deadPID(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	sweepOrphans(natsDirPrefix, nil)

	if _, err := os.Stat(orphan.StoreDir()); !os.IsNotExist(err) {
		t.Fatalf("orphaned store dir still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(alive.StoreDir(), ownerFile)); err != nil {
		t.Fatalf("a live owner's store dir was swept: %v", err)
	}
}

// When the server is not ready in time (it may come up after start gave
// up), it is stopped before the next attempt and
// before the directory is removed, even one that is not start's child.
func TestFailedStartLeavesNoServer(t *testing.T) {
	// A postgres that logs its arguments and starts the server in another
	// process, whose postmaster.pid this one never sees: it comes up, and
	// start never finds it ready.
	var log string
	bin := fakeTool(t, "postgres", func(bin, real string) string {
		log = filepath.Join(bin, "starts")
		return "#!/bin/sh\n" +
			"echo \"$@\" >>" + log + "\n" +
			"\"" + real + "\" \"$@\" &\n" +
			"wait\n"
	})

	c, err := startCluster(clusterOptions{bin: bin, ready: 2 * time.Second})
	if err == nil {
		_ = c.Destroy()
		t.Fatal("startCluster succeeded with a server it never finds ready")
	}
	b, rerr := os.ReadFile(log)
	if rerr != nil {
		t.Fatalf("the server was never started: %v (startCluster: %v)", rerr, err)
	}
	starts := strings.Split(strings.TrimSpace(string(b)), "\n")
	t.Logf("%d starts; startCluster: %.200s", len(starts), err)
	if len(starts) != 3 {
		t.Errorf("%d starts, want 3", len(starts))
	}
	for _, args := range starts {
		f := strings.Fields(args)
		for i, a := range f {
			switch {
			case i+1 == len(f):
			case a == "-p":
				if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+f[i+1], time.Second); err == nil {
					conn.Close()
					t.Errorf("a server that failed to start still listens on port %s", f[i+1])
				}
			case a == "-D":
				if procs := processesIn(t, f[i+1]); len(procs) > 0 {
					t.Errorf("processes %v of a server that failed to start still run in %s", procs, f[i+1])
				}
				if dir := filepath.Dir(f[i+1]); !strings.HasPrefix(filepath.Base(dir), pgDirPrefix) {
					t.Errorf("data directory %s not in a %s* directory", f[i+1], pgDirPrefix)
				} else if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("cluster dir %s still there: %v", dir, err)
				}
			}
		}
	}
}

// fakePgCtl makes a bin directory the postgres user can read, with the real
// initdb and postgres and, as pg_ctl, the shell script that script returns
// given the directory and the real pg_ctl's path.
func fakePgCtl(t *testing.T, script func(bin, realPgCtl string) string) string {
	t.Helper()
	return fakeTool(t, "pg_ctl", script)
}

// fakeTool makes a bin directory the postgres user can read and write,
// with the real initdb, pg_ctl and postgres but for name, the shell script
// that script returns given the directory and the real name's path.
func fakeTool(t *testing.T, name string, script func(bin, real string) string) string {
	t.Helper()
	real, err := findPostgresBin()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.MkdirTemp("", "jetsink-pgbin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(bin) })
	if err := os.Chmod(bin, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"initdb", "pg_ctl", "postgres"} {
		if tool == name {
			continue
		}
		if err := os.Symlink(filepath.Join(real, tool), filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, name), []byte(script(bin, filepath.Join(real, name))), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// When pg_ctl cannot stop the server, Destroy stops it another way before
// it removes the directory: a server left running without its directory
// and owner.pid would be found by no sweep, and would keep its port and
// shared memory until reboot.
func TestDestroyStopsAServerPgCtlCannot(t *testing.T) {
	bin := fakePgCtl(t, func(_, real string) string {
		return "#!/bin/sh\n" +
			"for a; do last=$a; done\n" +
			"if [ \"$last\" = stop ]; then echo 'pg_ctl: could not send stop signal (test)' >&2; exit 1; fi\n" +
			"exec \"" + real + "\" \"$@\"\n"
	})
	c, pid, dataDir := killedAfter(t, clusterOptions{bin: bin})

	if err := c.Destroy(); err == nil {
		t.Error("Destroy returned no error although pg_ctl stop failed")
	} else {
		t.Logf("Destroy: %v", err)
	}
	if processAlive(pid) && runsIn(pid, dataDir) {
		t.Errorf("the server (pid %d) still runs after Destroy", pid)
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(c.Port()), time.Second); err == nil {
		conn.Close()
		t.Errorf("port %d still accepts connections after Destroy", c.Port())
	}
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		t.Errorf("cluster dir %s still there: %v", c.dir, err)
	}
}

// killedAfter starts a cluster of opts whose postmaster (pid, in dataDir)
// the test's cleanup kills if it still runs: the tests that use it make
// Destroy's own stop fail, or pretend it need not stop.
func killedAfter(t *testing.T, opts clusterOptions) (c *Cluster, pid int, dataDir string) {
	t.Helper()
	c, err := startCluster(opts)
	if err != nil {
		t.Fatal(err)
	}
	pid, dataDir = c.PID(), c.dataDir()
	if pid == 0 {
		t.Fatal("no postmaster.pid in a started cluster")
	}
	t.Cleanup(func() {
		if processAlive(pid) && runsIn(pid, dataDir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return c, pid, dataDir
}

// A server that a failed Start left running (the cluster counts as
// stopped) is stopped by Destroy before its directory goes: without it, no
// sweep could find the server.
func TestDestroyStopsAServerAFailedStartLeft(t *testing.T) {
	c, pid, dataDir := killedAfter(t, clusterOptions{})
	c.mu.Lock()
	c.running = false // as start leaves it when it fails with errStrayRuns
	c.mu.Unlock()
	if err := c.Destroy(); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if processAlive(pid) && runsIn(pid, dataDir) {
		t.Errorf("the server (pid %d) still runs after Destroy", pid)
	}
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		t.Errorf("cluster dir %s still there: %v", c.dir, err)
	}
}

// The cluster refuses connections without its password, over TCP and over
// its Unix socket, and hands out a URL that carries it; nothing but the
// server can reach the socket, and the password is left in no file.
func TestClusterRequiresPassword(t *testing.T) {
	const secretEnv = "JETSINK_TEST_SECRET=d41d8cd98f00b204"
	k, v, _ := strings.Cut(secretEnv, "=")
	t.Setenv(k, v)
	c, err := StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy() })
	if c.cred != nil {
		// Run as another user, the server gets none of this process's
		// environment, which that user could read in /proc.
		environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c.PID()), "environ"))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(environ, []byte(secretEnv)) {
			t.Errorf("the postmaster, run as postgres, has this process's environment (%s)", secretEnv)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("connect with URL(): %v", err)
	}
	var super bool
	err = conn.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super)
	_ = conn.Close(ctx)
	if err != nil || !super {
		t.Fatalf("URL() connects as a superuser: %v, %v", super, err)
	}

	u, err := url.Parse(c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	pass, ok := u.User.Password()
	if !ok || len(pass) < 20 {
		t.Fatalf("URL() %s carries no password of at least 20 characters", c.URL("postgres"))
	}
	const invalidPassword = "28P01" // SQLSTATE of a refused password
	noPass, wrongPass := *u, *u
	noPass.User = url.User("postgres")
	wrongPass.User = url.UserPassword("postgres", pass[1:]+pass[:1])
	for _, tc := range []struct{ name, dsn string }{
		{"TCP, no password", noPass.String()},
		{"TCP, wrong password", wrongPass.String()},
		{"Unix socket, no password", fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", c.dir, c.Port())},
	} {
		conn, err := pgx.Connect(ctx, tc.dsn)
		if err == nil {
			_ = conn.Close(ctx)
			t.Errorf("%s: connected", tc.name)
			continue
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != invalidPassword {
			t.Errorf("%s: %v; want SQLSTATE %s (invalid_password)", tc.name, err, invalidPassword)
		}
	}

	fi, err := os.Stat(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("cluster dir (and Unix socket dir) %s has mode %v; want no access for group and others", c.dir, perm)
	}
	err = filepath.WalkDir(c.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte(pass)) {
			t.Errorf("%s holds the password", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The newest installed PostgreSQL is taken, by version number.
func TestNewestFirst(t *testing.T) {
	got := newestFirst([]string{
		"/usr/lib/postgresql/15/bin/pg_ctl",
		"/usr/lib/postgresql/9.6/bin/pg_ctl",
		"/usr/lib/postgresql/16/bin/pg_ctl",
	})
	want := []string{
		"/usr/lib/postgresql/16/bin/pg_ctl",
		"/usr/lib/postgresql/15/bin/pg_ctl",
		"/usr/lib/postgresql/9.6/bin/pg_ctl",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("newestFirst: %v, want %v", got, want)
	}
}

// postgres --version gives the major release, whatever follows it.
func TestPostgresMajor(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want int // 0: an error
	}{
		{"postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n", 15},
		{"postgres (PostgreSQL) 9.6.24\n", 9},
		{"postgres (PostgreSQL) 14.0", 14},
		{"postgres (PostgreSQL) 18devel\n", 18},
		{"postgres (PostgreSQL) 17beta1\n", 17},
		{"postgres (PostgreSQL) 10", 10},
		{"postgres (PostgreSQL) devel\n", 0},
		{"postgres 15.4\n", 0},
		{"", 0},
	} {
		got, err := postgresMajor(tc.out)
		if tc.want == 0 {
			if err == nil {
				t.Errorf("postgresMajor(%q) = %d, want an error", tc.out, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("postgresMajor(%q) = %d, %v; want %d", tc.out, got, err, tc.want)
		}
	}
}

// A PostgreSQL older than 15 is passed over for a newer one, and when
// there is none the error names it and says how to provide PostgreSQL.
func TestChoosePostgresBinNeeds15(t *testing.T) {
	majors := map[string]int{"/opt/pg14/bin": 14, "/usr/lib/postgresql/16/bin": 16, "/usr/lib/postgresql/9.6/bin": 9}
	calls := 0
	major := func(dir string) (int, error) {
		calls++
		if m, ok := majors[dir]; ok {
			return m, nil
		}
		return 0, errors.New("exit status 127")
	}
	got, err := choosePostgresBin([]string{"/opt/pg14/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/9.6/bin"}, major)
	if err != nil || got != "/usr/lib/postgresql/16/bin" {
		t.Fatalf("choosePostgresBin = %q, %v; want /usr/lib/postgresql/16/bin", got, err)
	}
	calls = 0
	_, err = choosePostgresBin([]string{"/usr/lib/postgresql/9.6/bin", "/usr/lib/postgresql/9.6/bin", "/broken/bin"}, major)
	if err == nil {
		t.Fatal("only PostgreSQL 9.6 and a broken one: no error")
	}
	for _, w := range []string{"/usr/lib/postgresql/9.6/bin: PostgreSQL 9, older than 15", "/broken/bin: exit status 127", HowToProvidePostgres} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	if calls != 2 {
		t.Errorf("%d versions asked for, want 2 (a directory listed twice is asked once)", calls)
	}
	if _, err := choosePostgresBin(nil, major); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("no binaries: error %v, want one saying they are not found", err)
	}
}

// The installed PostgreSQL, which the other tests run, is found and new
// enough.
func TestFindPostgresBinChecksTheRelease(t *testing.T) {
	dir, err := findPostgresBin()
	if err != nil {
		t.Fatal(err)
	}
	m, err := postgresMajorIn(dir)
	if err != nil || m < minPostgresMajor {
		t.Fatalf("%s: PostgreSQL %d, %v; want %d or newer", dir, m, err, minPostgresMajor)
	}
}

// A directory whose owner file names a live process that started at
// another time than its owner did (its pid was reused) is swept; one whose
// owner is this process stays.
func TestSweepOrphanWithReusedPID(t *testing.T) {
	const prefix = "jetsink-reused-pid-test-"
	orphan := ownedTestDir(t, prefix)
	alive := ownedTestDir(t, prefix)
	start, ok := procStart(os.Getpid())
	if !ok {
		t.Fatal("no start time for this process in /proc")
	}
	b, err := os.ReadFile(filepath.Join(alive, ownerFile))
	if err != nil || string(b) != strconv.Itoa(os.Getpid())+"\n"+start+"\n" {
		t.Fatalf("owner file %q, %v; want this pid and start time %s", b, err, start)
	}
	// Neither lock held: the pid and its start time decide (an owner that
	// took none: an older jetsink).
	if err := orphaned(alive, b, 0o644); err != nil {
		t.Fatal(err)
	}
	reused := strconv.Itoa(os.Getpid()) + "\n1\n" // this pid, but an owner that started at tick 1
	if err := orphaned(orphan, []byte(reused), 0o644); err != nil {
		t.Fatal(err)
	}
	sweepOrphans(prefix, nil)
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("directory of an owner whose pid was reused still there: %v", err)
	}
	if _, err := os.Stat(alive); err != nil {
		t.Fatalf("a live owner's directory was swept: %v", err)
	}
}

// The sweep acts only on directories this user made: a link with the
// prefix, or a directory whose owner file another user wrote, is left
// alone with what it points to, however dead the owner it names.
func TestSweepLeavesOthersDirectories(t *testing.T) {
	const prefix = "jetsink-others-test-"
	dead := []byte(strconv.Itoa(deadPID(t)) + "\n")
	target := t.TempDir()
	if err := os.WriteFile(filepath.Join(target, ownerFile), dead, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(os.TempDir(), prefix+"link")
	_ = os.Remove(link)
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(link) })
	mine := ownedTestDir(t, prefix)
	if err := orphaned(mine, dead, 0o644); err != nil {
		t.Fatal(err)
	}
	var theirs string
	if os.Geteuid() == 0 { // only root can make a file another user owns
		theirs = ownedTestDir(t, prefix)
		if err := orphaned(theirs, dead, 0o644); err != nil { // no lock keeps it
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(theirs, ownerFile), 65534, 65534); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Log("not root: the owner file of another user's directory is not tried")
	}

	sweepOrphans(prefix, nil)
	if _, err := os.Lstat(link); err != nil {
		t.Errorf("a link with the prefix was swept: %v", err)
	}
	if _, err := os.Stat(filepath.Join(target, ownerFile)); err != nil {
		t.Errorf("what a link with the prefix points to was swept: %v", err)
	}
	if theirs != "" {
		if _, err := os.Stat(theirs); err != nil {
			t.Errorf("a directory whose owner file another user wrote was swept: %v", err)
		}
	}
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Errorf("this user's orphaned directory is still there: %v", err)
	}
}

// Servers listen below the kernel's ephemeral port range, where no
// outgoing connection takes their port while they restart.
func TestPortsBelowEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	n, err := StartNATS("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Destroy)
	u, err := url.Parse(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	if low > 2048 && (port >= low || port < 1024) {
		t.Fatalf("nats-server on port %d, want one in [1024, %d)", port, low)
	}
	if low <= 2048 && port <= 0 {
		t.Fatalf("nats-server on port %d", port)
	}
}

// unreachable names the directory above a cluster's that its server's
// user may not pass through (a TMPDIR only root may enter), for initdb's
// error to say what to change.
func TestUnreachableNamesTheClosedDirectory(t *testing.T) {
	// Under /tmp, whatever TMPDIR is: its ancestors must be open to
	// others for the first check.
	base, err := os.MkdirTemp("/tmp", "jetsink-reach-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil { // MkdirTemp's is 0700
		t.Fatal(err)
	}
	closed := filepath.Join(base, "closed")
	dir := filepath.Join(closed, "cluster")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	other := &syscall.Credential{Uid: 65534, Gid: 65534} // owns none of these
	if os.Getuid() == 65534 || os.Getgid() == 65534 {
		t.Fatal("the test runs as nobody, whose access it checks")
	}
	if p, ok := unreachable(dir, other); ok {
		t.Fatalf("unreachable = %s with every directory open to others", p)
	}
	if err := os.Chmod(closed, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(closed, 0o755) })
	if p, ok := unreachable(dir, other); !ok || p != closed {
		t.Fatalf("unreachable = %q, %v; want %s", p, ok, closed)
	}
	mine := &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
	if p, ok := unreachable(dir, mine); ok {
		t.Fatalf("unreachable = %s for the directories' owner", p)
	}
}

// A TMPDIR that the cluster cannot live in is named in the error, with
// what to do: one whose socket path would be too long, and, as root, one
// the postgres user may not enter.
func TestStartPostgresSaysWhyTMPDIRWillNotDo(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if err := os.Mkdir(long, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", long)
	if c, err := startCluster(clusterOptions{}); err == nil || !strings.Contains(err.Error(), "set TMPDIR to a shorter directory") {
		if c != nil {
			_ = c.Destroy()
		}
		t.Fatalf("startCluster in a TMPDIR of %d bytes: %v, want the socket path named", len(long), err)
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the server runs as this user, who may enter TMPDIR")
		return
	}
	// Short, under /tmp whatever TMPDIR is, so that the socket path fits.
	closed, err := os.MkdirTemp("/tmp", "jetsink-closed-") // 0700, root's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(closed) })
	t.Setenv("TMPDIR", closed)
	if c, err := startCluster(clusterOptions{}); err == nil || !strings.Contains(err.Error(), "may not enter") {
		if c != nil {
			_ = c.Destroy()
		}
		t.Fatalf("startCluster in a TMPDIR only root may enter: %v, want it named", err)
	}
}

// ownedTestDir is TempDir(prefix), removed when the test ends.
func ownedTestDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := TempDir(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeOwned(dir) })
	return dir
}

// orphaned writes owner into dir's owner file and lets this process's lock
// on it go: what the owner's death leaves.
func orphaned(dir string, owner []byte, perm os.FileMode) error {
	ownerLocks.mu.Lock()
	if f := ownerLocks.files[dir]; f != nil {
		_ = f.Close()
		delete(ownerLocks.files, dir)
	}
	ownerLocks.mu.Unlock()
	return os.WriteFile(filepath.Join(dir, ownerFile), owner, perm)
}

// A directory whose owner holds its owner file's lock is left alone
// whatever the pid in it says: from another PID namespace sharing the
// temporary directory, the pid may be dead, or another process's, here.
// Once the lock is let go (the owner died), it is swept.
func TestSweepLeavesALockedOwnersDirectory(t *testing.T) {
	const prefix = "jetsink-locked-test-"
	dir := ownedTestDir(t, prefix)
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(deadPID(t))+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sweepOrphans(prefix, nil)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("a locked owner's directory was swept: %v", err)
	}
	if err := orphaned(dir, []byte(strconv.Itoa(deadPID(t))+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sweepOrphans(prefix, nil)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("an unlocked dead owner's directory is still there: %v", err)
	}
}

// Files in a cluster's directory, which the server's user owns, are read
// without following a link, only if regular (a FIFO would hang the read),
// and at most as much as asked: the head, or the tail.
func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "postmaster.pid")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	if b, err := readRegular(link, 100, false); err == nil {
		t.Errorf("read %q through a link", b)
	}
	fifo := filepath.Join(dir, "server.log")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := readRegular(fifo, 100, true); err == nil {
		t.Errorf("read %q from a FIFO", b)
	}
	long := filepath.Join(dir, "long")
	if err := os.WriteFile(long, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tail bool
		want string
	}{{false, "0123"}, {true, "6789"}} {
		if b, err := readRegular(long, 4, tc.tail); err != nil || string(b) != tc.want {
			t.Errorf("readRegular(tail %v) = %q, %v; want %q", tc.tail, b, err, tc.want)
		}
	}
}

// initdb's password file is made anew: a link planted in its place (the
// directory is the server's user's) fails initdb, and the file it points
// to is neither written nor given away.
func TestInitdbPasswordFileFollowsNoLink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{dir: filepath.Join(dir, "cluster")}
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(c.dir, "pwfile")); err != nil {
		t.Fatal(err)
	}
	if err := c.initdb(); err == nil || !strings.Contains(err.Error(), "password file") {
		t.Fatalf("initdb with a link for its password file = %v, want the password file refused", err)
	}
	after, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "root's\n" || after.Sys().(*syscall.Stat_t).Uid != before.Sys().(*syscall.Stat_t).Uid {
		t.Errorf("the link's target was written (%q) or given away", b)
	}
}

// initdb and pg_ctl run in a process group of their own: a Ctrl-C at the
// terminal (SIGINT to the foreground group) reaches jetsink alone, which
// stops the cluster its own way, and not the tool half-way through.
func TestToolsRunInTheirOwnProcessGroup(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "pgid")
	script := "#!/bin/sh\ncut -d' ' -f5 /proc/$$/stat > " + out + "\n"
	if err := os.WriteFile(filepath.Join(dir, "pg_ctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{bin: dir, dir: dir} // no cred: as this user
	if err := c.run(10*time.Second, "pg_ctl"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pgid %q: %v", b, err)
	}
	if pgid == syscall.Getpgrp() {
		t.Fatalf("pg_ctl ran in the test's process group %d", pgid)
	}
}

// A server that died by itself (the OOM killer, a kill -9) is started
// again by Start, and Destroy of it succeeds: Cluster believed it still
// ran, so Start did nothing and Destroy returned pg_ctl's "could not send
// stop signal".
func TestClusterAfterItsServerDied(t *testing.T) {
	c, err := StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy() })
	kill := func() {
		t.Helper()
		pid := c.PID()
		children := childrenOf(t, pid)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Its children end when they see it gone; until then they hold
		// its shared memory, and a new server would not start.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if slices.IndexFunc(append(children, pid), running) < 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the killed server's processes %v still run after 30 s", append(children, pid))
			}
		}
	}
	kill()
	if err := c.Start(); err != nil {
		t.Fatalf("Start after the server died: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("connect after Start: %v", err)
	}
	_ = conn.Close(ctx)
	kill()
	if err := c.Destroy(); err != nil {
		t.Fatalf("Destroy after the server died: %v", err)
	}
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, child)
		}
	}
	return out
}

// running reports whether process pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// A standby follows its primary read-only, and takes writes once promoted
// after the primary crashed.
func TestStandbyFollowsAndPromotes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := StartPostgres()
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = primary.Destroy() })
	sql := func(url, query string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, query)
		return err
	}
	if err := sql(primary.URL("postgres"), "CREATE TABLE t (n int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	standby, err := primary.StartStandby()
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() { _ = standby.Destroy() })
	if standby.Port() == primary.Port() {
		t.Fatalf("standby on the primary's port %d", standby.Port())
	}
	// Synchronous: a commit on the primary returns once the standby has it.
	if err := sql(primary.URL("postgres"), "ALTER SYSTEM SET synchronous_standby_names = '*'"); err != nil {
		t.Fatal(err)
	}
	if err := sql(primary.URL("postgres"), "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	if err := sql(primary.URL("postgres"), "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatal(err)
	}

	count := func() int {
		conn, err := pgx.Connect(ctx, standby.URL("postgres"))
		if err != nil {
			t.Fatalf("connect to standby: %v", err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
			t.Fatalf("read on standby: %v", err)
		}
		return n
	}
	// remote_apply is not asked for: the second row is flushed on the
	// standby, and applied soon after.
	for deadline := time.Now().Add(30 * time.Second); count() < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("standby has %d rows, want 2", count())
		}
	}
	var pgErr *pgconn.PgError
	if err := sql(standby.URL("postgres"), "INSERT INTO t VALUES (3)"); !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("write to the standby: %v, want SQLSTATE 25006", err)
	}

	if err := primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	if err := sql(standby.URL("postgres"), "INSERT INTO t VALUES (3)"); err != nil {
		t.Fatalf("write to the promoted standby: %v", err)
	}
	if n := count(); n != 3 {
		t.Fatalf("promoted standby has %d rows, want 3", n)
	}
}

// ownerChild is set in the process TestServerDiesWithItsOwner starts.
const ownerChild = "JETSINK_TEST_OWNER_CHILD"

// A process that starts the servers and is then killed with SIGKILL (or
// by the OOM killer), so that it removes nothing, takes its PostgreSQL
// server with it: pg_ctl's server, a daemon, ran on with its port and the
// password jetsink demo had printed. What it cannot remove, its
// directories, the next demo or bench (StartNATS(""), then StartPostgres)
// removes.
func TestServerDiesWithItsOwner(t *testing.T) {
	if os.Getenv(ownerChild) == "1" {
		ns, err := StartNATS("")
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		c, err := StartPostgres()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		demo, err := TempDir(DemoDirPrefix)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("ready", c.Port(), c.dir, ns.StoreDir(), demo)
		select {}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestServerDiesWithItsOwner$")
	cmd.Env = append(os.Environ(), ownerChild+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	dieWithParent(cmd.SysProcAttr, syscall.SIGKILL) // should the test binary die first
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	said := make(chan string, 1)
	go func() {
		defer close(said)
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		said <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, r)
	}()
	var line string
	select {
	case line = <-said:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		<-said
		t.Fatal("the child did not start its servers within 2 minutes")
	}
	f := strings.Fields(line)
	if len(f) != 5 || f[0] != "ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		<-said
		t.Fatalf("the child said %q, want ready, the port and its directories", line)
	}
	port, pgDir, natsDir, demoDir := f[1], f[2], f[3], f[4]
	dataDir := filepath.Join(pgDir, "data")
	t.Cleanup(func() { // when the test fails: what the sweep would do
		if stopOrphan(pgDir) {
			_ = os.RemoveAll(pgDir)
		}
		_ = os.RemoveAll(natsDir)
		_ = os.RemoveAll(demoDir)
	})

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	<-said
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
		if err == nil {
			conn.Close()
		}
		procs := processesIn(t, dataDir)
		if err != nil && len(procs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after its owner's SIGKILL, the server's port %s accepts connections (%v) and processes %v run in %s",
				port, err == nil, procs, dataDir)
		}
	}

	sweeps.mu.Lock()
	sweeps.done = nil // as in a new process: the next demo's
	sweeps.mu.Unlock()
	ns, err := StartNATS("")
	if err != nil {
		t.Fatal(err)
	}
	ns.Destroy()
	c, err := StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{pgDir, natsDir, demoDir} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("the dead owner's %s is still there after the next StartNATS and StartPostgres: %v", dir, err)
		}
	}
}

// processesIn lists the processes whose command line names dir, as the
// postmaster's does its data directory.
func processesIn(t *testing.T, dir string) []int {
	t.Helper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // ended meanwhile
		}
		if slices.Contains(strings.Split(string(b), "\x00"), dir) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, pid)
		}
	}
	return out
}

package embedded

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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
	if err := os.WriteFile(filepath.Join(orphan.dir, ownerFile), []byte(strconv.Itoa(dead.Process.Pid)), 0o644); err != nil {
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
	if err := os.WriteFile(filepath.Join(orphan.StoreDir(), ownerFile), []byte(strconv.Itoa(deadPID(t))), 0o644); err != nil {
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

// When pg_ctl start fails although the server came up (as when it gives up
// waiting just before the server is ready), the server is stopped before
// the next attempt and before the directory is removed.
func TestFailedStartLeavesNoServer(t *testing.T) {
	real, err := findPostgresBin()
	if err != nil {
		t.Fatal(err)
	}
	// A bin directory the postgres user can read, whose pg_ctl starts the
	// server and then reports failure, and logs its arguments.
	bin, err := os.MkdirTemp("", "jetsink-pgbin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(bin) })
	if err := os.Chmod(bin, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"initdb", "postgres"} {
		if err := os.Symlink(filepath.Join(real, name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(bin, "starts")
	script := "#!/bin/sh\n" +
		"for a; do last=$a; done\n" +
		"\"" + filepath.Join(real, "pg_ctl") + "\" \"$@\" || exit\n" +
		"[ \"$last\" = start ] || exit 0\n" +
		"echo \"$@\" >>" + log + "\n" +
		"echo 'pg_ctl: server did not start in time (test)' >&2\n" +
		"exit 1\n"
	if err := os.WriteFile(filepath.Join(bin, "pg_ctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	c, err := startCluster(clusterOptions{bin: bin})
	if err == nil {
		_ = c.Destroy()
		t.Fatal("startCluster succeeded with a pg_ctl that always fails to start")
	}
	b, rerr := os.ReadFile(log)
	if rerr != nil {
		t.Fatalf("the server was never started: %v (startCluster: %v)", rerr, err)
	}
	starts := strings.Split(strings.TrimSpace(string(b)), "\n")
	t.Logf("%d starts; startCluster: %.200s", len(starts), err)
	for _, args := range starts {
		f := strings.Fields(args)
		for i, a := range f {
			if a != "-p" || i+1 == len(f) {
				continue
			}
			if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+f[i+1], time.Second); err == nil {
				conn.Close()
				t.Errorf("a server started by a failed pg_ctl start still listens on port %s", f[i+1])
			}
		}
		if strings.Contains(args, pgDirPrefix) {
			dir := args[strings.Index(args, "/"):]
			dir = dir[:strings.Index(dir, "/data")]
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("cluster dir %s still there: %v", dir, err)
			}
		}
	}
}

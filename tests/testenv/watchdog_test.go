package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// watchdogChild, set in a child test binary, has TestWatchdogStopsClusters
// start a cluster, print its server's pid and hang until the binary's
// -timeout panics.
const watchdogChild = "JETSINK_TEST_WATCHDOG_CHILD"

// A test binary that panics at its -timeout leaves no PostgreSQL server
// running: Main's watchdog destroyed the clusters before. pg_ctl runs the
// server as a daemon, which neither the panic nor DieWithTest stops.
func TestWatchdogStopsClusters(t *testing.T) {
	if os.Getenv(watchdogChild) != "" {
		c := NewCluster(t)
		os.Stdout.WriteString(strconv.Itoa(c.PID()) + "\n")
		time.Sleep(time.Hour) // until the panic
		return
	}
	t.Parallel() // waits out the child's timeout
	// 30 s: the watchdog runs 3 s before, and the child's cluster has
	// started long before that.
	child := exec.Command(os.Args[0], "-test.run=^TestWatchdogStopsClusters$", "-test.count=1", "-test.timeout=30s")
	child.Env = append(os.Environ(), watchdogChild+"=1")
	var stderr strings.Builder
	child.Stderr = &stderr
	out, err := child.Output()
	if !strings.Contains(stderr.String(), "panic: test timed out") {
		t.Fatalf("the child test binary did not panic at its timeout (%v):\n%s\n%s", err, out, stderr.String())
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 0 {
		t.Fatalf("the child test binary printed %q, want the pid of its PostgreSQL server; its stderr:\n%s", out, stderr.String())
	}
	deadline := time.Now().Add(10 * time.Second)
	for processRuns(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL) // the others exit when they see the postmaster gone
			t.Fatalf("PostgreSQL server %d still runs after the test binary that started it panicked at its timeout; its stderr:\n%s", pid, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

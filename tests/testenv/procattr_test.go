package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dieWithTestChild, set in a child test binary, has TestDieWithTest start
// a long sleep and exit at once, as a test binary killed by -timeout would.
const dieWithTestChild = "JETSINK_TEST_DIE_WITH_TEST_CHILD"

// A process started with DieWithTest does not outlive the test binary that
// started it and died without stopping it.
func TestDieWithTest(t *testing.T) {
	if os.Getenv(dieWithTestChild) != "" {
		cmd := exec.Command("sleep", "300")
		DieWithTest(cmd)
		if err := cmd.Start(); err != nil {
			fmt.Println("start:", err)
			os.Exit(2)
		}
		fmt.Println(cmd.Process.Pid)
		os.Exit(0) // no Wait, no Kill
	}
	if runtime.GOOS != "linux" {
		t.Log("only Linux has a parent-death signal; DieWithTest does nothing here")
		return
	}
	parent := exec.Command(os.Args[0], "-test.run=^TestDieWithTest$", "-test.count=1")
	parent.Env = append(os.Environ(), dieWithTestChild+"=1")
	out, err := parent.Output()
	if err != nil {
		t.Fatalf("child test binary: %v\n%s", err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("child test binary printed %q, want the pid of its sleep", out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for processRuns(pid) {
		if time.Now().After(deadline) {
			// Only now: once it is gone, its pid may name another process.
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("sleep %d still runs 10 s after the test binary that started it exited", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processRuns reports whether pid names a process that is neither gone nor
// a zombie waiting to be reaped.
func processRuns(pid int) bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if state, ok := strings.CutPrefix(sc.Text(), "State:"); ok {
			return !strings.HasPrefix(strings.TrimSpace(state), "Z")
		}
	}
	return false
}

package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

// pid1Child is set in the process TestSignalsAsPID1 starts.
const pid1Child = "JETSINK_TEST_PID1_CHILD"

// As the first process of a PID namespace (jetsink in its image, which
// has no init), a signal after the last handler's still ends the process,
// with 128 plus its number: the kernel ignores a signal whose action is
// the default there, and Go's runtime then exits 2 (a bad configuration,
// by jetsink's codes).
func TestSignalsAsPID1(t *testing.T) {
	if os.Getenv(pid1Child) == "1" {
		stop := watchSignals(func(os.Signal) { fmt.Println("first") }, func(os.Signal) { fmt.Println("second") })
		defer stop()
		fmt.Println("ready", os.Getpid())
		select {}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestSignalsAsPID1$")
	cmd.Env = append(os.Environ(), pid1Child+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) && os.Geteuid() != 0 {
			testenv.SkipOrFail(t, "a new PID namespace needs root: run it as root, as .ci/run does")
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // reaped by the Wait below, or with the test binary
	said := make(chan string, 4)
	go func() {
		defer close(said)
		for lines := bufio.NewScanner(out); lines.Scan(); {
			said <- lines.Text()
		}
	}()
	// signalUntil sends SIGTERM every repeatWindow until the child says
	// want: one within the window after a handled one is a repeat, and
	// ignored, however slow the machine.
	signalUntil := func(want string) {
		t.Helper()
		tick := time.NewTicker(repeatWindow)
		defer tick.Stop()
		for deadline := time.After(10 * time.Second); ; {
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case line, ok := <-said:
				if !ok || !strings.HasPrefix(line, want) {
					t.Fatalf("the child said %q (open %v), want %q", line, ok, want)
				}
				return
			case <-deadline:
				t.Fatalf("the child did not say %q within 10 s of SIGTERMs", want)
			case <-tick.C:
			}
		}
	}
	if line := <-said; line != "ready 1" {
		t.Fatalf("the child said %q, want %q: its pid in its namespace", line, "ready 1")
	}
	signalUntil("first")
	signalUntil("second")
	// Then SIGTERM until it ends: one that a slow machine's timers still
	// count as a repeat is ignored, as it should be.
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(repeatWindow)
	defer tick.Stop()
	for deadline := time.After(10 * time.Second); ; {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 128+int(syscall.SIGTERM) {
				t.Fatalf("a SIGTERM after the second ended the child with %v, want exit status %d", err, 128+int(syscall.SIGTERM))
			}
			return
		case <-deadline:
			t.Fatal("the child still runs 10 s after the second SIGTERM")
		case <-tick.C:
		}
	}
}

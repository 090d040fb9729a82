package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// watched runs watch on a channel the test fills, with the handlers
// counting their calls.
type watched struct {
	sigs      chan os.Signal
	repeats   chan os.Signal
	handled   chan int // the index of each handler called
	unwatched chan struct{}
	stop      func()
}

func startWatch(t *testing.T, window time.Duration, handlers int) *watched {
	t.Helper()
	w := &watched{
		sigs:      make(chan os.Signal, 4),
		repeats:   make(chan os.Signal, 4),
		handled:   make(chan int, handlers),
		unwatched: make(chan struct{}),
	}
	var once sync.Once
	on := make([]func(os.Signal), handlers)
	for i := range on {
		on[i] = func(os.Signal) { w.handled <- i }
	}
	stop := watch(w.sigs, func(bool) { once.Do(func() { close(w.unwatched) }) }, window,
		func(sig os.Signal) { w.repeats <- sig }, on...)
	var stopped sync.Once
	w.stop = func() { stopped.Do(stop) }
	t.Cleanup(w.stop)
	return w
}

func (w *watched) wantHandled(t *testing.T, want int) {
	t.Helper()
	select {
	case i := <-w.handled:
		if i != want {
			t.Fatalf("handler %d called, want %d", i, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("handler %d not called", want)
	}
}

// timeout(1) sends its signal to jetsink and to jetsink's process group: a
// second SIGTERM right behind the first is the same one, and must not cut
// the drain short.
func TestRepeatedSignalIsTakenAsOne(t *testing.T) {
	w := startWatch(t, time.Hour, 2)
	w.sigs <- syscall.SIGTERM
	w.sigs <- syscall.SIGTERM
	w.wantHandled(t, 0)
	select {
	case <-w.repeats:
	case i := <-w.handled:
		t.Fatalf("the repeat called handler %d", i)
	case <-time.After(10 * time.Second):
		t.Fatal("the repeat was not seen")
	}
	select {
	case <-w.unwatched:
		t.Fatal("stopped catching signals with a handler left")
	default:
	}
}

// Past the window, the next signal is the second one; and once the last
// handler has run, jetsink stops catching signals when its repeats can no
// longer come, so that one more ends the process.
func TestSecondSignalPastTheWindow(t *testing.T) {
	w := startWatch(t, 0, 2)
	w.sigs <- syscall.SIGINT
	w.wantHandled(t, 0)
	w.sigs <- syscall.SIGINT
	w.wantHandled(t, 1)
	select {
	case <-w.unwatched:
	case <-time.After(10 * time.Second):
		t.Fatal("still catching signals after the last handler")
	}
}

// With one handler (check, init, publish), a repeat of the signal that ran
// it is swallowed too, rather than ending the process before the handler's
// cancellation has been seen through.
func TestRepeatAfterTheLastHandler(t *testing.T) {
	w := startWatch(t, time.Hour, 1)
	w.sigs <- syscall.SIGINT
	w.wantHandled(t, 0)
	w.sigs <- syscall.SIGINT
	select {
	case <-w.repeats:
	case <-time.After(10 * time.Second):
		t.Fatal("the repeat was not seen")
	}
	select {
	case <-w.unwatched:
		t.Fatal("stopped catching signals within the window: the repeat would have ended the process")
	default:
	}
	w.stop()
	select {
	case <-w.unwatched:
	default:
		t.Fatal("stop did not stop catching signals")
	}
}

// The last handler may hang (a drain that does not end, a log write to a
// full pipe): catching stops anyway, window after its signal came, so that
// one more signal ends the process.
func TestLastHandlerThatHangsStillLetsGo(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	unwatched, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stop := watch(sigs, func(bool) { once.Do(func() { close(unwatched) }) }, 10*time.Millisecond, nil,
		func(os.Signal) { <-release })
	defer stop()
	defer close(release)
	sigs <- syscall.SIGTERM
	select {
	case <-unwatched:
	case <-time.After(10 * time.Second):
		t.Fatal("still catching signals while the last handler hangs")
	}
}

// pipeChild is set in the environment of TestClosedStderrIsNoDeath's child.
const pipeChild = "JETSINK_TEST_PIPE_CHILD"

// A write to a stderr nobody reads any more (`jetsink run 2>&1 | tee`,
// tee gone with the same Ctrl-C) fails with EPIPE; it does not end
// jetsink by SIGPIPE before its drain.
func TestClosedStderrIsNoDeath(t *testing.T) {
	if os.Getenv(pipeChild) == "1" {
		survivePipes()
		fmt.Println("ready")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		_, err := fmt.Fprintln(os.Stderr, "jetsink: interrupt: draining")
		fmt.Println("survived:", err)
		os.Exit(0)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestClosedStderrIsNoDeath$")
	cmd.Env = append(os.Environ(), pipeChild+"=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errOut, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	_ = errOut.Close() // the reader gone: the child's next write to stderr gets a broken pipe
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("the child said %q, want ready", lines.Text())
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	said := ""
	if lines.Scan() {
		said = lines.Text()
	}
	werr := cmd.Wait()
	if !strings.HasPrefix(said, "survived:") || !strings.Contains(said, "broken pipe") || werr != nil {
		t.Fatalf("the child said %q and ended with %v; want it to survive the write with EPIPE", said, werr)
	}
}

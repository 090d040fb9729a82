package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetsink/jetsink/bench"
	"github.com/jetsink/jetsink/config"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1   // a runtime failure
	exitConfig  = 2   // bad flags or configuration
	exitAborted = 130 // a second signal, or the drain timeout, cut the drain short (also after a runtime failure, which is printed too)
)

func main() {
	survivePipes()
	os.Exit(exitCode(execute(context.Background(), newRoot())))
}

// survivePipes makes a write to a closed stdout or stderr fail with EPIPE
// instead of killing the process: `jetsink run 2>&1 | tee run.log` and
// Ctrl-C signal tee too, which exits first, and jetsink's first log line
// of the drain would end it by SIGPIPE, the drain not run (at-least-once:
// rows committed and not acked come again) and demo's PostgreSQL left
// running. Notify, not Ignore: an ignored signal stays ignored in the
// processes jetsink starts (pg_ctl, postgres, bench's engines).
func survivePipes() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}

// isOutputClosed reports whether err is only that stdout's reader went
// away (a command's own error beside it is still reported).
func isOutputClosed(err error) bool {
	_, ok := err.(outputClosed)
	return ok
}

func exitCode(err error) int {
	say := func(code int, problems ...error) {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "jetsink:", p)
		}
	}
	// A command that logs in JSON (jsonLogged, maybe joined by execute
	// with stdout's failure) has its exit written as one record of that
	// log; several problems of a configuration go in one record too, so
	// that one exit reads as one.
	var jl jsonLogged
	if errors.As(err, &jl) {
		if _, outer := err.(jsonLogged); outer {
			err = jl.err
		}
		say = func(code int, problems ...error) {
			args := []any{"err", err.Error(), "exit_code", code}
			if len(problems) > 1 {
				texts := make([]string, len(problems))
				for i, p := range problems {
					texts[i] = p.Error()
				}
				args = []any{"err", fmt.Sprintf("%d problems in the configuration", len(problems)), "problems", texts, "exit_code", code}
			}
			jl.log.Error("exiting", args...)
		}
	}
	var usage usageError
	switch {
	case err == nil:
		return exitOK
	case isOutputClosed(err):
		return exitFailed // its reader has gone: nobody to tell
	case errors.Is(err, errAborted):
		say(exitAborted, err)
		return exitAborted
	case errors.Is(err, config.ErrInvalidConfig), errors.As(err, &usage), isSectionConfigError(err),
		errors.Is(err, bench.ErrInvalidOptions):
		say(exitConfig, config.Problems(err)...) // each key at fault on a line of its own
		return exitConfig
	default:
		say(exitFailed, err)
		return exitFailed
	}
}

// jsonLogged is the error of a command whose log is JSON (log.format:
// json): exitCode writes it as a record of that log (msg "exiting", err,
// exit_code), so that a pipeline parsing each line of stderr as JSON gets
// why jetsink exited too; written as text it was a line that pipeline
// could not parse, or two (pgx's errors span lines), the one line an
// operator of a crash-looping jetsink looks for.
type jsonLogged struct {
	err error
	log *slog.Logger
}

func (e jsonLogged) Error() string { return e.err.Error() }
func (e jsonLogged) Unwrap() error { return e.err }

// logExitAs makes *err, if any, a jsonLogged when cfg's log is JSON.
// Deferred by the commands that log, once their logger is made.
func logExitAs(cfg config.Config, log *slog.Logger, err *error) {
	if *err != nil && cfg.Log.Format == "json" {
		*err = jsonLogged{*err, log}
	}
}

// signalStages returns contexts under cmd's that the first and the second
// stop signal (SIGINT, SIGTERM, SIGHUP: stopSignals) end: intake with "stopped by <signal>", hard with
// errAborted. Each signal is announced on cmd's stderr with first or
// second. Call stop when done.
func signalStages(cmd *cobra.Command, first, second string) (intake, hard context.Context, stop func()) {
	intake, stopIntake := context.WithCancelCause(cmd.Context())
	hard, stopHard := context.WithCancelCause(cmd.Context())
	errOut := cmd.ErrOrStderr()
	stopWatch := watchSignals(func(sig os.Signal) {
		fmt.Fprintf(errOut, "jetsink: %s: %s\n", sig, first)
		stopIntake(fmt.Errorf("stopped by %s", sig))
	}, func(sig os.Signal) {
		fmt.Fprintf(errOut, "jetsink: second %s: %s\n", sig, second)
		stopHard(fmt.Errorf("%w by a second signal (%s)", errAborted, sig))
	})
	return intake, hard, func() {
		stopWatch()
		stopIntake(nil)
		stopHard(nil)
	}
}

// cancelOnSignal returns a context under cmd's that the first stop signal
// (stopSignals) cancels, with cause "stopped by <signal>", announced on cmd's
// stderr with what (a record of cfg's log when that is JSON, as run's
// announcements are); jetsink then stops catching them, so that a second one
// ends the process. Call stop when done.
func cancelOnSignal(cmd *cobra.Command, what string, cfg config.Config, log *slog.Logger) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(cmd.Context())
	errOut := cmd.ErrOrStderr()
	stopWatch := watchSignals(func(sig os.Signal) {
		if cfg.Log.Format == "json" {
			log.Info(what+"; a second signal exits at once", "signal", sig.String())
		} else {
			fmt.Fprintf(errOut, "jetsink: %s: %s; a second signal exits at once\n", sig, what)
		}
		cancel(fmt.Errorf("stopped by %s", sig))
	})
	return ctx, func() {
		stopWatch()
		cancel(nil)
	}
}

// watchSignals catches the stop signals (stopSignals) until stop is called: the first
// calls on[0], the next on[1], and so on. A signal that comes within
// repeatWindow of the return of the handler before is taken as that one's
// repeat, and ignored. The last handler's signal stops the catching
// repeatWindow after it came (in the meantime its repeats are ignored), so
// that one more ends the process as if jetsink caught nothing: the way out
// when what the last handler cancels does not return, or the handler
// itself hangs (as PID 1, where that would not work, it exits with 128
// plus the signal's number: exitOnSignal). stop waits for the watching
// goroutine.
func watchSignals(on ...func(os.Signal)) (stop func()) {
	var arm sync.Once
	sigs := make(chan os.Signal, len(on)+1)
	signal.Notify(sigs, stopSignals()...)
	unwatch := func(released bool) {
		if released && os.Getpid() == 1 {
			arm.Do(exitOnSignal) // before the Stop: no signal falls between
		}
		signal.Stop(sigs)
	}
	return watch(sigs, unwatch, repeatWindow, nil, on...)
}

// stopSignals are the signals that stop jetsink as SIGINT does: SIGTERM,
// and SIGHUP (the terminal closed), unless it is ignored (nohup): Notify
// would make it stop jetsink then too. Uncaught, SIGHUP ended jetsink at
// once: no drain, and demo's PostgreSQL left running.
func stopSignals() []os.Signal {
	sigs := []os.Signal{syscall.SIGINT, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		sigs = append(sigs, syscall.SIGHUP)
	}
	return sigs
}

// exitOnSignal has the next stop signal (stopSignals) exit with 128 plus its
// number, as a shell reports a process a signal ended. For the first
// process of a PID namespace (jetsink in its image, which has no init):
// the kernel ignores a signal whose action is the default there, and Go's
// runtime, whose re-raise of the signal then does nothing, exits 2, which
// by jetsink's codes says the configuration is bad.
func exitOnSignal() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, stopSignals()...)
	go func() { os.Exit(128 + int((<-c).(syscall.Signal))) }()
}

// repeatWindow is how soon after a signal another one counts as a repeat
// of it. timeout(1) sends its signal to jetsink and then to the process
// group jetsink is in: when the two arrive apart, the second would cut
// short the drain the first began. Two presses of Ctrl-C are further apart
// than this.
const repeatWindow = 100 * time.Millisecond

// watch is watchSignals on sigs: unwatch stops the signals (released:
// window after the last handler's signal came; or at stop: it may run
// twice, at once), and
// repeated, if not nil, is told of each repeat ignored.
func watch(sigs <-chan os.Signal, unwatch func(released bool), window time.Duration, repeated func(os.Signal), on ...func(os.Signal)) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	var release *time.Timer // the last handler's: unwatch, window after its signal
	go func() {
		defer close(exited)
		var handled time.Time // when the last handler returned
		for i := 0; ; {
			select {
			case sig := <-sigs:
				// After the last handler, every signal read came
				// before release unwatched: within the window.
				if i == len(on) || i > 0 && time.Since(handled) < window {
					if repeated != nil {
						repeated(sig)
					}
					continue
				}
				if i == len(on)-1 {
					// Armed before the handler runs, on a timer of its
					// own: a handler that hangs does not hold it up.
					release = time.AfterFunc(window, func() { unwatch(true) })
				}
				on[i](sig)
				handled = time.Now()
				i++
			case <-done:
				return
			}
		}
	}()
	return func() {
		unwatch(false)
		close(done)
		<-exited
		if release != nil {
			release.Stop()
		}
	}
}

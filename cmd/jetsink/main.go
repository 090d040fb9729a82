// Command jetsink moves events from NATS JetStream into PostgreSQL.
// See `jetsink --help` and the README.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jetsink/jetsink/config"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1   // a runtime failure
	exitConfig  = 2   // bad flags or configuration
	exitAborted = 130 // a second signal, or the drain timeout, cut the drain short
)

func main() {
	err := newRoot().ExecuteContext(context.Background())
	os.Exit(exitCode(err))
}

func exitCode(err error) int {
	var usage usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errAborted):
		fmt.Fprintln(os.Stderr, "jetsink:", err)
		return exitAborted
	case errors.Is(err, config.ErrInvalidConfig), errors.As(err, &usage), isSectionConfigError(err):
		fmt.Fprintln(os.Stderr, "jetsink:", err)
		return exitConfig
	default:
		fmt.Fprintln(os.Stderr, "jetsink:", err)
		return exitFailed
	}
}

// watchSignals catches SIGINT and SIGTERM until stop is called: the first
// calls first, the second calls second and stops catching, so that a third
// ends the process as if jetsink caught nothing (the way out when what
// second cancels does not return). stop waits for the watching goroutine.
func watchSignals(first, second func(os.Signal)) (stop func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for i, f := range []func(os.Signal){first, second} {
			select {
			case sig := <-sigs:
				if i == 1 {
					signal.Stop(sigs)
				}
				f(sig)
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
		<-exited
	}
}

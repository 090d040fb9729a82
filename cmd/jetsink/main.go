// Command jetsink moves events from NATS JetStream into PostgreSQL.
// See `jetsink --help` and the README.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

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

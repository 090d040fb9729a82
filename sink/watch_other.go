//go:build !linux

package sink

import (
	"syscall"
	"time"
)

// canWatch: off Linux, connections are not watched (README, "A server that
// vanishes"): the kernel's TCP_INFO, with the time of the last
// acknowledgement and the probes unanswered, is Linux's (macOS's
// TCP_CONNECTION_INFO and the BSDs' differ and are not read here), so a
// vanished server is noticed when the kernel gives the connection up.
const canWatch = false

// silentFor is never called off Linux (canWatch).
func silentFor(syscall.RawConn, time.Duration, time.Duration) bool { return false }

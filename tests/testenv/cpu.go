package testenv

import (
	"syscall"
	"testing"
	"time"
)

// ProcessCPU is the CPU time (user + system) this process has used so far:
// with an embedded nats-server, the server's too. Benchmarks report it per
// message, which wall time on a shared 2-core machine hides.
func ProcessCPU(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

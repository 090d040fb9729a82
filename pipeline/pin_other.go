//go:build !linux

package pipeline

import (
	"errors"
	"runtime"
)

// errNoAffinity is why pipeline.pin: cpu is refused off Linux: binding a
// thread to a CPU is Linux's sched_setaffinity (macOS has no such call, and
// the BSDs' and Windows' are not used here).
var errNoAffinity = errors.New("binding threads to CPUs is supported on Linux only (" + runtime.GOOS + ")")

// pinToCPU is never reached off Linux: New refuses pipeline.pin: cpu there,
// since allowedCPUs fails.
func pinToCPU(int, int) (func(), error) { return nil, errNoAffinity }

// allowedCPUs fails off Linux; PhysicalCores then falls back to GOMAXPROCS.
func allowedCPUs() ([]int, error) { return nil, errNoAffinity }

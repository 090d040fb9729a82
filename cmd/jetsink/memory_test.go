package main

import (
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/jetsink/jetsink/config"
)

// unsetenv removes name for this test and restores it afterwards.
func unsetenv(t *testing.T, name string) {
	t.Setenv(name, "") // registers the restore
	if err := os.Unsetenv(name); err != nil {
		t.Fatal(err)
	}
}

// restoreGC puts the runtime's memory limit and GOGC back after the test.
func restoreGC(t *testing.T) {
	limit, gc := debug.SetMemoryLimit(-1), debug.SetGCPercent(100)
	debug.SetGCPercent(gc)
	t.Cleanup(func() {
		debug.SetMemoryLimit(limit)
		debug.SetGCPercent(gc)
	})
}

func TestApplyMemoryLimit(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Run("sets limit and GOGC", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		unsetenv(t, "GOGC")
		debug.SetMemoryLimit(math.MaxInt64)
		applyMemoryLimit(40<<20, log)()
		if got := debug.SetMemoryLimit(-1); got != 40<<20 {
			t.Errorf("memory limit %d, want %d", got, 40<<20)
		}
		if got := debug.SetGCPercent(100); got != gcPercentWithLimit {
			t.Errorf("GOGC %d, want %d", got, gcPercentWithLimit)
		}
	})
	t.Run("GOMEMLIMIT wins", func(t *testing.T) {
		restoreGC(t)
		t.Setenv("GOMEMLIMIT", "1GiB")
		debug.SetMemoryLimit(math.MaxInt64)
		applyMemoryLimit(40<<20, log)()
		if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
			t.Errorf("memory limit %d, want it left alone", got)
		}
	})
	t.Run("GOGC wins", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		t.Setenv("GOGC", "150")
		debug.SetGCPercent(150) // what the runtime did with it at start
		applyMemoryLimit(40<<20, log)()
		if got := debug.SetGCPercent(100); got != 150 {
			t.Errorf("GOGC %d, want GOGC's 150 left alone", got)
		}
	})
	t.Run("auto sets the floor and GOGC", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		unsetenv(t, "GOGC")
		debug.SetMemoryLimit(math.MaxInt64)
		stop := applyMemoryLimit(config.MemoryLimitAuto, log)
		defer stop()
		// The floor, or more if this test binary's live heap needs it.
		if got := debug.SetMemoryLimit(-1); got < autoLimitFloor || got == math.MaxInt64 {
			t.Errorf("memory limit %d, want at least the floor %d", got, autoLimitFloor)
		}
		if got := debug.SetGCPercent(100); got != gcPercentWithLimit {
			t.Errorf("GOGC %d, want %d", got, gcPercentWithLimit)
		}
	})
	t.Run("zero does nothing", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		debug.SetMemoryLimit(math.MaxInt64)
		applyMemoryLimit(0, log)()
		if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
			t.Errorf("memory limit %d, want none", got)
		}
	})
}

func TestAutoLimitFormula(t *testing.T) {
	a := &autoLimit{floor: 40 << 20}
	cases := []struct {
		name string
		m    memStats
		want int64
	}{
		{"small heap: the floor", memStats{live: 8 << 20, nonHeap: 12 << 20}, 40 << 20},
		{"at the floor", memStats{live: 15 << 20, nonHeap: 10 << 20}, 40 << 20},
		{"large heap: room to double", memStats{live: 100 << 20, nonHeap: 30 << 20}, 230 << 20},
	}
	for _, c := range cases {
		if got := a.limit(c.m); got != c.want {
			t.Errorf("%s: limit %d MiB, want %d MiB", c.name, got>>20, c.want>>20)
		}
	}
}

// TestAutoLimitFollowsTheLiveHeap runs the real mechanism (a cleanup after
// each collection, runtime/metrics) with the limit recorded instead of
// applied: the limit rises above a live heap that outgrows the floor,
// comes back to the floor when the heap is freed, and stays put once
// stopped.
func TestAutoLimitFollowsTheLiveHeap(t *testing.T) {
	const floor = 16 << 20
	limits := make(chan int64, 64)
	a := &autoLimit{floor: floor, set: func(int64) int64 { return 0 }}
	a.after = func(l int64) {
		select {
		case limits <- l:
		default:
		}
	}
	a.arm()
	defer a.stop()

	// waitFor collects until a limit satisfies ok, forcing collections.
	waitFor := func(what string, ok func(int64) bool) int64 {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			runtime.GC()
			select {
			case l := <-limits:
				if ok(l) {
					return l
				}
			case <-time.After(50 * time.Millisecond):
			case <-deadline:
				t.Fatalf("no limit %s within 10s", what)
			}
		}
	}
	const big = 64 << 20
	ballast := make([]byte, big)
	for i := 0; i < len(ballast); i += 4096 {
		ballast[i] = 1
	}
	l := waitFor("of twice a 64 MiB live heap", func(l int64) bool { return l >= 2*big })
	runtime.KeepAlive(ballast)
	t.Logf("with 64 MiB live: limit %d MiB", l>>20)
	ballast = nil
	waitFor("back at the floor", func(l int64) bool { return l == floor })

	a.stop()
	for len(limits) > 0 {
		<-limits
	}
	for range 3 {
		runtime.GC()
	}
	time.Sleep(50 * time.Millisecond)
	if len(limits) != 0 {
		t.Errorf("limit still updated after stop: %d", <-limits)
	}
}

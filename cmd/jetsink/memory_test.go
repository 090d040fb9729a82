package main

import (
	"io"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"testing"
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
		applyMemoryLimit(40<<20, log)
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
		applyMemoryLimit(40<<20, log)
		if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
			t.Errorf("memory limit %d, want it left alone", got)
		}
	})
	t.Run("GOGC wins", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		t.Setenv("GOGC", "150")
		debug.SetGCPercent(150) // what the runtime did with it at start
		applyMemoryLimit(40<<20, log)
		if got := debug.SetGCPercent(100); got != 150 {
			t.Errorf("GOGC %d, want GOGC's 150 left alone", got)
		}
	})
	t.Run("zero does nothing", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		debug.SetMemoryLimit(math.MaxInt64)
		applyMemoryLimit(0, log)
		if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
			t.Errorf("memory limit %d, want none", got)
		}
	})
}

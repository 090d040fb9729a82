package main

import (
	"log/slog"
	"os"
	"runtime/debug"
)

// gcPercentWithLimit is GOGC under a memory limit: with the limit capping
// the heap, the collector can wait for 4x the live heap before running,
// which in a drain cut jetsink's CPU per event (BENCHMARKS.md, "GC").
const gcPercentWithLimit = 400

// applyMemoryLimit sets the Go soft memory limit from memory_limit, and
// raises GOGC with it, unless GOMEMLIMIT / GOGC are set (the runtime has
// already applied those). It logs what is in force.
func applyMemoryLimit(limit int64, log *slog.Logger) {
	_, envLimit := os.LookupEnv("GOMEMLIMIT")
	_, envGC := os.LookupEnv("GOGC")
	if limit > 0 && !envLimit {
		debug.SetMemoryLimit(limit)
		if !envGC {
			debug.SetGCPercent(gcPercentWithLimit)
		}
	}
	cur := debug.SetMemoryLimit(-1) // -1 reads without changing
	gc := debug.SetGCPercent(-1)
	debug.SetGCPercent(gc)
	if cur != int64(^uint64(0)>>1) || gc != 100 {
		log.Info("memory", "soft_limit_bytes", cur, "gogc", gc)
	}
}

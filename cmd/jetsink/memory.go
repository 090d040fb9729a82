package main

import (
	"log/slog"
	"os"
	"runtime/debug"
)

// gcPercentWithLimit is GOGC under a memory limit: with the limit capping
// the heap, the collector can wait for 4x the live heap before running,
// which in a drain cut jetsink's CPU per event (BENCHMARKS.md, "GC and
// memory").
const gcPercentWithLimit = 400

// applyMemoryLimit sets the Go soft memory limit from memory_limit, and
// GOGC 400 with it, unless GOMEMLIMIT / GOGC are set (the runtime has
// already applied those). It logs what it did.
func applyMemoryLimit(limit int64, log *slog.Logger) {
	if limit <= 0 {
		return
	}
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Info("memory_limit not applied: GOMEMLIMIT is set", "GOMEMLIMIT", v)
		return
	}
	debug.SetMemoryLimit(limit)
	gogc, ok := os.LookupEnv("GOGC")
	if !ok {
		debug.SetGCPercent(gcPercentWithLimit)
		gogc = "400"
	}
	log.Info("memory", "soft_limit_bytes", limit, "gogc", gogc)
}

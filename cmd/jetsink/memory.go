package main

import (
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"

	"github.com/jetsink/jetsink/config"
)

// gcPercentWithLimit is GOGC under a memory limit: with the limit capping
// the heap, the collector can wait for 4x the live heap before running,
// which in a drain cut jetsink's CPU per event (BENCHMARKS.md, "GC and
// memory").
const gcPercentWithLimit = 400

// autoLimitFloor is the soft limit memory_limit: auto keeps while the live
// heap is small. With it, the 1M-event bench drain (180-byte events) peaked
// at 60-62 MiB RSS against 67-72 MiB with no limit, and used less CPU
// (BENCHMARKS.md).
const autoLimitFloor = 40 << 20

// applyMemoryLimit sets the Go soft memory limit from memory_limit, and
// GOGC 400 with it, unless GOMEMLIMIT / GOGC are set (the runtime has
// already applied those). It logs what it did. For config.MemoryLimitAuto
// it starts an autoLimit; the returned stop ends it (and is a no-op
// otherwise).
func applyMemoryLimit(limit int64, log *slog.Logger) (stop func()) {
	stop = func() {}
	if limit == 0 {
		return stop
	}
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Info("memory_limit not applied: GOMEMLIMIT is set", "GOMEMLIMIT", v)
		return stop
	}
	gogc, ok := os.LookupEnv("GOGC")
	if !ok {
		debug.SetGCPercent(gcPercentWithLimit)
		gogc = "400"
	}
	if limit == config.MemoryLimitAuto {
		a := startAutoLimit(autoLimitFloor)
		log.Info("memory", "soft_limit", "auto", "floor_bytes", autoLimitFloor, "gogc", gogc)
		return a.stop
	}
	debug.SetMemoryLimit(limit)
	log.Info("memory", "soft_limit_bytes", limit, "gogc", gogc)
	return stop
}

// autoLimit keeps Go's soft memory limit at
//
//	max(floor, the runtime's memory outside the heap + 2 x the live heap)
//
// recomputing it after every collection. While the live heap is small the
// floor binds, and GOGC 400 under it makes the collector run far less often
// than Go's default (GOGC 100 on a small heap collects every few MiB
// allocated; nats.go allocates ~1.2 KiB per message). When the live heap
// grows (large events, a large max_ack_pending) the limit moves up with it,
// leaving room for the heap to double, as GOGC 100 would: a fixed limit
// below the live heap would make the collector run back to back, and this
// one never lets it run more often than Go's default.
type autoLimit struct {
	floor   int64
	stopped atomic.Bool
	// set applies a limit; debug.SetMemoryLimit outside tests.
	set func(int64) int64
	// after is called after each update (tests).
	after func(limit int64)
}

// sentinel is allocated once per cycle; its cleanup runs after a collection
// found it unreachable. It holds a pointer so that it is not a tiny
// allocation (those share blocks and are freed late).
type sentinel struct {
	_ *int
	_ [2]uint64
}

func startAutoLimit(floor int64) *autoLimit {
	a := &autoLimit{floor: floor, set: debug.SetMemoryLimit}
	a.set(floor)
	a.arm()
	return a
}

// arm plants the sentinel whose cleanup runs after the next collection.
func (a *autoLimit) arm() {
	runtime.AddCleanup(&sentinel{}, (*autoLimit).collected, a)
}

// collected runs on the runtime's cleanup goroutine after a collection.
func (a *autoLimit) collected() {
	if a.stopped.Load() {
		return
	}
	m := readMemStats()
	limit := a.limit(m)
	a.set(limit)
	if a.after != nil {
		a.after(limit)
	}
	a.arm()
}

// stop ends the updates; the last limit stays.
func (a *autoLimit) stop() { a.stopped.Store(true) }

// memStats is what autoLimit reads after a collection.
type memStats struct {
	live    uint64 // live heap marked by the last collection
	nonHeap uint64 // what the runtime maps besides heap spans: stacks, metadata, buffers
}

var memSamples = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
}

func readMemStats() memStats {
	s := make([]metrics.Sample, len(memSamples))
	for i, name := range memSamples {
		s[i].Name = name
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	// Heap spans (objects, live or not yet swept, their unused tails, free
	// and released pages) are left out: right after a collection most of
	// them are garbage not yet swept, which says nothing of what the heap
	// needs.
	total, heap := v(1), v(2)+v(3)+v(4)+v(5)
	return memStats{live: v(0), nonHeap: total - min(total, heap)}
}

// limit is the soft limit for m: the floor, or room for the live heap to
// double on top of the runtime's other memory, whichever is larger.
func (a *autoLimit) limit(m memStats) int64 {
	want := m.nonHeap + 2*m.live
	if want > uint64(a.floor) {
		return int64(min(want, 1<<62))
	}
	return a.floor
}

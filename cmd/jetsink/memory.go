package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"

	"github.com/jetsink/jetsink/config"
)

// gcPercentWithLimit is GOGC under a fixed memory limit: with the limit
// capping the heap, the collector can wait for 4x the live heap before
// running, which in a drain cut jetsink's CPU per event (BENCHMARKS.md, "GC
// and memory").
const gcPercentWithLimit = 400

// autoHeapGoal is the heap size at which memory_limit: auto lets the
// collector run while the live heap is small (below 2/3 of it).
const autoHeapGoal = 32 << 20

// goHeapMinimum is Go's smallest heap goal at GOGC 100. At other settings it
// scales with GOGC: 4 MiB x GOGC/100 (heapMinimum in the runtime's
// mgcpacer.go), however small the live heap. (A toolchain built with
// GOEXPERIMENT=heapminimum512kib uses 512 KiB; there the cap below lets a
// tiny live heap collect earlier than at 32 MiB, never later.)
const goHeapMinimum = 4 << 20

// GOGC bounds for memory_limit: auto. The lower bound, 50, lets the heap
// grow to 1.5x the live heap once that exceeds autoHeapGoal (live ~21 MiB
// and more), where Go's default (100) lets it double: in the bench drain
// the live heap peaks when the sink is briefly behind, and 50 took 9.4 MiB
// off jetsink's peak RSS, with no CPU cost that 10 paired drains could
// resolve (BENCHMARKS.md, session 7). The price: from 16 MiB live a
// collection comes sooner than at Go's default, and from ~21 MiB twice as
// often, so the collector's work per allocated byte doubles there; when
// large events or a large max_ack_pending keep the live heap there for a
// whole backlog, that lasts, and mark assists slow the allocating
// goroutines (nats.go's reader first). memory_limit: 0 gives Go's default
// back. The upper bound keeps Go's minimum heap goal at
// autoHeapGoal (GOGC 800 for 32 MiB): with more, a small live heap (at
// start, or after a quiet spell) would let the heap grow past autoHeapGoal
// before the next collection, to 40 MiB at GOGC 1000.
const (
	autoMinGCPercent = 50
	autoMaxGCPercent = 100 * autoHeapGoal / goHeapMinimum
)

// The soft memory limit that memory_limit: auto sets under a cgroup's
// limit (readCgroupLimit), as a backstop: 90% of it, less 24 MiB, at least
// 16 MiB (the smallest size memory_limit takes). Go's limit counts the
// heap, stacks and the runtime's own data, not the binary's ~24 MiB of
// resident pages, which the cgroup charges; the other 10% is for what Go
// does not count either (the kernel's socket buffers, page cache) and for
// the overshoot of a soft limit. 256 MiB gives 206 MiB, where the bench
// drain peaks at 61-64 MiB of RSS: the limit is reached only when the live
// heap grows (the sink behind with large events) and then makes the
// collector work harder instead of the kernel killing the process.
const (
	cgroupSharePercent = 90
	binaryResident     = 24 << 20
	minSoftLimit       = 16 << 20
)

// softLimitUnder is the soft memory limit that auto sets under a cgroup
// limit of cg bytes.
func softLimitUnder(cg int64) int64 {
	return max(cg/100*cgroupSharePercent-binaryResident, minSoftLimit)
}

// applyMemoryLimit applies memory_limit, unless GOMEMLIMIT is set (the
// runtime has already applied it), reading the process's cgroup for auto.
// See applyMemoryLimitIn.
func applyMemoryLimit(limit int64, log *slog.Logger) (stop func()) {
	return applyMemoryLimitIn("/", limit, log)
}

// applyMemoryLimitIn applies memory_limit, unless GOMEMLIMIT or GOGC are set
// (the runtime has already applied those; a memory limit still applies
// under GOGC): a size sets Go's soft memory limit and GOGC 400 with it;
// config.MemoryLimitAuto sets a soft limit under the cgroup's memory limit
// (softLimitUnder; none if readCgroupLimit, reading under root, finds none
// or fails, which it logs at Debug) and starts a gcTuner; 0 leaves Go's
// defaults. It logs what it did. The returned stop ends the tuner (a no-op
// otherwise).
func applyMemoryLimitIn(root string, limit int64, log *slog.Logger) (stop func()) {
	stop = func() {}
	if limit == 0 {
		return stop
	}
	// Empty counts as unset, as the runtime reads them (compose and Helm
	// templates often pass GOMEMLIMIT: ${GOMEMLIMIT:-}).
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		log.Info("memory_limit not applied: GOMEMLIMIT is set", "GOMEMLIMIT", v)
		return stop
	}
	gogc := os.Getenv("GOGC")
	gogcSet := gogc != ""
	if limit == config.MemoryLimitAuto {
		attrs := []any{"memory_limit", "auto"}
		cg, err := readCgroupLimit(root)
		if err != nil {
			log.Debug("memory_limit auto: no cgroup memory limit read", "err", err)
		}
		if cg.bytes > 0 {
			soft := softLimitUnder(cg.bytes)
			debug.SetMemoryLimit(soft)
			attrs = append(attrs, "soft_limit_bytes", soft, "cgroup_limit_bytes", cg.bytes,
				"soft_limit", fmt.Sprintf("%s: %d%% of the cgroup's %s, less %s (%s)",
					mib(soft), cgroupSharePercent, mib(cg.bytes), mib(binaryResident), cg.file))
		} else {
			attrs = append(attrs, "cgroup_limit", "none")
		}
		if gogcSet {
			log.Info("memory: GOGC is set, so memory_limit auto does not tune it", append(attrs, "GOGC", gogc)...)
			return stop
		}
		t := startGCTuner(autoHeapGoal)
		log.Info("memory", append(attrs, "heap_goal_bytes", autoHeapGoal)...)
		return t.stop
	}
	if !gogcSet {
		debug.SetGCPercent(gcPercentWithLimit)
		gogc = "400"
	}
	debug.SetMemoryLimit(limit)
	log.Info("memory", "soft_limit_bytes", limit, "gogc", gogc)
	return stop
}

// mib formats n bytes in MiB, rounded down.
func mib(n int64) string {
	return fmt.Sprintf("%d MiB", n>>20)
}

// gcTuner sets GOGC after every collection so that the next one starts
// when the heap reaches goal, or 1.5x the live heap if that is more:
//
//	GOGC = clamp(100 x (goal - live) / (live + stacks + globals), 50, 800)
//
// (Go's heap goal is max(live + (live + stacks + globals) x GOGC/100,
// 4 MiB x GOGC/100)).
// jetsink's live heap is small (the events in flight) while nats.go
// allocates ~1.2 KiB per message, so at Go's default GOGC 100 the collector
// runs after as many MiB as are live (7-24 MiB in the bench drain); with the
// tuner, after 25 MiB at 7 MiB live, 16 at 16 MiB (as at Go's default) and
// 11-12 at 21-24 MiB. When the live heap grows past 2/3 of goal (the sink
// behind, large events, a large max_ack_pending) GOGC stays at 50: the
// tuner trades collector CPU for a third less heap above the live one.
//
// It sets no memory limit: a limit that the heap reaches in every cycle
// makes the allocator hand pages back to the OS and fault them in again
// (runtime.madvise was 8% of jetsink's CPU in a drain under a 40 MiB limit).
// (In a cgroup with a memory limit, applyMemoryLimitIn sets one under it as
// a backstop: 206 MiB in 256 MiB, far above the tuner's goal.)
type gcTuner struct {
	goal uint64
	last int64 // GOGC last set; guarded by mu
	// mu makes stop wait for a running collected: after stop returns,
	// GOGC is not set again.
	mu      sync.Mutex
	stopped bool
	// set applies GOGC; debug.SetGCPercent outside tests.
	set func(int) int
	// after is called after each collection with the GOGC in force (tests).
	// Neither set nor after may call stop (they run under mu).
	after func(gogc int)
}

// sentinel is allocated once per cycle; its cleanup runs after a collection
// found it unreachable. It holds a pointer so that it is not a tiny
// allocation (those share blocks and are freed late).
type sentinel struct {
	_ *int
	_ [2]uint64
}

func startGCTuner(goal uint64) *gcTuner {
	t := &gcTuner{goal: goal, set: debug.SetGCPercent}
	t.collected()
	return t
}

// arm plants the sentinel whose cleanup runs after the next collection.
func (t *gcTuner) arm() {
	runtime.AddCleanup(&sentinel{}, (*gcTuner).collected, t)
}

// collected runs on the runtime's cleanup goroutine after a collection (and
// once from startGCTuner).
func (t *gcTuner) collected() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	p := t.percent(readGCStats())
	if int64(p) != t.last {
		t.set(p)
		t.last = int64(p)
	}
	if t.after != nil {
		t.after(p)
	}
	t.arm()
}

// stop ends the updates, waiting for one that is running; the last GOGC
// stays.
func (t *gcTuner) stop() {
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
}

// gcStats is what gcTuner reads after a collection.
type gcStats struct {
	live  uint64 // heap marked live by the last collection
	roots uint64 // scannable stacks and globals, which Go's heap goal adds to live
}

var gcSamples = []string{
	"/gc/heap/live:bytes",
	"/gc/scan/stack:bytes",
	"/gc/scan/globals:bytes",
}

func readGCStats() gcStats {
	s := make([]metrics.Sample, len(gcSamples))
	for i, name := range gcSamples {
		s[i].Name = name
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return gcStats{live: v(0), roots: v(1) + v(2)}
}

// percent is the GOGC that puts the next collection at t.goal.
func (t *gcTuner) percent(m gcStats) int {
	if m.live >= t.goal {
		return autoMinGCPercent
	}
	p := 100 * (t.goal - m.live) / max(m.live+m.roots, 1)
	return int(min(max(p, autoMinGCPercent), autoMaxGCPercent))
}

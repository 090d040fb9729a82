package main

import (
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/tests/testenv"
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
	for _, tc := range []struct {
		name string
		env  func(t *testing.T, key string)
	}{
		{"sets limit and GOGC", unsetenv},
		{"empty GOMEMLIMIT and GOGC are unset", func(t *testing.T, key string) { t.Setenv(key, "") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restoreGC(t)
			tc.env(t, "GOMEMLIMIT")
			tc.env(t, "GOGC")
			debug.SetMemoryLimit(math.MaxInt64)
			applyMemoryLimit(40<<20, log)()
			if got := debug.SetMemoryLimit(-1); got != 40<<20 {
				t.Errorf("memory limit %d, want %d", got, 40<<20)
			}
			if got := debug.SetGCPercent(100); got != gcPercentWithLimit {
				t.Errorf("GOGC %d, want %d", got, gcPercentWithLimit)
			}
		})
	}
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
	t.Run("auto tunes GOGC and sets no limit without a cgroup limit", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		unsetenv(t, "GOGC")
		if !freshProcess(t) {
			return
		}
		debug.SetMemoryLimit(math.MaxInt64)
		stop := applyMemoryLimitIn(cgroupV2(t, "max"), config.MemoryLimitAuto, log)
		defer stop()
		if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
			t.Errorf("memory limit %d, want none", got)
		}
		// A fresh test process's live heap is far below autoHeapGoal/2.
		if got := debug.SetGCPercent(-1); got <= autoMinGCPercent || got > autoMaxGCPercent {
			t.Errorf("GOGC %d, want in (%d, %d]", got, autoMinGCPercent, autoMaxGCPercent)
		}
	})
	t.Run("auto leaves GOGC alone when set", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		t.Setenv("GOGC", "150")
		debug.SetGCPercent(150)
		debug.SetMemoryLimit(math.MaxInt64)
		stop := applyMemoryLimitIn(cgroupV2(t, "268435456"), config.MemoryLimitAuto, log)
		defer stop()
		if got := debug.SetGCPercent(100); got != 150 {
			t.Errorf("GOGC %d, want GOGC's 150 left alone", got)
		}
		// A memory limit applies under GOGC, as a size does.
		if got, want := debug.SetMemoryLimit(-1), softLimitUnder(256<<20); got != want {
			t.Errorf("memory limit %d, want %d under the cgroup's 256 MiB", got, want)
		}
	})
	t.Run("auto sets a soft limit under the cgroup's", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		unsetenv(t, "GOGC")
		debug.SetMemoryLimit(math.MaxInt64)
		var out strings.Builder
		stop := applyMemoryLimitIn(cgroupV2(t, "268435456"), config.MemoryLimitAuto,
			slog.New(slog.NewTextHandler(&out, nil)))
		defer stop()
		want := int64(256<<20)/100*90 - 24<<20
		if got := debug.SetMemoryLimit(-1); got != want {
			t.Errorf("memory limit %d, want %d (90%% of 256 MiB less 24 MiB)", got, want)
		}
		if !strings.Contains(out.String(), `soft_limit="206 MiB: 90% of the cgroup's 256 MiB, less 24 MiB (`) {
			t.Errorf("log does not say the soft limit:\n%s", out.String())
		}
	})
	t.Run("auto: a cgroup that cannot be read sets no limit", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		unsetenv(t, "GOGC")
		debug.SetMemoryLimit(math.MaxInt64)
		var out strings.Builder
		stop := applyMemoryLimitIn(cgroupV2(t, "lots"), config.MemoryLimitAuto,
			slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
		defer stop()
		if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
			t.Errorf("memory limit %d, want none", got)
		}
		if !strings.Contains(out.String(), "level=DEBUG") || !strings.Contains(out.String(), "cgroup_limit=none") {
			t.Errorf("want the failure at debug and no limit at info:\n%s", out.String())
		}
	})
	t.Run("GOMEMLIMIT wins over the cgroup's limit", func(t *testing.T) {
		restoreGC(t)
		t.Setenv("GOMEMLIMIT", "1GiB")
		debug.SetMemoryLimit(math.MaxInt64)
		applyMemoryLimitIn(cgroupV2(t, "268435456"), config.MemoryLimitAuto, log)()
		if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
			t.Errorf("memory limit %d, want it left alone", got)
		}
	})
	t.Run("a size ignores the cgroup's limit", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		unsetenv(t, "GOGC")
		applyMemoryLimitIn(cgroupV2(t, "268435456"), 40<<20, log)()
		if got := debug.SetMemoryLimit(-1); got != 40<<20 {
			t.Errorf("memory limit %d, want memory_limit's %d", got, 40<<20)
		}
	})
	t.Run("zero does nothing", func(t *testing.T) {
		restoreGC(t)
		unsetenv(t, "GOMEMLIMIT")
		debug.SetMemoryLimit(math.MaxInt64)
		applyMemoryLimitIn(cgroupV2(t, "268435456"), 0, log)()
		if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
			t.Errorf("memory limit %d, want none", got)
		}
	})
}

// cgroupV2 is a fake root in which the process is a container's with
// memory.max holding max.
func cgroupV2(t *testing.T, max string) string {
	t.Helper()
	return fakeRoot(t, map[string]string{
		"proc/self/cgroup":         "0::/\n",
		"proc/self/mountinfo":      mountsV2Container,
		"sys/fs/cgroup/memory.max": max + "\n",
	})
}

func TestGCTunerPercent(t *testing.T) {
	tu := &gcTuner{goal: 32 << 20}
	cases := []struct {
		name string
		m    gcStats
		want int
	}{
		{"small heap: the collector waits for the goal", gcStats{live: 8 << 20}, 300},
		{"roots count like Go's pacer counts them", gcStats{live: 6 << 20, roots: 2 << 20}, 325},
		{"tiny heap: capped", gcStats{live: 1 << 20}, autoMaxGCPercent},
		{"half the goal: Go's default", gcStats{live: 16 << 20}, 100},
		{"between: below Go's default, above the floor", gcStats{live: 20 << 20}, 60},
		{"roots push it to the floor sooner", gcStats{live: 20 << 20, roots: 2 << 20}, 54},
		{"three quarters of the goal: the floor", gcStats{live: 24 << 20}, 50},
		{"above the goal: the floor", gcStats{live: 500 << 20}, 50},
		{"nothing read", gcStats{}, autoMaxGCPercent},
	}
	for _, c := range cases {
		if got := tu.percent(c.m); got != c.want {
			t.Errorf("%s: GOGC %d, want %d", c.name, got, c.want)
		}
	}
}

// TestGCTunerHeapGoal applies the tuner's GOGC for this test binary's small
// live heap, small enough that the cap applies, and reads the heap goal the
// runtime then uses: it must be autoHeapGoal, not Go's minimum heap goal at
// that GOGC (4 MiB x GOGC/100), which was 40 MiB when the cap was 1000.
func TestGCTunerHeapGoal(t *testing.T) {
	if !freshProcess(t) {
		return
	}
	restoreGC(t)
	runtime.GC()
	m := readGCStats()
	tu := &gcTuner{goal: autoHeapGoal}
	p := tu.percent(m)
	if p != autoMaxGCPercent {
		t.Fatalf("GOGC %d for a live heap of %d bytes (and %d of roots): the check needs a live heap small enough for the cap, %d", p, m.live, m.roots, autoMaxGCPercent)
	}
	debug.SetGCPercent(p)
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	if got := s[0].Value.Uint64(); got != autoHeapGoal {
		t.Errorf("heap goal %d bytes at GOGC %d, want %d (32 MiB)", got, p, autoHeapGoal)
	}
}

// TestGCTunerFollowsTheLiveHeap runs the real mechanism (a cleanup after
// each collection, runtime/metrics) with GOGC recorded instead of applied:
// GOGC drops to the floor (50) while a live heap above the goal is held, rises
// again when it is freed, and stays put once stopped. In a process of its
// own (freshProcess): rising again needs a live heap under ~21 MiB once
// the ballast is freed, and what the package's in-process runs left alive
// grows by ~8 MiB a pass (a flake hunt's -count=3 failed it in its third).
func TestGCTunerFollowsTheLiveHeap(t *testing.T) {
	if !freshProcess(t) {
		return
	}
	const goal = 32 << 20
	seen := make(chan int, 64)
	tu := &gcTuner{goal: goal, set: func(int) int { return 0 }}
	tu.after = func(p int) {
		select {
		case seen <- p:
		default:
		}
	}
	tu.arm()
	defer tu.stop()

	// waitFor collects until a GOGC satisfies ok, forcing collections.
	waitFor := func(what string, ok func(int) bool) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			runtime.GC()
			select {
			case p := <-seen:
				if ok(p) {
					return
				}
			case <-time.After(50 * time.Millisecond):
			case <-deadline:
				t.Fatalf("no GOGC %s within 10s", what)
			}
		}
	}
	ballast := make([]byte, 64<<20)
	for i := 0; i < len(ballast); i += 4096 {
		ballast[i] = 1
	}
	waitFor("at the floor with 64 MiB live", func(p int) bool { return p == autoMinGCPercent })
	runtime.KeepAlive(ballast)
	ballast = nil
	waitFor("above the floor once the heap is freed", func(p int) bool { return p > autoMinGCPercent })

	tu.stop()
	for len(seen) > 0 {
		<-seen
	}
	// The tuner's sentinel, planted before stop, is freed by the next
	// collection; wait until cleanups of the test's own, planted before
	// each of two collections, have run, rather than for a fixed time that
	// a loaded machine may not give the cleanup goroutine.
	for range 2 {
		ran := make(chan struct{})
		runtime.AddCleanup(&sentinel{}, func(c chan struct{}) { close(c) }, ran)
		deadline := time.After(10 * time.Second)
		for done := false; !done; {
			runtime.GC()
			select {
			case <-ran:
				done = true
			case <-time.After(10 * time.Millisecond):
			case <-deadline:
				t.Fatal("the test's cleanup did not run within 10s")
			}
		}
	}
	if len(seen) != 0 {
		t.Errorf("GOGC still updated after stop: %d", <-seen)
	}
}

// freshProcess runs the calling test (or subtest) alone in a new process
// of this test binary and reports false, or reports true in that process.
// A test whose figures depend on the process's live heap must not see what
// other tests' in-process jetsink runs (demo, dlq replay) left in it.
func freshProcess(t *testing.T) bool {
	t.Helper()
	const env = "JETSINK_TEST_FRESH_PROCESS"
	switch os.Getenv(env) {
	case t.Name():
		return true
	case "":
	default:
		t.Fatalf("%s=%s in a process running %s", env, os.Getenv(env), t.Name()) // no endless chain of processes
	}
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	cmd := exec.Command(os.Args[0], "-test.run", strings.Join(parts, "/"), "-test.count=1", "-test.v")
	testenv.DieWithTest(cmd)
	cmd.Env = append(os.Environ(), env+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s in a fresh process: %v\n%s", t.Name(), err, out)
	}
	return false
}

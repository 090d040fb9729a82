package bench

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// What an engine ran with comes from its start-up line, in either of
// slog's formats, with every key it does not give named as not reported;
// the line is kept at the head of its output when a long run's lines have
// pushed it out of the tail.
func TestRanWithFromTheStartUpLine(t *testing.T) {
	full := RanWith{GOMAXPROCS: 2, CPUQuota: "2 (cpu.max 200000 100000)", Workers: 3, Connections: 4, Mode: "exactly-once"}
	for _, tc := range []struct {
		name string
		log  func(*slog.Logger)
		want RanWith
	}{
		{"jetsink before 724e071 and 955e3e1", func(l *slog.Logger) {
			l.Info(jetsinkStartMsg, "workers", 3, "handoff", "ring", "stream", "S", "consumer", "c", "table", `"t"`, "mode", "exactly-once")
		}, RanWith{Workers: 3, Mode: "exactly-once", NotReported: []string{"gomaxprocs", "cpu_quota", "postgres_connections"}}},
		{"every key", func(l *slog.Logger) {
			l.Info(jetsinkStartMsg, "workers", 3, "connections", 4, "gomaxprocs", 2, "cpu_quota", "2 (cpu.max 200000 100000)", "mode", "exactly-once")
		}, full},
		{"the quota on a line of its own", func(l *slog.Logger) {
			l.Info(cpuStartMsg, "gomaxprocs", 2, "cpu_quota", "2 (cpu.max 200000 100000)")
			l.Info(jetsinkStartMsg, "workers", 3, "connections", 4, "mode", "exactly-once")
		}, full},
		{"baseline", func(l *slog.Logger) {
			l.Info(baselineStartMsg, "gomaxprocs", 8, "workers", 1, "connections", 1, "mode", "at-least-once")
		}, RanWith{GOMAXPROCS: 8, Workers: 1, Connections: 1, Mode: "at-least-once", NotReported: []string{"cpu_quota"}}},
		{"no start-up line", func(l *slog.Logger) { l.Warn("something else", "workers", 3) },
			RanWith{NotReported: []string{"gomaxprocs", "cpu_quota", "workers", "postgres_connections", "mode"}}},
	} {
		for _, json := range []bool{false, true} {
			out := &tailBuffer{max: 1 << 10}
			var h slog.Handler = slog.NewTextHandler(out, nil)
			if json {
				h = slog.NewJSONHandler(out, nil)
			}
			fmt.Fprintln(out, "jetsink: a line of no record")
			tc.log(slog.New(h))
			// A long run's warnings, beyond the tail's 1 KiB.
			for range 100 {
				slog.New(h).Warn("pull heartbeats missed; checking the consumer", "workers", 99)
			}
			if got := ranWith(out.head()); !equalRanWith(got, tc.want) {
				t.Errorf("%s (JSON %v): %+v, want %+v", tc.name, json, got, tc.want)
			}
		}
	}
	if l := full.line(); l != "ran with (as it logged at its start): GOMAXPROCS 2, CPU quota 2 (cpu.max 200000 100000), pipeline.workers 3, postgres.connections 4, exactly-once" {
		t.Errorf("text line %q", l)
	}
	if l := (RanWith{Workers: 3, Mode: "at-least-once", NotReported: []string{"gomaxprocs", "postgres_connections"}}).line(); !strings.HasSuffix(l, "pipeline.workers 3, at-least-once; not logged: gomaxprocs, postgres_connections") {
		t.Errorf("text line %q", l)
	}
}

func equalRanWith(a, b RanWith) bool {
	return a.GOMAXPROCS == b.GOMAXPROCS && a.CPUQuota == b.CPUQuota && a.Workers == b.Workers &&
		a.Connections == b.Connections && a.Mode == b.Mode && slices.Equal(a.NotReported, b.NotReported)
}

// The head holds whole lines only: a line cut at headMax could read as
// another value (workers=1 of workers=12).
func TestTailBufferHeadEndsAtALine(t *testing.T) {
	out := &tailBuffer{max: 1 << 10}
	fmt.Fprint(out, strings.Repeat("x", headMax-len("msg=\"jetsink running\" workers=1")-1)+"\n")
	fmt.Fprint(out, "msg=\"jetsink running\" workers=12\n")
	if got := ranWith(out.head()); got.Workers != 0 || strings.Contains(out.head(), "workers=1") {
		t.Errorf("a line cut short read as %+v", got)
	}
}

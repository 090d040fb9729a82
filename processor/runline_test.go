package processor

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jetsink/jetsink/config"
)

// Run's "jetsink running" line says what runs: the table as its
// statements name it (sink.LogName: as configured until a committer's read
// finds it on search_path, which may come before the line or after it,
// then schema-qualified), the workers and connections as resolved,
// GOMAXPROCS (which follows a cgroup CPU quota; jetsink bench reads the
// line to report what a figure ran with) and the mode.
func TestRunningLineSaysWhatRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, _, cfg := serversConfig(t, "runline", func(cfg *config.Config) {
		cfg.Postgres.Connections = 3
		cfg.Pipeline.Workers = 0 // resolved by New: one per physical core
	})
	running := make(chan map[string]string, 1)
	p, err := New(ctx, cfg, slog.New(&recordHandler{msg: "jetsink running", attrs: running}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	intake, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(intake, ctx) }()
	var line map[string]string
	select {
	case line = <-running:
	case err := <-done:
		t.Fatalf("Run returned before its running line: %v", err)
	case <-ctx.Done():
		t.Fatal("no running line")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := map[string]string{
		"workers":     strconv.Itoa(p.cfg.Pipeline.Workers),
		"connections": "3",
		"gomaxprocs":  strconv.Itoa(runtime.GOMAXPROCS(0)),
		"mode":        string(cfg.Postgres.Mode),
		"stream":      "RUNLINE",
	}
	if p.cfg.Pipeline.Workers < 1 {
		t.Fatalf("workers %d after New, want 0 resolved", p.cfg.Pipeline.Workers)
	}
	if tb := line["table"]; tb != "runline" && tb != "public.runline" {
		t.Errorf("running line table=%q, want runline or, once found, public.runline", tb)
	}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("running line %s=%q, want %q (line %v)", k, line[k], v, line)
		}
	}
}

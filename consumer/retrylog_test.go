package consumer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

// Run's retry loop (the stream deleted under it, nats.create_stream off)
// logged its Warn, then, when NotConsuming began to report it, an Error
// with held_back=0: the change of level made a new limiter, dropping the
// count of the Warns held back meanwhile. And when the stream came back
// nothing said so: an alert raised on the Error never saw it end. The
// Error now carries the Warns held back, and failing_for; the session
// that lasts logs "consuming again" with failing_for and attempts.
func TestRetryLoopSaysWhenItEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	makeStream(t, ctx, js, cfg)
	c, buf := newJSONLogged(t, ctx, cfg)
	// Error after 1 s of retries: the Warns of the first (every 100 ms,
	// doubling) are held back before it.
	c.stuckAfter = time.Second
	publish(t, ctx, js, cfg, 1, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 16)
	r.ackUntil(t, ctx, 0)

	if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "an Error retry line", func() bool {
		for _, rec := range jsonRecords(t, buf.String()) {
			if m, _ := rec["msg"].(string); rec["level"] == "ERROR" && strings.HasSuffix(m, "; retrying") {
				return true
			}
		}
		return false
	})
	makeStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 1, 1, 1)
	r.ackUntil(t, ctx, 1)
	waitFor(t, ctx, "the recovery line", func() bool { return strings.Contains(buf.String(), `"msg":"consuming again"`) })
	r.stopClean(t, ctx)

	recs := jsonRecords(t, buf.String())
	var warned, erred map[string]any
	for _, rec := range recs {
		if m, _ := rec["msg"].(string); strings.HasSuffix(m, "; retrying") {
			switch {
			case rec["level"] == "WARN" && warned == nil:
				warned = rec
			case rec["level"] == "ERROR" && erred == nil:
				erred = rec
			}
		}
	}
	if warned == nil || erred == nil {
		t.Fatalf("retry lines: first Warn %v, first Error %v; want both", warned, erred)
	}
	held, _ := erred["held_back"].(float64)
	attempts, _ := erred["attempts"].(float64)
	failing, _ := erred["failing_for"].(float64)
	if held < 1 || attempts < held+2 || failing < float64(c.stuckAfter) {
		t.Fatalf("the Error retry line: %v; want the Warns held back before it (>= 1), attempts counting them, the Warn and itself, "+
			"and failing_for >= %v (the Warn: %v)", erred, c.stuckAfter, warned)
	}
	over := records(recs, "consuming again")
	if len(over) != 1 {
		t.Fatalf("%d lines 'consuming again', want 1", len(over))
	}
	if n, _ := over[0]["attempts"].(float64); n < attempts || over[0]["failing_for"].(float64) < failing || over[0]["level"] != "INFO" {
		t.Fatalf("the recovery line: %v; want an Info with attempts >= %v and failing_for >= the Error's (%v)", over[0], attempts, erred)
	}
}

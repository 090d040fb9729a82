package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

// deadLetterLogSetup starts a server and a consumer on it logging JSON
// to the returned buffer (jsonLog: slog's own handler, what a log
// shipper reads), publishes n events, runs the consumer and returns them,
// taken but not settled.
func deadLetterLogSetup(t *testing.T, ctx context.Context, n int) (Config, *Consumer, *syncBuffer, *runner, []pipeline.Event) {
	t.Helper()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	c, buf := newJSONLogged(t, ctx, cfg)
	dlqStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, n, 1, 0)
	r := startRun(t, ctx, c, 1, 2*n, 2*n)
	evs := make([]pipeline.Event, n)
	for i := range evs {
		evs[i] = r.next(t, ctx).ev
	}
	return cfg, c, buf, r, evs
}

// storedLines are the JSON objects of the log's "event dead-lettered"
// lines; jsonRecords fails t for a line with a key twice (Elasticsearch
// and OpenSearch refuse it).
func storedLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	return records(jsonRecords(t, log), "event dead-lettered")
}

// A stored dead letter's JSON line carries each key once: the consumer's
// logger says stream and consumer, and the line said stream again (a
// reviewer's log: `stream=EVENTS ... stream=EVENTS`). An event of another
// stream handed in is named under event_stream.
func TestDeadLetterLineHasEachKeyOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, c, buf, r, evs := deadLetterLogSetup(t, ctx, 2)
	if err := c.DeadLetter(ctx, &evs[0], pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: pipeline.CodeInvalidJSON, Reason: "bad"}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	other := evs[1]
	other.Stream = cfg.Stream + "_OTHER"
	// Another code, so that the first's bound does not hold its line back.
	if err := c.DeadLetter(ctx, &other, pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: pipeline.CodeOutOfRange, Reason: "big"}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	r.stopClean(t, ctx)
	lines := storedLines(t, buf.String())
	if len(lines) != 2 {
		t.Fatalf("%d lines of stored letters, want 2; log:\n%s", len(lines), buf.String())
	}
	for i, l := range lines {
		if l["stream"] != cfg.Stream || l["consumer"] != cfg.Consumer || l["stream_seq"] != float64(i+1) {
			t.Errorf("line %d says stream %v, consumer %v, stream_seq %v; want %s, %s, %d", i, l["stream"], l["consumer"], l["stream_seq"], cfg.Stream, cfg.Consumer, i+1)
		}
	}
	if got, ok := lines[0]["event_stream"]; ok {
		t.Errorf("the line of an event of the consumer's stream says event_stream %v", got)
	}
	if got := lines[1]["event_stream"]; got != other.Stream {
		t.Errorf("the line of an event of stream %s says event_stream %v", other.Stream, got)
	}
}

// Every code that is dead-lettered is named in the log, each at most once
// a second: under one bound for all, the code that came first took the
// line, and a second one as frequent was never named (a reviewer's run:
// 240 letters, half out_of_range, logged as invalid_json only).
func TestDeadLetterLinesNameEveryCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 20
	_, c, buf, r, evs := deadLetterLogSetup(t, ctx, n)
	codes := []string{pipeline.CodeInvalidJSON, pipeline.CodeOutOfRange}
	for i := range evs {
		dl := pipeline.DeadLetter{Stage: pipeline.StageDecode, Code: codes[i%2], Reason: "bad"}
		if err := c.DeadLetter(ctx, &evs[i], dl); err != nil {
			t.Fatalf("DeadLetter: %v", err)
		}
	}
	r.stopClean(t, ctx)
	lines := storedLines(t, buf.String())
	logged := map[string]int{}
	for _, l := range lines {
		code, _ := l["code"].(string)
		held, _ := l["held_back"].(float64)
		logged[code] += 1 + int(held)
	}
	for _, code := range codes {
		// At least one line, and no more letters counted (logged or
		// held back) than the code had: held_back is the code's own.
		if logged[code] == 0 || logged[code] > n/2 {
			t.Errorf("code %s: %d letters logged or counted held back, want 1 to %d; log:\n%s", code, logged[code], n/2, buf.String())
		}
	}
	if st := c.Stats(); st.DeadLettered != n {
		t.Errorf("dead-lettered %d, want %d", st.DeadLettered, n)
	}
}

// Each code pipeline.DeadLetterCodes lists has a bound of its own in a
// dlCodeLimit, none the one any other code shares.
func TestDeadLetterCodesHaveASlotEach(t *testing.T) {
	var l dlCodeLimit
	seen := map[*pipeline.Every]string{}
	other := l.of("no such code")
	for _, code := range pipeline.DeadLetterCodes() {
		e := l.of(code)
		if e == other {
			t.Errorf("code %s shares the bound of unknown codes (raise dlCodeSlots)", code)
		}
		if prev, ok := seen[e]; ok {
			t.Errorf("codes %s and %s share a bound", prev, code)
		}
		seen[e] = code
	}
}

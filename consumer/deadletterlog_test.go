package consumer

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

// deadLetterLogSetup starts a server and a consumer on it logging JSON
// to the returned buffer (slog's own handler, not strictKeys: what a log
// shipper reads), publishes n events, runs the consumer and returns them,
// taken but not settled.
func deadLetterLogSetup(t *testing.T, ctx context.Context, n int) (Config, *Consumer, *syncBuffer, *runner, []pipeline.Event) {
	t.Helper()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	buf := &syncBuffer{}
	c, err := New(ctx, cfg, slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
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
// lines.
func storedLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for l := range strings.Lines(log) {
		if !strings.Contains(l, `"msg":"event dead-lettered"`) {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
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

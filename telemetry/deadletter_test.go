package telemetry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetsink/jetsink/pipeline"
)

// A dead-lettered message's span carries db.response.status_code only when
// the database gave a SQLSTATE: a decode-stage letter has none, and an
// empty code would read as a response that never came. Stage and code are
// on both.
func TestDeadLetterSpanHasStatusCodeOnlyWithSQLState(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr := newTestTracing(t, exp, 1)
	d := &DeadLetterer{Next: dlFunc(func() error { return nil })}
	letters := []pipeline.DeadLetter{
		{Stage: pipeline.StageDecode, Code: "invalid_json"},
		{Stage: pipeline.StageSink, Code: "unique_violation", SQLState: "23505"},
	}
	for _, dl := range letters {
		ev := event(nil)
		ev.Span = tr.StartMessage(ev)
		if err := d.DeadLetter(context.Background(), &ev, dl); err != nil {
			t.Fatalf("DeadLetter(%+v) = %v", dl, err)
		}
	}
	_ = tr.Flush(context.Background())
	spans := exp.GetSpans()
	if len(spans) != len(letters) {
		t.Fatalf("%d spans, want %d: %v", len(spans), len(letters), spans)
	}
	for i, dl := range letters {
		attrs := map[string]string{}
		for _, kv := range spans[i].Attributes {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if attrs["stage"] != dl.Stage || attrs["code"] != dl.Code {
			t.Errorf("span of %+v: stage %q, code %q", dl, attrs["stage"], attrs["code"])
		}
		got, ok := attrs["db.response.status_code"]
		if ok != (dl.SQLState != "") || got != dl.SQLState {
			t.Errorf("span of %+v: db.response.status_code %q (set: %v), want %q set only with a SQLSTATE", dl, got, ok, dl.SQLState)
		}
	}
}

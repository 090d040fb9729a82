package telemetry

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetsink/jetsink/pipeline"
)

// A dead-lettered message's span carries db.response.status_code only when
// the database gave a SQLSTATE: a decode-stage letter has none, and an
// empty code would read as a response that never came. Stage and code are
// on both, as jetsink.dead_letter.stage and .code (not bare: the metric's
// labels), and the span fails with an exception of a stable type,
// jetsink.dead_letter, not the Go type of the error.
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
			attrs[string(kv.Key)] = kv.Value.String()
		}
		if attrs["jetsink.dead_letter.stage"] != dl.Stage || attrs["jetsink.dead_letter.code"] != dl.Code || attrs["jetsink.settle"] != "dead_letter" {
			t.Errorf("span of %+v: jetsink.dead_letter.stage %q, .code %q, jetsink.settle %q", dl, attrs["jetsink.dead_letter.stage"], attrs["jetsink.dead_letter.code"], attrs["jetsink.settle"])
		}
		if _, ok := attrs["stage"]; ok {
			t.Errorf("span of %+v: a bare stage attribute", dl)
		}
		if _, ok := attrs["code"]; ok {
			t.Errorf("span of %+v: a bare code attribute", dl)
		}
		if spans[i].Status.Code != codes.Error || !strings.HasPrefix(spans[i].Status.Description, "dead-lettered at "+dl.Stage) {
			t.Errorf("span of %+v: status %v %q, want an error", dl, spans[i].Status.Code, spans[i].Status.Description)
		}
		var types []string
		for _, e := range spans[i].Events {
			if e.Name != "exception" {
				continue
			}
			for _, kv := range e.Attributes {
				if kv.Key == "exception.type" {
					types = append(types, kv.Value.AsString())
				}
			}
		}
		if !slices.Equal(types, []string{"jetsink.dead_letter"}) {
			t.Errorf("span of %+v: exception.type %q, want one, jetsink.dead_letter", dl, types)
		}
		got, ok := attrs["db.response.status_code"]
		if ok != (dl.SQLState != "") || got != dl.SQLState {
			t.Errorf("span of %+v: db.response.status_code %q (set: %v), want %q set only with a SQLSTATE", dl, got, ok, dl.SQLState)
		}
	}
}

package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetsink/jetsink/pipeline"
)

// The dead-letter metric's labels (jetsink_events_dead_lettered_total).
func stageAttr(s string) attribute.KeyValue { return attribute.String("stage", s) }
func codeAttr(s string) attribute.KeyValue  { return attribute.String("code", s) }

// deadLetterType is the exception.type of a dead-lettered message's span:
// stable, not the Go type the SDK's RecordError would name
// (github.com/jetsink/jetsink/telemetry.deadLetterError).
const deadLetterType = "jetsink.dead_letter"

// DeadLetterer wraps the pipeline.DeadLetterer that the pipeline and the
// sink share: each dead letter is counted by stage and code
// (jetsink.events.dead_lettered) and ends the message's span, failed with
// the reason, whether the publish worked ("dead_letter", with attributes
// jetsink.dead_letter.stage, jetsink.dead_letter.code and, when there is a
// SQLSTATE, db.response.status_code, and an exception event of
// exception.type jetsink.dead_letter) or
// the message was nak'ed for redelivery ("nak", with the dead-letter
// error), or, its stream re-created since, left alone ("stale";
// pipeline.FailedDeadLetter). Safe for concurrent use if Next is.
type DeadLetterer struct {
	Next    pipeline.DeadLetterer
	Metrics *Metrics // nil: not counted
}

// DeadLetter calls Next and returns its error unchanged.
func (d *DeadLetterer) DeadLetter(ctx context.Context, ev *pipeline.Event, dl pipeline.DeadLetter) error {
	err := d.Next.DeadLetter(ctx, ev, dl)
	if err != nil {
		EndMessage(ev, pipeline.FailedDeadLetter(err), err)
		return err
	}
	d.Metrics.DeadLettered(ctx, dl.Stage, dl.Code)
	if sp := ev.Span; sp != nil {
		sp.SetAttributes(attribute.String("jetsink.dead_letter.stage", dl.Stage), attribute.String("jetsink.dead_letter.code", dl.Code))
		// Only a database's answer has a status code: a decode-stage
		// letter's empty one would read as an answer without one.
		if dl.SQLState != "" {
			sp.SetAttributes(attribute.String("db.response.status_code", dl.SQLState))
		}
		// The span fails as RecordError would fail it, with a stable
		// exception.type: RecordError sets its own after any given.
		msg := deadLetterError{dl}.Error()
		sp.AddEvent("exception", trace.WithAttributes(
			attribute.String("exception.type", deadLetterType),
			attribute.String("exception.message", msg)))
		sp.SetStatus(codes.Error, msg)
	}
	// Also without a span: the event's life ends here (its bytes of the
	// in-flight budget are back already if Next gave them back).
	EndMessage(ev, "dead_letter", nil)
	return nil
}

type deadLetterError struct{ dl pipeline.DeadLetter }

func (e deadLetterError) Error() string {
	// Not the reason: it may quote a value of the event, which belongs in
	// the dead letter, not in a trace backend.
	msg := "dead-lettered at " + e.dl.Stage + " (" + e.dl.Code + ")"
	if e.dl.SQLState != "" {
		msg += ", SQLSTATE " + e.dl.SQLState
	}
	return msg
}

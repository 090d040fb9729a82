package pipeline

import "fmt"

// Codes of a DecodeError, also used as DeadLetter.Code.
const (
	CodeInvalidJSON     = "invalid_json"     // the payload is not valid JSON (or holds a lone UTF-16 surrogate escape)
	CodeRequiredMissing = "required_missing" // a required value is absent or null
	CodeWrongType       = "wrong_type"       // the value's JSON kind cannot fill the column's type
	CodeInvalidFormat   = "invalid_format"   // a string does not parse as the column's type (uuid, timestamp, number...)
	CodeOutOfRange      = "out_of_range"     // the value parses but does not fit the column's type
	CodeInvalidUTF8     = "invalid_utf8"     // text or JSON that is not valid UTF-8
	CodeNULInText       = "nul_in_text"      // a NUL character, which PostgreSQL text and jsonb cannot store
	CodeTooLarge        = "too_large"        // the payload is larger than max_event_bytes
	CodeInternal        = "internal"         // decoding the event panicked: a bug of jetsink's, logged with its stack
)

// Codes of a dead letter of the sink (StageSink): the database refused the
// row itself.
const (
	CodeConstraint = "constraint" // SQLSTATE class 23: a key, check or not-null constraint
	CodeRefused    = "refused"    // an error one row or the table may cause, outside classes 22 and 23: a trigger's RAISE (SQLSTATE P0xxx), an index entry too large (54000), an internal error (XX000), ...
	CodeData       = "data"       // any other refusal of the row (SQLSTATE class 22, mostly)
	CodeRowCount   = "row_count"  // a COPY committed with another row count than the rows sent (a trigger or rule), or rows missing from the table
)

// DeadLetterKind is a stage and a code that a dead letter may have.
type DeadLetterKind struct{ Stage, Code string }

// DeadLetterKinds lists every stage and code pair this version of jetsink
// writes: each decode code at StageDecode, the sink's at StageSink,
// CodeMaxDeliver at StageDeliver. (The metrics serve each from 0, so that
// an alert sees a pair's first dead letter as an increase.)
func DeadLetterKinds() []DeadLetterKind {
	codes := DeadLetterCodes()
	out := make([]DeadLetterKind, 0, len(codes))
	for _, c := range codes {
		stage := StageDecode
		switch c {
		case CodeConstraint, CodeRefused, CodeData, CodeRowCount:
			stage = StageSink
		case CodeMaxDeliver:
			stage = StageDeliver
		}
		out = append(out, DeadLetterKind{Stage: stage, Code: c})
	}
	return out
}

// DeadLetterCodes lists every DeadLetter.Code this version of jetsink
// writes, decode codes first.
func DeadLetterCodes() []string {
	return []string{CodeInvalidJSON, CodeRequiredMissing, CodeWrongType, CodeInvalidFormat, CodeOutOfRange,
		CodeInvalidUTF8, CodeNULInText, CodeTooLarge, CodeInternal, CodeConstraint, CodeRefused, CodeData, CodeRowCount, CodeMaxDeliver}
}

// DecodeError says why an event cannot become a row. It is permanent: the
// same event fails the same way every time, so it belongs on the
// dead-letter subject.
type DecodeError struct {
	Column string // the column's name; "" when the event as a whole is at fault
	Code   string // one of the Code* constants
	Reason string // human-readable detail; never contains the payload
}

func (e *DecodeError) Error() string {
	if e.Column == "" {
		return "decode: " + e.Code + ": " + e.Reason
	}
	return fmt.Sprintf("decode column %q: %s: %s", e.Column, e.Code, e.Reason)
}

// DeadLetter returns the dead letter for the event that failed.
func (e *DecodeError) DeadLetter() DeadLetter {
	return DeadLetter{Stage: StageDecode, Code: e.Code, Reason: e.Error()}
}

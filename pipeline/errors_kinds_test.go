package pipeline

import "testing"

// Every code is in DeadLetterKinds once, at the stage that writes it.
func TestDeadLetterKinds(t *testing.T) {
	kinds := DeadLetterKinds()
	if len(kinds) != len(DeadLetterCodes()) {
		t.Fatalf("%d kinds for %d codes", len(kinds), len(DeadLetterCodes()))
	}
	stage := map[string]string{}
	for _, k := range kinds {
		if _, dup := stage[k.Code]; dup {
			t.Errorf("code %s twice", k.Code)
		}
		stage[k.Code] = k.Stage
	}
	for code, want := range map[string]string{
		CodeInvalidJSON: StageDecode, CodeInternal: StageDecode, CodeTooLarge: StageDecode,
		CodeConstraint: StageSink, CodeRefused: StageSink, CodeData: StageSink, CodeRowCount: StageSink,
		CodeMaxDeliver: StageDeliver,
	} {
		if stage[code] != want {
			t.Errorf("code %s at stage %q, want %q", code, stage[code], want)
		}
	}
	if got := (&DecodeError{Code: CodeWrongType}).DeadLetter().Stage; stage[CodeWrongType] != got {
		t.Errorf("a decode error's dead letter is at stage %q, its kind at %q", got, stage[CodeWrongType])
	}
}

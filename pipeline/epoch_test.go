package pipeline

import (
	"testing"
	"time"
)

func TestEpochsNil(t *testing.T) {
	var e *Epochs
	if e.Current() != 0 || e.Hold() != 0 {
		t.Fatal("a nil Epochs is not at epoch 0")
	}
	e.Release()
}

// Advance waits for every Hold to be released, so that no settling of the
// epoch before it is under way when it returns.
func TestEpochsAdvanceWaitsForHolds(t *testing.T) {
	var e Epochs
	if got := e.Hold(); got != 0 {
		t.Fatalf("first epoch %d, want 0", got)
	}
	advanced := make(chan uint64)
	go func() { advanced <- e.Advance() }()
	select {
	case got := <-advanced:
		t.Fatalf("Advance returned %d while a Hold was in progress", got)
	case <-time.After(50 * time.Millisecond):
	}
	if got := e.Current(); got != 0 {
		t.Fatalf("Current %d while Advance waits, want 0", got)
	}
	e.Release()
	if got := <-advanced; got != 1 {
		t.Fatalf("Advance = %d, want 1", got)
	}
	if got := e.Hold(); got != 1 {
		t.Fatalf("Hold after Advance = %d, want 1", got)
	}
	e.Release()
}

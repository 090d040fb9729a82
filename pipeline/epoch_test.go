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
	if e.Advance() != 0 || e.Current() != 0 {
		t.Fatal("a nil Epochs advanced")
	}
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

// IfCurrent settles only an event of the current epoch (a nil Epochs is
// always at 0), and holds the epoch while it does: an Advance waits.
func TestEpochsIfCurrent(t *testing.T) {
	var nilE *Epochs
	if ran := false; !nilE.IfCurrent(0, func() { ran = true }) || !ran {
		t.Fatal("a nil Epochs did not settle an epoch-0 event")
	}
	var e Epochs
	e.Advance()
	if ran := false; e.IfCurrent(0, func() { ran = true }) || ran {
		t.Fatal("an event of the epoch before was settled")
	}
	advanced := make(chan uint64, 1)
	if !e.IfCurrent(1, func() {
		go func() { advanced <- e.Advance() }()
		select {
		case got := <-advanced:
			t.Errorf("Advance returned %d while an event was being settled", got)
			advanced <- got
		case <-time.After(50 * time.Millisecond):
		}
	}) {
		t.Fatal("an event of the current epoch was not settled")
	}
	if got := <-advanced; got != 2 {
		t.Fatalf("Advance = %d, want 2", got)
	}
}

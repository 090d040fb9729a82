package pipeline

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// testWorker is a worker for the telemetry mapping, outside a pipeline.
func testWorker(t *testing.T) *worker {
	return &worker{enc: mustCompile(t, benchColumns...).NewEncoder(0)}
}

// carve makes n rows with worker w, as run does.
func carve(t *testing.T, w *worker, n int) []Row {
	t.Helper()
	rows := make([]Row, 0, n)
	for range n {
		row, err := w.encode(&Event{Data: benchPayload})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, row)
	}
	return rows
}

// A slab is reused only once its worker has moved on and every row carved
// from it is released, whatever order those come in.
func TestSlabFreedAfterLastRowAndRetire(t *testing.T) {
	w := testWorker(t)
	rows := carve(t, w, 3)
	s := rows[0].slab
	if s == nil || rows[1].slab != s || rows[2].slab != s {
		t.Fatal("three small rows are not carved from one slab")
	}
	want := append([]byte(nil), rows[2].Tuple...)

	ReleaseRows(rows[:2])
	if rows[0].Tuple != nil || rows[0].slab != nil {
		t.Fatal("a released row keeps its tuple")
	}
	w.retire() // the worker moves on; rows[2] is still held
	if got := s.count(); got != 1 {
		t.Fatalf("refs after 2 of 3 rows released and the slab retired: %d, want 1", got)
	}
	if !bytes.Equal(rows[2].Tuple, want) {
		t.Fatal("a held row's tuple changed after the others were released")
	}

	// Rows carved while the first slab was still held come from another.
	more := carve(t, w, 1)
	if more[0].slab == s {
		t.Fatal("a slab with a held row was carved again")
	}
	if !bytes.Equal(rows[2].Tuple, want) {
		t.Fatal("a held row's tuple changed when another was carved")
	}

	ReleaseRows(rows[2:])
	if got := s.count(); got != 0 {
		t.Fatalf("refs after every row released: %d, want 0", got)
	}
	if poisonSlabs && s.buf[:1][0] != 0xA5 {
		t.Fatal("a freed slab is not poisoned in a race build")
	}
	ReleaseRows(more)
	w.retire()
}

// While the worker carves, releasing every row so far does not free the
// slab: the bias keeps it.
func TestSlabHeldWhileCarving(t *testing.T) {
	w := testWorker(t)
	defer w.retire()
	rows := carve(t, w, 5)
	s := rows[0].slab
	ReleaseRows(rows)
	if got := s.count(); got != slabBias-5 {
		t.Fatalf("refs: %d, want slabBias-5", got)
	}
	next := carve(t, w, 1)
	if next[0].slab != s {
		t.Fatal("the worker left a slab that had room")
	}
	ReleaseRows(next)
}

// A full slab is retired and the next row goes to a new one; rows larger
// than ownSliceAbove get their own allocation and no slab.
func TestSlabRollsOver(t *testing.T) {
	w := testWorker(t)
	defer w.retire()
	var rows []Row
	for len(rows) == 0 || rows[len(rows)-1].slab == rows[0].slab {
		rows = append(rows, carve(t, w, 1)...)
		if len(rows) > slabSize {
			t.Fatal("a slab never filled")
		}
	}
	first := rows[0].slab
	ReleaseRows(rows[:len(rows)-1])
	if got := first.count(); got != 0 {
		t.Fatalf("a full slab with every row released: refs %d, want 0", got)
	}
	ReleaseRows(rows[len(rows)-1:])

	big := Row{Tuple: make([]byte, ownSliceAbove+1)}
	ReleaseRows([]Row{big}) // no slab: skipped, nothing to give back
}

// A second release of one row (a copy released from two places) would hand
// another event's bytes to a reader; it panics instead, whether the slab is
// still waiting for its rows (the count goes below zero) or already in use
// again (the generation check), and then it takes none of the new rows'
// references, which would free the slab under a held row.
func TestSlabSecondReleasePanics(t *testing.T) {
	for _, reused := range []bool{false, true} {
		t.Run(fmt.Sprintf("reused=%v", reused), func(t *testing.T) {
			w := testWorker(t)
			rows := carve(t, w, 1)
			w.retire()
			dup := rows[0]
			s := dup.slab
			ReleaseRows(rows)
			if reused {
				// The slab's next use, as newSlab starts it (the pool may
				// hand any slab out, so the test takes its place itself).
				s.state.Store(uint64(s.gen()+1)<<genShift | slabBias)
			}
			defer func() {
				if recover() == nil {
					t.Fatal("a second release of one row did not panic")
				}
				if got := s.count(); reused && got != slabBias {
					t.Fatalf("the stale release took a reference: refs %d, want slabBias", got)
				}
			}()
			ReleaseRows([]Row{dup})
		})
	}
}

// In race-detector builds (CI's), a second release of a row panics also
// while other rows of its slab are held: the count alone would let it
// through, and give the slab back under them.
func TestSlabSecondReleaseWithSiblingsHeldPanics(t *testing.T) {
	if !poisonSlabs {
		t.Log("not a race-detector build: only the count and the generation are checked")
		return
	}
	w := testWorker(t)
	rows := carve(t, w, 3)
	w.retire()
	dup := rows[0]
	s := dup.slab
	ReleaseRows(rows[:1])
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("a second release of one row, with two of its slab's rows held, did not panic")
			}
		}()
		ReleaseRows([]Row{dup})
	}()
	if got := s.count(); got != 2 {
		t.Fatalf("the slab's count is %d after the refused second release, want the 2 rows still held", got)
	}
	ReleaseRows(rows[1:]) // the held rows, once each: no panic
}

// TestWorkerEncodesLargeTuplesInPlace: a large event whose payload the
// mapping stores is encoded straight into its tuple, one allocation of
// about its size (it was encoded into a scratch tuple grown for it,
// copied out, and the scratch dropped); one just under ownSliceAbove,
// whose tuple is small, and a small one of a mapping wide enough that
// tupleCap is over ownSliceAbove, are encoded into the scratch and carved
// from a slab without allocating; a payload over max_event_bytes allocates
// nothing of its size; and a large tuple of a mapping that does not store
// the payload is still copied out of the scratch.
func TestWorkerEncodesLargeTuplesInPlace(t *testing.T) {
	m := mustCompile(t, Column{Name: "id", From: "json:id", Type: TypeUUID},
		Column{Name: "body", From: "payload", Type: TypeJSONB}, Column{Name: "a", From: "json:a", Type: TypeText})
	w := &worker{enc: m.NewEncoder(0)}
	defer w.retire()
	event := func(n int) *Event {
		head := `{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","a":"x","p":"`
		return &Event{Data: []byte(head + strings.Repeat("x", n-len(head)-2) + `"}`)}
	}
	check := func(ev *Event, slab bool) Row {
		t.Helper()
		row, err := w.encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := m.NewEncoder(0).AppendTuple(nil, ev)
		if !bytes.Equal(row.Tuple, want) || cap(row.Tuple) != len(row.Tuple) {
			t.Errorf("%d-byte event: tuple of %d bytes (cap %d) differs from AppendTuple's %d", len(ev.Data), len(row.Tuple), cap(row.Tuple), len(want))
		}
		if (row.slab != nil) != slab {
			t.Errorf("%d-byte event: carved from a slab: %v, want %v", len(ev.Data), row.slab != nil, slab)
		}
		return row
	}
	big := event(1 << 20)
	ReleaseRows([]Row{check(big, false)})
	// Counted without the race detector (poisonSlabs is its build), whose
	// runtime allocates now and then on its own.
	if n := testing.AllocsPerRun(5, func() { w.encode(big) }); n != 1 && !poisonSlabs {
		t.Errorf("a 1 MiB event stored whole: %v allocations, want 1 (its tuple)", n)
	}
	// tupleCap is over ownSliceAbove, the tuple (payload and a) is not.
	small := event(ownSliceAbove - 100)
	if m.tupleCap(len(small.Data)) <= ownSliceAbove {
		t.Fatalf("tupleCap(%d) = %d: the case needs it over %d", len(small.Data), m.tupleCap(len(small.Data)), ownSliceAbove)
	}
	ReleaseRows([]Row{check(small, true)})
	noAllocs := func(what string, ev *Event) {
		t.Helper()
		var rows []Row
		n := testing.AllocsPerRun(20, func() {
			row, _ := w.encode(ev)
			if row.slab != nil {
				rows = append(rows[:0], row)
				ReleaseRows(rows)
			}
		})
		if n != 0 && !poisonSlabs {
			t.Errorf("%s: %v allocations per event, want none", what, n)
		}
	}
	noAllocs("an event just under ownSliceAbove", small)
	// A payload over max_event_bytes is refused before any column: no
	// allocation but the refusal's own.
	w.enc = m.NewEncoder(64 << 10)
	refusal := testing.AllocsPerRun(5, func() { w.enc.AppendTuple(nil, big) })
	if n := testing.AllocsPerRun(5, func() { w.encode(big) }); n > refusal && !poisonSlabs {
		t.Errorf("a 1 MiB event over max_event_bytes: %v allocations, want the refusal's %v alone", n, refusal)
	}
	// A mapping so wide that tupleCap is over ownSliceAbove for any event.
	cols := []Column{{Name: "body", From: "payload", Type: TypeJSONB}}
	for i := range 130 {
		cols = append(cols, Column{Name: fmt.Sprintf("f%d", i), From: fmt.Sprintf("json:f%d", i), Type: TypeText})
	}
	m = mustCompile(t, cols...)
	w.enc = m.NewEncoder(0)
	tiny := &Event{Data: []byte(`{"f0":"a","f1":"b"}`)}
	if m.tupleCap(len(tiny.Data)) <= ownSliceAbove {
		t.Fatalf("tupleCap(%d) = %d with %d columns: the case needs it over %d", len(tiny.Data), m.tupleCap(len(tiny.Data)), len(cols), ownSliceAbove)
	}
	ReleaseRows([]Row{check(tiny, true)})
	noAllocs("a small event of a 131-column mapping", tiny)
	// No payload column: the tuple's size is not known beforehand.
	m = mustCompile(t, Column{Name: "p", From: "json:p", Type: TypeText})
	w.enc = m.NewEncoder(0)
	ReleaseRows([]Row{check(big, false)})
}

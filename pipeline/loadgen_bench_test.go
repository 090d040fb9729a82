package pipeline_test

import (
	"testing"
	"time"

	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/pipeline"
)

// loadgenEvents returns n events exactly as `jetsink publish` and the drain
// benchmark make them: loadgen's payloads over 64 subjects, with the
// metadata the consumer fills in.
func loadgenEvents(n int) []pipeline.Event {
	evs := make([]pipeline.Event, n)
	now := time.Now()
	for i := range evs {
		seq := uint64(i) + 1
		e := loadgen.Make(1, seq, 64)
		evs[i] = pipeline.Event{
			Subject:     e.Subject("events"),
			Data:        e.AppendJSON(nil),
			Stream:      "EVENTS",
			StreamSeq:   seq,
			ConsumerSeq: seq,
			Delivered:   1,
			Published:   now,
			Received:    now,
			MsgID:       loadgen.MsgID(1, seq),
		}
	}
	return evs
}

// BenchmarkAppendTupleLoadgen is the encoder on exactly what the end-to-end
// benchmarks feed it: loadgen's events mapped with loadgen.Columns(). One op
// is one event; 1,024 distinct events are cycled so no single payload stays
// hot in the branch predictor.
func BenchmarkAppendTupleLoadgen(b *testing.B) {
	m, err := pipeline.Compile(loadgen.Columns())
	if err != nil {
		b.Fatal(err)
	}
	enc := m.NewEncoder(1 << 20)
	evs := loadgenEvents(1024)
	var size int
	for i := range evs {
		size += len(evs[i].Data)
	}
	b.SetBytes(int64(size / len(evs)))
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		buf, err = enc.AppendTuple(buf[:0], &evs[i&1023])
		if err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// TestAppendTupleLoadgenAllocs checks the loadgen mapping allocates nothing
// per event once the encoder is warm.
func TestAppendTupleLoadgenAllocs(t *testing.T) {
	m, err := pipeline.Compile(loadgen.Columns())
	if err != nil {
		t.Fatal(err)
	}
	enc := m.NewEncoder(1 << 20)
	evs := loadgenEvents(64)
	buf := make([]byte, 0, 1024)
	for i := range evs {
		if buf, err = enc.AppendTuple(buf[:0], &evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	if a := testing.AllocsPerRun(200, func() {
		if buf, err = enc.AppendTuple(buf[:0], &evs[i&63]); err != nil {
			t.Fatal(err)
		}
		i++
	}); a != 0 {
		t.Fatalf("AppendTuple allocates %v times per loadgen event", a)
	}
}

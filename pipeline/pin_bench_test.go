package pipeline

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/jetsink/jetsink/ringq"
)

// BenchmarkPin compares the pin modes for the whole worker hand-off: one
// producer dispatches events to the workers' rings, the workers encode,
// and one consumer pops the rows from the merge. One op is one event end
// to end. "meta" maps two metadata columns (the hand-off dominates);
// "telemetry" maps the 8-column JSON event.
func BenchmarkPin(b *testing.B) {
	mappings := []struct {
		name string
		cols []Column
		data []byte
	}{
		{"meta", []Column{{Name: "s", From: "meta:subject", Type: TypeText}, {Name: "q", From: "meta:stream_seq", Type: TypeInt8}}, []byte(`{}`)},
		{"telemetry", benchColumns, benchPayload},
	}
	for _, mp := range mappings {
		for _, pin := range []string{PinNone, PinThread, PinCPU} {
			b.Run(mp.name+"/"+pin, func(b *testing.B) {
				benchHandoff(b, pin, mp.cols, mp.data)
			})
		}
	}
}

func benchHandoff(b *testing.B, pin string, cols []Column, data []byte) {
	cfg := DefaultConfig()
	cfg.Pin = pin
	cfg.RingSize = 1024
	p, err := New(cfg, mustCompile(b, cols...), &recordingDeadLetterer{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	evs := make([]Event, 1024)
	for i := range evs {
		evs[i] = Event{Subject: "events.dev-" + strconv.Itoa(i%64), StreamSeq: uint64(i), Data: data}
	}
	ctx := context.Background()
	in := ringq.NewDispatch[Event](p.Workers(), cfg.RingSize, Key)
	out := ringq.NewMerge[Row](p.Workers(), cfg.RingSize)
	var wg sync.WaitGroup
	var runErr, pushErr error
	wg.Go(func() { runErr = p.Run(ctx, in, out) })
	b.ReportAllocs()
	b.ResetTimer()
	wg.Go(func() {
		defer in.Close()
		for i := range b.N {
			if pushErr = in.Push(ctx, evs[i&1023]); pushErr != nil {
				return
			}
		}
	})
	buf := make([]Row, 256)
	got := 0
	for {
		n, err := out.PopN(ctx, buf)
		if errors.Is(err, ringq.ErrClosed) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		got += n
		clear(buf[:n])
	}
	b.StopTimer()
	wg.Wait()
	if runErr != nil || pushErr != nil || got != b.N {
		b.Fatalf("run %v, push %v, %d rows of %d", runErr, pushErr, got, b.N)
	}
}

package loadgen

import (
	"context"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

// BenchmarkSend is the publisher's per-event cost: make the event, build
// its headers and reply subject, record it as in flight and hand it to the
// connection, with a traceparent (the default) and without
// (NoTraceContext). No stream captures the subject, so nats-server drops
// the messages and no PubAck comes back; its work on the same cores makes
// ns/op noisy, so compare the two in one run, with -count:
//
//	go test -run '^$' -bench Send -benchmem -count 8 ./loadgen
func BenchmarkSend(b *testing.B) {
	ns := testenv.NATS(b)
	nc := ns.Connect(b)
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		none bool
	}{{"traceparent", false}, {"no-trace-context", true}} {
		b.Run(bc.name, func(b *testing.B) {
			p, err := newPublisher(ctx, nc, Options{Subject: "bench", Subjects: 1000, MaxPending: 4096,
				AckWait: 5 * time.Second, Run: 1, NoTraceContext: bc.none})
			if err != nil {
				b.Fatal(err)
			}
			defer p.close()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				seq := uint64(i)
				p.send(ctx, seq, 0, 1, 0)
				p.mu.Lock()
				delete(p.pending, seq)
				p.mu.Unlock()
			}
		})
	}
}

// BenchmarkTraceparent is what a traceparent adds to building a message
// without a Tracer.
func BenchmarkTraceparent(b *testing.B) {
	var buf []byte
	var s string
	b.ReportAllocs()
	for b.Loop() {
		buf = appendUnsampledTraceparent(buf[:0])
		s = string(buf)
	}
	if len(s) != 55 {
		b.Fatalf("traceparent %q is %d bytes, want 55", s, len(s))
	}
}

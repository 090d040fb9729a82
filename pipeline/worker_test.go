package pipeline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jetsink/jetsink/ringq"
)

// queuedDeadLetterer records how many rows the worker's output ring held
// at each DeadLetter call.
type queuedDeadLetterer struct {
	h      *RingHandoff
	mu     sync.Mutex
	queued []int
}

func (q *queuedDeadLetterer) DeadLetter(_ context.Context, _ *Event, _ DeadLetter) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queued = append(q.queued, q.h.OutLen(0))
	return nil
}

// A worker pushes the rows it decoded before an event it dead-letters
// before it calls DeadLetter, which may take seconds (a dead-letter stream
// that does not answer): in the sink they get InProgress, held in the
// worker nothing renews their ack wait. The rows keep their order.
func TestWorkerPushesRowsBeforeDeadLetter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := testConfig(1, PinNone)
	h := NewHandoff(HandoffRing, 1, cfg.RingSize).(*RingHandoff)
	q := &queuedDeadLetterer{h: h}
	p, err := New(cfg, mustCompile(t, orderColumns...), q, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs := []Event{
		{Subject: "a", StreamSeq: 1, Data: []byte(`{"n":1}`)},
		{Subject: "a", StreamSeq: 2, Data: []byte(`{"n":2}`), Exhausted: true, Delivered: 3},
		{Subject: "a", StreamSeq: 3, Data: []byte(`{"n":3}`)},
		{Subject: "a", StreamSeq: 4, Data: []byte(`nope`)},
		{Subject: "a", StreamSeq: 5, Data: []byte(`{"n":5}`)},
	}
	// All in the ring before the worker starts: it pops them in one batch.
	for _, ev := range evs {
		if err := h.Push(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	if err := p.Run(ctx, h.In, h.Out); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(q.queued) != 2 || q.queued[0] != 1 || q.queued[1] != 2 {
		t.Fatalf("rows in the output ring at each DeadLetter call: %v, want [1 2] (the rows decoded before it)", q.queued)
	}
	var seqs []uint64
	buf := make([]Row, 8)
	for {
		n, err := h.PopN(ctx, buf)
		for _, r := range buf[:n] {
			seqs = append(seqs, r.Event.StreamSeq)
		}
		if errors.Is(err, ringq.ErrClosed) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(seqs) != 3 || seqs[0] != 1 || seqs[1] != 3 || seqs[2] != 5 {
		t.Fatalf("rows of stream seqs %v, want [1 3 5]", seqs)
	}
	if st := p.Stats(); st.Rows != 3 || st.DeadLettered != 2 {
		t.Fatalf("Stats = %+v, want 3 rows, 2 dead-lettered", st)
	}
}

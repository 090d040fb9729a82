package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jetsink/jetsink/tests/testenv"
)

// nextDL is the DeadLetterer behind Causes: it fails while err is set and
// records what it was handed.
type nextDL struct {
	err  error
	got  []DeadLetter
	seqs []uint64
}

func (n *nextDL) DeadLetter(_ context.Context, ev *Event, dl DeadLetter) error {
	n.got, n.seqs = append(n.got, dl), append(n.seqs, ev.StreamSeq)
	return n.err
}

// Causes hands a letter past max_deliver the kept cause of the event's
// failed letter (once, the deliveries put before its reason however often
// it fails again), not another event's or another epoch's, keeps no cause
// of a letter left to a re-created stream (stale), forgets one once a
// letter is stored, and keeps at most causesKept, the oldest forgotten
// first (one kept again after it was forgotten counts from then), each
// reason cut to causeReasonMax bytes.
func TestCausesKeepsTheFailedLettersCause(t *testing.T) {
	ctx := context.Background()
	next := &nextDL{err: errors.New("no stream")}
	c := &Causes{Next: next}
	bad := DeadLetter{Stage: StageDecode, Code: CodeInvalidJSON, Reason: "invalid character 'n'"}
	ev := &Event{Stream: "S", StreamSeq: 7, Epoch: 1, Delivered: 1}
	_ = c.DeadLetter(ctx, ev, bad)
	for d := uint32(2); d <= 3; d++ { // past max_deliver, still failing
		ev.Delivered = d
		_ = c.DeadLetter(ctx, ev, MaxDeliverDeadLetter(uint64(d)))
		got := next.got[len(next.got)-1]
		if got.Code != CodeInvalidJSON || got.Stage != StageDecode || strings.Count(got.Reason, "past nats.max_deliver") != 1 ||
			!strings.HasSuffix(got.Reason, ": "+bad.Reason) || !strings.HasPrefix(got.Reason, fmt.Sprintf("delivered %d times", d)) {
			t.Fatalf("delivery %d handed on %+v", d, got)
		}
	}
	other := &Event{Stream: "S", StreamSeq: 7, Epoch: 2, Delivered: 2} // the same sequence of a re-created stream
	_ = c.DeadLetter(ctx, other, MaxDeliverDeadLetter(2))
	if next.got[len(next.got)-1].Code != CodeMaxDeliver {
		t.Fatalf("another epoch's event got the cause: %+v", next.got[len(next.got)-1])
	}
	next.err = nil
	ev.Delivered = 4
	_ = c.DeadLetter(ctx, ev, MaxDeliverDeadLetter(4)) // stored
	_ = c.DeadLetter(ctx, ev, MaxDeliverDeadLetter(5))
	if next.got[len(next.got)-1].Code != CodeMaxDeliver {
		t.Fatal("the cause was kept after a letter was stored")
	}

	next.err = fmt.Errorf("left: %w", ErrStaleEpoch)
	stale := &Event{Stream: "S", StreamSeq: 8, Epoch: 1, Delivered: 1}
	_ = c.DeadLetter(ctx, stale, bad)
	if len(c.kept) != 0 {
		t.Fatalf("kept %d causes of letters left to a re-created stream", len(c.kept))
	}

	next.err = errors.New("no stream")
	for i := range causesKept + 10 {
		_ = c.DeadLetter(ctx, &Event{Stream: "S", StreamSeq: uint64(100 + i), Epoch: 1}, bad)
	}
	if len(c.kept) != causesKept {
		t.Fatalf("kept %d causes, want at most %d", len(c.kept), causesKept)
	}
	_ = c.DeadLetter(ctx, &Event{Stream: "S", StreamSeq: 100, Epoch: 1, Delivered: 2}, MaxDeliverDeadLetter(2))
	_ = c.DeadLetter(ctx, &Event{Stream: "S", StreamSeq: 100 + causesKept + 9, Epoch: 1, Delivered: 2}, MaxDeliverDeadLetter(2))
	if n := len(next.got); next.got[n-2].Code != CodeMaxDeliver || next.got[n-1].Code != CodeInvalidJSON {
		t.Fatalf("the oldest cause kept past the bound, or the newest forgotten: %+v, %+v", next.got[n-2], next.got[n-1])
	}
	if len(c.order) > 2*causesKept+1 {
		t.Fatalf("the order grew to %d keys", len(c.order))
	}

	// Kept, forgotten (a letter stored), kept again: it is the newest.
	c = &Causes{Next: next}
	k0 := &Event{Stream: "T", StreamSeq: 1, Epoch: 1}
	next.err = errors.New("no stream")
	_ = c.DeadLetter(ctx, k0, bad)
	next.err = nil
	_ = c.DeadLetter(ctx, k0, bad)
	next.err = errors.New("no stream")
	for i := range causesKept - 1 {
		_ = c.DeadLetter(ctx, &Event{Stream: "T", StreamSeq: uint64(2 + i), Epoch: 1}, bad)
	}
	long := bad
	long.Reason = strings.Repeat("é", causeReasonMax) // 2 bytes each
	_ = c.DeadLetter(ctx, k0, long)
	_ = c.DeadLetter(ctx, &Event{Stream: "T", StreamSeq: 1 << 20, Epoch: 1}, bad) // past the bound: the oldest goes
	if _, ok := c.lookup(causeKey{1, "T", 1}); !ok {
		t.Fatal("a cause kept again after it was forgotten was evicted as the oldest")
	}
	if _, ok := c.lookup(causeKey{1, "T", 2}); ok {
		t.Fatal("the oldest cause outlived the bound")
	}
	if r, _ := c.lookup(causeKey{1, "T", 1}); len(r.Reason) > causeReasonMax || !utf8.ValidString(r.Reason) {
		t.Fatalf("a kept reason of %d bytes (valid UTF-8: %v), want at most %d", len(r.Reason), utf8.ValidString(r.Reason), causeReasonMax)
	}
}

// For an event past max_deliver whose dead letter failed before, the
// letter handed to the dead-letterer, which logs it (the consumer, at
// Warn), is the kept cause, not max_deliver; and the worker logs no line
// of its own for a stored letter (it logged each at Info, beside the
// consumer's Warn, and only that one had the reason). Its line of the
// failed letter names the letter it would store.
func TestWorkerLogsTheLetterCausesStores(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next := &nextDL{err: errors.New("no stream")}
	c := &Causes{Next: next}
	m := mustCompile(t, Column{Name: "n", From: "json:n", Type: TypeInt8, Required: true})
	var logs testenv.SyncBuffer
	for _, ev := range []Event{
		{Subject: "a", Stream: "S", StreamSeq: 7, Epoch: 1, Delivered: 1, Data: []byte(`{"n":`)},
		{Subject: "a", Stream: "S", StreamSeq: 7, Epoch: 1, Delivered: 3, Exhausted: true, Data: []byte(`{"n":`)},
	} {
		if ev.Exhausted {
			next.err = nil
		}
		cfg := testConfig(1, PinNone)
		p, err := New(cfg, m, c, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		ReleaseRows(runBatch(t, ctx, p, NewHandoff(HandoffRing, 1, cfg.RingSize).(*RingHandoff), []Event{ev}))
	}
	if len(next.got) != 2 || next.got[1].Code != CodeInvalidJSON || next.got[1].Stage != StageDecode ||
		!strings.Contains(next.got[1].Reason, "past nats.max_deliver") {
		t.Fatalf("handed on %+v, want the invalid_json letter twice, the second past nats.max_deliver", next.got)
	}
	var failed int
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "dead-lettered") {
			t.Errorf("the worker logged a stored letter, which the dead-letterer logs: %q", l)
		}
		if strings.Contains(l, "dead-letter failed") {
			failed++
			if !strings.Contains(l, "stage=decode") || !strings.Contains(l, "code=invalid_json") {
				t.Errorf("the failed letter's log line names another letter: %q", l)
			}
		}
	}
	if failed != 1 {
		t.Errorf("%d lines of a failed letter, want 1:\n%s", failed, logs.String())
	}
}

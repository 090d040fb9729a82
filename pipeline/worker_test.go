package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetsink/jetsink/ringq"
	"github.com/jetsink/jetsink/tests/testenv"
)

// blockingDeadLetterer records each DeadLetter call as it starts, and
// holds it until release is closed (or ctx ends).
type blockingDeadLetterer struct {
	release chan struct{}
	mu      sync.Mutex
	started []*Event // copies
	active  int
	most    int // calls under way at once, at most
}

func (b *blockingDeadLetterer) DeadLetter(ctx context.Context, ev *Event, _ DeadLetter) error {
	b.mu.Lock()
	c := *ev
	b.started = append(b.started, &c)
	b.active++
	b.most = max(b.most, b.active)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.active--
		b.mu.Unlock()
	}()
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *blockingDeadLetterer) snapshot() (started []*Event, most int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*Event(nil), b.started...), b.most
}

// blockedPipeline is a one-worker pipeline whose dead letters block
// (blockingDeadLetterer), its hand-off, and a context for the test.
func blockedPipeline(t *testing.T) (context.Context, *RingHandoff, *blockingDeadLetterer, *Pipeline) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	cfg := testConfig(1, PinNone)
	b := &blockingDeadLetterer{release: make(chan struct{})}
	p, err := New(cfg, mustCompile(t, orderColumns...), b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, NewHandoff(HandoffRing, 1, cfg.RingSize).(*RingHandoff), b, p
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s", what)
		}
	}
}

// A worker hands a dead letter to its lane and goes on: the rows of the
// events behind a poison event reach the sink while its letter is being
// stored (one round trip or more each; before, the events behind waited,
// without an InProgress, and a burst of poison events held them past
// ack_wait). A lane's queue has no bound of its own: a flood of 100 poison
// events on one subject does not hold the rows behind it (with 32 queued
// at most, as the lanes had first, it did). Letters of different subjects
// are stored at once; those of one subject in order. Run returns once
// every letter is stored.
func TestWorkerGoesOnWhileALetterIsStored(t *testing.T) {
	ctx, h, b, p := blockedPipeline(t)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, h.In, h.Out) }()
	seq := uint64(0)
	add := func(subject, data string) {
		seq++
		if err := h.Push(ctx, Event{Subject: subject, StreamSeq: seq, Data: []byte(data)}); err != nil {
			t.Fatal(err)
		}
	}
	add("a", `nope`)
	for range 5 {
		add("a", `{"n":1}`)
	}
	waitFor(t, "the rows behind the first poison event while its letter is stored", func() bool { return h.OutLen(0) == 5 })
	for i := range 100 {
		if i < 20 {
			add(fmt.Sprintf("s%d", i), `nope`)
		}
		add("b", `nope`)
	}
	for range 5 {
		add("c", `{"n":2}`)
	}
	h.Close()
	waitFor(t, "the rows behind a flood of 100 letters on one subject", func() bool { return h.OutLen(0) == 10 })
	waitFor(t, "letters of other subjects stored at once", func() bool { _, most := b.snapshot(); return most >= 2 })
	if st := p.Stats(); st.LettersWaiting < 90 {
		t.Fatalf("Stats = %+v, want subject b's letters waiting", st)
	}
	close(b.release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	started, _ := b.snapshot()
	if len(started) != 121 {
		t.Fatalf("%d letters, want 121", len(started))
	}
	var bSeqs []uint64
	for _, ev := range started {
		if ev.Subject == "b" {
			bSeqs = append(bSeqs, ev.StreamSeq)
		}
	}
	if !slices.IsSorted(bSeqs) || len(bSeqs) != 100 {
		t.Fatalf("subject b's letters in the order %v, want its 100 in stream order", bSeqs)
	}
	if st := p.Stats(); st.Rows != 10 || st.DeadLettered != 121 || st.LettersWaiting != 0 {
		t.Fatalf("Stats = %+v, want 10 rows, 121 dead-lettered, none waiting", st)
	}
}

// When its letters reach their limit (stored slowly, or not at all, and
// more of them than SetLetterLimit allows), the worker pushes the rows it
// decoded before it waits for room: on their way to the sink they get its
// InProgress, held in the worker nothing renews their ack wait. A hard
// stop ends the wait, and the letters queued then are handed to no one
// (their events come back after ack_wait): a letter failed for the cancel
// would count and log a failure of the dead-letter stream.
func TestWorkerPushesRowsBeforeWaitingForRoomForLetters(t *testing.T) {
	ctx, h, b, p := blockedPipeline(t)
	const limit = 4
	p.SetLetterLimit(func() int { return limit })
	// One letter under way and limit queued; a row decoded after them
	// waits in the worker until the next letter finds no room.
	seq := uint64(0)
	push := func(data string) {
		seq++
		if err := h.Push(ctx, Event{Subject: "a", StreamSeq: seq, Data: []byte(data)}); err != nil {
			t.Fatal(err)
		}
	}
	push(`{"n":1}`)
	for range 1 + limit {
		push(`nope`)
	}
	push(`{"n":2}`)
	push(`nope`)
	push(`{"n":3}`)
	hard, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(hard, h.In, h.Out) }()
	waitFor(t, "the rows decoded before the letters' limit", func() bool { return h.OutLen(0) == 2 })
	waitFor(t, "the first letter under way", func() bool { started, _ := b.snapshot(); return len(started) == 1 })
	time.Sleep(50 * time.Millisecond) // the worker waits for room: nothing behind it is decoded
	if n := h.OutLen(0); n != 2 {
		t.Fatalf("%d rows out while the worker waits for room, want 2", n)
	}
	if st := p.Stats(); st.LettersWaiting != limit {
		t.Fatalf("Stats = %+v, want %d letters waiting", st, limit)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if started, _ := b.snapshot(); len(started) != 1 {
		t.Fatalf("%d letters handed on, want the one under way at the stop", len(started))
	}
	if st := p.Stats(); st.DeadLetterFailed != 1 || st.DeadLettered != 0 || st.LettersWaiting != 0 {
		t.Fatalf("Stats = %+v, want the one under way failed, none waiting", st)
	}
}

// beatMsg counts the InProgress it gets, and whether it got one once its
// letter was under way (and then its event terminated).
type beatMsg struct {
	Msg
	beats atomic.Int64
	under atomic.Bool // its letter is under way
	late  atomic.Bool
	fail  bool // every InProgress fails
}

func (m *beatMsg) InProgress() error {
	if m.under.Load() {
		m.late.Store(true)
	}
	m.beats.Add(1)
	if m.fail {
		return errors.New("connection closed")
	}
	return nil
}

// termingDeadLetterer marks each letter's beatMsg under way and blocks it
// until release is closed, as the consumer's dead-letterer publishes the
// letter and then terms the message.
type termingDeadLetterer struct {
	blockingDeadLetterer
}

func (d *termingDeadLetterer) DeadLetter(ctx context.Context, ev *Event, dl DeadLetter) error {
	ev.Msg.(*beatMsg).under.Store(true)
	return d.blockingDeadLetterer.DeadLetter(ctx, ev, dl)
}

// Events waiting in a lane for their dead letters get InProgress every
// period (SetHeartbeat), as the sink's rows do, so that a dead-letter
// stream answering slowly does not leave them past ack_wait; the letter
// under way gets none (it is settled once its publish returns), nor does
// an event taken before its stream was re-created (Epochs), nor any once
// its letter is stored.
func TestWaitingLettersGetInProgress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := testConfig(1, PinNone)
	d := &termingDeadLetterer{blockingDeadLetterer{release: make(chan struct{})}}
	p, err := New(cfg, mustCompile(t, orderColumns...), d, nil)
	if err != nil {
		t.Fatal(err)
	}
	var epochs Epochs
	const every = 40 * time.Millisecond
	p.SetHeartbeat(every, &epochs)
	h := NewHandoff(HandoffRing, 1, cfg.RingSize).(*RingHandoff)
	old, cur := epochs.Current(), epochs.Advance()
	msgs := make([]*beatMsg, 6)
	for i := range msgs {
		msgs[i] = &beatMsg{}
		ev := Event{Msg: msgs[i], Subject: "a", StreamSeq: uint64(i + 1), Data: []byte(`nope`), Received: time.Now(), Epoch: cur}
		if i == 5 {
			ev.Epoch = old // taken before the stream was re-created
		}
		if err := h.Push(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, h.In, h.Out) }()
	waitFor(t, "two InProgress for each waiting letter of the current epoch", func() bool {
		for _, m := range msgs[1:5] {
			if m.beats.Load() < 2 {
				return false
			}
		}
		return true
	})
	if n := msgs[5].beats.Load(); n != 0 {
		t.Errorf("the event of the stream re-created since got %d InProgress, want none", n)
	}
	if st := p.Stats(); st.LetterInProgress < 8 || st.LettersWaiting != 5 {
		t.Errorf("Stats = %+v, want at least 8 InProgress sent and 5 letters waiting", st)
	}
	close(d.release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for i, m := range msgs {
		if m.late.Load() {
			t.Errorf("event %d got InProgress while or after its letter was stored", i+1)
		}
	}
}

// testLetterer is a worker's lanes with the heartbeat period every, not
// started: the test puts, takes and beats itself.
func testLetterer(every time.Duration) *letterer {
	l := &letterer{p: &Pipeline{beatEvery: every}, queued: new(atomic.Int64)}
	for i := range l.lanes {
		l.lanes[i].wake = make(chan struct{}, 1)
	}
	return l
}

// A lane beats its letters in chunks, letting its lock go between them:
// every due letter of a long lane is beaten once, also while letters are
// taken from its front and put at its back meanwhile (the numbering by
// letters taken keeps the place), and none twice.
func TestLaneBeatsALongLaneInChunks(t *testing.T) {
	const every = time.Minute
	l := testLetterer(every)
	start := time.Now()
	ln := l.lane(&Event{Subject: "a"})
	const n = 5*beatChunk + 7
	msgs := make([]*beatMsg, n)
	for i := range msgs {
		msgs[i] = &beatMsg{}
		l.put(letter{ev: Event{Msg: msgs[i], Subject: "a", Received: start.Add(-time.Hour)}})
	}
	// Between chunks, as the lane takes from the front and the worker
	// puts letters not yet due: more taken than put, so that put slides
	// the waiting letters down the slice.
	took := 0
	var fresh []*beatMsg
	ln.betweenChunks = func() {
		for range beatChunk {
			ln.take()
			took++
			if took%2 == 0 {
				m := &beatMsg{}
				fresh = append(fresh, m)
				l.put(letter{ev: Event{Msg: m, Subject: "a", Received: start}})
			}
		}
	}
	sent, failed, _ := ln.beat(start, every, nil)
	ln.betweenChunks = nil
	var beaten uint64
	for i, m := range msgs {
		b := m.beats.Load()
		if b > 1 || i >= took && b != 1 {
			t.Fatalf("letter %d (of %d, %d taken) beaten %d times, want once if still waiting, at most once if taken", i, n, took, b)
		}
		beaten += uint64(b)
	}
	for _, m := range fresh {
		if m.beats.Load() != 0 {
			t.Fatal("a letter not yet due was beaten")
		}
	}
	if failed != 0 || sent != beaten {
		t.Fatalf("%d sent, %d failed; the letters got %d", sent, failed, beaten)
	}
	// Once more, with nothing taken in between: every waiting letter due.
	sent, _, _ = ln.beat(start.Add(every), every, nil)
	if want := uint64(n - took + len(fresh)); sent != want {
		t.Fatalf("a second beat sent %d, want all %d waiting", sent, want)
	}
}

// runBatch puts evs in the worker's input ring before it starts, so that
// it pops them in one batch, runs p until the ring is drained, and returns
// the rows it pushed.
func runBatch(t *testing.T, ctx context.Context, p *Pipeline, h *RingHandoff, evs []Event) []Row {
	t.Helper()
	for _, ev := range evs {
		if err := h.Push(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	if err := p.Run(ctx, h.In, h.Out); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var rows []Row
	buf := make([]Row, 8)
	for {
		n, err := h.PopN(ctx, buf)
		rows = append(rows, buf[:n]...)
		if errors.Is(err, ringq.ErrClosed) {
			return rows
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// failingDeadLetterer fails every call with err.
type failingDeadLetterer struct{ err error }

func (f failingDeadLetterer) DeadLetter(context.Context, *Event, DeadLetter) error { return f.err }

// A dead letter the consumer's breaker held back is counted, not logged by
// the worker (the consumer logs those at most once a second): a run of
// poison events while the dead-letter stream hangs would be a line each.
// Other failures are logged at most once a second, with the number held
// back (they fail at every delivery of every such event).
func TestWorkerDoesNotLogDeadLettersHeldBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		err   error
		lines int
	}{
		{fmt.Errorf("dead letter: %w", ErrDeadLetterHeldBack), 0},
		{errors.New("dead letter: no responders"), 1},
	} {
		var logs testenv.SyncBuffer
		cfg := testConfig(1, PinNone)
		h := NewHandoff(HandoffRing, 1, cfg.RingSize).(*RingHandoff)
		p, err := New(cfg, mustCompile(t, orderColumns...), failingDeadLetterer{c.err}, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if err := h.Push(ctx, Event{Subject: "a", StreamSeq: uint64(i + 1), Data: []byte(`nope`)}); err != nil {
				t.Fatal(err)
			}
		}
		h.Close()
		began := time.Now()
		if err := p.Run(ctx, h.In, h.Out); err != nil {
			t.Fatalf("Run: %v", err)
		}
		most := c.lines * (1 + int(time.Since(began)/failedDeadLetterEvery))
		if st := p.Stats(); st.DeadLetterFailed != 50 {
			t.Errorf("%v: DeadLetterFailed %d, want 50", c.err, st.DeadLetterFailed)
		}
		if n := strings.Count(logs.String(), "dead-letter failed"); n < c.lines || n > most {
			t.Errorf("%v: %d log lines of failed dead letters, want %d to %d", c.err, n, c.lines, most)
		}
	}
}

// At a hard stop the letters still queued in the lanes are left to
// JetStream, which delivers their events again after ack_wait; but not an
// event whose stream was re-created since it was taken (an old epoch):
// nothing delivers it again, and the stop says so at Error, with how many.
func TestHardStopLogsStaleLettersLeft(t *testing.T) {
	for _, recreated := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var logs testenv.SyncBuffer
		cfg := testConfig(1, PinNone)
		b := &blockingDeadLetterer{release: make(chan struct{})}
		p, err := New(cfg, mustCompile(t, orderColumns...), b, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		var epochs Epochs
		p.SetHeartbeat(time.Hour, &epochs)
		h := NewHandoff(HandoffRing, 1, cfg.RingSize).(*RingHandoff)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx, h.In, h.Out) }()
		for i := range 5 { // one letter under way, four queued behind it
			if err := h.Push(ctx, Event{Subject: "a", StreamSeq: uint64(i + 1), Data: []byte(`nope`), Epoch: epochs.Current()}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "one letter under way and four queued", func() bool {
			started, _ := b.snapshot()
			return len(started) == 1 && p.Stats().LettersWaiting == 4
		})
		if recreated {
			epochs.Advance()
		}
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
		line := "hard stop: dead letters left unpublished"
		switch got := logs.String(); {
		case recreated && (!strings.Contains(got, line) || !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "events=4")):
			t.Errorf("stream re-created: log %q, want an Error line %q with events=4", got, line)
		case !recreated && strings.Contains(got, line):
			t.Errorf("same stream: log %q, want no line %q (JetStream delivers them again)", got, line)
		}
	}
}

// panickyMsg is a message whose header block panics when read: a stand-in
// for a decoder bug that one event's bytes reach.
type panickyMsg struct{ Msg }

func (panickyMsg) HeaderLookup(string) (string, bool)      { panic("bad header block") }
func (panickyMsg) HeaderGet(string) string                 { panic("bad header block") }
func (panickyMsg) HeaderFold(string) string                { panic("bad header block") }
func (panickyMsg) HeaderFields() iter.Seq2[string, string] { panic("bad header block") }

// A panic while encoding one event is that event's dead letter (stage
// decode, code internal), logged at Error with its stack, at most once a
// second; the events around it become rows, encoded as a fresh encoder
// would (the panic cut a tuple short). Before, it ended the process, and
// the event, redelivered, ended it again until max_deliver.
func TestWorkerDeadLettersAnEventWhoseDecodingPanics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cols := []Column{
		{Name: "n", From: "json:n", Type: TypeInt8, Required: true},
		{Name: "h", From: "header:X-Site", Type: TypeText},
	}
	m := mustCompile(t, cols...)
	var logs testenv.SyncBuffer
	dl := &recordingDeadLetterer{}
	cfg := testConfig(1, PinNone)
	h := NewHandoff(HandoffRing, 1, cfg.RingSize).(*RingHandoff)
	p, err := New(cfg, m, dl, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	for i := range 6 {
		ev := Event{Subject: "a", Stream: "S", StreamSeq: uint64(i + 1), Data: fmt.Appendf(nil, `{"n":%d}`, i+1)}
		if i%2 == 1 {
			ev.Msg = panickyMsg{}
		}
		evs = append(evs, ev)
	}
	rows := runBatch(t, ctx, p, h, evs)
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3 (events 1, 3 and 5)", len(rows))
	}
	for i, r := range rows {
		want, err := m.NewEncoder(0).AppendTuple(nil, &evs[2*i])
		if err != nil {
			t.Fatal(err)
		}
		if r.Event.StreamSeq != evs[2*i].StreamSeq || !bytes.Equal(r.Tuple, want) {
			t.Errorf("row %d: event %d, tuple %x; want event %d, tuple %x", i, r.Event.StreamSeq, r.Tuple, evs[2*i].StreamSeq, want)
		}
	}
	ReleaseRows(rows)
	got := dl.snapshot()
	if len(got) != 3 {
		t.Fatalf("dead letters %+v, want those of events 2, 4 and 6", got)
	}
	for i, d := range got {
		if d.seq != uint64(2*i+2) || d.dl.Stage != StageDecode || d.dl.Code != CodeInternal || !strings.Contains(d.dl.Reason, "panic while decoding the event, a bug of jetsink's: bad header block") {
			t.Errorf("dead letter %d = %+v, want event %d, stage decode, code internal, the panic in the reason", i, d, 2*i+2)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "decoder panic"); n != 1 || !strings.Contains(out, "level=ERROR") ||
		!strings.Contains(out, "stream_seq=2") || !strings.Contains(out, "panickyMsg.HeaderLookup") {
		t.Errorf("want one Error line for the first panic, with the stack (the other two held back), got %d:\n%s", n, out)
	}
}

// An outlier event does not leave a worker holding buffers its size for
// good: the encoder drops what grew past keepBuf at the next event, and the
// worker its scratch tuple, also when the event failed after a column had
// grown it.
func TestWorkerDropsBuffersAnOutlierGrew(t *testing.T) {
	w := &worker{enc: mustCompile(t,
		Column{Name: "a", From: "json:a", Type: TypeText},
		Column{Name: "u", From: "json:u", Type: TypeUUID},
	).NewEncoder(0)}
	big := strings.Repeat("x", 1<<20)
	// a fills the scratch tuple with 1 MiB; u's escaped 1 MiB string is
	// unescaped into the encoder's string buffer, and is no uuid.
	_, err := w.encode(&Event{Data: []byte(`{"a":"` + big + `","u":"\n` + big + `"}`)})
	if err == nil {
		t.Fatal("an event with no uuid in u was encoded")
	}
	if c := cap(w.scratch); c > 4*slabSize {
		t.Errorf("the worker keeps a %d-byte scratch tuple after a failed outlier", c)
	}
	if _, err := w.encode(&Event{Data: []byte(`{"a":"b","u":"8f1c2a6e-5b7d-4c3e-9a1f-0d2e3c4b5a69"}`)}); err != nil {
		t.Fatal(err)
	}
	if c := max(cap(w.enc.strBuf), cap(w.enc.keyBuf)); c > keepBuf {
		t.Errorf("the encoder keeps a %d-byte buffer after an outlier, one event later", c)
	}
}

// subjectDeadLetterer holds the letters of subject hold until release is
// closed (or ctx ends), and stores every other at once; it records the
// subjects of the letters stored.
type subjectDeadLetterer struct {
	hold    string
	release chan struct{}
	mu      sync.Mutex
	stored  []string
}

func (d *subjectDeadLetterer) DeadLetter(ctx context.Context, ev *Event, _ DeadLetter) error {
	if ev.Subject == d.hold {
		select {
		case <-d.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stored = append(d.stored, ev.Subject)
	return nil
}

func (d *subjectDeadLetterer) has(subject string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Contains(d.stored, subject)
}

// Each worker has lanes of its own: a flood of poison events on one
// worker's subject, its letters at their limit and slow, does not hold the
// letter of another worker's subject whose key picks the same lane (with
// lanes shared, that letter waited behind the flood, and the other worker
// with it, its events past ack_wait).
func TestOneWorkersFloodDoesNotHoldAnothersLetters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lane := func(s string) uint64 { return (Key(&Event{Subject: s}) >> 60) % letterLanes }
	worker := func(s string) uint64 { return Key(&Event{Subject: s}) & 1 }
	x, y := "x", ""
	for i := 0; y == ""; i++ {
		if s := fmt.Sprintf("y%d", i); lane(s) == lane(x) && worker(s) != worker(x) {
			y = s
		}
	}
	cfg := testConfig(2, PinNone)
	d := &subjectDeadLetterer{hold: x, release: make(chan struct{})}
	p, err := New(cfg, mustCompile(t, orderColumns...), d, nil)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 4
	p.SetLetterLimit(func() int { return limit })
	h := NewHandoff(HandoffRing, 2, cfg.RingSize).(*RingHandoff)
	// One letter under way, limit queued, one the worker holds while it
	// waits for room, one more in its batch.
	for i := range 2 + limit + 1 {
		if err := h.Push(ctx, Event{Subject: x, StreamSeq: uint64(i + 1), Data: []byte(`nope`)}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, h.In, h.Out) }()
	waitFor(t, "x's worker to fill its lane", func() bool { return h.InLen(int(worker(x))) == 0 })
	if err := h.Push(ctx, Event{Subject: y, StreamSeq: 100, Data: []byte(`nope`)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the other worker's letter, in the same lane as x's flood", func() bool { return d.has(y) })
	close(d.release)
	h.Close()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st := p.Stats(); st.DeadLettered != 2+limit+1+1 {
		t.Fatalf("Stats = %+v, want %d dead-lettered", st, 2+limit+1+1)
	}
}

// A lane beats a letter only once it is due: half a period after its
// event was delivered, then a period after each beat, and a quarter
// period after a failed one.
func TestLaneBeatsWhenDue(t *testing.T) {
	const every = time.Minute
	l := testLetterer(every)
	start := time.Now()
	m := &beatMsg{}
	l.put(letter{ev: Event{Msg: m, Subject: "a", Received: start.Add(-10 * time.Second)}})
	ln := l.lane(&Event{Subject: "a"})
	beat := func(at time.Duration) uint64 {
		sent, _, _ := ln.beat(start.Add(at), every, nil)
		return sent
	}
	for _, c := range []struct {
		at   time.Duration
		want uint64
	}{
		{0, 0},                 // delivered 10 s ago: due at 20 s
		{19 * time.Second, 0},  //
		{20 * time.Second, 1},  // the first beat; the next a period on
		{21 * time.Second, 0},  //
		{79 * time.Second, 0},  //
		{80 * time.Second, 1},  //
		{80 * time.Second, 0},  // not twice at one time
		{140 * time.Second, 1}, //
		{141 * time.Second, 0}, //
	} {
		if got := beat(c.at); got != c.want {
			t.Fatalf("beat at %v sent %d, want %d", c.at, got, c.want)
		}
	}
	if n := m.beats.Load(); n != 3 {
		t.Fatalf("%d InProgress, want 3", n)
	}
	// A failed beat is tried again a quarter period on.
	f := &beatMsg{fail: true}
	l.put(letter{ev: Event{Msg: f, Subject: "b", Received: start}})
	lb := l.lane(&Event{Subject: "b"})
	for _, c := range []struct {
		at           time.Duration
		sent, failed uint64
	}{
		{30 * time.Second, 1, 1},
		{44 * time.Second, 0, 0},
		{45 * time.Second, 1, 1},
	} {
		if sent, failed, _ := lb.beat(start.Add(c.at), every, nil); sent != c.sent || failed != c.failed {
			t.Fatalf("beat at %v: %d sent, %d failed, want %d and %d", c.at, sent, failed, c.sent, c.failed)
		}
	}
}

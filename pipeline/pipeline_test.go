package pipeline

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"

	"github.com/jetsink/jetsink/ringq"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// recordingDeadLetterer is the DeadLetterer interface's recording
// implementation: it keeps what it was given and can be told to fail.
type recordingDeadLetterer struct {
	mu    sync.Mutex
	got   []recorded
	fail  error
	calls int
}

type recorded struct {
	subject string
	seq     uint64
	dl      DeadLetter
}

func (r *recordingDeadLetterer) DeadLetter(_ context.Context, ev *Event, dl DeadLetter) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.fail != nil {
		return r.fail
	}
	r.got = append(r.got, recorded{subject: ev.Subject, seq: ev.StreamSeq, dl: dl})
	return nil
}

func (r *recordingDeadLetterer) snapshot() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.got...)
}

var orderColumns = []Column{
	{Name: "subject", From: "meta:subject", Type: TypeText, Required: true},
	{Name: "n", From: "json:n", Type: TypeInt8, Required: true},
}

func testConfig(workers int, pin string) Config {
	c := DefaultConfig()
	c.Workers = workers
	c.Pin = pin
	c.RingSize = 64 // small, so back-pressure is exercised
	return c
}

// runPipeline pushes evs through a pipeline and returns the rows in the
// order the merge produced them, and Run's error.
func runPipeline(t *testing.T, cfg Config, cols []Column, dl DeadLetterer, evs []Event) ([]Row, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := New(cfg, mustCompile(t, cols...), dl, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandoff(cfg.Handoff, p.Workers(), cfg.RingSize)

	var wg sync.WaitGroup
	var runErr, pushErr error
	wg.Go(func() {
		if rh, ok := h.(*RingHandoff); ok {
			runErr = p.Run(ctx, rh.In, rh.Out)
		} else {
			runErr = p.RunHandoff(ctx, h)
		}
	})
	wg.Go(func() {
		defer h.Close()
		for _, ev := range evs {
			if pushErr = h.Push(ctx, ev); pushErr != nil {
				return
			}
		}
	})
	var rows []Row
	buf := make([]Row, 100)
	for {
		n, err := h.PopN(ctx, buf)
		if errors.Is(err, ringq.ErrClosed) {
			break
		}
		if err != nil {
			t.Errorf("pop rows: %v", err)
			break
		}
		rows = append(rows, buf[:n]...)
	}
	wg.Wait()
	if pushErr != nil {
		t.Errorf("push events: %v", pushErr)
	}
	return rows, runErr
}

// Per-subject order and the drain hold with 3 workers and with 64, more
// than this machine's cores: workers: 0 on a 64-core host gives 64, and
// pin: cpu then wraps the CPUs.
func TestRunKeepsSubjectOrderAndDrains(t *testing.T) {
	type variant struct {
		pin, handoff string
		workers      int
	}
	variants := []variant{
		{PinNone, HandoffRing, 3}, {PinThread, HandoffRing, 3}, {PinNone, HandoffChannel, 3}, {PinNone, HandoffRing, 64},
	}
	if runtime.GOOS == "linux" { // pin: cpu is Linux's sched_setaffinity
		variants = append(variants, variant{PinCPU, HandoffRing, 3}, variant{PinCPU, HandoffRing, 64})
	}
	for _, v := range variants {
		t.Run(v.pin+"/"+v.handoff+"/"+strconv.Itoa(v.workers), func(t *testing.T) {
			subjects, perSubject := 17, 400
			if v.workers > subjects {
				subjects, perSubject = 4*v.workers, 40 // a few subjects on every worker's ring
			}
			var evs []Event
			seq := uint64(0)
			for i := range perSubject {
				for s := range subjects {
					seq++
					ev := Event{Subject: "events.dev-" + strconv.Itoa(s), StreamSeq: seq,
						Data: fmt.Appendf(nil, `{"n":%d}`, i)}
					if i%97 == 5 && s == 3 {
						ev.Data = []byte(`{"n":`) // undecodable
					}
					evs = append(evs, ev)
				}
			}
			dl := &recordingDeadLetterer{}
			cfg := testConfig(v.workers, v.pin)
			cfg.Handoff = v.handoff
			rows, err := runPipeline(t, cfg, orderColumns, dl, evs)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			bad := dl.snapshot()
			if len(rows)+len(bad) != len(evs) {
				t.Fatalf("%d rows + %d dead letters, want %d events", len(rows), len(bad), len(evs))
			}
			last := map[string]int64{}
			for _, r := range rows {
				f := fields(t, r.Tuple)
				subj := string(f[0])
				if subj != r.Event.Subject {
					t.Fatalf("tuple subject %q, event subject %q", subj, r.Event.Subject)
				}
				n := int64(be64toU(f[1]))
				if prev, ok := last[subj]; ok && n <= prev {
					t.Fatalf("subject %s: n=%d after %d: order lost", subj, n, prev)
				}
				last[subj] = n
			}
			for _, b := range bad {
				if b.subject != "events.dev-3" || b.dl.Stage != StageDecode || b.dl.Code != CodeInvalidJSON {
					t.Fatalf("unexpected dead letter %+v", b)
				}
			}
			if len(bad) == 0 {
				t.Fatal("no dead letters")
			}
		})
	}
}

func be64toU(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

func TestRunDeadLetterFailureIsLoggedNotFatal(t *testing.T) {
	dl := &recordingDeadLetterer{fail: errors.New("publish timed out")}
	evs := []Event{
		{Subject: "a", Data: []byte(`{"n":1}`)},
		{Subject: "a", Data: []byte(`nope`)},
		{Subject: "a", Data: []byte(`{"n":2}`)},
	}
	rows, err := runPipeline(t, testConfig(1, PinNone), orderColumns, dl, evs)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(rows) != 2 || dl.calls != 1 {
		t.Fatalf("%d rows, %d dead-letter calls; want 2 and 1", len(rows), dl.calls)
	}
}

// An event the consumer marked Exhausted (delivered past nats.max_deliver)
// is dead-lettered undecoded, whatever it holds, with stage deliver and
// code max_deliver; the events around it become rows.
func TestRunDeadLettersExhaustedUndecoded(t *testing.T) {
	dl := &recordingDeadLetterer{}
	evs := []Event{
		{Subject: "a", StreamSeq: 1, Data: []byte(`{"n":1}`), Delivered: 1},
		{Subject: "a", StreamSeq: 2, Data: []byte(`{"n":2}`), Delivered: 11, Exhausted: true},
		{Subject: "a", StreamSeq: 3, Data: []byte(`nope`), Delivered: 12, Exhausted: true},
		{Subject: "a", StreamSeq: 4, Data: []byte(`{"n":4}`), Delivered: 10},
	}
	rows, err := runPipeline(t, testConfig(1, PinNone), orderColumns, dl, evs)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Event.StreamSeq != 1 || rows[1].Event.StreamSeq != 4 {
		t.Fatalf("%d rows, want those of events 1 and 4", len(rows))
	}
	got := dl.snapshot()
	if len(got) != 2 {
		t.Fatalf("dead letters %+v, want 2", got)
	}
	for i, d := range got {
		want := fmt.Sprintf("delivered %d times without being stored", evs[i+1].Delivered)
		if d.seq != evs[i+1].StreamSeq || d.dl.Stage != StageDeliver || d.dl.Code != CodeMaxDeliver || !strings.Contains(d.dl.Reason, want) {
			t.Fatalf("dead letter %d = %+v, want event %d at stage %s, code %s, reason %q", i, d, evs[i+1].StreamSeq, StageDeliver, CodeMaxDeliver, want)
		}
	}
}

func TestRunTooLarge(t *testing.T) {
	cfg := testConfig(1, PinNone)
	cfg.MaxEventBytes = 10
	dl := &recordingDeadLetterer{}
	evs := []Event{{Subject: "a", Data: []byte(`{"n":1}`)}, {Subject: "a", Data: []byte(`{"n":12345678}`)}}
	rows, err := runPipeline(t, cfg, orderColumns, dl, evs)
	if err != nil {
		t.Fatal(err)
	}
	got := dl.snapshot()
	if len(rows) != 1 || len(got) != 1 || got[0].dl.Code != CodeTooLarge {
		t.Fatalf("rows %d, dead letters %+v", len(rows), got)
	}
}

func TestRunCancelClosesOutputs(t *testing.T) {
	for _, kind := range []string{HandoffRing, HandoffChannel} {
		t.Run(kind, func(t *testing.T) { testRunCancelClosesOutputs(t, kind) })
	}
}

func testRunCancelClosesOutputs(t *testing.T, kind string) {
	p, err := New(testConfig(2, PinNone), mustCompile(t, orderColumns...), &recordingDeadLetterer{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandoff(kind, 2, 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.RunHandoff(ctx, h) }()
	if err := h.Push(ctx, Event{Subject: "x", Data: []byte(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	// Every output is closed: the sink's side drains and reports ErrClosed.
	buf := make([]Row, 8)
	tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer tcancel()
	for {
		_, err := h.PopN(tctx, buf)
		if errors.Is(err, ringq.ErrClosed) {
			break
		}
		if err != nil {
			t.Fatalf("PopN: %v", err)
		}
	}
}

func TestRunRingMismatch(t *testing.T) {
	p, err := New(testConfig(2, PinNone), mustCompile(t, orderColumns...), &recordingDeadLetterer{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Run(context.Background(), ringq.NewDispatch[Event](2, 8, Key), ringq.NewMerge[Row](3, 8))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Run = %v, want ErrInvalidConfig", err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	for _, w := range []int{2, 6} { // the most slots allowed: what the error suggests
		ok.Workers, ok.RingSize = w, 1<<(bits.Len(uint(maxRingSlots/w))-1)
		if err := ok.Validate(); err != nil {
			t.Fatalf("%d workers, ring_size %d: %v", ok.Workers, ok.RingSize, err)
		}
	}
	cases := []struct {
		name string
		mod  func(*Config)
		key  string
	}{
		{"negative workers", func(c *Config) { c.Workers = -1 }, "pipeline.workers"},
		{"too many workers", func(c *Config) { c.Workers = 1 << 20 }, "pipeline.workers"},
		{"bad pin", func(c *Config) { c.Pin = "core" }, "pipeline.pin"},
		{"empty pin", func(c *Config) { c.Pin = "" }, "pipeline.pin"},
		{"ring 0", func(c *Config) { c.RingSize = 0 }, "pipeline.ring_size"},
		{"ring huge", func(c *Config) { c.RingSize = 1 << 30 }, "pipeline.ring_size"},
		{"rings too big", func(c *Config) { c.Workers, c.RingSize = 8, 1<<18+1 }, "is 4194304 ring slots"},
		{"rings too big, 6 workers", func(c *Config) { c.Workers, c.RingSize = 6, 500000 }, "(ring_size 262144 at 6 workers)"},
		{"rings too big for the cores", func(c *Config) { c.RingSize = 1 << 24 }, "pipeline.workers (" + strconv.Itoa(PhysicalCores()) + ") times pipeline.ring_size"},
		{"max bytes 0", func(c *Config) { c.MaxEventBytes = 0 }, "pipeline.max_event_bytes"},
		{"bad handoff", func(c *Config) { c.Handoff = "chan" }, "pipeline.handoff"},
		{"empty handoff", func(c *Config) { c.Handoff = "" }, "pipeline.handoff"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			c.mod(&cfg)
			err := cfg.Validate()
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), c.key) {
				t.Fatalf("error %q does not name %s", err, c.key)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	m := mustCompile(t, orderColumns...)
	dl := &recordingDeadLetterer{}
	if _, err := New(Config{}, m, dl, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("zero Config: %v", err)
	}
	if _, err := New(DefaultConfig(), nil, dl, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil mapper: %v", err)
	}
	if _, err := New(DefaultConfig(), m, nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil dead-letterer: %v", err)
	}
	p, err := New(DefaultConfig(), m, dl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Workers() != PhysicalCores() {
		t.Errorf("Workers() = %d, want PhysicalCores() = %d", p.Workers(), PhysicalCores())
	}
}

func TestPhysicalCores(t *testing.T) {
	n := PhysicalCores()
	if n < 1 || n > runtime.GOMAXPROCS(0) {
		t.Fatalf("PhysicalCores() = %d, GOMAXPROCS %d", n, runtime.GOMAXPROCS(0))
	}
	if _, err := physicalCores(t.TempDir()); err == nil {
		t.Fatal("physicalCores on an empty directory: no error")
	}
}

func TestKey(t *testing.T) {
	for _, s := range []string{"", "events.dev-0042", "a.b.c"} {
		h := fnv.New64a()
		h.Write([]byte(s))
		f := h.Sum64()
		f ^= f >> 33
		f *= 0xff51afd7ed558ccd
		f ^= f >> 33
		f *= 0xc4ceb9fe1a85ec53
		f ^= f >> 33
		if got := Key(&Event{Subject: s}); got != f {
			t.Errorf("Key(%q) = %x, want %x (FNV-1a, then murmur3's finalizer)", s, got, f)
		}
	}
	ev := &Event{Subject: "events.dev-0042"}
	if a := testing.AllocsPerRun(100, func() { Key(ev) }); a != 0 {
		t.Errorf("Key allocates %v times", a)
	}
}

// Subjects that differ only in a byte's higher bits do not share a worker
// more often than chance has them: the dispatch takes the key's low bits,
// where FNV-1a alone put "events.A" and "events.a" together for up to 32
// workers. And a thousand devices spread evenly.
func TestKeySpreadsSubjects(t *testing.T) {
	for _, n := range []uint64{2, 4, 8, 16, 32} {
		same := 0
		for c := byte('a'); c <= 'z'; c++ {
			lower, upper := Event{Subject: "events." + string(c)}, Event{Subject: "events." + string(c-32)}
			if Key(&lower)&(n-1) == Key(&upper)&(n-1) {
				same++
			}
		}
		// By chance 26/n pairs share; all 26 did.
		if limit := 26/int(n) + 7; same > limit {
			t.Errorf("%d workers: %d of 26 case pairs (events.a, events.A) on one worker, more than %d", n, same, limit)
		}
		if n > 8 {
			continue // too few subjects per worker to ask for evenness
		}
		per := make([]int, n)
		for d := range 1000 {
			ev := Event{Subject: "bench.dev-" + strconv.Itoa(d)}
			per[Key(&ev)&(n-1)]++
		}
		for w, c := range per {
			if want := 1000 / int(n); c < want*7/10 || c > want*13/10 {
				t.Errorf("%d workers: worker %d has %d of 1000 devices' subjects, want %d ± 30%%: %v", n, w, c, want, per)
			}
		}
	}
}

package consumer

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
	"github.com/jetsink/jetsink/tests/testenv"
)

// fakePause is a pull pause (SetPullPause) the test switches, as the
// sink's Away switches when PostgreSQL goes away and comes back.
type fakePause struct {
	mu      sync.Mutex
	paused  bool
	changed chan struct{}
	asked   int // calls that found it paused
	calls   int // calls in all
	// Set by pauseFrom: the call (by calls) that switches it on (0: none
	// to come), and how many calls find it paused before it switches off
	// by itself (0: until set).
	from, lasts int
}

func newFakePause(paused bool) *fakePause {
	return &fakePause{paused: paused, changed: make(chan struct{})}
}

func (p *fakePause) get() (bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.from > 0 && p.calls == p.from {
		p.switchTo(true)
	}
	paused, changed := p.paused, p.changed
	if paused {
		p.asked++
		if p.lasts > 0 && p.asked == p.lasts {
			// The pause ends right after this call found it: the
			// caller's channel is closed at once.
			p.from, p.lasts = 0, 0
			p.switchTo(false)
		}
	}
	return paused, changed
}

// pauseFrom makes the pause hold from the call after the next ones (0:
// from now, its channel closed), for the lasts calls that find it paused
// (0: until set), and then end by itself, its channel closed.
func (p *fakePause) pauseFrom(next, lasts int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.from, p.lasts = p.calls+next+1, lasts
	if next == 0 {
		p.from = 0
		p.switchTo(true)
	}
}

// switchTo switches the pause, p.mu held.
func (p *fakePause) switchTo(paused bool) {
	p.paused, p.asked = paused, 0
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *fakePause) set(paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == paused {
		return
	}
	p.switchTo(paused)
}

func (p *fakePause) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

func (p *fakePause) askedWhilePaused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked
}

// consumerInfo is the durable's info as the server has it now.
func consumerInfo(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config) *jetstream.ConsumerInfo {
	t.Helper()
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	return cons.CachedInfo()
}

// holdsNothingPulled checks, at every look at the consumer until two pull
// expiries (four heartbeats each) have passed since the pause took
// effect, that nothing was delivered past delivered, that no pull waits on
// the server, and that pending stays pending: while paused, Run sends no
// pull (a session would have pulled again at each expiry, and at each
// missed heartbeat).
func holdsNothingPulled(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config, delivered, pending uint64) {
	t.Helper()
	until := time.Now().Add(2 * cfg.PullExpiry)
	waitFor(t, ctx, "two pull expiries while paused", func() bool {
		ci := consumerInfo(t, ctx, js, cfg)
		if ci.Delivered.Stream != delivered || ci.NumWaiting != 0 || ci.NumPending != pending {
			t.Fatalf("while paused: delivered %d, waiting pulls %d, pending %d; want %d, 0, %d",
				ci.Delivered.Stream, ci.NumWaiting, ci.NumPending, delivered, pending)
		}
		return time.Now().After(until)
	})
}

// With the pull pause on (the sink cannot reach PostgreSQL and gave back
// what it held, SetPullPause), Run pulls nothing: the session drains and
// ends, no pull waits on the server, and events published meanwhile stay
// pending across pull expiries and heartbeats, with no missed heartbeat,
// resubscribe or NotConsuming; once it is off, they arrive. Before, the
// only gate was Warmed, once before the first pull: an instance without
// PostgreSQL kept pulling until it held max_ack_pending, and the
// instances sharing its durable got nothing.
func TestPullPausedWhileSinkAway(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			js := jsFor(t, srv)
			cfg := testConfig(t, srv)
			cfg.PullClient = client
			c, log := newLoggedConsumer(t, ctx, cfg)
			p := newFakePause(false)
			c.SetPullPause(p.get)
			publish(t, ctx, js, cfg, 5, 1, 0)
			r := startRun(t, ctx, c, 1, 64, 100)
			r.ackUntil(t, ctx, 4)
			before := c.Stats()
			// What the pause must not cause is looked for in the log
			// written while it held: a loaded machine may miss a
			// heartbeat (nats.go's Warn) before or after it.
			from := len(log.String())

			p.set(true)
			// serve asks once, at the switch; Run's loop again once the
			// session has ended, and waits.
			waitFor(t, ctx, "Run to wait out the pause", func() bool { return p.askedWhilePaused() >= 2 })
			waitFor(t, ctx, "no pull waiting on the server", func() bool { return consumerInfo(t, ctx, js, cfg).NumWaiting == 0 })
			delivered := consumerInfo(t, ctx, js, cfg).Delivered.Stream
			if delivered != 5 {
				t.Fatalf("delivered %d before the pause, want 5", delivered)
			}
			publish(t, ctx, js, cfg, 10, 1, 5)
			// The server counts a stored message in its consumers'
			// pending a moment after the publish's ack (the stream
			// signals them on another goroutine: a look at once saw 5
			// of the 10, CI session 64): wait until all 10 are counted,
			// pending or delivered, before holding the count to 10.
			waitFor(t, ctx, "the 10 events counted by the consumer", func() bool {
				ci := consumerInfo(t, ctx, js, cfg)
				return ci.NumPending+(ci.Delivered.Stream-delivered) >= 10
			})
			holdsNothingPulled(t, ctx, js, cfg, delivered, 10)
			select {
			case g := <-r.events:
				t.Fatalf("event %d handed on while paused", bodyIndex(t, &g.ev))
			default:
			}
			if err := c.NotConsuming(); err != nil {
				t.Errorf("NotConsuming while paused: %v", err)
			}
			during := c.Stats()
			paused := log.String()[from:]

			p.set(false)
			r.ackUntil(t, ctx, 14)
			if during.Resubscribes != before.Resubscribes || during.HeartbeatsMissing != before.HeartbeatsMissing {
				t.Errorf("resubscribes %d -> %d, missed heartbeats %d -> %d across the pause; want both unchanged",
					before.Resubscribes, during.Resubscribes, before.HeartbeatsMissing, during.HeartbeatsMissing)
			}
			r.stopClean(t, ctx)
			out := log.String()
			if strings.Count(out, "pulling paused") != 1 || strings.Count(out, "pulling resumed") != 1 {
				t.Errorf("want one line each of pulling paused and resumed; log:\n%s", out)
			}
			for _, bad := range []string{"pull heartbeats missed", "pull subscription ended", "level=WARN"} {
				if strings.Contains(paused, bad) {
					t.Errorf("%q in the log while paused; log then:\n%s", bad, paused)
				}
			}
		})
	}
}

// Paused before the first pull, Run pulls nothing until the pause ends,
// and then delivers what waited; nor does it check the stream's sequence
// against the table meanwhile (in exactly-once mode: PostgreSQL, away,
// would fail it, a retry logged and counted for NotConsuming). An intake
// end while paused returns at once.
func TestPullPausedAtStart(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			js := jsFor(t, srv)
			cfg := testConfig(t, srv)
			cfg.PullClient = client
			p := newFakePause(false) // New makes the stream, past the table's rows
			var lookedWhilePaused atomic.Int64
			cfg.StoredSeq = func(context.Context, string) (uint64, error) {
				if p.isPaused() {
					lookedWhilePaused.Add(1)
					return 0, errors.New("PostgreSQL away")
				}
				return 0, nil
			}
			c := newConsumer(t, ctx, cfg)
			p.set(true)
			c.SetPullPause(p.get)
			publish(t, ctx, js, cfg, 5, 1, 0)
			r := startRun(t, ctx, c, 1, 64, 100)
			waitFor(t, ctx, "Run to wait out the pause", func() bool { return p.askedWhilePaused() >= 1 })
			holdsNothingPulled(t, ctx, js, cfg, 0, 5)
			if n := lookedWhilePaused.Load(); n != 0 {
				t.Errorf("the table's sequence asked for %d times while paused", n)
			}
			p.set(false)
			r.ackUntil(t, ctx, 4)

			// Paused again, then intake ends: Run returns nil.
			p.set(true)
			waitFor(t, ctx, "Run to wait out the pause", func() bool { return p.askedWhilePaused() >= 2 })
			r.stopClean(t, ctx)
			if n := lookedWhilePaused.Load(); n != 0 {
				t.Errorf("the table's sequence asked for %d times while paused", n)
			}
		})
	}
}

// A hard end while paused returns at once, with hard's error. The test
// calls run, Run's body, itself: Run would return after hardRunWait
// anyway, with the same error, were run left waiting for the pause's end;
// run must return, or the test's deadline ends it (intake, which would end
// the wait too, ends only after).
func TestPullPausedHardStop(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	p := newFakePause(true)
	c.SetPullPause(p.get)
	intake, stopIntake := context.WithCancel(context.Background())
	defer stopIntake()
	hard, stop := context.WithCancel(intake)
	defer stop()
	out := ringq.NewDispatch[pipeline.Event](1, 8, key)
	done := make(chan error, 1)
	go func() { done <- c.run(intake, hard, out) }()
	waitFor(t, ctx, "run to wait out the pause", func() bool { return p.askedWhilePaused() >= 1 })
	stop()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("run = %v, want hard's error", err)
		}
	case <-ctx.Done():
		t.Fatal("run did not return after hard ended while paused")
	}
}

// A pause that ends while its session drains (Run's loop finds it over
// when it looks next, and does not wait) is over as one that Run waited
// out: "pulling resumed" is logged, and the next pause is a pause of its
// own, logged (and clearing what Run had found stuck). Before, the next
// pause logged nothing, and its "pulling resumed" counted paused_for from
// the first.
func TestPullPauseOverWhileDrainingThenAnother(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	p := newFakePause(false)
	c.SetPullPause(p.get)
	publish(t, ctx, js, cfg, 5, 1, 0)
	r := startRun(t, ctx, c, 1, 64, 100)
	r.ackUntil(t, ctx, 4)

	// Paused for serve's look only: over by the time the loop looks.
	p.pauseFrom(0, 1)
	waitFor(t, ctx, "the first pause noted", func() bool { return strings.Count(log.String(), "pulling paused") == 1 })
	publish(t, ctx, js, cfg, 5, 1, 5)
	r.ackUntil(t, ctx, 9) // pulling again

	p.set(true)
	waitFor(t, ctx, "Run to wait out the second pause", func() bool { return p.askedWhilePaused() >= 2 })
	p.set(false)
	publish(t, ctx, js, cfg, 5, 1, 10)
	r.ackUntil(t, ctx, 14)
	r.stopClean(t, ctx)
	out := log.String()
	if strings.Count(out, "pulling paused") != 2 || strings.Count(out, "pulling resumed") != 2 {
		t.Errorf("want two lines each of pulling paused and resumed, one for each pause; log:\n%s", out)
	}
}

// Found paused by the look just before it subscribes (mayPull), Run waits
// the pause out and then looks at the stream again, its sequence against
// the table too, before it pulls: the stream may have been replaced, or
// the table restored, meanwhile.
func TestPullPausedJustBeforeSubscribing(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	var looks atomic.Int64
	cfg.StoredSeq = func(context.Context, string) (uint64, error) {
		looks.Add(1)
		return 0, nil
	}
	c := newConsumer(t, ctx, cfg)
	// Its first call is the loop's top; the second, mayPull's, finds it
	// paused, and the pause ends right after.
	p := newFakePause(false)
	p.pauseFrom(1, 1)
	c.SetPullPause(p.get)
	publish(t, ctx, js, cfg, 1, 1, 0)
	looks.Store(0) // New's
	r := startRun(t, ctx, c, 1, 64, 100)
	r.ackUntil(t, ctx, 0)
	if n := looks.Load(); n != 2 {
		t.Errorf("the table's sequence looked at %d times before the first event, want 2: before the pause and after it", n)
	}
	r.stopClean(t, ctx)
}

package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// jsEnv is an embedded JetStream server, a connection to it, and a context
// that ends with the test or after a minute.
type jsEnv struct {
	ns  *testenv.NATSServer
	nc  *nats.Conn
	js  jetstream.JetStream
	ctx context.Context
}

func newJSEnv(t *testing.T) *jsEnv {
	t.Helper()
	ns := testenv.NATS(t)
	nc := ns.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return &jsEnv{ns: ns, nc: nc, js: js, ctx: ctx}
}

// stream creates the stream cfg.
func (e *jsEnv) stream(t *testing.T, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	s, err := e.js.CreateStream(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestEventIsDeterministicValidJSON(t *testing.T) {
	a, b := Make(7, 42, 1000), Make(7, 42, 1000)
	if a != b {
		t.Fatalf("Make is not deterministic: %+v vs %+v", a, b)
	}
	if c := Make(8, 42, 1000); c.ID == a.ID {
		t.Fatal("different runs give the same id")
	}
	js := a.AppendJSON(nil)
	if n := len(js); n < 150 || n > 220 {
		t.Errorf("event is %d bytes, want about 180: %s", n, js)
	}
	var got struct {
		ID     string    `json:"id"`
		TS     time.Time `json:"ts"`
		Device string    `json:"device"`
		Kind   string    `json:"kind"`
		Value  float64   `json:"value"`
		Seq    uint64    `json:"seq"`
		Tags   struct{ Site, Rack string }
	}
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatalf("invalid JSON %s: %v", js, err)
	}
	u, err := uuid.Parse(got.ID)
	if err != nil || u.Version() != 4 || got.ID != a.UUID() {
		t.Errorf("id %q: %v (version %d)", got.ID, err, u.Version())
	}
	if !got.TS.Equal(a.TS) || got.Device != a.Device || got.Kind != a.Kind || got.Value != a.Value ||
		got.Seq != 42 || got.Tags.Site != a.Site || got.Tags.Rack != a.Rack {
		t.Errorf("decoded %+v from %s, want %+v", got, js, a)
	}
	if a.Subject("events") != "events.dev-42" {
		t.Errorf("subject %s", a.Subject("events"))
	}
}

func TestPublishStoresEveryEventOnce(t *testing.T) {
	e := newJSEnv(t)
	ctx, nc := e.ctx, e.nc
	stream := e.stream(t, jetstream.StreamConfig{Name: "LG", Subjects: []string{"lg.>"}})
	opts := Options{Subject: "lg", Subjects: 50, Events: 5000, Run: 1}
	res, err := Publish(ctx, nc, opts)
	if err != nil || res.Acked != 5000 {
		t.Fatalf("publish: %+v, %v", res, err)
	}
	// Same run again: Nats-Msg-Id makes JetStream store nothing new.
	if _, err := Publish(ctx, nc, opts); err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 5000 || info.State.NumSubjects != 50 {
		t.Fatalf("stream holds %d messages on %d subjects, want 5000 on 50", info.State.Msgs, info.State.NumSubjects)
	}
}

func TestPublishOpenLoopAndFailures(t *testing.T) {
	e := newJSEnv(t)
	ctx, nc := e.ctx, e.nc
	// No stream captures the subject: every publish must be counted failed.
	res, err := Publish(ctx, nc, Options{Subject: "nowhere", Events: 20, Run: 2})
	if err == nil || res.Failed != 20 {
		t.Fatalf("publish without a stream: %+v, %v", res, err)
	}
	e.stream(t, jetstream.StreamConfig{Name: "OL", Subjects: []string{"ol.>"}})
	res, err = Publish(ctx, nc, Options{Subject: "ol", Rate: 2000, Duration: 250 * time.Millisecond, Run: 3})
	if err != nil || res.Sent != 500 || res.Acked != 500 {
		t.Fatalf("open loop: %+v, %v", res, err)
	}
}

func TestPublishStampsScheduledSendTime(t *testing.T) {
	e := newJSEnv(t)
	ctx, nc := e.ctx, e.nc
	stream := e.stream(t, jetstream.StreamConfig{Name: "ST", Subjects: []string{"st.>"}})
	before := time.Now()
	if _, err := Publish(ctx, nc, Options{Subject: "st", Rate: 1000, Duration: 100 * time.Millisecond, Run: 4, Stamp: true}); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	ts := func(seq uint64) time.Time {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var ev struct{ TS time.Time }
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		return ev.TS
	}
	first, last := ts(1), ts(100)
	// Open loop: event i is stamped start + i*interval, exactly, whenever it was sent.
	if got := last.Sub(first); got != 99*time.Millisecond {
		t.Errorf("stamps of events 0 and 99 are %v apart, want 99ms", got)
	}
	if first.Before(before.Truncate(time.Microsecond)) || last.After(after) {
		t.Errorf("stamps %v..%v outside the publish window %v..%v", first, last, before, after)
	}
}

// A publish whose PubAck never comes is sent again after AckWait, and the
// duplicate window stores it once.
func TestPublishResendsWithoutPubAck(t *testing.T) {
	e := newJSEnv(t)
	ctx, nc, js := e.ctx, e.nc, e.js
	const n = 200
	// Until the stream exists a plain subscriber takes the events and
	// answers none of them; it creates the stream once it has them all.
	created := make(chan error, 1)
	var got int
	var sub *nats.Subscription
	sub, err := nc.Subscribe("nr.>", func(*nats.Msg) {
		if got++; got == n {
			_ = sub.Unsubscribe()
			go func() {
				_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "NR", Subjects: []string{"nr.>"}})
				created <- err
			}()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Publish(ctx, nc, Options{Subject: "nr", Subjects: 10, Events: n, Run: 5, AckWait: 100 * time.Millisecond})
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	// Every event was sent again at least once (more if a resend came
	// before the stream was ready), and stored once.
	if err != nil || res.Retried < n || res.Acked != n || res.Failed != 0 {
		t.Fatalf("publish: %+v, %v; want all %d resent and acknowledged", res, err, n)
	}
	info, err := js.Stream(ctx, "NR")
	if err != nil {
		t.Fatal(err)
	}
	if s := info.CachedInfo().State; s.Msgs != n {
		t.Fatalf("stream holds %d messages, want %d", s.Msgs, n)
	}
}

// JetStream's error PubAcks count as failures, with their description.
func TestPublishReportsJetStreamErrors(t *testing.T) {
	e := newJSEnv(t)
	e.stream(t, jetstream.StreamConfig{Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 10, Discard: jetstream.DiscardNew})
	res, err := Publish(e.ctx, e.nc, Options{Subject: "full", Events: 25, Run: 6})
	if !errors.Is(err, ErrNotAcked) || !strings.Contains(err.Error(), "maximum messages exceeded") {
		t.Fatalf("error %v, want ErrNotAcked naming the stream's limit", err)
	}
	if res.Acked != 10 || res.Failed != 15 || res.Retried != 15*maxRetries {
		t.Fatalf("publish: %+v; want 10 acknowledged, 15 failed after %d resends each", res, maxRetries)
	}
}

// The PubAcks in flight when the connection drops are lost with it: they
// are sent again after the reconnect, not after AckWait.
func TestPublishResendsAfterReconnect(t *testing.T) {
	e := newJSEnv(t)
	ctx, nc, ns := e.ctx, e.nc, e.ns
	stream := e.stream(t, jetstream.StreamConfig{Name: "RC", Subjects: []string{"rc.>"}})
	var restarted bool
	var restartErr error
	o := Options{Subject: "rc", Subjects: 10, Rate: 4000, Duration: time.Second, Run: 7, AckWait: time.Hour}
	o.Progress = func(sent int) {
		if sent >= 1000 && sent < 4000 && !restarted {
			restarted = true
			ns.Shutdown()
			restartErr = ns.Restart()
		}
	}
	res, err := Publish(ctx, nc, o)
	if !restarted || restartErr != nil {
		t.Fatalf("the server was not restarted while publishing: %v", restartErr)
	}
	if err != nil || res.Acked != 4000 || res.Retried == 0 {
		t.Fatalf("publish: %+v, %v; want 4000 acknowledged, some resent", res, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 4000 {
		t.Fatalf("stream holds %d messages, want 4000", info.State.Msgs)
	}
}

// firstResend publishes o to a subject where a plain subscriber takes the
// events and answers none, and returns how long after its first send the
// first event to arrive twice arrived again.
func firstResend(t *testing.T, o Options) time.Duration {
	t.Helper()
	e := newJSEnv(t)
	ctx, nc := e.ctx, e.nc
	type arrival struct {
		id string
		at time.Time
	}
	arrivals := make(chan arrival, 1000)
	if _, err := nc.Subscribe(o.Subject+".>", func(m *nats.Msg) {
		select {
		case arrivals <- arrival{m.Header.Get(jetstream.MsgIDHeader), time.Now()}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = Publish(pctx, nc, o)
	}()
	defer func() { stop(); <-done }()
	first := map[string]time.Time{}
	for {
		select {
		case a := <-arrivals:
			if at, ok := first[a.id]; ok {
				return a.at.Sub(at)
			}
			first[a.id] = a.at
		case <-ctx.Done():
			t.Fatal("no publish was sent again")
		}
	}
}

// Nothing is sent again before its AckWait has passed, also while the
// publisher waits for room under MaxPending.
func TestPublishWaitsAckWaitBeforeResending(t *testing.T) {
	const ackWait = time.Second
	if d := firstResend(t, Options{Subject: "aw", Events: 10, MaxPending: 5, Run: 8, AckWait: ackWait}); d < ackWait {
		t.Fatalf("an event was sent again %v after its first send, before AckWait (%v)", d, ackWait)
	}
}

// In open loop a failed publish is sent again during the run, not after
// its end, so the duplicate window need not cover the run.
func TestPublishResendsDuringTheRun(t *testing.T) {
	const run = 3 * time.Second
	if d := firstResend(t, Options{Subject: "dr", Rate: 100, Duration: run, Run: 9, AckWait: 100 * time.Millisecond}); d >= run/2 {
		t.Fatalf("the first resend came %v after its first send, in a %v run; want about AckWait + 250ms", d, run)
	}
}

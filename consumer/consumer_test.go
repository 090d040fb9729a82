package consumer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/tests/testenv"
)

func TestNewCreatesStreamAndConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.AckWait = 7 * time.Second
	cfg.MaxDeliver = 3
	cfg.FilterSubject = strings.TrimSuffix(cfg.Subjects[0], ">") + "keep.>"
	c := newConsumer(t, ctx, cfg)
	if !c.Ready() {
		t.Fatal("Ready() = false right after New")
	}
	if got := c.Destinations(); !slices.Equal(got, []string{cfg.FilterSubject}) {
		t.Fatalf("Destinations() = %q with a filter subject, want it alone", got)
	}

	js := jsFor(t, srv)
	sc := streamConfig(t, ctx, js, cfg.Stream)
	if sc.Storage != jetstream.FileStorage || len(sc.Subjects) != 1 || sc.Subjects[0] != cfg.Subjects[0] {
		t.Fatalf("stream config = storage %v subjects %v, want file storage and %v", sc.Storage, sc.Subjects, cfg.Subjects)
	}
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatalf("consumer was not created: %v", err)
	}
	cc := cons.CachedInfo().Config
	// MaxDeliver: unlimited, whatever nats.max_deliver says (3); jetsink counts.
	if cc.Durable != cfg.Consumer || cc.AckPolicy != jetstream.AckExplicitPolicy || cc.AckWait != 7*time.Second ||
		cc.MaxDeliver != -1 || cc.MaxAckPending != DefaultMaxAckPending || cc.FilterSubject != cfg.FilterSubject {
		t.Fatalf("consumer config = %+v", cc)
	}

	// A second instance with a changed setting updates, not fails.
	cfg.MaxAckPending = 5000
	newConsumer(t, ctx, cfg)
	cons, err = js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if got := cons.CachedInfo().Config.MaxAckPending; got != 5000 {
		t.Fatalf("MaxAckPending after update = %d, want 5000", got)
	}
	lag, err := c.Lag(ctx)
	if err != nil {
		t.Fatalf("Lag: %v", err)
	}
	if lag.NumPending != 0 || lag.NumAckPending != 0 {
		t.Fatalf("Lag on an empty stream = %+v", lag)
	}
}

func TestNewMissingStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	c, err := New(ctx, cfg, testLogger(t, nil))
	if err == nil {
		_ = c.Close(context.Background())
		t.Fatal("New bound to a stream that does not exist")
	}
	if !errors.Is(err, ErrStreamNotFound) || !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("New = %v, want ErrStreamNotFound", err)
	}
	if !strings.Contains(err.Error(), "nats.create_stream: true") || !strings.Contains(err.Error(), cfg.Stream) {
		t.Fatalf("error does not say what to do: %v", err)
	}
}

func TestNewBindsExistingStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	js := jsFor(t, srv)
	subjects := append(slices.Clone(cfg.Subjects), cfg.Stream+".orders.*")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: subjects}); err != nil {
		t.Fatal(err)
	}
	cfg.CreateStream = false
	cfg.Subjects = nil
	c := newConsumer(t, ctx, cfg)
	// Without a filter, the stream's subjects (what message spans are
	// named after).
	if got := c.Destinations(); !slices.Equal(got, subjects) {
		t.Fatalf("Destinations() = %q, want the stream's subjects %q", got, subjects)
	}
	if _, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatalf("consumer was not created on the existing stream: %v", err)
	}
}

// A durable its owner made, to deliver only what comes after it (or from a
// sequence, or in memory), is taken as it is: the server refuses an update
// that changes where delivery starts or the storage. Its metadata stays,
// and jetsink's own updates of it (a refusal's mark) work too; delivery
// starts where the owner said.
func TestNewTakesTheOwnersDurable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		owner jetstream.ConsumerConfig
		first uint64 // the first stream sequence delivered
	}{
		{"deliver new", jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}, 11},
		{"from sequence 4, in memory", jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 4, MemoryStorage: true}, 4},
		{"1024 pulls waiting, replay original", jetstream.ConsumerConfig{MaxWaiting: 1024, ReplayPolicy: jetstream.ReplayOriginalPolicy}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			cfg := testConfig(t, srv)
			cfg.CreateStream = false
			js := jsFor(t, srv)
			makeStream(t, ctx, js, cfg)
			publish(t, ctx, js, cfg, 10, 1, 0)
			own := tc.owner
			own.Durable, own.AckPolicy, own.Metadata = cfg.Consumer, jetstream.AckExplicitPolicy, map[string]string{"owner": "ops"}
			if _, err := js.CreateConsumer(ctx, cfg.Stream, own); err != nil {
				t.Fatal(err)
			}
			c, log := newLoggedConsumer(t, ctx, cfg)
			// Run keeps the replay policy, and says what it costs, as check does.
			const slow = "has replay policy original"
			if warned := strings.Contains(log.String(), slow); warned != (own.ReplayPolicy == jetstream.ReplayOriginalPolicy) {
				t.Errorf("New warned of replay original: %v; log:\n%s", warned, log.String())
			}
			if err := c.markReplaced(ctx, time.Unix(1, 0), true); err != nil {
				t.Fatalf("update of the owner's durable: %v", err)
			}
			cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
			if err != nil {
				t.Fatal(err)
			}
			got := cons.CachedInfo().Config
			if got.DeliverPolicy != own.DeliverPolicy || got.OptStartSeq != own.OptStartSeq || got.MemoryStorage != own.MemoryStorage ||
				got.Metadata["owner"] != "ops" || got.Metadata[replacedKey] == "" || got.MaxDeliver != durableMaxDeliver ||
				own.MaxWaiting != 0 && got.MaxWaiting != own.MaxWaiting || got.ReplayPolicy != own.ReplayPolicy {
				t.Fatalf("durable now %+v; want the owner's start, storage, replay, waiting pulls and metadata, and jetsink's MaxDeliver and mark", got)
			}
			ps, err := Check(ctx, cfg, testLogger(t, nil))
			if err != nil {
				t.Fatal(err)
			}
			if warned := strings.Contains(problemsText(ps), "has replay policy original"); warned != (own.ReplayPolicy == jetstream.ReplayOriginalPolicy) {
				t.Errorf("check warned of replay original: %v; problems:\n%s", warned, problemsText(ps))
			}
			publish(t, ctx, js, cfg, 1, 1, 10)
			r := startRun(t, ctx, c, 1, 64, 1000)
			if ev := r.next(t, ctx).ev; ev.StreamSeq != tc.first {
				t.Fatalf("first delivery at sequence %d, want %d", ev.StreamSeq, tc.first)
			}
			r.stopClean(t, ctx)
		})
	}
}

// A durable of another kind under nats.consumer, which the server will
// not let an update change: New refuses it as a bad nats.consumer (run
// exits 2), saying what check says and how to fix it, rather than pass on
// the server's "ack policy can not be updated".
func TestNewNamesTheFixForAForeignDurable(t *testing.T) {
	for _, tc := range []struct {
		name string
		cc   jetstream.ConsumerConfig
		kind string
	}{
		{"ack none", jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy}, "ack policy none"},
		{"ack all", jetstream.ConsumerConfig{AckPolicy: jetstream.AckAllPolicy}, "ack policy all"},
		{"push", jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, DeliverSubject: "push.here"}, "a push consumer delivering to push.here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			cfg := testConfig(t, srv)
			cfg.CreateStream = false
			js := jsFor(t, srv)
			makeStream(t, ctx, js, cfg)
			cc := tc.cc
			cc.Durable = cfg.Consumer
			if _, err := js.CreateConsumer(ctx, cfg.Stream, cc); err != nil {
				t.Fatal(err)
			}
			c, err := New(ctx, cfg, testLogger(t, nil))
			if err == nil {
				_ = c.Close(context.Background())
				t.Fatal("New accepted a durable of another kind")
			}
			ps, cerr := Check(ctx, cfg, testLogger(t, nil))
			if cerr != nil {
				t.Fatal(cerr)
			}
			var checked *Problem
			for i := range ps {
				if strings.Contains(ps[i].Message, "not an explicit-ack pull consumer") {
					checked = &ps[i]
				}
			}
			if checked == nil || !checked.Config || checked.Warning {
				t.Fatalf("check's problems, want one of the configuration naming the durable's kind:\n%s", problemsText(ps))
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), checked.String()) || !strings.Contains(err.Error(), tc.kind) ||
				!strings.Contains(err.Error(), "nats consumer rm") {
				t.Fatalf("New = %v\nwant ErrInvalidConfig with check's words and fix: %s", err, checked)
			}
		})
	}
}

func TestNewRefusesStreamCapturingDeadLetters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	js := jsFor(t, srv)
	// The existing stream takes everything, dead letters included.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{"in.>", "dlq.>"}}); err != nil {
		t.Fatal(err)
	}
	cfg.CreateStream = false
	wantRefused(t, ctx, cfg, "nats.dead_letter_subject", "a stream that captures its own dead letters")
}

// wantRefused checks that New refuses cfg with ErrInvalidConfig naming key.
func wantRefused(t *testing.T, ctx context.Context, cfg Config, key, what string) {
	t.Helper()
	c, err := New(ctx, cfg, testLogger(t, nil))
	if err == nil {
		_ = c.Close(context.Background())
		t.Fatalf("New accepted %s", what)
	}
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), key) {
		t.Fatalf("New = %v, want ErrInvalidConfig naming %s", err, key)
	}
}

func TestNewPullMaxBytesBelowMaxPayload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullMaxBytes = 64 << 10
	wantRefused(t, ctx, cfg, "nats.pull_max_bytes", "pull_max_bytes below the server's max_payload")
	// max_payload itself leaves no room for a message's subject and ack
	// reply, which the server counts too: a warning, not a refusal.
	var buf syncBuffer
	cfg.PullMaxBytes = 1 << 20 // the embedded server's max_payload
	c, err := New(ctx, cfg, testLogger(t, &buf))
	if err != nil {
		t.Fatalf("New with pull_max_bytes = max_payload: %v", err)
	}
	_ = c.Close(context.Background())
	if !strings.Contains(buf.String(), "for a message's subject and ack reply") {
		t.Fatalf("no warning for pull_max_bytes = max_payload; log:\n%s", buf.String())
	}
}

// A budget that cannot hold the largest message would pull nothing: New
// refuses it. Derived (0), it is the default or four of the largest
// messages; -1 is none.
func TestNewInFlightBudget(t *testing.T) {
	onePassOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.PullClient = PullClientWire // the budget is wire's
	cfg.MaxInFlightBytes = 1 << 20  // the embedded server's max_payload, without room for subject and reply
	wantRefused(t, ctx, cfg, "nats.max_in_flight_bytes", "max_in_flight_bytes below the server's max_payload + 8 KiB")
	for _, tc := range []struct{ set, want int64 }{{0, DefaultMaxInFlightBytes}, {-1, 0}, {3 << 20, 3 << 20}} {
		cfg.MaxInFlightBytes = tc.set
		c, err := New(ctx, cfg, testLogger(t, nil))
		if err != nil {
			t.Fatalf("New with max_in_flight_bytes %d: %v", tc.set, err)
		}
		var limit int64
		if b := c.budget.Load(); b != nil {
			limit = b.Limit()
		}
		if limit != tc.want {
			t.Errorf("max_in_flight_bytes %d: budget %d, want %d", tc.set, limit, tc.want)
		}
		_ = c.Close(context.Background())
	}

	// A wire connection to a server that takes larger messages (servers of
	// a cluster differ, or one was reconfigured): a derived budget is
	// derived again for it; a set one too small for its largest message
	// grows to the least that can pull it.
	big, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: 40 << 20})
	if err != nil {
		t.Fatal(err)
	}
	big.Start()
	defer big.Shutdown()
	if !big.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	wc, err := wire.Dial(ctx, wire.Options{URL: big.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	for _, tc := range []struct{ set, want int64 }{{0, 4 * (40<<20 + pullBytesMargin)}, {3 << 20, 40<<20 + pullBytesMargin}, {64 << 20, 64 << 20}} {
		cfg.MaxInFlightBytes = tc.set
		c, err := New(ctx, cfg, testLogger(t, nil))
		if err != nil {
			t.Fatal(err)
		}
		b := c.wireBudget(wc)
		if b == nil || b != c.budget.Load() || b.Limit() != tc.want {
			t.Errorf("max_in_flight_bytes %d against a 40 MiB max_payload: budget %v, want the consumer's, of %d", tc.set, b, tc.want)
		}
		_ = c.Close(context.Background())
	}
	// So does a pull_max_bytes below its max_payload, which the wire
	// client would refuse to pull with.
	for _, tc := range []struct{ set, want int }{{0, 0}, {3 << 20, 40<<20 + pullBytesMargin}, {48 << 20, 48 << 20}} {
		cfg.MaxInFlightBytes, cfg.PullMaxBytes = 0, tc.set
		var buf syncBuffer
		c, err := New(ctx, cfg, testLogger(t, &buf))
		if err != nil {
			t.Fatal(err)
		}
		got := c.wireMaxBytes(wc)
		if got != tc.want || (tc.set == 3<<20) != strings.Contains(buf.String(), "raised to the least that can pull it for this connection") {
			t.Errorf("pull_max_bytes %d against a 40 MiB max_payload: %d, want %d; log:\n%s", tc.set, got, tc.want, buf.String())
		}
		sub, err := wc.Consume(wire.PullOptions{Stream: "NONE", Consumer: "NONE", MaxMessages: 10, MaxBytes: got, Expires: time.Second,
			Heartbeat: 500 * time.Millisecond}, func(*wire.Msg) {}, nil)
		if err != nil {
			t.Errorf("pull_max_bytes %d: the wire client refuses %d: %v", tc.set, got, err)
		} else {
			sub.Stop()
			<-sub.Closed()
		}
		_ = c.Close(context.Background())
	}
	cfg.PullMaxBytes = 0
	if got := (Config{}).inFlightBudget(64 << 20); got != 4*(64<<20+pullBytesMargin) {
		t.Errorf("derived budget under a 64 MiB max_payload: %d, want four such messages", got)
	}
}

func TestPullMaxBytesProblem(t *testing.T) {
	const mp = 1 << 20
	for _, tc := range []struct {
		bytes         int
		ok, isWarning bool
	}{
		{0, false, false}, {-1, false, false},
		{mp - 1, true, false},
		{mp, true, true}, {mp + pullBytesMargin - 1, true, true},
		{mp + pullBytesMargin, false, false},
	} {
		p, ok := pullMaxBytesProblem(tc.bytes, mp)
		if ok != tc.ok || p.Warning != tc.isWarning {
			t.Errorf("pull_max_bytes %d: %+v, %v; want ok %v, warning %v", tc.bytes, p, ok, tc.ok, tc.isWarning)
		}
	}
}

func TestNewUnreachableServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	srv.Shutdown()
	cfg.URL = strings.Replace(cfg.URL, "nats://", "nats://u:"+sentinel+"@", 1)
	c, err := New(ctx, cfg, testLogger(t, nil))
	if err == nil {
		_ = c.Close(context.Background())
		t.Fatal("New succeeded without a server")
	}
	if strings.Contains(err.Error(), sentinel) {
		t.Fatalf("error quotes the password: %v", err)
	}
}

// TestSecretsNeverLogged goes through connect, consume, disconnect,
// reconnect and close with a password and checks no log line carries it.
func TestSecretsNeverLogged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	for _, withURL := range []bool{false, true} {
		cfg := testConfig(t, srv)
		if withURL {
			cfg.URL = strings.Replace(cfg.URL, "nats://", "nats://jetsink:"+sentinel+"@", 1)
		} else {
			cfg.User, cfg.Password = "jetsink", sentinel
		}
		var logs syncBuffer
		c, err := New(ctx, cfg, testLogger(t, &logs))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		r := startRun(t, ctx, c, 1, 64, 16)
		srv.Shutdown()
		waitFor(t, ctx, "disconnect", func() bool { return !c.Ready() })
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "reconnect", c.Ready)
		r.stopClean(t, ctx)
		_ = c.Close(context.Background())
		out := logs.String()
		if !strings.Contains(out, "nats reconnected") {
			t.Fatalf("reconnect was not logged:\n%s", out)
		}
		if strings.Contains(out, sentinel) {
			t.Fatalf("a log line carries the password:\n%s", out)
		}
	}
}

// Every ack of a run over two rings reaches the server by the time Run
// and Close are done. (The acks are written as they are made, so this does
// not show that Close flushes them: close_test.go does, with connections
// frozen or cut.)
func TestEveryAckReachesTheServer(t *testing.T) {
	const n = 2000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, n, 4, 0)
	r := startRun(t, ctx, c, 2, 256, n)
	for i := 0; i < n; i++ {
		if err := r.next(t, ctx).ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	r.stopClean(t, ctx)
	_ = c.Close(context.Background())
	if c.Ready() {
		t.Fatal("Ready() = true after Close")
	}
	waitFor(t, ctx, "the acks on the server", func() bool {
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		return err == nil && cons.CachedInfo().AckFloor.Stream == n
	})
}

// A filter_subject outside the stream's subjects: the server takes it,
// and the consumer would receive nothing, silently. New refuses it, as
// check does; one within them, or any filter on a stream without subjects
// of its own, is taken.
func TestNewRefusesFilterOutsideTheStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.FilterSubject = "elsewhere.>"
	c, err := New(ctx, cfg, testLogger(t, nil))
	if err == nil {
		_ = c.Close(context.Background())
		t.Fatal("New took a filter_subject matching none of the stream's subjects")
	}
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `nats.filter_subject "elsewhere.>" matches none of stream`) {
		t.Fatalf("New = %v, want ErrInvalidConfig naming the filter", err)
	}
	cfg.FilterSubject = strings.TrimSuffix(cfg.Subjects[0], ">") + "*"
	c, err = New(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatalf("New with a filter within the stream's subjects: %v", err)
	}
	_ = c.Close(context.Background())

	// A stream that transforms its subjects stores others than it
	// captures: a filter on the stored ones is right.
	tcfg := testConfig(t, srv)
	tcfg.CreateStream = false
	js := jsFor(t, srv)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: tcfg.Stream, Subjects: tcfg.Subjects,
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: tcfg.Subjects[0], Destination: "v2." + tcfg.Subjects[0]}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: tcfg.Stream + "_DLQ", Subjects: []string{tcfg.DeadLetterSubject}}); err != nil {
		t.Fatal(err)
	}
	tcfg.FilterSubject = "v2." + tcfg.Subjects[0]
	c, err = New(ctx, tcfg, testLogger(t, nil))
	if err != nil {
		t.Fatalf("New with a filter on a transformed stream's stored subjects: %v", err)
	}
	_ = c.Close(context.Background())
	// A filter on the subjects as captured matches nothing stored: it
	// was taken, and the consumer received nothing, silently.
	tcfg.FilterSubject = tcfg.Subjects[0]
	c, err = New(ctx, tcfg, testLogger(t, nil))
	if err == nil {
		_ = c.Close(context.Background())
		t.Fatal("New took a filter on the subjects a transform stores otherwise")
	}
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "matches none of the subjects stream") ||
		!strings.Contains(err.Error(), "v2."+tcfg.Subjects[0]) {
		t.Fatalf("New = %v, want ErrInvalidConfig naming the subjects stored", err)
	}
}

// What a stream with a subject transform stores: what the transform's
// source takes in its destination's form, the rest as captured.
func TestStoredSubjects(t *testing.T) {
	for _, tc := range []struct {
		subjects []string
		t        *jetstream.SubjectTransformConfig
		want     []string
	}{
		{[]string{"in.>"}, nil, []string{"in.>"}},
		{[]string{"in.>"}, &jetstream.SubjectTransformConfig{Source: "in.>", Destination: "v2.in.>"}, []string{"v2.in.>"}},
		{[]string{"in.>"}, &jetstream.SubjectTransformConfig{Destination: "v2.>"}, []string{"v2.>"}}, // no source: every subject
		{[]string{"in.>"}, &jetstream.SubjectTransformConfig{Source: "in.a.>", Destination: "v2.a.>"}, []string{"v2.a.>", "in.>"}},
		{[]string{"in.>"}, &jetstream.SubjectTransformConfig{Source: "in.*", Destination: "v2.{{wildcard(1)}}"}, []string{"v2.*", "in.>"}},
		{[]string{"in.a", "out.b"}, &jetstream.SubjectTransformConfig{Source: "in.*", Destination: "v2.$1"}, []string{"v2.*", "out.b"}},
		{[]string{"in.>"}, &jetstream.SubjectTransformConfig{Source: "in.>"}, []string{"in.>"}}, // no destination: none
		// A split or slice makes several tokens of one: from it on, any.
		{[]string{"in.x.*"}, &jetstream.SubjectTransformConfig{Source: "in.x.*", Destination: "out.{{split(1,-)}}"}, []string{"out.>"}},
		{[]string{"in.x.*"}, &jetstream.SubjectTransformConfig{Source: "in.x.*", Destination: "out.{{SliceFromLeft(1,2)}}.end"}, []string{"out.>"}},
		{[]string{"in.x.*"}, &jetstream.SubjectTransformConfig{Source: "in.x.*", Destination: "out.{{partition(3,1)}}.$1"}, []string{"out.*.*"}},
	} {
		sc := &jetstream.StreamConfig{Subjects: tc.subjects, SubjectTransform: tc.t}
		if got := storedSubjects(sc); !slices.Equal(got, tc.want) {
			t.Errorf("%v under %+v: %v, want %v", tc.subjects, tc.t, got, tc.want)
		}
	}
}

package consumer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
	"github.com/jetsink/jetsink/tests/testenv"
)

// benchStream preloads a fresh stream with n events of about 200 bytes over
// 64 subjects and returns its config.
func benchStream(b *testing.B, ctx context.Context, srv *testenv.NATSServer, n int) Config {
	b.Helper()
	cfg := testConfig(b, srv)
	cfg.PullHeartbeat = DefaultPullHeartbeat
	cfg.PullExpiry = DefaultPullExpiry
	js := jsFor(b, srv)
	makeStream(b, ctx, js, cfg)
	body := []byte(`{"id":"6f1c2a9e-8d3b-4c57-9a0e-1b2c3d4e5f60","ts":"2026-11-29T20:00:00Z","tags":{"site":"ams-1"},"value":42.5,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)
	for i := 0; i < n; i++ {
		m := &nats.Msg{Subject: subjectOf(cfg, i, 64), Data: body, Header: nats.Header{}}
		m.Header.Set(HeaderMsgID, "m"+strconv.Itoa(i))
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
		if i%2000 == 1999 || i == n-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				b.Fatal(ctx.Err())
			}
		}
	}
	return cfg
}

// BenchmarkRun measures messages per second from a preloaded stream through
// Run into a Dispatch whose rings are drained by goroutines that Ack, next to
// the obvious alternative: nats.go's Messages iterator acking directly, no
// dispatch. allocs/op counts the whole process, the embedded nats-server and
// the acks included; BenchmarkPush isolates what Run itself adds per message.
func BenchmarkRun(b *testing.B) {
	b.Run("consumer.Run", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		srv := testenv.NATS(b)
		cfg := benchStream(b, ctx, srv, b.N)
		cfg.CreateStream = false
		c, err := New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = c.Close(context.Background()) }()

		const rings = 2
		out := ringq.NewDispatch(rings, 8192, key)
		var acked atomic.Int64
		var ackErrs atomic.Int64
		allDone := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < rings; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]pipeline.Event, 64)
				for {
					n, err := out.Ring(i).PopN(ctx, buf)
					for j := range buf[:n] {
						if buf[j].Msg.Ack() != nil {
							ackErrs.Add(1)
						}
						buf[j] = pipeline.Event{}
					}
					if n > 0 && acked.Add(int64(n)) == int64(b.N) {
						close(allDone)
					}
					if err != nil {
						return
					}
				}
			}()
		}
		intake, stop := context.WithCancel(ctx)
		defer stop()
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		runErr := make(chan error, 1)
		go func() { runErr <- c.Run(intake, ctx, out) }()
		select {
		case <-allDone:
		case <-ctx.Done():
			b.Fatalf("only %d of %d messages arrived", acked.Load(), b.N)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		stop()
		if err := <-runErr; err != nil {
			b.Fatal(err)
		}
		wg.Wait()
		if ackErrs.Load() != 0 {
			b.Fatalf("%d acks failed", ackErrs.Load())
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	})

	b.Run("raw-iterator", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		srv := testenv.NATS(b)
		cfg := benchStream(b, ctx, srv, b.N)
		js := jsFor(b, srv)
		cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
			Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: DefaultMaxAckPending,
		})
		if err != nil {
			b.Fatal(err)
		}
		iter, err := cons.Messages(jetstream.PullMaxMessages(cfg.PullMessages()), jetstream.PullHeartbeat(cfg.PullHeartbeat))
		if err != nil {
			b.Fatal(err)
		}
		defer iter.Stop()
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			msg, err := iter.Next()
			if err != nil {
				b.Fatal(err)
			}
			if _, err := msg.Metadata(); err != nil {
				b.Fatal(err)
			}
			if err := msg.Ack(); err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	})
}

// BenchmarkConsumeCallback is the floor under Run: nats.go's Consume with a
// callback that parses the metadata and acks on the delivery goroutine, no
// dispatch, no workers. Run is built on Consume rather than the Messages
// iterator (BenchmarkRun/raw-iterator) because Next arms and stops a timer
// per message (4 more allocations) and hands every message across a channel.
func BenchmarkConsumeCallback(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv := testenv.NATS(b)
	cfg := benchStream(b, ctx, srv, b.N)
	js := jsFor(b, srv)
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
		Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: DefaultMaxAckPending,
	})
	if err != nil {
		b.Fatal(err)
	}
	var n, failed atomic.Int64
	done := make(chan struct{})
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		if _, err := msg.Metadata(); err != nil {
			failed.Add(1)
		}
		if msg.Ack() != nil {
			failed.Add(1)
		}
		if n.Add(1) == int64(b.N) {
			close(done)
		}
	}, jetstream.PullMaxMessages(cfg.PullMessages()), jetstream.PullHeartbeat(cfg.PullHeartbeat))
	if err != nil {
		b.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		b.Fatalf("only %d of %d messages arrived", n.Load(), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cc.Stop()
	<-cc.Closed()
	if failed.Load() != 0 {
		b.Fatalf("%d metadata/ack failures", failed.Load())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

var parsedMeta ackMeta

// BenchmarkParseAckReply reads the metadata of benchReply, once per
// delivered message in Run.
func BenchmarkParseAckReply(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		parsedMeta, _ = parseAckReply(benchReply)
	}
}

// benchReply is a v2 ack reply subject as nats-server 2.10+ sends it.
const benchReply = "$JS.ACK._.ACCHASH.EVENTS.bench.1.42.42.1764450000000000000.0.TOKEN"

// fakeMsg is a jetstream.Msg with fixed metadata, so that BenchmarkPush
// measures Run's own per-message work: wrap, count, push.
type fakeMsg struct {
	meta   jetstream.MsgMetadata
	reply  string
	header nats.Header
	data   []byte
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { return &m.meta, nil }
func (m *fakeMsg) Data() []byte                              { return m.data }
func (m *fakeMsg) Headers() nats.Header                      { return m.header }
func (m *fakeMsg) Subject() string                           { return "in.bench.s1" }
func (m *fakeMsg) Reply() string                             { return m.reply }
func (m *fakeMsg) Ack() error                                { return nil }
func (m *fakeMsg) DoubleAck(context.Context) error           { return nil }
func (m *fakeMsg) Nak() error                                { return nil }
func (m *fakeMsg) NakWithDelay(time.Duration) error          { return nil }
func (m *fakeMsg) InProgress() error                         { return nil }
func (m *fakeMsg) Term() error                               { return nil }
func (m *fakeMsg) TermWithReason(string) error               { return nil }

// BenchmarkPush is Run's per-message cost without the network: Metadata,
// the Event, the counters and Dispatch.Push into a ring drained by a
// goroutine. It must not allocate.
func BenchmarkPush(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &Consumer{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c.schedulesReserved.Store(true) // a server of 2.12 or later: schedules looked for
	msg := &fakeMsg{
		meta:   jetstream.MsgMetadata{Stream: "EVENTS", NumDelivered: 1, Timestamp: time.Now()},
		reply:  benchReply,
		header: nats.Header{HeaderMsgID: []string{"m1"}},
		data:   []byte(`{"id":1}`),
	}
	benchPush(b, ctx, c, msg)
}

func TestPushDoesNotAllocate(t *testing.T) {
	ctx := context.Background()
	c := &Consumer{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c.schedulesReserved.Store(true) // a server of 2.12 or later: schedules looked for
	msg := &fakeMsg{reply: benchReply, header: nats.Header{HeaderMsgID: []string{"m1"}}}
	out := ringq.NewDispatch(1, 1024, key)
	defer out.Close()
	allocs := testing.AllocsPerRun(500, func() {
		if err := c.push(ctx, out, msg, &session{}); err != nil && !errors.Is(err, ringq.ErrClosed) {
			t.Fatal(err)
		}
		if _, ok := out.Ring(0).TryPop(); !ok {
			t.Fatal("pushed event not in the ring")
		}
	})
	if allocs != 0 {
		t.Fatalf("push allocates %.1f times per message, want 0", allocs)
	}
}

// BenchmarkAckPolicy measures what the server's handling of acks costs:
// the process CPU per message, the embedded nats-server's included, of a
// Consume that acks every message under AckExplicit (what jetsink does)
// against one that acks every 500th under AckAll (one ack settles all
// before it), until the server has taken every ack. jetsink does not use
// AckAll (BENCHMARKS.md, session 39, says why); this is the size of that
// lever.
func BenchmarkAckPolicy(b *testing.B) {
	for _, policy := range []jetstream.AckPolicy{jetstream.AckExplicitPolicy, jetstream.AckAllPolicy} {
		b.Run(policy.String(), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			srv := testenv.NATS(b)
			cfg := benchStream(b, ctx, srv, b.N)
			cons, err := jsFor(b, srv).CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
				Durable: cfg.Consumer, AckPolicy: policy, MaxAckPending: DefaultMaxAckPending,
			})
			if err != nil {
				b.Fatal(err)
			}
			var n, failed atomic.Int64
			done := make(chan struct{})
			b.ResetTimer()
			cpu, start := testenv.ProcessCPU(b), time.Now()
			cc, err := cons.Consume(func(msg jetstream.Msg) {
				if _, err := msg.Metadata(); err != nil {
					failed.Add(1)
				}
				k := n.Add(1)
				if policy == jetstream.AckExplicitPolicy || k%500 == 0 || k == int64(b.N) {
					if msg.Ack() != nil {
						failed.Add(1)
					}
				}
				if k == int64(b.N) {
					close(done)
				}
			}, jetstream.PullMaxMessages(cfg.PullMessages()), jetstream.PullHeartbeat(cfg.PullHeartbeat))
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Stop()
			select {
			case <-done:
			case <-ctx.Done():
				b.Fatalf("only %d of %d messages arrived", n.Load(), b.N)
			}
			for { // until the server has taken every ack
				ci, err := cons.Info(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if ci.NumAckPending == 0 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			elapsed, used := time.Since(start), testenv.ProcessCPU(b)-cpu
			b.StopTimer()
			if failed.Load() != 0 {
				b.Fatalf("%d metadata or ack failures", failed.Load())
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/msg")
		})
	}
}

// BenchmarkPushWire is BenchmarkPush for a message of the wire client
// with headers (a Nats-Msg-Id among a traceparent and a content type, as
// a publisher sends them): push reads its header block for the message ID
// and looks for a schedule (Nats-Schedule), which it does not carry.
func BenchmarkPushWire(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msg := wireMsgWithHeaders(b, ctx)
	c := &Consumer{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c.schedulesReserved.Store(true) // a server of 2.12 or later: schedules looked for
	benchPush(b, ctx, c, msg)
}

// BenchmarkIsScheduleWire measures push's look for a schedule in a wire
// message with headers and no Nats-Schedule (BenchmarkPushWire's): isSchedule,
// which parses the header block only when the name occurs in it, against
// the obvious alternative, a parse of the block (HeaderGet) every time.
func BenchmarkIsScheduleWire(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msg := wireMsgWithHeaders(b, ctx)
	b.Run("isSchedule", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if isSchedule(msg, nil) {
				b.Fatal("a schedule")
			}
		}
	})
	b.Run("HeaderGet", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if msg.HeaderBlock() != "" && msg.HeaderGet(headerSchedule) != "" {
				b.Fatal("a schedule")
			}
		}
	})
}

// wireMsgWithHeaders is a message the wire client was delivered, with a
// Nats-Msg-Id among a traceparent and a content type.
func wireMsgWithHeaders(b *testing.B, ctx context.Context) *wire.Msg {
	b.Helper()
	srv := testenv.NATS(b)
	cfg := testConfig(b, srv)
	js := jsFor(b, srv)
	makeStream(b, ctx, js, cfg)
	m := &nats.Msg{Subject: subjectOf(cfg, 0, 1), Data: []byte(`{"id":1}`), Header: nats.Header{}}
	m.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	m.Header.Set("Content-Type", "application/json")
	m.Header.Set(HeaderMsgID, "6f1c2a9e-8d3b-4c57-9a0e-1b2c3d4e5f60")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		b.Fatal(err)
	}
	wc, err := wire.Dial(ctx, wire.Options{URL: srv.URL()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = wc.Close() })
	got := make(chan *wire.Msg, 1)
	sub, err := wc.Consume(wire.PullOptions{Stream: cfg.Stream, Consumer: cfg.Consumer, MaxMessages: 1},
		func(m *wire.Msg) {
			select {
			case got <- m:
			default:
			}
		}, func(error) {})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sub.Stop)
	select {
	case msg := <-got:
		return msg
	case <-ctx.Done():
		b.Fatal("no message delivered")
		return nil
	}
}

// benchPush times c.push of msg b.N times into a ring a goroutine drains,
// and checks that every one was received (none taken for a schedule).
func benchPush(b *testing.B, ctx context.Context, c *Consumer, msg delivery) {
	b.Helper()
	out := ringq.NewDispatch(1, 8192, key)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]pipeline.Event, 64)
		for {
			if _, err := out.Ring(0).PopN(ctx, buf); err != nil {
				return
			}
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.push(ctx, out, msg, &session{}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	out.Close()
	<-done
	if got := c.Stats().Received; got != uint64(b.N) {
		b.Fatalf("Received = %d, want %d (a schedule taken?)", got, b.N)
	}
}

// BenchmarkRecentAcksRecord is what AckAll adds per ack to keep the reply
// subjects of the last acks for a consumer leader change (recentAcks): a
// batch of 500 acks recorded into the ring, ns/ack beside the process's
// ~2.8 µs of CPU per event in a drain (BENCHMARKS.md).
func BenchmarkRecentAcksRecord(b *testing.B) {
	const n = 500
	ms := make([]pipeline.Msg, n)
	for i := range ms {
		ms[i] = &fakeMsg{reply: "$JS.ACK._.ACCHASH.EVENTS.bench.1." + strconv.Itoa(1_000_000+i) + "." + strconv.Itoa(1_000_000+i) + ".1764450000000000000.0.TOKEN"}
	}
	errs := make([]error, n)
	var r recentAcks
	base := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r.record(time.Since(base), 1, ms, errs)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/ack")
}

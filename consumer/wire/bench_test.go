package wire

import (
	"bufio"
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// BenchmarkConsume drains a stream of b.N messages (~200-byte JSON, two
// headers) and acks each, with nats.go's Consume as jetsink uses it and
// with this package. The embedded server runs in this process, so its
// CPU and allocations are in both numbers: the difference is the client's.
func BenchmarkConsume(b *testing.B) {
	srv := testenv.NATS(b)
	js := srv.JetStream(b)
	var seq atomic.Int64
	setup := func(b *testing.B) string {
		b.Helper()
		ctx := testCtx(b, 5*time.Minute)
		name := "BENCH" + strconv.FormatInt(seq.Add(1), 10)
		preload(b, ctx, js, name, b.N, 64, jetstream.ConsumerConfig{AckWait: 5 * time.Minute})
		b.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
		return name
	}
	const maxMessages = 1000

	b.Run("nats.go", func(b *testing.B) {
		name := setup(b)
		ctx := testCtx(b, 5*time.Minute)
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		njs, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		cons, err := njs.Consumer(ctx, name, "C")
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		var count, bad atomic.Int64
		n := int64(b.N)
		measure(b, func() {
			cc, err := cons.Consume(func(m jetstream.Msg) {
				if m.Headers().Get("Nats-Msg-Id") == "" || len(m.Data()) == 0 || m.Reply() == "" {
					bad.Add(1)
				}
				if err := m.Ack(); err != nil {
					bad.Add(1)
				}
				if count.Add(1) == n {
					close(done)
				}
			}, jetstream.PullMaxMessages(maxMessages), jetstream.PullExpiry(30*time.Second), jetstream.PullHeartbeat(5*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			<-done
			if err := nc.FlushWithContext(ctx); err != nil {
				b.Fatal(err)
			}
			cc.Stop()
			<-cc.Closed()
		})
		if bad.Load() != 0 {
			b.Fatalf("%d bad messages or failed acks", bad.Load())
		}
	})

	for _, budget := range []int64{0, 32 << 20} {
		sub := "wire"
		if budget > 0 {
			sub = "wire+budget"
		}
		b.Run(sub, func(b *testing.B) { benchWire(b, setup(b), srv.URL(), budget, maxMessages) })
	}
}

// benchWire is BenchmarkConsume's wire case, with a Budget of budget bytes
// when it is > 0.
func benchWire(b *testing.B, name, url string, budget int64, maxMessages int) {
	ctx := testCtx(b, 5*time.Minute)
	c, err := Dial(ctx, Options{URL: url})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var bud *Budget
	if budget > 0 {
		bud = NewBudget(budget)
	}
	done := make(chan struct{})
	var count, bad atomic.Int64
	n := int64(b.N)
	measure(b, func() {
		sub, err := c.Consume(PullOptions{Stream: name, Consumer: "C", MaxMessages: maxMessages, Expires: 30 * time.Second, Heartbeat: 5 * time.Second, Budget: bud},
			func(m *Msg) {
				if m.HeaderGet("Nats-Msg-Id") == "" || len(m.Data()) == 0 || m.Reply() == "" {
					bad.Add(1)
				}
				if err := m.Ack(); err != nil {
					bad.Add(1)
				}
				if count.Add(1) == n {
					close(done)
				}
			}, nil)
		if err != nil {
			b.Fatal(err)
		}
		finish(b, ctx, done, sub, c.Flush)
	})
	if bad.Load() != 0 {
		b.Fatalf("%d bad messages or failed acks", bad.Load())
	}
}

// finish waits for done, then for flush (round trips to the server, so
// that it has read every ack), and stops sub.
func finish(b *testing.B, ctx context.Context, done <-chan struct{}, sub *Sub, flush ...func(context.Context) error) {
	b.Helper()
	<-done
	for _, f := range flush {
		if err := f(ctx); err != nil {
			b.Fatal(err)
		}
	}
	sub.Stop()
	<-sub.Closed()
}

// measure times run and reports msgs/s and the process's CPU per message.
func measure(b *testing.B, run func()) {
	b.Helper()
	b.ReportAllocs()
	b.ResetTimer()
	c0, t0 := testenv.ProcessCPU(b), time.Now()
	run()
	wall, used := time.Since(t0), testenv.ProcessCPU(b)-c0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/wall.Seconds(), "msgs/s")
	b.ReportMetric(float64(used)/float64(b.N), "cpu-ns/msg")
}

// BenchmarkParse is the reader's per-message parsing without the network:
// a JetStream delivery as nats-server 2.15 frames it (an HMSG with a $JS.ACK
// reply, Nats-Msg-Id and traceparent headers, a ~180-byte event).
func BenchmarkParse(b *testing.B) {
	hdr := "NATS/1.0\r\nNats-Msg-Id: 0b5f3f6e-8d0c-4a43-9a0e-4a1f0d2c6b11\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00\r\n\r\n"
	body := `{"id":"0b5f3f6e-8d0c-4a43-9a0e-4a1f0d2c6b11","ts":"2026-12-02T05:00:00.123456Z","device":"dev-0421","kind":"temperature","value":21.75,"seq":123456,"tags":{"site":"b7","rack":"12"}}`
	frame1 := "HMSG events.dev-0421 1 $JS.ACK.EVENTS.jetsink.1.123456.123456.1764651600123456789.877 " +
		strconv.Itoa(len(hdr)) + " " + strconv.Itoa(len(hdr)+len(body)) + "\r\n" + hdr + body + "\r\n"
	p := parser{br: bufio.NewReaderSize(&repeatReader{b: []byte(frame1)}, readBufSize), maxPayload: 1 << 20}
	var f frame
	b.SetBytes(int64(len(frame1)))
	b.ReportAllocs()
	for b.Loop() {
		if err := p.next(&f); err != nil || f.kind != frameMsg {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcks drains a stream of b.N messages with the wire client and
// acks them in batches of 1,000 from another goroutine, as jetsink's sink
// does after each COMMIT: one Publish per ack on a nats.go connection (how
// jetsink acked until session 24), or AckAll on the connection that
// delivered them. The server runs in this process: cpu-ns/msg is the
// client's and the server's together.
func BenchmarkAcks(b *testing.B) {
	srv := testenv.NATS(b)
	js := srv.JetStream(b)
	var seq atomic.Int64
	const batch = 1000
	for _, mode := range []string{"nats.go-publish", "wire-AckAll"} {
		b.Run(mode, func(b *testing.B) {
			ctx := testCtx(b, 5*time.Minute)
			name := "ACKS" + strconv.FormatInt(seq.Add(1), 10)
			preload(b, ctx, js, name, b.N, 64, jetstream.ConsumerConfig{AckWait: 5 * time.Minute})
			b.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
			nc, err := nats.Connect(srv.URL(), nats.SkipSubjectValidation())
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			c, err := Dial(ctx, Options{URL: srv.URL(), Settle: nc.Publish})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			batches := make(chan []*Msg, 4)
			var bad atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				errs := make([]error, batch)
				for ms := range batches {
					if mode == "wire-AckAll" {
						AckAll(ms, errs)
						for _, err := range errs[:len(ms)] {
							if err != nil {
								bad.Add(1)
							}
						}
						continue
					}
					for _, m := range ms {
						if err := nc.Publish(m.Reply(), payloadAck); err != nil {
							bad.Add(1)
						}
					}
				}
			}()
			cur := make([]*Msg, 0, batch)
			n := 0
			measure(b, func() {
				sub, err := c.Consume(PullOptions{Stream: name, Consumer: "C", MaxMessages: batch, Expires: 30 * time.Second, Heartbeat: 5 * time.Second},
					func(m *Msg) {
						n++
						if cur = append(cur, m); len(cur) == batch || n == b.N {
							batches <- cur
							cur = make([]*Msg, 0, batch)
						}
						if n == b.N {
							close(batches)
						}
					}, nil)
				if err != nil {
					b.Fatal(err)
				}
				finish(b, ctx, done, sub, c.Flush, nc.FlushWithContext)
				// The server applies acks on a queue of its own: wait for
				// them, so that its work on them is counted too.
				cons, err := js.Consumer(ctx, name, "C")
				if err != nil {
					b.Fatal(err)
				}
				eventually(b, 30*time.Second, "every ack applied", func() bool {
					ci, err := cons.Info(ctx)
					return err == nil && ci.NumAckPending == 0 && ci.AckFloor.Stream == uint64(b.N)
				})
			})
			if bad.Load() != 0 {
				b.Fatalf("%d failed acks", bad.Load())
			}
		})
	}
}

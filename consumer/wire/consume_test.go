package wire

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

func dialTest(t testing.TB, ctx context.Context, url string) *Conn {
	t.Helper()
	c, err := Dial(ctx, Options{URL: url, Name: "wire-test"})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestConsumeDrainsStreamExactlyOnce(t *testing.T) {
	const n, subjects = 20000, 7
	ctx := testCtx(t, 2*time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	name := uniqueName("DRAIN")
	preload(t, ctx, js, name, n, subjects, jetstream.ConsumerConfig{AckWait: time.Minute})

	c := dialTest(t, ctx, srv.URL())
	var (
		mu       sync.Mutex
		seen     = make([]bool, n+1)
		lastSeq  = make(map[string]uint64)
		problems []string
		count    atomic.Int64
		ackErrs  atomic.Int64
	)
	bad := func(s string) {
		if len(problems) < 10 {
			problems = append(problems, s)
		}
	}
	handler := func(m *Msg) {
		mu.Lock()
		defer mu.Unlock()
		delivered, sseq := ackMeta(t, m.Reply())
		if delivered != 1 {
			bad("redelivered " + m.Reply())
		}
		if sseq < 1 || sseq > n || seen[sseq] {
			bad("duplicate or out of range " + m.Reply())
		} else {
			seen[sseq] = true
		}
		if sseq <= lastSeq[m.Subject()] {
			bad("out of order on " + m.Subject())
		}
		lastSeq[m.Subject()] = sseq
		i := int(sseq)
		if want := name + "." + strconv.Itoa(i%subjects); m.Subject() != want {
			bad("subject " + m.Subject() + " want " + want)
		}
		if got, want := m.HeaderGet("Nats-Msg-Id"), name+"-"+strconv.Itoa(i); got != want {
			bad("Nats-Msg-Id " + got + " want " + want)
		}
		if got := m.HeaderGet("traceparent"); len(got) != 55 {
			bad("traceparent " + got)
		}
		if !bytes.Equal(m.Data(), payload(i)) {
			bad("payload of " + strconv.Itoa(i))
		}
		if err := m.Ack(); err != nil {
			ackErrs.Add(1)
		}
		count.Add(1)
	}
	rec := newErrRecorder()
	sub, err := c.Consume(PullOptions{Stream: name, Consumer: "C", MaxMessages: 500, Expires: 5 * time.Second}, handler, rec.onErr)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "all messages handled", func() bool { return count.Load() >= n })
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, name, "C")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "acks landed", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.AckFloor.Stream == n && ci.NumPending == 0
	})
	sub.Stop()
	waitClosed(t, sub, 5*time.Second)
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	if got := count.Load(); got != n {
		t.Errorf("handled %d, want %d", got, n)
	}
	if ackErrs.Load() != 0 {
		t.Errorf("%d acks failed", ackErrs.Load())
	}
	if err := sub.Err(); err != nil {
		t.Errorf("Err after Stop: %v", err)
	}
}

// settleFixture is a stream with one message per subject <name>.<kind>,
// consumed into a channel.
func settleFixture(t *testing.T, ackWait time.Duration, kinds ...string) (ctx context.Context, name string, js jetstream.JetStream, c *Conn, msgs chan *Msg) {
	t.Helper()
	ctx = testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js = srv.JetStream(t)
	name = uniqueName("SETTLE")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait}); err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds {
		if _, err := js.Publish(ctx, name+"."+k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	c = dialTest(t, ctx, srv.URL())
	msgs = make(chan *Msg, 100)
	sub, err := c.Consume(PullOptions{Stream: name, Consumer: "C", MaxMessages: 10, Expires: 2 * time.Second, Heartbeat: time.Second},
		func(m *Msg) { msgs <- m }, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Stop(); <-sub.Closed() })
	return ctx, name, js, c, msgs
}

// next returns the next message for kind, or fails after d.
func nextMsg(t *testing.T, msgs chan *Msg, d time.Duration) *Msg {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(d):
		t.Fatalf("no message within %v", d)
		return nil
	}
}

func TestSettlements(t *testing.T) {
	kinds := []string{"ack", "nak", "delay", "wpi", "term", "termr"}
	const ackWait = 2 * time.Second // slack for a loaded machine
	ctx, name, js, c, msgs := settleFixture(t, ackWait, kinds...)
	first := make(map[string]*Msg)
	for range kinds {
		m := nextMsg(t, msgs, 10*time.Second)
		first[m.Subject()[len(name)+1:]] = m
	}
	start := time.Now()
	for k, err := range map[string]error{
		"ack":   first["ack"].Ack(),
		"nak":   first["nak"].Nak(),
		"delay": first["delay"].NakWithDelay(3 * time.Second),
		"term":  first["term"].Term(),
		"termr": first["termr"].TermWithReason("bad payload"),
	} {
		if err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// A second final settlement, and InProgress after one, are refused.
	for k, m := range first {
		if k == "wpi" {
			continue
		}
		for _, f := range []func() error{m.Ack, m.Nak, m.Term, m.InProgress} {
			if err := f(); !errors.Is(err, ErrMsgAlreadyAcked) {
				t.Errorf("%s: second settlement returned %v, want ErrMsgAlreadyAcked", k, err)
			}
		}
	}
	// InProgress keeps "wpi" from being redelivered past its ack wait.
	wpi := first["wpi"]
	redelivered := make(map[string]time.Time)
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(ackWait / 3)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-tick.C:
			if err := wpi.InProgress(); err != nil {
				t.Fatalf("InProgress: %v", err)
			}
		case m := <-msgs:
			k := m.Subject()[len(name)+1:]
			d, _ := ackMeta(t, m.Reply())
			if d != 2 {
				t.Errorf("%s redelivered with count %d, want 2", k, d)
			}
			redelivered[k] = time.Now()
			if err := m.Ack(); err != nil {
				t.Errorf("ack redelivered %s: %v", k, err)
			}
		}
	}
	if err := wpi.Ack(); err != nil {
		t.Fatal(err)
	}
	if _, ok := redelivered["nak"]; !ok {
		t.Error("nak'ed message not redelivered")
	}
	if at, ok := redelivered["delay"]; !ok {
		t.Error("message nak'ed with delay not redelivered")
	} else if d := at.Sub(start); d < 2400*time.Millisecond {
		t.Errorf("NakWithDelay(3s) redelivered after %v", d)
	}
	for _, k := range []string{"ack", "wpi", "term", "termr"} {
		if _, ok := redelivered[k]; ok {
			t.Errorf("%s redelivered", k)
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, name, "C")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "nothing pending", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0 && ci.AckFloor.Stream == uint64(len(kinds))
	})
}

func TestSettleAfterClose(t *testing.T) {
	ctx, name, js, c, msgs := settleFixture(t, time.Minute, "a", "b")
	a, b := nextMsg(t, msgs, 10*time.Second), nextMsg(t, msgs, 10*time.Second)
	if err := a.Ack(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close wrote out the ack buffered before it.
	_, aSeq := ackMeta(t, a.Reply())
	cons, err := js.Consumer(ctx, name, "C")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the ack sent before Close applied", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.AckFloor.Stream >= aSeq
	})
	for name, f := range map[string]func() error{"Ack": b.Ack, "Nak": b.Nak, "InProgress": b.InProgress, "Term": b.Term,
		"NakWithDelay": func() error { return b.NakWithDelay(time.Second) }, "TermWithReason": func() error { return b.TermWithReason("x") }} {
		if err := f(); !errors.Is(err, ErrConnectionClosed) {
			t.Errorf("%s after Close: %v, want ErrConnectionClosed", name, err)
		}
	}
	if err := c.Flush(context.Background()); !errors.Is(err, ErrConnectionClosed) {
		t.Errorf("Flush after Close: %v", err)
	}
	if _, err := c.Consume(PullOptions{Stream: "S", Consumer: "C"}, func(*Msg) {}, nil); !errors.Is(err, ErrConnectionClosed) {
		t.Errorf("Consume after Close: %v", err)
	}
}

func TestConsumeMaxBytes(t *testing.T) {
	const n = 2000
	ctx := testCtx(t, time.Minute)
	// max_bytes may not be below max_payload (a larger message would never
	// fit a request), so the server's is 8 KiB.
	srv := startServer(t, func(o *server.Options) { o.MaxPayload = 8 << 10 })
	js := jetStreamAt(t, serverURL(srv, "nats", ""))
	preload(t, ctx, js, "BYTES", n, 3, jetstream.ConsumerConfig{AckWait: time.Minute})
	c := dialTest(t, ctx, serverURL(srv, "nats", ""))
	if _, err := c.Consume(PullOptions{Stream: "BYTES", Consumer: "C", MaxBytes: 4 << 10}, func(*Msg) {}, nil); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("MaxBytes below max_payload: %v, want ErrInvalidOptions", err)
	}
	// Each request is cut short by max_bytes (a 409 that gives back the
	// credit of the rest); the Sub keeps pulling to the end.
	var count atomic.Int64
	rec := newErrRecorder()
	sub, err := c.Consume(PullOptions{Stream: "BYTES", Consumer: "C", MaxMessages: 100, MaxBytes: 8 << 10}, func(m *Msg) {
		if m.Size() > 8<<10 {
			t.Errorf("message of %d bytes", m.Size())
		}
		if err := m.Ack(); err != nil {
			t.Errorf("ack: %v", err)
		}
		count.Add(1)
	}, rec.onErr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	eventually(t, 30*time.Second, "all handled", func() bool { return count.Load() == n })
	select {
	case err := <-rec.ch:
		t.Errorf("onErr: %v", err)
	default:
	}
}

// While the handler is slow, what waits for it stays within about three
// times MaxBytes. Credit is counted in messages, and each request cut short
// by max_bytes gives back the rest: the Sub pulled again and again until
// half of MaxMessages waited (here ~170 KB of ~350-byte messages for an
// 8 KiB MaxBytes), whatever their size. Once the handler goes on, every
// message comes.
func TestConsumeMaxBytesBoundsWhatWaits(t *testing.T) {
	const n, maxBytes = 2000, 8 << 10
	ctx := testCtx(t, time.Minute)
	srv := startServer(t, func(o *server.Options) { o.MaxPayload = maxBytes })
	js := jetStreamAt(t, serverURL(srv, "nats", ""))
	preload(t, ctx, js, "WAITS", n, 3, jetstream.ConsumerConfig{AckWait: time.Minute})
	c := dialTest(t, ctx, serverURL(srv, "nats", ""))
	gate := make(chan struct{})
	var count atomic.Int64
	sub, err := c.Consume(PullOptions{Stream: "WAITS", Consumer: "C", MaxMessages: 1000, MaxBytes: maxBytes}, func(m *Msg) {
		<-gate
		if err := m.Ack(); err != nil {
			t.Errorf("ack: %v", err)
		}
		count.Add(1)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Closed() }()
	eventually(t, 10*time.Second, "a message waiting", func() bool { return sub.held.Load() > 0 })
	// What more arrives, arrives within a few round trips on loopback.
	var most int64
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		most = max(most, sub.heldBytes.Load())
	}
	if most > 3*maxBytes {
		t.Errorf("%d bytes (%d messages) waited for the handler, want at most 3 x MaxBytes = %d", most, sub.held.Load(), 3*maxBytes)
	}
	close(gate)
	eventually(t, 30*time.Second, "all handled", func() bool { return count.Load() == n })
	// heldBytes goes down once the handler has returned.
	eventually(t, 10*time.Second, "no byte held once every message was handled", func() bool { return sub.heldBytes.Load() == 0 })
}

// pongConn counts the PONGs the client writes.
type pongConn struct {
	net.Conn
	pongs atomic.Int64
}

func (p *pongConn) Write(b []byte) (int, error) {
	p.pongs.Add(int64(bytes.Count(b, []byte("PONG\r\n"))))
	return p.Conn.Write(b)
}

type pongDialer struct{ conn *pongConn }

func (d *pongDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	d.conn = &pongConn{Conn: c}
	return d.conn, nil
}

// The acks AckAll buffers reach the server without any other write to
// wake the flusher: every message is acked, none is pending. The pull
// asks for four times the messages, so it asks again only when it expires,
// and the server's first PING (2 s after the connection; the next comes
// after 2 min) is answered before the acks are buffered.
func TestAckAllReachesServer(t *testing.T) {
	const n = 300
	ctx := testCtx(t, time.Minute)
	srv := testenv.NATS(t)
	js := srv.JetStream(t)
	name := uniqueName("ACKALL")
	preload(t, ctx, js, name, n, 3, jetstream.ConsumerConfig{AckWait: time.Minute})
	d := &pongDialer{}
	c, err := Dial(ctx, Options{URL: srv.URL(), Dialer: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	pongs := d.conn.pongs.Load()
	var (
		mu  sync.Mutex
		got []*Msg
	)
	all := make(chan struct{})
	sub, err := c.Consume(PullOptions{Stream: name, Consumer: "C", MaxMessages: 4 * n, Expires: 30 * time.Second, Heartbeat: 5 * time.Second}, func(m *Msg) {
		mu.Lock()
		defer mu.Unlock()
		if got = append(got, m); len(got) == n {
			close(all)
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatal("the messages did not all arrive")
	}
	eventually(t, 10*time.Second, "the server's first PING answered", func() bool { return d.conn.pongs.Load() > pongs })
	mu.Lock()
	errs := make([]error, n)
	AckAll(got, errs)
	mu.Unlock()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	cons, err := js.Consumer(ctx, name, "C")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "every message acked", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.AckFloor.Stream == n && ci.NumAckPending == 0
	})
}

package wire

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var streamSeq atomic.Int64

// uniqueName isolates a test's stream and consumer.
func uniqueName(prefix string) string {
	return prefix + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.FormatInt(streamSeq.Add(1), 10)
}

// testCtx is a test's own deadline.
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// preload creates a stream on subjects <name>.> and a durable pull consumer
// on it, and publishes n messages to <name>.<i%subjects> with a
// Nats-Msg-Id of "<name>-<i>", a traceparent and a ~200-byte JSON payload
// holding i.
func preload(t testing.TB, ctx context.Context, js jetstream.JetStream, name string, n, subjects int, cc jetstream.ConsumerConfig) {
	t.Helper()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	cc.Durable = "C"
	if cc.AckPolicy == jetstream.AckNonePolicy {
		cc.AckPolicy = jetstream.AckExplicitPolicy
	}
	cc.MaxAckPending = -1
	if _, err := js.CreateConsumer(ctx, name, cc); err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	publish(t, ctx, js, name, 1, n, subjects)
}

func publish(t testing.TB, ctx context.Context, js jetstream.JetStream, name string, from, to, subjects int) {
	t.Helper()
	for i := from; i <= to; i++ {
		m := nats.NewMsg(name + "." + strconv.Itoa(i%subjects))
		m.Header.Set("Nats-Msg-Id", name+"-"+strconv.Itoa(i))
		m.Header["traceparent"] = []string{fmt.Sprintf("00-%032x-%016x-01", i, i)}
		m.Data = payload(i)
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		// Every 1,000, and at the end, wait for the PubAcks: past 4,000
		// unanswered nats.go waits 200 ms for room and then refuses the
		// publish ("stalled with too many outstanding async published
		// messages"), which a loaded machine reached (1 whole-package run
		// in 5 under -race beside other work).
		if (i-from)%1000 == 999 || i == to {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatalf("publish: %d acks missing: %v", js.PublishAsyncPending(), ctx.Err())
			}
		}
	}
}

func payload(i int) []byte {
	return fmt.Appendf(nil, `{"id":"%08d-0000-4000-a000-000000000000","ts":"2026-12-02T01:02:03.456789Z","device":"dev-%04d","kind":"temp","value":%d.5,"seq":%d,"tags":{"site":"a","rack":"r%d"},"pad":"%s"}`,
		i, i%64, i%300, i, i%8, strings.Repeat("x", 20))
}

// ackMeta parses a $JS.ACK reply: delivery count and stream sequence.
func ackMeta(t testing.TB, reply string) (delivered, sseq uint64) {
	tok := strings.Split(reply, ".")
	if len(tok) == 12 {
		tok = append(tok[:2], tok[4:]...)
	}
	if len(tok) < 9 || tok[0] != "$JS" || tok[1] != "ACK" {
		t.Errorf("reply %q is not a $JS.ACK subject", reply)
		return 0, 0
	}
	d, err1 := strconv.ParseUint(tok[4], 10, 64)
	s, err2 := strconv.ParseUint(tok[5], 10, 64)
	if err1 != nil || err2 != nil {
		t.Errorf("reply %q: bad numbers", reply)
	}
	return d, s
}

// waitClosed fails the test when s does not close within d.
func waitClosed(t testing.TB, s *Sub, d time.Duration) {
	t.Helper()
	select {
	case <-s.Closed():
	case <-time.After(d):
		t.Fatalf("Sub not closed after %v", d)
	}
}

// eventually polls cond until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// errRecorder collects onErr's errors.
type errRecorder struct {
	ch chan error
}

func newErrRecorder() *errRecorder { return &errRecorder{ch: make(chan error, 64)} }

func (r *errRecorder) onErr(err error) {
	select {
	case r.ch <- err:
	default:
	}
}

// wait returns the first recorded error that match accepts.
func (r *errRecorder) wait(t testing.TB, d time.Duration, match func(error) bool) error {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case err := <-r.ch:
			if match(err) {
				return err
			}
			t.Logf("onErr: %v", err)
		case <-timeout:
			t.Fatalf("no matching onErr within %v", d)
			return nil
		}
	}
}

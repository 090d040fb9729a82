package bench

import (
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetsink/jetsink/consumer"
)

// ackTimes records when each message of one stream was first acked, as
// seen by a subscriber to the consumer's ack subjects: the engine publishes
// an ack only after the message's row has committed, and the commit's WAL
// flush is behind it, so the ack's arrival is the end of publish-to-commit
// latency that nothing inside PostgreSQL can make look shorter. It is read
// on the bench's own clock, as the scheduled send time is: its monotonic
// reading, so that a step of the wall clock in the run does not enter the
// latency (measureTable).
type ackTimes struct {
	subs []*nats.Subscription
	base time.Time // with a monotonic reading

	mu     sync.Mutex
	at     []int64 // 1 + ns since base of the first ack of stream sequence i+1; 0 if none seen
	seen   int
	ignore int // acks of another shape or stream
}

// recordAcks subscribes on nc to the acks of consumer on stream, in both
// ack subject forms (with and without a JetStream domain and account hash).
func recordAcks(nc *nats.Conn, stream, consumer string) (*ackTimes, error) {
	a := &ackTimes{base: time.Now()}
	for _, subj := range []string{
		"$JS.ACK." + stream + "." + consumer + ".>",
		"$JS.ACK.*.*." + stream + "." + consumer + ".>",
	} {
		sub, err := nc.Subscribe(subj, a.record(stream))
		if err != nil {
			a.stop()
			return nil, fmt.Errorf("bench: subscribe to %s: %w", subj, err)
		}
		// Acks arrive as fast as the engine commits: never drop one
		// for a slow callback (the default limit is 512k messages).
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			a.stop()
			return nil, fmt.Errorf("bench: %w", err)
		}
		a.subs = append(a.subs, sub)
	}
	if err := nc.Flush(); err != nil { // the server has the interest before the engine acks
		a.stop()
		return nil, fmt.Errorf("bench: subscribe to acks: %w", err)
	}
	return a, nil
}

func (a *ackTimes) record(stream string) nats.MsgHandler {
	return func(m *nats.Msg) {
		now := int64(time.Since(a.base)) + 1
		s, seq, ok := consumer.AckSubjectSeq(m.Subject)
		a.mu.Lock()
		defer a.mu.Unlock()
		if !ok || s != stream || seq == 0 || !isAck(m.Data) {
			a.ignore++
			return
		}
		for uint64(len(a.at)) < seq {
			a.at = append(a.at, 0)
		}
		if a.at[seq-1] == 0 {
			a.at[seq-1] = now
			a.seen++
		}
	}
}

// isAck reports whether an ack subject's payload acknowledges the message:
// "+ACK", an empty payload, or "+NXT" (ack and ask for more); not "-NAK",
// "+WPI" (in progress) or "+TERM".
func isAck(p []byte) bool {
	s := string(p)
	return s == "" || s == "+ACK" || len(s) >= 4 && s[:4] == "+NXT"
}

// stop unsubscribes after the server has sent what it had: call it once
// the engine has acked everything.
func (a *ackTimes) stop() {
	for _, s := range a.subs {
		_ = s.Drain()
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range a.subs {
		for s.IsValid() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// get returns when stream sequence seq was first acked, with a monotonic
// reading.
func (a *ackTimes) get(seq int64) (time.Time, bool) {
	if a == nil {
		return time.Time{}, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if seq < 1 || seq > int64(len(a.at)) || a.at[seq-1] == 0 {
		return time.Time{}, false
	}
	return a.base.Add(time.Duration(a.at[seq-1] - 1)), true
}

// natsConnect connects with the nats: section's URL and credentials, and
// extra options.
func natsConnect(cfg consumer.Config, name string, extra ...nats.Option) (*nats.Conn, error) {
	auth, err := cfg.AuthOptions()
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	nc, err := nats.Connect(cfg.URL, append(append([]nats.Option{nats.Name(name)}, auth...), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", cfg.ConnectError(err))
	}
	return nc, nil
}

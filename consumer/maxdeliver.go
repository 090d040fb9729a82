package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetsink/jetsink/pipeline"
)

// StageDeliver is the Jetsink-Stage of a dead letter for an event that
// reached nats.max_deliver without being acked: no stage gave up on it, the
// deliveries ran out.
const StageDeliver = "deliver"

// CodeMaxDeliver is the Jetsink-Code of such a dead letter.
const CodeMaxDeliver = "max_deliver"

// maxDeliverAttempts and maxDeliverTimeout bound the work on one advisory.
const (
	maxDeliverAttempts = 4
	maxDeliverTimeout  = 10 * time.Second
)

// maxDeliverAdvisory is the part of JetStream's
// io.nats.jetstream.advisory.v1.max_deliver event jetsink reads.
type maxDeliverAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// watchMaxDeliveries subscribes to the server's MAX_DELIVERIES advisory for
// the consumer. The subscription lives as long as the connection; nats.go
// runs the handler on its own goroutine, one advisory at a time.
func (c *Consumer) watchMaxDeliveries() error {
	subject := fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s", c.cfg.Stream, c.cfg.Consumer)
	if _, err := c.nc.Subscribe(subject, c.onMaxDeliveries); err != nil {
		return fmt.Errorf("subscribe to max-deliveries advisories: %w", err)
	}
	return nil
}

// onMaxDeliveries dead-letters the event an advisory names: JetStream will
// not deliver it again, so without this it would sit in the stream unseen.
// The event is read back from the stream by sequence and published like any
// dead letter (same Nats-Msg-Id, so several jetsink instances receiving the
// same advisory store it once). There is nothing to terminate. If it cannot
// be published after a few attempts it stays in the stream, and the log line
// says where.
func (c *Consumer) onMaxDeliveries(m *nats.Msg) {
	var adv maxDeliverAdvisory
	if err := json.Unmarshal(m.Data, &adv); err != nil || adv.StreamSeq == 0 {
		c.log.Error("unreadable max-deliveries advisory", "err", err)
		return
	}
	delay := time.Second
	var err error
	for attempt := 1; attempt <= maxDeliverAttempts; attempt++ {
		if err = c.deadLetterBySeq(adv); err == nil {
			c.stats.maxDelivered.Add(1)
			c.log.Warn("event reached nats.max_deliver; dead-lettered",
				"stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries)
			return
		}
		if c.nc.IsClosed() || c.nc.IsDraining() || attempt == maxDeliverAttempts {
			break
		}
		time.Sleep(delay)
		delay *= 2
	}
	c.stats.deadLetterFailed.Add(1)
	c.log.Error("event reached nats.max_deliver and could not be dead-lettered; it stays in the stream at this sequence",
		"stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries, "err", err)
}

func (c *Consumer) deadLetterBySeq(adv maxDeliverAdvisory) error {
	ctx, cancel := context.WithTimeout(context.Background(), maxDeliverTimeout)
	defer cancel()
	stream, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return fmt.Errorf("look up stream: %w", err)
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		return fmt.Errorf("read stream seq %d: %w", adv.StreamSeq, err)
	}
	ev := pipeline.Event{
		Subject:   raw.Subject,
		Data:      raw.Data,
		Header:    raw.Header,
		Stream:    c.cfg.Stream,
		StreamSeq: raw.Sequence,
		Delivered: adv.Deliveries,
		Published: raw.Time,
		Received:  time.Now(),
		MsgID:     raw.Header.Get(HeaderMsgID),
	}
	dl := pipeline.DeadLetter{
		Stage:  StageDeliver,
		Code:   CodeMaxDeliver,
		Reason: fmt.Sprintf("not acked after %d deliveries (nats.max_deliver)", adv.Deliveries),
	}
	if _, err := c.js.PublishMsg(ctx, c.deadLetterMsg(&ev, dl)); err != nil {
		return fmt.Errorf("publish to %s: %w", c.cfg.DeadLetterSubject, err)
	}
	return nil
}

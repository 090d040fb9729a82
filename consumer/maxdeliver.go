package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
)

// An advisory's event is dead-lettered with attempts of at most
// maxDeliverTimeout each, maxDeliverRetry[0] apart at first and doubling to
// maxDeliverRetry[1], for as long as the connection is open: JetStream will
// not deliver the event again, so giving up would lose it. New copies
// maxDeliverRetry (a variable so that tests can shorten it).
const maxDeliverTimeout = 10 * time.Second

var maxDeliverRetry = [2]time.Duration{time.Second, 30 * time.Second}

// advisorySkew is how much later than a max-deliver advisory the event at
// its sequence must have been stored for jetsink to judge it another event
// (of a re-created stream): in a cluster the stream leader that stamps the
// store time and the consumer leader that raises the advisory read
// different clocks. Erring the other way would leave an event that reached
// max_deliver without its dead letter.
const advisorySkew = 5 * time.Second

// maxDeliverAdvisory is the part of JetStream's
// io.nats.jetstream.advisory.v1.max_deliver event jetsink reads.
type maxDeliverAdvisory struct {
	Stream     string    `json:"stream"`
	Consumer   string    `json:"consumer"`
	StreamSeq  uint64    `json:"stream_seq"`
	Deliveries uint64    `json:"deliveries"`
	Time       time.Time `json:"timestamp"` // when the server raised it; zero for a recorded event
}

// watchMaxDeliveries subscribes to the server's MAX_DELIVERIES advisory for
// the consumer. The subscription lives as long as the connection; nats.go
// runs the handler on its own goroutine, one advisory at a time, and keeps
// those that arrive meanwhile within its default pending limits (512k
// messages, 64 MB): memory stays bounded. Past them nats.go drops
// advisories and reports a slow consumer, which New's error handler logs
// at ERROR with this subject: those events stay in the stream.
func (c *Consumer) watchMaxDeliveries() error {
	subject := fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s", c.cfg.Stream, c.cfg.Consumer)
	if _, err := c.nc.Subscribe(subject, c.onMaxDeliveries); err != nil {
		return fmt.Errorf("subscribe to max-deliveries advisories: %w", err)
	}
	return nil
}

// onMaxDeliveries dead-letters the event an advisory names. The durable
// consumer allows one delivery more than nats.max_deliver (serverMaxDeliver),
// and that last delivery is dead-lettered by the worker that takes it
// (pipeline.Event.Exhausted), so the server raises this advisory only when
// that delivery was not settled within ack_wait either: its dead letter
// failed and it was nak'ed, or jetsink stalled or lost its connection
// while it held it. JetStream will not deliver the event again, so
// without this it would sit in the stream unseen.
// The event is read back from the stream by sequence and published like any
// dead letter (same Nats-Msg-Id, so several jetsink instances receiving the
// same advisory store it once). There is nothing to terminate.
//
// One attempt is made here, so that the advisories behind it get theirs
// at once. If it fails, the event goes on the record in the consumer's
// metadata (strand) and the retry loop tries it again, backing off to one
// attempt every maxDeliverRetry[1], until it succeeds or the event or its
// stream is gone. If jetsink stops first, the record stays and the next
// start resumes it.
func (c *Consumer) onMaxDeliveries(m *nats.Msg) {
	var adv maxDeliverAdvisory
	if err := json.Unmarshal(m.Data, &adv); err != nil || adv.StreamSeq == 0 {
		c.log.Error("unreadable max-deliveries advisory", "err", err)
		return
	}
	done, created, err := c.deadLetterMaxDelivered(adv, time.Time{})
	if done {
		return
	}
	c.log.Error("event reached nats.max_deliver and could not be dead-lettered yet; recording it and retrying",
		"stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries, "err", err)
	c.strand(adv, created) // created is zero if the stream could not be looked up
}

// deadLetterMaxDelivered makes one attempt to dead-letter adv's event.
// done reports that nothing is left to do: the dead letter is stored, or
// the event (or its stream, when created is set and the stream's creation
// time differs) is gone. created returns the stream's creation time when
// it could be looked up.
func (c *Consumer) deadLetterMaxDelivered(adv maxDeliverAdvisory, in time.Time) (done bool, created time.Time, err error) {
	created, dup, err := c.deadLetterBySeq(adv, in)
	switch {
	case err == nil && dup:
		// Stored already: by the worker that took its extra delivery
		// (whose term then failed), or by another jetsink that heard this
		// advisory. Counted there.
		c.log.Info("event reached nats.max_deliver; its dead letter was stored already", "stream_seq", adv.StreamSeq)
		return true, created, nil
	case err == nil:
		c.stats.maxDelivered.Add(1)
		c.log.Warn("event reached nats.max_deliver; dead-lettered", "stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries)
		return true, created, nil
	case errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, errEventStreamGone):
		// Nothing to dead-letter any more, now or later.
		c.stats.deadLetterFailed.Add(1)
		c.log.Error("event reached nats.max_deliver and is no longer in the stream (removed by its limits, or deleted): it cannot be dead-lettered",
			"stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries, "err", err)
		return true, created, err
	default:
		c.stats.deadLetterFailed.Add(1)
		return false, created, err
	}
}

// errEventStreamGone: the stream of a recorded event was deleted (and
// re-created) since; the event went with it.
var errEventStreamGone = errors.New("the event's stream was deleted since")

// stopping reports whether the connection is closed or draining.
func (c *Consumer) stopping() bool { return c.nc.IsClosed() || c.nc.IsDraining() }

// sleepUnlessStopping waits d; it reports false, early, once the
// connection starts closing or draining. nats.go's Drain waits for this
// handler, so it looks every 100 ms rather than sleeping d at once.
func (c *Consumer) sleepUnlessStopping(d time.Duration) bool {
	const step = 100 * time.Millisecond
	for end := time.Now().Add(d); ; {
		left := time.Until(end)
		if left <= 0 {
			return !c.stopping()
		}
		select {
		case <-c.closed:
			return false
		case <-time.After(min(step, left)):
		}
		if c.stopping() {
			return false
		}
	}
}

// deadLetterBySeq reads adv's event back from the stream and publishes its
// dead letter. With in set, the stream must be the one created then; the
// event of a fresh advisory must have been stored before the advisory was
// raised (give or take advisorySkew). It returns the stream's creation
// time when it could look it up, and whether the dead-letter stream had
// the letter already (its Nats-Msg-Id within the duplicate window).
func (c *Consumer) deadLetterBySeq(adv maxDeliverAdvisory, in time.Time) (created time.Time, dup bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), maxDeliverTimeout)
	defer cancel()
	stream, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("look up stream: %w", err)
	}
	created = stream.CachedInfo().Created
	if !in.IsZero() && !created.Equal(in) {
		return created, false, errEventStreamGone
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		return created, false, fmt.Errorf("read stream seq %d: %w", adv.StreamSeq, err)
	}
	if !adv.Time.IsZero() && raw.Time.After(adv.Time.Add(advisorySkew)) {
		// Stored after the advisory about it was raised: the advisory's
		// event went with a deleted stream, and this is a re-created
		// stream's event at the same sequence.
		return created, false, errEventStreamGone
	}
	ev := pipeline.Event{
		Subject:   raw.Subject,
		Data:      raw.Data,
		Header:    raw.Header,
		Stream:    c.cfg.Stream,
		StreamSeq: raw.Sequence,
		Delivered: pipeline.DeliveryCount(adv.Deliveries),
		Published: raw.Time,
		Received:  time.Now(),
		MsgID:     raw.Header.Get(HeaderMsgID),
	}
	dl := pipeline.MaxDeliverDeadLetter(adv.Deliveries)
	ack, err := c.js.PublishMsg(ctx, c.deadLetterMsg(&ev, dl))
	if err != nil {
		return created, false, fmt.Errorf("publish to %s: %w", c.cfg.DeadLetterSubject, err)
	}
	return created, ack.Duplicate, nil
}

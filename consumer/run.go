package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
)

// HeaderMsgID is the header JetStream de-duplicates on.
const HeaderMsgID = "Nats-Msg-Id"

// Back-off between attempts to re-create the pull iterator or the consumer.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// Run pulls messages continuously and pushes each, wrapped in a
// pipeline.Event, into out (blocking while the chosen ring is full, which is
// how back-pressure reaches JetStream). It is the producer of out and closes
// it before returning, whatever the outcome.
//
// Run survives disconnects and server restarts: nats.go re-issues the pull
// on reconnect; when heartbeats stop or the iterator fails (consumer deleted,
// stream re-created), Run checks the stream and consumer, re-creates them
// (the stream only with nats.create_stream) and opens a new iterator, with
// capped backoff, logging each step.
//
// When ctx (intake) ends, Run stops pulling, drains the iterator so messages
// already delivered to this client are still pushed, and returns nil. That
// drain and those pushes are bounded by hard. When hard ends, Run returns
// promptly with an error wrapping hard's error; messages it took but did not
// push are not acked and JetStream redelivers them after nats.ack_wait.
// Run returns an error wrapping ringq.ErrClosed if out was closed by someone
// else and one wrapping jetstream.ErrConnectionClosed if Close was called.
// Run must not be called concurrently with itself.
func (c *Consumer) Run(ctx, hard context.Context, out *ringq.Dispatch[pipeline.Event]) error {
	defer out.Close()

	// intake ends with ctx or hard, so one NextContext watches both.
	intake, cancel := context.WithCancel(ctx)
	defer cancel()
	stopAfter := context.AfterFunc(hard, cancel)
	defer stopAfter()

	// Built once: each NextContext allocates its closure.
	nextIntake := jetstream.NextContext(intake)
	nextHard := jetstream.NextContext(hard)

	var iter jetstream.MessagesContext
	defer func() {
		if iter != nil {
			iter.Stop()
		}
	}()
	backoff := retryMin
pull:
	for {
		if iter == nil {
			var err error
			iter, err = c.open(intake)
			if err != nil {
				if intake.Err() != nil {
					break pull
				}
				c.log.Error("open pull iterator; retrying", "err", err, "retry_in", backoff)
				if !sleep(intake, backoff) {
					break pull
				}
				backoff = min(2*backoff, retryMax)
				continue
			}
		}
		msg, err := iter.Next(nextIntake)
		if err == nil {
			backoff = retryMin
			if err := c.push(hard, out, msg); err != nil {
				return err
			}
			continue
		}
		if intake.Err() != nil {
			break pull
		}
		switch {
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			// The iterator pulls again by itself; find out whether the
			// consumer is still there (a restart with a lost store, a
			// re-created stream or consumer answer pulls with silence).
			c.stats.heartbeatsMissing.Add(1)
			c.log.Warn("pull heartbeats missed; checking the consumer")
			if c.recheck(intake) {
				iter.Stop()
				iter = nil
				c.stats.iteratorRestarts.Add(1)
			}
		case errors.Is(err, jetstream.ErrConnectionClosed):
			return fmt.Errorf("consume: %w", err)
		default:
			// Consumer deleted, bad request, iterator closed under us.
			c.log.Warn("pull iterator failed; re-creating it", "err", err, "retry_in", backoff)
			iter.Stop()
			iter = nil
			c.stats.iteratorRestarts.Add(1)
			if !sleep(intake, backoff) {
				break pull
			}
			backoff = min(2*backoff, retryMax)
			if err := c.ensureAll(intake); err != nil && intake.Err() == nil {
				c.log.Error("re-create stream/consumer", "err", err)
			}
		}
	}

	if err := hard.Err(); err != nil {
		return fmt.Errorf("consume: shutdown cut short: %w", err)
	}
	if iter == nil {
		return nil
	}
	// Intake ended: stop pulling and push what this client already holds.
	iter.Drain()
	for {
		msg, err := iter.Next(nextHard)
		if err == nil {
			if err := c.push(hard, out, msg); err != nil {
				return err
			}
			continue
		}
		switch {
		case hard.Err() != nil:
			return fmt.Errorf("consume: drain cut short: %w", hard.Err())
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			continue
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			iter = nil
			return nil
		default:
			c.log.Warn("pull iterator failed while draining", "err", err)
			return nil
		}
	}
}

// push wraps msg and pushes it into out under hard.
func (c *Consumer) push(hard context.Context, out *ringq.Dispatch[pipeline.Event], msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		// Not a JetStream message: nothing to settle, nothing to store.
		c.log.Error("message without JetStream metadata dropped", "subject", msg.Subject(), "err", err)
		return nil
	}
	h := msg.Headers()
	ev := pipeline.Event{
		Msg:         msg,
		Subject:     msg.Subject(),
		Data:        msg.Data(),
		Header:      h,
		Stream:      meta.Stream,
		StreamSeq:   meta.Sequence.Stream,
		ConsumerSeq: meta.Sequence.Consumer,
		Delivered:   meta.NumDelivered,
		Published:   meta.Timestamp,
		Received:    time.Now(),
	}
	if v := h[HeaderMsgID]; len(v) > 0 {
		ev.MsgID = v[0]
	}
	c.stats.received.Add(1)
	if ev.Delivered > 1 {
		c.stats.redelivered.Add(1)
	}
	if err := out.Push(hard, ev); err != nil {
		// Taken but not handed on: let JetStream redeliver it soon.
		_ = msg.Nak()
		return fmt.Errorf("consume: push event: %w", err)
	}
	return nil
}

// open starts a pull iterator on the current consumer.
func (c *Consumer) open(ctx context.Context) (jetstream.MessagesContext, error) {
	cfg := &c.cfg
	opts := make([]jetstream.PullMessagesOpt, 0, 4)
	if cfg.PullMaxBytes > 0 {
		opts = append(opts, jetstream.PullMaxMessagesWithBytesLimit(cfg.PullMaxMessages, cfg.PullMaxBytes))
	} else {
		opts = append(opts, jetstream.PullMaxMessages(cfg.PullMaxMessages))
	}
	opts = append(opts,
		jetstream.PullExpiry(cfg.PullExpiry),
		jetstream.PullHeartbeat(cfg.PullHeartbeat),
	)
	iter, err := c.cons.Load().Messages(opts...)
	if err != nil {
		return nil, fmt.Errorf("open pull iterator: %w", err)
	}
	return iter, nil
}

// recheck looks the consumer up and re-creates what is missing. It reports
// whether the consumer was re-created, in which case the iterator must be
// re-opened.
func (c *Consumer) recheck(ctx context.Context) bool {
	if !c.nc.IsConnected() {
		return false // reconnecting: nats.go re-pulls once it is back
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.js.Consumer(rctx, c.cfg.Stream, c.cfg.Consumer)
	switch {
	case err == nil:
		return false
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		c.log.Warn("consumer gone; re-creating it", "err", err)
		if err := c.ensureAll(rctx); err != nil {
			c.log.Error("re-create stream/consumer", "err", err)
			return false
		}
		return true
	default:
		c.log.Warn("consumer check failed", "err", err)
		return false
	}
}

// ensureAll re-creates the stream (only with nats.create_stream) and the
// consumer.
func (c *Consumer) ensureAll(ctx context.Context) error {
	if err := c.ensureStream(ctx); err != nil {
		return err
	}
	return c.ensureConsumer(ctx)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

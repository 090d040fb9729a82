package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The durable consumer's metadata keys under which jetsink records the
// events that reached max_deliver and are not dead-lettered yet:
// strandedKey lists "<stream_seq>:<deliveries>" separated by commas, and
// strandedStreamKey names the stream they are in by its creation time
// (RFC 3339), so that a record is never applied to a stream re-created
// since. JetStream will not deliver such an event again and sends its
// advisory once, so this record is what lets a restarted jetsink finish
// the dead letter. It lives in the server with the consumer; updating it
// needs no permission beyond creating the consumer.
const (
	strandedKey       = "jetsink_max_deliver_pending"
	strandedStreamKey = "jetsink_max_deliver_stream"
)

// strandedMax bounds the record (~42 KB, under the server's 128 KB for
// metadata). Past it, an event is retried in memory only, and an ERROR
// line says so.
const strandedMax = 1000

// strandedTimeout bounds one read or update of the record.
const strandedTimeout = 10 * time.Second

// stranded is the set of events waiting for their max-deliver dead letter,
// guarded by mu, which also serialises the consumer updates that carry it.
type stranded struct {
	mu      sync.Mutex
	seqs    map[uint64]uint64 // stream sequence -> deliveries
	stream  time.Time         // creation time of the stream they are in
	running bool              // the retry loop is running
	loop    sync.WaitGroup    // the retry loop, which Close waits for
}

// parseRecord reads a strandedKey value; bad is an entry it could not read.
func parseRecord(v string) (seqs map[uint64]uint64, bad string) {
	seqs = map[uint64]uint64{}
	for _, e := range strings.Split(v, ",") {
		if e == "" {
			continue
		}
		seq, dc, ok := strings.Cut(e, ":")
		sn, err1 := strconv.ParseUint(seq, 10, 64)
		dn, err2 := strconv.ParseUint(dc, 10, 64)
		if !ok || err1 != nil || err2 != nil || sn == 0 {
			bad = e
			continue
		}
		seqs[sn] = dn
	}
	return seqs, bad
}

func formatRecord(seqs map[uint64]uint64) string {
	var b strings.Builder
	for _, seq := range slices.Sorted(maps.Keys(seqs)) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(seq, 10))
		b.WriteByte(':')
		b.WriteString(strconv.FormatUint(seqs[seq], 10))
	}
	return b.String()
}

// consumerConfig is the durable consumer as jetsink wants it, with meta as
// its metadata.
func (c *Consumer) consumerConfig(meta map[string]string) jetstream.ConsumerConfig {
	cfg := &c.cfg
	return jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: cfg.maxAckPending(),
		FilterSubject: cfg.FilterSubject,
		Metadata:      meta,
	}
}

// currentMeta reads the consumer's metadata as the server has it now
// (nil, nil when there is no consumer yet), without the keys the server
// sets itself ("_nats." ...).
func (c *Consumer) currentMeta(ctx context.Context) (map[string]string, error) {
	cons, err := c.js.Consumer(ctx, c.cfg.Stream, c.cfg.Consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up consumer %s on stream %s: %w", c.cfg.Consumer, c.cfg.Stream, err)
	}
	meta := map[string]string{}
	for k, v := range cons.CachedInfo().Config.Metadata {
		if !strings.HasPrefix(k, "_nats.") {
			meta[k] = v
		}
	}
	return meta, nil
}

// mergeMeta is meta (read from the server) with this process's record laid
// over it: entries another instance recorded stay, except resolved (which
// this process has just dead-lettered or found gone). Lock held.
func (s *stranded) mergeMeta(meta map[string]string, resolved uint64) map[string]string {
	if meta == nil {
		meta = map[string]string{}
	}
	rec := map[uint64]uint64{}
	stream := s.stream
	if t, err := time.Parse(time.RFC3339Nano, meta[strandedStreamKey]); err == nil && (t.Equal(stream) || t.IsZero() || stream.IsZero()) {
		rec, _ = parseRecord(meta[strandedKey])
		if stream.IsZero() {
			stream = t
		}
	}
	delete(rec, resolved)
	for seq, dc := range s.seqs {
		if len(rec) >= strandedMax {
			break
		}
		rec[seq] = dc
	}
	delete(meta, strandedKey)
	delete(meta, strandedStreamKey)
	if len(rec) > 0 {
		meta[strandedKey] = formatRecord(rec)
		meta[strandedStreamKey] = stream.UTC().Format(time.RFC3339Nano)
	}
	if len(meta) == 0 {
		return nil
	}
	return meta
}

// ensureConsumer creates or updates the durable pull consumer and publishes
// its handle for Run and Lag. It keeps the consumer's metadata as the
// server has it, with this process's record of max-delivered events laid
// over it.
func (c *Consumer) ensureConsumer(ctx context.Context) error {
	cfg := &c.cfg
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	meta, err := c.currentMeta(ctx)
	if err != nil {
		return err
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, cfg.Stream, c.consumerConfig(s.mergeMeta(meta, 0)))
	if err != nil {
		return fmt.Errorf("create or update consumer %s on stream %s: %w", cfg.Consumer, cfg.Stream, err)
	}
	c.cons.Store(&consumerHandle{cons})
	return nil
}

// updateMeta rewrites the consumer's metadata: as the server has it, with
// change applied and this process's record laid over it. Lock held.
func (c *Consumer) updateMeta(resolved uint64, change func(map[string]string)) error {
	ctx, cancel := context.WithTimeout(context.Background(), strandedTimeout)
	defer cancel()
	meta, err := c.currentMeta(ctx)
	if err != nil {
		return err
	}
	if meta == nil {
		return fmt.Errorf("consumer %s on stream %s: %w", c.cfg.Consumer, c.cfg.Stream, jetstream.ErrConsumerNotFound)
	}
	if change != nil {
		change(meta)
	}
	_, err = c.js.UpdateConsumer(ctx, c.cfg.Stream, c.consumerConfig(c.stranded.mergeMeta(meta, resolved)))
	return err
}

// loadStranded reads the record an earlier process left, for the stream
// created at created, and starts the retry loop for it. A record of a
// stream deleted since is dropped: those events went with it.
func (c *Consumer) loadStranded(ctx context.Context, created time.Time) error {
	meta, err := c.currentMeta(ctx)
	if err != nil || meta[strandedKey] == "" {
		return err
	}
	rec, bad := parseRecord(meta[strandedKey])
	if bad != "" {
		c.log.Error("unreadable entry in the consumer's record of max-delivered events; ignored", "key", strandedKey, "entry", bad)
	}
	// A record written while the stream could not be looked up has no
	// creation time: it is applied.
	if t, err := time.Parse(time.RFC3339Nano, meta[strandedStreamKey]); err == nil && !t.IsZero() && !t.Equal(created) {
		c.log.Error("the consumer's record of max-delivered events is for a stream since deleted; those events went with it",
			"events", formatRecord(rec), "recorded_stream_created", meta[strandedStreamKey], "stream_created", created)
		rec = nil
	}
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seqs, s.stream = rec, created
	if rec == nil {
		return c.updateMeta(0, nil) // clears the record
	}
	if len(rec) > 0 {
		c.log.Warn("resuming the dead letters of events that reached max_deliver before the last stop", "events", len(rec))
		c.startRetryLoop(0)
	}
	return nil
}

// strand adds adv's event (in the stream created at created) to the record
// and makes sure the retry loop runs.
func (c *Consumer) strand(adv maxDeliverAdvisory, created time.Time) {
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seqs == nil || !created.Equal(s.stream) {
		if len(s.seqs) > 0 {
			c.log.Error("the stream was re-created; events waiting for a max-deliver dead letter went with it", "events", formatRecord(s.seqs))
		}
		s.seqs, s.stream = map[uint64]uint64{}, created
	}
	s.seqs[adv.StreamSeq] = adv.Deliveries
	if len(s.seqs) > strandedMax {
		c.log.Error("too many events waiting for a max-deliver dead letter to record another; this one is retried in memory only",
			"stream_seq", adv.StreamSeq, "recorded", strandedMax)
	} else if err := c.updateMeta(0, nil); err != nil {
		c.log.Error("could not record the event in the consumer's metadata; it is retried in memory only", "stream_seq", adv.StreamSeq, "err", err)
	}
	c.startRetryLoop(c.mdRetry[0])
}

// startRetryLoop starts the retry loop unless it runs. Lock held.
func (c *Consumer) startRetryLoop(first time.Duration) {
	s := &c.stranded
	if s.running {
		return
	}
	s.running = true
	s.loop.Add(1)
	go func() {
		defer s.loop.Done()
		c.retryStranded(first)
	}()
}

// retryStranded dead-letters the events of the record, backing off from
// mdRetry[0] to mdRetry[1] between rounds, until none is left or the
// connection closes or drains (the record stays for the next start).
func (c *Consumer) retryStranded(delay time.Duration) {
	s := &c.stranded
	for attempt := 1; ; attempt++ {
		if delay > 0 && (c.stopping() || !c.sleepUnlessStopping(delay)) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.running = false
			c.log.Error("events that reached nats.max_deliver could not be dead-lettered before jetsink stopped; they stay in the stream at these sequences, "+
				"recorded in the consumer's metadata for the next start", "events", formatRecord(s.seqs))
			return
		}
		delay = max(delay, c.mdRetry[0])
		s.mu.Lock()
		todo := maps.Clone(s.seqs)
		created := s.stream
		s.mu.Unlock()
		for _, seq := range slices.Sorted(maps.Keys(todo)) {
			adv := maxDeliverAdvisory{Stream: c.cfg.Stream, Consumer: c.cfg.Consumer, StreamSeq: seq, Deliveries: todo[seq]}
			done, err := c.tryMaxDelivered(adv, created)
			if done {
				c.resolve(adv, created)
				continue
			}
			c.log.Error("event reached nats.max_deliver and could not be dead-lettered yet; retrying",
				"stream_seq", seq, "attempts", attempt, "retry_in", delay, "err", err)
		}
		s.mu.Lock()
		if len(s.seqs) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		delay = min(2*delay, c.mdRetry[1])
	}
}

// resolve takes adv's event off the record once its dead letter is stored
// or the event is gone.
func (c *Consumer) resolve(adv maxDeliverAdvisory, created time.Time) {
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	if !created.Equal(s.stream) {
		return
	}
	delete(s.seqs, adv.StreamSeq)
	if err := c.updateMeta(adv.StreamSeq, nil); err != nil {
		c.log.Warn("could not clear the event from the consumer's record of max-delivered events; the next start dead-letters it again (stored once if within the dead-letter stream's duplicate window)",
			"stream_seq", adv.StreamSeq, "err", err)
	}
}

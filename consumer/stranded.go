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

// strandedKey is the durable consumer's metadata key under which jetsink
// records the events that reached max_deliver and are not dead-lettered
// yet, as "<stream_seq>:<deliveries>:<stream created>" separated by commas,
// where the last part is the stream's creation time in Unix nanoseconds
// (0: not known yet), so that an entry is never applied to a stream
// re-created since. JetStream will not deliver such an event again and
// sends its advisory once, so this record is what lets a restarted jetsink
// finish the dead letter. It lives in the server with the consumer;
// updating it needs no permission beyond creating the consumer.
const strandedKey = "jetsink_max_deliver_pending"

// strandedMax bounds the record (~64 KB, under the server's 128 KB for
// metadata). Past it, an event is retried in memory only, and an ERROR
// line says so.
const strandedMax = 1000

// strandedTimeout bounds one read or update of the record.
const strandedTimeout = 10 * time.Second

// strandedEntry is one event of the record.
type strandedEntry struct {
	deliveries uint64
	stream     int64 // the stream's creation time, Unix ns; 0 not known yet
}

// stranded is this process's part of the record: the events it is
// retrying. mu guards it and serialises the consumer updates.
type stranded struct {
	mu      sync.Mutex
	seqs    map[uint64]strandedEntry // by stream sequence
	running bool                     // the retry loop is running
	closing bool                     // Close has begun: start no loop
	loop    sync.WaitGroup           // the retry loop, which Close waits for
}

// parseRecord reads a strandedKey value; bad is an entry it could not read.
func parseRecord(v string) (rec map[uint64]strandedEntry, bad string) {
	rec = map[uint64]strandedEntry{}
	for _, e := range strings.Split(v, ",") {
		if e == "" {
			continue
		}
		parts := strings.Split(e, ":")
		var n [3]uint64
		ok := len(parts) == 3
		for i := 0; ok && i < 3; i++ {
			var err error
			n[i], err = strconv.ParseUint(parts[i], 10, 64)
			ok = err == nil
		}
		if !ok || n[0] == 0 {
			bad = e
			continue
		}
		rec[n[0]] = strandedEntry{deliveries: n[1], stream: int64(n[2])}
	}
	return rec, bad
}

func formatRecord(rec map[uint64]strandedEntry) string {
	var b strings.Builder
	for _, seq := range slices.Sorted(maps.Keys(rec)) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		e := rec[seq]
		fmt.Fprintf(&b, "%d:%d:%d", seq, e.deliveries, e.stream)
	}
	return b.String()
}

// consumerConfig is the durable consumer as jetsink wants it, with meta as
// its metadata. Its MaxDeliver is one more than nats.max_deliver
// (serverMaxDeliver); the server accepts that change on an existing
// consumer, so a durable made before with MaxDeliver = nats.max_deliver is
// updated by ensureConsumer.
func (c *Consumer) consumerConfig(meta map[string]string) jetstream.ConsumerConfig {
	cfg := &c.cfg
	return jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.serverMaxDeliver(),
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

// mergeMeta is meta (read from the server) with this process's entries laid
// over the record and resolved (which this process has just dead-lettered
// or found gone; 0 for none) taken off it. Entries other instances recorded
// stay. Lock held.
func (c *Consumer) mergeMeta(meta map[string]string, resolved uint64) map[string]string {
	if meta == nil {
		meta = map[string]string{}
	}
	rec, _ := parseRecord(meta[strandedKey])
	delete(rec, resolved)
	for seq, e := range c.stranded.seqs {
		if _, ok := rec[seq]; !ok && len(rec) >= strandedMax {
			c.log.Error("the consumer's record of max-delivered events is full; this event is retried in memory only", "stream_seq", seq)
			continue
		}
		rec[seq] = e
	}
	delete(meta, strandedKey)
	if len(rec) > 0 {
		meta[strandedKey] = formatRecord(rec)
	}
	if len(meta) == 0 {
		return nil
	}
	return meta
}

// ensureConsumer creates or updates the durable pull consumer and publishes
// its handle for Run and Lag. It keeps the consumer's metadata as the
// server has it, with this process's record laid over it.
func (c *Consumer) ensureConsumer(ctx context.Context) error {
	cfg := &c.cfg
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	meta, err := c.currentMeta(ctx)
	if err != nil {
		return err
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, cfg.Stream, c.consumerConfig(c.mergeMeta(meta, 0)))
	if err != nil {
		return fmt.Errorf("create or update consumer %s on stream %s: %w", cfg.Consumer, cfg.Stream, err)
	}
	c.cons.Store(&consumerHandle{cons})
	return nil
}

// updateMeta rewrites the consumer's metadata: as the server has it, with
// change applied, this process's entries laid over the record and resolved
// taken off it. Lock held.
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
	_, err = c.js.UpdateConsumer(ctx, c.cfg.Stream, c.consumerConfig(c.mergeMeta(meta, resolved)))
	return err
}

// loadStranded takes over the record earlier processes left, for the
// stream created at created, and starts the retry loop for it. Entries of
// a stream deleted since are dropped from the record: those events went
// with it. New calls it before it subscribes to the advisories.
func (c *Consumer) loadStranded(ctx context.Context, created time.Time) {
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	meta, err := c.currentMeta(ctx)
	if err != nil {
		c.log.Error("could not read the consumer's record of max-delivered events; it is resumed at the next start", "err", err)
		return
	}
	rec, bad := parseRecord(meta[strandedKey])
	if bad != "" {
		c.log.Error("unreadable entry in the consumer's record of max-delivered events; ignored", "key", strandedKey, "entry", bad)
	}
	var gone []uint64
	for seq, e := range rec {
		if e.stream != 0 && e.stream != created.UnixNano() {
			gone = append(gone, seq)
			continue
		}
		if _, ok := s.seqs[seq]; !ok {
			if s.seqs == nil {
				s.seqs = map[uint64]strandedEntry{}
			}
			s.seqs[seq] = e
		}
	}
	if len(gone) > 0 {
		slices.Sort(gone)
		c.log.Error("the consumer's record of max-delivered events names events of a stream since deleted; those events went with it",
			"stream_seqs", gone, "stream_created", created)
		err := c.updateMeta(0, func(meta map[string]string) {
			rec, _ := parseRecord(meta[strandedKey])
			for _, seq := range gone {
				if e, ok := rec[seq]; ok && e.stream != 0 && e.stream != created.UnixNano() {
					delete(rec, seq)
				}
			}
			meta[strandedKey] = formatRecord(rec)
		})
		if err != nil {
			c.log.Warn("could not drop them from the record; the next start tries again", "err", err)
		}
	}
	if len(s.seqs) > 0 {
		c.log.Warn("resuming the dead letters of events that reached max_deliver before the last stop", "events", len(s.seqs))
		c.startRetryLoop(0)
	}
}

// strand adds adv's event (in the stream created at created; zero if that
// could not be looked up) to the record and makes sure the retry loop runs.
func (c *Consumer) strand(adv maxDeliverAdvisory, created time.Time) {
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seqs == nil {
		s.seqs = map[uint64]strandedEntry{}
	}
	e := strandedEntry{deliveries: adv.Deliveries}
	if !created.IsZero() {
		e.stream = created.UnixNano()
	}
	s.seqs[adv.StreamSeq] = e
	if err := c.updateMeta(0, nil); err != nil {
		c.log.Error("could not record the event in the consumer's metadata; it is retried in memory only", "stream_seq", adv.StreamSeq, "err", err)
	}
	c.startRetryLoop(c.mdRetry[0])
}

// startRetryLoop starts the retry loop unless it runs or Close has begun.
// Lock held.
func (c *Consumer) startRetryLoop(first time.Duration) {
	s := &c.stranded
	if s.running || s.closing {
		return
	}
	s.running = true
	s.loop.Add(1)
	go func() {
		defer s.loop.Done()
		c.retryStranded(first)
	}()
}

// stopRetrying makes startRetryLoop a no-op and waits for the loop, which
// ends once the connection closes or drains.
func (s *stranded) stopRetrying() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.loop.Wait()
}

// retryStranded dead-letters this process's entries of the record, backing
// off from mdRetry[0] to mdRetry[1] between rounds, until none is left or
// the connection closes or drains (the record stays for the next start).
func (c *Consumer) retryStranded(delay time.Duration) {
	s := &c.stranded
	for attempt := 1; ; attempt++ {
		if delay > 0 && (c.stopping() || !c.sleepUnlessStopping(delay)) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.running = false
			c.log.Error("events that reached nats.max_deliver could not be dead-lettered before jetsink stopped; they stay in the stream at these sequences, "+
				"and the next start resumes those the consumer's metadata recorded", "events", formatRecord(s.seqs))
			return
		}
		delay = max(delay, c.mdRetry[0])
		s.mu.Lock()
		todo := maps.Clone(s.seqs)
		s.mu.Unlock()
		for _, seq := range slices.Sorted(maps.Keys(todo)) {
			e := todo[seq]
			adv := maxDeliverAdvisory{Stream: c.cfg.Stream, Consumer: c.cfg.Consumer, StreamSeq: seq, Deliveries: e.deliveries}
			var in time.Time
			if e.stream != 0 {
				in = time.Unix(0, e.stream)
			}
			done, created, err := c.deadLetterMaxDelivered(adv, in)
			if done {
				c.resolve(seq, e)
				continue
			}
			if e.stream == 0 && !created.IsZero() {
				c.tag(seq, created) // its stream, as first seen
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

// tag sets the stream of an entry recorded without one (memory only; the
// next write records it).
func (c *Consumer) tag(seq uint64, created time.Time) {
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.seqs[seq]; ok && e.stream == 0 {
		e.stream = created.UnixNano()
		s.seqs[seq] = e
	}
}

// resolve takes an entry off the record once its dead letter is stored or
// the event is gone, unless it was replaced meanwhile.
func (c *Consumer) resolve(seq uint64, was strandedEntry) {
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.seqs[seq]; !ok || e.deliveries != was.deliveries || (was.stream != 0 && e.stream != was.stream) {
		return // recorded again meanwhile
	}
	delete(s.seqs, seq)
	if err := c.updateMeta(seq, nil); err != nil {
		c.log.Warn("could not clear the event from the consumer's record of max-delivered events; the next start dead-letters it again (stored once if within the dead-letter stream's duplicate window)",
			"stream_seq", seq, "err", err)
	}
}

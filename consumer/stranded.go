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
// yet, as "<stream_seq>:<deliveries>" separated by commas. JetStream will
// not deliver such an event again and sends its advisory once, so this
// record is what lets a restarted jetsink finish the dead letter: New
// reads it and resumes each. The record lives in the server with the
// consumer; updating it needs no permission beyond creating the consumer.
const strandedKey = "jetsink_max_deliver_pending"

// strandedMax bounds the record. Past it, an event is retried in memory
// only, as before the record existed, and an ERROR line says so.
const strandedMax = 1000

// strandedTimeout bounds one update of the record.
const strandedTimeout = 10 * time.Second

// stranded is the record and the consumer's other metadata, guarded by mu,
// which also serialises the consumer updates that carry it.
type stranded struct {
	mu     sync.Mutex
	loaded bool              // the existing consumer's metadata was read (New)
	meta   map[string]string // the consumer's metadata other than strandedKey
	seqs   map[uint64]uint64 // stream sequence -> deliveries
	resume sync.WaitGroup    // the goroutine New starts to resume the record
}

// load reads the record and the other metadata keys of the existing
// consumer, if any. Keys the server sets itself ("_nats." ...) are left to
// it. Lock held.
func (s *stranded) load(cfg *jetstream.ConsumerConfig) (bad string) {
	s.meta = map[string]string{}
	s.seqs = map[uint64]uint64{}
	if cfg == nil {
		return ""
	}
	for k, v := range cfg.Metadata {
		if !strings.HasPrefix(k, "_nats.") && k != strandedKey {
			s.meta[k] = v
		}
	}
	for _, e := range strings.Split(cfg.Metadata[strandedKey], ",") {
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
		s.seqs[sn] = dn
	}
	return bad
}

// metadata is what the consumer's metadata should be now. Lock held.
func (s *stranded) metadata() map[string]string {
	if len(s.meta) == 0 && len(s.seqs) == 0 {
		return nil
	}
	m := maps.Clone(s.meta)
	if m == nil {
		m = map[string]string{}
	}
	if len(s.seqs) > 0 {
		var b strings.Builder
		for _, seq := range slices.Sorted(maps.Keys(s.seqs)) {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatUint(seq, 10))
			b.WriteByte(':')
			b.WriteString(strconv.FormatUint(s.seqs[seq], 10))
		}
		m[strandedKey] = b.String()
	}
	return m
}

// consumerConfig is the durable consumer as jetsink wants it, carrying the
// record. Lock held.
func (c *Consumer) consumerConfig() jetstream.ConsumerConfig {
	cfg := &c.cfg
	return jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: cfg.maxAckPending(),
		FilterSubject: cfg.FilterSubject,
		Metadata:      c.stranded.metadata(),
	}
}

// ensureConsumer creates or updates the durable pull consumer and publishes
// its handle for Run and Lag. The first time (New) it reads the record of
// an existing consumer; later it writes back what this process holds.
func (c *Consumer) ensureConsumer(ctx context.Context) error {
	cfg := &c.cfg
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.loaded {
		var old *jetstream.ConsumerConfig
		cons, err := c.js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		switch {
		case err == nil:
			old = &cons.CachedInfo().Config
		case !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound):
			return fmt.Errorf("look up consumer %s on stream %s: %w", cfg.Consumer, cfg.Stream, err)
		}
		if bad := s.load(old); bad != "" {
			c.log.Error("unreadable entry in the consumer's record of max-delivered events; ignored", "key", strandedKey, "entry", bad)
		}
		s.loaded = true
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, cfg.Stream, c.consumerConfig())
	if err != nil {
		return fmt.Errorf("create or update consumer %s on stream %s: %w", cfg.Consumer, cfg.Stream, err)
	}
	c.cons.Store(&consumerHandle{cons})
	return nil
}

// record adds (add) or removes an event of the record and writes it to the
// consumer. It reports whether the event is in the written record.
func (c *Consumer) record(adv maxDeliverAdvisory, add bool) bool {
	s := &c.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	_, had := s.seqs[adv.StreamSeq]
	switch {
	case add && had, !add && !had:
		return had
	case add && len(s.seqs) >= strandedMax:
		c.log.Error("too many events waiting for a max-deliver dead letter to record another; this one is retried in memory only",
			"stream_seq", adv.StreamSeq, "recorded", len(s.seqs))
		return false
	case add:
		s.seqs[adv.StreamSeq] = adv.Deliveries
	default:
		delete(s.seqs, adv.StreamSeq)
	}
	ctx, cancel := context.WithTimeout(context.Background(), strandedTimeout)
	defer cancel()
	if _, err := c.js.UpdateConsumer(ctx, c.cfg.Stream, c.consumerConfig()); err != nil {
		c.log.Error("could not update the consumer's record of max-delivered events", "stream_seq", adv.StreamSeq, "add", add, "err", err)
		if add {
			delete(s.seqs, adv.StreamSeq) // not recorded: the next attempt tries again
		}
		return false
	}
	return add
}

// resumeStranded dead-letters, one after the other, the events of the
// record New read: an earlier process stopped before it could. It runs on
// its own goroutine, which Close waits for.
func (c *Consumer) resumeStranded() {
	s := &c.stranded
	s.mu.Lock()
	var advs []maxDeliverAdvisory
	for _, seq := range slices.Sorted(maps.Keys(s.seqs)) {
		advs = append(advs, maxDeliverAdvisory{Stream: c.cfg.Stream, Consumer: c.cfg.Consumer, StreamSeq: seq, Deliveries: s.seqs[seq]})
	}
	s.mu.Unlock()
	if len(advs) == 0 {
		return
	}
	c.log.Warn("resuming the dead letters of events that reached max_deliver before the last stop", "events", len(advs))
	s.resume.Add(1)
	go func() {
		defer s.resume.Done()
		for _, adv := range advs {
			if !c.deadLetterMaxDelivered(adv, true) {
				return // stopping
			}
		}
	}()
}

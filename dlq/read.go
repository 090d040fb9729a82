package dlq

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

const (
	fetchBytes     = 8 << 20 // a fetch's bytes, at least (see maxFetchBytes)
	makeAttempts   = 3       // consumer creations per fetch
	makeBackoff    = time.Second
	dropTimeout    = 2 * time.Second // bounds deleting a fetch's consumer
	readerInactive = 5 * time.Minute // the server removes a consumer left behind after this
)

// reader reads a stream in order the way jetstream's ordered consumer does
// for Fetch: each fetch makes a new ephemeral consumer, without acks, that
// starts after the last message read. Unlike the ordered consumer, which
// makes its consumers under timeouts of its own (10 s, tried three times,
// whatever the Fetch context says) and deletes them from goroutines of its
// own, reader does both under the caller's context, so that ending it ends
// a fetch at once however NATS behaves.
type reader struct {
	js       jetstream.JetStream
	stream   string
	cfg      jetstream.ConsumerConfig // the first consumer's: where reading starts
	cons     jetstream.Consumer       // the current fetch's consumer, nil when none
	maxBytes int                      // what one fetch may bring (maxFetchBytes)
}

// maxFetchBytes bounds what one fetch brings, and so what it holds in
// memory: fetchBytes, or, on a server whose max_payload is larger, one
// message of that size and its subjects and headers (a message that does
// not fit a fetch's bytes would never come).
func maxFetchBytes(js jetstream.JetStream) int {
	if nc := js.Conn(); nc != nil {
		return max(fetchBytes, int(nc.MaxPayload())+8<<10)
	}
	return fetchBytes
}

// newReader reads stream, only subject's messages if subject is not "".
func newReader(js jetstream.JetStream, stream, subject string, deliver jetstream.DeliverPolicy, startSeq uint64, startTime *time.Time) *reader {
	return &reader{js: js, stream: stream, maxBytes: maxFetchBytes(js), cfg: jetstream.ConsumerConfig{
		FilterSubject:     subject,
		DeliverPolicy:     deliver,
		OptStartSeq:       startSeq,
		OptStartTime:      startTime,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: readerInactive,
		Replicas:          1,
		MemoryStorage:     true,
	}}
}

// fetch makes a consumer that starts after the stream sequence after (where
// the reader's config says when after is 0) and fetches up to
// n messages, and r.maxBytes, from it, all under ctx. A failed creation is retried a few
// times while ctx lasts. Call drop when done with the batch.
//
// A server that refuses the connection's user the creation answers
// nothing (it tells the connection): the request runs out of time, and
// fetch returns an error wrapping nats.ErrPermissionViolation that names
// the subject to allow, not tried again, rather than a fetch that brought
// nothing.
func (r *reader) fetch(ctx context.Context, after uint64, n int) (jetstream.MessageBatch, error) {
	cfg := r.cfg
	if after != 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartSequencePolicy, after+1, nil
	}
	backoff := makeBackoff
	for attempt := 1; ; attempt++ {
		before := lastError(r.js)
		c, err := r.js.CreateConsumer(ctx, r.stream, cfg)
		if err == nil {
			r.cons = c
			break
		}
		// The subject goes on with the consumer's name and filter.
		if named, perm := refusedUnder(r.js, api(r.js)+"CONSUMER.CREATE."+r.stream+".", before); perm != nil {
			return nil, fmt.Errorf("make a consumer to read %s: %w (allow the user to publish to %s>)", r.stream, perm, named)
		}
		if attempt == makeAttempts || ctx.Err() != nil {
			return nil, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		backoff *= 2
	}
	return r.cons.Fetch(n, jetstream.FetchContext(ctx), jetstream.FetchMaxBytes(r.maxBytes))
}

// drop deletes the current consumer, if any, under ctx (bounded by
// dropTimeout) and forgets it. A consumer it fails to delete, or does not
// try to once ctx has ended, the server removes after readerInactive; so
// does one the server made after fetch's creation request had timed out
// on this side (fetch never learnt its name).
func (r *reader) drop(ctx context.Context) {
	if r.cons == nil {
		return
	}
	name := r.cons.CachedInfo().Name
	r.cons = nil
	if ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, dropTimeout)
	defer cancel()
	_ = r.js.DeleteConsumer(ctx, r.stream, name)
}

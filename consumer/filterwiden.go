package consumer

import (
	"context"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// filterTakesMore reports whether filter want ("" for every subject)
// takes subjects that cc's filter (FilterSubject, or FilterSubjects; none
// for every subject) leaves out: a widening or a move. The durable keeps
// its place in the stream through the change, so the events on those
// subjects before that place are never delivered. A pure narrowing
// (every subject of want within one of cc's filters) skips nothing.
func filterTakesMore(cc *jetstream.ConsumerConfig, want string) bool {
	old := cc.FilterSubjects
	if len(old) == 0 {
		old = []string{cc.FilterSubject}
	}
	for _, f := range old {
		if f == "" || (want != "" && subjectWithin(want, f)) {
			return false
		}
	}
	return true
}

// widenedFilterSteps says, for cfg's durable, which keeps its place in the
// stream through a change of filter that takes subjects the old one left
// out (filterTakesMore), how to have the events of those subjects that
// lie before that place delivered: they may lie anywhere before it, so
// the durable is made again from the first of them wanted, firstSeq the
// stream's first sequence (0: not known), with remakeStepsFor; the old
// filter's events from there on are delivered again, stored again in
// at-least-once mode (cfg.StoredSeq nil), skipped in exactly-once mode.
// interest is whether the stream has interest retention (holdFirst).
func widenedFilterSteps(cfg *Config, interest bool, firstSeq uint64) string {
	past := "the sequence just before the stream's first event"
	if firstSeq == 0 {
		firstSeq = 1 // a start below the stream's first starts at it
		past = "the start of the stream"
	}
	again := "in at-least-once mode, this jetsink's, the old filter's events are stored again"
	if cfg.StoredSeq != nil {
		again = "in exactly-once mode, this jetsink's, the old filter's events are skipped as already stored"
	}
	return "to have them delivered (they may lie anywhere before that place), " + remakeStepsFor(cfg, interest, past, firstSeq-1) +
		": " + again + "; to start later, at the first event of the new subjects wanted, give --deliver that event's stream sequence"
}

// widenedFilterPlace is the log keys of ci's place in the stream, which
// the durable keeps through a change of filter: the last stream sequence
// delivered and the ack floor's.
func widenedFilterPlace(ci *jetstream.ConsumerInfo) []any {
	return []any{"delivered_stream_seq", ci.Delivered.Stream, "ack_floor_stream_seq", ci.AckFloor.Stream}
}

// streamFirstSeq is the event stream's first sequence now, 0 when the look
// fails (widenedFilterSteps then says the start of the stream).
func (c *Consumer) streamFirstSeq(ctx context.Context) uint64 {
	ctx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	stream, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return 0
	}
	return stream.CachedInfo().State.FirstSeq
}

// placeText is ci's place in the stream, for check's words.
func placeText(ci *jetstream.ConsumerInfo) string {
	return "last delivered stream sequence " + strconv.FormatUint(ci.Delivered.Stream, 10) +
		", ack floor stream sequence " + strconv.FormatUint(ci.AckFloor.Stream, 10)
}

package dlq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

const (
	// roomMargin: while the last reading of an event stream that discards
	// old messages left room for fewer than this many letters (of the
	// size of the one at hand), its state and its reader's ack floor are
	// read again before each letter, since its publishers fill it too;
	// with more room, a reading serves for this many letters, or roomAge.
	roomMargin = fetchBatch
	roomAge    = time.Second
	// storeOverhead is what a stream's store adds to a message's subject,
	// encoded headers and body, which are what max_bytes counts with it:
	// nats-server's file store writes the record's length (4), sequence
	// (8), timestamp (8), subject length (2), header length (4) and a hash
	// (8); its memory store adds 16, less.
	storeOverhead = 34
)

// discardsOld describes cfg's max_msgs and max_bytes if the stream, once
// at one of them, drops its oldest messages to store a new one (discard
// old), else "". With discard new it refuses the new one instead, and a
// replayed letter refused stays.
func discardsOld(cfg *jetstream.StreamConfig) string {
	if cfg.Discard != jetstream.DiscardOld {
		return ""
	}
	var limits []string
	if cfg.MaxMsgs > 0 {
		limits = append(limits, fmt.Sprintf("max_msgs %d", cfg.MaxMsgs))
	}
	if cfg.MaxBytes > 0 {
		limits = append(limits, fmt.Sprintf("max_bytes %d", cfg.MaxBytes))
	}
	if len(limits) == 0 {
		return ""
	}
	return strings.Join(limits, ", ") + ", discard old"
}

// storedSize estimates the bytes l's replayed event takes in its stream,
// as max_bytes counts them: its subject, encoded headers and body, plus
// storeOverhead.
func storedSize(l *Letter) int64 {
	return int64(l.Msg().Size()) + storeOverhead
}

// room is what Replay may still publish into one event stream that
// discards its oldest messages (see discardsOld) without pushing out one
// the stream's reader has not acked: the messages after the reader's ack
// floor stay, and max_msgs (max_bytes) less them is the room. The reader
// is Options.Consumer, or else the consumer the letters name
// (Jetsink-Consumer) if it is on the stream; without one (letters of two
// consumers, or of none, or one the stream does not have) no message may
// be pushed out at all.
type room struct {
	stream            jetstream.Stream
	limits            string // discardsOld's words
	maxMsgs, maxBytes int64  // 0: no limit
	// looked: the reader was looked up, for the consumer named (by
	// Options.Consumer or the first letter); reader is "" when it is not
	// known (not on the stream, or a letter named another since).
	looked      bool
	named       string
	reader      string
	cons        jetstream.Consumer
	msgs, bytes int64     // room left by the last reading, less the letters replayed since
	taken       int       // letters replayed since the reading
	at          time.Time // of the reading; zero: none yet
	held, heldB int64     // what the stream held at the reading
	unread      int64     // of which after the reader's ack floor (all of it without a reader)
	unreadB     int64
	floor       uint64
	dry, dryB   int64 // in a dry run, the letters that would have been replayed, and their bytes
	dryRun      bool
}

// room returns nil if l's event stream has room for l's replayed event
// (see room; nil too for a stream that does not discard old messages, and
// with Options.AllowDiscardOld). It returns an error wrapping ErrNoReader
// when publishing it would push out a message the stream's reader has not
// acked, or ErrPublish when the stream's state cannot be read within wait
// (asked again for the next letter); either way the letter stays. Called
// after window, which reads the stream's config. A replayed letter (or,
// in a dry run, one that would be) is taken from the room with take.
func (r *readers) room(ctx context.Context, l *Letter, wait time.Duration) error {
	so := r.windows[l.Stream]
	rm := so.room
	if rm == nil || r.discardOld {
		return nil
	}
	r.lookReader(ctx, l, rm, wait)
	need := storedSize(l)
	if rm.at.IsZero() || rm.taken >= roomMargin || time.Since(rm.at) >= roomAge ||
		rm.msgs < roomMargin && rm.maxMsgs > 0 || rm.bytes < roomMargin*need && rm.maxBytes > 0 {
		if err := rm.read(ctx, wait); err != nil {
			return fmt.Errorf("%w: dead letter %d to %s not re-published: could not read the state of stream %s, the letter's Jetsink-Stream, "+
				"or its reader's ack floor, which say whether the event would push out one not read yet (%s): %w; it stays",
				ErrPublish, l.Seq, l.Subject, l.Stream, rm.limits, err)
		}
	}
	var full string
	known := rm.reader != ""
	switch {
	case rm.maxMsgs > 0 && rm.msgs < 1 && known:
		full = fmt.Sprintf("it held %d messages, %d of them after consumer %s's ack floor (stream sequence %d), not read yet",
			rm.held, rm.unread, rm.reader, rm.floor)
	case rm.maxMsgs > 0 && rm.msgs < 1:
		full = fmt.Sprintf("it held %d messages", rm.held)
	case rm.maxBytes > 0 && rm.bytes < need && known:
		full = fmt.Sprintf("it held %d bytes, about %d of them in the %d messages after consumer %s's ack floor (stream sequence %d), not read yet, "+
			"and the event takes about %d", rm.heldB, rm.unreadB, rm.unread, rm.reader, rm.floor, need)
	case rm.maxBytes > 0 && rm.bytes < need:
		full = fmt.Sprintf("it held %d bytes, and the event takes about %d", rm.heldB, need)
	default:
		return nil
	}
	if rm.taken > 0 {
		full += fmt.Sprintf(", and %d letters were replayed into it since (or would be, in a dry run)", rm.taken)
	}
	if !known {
		full += "; its reader is not known (no Options.Consumer, and the letters name no consumer of the stream), so no message may be pushed out"
	}
	return fmt.Errorf("dead letter %d to %s: %w: stream %s, the letter's Jetsink-Stream, drops its oldest messages to store new ones (%s), "+
		"and has no room: %s; the replayed event would push out one jetsink has not read, while its letter is deleted. "+
		"It stays (replay again once jetsink has read the stream, or raise the limit; or replay into it all the same with --allow-discard-old)",
		l.Seq, l.Subject, ErrNoReader, l.Stream, rm.limits, full)
}

// lookReader sets rm's reader for l, looking it up on first use:
// Options.Consumer (check looked it up already), or else l's
// Jetsink-Consumer if the stream has it. A letter that names another
// consumer than the first leaves no reader known from then on: room for
// one may not be room for the other.
func (r *readers) lookReader(ctx context.Context, l *Letter, rm *room, wait time.Duration) {
	name := r.name
	if name == "" {
		name = l.Consumer
	}
	if !rm.looked {
		rm.looked, rm.named = true, name
		if name == "" {
			return
		}
		lctx, cancel := context.WithTimeout(ctx, wait)
		c, err := r.js.Consumer(lctx, l.Stream, name)
		cancel()
		if err == nil { // else not on the stream, or a lookup refused or unanswered: no reader, the conservative room
			rm.reader, rm.cons = name, c
		}
		return
	}
	if name != rm.named && rm.reader != "" {
		rm.reader, rm.cons, rm.at = "", nil, time.Time{}
	}
}

// read reads the stream's state and its reader's ack floor, and sets the
// room from them.
func (rm *room) read(ctx context.Context, wait time.Duration) error {
	sctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	si, err := rm.stream.Info(sctx)
	if err != nil {
		return err
	}
	st := si.State
	held, heldBytes := int64(st.Msgs), int64(st.Bytes)
	unread, unreadBytes := held, heldBytes
	var floor uint64
	if rm.cons != nil {
		ci, err := rm.cons.Info(sctx)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			rm.reader, rm.cons = "", nil // deleted meanwhile: no reader
		} else if err != nil {
			return err
		}
		if ci != nil && rm.cons != nil {
			// The messages after the floor: at most every sequence
			// after it (fewer with messages deleted among them). Their
			// bytes are not known: an average message's each, all the
			// stream's bytes when all are after it.
			floor = ci.AckFloor.Stream
			after := int64(0)
			if from := max(floor, st.FirstSeq-1); st.LastSeq > from {
				after = int64(min(st.LastSeq-from, st.Msgs))
			}
			unread, unreadBytes = after, 0
			if after > 0 {
				unreadBytes = min(heldBytes, (heldBytes+held-1)/held*after) // the average rounded up
			}
		}
	}
	rm.held, rm.heldB, rm.unread, rm.unreadB, rm.floor = held, heldBytes, unread, unreadBytes, floor
	// A dry run stored nothing: what it would have stands in.
	rm.msgs, rm.bytes = rm.maxMsgs-unread-rm.dry, rm.maxBytes-unreadBytes-rm.dryB
	rm.taken, rm.at = 0, time.Now()
	return nil
}

// take counts l's replayed event against the room of its stream.
func (r *readers) take(l *Letter) {
	if rm := r.windows[l.Stream].room; rm != nil {
		n := storedSize(l)
		rm.msgs--
		rm.bytes -= n
		rm.taken++
		if rm.dryRun {
			rm.dry++
			rm.dryB += n
		}
	}
}

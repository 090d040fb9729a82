package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
)

const (
	// roomMargin: while the last reading of an event stream that discards
	// old messages left room for fewer than this many letters (of the
	// size of the one at hand), its state and its reader's ack floor are
	// read again before each letter, since its publishers fill it too;
	// with more room, a reading serves for this many letters, or roomAge.
	roomMargin = fetchBatch
	roomAge    = time.Second
	// sourceHash is the length of the hashes nats-server writes into a
	// Nats-Stream-Source header: of an external source's API prefix, a
	// durable source's consumer name, and the origin stream's identity.
	sourceHash = 8
	// walkCap bounds the messages one reading of a stream reads to tell
	// how many of its oldest a replayed event would push out (see walk):
	// beyond it the letter is refused.
	walkCap = 256
	// copyWindow, times the publish wait, is how long after its PubAck a
	// replayed event is counted as held by a stream that copies it from
	// its origin (room.transit): the copy is taken a little later (in a
	// cluster, later still), and a reading before it would find room
	// that the copy is to fill. A copy already in is counted twice
	// meanwhile: a letter that would fit is refused and stays.
	copyWindow = 2
)

// sent is a letter replayed into a stream that copies it from its origin:
// when, and the bytes it takes there.
type sent struct {
	at    time.Time
	bytes int64
}

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

// need is what l's replayed event takes in the stream, as max_bytes
// counts it (consumer.StoredSize): exact, but in a stream that sources others, where it
// adds an upper bound of the Nats-Stream-Source header the stream writes
// into the copy it takes from the origin (see sourceHeader): a replayed
// event reaches such a stream through the origin that captures its
// subject, and the header is tens of bytes.
func (rm *room) need(l *Letter) int64 {
	m := l.Msg()
	hdr := m.Size() - len(m.Subject) - len(m.Data) // encoded headers: nats.Msg gives only their size
	if rm.sourced > 0 {
		// The header names the subject as the origin stored it: the
		// letter's, unless the origin transforms subjects.
		hdr += rm.sourced + len(m.Subject)
	}
	return consumer.StoredSize(rm.memory, len(m.Subject), hdr, len(m.Data))
}

// sourceHeader bounds the bytes of the Nats-Stream-Source header a stream
// with sources writes into each message it takes from one of them, but
// for the subject the header names; 0 without sources. nats-server 2.15's
// genSourceHeader writes "Nats-Stream-Source: <name> <seq> <filter>
// <destination> <subject> <identity>\r\n": the name with ":<hash>" for
// an external source and ":C=<hash>" for a durable one, the seq up to 20
// digits, the filter and destination those of its subject transforms
// (joined by form feeds) or its filter_subject and ">", the identity a
// hash of the origin's creation time.
func sourceHeader(sources []*jetstream.StreamSource) int {
	longest := -1
	for _, s := range sources {
		if s == nil {
			continue
		}
		n := len(s.Name)
		if s.External != nil || s.Domain != "" {
			n += len(":") + sourceHash
		}
		if s.Consumer != nil {
			n += len(":C=") + sourceHash
		}
		filter, dest := cmp.Or(s.FilterSubject, ">"), ">"
		if len(s.SubjectTransforms) > 0 {
			var fs, ds []string
			for _, tr := range s.SubjectTransforms {
				fs, ds = append(fs, cmp.Or(tr.Source, ">")), append(ds, cmp.Or(tr.Destination, ">"))
			}
			filter, dest = strings.Join(fs, "\f"), strings.Join(ds, "\f")
		}
		longest = max(longest, n+len(filter)+len(dest))
	}
	if longest < 0 {
		return 0
	}
	const seq, spaces = 20, 5
	return len("Nats-Stream-Source: ") + longest + seq + sourceHash + spaces + len("\r\n")
}

// room is what Replay may still publish into one event stream that
// discards its oldest messages (see discardsOld) without pushing out one
// the stream's reader has not acked. max_msgs: the messages after the
// reader's ack floor stay, and max_msgs less them is the room. max_bytes:
// the stream drops its oldest messages until what it holds is under
// max_bytes again, so the room is what it lacks of max_bytes plus the
// bytes of its oldest messages up to the floor, which it reads one by one
// (walk) only as far as a letter needs (its STREAM.MSG.GET). The reader
// is Options.Consumer, or else the consumer the letters name
// (Jetsink-Consumer) if it is on the stream; without one (letters of two
// consumers, or of none, or one the stream does not have) no message may
// be pushed out at all.
type room struct {
	stream            jetstream.Stream
	js                jetstream.JetStream // the walk's requests
	name              string              // the stream's
	limits            string              // discardsOld's words
	maxMsgs, maxBytes int64               // 0: no limit
	memory            bool                // memory storage: its own bytes per message
	sourced           int                 // sourceHeader: the stream has sources
	// copied: the stream has sources or a mirror, and takes a replayed
	// event from the origin that stores it, some time after its PubAck;
	// transit holds the letters replayed within copyWindow, which a
	// reading counts as held, since its state may not show them yet.
	copied  bool
	transit []sent
	// looked: the reader was looked up, for the consumer named (by
	// Options.Consumer or the first letter); reader is "" when it is not
	// known (not on the stream, or a letter named another since), and why
	// says why, in the refusal's words.
	looked bool
	named  string
	option bool // named by Options.Consumer: nats.consumer, to a CLI user
	reader string
	why    string
	cons   jetstream.Consumer
	msgs   int64     // room in messages left by the last reading, less the letters replayed since (and those in transit)
	base   int64     // the bytes the stream held at the reading, plus the letters replayed since (or in a dry run, or in transit)
	taken  int       // letters replayed since the reading
	at     time.Time // of the reading; zero: none yet
	held   int64     // what the stream held at the reading
	heldB  int64
	unread int64 // of which after the reader's ack floor (all of it without a reader)
	floor  uint64
	last   uint64 // the stream's last sequence at the reading
	// The walk, since the reading: the oldest messages, read, from the
	// stream's first sequence up to next (excluded), hold walked bytes;
	// past is set once it met one after the floor (or none at all), and
	// capped once it read walkCap.
	next   uint64
	walked int64
	reads  int
	past   bool
	capped bool
	denied error // the server refused the user STREAM.MSG.GET: not asked again
	dry    int64 // in a dry run, the letters that would have been replayed, and their bytes
	dryB   int64
	dryRun bool
}

// room returns nil if l's event stream has room for l's replayed event
// (see room; nil too for a stream that does not discard old messages, and
// with Options.AllowDiscardOld). It returns an error wrapping ErrNoReader
// when publishing it would push out a message the stream's reader has not
// acked, or ErrPublish when the stream's state, or the sizes of its
// oldest messages, cannot be read within wait (asked again for the next
// letter); either way the letter stays. Called after window, which reads
// the stream's config. A replayed letter (or, in a dry run, one that would
// be) is taken from the room with take.
//
// The stream's state and the reader's ack floor are read for the first
// letter, and again after roomAge or roomMargin letters, and before each
// letter near the limit (the room for fewer than roomMargin letters),
// since publishers fill the stream meanwhile; but a letter the last
// reading has no room for is refused on it, without reading again, until
// roomAge has passed: once a stream is full of events not read yet, the
// letters after the first are refused at the cost of one reading a
// second, not two requests each. A refusal on a reading up to roomAge old
// keeps a letter that might have fitted (the reader acked more since):
// the letter stays, for the next replay.
func (r *readers) room(ctx context.Context, l *Letter, wait time.Duration) error {
	so := r.windows[l.Stream]
	rm := so.room
	if rm == nil || r.discardOld {
		return nil
	}
	r.lookReader(ctx, l, rm, wait)
	need := rm.need(l)
	fresh := false
	if rm.at.IsZero() || rm.taken >= roomMargin || time.Since(rm.at) >= roomAge {
		if err := rm.read(ctx, wait); err != nil {
			return rm.unreadable(l, err)
		}
		fresh = true
	}
	full, unknown, err := rm.judge(ctx, need, wait, fresh)
	if err == nil && full == "" && !fresh && (unknown || rm.near(need)) {
		if err := rm.read(ctx, wait); err != nil {
			return rm.unreadable(l, err)
		}
		full, _, err = rm.judge(ctx, need, wait, true)
	}
	if err != nil {
		return rm.unreadable(l, err)
	}
	if full == "" {
		return nil
	}
	if rm.taken > 0 {
		full += fmt.Sprintf(", and %d letters were replayed into it since (or would be, in a dry run)", rm.taken)
	}
	if rm.reader == "" {
		full += "; its reader is not known (" + rm.why + "), so no message may be pushed out"
	}
	return fmt.Errorf("dead letter %d to %s: %w: stream %s, the letter's Jetsink-Stream, drops its oldest messages to store new ones (%s), "+
		"and has no room: %s; the replayed event would push out one jetsink has not read, while its letter is deleted. "+
		"It stays (replay again once jetsink has read the stream, or raise the limit; or replay into it all the same with --allow-discard-old)",
		l.Seq, l.Subject, ErrNoReader, l.Stream, rm.limits, full)
}

// unreadable is room's error for a stream whose state, reader's ack floor
// or oldest messages could not be read.
func (rm *room) unreadable(l *Letter, err error) error {
	return fmt.Errorf("%w: dead letter %d to %s not re-published: could not read the state of stream %s, the letter's Jetsink-Stream, "+
		"its reader's ack floor or its oldest messages, which say whether the event would push out one not read yet (%s): %w; it stays",
		ErrPublish, l.Seq, l.Subject, l.Stream, rm.limits, err)
}

// near reports whether the last reading, less the letters since, leaves
// room for fewer than roomMargin letters of need bytes: the state is
// then read again before a letter is let through.
func (rm *room) near(need int64) bool {
	return rm.maxMsgs > 0 && rm.msgs < roomMargin ||
		rm.maxBytes > 0 && rm.maxBytes-rm.base+rm.walked < roomMargin*need
}

// judge tells, on the last reading, whether a replayed event of need bytes
// would push out a message not read: full says what the stream holds if
// so, "" if not. With walk it reads the stream's oldest messages as far as
// it needs to tell (see walk); without, it reads nothing and says unknown
// when it would have to.
func (rm *room) judge(ctx context.Context, need int64, wait time.Duration, walk bool) (full string, unknown bool, err error) {
	known := rm.reader != ""
	switch {
	case rm.maxMsgs > 0 && rm.msgs < 1 && known:
		return fmt.Sprintf("it held %d messages, %d of them after consumer %s's ack floor (stream sequence %d), not read yet",
			rm.held, rm.unread, rm.reader, rm.floor), false, nil
	case rm.maxMsgs > 0 && rm.msgs < 1:
		return fmt.Sprintf("it held %d messages", rm.held), false, nil
	case rm.maxBytes <= 0:
		return "", false, nil
	}
	excess := rm.base + need - rm.maxBytes // to push out
	if excess <= 0 {
		return "", false, nil
	}
	if !known {
		return fmt.Sprintf("it held %d bytes, and the event takes about %d", rm.heldB, need), false, nil
	}
	for rm.walked < excess && !rm.past && !rm.capped {
		if !walk {
			return "", true, nil
		}
		if err := rm.walk(ctx, wait); err != nil {
			return "", false, err
		}
	}
	switch {
	case rm.walked >= excess:
		return "", false, nil
	case rm.capped:
		return fmt.Sprintf("it held %d bytes, and the event takes about %d: to store it the stream would drop %d bytes of its oldest messages, "+
			"and its %d oldest, which consumer %s has read, hold %d of them; the replay reads no more to tell whether the rest were read",
			rm.heldB, need, excess, walkCap, rm.reader, rm.walked), false, nil
	case rm.walked == 0:
		return fmt.Sprintf("it held %d bytes, and the event takes about %d: to store it the stream would drop %d bytes of its oldest messages, "+
			"and the oldest is after consumer %s's ack floor (stream sequence %d), not read yet",
			rm.heldB, need, excess, rm.reader, rm.floor), false, nil
	}
	return fmt.Sprintf("it held %d bytes, and the event takes about %d: to store it the stream would drop %d bytes of its oldest messages, "+
		"and those up to consumer %s's ack floor (stream sequence %d), read, hold %d of them; the rest would be messages after the floor, not read yet",
		rm.heldB, need, excess, rm.reader, rm.floor, rm.walked), false, nil
}

// walk reads the stream's next oldest message (STREAM.MSG.GET: its raw
// headers, which the size counts as stored; a direct get adds its own),
// and adds its stored size to walked if the reader has read it, else sets
// past.
func (rm *room) walk(ctx context.Context, wait time.Duration) error {
	if rm.next > rm.floor {
		rm.past = true
		return nil
	}
	if rm.reads >= walkCap {
		rm.capped = true
		return nil
	}
	if rm.denied != nil {
		return rm.denied
	}
	nc := rm.js.Conn()
	if nc == nil {
		return errors.New("no NATS connection to read the stream's messages with")
	}
	subject := api(rm.js) + "STREAM.MSG.GET." + rm.name
	req := fmt.Sprintf(`{"seq":%d,"next_by_subj":">"}`, rm.next) // the first message at or after next
	before := lastError(rm.js)
	sctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	rm.reads++
	m, err := nc.RequestWithContext(sctx, subject, []byte(req))
	if err != nil {
		// The server answers a refused request with silence: not asked
		// again, each letter would wait for it.
		if named, denied := refusedTo(rm.js, subject, "\"", before); denied != nil {
			rm.denied = fmt.Errorf("read message %d of stream %s: %w (allow the user to publish to %s)", rm.next, rm.name, denied, named)
			return rm.denied
		}
		return fmt.Errorf("read message %d of stream %s: %w", rm.next, rm.name, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Header  []byte `json:"hdrs"` // base64, as stored
			Data    []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("read message %d of stream %s: %w", rm.next, rm.name, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		rm.past = true // none left from next on: the stream lost them since the reading
		return nil
	case resp.Error != nil:
		return fmt.Errorf("read message %d of stream %s: %w", rm.next, rm.name, resp.Error)
	case resp.Message == nil:
		return fmt.Errorf("read message %d of stream %s: %w", rm.next, rm.name, jetstream.ErrInvalidJetStreamResponse)
	}
	msg := resp.Message
	if msg.Seq > rm.floor {
		rm.past = true
		return nil
	}
	rm.walked += consumer.StoredSize(rm.memory, len(msg.Subject), len(msg.Header), len(msg.Data))
	rm.next = msg.Seq + 1
	return nil
}

// lookReader sets rm's reader for l, looking it up on first use:
// Options.Consumer (check looked it up already), or else l's
// Jetsink-Consumer if the stream has it. A letter that names another
// consumer than the first leaves no reader known from then on: room for
// one may not be room for the other.
func (r *readers) lookReader(ctx context.Context, l *Letter, rm *room, wait time.Duration) {
	if r.name != "" {
		if !rm.looked {
			rm.looked, rm.named, rm.option = true, r.name, true
			rm.reader, rm.cons = r.name, r.of[l.Stream].cons
			if rm.cons == nil { // check looks it up first: not expected
				rm.reader, rm.why = "", fmt.Sprintf("consumer %s (nats.consumer) of stream %s was not looked up", r.name, l.Stream)
			}
		}
		return
	}
	if !rm.looked {
		rm.looked, rm.named = true, l.Consumer
		if l.Consumer == "" {
			rm.why = fmt.Sprintf("dead letter %d names no consumer, no Jetsink-Consumer header: an older jetsink wrote it", l.Seq)
			return
		}
		before := lastError(r.js)
		lctx, cancel := context.WithTimeout(ctx, wait)
		c, err := r.js.Consumer(lctx, l.Stream, l.Consumer)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			rm.why = fmt.Sprintf("consumer %s, which dead letter %d names in Jetsink-Consumer, is not on stream %s", l.Consumer, l.Seq, l.Stream)
		case err != nil:
			if denied := refused(r.js, api(r.js)+"CONSUMER.INFO."+l.Stream+"."+l.Consumer, before); denied != nil {
				err = denied
			} else {
				rm.looked = false // a timeout: asked again for the next letter
			}
			rm.why = fmt.Sprintf("the info of consumer %s, which dead letter %d names in Jetsink-Consumer, could not be read: %v", l.Consumer, l.Seq, err)
		default:
			// After a lookup that timed out, the last reading was taken
			// without a reader (every message unread, floor 0): read
			// again, as when a reader is lost.
			rm.reader, rm.cons, rm.at = l.Consumer, c, time.Time{}
		}
		return
	}
	if l.Consumer != rm.named && rm.reader != "" {
		rm.reader, rm.cons, rm.at = "", nil, time.Time{}
		rm.why = fmt.Sprintf("the letters name two consumers: %s, and %q in dead letter %d", rm.named, l.Consumer, l.Seq)
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
	unread := held
	var floor uint64
	if rm.cons != nil {
		ci, err := rm.cons.Info(sctx)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			rm.reader, rm.cons = "", nil // deleted meanwhile: no reader
			rm.why = fmt.Sprintf("consumer %s is no longer on stream %s", rm.named, rm.name)
			if rm.option {
				rm.why = fmt.Sprintf("consumer %s (nats.consumer) is no longer on stream %s", rm.named, rm.name)
			}
		} else if err != nil {
			return err
		}
		if ci != nil && rm.cons != nil {
			// The messages after the floor: at most every sequence
			// after it (fewer with messages deleted among them).
			floor = ci.AckFloor.Stream
			unread = 0
			if from := max(floor, st.FirstSeq-1); st.LastSeq > from {
				unread = int64(min(st.LastSeq-from, st.Msgs))
			}
		}
	}
	rm.held, rm.heldB, rm.unread, rm.floor, rm.last = held, heldBytes, unread, floor, st.LastSeq
	// A dry run stored nothing: what it would have stands in.
	rm.msgs, rm.base = rm.maxMsgs-unread-rm.dry, heldBytes+rm.dryB
	// Letters replayed lately may not be copied into the stream yet: they
	// are counted as held, and unread, until copyWindow has passed.
	rm.transit = slices.DeleteFunc(rm.transit, func(c sent) bool { return time.Since(c.at) >= copyWindow*wait })
	for _, c := range rm.transit {
		rm.msgs--
		rm.base += c.bytes
	}
	rm.next, rm.walked, rm.reads, rm.past, rm.capped = st.FirstSeq, 0, 0, false, false
	if rm.cons != nil && unread == 0 {
		// Every message held is read: no need to walk them.
		rm.next, rm.walked = st.LastSeq+1, heldBytes
	}
	rm.taken, rm.at = 0, time.Now()
	return nil
}

// take counts l's replayed event against the room of its stream.
func (r *readers) take(l *Letter) {
	if rm := r.windows[l.Stream].room; rm != nil {
		n := rm.need(l)
		rm.msgs--
		rm.base += n
		rm.taken++
		switch {
		case rm.dryRun:
			rm.dry++
			rm.dryB += n
		case rm.copied:
			rm.transit = append(rm.transit, sent{at: time.Now(), bytes: n})
		}
	}
}

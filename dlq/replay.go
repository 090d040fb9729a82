package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
)

// Letter is one dead letter as read from the dead-letter stream.
type Letter struct {
	Seq       uint64    // sequence in the dead-letter stream
	Time      time.Time // when it was dead-lettered
	Subject   string    // original subject (Jetsink-Subject), as its stream stored it: after the stream's subject transform
	Stream    string    // original stream (Jetsink-Stream)
	StreamSeq uint64    // original stream sequence (Jetsink-Stream-Seq)
	Stage     string    // Jetsink-Stage: decode, sink or deliver
	Code      string    // Jetsink-Code
	SQLState  string    // Jetsink-SQLState, "" when none
	Reason    string    // Jetsink-Reason
	MsgID     string    // the original Nats-Msg-Id (Jetsink-Msg-Id), "" when none
	Consumer  string    // the durable consumer that gave it up (Jetsink-Consumer), "" for letters of older versions
	Header    nats.Header
	Data      []byte
}

// ReplayMsgID is the Nats-Msg-Id a replayed letter is published with:
// "<original msg id>:replay:<the dead letter's Nats-Msg-Id>", which jetsink
// writes as "<stream>:<stream seq>:<store time>:<consumer>", so that two
// dead letters of one stored event (the second written after the
// dead-letter stream's duplicate window) replay as one event; for a letter
// without one (storedEventID), "<original msg id>:replay:<dead-letter seq>".
// "<stream>:<stream seq>" stands in for a missing original id.
func (l *Letter) ReplayMsgID() string {
	orig := l.MsgID
	if orig == "" {
		orig = l.Stream + ":" + strconv.FormatUint(l.StreamSeq, 10)
	}
	if id := l.Header.Get(jetstream.MsgIDHeader); storedEventID(id, l) {
		return orig + ":replay:" + id
	}
	return orig + ":replay:" + strconv.FormatUint(l.Seq, 10)
}

// storedEventID reports whether id, l's own Nats-Msg-Id, names one stored
// event: "<stream>:<stream seq>:<store time>[:<consumer>]", as jetsink
// writes it. Older letters' "<stream>:<stream seq>" would be one id for
// two events of a stream re-created under the same name, and replaying
// the second would be dropped as a duplicate of the first's.
func storedEventID(id string, l *Letter) bool {
	rest, ok := strings.CutPrefix(id, l.Stream+":"+strconv.FormatUint(l.StreamSeq, 10)+":")
	if !ok {
		return false
	}
	ns, _, _ := strings.Cut(rest, ":")
	_, err := strconv.ParseInt(ns, 10, 64)
	return err == nil
}

// Msg is the message a replay publishes: the original subject, body and
// headers, without the Jetsink-* and Nats-* headers, with Nats-Msg-Id
// ReplayMsgID. The subject is the one stored: an event stream whose
// subject transform matches it would transform it again, and Replay
// refuses such a letter.
func (l *Letter) Msg() *nats.Msg {
	h := make(nats.Header, len(l.Header))
	for k, v := range l.Header {
		// No Nats-* header: jetsink writes none into a letter (see
		// consumer's deadLetterMsg), so one here came from the server
		// (a source's Nats-Stream-Source) or another tool, and would
		// instruct the event stream.
		if strings.HasPrefix(k, "Jetsink-") || strings.HasPrefix(k, "Nats-") {
			continue
		}
		h[k] = v
	}
	h.Set(jetstream.MsgIDHeader, l.ReplayMsgID())
	return &nats.Msg{Subject: l.Subject, Header: h, Data: l.Data}
}

// Filter selects dead letters. Zero fields select everything; set fields
// must all match.
type Filter struct {
	Codes    []string  // Jetsink-Code is one of these
	Stages   []string  // Jetsink-Stage is one of these
	Subject  string    // original subject matches this NATS pattern ('*' a token, '>' the rest)
	Since    time.Time // dead-lettered at or after
	Until    time.Time // dead-lettered before; Replay reads no further than the first letter stored at or after it
	FirstSeq uint64    // dead-letter stream sequence at least this
	LastSeq  uint64    // and at most this (0: no upper bound)
}

// Validate checks the filter; errors wrap ErrInvalidOptions. A stage must
// be one jetsink writes (decode, sink, deliver); codes are not checked (a
// dead letter of another jetsink version may carry a code this one does
// not write: UnknownCodes lists them, for a warning).
func (f Filter) Validate() error {
	if f.LastSeq != 0 && f.LastSeq < f.FirstSeq {
		return fmt.Errorf("%w: sequence range %d-%d is reversed", ErrInvalidOptions, f.FirstSeq, f.LastSeq)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return fmt.Errorf("%w: Until (--until) must be after Since (--since)", ErrInvalidOptions)
	}
	for _, st := range f.Stages {
		if st != pipeline.StageDecode && st != pipeline.StageSink && st != pipeline.StageDeliver {
			return fmt.Errorf("%w: stage %q: want %s, %s or %s", ErrInvalidOptions, st, pipeline.StageDecode, pipeline.StageSink, pipeline.StageDeliver)
		}
	}
	if f.Subject != "" {
		for i, t := range strings.Split(f.Subject, ".") {
			if t == "" || (t == ">" && i != strings.Count(f.Subject, ".")) || (t != "*" && t != ">" && strings.ContainsAny(t, "*>")) {
				return fmt.Errorf("%w: subject pattern %q: use NATS wildcards, '*' for one token and '>' for the rest", ErrInvalidOptions, f.Subject)
			}
		}
	}
	return nil
}

// UnknownCodes returns the codes of f.Codes that this version of jetsink
// never writes (pipeline.DeadLetterCodes): most likely typos, though a
// dead letter of another version may carry one, so Validate allows them.
func (f Filter) UnknownCodes() []string {
	var unknown []string
	known := pipeline.DeadLetterCodes()
	for _, c := range f.Codes {
		if !contains(known, c) {
			unknown = append(unknown, c)
		}
	}
	return unknown
}

// Match reports whether l passes the filter.
func (f Filter) Match(l *Letter) bool {
	switch {
	case f.FirstSeq != 0 && l.Seq < f.FirstSeq,
		f.LastSeq != 0 && l.Seq > f.LastSeq,
		!f.Since.IsZero() && l.Time.Before(f.Since),
		!f.Until.IsZero() && !l.Time.Before(f.Until),
		len(f.Codes) > 0 && !contains(f.Codes, l.Code),
		len(f.Stages) > 0 && !contains(f.Stages, l.Stage),
		f.Subject != "" && !consumer.SubjectMatches(f.Subject, l.Subject):
		return false
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Options says what Replay does.
type Options struct {
	Stream string // the dead-letter stream, e.g. EVENTS_DLQ
	// Subject, if set, is the subject whose messages of Stream are read as
	// dead letters (nats.dead_letter_subject): a stream may hold the dead
	// letters of several jetsinks. "" reads the whole stream.
	Subject string
	// Consumer, if set, is the durable consumer that reads the event
	// streams (nats.consumer). Letters another consumer wrote (their
	// Jetsink-Consumer) are left alone: replayed, their event would reach
	// that consumer's jetsink again too; so are those that name none,
	// unless IncludeUnnamed. A letter is re-published only if that
	// consumer is on its stream and takes its subject (ErrNoReader):
	// otherwise the event would wait where nothing reads it, or, in a
	// stream with interest retention, be dropped at once although the
	// stream acknowledges it, and the dead letter would be deleted all the
	// same. A dry run checks it too.
	Consumer string
	// WrittenBy, if set, is the consumer whose letters are replayed
	// instead of Consumer's: the durable's old name after a rename, whose
	// letters carry it in Jetsink-Consumer. Consumer still has to read
	// each letter's event.
	WrittenBy string
	// IncludeUnnamed replays, with Consumer or WrittenBy set, the letters
	// that name no consumer too (no Jetsink-Consumer: a jetsink built
	// before 3ba427c, 2026-12-03, wrote them), which Replay otherwise
	// leaves and counts (Report.Unnamed): any jetsink reading their stream
	// may have written one, and replayed, its event would reach that
	// jetsink again, whose cause may not be fixed, as well as this one,
	// which would store it in its own table. Set it when only this
	// jetsink's letters are among them (or the Filter picks its own).
	// Replay does not guess it from the durables on the event stream: a
	// jetsink whose durable was since deleted or renamed wrote letters
	// that no durable there names, and a durable that is no jetsink's
	// wrote none.
	IncludeUnnamed bool
	// EventStream, if set, is the event stream whose letters are
	// replayed: a letter whose Jetsink-Stream is another (a jetsink on
	// another stream whose dead-letter subject is the same, as the
	// default is) is left for that jetsink's replay (Report.Others).
	EventStream string
	Filter      Filter
	// AllowMaxMsgsPerSubject replays into an event stream that drops a
	// subject's oldest message to store a new one (max_msgs_per_subject
	// without discard new and discard_new_per_subject), which Replay
	// otherwise refuses (ErrNoReader): there each replayed event pushes
	// out the oldest of its subject, perhaps one jetsink has not read yet
	// (the event of the letter replayed just before), and the letters are
	// deleted all the same.
	AllowMaxMsgsPerSubject bool
	// AllowDiscardOld replays into an event stream with max_msgs or
	// max_bytes and discard old even where the replayed events would
	// push out messages its reader has not acked, which Replay otherwise
	// refuses (ErrNoReader): the stream drops its oldest messages to store
	// new ones, read or not, and the letters are deleted all the same.
	// The reader is Consumer, or else the consumer the letters name if the
	// stream has it; without one, Replay refuses to push out any message.
	AllowDiscardOld bool
	DryRun          bool // list only: publish nothing, delete nothing
	Keep            bool // re-publish but do not delete the dead letters
	Limit           int  // stop after this many matches (0: no limit)
	// FetchWait bounds the wait for the next batch of the stream (default
	// 2s). A wait that brings nothing while the stream still holds a
	// dead letter to read is a stall: it is retried with twice the wait,
	// up to 3 times, and then Replay returns ErrStalled.
	FetchWait time.Duration
	// LetterTimeout bounds the re-publish and the delete of one dead
	// letter, retries included (default 30s).
	LetterTimeout time.Duration
}

// Outcome is what happened to one matched dead letter.
type Outcome struct {
	Replayed bool // re-published and acknowledged by its original stream
	Deleted  bool // removed from the dead-letter stream
	// Unsure: the letter stays in the dead-letter stream although its
	// event may be stored: no answer to the re-publish came (ErrPublish;
	// JetStream may have stored it and the answer was lost), or another
	// stream than the original stored it (ErrWrongStream), from where a
	// source or mirror may bring it to the original. Report.Unsure lists
	// it.
	Unsure bool
	Err    error // why not, wrapping one of the sentinels
}

// Report counts one Replay.
type Report struct {
	Scanned  int // dead letters read
	Matched  int // of which the filter selected
	Replayed int
	Deleted  int
	Skipped  int // not jetsink dead letters (ErrNotDeadLetter), but for Markers
	// NotLetters lists the dead-letter sequences of the first
	// NotLettersNamed messages skipped, in order.
	NotLetters []uint64
	Others     int // letters the filter selected that another consumer wrote (Jetsink-Consumer is not Options.WrittenBy, or Consumer), or of another stream's events (Jetsink-Stream is not Options.EventStream), left for their own replay
	Failed     int // re-publish or delete failed, or (in a dry run too) nothing would read the event (ErrNoReader), or it is a key-value bucket's or an object store's (ErrKeyValue, ErrObjectStore)
	// Unnamed counts the letters the filter selected that name no
	// consumer (no Jetsink-Consumer: an older jetsink wrote them), left
	// because Options.Consumer or WrittenBy is set and IncludeUnnamed is
	// not: they may be another jetsink's. UnnamedLetters lists the
	// dead-letter sequences of the first NotLettersNamed, in order.
	Unnamed        int
	UnnamedLetters []uint64
	// Markers counts the subject delete markers read (see marker): the
	// server's own, where the last message of a subject aged out, not
	// letters and not skipped. Scanned counts them too.
	Markers int
	// KeyValue counts the matched letters of a key-value bucket's events
	// not re-published (ErrKeyValue, also counted in Failed), and
	// KeyValueLetters lists the dead-letter sequences of the first
	// NotLettersNamed, in order.
	KeyValue        int
	KeyValueLetters []uint64
	// ObjectStore and ObjectStoreLetters are the same for the letters of
	// an object store's events (ErrObjectStore).
	ObjectStore        int
	ObjectStoreLetters []uint64
	// Undeleted lists the dead-letter sequences of letters re-published
	// (acknowledged by their stream) but not deleted although Keep was not
	// set: each is now both an event and a dead letter, and replaying it
	// again after the event stream's duplicate window stores it twice.
	Undeleted []uint64
	// Unsure lists the dead-letter sequences of letters left in place
	// whose event may have been stored all the same (Outcome.Unsure):
	// replaying one again within the event stream's duplicate window is
	// safe, after it the event may be stored twice.
	Unsure []uint64
}

// NotLettersNamed bounds Report.NotLetters.
const NotLettersNamed = 10

const (
	fetchBatch     = 256
	stallRetries   = 3 // empty fetches retried while letters remain
	deleteAttempts = 4 // DeleteMsg calls per letter, each waiting at most publishWait
	deleteBackoff  = 250 * time.Millisecond
	// A re-publish that gets no answer is sent again, with the same
	// Nats-Msg-Id (so the event stream keeps one copy within its
	// duplicate window), while Options.LetterTimeout lasts; each attempt
	// waits at most publishWait or a third of LetterTimeout.
	publishWait       = 5 * time.Second
	publishBackoff    = 250 * time.Millisecond
	publishBackoffMax = 2 * time.Second
	// A re-publish that no stream listens for (no responders: nothing is
	// stored) is sent this many times more, publishBackoff apart, before
	// the letter fails: a stream's leader may be changing. (nats.go's own
	// retries of it are off, so that an attempt's deadline cannot turn it
	// into "no answer".)
	noStreamRetries = 2
)

// Replay walks the dead-letter stream (see the package doc) and calls each,
// if not nil, for every matched letter with its outcome (a zero Outcome in
// a dry run).
//
// It has two contexts, as a drain does. When intake ends, Replay stops
// before the next letter and returns intake's error; the letter under way
// is finished: its re-publish and delete run under hard, bounded by
// Options.LetterTimeout, so that stopping cannot separate the PubAck from
// the delete. When hard ends, Replay gives that letter up too (it is
// reported through each, and in Report.Undeleted if it was re-published)
// and returns hard's error. Pass one context as both to stop anywhere.
//
// It returns an error wrapping ErrInvalidOptions for bad options (among
// them a dead-letter stream that denies deletes, unless Keep or DryRun),
// the error of reading the stream (one wrapping nats.ErrPermissionViolation
// if the server refuses the user the consumers that read it), ErrStalled,
// ErrUnsettled, or a context's error. A letter that fails is reported
// through each and counted in Report.Failed. When its event is certainly
// not stored (a refusal, ErrNoReader, ErrKeyValue, ErrObjectStore) Replay goes on with the next letter;
// when it may be stored although the letter stays (Report.Unsure), or is
// stored and the letter could not be deleted (Report.Undeleted), Replay
// stops there, with ErrUnsettled.
func Replay(intake, hard context.Context, js jetstream.JetStream, o Options, each func(*Letter, Outcome)) (Report, error) {
	var rep Report
	if o.Stream == "" {
		return rep, fmt.Errorf("%w: no dead-letter stream given", ErrInvalidOptions)
	}
	if err := o.Filter.Validate(); err != nil {
		return rep, err
	}
	if o.Limit < 0 {
		return rep, fmt.Errorf("%w: limit %d: want 0 (no limit) or more", ErrInvalidOptions, o.Limit)
	}
	if o.FetchWait <= 0 {
		o.FetchWait = 2 * time.Second
	}
	if o.LetterTimeout <= 0 {
		o.LetterTimeout = 30 * time.Second
	}
	stopped := func() error {
		if err := hard.Err(); err != nil {
			return err
		}
		return intake.Err()
	}
	if err := stopped(); err != nil {
		return rep, err
	}
	// read is intake that hard ends too: whatever reads the stream stops
	// on either.
	read, stopRead := context.WithCancelCause(intake)
	defer stopRead(nil)
	defer context.AfterFunc(hard, func() { stopRead(context.Cause(hard)) })()
	stream, err := js.Stream(read, o.Stream)
	if err != nil {
		return rep, fmt.Errorf("dlq: dead-letter stream %s: %w", o.Stream, err)
	}
	info, err := stream.Info(read)
	if err != nil {
		return rep, fmt.Errorf("dlq: dead-letter stream %s: %w", o.Stream, err)
	}
	if info.Config.DenyDelete && !o.Keep && !o.DryRun {
		return rep, fmt.Errorf("%w: dead-letter stream %s denies deletes (deny_delete): every letter replayed would stay, its event stored too; "+
			"pass --keep to replay them all the same", ErrInvalidOptions, o.Stream)
	}
	rs := &readers{js: js, name: o.Consumer, perSubject: o.AllowMaxMsgsPerSubject, discardOld: o.AllowDiscardOld, dryRun: o.DryRun, of: map[string]readerOf{}, windows: map[string]streamOf{}}
	last := info.State.LastSeq
	if o.Filter.LastSeq != 0 {
		last = min(last, o.Filter.LastSeq)
	}
	first := max(info.State.FirstSeq, o.Filter.FirstSeq)
	if info.State.Msgs == 0 || last < first ||
		(!o.Filter.Since.IsZero() && info.State.LastTime.Before(o.Filter.Since)) ||
		(!o.Filter.Until.IsZero() && !info.State.FirstTime.Before(o.Filter.Until)) {
		return rep, nil
	}
	var rd *reader
	switch {
	case o.Filter.FirstSeq > info.State.FirstSeq:
		rd = newReader(js, o.Stream, o.Subject, jetstream.DeliverByStartSequencePolicy, o.Filter.FirstSeq, nil)
	case !o.Filter.Since.IsZero():
		since := o.Filter.Since
		rd = newReader(js, o.Stream, o.Subject, jetstream.DeliverByStartTimePolicy, 0, &since)
	default:
		rd = newReader(js, o.Stream, o.Subject, jetstream.DeliverAllPolicy, 0, nil)
	}

	// pos is the last sequence read, or the one before where reading
	// starts; the stream is read to the end when it holds nothing in
	// (pos, last].
	pos, seen := first-1, false
	wait, stalls := o.FetchWait, 0
	for {
		if err := stopped(); err != nil {
			return rep, err
		}
		got, done, err := func() (int, bool, error) {
			fctx, cancel := context.WithTimeout(read, wait)
			defer cancel()
			after := uint64(0) // where the reader starts, until a letter is read
			if seen {
				after = pos
			}
			defer rd.drop(hard)
			batch, err := rd.fetch(fctx, after, fetchBatch)
			if err != nil {
				if deadline, _ := fctx.Deadline(); !time.Now().Before(deadline) && stopped() == nil &&
					!errors.Is(err, nats.ErrPermissionViolation) { // a refusal is not a stall: no wait ends it
					return 0, false, nil // the wait ran out while the consumer was being made: a stall
				}
				return 0, false, err
			}
			if ci := rd.cons.CachedInfo(); !seen && ci != nil && ci.Delivered.Stream > pos {
				pos = ci.Delivered.Stream // where a consumer starting at --since starts
			}
			got := 0
			for m := range batch.Messages() {
				got++
				meta, err := m.Metadata()
				if err != nil {
					return got, false, err
				}
				if meta.Sequence.Stream > last {
					return got, true, nil
				}
				// A stream stamps its messages as it stores them, in
				// sequence order (which --since's start by time relies on
				// too): every letter after one at or past Until is too.
				if !o.Filter.Until.IsZero() && !meta.Timestamp.Before(o.Filter.Until) {
					return got, true, nil
				}
				if err := stopped(); err != nil {
					return got, false, err // between letters
				}
				pos, seen = meta.Sequence.Stream, true
				matched, unsettled := rep.scan(hard, js, stream, rs, o, meta, m, each)
				if unsettled != nil {
					return got, false, unsettled
				}
				if matched && o.Limit > 0 && rep.Matched >= o.Limit {
					return got, true, nil
				}
				if pos >= last {
					return got, true, nil
				}
				if meta.NumPending == 0 { // the server has no more for now: if the stream has none, do not wait out the fetch
					more, err := remains(read, stream, o.Subject, pos, last)
					if err != nil {
						return got, false, err
					}
					if !more {
						return got, true, nil
					}
				}
			}
			if err := stopped(); err != nil {
				return got, false, err
			}
			if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !(errors.Is(err, context.DeadlineExceeded) && fctx.Err() != nil) {
				return got, false, err
			}
			return got, false, nil
		}()
		switch {
		case errors.Is(err, ErrUnsettled):
			return rep, err
		case err != nil && stopped() != nil:
			return rep, stopped()
		case err != nil:
			return rep, fmt.Errorf("dlq: read %s: %w", o.Stream, err)
		case done:
			return rep, nil
		case got > 0:
			wait, stalls = o.FetchWait, 0
			continue
		}
		// Nothing within the wait. Either the stream holds nothing more up
		// to last (deleted, expired, or never there past --since), or the
		// server did not deliver what it holds.
		more, err := remains(read, stream, o.Subject, pos, last)
		if err != nil {
			if stopped() != nil {
				return rep, stopped()
			}
			return rep, fmt.Errorf("dlq: read %s: %w", o.Stream, err)
		}
		if !more {
			return rep, nil
		}
		if stalls == stallRetries {
			return rep, fmt.Errorf("%w: %s holds dead letters after sequence %d, but %d fetches in a row brought none (the last waited %s); they stay in place",
				ErrStalled, o.Stream, pos, stalls+1, wait)
		}
		stalls++
		wait *= 2
	}
}

// scan handles one message of the dead-letter stream and counts it. It
// reports whether the filter matched it and, if the letter was left
// unsettled (Report.Unsure, Report.Undeleted), an error wrapping
// ErrUnsettled that names it.
func (rep *Report) scan(hard context.Context, js jetstream.JetStream, stream jetstream.Stream, rs *readers, o Options,
	meta *jetstream.MsgMetadata, m jetstream.Msg, each func(*Letter, Outcome)) (matched bool, unsettled error) {
	rep.Scanned++
	l, err := letter(meta, m.Headers(), m.Data())
	if err != nil && marker(m.Headers(), m.Data()) {
		rep.Markers++
		return false, nil
	}
	if err != nil {
		rep.Skipped++
		if len(rep.NotLetters) < NotLettersNamed {
			rep.NotLetters = append(rep.NotLetters, meta.Sequence.Stream)
		}
		return false, nil
	}
	if !o.Filter.Match(l) {
		return false, nil
	}
	switch by := cmp.Or(o.WrittenBy, o.Consumer); {
	case by != "" && l.Consumer != "" && l.Consumer != by, o.EventStream != "" && l.Stream != o.EventStream:
		rep.Others++
		return false, nil
	case by != "" && l.Consumer == "" && !o.IncludeUnnamed:
		// A jetsink from before Jetsink-Consumer wrote it: perhaps
		// another one reading the same stream, whose cause may not be
		// fixed (see Options.IncludeUnnamed).
		rep.Unnamed++
		if len(rep.UnnamedLetters) < NotLettersNamed {
			rep.UnnamedLetters = append(rep.UnnamedLetters, l.Seq)
		}
		return false, nil
	}
	rep.Matched++
	// Stopping intake must not come between the PubAck and the delete;
	// only hard, or the timeout, may.
	ctx, cancel := context.WithTimeout(hard, o.LetterTimeout)
	defer cancel()
	var out Outcome
	wait := min(publishWait, o.LetterTimeout/3)
	if err := target(l); err != nil {
		out.Err = err
	} else if st, err := storeEvent(l, o.Stream); err != nil {
		out.Err = err
		n, seqs := st.counts(rep)
		*n++
		if len(*seqs) < NotLettersNamed {
			*seqs = append(*seqs, l.Seq)
		}
	} else if err := rs.check(ctx, l, wait); err != nil {
		out.Err = err
	} else if window, err := rs.window(ctx, l, wait); err != nil { // a dry run too: it only reads
		out.Err = err
	} else if err := rs.room(ctx, l, wait); err != nil { // a dry run too, counting what it would replay
		out.Err = err
	} else if o.DryRun {
		rs.take(l) // as if replayed, for the room of the letters after it
	} else {
		out = replayOne(ctx, js, stream, l, o.Keep, wait, window)
		if out.Replayed || out.Unsure {
			rs.take(l)
		}
	}
	if out.Replayed {
		rep.Replayed++
	}
	if out.Deleted {
		rep.Deleted++
	}
	if out.Err != nil {
		rep.Failed++
	}
	if out.Replayed && !out.Deleted && !o.Keep {
		rep.Undeleted = append(rep.Undeleted, l.Seq)
		unsettled = fmt.Errorf("%w: dead letter %d was re-published but not deleted: %w", ErrUnsettled, l.Seq, out.Err)
	}
	if out.Unsure {
		rep.Unsure = append(rep.Unsure, l.Seq)
		// Stored by another stream, the event is stored: running again
		// would store it again, not settle it. Only a re-publish
		// without an answer stops the replay.
		if !errors.Is(out.Err, ErrWrongStream) {
			unsettled = fmt.Errorf("%w: dead letter %d: its event may be stored: %w", ErrUnsettled, l.Seq, out.Err)
		}
	}
	if each != nil {
		each(l, out)
	}
	return true, unsettled
}

// readers checks that Options.Consumer reads the stream and subject of a
// letter, looking each stream's consumer up once.
type readers struct {
	js         jetstream.JetStream
	name       string              // "": no check
	perSubject bool                // Options.AllowMaxMsgsPerSubject
	discardOld bool                // Options.AllowDiscardOld
	dryRun     bool                // Options.DryRun
	of         map[string]readerOf // by event stream
	windows    map[string]streamOf // by event stream
}

// streamOf is what readers learnt of one event stream: its duplicate
// window, the subjects it captures when they are known and it takes
// nothing from other streams, and its subject transform; or that the
// server refused the user its config.
type streamOf struct {
	err       error // the lookup was refused: no letter of the stream is re-published
	window    time.Duration
	subjects  []string                          // nil: not checked
	transform *jetstream.SubjectTransformConfig // nil: none, or one that changes no subject
	drops     string                            // the max_msgs_per_subject that drops a subject's oldest message, "" if none (see dropsPerSubject)
	room      *room                             // nil unless it drops its oldest messages once full (see discardsOld)
}

// dropsPerSubject describes cfg's max_msgs_per_subject if the stream drops
// a subject's oldest message to store a new one once the subject holds that
// many, else "". With discard new it does so too unless
// discard_new_per_subject is set: then it refuses the new one (nats-server's
// store), and a replayed letter refused stays.
func dropsPerSubject(cfg *jetstream.StreamConfig) string {
	switch {
	case cfg.MaxMsgsPerSubject <= 0 || cfg.Discard == jetstream.DiscardNew && cfg.DiscardNewPerSubject:
		return ""
	case cfg.Discard == jetstream.DiscardNew:
		return fmt.Sprintf("max_msgs_per_subject %d, with discard new but not discard_new_per_subject", cfg.MaxMsgsPerSubject)
	}
	return fmt.Sprintf("max_msgs_per_subject %d, discard old", cfg.MaxMsgsPerSubject)
}

// transforms returns the stream's subject transform (subject_transform)
// if it changes the subjects it applies to, else nil. As nats-server reads
// it, no Destination is no transform and no Source is ">", every subject;
// ">" to ">", or a Destination that is its Source (which then has no '*',
// the server allows no wildcard in a Destination), changes nothing.
func transforms(st *jetstream.SubjectTransformConfig) *jetstream.SubjectTransformConfig {
	if st == nil || st.Destination == "" {
		return nil
	}
	src := cmp.Or(st.Source, ">")
	if st.Destination == src {
		return nil
	}
	return &jetstream.SubjectTransformConfig{Source: src, Destination: st.Destination}
}

// transformAgain is the subject the stream's transform tr (nil: none)
// stores subject under when the replay publishes to it, and whether that
// is another subject: nats-server's own transform, so that one that gives
// a subject back ({{wildcard(1)}} in place of *, a split with nothing to
// split) is no reason to refuse. One it cannot work out, or draws at
// random ("?"), counts as another.
func transformAgain(tr *jetstream.SubjectTransformConfig, subject string) (string, bool) {
	if tr == nil || !consumer.SubjectMatches(tr.Source, subject) {
		return subject, false
	}
	again, ok := consumer.Transformed(tr.Source, tr.Destination, subject)
	if !ok {
		return "?", true // another subject each time, perhaps this one
	}
	return again, again != subject
}

// readerOf is what readers learnt of one event stream: the subjects its
// consumer takes (none: all), or why nothing would read it.
type readerOf struct {
	filters []string
	cons    jetstream.Consumer // the room's reader (see room)
	err     error
}

// check returns nil if the consumer is on l's stream and takes its
// subject, else an error wrapping ErrNoReader, or, if the lookup failed
// (within wait), one wrapping ErrPublish (either way the letter is not
// re-published: its event is certainly not stored). A lookup the server
// refuses the user is not asked again: it answers nothing, and each
// letter would wait for it.
func (r *readers) check(ctx context.Context, l *Letter, wait time.Duration) error {
	if r.name == "" {
		return nil
	}
	ro, known := r.of[l.Stream]
	if !known {
		before := lastError(r.js)
		lctx, cancel := context.WithTimeout(ctx, wait)
		c, err := r.js.Consumer(lctx, l.Stream, r.name)
		cancel()
		var denied error
		if err != nil {
			denied = refused(r.js, api(r.js)+"CONSUMER.INFO."+l.Stream+"."+r.name, before)
		}
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			ro.err = fmt.Errorf("%w: stream %s has no consumer %s (nats.consumer; set it with --set nats.consumer=NAME)", ErrNoReader, l.Stream, r.name)
		case errors.Is(err, jetstream.ErrStreamNotFound):
			ro.err = fmt.Errorf("%w: stream %s, the letter's Jetsink-Stream, does not exist", ErrNoReader, l.Stream)
		case denied != nil:
			ro.err = fmt.Errorf("%w: could not look up consumer %s of stream %s: %w (jetsink run needs it too)",
				ErrPublish, r.name, l.Stream, denied)
		case err != nil: // asked again for the next letter
			return fmt.Errorf("%w: dead letter %d not re-published: could not look up consumer %s of stream %s: %w; it stays",
				ErrPublish, l.Seq, r.name, l.Stream, err)
		default:
			cfg := c.CachedInfo().Config
			ro.cons = c
			ro.filters = cfg.FilterSubjects
			if cfg.FilterSubject != "" {
				ro.filters = append(ro.filters, cfg.FilterSubject)
			}
		}
		r.of[l.Stream] = ro
	}
	if ro.err != nil {
		return fmt.Errorf("dead letter %d to %s: %w; it stays", l.Seq, l.Subject, ro.err)
	}
	if len(ro.filters) == 0 {
		return nil
	}
	for _, f := range ro.filters {
		if consumer.SubjectMatches(f, l.Subject) {
			return nil
		}
	}
	return fmt.Errorf("dead letter %d to %s: %w: consumer %s of stream %s takes only %s; it stays",
		l.Seq, l.Subject, ErrNoReader, r.name, l.Stream, strings.Join(ro.filters, ", "))
}

// window returns the duplicate window of l's event stream, looking each
// stream up once: a re-publish without an answer is sent again only while
// the stream would still take the copy for a duplicate (see publish). A
// stream it cannot look up within wait is not published to: without its
// config the replay cannot tell whether it would store the event under
// the letter's subject. The error wraps ErrPublish; a lookup the server
// refuses the user (no STREAM.INFO on it, which the server answers with
// silence) is not asked again, and names the subject to allow; any other
// failure (a timeout) is asked again for the next letter. An error
// wrapping ErrNoReader means the stream does not exist, does not capture l's
// subject (and sources or mirrors nothing), has a subject transform whose
// Source matches it, or, without Options.AllowMaxMsgsPerSubject, drops a
// subject's oldest message to store a new one (see dropsPerSubject); the
// letter is then not re-published. A dry run checks all of it too. (l.Subject
// is the subject as stored, after the transform: published to it, the
// event would be transformed again, events.v2.x to events.v2.v2.x.) (A letter is a message anyone allowed to publish to the
// dead-letter subject can write: its Jetsink-Subject is where the replay's
// credentials publish. See target.)
func (r *readers) window(ctx context.Context, l *Letter, wait time.Duration) (time.Duration, error) {
	so, ok := r.windows[l.Stream]
	if !ok {
		before := lastError(r.js)
		lctx, cancel := context.WithTimeout(ctx, wait)
		s, err := r.js.Stream(lctx, l.Stream)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return 0, fmt.Errorf("dead letter %d to %s: %w: stream %s, the letter's Jetsink-Stream, does not exist; it stays", l.Seq, l.Subject, ErrNoReader, l.Stream)
		case err != nil:
			// Without the stream's config the replay cannot tell
			// whether the stream would store the event as it was (its
			// subject_transform): nothing is published.
			if named, denied := refusedTo(r.js, api(r.js)+"STREAM.INFO."+l.Stream, "\"", before); denied != nil {
				// Not asked again: the server answers a refused request
				// with silence, and each letter would wait for it.
				r.windows[l.Stream] = streamOf{err: fmt.Errorf("%w: could not read the config of stream %s, the letter's Jetsink-Stream, "+
					"which says whether it would store the event as it was (its subject_transform): %w (allow the user to publish to %s)",
					ErrPublish, l.Stream, denied, named)}
				return 0, fmt.Errorf("dead letter %d to %s: %w; it stays", l.Seq, l.Subject, r.windows[l.Stream].err)
			}
			// A timeout, a connection lost: asked again for the next
			// letter, which a server back by then answers.
			return 0, fmt.Errorf("%w: dead letter %d to %s not re-published: could not read the config of stream %s, the letter's Jetsink-Stream, "+
				"which says whether it would store the event as it was (its subject_transform): %w; it stays",
				ErrPublish, l.Seq, l.Subject, l.Stream, err)
		}
		cfg := s.CachedInfo().Config
		so = streamOf{window: cfg.Duplicates, transform: transforms(cfg.SubjectTransform), drops: dropsPerSubject(&cfg)}
		if limits := discardsOld(&cfg); limits != "" {
			so.room = &room{stream: s, js: r.js, name: l.Stream, limits: limits, maxMsgs: max(cfg.MaxMsgs, 0), maxBytes: max(cfg.MaxBytes, 0),
				memory: cfg.Storage == jetstream.MemoryStorage, sourced: sourceHeader(cfg.Sources), dryRun: r.dryRun,
				copied: cfg.Mirror != nil || len(cfg.Sources) > 0}
		}
		if cfg.Mirror == nil && len(cfg.Sources) == 0 {
			// A stream that sources others holds events published to
			// subjects it does not capture; their re-publish is stored
			// by the origin, which it takes them from (ErrWrongStream).
			so.subjects = append([]string{}, cfg.Subjects...)
		}
		r.windows[l.Stream] = so
	}
	if so.err != nil {
		return 0, fmt.Errorf("dead letter %d to %s: %w; it stays", l.Seq, l.Subject, so.err)
	}
	tr := so.transform
	if so.subjects != nil && !slices.ContainsFunc(so.subjects, func(f string) bool { return consumer.SubjectMatches(f, l.Subject) }) {
		stored := ""
		if tr != nil {
			stored = fmt.Sprintf(" (the letter's subject is the one stored, after the stream's subject transform %s -> %s: "+
				"the event was published to another)", tr.Source, tr.Destination)
		}
		return 0, fmt.Errorf("dead letter %d to %s: %w: stream %s, the letter's Jetsink-Stream, does not capture %s (its subjects: %s)%s; it stays",
			l.Seq, l.Subject, ErrNoReader, l.Stream, l.Subject, strings.Join(so.subjects, ", "), stored)
	}
	if again, changed := transformAgain(tr, l.Subject); changed {
		return 0, fmt.Errorf("dead letter %d to %s: %w: stream %s, the letter's Jetsink-Stream, transforms subjects %s -> %s (subject_transform): "+
			"%s is the subject as stored, and re-published to it the event would be transformed again, stored as %s; "+
			"it stays (publish it to the subject it was first published to by hand)",
			l.Seq, l.Subject, ErrNoReader, l.Stream, tr.Source, tr.Destination, l.Subject, again)
	}
	if so.drops != "" && !r.perSubject {
		return 0, fmt.Errorf("dead letter %d to %s: %w: stream %s, the letter's Jetsink-Stream, drops a subject's oldest message to store a new one (%s): "+
			"each replayed event would push out the oldest of its subject, which jetsink may not have read yet (the event of the letter replayed just before it), "+
			"while the letters are deleted; and it would stand as the subject's latest message, over newer ones. "+
			"It stays (replay into the stream all the same with --allow-max-msgs-per-subject; "+
			"or set discard new and discard_new_per_subject on it, which refuses such a publish instead)",
			l.Seq, l.Subject, ErrNoReader, l.Stream, so.drops)
	}
	return so.window, nil
}

// target returns an error wrapping ErrNoReader if l's subject is not one
// an event can have been published to, and a replay must not publish to:
// a subject with wildcards or empty tokens, or one that JetStream, the
// system account or request replies serve ($JS.API, $JS.<domain>.API,
// $JS.ACK, $JS.FC, $JSC, $NRG, $SYS, _INBOX). jetsink never writes such a
// letter; anyone else allowed to publish to the dead-letter subject can,
// and the replay would send the request with its own credentials (purge a
// stream, ack another consumer's messages). Advisories ($JS.EVENT) a
// stream captures are events like others; $SYS events a stream imports
// are refused all the same (replay such a letter by hand).
func target(l *Letter) error {
	bad := ""
	for tok := range strings.SplitSeq(l.Subject, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\n\r\f") { // what nats-server refuses
			bad = "not a subject an event is published to"
			break
		}
	}
	if bad == "" {
		for _, p := range []string{"$JS.API.", "$JS.ACK.", "$JS.FC.", "$JSC.", "$NRG.", "$SYS.", "_INBOX."} {
			if strings.HasPrefix(l.Subject, p) {
				bad = "a subject " + strings.TrimSuffix(p, ".") + " serves, not a stream"
			}
		}
		if rest, ok := strings.CutPrefix(l.Subject, "$JS."); ok {
			if domain, api, ok := strings.Cut(rest, "."); ok && domain != "EVENT" && strings.HasPrefix(api, "API.") {
				bad = "a subject the JetStream API of a domain serves, not a stream"
			}
		}
	}
	if bad != "" {
		return fmt.Errorf("dead letter %d to %q: %w: its Jetsink-Subject is %s (jetsink writes no such letter: "+
			"see who may publish to the dead-letter subject); it stays", l.Seq, l.Subject, ErrNoReader, bad)
	}
	return nil
}

// kvOperation is the header with which a key-value bucket marks a delete
// (DEL) or a purge (PURGE) of a key; a put has none. (nats.go keeps its
// name to itself.)
const kvOperation = "KV-Operation"

// A Store is a kind of store nats.go keeps in a stream, whose events
// Replay does not write back (see ErrKeyValue and ErrObjectStore): its
// words, for the letter's error and for a summary of the letters refused
// (Report.Refusals).
type Store struct {
	Err     error  // ErrKeyValue or ErrObjectStore
	Name    string // "a key-value bucket"
	Noun    string // what a replay would write into: "bucket"
	Harm    string // what replayed events would do there
	Restore string // the command that puts back by hand what it should hold
	// counts is where a Report counts its letters refused.
	counts func(*Report) (n *int, letters *[]uint64)
}

var (
	keyValueStore = Store{ErrKeyValue, "a key-value bucket", "bucket",
		"a delete or purge removing the key's current value, a put standing over a newer one", "nats kv put <bucket> <key> <value>",
		func(r *Report) (*int, *[]uint64) { return &r.KeyValue, &r.KeyValueLetters }}
	objectStore = Store{ErrObjectStore, "an object store", "object store",
		"a chunk added to its object's data, which would no longer match its digest, a meta standing over the object's newer one",
		"nats object put <bucket> <file>",
		func(r *Report) (*int, *[]uint64) { return &r.ObjectStore, &r.ObjectStoreLetters }}
	// stores is every Store, in the order Refusals lists them.
	stores = []Store{keyValueStore, objectStore}
)

// A Refusal is the letters of one Store's events that a Replay did not
// re-publish: N of them, the first NotLettersNamed named in Letters.
type Refusal struct {
	Store   Store
	N       int
	Letters []uint64
}

// Refusals lists the letters of a store's events the Replay refused
// (Report.KeyValue, Report.ObjectStore), one Refusal for each Store that
// has any: a key-value bucket's first, then an object store's.
func (rep *Report) Refusals() []Refusal {
	var refused []Refusal
	for _, s := range stores {
		if n, letters := s.counts(rep); *n > 0 {
			refused = append(refused, Refusal{Store: s, N: *n, Letters: *letters})
		}
	}
	return refused
}

// storeEvent returns an error wrapping ErrKeyValue or ErrObjectStore if l's
// event is a key-value bucket's (keyValue) or an object store's
// (objectEvent): replayed, it would be written into the store again, with
// the replay's credentials, not only sent to jetsink. Published to a
// stream that sources or mirrors the store, the store itself stores it
// (and Replay would learn of it only from the PubAck); to the store's own
// stream, nothing else need stop it (a bucket's stream keeps
// max_msgs_per_subject, its history, which Options.AllowMaxMsgsPerSubject
// lets through, and that option is about events dropped, not about
// writing into a store; an object store's stream keeps every message of a
// subject). dlqStream names the dead-letter stream for the error's hint.
// The Store is the one whose event it is.
func storeEvent(l *Letter, dlqStream string) (Store, error) {
	s, what := keyValue(l)
	if what == "" {
		s, what = objectEvent(l)
	}
	if what == "" {
		return Store{}, nil
	}
	return s, fmt.Errorf("dead letter %d to %s: %w: its event is %s of %s, and the replay would write it into the %s again, "+
		"not only send it to jetsink; it stays (fix what refused it, put back by hand what the %s should hold, "+
		"%s, and delete the letter, nats stream rmm %s %d)",
		l.Seq, l.Subject, s.Err, what, s.Name, s.Noun, s.Noun, s.Restore, dlqStream, l.Seq)
}

// keyValue says what l's event is if it is a key-value bucket's: its
// subject is under $KV. (the subjects a bucket's stream stores its keys
// under), or it carries the KV-Operation header (the event of a bucket
// stored under another subject, by a source's or mirror's subject
// transform, which a subject mapping of the account may lead back to the
// bucket). Replayed, a delete or purge would remove the key's current
// value, a put would stand over a newer one. It returns "" for any other.
func keyValue(l *Letter) (Store, string) {
	op := l.Header.Get(kvOperation)
	if !strings.HasPrefix(l.Subject, "$KV.") && op == "" {
		return keyValueStore, ""
	}
	what := "a put"
	switch op {
	case "":
	case "DEL":
		what = "a delete (KV-Operation: DEL), which would remove the key's current value"
	case "PURGE":
		what = "a purge (KV-Operation: PURGE), which would remove the key's current value and history"
	default:
		what = fmt.Sprintf("an operation (KV-Operation: %q)", op)
	}
	if op == "" {
		what += ", which would stand over the key's newer value, if any"
	}
	return keyValueStore, what
}

// objectEvent says what l's event is if it is an object store's: its
// subject is under $O., where nats.go's object store (bucket <b>, stream
// OBJ_<b>) writes an object's data in chunks to $O.<b>.C.<nuid>, a new
// nuid for each put, and its meta (name, size, digest, number of chunks
// and nuid; a delete's with deleted set) to $O.<b>.M.<encoded name>, with
// Nats-Rollup: sub, which leaves only the last. A replayed chunk would
// be added to its object's chunks, which a get reads to the end: the data
// read back would no longer match its digest. A replayed meta (without
// the Nats-Rollup a letter leaves out) would stand over a newer one, the
// one a get reads: a deleted object or an older version back without
// its chunks, which a delete or the next put purged, or a delete over
// the object put since. Unlike a bucket's, an object store's messages
// carry no header of their own: one stored under another subject (a
// source's subject transform) is not recognized. It returns "" for any
// other.
func objectEvent(l *Letter) (Store, string) {
	rest, ok := strings.CutPrefix(l.Subject, "$O.")
	if !ok {
		return objectStore, ""
	}
	_, rest, _ = strings.Cut(rest, ".") // the bucket
	kind, _, _ := strings.Cut(rest, ".")
	switch kind {
	case "C":
		return objectStore, "a chunk of an object's data (added to its chunks again, the object read back would no longer match its digest)"
	case "M":
		return objectStore, "an object's meta (standing over the object's newer meta, if any, it would bring back a deleted object " +
			"or an older version without its chunks, which were purged, or delete the object put since)"
	}
	return objectStore, "a message under $O. (where object stores keep their chunks and meta)"
}

// marker reports whether a message of the dead-letter stream that is no
// dead letter is a subject delete marker: what the server stores, with an
// empty body and the Nats-Marker-Reason header, where a subject's last
// message aged out (max_age, or a message TTL) in a stream with
// subject_delete_marker_ttl. It is the server's, not a letter, and nobody
// needs to look at it, unlike another message without Jetsink-Subject.
func marker(h nats.Header, data []byte) bool {
	return len(data) == 0 && h.Get(jetstream.MarkerReasonHeader) != ""
}

// windowText names a duplicate window for an error: 0 is none (a stream
// that keeps no Nats-Msg-Id).
func windowText(w time.Duration) string {
	if w <= 0 {
		return "none"
	}
	return w.String()
}

// remains reports whether the stream holds a message with a sequence in
// (pos, last], on subject if it is not "".
func remains(ctx context.Context, stream jetstream.Stream, subject string, pos, last uint64) (bool, error) {
	if subject == "" {
		subject = ">"
	}
	m, err := stream.GetMsg(ctx, pos+1, jetstream.WithGetMsgSubject(subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return m.Sequence <= last, nil
}

// letter reads a dead letter's headers.
func letter(meta *jetstream.MsgMetadata, h nats.Header, data []byte) (*Letter, error) {
	l := &Letter{
		Seq:      meta.Sequence.Stream,
		Time:     meta.Timestamp,
		Subject:  h.Get(consumer.HeaderSubject),
		Stream:   h.Get(consumer.HeaderStream),
		Stage:    h.Get(consumer.HeaderStage),
		Code:     h.Get(consumer.HeaderCode),
		SQLState: h.Get(consumer.HeaderSQLState),
		Reason:   h.Get(consumer.HeaderReason),
		MsgID:    h.Get(consumer.HeaderOrigMsgID),
		Consumer: h.Get(consumer.HeaderConsumer),
		Header:   h,
		Data:     data,
	}
	if l.Subject == "" || l.Stream == "" {
		return nil, fmt.Errorf("%w: message %d has no %s or %s header", ErrNotDeadLetter, l.Seq, consumer.HeaderSubject, consumer.HeaderStream)
	}
	l.StreamSeq, _ = strconv.ParseUint(h.Get(consumer.HeaderStreamSeq), 10, 64)
	return l, nil
}

// replayOne re-publishes l and, after its PubAck from the original stream,
// deletes it from the dead-letter stream unless keep. A re-publish that
// gets no answer within wait is sent again (see publish); a failed delete
// is retried with backoff while ctx lasts; a letter found gone counts as
// deleted (an earlier attempt whose answer was lost may have deleted it).
//
// Unless keep, the re-publish ends 2 x wait, or a quarter of the time
// left, before ctx does, so that a stream slow to answer it leaves the
// delete time of its own.
func replayOne(ctx context.Context, js jetstream.JetStream, dlq jetstream.Stream, l *Letter, keep bool, wait, window time.Duration) Outcome {
	pctx := ctx
	if deadline, ok := ctx.Deadline(); ok && !keep {
		var cancel context.CancelFunc
		pctx, cancel = context.WithDeadline(ctx, deadline.Add(-min(2*wait, time.Until(deadline)/4)))
		defer cancel()
	}
	ack, unanswered, err := publish(pctx, js, l, wait, window)
	if err != nil {
		if !unanswered {
			return Outcome{Err: fmt.Errorf("%w: dead letter %d to %s: %w", ErrPublish, l.Seq, l.Subject, err)}
		}
		return Outcome{Unsure: true, Err: fmt.Errorf("%w: dead letter %d to %s: a re-publish got no answer from the event stream, "+
			"so it may have been stored (last: %w); it stays in the dead-letter stream (replayed again within the event stream's duplicate window, %s, "+
			"its Nats-Msg-Id %s is stored once)", ErrPublish, l.Seq, l.Subject, err, windowText(window), l.ReplayMsgID())}
	}
	if ack.Stream != l.Stream {
		return Outcome{Unsure: true, Err: fmt.Errorf("%w: dead letter %d to %s was stored by stream %s, not %s; it stays in the dead-letter stream "+
			"(if %s sources or mirrors %s, the event reaches it all the same)",
			ErrWrongStream, l.Seq, l.Subject, ack.Stream, l.Stream, l.Stream, ack.Stream)}
	}
	out := Outcome{Replayed: true}
	if keep {
		return out
	}
	backoff := deleteBackoff
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, wait)
		err = dlq.DeleteMsg(actx, l.Seq)
		cancel()
		if err == nil {
			out.Deleted = true
			return out
		}
		gctx, cancel := context.WithTimeout(ctx, wait)
		_, gerr := dlq.GetMsg(gctx, l.Seq)
		cancel()
		if errors.Is(gerr, jetstream.ErrMsgNotFound) {
			out.Deleted = true
			return out
		}
		if attempt == deleteAttempts || !sleep(ctx, backoff) {
			break
		}
		backoff *= 2
	}
	if perm := refused(js, api(js)+"STREAM.MSG.DELETE."+dlq.CachedInfo().Config.Name, nil); perm != nil {
		err = fmt.Errorf("%w (%w)", err, perm)
	}
	out.Err = fmt.Errorf("%w: dead letter %d (re-published to %s as Nats-Msg-Id %s): %w", ErrDelete, l.Seq, l.Subject, l.ReplayMsgID(), err)
	return out
}

// publish re-publishes l and waits for the event stream's PubAck, each
// attempt for at most wait. An attempt that gets no answer (a timeout, a
// connection lost) leaves open whether the stream stored the event, so it
// is sent again, with the same Nats-Msg-Id, until an answer comes or ctx
// ends: within the stream's duplicate window a copy already stored is
// acknowledged as a duplicate instead of stored again. So is an answer that
// the same id is still being stored (a clustered stream's earlier attempt
// in flight). An answer that refuses it, or an error before anything was
// sent (see notStored), ends the attempts. unanswered reports that some
// attempt got no answer: then even a refusal later does not show that the
// event is not stored.
//
// An attempt is sent again only if it would end within window (the event
// stream's duplicate window) of the first: the stream keeps a copy's
// Nats-Msg-Id for window from when it stored it, which is after the first
// attempt was sent, and a later copy would be stored a second time.
func publish(ctx context.Context, js jetstream.JetStream, l *Letter, wait, window time.Duration) (ack *jetstream.PubAck, unanswered bool, err error) {
	backoff := publishBackoff
	noStream := 0
	first := time.Now()
	for {
		before := lastError(js)
		actx, cancel := context.WithTimeout(ctx, wait)
		ack, err = js.PublishMsg(actx, l.Msg(), jetstream.WithRetryAttempts(0))
		cancel()
		switch {
		case err == nil:
			return ack, unanswered, nil
		case storing(err):
			unanswered = true // an earlier attempt's copy is on its way in
		case errors.Is(err, jetstream.ErrNoStreamResponse) && noStream < noStreamRetries &&
			(!unanswered || time.Since(first)+publishBackoff+wait < window):
			noStream++
			if !sleep(ctx, publishBackoff) {
				return nil, unanswered, err
			}
			continue
		case notStored(err):
			return nil, unanswered, err
		default:
			// No answer. A server that refuses the connection's user
			// the subject says so only to the connection (an error
			// that came during this attempt), and stores nothing.
			if perm := refused(js, l.Subject, before); perm != nil {
				return nil, unanswered, fmt.Errorf("%w (%w)", err, perm)
			}
			unanswered = true
		}
		if time.Since(first)+backoff+wait >= window {
			return nil, unanswered, fmt.Errorf("%w; not sent again: the event stream's duplicate window (%s) would end before the next attempt did, "+
				"and a copy after it is stored a second time", err, windowText(window))
		}
		if !sleep(ctx, backoff) {
			return nil, unanswered, err
		}
		backoff = min(2*backoff, publishBackoffMax)
	}
}

// sleep waits d, or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// jsDuplicateInProcess is the API error code of "duplicate message id is
// in process": a clustered stream still storing an earlier publish with the
// same Nats-Msg-Id (nats-server's JSStreamDuplicateMessageConflict).
const jsDuplicateInProcess = 10158

// storing reports the answer that an earlier publish of the same
// Nats-Msg-Id is still being stored.
func storing(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsDuplicateInProcess
}

// notStored reports whether this publish certainly stored nothing: the
// stream answered with an error, no stream captures the subject, or nothing
// was sent (the client refused the message: too large, a bad subject, a
// header name it will not write, or headers the server does not support).
// Not a closed connection:
// nats.go also fails the requests in flight with it, sent already.
func notStored(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrHeadersNotSupported) ||
		errors.Is(err, nats.ErrBadHeaderMsg)
}

// lastError is the connection's last asynchronous error (nil without a
// connection).
func lastError(js jetstream.JetStream) error {
	if nc := js.Conn(); nc != nil {
		return nc.LastError()
	}
	return nil
}

// api is the prefix of js's JetStream API subjects, with its dot:
// "$JS.API.", or "$JS.<domain>.API." (nats.domain).
func api(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return "$JS.API."
}

// refused returns the connection's last error if it is not before (it came
// since) and is the server's refusal to let its user publish to subject,
// else nil.
func refused(js jetstream.JetStream, subject string, before error) error {
	_, err := refusedTo(js, subject, "\"", before)
	return err
}

// refusedUnder is refused for any subject that starts with prefix. It also
// returns prefix as the server names it (see refusedTo).
func refusedUnder(js jetstream.JetStream, prefix string, before error) (string, error) {
	return refusedTo(js, prefix, "", before)
}

// refusedTo is refused for the subjects that start with subject+end (the
// server quotes the subject it refuses, so end `"` makes it subject
// alone), and returns subject as the server named it.
func refusedTo(js jetstream.JetStream, subject, end string, before error) (string, error) {
	err := lastError(js)
	if err == nil || err == before || !errors.Is(err, nats.ErrPermissionViolation) {
		return "", nil
	}
	// A server whose own domain the subject names maps $JS.<domain>.API
	// to $JS.API before it checks permissions, and names that.
	mapped := subject
	if p := api(js); p != "$JS.API." {
		mapped = "$JS.API." + strings.TrimPrefix(subject, p)
	}
	for _, named := range []string{subject, mapped} {
		if strings.Contains(err.Error(), "Publish to \""+named+end) {
			return named, err
		}
	}
	return "", nil
}

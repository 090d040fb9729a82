package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
)

// Letter is one dead letter as read from the dead-letter stream.
type Letter struct {
	Seq       uint64    // sequence in the dead-letter stream
	Time      time.Time // when it was dead-lettered
	Subject   string    // original subject (Jetsink-Subject)
	Stream    string    // original stream (Jetsink-Stream)
	StreamSeq uint64    // original stream sequence (Jetsink-Stream-Seq)
	Stage     string    // Jetsink-Stage: decode, sink or deliver
	Code      string    // Jetsink-Code
	SQLState  string    // Jetsink-SQLState, "" when none
	Reason    string    // Jetsink-Reason
	MsgID     string    // the original Nats-Msg-Id (Jetsink-Msg-Id), "" when none
	Header    nats.Header
	Data      []byte
}

// ReplayMsgID is the Nats-Msg-Id a replayed letter is published with.
func (l *Letter) ReplayMsgID() string {
	orig := l.MsgID
	if orig == "" {
		orig = l.Stream + ":" + strconv.FormatUint(l.StreamSeq, 10)
	}
	return orig + ":replay:" + strconv.FormatUint(l.Seq, 10)
}

// Msg is the message a replay publishes: the original subject, body and
// headers, without the Jetsink-* headers, with Nats-Msg-Id ReplayMsgID.
func (l *Letter) Msg() *nats.Msg {
	h := make(nats.Header, len(l.Header))
	for k, v := range l.Header {
		if strings.HasPrefix(k, "Jetsink-") || k == jetstream.MsgIDHeader {
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
	Until    time.Time // dead-lettered before
	FirstSeq uint64    // dead-letter stream sequence at least this
	LastSeq  uint64    // and at most this (0: no upper bound)
}

// Validate checks the filter; errors wrap ErrInvalidOptions.
func (f Filter) Validate() error {
	if f.LastSeq != 0 && f.LastSeq < f.FirstSeq {
		return fmt.Errorf("%w: sequence range %d-%d is reversed", ErrInvalidOptions, f.FirstSeq, f.LastSeq)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return fmt.Errorf("%w: --until must be after --since", ErrInvalidOptions)
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
	Filter Filter
	DryRun bool // list only: publish nothing, delete nothing
	Keep   bool // re-publish but do not delete the dead letters
	Limit  int  // stop after this many matches (0: no limit)
	// FetchWait bounds the wait for the next batch of the stream (default
	// 2s); Replay ends early only if the stream is truncated meanwhile.
	FetchWait time.Duration
}

// Outcome is what happened to one matched dead letter.
type Outcome struct {
	Replayed bool  // re-published and acknowledged by its original stream
	Deleted  bool  // removed from the dead-letter stream
	Err      error // why not, wrapping one of the sentinels
}

// Report counts one Replay.
type Report struct {
	Scanned  int // dead letters read
	Matched  int // of which the filter selected
	Replayed int
	Deleted  int
	Skipped  int // not jetsink dead letters (ErrNotDeadLetter)
	Failed   int // re-publish or delete failed
}

// Replay walks the dead-letter stream (see the package doc) and calls each,
// if not nil, for every matched letter with its outcome (a zero Outcome in
// a dry run). It returns an error wrapping ErrInvalidOptions for bad
// options, the error of reading the stream, or ctx's error; a failed
// re-publish or delete is reported through each and counted in
// Report.Failed, and Replay goes on with the next letter.
func Replay(ctx context.Context, js jetstream.JetStream, o Options, each func(*Letter, Outcome)) (Report, error) {
	var rep Report
	if o.Stream == "" {
		return rep, fmt.Errorf("%w: no dead-letter stream given", ErrInvalidOptions)
	}
	if err := o.Filter.Validate(); err != nil {
		return rep, err
	}
	if o.FetchWait <= 0 {
		o.FetchWait = 2 * time.Second
	}
	stream, err := js.Stream(ctx, o.Stream)
	if err != nil {
		return rep, fmt.Errorf("dlq: dead-letter stream %s: %w", o.Stream, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return rep, fmt.Errorf("dlq: dead-letter stream %s: %w", o.Stream, err)
	}
	last := info.State.LastSeq
	if o.Filter.LastSeq != 0 {
		last = min(last, o.Filter.LastSeq)
	}
	if info.State.Msgs == 0 || last < max(info.State.FirstSeq, o.Filter.FirstSeq) {
		return rep, nil
	}
	occ := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	switch {
	case o.Filter.FirstSeq > info.State.FirstSeq:
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, o.Filter.FirstSeq
	case !o.Filter.Since.IsZero():
		since := o.Filter.Since
		occ.DeliverPolicy, occ.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	oc, err := js.OrderedConsumer(ctx, o.Stream, occ)
	if err != nil {
		return rep, fmt.Errorf("dlq: read %s: %w", o.Stream, err)
	}
	for {
		batch, err := oc.Fetch(256, jetstream.FetchMaxWait(o.FetchWait))
		if err != nil {
			return rep, fmt.Errorf("dlq: read %s: %w", o.Stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				return rep, fmt.Errorf("dlq: read %s: %w", o.Stream, err)
			}
			if meta.Sequence.Stream > last {
				return rep, nil
			}
			rep.Scanned++
			l, err := letter(meta, m.Headers(), m.Data())
			if err != nil {
				rep.Skipped++
				continue
			}
			if !o.Filter.Match(l) {
				continue
			}
			rep.Matched++
			var out Outcome
			if !o.DryRun {
				out = replayOne(ctx, js, stream, l, o.Keep)
				if out.Replayed {
					rep.Replayed++
				}
				if out.Deleted {
					rep.Deleted++
				}
				if out.Err != nil {
					rep.Failed++
				}
			}
			if each != nil {
				each(l, out)
			}
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			if meta.Sequence.Stream == last || (o.Limit > 0 && rep.Matched >= o.Limit) {
				return rep, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return rep, fmt.Errorf("dlq: read %s: %w", o.Stream, err)
		}
		if got == 0 {
			// Nothing more within FetchWait: the rest up to last was
			// deleted meanwhile (or by the filter's start).
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			return rep, nil
		}
	}
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
// deletes it from the dead-letter stream unless keep.
func replayOne(ctx context.Context, js jetstream.JetStream, dlq jetstream.Stream, l *Letter, keep bool) Outcome {
	ack, err := js.PublishMsg(ctx, l.Msg())
	if err != nil {
		return Outcome{Err: fmt.Errorf("%w: dead letter %d to %s: %w", ErrPublish, l.Seq, l.Subject, err)}
	}
	if ack.Stream != l.Stream {
		return Outcome{Err: fmt.Errorf("%w: dead letter %d to %s was stored by stream %s, not %s; it stays in the dead-letter stream",
			ErrWrongStream, l.Seq, l.Subject, ack.Stream, l.Stream)}
	}
	out := Outcome{Replayed: true}
	if keep {
		return out
	}
	if err := dlq.DeleteMsg(ctx, l.Seq); err != nil {
		out.Err = fmt.Errorf("%w: dead letter %d: %w", ErrDelete, l.Seq, err)
		return out
	}
	out.Deleted = true
	return out
}

package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrSequenceRestarted is what Refused wraps when, with Config.StoredSeq
// set (exactly-once), the stream's sequence starts again below rows the
// table already holds for it: the stream was deleted and re-created.
// Exactly-once keys rows by (stream, stream_seq), so the new events would
// conflict with old rows and be skipped as duplicates. Run then takes
// nothing from the stream (what it took before still reaches the table)
// and looks again every 30 s; the stream's events wait in it, within its
// own limits (max_age, max_msgs, max_bytes).
var ErrSequenceRestarted = errors.New("stream sequence restarted under stored rows")

// seqGuard is what the consumer knows of the stream's sequence, for
// Config.StoredSeq. Only Run's goroutine (and New, before it) uses the
// plain fields; seenMax and seenEnd are written by the delivery goroutine.
type seqGuard struct {
	// created is the stream's creation time as the last accepted check saw
	// it (zero before the first); a different one means the stream was
	// re-created since.
	created time.Time
	// refused is why the last check refused the stream (nil: it accepted);
	// refusedLogged is when that was last logged.
	refused       atomic.Pointer[error]
	refusedLogged time.Time
	// seenMax is the highest stream sequence of any message delivered, and
	// seenEnd the highest such sequence + its pending count: the end of the
	// stream as of that delivery. Rows up to seenMax may still be on their
	// way to the table after the stream is deleted; a stream re-created
	// starts past seenEnd. Only the delivery goroutine (one at a time)
	// raises them.
	seenMax, seenEnd atomic.Uint64
	// gen counts disconnects and reconnects; checkedGen is gen as it was
	// when the last accepted check began. While they differ, the stream
	// may have been replaced unseen.
	gen, checkedGen atomic.Uint64
}

// errNotVerified is push's error for a message Run could not confirm comes
// from the stream it checked; the message is nak'ed and the session ends.
var errNotVerified = errors.New("message not verified against the checked stream")

// replacedKey is the consumer's metadata key that marks its stream (by
// creation time, RFC 3339) as one that replaced a stream jetsink had
// consumed into the table, so that a restart still judges it as re-created.
const replacedKey = "jetsink_stream_replaced"

// refusedRecheck is how often Run looks again at a refused stream (a
// variable so that tests can shorten it; New copies it).
var refusedRecheck = 30 * time.Second

// storedSeqTimeout bounds one Config.StoredSeq call.
const storedSeqTimeout = 30 * time.Second

// storedSeq calls Config.StoredSeq for the stream, within storedSeqTimeout.
func (c *Consumer) storedSeq(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, storedSeqTimeout)
	defer cancel()
	return c.cfg.StoredSeq(ctx, c.cfg.Stream)
}

// continueSeq is the first sequence for a stream that has to be created:
// past every message of a stream of that name this process has seen (the
// sink may still ack those, and an ack names a stream sequence) and, with
// Config.StoredSeq, past every row the table holds for it. 0 when neither
// asks for more than the server's default.
func (c *Consumer) continueSeq(ctx context.Context) (uint64, error) {
	end := c.seq.seenEnd.Load()
	if c.cfg.StoredSeq != nil {
		stored, err := c.storedSeq(ctx)
		if err != nil {
			return 0, fmt.Errorf("create stream %s: it must start past the sequences the table holds for it (exactly-once mode), read from PostgreSQL, which needs to be up to create a stream: %w", c.cfg.Stream, err)
		}
		end = max(end, stored)
	}
	if end == 0 {
		return 0, nil
	}
	return end + 1, nil
}

// createStream creates the stream (file storage, Subjects, and the limits,
// replicas and duplicate window of the nats.stream_* keys) or updates the
// one there: its subjects, and what those keys set (streamLimitsDiff),
// leaving the rest of its configuration as its owner set it. A new stream starts
// past the sequences that continueSeq knows of (FirstSeq), so that a deleted
// stream re-created does not reuse them: no late ack of an old message can
// then settle a new one, and in exactly-once mode no new row collides with
// an old one.
func (c *Consumer) createStream(ctx context.Context) (jetstream.Stream, error) {
	cfg := &c.cfg
	existing, err := c.js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		first, err := c.continueSeq(ctx)
		if err != nil {
			return nil, err
		}
		sc := jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Storage: jetstream.FileStorage, FirstSeq: first,
			MaxAge: cfg.StreamMaxAge, MaxBytes: cfg.StreamMaxBytes, Replicas: cfg.StreamReplicas, Duplicates: cfg.StreamDuplicateWindow}
		stream, err := CreateStream(ctx, c.js, sc)
		if err == nil {
			if first > 0 {
				c.log.Warn("created stream continuing the sequence of the one before", "first_seq", first)
			}
			return stream, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, err
		}
		// Someone else created it just now; checkSeq judges its sequences.
		existing, err = c.js.Stream(ctx, cfg.Stream)
		if err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	// An update replaces the whole configuration: start from the stream's own,
	// or every field left out (max_age, max_bytes, the duplicate window...)
	// would go back to its default.
	sc := existing.CachedInfo().Config
	dropped, added := subjectsDiff(sc.Subjects, cfg.Subjects)
	var limits []string
	if sc.Sealed {
		// The server zeroes a sealed stream's max_age, whatever an update
		// says: the limits would differ, and be "set", at every start.
		if !c.sealedNoted.Swap(true) {
			c.log.Warn(sealedMessage(cfg.Stream))
		}
	} else {
		limits = streamLimitsDiff(&sc, cfg)
	}
	if len(dropped) == 0 && len(added) == 0 && len(limits) == 0 {
		return existing, nil
	}
	if len(limits) > 0 {
		// Said at Warn: a lower limit deletes events at once, stored by
		// jetsink or not (check warns of it before).
		c.log.Warn("setting the stream's limits (nats.stream_max_age, nats.stream_max_bytes, nats.stream_replicas, nats.stream_duplicate_window)",
			"limits", strings.Join(limits, ", "))
		sc = withStreamKeys(sc, cfg)
		if len(dropped) == 0 && len(added) == 0 {
			return c.js.UpdateStream(ctx, sc)
		}
	}
	// Said, since a subject dropped here is no longer stored: its
	// publishers' messages are refused or, published without JetStream,
	// lost. (check warns of it before.)
	level, msg := slog.LevelInfo, "adding nats.subjects to the stream's subjects (create_stream: true)"
	if len(dropped) > 0 {
		level, msg = slog.LevelWarn, "setting the stream's subjects to nats.subjects (create_stream: true); messages published to "+
			"the subjects dropped are no longer stored"
	}
	c.log.Log(ctx, level, msg, "from", strings.Join(sc.Subjects, ","), "to", strings.Join(cfg.Subjects, ","),
		"dropped", strings.Join(dropped, ","))
	sc.Subjects = cfg.Subjects
	return c.js.UpdateStream(ctx, sc)
}

// sealedMessage says what a sealed event stream (nats stream seal) means
// for jetsink, as check and run say it.
func sealedMessage(stream string) string {
	return "stream " + stream + " is sealed (nats stream seal): it takes no new events, and keeps those it has for good (no max_age); " +
		"jetsink consumes what is left and leaves its limits alone (nats.stream_max_age, nats.stream_max_bytes, nats.stream_replicas, " +
		"nats.stream_duplicate_window)"
}

// withStreamKeys is sc with what nats.stream_max_age, nats.stream_max_bytes,
// nats.stream_replicas and nats.stream_duplicate_window set (each where
// set), as run applies them to a stream there: the duplicate window cut to
// max_age, since the server refuses a longer one (and cuts one it makes
// at creation the same way).
func withStreamKeys(sc jetstream.StreamConfig, cfg *Config) jetstream.StreamConfig {
	sc.MaxAge = cmp.Or(cfg.StreamMaxAge, sc.MaxAge)
	sc.MaxBytes = cmp.Or(cfg.StreamMaxBytes, sc.MaxBytes)
	sc.Replicas = cmp.Or(cfg.StreamReplicas, sc.Replicas)
	sc.Duplicates = cmp.Or(cfg.StreamDuplicateWindow, sc.Duplicates)
	if sc.MaxAge != 0 {
		sc.Duplicates = min(sc.Duplicates, sc.MaxAge)
	}
	return sc
}

// streamLimitsDiff describes the settings of sc that nats.stream_max_age,
// nats.stream_max_bytes, nats.stream_replicas and
// nats.stream_duplicate_window, where set, change ("max_age 0s ->
// 168h0m0s"); none when they are not set or sc has them already.
func streamLimitsDiff(sc *jetstream.StreamConfig, cfg *Config) []string {
	var out []string
	want := withStreamKeys(*sc, cfg)
	if want.MaxAge != sc.MaxAge {
		out = append(out, fmt.Sprintf("max_age %s -> %s", sc.MaxAge, want.MaxAge))
	}
	if want.Duplicates != sc.Duplicates {
		cut := ""
		if cfg.StreamDuplicateWindow > want.Duplicates {
			cut = " (nats.stream_duplicate_window cut to the stream's max_age)"
		}
		out = append(out, fmt.Sprintf("duplicate_window %s -> %s%s", sc.Duplicates, want.Duplicates, cut))
	}
	if want.MaxBytes != sc.MaxBytes {
		out = append(out, fmt.Sprintf("max_bytes %d -> %d", sc.MaxBytes, want.MaxBytes))
	}
	if max(want.Replicas, 1) != max(sc.Replicas, 1) {
		out = append(out, fmt.Sprintf("replicas %d -> %d", max(sc.Replicas, 1), want.Replicas))
	}
	return out
}

// subjectsDiff returns the subjects of have that no subject of want
// covers (events.a under events.> is not dropped), and those of want that
// have lacks, in their order.
func subjectsDiff(have, want []string) (dropped, added []string) {
	for _, h := range have {
		if !slices.ContainsFunc(want, func(w string) bool { return SubjectMatches(w, h) }) {
			dropped = append(dropped, h)
		}
	}
	for _, w := range want {
		if !slices.Contains(have, w) {
			added = append(added, w)
		}
	}
	return dropped, added
}

// checkSeq returns an error wrapping ErrSequenceRestarted when, with
// Config.StoredSeq set, the stream's messages would reuse sequences the
// table already holds rows for:
//   - the stream ends below the table's highest sequence for it, or
//   - the stream was re-created since the last accepted check (or, before
//     a restart, since the check that marked it in the consumer's metadata)
//     and starts at or below the table's highest sequence or the highest
//     one delivered of the stream before it.
//
// A refused stream is marked in the consumer's metadata (replacedKey).
// Other errors are for failing to ask (NATS or PostgreSQL unreachable).
func (c *Consumer) checkSeq(ctx context.Context) error {
	if c.cfg.StoredSeq == nil {
		return nil
	}
	gen := c.seq.gen.Load()
	// The table first: its rows are of events the stream held when they
	// were stored, so a stream read after it ends at or past them unless
	// it went back. Read the other way round, rows another instance of
	// the durable stored meanwhile, of events published after the
	// stream's info, passed for a stream restarted under them.
	stored, err := c.storedSeq(ctx)
	if err != nil {
		return err
	}
	stream, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", c.cfg.Stream, err)
	}
	info := stream.CachedInfo()
	marked, err := c.markedReplaced(ctx, info.Created)
	if err != nil {
		return err
	}
	// A stream that ends below a sequence delivered before went back,
	// whatever its creation time says: restored from a backup (see
	// sameStream). Rows up to that sequence may be on their way.
	replaced := marked || (!c.seq.created.IsZero() && !info.Created.Equal(c.seq.created)) ||
		info.State.LastSeq < c.seq.seenMax.Load()
	end := stored
	if replaced {
		end = max(stored, c.seq.seenMax.Load())
	}
	if err := restarted(c.cfg.Stream, info, stored, end, replaced); err != nil {
		if !marked {
			c.markRefused(ctx, info.Created)
		}
		return err
	}
	if marked {
		if err := c.markReplaced(ctx, info.Created, false); err != nil {
			c.log.Error("could not update the consumer's metadata", "key", replacedKey, "set", false, "err", err)
		}
	}
	c.seq.created = info.Created
	c.seq.checkedGen.Store(gen)
	return nil
}

// verify confirms, for push, that the stream is still the one checkSeq
// accepted (the same creation time): a session's first message, a
// consumer sequence that went back, or a reconnect since the check may
// mean the stream was replaced unseen. A replaced stream is checked again:
// refused (ErrSequenceRestarted), or accepted, and then errStreamChanged
// ends the session, so that nothing the client holds of the old stream is
// taken.
func (c *Consumer) verify(ctx context.Context) error {
	gen := c.seq.gen.Load()
	same, err := c.sameStream(ctx)
	if err != nil {
		return err
	}
	if same {
		c.seq.checkedGen.Store(gen)
		return nil
	}
	if err := c.checkSeq(ctx); err != nil {
		return err
	}
	return errStreamChanged
}

// errStreamChanged is verify's answer for a stream that was re-created and
// accepted: the session ends, and what the client holds of the old stream
// goes with it (its sequences may be the new stream's too).
var errStreamChanged = errors.New("stream re-created; subscribing afresh")

// markedReplaced reports whether the consumer's metadata marks the stream
// created at created as a replacement.
func (c *Consumer) markedReplaced(ctx context.Context, created time.Time) (bool, error) {
	meta, _, err := c.currentMeta(ctx)
	if err != nil {
		return false, err
	}
	v, ok := meta[replacedKey]
	return ok && v == replacedMark(created), nil
}

// replacedMark is replacedKey's value for the stream created at created.
func replacedMark(created time.Time) string { return created.UTC().Format(time.RFC3339Nano) }

// markReplaced sets (on) or clears the consumer's replacedKey.
func (c *Consumer) markReplaced(ctx context.Context, created time.Time, on bool) error {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	return c.updateMeta(ctx, func(meta map[string]string) {
		if on {
			meta[replacedKey] = replacedMark(created)
		} else {
			delete(meta, replacedKey)
		}
	})
}

// markRefused marks the stream created at created, which checkSeq refused,
// in the consumer's metadata. A consumer gone with the stream it was on
// (checkSeq may run before Run makes it again: after a reconnect, or a lost
// pull connection) is made again, with the mark, on the new stream, from
// which Run takes nothing while it is refused: unmarked, the refusal would
// live in this process alone, and a restart would take the stream, once
// refilled past the stored rows, for one never consumed. A failure is
// logged; the next check (refusedRecheck) tries again.
func (c *Consumer) markRefused(ctx context.Context, created time.Time) {
	err := c.markReplaced(ctx, created, true)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		// Made with the mark: no moment without it for a crash or
		// another instance to meet.
		err = c.ensureConsumer(ctx, map[string]string{replacedKey: replacedMark(created)})
	}
	if err != nil {
		c.log.Error("could not mark the refused stream in the consumer's metadata; a restart before it is would not know it as re-created",
			"key", replacedKey, "err", err)
	}
}

// Refused returns why the stream is refused (wrapping ErrSequenceRestarted),
// or nil. Safe from any goroutine; the readiness check reports it.
func (c *Consumer) Refused() error {
	if p := c.seq.refused.Load(); p != nil {
		return *p
	}
	return nil
}

// restarted returns an error wrapping ErrSequenceRestarted when the stream
// info describes ends below stored, or, replaced (re-created since it was
// last seen), starts at or below end.
func restarted(name string, info *jetstream.StreamInfo, stored, end uint64, replaced bool) error {
	st := info.State
	next := st.LastSeq + 1 // the lowest sequence a consumer can still be delivered
	if st.Msgs > 0 {
		next = st.FirstSeq
	}
	if st.LastSeq >= stored && (!replaced || next > end) {
		return nil
	}
	end = max(end, stored)
	return fmt.Errorf("%w: nats.stream %s now holds sequences %d..%d (created %s), but sequences up to %d are stored or on their way: "+
		"in exactly-once mode its events would be skipped as duplicates of older rows. Re-create the stream with "+
		"first_seq %d, or point postgres.table at a new table (with nats.create_stream, jetsink re-creates a missing stream that way)",
		ErrSequenceRestarted, name, st.FirstSeq, st.LastSeq, info.Created.UTC().Format(time.RFC3339), end, end+1)
}

// sameStream reports whether the stream is the one the last checkSeq
// accepted (the same creation time, and not ending below a sequence
// delivered before), and logs when it is not. A stream restored from a
// backup (nats stream restore, a server started on an older copy of its
// store) keeps its creation time while its sequence goes back: checkSeq
// takes it for a replaced stream, and refuses it (it starts below what
// was delivered) until it is re-created past the stored rows, before its
// new events reuse their sequences.
func (c *Consumer) sameStream(ctx context.Context) (bool, error) {
	info, err := c.streamInfo(ctx)
	if err != nil {
		return false, err
	}
	if c.seq.created.IsZero() || !info.Created.Equal(c.seq.created) {
		c.log.Warn("stream re-created; checking its sequence", "created", info.Created)
		return false, nil
	}
	if seen := c.seq.seenMax.Load(); info.State.LastSeq < seen {
		c.log.Warn("the stream ends below a sequence delivered before (restored from a backup?); checking its sequence",
			"last_seq", info.State.LastSeq, "delivered_seq", seen)
		return false, nil
	}
	return true, nil
}

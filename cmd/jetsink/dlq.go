package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/dlq"
	"github.com/jetsink/jetsink/pipeline"
)

func newDLQCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Work with dead letters: replay them after a fix (replay --dry-run lists them)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newDLQReplayCmd())
	return cmd
}

func newDLQReplayCmd() *cobra.Command {
	var (
		cf                   configFlags
		stream, since, until string
		seqRange             string
		f                    dlq.Filter
		o                    dlq.Options
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Re-publish dead letters to their original subjects (after the cause is fixed)",
		Long: `Re-publish dead letters to the subjects they came from, so that jetsink
stores them once whatever refused them (the mapping, the table, a constraint)
has been fixed.

Dead letters are read from the dead-letter stream in order, up to its last
message when the command starts: the stream capturing
nats.dead_letter_subject, and only that subject's messages in it (a stream
may hold the letters of several jetsinks), or all of --dlq-stream. Each one
the filters select is published to its Jetsink-Subject with its original
body and headers, minus the Jetsink-* headers, and with Nats-Msg-Id
"<original id>:replay:<the dead letter's Nats-Msg-Id>" so that the event
stream's duplicate window does not swallow it. After the event stream
acknowledges it (and only if that is the stream it came from) the dead
letter is deleted from the dead-letter stream, unless --keep; a failed
delete is retried a few times.

Letters another durable consumer wrote (Jetsink-Consumer: another jetsink
reading the same stream) are left for that jetsink's replay; --written-by
NAME replays those of consumer NAME instead (after renaming nats.consumer,
the letters written under its old name). Letters that name no consumer
(no Jetsink-Consumer: a jetsink from before 2026-12-03 wrote them) may be
another jetsink's on the same stream, whose cause may not be fixed: they
are left and counted too, unless --include-unnamed (--dry-run
--include-unnamed lists them; --subject, --seq or --since pick this
jetsink's). A letter is
published only if the durable consumer nats.consumer is on its
stream and its filter takes the letter's subject (--set nats.consumer=NAME
for another): otherwise nothing would read the event, and a stream with
interest retention would drop it at once although it acknowledges it. Nor
is it published to a subject its stream does not capture (unless the stream
sources others), to one its stream's subject_transform would change again
(Jetsink-Subject is the subject as stored, after the transform: events.v2.x
would be stored as events.v2.v2.x), or to one JetStream's API, the system
account or inboxes serve ($JS.API..., $JS.ACK..., $SYS..., _INBOX...):
anyone allowed to publish to the dead-letter subject can write a letter, and
the replay publishes with your credentials. Nor is it published into a
stream that drops a subject's oldest message to store a new one
(max_msgs_per_subject, unless with discard new and
discard_new_per_subject): each replayed event would push out the oldest of
its subject, perhaps one jetsink has not read yet (the letter replayed just
before it), while the letters are deleted; --allow-max-msgs-per-subject
replays into it all the same. Nor is it published into a stream with
max_msgs or max_bytes and discard old where it would push out an event
nats.consumer (or, unset, the consumer the letter names) has not acked
yet: the replay reads the stream's state and that consumer's ack floor
(under max_bytes also the sizes of the oldest events it would push out, at
most 256, which needs STREAM.MSG.GET), again before each letter near the
limit, since publishers fill the stream meanwhile: one that fills it
between that reading and the publish can still push out an unread event;
without a reader, no message may be pushed out;
--allow-discard-old replays into it all the same. Nor into a stream whose config the user may
not read (STREAM.INFO), or that does not answer: the replay cannot tell
what it would do with the event. Such a letter stays, is reported, and the
replay goes on; --dry-run says so too. Nor, whatever the flags, is a
letter of a key-value bucket's event ($KV.<bucket>.<key>, or with a
KV-Operation header): it would be written into the bucket again, a delete
or purge removing the key's current value, a put standing over a newer
one. It stays, named at the end: put back by hand what the bucket should
hold (nats kv put), then delete the letter. Nor is a letter of an object
store's event ($O.<bucket>.C.<nuid>, a chunk, or $O.<bucket>.M.<name>, its
meta): a chunk would be added to its object's data, which would no longer
match its digest, a meta would stand over the object's newer one. It
stays, named at the end: put the object again by hand (nats object put),
then delete the letter.
Every consumer of the stream gets the replayed event, not jetsink alone.
A stream with max_age deletes its oldest events, read or not, when old,
and one with max_msgs or max_bytes (discard old) when publishers fill it,
replayed ones as any other: jetsink check warns of such limits.

Every replay of a letter carries the same Nats-Msg-Id, and so do the two
dead letters one event may have, so within the event stream's duplicate
window (duplicate_window, 2 minutes by default) it is stored once however
often it is sent; after the window it is stored again, in exactly-once
mode too (a new stream sequence).

A failure before the acknowledgement leaves the dead letter in place; the
replay goes on with the next when the event is certainly not stored (the
stream refused it, or the server refused the user the subject). A
re-publish that gets no answer (the event stream may have stored it) is
sent again within the first three quarters of the letter's 30 s (the
rest is kept for deleting it). The replay stops, exit status 1, at a
letter it cannot settle for sure:
  - a letter whose re-publish never got an answer: its event may or may not
    be stored. Do not delete it; run the command again at once, within the
    window (the event is stored once either way), or check the event
    stream first.
  - a letter re-published but not deleted: it is both an event and a dead
    letter; delete it (nats stream rmm <dead-letter stream> <seq>) rather
    than replay it after the window. --keep leaves every replayed letter
    so, says so, and exits 0. A dead-letter stream that denies deletes is
    refused unless --keep.
A letter whose event another stream than the original stored (one the
original may source or mirror) stays too, named at the end, exit status 1,
but the replay goes on: check the original stream before you delete it.

On SIGINT or SIGTERM the dead letter under way is finished (re-published and
deleted, within 30 s) and the summary is printed; the exit status is 1 if
dead letters were left (0 if that letter was the last); a second signal
gives that letter up at once and exits with status 130.

--dry-run lists what would be replayed and changes nothing. Filters combine
(all must match); one given an empty value, or a list with an empty entry
(--code "$CODE" with CODE unset), is refused, exit status 2, rather than
taken for no filter. Exit status 1 if any replay or delete failed.`,
		Example: `  jetsink dlq replay --config jetsink.yaml --dry-run
  jetsink dlq replay --config jetsink.yaml --code constraint --since 2h
  jetsink dlq replay --config jetsink.yaml --stage decode --subject 'events.dev-1' --seq 100-250`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			now := time.Now()
			if f.Since, err = parseWhen(since, now); err != nil {
				return usageError{fmt.Errorf("--since: %w", err)}
			}
			if f.Until, err = parseWhen(until, now); err != nil {
				return usageError{fmt.Errorf("--until: %w", err)}
			}
			if f.FirstSeq, f.LastSeq, err = parseSeqRange(seqRange); err != nil {
				return usageError{fmt.Errorf("--seq: %w", err)}
			}
			o.Filter = f
			if err := f.Validate(); err != nil {
				return usageError{err}
			}
			if o.Limit < 0 { // before connecting, as every flag
				return usageError{fmt.Errorf("--limit %d: want 0 (all) or more", o.Limit)}
			}
			for _, c := range f.UnknownCodes() {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: --code %q is no code this jetsink writes (%s); only dead letters of another version could match it\n",
					c, strings.Join(pipeline.DeadLetterCodes(), ", "))
			}

			// The first signal stops before the next dead letter; the
			// one under way is finished under hard, which only a second
			// signal ends (see dlq.Replay).
			intake, hard, stop := signalStages(cmd, "stopping after the dead letter under way; a second signal gives it up",
				"giving up the dead letter under way")
			defer stop()
			nc, err := natsConnect(hard, cfg.NATS, "jetsink-dlq")
			if err != nil {
				if hard.Err() != nil {
					return fmt.Errorf("connect to nats.url: %w", context.Cause(hard))
				}
				return err
			}
			defer nc.Close()
			js, err := cfg.NATS.JetStream(nc)
			if err != nil {
				return err
			}
			o.Stream, o.Consumer = stream, cfg.NATS.Consumer
			if o.EventStream == "" {
				o.EventStream = cfg.NATS.Stream
			}
			if o.Stream == "" {
				lctx, lcancel := context.WithTimeout(intake, 10*time.Second)
				o.Stream, err = js.StreamNameBySubject(lctx, cfg.NATS.DeadLetterSubject)
				lcancel()
				if err != nil {
					return fmt.Errorf("find the stream capturing nats.dead_letter_subject %s (or pass --dlq-stream): %w", cfg.NATS.DeadLetterSubject, err)
				}
				o.Subject = cfg.NATS.DeadLetterSubject // this jetsink's letters
			}
			w := cmd.OutOrStdout()
			verb := "replay"
			if o.DryRun {
				verb = "would replay"
			}
			rep, err := dlq.Replay(intake, hard, js, o, func(l *dlq.Letter, out dlq.Outcome) {
				state := verb
				switch {
				case out.Err != nil && o.DryRun:
					state = "would fail: " + escapeControl(out.Err.Error())
				case out.Err != nil:
					state = "FAILED: " + escapeControl(out.Err.Error())
				case out.Deleted:
					state = "replayed, deleted"
				case out.Replayed:
					state = "replayed, kept"
				}
				// The headers are anyone's who may publish to the
				// dead-letter subject: shown, not written raw.
				fmt.Fprintf(w, "%d %s %s stage=%s code=%s sqlstate=%s from=%s:%d reason=%q: %s\n",
					l.Seq, l.Time.UTC().Format(time.RFC3339), shown(l.Subject), shown(l.Stage), shown(l.Code), shown(l.SQLState),
					shown(l.Stream), l.StreamSeq, l.Reason, state)
			})
			if o.DryRun {
				fmt.Fprintf(w, "%s: scanned %d, matched %d, would replay %d, would fail %d, %s%s, %d of other consumers' or streams'%s; dry run: nothing re-published or deleted\n",
					o.Stream, rep.Scanned, rep.Matched, rep.Matched-rep.Failed, rep.Failed, skipped(rep), markers(rep), rep.Others, unnamed(rep))
			} else {
				fmt.Fprintf(w, "%s: scanned %d, matched %d, replayed %d, deleted %d, %s%s, %d of other consumers' or streams'%s, failed %d\n",
					o.Stream, rep.Scanned, rep.Matched, rep.Replayed, rep.Deleted, skipped(rep), markers(rep), rep.Others, unnamed(rep), rep.Failed)
			}
			if rep.Unnamed > 0 {
				seqs := firstSeqs(rep.UnnamedLetters, rep.Unnamed)
				fmt.Fprintf(w, "left %d dead letters that name no consumer (%s %s): a jetsink from before 2026-12-03 wrote them, without Jetsink-Consumer, "+
					"and they may be another jetsink's on the same stream, whose cause may not be fixed; replayed, such a letter's event would reach that jetsink again "+
					"and be stored by this one (nats.consumer %s) too. List them with --dry-run --include-unnamed; replay them with --include-unnamed "+
					"once they are this jetsink's (--subject, --seq or --since pick them)\n",
					rep.Unnamed, o.Stream, seqs, o.Consumer)
			}
			// The letters of a store's events (dlq.ErrKeyValue,
			// dlq.ErrObjectStore) it did not replay, in the store's words.
			for _, r := range rep.Refusals() {
				seqs := firstSeqs(r.Letters, r.N)
				fmt.Fprintf(w, "refused %d dead letters of %s's events (%s %s): replayed, each would be written into its %s again, "+
					"%s; they stay: fix what refused them, "+
					"put back by hand what the %s should hold (%s), then delete them (nats stream rmm %s <seq>)\n",
					r.N, r.Store.Name, o.Stream, seqs, r.Store.Noun, r.Store.Harm, r.Store.Noun, r.Store.Restore, o.Stream)
			}
			// also names the letters re-published but not deleted, and
			// those whose event may be stored although they stay.
			also := func(err error) error { return err }
			if n := len(rep.Undeleted); n > 0 {
				seqs := seqList(rep.Undeleted)
				fmt.Fprintf(w, "re-published but NOT deleted, so both event and dead letter: %s %s; replaying them again after the event stream's duplicate window stores them twice: delete them (nats stream rmm %s <seq>)\n",
					o.Stream, strings.Join(seqs, " "), o.Stream)
				also = func(err error) error {
					return fmt.Errorf("%w; %d dead letters re-published but not deleted (%s sequences %s)", err, n, o.Stream, strings.Join(seqs, ", "))
				}
			}
			if n := len(rep.Unsure); n > 0 {
				seqs := seqList(rep.Unsure)
				fmt.Fprintf(w, "left in place although their event MAY be stored (no answer to the re-publish, or another stream stored it): %s %s; "+
					"do not delete them: check the event stream first; one whose re-publish got no answer may be replayed again now, within the event stream's duplicate window (stored once either way)\n",
					o.Stream, strings.Join(seqs, " "))
				before := also
				also = func(err error) error {
					return fmt.Errorf("%w; %d dead letters whose event may be stored (%s sequences %s)", before(err), n, o.Stream, strings.Join(seqs, ", "))
				}
			}
			if o.Keep && rep.Replayed > 0 {
				fmt.Fprintf(w, "--keep: the %d replayed dead letters stay in %s; replaying them again after the event stream's duplicate window stores their events twice\n",
					rep.Replayed, o.Stream)
			}
			// Replay's errors may quote a letter's headers (its subject,
			// its stream): escaped, as in the listing.
			switch cause := context.Cause(hard); {
			case errors.Is(cause, errAborted):
				return escapedError{also(cause)}
			case errors.Is(err, dlq.ErrInvalidOptions):
				return usageError{err}
			case errors.Is(err, dlq.ErrUnsettled):
				return escapedError{also(err)}
			case err != nil && intake.Err() != nil:
				return escapedError{also(fmt.Errorf("%w: the dead letters not reached stay in %s; run the command again to go on", context.Cause(intake), o.Stream))}
			case err != nil:
				return escapedError{also(err)}
			case rep.Failed > 0 && o.DryRun:
				return fmt.Errorf("%d of %d dead letters would not be replayed", rep.Failed, rep.Matched)
			case rep.Failed > 0:
				return escapedError{also(fmt.Errorf("%d of %d dead letters not replayed or not deleted; they stay in %s", rep.Failed, rep.Matched, o.Stream))}
			}
			return nil
		},
	}
	cf.registerNATS(cmd.Flags()) // not --stream, --table, --mode, --database-url: replay uses none
	fl := cmd.Flags()
	fl.StringVar(&stream, "dlq-stream", "", "dead-letter stream (default: the stream capturing nats.dead_letter_subject)")
	fl.StringSliceVar(&f.Codes, "code", nil, "only these Jetsink-Code values, e.g. constraint,invalid_json (repeatable)")
	fl.StringSliceVar(&f.Stages, "stage", nil, "only these stages: decode, sink, deliver (repeatable)")
	fl.StringVar(&f.Subject, "subject", "", "only original subjects matching this NATS pattern ('*' one token, '>' the rest)")
	fl.StringVar(&since, "since", "", "only dead letters parked since this time (RFC 3339) or this long ago (e.g. 2h)")
	fl.StringVar(&until, "until", "", "only dead letters parked before this time (RFC 3339) or this long ago")
	fl.StringVar(&seqRange, "seq", "", "only these dead-letter stream sequences: N, N-M or N-")
	fl.StringVar(&o.EventStream, "event-stream", "", "replay the dead letters of stream NAME's events (Jetsink-Stream; default nats.stream); nats.consumer must read them there")
	fl.StringVar(&o.WrittenBy, "written-by", "", "replay the dead letters durable consumer NAME wrote (Jetsink-Consumer; default nats.consumer), e.g. its old name after a rename; nats.consumer must still read their events")
	fl.BoolVar(&o.IncludeUnnamed, "include-unnamed", false, "replay the dead letters that name no consumer too (no Jetsink-Consumer: a jetsink from before 2026-12-03 wrote them; they may be another jetsink's on the same stream)")
	fl.IntVar(&o.Limit, "limit", 0, "stop after this many dead letters (0: all)")
	fl.BoolVar(&o.DryRun, "dry-run", false, "list what would be replayed; publish and delete nothing")
	// A filter given an empty value ("--code $CODE" with CODE unset) is
	// no filter at all, and would replay every letter.
	for _, name := range []string{"dlq-stream", "code", "stage", "subject", "since", "until", "seq", "event-stream", "written-by"} {
		f := fl.Lookup(name)
		_, list := f.Value.(pflag.SliceValue)
		f.Value = nonEmpty{Value: f.Value, list: list}
		if list {
			// pflag takes "[]" for no default only from its own slice
			// values: --help would say "(default [])".
			f.DefValue = ""
		}
	}
	fl.BoolVar(&o.AllowMaxMsgsPerSubject, "allow-max-msgs-per-subject", false, "replay into an event stream that drops a subject's oldest message to store a new one (max_msgs_per_subject with discard old): a replayed event may be dropped before jetsink reads it, its letter deleted")
	fl.BoolVar(&o.AllowDiscardOld, "allow-discard-old", false, "replay into an event stream with max_msgs or max_bytes and discard old even where a replayed event pushes out one jetsink has not read, its letter deleted")
	fl.BoolVar(&o.Keep, "keep", false, "re-publish but keep the dead letters in their stream (replayed again after the duplicate window, they are stored twice)")
	return cmd
}

// nonEmpty is a flag's value that refuses to be set to an empty or blank
// value, or, for a list (list), one with an empty or blank entry (a,,b):
// pflag takes "" for no value, and a filter flag given one, from a variable
// left unset, would select every dead letter instead of none. The flag's
// type, and so its help, is its Value's.
type nonEmpty struct {
	pflag.Value
	list bool
}

func (v nonEmpty) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("empty (a variable left unset?): give a value, or leave the flag out")
	}
	if v.list {
		// As pflag reads a list: CSV, one record.
		entries, err := csv.NewReader(strings.NewReader(s)).Read()
		if err != nil {
			return err
		}
		if slices.ContainsFunc(entries, func(e string) bool { return strings.TrimSpace(e) == "" }) {
			return errors.New("an entry of the list is empty: give values, or leave the flag out")
		}
	}
	return v.Value.Set(s)
}

// shown is a dead letter's header value as the listing prints it: as it
// is when it is valid UTF-8 of printable characters other than space and
// '"' (a subject, a stage, a code), else quoted, with Go's escapes (%q). A
// letter is anyone's who may publish to the dead-letter subject, and a
// terminal escape in a header must not reach the terminal.
func shown(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || r == ' ' || r == '"' }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// escapeControl is s with each character that is not printable (a control
// character, a byte of invalid UTF-8) but for a line feed written as a Go
// escape, \x1b for ESC: for text that may quote a dead letter's headers.
func escapeControl(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r) || r == '\n':
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// escapedError is an error whose text is escapeControl's of err's.
type escapedError struct{ err error }

func (e escapedError) Error() string { return escapeControl(e.err.Error()) }
func (e escapedError) Unwrap() error { return e.err }

// skipped is the summary's count of the messages replay skipped, naming
// the sequences of the first few: "skipped 12 (not dead letters, without
// Jetsink-Subject or Jetsink-Stream: 4, 9, ... and 2 more)".
func skipped(rep dlq.Report) string {
	if rep.Skipped == 0 {
		return "skipped 0 (not dead letters)"
	}
	return fmt.Sprintf("skipped %d (not dead letters, without %s or %s: %s)", rep.Skipped, consumer.HeaderSubject, consumer.HeaderStream,
		firstSeqs(rep.NotLetters, rep.Skipped))
}

// markers is the summary's count of the server's subject delete markers
// replay passed over, "" when none: ", passed over 2 subject delete
// markers (the server's, where letters aged out)". Not skipped messages:
// nobody needs to look at them.
func markers(rep dlq.Report) string {
	if rep.Markers == 0 {
		return ""
	}
	return fmt.Sprintf(", passed over %d subject delete markers (the server's, where letters aged out)", rep.Markers)
}

// unnamed is the summary's count of the letters naming no consumer that
// replay left (dlq.Report.Unnamed), "" when none: ", left 2 naming no
// consumer". A line after the summary says what they are.
func unnamed(rep dlq.Report) string {
	if rep.Unnamed == 0 {
		return ""
	}
	return fmt.Sprintf(", left %d naming no consumer", rep.Unnamed)
}

// firstSeqs writes the first few sequences of n letters: "4, 9, 12 and 2
// more".
func firstSeqs(first []uint64, n int) string {
	s := strings.Join(seqList(first), ", ")
	if more := n - len(first); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

// seqList formats dead-letter sequences.
func seqList(seqs []uint64) []string {
	out := make([]string, len(seqs))
	for i, seq := range seqs {
		out[i] = strconv.FormatUint(seq, 10)
	}
	return out
}

// parseWhen reads an RFC 3339 time or a duration before now; "" is zero.
// A negative duration is an error: it would be a time after now, which
// every dead letter is parked before (--until -1h would select them all).
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q is a negative duration: give a positive one, meaning that long ago (2h), or an RFC 3339 time", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither a duration (2h) nor an RFC 3339 time", s)
	}
	return t, nil
}

// parseSeqRange reads N, N-M or N-.
func parseSeqRange(s string) (first, last uint64, err error) {
	if s == "" {
		return 0, 0, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	if first, err = strconv.ParseUint(a, 10, 64); err != nil || first == 0 {
		return 0, 0, fmt.Errorf("%q: want N, N-M or N- with N >= 1", s)
	}
	if !isRange {
		return first, first, nil
	}
	if b == "" {
		return first, 0, nil
	}
	if last, err = strconv.ParseUint(b, 10, 64); err != nil || last < first {
		return 0, 0, fmt.Errorf("%q: want N, N-M or N- with M >= N", s)
	}
	return first, last, nil
}

// natsConnectTimeout bounds natsConnect's dial and handshake (a variable
// for the tests, which tell a cut connect from one that timed out).
var natsConnectTimeout = 5 * time.Second

// natsConnect connects as name with the nats: section's URL and
// credentials. Its errors never quote the password or the credentials.
// Ending ctx ends a connect under way, and closes the connection's sockets.
// extra options go after those.
func natsConnect(ctx context.Context, cfg consumer.Config, name string, extra ...nats.Option) (*nats.Conn, error) {
	timeout := natsConnectTimeout
	opts := []nats.Option{nats.Name(name), nats.Timeout(timeout),
		nats.SetCustomDialer(&ctxDialer{ctx: ctx, Dialer: net.Dialer{Timeout: timeout}})}
	auth, err := cfg.AuthOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	opts = append(opts, extra...)
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, cfg.ConnectError(err)
	}
	return nc, nil
}

// ctxDialer dials under ctx, and closes what it dialed when ctx ends: a
// server that accepts and never answers would otherwise hold nats.Connect
// for its whole timeout, whatever the signals said.
type ctxDialer struct {
	ctx context.Context
	net.Dialer
}

func (d *ctxDialer) Dial(network, address string) (net.Conn, error) {
	c, err := d.DialContext(d.ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &ctxConn{Conn: c, stop: context.AfterFunc(d.ctx, func() { _ = c.Close() })}, nil
}

// ctxConn is a connection ctxDialer dialed. Closing it unregisters the
// close at ctx's end: each registration holds its connection until ctx
// ends, and a long publish that reconnects often would pile them up.
type ctxConn struct {
	net.Conn
	stop func() bool // context.AfterFunc's
}

func (c *ctxConn) Close() error {
	c.stop()
	return c.Conn.Close()
}

package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

func problemsText(ps []Problem) string {
	var b strings.Builder
	for _, p := range ps {
		if p.Warning {
			b.WriteString("warning: ")
		}
		b.WriteString(p.String())
		b.WriteString("\n")
	}
	return b.String()
}

func TestCheckReportsWithoutChangingAnything(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false

	// Nothing exists: the stream is an error, the dead-letter stream too.
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	text := problemsText(ps)
	if !strings.Contains(text, "stream "+cfg.Stream+" does not exist") || !strings.Contains(text, "no stream captures nats.dead_letter_subject") {
		t.Fatalf("problems:\n%s", text)
	}
	// Both fixes are commands natscli runs without asking (--defaults).
	if n := requireUnattended(t, "check", text); n != 2 {
		t.Errorf("%d nats stream add commands in the fixes, want 2 (the stream, the dead-letter stream):\n%s", n, text)
	}
	if _, err := js.Stream(ctx, cfg.Stream); err == nil {
		t.Fatal("Check created the stream")
	}

	// Stream and dead-letter stream exist, consumer not yet: warnings only.
	makeStream(t, ctx, js, cfg)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream + "_DLQ", Subjects: []string{cfg.DeadLetterSubject}}); err != nil {
		t.Fatal(err)
	}
	ps, err = Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if !p.Warning {
			t.Fatalf("unexpected error-level problem: %s", p)
		}
	}
	if !strings.Contains(problemsText(ps), "does not exist yet; run will create it") {
		t.Fatalf("problems:\n%s", problemsText(ps))
	}

	// A push consumer under the same name cannot be turned into ours.
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	ps, err = Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(problemsText(ps), "not an explicit-ack pull consumer") {
		t.Fatalf("problems:\n%s", problemsText(ps))
	}
}

// In exactly-once mode check compares the stream's end with the table's
// highest sequence; a running jetsink storing events published after check
// read the stream is no stream restarted under the rows.
func TestCheckStoredSeqAheadOfAnEarlierStreamInfo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	makeStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 5, 1, 0)
	cfg.StoredSeq = func(ctx context.Context, stream string) (uint64, error) {
		// The running instance: 10 more events published, and stored.
		var last uint64
		for g := range 10 {
			ack, err := js.Publish(ctx, subjectOf(cfg, 100+g, 1), []byte("{}"))
			if err != nil {
				return 0, err
			}
			last = ack.Sequence
		}
		return last, nil
	}
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if text := problemsText(ps); strings.Contains(text, "stream sequence against the table") {
		t.Fatalf("problems:\n%s", text)
	}
	// The check itself: a table past what the stream ever held is refused.
	cfg.StoredSeq = func(context.Context, string) (uint64, error) { return 1000, nil }
	ps, err = Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if text := problemsText(ps); !strings.Contains(text, "stream sequence against the table") {
		t.Fatalf("a table at 1000 over a stream at 15 not reported; problems:\n%s", text)
	}
}

func TestCreateStreamAlsoCreatesDeadLetterStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv) // create_stream: true
	newConsumer(t, ctx, cfg)
	js := jsFor(t, srv)
	name, err := js.StreamNameBySubject(ctx, cfg.DeadLetterSubject)
	if err != nil || name != cfg.Stream+"_DLQ" {
		t.Fatalf("stream for %s = %q, %v; want %s_DLQ", cfg.DeadLetterSubject, name, err, cfg.Stream)
	}
	// A second start finds it and creates nothing more.
	newConsumer(t, ctx, cfg)

	// With a long ack_wait, the duplicate window is twice that (the
	// server's default 2 minutes would store the dead letter of a poison
	// event that comes back after ack_wait twice), and check finds nothing
	// to say of the stream it made.
	cfg = testConfig(t, srv)
	cfg.AckWait = 90 * time.Second
	newConsumer(t, ctx, cfg)
	dlq, err := js.Stream(ctx, cfg.Stream+"_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	if sc := dlq.CachedInfo().Config; sc.Duplicates != 3*time.Minute || sc.MaxAge != 0 || sc.Retention != jetstream.LimitsPolicy ||
		sc.Storage != jetstream.FileStorage || sc.NoAck {
		t.Fatalf("dead-letter stream made with duplicate_window %s, max_age %s, retention %s, storage %s, no_ack %v; want 3m0s, 0, limits, file, false",
			sc.Duplicates, sc.MaxAge, sc.Retention, sc.Storage, sc.NoAck)
	}
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if text := problemsText(ps); strings.Contains(text, "dead-letter stream") {
		t.Fatalf("check of the dead-letter stream jetsink made:\n%s", text)
	}
}

// check, and New at start-up, warn of a dead-letter stream that would
// delete letters nobody has seen, answer no publish, or store one event's
// letter twice.
func TestCheckDeadLetterStreamSettings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.AckWait = 30 * time.Second
	cfg.CreateStream = false
	makeStream(t, ctx, js, cfg)
	for i, tc := range []struct {
		name string
		sc   jetstream.StreamConfig
		want string // "": no warning of the dead-letter stream
	}{
		{"defaults", jetstream.StreamConfig{}, ""},
		{"max_age", jetstream.StreamConfig{MaxAge: time.Hour}, "has max_age 1h0m0s"},
		{"max_msgs", jetstream.StreamConfig{MaxMsgs: 1000}, "has max_msgs 1000:"},
		{"max_bytes", jetstream.StreamConfig{MaxBytes: 1 << 20}, "has max_bytes 1048576:"},
		{"max_msgs_per_subject", jetstream.StreamConfig{MaxMsgsPerSubject: 10, Discard: jetstream.DiscardNew}, "has max_msgs_per_subject 10:"},
		{"discard new", jetstream.StreamConfig{MaxMsgs: 1000, MaxBytes: 1 << 20, MaxMsgsPerSubject: 10, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true}, ""},
		{"interest", jetstream.StreamConfig{Retention: jetstream.InterestPolicy}, "has interest retention"},
		{"work queue", jetstream.StreamConfig{Retention: jetstream.WorkQueuePolicy}, "has work-queue retention"},
		{"no_ack", jetstream.StreamConfig{NoAck: true}, "has no_ack set"},
		{"duplicate window", jetstream.StreamConfig{Duplicates: 10 * time.Second}, "has a duplicate_window of 10s, less than twice nats.ack_wait 30s"},
		// A copy redelivered after ack_wait is dead-lettered after its
		// wait in jetsink too: ack_wait alone is not enough.
		{"duplicate window = ack_wait", jetstream.StreamConfig{Duplicates: 30 * time.Second}, "has a duplicate_window of 30s, less than twice"},
		{"duplicate window = 2x ack_wait", jetstream.StreamConfig{Duplicates: time.Minute}, ""},
		// The event stream is on file.
		{"memory", jetstream.StreamConfig{Storage: jetstream.MemoryStorage}, "keeps its dead letters in memory"},
		// The event stream's events may be as large as max_payload.
		{"max_msg_size", jetstream.StreamConfig{MaxMsgSize: 4096}, "has max_msg_size 4096, less than the"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := tc.sc
			sc.Name = cfg.Stream + "_DLQ" + strconv.Itoa(i)
			sc.Subjects = []string{cfg.DeadLetterSubject}
			if _, err := js.CreateStream(ctx, sc); err != nil {
				t.Fatalf("create dead-letter stream: %v", err)
			}
			defer func() {
				if err := js.DeleteStream(ctx, sc.Name); err != nil {
					t.Fatal(err)
				}
			}()
			ps, err := Check(ctx, cfg, testLogger(t, nil))
			if err != nil {
				t.Fatal(err)
			}
			var dlq []Problem
			for _, p := range ps {
				if strings.Contains(p.Message, "dead-letter stream "+sc.Name) {
					dlq = append(dlq, p)
				}
			}
			switch {
			case tc.want == "" && len(dlq) > 0:
				t.Fatalf("check warns of a sound dead-letter stream:\n%s", problemsText(dlq))
			case tc.want != "" && (len(dlq) != 1 || !dlq[0].Warning || dlq[0].Fix == "" || !strings.Contains(dlq[0].Message, tc.want)):
				t.Fatalf("check's problems of the dead-letter stream:\n%s\nwant one warning with a fix saying %q", problemsText(dlq), tc.want)
			}
			// New logs the same at start-up.
			var buf syncBuffer
			c, err := New(ctx, cfg, testLogger(t, &buf))
			if err != nil {
				t.Fatal(err)
			}
			_ = c.Close(ctx)
			logged := strings.Contains(buf.String(), "dead-letter stream "+sc.Name)
			if logged != (tc.want != "") || tc.want != "" && !strings.Contains(buf.String(), tc.want) {
				t.Fatalf("New logged:\n%s\nwant a warning saying %q", buf.String(), tc.want)
			}
		})
	}
}

// With create_stream, a stream that is already there keeps the configuration
// its owner gave it; only its subjects follow nats.subjects. An update sends
// the whole configuration, so one built from jetsink's config alone would
// reset the limits and the duplicate window to their defaults.
func TestCreateStreamKeepsExistingConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv) // create_stream: true
	owner := jetstream.StreamConfig{
		Name:       cfg.Stream,
		Subjects:   []string{"old." + cfg.Stream + ".>"},
		Storage:    jetstream.FileStorage,
		MaxAge:     time.Hour,
		MaxBytes:   64 << 20,
		Duplicates: 5 * time.Second,
	}
	if _, err := js.CreateStream(ctx, owner); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	check := func(what string) {
		t.Helper()
		got := streamConfig(t, ctx, js, cfg.Stream)
		if !slices.Equal(got.Subjects, cfg.Subjects) || got.MaxAge != owner.MaxAge || got.MaxBytes != owner.MaxBytes || got.Duplicates != owner.Duplicates {
			t.Fatalf("%s: subjects %v, max_age %v, max_bytes %d, duplicates %v; want subjects %v and the rest as created (%v, %d, %v)",
				what, got.Subjects, got.MaxAge, got.MaxBytes, got.Duplicates, cfg.Subjects, owner.MaxAge, owner.MaxBytes, owner.Duplicates)
		}
	}
	newConsumer(t, ctx, cfg) // subjects differ: updated
	check("after the subjects changed")
	// Subjects the same: createStream sends no update (not observable here, the
	// stream info has no modification time); the configuration must still hold.
	newConsumer(t, ctx, cfg)
	check("after a second start")
}

// A stream that lets publishers delete events (allow_msg_ttl: Nats-TTL;
// allow_rollup_hdrs: Nats-Rollup) loses them whether jetsink has stored
// them or not: check warns of each, and New logs each, once (not again
// when Run re-creates the stream and consumer). A stream with neither
// gets neither.
func TestPublisherDeletionsWarned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	ttl := "allows per-message TTLs (allow_msg_ttl): an event published with a Nats-TTL header is deleted when it runs out whether jetsink has stored it or not"
	rollup := "allows roll-ups (allow_rollup_hdrs): an event published with a Nats-Rollup header"
	for _, tc := range []struct {
		name     string
		ttl, rup bool
	}{{"both", true, true}, {"ttl", true, false}, {"rollup", false, true}, {"neither", false, false}} {
		cfg := testConfig(t, srv)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects,
			AllowMsgTTL: tc.ttl, AllowRollup: tc.rup}); err != nil {
			t.Fatal(err)
		}
		w := checkText(t, ctx, cfg, false)
		c, logged := newLoggedConsumer(t, ctx, cfg)
		if err := c.ensureStream(ctx); err != nil { // as Run does at each re-creation: not said again
			t.Fatal(err)
		}
		for _, out := range []struct{ by, text string }{{"check", w}, {"run", logged.String()}} {
			if n := strings.Count(out.text, "stream "+cfg.Stream+" "+ttl); (n > 0) != tc.ttl || n > 1 {
				t.Errorf("%s: %s warns of allow_msg_ttl %d times, want it: %v, once:\n%s", tc.name, out.by, n, tc.ttl, out.text)
			}
			if n := strings.Count(out.text, "stream "+cfg.Stream+" "+rollup); (n > 0) != tc.rup || n > 1 {
				t.Errorf("%s: %s warns of allow_rollup_hdrs %d times, want it: %v, once:\n%s", tc.name, out.by, n, tc.rup, out.text)
			}
		}
	}
}

// An event stream with interest retention is warned of by check and by
// run at its start, once (not again at each re-creation, as before):
// deleting the durable, which jetsink's own fixes
// advise, deletes every event it has not acked (the server purges an
// interest stream whose last consumer goes) and stores nothing published
// meanwhile. Those fixes say, for such a stream, to add a holding
// consumer first. Before, only the dead-letter stream's retention was
// looked at.
func TestInterestRetentionWarned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	warning := "has interest retention: it keeps an event only until every consumer on the stream has acknowledged it"
	for _, tc := range []struct {
		name      string
		retention jetstream.RetentionPolicy
	}{{"interest", jetstream.InterestPolicy}, {"limits", jetstream.LimitsPolicy}} {
		interest := tc.retention == jetstream.InterestPolicy
		cfg := testConfig(t, srv)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Retention: tc.retention}); err != nil {
			t.Fatal(err)
		}
		hold := "nats consumer add " + cfg.Stream + " jetsink_hold --pull --ack explicit --deliver <the ack floor's stream sequence + 1> --replay instant --defaults " +
			"(nats consumer info " + cfg.Stream + " "
		w := checkText(t, ctx, cfg, false)
		c, logged := newLoggedConsumer(t, ctx, cfg)
		if err := c.ensureStream(ctx); err != nil { // as Run does at each re-creation: not said again
			t.Fatal(err)
		}
		for _, out := range []struct{ by, text string }{{"check", w}, {"run", logged.String()}} {
			if n := strings.Count(out.text, "stream "+cfg.Stream+" "+warning); (n > 0) != interest || n > 1 {
				t.Errorf("%s: %s warns of interest retention %d times, want it: %v, once:\n%s", tc.name, out.by, n, interest, out.text)
			}
			if got := strings.Contains(out.text, hold); got != interest {
				t.Errorf("%s: %s says to add a holding consumer: %v, want %v:\n%s", tc.name, out.by, got, interest, out.text)
			}
			requireUnattended(t, tc.name+": "+out.by, out.text)
		}
		// A durable of another kind: its fix (delete it) says to hold
		// the events first, in check and in New's refusal.
		foreign := cfg
		foreign.Consumer += "_foreign"
		if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: foreign.Consumer, AckPolicy: jetstream.AckNonePolicy}); err != nil {
			t.Fatal(err)
		}
		w = checkText(t, ctx, foreign, false)
		var refusal string
		for line := range strings.Lines(w) {
			if strings.Contains(line, "is not an explicit-ack pull consumer") {
				refusal = line
			}
		}
		if refusal == "" || strings.Contains(refusal, hold) != interest {
			t.Errorf("%s: check's fix for a durable of another kind says to add a holding consumer: %v, want %v:\n%s", tc.name, !interest, interest, w)
		}
		requireUnattended(t, tc.name+": check of a durable of another kind", w)
		_, err := New(ctx, foreign, testLogger(t, nil))
		if !errors.Is(err, ErrInvalidConfig) || strings.Contains(err.Error(), hold) != interest {
			t.Errorf("%s: New of a durable of another kind = %v; want ErrInvalidConfig, a holding consumer named: %v", tc.name, err, interest)
		}
		if err != nil {
			requireUnattended(t, tc.name+": New of a durable of another kind", err.Error())
		}
	}
}

// A key-value bucket's stream needs its roll-ups (a purge is one): check
// and New warn of what a purge deletes with a fix that keeps them on, not
// the --no-allow-rollup a plain stream is told of, which would break the
// bucket's purges.
func TestPublisherDeletionsOfAKeyValueBucket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	bucket := cfg.Stream
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64}); err != nil {
		t.Fatal(err)
	}
	cfg.Stream, cfg.Subjects, cfg.CreateStream = "KV_"+bucket, []string{"$KV." + bucket + ".>"}, false
	w := checkText(t, ctx, cfg, false)
	_, logged := newLoggedConsumer(t, ctx, cfg)
	for _, out := range []struct{ by, text string }{{"check", w}, {"run", logged.String()}} {
		if !strings.Contains(out.text, "stream KV_"+bucket+" is key-value bucket "+bucket+"'s, which allows roll-ups (allow_rollup_hdrs) for its purges: a purge of a key") ||
			!strings.Contains(out.text, "keep jetsink's lag short") {
			t.Errorf("%s does not warn of the bucket's purges:\n%s", out.by, out.text)
		}
		if strings.Contains(out.text, "--no-allow-rollup") || strings.Contains(out.text, "allows roll-ups (allow_rollup_hdrs): an event published") {
			t.Errorf("%s gives the bucket a plain stream's roll-up warning:\n%s", out.by, out.text)
		}
	}
	// Which streams are a bucket's: nats.go's and the CLI's, by name and
	// subjects (a mirror's by the name it mirrors).
	for _, tc := range []struct {
		sc     jetstream.StreamConfig
		bucket string
	}{
		{jetstream.StreamConfig{Name: "KV_cfg", Subjects: []string{"$KV.cfg.>"}}, "cfg"},
		{jetstream.StreamConfig{Name: "KV_cfg", Mirror: &jetstream.StreamSource{Name: "KV_origin"}}, "cfg"},
		{jetstream.StreamConfig{Name: "KV_cfg", Subjects: []string{"$KV.other.>"}}, ""},
		{jetstream.StreamConfig{Name: "KV_cfg", Subjects: []string{"$KV.cfg.>", "more.>"}}, ""},
		{jetstream.StreamConfig{Name: "KV_cfg"}, ""},
		{jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"$KV.cfg.>"}}, ""},
		{jetstream.StreamConfig{Name: "KV_", Subjects: []string{"$KV..>"}}, ""},
	} {
		b, ok := kvBucket(&tc.sc)
		if ok != (tc.bucket != "") || ok && b != tc.bucket {
			t.Errorf("kvBucket(%s %v mirror %v) = %q, %v; want %q", tc.sc.Name, tc.sc.Subjects, tc.sc.Mirror, b, ok, tc.bucket)
		}
		tc.sc.AllowRollup = true
		ps := publisherDeletions(&tc.sc)
		if len(ps) != 1 || strings.Contains(ps[0].Fix, "--no-allow-rollup") != (tc.bucket == "") {
			t.Errorf("%s %v: %+v; want one warning, --no-allow-rollup in its fix only for a plain stream", tc.sc.Name, tc.sc.Subjects, ps)
		}
	}
}

// The dead-letter stream's subjects edited away: nothing captures
// nats.dead_letter_subject, and create_stream cannot make <stream>_DLQ
// again, the name being in use. Run said "no stream captures the
// dead-letter subject (deleted?)" and then only the server's "stream name
// already in use"; check said run would create it. Both now say the
// stream is there with other subjects, and how to fix it.
func TestDeadLetterStreamSubjectsEditedAway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv) // create_stream: true
	c := newConsumer(t, ctx, cfg)
	dlq := cfg.Stream + "_DLQ"
	sc := streamConfig(t, ctx, js, dlq)
	sc.Subjects = []string{"elsewhere." + cfg.Stream}
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	want := "stream " + dlq + " exists but does not capture nats.dead_letter_subject " + cfg.DeadLetterSubject + " (it captures elsewhere." + cfg.Stream
	if e := checkText(t, ctx, cfg, true); !strings.Contains(e, want) || !strings.Contains(e, "nats stream edit "+dlq) {
		t.Errorf("check's errors do not say the dead-letter stream's subjects were edited:\n%s", e)
	}
	err := c.ensureDeadLetterStream(ctx) // as a dead letter that finds no stream does
	if !errors.Is(err, errDeadLetterStream) || !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || !strings.Contains(err.Error(), want) {
		t.Errorf("making the dead-letter stream again = %v; want it to say %q", err, want)
	}
}

// A sealed event stream (nats stream seal) with create_stream and
// nats.stream_max_age: the server zeroes a sealed stream's max_age, so
// run found max_age 0s -> 1h at every start, warned "setting the stream's
// limits" and sent an update that changed nothing; check said run would
// set it. Now both say the stream is sealed, once, and leave its limits.
func TestSealedStreamLimitsLeftAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv) // create_stream: true
	makeStream(t, ctx, js, cfg)
	publish(t, ctx, js, cfg, 2, 1, 0)
	sc := streamConfig(t, ctx, js, cfg.Stream)
	sc.Sealed = true
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	cfg.StreamMaxAge = time.Hour
	sealed := "stream " + cfg.Stream + " is sealed (nats stream seal)"
	if w := checkText(t, ctx, cfg, false); strings.Contains(w, "run will set") || strings.Contains(w, "deletes events past") || !strings.Contains(w, sealed) {
		t.Errorf("check of a sealed stream:\n%s", w)
	}
	c, log := newLoggedConsumer(t, ctx, cfg)
	if err := c.ensureStream(ctx); err != nil { // as Run does after a loss
		t.Fatal(err)
	}
	if l := log.String(); strings.Contains(l, "setting the stream's limits") || strings.Count(l, sealed) != 1 {
		t.Errorf("run on a sealed stream: want it said sealed once, no limits set:\n%s", l)
	}
	if got := streamConfig(t, ctx, js, cfg.Stream); !got.Sealed || got.MaxAge != 0 {
		t.Errorf("stream after run: sealed %v, max_age %v; want sealed, 0", got.Sealed, got.MaxAge)
	}
}

// nats.stream_max_age and stream_max_bytes bound a stream jetsink creates,
// and, set, one already there (check says so first); unset, they leave an
// existing stream's limits alone. check warns of limits that delete events
// whether jetsink stored them or not.
func TestCreateStreamLimits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv) // create_stream: true
	limits := func() (time.Duration, int64) {
		t.Helper()
		sc := streamConfig(t, ctx, js, cfg.Stream)
		if sc.Discard != jetstream.DiscardOld {
			t.Errorf("discard %v, want old", sc.Discard)
		}
		return sc.MaxAge, sc.MaxBytes
	}
	warnings := func() string { t.Helper(); return checkText(t, ctx, cfg, false) }

	cfg.StreamMaxAge, cfg.StreamMaxBytes = 2*time.Hour, 1<<30
	if w := warnings(); !strings.Contains(w, "deletes events past max_age 2h0m0s, max_bytes 1073741824 whether jetsink has stored them or not") {
		t.Errorf("check before the stream is created: no warning of its limits:\n%s", w)
	}
	newConsumer(t, ctx, cfg)
	if age, size := limits(); age != 2*time.Hour || size != 1<<30 {
		t.Fatalf("created with max_age %v, max_bytes %d; want 2h, 1 GiB", age, size)
	}

	cfg.StreamMaxAge = 3 * time.Hour // max_bytes as it is
	if w := warnings(); !strings.Contains(w, "run will set stream "+cfg.Stream+"'s max_age 2h0m0s -> 3h0m0s") {
		t.Errorf("check of a stream whose limit run will change says nothing of it:\n%s", w)
	}
	newConsumer(t, ctx, cfg)
	if age, size := limits(); age != 3*time.Hour || size != 1<<30 {
		t.Fatalf("updated to max_age %v, max_bytes %d; want 3h, 1 GiB", age, size)
	}

	cfg.StreamMaxAge = time.Minute // below the stream's 2 min duplicate window, which the server then refuses
	if w := warnings(); !strings.Contains(w, "max_age 3h0m0s -> 1m0s, duplicate_window 2m0s -> 1m0s") {
		t.Errorf("check of a stream whose duplicate window run will cut says nothing of it:\n%s", w)
	}
	newConsumer(t, ctx, cfg)
	if age, _ := limits(); age != time.Minute {
		t.Fatalf("updated to max_age %v, want 1m", age)
	}

	cfg.StreamMaxAge, cfg.StreamMaxBytes = 0, 0 // leave them
	newConsumer(t, ctx, cfg)
	if age, size := limits(); age != time.Minute || size != 1<<30 {
		t.Fatalf("unset keys changed the limits to max_age %v, max_bytes %d", age, size)
	}
	if w := warnings(); strings.Contains(w, "run will set") || !strings.Contains(w, "deletes events past max_age 1m0s, max_bytes 1073741824") {
		t.Errorf("check of a stream with limits of its own:\n%s", w)
	}

	// nats.stream_duplicate_window: set on the stream there, then left as
	// it is when unset (it stays within max_age, which the server needs).
	cfg.StreamDuplicateWindow = 10 * time.Second
	if w := warnings(); !strings.Contains(w, "run will set stream "+cfg.Stream+"'s duplicate_window 1m0s -> 10s") {
		t.Errorf("check of a stream whose duplicate window run will change says nothing of it:\n%s", w)
	}
	newConsumer(t, ctx, cfg)
	if d := streamConfig(t, ctx, js, cfg.Stream).Duplicates; d != 10*time.Second {
		t.Fatalf("updated to duplicate_window %v, want 10s", d)
	}
	cfg.StreamDuplicateWindow = 5 * time.Minute // past the stream's max_age, 1m, which the server refuses
	if w := warnings(); !strings.Contains(w, "duplicate_window 10s -> 1m0s (nats.stream_duplicate_window cut to the stream's max_age)") {
		t.Errorf("check of a duplicate window run will cut to the stream's max_age says nothing of it:\n%s", w)
	}
	newConsumer(t, ctx, cfg)
	if d := streamConfig(t, ctx, js, cfg.Stream).Duplicates; d != time.Minute {
		t.Fatalf("updated to duplicate_window %v, want the stream's max_age, 1m", d)
	}
	cfg.StreamDuplicateWindow = 0
	newConsumer(t, ctx, cfg)
	if d := streamConfig(t, ctx, js, cfg.Stream).Duplicates; d != time.Minute {
		t.Fatalf("an unset nats.stream_duplicate_window changed the stream's to %v", d)
	}
}

// A stream jetsink creates has nats.stream_duplicate_window, or the
// server's default (2 minutes) when it is unset.
func TestCreateStreamDuplicateWindow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	for _, w := range []time.Duration{0, 5 * time.Second} {
		cfg := testConfig(t, srv) // create_stream: true
		cfg.Stream += strconv.Itoa(int(w.Seconds()))
		cfg.StreamDuplicateWindow = w
		newConsumer(t, ctx, cfg)
		if d := streamConfig(t, ctx, js, cfg.Stream).Duplicates; d != cmp.Or(w, 2*time.Minute) {
			t.Errorf("stream created with nats.stream_duplicate_window %v has duplicate_window %v", w, d)
		}
	}
}

// What New refuses, and a filter that takes nothing from the stream, are
// errors of check too.
func TestCheckPullBytesAndFilter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{"chk.a.*", "chk.b.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream + "_DLQ", Subjects: []string{cfg.DeadLetterSubject}}); err != nil {
		t.Fatal(err)
	}
	errorsOf := func(c Config) string { t.Helper(); return checkText(t, ctx, c, true) }
	for _, f := range []string{"", "chk.a.x", "chk.a.*", "chk.*.x", "chk.b.x.y", "chk.>", ">"} {
		c := cfg
		c.FilterSubject = f
		if got := errorsOf(c); got != "" {
			t.Errorf("filter %q: %s", f, got)
		}
	}
	for _, f := range []string{"chk.c.x", "chk.a", "chk.a.x.y", "other.>", "chk.b"} {
		c := cfg
		c.FilterSubject = f
		if got := errorsOf(c); !strings.Contains(got, "matches none of stream") {
			t.Errorf("filter %q: errors %q, want it named", f, got)
		}
	}
	c := cfg
	c.PullMaxBytes = 1000
	if got := errorsOf(c); !strings.Contains(got, "nats.pull_max_bytes (1000) is below the server's max_payload") {
		t.Errorf("pull_max_bytes 1000: errors %q", got)
	}
	c = cfg
	c.MaxInFlightBytes = 1 << 20
	c.PullClient = PullClientWire // the budget is wire's
	if got := errorsOf(c); !strings.Contains(got, "nats.max_in_flight_bytes (1048576) is below the server's max_payload") {
		t.Errorf("max_in_flight_bytes 1 MiB: errors %q", got)
	}
	// A dead-letter subject the stream captures: run refuses it as a bad
	// configuration, so check says it is one (its exit status 2).
	c = cfg
	c.DeadLetterSubject = "chk.b.dlq"
	ps, err := Check(ctx, c, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(ps, func(p Problem) bool { return strings.Contains(p.Message, "dead letters would be consumed again") }); i < 0 || !ps[i].Config || ps[i].Warning {
		t.Errorf("dead-letter subject in the stream: problems %+v, want a configuration error", ps)
	}
}

// The log names the server jetsink connected to, never the credentials in
// nats.url: a token, or a user and password (nats.go's
// ConnectedUrlRedacted hides a password only).
func TestLogShowsNoCredentialsOfTheURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const token, user, pass = "t0kenSecret", "aliceUser", "p4ssSecret"
	for _, tc := range []struct {
		name string
		opts func(*server.Options)
		auth string
	}{
		{"token", func(o *server.Options) { o.Authorization = token }, token + "@"},
		{"user and password", func(o *server.Options) {
			o.Users = []*server.User{{Username: user, Password: pass}}
		}, user + ":" + pass + "@"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
				JetStream: true, StoreDir: t.TempDir(), ServerName: "creds"}
			tc.opts(opts)
			srv := startServer(t, opts)
			name := uniqueName(t)
			cfg := DefaultConfig()
			cfg.URL = strings.Replace(srv.ClientURL(), "nats://", "nats://"+tc.auth, 1)
			cfg.Stream, cfg.Subjects, cfg.Consumer = name, []string{"in." + name + ".>"}, "c_"+name
			cfg.CreateStream = true
			cfg.DeadLetterSubject = "dlq." + name
			var buf syncBuffer
			c, err := New(ctx, cfg, testLogger(t, &buf))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			_ = c.Close(context.Background())
			log := buf.String()
			if !strings.Contains(log, "nats consumer ready") {
				t.Fatalf("no line for the connection in the log:\n%s", log)
			}
			for _, secret := range []string{token, user, pass} {
				if strings.Contains(log, secret) {
					t.Fatalf("the log shows %q:\n%s", secret, log)
				}
			}
		})
	}
}

// An account that may not read the dead-letter stream's settings (no
// STREAM.INFO on it: here a publish permission denied) gets a warning that
// they are not checked, not a failed check: run only warns of it too.
func TestCheckDeadLetterStreamSettingsUnreadable(t *testing.T) {
	onePassOnly(t) // DefaultConfig: the pull client is wire's in both passes
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const pass = "check-secret"
	name := uniqueName(t)
	dlqName := name + "_DLQ"
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), ServerName: "check-perms",
		Users: []*server.User{
			{Username: "admin", Password: pass},
			{Username: "check", Password: pass, Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.STREAM.INFO." + dlqName}},
			}},
		}}
	srv := startServer(t, opts)
	js := jsAt(t, srv.ClientURL(), nats.UserInfo("admin", pass))
	cfg := DefaultConfig()
	cfg.URL = srv.ClientURL()
	cfg.User, cfg.Password = "check", pass
	cfg.Stream, cfg.Subjects, cfg.Consumer = name, []string{"in." + name + ".>"}, "c_"+name
	cfg.DeadLetterSubject = "dlq." + name
	makeStream(t, ctx, js, cfg)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: dlqName, Subjects: []string{cfg.DeadLetterSubject}}); err != nil {
		t.Fatal(err)
	}
	// The denied request gets no answer: it ends with this context.
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	ps, err := Check(cctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatalf("Check without STREAM.INFO on the dead-letter stream: %v", err)
	}
	var found bool
	for _, p := range ps {
		if !p.Warning {
			t.Errorf("check found an error: %s", p)
		}
		if strings.Contains(p.Message, "could not read the settings of dead-letter stream "+dlqName) && p.Fix != "" {
			found = true
		}
	}
	if !found {
		t.Fatalf("check's problems:\n%s\nwant a warning that %s's settings are not checked", problemsText(ps), dlqName)
	}
}

// startServer starts an embedded nats-server with opts for the test, and
// shuts it down when the test ends.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return srv
}

// A consumer whose pull limits refuse jetsink's pulls is reported: run
// clears the consumer's own, but stops with exit 2 where the server's
// jetstream limits set them, and check cannot tell which.
func TestCheckReportsPullLimits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.PullMaxMessages = 500 // set: a derived one pulls no more than the limit
	newConsumer(t, ctx, cfg)  // the stream, the dead-letter stream and the durable as run makes them
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if text := problemsText(ps); strings.Contains(text, "refuses jetsink's pulls") {
		t.Fatalf("the durable run made:\n%s", text)
	}
	if _, err := js.UpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: cfg.AckWait, MaxDeliver: durableMaxDeliver, MaxRequestBatch: 10}); err != nil {
		t.Fatal(err)
	}
	ps, err = Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, p := range ps {
		if strings.Contains(p.Message, "refuses jetsink's pulls: max_request_batch 10 (set nats.pull_max_messages to 10 or less)") {
			found = p.Warning
		}
	}
	if !found {
		t.Fatalf("no warning of max_request_batch 10:\n%s", problemsText(ps))
	}
	cfg.PullMaxMessages = 0
	if ps, err = Check(ctx, cfg, testLogger(t, nil)); err != nil || strings.Contains(problemsText(ps), "refuses jetsink's pulls") {
		t.Fatalf("pull_max_messages derived (%v):\n%s", err, problemsText(ps))
	}
}

// A durable filtered by filter_subjects (the list form), or with a
// backoff, is not as run makes it: check says so, and that events before
// the durable's place on the subjects a new filter adds are not
// delivered; New sets both back, and logs the filter change. Before,
// check compared filter_subject alone, and neither looked at the backoff.
func TestCheckReportsFilterSubjectsAndBackoff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	newConsumer(t, ctx, cfg) // the stream, the dead-letter stream and the durable as run makes them
	if ps, err := Check(ctx, cfg, testLogger(t, nil)); err != nil || strings.Contains(problemsText(ps), "run will update it") {
		t.Fatalf("the durable run made (%v):\n%s", err, problemsText(ps))
	}
	only := subjectOf(cfg, 0, 2)
	for _, tc := range []struct {
		name  string
		edit  func(*jetstream.ConsumerConfig)
		want  string
		fixed bool // the fix says what a filter change skips
	}{
		{"filter_subjects", func(cc *jetstream.ConsumerConfig) { cc.FilterSubjects = []string{only} }, "filter [" + strconv.Quote(only) + "]", true},
		{"backoff", func(cc *jetstream.ConsumerConfig) { cc.BackOff = []time.Duration{cfg.AckWait, 2 * time.Second} }, "backoff [30s 2s]", false},
	} {
		cc := jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.AckWait, MaxDeliver: durableMaxDeliver}
		tc.edit(&cc)
		if _, err := js.UpdateConsumer(ctx, cfg.Stream, cc); err != nil {
			t.Fatal(err)
		}
		ps, err := Check(ctx, cfg, testLogger(t, nil))
		if err != nil {
			t.Fatal(err)
		}
		var found *Problem
		for i, p := range ps {
			if strings.Contains(p.Message, "run will update it") {
				found = &ps[i]
			}
		}
		if found == nil || !found.Warning || !strings.Contains(found.Message, tc.want) ||
			strings.Contains(found.Fix, "not delivered") != tc.fixed {
			t.Fatalf("%s: problems:\n%s\nwant a warning naming %s", tc.name, problemsText(ps), tc.want)
		}
		c, log := newLoggedConsumer(t, ctx, cfg)
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if ps, err := Check(ctx, cfg, testLogger(t, nil)); err != nil || strings.Contains(problemsText(ps), "run will update it") {
			t.Fatalf("%s: after New (%v):\n%s", tc.name, err, problemsText(ps))
		}
		if logged := strings.Contains(log.String(), "changing the consumer's filter"); logged != tc.fixed {
			t.Fatalf("%s: filter change logged %v, want %v; log:\n%s", tc.name, logged, tc.fixed, log.String())
		}
	}
}

// The server's jetstream limits set max_request_batch 100 on every
// consumer: a derived pull_max_messages pulls 100 at most and drains the
// stream; a set one above it is refused.
func TestServerMaxRequestBatchLowersDerivedPulls(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), JetStreamLimits: server.JSLimitOpts{MaxRequestBatch: 100}})
	js := jsAt(t, srv.ClientURL())
	cfg := testConfigURL(t, srv.ClientURL())
	c := newConsumer(t, ctx, cfg)
	r := startRun(t, ctx, c, 2, 64, 1024)
	publish(t, ctx, js, cfg, 1000, 10, 0)
	for range 1000 {
		g := r.next(t, ctx)
		if err := g.ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.pullMessages(); got != 100 {
		t.Errorf("pulls %d messages, want the server's max_request_batch 100", got)
	}
	r.stopClean(t, ctx)

	cfg.PullMaxMessages = 500
	_, err := New(ctx, cfg, testLogger(t, nil))
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "max_request_batch 100 (set nats.pull_max_messages to 100 or less)") {
		t.Fatalf("New with pull_max_messages 500 = %v, want the limit named", err)
	}
}

// With create_stream, run sets an existing stream's subjects to
// nats.subjects: check warns of it before, and run says so when it does
// (a subject left out is no longer stored). Before, both were silent.
func TestCreateStreamSaysItChangesTheSubjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv) // create_stream: true
	other := "other." + cfg.Stream + ".>"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{other}}); err != nil {
		t.Fatal(err)
	}
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	var warned bool
	for _, p := range ps {
		if strings.Contains(p.Message, "stream "+cfg.Stream+" captures "+other+"; run will set its subjects to nats.subjects, "+cfg.Subjects[0]) {
			warned = p.Warning
		}
	}
	if !warned {
		t.Fatalf("no warning that run changes the subjects:\n%s", problemsText(ps))
	}
	_, log := newLoggedConsumer(t, ctx, cfg)
	if !strings.Contains(log.String(), "setting the stream's subjects to nats.subjects") || !strings.Contains(log.String(), "from="+other) {
		t.Fatalf("run changed the subjects without saying so:\n%s", log)
	}
	if got := streamConfig(t, ctx, js, cfg.Stream).Subjects; !slices.Equal(got, cfg.Subjects) {
		t.Fatalf("subjects %v, want %v", got, cfg.Subjects)
	}
	// Run's subjects: nothing to say.
	ps, err = Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if text := problemsText(ps); strings.Contains(text, "will set its subjects") {
		t.Fatalf("check after run set the subjects:\n%s", text)
	}
}

func TestSubjectsDiff(t *testing.T) {
	for _, c := range []struct {
		have, want, dropped, added []string
	}{
		{[]string{"a.>"}, []string{"a.>"}, nil, nil},
		{[]string{"a.>", "b.>"}, []string{"b.>", "a.>"}, nil, nil},      // order is no change
		{[]string{"e.a", "e.b"}, []string{"e.>"}, nil, []string{"e.>"}}, // covered, not dropped
		{[]string{"e.*"}, []string{"e.>"}, nil, []string{"e.>"}},
		{[]string{"other.>"}, []string{"e.>"}, []string{"other.>"}, []string{"e.>"}},
		{nil, []string{"e.>"}, nil, []string{"e.>"}},
	} {
		dropped, added := subjectsDiff(c.have, c.want)
		if !slices.Equal(dropped, c.dropped) || !slices.Equal(added, c.added) {
			t.Errorf("subjectsDiff(%v, %v) = %v, %v; want %v, %v", c.have, c.want, dropped, added, c.dropped, c.added)
		}
	}
}

// checkText runs Check on cfg and returns its problems, one a line; only
// the errors when errorsOnly.
func checkText(t *testing.T, ctx context.Context, cfg Config, errorsOnly bool) string {
	t.Helper()
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, p := range ps {
		if !errorsOnly || !p.Warning {
			b.WriteString(p.String() + "\n")
		}
	}
	return b.String()
}

// On a cluster, the dead-letter stream jetsink creates has the event
// stream's replicas, and check and New warn of one with fewer: a dead
// letter is the only copy of an event terminated in the event stream.
func TestDeadLetterStreamReplicasOnACluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, cfg := onCluster(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// create_stream: New makes <stream>_DLQ with three replicas.
	c, err := New(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)
	made, err := js.Stream(ctx, cfg.Stream+"_DLQ")
	if err != nil {
		t.Fatalf("the dead-letter stream New made: %v", err)
	}
	if r := made.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("New made the dead-letter stream with %d replicas, want the event stream's 3", r)
	}
	for _, tc := range []struct {
		replicas int
		warned   bool
	}{{1, true}, {3, false}} {
		sc := made.CachedInfo().Config
		sc.Replicas = tc.replicas
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			t.Fatalf("replicas %d: %v", tc.replicas, err)
		}
		ps, err := Check(ctx, cfg, testLogger(t, nil))
		if err != nil {
			t.Fatal(err)
		}
		text := problemsText(ps)
		if got := strings.Contains(text, "has 1 replicas, fewer than event stream "+cfg.Stream+"'s 3"); got != tc.warned {
			t.Errorf("dead-letter stream with %d replicas: check warned %v, want %v:\n%s", tc.replicas, got, tc.warned, text)
		}
		var buf syncBuffer
		c, err := New(ctx, cfg, testLogger(t, &buf))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close(ctx)
		if got := strings.Contains(buf.String(), "fewer than event stream"); got != tc.warned {
			t.Errorf("dead-letter stream with %d replicas: New warned %v, want %v:\n%s", tc.replicas, got, tc.warned, buf.String())
		}
	}
}

// On a cluster, a stream jetsink creates has nats.stream_replicas (one when
// unset, the server's default, which check and New warn of: losing that
// server's disk loses events acked to their publishers); set, it is
// applied to a stream already there. A server on its own is no cluster:
// nothing to warn of.
func TestStreamReplicasOnACluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, cfg := onCluster(t) // create_stream: true
	const oneReplica = "has one replica on NATS cluster jetsink-test"

	if w := checkText(t, ctx, cfg, false); !strings.Contains(w, "stream "+cfg.Stream+" "+oneReplica) {
		t.Errorf("check before a stream of one replica is created: no warning of it:\n%s", w)
	}
	_, buf := newLoggedConsumer(t, ctx, cfg)
	if r := streamConfig(t, ctx, js, cfg.Stream).Replicas; r != 1 {
		t.Fatalf("created with %d replicas, want 1 (stream_replicas unset)", r)
	}
	if !strings.Contains(buf.String(), oneReplica) {
		t.Errorf("New made a stream of one replica on a cluster and said nothing of it:\n%s", buf.String())
	}

	cfg.StreamReplicas = 3
	w := checkText(t, ctx, cfg, false)
	if !strings.Contains(w, "run will set stream "+cfg.Stream+"'s replicas 1 -> 3") || strings.Contains(w, oneReplica) {
		t.Errorf("check of a stream run will take to three replicas:\n%s", w)
	}
	// The _DLQ New made beside the stream of one replica has one too:
	// judged against the stream as run will have it.
	if !strings.Contains(w, "dead-letter stream "+cfg.Stream+"_DLQ has 1 replicas, fewer than event stream "+cfg.Stream+"'s 3") {
		t.Errorf("check does not judge the dead-letter stream against the three replicas run will set:\n%s", w)
	}
	_, buf = newLoggedConsumer(t, ctx, cfg)
	if r := streamConfig(t, ctx, js, cfg.Stream).Replicas; r != 3 {
		t.Fatalf("updated to %d replicas, want 3", r)
	}
	if strings.Contains(buf.String(), oneReplica) {
		t.Errorf("New warned of one replica after it set three:\n%s", buf.String())
	}

	srv := testenv.NATS(t)
	single := testConfig(t, srv)
	if w := checkText(t, ctx, single, false); strings.Contains(w, "one replica") {
		t.Errorf("check on a server of its own warns of one replica:\n%s", w)
	}
	// More than one there is an error: the server refuses such a stream.
	single.StreamReplicas = 3
	if e := checkText(t, ctx, single, true); !strings.Contains(e, "is to have 3 replicas, but the server runs JetStream on its own") {
		t.Errorf("check of stream_replicas 3 on a server of its own:\n%s", e)
	}
}

// onCluster starts a three-node NATS cluster (named jetsink-test) and
// returns a JetStream client of it and testConfig's configuration for it.
func onCluster(t *testing.T) (jetstream.JetStream, Config) {
	t.Helper()
	cl := testenv.NewNATSCluster(t, 3)
	js, err := jetstream.New(cl.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return js, testConfigURL(t, cl.URLs())
}

// A pull refused for want of permission is taken for one whichever way the
// server names the pull subject: $JS.<domain>.API... on a server of
// another domain, $JS.API... on the servers of nats.domain themselves,
// which map the one to the other before they check; another consumer's
// refusal, or another error, is not.
func TestNotePullRefusalNamesEitherSubject(t *testing.T) {
	refused := func(domain, msg string) bool {
		c := &Consumer{cfg: Config{Stream: "S", Consumer: "C", Domain: domain}, log: slog.New(slog.DiscardHandler)}
		c.notePullRefusal(errors.New(msg))
		return c.pullsRefused.Load() != nil
	}
	const pv = `nats: permissions violation: Permissions Violation for Publish to `
	for _, c := range []struct {
		domain, msg string
		want        bool
	}{
		{"", pv + `"$JS.API.CONSUMER.MSG.NEXT.S.C"`, true},
		{"", pv + `"$JS.API.CONSUMER.MSG.NEXT.S.C2"`, false},
		{"", pv + `"$JS.hub.API.CONSUMER.MSG.NEXT.S.C"`, false},
		{"hub", pv + `"$JS.hub.API.CONSUMER.MSG.NEXT.S.C"`, true},
		{"hub", pv + `"$JS.API.CONSUMER.MSG.NEXT.S.C"`, true},
		{"hub", pv + `"$JS.API.CONSUMER.MSG.NEXT.S.C2"`, false},
		{"hub", `nats: timeout "$JS.API.CONSUMER.MSG.NEXT.S.C"`, false},
	} {
		if got := refused(c.domain, c.msg); got != c.want {
			t.Errorf("domain %q, %s: refusal noted %v, want %v", c.domain, c.msg, got, c.want)
		}
	}
}

// An event stream that sources (or mirrors) the stream capturing the
// dead-letter subject takes every dead letter back as an event, which is
// dead-lettered again under its new sequence, without end (a reviewer's
// run: 27,528 letters of one bad event in 5 s). New refuses it, and check
// says so, unless the source's filter, or the durable's, leaves the
// dead-letter subject out.
func TestStreamSourcingTheDeadLetterStreamIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	base := testConfig(t, srv)
	base.CreateStream = false
	src, dlq := base.Stream+"_SRC", base.Stream+"_DLQ"
	for _, sc := range []jetstream.StreamConfig{
		{Name: src, Subjects: []string{"in." + base.Stream + ".>"}},
		{Name: dlq, Subjects: []string{base.DeadLetterSubject}},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	for i, tc := range []struct {
		name    string
		sc      jetstream.StreamConfig
		filter  string
		refused bool
	}{
		{"sources", jetstream.StreamConfig{Sources: []*jetstream.StreamSource{{Name: src}, {Name: dlq}}}, "", true},
		{"mirrors", jetstream.StreamConfig{Mirror: &jetstream.StreamSource{Name: dlq}}, "", true},
		{"sources through a transform", jetstream.StreamConfig{Sources: []*jetstream.StreamSource{{Name: dlq,
			SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: base.DeadLetterSubject, Destination: "in." + base.Stream + ".dl"}}}}},
			"in." + base.Stream + ".>", true},
		{"source filter leaves it out", jetstream.StreamConfig{Sources: []*jetstream.StreamSource{{Name: src}, {Name: dlq, FilterSubject: "other.>"}}}, "", false},
		{"durable filter leaves it out", jetstream.StreamConfig{Sources: []*jetstream.StreamSource{{Name: src}, {Name: dlq}}}, "in." + base.Stream + ".>", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.Stream = fmt.Sprintf("%s_EV%d", base.Stream, i)
			cfg.Consumer = fmt.Sprintf("c%d_%s", i, base.Stream)
			cfg.FilterSubject = tc.filter
			sc := tc.sc
			sc.Name = cfg.Stream
			if _, err := js.CreateStream(ctx, sc); err != nil {
				t.Fatal(err)
			}
			ps, err := Check(ctx, cfg, testLogger(t, nil))
			if err != nil {
				t.Fatal(err)
			}
			var loops []Problem
			for _, p := range ps {
				if strings.Contains(p.Message, "dead-lettered again") {
					loops = append(loops, p)
				}
			}
			if tc.refused != (len(loops) == 1 && loops[0].Config && !loops[0].Warning && strings.Contains(loops[0].Message, dlq)) {
				t.Fatalf("check's problems:\n%s\nwant the loop through %s reported: %v", problemsText(ps), dlq, tc.refused)
			}
			c, err := New(ctx, cfg, testLogger(t, nil))
			if err == nil {
				_ = c.Close(ctx)
			}
			if refused := errors.Is(err, ErrInvalidConfig) && strings.Contains(err.Error(), "dead-lettered again"); refused != tc.refused {
				t.Fatalf("New: %v; want the loop refused: %v", err, tc.refused)
			}
			dropSourcing(t, ctx, js, cfg.Stream)
		})
	}
	// With create_stream and no stream capturing the dead-letter subject
	// yet, the stream run would create (<stream>_DLQ) is the one judged.
	cfg := base
	cfg.Stream = base.Stream + "_NEW"
	cfg.Consumer = "new_" + base.Stream
	cfg.Subjects = []string{"new." + base.Stream + ".>"}
	cfg.DeadLetterSubject = "dlq2." + base.Stream
	cfg.CreateStream = true
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Sources: []*jetstream.StreamSource{{Name: src}, {Name: cfg.Stream + "_DLQ"}}}); err != nil {
		t.Fatal(err)
	}
	_, err := New(ctx, cfg, testLogger(t, nil))
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), cfg.Stream+"_DLQ") {
		t.Fatalf("New with create_stream: %v; want the loop through %s_DLQ refused", err, cfg.Stream)
	}
	dropSourcing(t, ctx, js, cfg.Stream)
}

// dropSourcing deletes stream name once the server has set up its mirror
// or sources, or failed to. While the server waits for the answer to its
// request for a source's consumer, a goroutine of its own waits too, for
// 30 s whether the server shuts down or not, and the leak check at the end
// of the tests reports it; a source that failed (its stream is not there)
// or was lost is set up again every few seconds, as long as the stream
// that sources it is there.
func dropSourcing(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) {
	t.Helper()
	waitFor(t, ctx, "the sources of stream "+name+" set up", func() bool {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		for _, si := range append([]*jetstream.StreamSourceInfo{info.Mirror}, info.Sources...) {
			if si != nil && si.Active < 0 && si.Error == nil {
				return false
			}
		}
		return true
	})
	if err := js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
}

func TestSourcedAs(t *testing.T) {
	for _, tc := range []struct {
		src  jetstream.StreamSource
		want string // "": not sourced
	}{
		{jetstream.StreamSource{}, "dlq.a-b"},
		{jetstream.StreamSource{FilterSubject: "dlq.>"}, "dlq.a-b"},
		{jetstream.StreamSource{FilterSubject: "other.>"}, ""},
		{jetstream.StreamSource{SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "other.>", Destination: "a"}}}, ""},
		{jetstream.StreamSource{SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "other.>"}, {Source: "dlq.*", Destination: "ev.{{wildcard(1)}}.dl"}}}, "ev.a-b.dl"},
		{jetstream.StreamSource{SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "dlq.>"}}}, "dlq.a-b"},
		// A split makes two tokens of one: the letter arrives on ev.a.b,
		// which a filter ev.*.* takes (ev.* would not say so).
		{jetstream.StreamSource{SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "dlq.*", Destination: "ev.{{split(1,-)}}"}}}, "ev.a.b"},
		{jetstream.StreamSource{SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "dlq.*", Destination: "ev.{{partition(4,1)}}.$1"}}}, "ev.3.a-b"}, // the server's hash puts a-b in partition 3,
		// Drawn at random: any token there.
		{jetstream.StreamSource{SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "dlq.*", Destination: "ev.{{random(5)}}"}}}, "ev.*"},
	} {
		got, ok := sourcedAs(&tc.src, "dlq.a-b")
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("sourcedAs(%+v) = %q, %v; want %q", tc.src, got, ok, tc.want)
		}
	}
}

// A dead-letter stream whose max_msg_size is below what the letter of the
// largest event may take refuses that letter (API error 10054), and its
// event is nak'ed again and again.
func TestDeadLetterStreamMaxMsgSize(t *testing.T) {
	const maxPayload = 1 << 20
	for _, tc := range []struct {
		dlq, events int32 // max_msg_size, 0 for none
		want        string
	}{
		{0, 0, ""},
		{-1, 4096, ""},
		{maxPayload, 0, ""},
		{maxPayload - 1, 0, "less than the 1048576 bytes a dead letter of the largest event may take (the server's max_payload 1048576"},
		{4096 + deadLetterHeadroom, 4096, ""},
		{4096 + deadLetterHeadroom - 1, 4096, "less than the 6144 bytes a dead letter of the largest event may take (event stream EV's max_msg_size 4096"},
		{maxPayload, 2 * maxPayload, ""},
	} {
		sc := jetstream.StreamConfig{Name: "DLQ", MaxMsgSize: tc.dlq, Duplicates: time.Hour}
		events := jetstream.StreamConfig{Name: "EV", MaxMsgSize: tc.events}
		ps := deadLetterStreamProblems(&sc, &events, time.Second, maxPayload)
		if tc.want == "" && len(ps) > 0 || tc.want != "" && (len(ps) != 1 || !strings.Contains(ps[0].Message, tc.want) || ps[0].Fix == "") {
			t.Errorf("max_msg_size %d beside %d: problems\n%s\nwant one saying %q", tc.dlq, tc.events, problemsText(ps), tc.want)
		}
	}
}

// The fix of a max_in_flight_bytes too small for the largest message
// names the least budget taken (max_payload + 8 KiB, as the README says),
// not four times it, and what 0 derives; the least it names is taken.
func TestInFlightProblemNamesLeastBudget(t *testing.T) {
	for _, tc := range []struct {
		maxPayload    int64
		least, derive string
	}{
		{1 << 20, "1056768 or more", "derived: 33554432"},
		{8 << 20, "8396800 or more", "derived: 33587200"},
	} {
		p, bad := inFlightProblem(tc.maxPayload, tc.maxPayload)
		if !bad {
			t.Fatalf("max_payload %d: a budget of max_payload refused by nothing", tc.maxPayload)
		}
		if !strings.Contains(p.Fix, "set nats.max_in_flight_bytes to "+tc.least) || !strings.Contains(p.Fix, tc.derive) {
			t.Errorf("max_payload %d: fix %q, want %q and %q", tc.maxPayload, p.Fix, tc.least, tc.derive)
		}
		if derived := fmt.Sprintf("derived: %d)", Config{}.inFlightBudget(tc.maxPayload)); !strings.Contains(p.Fix, derived) {
			t.Errorf("max_payload %d: fix %q, want what 0 derives (inFlightBudget): %q", tc.maxPayload, p.Fix, derived)
		}
		least := tc.maxPayload + pullBytesMargin
		if _, bad := inFlightProblem(least, tc.maxPayload); bad {
			t.Errorf("max_payload %d: the least budget the fix names (%d) is refused", tc.maxPayload, least)
		}
		if _, bad := inFlightProblem(least-1, tc.maxPayload); !bad {
			t.Errorf("max_payload %d: a budget below the least (%d) is taken", tc.maxPayload, least-1)
		}
	}
}

// The commands jetsink prints for an operator run as printed, in a
// script too: natscli asks for the replay policy and the rest without
// --replay and --defaults (and fails with no terminal, "could not ask
// replay policy"); a durable made again takes jetsink's filter, quoted
// for the shell (a > redirects); and --deliver is the ack floor's stream
// sequence + 1, the number where it is known, since nats consumer info
// prints the floor's consumer sequence first. Before, they said
// "--deliver <ack floor + 1>" and stopped to ask.
func TestOperatorCommandsRunUnattended(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Stream, cfg.Consumer, cfg.FilterSubject = "ORDERS", "jetsink", "orders.eu.>"
	hold := holdSteps(&cfg, floorPlaceholder)
	want := "nats consumer add ORDERS jetsink_hold --pull --ack explicit --deliver <the ack floor's stream sequence + 1> --replay instant " +
		"--filter 'orders.eu.>' --defaults (nats consumer info ORDERS jetsink shows the durable's ack floor: take its stream sequence, " +
		"not its consumer sequence, printed first)"
	if !strings.Contains(hold, want) || requireUnattended(t, "holdSteps", hold) != 1 {
		t.Errorf("holdSteps:\n%s\nwant it to hold:\n%s", hold, want)
	}
	if got := holdFirst(&cfg, deliverAfter(1234), true); !strings.Contains(got, "--deliver 1235 --replay instant --filter 'orders.eu.>' --defaults, and remove it") ||
		strings.Contains(got, "nats consumer info") || requireUnattended(t, "holdFirst", got) != 1 {
		t.Errorf("holdFirst with the floor 1234:\n%s", got)
	}
	c := &Consumer{cfg: cfg}
	remake := c.remakeSteps(floorUnderFilter, 1234)
	want = "past the ack floor it had under jetsink's filter, stream sequence 1234 (nats consumer rm ORDERS jetsink --force, then nats consumer add ORDERS jetsink " +
		"--pull --ack explicit --deliver 1235 --replay instant --filter 'orders.eu.>' --defaults;"
	if !strings.Contains(remake, want) || requireUnattended(t, "remakeSteps", remake) != 1 {
		t.Errorf("remakeSteps(1234):\n%s\nwant it to hold:\n%s", remake, want)
	}
	// On an interest stream, the holding consumer from the floor too.
	c.interest.Store(true)
	remake = c.remakeSteps(floorUnderFilter, 1234)
	if !strings.Contains(remake, want) || !strings.Contains(remake, "nats consumer add ORDERS jetsink_hold --pull --ack explicit --deliver 1235 ") ||
		requireUnattended(t, "remakeSteps", remake) != 2 {
		t.Errorf("remakeSteps(1234) on an interest stream:\n%s", remake)
	}
	cfg.FilterSubject = ""
	if got := consumerAdd("ORDERS", "jetsink", "", "1"); got != "nats consumer add ORDERS jetsink --pull --ack explicit --deliver 1 --replay instant --defaults" {
		t.Errorf("consumerAdd without a filter: %s", got)
	}
	for in, want := range map[string]string{"orders.eu": "orders.eu", "orders.*.x": "'orders.*.x'", "a b": "'a b'", "it's": `'it'\''s'`, "": "''"} {
		if got := shellWord(in); got != want {
			t.Errorf("shellWord(%q) = %s, want %s", in, got, want)
		}
	}
}

// Every natscli command jetsink prints names the stream, consumer and
// subjects as one word each for the shell, and runs without a terminal:
// a stream may be named with a $ or a & (the server refuses only
// whitespace, '.', '*', '>' and path separators), which a shell expands or
// takes for a background job; and nats stream edit and nats consumer rm
// ask for a confirmation unless told --force. Before, the fixes of
// replicas, roll-ups, the dead-letter stream's max_msg_size, replicas and
// subjects, and Validate's stream keys printed the stream's name bare, and
// no edit or rm had --force.
func TestOperatorCommandsQuoteNames(t *testing.T) {
	const name = "ev$x&y"
	cfg := DefaultConfig()
	cfg.Stream, cfg.Consumer, cfg.FilterSubject = name, "jet$ink", "ev.>"
	// The server takes such names (the test's own copy of them).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jsFor(t, testenv.NATS(t))
	own := name + "_" + uniqueName(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: own, Subjects: []string{own + ".>"}}); err != nil {
		t.Fatalf("the server refuses stream %s: %v", own, err)
	}
	if _, err := js.CreateConsumer(ctx, own, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatalf("the server refuses durable %s: %v", cfg.Consumer, err)
	}
	texts := map[string]string{}
	if p, ok := replicaProblem("c1", &jetstream.StreamConfig{Name: name, Replicas: 1}); ok {
		texts["replicaProblem"] = p.Fix
	}
	for _, p := range publisherDeletions(&jetstream.StreamConfig{Name: name, AllowRollup: true}) {
		texts["publisherDeletions"] += p.Fix + "\n"
	}
	if p, ok := inactiveLimitProblem(&jetstream.StreamConfig{Name: name, ConsumerLimits: jetstream.StreamConsumerLimits{InactiveThreshold: time.Hour}}); ok {
		texts["inactiveLimitProblem"] = p.Fix
	}
	if p, ok := ackPendingLimitProblem(&jetstream.StreamConfig{Name: name, ConsumerLimits: jetstream.StreamConsumerLimits{MaxAckPending: 1}}, &cfg); ok {
		texts["ackPendingLimitProblem"] = p.Fix
	}
	for _, p := range deadLetterStreamProblems(&jetstream.StreamConfig{Name: name + "_DLQ", MaxMsgSize: 100, Replicas: 1},
		&jetstream.StreamConfig{Name: name, Replicas: 3}, time.Minute, 1<<20) {
		texts["deadLetterStreamProblems"] += p.Fix + "\n"
	}
	texts["deadLetterNameInUse"] = deadLetterNameInUse(name+"_DLQ", "ev$x&y.dead", []string{"other"}).Fix
	bad := cfg
	bad.CreateStream, bad.StreamMaxAge = false, time.Hour
	if err := bad.Validate(); err != nil {
		texts["Validate"] = err.Error()
	}
	texts["holdSteps"] = holdSteps(&cfg, floorPlaceholder)
	c := &Consumer{cfg: cfg}
	c.interest.Store(true)
	texts["remakeSteps"] = c.remakeSteps(floorUnderFilter, 1234)
	// How many nats commands each prints, of which how many edits.
	want := map[string][2]int{"replicaProblem": {1, 1}, "publisherDeletions": {1, 1}, "inactiveLimitProblem": {1, 1},
		"ackPendingLimitProblem": {1, 1}, "deadLetterStreamProblems": {2, 2}, "deadLetterNameInUse": {1, 1}, "Validate": {1, 1},
		"holdSteps": {3, 0}, "remakeSteps": {4, 0}}
	for by, w := range want {
		text := texts[by]
		if n := requireQuoted(t, by, text); n != w[0] {
			t.Errorf("%s prints %d nats commands, want %d:\n%s", by, n, w[0], text)
		}
		if n := len(natsCommands(text, "nats stream edit ")); n != w[1] {
			t.Errorf("%s prints %d nats stream edit, want %d:\n%s", by, n, w[1], text)
		}
		if !strings.Contains(text, shellWord(name)) && !strings.Contains(text, shellWord(name+"_DLQ")) {
			t.Errorf("%s does not name stream %s as %s:\n%s", by, name, shellWord(name), text)
		}
		requireUnattended(t, by, text)
	}
}

// A stream's consumer_limits.max_ack_pending below jetsink's is an error
// of check, naming nats.max_ack_pending: the server refuses the durable
// with jetsink's, at the start and at any re-creation inside Run. Before,
// check said nothing and run failed with the server's words alone
// (err_code=10121); New's error now names the key too. At the limit, both
// pass.
func TestCheckReportsStreamMaxAckPendingLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects,
		ConsumerLimits: jetstream.StreamConsumerLimits{MaxAckPending: 10}}); err != nil {
		t.Fatal(err)
	}
	if want := cfg.maxAckPending(); want <= 10 {
		t.Fatalf("jetsink's max_ack_pending %d; the test wants it above 10", want)
	}
	msg := fmt.Sprintf("stream %s has consumer_limits.max_ack_pending 10, below jetsink's max_ack_pending %d: the server refuses", cfg.Stream, cfg.maxAckPending())
	if errs := checkText(t, ctx, cfg, true); !strings.Contains(errs, msg) || !strings.Contains(errs, "set nats.max_ack_pending to 10 or less") {
		t.Errorf("check does not report the stream's max_ack_pending limit as an error, with the fix:\n%s", errs)
	}
	if _, err := New(ctx, cfg, testLogger(t, nil)); err == nil || !strings.Contains(err.Error(), "set nats.max_ack_pending") {
		t.Errorf("New's error does not name nats.max_ack_pending: %v", err)
	}
	cfg.MaxAckPending = 10
	if errs := checkText(t, ctx, cfg, true); strings.Contains(errs, "consumer_limits.max_ack_pending") {
		t.Errorf("check reports the limit with nats.max_ack_pending at it:\n%s", errs)
	}
	c, err := New(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatalf("New with nats.max_ack_pending at the stream's limit: %v", err)
	}
	_ = c.Close(ctx)
}

// The warning of a stream's consumer_limits.inactive_threshold says the
// durable is deleted also while jetsink runs and pulls nothing (the
// server counts from the last pull: Run's pause while PostgreSQL is
// unreachable), and, on an interest stream, that the events it held are
// lost. Before, it spoke of a stopped jetsink and of events stored again
// only.
func TestCheckWarnsOfInactiveLimitOnInterestStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Retention: jetstream.InterestPolicy,
		ConsumerLimits: jetstream.StreamConsumerLimits{InactiveThreshold: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	w := checkText(t, ctx, cfg, false)
	for _, want := range []string{
		"stream " + cfg.Stream + " has consumer_limits.inactive_threshold 1h0m0s",
		"or while PostgreSQL is unreachable for longer (jetsink pulls nothing then)",
		"this stream has interest retention: deleting the durable deletes every event it has not acknowledged that no other consumer holds, which are lost",
		"nor leave PostgreSQL unreachable, for that long",
	} {
		if !strings.Contains(w, want) {
			t.Errorf("check's warning does not say %q:\n%s", want, w)
		}
	}
}

// On a cluster, a durable made with fewer replicas than its stream's (run
// keeps it) is warned of by check and once by New, with the edit that
// gives it the stream's; one with the stream's, or 0 (the stream's), is
// not.
func TestDurableReplicasBelowStreamsOnACluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, cfg := onCluster(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	const warned = "has 1 replicas, fewer than stream "
	for _, tc := range []struct {
		replicas int
		warned   bool
	}{{1, true}, {3, false}, {0, false}} {
		_ = js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer)
		if _, err := js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
			AckWait: cfg.AckWait, MaxDeliver: -1, MaxAckPending: cfg.maxAckPending(), Replicas: tc.replicas}); err != nil {
			t.Fatalf("replicas %d: %v", tc.replicas, err)
		}
		ps, err := Check(ctx, cfg, testLogger(t, nil))
		if err != nil {
			t.Fatal(err)
		}
		text := problemsText(ps)
		if got := strings.Contains(text, warned+cfg.Stream+"'s 3"); got != tc.warned {
			t.Errorf("durable with %d replicas: check warned %v, want %v:\n%s", tc.replicas, got, tc.warned, text)
		}
		if want := "nats consumer edit " + cfg.Stream + " " + cfg.Consumer + " --replicas 3 --force"; tc.warned && !strings.Contains(text, want) {
			t.Errorf("check's fix is not %q:\n%s", want, text)
		}
		var buf syncBuffer
		c, err := New(ctx, cfg, testLogger(t, &buf))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close(ctx)
		if got := strings.Count(buf.String(), warned); got != map[bool]int{true: 1, false: 0}[tc.warned] {
			t.Errorf("durable with %d replicas: New warned %d times, want warned %v:\n%s", tc.replicas, got, tc.warned, buf.String())
		}
	}
}

// The fix printed for a dead-letter stream whose subjects were edited
// gives it every subject it has and the dead-letter subject: natscli's
// --subjects replaces the stream's whole list and --force skips the
// confirmation that showed the change, so a command with the dead-letter
// subject alone took the stream's other subjects away. (It said "and a
// --subjects for each subject it is to keep" beside such a command.)
func TestDeadLetterNameInUseKeepsTheStreamsSubjects(t *testing.T) {
	for _, tc := range []struct {
		subjects []string
		want     string
	}{
		{[]string{"a.>", "b"}, "nats stream edit x_DLQ --force --subjects 'a.>' --subjects b --subjects ev.dead"},
		{nil, "nats stream edit x_DLQ --force --subjects ev.dead"},
	} {
		fix := deadLetterNameInUse("x_DLQ", "ev.dead", tc.subjects).Fix
		cmds := natsCommands(fix, "nats stream edit ")
		if len(cmds) != 1 || cmds[0] != tc.want {
			t.Errorf("subjects %q: the fix prints %q, want [%s]:\n%s", tc.subjects, cmds, tc.want, fix)
		}
	}
}

// When the dead-letter stream's subjects could not be read, the fix prints
// no command that would set its subjects to the dead-letter subject alone:
// with --force it would remove every other subject without asking (diff
// review of e8936ce: nil subjects were taken for none).
func TestDeadLetterNameInUseSubjectsUnread(t *testing.T) {
	p := deadLetterNameInUseUnread("x_DLQ", "ev.dead", errors.New("context deadline exceeded"))
	for _, cmd := range natsCommands(p.Fix, "nats stream edit ") {
		if !strings.Contains(cmd, "<each subject it has>") {
			t.Errorf("the fix prints a runnable edit of the subjects, %q:\n%s", cmd, p.Fix)
		}
	}
	if !strings.Contains(p.Fix, "nats stream info x_DLQ") || strings.Contains(p.Message, "no subjects") ||
		!strings.Contains(p.Message, "could not be read: context deadline exceeded") {
		t.Errorf("unread subjects: %s", p)
	}
}

// remakeAfterEdit names the floor it gives: with no floor under
// jetsink's filter known (no stream noted by this process), the
// consumer's floor now, not "the ack floor it had under jetsink's
// filter", which the sentence after it then contradicted (diff review of
// 399ac8e); with one known, that floor, without the sentence.
func TestRemakeAfterEditNamesItsFloor(t *testing.T) {
	cfg := Config{Stream: "ORDERS", Consumer: "jetsink", FilterSubject: "orders.>"}
	ci := &jetstream.ConsumerInfo{AckFloor: jetstream.SequenceInfo{Stream: 9}}
	c := &Consumer{cfg: cfg}
	got := c.remakeAfterEdit(ci)
	if strings.Contains(got, "it had under jetsink's filter") || !strings.Contains(got, "past its ack floor now, stream sequence 9 ") ||
		!strings.Contains(got, "no ack floor under jetsink's filter is known") || !strings.Contains(got, " --deliver 10 ") {
		t.Errorf("remakeAfterEdit with no floor known:\n%s", got)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c = &Consumer{cfg: cfg, streamCreated: created, resumeStream: created}
	c.resumeFloor.Store(5)
	got = c.remakeAfterEdit(ci)
	if !strings.Contains(got, "past the ack floor it had under jetsink's filter, stream sequence 5 ") ||
		strings.Contains(got, "is known") || strings.Contains(got, "floor now") || !strings.Contains(got, " --deliver 6 ") {
		t.Errorf("remakeAfterEdit with the floor 5 known:\n%s", got)
	}
}

// check compares the stream's end with the table at the edge: an
// operator's stream made with first_seq 5 and no message yet ends at 4,
// under a table that stored sequence 5, and its first event would take
// sequence 5 again (skipped as a duplicate in exactly-once mode): check
// reports it. Made with first_seq 6, it is right.
func TestCheckStoredSeqAtTheStreamsFirstSeq(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.CreateStream = false
	cfg.StoredSeq = func(context.Context, string) (uint64, error) { return 5, nil }
	for _, tc := range []struct {
		first uint64
		want  bool
	}{{5, true}, {6, false}} {
		_ = js.DeleteStream(ctx, cfg.Stream)
		if _, err := CreateStream(ctx, js, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, FirstSeq: tc.first}); err != nil { // the account's only stream, just deleted
			t.Fatal(err)
		}
		ps, err := Check(ctx, cfg, testLogger(t, nil))
		if err != nil {
			t.Fatal(err)
		}
		if text := problemsText(ps); strings.Contains(text, "stream sequence against the table") != tc.want {
			t.Errorf("stream made with first_seq %d, table at 5: reported %t, want %t; problems:\n%s", tc.first, !tc.want, tc.want, text)
		}
	}
}

// A durable kept in memory (mem_storage) beside a stream on file is
// warned of by check and by New, once, with the remake on file past its
// ack floor: a restart of its server loses it, which the stream survives,
// and the next start made it anew from the start of the stream. As
// measured before: 10 events stored, the lone server restarted, the 10
// delivered again, with no warning. Not on a work-queue stream, whose
// acked events are gone.
func TestMemoryDurableWarned(t *testing.T) {
	for _, tc := range []struct {
		retention jetstream.RetentionPolicy
		warned    bool
	}{
		{jetstream.LimitsPolicy, true},
		{jetstream.InterestPolicy, true},
		{jetstream.WorkQueuePolicy, false},
	} {
		t.Run(tc.retention.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			js, cfg, _ := ownStream(t, ctx, jetstream.StreamConfig{Retention: tc.retention}, nil)
			if _, err := js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
				MemoryStorage: true}); err != nil {
				t.Fatal(err)
			}
			const said = "keeps its state in memory (mem_storage)"
			found, ps := checkProblem(t, ctx, cfg, said)
			if (found != nil) != tc.warned {
				t.Fatalf("check warned of the durable in memory: %v, want %v; problems:\n%s", found != nil, tc.warned, problemsText(ps))
			}
			if found != nil {
				if !found.Warning || !strings.Contains(found.Fix, "nats consumer rm "+cfg.Stream+" "+cfg.Consumer+" --force") ||
					requireUnattended(t, "check", found.Fix) != 1+boolInt(tc.retention == jetstream.InterestPolicy) {
					t.Errorf("check's problem is not a warning with the remake on file past the floor (and the hold first on an interest stream): %s", found)
				}
			}
			c, log := newLoggedConsumer(t, ctx, cfg)
			// Run's re-creation of the consumer says it no more.
			if err := c.ensureConsumer(ctx, nil); err != nil {
				t.Fatal(err)
			}
			want := boolInt(tc.warned)
			if n := strings.Count(log.String(), said); n != want {
				t.Errorf("New and a re-creation warned of the durable in memory %d times, want %d; log:\n%s", n, want, log.String())
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A max_ack_pending limit below jetsink's is named by where it is: the
// server refuses the durable with one error code (10121) for its own
// jetstream limits, the account's and the stream's consumer_limits, naming
// only the number. Before, New blamed the stream's consumer_limits for
// all three, and check passed the account's and the server's. check sees
// the account's (account info), not the server's (no client request
// shows it).
func TestMaxAckPendingLimitNamed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		server   int // the servers' jetstream limits
		account  int // the account's
		stream   int // the stream's consumer_limits
		newSays  string
		checkErr string // "" for none
	}{
		{"server", 500, 0, 0, "so it is the server's own: set nats.max_ack_pending, 32768, to 500 or less", ""},
		{"account", 0, 300, 0, "the account's JetStream limit max_ack_pending is 300: set nats.max_ack_pending, 32768, to 300 or less",
			"the account's JetStream limit max_ack_pending is 300, below jetsink's max_ack_pending 32768"},
		{"stream", 0, 0, 10, "consumer_limits.max_ack_pending is 10: set nats.max_ack_pending, 32768, to 10 or less",
			"has consumer_limits.max_ack_pending 10, below jetsink's max_ack_pending 32768"},
		{"stream under the server's", 500, 0, 400, "so it is the server's own: set nats.max_ack_pending, 32768, to 400 or less (400: the lowest",
			"has consumer_limits.max_ack_pending 400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, JetStream: true, StoreDir: t.TempDir(),
				JetStreamLimits: server.JSLimitOpts{MaxAckPending: tc.server}})
			if tc.account > 0 {
				if err := srv.GlobalAccount().UpdateJetStreamLimits(map[string]server.JetStreamAccountLimits{"": {MaxAckPending: tc.account,
					MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: -1}}); err != nil {
					t.Fatal(err)
				}
			}
			cfg := testConfigURL(t, srv.ClientURL())
			if want := cfg.maxAckPending(); want != 32768 {
				t.Fatalf("jetsink's max_ack_pending %d; the test wants the default 32768", want)
			}
			if tc.stream > 0 {
				cfg.CreateStream = false
				if _, err := jsAt(t, cfg.URL).CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects,
					ConsumerLimits: jetstream.StreamConsumerLimits{MaxAckPending: tc.stream}}); err != nil {
					t.Fatal(err)
				}
			}
			errs := checkText(t, ctx, cfg, true)
			if tc.checkErr != "" && !strings.Contains(errs, tc.checkErr) || tc.checkErr == "" && strings.Contains(errs, "max_ack_pending") {
				t.Errorf("check's errors, want %q:\n%s", tc.checkErr, errs)
			}
			c, err := New(ctx, cfg, testLogger(t, nil))
			if c != nil {
				_ = c.Close(ctx)
			}
			if err == nil || !strings.Contains(err.Error(), tc.newSays) {
				t.Errorf("New = %v; want it to say %q", err, tc.newSays)
			}
		})
	}
}

// A durable whose max_waiting is below the pulls one jetsink keeps
// waiting (pullsWaiting) is warned of by check and by New, once, with the
// remake: the server refuses the pulls beyond it, and no update changes
// it. As measured before: max_waiting 1, 30,000 events in 10-12 s instead
// of 0.2-0.35 s, with no word. On a work-queue stream the remake is
// jetsink's, delivering all.
func TestMaxWaitingWarned(t *testing.T) {
	for _, tc := range []struct {
		retention  jetstream.RetentionPolicy
		maxWaiting int
		remake     string // in the fix; "" for no warning
	}{
		{jetstream.LimitsPolicy, 1, "--deliver <the ack floor's stream sequence + 1>"},
		{jetstream.WorkQueuePolicy, 2, "and start jetsink, which makes it with the server's default max_waiting, 512"},
		{jetstream.LimitsPolicy, pullsWaiting, ""},
	} {
		t.Run(fmt.Sprint(tc.retention, tc.maxWaiting), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			js, cfg, _ := ownStream(t, ctx, jetstream.StreamConfig{Retention: tc.retention}, nil)
			if _, err := js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
				MaxWaiting: tc.maxWaiting}); err != nil {
				t.Fatal(err)
			}
			said := fmt.Sprintf("has max_waiting %d:", tc.maxWaiting)
			found, ps := checkProblem(t, ctx, cfg, said)
			if (found != nil) != (tc.remake != "") {
				t.Fatalf("check warned of max_waiting %d: %v; problems:\n%s", tc.maxWaiting, found != nil, problemsText(ps))
			}
			if found != nil && (!found.Warning || !strings.Contains(found.Fix, tc.remake)) {
				t.Errorf("check's problem is not a warning whose fix says %q: %s", tc.remake, found)
			}
			if found != nil {
				requireUnattended(t, "check", found.Fix)
			}
			c, log := newLoggedConsumer(t, ctx, cfg)
			// Run's re-creation of the consumer says it no more.
			if err := c.ensureConsumer(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if n, want := strings.Count(log.String(), said), boolInt(tc.remake != ""); n != want {
				t.Errorf("New and a re-creation warned of max_waiting %d %d times, want %d; log:\n%s", tc.maxWaiting, n, want, log.String())
			}
		})
	}
}

// checkProblem runs Check on cfg and returns the (last) problem whose
// message holds said, or nil, and every problem.
func checkProblem(t *testing.T, ctx context.Context, cfg Config, said string) (*Problem, []Problem) {
	t.Helper()
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	var found *Problem
	for i := range ps {
		if strings.Contains(ps[i].Message, said) {
			found = &ps[i]
		}
	}
	return found, ps
}

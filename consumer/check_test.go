package consumer

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

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
	if _, err := js.Stream(ctx, cfg.Stream); err == nil {
		t.Fatal("Check created the stream")
	}

	// Stream and dead-letter stream exist, consumer not yet: warnings only.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects}); err != nil {
		t.Fatal(err)
	}
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

func TestCreateStreamAlsoCreatesDeadLetterStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv) // create_stream: true
	newConsumer(t, ctx, cfg)
	name, err := jsFor(t, srv).StreamNameBySubject(ctx, cfg.DeadLetterSubject)
	if err != nil || name != cfg.Stream+"_DLQ" {
		t.Fatalf("stream for %s = %q, %v; want %s_DLQ", cfg.DeadLetterSubject, name, err, cfg.Stream)
	}
	// A second start finds it and creates nothing more.
	newConsumer(t, ctx, cfg)
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
		s, err := js.Stream(ctx, cfg.Stream)
		if err != nil {
			t.Fatalf("%s: stream info: %v", what, err)
		}
		got := s.CachedInfo().Config
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
	errorsOf := func(c Config) string {
		t.Helper()
		ps, err := Check(ctx, c, testLogger(t, nil))
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, p := range ps {
			if !p.Warning {
				b.WriteString(p.String() + "\n")
			}
		}
		return b.String()
	}
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
}

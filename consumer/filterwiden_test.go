package consumer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// nats.filter_subject widened between runs (events.dev-1 to "", say)
// leaves the events of the subjects it adds that lie before the durable's
// place undelivered for good. The start-up line said so at Warn with no
// place and no command, and check's fix said the same. Now both give the
// durable's place and the remake from the stream's first sequence; the
// remake, followed, delivers the events skipped. With either pull client.
func TestWidenedFilterBetweenRunsSaysThePlaceAndTheRemake(t *testing.T) {
	onePassOnly(t)
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			js := jsFor(t, srv)
			cfg := testConfig(t, srv)
			cfg.PullClient = client
			cfg.FilterSubject = subjectOf(cfg, 0, 2)
			c := newConsumer(t, ctx, cfg)
			publish(t, ctx, js, cfg, 10, 2, 0) // s0: 0 2 4 6 8 (stream seqs 1 3 5 7 9); s1: the odd ones
			r := startRun(t, ctx, c, 2, 16, 8)
			r.ackUntil(t, ctx, 8)
			r.stopClean(t, ctx)
			if err := c.Close(ctx); err != nil {
				t.Fatal(err)
			}
			waitFor(t, ctx, "the durable's ack floor at stream sequence 9", func() bool {
				ci, err := durableInfo(ctx, js, cfg.Stream, cfg.Consumer)
				return err == nil && ci.AckFloor.Stream == 9
			})

			wide := cfg
			wide.FilterSubject = ""
			ps, err := Check(ctx, wide, testLogger(t, nil))
			if err != nil {
				t.Fatal(err)
			}
			if text := problemsText(ps); !strings.Contains(text, "last delivered stream sequence 9") ||
				!strings.Contains(text, "--deliver 1 ") || !strings.Contains(text, "nats consumer rm") {
				t.Errorf("check of the widened filter does not give the place and the remake from sequence 1:\n%s", text)
			}
			c2, log := newLoggedConsumer(t, ctx, wide)
			line := ""
			for l := range strings.Lines(log.String()) {
				if strings.Contains(l, "changing the consumer's filter") {
					line = l
				}
			}
			for _, want := range []string{"level=WARN", "delivered_stream_seq=9", "ack_floor_stream_seq=9", "nats consumer rm", "--deliver 1 ",
				"in at-least-once mode, this jetsink's, the old filter's events are stored again"} {
				if !strings.Contains(line, want) {
					t.Fatalf("the start-up line of the widened filter lacks %q:\n%s\nlog:\n%s", want, line, log.String())
				}
			}
			if err := c2.Close(ctx); err != nil {
				t.Fatal(err)
			}

			// Followed: made again from sequence 1 with the wide filter,
			// the durable delivers s1's events too.
			if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
				DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 1}); err != nil {
				t.Fatal(err)
			}
			c3 := newConsumer(t, ctx, wide)
			r3 := startRun(t, ctx, c3, 2, 16, 8)
			seen := map[int]bool{}
			for len(seen) < 10 {
				g := r3.next(t, ctx)
				seen[bodyIndex(t, &g.ev)] = true
				if err := g.ev.Msg.Ack(); err != nil {
					t.Fatal(err)
				}
			}
			r3.stopClean(t, ctx)
		})
	}
}

// A pure narrowing ("" to one subject) skips nothing: the start-up line
// gives no place and no remake, and neither does check.
func TestNarrowedFilterBetweenRunsAdvisesNoRemake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	publish(t, ctx, js, cfg, 4, 2, 0)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	narrow := cfg
	narrow.FilterSubject = subjectOf(cfg, 0, 2)
	ps, err := Check(ctx, narrow, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if text := problemsText(ps); !strings.Contains(text, "run will update it") || strings.Contains(text, "nats consumer rm") {
		t.Errorf("check of the narrowed filter: want the update said, no remake:\n%s", text)
	}
	_, log := newLoggedConsumer(t, ctx, narrow)
	if !strings.Contains(log.String(), "changing the consumer's filter") {
		t.Fatalf("the filter change is not logged:\n%s", log.String())
	}
	if strings.Contains(log.String(), "nats consumer rm") || strings.Contains(log.String(), "delivered_stream_seq") {
		t.Fatalf("a narrowing is given a remake:\n%s", log.String())
	}
}

// filterTakesMore: a widening or a move takes subjects the old filter left
// out; a narrowing, or any change from no filter, does not.
func TestFilterTakesMore(t *testing.T) {
	for _, tc := range []struct {
		old  jetstream.ConsumerConfig
		want string
		more bool
	}{
		{jetstream.ConsumerConfig{FilterSubject: "events.dev-1"}, "", true},
		{jetstream.ConsumerConfig{FilterSubject: "events.dev-1"}, "events.>", true},
		{jetstream.ConsumerConfig{FilterSubject: "events.dev-1"}, "events.dev-2", true},
		{jetstream.ConsumerConfig{FilterSubjects: []string{"a", "b"}}, "a", false},
		{jetstream.ConsumerConfig{FilterSubjects: []string{"a", "b"}}, "c", true},
		{jetstream.ConsumerConfig{}, "events.dev-1", false},
		{jetstream.ConsumerConfig{FilterSubject: "events.>"}, "events.dev-1", false},
		{jetstream.ConsumerConfig{FilterSubject: "events.*"}, "events.>", true},
	} {
		if got := filterTakesMore(&tc.old, tc.want); got != tc.more {
			t.Errorf("%q %q to %q: takes more %v, want %v", tc.old.FilterSubject, tc.old.FilterSubjects, tc.want, got, tc.more)
		}
	}
}
